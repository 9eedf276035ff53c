"""Where a run's nominal rollouts went, and what a method saved over plain GRPO (pure: DataFrames and dicts in,
DataFrames and dicts out), for the dashboard's pages and `fastrl report`.

Per step, from its steps rows (`store.step_rows` writes the columns): nominal = prompts × n (what plain GRPO
samples) = skipped (by the budget) + merged (duplicates of a completion of their group) + pruned (by the method's
rule) + kept (`rollout_split`, summed by `split_totals`). `credited_saving` splits a method's saving over its
baseline into budget, rule and merge shares of nominal; `passes_after_pruning` names the passes pruned rows skip.
"""

from __future__ import annotations

import math

import pandas as pd

SPLIT_PARTS = ("skipped", "merged", "pruned", "kept")
SPLIT_LABELS = {"skipped": "skipped by the budget", "merged": "merged as duplicates (every method)",
                "pruned": "pruned by the method's rule", "kept": "kept (enter the passes)"}
_SPLIT_COLUMNS = {"nominal": "rollouts_nominal", "skipped": "rollouts_skipped", "merged": "rollouts_merged",
                  "pruned": "rollouts_pruned", "kept": "rollouts_kept"}


def has_split(steps: pd.DataFrame) -> bool:
    """Whether every step row records the split (`store.step_rows`; stores written before 2026-12-06 do not)."""
    return len(steps) > 0 and all(c in steps and steps[c].notna().all() for c in _SPLIT_COLUMNS.values())


def rollout_split(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step: step, nominal (prompts × n, what plain GRPO samples), skipped (by the budget, never sampled),
    merged (copies of an identical completion of their group), pruned (distinct rollouts the method's own rule
    dropped), kept; nominal = skipped + merged + pruned + kept. A step without the split, or one whose parts do not
    add up, raises naming it."""
    missing = [c for c in _SPLIT_COLUMNS.values() if c not in steps]
    if missing:
        raise ValueError(f"rollout_split: the steps rows have no {missing[0]!r} (a store written before the split)")
    frame = pd.DataFrame({"step": steps["step"].to_numpy()})
    for part, column in _SPLIT_COLUMNS.items():
        values = steps[column]
        if values.isna().any():
            raise ValueError(f"rollout_split: step {int(steps['step'][values.isna()].iloc[0])} has no {column!r}")
        frame[part] = values.astype("int64").to_numpy()
    wrong = frame["nominal"] != frame[list(SPLIT_PARTS)].sum(axis=1)
    if wrong.any():
        row = frame[wrong].iloc[0]
        raise ValueError(f"rollout_split: step {int(row['step'])}: nominal {int(row['nominal'])} != skipped + merged "
                         f"+ pruned + kept = {int(row[list(SPLIT_PARTS)].sum())}")
    return frame


def split_totals(split: pd.DataFrame) -> dict:
    """The run's sums of `rollout_split`: nominal and each part, and `steps`."""
    return {"steps": int(len(split)), **{part: int(split[part].sum()) for part in ("nominal", *SPLIT_PARTS)}}


def credited_saving(method: dict, baseline: dict) -> dict:
    """What a method saved over its baseline (plain GRPO), credited to what made it, as shares of the nominal
    rollouts (each run's own, so runs of different lengths compare): budget = method's skipped share − baseline's,
    rule = pruned share − baseline's, merge = merged share − baseline's (both merge: this is only how far their
    duplicate rates drifted apart, not the method's doing), total = baseline's kept share − method's. The three
    add up to the total exactly, since each run's four shares add up to 1. Shares are NaN for a run with nothing."""
    share = lambda totals, part: totals[part] / totals["nominal"] if totals["nominal"] else math.nan  # noqa: E731
    return {"budget": share(method, "skipped") - share(baseline, "skipped"),
            "rule": share(method, "pruned") - share(baseline, "pruned"),
            "merge": share(method, "merged") - share(baseline, "merged"),
            "total": share(baseline, "kept") - share(method, "kept")}


def passes_after_pruning(steps: pd.DataFrame, config: dict) -> list[str]:
    """The passes the kept rollouts went through that pruned ones skipped, named from the run's own phase times
    (a pass with no recorded seconds did not run) and its config: "reference log-prob pass" (KL, objective_args
    beta > 0), "old log-prob pass" (recompute_old_logprobs), "update"."""
    def spent(phase: str) -> bool:
        column = f"time_{phase}"
        return column in steps and float(steps[column].fillna(0).sum()) > 0

    passes = []
    if spent("logprob"):
        if float((config.get("objective_args") or {}).get("beta", 0) or 0) > 0:
            passes.append("reference log-prob pass")
        if config.get("recompute_old_logprobs") is True:
            passes.append("old log-prob pass")
    if spent("update"):
        passes.append("update")
    return passes
