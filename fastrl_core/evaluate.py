"""Accuracy of a policy on a problem set: greedy (argmax) decoding by default, or the mean over k sampled
completions per problem (mean@k at the engine's temperature).

Scored by the same reward functions as training (`fastrl_core.rewards.score_completions` with the template's answer
style): `accuracy` = mean accuracy reward, `format_rate` = mean format reward, `per_kind` = accuracy per
`Problem.kind`.

Why both: greedy accuracy is a threshold of the policy. On the paper-regime bench 59 counting problems (~11 % of
the test set) flip between evaluations to an answer one dot fewer (4 -> 3, 2 -> 1) and back, so the greedy curve
dips by ~12 pts while mean@4 moves by ~1 (docs/results.md, "the mid-run dips"). mean@k follows the expected reward that
RL optimises.

Which engine decodes: `evaluate_with(engine, ...)` uses the one given. The trainer passes its own (`Trainer.evaluate`),
so a run is evaluated by the engine kind it samples with, at its `max_new_tokens` and template: on a GPU a vLLM run
evaluates with vLLM's fast greedy decoding (synced to the policy after every update), and the HF engine never has to
decode a long test split there. Two runs on different engines are compared on each engine's own greedy decoding
(equal up to argmax ties flipped by numerics, e.g. bf16 kernels). `evaluate(policy, ...)` builds an `HFEngine` with
its `max_new_tokens` / `temperature` (the CLI's `fastrl eval`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from fastrl_core.engines.base import Engine
from fastrl_core.engines.hf import HFEngine
from fastrl_core.policy import Policy


def evaluate(
    policy: Policy,
    problems: Sequence,
    *,
    template: str = "math",
    batch_size: int = 64,
    max_new_tokens: int = 32,
    temperature: float | None = None,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> dict:
    """{accuracy, format_rate, n, per_kind, completions} over `problems` with an `HFEngine` on `policy` generating up
    to `max_new_tokens`; `temperature=None` (or 0) decodes greedily, otherwise one completion per problem is sampled
    at that temperature from `generator`."""
    engine = HFEngine(policy, template=template, max_new_tokens=max_new_tokens, temperature=temperature or 1.0)
    return evaluate_with(engine, policy, problems, template=template, batch_size=batch_size,
                         samples=1 if temperature else 0, generator=generator, progress=progress)


def evaluate_with(
    engine: Engine,
    policy: Policy,
    problems: Sequence,
    *,
    template: str,
    batch_size: int = 64,
    samples: int = 0,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> dict:
    """{accuracy, format_rate, n, per_kind, completions} over `problems` decoded by `engine` (its own
    max_new_tokens and temperature): `engine.greedy` with samples = 0, else `samples` completions per problem from
    `engine.generate` with `generator` (completions problem-major; accuracy their mean, n the problems).
    `policy.model` is put in eval mode meanwhile; `template` gives the answer style scored."""
    from fastrl_core.data.templates import answer_style
    from fastrl_core.rewards import score_completions

    if not problems:
        raise ValueError("evaluate: no problems")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"evaluate: samples must be an integer >= 0, got {samples!r}")
    was_training = policy.model.training
    policy.model.eval()
    completions: list[str] = []
    label = f"eval mean@{samples}" if samples else "eval greedy"
    try:
        with tqdm(total=len(problems), desc=label, unit="problem", disable=not progress, leave=False) as bar:
            for start in range(0, len(problems), batch_size):
                chunk = list(problems[start : start + batch_size])
                if samples:
                    completions += engine.generate(chunk, [samples] * len(chunk), generator=generator).completion_text
                else:
                    completions += engine.greedy(chunk, batch_size=batch_size)
                bar.update(len(chunk))
    finally:
        policy.model.train(was_training)
    scored = [problem for problem in problems for _ in range(max(samples, 1))]
    parts = score_completions(completions, scored, style=answer_style(template))
    by_kind: dict[str, list[float]] = defaultdict(list)
    for problem, part in zip(scored, parts):
        by_kind[problem.kind].append(part.accuracy)
    return {
        "accuracy": sum(p.accuracy for p in parts) / len(parts),
        "format_rate": sum(p.format for p in parts) / len(parts),
        "n": len(problems),
        "per_kind": {kind: sum(values) / len(values) for kind, values in sorted(by_kind.items())},
        "completions": completions,
    }
