"""`fastrl bench`: the plan of methods and seeds, the up-front checks, and a tiny real bench (2 methods x 2 seeds x
3 steps) that interleaves its runs, writes the report, resumes without re-training, and re-trains an unfinished run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastrl_app import bench, metrics
from fastrl_app.cli import main
from fastrl_core import store
from fastrl_core.store import layout

TINY = ["steps=3", "eval_every=2", "eval_size=8", "synthetic_train=32", "synthetic_test=8", "prompts_per_step=4",
        "rollouts_per_prompt=4", "threads=1", "checkpoint_every=0"]


def test_plan_adds_each_baseline_with_the_seeds_it_is_paired_on():
    chosen = bench.plan(["fastrl", "fastrl+gspo"], [0, 1, 2], {"fastrl": [0, 1, 2, 3, 4]})
    assert list(chosen) == ["grpo", "grpo+gspo", "fastrl", "fastrl+gspo"]  # baselines first
    assert chosen["grpo"] == [0, 1, 2, 3, 4] and chosen["grpo+gspo"] == [0, 1, 2]
    assert bench.baseline_of("fastrl+dapo") == "grpo+dapo" and bench.baseline_of("cppo") == "grpo"
    assert all(bench.baseline_of(m) in bench.METHODS for m in bench.METHODS)
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['nope'\]"):
        bench.plan(["grpo", "nope"], [0], {})
    with pytest.raises(ValueError, match=r"--seeds-for names \['cppo'\]"):
        bench.plan(["fastrl"], [0], {"cppo": [1]})
    against = bench.plan(["fastrl", "grpo"], [0, 1], {}, baseline="grpo_unmerged")
    assert against == {"grpo_unmerged": [0, 1], "fastrl": [0, 1], "grpo": [0, 1]}  # no GRPO added but the baseline's
    assert list(bench.plan(["fastrl"], [3], {}, baseline="grpo_unmerged")) == ["grpo_unmerged", "fastrl"]
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['nope'\]"):
        bench.plan(["fastrl"], [0], {}, baseline="nope")
    assert bench.parse_seeds("0, 2,5", "--seeds") == [0, 2, 5]
    for bad in ("", "0,0", "a", "-1"):
        with pytest.raises(ValueError, match="--seeds"):
            bench.parse_seeds(bad, "--seeds")


def test_bench_rejects_unknown_and_unregistered_methods_before_training(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["bench", "--methods", "grpo,nope", "--store", str(tmp_path)])
    assert "unknown method(s) ['nope']" in capsys.readouterr().err
    monkeypatch.setitem(bench.METHODS, "ghost", ["pruner=ghost_pruner", "budget=ghost_budget"])
    with pytest.raises(SystemExit):
        main(["bench", "--methods", "ghost", "--store", str(tmp_path)])
    err = capsys.readouterr().err  # the config loader or the bench's own check names the method and the pruner
    assert "method 'ghost'" in err and "ghost_pruner" in err and "cppo" in err  # and the registered ones
    with pytest.raises(SystemExit):
        main(["bench", "--seeds-for", "grpo:1", "--store", str(tmp_path)])
    assert "expected METHOD=SEEDS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--store", str(tmp_path), "steps=2", "seed=3"])
    assert "the bench sets seed (--seeds)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing was trained


def test_repeat_check_compares_per_step_ratios():
    here = [{"method": "grpo", "baseline_method": "grpo", "step_speedup_mean": 1.0, "cpu_step_speedup_mean": 1.0},
            {"method": "fastrl", "baseline_method": "grpo", "step_speedup_mean": 1.5, "cpu_step_speedup_mean": 1.4}]
    there = [dict(here[1], step_speedup_mean=1.4, cpu_step_speedup_mean=None)]
    text, ok = bench.repeat_check(here, there)
    assert ok and "| fastrl | 1.500× | 1.400× | 7.1% | 1.400× | — | — |" in text and "| grpo |" not in text
    assert not bench.repeat_check(here, [dict(here[1], step_speedup_mean=1.3)])[1]  # 15 % apart
    assert not bench.repeat_check(here, [dict(here[1], step_speedup_mean=None)])[1]


def _step_mtimes(store_dir, run_id) -> list[int]:
    return [layout.step_file(store_dir, run_id, "steps", s).stat().st_mtime_ns
            for s in layout.step_numbers(store_dir, run_id, "steps")]


def test_tiny_bench_interleaves_reports_and_resumes(tmp_path, capsys):
    store_dir, out = tmp_path / "store", tmp_path / "report"
    command = ["bench", "--methods", "grpo,fastrl", "--seeds", "0,1", "--store", str(store_dir), "--out", str(out),
               *TINY]
    assert main(command) == 0
    runs = store.read_runs(store_dir)
    assert len(runs) == 4 and set(runs["status"]) == {"finished"}
    assert sorted(runs["name"]) == sorted(metrics.bench_run_name(m, s) for m in ("grpo", "fastrl") for s in (0, 1))
    ids = runs.set_index("name")["run_id"]

    # interleaved: every method's step k is written before any method's step k + 1 (same seed)
    for seed in (0, 1):
        times = [_step_mtimes(store_dir, ids[metrics.bench_run_name(m, seed)]) for m in ("grpo", "fastrl")]
        for k in range(2):
            assert max(t[k] for t in times) < min(t[k + 1] for t in times)
        # and the order rotates: grpo runs first in round 1, fastrl in round 2
        assert times[0][0] < times[1][0] and times[1][1] < times[0][1]
    steps = store.read_steps(store_dir, list(ids))
    assert (steps["cpu_generate"] > 0).all() and (steps["cpu_update"] > 0).all()

    result = json.loads((out / "results.json").read_text())
    assert (out / "results.md").exists() and (out / "bench.png").stat().st_size > 10_000
    rows = {(r["method"], r["seed"]): r for r in result["runs"]}
    assert set(rows) == {(m, s) for m in ("grpo", "fastrl") for s in (0, 1)}
    grpo, fastrl = rows[("grpo", 0)], rows[("fastrl", 0)]
    assert grpo["objective"] == "grpo" and grpo["steps"] == 3 and grpo["step_speedup"] == pytest.approx(1.0)
    mine = steps[steps["run_id"] == fastrl["run_id"]]
    theirs = steps[steps["run_id"] == grpo["run_id"]]
    assert fastrl["step_speedup"] == pytest.approx(theirs["wall_time"].iloc[-1] / mine["wall_time"].iloc[-1])
    assert fastrl["rollouts_sampled"] == mine["rollouts_sampled"].sum()
    evals = store.read_evals(store_dir, fastrl["run_id"])
    assert evals["step"].tolist() == [0, 2, 3]
    assert fastrl["final_accuracy"] == pytest.approx(evals["accuracy"].iloc[1:].mean())
    summary = {r["method"]: r for r in result["summary"]}
    ratios = [rows[("fastrl", s)]["step_speedup"] for s in (0, 1)]
    assert summary["fastrl"]["step_speedup_mean"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]))
    assert summary["fastrl"]["step_speedup_n"] == 2 and summary["fastrl"]["seeds"] == [0, 1]
    for key in ("final_accuracy", "auc", "seconds_per_step", "time_update"):
        assert {f"{key}_{part}" for part in ("mean", "low", "high", "n")} <= set(summary["fastrl"])
    assert f"| fastrl | `{' '.join(bench.METHODS['fastrl'])}` | 2 |" in (out / "results.md").read_text()
    headline = (out / "results.md").read_text().split("\n\n")[1]  # after the split line
    assert headline.startswith("| method | seeds | final acc | vs its GRPO, paired")
    assert "| grpo | 2 |" in headline and "| baseline |" in headline and "| 1× · 51.32 |" in headline
    assert "| at equal rollouts (pts) |" in headline and "| rollouts to target |" in headline
    gain = summary["fastrl"]["accuracy_gain_mean"]
    assert gain == pytest.approx(np.mean([rows[("fastrl", s)]["final_accuracy"] - rows[("grpo", s)]["final_accuracy"]
                                          for s in (0, 1)]))
    assert f"| fastrl | 2 | {metrics.interval(summary['fastrl'], 'final_accuracy').text('.3f')} | {gain * 100:+.1f}" \
        in headline
    costs = {c["phase"]: c for c in result["phase_costs"]}  # fitted over every step of the 4 runs
    assert set(costs) == {"generate", "logprob", "update"} and costs["update"]["steps"] == len(steps)
    assert "| update | update rows |" in (out / "results.md").read_text()  # the rows the update ran

    # resumed: nothing is trained again; an unfinished run is trained again from scratch and the old one stopped
    capsys.readouterr()
    assert main(command) == 0
    assert "seed 0: training nothing" in capsys.readouterr().out and len(store.read_runs(store_dir)) == 4
    stale = ids[metrics.bench_run_name("fastrl", 1)]
    store.RunWriter.resume(store_dir, stale)  # status back to "running", as after a crash
    assert main([*command, "--compare", str(out / "results.json")]) == 0
    printed = capsys.readouterr().out
    assert "seed 0: training nothing" in printed and "seed 1: training fastrl; finished in the store: grpo" in printed
    assert "per-step ratios vs" in printed and "| fastrl |" in printed
    runs = store.read_runs(store_dir).set_index("run_id")
    assert runs.loc[stale, "status"] == "stopped" and len(runs) == 5
    again = json.loads((out / "results.json").read_text())
    assert {r["run_id"] for r in again["runs"]} == (set(ids) - {stale}) | (set(runs.index) - set(ids))

    # a method added later to the same store (no run of that name yet) trains alone, the others are kept
    added = ["bench", "--methods", "grpo,fastrl,cppo", "--seeds", "0", "--store", str(store_dir), "--out", str(out),
             *TINY]
    assert main(added) == 0
    assert "seed 0: training cppo; finished in the store: grpo, fastrl" in capsys.readouterr().out


def test_a_run_recorded_before_a_key_existed_is_known_by_the_value_it_ran_under():
    """`fastrl bench` re-reads a finished run whose record lacks a key added since (`resume.as_recorded`): a key
    that changed nothing when it came counts as its default, one that changed the default as its old value."""
    from fastrl_core.resume import as_recorded

    config = bench.method_config("embedded", "grpo", 0, "store", []).options()
    record = json.loads(json.dumps(config, default=str))
    del record["resample"]  # recorded before the key: the run drew the seed's own samples
    assert bench.comparable(as_recorded(record)) == bench.comparable(config)
    del record["merge_scope"]  # recorded before the exact merge: the run merged a step's copies into one row
    assert bench.comparable(as_recorded(record)) != bench.comparable(config)
    assert bench.comparable(as_recorded(record)) == bench.comparable({**config, "merge_scope": "step"})


def test_a_store_without_cpu_columns_still_reads_compacts_and_compares(tmp_path):
    """Steps rows written before `cpu_<phase>` existed (the synthetic steps have none) beside a run that has them."""
    import duckdb

    from fastrl_core.store.fake_runs import fake_step

    def write(method: str, pruner: str, cpu: bool) -> str:
        writer = store.RunWriter(tmp_path, name=metrics.bench_run_name(method, 0), config={"seed": 0}, model="m",
                                 dataset="d", objective="grpo", pruner=pruner, budget="fixed", code_version="t")
        for step in range(3):
            kwargs = fake_step(step)
            if cpu:
                kwargs["step_row"].update({f"cpu_{p}": 0.01 for p in store.PHASES})
            writer.write_step(step, **kwargs)
            writer.write_eval(step, "test", 0.5, 8)
        writer.finish()
        return writer.run_id

    old, new = write("grpo", "none", cpu=False), write("cppo", "cppo", cpu=True)
    steps = store.read_steps(tmp_path, [old, new])
    assert steps.loc[steps["run_id"] == old, "cpu_update"].isna().all()
    assert (steps.loc[steps["run_id"] == new, "cpu_update"] == 0.01).all()
    assert store.read_steps(tmp_path, old)["step"].tolist() == [0, 1, 2]
    with duckdb.connect(str(store.compact(tmp_path, old)), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM steps").fetchall() == [(3,)]
    with duckdb.connect(str(store.compact(tmp_path, new)), read_only=True) as con:
        assert con.sql("SELECT sum(cpu_update) FROM steps").fetchall()[0][0] == pytest.approx(0.03)
    table = metrics.compare_runs(metrics.run_labels(store.read_runs(tmp_path)), steps,
                                 store.read_evals(tmp_path, [old, new])).set_index("method")
    assert table.loc["cppo", "step_speedup"] is not None and table.loc["cppo", "cpu_step_speedup"] is None


def test_a_bench_with_sampled_evaluations_reports_either_split_from_its_store(tmp_path, capsys):
    store_dir = tmp_path / "store"
    command = ["bench", "--methods", "grpo", "--seeds", "0", "--store", str(store_dir), *TINY, "eval_samples=2"]
    assert main(command) == 0
    greedy = (store_dir / "report" / "results.md").read_text()
    assert greedy.startswith("Accuracy: evaluation split `test`.")
    capsys.readouterr()
    assert main([*command, "--split", "test-sampled"]) == 0
    assert "seed 0: training nothing" in capsys.readouterr().out  # re-reported from the store
    result = json.loads((store_dir / "report-test-sampled" / "results.json").read_text())
    assert result["split"] == "test-sampled"
    evals = store.read_evals(store_dir, result["runs"][0]["run_id"])
    sampled = evals[evals["split"] == "test-sampled"]
    assert result["runs"][0]["final_accuracy"] == pytest.approx(sampled["accuracy"].iloc[1:].mean())
    with pytest.raises(SystemExit, match="no evaluations on split 'nope'"):
        main([*command, "--split", "nope"])


@pytest.mark.parametrize("method", sorted(bench.METHODS))
def test_every_method_loads_on_the_paper_config(method, tmp_path):
    config = bench.method_config("paper", method, 0, str(tmp_path), [])
    for override in bench.METHODS[method]:
        key, value = override.split("=", 1)
        if "." not in key:
            assert str(getattr(config, key)).lower() == value.lower(), override


WIDE_METHODS = ("grpo", "grpo_unmerged", "cppo", "fastrl_paper", "fastrl")  # paper-wide.yaml's bench


@pytest.mark.parametrize("method", WIDE_METHODS)
def test_the_wide_regimes_methods_load_on_vllm_with_the_logprob_sketch(method, tmp_path):
    """configs/paper-wide.yaml under each method its header names: vLLM, 2 threads, the named wide warm start (not
    built by loading), and the sketch at top-20 where the pruner reads one."""
    from fastrl_core.shipped import config_path

    config = bench.method_config("paper-wide", method, 0, str(tmp_path), [])
    assert (config.engine, config.threads, config.model, config.sketch_top_k) == ("vllm", 2, "embedded-wide", 20)
    assert (config.objective_args, config.updates_per_step, config.eval_samples) == ({"beta": 0.01}, 4, 4)
    assert config.synthetic_kinds == ["count_dots", "longest_segment"] and config.synthetic_train == 128
    assert config.recompute_old_logprobs  # vLLM's numerics: the old log-prob pass runs on kept rows
    text = config_path("paper-wide").read_text()
    assert f"--methods {','.join(WIDE_METHODS)}" in text


def test_cost_table_states_the_ceilings_of_grpo_steps():
    """Exact lines (generate 0.1 s + 4 ms per sampled, logprob 2 ms and update 0.1 s + 3 ms per kept) and GRPO's
    1 s steps of 128 sampled and 40 kept: keeping no row would step 1.25× faster; a 2.5× step samples 28."""
    import pandas as pd

    sampled, kept = np.array([128, 128, 96, 64]), np.array([40, 40, 30, 20])
    steps = pd.DataFrame({"run_id": ["g", "g", "f", "f"], "rollouts_sampled": sampled, "rollouts_kept": kept,
                          "time_generate": 0.1 + 0.004 * sampled, "time_logprob": 0.002 * kept,
                          "time_update": 0.1 + 0.003 * kept})
    per_run = pd.DataFrame({"run_id": ["g", "f"], "method": ["grpo", "fastrl"], "seconds_per_step": [1.0, 0.8]})
    text, _ = bench.cost_table(steps, per_run)
    assert "a pruner that kept no row at all would step 1.25× faster" in text
    assert "sampling at most 28 of the 128 rollouts (-78%)" in text
    # the same seconds recorded with the update's own rows (two per kept row): the update line is read on them
    update_rows = np.array([80, 80, 60, 40])
    text, records = bench.cost_table(steps.assign(update_rows=update_rows, time_update=0.1 + 0.0015 * update_rows),
                                     per_run)
    assert {r["phase"]: r["count"] for r in records}["update"] == "update_rows"
    assert "(128 sampled, 40 kept, 80 update rows per step)" in text
    assert "a pruner that kept no row at all would step 1.25× faster" in text


def test_cost_table_gives_the_ceiling_when_generation_does_not_rise_with_the_rollouts():
    """On vLLM only FastRL pays for its sketch, so generation may not rise with the rollouts sampled: the ceiling
    (from the log-prob and update lines alone) is still printed, the rollouts left to sample are not."""
    import pandas as pd

    sampled, kept = np.array([128, 128, 96, 64]), np.array([40, 40, 30, 20])
    steps = pd.DataFrame({"run_id": ["g", "g", "f", "f"], "rollouts_sampled": sampled, "rollouts_kept": kept,
                          "time_generate": [0.6, 0.6, 0.7, 0.8], "time_logprob": 0.002 * kept,
                          "time_update": 0.1 + 0.003 * kept})
    per_run = pd.DataFrame({"run_id": ["g", "f"], "method": ["grpo", "fastrl"], "seconds_per_step": [1.0, 0.8]})
    text, _ = bench.cost_table(steps, per_run)
    assert "|\n\nLeast-squares lines" in text  # a paragraph of its own below the table
    assert "Phase-line ceiling: against `grpo`'s mean step (1.000 s), a pruner that kept no row at all would step " \
           "1.25× faster" in text
    assert "a generation line that rises with the rollouts sampled, which these steps do not give" in text


def test_share_table_sets_each_methods_step_beside_the_papers():
    import pandas as pd

    row = {f"{clock}_{p}_mean": 0.0 for p in bench.PHASES for clock in ("time", "cpu")}
    summary = pd.DataFrame([{**row, "method": "grpo", "time_generate_mean": 0.5, "time_logprob_mean": 0.5,
                             "time_update_mean": 1.0, "cpu_generate_mean": 1.0, "cpu_logprob_mean": 1.0,
                             "cpu_update_mean": 2.0}])
    lines = bench.share_table(summary).splitlines()
    assert lines[2] == "| paper's grpo (Table 8: Qwen2.5-VL-7B, 4 GPUs) | wall | 16 % | 24 % | 60 % | — | 531 | 6.10× |"
    assert lines[3].startswith("| paper's fastrl (Table 8")
    assert lines[4] == "| grpo | wall | 25 % | 25 % | 50 % | 0 % | 2.000 | 4.00× |"
    assert lines[5] == "| grpo | CPU | 25 % | 25 % | 50 % | 0 % | 4.000 | 4.00× |"


def test_every_recipe_loads_and_is_used_by_the_docs_or_a_test(tmp_path):
    """fastrl_core/configs/methods.yaml: each recipe is a config the loader accepts (a retired key or pruner option
    would be refused), and each is named in README.md, docs/results.md or a test (retired ones go to docs/experiments.md)."""
    from pathlib import Path

    from fastrl_core.methods import METHODS, load_methods
    from fastrl_core.run_config import load_config
    from fastrl_core.shipped import METHODS_FILE

    repo = Path(__file__).resolve().parent.parent
    assert bench.METHODS is METHODS and METHODS == load_methods(METHODS_FILE)
    text = " ".join(p.read_text() for p in [repo / "README.md", repo / "docs" / "results.md",
                                             *sorted((repo / "tests").glob("*.py"))])
    for overrides in METHODS.values():
        load_config("paper", overrides)
    unused = [name for name in METHODS if not any(f"{a}{name}{b}" in text for a, b in ["``", ",,", ", ", '""'])]
    assert not unused, f"recipes no doc or test names: {unused}"
    bad = tmp_path / "methods.yaml"
    bad.write_text("grpo: pruner=none\n")
    with pytest.raises(ValueError, match=r"methods.yaml: method 'grpo' must be a list of key=value overrides"):
        load_methods(bad)
