"""What the logprob sketch costs vLLM's generate, through the project's own engine: docs/notes.md §8's table of
SamplingParams, beside the engine's whole `generate` in GRPO and FastRL mode, in one run. Run on a quiet machine:

    .venv/bin/python benchmarks/bench_vllm_sketch.py --repeats 5            # ~2 min on 2 cores
    .venv/bin/python benchmarks/bench_vllm_sketch.py --repeats 1 --prompts 4  # smoke run

The engine is what `fastrl train paper engine=vllm sketch=logprob sketch_top_k=20` builds
(`run_setup.make_engine`, the trainer's projection): the shipped warm start, `--prompts` training problems (16) x
`--rollouts` (8), <= 32 new tokens, the same problems and request seeds every call. GRPO's engine is the same
engine without the projection (it asks for `logprobs=0`, the sampled token's log-prob only), on the same `LLM`.
Each repeat runs every variant once, in turn, so drift hits them all alike:
  - `llm.generate(requests, params)` after the prompts are prefilled (`engine._prefill`, as `generate` does), for
    each SamplingParams variant: no log-probs; logprobs=0; logprobs=20 (the sketch before issue 47); +flat;
    +detokenize=False; flat + detokenize=False (the sketch now); logprobs=0 flat + detokenize=False (GRPO now);
  - `engine.generate`, whole (prefill, sampling, unpacking, decoding, sketch), GRPO and FastRL;
  - `rollouts_from_outputs` alone on the raw outputs of the last two (unpacking, decoding, sketch).
Prints median [min, max] seconds per variant over the repeats, and FastRL's / GRPO's engine generate time
(per-repeat ratio of adjacent calls: median [min, max]) against the target: the sketch adds at most 10 % to
GRPO's vLLM generate (issue 47). A timing: valid on a quiet machine only.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

TARGET = 1.10  # FastRL's engine generate / GRPO's at most this (issue 47)
VARIANTS = {  # label -> SamplingParams overrides of the engine's own (`VLLMEngine._params`, FastRL mode)
    "no log-probs": dict(logprobs=None, flat_logprobs=False, detokenize=True),
    "logprobs=0": dict(logprobs=0, flat_logprobs=False, detokenize=True),
    "logprobs=20 (the sketch before issue 47)": dict(logprobs=20, flat_logprobs=False, detokenize=True),
    "logprobs=20, flat": dict(logprobs=20, flat_logprobs=True, detokenize=True),
    "logprobs=20, detokenize=False": dict(logprobs=20, flat_logprobs=False, detokenize=False),
    "logprobs=20, flat, detokenize=False (the sketch now)": dict(logprobs=20),
    "logprobs=0, flat, detokenize=False (GRPO now)": dict(logprobs=0),
}


def build(args):
    """(FastRL engine, GRPO engine on the same LLM, problems, rollout counts)."""
    import torch

    from fastrl_core.algo.sketches import make_projection
    from fastrl_core.policy import load_policy
    from fastrl_core.run_config import load_config
    from fastrl_core.run_setup import load_datasets, make_engine

    store = tempfile.mkdtemp(prefix="bench_vllm_sketch_")
    config = load_config("paper",
                         ["engine=vllm", "sketch=logprob", "sketch_top_k=20", f"threads={args.threads}",
                          f"store_dir={store}", f"prompts_per_step={args.prompts}",
                          f"rollouts_per_prompt={args.rollouts}"])
    torch.set_num_threads(args.threads)
    train, _ = load_datasets(config)
    policy = load_policy(config.model, device=config.device)
    out = policy.model.get_output_embeddings().weight
    projection = make_projection(out.shape[0], out.shape[1], sketch_dim=config.sketch_dim, seed=config.seed)
    fastrl = make_engine(config, policy, projection)
    grpo = copy.copy(fastrl)  # the same LLM, scorer and settings, without the sketch
    grpo.sketch_projection, grpo.sketch_top_k = None, 0
    return fastrl, grpo, train[: config.prompts_per_step], [config.rollouts_per_prompt] * config.prompts_per_step


def run(args) -> dict[str, list[float]]:
    """Seconds per variant per repeat (after one warm-up round) and the FastRL / GRPO ratio per repeat."""
    import torch

    from fastrl_core.engines.vllm import rollouts_from_outputs

    fastrl, grpo, problems, counts = build(args)
    requests = [fastrl._request(problem) for problem in problems]
    seeds = torch.randint(0, 2**31 - 1, (len(problems),), generator=torch.Generator().manual_seed(0)).tolist()
    prompt_index = list(range(len(problems)))

    def sample(engine, **overrides):
        engine._prefill(requests)
        params = [engine._params(n=count, seed=seed, **overrides) for count, seed in zip(counts, seeds)]
        return engine.llm.generate(requests, params, use_tqdm=False)

    def unpack(engine, outputs):
        return rollouts_from_outputs(outputs, prompt_index, pad_token_id=engine.pad_token_id,
                                     decode=engine.scorer.decode, top_k=engine.sketch_top_k,
                                     projection=engine.sketch_projection)

    raw = {"GRPO": sample(grpo), "FastRL": sample(fastrl)}  # the engines' own params: for the unpacking rows
    timed = {**{f"llm.generate: {label}": (lambda o=o: sample(fastrl, **o)) for label, o in VARIANTS.items()},
             **{f"engine.generate: {name}": (lambda e=engine: e.generate(problems, counts,
                                                                       generator=torch.Generator().manual_seed(0)))
                for name, engine in (("GRPO", grpo), ("FastRL", fastrl))},
             **{f"rollouts_from_outputs: {name}": (lambda e=engine, o=raw[name]: unpack(e, o))
                for name, engine in (("GRPO", grpo), ("FastRL", fastrl))}}
    seconds: dict[str, list[float]] = {label: [] for label in timed}
    for repeat in range(args.repeats + 1):  # round 0 warms up
        for label, call in timed.items():
            start = time.perf_counter()
            call()
            if repeat:
                seconds[label].append(time.perf_counter() - start)
    seconds["ratio"] = [f / g for f, g in zip(seconds["engine.generate: FastRL"], seconds["engine.generate: GRPO"])]
    return seconds


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=8)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))  # before vLLM starts (engines/vllm.py)
    seconds = run(args)
    ratio = seconds.pop("ratio")
    print(f"\n{args.prompts} prompts x {args.rollouts} rollouts, <= 32 tokens, {args.threads} threads, "
          f"{args.repeats} repeats: seconds, median [min, max]")
    for label, values in seconds.items():
        print(f"  {label:72s} {spread(values)}")
    median = statistics.median(ratio)
    print(f"\nFastRL / GRPO engine generate: {spread(ratio).strip()}x; target <= {TARGET:.2f}x: "
          f"{'met' if median <= TARGET else 'missed'} (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
