"""How the store's readers treat damaged files: leave them out of a read, note them, list them (`damaged_files`).

A file is damaged when it does not read whole (truncated, junk, a run.json that is not JSON) or is missing while
its step is visible. `read_tolerant` runs a read over a list of files; when DuckDB (or Arrow) fails, each file is
checked alone (`file_problem`) and the bad ones are left out. Each process notes what it skipped per store as
{path: (stamp, reason)}, stamp = (inode, mtime_ns, size), None for a missing file, so a replaced or restored file
is read again. `fastrl store check` (store.check) scans the whole store and can quarantine them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

_lock = threading.Lock()
_damaged: dict[str, dict[str, tuple[tuple | None, str]]] = {}  # store -> {path: (stamp or None if missing, reason)}


def _store_key(store_dir: Path) -> str:
    return str(Path(store_dir).resolve())


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def why(error: BaseException) -> str:
    """An error as one line of at most 200 characters (its type's name when it has no message)."""
    return " ".join(str(error).split())[:200] or type(error).__name__


def file_problem(path: str) -> str | None:
    """Why a store file cannot be read (its first line), or None when it reads whole."""
    try:
        pq.read_table(path)
    except FileNotFoundError:
        return "missing"
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        return why(error)
    return None


def step_vanished(path: str) -> bool:
    """A per-step file that is gone together with its step's steps file: the step is being re-written or was
    dropped by a resume, which is not damage."""
    name = Path(path).name
    steps_file = Path(path).parent.parent / "steps" / name
    return not os.path.exists(path) and not steps_file.exists()


class DamagedFile(OSError):
    """A store file a read needs does not read (damaged, or missing while its step is visible); the message names
    it, relative to the store, with why."""


def damaged(store_dir: Path, path: str, error: BaseException) -> DamagedFile:
    """Note `path` as damaged by `error` (its first line, or "missing") and return the DamagedFile to raise."""
    missing = isinstance(error, FileNotFoundError)
    problem = "missing" if missing else why(error)
    if not (missing and step_vanished(path)):
        note_damaged(store_dir, path, problem)
    return DamagedFile(f"{os.path.relpath(path, _store_key(store_dir))}: {problem}")


def reason(store_dir: Path, path: str) -> str | None:
    """Why `path` was noted damaged (None when it was not)."""
    with _lock:
        entry = _damaged.get(_store_key(store_dir), {}).get(path)
    return None if entry is None else entry[1]


def note_damaged(store_dir: Path, path: str, reason: str) -> None:
    """Note `path` as damaged (for `damaged_files`, and left out of reads until it changes)."""
    with _lock:
        _damaged.setdefault(_store_key(store_dir), {})[path] = (_stamp(path), reason)


def known_damaged(store_dir: Path, path: str) -> bool:
    """Whether `path` was found damaged and is unchanged since (a replaced or restored file is read again)."""
    with _lock:
        entry = _damaged.get(_store_key(store_dir), {}).get(path)
    if entry is None:
        return False
    if _stamp(path) == entry[0] and not (entry[0] is None and step_vanished(path)):
        return True
    with _lock:
        _damaged.get(_store_key(store_dir), {}).pop(path, None)
    return False


def sort_out(store_dir: Path, files: list[str]) -> set[str]:
    """The files of `files` that cannot be read; the damaged ones among them are noted for damaged_files."""
    bad = set()
    for path in files:
        problem = file_problem(path)
        if problem is None:
            continue
        bad.add(path)
        if problem == "missing" and (Path(path).parent.name == "steps" or step_vanished(path)):
            continue  # a step not (or no longer) visible
        note_damaged(store_dir, path, problem)
    return bad


def read_tolerant(store_dir: Path, files: list[str], read):
    """`read(files)` without the damaged files: known ones are left out first; when DuckDB (or Arrow) still fails,
    each file is checked alone and the bad ones are left out. `read` must accept an empty list."""
    files = [f for f in files if not known_damaged(store_dir, f)]
    for attempt in range(3):
        if not files:
            return read([])
        try:
            return read(files)
        except (duckdb.Error, OSError, ValueError):
            bad = sort_out(store_dir, files)
            if not bad or attempt == 2:
                raise
            files = [f for f in files if f not in bad]


def damaged_files(store_dir: str | Path) -> dict[str, str]:
    """{path relative to the store: why} of the damaged files this process's readers skipped and that are still
    damaged (unchanged, or still missing)."""
    store_dir = Path(store_dir)
    with _lock:
        paths = list(_damaged.get(_store_key(store_dir), {}))
    root = Path(_store_key(store_dir))
    found = {}
    for path in paths:
        if known_damaged(store_dir, path):
            with _lock:
                reason = _damaged[_store_key(store_dir)][path][1]
            found[os.path.relpath(path, root)] = reason
    return dict(sorted(found.items()))
