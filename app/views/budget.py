"""Budget: where the rollouts went, step by step — live while the run trains. One tab each (only the open one is
built and drawn): the split of plain GRPO's prompts × n (skipped by the budget, merged as duplicates, pruned by the
method's rule, kept), the group sizes and reasons, one prompt's budget decisions on a timeline, and a heatmap of the
whole run."""

import pandas as pd
import streamlit as st

from fastrl_app import analysis, cached, charts, savings, widgets

HEATMAP_PROMPTS = 100  # prompts a page of the heatmap shows (a real run has thousands)
HEATMAP_COLUMNS = 200  # columns it shows at most: longer runs are binned into groups of steps
TABS = ["Split", "Group sizes", "One prompt", "Whole run"]  # `?view=`: the open one is the only one drawn

st.title("Rollout budget")
runs = widgets.runs_or_wait()
run = widgets.pick_run(runs)
run_id = run["run_id"]
live = widgets.is_live(run)
config = widgets.run_config(run)
n = int(config.get("rollouts_per_prompt", 8))
n_min = int((config.get("budget_args") or {}).get("n_min", 2))
decided_after = int((config.get("budget_args") or {}).get("decided_after", 1))


def budget() -> None:
    widgets.run_caption(widgets.current(run_id), refreshing=live)
    steps = cached.steps([run_id])
    if steps.empty:
        st.info("The run has started; its first step is being sampled.")
        return
    matrix = cached.budget_matrix(run_id)
    last = steps.iloc[-1]
    cols = st.columns(4)
    cols[0].metric("Latest step", int(last["step"]), help="The newest step written to the store.")
    if savings.has_split(steps.iloc[-1:]):
        latest_split = savings.split_totals(savings.rollout_split(steps.iloc[-1:]))
        cols[1].metric("Kept this step", f"{analysis.kept_share(latest_split):.0%}",
                       help=f"{analysis.KEPT_HELP} This step: {latest_split['kept']} kept of {latest_split['nominal']} "
                            f"(of which {int(last['rollouts_sampled'])} sampled).")
    else:  # a store written before the split: only sampled and kept are known
        cols[1].metric("Kept this step", f"{int(last['rollouts_kept'])} / {int(last['rollouts_sampled'])} sampled",
                       help="Rollouts that enter the passes after pruning, out of those sampled (this store's steps "
                            "do not record what plain GRPO would have sampled).")
    cols[2].metric("Rollouts per prompt", f"{last['rollouts_per_prompt']:.1f}",
                   delta=f"{last['rollouts_per_prompt'] - steps.iloc[0]['rollouts_per_prompt']:+.1f} since step "
                         f"{int(steps.iloc[0]['step'])}", delta_color="off",
                   help=f"Mean over the step's prompts; plain GRPO samples {n} for every prompt.")
    latest_sampled = matrix.loc[matrix["step"] == matrix["step"].max(), "sampled"]  # the latest step's prompts only
    latest = pd.Series([analysis.budget_decision(int(s), n, n_min) for s in latest_sampled]).value_counts()
    cols[3].metric("Full / probe / trimmed / skip", " / ".join(str(latest.get(d, 0)) for d in
                                                             ("full", "probe", "trimmed", "skip")),
                   help=f"The budget's decisions for the latest step's prompts. full: {n} rollouts as plain GRPO; "
                        f"probe: {n_min} for a prompt decided (all rollouts equal) on its last "
                        + ("visit" if decided_after == 1 else f"{decided_after} visits")
                        + "; trimmed: fewer for a mixed prompt; skip: none this step.")

    split_tab, sizes_tab, prompt_tab, whole_tab = st.tabs(
        TABS, key="view", bind="query-params", default="One prompt" if "prompt" in st.query_params else None)
    if split_tab.open:  # lazy: only the open tab's charts are built and sent
        with split_tab:
            rollout_split(steps)
    if sizes_tab.open:
        with sizes_tab:
            group_sizes(matrix)
    if prompt_tab.open:
        with prompt_tab:
            prompt_visits(matrix)
    if whole_tab.open:
        with whole_tab:
            whole_run(matrix)


def rollout_split(steps: pd.DataFrame) -> None:
    st.subheader("Where plain GRPO's rollouts went")
    if savings.has_split(steps):
        split = savings.rollout_split(steps)
        totals = savings.split_totals(split)
        passes = savings.passes_after_pruning(steps, config)
        st.plotly_chart(charts.split_areas(split, revision=run_id), key="split")
        st.markdown(analysis.split_sentence(totals, passes))
        if run["pruner"] == "none" and run["budget"] == "fixed":
            st.caption("This is plain GRPO: it prunes nothing and its budget is fixed, so all it leaves out are "
                       "merged duplicates (which FastRL merges too).")
        else:
            st.caption(analysis.pruning_saving(steps, passes))
    else:
        st.info("This run's steps do not record the split (a store written before it was added): only sampled "
                "and kept are known.")
        st.plotly_chart(charts.sampled_vs_kept(steps, revision=run_id), key="sampled_vs_kept")


