"""Exact merge of identical completions: one representative per distinct (prompt group, token sequence).

Two rollouts of the same prompt with the same completion tokens (and the same response mask) are the same input to
every forward pass, so they have the same log-probs under the policy, the old and the reference model, the same
reward and advantage, and hence the same policy-gradient and KL terms. A batch in which such a class of m copies is
replaced by one representative counted m times (`policy_loss(..., rollout_counts=m)`) has the same loss and
gradient to float precision (tests/test_objectives.py checks every loss, KL on and off), while the reference / old
log-prob passes run on the representatives only. With several PPO updates a step the copies must still go to the
mini-batches they would have gone to unmerged: `algo.minibatches.minibatch_plan` (merge_scope) sees to that, and the
update runs each representative once per mini-batch that holds any of its copies. The tiny shipped policy repeats itself a lot
(35–44 % of within-group pairs are identical, docs/notes.md §7); a 7B model writing long reasoning rarely does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Duplicates:
    """Classes of identical completions within prompt groups, N rollouts in U classes."""

    representative: Tensor  # (N,) long: batch index of the representative of each rollout's class (itself for one)
    unique: Tensor  # (U,) long: batch indices of the representatives, ascending (the first rollout of each class)
    counts: Tensor  # (U,) long >= 1: multiplicity of each representative's class

    @property
    def is_representative(self) -> Tensor:
        """(N,) bool: True for the U representatives."""
        return self.representative == torch.arange(self.representative.numel())

    @property
    def multiplicity(self) -> Tensor:
        """(N,) long: class size at each representative, 0 at the copies."""
        out = torch.zeros(self.representative.numel(), dtype=torch.long)
        out[self.unique] = self.counts
        return out


def find_duplicates(group_ids: Tensor, completion_ids: Tensor, completion_mask: Tensor) -> Duplicates:
    """Group rollouts whose group id, response mask and token ids at the masked positions are all equal.

    group_ids (N,) integer; completion_ids (N, T) integer; completion_mask (N, T) bool (tokens outside the mask,
    e.g. padding after EOS, are ignored). The representative of a class is its lowest batch index, so the result
    depends on the batch order only, never on randomness."""
    n = group_ids.numel()
    if group_ids.dim() != 1 or group_ids.is_floating_point():
        raise ValueError(f"find_duplicates: group_ids must be a 1-D integer tensor, got {group_ids.dtype} "
                         f"{tuple(group_ids.shape)}")
    if completion_ids.dim() != 2 or completion_ids.shape[0] != n or completion_ids.is_floating_point():
        raise ValueError(f"find_duplicates: completion_ids must be ({n}, T) integer, got {completion_ids.dtype} "
                         f"{tuple(completion_ids.shape)}")
    if tuple(completion_mask.shape) != tuple(completion_ids.shape):
        raise ValueError(f"find_duplicates: completion_mask must be {tuple(completion_ids.shape)} like "
                         f"completion_ids, got {tuple(completion_mask.shape)}")
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long)
        return Duplicates(empty, empty, empty)
    mask = completion_mask.bool().cpu()
    tokens = torch.where(mask, completion_ids.cpu().long(), 0)
    key = torch.cat([group_ids.cpu().long()[:, None], mask.long(), tokens], dim=1)  # (N, 1 + 2T), unambiguous
    _, klass = torch.unique(key, dim=0, return_inverse=True)  # (N,) class id
    num_classes = int(klass.max()) + 1
    first = torch.full((num_classes,), n, dtype=torch.long).scatter_reduce_(0, klass, torch.arange(n), "amin")
    representative = first[klass]
    unique, position = torch.sort(first)
    counts = torch.bincount(klass, minlength=num_classes)[position]
    return Duplicates(representative, unique, counts)


def prune_distinct(name: str, batch, duplicates: Duplicates | None, **options):
    """Run pruner `name` on one representative per class of identical completions, each counted with its
    multiplicity (`GroupBatch.counts`), and give every copy its representative's decision.

    batch: the whole step's `GroupBatch` (N rows); duplicates: `find_duplicates` of the same rows, or None to prune
    `batch` as it is; options: `prune`'s keyword arguments. Returns a `PruneResult` over all N rows: only
    representatives can be kept; a copy is pruned with reason DUPLICATE when its representative is kept (it is in
    the update through the multiplicity) and with its representative's reason otherwise, and carries its
    representative's score and weight, so the weights of a class's rows sum to its weight in the loss."""
    from fastrl_core.algo.groups import GroupBatch, PruneResult, Reason
    from fastrl_core.algo.pruners import prune

    if duplicates is None:
        return prune(name, batch, **options)
    n, unique = batch.group_ids.numel(), duplicates.unique
    if duplicates.representative.numel() != n:
        raise ValueError(f"prune_distinct: duplicates are of {duplicates.representative.numel()} rollouts, the batch "
                         f"has {n}")
    counts = duplicates.counts.float() * (1.0 if batch.counts is None else batch.counts[unique].float())
    representatives = GroupBatch(
        batch.group_ids[unique], batch.rewards[unique], batch.advantages[unique],
        None if batch.sketches is None else batch.sketches[unique],
        None if batch.token_ids is None else tuple(batch.token_ids[i] for i in unique.tolist()), counts)
    result = prune(name, representatives, **options)
    position = torch.empty(n, dtype=torch.long)
    position[unique] = torch.arange(unique.numel())
    of_representative = position[duplicates.representative]  # (N,) row of each rollout's representative
    keep = torch.zeros(n, dtype=torch.bool)
    keep[unique] = result.keep_mask
    reasons = result.reasons[of_representative].clone()
    copy_of_kept = ~duplicates.is_representative & result.keep_mask[of_representative]
    reasons[copy_of_kept] = int(Reason.DUPLICATE)
    return PruneResult(keep, result.scores[of_representative], reasons, result.weights[of_representative])
