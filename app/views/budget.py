"""Budget: where the rollouts went, step by step — live while the run trains."""

import streamlit as st

from app import analysis, charts, data, widgets

st.title("Rollout budget")
runs = widgets.runs_or_wait()
run = widgets.pick_run(runs)
run_id = run["run_id"]
live = widgets.is_live(run)


def budget() -> None:
    widgets.run_caption(widgets.current(run_id), refreshing=live)
    steps = data.steps([run_id])
    if steps.empty:
        st.info("The run has started; its first step is being sampled.")
        return
    matrix = data.budget_matrix(run_id)
    last = steps.iloc[-1]
    groups_per_step = matrix.groupby("step").size().reindex(steps["step"]).fillna(0)
    kept_share = steps["rollouts_kept"].sum() / max(int(steps["rollouts_sampled"].sum()), 1)
    cols = st.columns(4)
    cols[0].metric("Latest step", int(last["step"]), help="The newest step written to the store.")
    cols[1].metric("Kept this step", f"{int(last['rollouts_kept'])} / {int(last['rollouts_sampled'])}",
                   help="Rollouts that enter the log-prob passes and the update, out of those sampled.")
    cols[2].metric("Kept over the run", f"{kept_share:.0%}")
    cols[3].metric("Rollouts per prompt", f"{last['rollouts_per_prompt']:.1f}",
                   delta=f"{last['rollouts_per_prompt'] - steps.iloc[0]['rollouts_per_prompt']:+.1f} since step "
                         f"{int(steps.iloc[0]['step'])}", delta_color="off")

    left, right = st.columns(2)
    with left:
        st.subheader("Sampled vs kept")
        st.plotly_chart(charts.sampled_vs_kept(steps, revision=run_id), key="sampled_vs_kept")
        st.caption("The shaded gap is what pruning saved. " + analysis.pruning_saving(steps))
    with right:
        st.subheader("Rollouts per prompt")
        st.plotly_chart(charts.rollouts_per_prompt(matrix, revision=run_id), key="per_prompt")
        st.caption("The budget controller's choice of group size; the band spans the step's prompts.")

    left, right = st.columns(2)
    with left:
        st.subheader("Why rollouts were pruned")
        counts = analysis.reason_counts(data.rollout_steps(run_id))
        if counts.empty:
            st.info("No rollout was pruned yet (or the run does not log rollouts).")
        else:
            st.plotly_chart(charts.reason_areas(counts, revision=run_id), key="reasons")
    with right:
        st.subheader("Zero-variance groups")
        st.plotly_chart(charts.zero_variance(steps, groups_per_step, revision=run_id), key="zero_variance")
        st.caption("Groups whose rollouts all got the same reward: every advantage is 0, so they carry no "
                   "gradient. This share grows as the policy gets good at a prompt.")

    st.subheader("Per-prompt budget")
    table = analysis.budget_heatmap(matrix)
    st.plotly_chart(charts.budget_heatmap(table, revision=run_id), key="heatmap")
    st.caption(f"Rollouts sampled for the {len(table)} prompts drawn most often, by step (blank: not drawn). "
               "A prompt's budget changes between its visits as the controller learns how informative it is.")
    widgets.rerun_when_finished(run_id, live)


st.fragment(budget, run_every=widgets.LIVE_EVERY if live else None)()
