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

The report: per method, seconds to the target accuracy (the baseline's final accuracy less 0.5 points, first
evaluation at or above it), final accuracy, and rollouts that entered the update; and the shadow mode's projected
saving (shadow_skipped + shadow_merged + shadow_pruned over nominal, from the grpo runs) beside the measured one
(1 − the fastrl runs' kept rollouts over the grpo runs'). Target of issue 52: >= 1.5x to the target, final accuracy
no more than 0.5 points below TRL's. Not run for figures here (a quiet machine's run comes later); `--steps 1
--seeds 0 --eval-size 16` smoke-tests it.
"""

from __future__ import annotations

import argparse
import math
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
    """Time to target at equal accuracy, final accuracy and the projected vs measured saving (module docstring)."""
    from fastrl_core.store import list_runs, read_evals, read_runs, read_steps

    runs = read_runs(store).set_index("run_id")
    per = {method: [] for method in METHODS}
    for run_id in list_runs(store):
        name = str(runs.loc[run_id, "name"])
        method = name.split("-")[1] if name.startswith("trl-") else None
        if method in per:
            per[method].append((run_id, read_steps(store, run_id), read_evals(store, run_id)))
    if not per["grpo"] or not per["fastrl"]:
        raise SystemExit(f"{store}: needs runs of both methods; has {[m for m in METHODS if per[m]]}")
    finals = {m: [float(e.sort_values("step")["accuracy"].iloc[-1]) for _, _, e in per[m]] for m in METHODS}
    target = sum(finals["grpo"]) / len(finals["grpo"]) - 0.005
    for method in METHODS:
        times = []
        for _, _, evals in per[method]:
            reached = evals[evals["accuracy"] >= target].sort_values("step")
            times.append(float(reached["wall_time"].iloc[0]) if len(reached) else math.nan)
        kept = sum(int(s["rollouts_kept"].sum()) for _, s, _ in per[method])
        print(f"{method:7s} runs {len(per[method])}  final accuracy {sum(finals[method]) / len(finals[method]):.3f}  "
              f"seconds to {target:.3f}: {times}  rollouts into the update {kept}")
    shadow = [s for _, s, _ in per["grpo"]]
    nominal = sum(int(s["rollouts_nominal"].sum()) for s in shadow)
    projected = sum(int((s["shadow_skipped"] + s["shadow_merged"] + s["shadow_pruned"]).sum()) for s in shadow)
    measured = 1 - sum(int(s["rollouts_kept"].sum()) for _, s, _ in per["fastrl"]) / max(
        sum(int(s["rollouts_kept"].sum()) for s in shadow), 1)
    print(f"shadow mode's projected saving {projected / max(nominal, 1):.1%} of nominal rollouts; measured "
          f"{measured:.1%} fewer rollouts into the update")


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
