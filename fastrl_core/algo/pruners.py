"""Rollout pruners: which rollouts of each prompt group go on to the old/ref log-prob passes and the update.

Input is one step's rollouts (`GroupBatch`: prompt groups of unequal sizes, rewards, advantages, advantage-free
gradient sketches, optionally completion token ids and multiplicities); output a `PruneResult` (keep mask, a score,
a `Reason` and a loss weight per rollout). Every pruner works on the padded (G, M) layout of `algo.groups`, with no
Python loop over groups; exact ties are broken by the passed `torch.Generator` (same seed -> same mask).

Keep count (cppo, pods, fastrl): a group of n candidates keeps m = min(n, max(min_keep, ceil(keep_ratio·n))).

| pruner          | rule                                                  | score                   | kept per group >= |
|-----------------|-------------------------------------------------------|-------------------------|-------------------|
| none            | keep all (plain GRPO)                                 | |A|                     | all               |
| dapo_filter     | drop groups whose rewards are all equal (DAPO)        | group reward std (pop.) | 0 if all equal    |
| cppo            | top-m by |A| per group (CPPO)                         | |A|                     | min(min_keep, n)  |
| pods            | size-m subset of max reward variance (PODS)           | |r − group mean reward| | min(min_keep, n)  |
| fastrl          | drop A = 0, then a per-sign coreset of the sketches   | gain / its sign's total | min(min_keep, n') |
|                 | weighted by the |A| mass each kept row stands for     |                         |                   |

`fastrl` is in `algo.fastrl`; the paper's and the authors' rules (fastrl_official, fastrl_paper, random,
advantage_only) in `algo.paper_pruners`. Every pruner is registered once, at the end of this module, as a
`PrunerEntry` saying what it reads beyond rewards and advantages (sketches, token ids) and whether it has a cost
rule: the trainer, the config check and the engine resolver ask the entry.
n' = the group's nonzero-advantage rollouts. A group is emptied only by dapo_filter (all rewards equal) and by
fastrl (all advantages zero). Weights are 1 for kept rollouts except with fastrl, 0 for pruned ones.

Merged duplicates (`algo.duplicates.prune_distinct`): a batch may hold one row per distinct completion of a group
with its multiplicity in `GroupBatch.counts`; fastrl counts a row's |A| mass that many times, the other pruners
see distinct completions, and the copies are reported as DUPLICATE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from fastrl_core.algo import paper_pruners
from fastrl_core.algo.fastrl import fastrl
from fastrl_core.algo.groups import (GroupBatch, Groups, PruneResult, Reason, group_layout, keep_counts, padded_result,
                                     rank_descending)
from fastrl_core.algo.registry import Registry

Pruner = Callable[..., PruneResult]  # (batch, groups, *, keep_ratio, min_keep, generator, **its own options)


@dataclass(frozen=True)
class PrunerEntry:
    """A registered pruner and what it needs beyond rewards and advantages."""

    prune: Pruner
    reads_sketches: bool = False  # GroupBatch.sketches: the trainer computes a sketch only for these
    reads_tokens: bool = False  # GroupBatch.token_ids, the completions' token ids
    cost_rule: bool = False  # takes `row_cost`, the keep count from pass costs (algo.costs)


PRUNERS: Registry[PrunerEntry] = Registry("pruner")  # filled at the end of this module




class CostRuleError(ValueError):
    """`check_cost_rule`'s refusal; `keys` names what is at fault: ("row_cost",) for the value, ("row_cost",
    "pruner") for a pruner without a cost rule (the config check names where each was set)."""

    def __init__(self, message: str, keys: tuple[str, ...]):
        super().__init__(message)
        self.keys = keys


def check_cost_rule(pruner: str, row_cost: float | str | None, *, measured: bool = False) -> float | str | None:
    """`row_cost` (ρ, algo.costs) for `pruner`, the one check of it: None, or a number >= 0 (int or float, not
    a bool, not NaN) for a pruner with a cost rule (`PrunerEntry.cost_rule`), returned as a float. `measured`: 'measured' (ρ fitted by the
    trainer) is accepted too and returned as is. Raises CostRuleError (a ValueError) naming the value."""
    if row_cost is None:
        return None
    is_measured = measured and isinstance(row_cost, str) and row_cost == "measured"
    if not is_measured and (isinstance(row_cost, bool) or not isinstance(row_cost, (int, float))
                            or not row_cost >= 0):  # NaN too
        valid = "'measured' or a number >= 0" if measured else "a number >= 0"
        raise CostRuleError(f"row_cost={row_cost!r}: give {valid}", ("row_cost",))
    if pruner not in PRUNERS or not PRUNERS.get(pruner).cost_rule:
        with_rule = PRUNERS.names(lambda entry: entry.cost_rule)
        raise CostRuleError(f"row_cost={row_cost!r} with pruner={pruner!r}: only {with_rule} choose "
                            "their keep count from pass costs (have a cost rule)", ("row_cost", "pruner"))
    return row_cost if is_measured else float(row_cost)


def keep_all(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
             generator: torch.Generator | None) -> PruneResult:
    """Plain GRPO: every rollout kept. Score |A|."""
    keep = groups.valid
    return padded_result(groups, keep, groups.pad(batch.advantages.abs(), 0.0), torch.zeros_like(groups.index))


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


def cppo(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
         generator: torch.Generator | None) -> PruneResult:
    """CPPO (Lin et al. 2025, arXiv 2503.22342, "CPPO: Accelerating the Training of Group Relative Policy
    Optimization-Based Reasoning Models"): keep the m rollouts of largest |A| per group (m from keep_ratio /
    min_keep, ties at random). Score |A|."""
    magnitude = groups.pad(batch.advantages.abs(), -math.inf)
    keep = groups.valid & (rank_descending(magnitude) < keep_counts(groups.sizes, keep_ratio, min_keep)[:, None])
    reasons = torch.full_like(groups.index, int(Reason.LOW_ADVANTAGE))
    return padded_result(groups, keep, magnitude.clamp(min=0.0), reasons)


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



# ---- the one registration of every pruner: name -> the function and what it reads
for _name, _entry in {
    "none": PrunerEntry(keep_all),
    "dapo_filter": PrunerEntry(dapo_filter),
    "cppo": PrunerEntry(cppo),
    "pods": PrunerEntry(pods),
    "fastrl": PrunerEntry(fastrl, reads_sketches=True, cost_rule=True),
    "fastrl_official": PrunerEntry(paper_pruners.fastrl_official, reads_tokens=True),
    "fastrl_paper": PrunerEntry(paper_pruners.fastrl_paper, reads_tokens=True),
    "random": PrunerEntry(paper_pruners.random_pruning),
    "advantage_only": PrunerEntry(paper_pruners.advantage_only),
}.items():
    PRUNERS.register(_name)(_entry)


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
          generator: torch.Generator | None = None, row_cost: float | None = None, **options) -> PruneResult:
    """Run pruner `name` (see `PRUNERS`) on `batch`; `options` are that pruner's own keyword arguments.
    `row_cost` (ρ >= 0, `algo.costs`; `check_cost_rule`) is passed on only when given, and only pruners with a
    cost rule take it.
    Decisions are computed and returned on the CPU (a CPU mask can index tensors on any device)."""
    pruner = PRUNERS.get(name).prune
    if not 0 < keep_ratio <= 1:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if min_keep < 1:
        raise ValueError(f"min_keep must be >= 1, got {min_keep}")
    if row_cost is not None:
        options["row_cost"] = check_cost_rule(name, row_cost)
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
