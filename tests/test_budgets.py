"""Budget controllers: the authors' RolloutSA by hand, adaptive behaviour by hand, and properties (bounds, JSON
round trip, no mutation) over random histories."""

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.budgets import BUDGETS, StepOutcome, budget_allocate, budget_init, budget_update, step_budget


def outcome(prompts, kept, *, sampled=None, mean=None, std=None, step=0, total=10, epoch_end=False) -> StepOutcome:
    g = len(prompts)
    return StepOutcome(
        prompt_ids=tuple(prompts),
        sampled=torch.tensor(sampled if sampled is not None else [8] * g),
        kept=torch.tensor(kept),
        reward_mean=torch.tensor(mean if mean is not None else [0.5] * g, dtype=torch.float32),
        reward_std=torch.tensor(std if std is not None else [0.5] * g, dtype=torch.float32),
        step=step, total_steps=total, epoch_end=epoch_end)


def test_fixed_allocates_n_everywhere():
    state = budget_init("fixed", n=5)
    assert budget_allocate("fixed", state, ["a", "b", "c"]) == [5, 5, 5]
    state = budget_update("fixed", state, outcome(["a"], [1]))
    assert budget_allocate("fixed", state, ["z"]) == [5]


def run_rollout_sa(n0: int, kept_per_step: list[list[int]], epoch_length: int = 2) -> list[int]:
    """n after each epoch, total_steps = number of steps."""
    state, prompts, after_epochs = budget_init("rollout_sa", n=n0), ["a", "b", "c"], []
    total = len(kept_per_step)
    for step, kept in enumerate(kept_per_step):
        end = (step + 1) % epoch_length == 0
        state = budget_update("rollout_sa", state, outcome(prompts, kept, step=step, total=total, epoch_end=end))
        if end:
            after_epochs.append(budget_allocate("rollout_sa", state, prompts)[0])
    return after_epochs


KEPT = [[4, 6, 2], [3, 5, 1], [2, 3, 1], [1, 3, 2], [0, 0, 1], [0, 0, 0]]


def test_rollout_sa_by_hand():
    """6 steps, epochs of 2.
    epoch 1: f1 = 4, 3; f2 = 6, 5; a = 2/6; f3 = 1/3·3.5 + 2/3·5.5 = 4.833; g1 = (3.5 + 5.5)/2 = 4.5;
             f3 >= g1: n = 8.
    epoch 2: f1 = 2, 2; f2 = 3, 3; a = 4/6; f3 = 2/3·2 + 1/3·3 = 2.333 < 4.5:
             n = round(8 − 2.167) = round(5.833) = 6.
    epoch 3: f1 = 1/3, 0; f2 = 1, 0; a = 1; f3 = 1/6: n = round(8 − 4.333) = round(3.667) = 4."""
    assert run_rollout_sa(8, KEPT) == [8, 6, 4]
    # the floor of 2: n0 = 3 gives round(0.833) = 1 -> 2 and round(-0.333) = 0 -> 2
    assert run_rollout_sa(3, KEPT) == [3, 2, 2]
    # Python's round halves to even: epoch 2 with f1 = f2 = 3 gives f3 = 3, n = round(8 − 1.5) = round(6.5) = 6
    assert run_rollout_sa(8, KEPT[:2] + [[3, 3, 3], [3, 3, 3]]) == [8, 6]
    state = budget_init("rollout_sa", n=8)
    for step, kept in enumerate(KEPT[:3]):
        state = budget_update("rollout_sa", state, outcome(["a", "b", "c"], kept, step=step, total=6,
                                                           epoch_end=step == 1))
    assert state["g1"] == 4.5 and state["f1"] == [2.0] and state["f2"] == [3.0] and state["epochs"] == 1


def test_adaptive_unseen_prompts_get_n_and_first_budget_is_n_per_prompt():
    state = budget_init("adaptive", n=8)
    assert budget_allocate("adaptive", state, ["a", "b"]) == [8, 8]
    state = budget_update("adaptive", state, outcome(["a", "b"], [2, 4]))
    assert budget_allocate("adaptive", state, ["new"]) == [8]
    assert sum(budget_allocate("adaptive", state, ["a", "b"])) == 16  # target 3 kept / rate 6/16 = 8 per prompt


def test_adaptive_unseen_prompts_share_the_step_budget():
    """target_kept 2 per prompt at a kept rate of 8/32 = 0.25: budget 2·2/0.25 = 16 for 2 prompts -> 8 each; with a
    kept rate of 16/32 = 0.5 the same target needs only 4 per prompt, for unseen prompts too (first epoch)."""
    state = budget_init("adaptive", n=8, target_kept=2.0)
    state = budget_update("adaptive", state, outcome(["a", "b", "c", "d"], [2, 2, 2, 2]))
    assert budget_allocate("adaptive", state, ["x", "y"]) == [8, 8]
    state = budget_init("adaptive", n=8, target_kept=2.0)
    state = budget_update("adaptive", state, outcome(["a", "b", "c", "d"], [4, 4, 4, 4]))
    assert budget_allocate("adaptive", state, ["x", "y"]) == [4, 4]
    assert budget_allocate("adaptive", state, ["a", "x"]) == [4, 4]  # seen prompts of equal value share alike


