"""Where the store keeps each file, how a file is written atomically, and the live `store.duckdb` views.

    <store_dir>/store.duckdb                 VIEWs over the Parquet globs below (plain `duckdb -readonly` SQL)
    <store_dir>/runs/<run_id>/run.json       the runs row (config as a JSON object)
    <store_dir>/runs/<run_id>/{steps,groups,rollouts,proj}/step_000123.parquet
    <store_dir>/runs/<run_id>/images/step_000123.parquet   (image_ref = sha256 of the PNG, png) of the images
                                             the run first used at that step: each image once per run, one file
                                             per step instead of one per image
    <store_dir>/runs/<run_id>/evals/step_000123_<split>.parquet
    <store_dir>/runs/<run_id>/<run_id>.duckdb  compact(): the run as real tables
    <store_dir>/runs/<run_id>/summary/{steps,groups,reason_counts}.parquet  the whole run's rows a fresh reader
                                             starts from, each step's rows valid while its file is unchanged
                                             (fastrl_core.store.summary)
    <store_dir>/runs/<run_id>/writer.lock    flock'ed by the run's one writer (the OS releases it when it dies)
    <store_dir>/runs/<run_id>/heartbeat      touched every HEARTBEAT_S by a live writer ("no heartbeat" when stale)
    <store_dir>/checkpoints/<run_id>/step_000040/  a resumable checkpoint with its manifest (fastrl_core.checkpoints)
    <store_dir>/quarantine/runs/<run_id>/... damaged files moved aside by `fastrl store check --quarantine`
    <store_dir>/quarantine/checkpoints/<run_id>/step_000040/  a damaged checkpoint, moved aside the same way
    <store_dir>/runs/.schema/<table>/empty.parquet  zero-row files so the views bind before any step exists

Every file is written under a temporary name and `os.replace`d, so a reader sees the old file, the new file or
none, never a torn one (docs/notes.md §3). Files are zstd-compressed Parquet; a rollouts file is written in row groups
of ROLLOUT_ROW_GROUP rows and an images file sorted by image_ref in groups of IMAGE_ROW_GROUP, so one rollout's tokens
or one image is read without the rest of its step (a real run's step: 512 rollouts, ~2 MB;
benchmarks/bench_store_scale.py). A step is visible once its steps file exists; the writer writes it last.
Every path the store keeps is relative to <store_dir> (the views too), so a copied or moved store reads its own
files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from fastrl_core.store import schema

STEP_TABLES = ("steps", "groups", "rollouts", "proj", "images")
TABLE_DIRS = (*STEP_TABLES, "evals")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SPLIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
IMAGE_REF = re.compile(r"[0-9a-f]{64}")
_STEP_FILE = re.compile(r"step_(\d+)\.parquet")
_CHECKPOINT_DIR = re.compile(r"step_(\d{6,})")
_EVAL_FILE = re.compile(r"step_(\d+)_([A-Za-z0-9_-]+)\.parquet")


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id {run_id!r} must match {RUN_ID.pattern} (letters, digits, '.', '_', '-')")
    return run_id


def run_id_base(name: str) -> str:
    """The part of a run id a run name gives: runs of other characters become '-', leading and trailing '-._'
    go, at most 64 characters ("a/b" -> "a-b", ".." -> "run"); the writer appends a timestamp."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:64] or "run"


def run_dir(store_dir: Path, run_id: str) -> Path:
    return Path(store_dir) / "runs" / check_run_id(run_id)


def checkpoint_root(store_dir: Path, run_id: str) -> Path:
    """The folder of a run's checkpoints (written by `fastrl_core.checkpoints`, verified by `fastrl store check`)."""
    return Path(store_dir) / "checkpoints" / check_run_id(run_id)


