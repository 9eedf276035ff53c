"""Policy: locally built tokenizer, tiny Qwen2.5-VL on real diagrams, loading the shipped and saved checkpoints."""

from __future__ import annotations

import pytest
import torch

from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import write_dataset
from fastrl_core.data.templates import TEMPLATES
from fastrl_core.policy import (
    SPECIAL_TOKENS,
    build_tiny_policy,
    build_tiny_vlm,
    build_tokenizer,
    load_policy,
    save_policy,
)
from fastrl_core.rewards import format_reward
from fastrl_core.shipped import EMBEDDED_MODEL
from fastrl_core.warmstart import tokenizer_corpus


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = write_dataset(tmp_path_factory.mktemp("data") / "synthetic", n_train=16, n_test=8, seed=3)
    return load_problems(root / "train")


@pytest.fixture(scope="module")
def tiny(problems):
    return build_tiny_policy(tokenizer_corpus(problems, TEMPLATES), vocab_size=512, seed=0)


def test_tokenizer_round_trip_and_chat_template():
    corpus = ["How many dots are there?", "<think> I look at the figure. </think> \\boxed{3}"] * 5
    tokenizer = build_tokenizer(corpus, vocab_size=300)
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(len(SPECIAL_TOKENS)))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for text in ["How many dots are there? 12", "<think> x </think> \\boxed{B}", "angle 90° √2 ½ 米"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text  # byte-level: any text round-trips
    digits = tokenizer.convert_ids_to_tokens(tokenizer("1234", add_special_tokens=False)["input_ids"])
    assert digits == ["1", "2", "3", "4"]  # Qwen2 split: one token per digit
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Q?<|im_end|>\n<|im_start|>assistant\n"
    image_pad = tokenizer("<|image_pad|>", add_special_tokens=False)["input_ids"]
    assert image_pad == [tokenizer.convert_tokens_to_ids("<|image_pad|>")]


def test_tokenizer_is_deterministic():
    corpus = [f"How many sides does polygon {i} have?" for i in range(50)]
    assert build_tokenizer(corpus, 400).get_vocab() == build_tokenizer(corpus, 400).get_vocab()


def test_tiny_vlm_config_and_seed(tiny):
    config = tiny.model.config
    head_dim = config.text_config.hidden_size // config.text_config.num_attention_heads
    assert sum(config.text_config.rope_parameters["mrope_section"]) == head_dim // 2
    tokenizer = tiny.tokenizer
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert tiny.suppress_token_ids == sorted(tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS[3:])))
    same = build_tiny_vlm(tokenizer, seed=0).state_dict()
    other = build_tiny_vlm(tokenizer, seed=1).state_dict()
    assert all(torch.equal(v, same[k]) for k, v in tiny.model.state_dict().items())
    assert not torch.equal(other["lm_head.weight"], same["lm_head.weight"])


def test_forward_on_a_real_diagram(tiny, problems):
    problem = problems[0]
    text = tiny.chat_prompt(problem, "math")
    assert text.count("<|image_pad|>") == 1 and problem.question.split("\n")[0] in text
    batch = tiny.processor(text=[text], images=[problem.load_image()], return_tensors="pt")
    assert batch["image_grid_thw"].tolist() == [[1, 8, 8]]  # 112x112 -> 8x8 patches of 14
    image_tokens = int((batch["input_ids"] == tiny.model.config.image_token_id).sum())
    assert image_tokens == 16  # 2x2 merge
    with torch.no_grad():
        logits = tiny.model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], len(tiny.tokenizer))
    assert torch.isfinite(logits).all()
    # the image matters: another diagram changes the last position's logits
    other = tiny.processor(text=[text], images=[problems[1].load_image()], return_tensors="pt")
    with torch.no_grad():
        assert not torch.allclose(tiny.model(**other).logits[0, -1], logits[0, -1])


def test_save_then_load_local_path(tiny, problems, tmp_path):
    save_policy(tiny, tmp_path / "policy")
    loaded = load_policy(tmp_path / "policy")
    assert loaded.suppress_token_ids == tiny.suppress_token_ids
    assert loaded.chat_prompt(problems[0], "math") == tiny.chat_prompt(problems[0], "math")
    batch = tiny.processor(text=[tiny.chat_prompt(problems[0], "math")], images=[problems[0].load_image()],
                           return_tensors="pt")
    again = loaded.processor(text=[loaded.chat_prompt(problems[0], "math")], images=[problems[0].load_image()],
                             return_tensors="pt")
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    with torch.no_grad():
        assert torch.equal(tiny.model(**batch).logits, loaded.model(**batch).logits)


def test_load_policy_errors(tmp_path):
    with pytest.raises((OSError, ValueError)):
        load_policy(tmp_path / "nothing-here")


@pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="no shipped warm start yet")
def test_embedded_checkpoint_loads_and_answers_in_format(tmp_path):
    policy = load_policy("embedded")
    size = sum(f.stat().st_size for f in EMBEDDED_MODEL.iterdir())
    assert size <= 20 * 2**20
    assert type(policy.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    from fastrl_core.engines.hf import HFEngine

    test = load_problems(write_dataset(tmp_path / "d", n_train=4, n_test=16, seed=11) / "test")
    texts = HFEngine(policy, template="math").greedy(test)
    assert sum(format_reward(t, "boxed") for t in texts) >= 0.9 * len(texts)


# ---- Qwen2.5-VL at given widths (build_random_policy) ---------------------------------------------------------------
def _text_layer(hidden: int, mlp: int, kv_width: int) -> int:
    """Parameters of one Qwen2 decoder layer: q/k/v with biases, o without, gated MLP, two RMSNorms."""
    return (hidden * hidden + hidden) + 2 * (hidden * kv_width + kv_width) + hidden * hidden + 3 * hidden * mlp \
        + 2 * hidden


def _vision_block(hidden: int, mlp: int) -> int:
    """One Qwen2.5-VL vision block: fused qkv and proj with biases, gated MLP with biases, two RMSNorms."""
    return (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden) + 2 * (hidden * mlp + mlp) \
        + (mlp * hidden + hidden) + 2 * hidden


def test_qwen25vl_at_3b_widths_has_the_hand_counted_parameters_and_tied_embeddings():
    from fastrl_core.policy import QWEN2_5_VL_3B_TWO_LAYERS, build_random_policy

    policy = build_random_policy(QWEN2_5_VL_3B_TWO_LAYERS, device="meta")  # shapes only, no memory
    model, text = policy.model, policy.model.config.text_config
    assert (text.hidden_size, text.intermediate_size, text.num_attention_heads, text.num_key_value_heads,
            text.vocab_size) == (2048, 11008, 16, 2, 151_936)
    assert text.rope_parameters["mrope_section"] == [16, 24, 24]  # Qwen2.5-VL's split of head_dim 128
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight  # 3B ties them
    embedding = 151_936 * 2048
    text_params = embedding + 2 * _text_layer(2048, 11008, 2 * 128) + 2048  # + final norm; lm_head tied
    merger = 1280 + (5120 * 5120 + 5120) + (5120 * 2048 + 2048)  # RMSNorm, then 2x2 patches (4 * 1280) -> 2048
    vision_params = 3 * 2 * 14 * 14 * 1280 + _vision_block(1280, 3420) + merger  # patch embedding, 1 block
    assert sum(p.numel() for p in model.model.visual.parameters()) == vision_params
    assert sum(p.numel() for p in model.parameters()) == text_params + vision_params == 523_237_048
    vision_ids = sorted(policy.tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS[3:])))
    assert policy.suppress_token_ids == vision_ids + list(range(len(policy.tokenizer), 151_936))


def test_build_random_policy_rejects_widths_it_cannot_build():
    from fastrl_core.policy import QWEN2_5_VL_3B_TWO_LAYERS, build_random_policy

    with pytest.raises(ValueError, match="divisible by 16"):
        build_random_policy(QWEN2_5_VL_3B_TWO_LAYERS.replace(num_heads=256), device="meta")  # head_dim 8
    with pytest.raises(ValueError, match="below the tokenizer"):
        build_random_policy(QWEN2_5_VL_3B_TWO_LAYERS.replace(vocab_size=100), device="meta")


SMALL_WIDE_VOCAB = dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2,
                        vocab_size=4096, tie_word_embeddings=True, vision_depth=1, vision_hidden_size=32,
                        vision_intermediate_size=64, vision_heads=2)


def test_a_model_wider_than_its_tokenizer_saves_loads_and_never_samples_undecodable_ids(tmp_path, problems):
    """4,096 output rows over the shipped 482-entry tokenizer: a random init puts ~88 % of its mass on rows that
    decode to nothing; they are suppressed, so every sampled id decodes and completions are not empty."""
    from fastrl_core.engines.hf import HFEngine
    from fastrl_core.policy import VLMWidths, build_random_policy

    built = build_random_policy(VLMWidths(**SMALL_WIDE_VOCAB), seed=1)
    save_policy(built, tmp_path / "wide")
    loaded = load_policy(tmp_path / "wide")
    assert loaded.model.lm_head.weight is loaded.model.model.language_model.embed_tokens.weight
    for name, tensor in built.model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    decodable = len(loaded.tokenizer)
    assert loaded.suppress_token_ids == built.suppress_token_ids
    assert set(range(decodable, 4096)) <= set(loaded.suppress_token_ids)
    engine = HFEngine(loaded, max_new_tokens=12)
    rollouts = engine.generate(problems[:2], [4, 4], generator=torch.Generator().manual_seed(0))
    sampled = rollouts.completion_ids[rollouts.completion_mask.bool()]
    assert sampled.numel() > 40 and int(sampled.max()) < decodable
    assert all(text for text in rollouts.completion_text)
    with torch.no_grad():  # the check above can fail: unsuppressed, most of the mass is on undecodable rows
        prompts = engine.prompt_batch(problems[:2])
        logits = loaded.model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                              mm_token_type_ids=prompts.mm_token_type_ids,
                              pixel_values=torch.cat(prompts.pixel_values),
                              image_grid_thw=prompts.image_grid_thw).logits[:, -1]
    assert (logits.softmax(-1)[:, decodable:].sum(-1) > 0.5).all()
