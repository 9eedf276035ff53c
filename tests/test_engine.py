"""HF rollout engine: shapes and masks with unequal groups, behaviour log-probs = a fresh forward, shared image
encoding = per-rollout encoding, no vision token sampled, reproducible sampling, sketches from generate's outputs,
the streamed log-probs and sketches = the former (N, T, V) computation, ids beyond the tokenizer decoded safely."""

from __future__ import annotations

import pytest
import torch

from fastrl_core.algo.sketches import lm_head_sketch, make_projection
from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import write_dataset
from fastrl_core.data.templates import TEMPLATES
from fastrl_core.engines.base import Rollouts
from fastrl_core.engines.hf import HFEngine
from fastrl_core.engines.stacked_reference import stacked_generate
from fastrl_core.policy import TINY_WIDTHS, build_policy, build_tiny_policy, load_policy
from fastrl_core.shipped import EMBEDDED_MODEL
from fastrl_core.warmstart import tokenizer_corpus

COUNTS = [3, 0, 1, 2]


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = write_dataset(tmp_path_factory.mktemp("data") / "synthetic", n_train=16, n_test=8, seed=5)
    return load_problems(root / "train")[:4]


@pytest.fixture(scope="module")
def random_policy(problems):
    """Random init: never emits EOS on purpose, and would sample vision tokens without suppression."""
    return build_tiny_policy(tokenizer_corpus(problems, TEMPLATES), vocab_size=512, seed=0)


@pytest.fixture(scope="module")
def policy(random_policy):
    """The shipped warm start (its completions end in EOS at various lengths), else the random policy."""
    return load_policy("embedded") if (EMBEDDED_MODEL / "config.json").is_file() else random_policy


@pytest.fixture(scope="module")
def sampled(policy, problems) -> tuple[HFEngine, Rollouts]:
    model = policy.model
    projection = make_projection(model.lm_head.weight.shape[0], model.lm_head.weight.shape[1], sketch_dim=64)
    engine = HFEngine(policy, max_new_tokens=24, sketch_projection=projection, sketch_top_k=16)
    return engine, engine.generate(problems, COUNTS, generator=torch.Generator().manual_seed(0))


def test_shapes_and_masks_with_unequal_groups(sampled):
    engine, rollouts = sampled
    n, length = rollouts.completion_ids.shape
    assert rollouts.prompt_index.tolist() == [0, 0, 0, 2, 3, 3]
    assert n == sum(COUNTS) == len(rollouts) == len(rollouts.completion_text) and length <= 24
    assert rollouts.completion_mask.shape == rollouts.behaviour_logprobs.shape == (n, length)
    assert rollouts.sketches.shape == (n, 64)
    mask = rollouts.completion_mask
    assert (mask[:, 1:] <= mask[:, :-1]).all()  # True then False: a prefix
    eos = torch.isin(rollouts.completion_ids, torch.tensor(engine.eos_token_ids))
    lengths = mask.sum(dim=1)
    for row in range(n):
        ended = eos[row, : lengths[row]]
        assert ended[:-1].sum() == 0  # no EOS before the last unmasked token
        assert ended[-1] or lengths[row] == length  # ends with EOS unless truncated
        assert (rollouts.completion_ids[row, lengths[row]:] == engine.pad_token_id).all()
    assert (rollouts.behaviour_logprobs[~mask] == 0).all() and (rollouts.behaviour_logprobs[mask] < 0).all()


def test_behaviour_logprobs_equal_a_fresh_forward(sampled, policy, problems):
    engine, rollouts = sampled
    with torch.no_grad():
        fresh = engine.token_logprobs(policy.model, problems, rollouts, torch.arange(len(rollouts)))
    assert fresh.shape == rollouts.behaviour_logprobs.shape
    torch.testing.assert_close(fresh, rollouts.behaviour_logprobs, atol=1e-5, rtol=0)
    subset = torch.tensor([4, 1])
    with torch.no_grad():
        part = engine.token_logprobs(policy.model, problems, rollouts, subset)
    torch.testing.assert_close(part, rollouts.behaviour_logprobs[subset], atol=1e-5, rtol=0)


