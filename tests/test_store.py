"""The run store: round trips, validation, compaction, several runs, resume (single process).

Live readers and killed writers in separate processes: tests/test_store_processes.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrl_core import store
from fastrl_core.store import layout, readers
from fastrl_core.store.fake_runs import fake_step, prompt_png, write_fake_run

PNG_A, PNG_B = prompt_png(0, size=16), prompt_png(1, size=16)
REF_A, REF_B = store.image_key(PNG_A), store.image_key(PNG_B)
META = dict(config={"lr": 5e-4, "pruner": {"name": "fastrl", "min_kept": 2}}, model="tiny-qwen", dataset="dots",
            objective="grpo", pruner="fastrl", budget="fixed")


def new_writer(root: Path, name: str = "run", **overrides) -> store.RunWriter:
    return store.RunWriter(root, name=name, **(META | {"code_version": "test"} | overrides))


def rollout(rollout_id: str, prompt_id: str, reward: float, advantage: float, kept: bool, sketch, **overrides) -> dict:
    row = {"rollout_id": rollout_id, "prompt_id": prompt_id, "image_ref": REF_A if prompt_id == "a" else REF_B,
           "question": f"question {prompt_id}", "answer": "3",
           "completion": f"<thinking>x</thinking> \\boxed{{{reward}}}",
           "reward": reward, "format_reward": 0.5, "accuracy_reward": 1.0 if reward > 1 else 0.0,
           "advantage": advantage, "kept": kept, "reason": "kept" if kept else "zero_advantage",
           "score": abs(advantage), "weight": 1.0 if kept else None, "length": 7, "sketch": sketch}
    return row | overrides


def tiny_step(offset: float = 0.0) -> dict:
    """Prompt a: rewards 1.5, 0.5, 1.5 (3 rollouts, all kept); prompt b: 0.5, 0.5 (zero variance, none kept)."""
    rollouts = [
        rollout("r0", "a", 1.5, 0.7071 + offset, True, [1.0, 0.0, 0.0]),
        rollout("r1", "a", 0.5, -1.4142, True, [0.0, 1.0, 0.0]),
        rollout("r2", "a", 1.5, 0.7071, True, [0.0, 0.0, 1.0]),
        rollout("r3", "b", 0.5, 0.0, False, [0.5, 0.5, 0.5]),
        rollout("r4", "b", 0.5, 0.0, False, [-1.0, 2.0, -3.0]),
    ]
    groups = [{"prompt_id": "a", "reward_mean": 3.5 / 3, "reward_std": 0.4714, "sampled": 3, "kept": 3},
              {"prompt_id": "b", "reward_mean": 0.5, "reward_std": 0.0, "sampled": 2, "kept": 0}]
    step_row = {"rollouts_sampled": 5, "rollouts_kept": 3, "rollouts_per_prompt": 2.5, "reward_mean": 0.9 + offset,
                "accuracy": 0.4, "loss": 0.25, "kl": None, "clip_fraction": 0.0, "zero_variance_groups": 1,
                "time_generate": 0.28, "time_update": 0.43, "lr": 5e-4, "epoch_end": offset > 0}
    return {"step_row": step_row, "groups": groups, "rollouts": rollouts, "images": {REF_A: PNG_A, REF_B: PNG_B}}


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "store.duckdb"}


# --------------------------------------------------------------------------------------------------- round trips

def test_round_trip_of_every_table(tmp_path):
    writer = new_writer(tmp_path, name="fastrl run")
    writer.write_step(0, **tiny_step())
    writer.write_step(1, **tiny_step(offset=0.1))
    writer.write_eval(1, "test", accuracy=0.375, n=256, greedy_length=31.5)
    writer.set_projection(1, ["r4", "r0"], np.array([[1.0, 2.0], [-3.0, 4.0]]))
    run_id = writer.run_id
    assert run_id.startswith("fastrl-run-")

    steps = store.read_steps(tmp_path, run_id)
    assert steps["step"].tolist() == [0, 1]
    row = steps.iloc[1]
    assert (row["rollouts_sampled"], row["rollouts_kept"], row["zero_variance_groups"]) == (5, 3, 1)
    assert row["reward_mean"] == pytest.approx(1.0) and row["lr"] == 5e-4 and row["time_update"] == 0.43
    assert pd.isna(row["kl"]) and pd.isna(row["time_sketch"]) and row["wall_time"] >= steps.iloc[0]["wall_time"] >= 0
    assert steps["epoch_end"].tolist() == [False, True]  # an extra bool key is a BOOLEAN column

    groups = store.read_groups(tmp_path, run_id, step=1)
    assert groups[["prompt_id", "sampled", "kept"]].values.tolist() == [["a", 3, 3], ["b", 2, 0]]
    assert groups["reward_mean"].tolist() == pytest.approx([3.5 / 3, 0.5])
    assert len(store.read_groups(tmp_path, run_id)) == 4

    rollouts = store.read_rollouts(tmp_path, run_id, step=1)
    assert rollouts["rollout_id"].tolist() == ["r0", "r1", "r2", "r3", "r4"]  # written order
    r0 = rollouts.iloc[0]
    assert (r0["prompt_id"], r0["image_ref"], r0["kept"], r0["reason"], r0["length"]) == ("a", REF_A, True, "kept", 7)
    assert r0["advantage"] == pytest.approx(0.8071) and r0["completion"].endswith("\\boxed{1.5}")
    assert rollouts["proj_x"].tolist()[:1] == [-3.0] and rollouts["proj_y"].tolist()[4] == 2.0
    assert rollouts["proj_x"].isna().tolist() == [False, True, True, True, False]
    assert pd.isna(rollouts.iloc[3]["weight"]) and "sketch" not in rollouts

    meta, sketches = store.read_sketches(tmp_path, run_id, steps=[1])
    assert sketches.dtype == np.float32 and sketches.shape == (5, 3)
    np.testing.assert_array_equal(sketches[4], [-1.0, 2.0, -3.0])
    assert meta["rollout_id"].tolist() == ["r0", "r1", "r2", "r3", "r4"] and meta["proj_x"].iloc[0] == -3.0

    evals = store.read_evals(tmp_path, run_id)
    assert evals[["step", "split", "accuracy", "n", "greedy_length"]].values.tolist() == [[1, "test", 0.375, 256, 31.5]]
    assert store.read_image(tmp_path, run_id, r0["image_ref"]) == PNG_A
    assert store.read_budget_matrix(tmp_path, run_id).values.tolist() == [
        [0, "a", 3, 3], [0, "b", 2, 0], [1, "a", 3, 3], [1, "b", 2, 0]]
    assert store.latest_step(tmp_path, run_id) == 1

    runs = store.read_runs(tmp_path)
    assert len(runs) == 1
    run = runs.iloc[0]
    assert (run["name"], run["model"], run["pruner"], run["status"]) == ("fastrl run", "tiny-qwen", "fastrl", "running")
    assert json.loads(run["config"]) == META["config"] and run["code_version"] == "test"
    assert (run["last_step"], run["steps"], run["rollouts_sampled"], run["rollouts_kept"]) == (1, 2, 10, 6)
    assert run["kept_fraction"] == pytest.approx(0.6) and run["train_accuracy"] == 0.4
    assert (run["eval_split"], run["best_accuracy"], run["last_accuracy"]) == ("test", 0.375, 0.375)
    assert pd.isna(run["finished"])
    writer.finish()
    run = store.read_runs(tmp_path).iloc[0]
    assert run["status"] == "finished" and run["finished"] >= run["started"]


def test_images_are_stored_once_per_run_in_one_file_per_step(tmp_path):
    assert store.image_key(PNG_A) == hashlib.sha256(PNG_A).hexdigest()
    writer = new_writer(tmp_path)
    images = tmp_path / "runs" / writer.run_id / "images"
    writer.write_step(0, **tiny_step())
    writer.write_step(1, **tiny_step())  # the same images again: nothing new to store
    later = tiny_step()
    later["images"] = {}  # refs the run has stored are accepted without the bytes
    writer.write_step(2, **later)
    assert sorted(p.name for p in images.iterdir()) == ["step_000000.parquet"]
    assert (store.read_image(tmp_path, writer.run_id, REF_A), store.read_image(tmp_path, writer.run_id, REF_B)) == (PNG_A, PNG_B)

    png_c = prompt_png(2, size=16)  # re-writing step 0 with a new image keeps the ones later steps use
    rewrite = tiny_step()
    rewrite["rollouts"][0]["image_ref"] = store.image_key(png_c)
    rewrite["images"] = {store.image_key(png_c): png_c}
    writer.write_step(0, **rewrite)
    assert sorted(p.name for p in images.iterdir()) == ["step_000000.parquet"]
    assert [store.read_image(tmp_path, writer.run_id, store.image_key(png))
            for png in (PNG_A, PNG_B, png_c)] == [PNG_A, PNG_B, png_c]
    with layout.open_views(tmp_path) as con:  # the live view, for plain SQL
        assert con.sql("SELECT count(*), count(DISTINCT image_ref) FROM images").fetchall() == [(3, 3)]

    other = new_writer(tmp_path, name="other")  # each run stores its own images
    with pytest.raises(ValueError, match=f"rollouts row 0: key 'image_ref' '{REF_A}' is neither in images nor stored "
                                         "by this run"):
        other.write_step(0, **later)
    writer.close()  # one writer per run: the first lets go (as if killed)
    store.RunWriter.resume(tmp_path, writer.run_id).write_step(3, **later)  # the resumed run knows its images
    store.RunWriter.resume(tmp_path, writer.run_id, from_step=0)  # dropping step 0 drops the images it stored
    assert not images.exists() or not any(images.iterdir())
    with pytest.raises(FileNotFoundError, match="no image"):
        store.read_image(tmp_path, writer.run_id, REF_A)


def test_empty_run_and_store_read_as_empty_frames(tmp_path):
    assert store.read_runs(tmp_path).empty
    run_id = new_writer(tmp_path).run_id
    assert store.latest_step(tmp_path, run_id) is None
    assert store.read_steps(tmp_path, run_id).empty and "rollouts_kept" in store.read_steps(tmp_path, run_id)
    assert list(store.read_rollouts(tmp_path, run_id, columns=["step", "reward"]).columns) == ["step", "reward"]
    assert store.read_groups(tmp_path, run_id).empty and store.read_evals(tmp_path, run_id).empty
    meta, sketches = store.read_sketches(tmp_path, run_id)
    assert meta.empty and sketches.shape == (0, 0)
    assert store.read_runs(tmp_path).iloc[0]["steps"] == 0
    with layout.open_views(tmp_path) as con:  # seeds: views bind before step 0
        assert con.sql("SELECT count(*) FROM rollouts").fetchall() == [(0,)]
        assert con.sql("SELECT run_id, status, config->>'$.pruner.name' FROM runs").fetchall() == [
            (run_id, "running", "fastrl")]
    with pytest.raises(ValueError, match="no run 'nope'"):
        store.read_steps(tmp_path, "nope")


def test_a_step_without_its_steps_row_is_invisible(tmp_path):
    """A writer killed after the rollouts and groups files but before the steps row leaves exactly this."""
    writer = new_writer(tmp_path)
    writer.write_step(0, **tiny_step())
    writer.write_step(1, **tiny_step())
    layout.step_file(tmp_path, writer.run_id, "steps", 1).unlink()
    assert store.latest_step(tmp_path, writer.run_id) == 0
    assert set(store.read_rollouts(tmp_path, writer.run_id)["step"]) == {0}
    assert set(store.read_groups(tmp_path, writer.run_id)["step"]) == {0}
    assert len(store.read_sketches(tmp_path, writer.run_id)[1]) == 5
    with layout.open_views(tmp_path) as con:
        assert con.sql("SELECT count(*), max(step) FROM rollouts").fetchall() == [(5, 0)]
        assert con.sql("SELECT count(*) FROM groups").fetchall() == [(2,)]


# ------------------------------------------------------------------------------------------------ validation

CASES = [  # (table, row, key, edit, message)
    ("steps", 0, "rollouts_kept", "drop", "missing key 'rollouts_kept'"),
    ("steps", 0, "accuracy", "0.5", "key 'accuracy' must be a number"),
    ("steps", 0, "zero_variance_groups", 1.0, "key 'zero_variance_groups' must be an int"),
    ("steps", 0, "reward_mean", None, "key 'reward_mean' must not be None"),
    ("steps", 0, "grad_norm", "big", "extra key 'grad_norm' must be a number, a bool or None"),
    ("steps", 0, "rollouts_per_prompt", "drop", "missing key 'rollouts_per_prompt'"),
    ("groups", 1, "reward_std", "drop", "missing key 'reward_std'"),
    ("groups", 1, "prompt_id", 7, "key 'prompt_id' must be a str"),
    ("groups", 0, "sampled", True, "key 'sampled' must be an int"),
    ("rollouts", 3, "completion", "drop", "missing key 'completion'"),
    ("rollouts", 2, "kept", 1, "key 'kept' must be a bool"),
    ("rollouts", 4, "advantage", "0.1", "key 'advantage' must be a number"),
    ("rollouts", 1, "rewrad", 1.0, "unknown key 'rewrad'"),
    ("rollouts", 0, "sketch", [[1.0, 2.0]], "key 'sketch' must be a non-empty 1-D float vector"),
    ("rollouts", 2, "sketch", [1.0, 2.0], "key 'sketch' has length 2, row 0 has 3"),
    ("rollouts", 3, "sketch", None, "key 'sketch' is None but other rows have one"),
    ("rollouts", 1, "length", 7.5, "key 'length' must be an int"),
]


@pytest.mark.parametrize("table, row, key, value, message", CASES, ids=[f"{c[0]}-{c[2]}-{c[3]!r}" for c in CASES])
def test_bad_row_names_table_row_key_and_writes_nothing(tmp_path, table, row, key, value, message):
    writer = new_writer(tmp_path)
    before = tree(tmp_path)
    step = tiny_step()
    rows = {"steps": [step["step_row"]], "groups": step["groups"], "rollouts": step["rollouts"]}[table]
    if value == "drop":
        del rows[row][key]
    else:
        rows[row][key] = value
    with pytest.raises(ValueError, match=rf"^{table} row {row}: {message}"):
        writer.write_step(0, **step)
    assert tree(tmp_path) == before  # no image, no step file, run.json unchanged
    assert store.latest_step(tmp_path, writer.run_id) is None


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["step_row"].update(rollouts_sampled=6), "rollouts_sampled=6 but the groups sum to 5"),
    (lambda s: s["step_row"].update(rollouts_kept=2), "rollouts_kept=2 but the groups sum to 3"),
    (lambda s: (s["groups"][1].update(sampled=3), s["step_row"].update(rollouts_sampled=6)),
     "rollouts_sampled=6 but 5 rollouts given"),
    (lambda s: s["rollouts"][0].update(image_ref=""), "rollouts row 0: key 'image_ref' '' is not an image key"),
    (lambda s: (s["groups"][0].update(kept=2), s["step_row"].update(rollouts_kept=2)),
     "groups row 0: prompt 'a' has sampled=3, kept=2 but the rollouts"),
    (lambda s: s["groups"][1].update(prompt_id="c"), "groups row 1: prompt 'c' has sampled=2, kept=0 but the rollouts"),
    (lambda s: s["groups"].append(dict(s["groups"][1])), "groups: prompt_id values must be unique"),
    (lambda s: s["rollouts"][1].update(rollout_id="r0"), "rollout_id values must be unique"),
    (lambda s: s["images"].pop(REF_B), f"rollouts row 3: key 'image_ref' '{REF_B}' is neither in images"),
    (lambda s: s["images"].update({REF_A: PNG_B}), "is not image_key"),
    (lambda s: s["images"].update({REF_A: b"GIF89a"}), "expected PNG bytes"),
    (lambda s: s["step_row"].update(step=3), "steps row 0: key 'step' is 0 here"),
    (lambda s: s["step_row"].update(run_id="other"), "steps row 0: key 'run_id' is 'run-"),
])
def test_inconsistent_step_is_rejected_before_writing(tmp_path, edit, message):
    writer = new_writer(tmp_path)
    before = tree(tmp_path)
    step = tiny_step()
    edit(step)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        writer.write_step(0, **step)
    assert tree(tmp_path) == before


def test_numpy_scalars_mixed_types_and_edge_values(tmp_path):
    """What tensors' .tolist() or NumPy hand over: NumPy scalars beside Python ones, a str subclass, an int in a
    float column (exact beyond 2**53 too); an int that fits no int64 is one clear error, and nothing is written."""
    class Label(str):
        pass

    writer = new_writer(tmp_path)
    step = tiny_step()
    step["rollouts"][0].update(reward=np.float32(1.5), length=np.int16(7), kept=np.bool_(True), reason=Label("top"))
    step["rollouts"][1].update(advantage=-1, score=2 ** 60)
    step["step_row"].update(accuracy=np.float64(0.4), zero_variance_groups=np.int64(1), epoch_end=np.bool_(False))
    writer.write_step(0, **step)
    rollouts = store.read_rollouts(tmp_path, writer.run_id).set_index("rollout_id")
    assert rollouts.loc["r0", ["reward", "length", "kept", "reason"]].tolist() == [1.5, 7, True, "top"]
    assert rollouts.loc["r1", "advantage"] == -1.0 and rollouts.loc["r1", "score"] == float(2 ** 60)
    assert store.read_steps(tmp_path, writer.run_id)["epoch_end"].tolist() == [False]

    before = tree(tmp_path)
    step["rollouts"][2]["length"] = 2 ** 70
    with pytest.raises(ValueError, match="^rollouts row 2: key 'length' must fit a 64-bit int"):
        writer.write_step(1, **step)
    assert tree(tmp_path) == before


def test_step_key_echo_optional_losses_and_unlogged_rollouts(tmp_path):
    """What a trainer sends: its own `step` in the row, no loss when no update ran, rollouts not logged."""
    writer = new_writer(tmp_path)
    step = tiny_step()
    step["step_row"].update(step=0, run_id=writer.run_id)
    del step["step_row"]["loss"], step["step_row"]["kl"], step["step_row"]["clip_fraction"]
    step["rollouts"] = []
    writer.write_step(0, **step)
    row = store.read_steps(tmp_path, writer.run_id).iloc[0]
    assert row["step"] == 0 and row["rollouts_sampled"] == 5 and pd.isna(row["loss"]) and pd.isna(row["kl"])
    assert store.read_rollouts(tmp_path, writer.run_id).empty
    assert store.read_groups(tmp_path, writer.run_id)["sampled"].tolist() == [3, 2]
    assert store.read_sketches(tmp_path, writer.run_id)[1].shape == (0, 0)


def test_sketch_length_is_fixed_per_run_and_sketches_may_be_absent(tmp_path):
    writer = new_writer(tmp_path)
    writer.write_step(0, **tiny_step())
    longer = tiny_step()
    for r in longer["rollouts"]:
        r["sketch"] = [0.0] * 4
    with pytest.raises(ValueError, match="length 4, this run's sketches have 3"):
        writer.write_step(1, **longer)
    none = tiny_step()
    for r in none["rollouts"]:
        r["sketch"] = None
    writer.write_step(1, **none)
    meta, sketches = store.read_sketches(tmp_path, writer.run_id)
    assert sketches.shape == (5, 3) and set(meta["step"]) == {0}


def test_run_metadata_and_eval_and_projection_errors(tmp_path):
    with pytest.raises(ValueError, match="key 'model' must be a non-empty str"):
        store.RunWriter(tmp_path, name="x", **(META | {"model": ""}))
    with pytest.raises(ValueError, match="run_id 'a/b' must match"):
        store.RunWriter(tmp_path, name="x", run_id="a/b", **META)
    writer = new_writer(tmp_path, run_id="fixed")
    with pytest.raises(ValueError, match="already exists"):
        new_writer(tmp_path, run_id="fixed")
    with pytest.raises(ValueError, match="split 'val/1'"):
        writer.write_eval(0, "val/1", 0.5, 10)
    with pytest.raises(ValueError, match="evals row 0: key 'n' must be an int"):
        writer.write_eval(0, "test", 0.5, 10.0)
    with pytest.raises(ValueError, match="step 0 of run 'fixed' has not been written"):
        writer.set_projection(0, ["r0"], [[0.0, 0.0]])
    writer.write_step(0, **tiny_step())
    with pytest.raises(ValueError, match=r"xy must have shape \(2, 2\)"):
        writer.set_projection(0, ["r0", "r1"], [[0.0, 0.0]])
    with pytest.raises(ValueError, match="'zz' is not a rollout of step 0"):
        writer.set_projection(0, ["r0", "zz"], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="status 'done'"):
        writer.finish("done")
    with pytest.raises(ValueError, match="not an image key"):
        store.read_image(tmp_path, "fixed", "../../etc/passwd")
    with pytest.raises(FileNotFoundError, match="no image"):
        store.read_image(tmp_path, "fixed", "0" * 64)
    with pytest.raises(ValueError, match="unknown column 'sketches'"):
        store.read_rollouts(tmp_path, "fixed", columns=["sketches"])
    with pytest.raises(ValueError, match="limit must be an int >= 0"):
        store.read_rollouts(tmp_path, "fixed", limit=-1)


def test_default_code_version_is_git_describe_or_package_version(tmp_path):
    writer = store.RunWriter(tmp_path, name="x", **META)
    from fastrl_core import __version__
    assert writer.meta["code_version"] in (store.writer.default_code_version(), __version__)
    assert writer.meta["code_version"]


# ------------------------------------------------------------------------------------------- filters (property)

@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    run_id = write_fake_run(root, steps=6, prompts=4, rollouts_per_prompt=6, sketch_dim=8, finish=False)
    writer = store.RunWriter.resume(root, run_id)
    ids = store.read_rollouts(root, run_id, step=2, columns=["rollout_id"])["rollout_id"].tolist()
    writer.set_projection(2, ids[::2], np.arange(2 * len(ids[::2]), dtype=float).reshape(-1, 2))
    return root, run_id, store.read_rollouts(root, run_id, columns=readers.ROLLOUT_COLUMNS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.none() | st.integers(0, 6) | st.lists(st.integers(0, 6), max_size=3),
       prompt=st.none() | st.integers(0, 63), kept=st.none() | st.booleans(), correct=st.none() | st.booleans(),
       reason=st.none() | st.sampled_from(["zero_advantage", "nonzero_advantage", "other"]),
       limit=st.none() | st.integers(0, 30))
def test_read_rollouts_filters_equal_pandas_filters(synthetic_store, step, prompt, kept, correct, reason, limit):
    root, run_id, full = synthetic_store
    prompt_id = None if prompt is None else f"p{prompt:05d}"
    got = store.read_rollouts(root, run_id, step=step, prompt_id=prompt_id, kept=kept, correct=correct,
                              reason=reason, limit=limit, columns=["step", "rollout_id", "proj_x"])
    want = full
    if step is not None:
        want = want[want["step"].isin([step] if isinstance(step, int) else step)]
    if prompt_id is not None:
        want = want[want["prompt_id"] == prompt_id]
    if kept is not None:
        want = want[want["kept"] == kept]
    if correct is not None:
        want = want[(want["accuracy_reward"] > 0) == correct]
    if reason is not None:
        want = want[want["reason"] == reason]
    want = want if limit is None else want.head(limit)
    assert got["rollout_id"].tolist() == want["rollout_id"].tolist()
    assert got["proj_x"].fillna(-1).tolist() == want["proj_x"].fillna(-1).tolist()


def test_rollouts_come_in_written_order_with_projection_overlaid(synthetic_store):
    root, run_id, full = synthetic_store
    written = [fake_step(s, prompts=4, rollouts_per_prompt=6, sketch_dim=8)["rollouts"] for s in range(6)]
    assert full["rollout_id"].tolist() == [r["rollout_id"] for rows in written for r in rows]
    step2 = full[full["step"] == 2]
    half = len(step2["rollout_id"].iloc[::2])
    assert step2["proj_x"].iloc[::2].tolist() == [2.0 * i for i in range(half)]
    assert step2["proj_y"].iloc[::2].tolist() == [2.0 * i + 1 for i in range(half)]
    assert step2["proj_x"].iloc[1::2].isna().all() and full[full["step"] != 2]["proj_x"].isna().all()
    only = store.read_rollouts(root, run_id, step=2, columns=["proj_y"])  # keys fetched for the overlay, dropped
    assert list(only.columns) == ["proj_y"] and only["proj_y"].iloc[::2].tolist() == [2.0 * i + 1 for i in range(half)]


def test_sketch_rows_align_with_rollouts(synthetic_store):
    root, run_id, full = synthetic_store
    meta, sketches = store.read_sketches(root, run_id, steps=[1, 2], limit=30)
    assert sketches.shape == (30, 8) and len(meta) == 30
    with_sketch = store.read_rollouts(root, run_id, step=[1, 2], columns=["rollout_id", "sketch"]).head(30)
    assert meta["rollout_id"].tolist() == with_sketch["rollout_id"].tolist()
    np.testing.assert_array_equal(sketches, np.stack(with_sketch["sketch"].to_list()).astype(np.float32))
    assert meta["proj_x"].notna().sum() == (meta["step"] == 2).sum() // 2 + (meta["step"] == 2).sum() % 2


# ------------------------------------------------------------------------------------- compact, runs, resume

def test_compact_is_plain_duckdb_and_equals_the_live_reads(synthetic_store, tmp_path):
    root, run_id, full = synthetic_store
    path = store.compact(root, run_id)
    assert path == root / "runs" / run_id / f"{run_id}.duckdb"
    with duckdb.connect(str(path), read_only=True) as con:
        rollouts = con.sql("SELECT * FROM rollouts ORDER BY step, rollout_id").df()
        assert dict(r[:2] for r in con.sql("DESCRIBE rollouts").fetchall())["sketch"] == "FLOAT[8]"
        steps = con.sql("SELECT * FROM steps ORDER BY step").df()
        groups = con.sql("SELECT * FROM groups ORDER BY step, prompt_id").df()
        evals = con.sql("SELECT * FROM evals ORDER BY step").df()
        run = con.sql("SELECT run_id, config->>'$.steps' AS steps, status FROM runs").fetchall()
        images = dict(con.sql("SELECT image_ref, png FROM images").fetchall())
        zero = con.sql("SELECT count(*) FROM rollouts r JOIN groups g USING (step, prompt_id) "
                       "WHERE g.kept = 0 AND r.kept").fetchall()
    live = full.sort_values(["step", "rollout_id"], ignore_index=True)
    for column in readers.ROLLOUT_COLUMNS:
        if column == "sketch":
            np.testing.assert_array_equal(np.stack(rollouts[column].to_list()), np.stack(live[column].to_list()))
        elif live[column].isna().all():  # e.g. `tokens` of rows written without them: None here, NaN there
            assert rollouts[column].isna().all()
        else:
            pd.testing.assert_series_equal(rollouts[column], live[column], check_dtype=False, check_names=False)
    pd.testing.assert_frame_equal(steps, store.read_steps(root, run_id), check_dtype=False)
    live_groups = store.read_groups(root, run_id).sort_values(["step", "prompt_id"], ignore_index=True)
    pd.testing.assert_frame_equal(groups, live_groups, check_dtype=False)
    pd.testing.assert_frame_equal(evals, store.read_evals(root, run_id), check_dtype=False)
    assert run == [(run_id, "6", "running")] and zero == [(0,)]
    assert set(images) == set(live["image_ref"]) and all(store.image_key(png) == ref for ref, png in images.items())


def test_fastrl_store_compact_compacts_every_run(tmp_path, capsys):
    from fastrl_app.cli import main

    a = write_fake_run(tmp_path, steps=2, name="a", prompts=2, rollouts_per_prompt=3, sketch_dim=4, finish=False)
    b = new_writer(tmp_path, name="b").run_id  # no steps yet: empty tables
    assert main(["store", "compact", str(tmp_path)]) == 0
    printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines() if ": " in line)
    assert set(printed) == {a, b}
    assert all(Path(printed[r]) == layout.compact_file(tmp_path, r) for r in (a, b))
    with duckdb.connect(printed[b], read_only=True) as con:
        assert con.sql("SELECT count(*) FROM rollouts").fetchall() == [(0,)]
    assert main(["store", "compact", str(tmp_path), "--run", a]) == 0


def test_several_runs_in_one_store(tmp_path):
    baseline = new_writer(tmp_path, name="grpo", pruner="none")
    fastrl = new_writer(tmp_path, name="fastrl")
    for step in range(3):
        baseline.write_step(step, **tiny_step())
        if step < 2:
            fastrl.write_step(step, **tiny_step(offset=1.0))
    fastrl.write_eval(1, "test", 0.5, 8)
    fastrl.write_eval(1, "val", 0.9, 8)
    baseline.finish()
    runs = store.read_runs(tmp_path).set_index("name")
    assert runs.loc["grpo", "last_step"] == 2 and runs.loc["fastrl", "last_step"] == 1
    assert runs.loc["grpo", "status"] == "finished" and runs.loc["fastrl", "status"] == "running"
    assert runs.loc["fastrl", "eval_split"] == "test" and runs.loc["fastrl", "best_accuracy"] == 0.5
    both = store.read_steps(tmp_path, [fastrl.run_id, baseline.run_id])
    assert sorted(both.groupby("run_id").size().tolist()) == [2, 3]
    assert both.set_index("run_id").loc[fastrl.run_id, "reward_mean"].tolist() == pytest.approx([1.9, 1.9])
    assert len(store.read_evals(tmp_path, [baseline.run_id, fastrl.run_id])) == 2
    with layout.open_views(tmp_path) as con:
        assert sorted(con.sql("SELECT run_id, count(*) FROM rollouts GROUP BY run_id").fetchall()) == sorted(
            [(baseline.run_id, 15), (fastrl.run_id, 10)])


def test_resume_keeps_steps_and_a_rewritten_step_replaces_the_old(tmp_path):
    writer = new_writer(tmp_path)
    for step in range(3):
        writer.write_step(step, **tiny_step())
    writer.set_projection(2, ["r0"], [[5.0, 5.0]])
    assert store.read_steps(tmp_path, writer.run_id)["reward_mean"].tolist() == pytest.approx([0.9] * 3)  # cached
    writer.finish("failed")
    (layout.run_dir(tmp_path, writer.run_id) / "rollouts" / "step_000003.parquet.tmp-999").write_bytes(b"torn")

    resumed = store.RunWriter.resume(tmp_path, writer.run_id)
    assert resumed.meta["status"] == "running" and store.read_runs(tmp_path).iloc[0]["status"] == "running"
    assert not list(layout.run_dir(tmp_path, writer.run_id).rglob("*.tmp-*"))
    last_wall = store.read_steps(tmp_path, writer.run_id)["wall_time"].iloc[-1]
    resumed.write_step(2, **tiny_step(offset=0.5))  # the trainer rolled back to its step-2 checkpoint
    resumed.write_step(3, **tiny_step(offset=0.5))
    steps = store.read_steps(tmp_path, writer.run_id)
    assert steps["step"].tolist() == [0, 1, 2, 3]
    assert steps["reward_mean"].tolist() == pytest.approx([0.9, 0.9, 1.4, 1.4])  # the cache saw the rewrite
    assert steps["wall_time"].iloc[2] >= last_wall
    rollouts = store.read_rollouts(tmp_path, writer.run_id, step=2)
    assert rollouts["advantage"].iloc[0] == pytest.approx(1.2071) and rollouts["proj_x"].isna().all()
    assert store.read_rollouts(tmp_path, writer.run_id)["step"].value_counts().to_dict() == {0: 5, 1: 5, 2: 5, 3: 5}
    with pytest.raises(ValueError, match="no run 'missing'"):
        store.RunWriter.resume(tmp_path, "missing")


def test_resume_from_step_drops_later_steps_evals_and_partial_files(tmp_path):
    writer = new_writer(tmp_path)
    for step in range(4):
        writer.write_step(step, **tiny_step())
        writer.write_eval(step, "test", 0.1 * step, 8)
    layout.step_file(tmp_path, writer.run_id, "steps", 3).unlink()  # killed mid-step 3: rollouts/groups remain
    writer.close()
    resumed = store.RunWriter.resume(tmp_path, writer.run_id, from_step=2)  # last checkpoint: after step 1
    assert store.read_steps(tmp_path, writer.run_id)["step"].tolist() == [0, 1]
    # the evaluation at step 2 was written before the checkpoint (taken at step 2, after step 1) and is not redone
    assert store.read_evals(tmp_path, writer.run_id)["step"].tolist() == [0, 1, 2]
    run_dir = layout.run_dir(tmp_path, writer.run_id)
    assert sorted(p.name for p in (run_dir / "rollouts").iterdir()) == ["step_000000.parquet", "step_000001.parquet"]
    resumed.write_step(2, **tiny_step(offset=1.0))
    assert store.read_steps(tmp_path, writer.run_id)["reward_mean"].tolist() == pytest.approx([0.9, 0.9, 1.9])


def test_fake_steps_are_valid_for_many_shapes(tmp_path):
    writer = new_writer(tmp_path)
    pngs: dict[int, bytes] = {}
    for step, (prompts, n, dim) in enumerate([(1, 1, 5), (3, 2, 5), (16, 8, 5), (64, 8, 5)]):
        writer.write_step(step, **fake_step(step, prompts=prompts, rollouts_per_prompt=n, sketch_dim=dim,
                                                 pngs=pngs))
    runs = store.read_runs(tmp_path).iloc[0]
    groups = store.read_groups(tmp_path, writer.run_id)
    assert runs["rollouts_sampled"] == groups["sampled"].sum() and runs["rollouts_kept"] == groups["kept"].sum()
    assert os.path.getsize(tmp_path / "store.duckdb") > 0


# ------------------------------------------------------------------------------- a real run's size (issue 45)
def _rollouts_with_tokens(n: int) -> list[dict]:
    rows = [rollout(f"r{i}", "a", 1.5, 0.7, True, [1.0, 0.0, 0.0]) for i in range(n)]
    for i, row in enumerate(rows):
        row.update(token_text=[f"t{i}", " x"], token_logprob=[-0.25, -float(i) / 1000])
    return rows


def test_one_rollouts_tokens_are_read_from_its_row_group_only(tmp_path, monkeypatch):
    """A real step holds 512 rollouts of ~512 tokens: the token view reads the rollout ids, then the token lists of
    the one row group (layout.ROLLOUT_ROW_GROUP rows) holding the rollout, never the whole step's."""
    writer = new_writer(tmp_path)
    n = 3 * layout.ROLLOUT_ROW_GROUP + 5
    step = tiny_step()
    step["rollouts"] = _rollouts_with_tokens(n)
    step["groups"] = [{"prompt_id": "a", "reward_mean": 1.5, "reward_std": 0.0, "sampled": n, "kept": n}]
    step["step_row"].update(rollouts_sampled=n, rollouts_kept=n)
    writer.write_step(0, **step)
    path = layout.step_file(tmp_path, writer.run_id, "rollouts", 0)
    import pyarrow.parquet as pq

    assert pq.ParquetFile(path).metadata.num_row_groups == 4
    groups_read = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, **kw: groups_read.append((i, kw.get("columns"))) or original(self, i, **kw))
    monkeypatch.setattr(pq, "read_table", lambda *a, **kw: pytest.fail("read a whole table"))
    row = 2 * layout.ROLLOUT_ROW_GROUP + 7
    assert store.read_tokens(tmp_path, writer.run_id, 0, f"r{row}") == [(f"t{row}", -0.25),
                                                                        (" x", pytest.approx(-row / 1000))]
    assert groups_read == [(2, ["token_text", "token_logprob"])]
    assert store.read_tokens(tmp_path, writer.run_id, 0, "r0")[0] == ("t0", -0.25)
    with pytest.raises(ValueError, match="has no rollout 'nope'"):
        store.read_tokens(tmp_path, writer.run_id, 0, "nope")
    with pytest.raises(ValueError, match="has no step 3"):
        store.read_tokens(tmp_path, writer.run_id, 3, "r0")


