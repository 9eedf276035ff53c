"""Pieces of page furniture shared by the pages: the run picker, live refresh, and the empty-store notice."""

from __future__ import annotations

import json
import re
import time

import pandas as pd
import streamlit as st

from fastrl_app import analysis, cached
from fastrl_core.resume import resume_command

LIVE_EVERY = "2s"  # how often a page checks whether a live run changed
IDLE_EVERY = "10s"  # how often the demo checks for new runs while nothing trains
REST_PER_DRAW = 2.0  # a live page rests at least this many times its last drawing time between redraws
STATUS_ICON = {"running": ":green[:material/play_circle:]", "finished": ":material/check_circle:",
               "failed": ":red[:material/error:]", "stopped": ":material/stop_circle:",
               "no heartbeat": ":orange[:material/warning:]"}  # markdown only (no emoji font needed)


def now() -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC")


def status(run: pd.Series) -> str:
    return analysis.run_status(run, now())


def is_live(run: pd.Series) -> bool:
    return status(run) == "running"


def stop() -> None:
    """End the page here (st.stop), after naming the damaged store files its reads skipped (cached.damage_notice,
    which app/main.py draws after a page that runs to its end)."""
    cached.damage_notice()
    st.stop()


def wait_for_runs() -> None:
    """Tell the user the store is empty and rerun the app as soon as a run appears."""
    st.info(f"No runs in the store `{cached.store_dir()}` yet. Start one with "
            "`fastrl train store_dir=...` or `fastrl demo`; this page updates by itself.")

    redraw_on_change("empty store", None, LIVE_EVERY)  # a run appearing changes the mark


def store_mark(run_ids: list[str] | None) -> tuple:
    """What a page about `run_ids` (None: every run in the store) shows changes only when this does: each run's
    state, its steps folder (`cached.version`: one stat) and its evaluation files. A few stats a run and the run
    list (`cached.runs`, re-read only when a run's files change), never a table read."""
    runs = cached.runs()
    if run_ids is not None:
        runs = runs[runs["run_id"].isin(run_ids)]
    return tuple((run["run_id"], status(run), cached.version(run["run_id"]), cached.eval_count(run["run_id"]))
                 for _, run in runs.iterrows())


def redraw_on_change(name: str, run_ids: list[str] | None, every: str | None) -> None:
    """Rerun the page when what it shows changes (`store_mark`), checked every `every` (None: never) by a small
    fragment that draws nothing. Call it before the page reads its data: a step written while the page draws then
    still triggers the next redraw. Redrawing the page on a timer instead cost the dashboard 1.0-1.6 s of every 2 s
    on the budget page while a run trained beside it on 2 cores (2026-12-07), a core taken from the training; now
    the page runs once per new step or evaluation. Steps faster than the page draws (the embedded default's) are
    shown a few at a time: the page rests `REST_PER_DRAW` times its drawing time between redraws, so the dashboard
    takes at most a third of a core from the training beside it."""
    if every is None:
        return
    key = f"_store_mark/{name}"
    st.session_state[key] = store_mark(run_ids)

    @st.fragment(run_every=every)
    def poll() -> None:
        ended, seconds = st.session_state.get("_page_drawn", (0.0, 0.0))
        if time.monotonic() >= ended + REST_PER_DRAW * seconds and store_mark(run_ids) != st.session_state.get(key):
            st.rerun(scope="app")

    poll()


def page_drawn(started: float) -> None:
    """Record when the page's last full run ended and what it took (`time.monotonic()` seconds; app/main.py)."""
    ended = time.monotonic()
    st.session_state["_page_drawn"] = (ended, ended - started)


def runs_or_wait(*, totals: bool = False) -> pd.DataFrame:
    """Every run in the store (`cached.runs`); on an empty store, say so, wait for one and stop the page here."""
    runs = cached.runs(totals)
    if runs.empty:
        wait_for_runs()
        stop()
    return runs


def run_with_steps(empty_message: str, *, default: str | None = None) -> tuple[pd.Series, pd.DataFrame]:
    """Pick a run (captioned) and read its steps; before the run's first step, say `empty_message` and stop."""
    run = pick_run(runs_or_wait(), default=default)
    run_caption(run)
    steps = cached.steps([run["run_id"]])
    if steps.empty:
        st.info(empty_message)
        stop()
    return run, steps


def pick_run(runs: pd.DataFrame, *, label: str = "Run", param: str = "run", default: str | None = None
             ) -> pd.Series:
    """A sidebar run picker, defaulting to ?run= (deep links; a run that is not in the store is said so), then the
    last choice, then `default`, then the run the dashboard is about (`analysis.default_run`: a FastRL run, live
    first); the choice is written back to the URL, so a link opens the same view."""
    ids = runs["run_id"].tolist()
    linked = st.query_params.get(param)
    wanted = linked or st.session_state.get(f"chosen_{param}")
    if wanted not in ids:
        wanted = default if default in ids else analysis.default_run(runs, [status(r) for _, r in runs.iterrows()])
        if linked:
            st.warning(f"The link asks for run {analysis.literal(linked)}, which is not in this store "
                       f"({analysis.literal(cached.store_dir())}); showing `{wanted}` instead.")
    by_id = runs.set_index("run_id", drop=False)
    chosen = st.sidebar.selectbox(
        label, ids, index=ids.index(wanted), key=f"picker_{param}",
        format_func=lambda rid: f"{rid} · {status(by_id.loc[rid])}")
    st.session_state[f"chosen_{param}"] = chosen
    if st.query_params.get(param) != chosen:
        st.query_params[param] = chosen
    return by_id.loc[chosen]


