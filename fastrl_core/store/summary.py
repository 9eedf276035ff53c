"""A run's whole-run tables in one file each, so a fresh reader opens three files instead of three per step.

The per-step files stay the truth. `runs/<run_id>/summary/<table>.parquet` holds what the readers gather from every
step of a run: the rows of its `steps` files, of its `groups` files, and the left-out counts per reason of its
`rollouts` files (`reason_counts`), with, in the Parquet metadata, the stamp (inode, mtime in ns, size) of each
step file it was made from. A reader starts from it (`readers._cached_run_table`) and keeps a step's rows only
while that step's file still has that stamp: a step written since, re-written after a resume, damaged or moved to
quarantine is read from its own file (or dropped with it), exactly as without a summary. So a summary can be old or
missing without a reader ever seeing other data, only reading more files.

The writer refreshes the summaries every `EVERY` steps and when the run ends, and `fastrl store compact` does too
(e.g. after copying a store, whose files then have other inodes). A summary that does not read is skipped and
named like any damaged file. On the paper-sized store (800 steps x 512 rollouts) a fresh process reads a run's
steps rows in 0.01-0.02 s instead of 0.30, its groups in 0.05-0.08 s instead of 0.45-0.52, and its left-out
counts in 0.02 s instead of 0.71-0.88 (benchmarks/bench_store_scale.py; docs/results.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from fastrl_core.store import damage, layout

SOURCES = {"steps": "steps", "groups": "groups", "reason_counts": "rollouts"}  # summary table -> step files read
EVERY = 25  # the writer refreshes the summaries after this many new steps (and when the run ends)
FORMAT = 1
FOLDER = "summary"  # runs/<run_id>/summary/
_KEY = b"fastrl.summary"

Stamp = tuple[int, int, int]  # (inode, mtime_ns, size) of a step file
UNREADABLE = (OSError, ValueError, KeyError, TypeError, pa.ArrowException)  # what `load` raises for a bad file


def summary_file(store_dir: Path, run_id: str, table: str) -> Path:
    if table not in SOURCES:
        raise ValueError(f"no summary table {table!r}; choose from {list(SOURCES)}")
    return layout.run_dir(store_dir, run_id) / FOLDER / f"{table}.parquet"


def summary_files(store_dir: Path, run_id: str) -> list[Path]:
    """The run's summary files that exist."""
    return [path for table in SOURCES if (path := summary_file(store_dir, run_id, table)).exists()]


def save(store_dir: Path, run_id: str, table: str, stamps: dict[str, Stamp], frame: pd.DataFrame) -> None:
    """Write the summary of `table`: `frame` (a step column, step order) made from the step files `stamps`
    ({path: stamp}, every file read, including steps that gave no rows). Atomic (renamed into place)."""
    steps = {str(layout.file_step(path)): list(stamp) for path, stamp in stamps.items()}
    arrow = pa.Table.from_pandas(frame, preserve_index=False)
    metadata = {**(arrow.schema.metadata or {}),
                _KEY: json.dumps({"format": FORMAT, "source": SOURCES[table], "stamps": steps}).encode()}
    path = summary_file(store_dir, run_id, table)
    path.parent.mkdir(exist_ok=True)
    layout.write_parquet(arrow.replace_schema_metadata(metadata), path)


def load(store_dir: Path, run_id: str, table: str) -> tuple[dict[str, Stamp], pd.DataFrame] | None:
    """({step file path: stamp}, rows) of the summary of `table`, or None when there is none. Raises one of
    UNREADABLE when it does not read (the caller notes it and reads the step files)."""
    path = summary_file(store_dir, run_id, table)
    if not path.exists():
        return None
    arrow = pq.read_table(path)
    raw = (arrow.schema.metadata or {}).get(_KEY)
    if raw is None:
        raise ValueError("not a summary file (no fastrl.summary metadata)")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT or meta.get("source") != SOURCES[table]:
        raise ValueError(f"summary format {meta.get('format')!r} of {meta.get('source')!r} files; this code "
                         f"reads format {FORMAT} of {SOURCES[table]!r} files")
    steps = meta["stamps"]
    paths = layout.step_files(store_dir, run_id, meta["source"], steps)
    stamps = {path: tuple(int(v) for v in stamp) for path, stamp in zip(paths, steps.values())}
    return stamps, arrow.to_pandas()


def problem(store_dir: Path, run_id: str, table: str) -> str | None:
    """Why the run's summary of `table` does not read (its first line), or None when it reads or there is none."""
    try:
        load(store_dir, run_id, table)
    except UNREADABLE as error:
        return damage.why(error)
    return None
