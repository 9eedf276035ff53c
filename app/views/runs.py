"""Runs: one tab each (only the open one is built and drawn): the methods compared across seeds (mean curve with its
band, mean ± interval per method, from `fastrl_app.metrics` like `fastrl bench`), every run in the store, where each
run's rollouts went, and chosen runs side by side."""

import math

import pandas as pd
import streamlit as st

from fastrl_app import analysis, cached, charts, palette, report, widgets
from fastrl_app import metrics, savings
from fastrl_core.store.schema import PHASES

TABS = ["Methods across seeds", "All runs", "Where rollouts went", "Compare runs"]  # `?view=`: only the open one runs
X_AXES = {"training seconds": ("wall_time", "training seconds"), "CPU seconds": ("cpu_time", "CPU seconds"),
          "rollouts sampled": ("rollouts", "rollouts sampled"), "step": ("step", "step")}

st.title("Runs")
runs = widgets.runs_or_wait(totals=True)
live = any(widgets.is_live(r) for _, r in runs.iterrows())
widgets.redraw_on_change("runs", None, widgets.LIVE_EVERY if live else None)

st.caption(f"Store `{cached.store_dir()}` · {len(runs)} runs. Times are the trainer's own clock (seconds of "
           "training, evaluation excluded).")
labels = metrics.run_labels(runs.sort_values("started", kind="stable"))


def split_totals(run_ids) -> dict[str, dict]:
    """Run id -> where its nominal rollouts went (`savings.split_totals`), for the runs whose steps record the
    split."""
    return {run_id: savings.split_totals(savings.rollout_split(run_steps)) for run_id in run_ids
            if savings.has_split(run_steps := cached.steps([run_id]))}


def all_runs() -> None:
    splits = split_totals(runs["run_id"])
    table = pd.DataFrame({
        "status": [widgets.status(r) for _, r in runs.iterrows()],
        "run": runs["run_id"], "objective": runs["objective"], "pruner": runs["pruner"], "budget": runs["budget"],
        "steps": runs["steps"].fillna(0).astype(int),
        "train time (s)": analysis.text_column(runs["wall_time"], ".0f"),
        "kept": [analysis.kept_share(splits.get(run_id)) for run_id in runs["run_id"]],
        "train accuracy": analysis.text_column(runs["train_accuracy"], ".3f"),
        "best eval accuracy": analysis.text_column(runs["best_accuracy"], ".3f"),
        "last eval accuracy": analysis.text_column(runs["last_accuracy"], ".3f"),
        "started": runs["started"].dt.tz_convert(None).dt.strftime("%Y-%m-%d %H:%M"),
    })
    st.dataframe(table, hide_index=True, width="stretch", column_config={  # the run column sized to its ids, in full
        "kept": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0,
                                                help=analysis.KEPT_HELP),
        "train accuracy": st.column_config.TextColumn(help="Rollout accuracy in the last step"),
        "best eval accuracy": st.column_config.TextColumn(
            help="Greedy accuracy on the eval split (— : no evaluation)"),
    }, key="runs_table")
    st.caption("— : not recorded yet (no evaluation, or no step; kept: blank for a store written before the "
               "split). The table scrolls sideways when the window is narrow.")
    changes = analysis.config_changes(runs)
    if len(changes):
        st.subheader("Config changes on resume")
        st.dataframe(changes, hide_index=True, width="stretch", key="config_changes")
        st.caption("Keys a resume was explicitly allowed to change (`fastrl train --resume RUN --allow-change "
                   "KEY`), each from the step it applies to: the run's steps before it ran with the value before.")


