"""benchmarks/bench_store_scale.py at a small --scale: the run it writes goes through the trainer's own code and holds
what a real run's store holds (tokens with log-probs, sketches, images, merged copies, the budget's skipped
rollouts), and every measured part runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_store_scale import Scale, main  # noqa: E402

from fastrl_core import store  # noqa: E402


def test_scale_shrinks_the_real_run():
    assert Scale.of(1.0) == Scale(steps=800, prompts=64, tokens=512, problems=2101)
    assert Scale.of(1.0).rollouts == 512
    assert Scale.of(0.01, steps=5) == Scale(steps=5, prompts=2, tokens=8, problems=21)
    with pytest.raises(ValueError, match="--scale"):
        Scale.of(0)


def test_a_small_scale_run_is_written_and_measured(tmp_path, capsys):
    assert main(["--store", str(tmp_path), "--scale", "0.02", "--steps", "26", "--no-pages", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for part in ("(1) the trainer's write per step", "(2) disk", "(3) store reads", "(4) `fastrl store check`"):
        assert part in out
    assert "load average" in out  # each part says how busy the machine was
    assert "steps refreshing the summaries (every 25)" in out and "over 1 steps" in out
    assert out.count("without summaries") >= 12  # each read also cold from the step files alone
    for run_id in store.list_runs(tmp_path):  # set aside for that, and back
        assert len(store.summary.summary_files(tmp_path, run_id)) == 3
        assert not (store.layout.run_dir(tmp_path, run_id) / "summary-aside").exists()
    runs = store.read_runs(tmp_path).set_index("name")
    fastrl, grpo = runs.loc["bench-fastrl-seed0", "run_id"], runs.loc["bench-grpo-seed0", "run_id"]
    rollouts = store.read_rollouts(tmp_path, fastrl)
    assert {"KEPT", "DUPLICATE", "ZERO_ADVANTAGE"} <= set(rollouts["reason"])
    first = rollouts.iloc[0]
    tokens = store.read_tokens(tmp_path, fastrl, int(first["step"]), first["rollout_id"])
    assert "".join(text for text, _ in tokens) == first["completion"] and all(lp <= 0 for _, lp in tokens)
    steps = store.read_steps(tmp_path, fastrl)
    assert (steps["rollouts_skipped"] > 0).any() and (store.read_steps(tmp_path, grpo)["rollouts_skipped"] == 0).all()
    meta, sketches = store.read_sketches(tmp_path, fastrl, steps=[0])
    assert sketches.shape[1] == 256
    assert store.read_image(tmp_path, fastrl, first["image_ref"])[:4] == b"\x89PNG"
