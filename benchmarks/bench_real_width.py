"""One FastRL step at Qwen2.5-VL-3B widths with the real 151,936-token vocabulary, on CPU, through `fastrl train`.

    .venv/bin/python benchmarks/bench_real_width.py [--layers 2] [--vision-depth 1] [--pruners fastrl,none]
        [--rollouts 4] [--tokens 16] [--keep DIR]

Builds a random-weight Qwen2.5-VL at Qwen2.5-VL-3B's widths (text hidden 2048, MLP 11008, 16 heads / 2 KV heads,
head_dim 128, mRoPE [16, 24, 24], tied embeddings; vision hidden 1280, 16 heads) with `--layers` text layers and
`--vision-depth` vision blocks (`fastrl_core.policy.build_random_policy`, the shipped 482-entry tokenizer), saves it,
then runs the command users run, in a child process each:

    python -m fastrl_app.cli train fastrl_core/configs/embedded.yaml model=<dir> steps=1 prompts_per_step=2
        rollouts_per_prompt=<--rollouts> max_new_tokens=<--tokens> sketch_top_k=64 threads=1 eval_every=0 ... pruner=<p>

twice: `pruner=fastrl` (the FastRL step) and `pruner=none` (GRPO: every rollout through the log-prob pass and the
update). A random policy earns no task reward (no `<think>`/`\\boxed{}` in random text), so every FastRL group has
zero advantage and is pruned: its step is generate + sketch + prune only. The `none` step is the one that
allocates gradients and AdamW's moments at this size: its peak RSS is the step's memory.

Prints per run the step's phase seconds (from the run store), the kept fraction, the child's peak RSS (wait4)
and its wall-clock (including loading the model and the end-of-run checkpoint: model + AdamW state, ~6 GB).
Memory budget: 0.52 B float32 parameters (2.1 GB) + gradients + AdamW's two moments ~= 8.4 GB (7.8 GiB); beta = 0
(the default), so no reference copy. Measured (2026-12-01, 2 text layers, 1 vision block; memory, not timings, is
valid on the loaded machine): the `fastrl` step peaks at 3.0-3.6 GiB, the `none` step at 10.98 GiB with the trainer's
`torch.optim.AdamW` (its single-tensor CPU path makes two parameter-sized temporaries, 1.2 GB each for the
151,936 x 2048 embedding) and at 8.65 GiB with `AdamW(..., fused=True)`. With `--rollouts 16 --tokens 64`
(2026-12-04, quiet machine, one run each, `none` only): the step before and after the chunked scoring head
(`engines/logprobs.py`) both peak at 10.73 GiB (AdamW's temporaries set the peak here, not the head's 1.2 GB of
logits per tensor); its update took 267 s before and 305 s after (+14 %: the head's logits recomputed in the
backward), generate 119 s and 121 s. Output rows beyond the tokenizer are never
sampled (`fastrl_core.policy.never_sampled_token_ids`): unsuppressed, this model sampled them almost only (empty
completions).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

TRAIN_OVERRIDES = ["steps=1", "prompts_per_step=2", "sketch_top_k=64", "threads=1", "eval_every=0",
                   "checkpoint_every=0", "synthetic_train=64", "synthetic_test=16", "budget=fixed"]
PRUNERS = ("fastrl", "none")


def build_checkpoint(directory: Path, layers: int, vision_depth: int) -> dict:
    """Build and save the model; returns its parameter counts."""
    import torch

    from fastrl_core.policy import QWEN2_5_VL_3B_TWO_LAYERS, build_random_policy, save_policy

    torch.set_num_threads(1)
    widths = QWEN2_5_VL_3B_TWO_LAYERS.replace(num_layers=layers, vision_depth=vision_depth)
    policy = build_random_policy(widths, seed=0)
    save_policy(policy, directory)
    counts = {"parameters": sum(p.numel() for p in policy.model.parameters()),
              "vision_parameters": sum(p.numel() for p in policy.model.model.visual.parameters()),
              "tokenizer_entries": len(policy.tokenizer), "vocab_size": widths.vocab_size}
    del policy
    gc.collect()
    return counts


def run_train(model_dir: Path, store_dir: Path, pruner: str, rollouts: int, tokens: int
              ) -> tuple[int, float, float, str]:
    """(exit code, peak RSS GiB, wall seconds, stderr tail) of `fastrl train` in a child process."""
    command = [sys.executable, "-m", "fastrl_app.cli", "train", "embedded",
               f"model={model_dir}", f"store_dir={store_dir}", f"pruner={pruner}", f"run_name={pruner}",
               f"rollouts_per_prompt={rollouts}", f"max_new_tokens={tokens}", *TRAIN_OVERRIDES]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        tail = stderr.read()[-4000:]
    return child.returncode, usage.ru_maxrss / 2**20, time.perf_counter() - start, tail  # ru_maxrss: KiB


def step_summary(store_dir: Path, run_name: str) -> dict:
    """The run's one steps row: phase seconds, kept and sampled counts, reward; and its mean completion length."""
    from fastrl_core.store import read_rollouts, read_runs, read_steps

    runs = read_runs(store_dir)
    run_id = runs.loc[runs["name"] == run_name, "run_id"].item()
    step = read_steps(store_dir, run_id).iloc[0]
    rollouts = read_rollouts(store_dir, run_id)
    return {"phase_s": {c[len("time_"):]: float(step[c]) for c in step.index
                        if c.startswith("time_") and step[c] == step[c]},
            "rollouts_sampled": int(step["rollouts_sampled"]), "rollouts_kept": int(step["rollouts_kept"]),
            "kept_fraction": int(step["rollouts_kept"]) / int(step["rollouts_sampled"]),
            "reward_mean": float(step["reward_mean"]),
            "mean_completion_chars": float(rollouts["completion"].str.len().mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="text decoder layers (3B has 36)")
    parser.add_argument("--vision-depth", type=int, default=1, help="vision blocks (3B has 32)")
    parser.add_argument("--pruners", default=",".join(PRUNERS), help="runs to make, comma-separated")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per prompt (2 prompts)")
    parser.add_argument("--tokens", type=int, default=16, help="max new tokens per rollout")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the checkpoint and stores in this directory (a later run reuses the checkpoint)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_real_width_"))
    model_dir, store_dir = root / "model", root / f"store-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    reused = (model_dir / "counts.json").is_file()  # --keep of an earlier run: reuse its checkpoint
    if reused:
        counts = json.loads((model_dir / "counts.json").read_text())
        if (counts["layers"], counts["vision_depth"]) != (args.layers, args.vision_depth):
            raise SystemExit(f"{model_dir} holds {counts['layers']} layers / {counts['vision_depth']} vision blocks")
    else:
        counts = {**build_checkpoint(model_dir, args.layers, args.vision_depth), "layers": args.layers,
                  "vision_depth": args.vision_depth}
        (model_dir / "counts.json").write_text(json.dumps(counts))
    summary = {**counts, "build_and_save_s": time.perf_counter() - start, "runs": {}}
    print(f"Qwen2.5-VL at 3B widths: {counts['parameters'] / 1e6:.1f} M parameters "
          f"({counts['vision_parameters'] / 1e6:.1f} M vision), vocabulary {counts['vocab_size']:,} "
          f"(tokenizer {counts['tokenizer_entries']}), {args.layers} text layers, {args.vision_depth} vision "
          "blocks; " + (f"reused from {model_dir}" if reused else
                        f"built and saved in {summary['build_and_save_s']:.1f} s"), flush=True)
    for pruner in args.pruners.split(","):
        code, peak_gib, wall, tail = run_train(model_dir, store_dir, pruner, args.rollouts, args.tokens)
        if code != 0:
            print(tail, file=sys.stderr)
            print(f"fastrl train pruner={pruner} failed with exit code {code}", file=sys.stderr)
            return 1
        run = {**step_summary(store_dir, pruner), "train_process_wall_s": wall, "train_process_peak_rss_gib": peak_gib}
        summary["runs"][pruner] = run
        print(f"\n`fastrl train ... pruner={pruner}`: one step, {run['rollouts_sampled']} rollouts x "
              f"<= {args.tokens} tokens, "
              "1 thread\n| phase | seconds |\n|---|---|")
        for name, seconds in run["phase_s"].items():
            print(f"| {name} | {seconds:.2f} |")
        print(f"kept {run['rollouts_kept']} / {run['rollouts_sampled']} ({run['kept_fraction']:.0%}), reward mean "
              f"{run['reward_mean']:.2f}, completions {run['mean_completion_chars']:.0f} characters on average; "
              f"peak RSS {peak_gib:.2f} GiB; process wall-clock {wall:.1f} s (load + step + checkpoint)", flush=True)
    print(json.dumps(summary))
    if args.keep is None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
