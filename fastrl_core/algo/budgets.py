"""Rollout budget controllers: how many rollouts to sample for each prompt of the coming step.

Pure and resumable. `budget_init(name, **params)` returns a state made only of dicts, lists, str, int, float and
None (so `json.loads(json.dumps(state))` is the same state and gives the same allocations);
`budget_allocate(name, state, prompt_ids)` reads it; `budget_update(name, state, outcome)` returns a NEW state
and never mutates its input. Every controller takes `n` (the trainer's rollouts_per_prompt).

- `fixed`       n rollouts for every prompt (plain GRPO).
- `rollout_sa`  the authors' RolloutSA (NOTES §1), one n for all prompts, changed at epoch ends.
- `adaptive`    ours: per-prompt counts from each prompt's reward history (p(1−p), zero-variance streaks) under a
                total sample budget that tracks the kept (informative) rollouts. See `adaptive_allocate`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from fastrl_core.algo.registry import Registry


@dataclass(frozen=True)
class StepOutcome:
    """What one step did per prompt, G prompts."""

    prompt_ids: tuple[str, ...]  # the step's prompts
    sampled: Tensor  # (G,) rollouts sampled per prompt
    kept: Tensor  # (G,) rollouts kept by the pruner
    reward_mean: Tensor  # (G,)
    reward_std: Tensor  # (G,) population std of the group's rewards
    step: int  # 0-based index of the step just run
    total_steps: int
    epoch_end: bool  # this step finished a pass over the prompts


@dataclass(frozen=True)
class BudgetController:
    init: Callable[..., dict]  # (**params) -> state without the "controller" key
    allocate: Callable[[dict, Sequence[str]], list[int]]
    update: Callable[[dict, StepOutcome], dict]  # may mutate its argument: `budget_update` passes a copy


BUDGETS: Registry[BudgetController] = Registry("budget controller")


def _check_count(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"budget parameter {name} must be an integer >= {low}, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------- fixed


def _fixed_init(n: int = 8) -> dict:
    return {"n": _check_count("n", n)}


BUDGETS.register("fixed")(BudgetController(
    init=_fixed_init,
    allocate=lambda state, prompt_ids: [state["n"]] * len(prompt_ids),
    update=lambda state, outcome: state,
))


# ----------------------------------------------------------------------------------------------- rollout_sa

RSA_FLOOR = 2  # the authors' lower bound on n


def _rollout_sa_init(n: int = 8) -> dict:
    """n0 = n; f1 / f2 collect this epoch's per-step values; g1 is set once, at the end of the first epoch."""
    n = _check_count("n", n, RSA_FLOOR)
    return {"n0": n, "n": n, "g1": None, "f1": [], "f2": [], "f3": None, "epochs": 0}


def _rollout_sa_update(state: dict, outcome: StepOutcome) -> dict:
    """RolloutSA as in the authors' code (NOTES §1):
    every step        f1 = mean kept per prompt, f2 = max kept per prompt;
    at an epoch end   a = step / total_steps (the 1-based global step: outcome.step + 1),
                      f3 = a·mean(f1) + (1 − a)·mean(f2) over the epoch's steps,
                      g1 = (mean f1 + mean f2) / 2 from the first epoch (then fixed),
                      n = max(round(n0 − (g1 − f3)), 2) if f3 < g1 else n0,
                      and f1 / f2 start again. round() is Python's (halves to even), as in their Python code."""
    kept = outcome.kept.double()
    if kept.numel():
        state["f1"].append(kept.mean().item())
        state["f2"].append(kept.max().item())
    if outcome.epoch_end and state["f1"]:
        a = (outcome.step + 1) / outcome.total_steps
        mean_f1, mean_f2 = sum(state["f1"]) / len(state["f1"]), sum(state["f2"]) / len(state["f2"])
        f3 = a * mean_f1 + (1 - a) * mean_f2
        if state["g1"] is None:
            state["g1"] = (mean_f1 + mean_f2) / 2
        g1 = state["g1"]
        state["n"] = max(round(state["n0"] - (g1 - f3)), RSA_FLOOR) if f3 < g1 else state["n0"]
        state["f3"], state["f1"], state["f2"] = f3, [], []
        state["epochs"] += 1
    return state


BUDGETS.register("rollout_sa")(BudgetController(
    init=_rollout_sa_init,
    allocate=lambda state, prompt_ids: [state["n"]] * len(prompt_ids),
    update=_rollout_sa_update,
))


# ----------------------------------------------------------------------------------------------- adaptive


