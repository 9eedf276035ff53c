"""Group advantages: hand-computed values, a loop-over-groups reference, and hypothesis properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.advantages import ADVANTAGES, compute_advantages, group_mean_std

# Groups: id 7 -> rewards [1, 0, 5] (mean 2, unbiased std sqrt((1 + 4 + 9) / 2) = sqrt 7); ids -3 and 100 are
# size-1 groups. Ids are negative, non-contiguous and interleaved.
REWARDS = torch.tensor([1.0, 0.0, 1.0, 5.0, 3.0], dtype=torch.float64)
GROUP_IDS = torch.tensor([7, 7, -3, 7, 100])


def test_group_normalized_by_hand():
    s7 = math.sqrt(7)
    expected = torch.tensor([-1 / s7, -2 / s7, 0.0, 3 / s7, 0.0], dtype=torch.float64)
    got = compute_advantages("group_normalized", REWARDS, GROUP_IDS, eps=0.0)
    torch.testing.assert_close(got, expected)


def test_group_normalized_eps_in_denominator():
    got = compute_advantages("group_normalized", REWARDS, GROUP_IDS, eps=0.5)
    assert got[0].item() == pytest.approx(-1 / (math.sqrt(7) + 0.5))


def test_mean_only_by_hand():
    got = compute_advantages("mean_only", REWARDS, GROUP_IDS)
    torch.testing.assert_close(got, torch.tensor([-1.0, -2.0, 0.0, 3.0, 0.0], dtype=torch.float64))


def test_batch_scaled_by_hand():
    # centred rewards [-1, -2, 0, 3, 0]; batch mean 0; unbiased var (1 + 4 + 9) / 4 = 3.5.
    got = compute_advantages("batch_scaled", REWARDS, GROUP_IDS, eps=0.0)
    expected = torch.tensor([-1.0, -2.0, 0.0, 3.0, 0.0], dtype=torch.float64) / math.sqrt(3.5)
    torch.testing.assert_close(got, expected)


def test_size_one_groups_and_single_rollout_batch_are_zero():
    rewards = torch.tensor([0.3, -2.0, 9.0])
    for name in ADVANTAGES.names():
        assert compute_advantages(name, rewards, torch.tensor([5, 1, 9]), eps=0.0).tolist() == [0.0, 0.0, 0.0]
        assert compute_advantages(name, rewards[:1], torch.tensor([4]), eps=0.0).tolist() == [0.0]


@pytest.mark.parametrize("name", ["group_normalized", "mean_only", "batch_scaled"])
def test_all_equal_rewards_give_exact_zero_even_with_eps_zero(name):
    # 0.1 * 3 / 3 != 0.1 in floating point: the estimator must not turn rounding into advantages.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7])
    got = compute_advantages(name, rewards, torch.tensor([2, 2, 2, 8, 8]), eps=0.0)
    assert got.tolist() == [0.0] * 5


def test_constant_group_beside_informative_group():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    got = compute_advantages("group_normalized", rewards, torch.tensor([0, 0, 0, 1, 1]), eps=0.0)
    s = math.sqrt(0.5)  # group 1: [0, 1], mean 0.5, unbiased std sqrt(0.5)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, 0.0, -0.5 / s, 0.5 / s], dtype=torch.float64))


def _loop_reference(name, rewards, group_ids, eps):
    """Plain Python over groups, for comparison with the vectorised estimators."""
    rewards = rewards.tolist()
    ids = group_ids.tolist()
    members = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    centred, std = [0.0] * len(rewards), [0.0] * len(rewards)
    for idx in members.values():
        values = [rewards[i] for i in idx]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        for i in idx:
            centred[i] = 0.0 if max(values) == min(values) else rewards[i] - mean
            std[i] = math.sqrt(var)
    if name == "mean_only":
        return centred
    if name == "batch_scaled":
        m = sum(centred) / len(centred)
        s = math.sqrt(sum((c - m) ** 2 for c in centred) / (len(centred) - 1)) if len(centred) > 1 else 0.0
        return [c / (s + eps) if s > 0 else 0.0 for c in centred]
    return [c / (s + eps) if s > 0 else 0.0 for c, s in zip(centred, std)]


@pytest.mark.parametrize("name", ["group_normalized", "mean_only", "batch_scaled"])
@pytest.mark.parametrize("seed", range(5))
def test_vectorised_matches_loop_reference(name, seed):
    gen = torch.Generator().manual_seed(seed)
    n = 40
    group_ids = torch.randint(-50, 50, (n,), generator=gen) * 3 + 1000  # sparse, arbitrary ids; sizes vary
    rewards = torch.randint(0, 4, (n,), generator=gen).to(torch.float64) / 2 + torch.rand(n, generator=gen).round()
    got = compute_advantages(name, rewards, group_ids, eps=1e-6)
    expected = torch.tensor(_loop_reference(name, rewards, group_ids, 1e-6), dtype=torch.float64)
    torch.testing.assert_close(got, expected)


def test_group_mean_std_by_hand():
    mean, std = group_mean_std(REWARDS, GROUP_IDS)
    torch.testing.assert_close(mean, torch.tensor([2.0, 2.0, 1.0, 2.0, 3.0], dtype=torch.float64))
    s7 = math.sqrt(7)
    torch.testing.assert_close(std, torch.tensor([s7, s7, 0.0, s7, 0.0], dtype=torch.float64))


def test_integer_rewards_are_accepted_and_empty_batch_is_empty():
    got = compute_advantages("mean_only", torch.tensor([1, 0, 0, 1]), torch.tensor([3, 3, 4, 4]))
    assert got.dtype.is_floating_point and got.tolist() == [0.5, -0.5, -0.5, 0.5]
    for name in ADVANTAGES.names():
        assert compute_advantages(name, torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


def test_bad_input_raises_clear_errors():
    with pytest.raises(KeyError, match="batch_scaled"):
        compute_advantages("z_score", REWARDS, GROUP_IDS)
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("mean_only", REWARDS, GROUP_IDS[:3])
    with pytest.raises(TypeError, match="integer"):
        compute_advantages("mean_only", REWARDS, GROUP_IDS.double())
    with pytest.raises(ValueError, match=r"indices \[1\]"):
        compute_advantages("mean_only", torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="eps"):
        compute_advantages("group_normalized", REWARDS, GROUP_IDS, eps=-1.0)


# --- Properties -------------------------------------------------------------------------------------------

batches = st.lists(
    st.tuples(st.integers(-5, 5), st.integers(0, 8).map(lambda k: k / 4)), min_size=1, max_size=40
)


def _tensors(batch):
    ids = torch.tensor([g for g, _ in batch])
    rewards = torch.tensor([r for _, r in batch], dtype=torch.float64)
    return rewards, ids


@settings(max_examples=150, deadline=None)
@given(batches)
def test_group_normalized_has_zero_mean_and_unit_unbiased_std_per_group(batch):
    rewards, ids = _tensors(batch)
    adv = compute_advantages("group_normalized", rewards, ids)
    for g in ids.unique():
        a, r = adv[ids == g], rewards[ids == g]
        assert abs(a.mean().item()) < 1e-9
        if r.numel() > 1 and r.std() > 0:
            assert a.std().item() == pytest.approx(1.0, abs=1e-4)  # std / (std + 1e-6); std >= 0.03 here
        else:
            assert (a == 0).all()


@settings(max_examples=150, deadline=None)
@given(batches)
def test_mean_only_sums_to_zero_per_group(batch):
    rewards, ids = _tensors(batch)
    adv = compute_advantages("mean_only", rewards, ids)
    for g in ids.unique():
        assert abs(adv[ids == g].sum().item()) < 1e-9
    torch.testing.assert_close(rewards - adv, group_mean_std(rewards, ids)[0])


@settings(max_examples=100, deadline=None)
@given(batches, st.integers(0, 2**31 - 1))
def test_estimators_are_permutation_equivariant_and_ignore_id_labels(batch, seed):
    rewards, ids = _tensors(batch)
    perm = torch.randperm(len(batch), generator=torch.Generator().manual_seed(seed))
    for name in ADVANTAGES.names():
        adv = compute_advantages(name, rewards, ids)
        torch.testing.assert_close(compute_advantages(name, rewards[perm], ids[perm]), adv[perm])
        torch.testing.assert_close(compute_advantages(name, rewards, ids * 1009 - 77), adv)


@settings(max_examples=100, deadline=None)
@given(batches)
def test_batch_scaled_has_unit_batch_std_and_keeps_group_signs(batch):
    rewards, ids = _tensors(batch)
    adv = compute_advantages("batch_scaled", rewards, ids)
    centred = compute_advantages("mean_only", rewards, ids)
    assert torch.equal(adv.sign(), centred.sign())
    if len(batch) > 1 and centred.std() > 0:
        assert adv.std().item() == pytest.approx(1.0, abs=1e-4)
