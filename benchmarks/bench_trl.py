"""FastRL inside TRL against TRL's own GRPOTrainer, in the `paper` regime (fastrl_core/configs/paper.yaml: the
shipped warm start, synthetic count_dots + longest_segment, 16 prompts x 8 rollouts, beta 0.01, lr 3e-5).

Per seed, three runs in one store, alternated seed by seed so a drift of the machine's load hits every method alike:
  grpo    TRL's `GRPOTrainer`, through `FastRLGRPOTrainer(apply=False)`: the same updates bit for bit
          (tests/test_trl_plugin.py), and its store holds what FastRL would have skipped, merged and pruned: the
          shadow mode's projected saving;
  fastrl  `FastRLGRPOTrainer()` with its defaults (pruner fastrl, budget adaptive, merge);
each evaluated greedily on the config's test split with `fastrl eval`'s scorer every `--eval-every` optimiser
steps (`eval_problems`). Launched as 2 processes with gloo on CPU:

    torchrun --standalone --nproc_per_node 2 benchmarks/bench_trl.py --store runs/bench-trl --seeds 0 1 2
    fastrl app --store runs/bench-trl        # the Compare and Budget pages read the same store
    python benchmarks/bench_trl.py --report runs/bench-trl    # time to target at equal accuracy, saving

The report (`report`): per method over the seeds, through `fastrl_app.metrics` as `fastrl bench` reads its runs:
step and time-to-target speed-ups against the same seed's TRL run, final accuracy and its difference from TRL's,
95 % intervals; and the shadow mode's projected saving (shadow_skipped + shadow_merged + shadow_pruned over nominal,
from the grpo runs) beside the measured one (1 − the fastrl runs' kept rollouts over the grpo runs'). Target of
issue 52: >= 1.5x to the target, final accuracy no more than 0.5 points below TRL's. Measured on a quiet 2-core
machine, 3 seeds: docs/bench/trl/README.md. `--steps 1 --seeds 0 --eval-size 16` smoke-tests it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

METHODS = ("grpo", "fastrl")


def trl_dataset(problems, template: str):
    """FastRL problems as TRL rows: a chat prompt with the diagram and the template's text, `answer`, `id`."""
    from datasets import Dataset

    from fastrl_core.data.templates import render_prompt

    return Dataset.from_list([{"prompt": [{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text",
                                                                        "text": render_prompt(p, template)}]}],
                               "image": p.load_image(), "id": p.id, "answer": p.answer, "index": i}
                              for i, p in enumerate(problems)])


def reward_functions(problems, style: str):
    """TRL reward functions `format` and `accuracy`: FastRL's own reward parts (`rewards.score_completions`),
    weighted by GRPOConfig's reward_weights as the config weighs them."""
    from fastrl_core.rewards import score_completions

    def parts(completions, index):
        return score_completions([c[-1]["content"] for c in completions], [problems[i] for i in index], style=style)

    def format(completions, index, **kwargs):
        return [p.format for p in parts(completions, index)]

    def accuracy(completions, index, **kwargs):
        return [p.accuracy for p in parts(completions, index)]

    return [format, accuracy]


def run(method: str, seed: int, store: str, steps: int | None, eval_every: int, eval_size: int | None) -> None:
    """One run of `method` and `seed` into `store` (every process calls it; rank 0 writes)."""
    import torch
    from trl import GRPOConfig

    from fastrl_core.data.templates import answer_style
    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.policy import load_policy
    from fastrl_core.run_config import load_config
    from fastrl_core.run_setup import load_datasets

    torch.set_num_threads(1)
    config = load_config("paper", [f"seed={seed}"])
    train, test = load_datasets(config)
    test = test[: eval_size or config.eval_size]
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    rows = config.prompts_per_step * config.rollouts_per_prompt
    args = GRPOConfig(
        output_dir=str(Path(store) / "trl-out" / f"{method}-seed{seed}"), seed=seed, use_cpu=True, bf16=False,
        per_device_train_batch_size=rows // (world * config.updates_per_step),
        steps_per_generation=config.updates_per_step, gradient_accumulation_steps=1,
        num_generations=config.rollouts_per_prompt, max_completion_length=config.max_new_tokens,
        temperature=config.temperature, beta=config.objective_args.get("beta", 0.0), loss_type="grpo",
        learning_rate=config.lr, warmup_steps=config.warmup_steps, max_steps=(steps or config.steps)
        * config.updates_per_step, report_to=[], save_strategy="no", logging_steps=config.updates_per_step,
        disable_tqdm=True, reward_weights=[config.format_weight, config.accuracy_weight],
        generation_kwargs={"suppress_tokens": load_policy("embedded").suppress_token_ids})
    trainer = FastRLGRPOTrainer(
        model="embedded", args=args, train_dataset=trl_dataset(train, config.template),
        reward_funcs=reward_functions(train, answer_style(config.template)),
        apply=method != "grpo", sketch_top_k=config.sketch_top_k, store_dir=store, run_name=f"trl-{method}-seed{seed}",
        eval_problems=test, eval_every=eval_every * config.updates_per_step, eval_template=config.template)
    trainer.train()


