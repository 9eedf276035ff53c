"""The shipped FastRL pruner: which rollouts of each prompt group go on to the log-prob passes and the update.

Per group, all groups at once in the padded (G, M) layout (`algo.groups`):
1. Drop every rollout with |A| <= zero_atol (ZERO_ADVANTAGE): A_i ∇log π(y_i) = 0, so this changes no gradient.
2. Count: m = min(n', max(min_keep, ceil(keep_ratio·n'))) of the n' rollouts left, raised to the signs present.
   With `row_cost` (ρ, `algo.costs`) m is lowered to the group's share of the batch's k* heaviest rows,
   k* = argmax_k S_k / (1 + ρk) (the most kept |A| mass per second of a step), never below min(min_keep, n').
3. Choose m by greedy facility location per sign on the advantage-free gradient sketches φ (`algo.coreset`,
   CRAIG): sim(i, j) = ||φ_i|| − ||φ_i − φ_j||, element weights ω_i = c_i|A_i| (c = `GroupBatch.counts`, the
   multiplicity of a merged completion); a rollout is represented only by a kept rollout of its own sign.
4. Weights ("nearest mass"): a kept row j carries the mass γ_j = Σ_{i nearest to j} ω_i of the rollouts it stands
   for, loss weight γ_j / (c_j|A_j|) per copy, all scaled by K / N (kept over all copies of the batch) so the kept
   loss, divided by K in the trainer, estimates the whole batch's loss divided by N.

Sources: the paper (arXiv 2609.36932 §3.2: prune rollouts of equal advantage that look alike; docs/notes.md §1), CRAIG
(Mirzasoleiman et al., ICML 2020) for the coreset and its weights, LoGra-style sketches (`algo.sketches`).
Departures from the paper: likeness is measured on gradient sketches, not token-set Jaccard; kept rows are
weighted by the mass they stand for (the paper keeps weights 1); the keep count comes from pass costs, not a
top-up to a minibatch multiple; identical completions are merged before pruning (`algo.duplicates`). The
variants measured and dropped (DPP, gradient matching, other masses and similarities) are in docs/experiments.md.
Scores: pick-time gain over the sign's total Σ ω_i sim(i, i), in [0, 1]. Unpicked rollouts are REDUNDANT if their
nearest kept row removes >= redundant_below of their error bound, else LOW_ADVANTAGE.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fastrl_core.algo.coreset import euclidean_similarity, greedy_facility_location, represented_mass
from fastrl_core.algo.costs import cost_keep_counts
from fastrl_core.algo.groups import GroupBatch, Groups, PruneResult, Reason, keep_counts, padded_result


def fastrl(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
           generator: torch.Generator | None, zero_atol: float = 1e-6, redundant_below: float = 0.5,
           row_cost: float | None = None) -> PruneResult:
    """The rule in the module docstring. batch: N rollouts; groups: its `group_layout`. Returns (N,) decisions.
    `generator` only orders the slots (`group_layout`), which breaks exact ties."""
    if zero_atol < 0 or not 0 <= redundant_below <= 1:
        raise ValueError(f"fastrl: need zero_atol >= 0 and 0 <= redundant_below <= 1; got zero_atol={zero_atol}, "
                         f"redundant_below={redundant_below}")
    advantages = groups.pad(batch.advantages.float(), 0.0)  # (G, M)
    counts = groups.pad(batch.counts.float(), 0.0) if batch.counts is not None else groups.valid.float()
    magnitude = advantages.abs()
    candidates = groups.valid & (magnitude > zero_atol)
    positive = candidates & (advantages > 0)
    n_pos, n_neg = positive.sum(1), (candidates & ~positive).sum(1)
    n_nonzero = n_pos + n_neg
    picks = keep_counts(n_nonzero, keep_ratio, min_keep)  # (G,)
    if row_cost is not None:  # what pays for its passes, never below the group's minimum
        floor = torch.minimum(n_nonzero, torch.tensor(min_keep))
        affordable = cost_keep_counts(torch.where(candidates, counts * magnitude, 0.0), row_cost)
        picks = torch.maximum(torch.minimum(picks, affordable), floor)
    picks = torch.maximum(picks, (n_pos > 0).long() + (n_neg > 0).long())  # m >= the signs present

    kernel = euclidean_similarity(padded_sketches(batch, groups))  # (G, M, M)
    element_weight = torch.where(candidates, counts * magnitude, 0.0)  # ω
    selected, pick_gain, final_gain, assignment = greedy_facility_location(
        kernel, element_weight, candidates, positive, picks, torch.minimum(n_pos, picks), torch.minimum(n_neg, picks))
    gamma = represented_mass(element_weight, assignment)  # (G, M)
    weights = torch.where(selected, gamma / (counts * magnitude).clamp(min=1e-30), 0.0)
    weights = weights * kept_share(counts, selected, groups)

    self_similarity = kernel.diagonal(dim1=1, dim2=2)  # (G, M)
    total = torch.zeros_like(magnitude)
    for stratum in (positive, candidates & ~positive):
        sign_total = torch.where(stratum, element_weight * self_similarity.clamp(min=0.0), 0.0).sum(1)
        total = torch.where(stratum, sign_total[:, None], total)
    gain = torch.where(selected, pick_gain, final_gain)
    scores = torch.where(candidates, gain / total.clamp(min=1e-30), 0.0).clamp(0.0, 1.0)
    nearest = kernel.gather(2, assignment.clamp(min=0)[:, :, None]).squeeze(2)
    quality = torch.where(assignment >= 0, nearest / self_similarity.clamp(min=1e-30), -math.inf)
    reasons = torch.where(quality >= redundant_below, int(Reason.REDUNDANT), int(Reason.LOW_ADVANTAGE))
    reasons = torch.where(candidates, reasons, int(Reason.ZERO_ADVANTAGE))
    return padded_result(groups, selected, scores, reasons, weights)


def padded_sketches(batch: GroupBatch, groups: Groups) -> Tensor:
    """(G, M, D) float sketches; without sketches the unit vectors of the slots (no rollout resembles another,
    so the rule is top c|A| per sign). Padding slots repeat a row and are never candidates."""
    sketches = batch.sketches if batch.sketches is not None else torch.eye(groups.index.shape[1])[groups.slot]
    return sketches.float()[groups.index]


def kept_share(counts: Tensor, keep: Tensor, groups: Groups) -> float:
    """K / N: kept copies over all copies of the batch (zero-advantage rollouts included)."""
    return float((counts * keep).sum()) / float(counts[groups.valid].sum())
