"""`fastrl bench`: every method under several seeds, interleaved step by step, with confidence intervals.

For each seed, one `Trainer` per method is built from the same config, seed, data order and warm start, and their
`train_step()`s are called round-robin in one process: a neighbouring job that slows the machine for a minute slows
every method alike instead of faking a difference. Each method is evaluated every `eval_every` steps outside the
timed region (as `fastrl train`), and each phase's process CPU seconds are stored beside its wall-clock seconds
(`cpu_<phase>` columns, see `PhaseTimer`). The figures (final accuracy, the paper's step speed-up, time-to-target
speed-up, area under the accuracy-time curve, time per step, rollouts, seconds per phase) and their 95 % intervals
over seeds come from `fastrl_app.metrics`, the module the dashboard's Runs page uses too.

Resuming: a (method, seed) whose run in `--store` is finished with the same config (run name
`bench-<method>-seed<seed>`) is not trained again; an unfinished one is trained again from scratch (its old run is
marked "stopped"), interleaved with the other unfinished methods of its seed, so an interrupted bench continues
where it stopped and every kept run was timed in one piece.

Repeatability: `--compare OTHER/results.json` prints this bench's per-step ratios (GRPO's seconds for the same
steps / the method's) beside those of another invocation, e.g. the same command with another `--store`, and
whether every one is within 10 % of the other.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fastrl_app import metrics
from fastrl_core.config import ConfigError
from fastrl_core.methods import METHODS  # name -> overrides, from fastrl_core/configs/methods.yaml
from fastrl_core.run_config import RunConfig, load_config
from fastrl_core.shipped import config_names
from fastrl_core.store.layout import SAMPLED_SUFFIX
from fastrl_core.store.schema import PHASES

# The paper's own figures for the methods it ran (docs/notes.md §6: Tables 2 and 5, Geometry3K, Qwen2.5-VL-7B, one
# run each):
# speed-up over GRPO's training time · OOD average accuracy. Its headline: 2.07x on average over both datasets.
PAPER_FIGURES = {
    "grpo": "1× · 51.32",
    "random": "1.60× · 51.59",
    "advantage_only": "2.35× · 52.09",
    "fastrl_paper": "2.14× · 52.63 (full method)",
    "fastrl_official": "2.14× · 52.63 (full method)",
    "adaptive_only": "1.15× · 51.91 (ARS alone)",
}
DEFAULT_METHODS = "grpo,dapo_filter,cppo,pods,fastrl_official,fastrl"
DEFAULT_CONFIG = "embedded"  # a shipped config
REPEAT_TOLERANCE = 0.10  # acceptance: two invocations' per-step ratios within 10 % of each other


def baseline_of(method: str) -> str:
    """Plain GRPO under the method's objective."""
    _, plus, objective = method.partition("+")
    return f"grpo+{objective}" if plus else "grpo"


