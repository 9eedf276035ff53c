"""Rollout budget controllers: how many rollouts to sample for each prompt of the coming step.

Pure and resumable. `budget_init(name, **params)` returns a state made only of dicts, lists, str, int, float, bool
and None (so `json.loads(json.dumps(state))` is the same state and gives the same allocations);
`budget_allocate(name, state, prompt_ids)` reads it; `budget_update(name, state, outcome)` returns a NEW state
and never mutates its input. Every controller takes `n` (the trainer's rollouts_per_prompt); a count of 0 skips
the prompt for the step (the engines accept 0).

- `fixed`             n rollouts for every prompt (plain GRPO).
- `rollout_sa`        the authors' RolloutSA (NOTES §1), one n for all prompts, changed at epoch ends.
- `rollout_sa_paper`  the paper's ARS as written in its §3.3 Eqs. 10–14 (max over the epoch's questions).
- `greso`             GRESO (Zheng et al. 2025): skip prompts that were zero-variance on their recent visits.
- `adaptive`          ours: per-prompt counts from each prompt's pruning history (decided visits are probed
                      with n_min rollouts or skipped; mixed prompts keep n, or with `informative_target` just
                      enough for a likely non-zero gradient); the step total falls as groups are decided, never
                      above n per prompt.

Randomness (greso's and adaptive's skip draws) is a pure function of (seed, step, prompt id) through a hash
(`uniform_draw`), so allocation stays state -> counts and a resumed run draws the same.
"""

from __future__ import annotations

import copy
import hashlib
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
    accuracy_mean: Tensor | None = None  # (G,) mean accuracy reward (0/1 correctness) per prompt; 0 if unsampled


@dataclass(frozen=True)
class BudgetController:
    init: Callable[..., dict]  # (**params) -> state without the "controller" key
    allocate: Callable[[dict, Sequence[str]], list[int]]  # counts >= 0; 0 skips the prompt
    update: Callable[[dict, StepOutcome], dict]  # may mutate its argument: `budget_update` passes a copy


BUDGETS: Registry[BudgetController] = Registry("budget controller")


