"""What CPPO's edge in direction over the coreset is made of once duplicates are merged: picks, weights or ties?

    .venv/bin/python benchmarks/prune_picks_vs_weights.py [--seeds 100-105] [--keep 0.5,0.25] [--ties 10]

The setting of `bench_prune_quality.py` (same batches: warm start, 16 prompts × 8, per-rollout full-model
gradients), merged rows only. For the coreset's per-group kept counts it prints the cosine of the kept update to
the full one (`bench_prune_quality.Geometry.fidelity`, mean over the batches, and the batches where it beats
CPPO's) for:
- the coreset's picks with its weights, and with weights 1 (is its mass transfer doing anything?);
- CPPO's picks (top |A|, ties at random) over `--ties` draws of its tie-break: mean, range over draws, and the
  share of (batch, draw) pairs the coreset beats;
- fixed rankings per group, with and without one pick per sign present (the coreset's floor): |A|, |A|·‖φ‖
  (φ the advantage-free sketch, so |A|·‖φ‖ is a row's sketched gradient norm), m|A| and m|A|·‖φ‖ (m its copies).
Cosines ignore the weights' common scale. A diagnosis, not a selection: run it on both seed sets of
`bench_prune_quality.py` (report 100-105, the default, and choose 0-5) before reading a ranking as a lead.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from bench_prune_quality import (Geometry, at_counts, kept_per_group, merged, seed_batch, seed_list, setup,
                                 sketching_engine)
from fastrl_core.algo.pruners import prune


def ranked(batch, counts: dict[int, int], score: torch.Tensor, sign_floor: bool) -> torch.Tensor:
    """Per group, the counts[g] nonzero-advantage rows of highest score (ties in row order); with sign_floor the
    best row of each sign present first.  -> keep (N,) bool."""
    advantages = batch.advantages.float()
    keep = torch.zeros(advantages.numel(), dtype=torch.bool)
    for group, count in counts.items():
        rows = [i for i in (batch.group_ids == group).nonzero().flatten().tolist() if abs(float(advantages[i])) > 1e-6]
        order = sorted(rows, key=lambda i: -float(score[i]))
        best_of_sign: dict[bool, int] = {}
        for i in order:
            best_of_sign.setdefault(bool(advantages[i] > 0), i)
        picked = [best_of_sign[sign] for sign in (True, False) if sign in best_of_sign] if sign_floor else []
        picked += [i for i in order if i not in picked]
        keep[picked[:count]] = True
    assert kept_per_group(batch, keep) == counts
    return keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="100-105")
    parser.add_argument("--keep", default="0.5,0.25")
    parser.add_argument("--ties", type=int, default=10, help="draws of CPPO's random tie-break per batch")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from fastrl_core.policy import load_policy

    config, problems = setup(Path(tempfile.mkdtemp(prefix="prune_picks_vs_weights_")), threads=1)
    policy = load_policy("embedded")
    engine = sketching_engine(config, policy)
    keeps = [float(k) for k in args.keep.split(",")]
    seeds = seed_list(args.seeds)
    cosines: dict[tuple[float, str], list[float]] = {}
    draws: dict[float, list[list[float]]] = {k: [] for k in keeps}
    for seed in seeds:
        batch, duplicates, gradients = seed_batch(engine, policy, problems, seed, config)
        rows, copies = merged(batch, duplicates), duplicates.counts.float()
        geometry = Geometry.of(gradients[duplicates.unique], copies)

        def cosine(keep, weights):
            return geometry.fidelity(keep, weights)[0]

        magnitude, norm = rows.advantages.float().abs(), rows.sketches.float().norm(dim=1)
        for keep_ratio in keeps:
            result = prune("fastrl", rows, keep_ratio=keep_ratio, min_keep=config.min_keep,
                           generator=torch.Generator().manual_seed(seed))
            counts = kept_per_group(rows, result.keep_mask)
            found = {"coreset (default): its picks, its weights": cosine(result.keep_mask, result.weights),
                     "coreset's picks, weights 1": cosine(result.keep_mask, result.keep_mask.float()),
                     "CPPO (bench_prune_quality's tie draw)": cosine(*at_counts("cppo", rows, counts, seed))}
            for label, score in (("|A|", magnitude), ("|A|·‖φ‖", magnitude * norm), ("m|A|", copies * magnitude),
                                 ("m|A|·‖φ‖", copies * magnitude * norm)):
                for floor in (False, True):
                    keep = ranked(rows, counts, score, floor)
                    found[f"top {label}{', one per sign' if floor else ''}"] = cosine(keep, keep.float())
            for label, value in found.items():
                cosines.setdefault((keep_ratio, label), []).append(value)
            draws[keep_ratio].append([cosine(*at_counts("cppo", rows, counts, 1000 * seed + r))
                                      for r in range(args.ties)])
        print(f"seed {seed} done", flush=True)
    n = len(seeds)
    for keep_ratio in keeps:
        cppo = cosines[keep_ratio, "CPPO (bench_prune_quality's tie draw)"]
        coreset = cosines[keep_ratio, "coreset (default): its picks, its weights"]
        print(f"\nmerged, keep {keep_ratio}, warm start ({n} batches): cosine mean | beats CPPO's draw in")
        for (ratio, label), values in cosines.items():
            if ratio == keep_ratio:
                wins = sum(v > c for v, c in zip(values, cppo))
                print(f"  {label:44s} {statistics.mean(values):.3f} | {wins}/{n}")
        per_draw = [statistics.mean(b[r] for b in draws[keep_ratio]) for r in range(args.ties)]
        beaten = sum(c > d for c, batch_draws in zip(coreset, draws[keep_ratio]) for d in batch_draws)
        print(f"  CPPO over {args.ties} tie draws: mean {statistics.mean(per_draw):.3f}, range of the draws' means "
              f"{min(per_draw):.3f}-{max(per_draw):.3f}; the coreset beats {beaten} of {n * args.ties} (batch, draw)")


if __name__ == "__main__":
    main()
