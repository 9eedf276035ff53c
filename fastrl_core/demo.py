"""`fastrl demo`: FastRL and plain GRPO trained side by side on configs/demo.yaml while the dashboard serves.

The two runs are the bench's methods of those names (`fastrl_core.bench.METHODS`) under one seed, built from the
same config, data order and warm start, and their steps are called round-robin in ONE process (`train_side_by_side`,
as `fastrl bench` does): a neighbouring job that slows the machine slows both alike, so the Demo page may compare
their seconds. They are named as bench runs (`bench-<method>-seed<seed>`), which is how the dashboard recognises
runs that were timed interleaved. One progress bar covers both runs. When both are done the dashboard keeps serving
until Ctrl-C (or SIGTERM), which also stops training and marks the unfinished runs "stopped".
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

DEMO_METHODS = ("fastrl", "grpo")  # bench method names
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def demo_configs(store: Path, overrides: list[str], seed: int = 0, config: Path = CONFIG) -> dict:
    """method -> TrainConfig of each demo run (the bench's method overrides, then `overrides`)."""
    from fastrl_core.bench import method_config

    return {method: method_config(config, method, seed, str(store), overrides) for method in DEMO_METHODS}


def train_side_by_side(configs: dict, on_step: Callable[[str, dict], None],
                       on_eval: Callable[[str, int, dict], None]) -> dict[str, str]:
    """The demo's run loop: one `Trainer` per method, one `train_step()` each in turn (the order rotated every
    round), evaluation at step 0 and every `eval_every` steps and at the end (not timed), then each run marked
    finished; `on_step(method, step_row)` after every step, `on_eval(method, step, result)` after every evaluation.
    Returns method -> run id. (The one place to switch to the trainer's unified run loop.)"""
    from fastrl_core.trainer import Trainer

    trainers = {method: Trainer(config, progress=False) for method, config in configs.items()}
    active = dict(trainers)
    try:
        for method, trainer in trainers.items():
            if trainer.config.eval_every:
                on_eval(method, 0, trainer.evaluate())
        rounds = 0
        while active:
            names = list(active)
            shift = rounds % len(names)
            rounds += 1
            for method in names[shift:] + names[:shift]:
                trainer = active[method]
                if trainer.step >= trainer.config.steps:
                    if trainer.config.eval_every and trainer.step % trainer.config.eval_every:
                        on_eval(method, trainer.step, trainer.evaluate())
                    trainer.writer.finish()
                    del active[method]
                    continue
                on_step(method, trainer.train_step())
                if trainer.config.eval_every and trainer.step % trainer.config.eval_every == 0:
                    on_eval(method, trainer.step, trainer.evaluate())
    finally:
        for trainer in active.values():  # interrupted or failed: the store must not say "running"
            trainer.writer.finish("stopped")
    return {method: trainer.writer.run_id for method, trainer in trainers.items()}


class Progress:
    """One progress bar over both runs' steps, with each run's step, kept share, rollouts per prompt and last
    test accuracy in its postfix."""

    def __init__(self, configs: dict, *, enabled: bool = True) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=sum(c.steps for c in configs.values()), desc="demo (both runs)", disable=not enabled,
                        dynamic_ncols=True, file=sys.stdout)
        self.state = {method: {"step": 0, "steps": config.steps} for method, config in configs.items()}

    def step(self, method: str, row: dict) -> None:
        state = self.state[method]
        state.update(step=row["step"] + 1, kept=row["rollouts_kept"] / max(row["rollouts_sampled"], 1),
                     n=row["rollouts_per_prompt"])
        self.bar.update(1)
        self.bar.set_postfix_str(" | ".join(self._text(m, s) for m, s in self.state.items()))

    def evaluated(self, method: str, step: int, result: dict) -> None:
        self.state[method]["acc"] = result["accuracy"]
        self.bar.write(f"  {method}: step {step}, greedy test accuracy {result['accuracy']:.3f}"
                       + (f", mean@k {result['sampled_accuracy']:.3f}" if "sampled_accuracy" in result else ""))

    @staticmethod
    def _text(method: str, s: dict) -> str:
        text = f"{method} {s['step']}/{s['steps']}"
        if "kept" in s:
            text += f" kept {s['kept']:.0%} n {s['n']:.1f}"
        if "acc" in s:
            text += f" acc {s['acc']:.2f}"
        return text

    def close(self) -> None:
        self.bar.close()


def train_demo(store: Path, overrides: list[str], *, show_progress: bool = True) -> dict[str, str]:
    """Train the demo's two runs side by side into `store` with one progress bar; method -> run id."""
    configs = demo_configs(store, overrides)
    progress = Progress(configs, enabled=show_progress)
    try:
        return train_side_by_side(configs, progress.step, progress.evaluated)
    finally:
        progress.close()


def run_demo(*, store: Path, port: int, address: str, steps: int | None, overrides: list[str] | None = None,
             serve_after: bool = True) -> int:
    """Serve the dashboard on `store`, train both runs side by side, then keep serving until Ctrl-C
    (`serve_after=False`: return once trained)."""
    from app.launch import serve

    def interrupt(signum, frame):  # SIGTERM (e.g. `timeout`, a container stop) stops cleanly like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()  # the wall time README states: app start, warm start, training and evaluations
    store.mkdir(parents=True, exist_ok=True)
    overrides = [*(overrides or []), *([f"steps={steps}"] if steps is not None else [])]
    steps_each = demo_configs(store, overrides)["grpo"].steps  # a bad override fails before the app starts
    app = serve(store, port=port, address=address, timeout=90)  # returns once healthy
    try:
        print(f"\nFastRL dashboard: http://{address}:{port}   (store: {store}; Ctrl-C stops)\n"
              f"Training {' and '.join(DEMO_METHODS)} interleaved step by step ({CONFIG.name}: "
              f"{steps_each} steps each)", flush=True)
        train_demo(store, overrides)
        print(f"\nBoth runs finished in {(time.monotonic() - started) / 60:.1f} min. "
              f"`fastrl report --store {store} --out demo.html` writes the Demo page as one HTML file.", flush=True)
        if not serve_after:
            return 0
        print(f"The dashboard stays up at http://{address}:{port} until Ctrl-C.", flush=True)
        while app.poll() is None:
            time.sleep(1)
        return 0
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    finally:
        if app.poll() is None:
            app.send_signal(signal.SIGINT)
            try:
                app.wait(timeout=15)
            except Exception:
                app.kill()