def checkpoint_folders(run_root: Path) -> list[tuple[int, Path]]:
    """A run's checkpoint step folders (step, path) under its `checkpoint_root`, oldest first."""
    try:
        entries = list(os.scandir(run_root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((int(m.group(1)), Path(run_root) / e.name) for e in entries
                  if e.is_dir() and (m := _CHECKPOINT_DIR.fullmatch(e.name)))


def step_file(store_dir: Path, run_id: str, table: str, step: int) -> Path:
    return run_dir(store_dir, run_id) / table / f"step_{step:06d}.parquet"


def step_files(store_dir: Path, run_id: str, table: str, steps) -> list[str]:
    """`str(step_file(...))` of each of `steps`, built as strings: a whole run's paths without a Path object each."""
    folder = os.path.join(run_dir(store_dir, run_id), table)
    return [os.path.join(folder, f"step_{int(step):06d}.parquet") for step in steps]


SAMPLED_SUFFIX = "-sampled"  # the eval split of mean@k beside a greedy split (`Trainer.evaluate`, eval_samples)


def sampled_split(split: str) -> str:
    """The eval split holding mean@k for greedy split `split`: "test" -> "test-sampled"."""
    return split + SAMPLED_SUFFIX


def eval_file(store_dir: Path, run_id: str, step: int, split: str) -> Path:
    return run_dir(store_dir, run_id) / "evals" / f"step_{step:06d}_{split}.parquet"


def check_image_ref(image_ref: str) -> str:
    if not isinstance(image_ref, str) or not IMAGE_REF.fullmatch(image_ref):
        raise ValueError(f"image_ref {image_ref!r} is not an image key (64 lowercase hex digits)")
    return image_ref


def compact_file(store_dir: Path, run_id: str) -> Path:
    return run_dir(store_dir, run_id) / f"{run_id}.duckdb"


class RunLocked(ValueError):
    """Another live process writes this run."""


def lock_run(store_dir: Path, run_id: str) -> int:
    """Take the run's writer lock (an exclusive flock on runs/<run_id>/writer.lock, released by the OS when the
    process dies, however it dies); returns the lock's file descriptor. RunLocked if another process holds it."""
    path = run_dir(store_dir, run_id) / "writer.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EACCES):
            raise RunLocked(f"run {run_id!r} in {store_dir} is being written by another process (one writer per "
                            "run; wait for it to end or stop it)") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def unlock_run(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)  # closing the descriptor releases the flock
        except OSError:
            pass


HEARTBEAT_S = 10.0  # a live writer touches runs/<run_id>/heartbeat this often
STALE_AFTER_S = 60.0  # a "running" run whose heartbeat is older than this shows as "no heartbeat"


def heartbeat_file(store_dir: Path, run_id: str) -> Path:
    return run_dir(store_dir, run_id) / "heartbeat"


def touch_heartbeat(store_dir: Path, run_id: str) -> None:
    path = heartbeat_file(store_dir, run_id)
    try:
        path.touch()
    except OSError:  # a full disk: the heartbeat goes stale, which is the truth
        pass


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


TEMP_FILE = re.compile(r".*\.tmp-(\d+)(?:\.wal)?")  # `_tmp`'s names; DuckDB adds .wal to a database's


def stale_temp_pid(name: str) -> int | None:
    """The process id in a temp file's name (`<name>.tmp-<pid>[.wal]`) when that process is not running: what a
    killed write left (never read). None for other names and for a write in progress."""
    match = TEMP_FILE.fullmatch(name)
    return int(match[1]) if match and not _running(int(match[1])) else None


def _running(pid: int) -> bool:
    """Whether process `pid` runs on this machine (signal 0 checks without signalling)."""
    if pid <= 0:  # 0 and negative ids would name process groups
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


ROLLOUT_ROW_GROUP = 64  # rows per row group of a rollouts file: one rollout's tokens are read with 63 others,
#                        not with the whole step (read_tokens; benchmarks/bench_store_scale.py)
IMAGE_ROW_GROUP = 8  # images per row group of an images file, sorted by image_ref: read_image reads 8, not all


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns whose values repeat: strings, lists of strings (token texts) and the token log-probs (rounded to 3
    decimals). Other floats do not repeat: no dictionary for them (benchmarks/bench_store.py (a))."""
    names = []
    for field in schema:
        if pa.types.is_string(field.type):
            names.append(field.name)
        elif pa.types.is_list(field.type) and (pa.types.is_string(field.type.value_type)
                                               or field.name == "token_logprob"):
            names.append(f"{field.name}.list.element")
    return names


def write_parquet(table: pa.Table, path: Path, *, row_group_size: int | None = None) -> None:
    """Write `table` to `path` atomically (temp file, then rename), zstd-compressed, dictionary-encoded where
    values repeat, in row groups of `row_group_size` rows (default: one). Not fsynced: survives a killed process,
    not a power cut. On an error (a full disk) the temp file is removed."""
    tmp = _tmp(path)
    try:
        pq.write_table(table, tmp, use_dictionary=_dictionary_columns(table.schema), row_group_size=row_group_size,
                       compression="zstd")  # 14 % smaller than snappy on a real-size step, as fast
        os.replace(tmp, path)
    except BaseException as error:
        _discard(tmp, error)
        raise


def write_bytes(data: bytes, path: Path) -> None:
    tmp = _tmp(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException as error:
        _discard(tmp, error)
        raise


def disk_full(path: Path, error: BaseException) -> OSError | None:
    """An OSError(ENOSPC) naming `path`'s disk when `error` came from it being full (under 1 MiB free; the writing
    libraries word it their own way: torch.save "unexpected pos", safetensors "StorageFull", Arrow an IOError),
    else None. Call it before deleting what the failed write left, which frees space."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return None  # says so already
    try:
        free = shutil.disk_usage(path if os.path.isdir(path) else os.path.dirname(path) or ".").free
    except OSError:
        return None
    if free >= 1 << 20:
        return None
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return OSError(errno.ENOSPC, f"No space left on device writing {str(path)!r} ({free} bytes free; "
                   f"{type(error).__name__}: {first[:160]})")


def _discard(tmp: Path, error: BaseException) -> None:
    """Remove a failed write's temp file; turn a full disk's error into OSError(ENOSPC)."""
    full = disk_full(tmp.parent, error) if isinstance(error, Exception) else None
    tmp.unlink(missing_ok=True)
    if full is not None:
        raise full from error


def write_json(obj: dict, path: Path) -> None:
    write_bytes(json.dumps(obj, indent=1).encode(), path)


def remove_temp_files(directory: Path) -> None:
    """Delete temp files a killed writer left behind (they are never read)."""
    for path in directory.rglob("*.tmp-*"):
        path.unlink(missing_ok=True)


def list_runs(store_dir: Path) -> list[str]:
    """Run ids in the store that have a run.json, sorted."""
    root = Path(store_dir) / "runs"
    if not root.is_dir():
        return []
    return sorted(e.name for e in os.scandir(root)
                  if RUN_ID.fullmatch(e.name) and os.path.exists(os.path.join(e.path, "run.json")))


def step_numbers(store_dir: Path, run_id: str, table: str) -> list[int]:
    """Sorted steps that have a file of `table`; for "steps" these are the visible steps."""
    directory = run_dir(store_dir, run_id) / table
    try:
        entries = os.scandir(directory)
    except FileNotFoundError:
        return []
    with entries:
        return sorted(int(m.group(1)) for e in entries if (m := _STEP_FILE.fullmatch(e.name)))


def file_step(path: str | Path) -> int:
    """The step of a per-step file (`step_000123.parquet` -> 123)."""
    return int(_STEP_FILE.fullmatch(Path(path).name).group(1))


def run_version(store_dir: Path, run_id: str) -> tuple[int, int]:
    """Changes whenever a step of the run appears, is re-written or disappears (quarantined, dropped by a resume):
    (mtime in ns, number of entries) of its steps folder; (0, 0) before it exists. A cache key for readers."""
    directory = run_dir(store_dir, run_id) / "steps"
    try:
        return os.stat(directory).st_mtime_ns, len(os.listdir(directory))
    except FileNotFoundError:
        return 0, 0


def table_files(store_dir: Path, run_id: str, table: str) -> list[str]:
    """Every file of a per-step `table` of a run, in step order."""
    return step_files(store_dir, run_id, table, step_numbers(store_dir, run_id, table))


def eval_files(store_dir: Path, run_id: str) -> list[str]:
    directory = run_dir(store_dir, run_id) / "evals"
    if not directory.is_dir():
        return []
    return sorted(str(directory / name) for name in os.listdir(directory) if _EVAL_FILE.fullmatch(name))


def eval_step(path: str | Path) -> int:
    """The step of an eval file."""
    return int(_EVAL_FILE.fullmatch(Path(path).name).group(1))


def read_run_json(store_dir: Path, run_id: str) -> dict:
    path = run_dir(store_dir, run_id) / "run.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no run {run_id!r} in store {store_dir} (missing {path})") from None


