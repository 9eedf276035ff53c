"""Rollouts: browse one step's prompt groups — image, question, and every rollout with its reward parts, advantage,
score, loss weight, multiplicity and part of the split (kept, merged as a duplicate, pruned by the rule); the full
text of any rollout, token by token; the same prompt in another run side by side. Deep links:
?run=<run_id>&step=<step>&prompt=<prompt_id> (what a link names that the store lacks is said, not silently
replaced). A file the page needs that does not read is named."""

import pandas as pd
import streamlit as st

from fastrl_app import analysis, cached, charts, widgets
from fastrl_core import store

ALL = "— every prompt of the step —"
CHOICES = {"all": None, "yes": True, "no": False}
NONE = "— none —"
PAGE_ROWS = 64  # rows a page of the every-prompt view shows (a real step has 512, each with its image)
COLUMNS = {  # the rollout tables' columns
    "status": st.column_config.TextColumn("", width="small", help="kept, merged as a duplicate, or pruned by the "
                                          "method's rule"),
    "multiplicity": st.column_config.NumberColumn("stands for", help="Sampled rollouts this row counts for: "
                                                  "identical answers are merged into the first (0: a merged copy)"),
    "reason": st.column_config.TextColumn("left out because", help="Why the pruner (or the merge) left it out"),
    "reward": st.column_config.NumberColumn(format="%.2f"),
    "format_reward": st.column_config.NumberColumn("format", format="%.2f"),
    "accuracy_reward": st.column_config.NumberColumn("accuracy", format="%.2f"),
    "advantage": st.column_config.NumberColumn(format="%+.3f", help="Reward relative to its group's"),
    "score": st.column_config.NumberColumn(format="%.3f", help="The pruner's ranking number (see below)"),
    "weight": st.column_config.NumberColumn(format="%.2f", help="Loss weight in the update; 0 when left out"),
    "length": st.column_config.NumberColumn("tokens"),
    "question": st.column_config.TextColumn("question", width="medium"),
    "completion": st.column_config.TextColumn("completion", width="large"),
}
EXPLAINED = (
    "**stands for**: how many sampled rollouts the row counts for. Identical answers to a question are merged: the "
    "first counts all of them in the update, its copies show 0 and status merged (reason duplicate). **score**: the "
    "pruner's ranking number for the rollout (for FastRL, its |advantage|-weighted share of the group's gradient "
    "sketch; 0 for plain GRPO, which ranks nothing). **weight**: the loss weight of a kept rollout in the update (1 "
    "unless the pruner reweights; 0 for a rollout left out).")

st.title("Rollouts")
run, steps = widgets.run_with_steps("No step written yet; this page shows a step's groups once one is.")
run_id = run["run_id"]
nominal = int(widgets.run_config(run).get("rollouts_per_prompt", 0)) or None  # plain GRPO's n

step_ids = steps["step"].astype(int).tolist()
step = widgets.pick_step(step_ids, run_id, key="rollouts_step")
others = [r for r in cached.runs()["run_id"].tolist() if r != run_id]
paired, _ = analysis.paired_baseline(cached.runs(), run_id)
compare_with = st.sidebar.selectbox("Same prompt in run", [NONE, *others],
                                    index=([NONE, *others]).index(paired) if paired in others else 0,
                                    key="rollouts_compare", help="Show this prompt's group in another run beside it")


def full_text(frame: pd.DataFrame, key: str) -> None:
    """The complete text of one rollout of `frame`, chosen by its id, and its tokens shaded by log-prob."""
    if frame.empty:
        return
    ids = frame["rollout_id"].tolist()
    rows = frame.set_index("rollout_id")
    chosen = st.selectbox("Full text of rollout", ids, key=key,
                          format_func=lambda r: f"{r} · {rows.loc[r, 'status']} · A={rows.loc[r, 'advantage']:+.2f}")
    row = rows.loc[chosen]
    st.markdown(f"{analysis.literal(chosen)} · prompt {analysis.literal(row['prompt_id'])} · reward "
                f"{row['reward']:.2f} · advantage {row['advantage']:+.3f} · {row['status']}"
                + (f" ({row['reason']})" if row["reason"] != "—" else "")
                + f" · stands for {int(row['multiplicity'])} · {int(row['length'])} tokens")
    st.text(row["completion"])  # plain and wrapped; st.code ran a syntax highlighter over it on every draw
    try:
        tokens = cached.tokens(run_id, int(row["step"]), chosen)
    except store.DamagedFile as error:
        st.error(f"The token view needs {analysis.literal(str(error), 160)}, which does not read.")
        return
    if tokens is None:
        st.caption("This run's store has no per-token log-probabilities (written before they were recorded, or by "
                   "a trainer that does not record them): the text above is the complete decoded completion with "
                   "the rollout's own advantage, reward and token count.")
    else:
        st.markdown("**Token by token.** Each token shaded by the log-probability the policy gave it when sampling "
                    "(darker: less likely; hover for the value); the badge is the rollout's advantage, which scales "
                    "every token's log-prob gradient in the update.")
        st.html(analysis.token_html(tokens, float(row["advantage"])))


