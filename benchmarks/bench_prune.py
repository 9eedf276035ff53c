"""Pruner benchmark: speed on one core, and how well each pruner's kept set preserves a group's gradient.

    .venv/bin/python benchmarks/bench_prune.py [--groups 1024] [--size 16] [--dim 256] [--repeats 7]

1. Speed: every pruner on `groups` × `size` rollouts at sketch dimension `dim`, torch.set_num_threads(1), median
   of `repeats` runs (after one warm-up) of the whole `prune` call, input validation included: wall time and this
   thread's CPU time (steadier when other processes share the cores). Target: fastrl < 50 ms.
2. Fidelity on a synthetic mixture (not a model: a stand-in for real sketches, to compare selection rules):
   each group's rollouts follow one of 4 solution modes; a rollout's gradient factor is
   φ_i = s + μ_{z_i} + 0.3·ε_i (s shared by the prompt, μ_k a mode direction, ε_i noise; all random unit vectors
   in R^64),
   its reward 1.0·[correct] + 0.5·[format] with P(correct) depending on the mode, A the GRPO group advantage.
   The full group's policy gradient is g = Σ_i A_i φ_i; a pruner keeps ĝ = Σ_kept w_i A_i φ_i. Printed: the mean
   cosine(ĝ, g) over groups with g ≠ 0 (the update direction the trainer takes from the kept rollouts) and the mean
   relative error |ĝ − g| / |g| (direction and size of the step).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastrl_core.algo.advantages import compute_advantages
from fastrl_core.algo.groups import GroupBatch
from fastrl_core.algo.pruners import PRUNERS, prune


def speed_batch(groups: int, size: int, dim: int, seed: int = 0) -> GroupBatch:
    """Binary-reward groups with per-prompt success rates, Gaussian sketches, 64-token completions."""
    gen = torch.Generator().manual_seed(seed)
    group_ids = torch.arange(groups).repeat_interleave(size)
    success = torch.rand(groups, generator=gen).repeat_interleave(size)
    rewards = (torch.rand(groups * size, generator=gen) < success).float()
    advantages = compute_advantages("group_normalized", rewards, group_ids)
    sketches = torch.randn(groups * size, dim, generator=gen)
    token_ids = tuple(torch.randint(0, 1000, (64,), generator=gen) for _ in range(groups * size))
    return GroupBatch(group_ids, rewards, advantages, sketches, token_ids)


def time_pruners(batch: GroupBatch, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (median wall ms, median CPU ms of this thread); CPU time is steadier on a shared machine."""
    options = {"fastrl_official": {"minibatch_size": 64}}
    times = {}
    without_tokens = GroupBatch(batch.group_ids, batch.rewards, batch.advantages, batch.sketches)
    for name in PRUNERS.names():
        wall, cpu = [], []
        run_batch = batch if PRUNERS.get(name).reads_tokens else without_tokens  # as the trainer passes them
        for attempt in range(repeats + 1):
            start, start_cpu = time.perf_counter(), time.thread_time()
            prune(name, run_batch, generator=torch.Generator().manual_seed(attempt), **options.get(name, {}))
            wall.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
        times[name] = (statistics.median(wall[1:]) * 1000, statistics.median(cpu[1:]) * 1000)
    return times


