"""Issue 39, "nothing lost, nothing hidden": resume keeps every evaluation, runs are marked however they end, one
writer per run, checkpoints swapped atomically, damaged store files skipped / named / quarantined, a copied store
reads its own files, and every bad input is one line before anything heavy loads. The kill -9 and full-disk
campaign is tests/test_fault_injection.py."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from fastrl_app.cli import main as cli_main
from fastrl_core import checkpoints
from fastrl_core.data.problems import DataError, load_problems
from fastrl_core.run_config import load_config
from fastrl_core.run_loop import run_interleaved
from fastrl_core.store import (DamagedFile, RunLocked, RunWriter, check_store, compact, damaged_files, layout,
                               read_evals, read_groups, read_image, read_rollouts, read_runs, read_steps, run_state)
from fastrl_core.store.fake_runs import write_fake_run
from fastrl_core.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
TINY = {"steps": 4, "prompts_per_step": 4, "rollouts_per_prompt": 4, "eval_every": 0, "checkpoint_every": 0,
        "threads": 1, "synthetic_train": 64, "synthetic_test": 16, "eval_size": 16, "max_new_tokens": 16}


def _overrides(store, **overrides) -> list[str]:
    return [f"{k}={v}" for k, v in {"store_dir": str(store), **TINY, **overrides}.items()]


def _config(store, **overrides):
    return load_config("embedded", _overrides(store, **overrides))


def _crash_at(monkeypatch, step: int, error: BaseException) -> None:
    """Trainer.train_step raises `error` when the trainer reaches `step` (the step is not written)."""
    original = Trainer.train_step

    def train_step(self):
        if self.step == step:
            raise error
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", train_step)


def _only_run(store) -> str:
    (run_id,) = layout.list_runs(store)
    return run_id


# ------------------------------------------------------------------------------------------- resume and lifecycle

def test_resume_keeps_the_evaluation_at_the_checkpoint_step_and_marks_the_crash(tmp_path, monkeypatch):
    config = _config(tmp_path, steps=6, eval_every=2, checkpoint_every=2)
    _crash_at(monkeypatch, 5, RuntimeError("simulated crash\nwith a second line"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        Trainer(config, progress=False).run()
    run_id = _only_run(tmp_path)
    run = read_runs(tmp_path).iloc[0]
    assert (run["status"], run["error"], run["state"]) == ("failed", "RuntimeError: simulated crash", "failed")
    assert read_steps(tmp_path, run_id)["step"].tolist() == [0, 1, 2, 3, 4]  # step 4 came after the checkpoint
    monkeypatch.undo()

    Trainer(config, resume=run_id, progress=False).run()
    evals = read_evals(tmp_path, run_id)
    assert evals["step"].tolist() == [0, 2, 4, 6]  # the one at the checkpoint's step (4) is kept, none twice
    assert read_steps(tmp_path, run_id)["step"].tolist() == list(range(6))
    run = read_runs(tmp_path).iloc[0]
    assert (run["status"], run["error"]) == ("finished", None)


def test_a_run_killed_before_its_first_checkpoint_restarts_from_its_initial_state(tmp_path, monkeypatch):
    straight = Trainer(_config(tmp_path / "a", eval_every=2), progress=False)
    straight.run()
    config = _config(tmp_path / "b", eval_every=2)
    _crash_at(monkeypatch, 3, RuntimeError("boom"))
    with pytest.raises(RuntimeError):
        Trainer(config, progress=False).run()
    run_id = _only_run(tmp_path / "b")
    assert not checkpoints.find_latest(checkpoints.root(tmp_path / "b", run_id))
    monkeypatch.undo()
    resumed = Trainer(config, resume=run_id, progress=False)
    assert resumed.step == 0
    resumed.run()
    steps_a, steps_b = read_steps(tmp_path / "a", straight.writer.run_id), read_steps(tmp_path / "b", run_id)
    assert steps_b["step"].tolist() == [0, 1, 2, 3]
    assert steps_b["reward_mean"].tolist() == pytest.approx(steps_a["reward_mean"].tolist())
    assert read_evals(tmp_path / "b", run_id)["step"].tolist() == [0, 2, 4]


def test_ctrl_c_marks_the_run_stopped_and_a_second_writer_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    config = _config(tmp_path, checkpoint_every=1)
    _crash_at(monkeypatch, 2, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        Trainer(config, progress=False).run()
    run_id = _only_run(tmp_path)
    run = read_runs(tmp_path).iloc[0]
    assert (run["status"], run["error"]) == ("stopped", "stopped by SIGINT (Ctrl-C)")
    monkeypatch.undo()

    first = Trainer(config, resume=run_id, progress=False)  # holds the run's lock
    with pytest.raises(RunLocked, match=f"run '{run_id}' in .* is being written by another process"):
        Trainer(config, resume=run_id, progress=False)
    capsys.readouterr()
    assert cli_main(["train", "embedded", *_overrides(tmp_path, checkpoint_every=1),
                     "--resume", run_id]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fastrl: error: run '{run_id}' in ") and "another process" in err[0]
    first.run()
    assert read_steps(tmp_path, run_id)["step"].tolist() == [0, 1, 2, 3]


def test_sigterm_marks_the_run_stopped_and_prints_one_line(tmp_path):
    command = [sys.executable, "-m", "fastrl_app.cli", "train", "embedded",
               *_overrides(tmp_path, steps=500)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.time() + 120
    while not list(tmp_path.glob("runs/*/steps/step_000001.parquet")) and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    lines = [line for line in err.splitlines() if line.startswith(("fastrl: stopped", "fastrl: error"))]
    run_id = _only_run(tmp_path)  # the real id and the command that continues the run, not a placeholder
    assert lines == [f"fastrl: stopped by SIGTERM; run {run_id} is marked stopped; `fastrl train --resume {run_id} "
                     f"store_dir={tmp_path}` continues it"] and "Traceback" not in err
    run = read_runs(tmp_path).iloc[0]
    assert (run["status"], run["error"]) == ("stopped", "stopped by SIGTERM")


def test_a_writer_killed_without_a_word_shows_no_heartbeat_and_frees_its_run(tmp_path):
    code = ("import os, signal; from fastrl_core.store import RunWriter; "
            f"w = RunWriter({str(tmp_path)!r}, name='killed', config={{}}, model='m', dataset='d', objective='o', "
            "pruner='p', budget='b'); os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    run_id = _only_run(tmp_path)
    assert read_runs(tmp_path).iloc[0]["state"] == "running"  # a fresh heartbeat: it could still be alive
    beat = layout.heartbeat_file(tmp_path, run_id)
    os.utime(beat, (time.time() - 3600, time.time() - 3600))
    run = read_runs(tmp_path).iloc[0]
    assert (run["status"], run["state"]) == ("running", "no heartbeat")
    assert run_state("running", time.time() - 5) == "running" and run_state("finished", 0.0) == "finished"
    RunWriter.resume(tmp_path, run_id).finish("stopped", "resumed and stopped")  # the OS freed its lock


def test_interleaved_runs_share_one_loop_and_report_each_step(tmp_path):
    trainers = {name: Trainer(_config(tmp_path, steps=2, run_name=name, eval_every=2), progress=False)
                for name in ("first", "second")}
    seen = []
    ids = run_interleaved(trainers, on_step=lambda name, trainer, row, accuracy: seen.append(
        (name, row["step"], accuracy is not None)))
    assert sorted(seen) == [("first", 0, False), ("first", 1, True), ("second", 0, False), ("second", 1, True)]
    runs = read_runs(tmp_path).set_index("run_id")
    assert (runs.loc[list(ids.values()), "status"] == "finished").all()


# ------------------------------------------------------------------------------------------------- checkpoints

def _write_ok(folder: Path) -> None:
    (folder / "policy").mkdir()
    (folder / "policy" / "weights").write_bytes(b"w")
    (folder / "trainer.pt").write_bytes(b"t")
    (folder / "budget.json").write_text("{}")


def test_a_checkpoint_swap_always_leaves_whole_checkpoints_the_newest_and_the_previous(tmp_path):
    root = tmp_path / "checkpoints" / "run"
    assert checkpoints.save(root, 2, _write_ok) == root / "step_000002"
    assert (root / "latest").read_text() == "step_000002"

    def disk_full(folder: Path) -> None:
        (folder / "policy").mkdir()
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        checkpoints.save(root, 4, disk_full)
    assert checkpoints.find_latest(root) == root / "step_000002"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002"]  # the temp folder went with it

    (root / ".tmp-step_000006-999").mkdir()  # a writer killed mid-save: never read, cleaned by the next save
    (root / ".tmp-step_000006-999" / "trainer.pt").write_bytes(b"half")
    assert checkpoints.find_latest(root) == root / "step_000002"
    shutil.copytree(root / "step_000002", root / "step_000008")  # killed after the rename, before the pointer
    assert checkpoints.find_latest(root) in (root / "step_000002", root / "step_000008")
    (root / "latest").unlink()
    assert checkpoints.find_latest(root) == root / "step_000008"
    checkpoints.save(root, 10, _write_ok)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000008", "step_000010"]  # and the previous
    checkpoints.save(root, 12, _write_ok)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000010", "step_000012"]
    assert (root / "step_000012" / "manifest.json").is_file()

    old = tmp_path / "checkpoints" / "old"  # the layout before step folders: the old swap's complete .tmp is used
    old.with_name("old.tmp").mkdir()
    _write_ok(old.with_name("old.tmp"))
    assert checkpoints.find_latest(old) == old.with_name("old.tmp")


def test_a_kill_while_an_old_checkpoint_is_deleted_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """Deleting the checkpoint two saves back is one rename, then the deletion: a kill midway (here: the deletion
    stops after one file) leaves a temp folder that is never read and that the next save removes, not a step folder
    with its manifest and half its files (which `store check` names as damaged; CI's fault campaign found one)."""
    root = tmp_path / "checkpoints" / "run"
    for step in (2, 4):
        checkpoints.save(root, step, _write_ok)
    real_rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):
        next(p for p in Path(path).rglob("*") if p.is_file()).unlink()
        raise KeyboardInterrupt  # what a SIGKILL would leave: the deletion stopped, nothing else ran

    monkeypatch.setattr(checkpoints.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(root, 6, _write_ok)
    monkeypatch.setattr(checkpoints.shutil, "rmtree", real_rmtree)
    assert [folder.name for _, folder in layout.checkpoint_folders(root)] == ["step_000004", "step_000006"]
    assert all(checkpoints.manifest_problem(root / f"step_{s:06d}") is None for s in (4, 6))
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] == [f".tmp-gone-step_000002-{os.getpid()}"]
    checkpoints.save(root, 8, _write_ok)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000006", "step_000008"]


