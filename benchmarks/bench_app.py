"""Render time of every dashboard page (Streamlit AppTest) on a large store; target <= 2 s per page.

    python benchmarks/bench_app.py                   # 200 steps x 512 rollouts, FastRL + GRPO runs
    python benchmarks/bench_app.py --store /tmp/big  # keep (and reuse) the store there

The store is written through RunWriter from the store's synthetic steps (64 prompts x 8 rollouts, 256-d
sketches) with a keep rule applied, for a FastRL run and a GRPO baseline; an existing store (e.g.
bench_store_scale.py's) is reused as it is. "cold" = first visit with empty data caches, the app's and the
store's per-process ones (reads go to the run's summary and Parquet files), "warm" = the same page again (what a
live refresh costs when no new step arrived). The first page load of the process (imports) is measured
separately. This is the server's side of a page only: no browser draws it (bench_pages.py does).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def build_store(root: Path, steps: int, prompts: int, rollouts_per_prompt: int, sketch_dim: int) -> None:
    from fastrl_core.store import RunWriter
    from fastrl_core.store.fake_runs import fake_step

    for name, pruner, seconds_per_step in (("grpo", "none", 2.0), ("fastrl", "fastrl", 1.0)):
        writer = RunWriter(root, name=name, config={"steps": steps}, model="embedded", dataset="synthetic",
                           objective="grpo", pruner=pruner, budget="fixed" if pruner == "none" else "adaptive",
                           code_version="bench")
        pngs: dict = {}
        for step in range(steps):
            kwargs = fake_step(step, prompts=prompts, rollouts_per_prompt=rollouts_per_prompt,
                                    sketch_dim=sketch_dim, dataset_size=4 * prompts, pngs=pngs)
            if pruner == "none":
                for row in kwargs["rollouts"]:
                    row.update(kept=True, reason="KEPT", weight=1.0)
                for group in kwargs["groups"]:
                    group["kept"] = group["sampled"]
                kwargs["step_row"]["rollouts_kept"] = kwargs["step_row"]["rollouts_sampled"]
            else:
                for row in kwargs["rollouts"]:
                    row["reason"] = "KEPT" if row["kept"] else "ZERO_ADVANTAGE"
            kwargs["step_row"]["wall_time"] = (step + 1) * seconds_per_step
            writer.write_step(step, **kwargs)
            if step % 10 == 0 or step == steps - 1:
                accuracy = 0.3 + (0.3 if pruner == "none" else 0.4) * step / steps
                writer.write_eval(step, "test", accuracy, 256, wall_time=(step + 1) * seconds_per_step)
        writer.finish()
        print(f"  wrote {name}: {steps} steps x {prompts * rollouts_per_prompt} rollouts", flush=True)


def render(main: str, page: str | None, params: dict[str, str]) -> float:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(main, default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    if page is not None:
        at.switch_page(f"views/{page}.py")
    started = time.perf_counter()
    at.run()
    seconds = time.perf_counter() - started
    if at.exception:
        raise RuntimeError(f"page {page}: {at.exception[0].message}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None, help="store directory (built when empty)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--rollouts-per-prompt", type=int, default=8)
    parser.add_argument("--sketch-dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="warm renders per page (the median is shown)")
    args = parser.parse_args(argv)

    import streamlit as st
    import torch

    torch.set_num_threads(1)
    from fastrl_core import store
    from fastrl_core.store import readers

    root = args.store or Path(tempfile.mkdtemp(prefix="fastrl-bench-app-"))
    if not store.read_runs(root).shape[0]:
        started = time.perf_counter()
        build_store(root, args.steps, args.prompts, args.rollouts_per_prompt, args.sketch_dim)
        print(f"store {root} built in {time.perf_counter() - started:.0f} s", flush=True)
    runs = store.read_runs(root)
    fastrl = runs.loc[runs["pruner"] != "none", "run_id"].iloc[0]
    last = int(runs.loc[runs["run_id"] == fastrl, "last_step"].iloc[0])
    groups = store.read_groups(root, fastrl, step=last)
    os.environ["FASTRL_STORE"] = str(root)
    main_file = str(Path(__file__).resolve().parent.parent / "app" / "main.py")

    first = render(main_file, None, {})
    pages = [
        ("runs", None, {}),
        ("budget", "budget", {"run": fastrl}),
        ("rollouts (group)", "rollouts", {"run": fastrl, "step": str(last), "prompt": groups["prompt_id"].iloc[0]}),
        ("rollouts (all 512)", "rollouts", {"run": fastrl, "step": str(last), "prompt": "all"}),
        ("embeddings", "embeddings", {"run": fastrl}),
        ("demo", "demo", {"run": fastrl}),
    ]
    print(f"\n{root}: {runs.shape[0]} runs, {int(runs['steps'].max())} steps the longest; first page load of the "
          f"process (imports included): {first:.2f} s\n")
    print(f"{'page':22s} {'cold (s)':>9s} {'warm (s)':>9s}  <= 2 s")
    worst = 0.0
    for name, page, params in pages:
        st.cache_data.clear()
        readers._table_cache.clear()  # and the store's per-process caches: a fresh app's first visit
        readers._images_cache.clear()
        cold = render(main_file, page, params)
        warm = float(np.median([render(main_file, page, params) for _ in range(args.repeats)]))
        worst = max(worst, cold)
        print(f"{name:22s} {cold:9.2f} {warm:9.2f}  {'yes' if cold <= 2.0 else 'NO'}", flush=True)
    print(f"\nslowest cold render: {worst:.2f} s (target 2 s); "
          f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
