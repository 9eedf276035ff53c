"""Plotly figures for the pages. Each takes tidy DataFrames and returns a figure; `uirevision` keeps the
user's zoom and legend choices when a live fragment redraws the chart with new data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

KEPT_COLOURS = {"kept": "#2a9d8f", "pruned": "#e76f51"}
PHASE_COLOURS = px.colors.qualitative.Set2


def _style(fig: go.Figure, *, revision: str, height: int = 320, title: str | None = None) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height, uirevision=revision, title=title,
                      margin=dict(l=10, r=10, t=40 if title else 10, b=10),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))
    return fig


def metric_lines(frame: pd.DataFrame, *, x: str, y: str, colour: str = "run_id", x_title: str, y_title: str,
                 revision: str, markers: bool = False) -> go.Figure:
    """One line per run (or per `colour` value)."""
    fig = px.line(frame, x=x, y=y, color=colour, markers=markers,
                  labels={x: x_title, y: y_title, colour: ""})
    return _style(fig, revision=revision)


def sampled_vs_kept(steps: pd.DataFrame, *, revision: str) -> go.Figure:
    """Rollouts sampled and kept per step, with the pruned share shaded between them."""
    fig = go.Figure()
    fig.add_scatter(x=steps["step"], y=steps["rollouts_sampled"], name="sampled", mode="lines",
                    line=dict(color="#264653"))
    fig.add_scatter(x=steps["step"], y=steps["rollouts_kept"], name="kept (enter the update)", mode="lines",
                    line=dict(color=KEPT_COLOURS["kept"]), fill="tonexty", fillcolor="rgba(231,111,81,0.18)")
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
                    fillcolor="rgba(38,70,83,0.15)", name="min–max over prompts")
    fig.add_scatter(x=per_step["step"], y=per_step["mean"], mode="lines", name="mean", line=dict(color="#264653"))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="rollouts per prompt", rangemode="tozero")
    return _style(fig, revision=revision)


def budget_heatmap(table: pd.DataFrame, *, revision: str) -> go.Figure:
    """Rollouts sampled per prompt (rows) and step (columns); blank = prompt not sampled that step."""
    fig = go.Figure(go.Heatmap(z=table.to_numpy(dtype=float), x=table.columns.tolist(), y=table.index.tolist(),
                               colorscale="Viridis", colorbar=dict(title="rollouts"), hoverongaps=False,
                               hovertemplate="step %{x}<br>%{y}<br>%{z} rollouts<extra></extra>"))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="prompt", showticklabels=len(table) <= 30)
    return _style(fig, revision=revision, height=max(260, min(600, 12 * len(table) + 80)))


def reason_areas(counts: pd.DataFrame, *, revision: str) -> go.Figure:
    """Pruned rollouts per step, stacked by reason."""
    fig = px.bar(counts, x="step", y="count", color="reason", labels={"count": "pruned rollouts", "reason": ""})
    fig.update_layout(bargap=0)
    return _style(fig, revision=revision)


def zero_variance(steps: pd.DataFrame, groups_per_step: pd.Series, *, revision: str) -> go.Figure:
    """Share of the step's groups whose rewards were all equal (no learning signal)."""
    share = steps["zero_variance_groups"].to_numpy() / np.maximum(groups_per_step.to_numpy(), 1)
    fig = go.Figure(go.Scatter(x=steps["step"], y=share, mode="lines", line=dict(color="#e9c46a"),
                               customdata=steps["zero_variance_groups"],
                               hovertemplate="step %{x}: %{customdata} groups (%{y:.0%})<extra></extra>"))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="zero-variance groups", tickformat=".0%", range=[0, 1])
    return _style(fig, revision=revision)


def phase_bars(phases: pd.DataFrame, *, revision: str, label: str = "run_id") -> go.Figure:
    """Mean seconds per step in each phase, stacked, one bar per run (or per `label` value)."""
    fig = px.bar(phases, x="seconds", y=label, color="phase", orientation="h",
                 color_discrete_sequence=PHASE_COLOURS, labels={"seconds": "seconds per step", label: ""})
    return _style(fig, revision=revision, height=120 + 40 * phases[label].nunique())


