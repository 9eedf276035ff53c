"""The dashboard: page helpers, the PCA / background-UMAP map, and every page under AppTest.

Every page is rendered on a store made by a real tiny bench (`python -m fastrl_app.cli bench`: GRPO and FastRL,
two seeds each, interleaved) and checked against what the store's readers and `fastrl_app.metrics` return. Exact
figures (speed-ups, final accuracy) are checked on a second store written through RunWriter as a bench would (two
seeds per method, bench run names), whose evaluations are placed so the answers are known by hand; its rows are
the store's synthetic steps with a real keep rule applied (zero advantage -> ZERO_ADVANTAGE, beyond the top-4 |A|
-> REDUNDANT).
"""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from streamlit.testing.v1 import AppTest

import fastrl_app
from fastrl_app import analysis, charts, savings
from fastrl_app import metrics as core_metrics
from fastrl_app.projection import MIN_UMAP_POINTS, SketchMap, pca_2d
from fastrl_core import store
from fastrl_core.store.fake_runs import fake_step, prompt_png

MAIN = str(Path(fastrl_app.__file__).parent / "main.py")
REPO = Path(__file__).resolve().parent.parent
# A real tiny bench: 5 steps of 8 prompts x 6 rollouts on the synthetic task, evaluated every 2 steps, GRPO and
# FastRL under seeds 0 and 1. One thread: with 2 threads on 2 shared cores a run took 59 s instead of 7 s.
REAL_STEPS = 5
SHORT_RUN = [f"steps={REAL_STEPS}", "prompts_per_step=8", "rollouts_per_prompt=6", "eval_every=2", "eval_size=16",
             "synthetic_train=256", "synthetic_test=16", "checkpoint_every=0", "threads=1"]
STEPS = 12
RATES = {"grpo": 1.0, "fastrl": 0.5}  # training seconds per step
EVALS = {("grpo", 0): [(0, 0.30), (4, 0.40), (8, 0.50), (12, 0.60)],
         ("grpo", 1): [(0, 0.30), (4, 0.50), (8, 0.50), (12, 0.50)],
         ("fastrl", 0): [(0, 0.30), (4, 0.45), (8, 0.62), (12, 0.66)],
         ("fastrl", 1): [(0, 0.30), (4, 0.60), (8, 0.60), (12, 0.60)]}
# By hand (fastrl_app.metrics): GRPO's finals (0.4+0.5+0.6)/3 = 0.5 and 0.5, acc0 0.3, target 0.3 + 0.9 * 0.2 = 0.48.
# Trailing means of up to 3 evaluations after step 0 first reach it: GRPO seed 0 at step 12 (12 s), seed 1 at step
# 4 (4 s); FastRL seed 0 at step 8 (0.535; 4 s), seed 1 at step 4 (2 s): speed-ups 3 and 2, geometric mean sqrt(6).
# 12 steps take 12 s vs 6 s: step speed-up 2 in both seeds. FastRL's finals 0.5767 and 0.6: mean 0.5883.
TARGET_SPEEDUP = math.sqrt(6.0)
TARGET_ROLLOUT_SHARE = math.sqrt(8 / 12 * 4 / 4)  # both sample 64 rollouts a step: reached at steps 8 vs 12, 4 vs 4
FASTRL_FINAL = ((0.45 + 0.62 + 0.66) / 3 + 0.6) / 2


def prune(kwargs: dict, max_keep: int = 4) -> dict:
    """Apply a real rule to a synthetic step: zero-advantage rollouts are pruned, then all but the top-`max_keep`
    |advantage| of each group; counts in the groups and steps rows follow."""
    by_prompt: dict[str, list[dict]] = {}
    for row in kwargs["rollouts"]:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    for rows in by_prompt.values():
        ranked = sorted((r for r in rows if abs(r["advantage"]) > 1e-6), key=lambda r: -abs(r["advantage"]))
        top = {id(r) for r in ranked[:max_keep]}
        for row in rows:
            row["kept"] = id(row) in top
            row["reason"] = "KEPT" if row["kept"] else ("ZERO_ADVANTAGE" if abs(row["advantage"]) <= 1e-6
                                                        else "REDUNDANT")
            row["weight"] = 1.0 if row["kept"] else None
    for group in kwargs["groups"]:
        group["kept"] = sum(r["kept"] for r in by_prompt[group["prompt_id"]])
    kwargs["step_row"]["rollouts_kept"] = sum(r["kept"] for r in kwargs["rollouts"])
    return kwargs


def keep_all(kwargs: dict) -> dict:
    for row in kwargs["rollouts"]:
        row.update(kept=True, reason="KEPT", weight=1.0)
    for group in kwargs["groups"]:
        group["kept"] = group["sampled"]
    kwargs["step_row"]["rollouts_kept"] = kwargs["step_row"]["rollouts_sampled"]
    return kwargs


def step_kwargs(step: int, kind: str, pngs: dict) -> dict:
    kwargs = fake_step(step, prompts=8, rollouts_per_prompt=8, sketch_dim=32, dataset_size=24, pngs=pngs)
    kwargs = keep_all(kwargs) if kind == "grpo" else prune(kwargs)
    kwargs["step_row"]["wall_time"] = (step + 1) * RATES[kind]
    return kwargs


def write_run(root: Path, kind: str, *, seed: int = 0, steps: int = STEPS, finish: bool = True) -> store.RunWriter:
    """A run as `fastrl bench` names it; the evaluation after s steps is stamped with those steps' seconds."""
    writer = store.RunWriter(root, name=core_metrics.bench_run_name(kind, seed), config={"steps": steps, "seed": seed},
                             model="embedded", dataset="synthetic", objective="grpo",
                             pruner="none" if kind == "grpo" else "fastrl",
                             budget="fixed" if kind == "grpo" else "adaptive", code_version="test")
    pngs: dict = {}
    for step in range(steps):
        writer.write_step(step, **step_kwargs(step, kind, pngs))
    for step, accuracy in EVALS[(kind, seed)] if finish else []:
        writer.write_eval(step, "test", accuracy, 256, wall_time=step * RATES[kind])
    if finish:
        writer.finish()
    return writer


def train_command(store_dir: Path, name: str, *overrides: str) -> list[str]:
    """`fastrl train` on the embedded default, FastRL or the plain-GRPO baseline (the browser test's live run)."""
    pruner = ["pruner=none", "budget=fixed"] if name == "grpo" else ["pruner=fastrl", "budget=adaptive"]
    return [sys.executable, "-m", "fastrl_app.cli", "train", "embedded",
            f"store_dir={store_dir}", f"run_name={name}", *SHORT_RUN, *pruner, *overrides]


def bench_command(store_dir: Path) -> list[str]:
    """`fastrl bench` on the embedded default (the shipped warm start): GRPO and FastRL, seeds 0 and 1."""
    return [sys.executable, "-m", "fastrl_app.cli", "bench", "--config", "embedded",
            "--methods", "grpo,fastrl", "--seeds", "0,1", "--store", str(store_dir), "--out",
            str(store_dir / "report"), *SHORT_RUN]