def test_shared_image_encoding_equals_per_rollout_encoding(sampled, policy, problems):
    engine, rollouts = sampled
    naive = HFEngine(policy, max_new_tokens=24, share_images=False)
    model = policy.model
    index = torch.arange(len(rollouts))
    grads = []
    for eng in (engine, naive):
        model.zero_grad(set_to_none=True)
        logprobs = eng.token_logprobs(model, problems, rollouts, index)
        (logprobs.sum() / rollouts.completion_mask.sum()).backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
        grads[-1]["logprobs"] = logprobs.detach()
    model.zero_grad(set_to_none=True)
    shared, per_rollout = grads
    torch.testing.assert_close(shared["logprobs"], per_rollout["logprobs"], atol=1e-5, rtol=0)
    assert any(name.startswith("model.visual") for name in shared)  # gradient reaches the vision tower
    assert shared.keys() == per_rollout.keys()
    for name in shared:
        torch.testing.assert_close(shared[name], per_rollout[name], atol=1e-5, rtol=1e-4)
    # and sampling through either path gives the same rollouts
    again = naive.generate(problems, COUNTS, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.completion_ids, rollouts.completion_ids)


@pytest.mark.parametrize("share_images", [True, False])
def test_shared_prefill_equals_a_prefill_per_row(sampled, policy, problems, share_images):
    """Each prompt prefilled once and its cache gathered to its rows = every row prefilled on its own: same tokens,
    behaviour log-probs and sketches (also on the pixels-per-row path that transformers 5.17 takes)."""
    engine, rollouts = sampled
    per_row = HFEngine(policy, max_new_tokens=24, sketch_projection=engine.sketch_projection, sketch_top_k=16,
                       share_images=share_images, share_prompts=False)
    shared = HFEngine(policy, max_new_tokens=24, sketch_projection=engine.sketch_projection, sketch_top_k=16,
                      share_images=share_images)
    assert shared.share_prompts and not per_row.share_prompts
    for eng in (per_row, shared):
        again = eng.generate(problems, COUNTS, generator=torch.Generator().manual_seed(0))
        assert torch.equal(again.completion_ids, rollouts.completion_ids)
        assert torch.equal(again.completion_mask, rollouts.completion_mask)
        torch.testing.assert_close(again.behaviour_logprobs, rollouts.behaviour_logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(again.sketches, rollouts.sketches, atol=1e-5, rtol=1e-4)


def test_shared_prefill_over_long_completions(random_policy, problems):
    """32 decoding steps from the shared cache (the random policy rarely ends): ~380 tokens equal to the
    per-row prefill's, and the mRoPE offsets of rows with different prompt lengths kept apart."""
    counts = [5, 1, 0, 6]
    outs = [HFEngine(random_policy, max_new_tokens=32, share_prompts=share).generate(
        problems, counts, generator=torch.Generator().manual_seed(3)) for share in (False, True)]
    assert outs[0].completion_mask.sum() > 300
    assert torch.equal(outs[0].completion_ids, outs[1].completion_ids)
    torch.testing.assert_close(outs[0].behaviour_logprobs, outs[1].behaviour_logprobs, atol=1e-5, rtol=0)


def test_share_prompts_comes_from_the_config(policy):
    from fastrl_core.config import TrainConfig
    from fastrl_core.run_setup import make_engine

    assert make_engine(TrainConfig(), policy, None).share_prompts
    assert not make_engine(TrainConfig(share_prompts=False), policy, None).share_prompts


def test_shared_prompt_scoring_equals_per_row_scoring(sampled, policy, problems):
    """Scoring each prompt once and continuing its rows from the gathered cache = one forward per row: equal
    log-probs and equal gradients for every parameter (the vision tower's included), on unequal groups and on a
    subset that leaves one prompt with a single row."""
    engine, rollouts = sampled
    per_row = HFEngine(policy, max_new_tokens=24, share_prompts=False)
    model = policy.model
    for index in (torch.arange(len(rollouts)), torch.tensor([0, 2, 3, 5])):
        results = []
        for eng in (engine, per_row):
            model.zero_grad(set_to_none=True)
            logprobs = eng.token_logprobs(model, problems, rollouts, index)
            (logprobs * torch.linspace(0.5, 2.0, logprobs.numel()).view_as(logprobs)).sum().backward()
            results.append((logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                if p.grad is not None}))
        model.zero_grad(set_to_none=True)
        (shared, shared_grads), (single, single_grads) = results
        torch.testing.assert_close(shared, single, atol=1e-5, rtol=0)
        torch.testing.assert_close(shared, rollouts.behaviour_logprobs[index], atol=1e-5, rtol=0)
        assert shared_grads.keys() == single_grads.keys()
        assert any(name.startswith("model.visual") for name in shared_grads)
        for name in shared_grads:
            torch.testing.assert_close(shared_grads[name], single_grads[name], atol=1e-5, rtol=1e-4)