def summary_table(summary: pd.DataFrame, per_run: pd.DataFrame) -> pd.DataFrame:
    """The per-method table as text: mean ± 95 % interval, ratios as geometric mean [interval]; kept is
    `analysis.kept_share` of the method's runs (`per_run`), as on every page."""
    def text(row, name, spec, suffix=""):
        return metrics.interval(row, name).text(spec, suffix)

    totals = split_totals(per_run["run_id"])

    def kept(method):
        run_ids = per_run.loc[per_run["method"] == method, "run_id"]
        return metrics.mean_ci([analysis.kept_share(totals.get(r)) for r in run_ids]).text(".0%")

    return pd.DataFrame([{
        "method": row["method"], "seeds": len(row["seeds"]), "final accuracy": text(row, "final_accuracy", ".3f"),
        "accuracy vs its GRPO (paired)": text(row, "accuracy_gain", "+.3f"),
        "vs its GRPO at equal time": text(row, "gain_at_equal_time", "+.3f"),
        "vs its GRPO at equal rollouts": text(row, "gain_at_equal_rollouts", "+.3f"),
        "step speed-up": text(row, "step_speedup", ".2f", "×"),
        "step speed-up (CPU)": text(row, "cpu_step_speedup", ".2f", "×"),
        "time-to-target speed-up": text(row, "target_speedup", ".2f", "×"),
        "rollouts to target (× GRPO's)": text(row, "target_rollout_share", ".2f", "×"),
        "reached target": f"{row['target_reached']}/{len(row['seeds'])}", "AUC": text(row, "auc", ".3f"),
        "s/step": text(row, "seconds_per_step", ".3f"), "CPU s/step": text(row, "cpu_per_step", ".3f"),
        "kept": kept(row["method"]),
    } for _, row in summary.iterrows()])


def methods_across_seeds() -> None:
    methods = labels["method"].unique().tolist()
    chosen_methods = st.multiselect("Methods", methods, default=methods[:8], key="methods")
    x_name = st.radio("x-axis", list(X_AXES), horizontal=True, key="methods_x")
    ids = labels.loc[labels["method"].isin(chosen_methods), "run_id"].tolist()
    if not ids:
        st.info("Pick one or more methods.")
        return
    sampled, y_title = widgets.accuracy_choice(ids, key="methods_accuracy")
    per_run, summary, curves, left_out = cached.comparison(ids, sampled=sampled)
    x, x_title = X_AXES[x_name]
    bands = pd.concat([metrics.band(c, x=x).assign(method=m) for m, c in curves.groupby("method", sort=False)],
                      ignore_index=True) if len(curves) else pd.DataFrame()
    points = curves.groupby("run_id").size() if len(curves) else pd.Series(dtype=int)
    drawn = bands.dropna(subset=["mean"]) if len(bands) else bands
    if drawn.empty or drawn.groupby("method")[x].nunique().max() < 2:  # a band over one x is a point: no line
        st.info("No chart yet: a method's curve needs two evaluations of each of its runs (the warm start and one "
                "more), and CPU timings for the CPU axis.")
    else:
        st.plotly_chart(charts.band_lines(bands, x=x, x_title=x_title, y_title=y_title,
                                          revision="methods"), key="methods_chart")
    st.dataframe(summary_table(summary, per_run), hide_index=True, key="methods_table", width="stretch")
    target = per_run["target_accuracy"].dropna().astype(float)
    averaged = analysis.averaged_evaluations(points.reindex(per_run["run_id"]).fillna(0).astype(int).tolist(),
                                             metrics.WINDOW)
    horizon = per_run["horizon"].min() if len(per_run) else math.nan
    st.caption(
        "Mean of the seeds with its 95 % Student-t interval (band, ±); speed-ups are geometric means of each seed's "
        "ratio to the GRPO run of the same seed, interval on the log ratio ([low, high]); (n=1): one seed, no "
        f"interval. Final accuracy: {analysis.final_accuracy_words(averaged)} (the bench averages {metrics.WINDOW}). "
        "Step speed-up: GRPO's training seconds for the same steps / the method's. Time-to-target: to "
        f"{metrics.TARGET_SHARE:.0%} of the same seed's GRPO gain over the warm start"
        + (f" (accuracy {target.min():.3f}–{target.max():.3f})" if len(target) else "")
        + "; reached target counts the seeds that got there. AUC: mean accuracy over the training seconds of the "
        + (f"shortest run, the first {horizon:.1f} s." if horizon > 0 else "shortest run (none has trained yet).")
        + f" {analysis.KEPT_HELP}" + report.left_out_sentence(left_out))
    phases = analysis.phases_long(summary, "method", PHASES)
    if not phases.empty:
        st.subheader("Time per phase")
        st.plotly_chart(charts.phase_bars(phases, revision="methods", label="method"), key="methods_phases")
        st.caption("Mean seconds per step of each method's runs. Pruned rollouts skip the log-prob passes and the "
                   "update.")


