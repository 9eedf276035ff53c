"""Policy: locally built tokenizer, tiny Qwen2.5-VL on real diagrams, loading the shipped and saved checkpoints."""

from __future__ import annotations

import pytest
import torch

from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import write_dataset
from fastrl_core.data.templates import TEMPLATES
from fastrl_core.policy import (
    EMBEDDED_DIR,
    SPECIAL_TOKENS,
    build_tiny_policy,
    build_tiny_vlm,
    build_tokenizer,
    load_policy,
    save_policy,
)
from fastrl_core.rewards import format_reward
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


@pytest.mark.skipif(not (EMBEDDED_DIR / "config.json").is_file(), reason="no shipped warm start yet")
def test_embedded_checkpoint_loads_and_answers_in_format(tmp_path):
    policy = load_policy("embedded")
    size = sum(f.stat().st_size for f in EMBEDDED_DIR.iterdir())
    assert size <= 20 * 2**20
    assert type(policy.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    from fastrl_core.engines.hf import HFEngine

    test = load_problems(write_dataset(tmp_path / "d", n_train=4, n_test=16, seed=11) / "test")
    texts = HFEngine(policy, template="math").greedy(test)
    assert sum(format_reward(t, "boxed") for t in texts) >= 0.9 * len(texts)
