"""Chunked token log-probs (engines.logprobs): equal to the dense log_softmax(lm_head(h)) in value and gradient for
every chunk size, and the HF engine's scoring pass through them equal to the former full-logits forward."""

from __future__ import annotations

import pytest
import torch

from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import write_dataset
from fastrl_core.data.templates import TEMPLATES
from fastrl_core.engines.hf import HFEngine, decoder
from fastrl_core.engines.logprobs import chunked_token_logprobs, dense_token_logprobs
from fastrl_core.policy import build_tiny_policy
from fastrl_core.warmstart import tokenizer_corpus


def _head_inputs(dtype, *, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(17, 8, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(50, 8, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(50, generator=g, dtype=dtype, requires_grad=True) if bias else None
    targets = torch.randint(0, 50, (17,), generator=g)
    upstream = torch.randn(17, generator=g, dtype=torch.float32)  # a loss's d/d log p, zeros included
    upstream[::4] = 0.0
    return hidden, weight, b, targets, upstream


def _value_and_grads(fn, hidden, weight, bias, targets, upstream):
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    out = fn(hidden, weight, bias, targets)
    grads = torch.autograd.grad((out * upstream).sum(), leaves)
    return out.detach(), grads


@pytest.mark.parametrize("chunk", [1, 3, 17, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_equals_dense_in_value_and_gradient(chunk, bias):
    inputs = _head_inputs(torch.float64, bias=bias)
    dense, dense_grads = _value_and_grads(dense_token_logprobs, *inputs)
    chunked, chunked_grads = _value_and_grads(
        lambda h, w, b, y: chunked_token_logprobs(h, w, b, y, chunk=chunk), *inputs)
    assert chunked.dtype == torch.float32 and chunked.shape == (17,)
    torch.testing.assert_close(chunked, dense, rtol=0, atol=1e-6)  # both float32 out of float64 logits
    for got, want in zip(chunked_grads, dense_grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_chunked_follows_the_head_dtype_like_dense_bfloat16():
    """bf16 head: logits in bf16, softmax in float32, gradients cast to bf16 before the head's matmuls, as
    autograd does for the dense formula; only the summation order of the weight gradient differs."""
    inputs = _head_inputs(torch.bfloat16, bias=False)
    dense, dense_grads = _value_and_grads(dense_token_logprobs, *inputs)
    chunked, chunked_grads = _value_and_grads(
        lambda h, w, b, y: chunked_token_logprobs(h, w, b, y, chunk=5), *inputs)
    torch.testing.assert_close(chunked, dense, rtol=0, atol=1e-5)
    for got, want in zip(chunked_grads, dense_grads):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_chunk_below_one_is_refused():
    hidden, weight, _, targets, _ = _head_inputs(torch.float32, bias=False)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_token_logprobs(hidden, weight, None, targets, chunk=0)


@pytest.fixture(scope="module")
def engine_and_rollouts(tmp_path_factory):
    root = write_dataset(tmp_path_factory.mktemp("data") / "synthetic", n_train=8, n_test=4, seed=3)
    problems = load_problems(root / "train")[:3]
    policy = build_tiny_policy(tokenizer_corpus(problems, TEMPLATES), vocab_size=512, seed=1)
    policy.model.float()
    engine = HFEngine(policy, max_new_tokens=12, sketch_projection=None)
    rollouts = engine.generate(problems, [2, 1, 3], generator=torch.Generator().manual_seed(0))
    mask = rollouts.completion_mask.clone()
    mask[0, 5:] = False  # unequal lengths: the scoring pass must leave the tail at 0 and trim all-pad columns
    mask[3, 2:] = False
    rollouts.completion_mask = mask
    return engine, problems, rollouts


def _former_sequence_logprobs(engine, model, problems, rollouts, index):
    """The scoring pass before chunking: the model's own (n, T'+1, V) logits, log-softmax, gather."""
    prompts = engine.prompt_batch(problems)
    ids, mask = rollouts.completion_ids[index], rollouts.completion_mask[index]
    length = int(mask.sum(dim=1).max())
    ids, mask = ids[:, :length], mask[:, :length]
    prompt_index = rollouts.prompt_index[index]
    inputs = dict(input_ids=torch.cat([prompts.input_ids[prompt_index], ids], dim=1),
                  attention_mask=torch.cat([prompts.attention_mask[prompt_index], mask.long()], dim=1),
                  mm_token_type_ids=torch.cat([prompts.mm_token_type_ids[prompt_index], torch.zeros_like(ids)], 1))
    inputs |= engine._vision_inputs(model, prompts, prompt_index)
    logits = model(**inputs, use_cache=False, logits_to_keep=length + 1).logits[:, :-1]
    out = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
    return torch.nn.functional.pad(out, (0, rollouts.completion_ids.shape[1] - length))


def test_engine_scoring_pass_equals_the_full_logits_forward(engine_and_rollouts):
    """Value and every parameter's gradient of a weighted sum of token log-probs (the loss's shape)."""
    engine, problems, rollouts = engine_and_rollouts
    model = engine.policy.model
    index = torch.tensor([5, 0, 3, 1])
    weights = torch.randn(len(index), rollouts.completion_ids.shape[1], generator=torch.Generator().manual_seed(2))
    results = []
    for fn in (engine.token_logprobs, lambda *a: _former_sequence_logprobs(engine, *a)):
        model.zero_grad(set_to_none=True)
        logprobs = fn(model, problems, rollouts, index)
        (logprobs * weights).sum().backward()
        results.append((logprobs.detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                                             if p.grad is not None}))
    (new, new_grads), (old, old_grads) = results
    assert new.shape == (4, rollouts.completion_ids.shape[1])
    assert (new[~rollouts.completion_mask[index]] == 0).all()
    torch.testing.assert_close(new, old, rtol=0, atol=1e-5)
    assert new_grads.keys() == old_grads.keys() and len(new_grads) > 10
    for key in new_grads:
        torch.testing.assert_close(new_grads[key], old_grads[key], rtol=1e-4, atol=1e-6, msg=key)


def test_a_head_that_scales_or_caps_logits_is_refused(engine_and_rollouts):
    model = engine_and_rollouts[0].policy.model
    text = model.config.get_text_config()
    text.final_logit_softcapping = 30.0
    try:
        with pytest.raises(ValueError, match="final_logit_softcapping=30.0"):
            decoder(model)
    finally:
        text.final_logit_softcapping = None