def test_tokens_of_a_store_written_before_the_token_lists_are_read_too(tmp_path):
    """Stores written before 2026-12-07 keep tokens as JSON text in a `tokens` column; written without tokens: None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = new_writer(tmp_path)
    writer.write_step(0, **tiny_step())
    path = layout.step_file(tmp_path, writer.run_id, "rollouts", 0)
    assert store.read_tokens(tmp_path, writer.run_id, 0, "r1") is None
    table = pq.read_table(path)
    old = table.append_column("tokens", pa.array([None, json.dumps([["a", -0.5], ["b", -1.0]])] + [None] * 3))
    pq.write_table(old.drop_columns(["token_text", "token_logprob"]), path)
    assert store.read_tokens(tmp_path, writer.run_id, 0, "r1") == [("a", -0.5), ("b", -1.0)]
    assert store.read_tokens(tmp_path, writer.run_id, 0, "r0") is None
    path.write_bytes(b"junk" * 10)
    with pytest.raises(store.DamagedFile, match=f"runs/{writer.run_id}/rollouts/step_000000.parquet"):
        store.read_tokens(tmp_path, writer.run_id, 0, "r1")


def test_an_image_is_read_from_its_own_runs_files_and_a_junk_one_is_named(tmp_path):
    first, second = new_writer(tmp_path, name="first"), new_writer(tmp_path, name="second")
    for writer in (first, second):
        writer.write_step(0, **tiny_step())
    images = layout.step_file(tmp_path, first.run_id, "images", 0)
    import pyarrow.parquet as pq

    assert pq.read_table(images, columns=["image_ref"]).column(0).to_pylist() == sorted([REF_A, REF_B])
    images.write_bytes(b"junk" * 100)
    with pytest.raises(store.DamagedFile, match=f"runs/{first.run_id}/images/step_000000.parquet"):
        store.read_image(tmp_path, first.run_id, REF_A)  # the same bytes are in `second`: not served from there
    assert store.read_image(tmp_path, second.run_id, REF_A) == PNG_A
    assert f"runs/{first.run_id}/images/step_000000.parquet" in store.damaged_files(tmp_path)


def test_whole_run_reads_follow_a_step_moved_to_quarantine(tmp_path):
    """read_steps, read_groups and read_reason_counts keep each step file's rows per process; a step that leaves
    (quarantine) or arrives changes the run's version and the rows read, without re-reading the other steps."""
    writer = new_writer(tmp_path)
    for step in range(4):
        writer.write_step(step, **tiny_step())
    run_id = writer.run_id
    version = store.run_version(tmp_path, run_id)
    assert sorted(set(store.read_groups(tmp_path, run_id)["step"])) == [0, 1, 2, 3]
    counts = store.read_reason_counts(tmp_path, run_id)
    assert counts.to_dict("records") == [{"step": s, "reason": "zero_advantage", "count": 2} for s in range(4)]
    damage = [store.check.Damage(f"runs/{run_id}/rollouts/step_000002.parquet", "truncated")]
    store.quarantine(tmp_path, damage)
    assert store.run_version(tmp_path, run_id) != version
    assert store.read_steps(tmp_path, run_id)["step"].tolist() == [0, 1, 3]
    assert sorted(set(store.read_groups(tmp_path, run_id)["step"])) == [0, 1, 3]
    assert store.read_reason_counts(tmp_path, run_id)["step"].tolist() == [0, 1, 3]
    writer.write_step(4, **tiny_step())
    assert sorted(set(store.read_groups(tmp_path, run_id)["step"])) == [0, 1, 3, 4]
    assert store.read_reason_counts(tmp_path, run_id)["step"].tolist() == [0, 1, 3, 4]


