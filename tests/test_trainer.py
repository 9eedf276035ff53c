"""A short real training run on the embedded default, and exact resume."""

import pytest
import torch

from fastrl_core.config import load_config
from fastrl_core.store import read_rollouts, read_runs, read_steps
from fastrl_core.trainer import PromptSampler, Trainer


def _config(store, **overrides):
    base = {"store_dir": str(store), "steps": 3, "prompts_per_step": 8, "rollouts_per_prompt": 6,
            "eval_every": 0, "checkpoint_every": 0, "threads": 1, "synthetic_train": 256, "synthetic_test": 32,
            "eval_size": 32, "lr": 5e-4, "warmup_steps": 1}
    base.update(overrides)
    return load_config("configs/embedded.yaml", [f"{k}={v}" for k, v in base.items()])


def _params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_short_run_updates_the_policy_and_records_kept_and_pruned(tmp_path):
    trainer = Trainer(_config(tmp_path, eval_every=3), progress=False)
    before = _params(trainer.policy.model)
    run_id = trainer.run()
    after = _params(trainer.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"

    steps = read_steps(tmp_path, run_id)
    assert steps["step"].tolist() == [0, 1, 2]
    assert (steps["rollouts_kept"] <= steps["rollouts_sampled"]).all()
    rollouts = read_rollouts(tmp_path, run_id)
    assert len(rollouts) == steps["rollouts_sampled"].sum()
    assert rollouts["kept"].any() and (~rollouts["kept"]).any(), "expected both kept and pruned rollouts"
    assert set(rollouts.loc[~rollouts["kept"], "reason"]) - {"KEPT"}
    assert (rollouts.loc[rollouts["advantage"] == 0, "kept"] == False).all()  # noqa: E712 zero-advantage pruned
    runs = read_runs(tmp_path)
    assert runs.set_index("run_id").loc[run_id, "status"] == "finished"


def test_resume_continues_exactly(tmp_path):
    straight = Trainer(_config(tmp_path / "a", steps=4), progress=False)
    straight.run()

    first = Trainer(_config(tmp_path / "b", steps=4), progress=False)
    first.train_step()
    first.train_step()
    first.save_checkpoint()
    resumed = Trainer(_config(tmp_path / "b", steps=4), resume=first.writer.run_id, progress=False)
    assert resumed.step == 2
    resumed.run()

    a, b = _params(straight.policy.model), _params(resumed.policy.model)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    assert straight.budget_state == resumed.budget_state
    steps_a = read_steps(tmp_path / "a", straight.writer.run_id)
    steps_b = read_steps(tmp_path / "b", resumed.writer.run_id)
    assert steps_a["reward_mean"].tolist() == pytest.approx(steps_b["reward_mean"].tolist())


def test_prompt_sampler_is_a_permutation_per_epoch():
    sampler = PromptSampler(10, 3, seed=1)
    seen = [i for step in range(3) for i in sampler.batch(step)[0]]
    assert len(set(seen)) == 9
    assert sampler.batch(2)[1] and not sampler.batch(1)[1]
    with pytest.raises(ValueError, match="fewer than prompts_per_step"):
        PromptSampler(2, 3, seed=0)
