"""The HF engine's former generate path, kept as the one reference that the streaming path is tested
(`tests/test_engine.py`) and benchmarked (`benchmarks/bench_generate_memory.py`) against. Never used in training:
it materialises the (N, T, V) float32 logits, ~40 GB at Qwen2.5-VL's vocabulary for 128 rollouts x 512 tokens."""

from __future__ import annotations

import torch

from fastrl_core.algo.sketches import LmHeadSketcher
from fastrl_core.engines.hf import HFEngine


def stacked_generate(engine: HFEngine, problems, counts, generator: torch.Generator) -> dict:
    """Generate with `output_logits` and every layer's `output_hidden_states`, stack the step logits to (N, T, V)
    float32, then log-softmax + gather and one `LmHeadSketcher.update` per step from `hidden_states[s][-1][:, -1]`.
    Returns ids, mask (N, T), logprobs (N, T), sketches (N, D) or None, logits (N, T, V), hidden (N, T, d)."""
    prompt_index = torch.repeat_interleave(torch.arange(len(problems)), torch.tensor(counts))
    prompts = engine.prompt_batch(problems)
    config = engine._generation_config(do_sample=True, max_new_tokens=engine.max_new_tokens,
                                       return_dict_in_generate=True, output_logits=True, output_hidden_states=True)
    seed = int(torch.randint(0, 2**63 - 1, (), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = engine._run_generate(prompts, prompt_index, config)
    ids = out.sequences[:, prompts.input_ids.shape[1]:]
    is_eos = torch.isin(ids, torch.tensor(engine.eos_token_ids))
    mask = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) == 0
    ids = ids.masked_fill(~mask, engine.pad_token_id)
    logits = torch.stack(out.logits, dim=1).float()  # (N, T, V)
    hidden = torch.stack([layers[-1][:, -1] for layers in out.hidden_states], dim=1).float()  # (N, T, d)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
    sketches = None
    if engine.sketch_projection is not None:
        sketcher = LmHeadSketcher(len(ids), engine.sketch_projection, top_k=engine.sketch_top_k)
        for step in range(ids.shape[1]):
            sketcher.update(hidden[:, step], logits[:, step], ids[:, step], mask[:, step])
        sketches = sketcher.result()
    return dict(ids=ids, mask=mask, logprobs=logprobs, sketches=sketches, logits=logits, hidden=hidden)
