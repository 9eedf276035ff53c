"""Pure page helpers: DataFrames in, DataFrames or labels out (no Streamlit, no I/O).

The figures themselves (accuracy curves, final accuracy, speed-ups, intervals, seconds per phase) are defined once
in `fastrl_core.metrics`, which the bench and the README use too; this module only shapes data for the pages."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fastrl_core.store import run_state
from fastrl_core.store.layout import STALE_AFTER_S

REASON_TEXT = {
    "KEPT": "kept for the update",
    "ZERO_ADVANTAGE": "advantage 0: no policy gradient, pruning it is free",
    "ZERO_VARIANCE_GROUP": "every reward in its group was equal",
    "LOW_ADVANTAGE": "|advantage| too small to beat the kept rollouts",
    "REDUNDANT": "its gradient direction was already covered by a kept rollout",
    "OVER_BUDGET": "outside the max-variance subset of the group",
    "NOT_SAMPLED": "lost the random draw of its stratum (importance reweighting)",
    "DUPLICATE": "same completion as a kept rollout of its group: updated once, counted as often as sampled",
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


def run_status(run: pd.Series, now: pd.Timestamp, stale_after_s: float = STALE_AFTER_S) -> str:
    """"running", "finished", "failed", "stopped", or "no heartbeat" for a "running" run whose writer has not touched
    its heartbeat for `stale_after_s` (killed without a word; `fastrl_core.store.run_state`)."""
    heartbeat = run.get("heartbeat")
    seconds = None if heartbeat is None or pd.isna(heartbeat) else pd.Timestamp(heartbeat).timestamp()
    return run_state(str(run["status"]), seconds, now.timestamp(), stale_after_s)


def train_accuracy(steps: pd.DataFrame, window: int = 5) -> pd.DataFrame:
    """The training rollouts' accuracy per run, rolling mean over `window` steps: run_id, step, wall_time, accuracy."""
    frame = steps[["run_id", "step", "wall_time", "accuracy"]].sort_values(["run_id", "step"])
    frame["accuracy"] = frame.groupby("run_id")["accuracy"].transform(lambda s: s.rolling(window, min_periods=1).mean())
    return frame.reset_index(drop=True)


def phases_long(frame: pd.DataFrame, label: str, phases: tuple[str, ...], kind: str = "time") -> pd.DataFrame:
    """Wide `<kind>_<phase>` columns (metrics.run_figures / summarise `_mean` columns) to long rows: label, phase,
    seconds; phases without a value are left out."""
    rows = []
    for _, row in frame.iterrows():
        for phase in phases:
            value = row.get(f"{kind}_{phase}", row.get(f"{kind}_{phase}_mean"))
            if value is not None and pd.notna(value):
                rows.append({label: row[label], "phase": phase, "seconds": float(value)})
    return pd.DataFrame(rows, columns=[label, "phase", "seconds"])


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


def pruning_saving(steps: pd.DataFrame) -> str:
    """One sentence on what pruning saved in a run, from its steps rows (phase seconds and rollout counts): which
    passes the pruned rollouts skipped (the update always; the reference / old log-prob passes only if the run spent
    time in them) and, assuming those passes cost the same per rollout, the seconds the pruned ones would have added."""
    sampled, kept = int(steps["rollouts_sampled"].sum()), int(steps["rollouts_kept"].sum())
    update = float(steps["time_update"].sum()) if "time_update" in steps else 0.0
    logprob = float(steps["time_logprob"].sum()) if "time_logprob" in steps else 0.0
    if sampled == 0 or kept >= sampled:
        return "No rollout was pruned in this run."
    passes = "the update and the reference / old log-prob passes" if logprob > 0 else \
        "the update (no reference or old log-prob pass ran in this run)"
    text = f"The {sampled - kept:,} pruned rollouts of {sampled:,} skipped {passes}."
    if kept:
        extra = (update + logprob) * (sampled - kept) / kept
        text += (f" The {kept:,} kept ones cost {update + logprob:.0f} s there; at that cost per rollout the pruned ones "
                 f"would have added ~{extra:.0f} s.")
    rho = steps["row_cost"].dropna() if "row_cost" in steps else pd.Series(dtype=float)
    if len(rho):
        text += (f" Its keep count came from pass costs on {len(rho):,} of {len(steps):,} steps: a kept row cost "
                 f"ρ = {rho.median():.4f} (median; {rho.min():.4f}–{rho.max():.4f}) of the step's other seconds, and "
                 "a row was kept when its share of the step's |A| mass beat its share of the seconds.")
    return text
