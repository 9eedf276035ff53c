"""Memory and time of `HFEngine.generate` at Qwen2.5-VL's real vocabulary (issue 13 §1): streamed behaviour
log-probs and lm_head sketches vs the (N, T, V) logits they replace.

    .venv/bin/python benchmarks/bench_generate_memory.py                # all cores torch sees
    .venv/bin/python benchmarks/bench_generate_memory.py --threads 1    # a shared machine

Model (random weights, built by `fastrl_core.policy.build_policy`): Qwen2.5-VL-3B's text widths (hidden 2048,
MLP 11008, 16 heads / 2 KV heads, head_dim 128) with `--layers` decoder layers (2), the real 151,936-row vocabulary,
and a tiny vision tower (1 block, hidden 128); the project's locally trained 1,024-entry tokenizer. A random model
samples ids beyond the tokenizer almost always: `HFEngine.decode` drops them, so the texts are mostly empty, which
does not matter here. EOS is never sampled (`min_new_tokens` = `max_new_tokens`), so every rollout runs all steps.
8 prompts of the synthetic task, `rollouts / 8` rollouts each.

Each configuration runs in a FRESH subprocess, under an address-space limit of `--cap-gib` (8 GiB, also checked
against an estimate before starting): after the model is built the process's peak RSS is reset
(/proc/self/clear_refs 5, which also resets `ru_maxrss`), so "peak" = `resource.getrusage(...).ru_maxrss` over
generate alone, "growth" = peak − RSS just before generate. Configurations:
  plain     generate + behaviour log-probs (no sketch projection)
  sketch-V  + sketch over the whole vocabulary (top_k None)
  sketch-64 + top-K 64 sketch (the engine's default)
at `--rollouts` x `--tokens` (64 x 256), and at a small size (`--small`, 16 x 64) also
  old       the former path: generate(output_logits, output_hidden_states), logits stacked to (N, T, V) float32,
            log-softmax + gather, then a top-64 `LmHeadSketcher` over the stacked steps
            (`fastrl_core.engines.stacked_reference`, also the reference of tests/test_engine.py). Never at full size: 64 x 256 would be ~10 GB of logits alone.
Printed: peak, growth, seconds of generate, seconds inside `LmHeadSketcher.update` (timed by wrapping it), and
  - growth beyond plain as % of the (N, T, V) float32 logits size   (target <= 25 %)
  - top-K sketch time as % of plain generate: wall difference, and time inside update   (target <= 10 %).
Timings on a loaded machine are not results; the memory figures hardly depend on load.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

VOCAB = 151_936
PROMPTS = 8
GIB = 1 << 30


def widths(layers: int):
    from fastrl_core.policy import QWEN2_5_VL_3B_WIDTHS

    return QWEN2_5_VL_3B_WIDTHS.replace(num_layers=layers, vision_depth=1, vision_hidden_size=128,
                                        vision_intermediate_size=256, vision_heads=2, vocab_size=VOCAB)


def estimate_bytes(layers: int, rollouts: int, tokens: int, prompt_length: int = 128) -> int:
    """Float32 weights + prefill activations + KV cache + per-step (N, V) transients, + 1.5 GiB for the runtime."""
    w = widths(layers)
    head_dim = w.hidden_size // w.num_heads
    per_layer = (2 * w.hidden_size * w.hidden_size + 2 * w.hidden_size * w.num_kv_heads * head_dim
                 + 3 * w.hidden_size * w.intermediate_size)
    weights = 4 * (2 * VOCAB * w.hidden_size + layers * per_layer)
    prefill = 4 * rollouts * prompt_length * (4 * w.intermediate_size + 8 * w.hidden_size)
    cache = 4 * 2 * layers * rollouts * w.num_kv_heads * head_dim * (prompt_length + tokens)
    step = 4 * 6 * rollouts * VOCAB
    return weights + prefill + cache + step + int(1.5 * GIB)


def rss_kib() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def reset_peak_rss() -> int:
    """Reset this process's peak RSS (VmHWM, ru_maxrss) to its current RSS; returns that RSS in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return rss_kib()