# ------------------------------------------------------------------------------------- a run's config history

def test_config_history_by_hand():
    from fastrl_core.store.config_history import config_at, fold_after, with_change

    now = {"lr": 3e-3, "pruner": "none", "steps": 8}  # the config in force now
    history = with_change([], 4, {"lr": {"from": 1e-3, "to": 2e-3}, "pruner": {"from": "fastrl", "to": "none"}}, "t1")
    history = with_change(history, 6, {"lr": {"from": 2e-3, "to": 3e-3}}, "t2")
    assert [entry["step"] for entry in history] == [4, 6]
    assert config_at(now, history, 3) == {"lr": 1e-3, "pruner": "fastrl", "steps": 8}
    assert config_at(now, history, 4) == config_at(now, history, 5) == {"lr": 2e-3, "pruner": "none", "steps": 8}
    assert config_at(now, history, 6) == now
    # a resume from step 5 (the checkpoint of step 6 was damaged) re-runs 5 on: the change of step 6 applies from 5
    folded = fold_after(history, 5)
    assert folded[-1] == {"step": 5, "changes": {"lr": {"from": 2e-3, "to": 3e-3}}, "time": "t2"}
    # from step 2: both entries become one, from the first "from" to the last "to"
    assert fold_after(history, 2) == [{"step": 2, "changes": {"lr": {"from": 1e-3, "to": 3e-3},
                                                              "pruner": {"from": "fastrl", "to": "none"}},
                                       "time": "t2"}]
    # a change and its undo at the same step leave no entry
    back = with_change(history, 6, {"lr": {"from": 3e-3, "to": 2e-3}}, "t3")
    assert back == history[:1]


