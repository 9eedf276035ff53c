"""Pool the runs of several `fastrl bench` outputs (results.json) of one config and disjoint seeds, e.g. a bench
extended by more seeds in a later session, and compare each method with a baseline method, by
`fastrl_app.metrics`' definitions (target, time to target, final accuracy, intervals over seeds).

    .venv/bin/python benchmarks/pool_results.py A/results.json B/results.json --baseline grpo_unmerged --baseline grpo

Each results.json keeps every run's evaluation curve (training seconds, rollouts, accuracy) and its figures, which is
all this needs: the store that wrote it may be gone. Per baseline it prints one Markdown table: each seed's target
(`metrics.seed_targets`: acc0 + TARGET_SHARE × the baseline's gain over the warm start on that seed, acc0 its mean
step-0 accuracy over the pooled seeds), each method's time to it (training seconds until the trailing mean of
WINDOW evaluations reaches it) and how many of its seeds paired with the baseline got there, the paired speed-up
to it over seeds where both runs got there, the step speed-up (the baseline's training seconds over the method's,
same steps), the final accuracy and its paired difference, each with its 95 % interval. Refuses files of
different configs or overrides, a seed that appears twice, and names any seed whose runs start from different
accuracies (`metrics.start_disagreements`: then that seed's comparison is void).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from fastrl_app import metrics


def load(paths: list[Path]) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], str]:
    """(one row per run: run_id, method, seed, steps, train_seconds, initial/final accuracy; curves by run id;
    the config)."""
    runs, curves, regimes = [], {}, set()
    for path in paths:
        results = json.loads(path.read_text())
        regimes.add((results["config"], tuple(results.get("overrides") or ()), results.get("split")))
        for run in results["runs"]:
            curve = pd.DataFrame(results["curves"][run["run_id"]], columns=metrics.CURVE_COLUMNS)
            curves[run["run_id"]] = curve
            runs.append({"run_id": run["run_id"], "method": run["method"], "seed": int(run["seed"]),
                         "steps": int(run["steps"]), "train_seconds": float(run["train_seconds"]),
                         "initial_accuracy": metrics.initial_accuracy(curve),
                         "final_accuracy": metrics.final_accuracy(curve), "source": str(path)})
    if len(regimes) != 1:
        raise SystemExit(f"pool_results: the files ran different regimes (config, overrides, split): {sorted(regimes)}")
    table = pd.DataFrame(runs)
    twice = table[table.duplicated(["method", "seed"], keep=False)]
    if len(twice):
        raise SystemExit("pool_results: a method and seed appear in more than one run: "
                         + ", ".join(f"{m} seed {s}" for m, s in sorted(set(zip(twice["method"], twice["seed"])))))
    return table, curves, regimes.pop()[0]


def compare(table: pd.DataFrame, curves: dict[str, pd.DataFrame], baseline: str) -> tuple[float, pd.DataFrame]:
    """(the mean of the seeds' targets, one row per method): the figures against `baseline`, paired by seed."""
    base = table[table["method"] == baseline].set_index("seed")
    if base.empty:
        raise SystemExit(f"pool_results: no run of the baseline {baseline!r}")
    targets = metrics.seed_targets(base)
    seed_of = dict(zip(table["run_id"], table["seed"]))
    reach = {run_id: metrics.time_to_target(curve, targets[seed_of[run_id]]) if seed_of[run_id] in targets else None
             for run_id, curve in curves.items()}
    rows = []
    for method, runs in table.groupby("method", sort=False):
        paired = runs[runs["seed"].isin(base.index)]
        theirs = base.loc[paired["seed"]]
        mine_t = [reach[r] for r in paired["run_id"]]
        theirs_t = [reach[r] for r in theirs["run_id"]]
        both = [(b / m) for m, b in zip(mine_t, theirs_t) if m and b]
        same_steps = (paired["steps"].to_numpy() == theirs["steps"].to_numpy())
        rows.append({
            "method": method, "seeds": len(runs), "paired": len(paired),
            "reached": sum(t is not None for t in mine_t),
            "time_to_target": metrics.mean_ci([t for t in mine_t if t is not None]),
            "target_speedup": metrics.ratio_ci(both),
            "step_speedup": metrics.ratio_ci(theirs["train_seconds"].to_numpy()[same_steps]
                                             / paired["train_seconds"].to_numpy()[same_steps]),
            "final_accuracy": metrics.mean_ci(runs["final_accuracy"]),
            "accuracy_difference": metrics.mean_ci(100 * (paired["final_accuracy"].to_numpy()
                                                          - theirs["final_accuracy"].to_numpy())),
        })
    return sum(targets.values()) / len(targets), pd.DataFrame(rows)


def markdown(target: float, rows: pd.DataFrame, baseline: str) -> str:
    lines = [f"Against `{baseline}`: each seed's target is {metrics.TARGET_SHARE:.0%} of that seed's gain over the "
             f"warm start (mean {target:.3f}).", "",
             "| method | seeds | reached the target (of the paired seeds) | seconds to it | speed-up to it "
             "| step speed-up | final accuracy | accuracy difference (pts) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows.itertuples():
        lines.append(f"| {row.method} | {row.seeds} | {row.reached}/{row.paired} | {row.time_to_target.text('.0f')} | "
                     f"{row.target_speedup.text('.2f', '×')} | {row.step_speedup.text('.2f', '×')} | "
                     f"{row.final_accuracy.text('.3f')} | {row.accuracy_difference.text('+.1f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json files of `fastrl bench`")
    parser.add_argument("--baseline", action="append", required=True, help="method to compare with (repeatable)")
    args = parser.parse_args(argv)
    table, curves, config = load(args.results)
    for line in metrics.start_disagreements(table):
        print(f"Void comparison: {line}")
    print(f"`{config}`, {table['seed'].nunique()} seeds ({', '.join(map(str, sorted(table['seed'].unique())))}) "
          f"from {len(args.results)} bench outputs; mean ± 95 % Student-t interval over seeds, speed-ups geometric.")
    for baseline in args.baseline:
        print()
        print(markdown(*compare(table, curves, baseline), baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
