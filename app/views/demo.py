"""Demo: FastRL beside plain GRPO on the runs in front of you — what happens to one real group in both runs, where
each run's rollouts went (skipped by the budget, merged as duplicates, pruned by the rule, kept) with only what GRPO
did not also do credited to FastRL, the budget moving, and the measured speed and accuracy. Those figures come only
from runs trained interleaved (`fastrl demo`, `fastrl bench`), over every seed there is, with 95 % intervals from
`fastrl_app.metrics`; where there are none the page says why. Works live and after the fact; the button at the end
writes the page as one HTML file (app.report)."""

import pandas as pd
import streamlit as st

from fastrl_app import analysis, cached, charts, metrics, palette, report, savings, widgets

st.title("FastRL beside GRPO")
runs = widgets.runs_or_wait()
fastrl_runs, pruned_runs = runs[runs["pruner"] == "fastrl"], runs[runs["pruner"] != "none"]
run = widgets.pick_run(next(r for r in (fastrl_runs, pruned_runs, runs) if not r.empty), label="FastRL run")
run_id = run["run_id"]
st.markdown(
    "GRPO learns by sampling several answers to each question and comparing them: answers better than their "
    "group's average are reinforced, worse ones discouraged. A group whose answers all got the same reward teaches "
    "nothing, yet plain GRPO still pays for it in the passes after generation. **FastRL samples fewer answers for "
    "questions it has already decided (the budget), and drops rollouts that carry no gradient or whose gradient "
    "is not worth its passes (the rule).** Both methods merge identical answers to a question into one row; that "
    "saving is not FastRL's and is shown apart.")
live = any(widgets.is_live(r) for _, r in runs.iterrows())


