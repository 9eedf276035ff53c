"""PPO mini-batches: how one step's kept rollouts are split into several optimiser updates, chosen by name.

EasyR1/verl take several optimiser steps per rollout batch: the batch is shuffled and cut into mini-batches of
`global_batch_size` rollouts (the paper: rollout batch 256 prompts / global batch 64 = 4 updates per step, §4.1;
docs/notes.md §6). Every mini-batch's importance ratio is taken against the behaviour policy (the policy before the
step), so from the second mini-batch on ratios differ from 1 and the clip acts, as in PPO (Schulman et al. 2017, §5).

Pruning leaves fewer rollouts than were sampled, and a mode says what that does to the mini-batches:

| mode           | mini-batches of K kept rows                                  | updates per step            |
|----------------|--------------------------------------------------------------|-----------------------------|
| equal_updates  | `updates` of near-equal size (sizes differ by <= 1)          | `updates` (fewer if K < it) |
| fixed_size     | chunks of ceil(full_rows / updates), last one short          | ceil(K / chunk size)        |

`equal_updates` is the authors' FastRL script (global batch 64 -> 16, so a pruned step still makes ~4 updates on
mini-batches a quarter the size); `fixed_size` is verl's default with pruning bolted on (mini-batch size fixed by
the unpruned step, so a step that kept half its rollouts makes half the updates). `full_rows` is the rollouts a
full, unpruned step samples (prompts_per_step x rollouts_per_prompt). `equal_updates` is the default: with
`fixed_size` a pruned FastRL step makes ~1 update and ends below GRPO (docs/results.md, "PPO mini-batches and what
pruning does to them", has the bench and its command).

In the trainer (step 8) each mini-batch's loss is normalised over its own rows (as verl), and everything per
rollout travels with its row: advantage, pruner loss weight, behaviour and reference log-probs (the KL term to the
reference, beta, is computed per mini-batch as in a single update); the step's loss/kl/clip metrics are the
unweighted mean over its mini-batches and `updates` counts them.

Merged duplicates (`merge_scope`, `minibatch_plan`): by default the plan is drawn over every copy of a kept row, as
the unmerged step draws it, and identical rows are merged inside each mini-batch only, so merging is exact under
several updates a step (scripts/check_merge.py measures it against the unmerged step; docs/results.md).

Rows are assigned by a seeded permutation (reproducible: resume replays it) and each mini-batch lists its rows in
ascending order, so a single mini-batch is exactly `range(K)`: with `updates=1` (either mode, K <= full_rows) the
step is the one-update step, unchanged.

Grouping (`minibatch_grouping`): `rows` permutes rows (EasyR1, TRL); `prompts` permutes prompts and keeps each
prompt's rows together before the split (verl's mini-batches without shuffling are contiguous prompt groups), so a
mini-batch holds few prompts and the engine runs each of its prompts once for all its rows (`share_prompts`); a
prompt may straddle two mini-batches. The sizes the mode gives are the same either way. `prompts` makes the update
faster at about a point of accuracy per step, so `rows` is the default (docs/results.md, the same section).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from fastrl_core.algo.registry import Registry

MinibatchSplit = Callable[[Tensor, int, int], list[Tensor]]
MINIBATCH_MODES: Registry[MinibatchSplit] = Registry("minibatch mode")
GROUPINGS = ("rows", "prompts")  # what the permutation moves (module docstring)


@MINIBATCH_MODES.register("equal_updates")
def _equal_updates(order: Tensor, updates: int, full_rows: int) -> list[Tensor]:
    """`updates` chunks of near-equal size (the first K mod updates one row larger); empty chunks dropped."""
    return [chunk for chunk in torch.tensor_split(order, updates) if len(chunk)]


@MINIBATCH_MODES.register("fixed_size")
def _fixed_size(order: Tensor, updates: int, full_rows: int) -> list[Tensor]:
    """Chunks of ceil(full_rows / updates) rows in permutation order; the last holds the remainder (verl's split)."""
    size = max(1, math.ceil(full_rows / updates))
    return list(torch.split(order, size))


@dataclass(frozen=True)
class Minibatch:
    """One optimiser update's rows: `rows` (k,) long, ascending, indexes the step's kept rows; `counts` (k,) long
    >= 1, the copies of each row this mini-batch stands for (None: one each, no merged duplicates)."""

    rows: Tensor
    counts: Tensor | None = None


MERGE_SCOPES = ("minibatch", "step")  # where merged copies are counted (minibatch_plan)


def minibatch_plan(keep_mask: Tensor, *, updates: int, mode: str, full_rows: int, generator: torch.Generator,
                   groups: Tensor | None = None, representative: Tensor | None = None,
                   merge_scope: str = "minibatch") -> list[Minibatch]:
    """The step's updates over its N rollouts.

    keep_mask (N,) bool: the kept rows (a merged copy is never kept: its representative is); groups (N,): each
    rollout's prompt, to keep a prompt's rows together (`minibatch_grouping=prompts`), None: rows; representative
    (N,) long: each rollout's representative (`Duplicates.representative`), None: no merged duplicates.

    merge_scope:
    - "minibatch" (exact): the plan is drawn over every copy of a kept row, exactly as the unmerged step draws it
      (same slots, same permutation), and the identical rows inside each mini-batch are then merged: a row appears
      once per mini-batch that holds any of its copies, counted by how many it holds. So the step's updates equal
      the unmerged step's to float rounding, for every loss and mode (tests/test_minibatches.py, test_duplicates.py),
      while the reference and old log-prob passes still run once per distinct answer.
    - "step" (lumped): the plan is drawn over the kept rows alone, each counted with its whole multiplicity in the
      one mini-batch it lands in. Fewer rows per update, but with several updates a step it is not the unmerged
      step: a class's weight all lands in one mini-batch, whose loss is normalised over its own rows.
    """
    n = keep_mask.numel()
    if groups is not None and groups.shape != keep_mask.shape:
        raise ValueError(f"groups must have the keep mask's shape {tuple(keep_mask.shape)}, got {tuple(groups.shape)}")
    if representative is not None and representative.shape != keep_mask.shape:
        raise ValueError(f"representative must have the keep mask's shape {tuple(keep_mask.shape)}, "
                         f"got {tuple(representative.shape)}")
    if merge_scope not in MERGE_SCOPES:
        raise ValueError(f"merge_scope must be one of {MERGE_SCOPES}, got {merge_scope!r}")
    keep_mask = keep_mask.bool()
    kept = keep_mask.nonzero().squeeze(1)  # (K,) rollout indices, ascending
    if representative is None or merge_scope == "step":
        slots = kept  # one slot per kept row
    else:
        slots = keep_mask[representative].nonzero().squeeze(1)  # every copy of a kept row, as unmerged
    chunks = minibatch_indices(len(slots), updates=updates, mode=mode, full_rows=full_rows, generator=generator,
                               groups=None if groups is None else groups[slots])
    if representative is None:
        return [Minibatch(chunk) for chunk in chunks]
    if merge_scope == "step":
        multiplicity = torch.bincount(representative, minlength=n)[kept]  # (K,) copies of each kept row
        return [Minibatch(chunk, multiplicity[chunk]) for chunk in chunks]
    row_of_slot = torch.searchsorted(kept, representative[slots])  # (S,) each slot's kept row
    plan = []
    for chunk in chunks:
        rows, counts = torch.unique(row_of_slot[chunk], return_counts=True)  # ascending
        plan.append(Minibatch(rows, counts))
    return plan


def minibatch_indices(num_rows: int, *, updates: int, mode: str, full_rows: int,
                      generator: torch.Generator, groups: Tensor | None = None) -> list[Tensor]:
    """Split rows 0..num_rows-1 into mini-batches: a list of 1-D long tensors, each ascending, together a
    partition of the rows (an empty list when num_rows is 0).

    updates: optimiser updates of a full step (>= 1); mode: a `MINIBATCH_MODES` name; full_rows: rollouts of a
    full, unpruned step (>= 1; used by "fixed_size"); generator: seeds the permutation, drawn only when the
    split gives more than one mini-batch (a single mini-batch is all rows in order and consumes no randomness);
    groups: (num_rows,) each row's prompt: the permutation then moves whole prompts, rows of a prompt in
    ascending order after one another; None: it moves rows.
    """
    split = MINIBATCH_MODES.get(mode)
    if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
        raise ValueError(f"updates_per_step must be an int >= 1, got {updates!r}")
    if isinstance(full_rows, bool) or not isinstance(full_rows, int) or full_rows < 1:
        raise ValueError(f"full_rows must be an int >= 1, got {full_rows!r}")
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    if num_rows == 0:
        return []
    if len(split(torch.arange(num_rows), updates, full_rows)) == 1:  # chunk sizes depend only on num_rows
        return [torch.arange(num_rows)]
    if groups is None:
        order = torch.randperm(num_rows, generator=generator)
    else:
        if groups.shape != (num_rows,):
            raise ValueError(f"groups must have shape ({num_rows},), got {tuple(groups.shape)}")
        prompts, prompt_of_row = torch.unique(groups, return_inverse=True)
        place = torch.randperm(len(prompts), generator=generator)[prompt_of_row]  # (num_rows,) its prompt's place
        order = torch.argsort(place, stable=True)  # by prompt place; a prompt's rows stay ascending
    return [chunk.sort().values for chunk in split(order, updates, full_rows)]
