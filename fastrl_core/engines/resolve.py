"""What each rollout engine can do, and the one place that turns a config's sketch settings into a sketch kind.

Pure: imports neither transformers nor vLLM, so the config check (`fastrl_core.run_config`) runs before any model loads.

| engine | sketches it can give   | `sketch=auto` | log-probs it returns                       | old log-probs recomputed |
|--------|------------------------|---------------|--------------------------------------------|--------------------------|
| hf     | lm_head, tokens        | lm_head       | the trainer's own forward (match to ~1e-6) | no                       |
| vllm   | logprob, tokens        | logprob       | top-K only, from vLLM's kernels            | yes (README step 7)      |

`engine=auto` picks one per run (`choose_engine`, one log line naming the choice and why). `sketch=auto` (the
default) is the engine's own gradient sketch: `lm_head` and `logprob` agree to 0.001 in cosine to the full update
(docs/results.md, "Sketches"), so with it the engine is chosen for speed alone. On vLLM it also takes the engine's own
`sketch_top_k` (20) where the config's is 0, the whole vocabulary, which vLLM cannot return (`auto_top_k`).

`lm_head` needs the last hidden states, which vLLM does not return; `logprob` needs top-K log-probs, which the HF
engine does not collect (it has the logits and hidden states, i.e. the richer `lm_head` sketch). `tokens` is
model-free (hashed completion token sets) and works with either. Whether a pruner reads a sketch at all is its
registry entry's (`fastrl_core.algo.pruners.PRUNERS`, `reads_sketches`); for every other pruner no sketch is
computed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    sketches: frozenset[str]  # sketch kinds the engine can produce (fastrl_core.algo.sketches.SKETCHES names)
    gradient_sketch: str  # what `sketch=auto` means on it: its projected output-layer gradient sketch
    same_numerics: bool  # its behaviour log-probs equal the trainer's forward, so the old pass can be skipped
    needs_top_k: bool  # its sketches need sketch_top_k >= 1 (it cannot return the whole vocabulary's log-probs)
    auto_top_k: int  # sketch_top_k that `sketch=auto` takes on it when the config's cannot be honoured (0: none)
    devices: tuple[str, ...] | None  # torch device types the trainer's policy may be on (None: any)


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(frozenset({"lm_head", "tokens"}), "lm_head", same_numerics=True, needs_top_k=False, auto_top_k=0,
                     devices=None),
    # top-20 log-probs: the logprob sketch agrees with the full update to 0.001 in cosine (docs/results.md, "Sketches")
    "vllm": EngineSpec(frozenset({"logprob", "tokens"}), "logprob", same_numerics=False, needs_top_k=True,
                       auto_top_k=20, devices=("cpu", "cuda")),
}
AUTO = "auto"  # config value of engine (choose_engine decides) and of sketch (the engine's gradient_sketch)
# Where `auto` takes vLLM on CPU: text hidden size >= CPU_VLLM_MIN_HIDDEN and vocabulary <= CPU_VLLM_MAX_VOCAB, where
# vLLM-CPU generated faster than HF in benchmarks/bench_engines.py (from hidden 512 with a small vocabulary; slower at
# the real 151,936-token vocabulary). The vocabulary bound lies between the two measured. Figures and command:
# docs/results.md, "Engines".
CPU_VLLM_MIN_HIDDEN: int | None = 512
CPU_VLLM_MAX_VOCAB: int = 32_768
# sketch kinds the engine computes while sampling, from a random projection of the policy's output layer
PROJECTED_SKETCHES = frozenset({"lm_head", "logprob"})


class UnsupportedSketch(ValueError):
    """An (engine, sketch, sketch_top_k) combination the engine cannot do; the message says what works."""


def engine_spec(engine: str) -> EngineSpec:
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; choose one of {sorted(ENGINES)}") from None


def resolve_sketch(engine: str, sketch: str, sketch_top_k: int, pruner: str) -> str | None:
    """The sketch kind the trainer computes: `sketch` itself, or None when `pruner` reads no sketch.

    Raises `UnsupportedSketch` for a pair the engine cannot do (never a silent substitute): lm_head on vLLM
    (no hidden states), logprob on HF (use lm_head, which it contains), sketch_top_k = 0 (whole vocabulary) on
    vLLM, which returns at most top-K log-probs per token.
    """
    from fastrl_core.algo.pruners import PRUNERS

    spec = engine_spec(engine)
    if not PRUNERS.get(pruner).reads_sketches:
        return None
    if sketch not in spec.sketches:
        hint = {("vllm", "lm_head"): "vLLM returns no hidden states",
                ("hf", "logprob"): "the HF engine computes the lm_head sketch, which has the hidden-state factor "
                                   "logprob lacks"}.get((engine, sketch), f"engine {engine!r} cannot compute it")
        raise UnsupportedSketch(f"sketch={sketch!r} with engine={engine!r}: {hint}; pruner {pruner!r} reads sketches, "
                                f"so choose sketch from {sorted(spec.sketches)}")
    if sketch in PROJECTED_SKETCHES and spec.needs_top_k and sketch_top_k < 1:
        raise UnsupportedSketch(f"sketch_top_k={sketch_top_k} with engine={engine!r}: it returns only the top-K "
                                f"log-probs per token, not the whole vocabulary; set sketch_top_k >= 1 (e.g. 20)")
    return sketch


def sketch_name(engine: str, sketch: str) -> str:
    """`sketch` as the run computes it on `engine`: itself, or for `auto` the engine's own gradient sketch."""
    return engine_spec(engine).gradient_sketch if sketch == AUTO else sketch