def by_name(root: Path) -> dict[str, str]:
    """{"grpo": seed-0 GRPO run id, "fastrl": seed-0 FastRL run id, "grpo-1": ..., "fastrl-1": ...}."""
    labels = core_metrics.run_labels(store.read_runs(root))
    return {(m if s == 0 else f"{m}-{s}"): r for r, m, s in zip(labels["run_id"], labels["method"], labels["seed"])}


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A store written by a real tiny bench: FastRL (pruner fastrl, adaptive budget) and GRPO, two seeds each."""
    root = tmp_path_factory.mktemp("trained")
    done = subprocess.run(bench_command(root), cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, by_name(root)


@pytest.fixture(scope="session")
def designed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """RunWriter store whose evaluations make the speed-ups and accuracies known by hand (two seeds a method)."""
    root = tmp_path_factory.mktemp("designed")
    for kind in ("grpo", "fastrl"):
        for seed in (0, 1):
            write_run(root, kind, seed=seed)
        time.sleep(1.1)  # FastRL runs start later: the Demo page picks the newest
    return root, by_name(root)


def open_page(monkeypatch, store_dir: Path, page: str | None, **params: str) -> AppTest:
    monkeypatch.setenv("FASTRL_STORE", str(store_dir))
    at = AppTest.from_file(MAIN, default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    if page is not None:
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption] + [i.value for i in at.info]
                     + [w.value for w in at.warning] + [t.value for t in at.title] + [h.value for h in at.header])


TABLE_COLUMNS = {"runs_table": "status", "methods_table": "reached target", "compare_table": "target_speedup"}


def frame(at: AppTest, key: str) -> pd.DataFrame:
    """The table of the Runs page's st.dataframe `key` (AppTest does not expose a read-only table's key: found by a
    column only that table has)."""
    return next(d.value for d in at.dataframe if TABLE_COLUMNS[key] in d.value.columns
                and (key != "compare_table" or "run" in d.value.columns))


def plotly_specs(at: AppTest) -> list[dict]:
    return [json.loads(element.proto.spec) for element in at.get("plotly_chart")]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


# ----------------------------------------------------------------------------------------------- pure summaries
def test_train_accuracy_is_a_rolling_mean_per_run():
    steps = pd.DataFrame({"run_id": ["a"] * 3 + ["b"], "step": [0, 1, 2, 0], "wall_time": [1.0, 2.0, 3.0, 1.0],
                          "accuracy": [0.0, 0.5, 1.0, 0.2]})
    train = analysis.train_accuracy(steps, window=2)
    assert train["accuracy"].tolist() == [0.0, 0.25, 0.75, 0.2]


def test_phases_long_reads_run_and_summary_columns():
    wide = pd.DataFrame({"method": ["g", "f"], "time_update_mean": [2.0, 1.0], "time_generate_mean": [1.0, None]})
    long = analysis.phases_long(wide, "method", ("generate", "update"))
    assert long.to_dict("records") == [{"method": "g", "phase": "generate", "seconds": 1.0},
                                       {"method": "g", "phase": "update", "seconds": 2.0},
                                       {"method": "f", "phase": "update", "seconds": 1.0}]
    per_run = pd.DataFrame({"run_id": ["r"], "time_prune": [0.5]})
    assert analysis.phases_long(per_run, "run_id", ("prune",))["seconds"].tolist() == [0.5]


def test_reason_labels_and_filters():
    rollouts = pd.DataFrame({"step": [0, 0, 0, 1, 1], "prompt_id": ["a", "a", "b", "a", "b"],
                             "kept": [True, False, False, False, True],
                             "reason": ["KEPT", "ZERO_ADVANTAGE", "REDUNDANT", "ZERO_ADVANTAGE", "KEPT"],
                             "accuracy_reward": [1.0, 0.0, None, 1.0, 0.0]})
    counts = pd.DataFrame({"step": [0, 1], "reason": ["REDUNDANT", None], "count": [1, 2]})
    assert analysis.reason_labels(counts)["reason"].tolist() == ["redundant", "—"]
    assert analysis.filter_rollouts(rollouts, prompt_id="a", kept=False).index.tolist() == [1, 3]
    assert analysis.filter_rollouts(rollouts, correct=True).index.tolist() == [0, 3]
    assert analysis.filter_rollouts(rollouts, correct=False, reasons=["REDUNDANT"]).index.tolist() == [2]


def test_pick_informative_group():
    groups = pd.DataFrame({"prompt_id": ["flat", "small", "big", "all"], "reward_std": [0.0, 0.5, 0.4, 0.3],
                           "sampled": [8, 4, 8, 8], "kept": [0, 2, 3, 8]})
    assert analysis.pick_informative_group(groups) == "big"  # partly pruned, mixed rewards, largest
    assert analysis.pick_informative_group(groups.iloc[[0, 3]]) == "flat"  # only one with a pruned rollout
    assert analysis.pick_informative_group(groups.iloc[:0]) is None


def test_selected_keys_accept_dict_and_list_customdata():
    points = [{"customdata": {"0": 3, "1": "r7"}}, {"customdata": [4, "r1"]}, {"x": 1.0}]
    assert analysis.selected_keys(points) == [(3, "r7"), (4, "r1")]


def test_budget_heatmap_keeps_most_sampled_prompts_in_first_seen_order():
    matrix = pd.DataFrame({"step": [0, 0, 1, 1, 2, 2], "prompt_id": ["a", "b", "c", "a", "c", "d"],
                           "sampled": [8, 6, 4, 5, 3, 8], "kept": [1] * 6})
    table = analysis.budget_heatmap(matrix, max_prompts=2)
    assert table.index.tolist() == ["a", "c"]
    assert table.loc["a"].tolist()[:2] == [8.0, 5.0] and np.isnan(table.loc["c", 0])


# ----------------------------------------------------------------------------------------------- projection
@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(3, 30), st.integers(2, 8)),
              elements=st.floats(-100, 100, allow_nan=False)))
def test_pca_axes_are_uncorrelated_and_ordered(x):
    xy = pca_2d(x)
    assert xy.shape == (len(x), 2)
    variance = xy.var(axis=0)
    assert variance[0] >= variance[1] - 1e-6 * (1 + variance[0])
    covariance = np.mean((xy[:, 0] - xy[:, 0].mean()) * (xy[:, 1] - xy[:, 1].mean()))
    assert abs(covariance) <= 1e-6 * (1 + variance[0])


def test_pca_of_planar_points_preserves_distances_up_to_rotation():
    rng = np.random.default_rng(0)
    plane = rng.normal(size=(50, 2)) * [5.0, 1.0]
    basis = np.linalg.qr(rng.normal(size=(6, 2)))[0]  # (6, 2) orthonormal columns
    xy = pca_2d(plane @ basis.T + 3.0)
    distances = lambda p: np.linalg.norm(p[:, None] - p[None], axis=-1)  # noqa: E731
    np.testing.assert_allclose(distances(xy), distances(plane), atol=1e-8)


@pytest.mark.slow  # UMAP's numba compile in a fresh worker process: 15-35 s on 2 busy cores
def test_sketch_map_answers_with_pca_at_once_then_umap_from_the_worker():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(60, 16)), rng.normal(size=(60, 16)) + 6]).astype(np.float32)
    ids = [f"r{i}" for i in range(len(x))]
    service = SketchMap()
    try:
        tiny = service.project("tiny", ids[: MIN_UMAP_POINTS - 1], x[: MIN_UMAP_POINTS - 1])
        assert tiny.method == "pca" and "at least" in tiny.note
        first = service.project("run", ids[:100], x[:100])
        # never waits for UMAP: it answers with PCA while all 100 points are still pending for the worker's fit (a
        # condition, not a wall-clock deadline that a busy machine would miss)
        assert first.method == "pca" and first.pending == 100
        assert service.wait("run", 180)
        later = service.project("run", ids, x)  # 20 new rollouts: transformed in the background
        assert later.method == "umap" and later.pending == 20 and np.isnan(later.xy[100:]).all()
        assert service.wait("run", 60)
        done = service.project("run", ids, x)
        assert done.method == "umap" and done.pending == 0 and np.isfinite(done.xy).all()
        # the two blobs stay apart on the map: every point is nearer its own blob's centre
        centres = np.stack([done.xy[:60].mean(0), done.xy[60:].mean(0)])
        nearest = np.linalg.norm(done.xy[:, None] - centres[None], axis=-1).argmin(1)
        assert (nearest == np.repeat([0, 1], 60)).mean() > 0.95
    finally:
        service.close()


# ----------------------------------------------------------------------------------------------- pages
def test_empty_store_says_how_to_start_on_every_page(monkeypatch, tmp_path):
    for page in (None, "budget", "rollouts", "embeddings", "demo"):
        at = open_page(monkeypatch, tmp_path, page)
        assert "No runs in the store" in texts(at), page


def test_runs_page_compares_methods_across_seeds_by_hand(monkeypatch, designed):
    store_dir, run_ids = designed
    at = open_page(monkeypatch, store_dir, None)
    table = frame(at, "methods_table").set_index("method")
    assert table.loc["grpo", "seeds"] == 2 and table.loc["fastrl", "seeds"] == 2
    assert table.loc["fastrl", "step speed-up"] == "2.00× ± 0.00"
    assert table.loc["fastrl", "time-to-target speed-up"].startswith(f"{TARGET_SPEEDUP:.2f}× [")
    assert table.loc["fastrl", "reached target"] == "2/2"
    assert table.loc["fastrl", "final accuracy"].startswith(f"{FASTRL_FINAL:.3f} ± ")
    assert table.loc["grpo", "final accuracy"] == "0.500 ± 0.000"
    assert table.loc["grpo", "accuracy vs its GRPO (paired)"] == "+0.000 ± 0.000"
    assert table.loc["fastrl", "accuracy vs its GRPO (paired)"].startswith(f"{FASTRL_FINAL - 0.5:+.3f}")
    band = next(s for s in plotly_specs(at) if any(t.get("fill") == "tonexty" for t in s["data"]))
    names = [t["name"] for t in band["data"] if t.get("showlegend") is not False]
    assert names == ["grpo (2 seeds)", "fastrl (2 seeds)"]
    fastrl_mean = next(t for t in band["data"] if t.get("name") == "fastrl (2 seeds)")
    assert _values(fastrl_mean["y"])[0] == pytest.approx(0.30) and _values(fastrl_mean["x"])[-1] == pytest.approx(6.0)
    at.multiselect(key="methods").set_value(["fastrl"]).run()  # without its baseline: no speed-up to show
    assert frame(at, "methods_table").set_index("method").loc["fastrl", "step speed-up"] == "—"
    compared = open_page(monkeypatch, store_dir, None, view="Compare runs")
    assert not [d for d in compared.dataframe if "reached target" in d.value.columns]  # only the open tab is built
    per_seed = frame(compared, "compare_table").set_index("run")
    assert per_seed.loc[run_ids["fastrl"], "target_speedup"] == "3.00×"  # shown as text: no "None" in a table
    assert per_seed.loc[run_ids["fastrl-1"], "target_speedup"] == "2.00×"
    assert not per_seed.isin(["None", None]).any().any()


def test_runs_and_demo_pages_switch_to_mean_at_k_where_runs_recorded_it(monkeypatch, tmp_path, designed):
    at = open_page(monkeypatch, designed[0], None)
    assert not [r for r in at.radio if r.key == "methods_accuracy"]  # greedy only: no switch
    sampled = {"grpo": 0.40, "fastrl": 0.35}  # mean@k at every evaluation
    for kind in ("grpo", "fastrl"):
        for seed in (0, 1):
            writer = write_run(tmp_path, kind, seed=seed, finish=False)
            for step, accuracy in EVALS[(kind, seed)]:
                writer.write_eval(step, "test", accuracy, 256, wall_time=step * RATES[kind])
                writer.write_eval(step, "test-sampled", sampled[kind], 256, wall_time=step * RATES[kind])
            writer.finish()
    at = open_page(monkeypatch, tmp_path, None)
    assert frame(at, "methods_table").set_index("method").loc["fastrl", "final accuracy"].startswith(
        f"{FASTRL_FINAL:.3f}")  # greedy by default
    at.radio(key="methods_accuracy").set_value("sampled (mean@k)").run()
    table = frame(at, "methods_table").set_index("method")
    assert table.loc["fastrl", "final accuracy"] == "0.350 ± 0.000" and table.loc["grpo", "final accuracy"] == \
        "0.400 ± 0.000"
    assert table.loc["fastrl", "accuracy vs its GRPO (paired)"] == "-0.050 ± 0.000"
    chart = next(s for s in plotly_specs(at) if s["layout"].get("uirevision") == "methods")
    assert "mean@k" in chart["layout"]["yaxis"]["title"]["text"]
    demo = open_page(monkeypatch, tmp_path, "demo")
    demo.radio(key="demo_accuracy").set_value("sampled (mean@k)").run()
    assert metrics(demo)["FastRL accuracy"] == "35.0% ± 0.0 pts" and "mean@k" in texts(demo)


def test_runs_page_is_served_at_its_own_address(monkeypatch, designed):
    """`/runs` must name a registered page: Streamlit serves the default page at "" whatever its url_path, and a
    direct visit resolves the page whose url_pathname equals the address (PagesManager._resolve_page_script)."""
    from streamlit.runtime.pages_manager import PagesManager

    store_dir, _ = designed
    at = open_page(monkeypatch, store_dir, None)
    pages = at._registered_pages  # what st.navigation registered on this run
    manager = PagesManager(MAIN)
    manager.set_script_intent("", "runs")  # a browser opening /runs
    found = manager.set_pages_and_resolve(pages, fallback_page_hash="")
    assert found is not None and Path(found["script_path"]).name == "runs.py"
    at.switch_page("views/runs.py").run()
    assert not at.exception and frame(at, "methods_table")["method"].tolist() == ["grpo", "fastrl"]


def test_runs_page_on_real_runs(monkeypatch, trained):
    store_dir, run_ids = trained
    listed = frame(open_page(monkeypatch, store_dir, None, view="All runs"), "runs_table").set_index("run")
    at = open_page(monkeypatch, store_dir, None)
    runs = store.read_runs(store_dir).set_index("run_id")
    assert set(listed.index) == set(run_ids.values()) and set(listed["status"]) == {"finished"}
    for run_id in run_ids.values():
        assert listed.loc[run_id, "steps"] == runs.loc[run_id, "steps"] == REAL_STEPS
        assert listed.loc[run_id, "best eval accuracy"] == f"{runs.loc[run_id, 'best_accuracy']:.3f}"
    results = json.loads((store_dir / "report" / "results.json").read_text())
    summary = {row["method"]: row for row in results["summary"]}  # what the bench wrote, by the same module
    table = frame(at, "methods_table").set_index("method")
    assert table.loc["fastrl", "step speed-up"] == core_metrics.interval(summary["fastrl"], "step_speedup").text(
        ".2f", "×")
    assert table.loc["fastrl", "final accuracy"] == core_metrics.interval(summary["fastrl"], "final_accuracy").text()
    phases = next(s for s in plotly_specs(at) if any(t.get("orientation") == "h" for t in s["data"]))
    steps = store.read_steps(store_dir, list(run_ids.values()))
    measured = {p for p in store.PHASES if steps[f"time_{p}"].notna().any()}
    assert {t["name"] for t in phases["data"]} == measured
    at.radio(key="methods_x").set_value("CPU seconds").run()
    assert not at.exception and frame(at, "methods_table").shape[0] == 2
    at.radio(key="methods_x").set_value("rollouts sampled").run()  # every seed's curve up to the fewest sampled
    band = next(s for s in plotly_specs(at) if s["layout"]["xaxis"]["title"]["text"] == "rollouts sampled")
    evals = store.read_evals(store_dir, list(run_ids.values()))
    last = evals.groupby("run_id")["step"].max()
    fewest = min(steps.loc[(steps["run_id"] == r) & (steps["step"] < last[r]), "rollouts_sampled"].sum()
                 for r in run_ids.values())
    assert max(max(_values(t["x"])) for t in band["data"]) == pytest.approx(fewest)


def test_budget_page_draws_the_store_numbers(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"])
    steps = store.read_steps(store_dir, run_ids["fastrl"])
    last = steps.iloc[-1]
    shown = metrics(at)
    assert shown["Latest step"] == str(REAL_STEPS - 1)
    assert shown["Kept this step"] == f"{last['rollouts_kept'] / last['rollouts_nominal']:.0%}"  # of nominal, as Runs
    split = next(s for s in plotly_specs(at) if s["data"][0].get("stackgroup") == "split")
    # stacked areas, one path per part: a bar per step and part was 3,200 SVG shapes on an 800-step run
    assert [(t["type"], t["stackgroup"]) for t in split["data"]] == [("scatter", "split")] * 4
    by_name = {t["name"]: _values(t["y"]) for t in split["data"]}
    assert by_name["kept (enter the passes)"] == steps["rollouts_kept"].tolist()
    assert by_name["skipped by the budget"] == steps["rollouts_skipped"].tolist()
    assert by_name["merged as duplicates (every method)"] == steps["rollouts_merged"].tolist()
    assert by_name["pruned by the method's rule"] == steps["rollouts_pruned"].tolist()
    assert split["layout"]["uirevision"] == run_ids["fastrl"]  # zoom survives live redraws
    totals = savings.split_totals(savings.rollout_split(steps))
    assert f"**{totals['skipped']:,} ({totals['skipped'] / totals['nominal']:.0%}) skipped by the budget**" in texts(at)
    assert len(plotly_specs(at)) == 1  # only the open tab, Split, is built: the others wait
    assert "timeline_prompt" not in [w.key for w in at.selectbox]

    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"], view="Whole run")
    heatmap = next(s for s in plotly_specs(at) if s["data"][0].get("type") == "heatmap")
    assert list(heatmap["data"][0]["x"]) == list(range(REAL_STEPS))  # the whole run, every step
    assert len(heatmap["data"][0]["y"]) == store.read_groups(store_dir, run_ids["fastrl"])["prompt_id"].nunique()
    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"], view="One prompt")
    assert "timeline_prompt" in [w.key for w in at.selectbox]
    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"], view="Group sizes")
    rollouts = store.read_rollouts(store_dir, run_ids["fastrl"])
    pruned = {analysis.reason_label(r) for r in rollouts.loc[~rollouts["kept"], "reason"]}
    reasons = next(s for s in plotly_specs(at) if s["data"] and s["data"][0].get("stackgroup") == "reasons")
    assert {t["name"] for t in reasons["data"]} == pruned


def _values(encoded) -> list:
    """Plotly 6+ may encode arrays as {"dtype", "bdata"}; decode either form."""
    if isinstance(encoded, dict):
        return np.frombuffer(base64.b64decode(encoded["bdata"]), dtype=np.dtype(encoded["dtype"])).tolist()
    return list(encoded)


def test_budget_page_reads_a_new_step_of_a_live_run(monkeypatch, tmp_path):
    writer = write_run(tmp_path, "fastrl", steps=3, finish=False)
    at = open_page(monkeypatch, tmp_path, "budget")
    assert metrics(at)["Latest step"] == "2" and "redraws at each new step" in texts(at)
    writer.write_step(3, **step_kwargs(3, "fastrl", {}))
    at.run()
    assert metrics(at)["Latest step"] == "3"


def test_rollouts_deep_link_shows_that_group_and_filters_apply(monkeypatch, trained):
    store_dir, run_ids = trained
    run_id = run_ids["fastrl"]
    groups = store.read_groups(store_dir, run_id, step=4)
    prompt = analysis.pick_informative_group(groups)
    group = store.read_rollouts(store_dir, run_id, step=4, prompt_id=prompt)
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_id, step="4", prompt=prompt)
    assert at.selectbox(key="rollouts_prompt").value == prompt
    assert at.select_slider(key="rollouts_step").value == 4
    assert at.get("image"), "the prompt image is shown"
    table = at.dataframe[0].value
    assert len(table) == len(group)
    assert table["advantage"].tolist() == sorted(group["advantage"], reverse=True)
    n_kept = int(group["kept"].sum())
    assert f"{len(group)} rollouts sampled (" in texts(at) and f"**{n_kept} kept**" in texts(at)
    assert table["multiplicity"].sum() == len(group)  # every sampled rollout counted once, copies at 0
    at.radio(key="rollouts_kept").set_value("no").run()
    assert len(at.dataframe[0].value) == len(group) - n_kept
    assert set(at.dataframe[0].value["status"]) <= {"merged", "pruned"}
    assert at.query_params["prompt"] == prompt and at.query_params["step"] == "4"
    at.radio(key="rollouts_kept").set_value("all").run()
    reason = group["reason"].iloc[0]
    at.multiselect(key="rollouts_reason").set_value([reason]).run()
    assert len(at.dataframe[0].value) == int((group["reason"] == reason).sum())


def test_rollouts_page_every_prompt_view_has_image_urls(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_ids["fastrl"], step="2", prompt="all")
    table = at.dataframe[0].value
    assert len(table) == len(store.read_rollouts(store_dir, run_ids["fastrl"], step=2))
    assert table["image"].str.startswith("data:image/png;base64,").all()
    at.radio(key="rollouts_correct").set_value("no").run()
    assert len(at.dataframe[0].value) == len(store.read_rollouts(store_dir, run_ids["fastrl"], step=2, correct=False))


def test_embeddings_page_maps_the_sketches_of_the_chosen_steps(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "embeddings", run=run_ids["fastrl"])
    meta, matrix = store.read_sketches(store_dir, run_ids["fastrl"], steps=range(REAL_STEPS - 5, REAL_STEPS))
    assert len(meta) > 0 and matrix.shape[1] > 0
    spec = plotly_specs(at)[0]
    assert sum(len(t["customdata"]) for t in spec["data"]) == len(meta)
    assert {t["name"] for t in spec["data"]} <= {"kept (enter the passes)", "merged as duplicates (every method)",
                                                 "pruned by the method's rule"}
    assert spec["layout"]["dragmode"] == "select"
    assert "Select points on the map" in texts(at)
    at.radio(key="map_colour").set_value("advantage").run()
    assert not at.exception


def test_demo_page_tells_the_story_on_real_runs(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "demo")
    assert at.selectbox(key="picker_run").value in {run_ids["fastrl"], run_ids["fastrl-1"]}
    story = texts(at)
    assert "One group, in both runs" in story and "Speed and accuracy against GRPO" in story
    assert "1. **Sample.**" in story and "4. **Update.**" in story and "The same question at the same step" in story
    assert "credited to neither" in story and "interleaved step by step in one process" in story
    assert at.get("image"), "the group's prompt image is shown"
    per_run = core_metrics.compare_runs(
        core_metrics.run_labels(store.read_runs(store_dir)), store.read_steps(store_dir, list(run_ids.values())),
        store.read_evals(store_dir, list(run_ids.values())))
    final = core_metrics.mean_ci(per_run.loc[per_run["method"] == "fastrl", "final_accuracy"])
    shown = metrics(at)
    assert shown["FastRL accuracy"] == f"{final.mean:.1%} ± {100 * (final.high - final.mean):.1f} pts"
    assert "2 seeds" in texts(at)
    answers = [e for e in at.expander if e.label.startswith("The answers in both runs")]
    assert len(answers) == 1 and not answers[0].children  # closed: its tables are not built
    at.session_state["demo_answers"] = True  # what opening it in the browser sets (a rerun follows)
    at.run()
    opened = [e for e in at.expander if e.label.startswith("The answers in both runs")][0]
    assert [node.type for node in opened].count("dataframe") == 2 and not at.exception


def test_demo_page_shows_the_hand_computed_speedup(monkeypatch, designed):
    store_dir, run_ids = designed
    at = open_page(monkeypatch, store_dir, "demo")
    shown = metrics(at)
    assert shown["Speed-up per step"] == "2.00× ± 0.00"
    assert shown["Speed-up to the target accuracy"].startswith(f"{TARGET_SPEEDUP:.2f}× [")
    assert shown["Rollouts to the target (× GRPO's)"].startswith(f"{TARGET_ROLLOUT_SHARE:.2f}× [")
    final = core_metrics.mean_ci([(0.45 + 0.62 + 0.66) / 3, 0.6])
    assert shown["FastRL accuracy"] == f"{FASTRL_FINAL:.1%} ± {100 * (final.high - final.mean):.1f} pts"
    assert shown["GRPO accuracy"] == "50.0% ± 0.0 pts"
    band = next(s for s in plotly_specs(at) if s["layout"].get("uirevision") == "demo/compare")
    assert {t["name"] for t in band["data"] if t.get("showlegend") is not False} == {"grpo (2 seeds)",
                                                                                   "fastrl (2 seeds)"}


def test_demo_page_without_a_baseline_says_so(monkeypatch, tmp_path):
    write_run(tmp_path, "fastrl", steps=2, finish=False)
    at = open_page(monkeypatch, tmp_path, "demo")
    assert "No figure here" in texts(at) and "no plain-GRPO run of seed 0 trained interleaved" in texts(at)
    runs = open_page(monkeypatch, tmp_path, None)  # a live run without evaluations or baseline: no error
    assert "No chart yet" in texts(runs)
    assert frame(runs, "methods_table").loc[0, "step speed-up"] == "—"


def test_pruning_saving_names_only_the_passes_the_run_had():
    from fastrl_app.analysis import pruning_saving

    steps = pd.DataFrame({"rollouts_sampled": [100, 100], "rollouts_kept": [50, 30], "time_update": [3.0, 1.0],
                          "time_logprob": [0.0, 0.0]})
    text = pruning_saving(steps)
    assert "skipped the update." in text and "log-prob" not in text and "120 rollouts of 200" in text
    assert "~6 s" in text  # (3 + 1) s on 80 kept -> 120 more at the same cost per rollout
    with_kl = steps.assign(time_logprob=[1.0, 1.0])
    assert "skipped the reference log-prob pass and the update" in pruning_saving(
        with_kl, savings.passes_after_pruning(with_kl, {"objective_args": {"beta": 0.01}}))
    assert pruning_saving(steps.assign(rollouts_kept=[100, 100])) == \
        "No sampled rollout was left out of the passes in this run."
    assert "pass costs" not in text and "pass costs" not in pruning_saving(steps.assign(row_cost=[None, None]))
    assert "pass costs" not in pruning_saving(steps.assign(row_cost=[0.0, 0.0]))  # the "ρ = 0.0000"
    costed = pruning_saving(steps.assign(row_cost=[None, 0.0125]))
    assert "from pass costs on 1 of 2 steps (a kept row cost ρ = 0.0125 of the step's other seconds, median; " \
           "0.0125–0.0125)" in costed


def test_budget_decisions_timeline_and_multiplicity_by_hand():
    assert [analysis.budget_decision(s, 8) for s in (0, 2, 5, 8)] == ["skip", "probe", "trimmed", "full"]
    groups = pd.DataFrame({"step": [3, 0, 1, 0], "prompt_id": ["a", "a", "a", "b"], "sampled": [0, 8, 2, 8],
                           "kept": [0, 3, 0, 8], "merged": [0, 4, 1, 0], "reward_mean": [0.0, 0.5, 1.0, 0.2],
                           "reward_std": [0.0, 0.4, 0.0, 0.1]})
    line = analysis.prompt_timeline(groups, "a", n=8)
    assert line["step"].tolist() == [0, 1, 3] and line["decision"].tolist() == ["full", "probe", "skip"]
    assert line["outcome"].tolist() == ["mixed", "all equal (r = 1.00)", "not sampled"]
    rollouts = pd.DataFrame({"step": [0, 0, 0, 0, 1], "prompt_id": ["a", "a", "a", "b", "a"],
                             "completion": ["x", "y", "x", "x", "x"], "kept": [True, True, False, True, True],
                             "reason": ["KEPT", "KEPT", "DUPLICATE", "KEPT", "KEPT"]})
    assert analysis.multiplicity(rollouts).tolist() == [2, 1, 0, 1, 1]  # copies per (step, prompt) only


def test_demo_page_on_a_run_trained_alone_gives_no_figure_and_says_why(monkeypatch, tmp_path):
    writer = store.RunWriter(tmp_path, name="fastrl", config={"steps": 2, "seed": 0}, model="embedded",
                             dataset="synthetic", objective="grpo", pruner="fastrl", budget="adaptive")
    pngs: dict = {}
    for step in range(2):
        writer.write_step(step, **step_kwargs(step, "fastrl", pngs))
    writer.finish()
    write_run(tmp_path, "grpo", steps=2)  # a GRPO run exists, but the FastRL run was not trained beside it
    at = open_page(monkeypatch, tmp_path, "demo", run=writer.run_id)
    assert "No figure here" in texts(at) and "was not trained interleaved with a GRPO run" in texts(at)
    assert "Speed-up per step" not in metrics(at)


def test_report_writes_the_demo_as_one_offline_file(tmp_path, trained):
    from fastrl_app.report import render, write_report

    store_dir, run_ids = trained
    out = write_report(store_dir, tmp_path / "sub" / "demo.html", run_id=run_ids["fastrl"])
    text = out.read_text()
    assert text.count("<script") >= 3 and text.count("Plotly.newPlot") >= 3
    assert 'src="https://cdn' not in text and "src='https://" not in text  # plotly.js inline, nothing fetched
    assert "data:image/png;base64," in text and "Caveats" in text and "credited to neither" in text
    with pytest.raises(FileNotFoundError, match="no run 'nosuchrun'"):
        render(store_dir, "nosuchrun")
    from fastrl_app.cli import main

    assert main(["report", "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "x.html")]) == 2


def test_token_html_shades_each_token_by_its_log_prob():
    html = analysis.token_html([("\\boxed{", 0.0), ("3", -4.0), ("<b>", -1.0)], 0.5)
    assert html.count("<span title='log-prob") == 3
    assert "rgba(231,111,81,0.08)" in html and "rgba(231,111,81,0.93)" in html  # certain vs unlikely
    assert "&lt;b&gt;" in html and "advantage +0.500" in html  # token text escaped


def test_missing_deep_links_say_what_is_missing(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "rollouts", run="nosuchrun", step="999", prompt="nosuchprompt")
    warnings = " ".join(w.value for w in at.warning)
    assert "run `nosuchrun`, which is not in this store" in warnings
    assert "step `999`" in warnings and f"0–{REAL_STEPS - 1}" in warnings
    assert "prompt `nosuchprompt`" in warnings


def test_plain_grpo_is_credited_with_nothing_and_has_no_sketch_map(monkeypatch, trained):
    store_dir, run_ids = trained
    grpo = next(r for name, r in run_ids.items() if name.startswith("grpo"))
    at = open_page(monkeypatch, store_dir, "budget", run=grpo)
    assert "This is plain GRPO: it prunes nothing" in texts(at) and "0 (0%) skipped by the budget" in texts(at)
    at = open_page(monkeypatch, store_dir, "embeddings", run=grpo)
    assert "is plain GRPO (pruner `none`)" in texts(at) and "without rollout logging" not in texts(at)
    at = open_page(monkeypatch, store_dir, "embeddings")  # opens on a run that has sketches
    assert at.selectbox(key="picker_run").value in {run_ids["fastrl"], run_ids["fastrl-1"]}


def test_rollouts_page_shows_one_rollout_token_by_token(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_ids["fastrl"], step="1")
    assert "Token by token" in texts(at)
    html = at.get("html")[0].proto.body
    tokens = store.read_tokens(store_dir, run_ids["fastrl"], 1, at.selectbox(key="full_group").value)
    assert html.count("<span title='log-prob") == len(tokens) > 0
    beside = [e for e in at.expander if e.label.startswith("The same prompt in")]  # the paired GRPO run
    assert len(beside) == 1 and not beside[0].children  # closed: the other run's group is not read
    at.session_state["rollouts_beside"] = True  # what opening it in the browser sets (a rerun follows)
    at.run()
    opened = [e for e in at.expander if e.label.startswith("The same prompt in")][0]
    assert [node.type for node in opened].count("dataframe") == 2 and not at.exception  # the two groups


# ------------------------------------------------------------------- issue 45: a real run's size, and the truth
def test_fates_and_multiplicity_follow_the_recorded_merge():
    """A merged copy is the row recorded DUPLICATE, whatever its text's other rows; stands for counts its copies."""
    rollouts = pd.DataFrame({"step": [0] * 6, "prompt_id": ["a"] * 5 + ["b"],
                             "completion": ["x", "x", "x", "y", "y", "x"],
                             "kept": [True, False, False, False, False, True],
                             "reason": ["KEPT", "DUPLICATE", "DUPLICATE", "LOW_ADVANTAGE", "DUPLICATE", "KEPT"]})
    assert analysis.fates(rollouts).tolist() == ["kept", "merged", "merged", "pruned", "merged", "kept"]
    assert analysis.multiplicity(rollouts).tolist() == [3, 0, 0, 2, 0, 1]
    fate = analysis.group_fate(rollouts[rollouts["prompt_id"] == "a"], nominal=8)
    assert {k: fate[k] for k in ("skipped", "sampled", "kept", "merged", "pruned")} == \
        {"skipped": 3, "sampled": 5, "kept": 1, "merged": 3, "pruned": 1}
    assert analysis.fate_sentence(fate) == ("5 rollouts sampled (3 skipped by the budget, **1 kept**, 3 merged as "
                                            "duplicates, 1 pruned by the rule)")
    assert analysis.rollout_table(rollouts.assign(reward=1.0, advantage=0.0))["status"].tolist() == \
        ["kept", "merged", "merged", "pruned", "merged", "kept"]