def query_int(text: str | None) -> int | None:
    """A query parameter's text as an integer: ASCII digits with an optional leading '-' ("--1", "1.5", "²", "" and
    None give None)."""
    return int(text) if text is not None and re.fullmatch(r"-?[0-9]{1,18}", text) else None


def pick_step(step_ids: list[int], run_id: str, *, key: str) -> int:
    """A sidebar step slider defaulting to ?step= (a step the run does not have, or text that is no step number, is
    said so, and the latest shown)."""
    asked = st.query_params.get("step")
    default = step_ids[-1]
    if asked is not None:
        if query_int(asked) in step_ids:
            default = query_int(asked)
        else:
            st.warning(f"The link asks for step {analysis.literal(asked)}, which run `{run_id}` does not have (its "
                       f"steps are {step_ids[0]}–{step_ids[-1]}); showing step {default}.")
    if len(step_ids) == 1:
        st.sidebar.caption(f"Step {step_ids[0]} (the only one so far)")
        return step_ids[0]
    return st.sidebar.select_slider("Step", step_ids, value=default, key=key)


def current(run_id: str) -> pd.Series:
    """The run's row as it is now (status and step count move while it trains)."""
    return cached.runs().set_index("run_id", drop=False).loc[run_id]


def run_caption(run: pd.Series, *, refreshing: bool = False) -> None:
    """One line under the page title: what this run is and whether it is still training."""
    state = status(run)
    steps = int(run["steps"]) if pd.notna(run["steps"]) else 0
    text = (f"{STATUS_ICON.get(state, '')} **{run['run_id']}** · {state} · {analysis.plural(steps, 'step')} · "
            + " · ".join(f"{name} {analysis.literal(run[key])}" for name, key in (
                ("objective", "objective"), ("pruner", "pruner"), ("budget", "budget"), ("model", "model"),
                ("data", "dataset"))))
    changes = analysis.config_changes(pd.DataFrame([run]))
    if len(changes):
        text += " · changed on resume: " + ", ".join(
            f"{c['key']} {analysis.literal(json.loads(c['before']))} → {analysis.literal(json.loads(c['after']))} "
            f"from step {c['from step']}"
            for _, c in changes.iterrows())
    resume = f"`{resume_command(cached.store_dir(), run['run_id'])}` continues it"
    if state == "running" and refreshing:
        text += f" · this page redraws at each new step (checked every {LIVE_EVERY})"
    elif state == "no heartbeat":
        text += f" · its trainer stopped without a word (killed?): {resume}"
    st.caption(text)
    error = run.get("error")
    if state in ("failed", "stopped") and isinstance(error, str) and error:
        st.text(f"{state}: {error}")  # an error's text may quote data: shown as text
        if state == "stopped":
            st.caption(resume)


ACCURACY = {"greedy": "greedy test accuracy", "sampled (mean@k)": "sampled test accuracy (mean@k, training T)"}


def accuracy_choice(run_ids: list[str], *, key: str) -> tuple[bool, str]:
    """(sampled?, y-axis title): a greedy / mean@k switch when any of the runs recorded mean@k, else greedy.
    Greedy accuracy can flip on near-ties between evaluations; mean@k follows the expected reward (docs/results.md)."""
    if not cached.has_sampled(run_ids):
        return False, ACCURACY["greedy"]
    choice = st.radio("accuracy", list(ACCURACY), horizontal=True, key=key,
                      help="Greedy decoding, or the mean accuracy of k completions per problem sampled at the "
                           "training temperature (eval_samples = k). Greedy flips on near-ties; mean@k is smooth.")
    return choice != "greedy", ACCURACY[choice]


def labelled_text(label: str, text: object) -> None:
    """A bold label, then `text` from the data (a question, an answer) as plain text: never read as Markdown or
    HTML, so a question holding an image link shows the link's text and the browser fetches nothing."""
    st.markdown(f"**{label}**")
    st.text("—" if text is None or (isinstance(text, float) and pd.isna(text)) or text == "" else str(text))


def file_problem(run_id: str, step: int, table: str, what: str) -> bool:
    """When the step's `table` file did not read (cached.damaged), an error naming the file and why, and how to move
    it aside; returns whether it said so. `what`: what the page cannot show without it."""
    problem = cached.damaged(run_id, step, table)
    if problem is None:
        return False
    st.error(f"Step {step}'s {table} file {analysis.literal(cached.damaged_path(run_id, step, table), 120)} does not "
             f"read ({analysis.literal(problem, 120)}), so {what}. `fastrl store check <store> --quarantine` moves "
             "a damaged step aside (the page then drops it).", icon=":material/broken_image:")
    return True


def run_config(run: pd.Series) -> dict:
    """The run's config as recorded in its run.json ({} when none)."""
    config = run.get("config")
    return json.loads(config) if isinstance(config, str) and config else {}


def logs_rollouts(run: pd.Series) -> bool:
    """Whether the run's config records rollouts (log_rollouts, true unless set false)."""
    return run_config(run).get("log_rollouts", True) is not False