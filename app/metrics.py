"""The bench's figures, defined once: `fastrl bench`, the README tables and the dashboard's Runs and Demo pages all
call these functions (pure: DataFrames and numbers in, DataFrames and numbers out; no I/O, no Streamlit).

Per run (one method under one seed), from its steps rows and evaluation rows:
  - curve: greedy test accuracy at each evaluation against training seconds (wall-clock, evaluation excluded: the
    trainer's `wall_time` after the steps before it) and process CPU seconds (cumulative `cpu_<phase>`);
  - final accuracy: mean of the last `WINDOW` (3) evaluations after the warm start;
  - train seconds for the run's steps, seconds per step (wall and CPU), seconds per step in each phase;
  - rollouts sampled and kept; the curve also against rollouts sampled before each evaluation;
  - time to target: training seconds at the first evaluation whose trailing mean of `WINDOW` evaluations (after
    the warm start's) reaches the target (None = never reached: kept in the table as such, not dropped);
  - area under the accuracy-time curve: mean accuracy over [0, horizon] seconds, the curve linear between
    evaluations; the horizon is common to every run compared (by default the shortest run's training time, so
    every curve is observed over all of it).

Against the baseline of its objective (plain GRPO: pruner `none`, budget `fixed`, same objective), paired by seed:
  - target, per seed (`seed_targets`) = acc0 + TARGET_SHARE * (that seed's GRPO final accuracy - acc0), acc0 =
    mean GRPO accuracy at step 0 (the warm start; identical across seeds, as the test split is fixed): every run is
    held to what GRPO reached under its own seed, and GRPO reaches its own target on every seed it gained on (a
    target from GRPO's mean gain is missed by GRPO itself on the seeds below the mean);
  - step speed-up (the paper's): GRPO's training seconds / the run's for the same number of steps (the steps both
    ran), also from CPU seconds;
  - time-to-target speed-up: GRPO's time to target / the run's, on seeds where both reached it;
  - accuracy gain: the run's final accuracy minus GRPO's of the same seed (paired, so seed-to-seed spread that
    hits both cancels);
  - gain at equal time: the mean, over the run's last `WINDOW` evaluations, of its accuracy minus GRPO's at the
    same training seconds (GRPO's curve linear between its evaluations; NaN where GRPO was not trained that
    long). A method that is cheaper per step but learns less per step scores 0 here, whatever its step speed-up;
  - the same against rollouts sampled instead of seconds (sample efficiency, whatever a rollout costs): gain at
    equal rollouts, and rollouts to target as a share of GRPO's (< 1: the target for fewer samples).

Over the steps of all runs of one bench (one model, one machine): `phase_costs` fits each phase's seconds per step
as fixed + per_rollout * count, the count being what the phase scales with (`COST_COUNTS`); the fixed part is what
no pruning or budget can remove. `phase_shares` gives a step's profile (generation, log-prob passes, update) to set
beside the paper's (`PAPER_STEP_SECONDS`, its Table 8).

Over seeds: means with a 95 % Student-t interval (`mean_ci`; scipy.stats.t). Speed-ups are ratios of paired runs,
so their interval is taken on the log ratio of each seed's pair (`ratio_ci`): the geometric mean
exp(mean(log r)) with exp(mean(log r) +- t * sd(log r) / sqrt(n)) -- a ratio's noise is multiplicative, the
interval never goes below zero, and inverting the ratio inverts the interval. With one seed (or one pair) the
interval is undefined (NaN), not zero.

The split of each step's rollouts and the saving credited to a method (`rollout_split`, `credited_saving`, ...) live
in `fastrl_app.savings`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from fastrl_core.store.schema import PHASES

WINDOW = 3  # evaluations in the final accuracy and in the trailing mean of time to target
TARGET_SHARE = 0.9  # of the same seed's GRPO gain over the warm start
CONFIDENCE = 0.95
BENCH_NAME = re.compile(r"^bench-(?P<method>.+)-seed(?P<seed>\d+)$")


def bench_run_name(method: str, seed: int) -> str:
    """The run name `fastrl bench` gives (method, seed); `run_labels` reads it back."""
    return f"bench-{method}-seed{seed}"


# ----------------------------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Interval:
    """A mean (or geometric mean, for ratios) with its confidence interval over `n` seeds (NaN when n < 2)."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self, prefix: str) -> dict:
        return {f"{prefix}_{key}": value for key, value in asdict(self).items()}

    def text(self, spec: str = ".3f", suffix: str = "") -> str:
        """`0.652 ± 0.021` (symmetric; a `+` in spec signs the mean only), `1.41× [1.32, 1.50]` (ratio), `—` when
        there is no value."""
        if self.n == 0 or not math.isfinite(self.mean):
            return "—"
        if not math.isfinite(self.low):
            return f"{self.mean:{spec}}{suffix} (n={self.n})"
        if math.isclose(self.high - self.mean, self.mean - self.low, rel_tol=1e-6, abs_tol=1e-12):
            return f"{self.mean:{spec}}{suffix} ± {self.high - self.mean:{spec.lstrip('+')}}"
        return f"{self.mean:{spec}}{suffix} [{self.low:{spec}}, {self.high:{spec}}]"


