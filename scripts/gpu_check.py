#!/usr/bin/env python
"""GPU check: vLLM rollouts, FastRL and GRPO steps, and the TRL plug-in on one GPU, in well under 10 minutes.

What it runs (no hub access needed; every model is built from a config with random weights):
  1. a Qwen2.5-VL at the real widths of Qwen2.5-VL-3B (text hidden 2048, MLP 11008, 16 heads / 2 KV heads,
     head_dim 128, mrope [16, 24, 24]; vision hidden 1280, 16 heads) with few layers (`--layers`, `--vision-depth`),
     a byte-level BPE tokenizer trained locally on the synthetic task (~1k tokens: the real 152k-entry unembedding
     is the one width NOT reproduced), and the synthetic geometry task's 112x112 diagrams;
  2. rollout throughput: one batch with the vLLM engine, and the same batch with HF `generate` for comparison;
  3. `--steps` training steps of plain GRPO (pruner `none`) and of FastRL (pruner `fastrl`): generate (vLLM) ->
     reward -> advantage -> prune -> old + reference log-prob passes on kept rows (HF, bf16) -> update -> weight
     sync into vLLM; seconds per phase, kept fraction, and the gap between vLLM's and the trainer's log-probs.
     Reward: the task's reward plus 0.1·(distinct words mod 3), since random weights earn no task reward and
     all-zero rewards would leave FastRL nothing to keep (timings, not learning, are what this checks);
  4. the TRL plug-in: `--steps` steps each of TRL's `GRPOTrainer` and `FastRLGRPOTrainer` on a text Qwen2 of the
     same text widths (HF generation inside TRL; TRL 1.16 supports vLLM <= 0.31 for its own vLLM path).
It prints one table per part and a JSON summary (also written to `--out`).

`--dry-run` runs the same code on CPU at tiny size with the HF engine in place of vLLM (what CI can run):
    python scripts/gpu_check.py --dry-run
On a GPU machine with the `gpu` extra (docs/gpu.md):
    python scripts/gpu_check.py --out gpu_check.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from fastrl_core.algo.advantages import compute_advantages  # noqa: E402
from fastrl_core.algo.objectives import policy_loss  # noqa: E402
from fastrl_core.algo.pruners import GroupBatch, prune  # noqa: E402
from fastrl_core.algo.sketches import make_projection  # noqa: E402

TEMPLATE = "math"


# ---------------------------------------------------------------------------------------------------- setup
def load_task(cache: Path, n_train: int):
    from fastrl_core.data.problems import load_problems
    from fastrl_core.data.synthetic import ensure_dataset

    root = ensure_dataset(cache, n_train=n_train, n_test=16, seed=0)
    return load_problems(root / "train")


def build_policy(problems, args):
    """Tiny policy (dry run) or a Qwen2.5-VL at Qwen2.5-VL-3B widths with `args.layers` layers, random weights."""
    from fastrl_core.data.templates import TEMPLATES
    from fastrl_core.policy import QWEN2_5_VL_3B_WIDTHS, build_policy as build_widths_policy, build_tiny_policy
    from fastrl_core.warmstart import tokenizer_corpus

    corpus = tokenizer_corpus(problems, TEMPLATES)
    if args.dry_run:
        return build_tiny_policy(corpus, vocab_size=512, seed=args.seed)
    from transformers import Qwen2VLImageProcessor

    # vocab_size=None: one output row per tokenizer entry (the real 152k-row unembedding is not reproduced here)
    widths = QWEN2_5_VL_3B_WIDTHS.replace(num_layers=args.layers, vision_depth=args.vision_depth, vocab_size=None)
    return build_widths_policy(corpus, widths, tokenizer_vocab_size=1024, seed=args.seed, dtype=torch.bfloat16,
                               image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112))


def make_engine(policy, projection, args, *, kind: str):
    if kind == "hf":
        from fastrl_core.engines.hf import HFEngine

        return HFEngine(policy, template=TEMPLATE, max_new_tokens=args.max_new_tokens, sketch_projection=projection,
                        sketch_top_k=args.top_k)
    from fastrl_core.engines.vllm import VLLMEngine

    return VLLMEngine(policy, template=TEMPLATE, max_new_tokens=args.max_new_tokens, sketch_projection=projection,
                      sketch_top_k=args.top_k, gpu_memory_utilization=args.gpu_memory_utilization,
                      enforce_eager=args.eager, dtype="bfloat16", max_model_len=1024, seed=args.seed)


class Clock:
    """Seconds per phase (CUDA synchronised, so GPU work is charged to the phase that launched it)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, defaultdict(float)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def phase(self, name: str):
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        self.seconds[name] += time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------- parts
def rollout_throughput(engine, problems, args, device) -> dict:
    """One batch of `prompts x rollouts` (after a warm-up batch): generated tokens per second."""
    counts = [args.rollouts] * len(problems)
    engine.generate(problems, counts, generator=torch.Generator().manual_seed(0))  # warm-up (graphs, caches)
    clock = Clock(device)
    with clock.phase("generate"):
        rollouts = engine.generate(problems, counts, generator=torch.Generator().manual_seed(1))
    tokens = int(rollouts.completion_mask.sum())
    return {"rollouts": len(rollouts), "tokens": tokens, "seconds": clock.seconds["generate"],
            "tokens_per_s": tokens / clock.seconds["generate"]}