def test_heatmap_pages_and_bins_a_long_run_and_the_map_samples_whole_steps():
    matrix = pd.DataFrame({"step": [0, 0, 1, 3, 4, 5, 6], "prompt_id": ["a", "b", "c", "a", "b", "c", "a"],
                           "sampled": [8, 6, 4, 5, 3, 8, 2], "kept": [1] * 7})
    assert analysis.heatmap_prompts(matrix) == ["a", "b", "c"]
    table = analysis.budget_heatmap(matrix, prompts=["a", "c"], bin_steps=3)
    assert table.index.tolist() == ["a", "c"] and table.columns.tolist() == [0, 3, 6]
    assert table.loc["a"].tolist() == [8.0, 5.0, 2.0] and table.loc["c", 0] == 4.0 and np.isnan(table.loc["c", 6])
    steps = pd.DataFrame({"step": range(100), "rollouts_sampled": [512] * 100})
    assert analysis.map_steps(steps.head(4), 8192) == [0, 1, 2, 3]  # they fit: every step
    sample = analysis.map_steps(steps, 8192)
    assert len(sample) == 16 and sample[0] == 0 and sample[-1] == 99 and sample == sorted(sample)
    assert analysis.step_range("3-7", list(range(10))) == (3, 7)
    assert analysis.step_range("7-3", list(range(10))) is None and analysis.step_range("x", [0]) is None