def _adaptive_init(n: int = 8, n_min: int = 2, n_max: int | None = None, target_kept: float | None = None,
                   memory: float = 0.5, rate_memory: float = 0.8, streak_discount: float = 0.5,
                   prior_strength: float = 2.0, reward_scale: float | None = None) -> dict:
    """Parameters (see `adaptive_allocate` for the rule):
    n               rollouts for a prompt never seen before (the trainer's rollouts_per_prompt)
    n_min, n_max    bounds on every prompt's count (n_max default 2·n)
    target_kept     kept rollouts per prompt the step budget aims at; default: the first step's kept per prompt
                    (the first step samples n each, so the budget starts at n per prompt and then keeps the
                    update's size as the share of informative rollouts changes)
    memory          weight of a prompt's older reward evidence per new observation (0 = last one only)
    rate_memory     EMA weight of the batch kept/sampled rate
    streak_discount value factor per consecutive zero-variance observation of a prompt (GRESO-style)
    prior_strength  pseudo degrees of freedom of the prior variance scale²/6 (= E p(1−p) for p ~ U(0, 1))
    reward_scale    distance between a failed and a solved rollout's reward; default: learned as the larger of
                    2 × the largest group reward std and the spread of group reward means seen so far
    """
    n = _check_count("n", n)
    n_min = _check_count("n_min", n_min)
    n_max = 2 * n if n_max is None else _check_count("n_max", n_max)
    if not n_min <= n <= n_max:
        raise ValueError(f"budget parameters need n_min <= n <= n_max, got {n_min}, {n}, {n_max}")
    checks = {"target_kept": (target_kept, target_kept is None or target_kept > 0), "memory": (memory, 0 <= memory < 1),
              "rate_memory": (rate_memory, 0 <= rate_memory < 1),
              "streak_discount": (streak_discount, 0 < streak_discount <= 1),
              "prior_strength": (prior_strength, prior_strength > 0),
              "reward_scale": (reward_scale, reward_scale is None or reward_scale > 0)}
    for key, (value, ok) in checks.items():
        if not ok:
            raise ValueError(f"budget parameter {key} out of range: {value!r}")
    params = {"n": n, "n_min": n_min, "n_max": n_max, "memory": float(memory),
              "rate_memory": float(rate_memory), "streak_discount": float(streak_discount),
              "prior_strength": float(prior_strength),
              "reward_scale": None if reward_scale is None else float(reward_scale)}
    return {"params": params, "target_kept": None if target_kept is None else float(target_kept),
            "kept_rate": None, "max_std": 0.0, "min_mean": None, "max_mean": None, "prompts": {}}


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


def step_budget(state: dict, num_prompts: int) -> int:
    """Total rollouts for the step: num_prompts · target_kept / EMA(kept / sampled), within the count bounds;
    num_prompts · n until both are known."""
    params = state["params"]
    if state["target_kept"] is None or state["kept_rate"] is None:
        return num_prompts * params["n"]
    wanted = round(num_prompts * state["target_kept"] / max(state["kept_rate"], 1e-9))
    return min(max(wanted, num_prompts * params["n_min"]), num_prompts * params["n_max"])


