"""Plotly figures for the pages. Each takes tidy DataFrames and returns a figure; `uirevision` keeps the
user's zoom and legend choices when a live fragment redraws the chart with new data."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio

from fastrl_app.analysis import FATES, fates, reason_label
from fastrl_app.palette import DECISION_COLOURS, INK, NEGATIVE, POSITIVE, SPLIT_COLOURS, method_colour, rgba
from fastrl_app.savings import SPLIT_LABELS, SPLIT_PARTS

# Every figure starts from the default template (copied and validated as it is made); naming another in
# update_layout copied and validated a second one, ~60 ms a chart: a third of the Budget page's script run on an
# 800-step store (docs/results.md, "Dashboard interactions"). So the pages' template is the default.
pio.templates.default = "plotly_white"
PHASE_COLOURS = px.colors.qualitative.Set2
DEFAULT_SEQUENCE = px.colors.qualitative.Plotly  # what plotly.express colours groups with
# Tables of rollouts with an image column (st.dataframe), in pixels
IMAGE_ROW_HEIGHT = 64  # a row holding a small thumbnail
TABLE_HEADER_HEIGHT = 40
TABLE_MAX_HEIGHT = 1100  # a longer table scrolls inside this
# The budget heatmap: one prompt a row
HEATMAP_ROW_HEIGHT, HEATMAP_MARGIN, HEATMAP_MIN_HEIGHT, HEATMAP_MAX_HEIGHT = 14, 100, 260, 1400


def image_table_height(rows: int, *, most: int | None = None) -> int:
    """Pixel height of an st.dataframe showing all `rows` rows of `IMAGE_ROW_HEIGHT` (+1 px border each) under its
    header, at most `most`."""
    height = TABLE_HEADER_HEIGHT + (IMAGE_ROW_HEIGHT + 1) * rows
    return height if most is None else min(height, most)


def _style(fig: go.Figure, *, revision: str, height: int = 320, title: str | None = None) -> go.Figure:
    fig.update_layout(height=height, uirevision=revision, title=title,
                      margin=dict(l=10, r=10, t=40 if title else 10, b=10),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))
    return fig


def metric_lines(frame: pd.DataFrame, *, x: str, y: str, colour: str = "run_id", x_title: str, y_title: str,
                 revision: str, markers: bool = False, colours: dict[str, str] | None = None) -> go.Figure:
    """One line per run (or per `colour` value, in order of first appearance), coloured by `colours` (e.g. each run
    by its method's colour), else Plotly's qualitative sequence. Built from graph objects: plotly.express spends
    ~0.15 s a chart arranging the same traces."""
    fig = go.Figure()
    for i, (name, line) in enumerate(frame.groupby(colour, sort=False)):
        shade = (colours or {}).get(name, DEFAULT_SEQUENCE[i % len(DEFAULT_SEQUENCE)])
        fig.add_scatter(x=line[x], y=line[y], name=str(name), mode="lines+markers" if markers else "lines",
                        line=dict(color=shade), marker=dict(color=shade))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title)
    return _style(fig, revision=revision)


def sampled_vs_kept(steps: pd.DataFrame, *, revision: str) -> go.Figure:
    """Rollouts sampled and kept per step, with the pruned share shaded between them."""
    fig = go.Figure()
    fig.add_scatter(x=steps["step"], y=steps["rollouts_sampled"], name="sampled", mode="lines",
                    line=dict(color=INK))
    fig.add_scatter(x=steps["step"], y=steps["rollouts_kept"], name="kept (enter the update)", mode="lines",
                    line=dict(color=SPLIT_COLOURS["kept"]), fill="tonexty",
                    fillcolor=rgba(SPLIT_COLOURS["pruned"], 0.18))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="rollouts", rangemode="tozero")
    return _style(fig, revision=revision)


def rollouts_per_prompt(matrix: pd.DataFrame, *, revision: str) -> go.Figure:
    """Mean rollouts per prompt per step with the min–max band over the step's prompts."""
    per_step = matrix.groupby("step")["sampled"].agg(["mean", "min", "max"]).reset_index()
    fig = go.Figure()
    fig.add_scatter(x=per_step["step"], y=per_step["max"], mode="lines", line=dict(width=0), showlegend=False,
                    hoverinfo="skip")
    fig.add_scatter(x=per_step["step"], y=per_step["min"], mode="lines", line=dict(width=0), fill="tonexty",
                    fillcolor=rgba(INK, 0.15), name="min–max over prompts")
    fig.add_scatter(x=per_step["step"], y=per_step["mean"], mode="lines" if len(per_step) > 1 else "markers",
                    name="mean", line=dict(color=INK), marker=dict(color=INK))  # one step: a point
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="rollouts per prompt", rangemode="tozero")
    return _style(fig, revision=revision)


