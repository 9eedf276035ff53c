"""benchmarks/bench_trl.py's report: TRL runs read through `fastrl_app.metrics`, paired by seed, with the shadow
mode's projected saving beside the measured one (the bench itself trains under torchrun: its smoke test is
`--steps 1 --seeds 0 --eval-size 16`, in its docstring)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fastrl_core import store
from fastrl_core.store.fake_runs import fake_step

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_trl  # noqa: E402

RATES = {"grpo": 1.0, "fastrl": 0.5}  # training seconds per generation
EVALS = {"grpo": [(0, 0.30), (2, 0.40), (4, 0.50), (6, 0.50)], "fastrl": [(0, 0.30), (2, 0.45), (4, 0.50), (6, 0.48)]}


def _trl_run(root: Path, method: str, seed: int) -> None:
    """A run as bench_trl names it: 6 generations of 4 prompts x up to 4 rollouts (`fake_step`'s); the shadow run
    records that FastRL would skip 4, merge 2 and prune 3 of each generation's rollouts."""
    writer = store.RunWriter(root, name=f"trl-{method}-seed{seed}", config={"seed": seed}, model="embedded",
                             dataset="synthetic", objective="grpo-beta0.01", code_version="test",
                             pruner="none" if method == "grpo" else "fastrl",
                             budget="fixed" if method == "grpo" else "adaptive")
    pngs: dict = {}
    for step in range(6):
        kwargs = fake_step(step, prompts=4, rollouts_per_prompt=4, sketch_dim=8, dataset_size=8, seed=seed,
                           pngs=pngs)
        row = kwargs["step_row"]
        row.update(wall_time=(step + 1) * RATES[method], rollouts_nominal=row["rollouts_sampled"])
        if method == "grpo":
            row.update(shadow_skipped=4, shadow_merged=2, shadow_pruned=3, shadow_kept=7)
        writer.write_step(step, **kwargs)
    for step, accuracy in EVALS[method]:
        writer.write_eval(step, "test", accuracy + 0.01 * seed, 256, wall_time=step * RATES[method])
    writer.finish()


def test_the_report_pairs_seeds_and_sets_the_shadow_saving_beside_the_measured_one(tmp_path, capsys):
    for seed in (0, 1):
        for method in bench_trl.METHODS:
            _trl_run(tmp_path, method, seed)
    bench_trl.report(str(tmp_path))
    out = capsys.readouterr().out
    # targets: 90 % of each seed's TRL gain over 0.30 (final = mean of the last 3 evaluations after step 0); their
    # mean is 90 % of the mean gain
    grpo_final = (0.40 + 0.50 + 0.50) / 3 + 0.005
    assert f"target 90% of each seed's GRPO gain (mean {0.305 + 0.9 * (grpo_final - 0.305):.3f} greedy" in out
    fastrl = next(line for line in out.splitlines() if line.startswith("  fastrl"))
    assert "seeds [0, 1]" in fastrl and "step speed-up 2.00x" in fastrl and "reached the target 2/2" in fastrl
    assert f"vs TRL {(0.45 + 0.50 + 0.48 - 0.40 - 0.50 - 0.50) / 3:+.3f}" in fastrl
    steps = {m: store.read_steps(tmp_path, [r for r in store.list_runs(tmp_path) if f"-{m}-" in r])
             for m in bench_trl.METHODS}
    projected = 2 * 6 * 9 / steps["grpo"]["rollouts_nominal"].sum()
    measured = 1 - steps["fastrl"]["rollouts_kept"].sum() / steps["grpo"]["rollouts_kept"].sum()
    assert f"shadow mode's projected saving {projected:.1%} of nominal rollouts; measured {measured:.1%} fewer" in out


def test_the_report_refuses_a_store_without_both_methods(tmp_path):
    _trl_run(tmp_path, "grpo", 0)
    with pytest.raises(SystemExit, match="needs runs of grpo, fastrl; has \\['grpo'\\]"):
        bench_trl.report(str(tmp_path))
