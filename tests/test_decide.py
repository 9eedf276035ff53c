"""The step decision shared by the trainer and the TRL plug-in (algo.decide): capabilities from the registry, the
merge, the given advantages, and group statistics equal to the store's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.decide import decide_step, group_outcome
from fastrl_core.algo.groups import Reason
from fastrl_core.algo.pruners import PRUNERS
from fastrl_core.algo.group_stats import group_stats


def _batch(seed: int = 0, groups: int = 4, per_group: int = 4, length: int = 5):
    generator = torch.Generator().manual_seed(seed)
    n = groups * per_group
    ids = torch.randint(3, 9, (n, length), generator=generator)
    mask = torch.ones(n, length, dtype=torch.bool)
    mask[::3, -2:] = False
    rewards = torch.randint(0, 2, (n,), generator=generator).float()
    return dict(rewards=rewards, group_ids=torch.arange(n) // per_group, num_groups=groups, completion_ids=ids,
                completion_mask=mask)


@pytest.mark.parametrize("pruner", [name for name in PRUNERS.names() if PRUNERS.get(name).reads_tokens])
def test_a_pruner_that_reads_tokens_gets_them_from_the_completions(pruner):
    decision = decide_step(**_batch(), advantage="group_normalized", sketches=None, pruner=pruner, keep_ratio=0.5, min_keep=1,
                           generator=torch.Generator().manual_seed(0), merge_duplicates=False)
    assert decision.keep_mask.any() and decision.keep_mask.shape == (16,)


def test_a_pruner_that_reads_sketches_refuses_to_run_without_them():
    with pytest.raises(ValueError, match="reads gradient sketches"):
        decide_step(**_batch(), advantage="group_normalized", sketches=None, pruner="fastrl", keep_ratio=0.5, min_keep=1,
                    generator=torch.Generator().manual_seed(0), merge_duplicates=False)


def test_given_advantages_are_used_as_they_are_and_copies_are_merged():
    batch = _batch()
    batch["completion_ids"][1] = batch["completion_ids"][0]  # row 1 copies row 0 (same group, same mask)
    batch["completion_mask"][1] = batch["completion_mask"][0]
    advantages = torch.linspace(-1, 1, 16)
    decision = decide_step(**batch, advantage=advantages, sketches=None, pruner="none", keep_ratio=1.0, min_keep=1,
                           generator=torch.Generator().manual_seed(0), merge_duplicates=True)
    assert torch.equal(decision.advantages, advantages)
    assert decision.multiplicity[0] == 2 and decision.multiplicity[1] == 0
    assert not decision.keep_mask[1] and decision.pruned.reasons[1] == int(Reason.DUPLICATE)
    assert decision.groups.kept.tolist() == [3, 4, 4, 4] and decision.groups.sampled.tolist() == [4] * 4


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_group_outcome_equals_the_stores_group_stats(data):
    n = data.draw(st.integers(0, 24))
    groups = data.draw(st.integers(1, 6))
    rewards = np.array(data.draw(st.lists(st.one_of(st.floats(-3, 3), st.just(float("nan"))), min_size=n,
                                          max_size=n)), dtype=np.float64)
    index = np.array(data.draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n)), dtype=np.int64)
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    ours = group_outcome(torch.from_numpy(rewards), torch.from_numpy(index), torch.from_numpy(keep), groups)
    store = group_stats(rewards, index, keep, groups)
    np.testing.assert_array_equal(ours.sampled.numpy(), store.sampled)
    np.testing.assert_array_equal(ours.kept.numpy(), store.kept)
    np.testing.assert_allclose(ours.reward_mean.numpy(), store.reward_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.reward_std.numpy(), store.reward_std, rtol=1e-9, atol=1e-12)
    assert ((ours.reward_std.numpy() == 0) == (store.reward_std == 0)).all()  # what "decided" reads