def test_no_vision_token_is_ever_sampled(random_policy, problems):
    engine = HFEngine(random_policy, max_new_tokens=32)
    rollouts = engine.generate(problems, [16] * 4, generator=torch.Generator().manual_seed(1))
    assert rollouts.completion_mask.sum() > 1500  # random init: rarely EOS, ~2,000 sampled tokens
    sampled_ids = rollouts.completion_ids[rollouts.completion_mask]
    assert not torch.isin(sampled_ids, torch.tensor(random_policy.suppress_token_ids)).any()
    # without suppression this policy does put mass on them (~5 of 512 ids): the check above can fail
    with torch.no_grad():
        prompts = engine.prompt_batch(problems)
        logits = random_policy.model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                                     mm_token_type_ids=prompts.mm_token_type_ids,
                                     pixel_values=torch.cat(prompts.pixel_values),
                                     image_grid_thw=prompts.image_grid_thw).logits[:, -1]
        vision_mass = logits.softmax(-1)[:, random_policy.suppress_token_ids].sum(-1)
    assert (vision_mass > 1e-3).all()


def test_sampling_is_reproducible_and_leaves_the_global_rng_alone(policy, problems):
    engine = HFEngine(policy, max_new_tokens=16)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = engine.generate(problems, [2, 2, 2, 2], generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.random.get_rng_state(), before)
    second = engine.generate(problems, [2, 2, 2, 2], generator=torch.Generator().manual_seed(7))
    other = engine.generate(problems, [2, 2, 2, 2], generator=torch.Generator().manual_seed(8))
    assert torch.equal(first.completion_ids, second.completion_ids)
    assert first.completion_text == second.completion_text
    assert not torch.equal(first.completion_ids, other.completion_ids)


@pytest.mark.parametrize("top_k", [16, None])
def test_sketches_equal_the_batch_sketch_of_a_fresh_forward(sampled, policy, problems, top_k):
    """Generate's last hidden state is post-norm (lm_head(h) = logits), so the streamed sketch equals the sketch of
    a fresh forward's hidden states and logits (top-K restricted, or over the whole vocabulary)."""
    engine, rollouts = sampled
    if top_k is None:
        engine = HFEngine(policy, max_new_tokens=24, sketch_projection=engine.sketch_projection, sketch_top_k=None)
        rollouts = engine.generate(problems, COUNTS, generator=torch.Generator().manual_seed(0))
    model = policy.model
    prompts = engine.prompt_batch(problems)
    index = rollouts.prompt_index
    length = rollouts.completion_ids.shape[1]
    with torch.no_grad():
        out = model(
            input_ids=torch.cat([prompts.input_ids[index], rollouts.completion_ids], dim=1),
            attention_mask=torch.cat([prompts.attention_mask[index], rollouts.completion_mask.long()], dim=1),
            mm_token_type_ids=torch.cat([prompts.mm_token_type_ids[index],
                                         torch.zeros_like(rollouts.completion_ids)], dim=1),
            pixel_values=torch.cat([prompts.pixel_values[i] for i in index.tolist()]),
            image_grid_thw=prompts.image_grid_thw[index],
            output_hidden_states=True,
        )
    hidden = out.hidden_states[-1][:, -length - 1 : -1]  # positions predicting the completion tokens
    logits = out.logits[:, -length - 1 : -1]
    torch.testing.assert_close(model.lm_head(hidden), logits)  # the last hidden state is the lm_head input
    expected = lm_head_sketch(hidden, logits, rollouts.completion_ids, rollouts.completion_mask,
                              engine.sketch_projection, top_k=top_k)
    torch.testing.assert_close(rollouts.sketches, expected, atol=1e-4, rtol=1e-4)


