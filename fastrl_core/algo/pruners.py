"""Rollout pruners: which rollouts of each prompt group go on to the old/ref log-prob passes and the update.

Input is one step's rollouts (`GroupBatch`: group ids of groups of UNEQUAL sizes, rewards, advantages,
advantage-free gradient sketches, optionally completion token ids); output is a `PruneResult` (keep mask, a
per-rollout score, a `Reason` per rollout and loss weights). Every pruner works on a padded (G, M) layout (G
groups, M = the largest group size) with no Python loop over groups. Within a group, slots are ordered by a
random permutation drawn from the passed `torch.Generator` (by batch index without one), so exact ties are
broken at random yet reproducibly: same generator seed -> same mask.

Keep count (cppo, pods, fastrl): a group of n candidates keeps m = min(n, max(min_keep, ceil(keep_ratio·n))).

| pruner          | rule                                               | score                   | kept per group >= |
|-----------------|----------------------------------------------------|-------------------------|-------------------|
| none            | keep all (plain GRPO)                              | |A|                     | all               |
| dapo_filter     | drop groups whose rewards are all equal (DAPO)     | group reward std (pop.) | 0 if all equal    |
| cppo            | top-m by |A| per group (CPPO)                      | |A|                     | min(min_keep, n)  |
| pods            | size-m subset of max reward variance (PODS)        | |r − group mean reward| | min(min_keep, n)  |
| fastrl          | drop A = 0; per-sign facility-location coreset on  | gain / its sign's mass  | min(min_keep, n') |
|                 | sketches (CRAIG); selection=dpp: greedy k-DPP;     | dpp: exp(log-det gain)  | matching: 1       |
|                 | selection=matching: OMP + bounded least squares    | matching: gain / ||t||² |                   |

The paper's and the authors' rules (fastrl_official, fastrl_paper, random, advantage_only) are in
`algo.paper_pruners`, the DPP's greedy MAP and sign-mass weights in `algo.dpp`; all register here.

With `row_cost` (ρ, fastrl only: `algo.costs`), fastrl's m is lowered to the group's share of the batch's k*
heaviest rows (k* = argmax_k S_k / (1 + ρk), the most kept |A| mass per second), keep_ratio staying the cap.

n' = the group's nonzero-advantage rollouts. A group is emptied only by dapo_filter (all rewards equal) and by
fastrl (all advantages zero); pods and cppo may keep zero-advantage rollouts to reach m. Weights are 1 for kept
rollouts except with fastrl (coreset: the |A| mass each kept rollout stands for; dpp: sign-mass weights averaging
1 per group, or Horvitz–Thompson weights with reweight=True; matching: the least-squares weights), 0 for pruned.

Merged duplicates (`algo.duplicates.prune_distinct`): a batch may hold one row per distinct completion of a group
with its multiplicity in `GroupBatch.counts`; fastrl counts a row's |A| mass m times, the other pruners see
distinct completions (so their keep count is over distinct rows), and the copies are reported as DUPLICATE.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from fastrl_core.algo.costs import cost_keep_counts
from fastrl_core.algo.dpp import greedy_dpp, sign_mass_weights
from fastrl_core.algo.registry import Registry


class Reason(enum.IntEnum):
    """Why a rollout was kept or pruned; the run store keeps the member's name."""

    KEPT = 0  # kept (with fastrl_official also the rollouts topped back up to a minibatch multiple)
    ZERO_ADVANTAGE = 1  # fastrl: |A| <= zero_atol, so the rollout carries no policy gradient
    ZERO_VARIANCE_GROUP = 2  # dapo_filter: every reward of its group is equal
    LOW_ADVANTAGE = 3  # cppo: below the group's top-m |A|; fastrl: not selected although most of its sketch
    #                    direction is new (residual >= redundant_below): its |A| was too low to beat the kept ones
    REDUNDANT = 4  # fastrl_official: same rounded advantage as its bucket's kept rollout and token Jaccard >= 0.2;
    #                fastrl: not selected and most of its sketch direction (1 − residual) is spanned by kept ones
    OVER_BUDGET = 5  # pods: outside the max-reward-variance subset of size m (the middle rewards of the group)
    NOT_SAMPLED = 6  # fastrl with reweight=True: lost the random draw of its sign's sampled stratum
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
    weights: Tensor  # (N,) float loss weights: 0 pruned; 1 kept, except fastrl's sign-mass, coreset or HT weights
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


Pruner = Callable[..., PruneResult]
PRUNERS: Registry[Pruner] = Registry("pruner")
# pruners that read GroupBatch.sketches (the trainer computes sketches only for these): a new one adds its name
SKETCH_PRUNERS: set[str] = {"fastrl"}
TOKEN_PRUNERS: set[str] = {"fastrl_official", "fastrl_paper"}  # read GroupBatch.token_ids
COST_PRUNERS: set[str] = {"fastrl"}  # take `row_cost`, the keep count from pass costs (algo.costs)
# scale their loss weights by K / N for a loss normalised over the kept rows (`kept_normaliser`, `prune`)
WHOLE_BATCH_PRUNERS: set[str] = {"fastrl"}


class CostRuleError(ValueError):
    """`check_cost_rule`'s refusal; `keys` names what is at fault: ("row_cost",) for the value, ("row_cost",
    "pruner") for a pruner without a cost rule (the config check names where each was set)."""

    def __init__(self, message: str, keys: tuple[str, ...]):
        super().__init__(message)
        self.keys = keys


def check_cost_rule(pruner: str, row_cost: float | str | None, *, measured: bool = False) -> float | str | None:
    """`row_cost` (ρ, algo.costs) for `pruner`, the one check of it: None, or a number >= 0 (int or float, not
    a bool, not NaN) for a pruner in COST_PRUNERS, returned as a float. `measured`: 'measured' (ρ fitted by the
    trainer) is accepted too and returned as is. Raises CostRuleError (a ValueError) naming the value."""
    if row_cost is None:
        return None
    is_measured = measured and isinstance(row_cost, str) and row_cost == "measured"
    if not is_measured and (isinstance(row_cost, bool) or not isinstance(row_cost, (int, float))
                            or not row_cost >= 0):  # NaN too
        valid = "'measured' or a number >= 0" if measured else "a number >= 0"
        raise CostRuleError(f"row_cost={row_cost!r}: give {valid}", ("row_cost",))
    if pruner not in COST_PRUNERS:
        raise CostRuleError(f"row_cost={row_cost!r} with pruner={pruner!r}: only {sorted(COST_PRUNERS)} choose "
                            "their keep count from pass costs (have a cost rule)", ("row_cost", "pruner"))
    return row_cost if is_measured else float(row_cost)


