"""What every rollout engine returns (`Rollouts`) and the interface the trainer, evaluation and scripts call
(`Engine`): the one contract between the training loop and a sampler, so no caller asks `hasattr`.

Two engines implement it: `HFEngine` (transformers `generate`, CPU or GPU; shares the trainer's model, so
`sync_weights` has nothing to do) and `VLLMEngine` (vLLM on CPU or GPU; holds its own copy of the weights, which
`sync_weights` refreshes). The contract, in the order the trainer uses it (fastrl_core/trainer.py):

- `generate(problems, rollouts_per_prompt, *, generator)`: `rollouts_per_prompt[p]` sampled completions of
  problem p (0 allowed), as `Rollouts` whose `behaviour_logprobs` are log π(y_t) of the weights last synced,
  softmax of the raw logits (before temperature); randomness only from `generator`.
- `token_logprobs(model, problems, rollouts, index)`: log `model`(y_t | prompt, y_<t) for rows `index` of
  `rollouts` sampled from `problems`, (n, T) float32, 0 where masked, with grad when grad is enabled: the old,
  reference and policy passes of the update run through it on the trainer's own models.
- `greedy(problems, *, batch_size)`: argmax-decoded completion text per problem (evaluation).
- `sync_weights(model)`: make `generate` / `greedy` sample from `model`'s current parameters. The trainer calls
  it after every update and once at start (after a checkpoint is loaded), whether or not the engine copies
  weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class Rollouts:
    """Sampled completions for a step's prompts; row i belongs to prompt `prompt_index[i]`."""

    prompt_index: Tensor  # (N,) long: index into the step's prompt list
    completion_ids: Tensor  # (N, T) right-padded sampled tokens (pad after EOS)
    completion_mask: Tensor  # (N, T) bool: True up to and including EOS
    completion_text: list[str]  # (N,) decoded, special tokens dropped
    behaviour_logprobs: Tensor  # (N, T) float32 log π_old(y_t) from the sampling pass, 0 where masked
    sketches: Tensor | None  # (N, D) advantage-free gradient sketches, or None without a projection

    def __len__(self) -> int:
        return self.prompt_index.shape[0]


@runtime_checkable
class Engine(Protocol):
    """A rollout engine (module docstring). `isinstance(x, Engine)` checks the four methods exist;
    tests/test_engine_base.py also checks every engine class's signatures against these."""

    def generate(
        self, problems: Sequence, rollouts_per_prompt: Sequence[int], *, generator: torch.Generator | None = None
    ) -> Rollouts: ...

    def token_logprobs(self, model: torch.nn.Module, problems: Sequence, rollouts: Rollouts, index: Tensor) -> Tensor:
        ...

    def greedy(self, problems: Sequence, *, batch_size: int = 64) -> list[str]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...