def test_greedy_does_not_depend_on_batching(policy, problems):
    engine = HFEngine(policy, max_new_tokens=16)
    together = engine.greedy(problems, batch_size=4)
    apart = engine.greedy(problems, batch_size=1)
    assert together == apart and len(together) == len(problems)


def test_bad_counts_are_rejected(sampled, problems):
    engine, _ = sampled
    with pytest.raises(ValueError, match="entries"):
        engine.generate(problems, [1, 1])
    with pytest.raises(ValueError, match=">= 0"):
        engine.generate(problems, [1, -1, 1, 1])


@pytest.mark.parametrize("top_k, with_projection, temperature", [(None, True, 1.0), (16, True, 0.7), (16, False, 1.0)])
def test_streamed_logprobs_and_sketches_equal_the_stacked_logits_computation(policy, problems, top_k,
                                                                             with_projection, temperature):
    """Same rollouts (bit-identical tokens), behaviour log-probs and sketches as the former (N, T, V) path, with
    unequal rollout counts per prompt and completions that end at different steps (the warm start emits EOS);
    log-probs are of the raw logits whatever the temperature; steps after a row's EOS add nothing."""
    model = policy.model
    vocab, width = model.lm_head.weight.shape
    projection = make_projection(vocab, width, sketch_dim=64, seed=3) if with_projection else None
    engine = HFEngine(policy, max_new_tokens=24, temperature=temperature, sketch_projection=projection,
                      sketch_top_k=top_k)
    counts = [3, 0, 2, 4]
    streamed = engine.generate(problems, counts, generator=torch.Generator().manual_seed(11))
    ref = stacked_generate(engine, problems, counts, torch.Generator().manual_seed(11))
    ids, mask = ref["ids"], ref["mask"]
    assert torch.equal(streamed.completion_ids, ids) and torch.equal(streamed.completion_mask, mask)
    assert ref["logits"].shape == (sum(counts), ids.shape[1], vocab)
    ended = mask.sum(dim=1) < ids.shape[1]
    if (EMBEDDED_MODEL / "config.json").is_file():  # the random policy never ends early
        assert ended.any() and len(set(mask.sum(dim=1).tolist())) > 1  # EOS mid-way, unequal lengths
    torch.testing.assert_close(streamed.behaviour_logprobs, ref["logprobs"], atol=1e-6, rtol=0)
    assert (streamed.behaviour_logprobs[~mask] == 0).all()
    assert not model.get_output_embeddings()._forward_hooks  # the recorder's hook is removed again
    if not with_projection:
        assert streamed.sketches is None
        return
    torch.testing.assert_close(streamed.sketches, ref["sketches"], atol=1e-5, rtol=1e-5)
    batch = lm_head_sketch(ref["hidden"], ref["logits"], ids, mask, projection, top_k=top_k)
    torch.testing.assert_close(streamed.sketches, batch, atol=1e-4, rtol=1e-4)
    # the padded steps would have changed the sketches of the rows that ended early
    unmasked = lm_head_sketch(ref["hidden"], ref["logits"], ids, torch.ones_like(mask), projection, top_k=top_k)
    gap = (unmasked - streamed.sketches).norm(dim=1)
    assert (gap[ended] > 1e-3).all() and (gap[~ended] < 1e-3).all()