# ---------------------------------------------------------------------------------------------------------------
# store.duckdb: views for ad-hoc SQL on a live store. The app and the read_* functions do not use them: they list
# the visible steps first and read explicit files, which keeps a step all-or-nothing whatever order DuckDB
# expands globs in.

_SEED_COLUMNS = {
    "steps": (schema.STEP_KEY, schema.STEPS),
    "groups": (schema.STEP_KEY, schema.GROUPS),
    "rollouts": (schema.STEP_KEY, schema.ROLLOUTS),
    "proj": (schema.STEP_KEY, schema.PROJ),
    "evals": (schema.STEP_KEY, schema.EVALS),
    "images": (schema.STEP_KEY, schema.IMAGES),
}


def _view_sql(store_dir: Path) -> list[str]:
    root = "runs"  # relative: DuckDB resolves it against its working directory (or `SET file_search_path`)

    def scan(table: str) -> str:
        return f"read_parquet('{root}/*/{table}/*.parquet', union_by_name=true)"

    run_columns = {c.name: ("JSON" if c.name in ("config", "config_history") else "TIMESTAMPTZ"
                            if c.type == schema.TIMESTAMP
                            else "VARCHAR") for c in schema.RUNS}
    return [
        f"CREATE VIEW runs AS SELECT * FROM read_json('{root}/*/run.json', columns={run_columns!r})",
        f"CREATE VIEW steps AS SELECT * FROM {scan('steps')}",
        f"CREATE VIEW groups AS SELECT g.* FROM {scan('groups')} g SEMI JOIN steps s USING (run_id, step)",
        f"CREATE VIEW proj AS SELECT * FROM {scan('proj')}",
        f"CREATE VIEW rollouts AS SELECT r.* EXCLUDE (proj_x, proj_y), coalesce(p.proj_x, r.proj_x) AS proj_x, "
        f"coalesce(p.proj_y, r.proj_y) AS proj_y FROM {scan('rollouts')} r SEMI JOIN steps s USING (run_id, step) "
        f"LEFT JOIN proj p USING (run_id, step, rollout_id)",
        f"CREATE VIEW evals AS SELECT * FROM {scan('evals')}",
        f"CREATE VIEW images AS SELECT i.* FROM {scan('images')} i SEMI JOIN steps s USING (run_id, step)",
    ]