# --------------------------------------------------------------------------------------------- damaged files

def _damage(store: Path, run_id: str) -> dict[str, Path]:
    run_dir = layout.run_dir(store, run_id)
    files = {table: run_dir / table / f"step_{step:06d}.parquet"
             for table, step in (("steps", 1), ("rollouts", 2), ("groups", 3), ("images", 0))}
    data = files["steps"].read_bytes()
    files["steps"].write_bytes(data[: len(data) // 2])  # truncated
    data = files["rollouts"].read_bytes()
    files["rollouts"].write_bytes(data[: len(data) - 10])
    files["groups"].unlink()  # deleted
    files["images"].write_bytes(b"junk" * 100)
    return files


def test_damaged_files_are_skipped_named_and_quarantined(tmp_path, capsys):
    run_id = write_fake_run(tmp_path, steps=6, prompts=3, rollouts_per_prompt=4, sketch_dim=8)
    image_ref = read_rollouts(tmp_path, run_id, step=0, columns=["image_ref"], limit=1)["image_ref"][0]
    _damage(tmp_path, run_id)

    runs = read_runs(tmp_path)
    assert runs.iloc[0]["steps"] == 5  # step 1's steps file is damaged: the step is not visible
    assert read_steps(tmp_path, run_id)["step"].tolist() == [0, 2, 3, 4, 5]
    assert sorted(set(read_rollouts(tmp_path, run_id)["step"])) == [0, 3, 4, 5]
    assert sorted(set(read_groups(tmp_path, run_id)["step"])) == [0, 2, 4, 5]
    with pytest.raises(DamagedFile, match=f"runs/{run_id}/images/step_000000.parquet"):
        read_image(tmp_path, run_id, image_ref)  # its images file is junk: named, never served from elsewhere
    assert compact(tmp_path, run_id).exists()
    named = damaged_files(tmp_path)
    prefix = f"runs/{run_id}/"
    assert set(named) == {prefix + "steps/step_000001.parquet", prefix + "rollouts/step_000002.parquet",
                          prefix + "groups/step_000003.parquet", prefix + "images/step_000000.parquet"}
    assert named[prefix + "groups/step_000003.parquet"] == "missing"

    assert [d.path for d in check_store(tmp_path)] == sorted(named)
    assert cli_main(["store", "check", str(tmp_path)]) == 1
    assert cli_main(["store", "check", str(tmp_path), "--quarantine"]) == 0
    printed = capsys.readouterr().out
    assert f"damaged: {prefix}groups/step_000003.parquet: missing" in printed and "quarantined:" in printed
    assert check_store(tmp_path) == [] and cli_main(["store", "check", str(tmp_path)]) == 0
    assert read_steps(tmp_path, run_id)["step"].tolist() == [0, 4, 5]  # damaged steps went whole
    assert (tmp_path / "quarantine" / "runs" / run_id / "steps" / "step_000003.parquet").exists()
    assert damaged_files(tmp_path) == {}


def test_the_app_shows_a_notice_naming_a_damaged_file_instead_of_a_traceback(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    run_id = write_fake_run(tmp_path, steps=4, prompts=3, rollouts_per_prompt=4, sketch_dim=8)
    steps_file = layout.step_file(tmp_path, run_id, "steps", 2)
    steps_file.write_bytes(steps_file.read_bytes()[:100])
    monkeypatch.setenv("FASTRL_STORE", str(tmp_path))
    for page in (None, "views/budget.py"):
        at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=60)
        if page:
            at.switch_page(page)
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert any(f"1 damaged steps file skipped: runs/{run_id}/steps/step_000002.parquet" in w.value
                   for w in at.warning), [w.value for w in at.warning]
    assert 'showErrorDetails = "none"' in (REPO / ".streamlit" / "config.toml").read_text()


def test_a_copied_store_reads_its_own_files(tmp_path):
    original = tmp_path / "original"
    write_fake_run(original, steps=3, prompts=2, rollouts_per_prompt=2)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    with layout.open_views(copy) as con:
        assert con.sql("SELECT count(*) FROM steps").fetchall() == [(3,)]
    done = subprocess.run([sys.executable, "-c", "import duckdb; print(duckdb.connect('store.duckdb', "
                           "read_only=True).sql('SELECT count(*) FROM rollouts').fetchall())"],
                          cwd=copy, capture_output=True, text=True)
    assert done.stdout.strip() == "[(12,)]", done.stderr


# ------------------------------------------------------------------------------------------------ bad inputs

def _png(width: int = 4, height: int = 4, *, undecodable: bool = False) -> bytes:
    """A grey PNG; `undecodable`: its IDAT holds bytes that are not zlib data, with a valid CRC."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    idat = b"\x78\x9c not zlib at all" if undecodable else zlib.compress(raw)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_a_png_with_valid_checksums_that_does_not_decode_is_a_bad_row(tmp_path):
    (tmp_path / "good.png").write_bytes(_png())
    (tmp_path / "bad.png").write_bytes(_png(undecodable=True))
    rows = ['{"id": "a", "question": "q", "answer": "1", "image": "good.png"}',
            '{"id": "b", "question": "q", "answer": "1", "image": "bad.png"}']
    (tmp_path / "problems.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"row 1 \(id 'b'\): image '.*bad.png' unreadable"):
        load_problems(tmp_path)
    loaded = load_problems(tmp_path, skip_bad=True)
    assert [p.id for p in loaded] == ["a"] and len(loaded.skipped) == 1


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if a data set is generated or a model loads."""
    import fastrl_core.policy
    import fastrl_core.trainer

    def refuse(*args, **kwargs):
        raise AssertionError("loaded data or a model before the up-front checks")

    monkeypatch.setattr(fastrl_core.trainer, "load_datasets", refuse)
    monkeypatch.setattr(fastrl_core.policy, "load_policy", refuse)


def _error_line(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastrl: error: "), captured.err
    return lines[0]


def test_bad_inputs_are_one_line_before_anything_loads(tmp_path, capsys, nothing_loads):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("steps: 3\nrun_name: caf\u00e9\n".encode("latin-1"))
    assert _error_line(capsys, ["train", str(config)]) == (
        f"fastrl: error: {config}: not UTF-8 text (byte 0xe9 at offset 22)")

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert _error_line(capsys, ["train", f"store_dir={a_file}"]) == (
        f"fastrl: error: store_dir='{a_file}' is a file (the store must be a folder)")
    assert _error_line(capsys, ["train", f"store_dir={a_file}/store"]) == (
        f"fastrl: error: store_dir='{a_file}/store' cannot be made: '{a_file}' is a file (the store must be a folder)")
    assert _error_line(capsys, ["train", f"store_dir={tmp_path}/s", "run_name="]) == (
        "fastrl: error: run_name='' is empty; give a name (letters, digits, '.', '_', '-'; a timestamp is appended "
        "for the run id)")
    assert _error_line(capsys, ["train", f"store_dir={tmp_path}/s", "--resume", "nosuchrun"]) == (
        f"fastrl: error: --resume 'nosuchrun': no such run in store '{tmp_path}/s' (it has no runs)")
    assert not (tmp_path / "s" / "data").exists()


def test_an_empty_dataset_is_one_line(tmp_path, capsys):
    dataset = tmp_path / "empty"
    dataset.mkdir()
    (dataset / "problems.jsonl").write_text("")
    with pytest.raises(DataError, match="no problems"):
        load_problems(dataset)
    assert _error_line(capsys, ["train", f"dataset={dataset}", f"store_dir={tmp_path}/store"]) == (
        f"fastrl: error: {dataset / 'problems.jsonl'}: no problems (the file has no rows)")


# ------------------------------------------------------------------------ a run's record is its truth (issue 46)

@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> tuple[Path, str, list[float]]:
    """A run stopped after 3 of its 4 steps with a checkpoint after each (so steps 2 and 3 are kept), and the
    per-step rewards of the same run trained straight through."""
    root = tmp_path_factory.mktemp("stopped")
    trainer = Trainer(_config(root / "store", checkpoint_every=1), progress=False)
    for _ in range(3):
        trainer.train_step()
        trainer.save_checkpoint()
    trainer.writer.finish("stopped", "stopped by SIGINT (Ctrl-C)")
    straight = Trainer(_config(root / "straight", checkpoint_every=1), progress=False)
    straight.run()
    return root / "store", trainer.writer.run_id, read_steps(root / "straight", straight.writer.run_id)[
        "reward_mean"].tolist()


def _copy(stopped, tmp_path) -> tuple[Path, str]:
    source, run_id, _ = stopped
    shutil.copytree(source, tmp_path / "store")  # a copied store reads its own files
    return tmp_path / "store", run_id


def _train_cli(store: Path, *args: str, **overrides) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastrl_app.cli", "train", "embedded",
                           *_overrides(store, checkpoint_every=1, **overrides), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})


def _messages(err: str) -> list[str]:
    """stderr without the progress bars (and the cursor moves they leave)."""
    lines = (re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).strip() for line in err.splitlines())
    return [line for line in lines if line and "%|" not in line]