def test_the_heatmap_sends_its_counts_as_float32_with_gaps_and_hover_intact():
    rng = np.random.default_rng(0)
    table = pd.DataFrame(rng.integers(0, 33, (100, 200)).astype(float), index=[f"p{i}" for i in range(100)],
                         columns=range(0, 800, 4))
    table.iloc[::3, ::2] = np.nan  # prompts not drawn in those columns
    figure = charts.budget_heatmap(table, kept=table // 2, revision="r", bin_steps=4)
    spec = json.loads(pio.to_json(figure, validate=False))["data"][0]
    assert spec["z"]["dtype"] == spec["customdata"]["dtype"] == "f4"  # typed arrays: half of float64's bytes
    # the counts exact, the gaps still NaN
    np.testing.assert_array_equal(np.reshape(_values(spec["z"]), table.shape), table.to_numpy())
    assert len(pio.to_json(figure, validate=False)) < 300_000  # was 495 kB with float64 arrays


def test_pages_open_on_the_fastrl_run_and_text_from_data_is_literal():
    runs = pd.DataFrame({"run_id": ["grpo-new", "cppo", "fastrl-old", "fastrl-live"],
                         "pruner": ["none", "cppo", "fastrl", "fastrl"], "budget": ["fixed"] * 4})
    assert analysis.default_run(runs, ["running", "finished", "finished", "running"]) == "fastrl-live"
    assert analysis.default_run(runs, ["running", "finished", "finished", "finished"]) == "fastrl-old"
    assert analysis.default_run(runs.iloc[:2], ["running", "finished"]) == "cppo"
    assert analysis.default_run(runs.iloc[:1], ["finished"]) == "grpo-new"
    assert analysis.literal("nosuchrun") == "`nosuchrun`"
    assert analysis.literal("![t](http://host/track.png)") == "`??t??http?//host/track.png?`"
    assert analysis.literal("`x` :red[y] $z$ <b>") == "`?x? ?red?y? ?z? ?b?`"


TRACKER = "![t](http://127.0.0.1:9/track.png)"  # a dataset's question holding a Markdown image


def merged_step(step: int, method: str, question: str = f"Find x. {TRACKER}") -> "store.StepRecord":
    """Prompt p0: 6 of plain GRPO's 8 rollouts sampled (FastRL's budget skipped 2), answers A A B C C C: A's copy
    merged into its kept first, C's two copies merged into a first the rule pruned (the pruner gives them its reason,
    LOW_ADVANTAGE); p1: 8 distinct answers, all kept. Tokens with log-probs; the question holds TRACKER."""
    png = prompt_png(1)
    texts = ["A", "A", "B", "C", "C", "C"] + [f"D{i}" for i in range(8)]
    rewards = np.array([1.5, 1.5, 0.5, 0.0, 0.0, 0.0] + [float(i % 2) for i in range(8)])
    group = np.array([0] * 6 + [1] * 8)
    advantages = rewards - np.array([rewards[:6].mean()] * 6 + [rewards[6:].mean()] * 8)
    multiplicity = np.array([2, 0, 1, 3, 0, 0] + [1] * 8)
    if method == "grpo":
        keep = multiplicity > 0
        reasons = ["KEPT", "DUPLICATE", "KEPT", "KEPT", "DUPLICATE", "DUPLICATE"] + ["KEPT"] * 8
    else:
        keep = np.array([True, False, False, False, False, False] + [True] * 8)
        reasons = ["KEPT", "DUPLICATE", "LOW_ADVANTAGE", "LOW_ADVANTAGE", "LOW_ADVANTAGE", "LOW_ADVANTAGE"] + \
            ["KEPT"] * 8
    ids = np.array([[ord(t[0]), 2 + i % 3] for i, t in enumerate(texts)])
    return store.StepRecord(
        step=step, prompt_ids=["p0", "p1"], questions=[question, "How many sides?"], answers=["3", "4"],
        image_refs=[store.image_key(png)] * 2, images={store.image_key(png): png}, group_index=group,
        completions=texts, lengths=np.full(14, 2), rewards=rewards, advantages=advantages, keep_mask=keep,
        reasons=reasons, scores=np.abs(advantages), weights=keep.astype(float), sketches=np.eye(14, 8) + step,
        accuracy_rewards=(rewards > 1).astype(float).tolist(), seconds={"generate": 1.0}, wall_time=step + 1.0,
        multiplicity=multiplicity, nominal_per_prompt=8, token_ids=ids, token_mask=np.ones_like(ids, bool),
        token_logprobs=-np.ones(ids.shape) / 4, decode_token=chr)


@pytest.fixture()
def merged(tmp_path) -> tuple[Path, dict[str, str]]:
    """A FastRL run, then a newer plain-GRPO run (bench names, seed 0), three steps each of `merged_step`."""
    run_ids = {}
    for method in ("fastrl", "grpo"):
        with store.RunWriter(tmp_path, name=core_metrics.bench_run_name(method, 0),
                             config={"rollouts_per_prompt": 8, "seed": 0}, model="m", dataset="d", objective="grpo",
                             pruner="fastrl" if method == "fastrl" else "none",
                             budget="adaptive" if method == "fastrl" else "fixed") as writer:
            for step in range(3):
                store.step_rows(merged_step(step, method)).write_to(writer)
            run_ids[method] = writer.run_id
        time.sleep(1.1)  # GRPO is the newer run
    return tmp_path, run_ids


def test_merged_copies_are_their_own_part_in_the_group_charts(monkeypatch, merged):
    """Rollouts and Demo draw the four parts (kept, merged, pruned, skipped by the budget), never merged as pruned."""
    store_dir, run_ids = merged
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_ids["fastrl"], step="2", prompt="p0")
    assert ("6 rollouts sampled (2 skipped by the budget, **1 kept**, 3 merged as duplicates, 2 pruned by the rule)"
            in texts(at))
    for page, key in ((at, "group_bars"), (open_page(monkeypatch, store_dir, "demo"), "demo_group")):
        chart = next(s for s in plotly_specs(page) if s["layout"].get("height") == 300)
        points = {t["name"]: _values(t["x"]) for t in chart["data"] if t.get("mode", "").startswith("markers")}
        assert points == {"kept (enter the passes)": [0], "merged as duplicates (every method)": [1, 4, 5],
                          "pruned by the method's rule": [2, 3], "skipped by the budget": [6, 7]}, key
    table = at.dataframe[0].value
    assert sorted(table["status"]) == ["kept", "merged", "merged", "merged", "pruned", "pruned"]
    assert set(table.loc[table["status"] == "merged", "reason"]) == {"duplicate"}  # copies of a pruned answer too
    assert sorted(table["multiplicity"]) == [0, 0, 0, 1, 2, 3]


