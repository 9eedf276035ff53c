"""The keep count from pass costs (algo.costs): the fit of ρ from phase times, the argmax rule against brute force,
and what it does inside the fastrl pruner."""

import itertools

import pytest
import torch

from fastrl_core.algo.costs import MIN_FIT_STEPS, cost_keep_counts, fit_row_cost
from fastrl_core.algo.groups import GroupBatch
from fastrl_core.algo.pruners import prune


def test_fit_recovers_the_per_row_cost_over_the_fixed_seconds():
    kept = [10, 20, 30, 40, 25]
    passes = [0.1 + 0.005 * k for k in kept]  # 0.1 s fixed inside the passes, 5 ms per kept row
    steps = [0.9 + p for p in passes]  # generation etc. 0.9 s: T0 = 0.9 + 0.1
    assert fit_row_cost(kept, passes, steps) == pytest.approx(0.005 / 1.0)


def test_fit_needs_enough_steps_a_varying_count_and_a_positive_fixed_part():
    assert fit_row_cost([10, 20, 30], [0.1, 0.2, 0.3], [1.0, 1.1, 1.2]) is None  # MIN_FIT_STEPS = 4
    assert MIN_FIT_STEPS == 4
    assert fit_row_cost([20] * 6, [0.2] * 6, [1.0] * 6) is None  # slope unidentifiable
    assert fit_row_cost([10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]) is None  # T0 = 0
    # timing noise that makes the slope negative: the passes count as free
    assert fit_row_cost([10, 20, 30, 40], [0.4, 0.3, 0.2, 0.1], [1.0, 1.0, 1.0, 1.0]) == 0.0
    with pytest.raises(ValueError, match="3 kept counts, 4 pass"):
        fit_row_cost([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4])


def test_keep_counts_by_hand():
    mass = torch.tensor([[3.0, 1.0, 0.0], [2.0, 0.5, 0.0]])
    assert cost_keep_counts(mass, 0.0).tolist() == [2, 2]  # free passes: every row of nonzero mass
    # sorted 3, 2, 1, 0.5: S_k / (1 + 0.2k) = 2.50, 3.57, 3.75, 3.61 -> k* = 3
    assert cost_keep_counts(mass, 0.2).tolist() == [2, 1]
    assert cost_keep_counts(mass, 100.0).tolist() == [1, 0]  # passes dear: the heaviest row alone
    assert cost_keep_counts(torch.zeros(2, 3), 0.5).tolist() == [0, 0]
    with pytest.raises(ValueError, match="row_cost must be >= 0"):
        cost_keep_counts(mass, -0.1)


@pytest.mark.parametrize("seed", range(5))
def test_keep_count_is_the_best_subset_of_any_size(seed):
    """For a given size the heaviest rows are the best subset, so k* must match a search over every subset."""
    generator = torch.Generator().manual_seed(seed)
    mass = torch.rand(3, 3, generator=generator) * (torch.rand(3, 3, generator=generator) > 0.2)
    row_cost = float(torch.rand(1, generator=generator)) * 2
    flat = mass.reshape(-1).tolist()
    best = max((sum(flat[i] for i in subset) / (1 + row_cost * len(subset)), len(subset))
               for size in range(1, 10) for subset in itertools.combinations(range(9), size))
    counts = cost_keep_counts(mass, row_cost)
    kept_mass = sorted(flat, reverse=True)[:int(counts.sum())]
    assert sum(kept_mass) / (1 + row_cost * len(kept_mass)) == pytest.approx(best[0])


def _batch(groups: int = 6, size: int = 8, seed: int = 0) -> GroupBatch:
    generator = torch.Generator().manual_seed(seed)
    group_ids = torch.arange(groups).repeat_interleave(size)
    rewards = (torch.rand(groups * size, generator=generator) > 0.6).float()
    rewards[:size] = 1.0  # group 0 decided: all advantages 0
    grouped = rewards.view(groups, size)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).reshape(-1)
    sketches = torch.randn(groups * size, 16, generator=generator)
    return GroupBatch(group_ids, rewards, advantages, sketches)


def test_fastrl_with_free_passes_keeps_what_the_keep_ratio_keeps():
    batch = _batch()
    for keep_ratio in (1.0, 0.5):
        plain = prune("fastrl", batch, keep_ratio=keep_ratio, generator=torch.Generator().manual_seed(1))
        free = prune("fastrl", batch, keep_ratio=keep_ratio, generator=torch.Generator().manual_seed(1), row_cost=0.0)
        assert torch.equal(plain.keep_mask, free.keep_mask)
        torch.testing.assert_close(plain.weights, free.weights)
    everything = prune("fastrl", batch, keep_ratio=1.0, row_cost=0.0)
    assert torch.equal(everything.keep_mask, batch.advantages.abs() > 1e-6)  # only A = 0 is pruned


def test_fastrl_with_dear_passes_keeps_each_groups_minimum_and_fewer_as_the_cost_rises():
    batch = _batch()
    nonzero = (batch.advantages.abs() > 1e-6).view(6, 8).sum(1)
    kept = [prune("fastrl", batch, keep_ratio=1.0, min_keep=2, row_cost=rho).keep_mask.view(6, 8).sum(1)
            for rho in (0.0, 0.02, 0.1, 1e6)]
    assert all((a >= b).all() for a, b in zip(kept, kept[1:]))
    assert kept[0].sum() > kept[-1].sum()
    assert kept[-1].tolist() == torch.minimum(nonzero, torch.tensor(2)).tolist()


def test_only_cost_pruners_take_a_row_cost():
    with pytest.raises(ValueError, match=r"row_cost=0.1 with pruner='cppo': only \['fastrl'\] choose"):
        prune("cppo", _batch(), row_cost=0.1)
    with pytest.raises(ValueError, match="row_cost=-1.0: give a number >= 0"):
        prune("fastrl", _batch(), row_cost=-1.0)