def parse_seeds(text: str, what: str) -> list[int]:
    """`0,1,2` -> [0, 1, 2]; a bad list raises naming `what`."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"{what}: seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"{what}: expected distinct seeds >= 0, got {text!r}")
    return seeds


def plan(methods: list[str], seeds: list[int], seeds_for: dict[str, list[int]], baseline: str | None = None
         ) -> dict[str, list[int]]:
    """Seeds of each method (`seeds_for` overrides `seeds`); each method's baseline (`baseline`, else the plain GRPO
    of its objective) gets at least its methods' seeds (the speed-ups pair runs by seed) and is added when missing,
    and no other GRPO is trained. Ordered: baselines first, then as given."""
    unknown = [m for m in [*methods, *seeds_for, *([baseline] if baseline else [])] if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    base_of = {m: baseline or baseline_of(m) for m in methods}
    idle = sorted(set(seeds_for) - set(methods) - set(base_of.values()))
    if idle:
        raise ValueError(f"--seeds-for names {idle}, not among the methods {methods} or their baselines")
    chosen = {m: list(seeds_for.get(m, seeds)) for m in methods}
    for method, base in base_of.items():
        have = chosen.setdefault(base, list(seeds_for.get(base, seeds)))
        chosen[base] = sorted(set(have) | set(chosen[method]))
    bases = set(base_of.values())
    order = sorted(chosen, key=lambda m: (m not in bases, list(chosen).index(m)))
    return {m: chosen[m] for m in order}


def method_config(config_path: str | Path, method: str, seed: int, store: str, overrides: list[str]
                  ) -> RunConfig:
    """The method's config under `seed`; a config the loader rejects (e.g. a pruner that is not registered yet)
    raises ConfigError naming the method (the CLI's one line, exit 2)."""
    try:
        return load_config(config_path, [*overrides, *METHODS[method], f"seed={seed}", f"store_dir={store}",
                                         f"run_name={metrics.bench_run_name(method, seed)}"])
    except (ValueError, KeyError) as error:
        text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        raise ConfigError(f"method {method!r} ({' '.join(METHODS[method])}): {text}") from None


def comparable(config: dict) -> str:
    """A config as JSON without the store location: the key that says a stored run is this (method, seed)."""
    values = json.loads(json.dumps(config, default=str))
    values.pop("store_dir", None)
    return json.dumps(values, sort_keys=True)


def finished_runs(store: Path, configs: dict[tuple[str, int], RunConfig]) -> dict[tuple[str, int], str]:
    """(method, seed) -> run id of a finished run in the store with that run name and config (the newest; a key
    added since the run was recorded counts as the value it ran under, `resume.as_recorded`), and
    marks unfinished bench runs of those names "stopped" (they will be trained again from scratch)."""
    from fastrl_core.resume import as_recorded
    from fastrl_core.store import RunWriter, read_runs

    if not (store / "runs").exists():
        return {}
    runs = read_runs(store).sort_values("started")
    found = {}
    for key, config in configs.items():
        mine = runs[(runs["name"] == config.run_name)]
        wanted = comparable(config.options())
        same = mine.loc[[comparable(as_recorded(json.loads(c))) == wanted for c in mine["config"]]]
        done = same[same["status"] == "finished"]
        if len(done):
            found[key] = str(done["run_id"].iloc[-1])
        for run_id in same.loc[same["status"].isin(["running", "failed"]), "run_id"]:
            RunWriter.resume(store, run_id).finish("stopped")
    return found


def train_interleaved(configs: dict[str, RunConfig], log=print, *, progress: bool = False,
                      label: str | None = None) -> dict[str, str]:
    """Train one seed's methods round-robin with `run_loop.run_interleaved` (the loop of `Trainer.run`, one
    `train_step()` each in turn, the order rotated every round; `progress`/`label`: its one progress bar); returns
    method -> run id. Logs a line at each evaluation. Should a later run fail to start, the runs already started
    are marked stopped, so none stays "running". On Ctrl-C / SIGTERM the KeyboardInterrupt carries a note per run
    marked stopped: its id and the command that continues it."""
    from fastrl_core.resume import resume_command
    from fastrl_core.run_loop import run_interleaved
    from fastrl_core.trainer import Trainer

    def on_step(method: str, trainer: Trainer, row: dict, accuracy: float | None) -> None:
        if accuracy is not None:
            config = trainer.config
            log(f"  seed {config.seed} {method}: step {trainer.step}/{config.steps} "
                f"train {trainer.train_seconds:.1f} s, test accuracy {accuracy:.3f}")

    trainers: dict[str, Trainer] = {}
    try:
        for method, config in configs.items():
            trainers[method] = Trainer(config, progress=False)
    except BaseException as error:
        for trainer in trainers.values():
            trainer.writer.finish("stopped", f"another run of this seed failed to start: {error}")
        raise
    try:
        return run_interleaved(trainers, progress=progress, label=label, on_step=on_step)
    except KeyboardInterrupt as error:
        for method, trainer in trainers.items():
            if trainer.writer.meta.get("status") == "stopped":
                run_id = trainer.writer.run_id
                error.add_note(f"run {run_id} ({method}) is marked stopped; "
                               f"`{resume_command(trainer.config.store_dir, run_id)}` continues it")
        raise


# ----------------------------------------------------------------------------------------------- report
def collect(store: Path, run_ids: dict[tuple[str, int], str], split: str, baseline: str | None = None):
    """(per-run table, per-method summary, curves, steps rows) of the bench's runs, by `fastrl_app.metrics`, each
    run against `baseline` (a plain-GRPO method; None: its objective's GRPO)."""
    import pandas as pd

    from fastrl_core.store import read_evals, read_runs, read_steps

    ids = list(run_ids.values())
    runs = read_runs(store)
    labels = metrics.run_labels(runs[runs["run_id"].isin(ids)])
    order = {run_id: i for i, run_id in enumerate(ids)}
    labels = labels.sort_values("run_id", key=lambda s: s.map(order)).reset_index(drop=True)
    steps = read_steps(store, ids)
    evals = read_evals(store, ids)
    evals = evals[evals["split"] == split]
    per_run = metrics.compare_runs(labels, steps, evals, baseline=baseline)
    curves = pd.concat([metrics.eval_curve(steps[steps["run_id"] == r], evals[evals["run_id"] == r]).assign(run_id=r)
                        for r in ids], ignore_index=True)
    return per_run, metrics.summarise(per_run), curves, steps


def _fmt(value, spec: str = ".3f", suffix: str = "") -> str:
    return "—" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:{spec}}{suffix}"