def mixture_batch(groups: int, size: int, dim: int = 64, modes: int = 4, seed: int = 0):
    """(GroupBatch, φ (N, dim)) for the fidelity study; sketches are φ itself (a perfect sketch)."""
    gen = torch.Generator().manual_seed(seed)
    unit = lambda *shape: torch.nn.functional.normalize(torch.randn(*shape, dim, generator=gen), dim=-1)  # noqa: E731
    shared, directions = unit(groups, 1), unit(groups, modes)  # (G, 1, dim), (G, modes, dim)
    mode_weights = torch.rand(groups, modes, generator=gen) + 0.1
    mode = torch.multinomial(mode_weights, size, replacement=True, generator=gen)  # (G, size)
    correct_rate = torch.rand(groups, modes, generator=gen).gather(1, mode)
    rewards = ((torch.rand(groups, size, generator=gen) < correct_rate).float()
               + 0.5 * (torch.rand(groups, size, generator=gen) < 0.8).float()).reshape(-1)
    phi = (shared + directions.gather(1, mode[:, :, None].expand(-1, -1, dim))
           + 0.3 * unit(groups, size)).reshape(-1, dim)
    group_ids = torch.arange(groups).repeat_interleave(size)
    advantages = compute_advantages("group_normalized", rewards, group_ids)
    vocab = torch.randint(0, 1000, (groups, modes, 40), generator=gen)
    token_ids = tuple(
        torch.where(torch.rand(30, generator=gen) < 0.7,
                    vocab[i // size, int(mode.reshape(-1)[i])][torch.randint(0, 40, (30,), generator=gen)],
                    torch.randint(0, 1000, (30,), generator=gen))
        for i in range(groups * size))
    return GroupBatch(group_ids, rewards, advantages, phi, token_ids), phi


def fidelity(batch: GroupBatch, phi: torch.Tensor, weights: torch.Tensor) -> tuple[float, float]:
    """Mean cosine(ĝ, g) and mean |ĝ − g| / |g| over groups with g ≠ 0."""
    groups = int(batch.group_ids.max()) + 1
    full = torch.zeros(groups, phi.shape[1]).index_add_(0, batch.group_ids, batch.advantages[:, None] * phi)
    kept = torch.zeros_like(full).index_add_(0, batch.group_ids, (weights * batch.advantages)[:, None] * phi)
    informative = full.norm(dim=1) > 1e-6
    full, kept = full[informative], kept[informative]
    cosine = torch.nn.functional.cosine_similarity(kept, full, dim=1, eps=1e-12)
    return cosine.mean().item(), ((kept - full).norm(dim=1) / full.norm(dim=1)).mean().item()


def fidelity_table(groups: int = 512, size: int = 16, seeds: int = 3) -> list[tuple[str, float, float, float]]:
    """Rows (variant, kept fraction, mean cosine, mean relative error), averaged over `seeds` batches."""
    variants = {
        "none": ("none", {}), "dapo_filter": ("dapo_filter", {}), "cppo": ("cppo", {}), "pods": ("pods", {}),
        "fastrl_official": ("fastrl_official", {}),
        "random": ("random", {}),
        "fastrl without sketches (top m|A|)": ("fastrl", {"_no_sketch": True}),
        "fastrl": ("fastrl", {}),
    }
    sums = {label: [0.0, 0.0, 0.0] for label in variants}
    for seed in range(seeds):
        batch, phi = mixture_batch(groups, size, seed=seed)
        for label, (name, options) in variants.items():
            options = dict(options)
            run_batch = batch
            if options.pop("_no_sketch", False):  # no rollout stands for another
                run_batch = GroupBatch(batch.group_ids, batch.rewards, batch.advantages, None, batch.token_ids)
            result = prune(name, run_batch, generator=torch.Generator().manual_seed(seed), **options)
            cosine, error = fidelity(batch, phi, result.weights)
            for k, value in enumerate((result.keep_mask.float().mean().item(), cosine, error)):
                sums[label][k] += value / seeds
    return [(label, *values) for label, values in sums.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"speed: {args.groups} groups x {args.size} rollouts, sketch dim {args.dim}, 1 thread, "
          f"median of {args.repeats}")
    print(f"  {'pruner':16s} {'wall ms':>8s} {'cpu ms':>8s}")
    for name, (ms, cpu_ms) in time_pruners(speed_batch(args.groups, args.size, args.dim), args.repeats).items():
        target = "   (target < 50 ms: " + ("met" if ms < 50 else "MISSED") + ")" if name == "fastrl" else ""
        print(f"  {name:16s} {ms:8.1f} {cpu_ms:8.1f}{target}")
    print("\nfidelity on the synthetic mode mixture (512 groups x 16, keep_ratio 0.5, min_keep 2, 3 seeds):")
    print(f"  {'variant':34s} {'kept':>6s} {'cos(ĝ,g)':>9s} {'|ĝ-g|/|g|':>10s}")
    for label, kept, cosine, error in fidelity_table():
        print(f"  {label:34s} {kept:6.3f} {cosine:9.3f} {error:10.3f}")


if __name__ == "__main__":
    main()