def budget_heatmap(table: pd.DataFrame, *, revision: str, kept: pd.DataFrame | None = None, bin_steps: int = 1
                   ) -> go.Figure:
    """Rollouts sampled per prompt (rows, labelled) and step (columns; with `bin_steps` > 1 each column sums that
    many steps, labelled by its first); blank = prompt not drawn. Hover: the prompt, sampled and kept."""
    # float32: Plotly sends numpy arrays as typed arrays of their own dtype, so the counts (exact in float32, NaN
    # for gaps) travel in half float64's bytes: 100 prompts x 200 columns went from 495 to ~260 kB of chart JSON.
    z = table.to_numpy(dtype=np.float32)
    kept_z = (kept.reindex(index=table.index, columns=table.columns).to_numpy(dtype=np.float32) if kept is not None
              else np.full_like(z, np.nan))
    steps = "step %{x}" if bin_steps == 1 else f"steps %{{x}}–(%{{x}} + {bin_steps - 1})"
    fig = go.Figure(go.Heatmap(
        z=z, x=table.columns.tolist(), y=[text_label(p) for p in table.index], colorscale="Viridis",
        colorbar=dict(title="sampled"), hoverongaps=False, customdata=kept_z if len(table) else None,
        hovertemplate=steps + " · %{y}<br>%{z} sampled, %{customdata} kept<extra></extra>"))
    fig.update_xaxes(title="step" if bin_steps == 1 else f"step ({bin_steps} steps a column)",
                     range=[min(table.columns, default=0) - bin_steps / 2, max(table.columns, default=0) + bin_steps / 2])
    fig.update_yaxes(title="", tickfont=dict(size=9), autorange="reversed", type="category")
    height = HEATMAP_ROW_HEIGHT * len(table) + HEATMAP_MARGIN
    return _style(fig, revision=revision, height=max(HEATMAP_MIN_HEIGHT, min(HEATMAP_MAX_HEIGHT, height)))


def text_label(value: object) -> str:
    """A label from the data (a prompt id) for Plotly, which reads <b>, <a href> and the like in labels and hover
    text: its HTML special characters escaped, so it shows as written."""
    return html.escape(str(value))


def prompt_timeline(visits: pd.DataFrame, *, revision: str) -> go.Figure:
    """One prompt's visits (analysis.prompt_timeline): sampled and kept per visit as bars, coloured by the
    budget's decision; hover gives the outcome."""
    fig = go.Figure()
    for decision, part in visits.groupby("decision", sort=False):
        fig.add_bar(x=part["step"], y=part["sampled"].clip(lower=0.15), name=f"sampled · {decision}",
                    marker_color=DECISION_COLOURS.get(decision, "#999"), customdata=part[["outcome", "kept"]],
                    hovertemplate="step %{x}: " + decision + ", %{y:.0f} sampled, %{customdata[1]} kept<br>"
                                  "%{customdata[0]}<extra></extra>")
    fig.add_scatter(x=visits["step"], y=visits["kept"], mode="markers", name="kept",
                    marker=dict(color=SPLIT_COLOURS["kept"], size=11, symbol="diamond"))
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="step (each visit of the prompt)", type="category")
    fig.update_yaxes(title="rollouts", rangemode="tozero")
    return _style(fig, revision=revision, height=280)