def markdown_table(summary, per_run) -> str:
    """Every method's mean ± 95 % interval (ratios: geometric mean [interval])."""
    header = ("| method | overrides | seeds | final acc | step speed-up (wall) | step speed-up (CPU) | "
              "time-to-target speed-up | rollouts to target (× GRPO's) | reached target | AUC | s/step | CPU s/step | "
              "rollouts sampled | kept | " + " | ".join(f"{p} s/step" for p in PHASES) + " |")
    lines = [header, "|" + "---|" * (14 + len(PHASES))]
    for _, row in summary.iterrows():
        iv = lambda name: metrics.interval(row, name)  # noqa: E731
        lines.append(
            f"| {row['method']} | `{' '.join(METHODS.get(row['method'], []))}` | {len(row['seeds'])} | "
            f"{iv('final_accuracy').text('.3f')} | {iv('step_speedup').text('.2f', '×')} | "
            f"{iv('cpu_step_speedup').text('.2f', '×')} | {iv('target_speedup').text('.2f', '×')} | "
            f"{iv('target_rollout_share').text('.2f', '×')} | {row['target_reached']}/{len(row['seeds'])} | "
            f"{iv('auc').text('.3f')} | "
            f"{iv('seconds_per_step').text('.3f')} | {iv('cpu_per_step').text('.3f')} | "
            f"{iv('rollouts_sampled').text('.0f')} | {iv('kept_fraction').text('.2f')} | "
            + " | ".join(_fmt(row[f"time_{p}_mean"], ".3f") for p in PHASES) + " |")
    target = per_run["target_accuracy"].dropna().astype(float)
    horizon = per_run["horizon"].iloc[0] if len(per_run) else math.nan
    notes = [
        "",
        f"Mean ± {metrics.CONFIDENCE:.0%} Student-t interval over seeds; speed-ups are geometric means of the "
        "per-seed ratios against GRPO of the same seed, with the interval on their logs ([low, high]); "
        "`(n=1)`: one seed or pair, no interval.",
        f"Final acc: mean of the last {metrics.WINDOW} evaluations. Step speed-up: GRPO's training seconds / the "
        "method's for the same steps. Time-to-target: training seconds until the trailing mean of "
        f"{metrics.WINDOW} evaluations reaches acc0 + {metrics.TARGET_SHARE} × (the same seed's GRPO final − acc0)"
        + (f" = {target.min():.3f}–{target.max():.3f} (mean {target.mean():.3f})" if len(target) else "")
        + "; over seeds where both runs reached it (reached target: seeds of the method that did). Rollouts to "
        "target: rollouts sampled until then, over GRPO's (< 1: fewer samples). "
        f"AUC: mean accuracy over the first {_fmt(horizon, '.1f')} s of training (the shortest run).",
    ]
    return "\n".join(lines + notes)