def filters(reasons: list[str]) -> tuple[bool | None, bool | None, list[str]]:
    """The Kept, Correct and Reason filters, in one row above the group: (kept, correct, reasons; None and []: all)."""
    left, middle, right = st.columns([1, 1, 2])
    kept = CHOICES[left.radio("Kept", list(CHOICES), horizontal=True, key="rollouts_kept")]
    correct = CHOICES[middle.radio("Correct", list(CHOICES), horizontal=True, key="rollouts_correct")]
    chosen = right.multiselect("Reason", reasons, format_func=analysis.reason_label, key="rollouts_reason",
                               help="\n".join(f"- {analysis.reason_label(r)}: {analysis.reason_text(r)}"
                                              for r in reasons))
    return kept, correct, chosen


def side_by_side(prompt: str, group: pd.DataFrame, nominal: int | None) -> None:
    """The prompt's group in this run and in `compare_with`, at this step or that run's nearest visit."""
    other_steps = cached.groups(compare_with)
    visits = other_steps.loc[other_steps["prompt_id"] == prompt, "step"].astype(int).tolist()
    if not visits:
        st.info(f"Run `{compare_with}` never drew prompt {analysis.literal(prompt)}.")
        return
    other_step = step if step in visits else min(visits, key=lambda s: abs(s - step))
    other = cached.rollouts(compare_with, other_step, prompt)
    cols = st.columns(2)
    for col, label, rows, at in ((cols[0], run_id, group, step), (cols[1], compare_with, other, other_step)):
        with col:
            fate = analysis.group_fate(rows, nominal) if len(rows) else None
            st.markdown(f"**{label}** · step {at} · " + (analysis.fate_sentence(fate) if fate else
                                                          "no rollouts logged"))
            if len(rows):
                st.dataframe(analysis.rollout_table(rows), hide_index=True, key=f"side_{label == run_id}")
    if other_step != step:
        st.caption(f"`{compare_with}` did not draw this prompt at step {step}; its nearest visit is step "
                   f"{other_step}.")


