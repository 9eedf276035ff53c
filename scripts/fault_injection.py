"""Kill `fastrl train` with SIGKILL at chosen and at random instants, damage its checkpoints, resume it, and count
what was lost.

    python scripts/fault_injection.py --trials 12 [--damage-trials 6] [--seed 0] [--workdir DIR] [--no-disk-full]
                                      [--json OUT]

Each trial trains a tiny run (8 steps on the embedded default, an evaluation every 2 steps, a checkpoint every 3)
in a store shared by all trials and kills it, either at a named point (`fastrl_core.faults.POINTS`: inside a
step's write, after an evaluation, at each stage of a checkpoint swap; FASTRL_KILL_AT=point:visit) or after a
random delay. While killed, the store's readers must open it (every run, every table). Then `--resume` runs,
itself killed again at random with probability 1/3, until the run finishes. After each trial every step and every
evaluation must be present exactly once, the steps must equal an uninterrupted run's (exact resume), and
`fastrl store check` must find no damaged file: while killed, only the temp file of a write killed midway (named,
never read), and at the end nothing (the resumed run's writer removes those temp files).

The damaged-checkpoint trials kill a run just after its second checkpoint (or its first), then damage the newest
checkpoint as a disk or a copy might: a truncated trainer.pt, one flipped bit in a random file, or a random file
deleted. `fastrl store check` must name it (exit 1); `--resume` must fall back to the previous whole checkpoint in
one line and finish identical to the uninterrupted run, or, with no previous one, stop in one line with exit 2,
and after `fastrl store check --quarantine` restart the run from its first step.

The full-disk trial (root only: it mounts a small tmpfs) trains on a store too small for the run, checks that
the error is one line, the run is marked and the store opens, then grows the disk and resumes.

Prints the figures for README's reliability paragraph; returns them from `run_campaign` (tests/test_fault_injection.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastrl_core import checkpoints, faults  # noqa: E402
from fastrl_core.store import (check_store, damaged_files, layout, read_evals, read_groups, read_rollouts,  # noqa: E402
                               read_runs, read_steps)

STEPS, EVAL_EVERY, CHECKPOINT_EVERY = 8, 2, 3
TINY = [f"steps={STEPS}", f"eval_every={EVAL_EVERY}", f"checkpoint_every={CHECKPOINT_EVERY}", "prompts_per_step=4",
        "rollouts_per_prompt=4", "synthetic_train=64", "synthetic_test=16", "eval_size=16", "max_new_tokens=16",
        "threads=1"]
EXPECTED_EVALS = list(range(0, STEPS + 1, EVAL_EVERY))
VISITS = {"step.rollouts_written": STEPS, "step.groups_written": STEPS, "step.written": STEPS,
          "eval.written": len(EXPECTED_EVALS), "checkpoint.policy_written": STEPS // CHECKPOINT_EVERY + 1,
          "checkpoint.renamed": STEPS // CHECKPOINT_EVERY + 1, "checkpoint.pointed": STEPS // CHECKPOINT_EVERY + 1}


def train_command(store: Path, run_name: str, resume: str | None = None) -> list[str]:
    command = [sys.executable, "-m", "fastrl_app.cli", "train", "embedded",
               f"store_dir={store}", f"run_name={run_name}", *TINY]
    return command + (["--resume", resume] if resume else [])


def launch(command: list[str], *, kill_at: str | None = None, kill_after: float | None = None,
           timeout: float = 300) -> tuple[int, str]:
    """Run `command`; SIGKILL it at a named point (kill_at) or after kill_after seconds. (returncode, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "FASTRL_KILL_AT": kill_at or ""}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        if kill_after is not None:
            try:
                process.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                process.kill()
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err


def run_id_of(store: Path, run_name: str) -> str | None:
    for run_id in layout.list_runs(store):
        if json.loads((layout.run_dir(store, run_id) / "run.json").read_text()).get("name") == run_name:
            return run_id
    return None