def _points(row, name: str) -> str:
    """A paired accuracy difference in points (mean ± interval), or "baseline" on the baseline's own row."""
    if row["method"] == row["baseline_method"]:
        return "baseline"
    iv = metrics.interval(row, name)
    return metrics.Interval(iv.mean * 100, iv.low * 100, iv.high * 100, iv.n).text("+.1f")


def headline_table(summary) -> str:
    """The README's table: per method, accuracy, its paired gain over the same objective's GRPO at equal steps, at
    equal training seconds and at equal rollouts sampled, the two speed-ups, rollouts (in all and to the target),
    and the paper's own figure where it ran the method."""
    lines = ["| method | seeds | final acc | vs its GRPO, paired (pts) | at equal time (pts) | "
             "at equal rollouts (pts) | step speed-up | time-to-target speed-up (reached) | rollouts sampled | rollouts to target | kept | "
             "paper (speed-up · acc) |",
             "|" + "---|" * 12]
    sampled = dict(zip(summary["method"], summary["rollouts_sampled_mean"]))
    for _, row in summary.iterrows():
        iv = lambda name: metrics.interval(row, name)  # noqa: E731
        base = row["baseline_method"]
        share = row["rollouts_sampled_mean"] / sampled[base] - 1 if base in sampled and sampled[base] else math.nan
        lines.append(
            f"| {row['method']} | {len(row['seeds'])} | {iv('final_accuracy').text('.3f')} | "
            f"{_points(row, 'accuracy_gain')} | {_points(row, 'gain_at_equal_time')} | "
            f"{_points(row, 'gain_at_equal_rollouts')} | "
            f"{iv('step_speedup').text('.2f', '×')} | {iv('target_speedup').text('.2f', '×')} "
            f"({row['target_reached']}/{len(row['seeds'])}) | {row['rollouts_sampled_mean']:,.0f}"
            + (f" ({share:+.0%})" if math.isfinite(share) and row["method"] != base else "")
            + f" | {iv('target_rollout_share').text('.2f', '×')} | {row['kept_fraction_mean']:.0%} | "
            f"{PAPER_FIGURES.get(row['method'], '—')} |")
    return "\n".join(lines)


def cost_table(steps, per_run, baseline: str = "grpo") -> tuple[str, list[dict]]:
    """`metrics.phase_costs` over every step of the bench, the fixed share of a `baseline` step it implies and the
    step speed-ups it allows (`metrics.step_ceilings`)."""
    costs = metrics.phase_costs(steps)
    lines = ["| phase | scales with | fixed s/step | ms per rollout | r² | steps |", "|---|---|---|---|---|---|"]
    for _, c in costs.iterrows():
        lines.append(f"| {c['phase']} | {c['count'].replace('_', ' ')} | {_fmt(c['fixed'], '.3f')} | "
                     f"{_fmt(c['per_rollout'] * 1000, '.2f')} | {_fmt(c['r2'], '.2f')} | {c['steps']} |")
    base_steps = steps[steps["run_id"].isin(per_run.loc[per_run["method"] == baseline, "run_id"])]
    pass_lines = costs[costs["phase"] != "generate"]
    if len(base_steps) and pass_lines["fixed"].notna().all():
        text = []
        counts = {c: float(base_steps[c].mean()) for c in costs["count"]}  # the baseline's mean count per step
        if costs["fixed"].notna().all():
            fixed = costs["fixed"].sum()
            fitted = fixed + sum(c["per_rollout"] * counts[c["count"]] for _, c in costs.iterrows())
            mean_counts = ", ".join(f"{value:.0f} {c.removeprefix('rollouts_').replace('_', ' ')}"
                                    for c, value in counts.items())
            text.append(f"Least-squares lines over all {len(steps)} steps of every run. At `{baseline}`'s mean "
                        f"counts ({mean_counts} per step) the fixed parts are {fixed:.3f} s of the fitted "
                        f"{fitted:.3f} s of these three phases ({fixed / fitted:.0%}): no pruner or budget goes "
                        "below them on this model and machine.")
        step = per_run.loc[per_run["method"] == baseline, "seconds_per_step"].mean()
        sampled = counts["rollouts_sampled"]
        ceiling, left = metrics.step_ceilings(costs, step, counts)
        if math.isfinite(ceiling):
            text.append(f"Phase-line ceiling: against `{baseline}`'s mean step ({step:.3f} s), a pruner that kept "
                        f"no row at all would step {ceiling:.2f}× faster; a 2.5× step would also need "
                        + ("a generation line that rises with the rollouts sampled, which these steps do not give "
                           "(say, a sketch that only some methods pay for)." if not math.isfinite(left) else
                           f"sampling at most {left:.0f} of the {sampled:.0f} rollouts ({left / sampled - 1:+.0%})."
                           if left > 0 else "sampling none: out of reach on these lines."))
        if text:
            lines += ["", " ".join(text)]
    return "\n".join(lines), _records(costs)