def _check_count(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"budget parameter {name} must be an integer >= {low}, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------- fixed


def _fixed_init(n: int = 8) -> dict:
    return {"n": _check_count("n", n)}


def _same_for_every_prompt(state: dict, prompt_ids: Sequence[str]) -> list[int]:
    """state["n"] rollouts for each prompt (fixed, and both RolloutSA variants: one n for the whole step)."""
    return [state["n"]] * len(prompt_ids)


BUDGETS.register("fixed")(BudgetController(
    init=_fixed_init,
    allocate=_same_for_every_prompt,
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
        mean_f1, mean_f2 = sum(state["f1"]) / len(state["f1"]), sum(state["f2"]) / len(state["f2"])
        state["f3"], state["g1"], state["n"] = _epoch_end_n(state["n0"], state["g1"], mean_f1, mean_f2, outcome)
        state["f1"], state["f2"] = [], []
        state["epochs"] += 1
    return state


def _epoch_end_n(n0: int, reference: float | None, mean: float, top: float, outcome: StepOutcome
                 ) -> tuple[float, float, int]:
    """The epoch-end rule both RolloutSA variants share, from the epoch's mean and max kept counts:
    g = α·mean + (1 − α)·top with α = (step + 1) / total_steps; the reference (mean + top) / 2 of the first epoch
    (kept once set); n = max(round(n0 − max(reference − g, 0)), 2). Returns (g, reference, n)."""
    alpha = (outcome.step + 1) / outcome.total_steps
    g = alpha * mean + (1 - alpha) * top
    reference = (mean + top) / 2 if reference is None else reference
    return g, reference, max(round(n0 - max(reference - g, 0.0)), RSA_FLOOR)


BUDGETS.register("rollout_sa")(BudgetController(
    init=_rollout_sa_init,
    allocate=_same_for_every_prompt,
    update=_rollout_sa_update,
))


# ----------------------------------------------------------------------------------------------- rollout_sa_paper


def _rollout_sa_paper_init(n: int = 8) -> dict:
    """G1 = n; the epoch's kept-count sum, question count and maximum; G'_ref is set at the first epoch end."""
    n = _check_count("n", n, RSA_FLOOR)
    return {"n0": n, "n": n, "g_ref": None, "g_t": None, "kept_sum": 0.0, "questions": 0, "kept_max": None,
            "epochs": 0}


def _rollout_sa_paper_update(state: dict, outcome: StepOutcome) -> dict:
    """Adaptive Rollout Sampling as written in the paper's §3.3 (arXiv 2609.36932):
        Eq. 10  G'mean_t = mean over the epoch's N questions of the kept count G'_t(q),  G'max_t = their max;
        Eq. 11  G'_t = α·G'mean_t + (1 − α)·G'max_t,  α = step_cur / step_total (1-based: outcome.step + 1);
        Eq. 12  G'_ref = (G'mean_1 + G'max_1) / 2 from the first epoch;
        Eq. 13  Δ_t = G'_ref − G'_t if G'_t < G'_ref else 0;
        Eq. 14  n_{t+1} = max(round(G1 − Δ_t), 2), applied to the next epoch.
    Where it differs from `rollout_sa` (the authors' code, and the paper's own Alg. 1 lines 31–37): G'max_t is
    the largest kept count of ANY question of the epoch, not the mean over steps of each step's maximum, and
    G'mean_t weights questions equally (the same as the code's mean of step means when every step has the same
    number of prompts). Kept counts are the pruner's (the trainer's keep mask); the authors' code also counts
    the rows that pad the batch to a minibatch multiple, the paper's |S(q)| does not. Prompts sampled 0 times are
    not questions of the epoch. round() is Python's (halves to even)."""
    kept = outcome.kept[outcome.sampled > 0].double()
    if kept.numel():
        state["kept_sum"] += kept.sum().item()
        state["questions"] += kept.numel()
        top = kept.max().item()
        state["kept_max"] = top if state["kept_max"] is None else max(state["kept_max"], top)
    if outcome.epoch_end and state["questions"]:
        mean = state["kept_sum"] / state["questions"]
        state["g_t"], state["g_ref"], state["n"] = _epoch_end_n(state["n0"], state["g_ref"], mean,
                                                                state["kept_max"], outcome)
        state["kept_sum"], state["questions"], state["kept_max"] = 0.0, 0, None
        state["epochs"] += 1
    return state


BUDGETS.register("rollout_sa_paper")(BudgetController(
    init=_rollout_sa_paper_init,
    allocate=_same_for_every_prompt,
    update=_rollout_sa_paper_update,
))


# ----------------------------------------------------------------------------------------------- shared pieces


def uniform_draw(seed: int, step: int, prompt_id: str) -> float:
    """A uniform number in [0, 1) that depends only on (seed, step, prompt id): 64 bits of BLAKE2b. It keeps
    allocation a pure function of the state (no generator to carry or checkpoint) and is the same on resume."""
    digest = hashlib.blake2b(f"{seed}\x1f{step}\x1f{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _decided(std: float, kept: int, accuracy: float | None = None) -> bool:
    """A decided visit: all rewards equal (zero variance: no gradient), nothing survived pruning, or — when the
    accuracy is given — all rollouts correct or all wrong (GRESO's "easy" / "hard"; the group may still differ
    in format reward only)."""
    all_same_accuracy = accuracy is not None and (accuracy <= 1e-9 or accuracy >= 1 - 1e-9)
    return std <= 1e-9 or kept == 0 or all_same_accuracy


def _keep_some(counts: list[int], draws: list[float], skip: list[float], fallback: int, minimum: int) -> list[int]:
    """If fewer than `minimum` prompts got rollouts, give `fallback` to the skipped ones nearest to being drawn
    (smallest skip probability − draw, ties by position), so a step never samples nothing."""
    sampled = sum(c > 0 for c in counts)
    if sampled >= minimum:
        return counts
    skipped = sorted((i for i, c in enumerate(counts) if c == 0), key=lambda i: (skip[i] - draws[i], i))
    for i in skipped[: minimum - sampled]:
        counts[i] = fallback
    return counts


# ----------------------------------------------------------------------------------------------- greso


def _greso_init(n: int = 8, p_easy: float = 0.5, p_hard: float = 0.5, target_zero_variance: float = 0.25,
                p_step: float = 0.01, p_min: float = 0.05, p_max: float = 0.95, seed: int = 0,
                min_prompts: int = 1) -> dict:
    """Parameters (defaults: GRESO's released scripts and trainer, github.com/Infini-AI-Lab/GRESO,
    train-scripts/*_greso.sh and verl/trainer/ppo/ray_trainer.py):
    n                     rollouts of a prompt that is not skipped
    p_easy, p_hard        initial base exploration probabilities for prompts last seen all-correct / all-wrong
    target_zero_variance  α: target share of zero-variance prompts among those sampled; easy aims at α/3, hard
                          at 2α/3 (GRESO explores hard prompts more: they are the ones likely to change)
    p_step                Δp, the change of p_easy / p_hard per step
    p_min, p_max          bounds of p_easy / p_hard (the exploration floor)
    seed                  of the skip draws (`uniform_draw`)
    min_prompts           a step samples at least this many prompts (GRESO instead draws more prompts until
                          its batch is full; the trainer's batch is fixed, so skipped prompts are just skipped)
    """
    n, min_prompts = _check_count("n", n), _check_count("min_prompts", min_prompts)
    for key, value in (("p_easy", p_easy), ("p_hard", p_hard), ("target_zero_variance", target_zero_variance),
                       ("p_step", p_step), ("p_min", p_min), ("p_max", p_max)):
        if not 0 <= value <= 1:
            raise ValueError(f"budget parameter {key} out of range [0, 1]: {value!r}")
    if not p_min <= p_max:
        raise ValueError(f"budget parameters need p_min <= p_max, got {p_min}, {p_max}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"budget parameter seed must be an integer, got {seed!r}")
    params = {"n": n, "target_zero_variance": float(target_zero_variance), "p_step": float(p_step),
              "p_min": float(p_min), "p_max": float(p_max), "seed": seed, "min_prompts": min_prompts}
    return {"params": params, "p_easy": float(p_easy), "p_hard": float(p_hard), "epochs": 0, "next_step": 0,
            "min_mean": None, "max_mean": None, "prompts": {}}


def greso_skip_probability(streak: int, p_explore: float) -> float:
    """GRESO's probabilistic pre-rollout filter (Zheng et al. 2025, arXiv 2506.02177, §4, Alg. 1): a prompt whose
    z most recent visits were all zero-variance is skipped with probability 1 − p_e^z (0 for z = 0)."""
    return 1.0 - p_explore**streak if streak > 0 else 0.0


def greso_allocate(state: dict, prompt_ids: Sequence[str]) -> list[int]:
    """n rollouts, or 0 if the prompt's draw u = uniform_draw(seed, step, id) < greso_skip_probability(z, p_e),
    where z is its zero-variance streak and p_e = p_easy if its last zero-variance visit was all-correct, else
    p_hard. Unseen prompts are never skipped; at least `min_prompts` prompts are sampled."""
    params = state["params"]
    draws, skip = [], []
    for prompt in prompt_ids:
        history = state["prompts"].get(prompt)
        p_explore = state["p_easy"] if history and history["easy"] else state["p_hard"]
        skip.append(greso_skip_probability(history["streak"], p_explore) if history else 0.0)
        draws.append(uniform_draw(params["seed"], state["next_step"], prompt))
    counts = [0 if u < s else params["n"] for u, s in zip(draws, skip)]
    return _keep_some(counts, draws, skip, params["n"], min(params["min_prompts"], len(prompt_ids)))


def _greso_update(state: dict, outcome: StepOutcome) -> dict:
    """Per sampled prompt: zero-variance streak (reset by a visit with reward variance; skipped visits leave it
    as it is) and whether the last zero-variance visit was all-correct (accuracy_mean >= 0.5, or without it the
    group's reward mean above the middle of the range of group means seen). After the first epoch, as in
    GRESO's trainer, every step moves p_easy (p_hard) down by p_step if the step's share of all-correct
    (all-wrong) groups among the sampled ones reached α/3 (2α/3) — skip more — else up, within [p_min, p_max]."""
    params = state["params"]
    means = outcome.reward_mean.tolist()
    sampled = outcome.sampled.tolist()
    for mean, count in zip(means, sampled):
        if count > 0:
            state["min_mean"] = mean if state["min_mean"] is None else min(state["min_mean"], mean)
            state["max_mean"] = mean if state["max_mean"] is None else max(state["max_mean"], mean)
    accuracy = None if outcome.accuracy_mean is None else outcome.accuracy_mean.tolist()
    easy_groups = hard_groups = groups = 0
    for g, (prompt, count, mean, std) in enumerate(zip(outcome.prompt_ids, sampled, means,
                                                        outcome.reward_std.tolist())):
        if count <= 0:
            continue
        history = state["prompts"].setdefault(prompt, {"streak": 0, "easy": False})
        groups += 1
        if std <= 1e-9:
            middle = (state["min_mean"] + state["max_mean"]) / 2
            easy = accuracy[g] >= 0.5 if accuracy is not None else mean > middle
            history["streak"] += 1
            history["easy"] = bool(easy)
            easy_groups += easy
            hard_groups += not easy
        else:
            history["streak"] = 0
    if state["epochs"] >= 1 and groups:
        for key, share, target in (("p_easy", easy_groups / groups, params["target_zero_variance"] / 3),
                                   ("p_hard", hard_groups / groups, 2 * params["target_zero_variance"] / 3)):
            step = -params["p_step"] if share >= target else params["p_step"]
            state[key] = min(max(state[key] + step, params["p_min"]), params["p_max"])
    if outcome.epoch_end:
        state["epochs"] += 1
    state["next_step"] = outcome.step + 1
    return state


BUDGETS.register("greso")(BudgetController(init=_greso_init, allocate=greso_allocate, update=_greso_update))


# ----------------------------------------------------------------------------------------------- adaptive


def _adaptive_init(n: int = 8, n_min: int = 2, informative_target: float | None = None,
                   probe_decay: float = 0.5, probe_floor: float = 0.1, memory: float = 0.5,
                   prior_strength: float = 2.0, reward_scale: float | None = None,
                   decided_by_accuracy: bool = True, seed: int = 0, min_prompts: int = 1) -> dict:
    """Parameters (see `adaptive_allocate` for the rule):
    n                   rollouts for a prompt never seen before, and the most any prompt gets
    n_min               rollouts of a probe of a decided prompt, and with informative_target the fewest a mixed
                        prompt gets
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
                        format reward varied (`_decided`); needs StepOutcome.accuracy_mean
    seed                of the probe draws (`uniform_draw`)
    min_prompts         a step samples at least this many prompts
    """
    n, n_min, min_prompts = _check_count("n", n), _check_count("n_min", n_min), _check_count("min_prompts",
                                                                                             min_prompts)
    if not n_min <= n:
        raise ValueError(f"budget parameters need n_min <= n, got {n_min}, {n}")
    checks = {"informative_target": (informative_target, informative_target is None
                                     or isinstance(informative_target, (int, float))
                                     and not isinstance(informative_target, bool) and 0 < informative_target < 1),
              "probe_decay": (probe_decay, 0 <= probe_decay <= 1), "probe_floor": (probe_floor, 0 <= probe_floor <= 1),
              "memory": (memory, 0 <= memory < 1), "prior_strength": (prior_strength, prior_strength > 0),
              "reward_scale": (reward_scale, reward_scale is None or reward_scale > 0),
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
              "decided_by_accuracy": decided_by_accuracy, "seed": seed, "min_prompts": min_prompts}
    return {"params": params, "next_step": 0, "max_std": 0.0, "min_mean": None, "max_mean": None, "prompts": {}}


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
    for k in range(low, high + 1):
        if 1 - p**k - (1 - p) ** k >= target:
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
    2. Decided prompts — the last z >= 1 visits were decided (`_decided`): zero reward variance, no rollout
       survived pruning, or (decided_by_accuracy, with accuracies) all correct / all wrong — are probed with
       n_min rollouts with probability max(probe_decay^(z−1), probe_floor) and skipped (0) otherwise; z = 1 is
       always probed. The probe is GRESO's skip (Zheng et al. 2025, arXiv 2506.02177: zero-variance prompts
       tend to stay so, skip them with a probability growing with the streak, keep exploring) made cheap: n_min
       rollouts instead of n, so a probe costs little and a prompt that has become uncertain again shows mixed
       outcomes and returns to rule 3.
    3. Mixed prompts: n (default). With `informative_target` set, `informative_count` of their success rate p
       (`_prompt_success_rate`, pooled over visits): the fewest rollouts, within [n_min, n], that give unequal
       outcomes with probability >= informative_target. A prompt at p = 1/2 needs 5 of 8 for 0.9; a rare success
       or failure (p <= 0.2 or >= 0.8) keeps all n (Knapsack-RL's value, Li et al. 2025, arXiv 2509.25849).
    Draws u = uniform_draw(seed, step, id). At least `min_prompts` prompts get rollouts (n_min, if forced).

    What this does not do, and why: per-prompt kept counts enter only as "did anything survive" (rule 2). For
    a mixed group, the share-based pruners (fastrl, cppo, pods) keep a fixed share of whatever was sampled, so
    a prompt's kept count mirrors its sampled count and carries no further information about it. Nor is the
    total held at a kept-rollout target: the former `adaptive` did that and sampled 1 % MORE than GRPO in the
    paper-like regime (NOTES §7).

    Measured (embedded default, 100 steps of 16 prompts × 8 on 128 training prompts, i.e. 12.5 visits per
    prompt, pruner fastrl, greedy accuracy on 256 test problems every 20 steps; final / mean of the last three
    evaluations): seed 0 — `fixed` 12,800 rollouts sampled, 0.613 / 0.599; this rule with rule 3 at 0.9 7,384
    (−42 %), 0.625 / 0.607; the former rule 11,471 (−10 %), 0.629 / 0.613. Seed 1 — `fixed` 12,800, 0.504 /
    0.574; this rule 7,837 (−39 %), 0.609 / 0.617. Two seeds, so accuracy is "not worse within seed noise",
    not "better".

    Measured in the paper regime (configs/paper.yaml, no pruner, 5 seeds, mean@4, paired against GRPO): with
    rule 3 at informative_target 0.9, 35 % fewer rollouts, −0.8 ± 0.5 pts per step, +1.3 ± 0.9 at equal time
    (docs/bench/paper-cost); without it (only rule 2 cuts), 12 % fewer, +0.4 ± 1.4 per step, +1.3 ± 1.2 at equal
    time (docs/bench/paper-decided, run as informative_target 0.99, which keeps all 8). Rule 3 saves time at
    about the rate it loses accuracy per step and gains nothing at equal time, hence off by default. Over 160
    steps with the fastrl pruner (docs/bench/paper-long and its cut95/, two machines): off −20 % rollouts,
    +2.4 ± 1.8 pts per step; 0.95 −32 %, −1.9 ± 1.9; 0.9 −44 %, −2.9 ± 2.3. The cut rollouts are worth more on
    their mixed prompt than on further ones: 0.95 with its savings spent on further prompts (the trainer's
    max_prompts_per_step=32) up to GRPO's total is +2.4 ± 2.2 per step, level with rule 3 off, which samples
    20 % fewer (docs/bench/paper-long/fill); up to rule 3 off's total (rollouts_per_step=102) it is −1.1 ± 1.7
    behind rule 3 off per step and −1.3 ± 0.6 at equal time (docs/bench/paper-long/fill80). Counted in rollouts
    (8 seeds, docs/bench/paper-long/shared-prompts/cuts and even; head to head, `metrics.difference_at_equal`):
    rule 2 alone reaches GRPO's target with 0.78× its rollouts; 0.9 is +3.7 ± 1.6 pts above rule 3 off at equal
    rollouts, and rule 3 beats sampling fewer for every prompt at about the same count (0.95 vs 6 of 8 rollouts
    per prompt +2.1 ± 0.7, 0.9 vs 5 of 8 +1.7 ± 1.5), though most of any per-rollout gain here is sampling fewer
    per step at all (6 of 8 for every prompt is +3.4 ± 0.5 over 8 at equal rollouts). Why no rule cuts
    much more there without cutting mixed groups: over a GRPO run of that config (seed 0, 1,280 groups) only
    7 % of groups are decided and 16 % are mixed with one rare outcome (1 of 8); 77 % are at 2–6 of 8 correct,
    and each quarter of the run is within 3.5 pts of that (`fastrl train --method grpo configs/paper.yaml
    eval_every=0 eval_samples=0 store_dir=S`, then `benchmarks/paired_methods.py --budget S`).
    """
    params = state["params"]
    n, n_min = params["n"], params["n_min"]
    scale = _reward_scale(state)
    counts, draws, skip = [], [], []
    for prompt in prompt_ids:
        history = state["prompts"].get(prompt)
        draws.append(uniform_draw(params["seed"], state["next_step"], prompt))
        if history is None:
            counts.append(n)
            skip.append(0.0)
        elif history["streak"] > 0:
            probe = max(params["probe_decay"] ** (history["streak"] - 1), params["probe_floor"])
            skip.append(1.0 - probe)
            counts.append(0 if draws[-1] < 1.0 - probe else n_min)
        else:
            skip.append(0.0)
            counts.append(_mixed_count(history, params, scale))
    return _keep_some(counts, draws, skip, n_min, min(params["min_prompts"], len(prompt_ids)))


def _adaptive_update(state: dict, outcome: StepOutcome) -> dict:
    """Per sampled prompt: discounted pooled reward variance (sumsq += n·std², dof += n − 1) and, with
    accuracies, discounted correct / all counts (hits += n·accuracy, trials += n); the streak of decided visits
    (`_decided`; a skipped visit leaves it as it is), visits and the last kept count; batch: the reward range for
    the learned scale, and the step for the draws."""
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
        by_accuracy = accuracy if params["decided_by_accuracy"] else None
        history["streak"] = history["streak"] + 1 if _decided(std, kept, by_accuracy) else 0
        history["seen"] += 1
        history["kept"] = kept
        state["max_std"] = max(state["max_std"], std)
        state["min_mean"] = mean if state["min_mean"] is None else min(state["min_mean"], mean)
        state["max_mean"] = mean if state["max_mean"] is None else max(state["max_mean"], mean)
    state["next_step"] = outcome.step + 1
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
    for key in ("sampled", "kept", "reward_mean", "reward_std", "accuracy_mean"):
        if getattr(outcome, key) is not None and getattr(outcome, key).shape != (g,):
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
