"""Demo: FastRL's story on the run in front of you — what pruning does to one real group, where the rollout
budget went, and the measured speed-up and accuracy against a plain GRPO run. Works live and after the fact."""

import streamlit as st

from app import analysis, charts, data, widgets

st.title("FastRL in three steps")
runs = widgets.runs_or_wait()
pruned_runs = runs[runs["pruner"] != "none"]
run = widgets.pick_run(pruned_runs if not pruned_runs.empty else runs, label="FastRL run")
run_id = run["run_id"]
baseline = analysis.find_baseline(runs, run_id)
st.markdown(
    "GRPO learns by sampling several answers to each question and comparing them: answers better than their "
    "group's average are reinforced, worse ones discouraged. When a group's answers are all equally good (or all "
    "equally wrong) nothing is learned from them, yet plain GRPO still pays for them in three more passes through "
    "the model. **FastRL prunes such rollouts before those passes, keeps a diverse set of the informative ones, "
    "and adapts how many answers to sample per question.**")
by_id = runs.set_index("run_id", drop=False)
live = any(widgets.is_live(r) for _, r in runs.iterrows())


def story() -> None:
    widgets.run_caption(widgets.current(run_id), refreshing=live)
    steps = data.steps([run_id])
    if steps.empty:
        st.info("The run has started; the story begins once its first step is written.")
        return

    st.header("1 · What pruning does to one group")
    recent = data.groups(run_id)
    recent = recent[recent["step"] >= steps["step"].iloc[-1] - 20]
    informative = recent[(recent["reward_std"] > 0) & (recent["kept"] > 0) & (recent["kept"] < recent["sampled"])]
    pool = informative if not informative.empty else recent
    step = int(pool["step"].max())
    prompt = analysis.pick_informative_group(pool[pool["step"] == step])
    group = data.rollouts(run_id, step, prompt)
    if group.empty:
        st.info("This run does not log rollouts, so there is no group to show.")
    else:
        left, right = st.columns([1, 2])
        png = data.image_bytes(group["image_ref"].iloc[0])
        if png is not None:
            left.image(png, caption=f"step {step} · prompt {prompt}", width=320)
        with right:
            st.markdown(f"**Question.** {group['question'].iloc[0] or '—'}  \n"
                        f"**Correct answer.** `{group['answer'].iloc[0] or '—'}`")
            st.plotly_chart(charts.group_bars(group, revision=f"demo/{step}/{prompt}"), key="demo_group")
        n_kept = int(group["kept"].sum())
        st.markdown(
            f"The model answered this question **{len(group)} times**. Rewards ranged from "
            f"{group['reward'].min():.2f} to {group['reward'].max():.2f}; each answer's *advantage* is its reward "
            f"relative to the group. FastRL kept **{n_kept}** of them for the update and pruned "
            f"**{len(group) - n_kept}**:")
        for reason, count in group.loc[~group["kept"], "reason"].value_counts().items():
            st.markdown(f"- {count} × *{analysis.reason_label(reason)}*: {analysis.reason_text(reason)}")
        with st.expander("The answers themselves"):
            st.dataframe(group.sort_values("advantage", ascending=False)[
                ["kept", "reason", "reward", "advantage", "completion"]], hide_index=True, key="demo_answers")
        st.page_link("views/rollouts.py", label="Browse every group of this step",
                     query_params={"run": run_id, "step": str(step), "prompt": prompt}, icon=":material/search:")

    st.header("2 · Where the rollout budget went")
    kept_share = steps["rollouts_kept"].sum() / max(int(steps["rollouts_sampled"].sum()), 1)
    st.plotly_chart(charts.sampled_vs_kept(steps, revision=f"demo/{run_id}"), key="demo_budget")
    st.markdown(
        f"Over {len(steps)} steps the run sampled **{int(steps['rollouts_sampled'].sum()):,}** rollouts and sent "
        f"**{kept_share:.0%}** of them through the log-probability passes and the update; the rest were dropped "
        f"right after being scored. It ended at **{steps['rollouts_per_prompt'].iloc[-1]:.1f} rollouts per prompt** "
        f"(started at {steps['rollouts_per_prompt'].iloc[0]:.1f}).")

    st.header("3 · Speed and accuracy against GRPO")
    if baseline is None:
        if analysis.find_baseline(data.runs(), run_id) is not None:
            st.rerun(scope="app")  # a GRPO run has just started: redraw with it
        st.info("There is no plain-GRPO run (pruner `none`) in this store to compare with yet. `fastrl demo` "
                "trains one right after the FastRL run; this section fills in while it trains.")
        return
    pair = [run_id, baseline]
    pair_steps = data.steps(pair)
    evals = data.evals(pair)
    source = "eval" if set(evals["run_id"]) >= set(pair) else "train"
    curves = analysis.accuracy_curves(pair_steps, evals, source=source)
    headline = analysis.comparison(curves, run_id, baseline)
    st.plotly_chart(charts.metric_lines(curves, x="wall_time", y="accuracy", x_title="training seconds",
                                        y_title="accuracy", revision="demo/compare", markers=source == "eval"),
                    key="demo_compare")
    base_state = widgets.status(by_id.loc[baseline])
    cols = st.columns(3)
    if headline["speedup"] is not None:
        cols[0].metric("Speed-up to GRPO's accuracy", f"{headline['speedup']:.2f}×",
                       help="GRPO's seconds to reach its latest accuracy / FastRL's seconds to reach the same")
    else:
        cols[0].metric("Speed-up to GRPO's accuracy", "not yet",
                       help="FastRL has not reached GRPO's latest accuracy (or the baseline has no data yet)")
    cols[1].metric("FastRL accuracy", "—" if headline["run_accuracy"] is None else f"{headline['run_accuracy']:.1%}")
    cols[2].metric("GRPO accuracy", "—" if headline["baseline_accuracy"] is None
                   else f"{headline['baseline_accuracy']:.1%}")
    what = "greedy accuracy on the held-out split" if source == "eval" else "training-rollout accuracy (5-step mean)"
    caveat = " The GRPO run is still training, so these figures will move." if base_state == "running" else ""
    st.caption(f"Measured on this machine from the two runs in the store ({run_id} vs {baseline}); accuracy is "
               f"{what}.{caveat}")


# Always polling (slowly when nothing trains): `fastrl demo` starts the GRPO run after the FastRL run ends.
st.fragment(story, run_every=widgets.LIVE_EVERY if live else "10s")()
