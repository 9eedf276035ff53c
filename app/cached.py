"""Cached readers for the pages: thin wrappers around the store's `read_*` functions (the app never writes).

Where the store lives: `--store DIR` after streamlit's `--` (`streamlit run app/main.py -- --store runs`), else the
FASTRL_STORE environment variable, else `./runs`. Cache keys include the run's version (`store.run_version`: its
steps folder changed; the run list and evaluations: `run_mark`, a few stats), never a clock, so a live run's new
step or evaluation is read once, a step moved to quarantine disappears from a page already open, and a finished
run's data is read once per process (docs/notes.md §3: the store's per-step Parquet files are read without taking
any lock, so the trainer is never blocked). Reads of a whole run are incremental in the store (`read_steps`,
`read_groups`, `read_reason_counts` read a new step's file only).
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import streamlit as st

from fastrl_app import analysis, metrics
from fastrl_app.projection import Projection, SketchMap
from fastrl_core import store


def store_dir() -> Path:
    """The store directory: `--store` in the script arguments, else $FASTRL_STORE, else ./runs."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--store")
    known, _ = parser.parse_known_args(sys.argv[1:])
    return Path(known.store or os.environ.get("FASTRL_STORE") or "runs")


def _key() -> str:
    return str(store_dir().resolve())


