"""Budget controllers: the authors' RolloutSA and the paper's ARS by hand, GRESO and adaptive by hand and by
their draw frequencies, properties (bounds, JSON round trip, no mutation) over random histories, and a short real
training run with skipped prompts."""

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.baseline_budgets import greso_skip_probability
from fastrl_core.algo.budget_base import PromptOutcomes, uniform_draw
from fastrl_core.algo.budgets import (BUDGETS, budget_allocate, budget_init, budget_update, fitted_prior,
                                      informative_count, mixed_chance)


def outcome(prompts, kept, *, sampled=None, mean=None, std=None, step=0, total=10, epoch_end=False,
            accuracy=None) -> PromptOutcomes:
    g = len(prompts)
    return PromptOutcomes(
        prompt_ids=tuple(prompts),
        sampled=torch.tensor(sampled if sampled is not None else [8] * g),
        kept=torch.tensor(kept),
        reward_mean=torch.tensor(mean if mean is not None else [0.5] * g, dtype=torch.float32),
        reward_std=torch.tensor(std if std is not None else [0.5] * g, dtype=torch.float32),
        step=step, total_steps=total, epoch_end=epoch_end,
        accuracy_mean=None if accuracy is None else torch.tensor(accuracy, dtype=torch.float32))


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



def test_rollout_sa_paper_by_hand():
    """The same 6 steps as test_rollout_sa_by_hand, the paper's Eqs. 10–14 (max over the epoch's questions).
    epoch 1: mean = 21/6 = 3.5, max = 6; a = 2/6: G' = 1/3·3.5 + 2/3·6 = 5.167; ref = (3.5 + 6)/2 = 4.75: n = 8.
    epoch 2: mean = 12/6 = 2, max = 3; a = 4/6: G' = 2/3·2 + 1/3·3 = 2.333 < 4.75: n = round(8 − 2.417) = 6.
    epoch 3: mean = 1/6, max = 1; a = 1: G' = 1/6: n = round(8 − 4.583) = round(3.417) = 3 (the authors' rule: 4)."""
    state, after = budget_init("rollout_sa_paper", n=8), []
    for step, kept in enumerate(KEPT):
        end = step % 2 == 1
        state = budget_update("rollout_sa_paper", state, outcome(["a", "b", "c"], kept, step=step, total=6,
                                                                 epoch_end=end))
        if end:
            after.append(budget_allocate("rollout_sa_paper", state, ["a", "b", "c"])[0])
        if step == 1:
            assert state["g_ref"] == pytest.approx(4.75) and state["g_t"] == pytest.approx(31 / 6)
    assert after == [8, 6, 3]
    assert run_rollout_sa(8, KEPT) == [8, 6, 4]
    # skipped prompts (sampled 0) are not questions of the epoch
    state = budget_update("rollout_sa_paper", budget_init("rollout_sa_paper", n=8),
                          outcome(["a", "b"], [4, 0], sampled=[8, 0], epoch_end=True, step=0, total=4))
    assert state["g_ref"] == pytest.approx(4.0)


# ----------------------------------------------------------------------------------------------- greso


def test_uniform_draw_is_a_pure_uniform_hash():
    assert uniform_draw(0, 3, "p1") == uniform_draw(0, 3, "p1")
    assert len({uniform_draw(0, 3, "p1"), uniform_draw(1, 3, "p1"), uniform_draw(0, 4, "p1"),
                uniform_draw(0, 3, "p2")}) == 4
    draws = torch.tensor([uniform_draw(7, 0, f"q{i}") for i in range(4000)])
    assert ((draws >= 0) & (draws < 1)).all()
    assert abs(draws.mean().item() - 0.5) < 0.02 and abs((draws < 0.25).double().mean().item() - 0.25) < 0.03