def report(store: str) -> None:
    """Per method over the seeds (`fastrl_app.metrics`, as `fastrl bench` reads its runs): seconds per step and the
    step speed-up against the same seed's TRL run, time to TRL's target (90 % of the same seed's gain over the warm
    start) and its speed-up, final accuracy (mean of the last evaluations) and its difference from TRL's, each with a 95 %
    interval; then the shadow mode's projected saving beside the measured one."""
    import pandas as pd

    from fastrl_app import metrics
    from fastrl_core.store import list_runs, read_evals, read_runs, read_steps

    runs = read_runs(store).set_index("run_id")
    labels = []
    for run_id in list_runs(store):
        method, _, seed = str(runs.loc[run_id, "name"]).removeprefix("trl-").rpartition("-seed")
        if method in METHODS and seed.isdigit():
            labels.append({"run_id": run_id, "method": method, "seed": int(seed), "objective": "trl",
                           "is_baseline": method == "grpo"})
    labels = pd.DataFrame(labels)
    if labels.empty or set(labels["method"]) != set(METHODS):
        raise SystemExit(f"{store}: needs runs of {', '.join(METHODS)}; has "
                         f"{sorted(set(labels['method'])) if len(labels) else 'none'}")
    labels, _ = metrics.one_run_per_seed(labels, runs["started"])
    steps = pd.concat([read_steps(store, r).assign(run_id=r) for r in labels["run_id"]], ignore_index=True)
    evals = pd.concat([read_evals(store, r).assign(run_id=r) for r in labels["run_id"]], ignore_index=True)
    per_run = metrics.compare_runs(labels, steps, evals, baseline="grpo")
    summary = metrics.summarise(per_run).set_index("method")
    print(f"{store}: TRL's GRPOTrainer (grpo, shadow mode) against FastRLGRPOTrainer (fastrl), paired by seed; "
          f"target {metrics.TARGET_SHARE:.0%} of each seed's GRPO gain (mean {summary.loc['grpo', 'target_accuracy']:.3f} "
          "greedy accuracy); mean [95 % interval]")
    for method in METHODS:
        row = summary.loc[method]
        iv = lambda name: metrics.interval(row, name)  # noqa: E731
        print(f"  {method:7s} seeds {row['seeds']}  s/step {iv('seconds_per_step').text('.2f')}  "
              f"step speed-up {iv('step_speedup').text('.2f', 'x')}  reached the target {row['target_reached']}"
              f"/{len(row['seeds'])}  time-to-target speed-up {iv('target_speedup').text('.2f', 'x')}  "
              f"final accuracy {iv('final_accuracy').text('.3f')}  vs TRL {iv('accuracy_gain').text('+.3f')}  "
              f"kept {row['kept_fraction_mean']:.0%} of sampled")
    for row in per_run.sort_values(["seed", "method"]).itertuples():
        reached = "not reached" if row.time_to_target is None else f"{row.time_to_target:.0f} s"
        print(f"    seed {row.seed} {row.method:7s} {row.seconds_per_step:.2f} s/step  to the target {reached}  "
              f"final accuracy {row.final_accuracy:.3f}")
    shadow = steps[steps["run_id"].isin(labels.loc[labels["method"] == "grpo", "run_id"])]
    applied = steps[steps["run_id"].isin(labels.loc[labels["method"] == "fastrl", "run_id"])]
    projected = (shadow["shadow_skipped"] + shadow["shadow_merged"] + shadow["shadow_pruned"]).sum()
    measured = 1 - applied["rollouts_kept"].sum() / max(shadow["rollouts_kept"].sum(), 1)
    print(f"  shadow mode's projected saving {projected / max(shadow['rollouts_nominal'].sum(), 1):.1%} of nominal "
          f"rollouts; measured {measured:.1%} fewer rollouts into the update")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="runs/bench-trl")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="generations per run (default: the config's)")
    parser.add_argument("--eval-every", type=int, default=8, help="generations between evaluations")
    parser.add_argument("--eval-size", type=int, default=None, help="test problems (default: the config's)")
    parser.add_argument("--report", metavar="STORE", help="only print the report of a finished bench store")
    options = parser.parse_args()
    if options.report:
        report(options.report)
        return
    for seed in options.seeds:  # alternated: each seed runs every method before the next seed
        for method in METHODS:
            run(method, seed, options.store, options.steps, options.eval_every, options.eval_size)


if __name__ == "__main__":
    main()
