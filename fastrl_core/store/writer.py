"""The trainer's side of the store: one RunWriter per run, one atomic unit per training step."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.parquet as pq

from fastrl_core import faults
from fastrl_core.store import layout, schema, summary
from fastrl_core.store.compact import compact, write_summaries
from fastrl_core.store.config_history import fold_after, with_change

logger = logging.getLogger(__name__)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STATUSES = ("running", "finished", "failed", "stopped")


def image_key(png_bytes: bytes) -> str:
    """The content key of an image: sha256 hex of its PNG bytes; rollouts refer to it as `image_ref`."""
    return hashlib.sha256(png_bytes).hexdigest()


def default_code_version() -> str:
    """`git describe --always --dirty` of the source tree when it is a git checkout, else the package version."""
    from fastrl_core import __version__

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return __version__
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else __version__


def _length(values) -> str:
    return "None" if values is None else f"{len(values)} items"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class RunWriter:
    """Writes one run into a store directory; safe against live readers in other processes and against being
    killed at any point (every file is renamed into place; a step's steps row is written last).

    One writer per run: it holds the run's lock (`layout.lock_run`, released by the OS when the process dies) from
    construction to `finish`, and a second writer gets `layout.RunLocked`. While it lives, a thread touches the
    run's heartbeat file every `layout.HEARTBEAT_S` (readers show a "running" run with a stale one as "no
    heartbeat"). `RunWriter.resume(store_dir, run_id)` reopens a run after a crash.
    """

    _lock_fd: int | None = None
    _beat: threading.Event | None = None
    _since_summary = 0  # steps written since the summary files were last refreshed

    def __init__(self, store_dir: str | Path, *, name: str, config: dict, model: str, dataset: str,
                 objective: str, pruner: str, budget: str, code_version: str | None = None,
                 run_id: str | None = None) -> None:
        self.store_dir = Path(store_dir).resolve()
        for key, value in dict(name=name, model=model, dataset=dataset, objective=objective, pruner=pruner,
                               budget=budget).items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"runs: key {key!r} must be a non-empty str, got {value!r}")
        if not isinstance(config, dict):
            raise ValueError(f"runs: key 'config' must be a dict, got {type(config).__name__}")
        (self.store_dir / "runs").mkdir(parents=True, exist_ok=True)
        self.run_id = self._claim_run_dir(name, run_id)
        self._lock_fd = layout.lock_run(self.store_dir, self.run_id)
        self.meta = {
            "run_id": self.run_id, "name": name, "config": json.loads(json.dumps(config, default=str)),
            "code_version": code_version or default_code_version(), "model": model, "dataset": dataset,
            "objective": objective, "pruner": pruner, "budget": budget, "started": _now(), "finished": None,
            "status": "running", "error": None, "sketch_dim": None, "config_history": [],
        }
        self._run_dir = layout.run_dir(self.store_dir, self.run_id)
        for table in layout.TABLE_DIRS:
            (self._run_dir / table).mkdir(exist_ok=True)
        layout.write_json(self.meta, self._run_dir / "run.json")
        layout.init_store(self.store_dir)
        self._clock_origin = time.time()
        self._stored_images: set[str] = set()  # image refs in this run's images files
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        """Touch the heartbeat file now and every HEARTBEAT_S from a daemon thread until `finish`."""
        store_dir, run_id = self.store_dir, self.run_id  # not self: the thread must not keep the writer alive
        layout.touch_heartbeat(store_dir, run_id)
        stop = self._beat = threading.Event()

        def beat() -> None:
            while not stop.wait(layout.HEARTBEAT_S):
                layout.touch_heartbeat(store_dir, run_id)

        threading.Thread(target=beat, name=f"heartbeat-{self.run_id}", daemon=True).start()

    def close(self) -> None:
        """Stop the heartbeat and release the run's lock (without changing its status)."""
        if self._beat is not None:
            self._beat.set()
            self._beat = None
        layout.unlock_run(self._lock_fd)
        self._lock_fd = None

    def __del__(self) -> None:  # a writer nobody holds writes nothing: its run is free for another
        self.close()

    def _claim_run_dir(self, name: str, run_id: str | None) -> str:
        if run_id is not None:
            try:
                layout.run_dir(self.store_dir, run_id).mkdir()
            except FileExistsError:
                raise ValueError(f"run {run_id!r} already exists in {self.store_dir}; "
                                 "use RunWriter.resume(store_dir, run_id)") from None
            return run_id
        kept = layout.run_id_base(name)
        base = f"{kept}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        for suffix in range(1000):  # mkdir is atomic: two writers starting together get different ids
            candidate = base if suffix == 0 else f"{base}-{suffix + 1}"
            try:
                layout.run_dir(self.store_dir, candidate).mkdir()
            except FileExistsError:
                continue
            if kept != name:
                logger.warning("run name %r became %r in the run id %s (run ids keep only ASCII letters, digits, "
                               "'.', '_' and '-', up to 64 of them)", name, kept, candidate)
            return candidate
        raise RuntimeError(f"could not find a free run id for {base!r}")

    @classmethod
    def resume(cls, store_dir: str | Path, run_id: str, *, from_step: int | None = None,
               lock_fd: int | None = None) -> "RunWriter":
        """Reopen a run: its steps are kept, its status goes back to "running", and wall_time continues from the
        last kept step. Re-writing an existing step replaces it (see write_step). `from_step`: drop the steps >= it
        and the evaluations > it first, e.g. those a crashed trainer wrote after its last checkpoint (taken after
        step `from_step` - 1 and its evaluation at `from_step`: that one is kept, it is not redone). `lock_fd`: the
        run's lock when the caller took it already (`layout.lock_run`); else it is taken here (RunLocked if another
        process writes the run)."""
        self = cls.__new__(cls)
        self.store_dir = Path(store_dir).resolve()
        self.run_id = run_id
        self._run_dir = layout.run_dir(self.store_dir, run_id)
        self.meta = layout.read_run_json(self.store_dir, run_id)
        self._lock_fd = lock_fd if lock_fd is not None else layout.lock_run(self.store_dir, run_id)
        layout.remove_temp_files(self._run_dir)
        if from_step is not None:
            self._drop_steps(from_step)
            self.meta["config_history"] = fold_after(self.meta.get("config_history", []), from_step)
        self.meta.update(status="running", finished=None, error=None)
        layout.write_json(self.meta, self._run_dir / "run.json")
        layout.init_store(self.store_dir)
        steps = layout.step_numbers(self.store_dir, run_id, "steps")
        elapsed = 0.0
        if steps:
            last = pq.read_table(layout.step_file(self.store_dir, run_id, "steps", steps[-1]), columns=["wall_time"])
            elapsed = last.column(0)[0].as_py() or 0.0
        self._clock_origin = time.time() - elapsed
        self._stored_images = self._images_on_disk()
        self._start_heartbeat()
        return self

    def record_config(self, step: int, config: dict, changes: dict[str, tuple]) -> None:
        """A resumed run's config: `config` is in force from `step` on; `changes` ({key: (old, new)}, each allowed
        explicitly) go into its config history from that step (`store.config_history`), and the runs row's
        objective, pruner and budget follow the config. Keys the record lacked (added since) are filled in."""
        config = json.loads(json.dumps(config, default=str))
        moved = {key: {"from": json.loads(json.dumps(old, default=str)), "to": config[key]}
                 for key, (old, _) in changes.items()}
        self.meta["config_history"] = with_change(self.meta.get("config_history", []), int(step), moved, _now())
        self.meta["config"] = config
        self.meta.update({key: str(config[key]) for key in ("objective", "pruner", "budget") if key in config})
        layout.write_json(self.meta, self._run_dir / "run.json")

    def _images_on_disk(self) -> set[str]:
        """Image refs in the run's readable images files (a damaged one is left out: its images are stored again
        when next used)."""
        refs = set()
        for path in layout.table_files(self.store_dir, self.run_id, "images"):
            try:
                refs.update(pq.read_table(path, columns=["image_ref"]).column(0).to_pylist())
            except (OSError, ValueError):
                continue
        return refs

    def _drop_steps(self, from_step: int) -> None:
        for step in layout.step_numbers(self.store_dir, self.run_id, "steps"):
            if step >= from_step:  # the steps file first: the step disappears whole
                for table in layout.STEP_TABLES:
                    layout.step_file(self.store_dir, self.run_id, table, step).unlink(missing_ok=True)
        for table in ("rollouts", "groups", "proj", "images"):  # leftovers of a step killed before its steps file
            for step in layout.step_numbers(self.store_dir, self.run_id, table):
                if step >= from_step:
                    layout.step_file(self.store_dir, self.run_id, table, step).unlink()
        for path in layout.eval_files(self.store_dir, self.run_id):
            if layout.eval_step(path) > from_step:  # the one at from_step came before the checkpoint: kept
                Path(path).unlink()

    def write_step(self, step: int, *, step_row: dict, groups: list[dict], rollouts: list[dict],
                   images: dict[str, bytes]) -> None:
        """Write one training step as one all-or-nothing unit.

        images: {image_key(png): png bytes}; those new to this run go into the step's images file (a ref the run
        already stored may be used without its bytes). Then the rollouts, the groups, and last the steps row:
        readers only consider steps whose steps file exists. Checks before writing anything:
        every row against its schema; rollouts_sampled / rollouts_kept equal the groups' sums; each group's
        sampled / kept equal its rollouts; unique ids; image refs present; one sketch length per run. An empty
        `rollouts` list means rollouts are not logged: only the groups are checked then. `step_row` may
        repeat the step (it must match); wall_time defaults to seconds since the run started.
        Re-writing a step first hides the old one (removes its steps file), then writes the new one. Every
        `summary.EVERY` steps the run's summary files are refreshed (reading only the steps written since).
        """
        if not schema.is_int(step) or step < 0:
            raise ValueError(f"steps: step must be an int >= 0, got {step!r}")
        step = int(step)
        self._check_images(images)
        if not isinstance(step_row, dict):
            raise ValueError(f"steps row 0: expected a dict, got {type(step_row).__name__}")
        step_row = dict(step_row)
        for key, value in (("run_id", self.run_id), ("step", step)):
            if key in step_row and step_row.pop(key) != value:
                raise ValueError(f"steps row 0: key {key!r} is {value!r} here (the writer fills it in)")
        step_values = schema.validate_rows("steps", [step_row], schema.STEPS, extra_numeric=True)
        group_values = schema.validate_rows("groups", groups, schema.GROUPS)
        rollout_values = schema.validate_rows("rollouts", rollouts, schema.ROLLOUTS)
        self._check_consistency(step_row, group_values, rollout_values, images)
        sketch_dim = self._check_sketch_dim(rollout_values["sketch"])
        if step_values["wall_time"][0] is None:
            step_values["wall_time"] = [time.time() - self._clock_origin]

        key = {"run_id": self.run_id, "step": step}
        tables = {
            "rollouts": schema.to_arrow(key, rollout_values, schema.STEP_KEY, schema.ROLLOUTS, len(rollouts),
                                        "rollouts"),
            "groups": schema.to_arrow(key, group_values, schema.STEP_KEY, schema.GROUPS, len(groups)),
            "steps": schema.to_arrow(key, step_values, schema.STEP_KEY, schema.STEPS, 1),
        }
        new_images = {ref: bytes(png) for ref, png in images.items() if ref not in self._stored_images}
        if new_images:
            self._write_images(step, new_images)
        if sketch_dim is not None and self.meta.get("sketch_dim") is None:
            self.meta["sketch_dim"] = sketch_dim
            layout.write_json(self.meta, self._run_dir / "run.json")
        layout.step_file(self.store_dir, self.run_id, "steps", step).unlink(missing_ok=True)
        layout.step_file(self.store_dir, self.run_id, "proj", step).unlink(missing_ok=True)
        for table in ("rollouts", "groups", "steps"):  # steps last: it makes the step visible
            layout.write_parquet(tables[table], layout.step_file(self.store_dir, self.run_id, table, step),
                                 row_group_size=layout.ROLLOUT_ROW_GROUP if table == "rollouts" else None)
            faults.reach(f"step.{table}_written" if table != "steps" else "step.written")
        self._since_summary += 1
        if self._since_summary >= summary.EVERY:  # a fresh reader opens these instead of every step's files
            write_summaries(self.store_dir, self.run_id)
            self._since_summary = 0

    def _write_images(self, step: int, images: dict[str, bytes]) -> None:
        """One file per step with the images this run uses for the first time, not a file per image (16 of them
        in each first-epoch step of the embedded default). Re-writing a step keeps the images its old file had:
        later steps may use them."""
        path = layout.step_file(self.store_dir, self.run_id, "images", step)
        images = dict(images)
        if path.exists():
            old = pq.read_table(path, columns=["image_ref", "png"])
            images = dict(zip(old.column(0).to_pylist(), old.column(1).to_pylist())) | images
        refs = sorted(images)  # sorted, in small row groups: read_image's filter skips the others by their min/max
        table = schema.to_arrow({"run_id": self.run_id, "step": step},
                                {"image_ref": refs, "png": [images[ref] for ref in refs]},
                                schema.STEP_KEY, schema.IMAGES, len(refs))
        layout.write_parquet(table, path, row_group_size=layout.IMAGE_ROW_GROUP)
        self._stored_images.update(images)

    def _check_images(self, images: dict) -> None:
        if not isinstance(images, dict):
            raise ValueError(f"images: expected a dict {{image_key: png bytes}}, got {type(images).__name__}")
        for ref, png in images.items():
            if not isinstance(png, (bytes, bytearray)) or not bytes(png[:8]) == PNG_MAGIC:
                raise ValueError(f"images[{ref!r}]: expected PNG bytes")
            if ref != image_key(png):
                raise ValueError(f"images[{ref!r}]: key is not image_key(png) = {image_key(png)!r}")

    def _check_consistency(self, step_row: dict, groups: dict, rollouts: dict, images: dict) -> None:
        if len(set(groups["prompt_id"])) != len(groups["prompt_id"]):
            raise ValueError("groups: prompt_id values must be unique within a step")
        for key, total in (("rollouts_sampled", sum(groups["sampled"])), ("rollouts_kept", sum(groups["kept"]))):
            if step_row[key] != total:
                raise ValueError(f"steps row 0: {key}={step_row[key]} but the groups sum to {total}")
        n = len(rollouts["rollout_id"])
        if n == 0:  # rollouts not logged
            return
        if step_row["rollouts_sampled"] != n:
            raise ValueError(f"steps row 0: rollouts_sampled={step_row['rollouts_sampled']} but {n} rollouts given")
        if len(set(rollouts["rollout_id"])) != n:
            raise ValueError("rollouts: rollout_id values must be unique within a step")
        for i, (text, logprob) in enumerate(zip(rollouts["token_text"], rollouts["token_logprob"])):
            if (text is None) != (logprob is None) or (text is not None and len(text) != len(logprob)):
                raise ValueError(f"rollouts row {i}: keys 'token_text' and 'token_logprob' must both be lists of one "
                                 f"length, or both None; got {_length(text)} and {_length(logprob)}")
        per_prompt: dict[str, list[int]] = {}
        for prompt_id, is_kept in zip(rollouts["prompt_id"], rollouts["kept"]):
            counts = per_prompt.setdefault(prompt_id, [0, 0])
            counts[0] += 1
            counts[1] += bool(is_kept)
        for i, (prompt_id, sampled, kept) in enumerate(zip(groups["prompt_id"], groups["sampled"], groups["kept"])):
            if per_prompt.get(prompt_id, [0, 0]) != [sampled, kept]:  # with the sums above: no prompt left out
                raise ValueError(f"groups row {i}: prompt {prompt_id!r} has sampled={sampled}, kept={kept} but the "
                                 "rollouts disagree")
        for ref in dict.fromkeys(rollouts["image_ref"]):  # each prompt's image once, not per rollout
            if ref is None or ref in images or ref in self._stored_images:
                continue
            i = rollouts["image_ref"].index(ref)
            if not layout.IMAGE_REF.fullmatch(ref):
                raise ValueError(f"rollouts row {i}: key 'image_ref' {ref!r} is not an image key (image_key(png), "
                                 "or None for a prompt without an image)")
            raise ValueError(f"rollouts row {i}: key 'image_ref' {ref!r} is neither in images nor stored by this run")

    def _check_sketch_dim(self, sketches: np.ndarray | None) -> int | None:
        if sketches is None:
            return None
        dim, known = sketches.shape[1], self.meta.get("sketch_dim")
        if known is not None and dim != known:
            raise ValueError(f"rollouts: key 'sketch' has length {dim}, this run's sketches have {known}")
        return dim

    def write_eval(self, step: int, split: str, accuracy: float, n: int, **extra: float) -> None:
        """Record an evaluation at `step` (one file per step and split; writing it again replaces it)."""
        if not schema.is_int(step) or step < 0:
            raise ValueError(f"evals: step must be an int >= 0, got {step!r}")
        if not isinstance(split, str) or not layout.SPLIT.fullmatch(split):
            raise ValueError(f"evals: split {split!r} must match {layout.SPLIT.pattern}")
        row = {"split": split, "accuracy": accuracy, "n": n, **extra}
        values = schema.validate_rows("evals", [row], schema.EVALS, extra_numeric=True)
        table = schema.to_arrow({"run_id": self.run_id, "step": int(step)}, values, schema.STEP_KEY, schema.EVALS, 1)
        layout.write_parquet(table, layout.eval_file(self.store_dir, self.run_id, int(step), split))

    def set_projection(self, step: int, rollout_ids: Sequence[str], xy: np.ndarray) -> None:
        """Store 2-D map coordinates for some of `step`'s rollouts (own file beside the step; replaces any
        earlier projection of that step). xy: (n, 2)."""
        path = layout.step_file(self.store_dir, self.run_id, "rollouts", step)
        if not layout.step_file(self.store_dir, self.run_id, "steps", step).exists():
            raise ValueError(f"proj: step {step} of run {self.run_id!r} has not been written")
        xy = np.asarray(xy, dtype=np.float64)
        ids = list(rollout_ids)
        if xy.shape != (len(ids), 2):
            raise ValueError(f"proj: xy must have shape ({len(ids)}, 2) for {len(ids)} rollout ids, got {xy.shape}")
        if not all(isinstance(i, str) for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("proj: rollout_ids must be unique strings")
        known = set(pq.read_table(path, columns=["rollout_id"]).column(0).to_pylist())
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ValueError(f"proj: rollout_id {unknown[0]!r} is not a rollout of step {step}")
        rows = {"rollout_id": ids, "proj_x": xy[:, 0].tolist(), "proj_y": xy[:, 1].tolist()}
        table = schema.to_arrow({"run_id": self.run_id, "step": int(step)}, rows, schema.STEP_KEY, schema.PROJ,
                                len(ids))
        layout.write_parquet(table, layout.step_file(self.store_dir, self.run_id, "proj", step))

    def finish(self, status: str = "finished", error: str | None = None) -> None:
        """Mark the run ended ("finished", "stopped" or "failed", `error`: why, its first line is kept), release
        its lock, write its summary files (`store.summary`), and compact a finished run into
        runs/<run_id>/<run_id>.duckdb (`compact`, which writes the summaries)."""
        if status not in STATUSES[1:]:
            raise ValueError(f"runs: status {status!r} must be one of {STATUSES[1:]}")
        first_line = next((line.strip() for line in str(error or "").splitlines() if line.strip()), None)
        self.meta.update(status=status, finished=_now(), error=first_line)
        try:
            layout.write_json(self.meta, self._run_dir / "run.json")
            if status == "finished":
                compact(self.store_dir, self.run_id)
            else:
                write_summaries(self.store_dir, self.run_id)
        finally:
            self.close()

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.meta["status"] == "running":
            if exc_type is None:
                self.finish("finished")
            else:
                self.finish("stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed",
                            f"{exc_type.__name__}: {exc}")
