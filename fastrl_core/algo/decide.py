"""A step's decisions, one pure function shared by FastRL's trainer and the TRL plug-in (`decide_step`).

From the step's rollouts (N rows in G prompt groups: rewards, completion tokens, sketches) it decides, in this
order:
  1. advantages   -- by an estimator of `algo.advantages`, or the host trainer's own (TRL computes its own)
  2. merge        -- identical completions of a prompt become one row counted m times (`algo.duplicates`)
  3. prune        -- keep mask, scores, reasons and loss weights (`algo.pruners`, through `prune_distinct`)
  4. group stats  -- per prompt: reward mean / std, rollouts sampled and kept, mean accuracy: what the budget
                     controllers learn from (`algo.budget_base.PromptOutcomes`)

What a pruner reads comes from its registry entry (`PRUNERS.get(name).reads_tokens` / `reads_sketches`), never
from its name. Tensors and plain scalars in, a frozen `StepDecision` out; randomness only through the passed
generator; no I/O.

Group statistics are `algo.group_stats`, the definition the store records too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl_core.algo.advantages import compute_advantages
from fastrl_core.algo.budget_base import PromptOutcomes
from fastrl_core.algo.duplicates import Duplicates, find_duplicates, prune_distinct
from fastrl_core.algo.group_stats import group_stats
from fastrl_core.algo.groups import GroupBatch, PruneResult
from fastrl_core.algo.pruners import PRUNERS


@dataclass(frozen=True)
class GroupOutcome:
    """Per prompt group (G,) of one step: what a budget controller reads (`outcomes`)."""

    reward_mean: Tensor  # (G,) float64, over non-NaN rewards
    reward_std: Tensor  # (G,) float64 population std, 0 below ZERO_STD
    sampled: Tensor  # (G,) long: rollouts sampled
    kept: Tensor  # (G,) long: rollouts kept by the decision
    accuracy_mean: Tensor | None  # (G,) float32 mean accuracy reward (0 if unsampled); None without one

    def outcomes(self, prompt_ids, *, step: int, total_steps: int, epoch_end: bool) -> PromptOutcomes:
        """This step's `PromptOutcomes` for `budget_update` (reward statistics as float32)."""
        return PromptOutcomes(prompt_ids=tuple(prompt_ids), sampled=self.sampled, kept=self.kept,
                              reward_mean=self.reward_mean.float(), reward_std=self.reward_std.float(), step=step,
                              total_steps=total_steps, epoch_end=epoch_end, accuracy_mean=self.accuracy_mean)


@dataclass(frozen=True)
class StepDecision:
    """What a step decided about its N rollouts."""

    advantages: Tensor  # (N,) float
    duplicates: Duplicates | None  # classes of identical completions; None when not merged
    pruned: PruneResult  # keep_mask, scores, reasons, weights (N,) over every row (copies: DUPLICATE)
    groups: GroupOutcome

    @property
    def keep_mask(self) -> Tensor:
        return self.pruned.keep_mask

    @property
    def weights(self) -> Tensor:
        return self.pruned.weights

    @property
    def multiplicity(self) -> Tensor | None:
        """(N,) long class size at each representative, 0 at copies; None when not merged."""
        return None if self.duplicates is None else self.duplicates.multiplicity


def group_outcome(rewards: Tensor, group_ids: Tensor, keep_mask: Tensor, num_groups: int,
                  accuracy: Tensor | None = None) -> GroupOutcome:
    """Statistics of `num_groups` groups from rewards, group_ids (in [0, G)), keep_mask and accuracy, all (N,):
    `algo.group_stats` as tensors, and the mean accuracy."""
    stats = group_stats(rewards, group_ids, keep_mask, num_groups)
    sampled = torch.from_numpy(stats.sampled)
    accuracy_mean = None
    if accuracy is not None:
        accuracy = accuracy.detach().cpu().float().reshape(-1)
        group_ids = group_ids.detach().cpu().long().reshape(-1)
        accuracy_mean = torch.zeros(num_groups).index_add_(0, group_ids, accuracy) / sampled.clamp(min=1)
    return GroupOutcome(torch.from_numpy(stats.reward_mean), torch.from_numpy(stats.reward_std), sampled,
                        torch.from_numpy(stats.kept), accuracy_mean)


def decide_step(*, rewards: Tensor, group_ids: Tensor, num_groups: int, advantage: str | Tensor,
                completion_ids: Tensor, completion_mask: Tensor, sketches: Tensor | None, pruner: str,
                keep_ratio: float, min_keep: int, generator: torch.Generator, merge_duplicates: bool,
                row_cost: float | None = None, pruner_args: dict | None = None,
                accuracy: Tensor | None = None) -> StepDecision:
    """One step's decisions (module docstring).

    rewards (N,) float; group_ids (N,) long in [0, num_groups); advantage: an estimator name of
    `algo.advantages`, or (N,) advantages already computed; completion_ids, completion_mask (N, T): the
    completions (merge keys, and token sets for a pruner whose entry `reads_tokens`); sketches (N, D) or None
    (needed by a pruner whose entry `reads_sketches`); pruner, keep_ratio, min_keep, row_cost, pruner_args: as
    `algo.pruners.prune`; generator: the pruner's randomness; accuracy (N,) 0/1 correctness or None.
    """
    entry = PRUNERS.get(pruner)
    if isinstance(advantage, str):
        advantages = compute_advantages(advantage, rewards, group_ids)
    else:
        advantages = advantage.detach().cpu().float().reshape(-1)
    if entry.reads_sketches and sketches is None:
        raise ValueError(f"decide_step: pruner {pruner!r} reads gradient sketches; none were given")
    mask = completion_mask.bool()
    token_ids = tuple(ids[row] for ids, row in zip(completion_ids, mask)) if entry.reads_tokens else None
    duplicates = find_duplicates(group_ids, completion_ids, mask) if merge_duplicates else None
    pruned = prune_distinct(pruner, GroupBatch(group_ids, rewards, advantages, sketches, token_ids), duplicates,
                            keep_ratio=keep_ratio, min_keep=min_keep, generator=generator, row_cost=row_cost,
                            **(pruner_args or {}))
    groups = group_outcome(rewards, group_ids, pruned.keep_mask, num_groups, accuracy)
    return StepDecision(advantages, duplicates, pruned, groups)