@PRUNERS.register("none")
def keep_all(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
             generator: torch.Generator | None) -> PruneResult:
    """Plain GRPO: every rollout kept. Score |A|."""
    keep = groups.valid
    return padded_result(groups, keep, groups.pad(batch.advantages.abs(), 0.0), torch.zeros_like(groups.index))


@PRUNERS.register("dapo_filter")
def dapo_filter(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
                generator: torch.Generator | None) -> PruneResult:
    """DAPO dynamic sampling (Yu et al. 2025, §3.2) as a filter: drop every group whose rewards are all equal
    (all correct or all wrong), keep the others whole; a size-1 group counts as all equal. keep_ratio and min_keep
    are unused. Score: the group's population reward std (0 exactly for dropped groups)."""
    rewards = groups.pad(batch.rewards.double(), math.nan)
    high = torch.where(groups.valid, rewards, -math.inf).amax(1)
    low = torch.where(groups.valid, rewards, math.inf).amin(1)
    varied = high > low  # (G,)
    mean = torch.nansum(rewards, 1) / groups.sizes
    std = torch.where(varied, (torch.nansum((rewards - mean[:, None]) ** 2, 1) / groups.sizes).sqrt(), 0.0)
    keep = groups.valid & varied[:, None]
    reasons = torch.full_like(groups.index, int(Reason.ZERO_VARIANCE_GROUP))
    return padded_result(groups, keep, std[:, None].expand_as(rewards), reasons)


@PRUNERS.register("cppo")
def cppo(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
         generator: torch.Generator | None) -> PruneResult:
    """CPPO (Lin et al. 2025, arXiv 2503.22342, "CPPO: Accelerating the Training of Group Relative Policy
    Optimization-Based Reasoning Models"): keep the m rollouts of largest |A| per group (m from keep_ratio /
    min_keep, ties at random). Score |A|."""
    magnitude = groups.pad(batch.advantages.abs(), -math.inf)
    keep = groups.valid & (rank_descending(magnitude) < keep_counts(groups.sizes, keep_ratio, min_keep)[:, None])
    reasons = torch.full_like(groups.index, int(Reason.LOW_ADVANTAGE))
    return padded_result(groups, keep, magnitude.clamp(min=0.0), reasons)


@PRUNERS.register("pods")
def pods(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
         generator: torch.Generator | None) -> PruneResult:
    """PODS max-variance down-sampling (Xu et al. 2025, "Not All Rollouts are Useful", Thm. 1): among all size-m
    subsets of a group, the one of largest reward variance is the i lowest plus the m − i highest rewards for some
    i in 0..m. Sort once, evaluate the m + 1 candidates with prefix sums: O(n log n) per group, batched over groups.
    Score |r − group mean reward|."""
    m = keep_counts(groups.sizes, keep_ratio, min_keep)  # (G,)
    rewards = groups.pad(batch.rewards.double(), math.inf)  # padding sorts last
    mean = torch.where(groups.valid, rewards, 0.0).sum(1) / groups.sizes
    centred = torch.where(groups.valid, rewards - mean[:, None], math.inf)  # centring limits cancellation below
    sorted_r, order = torch.sort(centred, dim=1, stable=True)  # (G, M) ascending
    sorted_r = torch.where(torch.isfinite(sorted_r), sorted_r, 0.0)
    zero = torch.zeros(sorted_r.shape[0], 1, dtype=sorted_r.dtype)
    sum1 = torch.cat([zero, sorted_r.cumsum(1)], 1)  # (G, M + 1) prefix sums
    sum2 = torch.cat([zero, (sorted_r**2).cumsum(1)], 1)
    lows = torch.arange(sorted_r.shape[1] + 1)[None, :]  # (1, M + 1): i lowest
    n, mm = groups.sizes[:, None], m[:, None]
    cut = (n - mm + lows).clamp(max=sorted_r.shape[1])  # highs start here
    s1 = sum1.gather(1, lows.expand_as(sum1)) + sum1.gather(1, n) - sum1.gather(1, cut)
    s2 = sum2.gather(1, lows.expand_as(sum2)) + sum2.gather(1, n) - sum2.gather(1, cut)
    variance = torch.where(lows <= mm, s2 / mm - (s1 / mm) ** 2, -math.inf)  # (G, M + 1)
    best = variance.argmax(1, keepdim=True)  # (G, 1)
    position = torch.arange(sorted_r.shape[1])[None, :]
    keep_sorted = (position < best) | ((position >= n - mm + best) & (position < n))
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted) & groups.valid
    scores = torch.where(groups.valid, centred.abs(), 0.0)
    return padded_result(groups, keep, scores, torch.full_like(groups.index, int(Reason.OVER_BUDGET)))


def flat_result(keep: Tensor, scores: Tensor, reasons: Tensor) -> PruneResult:
    """A PruneResult from per-rollout (N,) decisions."""
    reasons = torch.where(keep, int(Reason.KEPT), reasons)
    return PruneResult(keep, scores, reasons, keep.float())


def cosine_kernel(sketches: Tensor | None, groups: Groups) -> Tensor:
    """K (G, M, M): cosine similarity of the sketches within each group, 1 on the diagonal (also for all-zero or
    padding sketches, which are orthogonal to everything). Without sketches K = I."""
    num_groups, size = groups.index.shape
    if sketches is None:
        return torch.eye(size).expand(num_groups, size, size).contiguous()
    padded = sketches.float()[groups.index]  # (G, M, D); padding slots repeat a real row and are masked below
    gram = torch.bmm(padded, padded.transpose(1, 2))  # (G, M, M)
    inverse_norm = gram.diagonal(dim1=1, dim2=2).sqrt().clamp(min=1e-12).reciprocal()  # (G, M)
    kernel = gram * inverse_norm[:, :, None] * inverse_norm[:, None, :]
    kernel = torch.where(groups.valid[:, :, None] & groups.valid[:, None, :], kernel, 0.0)
    kernel.diagonal(dim1=1, dim2=2).fill_(1.0)
    return kernel