def greso_state(streaks: dict[str, tuple[int, bool]], p_easy=0.5, p_hard=0.5, seed=0, step=0) -> dict:
    state = budget_init("greso", n=8, p_easy=p_easy, p_hard=p_hard, seed=seed)
    state["prompts"] = {k: {"streak": z, "easy": easy} for k, (z, easy) in streaks.items()}
    state["next_step"] = step
    return state


def test_greso_skips_with_probability_one_minus_p_to_the_streak():
    """1 − p_e^z: z = 0 never, z = 1 at p 0.5 half the time, z = 2 three quarters; p_easy for prompts last seen
    all-correct, p_hard for all-wrong. Unseen prompts are never skipped."""
    assert greso_skip_probability(0, 0.5) == 0.0 and greso_skip_probability(2, 0.5) == 0.75
    assert greso_skip_probability(3, 0.1) == pytest.approx(0.999)
    ids = [f"q{i}" for i in range(3000)]
    for streak, easy, expected in ((0, True, 0.0), (1, True, 0.5), (2, True, 0.75), (2, False, 1 - 0.9**2)):
        state = greso_state({q: (streak, easy) for q in ids}, p_easy=0.5, p_hard=0.9)
        counts = budget_allocate("greso", state, ids)
        assert set(counts) <= {0, 8}
        assert abs(counts.count(0) / len(ids) - expected) < 0.03, (streak, easy)
        assert counts == [0 if uniform_draw(0, 0, q) < expected else 8 for q in ids]
    assert budget_allocate("greso", greso_state({}), ["new1", "new2"]) == [8, 8]


def test_greso_keeps_one_prompt_when_all_would_be_skipped():
    state = greso_state({"a": (5, True), "b": (5, True)}, p_easy=0.0)  # skip probability 1
    counts = budget_allocate("greso", state, ["a", "b"])
    assert sorted(counts) == [0, 8]
    state["params"]["min_prompts"] = 2
    assert budget_allocate("greso", state, ["a", "b"]) == [8, 8]


def test_greso_update_streaks_and_exploration_probabilities():
    """Step 0 (first epoch, ends it): "easy" all-correct, "hard" all-wrong, "mixed" varied: streaks 1, 1, 0; no
    change of p before an epoch has passed. Step 1: 4 sampled groups, 1 all-correct (share 0.25 >= α/3 = 0.083:
    p_easy 0.5 -> 0.49) and 0 all-wrong (0 < 2α/3 = 0.167: p_hard 0.5 -> 0.51); "hard" was skipped (sampled 0):
    its streak stays 1; "easy" again all-correct: streak 2; "mixed" varied: 0."""
    prompts = ["easy", "hard", "mixed"]
    state = budget_init("greso", n=8)
    state = budget_update("greso", state, outcome(prompts, [0, 0, 4], mean=[1.5, 0.5, 1.0], std=[0, 0, 0.5],
                                                  step=0, epoch_end=True, accuracy=[1.0, 0.0, 0.5]))
    assert [state["prompts"][p]["streak"] for p in prompts] == [1, 1, 0]
    assert state["prompts"]["easy"]["easy"] and not state["prompts"]["hard"]["easy"]
    assert (state["p_easy"], state["p_hard"], state["epochs"], state["next_step"]) == (0.5, 0.5, 1, 1)
    step1 = outcome(prompts + ["other"], [0, 0, 4, 4], sampled=[8, 0, 8, 8], mean=[1.5, 0, 1.0, 1.0],
                    std=[0, 0, 0.5, 0.5], step=1, accuracy=[1.0, 0.0, 0.5, 0.5])
    state = budget_update("greso", state, step1)
    assert [state["prompts"][p]["streak"] for p in prompts] == [2, 1, 0]
    assert state["p_easy"] == pytest.approx(0.49) and state["p_hard"] == pytest.approx(0.51)
    # without accuracy_mean, a zero-variance group is easy if its reward mean is above the middle of the range
    state = budget_update("greso", budget_init("greso", n=8),
                          outcome(["lo", "hi", "mid"], [0, 0, 2], mean=[0.0, 1.5, 0.9], std=[0, 0, 0.4]))
    assert not state["prompts"]["lo"]["easy"] and state["prompts"]["hi"]["easy"]