def split_areas(split: pd.DataFrame, *, revision: str) -> go.Figure:
    """Per step, the nominal rollouts (plain GRPO's prompts × n) stacked by what became of them
    (savings.rollout_split): skipped by the budget, merged as duplicates, pruned by the rule, kept. Stacked areas
    (one path per part), not bars: a bar per step and part is 3,200 SVG shapes for the browser on an 800-step run."""
    fig = go.Figure()
    for part in reversed(SPLIT_PARTS):  # kept at the bottom
        fig.add_scatter(x=split["step"], y=split[part], name=SPLIT_LABELS[part], stackgroup="split", mode="lines",
                        line={"width": 0, "shape": "hv"}, fillcolor=SPLIT_COLOURS[part],
                        marker_color=SPLIT_COLOURS[part],
                        hovertemplate="step %{x}: %{y} " + SPLIT_LABELS[part] + "<extra></extra>")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="rollouts (of prompts × n)", rangemode="tozero")
    return _style(fig, revision=revision)


def split_bars(totals: pd.DataFrame, *, revision: str, label: str = "run") -> go.Figure:
    """One horizontal bar per run: shares of its nominal rollouts in each part of the split (columns `label`,
    nominal and the SPLIT_PARTS counts)."""
    fig = go.Figure()
    for part in reversed(SPLIT_PARTS):
        share = totals[part] / totals["nominal"].where(totals["nominal"] > 0)
        fig.add_bar(y=totals[label], x=share, orientation="h", name=SPLIT_LABELS[part],
                    marker_color=SPLIT_COLOURS[part], customdata=totals[part],
                    text=[f"{v:.0%}" if v >= 0.04 else "" for v in share.fillna(0)], textposition="inside",
                    hovertemplate="%{y}: %{customdata:,} " + SPLIT_LABELS[part] + " (%{x:.1%})<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="share of the rollouts plain GRPO would sample", tickformat=".0%", range=[0, 1])
    fig.update_yaxes(title="", type="category")
    return _style(fig, revision=revision, height=110 + 45 * len(totals))


def reason_areas(counts: pd.DataFrame, *, revision: str) -> go.Figure:
    """Pruned rollouts per step, stacked by reason (areas, one path per reason; a step without a reason counts 0)."""
    fig = go.Figure()
    for i, (reason, part) in enumerate(counts.groupby("reason", sort=False)):
        colour = DEFAULT_SEQUENCE[i % len(DEFAULT_SEQUENCE)]
        fig.add_scatter(x=part["step"], y=part["count"], name=str(reason), stackgroup="reasons", mode="lines",
                        line={"width": 0, "shape": "hv"}, fillcolor=colour, marker_color=colour)
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="pruned rollouts", rangemode="tozero")
    return _style(fig, revision=revision)


def phase_bars(phases: pd.DataFrame, *, revision: str, label: str = "run_id") -> go.Figure:
    """Mean seconds per step in each phase, stacked, one bar per run (or per `label` value)."""
    fig = go.Figure()
    for i, (phase, part) in enumerate(phases.groupby("phase", sort=False)):
        fig.add_bar(x=part["seconds"], y=part[label], name=str(phase), orientation="h",
                    marker_color=PHASE_COLOURS[i % len(PHASE_COLOURS)])
    fig.update_layout(barmode="relative")
    fig.update_xaxes(title="seconds per step")
    return _style(fig, revision=revision, height=120 + 40 * phases[label].nunique())


def band_lines(bands: pd.DataFrame, *, x: str, x_title: str, y_title: str, revision: str) -> go.Figure:
    """One mean line per method with its shaded interval band (metrics.band rows with a `method` column)."""
    fig = go.Figure()
    for method, band in bands.groupby("method", sort=False):
        colour = method_colour(str(method))
        seeds = int(band["n"].iloc[0])
        if band["low"].notna().any():
            fig.add_scatter(x=band[x], y=band["high"], mode="lines", line=dict(width=0), showlegend=False,
                            hoverinfo="skip", legendgroup=method)
            fig.add_scatter(x=band[x], y=band["low"], mode="lines", line=dict(width=0), fill="tonexty",
                            fillcolor=rgba(colour, 0.18), showlegend=False, hoverinfo="skip", legendgroup=method,
                            name=f"{method} band")
        fig.add_scatter(x=band[x], y=band["mean"], mode="lines", line=dict(color=colour, width=2.5),
                        name=f"{method} ({seeds} seed{'s' if seeds != 1 else ''})", legendgroup=method,
                        hovertemplate="%{y:.3f}<extra>" + method + "</extra>")
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title)
    return _style(fig, revision=revision, height=360)


