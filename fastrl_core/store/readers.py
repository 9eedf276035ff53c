"""The queries the app and the benchmarks use; they never write.

Each query lists the run's visible steps (those whose steps file exists) and reads explicit Parquet files for
those steps only, with an in-memory DuckDB connection. So a step is all-or-nothing for a reader (its rollouts
and groups files were renamed into place before its steps file), no lock is taken on any file, and an empty
run reads as an empty frame with the right columns instead of DuckDB's "No files found".

A damaged file (truncated, junk, or missing while its step is visible) does not fail a read: when DuckDB fails on a
list of files, each is checked alone, the damaged ones are left out (a damaged steps file hides its step) and
noted, and the rest is read (`fastrl_core.store.damage`). `damaged_files(store_dir)` lists what this process
skipped (the app shows it); `fastrl store check` scans the whole store and can quarantine them.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Sequence

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from fastrl_core.store import damage, layout, schema, summary

_lock = threading.Lock()
_connection: tuple[int, duckdb.DuckDBPyConnection] | None = None


def _cursor() -> duckdb.DuckDBPyConnection:
    """A cursor on this process's shared in-memory connection (connect costs ~10 ms, a cursor ~0)."""
    global _connection
    with _lock:
        if _connection is None or _connection[0] != os.getpid():
            _connection = (os.getpid(), duckdb.connect(config={"preserve_insertion_order": True}))
        return _connection[1].cursor()


def _retry_vanished(read):
    """Re-run a read whose file list went stale (a step being re-written after a resume removes its steps file
    between our listing and DuckDB opening it)."""

    @functools.wraps(read)
    def wrapper(*args, **kwargs):
        for attempt in range(4):
            try:
                return read(*args, **kwargs)
            except duckdb.IOException:
                if attempt == 3:
                    raise

    return wrapper


def _query_df(sql: str, params: dict) -> pd.DataFrame:
    with _cursor() as cursor:
        return cursor.sql(sql, params=params).df()


def _empty(key: list, columns: list, names: Sequence[str] | None = None) -> pd.DataFrame:
    frame = schema.arrow_schema(key, columns).empty_table().to_pandas()
    return frame if names is None else frame[list(names)]


def _run_ids(store_dir: Path, run_ids: Sequence[str] | str) -> list[str]:
    run_ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)
    for run_id in run_ids:
        if not (layout.run_dir(store_dir, run_id) / "run.json").exists():
            raise ValueError(f"no run {run_id!r} in store {store_dir}")
    return run_ids


def _select_steps(store_dir: Path, run_id: str, steps: int | Sequence[int] | None) -> list[int]:
    """Visible steps of a run, restricted to `steps` (one step or several) when given."""
    visible = _run_steps(store_dir, _run_ids(store_dir, run_id)[0])["step"].astype(int).tolist()
    if steps is None:
        return visible
    wanted = {int(steps)} if isinstance(steps, (int, np.integer)) else {int(s) for s in steps}
    return [s for s in visible if s in wanted]


def _files(store_dir: Path, run_id: str, table: str, steps: list[int]) -> list[str]:
    return layout.step_files(store_dir, run_id, table, steps)


def latest_step(store_dir: str | Path, run_id: str) -> int | None:
    """The last visible step of a run, or None before its first step."""
    steps = layout.step_numbers(Path(store_dir), _run_ids(Path(store_dir), run_id)[0], "steps")
    return steps[-1] if steps else None


# (table, run dir) -> (stamps of the files read, their rows)
_table_cache: dict[tuple[str, str], tuple[dict[str, tuple[int, int, int]], pd.DataFrame]] = {}


