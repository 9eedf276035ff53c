"""benchmarks/bench_prune_quality.py's arithmetic: the Gram-matrix fidelity and the tie-draw win counts."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_prune_quality import Fidelity, Geometry, beats, tie_seeds  # noqa: E402


def test_fidelity_from_the_gram_matrix_equals_the_direct_sums():
    """ĝ = Σ_kept m w g / Σ_kept m and g = Σ m g / Σ m summed over the parameters give the same cosine and
    relative error as the (n, n) Gram route; keeping every row with weights 1 is the full update itself."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 50, generator=generator, dtype=torch.float64)
    multiplicity = torch.tensor([1.0, 3.0, 1.0, 2.0, 1.0, 1.0, 4.0])
    keep = torch.tensor([True, True, False, True, False, False, True])
    weights = torch.rand(7, generator=generator, dtype=torch.float64) * 2
    mine = ((keep * multiplicity * weights)[:, None] * rows).sum(0) / (keep * multiplicity).sum()
    full = (multiplicity[:, None] * rows).sum(0) / multiplicity.sum()
    cosine, error = Geometry.of(rows, multiplicity).fidelity(keep, weights)
    assert cosine == pytest.approx(float(torch.nn.functional.cosine_similarity(mine, full, dim=0)), abs=1e-12)
    assert error == pytest.approx(float((mine - full).norm() / full.norm()), abs=1e-12)
    everything = Geometry.of(rows, multiplicity).fidelity(torch.ones(7, dtype=torch.bool), torch.ones(7))
    assert everything[0] == pytest.approx(1.0, abs=1e-12) and everything[1] == pytest.approx(0.0, abs=1e-6)


def test_beats_counts_batches_by_their_draw_means_and_pairs_across_draws():
    """Batch 1: mine 0.9, 0.7 (mean 0.8) vs theirs 0.85, 0.85: the mean loses, 2 of 4 pairs win. Batch 2: mine
    0.95 twice vs 0.9, 0.99: the mean 0.95 beats 0.945, 2 of 4 pairs win. Errors: equal means lose (0.2, 0.5)."""
    per_batch = [{"mine": Fidelity([0.9, 0.7], [0.1, 0.3], 0.5), "theirs": Fidelity([0.85, 0.85], [0.2, 0.2], 0.5)},
                 {"mine": Fidelity([0.95, 0.95], [0.5, 0.5], 0.5), "theirs": Fidelity([0.9, 0.99], [0.4, 0.6], 0.5)}]
    assert beats(per_batch, "mine", "theirs") == (1, 4 / 8)
    assert beats(per_batch, "mine", "theirs", nearer=True) == (0, 4 / 8)
    per_batch[1]["mine"] = Fidelity([0.8, 0.8], [0.45, 0.45], 0.5)  # now loses on cosine, wins on error
    assert beats(per_batch, "mine", "theirs") == (0, 2 / 8)
    assert beats(per_batch, "mine", "theirs", nearer=True) == (1, 4 / 8)


def test_tie_seeds_start_at_the_batch_seed_and_do_not_repeat():
    assert tie_seeds(100, 1) == [100]
    seeds = [s for batch in range(100, 106) for s in tie_seeds(batch, 10)]
    assert tie_seeds(7, 10)[0] == 7 and len(set(seeds)) == len(seeds)
