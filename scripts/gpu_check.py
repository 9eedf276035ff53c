#!/usr/bin/env python
"""GPU check: rollouts, GRPO and FastRL training steps (the trainer's own `Trainer.train_step`), and the TRL
plug-in on one GPU, in well under 10 minutes.

What it runs (no hub access needed; every model is built from a config with random weights):
  1. a Qwen2.5-VL at the real widths of Qwen2.5-VL-3B (text hidden 2048, MLP 11008, 16 heads / 2 KV heads,
     head_dim 128, mrope [16, 24, 24], tied embeddings; vision hidden 1280, 16 heads) and the real 151,936-row
     vocabulary, with few layers (`--layers`, `--vision-depth`), a byte-level BPE tokenizer trained locally on the
     synthetic task (~1k entries; the rows it cannot decode are never sampled), and the task's 112x112 diagrams;
  2. rollout throughput: one batch with the run's engine (`--engine`: vLLM when importable, else HF `generate` on
     the GPU) without a sketch (GRPO: on vLLM `logprobs=0`) and with the sketch FastRL reads (vLLM: the logprob
     sketch, flat top-K log-probs, nothing detokenized; HF: lm_head), the same seeds: the sketch's cost as one round
     of benchmarks/bench_vllm_sketch.py (`sketch_cost`: FastRL's / GRPO's generate seconds); with vLLM also the
     same batch with HF `generate` for comparison;
  3. `--steps` steps of plain GRPO (pruner `none`) and of FastRL (pruner `fastrl`), each from the same initial
     weights, through `fastrl_core.trainer.Trainer.train_step` (generate -> reward -> advantage -> sketch -> prune
     -> old + reference log-prob passes on kept rows -> update -> engine weight sync -> store): seconds per phase
     (the engine is wrapped so CUDA is synchronised after each of its calls: GPU work is charged to the phase that
     launched it), kept fraction, peak GPU memory per step, the seconds of the weight sync (part of `update`), and
     the gap between the sampler's and the trainer's log-probs (old pass recomputed: `recompute_old_logprobs`).
     Reward: the task's reward plus 0.1·(distinct words mod 3) (`CheckTrainer.score`), since random weights earn
     no task reward and all-zero rewards would leave FastRL nothing to keep (timings, not learning, are checked);
  4. the TRL plug-in: `--steps` steps each of TRL's `GRPOTrainer` and `FastRLGRPOTrainer` on a text Qwen2 of the
     same text widths (HF generation inside TRL); skipped when trl is not importable.
It prints one table per part and a JSON summary (also written to `--out`).

`--dry-run` runs the same code on CPU at tiny size with the HF engine (what CI can run); `--device cpu` runs the
real widths on CPU in float32 (slow: ~2 minutes for `--layers 1 --vision-depth 1 --prompts 2 --rollouts 4
--max-new-tokens 8 --steps 2 --skip-trl`):
    python scripts/gpu_check.py --dry-run
On a GPU machine (vLLM optional; without it the HF engine runs on the GPU):
    python scripts/gpu_check.py --out gpu_check.json
Measured on one H200 with the HF engine: docs/gpu.md, "Measured on one H200".
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from fastrl_core.algo.sketches import make_projection  # noqa: E402
from fastrl_core.run_config import load_config  # noqa: E402
from fastrl_core.run_setup import load_datasets  # noqa: E402
from fastrl_core.trainer import Trainer  # noqa: E402

TEMPLATE = "math"
METHODS = (("grpo", "none"), ("fastrl", "fastrl"))  # (name, pruner)


# ---------------------------------------------------------------------------------------------------- setup
def run_config(args, store: Path, *, pruner: str, engine: str, device: torch.device):
    """The trainer's config of one method: GRPO loss with a KL term (beta 0.01, so the reference pass runs), a
    fixed budget, the old pass recomputed by the trainer's forward for both engines (vLLM's numerics differ; the
    same cost on HF keeps the two comparable), the sketch each engine computes (`engines.resolve`)."""
    overrides = dict(
        run_name=f"gpu-check-{pruner}", store_dir=str(store), seed=args.seed, threads=args.threads,
        model="gpu-check", engine=engine, device=device.type, dataset="synthetic", template=TEMPLATE,
        synthetic_train=max(64, args.prompts * args.steps), synthetic_test=16, steps=args.steps,
        prompts_per_step=args.prompts, rollouts_per_prompt=args.rollouts, max_new_tokens=args.max_new_tokens,
        objective="grpo", lr=args.lr, warmup_steps=1, recompute_old_logprobs=True,
        sketch="logprob" if engine == "vllm" else "lm_head",
        sketch_dim=256, sketch_top_k=args.top_k, pruner=pruner, keep_ratio=0.5, min_keep=2, budget="fixed",
        eval_every=0, checkpoint_every=0, log_rollouts=True, update_rows=args.update_rows,
        share_prompts=not args.per_row_prompts, updates_per_step=args.updates,
        minibatch_grouping="prompts" if args.grouped_minibatches else "rows",
    )
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()] + ["objective_args.beta=0.01"])


def build_policy(problems, args):
    """Tiny policy (dry run) or a Qwen2.5-VL at Qwen2.5-VL-3B widths with `args.layers` layers, random weights."""
    from fastrl_core.data.templates import TEMPLATES
    from fastrl_core.policy import QWEN2_5_VL_3B_WIDTHS, build_policy as build_widths_policy, build_tiny_policy
    from fastrl_core.warmstart import tokenizer_corpus

    corpus = tokenizer_corpus(problems, TEMPLATES)
    if args.dry_run:
        return build_tiny_policy(corpus, vocab_size=512, seed=args.seed)
    from transformers import Qwen2VLImageProcessor

    # the real 151,936-row unembedding over a ~1k-entry local tokenizer: rows it cannot decode are never sampled
    widths = QWEN2_5_VL_3B_WIDTHS.replace(num_layers=args.layers, vision_depth=args.vision_depth)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32  # CPU bf16 matmuls are many times slower
    return build_widths_policy(corpus, widths, tokenizer_vocab_size=1024, seed=args.seed, dtype=dtype,
                               image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112))


def make_engine(policy, projection, args, *, kind: str):
    if kind == "hf":
        from fastrl_core.engines.hf import HFEngine

        return HFEngine(policy, template=TEMPLATE, max_new_tokens=args.max_new_tokens, sketch_projection=projection,
                        sketch_top_k=args.top_k, share_prompts=not args.per_row_prompts)
    from fastrl_core.engines.vllm import VLLMEngine

    return VLLMEngine(policy, template=TEMPLATE, max_new_tokens=args.max_new_tokens, sketch_projection=projection,
                      sketch_top_k=args.top_k, gpu_memory_utilization=args.gpu_memory_utilization,
                      enforce_eager=args.eager, dtype="bfloat16", max_model_len=1024, seed=args.seed)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Seconds per phase (CUDA synchronised, so GPU work is charged to the phase that launched it)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.seconds[name] += time.perf_counter() - start


class TimedEngine:
    """An `Engine` that runs `engine` and synchronises CUDA after each call, so the trainer's phase timer charges
    GPU work to the phase that launched it. Per step it also records the generated tokens, the seconds of
    `sync_weights`, and the mean |log-prob gap| between the sampler's behaviour log-probs and the trainer's old
    pass (the first no-grad `token_logprobs` on `model`)."""

    def __init__(self, engine, model: torch.nn.Module, device: torch.device) -> None:
        self.engine, self.model, self.device = engine, model, device
        self.reset()

    def reset(self) -> None:
        self.tokens, self.sync_seconds, self.logprob_gap, self._behaviour = 0, 0.0, float("nan"), None

    def generate(self, problems, rollouts_per_prompt, *, generator=None):
        rollouts = self.engine.generate(problems, rollouts_per_prompt, generator=generator)
        synchronize(self.device)
        self.tokens = int(rollouts.completion_mask.sum())
        self._behaviour = (rollouts.behaviour_logprobs, rollouts.completion_mask)
        return rollouts

    def token_logprobs(self, model, problems, rollouts, index):
        logprobs = self.engine.token_logprobs(model, problems, rollouts, index)
        synchronize(self.device)
        if model is self.model and not torch.is_grad_enabled() and self._behaviour is not None:
            behaviour, mask = (t[index].to(logprobs.device) for t in self._behaviour)
            self.logprob_gap = float(((logprobs - behaviour).abs() * mask).sum() / mask.sum().clamp(min=1))
            self._behaviour = None
        return logprobs

    def greedy(self, problems, *, batch_size: int = 64):
        texts = self.engine.greedy(problems, batch_size=batch_size)
        synchronize(self.device)
        return texts

    def sync_weights(self, model) -> None:
        start = time.perf_counter()
        self.engine.sync_weights(model)
        synchronize(self.device)
        self.sync_seconds += time.perf_counter() - start


def engine_factory(shared, args, device: torch.device):
    """The trainer's `engine_factory`: HF -> a fresh `HFEngine` per run (cheap); vLLM -> the one shared `LLM` (two
    would not fit beside the trainer), whose sketch settings follow each run's projection (GRPO computes none)."""

    def factory(config, policy, projection):
        if shared is None:
            from fastrl_core.run_setup import make_engine as make_run_engine

            engine = make_run_engine(config, policy, projection)
        else:
            engine = shared
            engine.sketch_projection = projection
            engine.sketch_top_k = config.sketch_top_k if projection is not None else 0
        return TimedEngine(engine, policy.model, device)

    return factory


