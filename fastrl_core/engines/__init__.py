"""Rollout engines: sample completions with behaviour log-probs (and sketches), re-score them for the update.

`base`: the `Rollouts` type and the `Engine` protocol every engine implements.
`hf`: transformers `generate` (CPU or GPU), the default and the only one testable on CPU.
`vllm`: vLLM (GPU only), imported lazily.
"""

from fastrl_core.engines.base import Engine, Rollouts
from fastrl_core.engines.hf import HFEngine, PromptBatch

__all__ = ["Engine", "HFEngine", "PromptBatch", "Rollouts"]