def group_sizes(matrix: pd.DataFrame) -> None:
    left, right = st.columns(2)
    with left:
        st.subheader("Rollouts per prompt")
        st.plotly_chart(charts.rollouts_per_prompt(matrix, revision=run_id), key="per_prompt")
        st.caption("The budget controller's choice of group size; the band spans the step's prompts. A fixed "
                   f"budget stays at {n}.")
    with right:
        st.subheader("Why rollouts were left out")
        counts = analysis.reason_labels(cached.reason_counts(run_id))
        if counts.empty:
            st.info("No sampled rollout was left out yet (or the run does not log rollouts).")
        else:
            st.plotly_chart(charts.reason_areas(counts, revision=run_id), key="reasons")


def prompt_visits(matrix: pd.DataFrame) -> None:
    st.subheader("One prompt's visits")
    visits = matrix.groupby("prompt_id")["step"].agg(["size", "max"]).sort_values("size", ascending=False,
                                                                                    kind="stable")
    options = visits.index.tolist()
    labels = {p: f"{p} · {analysis.plural(size, 'visit')}" for p, size in zip(options, visits["size"].tolist())}
    asked = st.query_params.get("prompt")
    prompt = st.selectbox("Prompt", options, index=options.index(asked) if asked in options else 0,
                          key="timeline_prompt", format_func=labels.__getitem__)
    if st.query_params.get("prompt") != prompt:
        st.query_params["prompt"] = prompt
    widgets.labelled_text("Question.", cached.question(run_id, int(visits.loc[prompt, "max"]), prompt))
    line = analysis.prompt_timeline(cached.groups(run_id), prompt, n, n_min)
    st.plotly_chart(charts.prompt_timeline(line, revision=f"{run_id}/{prompt}"), key="timeline")
    st.dataframe(line.assign(merged=line["merged"].map(lambda v: "—" if pd.isna(v) else f"{int(v)}")),
                 hide_index=True, key="timeline_table", column_config={
                     "reward_mean": st.column_config.NumberColumn("reward mean", format="%.2f"),
                     "reward_std": st.column_config.NumberColumn("reward std", format="%.2f")})
    st.caption("Each visit: rollouts sampled (the bar, coloured by the budget's decision) and kept (◆), and the "
               "outcome the budget reads next time: a mixed group teaches something, an all-equal one does not.")


def whole_run(matrix: pd.DataFrame) -> None:
    st.subheader("Per-prompt budget, the whole run")
    order = analysis.heatmap_prompts(matrix)
    pages = max(1, -(-len(order) // HEATMAP_PROMPTS))
    page = st.number_input(f"Prompts, page (of {pages}, {HEATMAP_PROMPTS} a page, by first visit)", 1, pages, 1,
                           key="heatmap_page") if pages > 1 else 1
    shown = order[(page - 1) * HEATMAP_PROMPTS: page * HEATMAP_PROMPTS]
    first, last = int(matrix["step"].min()), int(matrix["step"].max())
    bin_steps = max(1, -(-(last - first + 1) // HEATMAP_COLUMNS))
    table = analysis.budget_heatmap(matrix, prompts=shown, bin_steps=bin_steps)
    kept = analysis.budget_heatmap(matrix, value="kept", prompts=shown, bin_steps=bin_steps)
    st.plotly_chart(charts.budget_heatmap(table, kept=kept, revision=f"{run_id}/{page}", bin_steps=bin_steps),
                    key="heatmap")
    paged = (f"prompts {(page - 1) * HEATMAP_PROMPTS + 1}–{(page - 1) * HEATMAP_PROMPTS + len(shown)} of the run's "
             f"{len(order)} (a page of {HEATMAP_PROMPTS}, in the order they were first drawn)" if pages > 1 else
             f"each of the run's {len(order)} prompts")
    binned = (f"; each column sums {bin_steps} steps (the run's {last - first + 1} steps binned into "
              f"{len(table.columns)} columns)" if bin_steps > 1 else "")
    st.caption(f"Rollouts sampled for {paged} at every step {first}–{last}{binned} (blank: not drawn; hover for "
               "how many were kept). A prompt's budget changes between visits as the controller learns how "
               "informative it is.")


widgets.redraw_on_change("budget", [run_id], widgets.LIVE_EVERY if live else None)
st.fragment(budget)()  # a widget inside redraws only this part