def where_it_landed(store: Path, run_id: str | None) -> str:
    """What a kill interrupted, read from what it left: a checkpoint temp folder, a step's temp or orphan files."""
    if run_id is None:
        return "before the run existed"
    ckpt = checkpoints.root(store, run_id)
    if ckpt.is_dir() and any(e.name.startswith(".tmp-") for e in os.scandir(ckpt)):
        return "during checkpoint save"
    run_dir = layout.run_dir(store, run_id)
    if any(run_dir.rglob("*.tmp-*")):
        return "during a step's write"
    visible = set(layout.step_numbers(store, run_id, "steps"))
    if any(set(layout.step_numbers(store, run_id, t)) - visible for t in ("rollouts", "groups", "images")):
        return "during a step's write"
    return "between writes (sampling, update or evaluation)"


def readers_open(store: Path) -> list[str]:
    """Every reader on every run of the store: the errors raised (none expected)."""
    errors = []
    try:
        runs = read_runs(store)
        for run_id in runs["run_id"]:
            read_steps(store, run_id)
            read_evals(store, run_id)
            read_groups(store, run_id)
            read_rollouts(store, run_id)
    except Exception as error:  # noqa: BLE001 - counted and reported
        errors.append(f"{type(error).__name__}: {error}")
    return errors


def verify(store: Path, run_id: str, reference: list[float] | None) -> dict:
    """Steps and evaluations lost or doubled, whether the run finished, and whether it equals the reference."""
    steps = read_steps(store, run_id)
    evals = read_evals(store, run_id)
    evals = evals[evals["split"] == "test"]
    rollouts = read_rollouts(store, run_id, columns=["step"])
    per_step = rollouts["step"].value_counts().to_dict()
    step_list, eval_list = steps["step"].tolist(), evals["step"].tolist()
    return {
        "steps_lost": len(set(range(STEPS)) - set(step_list)),
        "steps_doubled": len(step_list) - len(set(step_list)),
        "evals_lost": len(set(EXPECTED_EVALS) - set(eval_list)),
        "evals_doubled": len(eval_list) - len(set(eval_list)),
        "rollouts_mismatched": sum(per_step.get(s, 0) != n for s, n in zip(step_list, steps["rollouts_sampled"])),
        "finished": read_runs(store).set_index("run_id").loc[run_id, "status"] == "finished",
        "exact": reference is not None and len(step_list) == len(reference) and all(
            abs(a - b) < 1e-9 for a, b in zip(steps["reward_mean"].tolist(), reference)),
    }


