"""FastRL: advantage-aware rollout pruning and adaptive rollout budgets for GRPO-style RL.

`fastrl_core.algo` is the pure algorithm (tensors in, tensors out); everything else orchestrates it.
"""

__version__ = "0.1.0"
