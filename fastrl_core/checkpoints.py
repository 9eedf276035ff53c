"""Crash-safe checkpoints: a kill at any instant leaves one complete checkpoint, the old one or the new.

    <store_dir>/checkpoints/<run_id>/step_000040/{policy/, trainer.pt, budget.json}   one complete checkpoint
    <store_dir>/checkpoints/<run_id>/latest                                           "step_000040"
    <store_dir>/checkpoints/<run_id>/.tmp-step_000050-<pid>/                          one being written

`save` writes into a temp folder, renames it to its step's name (atomic: the folder appears whole or not at all),
then replaces the `latest` pointer with `os.replace` and only then deletes the older checkpoints. `find_latest`
takes the pointer's folder, else the highest complete step folder (a kill between the rename and the pointer),
else a checkpoint of the layout before this one (`<run_id>/trainer.pt`, or a complete `<run_id>.tmp` that the
old non-atomic swap left behind). Temp folders are never read; `save` and `remove_stale` delete them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from fastrl_core import faults
from fastrl_core.store.layout import disk_full

_STEP_DIR = re.compile(r"step_(\d{6,})")
COMPLETE_MARKERS = ("trainer.pt", "budget.json")  # written last by every layout: a folder with both is whole


def root(store_dir: str | Path, run_id: str) -> Path:
    return Path(store_dir) / "checkpoints" / run_id


def _complete(folder: Path) -> bool:
    return folder.is_dir() and all((folder / name).is_file() for name in COMPLETE_MARKERS)


def step_folders(run_root: Path) -> list[tuple[int, Path]]:
    """The run's checkpoint folders (step, path), oldest first."""
    if not run_root.is_dir():
        return []
    found = [(int(m.group(1)), run_root / e.name) for e in os.scandir(run_root)
             if e.is_dir() and (m := _STEP_DIR.fullmatch(e.name))]
    return sorted(found)


def find_latest(run_root: Path) -> Path | None:
    """The folder of the run's last complete checkpoint, or None (see the module docstring)."""
    pointer = run_root / "latest"
    try:
        named = run_root / pointer.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        named = None
    if named is not None and _STEP_DIR.fullmatch(named.name) and _complete(named):
        return named
    for _, folder in reversed(step_folders(run_root)):
        if _complete(folder):
            return folder
    for legacy in (run_root, run_root.with_name(run_root.name + ".tmp")):
        if _complete(legacy):
            return legacy
    return None


def remove_stale(run_root: Path) -> None:
    """Delete temp folders a killed writer left (the caller holds the run's lock: no one else writes here)."""
    if run_root.is_dir():
        for entry in os.scandir(run_root):
            if entry.name.startswith(".tmp-"):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    Path(entry.path).unlink(missing_ok=True)


def save(run_root: Path, step: int, write: Callable[[Path], None]) -> Path:
    """Write a checkpoint of `step` with `write(folder)` (it must write COMPLETE_MARKERS last) and swap it in;
    returns its folder. A checkpoint of the same step that exists already is kept (the state is the same). On an
    error (a full disk) the temp folder is removed and the previous checkpoint stays the latest."""
    final = run_root / f"step_{step:06d}"
    run_root.mkdir(parents=True, exist_ok=True)
    remove_stale(run_root)
    if not _complete(final):
        tmp = run_root / f".tmp-{final.name}-{os.getpid()}"
        try:
            tmp.mkdir()
            write(tmp)
            if final.exists():  # an incomplete folder of this step cannot exist (renames are whole), but be sure
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException as error:
            full = disk_full(run_root, error) if isinstance(error, Exception) else None
            shutil.rmtree(tmp, ignore_errors=True)
            if full is not None:
                raise full from error
            raise
    faults.reach("checkpoint.renamed")
    pointer = run_root / "latest"
    tmp_pointer = run_root / f".tmp-latest-{os.getpid()}"
    tmp_pointer.write_text(final.name)
    os.replace(tmp_pointer, pointer)
    faults.reach("checkpoint.pointed")
    for _, folder in step_folders(run_root):
        if folder != final:
            shutil.rmtree(folder, ignore_errors=True)
    for legacy in (run_root.with_name(run_root.name + ".tmp"),):
        shutil.rmtree(legacy, ignore_errors=True)
    for name in ("policy", *COMPLETE_MARKERS):  # the layout before step folders
        path = run_root / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
    return final
