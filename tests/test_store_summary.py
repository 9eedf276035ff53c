"""A run's summary files (`fastrl_core.store.summary`): a fresh reader opens them instead of every step's files, and
the step files still decide what it sees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastrl_app.cli import main
from fastrl_core import store
from fastrl_core.store import damage, readers, summary
from fastrl_core.store.fake_runs import fake_step

SMALL = dict(prompts=3, rollouts_per_prompt=4, sketch_dim=4, dataset_size=8)


def new_run(root: Path) -> store.RunWriter:
    return store.RunWriter(root, name="run", config={}, model="m", dataset="d", objective="grpo", pruner="fastrl",
                           budget="fixed", code_version="test")


def fresh_reads(root: Path, run_id: str) -> tuple[pd.DataFrame, ...]:
    """What a newly started app reads: the store's per-process caches emptied first."""
    readers._table_cache.clear()
    return (store.read_steps(root, run_id), store.read_groups(root, run_id), store.read_reason_counts(root, run_id))


def reads_without_summaries(root: Path, run_id: str) -> tuple[pd.DataFrame, ...]:
    """The truth: the same reads from the step files alone."""
    folder = store.layout.run_dir(root, run_id) / "summary"
    aside = folder.with_name("summary-aside")
    folder.rename(aside)
    try:
        return fresh_reads(root, run_id)
    finally:
        aside.rename(folder)


def assert_same(got: tuple[pd.DataFrame, ...], want: tuple[pd.DataFrame, ...]) -> None:
    for a, b in zip(got, want, strict=True):
        pd.testing.assert_frame_equal(a, b)


@pytest.fixture
def files_read(monkeypatch) -> list[str]:
    """The step files the readers pass to DuckDB (every read of them goes through damage.read_tolerant)."""
    seen: list[str] = []
    real = damage.read_tolerant

    def spy(store_dir, files, read):
        seen.extend(files)
        return real(store_dir, files, read)

    monkeypatch.setattr(damage, "read_tolerant", spy)
    return seen


def test_a_fresh_reader_opens_the_summaries_and_only_the_steps_written_since(tmp_path, monkeypatch, files_read):
    monkeypatch.setattr(summary, "EVERY", 3)
    writer = new_run(tmp_path)
    for step in range(7):
        writer.write_step(step, **fake_step(step, **SMALL))
    run_id = writer.run_id
    truth = reads_without_summaries(tmp_path, run_id)
    assert len(summary.summary_files(tmp_path, run_id)) == 3  # refreshed after steps 2 and 5
    files_read.clear()
    assert_same(fresh_reads(tmp_path, run_id), truth)
    assert sorted(Path(f).parent.name + "/" + Path(f).name for f in files_read) == [
        "groups/step_000006.parquet", "rollouts/step_000006.parquet", "steps/step_000006.parquet"]
    writer.finish()  # brings them up to date
    files_read.clear()
    assert_same(fresh_reads(tmp_path, run_id), truth)
    assert files_read == []
    assert store.read_runs(tmp_path)["steps"].tolist() == [7]


def test_the_step_files_overrule_the_summaries(tmp_path, files_read):
    writer = new_run(tmp_path)
    for step in range(6):
        writer.write_step(step, **fake_step(step, **SMALL))
    writer.finish()
    run_id = writer.run_id
    old = fresh_reads(tmp_path, run_id)
    writer = store.RunWriter.resume(tmp_path, run_id)
    writer.write_step(2, **fake_step(2, seed=1, **SMALL))  # re-written after the summaries
    writer.close()
    store.quarantine(tmp_path, [store.check.Damage(f"runs/{run_id}/steps/step_000004.parquet", "test")])
    steps_1 = store.layout.step_file(tmp_path, run_id, "steps", 1)
    steps_1.write_bytes(steps_1.read_bytes()[:40])  # truncated
    truth = reads_without_summaries(tmp_path, run_id)
    files_read.clear()
    got = fresh_reads(tmp_path, run_id)
    assert_same(got, truth)
    assert got[0]["step"].tolist() == [0, 2, 3, 5]
    assert got[0].set_index("step").loc[2, "reward_mean"] != old[0].set_index("step").loc[2, "reward_mean"]
    assert {Path(f).name for f in files_read} == {"step_000001.parquet", "step_000002.parquet"}
    assert f"runs/{run_id}/steps/step_000001.parquet" in store.damaged_files(tmp_path)


@pytest.mark.parametrize("damage_kind", ["junk", "not a summary"])
def test_a_summary_that_does_not_read_is_named_and_skipped_and_compact_writes_it_anew(tmp_path, capsys, files_read,
                                                                                      damage_kind):
    writer = new_run(tmp_path)
    for step in range(4):
        writer.write_step(step, **fake_step(step, **SMALL))
    writer.finish()
    run_id = writer.run_id
    path = summary.summary_file(tmp_path, run_id, "groups")
    if damage_kind == "junk":
        path.write_bytes(b"PAR1 not a parquet file")
    else:  # a Parquet file without the summary's stamps
        pq.write_table(pa.table({"step": [0]}), path)
    truth = reads_without_summaries(tmp_path, run_id)
    assert_same(fresh_reads(tmp_path, run_id), truth)
    relative = f"runs/{run_id}/summary/groups.parquet"
    assert relative in store.damaged_files(tmp_path)
    assert [d.path for d in store.check_store(tmp_path)] == [relative]
    assert store.quarantine(tmp_path, store.check_store(tmp_path)) == [relative]
    assert main(["store", "compact", str(tmp_path)]) == 0
    assert path.exists() and store.check_store(tmp_path) == []
    files_read.clear()
    assert_same(fresh_reads(tmp_path, run_id), truth)
    assert files_read == [] and relative not in store.damaged_files(tmp_path)


def test_a_stopped_run_has_summaries_too_and_they_survive_no_copy(tmp_path, files_read):
    writer = new_run(tmp_path)
    for step in range(3):
        writer.write_step(step, **fake_step(step, **SMALL))
    writer.finish("stopped", "KeyboardInterrupt")
    run_id = writer.run_id
    assert len(summary.summary_files(tmp_path, run_id)) == 3
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "runs", copy / "runs")  # new inodes: the summaries no longer vouch for the files
    truth = fresh_reads(tmp_path, run_id)
    files_read.clear()
    assert_same(tuple(f.assign(run_id=run_id) if "run_id" in f else f for f in fresh_reads(copy, run_id)), truth)
    assert len(files_read) == 9  # 3 steps x (steps, groups, rollouts): read from the step files
