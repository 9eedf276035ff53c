"""The baseline budget controllers (registered in `algo.budgets`): the authors' RolloutSA, the paper's ARS as
written, and GRESO's pre-rollout skip. Each is an init / allocate / update triple over a JSON-able state.

- `rollout_sa`        the authors' RolloutSA (docs/notes.md §1), one n for all prompts, changed at epoch ends.
- `rollout_sa_paper`  the paper's ARS as written in its §3.3 Eqs. 10–14 (max over the epoch's questions).
- `greso`             GRESO (Zheng et al. 2025): skip prompts that were zero-variance on their recent visits.
"""

from __future__ import annotations

from typing import Sequence

from fastrl_core.algo.budget_base import PromptOutcomes, check_count, keep_some, uniform_draw
from fastrl_core.algo.numerics import ZERO_STD


RSA_FLOOR = 2  # the authors' lower bound on n


def rollout_sa_init(n: int = 8) -> dict:
    """n0 = n; f1 / f2 collect this epoch's per-step values; g1 is set once, at the end of the first epoch."""
    n = check_count("n", n, RSA_FLOOR)
    return {"n0": n, "n": n, "g1": None, "f1": [], "f2": [], "f3": None, "epochs": 0}


def rollout_sa_update(state: dict, outcome: PromptOutcomes) -> dict:
    """RolloutSA as in the authors' code (docs/notes.md §1):
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


def _epoch_end_n(n0: int, reference: float | None, mean: float, top: float, outcome: PromptOutcomes
                 ) -> tuple[float, float, int]:
    """The epoch-end rule both RolloutSA variants share, from the epoch's mean and max kept counts:
    g = α·mean + (1 − α)·top with α = (step + 1) / total_steps; the reference (mean + top) / 2 of the first epoch
    (kept once set); n = max(round(n0 − max(reference − g, 0)), 2). Returns (g, reference, n)."""
    alpha = (outcome.step + 1) / outcome.total_steps
    g = alpha * mean + (1 - alpha) * top
    reference = (mean + top) / 2 if reference is None else reference
    return g, reference, max(round(n0 - max(reference - g, 0.0)), RSA_FLOOR)






def rollout_sa_paper_init(n: int = 8) -> dict:
    """G1 = n; the epoch's kept-count sum, question count and maximum; G'_ref is set at the first epoch end."""
    n = check_count("n", n, RSA_FLOOR)
    return {"n0": n, "n": n, "g_ref": None, "g_t": None, "kept_sum": 0.0, "questions": 0, "kept_max": None,
            "epochs": 0}


def rollout_sa_paper_update(state: dict, outcome: PromptOutcomes) -> dict:
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


def greso_init(n: int = 8, p_easy: float = 0.5, p_hard: float = 0.5, target_zero_variance: float = 0.25,
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
    n, min_prompts = check_count("n", n), check_count("min_prompts", min_prompts)
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
    return keep_some(counts, draws, skip, params["n"], min(params["min_prompts"], len(prompt_ids)))


def greso_update(state: dict, outcome: PromptOutcomes) -> dict:
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
        if std <= ZERO_STD:
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
