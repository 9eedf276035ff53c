"""Paired by seed: method A minus method B in a `fastrl bench` report, and how much each run's pruning dropped.

    .venv/bin/python benchmarks/paired_methods.py docs/bench/paper-cost/sampled/results.json \
        fastrl_cost:fastrl fastrl_cost:adaptive_only [--other docs/bench/paper-sampled/sampled/results.json] \
        [--store /tmp/benchN]

For each pair A:B, per seed, A's final accuracy, gain at equal time (points) and training seconds minus B's, then
mean ± 95 % Student-t interval over the seeds both have (`metrics.mean_ci`). B is looked up in `--other` (another
report) when given, else in the same one. With `--store`, every finished run's share of nonzero-advantage
rollouts pruned beyond A = 0 and copies (reasons LOW_ADVANTAGE / REDUNDANT, copies of such rows included) and the
share of the |A| mass they carried (the pruning that loses signal; A = 0 and DUPLICATE are lossless), and with
row_cost the mean fitted ρ and the range of its 10-step means.
Printed figures: docs/bench/paper-cost/README.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastrl_core import metrics, store

FIGURES = {"final_accuracy": 100.0, "gain_at_equal_time": 100.0, "train_seconds": 1.0}  # key -> unit scale
LOSSY = ("LOW_ADVANTAGE", "REDUNDANT")


def runs_by_method_seed(path: Path) -> dict[tuple[str, int], dict]:
    return {(run["method"], run["seed"]): run for run in json.loads(path.read_text())["runs"]}


def paired(a: dict, b: dict, method_a: str, method_b: str) -> None:
    seeds = sorted(seed for method, seed in a if method == method_a and (method_b, seed) in b)
    if not seeds:
        raise SystemExit(f"no seed has both {method_a!r} and {method_b!r}")
    for key, scale in FIGURES.items():
        diffs = [scale * (a[method_a, s][key] - b[method_b, s][key]) for s in seeds
                 if a[method_a, s][key] is not None and b[method_b, s][key] is not None]
        print(f"{method_a} − {method_b}  {key:18s} per seed {[round(d, 2) for d in diffs]}  "
              f"-> {metrics.mean_ci(diffs).text('+.2f')}")


def pruned_shares(store_dir: str) -> None:
    runs = store.read_runs(store_dir)
    for run_id in sorted(runs.loc[runs["status"] == "finished", "run_id"]):
        rollouts = store.read_rollouts(store_dir, run_id)
        nonzero = rollouts["advantage"].abs() > 1e-6
        lossy = rollouts["reason"].isin(LOSSY)
        mass = rollouts["advantage"].abs()
        steps = store.read_steps(store_dir, run_id)
        rho = steps["row_cost"].groupby(steps["step"] // 10).mean().dropna() if "row_cost" in steps else []
        fitted = f", rho {steps['row_cost'].mean():.4f} (10-step means {rho.min():.4f}-{rho.max():.4f})" \
            if len(rho) else ""
        print(f"{run_id:45s} pruned beyond A = 0 {lossy.sum() / nonzero.sum():6.1%} of nonzero rollouts, "
              f"{mass[lossy].sum() / mass.sum():6.1%} of |A| mass{fitted}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a bench results.json")
    parser.add_argument("pairs", nargs="*", help="A:B method pairs")
    parser.add_argument("--other", type=Path, help="results.json to look B up in (default: the report)")
    parser.add_argument("--store", help="also print each finished run's pruned shares from this store")
    args = parser.parse_args()
    a = runs_by_method_seed(args.report)
    b = runs_by_method_seed(args.other) if args.other else a
    for pair in args.pairs:
        method_a, _, method_b = pair.partition(":")
        paired(a, b, method_a, method_b)
    if args.store:
        pruned_shares(args.store)


if __name__ == "__main__":
    main()
