"""Embeddings: the rollouts' gradient sketches on a 2-D map; a box or lasso selection shows those rollouts
with their prompt images. UMAP is fitted in a background thread (PCA until it is ready). A range of steps holding
more than MAX_POINTS rollouts is sampled by whole steps, evenly spaced, and the page says so; ?steps=a-b links a
range."""

import numpy as np
import pandas as pd
import streamlit as st

from fastrl_app import analysis, cached, charts, widgets
from fastrl_app.savings import SPLIT_LABELS

COLOURS = {"kept / merged / pruned": "status", "advantage": "advantage", "correct / wrong": "correct"}
MAX_POINTS = 8192  # the map's points at most: a wider step range is sampled (whole steps, evenly spaced)
PAGE_SIZE = 12

st.title("Gradient-sketch map")
all_runs = widgets.runs_or_wait()
run, steps = widgets.run_with_steps("No step written yet.")  # opens on a FastRL run, which has sketches
run_id = run["run_id"]

step_ids = steps["step"].astype(int).tolist()
if len(step_ids) > 1:
    asked = analysis.step_range(st.query_params.get("steps"), step_ids)
    low, high = st.sidebar.select_slider("Steps", step_ids, key="map_steps", value=asked or (
        step_ids[max(0, len(step_ids) - 5)], step_ids[-1]))
    if st.query_params.get("steps") != f"{low}-{high}":
        st.query_params["steps"] = f"{low}-{high}"  # a link opens the same range
else:
    low = high = step_ids[0]
colour = COLOURS[st.sidebar.radio("Colour by", list(COLOURS), key="map_colour")]
window = [s for s in step_ids if low <= s <= high]
mapped = analysis.map_steps(steps[steps["step"].isin(window)], MAX_POINTS)
meta, matrix = cached.sketches(run_id, mapped, limit=MAX_POINTS)
unread = [s for s in mapped if widgets.file_problem(run_id, s, "rollouts", "its rollouts are not on the map")]
pruner = analysis.config_in_force(run, high).get("pruner", run["pruner"])  # a resume may have changed it
if meta.empty:
    if unread:
        widgets.stop()
    if cached.rollouts(run_id, window[-1]).empty:
        st.info(f"Run `{run_id}` was trained without rollout logging (log_rollouts=false): it stored no rollouts "
                "and so no sketches.")
    elif pruner == "none":
        st.info(f"Run `{run_id}` is plain GRPO (pruner `none`): it ranks no rollouts, so the trainer computed no "
                "gradient sketches to map. Its rollouts are on the Rollouts page; pick a FastRL run here.")
    else:
        st.info(f"No gradient sketches in steps {low}–{high} of `{run_id}`: its pruner {analysis.literal(pruner)} (at "
                f"step {high}) does not use them (only FastRL's does).")
    widgets.stop()

projection = cached.project(run_id, meta, matrix)
points = meta.assign(x=projection.xy[:, 0], y=projection.xy[:, 1],
                     status=analysis.fates(meta).map(SPLIT_LABELS),
                     correct=np.where(meta["accuracy_reward"].fillna(0) > 0, "correct", "wrong")).dropna(subset=["x"])
st.subheader(f"{projection.method.upper()} map of {len(points)} rollouts, steps {low}–{high}")
sample = ("" if len(mapped) == len(window) else
          f" A sample: every rollout of {len(mapped)} of the {len(window)} steps in the range, evenly spaced (the map "
          f"holds at most {MAX_POINTS:,} points; narrow the range to see every step).")
cut = f" Cut at the first {MAX_POINTS:,} of them." if len(meta) == MAX_POINTS else ""
st.caption(f"{len(points):,} rollouts of steps {low}–{high}.{sample}{cut} {projection.note} Each point is one "
           "rollout's gradient sketch (last-layer policy gradient, randomly projected); nearby points push the model "
           "in similar directions. Drag a box or lasso around points to see them below.")

