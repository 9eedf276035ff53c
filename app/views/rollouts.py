"""Rollouts: browse one step's prompt groups — image, question, and every rollout with its reward parts,
advantage, score and keep decision. Deep links: ?run=<run_id>&step=<step>&prompt=<prompt_id>."""

import streamlit as st

from app import analysis, charts, data, widgets

ALL = "— every prompt of the step —"
CHOICES = {"all": None, "yes": True, "no": False}

st.title("Rollouts")
run, steps = widgets.run_with_steps("No step written yet; this page shows a step's groups once one is.")
run_id = run["run_id"]

step_ids = steps["step"].astype(int).tolist()
asked = st.query_params.get("step")
default_step = int(asked) if asked is not None and asked.lstrip("-").isdigit() and int(asked) in step_ids \
    else step_ids[-1]
step = st.sidebar.select_slider("Step", step_ids, value=default_step, key="rollouts_step")
kept = CHOICES[st.sidebar.radio("Kept", list(CHOICES), horizontal=True, key="rollouts_kept")]
correct = CHOICES[st.sidebar.radio("Correct", list(CHOICES), horizontal=True, key="rollouts_correct")]

groups = data.groups(run_id, step)
rollouts = data.rollouts(run_id, step)
reasons = sorted(rollouts["reason"].dropna().unique().tolist())
chosen_reasons = st.sidebar.multiselect("Reason", reasons, format_func=analysis.reason_label, key="rollouts_reason",
                                        help="\n".join(f"- {analysis.reason_label(r)}: {analysis.reason_text(r)}"
                                                       for r in reasons))

prompt_ids = groups["prompt_id"].tolist()
asked_prompt = st.query_params.get("prompt")
if asked_prompt not in prompt_ids:
    asked_prompt = analysis.pick_informative_group(groups) if asked_prompt != "all" else ALL
by_prompt = groups.set_index("prompt_id")
prompt = st.selectbox(
    "Prompt group", [*prompt_ids, ALL], index=([*prompt_ids, ALL]).index(asked_prompt or ALL), key="rollouts_prompt",
    format_func=lambda p: p if p == ALL else (
        f"{p} · {by_prompt.loc[p, 'kept']}/{by_prompt.loc[p, 'sampled']} kept · "
        f"reward {by_prompt.loc[p, 'reward_mean']:.2f} ± {by_prompt.loc[p, 'reward_std']:.2f}"))
st.query_params.update(step=str(step), prompt="all" if prompt == ALL else prompt)

if rollouts.empty:
    st.info("This run does not log rollout text (log_rollouts=false), so only group counts exist for this step.")
    st.dataframe(groups, hide_index=True)
    st.stop()

shown = analysis.filter_rollouts(rollouts, prompt_id=None if prompt == ALL else prompt, kept=kept, correct=correct,
                                 reasons=chosen_reasons or None)
columns = {
    "status": st.column_config.TextColumn("", width="small"),
    "reason": st.column_config.TextColumn("pruned because", help="Why the pruner dropped it"),
    "reward": st.column_config.NumberColumn(format="%.2f"),
    "format_reward": st.column_config.NumberColumn("format", format="%.2f"),
    "accuracy_reward": st.column_config.NumberColumn("accuracy", format="%.2f"),
    "advantage": st.column_config.NumberColumn(format="%+.3f"),
    "score": st.column_config.NumberColumn(format="%.3f", help="The pruner's score for this rollout"),
    "weight": st.column_config.NumberColumn(format="%.2f", help="Loss weight of a kept rollout"),
    "length": st.column_config.NumberColumn("tokens"),
    "completion": st.column_config.TextColumn("completion", width="large"),
}
view = shown.assign(status=shown["kept"].map({True: "kept", False: "pruned"}),
                    reason=[analysis.pruned_reason(k, r) for k, r in zip(shown["kept"], shown["reason"])])

if prompt == ALL:
    st.caption(f"Step {step}: {len(shown)} of {len(rollouts)} rollouts match the filters.")
    view = view.assign(image=[data.image_data_url(ref) for ref in view["image_ref"]])
    st.dataframe(view[["image", "prompt_id", "status", "reason", "reward", "format_reward", "accuracy_reward",
                       "advantage", "score", "completion"]], hide_index=True, row_height=56, key="all_rollouts",
                 column_config={**columns, "image": st.column_config.ImageColumn("image", width="small")})
    st.stop()

group = rollouts[rollouts["prompt_id"] == prompt]
first = group.iloc[0]
left, right = st.columns([1, 2])
with left:
    png = data.image_bytes(first["image_ref"])
    if png is not None:
        st.image(png, caption=f"prompt {prompt}", width=320)
    else:
        st.caption("(no image stored for this prompt)")
with right:
    st.markdown(f"**Question.** {first['question'] or '—'}")
    st.markdown(f"**Answer.** `{first['answer'] or '—'}`")
    n_kept = int(group["kept"].sum())
    st.markdown(f"**Group.** {len(group)} rollouts sampled, **{n_kept} kept**, {len(group) - n_kept} pruned · "
                f"reward {group['reward'].mean():.2f} ± {group['reward'].std(ddof=0):.2f}")
    st.plotly_chart(charts.group_bars(group, revision=f"{run_id}/{step}/{prompt}"), key="group_bars")

st.subheader("Every rollout of the group")
st.caption(f"{len(view)} of {len(group)} rollouts match the filters, highest advantage first.")
st.dataframe(view.sort_values("advantage", ascending=False)[
    ["status", "reason", "reward", "format_reward", "accuracy_reward", "advantage", "score", "weight", "length",
     "completion"]], hide_index=True, column_config=columns, key="group_rollouts")
with st.expander("What the reasons mean"):
    for reason in reasons:
        st.markdown(f"- **{analysis.reason_label(reason)}** — {analysis.reason_text(reason)}")
st.caption(f"Link to this group: `?run={run_id}&step={step}&prompt={prompt}`")
