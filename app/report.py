"""The Demo page as one self-contained HTML file (`fastrl report --store DIR --out demo.html`, and the Demo page's
button): the same three sections, figures inline with plotly.js embedded once, the pruned group's image as a data
URL, and the caveats; nothing is fetched when it is opened, so it opens offline. Reads the store directly (no
Streamlit), with the page's own helpers (app.analysis, app.charts, fastrl_app.metrics)."""

from __future__ import annotations

import base64
import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from markdown_it import MarkdownIt

from fastrl_app import analysis, charts, metrics, palette, savings
from fastrl_core import store

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:0}.caption{color:#666;font-size:.9em}.metrics{display:flex;gap:2em;flex-wrap:wrap}
.metric b{display:block;font-size:1.5em}table{border-collapse:collapse;font-size:.85em}
td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
.caveats{background:#fff8e1;padding:.5em 1em;border-left:4px solid #e9c46a}"""


def percent(interval: metrics.Interval) -> str:
    """An accuracy interval as `61.2%` (one seed) or `61.2% ± 1.4 pts`; `—` without a value."""
    if interval.n == 0 or not math.isfinite(interval.mean):
        return "—"
    if interval.n < 2 or not math.isfinite(interval.high):
        return f"{interval.mean:.1%}"
    return f"{interval.mean:.1%} ± {100 * (interval.high - interval.mean):.1f} pts"


def comparison_caption(method: str, base_method: str, seeds: int, base_seeds: int, averaged: list[int],
                       sampled: bool, running: bool) -> str:
    """What section 3's figures are, said as they are: runs trained interleaved, seeds, the evaluations the final
    accuracy averages (`averaged`: per run behind the figures, `analysis.averaged_evaluations`), intervals only with
    two seeds or more."""
    accuracy = "mean@k (k samples per problem at the training temperature)" if sampled else "greedy accuracy"
    intervals = ("± and [ ] are 95 % intervals over seeds" if min(seeds, base_seeds) >= 2 else
                 "one seed, so no interval: a second seed (`fastrl bench --seeds 0,1`) would give one")
    return (f"Measured on this machine from runs trained interleaved step by step in one process ({method}: {seeds} "
            f"seed{'s' if seeds != 1 else ''}, {base_method}: {base_seeds}), paired by seed, so load from other "
            f"jobs slowed both alike. Accuracy is {accuracy} "
            f"on the held-out split, {analysis.final_accuracy_words(averaged)}; {intervals}."
            + (" Some of these runs are still training, so the figures will move." if running else ""))


def left_out_sentence(left_out: pd.DataFrame) -> str:
    """Which runs a comparison left out because their method and seed already had a newer run
    (`metrics.one_run_per_seed`): a seed counts once. Empty when none was."""
    if left_out.empty:
        return ""
    pairs = "; ".join(f"{row.run_id} ({row.method}, seed {row.seed}; counted: {row.counted})"
                      for row in left_out.itertuples())
    return (f" A seed counts once: {len(left_out)} older run{'s' if len(left_out) != 1 else ''} of a method and seed "
            f"that has a newer one {'are' if len(left_out) != 1 else 'is'} left out of the means, intervals and "
            f"bands: {pairs}.")


def _md(text: str) -> str:
    """Markdown as HTML, raw HTML in it escaped (text from the store is never markup)."""
    return MarkdownIt("commonmark", {"html": False}).render(text)


def _figure(fig, first: list[bool]) -> str:
    """A figure as an HTML div; plotly.js is embedded with the first one only."""
    out = fig.to_html(full_html=False, include_plotlyjs=first[0], config={"displaylogo": False})
    first[0] = False
    return out


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, escape=True, na_rep="—", border=0)


def render(store_dir: str | Path, run_id: str | None = None) -> str:
    """The Demo page of `run_id` (default: the newest FastRL run, else the newest run) as one HTML document."""
    store_dir = Path(store_dir)
    runs = store.read_runs(store_dir) if (store_dir / "runs").exists() else pd.DataFrame()
    if runs.empty:  # FileNotFoundError: the CLI prints its message on one line (a user's error, not the code's)
        raise FileNotFoundError(f"fastrl report: the store {store_dir} has no runs")
    runs = runs.sort_values("started", ascending=False, kind="stable").reset_index(drop=True)
    if run_id is None:
        mine = runs[runs["pruner"] == "fastrl"]
        run_id = str((mine if len(mine) else runs)["run_id"].iloc[0])
    if run_id not in set(runs["run_id"]):
        raise FileNotFoundError(f"fastrl report: no run {run_id!r} in {store_dir} (runs: {', '.join(runs['run_id'])})")
    by_id = runs.set_index("run_id", drop=False)
    base_id, why = analysis.paired_baseline(runs, run_id)
    ids = [run_id] + ([base_id] if base_id else [])
    steps = store.read_steps(store_dir, ids)
    labels = metrics.run_labels(by_id.loc[ids]).set_index("run_id")
    first = [True]
    parts = [f"<h1>FastRL beside GRPO</h1><p class='caption'>Store <code>{html.escape(str(store_dir))}</code> · "
             f"FastRL run <code>{html.escape(run_id)}</code>"
             + (f" · GRPO run <code>{html.escape(base_id)}</code>" if base_id else "")
             + f" · written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC</p>"]
    caveats = []
    for rid in ids:
        if str(by_id.loc[rid, "status"]) != "finished":
            caveats.append(f"Run {rid} was {by_id.loc[rid, 'status']} when this report was written: its figures "
                           "cover the steps written so far.")

    # 1. one group, in both runs
    parts.append("<h2>1 · One group, in both runs</h2>")
    groups = store.read_groups(store_dir, run_id)
    step, prompt = analysis.pick_demo_group(groups)
    group = store.read_rollouts(store_dir, run_id, step=step, prompt_id=prompt) if prompt else pd.DataFrame()
    if group.empty:
        parts.append("<p>This run does not log rollouts, so there is no group to show.</p>")
    else:
        other = pd.DataFrame()
        if base_id and (store.latest_step(store_dir, base_id) or -1) >= step:
            other = store.read_rollouts(store_dir, base_id, step=step, prompt_id=prompt)
        ref = group["image_ref"].iloc[0]
        if ref:
            try:
                png = store.read_image(store_dir, run_id, ref)
                parts.append(f"<img alt='prompt {html.escape(prompt)}' style='float:right;width:260px;"
                             f"margin-left:1em' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
            except (store.DamagedFile, FileNotFoundError) as error:
                caveats.append(f"The group's image is not shown: {error}")
        question = html.escape(group["question"].iloc[0] or "")
        parts.append(f"<p><b>Step {step}, prompt {html.escape(prompt)}.</b> {question}"
                     f"<br>Correct answer: <code>{html.escape(str(group['answer'].iloc[0] or '—'))}</code></p>")
        config = json.loads(by_id.loc[run_id, "config"]) if isinstance(by_id.loc[run_id, "config"], str) else {}
        nominal = int(config.get("rollouts_per_prompt", 0)) or None
        parts.append(_md(analysis.group_story(group, other, run_label="FastRL", base_label="GRPO", nominal=nominal)))
        parts.append(_figure(charts.group_bars(group, revision="report",
                                               skipped=analysis.group_fate(group, nominal)["skipped"] or 0), first))
        parts.append("<h3>FastRL's answers</h3>" + _table(analysis.rollout_table(group)))
        if len(other):
            parts.append("<h3>GRPO's answers to the same question at the same step</h3>"
                         + _table(analysis.rollout_table(other)))

    # 2. where the rollouts went
    parts.append("<h2 style='clear:both'>2 · Where the rollouts went</h2>")
    mine_steps = steps[steps["run_id"] == run_id]
    if all(savings.has_split(steps[steps["run_id"] == r]) for r in ids):
        totals = pd.DataFrame([{"run": f"{labels.loc[r, 'method']} · {r}",
                                **savings.split_totals(savings.rollout_split(steps[steps["run_id"] == r]))}
                               for r in ids])
        config = json.loads(by_id.loc[run_id, "config"]) if isinstance(by_id.loc[run_id, "config"], str) else {}
        passes = savings.passes_after_pruning(mine_steps, config)
        parts.append(_figure(charts.split_bars(totals, revision="report"), first))
        parts.append(_md(analysis.split_sentence(totals.iloc[0].to_dict(), passes)))
        if base_id:
            parts.append(_md(analysis.credit_sentence(
                "FastRL", "GRPO", savings.credited_saving(totals.iloc[0].to_dict(), totals.iloc[1].to_dict()))))
        parts.append(_table(totals))
        per_prompt = steps.assign(method=steps["run_id"].map(labels["method"]))
        parts.append(_figure(charts.metric_lines(per_prompt, x="step", y="rollouts_per_prompt", colour="method",
                                                 x_title="step", y_title="rollouts per prompt", revision="report",
                                                 colours=palette.method_colours(per_prompt["method"].unique())),
                             first))
        parts.append(f"<p class='caption'>{html.escape(analysis.pruning_saving(mine_steps, passes))}</p>")
    else:
        parts.append("<p>These runs' steps do not record the split of their rollouts (written before it was "
                     "added).</p>")
        caveats.append("No split of the rollouts: the store predates it.")

    # 3. speed and accuracy
    parts.append("<h2>3 · Speed and accuracy against GRPO</h2>")
    if not base_id:
        parts.append(f"<p>No figure here: {html.escape(why)}</p>")
        caveats.append("No speed or accuracy figure: " + why)
    else:
        parts.extend(_comparison(store_dir, runs, run_id, base_id, first, caveats))
    caveats.append("Merged duplicates are counted apart and credited to neither method: both merge them.")
    caveats.append("Seconds are the trainer's own clock (training only, evaluation excluded) on the machine that "
                   "trained the runs; another machine gives other seconds, the interleaving keeps the two runs' "
                   "comparable to each other.")
    parts.append("<h2>Caveats</h2><div class='caveats'><ul>"
                 + "".join(f"<li>{html.escape(c)}</li>" for c in caveats) + "</ul></div>")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>FastRL beside GRPO</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def _comparison(store_dir: Path, runs: pd.DataFrame, run_id: str, base_id: str, first: list[bool],
                caveats: list[str]) -> list[str]:
    """Section 3 from every interleaved (bench-named) run of the two methods: curves with bands and the figures."""
    labels = metrics.run_labels(runs)
    names = runs.set_index("run_id")["name"]
    labels = labels[[bool(metrics.BENCH_NAME.match(str(names[r]))) for r in labels["run_id"]]]
    method = labels.set_index("run_id").loc[run_id, "method"]
    base_method = labels.set_index("run_id").loc[base_id, "method"]
    chosen, left_out = metrics.one_run_per_seed(labels[labels["method"].isin([method, base_method])],
                                                runs.set_index("run_id")["started"])
    if len(left_out):
        caveats.append(left_out_sentence(left_out).strip())
    steps = store.read_steps(store_dir, chosen["run_id"].tolist())
    evals = store.read_evals(store_dir, chosen["run_id"].tolist())
    split = runs.set_index("run_id")["eval_split"]
    evals = evals[evals["split"] == evals["run_id"].map(split)]
    per_run = metrics.compare_runs(chosen, steps, evals)
    counts = evals.groupby("run_id").size().reindex(chosen["run_id"]).fillna(0).astype(int).tolist()
    averaged = analysis.averaged_evaluations(counts, metrics.WINDOW)
    if per_run.empty or 0 in averaged:
        caveats.append("No accuracy figure yet: the runs had no evaluation after the warm start.")
        return ["<p>No figure yet: each run needs an evaluation after its warm start first.</p>"]
    summary = metrics.summarise(per_run).set_index("method")
    ours, theirs = summary.loc[method], summary.loc[base_method]
    curves = pd.concat([metrics.eval_curve(steps[steps["run_id"] == r], evals[evals["run_id"] == r]).assign(
        run_id=r, method=m)
                        for r, m in zip(chosen["run_id"], chosen["method"])], ignore_index=True)
    bands = pd.concat([metrics.band(c).assign(method=m) for m, c in curves.groupby("method", sort=False)],
                      ignore_index=True)
    figures = {"Speed-up per step": metrics.interval(ours, "step_speedup").text(".2f", "×"),
               "Speed-up to the target accuracy": metrics.interval(ours, "target_speedup").text(".2f", "×")
               if int(ours["target_reached"]) else "not reached",
               "FastRL accuracy": percent(metrics.interval(ours, "final_accuracy")),
               "GRPO accuracy": percent(metrics.interval(theirs, "final_accuracy"))}
    seeds, base_seeds = len(ours["seeds"]), len(theirs["seeds"])
    if min(seeds, base_seeds) < 2:
        caveats.append("One seed: the figures have no interval, and one seed's difference can be noise.")
    running = any(str(runs.set_index("run_id").loc[r, "status"]) == "running" for r in chosen["run_id"])
    return [_figure(charts.band_lines(bands, x="wall_time", x_title="training seconds (evaluation excluded)",
                                      y_title="greedy test accuracy", revision="report"), first),
            "<div class='metrics'>" + "".join(f"<div class='metric'>{html.escape(k)}<b>{html.escape(v)}</b></div>"
                                              for k, v in figures.items()) + "</div>",
            "<p class='caption'>" + html.escape(comparison_caption(method, base_method, seeds, base_seeds, averaged,
                                                                   False, running)) + "</p>"]


def write_report(store_dir: Path, out: Path, run_id: str | None = None) -> Path:
    """`render` into `out` (folders made); returns the path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(store_dir, run_id), encoding="utf-8")
    return out
