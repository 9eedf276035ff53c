"""Warm start: targets earn the full reward, SFT raises the targets' likelihood, a short run saves a loadable,
deterministic checkpoint with its metadata; evaluate's figures."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import write_dataset
from fastrl_core.data.templates import TEMPLATES, answer_style
from fastrl_core.engines.hf import HFEngine
from fastrl_core.evaluate import evaluate
from fastrl_core.policy import build_tiny_policy, load_policy
from fastrl_core.rewards import score_completions
from fastrl_core.warmstart import WarmstartArgs, encode_targets, parse_args, target_text, tokenizer_corpus, warmstart


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = write_dataset(tmp_path_factory.mktemp("data") / "synthetic", n_train=24, n_test=8, seed=2)
    return load_problems(root / "train")


@pytest.mark.parametrize("template", ["math", "r1v", "short"])
def test_targets_earn_full_format_and_accuracy(problems, template):
    style = answer_style(template)
    texts = [target_text(p, style) for p in problems]
    parts = score_completions(texts, problems, style=style)
    assert all(p.format == 1.0 and p.accuracy == 1.0 for p in parts)
    assert target_text(problems[0], "boxed") == f"<think> I look at the figure. </think> \\boxed{{{problems[0].answer}}}"


def test_encoded_targets_end_in_eos_and_decode_back(problems):
    policy = build_tiny_policy(tokenizer_corpus(problems, TEMPLATES), vocab_size=400)
    ids, mask = encode_targets(policy, problems, "boxed")
    lengths = mask.sum(dim=1)
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (ids[torch.arange(len(ids)), lengths - 1] == eos).all()
    assert (ids[~mask] == policy.tokenizer.pad_token_id).all()
    decoded = policy.tokenizer.batch_decode([row[m] for row, m in zip(ids, mask)], skip_special_tokens=True)
    assert decoded == [target_text(p, "boxed") for p in problems]


def test_supervised_steps_raise_target_likelihood(problems):
    policy = build_tiny_policy(tokenizer_corpus(problems, TEMPLATES), vocab_size=400, seed=0)
    engine = HFEngine(policy, template="math")
    prompts = engine.prompt_batch(problems)
    ids, mask = encode_targets(policy, problems, "boxed")
    rows = torch.arange(len(problems))
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=3e-3)

    def mean_logprob():
        return engine.sequence_logprobs(policy.model, prompts, rows, ids, mask).sum() / mask.sum()

    with torch.no_grad():
        before = mean_logprob().item()
    for _ in range(5):
        optimizer.zero_grad()
        (-mean_logprob()).backward()
        optimizer.step()
    with torch.no_grad():
        after = mean_logprob().item()
    assert after > before + 1.0  # nats per token


def test_short_run_saves_a_loadable_deterministic_checkpoint(tmp_path):
    def run(out):
        args = WarmstartArgs(out=str(tmp_path / out), data_dir=str(tmp_path / "data"), n_train=48, n_test=8,
                             vocab_size=400, batch_size=8, max_steps=4, eval_every=2, band_low=0.0, band_high=1.0,
                             min_format=0.0, max_new_tokens=8, threads=1)
        return warmstart(args, progress=False)

    meta = run("a")
    assert [e["step"] for e in meta["history"]] == [0, 2, 4]
    assert meta["chosen"]["step"] in (0, 2, 4) and 0.0 <= meta["reward_variance_groups_16x8"] <= 1.0
    saved = json.loads((tmp_path / "a" / "warmstart.json").read_text())
    assert saved["args"]["max_steps"] == 4 and saved["chosen"] == meta["chosen"]
    policy = load_policy(tmp_path / "a")
    assert type(policy.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    run("b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_no_checkpoint_in_band_is_an_error(tmp_path):
    args = WarmstartArgs(out=str(tmp_path / "x"), data_dir=str(tmp_path / "data"), n_train=16, n_test=4,
                         vocab_size=400, batch_size=4, max_steps=1, eval_every=1, band_low=0.99, band_high=1.0,
                         max_new_tokens=4, threads=1)
    with pytest.raises(RuntimeError, match="no evaluated checkpoint"):
        warmstart(args, progress=False)
    assert not (tmp_path / "x").exists()


def test_cli_arguments():
    args = parse_args(["--out", "x", "--max-steps", "7", "--lr", "0.01"])
    assert (args.out, args.max_steps, args.lr, args.template) == ("x", 7, 0.01, "math")


def test_evaluate_counts_per_kind(problems):
    policy = build_tiny_policy(tokenizer_corpus(problems, TEMPLATES), vocab_size=400)
    result = evaluate(policy, problems[:6], template="math", batch_size=4, max_new_tokens=8, progress=False)
    assert result["n"] == 6 and len(result["completions"]) == 6
    assert set(result["per_kind"]) == {p.kind for p in problems[:6]}
    parts = score_completions(result["completions"], problems[:6], style="boxed")
    assert result["accuracy"] == sum(p.accuracy for p in parts) / 6
    assert result["format_rate"] == sum(p.format for p in parts) / 6
