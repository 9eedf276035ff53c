"""benchmarks/pool_results.py: seeds of one config from several bench outputs, compared by metrics' definitions."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import pool_results as pool  # noqa: E402


def _results(path: Path, seeds: dict[int, dict[str, tuple[float, list[float]]]], config: str = "paper-wide") -> Path:
    """A results.json: per seed, per method (seconds a step, accuracies at steps 0, 5, 10, 15); 15 steps a run."""
    runs, curves = [], {}
    for seed, methods in seeds.items():
        for method, (per_step, accuracies) in methods.items():
            run_id = f"bench-{method}-seed{seed}"
            runs.append({"run_id": run_id, "method": method, "seed": seed, "steps": 15,
                         "train_seconds": 15 * per_step})
            curves[run_id] = [{"step": 5 * i, "wall_time": 5 * i * per_step, "cpu_time": 0.0, "rollouts": 640.0 * i,
                               "accuracy": a} for i, a in enumerate(accuracies)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config, "overrides": [], "split": "test", "runs": runs, "curves": curves}))
    return path


def test_two_outputs_pool_into_paired_figures_by_hand(tmp_path):
    a = _results(tmp_path / "a/results.json", {0: {"grpo": (10.0, [0.2, 0.3, 0.4, 0.5]),
                                                   "fastrl": (5.0, [0.2, 0.4, 0.5, 0.5])}})
    b = _results(tmp_path / "b/results.json", {1: {"grpo": (10.0, [0.2, 0.3, 0.3, 0.35]),
                                                   "fastrl": (4.0, [0.2, 0.3, 0.4, 0.4])}})
    table, curves, config = pool.load([a, b])
    assert config == "paper-wide" and sorted(table["seed"].unique()) == [0, 1]
    target, rows = pool.compare(table, curves, "grpo")
    # final accuracy: mean of the last 3 evaluations after step 0; grpo 0.4 and 0.3167, acc0 0.2; each seed's target
    # 0.2 + 0.9 * gain: 0.38 and 0.305 (from the mean gain, 0.3425, grpo seed 1 would never reach its own target)
    assert target == pytest.approx((0.38 + 0.2 + 0.9 * (0.95 / 3 - 0.2)) / 2)
    by_method = rows.set_index("method")
    fastrl = by_method.loc["fastrl"]
    # trailing means of 3: grpo seed 0 0.3, 0.35, 0.4 -> step 15 (150 s); seed 1 0.3, 0.3, 0.3167 -> step 15 (150 s);
    # fastrl seed 0 0.4 -> step 5 (25 s); seed 1 0.3, 0.35 -> step 10 (40 s)
    assert by_method.loc["grpo", "reached"] == 2 and fastrl["reached"] == 2
    assert fastrl["target_speedup"].mean == pytest.approx(math.sqrt(150 / 25 * 150 / 40))
    assert fastrl["target_speedup"].n == 2
    assert fastrl["step_speedup"].mean == pytest.approx(math.sqrt(2.0 * 2.5)) and fastrl["step_speedup"].n == 2
    assert fastrl["accuracy_difference"].mean == pytest.approx(100 * ((1.4 / 3 - 0.4) + (1.1 / 3 - 0.95 / 3)) / 2)


def test_different_configs_and_a_seed_twice_are_refused(tmp_path):
    one = {0: {"grpo": (10.0, [0.2, 0.3, 0.4, 0.5])}}
    a = _results(tmp_path / "a/results.json", one)
    with pytest.raises(SystemExit, match="different regimes"):
        pool.load([a, _results(tmp_path / "b/results.json", one, config="paper")])
    with pytest.raises(SystemExit, match="grpo seed 0"):
        pool.load([a, _results(tmp_path / "c/results.json", one)])
