"""`fastrl store check`: find the store's damaged files and checkpoints and move them aside.

A file is damaged when it does not read whole (truncated, junk, a run.json that is not JSON), or when it is missing
though its step is visible (a step's rollouts and groups files are written before its steps file). Readers skip
such files already (`store.damaged_files`); quarantining moves them to <store_dir>/quarantine/<same path> so
that nothing is deleted and the store reads clean again. A damaged steps, groups or rollouts file takes its whole
step to quarantine (steps file first): a step stays all-or-nothing. A damaged summary file (`store.summary`) goes
alone: readers then read the step files, and the next `fastrl store compact` writes it anew.

A temp file (`<name>.tmp-<pid>`, what every store write goes through before its rename, and `compact`'s DuckDB file
while it is built) whose process is not running is what a killed write left: it is never read, but it is named
(and quarantined) like damage, so a kill during `fastrl store compact` does not leave gigabytes unseen. One whose
process is running is a write in progress and is left alone (a reused process id hides a leftover until then).

A checkpoint is damaged when its files differ from its manifest (a file missing, truncated or changed:
`store.manifest`); it is named and quarantined as one folder. One written before manifests cannot be verified
here: it is counted as unverified (`--resume` tries to load it and falls back when it does not load).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from fastrl_core.store import layout, summary
from fastrl_core.store.damage import file_problem
from fastrl_core.store.manifest import has_manifest, manifest_problem

WHOLE_STEP_TABLES = ("steps", "groups", "rollouts")  # needed for a step to be whole; proj and images are extras


@dataclass(frozen=True)
class Damage:
    path: str  # relative to the store
    problem: str  # "missing" or the reader's first error line

    @property
    def temp_file(self) -> bool:
        """A killed write's temp file (never read; the run's next writer removes it), not damaged data."""
        return layout.TEMP_FILE.fullmatch(Path(self.path).name) is not None


def check_store(store_dir: str | Path) -> list[Damage]:
    """Every damaged file of every run in the store (reads each file whole: seconds for a large store)."""
    store_dir = Path(store_dir)
    found: list[Damage] = []

    def note(path: Path | str, problem: str) -> None:
        found.append(Damage(os.path.relpath(path, store_dir), problem))

    for run_id in layout.list_runs(store_dir):
        run_json = layout.run_dir(store_dir, run_id) / "run.json"
        try:
            if not isinstance(json.loads(run_json.read_text()), dict):
                note(run_json, "not a JSON object")
        except (ValueError, OSError) as error:
            note(run_json, " ".join(str(error).split())[:200])
        visible = set(layout.step_numbers(store_dir, run_id, "steps"))
        for table in (*layout.STEP_TABLES,):
            present = set(layout.step_numbers(store_dir, run_id, table))
            for step in sorted(present):
                path = layout.step_file(store_dir, run_id, table, step)
                problem = file_problem(str(path))
                if problem is not None and problem != "missing":
                    note(path, problem)
            if table in ("groups", "rollouts"):
                for step in sorted(visible - present):
                    note(layout.step_file(store_dir, run_id, table, step), "missing")
        for path in layout.eval_files(store_dir, run_id):
            problem = file_problem(path)
            if problem is not None and problem != "missing":
                note(path, problem)
        for table in summary.SOURCES:
            problem = summary.problem(store_dir, run_id, table)
            if problem is not None:
                note(summary.summary_file(store_dir, run_id, table), problem)
        for folder in verified_checkpoints(store_dir, run_id):
            problem = manifest_problem(folder)
            if problem is not None:
                note(folder, problem)
    for path, pid in leftover_temp_files(store_dir):
        note(path, f"a temp file left by process {pid}, which is not running (a write killed midway; never read)")
    return sorted(found, key=lambda d: d.path)


def leftover_temp_files(store_dir: Path) -> list[tuple[Path, int]]:
    """(path, process id) of each temp file in the store (outside quarantine/) whose process is not running."""
    found = []
    for folder, dirs, files in os.walk(store_dir):
        if Path(folder) == Path(store_dir):
            dirs[:] = [d for d in dirs if d != "quarantine"]
        for name in files:
            pid = layout.stale_temp_pid(name)
            if pid is not None:
                found.append((Path(folder) / name, pid))
    return found


def verified_checkpoints(store_dir: Path, run_id: str) -> list[Path]:
    """The run's checkpoint folders that carry a manifest (those written before manifests cannot be verified)."""
    return [folder for _, folder in layout.checkpoint_folders(layout.checkpoint_root(store_dir, run_id))
            if has_manifest(folder)]


