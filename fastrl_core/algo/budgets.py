"""Rollout budget controllers: how many rollouts to sample for each prompt of the coming step.

Pure and resumable. `budget_init(name, **params)` returns a state made only of dicts, lists, str, int, float, bool
and None (so `json.loads(json.dumps(state))` is the same state and gives the same allocations);
`budget_allocate(name, state, prompt_ids)` reads it; `budget_update(name, state, outcome)` returns a NEW state
and never mutates its input. Every controller takes `n` (the trainer's rollouts_per_prompt); a count of 0 skips
the prompt for the step (the engines accept 0).

- `fixed`             n rollouts for every prompt (plain GRPO).
- `rollout_sa`, `rollout_sa_paper`, `greso`: the authors', the paper's and GRESO's rules (`algo.baseline_budgets`).
- `adaptive`          ours: per-prompt counts from each prompt's pruning history (decided visits are probed
                      with n_min rollouts or skipped; mixed prompts keep n, or with `informative_target` just
                      enough for a likely non-zero gradient); the step total falls as groups are decided, never
                      above n per prompt.

Randomness (greso's and adaptive's skip draws) is a pure function of (seed, step, prompt id) through a hash
(`uniform_draw`), so allocation stays state -> counts and a resumed run draws the same. Every controller is
registered once, here; what they share is in `algo.budget_base`.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Sequence

import torch

from fastrl_core.algo import baseline_budgets as baselines
from fastrl_core.algo.budget_base import (BudgetController, PromptOutcomes, check_count, decided, keep_some,
                                          same_for_every_prompt, uniform_draw)
from fastrl_core.algo.registry import Registry

BUDGETS: Registry[BudgetController] = Registry("budget controller")  # filled at the end of this module


# ----------------------------------------------------------------------------------------------- fixed


def _fixed_init(n: int = 8) -> dict:
    return {"n": check_count("n", n)}


# ----------------------------------------------------------------------------------------------- adaptive


def _adaptive_init(n: int = 8, n_min: int = 2, informative_target: float | None = None,
                   probe_decay: float = 0.5, probe_floor: float = 0.1, memory: float = 0.5,
                   prior_strength: float = 2.0, reward_scale: float | None = None,
                   decided_by_accuracy: bool = True, seed: int = 0, min_prompts: int = 1,
                   decided_after: int = 1, probe_target: float | None = None) -> dict:
    """Parameters (see `adaptive_allocate` for the rule):
    n                   rollouts for a prompt never seen before, and the most any prompt gets
    n_min               rollouts of a probe of a decided prompt, and with informative_target the fewest a mixed
                        prompt gets (n_min = n probes in full: worth it where many prompts get decided, as in
                        paper-wide; a cost with no gain where few do, as in paper: docs/results.md, "Full probes")
    informative_target  None (default): a mixed prompt keeps n rollouts; a number in (0, 1): it gets the fewest
                        rollouts whose chance of unequal rewards reaches it (rule 3 of `adaptive_allocate`)
    probe_decay         a decided prompt with streak z is probed with probability max(decay^(z−1), probe_floor)
    probe_floor         the exploration floor: decided prompts are still probed this often
    memory              weight of a prompt's older evidence per new observation (0 = last one only)
    prior_strength      pseudo observations of the priors: success rate 1/2 (with accuracies), else variance
                        scale²/6 (= E p(1−p) for p ~ U(0, 1))
    reward_scale        without accuracies: distance between a failed and a solved rollout's reward; default:
                        learned as the larger of 2 × the largest group reward std and the spread of group means
    decided_by_accuracy a visit with every rollout correct (or every one wrong) counts as decided even if the
                        format reward varied (`decided`); needs PromptOutcomes.accuracy_mean
    seed                of the probe draws (`uniform_draw`)
    min_prompts         a step samples at least this many prompts
    decided_after       decided visits in a row before a prompt is probed or skipped (rule 2); until then it is
                        sampled as a mixed prompt. 1 (default): after one. 2 confirms first (one all-correct group
                        of 8 comes 43 % of the time at 90 % success, two 18 %): in paper-wide it sampled like full
                        probes and gained none of their points (docs/results.md, "Confirming a decided prompt")
    probe_target        None (default): a probe has n_min rollouts. A number in (0, 1): the fewest rollouts in
                        [n_min, n] whose chance of a mixed group reaches it, at the prompt's success rate under a
                        prior fitted to the run's own groups (`probe_count`; needs accuracies, else n_min). At 0.5
                        (`fastrl_probe_fit`) it kept GRPO's accuracy in paper and paper-wide (docs/results.md,
                        "Probes sized from the run's own groups")
    """
    n, n_min, min_prompts = check_count("n", n), check_count("n_min", n_min), check_count("min_prompts",
                                                                                             min_prompts)
    decided_after = check_count("decided_after", decided_after)
    if not n_min <= n:
        raise ValueError(f"budget parameters need n_min <= n, got {n_min}, {n}")
    checks = {"informative_target": (informative_target, informative_target is None
                                     or isinstance(informative_target, (int, float))
                                     and not isinstance(informative_target, bool) and 0 < informative_target < 1),
              "probe_decay": (probe_decay, 0 <= probe_decay <= 1), "probe_floor": (probe_floor, 0 <= probe_floor <= 1),
              "memory": (memory, 0 <= memory < 1), "prior_strength": (prior_strength, prior_strength > 0),
              "reward_scale": (reward_scale, reward_scale is None or reward_scale > 0),
              "probe_target": (probe_target, probe_target is None or isinstance(probe_target, (int, float))
                               and not isinstance(probe_target, bool) and 0 < probe_target < 1),
              "seed": (seed, isinstance(seed, int) and not isinstance(seed, bool)),
              "decided_by_accuracy": (decided_by_accuracy, isinstance(decided_by_accuracy, bool))}
    for key, (value, ok) in checks.items():
        if not ok:
            raise ValueError(f"budget parameter {key} out of range: {value!r}")
    params = {"n": n, "n_min": n_min,
              "informative_target": None if informative_target is None else float(informative_target),
              "probe_decay": float(probe_decay), "probe_floor": float(probe_floor), "memory": float(memory),
              "prior_strength": float(prior_strength),
              "reward_scale": None if reward_scale is None else float(reward_scale),
              "decided_by_accuracy": decided_by_accuracy, "seed": seed, "min_prompts": min_prompts,
              "decided_after": decided_after, "probe_target": None if probe_target is None else float(probe_target)}
    return {"params": params, "next_step": 0, "max_std": 0.0, "min_mean": None, "max_mean": None, "prompts": {},
            "population": dict(EMPTY_POPULATION)}


# Moments of the run's groups' accuracies (every sampled group of >= 2 rollouts): count, sum and sum of squares of
# the group means, and the sum of 1/group size. `fitted_prior` reads them.
EMPTY_POPULATION = {"groups": 0.0, "sum": 0.0, "sumsq": 0.0, "inv_size": 0.0}
RHO_RANGE = (0.01, 0.99)  # the fitted intra-prompt correlation is held inside this (a prior of 0.01 to 99 rollouts)


def fitted_prior(population: dict) -> tuple[float, float]:
    """Beta(a, b) prior of a prompt's success rate fitted to the run's groups by the method of moments of the
    beta-binomial: for group means x̄_i of n_i rollouts around their mean m, E(x̄_i − m)² = m(1 − m)(ρ + (1 − ρ)/n_i)
    with ρ = 1/(a + b + 1), so ρ = (Σ(x̄_i − m)² − m(1 − m)Σ1/n_i) / (m(1 − m)(N − Σ1/n_i)). Groups at 2–6 of 8
    (paper: 77 % of GRPO's groups) give a small ρ, a wide-shouldered prior that pulls one all-correct group back
    toward the middle; a run whose groups are mostly all correct or all wrong (paper-wide, late) gives a large ρ,
    a U-shaped prior that believes it. Uniform (1, 1) before two groups are seen."""
    groups = population["groups"]
    if groups < 2 or groups <= population["inv_size"]:
        return 1.0, 1.0
    mean = min(max(population["sum"] / groups, 0.01), 0.99)
    spread = population["sumsq"] - population["sum"] ** 2 / groups
    rho = (spread - mean * (1 - mean) * population["inv_size"]) / (mean * (1 - mean) * (groups
                                                                                         - population["inv_size"]))
    rho = min(max(rho, RHO_RANGE[0]), RHO_RANGE[1])
    strength = 1 / rho - 1
    return mean * strength, (1 - mean) * strength


def mixed_chance(a: float, b: float, k: int) -> float:
    """P(k rollouts are not all equal) when the success rate is Beta(a, b): 1 − E p^k − E (1 − p)^k, with
    E p^k = Π_{j<k} (a + j)/(a + b + j). Uniform prior (1, 1): 1 − 2/(k + 1)."""
    all_right = all_wrong = 1.0
    for j in range(k):
        all_right *= (a + j) / (a + b + j)
        all_wrong *= (b + j) / (a + b + j)
    return 1 - all_right - all_wrong


def probe_count(history: dict, state: dict) -> int:
    """Rollouts of a probe of a decided prompt: n_min, or with probe_target the fewest in [n_min, n] whose chance of
    a mixed group reaches it, at the prompt's success rate: its (discounted) correct and all rollouts on top of
    the prior fitted to the run's groups (`fitted_prior`). Without accuracies: n_min."""
    params = state["params"]
    target = params.get("probe_target")  # .get: states saved before the parameter read as None
    if target is None or history["trials"] <= 0:
        return params["n_min"]
    a, b = fitted_prior(state.get("population", EMPTY_POPULATION))
    a, b = a + history["hits"], b + history["trials"] - history["hits"]
    return fewest_rollouts(lambda k: mixed_chance(a, b, k), target, params["n_min"], params["n"])


def _reward_scale(state: dict) -> float:
    """Reward distance between failure and success: given, or learned from the groups seen (1.0 before any)."""
    if state["params"]["reward_scale"] is not None:
        return state["params"]["reward_scale"]
    spread = 0.0 if state["min_mean"] is None else state["max_mean"] - state["min_mean"]
    scale = max(2 * state["max_std"], spread)
    return scale if scale > 0 else 1.0


def _success_rate(history: dict, params: dict, scale: float) -> float:
    """Bernoulli-equivalent success rate p <= 1/2 of a prompt (the value is symmetric in p <-> 1 − p, so the side
    does not matter): p(1−p) = smoothed within-group reward variance / scale², the variance pooled over the
    prompt's observations with weight `memory` per step back and a prior of prior_strength pseudo degrees of
    freedom at scale²/6. For 0/1 rewards a group's population variance is exactly p̂(1 − p̂)."""
    prior = params["prior_strength"]
    variance = (history["sumsq"] + prior * scale**2 / 6) / (history["dof"] + prior)
    pq = min(max(variance / scale**2, 0.0), 0.25)
    return (1 - math.sqrt(1 - 4 * pq)) / 2


def _prompt_success_rate(history: dict, params: dict, scale: float) -> float:
    """The prompt's success rate: with accuracies, the discounted share of correct rollouts with prior_strength
    pseudo observations at 1/2; without, the variance-equivalent `_success_rate`. The accuracy rate is the
    better one whenever the reward has parts other than accuracy: a 0.5 format reward inflates the learned scale
    and makes a prompt at p = 1/2 look like p = 0.13."""
    if history["trials"] > 0:
        prior = params["prior_strength"]
        return (history["hits"] + prior / 2) / (history["trials"] + prior)
    return _success_rate(history, params, scale)


def informative_count(p: float, target: float, low: int, high: int) -> int:
    """The fewest k in [low, high] with P(k rollouts are not all equal) = 1 − p^k − (1 − p)^k >= target (high if
    none): the chance that a Bernoulli(p) group gives a non-zero GRPO gradient (the knapsack value of
    Knapsack-RL, Li et al. 2025, arXiv 2509.25849). p = 1/2, target 0.9: k = 5 (0.9375; k = 4 gives 0.875)."""
    return fewest_rollouts(lambda k: 1 - p**k - (1 - p) ** k, target, low, high)


def fewest_rollouts(chance: Callable[[int], float], target: float, low: int, high: int) -> int:
    """The fewest k in [low, high] with chance(k) >= target (high if none): the search both sizing rules share
    (`informative_count` for a mixed prompt at a known rate, `probe_count` for a probe under a beta prior)."""
    for k in range(low, high + 1):
        if chance(k) >= target:
            return k
    return high


def _mixed_count(history: dict, params: dict, scale: float) -> int:
    """Rule 3 of `adaptive_allocate`: n, or with an informative_target the fewest rollouts in [n_min, n] that give
    unequal outcomes that likely at the prompt's success rate."""
    if params["informative_target"] is None:
        return params["n"]
    p = _prompt_success_rate(history, params, scale)
    return informative_count(p, params["informative_target"], params["n_min"], params["n"])


def adaptive_allocate(state: dict, prompt_ids: Sequence[str]) -> list[int]:
    """Per-prompt counts for the coming step; their sum, the step's sample budget, is at most n·P and falls as
    prompts become decided.

    1. Unseen prompts: n.
    2. Decided prompts — the last z >= d visits were decided (`decided`; d = decided_after, 1 by default): zero
       reward variance, no rollout survived pruning, or (decided_by_accuracy, with accuracies) all correct / all
       wrong — are probed with n_min rollouts (with probe_target: `probe_count`) with probability
       max(probe_decay^(z−d), probe_floor) and skipped (0) otherwise; z = d is always probed; 0 < z < d is sampled
       as a mixed prompt (rule 3). The probe is GRESO's skip (Zheng et al. 2025, arXiv 2506.02177: zero-variance
       prompts tend to stay so, skip them with a probability growing with the streak, keep exploring) made cheap:
       n_min rollouts instead of n, so a probe costs little and a prompt that has become uncertain again shows
       mixed outcomes and returns to rule 3. With probe_target, as many as make a mixed group likely at the
       prompt's success rate: few where all-equal groups are chance (paper), up to n where they are not.
    3. Mixed prompts: n (default). With `informative_target` set, `informative_count` of their success rate p
       (`_prompt_success_rate`, pooled over visits): the fewest rollouts, within [n_min, n], that give unequal
       outcomes with probability >= informative_target. A prompt at p = 1/2 needs 5 of 8 for 0.9; a rare success
       or failure (p <= 0.2 or >= 0.8) keeps all n (Knapsack-RL's value, Li et al. 2025, arXiv 2509.25849).
    Draws u = uniform_draw(seed, step, id). At least `min_prompts` prompts get rollouts (n_min, if forced).

    What this does not do, and why: per-prompt kept counts enter only as "did anything survive" (rule 2). For
    a mixed group, the share-based pruners (fastrl, cppo, pods) keep a fixed share of whatever was sampled, so
    a prompt's kept count mirrors its sampled count and carries no further information about it. Nor is the
    total held at a kept-rollout target: the former `adaptive` did that and sampled 1 % MORE than GRPO in the
    paper-like regime (docs/notes.md §7).

    Measured (embedded default, 100 steps of 16 prompts × 8 on 128 training prompts, i.e. 12.5 visits per
    prompt, pruner fastrl, greedy accuracy on 256 test problems every 20 steps; final / mean of the last three
    evaluations): seed 0 — `fixed` 12,800 rollouts sampled, 0.613 / 0.599; this rule with rule 3 at 0.9 7,384
    (−42 %), 0.625 / 0.607; the former rule 11,471 (−10 %), 0.629 / 0.613. Seed 1 — `fixed` 12,800, 0.504 /
    0.574; this rule 7,837 (−39 %), 0.609 / 0.617. Two seeds, so accuracy is "not worse within seed noise",
    not "better".

    Measured in the paper regime (fastrl_core/configs/paper.yaml, no pruner, 5 seeds, mean@4, paired against GRPO): with
    rule 3 at informative_target 0.9, 35 % fewer rollouts, −0.8 ± 0.5 pts per step, +1.3 ± 0.9 at equal time
    (docs/bench/paper-cost); without it (only rule 2 cuts), 12 % fewer, +0.4 ± 1.4 per step, +1.3 ± 1.2 at equal
    time (docs/bench/paper-decided, run as informative_target 0.99, which keeps all 8). Rule 3 saves time at
    about the rate it loses accuracy per step and gains nothing at equal time, hence off by default. Over 160
    steps with the fastrl pruner (docs/bench/paper-long and its cut95/, two machines): off −20 % rollouts,
    +2.4 ± 1.8 pts per step; 0.95 −32 %, −1.9 ± 1.9; 0.9 −44 %, −2.9 ± 2.3. The cut rollouts are worth more on
    their mixed prompt than on further ones: 0.95 with its savings spent on further prompts (the refill, retired:
    docs/experiments.md) up to GRPO's total is +2.4 ± 2.2 per step, level with rule 3 off, which samples
    20 % fewer (docs/bench/paper-long/fill); up to rule 3 off's total (102 a step) it is −1.1 ± 1.7
    behind rule 3 off per step and −1.3 ± 0.6 at equal time (docs/bench/paper-long/fill80). Counted in rollouts
    (8 seeds, docs/bench/paper-long/shared-prompts/cuts and even; head to head, `metrics.difference_at_equal`):
    rule 2 alone reaches GRPO's target with 0.78× its rollouts; 0.9 is +3.7 ± 1.6 pts above rule 3 off at equal
    rollouts, and rule 3 beats sampling fewer for every prompt at about the same count (0.95 vs 6 of 8 rollouts
    per prompt +2.1 ± 0.7, 0.9 vs 5 of 8 +1.7 ± 1.5), though most of any per-rollout gain here is sampling fewer
    per step at all (6 of 8 for every prompt is +3.4 ± 0.5 over 8 at equal rollouts). Why no rule cuts
    much more there without cutting mixed groups: over a GRPO run of that config (seed 0, 1,280 groups) only
    7 % of groups are decided and 16 % are mixed with one rare outcome (1 of 8); 77 % are at 2–6 of 8 correct,
    and each quarter of the run is within 3.5 pts of that (`fastrl train --method grpo fastrl_core/configs/paper.yaml
    eval_every=0 eval_samples=0 store_dir=S`, then `benchmarks/paired_methods.py --budget S`).
    """
    params = state["params"]
    n, n_min = params["n"], params["n_min"]
    decided_after = params.get("decided_after", 1)  # .get: states saved before the parameter read as 1
    scale = _reward_scale(state)
    counts, draws, skip = [], [], []
    for prompt in prompt_ids:
        history = state["prompts"].get(prompt)
        draws.append(uniform_draw(params["seed"], state["next_step"], prompt))
        if history is None:
            counts.append(n)
            skip.append(0.0)
        elif history["streak"] >= decided_after:
            probe = max(params["probe_decay"] ** (history["streak"] - decided_after), params["probe_floor"])
            skip.append(1.0 - probe)
            counts.append(0 if draws[-1] < 1.0 - probe else probe_count(history, state))
        else:
            skip.append(0.0)
            counts.append(_mixed_count(history, params, scale))
    return keep_some(counts, draws, skip, n_min, min(params["min_prompts"], len(prompt_ids)))


def _adaptive_update(state: dict, outcome: PromptOutcomes) -> dict:
    """Per sampled prompt: discounted pooled reward variance (sumsq += n·std², dof += n − 1) and, with
    accuracies, discounted correct / all counts (hits += n·accuracy, trials += n) and the run's group moments
    (`EMPTY_POPULATION`, for `fitted_prior`); the streak of decided visits (`decided`; a skipped visit leaves it as
    it is), visits and the last kept count; batch: the reward range for the learned scale, and the step for the
    draws."""
    params = state["params"]
    accuracies = [None] * len(outcome.prompt_ids) if outcome.accuracy_mean is None else outcome.accuracy_mean.tolist()
    for prompt, count, kept, mean, std, accuracy in zip(outcome.prompt_ids, outcome.sampled.tolist(),
                                                        outcome.kept.tolist(), outcome.reward_mean.tolist(),
                                                        outcome.reward_std.tolist(), accuracies):
        if count <= 0:
            continue
        history = state["prompts"].setdefault(prompt, {"sumsq": 0.0, "dof": 0.0, "hits": 0.0, "trials": 0.0,
                                                       "streak": 0, "seen": 0, "kept": 0})
        history["sumsq"] = params["memory"] * history["sumsq"] + count * std**2
        history["dof"] = params["memory"] * history["dof"] + (count - 1)
        if accuracy is not None:
            history["hits"] = params["memory"] * history["hits"] + count * accuracy
            history["trials"] = params["memory"] * history["trials"] + count
            if count >= 2:
                population = state.setdefault("population", dict(EMPTY_POPULATION))
                for key, value in (("groups", 1.0), ("sum", accuracy), ("sumsq", accuracy**2),
                                   ("inv_size", 1 / count)):
                    population[key] += value
        by_accuracy = accuracy if params["decided_by_accuracy"] else None
        history["streak"] = history["streak"] + 1 if decided(std, kept, by_accuracy) else 0
        history["seen"] += 1
        history["kept"] = kept
        state["max_std"] = max(state["max_std"], std)
        state["min_mean"] = mean if state["min_mean"] is None else min(state["min_mean"], mean)
        state["max_mean"] = mean if state["max_mean"] is None else max(state["max_mean"], mean)
    state["next_step"] = outcome.step + 1
    return state


# ---- the one registration of every controller
for _name, _controller in {
        "fixed": BudgetController(init=_fixed_init, allocate=same_for_every_prompt, update=lambda state, _: state),
        "rollout_sa": BudgetController(init=baselines.rollout_sa_init, allocate=same_for_every_prompt,
                                       update=baselines.rollout_sa_update),
        "rollout_sa_paper": BudgetController(init=baselines.rollout_sa_paper_init, allocate=same_for_every_prompt,
                                             update=baselines.rollout_sa_paper_update),
        "greso": BudgetController(init=baselines.greso_init, allocate=baselines.greso_allocate,
                                  update=baselines.greso_update),
        "adaptive": BudgetController(init=_adaptive_init, allocate=adaptive_allocate, update=_adaptive_update),
}.items():
    BUDGETS.register(_name)(_controller)


# ----------------------------------------------------------------------------------------------- entry points


def budget_init(name: str, **params) -> dict:
    """A fresh state for controller `name` with its own keyword parameters."""
    controller = BUDGETS.get(name)
    try:
        state = controller.init(**params)
    except (TypeError, ValueError) as error:
        raise type(error)(f"budget controller {name!r}: {error}") from None
    return {"controller": name, **state}


def _check_state(name: str, state: dict) -> None:
    if not isinstance(state, dict) or state.get("controller") != name:
        found = state.get("controller") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"budget state belongs to controller {found!r}, not {name!r}")


