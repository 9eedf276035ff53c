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


# ---- as_sampled: the unpruned step's mini-batches, pruned rows absent ---------------------------------------------

from fastrl_core.algo.minibatches import minibatch_plan  # noqa: E402


def _plan(keep, updates=4, mode="as_sampled", seed=0):
    return minibatch_plan(torch.tensor(keep, dtype=torch.bool), updates=updates, mode=mode, full_rows=128,
                          generator=torch.Generator().manual_seed(seed))


def test_as_sampled_with_nothing_pruned_is_equal_updates_draw_for_draw():
    for rows in (1, 7, 40, 128):
        plan = _plan([True] * rows)
        same = _split(rows, 4, "equal_updates")
        assert len(plan) == len(same)
        for batch, chunk in zip(plan, same):
            assert torch.equal(batch.kept, chunk) and batch.absent.numel() == 0


def test_as_sampled_keeps_the_unpruned_chunks_and_lists_pruned_rows_as_absent():
    keep = [True, False, True, True, False, False, True, True, False, True]
    plan = _plan(keep, updates=3, seed=2)
    chunks = minibatch_indices(10, updates=3, mode="equal_updates", full_rows=128,
                               generator=torch.Generator().manual_seed(2))
    kept_rows = [i for i, k in enumerate(keep) if k]  # position among kept rows -> distinct row
    assert len(plan) == 3
    for batch, chunk in zip(plan, chunks):
        rows = sorted([kept_rows[p] for p in batch.kept.tolist()] + batch.absent.tolist())
        assert rows == chunk.tolist()  # kept + absent = the unpruned chunk
        assert all(keep[r] for r in (kept_rows[p] for p in batch.kept.tolist()))
        assert not any(keep[r] for r in batch.absent.tolist())


def test_as_sampled_can_give_an_update_with_no_kept_row():
    plan = _plan([False] * 8, updates=4)
    assert len(plan) == 4 and all(b.kept.numel() == 0 and b.absent.numel() == 2 for b in plan)


@pytest.mark.parametrize("mode", ["equal_updates", "fixed_size"])
def test_other_modes_plan_only_kept_rows(mode):
    keep = [True, False] * 20
    plan = _plan(keep, mode=mode, seed=1)
    same = minibatch_indices(20, updates=4, mode=mode, full_rows=128, generator=torch.Generator().manual_seed(1))
    assert [b.kept.tolist() for b in plan] == [c.tolist() for c in same]
    assert all(b.absent.numel() == 0 for b in plan)