def train_steps(name: str, pruner: str, policy, engine, problems, args, device) -> list[dict]:
    """`args.steps` steps of GRPO with `pruner`: the trainer's numbered steps, on `device`, timed per phase."""
    from fastrl_core.data.templates import answer_style
    from fastrl_core.rewards import score_completions

    model = policy.model
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rows = []
    for step in range(args.steps):
        clock = Clock(device)
        batch = [problems[(step * args.prompts + i) % len(problems)] for i in range(args.prompts)]
        with clock.phase("generate"):
            model.eval()
            rollouts = engine.generate(batch, [args.rollouts] * len(batch),
                                       generator=torch.Generator().manual_seed(args.seed + step))
        group_ids = rollouts.prompt_index
        with clock.phase("reward"):
            parts = score_completions(rollouts.completion_text, [batch[i] for i in group_ids.tolist()],
                                      style=answer_style(TEMPLATE))
            rewards = torch.tensor([p.overall + 0.1 * (len(set(text.split())) % 3)  # varied: see module doc
                                    for p, text in zip(parts, rollouts.completion_text)])
        with clock.phase("advantage"):
            advantages = compute_advantages("group_normalized", rewards, group_ids)
        with clock.phase("prune"):
            decision = prune(pruner, GroupBatch(group_ids, rewards, advantages, rollouts.sketches),
                             keep_ratio=0.5, min_keep=2, generator=torch.Generator().manual_seed(step))
            kept = decision.keep_mask.nonzero().squeeze(1)
        gap = loss = float("nan")  # stay NaN when every rollout was pruned (all advantages zero)
        mask = rollouts.completion_mask[kept].to(device)
        with clock.phase("logprob"), torch.no_grad():
            if len(kept):
                old = engine.token_logprobs(model, batch, rollouts, kept)  # the trainer's numerics, not the sampler's
                behaviour = rollouts.behaviour_logprobs[kept].to(device)
                gap = float(((old - behaviour).abs() * mask).sum() / mask.sum().clamp(min=1))
                ref = engine.token_logprobs(reference, batch, rollouts, kept)
        with clock.phase("update"):
            if len(kept):
                model.train()
                logprobs = engine.token_logprobs(model, batch, rollouts, kept)
                out = policy_loss("grpo", logprobs, old, advantages[kept].to(device), mask, ref_logprobs=ref,
                                  rollout_weights=decision.weights[kept].to(device), beta=0.01)
                optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                loss = out.loss.item()
                model.eval()
        with clock.phase("sync"):
            if hasattr(engine, "sync_weights"):
                engine.sync_weights(model)
        tokens = int(rollouts.completion_mask.sum())
        rows.append({"method": name, "step": step, "sampled": len(rollouts), "kept": len(kept),
                     "tokens": tokens, "gen_tokens_per_s": tokens / max(clock.seconds["generate"], 1e-9),
                     "logprob_gap": gap, "loss": loss, **{f"t_{k}": v for k, v in clock.seconds.items()},
                     "t_total": sum(clock.seconds.values())})
    return rows


