"""Pure summaries behind the pages: DataFrames in, DataFrames or numbers out (no Streamlit, no I/O)."""

from __future__ import annotations

import numpy as np
import pandas as pd

REASON_TEXT = {
    "KEPT": "kept for the update",
    "ZERO_ADVANTAGE": "advantage 0: no policy gradient, pruning it is free",
    "ZERO_VARIANCE_GROUP": "every reward in its group was equal",
    "LOW_ADVANTAGE": "|advantage| too small to beat the kept rollouts",
    "REDUNDANT": "its gradient direction was already covered by a kept rollout",
    "OVER_BUDGET": "outside the max-variance subset of the group",
    "NOT_SAMPLED": "lost the random draw of its stratum (importance reweighting)",
}


def reason_label(reason: object) -> str:
    """`ZERO_ADVANTAGE` -> `zero advantage`; None -> `—`."""
    if reason is None or (isinstance(reason, float) and np.isnan(reason)):
        return "—"
    return str(reason).replace("_", " ").lower()


def pruned_reason(kept: bool, reason: object) -> str:
    """The reason shown next to a rollout: empty for a kept one, else its reason label."""
    return "" if kept else reason_label(reason)


def reason_text(reason: object) -> str:
    """A one-line explanation of a pruner's reason code (the code itself when unknown)."""
    return REASON_TEXT.get(str(reason).upper(), reason_label(reason))


def run_status(run: pd.Series, now: pd.Timestamp, stale_after_s: float = 300.0) -> str:
    """"running", "finished", "failed", "stopped", or "stalled" for a running run with no step for a while."""
    status = str(run["status"])
    last = run.get("last_write")
    if status == "running" and last is not None and not pd.isna(last):
        if (now - pd.Timestamp(last)).total_seconds() > stale_after_s:
            return "stalled"
    return status


def first_reach(x: pd.Series | np.ndarray, y: pd.Series | np.ndarray, target: float) -> float | None:
    """The first x (in order) at which y >= target, or None if never. NaN y never counts."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hits = np.flatnonzero(y >= target)
    return float(x[hits[0]]) if len(hits) else None


def accuracy_curves(steps: pd.DataFrame, evals: pd.DataFrame, *, source: str, window: int = 5) -> pd.DataFrame:
    """Accuracy per run against step and wall-clock seconds: columns run_id, step, wall_time, accuracy.

    source "eval": the evaluation rows (their own wall_time when recorded, else the wall_time of the steps row
    with that step number). source "train": the rollouts' accuracy, rolling mean over `window` steps.
    """
    if source == "train":
        frame = steps[["run_id", "step", "wall_time", "accuracy"]].sort_values(["run_id", "step"])
        frame["accuracy"] = frame.groupby("run_id")["accuracy"].transform(
            lambda s: s.rolling(window, min_periods=1).mean())
        return frame.reset_index(drop=True)
    if source != "eval":
        raise ValueError(f"accuracy_curves: source must be 'eval' or 'train', got {source!r}")
    frame = evals[["run_id", "step", "accuracy"] + (["wall_time"] if "wall_time" in evals else [])].copy()
    if "wall_time" not in frame:
        frame["wall_time"] = np.nan
    lookup = steps.set_index(["run_id", "step"])["wall_time"]
    missing = frame["wall_time"].isna()
    frame.loc[missing, "wall_time"] = [
        lookup.get((run, step), 0.0 if step == 0 else np.nan)
        for run, step in zip(frame.loc[missing, "run_id"], frame.loc[missing, "step"])]
    return frame.sort_values(["run_id", "step"]).reset_index(drop=True)


def time_to_target(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per run: the first step and wall-clock seconds at which the curve reaches `target` (NaN if never)."""
    rows = []
    for run_id, curve in curves.groupby("run_id", sort=False):
        curve = curve.sort_values("step")
        rows.append({"run_id": run_id,
                     "step": first_reach(curve["step"], curve["accuracy"], target),
                     "seconds": first_reach(curve["wall_time"], curve["accuracy"], target)})
    return pd.DataFrame(rows, columns=["run_id", "step", "seconds"]).astype({"step": float, "seconds": float})


def speedup(seconds: pd.Series, baseline: str) -> pd.Series:
    """Speed-up of every run over `baseline`: baseline seconds / run seconds (NaN where either is missing)."""
    if baseline not in seconds.index:
        raise KeyError(f"speedup: baseline run {baseline!r} not among {list(seconds.index)}")
    return seconds[baseline] / seconds


def phase_seconds(steps: pd.DataFrame, phases: tuple[str, ...]) -> pd.DataFrame:
    """Mean seconds per step spent in each phase, long format: run_id, phase, seconds."""
    columns = [f"time_{p}" for p in phases if f"time_{p}" in steps]
    means = steps.groupby("run_id", sort=False)[columns].mean()
    long = means.reset_index().melt(id_vars="run_id", var_name="phase", value_name="seconds")
    long["phase"] = long["phase"].str.removeprefix("time_")
    return long.dropna(subset=["seconds"])