if projection.pending:
    @st.fragment(run_every="2s")
    def wait_for_umap() -> None:
        if cached.project(run_id, meta, matrix).pending < projection.pending:
            st.rerun(scope="app")

    wait_for_umap()
if widgets.is_live(run):
    @st.fragment(run_every="3s")
    def newer_steps() -> None:
        latest = cached.latest_step(run_id)
        if latest is not None and latest > high:
            st.caption(f"Training has reached step {latest}; move the step range to map the newest rollouts.")

    newer_steps()


# Built once per map shown (run, steps mapped, projection and its progress, colouring, the run's version), kept in
# the session: a selection reruns only the fragment below and a page switch back here reruns the page, and both draw
# this same figure (plotly.express took 0.14-0.28 s to build it, most of the page's script run on the 800-step store).
shown = (run_id, tuple(mapped), projection.method, projection.pending, colour, cached.version(run_id))
if st.session_state.get("_sketch_map", (None, None))[0] != shown:
    st.session_state["_sketch_map"] = (shown, charts.sketch_map(points, colour=colour,
                                                                revision=f"{run_id}/{projection.method}"))
sketch_map = st.session_state["_sketch_map"][1]


@st.fragment
def map_and_selection() -> None:
    event = st.plotly_chart(sketch_map, key=f"map_{projection.method}", on_select="rerun",
                            selection_mode=("box", "lasso"))
    picked = analysis.selected_keys(event.selection.points)
    if not picked:
        st.info("Select points on the map (box or lasso) to see those rollouts here.")
        return
    chosen = points.set_index(["step", "rollout_id"]).loc[picked].reset_index()
    st.subheader(f"{len(chosen)} selected rollouts")
    fate = analysis.fates(chosen).value_counts()
    st.caption(f"{fate.get('kept', 0)} kept, {fate.get('merged', 0)} merged as duplicates, {fate.get('pruned', 0)} "
               f"pruned by the rule · mean advantage {chosen['advantage'].mean():+.2f} · "
               f"{(chosen['accuracy_reward'].fillna(0) > 0).mean():.0%} correct · in map order (step, then rollout)")
    details = pd.concat([cached.rollouts(run_id, int(s)) for s in chosen["step"].unique()])
    chosen = chosen.sort_values(["step", "rollout_id"], key=lambda c: c if c.name == "step" else
                                c.str.split("-").str[-1].astype(int), kind="stable")
    chosen = chosen.merge(details[["step", "rollout_id", "image_ref", "question", "completion"]],
                          on=["step", "rollout_id"], how="left")
    pages = max(1, -(-len(chosen) // PAGE_SIZE))
    page = st.number_input(f"Page (of {pages}, {PAGE_SIZE} a page)", 1, pages, 1, key="selection_page") \
        if pages > 1 else 1
    part = chosen.iloc[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    table = pd.DataFrame({
        "image": [cached.image_data_url(run_id, ref) for ref in part["image_ref"]],
        "step": part["step"], "status": [f if f == "kept" else f"{f}: {analysis.reason_label(r)}"
                                         for f, r in zip(analysis.fates(part), part["reason"])],
        "advantage": part["advantage"].round(3), "reward": part["reward"].round(2),
        "question": part["question"].fillna("—"), "completion": part["completion"].fillna("—"),
        "group": [f"rollouts?run={run_id}&step={s}&prompt={p}" for s, p in zip(part["step"], part["prompt_id"])]})
    st.dataframe(table, hide_index=True, row_height=charts.IMAGE_ROW_HEIGHT,
                 height=charts.image_table_height(len(table)), key="selection_table", width="stretch", column_config={
        "image": st.column_config.ImageColumn("image", width="small"),
        "question": st.column_config.TextColumn(width="medium"),
        "completion": st.column_config.TextColumn(width="large"),
        "group": st.column_config.LinkColumn("group", display_text="open group")})
    st.caption(f"Rows {(page - 1) * PAGE_SIZE + 1}–{(page - 1) * PAGE_SIZE + len(part)} of {len(chosen)}.")


map_and_selection()
