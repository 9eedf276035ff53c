"""Rollout engines: sample completions with behaviour log-probs (and sketches), re-score them for the update.

`hf`: transformers `generate` (CPU or GPU), the default and the only one testable on CPU. `vllm`: GPU only.
What each engine can do, and the sketch kind a config resolves to, is in `fastrl_core.engines.resolve` (pure).
`HFEngine`, `PromptBatch` and `Rollouts` are imported on first use, so the resolver loads without transformers.
"""

__all__ = ["HFEngine", "PromptBatch", "Rollouts"]


def __getattr__(name: str):
    if name in __all__:
        from fastrl_core.engines import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