def test_pages_open_on_the_fastrl_run_and_keep_it_in_the_url(monkeypatch, merged):
    store_dir, run_ids = merged
    for page in ("budget", "rollouts", "embeddings"):
        at = open_page(monkeypatch, store_dir, page)  # GRPO is the newer run
        assert at.selectbox(key="picker_run").value == run_ids["fastrl"], page
        assert at.query_params["run"] == run_ids["fastrl"], page
    at = open_page(monkeypatch, store_dir, "embeddings", run=run_ids["fastrl"], steps="0-1")
    assert at.select_slider(key="map_steps").value == (0, 1) and at.query_params["steps"] == "0-1"
    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"], prompt="p1")
    assert at.selectbox(key="timeline_prompt").value == "p1"


def test_text_from_the_data_or_a_link_is_shown_as_text(monkeypatch, merged):
    store_dir, run_ids = merged
    for page in ("rollouts", "demo"):
        at = open_page(monkeypatch, store_dir, page, run=run_ids["fastrl"], step="1", prompt="p0")
        markdown = "\n".join(m.value for m in at.markdown)
        assert "](" not in markdown and "![" not in markdown, page
        assert f"Find x. {TRACKER}" in [t.value for t in at.text], page
    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"], prompt="p0")
    assert f"Find x. {TRACKER}" in [t.value for t in at.text]
    at = open_page(monkeypatch, store_dir, "rollouts", run="[x](http://127.0.0.1:9/x) ![i](http://127.0.0.1:9/i)",
                   step="`1`", prompt="<img src=x>")
    warnings = " ".join(w.value for w in at.warning)
    assert "](" not in warnings and "<img" not in warnings and "`1`" not in warnings
    assert "which is not in this store" in warnings and "prompt `?img src=x?`" in warnings