def test_a_resume_with_changed_overrides_is_refused_in_one_line_naming_the_keys(stopped, tmp_path, capsys):
    store, run_id = _copy(stopped, tmp_path)
    before = (layout.run_dir(store, run_id) / "run.json").read_text()
    argv = ["train", "embedded", *_overrides(store, checkpoint_every=1), "lr=1e-3",
            "pruner=none", "--resume", run_id]
    assert _error_line(capsys, argv) == (
        f"fastrl: error: --resume {run_id}: lr (0.0002 -> 0.001), pruner ('fastrl' -> 'none') differ from the run's "
        "record; a resume continues the run under its own config: drop these overrides, or change them from the step "
        "it resumes at with --allow-change lr,pruner")
    assert _error_line(capsys, [*argv, "--allow-change", "lr"]) == (  # only the keys named are allowed
        f"fastrl: error: --resume {run_id}: pruner ('fastrl' -> 'none') differs from the run's record; a resume "
        "continues the run under its own config: drop these overrides, or change them from the step it resumes at "
        "with --allow-change pruner")
    assert (layout.run_dir(store, run_id) / "run.json").read_text() == before  # nothing written, nothing trained
    assert read_steps(store, run_id)["step"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("override, key, old, new", [
    ("seed=1", "seed", "0", "1"), ("model=other/model", "model", "'embedded'", "'other/model'"),
    ("rollouts_per_prompt=8", "rollouts_per_prompt", "4", "8"), ("prompts_per_step=2", "prompts_per_step", "4", "2"),
    ("dataset_skip_bad=true", "dataset_skip_bad", "False", "True"), ("budget=fixed", "budget", "'adaptive'", "'fixed'"),
])
def test_what_defines_a_run_cannot_change_on_resume_even_when_allowed(stopped, tmp_path, capsys, override, key, old,
                                                                       new):
    from fastrl_core.resume import FIXED_ON_RESUME

    store, run_id = _copy(stopped, tmp_path)
    argv = ["train", "embedded", *_overrides(store, checkpoint_every=1), override,
            "--resume", run_id]
    assert _error_line(capsys, argv) == (
        f"fastrl: error: --resume {run_id}: {key} ({old} -> {new}: {FIXED_ON_RESUME[key]}) cannot change when a run "
        "resumes; give the run's own values, or start a new run")
    assert _error_line(capsys, [*argv, "--allow-change", key]) == (
        f"fastrl: error: --allow-change {key}: {key} cannot change when a run resumes ({FIXED_ON_RESUME[key]}); "
        "start a new run for it")


def test_allow_change_is_checked(stopped, tmp_path, capsys):
    store, run_id = _copy(stopped, tmp_path)
    base = ["train", "embedded", *_overrides(store, checkpoint_every=1)]
    assert _error_line(capsys, [*base, "--allow-change", "lr"]) == (
        "fastrl: error: --allow-change needs --resume RUN_ID (it lets a resumed run's config change)")
    assert _error_line(capsys, [*base, "--resume", run_id, "--allow-change", "lrr"]).startswith(
        "fastrl: error: --allow-change 'lrr': unknown config key; valid keys: accuracy_weight")


def test_an_allowed_change_is_trained_with_and_recorded_from_the_step_it_applies_to(stopped, tmp_path, capsys,
                                                                                    caplog):
    store, run_id = _copy(stopped, tmp_path)
    assert cli_main(["train", "embedded", *_overrides(store, checkpoint_every=1),
                     "lr=1e-3", "pruner=none", "--resume", run_id, "--allow-change", "lr,pruner"]) == 0
    assert f"run {run_id}: lr 0.0002 -> 0.001 from step 3 on (allowed; in the run's config history)" in caplog.text
    meta = layout.read_run_json(store, run_id)
    assert (meta["config"]["lr"], meta["config"]["pruner"], meta["pruner"]) == (1e-3, "none", "none")
    (entry,) = meta["config_history"]
    assert (entry["step"], entry["changes"]) == (3, {"lr": {"from": 2e-4, "to": 1e-3},
                                                     "pruner": {"from": "fastrl", "to": "none"}})
    steps = read_steps(store, run_id)
    warmup = load_config("embedded").warmup_steps
    assert steps["lr"].tolist() == pytest.approx([2e-4 * min(1, (s + 1) / warmup) for s in range(3)]
                                                 + [1e-3 * min(1, 4 / warmup)])  # the new lr from step 3 on
    kept = read_rollouts(store, run_id, step=3)
    assert set(kept.loc[~kept["kept"], "reason"]) <= {"DUPLICATE"}  # pruner none: only copies are left out
    assert json.loads(read_runs(store).iloc[0]["config_history"]) == meta["config_history"]
    capsys.readouterr()
    # the next resume is under the record as it is now: the same command line is no change
    assert cli_main(["train", "embedded", *_overrides(store, checkpoint_every=1),
                     "lr=1e-3", "pruner=none", "--resume", run_id]) == 0


def test_a_resume_needs_only_the_store_its_config_comes_from_the_record(stopped, tmp_path):
    store, run_id = _copy(stopped, tmp_path)
    done = subprocess.run([sys.executable, "-m", "fastrl_app.cli", "train", f"store_dir={store}", "--resume", run_id],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    steps = read_steps(store, run_id)  # 4 steps of 4 prompts x 4 rollouts, as recorded, not the defaults' 100 x 16
    assert steps["step"].tolist() == [0, 1, 2, 3] and (steps["rollouts_sampled"] <= 16).all()
    assert steps["reward_mean"].tolist() == pytest.approx(stopped[2])  # and exactly the straight run
    assert layout.read_run_json(store, run_id)["config_history"] == []


def _damage_checkpoint(folder: Path, how: str) -> str:
    """Damage a checkpoint as a disk or a copy would; returns the problem `store check` should name."""
    if how == "truncated":  # the probe of issue 46: truncate -s 1000 .../trainer.pt
        size = (folder / "trainer.pt").stat().st_size
        os.truncate(folder / "trainer.pt", 1000)
        return f"trainer.pt: 1,000 bytes, the manifest says {size:,}"
    if how == "bit-flipped":
        weights = next(p for p in (folder / "policy").iterdir() if p.suffix == ".safetensors")
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x10
        weights.write_bytes(bytes(data))
        return f"policy/{weights.name}: checksum differs from the manifest's (the file is damaged)"
    (folder / "budget.json").unlink()
    return "budget.json: missing"


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "missing"])
def test_a_damaged_checkpoint_is_named_by_store_check_and_resume_falls_back_to_the_previous(stopped, tmp_path, capsys,
                                                                                            how):
    store, run_id = _copy(stopped, tmp_path)
    newest = checkpoints.root(store, run_id) / "step_000003"
    problem = _damage_checkpoint(newest, how)
    capsys.readouterr()
    assert cli_main(["store", "check", str(store)]) == 1  # as for any damaged store file
    out = capsys.readouterr().out
    assert f"damaged: checkpoints/{run_id}/step_000003: {problem}" in out.splitlines()
    done = _train_cli(store, "--resume", run_id)
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == [
        f"run {run_id}: checkpoint step_000003 ({problem}) is damaged; resuming from the previous whole checkpoint "
        "step_000002"]
    steps = read_steps(store, run_id)
    assert steps["step"].tolist() == [0, 1, 2, 3]
    assert steps["reward_mean"].tolist() == pytest.approx(stopped[2])  # steps 2 and 3 re-run exactly