@st.fragment
def group_view() -> None:
    """The step's prompt groups under the filters. A change of the prompt group, a filter or the rollout shown in
    full reruns only this part of the page (the run, the step and the run compared with are in the sidebar)."""
    groups = cached.groups(run_id, step)
    rollouts = cached.rollouts_with_parts(run_id, step)
    if groups.empty and widgets.file_problem(run_id, step, "groups", "its prompt groups cannot be shown"):
        widgets.stop()
    prompt_ids = groups["prompt_id"].tolist()
    asked_prompt = st.query_params.get("prompt")
    if asked_prompt not in prompt_ids:
        if asked_prompt not in (None, "all"):
            st.warning(f"The link asks for prompt {analysis.literal(asked_prompt)}, which step {step} of `{run_id}` "
                       "did not draw; showing the step's most informative group.")
        asked_prompt = analysis.pick_informative_group(groups) if asked_prompt != "all" else ALL
    by_prompt = groups.set_index("prompt_id")
    prompt = st.selectbox(
        "Prompt group", [*prompt_ids, ALL], index=([*prompt_ids, ALL]).index(asked_prompt or ALL),
        key="rollouts_prompt",
        format_func=lambda p: p if p == ALL else (
            f"{p} · {by_prompt.loc[p, 'kept']}/{by_prompt.loc[p, 'sampled']} kept · "
            f"reward {by_prompt.loc[p, 'reward_mean']:.2f} ± {by_prompt.loc[p, 'reward_std']:.2f}"))
    st.query_params.update(step=str(step), prompt="all" if prompt == ALL else prompt)

    if rollouts.empty:
        if not widgets.file_problem(run_id, step, "rollouts", "this step's rollouts cannot be shown"):
            st.info("This run does not log rollout text (log_rollouts=false), so only group counts exist for this "
                    "step." if not widgets.logs_rollouts(run) else
                    f"Step {step} recorded no rollouts (its groups sampled none).")
        st.dataframe(groups, hide_index=True)
        widgets.stop()

    reasons = sorted(rollouts["reason"].dropna().unique().tolist())
    kept, correct, chosen_reasons = filters(reasons)
    shown = analysis.filter_rollouts(rollouts, prompt_id=None if prompt == ALL else prompt, kept=kept, correct=correct,
                                     reasons=chosen_reasons or None)
    view = shown.assign(reason=[analysis.pruned_reason(k, r) or "—" for k, r in zip(shown["kept"], shown["reason"])])

    if prompt == ALL:
        pages = max(1, -(-len(view) // PAGE_ROWS))
        page = st.number_input(f"Page (of {pages}, {PAGE_ROWS} rows a page)", 1, pages, 1, key="rollouts_page") \
            if pages > 1 else 1
        part = view.iloc[(page - 1) * PAGE_ROWS: page * PAGE_ROWS]
        st.caption(f"Step {step}: {len(shown)} of {len(rollouts)} rollouts match the filters, grouped by prompt; rows "
                   f"{(page - 1) * PAGE_ROWS + 1 if len(part) else 0}–{(page - 1) * PAGE_ROWS + len(part)} shown.")
        part = part.assign(image=[cached.image_data_url(run_id, ref) for ref in part["image_ref"]])
        st.dataframe(part[["image", "prompt_id", "question", "status", "multiplicity", "reason", "reward",
                           "advantage", "score", "weight", "completion"]], hide_index=True,
                     row_height=charts.IMAGE_ROW_HEIGHT,
                     height=charts.image_table_height(len(part), most=charts.TABLE_MAX_HEIGHT), key="all_rollouts",
                     column_config={**COLUMNS, "image": st.column_config.ImageColumn("image", width="small")})
        st.caption(EXPLAINED)
        full_text(part, "full_all")
        widgets.stop()

    group = rollouts[rollouts["prompt_id"] == prompt]
    first = group.iloc[0]
    left, right = st.columns([1, 2])
    with left:
        png, missing = cached.image(run_id, first["image_ref"])
        if png is not None:
            st.image(png, caption=f"prompt {prompt}", width=320)
        else:
            st.caption(f"(no image shown: {missing})")
    with right:
        widgets.labelled_text("Question.", first["question"])
        widgets.labelled_text("Answer.", first["answer"])
        fate = analysis.group_fate(group, nominal)
        st.markdown(f"**Group.** {analysis.fate_sentence(fate)} · reward {group['reward'].mean():.2f} ± "
                    f"{group['reward'].std(ddof=0):.2f}")
        st.plotly_chart(charts.group_bars(group, revision=f"{run_id}/{step}/{prompt}", skipped=fate["skipped"] or 0),
                        key="group_bars")

    st.subheader("Every rollout of the group")
    st.caption(f"{len(view)} of {len(group)} rollouts match the filters, highest advantage first. {EXPLAINED}")
    st.dataframe(view.sort_values("advantage", ascending=False)[
        ["status", "multiplicity", "reason", "reward", "format_reward", "accuracy_reward", "advantage", "score",
         "weight", "length", "completion"]], hide_index=True, column_config=COLUMNS, key="group_rollouts")
    full_text(view, "full_group")

    if compare_with != NONE:
        beside = st.expander(f"The same prompt in `{compare_with}`", key="rollouts_beside", on_change="rerun")
        if beside.open:  # lazy: the other run's group is read and its tables sent only while this is open
            with beside:
                side_by_side(prompt, group, nominal)

    with st.expander("What the reasons mean"):
        for reason in reasons:
            st.markdown(f"- **{analysis.reason_label(reason)}** — {analysis.reason_text(reason)}")
    st.caption(f"Link to this group: {analysis.literal(f'?run={run_id}&step={step}&prompt={prompt}', 200)}")


group_view()
