"""What sharing a prompt across its rollouts saves in the HF engine: 16 prompts x 8 rollouts, 32 new tokens, 2 threads.

    .venv/bin/python benchmarks/bench_engine.py [model]      (model: "embedded" or a path)

Three engines, interleaved over 7 repeats (so load from other processes hits all alike):
  shared           each prompt's image encoded once and the prompt through the decoder once (the default)
  per-row prompts  images shared, every row's prompt through the decoder on its own (share_prompts=False)
  per-row          pixels repeated per row too (share_images=False, share_prompts=False)
Prints median (min) seconds of generate and of a re-scoring forward + backward, and whether each engine sampled the same tokens as the first."""
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
engines = {
    "shared": HFEngine(policy, max_new_tokens=32),
    "per-row prompts": HFEngine(policy, max_new_tokens=32, share_prompts=False),
    "per-row": HFEngine(policy, max_new_tokens=32, share_images=False, share_prompts=False),
}
times = {name: {"generate": [], "logprob": []} for name in engines}
same_tokens = {name: True for name in engines}
for k in range(7):
    first = None
    for name, engine in engines.items():
        engine.prompt_batch(problems)
        t = time.perf_counter()
        rollouts = engine.generate(problems, counts, generator=torch.Generator().manual_seed(k))
        times[name]["generate"].append(time.perf_counter() - t)
        first = rollouts if first is None else first
        same_tokens[name] &= torch.equal(rollouts.completion_ids, first.completion_ids)
        t = time.perf_counter()
        logprobs = engine.token_logprobs(policy.model, problems, rollouts, torch.arange(len(rollouts)))
        logprobs.sum().backward()
        policy.model.zero_grad(set_to_none=True)
        times[name]["logprob"].append(time.perf_counter() - t)
prompt_tokens = engines["shared"].prompt_batch(problems).attention_mask.sum(1).float().mean()
for name, phases in times.items():
    print(f"{name:16} " + "  ".join(f"{phase} {statistics.median(v):.3f} s (min {min(v):.3f})"
                                    for phase, v in phases.items()) + f"  same tokens: {same_tokens[name]}")
print(f"{len(rollouts)} rollouts; mean prompt tokens {prompt_tokens:.1f}, "
      f"mean completion tokens {rollouts.completion_mask.sum(1).float().mean():.1f}")