def test_greso_exploration_probability_stays_within_bounds():
    state = budget_init("greso", n=4, p_min=0.05, p_max=0.95)
    state["epochs"], state["p_easy"], state["p_hard"] = 1, 0.055, 0.945
    all_easy = outcome(["a", "b"], [0, 0], sampled=[4, 4], mean=[1.5, 1.5], std=[0, 0], accuracy=[1.0, 1.0])
    state = budget_update("greso", state, all_easy)
    state = budget_update("greso", state, all_easy)
    assert state["p_easy"] == 0.05 and state["p_hard"] == 0.95


# ----------------------------------------------------------------------------------------------- adaptive


def test_informative_count_by_hand():
    """1 − p^k − (1 − p)^k: p = 1/2 gives 0.75, 0.875, 0.9375 at k = 3, 4, 5.
    p = 0.1, k = 8: 1 − 0.430 − 1e-8 = 0.570 < 0.9: all 8."""
    assert informative_count(0.5, 0.9, 2, 8) == 5
    assert informative_count(0.5, 0.875, 2, 8) == 4
    assert informative_count(0.5, 0.75, 2, 8) == 3
    assert informative_count(0.1, 0.9, 2, 8) == 8
    assert informative_count(0.3, 0.9, 2, 8) == 7  # k = 6: 0.882, k = 7: 0.918


def test_adaptive_by_hand():
    """Step 0, reward_scale 1, 8 rollouts each: "mixed" std 0.5: sumsq = 8·0.25 = 2, dof 7, prior 2 dof at 1/6:
    variance (2 + 1/3) / 9 = 0.259 -> p(1−p) = 0.25 (capped) -> p = 1/2 -> 5 rollouts (target 0.9);
    "solved" and "hard" zero variance: streak 1 -> always probed with n_min = 2; "new" unseen: 8. Total 17 of 32.
    "pruned" had reward variance but nothing survived pruning (kept 0): decided as well. By default (no
    informative_target) "mixed" keeps all 8."""
    state = budget_init("adaptive", n=8, reward_scale=1.0, informative_target=0.9)
    state = budget_update("adaptive", state, outcome(["mixed", "solved", "hard", "pruned"], [4, 0, 0, 0],
                                                     mean=[0.5, 1.0, 0.0, 0.5], std=[0.5, 0.0, 0.0, 0.5]))
    assert [state["prompts"][p]["streak"] for p in ("mixed", "solved", "hard", "pruned")] == [0, 1, 1, 1]
    counts = budget_allocate("adaptive", state, ["mixed", "solved", "hard", "new"])
    assert counts == [5, 2, 2, 8]
    default = {**state, "params": {**state["params"], "informative_target": None}}
    assert budget_allocate("adaptive", default, ["mixed", "solved", "hard", "new"]) == [8, 2, 2, 8]
    # a second decided visit (the probe of 2 was all equal again): streak 2, probed with probability 1/2
    state = budget_update("adaptive", state, outcome(["solved"], [0], sampled=[2], mean=[1.0], std=[0.0], step=1))
    assert state["prompts"]["solved"]["streak"] == 2 and state["next_step"] == 2
    expected = 0 if uniform_draw(0, 2, "solved") < 0.5 else 2
    assert budget_allocate("adaptive", state, ["solved"]) == [expected]
    # a visit with reward variance resets the streak
    state = budget_update("adaptive", state, outcome(["solved"], [1], sampled=[2], mean=[0.5], std=[0.5], step=2))
    assert state["prompts"]["solved"]["streak"] == 0 and budget_allocate("adaptive", state, ["solved"])[0] >= 2