def share_table(summary) -> str:
    """Where each method's step goes (`metrics.phase_shares` of its mean seconds per phase, wall-clock and CPU),
    beside the paper's Table 8 (`metrics.PAPER_STEP_SECONDS`), with the step speed-up if the log-prob and update
    passes cost nothing."""
    def cells(seconds: dict) -> list[float]:
        shares = metrics.phase_shares(seconds)
        return [shares[p] for p in (*metrics.SHARE_PHASES, "other")] + [shares["step"], shares["ceiling"]]

    lines = ["| step of | clock | generate | log-prob passes (old + reference) | update | other | s/step | "
             "ceiling: passes after generation free |", "|" + "---|" * 8]
    for method, seconds in metrics.PAPER_STEP_SECONDS.items():
        *shares, step, ceiling = cells(seconds)
        lines.append(f"| paper's {method} (Table 8: Qwen2.5-VL-7B, 4 GPUs) | wall | "
                     + " | ".join(_fmt(v * 100, ".0f", " %") for v in shares[:3]) + f" | — | {step:.0f} | "
                     f"{_fmt(ceiling, '.2f', '×')} |")
    for _, row in summary.iterrows():
        for clock, prefix in (("wall", "time"), ("CPU", "cpu")):
            *shares, step, ceiling = cells({p: row[f"{prefix}_{p}_mean"] for p in PHASES})
            lines.append(f"| {row['method']} | {clock} | " + " | ".join(_fmt(v * 100, ".0f", " %") for v in shares)
                         + f" | {_fmt(step, '.3f')} | {_fmt(ceiling, '.2f', '×')} |")
    return "\n".join(lines)


