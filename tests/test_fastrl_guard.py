"""Behaviour guard for the shipped `fastrl` rule: its decisions and weights, and a short training run's per-step
figures, against fixtures recorded from commit 8b51e20 (before issue 40 moved the rule into `algo.fastrl`).

Regenerate a fixture only on purpose (a change of behaviour): `python tests/test_fastrl_guard.py --write`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from fastrl_core.algo.advantages import compute_advantages
from fastrl_core.algo.duplicates import find_duplicates, prune_distinct
from fastrl_core.algo.groups import GroupBatch
from fastrl_core.algo.pruners import prune

DATA = Path(__file__).parent / "data"
DECISIONS = DATA / "fastrl_guard_decisions.json"
STEPS = DATA / "fastrl_guard_steps.json"

# (name, pruner options): the shipped rule at the keep ratios and cost rules the recipes use
CASES = [("keep_0.5", dict(keep_ratio=0.5, min_keep=2)), ("keep_0.25", dict(keep_ratio=0.25, min_keep=1)),
         ("keep_1.0", dict(keep_ratio=1.0, min_keep=2)), ("cost_0.013", dict(keep_ratio=1.0, min_keep=2,
                                                                             row_cost=0.013)),
         ("cost_0.2_keep_0.5", dict(keep_ratio=0.5, min_keep=2, row_cost=0.2))]


def guard_batch(seed: int, with_sketches: bool = True) -> tuple[GroupBatch, torch.Tensor, torch.Tensor]:
    """One seeded step: 6 groups of 3-9 rollouts, some all-equal rewards (A = 0), both signs, identical
    completions (equal token ids and sketches). Returns (batch, completion_ids (N, 5), completion_mask)."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(3, 10, (6,), generator=generator)
    group_ids = torch.repeat_interleave(torch.arange(6) * 7 + 3, sizes)  # arbitrary ids
    n = group_ids.numel()
    answers = torch.randint(0, 3, (n,), generator=generator)  # 3 distinct completions per group at most
    completion_ids = torch.stack([answers, answers + 1, answers * 2, torch.zeros(n, dtype=torch.long),
                                  group_ids % 5], 1)
    rewards = (answers == 0).float() + 0.5 * (answers < 2).float()
    rewards[group_ids == group_ids[0]] = 1.0  # a decided group: every advantage 0
    advantages = compute_advantages("group_normalized", rewards, group_ids)
    sketches = None
    if with_sketches:
        base = torch.randn(n, 12, generator=generator)
        sketches = base + 3.0 * torch.randn(3, 12, generator=generator)[answers]  # copies share their sketch
        same = completion_ids.unsqueeze(0).eq(completion_ids.unsqueeze(1)).all(-1)
        sketches = sketches[same.float().argmax(1)]  # identical completions -> identical sketches
    return GroupBatch(group_ids, rewards, advantages, sketches), completion_ids, torch.ones(n, 5, dtype=torch.bool)


def decisions() -> dict:
    out = {}
    for seed in range(4):
        for with_sketches in (True, False):
            batch, ids, mask = guard_batch(seed, with_sketches)
            duplicates = find_duplicates(batch.group_ids, ids, mask)
            for name, options in CASES:
                for merged in (False, True):
                    result = prune_distinct("fastrl", batch, duplicates if merged else None,
                                            generator=torch.Generator().manual_seed(seed + 1), **options)
                    key = f"seed{seed}/{'sketch' if with_sketches else 'nosketch'}/{name}/{'merged' if merged else 'all'}"
                    out[key] = {"keep": result.keep_mask.int().tolist(), "reasons": result.reasons.tolist(),
                                "weights": result.weights.tolist(), "scores": result.scores.tolist()}
    return out


def test_fastrl_decisions_and_weights_are_as_recorded():
    recorded = json.loads(DECISIONS.read_text())
    now = decisions()
    assert sorted(now) == sorted(recorded)
    for key in recorded:
        for field in ("keep", "reasons"):
            assert now[key][field] == recorded[key][field], (key, field)
        for field in ("weights", "scores"):  # float32 sums round differently on AVX2 and AVX-512 CPUs (1 ulp seen)
            assert now[key][field] == pytest.approx(recorded[key][field], rel=1e-6, abs=1e-7), (key, field)


# ------------------------------------------------------------------ a short training run, per step
GUARD_STEPS = 3
TINY = ["steps=3", "eval_every=0", "eval_samples=0", "synthetic_train=32", "synthetic_test=8", "prompts_per_step=4",
        "rollouts_per_prompt=4", "threads=1", "checkpoint_every=0", "seed=0"]
# `fastrl` as benched, with the cost rule's rho pinned (measured fits timings, which do not repeat), the coreset
# at keep 0.5, and plain GRPO
GUARD_METHODS = {"grpo": ["pruner=none", "budget=fixed"],
                 "fastrl": ["pruner=fastrl", "budget=adaptive", "keep_ratio=1.0", "row_cost=0.013"],
                 "fastrl_ratio": ["pruner=fastrl", "budget=adaptive", "keep_ratio=0.5",
                                  "budget_args.informative_target=0.9"]}
COUNTS = ("rollouts_sampled", "rollouts_kept", "updates")
FLOATS = ("loss", "kl", "reward_mean")


def step_figures(store: Path) -> dict:
    from fastrl_core.run_config import load_config
    from fastrl_core.trainer import Trainer

    out = {}
    for method, overrides in GUARD_METHODS.items():
        config = load_config("paper", [*TINY, *overrides, f"store_dir={store / method}"])
        trainer = Trainer(config, progress=False)
        rows = [trainer.train_step() for _ in range(GUARD_STEPS)]
        trainer.writer.finish()
        out[method] = [{key: row[key] for key in (*COUNTS, *FLOATS)} for row in rows]
    return out


def test_short_training_run_per_step_figures_are_as_recorded(tmp_path):
    recorded = json.loads(STEPS.read_text())
    now = step_figures(tmp_path)
    assert sorted(now) == sorted(recorded)
    for method, steps in recorded.items():
        for step, (was, is_) in enumerate(zip(steps, now[method])):
            for key in COUNTS:
                assert is_[key] == was[key], (method, step, key)
            for key in FLOATS:
                assert is_[key] == pytest.approx(was[key], rel=1e-5, abs=1e-7), (method, step, key)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    DATA.mkdir(exist_ok=True)
    DECISIONS.write_text(json.dumps(decisions(), sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as directory:
        STEPS.write_text(json.dumps(step_figures(Path(directory)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {DECISIONS} and {STEPS}")
