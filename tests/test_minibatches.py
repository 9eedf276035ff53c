"""PPO mini-batch splits: hand-checked sizes for both modes, partition invariants, determinism."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.minibatches import MINIBATCH_MODES, minibatch_indices


def _split(num_rows, updates, mode, full_rows=128, seed=0):
    return minibatch_indices(num_rows, updates=updates, mode=mode, full_rows=full_rows,
                             generator=torch.Generator().manual_seed(seed))


def _sizes(batches):
    return [len(b) for b in batches]


@pytest.mark.parametrize("num_rows, updates, sizes", [
    (128, 4, [32, 32, 32, 32]),  # an unpruned step: 4 updates of 32
    (64, 4, [16, 16, 16, 16]),   # half pruned: still 4 updates, of 16 (the authors' 64 -> 16)
    (10, 4, [3, 3, 2, 2]),       # near-equal: the first K mod 4 one larger
    (3, 4, [1, 1, 1]),           # fewer kept rows than updates: one row each
    (7, 1, [7]),
])
def test_equal_updates_sizes(num_rows, updates, sizes):
    assert _sizes(_split(num_rows, updates, "equal_updates")) == sizes


@pytest.mark.parametrize("num_rows, full_rows, updates, sizes", [
    (128, 128, 4, [32, 32, 32, 32]),  # unpruned: same as equal_updates
    (64, 128, 4, [32, 32]),           # half pruned: half the updates, each of 32
    (70, 128, 4, [32, 32, 6]),        # the last mini-batch holds the remainder (verl's split)
    (20, 128, 4, [20]),               # fewer rows than a mini-batch: one update
    (130, 128, 4, [32, 32, 32, 32, 2]),  # an adaptive budget sampled more than a full step
    (10, 30, 4, [8, 2]),              # ceil(30 / 4) = 8 rows per mini-batch
])
def test_fixed_size_sizes(num_rows, full_rows, updates, sizes):
    assert _sizes(_split(num_rows, updates, "fixed_size", full_rows=full_rows)) == sizes


def test_no_rows_means_no_update():
    for mode in MINIBATCH_MODES.names():
        assert _split(0, 4, mode) == []


@pytest.mark.parametrize("mode", ["equal_updates", "fixed_size"])
def test_one_minibatch_is_every_row_in_order_and_draws_nothing(mode):
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    batches = minibatch_indices(9, updates=1, mode=mode, full_rows=16, generator=generator)
    assert len(batches) == 1 and torch.equal(batches[0], torch.arange(9))
    assert torch.equal(generator.get_state(), state), "a single mini-batch must not consume randomness"


def test_same_seed_same_split_other_seed_other_split():
    a, b = _split(40, 4, "equal_updates", seed=3), _split(40, 4, "equal_updates", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = _split(40, 4, "equal_updates", seed=4)
    assert any(not torch.equal(x, y) for x, y in zip(a, c))
    assert not torch.equal(a[0], torch.arange(10)), "rows are shuffled across mini-batches, not cut in order"


@settings(max_examples=60, deadline=None)
@given(num_rows=st.integers(0, 200), updates=st.integers(1, 8), full_rows=st.integers(1, 200),
       mode=st.sampled_from(["equal_updates", "fixed_size"]), seed=st.integers(0, 2**31))
def test_minibatches_partition_the_rows(num_rows, updates, full_rows, mode, seed):
    batches = _split(num_rows, updates, mode, full_rows=full_rows, seed=seed)
    rows = torch.cat(batches) if batches else torch.empty(0, dtype=torch.long)
    assert sorted(rows.tolist()) == list(range(num_rows))  # every row exactly once
    assert all(len(b) and torch.equal(b, b.sort().values) for b in batches)  # non-empty, ascending
    if mode == "equal_updates":
        assert len(batches) == min(updates, num_rows)
        assert not batches or max(_sizes(batches)) - min(_sizes(batches)) <= 1
    else:
        size = -(-full_rows // updates)
        assert all(len(b) == size for b in batches[:-1]) and (not batches or len(batches[-1]) <= size)


def test_bad_arguments_raise_naming_them():
    with pytest.raises(KeyError, match="minibatch mode"):
        _split(4, 2, "halves")
    with pytest.raises(ValueError, match="updates_per_step"):
        _split(4, 0, "equal_updates")
    with pytest.raises(ValueError, match="full_rows"):
        _split(4, 2, "fixed_size", full_rows=0)


from fastrl_core.algo.minibatches import minibatch_plan  # noqa: E402


@pytest.mark.parametrize("mode", ["equal_updates", "fixed_size"])
def test_the_plan_splits_only_kept_rows(mode):
    keep = torch.tensor([True, False] * 20)
    plan = minibatch_plan(keep, updates=4, mode=mode, full_rows=128, generator=torch.Generator().manual_seed(1))
    same = minibatch_indices(20, updates=4, mode=mode, full_rows=128, generator=torch.Generator().manual_seed(1))
    assert [b.rows.tolist() for b in plan] == [c.tolist() for c in same]


# ---- minibatch_grouping=prompts: whole prompts permuted, rows of a prompt together ----------------------------------

@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=20), updates=st.integers(1, 6),
       mode=st.sampled_from(["equal_updates", "fixed_size"]), seed=st.integers(0, 2**31))
def test_grouped_minibatches_partition_the_rows_with_the_row_splits_sizes(sizes, updates, mode, seed):
    groups = torch.repeat_interleave(torch.randperm(len(sizes), generator=torch.Generator().manual_seed(seed)),
                                     torch.tensor(sizes))  # rows of a prompt adjacent, prompts in any order
    groups = groups[torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed + 1))]  # and mixed
    grouped = minibatch_indices(len(groups), updates=updates, mode=mode, full_rows=64,
                                generator=torch.Generator().manual_seed(seed), groups=groups)
    rows = _split(len(groups), updates, mode, full_rows=64, seed=seed)
    assert _sizes(grouped) == _sizes(rows)
    assert sorted(torch.cat(grouped).tolist()) == list(range(len(groups)))
    assert all(torch.equal(b, b.sort().values) for b in grouped)
    # each prompt's rows are contiguous in the permutation: a prompt spans consecutive mini-batches and at most
    # the mini-batches boundaries cut it, so the prompts in all mini-batches together are at most P + cuts
    prompts_per_batch = [len(groups[b].unique()) for b in grouped]
    assert sum(prompts_per_batch) <= len(sizes) + len(grouped) - 1
    spans = {}
    for i, batch in enumerate(grouped):
        for prompt in groups[batch].unique().tolist():
            spans.setdefault(prompt, []).append(i)
    assert all(span == list(range(span[0], span[-1] + 1)) for span in spans.values())


def test_grouped_minibatches_hold_fewer_prompts_than_row_shuffles():
    groups = torch.arange(16).repeat_interleave(6)  # 16 prompts x 6 kept rows, 4 updates
    generator = torch.Generator().manual_seed(0)
    grouped = minibatch_indices(96, updates=4, mode="equal_updates", full_rows=128, generator=generator,
                                groups=groups)
    assert [len(groups[b].unique()) for b in grouped] == [4, 4, 4, 4]
    shuffled = _split(96, 4, "equal_updates", seed=0)
    assert min(len(groups[b].unique()) for b in shuffled) > 4
    other = minibatch_indices(96, updates=4, mode="equal_updates", full_rows=128,
                              generator=torch.Generator().manual_seed(1), groups=groups)
    assert any(not torch.equal(a, b) for a, b in zip(grouped, other)), "the prompt order is drawn from the seed"


def test_grouped_plan_takes_the_kept_rows_groups_and_checks_their_shape():
    keep = torch.tensor([True, False, True, True, False, True, True, True])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    plan = minibatch_plan(keep, updates=2, mode="equal_updates", full_rows=8,
                          generator=torch.Generator().manual_seed(0), groups=groups)
    kept_groups = groups[keep]  # (6,) prompts of the kept rows 0..5
    assert sorted(torch.cat([b.rows for b in plan]).tolist()) == list(range(6))
    assert sum(len(kept_groups[b.rows].unique()) for b in plan) <= 3 + 1
    with pytest.raises(ValueError, match="groups must have the keep mask's shape"):
        minibatch_plan(keep, updates=2, mode="equal_updates", full_rows=8,
                       generator=torch.Generator().manual_seed(0), groups=groups[:5])


# ---- merged duplicates: the exact plan is the unmerged plan with identical rows merged per mini-batch -------------

from fastrl_core.algo.minibatches import Minibatch  # noqa: E402


def _classes(n, seed):
    """A random step of n rollouts: each rollout's representative (lowest index of its class), and a keep mask
    that keeps some representatives only (never a copy)."""
    generator = torch.Generator().manual_seed(seed)
    klass = torch.randint(0, max(1, n // 3), (n,), generator=generator)
    first = {}
    representative = torch.tensor([first.setdefault(int(c), i) for i, c in enumerate(klass.tolist())])
    is_rep = representative == torch.arange(n)
    keep = is_rep & (torch.rand(n, generator=generator) < 0.8)
    return representative, keep


@pytest.mark.parametrize("mode", sorted(MINIBATCH_MODES.names()))
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_exact_merge_plan_is_the_unmerged_plan_merged_inside_each_minibatch(mode, grouped, seed):
    """merge_scope='minibatch': expanding each mini-batch's rows by their counts gives, as a multiset of classes,
    exactly the mini-batch the unmerged step (every copy a row of its own, kept when its representative is) draws
    from the same generator."""
    from fastrl_core.algo.minibatches import minibatch_plan

    n = 48
    representative, keep = _classes(n, seed)
    groups = torch.arange(n) // 6 if grouped else None
    unmerged_keep = keep[representative]
    unmerged = minibatch_plan(unmerged_keep, updates=4, mode=mode, full_rows=n,
                              generator=torch.Generator().manual_seed(seed), groups=groups)
    merged = minibatch_plan(keep, updates=4, mode=mode, full_rows=n, generator=torch.Generator().manual_seed(seed),
                            groups=groups, representative=representative, merge_scope="minibatch")
    assert len(merged) == len(unmerged) >= 2
    kept, unmerged_kept = keep.nonzero().squeeze(1), unmerged_keep.nonzero().squeeze(1)
    for plain, batch in zip(unmerged, merged):
        assert batch.counts is not None and bool((batch.counts >= 1).all()) and bool((batch.rows.diff() > 0).all())
        expected = sorted(representative[unmerged_kept[plain.rows]].tolist())
        got = sorted(kept[batch.rows].repeat_interleave(batch.counts).tolist())
        assert got == expected
    assert sum(int(b.counts.sum()) for b in merged) == int(unmerged_keep.sum())  # every copy once


@pytest.mark.parametrize("mode", sorted(MINIBATCH_MODES.names()))
def test_lumped_merge_plan_puts_a_row_and_all_its_copies_in_one_minibatch(mode):
    """merge_scope='step' (the lumped merge): the plan over the kept rows alone, each with its whole multiplicity;
    without duplicates both scopes are the plain plan."""
    from fastrl_core.algo.minibatches import minibatch_plan

    representative, keep = _classes(48, 3)
    kept = keep.nonzero().squeeze(1)
    plain = minibatch_plan(keep, updates=4, mode=mode, full_rows=48, generator=torch.Generator().manual_seed(1))
    lumped = minibatch_plan(keep, updates=4, mode=mode, full_rows=48, generator=torch.Generator().manual_seed(1),
                            representative=representative, merge_scope="step")
    multiplicity = torch.bincount(representative, minlength=48)
    assert [b.rows.tolist() for b in lumped] == [b.rows.tolist() for b in plain]
    for batch in lumped:
        assert batch.counts.tolist() == multiplicity[kept[batch.rows]].tolist()
    assert all(b.counts is None for b in plain) and isinstance(plain[0], Minibatch)


def test_merge_plan_refuses_an_unknown_scope_and_a_misshapen_representative():
    from fastrl_core.algo.minibatches import minibatch_plan

    keep = torch.ones(6, dtype=torch.bool)
    with pytest.raises(ValueError, match="merge_scope"):
        minibatch_plan(keep, updates=2, mode="equal_updates", full_rows=6, generator=torch.Generator(),
                       representative=torch.arange(6), merge_scope="epoch")
    with pytest.raises(ValueError, match="representative"):
        minibatch_plan(keep, updates=2, mode="equal_updates", full_rows=6, generator=torch.Generator(),
                       representative=torch.arange(5))