def test_adaptive_uses_the_accuracy_rate_and_accuracy_decided_visits():
    """With accuracies (8 rollouts each, prior 2 pseudo observations at 1/2): "fmt" was all correct but its format
    reward varied (std 0.2): decided (streak 1) -> a probe of 2. "three" had 3 of 8 correct: p = (3 + 1)/(8 + 2)
    = 0.4: k = 4 gives 1 − 0.0256 − 0.1296 = 0.845, k = 5 gives 0.912 >= 0.9 -> 5. Without decided_by_accuracy
    "fmt" is mixed with p = (8 + 1)/10 = 0.9: 1 − 0.9^8 − 1e-8 = 0.57 -> all 8."""
    step = outcome(["fmt", "three"], [4, 4], mean=[1.4, 0.9], std=[0.2, 0.48], accuracy=[1.0, 0.375])
    state = budget_update("adaptive", budget_init("adaptive", n=8, informative_target=0.9), step)
    assert state["prompts"]["fmt"]["streak"] == 1 and state["prompts"]["three"]["streak"] == 0
    assert state["prompts"]["three"]["hits"] == pytest.approx(3.0) and state["prompts"]["three"]["trials"] == 8.0
    assert budget_allocate("adaptive", state, ["fmt", "three"]) == [2, 5]
    state = budget_update("adaptive", budget_init("adaptive", n=8, informative_target=0.9,
                                                  decided_by_accuracy=False), step)
    assert budget_allocate("adaptive", state, ["fmt", "three"]) == [8, 5]


def test_adaptive_probe_frequency_decays_to_the_floor():
    """Streak z is probed with probability max(0.5^(z−1), 0.1): 1, 0.5, 0.25, 0.125, then the floor 0.1."""
    ids = [f"q{i}" for i in range(3000)]
    for streak, expected in ((1, 1.0), (2, 0.5), (3, 0.25), (4, 0.125), (9, 0.1)):
        state = budget_init("adaptive", n=8)
        state["prompts"] = {q: {"sumsq": 0.0, "dof": 7.0, "streak": streak, "seen": streak, "kept": 0} for q in ids}
        counts = budget_allocate("adaptive", state, ids)
        assert set(counts) <= {0, 2}
        assert abs(counts.count(2) / len(ids) - expected) < 0.03, streak


def test_adaptive_decided_after_two_samples_a_first_decided_visit_in_full_then_probes():
    """decided_after=2: one all-correct group of 8 leaves the prompt sampled in full (8); the second in a row makes
    it decided: probed with 2 (always, as streak 1 is with the default), then at 0.5, 0.25, ... as before. A visit
    with variance resets the count. decided_after=1 is the default rule; 2 is the `fastrl_decided2` recipe."""
    ids = [f"q{i}" for i in range(3000)]
    state = budget_init("adaptive", n=8, decided_after=2)
    state = budget_update("adaptive", state, outcome(["q"], [0], mean=[1.0], std=[0.0], accuracy=[1.0]))
    assert state["prompts"]["q"]["streak"] == 1 and budget_allocate("adaptive", state, ["q"]) == [8]
    state = budget_update("adaptive", state, outcome(["q"], [0], mean=[1.0], std=[0.0], accuracy=[1.0], step=1))
    assert budget_allocate("adaptive", state, ["q"]) == [2]
    state = budget_update("adaptive", state, outcome(["q"], [1], sampled=[2], mean=[0.5], std=[0.5],
                                                     accuracy=[0.5], step=2))
    assert budget_allocate("adaptive", state, ["q"]) == [8]
    assert budget_allocate("adaptive", budget_update("adaptive", budget_init("adaptive", n=8), outcome(
        ["q"], [0], mean=[1.0], std=[0.0], accuracy=[1.0])), ["q"]) == [2]
    for streak, expected in ((2, 1.0), (3, 0.5), (4, 0.25)):
        state = budget_init("adaptive", n=8, decided_after=2)
        state["prompts"] = {q: {"sumsq": 0.0, "dof": 7.0, "streak": streak, "seen": streak, "kept": 0} for q in ids}
        counts = budget_allocate("adaptive", state, ids)
        assert set(counts) <= {0, 2} and abs(counts.count(2) / len(ids) - expected) < 0.03, streak
    old = budget_init("adaptive", n=8)  # a state saved before the parameter existed reads as decided_after=1
    del old["params"]["decided_after"]
    old["prompts"] = {"q": {"sumsq": 0.0, "dof": 7.0, "streak": 1, "seen": 1, "kept": 0}}
    assert budget_allocate("adaptive", old, ["q"]) == [2]
    with pytest.raises(ValueError, match="decided_after"):
        budget_init("adaptive", n=8, decided_after=0)


