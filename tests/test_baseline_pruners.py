"""The paper's baseline pruners (random, advantage_only) and its rule as written (fastrl_paper): hand-computed
cases, plain-loop references, determinism by generator, invariants over random groups of unequal sizes."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.groups import GroupBatch, Reason, group_layout, keep_counts
from fastrl_core.algo.paper_pruners import ngram_ids
from fastrl_core.algo.pruners import PRUNERS, prune

BASELINES = ["random", "advantage_only", "fastrl_paper"]


def make_batch(group_ids, advantages, token_ids=None, rewards=None) -> GroupBatch:
    advantages = torch.tensor(advantages, dtype=torch.float32)
    rewards = advantages.clone() if rewards is None else torch.tensor(rewards, dtype=torch.float32)
    tokens = None if token_ids is None else tuple(torch.tensor(t, dtype=torch.long) for t in token_ids)
    return GroupBatch(torch.tensor(group_ids), rewards, advantages, None, tokens)


@st.composite
def batches(draw, max_groups=5, max_size=9):
    """Shuffled groups of unequal sizes with arbitrary ids, advantages from a few levels (shared values, zeros),
    short completions over a small vocabulary (duplicates, overlaps, empty ones)."""
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=max_groups))
    ids = draw(st.lists(st.integers(-10**6, 10**6), min_size=len(sizes), max_size=len(sizes), unique=True))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = sum(sizes)
    group_ids = torch.tensor(ids).repeat_interleave(torch.tensor(sizes))[torch.randperm(n, generator=gen)]
    levels = torch.tensor([-1.2, -0.4, 0.0, 0.0, 0.4, 1.2])
    advantages = levels[torch.randint(0, len(levels), (n,), generator=gen)]
    advantages = advantages + torch.randint(0, 2, (n,), generator=gen) * 1e-6  # equal after rounding to 4 dp
    vocab = draw(st.integers(2, 8))
    tokens = tuple(torch.randint(0, vocab, (int(torch.randint(0, 6, (), generator=gen)),), generator=gen)
                   for _ in range(n))
    return GroupBatch(group_ids, advantages.clone(), advantages, None, tokens)


def bucket_key(batch, i, decimals=4):
    return int(batch.group_ids[i]), round(float(batch.advantages[i].double()) * 10**decimals)


def loop_fastrl_paper(batch, seed, tau=0.8, ngram=2, decimals=4):
    """Alg. 1 lines 14–26 with Python sets: per bucket by |A| descending then slot, keep unless some kept one is
    closer than tau."""
    slot = group_layout(batch.group_ids, torch.Generator().manual_seed(seed)).slot.tolist()
    grams = [{tuple(t[k:k + ngram].tolist()) for k in range(t.numel() - ngram + 1)} for t in batch.token_ids]
    buckets = {}
    for i in range(batch.group_ids.numel()):
        buckets.setdefault(bucket_key(batch, i, decimals), []).append(i)
    keep = [False] * batch.group_ids.numel()
    for members in buckets.values():
        members.sort(key=lambda i: (-abs(float(batch.advantages[i].double())), slot[i]))
        kept = []
        for i in members:
            distances = [1 - (len(grams[i] & grams[j]) / len(grams[i] | grams[j]) if grams[i] | grams[j] else 1.0)
                         for j in kept]
            if not any(d < tau for d in distances):
                kept.append(i)
                keep[i] = True
    return keep


# ----------------------------------------------------------------------------------------------- hand-computed


def test_random_keeps_the_first_m_random_slots_per_group():
    """Group 7 (4 rollouts), keep_ratio 0.5 -> m = 2; group 3 (3 rollouts) -> m = ceil(1.5) = 2; group 9 (1) -> 1.
    Scores are the inclusion probabilities 2/4, 2/3, 1/1."""
    batch = make_batch([7, 7, 7, 7, 3, 3, 3, 9], [1, -1, 1, -1, 0.5, 0.5, -1, 0])
    result = prune("random", batch, keep_ratio=0.5, min_keep=1, generator=torch.Generator().manual_seed(4))
    layout = group_layout(batch.group_ids, torch.Generator().manual_seed(4))
    assert result.keep_mask.tolist() == (layout.slot < torch.tensor([2, 2, 2, 2, 2, 2, 2, 1])).tolist()
    assert [int(result.keep_mask[batch.group_ids == g].sum()) for g in (7, 3, 9)] == [2, 2, 1]
    assert result.scores.tolist() == pytest.approx([0.5] * 4 + [2 / 3] * 3 + [1.0])
    assert set(result.reasons[~result.keep_mask].tolist()) == {int(Reason.NOT_SAMPLED)}
    assert result.weights.tolist() == result.keep_mask.float().tolist()


def test_random_inclusion_is_uniform():
    """Over 600 seeds each of 5 rollouts of a group is kept with frequency near m / n = 3 / 5 (binomial sd 0.02)."""
    batch = make_batch([0] * 5, [1, 1, -1, -1, 0])
    freq = torch.stack([prune("random", batch, keep_ratio=0.5, min_keep=1,
                              generator=torch.Generator().manual_seed(s)).keep_mask.double() for s in range(600)])
    assert (freq.sum(1) == 3).all()
    assert torch.allclose(freq.mean(0), torch.full((5,), 0.6, dtype=torch.float64), atol=0.07)


def test_advantage_only_keeps_one_per_distinct_rounded_advantage():
    """Group 0: advantages 1, 1.00001 (the same at 4 decimals), -1, -1, 0 -> buckets {1: 2}, {-1: 2}, {0: 1}: keeps 3.
    Group 5: all 0 (an all-equal group) -> 1 bucket, keeps 1 by default, 0 with keep_zero_advantage=False."""
    batch = make_batch([0, 0, 0, 0, 0, 5, 5, 5], [1, 1.00001, -1, -1, 0, 0, 0, 0])
    result = prune("advantage_only", batch, generator=torch.Generator().manual_seed(1))
    kept = result.keep_mask
    assert int(kept[:2].sum()) == 1 and int(kept[2:4].sum()) == 1 and bool(kept[4]) and int(kept[5:].sum()) == 1
    assert result.scores.tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5, 1.0, 1 / 3, 1 / 3, 1 / 3])
    assert set(result.reasons[~kept].tolist()) == {int(Reason.REDUNDANT)}
    no_zero = prune("advantage_only", batch, generator=torch.Generator().manual_seed(1), keep_zero_advantage=False)
    assert no_zero.keep_mask.tolist() == (kept & (batch.advantages != 0)).tolist()
    assert not no_zero.keep_mask[5:].any()


def test_fastrl_paper_compares_with_every_kept_rollout_not_only_the_seed():
    """One bucket (|A| = 1.00002 > 1.00001 > 1.0, the same at 4 decimals, so the order is fixed):
    s = 1 2 3 4 5, x = 6 7 8 9 10, y = 6 7 8 9 11.
    Unigram sets: J(s, x) = J(s, y) = 0, J(x, y) = 4/6, so θ(x, y) = 1/3 < 0.8.
    The authors' rule (vs the seed only) keeps all three; the paper's (vs every kept one) prunes y.
    Bigrams: x and y share (6,7), (7,8), (8,9) of 5 distinct bigrams: θ = 1 − 3/5 = 0.4 < 0.8: y pruned too; with
    tau = 0.3 it is kept (0.4 >= 0.3)."""
    tokens = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [6, 7, 8, 9, 11]]
    batch = make_batch([0, 0, 0], [1.00002, 1.00001, 1.0], tokens)
    official = prune("fastrl_official", batch)
    assert official.keep_mask.tolist() == [True, True, True]
    for ngram in (1, 2):
        paper = prune("fastrl_paper", batch, ngram=ngram)
        assert paper.keep_mask.tolist() == [True, True, False]
    assert prune("fastrl_paper", batch, ngram=2).scores.tolist() == pytest.approx([1.0, 1.0, 0.4])
    assert prune("fastrl_paper", batch, ngram=2, tau=0.3).keep_mask.tolist() == [True, True, True]


def test_fastrl_paper_threshold_direction_and_buckets():
    """θ < tau prunes (Eq. 8): θ = 0.8 exactly is kept at tau = 0.8 (Jaccard 0.2: 1 shared of 5 distinct unigrams),
    θ = 0 (a duplicate) is pruned. Different advantages never prune each other (different buckets). tau = 0
    keeps everything."""
    tokens = [[1, 2, 3], [3, 4, 5], [1, 2, 3], [1, 2, 3]]
    batch = make_batch([0, 0, 0, 0], [1.0, 0.99999, 1.0, -1.0], tokens)  # 0.99999 rounds to 1.0000
    result = prune("fastrl_paper", batch, ngram=1, generator=torch.Generator().manual_seed(0))
    # bucket A=1 holds rollouts 0, 1, 2 (|A| 1, 1, 0.99999 -> 0 and 2 tie, 1 last); bucket A=-1 holds 3
    assert bool(result.keep_mask[3])
    assert int(result.keep_mask[[0, 2]].sum()) == 1  # duplicates: one of them
    assert bool(result.keep_mask[1])  # θ = 1 − 1/5 = 0.8, not < 0.8
    assert prune("fastrl_paper", batch, ngram=1, tau=0.0).keep_mask.all()


def test_fastrl_paper_empty_and_short_completions():
    """Completions shorter than n have no n-grams; two empty sets are identical (θ = 0): one of them is kept."""
    batch = make_batch([0, 0, 0], [0.5, 0.5, 0.5], [[4], [], [5]])
    assert int(prune("fastrl_paper", batch, ngram=2).keep_mask.sum()) == 1  # three empty bigram sets
    assert prune("fastrl_paper", batch, ngram=1).keep_mask.all()  # {4}, {}, {5}: θ = 1 for every pair


def test_ngram_ids_are_shared_across_completions():
    ids = ngram_ids((torch.tensor([1, 2, 3]), torch.tensor([2, 3]), torch.tensor([9])), 2)
    assert [t.numel() for t in ids] == [2, 1, 0]
    assert int(ids[0][1]) == int(ids[1][0])  # (2, 3) in both
    assert int(ids[0][0]) != int(ids[0][1])
    with pytest.raises(ValueError, match="n-gram size must be >= 1"):
        ngram_ids((torch.tensor([1]),), 0)
    # keys that overflow int64 (vocab^n >= 2^62) fall back to row-wise unique: the same partition of n-grams
    small = (torch.tensor([1, 2, 3, 1, 2, 3]), torch.tensor([2, 3, 1, 2]))
    big = tuple(t * 10**6 for t in small)
    for a, b in zip(ngram_ids(small, 4), ngram_ids(big, 4)):
        assert torch.equal(a, b)


def test_fastrl_paper_minibatch_top_up():
    """Two groups of three duplicates: the rule keeps 1 per group; minibatch 4 -> 4 kept, the 2 extra ones one
    per group (round-robin), all from the dropped rollouts."""
    tokens = [[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [3, 4]]
    batch = make_batch([0, 0, 0, 1, 1, 1], [1.0, 1.0, 1.0, -0.5, -0.5, -0.5], tokens)
    base = prune("fastrl_paper", batch, generator=torch.Generator().manual_seed(2))
    assert base.keep_mask.tolist().count(True) == 2
    topped = prune("fastrl_paper", batch, generator=torch.Generator().manual_seed(2), minibatch_size=4)
    assert int(topped.keep_mask.sum()) == 4 and (topped.keep_mask >= base.keep_mask).all()
    assert int(topped.keep_mask[:3].sum()) == 2 and int(topped.keep_mask[3:].sum()) == 2


def test_bad_input_names_the_problem():
    batch = make_batch([0, 0], [1.0, -1.0])
    with pytest.raises(ValueError, match="'fastrl_paper' compares completions' n-grams"):
        prune("fastrl_paper", batch)
    batch = make_batch([0, 0], [1.0, -1.0], [[1], [2]])
    with pytest.raises(ValueError, match="0 <= tau <= 1"):
        prune("fastrl_paper", batch, tau=1.5)
    with pytest.raises(ValueError, match="minibatch_size must be >= 1"):
        prune("fastrl_paper", batch, minibatch_size=0)
    with pytest.raises(ValueError, match="decimals must be >= 0"):
        prune("advantage_only", batch, decimals=-1)
    with pytest.raises(TypeError, match="pruner 'random'.*unexpected keyword argument 'tau'"):
        prune("random", batch, tau=0.5)


def test_registered():
    assert set(BASELINES) <= set(PRUNERS.names())


# ----------------------------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(batch=batches(), seed=st.integers(0, 1000), tau=st.sampled_from([0.0, 0.3, 0.8, 1.0]),
       ngram=st.integers(1, 3))
def test_fastrl_paper_equals_the_loop_reference(batch, seed, tau, ngram):
    result = prune("fastrl_paper", batch, generator=torch.Generator().manual_seed(seed), tau=tau, ngram=ngram)
    assert result.keep_mask.tolist() == loop_fastrl_paper(batch, seed, tau, ngram)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), seed=st.integers(0, 1000), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4))
def test_random_and_advantage_only_equal_loop_references(batch, seed, keep_ratio, min_keep):
    slot = group_layout(batch.group_ids, torch.Generator().manual_seed(seed)).slot.tolist()
    generator = torch.Generator().manual_seed(seed)
    random_keep = prune("random", batch, keep_ratio=keep_ratio, min_keep=min_keep, generator=generator).keep_mask
    for g in batch.group_ids.unique().tolist():
        members = (batch.group_ids == g).nonzero().flatten().tolist()
        m = int(keep_counts(torch.tensor([len(members)]), keep_ratio, min_keep))
        assert [bool(random_keep[i]) for i in members] == [slot[i] < m for i in members]
    kept = prune("advantage_only", batch, generator=torch.Generator().manual_seed(seed)).keep_mask
    buckets = {}
    for i in range(batch.group_ids.numel()):
        buckets.setdefault(bucket_key(batch, i), []).append(i)
    expected = [False] * batch.group_ids.numel()
    for members in buckets.values():
        expected[min(members, key=lambda i: slot[i])] = True
    assert kept.tolist() == expected


@settings(max_examples=60, deadline=None)
@given(batch=batches(), name=st.sampled_from(BASELINES), seed=st.integers(0, 1000),
       keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4))
def test_consistent_deterministic_and_never_empty(batch, name, seed, keep_ratio, min_keep):
    run = lambda s: prune(name, batch, keep_ratio=keep_ratio, min_keep=min_keep,  # noqa: E731
                          generator=torch.Generator().manual_seed(s))
    result = run(seed)
    n = batch.group_ids.numel()
    assert result.keep_mask.shape == result.scores.shape == result.reasons.shape == result.weights.shape == (n,)
    assert torch.isfinite(result.scores).all() and (result.scores >= 0).all() and (result.scores <= 1).all()
    assert ((result.reasons == Reason.KEPT) == result.keep_mask).all()
    assert (result.weights == result.keep_mask.float()).all()
    assert torch.equal(run(seed).keep_mask, result.keep_mask)  # same generator seed, same decisions
    for g in batch.group_ids.unique():
        assert result.keep_mask[batch.group_ids == g].any()  # no group is emptied
    if name != "random":  # every advantage bucket keeps >= 1, and advantage_only exactly 1
        buckets = {}
        for i in range(n):
            buckets.setdefault(bucket_key(batch, i), []).append(bool(result.keep_mask[i]))
        assert all(any(kept) for kept in buckets.values())
        if name == "advantage_only":
            assert all(sum(kept) == 1 for kept in buckets.values())


@settings(max_examples=40, deadline=None)
@given(batch=batches(), seed=st.integers(0, 1000), tau=st.sampled_from([0.3, 0.8, 1.0]))
def test_fastrl_paper_kept_set_is_independent_and_maximal(batch, seed, tau):
    """Eq. 8: kept rollouts of a bucket are pairwise at distance >= tau; every pruned one is closer than tau to
    some kept one (greedy maximality). Its kept set contains at least one per bucket, so never fewer than
    advantage_only's."""
    result = prune("fastrl_paper", batch, generator=torch.Generator().manual_seed(seed), tau=tau, ngram=1)
    sets = [set(t.tolist()) for t in batch.token_ids]

    def distance(i, j):
        union = sets[i] | sets[j]
        return 1 - len(sets[i] & sets[j]) / len(union) if union else 0.0

    keep = result.keep_mask.tolist()
    for i in range(len(keep)):
        same = [j for j in range(len(keep)) if j != i and bucket_key(batch, j) == bucket_key(batch, i)]
        if keep[i]:
            assert all(distance(i, j) >= tau for j in same if keep[j])
        else:
            assert any(distance(i, j) < tau for j in same if keep[j])
    only = prune("advantage_only", batch, generator=torch.Generator().manual_seed(seed)).keep_mask
    assert int(result.keep_mask.sum()) >= int(only.sum())
    assert not math.isnan(float(result.scores.sum()))