def adaptive_allocate(state: dict, prompt_ids: Sequence[str]) -> list[int]:
    """Per-prompt counts for the coming step.

    1. Step budget B = `step_budget`: when the pruner keeps fewer rollouts (more all-equal groups, more
       redundancy) sampling grows so that the update still sees ≈ target_kept kept rollouts per prompt.
    2. Unseen prompts get an even share B / P (n until the budget is known: in a large dataset most prompts of
       the first epoch are unseen, and the step budget must act on them too). Seen prompts start at n_min and
       share the rest of B (within n_max) by greedy
       marginal value, optimal here because each prompt's value is concave in its count:
           value_i(n) = w_i · (1 − p_i^n − (1 − p_i)^n),   w_i = p_i(1 − p_i) · streak_discount^streak_i.
       The first factor is the chance that n rollouts are not all equal, i.e. give a non-zero GRPO gradient, and
       the knapsack view is Knapsack-RL's (Li et al. 2025, arXiv 2509.25849, which multiplies that chance by an
       InfoGain term); the weight is the Bernoulli reward variance p(1 − p) to which VIP (Nguyen et al. 2026,
       arXiv 2602.01601) shows the per-prompt gradient variance is proportional. Marginal value:
       value_i(n + 1) − value_i(n) = w_i·(p^n (1 − p) + (1 − p)^n p). p_i from `_success_rate`: for 0/1 rewards
       the smoothed success rate's p(1−p) exactly, for other rewards the variance-equivalent one. The
       zero-variance streak discounts a prompt further (GRESO, Zheng et al. 2025, "Act Only When It Pays":
       prompts all-correct or all-wrong in recent epochs tend to stay so; GRESO skips them, here they get
       fewer rollouts). So uncertain prompts get more rollouts, solved or hopeless ones n_min. Per-prompt kept
       counts are not used beyond the batch rate: for a mixed group the pruner keeps a fixed share, so they
       would repeat the non-zero-gradient factor. Ties go to the earlier prompt, then the smaller count.
    """
    params = state["params"]
    n_min, n_max = params["n_min"], params["n_max"]
    budget = step_budget(state, len(prompt_ids))
    fresh = min(max(round(budget / max(len(prompt_ids), 1)), n_min), n_max)  # an unseen prompt's even share
    seen = [i for i, prompt in enumerate(prompt_ids) if prompt in state["prompts"]]
    counts = [fresh] * len(prompt_ids)
    if not seen:
        return counts
    extra = budget - fresh * (len(prompt_ids) - len(seen)) - n_min * len(seen)
    extra = min(max(extra, 0), len(seen) * (n_max - n_min))
    scale = _reward_scale(state)
    rates, weights = [], []
    for i in seen:
        history = state["prompts"][prompt_ids[i]]
        rates.append(_success_rate(history, params, scale))
        weights.append(rates[-1] * (1 - rates[-1]) * params["streak_discount"] ** history["streak"])
    p = torch.tensor(rates, dtype=torch.float64)[:, None]  # (S, 1)
    size = torch.arange(n_min, n_max, dtype=torch.float64)[None, :]  # (1, n_max − n_min): from size to size + 1
    gain = torch.tensor(weights, dtype=torch.float64)[:, None] * (p**size * (1 - p) + (1 - p) ** size * p)
    chosen = torch.sort(-gain.reshape(-1), stable=True).indices[:extra]  # ties: earlier prompt, smaller count
    added = torch.bincount(chosen // max(n_max - n_min, 1), minlength=len(seen)).tolist()
    for i, more in zip(seen, added):
        counts[i] = n_min + more
    return [min(max(c, n_min), n_max) for c in counts]


def _adaptive_update(state: dict, outcome: StepOutcome) -> dict:
    """Per prompt: discounted pooled reward variance (sumsq += n·std², dof += n − 1), zero-variance streak and
    observation count; batch: EMA of kept / sampled (starting at the first step's rate), target_kept if learned
    (the first step with kept rollouts), and the reward range for the learned scale."""
    params = state["params"]
    sampled = outcome.sampled.tolist()
    for prompt, count, mean, std in zip(outcome.prompt_ids, sampled, outcome.reward_mean.tolist(),
                                        outcome.reward_std.tolist()):
        if count <= 0:
            continue
        history = state["prompts"].setdefault(prompt, {"sumsq": 0.0, "dof": 0.0, "streak": 0, "seen": 0})
        history["sumsq"] = params["memory"] * history["sumsq"] + count * std**2
        history["dof"] = params["memory"] * history["dof"] + (count - 1)
        history["streak"] = history["streak"] + 1 if std <= 1e-9 else 0
        history["seen"] += 1
        state["max_std"] = max(state["max_std"], std)
        state["min_mean"] = mean if state["min_mean"] is None else min(state["min_mean"], mean)
        state["max_mean"] = mean if state["max_mean"] is None else max(state["max_mean"], mean)
    total, kept = sum(sampled), float(outcome.kept.sum())
    if total > 0:
        rate = kept / total
        previous = rate if state["kept_rate"] is None else state["kept_rate"]
        state["kept_rate"] = params["rate_memory"] * previous + (1 - params["rate_memory"]) * rate
    if state["target_kept"] is None and kept > 0:
        state["target_kept"] = kept / len(outcome.prompt_ids)
    return state


BUDGETS.register("adaptive")(BudgetController(init=_adaptive_init, allocate=adaptive_allocate,
                                              update=_adaptive_update))


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


def _check_outcome(outcome: StepOutcome) -> None:
    g = len(outcome.prompt_ids)
    for key in ("sampled", "kept", "reward_mean", "reward_std"):
        if getattr(outcome, key).shape != (g,):
            raise ValueError(f"StepOutcome.{key} must be ({g},) like prompt_ids, got "
                             f"{tuple(getattr(outcome, key).shape)}")
    bad = ((outcome.kept < 0) | (outcome.kept > outcome.sampled)).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"StepOutcome needs 0 <= kept <= sampled; not so for prompts "
                         f"{[outcome.prompt_ids[i] for i in bad[:5].tolist()]}")
    if not (torch.isfinite(outcome.reward_mean).all() and torch.isfinite(outcome.reward_std).all()):
        raise ValueError("StepOutcome.reward_mean and reward_std must be finite")
    if outcome.total_steps < 1 or outcome.step < 0:
        raise ValueError(f"StepOutcome needs step >= 0 and total_steps >= 1, got {outcome.step}, "
                         f"{outcome.total_steps}")


def budget_update(name: str, state: dict, outcome: StepOutcome) -> dict:
    """The controller's new state after `outcome`; `state` itself is left unchanged."""
    controller = BUDGETS.get(name)
    _check_state(name, state)
    _check_outcome(outcome)
    return controller.update(copy.deepcopy(state), outcome)