class CheckTrainer(Trainer):
    """The trainer with a varied reward (module docstring, part 3)."""

    def score(self, completions, problems):
        parts = super().score(completions, problems)
        return [dataclasses.replace(part, overall=part.overall + 0.1 * (len(set(text.split())) % 3))
                for part, text in zip(parts, completions)]


# ---------------------------------------------------------------------------------------------------- parts
@contextmanager
def without_sketch(engine):
    """Within: `engine` samples as GRPO does, without a sketch projection (the same LLM or model and settings)."""
    saved = engine.sketch_projection, engine.sketch_top_k
    engine.sketch_projection, engine.sketch_top_k = None, 0
    try:
        yield engine
    finally:
        engine.sketch_projection, engine.sketch_top_k = saved


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


def train_steps(name: str, trainer: Trainer, args, device: torch.device) -> list[dict]:
    """`args.steps` calls of `trainer.train_step()`, one row each: the trainer's phase seconds (`t_<phase>`), kept
    count, optimiser updates, generated tokens, weight-sync seconds, sampler/trainer log-prob gap and peak GPU
    memory (MiB)."""
    engine = trainer.engine
    rows = []
    for _ in range(args.steps):
        engine.reset()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        row = trainer.train_step()
        seconds = {key[len("time_"):]: value for key, value in row.items() if key.startswith("time_")}
        rows.append({
            "method": name, "step": row["step"], "sampled": row["rollouts_sampled"], "kept": row["rollouts_kept"],
            "updates": row["updates"], "tokens": engine.tokens,
            "gen_tokens_per_s": engine.tokens / max(seconds["generate"], 1e-9),
            "logprob_gap": engine.logprob_gap, "loss": row.get("loss", float("nan")),
            **{f"t_{phase}": value for phase, value in seconds.items()}, "t_sync": engine.sync_seconds,
            "t_total": sum(seconds.values()),
            "peak_gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        })
    trainer.writer.finish()
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
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, HF engine")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where the real-width model runs (cpu: a slow check of the same path; dry run: cpu)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                        help="rollout engine: auto = vLLM when importable (never in a dry run), else HF")
    parser.add_argument("--steps", type=int, default=None, help="training steps per method (3; dry run 2)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (32; dry run 2)")
    parser.add_argument("--rollouts", type=int, default=None, help="rollouts per prompt (8; dry run 4)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="completion length (128; dry run 8)")
    parser.add_argument("--layers", type=int, default=4, help="text decoder layers at real width")
    parser.add_argument("--vision-depth", type=int, default=4, help="vision blocks at real width")
    parser.add_argument("--top-k", type=int, default=20, help="top-K log-probs for the sketch")
    parser.add_argument("--update-rows", type=int, default=0,
                        help="rollouts per forward/backward in the update (the trainer's update_rows; 0 = all)")
    parser.add_argument("--per-row-prompts", action="store_true",
                        help="HF engine: one forward per rollout, prompt included (share_prompts=false)")
    parser.add_argument("--updates", type=int, default=1, help="PPO updates per step (updates_per_step; paper 4)")
    parser.add_argument("--grouped-minibatches", action="store_true",
                        help="mini-batches of whole prompts (minibatch_grouping=prompts), with --updates > 1")
    parser.add_argument("--chunk-logits", type=int, default=None,
                        help="float32 logits per chunk of the log-prob head (engines/logprobs.CHUNK_LOGITS, 2^25); "
                             "to measure the chunk size on a GPU")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35, help="vLLM's share of the GPU")
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    parser.add_argument("--skip-trl", action="store_true", help="skip the TRL plug-in part")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (up to 8 cores; dry run 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON summary here")
    args = parser.parse_args(argv)
    defaults = dict(steps=(2, 3), prompts=(2, 32), rollouts=(4, 8), max_new_tokens=(8, 128),
                    threads=(1, min(8, os.cpu_count() or 1)))
    for key, (dry, real) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, dry if args.dry_run else real)
    if (args.dry_run or args.device == "cpu") and args.engine == "vllm":
        parser.error("on CPU (--dry-run, --device cpu) the HF engine runs; vLLM needs a GPU")
    if args.updates < 1:
        parser.error(f"--updates must be >= 1, got {args.updates}")
    if args.grouped_minibatches and args.updates == 1:
        parser.error("--grouped-minibatches needs --updates > 1 (one mini-batch holds every row either way)")
    if args.chunk_logits is not None and args.chunk_logits < 1:
        parser.error(f"--chunk-logits must be >= 1, got {args.chunk_logits}")
    return args


def engine_kind(args) -> tuple[str, str | None]:
    """(engine to use, why vLLM is not used or None)."""
    if args.dry_run or args.device == "cpu" or args.engine == "hf":
        return "hf", "dry run" if args.dry_run else ("--device cpu" if args.device == "cpu" else "--engine hf")
    if importlib.util.find_spec("vllm") is None:
        if args.engine == "vllm":
            from fastrl_core.engines.vllm import import_vllm

            import_vllm()  # raises the install hint
        return "hf", "vllm is not importable"
    return "vllm", None


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
    device = torch.device("cpu" if args.dry_run else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device; run with --dry-run (tiny) or --device cpu (real widths) on CPU")
    torch.set_num_threads(args.threads)
    if args.chunk_logits is not None:
        from fastrl_core.engines import logprobs

        logprobs.CHUNK_LOGITS = args.chunk_logits  # read at each call (chunked_token_logprobs)
    kind, no_vllm = engine_kind(args)
    started = time.perf_counter()
    summary: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                     "dry_run": args.dry_run, "engine": kind, "vllm_skipped": no_vllm,
                     "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
                     "args": {k: str(v) for k, v in vars(args).items()}}
    if no_vllm and not args.dry_run:
        print(f"gpu_check: vLLM part skipped ({no_vllm}); the HF engine runs on {device}")
    with tempfile.TemporaryDirectory(prefix="fastrl-gpu-check-") as tmp:
        workdir = Path(tmp)
        clock = Clock(device)
        configs = {name: run_config(args, workdir / "store", pruner=pruner, engine=kind, device=device)
                   for name, pruner in METHODS}
        with clock.phase("setup"):
            problems, _ = load_datasets(configs["grpo"])
            policy = build_policy(problems, args)
            policy.model.to(device)
            hidden = policy.model.get_output_embeddings().weight
            projection = make_projection(hidden.shape[0], hidden.shape[1], sketch_dim=256, seed=args.seed)
        summary["parameters_m"] = sum(p.numel() for p in policy.model.parameters()) / 1e6
        with clock.phase("engine"):
            engine = make_engine(policy, projection, args, kind=kind)
        batch = problems[: args.prompts]
        sketch = "logprob" if kind == "vllm" else "lm_head"
        with without_sketch(engine) as grpo:
            throughput = [{"engine": kind, "sketch": "none", **rollout_throughput(grpo, batch, args, device)}]
        throughput.append({"engine": kind, "sketch": sketch, **rollout_throughput(engine, batch, args, device)})
        summary["sketch_cost"] = throughput[1]["seconds"] / throughput[0]["seconds"]  # FastRL / GRPO generate
        if kind == "vllm":  # the same batch with HF generate, for comparison
            hf = make_engine(policy, projection, args, kind="hf")
            throughput.append({"engine": "hf", "sketch": "lm_head", **rollout_throughput(hf, batch, args, device)})
        print_table("rollout throughput (one batch after a warm-up)", throughput)
        print(f"the sketch's cost: FastRL / GRPO generate {summary['sketch_cost']:.3f}x (target <= 1.10 on vLLM)")
        steps = []
        initial = {key: value.clone() for key, value in policy.model.state_dict().items()}
        factory = engine_factory(engine if kind == "vllm" else None, args, device)
        for name, _ in METHODS:  # each method from the same weights (the trainer syncs the engine at start)
            policy.model.load_state_dict(initial)
            trainer = CheckTrainer(configs[name], policy=policy, engine_factory=factory, progress=False)
            steps += train_steps(name, trainer, args, device)
            del trainer
        print_table("training steps (seconds per phase; t_sync is part of t_update)", steps)
        trl_skipped = "--skip-trl" if args.skip_trl else ("trl is not importable"
                                                           if importlib.util.find_spec("trl") is None else None)
        trl_rows = [] if trl_skipped else trl_steps(policy, problems, args, device, workdir)
        print_table("TRL plug-in" + (f" (skipped: {trl_skipped})" if trl_skipped else ""), trl_rows)
        summary.update(setup_s=clock.seconds["setup"], engine_s=clock.seconds["engine"], throughput=throughput,
                       steps=steps, trl=trl_rows, trl_skipped=trl_skipped, total_s=time.perf_counter() - started)
    print(f"\ntotal {summary['total_s']:.1f} s on {summary['device']}")
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


if __name__ == "__main__":
    main()