def _finite(values: Iterable) -> np.ndarray:
    array = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    return array[np.isfinite(array)]


def mean_ci(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Interval:
    """Mean of the finite values and its Student-t interval: mean +- t_{(1+c)/2, n-1} * s / sqrt(n)."""
    x = _finite(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n)


def ratio_ci(ratios: Iterable[float | None], confidence: float = CONFIDENCE) -> Interval:
    """Geometric mean of positive paired ratios with the Student-t interval of their logs, mapped back by exp."""
    x = _finite(ratios)
    if (x <= 0).any():
        raise ValueError(f"ratio_ci: ratios must be > 0, got {x[x <= 0].tolist()}")
    log = mean_ci(np.log(x), confidence)
    return Interval(*(math.exp(v) if math.isfinite(v) else math.nan for v in (log.mean, log.low, log.high)), log.n)


# ----------------------------------------------------------------------------------------------- one run
CURVE_COLUMNS = ["step", "wall_time", "cpu_time", "rollouts", "accuracy"]


def cpu_seconds(steps: pd.DataFrame) -> pd.Series:
    """CPU seconds of each steps row (sum of its cpu_<phase> columns); NaN for rows of stores without them."""
    columns = [f"cpu_{p}" for p in PHASES if f"cpu_{p}" in steps]
    if not columns:
        return pd.Series(np.nan, index=steps.index)
    return steps[columns].sum(axis=1, min_count=1)


def eval_curve(steps: pd.DataFrame, evals: pd.DataFrame) -> pd.DataFrame:
    """One run's evaluations: step, wall_time (training seconds before it), cpu_time, rollouts (sampled before
    it), accuracy, by step.

    An evaluation at step s follows steps 0..s-1: its seconds are the eval row's own wall_time when recorded,
    else the wall_time of steps row s-1 (0 at s = 0); cpu_time is the CPU seconds of steps rows 0..s-1 and
    rollouts their rollouts_sampled (NaN for steps rows without them).
    """
    steps = steps.sort_values("step")
    after = steps["step"].astype(int) + 1
    wall = dict(zip(after, steps["wall_time"].astype(float)))
    cpu = dict(zip(after, cpu_seconds(steps).cumsum(skipna=False).astype(float)))
    sampled = steps["rollouts_sampled"] if "rollouts_sampled" in steps else pd.Series(np.nan, steps.index)
    rollouts = dict(zip(after, sampled.astype(float).cumsum(skipna=False)))
    evals = evals.sort_values("step")
    step = evals["step"].astype(int).to_numpy()
    own = evals["wall_time"].astype(float).to_numpy() if "wall_time" in evals else np.full(len(evals), np.nan)
    looked_up = np.array([0.0 if s == 0 else wall.get(s, np.nan) for s in step])
    return pd.DataFrame({"step": step, "wall_time": np.where(np.isfinite(own), own, looked_up),
                         "cpu_time": [0.0 if s == 0 else cpu.get(s, np.nan) for s in step],
                         "rollouts": [0.0 if s == 0 else rollouts.get(s, np.nan) for s in step],
                         "accuracy": evals["accuracy"].astype(float).to_numpy()}, columns=CURVE_COLUMNS)


def trailing_mean(values: Sequence[float], window: int = WINDOW) -> np.ndarray:
    """Mean of the last `window` values at each position (fewer at the start)."""
    x = np.asarray(values, dtype=float)
    sums = np.concatenate([[0.0], np.cumsum(x)])
    ends = np.arange(1, len(x) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def final_accuracy(curve: pd.DataFrame, window: int = WINDOW) -> float:
    """Mean accuracy of the last `window` evaluations after step 0 (the warm start's only if there is no other)."""
    trained = curve[curve["step"] > 0]
    accuracy = (trained if len(trained) else curve)["accuracy"].to_numpy(dtype=float)
    return float(accuracy[-window:].mean()) if len(accuracy) else math.nan


def initial_accuracy(curve: pd.DataFrame) -> float:
    """Accuracy of the warm start (the step-0 evaluation), NaN when the run was not evaluated there."""
    first = curve[curve["step"] == 0]
    return float(first["accuracy"].iloc[0]) if len(first) else math.nan


def first_reach(x: Sequence[float], y: Sequence[float], target: float) -> float | None:
    """The first x (in order) at which y >= target, or None if never. NaN y never counts."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hits = np.flatnonzero(y >= target - 1e-12)
    return float(x[hits[0]]) if len(hits) else None


def time_to_target(curve: pd.DataFrame, target: float, *, x: str = "wall_time", window: int = WINDOW
                   ) -> float | None:
    """`x` (training seconds) at the first evaluation after step 0 whose trailing mean of up to `window`
    evaluations after step 0 reaches `target`; None when the run never does."""
    trained = curve[curve["step"] > 0]
    return first_reach(trained[x].to_numpy(), trailing_mean(trained["accuracy"], window), target)


def area_under_curve(curve: pd.DataFrame, horizon: float, *, x: str = "wall_time") -> float:
    """Mean accuracy over [0, horizon] seconds, the curve linear between evaluations and flat after the last;
    NaN when the run was not evaluated at 0 seconds or horizon <= 0."""
    t, y = curve[x].to_numpy(dtype=float), curve["accuracy"].to_numpy(dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if not len(t) or t[0] > 0 or not horizon > 0:
        return math.nan
    grid = np.concatenate([t[t < horizon], [horizon]])
    values = np.interp(grid, t, y)
    return float(np.sum((grid[1:] - grid[:-1]) * (values[1:] + values[:-1]) / 2) / horizon)


def run_figures(steps: pd.DataFrame, evals: pd.DataFrame) -> dict:
    """The figures of one run that need no baseline (see the module docstring)."""
    steps = steps.sort_values("step")
    curve = eval_curve(steps, evals)
    n = len(steps)
    cpu = cpu_seconds(steps)
    train = float(steps["wall_time"].iloc[-1]) if n else math.nan
    cpu_total = float(cpu.sum(min_count=n)) if n else math.nan
    sampled, kept = int(steps["rollouts_sampled"].sum()), int(steps["rollouts_kept"].sum())
    figures = {
        "steps": n, "train_seconds": train, "cpu_seconds": cpu_total,
        "seconds_per_step": train / n if n else math.nan, "cpu_per_step": cpu_total / n if n else math.nan,
        "initial_accuracy": initial_accuracy(curve), "final_accuracy": final_accuracy(curve),
        "best_accuracy": float(curve["accuracy"].max()) if len(curve) else math.nan,
        "rollouts_sampled": sampled, "rollouts_kept": kept, "kept_fraction": kept / sampled if sampled else math.nan,
    }
    for p in PHASES:  # seconds per step in each phase
        for kind in ("time", "cpu"):
            column = f"{kind}_{p}"
            figures[column] = float(steps[column].mean()) if column in steps and steps[column].notna().any() \
                else math.nan
    return figures


def seconds_for_steps(steps: pd.DataFrame, n: int, *, cpu: bool = False) -> float:
    """Training seconds (wall, or CPU) of the run's first `n` steps."""
    steps = steps.sort_values("step").iloc[:n]
    if len(steps) < n or n == 0:
        return math.nan
    return float(cpu_seconds(steps).sum(min_count=n)) if cpu else float(steps["wall_time"].iloc[-1])


# ----------------------------------------------------------------------------------------------- the comparison
def run_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """Method and seed of each run of a store (read_runs rows): bench runs by their name (`bench_run_name`),
    others from pruner and budget (`grpo` for none + fixed, `cppo` for cppo + fixed, `fastrl·adaptive`; then
    `+objective` when not grpo) and the seed in their config. Columns: run_id, method, seed, objective,
    is_baseline (plain GRPO: pruner none, budget fixed)."""
    rows = []
    for run in runs.itertuples(index=False):
        config = json.loads(run.config) if isinstance(run.config, str) and run.config else {}
        match = BENCH_NAME.match(str(run.name))
        if match:
            method, seed = match["method"], int(match["seed"])
        else:
            base = "grpo" if (run.pruner, run.budget) == ("none", "fixed") else (
                run.pruner if run.budget == "fixed" else f"{run.pruner}·{run.budget}")
            method = base + ("" if run.objective == "grpo" else f"+{run.objective}")
            seed = int(config.get("seed", 0))
        rows.append({"run_id": run.run_id, "method": method, "seed": seed, "objective": run.objective,
                     "is_baseline": run.pruner == "none" and run.budget == "fixed"})
    return pd.DataFrame(rows, columns=["run_id", "method", "seed", "objective", "is_baseline"])


def one_run_per_seed(labels: pd.DataFrame, started: pd.Series) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows of `labels` (run_labels) keeping one run per method and seed, the newest by `started` (run_id ->
    start time); the rows left out, with `counted`: the run counted in their place). A seed counts once in a
    method's mean, interval and band however many runs it has (the demo run twice into one store): runs of one seed
    are not independent draws."""
    newest = labels.assign(started=labels["run_id"].map(started)).sort_values("started", kind="stable")
    newest = newest.drop_duplicates(["method", "seed"], keep="last")
    kept = labels[labels["run_id"].isin(newest["run_id"])]
    counted = newest.set_index(["method", "seed"])["run_id"]
    left_out = labels[~labels["run_id"].isin(newest["run_id"])]
    left_out = left_out.assign(counted=[counted[(m, s)] for m, s in zip(left_out["method"], left_out["seed"])])
    return kept, left_out


def start_disagreements(per_run: pd.DataFrame, tolerance: float = 1e-9) -> list[str]:
    """One line per seed whose runs start from different accuracies. Every method of a seed starts from the same
    policy and evaluates with the same random numbers (`Trainer.evaluate`), so their step-0 accuracies must be
    equal: a difference means some run did not evaluate the policy it trained (an engine serving other weights),
    and its comparison is void. per_run: `compare_runs` rows (seed, method, initial_accuracy)."""
    lines = []
    for seed, group in per_run.groupby("seed", sort=True):
        starts = group.dropna(subset=["initial_accuracy"])
        if len(starts) and float(starts["initial_accuracy"].max() - starts["initial_accuracy"].min()) > tolerance:
            each = ", ".join(f"{m} {a:.4f}" for m, a in zip(starts["method"], starts["initial_accuracy"]))
            lines.append(f"seed {seed}: the runs start from different accuracies ({each}): not the same policy")
    return lines


def common_horizon(curves: dict[str, pd.DataFrame]) -> float:
    """The shortest run's training seconds at its last evaluation: every curve is observed up to it."""
    ends = [float(c["wall_time"].max()) for c in curves.values() if len(c)]
    return min(ends) if ends else math.nan


def seed_targets(base: pd.DataFrame) -> dict[int, float]:
    """{seed: target accuracy} from the baseline's runs (index seed; initial_accuracy, final_accuracy columns):
    acc0 + TARGET_SHARE * (the seed's final - acc0), acc0 their mean step-0 accuracy. NaN where a figure is."""
    acc0 = float(np.nanmean(base["initial_accuracy"])) if base["initial_accuracy"].notna().any() else math.nan
    return {seed: acc0 + TARGET_SHARE * (float(final) - acc0) for seed, final in base["final_accuracy"].items()}


def compare_runs(labels: pd.DataFrame, steps: pd.DataFrame, evals: pd.DataFrame, *,
                 horizon: float | None = None, baseline: str | None = None) -> pd.DataFrame:
    """Per-run figures with the baseline comparison: one row per run of `labels` (run_labels columns) with
    run_figures, baseline_method, target_accuracy, time_to_target, target_speedup, rollouts_to_target,
    target_rollout_share (its rollouts to target / the baseline's), step_speedup, cpu_step_speedup,
    accuracy_gain (final accuracy minus the same seed's baseline's), gain_at_equal_time, gain_at_equal_rollouts,
    auc and horizon. `steps` / `evals`: read_steps / read_evals rows of those runs. `baseline`: the plain-GRPO
    method every run is compared with (e.g. `grpo_unmerged`, GRPO as TRL runs it: its target, its seeds); None:
    each objective's own GRPO (`grpo`, else the first plain-GRPO method by name)."""
    by_run = {run_id: (s, evals[evals["run_id"] == run_id]) for run_id, s in steps.groupby("run_id", sort=False)}
    empty_steps, empty_evals = steps.iloc[:0], evals.iloc[:0]
    data = {run_id: by_run.get(run_id, (empty_steps, empty_evals)) for run_id in labels["run_id"]}
    curves = {run_id: eval_curve(s, e) for run_id, (s, e) in data.items()}
    horizon = common_horizon(curves) if horizon is None else horizon
    rows = []
    for label in labels.to_dict("records"):
        rows.append({**label, **run_figures(*data[label["run_id"]]),
                     "auc": area_under_curve(curves[label["run_id"]], horizon), "horizon": horizon})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    baselines = table[table["is_baseline"]]
    for column in ("baseline_method", "target_accuracy", "time_to_target", "target_speedup", "rollouts_to_target",
                   "target_rollout_share", "step_speedup", "cpu_step_speedup", "accuracy_gain", "gain_at_equal_time",
                   "gain_at_equal_rollouts"):
        table[column] = None
    for objective, group in table.groupby("objective", sort=False):
        base = baselines[baselines["objective"] == objective]
        if base.empty:
            continue
        if baseline is not None:
            if baseline not in set(base["method"]):
                raise ValueError(f"baseline {baseline!r}: no plain-GRPO run of that method for objective "
                                 f"{objective!r} (plain GRPO here: {sorted(base['method'].unique())})")
            base_method = baseline
        else:
            base_method = sorted(base["method"].unique(),
                                 key=lambda m: (m != "grpo" and not m.startswith("grpo"), m))[0]
        base = base[base["method"] == base_method]
        base_by_seed = base.drop_duplicates("seed", keep="last").set_index("seed")
        targets = seed_targets(base_by_seed)
        for index, row in group.iterrows():
            target = targets.get(row["seed"], math.nan)
            table.at[index, "baseline_method"] = base_method
            table.at[index, "target_accuracy"] = target if math.isfinite(target) else None
            for name, x in (("time_to_target", "wall_time"), ("rollouts_to_target", "rollouts")):
                table.at[index, name] = time_to_target(curves[row["run_id"]], target, x=x) \
                    if math.isfinite(target) else None
        for index, row in group.iterrows():
            if row["seed"] not in base_by_seed.index:
                continue
            paired = base_by_seed.loc[row["seed"]]
            n = int(min(row["steps"], paired["steps"]))
            mine, theirs = data[row["run_id"]][0], data[paired["run_id"]][0]
            table.at[index, "step_speedup"] = _ratio(seconds_for_steps(theirs, n), seconds_for_steps(mine, n))
            table.at[index, "cpu_step_speedup"] = _ratio(seconds_for_steps(theirs, n, cpu=True),
                                                         seconds_for_steps(mine, n, cpu=True))
            table.at[index, "accuracy_gain"] = row["final_accuracy"] - paired["final_accuracy"]
            for name, x in (("gain_at_equal_time", "wall_time"), ("gain_at_equal_rollouts", "rollouts")):
                table.at[index, name] = gain_at_equal(curves[row["run_id"]], curves[paired["run_id"]], x=x)
            base_row = table.loc[table["run_id"] == paired["run_id"]].iloc[0]
            table.at[index, "target_speedup"] = _ratio(base_row["time_to_target"], table.at[index, "time_to_target"])
            table.at[index, "target_rollout_share"] = _ratio(table.at[index, "rollouts_to_target"],
                                                             base_row["rollouts_to_target"])
    return table


def gain_at_equal(curve: pd.DataFrame, baseline: pd.DataFrame, *, x: str = "wall_time", window: int = WINDOW
                  ) -> float:
    """Mean over `curve`'s last `window` evaluations after step 0 of accuracy − `baseline`'s accuracy at the same
    `x` (training seconds, or rollouts sampled; linear between its evaluations); NaN when any of those points
    lies outside the baseline's."""
    trained = curve[curve["step"] > 0].tail(window)
    t, y = baseline[x].to_numpy(dtype=float), baseline["accuracy"].to_numpy(dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    at = trained[x].to_numpy(dtype=float)
    if not len(at) or not len(t) or not np.all((at >= t[0]) & (at <= t[-1])):
        return math.nan
    return float(np.mean(trained["accuracy"].to_numpy(dtype=float) - np.interp(at, t, y)))


def difference_at_equal(curve_a: pd.DataFrame, curve_b: pd.DataFrame, *, x: str = "rollouts", window: int = WINDOW
                        ) -> float:
    """A − B at equal `x`, read where both runs have data: `gain_at_equal` of the run that reached less `x` (its
    last `window` evaluations) against the other's curve, signed as A − B. Comparing two methods through their
    gains over GRPO instead reads GRPO's curve at two different `x` when A and B end at different counts."""
    if curve_a[x].max() <= curve_b[x].max():
        return gain_at_equal(curve_a, curve_b, x=x, window=window)
    return -gain_at_equal(curve_b, curve_a, x=x, window=window)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or not (numerator > 0 and denominator > 0):
        return None
    return float(numerator) / float(denominator)


SUMMARY_MEANS = ["final_accuracy", "accuracy_gain", "gain_at_equal_time", "gain_at_equal_rollouts", "auc",
                 "seconds_per_step", "cpu_per_step", "rollouts_sampled", "rollouts_kept", "kept_fraction",
                 *[f"{kind}_{p}" for p in PHASES for kind in ("time", "cpu")]]
SUMMARY_RATIOS = ["step_speedup", "cpu_step_speedup", "target_speedup", "target_rollout_share"]


def summarise(per_run: pd.DataFrame, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per method (in first-seen order): seeds, and for each figure <name>_mean/_low/_high/_n (mean_ci for
    SUMMARY_MEANS, ratio_ci over paired seeds for SUMMARY_RATIOS), target_reached (seeds whose run reached the
    target) and target_accuracy (the mean of its seeds' targets)."""
    rows = []
    for method, group in per_run.groupby("method", sort=False):
        row = {"method": method, "objective": group["objective"].iloc[0],
               "baseline_method": group["baseline_method"].iloc[0], "seeds": sorted(group["seed"].tolist()),
               "target_accuracy": float(pd.to_numeric(group["target_accuracy"]).mean()),
               "target_reached": int(group["time_to_target"].notna().sum())}
        for name in SUMMARY_MEANS:
            row.update(mean_ci(group[name], confidence).as_dict(name))
        for name in SUMMARY_RATIOS:
            row.update(ratio_ci(group[name], confidence).as_dict(name))
        row.update(mean_ci(group["time_to_target"], confidence).as_dict("time_to_target"))
        rows.append(row)
    return pd.DataFrame(rows)


def interval(summary_row: pd.Series | dict, name: str) -> Interval:
    """The Interval of figure `name` in a summarise() row."""
    return Interval(*(summary_row[f"{name}_{key}"] for key in ("mean", "low", "high")), int(summary_row[f"{name}_n"]))


def band(curves: pd.DataFrame, *, x: str = "wall_time", points: int = 50, confidence: float = CONFIDENCE
         ) -> pd.DataFrame:
    """Mean accuracy curve of several runs (the seeds of one method) with its Student-t band: each run's curve
    linear between evaluations on a common grid of `points` from 0 to the shortest run's last x. `curves`:
    eval_curve rows with a run_id column. Columns: x, mean, low, high, n."""
    runs = [c.sort_values(x) for _, c in curves.groupby("run_id", sort=False)]
    runs = [c[np.isfinite(c[x]) & np.isfinite(c["accuracy"])] for c in runs]
    runs = [c for c in runs if len(c)]
    if not runs:
        return pd.DataFrame(columns=[x, "mean", "low", "high", "n"])
    end = min(float(c[x].max()) for c in runs)
    start = max(float(c[x].min()) for c in runs)
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    values = np.stack([np.interp(grid, c[x].to_numpy(float), c["accuracy"].to_numpy(float)) for c in runs])
    intervals = [mean_ci(values[:, i], confidence) for i in range(len(grid))]
    return pd.DataFrame({x: grid, "mean": [i.mean for i in intervals], "low": [i.low for i in intervals],
                         "high": [i.high for i in intervals], "n": len(runs)})


COST_COUNTS = {"generate": "rollouts_sampled", "logprob": "rollouts_kept", "update": "update_rows"}
COUNT_BEFORE = {"update_rows": "rollouts_kept"}  # stores written before a step recorded its update rows


def cost_count(steps: pd.DataFrame, phase: str) -> str:
    """The column `phase`'s seconds scale with in `steps`: `COST_COUNTS[phase]`, or, where a store did not record
    it, the count it stood in for then (`COUNT_BEFORE`)."""
    count = COST_COUNTS[phase]
    if (count not in steps or steps[count].isna().all()) and count in COUNT_BEFORE:
        return COUNT_BEFORE[count]
    return count


def phase_costs(steps: pd.DataFrame) -> pd.DataFrame:
    """Least-squares `time_<phase> = fixed + per_rollout * <count>` over the given steps rows (pooled over runs that
    share a model and machine), for each phase of `COST_COUNTS`: generation scales with the rollouts sampled, the
    scoring passes with the rows kept (once per distinct answer), the update with the rows it runs (a merged row
    once per mini-batch that holds a copy of it: more than the rows kept under the exact merge; `cost_count`).
    `fixed` is the part of a step no pruning or budget removes (per-call and per-token latency, the optimiser's
    steps). Returns one row per phase: phase, count, fixed, per_rollout (seconds), r2 (NaN when the count never
    varies or there are < 3 steps), steps."""
    rows = []
    for phase in COST_COUNTS:
        count = cost_count(steps, phase)
        x = steps[count].to_numpy(float) if count in steps else np.array([])
        y = steps[f"time_{phase}"].to_numpy(float) if f"time_{phase}" in steps else np.array([])
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        fixed = per_rollout = r2 = math.nan
        if len(x) >= 3 and np.ptp(x) > 0:
            per_rollout, fixed = np.polyfit(x, y, 1)
            residual = y - (fixed + per_rollout * x)
            r2 = 1.0 - residual.var() / y.var() if y.var() > 0 else math.nan
        rows.append({"phase": phase, "count": count, "fixed": float(fixed), "per_rollout": float(per_rollout),
                     "r2": float(r2), "steps": int(len(x))})
    return pd.DataFrame(rows)


def step_ceilings(costs: pd.DataFrame, step_seconds: float, counts: dict[str, float],
                  target: float = 2.5) -> tuple[float, float]:
    """What the `phase_costs` lines allow against a baseline step of `step_seconds` whose mean counts per step are
    `counts` (each phase's `count` column name -> its value, e.g. GRPO's rollouts sampled, kept and update rows):
    (the step speed-up if no row were kept at all, every log-prob and update row's seconds gone and generation
    unchanged; the rollouts per step left to sample when no row is kept and the step is `target`× faster, negative
    where even sampling none would not get there). The first needs only the log-prob and update lines; the second
    also a generation line that rises with the rollouts sampled (on vLLM with a sketch only some methods pay for,
    it may not). NaN where a line it needs is missing."""
    lines = costs.set_index("phase")
    passes = sum(float(lines.at[phase, "per_rollout"]) * counts[lines.at[phase, "count"]]
                 for phase in ("logprob", "update"))
    per_sampled = float(lines.at["generate", "per_rollout"])
    nothing_kept = step_seconds - passes
    if not (math.isfinite(nothing_kept) and nothing_kept > 0):
        return math.nan, math.nan
    left = counts[lines.at["generate", "count"]] - (nothing_kept - step_seconds / target) / per_sampled \
        if math.isfinite(per_sampled) and per_sampled > 0 else math.nan
    return step_seconds / nothing_kept, left


# The paper's Table 8 (Geometry3K, Qwen2.5-VL-7B on 4 GPUs; docs/notes.md §6): seconds of one training step per phase,
# its old log-prob (55 / 21 s) and reference (70 / 27 s) passes summed as the trainer's one `logprob` phase. The table
# gives only these phases. Every report that sets our step profile beside the paper's reads them from here.
PAPER_STEP_SECONDS = {"grpo": {"generate": 87.0, "logprob": 55.0 + 70.0, "update": 319.0},
                      "fastrl": {"generate": 80.0, "logprob": 21.0 + 27.0, "update": 121.0}}
SHARE_PHASES = ("generate", "logprob", "update")  # a step's parts in `phase_shares`; the other PHASES are "other"


def phase_shares(seconds: dict[str, float]) -> dict[str, float]:
    """A step's profile from its seconds per phase (`PHASES` names; absent or NaN = 0): each of `SHARE_PHASES`'
    share of the step and "other" (the remaining phases), "step" (the seconds in all), and "ceiling", the step
    speed-up if the passes after generation (log-prob and update) cost nothing: step / (step − logprob − update)."""
    value = {p: float(seconds.get(p, 0.0)) for p in PHASES}
    value = {p: v if math.isfinite(v) else 0.0 for p, v in value.items()}
    step = sum(value.values())
    if not step > 0:
        return {**dict.fromkeys([*SHARE_PHASES, "other"], math.nan), "step": step, "ceiling": math.nan}
    shares = {p: value[p] / step for p in SHARE_PHASES}
    rest = step - value["logprob"] - value["update"]
    return {**shares, "other": 1.0 - sum(shares.values()), "step": step,
            "ceiling": step / rest if rest > 0 else math.inf}

