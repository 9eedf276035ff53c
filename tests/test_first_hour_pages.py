"""The dashboard in the first hour (issue 53): "kept" is one share on every page, the Runs page shows each table and
chart once, early-run texts say what there is, the final-accuracy words match what each figure averages, and
`/home` and `/runs` open the Runs page. Stores written through RunWriter with test_app_pages' `merged_step`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fastrl_core import store

def _bench_store(root: Path, evals: dict[str, list[int]]) -> dict[str, str]:
    """A FastRL run and its GRPO run as the bench names them (seed 0), three steps each of test_app_pages'
    `merged_step` (FastRL's budget skips 2 of 8, so kept of nominal and kept of sampled differ), evaluated at the
    steps `evals` gives each method; method -> run id."""
    from test_app_pages import merged_step

    from fastrl_app import metrics

    run_ids = {}
    for method in ("fastrl", "grpo"):
        with store.RunWriter(root, name=metrics.bench_run_name(method, 0), config={"rollouts_per_prompt": 8,
                             "seed": 0}, model="m", dataset="d", objective="grpo",
                             pruner="fastrl" if method == "fastrl" else "none",
                             budget="adaptive" if method == "fastrl" else "fixed") as writer:
            for step in range(3):
                store.step_rows(merged_step(step, method, question="Find x.")).write_to(writer)
            for step in evals[method]:
                writer.write_eval(step, "test", 0.3 + 0.1 * step, 16, wall_time=float(step))
            run_ids[method] = writer.run_id
        time.sleep(1.1)  # GRPO is the newer run
    return run_ids


def test_kept_is_one_share_of_the_nominal_rollouts_on_every_page(monkeypatch, tmp_path):
    from test_app_pages import frame, open_page, texts

    run_ids = _bench_store(tmp_path, {"fastrl": [0, 2], "grpo": [0, 2]})
    steps = store.read_steps(tmp_path, run_ids["fastrl"])
    kept, nominal, sampled = (int(steps[c].sum()) for c in ("rollouts_kept", "rollouts_nominal", "rollouts_sampled"))
    share = kept / nominal
    assert f"{share:.0%}" != f"{kept / sampled:.0%}"  # the two definitions tell apart on this store
    runs = {view: open_page(monkeypatch, tmp_path, None, view=view) for view in ("All runs", "Compare runs")}
    assert frame(runs["All runs"], "runs_table").set_index("run").loc[run_ids["fastrl"], "kept"] == pytest.approx(share)
    methods = open_page(monkeypatch, tmp_path, None)  # the first tab
    assert frame(methods, "methods_table").set_index("method").loc["fastrl", "kept"] == f"{share:.0%} (n=1)"
    compared = frame(runs["Compare runs"], "compare_table").set_index("run")
    assert compared.loc[run_ids["fastrl"], "kept"] == f"{100 * share:.0f}%"
    sentence = f"{kept:,} ({share:.0%}) kept for the passes"
    assert sentence in texts(open_page(monkeypatch, tmp_path, "budget", run=run_ids["fastrl"]))
    assert sentence in texts(open_page(monkeypatch, tmp_path, "demo", run=run_ids["fastrl"]))
    from fastrl_core.run_loop import _nominal  # the console's progress bar: kept of the same nominal rollouts

    assert [row["rollouts_kept"] / _nominal(row) for row in steps.to_dict("records")] == pytest.approx(
        (steps["rollouts_kept"] / steps["rollouts_nominal"]).tolist())
    assert _nominal({"rollouts_nominal": float("nan"), "rollouts_sampled": 64}) == 64  # a store before the split


def test_the_runs_page_shows_each_table_and_the_phase_chart_once(monkeypatch, tmp_path):
    from test_app_pages import open_page

    _bench_store(tmp_path, {"fastrl": [0, 2], "grpo": [0, 2]})
    tabs = ["Methods across seeds", "All runs", "Where rollouts went", "Compare runs"]  # app/views/runs.py's TABS
    pages = {view: open_page(monkeypatch, tmp_path, None, view=view) for view in tabs}
    tables = [sorted(d.value.columns) for at in pages.values() for d in at.dataframe]
    assert len(tables) == len({tuple(t) for t in tables}) == 3  # runs, methods, each run against its GRPO run
    phase_charts = [s for at in pages.values() for s in (json.loads(e.proto.spec) for e in at.get("plotly_chart"))
                    if s["layout"].get("xaxis", {}).get("title", {}).get("text") == "seconds per step"]
    assert len(phase_charts) == 1
    columns = json.loads(next(d for d in pages["All runs"].dataframe if "status" in d.value.columns).proto.columns)
    assert "width" not in columns.get("run", {})  # sized to the ids: not cut off before their timestamp


def test_early_in_a_run_the_texts_say_what_there_is(monkeypatch, tmp_path):
    from test_app_pages import open_page, plotly_specs, texts

    _bench_store(tmp_path, {"fastrl": [0], "grpo": [0]})  # only the warm start's evaluation yet
    shown = texts(open_page(monkeypatch, tmp_path, None))
    assert "last 0 evaluations" not in shown and "first 0.0 s" not in shown
    assert "Final accuracy: the warm start's accuracy (step 0): no run has an evaluation after it yet" in shown
    assert "AUC: mean accuracy over the training seconds of the shortest run (none has trained yet)" in shown
    budget = open_page(monkeypatch, tmp_path, "budget")
    assert "(3 steps × prompts × n)" in texts(budget) and "skipped the no pass" not in texts(budget)
    budget = open_page(monkeypatch, tmp_path, "budget", view="Group sizes")
    per_prompt = next(s for s in plotly_specs(budget) if s["layout"]["yaxis"]["title"]["text"] == "rollouts per prompt")
    assert per_prompt["data"][-1]["mode"] == "lines"  # three steps: a line


def test_the_final_accuracy_words_match_the_evaluations_each_figure_averages(monkeypatch, tmp_path):
    from test_app_pages import open_page, texts

    from fastrl_app import analysis

    _bench_store(tmp_path, {"fastrl": [0, 1, 2], "grpo": [0, 2]})  # FastRL's final: a mean of 2, GRPO's: of 1
    words = "the mean of the last 1–2 evaluations after the warm start (each run's own: fewer while a run has fewer)"
    assert words in texts(open_page(monkeypatch, tmp_path, "demo"))
    assert words in texts(open_page(monkeypatch, tmp_path, None))
    assert analysis.final_accuracy_words([3, 3]) == "the mean of the last 3 evaluations after the warm start"
    assert analysis.final_accuracy_words([1]) == "the mean of the last 1 evaluation after the warm start"
    assert analysis.final_accuracy_words([0, 2]).endswith(", or the warm start's accuracy for a run with none after "
                                                          "it yet")


def test_home_and_runs_open_the_runs_page(monkeypatch, tmp_path):
    """`/home` and `/runs` name a registered page (Streamlit serves the default page at "" whatever its url_path;
    a direct visit resolves the page whose url_pathname equals the address: PagesManager._resolve_page_script)."""
    from streamlit.runtime.pages_manager import PagesManager
    from test_app_pages import MAIN, open_page

    _bench_store(tmp_path, {"fastrl": [0], "grpo": [0]})
    pages = open_page(monkeypatch, tmp_path, None)._registered_pages
    for address in ("home", "runs"):
        manager = PagesManager(MAIN)
        manager.set_script_intent("", address)  # a browser opening /<address>
        found = manager.set_pages_and_resolve(pages, fallback_page_hash="")
        assert found is not None and Path(found["script_path"]).name == "runs.py", address
