"""Pruners: hand-computed cases, loop references, and properties over random groups of unequal sizes."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.advantages import compute_advantages
from fastrl_core.algo.groups import GroupBatch, Reason, keep_counts
from fastrl_core.algo.pruners import CostRuleError, PRUNERS, check_cost_rule, prune

NAMES = ["none", "dapo_filter", "cppo", "pods", "fastrl_official", "fastrl"]
# every pruner with its default options, and fastrl with a cost rule
VARIANTS = [(name, {}) for name in NAMES] + [("fastrl", {"row_cost": 0.05})]


def batch_of(group_ids, rewards, advantages=None, sketches=None, token_ids=None) -> GroupBatch:
    group_ids = torch.as_tensor(group_ids)
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if advantages is None:
        advantages = compute_advantages("group_normalized", rewards, group_ids)
    advantages = torch.as_tensor(advantages, dtype=torch.float32)
    if sketches is not None:
        sketches = torch.as_tensor(sketches, dtype=torch.float32)
    if token_ids is not None:
        token_ids = tuple(torch.tensor(t, dtype=torch.long) for t in token_ids)
    return GroupBatch(group_ids, rewards, advantages, sketches, token_ids)


@st.composite
def batches(draw, max_groups=5, max_size=8, dim=None, continuous=False):
    """Shuffled groups of unequal sizes with arbitrary ids; rewards from a few levels (ties, all-equal groups) or
    continuous; advantages from an estimator or random with exact zeros; sketches with duplicates and zero rows."""
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=max_groups))
    ids = draw(st.lists(st.integers(-10**6, 10**6), min_size=len(sizes), max_size=len(sizes), unique=True))
    levels = None if continuous else draw(st.sampled_from([(0.0, 1.0), (0.0, 0.5, 1.0, 1.5), None]))
    kind = "random" if continuous else draw(st.sampled_from(["group_normalized", "mean_only", "random"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = sum(sizes)
    group_ids = torch.tensor(ids).repeat_interleave(torch.tensor(sizes))[torch.randperm(n, generator=gen)]
    if levels is None:
        rewards = torch.rand(n, generator=gen)
    else:
        rewards = torch.tensor(levels)[torch.randint(0, len(levels), (n,), generator=gen)]
    if kind == "random":
        advantages = torch.randn(n, generator=gen)
        if not continuous:
            advantages = torch.where(torch.rand(n, generator=gen) < 0.3, 0.0, advantages)
    else:
        advantages = compute_advantages(kind, rewards, group_ids)
    dim = dim or draw(st.integers(1, 6))
    sketches = torch.randn(n, dim, generator=gen)
    if not continuous:
        copies = torch.randint(0, n, (n,), generator=gen)
        duplicate = torch.rand(n, generator=gen) < 0.2
        sketches = torch.where(duplicate[:, None], sketches[copies], sketches)
        sketches = torch.where((torch.rand(n, generator=gen) < 0.1)[:, None], 0.0, sketches)
    token_ids = tuple(torch.randint(0, 12, (int(torch.randint(0, 7, ())),), generator=gen) for _ in range(n))
    return GroupBatch(group_ids, rewards, advantages, sketches, token_ids)


def group_counts(batch: GroupBatch, mask: torch.Tensor) -> dict[int, int]:
    return {int(g): int(mask[batch.group_ids == g].sum()) for g in batch.group_ids.unique()}


# ----------------------------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(batch=batches(), variant=st.sampled_from(VARIANTS), keep_ratio=st.floats(0.05, 1.0),
       min_keep=st.integers(1, 4), seed=st.integers(0, 1000))
def test_every_pruner_returns_consistent_decisions(batch, variant, keep_ratio, min_keep, seed):
    name, options = variant
    result = prune(name, batch, keep_ratio=keep_ratio, min_keep=min_keep, generator=torch.Generator().manual_seed(seed),
                   **options)
    n = batch.group_ids.numel()
    assert result.keep_mask.shape == result.scores.shape == result.reasons.shape == result.weights.shape == (n,)
    assert result.keep_mask.dtype == torch.bool and result.reasons.dtype == torch.long
    assert torch.isfinite(result.scores).all() and torch.isfinite(result.weights).all()
    assert (result.weights[~result.keep_mask] == 0).all()  # exactly 0 where pruned
    assert (result.weights[result.keep_mask] > 0).all()
    assert ((result.reasons == Reason.KEPT) == result.keep_mask).all()
    assert set(result.reasons.tolist()) <= {int(r) for r in Reason}
    again = prune(name, batch, keep_ratio=keep_ratio, min_keep=min_keep, generator=torch.Generator().manual_seed(seed),
                  **options)
    for field in ("keep_mask", "scores", "reasons", "weights"):  # same seed -> same decisions
        assert torch.equal(getattr(result, field), getattr(again, field)), field


@settings(max_examples=60, deadline=None)
@given(batch=batches(), variant=st.sampled_from(VARIANTS), keep_ratio=st.floats(0.05, 1.0),
       min_keep=st.integers(1, 4))
def test_group_floors(batch, variant, keep_ratio, min_keep):
    """The per-pruner floor of the module table: how far a group may be emptied."""
    name, options = variant
    if options:  # the cost rule lowers fastrl's count (tests/test_costs.py)
        return
    result = prune(name, batch, keep_ratio=keep_ratio, min_keep=min_keep, **options)
    for g, kept in group_counts(batch, result.keep_mask).items():
        in_group = batch.group_ids == g
        size = int(in_group.sum())
        nonzero = int((batch.advantages[in_group].abs() > 1e-6).sum())
        rewards = batch.rewards[in_group]
        if name == "none":
            assert kept == size
        elif name == "dapo_filter":
            assert kept == (size if rewards.max() > rewards.min() else 0)
        elif name in ("cppo", "pods"):
            assert kept == int(keep_counts(torch.tensor([size]), keep_ratio, min_keep))
            assert kept >= min(min_keep, size)
        elif name == "fastrl_official":
            assert kept >= 1
        else:  # fastrl: m of the nonzero-advantage rollouts, >= the signs present; empty only when all advantages are zero
            signs = len(set(torch.sign(batch.advantages[in_group & (batch.advantages.abs() > 1e-6)]).tolist()))
            assert kept == max(signs, int(keep_counts(torch.tensor([nonzero]), keep_ratio, min_keep)))
            assert kept >= min(min_keep, nonzero)
            assert kept > 0 or nonzero == 0


@settings(max_examples=60, deadline=None)
@given(batch=batches(), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4))
def test_fastrl_prunes_every_zero_advantage_rollout(batch, keep_ratio, min_keep):
    result = prune("fastrl", batch, keep_ratio=keep_ratio, min_keep=min_keep, generator=torch.Generator().manual_seed(0))
    zero = batch.advantages.abs() <= 1e-6
    assert not result.keep_mask[zero].any()
    assert (result.reasons[zero] == Reason.ZERO_ADVANTAGE).all()
    assert (result.reasons[~zero] != Reason.ZERO_ADVANTAGE).all()


def naive_coreset_selection(batch: GroupBatch, keep_ratio: float, min_keep: int) -> torch.Tensor:
    """Loop reference for the greedy facility location: per group, add the candidate j maximising
    F(S + j) = Σ_i m_i|A_i| max(0, max_{k ∈ S + j, same sign} sim(i, k)), sim = ||φ_i|| − ||φ_i − φ_k||."""
    keep = torch.zeros(batch.group_ids.numel(), dtype=torch.bool)
    counts = torch.ones(batch.group_ids.numel()) if batch.counts is None else batch.counts
    for g in batch.group_ids.unique():
        members = [i for i in (batch.group_ids == g).nonzero().flatten().tolist()
                   if abs(float(batch.advantages[i])) > 1e-6]
        if not members:
            continue
        a = batch.advantages[members].double()
        omega = counts[members].double() * a.abs()
        phi = batch.sketches[members].double()
        sim = torch.tensor([[float(phi[i].norm() - (phi[i] - phi[k]).norm()) for k in range(len(members))]
                            for i in range(len(members))])
        n_pos, n_neg = int((a > 0).sum()), int((a < 0).sum())
        m = min(len(members), max(min_keep, math.ceil(keep_ratio * len(members) - 1e-9)))
        m = max(m, (n_pos > 0) + (n_neg > 0))
        limit = {True: n_pos, False: n_neg}

        def value(subset):
            total = 0.0
            for i in range(len(members)):
                same = [k for k in subset if bool(a[k] > 0) == bool(a[i] > 0)]
                total += float(omega[i]) * max([0.0] + [float(sim[i, k]) for k in same])
            return total

        chosen: list[int] = []
        while len(chosen) < m:
            options = [j for j in range(len(members)) if j not in chosen
                       and sum(bool(a[c] > 0) == bool(a[j] > 0) for c in chosen) < limit[bool(a[j] > 0)]]
            chosen.append(max(options, key=lambda j: value(chosen + [j])))
        keep[[members[c] for c in chosen]] = True
    return keep


@settings(max_examples=25, deadline=None)
@given(batch=batches(dim=10, continuous=True), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4),
       with_counts=st.booleans())
def test_fastrl_coreset_matches_loop_reference(batch, keep_ratio, min_keep, with_counts):
    """Generic sketches and distinct advantages (no ties); optionally random multiplicities."""
    if with_counts:
        counts = 1.0 + torch.arange(batch.group_ids.numel()).remainder(3).float()
        batch = GroupBatch(batch.group_ids, batch.rewards, batch.advantages, batch.sketches, counts=counts)
    result = prune("fastrl", batch, keep_ratio=keep_ratio, min_keep=min_keep)
    assert torch.equal(result.keep_mask, naive_coreset_selection(batch, keep_ratio, min_keep))


@settings(max_examples=30, deadline=None)
@given(batch=batches(), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4), with_counts=st.booleans())
def test_fastrl_coreset_weights_carry_each_signs_mass(batch, keep_ratio, min_keep, with_counts):
    """Per sign of a group, the weighted kept mass Σ_kept m_j w_j |A_j| lies between (K / N)·(the kept rows' own
    mass) and (K / N)·(the sign's whole mass Σ_i m_i|A_i|): a kept row carries itself plus the rows it stands for
    (those of its sign with similarity > 0 to it), K / N the kept share of the batch. With identical sketches in
    a sign (every similarity > 0) the whole mass is carried, so a zero-sum group stays zero-sum."""
    counts = (1.0 + torch.arange(batch.group_ids.numel()).remainder(3).float()) if with_counts else None
    batch = GroupBatch(batch.group_ids, batch.rewards, batch.advantages, batch.sketches, counts=counts)
    result = prune("fastrl", batch, keep_ratio=keep_ratio, min_keep=min_keep)
    m = torch.ones(batch.group_ids.numel()) if counts is None else counts
    share = float((m * result.keep_mask).sum() / m.sum())
    mass = m * batch.advantages.abs()
    nonzero = batch.advantages.abs() > 1e-6
    for g in batch.group_ids.unique():
        for sign in (batch.advantages > 0, batch.advantages < 0):
            rows = (batch.group_ids == g) & sign & nonzero
            kept = rows & result.keep_mask
            carried = float((result.weights * mass)[kept].sum())
            assert share * float(mass[kept].sum()) * (1 - 1e-5) - 1e-6 <= carried
            assert carried <= share * float(mass[rows].sum()) * (1 + 1e-5) + 1e-6
    same = GroupBatch(batch.group_ids, batch.rewards, batch.advantages, torch.ones_like(batch.sketches), counts=counts)
    result = prune("fastrl", same, keep_ratio=keep_ratio, min_keep=min_keep)
    share = float((m * result.keep_mask).sum() / m.sum())
    for g in batch.group_ids.unique():
        rows = (batch.group_ids == g) & nonzero
        kept = float((m * result.weights * batch.advantages)[rows & result.keep_mask].sum())
        assert kept == pytest.approx(share * float((m * batch.advantages)[rows].sum()), rel=1e-4, abs=1e-5)


def test_fastrl_coreset_hand_computed():
    """Positives r0, r1, r2 identical (sketch e1, A = 1), r3 (e2, A = 1); negatives r4, r5 identical (e3, A = −2).
    m = 3 of 6 (no sign caps; with them 2 / 2, the same here). Gains: r4 covers r4, r5: 4; r0 covers r0-r2: 3;
    r3: 1. Picks r4 (or its copy r5), one of r0-r2, then r3 (gain 1 > 0 for the other negative). Represented
    mass γ: 3, 1, 4 -> weights γ / (m|A|) = 3, 1, 2, times K / N = 3 / 6. Scores: gain / the sign's mass 4: 3/4 and 1/4 for the positives, 4/4 for the
    negative; the unpicked copies are covered (gain 0, REDUNDANT)."""
    sketches = [[1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1]]
    batch = batch_of([0] * 6, [0] * 6, advantages=[1.0, 1.0, 1.0, 1.0, -2.0, -2.0], sketches=sketches)
    result = prune("fastrl", batch, keep_ratio=0.5, min_keep=2, generator=torch.Generator().manual_seed(0))
    keep = result.keep_mask
    assert int(keep[:3].sum()) == 1 and keep[3] and int(keep[4:].sum()) == 1
    assert result.weights[keep].tolist() == pytest.approx(
        [1.5 if i < 3 else 0.5 if i == 3 else 1.0 for i in keep.nonzero().flatten().tolist()])
    expected_scores = {0: 0.75, 3: 0.25, 4: 1.0}
    for i in keep.nonzero().flatten().tolist():
        assert float(result.scores[i]) == pytest.approx(expected_scores[min(i, 4) if i != 3 else 3])
    assert (result.reasons[~keep] == Reason.REDUNDANT).all() and (result.scores[~keep] == 0).all()
    # the same rollouts merged (multiplicities 3, 1, 2), all three kept, give the same update direction Σ m w A φ
    merged = GroupBatch(torch.zeros(3, dtype=torch.long), torch.zeros(3), torch.tensor([1.0, 1.0, -2.0]),
                        torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]), counts=torch.tensor([3.0, 1.0, 2.0]))
    merged_result = prune("fastrl", merged, keep_ratio=1.0, min_keep=2)
    update = (result.weights * batch.advantages)[:, None] * batch.sketches
    merged_update = (merged.counts * merged_result.weights * merged.advantages)[:, None] * merged.sketches
    # up to the K / N factor: 3 / 6 unmerged (3 rows kept of 6), 6 / 6 merged (3 rows standing for all 6)
    torch.testing.assert_close(merged_update.sum(0), 2 * update.sum(0))


def test_fastrl_option_errors():
    good = batch_of([0, 0], [1.0, 0.0], sketches=[[1.0], [2.0]])
    with pytest.raises(TypeError, match="pruner 'fastrl'.*unexpected keyword argument 'selection'"):
        prune("fastrl", good, selection="dpp")  # retired variants: docs/experiments.md
    with pytest.raises(ValueError, match="zero_atol >= 0"):
        prune("fastrl", good, zero_atol=-1.0)
    with pytest.raises(ValueError, match=r"GroupBatch.counts must be finite and >= 1; not at rows \[1\]"):
        prune("fastrl", GroupBatch(good.group_ids, good.rewards, good.advantages, good.sketches,
                                   counts=torch.tensor([1.0, 0.5])))


@settings(max_examples=40, deadline=None)
@given(batch=batches(), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4))
def test_cppo_keeps_the_largest_advantages(batch, keep_ratio, min_keep):
    result = prune("cppo", batch, keep_ratio=keep_ratio, min_keep=min_keep)
    for g in batch.group_ids.unique():
        in_group = batch.group_ids == g
        kept, dropped = batch.advantages[in_group & result.keep_mask], batch.advantages[in_group & ~result.keep_mask]
        if dropped.numel():
            assert kept.abs().min() >= dropped.abs().max()


def subset_variance(values: torch.Tensor) -> float:
    return float(((values - values.mean()) ** 2).mean())


@settings(max_examples=40, deadline=None)
@given(batch=batches(max_size=9), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4))
def test_pods_subset_has_maximal_reward_variance(batch, keep_ratio, min_keep):
    """Against brute force over every subset of the group's size."""
    result = prune("pods", batch, keep_ratio=keep_ratio, min_keep=min_keep)
    for g in batch.group_ids.unique():
        in_group = batch.group_ids == g
        rewards = batch.rewards[in_group].double()
        m = int(result.keep_mask[in_group].sum())
        best = max(subset_variance(rewards[list(s)]) for s in itertools.combinations(range(len(rewards)), m))
        assert subset_variance(batch.rewards[in_group & result.keep_mask].double()) == pytest.approx(best, abs=1e-9)


def naive_official(batch: GroupBatch, minibatch_size: int | None) -> torch.Tensor:
    """Loop reference of the authors' rule (docs/notes.md §1); ties by batch index (no generator)."""
    n = batch.group_ids.numel()
    keep = torch.zeros(n, dtype=torch.bool)
    sets = [set(t.tolist()) for t in batch.token_ids]
    for g in sorted(batch.group_ids.unique().tolist()):
        members = [i for i in range(n) if int(batch.group_ids[i]) == g]
        buckets: dict[int, list[int]] = {}
        for i in members:
            buckets.setdefault(round(float(batch.advantages[i]) * 10**4), []).append(i)
        for bucket in buckets.values():
            rep = max(bucket, key=lambda i: (abs(float(batch.advantages[i])), -i))
            keep[rep] = True
            for i in bucket:
                union = len(sets[i] | sets[rep])
                if i != rep and (len(sets[i] & sets[rep]) / union if union else 1.0) < 0.2:
                    keep[i] = True
    if minibatch_size:
        need = min(n, -(-int(keep.sum()) // minibatch_size) * minibatch_size) - int(keep.sum())
        queues = {g: sorted((i for i in range(n) if int(batch.group_ids[i]) == g and not keep[i]),
                            key=lambda i: (-abs(float(batch.advantages[i])), i))
                  for g in sorted(batch.group_ids.unique().tolist())}
        while need > 0:
            for queue in queues.values():
                if queue and need > 0:
                    keep[queue.pop(0)] = True
                    need -= 1
    return keep


@settings(max_examples=60, deadline=None)
@given(batch=batches(), minibatch_size=st.sampled_from([None, 1, 3, 4, 8]))
def test_fastrl_official_matches_loop_reference(batch, minibatch_size):
    # float32 advantages rounded in float64: keep the reference's rounding on exactly the same numbers
    result = prune("fastrl_official", batch, minibatch_size=minibatch_size)
    assert torch.equal(result.keep_mask, naive_official(batch, minibatch_size))


# ----------------------------------------------------------------------------------------------- hand-computed


def test_none_keeps_everything_and_scores_abs_advantage():
    batch = batch_of([3, 3, 7], [1.0, 0.0, 0.5], advantages=[0.7, -0.7, 0.0])
    result = prune("none", batch)
    assert result.keep_mask.all() and (result.weights == 1).all()
    assert result.scores.tolist() == pytest.approx([0.7, 0.7, 0.0])


def test_dapo_filter_drops_all_equal_groups():
    batch = batch_of([0, 0, 0, 5, 5, 9], [1.0, 1.0, 1.0, 0.0, 1.0, 0.3])
    result = prune("dapo_filter", batch)
    assert result.keep_mask.tolist() == [False, False, False, True, True, False]  # size-1 group: all equal
    dropped, kept = Reason.ZERO_VARIANCE_GROUP, Reason.KEPT
    assert result.reasons.tolist() == [dropped] * 3 + [kept] * 2 + [dropped]
    assert result.scores.tolist() == pytest.approx([0, 0, 0, 0.5, 0.5, 0])


def test_pods_worked_example():
    """rewards [0.2, 1.0, 0.5, 0.0, 0.9, 0.6], m = 3. Sorted 0, .2, .5, .6, .9, 1; candidates (i lowest + 3 − i
    highest): i=0 {.6, .9, 1} var .0289; i=1 {0, .9, 1} var .2022; i=2 {0, .2, 1} var .1867; i=3 {0, .2, .5}
    var .0422. Best i = 1: keep rewards 0.0, 0.9, 1.0 = rollouts 3, 4, 1."""
    batch = batch_of([4] * 6, [0.2, 1.0, 0.5, 0.0, 0.9, 0.6])
    result = prune("pods", batch, keep_ratio=0.5, min_keep=2)
    assert result.keep_mask.tolist() == [False, True, False, True, True, False]
    assert result.reasons[~result.keep_mask].tolist() == [Reason.OVER_BUDGET] * 3
    assert result.scores.tolist() == pytest.approx([abs(r - 3.2 / 6) for r in [0.2, 1.0, 0.5, 0.0, 0.9, 0.6]])


def test_cppo_worked_example():
    batch = batch_of([1] * 5, [0] * 5, advantages=[0.1, -2.0, 0.5, 1.5, -0.3])
    result = prune("cppo", batch, keep_ratio=0.4, min_keep=1)  # ceil(0.4 * 5) = 2
    assert result.keep_mask.tolist() == [False, True, False, True, False]
    assert (result.reasons[~result.keep_mask] == Reason.LOW_ADVANTAGE).all()


def test_fastrl_official_worked_example():
    """Group 0, advantage 0.7071 bucket (4 decimals): r1 (|A| 0.70714) is the representative; r0 has Jaccard
    |{1,2,3}| / |{1,2,3,4,5}| = 0.6 to it -> REDUNDANT; r2 shares no token -> kept. Bucket −0.7071: r3
    (|A| 0.70711) is the representative; r4 {1,2,3} vs {1,2}: 2/3 -> REDUNDANT; r5 {20..23,1} vs {1,2}: 1/6 < 0.2
    -> kept. Group 1 (both A = 0): one bucket, r7 repeats r6's tokens -> REDUNDANT. 5 kept."""
    advantages = [0.70711, 0.70714, 0.70712, -0.70711, -0.70709, -0.70710, 0.0, 0.0]
    tokens = [[1, 2, 3, 4], [1, 2, 3, 5], [7, 8, 9, 10], [1, 2], [1, 2, 3], [20, 21, 22, 23, 1], [4, 4, 5], [5, 4]]
    batch = batch_of([0] * 6 + [1] * 2, [0] * 8, advantages=advantages, token_ids=tokens)
    result = prune("fastrl_official", batch)
    assert result.keep_mask.tolist() == [False, True, True, True, False, True, True, False]
    assert result.reasons.tolist() == [Reason.REDUNDANT, 0, 0, 0, Reason.REDUNDANT, 0, 0, Reason.REDUNDANT]
    assert result.scores.tolist() == pytest.approx([0.4, 1, 1, 1, 1 / 3, 5 / 6, 1, 0])
    # minibatch 3: 5 kept -> 6; round 1 takes group 0's best dropped (r0, |A| .70711 > r4's .70709)
    topped = prune("fastrl_official", batch, minibatch_size=3)
    assert topped.keep_mask.tolist() == [True, True, True, True, False, True, True, False]
    # minibatch 4: 5 -> 8; round 1: r0 (group 0), r7 (group 1); round 2: r4
    assert prune("fastrl_official", batch, minibatch_size=4).keep_mask.all()


def test_fastrl_keeps_one_of_a_near_duplicate_pair_and_gives_it_both_masses():
    """Three positive rollouts; r1 is nearly a copy of r0 (cosine 0.999) with a larger |A| than r2. top-|A| keeps
    {r0, r1}; the coreset keeps {r0, r2}: r0 covers r0 and r1 (gain 1 + 0.95·(1 − ||φ1 − φ0||) ≈ 1.91), then r2
    adds 0.9 against r1's 0.95·||φ1 − φ0|| ≈ 0.04. r0 stands for r1: weight (1 + 0.95) / 1, r2 its own 1, both
    times K / N = 2 / 3; r1 is REDUNDANT (r0 removes 96 % of its error bound)."""
    sketches = [[1.0, 0.0, 0.0], [0.999, math.sqrt(1 - 0.999**2), 0.0], [0.0, 0.0, 1.0]]
    batch = batch_of([0, 0, 0], [0, 0, 0], advantages=[1.0, 0.95, 0.9], sketches=sketches)
    assert prune("cppo", batch, keep_ratio=0.5).keep_mask.tolist() == [True, True, False]
    result = prune("fastrl", batch, keep_ratio=0.5)
    assert result.keep_mask.tolist() == [True, False, True]
    assert result.reasons[1] == Reason.REDUNDANT
    assert result.weights.tolist() == pytest.approx([1.95 * 2 / 3, 0.0, 2 / 3])


def test_fastrl_without_sketches_is_top_advantage_mass_with_weights_one():
    """No sketches: no rollout stands for another, so the greedy picks the largest m|A| (m = 3 of 6, no sign
    caps) and each kept row carries its own mass only: weight 1 times K / N = 3 / 6."""
    batch = batch_of([0] * 6, [0] * 6, advantages=[2.0, 1.5, 1.0, 0.5, -0.2, -0.1])
    result = prune("fastrl", batch, keep_ratio=0.5, min_keep=2)
    assert result.keep_mask.tolist() == [True, True, True, False, False, False]
    assert result.weights.tolist() == pytest.approx([0.5, 0.5, 0.5, 0.0, 0.0, 0.0])
    assert (result.reasons[~result.keep_mask] == Reason.LOW_ADVANTAGE).all()


# ----------------------------------------------------------------------------------------------- errors and edges


def test_empty_batch():
    empty = GroupBatch(torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0), torch.zeros(0, 4))
    for name in ["none", "cppo", "fastrl"]:
        assert prune(name, empty).keep_mask.numel() == 0


def test_bad_input_names_the_problem():
    good = batch_of([0, 0], [1.0, 0.0], sketches=[[1.0], [2.0]])
    with pytest.raises(KeyError, match="unknown pruner 'nope'"):
        prune("nope", good)
    with pytest.raises(ValueError, match="keep_ratio"):
        prune("cppo", good, keep_ratio=0.0)
    with pytest.raises(ValueError, match="min_keep"):
        prune("cppo", good, min_keep=0)
    with pytest.raises(ValueError, match=r"GroupBatch.advantages must be \(2,\)"):
        prune("cppo", GroupBatch(good.group_ids, good.rewards, torch.zeros(3), None))
    with pytest.raises(ValueError, match="GroupBatch.rewards must be finite; non-finite at rows \\[1\\]"):
        prune("cppo", GroupBatch(good.group_ids, torch.tensor([0.0, math.nan]), good.advantages, None))
    with pytest.raises(ValueError, match="GroupBatch.sketches must be finite; non-finite in rows \\[0\\]"):
        prune("fastrl", GroupBatch(good.group_ids, good.rewards, good.advantages, torch.tensor([[math.inf], [0.0]])))
    with pytest.raises(ValueError, match="group_ids must be a 1-D integer"):
        prune("none", GroupBatch(torch.zeros(2), good.rewards, good.advantages, None))
    with pytest.raises(ValueError, match="token_ids is None"):
        prune("fastrl_official", good)
    with pytest.raises(ValueError, match=r"token_ids\[1\] holds a negative token id"):
        prune("fastrl_official", batch_of([0, 0], [1.0, 0.0], token_ids=[[1], [-2]]))
    with pytest.raises(TypeError, match="pruner 'cppo'.*unexpected keyword argument 'alpha'"):
        prune("cppo", good, alpha=1.0)


def test_registry_lists_every_pruner():
    assert PRUNERS.names() == sorted(NAMES + ["advantage_only", "fastrl_paper", "random"])  # test_baseline_pruners
    assert PRUNERS.names(lambda entry: entry.reads_sketches) == ["fastrl"]
    assert PRUNERS.names(lambda entry: entry.reads_tokens) == ["fastrl_official", "fastrl_paper"]
    assert PRUNERS.names(lambda entry: entry.cost_rule) == ["fastrl"]


@settings(max_examples=40, deadline=None)
@given(batch=batches(), name=st.sampled_from(sorted(PRUNERS.names())), seed=st.integers(0, 1000))
def test_each_pruner_reads_only_what_its_entry_says(batch, name, seed):
    """A pruner whose entry does not read sketches (token ids) decides the same without them: the trainer computes a
    sketch, and passes token ids, only where the entry asks."""
    entry = PRUNERS.get(name)
    stripped = GroupBatch(batch.group_ids, batch.rewards, batch.advantages,
                          batch.sketches if entry.reads_sketches else None,
                          batch.token_ids if entry.reads_tokens else None)
    full = prune(name, batch, generator=torch.Generator().manual_seed(seed))
    alone = prune(name, stripped, generator=torch.Generator().manual_seed(seed))
    for field in ("keep_mask", "scores", "reasons", "weights"):
        assert torch.equal(getattr(full, field), getattr(alone, field)), (name, field)


def test_check_cost_rule_takes_none_or_a_number_at_least_0_for_a_cost_pruner():
    assert check_cost_rule("fastrl", None) is None and check_cost_rule("cppo", None) is None
    for value in (0, 0.0, 0.02, 3, float("inf")):
        assert check_cost_rule("fastrl", value) == float(value) and type(check_cost_rule("fastrl", value)) is float
    assert check_cost_rule("fastrl", "measured", measured=True) == "measured"
    for bad in (-0.1, -1, float("nan"), True, False, "0.1", "measured", [0.1]):
        with pytest.raises(CostRuleError, match=r"^row_cost=.*: give a number >= 0$") as error:
            check_cost_rule("fastrl", bad)
        assert isinstance(error.value, ValueError) and error.value.keys == ("row_cost",)
        assert repr(bad) in str(error.value)
    for bad in (-0.1, float("nan"), True, "fast"):
        with pytest.raises(CostRuleError, match=r"^row_cost=.*: give 'measured' or a number >= 0$"):
            check_cost_rule("fastrl", bad, measured=True)
    for value, measured in ((0.1, False), ("measured", True)):
        with pytest.raises(CostRuleError, match=r"with pruner='cppo': only \['fastrl'\] choose") as error:
            check_cost_rule("cppo", value, measured=measured)
        assert error.value.keys == ("row_cost", "pruner") and repr(value) in str(error.value)
    with pytest.raises(CostRuleError) as error:  # the value is checked before the pruner
        check_cost_rule("cppo", -1.0)
    assert error.value.keys == ("row_cost",)
