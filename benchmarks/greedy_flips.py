"""What moves a greedy accuracy curve: per problem kind, the greedy accuracy, the share of each greedy answer, and
mean@k at the training temperature, every few steps of one bench method's run (same config, seed and code path
as `fastrl bench`, so its evaluations at multiples of eval_every equal the bench's).

    .venv/bin/python benchmarks/greedy_flips.py [--method fastrl] [--seed 0] [--steps 32] [--every 4] [--samples 4]

Measured on fastrl_core/configs/paper.yaml (docs/results.md, "the mid-run dips"; docs/bench/paper-sampled): seed 0's greedy
accuracy dips at step 24 under FastRL (0.760 -> 0.645) because 59 counting problems answer one dot fewer (4 -> 3,
2 -> 1), and recovers by step 28; mean@4 moves 0.497 -> 0.486.
"""

from __future__ import annotations

import argparse
import collections
import tempfile

import torch

from fastrl_app.bench import method_config
from fastrl_core.data.templates import answer_style
from fastrl_core.evaluate import evaluate_with
from fastrl_core.rewards import extract_answer
from fastrl_core.trainer import Trainer


def report(trainer: Trainer, samples: int) -> None:
    config, problems = trainer.config, trainer.test_set
    greedy = evaluate_with(trainer.engine, trainer.policy, problems, template=config.template, progress=False)
    sampled = evaluate_with(trainer.engine, trainer.policy, problems, template=config.template, samples=samples,
                            generator=torch.Generator().manual_seed(config.seed), progress=False)
    answers: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    style = answer_style(config.template)
    for problem, completion in zip(problems, greedy["completions"]):
        answers[problem.kind][extract_answer(completion, style) or "(none)"] += 1
    print(f"step {trainer.step:3d}  greedy {greedy['accuracy']:.3f}  mean@{samples} {sampled['accuracy']:.3f}")
    for kind, count in sorted(answers.items()):
        spread = ", ".join(f"{a}: {n}" for a, n in count.most_common(4))
        print(f"    {kind:20s} greedy {greedy['per_kind'][kind]:.3f}  mean@{samples} "
              f"{sampled['per_kind'][kind]:.3f}  greedy answers {spread}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="paper")
    parser.add_argument("--method", default="fastrl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as store:
        config = method_config(args.config, args.method, args.seed, store,
                               ["eval_every=0", "eval_samples=0", f"steps={args.steps}"])
        trainer = Trainer(config, progress=False)
        report(trainer, args.samples)
        while trainer.step < args.steps:
            trainer.train_step()
            if trainer.step % args.every == 0:
                report(trainer, args.samples)


if __name__ == "__main__":
    main()
