"""The data of one pruning decision: a step's rollouts in prompt groups (`GroupBatch`), the padded (G, M) layout
every pruner works on (`Groups`, `group_layout`), and the result (`PruneResult`, one `Reason` per rollout).

G groups, M = the largest group size. Within a group, slots are ordered by a random permutation drawn from the
passed `torch.Generator` (by batch index without one), so exact ties are broken at random yet reproducibly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor


class Reason(enum.IntEnum):
    """Why a rollout was kept or pruned; the run store keeps the member's name."""

    KEPT = 0  # kept (with fastrl_official also the rollouts topped back up to a minibatch multiple)
    ZERO_ADVANTAGE = 1  # fastrl: |A| <= zero_atol, so the rollout carries no policy gradient
    ZERO_VARIANCE_GROUP = 2  # dapo_filter: every reward of its group is equal
    LOW_ADVANTAGE = 3  # cppo: below the group's top-m |A|; fastrl: not selected and its nearest kept rollout of
    #                    its sign removes less than redundant_below of its CRAIG error: its |A| mass was too low
    REDUNDANT = 4  # fastrl_official: same rounded advantage as its bucket's kept rollout and token Jaccard >= 0.2;
    #                fastrl: not selected, and a kept rollout of its sign nearly equals it (it carries its mass)
    OVER_BUDGET = 5  # pods: outside the max-reward-variance subset of size m (the middle rewards of the group)
    NOT_SAMPLED = 6  # random: outside the group's uniform random m-subset
    DUPLICATE = 7  # a copy of an identical completion of its group whose representative is kept: it is in the
    #                update through the representative's multiplicity (`algo.duplicates`), not as its own row


@dataclass(frozen=True)
class GroupBatch:
    """One step's rollouts, N in all, in prompt groups of any sizes."""

    group_ids: Tensor  # (N,) long, arbitrary ids
    rewards: Tensor  # (N,) float
    advantages: Tensor  # (N,) float
    sketches: Tensor | None  # (N, D) advantage-free gradient sketches (fastrl_core.algo.sketches)
    token_ids: tuple[Tensor, ...] | None = None  # N completions' token ids, each 1-D (fastrl_official)
    counts: Tensor | None = None  # (N,) multiplicities >= 1 of merged identical completions; None = all ones.
    #                              Only fastrl reads them (the |A| mass of a row is counts·|A|); the others ignore
    #                              them, so on a merged batch they count distinct completions.


@dataclass(frozen=True)
class PruneResult:
    keep_mask: Tensor  # (N,) bool
    scores: Tensor  # (N,) float, per pruner as in the module table
    reasons: Tensor  # (N,) long, `Reason` values
    weights: Tensor  # (N,) float loss weights: 0 pruned; 1 kept, except fastrl's (the |A| mass a row stands for)
    #                  (after `duplicates.prune_distinct` a DUPLICATE copy carries its kept representative's weight)


@dataclass(frozen=True)
class Groups:
    """The padded (G, M) layout of a batch: row = group (ascending id), column = slot (random order in group)."""

    index: Tensor  # (G, M) long: batch index in each slot, 0 where padding (mask with `valid`)
    valid: Tensor  # (G, M) bool
    row: Tensor  # (N,) long: group row of each rollout
    slot: Tensor  # (N,) long: slot of each rollout
    sizes: Tensor  # (G,) long

    def pad(self, values: Tensor, fill: float) -> Tensor:
        """(N, ...) -> (G, M, ...) with `fill` in padding slots."""
        padded = values[self.index]
        mask = self.valid.reshape(self.valid.shape + (1,) * (values.dim() - 1))
        return torch.where(mask, padded, torch.full((), fill, dtype=values.dtype))

    def unpad(self, padded: Tensor) -> Tensor:
        """(G, M, ...) -> (N, ...) in batch order."""
        return padded[self.row, self.slot]


def group_layout(group_ids: Tensor, generator: torch.Generator | None = None) -> Groups:
    """Dense rows for arbitrary group ids and a random (generator) or index order of slots within each group."""
    n = group_ids.numel()
    _, row = torch.unique(group_ids, return_inverse=True)  # (N,) in [0, G)
    tie = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    order = torch.argsort(row * n + tie)  # grouped by row, random order inside
    sizes = torch.bincount(row)
    starts = torch.cumsum(sizes, 0) - sizes
    slot = torch.empty(n, dtype=torch.long)
    slot[order] = torch.arange(n) - starts[row[order]]
    index = torch.zeros(sizes.numel(), int(sizes.max()), dtype=torch.long)
    index[row, slot] = torch.arange(n)
    valid = torch.zeros(index.shape, dtype=torch.bool)
    valid[row, slot] = True
    return Groups(index, valid, row, slot, sizes)


def keep_counts(candidates: Tensor, keep_ratio: float, min_keep: int) -> Tensor:
    """m = min(n, max(min_keep, ceil(keep_ratio·n))) per group.  candidates (G,) long -> (G,) long."""
    wanted = torch.ceil(candidates.double() * keep_ratio - 1e-9).long()  # 1e-9: 0.7·10 is not 8
    return torch.minimum(candidates, wanted.clamp(min=min_keep))


def rank_descending(key: Tensor) -> Tensor:
    """Rank of each entry of each row by `key` descending, ties in slot order.  (G, M) -> (G, M) long."""
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    return torch.empty_like(order).scatter_(1, order, torch.arange(key.shape[1]).expand_as(order))


def padded_result(groups: Groups, keep: Tensor, scores: Tensor, reasons: Tensor,
                  weights: Tensor | None = None) -> PruneResult:
    """Padded (G, M) decisions -> a PruneResult in batch order; weights default to 1 kept / 0 pruned."""
    keep_mask = groups.unpad(keep)
    reasons = torch.where(keep_mask, int(Reason.KEPT), groups.unpad(reasons))
    weights = keep_mask.float() if weights is None else torch.where(keep_mask, groups.unpad(weights).float(), 0.0)
    return PruneResult(keep_mask, groups.unpad(scores).float(), reasons, weights)


def flat_result(keep: Tensor, scores: Tensor, reasons: Tensor) -> PruneResult:
    """A PruneResult from per-rollout (N,) decisions."""
    reasons = torch.where(keep, int(Reason.KEPT), reasons)
    return PruneResult(keep, scores, reasons, keep.float())

