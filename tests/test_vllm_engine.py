"""The vLLM engine on a machine without vLLM: its lazy import, and the pure conversion of vLLM's outputs into
`Rollouts`, fed with stand-ins that carry the fields of vLLM's RequestOutput / CompletionOutput / Logprob."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest
import torch

from fastrl_core.algo.sketches import logprob_sketch, make_projection
from fastrl_core.engines.vllm import INSTALL_HINT, VLLMEngine, rollouts_from_outputs


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    cumulative_logprob: float | None = None
    finish_reason: str | None = "stop"


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    outputs: list[CompletionOutput]
    request_id: str = "0"
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    finished: bool = True


def _lp(**values: float) -> dict[int, Logprob]:
    """{token id: Logprob} from keyword pairs t<id>=logprob."""
    ranked = sorted(values.items(), key=lambda kv: -kv[1])
    return {int(name[1:]): Logprob(value, rank) for rank, (name, value) in enumerate(ranked, start=1)}


def test_conversion_by_hand():
    outputs = [
        RequestOutput([  # completions listed out of order: rows follow CompletionOutput.index
            CompletionOutput(1, "b", [4], [_lp(t4=-0.5, t1=-1.0)]),
            CompletionOutput(0, "a", [3, 1, 0], [_lp(t3=-0.1), _lp(t1=-0.2, t2=-2.0), _lp(t0=-0.3)]),
        ]),
        RequestOutput([CompletionOutput(0, "c", [2, 5], [_lp(t2=-0.7), _lp(t5=-0.05)])]),
    ]
    rollouts = rollouts_from_outputs(outputs, [0, 2], pad_token_id=9)
    assert rollouts.prompt_index.tolist() == [0, 0, 2]
    assert rollouts.completion_ids.tolist() == [[3, 1, 0], [4, 9, 9], [2, 5, 9]]
    assert rollouts.completion_mask.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    torch.testing.assert_close(rollouts.behaviour_logprobs,
                               torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0], [-0.7, -0.05, 0.0]]))
    assert rollouts.completion_text == ["a", "b", "c"]
    assert rollouts.sketches is None and len(rollouts) == 3


def test_no_requests_give_empty_rollouts():
    rollouts = rollouts_from_outputs([], [], pad_token_id=0, top_k=4, projection=make_projection(8, 4, sketch_dim=4))
    assert len(rollouts) == 0 and rollouts.completion_ids.shape == (0, 0) and rollouts.sketches.shape == (0, 4)


def test_sketch_with_the_full_distribution_is_the_projected_bias_gradient():
    """With every token's log-prob returned, u_t = e_y − p_t exactly, so the sketch is
    Σ_j b_j R_o[j] ⊗ R_h[j mod d] of b = Σ_t (e_{y_t} − p_t): computed here by a plain loop, not by logprob_sketch."""
    vocab, hidden = 6, 4
    projection = make_projection(vocab, hidden, sketch_dim=4, seed=3)
    generator = torch.Generator().manual_seed(0)
    logprobs = torch.log_softmax(torch.randn(2, 3, vocab, generator=generator), dim=-1)  # (rows, T, V)
    tokens = [[1, 4, 0], [5, 2]]
    completions = [CompletionOutput(0, "", row, [{v: Logprob(float(logprobs[i, t, v])) for v in range(vocab)}
                                                 for t in range(len(row))]) for i, row in enumerate(tokens)]
    rollouts = rollouts_from_outputs([RequestOutput([c]) for c in completions], [0, 1], pad_token_id=3,
                                     top_k=vocab, projection=projection)
    for i, row in enumerate(tokens):
        bias_gradient = torch.zeros(vocab)
        for t, token in enumerate(row):
            bias_gradient[token] += 1.0
            bias_gradient -= logprobs[i, t].exp()
        expected = sum(bias_gradient[j] * torch.outer(projection.output[j], projection.hidden[j % hidden])
                       for j in range(vocab)).reshape(-1)
        torch.testing.assert_close(rollouts.sketches[i], expected, rtol=1e-5, atol=1e-6)


def test_sampled_token_outside_the_top_k_joins_the_sketch_set():
    projection = make_projection(8, 4, sketch_dim=4, seed=1)
    position = _lp(t0=-0.1, t1=-0.5, t7=-3.0)  # top-1 is token 0; token 7 was sampled
    output = RequestOutput([CompletionOutput(0, "x", [7], [position])])
    rollouts = rollouts_from_outputs([output], [0], pad_token_id=2, top_k=1, projection=projection)
    expected = logprob_sketch(torch.tensor([[[0, 7]]]), torch.tensor([[[-0.1, -3.0]]]), torch.tensor([[7]]),
                              torch.tensor([[True]]), projection)  # top-1 ∪ {y}, not token 1
    torch.testing.assert_close(rollouts.sketches, expected)
    assert rollouts.behaviour_logprobs.tolist() == [[-3.0]]


def test_missing_sampled_logprob_names_the_request_and_position():
    output = RequestOutput([CompletionOutput(0, "x", [3, 4], [_lp(t3=-0.1), _lp(t1=-0.2)])])
    with pytest.raises(ValueError, match=r"request 0 \(prompt 5\), completion 0, position 1.*sampled token 4"):
        rollouts_from_outputs([output], [5], pad_token_id=0)
    without = RequestOutput([CompletionOutput(0, "x", [3], None)])
    with pytest.raises(ValueError, match="no log-probs"):
        rollouts_from_outputs([without], [0], pad_token_id=0)


def test_constructing_without_vllm_says_to_install_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    with pytest.raises(ImportError, match=r"fastrl\[gpu\]") as error:
        VLLMEngine(policy=None)
    assert str(error.value) == INSTALL_HINT


def _gpu_check():
    import runpy
    from pathlib import Path

    return runpy.run_path(str(Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"))


def test_gpu_check_dry_run_runs_every_part_on_cpu(tmp_path):
    """scripts/gpu_check.py --dry-run: the GPU check's own code (the trainer's train_step) with the HF engine on CPU
    at tiny size."""
    import json

    summary = _gpu_check()["main"](["--dry-run", "--steps", "1", "--out", str(tmp_path / "check.json")])
    assert json.loads((tmp_path / "check.json").read_text())["dry_run"] is True
    assert (summary["engine"], summary["vllm_skipped"]) == ("hf", "dry run")
    (throughput,) = summary["throughput"]
    assert throughput["engine"] == "hf" and throughput["rollouts"] == 8 and throughput["tokens"] > 0
    grpo, fastrl = summary["steps"]
    assert (grpo["method"], fastrl["method"]) == ("grpo", "fastrl")
    assert grpo["kept"] == grpo["sampled"] == 8  # pruner none
    assert 0 < fastrl["kept"] < fastrl["sampled"]  # keep_ratio 0.5 of groups with varied rewards
    for row in summary["steps"]:
        assert all(row[f"t_{phase}"] >= 0 for phase in ("generate", "reward", "prune", "logprob", "update", "sync"))
        assert row["tokens"] > 0 and row["logprob_gap"] < 1e-4  # HF samples and scores with the same model
        assert row["peak_gpu_mib"] is None  # CPU
    assert [row["method"] for row in summary["trl"]] == ["trl-grpo", "trl-fastrl"]
    (kept_fraction,) = summary["trl"][1]["kept_fraction"]
    assert 0 < kept_fraction <= 0.5  # fastrl keeps at most ceil(0.5 * 4) of each group of 4


def test_gpu_check_runs_grouped_minibatches_and_refuses_them_with_one_update(tmp_path):
    """--updates / --grouped-minibatches reach the trainer (the rows record the updates made); grouping with a
    single mini-batch would change nothing, so it is refused."""
    check = _gpu_check()
    summary = check["main"](["--dry-run", "--steps", "1", "--skip-trl", "--updates", "2", "--grouped-minibatches"])
    assert [row["updates"] for row in summary["steps"]] == [2, 2]
    for argv in (["--grouped-minibatches"], ["--updates", "0"]):
        with pytest.raises(SystemExit):
            check["parse_args"](argv)


def test_gpu_check_falls_back_to_the_hf_engine_without_vllm(monkeypatch):
    import importlib.util

    check = _gpu_check()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    assert check["engine_kind"](check["parse_args"]([])) == ("hf", "vllm is not importable")
    assert check["engine_kind"](check["parse_args"](["--engine", "hf"])) == ("hf", "--engine hf")
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"fastrl\[gpu\]"):
        check["engine_kind"](check["parse_args"](["--engine", "vllm"]))