def test_a_missing_rollouts_file_is_named_on_the_page_that_needs_it(monkeypatch, merged):
    store_dir, run_ids = merged
    store.layout.step_file(store_dir, run_ids["fastrl"], "rollouts", 1).unlink()
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_ids["fastrl"], step="1")
    errors = " ".join(e.value for e in at.error)
    assert f"runs/{run_ids['fastrl']}/rollouts/step_000001.parquet" in errors and "missing" in errors
    assert "does not log rollout text" not in texts(at)
    assert any(f"runs/{run_ids['fastrl']}/rollouts/step_000001.parquet" in w.value for w in at.warning)  # the notice


def test_a_step_moved_to_quarantine_leaves_a_page_already_open(monkeypatch, merged):
    store_dir, run_ids = merged
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_ids["fastrl"], step="1")
    assert at.select_slider(key="rollouts_step").options == ["0", "1", "2"]
    path = f"runs/{run_ids['fastrl']}/rollouts/step_000001.parquet"
    store.quarantine(store_dir, [store.check.Damage(path, "truncated")])
    at.run()
    assert not at.exception
    assert at.select_slider(key="rollouts_step").options == ["0", "2"]


def test_a_junk_images_file_is_named_and_not_replaced_by_another_runs_copy(monkeypatch, merged):
    store_dir, run_ids = merged
    store.layout.step_file(store_dir, run_ids["fastrl"], "images", 0).write_bytes(b"junk" * 100)
    at = open_page(monkeypatch, store_dir, "rollouts", run=run_ids["fastrl"], step="2", prompt="p0")
    assert not at.get("image")  # GRPO's run holds the same picture: not served in its place
    assert f"runs/{run_ids['fastrl']}/images/step_000000.parquet" in texts(at)