def kill_trial(store: Path, index: int, rng: random.Random, duration: float, reference: list[float],
               points: tuple[str, ...] = faults.POINTS) -> dict:
    """Trial `index`: even ones kill at a named point (`points` in turn, a random visit of it), odd ones after a
    random delay; then resume (killed again at random, 1 in 3) until the run finishes, and verify."""
    name = f"trial-{index}"
    if index % 2 == 0:
        point = points[(index // 2) % len(points)]
        kill = f"{point}:{rng.randint(1, VISITS[point])}"
        rc, _ = launch(train_command(store, name), kill_at=kill)
    else:
        kill = f"random time {rng.uniform(0.2, 0.8) * duration:.1f}s"  # the reference run also generated the data set
        rc, _ = launch(train_command(store, name), kill_after=float(kill.split()[2][:-1]))
    if rc not in (0, -9):
        raise RuntimeError(f"{name}: training failed ({rc}) instead of being killed")
    run_id = run_id_of(store, name)
    if rc == 0:
        kills, landed = 0, ["after the run finished"]
    else:
        kills, landed = 1, [f"at {kill.split(':')[0]}" if ":" in kill else where_it_landed(store, run_id)]
    reader_errors = readers_open(store)
    damaged, temps = killed_store(store)
    launches = 1
    while run_id is None or read_runs(store).set_index("run_id").loc[run_id, "status"] != "finished":
        command = train_command(store, name, resume=run_id)
        again = rng.random() < 1 / 3 and launches < 4
        rc, err = launch(command, kill_after=rng.uniform(0.3, 1.0) * duration if again else None)
        launches += 1
        run_id = run_id or run_id_of(store, name)
        if rc != 0:
            if not again or rc != -9:
                raise RuntimeError(f"{name}: resume failed ({rc}): {err[-2000:]}")
            kills += 1
            landed.append(where_it_landed(store, run_id))
            reader_errors += readers_open(store)
            more_damaged, more_temps = killed_store(store)
            damaged, temps = damaged + more_damaged, temps + more_temps
    return {"trial": name, "kill": kill, "kills": kills, "landed": landed, "launches": launches,
            "reader_errors": reader_errors, "damaged": damaged, "temp_files": temps,
            **verify(store, run_id, reference)}


def killed_store(store: Path) -> tuple[int, int]:
    """(damaged files, temp files) `store check` names in a store just killed: a write killed midway leaves its
    temp file (named, never read, removed by the next writer), never a damaged file."""
    found = check_store(store)
    temps = sum(d.temp_file for d in found)
    return len(found) - temps, temps


DAMAGES = ("truncated", "bit-flipped", "missing")


def damage_checkpoint(folder: Path, how: str, rng: random.Random) -> str:
    """Damage a checkpoint folder: truncate its trainer.pt to 1000 bytes, flip one random bit of it (each byte as
    likely: mostly the weights or the optimiser state), or delete a random file; returns the file damaged (relative
    to the folder)."""
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
    if how == "truncated":
        name = "trainer.pt"
    elif how == "bit-flipped":
        name = rng.choices(files, weights=[(folder / f).stat().st_size for f in files])[0]
    else:
        name = rng.choice(files)
    path = folder / name
    if how == "truncated":
        os.truncate(path, 1000)
    elif how == "bit-flipped":
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    return name


def store_check(store: Path, *extra: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "fastrl_app.cli", "store", "check", str(store), *extra], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, done.stdout


def messages(err: str) -> list[str]:
    """stderr's lines without the progress bars (and the cursor moves they leave)."""
    lines = (re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).strip() for line in err.splitlines())
    return [line for line in lines if line and "%|" not in line]


def damage_trial(store: Path, index: int, rng: random.Random, reference: list[float]) -> dict:
    """Damaged-checkpoint trial `index`: the kinds of DAMAGES in turn; odd trials damage the only checkpoint."""
    name, how, previous = f"damage-{index}", DAMAGES[index % len(DAMAGES)], index % 2 == 0
    rc, _ = launch(train_command(store, name), kill_at=f"checkpoint.pointed:{2 if previous else 1}")
    if rc != -9:
        raise RuntimeError(f"{name}: training was not killed ({rc})")
    run_id = run_id_of(store, name)
    newest = checkpoints.find_latest(checkpoints.root(store, run_id))
    damaged = damage_checkpoint(newest, how, rng)
    check_rc, check_out = store_check(store)
    named = check_rc == 1 and any(line.startswith(f"damaged: checkpoints/{run_id}/{newest.name}: ")
                                  for line in check_out.splitlines())
    rc, err = launch(train_command(store, name, resume=run_id))
    lines = messages(err)
    result = {"trial": name, "damage": how, "file": damaged, "checkpoint": newest.name, "named_by_store_check": named,
              "resume_returncode": rc, "resume_lines": lines, "traceback": "Traceback" in err}
    if previous:
        result["fell_back_in_one_line"] = rc == 0 and len(lines) == 1 and "resuming from the previous whole" in lines[0]
    else:
        result["refused_in_one_line"] = rc == 2 and len(lines) == 1 and "no whole checkpoint to resume from" in lines[0]
        quarantine_rc, _ = store_check(store, "--quarantine")
        rc, err = launch(train_command(store, name, resume=run_id))
        if quarantine_rc != 0 or rc != 0:
            raise RuntimeError(f"{name}: quarantine ({quarantine_rc}) or the resume after it ({rc}) failed: "
                               f"{err[-2000:]}")
    return {**result, **verify(store, run_id, reference)}


def disk_full_trial(workdir: Path, reference_size: int, reference: list[float]) -> dict:
    """Train on a tmpfs too small for the run, then grow it and resume. Skipped (with why) where mount fails."""
    mount = workdir / "small-disk"
    mount.mkdir(parents=True, exist_ok=True)
    size_kb = max(reference_size * 6 // 10 // 1024, 512)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"skipped": f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode} (needs root)"}
    try:
        store = mount / "store"
        rc, err = launch(train_command(store, "disk-full"))
        lines = [line for line in err.splitlines() if line.startswith("fastrl: error")]
        run_id = run_id_of(store, "disk-full")
        status = None if run_id is None else read_runs(store).set_index("run_id").loc[run_id, "state"]
        reader_errors = readers_open(store)
        damaged = len(check_store(store))
        latest = None if run_id is None else checkpoints.find_latest(checkpoints.root(store, run_id))
        subprocess.run(["mount", "-o", f"remount,size={size_kb * 4}k", str(mount)], check=True)
        rc2, err2 = launch(train_command(store, "disk-full", resume=run_id))
        if rc2 != 0:
            raise RuntimeError(f"disk-full resume failed ({rc2}): {err2[-2000:]}")
        run_id = run_id or run_id_of(store, "disk-full")
        return {"disk_kb": size_kb, "returncode": rc, "message": lines, "traceback": "Traceback" in err,
                "state_after": status, "checkpoint_after": None if latest is None else latest.name,
                "reader_errors": reader_errors, "damaged": damaged, **verify(store, run_id, reference)}
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def run_campaign(trials: int, seed: int, workdir: Path, *, disk_full: bool = True,
                 points: tuple[str, ...] = faults.POINTS, damage_trials: int = 6) -> dict:
    rng = random.Random(seed)
    reference_store = workdir / "reference"
    start = time.time()
    rc, err = launch(train_command(reference_store, "reference"))
    duration = time.time() - start
    if rc != 0:
        raise RuntimeError(f"the reference run failed: {err[-2000:]}")
    reference_id = run_id_of(reference_store, "reference")
    reference = read_steps(reference_store, reference_id)["reward_mean"].tolist()
    size = sum(p.stat().st_size for p in reference_store.rglob("*") if p.is_file())
    store = workdir / "store"
    results = [kill_trial(store, i, rng, duration, reference, points) for i in range(trials)]
    figures = {
        "runs": len(results), "kills": sum(r["kills"] for r in results),
        "landed": dict(collections.Counter(where for r in results for where in r["landed"])),
        "named_points": sorted({r["kill"].split(":")[0] for r in results if ":" in r["kill"]}),
        "steps_lost": sum(r["steps_lost"] for r in results), "steps_doubled": sum(r["steps_doubled"] for r in results),
        "evals_lost": sum(r["evals_lost"] for r in results), "evals_doubled": sum(r["evals_doubled"] for r in results),
        "rollouts_mismatched": sum(r["rollouts_mismatched"] for r in results),
        "finished": sum(r["finished"] for r in results), "exact": sum(r["exact"] for r in results),
        "reader_errors": sum(len(r["reader_errors"]) for r in results),
        "files_damaged": sum(r["damaged"] for r in results),
        "temp_files_left": sum(r["temp_files"] for r in results),
        "files_skipped_by_readers": len(damaged_files(store)),
        "store_check_at_end": len(check_store(store)),
        "trials": results,
    }
    damaged = [damage_trial(workdir / "damaged", i, rng, reference) for i in range(damage_trials)]
    figures["damaged_checkpoints"] = {
        "runs": len(damaged), "kinds": dict(collections.Counter(d["damage"] for d in damaged)),
        "named_by_store_check": sum(d["named_by_store_check"] for d in damaged),
        "with_a_previous": sum("fell_back_in_one_line" in d for d in damaged),
        "fell_back_in_one_line": sum(d.get("fell_back_in_one_line", False) for d in damaged),
        "without_one": sum("refused_in_one_line" in d for d in damaged),
        "refused_in_one_line": sum(d.get("refused_in_one_line", False) for d in damaged),
        "tracebacks": sum(d["traceback"] for d in damaged),
        "finished": sum(d["finished"] for d in damaged), "exact": sum(d["exact"] for d in damaged),
        "steps_lost": sum(d["steps_lost"] + d["steps_doubled"] for d in damaged),
        "evals_lost": sum(d["evals_lost"] + d["evals_doubled"] for d in damaged),
        "store_check_at_end": len(check_store(workdir / "damaged")) if damaged else 0,
        "trials": damaged,
    }
    if disk_full:
        figures["disk_full"] = disk_full_trial(workdir, size, reference)
    return figures


def report(figures: dict) -> str:
    lines = [f"runs {figures['runs']}, kills {figures['kills']} (SIGKILL), all resumed: {figures['finished']} "
             f"finished, {figures['exact']} identical to the uninterrupted run",
             "kills landed: " + ", ".join(f"{where} {n}" for where, n in sorted(figures["landed"].items())),
             f"named points hit: {', '.join(figures['named_points'])}",
             f"steps lost {figures['steps_lost']}, doubled {figures['steps_doubled']}; evaluations lost "
             f"{figures['evals_lost']}, doubled {figures['evals_doubled']}; steps with missing or extra rollouts "
             f"{figures['rollouts_mismatched']}",
             f"reader errors while killed {figures['reader_errors']}; files damaged {figures['files_damaged']}, "
             f"temp files left by killed writes {figures['temp_files_left']} (removed by the resumed run), "
             f"skipped by readers {figures['files_skipped_by_readers']}; `store check` at the end: "
             f"{figures['store_check_at_end']} damaged"]
    damaged = figures.get("damaged_checkpoints")
    if damaged and damaged["runs"]:
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(damaged["kinds"].items()))
        lines.append(f"damaged checkpoints {damaged['runs']} ({kinds}): named by `store check` "
                     f"{damaged['named_by_store_check']}; with a previous checkpoint {damaged['with_a_previous']}, "
                     f"resume fell back to it in one line {damaged['fell_back_in_one_line']}; without one "
                     f"{damaged['without_one']}, resume stopped in one line with exit 2 {damaged['refused_in_one_line']}"
                     f" (then quarantined and restarted); tracebacks {damaged['tracebacks']}; finished "
                     f"{damaged['finished']}, identical to the uninterrupted run {damaged['exact']}; steps lost or "
                     f"doubled {damaged['steps_lost']}, evaluations {damaged['evals_lost']}; `store check` at the end: "
                     f"{damaged['store_check_at_end']} damaged")
    disk = figures.get("disk_full")
    if disk and "skipped" in disk:
        lines.append(f"full disk: skipped ({disk['skipped']})")
    elif disk:
        lines.append(f"full disk ({disk['disk_kb']} KiB tmpfs): exit {disk['returncode']}, "
                     f"{'a traceback' if disk['traceback'] else 'no traceback'}, message {disk['message']}, run "
                     f"'{disk['state_after']}', last checkpoint {disk['checkpoint_after']}, reader errors "
                     f"{len(disk['reader_errors'])}, files damaged {disk['damaged']}; after growing the disk and "
                     f"--resume: steps lost {disk['steps_lost']}, evaluations lost {disk['evals_lost']}, "
                     f"finished {disk['finished']}, identical {disk['exact']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--damage-trials", type=int, default=6, help="runs whose newest checkpoint is damaged "
                        "(truncated, bit-flipped, a file missing in turn; every other one has no previous checkpoint)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp folder, removed at the end")
    parser.add_argument("--no-disk-full", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write every figure and trial here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fastrl-faults-"))
    try:
        figures = run_campaign(args.trials, args.seed, workdir, disk_full=not args.no_disk_full,
                               damage_trials=args.damage_trials)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    print(report(figures))
    lost = figures["steps_lost"] + figures["evals_lost"] + figures["steps_doubled"] + figures["evals_doubled"]
    damaged = figures["damaged_checkpoints"]
    missed = damaged["runs"] - damaged["exact"] + damaged["runs"] - damaged["named_by_store_check"] + (
        damaged["with_a_previous"] - damaged["fell_back_in_one_line"]) + (
        damaged["without_one"] - damaged["refused_in_one_line"]) + damaged["store_check_at_end"]
    return 1 if lost or missed or figures["reader_errors"] or figures["store_check_at_end"] else 0


if __name__ == "__main__":
    sys.exit(main())