def test_record_config_writes_the_history_the_runs_row_the_views_and_the_compact_file(tmp_path):
    writer = store.RunWriter(tmp_path, name="r", config={"lr": 1e-3, "pruner": "fastrl"}, model="m", dataset="d",
                             objective="grpo", pruner="fastrl", budget="fixed", code_version="test")
    for step in range(3):
        writer.write_step(step, **fake_step(step, prompts=2, rollouts_per_prompt=2, sketch_dim=4))
    writer.close()
    resumed = store.RunWriter.resume(tmp_path, writer.run_id, from_step=2)
    resumed.record_config(2, {"lr": 5e-3, "pruner": "cppo"}, {"lr": (1e-3, 5e-3), "pruner": ("fastrl", "cppo")})
    expected = [{"step": 2, "changes": {"lr": {"from": 1e-3, "to": 5e-3}, "pruner": {"from": "fastrl", "to": "cppo"}}}]
    meta = layout.read_run_json(tmp_path, writer.run_id)
    assert [{k: e[k] for k in ("step", "changes")} for e in meta["config_history"]] == expected
    assert (meta["config"], meta["pruner"]) == ({"lr": 5e-3, "pruner": "cppo"}, "cppo")
    runs = store.read_runs(tmp_path)
    assert runs.iloc[0]["pruner"] == "cppo" and json.loads(runs.iloc[0]["config_history"])[0]["step"] == 2
    resumed.finish()
    with layout.open_views(tmp_path) as con:  # the store's views, and a run without a history (older run.json)
        history = con.sql("SELECT config_history FROM runs").fetchall()[0][0]
    assert json.loads(history)[0]["changes"]["pruner"]["to"] == "cppo"
    with duckdb.connect(str(layout.compact_file(tmp_path, writer.run_id)), read_only=True) as con:
        assert json.loads(con.sql("SELECT config_history FROM runs").fetchall()[0][0])[0]["step"] == 2
    old = json.loads((layout.run_dir(tmp_path, writer.run_id) / "run.json").read_text())
    del old["config_history"]
    (layout.run_dir(tmp_path, writer.run_id) / "run.json").write_text(json.dumps(old))
    assert store.read_runs(tmp_path).iloc[0]["config_history"] == "[]"
    with layout.open_views(tmp_path) as con:
        assert con.sql("SELECT config_history FROM runs").fetchall() == [(None,)]