def peak_rss_kib() -> int:
    """This process's peak RSS since start or the last `reset_peak_rss`, in KiB (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(args) -> None:
    """One configuration in this (fresh) process; prints one JSON line."""
    resource.setrlimit(resource.RLIMIT_AS, (args.cap_gib * GIB, args.cap_gib * GIB))
    import torch

    torch.set_num_threads(args.threads)
    from fastrl_core.algo import sketches
    from fastrl_core.algo.sketches import make_projection
    from fastrl_core.data.problems import load_problems
    from fastrl_core.data.synthetic import ensure_dataset
    from fastrl_core.data.templates import TEMPLATES
    from fastrl_core.engines.hf import HFEngine
    from fastrl_core.engines.stacked_reference import stacked_generate
    from fastrl_core.policy import build_policy
    from fastrl_core.warmstart import tokenizer_corpus

    class FixedLengthEngine(HFEngine):
        """Every rollout runs all `max_new_tokens` steps (EOS masked out by `min_new_tokens`)."""

        def _generation_config(self, **kwargs):
            config = super()._generation_config(**kwargs)
            config.min_new_tokens = config.max_new_tokens
            return config

    sketch_seconds = [0.0]
    update = sketches.LmHeadSketcher.update

    def timed_update(self, *update_args):
        start = time.perf_counter()
        update(self, *update_args)
        sketch_seconds[0] += time.perf_counter() - start

    sketches.LmHeadSketcher.update = timed_update

    problems = load_problems(ensure_dataset(ROOT / "runs" / "data") / "train")[:PROMPTS]
    policy = build_policy(tokenizer_corpus(problems, TEMPLATES), widths(args.layers), tokenizer_vocab_size=1024)
    top_k = {"plain": None, "sketch-V": None, "sketch-64": 64, "old": 64}[args.child]
    projection = None if args.child == "plain" else make_projection(VOCAB, policy.model.config.text_config.hidden_size)
    engine = FixedLengthEngine(policy, max_new_tokens=args.tokens, sketch_projection=projection, sketch_top_k=top_k)
    counts = [args.rollouts // PROMPTS] * PROMPTS
    engine.prompt_batch(problems)  # tokenise outside the measured part
    before = reset_peak_rss()
    start = time.perf_counter()
    if args.child == "old":
        ids = stacked_generate(engine, problems, counts, torch.Generator().manual_seed(0))["ids"]
    else:
        ids = engine.generate(problems, counts, generator=torch.Generator().manual_seed(0)).completion_ids
    seconds = time.perf_counter() - start
    peak = peak_rss_kib()
    print(json.dumps(dict(config=args.child, rollouts=len(ids), tokens=ids.shape[1], before_kib=before,
                          peak_kib=peak, seconds=seconds, sketch_seconds=sketch_seconds[0],
                          prompt_length=int(engine.prompt_batch(problems).input_ids.shape[1]))))


def run_child(config: str, rollouts: int, tokens: int, args) -> dict:
    command = [sys.executable, __file__, "--child", config, "--rollouts", str(rollouts), "--tokens", str(tokens),
               "--layers", str(args.layers), "--threads", str(args.threads), "--cap-gib", str(args.cap_gib)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"bench_generate_memory: {config} at {rollouts} x {tokens} failed "
                         f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rollouts", type=int, default=64, help=f"a multiple of {PROMPTS}")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--small", default="16x64", help="rollouts x tokens of the old-path comparison")
    parser.add_argument("--layers", type=int, default=2, help="text decoder layers")
    parser.add_argument("--cap-gib", type=int, default=8, help="address-space limit of each subprocess")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    small_rollouts, small_tokens = (int(x) for x in args.small.split("x"))
    for n in (args.rollouts, small_rollouts):
        if n % PROMPTS:
            raise SystemExit(f"bench_generate_memory: rollouts must be a multiple of {PROMPTS}, got {n}")
    need = estimate_bytes(args.layers, args.rollouts, args.tokens)
    print(f"estimated peak of one full-size process {need / GIB:.2f} GiB (cap {args.cap_gib} GiB); "
          f"threads {args.threads}, {args.layers} text layers, V = {VOCAB:,}")
    if need > args.cap_gib * GIB:
        raise SystemExit("bench_generate_memory: the full-size configuration would not fit the cap; "
                         "lower --rollouts / --tokens / --layers")
    rows = [run_child(c, args.rollouts, args.tokens, args) for c in ("plain", "sketch-V", "sketch-64")]
    rows += [run_child(c, small_rollouts, small_tokens, args) for c in ("plain", "sketch-64", "old")]

    print(f"\n{'config':>10} {'N x T':>9} {'(N,T,V) f32':>12} {'peak GiB':>9} {'growth GiB':>11} "
          f"{'vs plain GiB':>13} {'% of NTV':>9} {'gen s':>8} {'sketch s':>9} {'sketch %':>9}")
    plain = {}
    for row in rows:
        size = (row["rollouts"], row["tokens"])
        logits_bytes = 4 * row["rollouts"] * row["tokens"] * VOCAB
        growth = (row["peak_kib"] - row["before_kib"]) * 1024
        if row["config"] == "plain":
            plain[size] = (growth, row["seconds"])
        base_growth, base_seconds = plain[size]
        extra = growth - base_growth
        print(f"{row['config']:>10} {row['rollouts']:>4} x {row['tokens']:<4}{logits_bytes / GIB:>11.2f} "
              f"{row['peak_kib'] * 1024 / GIB:>9.2f} {growth / GIB:>11.3f} {extra / GIB:>13.3f} "
              f"{100 * extra / logits_bytes:>8.1f}% {row['seconds']:>8.1f} {row['sketch_seconds']:>9.2f} "
              f"{100 * row['sketch_seconds'] / base_seconds:>8.1f}%")
    full = {row["config"]: row for row in rows[:3]}
    logits_bytes = 4 * args.rollouts * args.tokens * VOCAB
    base = full["plain"]
    print(f"\nat {args.rollouts} x {args.tokens} (prompt {base['prompt_length']} tokens), "
          f"(N, T, V) float32 logits = {logits_bytes / GIB:.2f} GiB:")
    for name in ("sketch-V", "sketch-64"):
        row = full[name]
        extra = (row["peak_kib"] - row["before_kib"] - base["peak_kib"] + base["before_kib"]) * 1024
        wall = 100 * (row["seconds"] - base["seconds"]) / base["seconds"]
        inside = 100 * row["sketch_seconds"] / base["seconds"]
        print(f"  {name:>9}: growth beyond plain {100 * extra / logits_bytes:5.1f} % of (N,T,V) (target <= 25 %); "
              f"time {wall:+5.1f} % of plain generate by wall clock, {inside:4.1f} % inside update "
              f"(target <= 10 %)")
    small = {row["config"]: row for row in rows[3:]}
    old_extra = (small["old"]["peak_kib"] - small["old"]["before_kib"]
                 - small["plain"]["peak_kib"] + small["plain"]["before_kib"]) * 1024
    print(f"  old path at {small_rollouts} x {small_tokens}: growth beyond streamed plain {old_extra / GIB:.2f} GiB "
          f"= {100 * old_extra / (4 * small_rollouts * small_tokens * VOCAB):.0f} % of its (N,T,V) "
          f"({4 * small_rollouts * small_tokens * VOCAB / GIB:.2f} GiB)")


if __name__ == "__main__":
    main()
