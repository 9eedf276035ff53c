"""Shared vs per-rollout image encoding in the HF engine: 16 prompts x 8 rollouts, 32 new tokens, 2 threads.

    .venv/bin/python benchmarks/bench_engine.py [model]      (model: "embedded" or a path)
Prints median (min) seconds over 7 interleaved repeats: generate, re-scoring forward + backward, vision tower alone.
"""
import statistics, sys, time
from pathlib import Path
import torch
from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import ensure_dataset
from fastrl_core.engines.hf import HFEngine
from fastrl_core.policy import load_policy

torch.set_num_threads(2)
policy = load_policy(sys.argv[1] if len(sys.argv) > 1 else "embedded")
problems = load_problems(ensure_dataset(Path("runs/data")) / "train")[:16]
counts = [8] * 16
engines = {share: HFEngine(policy, share_images=share, max_new_tokens=32) for share in (True, False)}
times = {share: {"generate": [], "logprob": [], "vision": []} for share in engines}
for k in range(7):
    for share, engine in engines.items():  # interleaved, so load from other processes hits both paths alike
        engine.prompt_batch(problems)
        t = time.perf_counter()
        rollouts = engine.generate(problems, counts, generator=torch.Generator().manual_seed(k))
        times[share]["generate"].append(time.perf_counter() - t)
        t = time.perf_counter()
        logprobs = engine.token_logprobs(policy.model, problems, rollouts, torch.arange(len(rollouts)))
        logprobs.sum().backward()
        policy.model.zero_grad(set_to_none=True)
        times[share]["logprob"].append(time.perf_counter() - t)
        t = time.perf_counter()
        inputs = engine._vision_inputs(policy.model, engine.prompt_batch(problems), rollouts.prompt_index)
        if not share:
            policy.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        times[share]["vision"].append(time.perf_counter() - t)
for share, phases in times.items():
    print(f"share_images={share!s:5} " + "  ".join(
        f"{name} {statistics.median(v):.3f} s (min {min(v):.3f})" for name, v in phases.items()))
print(f"mean completion tokens {rollouts.completion_mask.sum(1).float().mean():.1f}, rollouts {len(rollouts)}")