def story() -> None:
    widgets.run_caption(widgets.current(run_id), refreshing=live)
    steps = cached.steps([run_id])
    if steps.empty:
        st.info("The run has started; the story begins once its first step is written.")
        return
    all_runs = cached.runs()
    base_id, why = analysis.paired_baseline(all_runs, run_id)
    by_id = all_runs.set_index("run_id", drop=False)

    st.header("1 · One group, in both runs")
    groups = cached.groups(run_id)
    step, prompt = analysis.pick_demo_group(groups)
    group = cached.rollouts(run_id, step, prompt) if prompt is not None else pd.DataFrame()
    nominal = int(widgets.run_config(by_id.loc[run_id]).get("rollouts_per_prompt", 0)) or None
    if group.empty:
        if prompt is None or not widgets.file_problem(run_id, step, "rollouts", "its group cannot be shown"):
            st.info("This run does not log rollouts, so there is no group to show.")
    else:
        left, right = st.columns([1, 2])
        png, missing = cached.image(run_id, group["image_ref"].iloc[0])
        if png is not None:
            left.image(png, caption=f"step {step} · prompt {prompt}", width=300)
        else:
            left.caption(f"(no image shown: {missing})")
        with right:
            widgets.labelled_text("Question.", group["question"].iloc[0])
            widgets.labelled_text("Correct answer.", group["answer"].iloc[0])
            skipped = analysis.group_fate(group, nominal)["skipped"] or 0
            st.plotly_chart(charts.group_bars(group, revision=f"demo/{step}/{prompt}", skipped=skipped),
                            key="demo_group")
        other = cached.rollouts(base_id, step, prompt) if base_id and cached.latest_step(base_id) is not None \
            and cached.latest_step(base_id) >= step else pd.DataFrame()
        st.markdown(analysis.group_story(group, other, run_label="FastRL", base_label="GRPO", nominal=nominal))
        answers = st.expander("The answers in both runs, side by side", key="demo_answers", on_change="rerun")
        if answers.open:  # lazy: its two tables are built and sent only once it is opened
            with answers:
                cols = st.columns(2)
                for col, (label, rows) in zip(cols, (("FastRL", group), ("GRPO", other))):
                    col.markdown(f"**{label}**")
                    if rows.empty:
                        col.caption("No group of this prompt at this step in the GRPO run"
                                    + (f" ({why})" if why else "."))
                    else:
                        col.dataframe(analysis.rollout_table(rows), hide_index=True, key=f"demo_answers_{label}")
        st.page_link("views/rollouts.py", label="Browse every group of this step",
                     query_params={"run": run_id, "step": str(step), "prompt": prompt}, icon=":material/search:")

    st.header("2 · Where the rollouts went")
    ids = [run_id] + ([base_id] if base_id else [])
    both = cached.steps(ids)
    if not all(savings.has_split(both[both["run_id"] == r]) for r in ids):
        st.info("These runs' steps do not record the split of their rollouts (a store written before it was "
                "added); the Budget page shows sampled and kept.")
    else:
        totals = pd.DataFrame([{"run": f"{metrics.run_labels(by_id.loc[[r]])['method'].iloc[0]} · {r}",
                                **savings.split_totals(savings.rollout_split(both[both["run_id"] == r]))}
                               for r in ids])
        st.plotly_chart(charts.split_bars(totals, revision="demo/split"), key="demo_split")
        passes = savings.passes_after_pruning(steps, widgets.run_config(by_id.loc[run_id]))
        st.markdown(analysis.split_sentence(totals.iloc[0].to_dict(), passes))
        if base_id:
            credit = savings.credited_saving(totals.iloc[0].to_dict(), totals.iloc[1].to_dict())
            st.markdown(analysis.credit_sentence("FastRL", "GRPO", credit))
        else:
            st.caption(f"No GRPO run to credit against: {why}")
        per_prompt = both.assign(method=both["run_id"].map(
            metrics.run_labels(by_id.loc[ids]).set_index("run_id")["method"]))
        st.plotly_chart(charts.metric_lines(per_prompt, x="step", y="rollouts_per_prompt", colour="method",
                                            x_title="step", y_title="rollouts per prompt (mean over the step)",
                                            revision="demo/budget",
                                            colours=palette.method_colours(per_prompt["method"].unique())),
                        key="demo_budget")
        st.caption("The budget moving: plain GRPO samples the same n for every prompt; FastRL's budget probes or "
                   "skips prompts it has decided. " + analysis.pruning_saving(steps, passes))

    st.header("3 · Speed and accuracy against GRPO")
    if not base_id:
        st.info(f"No figure here: {why}")
        return
    labels = metrics.run_labels(all_runs)
    bench = labels[[bool(metrics.BENCH_NAME.match(str(n))) for n in all_runs.set_index("run_id").loc[
        labels["run_id"], "name"]]]
    method = labels.set_index("run_id").loc[run_id, "method"]
    base_method = labels.set_index("run_id").loc[base_id, "method"]
    ids = bench.loc[bench["method"].isin([method, base_method]), "run_id"].tolist()
    sampled, y_title = widgets.accuracy_choice(ids, key="demo_accuracy")
    per_run, summary, curves, left_out = cached.comparison(ids, sampled=sampled)
    by_method = summary.set_index("method") if len(summary) else pd.DataFrame()
    counted = per_run["run_id"].tolist() if len(per_run) else ids  # a seed counts once: the runs behind the figures
    counts = curves.groupby("run_id").size().reindex(counted).fillna(0).astype(int).tolist() if len(curves) else [0]
    averaged = analysis.averaged_evaluations(counts, metrics.WINDOW)
    if method not in by_method.index or base_method not in by_method.index or 0 in averaged:
        st.info("No figure yet: each run needs an evaluation after its warm start (step 0) first.")
        return
    ours, theirs = by_method.loc[method], by_method.loc[base_method]
    bands = pd.concat([metrics.band(c).assign(method=m) for m, c in curves.groupby("method", sort=False)],
                      ignore_index=True)
    st.plotly_chart(charts.band_lines(bands, x="wall_time", x_title="training seconds (evaluation excluded)",
                                      y_title=y_title, revision="demo/compare"), key="demo_compare")
    reached, seeds = int(ours["target_reached"]), len(ours["seeds"])
    cols = [*st.columns(3), *st.columns(3)[:2]]
    cols[0].metric("Speed-up per step", metrics.interval(ours, "step_speedup").text(".2f", "×"),
                   help="GRPO's training seconds for the same number of steps / FastRL's (the paper's speed-up)")
    cols[1].metric("Speed-up to the target accuracy", metrics.interval(ours, "target_speedup").text(".2f", "×")
                   if reached else "not reached",
                   help=f"GRPO's seconds to {metrics.TARGET_SHARE:.0%} of its gain over the warm start / "
                        f"FastRL's, on seeds where both got there ({reached} of {seeds} FastRL seeds did)")
    cols[2].metric("Rollouts to the target (× GRPO's)",
                   metrics.interval(ours, "target_rollout_share").text(".2f", "×") if reached else "not reached",
                   help="The rollouts FastRL sampled until it reached that accuracy / GRPO's, on the same seeds")
    cols[3].metric("FastRL accuracy", report.percent(metrics.interval(ours, "final_accuracy")))
    cols[4].metric("GRPO accuracy", report.percent(metrics.interval(theirs, "final_accuracy")))
    running = any(widgets.status(widgets.current(r)) == "running" for r in ids)
    st.caption(report.comparison_caption(method, base_method, seeds, len(theirs["seeds"]), averaged, sampled, running)
               + report.left_out_sentence(left_out))


# Always watching (slowly when nothing trains): a demo's runs may appear or finish at any time.
widgets.redraw_on_change("demo", None, widgets.LIVE_EVERY if live else widgets.IDLE_EVERY)
st.fragment(story)()

st.header("Hand it over")
if st.button("Prepare the HTML report", key="demo_report_button"):
    html = report.render(cached.store_dir(), run_id)
    st.download_button("Download demo.html", html, file_name="demo.html", mime="text/html",
                       key="demo_report_download")
st.caption("One self-contained file (figures, plotly.js, the group's image inline): it opens offline. "
           "The same from the command line: `fastrl report --store DIR --out demo.html`.")