def test_mixed_chance_and_fitted_prior_by_hand():
    """Beta(1, 1): E p^k = 1/(k + 1), so P(mixed) = 1 − 2/(k + 1); Beta(2, 1), k = 2: 1 − 2·3/(3·4) − 1·2/(3·4) = 1/3.
    The prior fitted to groups that are all correct or all wrong, half each (x̄ = 0 or 1, n = 8): m = 1/2,
    Σ(x̄ − m)² = N/4, so ρ = (N/4 − N/32) / (N/4 − N/32) = 1, held at 0.99; to groups of exactly 4 of 8:
    Σ(x̄ − m)² = 0, ρ < 0, held at 0.01 (a prior worth 99 rollouts); uniform before two groups."""
    assert [round(mixed_chance(1, 1, k), 12) for k in (1, 2, 3, 7)] == [0, round(1 / 3, 12), 0.5, 0.75]
    assert mixed_chance(2, 1, 2) == pytest.approx(1 / 3)
    extreme = {"groups": 10.0, "sum": 5.0, "sumsq": 5.0, "inv_size": 10 / 8}
    a, b = fitted_prior(extreme)
    assert a == pytest.approx(0.5 / 99) and b == pytest.approx(0.5 / 99)
    middle = {"groups": 10.0, "sum": 5.0, "sumsq": 2.5, "inv_size": 10 / 8}
    assert fitted_prior(middle) == pytest.approx((49.5, 49.5))
    assert fitted_prior({"groups": 1.0, "sum": 1.0, "sumsq": 1.0, "inv_size": 0.125}) == (1.0, 1.0)


def test_adaptive_probe_target_probes_small_where_all_equal_groups_are_chance_and_in_full_where_not():
    """probe_target=0.5 (the `fastrl_probe_fit` recipe): a prompt decided by one all-correct group of 8 is probed
    with the fewest rollouts whose chance of a mixed group reaches 1/2 under the prior fitted to the run's groups.
    Among groups of 3–5 correct of 8 (paper-like) the prior pulls 8/8 back toward 1/2: 3 rollouts (2 cannot reach
    it: 2p(1 − p) <= 1/2). Among groups all correct or all wrong (paper-wide-like, late) it believes 8/8: P(mixed) stays under
    1/2 for every k <= 8, so all 8. Without the parameter, or without accuracies, the probe is n_min, as before;
    a state saved before the parameter (no "population") allocates as before."""
    def decided_probe(population_means, probe_target=0.5, accuracy=True):
        state = budget_init("adaptive", n=8, probe_target=probe_target)
        others = [f"o{i}" for i in range(len(population_means))]
        state = budget_update("adaptive", state, outcome(
            others, [4] * len(others), mean=population_means, std=[0.4] * len(others),
            accuracy=population_means if accuracy else None))
        state = budget_update("adaptive", state, outcome(["q"], [0], mean=[1.0], std=[0.0], step=1,
                                                         accuracy=[1.0] if accuracy else None))
        return budget_allocate("adaptive", state, ["q"])[0], state

    middle = [0.375, 0.5, 0.625] * 20
    extreme = [0.0, 1.0] * 30
    assert decided_probe(middle)[0] == 3
    assert decided_probe(extreme)[0] == 8
    assert decided_probe(extreme, probe_target=None)[0] == 2
    assert decided_probe(extreme, accuracy=False)[0] == 2  # no accuracies: n_min
    _, state = decided_probe(extreme)
    assert state["population"]["groups"] == 61  # the 60 groups and q's
    assert json.loads(json.dumps(state)) == state
    old = copy.deepcopy(state)
    del old["population"], old["params"]["probe_target"]
    assert budget_allocate("adaptive", old, ["q"]) == [2]
    with pytest.raises(ValueError, match="probe_target"):
        budget_init("adaptive", n=8, probe_target=1.0)


