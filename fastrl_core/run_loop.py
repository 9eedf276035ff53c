"""The one training loop: `Trainer.run` is it over one trainer, `fastrl bench` and the demo run several interleaved.
It drives any `SteppedRun` (a `fastrl_core.trainer.Trainer` is one) and imports no trainer.

Per run: an evaluation at step 0 (not when resumed past it), then `train_step()`, an evaluation every `eval_every`
steps and a checkpoint every `checkpoint_every` steps, until `steps` or `time_limit_s`; then a last evaluation
(unless the last step had one), a last checkpoint, and the run is marked finished. Several runs take one step each
in turn, the order rotated every round: a neighbouring job that slows the machine for a minute slows every run
alike.

Lifecycle: Ctrl-C (SIGINT) and SIGTERM mark every unfinished run "stopped", an error marks the run it came from
"failed" with the error's first line (the others "stopped"), and the exception goes on to the caller. A run killed
without a word (kill -9) keeps "running" with a stale heartbeat, which readers show as "no heartbeat"
(`store.run_state`); `fastrl train --resume RUN` continues any of them from its last checkpoint.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from fastrl_core.config import TrainConfig
    from fastrl_core.store.writer import RunWriter


class SteppedRun(Protocol):
    """What the loop drives: a run's config, its step counter and training seconds, its store writer, and one step,
    one evaluation and one checkpoint at a time (`fastrl_core.trainer.Trainer`)."""

    config: TrainConfig
    step: int
    train_seconds: float
    writer: RunWriter

    def train_step(self) -> dict: ...

    def evaluate(self) -> dict: ...

    def save_checkpoint(self) -> object: ...


StepCallback = Callable[[str, SteppedRun, dict, float | None], None]


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""


@contextmanager
def _sigterm_stops():
    """Within: SIGTERM raises Stopped in the main thread (the default would end the process without a word)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ended(trainer: SteppedRun) -> bool:
    config = trainer.config
    return trainer.step >= config.steps or bool(config.time_limit_s and trainer.train_seconds >= config.time_limit_s)


def _finish(trainer: SteppedRun) -> None:
    config = trainer.config
    if config.eval_every and trainer.step % config.eval_every:
        trainer.evaluate()
    trainer.save_checkpoint()
    trainer.writer.finish()


def _mark(trainers: dict[str, SteppedRun], failed: str | None, error: BaseException) -> None:
    """Mark every run still running stopped, or the one that raised (`failed`) failed, with why."""
    if isinstance(error, KeyboardInterrupt):
        why = str(error) if isinstance(error, Stopped) else "stopped by SIGINT (Ctrl-C)"
    else:
        why = f"{type(error).__name__}: {error}"
    for name, trainer in trainers.items():
        if trainer.writer.meta.get("status") != "running":
            continue
        status = "failed" if name == failed and not isinstance(error, KeyboardInterrupt) else "stopped"
        reason = why if status == "failed" or isinstance(error, KeyboardInterrupt) else f"run {failed} failed: {why}"
        try:
            trainer.writer.finish(status, reason)
        except OSError:  # a full disk may refuse run.json too: the heartbeat goes stale instead
            trainer.writer.close()


def _nominal(row: dict) -> int:
    """The rollouts plain GRPO samples in this step (`rollouts_nominal`; the sampled ones where it is not recorded)."""
    nominal = row.get("rollouts_nominal")
    return int(nominal) if nominal is not None and nominal == nominal else int(row["rollouts_sampled"])


def run_interleaved(trainers: dict[str, SteppedRun], *, progress: bool = False, label: str | None = None,
                    on_step: StepCallback | None = None) -> dict[str, str]:
    """Train these runs to their end, one step each in turn; returns name -> run id.

    progress: one bar over every run's steps, named `label` (default: the run's name, or "N runs"); its postfix:
    the run that just stepped, its reward, accuracy, kept share (of the rollouts plain GRPO would sample, the
    dashboard's "kept"), rollouts per prompt and last test accuracy.
    on_step(name, trainer, steps row, test accuracy or None) after each step, its evaluation and checkpoint (a demo
    or a log line)."""
    current: str | None = None
    total = sum(t.config.steps for t in trainers.values())
    desc = label or (next(iter(trainers)) if len(trainers) == 1 else f"{len(trainers)} runs")
    bar = tqdm(total=total, initial=sum(min(t.step, t.config.steps) for t in trainers.values()),
               disable=not progress, desc=desc, dynamic_ncols=True)
    last_eval: dict[str, float] = {}
    try:
        with _sigterm_stops():
            for current, trainer in trainers.items():
                if trainer.step == 0 and trainer.config.eval_every:
                    trainer.evaluate()
            active, rounds = dict(trainers), 0
            while active:
                names = list(active)
                shift = rounds % len(names)  # rotate: no run always goes first or after the same neighbour
                rounds += 1
                for current in names[shift:] + names[:shift]:
                    trainer = active[current]
                    config = trainer.config
                    if _ended(trainer):
                        _finish(trainer)
                        del active[current]
                        continue
                    row = trainer.train_step()
                    accuracy = None
                    if config.eval_every and trainer.step % config.eval_every == 0:
                        accuracy = last_eval[current] = trainer.evaluate()["accuracy"]
                    if config.checkpoint_every and trainer.step % config.checkpoint_every == 0:
                        trainer.save_checkpoint()
                    bar.update(1)
                    bar.set_postfix(**({"run": current} if len(trainers) > 1 else {}),
                                    reward=f"{row['reward_mean']:.2f}", acc=f"{row['accuracy']:.2f}",
                                    kept=f"{row['rollouts_kept'] / max(_nominal(row), 1):.2f}",
                                    n=f"{row['rollouts_per_prompt']:.1f}",
                                    **({"test": f"{last_eval[current]:.3f}"} if current in last_eval else {}))
                    if on_step is not None:
                        on_step(current, trainer, row, accuracy)
    except BaseException as error:
        _mark(trainers, current, error)
        raise
    finally:
        bar.close()
    return {name: trainer.writer.run_id for name, trainer in trainers.items()}
