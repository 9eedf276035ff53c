"""`fastrl demo`: train FastRL, then a GRPO baseline, on the embedded default while the dashboard serves.

The two runs are the bench's methods of those names (`fastrl_core.bench.METHODS`, through `fastrl train --method`),
so the demo shows the FastRL that README's results measure (on this regime: docs/bench/embedded-decided/). They go
one after another (the machine has 2 cores), in a child process each, writing the store the app reads live.
Ctrl-C (or SIGTERM) stops the training child and the app and leaves every finished step readable.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

DEMO_RUNS = ("fastrl", "grpo")  # bench method names, trained in this order
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "embedded.yaml"


def training_command(store: Path, method: str, steps: int | None) -> list[str]:
    """`fastrl train CONFIG --method METHOD` into `store`, as run `method` (and `steps` steps unless None)."""
    command = [sys.executable, "-m", "fastrl_core.cli", "train", str(CONFIG), "--method", method,
               f"store_dir={store}", f"run_name={method}"]
    if steps is not None:
        command.append(f"steps={steps}")
    return command


def run_demo(*, store: Path, port: int, address: str, steps: int | None) -> int:
    from app.launch import serve
    from fastrl_core.bench import METHODS

    def interrupt(signum, frame):  # SIGTERM (e.g. `timeout`, a container stop) stops cleanly like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    store.mkdir(parents=True, exist_ok=True)
    app = serve(store, port=port, address=address, timeout=90)  # returns once healthy
    trainer: subprocess.Popen | None = None
    try:
        print(f"\nFastRL dashboard: http://{address}:{port}   (store: {store}; Ctrl-C stops)\n", flush=True)
        for method in DEMO_RUNS:
            print(f"== training {method} ({' '.join(METHODS[method])})", flush=True)
            trainer = subprocess.Popen(training_command(store, method, steps))
            if trainer.wait() != 0:
                print(f"training {method} failed with exit code {trainer.returncode}", file=sys.stderr)
                return trainer.returncode
            trainer = None
        print(f"\nBoth runs finished. The dashboard stays up at http://{address}:{port} until Ctrl-C.", flush=True)
        while app.poll() is None:
            time.sleep(1)
        return 0
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    finally:
        for process in (trainer, app):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