@PRUNERS.register("fastrl")
def fastrl(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
           generator: torch.Generator | None, selection: str = "coreset", similarity: str = "euclidean",
           mass: str = "nearest", alpha: float = 1.0, min_gain: float | None = None, reweight: bool = False,
           sampled_fraction: float = 0.5, zero_atol: float = 1e-6, redundant_below: float = 0.5,
           balance: bool | None = None, mass_balance: bool = True, row_cost: float | None = None,
           kept_normaliser: bool = True) -> PruneResult:
    """FastRL pruning: drop what carries no gradient, then keep, per sign, the rollouts that best stand for the
    others, weighted by the |A| mass they stand for (`selection='coreset'`, default); or the older sign-balanced
    quality-diverse DPP (`selection='dpp'`, steps 2-6 below).

    Per group (all groups at once, padded):
    1. Rollouts with |A| <= zero_atol are pruned (ZERO_ADVANTAGE): A_i ∇log π(y_i) = 0, so this is free.
    C. selection='coreset': the same count m and sign caps as in steps 2-3, chosen by sign-capped greedy facility
       location (`algo.coreset`, CRAIG): a rollout is represented only by kept rollouts of its own sign, element
       weights ω_i = m_i|A_i| (m_i = `GroupBatch.counts`), similarity by `similarity` ("euclidean", default:
       ||φ_i|| − ||φ_i − φ_j|| on the advantage-free sketches, so ω_i·(that) is how much of rollout i's share of
       the CRAIG error bound j removes; "cosine": the sketch cosine; "euclidean_scaled": on |A|-scaled sketches
       with ω_i = m_i; "identity": no rollout stands for another, i.e. sign-balanced top m|A|). A rollout stands
       for those of its sign whose best similarity to the kept set is > 0 and is largest to it (others are left
       unrepresented: CRAIG's empty facility is closer); its loss weight per copy is the mass it stands for over
       its own, γ_j / (m_j|A_j|) (`mass='own'`: 1; `mass='sign'`: then scaled per sign so the kept rows carry the
       sign's whole |A| mass, unrepresented rollouts' too, which restores the group's zero sum), all scaled by K / N
       so the kept loss, which the trainer divides by its own count K, estimates the whole batch's (not scaled
       with `kept_normaliser=False`: minibatch_mode=as_sampled divides by the sampled count). m is raised
       to the number of signs present as in step 3, but sign caps are off by default (`balance=None`: off for the
       coreset, on for the DPP): each sign's mass already enters the gains, and capping measured worse (What was
       tried). Details and scores: `_fastrl_coreset`.
    M. selection='matching': gradient matching (`algo.matching`, GradMatch): the same count m, chosen by greedy
       orthogonal matching pursuit of the group's whole update t = Σ_i m_i A_i φ_i in sketch space, then weighed
       by bounded least squares (no kept row's effective advantage above the group's |A| mass); a row may stand
       for rollouts of the other sign, and a pick the fit gives no weight is pruned. The most faithful single
       step measured, but it trained worse (What was tried, (d)). Details: `_fastrl_matching`.
    R. `row_cost` (ρ, `algo.costs`; the trainer passes it with config `row_cost`): m is lowered to the group's
       share of the batch's k* heaviest rows, k* = argmax_k S_k / (1 + ρk), the keep count of most kept |A| mass
       per second of the step, but not below min(min_keep, n') (nor the signs present). keep_ratio stays the cap.
    2. m = min(n', max(min_keep, ceil(keep_ratio·n'))) of the n' nonzero-advantage rollouts are chosen by greedy
       MAP inference of a DPP (`greedy_dpp`) with L = diag(q) K diag(q): K the cosine kernel of the advantage-free
       sketches, q = (|A| / max_group |A|)^alpha. log det L_S = Σ_S log q² + log det K_S rewards large |A| and
       sketch directions not yet covered (alpha = 1: L is the Gram matrix of the unit sketches scaled by |A|, i.e.
       of the rollouts' gradient directions weighted as in the loss). Dividing q by the group's largest |A|
       changes no choice but makes gains scale-free: gain 0 = as strong as the group's best, orthogonal to picks.
    3. Sign balance (`balance`): det L is blind to the sign of A (flipping a row and column keeps it), so it is
       enforced apart: m is raised to the number of signs present (so min_keep = 1 still keeps one of each), and
       a sign gets at most m − min(n_other, floor(m/2)) picks, so each sign gets >= min(n_sign, floor(m/2)) and
       the odd pick goes to the larger gain.
    4. Sign-mass weights (`mass_balance`, default on, ignored with reweight): kept rollouts of sign s get weight
       ∝ M_s / M_s^kept (M = Σ|A| over the group / over its kept rollouts of that sign), averaging 1 per group
       (`sign_mass_weights`). A GRPO group is zero-sum (Σ A_i = 0), so any direction shared by all its rollouts
       (the prompt's) cancels in the full update; a kept set such as 4 positives of A = 0.75 and 4 negatives of
       A = −0.25 would bring it back. With these weights Σ_kept w_i A_i = 0 again. With mass_balance=False all
       kept weights are 1.
    5. `min_gain` (log units; −3 ≈ a new component 5% of the best rollout's squared gradient): after
       min(min_keep, n') picks a group stops once the best marginal log-det gain is below it. Greedy gains of a
       submodular log det never increase, so the stop is final.
    6. `reweight=True` (Horvitz–Thompson over a stratified design): in each sign stratum s the greedy picks did
       not exhaust, the first k_s − r_s picks are kept for certain (weight 1) and r_s = max(1,
       round(sampled_fraction·k_s)) rollouts are drawn uniformly without replacement (from `generator`) from the
       other ℓ_s nonzero rollouts of that sign, each with weight ℓ_s / r_s = 1 / inclusion probability. Then for
       ANY per-rollout quantity x_i, E[Σ_kept w_i x_i] = Σ_{i: A_i ≠ 0} x_i, the expectation taken over the draw
       with the batch fixed (the certain set depends on the batch only). With x_i = A_i ∇log π(y_i): the weighted
       kept policy gradient is unbiased for the whole group's (the KL term of pruned rollouts is not: it is
       dropped). The trainer's loss divides by the KEPT count, so its expected update is the full batch's times
       N / N_kept, a known per-step constant. Plain weights n'/m on the greedy set would NOT be unbiased: that is
       HT for uniform sampling, and greedy choice is not uniform. With reweight, m is raised to the number of signs
       present even without `balance` (no stratum may have inclusion probability 0); a stratum with no greedy
       pick (possible only with min_gain) still gets one draw.

    Scores: exp(marginal log-det gain) in [0, 1]: at pick time for picked rollouts, against the final picks for
    the others (0 for A = 0). Unpicked rollouts are REDUNDANT if d² < redundant_below (most of the unit sketch is
    in the span of the picks), else LOW_ADVANTAGE; NOT_SAMPLED if they lost a reweighting draw. Without sketches
    K = I: sign-balanced top-|A|. Kept: m = max(keep count, number of signs present) without min_gain; at least
    min(min_keep, n') with it; 0 only when all advantages are zero.

    What was tried. (a) `benchmarks/bench_prune.py`, a synthetic mode mixture with perfect sketches (keep 0.5, 512
    groups × 16, 3 seeds, mean cosine of the kept update to the full group's): with weights 1, random sign-balanced
    0.69, top-|A| sign-balanced 0.77, the DPP 0.77 (0.68 without sign balance), cppo 0.66, pods 0.78; with
    sign-mass weights, random 0.82, top-|A| 0.89, DPP alpha 0 / 0.5 / 1 / 2: 0.84 / 0.90 / 0.90 / 0.90; HT
    reweighting 0.79 (unbiased but noisy); coreset (euclidean / cosine) 0.97 / 0.97.
    (b) Real rollouts, full-model gradients (`benchmarks/bench_prune_quality.py --train-steps 40`; 16 prompts × 8
    of the synthetic task, the shipped warm start and the policy after 40 GRPO steps; cosine of the kept weighted
    update Σ_kept m w g / Σ_kept m to the full batch's; CPPO and PODS run per group at exactly fastrl's counts;
    every figure a mean over 10 draws of the pruners' random tie-break, docs/bench/prune-quality/report.txt).
    Rules were compared on choose seeds 0-5; the figures below are the disjoint report seeds 100-105, as
    "warm / trained" means, with the kept share of the sampled rollouts:
      without merging, keep 0.5 (46 / 40 % kept): this coreset 1.000 / 1.000 (relative error 0.010 / 0.013),
        CPPO 0.964 / 0.975, PODS 0.959 / 0.912, random 0.785 / 0.748, the DPP 0.939 / 0.929; the coreset beats
        CPPO and PODS in 6 of 6 batches for both policies (it keeps one copy of each frequent completion and
        gives it the copies' mass: exact when the picks cover every distinct completion);
      without merging, keep 0.25 (23 / 20 %): coreset 0.963 / 0.937, CPPO 0.863 / 0.867, PODS 0.834 / 0.820,
        DPP 0.833 / 0.753; beats CPPO 6 / 4 of 6 and PODS 6 / 6;
      merged (rows = distinct completions; 39 / 32 % of the sampled), keep 0.5 (24 / 20 % kept): coreset
        0.966 / 0.937, CPPO 0.972 / 0.943, PODS 0.943 / 0.894; beats CPPO in only 2 / 3 of 6, PODS 5 / 6 of 6;
        keep 0.25 (23 / 20 %): 0.963 / 0.937 vs CPPO 0.956 / 0.943: 3 / 3 of 6 against CPPO. Over both seed
        sets and policies it beats CPPO in 13 of 24 batches at keep 0.5 and 16 of 24 at keep 0.25, and in half
        the (batch, draw, draw) pairs: level in direction. With a row per distinct completion and ~3 of them
        per group, min_keep leaves little to choose, and CPPO's top-|A| on distinct rows is then as good:
        merging makes CPPO much better (0.863 -> 0.956 at ~23 %), not the coreset. The coreset's relative error
        stays 2-3x below CPPO's everywhere (e.g. 0.26 vs 0.74 merged) and below CPPO's and PODS's in 6 of 6
        batches in every setting, mostly because it keeps the update's size: at its best scale CPPO's error
        would be sin θ ≈ 0.23 (cosine 0.972). What CPPO's edge in direction on the report seeds is made of
        (`benchmarks/prune_picks_vs_weights.py`, warm, merged, keep 0.5 | 0.25, report and choose seeds): not
        the weights (the coreset's picks with weights 1: 0.965 | 0.962), and mostly CPPO's random tie-break.
        No fixed ranking (|A|, |A|·‖φ‖, m|A|, m|A|·‖φ‖, with or without one pick per sign) beats both on both
        seed sets; top m|A| alone is far worse (0.850 | 0.811).
      The authors' rule (`fastrl_official`, 29 / 25 % kept): 0.848 / 0.831 unmerged (CPPO at its counts 0.902 /
        0.891), 0.947 / 0.919 merged (CPPO 0.980 / 0.957); the coreset at its own (lower) counts is above it in
        6 of 6 unmerged, 3 / 5 of 6 merged.
    Variants measured and not kept (report seeds, warm / trained, without merging, keep 0.5 | 0.25): with sign
    caps 0.996 / 0.969 | 0.950 / 0.857 (on choose seeds, trained, keep 0.25: 5 of 6 vs CPPO, uncapped 6 of 6:
    why caps are off); euclidean_scaled (CRAIG on |A|-scaled sketches, ω = m) with caps equal to euclidean with
    caps; mass='own' (weights 1, no transfer) 0.972 / 0.946 | 0.860 / 0.773; cosine similarity 0.989 / 0.948 |
    0.760 / 0.812, and merged far worse (0.800 / 0.819 at keep 0.5): distinct completions' exact last-layer
    cosines are mostly negative (tests/test_sketches.py), and a first version that also gave a rollout the mass
    of rollouts at similarity <= 0 lost to random when merged (0.907 vs 0.933, choose seeds); sign-capped top
    m|A| (similarity 'identity') 0.958 / 0.927 | 0.844 / 0.817. So what makes the update faithful here is that
    each kept rollout carries the mass of the rollouts it nearly equals, measured with sketch NORMS (euclidean),
    not directions alone; diversity for its own sake (the DPP) does not help.
    (c) In training (`fastrl bench --config configs/paper.yaml`, docs/bench/paper, 3-5 seeds): with duplicates
    merged, every pruner alone saves little per step over GRPO (CPPO 1.10x, PODS 1.12x, random 1.11x,
    advantage-only 1.08x); the budget alone (then `adaptive_only`, with the cut of mixed prompts: today's
    `adaptive_cut`) 1.29x, and this coreset on top of it 1.39x [1.37, 1.41]. No pruner's final accuracy differs
    from GRPO's beyond seed noise.
    (d) Gradient matching (`selection='matching'`, GradMatch: OMP picks, bounded least-squares weights) and the
    zero sum restored (`mass='sign'`), same benchmark and report seeds, warm / trained. Merged, keep 0.5 (24 /
    20 % kept): matching 0.984 / 0.935, zero sum 0.901 / 0.888, against CPPO 0.972 / 0.943 and this coreset
    0.966 / 0.937. Matching beats CPPO in 5 / 3 of 6 and PODS in 6 / 5; keep 0.25 gives the same (choose seeds:
    5-6 of 6 against CPPO for both policies). Unmerged it beats both in 6 of 6, except 5 of 6 against CPPO for
    the trained policy at keep 0.25. Its relative error is 0.19 / 0.31 merged, against CPPO's 0.74 / 0.80. The gain comes from letting a row stand for rollouts of the
    other sign: capped at its own sign's mass, matching falls to 0.949 against CPPO's 0.968 (choose seeds,
    warm, merged, keep 0.5). In training both end lower than this coreset (5 seeds each):
    - matching at 0.785 ± 0.014, −2.0 ± 0.8 pts against GRPO, with late dips to 0.70-0.72
      (docs/bench/paper-matching);
    - zero sum at 0.773 ± 0.022, −3.2 ± 2.0 pts; weights 1 (`mass='own'`) at 0.776 ± 0.039, −3.0 ± 4.5 pts
      (docs/bench/paper-zero-sum);
    - this coreset at −0.6 ± 2.6 pts.
    A more faithful first step is not a better run, and the zero sum is not what keeps training on track, so the
    coreset stays the default. Matching's kept groups are further from zero-sum than the coreset's: |Σ m w A| is
    25-47 % of Σ m|w A|, against 17-31 %, and the net is positive.
    (e) Judged on sampled accuracy (mean@4 at T = 1, 5 seeds, docs/bench/paper-sampled), this coreset does not pay
    for itself on 2 CPU cores. Alone (budget fixed) it ends 2.0 ± 0.6 pts below GRPO at equal steps for a 1.08×
    cheaper step: −1.4 ± 1.0 pts at equal training seconds. With the adaptive budget (the default `fastrl`) it is
    −2.3 ± 0.6 per step and +0.1 ± 1.4 at equal time, where the budget alone is +1.0 ± 0.4. The greedy figures
    above (−0.6 ± 2.6 and the dips) hid this: greedy accuracy there is one counting threshold.
    (f) The keep count from pass costs (`row_cost`, `algo.costs`; docs/bench/paper-cost, mean@4, 5 seeds, all
    interleaved). With `keep_ratio=1.0 row_cost=measured` (fitted ρ 0.014-0.017) the coreset prunes 5-7 % of the
    nonzero-advantage rows (2.6-3.2 % of the |A| mass) instead of 24-25 % (17-18 %) at keep 0.5. Paired by seed it
    beats keep 0.5 by +1.03 ± 0.44 pts per step and +0.77 ± 0.35 at equal time (every seed above 0). It is level
    with dropping only A = 0 (−0.02 ± 0.59) and short of the budget with no pruner (−0.49 ± 0.49 per step,
    −0.27 ± 0.64 at equal time), which keeps the A = 0 rows and their KL term.
    (g) Keeping the pruned rows in the loss's normaliser (`minibatch_mode=as_sampled`, weights without K / N;
    docs/bench/paper-as-sampled, 5 seeds) makes dropping A = 0 rows exact at β = 0 but changes nothing measurable
    in training: −0.08 ± 0.96 pts at keep 1.0, −0.34 ± 1.25 with the cost rule. The gap to the budget alone
    (−0.56 ± 0.65) is the pruned A = 0 rows' KL term.
    (h) Over 160 steps (docs/bench/paper-long, mean@4), with the budget cutting only decided prompts: FastRL (this
    coreset with the cost rule) is +1.9 ± 1.1 pts over GRPO per step (10 seeds) and 1.25× cheaper per step; with
    row_cost pinned at 0.013, so runs repeat exactly, +1.4 ± 1.3 (5 seeds, all > 0, docs/bench/paper-long/pinned); the
    budget alone is +2.1 ± 2.3 and 1.19× (5 seeds). Pruning on top adds +0.25 ± 2.08 pts and ~5 % of a step: on
    2 CPU cores the passes it saves are a small share of a step, so the budget, not the pruner, is what pays here.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"fastrl: selection must be one of {SELECTIONS}, got {selection!r}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"fastrl: similarity must be one of {SIMILARITIES}, got {similarity!r}")
    if mass not in MASSES:
        raise ValueError(f"fastrl: mass must be one of {MASSES}, got {mass!r}")
    if alpha < 0 or zero_atol < 0 or not 0 < sampled_fraction <= 1:
        raise ValueError(f"fastrl: need alpha >= 0, zero_atol >= 0, 0 < sampled_fraction <= 1; got alpha={alpha}, "
                         f"zero_atol={zero_atol}, sampled_fraction={sampled_fraction}")
    if selection != "dpp" and (reweight or min_gain is not None):
        raise ValueError("fastrl: reweight and min_gain belong to selection='dpp'")
    if selection == "matching" and (balance or similarity != "euclidean" or mass != "nearest"):
        raise ValueError("fastrl: balance, similarity and mass belong to selection='coreset' or 'dpp'; "
                         "selection='matching' has no sign caps and fits its own weights")
    if balance is None:  # sign caps: on for the DPP (blind to signs), off for the coreset (see step C)
        balance = selection == "dpp"
    advantages = groups.pad(batch.advantages.float(), 0.0)  # (G, M)
    counts = groups.pad(batch.counts.float(), 0.0) if batch.counts is not None else groups.valid.float()
    magnitude = advantages.abs()
    candidates = groups.valid & (magnitude > zero_atol)
    positive = candidates & (advantages > 0)
    n_pos, n_neg = positive.sum(1), (candidates & ~positive).sum(1)
    n_nonzero = n_pos + n_neg
    floor = torch.minimum(n_nonzero, torch.tensor(min_keep))  # (G,) the group's minimum
    picks = keep_counts(n_nonzero, keep_ratio, min_keep)
    if row_cost is not None:  # what pays for its passes, never below the group's minimum
        affordable = cost_keep_counts(torch.where(candidates, counts * magnitude, 0.0), row_cost)
        picks = torch.maximum(torch.minimum(picks, affordable), floor)
    if balance or reweight or selection != "dpp":  # at least one pick per sign present
        picks = torch.maximum(picks, (n_pos > 0).long() + (n_neg > 0).long())
    half = picks // 2 if balance else torch.zeros_like(picks)
    cap_pos = torch.minimum(n_pos, picks - torch.minimum(n_neg, half))
    cap_neg = torch.minimum(n_neg, picks - torch.minimum(n_pos, half))
    if selection == "matching":
        return _fastrl_matching(batch, groups, advantages, counts, candidates, picks, redundant_below,
                                kept_normaliser)
    if selection == "coreset":
        return _fastrl_coreset(batch, groups, advantages, counts, candidates, positive, picks, cap_pos, cap_neg,
                               similarity, mass, redundant_below, kept_normaliser)
    relative = magnitude / magnitude.amax(1, keepdim=True).clamp(min=1e-30)
    log_quality = torch.where(candidates, 2 * alpha * torch.log(relative.clamp(min=1e-30)), -math.inf)
    selected, pick_order, pick_gain, residual = greedy_dpp(
        cosine_kernel(batch.sketches, groups), log_quality, candidates, positive, picks, cap_pos, cap_neg, floor,
        min_gain)
    final_gain = torch.where(candidates, log_quality + torch.log(residual.clamp(min=1e-30)), -math.inf)
    scores = torch.where(selected, pick_gain, final_gain).exp()
    reasons = torch.where(residual < redundant_below, int(Reason.REDUNDANT), int(Reason.LOW_ADVANTAGE))
    reasons = torch.where(candidates, reasons, int(Reason.ZERO_ADVANTAGE))
    keep, weights = selected, selected.float()
    if mass_balance and not reweight:
        weights = sign_mass_weights(advantages, candidates, positive, selected, counts)
    if reweight:
        keep, weights = torch.zeros_like(selected), torch.zeros_like(weights)
        for stratum, count in ((positive, n_pos), (candidates & ~positive, n_neg)):
            kept_s, weights_s = _sample_stratum(stratum, count, selected & stratum, pick_order, sampled_fraction,
                                                generator)
            keep |= kept_s
            weights += weights_s
        reasons = torch.where(selected & ~keep, int(Reason.NOT_SAMPLED), reasons)
    return padded_result(groups, keep, scores, reasons, weights)


SELECTIONS = ("matching", "coreset", "dpp")
SIMILARITIES = ("cosine", "euclidean", "euclidean_scaled", "identity")
MASSES = ("nearest", "own", "sign")


def _padded_sketches(batch: GroupBatch, groups: Groups) -> Tensor:
    """(G, M, D) float sketches; without sketches the unit vectors of the slots (no rollout resembles another).
    Padding slots repeat a row and are never candidates."""
    sketches = batch.sketches if batch.sketches is not None else torch.eye(groups.index.shape[1])[groups.slot]
    return sketches.float()[groups.index]


def _kept_share(counts: Tensor, keep: Tensor, groups: Groups, kept_normaliser: bool = True) -> float:
    """K / N: kept copies over all copies of the batch (zero-advantage rollouts included), the scale that makes
    the kept loss, when the trainer divides it by K, estimate the whole batch's loss divided by N; 1.0 when the
    loss keeps the pruned rows in its normaliser (kept_normaliser=False, `minibatch_mode=as_sampled`)."""
    if not kept_normaliser:
        return 1.0
    return float((counts * keep).sum()) / float(counts[groups.valid].sum())


def _fastrl_matching(batch: GroupBatch, groups: Groups, advantages: Tensor, counts: Tensor, candidates: Tensor,
                     picks: Tensor, redundant_below: float, kept_normaliser: bool = True) -> PruneResult:
    """`fastrl` with selection='matching': per group, the `picks` rows whose weighted sum best matches the group's
    whole update in sketch space (`algo.matching`, GradMatch by OMP), weighted by bounded least squares.

    u_i = A_i φ_i (φ the advantage-free sketches; without sketches the unit vectors, which makes it top m|A| with
    weights 1), t = Σ_i m_i u_i over the group's candidates (m = `GroupBatch.counts`). Weights: c = argmin
    ||Σ_S c_j u_j − t|| with 0 <= c_j <= Σ_i m_i|A_i| / |A_j|, i.e. no kept row's effective advantage |c_j A_j|
    exceeds the group's whole |A| mass; a row may stand for rollouts of either sign (a pushed-down wrong
    completion and a pushed-up right one share much of their gradient), so the group need not stay zero-sum.
    Loss weight per copy c_j / m_j, all scaled by K / N as with the coreset. A pick the fit gives c_j = 0 adds
    nothing to the update and is pruned (REDUNDANT: the other picks explain the group at least as well without
    it), so a group keeps between 1 and m rows; where nothing in the group can be matched (t = 0 in sketch space,
    e.g. all-zero sketches) the picks are kept at their own weight (c_j = m_j). Scores: the pick's gain over
    ||t||², the share of the group's squared update it explained (unpicked: its gain against the final picks).
    Unpicked candidates are REDUNDANT if at least `redundant_below` of ||u_i||² lies in the span of the picks,
    else LOW_ADVANTAGE."""
    from fastrl_core.algo.matching import box_least_squares, matching_pursuit

    padded = _padded_sketches(batch, groups)  # (G, M, D)
    signed = torch.where(candidates, advantages.double(), 0.0)  # (G, M)
    gram = torch.bmm(padded, padded.transpose(1, 2)).double() * signed[:, :, None] * signed[:, None, :]  # u_i · u_j
    multiplicity = torch.where(candidates, counts.double(), 0.0)
    target_dot = torch.einsum("gij,gj->gi", gram, multiplicity)  # u_i · t
    selected, pick_gain, final_gain, spanned = matching_pursuit(gram, target_dot, candidates, picks)
    magnitude = advantages.double().abs()
    mass = (multiplicity * magnitude).sum(1, keepdim=True)  # (G, 1)
    upper = torch.where(selected, mass / magnitude.clamp(min=1e-30), 0.0)
    coefficients = box_least_squares(gram, target_dot, upper, selected)
    fitted = selected & (coefficients > 1e-9 * upper)  # FISTA's projection sets unused ones to 0
    unmatched = (fitted.sum(1) == 0)[:, None]  # t = 0 in sketch space (e.g. zero sketches): the picks at own weight
    keep = torch.where(unmatched, selected, fitted)
    coefficients = torch.where(unmatched, counts.double(), coefficients)
    weights = torch.where(keep, coefficients / counts.double().clamp(min=1e-30), 0.0)
    weights = (weights * _kept_share(counts, keep, groups, kept_normaliser)).float()
    energy = (multiplicity * target_dot).sum(1, keepdim=True)  # ||t||²
    gain = torch.where(selected, pick_gain, final_gain)
    scores = torch.where(candidates, gain / energy.clamp(min=1e-300), 0.0).clamp(0.0, 1.0).float()
    reasons = torch.where(spanned >= redundant_below, int(Reason.REDUNDANT), int(Reason.LOW_ADVANTAGE))
    reasons = torch.where(selected, int(Reason.REDUNDANT), reasons)  # a pick the fit gives no weight
    reasons = torch.where(candidates, reasons, int(Reason.ZERO_ADVANTAGE))
    return padded_result(groups, keep, scores, reasons, weights)


def _fastrl_coreset(batch: GroupBatch, groups: Groups, advantages: Tensor, counts: Tensor, candidates: Tensor,
                    positive: Tensor, picks: Tensor, cap_pos: Tensor, cap_neg: Tensor, similarity: str,
                    mass: str, redundant_below: float, kept_normaliser: bool = True) -> PruneResult:
    """`fastrl` with selection='coreset': per sign, a facility-location coreset (`algo.coreset`) of the group.

    Elements are the candidates (A ≠ 0) of each sign; element weights ω and similarities by `similarity`:
      cosine            ω_i = m_i|A_i|, sim = cosine of the sketches (K, as the DPP reads), coverage floor 0;
      euclidean         ω_i = m_i|A_i|, sim(i, j) = ||φ_i|| − ||φ_i − φ_j|| on the advantage-free sketches φ: the
                        CRAIG bound on || Σ_i ω_i s φ_i − Σ_S γ_j s φ_j || (s the sign);
      euclidean_scaled  ω_i = m_i, the same on ψ_i = |A_i| φ_i / max_group |A| (CRAIG on the per-rollout
                        gradients themselves).
    Weights: γ_j = Σ_{i: a(i) = j} ω_i, the mass of the rollouts j stands for (`represented_mass`); j's loss weight
    per copy is γ_j / (m_j|A_j|) (γ_j / m_j with euclidean_scaled), so its m_j copies bring γ_j·s·φ_j into the
    update, and with cosine / euclidean Σ_kept m_j w_j A_j = Σ_i m_i A_i per sign over the rollouts that HAVE a
    representative. A rollout with none (similarity <= 0 to every pick of its sign) passes no mass on, so the
    group's zero sum holds only when every candidate is represented. Distinct completions rarely are (their exact
    last-layer cosines are mostly negative), so with duplicates merged it mostly fails: in the paper bench
    (docs/bench/paper, seeds 0-2) the kept groups' |Σ m w A| was 17-31 % of their Σ m|w A|. Restoring it (each
    sign's kept weights scaled to the sign's whole mass) made the update less faithful, not more: cosine 0.956 ->
    0.891 (bench_prune_quality choose seeds, warm start, merged, keep 0.5); `mass='sign'` does it. All weights
    are then scaled by K / N (K = Σ_kept m, N = Σ m over the batch, zero-advantage rollouts included), so the kept
    loss, which the trainer divides by K, estimates the whole batch's loss divided by N; group-relative scales are
    left as in the full update.
    Scores: gain at pick time (unpicked: gain against the final picks) over the sign's total Σ ω_i sim(i, i), in
    [0, 1]. Unpicked candidates are REDUNDANT if sim(i, a(i)) / sim(i, i) >= redundant_below, else LOW_ADVANTAGE."""
    from fastrl_core.algo.coreset import euclidean_similarity, greedy_facility_location, represented_mass

    magnitude = advantages.abs()
    if similarity in ("cosine", "identity"):
        kernel = cosine_kernel(batch.sketches if similarity == "cosine" else None, groups)
        element_weight = counts * magnitude
    else:
        padded = _padded_sketches(batch, groups)  # (G, M, D)
        if similarity == "euclidean_scaled":
            scale = magnitude / magnitude.amax(1, keepdim=True).clamp(min=1e-30)
            padded, element_weight = padded * scale[:, :, None], counts
        else:
            element_weight = counts * magnitude
        kernel = euclidean_similarity(padded)
    element_weight = torch.where(candidates, element_weight, 0.0)
    selected, pick_gain, final_gain, assignment = greedy_facility_location(
        kernel, element_weight, candidates, positive, picks, cap_pos, cap_neg)
    if mass == "own":
        weights = selected.float()
    else:
        gamma = represented_mass(element_weight, assignment)  # (G, M)
        per_copy = counts * (magnitude if similarity != "euclidean_scaled" else 1.0)
        weights = torch.where(selected, gamma / per_copy.clamp(min=1e-30), 0.0)
        if mass == "sign":  # each sign's unrepresented mass too, in proportion to what its kept rows stand for
            for stratum in (positive, candidates & ~positive):
                whole = torch.where(stratum, counts * magnitude, 0.0).sum(1, keepdim=True)
                carried = torch.where(stratum & selected, counts * weights * magnitude, 0.0).sum(1, keepdim=True)
                ratio = torch.where(carried > 0, whole / carried.clamp(min=1e-30), 0.0)
                weights = torch.where(stratum & selected, weights * ratio, weights)
        weights = weights * _kept_share(counts, selected, groups, kept_normaliser)
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


def _sample_stratum(stratum: Tensor, size: Tensor, picked: Tensor, pick_order: Tensor, sampled_fraction: float,
                    generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Certain + sampled split of one sign stratum per group (see `fastrl` step 5).

    stratum, picked (G, M) bool; size (G,) = stratum sizes; pick_order (G, M). Returns (keep (G, M) bool,
    weights (G, M) float: 1 certain, ℓ/r sampled, 0 otherwise)."""
    k = picked.sum(1)  # (G,) greedy picks in the stratum
    draws = torch.where(k < size, torch.round(sampled_fraction * k).long().clamp(min=1), 0)  # r_s
    certain_count = (k - draws).clamp(min=0)
    pick_rank = rank_descending(torch.where(picked, -pick_order.float(), -math.inf))  # 0 = first pick
    certain = picked & (pick_rank < certain_count[:, None])
    pool = stratum & ~certain  # ℓ_s = size − certain_count rollouts
    noise = torch.rand(stratum.shape, generator=generator)
    drawn = pool & (rank_descending(torch.where(pool, noise, -math.inf)) < draws[:, None])
    pool_size = (size - certain_count).clamp(min=1)
    weights = torch.where(certain, 1.0, torch.where(drawn, (pool_size / draws.clamp(min=1)).float()[:, None], 0.0))
    return certain | drawn, weights