def test_ids_beyond_the_tokenizer_are_sampled_and_dropped_when_decoding(problems):
    """A model with more output rows than tokenizer entries (like Qwen2.5-VL's padded 151,936-row unembedding) does
    sample the extra ids when random and not suppressed (the policy builders suppress them: checked first); with
    only the vision tokens suppressed, generate, re-scoring and decoding cope, and decode drops exactly those ids."""
    import dataclasses

    from fastrl_core.policy import vision_token_ids

    built = build_policy(tokenizer_corpus(problems, TEMPLATES), TINY_WIDTHS.replace(vocab_size=2048),
                         tokenizer_vocab_size=512, seed=1)
    tokenizer = built.tokenizer
    assert built.model.lm_head.weight.shape[0] == 2048 > len(tokenizer)
    suppressed = HFEngine(built, max_new_tokens=16).generate(problems, [2, 2, 2, 2],
                                                             generator=torch.Generator().manual_seed(0))
    assert int(suppressed.completion_ids[suppressed.completion_mask].max()) < len(tokenizer)
    policy = dataclasses.replace(built, suppress_token_ids=vision_token_ids(tokenizer, built.model.config))
    engine = HFEngine(policy, max_new_tokens=16, sketch_projection=make_projection(2048, 128, sketch_dim=64))
    rollouts = engine.generate(problems, [2, 2, 2, 2], generator=torch.Generator().manual_seed(0))
    sampled_ids = rollouts.completion_ids[rollouts.completion_mask]
    assert (sampled_ids >= len(tokenizer)).sum() > 10  # ~3/4 of the ids are beyond the tokenizer
    for ids, mask, text in zip(rollouts.completion_ids, rollouts.completion_mask, rollouts.completion_text):
        known = [i for i in ids[mask].tolist() if i < len(tokenizer)]
        assert text == tokenizer.decode(known, skip_special_tokens=True)
    with torch.no_grad():
        fresh = engine.token_logprobs(policy.model, problems, rollouts, torch.arange(len(rollouts)))
    torch.testing.assert_close(fresh, rollouts.behaviour_logprobs, atol=1e-5, rtol=0)
    a, b = tokenizer.convert_tokens_to_ids(["K", "L"]) if "K" in tokenizer.get_vocab() else (20, 21)
    decoded = engine.decode(torch.tensor([[a, 2047, b, len(tokenizer)]]), torch.ones(1, 4, dtype=torch.bool))
    assert decoded == [tokenizer.decode([a, b])]


def test_width_builder_rejects_a_vocabulary_below_the_tokenizer_and_bad_head_dims(random_policy):
    from fastrl_core.policy import QWEN2_5_VL_3B_WIDTHS, build_vlm

    tokenizer = random_policy.tokenizer
    with pytest.raises(ValueError, match="vocab_size 100 is below the tokenizer's"):
        build_vlm(tokenizer, TINY_WIDTHS.replace(vocab_size=100))
    with pytest.raises(ValueError, match="num_heads 3"):
        build_vlm(tokenizer, TINY_WIDTHS.replace(num_heads=3))
    with pytest.raises(ValueError, match="divisible by 16"):
        build_vlm(tokenizer, TINY_WIDTHS.replace(num_heads=16))  # head_dim 8
    text = random_policy.model.config.text_config  # the tiny widths: head_dim 32 -> mRoPE [4, 6, 6]
    assert text.rope_parameters["mrope_section"] == [4, 6, 6] and text.vocab_size == len(tokenizer)
    # head_dim 128 (3B's 2048 / 16 heads) -> Qwen2.5-VL-3B's [16, 24, 24]; narrow MLPs keep this model small
    narrow = QWEN2_5_VL_3B_WIDTHS.replace(num_layers=1, intermediate_size=64, vision_depth=1, vision_hidden_size=32,
                                          vision_intermediate_size=32, vision_heads=2, vocab_size=None)
    config = build_vlm(tokenizer, narrow).config
    assert config.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size == 2048
    assert QWEN2_5_VL_3B_WIDTHS.num_layers == 36 and QWEN2_5_VL_3B_WIDTHS.vocab_size == 151_936


def test_images_are_shared_only_where_the_model_takes_pre_encoded_features(problems):
    """transformers 5.17's Qwen2.5-VL forward has no `mm_encoder_outputs` (5.23's has): the engine then repeats pixels
    per rollout (the naive path, same numbers) instead of failing inside generate."""
    from fastrl_core.engines.hf import accepts_encoder_outputs

    policy = load_policy("embedded")
    assert accepts_encoder_outputs(policy.model) and HFEngine(policy).share_images

    class OlderForward(torch.nn.Module):  # a forward signature like transformers 5.17's, without the argument
        def forward(self, input_ids=None, pixel_values=None, image_grid_thw=None, **kwargs):
            return None

    assert not accepts_encoder_outputs(OlderForward())
