"""benchmarks/paired_methods.py: pairs by seed across several bench reports (`--also`), first report wins."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paired_methods.py"


def write_report(path: Path, finals: dict[tuple[str, int], float], *, per_rollout: bool = False) -> Path:
    """A report's runs and curves; `per_rollout` adds gain_at_equal_rollouts (reports from 2026-12-04 on)."""
    runs, curves = [], {}
    for (method, seed), final in finals.items():
        run_id = f"bench-{method}-seed{seed}-{path.stem}"
        runs.append({"run_id": run_id, "method": method, "seed": seed, "final_accuracy": final,
                     "gain_at_equal_time": final / 2, "train_seconds": 10.0,
                     "step_speedup": 2.0 if method == "a" else 1.0, "rollouts_sampled": 100 * (seed + 1),
                     **({"gain_at_equal_rollouts": final / 4} if per_rollout else {})})
        curves[run_id] = [{"step": 0, "accuracy": 0.5}, {"step": 8, "accuracy": final + 0.1},
                          {"step": 16, "accuracy": final}]
        if per_rollout:  # a samples half as many rollouts per step as b
            for point in curves[run_id]:
                point["rollouts"] = point["step"] * (50 if method == "a" else 100)
    path.write_text(json.dumps({"runs": runs, "curves": curves}))
    return path


def run(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True).stdout


def test_also_joins_seeds_and_the_first_report_wins(tmp_path):
    first = write_report(tmp_path / "first.json", {("a", 0): 0.60, ("b", 0): 0.50, ("a", 1): 0.70, ("b", 1): 0.50})
    second = write_report(tmp_path / "second.json", {("a", 1): 0.90, ("b", 1): 0.50, ("a", 2): 0.80,
                                                     ("b", 2): 0.50})
    out = run(str(first), "a:b", "--also", str(second), "--curves")
    # seed 1 from the first report (0.70, not 0.90): differences 10, 20, 30 points
    assert "a − b  final_accuracy         per seed [10.0, 20.0, 30.0]  -> +20.00" in out
    assert "final accuracy over seeds [0, 1, 2]: 0.700 ± 0.248; step speed-up against its bench's GRPO " \
        "2.00× ± 0.00; rollouts sampled 200 ± 248" in out
    assert "largest best − last 10.0 pts" in out and "largest fall between evaluations 10.0 pts" in out


def test_without_also_only_the_report_counts(tmp_path):
    first = write_report(tmp_path / "first.json", {("a", 0): 0.60, ("b", 0): 0.50})
    out = run(str(first), "a:b")
    assert "per seed [10.0]" in out and "gain_at_equal_rollouts" not in out  # an older report: no such line


def test_gain_at_equal_rollouts_is_paired_when_the_report_has_it(tmp_path):
    report = write_report(tmp_path / "new.json", {("a", 0): 0.60, ("b", 0): 0.50, ("a", 1): 0.80, ("b", 1): 0.50},
                          per_rollout=True)
    assert "a − b  gain_at_equal_rollouts per seed [2.5, 7.5]  -> +5.00" in run(str(report), "a:b")


def test_head_to_head_reads_both_curves_where_the_run_that_sampled_fewer_ends(tmp_path):
    report = write_report(tmp_path / "new.json", {("a", 0): 0.60, ("b", 0): 0.50}, per_rollout=True)
    # a (fewer rollouts) at its steps 8 and 16, i.e. 400 and 800 rollouts, on b's curve (0.5 -> 0.6 -> 0.5 over
    # 0, 800, 1600): 0.7 - 0.55 and 0.6 - 0.6, mean 7.5 points
    out = run(str(report), "a:b", "b:a")
    assert "a − b  head_to_head_rollouts  per seed [7.5]  -> +7.50 (n=1)" in out
    assert "b − a  head_to_head_rollouts  per seed [-7.5]" in out
    assert "head_to_head" not in run(str(write_report(tmp_path / "old.json", {("a", 0): 0.6, ("b", 0): 0.5})),
                                     "a:b")  # curves without rollout counts


def test_last_evaluation_pairs_each_run_s_last_point_not_its_final_window(tmp_path):
    report = write_report(tmp_path / "r.json", {("a", 0): 0.60, ("b", 0): 0.50, ("a", 1): 0.70, ("b", 1): 0.50})
    data = json.loads(report.read_text())
    data["curves"]["bench-a-seed1-r"][-1]["accuracy"] = 0.95  # final_accuracy (a report field) stays 0.70
    report.write_text(json.dumps(data))
    out = run(str(report), "a:b")
    assert "a − b  last_evaluation        per seed [10.0, 45.0]  -> +27.50" in out
    assert "a − b  final_accuracy         per seed [10.0, 20.0]" in out
