"""`fastrl bench`: GRPO, the prior pruners and FastRL trained one after another on identical seeds and data.

For each run it reports wall-clock training time (evaluation excluded), time per phase, final and best greedy test
accuracy, and the time to reach its baseline's final accuracy. Greedy accuracy on a few hundred problems jumps by
several points between evaluations, so both "final" and "reach" use a moving average over `SMOOTH` evaluations:
target = the baseline's smoothed accuracy at its last evaluation; time to target = training seconds at the first
evaluation where a run's smoothed accuracy reaches it; speedup = the baseline's time to target / the run's, both
measured the same way in the same command. The baseline of a run is plain GRPO with the same objective
(`grpo`, `grpo+dapo`, `grpo+gspo`). All runs go to one
store, so the dashboard's Runs page compares them too; the table (Markdown + JSON) and a plot go to `--out`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from fastrl_core.config import load_config
from fastrl_core.trainer import PHASES

# name -> overrides; `+objective` names share that objective's GRPO baseline
METHODS: dict[str, list[str]] = {
    "grpo": ["pruner=none", "budget=fixed"],
    "dapo_filter": ["pruner=dapo_filter", "budget=fixed"],
    "cppo": ["pruner=cppo", "budget=fixed"],
    "pods": ["pruner=pods", "budget=fixed"],
    "fastrl_official": ["pruner=fastrl_official", "budget=rollout_sa"],
    "fastrl": ["pruner=fastrl", "budget=adaptive"],
    "grpo+dapo": ["pruner=none", "budget=fixed", "objective=dapo"],
    "fastrl+dapo": ["pruner=fastrl", "budget=adaptive", "objective=dapo"],
    "grpo+gspo": ["pruner=none", "budget=fixed", "objective=gspo"],
    "fastrl+gspo": ["pruner=fastrl", "budget=adaptive", "objective=gspo"],
}
DEFAULT_METHODS = "grpo,dapo_filter,cppo,pods,fastrl_official,fastrl"
SMOOTH = 3  # evaluations in the moving average


def baseline_of(method: str) -> str:
    _, plus, objective = method.partition("+")
    return f"grpo+{objective}" if plus else "grpo"


@dataclass
class RunResult:
    method: str
    run_id: str
    train_seconds: float
    final_accuracy: float
    best_accuracy: float
    initial_accuracy: float
    rollouts_sampled: int
    rollouts_kept: int
    phase_seconds: dict[str, float]
    curve: list[tuple[int, float, float]]  # (step, wall seconds, accuracy) per evaluation

    @property
    def smoothed(self) -> list[float]:
        """Moving average of the last `SMOOTH` evaluations' accuracy at each evaluation."""
        accuracy = [a for *_, a in self.curve]
        return [sum(accuracy[max(0, i - SMOOTH + 1): i + 1]) / len(accuracy[max(0, i - SMOOTH + 1): i + 1])
                for i in range(len(accuracy))]

    @property
    def final_smoothed(self) -> float:
        return self.smoothed[-1]

    def time_to(self, target: float) -> float | None:
        """Training seconds at the first evaluation (after the initial one) whose smoothed accuracy reaches `target`."""
        return next((seconds for (step, seconds, _), smooth in zip(self.curve, self.smoothed)
                     if step > 0 and smooth >= target - 1e-9), None)


def collect(store_dir: Path, method: str, run_id: str) -> RunResult:
    from fastrl_core.store import read_evals, read_steps

    steps = read_steps(store_dir, run_id).sort_values("step")
    evals = read_evals(store_dir, run_id).sort_values("step")
    wall = dict(zip(steps["step"] + 1, steps["wall_time"]))  # eval at step s follows s steps
    curve = [(int(s), float(wall.get(int(s), 0.0)), float(a)) for s, a in zip(evals["step"], evals["accuracy"])]
    return RunResult(
        method=method, run_id=run_id, train_seconds=float(steps["wall_time"].iloc[-1]),
        final_accuracy=curve[-1][2], best_accuracy=max(a for *_, a in curve), initial_accuracy=curve[0][2],
        rollouts_sampled=int(steps["rollouts_sampled"].sum()), rollouts_kept=int(steps["rollouts_kept"].sum()),
        phase_seconds={p: float(steps[f"time_{p}"].sum()) for p in PHASES if f"time_{p}" in steps},
        curve=curve,
    )


