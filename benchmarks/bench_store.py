"""Run-store costs: (a) write_step on the embedded default step, (b) the app's queries on a 200 x 512 run,
(c) the store's share of real embedded-default training steps, FastRL and GRPO.

    .venv/bin/python benchmarks/bench_store.py [--steps 200] [--rollouts 512] [--repeat 7] [--train-steps 40]

(a) 16 prompts x 8 rollouts, 256-dim sketches, one 112x112 PNG per prompt: ms per write_step, then its parts.
(b) a synthetic run of --steps steps x --rollouts rollouts (64 prompts x 8),
then each read_* query the app uses, median and worst of --repeat calls after one warm-up (target < 200 ms;
the "export" row reads every rollout with its text, which no page does, and is there for scale).
The last rows compare the same queries through the store.duckdb views (connect read_only + SQL), the
alternative reader design.
(c) fastrl_core/configs/embedded.yaml for --train-steps steps (no evals), as FastRL and as the GRPO baseline
(pruner=none budget=fixed): the trainer's `time_store` (each step's write, new images included) as a share of its
step time (target < 2 %). The first epoch writes every prompt's image, so these early steps are the dearest.
Then read_image on those runs' images, cold (indexing every images file) and warm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq

from fastrl_core import store
from fastrl_core.store import layout, readers, schema
from fastrl_core.store.fake_runs import fake_step, write_fake_run


def timed(fn, repeat: int) -> tuple[float, float]:
    fn()  # warm-up (first call pays the DuckDB connection)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), 1e3 * max(times)


def bench_write(root: Path, steps: int = 40) -> None:
    pngs: dict[int, bytes] = {}
    data = [fake_step(s, prompts=16, rollouts_per_prompt=8, sketch_dim=256, pngs=pngs) for s in range(steps)]
    writer = store.RunWriter(root, name="bench-write", config={}, model="m", dataset="d", objective="grpo",
                             pruner="none", budget="fixed", code_version="bench")
    times = []
    for s, kwargs in enumerate(data):
        start = time.perf_counter()
        writer.write_step(s, **kwargs)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    writer.finish()
    finish = time.perf_counter() - start
    first, rest = 1e3 * times[0], [1e3 * t for t in times[1:]]
    median = statistics.median(rest)
    print(f"(a) write_step, 16 prompts x 8 rollouts, D=256, 16 PNGs 112x112, {steps} steps")
    print(f"    first step {first:.1f} ms (writes its images); later steps median {median:.1f} ms, "
          f"max {max(rest):.1f} ms")
    print(f"    finish() incl. compact of {steps} steps: {1e3 * finish:.0f} ms (once per run)")
    bench_write_parts(root, data[-1])


def bench_write_parts(root: Path, step: dict, repeat: int = 30) -> None:
    """Where a write_step goes, table by table, and Parquet's default dictionary encoding on every column (what
    layout.write_parquet turns off for non-string columns) beside the store's setting."""
    key = {"run_id": "bench", "step": 0}
    tables = {"rollouts": (step["rollouts"], schema.ROLLOUTS), "groups": (step["groups"], schema.GROUPS),
              "steps": ([{"wall_time": 1.0, **step["step_row"]}], schema.STEPS)}  # the writer fills wall_time
    print("    per part, median of 30 (ms):  table     validate  to_arrow  parquet  parquet, dictionary on all")
    for name, (rows, columns) in tables.items():
        extra = name == "steps"
        values = schema.validate_rows(name, rows, columns, extra_numeric=extra)
        table = schema.to_arrow(key, values, schema.STEP_KEY, columns, len(rows))
        path = root / f"part-{name}.parquet"
        validate, _ = timed(lambda: schema.validate_rows(name, rows, columns, extra_numeric=extra), repeat)
        arrow, _ = timed(lambda: schema.to_arrow(key, values, schema.STEP_KEY, columns, len(rows)), repeat)
        store_setting, _ = timed(lambda: layout.write_parquet(table, path), repeat)
        dictionary, _ = timed(lambda: pq.write_table(table, path), repeat)
        print(f"    {'':30}  {name:<8} {validate:9.2f} {arrow:9.2f} {store_setting:8.2f} {dictionary:9.2f}")