def test_with_no_whole_checkpoint_resume_stops_in_one_line_and_quarantine_lets_it_restart(tmp_path, stopped):
    store, run_id = _copy(stopped, tmp_path)
    root = checkpoints.root(store, run_id)
    problems = {name: _damage_checkpoint(root / name, how)
                for name, how in (("step_000003", "truncated"), ("step_000002", "missing"))}
    done = _train_cli(store, "--resume", run_id)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert _messages(done.stderr) == [
        f"fastrl: error: run {run_id}: no whole checkpoint to resume from: checkpoints step_000003 "
        f"({problems['step_000003']}), step_000002 ({problems['step_000002']}) are damaged (`fastrl store check "
        f"{store} --quarantine` moves the damaged ones aside; --resume then restarts the run from its first step)"]
    assert read_runs(store).iloc[0]["status"] == "stopped"  # untouched
    assert cli_main(["store", "check", str(store), "--quarantine"]) == 0
    assert sorted(p.name for p in (store / "quarantine" / "checkpoints" / run_id).iterdir()) == [
        "step_000002", "step_000003"]
    done = _train_cli(store, "--resume", run_id)
    assert done.returncode == 0, done.stderr
    assert read_steps(store, run_id)["reward_mean"].tolist() == pytest.approx(stopped[2])


def test_a_checkpoint_written_before_manifests_still_resumes_and_one_that_does_not_load_is_passed_over(
        tmp_path, stopped, capsys, caplog):
    store, run_id = _copy(stopped, tmp_path)
    root = checkpoints.root(store, run_id)
    for folder in root.glob("step_*"):  # as the code before manifests wrote them
        (folder / "manifest.json").unlink(missing_ok=True)
    capsys.readouterr()
    assert cli_main(["store", "check", str(store)]) == 0
    assert "2 checkpoint(s) written before manifests: not verified" in capsys.readouterr().out
    os.truncate(root / "step_000003" / "trainer.pt", 1000)
    resumed = Trainer(_config(store, checkpoint_every=1), resume=run_id, progress=False)
    assert resumed.step == 2  # the older one, which loads
    assert f"run {run_id}: checkpoint step_000003 (it does not load (" in caplog.text
    resumed.run()
    assert read_steps(store, run_id)["reward_mean"].tolist() == pytest.approx(stopped[2])