def plot(summary, curves, per_run, path: Path, accuracy_label: str = "greedy test accuracy") -> None:
    """Accuracy against training seconds (mean of the seeds with its 95 % band): the GRPO objective's methods on the
    left, the other objectives' in the middle; seconds per step by phase on the right. One colour per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summary["method"])
    others = [m for m, o in zip(methods, summary["objective"]) if o != "grpo"]
    fig, axes = plt.subplots(1, 3 if others else 2, figsize=(19 if others else 13, 5.6),
                             gridspec_kw={"width_ratios": [1.3, 1, 1] if others else [1.2, 1]})
    colours = dict(zip(methods, plt.get_cmap("tab20").colors * 2))
    panels = [(axes[0], [m for m in methods if m not in others], "GRPO objective")]
    if others:
        panels.append((axes[1], others, "DAPO / GSPO objectives"))
    for ax, chosen, title in panels:
        for method in chosen:
            ids = per_run.loc[per_run["method"] == method, "run_id"]
            band = metrics.band(curves[curves["run_id"].isin(ids)])
            if band.empty:
                continue
            ours = method.startswith("fastrl") and "official" not in method and "paper" not in method
            ax.plot(band["wall_time"], band["mean"], "-" if ours or method.startswith("grpo") else "--",
                    color=colours[method], lw=2.6 if ours else 1.3, label=f"{method} (n={int(band['n'].iloc[0])})")
            if band["low"].notna().any():
                ax.fill_between(band["wall_time"], band["low"], band["high"], color=colours[method],
                                alpha=0.18 if ours or method.startswith("grpo") else 0.06)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training seconds (evaluation excluded)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, ncol=2 if len(chosen) > 8 else 1, loc="lower right")
    axes[0].set_ylabel(f"{accuracy_label} (mean of seeds, 95 % band)")
    bars = axes[-1]
    bottom = [0.0] * len(summary)
    for phase in PHASES:
        values = [0.0 if not math.isfinite(v) else v for v in summary[f"time_{phase}_mean"]]
        bars.barh(summary["method"], values, left=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    cpu = summary["cpu_per_step_mean"]
    if cpu.notna().any():
        bars.scatter(cpu, summary["method"], marker="|", s=200, color="black", label="CPU s/step", zorder=3)
    bars.set_xlabel("seconds per step by phase (mean of seeds)")
    bars.invert_yaxis()
    bars.legend(fontsize=8, ncol=2, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _records(frame) -> list[dict]:
    return json.loads(frame.to_json(orient="records"))


def write_report(out: Path, per_run, summary, curves, steps, *, header: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    costs_text, costs = cost_table(steps, per_run, header.get("baseline", "grpo"))
    split = f"Accuracy: evaluation split `{header['split']}`.\n\n" if "split" in header else ""
    void = metrics.start_disagreements(per_run)
    warning = ("**Void comparison**: " + "; ".join(void) + ".\n\n") if void else ""
    table = (split + warning + headline_table(summary) + "\n\nEvery figure:\n\n" + markdown_table(summary, per_run)
             + "\n\nWhere a step's time goes (share of the mean step, by wall-clock and by CPU seconds), beside the "
             "paper's profile:\n\n" + share_table(summary)
             + "\n\nWhat each phase costs per step:\n\n" + costs_text)
    (out / "results.md").write_text(table + "\n")
    keep = [c for c in per_run.columns if c != "is_baseline"]
    payload = {**header, "confidence": metrics.CONFIDENCE, "window": metrics.WINDOW,
               "target_share": metrics.TARGET_SHARE, "runs": _records(per_run[keep]), "summary": _records(summary),
               "phase_costs": costs,
               "curves": {run_id: _records(c.drop(columns="run_id")) for run_id, c in curves.groupby("run_id")}}
    (out / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
    split = header.get("split", "test")
    label = (f"mean@k {split.removesuffix(SAMPLED_SUFFIX)}" if split.endswith(SAMPLED_SUFFIX)
             else f"greedy {split}")
    plot(summary, curves, per_run, out / "bench.png", accuracy_label=f"{label} accuracy")
    return table


def repeat_check(summary: list[dict], other: list[dict], tolerance: float = REPEAT_TOLERANCE) -> tuple[str, bool]:
    """Per-step ratios (wall and CPU) of two bench invocations side by side; ok when every method's wall ratio is
    within `tolerance` (relative) of the other's."""
    theirs = {row["method"]: row for row in other}
    lines = ["| method | step speed-up here | there | difference | CPU here | there | difference |",
             "|---|---|---|---|---|---|---|"]
    ok = True
    for row in summary:
        if row["method"] not in theirs or row["method"] == row.get("baseline_method"):
            continue
        cells = []
        for name in ("step_speedup_mean", "cpu_step_speedup_mean"):
            a, b = row.get(name), theirs[row["method"]].get(name)
            diff = abs(a / b - 1) if a and b else None
            if name == "step_speedup_mean":
                ok &= diff is not None and diff <= tolerance
            cells += [_fmt(a, ".3f", "×"), _fmt(b, ".3f", "×"), _fmt(diff, ".1%")]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    verdict = (f"repeat check: every per-step ratio within {tolerance:.0%} of the other run's" if ok else
               f"repeat check FAILED: a per-step ratio differs by more than {tolerance:.0%} (or is missing)")
    return "\n".join(lines + ["", verdict]), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastrl bench", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="training config shared by every run: a shipped "
                        f"config's name ({', '.join(config_names())}) or a YAML file")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of every method")
    parser.add_argument("--seeds-for", action="append", default=[], metavar="METHOD=SEEDS",
                        help="this method's own seeds, e.g. grpo=0,1,2,3,4 (repeatable)")
    parser.add_argument("--store", default="runs/bench", help="store of the runs (resumed: finished runs are kept)")
    parser.add_argument("--out", default=None, help="folder for results.md, results.json, bench.png "
                                                    "(default: <store>/report)")
    parser.add_argument("--split", default=None,
                        help="evaluation split the report reads (default: the config's test_split, greedy); with "
                             "eval_samples, '<test_split>-sampled' reports mean@k. Finished runs are not retrained, "
                             "so this re-reports a bench from its store")
    parser.add_argument("--compare", metavar="RESULTS_JSON", default=None,
                        help="another bench's results.json: print both per-step ratios and whether within 10 %%")
    parser.add_argument("--baseline", default=None, metavar="METHOD",
                        help="the plain-GRPO method every other is compared with, trained where missing (default: each "
                             "method's objective's GRPO, e.g. grpo); e.g. grpo_unmerged, GRPO as TRL runs it; finished "
                             "runs are re-read, so this re-reports a bench")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds, "--seeds")
        seeds_for = {}
        for item in args.seeds_for:
            method, sep, text = item.partition("=")
            if not sep:
                raise ValueError(f"--seeds-for: expected METHOD=SEEDS, got {item!r}")
            seeds_for[method.strip()] = parse_seeds(text, f"--seeds-for {method}")
        owned = [o for o in args.overrides if o.partition("=")[0] in ("seed", "store_dir", "run_name")]
        if owned:
            raise ValueError(f"override(s) {owned}: the bench sets seed (--seeds), store_dir (--store) and run_name")
        chosen = plan([m.strip() for m in args.methods.split(",") if m.strip()], seeds, seeds_for, args.baseline)
        configs = {(m, s): method_config(args.config, m, s, args.store, args.overrides)
                   for m, method_seeds in chosen.items() for s in method_seeds}  # load_config checks names
    except (ValueError, KeyError) as error:
        parser.error(str(error.args[0] if isinstance(error, KeyError) else error))

    store = Path(args.store)
    run_ids = finished_runs(store, configs)
    for seed in sorted({s for _, s in configs}):
        todo = {m: c for (m, s), c in configs.items() if s == seed and (m, s) not in run_ids}
        kept = [m for (m, s) in run_ids if s == seed]
        print(f"== seed {seed}: training {', '.join(todo) or 'nothing'}"
              + (f"; finished in the store: {', '.join(kept)}" if kept else ""), flush=True)
        if todo:
            for method, run_id in train_interleaved(todo, log=lambda line: print(line, flush=True)).items():
                run_ids[(method, seed)] = run_id
    run_ids = {key: run_ids[key] for key in configs}  # plan order

    test_split = next(iter(configs.values())).test_split
    split = args.split or test_split
    try:
        per_run, summary, curves, steps = collect(store, run_ids, split, args.baseline)
    except ValueError as error:
        raise SystemExit(f"fastrl bench: {error}") from None
    if summary.empty or per_run["final_accuracy"].isna().all():
        raise SystemExit(f"fastrl bench: no evaluations on split {split!r} in {store} (a sampled split needs "
                         "eval_samples >= 1)")
    out = Path(args.out) if args.out else store / ("report" if split == test_split else f"report-{split}")
    table = write_report(out, per_run, summary, curves, steps, header={
        "config": str(args.config), "overrides": args.overrides, "store": str(store), "split": split,
        "baseline": args.baseline or "grpo",
        "methods": {m: METHODS[m] for m in chosen}, "seeds": chosen})
    print("\n" + table + f"\n\nwrote {out}/results.md, results.json, bench.png")
    if args.compare:
        other = json.loads(Path(args.compare).read_text())["summary"]
        text, _ = repeat_check(_records(summary), other)
        print(f"\nper-step ratios vs {args.compare}:\n{text}")
    return 0