@pytest.mark.parametrize("with_accuracy", [False, True])
@pytest.mark.parametrize("target", [None, 0.9])
def test_adaptive_cuts_generation_in_a_revisited_regime(with_accuracy, target):
    """Simulated paper-like regime: 64 prompts of fixed success rates (a third solved, a third hopeless, a third
    at 1/2) visited 12 times, 0/1 rewards (= accuracies) drawn from the counts the controller gives, with and
    without PromptOutcomes.accuracy_mean. GRPO samples 8 each visit;
    adaptive samples at least 25 % fewer (decided prompts are probed rarely; 40 % with mixed ones cut to 5 at
    informative_target 0.9), and its step total falls over the run; mixed prompts keep 8 by default."""
    gen = torch.Generator().manual_seed(0)
    rates = [1.0] * 21 + [0.0] * 21 + [0.5] * 22
    prompts = [f"p{i}" for i in range(64)]
    state, totals, mixed = budget_init("adaptive", n=8, informative_target=target), [], []
    for visit in range(12):
        counts = budget_allocate("adaptive", state, prompts)
        totals.append(sum(counts))
        mixed += counts[42:] if visit else []
        mean, std = [], []
        for rate, count in zip(rates, counts):
            rewards = (torch.rand(max(count, 1), generator=gen) < rate).double()
            mean.append(rewards.mean().item())
            std.append(rewards.std(unbiased=False).item() if count else 0.0)
        kept = [c // 2 if s > 0 else 0 for c, s in zip(counts, std)]
        state = budget_update("adaptive", state, outcome(prompts, kept, sampled=counts, mean=mean, std=std,
                                                         step=visit, total=12,
                                                         accuracy=mean if with_accuracy else None))
    assert totals[0] == 64 * 8
    assert sum(totals) <= (0.6 if target else 0.75) * 12 * 64 * 8
    assert totals[-1] < totals[1] < totals[0]
    if target is None:  # a p = 1/2 prompt is all-equal in 8 with chance 1/128: then probed, else it keeps 8
        assert mixed.count(8) >= 0.9 * len(mixed) and set(mixed) <= {0, 2, 8}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 12), prompts=st.integers(1, 20))
