"""Per prompt group statistics of one step, one definition for the budget (`algo.decide`) and the store
(`store.step_rows`). NumPy only, so the store reads it without torch.

The reward mean is over a group's non-NaN rewards (NaN if all are NaN, 0 for a group with no rollouts); the std is
the population std over them, exactly 0 below `ZERO_STD` (a decided, zero-variance group); both float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrl_core.algo.numerics import ZERO_STD


@dataclass(frozen=True)
class GroupStats:
    """Per prompt group (G,): reward mean and population std, rollouts sampled and kept."""

    reward_mean: np.ndarray  # (G,) float64
    reward_std: np.ndarray  # (G,) float64
    sampled: np.ndarray  # (G,) int64
    kept: np.ndarray  # (G,) int64


def as_numpy(values: Any, dtype=None) -> np.ndarray:
    """A NumPy array of `values` (a NumPy array, a list, or a tensor: detached and moved to the CPU first)."""
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


def group_stats(rewards: Any, group_index: Any, keep_mask: Any, num_groups: int) -> GroupStats:
    """Statistics of each of `num_groups` groups; rewards, group_index (in [0, G)) and keep_mask are (N,)."""
    rewards = as_numpy(rewards, np.float64).reshape(-1)
    group_index = as_numpy(group_index, np.int64).reshape(-1)
    keep_mask = as_numpy(keep_mask, bool).reshape(-1)
    if not rewards.shape == group_index.shape == keep_mask.shape:
        raise ValueError(f"group_stats: rewards {rewards.shape}, group_index {group_index.shape} and keep_mask "
                         f"{keep_mask.shape} must have one entry per rollout")
    if group_index.size and (group_index.min() < 0 or group_index.max() >= num_groups):
        raise ValueError(f"group_stats: group_index must lie in [0, {num_groups}), got "
                         f"{group_index.min()}..{group_index.max()}")
    sampled = np.bincount(group_index, minlength=num_groups)
    kept = np.bincount(group_index[keep_mask], minlength=num_groups)
    present = ~np.isnan(rewards)
    ids, values = group_index[present], rewards[present]
    counted = np.bincount(ids, minlength=num_groups)
    total = np.bincount(ids, weights=values, minlength=num_groups)
    mean = np.where(counted > 0, total / np.maximum(counted, 1), np.where(sampled > 0, np.nan, 0.0))
    squares = np.bincount(ids, weights=(values - mean[ids]) ** 2, minlength=num_groups)
    std = np.sqrt(squares / np.maximum(counted, 1))
    std[std < ZERO_STD] = 0.0
    return GroupStats(mean, std, sampled.astype(np.int64), kept.astype(np.int64))
