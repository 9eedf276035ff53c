"""The older `fastrl` selection (`selection='dpp'`): greedy MAP inference of a quality-diverse DPP with sign caps,
and the sign-mass weights that keep a pruned group zero-sum. Batched over prompt groups in the padded (G, M)
layout; torch only. Measured below the coreset and CPPO (`algo.pruners.fastrl`, "What was tried").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def greedy_dpp(kernel: Tensor, log_quality: Tensor, candidates: Tensor, positive: Tensor, picks: Tensor,
               cap_positive: Tensor, cap_negative: Tensor, required: Tensor, min_gain: float | None,
               tiny: float = 1e-6) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Greedy MAP inference of the DPP with L = diag(q) K diag(q), batched over groups, with sign caps.

    Fast greedy MAP (Chen, Zhang & Zhou 2018, "Fast Greedy MAP Inference for DPP...", Alg. 1): keep the
    incremental Cholesky rows c_j and d_j² = K_jj − |c_j|² (the part of unit sketch j not in the span of the
    picks); adding j raises log det L_S by gain_j = log q_j² + log d_j². Each step takes the candidate of
    largest gain among those whose sign still has room (positive: < cap_positive picks; negative alike), then
        e_i = (K_{j*,i} − ⟨c_{j*}, c_i⟩) / d_{j*},  c_i ← [c_i, e_i],  d_i² ← d_i² − e_i².
    A group stops at `picks` picks, when no candidate is left, or — after `required` picks — when the best gain is
    below `min_gain`. A pick with d² < tiny adds no direction: its Cholesky update is skipped (e = 0).

    kernel (G, M, M); log_quality (G, M) = log q²; candidates, positive (G, M) bool; picks, cap_positive,
    cap_negative, required (G,) long. Returns (selected (G, M) bool, pick order (G, M) long (−1 unpicked),
    gain at pick time (G, M) (−inf unpicked), final d² (G, M)).
    """
    num_groups, size = log_quality.shape
    rows = torch.arange(num_groups)
    negative = candidates & ~positive
    residual = torch.ones(num_groups, size)  # d² (G, M)
    cholesky = torch.zeros(num_groups, size, max(int(picks.max()) if num_groups else 0, 1))  # (G, M, T)
    selected = torch.zeros(num_groups, size, dtype=torch.bool)
    pick_order = torch.full((num_groups, size), -1, dtype=torch.long)
    pick_gain = torch.full((num_groups, size), -math.inf)
    count_pos = torch.zeros(num_groups, dtype=torch.long)
    count_neg = torch.zeros(num_groups, dtype=torch.long)
    stopped = torch.zeros(num_groups, dtype=torch.bool)
    for step in range(cholesky.shape[2]):
        room = (positive & (count_pos < cap_positive)[:, None]) | (negative & (count_neg < cap_negative)[:, None])
        allowed = candidates & ~selected & room
        gain = torch.where(allowed, log_quality + torch.log(residual.clamp(min=1e-30)), -math.inf)
        best_gain, best = gain.max(1)  # (G,)
        active = (step < picks) & torch.isfinite(best_gain) & ~stopped
        if min_gain is not None:
            passes = (step < required) | (best_gain >= min_gain)
            stopped |= active & ~passes
            active &= passes
        if not active.any():
            break
        selected[rows, best] |= active
        pick_order[rows, best] = torch.where(active, step, pick_order[rows, best])
        pick_gain[rows, best] = torch.where(active, best_gain, pick_gain[rows, best])
        is_positive = positive[rows, best]
        count_pos += active & is_positive
        count_neg += active & ~is_positive
        best_residual = residual[rows, best]  # (G,)
        projected = torch.bmm(cholesky[:, :, :step], cholesky[rows, best, :step].unsqueeze(2)).squeeze(2)  # (G, M)
        update = (kernel[rows, best] - projected) / best_residual.clamp(min=tiny).sqrt()[:, None]
        update = torch.where((active & (best_residual > tiny))[:, None], update, 0.0)
        cholesky[:, :, step] = update
        residual = (residual - update**2).clamp(min=0.0)
    return selected, pick_order, pick_gain, residual


def sign_mass_weights(advantages: Tensor, candidates: Tensor, positive: Tensor, keep: Tensor,
                      counts: Tensor | None = None) -> Tensor:
    """Weights (G, M) that give each sign's kept rollouts the group's whole |A| mass of that sign, rescaled to
    average 1 over the group's kept rollouts (so the update's scale is that of unweighted kept rollouts):
        w_i ∝ M_s / M_s^kept,  M_s = Σ_{sign(A_j) = s} m_j|A_j|,  M_s^kept = the same over kept j,
    m_j the multiplicities `counts` (G, M) (None = 1; the average is then over kept copies, Σ m_i w_i / Σ m_i).
    Hence Σ_kept w_i A_i ∝ M_+ − M_− = Σ_i A_i: a zero-sum group stays zero-sum after pruning, so a direction
    shared by all the group's rollouts cancels as it does in the full update (it would not with, e.g., 4 kept
    positives of A = 0.75 against 4 kept negatives of A = −0.25). 0 for pruned rollouts."""
    counts = torch.ones_like(advantages) if counts is None else counts
    magnitude = advantages.abs() * counts
    weights = torch.zeros_like(magnitude)
    for stratum in (positive, candidates & ~positive):
        mass = torch.where(stratum, magnitude, 0.0).sum(1)  # (G,)
        kept_mass = torch.where(stratum & keep, magnitude, 0.0).sum(1)
        ratio = torch.where(kept_mass > 0, mass / kept_mass.clamp(min=1e-30), 0.0)
        weights = torch.where(stratum & keep, ratio[:, None], weights)
    mean_weight = (weights * counts).sum(1) / torch.where(keep, counts, 0.0).sum(1).clamp(min=1e-30)
    return weights / mean_weight.clamp(min=1e-30)[:, None]
