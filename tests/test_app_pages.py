"""The dashboard: hand-computed summaries, the PCA / background-UMAP map, and every page under AppTest.

Every page is rendered on a store made by two real short training runs (`python -m fastrl_core.cli train`, a
FastRL run and a plain-GRPO baseline) and checked against what the store's readers return. Exact figures (time
to target, speed-up) are checked on a second store written through RunWriter, whose evaluations are placed so
the answer is known by hand; its rows are the store's synthetic steps with a real keep rule applied (zero
advantage -> ZERO_ADVANTAGE, beyond the top-4 |A| -> REDUNDANT).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from streamlit.testing.v1 import AppTest

import app
from app import analysis
from app.projection import MIN_UMAP_POINTS, SketchMap, pca_2d
from fastrl_core import store
from fastrl_core.store.synthetic import synthetic_step

MAIN = str(Path(app.__file__).parent / "main.py")
REPO = Path(__file__).resolve().parent.parent
# A short real run: 6 steps of 8 prompts x 6 rollouts on the synthetic task, evaluated every 3 steps. One
# thread: with 2 threads on 2 shared cores this run took 59 s instead of 7 s.
SHORT_RUN = ["steps=6", "prompts_per_step=8", "rollouts_per_prompt=6", "eval_every=3", "eval_size=32",
             "synthetic_train=256", "synthetic_test=32", "checkpoint_every=0", "threads=1"]
STEPS = 12
RATES = {"grpo": 1.0, "fastrl": 0.5}  # training seconds per step
EVALS = {"grpo": [(0, 0.30), (4, 0.40), (8, 0.50), (11, 0.60)],
         "fastrl": [(0, 0.30), (4, 0.45), (8, 0.62), (11, 0.66)]}
# GRPO's last accuracy 0.60 is reached by GRPO after step 11 ((11 + 1) * 1.0 = 12 s) and by FastRL after step 8
# ((8 + 1) * 0.5 = 4.5 s): speed-up 12 / 4.5 = 2.67.
SPEEDUP = 12.0 / 4.5


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
    kwargs = synthetic_step(step, prompts=8, rollouts_per_prompt=8, sketch_dim=32, dataset_size=24, pngs=pngs)
    kwargs = keep_all(kwargs) if kind == "grpo" else prune(kwargs)
    kwargs["step_row"]["wall_time"] = (step + 1) * RATES[kind]
    return kwargs


def write_run(root: Path, kind: str, *, steps: int = STEPS, finish: bool = True) -> store.RunWriter:
    writer = store.RunWriter(root, name=kind, config={"steps": steps}, model="embedded", dataset="synthetic",
                             objective="grpo", pruner="none" if kind == "grpo" else "fastrl",
                             budget="fixed" if kind == "grpo" else "adaptive", code_version="test")
    pngs: dict = {}
    for step in range(steps):
        writer.write_step(step, **step_kwargs(step, kind, pngs))
    for step, accuracy in EVALS[kind] if finish else []:
        writer.write_eval(step, "test", accuracy, 256, wall_time=(step + 1) * RATES[kind])
    if finish:
        writer.finish()
    return writer


def train_command(store_dir: Path, name: str, *overrides: str) -> list[str]:
    """`fastrl train` on the embedded default (the shipped warm start), FastRL or the plain-GRPO baseline."""
    pruner = ["pruner=none", "budget=fixed"] if name == "grpo" else ["pruner=fastrl", "budget=adaptive"]
    return [sys.executable, "-m", "fastrl_core.cli", "train", str(REPO / "configs" / "embedded.yaml"),
            f"store_dir={store_dir}", f"run_name={name}", *SHORT_RUN, *pruner, *overrides]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A store with two real training runs: FastRL (pruner fastrl, adaptive budget) and GRPO (no pruning)."""
    root = tmp_path_factory.mktemp("trained")
    for name in ("fastrl", "grpo"):
        done = subprocess.run(train_command(root, name), cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    runs = store.read_runs(root)
    return root, {row["name"]: row["run_id"] for _, row in runs.iterrows()}


@pytest.fixture(scope="session")
def designed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """RunWriter store whose evaluations make the time to target and the speed-up known by hand."""
    root = tmp_path_factory.mktemp("designed")
    write_run(root, "grpo")
    time.sleep(1.1)  # run ids carry the second they started
    write_run(root, "fastrl")
    runs = store.read_runs(root)
    return root, {row["name"]: row["run_id"] for _, row in runs.iterrows()}


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


def plotly_specs(at: AppTest) -> list[dict]:
    return [json.loads(element.proto.spec) for element in at.get("plotly_chart")]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


# ----------------------------------------------------------------------------------------------- pure summaries
def test_first_reach_and_time_to_target_by_hand():
    assert analysis.first_reach([0, 10, 20, 30], [0.1, 0.5, 0.4, 0.7], 0.45) == 10.0
    assert analysis.first_reach([0, 10, 20], [0.1, np.nan, 0.3], 0.5) is None
    curves = pd.DataFrame({"run_id": ["a"] * 3 + ["b"] * 3, "step": [0, 1, 2] * 2,
                           "wall_time": [0, 2, 4, 0, 1, 2], "accuracy": [0.2, 0.6, 0.7, 0.2, 0.3, 0.65]})
    reach = analysis.time_to_target(curves, 0.6).set_index("run_id")
    assert reach.loc["a", "seconds"] == 2 and reach.loc["b", "seconds"] == 2 and reach.loc["b", "step"] == 2
    assert analysis.speedup(pd.Series({"a": 8.0, "b": 2.0, "c": np.nan}), "a").tolist()[:2] == [1.0, 4.0]
    with pytest.raises(KeyError, match="baseline run 'z'"):
        analysis.speedup(pd.Series({"a": 1.0}), "z")


def test_accuracy_curves_take_eval_wall_time_or_the_steps_row():
    steps = pd.DataFrame({"run_id": ["a"] * 3, "step": [0, 1, 2], "wall_time": [1.0, 2.0, 3.0],
                          "accuracy": [0.0, 0.5, 1.0]})
    evals = pd.DataFrame({"run_id": ["a", "a"], "step": [0, 2], "split": "test", "accuracy": [0.3, 0.4], "n": 8})
    assert analysis.accuracy_curves(steps, evals, source="eval")["wall_time"].tolist() == [1.0, 3.0]
    evals["wall_time"] = [0.0, np.nan]
    assert analysis.accuracy_curves(steps, evals, source="eval")["wall_time"].tolist() == [0.0, 3.0]
    train = analysis.accuracy_curves(steps, evals, source="train", window=2)
    assert train["accuracy"].tolist() == [0.0, 0.25, 0.75]
    with pytest.raises(ValueError, match="source"):
        analysis.accuracy_curves(steps, evals, source="test")


def test_comparison_headline_by_hand():
    curves = pd.DataFrame({"run_id": ["g", "g", "f", "f"], "step": [0, 9, 0, 3],
                           "wall_time": [0.0, 30.0, 0.0, 10.0], "accuracy": [0.3, 0.6, 0.3, 0.65]})
    headline = analysis.comparison(curves, "f", "g")
    assert headline["target"] == 0.6 and headline["speedup"] == 3.0 and headline["run_accuracy"] == 0.65
    assert analysis.comparison(curves, "f", "missing")["speedup"] is None


def test_reason_counts_and_filters():
    rollouts = pd.DataFrame({"step": [0, 0, 0, 1, 1], "prompt_id": ["a", "a", "b", "a", "b"],
                             "kept": [True, False, False, False, True],
                             "reason": ["KEPT", "ZERO_ADVANTAGE", "REDUNDANT", "ZERO_ADVANTAGE", "KEPT"],
                             "accuracy_reward": [1.0, 0.0, None, 1.0, 0.0]})
    counts = analysis.reason_counts(rollouts)
    assert counts.to_dict("records") == [{"step": 0, "reason": "redundant", "count": 1},
                                         {"step": 0, "reason": "zero advantage", "count": 1},
                                         {"step": 1, "reason": "zero advantage", "count": 1}]
    assert analysis.filter_rollouts(rollouts, prompt_id="a", kept=False).index.tolist() == [1, 3]
    assert analysis.filter_rollouts(rollouts, correct=True).index.tolist() == [0, 3]
    assert analysis.filter_rollouts(rollouts, correct=False, reasons=["REDUNDANT"]).index.tolist() == [2]


def test_pick_informative_group_and_baseline():
    groups = pd.DataFrame({"prompt_id": ["flat", "small", "big", "all"], "reward_std": [0.0, 0.5, 0.4, 0.3],
                           "sampled": [8, 4, 8, 8], "kept": [0, 2, 3, 8]})
    assert analysis.pick_informative_group(groups) == "big"  # partly pruned, mixed rewards, largest
    assert analysis.pick_informative_group(groups.iloc[[0, 3]]) == "flat"  # only one with a pruned rollout
    assert analysis.pick_informative_group(groups.iloc[:0]) is None
    runs = pd.DataFrame({"run_id": ["f", "g1", "g2", "g3"], "pruner": ["fastrl", "none", "none", "none"],
                         "dataset": ["geo", "geo", "geo", "dots"],
                         "started": pd.to_datetime(["2026-01-04", "2026-01-01", "2026-01-02", "2026-01-03"])})
    assert analysis.find_baseline(runs, "f") == "g2"  # newest plain-GRPO run on the same data
    assert analysis.find_baseline(runs.iloc[:1], "f") is None


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
        started = time.monotonic()
        first = service.project("run", ids[:100], x[:100])
        assert time.monotonic() - started < 1.0  # never waits for UMAP
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


def test_runs_page_compares_with_the_hand_computed_speedup(monkeypatch, designed):
    store_dir, run_ids = designed
    at = open_page(monkeypatch, store_dir, None)
    assert at.selectbox(key="compare_baseline").value == run_ids["grpo"]  # the pruner-none run
    assert at.slider(key="target").value == pytest.approx(0.60)  # GRPO's latest eval accuracy
    reach = at.dataframe[1].value.set_index("run")
    assert reach.loc[run_ids["fastrl"], "seconds to target"] == pytest.approx(4.5)
    assert reach.loc[run_ids["grpo"], "seconds to target"] == pytest.approx(12.0)
    assert reach.loc[run_ids["fastrl"], f"speed-up vs {run_ids['grpo']}"] == pytest.approx(SPEEDUP)
    at.slider(key="target").set_value(0.65).run()
    reach = at.dataframe[1].value.set_index("run")
    assert np.isnan(reach.loc[run_ids["grpo"], "seconds to target"])  # GRPO never got there


def test_runs_page_on_real_runs(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, None)
    listed = at.dataframe[0].value.set_index("run")
    runs = store.read_runs(store_dir).set_index("run_id")
    assert set(listed.index) == set(run_ids.values()) and set(listed["status"]) == {"finished"}
    for run_id in run_ids.values():
        assert listed.loc[run_id, "steps"] == runs.loc[run_id, "steps"] == 6
        assert listed.loc[run_id, "best eval accuracy"] == pytest.approx(runs.loc[run_id, "best_accuracy"])
    assert at.selectbox(key="compare_baseline").value == run_ids["grpo"]
    reach = at.dataframe[1].value.set_index("run")
    speedup = reach[f"speed-up vs {run_ids['grpo']}"]
    expected = reach.loc[run_ids["grpo"], "seconds to target"] / reach["seconds to target"]
    assert np.allclose(speedup, expected, equal_nan=True)
    phases = next(s for s in plotly_specs(at) if any(t.get("orientation") == "h" for t in s["data"]))
    steps = store.read_steps(store_dir, list(run_ids.values()))
    measured = {p for p in store.PHASES if steps[f"time_{p}"].notna().any()}
    assert {t["name"] for t in phases["data"]} == measured


def test_budget_page_draws_the_store_numbers(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "budget", run=run_ids["fastrl"])
    steps = store.read_steps(store_dir, run_ids["fastrl"])
    last = steps.iloc[-1]
    shown = metrics(at)
    assert shown["Latest step"] == "5"
    assert shown["Kept this step"] == f"{last['rollouts_kept']} / {last['rollouts_sampled']}"
    sampled_vs_kept = next(s for s in plotly_specs(at) if any(t.get("name") == "sampled" for t in s["data"]))
    kept_trace = next(t for t in sampled_vs_kept["data"] if t["name"].startswith("kept"))
    assert _values(kept_trace["y"]) == steps["rollouts_kept"].tolist()
    assert sampled_vs_kept["layout"]["uirevision"] == run_ids["fastrl"]  # zoom survives live redraws
    rollouts = store.read_rollouts(store_dir, run_ids["fastrl"])
    pruned = {analysis.reason_label(r) for r in rollouts.loc[~rollouts["kept"], "reason"]}
    reasons = next(s for s in plotly_specs(at) if s["layout"].get("barmode") == "relative")
    assert {t["name"] for t in reasons["data"]} == pruned


def _values(encoded) -> list:
    """Plotly 6+ may encode arrays as {"dtype", "bdata"}; decode either form."""
    if isinstance(encoded, dict):
        import base64

        return np.frombuffer(base64.b64decode(encoded["bdata"]), dtype=np.dtype(encoded["dtype"])).tolist()
    return list(encoded)


def test_budget_page_reads_a_new_step_of_a_live_run(monkeypatch, tmp_path):
    writer = write_run(tmp_path, "fastrl", steps=3, finish=False)
    at = open_page(monkeypatch, tmp_path, "budget")
    assert metrics(at)["Latest step"] == "2" and "refreshes every" in texts(at)
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
    assert f"{len(group)} rollouts sampled, **{n_kept} kept**" in texts(at)
    at.radio(key="rollouts_kept").set_value("no").run()
    assert len(at.dataframe[0].value) == len(group) - n_kept
    assert set(at.dataframe[0].value["status"]) <= {"pruned"}
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
    meta, matrix = store.read_sketches(store_dir, run_ids["fastrl"], steps=range(1, 6))  # the last 5 steps
    assert len(meta) > 0 and matrix.shape[1] > 0
    spec = plotly_specs(at)[0]
    assert sum(len(t["customdata"]) for t in spec["data"]) == len(meta)
    assert {t["name"] for t in spec["data"]} <= {"kept", "pruned"}
    assert spec["layout"]["dragmode"] == "select"
    assert "Select points on the map" in texts(at)
    at.radio(key="map_colour").set_value("advantage").run()
    assert not at.exception


def test_demo_page_tells_the_story_on_real_runs(monkeypatch, trained):
    store_dir, run_ids = trained
    at = open_page(monkeypatch, store_dir, "demo")
    assert at.selectbox(key="picker_run").value == run_ids["fastrl"]
    story = texts(at)
    assert "What pruning does to one group" in story and "Speed and accuracy against GRPO" in story
    assert at.get("image"), "the group's prompt image is shown"
    evals = store.read_evals(store_dir, list(run_ids.values())).groupby("run_id")["accuracy"].last()
    shown = metrics(at)
    assert shown["FastRL accuracy"] == f"{evals[run_ids['fastrl']]:.1%}"
    assert shown["GRPO accuracy"] == f"{evals[run_ids['grpo']]:.1%}"


def test_demo_page_shows_the_hand_computed_speedup(monkeypatch, designed):
    store_dir, run_ids = designed
    shown = metrics(open_page(monkeypatch, store_dir, "demo"))
    assert shown["Speed-up to GRPO's accuracy"] == f"{SPEEDUP:.2f}×"
    assert shown["FastRL accuracy"] == "66.0%" and shown["GRPO accuracy"] == "60.0%"


def test_demo_page_without_a_baseline_says_so(monkeypatch, tmp_path):
    write_run(tmp_path, "fastrl", steps=2)
    at = open_page(monkeypatch, tmp_path, "demo")
    assert "no plain-GRPO run" in texts(at)
