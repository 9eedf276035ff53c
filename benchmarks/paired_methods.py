"""Paired by seed: method A minus method B in a `fastrl bench` report, and how much each run's pruning dropped.

    .venv/bin/python benchmarks/paired_methods.py docs/bench/paper-cost/sampled/results.json \
        fastrl_cost:fastrl fastrl_cost:adaptive_only [--other docs/bench/paper-sampled/sampled/results.json] \
        [--store /tmp/benchN]

For each pair A:B, per seed, A's final accuracy, gains at equal time and at equal rollouts (points; the latter absent
from reports written before it existed), training seconds and last evaluation minus B's, A − B head to head at equal
rollouts (`metrics.difference_at_equal`: on each other's curves, where the run that sampled fewer ends), then
mean ± 95 % Student-t interval over the seeds both have (`metrics.mean_ci`), after each method's mean final accuracy,
step speed-up (geometric mean of each run's ratio to the GRPO of its own bench, `metrics.ratio_ci`) and rollouts
sampled over those seeds. `--also` joins more reports' runs to the report's, so a pair spans several benches (the first
report holding a method and seed gives it). B is looked up in `--other` (another report) when given, else in the
report and `--also`. With `--store`, every finished run's share of nonzero-advantage
rollouts pruned beyond A = 0 and copies (reasons LOW_ADVANTAGE / REDUNDANT, copies of such rows included) and the
share of the |A| mass they carried (the pruning that loses signal; A = 0 and DUPLICATE are lossless), and with
row_cost the mean fitted ρ and the range of its 10-step means. With `--curves`, each method's accuracy at every
evaluation step (mean over seeds), its largest drop from a run's best to its last evaluation and its largest fall
between two evaluations, each with the run. With `--budget STORE`, per finished run and quarter of the run:
rollouts sampled and zero-variance groups per step (and their mean per method), and the share of full groups
(rollouts_per_prompt sampled) by how many rollouts were correct.
Printed figures: docs/bench/paper-cost/README.md, docs/bench/paper-long/README.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from fastrl_app import metrics
from fastrl_core import store

FIGURES = {"final_accuracy": 100.0, "gain_at_equal_time": 100.0, "gain_at_equal_rollouts": 100.0,
           "train_seconds": 1.0}  # key -> unit scale
LOSSY = ("LOW_ADVANTAGE", "REDUNDANT")


def runs_by_method_seed(paths: list[Path]) -> tuple[dict[tuple[str, int], dict], dict[str, list[dict]]]:
    """Runs by (method, seed) and evaluation curves by run id over several reports; the first report that holds a
    (method, seed) gives it (so a later report fills in seeds the earlier ones lack)."""
    runs: dict[tuple[str, int], dict] = {}
    curves: dict[str, list[dict]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for run in report["runs"]:
            if (run["method"], run["seed"]) not in runs:
                runs[run["method"], run["seed"]] = run
                curves[run["run_id"]] = report["curves"][run["run_id"]]
    return runs, curves


def curve_frame(points: list[dict]) -> pd.DataFrame:
    """A report's evaluation curve as a float frame for `metrics`: step, accuracy, and rollouts where the report
    has them (reports written before 2026-12-04 do not)."""
    return pd.DataFrame(points)[[c for c in ("step", "rollouts", "accuracy") if c in points[0]]].astype(float)


def paired(a: dict, b: dict, method_a: str, method_b: str, curves: dict[str, list[dict]]) -> None:
    seeds = sorted(seed for method, seed in a if method == method_a and (method_b, seed) in b)
    if not seeds:
        raise SystemExit(f"no seed has both {method_a!r} and {method_b!r}")
    for name, runs, method in (("A", a, method_a), ("B", b, method_b)):
        picked = [runs[method, s] for s in seeds]
        finals = metrics.mean_ci(run["final_accuracy"] for run in picked)
        speedup = metrics.ratio_ci(run.get("step_speedup") for run in picked)
        sampled = metrics.mean_ci(run.get("rollouts_sampled") for run in picked)
        print(f"{name} {method:18s} final accuracy over seeds {seeds}: {finals.text('.3f')}; step speed-up "
              f"against its bench's GRPO {speedup.text('.2f', '×')}; rollouts sampled {sampled.text(',.0f')}")
    for key, scale in FIGURES.items():
        diffs = [scale * (a[method_a, s][key] - b[method_b, s][key]) for s in seeds
                 if a[method_a, s].get(key) is not None and b[method_b, s].get(key) is not None]
        if not diffs:  # a report from before the figure existed
            continue
        print_differences(method_a, method_b, key, diffs)
    frames = [(curve_frame(curves[a[method_a, s]["run_id"]]), curve_frame(curves[b[method_b, s]["run_id"]]))
              for s in seeds]
    # each run's last point: final_accuracy (the mean of the last three) flatters a run whose last evaluations are
    # closer together (steps=200 with eval_every=16: 176, 192, 200) when the curves still rise
    print_differences(method_a, method_b, "last_evaluation", [
        100.0 * (metrics.final_accuracy(curve_a, window=1) - metrics.final_accuracy(curve_b, window=1))
        for curve_a, curve_b in frames])
    # A − B at equal rollouts on each other's curves (gain_at_equal_rollouts is each against GRPO's); NaN when the
    # shorter run's evaluations lie outside the other's rollouts
    direct = [100.0 * metrics.difference_at_equal(curve_a, curve_b, x="rollouts") for curve_a, curve_b in frames
              if "rollouts" in curve_a and "rollouts" in curve_b]
    direct = [d for d in direct if d == d]
    if direct:
        print_differences(method_a, method_b, "head_to_head_rollouts", direct)

def print_differences(method_a: str, method_b: str, key: str, diffs: list[float]) -> None:
    print(f"{method_a} − {method_b}  {key:22s} per seed {[round(d, 2) for d in diffs]}  "
          f"-> {metrics.mean_ci(diffs).text('+.2f')}")


def pruned_shares(store_dir: str) -> None:
    runs = store.read_runs(store_dir)
    for run_id in sorted(runs.loc[runs["status"] == "finished", "run_id"]):
        rollouts = store.read_rollouts(store_dir, run_id)
        nonzero = rollouts["advantage"].abs() > 1e-6
        # a merged copy is recorded as DUPLICATE; it shares its class's fate: its representative (the first row of
        # its step, prompt and text that is not a copy) holds the rule's reason
        originals = rollouts["reason"].where(rollouts["reason"] != "DUPLICATE")
        keys = [rollouts["step"], rollouts["prompt_id"], rollouts["completion"]]
        lossy = originals.groupby(keys, sort=False).transform("first").isin(LOSSY)
        mass = rollouts["advantage"].abs()
        steps = store.read_steps(store_dir, run_id)
        rho = steps["row_cost"].groupby(steps["step"] // 10).mean().dropna() if "row_cost" in steps else []
        fitted = f", rho {steps['row_cost'].mean():.4f} (10-step means {rho.min():.4f}-{rho.max():.4f})" \
            if len(rho) else ""
        print(f"{run_id:45s} pruned beyond A = 0 {lossy.sum() / nonzero.sum():6.1%} of nonzero rollouts, "
              f"{mass[lossy].sum() / mass.sum():6.1%} of |A| mass{fitted}")


def curves(runs: dict[tuple[str, int], dict], run_curves: dict[str, list[dict]]) -> None:
    """Per method: the mean curve; the run whose last evaluation is furthest below its best; the largest fall
    from one evaluation to the next in any of its runs."""
    by_method: dict[str, list[tuple[str, list[float]]]] = {}
    for (method, _), run in runs.items():
        by_method.setdefault(method, []).append((run["run_id"], [p["accuracy"] for p in run_curves[run["run_id"]]]))
    for method, method_curves in by_method.items():
        steps = [point["step"] for point in run_curves[method_curves[0][0]]]
        means = [sum(acc[i] for _, acc in method_curves) / len(method_curves) for i in range(len(steps))]
        run_id, acc = max(method_curves, key=lambda item: max(item[1]) - item[1][-1])
        best = max(range(len(acc)), key=acc.__getitem__)
        fall_run, fall_acc = max(method_curves, key=lambda item: max(x - y for x, y in zip(item[1], item[1][1:])))
        i = max(range(1, len(steps)), key=lambda k: fall_acc[k - 1] - fall_acc[k])
        print(f"{method:12s} steps {steps}\n{'':12s} mean  {[round(m, 3) for m in means]} ({len(method_curves)} "
              f"runs)\n{'':12s} largest best − last {100 * (acc[best] - acc[-1]):.1f} pts ({run_id}: {acc[best]:.3f} "
              f"at step {steps[best]} -> {acc[-1]:.3f}); largest fall between evaluations "
              f"{100 * (fall_acc[i - 1] - fall_acc[i]):.1f} pts ({fall_run}: {fall_acc[i - 1]:.3f} at step "
              f"{steps[i - 1]} -> {fall_acc[i]:.3f} at {steps[i]})")


def budget_history(store_dir: str) -> None:
    runs = store.read_runs(store_dir)
    finished = runs[runs["status"] == "finished"]
    method_of = metrics.run_labels(finished).set_index("run_id")["method"]
    by_method: dict[str, list[tuple[list[float], list[float]]]] = {}
    for run_id in sorted(finished["run_id"]):
        steps = store.read_steps(store_dir, run_id)
        quarter = steps["step"] * 4 // (steps["step"].max() + 1)
        sampled = steps["rollouts_sampled"].groupby(quarter).mean().round(1).tolist()
        zero = steps["zero_variance_groups"].groupby(quarter).mean().round(1).tolist()
        rollouts = store.read_rollouts(store_dir, run_id)
        groups = rollouts.groupby(["step", "prompt_id"])["accuracy_reward"].agg(["size", "sum"])
        full = groups[groups["size"] == groups["size"].max()]
        n, correct = int(groups["size"].max()), full["sum"].round().astype(int)
        shares = (correct.value_counts(normalize=True).sort_index() * 100).round(1)
        kind = correct.map(lambda c: "decided" if c in (0, n) else "one rare" if c in (1, n - 1) else "mixed")
        by_quarter = pd.crosstab(full.index.get_level_values("step") * 4 // (steps["step"].max() + 1), kind,
                                 normalize="index").mul(100).round(1)
        print(f"{run_id:45s} sampled/step by quarter {sampled}, zero-variance groups/step {zero}\n{'':45s} "
              f"{len(full)} full groups of {n}, % by correct count {shares.to_dict()}\n{'':45s} "
              f"% by quarter {by_quarter.to_dict(orient='list')}")
        by_method.setdefault(method_of[run_id], []).append((sampled, zero))
    for method, histories in by_method.items():
        mean = [[round(sum(q) / len(q), 2) for q in zip(*part)] for part in zip(*histories)]
        print(f"{method:45s} mean of {len(histories)} runs by quarter: sampled/step {mean[0]}, "
              f"zero-variance groups/step {mean[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, nargs="?", help="a bench results.json (needed for pairs, --curves)")
    parser.add_argument("pairs", nargs="*", help="A:B method pairs")
    parser.add_argument("--also", type=Path, action="append", default=[], metavar="REPORT",
                        help="another results.json whose runs join the report's (repeatable; the first report "
                             "holding a method and seed gives it): pairs over the seeds of several benches")
    parser.add_argument("--other", type=Path, help="results.json to look B up in (default: the report)")
    parser.add_argument("--store", help="also print each finished run's pruned shares from this store")
    parser.add_argument("--curves", action="store_true", help="also print each method's mean accuracy curve")
    parser.add_argument("--budget", help="also print each finished run's budget history from this store")
    args = parser.parse_args()
    if args.report is None and (args.pairs or args.curves or args.other or args.also):
        parser.error("pairs, --curves, --other and --also need a report (a bench results.json)")
    a, a_curves = runs_by_method_seed([args.report, *args.also]) if args.report else ({}, {})
    b, b_curves = runs_by_method_seed([args.other]) if args.other else (a, a_curves)
    for pair in args.pairs:
        method_a, _, method_b = pair.partition(":")
        paired(a, b, method_a, method_b, a_curves | b_curves)
    if args.store:
        pruned_shares(args.store)
    if args.curves:
        curves(a, a_curves)
    if args.budget:
        budget_history(args.budget)


if __name__ == "__main__":
    main()