def test_a_seed_counts_once_in_methods_across_seeds(monkeypatch, tmp_path, designed):
    import shutil

    store_dir = tmp_path / "store"
    shutil.copytree(designed[0], store_dir)
    time.sleep(1.1)
    again = write_run(store_dir, "fastrl", seed=0).run_id  # the same method and seed, run again
    at = open_page(monkeypatch, store_dir, None)
    table = frame(at, "methods_table").set_index("method")
    assert table.loc["fastrl", "seeds"] == 2 and table.loc["grpo", "seeds"] == 2
    older = designed[1]["fastrl"]
    assert f"{older} (fastrl, seed 0; counted: {again})" in texts(at)


def test_the_map_of_a_long_range_is_a_sample_of_whole_steps_and_says_so(monkeypatch, tmp_path):
    writer = store.RunWriter(tmp_path, name="wide", config={}, model="m", dataset="d", objective="grpo",
                             pruner="fastrl", budget="fixed")
    pngs: dict = {}
    for step in range(20):  # 20 steps x ~500 rollouts: more than the map's 8,192 points
        kwargs = prune(fake_step(step, prompts=64, rollouts_per_prompt=8, sketch_dim=8, dataset_size=64,
                                      pngs=pngs))
        writer.write_step(step, **kwargs)
        ids = [r["rollout_id"] for r in kwargs["rollouts"]]
        writer.set_projection(step, ids, np.random.default_rng(step).normal(size=(len(ids), 2)))  # no UMAP here
    at = open_page(monkeypatch, tmp_path, "embeddings", steps="0-19")
    steps = store.read_steps(tmp_path, writer.run_id)
    mapped = analysis.map_steps(steps, 8192)
    assert f"A sample: every rollout of {len(mapped)} of the 20 steps in the range, evenly spaced" in texts(at)
    shown = int(steps.loc[steps["step"].isin(mapped), "rollouts_sampled"].sum())
    assert 4096 < shown <= 8192 and f"map of {shown} rollouts" in " ".join(s.value for s in at.subheader)
    built, build = [], charts.sketch_map  # the figure is built once per map shown, not once per page run
    monkeypatch.setattr(charts, "sketch_map", lambda *args, **kwargs: built.append(1) or build(*args, **kwargs))
    at.run()
    assert not at.exception and not built and f"map of {shown} rollouts" in " ".join(s.value for s in at.subheader)
    at.radio(key="map_colour").set_value("advantage").run()
    assert not at.exception and len(built) == 1