def trl_steps(policy, problems, args, device, workdir: Path) -> list[dict]:
    """TRL's GRPOTrainer and FastRLGRPOTrainer, `args.steps` steps each, on a text Qwen2 with the policy's text
    widths and tokenizer (a varied reward that needs no learning, so groups have advantages to prune)."""
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from fastrl_core.data.templates import render_prompt
    from fastrl_core.integrations.trl import FastRLGRPOTrainer

    text = policy.model.config.get_text_config()
    tokenizer = policy.tokenizer
    config = Qwen2Config(vocab_size=text.vocab_size, hidden_size=text.hidden_size,
                         intermediate_size=text.intermediate_size, num_hidden_layers=text.num_hidden_layers,
                         num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
                         max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    model_dir = workdir / "trl-model"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    prompts = [render_prompt(p, TEMPLATE) for p in problems[: args.prompts * args.steps]]
    dataset = Dataset.from_dict({"prompt": prompts, "id": [p.id for p in problems[: len(prompts)]]})

    def varied_reward(completions, **kwargs):
        return [float(len(set(c.split())) % 3) for c in completions]

    rows = []
    for name, trainer_class, extra in (("trl-grpo", GRPOTrainer, {}),
                                       ("trl-fastrl", FastRLGRPOTrainer,
                                        {"pruner": "fastrl", "store_dir": str(workdir / "store")})):
        grpo = GRPOConfig(output_dir=str(workdir / name), per_device_train_batch_size=args.prompts * args.rollouts,
                          num_generations=args.rollouts, max_completion_length=args.max_new_tokens,
                          max_steps=args.steps, beta=0.01, learning_rate=args.lr, seed=args.seed,
                          use_cpu=device.type == "cpu", bf16=device.type == "cuda", report_to=[],
                          save_strategy="no", logging_steps=1, disable_tqdm=True)
        trainer = trainer_class(model=str(model_dir), reward_funcs=[varied_reward], args=grpo,
                                train_dataset=dataset, processing_class=tokenizer, **extra)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        kept = [entry.get("fastrl/kept_fraction") for entry in trainer.state.log_history if "loss" in entry]
        rows.append({"method": name, "steps": args.steps, "seconds": seconds, "s_per_step": seconds / args.steps,
                     "kept_fraction": [k for k in kept if k is not None] or None})
    return rows


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, HF engine instead of vLLM")
    parser.add_argument("--steps", type=int, default=None, help="training steps per method (3; dry run 2)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (32; dry run 2)")
    parser.add_argument("--rollouts", type=int, default=None, help="rollouts per prompt (8; dry run 4)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="completion length (128; dry run 8)")
    parser.add_argument("--layers", type=int, default=4, help="text decoder layers at real width")
    parser.add_argument("--vision-depth", type=int, default=4, help="vision blocks at real width")
    parser.add_argument("--top-k", type=int, default=20, help="top-K log-probs for the logprob sketch")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35, help="vLLM's share of the GPU")
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    parser.add_argument("--skip-trl", action="store_true", help="skip the TRL plug-in part")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON summary here")
    args = parser.parse_args(argv)
    defaults = dict(steps=(2, 3), prompts=(2, 32), rollouts=(4, 8), max_new_tokens=(8, 128))
    for key, (dry, real) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, dry if args.dry_run else real)
    return args


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n== {title}")
    if not rows:
        return
    keys = list(dict.fromkeys(k for row in rows for k in row))
    print("  ".join(f"{k:>12}" for k in keys))
    for row in rows:
        cells = [f"{row.get(k):>12.3f}" if isinstance(row.get(k), float) else f"{str(row.get(k)):>12}" for k in keys]
        print("  ".join(cells))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.dry_run:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device; run with --dry-run on CPU")
        device = torch.device("cuda")
    started = time.perf_counter()
    summary: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                     "dry_run": args.dry_run, "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="fastrl-gpu-check-") as tmp:
        workdir = Path(tmp)
        clock = Clock(device)
        with clock.phase("setup"):
            problems = load_task(workdir / "data", n_train=max(64, args.prompts * args.steps))
            policy = build_policy(problems, args)
            policy.model.to(device)
            hidden = policy.model.get_output_embeddings().weight
            projection = make_projection(hidden.shape[0], hidden.shape[1], sketch_dim=256, seed=args.seed)
        summary["parameters_m"] = sum(p.numel() for p in policy.model.parameters()) / 1e6
        with clock.phase("engine"):
            engine = make_engine(policy, projection, args, kind="hf" if args.dry_run else "vllm")
        batch = problems[: args.prompts]
        throughput = [{"engine": "hf" if args.dry_run else "vllm",
                       **rollout_throughput(engine, batch, args, device)}]
        if not args.dry_run:  # the same batch with HF generate, for comparison
            hf = make_engine(policy, projection, args, kind="hf")
            throughput.append({"engine": "hf", **rollout_throughput(hf, batch, args, device)})
        print_table("rollout throughput (one batch after a warm-up)", throughput)
        steps = []
        initial = {key: value.clone() for key, value in policy.model.state_dict().items()}
        for name, pruner in (("grpo", "none"), ("fastrl", "fastrl")):  # each method from the same weights
            policy.model.load_state_dict(initial)
            if hasattr(engine, "sync_weights"):
                engine.sync_weights(policy.model)
            steps += train_steps(name, pruner, policy, engine, problems, args, device)
        print_table("training steps (seconds per phase)", steps)
        trl_rows = [] if args.skip_trl else trl_steps(policy, problems, args, device, workdir)
        print_table("TRL plug-in", trl_rows)
        summary.update(setup_s=clock.seconds["setup"], engine_s=clock.seconds["engine"], throughput=throughput,
                       steps=steps, trl=trl_rows, total_s=time.perf_counter() - started)
    print(f"\ntotal {summary['total_s']:.1f} s on {summary['device']}")
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


if __name__ == "__main__":
    main()
