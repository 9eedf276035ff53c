"""HF engine vs vLLM on the same prompts, at several widths, with and without the sketch; and where vLLM's generate
time goes at the bench's size. Run on a quiet machine (2 threads):

    .venv/bin/python benchmarks/bench_engines.py                       # every size, both engines, sketch on/off
    .venv/bin/python benchmarks/bench_engines.py --sizes embedded,h512 --repeats 3
    .venv/bin/python benchmarks/bench_engines.py --profile             # vLLM's generate, variant by variant

Sizes (fastrl_core.policy.VLMWidths; random weights except `embedded`, the shipped warm start; the vision tower
stays tiny except for 3b2):
  embedded  text hidden 128, 2 layers (what the demo and the paper-regime bench train)
  h512      hidden 512, 4 layers, 8 heads / 2 kv
  h1024     hidden 1024, 4 layers, 16 heads / 2 kv
  3b2       Qwen2.5-VL-3B widths (hidden 2048, 151,936-row vocabulary), 2 text layers, 1 vision block

Each (size, engine) runs in its own process, so its peak RSS is its own; inside it, the sketch-on and sketch-off
engines alternate over the repeats (vLLM: one LLM shared by both). A step is `--prompts` prompts x `--rollouts`
rollouts (default 16 x 8, the paper regime's step), at most `--tokens` new tokens, the same seeds for both engines.
Prints, per row: start-up s, median generate s, rollouts/s, completion tokens/s, peak RSS MiB. The sketch is the
HF engine's lm_head sketch and vLLM's logprob sketch (top-20 log-probs), each as the trainer asks for it.

--profile (embedded size, vLLM only) times the same step under variants that isolate one cost each, on one LLM:
prompts prefilled once before their n rollouts (the engine's default) or not, seeded vs unseeded requests,
n per request vs one request per rollout, top-K log-probs or none, the same images re-submitted (processor and
encoder caches) vs after a cache reset, and a 1-token request (fixed per-call overhead); then the
top functions of a cProfile of one generate. Pass --threads to compare thread counts (OMP_NUM_THREADS is set from it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = ("embedded", "h512", "h1024", "3b2")


def widths(size: str):
    from fastrl_core.policy import QWEN2_5_VL_3B_TWO_LAYERS, VLMWidths

    return {"h512": VLMWidths(hidden_size=512, intermediate_size=1408, num_layers=4, num_heads=8, num_kv_heads=2),
            "h1024": VLMWidths(hidden_size=1024, intermediate_size=2816, num_layers=4, num_heads=16, num_kv_heads=2),
            "3b2": QWEN2_5_VL_3B_TWO_LAYERS}[size]


def make_policy(size: str):
    from fastrl_core.policy import build_random_policy, load_policy

    return load_policy("embedded") if size == "embedded" else build_random_policy(widths(size), seed=0)


def problems(count: int):
    from fastrl_core.data.problems import load_problems
    from fastrl_core.data.synthetic import ensure_dataset

    return load_problems(ensure_dataset(REPO / "runs" / "data") / "train")[:count]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_engines(engine: str, policy, tokens: int):
    """{"sketch": engine with the trainer's sketch for that engine, "no sketch": without} and start-up seconds."""
    import torch

    from fastrl_core.algo.sketches import make_projection

    out = policy.model.get_output_embeddings().weight
    projection = make_projection(out.shape[0], out.shape[1], sketch_dim=256, seed=0)
    start = time.perf_counter()
    if engine == "hf":
        from fastrl_core.engines.hf import HFEngine

        engines = {"no sketch": HFEngine(policy, max_new_tokens=tokens),
                   "sketch": HFEngine(policy, max_new_tokens=tokens, sketch_projection=projection, sketch_top_k=20)}
    else:
        from fastrl_core.engines.vllm import VLLMEngine

        plain = VLLMEngine(policy, max_new_tokens=tokens)
        engines = {"no sketch": plain, "sketch": VLLMEngine(policy, max_new_tokens=tokens, sketch_projection=projection,
                                                            sketch_top_k=20, llm=plain.llm)}
    torch.manual_seed(0)
    return engines, time.perf_counter() - start


def measure(args) -> dict:
    """One (size, engine) in this process: a JSON-able row per sketch setting."""
    import torch

    torch.set_num_threads(args.threads)
    policy = make_policy(args.size)
    batch = problems(args.prompts)
    counts = [args.rollouts] * len(batch)
    engines, startup = make_engines(args.engine, policy, args.tokens)
    seconds = {name: [] for name in engines}
    tokens = {name: 0 for name in engines}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up
        for name, engine in engines.items():
            start = time.perf_counter()
            with torch.no_grad():
                rollouts = engine.generate(batch, counts, generator=torch.Generator().manual_seed(repeat))
            if repeat:
                seconds[name].append(time.perf_counter() - start)
                tokens[name] += int(rollouts.completion_mask.sum())
    rows = []
    for name in engines:
        median = statistics.median(seconds[name])
        rows.append({"size": args.size, "engine": args.engine, "sketch": name, "startup_s": round(startup, 2),
                     "generate_s": round(median, 3), "rollouts_per_s": round(len(counts) * args.rollouts / median, 1),
                     "tokens_per_s": round(tokens[name] / sum(seconds[name]), 1),
                     "peak_rss_mib": round(peak_rss_mib())})
    return {"rows": rows}


def profile(args) -> dict:
    """vLLM's generate at the bench's size, one variant at a time on one LLM (module docstring)."""
    import cProfile
    import io
    import pstats

    import torch

    from fastrl_core.engines.vllm import VLLMEngine

    torch.set_num_threads(args.threads)
    policy = make_policy("embedded")
    batch = problems(args.prompts)
    engine = VLLMEngine(policy, max_new_tokens=args.tokens)
    llm, requests = engine.llm, [engine._request(problem) for problem in batch]
    seeds = list(range(len(batch)))

    def params(n, seed, logprobs=0, max_tokens=args.tokens):  # the engine's own (flat, nothing detokenized)
        return engine._params(n=n, seed=seed, logprobs=logprobs, max_tokens=max_tokens)

    def prefilled(run):
        llm.reset_prefix_cache()
        engine._prefill(requests)
        return run()

    variants = {
        "n per request, seeded, logprobs=0 (no prefill)": lambda: (llm.reset_prefix_cache(), llm.generate(
            requests, [params(args.rollouts, s) for s in seeds], use_tqdm=False)),
        "engine as trained (prompts prefilled once, then n)": lambda: prefilled(lambda: llm.generate(
            requests, [params(args.rollouts, s) for s in seeds], use_tqdm=False)),
        "prefilled, unseeded": lambda: prefilled(lambda: llm.generate(
            requests, [params(args.rollouts, None) for _ in seeds], use_tqdm=False)),
        "prefilled, top-20 log-probs (sketch)": lambda: prefilled(lambda: llm.generate(
            requests, [params(args.rollouts, s, logprobs=20) for s in seeds], use_tqdm=False)),
        "prefilled, one request per rollout (n=1)": lambda: prefilled(lambda: llm.generate(
            [r for r in requests for _ in range(args.rollouts)],
            [params(1, s * args.rollouts + i) for s in seeds for i in range(args.rollouts)], use_tqdm=False)),
        "prefilled, after encoder + mm cache reset": lambda: (llm.llm_engine.reset_encoder_cache(),
                                                              llm.reset_mm_cache(), prefilled(lambda: llm.generate(
                                                                  requests, [params(args.rollouts, s) for s in seeds],
                                                                  use_tqdm=False))),
        "1 prompt, n=1, 1 token (fixed overhead)": lambda: llm.generate(requests[:1], params(1, 0, max_tokens=1),
                                                                        use_tqdm=False),
        "16 prompts, n=1, 1 token (prefill + per-request)": lambda: llm.generate(
            requests, [params(1, s, max_tokens=1) for s in seeds], use_tqdm=False),
    }
    times = {name: [] for name in variants}
    for repeat in range(args.repeats + 1):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            if repeat:
                times[name].append(time.perf_counter() - start)
    profiler = cProfile.Profile()
    profiler.enable()
    variants["engine as trained (prompts prefilled once, then n)"]()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    return {"variants": {name: round(statistics.median(t), 4) for name, t in times.items()},
            "cprofile_tottime": text.getvalue()}


def child(args, mode: str, **extra) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--threads", str(args.threads), "--prompts",
               str(args.prompts), "--rollouts", str(args.rollouts), "--tokens", str(args.tokens), "--repeats",
               str(args.repeats), *[f"--{key}={value}" for key, value in extra.items()]]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_LOGGING_LEVEL": "WARNING",
           "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        return {"error": (result.stdout + result.stderr).strip().splitlines()[-1:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="vLLM's generate time, variant by variant")
    parser.add_argument("--child", choices=("measure", "profile"), help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args) if args.child == "measure" else profile(args)))
        return 0
    if args.profile:
        result = child(args, "profile")
        if "error" in result:
            print("profile failed:", *result["error"])
            return 1
        for name, seconds in result["variants"].items():
            print(f"{name:52s} {seconds:8.3f} s")
        print(result["cprofile_tottime"])
        return 0
    print(f"{'size':9s} {'engine':6s} {'sketch':9s} {'start s':>8s} {'gen s':>7s} {'roll/s':>7s} {'tok/s':>7s} "
          f"{'peak MiB':>8s}   ({args.prompts} prompts x {args.rollouts} rollouts, <= {args.tokens} tokens, "
          f"{args.threads} threads)")
    failed = 0
    for size in args.sizes.split(","):
        for engine in args.engines.split(","):
            result = child(args, "measure", size=size, engine=engine)
            if "error" in result:
                failed += 1
                print(f"{size:9s} {engine:6s} failed: {' '.join(result['error'])}")
                continue
            for row in result["rows"]:
                print(f"{row['size']:9s} {row['engine']:6s} {row['sketch']:9s} {row['startup_s']:8.2f} "
                      f"{row['generate_s']:7.3f} {row['rollouts_per_s']:7.1f} {row['tokens_per_s']:7.1f} "
                      f"{row['peak_rss_mib']:8d}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
