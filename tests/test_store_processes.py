"""The store with real separate processes: a live reader while a writer trains, and writers killed with SIGKILL.

Each step is a realistic one: 16 prompts x 6-8 rollouts (112-128 rollouts), 256-dim sketches, one 112x112 PNG
per prompt.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
import traceback
from pathlib import Path

import duckdb
import pytest

from fastrl_core import store

SKETCH_DIM = 256
SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited DuckDB or torch state
META = dict(config={"test": "processes"}, model="m", dataset="dots", objective="grpo", pruner="zero_advantage",
            budget="fixed", code_version="test")


def _write_steps(root: str, run_id: str, steps: int, pause: float, progress: str, ready: str) -> None:
    """Writer process: resume the run, then write `steps` steps, appending each finished step to `progress`."""
    from fastrl_core.store.fake_runs import fake_step

    pngs: dict[int, bytes] = {}
    data = [fake_step(s, prompts=16, rollouts_per_prompt=8, sketch_dim=SKETCH_DIM, pngs=pngs) for s in range(6)]
    writer = store.RunWriter.resume(root, run_id)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    Path(ready).touch()
    for step in range(steps):
        writer.write_step(step, **data[step % len(data)])
        os.write(fd, f"{step}\n".encode())  # one small write: never torn
        time.sleep(pause)
    writer.finish()


def check_visible_steps(root: str, run_id: str, *, live: bool = False) -> list[int]:
    """Every step a reader sees is complete and consistent, and nothing of an invisible step shows.

    Rollouts and groups are read before the steps: steps only ever appear, so every step they show must have
    its steps row in the later read (else a partial step leaked), with matching counts. Without a live writer
    the three reads must show exactly the same steps. Returns the visible steps.
    """
    rollouts = store.read_rollouts(root, run_id, columns=["step", "kept", "image_ref"])
    groups = store.read_groups(root, run_id)
    steps = store.read_steps(root, run_id).set_index("step")
    visible = steps.index.tolist()
    assert visible == list(range(len(visible))), f"steps not contiguous: {visible}"
    seen = sorted(set(rollouts["step"]))
    assert set(seen) <= set(visible) and set(groups["step"]) <= set(visible), "a partial step is visible"
    if not live:
        assert seen == visible == sorted(set(groups["step"]))
    shown = steps.loc[seen]
    assert rollouts.groupby("step").size().to_dict() == shown["rollouts_sampled"].to_dict()
    assert rollouts.groupby("step")["kept"].sum().to_dict() == shown["rollouts_kept"].to_dict()
    group_steps = sorted(set(groups["step"]))
    assert groups.groupby("step")["sampled"].sum().to_dict() == steps.loc[group_steps, "rollouts_sampled"].to_dict()
    assert (groups.groupby("step").size() == 16).all()
    if visible:  # what a page does: the last step's steps row, then its rollouts, groups and sketches
        last = visible[-1]
        assert len(store.read_rollouts(root, run_id, step=last)) == steps.loc[last, "rollouts_sampled"]
        assert store.read_groups(root, run_id, step=last)["kept"].sum() == steps.loc[last, "rollouts_kept"]
        meta, sketches = store.read_sketches(root, run_id, steps=[last])
        assert sketches.shape == (steps.loc[last, "rollouts_sampled"], SKETCH_DIM) and len(meta) == len(sketches)
    return visible


def _poll(root: str, run_id: str, done: str, result: str) -> None:
    """Reader process: every ~50 ms check the live run, until the writer is done; then one last poll."""
    errors, seen, polls, view_polls = [], set(), 0, 0
    while True:
        finished = os.path.exists(done)
        try:
            seen.add(len(check_visible_steps(root, run_id, live=True)))
            store.read_budget_matrix(root, run_id)
            store.read_runs(root)
            with store.layout.open_views(root) as con:  # the views, as `duckdb -readonly` would
                con.sql("SELECT count(*) FROM rollouts").fetchall()
            view_polls += 1
        except Exception as error:  # noqa: BLE001 - every failure is counted and reported
            errors.append(f"{type(error).__name__}: {error} {traceback.format_exc(limit=-2)}")
        polls += 1
        if finished:
            break
        time.sleep(0.05)
    Path(result).write_text(json.dumps({"errors": errors, "seen": sorted(seen), "polls": polls,
                                        "view_polls": view_polls}))


def test_live_reader_sees_every_step_with_zero_errors(tmp_path):
    steps = 40
    run_id = store.RunWriter(tmp_path, name="live", **META).run_id
    files = {name: str(tmp_path / name) for name in ("progress", "ready", "done", "result")}
    reader = SPAWN.Process(target=_poll, args=(str(tmp_path), run_id, files["done"], files["result"]))
    writer = SPAWN.Process(target=_write_steps,
                           args=(str(tmp_path), run_id, steps, 0.03, files["progress"], files["ready"]))
    reader.start()
    writer.start()
    writer.join(120)
    Path(files["done"]).touch()
    reader.join(60)
    assert writer.exitcode == 0 and reader.exitcode == 0
    result = json.loads(Path(files["result"]).read_text())
    assert result["errors"] == []
    assert result["seen"][-1] == steps  # the last poll, after the writer finished, sees every step
    assert len(result["seen"]) >= 5 and result["polls"] >= 10  # it watched the run grow
    assert result["view_polls"] == result["polls"]
    assert Path(files["progress"]).read_text().split() == [str(s) for s in range(steps)]
    assert store.read_runs(tmp_path).iloc[0]["status"] == "finished"


@pytest.mark.parametrize("seed", range(4))
def test_writer_killed_at_a_random_point_leaves_only_whole_steps(tmp_path, seed):
    run_id = store.RunWriter(tmp_path, name="killed", **META).run_id
    progress, ready = str(tmp_path / "progress"), str(tmp_path / "ready")
    writer = SPAWN.Process(target=_write_steps, args=(str(tmp_path), run_id, 10_000, 0.0, progress, ready))
    writer.start()
    deadline = time.time() + 120  # a loaded machine (CI) can take seconds for the first step
    while not (os.path.exists(progress) and os.path.getsize(progress)) and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(random.Random(seed).uniform(0.0, 0.6))  # the kill lands anywhere in a later step
    writer.kill()  # SIGKILL
    writer.join(10)
    assert writer.exitcode == -9

    finished = [int(s) for s in Path(progress).read_text().split()]
    visible = check_visible_steps(str(tmp_path), run_id)
    assert finished, "the writer finished no step in 120 s"
    assert visible[: len(finished)] == finished  # every finished step is readable
    assert len(visible) <= len(finished) + 1  # at most the step whose write returned but was not reported
    for ref in store.read_rollouts(tmp_path, run_id, columns=["image_ref"])["image_ref"].unique():
        assert store.image_key(store.read_image(tmp_path, run_id, ref)) == ref  # no torn image
    with store.layout.open_views(tmp_path) as con:  # the store still opens
        assert con.sql("SELECT count(*) FROM steps").fetchall() == [(len(visible),)]
    runs = store.read_runs(tmp_path)
    assert runs.iloc[0]["status"] == "running" and runs.iloc[0]["last_step"] == visible[-1]

    resumed = store.RunWriter.resume(tmp_path, run_id)  # the trainer restarts from its last step
    from fastrl_core.store.fake_runs import fake_step
    resumed.write_step(len(visible), **fake_step(len(visible), sketch_dim=SKETCH_DIM))
    resumed.finish()
    assert check_visible_steps(str(tmp_path), run_id) == list(range(len(visible) + 1))
    with duckdb.connect(str(store.compact(tmp_path, run_id)), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM steps").fetchall() == [(len(visible) + 1,)]