def test_adaptive_step_budget_tracks_the_kept_rate():
    """Step 1: 4 prompts × 8, 8 kept: target_kept = 2 per prompt, rate 0.25 -> budget 4·2/0.25 = 32.
    Step 2: rate 4/32 = 0.125 -> EMA 0.8·0.25 + 0.2·0.125 = 0.225 -> budget round(8 / 0.225) = round(35.56) = 36."""
    prompts = ["a", "b", "c", "d"]
    state = budget_update("adaptive", budget_init("adaptive", n=8), outcome(prompts, [2, 2, 2, 2]))
    assert state["target_kept"] == 2.0 and state["kept_rate"] == 0.25
    assert step_budget(state, 4) == 32
    state = budget_update("adaptive", state, outcome(prompts, [1, 1, 1, 1]))
    assert state["kept_rate"] == pytest.approx(0.225)
    assert step_budget(state, 4) == 36
    assert sum(budget_allocate("adaptive", state, prompts)) == 36
    assert step_budget(state, 4) <= 4 * 16  # n_max = 2n bounds it


def test_adaptive_gives_uncertain_prompts_more_than_solved_ones():
    """"mixed" had rewards of std 0.5 (p = 1/2 for 0/1 rewards); "solved" was all-correct three times (streak 3);
    "hard" all-wrong once. The uncertain prompt gets the most, the streak prompt the least."""
    state = budget_init("adaptive", n=8, reward_scale=1.0)
    for step in range(3):
        state = budget_update("adaptive", state, outcome(
            ["mixed", "solved", "hard"], [4, 0, 0], mean=[0.5, 1.0, 0.0], std=[0.5, 0.0, 0.0], step=step))
    assert state["prompts"]["solved"]["streak"] == 3 and state["prompts"]["mixed"]["streak"] == 0
    counts = dict(zip(["mixed", "solved", "hard"], budget_allocate("adaptive", state, ["mixed", "solved", "hard"])))
    assert counts["mixed"] > counts["hard"] >= counts["solved"] >= 2


def test_adaptive_learned_reward_scale():
    state = budget_init("adaptive", n=4)
    state = budget_update("adaptive", state, outcome(["a", "b"], [1, 1], mean=[0.5, 1.5], std=[0.0, 0.3]))
    assert (state["min_mean"], state["max_mean"]) == (0.5, 1.5)
    assert state["max_std"] == pytest.approx(0.3)


@st.composite
def histories(draw):
    n = draw(st.integers(1, 10))
    params = {"n": n, "n_min": draw(st.integers(1, n)), "n_max": draw(st.integers(n, 20)),
              "memory": draw(st.floats(0, 0.95)), "rate_memory": draw(st.floats(0, 0.95)),
              "streak_discount": draw(st.floats(0.05, 1.0)),
              "target_kept": draw(st.one_of(st.none(), st.floats(0.1, 12))),
              "reward_scale": draw(st.one_of(st.none(), st.floats(0.1, 3)))}
    steps = []
    pool = [f"p{i}" for i in range(8)]
    for _ in range(draw(st.integers(1, 6))):
        prompts = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6))
        seeds = draw(st.lists(st.integers(0, 10**6), min_size=len(prompts), max_size=len(prompts)))
        steps.append((prompts, seeds))
    return params, steps


@settings(max_examples=80, deadline=None)
@given(history=histories(), controller=st.sampled_from(["fixed", "rollout_sa", "adaptive"]))
def test_controllers_are_bounded_resumable_and_pure(history, controller):
    params, steps = history
    if controller != "adaptive":
        params = {"n": max(params["n"], 2)}
    low, high = (params["n_min"], params["n_max"]) if controller == "adaptive" else (2, params["n"])
    state = budget_init(controller, **params)
    for step, (prompts, seeds) in enumerate(steps):
        counts = budget_allocate(controller, state, prompts)
        assert len(counts) == len(prompts) and all(low <= c <= high for c in counts)
        assert all(isinstance(c, int) for c in counts)
        resumed = json.loads(json.dumps(state))
        assert resumed == state and budget_allocate(controller, resumed, prompts) == counts
        kept, mean, std = [], [], []
        for count, seed in zip(counts, seeds):
            gen = torch.Generator().manual_seed(seed)
            kept.append(int(torch.randint(0, count + 1, (), generator=gen)))
            mean.append(float(torch.rand((), generator=gen)) * 1.5)
            std.append(0.0 if seed % 3 == 0 else float(torch.rand((), generator=gen)) * 0.75)
        result = outcome(prompts, kept, sampled=counts, mean=mean, std=std, step=step, total=len(steps),
                         epoch_end=seed % 2 == 0)
        before = copy.deepcopy(state)
        new_state = budget_update(controller, state, result)
        assert state == before  # the input is not mutated
        assert json.loads(json.dumps(new_state)) == new_state
        assert budget_update(controller, resumed, result) == new_state  # resuming gives the same trajectory
        state = new_state


def test_bad_input_names_the_problem():
    with pytest.raises(KeyError, match="unknown budget controller 'nope'"):
        budget_init("nope")
    with pytest.raises(TypeError, match="budget controller 'fixed'.*unexpected keyword argument 'n_min'"):
        budget_init("fixed", n=4, n_min=2)
    with pytest.raises(ValueError, match="n_min <= n <= n_max"):
        budget_init("adaptive", n=4, n_min=5)
    with pytest.raises(ValueError, match="memory out of range"):
        budget_init("adaptive", memory=1.0)
    with pytest.raises(ValueError, match="rollout_sa"):
        budget_init("rollout_sa", n=1)
    state = budget_init("fixed", n=4)
    with pytest.raises(ValueError, match="belongs to controller 'fixed', not 'adaptive'"):
        budget_allocate("adaptive", state, ["a"])
    with pytest.raises(ValueError, match=r"StepOutcome.kept must be \(2,\)"):
        budget_update("fixed", state, outcome(["a", "b"], [1]))
    with pytest.raises(ValueError, match=r"0 <= kept <= sampled; not so for prompts \['b'\]"):
        budget_update("fixed", state, outcome(["a", "b"], [1, 9]))


def test_registry_lists_every_controller():
    assert BUDGETS.names() == ["adaptive", "fixed", "rollout_sa"]
