"""The paper's and the authors' pruning rules, as baselines for `fastrl` (registered in `algo.pruners`).

| pruner          | rule                                                             | score                   | kept >= |
|-----------------|------------------------------------------------------------------|-------------------------|---------|
| fastrl_official | the authors' code: equal-advantage buckets + token-set Jaccard   | 1 − Jaccard to its rep  | 1       |
|                 | to the bucket's representative (docs/notes.md §1)                |                         |         |
| fastrl_paper    | the paper as written (§3.2, Alg. 1): n-gram Jaccard distance     | distance to the kept    | 1       |
|                 | >= tau to EVERY kept one of its bucket                           |                         |         |
| random          | paper Table 5: a uniform random m-subset per group (m as cppo)   | m / n                   | m       |
| advantage_only  | paper Table 5: one random rollout per distinct rounded advantage | 1 / bucket size         | 1       |

None of them has a budget except `random` (keep_ratio / min_keep are unused by the others); every group keeps at
least one rollout, A = 0 buckets included, as in the authors' code. Weights are 1 (no reweighting). The two
Jaccard rules need `GroupBatch.token_ids`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fastrl_core.algo.groups import (GroupBatch, Groups, PruneResult, Reason, flat_result, keep_counts, padded_result,
                                     rank_descending)


def token_jaccard_pairs(token_ids: tuple[Tensor, ...], first: Tensor, second: Tensor) -> Tensor:
    """Jaccard similarity of the token SETS of rollouts first[k] and second[k]; 1 for two empty sets.

    token_ids: N 1-D tensors; first, second (P,) long -> (P,) float64. Vectorised: each rollout's distinct tokens
    become sorted keys rollout·V + token, and membership of first[k]'s tokens in second[k]'s set is a searchsorted.
    """
    lengths = torch.tensor([t.numel() for t in token_ids], dtype=torch.long)
    if not lengths.sum():
        return torch.ones(first.numel(), dtype=torch.float64)
    tokens = torch.cat([t.reshape(-1).long() for t in token_ids])
    owner = torch.repeat_interleave(torch.arange(len(token_ids)), lengths)
    if int(tokens.min()) < 0:
        raise ValueError(f"GroupBatch.token_ids[{int(owner[tokens.argmin()])}] holds a negative token id")
    vocab = int(tokens.max()) + 1
    keys = torch.unique(owner * vocab + tokens)  # sorted distinct (rollout, token)
    set_size = torch.bincount(keys // vocab, minlength=len(token_ids))
    starts = torch.cumsum(set_size, 0) - set_size
    sizes_first = set_size[first]
    pair = torch.repeat_interleave(torch.arange(first.numel()), sizes_first)  # one entry per token of first[k]
    offset = torch.arange(pair.numel()) - (torch.cumsum(sizes_first, 0) - sizes_first)[pair]
    query = second[pair] * vocab + keys[starts[first][pair] + offset] % vocab
    found = keys[torch.searchsorted(keys, query).clamp(max=keys.numel() - 1)] == query
    common = torch.zeros(first.numel(), dtype=torch.float64).index_add_(0, pair, found.double())
    union = sizes_first + set_size[second] - common
    return torch.where(union > 0, common / union.clamp(min=1), 1.0)


def fastrl_official(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
                    generator: torch.Generator | None, minibatch_size: int | None = None,
                    jaccard_threshold: float = 0.2, decimals: int = 4) -> PruneResult:
    """The authors' rule (docs/notes.md §1), ignoring keep_ratio / min_keep as their code has no budget:

    1. In each prompt group, bucket rollouts by advantage rounded to `decimals` (4) decimals.
    2. In each bucket keep its representative, the rollout of largest |A| (ties at random); keep another rollout
       of the bucket only if the Jaccard similarity of its token SET to the representative's is < 0.2.
       Every group keeps >= 1 rollout (zero-advantage buckets included, as in their code).
    3. If `minibatch_size` is given, top the batch up to the next multiple of it (at most N) with dropped
       rollouts: round-robin over groups in ascending id order, each round taking each group's highest-|A|
       remaining dropped rollout.
    Score: 1 − Jaccard to the bucket's representative (1 for representatives). Needs `batch.token_ids`.
    """
    if batch.token_ids is None:
        raise ValueError("pruner 'fastrl_official' compares completions' token sets: GroupBatch.token_ids is None")
    if minibatch_size is not None and minibatch_size < 1:
        raise ValueError(f"fastrl_official: minibatch_size must be >= 1, got {minibatch_size}")
    n = batch.advantages.numel()
    magnitude = batch.advantages.double().abs()
    bucket = advantage_buckets(groups, batch.advantages, decimals)  # (N,)
    order = bucket_order(groups, magnitude, bucket)  # representative: each bucket's first
    first_in_bucket = torch.ones(n, dtype=torch.bool)
    first_in_bucket[1:] = bucket[order][1:] != bucket[order][:-1]
    representative = torch.empty(int(bucket.max()) + 1, dtype=torch.long)
    representative[bucket[order][first_in_bucket]] = order[first_in_bucket]
    rep = representative[bucket]  # (N,) representative of each rollout's bucket
    is_rep = rep == torch.arange(n)
    similarity = torch.where(is_rep, 0.0, token_jaccard_pairs(batch.token_ids, torch.arange(n), rep))  # (N,)
    keep = is_rep | (similarity < jaccard_threshold)
    if minibatch_size is not None:
        keep = top_up_round_robin(keep, magnitude, groups, minibatch_size)
    reasons = torch.full((n,), int(Reason.REDUNDANT), dtype=torch.long)
    return flat_result(keep, (1.0 - similarity).float(), reasons)


def advantage_buckets(groups: Groups, advantages: Tensor, decimals: int) -> Tensor:
    """(N,) long bucket id per rollout: same group and same advantage rounded to `decimals` decimals (paper Eq. 6;
    the rounding is the authors' code's, and the paper's App. C.4 groups |A_i − A_j| < 1e-4 alike)."""
    value = torch.round(advantages.double() * 10**decimals).long()
    return _pair_ids(groups.row, value)


def bucket_order(groups: Groups, magnitude: Tensor, bucket: Tensor) -> Tensor:
    """(N,) batch indices sorted by bucket, then |A| descending, ties by the group layout's random slot (a lexsort
    by successive stable sorts): each bucket's first is its largest-|A| rollout (the authors' representative,
    Alg. 1 line 19's traversal order)."""
    order = torch.argsort(groups.slot, stable=True)
    order = order[torch.argsort(magnitude[order], descending=True, stable=True)]
    return order[torch.argsort(bucket[order], stable=True)]


def _pair_ids(first: Tensor, second: Tensor) -> Tensor:
    """Dense ids (N,) of the pairs (first[i], second[i]), numbered in lexicographic order. One 1-D unique of the
    key first·R + second (R = the range of second) when it fits in int64: `unique(dim=...)` costs ~30 ms here."""
    if first.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    low, span = second.min(), int(second.max() - second.min()) + 1
    if span * (int(first.max()) + 1) < 2**62 and int(first.min()) >= 0:
        return torch.unique(first * span + (second - low), return_inverse=True)[1]
    return torch.unique(torch.stack([first, second]), dim=1, return_inverse=True)[1]


def random_pruning(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
                   generator: torch.Generator | None) -> PruneResult:
    """Random pruning (paper Table 5, "Random-pruning 0.25 / 0.50 / 0.75": prune that share of each query's
    trajectories at random; its 50 % row is keep_ratio=0.5 here). Each group keeps a uniform random subset of
    m = min(n, max(min_keep, ceil(keep_ratio·n))) rollouts: the first m slots of the layout, whose order within a
    group is a uniform random permutation drawn from `generator` (batch order without one). Weights 1, as in the
    paper (no reweighting). Score: the inclusion probability m / n. Pruned: NOT_SAMPLED."""
    m = keep_counts(groups.sizes, keep_ratio, min_keep)  # (G,)
    position = torch.arange(groups.index.shape[1])[None, :]
    keep = groups.valid & (position < m[:, None])
    scores = (m.double() / groups.sizes)[:, None].expand(groups.index.shape)
    return padded_result(groups, keep, scores, torch.full_like(groups.index, int(Reason.NOT_SAMPLED)))


def advantage_only(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
                   generator: torch.Generator | None, decimals: int = 4,
                   keep_zero_advantage: bool = True) -> PruneResult:
    """The paper's "Advantage-only" ablation (Table 5, 2.35× in the paper; §4.6 "Analysis of Pruning Strategies":
    "groups trajectories by advantage and randomly retains one trajectory per group without Jaccard pruning"),
    equal to `fastrl_paper` with tau = 1 up to ties (Table 7 row 1.0). Per prompt group, bucket rollouts by
    advantage rounded to `decimals` (4, as `fastrl_official`) and keep one uniformly random rollout per bucket
    (from `generator`). keep_ratio / min_keep are unused (the rule has no budget).

    A = 0 buckets: KEPT by default (`keep_zero_advantage=True`), because the paper partitions by every unique
    advantage value (Eq. 6, Alg. 1 lines 15–24, "|S'_k(q)| >= 1 guaranteed") with no exception for zero and the
    authors' code keeps a zero bucket's representative too — so an all-equal group keeps one rollout (it carries
    only the KL term's gradient). `keep_zero_advantage=False` drops those buckets (the free pruning of
    docs/notes.md §1).
    Score: 1 / bucket size (the inclusion probability). Pruned: REDUNDANT (same advantage as the kept one)."""
    if decimals < 0:
        raise ValueError(f"advantage_only: decimals must be >= 0, got {decimals}")
    bucket = advantage_buckets(groups, batch.advantages, decimals)  # (N,)
    # one kept per bucket: its member in the smallest (random) slot
    order = torch.argsort(bucket * groups.index.shape[1] + groups.slot)
    first = torch.ones_like(order, dtype=torch.bool)
    first[1:] = bucket[order][1:] != bucket[order][:-1]
    keep = torch.zeros_like(first)
    keep[order[first]] = True
    if not keep_zero_advantage:
        keep &= torch.round(batch.advantages.double() * 10**decimals) != 0
    size = torch.bincount(bucket)[bucket]
    reasons = torch.full((keep.numel(),), int(Reason.REDUNDANT), dtype=torch.long)
    return flat_result(keep, (1.0 / size.double()).float(), reasons)


def ngram_ids(token_ids: tuple[Tensor, ...], n: int) -> tuple[Tensor, ...]:
    """Each completion's n-grams as integer ids (equal n-grams, equal ids, across the batch); a completion shorter
    than n has none. token_ids: N 1-D tensors -> N 1-D long tensors (length max(0, len − n + 1)).
    Vectorised: all windows stacked, ids from one `torch.unique` of their base-V keys (of the rows if V^n
    overflows int64)."""
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    if n == 1:
        return tuple(t.reshape(-1).long() for t in token_ids)
    windows = [t.reshape(-1).long().unfold(0, n, 1) if t.numel() >= n else torch.zeros(0, n, dtype=torch.long)
               for t in token_ids]
    counts = [w.shape[0] for w in windows]
    if not sum(counts):
        return tuple(torch.zeros(0, dtype=torch.long) for _ in token_ids)
    stacked = torch.cat(windows)  # (W, n)
    vocab = int(stacked.max()) + 1 if int(stacked.min()) >= 0 else 0
    if 0 < vocab and vocab**n < 2**62:  # one integer key per n-gram: a 1-D unique, ~10× faster than dim=0
        key = (stacked * vocab ** torch.arange(n - 1, -1, -1)).sum(1)
        ids = torch.unique(key, return_inverse=True)[1]
    else:
        ids = torch.unique(stacked, dim=0, return_inverse=True)[1]
    return tuple(torch.split(ids, counts))


def fastrl_paper(batch: GroupBatch, groups: Groups, *, keep_ratio: float, min_keep: int,
                 generator: torch.Generator | None, tau: float = 0.8, ngram: int = 2, decimals: int = 4,
                 minibatch_size: int | None = None) -> PruneResult:
    """Maximizing Differential Advantage Pruning AS WRITTEN in the paper (arXiv 2609.36932, §3.2 Eqs. 6–9 and
    App. B.1 Alg. 1 lines 14–30); `fastrl_official` is the authors' code. keep_ratio / min_keep are unused.

    1. Per prompt group, bucket rollouts by advantage (Eq. 6), rounded to `decimals` (4) as in the authors' code.
    2. Distance θ_ij = 1 − |N_n(o_i) ∩ N_n(o_j)| / |N_n(o_i) ∪ N_n(o_j)| (Eq. 7), N_n = the set of distinct
       token n-grams of a completion (two empty sets: θ = 0).
    3. Traverse each bucket by |A| descending (Alg. 1 line 19; ties — all of a bucket after rounding — in the
       layout's random slot order from `generator`) and keep o_i unless SOME already kept o_j of its bucket has
       θ_ij < tau (Eq. 8, Alg. 1 line 20): a greedy maximal independent set. The first of a bucket is always
       kept, so every bucket — A = 0 included — keeps >= 1 (Alg. 1 line 24).
    4. `minibatch_size` (Alg. 1 lines 28–30, "d: divisor for DP alignment"): top the batch up to a multiple of it
       with the highest-|A| dropped rollouts, round-robin over groups (as `fastrl_official`).

    Where this differs from the authors' code (docs/notes.md §1, §6): the code compares UNIGRAM token sets, and only
    to the bucket's representative (the seed), keeping o_i if Jaccard < 0.2; the paper compares n-gram sets with
    EVERY kept rollout, pruning if θ < tau = 0.8 (§4.1), i.e. keeping o_i only if its Jaccard similarity to each
    kept one is <= 0.2. The paper never states n (Eq. 7 and Alg. 1 write N_n): `ngram=2` (bigrams) is our
    choice, the smallest n for which "n-gram" differs from the code's token sets; `ngram=1` gives the code's
    sets under the paper's every-kept rule. tau = 1 keeps one rollout per advantage value unless some are
    n-gram-disjoint (the paper's Table 7 row 1.0).

    Vectorised over buckets: all within-bucket pair distances in one `token_jaccard_pairs` call on n-gram ids,
    then one pass over bucket positions (at most the largest bucket's size, ~8–16) for all buckets at once.
    Score: distance θ to the nearest kept rollout before it in its bucket (1 for a bucket's first).
    Pruned: REDUNDANT. Needs `batch.token_ids`."""
    if batch.token_ids is None:
        raise ValueError("pruner 'fastrl_paper' compares completions' n-grams: GroupBatch.token_ids is None")
    if not 0 <= tau <= 1 or decimals < 0:
        raise ValueError(f"fastrl_paper: need 0 <= tau <= 1 and decimals >= 0, got tau={tau}, decimals={decimals}")
    if minibatch_size is not None and minibatch_size < 1:
        raise ValueError(f"fastrl_paper: minibatch_size must be >= 1, got {minibatch_size}")
    n = batch.advantages.numel()
    magnitude = batch.advantages.double().abs()
    bucket = advantage_buckets(groups, batch.advantages, decimals)
    order = bucket_order(groups, magnitude, bucket)  # bucket layout (B, L) in this order
    sizes = torch.bincount(bucket)
    starts = torch.cumsum(sizes, 0) - sizes
    position = torch.arange(n) - starts[bucket[order]]
    index = torch.zeros(sizes.numel(), int(sizes.max()), dtype=torch.long)
    index[bucket[order], position] = order
    valid = torch.zeros(index.shape, dtype=torch.bool)
    valid[bucket[order], position] = True
    pair_valid = valid[:, :, None] & valid[:, None, :]  # (B, L, L)
    first, second = index[:, :, None].expand(pair_valid.shape)[pair_valid], index[:, None, :].expand(
        pair_valid.shape)[pair_valid]
    distance = torch.ones(pair_valid.shape, dtype=torch.float64)
    distance[pair_valid] = 1.0 - token_jaccard_pairs(ngram_ids(batch.token_ids, ngram), first, second)
    keep_padded = torch.zeros(index.shape, dtype=torch.bool)
    nearest = torch.ones(index.shape, dtype=torch.float64)  # distance to the nearest earlier kept rollout
    for t in range(index.shape[1]):
        to_kept = torch.where(keep_padded[:, :t], distance[:, t, :t], math.inf)  # (B, t)
        nearest[:, t] = to_kept.amin(1).clamp(max=1.0) if t else 1.0
        keep_padded[:, t] = valid[:, t] & ~(to_kept < tau).any(1)
    keep = torch.zeros(n, dtype=torch.bool)
    keep[index[valid]] = keep_padded[valid]
    scores = torch.ones(n, dtype=torch.float64)
    scores[index[valid]] = nearest[valid]
    if minibatch_size is not None:
        keep = top_up_round_robin(keep, magnitude, groups, minibatch_size)
    return flat_result(keep, scores.float(), torch.full((n,), int(Reason.REDUNDANT), dtype=torch.long))


def top_up_round_robin(keep: Tensor, magnitude: Tensor, groups: Groups, minibatch_size: int) -> Tensor:
    """keep (N,) topped up to the next multiple of minibatch_size (at most N) with dropped rollouts: rounds over
    groups in ascending id order, each round taking each group's highest-|A| remaining dropped rollout (the
    authors' padding, Alg. 1 lines 28–30; the same rule as `fastrl_official` step 3)."""
    n = keep.numel()
    target = min(n, -(-int(keep.sum()) // minibatch_size) * minibatch_size)
    need = target - int(keep.sum())
    if need <= 0:
        return keep
    dropped = groups.pad(torch.where(keep, -math.inf, magnitude), -math.inf)  # (G, M)
    num_groups = dropped.shape[0]
    round_key = rank_descending(dropped) * num_groups + torch.arange(num_groups)[:, None]  # (round, group)
    round_key = torch.where(torch.isfinite(dropped), round_key, torch.iinfo(torch.long).max)
    cutoff = torch.sort(round_key.reshape(-1)).values[need - 1]
    return keep | groups.unpad(round_key <= cutoff)