def budget_allocate(name: str, state: dict, prompt_ids: Sequence[str]) -> list[int]:
    """Rollouts to sample for each prompt of the coming step."""
    controller = BUDGETS.get(name)
    _check_state(name, state)
    return controller.allocate(state, list(prompt_ids))


def _check_outcome(outcome: PromptOutcomes) -> None:
    g = len(outcome.prompt_ids)
    for key in ("sampled", "kept", "reward_mean", "reward_std", "accuracy_mean"):
        if getattr(outcome, key) is not None and getattr(outcome, key).shape != (g,):
            raise ValueError(f"PromptOutcomes.{key} must be ({g},) like prompt_ids, got "
                             f"{tuple(getattr(outcome, key).shape)}")
    bad = ((outcome.kept < 0) | (outcome.kept > outcome.sampled)).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"PromptOutcomes needs 0 <= kept <= sampled; not so for prompts "
                         f"{[outcome.prompt_ids[i] for i in bad[:5].tolist()]}")
    if not (torch.isfinite(outcome.reward_mean).all() and torch.isfinite(outcome.reward_std).all()):
        raise ValueError("PromptOutcomes.reward_mean and reward_std must be finite")
    if outcome.total_steps < 1 or outcome.step < 0:
        raise ValueError(f"PromptOutcomes needs step >= 0 and total_steps >= 1, got {outcome.step}, "
                         f"{outcome.total_steps}")


def budget_update(name: str, state: dict, outcome: PromptOutcomes) -> dict:
    """The controller's new state after `outcome`; `state` itself is left unchanged."""
    controller = BUDGETS.get(name)
    _check_state(name, state)
    _check_outcome(outcome)
    return controller.update(copy.deepcopy(state), outcome)