def bench_read(root: Path, steps: int, rollouts: int, repeat: int) -> None:
    start = time.perf_counter()
    run_id = write_fake_run(root, steps=steps, name="bench-read", prompts=rollouts // 8, rollouts_per_prompt=8,
                                 sketch_dim=256, finish=False)
    build = time.perf_counter() - start
    last = store.latest_step(root, run_id)
    image_ref = store.read_rollouts(root, run_id, step=last, columns=["image_ref"], limit=1)["image_ref"][0]
    writer = store.RunWriter.resume(root, run_id)  # a projection on the last steps, as the background job writes
    for step in range(last - 4, last + 1):
        ids = store.read_rollouts(root, run_id, step=step, columns=["rollout_id"])["rollout_id"].tolist()
        writer.set_projection(step, ids, np.random.default_rng(step).standard_normal((len(ids), 2)))
    prompt = store.read_groups(root, run_id, step=last)["prompt_id"].iloc[0]
    total = len(store.read_rollouts(root, run_id, columns=["rollout_id"]))
    print(f"\n(b) {steps} steps x ~{rollouts} rollouts ({total} rollouts, D=256) built in {build:.1f} s; "
          f"median / max of {repeat} calls")
    def cold(fn):  # without the per-process cache of steps rows (a fresh app process)
        def run():
            readers._table_cache.clear()
            return fn()
        return run

    queries = {
        "read_runs()  [cold: steps cache cleared]": cold(lambda: store.read_runs(root)),
        "read_runs()": lambda: store.read_runs(root),
        "read_steps(run)  [cold: steps cache cleared]": cold(lambda: store.read_steps(root, run_id)),
        "read_steps(run)": lambda: store.read_steps(root, run_id),
        "read_groups(run, step=last)": lambda: store.read_groups(root, run_id, step=last),
        "read_rollouts(run, step=last)": lambda: store.read_rollouts(root, run_id, step=last),
        "read_rollouts(run, kept=False, correct=True, limit=200)":
            lambda: store.read_rollouts(root, run_id, kept=False, correct=True, limit=200),
        "read_rollouts(run, prompt_id=p)  [all steps]": lambda: store.read_rollouts(root, run_id, prompt_id=prompt),
        "read_rollouts(run, columns=[step, kept, reason])  [all steps]":
            lambda: store.read_rollouts(root, run_id, columns=["step", "kept", "reason"]),
        "read_rollouts(run)  [export: all 19 columns, all steps]": lambda: store.read_rollouts(root, run_id),
        "read_sketches(run, steps=last 5)": lambda: store.read_sketches(root, run_id, steps=range(last - 4, last + 1)),
        "read_sketches(run, steps=last 20)":
            lambda: store.read_sketches(root, run_id, steps=range(last - 19, last + 1)),
        "read_budget_matrix(run)": lambda: store.read_budget_matrix(root, run_id),
        "read_evals(run)": lambda: store.read_evals(root, run_id),
        "latest_step(run)": lambda: store.latest_step(root, run_id),
        "read_image(ref)": lambda: store.read_image(root, run_id, image_ref),
    }
    database = str(root / "store.duckdb")

    def view(sql: str):
        def run():
            with duckdb.connect(database, read_only=True, config={"file_search_path": str(root)}) as con:
                return con.sql(sql).df()
        return run

    queries |= {
        "[views] steps of run": view(f"SELECT * FROM steps WHERE run_id = '{run_id}' ORDER BY step"),
        "[views] rollouts of last step": view(f"SELECT * EXCLUDE (sketch) FROM rollouts WHERE run_id = '{run_id}' "
                                              f"AND step = {last}"),
        "[views] budget matrix": view(f"SELECT step, prompt_id, sampled, kept FROM groups "
                                      f"WHERE run_id = '{run_id}' ORDER BY step"),
    }
    width = max(map(len, queries))
    print(f"    {'query':<{width}}  median ms   max ms")
    for name, fn in queries.items():
        median, worst = timed(fn, repeat)
        flag = "" if median < 200 or "export" in name else "  (over 200 ms)"
        print(f"    {name:<{width}}  {median:9.1f}  {worst:7.1f}{flag}")
    writer.finish()
    start = time.perf_counter()
    path = store.compact(root, run_id)
    print(f"    compact(run) -> {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - start:.1f} s")


def bench_training(root: Path, steps: int) -> None:
    from transformers.utils import logging as hf_logging

    from fastrl_core.run_config import load_config
    from fastrl_core.run_setup import load_datasets
    from fastrl_core.trainer import Trainer

    hf_logging.disable_progress_bar()

    config_path = "embedded"
    print(f"\n(c) store writes inside real training: fastrl_core/configs/embedded.yaml, {steps} steps, no evals")
    print(f"    {'run':<8} {'step s':>7} {'store ms':>9} {'share':>7}  "
          "(medians over steps 1..; share = sum store / sum step)")
    for name, overrides in (("fastrl", []), ("grpo", ["pruner=none", "budget=fixed"])):
        config = load_config(config_path, [f"steps={steps}", "eval_every=0", "checkpoint_every=0",
                                           f"store_dir={root}", f"run_name=bench-{name}", *overrides])
        load_datasets(config)  # the synthetic dataset is generated on first use: its 2,300 files are flushed to
        os.sync()  # disk here, not in the middle of the first run's writes
        trainer = Trainer(config, progress=False)
        trainer.run()
        rows = store.read_steps(root, trainer.writer.run_id).iloc[1:]  # step 0 carries no previous write
        step_seconds = rows[[f"time_{phase}" for phase in store.PHASES]].sum(axis=1)
        share = 100 * rows["time_store"].sum() / step_seconds.sum()
        print(f"    {name:<8} {step_seconds.median():7.3f} {1e3 * rows['time_store'].median():9.2f} {share:6.2f} %"
              f"{'' if share < 2 else '  (over the 2 % target)'}")
    ref = store.read_rollouts(root, trainer.writer.run_id, step=steps - 1, columns=["image_ref"])["image_ref"][0]
    files = len(list(root.glob("runs/*/images/*.parquet")))
    run_id = trainer.writer.run_id
    cold, _ = timed(lambda: (readers._images_cache.clear(), store.read_image(root, run_id, ref)), 3)
    warm, _ = timed(lambda: store.read_image(root, run_id, ref), 7)
    print(f"    read_image of a last-step prompt: {cold:.1f} ms cold (indexes {files} images files), "
          f"{warm:.1f} ms warm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rollouts", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--train-steps", type=int, default=40, help="(c): steps per training run; 0 skips (c)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work inflates timings)")
    with tempfile.TemporaryDirectory() as tmp:
        bench_write(Path(tmp) / "write")
        bench_read(Path(tmp) / "read", args.steps, args.rollouts, args.repeat)
        if args.train_steps:
            bench_training(Path(tmp) / "train", args.train_steps)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
