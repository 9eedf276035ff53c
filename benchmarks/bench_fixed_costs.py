"""Where the fixed seconds of a step go: the parts of the update and of the two scoring passes that do not fall
with the rows kept, taken apart on a real step of a config (default `paper-wide`: GRPO on embedded-wide, vLLM).

    .venv/bin/python benchmarks/bench_fixed_costs.py [--config paper-wide] [--warmup 2] [--repeats 5] [key=value ...]

Trains `--warmup` GRPO steps (pruner none, budget fixed) so the policy, the optimiser state and the engine are warm,
samples one more step's rollouts, then times each part on them, the median of `--repeats` (wall and process CPU
seconds; run on a quiet machine):

- a scoring pass (no grad) of k rows, k in ROWS, for the policy and the reference: a line a + b·k whose intercept a
  is the pass's fixed cost (the trainer runs two a step: the old pass when vLLM samples, and the reference pass);
- a mini-batch's forward + loss + backward of k rows: its intercept, paid once per update (4 a step);
- the vision tower alone on the step's images (inside both of the above, once per call);
- an optimiser step of AdamW as the trainer builds it and with `foreach=True` / `fused=True`; `clip_grad_norm_`
  (default and foreach); `zero_grad`: each once per update;
- the engine's weight sync (`sync_weights`, after the step's last update): once per step.

Prints each part's seconds per call and per step and their sum beside the phase lines' fixed parts
(docs/bench/paper-wide/README.md: log-prob 0.447 s + 8.77 ms a row, update 1.067 s + 25.86 ms a row).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ROWS = (1, 8, 32)  # rows per call for the intercept fits (a step of paper-wide passes ~40 distinct rows)
GRPO = ["pruner=none", "budget=fixed", "eval_every=0", "eval_samples=0", "checkpoint_every=0"]


def timed(function, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `function()` over `repeats` calls (after one untimed call)."""
    function()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def intercept(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares line through {rows: seconds}: (fixed seconds, seconds a row)."""
    xs, ys = list(points), list(points.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="paper-wide")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config (e.g. threads=1)")
    args = parser.parse_args(argv)
    from fastrl_core.algo.objectives import policy_loss
    from fastrl_core.run_config import load_config
    from fastrl_core.trainer import Trainer

    with tempfile.TemporaryDirectory() as store:
        config = load_config(args.config, [*args.overrides, *GRPO, f"store_dir={store}",
                                            f"steps={args.warmup + 1}"])
        trainer = Trainer(config, progress=False)
        for _ in range(args.warmup):
            trainer.train_step()
        model, engine = trainer.policy.model, trainer.engine
        problems, counts, _ = trainer.choose_prompts()
        model.eval()
        rollouts = engine.generate(problems, counts, generator=torch.Generator().manual_seed(0))
        order = torch.randperm(len(rollouts.completion_ids), generator=torch.Generator().manual_seed(1))
        updates = config.updates_per_step
        print(f"{args.config}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, engine "
              f"{config.engine}, {len(rollouts.completion_ids)} rollouts, {updates} updates a step, threads "
              f"{torch.get_num_threads()}; median of {args.repeats}, wall s (CPU s)\n")
        parts = []  # (name, calls a step, wall, cpu)

        def score(scorer, rows):
            with torch.no_grad():
                engine.token_logprobs(scorer, problems, rollouts, order[:rows])

        for name, scorer, calls in (("old log-prob pass", model, int(config.recompute_old_logprobs)),
                                    ("reference pass", trainer.reference, int(trainer.reference is not None))):
            if not calls:
                continue
            walls = {rows: timed(lambda: score(scorer, rows), args.repeats) for rows in ROWS}
            fixed, per_row = intercept({rows: w for rows, (w, _) in walls.items()})
            fixed_cpu, _ = intercept({rows: c for rows, (_, c) in walls.items()})
            print(f"  {name:32s} " + "  ".join(f"{r} rows {w:.3f}" for r, (w, _) in walls.items())
                  + f"  -> fixed {fixed:.3f} + {per_row * 1e3:.2f} ms a row")
            parts.append((f"{name}: fixed part", calls, fixed, fixed_cpu))

        model.train()
        mask, advantages = rollouts.completion_mask, torch.randn(len(rollouts.completion_ids))

        def forward_backward(rows):
            index = order[:rows]
            logprobs = engine.token_logprobs(model, problems, rollouts, index)
            policy_loss(config.objective, logprobs, logprobs.detach(), advantages[index], mask[index],
                        max_length=config.max_new_tokens).loss.backward()

        walls = {rows: timed(lambda: forward_backward(rows), args.repeats) for rows in ROWS}
        fixed, per_row = intercept({rows: w for rows, (w, _) in walls.items()})
        fixed_cpu, _ = intercept({rows: c for rows, (_, c) in walls.items()})
        print(f"  {'mini-batch forward+backward':32s} " + "  ".join(f"{r} rows {w:.3f}" for r, (w, _) in walls.items())
              + f"  -> fixed {fixed:.3f} + {per_row * 1e3:.2f} ms a row")
        parts.append(("mini-batch forward+backward: fixed part", updates, fixed, fixed_cpu))

        prompts = engine.scorer.prompt_batch(problems) if hasattr(engine, "scorer") else engine.prompt_batch(problems)
        pixels, grid = torch.cat(prompts.pixel_values), prompts.image_grid_thw
        with torch.no_grad():
            vision = timed(lambda: model.model.visual(pixels, grid_thw=grid), args.repeats)
        print(f"  {'vision tower, the step prompts':32s} {vision[0]:.3f} (inside each pass above, not added)")

        forward_backward(32)  # gradients for the optimiser steps
        optimisers = {"AdamW (the trainer's)": trainer.optimizer,
                      "AdamW foreach=True": torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=True),
                      "AdamW fused=True": torch.optim.AdamW(model.parameters(), lr=config.lr, fused=True)}
        snapshot = {name: p.detach().clone() for name, p in model.named_parameters()}
        for name, optimiser in optimisers.items():
            wall, cpu = timed(optimiser.step, args.repeats)
            print(f"  {name:32s} {wall:.3f} ({cpu:.3f})")
            if name.startswith("AdamW (the"):
                parts.append(("optimiser step", updates, wall, cpu))
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(snapshot[name])
        for name, kwargs in (("clip_grad_norm_", {}), ("clip_grad_norm_ foreach=True", {"foreach": True})):
            wall, cpu = timed(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9, **kwargs),
                              args.repeats)
            print(f"  {name:32s} {wall:.3f} ({cpu:.3f})")
            if not kwargs:
                parts.append(("clip_grad_norm_", updates, wall, cpu))

        def zero_and_regrow():
            trainer.optimizer.zero_grad(set_to_none=True)

        wall, cpu = timed(zero_and_regrow, args.repeats)
        parts.append(("zero_grad", updates, wall, cpu))
        wall, cpu = timed(lambda: engine.sync_weights(model), args.repeats)
        print(f"  {'engine weight sync':32s} {wall:.3f} ({cpu:.3f})")
        parts.append(("engine weight sync", 1, wall, cpu))

        print(f"\nfixed seconds a step, by part ({updates} updates):")
        total = total_cpu = 0.0
        for name, calls, wall, cpu in parts:
            total, total_cpu = total + calls * wall, total_cpu + calls * cpu
            print(f"  {name:42s} {calls} x {wall:.3f} = {calls * wall:.3f} s ({calls * cpu:.3f} CPU s)")
        print(f"  {'sum':42s} {total:.3f} s ({total_cpu:.3f} CPU s)")
        trainer.writer.finish()


if __name__ == "__main__":
    main()