def _check_batch(batch: GroupBatch) -> int:
    """Validate shapes, dtypes and finiteness; return N."""
    if not isinstance(batch, GroupBatch):
        raise TypeError(f"prune expects a GroupBatch, got {type(batch).__name__}")
    n = batch.group_ids.numel()
    if batch.group_ids.dim() != 1 or batch.group_ids.is_floating_point() or batch.group_ids.dtype == torch.bool:
        raise ValueError(f"GroupBatch.group_ids must be a 1-D integer tensor, got {batch.group_ids.dtype} "
                         f"{tuple(batch.group_ids.shape)}")
    for name in ("rewards", "advantages"):
        values = getattr(batch, name)
        if values.shape != (n,):
            raise ValueError(f"GroupBatch.{name} must be ({n},) like group_ids, got {tuple(values.shape)}")
        bad = (~torch.isfinite(values.double())).nonzero().flatten()
        if bad.numel():
            raise ValueError(f"GroupBatch.{name} must be finite; non-finite at rows {bad[:10].tolist()}")
    if batch.sketches is not None:
        if batch.sketches.dim() != 2 or batch.sketches.shape[0] != n:
            raise ValueError(f"GroupBatch.sketches must be ({n}, D), got {tuple(batch.sketches.shape)}")
        if not torch.isfinite(batch.sketches.sum()):  # fast path; overflow of the sum falls to the exact check
            bad = (~torch.isfinite(batch.sketches).all(1)).nonzero().flatten()
            if bad.numel():
                raise ValueError(f"GroupBatch.sketches must be finite; non-finite in rows {bad[:10].tolist()}")
    if batch.counts is not None:
        if batch.counts.shape != (n,):
            raise ValueError(f"GroupBatch.counts must be ({n},) like group_ids, got {tuple(batch.counts.shape)}")
        bad = (~(torch.isfinite(batch.counts.double()) & (batch.counts >= 1))).nonzero().flatten()
        if bad.numel():
            raise ValueError(f"GroupBatch.counts must be finite and >= 1; not at rows {bad[:10].tolist()}")
    if batch.token_ids is not None:
        if len(batch.token_ids) != n:
            raise ValueError(f"GroupBatch.token_ids must hold {n} tensors, got {len(batch.token_ids)}")
        for row, ids in enumerate(batch.token_ids):
            if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
                raise ValueError(f"GroupBatch.token_ids[{row}] must be a 1-D integer tensor, got {ids.dtype} "
                                 f"{tuple(ids.shape)}")
    return n