def group_bars(group: pd.DataFrame, *, revision: str, skipped: int = 0) -> go.Figure:
    """A group's rollouts as stems of advantage with a dot each (so advantage 0 still shows), coloured by their part
    of the split (`analysis.fates`: kept, merged as duplicates, pruned by the rule) and labelled by reward; hover
    gives the reason. `skipped`: rollouts of plain GRPO's n the budget did not sample, drawn as hollow markers at 0
    after the sampled ones. Every part is in the legend, present or not."""
    fig = go.Figure()
    fig.add_hline(y=0, line=dict(color="#999", width=1))
    rows = group.reset_index(drop=True).assign(n=np.arange(len(group)), fate=fates(group).to_numpy())
    for fate in FATES:
        part = rows[rows["fate"] == fate]
        colour = SPLIT_COLOURS[fate]
        fig.add_bar(x=part["n"], y=part["advantage"], width=0.08, marker_color=colour, showlegend=False,
                    hoverinfo="skip")
        fig.add_scatter(x=part["n"], y=part["advantage"], mode="markers+text" if len(group) <= 10 else "markers",
                        name=SPLIT_LABELS[fate], marker=dict(size=14, color=colour, line=dict(color="white", width=1)),
                        text=[f"r={r:.2f}" for r in part["reward"]], textfont=dict(size=10),
                        textposition=["top center" if a >= 0 else "bottom center" for a in part["advantage"]],
                        customdata=part["reason"].map(reason_label), showlegend=True,
                        hovertemplate="advantage %{y:+.2f}<br>%{text}<br>%{customdata}<extra></extra>")
    fig.add_scatter(x=list(range(len(group), len(group) + skipped)), y=[0.0] * skipped, mode="markers",
                    name=SPLIT_LABELS["skipped"], showlegend=True, hovertemplate="not sampled<extra></extra>",
                    marker=dict(size=14, color="white", line=dict(color=SPLIT_COLOURS["skipped"], width=2)))
    fig.update_xaxes(title="rollout (hover for reward and reason)", dtick=1, range=[-0.7, len(group) + skipped - 0.3])
    low, high = float(group["advantage"].min()), float(group["advantage"].max())
    fig.update_yaxes(title="advantage", zeroline=False, range=[min(low, 0) - 0.5, max(high, 0) + 0.5])
    return _style(fig, revision=revision, height=300)


def sketch_map(points: pd.DataFrame, *, colour: str, revision: str) -> go.Figure:
    """Scatter of rollouts on the 2-D map, coloured by `colour` (status: the split part's label, advantage, or
    correct); custom_data = (step, rollout_id) maps a selection back to rows; hover names the prompt. SVG, where
    plotly.express would switch to WebGL above 1,000 points: a browser without a GPU draws WebGL in software, and the
    8,192-point map loaded in 1.04-1.17 s as SVG against 1.32-1.57 s (docs/bench/store-scale/interactions.txt)."""
    points = points.assign(label=points["prompt_id"].map(text_label))
    common = dict(x="x", y="y", custom_data=["step", "rollout_id"], hover_data={"x": False, "y": False},
                  labels={"x": "", "y": ""}, render_mode="svg")
    if colour == "advantage":
        limit = float(np.nanmax(np.abs(points["advantage"]))) if len(points) else 1.0
        fig = px.scatter(points, color="advantage", color_continuous_scale="RdBu", range_color=[-limit, limit],
                         hover_name="label", **common)
    else:
        palette = {SPLIT_LABELS[f]: SPLIT_COLOURS[f] for f in FATES} if colour == "status" else {
            "correct": POSITIVE, "wrong": NEGATIVE}
        fig = px.scatter(points, color=colour, color_discrete_map=palette, hover_name="label", **common,
                         category_orders={"status": [SPLIT_LABELS[f] for f in FATES]})
    fig.update_traces(marker=dict(size=6, opacity=0.8))
    fig.update_layout(dragmode="select", legend_title_text="")
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    return _style(fig, revision=revision, height=520)