def _cached_run_table(store_dir: Path, run_id: str, table: str, paths: list[str], read) -> pd.DataFrame:
    """The rows of a per-step `table`'s files `paths` (one step each), read with `read(files)` (a frame with a step
    column, in step order). A file never changes once written (a re-written step is a new file), so each process
    keeps the rows it has read, keyed by each file's (inode, mtime, size): a new step costs its own file only, and
    a step that disappears (quarantined, dropped by a resume) or changes loses its rows and is read again. A cold
    process starts from the run's summary of `table` (`store.summary`, the same rows and stamps on disk)."""
    stamps = _stamps(paths)
    key = (table, str(layout.run_dir(store_dir, run_id).resolve()))
    with _lock:
        cached = _table_cache.get(key)
    if cached is None and table in summary.SOURCES:
        cached = _load_summary(store_dir, run_id, table)
    if cached is None:
        frame, new = None, list(stamps)
    else:
        same = {path for path, stamp in cached[0].items() if stamps.get(path) == stamp}
        frame = cached[1]
        if len(same) < len(cached[0]):
            frame = frame[frame["step"].isin([layout.file_step(path) for path in same])]
        new = [path for path in stamps if path not in same]
    if new or frame is None:
        more = read(new)
        frame = more if frame is None else pd.concat([frame, more], ignore_index=True) if len(more) else frame
        frame = frame.sort_values("step", kind="stable", ignore_index=True)
    with _lock:
        _table_cache[key] = (stamps, frame)
    return frame


def _load_summary(store_dir: Path, run_id: str, table: str):
    """(stamps, rows) of the run's summary of `table` (`store.summary`), or None when it has none or it does not
    read (then noted as damaged: the step files are read instead)."""
    path = str(summary.summary_file(store_dir, run_id, table))
    if damage.known_damaged(store_dir, path):
        return None
    try:
        return summary.load(store_dir, run_id, table)
    except summary.UNREADABLE as error:
        damage.note_damaged(store_dir, path, damage.why(error))
        return None


def whole_run_tables(store_dir: str | Path, run_id: str) -> dict[str, tuple[dict, pd.DataFrame]]:
    """{summary table: (stamps of the step files read, rows)} of every visible step, as the readers gather them
    (incrementally: this process reads only step files it has not read): what `store.summary` files hold."""
    store_dir = Path(store_dir)
    _run_steps(store_dir, run_id)
    read_groups(store_dir, run_id)
    read_reason_counts(store_dir, run_id)
    run = str(layout.run_dir(store_dir, run_id).resolve())
    with _lock:
        return {table: _table_cache[(table, run)] for table in summary.SOURCES}


def _run_steps(store_dir: Path, run_id: str) -> pd.DataFrame:
    """All visible steps rows of one run (an app polling a live run pays for the new steps only)."""
    return _cached_run_table(store_dir, run_id, "steps", layout.table_files(store_dir, run_id, "steps"),
                             lambda files: _read_steps_files(store_dir, files))


def _stamps(paths: list[str]) -> dict[str, tuple[int, int, int]]:
    """(inode, mtime, size) of each file that still exists: a file removed since it was listed (a step being
    re-written, a resumed run dropping steps) is left out."""
    stamps = {}
    for path in paths:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            continue
        stamps[path] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return stamps


def _read_steps_files(store_dir: Path, files: list[str]) -> pd.DataFrame:
    def read(files: list[str]) -> pd.DataFrame:
        if not files:
            return _empty(schema.STEP_KEY, schema.STEPS)
        return _query_df("SELECT * FROM read_parquet($files, union_by_name=true) ORDER BY step", {"files": files})

    return damage.read_tolerant(store_dir, files, read)


@_retry_vanished
def read_steps(store_dir: str | Path, run_ids: Sequence[str] | str) -> pd.DataFrame:
    """Steps rows of one or several runs, ordered by run_id, step (extra numeric keys come as extra columns)."""
    store_dir = Path(store_dir)
    frames = [_run_steps(store_dir, run_id) for run_id in _run_ids(store_dir, run_ids)]
    frames = [f for f in frames if len(f)] or [_empty(schema.STEP_KEY, schema.STEPS)]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].copy()


