"""The named thresholds and seed mixing, checked by hand: one zero-std threshold for the store and the budgets, and
seeds that replay a recorded run exactly (changing them would break every resume)."""

from __future__ import annotations

import pytest

from fastrl_core.algo.budget_base import decided
from fastrl_core.algo.numerics import ZERO_STD
from fastrl_core.algo.group_stats import group_stats
from fastrl_core.trainer import PromptSampler, step_seed


def test_one_zero_std_threshold_for_the_store_and_the_budgets():
    # group 0: rewards equal up to rounding (std 5e-10), group 1: 0 and 1 (std 0.5)
    stats = group_stats([1.0, 1.0 + 1e-9, 0.0, 1.0], [0, 0, 1, 1], [True, True, True, True], 2)
    assert stats.reward_std.tolist() == [0.0, 0.5]
    assert ZERO_STD == 1e-9
    assert decided(ZERO_STD, kept=2) and not decided(2 * ZERO_STD, kept=2)
    assert not decided(0.5, kept=2) and decided(0.5, kept=0)


def test_step_seeds_by_hand():
    assert step_seed(0, 0) == 17  # 0 * 1_000_003 + 0 * 7_919 + 17
    assert step_seed(1, 2) == 1_000_003 + 2 * 7_919 + 17
    assert step_seed(2**62, 1) == (2**62 * 1_000_003 + 7_919 + 17) % (2**63 - 1)
    assert len({step_seed(seed, step) for seed in range(50) for step in range(2_000)}) == 50 * 2_000


def test_an_epoch_is_permuted_by_its_own_seed():
    import torch

    sampler = PromptSampler(10, 5, seed=3)
    for epoch in range(3):
        expected = torch.randperm(10, generator=torch.Generator().manual_seed(3 * 7_919 + epoch)).tolist()[:10]
        assert sampler.window(10 * epoch, 10) == expected
    with pytest.raises(ValueError):
        PromptSampler(4, 5, seed=0)
