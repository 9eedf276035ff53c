"""Pure page helpers: DataFrames in, DataFrames or labels out (no Streamlit, no I/O).

The figures themselves (accuracy curves, final accuracy, speed-ups, intervals, seconds per phase) are defined once
in `fastrl_app.metrics`, which the bench and the README use too; this module only shapes data for the pages."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from fastrl_app.palette import NEGATIVE, NEUTRAL, POSITIVE, rgba
from fastrl_core.store import run_state
from fastrl_core.store.config_history import config_at
from fastrl_core.store.layout import STALE_AFTER_S

REASON_TEXT = {
    "KEPT": "kept for the update",
    "ZERO_ADVANTAGE": "advantage 0: no policy gradient, pruning it is free",
    "ZERO_VARIANCE_GROUP": "every reward in its group was equal",
    "LOW_ADVANTAGE": "|advantage| too small to beat the kept rollouts",
    "REDUNDANT": "its gradient direction was already covered by a kept rollout",
    "OVER_BUDGET": "outside the max-variance subset of the group",
    "NOT_SAMPLED": "outside its group's random subset (pruner random)",
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


def reason_labels(counts: pd.DataFrame) -> pd.DataFrame:
    """read_reason_counts rows with each reason as its label (`reason_label`), for the chart."""
    return counts.assign(reason=counts["reason"].map(reason_label))


def budget_heatmap(matrix: pd.DataFrame, max_prompts: int | None = None, value: str = "sampled", *,
                   prompts: list[str] | None = None, bin_steps: int = 1) -> pd.DataFrame:
    """`value` (rollouts sampled, or kept) per prompt (rows) and step (columns: every step of the run, not only the
    first ones); NaN = prompt not drawn that step. Every prompt, or `prompts`, or the `max_prompts` drawn most
    often. Rows are ordered by the step at which each prompt was first drawn. With `bin_steps` = w > 1 a column is
    w steps (labelled by its first) and a cell sums the prompt's visits in them (NaN: none)."""
    if matrix.empty:
        return pd.DataFrame()
    counts = matrix.groupby("prompt_id")["step"].agg(["size", "min"])
    chosen = counts.sort_values(["size", "min"], ascending=[False, True])
    if prompts is not None:
        chosen = chosen.loc[[p for p in prompts if p in chosen.index]]
    if max_prompts is not None:
        chosen = chosen.head(max_prompts)
    first, last = int(matrix["step"].min()), int(matrix["step"].max())
    rows = matrix[matrix["prompt_id"].isin(chosen.index)]
    rows = rows.assign(column=first + (rows["step"] - first) // bin_steps * bin_steps)
    table = rows.pivot_table(index="prompt_id", columns="column", values=value, aggfunc="sum")
    table.columns.name = "step"
    return table.reindex(columns=list(range(first, last + 1, bin_steps))).loc[
        chosen.sort_values("min", kind="stable").index]


def heatmap_prompts(matrix: pd.DataFrame) -> list[str]:
    """Every prompt of the budget matrix in the heatmap's row order: by the step it was first drawn."""
    return matrix.groupby("prompt_id")["step"].min().sort_values(kind="stable").index.tolist()


def map_steps(steps: pd.DataFrame, max_points: int) -> list[int]:
    """The steps of `steps` (rows with step and rollouts_sampled) whose rollouts a map of at most `max_points` points
    shows: all of them when they fit, else evenly spaced steps, every rollout of each (a sample of whole steps, so a
    group's rollouts stay together)."""
    ids, sampled = steps["step"].astype(int).tolist(), steps["rollouts_sampled"].astype(int)
    if sampled.sum() <= max_points or len(ids) <= 1:
        return ids
    count = max(1, min(len(ids), int(max_points // max(1.0, float(sampled.mean())))))
    return [ids[i] for i in sorted(set(np.linspace(0, len(ids) - 1, count).round().astype(int).tolist()))]


def step_range(asked: str | None, step_ids: list[int]) -> tuple[int, int] | None:
    """A link's ?steps=a-b as (a, b) when both are steps of the run and a <= b, else None."""
    match = re.fullmatch(r"(\d+)-(\d+)", asked or "")
    if not match:
        return None
    low, high = int(match[1]), int(match[2])
    return (low, high) if low in step_ids and high in step_ids and low <= high else None


def default_run(runs: pd.DataFrame, states: list[str]) -> str:
    """The run a page opens on when no link or earlier choice names one: the one the dashboard is about, a FastRL run
    (pruner fastrl), else any run that prunes or budgets (not plain GRPO), else any; among those a running one
    first, then the newest (`runs` newest first; `states` their run_status)."""
    running = pd.Series([s == "running" for s in states], index=runs.index)
    for pool in (runs["pruner"] == "fastrl", (runs["pruner"] != "none") | (runs["budget"] != "fixed"),
                 pd.Series(True, index=runs.index)):
        if pool.any():
            chosen = runs[pool & running] if (pool & running).any() else runs[pool]
            return str(chosen["run_id"].iloc[0])
    raise ValueError("default_run: no runs")


_LITERAL = re.compile(r"[^A-Za-z0-9 ._#/?=&-]")


def literal(value: object, limit: int = 80) -> str:
    """`value` (from a URL or a dataset) as a Markdown code span that renders as the text itself: characters that
    Markdown or Streamlit could read as syntax (backticks, brackets, colons, $, <, ...) become "?", and it is cut to
    `limit` characters. Put free text (a question) in st.text instead."""
    text = _LITERAL.sub("?", str(value))
    return f"`{text[:limit]}{'…' if len(text) > limit else ''}`" if text.strip() else "`?`"


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

    Streamlit returns customdata as a list or as a dict keyed "0", "1" (docs/notes.md §4); points without it are
    skipped.
    """
    keys = []
    for point in points:
        custom = point.get("customdata")
        if custom is None:
            continue
        step, rollout_id = (custom["0"], custom["1"]) if isinstance(custom, dict) else (custom[0], custom[1])
        keys.append((int(step), str(rollout_id)))
    return keys


def budget_decision(sampled: int, n: int, n_min: int = 2) -> str:
    """The budget's decision for one visit of a prompt from the rollouts it sampled: "skip" (0), "probe" (the
    adaptive budget's n_min for a decided prompt), "full" (n, as plain GRPO), "trimmed" (anything else, e.g. a
    mixed prompt under informative_target)."""
    if sampled <= 0:
        return "skip"
    if sampled >= n:
        return "full"
    return "probe" if sampled == n_min else "trimmed"


def visit_outcome(sampled: int, reward_mean: float, reward_std: float) -> str:
    """A visit's outcome from its group's rewards: "not sampled", "mixed" (rewards differ: a gradient), or "all
    equal (r = x)" (no gradient)."""
    if sampled <= 0:
        return "not sampled"
    if reward_std > 0:
        return "mixed"
    return f"all equal (r = {reward_mean:.2f})"


def prompt_timeline(groups: pd.DataFrame, prompt_id: str, n: int, n_min: int = 2) -> pd.DataFrame:
    """Every visit of one prompt: step, sampled, kept, merged (NaN where not recorded), reward mean / std, outcome and
    the budget's decision, in step order."""
    visits = groups[groups["prompt_id"] == prompt_id].sort_values("step").copy()
    if "merged" not in visits:
        visits["merged"] = np.nan
    visits["decision"] = [budget_decision(int(s), n, n_min) for s in visits["sampled"]]
    visits["outcome"] = [visit_outcome(int(s), m, d) for s, m, d in
                         zip(visits["sampled"], visits["reward_mean"], visits["reward_std"])]
    return visits[["step", "sampled", "kept", "merged", "reward_mean", "reward_std", "outcome", "decision"]
                  ].reset_index(drop=True)


DUPLICATE = "DUPLICATE"  # the reason the store records for a merged copy (`store.step_rows`)
FATES = ("kept", "merged", "pruned")  # what became of a sampled rollout: the split's parts after the budget


def fates(rollouts: pd.DataFrame) -> pd.Series:
    """Each rollout's part of the split (`fastrl_app.savings`): "kept", "merged" (a copy of an identical completion
    of its group, merged into it: recorded with reason DUPLICATE) or "pruned" (by the method's own rule). Stores
    written before 2026-12-07 recorded a copy of a pruned answer under that answer's reason: there it reads pruned."""
    merged = rollouts["reason"].map(lambda r: isinstance(r, str) and r.upper() == DUPLICATE).astype(bool)
    kept = rollouts["kept"].astype(bool)
    return pd.Series(np.where(kept, "kept", np.where(merged, "merged", "pruned")), index=rollouts.index, dtype=object)


def multiplicity(rollouts: pd.DataFrame) -> pd.Series:
    """How many sampled rollouts each row stands for (`algo.duplicates`): 0 for a merged copy; for the first other
    row of its (step, prompt, completion text), 1 + the copies with that text; 1 for any other row."""
    if rollouts.empty:
        return pd.Series([], dtype="int64", index=rollouts.index)
    keys = [c for c in ("step", "prompt_id", "completion") if c in rollouts]
    copy = fates(rollouts) == "merged"
    copies = copy.groupby([rollouts[k] for k in keys], sort=False).transform("sum")
    first = ~copy & ~rollouts[keys].assign(copy=copy).duplicated(keep="first")
    return pd.Series(np.where(copy, 0, np.where(first, 1 + copies, 1)), index=rollouts.index, dtype="int64")


def split_sentence(totals: dict, passes: list[str]) -> str:
    """What the run did with its nominal rollouts (`savings.split_totals`), naming only the passes that ran."""
    nominal = totals["nominal"]
    if not nominal:
        return "No step recorded the split of its rollouts yet."
    share = lambda part: totals[part] / nominal  # noqa: E731
    named = ", ".join(passes) if passes else "no pass after pruning (no update ran)"
    return (f"Of {nominal:,} rollouts plain GRPO would have sampled ({plural(totals['steps'], 'step')} × prompts × "
            "n): "
            f"**{totals['skipped']:,} ({share('skipped'):.0%}) skipped by the budget**, "
            f"{totals['merged']:,} ({share('merged'):.0%}) merged as duplicates (every method merges), "
            f"**{totals['pruned']:,} ({share('pruned'):.0%}) pruned by the method's rule**, "
            f"{totals['kept']:,} ({kept_share(totals):.0%}) kept for the passes that ran: {named}.")


def credit_sentence(method: str, baseline: str, credit: dict) -> str:
    """The saving credited to the method over its GRPO run (`savings.credited_saving`), in points of nominal."""
    if not np.isfinite(credit["total"]):
        return "No rollouts recorded yet to credit."
    return (f"Against {baseline}, {method} sent **{credit['total']:.1%} fewer** of its nominal rollouts into the "
            f"passes (points of nominal): the budget {credit['budget']:+.1%}, the pruning rule "
            f"{credit['rule']:+.1%}; merging duplicates "
            f"(both methods do it) accounts for {credit['merge']:+.1%}, credited to neither.")


def pruning_saving(steps: pd.DataFrame, passes: list[str] | None = None) -> str:
    """One sentence on the seconds pruning saved in a run, from its steps rows: the kept rows' seconds in the passes
    after pruning (`passes`, named from the run's own phase times) and, at that cost per row, what the rows dropped
    after sampling would have added. Where nothing was dropped after sampling, says so."""
    sampled, kept = int(steps["rollouts_sampled"].sum()), int(steps["rollouts_kept"].sum())
    update = float(steps["time_update"].fillna(0).sum()) if "time_update" in steps else 0.0
    logprob = float(steps["time_logprob"].fillna(0).sum()) if "time_logprob" in steps else 0.0
    if sampled == 0 or kept >= sampled:
        return "No sampled rollout was left out of the passes in this run."
    if passes is None:
        passes = (["log-prob passes"] if logprob > 0 else []) + (["update"] if update > 0 else [])
    if not passes:
        return (f"The {sampled - kept:,} rollouts of {sampled:,} sampled that were left out saved no time yet: no "
                "pass after pruning has run.")
    named = " and the ".join(passes)
    text = f"The {sampled - kept:,} rollouts of {sampled:,} sampled that were left out skipped the {named}."
    if kept and update + logprob > 0:
        extra = (update + logprob) * (sampled - kept) / kept
        text += (f" The {kept:,} kept ones cost {update + logprob:.0f} s there; at that cost per rollout the others "
                 f"would have added ~{extra:.0f} s.")
    rho = steps["row_cost"].dropna() if "row_cost" in steps else pd.Series(dtype=float)
    rho = rho[rho > 0]
    if len(rho):
        text += (f" Its keep count came from pass costs on {len(rho):,} of {len(steps):,} steps (a kept row cost "
                 f"ρ = {rho.median():.3g} of the step's other seconds, median; {rho.min():.3g}–{rho.max():.3g}).")
    return text


def paired_baseline(runs: pd.DataFrame, run_id: str) -> tuple[str | None, str]:
    """(the plain-GRPO run to set beside `run_id`, "") when one exists: of the same objective and seed, newest
    first, and trained interleaved with it (both named as bench runs, `bench-<method>-seed<seed>`: only `fastrl
    bench` and `fastrl demo` write such runs, and both train their methods step by step in one process); else
    (None, why not)."""
    from fastrl_app import metrics

    labels = metrics.run_labels(runs).set_index("run_id", drop=False)
    names = runs.set_index("run_id")["name"]
    mine = labels.loc[run_id]
    if not metrics.BENCH_NAME.match(str(names[run_id])):
        return None, (f"run {run_id} was not trained interleaved with a GRPO run (`fastrl train` names it "
                      f"{names[run_id]!r}; `fastrl demo` and `fastrl bench` runs are named bench-<method>-seed<n>), "
                      "so its seconds were taken under other load than any GRPO run's and no speed or accuracy "
                      "comparison is given.")
    base = labels[labels["is_baseline"] & (labels["objective"] == mine["objective"]) & (labels["seed"] == mine["seed"])
                  & labels["run_id"].map(lambda r: bool(metrics.BENCH_NAME.match(str(names[r]))))]
    if base.empty:
        return None, (f"there is no plain-GRPO run of seed {mine['seed']} trained interleaved with {run_id} in this "
                      "store (`fastrl demo` trains one beside FastRL; `fastrl bench` one per seed).")
    started = runs.set_index("run_id")["started"]
    return str(max(base["run_id"], key=lambda r: started[r])), ""


def plural(count: int, noun: str) -> str:
    """"1 step", "2 steps", "1,204 steps" (English nouns that take an s)."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def averaged_evaluations(evals_per_run: list[int], window: int) -> list[int]:
    """Per run, how many evaluations after the warm start its "final accuracy" averages (`metrics.final_accuracy`):
    the bench's `window`, fewer while the run has fewer, 0 while it has none after the warm start (step 0).
    `evals_per_run`: each run's evaluations, step 0 included."""
    return [min(window, max(0, int(n) - 1)) for n in evals_per_run]


def final_accuracy_words(averaged: list[int]) -> str:
    """What the final accuracies shown are, from `averaged_evaluations` of the runs behind them: "the mean of the
    last 3 evaluations after the warm start", "... the last 1–3 evaluations ... (each run's own: ...)", or the
    warm start's own accuracy where a run has no evaluation after it yet."""
    trained = sorted({k for k in averaged if k > 0})
    if not trained:
        return "the warm start's accuracy (step 0): no run has an evaluation after it yet"
    low, high = trained[0], trained[-1]
    words = (f"the mean of the last {low if low == high else f'{low}–{high}'} evaluation{'s' if high != 1 else ''} "
             "after the warm start")
    if low != high:
        words += " (each run's own: fewer while a run has fewer)"
    if 0 in averaged:
        words += ", or the warm start's accuracy for a run with none after it yet"
    return words


def kept_share(totals: dict | None) -> float:
    """The "kept" of every page: the rollouts kept for the passes after pruning, as a share of the nominal
    rollouts (plain GRPO's steps × prompts × n; `savings.split_totals`), so the budget's skipped rollouts count as
    not kept. NaN without a split (None: a store written before it) or before any rollout."""
    if not totals or not totals.get("nominal"):
        return math.nan
    return totals["kept"] / totals["nominal"]


KEPT_HELP = ("Kept: the rollouts kept for the passes after pruning, as a share of the rollouts plain GRPO would "
             "sample (steps × prompts × n), so what the budget skipped counts as not kept; the same share on every "
             "page.")


def pick_demo_group(groups: pd.DataFrame, recent: int = 20) -> tuple[int | None, str | None]:
    """(step, prompt) of a group that shows the method's own rule at work, among the last `recent` steps: rewards
    differ, something kept, and a distinct rollout pruned by the rule (sampled − kept − merged > 0); the newest such
    step, then pick_informative_group. (None, None) without groups."""
    if groups.empty:
        return None, None
    last = int(groups["step"].max())
    pool = groups[groups["step"] >= last - recent]
    merged = pool["merged"].fillna(0) if "merged" in pool else 0
    ruled = pool[(pool["reward_std"] > 0) & (pool["kept"] > 0) & (pool["sampled"] - pool["kept"] - merged > 0)]
    if ruled.empty:
        ruled = pool[(pool["reward_std"] > 0) & (pool["kept"] > 0) & (pool["kept"] < pool["sampled"])]
    pool = ruled if not ruled.empty else pool
    step = int(pool["step"].max())
    return step, pick_informative_group(pool[pool["step"] == step])


def group_fate(rollouts: pd.DataFrame, nominal: int | None = None) -> dict:
    """One group's rollouts split as the Budget page splits a step (`fates`): skipped by the budget (nominal − sampled,
    with `nominal` = plain GRPO's n; None when not given), sampled, kept, merged, pruned by the rule, and the rule's
    reasons for those."""
    fate = fates(rollouts)
    ruled = rollouts[fate == "pruned"]
    return {"skipped": None if nominal is None else max(0, int(nominal) - len(rollouts)), "sampled": len(rollouts),
            "kept": int((fate == "kept").sum()), "merged": int((fate == "merged").sum()), "pruned": int(len(ruled)),
            "reasons": ruled["reason"].map(reason_label).value_counts().to_dict()}


def fate_sentence(fate: dict) -> str:
    """A group's split in words, the four parts in the Budget page's order."""
    skipped = "" if fate["skipped"] is None else f"{fate['skipped']} skipped by the budget, "
    return (f"{fate['sampled']} rollouts sampled ({skipped}**{fate['kept']} kept**, {fate['merged']} merged as "
            f"duplicates, {fate['pruned']} pruned by the rule)")


def group_story(group: pd.DataFrame, other: pd.DataFrame, *, run_label: str, base_label: str,
                nominal: int | None = None) -> str:
    """What happened to one prompt's group in the method's run, and to the same prompt at the same step in the
    baseline's run (empty: not there), crediting the method only with what the baseline did not also do; `nominal`:
    plain GRPO's n, for what the budget skipped."""
    mine = group_fate(group, nominal)
    correct = int((group["accuracy_reward"].fillna(0) > 0).sum())
    budget = (f" (its budget skipped {mine['skipped']} of plain GRPO's {nominal})" if mine["skipped"] else
              " (as many as plain GRPO)" if nominal is not None else "")
    lines = [f"1. **Sample.** {run_label} answered this question **{mine['sampled']} times**{budget}; {correct} "
             f"answers were correct, rewards from {group['reward'].min():.2f} to {group['reward'].max():.2f}.",
             f"2. **Merge.** {mine['merged']} answer{'s were copies' if mine['merged'] != 1 else ' was a copy'} of "
             "another answer to the same question: merged into it and counted as often as sampled (every method "
             "merges)."]
    if mine["pruned"]:
        why = "; ".join(f"{count} × {reason}" for reason, count in mine["reasons"].items())
        lines.append(f"3. **Prune.** {run_label}'s own rule dropped {mine['pruned']} distinct answer"
                     f"{'s' if mine['pruned'] != 1 else ''} ({why}).")
    else:
        lines.append(f"3. **Prune.** {run_label}'s rule dropped no distinct answer here.")
    lines.append(f"4. **Update.** {mine['kept']} rows entered the passes after pruning.")
    if other.empty:
        lines.append(f"\n{base_label} has no group of this prompt at this step to compare with.")
    else:
        theirs = group_fate(other)
        lines.append(f"\nThe same question at the same step in {base_label}: {theirs['sampled']} sampled, "
                     f"{theirs['merged']} merged, {theirs['kept']} kept. {run_label}'s own saving here: "
                     f"**{theirs['kept'] - mine['kept']:+d} rows** ({mine['sampled'] - theirs['sampled']:+d} sampled "
                     "by the budget; the answers differ between runs, so the merged counts differ too).")
    return "\n".join(lines)


def rollout_table(rollouts: pd.DataFrame) -> pd.DataFrame:
    """A group's rollouts for display: status (kept, merged or pruned: `fates`), stands for (multiplicity), reason,
    reward, advantage, completion,
    highest advantage first; no None (missing values read "—")."""
    view = pd.DataFrame({
        "status": fates(rollouts),
        "stands for": multiplicity(rollouts),
        "reason": [pruned_reason(k, r) or "—" for k, r in zip(rollouts["kept"], rollouts["reason"])],
        "reward": rollouts["reward"].round(2), "advantage": rollouts["advantage"].round(3),
        "completion": rollouts["completion"].fillna("—")})
    return view.sort_values("advantage", ascending=False, kind="stable").reset_index(drop=True)


def text_column(values: pd.Series, spec: str) -> pd.Series:
    """Numbers as text in `spec` (a trailing × or % kept as a suffix), missing ones as "—" (never "None")."""
    suffix = spec[-1] if spec and not spec[-1].isalpha() and spec[-1] not in ".0123456789" else ""
    core = spec[:-1] if suffix else spec
    return values.map(lambda v: "—" if v is None or (isinstance(v, float) and not np.isfinite(v)) or pd.isna(v)
                      else f"{v:{core}}{suffix}")


def display_frame(frame: pd.DataFrame, formats: dict[str, str] | None = None) -> pd.DataFrame:
    """A table for display: float columns as text (`formats`, else 3 significant digits), missing values "—"."""
    formats = formats or {}
    out = frame.copy()
    for name in out.columns:
        column = out[name]
        if name in formats:
            out[name] = text_column(column, formats[name])
        elif pd.api.types.is_float_dtype(column):
            out[name] = text_column(column, ".3g")
        elif column.dtype == object:
            out[name] = column.map(lambda v: "—" if v is None or (isinstance(v, float) and np.isnan(v)) else v)
    return out


def token_html(tokens: list[tuple[str, float]], advantage: float) -> str:
    """A rollout's tokens as HTML spans, each coloured by its sampling log-prob (white: log-prob 0, the policy was
    certain; deep red: -4 or below) with the value on hover, after a badge with the rollout's advantage (the same for
    every token of a GRPO rollout: it scales each token's log-prob gradient)."""
    import html

    spans = []
    for token, logprob in tokens:
        strength = min(1.0, max(0.0, -logprob / 4.0))
        colour = rgba(NEGATIVE, round(0.08 + 0.85 * strength, 2))
        shown = html.escape(token).replace(" ", "&nbsp;").replace("\n", "↵<br>")
        spans.append(f"<span title='log-prob {logprob:.3f} (p = {np.exp(logprob):.2f})' style='background:{colour};"
                     f"border-radius:3px;padding:1px 1px;margin:0 1px;font-family:monospace'>{shown or '∅'}</span>")
    sign = POSITIVE if advantage > 0 else NEGATIVE if advantage < 0 else NEUTRAL
    badge = (f"<span style='background:{sign};color:white;border-radius:4px;padding:2px 6px;margin-right:6px'>"
             f"advantage {advantage:+.3f}</span>")
    return f"<div style='line-height:2'>{badge}{''.join(spans)}</div>"


def _history(run: pd.Series) -> list[dict]:
    text = run.get("config_history")
    return json.loads(text) if isinstance(text, str) and text else []


def config_in_force(run: pd.Series, step: int) -> dict:
    """The run's config at `step`: its config now, with the changes its resumes made after `step` undone."""
    config = json.loads(run["config"]) if isinstance(run.get("config"), str) else {}
    return config_at(config, _history(run), step)


def config_changes(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per key a resume changed (`--allow-change`): run, from step, key, value before and after."""
    rows = [{"run": run["run_id"], "from step": entry["step"], "key": key, "before": json.dumps(change["from"]),
             "after": json.dumps(change["to"])}
            for _, run in runs.iterrows() for entry in _history(run) for key, change in entry["changes"].items()]
    return pd.DataFrame(rows, columns=["run", "from step", "key", "before", "after"])