def rollouts_split() -> None:
    st.subheader("Where each run's rollouts went")
    splits = split_totals(labels["run_id"])
    split_rows = [{"run": f"{method} · {run_id}", **splits[run_id]}
                  for run_id, method in zip(labels["run_id"], labels["method"]) if run_id in splits]
    if not split_rows:
        st.info("No run in this store records the split of its rollouts yet (stores written before it was added).")
        return
    st.plotly_chart(charts.split_bars(pd.DataFrame(split_rows), revision="runs/split"), key="runs_split")
    st.caption("Each run's nominal rollouts (steps × prompts × n: what plain GRPO samples) split into skipped by "
               "the budget, merged as duplicates (every method merges them), pruned by the method's own rule, and "
               "kept. Only the budget and the rule are a method's own saving.")


def compare_runs() -> None:
    st.subheader("Compare runs")
    ids = runs["run_id"].tolist()
    chosen = st.multiselect("Runs to compare", ids, default=ids[: min(len(ids), 4)], key="compare_runs")
    if not chosen:
        st.info("Pick one or more runs to compare.")
        return
    left, right = st.columns(2)
    x_axis = left.radio("x-axis", ["wall-clock seconds", "step"], horizontal=True, key="compare_x")
    accuracy_source = right.radio("accuracy", ["eval (greedy, held-out)", "train rollouts (5-step mean)"],
                                  horizontal=True, key="compare_accuracy")
    steps = cached.steps(chosen)
    if steps.empty:
        st.info("No steps written yet for these runs.")
        return
    per_run, _, curves, _ = cached.comparison(chosen, one_per_seed=False)  # every chosen run, side by side
    source = "eval" if accuracy_source.startswith("eval") else "train"
    if source == "eval" and curves.empty:
        st.warning("These runs have no evaluations yet; showing the training-rollout accuracy instead.")
        source = "train"
    curves = curves if source == "eval" else analysis.train_accuracy(steps)
    x, x_title = ("wall_time", "seconds") if x_axis.startswith("wall") else ("step", "step")
    rewards = steps.assign(reward=steps.groupby("run_id")["reward_mean"].transform(
        lambda s: s.rolling(5, min_periods=1).mean()))
    colours = {r: palette.method_colour(m) for r, m in zip(labels["run_id"], labels["method"])}
    if len(curves) < 2 or steps.groupby("run_id").size().max() < 2:
        st.info("No chart yet: a line needs two points (two steps, or two evaluations).")
        return
    left, right = st.columns(2)
    with left:
        st.subheader("Reward")
        st.plotly_chart(charts.metric_lines(rewards, x=x, y="reward", x_title=x_title,
                                            y_title="mean reward (5-step mean)", revision="compare",
                                            colours=colours),
                        key="compare_reward")
    with right:
        st.subheader("Accuracy")
        st.plotly_chart(charts.metric_lines(curves, x=x, y="accuracy", x_title=x_title, y_title="accuracy",
                                            revision="compare", markers=source == "eval", colours=colours),
                        key="compare_accuracy_chart")

    st.subheader("Each run against the GRPO run of its seed")
    totals = split_totals(per_run["run_id"])
    shown = per_run.assign(run=per_run["run_id"],
                           kept=[100 * analysis.kept_share(totals.get(r)) for r in per_run["run_id"]])
    st.dataframe(analysis.display_frame(shown[[
        "run", "method", "seed", "final_accuracy", "time_to_target", "target_speedup", "step_speedup",
        "cpu_step_speedup", "auc", "seconds_per_step", "cpu_per_step", "rollouts_sampled", "kept"]], formats={
        "final_accuracy": ".3f", "time_to_target": ".1f", "target_speedup": ".2f×", "step_speedup": ".2f×",
        "cpu_step_speedup": ".2f×", "auc": ".3f", "seconds_per_step": ".3f", "cpu_per_step": ".3f",
        "kept": ".0f%"}), hide_index=True, key="compare_table", width="stretch")
    st.caption("Same definitions as the table above, one row per run; — : not reached, or no GRPO run (pruner "
               "none, budget fixed, same objective) with this seed among the chosen runs.")


def page() -> None:
    for tab, draw in zip(st.tabs(TABS, key="view", bind="query-params"),
                         (methods_across_seeds, all_runs, rollouts_split, compare_runs)):
        if tab.open:  # lazy: only the open tab's tables and charts are built and sent
            with tab:
                draw()


st.fragment(page)()  # a widget inside redraws only this part
