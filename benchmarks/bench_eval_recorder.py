"""What the streamed log-probs and lm_head sketch cost during a mean@k evaluation (the last note's lead 3).

    .venv/bin/python benchmarks/bench_eval_recorder.py [--repeats 15] [--problems 64] [--samples 4]

`evaluate_with` samples through `HFEngine.generate`, which also streams behaviour log-probs and sketches
(`_StepRecorder`) that evaluation throws away. This times that call against the same HF `generate` without the
recorder (same prompts, same RNG seed, so the same tokens: checked), interleaved, on the shipped warm start with
the trainer's sketch (whole vocabulary, dim 256), 2 threads. Prints median (min) seconds of each and their ratio.
"""
import argparse
import statistics
import time
from pathlib import Path

import torch

from fastrl_core.algo.sketches import make_projection
from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import ensure_dataset
from fastrl_core.engines.hf import HFEngine
from fastrl_core.policy import load_policy


def generate_without_recorder(engine: HFEngine, problems, counts, generator) -> torch.Tensor:
    """HFEngine.generate's own generate call minus its stopping criterion: (N, prompt + T) sequences."""
    prompt_index = torch.repeat_interleave(torch.arange(len(problems)), torch.as_tensor(counts))
    prompts = engine.prompt_batch(problems)
    config = engine._generation_config(do_sample=True, max_new_tokens=engine.max_new_tokens)
    seed = int(torch.randint(0, 2**63 - 1, (), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return engine._run_generate(prompts, prompt_index, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    policy = load_policy("embedded")
    problems = load_problems(ensure_dataset(Path("runs/data")) / "test")[: args.problems]  # as bench_engine.py
    out = policy.model.get_output_embeddings().weight
    engine = HFEngine(policy, template="math", max_new_tokens=32, temperature=1.0, sketch_top_k=None,
                      sketch_projection=make_projection(out.shape[0], out.shape[1], sketch_dim=256, seed=0))
    policy.model.eval()
    counts = [args.samples] * len(problems)
    prompt_length = engine.prompt_batch(problems).input_ids.shape[1]
    times = {"with recorder": [], "without": []}
    same = True
    for k in range(args.repeats):
        start = time.perf_counter()
        rollouts = engine.generate(problems, counts, generator=torch.Generator().manual_seed(k))
        times["with recorder"].append(time.perf_counter() - start)
        start = time.perf_counter()
        sequences = generate_without_recorder(engine, problems, counts, torch.Generator().manual_seed(k))
        times["without"].append(time.perf_counter() - start)
        mask = rollouts.completion_mask
        same &= torch.equal(sequences[:, prompt_length:][mask], rollouts.completion_ids[mask])
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:14s} median {medians[name]:.3f} s (min {min(values):.3f}) over {args.repeats} repeats")
    print(f"{len(counts)} problems x {args.samples} samples; recorder / plain = "
          f"{medians['with recorder'] / medians['without']:.3f}; identical tokens: {same}")


if __name__ == "__main__":
    main()