def test_adaptive_decided_prompts_get_fewer_and_the_total_only_falls(seed, n, prompts):
    """After one random step: counts are 0 or within [n_min, n], total <= n·P, every decided prompt gets at most
    n_min, no more than any mixed prompt; turning a mixed prompt decided never raises the step total."""
    gen = torch.Generator().manual_seed(seed)
    ids = [f"p{i}" for i in range(prompts)]
    std = torch.where(torch.rand(prompts, generator=gen) < 0.4, 0.0, torch.rand(prompts, generator=gen) * 0.75)
    state = budget_init("adaptive", n=n, n_min=2)
    state = budget_update("adaptive", state, outcome(ids, [n // 2] * prompts, sampled=[n] * prompts,
                                                     mean=torch.rand(prompts, generator=gen).tolist(),
                                                     std=std.tolist()))
    counts = budget_allocate("adaptive", state, ids)
    assert sum(counts) <= n * prompts and all(c == 0 or 2 <= c <= n for c in counts)
    decided = [c for c, s in zip(counts, std.tolist()) if s == 0]
    mixed = [c for c, s in zip(counts, std.tolist()) if s > 0]
    assert all(c <= 2 for c in decided) and (not decided or not mixed or max(decided) <= min(mixed))
    if mixed:
        first_mixed = ids[std.tolist().index(next(s for s in std.tolist() if s > 0))]
        more = copy.deepcopy(state)
        more["prompts"][first_mixed]["streak"] = 1
        assert sum(budget_allocate("adaptive", more, ids)) <= sum(counts)


# ----------------------------------------------------------------------------------------------- all controllers


@st.composite
def histories(draw):
    n = draw(st.integers(2, 10))
    params = {"adaptive": {"n": n, "n_min": draw(st.integers(1, n)), "memory": draw(st.floats(0, 0.95)),
                           "informative_target": draw(st.one_of(st.none(), st.floats(0.5, 0.99))),
                           "probe_decay": draw(st.floats(0, 1)), "probe_floor": draw(st.floats(0, 1)),
                           "reward_scale": draw(st.one_of(st.none(), st.floats(0.1, 3))),
                           "decided_by_accuracy": draw(st.booleans()), "seed": draw(st.integers(0, 100))},
              "greso": {"n": n, "p_easy": draw(st.floats(0, 1)), "p_hard": draw(st.floats(0, 1)),
                        "seed": draw(st.integers(0, 100))}}
    steps = []
    pool = [f"p{i}" for i in range(8)]
    for _ in range(draw(st.integers(1, 6))):
        prompts = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6, unique=True))
        seeds = draw(st.lists(st.integers(0, 10**6), min_size=len(prompts), max_size=len(prompts)))
        steps.append((prompts, seeds))
    return n, params, steps


@settings(max_examples=80, deadline=None)
@given(history=histories(), controller=st.sampled_from(["fixed", "rollout_sa", "rollout_sa_paper", "greso",
                                                        "adaptive"]))
def test_controllers_are_bounded_resumable_and_pure(history, controller):
    n, params, steps = history
    params = params.get(controller, {"n": n})
    low = params.get("n_min", 2) if controller == "adaptive" else 2
    state = budget_init(controller, **params)
    for step, (prompts, seeds) in enumerate(steps):
        counts = budget_allocate(controller, state, prompts)
        assert len(counts) == len(prompts) and all(c == 0 or low <= c <= n for c in counts)
        assert all(isinstance(c, int) for c in counts) and any(c > 0 for c in counts)
        if controller in ("fixed", "rollout_sa", "rollout_sa_paper"):
            assert all(c > 0 for c in counts)
        resumed = json.loads(json.dumps(state))
        assert resumed == state and budget_allocate(controller, resumed, prompts) == counts
        kept, mean, std, accuracy = [], [], [], []
        for count, seed in zip(counts, seeds):
            gen = torch.Generator().manual_seed(seed)
            kept.append(int(torch.randint(0, count + 1, (), generator=gen)))
            accuracy.append(float(torch.randint(0, 2, (), generator=gen)))
            mean.append(float(torch.rand((), generator=gen)) * 1.5)
            std.append(0.0 if seed % 3 == 0 or count == 0 else float(torch.rand((), generator=gen)) * 0.75)
        result = outcome(prompts, kept, sampled=counts, mean=mean, std=std, step=step, total=len(steps),
                         epoch_end=seed % 2 == 0, accuracy=accuracy)
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
    with pytest.raises(ValueError, match="n_min <= n"):
        budget_init("adaptive", n=4, n_min=5)
    with pytest.raises(ValueError, match="memory out of range"):
        budget_init("adaptive", memory=1.0)
    with pytest.raises(ValueError, match="informative_target out of range"):
        budget_init("adaptive", informative_target=1.0)
    with pytest.raises(ValueError, match="informative_target out of range: True"):
        budget_init("adaptive", informative_target=True)
    with pytest.raises(ValueError, match="p_easy out of range"):
        budget_init("greso", p_easy=1.5)
    with pytest.raises(ValueError, match="p_min <= p_max"):
        budget_init("greso", p_min=0.9, p_max=0.1)
    with pytest.raises(ValueError, match="rollout_sa"):
        budget_init("rollout_sa", n=1)
    with pytest.raises(ValueError, match="rollout_sa_paper"):
        budget_init("rollout_sa_paper", n=1)
    state = budget_init("fixed", n=4)
    with pytest.raises(ValueError, match="belongs to controller 'fixed', not 'adaptive'"):
        budget_allocate("adaptive", state, ["a"])
    with pytest.raises(ValueError, match=r"PromptOutcomes.kept must be \(2,\)"):
        budget_update("fixed", state, outcome(["a", "b"], [1]))
    with pytest.raises(ValueError, match=r"PromptOutcomes.accuracy_mean must be \(2,\)"):
        budget_update("fixed", state, outcome(["a", "b"], [1, 1], accuracy=[1.0]))
    with pytest.raises(ValueError, match=r"0 <= kept <= sampled; not so for prompts \['b'\]"):
        budget_update("fixed", state, outcome(["a", "b"], [1, 9]))


