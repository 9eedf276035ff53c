"""Group advantages for prompt groups of unequal size (rollout budgets vary per prompt).

Every estimator takes one scalar reward per rollout and the id of the prompt group it belongs to and
returns one advantage per rollout. Group ids are arbitrary integers (not necessarily 0..G-1, contiguous
or sorted); groups may have any size. All statistics are computed with scatter sums (`index_add_`), with
no Python loop over groups.

Standard deviations are the *unbiased* (Bessel-corrected, divide by n - 1) sample std, as TRL's
`nanstd` uses for GRPO; a group of size 1 has std 0 by definition (and its advantage is 0, because the
reward equals the group mean). A group whose rewards are all equal gets advantage exactly 0 under every
estimator, even with eps = 0.

- `group_normalized`  GRPO (Shao et al. 2024, DeepSeekMath §4.1.2): A_i = (r_i - mean_g) / (std_g + eps).
- `mean_only`         Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1): A_i = r_i - mean_g.
- `batch_scaled`      REINFORCE++-baseline style (Hu et al. 2025): centre in the group, scale by the batch:
                      A_i = (r_i - mean_g) / (std over the whole batch of (r_j - mean_g(j)) + eps).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from fastrl_core.algo.registry import Registry

AdvantageEstimator = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")


def group_mean_std(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-element mean and unbiased std of each element's group.  values (N,) float, group_ids (N,) int.

    Returns (mean (N,), std (N,)). A group whose values are all equal (size 1 included) gets its value as the
    mean and std exactly 0, so `values - mean` is exactly 0 there despite float rounding of sum / count.
    """
    _, group_index = torch.unique(group_ids, return_inverse=True)  # (N,) dense 0..G-1
    num_groups = int(group_index.max()) + 1 if values.numel() else 0
    counts = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    counts.index_add_(0, group_index, torch.ones_like(values))
    sums = torch.zeros_like(counts).index_add_(0, group_index, values)
    group_max = torch.zeros_like(counts).scatter_reduce(0, group_index, values, "amax", include_self=False)
    group_min = torch.zeros_like(counts).scatter_reduce(0, group_index, values, "amin", include_self=False)
    constant = (group_max == group_min)[group_index]  # (N,)
    mean = torch.where(constant, values, (sums / counts)[group_index])  # (N,)
    squares = torch.zeros_like(counts).index_add_(0, group_index, (values - mean) ** 2)  # two-pass variance
    var = squares / (counts - 1).clamp(min=1)  # size-1 groups: 0 / 1 = 0
    return mean, var.sqrt()[group_index]


def _scale(centred: Tensor, std: Tensor, eps: float) -> Tensor:
    """centred / (std + eps), and exactly 0 where std is 0 (there centred is 0 too), so eps = 0 is safe."""
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def _batch_std(values: Tensor) -> Tensor:
    """Unbiased std of all of `values` (N,); 0 when N < 2."""
    return values.std() if values.numel() > 1 else values.new_zeros(())


@ADVANTAGES.register("group_normalized")
def group_normalized(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps), std unbiased (DeepSeekMath §4.1.2; TRL scale_rewards="group")."""
    mean, std = group_mean_std(rewards, group_ids)
    return _scale(rewards - mean, std, eps)


@ADVANTAGES.register("mean_only")
def mean_only(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Dr.GRPO: A_i = r_i - mean_g, no std division (Liu et al. 2025 §3.1). `eps` is unused."""
    mean, _ = group_mean_std(rewards, group_ids)
    return rewards - mean


@ADVANTAGES.register("batch_scaled")
def batch_scaled(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """A_i = (r_i - mean_g) / (std_batch(r - mean_g) + eps): group baseline, batch-wide scale (REINFORCE++-baseline).

    The batch std is unbiased over all N centred rewards, size-1 groups (centred reward 0) included.
    """
    mean, _ = group_mean_std(rewards, group_ids)
    centred = rewards - mean
    return _scale(centred, _batch_std(centred).expand_as(centred), eps)


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Advantages (N,) by estimator `name` from rewards (N,) float and group_ids (N,) int (any ids, any sizes)."""
    estimator = ADVANTAGES.get(name)
    if rewards.dim() != 1 or group_ids.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be (N,); got rewards {tuple(rewards.shape)}, "
            f"group_ids {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    bad = (~torch.isfinite(rewards)).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"rewards must be finite; non-finite at indices {bad[:10].tolist()}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return estimator(rewards, group_ids.to(rewards.device), eps=eps)