def _stat(path: Path) -> tuple[int, int]:
    """(mtime in ns, size) of a file; (0, 0) when it does not exist."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return 0, 0
    return found.st_mtime_ns, found.st_size


def run_mark(run_id: str) -> tuple:
    """What the store holds of a run changes only when this does: its run.json and heartbeat (status, config, sign
    of life), its steps folder (`version`) and its evaluations folder (a new file is renamed into it). Four stats
    and a listing, no read: a cache key that lets a finished run's tables be read once per process and a live run's
    at each change."""
    return _run_mark(_key(), run_id)


def _run_mark(store_key: str, run_id: str) -> tuple:
    run = store.layout.run_dir(store_key, run_id)
    return (_stat(run / "run.json"), _stat(store.layout.heartbeat_file(store_key, run_id)),
            store.run_version(store_key, run_id), _stat(run / "evals"))


def _store_mark() -> tuple:
    """`run_mark` of every run in the store (the store's path resolved once, not once a run)."""
    store_key = _key()
    return tuple((run_id, _run_mark(store_key, run_id)) for run_id in store.layout.list_runs(store_key))


@st.cache_data(max_entries=8, show_spinner=False)
def _runs(store_key: str, totals: bool, mark: tuple) -> pd.DataFrame:
    return store.read_runs(store_key, totals=totals)


def runs(totals: bool = False) -> pd.DataFrame:
    """One row per run with its status (read_runs), newest first, re-read when a run changes (`run_mark`); with
    `totals` its headline metrics too (every run's steps rows: the Runs page), else only its step count (a page about
    one run). Its "state" column is as of that read: pages judge a run's heartbeat against the clock themselves
    (`widgets.status`)."""
    frame = _runs(_key(), totals, _store_mark())
    return frame.sort_values("started", ascending=False, kind="stable").reset_index(drop=True)


def latest_step(run_id: str) -> int | None:
    """The run's last visible step (a directory listing, not cached)."""
    return store.latest_step(_key(), run_id)


def eval_count(run_id: str) -> int:
    """How many evaluation files the run has (a directory listing, not cached)."""
    return len(store.layout.eval_files(_key(), run_id))


def version(run_id: str) -> tuple[int, int]:
    """The cache version of a run's data (`store.run_version`, one stat): it changes when a step appears, is
    re-written, or disappears (moved to quarantine by `fastrl store check --quarantine`), so a page already open
    drops a quarantined step at its next rerun."""
    return store.run_version(_key(), run_id)


def _versions(run_ids: tuple[str, ...]) -> tuple:
    return tuple(version(run_id) for run_id in run_ids)


@st.cache_data(max_entries=64, show_spinner=False)
def _steps(store_key: str, run_ids: tuple[str, ...], versions: tuple) -> pd.DataFrame:
    return store.read_steps(store_key, list(run_ids))


def steps(run_ids: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Steps rows of these runs (read_steps), re-read when any run has a new step."""
    run_ids = tuple(run_ids)
    return _steps(_key(), run_ids, _versions(run_ids))


@st.cache_data(max_entries=64, show_spinner=False)
def _evals(store_key: str, run_ids: tuple[str, ...], marks: tuple) -> pd.DataFrame:
    return store.read_evals(store_key, list(run_ids))


def evals(run_ids: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Evaluation rows of these runs (read_evals), re-read when one of them changes (`run_mark`: an evaluation may
    land between steps)."""
    run_ids = tuple(run_ids)
    return _evals(_key(), run_ids, _marks(run_ids))


def _marks(run_ids: tuple[str, ...]) -> tuple:
    store_key = _key()
    return tuple(_run_mark(store_key, run_id) for run_id in run_ids)


class Comparison(NamedTuple):
    per_run: pd.DataFrame  # metrics.compare_runs rows, one run per method and seed
    summary: pd.DataFrame  # metrics.summarise rows, one per method
    curves: pd.DataFrame  # evaluation curves with run_id and method
    left_out: pd.DataFrame  # run_labels rows of runs left out as a seed's older run, with `counted`


@st.cache_data(max_entries=32, show_spinner=False)
def _comparison(store_key: str, run_ids: tuple[str, ...], marks: tuple, sampled: bool, one_per_seed: bool
                ) -> Comparison:
    runs = store.read_runs(store_key)
    runs = runs[runs["run_id"].isin(run_ids)]
    labels = metrics.run_labels(runs.set_index("run_id", drop=False).reindex(
        [r for r in run_ids if r in set(runs["run_id"])]))  # in the order asked for
    labels, left_out = (metrics.one_run_per_seed(labels, runs.set_index("run_id")["started"]) if one_per_seed
                        else (labels, labels.iloc[:0].assign(counted=[])))
    steps = store.read_steps(store_key, list(run_ids))
    evals = store.read_evals(store_key, list(run_ids))
    split = runs.set_index("run_id")["eval_split"]  # each run's own split ("test" when it has one)
    if sampled:
        split = split.map(store.sampled_split)
    evals = evals[evals["split"] == evals["run_id"].map(split)]
    per_run = metrics.compare_runs(labels, steps, evals)
    summary = metrics.summarise(per_run) if len(per_run) else pd.DataFrame(columns=["method"])
    method = labels.set_index("run_id")["method"]
    curves = [metrics.eval_curve(steps[steps["run_id"] == r], evals[evals["run_id"] == r]).assign(
        run_id=r, method=method[r]) for r in labels["run_id"]]
    curves = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=[*metrics.CURVE_COLUMNS, "run_id", "method"])
    return Comparison(per_run, summary, curves, left_out)


def comparison(run_ids: list[str] | tuple[str, ...], *, sampled: bool = False, one_per_seed: bool = True
               ) -> Comparison:
    """(per-run figures, per-method summary with intervals, evaluation curves with run_id and method, runs left
    out) of these runs, from `fastrl_app.metrics` (the bench's definitions), one run per method and seed (the
    newest: `metrics.one_run_per_seed`; every run with `one_per_seed=False`, to set chosen runs side by side), on
    each run's greedy eval split or, with `sampled`, its mean@k split
    ("<split>-sampled", runs with eval_samples); re-read when one of the runs changes (`run_mark`)."""
    run_ids = tuple(run_ids)
    return _comparison(_key(), run_ids, _marks(run_ids), sampled, one_per_seed)


def has_sampled(run_ids: list[str] | tuple[str, ...]) -> bool:
    """Whether any of these runs recorded mean@k evaluations (eval_samples >= 1)."""
    frame = evals(run_ids)
    return bool(len(frame)) and bool(frame["split"].str.endswith(store.SAMPLED_SUFFIX).any())


@st.cache_data(max_entries=256, show_spinner=False)
def _groups(store_key: str, run_id: str, step: int | None, version: tuple) -> pd.DataFrame:
    return store.read_groups(store_key, run_id, step=step)


def groups(run_id: str, step: int | None = None) -> pd.DataFrame:
    """Group rows of one step, or of every step when `step` is None (read_groups)."""
    return _groups(_key(), run_id, step, version(run_id))


@st.cache_data(max_entries=64, show_spinner=False)
def _budget_matrix(store_key: str, run_id: str, version: tuple) -> pd.DataFrame:
    return store.read_budget_matrix(store_key, run_id)


def budget_matrix(run_id: str) -> pd.DataFrame:
    """Rollouts sampled and kept per (step, prompt_id) (read_budget_matrix)."""
    return _budget_matrix(_key(), run_id, version(run_id))


@st.cache_data(max_entries=256, show_spinner=False)
def _rollouts(store_key: str, run_id: str, step: int, prompt_id: str | None, version: tuple) -> pd.DataFrame:
    return store.read_rollouts(store_key, run_id, step=step, prompt_id=prompt_id)


def rollouts(run_id: str, step: int, prompt_id: str | None = None) -> pd.DataFrame:
    """Every rollout of one step (or of one prompt's group in it), all columns but the sketch and the tokens; empty
    when the step's rollouts file does not read (`damaged` says why) or the run logs no rollouts."""
    return _rollouts(_key(), run_id, int(step), prompt_id, version(run_id))


@st.cache_data(max_entries=64, show_spinner=False)
def _rollouts_with_parts(store_key: str, run_id: str, step: int, version: tuple) -> pd.DataFrame:
    frame = _rollouts(store_key, run_id, step, None, version)
    return frame.assign(multiplicity=analysis.multiplicity(frame), status=analysis.fates(frame))


def rollouts_with_parts(run_id: str, step: int) -> pd.DataFrame:
    """`rollouts` of a whole step with each row's `multiplicity` and `status` (analysis): worked out once a step,
    not on every change of the Rollouts page's prompt group or filters."""
    return _rollouts_with_parts(_key(), run_id, int(step), version(run_id))


def damaged(run_id: str, step: int, table: str) -> str | None:
    """Why the step's file of `table` did not read ("missing", or the reader's error), when a read skipped it; its
    path relative to the store is `damaged_path`."""
    return store.damaged_files(_key()).get(damaged_path(run_id, step, table))


def damaged_path(run_id: str, step: int, table: str) -> str:
    return os.path.relpath(store.layout.step_file(Path(_key()), run_id, table, int(step)), _key())


@st.cache_data(max_entries=32, show_spinner=False)
def _reason_counts(store_key: str, run_id: str, version: tuple) -> pd.DataFrame:
    return store.read_reason_counts(store_key, run_id)


def reason_counts(run_id: str) -> pd.DataFrame:
    """Rollouts left out per step and reason (read_reason_counts: each step's file read once per process)."""
    return _reason_counts(_key(), run_id, version(run_id))


@st.cache_data(max_entries=1024, show_spinner=False)
def _tokens(store_key: str, run_id: str, step: int, rollout_id: str, version: tuple
            ) -> list[tuple[str, float]] | None:
    return store.read_tokens(store_key, run_id, step, rollout_id)


def tokens(run_id: str, step: int, rollout_id: str) -> list[tuple[str, float]] | None:
    """The rollout's completion tokens with their sampling log-probs, or None where the store has none (read_tokens:
    one row group of the step's file, not the step); `store.DamagedFile` naming the file when it does not read."""
    return _tokens(_key(), run_id, int(step), rollout_id, version(run_id))


@st.cache_data(max_entries=1024, show_spinner=False)
def _question(store_key: str, run_id: str, step: int, prompt_id: str, version: tuple) -> str | None:
    frame = store.read_rollouts(store_key, run_id, step=step, prompt_id=prompt_id, columns=["question"], limit=1)
    return None if frame.empty else frame["question"].iloc[0]


def question(run_id: str, step: int, prompt_id: str) -> str | None:
    """The question of one prompt, from one step that drew it (one file, never a scan of the run); None when that
    step logged no rollouts."""
    return _question(_key(), run_id, int(step), prompt_id, version(run_id))


@st.cache_data(max_entries=16, show_spinner=False)
def _sketches(store_key: str, run_id: str, steps: tuple[int, ...], limit: int | None, version: tuple
              ) -> tuple[pd.DataFrame, np.ndarray]:
    return store.read_sketches(store_key, run_id, steps=list(steps), limit=limit)


def sketches(run_id: str, steps: list[int] | tuple[int, ...], limit: int | None = None
             ) -> tuple[pd.DataFrame, np.ndarray]:
    """(meta rows, (n, D) sketches) of the rollouts of `steps` that have a sketch (read_sketches)."""
    return _sketches(_key(), run_id, tuple(int(s) for s in steps), limit, version(run_id))


@st.cache_data(max_entries=1024, show_spinner=False)
def _image_bytes(store_key: str, run_id: str, image_ref: str) -> bytes:
    return store.read_image(store_key, run_id, image_ref)


def image(run_id: str, image_ref: str | None) -> tuple[bytes | None, str | None]:
    """(PNG bytes of a prompt image of the run, None) or (None, why not: no image, none stored, or the images file
    that does not read, named); an image is read from its own run's files only."""
    if not image_ref:
        return None, "this prompt has no image"
    try:
        return _image_bytes(_key(), run_id, image_ref), None
    except store.DamagedFile as error:
        return None, f"its run's images file does not read: {error}"
    except (FileNotFoundError, ValueError) as error:
        return None, str(error)


def image_data_url(run_id: str, image_ref: str | None) -> str | None:
    """A base64 data URL of the image, for st.column_config.ImageColumn (docs/notes.md §4: no local paths)."""
    png, _ = image(run_id, image_ref)
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode()


@st.cache_resource(show_spinner=False)
def _sketch_map() -> SketchMap:
    return SketchMap()


def sketch_map() -> SketchMap:
    """The process-wide background UMAP service (one fitted map per run)."""
    return _sketch_map()


def project(run_id: str, meta: pd.DataFrame, matrix: np.ndarray) -> Projection:
    """2-D coordinates of the sketches: the trainer's own projection when every row has one, else the app's
    background UMAP (PCA until it is ready)."""
    if len(meta) and meta["proj_x"].notna().all() and meta["proj_y"].notna().all():
        xy = meta[["proj_x", "proj_y"]].to_numpy(dtype=np.float64)
        return Projection(xy, "stored", 0, "Map coordinates computed by the trainer and stored with the run.")
    ids = list(zip(meta["step"].tolist(), meta["rollout_id"].tolist()))
    return sketch_map().project((_key(), run_id), ids, matrix)


def damage_notice() -> None:
    """A warning naming the damaged store files the readers skipped ("1 damaged steps file skipped: ..."), if any;
    `fastrl store check --quarantine` moves them aside."""
    damaged = store.damaged_files(_key())
    if not damaged:
        return
    by_kind: dict[str, list[str]] = {}
    for path in damaged:
        parts = Path(path).parts
        folders = (*store.layout.TABLE_DIRS, store.summary.FOLDER)
        kind = parts[-2] if len(parts) >= 2 and parts[-2] in folders else Path(path).name
        by_kind.setdefault(kind, []).append(path)
    lines = [f"{len(paths)} damaged {kind} file{'s' if len(paths) > 1 else ''} skipped: {', '.join(paths[:3])}"
             + (" ..." if len(paths) > 3 else "") for kind, paths in by_kind.items()]
    st.warning("  \n".join(lines) + "  \n`fastrl store check <store> --quarantine` moves them aside.",
               icon=":material/warning:")