def summarise(results: list[RunResult]) -> list[dict]:
    by_method = {r.method: r for r in results}
    rows = []
    for r in results:
        base = by_method.get(baseline_of(r.method))
        target = base.final_smoothed if base else None
        reach = r.time_to(target) if target is not None else None
        base_reach = base.time_to(target) if base else None
        rows.append({
            "method": r.method, "run_id": r.run_id, "baseline": base.method if base else None,
            "final_accuracy": r.final_accuracy, "final_smoothed": r.final_smoothed, "best_accuracy": r.best_accuracy,
            "initial_accuracy": r.initial_accuracy, "train_seconds": r.train_seconds,
            "rollouts_sampled": r.rollouts_sampled, "kept_fraction": r.rollouts_kept / max(1, r.rollouts_sampled),
            "target_accuracy": target, "time_to_target": reach,
            "baseline_time_to_target": base_reach,
            "speedup": (base_reach / reach) if base_reach and reach else None,
            "step_time_ratio": (base.train_seconds / r.train_seconds) if base else None,
            **{f"time_{p}": s for p, s in r.phase_seconds.items()},
        })
    return rows


def markdown_table(rows: list[dict]) -> str:
    def fmt(value, spec):
        return "—" if value is None else format(value, spec)

    header = ("| method | final acc (smoothed) | best acc | train s | to baseline's final acc | speedup | "
              "time/step vs baseline | rollouts | kept | " + " | ".join(f"{p} s" for p in PHASES) + " |")
    lines = [header, "|" + "---|" * (9 + len(PHASES))]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['final_smoothed']:.3f} | {r['best_accuracy']:.3f} | {r['train_seconds']:.0f} | "
            f"{fmt(r['time_to_target'], '.0f')} s | {fmt(r['speedup'], '.2f')}× | "
            f"{fmt(r['step_time_ratio'], '.2f')}× | {r['rollouts_sampled']} | "
            f"{r['kept_fraction']:.2f} | " + " | ".join(f"{r.get(f'time_{p}', 0.0):.1f}" for p in PHASES) + " |")
    return "\n".join(lines)


def plot(results: list[RunResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.2, 1]})
    for r in results:
        style = "-" if r.method.startswith(("fastrl", "grpo")) and "official" not in r.method else "--"
        width = 2.4 if r.method.startswith("fastrl") and "official" not in r.method else 1.3
        left.plot([s for _, s, _ in r.curve], r.smoothed, style, lw=width, marker="o", ms=3, label=r.method)
    left.set_xlabel("training wall-clock (s, 2 CPU cores; evaluation excluded)")
    left.set_ylabel(f"greedy test accuracy (mean of {SMOOTH} evaluations)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    bottom = [0.0] * len(results)
    for phase in PHASES:
        values = [r.phase_seconds.get(phase, 0.0) for r in results]
        right.barh([r.method for r in results], values, left=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_xlabel("seconds per phase (whole run)")
    right.invert_yaxis()
    right.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastrl bench", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "embedded.yaml"))
    parser.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--store", default="runs/bench")
    parser.add_argument("--out", default="runs/bench/report", help="folder for results.md, results.json, bench.png")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    missing = sorted({baseline_of(m) for m in methods} - set(methods))
    methods = missing + methods  # every run needs its baseline in the same benchmark

    from fastrl_core.trainer import train

    results = []
    for method in methods:
        config = load_config(args.config, [*args.overrides, *METHODS[method], f"store_dir={args.store}",
                                           f"run_name=bench-{method.replace('+', '-')}"])
        print(f"== {method}: {' '.join(METHODS[method])}", flush=True)
        run_id = train(config)
        results.append(collect(Path(args.store), method, run_id))

    rows = summarise(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps({"rows": rows, "curves": {r.method: r.curve for r in results}},
                                                 indent=1))
    plot(results, out / "bench.png")
    print("\n" + table + f"\n\nwrote {out}/results.md, results.json, bench.png")
    return 0
