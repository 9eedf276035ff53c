"""Runs: every run in the store with its headline metrics, and a side-by-side comparison."""

import math

import pandas as pd
import streamlit as st

from app import analysis, charts, data, widgets

st.title("Runs")
runs = widgets.runs_or_wait()

st.caption(f"Store `{data.store_dir()}` · {len(runs)} runs. Times are the trainer's own clock (seconds of "
           "training, evaluation excluded).")
table = pd.DataFrame({
    "status": [widgets.status(r) for _, r in runs.iterrows()],
    "run": runs["run_id"], "objective": runs["objective"], "pruner": runs["pruner"], "budget": runs["budget"],
    "steps": runs["steps"], "train time (s)": runs["wall_time"], "kept": runs["kept_fraction"],
    "train accuracy": runs["train_accuracy"], "best eval accuracy": runs["best_accuracy"],
    "last eval accuracy": runs["last_accuracy"], "started": runs["started"].dt.tz_convert(None),
})
st.dataframe(table, hide_index=True, column_config={
    "train time (s)": st.column_config.NumberColumn(format="%.0f"),
    "kept": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0,
                                            help="Share of sampled rollouts that entered the update"),
    "train accuracy": st.column_config.NumberColumn(format="%.3f", help="Rollout accuracy in the last step"),
    "best eval accuracy": st.column_config.NumberColumn(format="%.3f", help="Greedy accuracy on the eval split"),
    "last eval accuracy": st.column_config.NumberColumn(format="%.3f"),
    "started": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
}, key="runs_table")

st.header("Compare")
ids = runs["run_id"].tolist()
chosen = st.multiselect("Runs to compare", ids, default=ids[: min(len(ids), 4)], key="compare_runs")
if not chosen:
    st.info("Pick one or more runs to compare.")
    st.stop()
left, middle, right = st.columns(3)
x_axis = left.radio("x-axis", ["wall-clock seconds", "step"], horizontal=True, key="compare_x")
accuracy_source = middle.radio("accuracy", ["eval (greedy, held-out)", "train rollouts (5-step mean)"],
                               horizontal=True, key="compare_accuracy")
picked = runs[runs["run_id"].isin(chosen)]
default_baseline = next((r for r in chosen if picked.set_index("run_id").loc[r, "pruner"] == "none"), chosen[0])
baseline = right.selectbox("Baseline for the speed-up", chosen, index=chosen.index(default_baseline),
                           key="compare_baseline", help="Plain GRPO (pruner none) when one is selected")
live = any(widgets.status(r) == "running" for _, r in picked.iterrows())


def compare() -> None:
    steps = data.steps(chosen)
    if steps.empty:
        st.info("No steps written yet for these runs.")
        return
    evals = data.evals(chosen)
    source = "eval" if accuracy_source.startswith("eval") else "train"
    if source == "eval" and evals.empty:
        st.warning("These runs have no evaluations yet; showing the training-rollout accuracy instead.")
        source = "train"
    curves = analysis.accuracy_curves(steps, evals, source=source)
    x, x_title = ("wall_time", "seconds") if x_axis.startswith("wall") else ("step", "step")
    rewards = steps.assign(reward=steps.groupby("run_id")["reward_mean"].transform(
        lambda s: s.rolling(5, min_periods=1).mean()))
    left, right = st.columns(2)
    with left:
        st.subheader("Reward")
        st.plotly_chart(charts.metric_lines(rewards, x=x, y="reward", x_title=x_title,
                                            y_title="mean reward (5-step mean)", revision="compare"),
                        key="compare_reward")
    with right:
        st.subheader("Accuracy")
        st.plotly_chart(charts.metric_lines(curves, x=x, y="accuracy", x_title=x_title, y_title="accuracy",
                                            revision="compare", markers=source == "eval"),
                        key="compare_accuracy_chart")

    st.subheader("Time to a target accuracy")
    base_curve = curves[curves["run_id"] == baseline]
    default_target = float(base_curve["accuracy"].iloc[-1]) if not base_curve.empty else 0.5
    target = st.slider("Target accuracy", 0.0, 1.0, math.floor(default_target * 100 + 1e-9) / 100, 0.01,
                       key="target", help="Defaults to the baseline's latest accuracy (rounded down to the slider's "
                                          "0.01 steps): how long each run took to get there.")
    reach = analysis.time_to_target(curves, target).set_index("run_id").reindex(chosen)
    final = curves.groupby("run_id")["accuracy"].last().reindex(chosen)
    result = pd.DataFrame({"run": chosen, "steps to target": reach["step"].to_numpy(),
                           "seconds to target": reach["seconds"].to_numpy(),
                           f"speed-up vs {baseline}": analysis.speedup(reach["seconds"], baseline).to_numpy(),
                           "latest accuracy": final.to_numpy()})
    st.dataframe(result, hide_index=True, key="reach_table", column_config={
        "seconds to target": st.column_config.NumberColumn(format="%.1f"),
        f"speed-up vs {baseline}": st.column_config.NumberColumn(format="%.2f×"),
        "latest accuracy": st.column_config.NumberColumn(format="%.3f"),
    })
    st.caption("None: not reached (yet). Speed-up = the baseline's seconds to the target / the run's seconds "
               "(undefined when the baseline was already there at its first evaluation).")

    st.subheader("Time per phase")
    phases = analysis.phase_seconds(steps, data.PHASES)
    if phases.empty:
        st.info("These runs recorded no phase timings.")
    else:
        st.plotly_chart(charts.phase_bars(phases, revision="compare"), key="phases")
        st.caption("Mean seconds per step. Pruned rollouts skip the log-prob passes and the update.")


st.fragment(compare, run_every=widgets.LIVE_EVERY if live else None)()
