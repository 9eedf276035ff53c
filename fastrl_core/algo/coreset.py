"""Weighted coresets by facility location, batched over prompt groups in the padded (G, M) layout.

CRAIG (Mirzasoleiman, Bilmes & Leskovec, ICML 2020, "Coresets for Data-efficient Training of Machine Learning
Models", §3): a subset S with weights γ_j = Σ_{i: a(i) = j} ω_i, a(i) = the element of S nearest to i, gives
    || Σ_i ω_i g_i − Σ_{j∈S} γ_j g_j ||  <=  Σ_i ω_i min_{j∈S} || g_i − g_j ||,
and minimising the right side is maximising the monotone submodular facility-location function
    F(S) = Σ_i ω_i max(0, max_{j∈S} sim(i, j)),   sim(i, j) = ||g_i|| − ||g_i − g_j||  (0 = "the empty facility",
i.e. approximating g_i by nothing), whose greedy maximiser is within 1 − 1/e of the best (Nemhauser et al. 1978).
Here every element i has a sign class (the sign of its advantage) and is represented only by kept elements of its
own class, so each sign's mass is carried by its own sign; picks per class may be capped.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def euclidean_similarity(vectors: Tensor) -> Tensor:
    """sim(i, j) = ||v_i|| − ||v_i − v_j|| within each group  (G, M, D) -> (G, M, M); sim(i, i) = ||v_i||.

    How much of the CRAIG error bound of element i (||v_i|| when nothing stands for it) element j removes.
    Distances from the Gram matrix (one bmm; torch.cdist is ~10x slower here), clamped at 0 against rounding."""
    vectors = vectors.float()
    gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (G, M, M)
    squared = gram.diagonal(dim1=1, dim2=2)  # (G, M)
    distance = (squared[:, :, None] + squared[:, None, :] - 2 * gram).clamp(min=0.0).sqrt()
    distance.diagonal(dim1=1, dim2=2).fill_(0.0)
    return squared.sqrt()[:, :, None] - distance


def greedy_facility_location(similarity: Tensor, element_weight: Tensor, candidates: Tensor, positive: Tensor,
                             picks: Tensor, cap_positive: Tensor, cap_negative: Tensor
                             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Greedy max of F(S) = Σ_i ω_i max(0, max_{j∈S, sign j = sign i} sim(i, j)) per group, with sign caps.

    Each step adds, in every group at once, the allowed candidate j (not picked, its sign below its cap) of largest
    gain Σ_{i same sign} ω_i (sim(i, j) − c_i)⁺, c_i = i's current coverage (0 before any pick of its sign); exact
    ties go to the lower slot (slots are in random order). A group stops at `picks` picks or when no candidate is
    allowed. Afterwards every unpicked candidate is assigned to the kept element of its sign it is most similar
    to if that similarity is > 0 (else to none: approximating g_i by nothing, error ||g_i||, beats a
    representative at similarity <= 0, error >= ||g_i|| for the euclidean similarity); a kept element stands for
    itself.

    similarity (G, M, M), row i = the element represented, column j = the representative; element_weight (G, M)
    ω >= 0; candidates, positive (G, M) bool; picks, cap_positive, cap_negative (G,) long.
    Returns (selected (G, M) bool, gain at pick time (G, M) (−inf unpicked), final gain of each unpicked
    candidate (G, M) (−inf picked or non-candidate), assignment (G, M) long (slot of the representative, −1 if
    none: not a candidate, or no kept element of its sign with similarity > 0)).
    """
    num_groups, size = element_weight.shape
    rows = torch.arange(num_groups)
    same_sign = (positive[:, :, None] == positive[:, None, :]) & candidates[:, :, None] & candidates[:, None, :]
    weight = torch.where(candidates, element_weight, 0.0)  # (G, M)
    coverage = torch.zeros(num_groups, size)  # c_i
    selected = torch.zeros(num_groups, size, dtype=torch.bool)
    pick_gain = torch.full((num_groups, size), -math.inf)
    count_pos = torch.zeros(num_groups, dtype=torch.long)
    count_neg = torch.zeros(num_groups, dtype=torch.long)
    negative = candidates & ~positive

    def gains() -> Tensor:  # (G, M): gain of adding each column j
        improvement = (similarity - coverage[:, :, None]).clamp(min=0.0) * same_sign
        return torch.einsum("gi,gij->gj", weight, improvement)

    for step in range(int(picks.max()) if num_groups else 0):
        room = (positive & (count_pos < cap_positive)[:, None]) | (negative & (count_neg < cap_negative)[:, None])
        allowed = candidates & ~selected & room
        gain = torch.where(allowed, gains(), -math.inf)
        best_gain, best = gain.max(1)  # (G,)
        active = (step < picks) & torch.isfinite(best_gain)
        if not active.any():
            break
        selected[rows, best] |= active
        pick_gain[rows, best] = torch.where(active, best_gain, pick_gain[rows, best])
        is_positive = positive[rows, best]
        count_pos += active & is_positive
        count_neg += active & ~is_positive
        column = similarity[rows, :, best] * same_sign[rows, :, best]  # (G, M): sim(i, best) for its sign
        coverage = torch.where(active[:, None] & same_sign[rows, :, best], torch.maximum(coverage, column), coverage)
    final_gain = torch.where(candidates & ~selected, gains(), -math.inf)
    representable = same_sign & selected[:, None, :]  # (G, i, j)
    nearest = torch.where(representable, similarity, -math.inf).max(2)  # over kept j of i's sign
    assignment = torch.where(nearest.values > 0, nearest.indices, -1)  # sim <= 0: the empty facility is better
    assignment = torch.where(selected, torch.arange(size)[None, :], assignment)  # a kept element stands for itself
    return selected, pick_gain, final_gain, assignment


def represented_mass(element_weight: Tensor, assignment: Tensor) -> Tensor:
    """γ_j = Σ_{i: a(i) = j} ω_i per group  (G, M): the weight each representative carries (0 if unassigned)."""
    mass = torch.zeros_like(element_weight)
    has = assignment >= 0
    return mass.scatter_add_(1, assignment.clamp(min=0), torch.where(has, element_weight, 0.0))