def test_checkpoint_manifests_find_every_kind_of_damage(tmp_path):
    from fastrl_core.store.manifest import manifest_problem, write_manifest

    folder = tmp_path / "ckpt"
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "weights.safetensors").write_bytes(bytes(range(256)) * 40)
    (folder / "trainer.pt").write_bytes(b"t" * 5000)
    write_manifest(folder)
    assert manifest_problem(folder) is None
    data = bytearray((folder / "policy" / "weights.safetensors").read_bytes())
    data[100] ^= 1
    (folder / "policy" / "weights.safetensors").write_bytes(bytes(data))
    assert manifest_problem(folder) == ("policy/weights.safetensors: checksum differs from the manifest's (the file "
                                        "is damaged)")
    os.truncate(folder / "trainer.pt", 1000)
    assert manifest_problem(folder) == "trainer.pt: 1,000 bytes, the manifest says 5,000"  # sizes first
    (folder / "trainer.pt").unlink()
    assert manifest_problem(folder) == "trainer.pt: missing"
    (folder / "manifest.json").write_text("{not json")
    assert manifest_problem(folder).startswith("manifest.json does not read (JSONDecodeError")
    (folder / "manifest.json").write_text(json.dumps({"files": {"../../etc/hostname": {"size": 1, "sha256": "0"}}}))
    assert manifest_problem(folder) == "manifest.json lists '../../etc/hostname', a path outside its folder"