def test_registry_lists_every_controller():
    assert BUDGETS.names() == ["adaptive", "fixed", "greso", "rollout_sa", "rollout_sa_paper"]


# ----------------------------------------------------------------------------------------------- in training


def _greso_trainer(store, skipped: list[int], **extra):
    """A 3-step greso trainer on the tiny model (8 prompts × 4) whose prompts at stream positions `skipped` are
    forced skipped (streak 3, p_e = 0: skip probability 1); returns it and the first epoch's prompt ids in order."""
    from fastrl_core.run_config import load_config
    from fastrl_core.trainer import Trainer

    overrides = {"store_dir": str(store), "steps": 3, "prompts_per_step": 8, "rollouts_per_prompt": 4,
                 "eval_every": 0, "checkpoint_every": 0, "threads": 1, "synthetic_train": 64, "synthetic_test": 16,
                 "eval_size": 16, "budget": "greso", "pruner": "fastrl", **extra}
    trainer = Trainer(load_config("embedded", [f"{k}={v}" for k, v in overrides.items()]),
                      progress=False)
    stream = [trainer.train_set[i].id for i in trainer.sampler.window(0, 64)]
    trainer.budget_state["p_easy"] = trainer.budget_state["p_hard"] = 0.0
    trainer.budget_state["prompts"] = {stream[i]: {"streak": 3, "easy": True} for i in skipped}
    return trainer, stream


def test_trainer_runs_with_skipped_prompts(tmp_path):
    """3 real steps of the tiny model with `greso`, three of step 0's eight prompts forced skipped (p_e = 0:
    skip probability 1): they get 0 rollouts, 0 kept and a store row each; the step trains on the rest; the
    budget's state stays JSON; a step whose prompts would all be skipped still samples one."""
    from fastrl_core.store import read_groups, read_rollouts, read_steps

    trainer, stream = _greso_trainer(tmp_path, [0, 1, 2, *range(8, 16)])  # step 1: all eight
    first = stream[:8]
    run_id = trainer.run()

    steps = read_steps(tmp_path, run_id)
    assert steps["rollouts_sampled"].tolist()[:2] == [5 * 4, 1 * 4]
    groups = read_groups(tmp_path, run_id, step=0).set_index("prompt_id")
    assert (groups.loc[first[:3], "sampled"] == 0).all() and (groups.loc[first[:3], "kept"] == 0).all()
    assert (groups.loc[first[3:], "sampled"] == 4).all()
    assert len(read_rollouts(tmp_path, run_id)) == steps["rollouts_sampled"].sum()
    assert json.loads(json.dumps(trainer.budget_state)) == trainer.budget_state
    assert all(trainer.budget_state["prompts"][p]["streak"] == 3 for p in first[:3])  # skipped: unchanged