def test_the_app_hides_the_deploy_button_wherever_it_is_launched_from():
    """`fastrl app` / `fastrl demo` pass the toolbar mode themselves (an installed package has no .streamlit/
    config.toml in reach); `streamlit run` from the checkout reads the same from the config file."""
    import tomllib

    from fastrl_app.launch import streamlit_command

    command = streamlit_command(Path("runs"), port=8501, address="127.0.0.1")
    assert command[command.index("--client.toolbarMode") + 1] == "viewer"
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["client"]["toolbarMode"] == "viewer"


def test_a_config_changed_on_resume_shows_on_the_runs_page_and_the_map_uses_the_pruner_in_force(monkeypatch,
                                                                                                tmp_path):
    writer = store.RunWriter(tmp_path, name="changed", config={"pruner": "fastrl", "lr": 2e-4, "steps": 8},
                             model="embedded", dataset="synthetic", objective="grpo", pruner="fastrl",
                             budget="adaptive", code_version="test")
    pngs: dict = {}
    for step in range(4):
        writer.write_step(step, **fake_step(step, prompts=4, rollouts_per_prompt=4, sketch_dim=8, pngs=pngs))
    writer.close()  # stopped; resumed with --allow-change pruner,lr: plain GRPO from step 4, no sketches
    resumed = store.RunWriter.resume(tmp_path, writer.run_id, from_step=4)
    resumed.record_config(4, {"pruner": "none", "lr": 1e-3, "steps": 8},
                          {"pruner": ("fastrl", "none"), "lr": (2e-4, 1e-3)})
    for step in range(4, 8):
        kwargs = fake_step(step, prompts=4, rollouts_per_prompt=4, sketch_dim=8, pngs=pngs)
        for row in kwargs["rollouts"]:
            row["sketch"] = None
        resumed.write_step(step, **kwargs)
    resumed.finish()
    runs = store.read_runs(tmp_path)
    assert runs.loc[0, "pruner"] == "none"  # the runs row says what is in force now ...
    assert analysis.config_in_force(runs.iloc[0], 3)["pruner"] == "fastrl"  # ... and the history what was before
    assert analysis.config_in_force(runs.iloc[0], 4) == {"pruner": "none", "lr": 1e-3, "steps": 8}

    at = open_page(monkeypatch, tmp_path, None, view="All runs")
    table = next(d.value for d in at.dataframe if "before" in d.value.columns)
    assert table.to_dict("records") == [
        {"run": writer.run_id, "from step": 4, "key": "pruner", "before": '"fastrl"', "after": '"none"'},
        {"run": writer.run_id, "from step": 4, "key": "lr", "before": "0.0002", "after": "0.001"}]
    assert "Config changes on resume" in [s.value for s in at.subheader]
    at = open_page(monkeypatch, tmp_path, "embeddings", run=writer.run_id)
    assert 'changed on resume: pruner `fastrl` → `none` from step 4' in texts(at)
    at.select_slider(key="map_steps").set_value((4, 7)).run()  # the steps after the change have no sketches
    (info,) = [i.value for i in at.info]
    assert "(pruner `none`)" in info and "fastrl" not in info  # the pruner in force there, not the first one


def test_a_finished_runs_tables_are_read_once_and_a_new_evaluation_is_read_at_once(tmp_path, monkeypatch):
    """The pages' run list and evaluations are keyed on the store's state (`cached.run_mark`), not on a clock: a
    finished run is not re-read when a page comes back to it after seconds, and a new evaluation shows at the next
    rerun (with a 2-3 s time-to-live they were re-read on every visit, and a new one waited up to 3 s)."""
    from fastrl_app import cached

    writer = write_run(tmp_path, "grpo", finish=False)
    monkeypatch.setenv("FASTRL_STORE", str(tmp_path))
    reads = {"read_runs": 0, "read_evals": 0}

    def counted(name):
        read = getattr(store, name)

        def reader(*args, **kwargs):
            reads[name] += 1
            return read(*args, **kwargs)
        return reader

    for name in reads:
        monkeypatch.setattr(store, name, counted(name))
    cached.st.cache_data.clear()
    run_id = writer.run_id
    assert cached.evals([run_id]).empty and len(cached.runs(totals=True)) == 1
    writer.write_eval(3, "test", 0.5, 256, wall_time=1.0)
    assert cached.evals([run_id])["accuracy"].tolist() == [0.5]  # at once, not after a time-to-live
    writer.finish()
    assert cached.runs(totals=True)["status"].tolist() == ["finished"] and len(cached.evals([run_id])) == 1
    before = dict(reads)
    time.sleep(3.5)  # past the time-to-live the caches had
    assert cached.evals([run_id])["accuracy"].tolist() == [0.5] and len(cached.runs(totals=True)) == 1
    assert reads == before