def open_views(store_dir: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to `store.duckdb` whose relative paths resolve in `store_dir`, from any directory."""
    store_dir = Path(store_dir).resolve()
    return duckdb.connect(str(store_dir / "store.duckdb"), read_only=True, config={"file_search_path": str(store_dir)})


def _remove_unborn_runs_temp_files(store_dir: Path) -> None:
    """A writer killed after claiming its run folder but before its run.json landed leaves `run.json.tmp-<pid>` in
    a folder no resume can name (no run.json, no run): remove the temp files of processes that are not running.
    The folder stays (a live writer may have just claimed it and not written yet)."""
    for entry in os.scandir(store_dir / "runs"):
        if entry.is_dir(follow_symlinks=False) and RUN_ID.fullmatch(entry.name) \
                and not os.path.exists(os.path.join(entry.path, "run.json")):
            for path in Path(entry.path).rglob("*.tmp-*"):
                if stale_temp_pid(path.name) is not None:
                    path.unlink(missing_ok=True)


def init_store(store_dir: Path) -> None:
    """Create the directory layout, the zero-row seed files and `store.duckdb`.

    `store.duckdb` is rebuilt under a temp name and renamed into place (no lock is ever taken on the live file,
    and a reader holding the old one keeps it). Its views name files relative to the store (`runs/*/...`), so
    a copied or moved store reads its own files: open it from the store directory (`cd <store_dir> && duckdb
    -readonly store.duckdb`) or `SET file_search_path='<store_dir>'` first. Call it after the run's run.json
    exists: the runs view needs one to bind.
    """
    store_dir = Path(store_dir)
    for table, (key, columns) in _SEED_COLUMNS.items():
        seed = store_dir / "runs" / ".schema" / table / "empty.parquet"
        if not seed.exists():
            seed.parent.mkdir(parents=True, exist_ok=True)
            write_parquet(schema.arrow_schema(key, columns).empty_table(), seed)
    database = store_dir / "store.duckdb"
    for entry in os.scandir(store_dir):  # what a process killed here left (every run's writer comes through here)
        if entry.name.startswith(f"{database.name}.tmp-") and stale_temp_pid(entry.name) is not None:
            Path(entry.path).unlink(missing_ok=True)
    _remove_unborn_runs_temp_files(store_dir)
    tmp = _tmp(database)
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp), config={"file_search_path": str(store_dir.resolve())})
    try:
        for statement in _view_sql(store_dir):
            con.execute(statement)
    finally:
        con.close()
    os.replace(tmp, database)
    Path(f"{tmp}.wal").unlink(missing_ok=True)
