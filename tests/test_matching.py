"""Gradient matching (algo.matching) and fastrl's selection='matching': brute-force and scipy references, invariants."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import lsq_linear

from fastrl_core.algo.matching import box_least_squares, matching_pursuit
from fastrl_core.algo.pruners import GroupBatch, Reason, keep_counts, prune
from test_pruners import batch_of, batches, group_counts


def random_problem(seed: int, groups: int = 6, size: int = 6, dim: int = 5, collinear: bool = True):
    """u (G, M, D) with a near-duplicate and an exact duplicate column, multiplicities m, t = Σ m u."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(groups, size, dim, generator=gen, dtype=torch.float64)
    if collinear:
        u[:, 1] = u[:, 0] * (1 + 1e-9)
        u[:, 2] = u[:, 3]
    m = torch.randint(1, 4, (groups, size), generator=gen).double()
    t = (m[:, :, None] * u).sum(1)
    return u, m, t, u @ u.transpose(1, 2), (u * t[:, None]).sum(2)


def squared_error(u: torch.Tensor, t: torch.Tensor, rows: list[int], c: np.ndarray) -> float:
    return float(((u[rows].T.numpy() @ c - t.numpy()) ** 2).sum())


@pytest.mark.parametrize("seed", range(8))
def test_box_least_squares_equals_scipy(seed):
    u, m, t, gram, target_dot = random_problem(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    active = torch.rand(u.shape[:2], generator=gen) < 0.7
    upper = torch.rand(u.shape[:2], generator=gen, dtype=torch.float64) * 3
    c = box_least_squares(gram, target_dot, upper, active)
    assert (c[~active] == 0).all() and (c >= 0).all() and (c <= upper + 1e-12).all()
    for g in range(u.shape[0]):
        rows = active[g].nonzero().flatten().tolist()
        if not rows:
            continue
        reference = lsq_linear(u[g, rows].T.numpy(), t[g].numpy(), bounds=(0, upper[g, rows].numpy()), tol=1e-13).x
        best = squared_error(u[g], t[g], rows, reference)
        ours = squared_error(u[g], t[g], rows, c[g, rows].numpy())
        assert ours <= best + 1e-6 * max(best, float(t[g].square().sum()))


def test_box_least_squares_is_exact_when_the_bounds_allow_the_full_sum():
    """Every row active with room for its multiplicity: c = m reproduces t exactly (distinct directions)."""
    u, m, t, gram, target_dot = random_problem(3, collinear=False, dim=8)
    c = box_least_squares(gram, target_dot, m * 10, torch.ones_like(m, dtype=torch.bool), iterations=5000)
    assert torch.allclose(c, m, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_matching_pursuit_is_greedy_on_the_least_squares_error(seed):
    """Each pick is the candidate whose addition gives the lowest unconstrained least-squares error among those
    entering with a positive coefficient, i.e. the largest max(e·t, 0)² / ||e||²; brute force over candidates."""
    u, m, t, gram, target_dot = random_problem(seed, collinear=False)
    gen = torch.Generator().manual_seed(seed)
    candidates = torch.rand(u.shape[:2], generator=gen) < 0.8
    picks = torch.randint(1, 5, (u.shape[0],), generator=gen)
    selected, pick_gain, final_gain, spanned = matching_pursuit(gram, target_dot, candidates, picks)
    assert (selected.sum(1) == torch.minimum(picks, candidates.sum(1))).all()
    assert not (selected & ~candidates).any()
    for g in range(u.shape[0]):
        chosen: list[int] = []
        for _ in range(int(min(picks[g], candidates[g].sum()))):
            def gain(j):
                basis = u[g, chosen].T if chosen else torch.zeros(u.shape[2], 0, dtype=torch.float64)
                projector = basis @ torch.linalg.pinv(basis) if chosen else torch.zeros(u.shape[2], u.shape[2],
                                                                                         dtype=torch.float64)
                e = u[g, j] - projector @ u[g, j]
                return float(max(e @ t[g], 0.0) ** 2 / (e @ e))
            options = [j for j in candidates[g].nonzero().flatten().tolist() if j not in chosen]
            best = max(options, key=lambda j: (gain(j), -j))
            assert pick_gain[g, best] == pytest.approx(gain(best), rel=1e-6, abs=1e-9)
            chosen.append(best)
        assert set(chosen) == set(selected[g].nonzero().flatten().tolist())
        basis = u[g, chosen].T
        inside = basis @ torch.linalg.pinv(basis) @ u[g].T  # (D, M) projections on the span of the picks
        share = inside.square().sum(0) / u[g].square().sum(1)
        assert torch.allclose(spanned[g], share.clamp(0, 1), atol=1e-6)
        assert torch.isinf(final_gain[g, selected[g] | ~candidates[g]]).all()


def test_matching_without_sketches_is_top_multiplicity_times_advantage_at_weight_one():
    """Unit vectors: u_i = A_i e_i are orthogonal, so the gains are (m_i A_i)² and the fit gives c_j = m_j."""
    advantages = [1.5, -0.2, 0.4, -1.0, 0.0, -0.7]
    counts = torch.tensor([1.0, 3.0, 1.0, 1.0, 2.0, 1.0])
    batch = GroupBatch(torch.zeros(6, dtype=torch.long), torch.zeros(6), torch.tensor(advantages), None, None, counts)
    result = prune("fastrl", batch, keep_ratio=0.5, min_keep=1, selection="matching")
    # m|A|: 1.5, 0.6, 0.4, 1.0, 0, 0.7 -> the 3 largest of the 5 nonzero: rows 0, 3, 5
    assert result.keep_mask.tolist() == [True, False, False, True, False, True]
    kept_share = 3 / float(counts.sum())  # K / N
    assert torch.allclose(result.weights[result.keep_mask], torch.full((3,), kept_share))
    assert result.reasons[4] == Reason.ZERO_ADVANTAGE


def test_matching_transfers_a_dropped_rows_mass_to_the_rows_that_span_it():
    """Three rollouts; row 2's vector is exactly 2·(row 0's): keeping rows 0 and 1, the fit gives row 0 its own
    mass plus twice row 2's, and the kept update equals the full one."""
    sketches = [[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]]
    batch = batch_of([0, 0, 0], [1.0, 0.0, 1.0], advantages=[1.0, -1.0, 1.0], sketches=sketches)
    result = prune("fastrl", batch, keep_ratio=0.5, min_keep=2, selection="matching")
    assert result.keep_mask.tolist() == [True, True, False]
    assert result.reasons[2] == Reason.REDUNDANT
    full = sum(a * torch.tensor(s) for a, s in zip([1.0, -1.0, 1.0], sketches))
    kept = sum(w * a * torch.tensor(s) for w, a, s in zip(result.weights.tolist(), [1.0, -1.0, 1.0], sketches))
    assert torch.allclose(kept / (2 / 3), full, atol=1e-5)  # weights carry the K / N = 2/3 scale


@settings(max_examples=60, deadline=None)
@given(batch=batches(), keep_ratio=st.floats(0.05, 1.0), min_keep=st.integers(1, 4), with_counts=st.booleans())
def test_matching_invariants(batch, keep_ratio, min_keep, with_counts):
    """A = 0 never kept; between 1 and m rows per group with a nonzero advantage (m as the coreset's count); no kept
    row's effective advantage above its group's |A| mass; deterministic by generator; weights > 0 exactly where
    kept; every pick left out has reason REDUNDANT."""
    if with_counts:
        gen = torch.Generator().manual_seed(1)
        counts = torch.randint(1, 4, batch.group_ids.shape, generator=gen).float()
        batch = GroupBatch(batch.group_ids, batch.rewards, batch.advantages, batch.sketches, batch.token_ids, counts)
    counts = batch.counts if batch.counts is not None else torch.ones_like(batch.advantages)
    result = prune("fastrl", batch, keep_ratio=keep_ratio, min_keep=min_keep, selection="matching",
                   generator=torch.Generator().manual_seed(0))
    again = prune("fastrl", batch, keep_ratio=keep_ratio, min_keep=min_keep, selection="matching",
                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(result.keep_mask, again.keep_mask) and torch.equal(result.weights, again.weights)
    zero = batch.advantages.abs() <= 1e-6
    assert not result.keep_mask[zero].any()
    assert ((result.weights > 0) == result.keep_mask).all()
    kept_share = float((counts * result.keep_mask).sum() / counts.sum())
    for g, kept in group_counts(batch, result.keep_mask).items():
        in_group = batch.group_ids == g
        nonzero = in_group & ~zero
        signs = len(set(torch.sign(batch.advantages[nonzero]).tolist()))
        most = max(signs, int(keep_counts(torch.tensor([int(nonzero.sum())]), keep_ratio, min_keep)))
        assert (1 if nonzero.any() else 0) <= kept <= most
        mass = float((counts[nonzero] * batch.advantages[nonzero].abs()).sum())
        effective = counts * result.weights * batch.advantages.abs() / max(kept_share, 1e-30)
        assert (effective[in_group] <= mass * (1 + 1e-4) + 1e-6).all()


def test_matching_option_errors():
    good = batch_of([0, 0], [1.0, 0.0], sketches=[[1.0], [2.0]])
    for options in ({"balance": True}, {"mass": "own"}, {"similarity": "cosine"}):
        with pytest.raises(ValueError, match="belong to selection='coreset' or 'dpp'"):
            prune("fastrl", good, selection="matching", **options)
    with pytest.raises(ValueError, match="reweight and min_gain belong to selection='dpp'"):
        prune("fastrl", good, selection="matching", min_gain=-1.0)


def test_matching_keeps_the_full_update_when_it_keeps_every_distinct_direction():
    """keep_ratio 1: every nonzero row kept, each at its own weight K / N (the fit reproduces t exactly)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        sketches = torch.randn(6, 8, generator=gen)
        batch = batch_of([0, 0, 0, 1, 1, 1], [1.0, 0.0, 0.5, 1.0, 0.0, 0.0], sketches=sketches)
        result = prune("fastrl", batch, keep_ratio=1.0, min_keep=1, selection="matching")
        nonzero = batch.advantages.abs() > 1e-6
        assert torch.equal(result.keep_mask, nonzero)
        share = float(nonzero.sum()) / 6
        assert torch.allclose(result.weights[nonzero], torch.full((int(nonzero.sum()),), share), atol=1e-4)


def test_duplicates_stand_in_for_each_other():
    """Two identical completions (same sketch) and keep 1 of the sign: one is kept with both copies' mass."""
    sketches = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    batch = batch_of([0, 0, 0], [1.0, 1.0, 0.0], advantages=[0.5, 0.5, -1.0], sketches=sketches)
    result = prune("fastrl", batch, keep_ratio=0.1, min_keep=1, selection="matching",
                   generator=torch.Generator().manual_seed(0))
    assert int(result.keep_mask[:2].sum()) == 1 and bool(result.keep_mask[2])
    kept_share = 2 / 3
    positive = result.weights[:2].sum() / kept_share
    assert float(positive) == pytest.approx(2.0, rel=1e-4)  # the kept copy carries both
    assert result.reasons[:2].tolist().count(int(Reason.REDUNDANT)) == 1