def _rgba(colour: str, alpha: float) -> str:
    red, green, blue = (int(colour.lstrip("#")[i: i + 2], 16) for i in (0, 2, 4))
    return f"rgba({red},{green},{blue},{alpha})"


def band_lines(bands: pd.DataFrame, *, x: str, x_title: str, y_title: str, revision: str) -> go.Figure:
    """One mean line per method with its shaded interval band (metrics.band rows with a `method` column)."""
    fig = go.Figure()
    palette = px.colors.qualitative.D3
    for i, (method, band) in enumerate(bands.groupby("method", sort=False)):
        colour = palette[i % len(palette)]
        seeds = int(band["n"].iloc[0])
        if band["low"].notna().any():
            fig.add_scatter(x=band[x], y=band["high"], mode="lines", line=dict(width=0), showlegend=False,
                            hoverinfo="skip", legendgroup=method)
            fig.add_scatter(x=band[x], y=band["low"], mode="lines", line=dict(width=0), fill="tonexty",
                            fillcolor=_rgba(colour, 0.18), showlegend=False, hoverinfo="skip", legendgroup=method,
                            name=f"{method} band")
        fig.add_scatter(x=band[x], y=band["mean"], mode="lines", line=dict(color=colour, width=2.5),
                        name=f"{method} ({seeds} seed{'s' if seeds != 1 else ''})", legendgroup=method,
                        hovertemplate="%{y:.3f}<extra>" + method + "</extra>")
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title)
    return _style(fig, revision=revision, height=360)


def group_bars(group: pd.DataFrame, *, revision: str) -> go.Figure:
    """A group's rollouts as stems of advantage with a dot each (so advantage 0 still shows), coloured kept /
    pruned and labelled by reward; hover gives the pruner's reason."""
    fig = go.Figure()
    fig.add_hline(y=0, line=dict(color="#999", width=1))
    for status, is_kept in (("kept", True), ("pruned", False)):
        part = group.reset_index(drop=True).assign(n=np.arange(len(group)))
        part = part[part["kept"].astype(bool) == is_kept]
        colour = KEPT_COLOURS[status]
        fig.add_bar(x=part["n"], y=part["advantage"], width=0.08, marker_color=colour, showlegend=False,
                    hoverinfo="skip")
        fig.add_scatter(x=part["n"], y=part["advantage"], mode="markers+text" if len(group) <= 10 else "markers",
                        name=status, marker=dict(size=14, color=colour, line=dict(color="white", width=1)),
                        text=[f"r={r:.2f}" for r in part["reward"]], textfont=dict(size=10),
                        textposition=["top center" if a >= 0 else "bottom center" for a in part["advantage"]],
                        customdata=part["reason"].fillna("—"),
                        hovertemplate="advantage %{y:+.2f}<br>%{text}<br>%{customdata}<extra></extra>")
    fig.update_xaxes(title="rollout (hover for reward and reason)", dtick=1, range=[-0.7, len(group) - 0.3])
    low, high = float(group["advantage"].min()), float(group["advantage"].max())
    fig.update_yaxes(title="advantage", zeroline=False, range=[min(low, 0) - 0.5, max(high, 0) + 0.5])
    return _style(fig, revision=revision, height=280)


def sketch_map(points: pd.DataFrame, *, colour: str, revision: str) -> go.Figure:
    """Scatter of rollouts on the 2-D map; custom_data = (step, rollout_id) maps a selection back to rows."""
    common = dict(x="x", y="y", custom_data=["step", "rollout_id"], hover_data={"x": False, "y": False},
                  labels={"x": "", "y": ""})
    if colour == "advantage":
        limit = float(np.nanmax(np.abs(points["advantage"]))) if len(points) else 1.0
        fig = px.scatter(points, color="advantage", color_continuous_scale="RdBu", range_color=[-limit, limit],
                         hover_name="prompt_id", **common)
    else:
        palette = KEPT_COLOURS if colour == "status" else {"correct": "#2a9d8f", "wrong": "#e76f51"}
        fig = px.scatter(points, color=colour, color_discrete_map=palette, hover_name="prompt_id", **common)
    fig.update_traces(marker=dict(size=6, opacity=0.8))
    fig.update_layout(dragmode="select", legend_title_text="")
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    return _style(fig, revision=revision, height=520)
