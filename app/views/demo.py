"""Demo: FastRL's story on the run in front of you — what pruning does to one real group, step by step, where the
rollout budget went, and the measured speed-up and accuracy against plain GRPO: over every seed of the method in
the store (a `fastrl bench` store) with 95 % intervals, from `fastrl_core.metrics`. Works live and after the fact."""

import pandas as pd
import streamlit as st

from app import analysis, charts, data, widgets
from fastrl_core import metrics

st.title("FastRL in three steps")
runs = widgets.runs_or_wait()
fastrl_runs, pruned_runs = runs[runs["pruner"] == "fastrl"], runs[runs["pruner"] != "none"]
run = widgets.pick_run(next(r for r in (fastrl_runs, pruned_runs, runs) if not r.empty), label="FastRL run")
run_id = run["run_id"]
st.markdown(
    "GRPO learns by sampling several answers to each question and comparing them: answers better than their "
    "group's average are reinforced, worse ones discouraged. When a group's answers are all equally good (or all "
    "equally wrong) nothing is learned from them, yet plain GRPO still pays for them in the passes after "
    "generation (the update, and the reference and old-policy passes where a run has them). **FastRL prunes such "
    "rollouts before those passes, keeps the informative ones that stand for the rest, "
    "and adapts how many answers to sample per question.**")
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
        pruned = group.loc[~group["kept"].astype(bool), "reason"].value_counts()
        zero = int(pruned.get("ZERO_ADVANTAGE", 0) + pruned.get("ZERO_VARIANCE_GROUP", 0))
        others = pruned.drop(["ZERO_ADVANTAGE", "ZERO_VARIANCE_GROUP"], errors="ignore")
        correct = int((group["accuracy_reward"].fillna(0) > 0).sum())
        lines = [
            f"1. **Sample.** The model answered this question **{len(group)} times**; {correct} answers were "
            f"correct, rewards ranged from {group['reward'].min():.2f} to {group['reward'].max():.2f}.",
            "2. **Compare.** Each answer's *advantage* is its reward relative to the group's: positive ones are "
            "reinforced, negative ones discouraged.",
            f"3. **Drop what teaches nothing.** {zero} answer{'s' if zero != 1 else ''} had advantage 0 (no "
            "gradient): pruned for free." if zero else
            "3. **Drop what teaches nothing.** No answer had advantage 0 here.",
        ]
        if len(others):
            lines.append("4. **Keep a diverse, informative few.** Of the rest, "
                         + "; ".join(f"{count} × *{analysis.reason_label(reason)}* ({analysis.reason_text(reason)})"
                                     for reason, count in others.items()) + ".")
        lines.append(f"{len(lines) + 1}. **Update.** FastRL kept **{n_kept}** of {len(group)} for the log-probability "
                     f"passes and the update; plain GRPO would have paid for all {len(group)}.")
        st.markdown("\n".join(lines))
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
        f"(started at {steps['rollouts_per_prompt'].iloc[0]:.1f}). " + analysis.pruning_saving(steps))

    st.header("3 · Speed and accuracy against GRPO")
    labels = metrics.run_labels(data.runs())
    mine = labels[labels["run_id"] == run_id]
    method, objective = mine["method"].iloc[0], mine["objective"].iloc[0]
    base = labels[labels["is_baseline"] & (labels["objective"] == objective)]
    if base.empty:
        st.info("There is no plain-GRPO run (pruner `none`, budget `fixed`) in this store to compare with yet. "
                "`fastrl demo` trains one right after the FastRL run, `fastrl bench` one per seed; this section "
                "fills in while it trains.")
        return
    base_method = sorted(base["method"].unique(), key=lambda m: (not m.startswith("grpo"), m))[0]
    ids = labels.loc[labels["method"].isin([method, base_method]), "run_id"].tolist()
    sampled, y_title = widgets.accuracy_choice(ids, key="demo_accuracy")
    per_run, summary, curves = data.comparison(ids, sampled=sampled)
    by_method = summary.set_index("method")
    if method not in by_method.index or base_method not in by_method.index:
        st.info("Waiting for the first evaluations of these runs.")
        return
    ours, theirs = by_method.loc[method], by_method.loc[base_method]
    bands = pd.concat([metrics.band(c).assign(method=m) for m, c in curves.groupby("method", sort=False)],
                      ignore_index=True)
    if not bands.empty:
        st.plotly_chart(charts.band_lines(bands, x="wall_time", x_title="training seconds (evaluation excluded)",
                                          y_title=y_title, revision="demo/compare"),
                        key="demo_compare")
    reached = int(ours["target_reached"])
    seeds = len(ours["seeds"])
    cols = [*st.columns(3), *st.columns(3)[:2]]  # speed and samples, then accuracy: intervals fit in a third
    cols[0].metric("Speed-up per step", metrics.interval(ours, "step_speedup").text(".2f", "×"),
                   help="GRPO's training seconds for the same number of steps / FastRL's (the paper's speed-up)")
    cols[1].metric("Speed-up to the target accuracy", metrics.interval(ours, "target_speedup").text(".2f", "×")
                   if reached else "not reached",
                   help=f"GRPO's seconds to {metrics.TARGET_SHARE:.0%} of its mean gain over the warm start / "
                        f"FastRL's, on seeds where both got there ({reached} of {seeds} FastRL seeds did)")
    cols[2].metric("Rollouts to the target (× GRPO's)",
                   metrics.interval(ours, "target_rollout_share").text(".2f", "×") if reached else "not reached",
                   help="The rollouts FastRL sampled until it reached that accuracy / GRPO's, on the same seeds; "
                        "below 1: the same accuracy from fewer samples")
    cols[3].metric("FastRL accuracy", _percent(metrics.interval(ours, "final_accuracy")))
    cols[4].metric("GRPO accuracy", _percent(metrics.interval(theirs, "final_accuracy")))
    running = any(widgets.status(widgets.current(r)) == "running" for r in ids)
    caveat = " Some of these runs are still training, so the figures will move." if running else ""
    st.caption(
        f"Measured on this machine: {method} ({seeds} seed{'s' if seeds != 1 else ''}) against {base_method} "
        f"({len(theirs['seeds'])}), paired by seed. Accuracy is "
        f"{'mean@k (k completions per problem at the training temperature)' if sampled else 'greedy accuracy'} "
        "on the held-out split, mean of the "
        f"last {metrics.WINDOW} evaluations; ± and [ ] are 95 % intervals over seeds (none with one seed); curves "
        f"show the mean of the seeds with its band.{caveat}")


def _percent(interval: metrics.Interval) -> str:
    if interval.n == 0:
        return "—"
    if interval.n < 2:
        return f"{interval.mean:.1%}"
    return f"{interval.mean:.1%} ± {100 * (interval.high - interval.mean):.1f} pts"


# Always polling (slowly when nothing trains): `fastrl demo` starts the GRPO run after the FastRL run ends.
st.fragment(story, run_every=widgets.LIVE_EVERY if live else "10s")()
