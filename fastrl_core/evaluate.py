"""Accuracy of a policy on a problem set: greedy (argmax) decoding by default, or one sample per problem.

Scored by the same reward functions as training (`fastrl_core.rewards.score_completions` with the template's answer
style): `accuracy` = mean accuracy reward, `format_rate` = mean format reward, `per_kind` = accuracy per
`Problem.kind`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

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
    """{accuracy, format_rate, n, per_kind, completions} over `problems`; `temperature=None` (or 0) decodes greedily,
    otherwise one completion per problem is sampled at that temperature from `generator`."""
    from fastrl_core.data.templates import answer_style
    from fastrl_core.rewards import score_completions

    if not problems:
        raise ValueError("evaluate: no problems")
    greedy = not temperature  # None or 0: argmax decoding
    engine = HFEngine(policy, template=template, max_new_tokens=max_new_tokens, temperature=temperature or 1.0)
    was_training = policy.model.training
    policy.model.eval()
    completions: list[str] = []
    label = "eval greedy" if greedy else f"eval T={temperature:g}"
    with tqdm(total=len(problems), desc=label, unit="problem", disable=not progress, leave=False) as bar:
        for start in range(0, len(problems), batch_size):
            chunk = list(problems[start : start + batch_size])
            if greedy:
                completions += engine.greedy(chunk, batch_size=batch_size)
            else:
                completions += engine.generate(chunk, [1] * len(chunk), generator=generator).completion_text
            bar.update(len(chunk))
    policy.model.train(was_training)
    parts = score_completions(completions, list(problems), style=answer_style(template))
    by_kind: dict[str, list[float]] = defaultdict(list)
    for problem, part in zip(problems, parts):
        by_kind[problem.kind].append(part.accuracy)
    return {
        "accuracy": sum(p.accuracy for p in parts) / len(parts),
        "format_rate": sum(p.format for p in parts) / len(parts),
        "n": len(parts),
        "per_kind": {kind: sum(values) / len(values) for kind, values in sorted(by_kind.items())},
        "completions": completions,
    }