def prune(name: str, batch: GroupBatch, *, keep_ratio: float = 0.5, min_keep: int = 2,
          generator: torch.Generator | None = None, row_cost: float | None = None, kept_normaliser: bool = True,
          **options) -> PruneResult:
    """Run pruner `name` (see `PRUNERS`) on `batch`; `options` are that pruner's own keyword arguments.
    `row_cost` (ρ >= 0, `algo.costs`; `check_cost_rule`) is passed on only when given, and only pruners in
    COST_PRUNERS take it.
    `kept_normaliser`: whether the loss will divide by the kept rows only (True: `minibatch_mode` equal_updates /
    fixed_size, TRL) or keep the pruned rows in its normaliser (False: as_sampled); WHOLE_BATCH_PRUNERS, whose
    weights estimate the whole batch's update, scale them by K / N only in the first case.
    Decisions are computed and returned on the CPU (a CPU mask can index tensors on any device)."""
    pruner = PRUNERS.get(name)
    if not 0 < keep_ratio <= 1:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if min_keep < 1:
        raise ValueError(f"min_keep must be >= 1, got {min_keep}")
    if row_cost is not None:
        options["row_cost"] = check_cost_rule(name, row_cost)
    if not kept_normaliser and name in WHOLE_BATCH_PRUNERS:
        options["kept_normaliser"] = False
    n = _check_batch(batch)
    if n == 0:
        empty = torch.zeros(0)
        return PruneResult(empty.bool(), empty, empty.long(), empty)
    tensors = [batch.group_ids, batch.rewards, batch.advantages, batch.sketches, batch.counts,
               *(batch.token_ids or ())[:1]]
    if any(t is not None and t.device.type != "cpu" for t in tensors):
        batch = GroupBatch(batch.group_ids.cpu(), batch.rewards.cpu(), batch.advantages.cpu(),
                           None if batch.sketches is None else batch.sketches.cpu(),
                           None if batch.token_ids is None else tuple(t.cpu() for t in batch.token_ids),
                           None if batch.counts is None else batch.counts.cpu())
    groups = group_layout(batch.group_ids, generator)
    try:
        return pruner(batch, groups, keep_ratio=keep_ratio, min_keep=min_keep, generator=generator, **options)
    except TypeError as error:
        if "unexpected keyword argument" in str(error):
            raise TypeError(f"pruner {name!r}: {error}") from None
        raise


# the paper's and the authors' rules register themselves here (after everything they import from this module)
from fastrl_core.algo import paper_pruners  # noqa: E402,F401
