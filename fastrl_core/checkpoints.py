"""Crash-safe, verified checkpoints: a kill at any instant leaves whole checkpoints, and a damaged one is found.

    <store_dir>/checkpoints/<run_id>/step_000040/{policy/, trainer.pt, budget.json, manifest.json}  the newest
    <store_dir>/checkpoints/<run_id>/step_000030/...                                                the previous
    <store_dir>/checkpoints/<run_id>/latest                                                         "step_000040"
    <store_dir>/checkpoints/<run_id>/.tmp-step_000050-<pid>/                                        one being written

`save` writes into a temp folder, records every file's size and sha256 in its `manifest.json`
(`fastrl_core.store.manifest`), renames the folder to its step's name (atomic: it appears whole or not at all),
replaces the `latest` pointer with `os.replace`, and only then deletes the checkpoints older than the previous one:
the newest two (KEEP) stay, so a damaged newest one has a whole one to fall back to.

`load_whole` is what `--resume` reads: the pointer's folder, then every other step folder newest first, then a
checkpoint of the layout before step folders (`<run_id>/trainer.pt`, or a complete `<run_id>.tmp` the old
non-atomic swap left). A folder with a manifest is whole when its files match it (`fastrl store check` verifies
the same); a folder written before manifests (no `manifest.json`) is taken when it loads without an error. The
first whole one is loaded; the damaged ones skipped are named in one logged line; when every checkpoint is
damaged, `DamagedCheckpoint` stops the resume. Temp folders are never read; `save` and `remove_stale` delete them.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fastrl_core import faults
from fastrl_core.store.layout import checkpoint_folders, checkpoint_root, disk_full
from fastrl_core.store.manifest import has_manifest, manifest_problem, write_manifest

logger = logging.getLogger(__name__)
Loaded = TypeVar("Loaded")
LEGACY_MARKERS = ("trainer.pt", "budget.json")  # written last by the layouts before manifests: both = whole
KEEP = 2  # checkpoints kept: the newest and the previous one, its fallback


class DamagedCheckpoint(ValueError):
    """A run has checkpoints but none is whole: nothing to resume from (the CLI prints it as one line, exit 2)."""


def root(store_dir: str | Path, run_id: str) -> Path:
    return checkpoint_root(Path(store_dir), run_id)


def _complete(folder: Path) -> bool:
    """Whether a rename or a pointer may have made `folder` a checkpoint (whole or damaged since)."""
    return folder.is_dir() and (has_manifest(folder) or all((folder / name).is_file() for name in LEGACY_MARKERS))


def candidates(run_root: Path) -> list[Path]:
    """The run's checkpoints, newest first: the pointer's folder, the other step folders, a legacy layout's."""
    found = [folder for _, folder in reversed(checkpoint_folders(run_root))]
    try:
        named = run_root / (run_root / "latest").read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        named = None
    if named in found:
        found = [named, *(folder for folder in found if folder != named)]
    legacy = [folder for folder in (run_root, run_root.with_name(run_root.name + ".tmp")) if _complete(folder)]
    return found + legacy


def find_latest(run_root: Path) -> Path | None:
    """The folder `load_whole` tries first (whole or not), or None when the run has no checkpoint."""
    return next(iter(candidates(run_root)), None)


def load_whole(run_root: Path, load: Callable[[Path], Loaded]) -> tuple[Path, Loaded] | None:
    """(folder, load(folder)) of the run's newest whole checkpoint, or None when it has no checkpoint at all (the run
    then resumes from its first step). A damaged one (its files differ from its manifest; without a manifest,
    `load` raised) is skipped and named in one logged line; DamagedCheckpoint when none is whole."""
    damaged: list[tuple[Path, str]] = []
    for folder in candidates(run_root):
        problem = manifest_problem(folder) if has_manifest(folder) else None
        if problem is None:
            try:
                loaded = load(folder)
            except Exception as error:  # noqa: BLE001 - torch, safetensors and json each raise their own
                if has_manifest(folder):
                    raise  # its files are those written: a loading error is not damage
                problem = f"it does not load ({type(error).__name__}: {_first_line(error)})"
            else:
                if damaged:
                    logger.warning("run %s: %s; resuming from the previous whole checkpoint %s", run_root.name,
                                   _listed(damaged), folder.name)
                return folder, loaded
        damaged.append((folder, problem))
    if damaged:
        store = run_root.parent.parent
        raise DamagedCheckpoint(
            f"run {run_root.name}: no whole checkpoint to resume from: {_listed(damaged)} (`fastrl store check "
            f"{store} --quarantine` moves the damaged ones aside; --resume then restarts the run from its first step)")
    return None


def _listed(damaged: list[tuple[Path, str]]) -> str:
    parts = [f"{folder.name} ({problem})" for folder, problem in damaged]
    return f"checkpoint {parts[0]} is damaged" if len(parts) == 1 else f"checkpoints {', '.join(parts)} are damaged"


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")[:160]


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
    """Write a checkpoint of `step` with `write(folder)`, record its manifest and swap it in; returns its folder.
    A whole checkpoint of the same step that exists already is kept (the state is the same); a damaged one is
    replaced. On an error (a full disk) the temp folder is removed and the previous checkpoint stays the latest."""
    final = run_root / f"step_{step:06d}"
    run_root.mkdir(parents=True, exist_ok=True)
    remove_stale(run_root)
    if not (has_manifest(final) and manifest_problem(final) is None):
        tmp = run_root / f".tmp-{final.name}-{os.getpid()}"
        try:
            tmp.mkdir()
            write(tmp)
            write_manifest(tmp)
            if final.exists():  # a damaged (or pre-manifest) folder of this step
                _delete(final)
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
    _remove_older(run_root, step)
    return final


def _delete(folder: Path) -> None:
    """Delete a checkpoint folder as one step: renamed to a temp name first, so a kill midway leaves a temp folder
    (never read; `remove_stale` deletes it) rather than a half-deleted checkpoint that `store check` calls damaged."""
    gone = folder.with_name(f".tmp-gone-{folder.name}-{os.getpid()}")
    try:
        os.rename(folder, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def _remove_older(run_root: Path, step: int) -> None:
    """Keep the checkpoint of `step` and the KEEP - 1 complete ones before it; delete the rest (older ones, and
    newer ones a resume from an earlier checkpoint left behind) and the layout before step folders."""
    earlier = [folder for s, folder in checkpoint_folders(run_root) if s < step and _complete(folder)]
    keep = {run_root / f"step_{step:06d}", *earlier[len(earlier) - (KEEP - 1):]}
    for _, folder in checkpoint_folders(run_root):
        if folder not in keep:
            _delete(folder)
    shutil.rmtree(run_root.with_name(run_root.name + ".tmp"), ignore_errors=True)
    for name in ("policy", *LEGACY_MARKERS):  # the layout before step folders
        path = run_root / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