def auto_top_k(engine: str, sketch: str, sketch_top_k: int) -> int | None:
    """The sketch_top_k `sketch=auto` takes on `engine` when the config's cannot be honoured there (0, the whole
    vocabulary, on vLLM, which returns top-K log-probs only): the engine's `auto_top_k`. None: keep the config's
    (a sketch named explicitly is never changed; `resolve_sketch` rejects what it cannot do)."""
    spec = engine_spec(engine)
    if sketch == AUTO and spec.needs_top_k and sketch_top_k < 1:
        return spec.auto_top_k
    return None


def resolve_recompute_old_logprobs(engine: str, value: bool | None) -> bool:
    """`recompute_old_logprobs`: as given, or (None = auto) True exactly when the engine's numerics differ from the
    trainer's forward (vLLM), as the old-log-prob pass of README step 7 assumes."""
    return (not engine_spec(engine).same_numerics) if value is None else bool(value)


def choose_engine(device_type: str, sketch: str, pruner: str, *, vllm_importable: bool,
                  hidden_size: int | None = None, vocab_size: int | None = None) -> tuple[str, str]:
    """(engine, reason) for `engine=auto`. The rule, in order: for a pruner that reads a named sketch, the engine
    that can give it (`logprob`: vllm, `lm_head`: hf, which has the hidden states; `sketch=auto` is given by both);
    then:
    1. vLLM must import here, else hf;
    2. on CUDA: vllm (paged KV cache and CUDA graphs; what TRL, verl and EasyR1 sample with);
    3. on CPU: vllm when the model's text hidden size is at least `CPU_VLLM_MIN_HIDDEN` and its vocabulary at most
       `CPU_VLLM_MAX_VOCAB` (both from the engine bench), else hf (an unknown width counts as small, an unknown
       vocabulary as large)."""
    from fastrl_core.algo.pruners import PRUNERS

    reads_sketch = PRUNERS.get(pruner).reads_sketches and sketch != AUTO
    if reads_sketch and sketch not in ENGINES["hf"].sketches:
        return "vllm", f"pruner {pruner!r} reads sketch={sketch!r}, which only vLLM gives"
    if reads_sketch and sketch not in ENGINES["vllm"].sketches:
        return "hf", f"pruner {pruner!r} reads sketch={sketch!r}, which vLLM cannot give (it returns no hidden states)"
    if not vllm_importable:
        return "hf", "vllm does not import here"
    if device_type == "cuda":
        return "vllm", "vLLM on a GPU"
    wide = CPU_VLLM_MIN_HIDDEN is not None and hidden_size is not None and hidden_size >= CPU_VLLM_MIN_HIDDEN
    small_vocabulary = vocab_size is not None and vocab_size <= CPU_VLLM_MAX_VOCAB
    if device_type == "cpu" and wide and small_vocabulary:
        return "vllm", (f"hidden size {hidden_size} >= {CPU_VLLM_MIN_HIDDEN} and vocabulary {vocab_size} <= "
                        f"{CPU_VLLM_MAX_VOCAB}, where vLLM-CPU generated faster")
    if CPU_VLLM_MIN_HIDDEN is None:
        why = "no width yet"
    elif not wide:
        why = f"hidden size {hidden_size} < {CPU_VLLM_MIN_HIDDEN}"
    else:
        why = f"vocabulary {vocab_size} > {CPU_VLLM_MAX_VOCAB} or unknown"
    return "hf", f"on {device_type} the HF engine is faster at this size ({why}; engines.resolve)"
