"""`fastrl demo`: FastRL and plain GRPO trained side by side on the shipped config `demo` while the dashboard serves.

The two runs are the recipes of those names (`fastrl_core.methods`) under one seed, built from the same config,
data order and warm start, and their steps are called round-robin in ONE process (`run_loop.run_interleaved`, the
loop of `fastrl train` and `fastrl bench`): a neighbouring job that slows the machine slows both alike, so the Demo
page may compare their seconds. They are named as bench runs (`bench-<method>-seed<seed>`), which is how the
dashboard recognises runs that were timed interleaved. One progress bar covers both runs. When both are done the
dashboard keeps serving until Ctrl-C (or SIGTERM), which also stops training, marks the unfinished runs "stopped"
and names each with the command that continues it.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

DEMO_METHODS = ("fastrl", "grpo")  # bench method names
CONFIG = "demo"  # a shipped config (fastrl_core/configs/demo.yaml)


def demo_configs(store: Path, overrides: list[str], seed: int = 0, config: str | Path = CONFIG) -> dict:
    """method -> RunConfig of each demo run (the bench's method overrides, then `overrides`)."""
    from fastrl_app.bench import method_config

    return {method: method_config(config, method, seed, str(store), overrides) for method in DEMO_METHODS}


def train_demo(store: Path, overrides: list[str], *, show_progress: bool = True) -> dict[str, str]:
    """Train the demo's two runs into `store` as `fastrl bench` trains one seed (`bench.train_interleaved`: a step
    of each in turn, one progress bar over both, Ctrl-C / SIGTERM / errors mark the runs); method -> run id."""
    from tqdm.auto import tqdm

    from fastrl_app.bench import train_interleaved

    return train_interleaved(demo_configs(store, overrides), log=lambda line: tqdm.write(line, file=sys.stdout),
                             progress=show_progress, label="demo (both runs)")


def run_demo(*, store: Path, port: int, address: str, steps: int | None, overrides: list[str] | None = None,
             serve_after: bool = True) -> int:
    """Serve the dashboard on `store`, train both runs side by side, then keep serving until Ctrl-C
    (`serve_after=False`: return once trained)."""
    from fastrl_app.launch import serve

    def interrupt(signum, frame):  # SIGTERM (e.g. `timeout`, a container stop) stops cleanly like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    # Python leaves SIGINT ignored when it starts ignored (a job started in the background by a script), and then
    # `kill -INT` would not stop the demo: Ctrl-C stops it however it was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()  # the wall time README states: app start, warm start, training and evaluations
    store.mkdir(parents=True, exist_ok=True)
    overrides = [*(overrides or []), *([f"steps={steps}"] if steps is not None else [])]
    steps_each = demo_configs(store, overrides)["grpo"].steps  # a bad override fails before the app starts
    app = serve(store, port=port, address=address, timeout=90)  # returns once healthy
    trained = False
    try:
        print(f"\nFastRL dashboard: http://{address}:{port}   (store: {store}; Ctrl-C stops)\n"
              f"Training {' and '.join(DEMO_METHODS)} interleaved step by step (config {CONFIG}: "
              f"{steps_each} steps each)", flush=True)
        train_demo(store, overrides)
        trained = True
        print(f"\nBoth runs finished in {(time.monotonic() - started) / 60:.1f} min. "
              f"`fastrl report --store {store} --out demo.html` writes the Demo page as one HTML file.", flush=True)
        if not serve_after:
            return 0
        print(f"The dashboard stays up at http://{address}:{port} until Ctrl-C.", flush=True)
        while app.poll() is None:
            time.sleep(1)
        return 0
    except KeyboardInterrupt as error:
        notes = getattr(error, "__notes__", [])  # train_interleaved's: each run marked stopped, and its resume
        print("\nstopping the dashboard" + (" (both runs had finished)" if trained else "")
              + "".join(f"\n  {note}" for note in notes), flush=True)
        return 0
    finally:
        if app.poll() is None:
            app.send_signal(signal.SIGINT)
            try:
                app.wait(timeout=15)
            except Exception:
                app.kill()