@_retry_vanished
def read_groups(store_dir: str | Path, run_id: str, *, step: int | Sequence[int] | None = None) -> pd.DataFrame:
    """Group rows (one per prompt per step) of visible steps, all or only `step`, in written order."""
    store_dir = Path(store_dir)
    files = _files(store_dir, run_id, "groups", _select_steps(store_dir, run_id, step))

    def read(files: list[str]) -> pd.DataFrame:
        def query(files: list[str]) -> pd.DataFrame:
            if not files:
                return _empty(schema.STEP_KEY, schema.GROUPS)
            return _query_df("SELECT * EXCLUDE (file_row_number) FROM read_parquet($files, file_row_number=true, "
                             "union_by_name=true) ORDER BY step, file_row_number", {"files": files})

        return damage.read_tolerant(store_dir, files, query)

    if step is not None:
        return read(files)
    return _cached_run_table(store_dir, run_id, "groups", files, read).copy()  # every step: kept per file


def read_budget_matrix(store_dir: str | Path, run_id: str) -> pd.DataFrame:
    """Rollouts sampled and kept per (step, prompt_id), long format, for the budget heatmap."""
    return read_groups(store_dir, run_id)[["step", "prompt_id", "sampled", "kept"]]


@_retry_vanished
def read_reason_counts(store_dir: str | Path, run_id: str) -> pd.DataFrame:
    """Rollouts left out (not kept) per visible step and reason, for a chart of the whole run: columns step, reason
    (as recorded, e.g. DUPLICATE), count; ordered by step, reason. Counted per step file and kept per process like
    the steps rows, so a live run's new step costs its own file only."""
    store_dir = Path(store_dir)
    files = _files(store_dir, run_id, "rollouts", _select_steps(store_dir, run_id, None))

    def query(files: list[str]) -> pd.DataFrame:
        if not files:
            return pd.DataFrame({"step": pd.Series([], dtype="int64"), "reason": pd.Series([], dtype=object),
                                 "count": pd.Series([], dtype="int64")})
        return _query_df("SELECT step, reason, count(*) AS count FROM read_parquet($files) WHERE NOT kept "
                         "GROUP BY step, reason ORDER BY step, reason", {"files": files})

    return _cached_run_table(store_dir, run_id, "reason_counts", files,
                             lambda new: damage.read_tolerant(store_dir, new, query)).copy()


ROLLOUT_COLUMNS = [c.name for c in schema.STEP_KEY + schema.ROLLOUTS]
DEFAULT_ROLLOUT_COLUMNS = [c for c in ROLLOUT_COLUMNS if c not in ("sketch", "token_text", "token_logprob")]


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, (int, np.integer)) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")


def _scan_rollouts(store_dir: Path, run_id: str, steps: list[int], columns: Sequence[str], where: list[str],
                   params: dict, limit: int | None):
    """Rollout columns of `steps` as an Arrow table, in written order: DuckDB keeps the order of the file list
    and of rows in a file when there is no ORDER BY (preserve_insertion_order), so LIMIT can stop early."""
    sql = f"SELECT {', '.join(columns)} FROM read_parquet($rollouts)"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"

    def read(files: list[str]):
        if not files:
            names = set(columns)
            return schema.arrow_schema(schema.STEP_KEY, schema.ROLLOUTS).empty_table().select(
                [c for c in ROLLOUT_COLUMNS if c in names]).select(list(columns))
        with _cursor() as cursor:
            return cursor.sql(sql, params={**params, "rollouts": files}).to_arrow_table()

    return damage.read_tolerant(store_dir, _files(store_dir, run_id, "rollouts", steps), read)


def _with_projection(frame: pd.DataFrame, store_dir: Path, run_id: str) -> pd.DataFrame:
    """Overlay the coordinates stored by set_projection (own files per step) on frame's proj_x / proj_y."""
    if frame.empty or "proj_x" not in frame and "proj_y" not in frame:
        return frame
    steps = sorted(set(layout.step_numbers(store_dir, run_id, "proj")) & set(frame["step"].unique().tolist()))
    if not steps:
        return frame
    def read(files: list[str]) -> pd.DataFrame:
        if not files:
            return pd.DataFrame({"step": pd.Series([], dtype="int64"), "rollout_id": pd.Series([], dtype=str),
                                 "proj_x": pd.Series([], dtype=float), "proj_y": pd.Series([], dtype=float)})
        return _query_df("SELECT step, rollout_id, proj_x, proj_y FROM read_parquet($files)", {"files": files})

    proj = damage.read_tolerant(store_dir, _files(store_dir, run_id, "proj", steps), read)
    stored = frame[["step", "rollout_id"]].merge(proj, on=["step", "rollout_id"], how="left")  # keeps frame order
    for name in ("proj_x", "proj_y"):
        if name in frame:
            frame[name] = np.where(stored[name].notna(), stored[name].to_numpy(), frame[name].to_numpy())
    return frame