def unverified_checkpoints(store_dir: Path) -> int:
    """Checkpoint folders of the store's runs written before manifests."""
    return sum(not has_manifest(folder) for run_id in layout.list_runs(store_dir)
               for _, folder in layout.checkpoint_folders(layout.checkpoint_root(store_dir, run_id)))


def quarantine(store_dir: str | Path, damage: Sequence[Damage]) -> list[str]:
    """Move the damaged files (and the rest of a damaged step) to <store_dir>/quarantine/; returns the moved
    paths, relative to the store. The steps file of a step moves first, so readers never see half a step."""
    store_dir = Path(store_dir)
    moved: list[str] = []
    targets: list[Path] = []
    for item in damage:
        path = store_dir / item.path
        if path.parent.name in WHOLE_STEP_TABLES and path.name.startswith("step_") and not layout.TEMP_FILE.fullmatch(
                path.name):
            step_dir = path.parent.parent
            targets += [step_dir / table / path.name for table in ("steps", "groups", "rollouts", "proj")]
        else:
            targets.append(path)
    for path in dict.fromkeys(targets):
        if not path.exists():
            continue
        destination = store_dir / "quarantine" / path.relative_to(store_dir)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and destination.exists():  # a checkpoint folder quarantined before: keep both
            destination = destination.with_name(f"{destination.name}-{len(list(destination.parent.iterdir()))}")
        os.replace(path, destination)
        moved.append(str(path.relative_to(store_dir)))
    return moved


def check_main(argv: Sequence[str] | None = None) -> int:
    """`fastrl store check <store_dir> [--quarantine]`: list damaged files (exit 1 if any is left), and with
    --quarantine move them to <store_dir>/quarantine/ (exit 0)."""
    parser = argparse.ArgumentParser(prog="fastrl store check", description=check_main.__doc__)
    parser.add_argument("store_dir", type=Path)
    parser.add_argument("--quarantine", action="store_true", help="move damaged files to <store_dir>/quarantine/")
    args = parser.parse_args(argv)
    return run_check(args.store_dir, quarantine_files=args.quarantine)


def run_check(store_dir: Path, *, quarantine_files: bool) -> int:
    if not (Path(store_dir) / "runs").is_dir():
        from fastrl_core.config import ConfigError

        raise ConfigError(f"{store_dir}: not a store (no runs/ folder)")
    damage = check_store(store_dir)
    for item in damage:
        print(f"damaged: {item.path}: {item.problem}")
    unverified = unverified_checkpoints(store_dir)
    if unverified:
        print(f"{unverified} checkpoint(s) written before manifests: not verified (--resume falls back from one "
              "that does not load)")
    if not damage:
        print(f"{store_dir}: no damaged files in {len(layout.list_runs(store_dir))} runs")
        return 0
    if not quarantine_files:
        print(f"{len(damage)} damaged file(s); `fastrl store check {store_dir} --quarantine` moves them aside")
        return 1
    moved = quarantine(store_dir, damage)
    for path in moved:
        print(f"quarantined: {path}")
    print(f"{len(damage)} damaged file(s); {len(moved)} file(s) moved to {Path(store_dir) / 'quarantine'}")
    return 0
