"""Synthetic but well-formed training steps, for store tests, benchmarks and app development without a trainer.

Rewards, advantages and keep decisions follow the real definitions (GRPO advantages within a group; kept = the
rollouts with nonzero advantage, at least `min_kept` per group), so every cross-table invariant holds.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from fastrl_core.store.schema import PHASES
from fastrl_core.store.writer import RunWriter, image_key


def prompt_png(prompt_index: int, size: int = 112) -> bytes:
    """A small grey diagram with `1 + prompt_index % 4` dots, as PNG bytes (deterministic per prompt)."""
    image = Image.new("RGB", (size, size), (123, 117, 104))
    draw = ImageDraw.Draw(image)
    rng = np.random.default_rng(prompt_index)
    radius = max(1, size // 18)
    for _ in range(1 + prompt_index % 4):
        x, y = rng.integers(radius, size - radius, size=2)
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(20, 20, 20))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def fake_step(step: int, *, prompts: int = 16, rollouts_per_prompt: int = 8, sketch_dim: int = 256,
                   dataset_size: int = 64, seed: int = 0, pngs: dict[int, bytes] | None = None) -> dict:
    """Keyword arguments for `RunWriter.write_step(step, **fake_step(step))`.

    Prompts are drawn from `dataset_size` distinct prompts (their images repeat across steps, as in training);
    `pngs` caches prompt images between calls.
    """
    rng = np.random.default_rng([seed, step])
    pngs = {} if pngs is None else pngs
    prompt_indices = rng.choice(dataset_size, size=prompts, replace=False)
    counts = np.full(prompts, rollouts_per_prompt)
    if rollouts_per_prompt > 2:  # an adaptive budget: some prompts get fewer rollouts
        counts -= rng.integers(0, 2, size=prompts) * (step % 3)
    groups, rollouts, images = [], [], {}
    for prompt_index, count in zip(prompt_indices, counts):
        prompt_id = f"p{prompt_index:05d}"
        if prompt_index not in pngs:
            pngs[prompt_index] = prompt_png(int(prompt_index))
        png = pngs[prompt_index]
        ref = image_key(png)
        images[ref] = png
        correct = rng.random(count) < rng.random()
        formatted = rng.random(count) < 0.9
        reward = 1.0 * correct + 0.5 * formatted
        advantage = (reward - reward.mean()) / (reward.std() + 1e-4)
        kept = np.abs(advantage) > 1e-6
        answer = str(1 + prompt_index % 4)
        for j in range(count):
            text = answer if correct[j] else str(rng.integers(1, 5))
            rollouts.append({
                "rollout_id": f"s{step}-{prompt_id}-{j}", "prompt_id": prompt_id, "image_ref": ref,
                "question": "How many dots are in the picture?", "answer": answer,
                "completion": f"<thinking>I count the dots one by one {'.' * int(rng.integers(20, 200))}"
                              f"</thinking> \\boxed{{{text}}}",
                "reward": float(reward[j]), "format_reward": 0.5 * float(formatted[j]),
                "accuracy_reward": float(correct[j]), "advantage": float(advantage[j]), "kept": bool(kept[j]),
                "reason": "nonzero_advantage" if kept[j] else "zero_advantage",
                "score": float(abs(advantage[j])), "weight": 1.0 if kept[j] else None,
                "length": int(rng.integers(20, 120)),
                "sketch": rng.standard_normal(sketch_dim, dtype=np.float32) * float(advantage[j]),
            })
        groups.append({"prompt_id": prompt_id, "reward_mean": float(reward.mean()),
                       "reward_std": float(reward.std()), "sampled": int(count), "kept": int(kept.sum())})
    kept_total = sum(r["kept"] for r in rollouts)
    step_row = {
        "rollouts_sampled": len(rollouts), "rollouts_kept": kept_total,
        "rollouts_per_prompt": len(rollouts) / prompts,
        "reward_mean": float(np.mean([r["reward"] for r in rollouts])),
        "accuracy": float(np.mean([r["accuracy_reward"] for r in rollouts])),
        "loss": float(rng.normal()), "kl": float(abs(rng.normal()) * 1e-3), "clip_fraction": float(rng.random() / 10),
        "zero_variance_groups": sum(g["kept"] == 0 for g in groups),
        **{f"time_{phase}": float(rng.random() / 10) for phase in PHASES},
    }
    return {"step_row": step_row, "groups": groups, "rollouts": rollouts, "images": images}


def write_fake_run(store_dir: str | Path, *, steps: int, name: str = "synthetic", eval_every: int = 10,
                        finish: bool = True, **step_kwargs) -> str:
    """Write a whole synthetic run (steps, evals every `eval_every` steps) and return its run id."""
    writer = RunWriter(store_dir, name=name, config={"steps": steps, **step_kwargs}, model="synthetic",
                       dataset="synthetic-dots", objective="grpo", pruner="zero_advantage", budget="fixed",
                       code_version="synthetic")
    pngs: dict[int, bytes] = {}
    for step in range(steps):
        writer.write_step(step, **fake_step(step, pngs=pngs, **step_kwargs))
        if step % eval_every == 0 or step == steps - 1:
            writer.write_eval(step, "test", accuracy=min(1.0, 0.3 + step / (2 * steps)), n=256)
    if finish:
        writer.finish()
    return writer.run_id