def reason_counts(rollouts: pd.DataFrame) -> pd.DataFrame:
    """Pruned rollouts per step and reason: columns step, reason, count (kept rollouts left out)."""
    pruned = rollouts.loc[~rollouts["kept"].astype(bool)]
    counts = pruned.groupby(["step", "reason"], dropna=False).size().rename("count").reset_index()
    counts["reason"] = counts["reason"].map(reason_label)
    return counts


def budget_heatmap(matrix: pd.DataFrame, max_prompts: int = 60) -> pd.DataFrame:
    """Rollouts sampled per prompt (rows) and step (columns) for the prompts sampled most often; NaN = not sampled.

    Rows are ordered by the step at which each prompt was first sampled.
    """
    if matrix.empty:
        return pd.DataFrame()
    counts = matrix.groupby("prompt_id")["step"].agg(["size", "min"])
    chosen = counts.sort_values(["size", "min"], ascending=[False, True]).head(max_prompts)
    table = matrix[matrix["prompt_id"].isin(chosen.index)].pivot_table(
        index="prompt_id", columns="step", values="sampled", aggfunc="sum")
    return table.loc[chosen.sort_values("min").index]


def pick_informative_group(groups: pd.DataFrame) -> str | None:
    """The prompt whose group best shows pruning: rewards differ (std > 0) and some but not all rollouts were
    pruned; among those the largest group, then the largest reward std. Falls back to any group with a pruned
    rollout, then to the first group; None when there are no groups."""
    if groups.empty:
        return None
    partly = groups[(groups["reward_std"] > 0) & (groups["kept"] > 0) & (groups["kept"] < groups["sampled"])]
    if not partly.empty:
        best = partly.sort_values(["sampled", "reward_std"], ascending=False, kind="stable")
        return str(best.iloc[0]["prompt_id"])
    pruned = groups[groups["kept"] < groups["sampled"]]
    return str((pruned if not pruned.empty else groups).iloc[0]["prompt_id"])


def find_baseline(runs: pd.DataFrame, run_id: str) -> str | None:
    """A plain-GRPO run (pruner "none") to compare `run_id` with: same dataset when possible, newest first."""
    this = runs.loc[runs["run_id"] == run_id]
    candidates = runs[(runs["pruner"] == "none") & (runs["run_id"] != run_id)]
    if candidates.empty:
        return None
    if not this.empty:
        same = candidates[candidates["dataset"] == this.iloc[0]["dataset"]]
        candidates = same if not same.empty else candidates
    return str(candidates.sort_values("started", ascending=False).iloc[0]["run_id"])


def filter_rollouts(rollouts: pd.DataFrame, *, prompt_id: str | None = None, kept: bool | None = None,
                    correct: bool | None = None, reasons: list[str] | None = None) -> pd.DataFrame:
    """Rows matching every given filter; correct means accuracy_reward > 0 (as the store's read_rollouts)."""
    mask = pd.Series(True, index=rollouts.index)
    if prompt_id is not None:
        mask &= rollouts["prompt_id"] == prompt_id
    if kept is not None:
        mask &= rollouts["kept"].astype(bool) == kept
    if correct is not None:
        mask &= (rollouts["accuracy_reward"].fillna(0) > 0) == correct
    if reasons:
        mask &= rollouts["reason"].isin(reasons)
    return rollouts[mask]


def selected_keys(points: list[dict]) -> list[tuple[int, str]]:
    """(step, rollout_id) of Plotly selection points whose custom_data was [step, rollout_id].

    Streamlit returns customdata as a list or as a dict keyed "0", "1" (NOTES §4); points without it are skipped.
    """
    keys = []
    for point in points:
        custom = point.get("customdata")
        if custom is None:
            continue
        step, rollout_id = (custom["0"], custom["1"]) if isinstance(custom, dict) else (custom[0], custom[1])
        keys.append((int(step), str(rollout_id)))
    return keys


def comparison(curves: pd.DataFrame, run_id: str, baseline: str) -> dict:
    """Headline of run vs baseline: the target is the baseline's latest accuracy; seconds each run took to reach it,
    speed-up = baseline seconds / run seconds (None when the run has not reached it), latest accuracies."""
    base = curves[curves["run_id"] == baseline].sort_values("step")
    this = curves[curves["run_id"] == run_id].sort_values("step")
    if base.empty or this.empty:
        return {"target": None, "baseline_seconds": None, "run_seconds": None, "speedup": None,
                "baseline_accuracy": None if base.empty else float(base["accuracy"].iloc[-1]),
                "run_accuracy": None if this.empty else float(this["accuracy"].iloc[-1])}
    target = float(base["accuracy"].iloc[-1])
    base_seconds = first_reach(base["wall_time"], base["accuracy"], target)
    run_seconds = first_reach(this["wall_time"], this["accuracy"], target)
    return {"target": target, "baseline_seconds": base_seconds, "run_seconds": run_seconds,
            "speedup": base_seconds / run_seconds if base_seconds and run_seconds else None,
            "baseline_accuracy": target, "run_accuracy": float(this["accuracy"].iloc[-1])}
