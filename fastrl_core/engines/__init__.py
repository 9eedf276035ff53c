"""Rollout engines: sample completions with behaviour log-probs (and sketches), re-score them for the update.

`hf`: transformers `generate` (CPU or GPU), the default and the only one testable on CPU.
"""

from fastrl_core.engines.hf import HFEngine, PromptBatch, Rollouts

__all__ = ["HFEngine", "PromptBatch", "Rollouts"]
