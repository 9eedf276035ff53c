"""What every rollout budget controller shares: the step outcome it reads, the controller type, and the pure
pieces of allocation (seeded per-prompt draws, a floor on sampled prompts). Imports no other controller."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

from torch import Tensor

from fastrl_core.algo.numerics import ZERO_STD


@dataclass(frozen=True)
class PromptOutcomes:
    """What one step did per prompt, G prompts: what a budget controller learns from (`budget_update`)."""

    prompt_ids: tuple[str, ...]  # the step's prompts
    sampled: Tensor  # (G,) rollouts sampled per prompt
    kept: Tensor  # (G,) rollouts kept by the pruner
    reward_mean: Tensor  # (G,)
    reward_std: Tensor  # (G,) population std of the group's rewards
    step: int  # 0-based index of the step just run
    total_steps: int
    epoch_end: bool  # this step finished a pass over the prompts
    accuracy_mean: Tensor | None = None  # (G,) mean accuracy reward (0/1 correctness) per prompt; 0 if unsampled


@dataclass(frozen=True)
class BudgetController:
    init: Callable[..., dict]  # (**params) -> state without the "controller" key
    allocate: Callable[[dict, Sequence[str]], list[int]]  # counts >= 0; 0 skips the prompt
    update: Callable[[dict, PromptOutcomes], dict]  # may mutate its argument: `budget_update` passes a copy


def check_count(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"budget parameter {name} must be an integer >= {low}, got {value!r}")
    return value


def same_for_every_prompt(state: dict, prompt_ids: Sequence[str]) -> list[int]:
    """state["n"] rollouts for each prompt (fixed, and both RolloutSA variants: one n for the whole step)."""
    return [state["n"]] * len(prompt_ids)


def uniform_draw(seed: int, step: int, prompt_id: str) -> float:
    """A uniform number in [0, 1) that depends only on (seed, step, prompt id): 64 bits of BLAKE2b. It keeps
    allocation a pure function of the state (no generator to carry or checkpoint) and is the same on resume."""
    digest = hashlib.blake2b(f"{seed}\x1f{step}\x1f{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def decided(std: float, kept: int, accuracy: float | None = None) -> bool:
    """A decided visit: all rewards equal (zero variance: no gradient), nothing survived pruning, or — when the
    accuracy is given — all rollouts correct or all wrong (GRESO's "easy" / "hard"; the group may still differ
    in format reward only)."""
    all_same_accuracy = accuracy is not None and (accuracy <= 1e-9 or accuracy >= 1 - 1e-9)
    return std <= ZERO_STD or kept == 0 or all_same_accuracy


def keep_some(counts: list[int], draws: list[float], skip: list[float], fallback: int, minimum: int) -> list[int]:
    """If fewer than `minimum` prompts got rollouts, give `fallback` to the skipped ones nearest to being drawn
    (smallest skip probability − draw, ties by position), so a step never samples nothing."""
    sampled = sum(c > 0 for c in counts)
    if sampled >= minimum:
        return counts
    skipped = sorted((i for i, c in enumerate(counts) if c == 0), key=lambda i: (skip[i] - draws[i], i))
    for i in skipped[: minimum - sampled]:
        counts[i] = fallback
    return counts