@_retry_vanished
def read_rollouts(store_dir: str | Path, run_id: str, *, step: int | Sequence[int] | None = None,
                  prompt_id: str | None = None, kept: bool | None = None, correct: bool | None = None,
                  reason: str | None = None, limit: int | None = None,
                  columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Rollouts of visible steps in written order, filtered by step (one or several), prompt, kept, correct
    (accuracy_reward > 0) and pruning reason; the first `limit` matches. Columns: all but `sketch` unless
    `columns` names them (read_sketches gives the sketch matrix). proj_x/proj_y include set_projection's."""
    store_dir = Path(store_dir)
    columns = list(DEFAULT_ROLLOUT_COLUMNS if columns is None else columns)
    unknown = [c for c in columns if c not in ROLLOUT_COLUMNS]
    if unknown:
        raise ValueError(f"read_rollouts: unknown column {unknown[0]!r}; choose from {ROLLOUT_COLUMNS}")
    _check_limit(limit)
    steps = _select_steps(store_dir, run_id, step)
    if not steps:
        return _empty(schema.STEP_KEY, schema.ROLLOUTS, columns)
    where, params = [], {}
    for name, value in (("prompt_id", prompt_id), ("kept", kept), ("reason", reason)):
        if value is not None:
            where.append(f"{name} = ${name}")
            params[name] = value
    if correct is not None:
        where.append("accuracy_reward > 0" if correct else "coalesce(accuracy_reward, 0) <= 0")
    needs_keys = ("proj_x" in columns or "proj_y" in columns)
    scanned = columns + [k for k in ("step", "rollout_id") if needs_keys and k not in columns]
    frame = _scan_rollouts(store_dir, run_id, steps, scanned, where, params, limit).to_pandas()
    return _with_projection(frame, store_dir, run_id)[columns]


SKETCH_META_COLUMNS = ["step", "rollout_id", "prompt_id", "kept", "reward", "accuracy_reward", "advantage",
                       "reason", "score", "proj_x", "proj_y"]


@_retry_vanished
def read_sketches(store_dir: str | Path, run_id: str, *, steps: int | Sequence[int] | None = None,
                  limit: int | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """Rollouts that have a gradient sketch, in written order (the first `limit`): (meta rows with
    SKETCH_META_COLUMNS, (n, D) float32 sketch matrix), rows aligned."""
    store_dir = Path(store_dir)
    _check_limit(limit)
    selected = _select_steps(store_dir, run_id, steps)
    if not selected:
        return _empty(schema.STEP_KEY, schema.ROLLOUTS, SKETCH_META_COLUMNS), np.zeros((0, 0), np.float32)
    table = _scan_rollouts(store_dir, run_id, selected, SKETCH_META_COLUMNS + ["sketch"], ["sketch IS NOT NULL"],
                           {}, limit)
    sketch = table.column("sketch").combine_chunks()
    n = len(sketch)
    flat = sketch.flatten().to_numpy(zero_copy_only=False) if n else np.zeros(0, np.float32)
    dim = flat.size // n if n else 0
    if dim * n != flat.size:
        raise ValueError(f"run {run_id!r}: sketches of different lengths in steps {selected[0]}..{selected[-1]}")
    meta = _with_projection(table.drop_columns(["sketch"]).to_pandas(), store_dir, run_id)
    return meta, flat.astype(np.float32, copy=False).reshape(n, dim)


def read_tokens(store_dir: str | Path, run_id: str, step: int, rollout_id: str) -> list[tuple[str, float]] | None:
    """One rollout's completion tokens with their sampling log-probs [(text, logprob), ...], or None when the
    store has none for it (written without them). Reads the step's rollout ids, then the tokens of the one row
    group holding the rollout (`layout.ROLLOUT_ROW_GROUP` rows), never the whole step's. Also reads the JSON
    `tokens` column of stores written before 2026-12-07. ValueError for a step that is not visible or a rollout
    it does not have; `damage.DamagedFile` naming the file when the step's rollouts file does not read."""
    store_dir = Path(store_dir)
    if int(step) not in _select_steps(store_dir, run_id, int(step)):
        raise ValueError(f"run {run_id!r} has no step {step}")
    path = str(layout.step_file(store_dir, run_id, "rollouts", int(step)))
    try:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        columns = ["token_text", "token_logprob"] if "token_text" in names else ["tokens"] if "tokens" in names else []
        ids = parquet.read(columns=["rollout_id"]).column(0).to_pylist()
        if rollout_id not in ids:
            raise ValueError(f"step {step} of run {run_id!r} has no rollout {rollout_id!r}")
        if not columns:
            return None
        row, group = ids.index(rollout_id), 0
        while row >= parquet.metadata.row_group(group).num_rows:
            row -= parquet.metadata.row_group(group).num_rows
            group += 1
        values = parquet.read_row_group(group, columns=columns).slice(row, 1).to_pylist()[0]
    except (OSError, pa.ArrowException) as error:
        raise damage.damaged(store_dir, path, error) from None
    if columns == ["tokens"]:
        return None if values["tokens"] is None else [(text, float(lp)) for text, lp in json.loads(values["tokens"])]
    if values["token_text"] is None:
        return None
    return [(text, float(lp)) for text, lp in zip(values["token_text"], values["token_logprob"])]


@_retry_vanished
def read_evals(store_dir: str | Path, run_ids: Sequence[str] | str) -> pd.DataFrame:
    """Evaluation rows of one or several runs, ordered by run_id, step, split."""
    store_dir = Path(store_dir)
    files = [f for run_id in _run_ids(store_dir, run_ids) for f in layout.eval_files(store_dir, run_id)]

    def read(files: list[str]) -> pd.DataFrame:
        if not files:
            return _empty(schema.STEP_KEY, schema.EVALS)
        return _query_df("SELECT * FROM read_parquet($files, union_by_name=true) ORDER BY run_id, step, split",
                         {"files": files})

    return damage.read_tolerant(store_dir, files, read)


@_retry_vanished
def read_image(store_dir: str | Path, run_id: str, image_ref: str) -> bytes:
    """PNG bytes of an image by its key (a rollout's image_ref), from the images files of the run that used it
    (each run stores every image it uses; another run's copy is never served in its place). FileNotFoundError
    when the run has no such image; `damage.DamagedFile` naming the run's images files that do not read, when the
    image is not in the readable ones."""
    layout.check_image_ref(image_ref)
    store_dir = Path(store_dir)
    _run_ids(store_dir, run_id)
    for _ in range(2):  # a second pass after the index dropped a file that a resumed run removed
        path = _image_index(store_dir, run_id, image_ref)
        if path is None:
            break
        try:  # sorted refs in small row groups (writer): the filter reads one row group
            table = pq.read_table(path, columns=["image_ref", "png"], filters=[("image_ref", "==", image_ref)])
        except FileNotFoundError:
            if not damage.step_vanished(path):
                damage.sort_out(store_dir, [path])
            with _lock:
                _images_cache.get((str(store_dir.resolve()), run_id), {}).pop(path, None)
            continue  # a resumed run removed it: look again
        except (OSError, pa.ArrowException) as error:
            raise damage.damaged(store_dir, path, error) from None
        if table.num_rows:
            return table.column(1)[0].as_py()
    unreadable = [path for path in layout.table_files(store_dir, run_id, "images")
                  if damage.known_damaged(store_dir, path)]
    if unreadable:
        raise damage.DamagedFile(
            f"image {image_ref[:12]}… of run {run_id} is in none of its readable images files; "
            + ", ".join(f"{os.path.relpath(p, store_dir)} ({damage.reason(store_dir, p)})" for p in unreadable)
            + " do not read")
    raise FileNotFoundError(f"no image {image_ref} in run {run_id} of store {store_dir}")


# (store, run) -> {images file: (stamp, refs)}
_images_cache: dict[tuple[str, str], dict[str, tuple[tuple[int, int, int], list[str]]]] = {}


def _image_index(store_dir: Path, run_id: str, image_ref: str) -> str | None:
    """The images file of `run_id` holding `image_ref`. Each process keeps the refs of the images files it has
    read, keyed by (inode, mtime, size) like the steps rows, and on a miss reads only new or changed files (an
    images file grows when its step is re-written)."""
    key = (str(store_dir.resolve()), run_id)
    with _lock:
        known = dict(_images_cache.get(key, {}))
    for path, (_, refs) in known.items():
        if image_ref in refs:
            return path
    stamps = _stamps(layout.table_files(store_dir, run_id, "images"))
    known = {path: entry for path, entry in known.items() if stamps.get(path) == entry[0]}
    new = [path for path in stamps if path not in known]
    if new:  # one query for all new files, not one read each
        def read(files: list[str]) -> pd.DataFrame:
            if not files:
                return pd.DataFrame({"filename": [], "refs": []})
            return _query_df("SELECT filename, list(image_ref) AS refs FROM read_parquet($files, filename=true) "
                             "GROUP BY filename", {"files": files})

        frame = damage.read_tolerant(store_dir, new, read)
        for path, refs in zip(frame["filename"], frame["refs"]):
            known[path] = (stamps[path], list(refs))
    found = next((path for path, (_, refs) in known.items() if image_ref in refs), None)
    with _lock:
        _images_cache[key] = known
    return found


RUN_SUMMARY_COLUMNS = ["last_step", "steps", "wall_time", "rollouts_sampled", "rollouts_kept", "kept_fraction",
                       "train_accuracy", "eval_split", "best_accuracy", "last_accuracy", "last_write", "heartbeat",
                       "state"]


def run_state(status: str, heartbeat: float | None, now: float | None = None,
              stale_after_s: float = layout.STALE_AFTER_S) -> str:
    """A run's effective status: its stored status, except "no heartbeat" for a "running" run whose writer has
    not touched its heartbeat for `stale_after_s` seconds (killed without a word: kill -9, a power cut, a full disk
    that kept it from writing its end). heartbeat and now: POSIX seconds."""
    now = time.time() if now is None else now
    if status == "running" and (heartbeat is None or now - heartbeat > stale_after_s):
        return "no heartbeat"
    return status


def _heartbeat(store_dir: Path, run_id: str) -> float | None:
    """The last sign of life of the run's writer: its heartbeat file's mtime (else run.json's, runs written before
    heartbeats)."""
    for path in (layout.heartbeat_file(store_dir, run_id), layout.run_dir(store_dir, run_id) / "run.json"):
        try:
            return os.path.getmtime(path)
        except FileNotFoundError:
            continue
    return None


def run_states(store_dir: str | Path, *, now: float | None = None) -> dict[str, str]:
    """{run_id: effective status (run_state)} of every run in the store."""
    store_dir = Path(store_dir)
    states = {}
    for run_id in layout.list_runs(store_dir):
        try:
            status = layout.read_run_json(store_dir, run_id).get("status", "running")
        except (ValueError, OSError):
            continue
        states[run_id] = run_state(status, _heartbeat(store_dir, run_id), now)
    return states


@_retry_vanished
def read_runs(store_dir: str | Path, *, totals: bool = True) -> pd.DataFrame:
    """One row per run: the runs columns plus headline metrics — last_step, steps, wall_time (s, of the last
    step), rollouts sampled/kept totals, kept_fraction, train_accuracy (last step), best/last eval accuracy on
    eval_split ("test" when the run has it, else its first split alphabetically), last_write (time of the last
    steps file), heartbeat (the writer's last sign of life) and state (`run_state`: the status, or "no heartbeat"
    for a "running" run whose writer died without a word). A run whose run.json is damaged is left out (noted in
    damaged_files). `totals=False`: last_step and steps from the steps folders' listing and no other headline
    (none of the runs' step or eval files is read: a page about one run needs only the list)."""
    store_dir = Path(store_dir)
    names = [c.name for c in schema.RUNS] + RUN_SUMMARY_COLUMNS
    rows, now = [], time.time()
    for run_id in layout.list_runs(store_dir):
        path = layout.run_dir(store_dir, run_id) / "run.json"
        try:
            meta = json.loads(path.read_text())
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            continue
        except (ValueError, OSError) as error:
            damage.note_damaged(store_dir, str(path), " ".join(str(error).split())[:200])
            continue
        row = {c.name: meta.get(c.name) for c in schema.RUNS}
        row["run_id"] = run_id
        row["config"] = json.dumps(meta.get("config", {}))
        row["config_history"] = json.dumps(meta.get("config_history", []))
        heartbeat = _heartbeat(store_dir, run_id)
        row |= {"heartbeat": None if heartbeat is None else pd.Timestamp(heartbeat, unit="s", tz="UTC"),
                "state": run_state(str(meta.get("status")), heartbeat, now)}
        if totals:
            row |= _step_totals(store_dir, run_id)
        else:
            listed = layout.step_numbers(store_dir, run_id, "steps")
            row |= {"steps": len(listed), "last_step": listed[-1] if listed else None}
        rows.append(row)
    if not rows:
        return pd.DataFrame({name: [] for name in names})
    runs = pd.DataFrame(rows)
    run_ids = runs["run_id"].tolist()
    runs["started"] = pd.to_datetime(runs["started"], utc=True, format="ISO8601")
    runs["finished"] = pd.to_datetime(runs["finished"], utc=True, format="ISO8601")
    if totals:
        runs = runs.merge(_eval_headlines(store_dir, run_ids), on="run_id", how="left")
    return runs.reindex(columns=names)


def _step_totals(store_dir: Path, run_id: str) -> dict:
    steps = _run_steps(store_dir, run_id)
    if not len(steps):
        return {"steps": 0}
    last = int(steps["step"].iloc[-1])
    sampled, kept = int(steps["rollouts_sampled"].sum()), int(steps["rollouts_kept"].sum())
    try:
        mtime = os.path.getmtime(layout.step_file(store_dir, run_id, "steps", last))
        last_write = pd.Timestamp(mtime, unit="s", tz="UTC")
    except FileNotFoundError:  # being re-written
        last_write = None
    return {"last_step": last, "steps": len(steps), "wall_time": float(steps["wall_time"].iloc[-1]),
            "rollouts_sampled": sampled, "rollouts_kept": kept, "kept_fraction": kept / sampled if sampled else None,
            "train_accuracy": float(steps["accuracy"].iloc[-1]), "last_write": last_write}


def _eval_headlines(store_dir: Path, run_ids: list[str]) -> pd.DataFrame:
    files = [f for run_id in run_ids for f in layout.eval_files(store_dir, run_id)]
    return damage.read_tolerant(store_dir, files, _eval_headline_query)


def _eval_headline_query(files: list[str]) -> pd.DataFrame:
    if not files:
        return pd.DataFrame({"run_id": pd.Series([], dtype=str)})
    return _query_df(
        "WITH e AS (SELECT run_id, step, split, accuracy FROM read_parquet($files, union_by_name=true)), "
        "pick AS (SELECT run_id, coalesce(max(split) FILTER (split = 'test'), min(split)) AS eval_split "
        "FROM e GROUP BY run_id) "
        "SELECT run_id, any_value(eval_split) AS eval_split, max(accuracy) AS best_accuracy, "
        "arg_max(accuracy, step) AS last_accuracy FROM e JOIN pick USING (run_id) WHERE split = eval_split "
        "GROUP BY run_id", {"files": files})
