"""Embeddings: the rollouts' gradient sketches on a 2-D map; a box or lasso selection shows those rollouts
with their prompt images. UMAP is fitted in a background thread (PCA until it is ready)."""

import numpy as np
import pandas as pd
import streamlit as st

from app import analysis, charts, data, widgets

COLOURS = {"kept / pruned": "status", "advantage": "advantage", "correct / wrong": "correct"}
MAX_POINTS = 4096
GRID_COLUMNS, GRID_MAX = 6, 24

st.title("Gradient-sketch map")
run, steps = widgets.run_with_steps("No step written yet.")
run_id = run["run_id"]

step_ids = steps["step"].astype(int).tolist()
if len(step_ids) > 1:
    low, high = st.sidebar.select_slider("Steps", step_ids, value=(step_ids[max(0, len(step_ids) - 5)], step_ids[-1]),
                                         key="map_steps")
else:
    low = high = step_ids[0]
colour = COLOURS[st.sidebar.radio("Colour by", list(COLOURS), key="map_colour")]
window = [s for s in step_ids if low <= s <= high]
meta, matrix = data.sketches(run_id, window, limit=MAX_POINTS)
if meta.empty:
    st.info("No gradient sketches in these steps (the run was trained without rollout logging or sketches).")
    st.stop()

projection = data.project(run_id, meta, matrix)
points = meta.assign(x=projection.xy[:, 0], y=projection.xy[:, 1],
                     status=np.where(meta["kept"], "kept", "pruned"),
                     correct=np.where(meta["accuracy_reward"].fillna(0) > 0, "correct", "wrong")).dropna(subset=["x"])
st.subheader(f"{projection.method.upper()} map of {len(points)} rollouts, steps {low}–{high}")
st.caption(f"{len(points)} rollouts of steps {low}–{high}"
           f"{f' (first {MAX_POINTS})' if len(meta) == MAX_POINTS else ''}. {projection.note} Each point is one "
           "rollout's gradient sketch (last-layer policy gradient, randomly projected); nearby points push the model "
           "in similar directions. Drag a box or lasso around points to see them below.")

if projection.pending:
    @st.fragment(run_every="2s")
    def wait_for_umap() -> None:
        if data.project(run_id, meta, matrix).pending < projection.pending:
            st.rerun(scope="app")

    wait_for_umap()
if widgets.is_live(run):
    @st.fragment(run_every="3s")
    def newer_steps() -> None:
        latest = data.latest_step(run_id)
        if latest is not None and latest > high:
            st.caption(f"Training has reached step {latest}; move the step range to map the newest rollouts.")

    newer_steps()


@st.fragment
def map_and_selection() -> None:
    event = st.plotly_chart(charts.sketch_map(points, colour=colour, revision=f"{run_id}/{projection.method}"),
                            key=f"map_{projection.method}", on_select="rerun", selection_mode=("box", "lasso"))
    picked = analysis.selected_keys(event.selection.points)
    if not picked:
        st.info("Select points on the map (box or lasso) to see those rollouts here.")
        return
    chosen = points.set_index(["step", "rollout_id"]).loc[picked].reset_index()
    st.subheader(f"{len(chosen)} selected rollouts")
    kept = int(chosen["kept"].sum())
    st.caption(f"{kept} kept, {len(chosen) - kept} pruned · mean advantage {chosen['advantage'].mean():+.2f} · "
               f"{(chosen['accuracy_reward'].fillna(0) > 0).mean():.0%} correct"
               f"{f' · showing the first {GRID_MAX}' if len(chosen) > GRID_MAX else ''}")
    details = pd.concat([data.rollouts(run_id, int(s)) for s in chosen["step"].unique()])
    chosen = chosen.merge(details[["step", "rollout_id", "image_ref"]], on=["step", "rollout_id"], how="left")
    for start in range(0, min(len(chosen), GRID_MAX), GRID_COLUMNS):
        columns = st.columns(GRID_COLUMNS)
        for column, (_, row) in zip(columns, chosen.iloc[start:start + GRID_COLUMNS].iterrows()):
            png = data.image_bytes(row["image_ref"])
            with column:
                if png is not None:
                    st.image(png, width="stretch")
                status = ":green[kept]" if row["kept"] else f":red[pruned]: {analysis.reason_label(row['reason'])}"
                st.markdown(f"{status}  \nA={row['advantage']:+.2f} · r={row['reward']:.2f}")
                st.page_link("views/rollouts.py", label=f"step {row['step']} group", help=row["prompt_id"],
                             query_params={"run": run_id, "step": str(row["step"]), "prompt": row["prompt_id"]})


map_and_selection()
