"""The FastRL training loop (`Trainer`): the numbered steps below, each a call into a module, and around them the
prompt stream, timing, evaluation, checkpoints and exact resume.

Each step (README "How a step works"):
  1. budget    -- the step's prompts from the stream, rollouts per prompt from the budget controller's
                  state                                                              (algo.budgets)
  2. sample    -- generate rollouts; the lm_head gradient sketch rides on generate   (engines)
  3. reward    -- format + accuracy reward per rollout                               (rewards)
  4. advantage -- group advantages over groups of unequal size                      (algo.decide: advantages)
  5. sketch    -- gradient sketches scaled by nothing: pruners weigh them by |A|     (algo.sketches)
  6. prune     -- identical completions merged (exact), then keep mask, scores, reasons, loss weights
                  per rollout (with row_cost: keep count from pass costs), and the groups' outcomes for step 10:
                  steps 4 and 6 are one pure call, `algo.decide.decide_step`, which the TRL plug-in calls too
  7. logprob   -- reference (and, if asked, old) log-probs on KEPT rollouts only     (engines)
  8. update    -- updates_per_step optimiser steps on PPO mini-batches of KEPT rollouts, each accumulated in
                  parts of update_rows rollouts if set (algo.minibatches, algo.objectives)
  9. record    -- the step's rollouts, groups, decisions and timings to the store   (store.step_rows)
 10. budget    -- the controller's new state from step 6's group outcomes            (algo.budgets)

Departures from the authors' verl fork, on purpose: pruning acts per prompt group with a weighted
coreset on gradient sketches (`fastrl`) instead of a token-overlap rule (available as `fastrl_official`, and the
paper's rule as written as `fastrl_paper`), after identical completions are merged with their multiplicity;
with the HF engine the behaviour log-probs from generate are the old log-probs (they match a fresh
forward to ~1e-6, docs/notes.md §2), so the old pass is skipped for every method alike unless
`recompute_old_logprobs` is set (its default, auto, sets it for vLLM, whose numerics differ).

The engine is any `engines.base.Engine`: the trainer syncs it (`sync_weights`) once at start, after a checkpoint is
loaded, and after every update, so an engine holding its own weights (vLLM) always samples from the policy being
trained. Evaluation decodes with the same engine (its template and `max_new_tokens`; see `evaluate`).
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fastrl_core import checkpoints, faults
from fastrl_core.algo.budgets import budget_allocate, budget_init, budget_update
from fastrl_core.algo.costs import fit_row_cost
from fastrl_core.algo.decide import decide_step
from fastrl_core.algo.groups import Reason
from fastrl_core.algo.minibatches import Minibatch, minibatch_plan
from fastrl_core.algo.objectives import policy_loss
from fastrl_core.algo.sketches import make_projection, token_sketch
from fastrl_core.config import ConfigError
from fastrl_core.data.problems import Problem
from fastrl_core.data.templates import answer_style
from fastrl_core.engines.base import Engine, Rollouts
from fastrl_core.engines.resolve import PROJECTED_SKETCHES
from fastrl_core.resume import allowed_changes
from fastrl_core.rewards import RewardParts, score_completions
from fastrl_core.run_config import RunConfig, check_environment
from fastrl_core.run_loop import run_interleaved
from fastrl_core.run_setup import load_datasets, make_engine, preflight
from fastrl_core.store import RunWriter, StepRecord, image_key, sampled_split, step_rows
from fastrl_core.store import layout as store_layout

if TYPE_CHECKING:
    from fastrl_core.algo.sketches import SketchProjection
    from fastrl_core.policy import Policy

    EngineFactory = Callable[[TrainConfig, Policy, SketchProjection | None], Engine]

logger = logging.getLogger(__name__)
PHASES = ("generate", "reward", "sketch", "prune", "logprob", "update", "store")
COST_WINDOW = 32  # row_cost='measured': steps of phase times the fit reads (the budget moves the other seconds)


@dataclass
class PhaseTimer:
    """Wall-clock seconds and process CPU seconds spent per phase within one step.

    CPU time is `time.process_time()`: the CPU time of every thread of this process, so torch's intra-op worker
    threads are counted (`thread_time` would count only the calling thread and miss most of a 2-thread matmul).
    Unlike wall-clock it does not grow while a neighbouring job holds the cores, though cache and memory-bandwidth
    contention still inflate it a little; OpenMP workers spin-waiting after a parallel region also count (none at
    threads=1). Other threads of the process (e.g. a dashboard in the same process) would count too.
    """

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    cpu_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextmanager
    def phase(self, name: str):
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.cpu_seconds[name] += time.process_time() - cpu_start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


# Seed mixing: a run's seed and a step (or an epoch) map to one torch generator seed each, distinct for distinct
# pairs over any realistic run. Changing a value changes every run's draws: a run recorded under the old values would
# no longer resume exactly (tests/test_numerics.py pins them).
RUN_SEED_MULTIPLIER = 1_000_003  # prime, larger than any step count, so (seed, step) pairs do not collide
STEP_SEED_MULTIPLIER = 7_919  # prime
STEP_SEED_OFFSET = 17  # so that seed 0 at step 0 is not generator seed 0
SEED_MODULUS = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit signed seed
EPOCH_SEED_MULTIPLIER = 7_919  # PromptSampler: epoch e of seed s is permuted by generator seed s * this + e
RESAMPLE_STRIDE = 104_729  # prime: stream r of a step's rollouts is its seed + r * this (+1, +2 are other streams)


class PromptSampler:
    """Deterministic prompt stream. Epoch e is a fresh seeded permutation of the N problems cut to whole steps of P
    (E = (N // P)·P prompts; the last N mod P of each permutation are not used); stream position c is entry
    c mod E of epoch c // E's permutation. The trainer keeps its position (`Trainer.cursor`);
    step s reads positions [s·P, (s+1)·P)."""

    def __init__(self, num_problems: int, prompts_per_step: int, seed: int) -> None:
        if num_problems < prompts_per_step:
            raise ValueError(f"dataset has {num_problems} problems, fewer than prompts_per_step={prompts_per_step}")
        self.n, self.per_step, self.seed = num_problems, prompts_per_step, seed
        self.epoch_length = num_problems // prompts_per_step * prompts_per_step

    def window(self, cursor: int, size: int) -> list[int]:
        """Problem indices at stream positions [cursor, cursor + size), cut at the end of cursor's epoch."""
        epoch, within = divmod(cursor, self.epoch_length)
        generator = torch.Generator().manual_seed(self.seed * EPOCH_SEED_MULTIPLIER + epoch)
        order = torch.randperm(self.n, generator=generator)
        return order[within : min(within + size, self.epoch_length)].tolist()

    def advance(self, cursor: int, taken: int) -> int:
        """The cursor after a step read `taken` prompts from `cursor`. What is left of the epoch when it is too
        short for a step (fewer than P prompts) is dropped, as DataLoader's drop_last
        drops the last N mod P of each permutation: a step never has fewer than P prompts."""
        cursor += taken
        left = -cursor % self.epoch_length
        return cursor + left if left < self.per_step else cursor

    def ends_epoch(self, stop: int) -> bool:
        """Whether a step that read the stream up to position `stop` (exclusive) finished an epoch."""
        return stop > 0 and stop % self.epoch_length == 0


def step_seed(seed: int, step: int) -> int:
    """Everything random in a step derives from (seed, step): resuming at step s replays it exactly."""
    return (seed * RUN_SEED_MULTIPLIER + step * STEP_SEED_MULTIPLIER + STEP_SEED_OFFSET) % SEED_MODULUS


@dataclass
class _UpdateBatch:
    """What the update (step 8) reads of a step: its problems and rollouts, the kept rollout indices (K,), the old
    and reference log-probs of the kept rows (K, T), and per rollout (N,) advantages and pruner loss weights (each
    mini-batch carries its rows' copy counts: algo.minibatches.Minibatch)."""

    problems: list
    rollouts: Rollouts
    kept: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    weights: torch.Tensor


class Trainer:
    """Holds the run's state; `run()` executes the numbered steps until `config.steps` or the time limit.

    `resume`: continue that run of the store from its newest whole checkpoint, under its recorded config: `config`
    must equal the record but for the keys in `allow_change` (`fastrl_core.resume.allowed_changes`), which go into
    the run's config history. `policy`: a ready policy instead of `load_policy(config.model)`
    (scripts/gpu_check.py builds one at real widths); `engine_factory(config, policy, projection) -> Engine`:
    instead of `make_engine` (an engine with arguments the config does not carry, or a test double). Subclasses
    may override `score` (step 3)."""

    def __init__(self, config: RunConfig, *, resume: str | None = None, allow_change: Iterable[str] = (),
                 progress: bool = True, policy: Policy | None = None,
                 engine_factory: EngineFactory | None = None) -> None:
        if not isinstance(config, RunConfig):
            raise TypeError(f"Trainer takes the RunConfig that load_config or resolve_config returns, not a "
                            f"{type(config).__name__}: a config is checked and resolved once, before training")
        check_environment(config)  # this machine's part: vLLM installed, a CUDA device
        if allow_change and resume is None:
            raise ConfigError("--allow-change needs --resume RUN_ID (it lets a resumed run's config change)")
        lock = preflight(config, resume)  # before the data set is generated or a model loads
        try:
            changes = allowed_changes(config, resume, allow_change) if resume else {}
            self._build(config, resume, changes, lock, progress, policy, engine_factory)
        except BaseException:
            store_layout.unlock_run(lock)
            raise

    def _build(self, config: RunConfig, resume: str | None, changes: dict[str, tuple], lock: int | None,
               progress: bool, policy: Policy | None, engine_factory: EngineFactory | None) -> None:
        from fastrl_core.evaluate import evaluate_with
        from fastrl_core.named_models import model_path
        from fastrl_core.policy import load_policy

        self.config, self.progress, self._evaluate = config, progress, evaluate_with
        torch.set_num_threads(config.threads)
        self.train_set, self.test_set = load_datasets(config)
        self.test_set = self.test_set[: config.eval_size]
        self.sampler = PromptSampler(len(self.train_set), config.prompts_per_step, config.seed)
        self.policy = policy if policy is not None else load_policy(model_path(config.model), device=config.device)
        model = self.policy.model
        self.beta = float(config.objective_args.get("beta", 0.0))
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if self.beta > 0 else None
        self.projection = None
        if config.sketch_kind in PROJECTED_SKETCHES:
            out = model.get_output_embeddings().weight
            # left on the CPU: each engine moves it to where it sketches (HF: beside its hidden states; vLLM: the
            # CPU, from its Python outputs), so no engine meets a projection on another device
            self.projection = make_projection(out.shape[0], out.shape[1], sketch_dim=config.sketch_dim,
                                              seed=config.seed)
        self.engine: Engine = (engine_factory or make_engine)(config, self.policy, self.projection)
        # max_length: dr_grpo's constant normaliser (aggregation seq_mean_token_sum_norm) is the generation limit,
        # not each step's padded length (docs/notes.md §7); the other aggregations ignore it
        self.loss_args = {"max_length": config.max_new_tokens, **config.objective_args}
        self.answer_style = answer_style(config.template)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.budget_state = budget_init(config.budget, n=config.rollouts_per_prompt, **config.budget_args)
        self.step, self.train_seconds, self._last_store = 0, 0.0, (0.0, 0.0)
        self.cursor = 0  # the prompt stream's next position (PromptSampler)
        self.pass_costs: list[tuple[int, float, float]] = []  # last steps: rows kept, log-prob + update s, step s
        self._images: dict[str, tuple[str, bytes]] = {}
        store_meta = dict(model=config.model, dataset=config.dataset, objective=config.objective,
                          pruner=config.pruner, budget=config.budget)
        if resume:
            found = checkpoints.load_whole(checkpoints.root(config.store_dir, resume), self._read_checkpoint)
            if found is not None:
                self._apply_checkpoint(*found[1])
            # steps written after the checkpoint (all of them without one: the run restarts from its initial state)
            # are dropped, and the resumed run rewrites them exactly
            self.writer = RunWriter.resume(config.store_dir, resume, from_step=self.step, lock_fd=lock)
            self.writer.record_config(self.step, config.options(), changes)
            for key, (old, new) in changes.items():
                logger.warning("run %s: %s %r -> %r from step %d on (allowed; in the run's config history)", resume,
                               key, old, new, self.step)
        else:
            self.writer = RunWriter(config.store_dir, name=config.run_name, config=config.options(), **store_meta)
        self.engine.sync_weights(model)  # an engine with its own weights starts from the (loaded) policy's

    # ---------------------------------------------------------------- one step
    def train_step(self) -> dict:
        config, step, timer = self.config, self.step, PhaseTimer()
        seed = step_seed(config.seed, step)
        model = self.policy.model

        # 1. budget: the step's prompts and rollouts per prompt
        problems, counts, epoch_end = self.choose_prompts()
        prompt_ids = [p.id for p in problems]

        # 2. sample (the lm_head sketch accumulates inside generate when a projection is set)
        with timer.phase("generate"):
            model.eval()
            sample_seed = (seed + RESAMPLE_STRIDE * config.resample) % SEED_MODULUS
            rollouts = self.engine.generate(problems, counts, generator=torch.Generator().manual_seed(sample_seed))
        group_ids = rollouts.prompt_index
        rollout_problems = [problems[i] for i in group_ids.tolist()]

        # 3. reward
        with timer.phase("reward"):
            parts = self.score(rollouts.completion_text, rollout_problems)
            rewards = torch.tensor([p.overall for p in parts])
            accuracy = torch.tensor([p.accuracy for p in parts])

        # 4.-6. advantage, sketch, merge + prune (one pure decision, shared with the TRL plug-in: algo.decide)
        with timer.phase("sketch"):
            sketches = rollouts.sketches
            if config.sketch_kind == "tokens":
                sketches = token_sketch(rollouts.completion_ids, rollouts.completion_mask, dim=config.sketch_dim,
                                        seed=config.seed)
        with timer.phase("prune"):
            row_cost = self.row_cost()
            decided = decide_step(
                rewards=rewards, group_ids=group_ids, num_groups=len(problems), advantage=config.advantage,
                completion_ids=rollouts.completion_ids, completion_mask=rollouts.completion_mask, sketches=sketches,
                pruner=config.pruner, keep_ratio=config.keep_ratio, min_keep=config.min_keep,
                generator=torch.Generator().manual_seed(seed + 1), merge_duplicates=config.merge_duplicates,
                row_cost=row_cost, pruner_args=config.pruner_args, accuracy=accuracy)
            advantages, duplicates, decision = decided.advantages, decided.duplicates, decided.pruned
            kept = decision.keep_mask.nonzero().squeeze(1)

        # 7. logprob: old / reference passes on kept rollouts only
        with timer.phase("logprob"), torch.no_grad():
            old_logprobs = rollouts.behaviour_logprobs[kept]
            if config.recompute_old_logprobs and len(kept):
                old_logprobs = self.engine.token_logprobs(model, problems, rollouts, kept)
            ref_logprobs = None
            if self.reference is not None and len(kept):
                ref_logprobs = self.engine.token_logprobs(self.reference, problems, rollouts, kept)

        # 8. update on kept rollouts only: PPO mini-batches, each against the behaviour (pre-step) log-probs
        metrics = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "updates": 0}
        with timer.phase("update"):
            for group in self.optimizer.param_groups:
                group["lr"] = config.lr * min(1.0, (step + 1) / max(1, config.warmup_steps))
            minibatches = minibatch_plan(
                decision.keep_mask, updates=config.updates_per_step, mode=config.minibatch_mode,
                full_rows=config.prompts_per_step * config.rollouts_per_prompt,
                generator=torch.Generator().manual_seed(seed + 2),
                groups=group_ids if config.minibatch_grouping == "prompts" else None,
                representative=None if duplicates is None else duplicates.representative,
                merge_scope=config.merge_scope)
            if minibatches:
                model.train()
            per_update = []
            update = _UpdateBatch(problems, rollouts, kept, old_logprobs, ref_logprobs, advantages, decision.weights)
            for batch in minibatches:  # batch.rows index `kept`
                self.optimizer.zero_grad(set_to_none=True)
                per_update.append(self._backward(update, batch))
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                self.optimizer.step()
            if per_update:  # unweighted mean over the step's mini-batches
                metrics = {k: sum(u[k] for u in per_update) / len(per_update) for k in per_update[0]}
            metrics["updates"] = len(minibatches)  # optimiser steps taken
            metrics["update_rows"] = sum(len(batch.rows) for batch in minibatches)  # rows through the update's passes
            self.engine.sync_weights(model)

        # 9. record
        self.train_seconds += timer.total
        # a step's own write cannot be in its own row: time_store / cpu_store are the previous step's write
        timer.seconds["store"], timer.cpu_seconds["store"] = self._last_store
        store_timer = PhaseTimer()
        with store_timer.phase("store"):
            image_refs, images = self._image_refs(problems)
            rows = step_rows(StepRecord(
                step=step, prompt_ids=prompt_ids, questions=[p.question for p in problems],
                answers=[p.answer for p in problems], image_refs=image_refs, images=images, group_index=group_ids,
                completions=rollouts.completion_text, lengths=rollouts.completion_mask.sum(1), rewards=rewards,
                advantages=advantages, keep_mask=decision.keep_mask,
                reasons=[Reason(r).name for r in decision.reasons.tolist()], scores=decision.scores,
                weights=decision.weights, sketches=sketches, format_rewards=[p.format for p in parts],
                accuracy_rewards=accuracy.tolist(), seconds=timer.seconds, cpu_seconds=timer.cpu_seconds,
                metrics={"lr": self.optimizer.param_groups[0]["lr"], "epoch_end": epoch_end, "row_cost": row_cost,
                         **metrics},
                wall_time=self.train_seconds, nominal_per_prompt=config.rollouts_per_prompt,
                multiplicity=None if duplicates is None else duplicates.multiplicity,
                token_ids=rollouts.completion_ids, token_mask=rollouts.completion_mask,
                token_logprobs=rollouts.behaviour_logprobs,
                decode_token=lambda token: self.policy.tokenizer.decode([token])), log_rollouts=config.log_rollouts)
            rows.write_to(self.writer)
        self._last_store = (store_timer.seconds["store"], store_timer.cpu_seconds["store"])
        self.train_seconds += store_timer.seconds["store"]
        self.pass_costs = [*self.pass_costs, (len(kept), timer.seconds["logprob"] + timer.seconds["update"],
                                              timer.total)][-COST_WINDOW:]  # what row_cost='measured' fits

        # 10. budget: new state from this step's group outcomes (built by the decision, step 6)
        self.budget_state = budget_update(config.budget, self.budget_state, decided.groups.outcomes(
            prompt_ids, step=step, total_steps=config.steps, epoch_end=epoch_end))
        self.step += 1
        return {"step": step, **rows.step_row}

    def _backward(self, update: _UpdateBatch, batch: Minibatch) -> dict[str, float]:
        """Gradients of one mini-batch's loss into `.grad`: kept rows `batch.rows` (index `update.kept`), each
        counted `batch.counts` times (merged copies in this mini-batch). With `update_rows`, in parts of that many
        rows, each part's loss counting the mini-batch's other rows as absent (`policy_loss(absent_mask=...)`), so
        the parts' losses sum to the whole mini-batch's and so do their gradients. Returns the loss and the loss's
        metrics (over parts: weighted by response tokens)."""
        config, rollouts, on = self.config, update.rollouts, self.policy.model.device
        mask = rollouts.completion_mask
        positions = torch.arange(len(batch.rows))
        parts = positions.split(config.update_rows) if config.update_rows else (positions,)
        counts = torch.ones(len(batch.rows)) if batch.counts is None else batch.counts.float()  # (k,)
        merged = batch.counts is not None
        results = []  # (loss, metrics, response tokens) per part
        for part in parts:
            others = positions[~torch.isin(positions, part)]
            index, absent = update.kept[batch.rows[part]], update.kept[batch.rows[others]]  # rollout indices
            logprobs = self.engine.token_logprobs(self.policy.model, update.problems, rollouts, index)
            rows = batch.rows[part]
            out = policy_loss(config.objective, logprobs, update.old_logprobs[rows].to(on),
                              update.advantages[index].to(on), mask[index].to(on),
                              ref_logprobs=None if update.ref_logprobs is None else update.ref_logprobs[rows].to(on),
                              rollout_weights=update.weights[index].to(on),
                              rollout_counts=counts[part].to(on) if merged else None,
                              absent_mask=mask[absent].to(on),  # (0, T) with one part
                              absent_counts=counts[others].to(on) if merged else None,
                              **self.loss_args)
            out.loss.backward()
            results.append((out.loss.item(), out.metrics, float((mask[index].sum(-1) * counts[part]).sum())))
        if len(results) == 1:
            return {"loss": results[0][0], **{key: float(value) for key, value in results[0][1].items()}}
        tokens = max(sum(t for _, _, t in results), 1.0)
        return {"loss": sum(loss for loss, _, _ in results),
                **{key: sum(float(m[key]) * t for _, m, t in results) / tokens for key in results[0][1]}}

    def choose_prompts(self) -> tuple[list[Problem], list[int], bool]:
        """Step 1: the next P problems of the stream at `cursor`, the budget's rollout counts for them, and
        whether the step ends an epoch; moves the cursor past them."""
        config = self.config
        problems = [self.train_set[i] for i in self.sampler.window(self.cursor, config.prompts_per_step)]
        counts = budget_allocate(config.budget, self.budget_state, [p.id for p in problems])
        self.cursor = self.sampler.advance(self.cursor, len(problems))
        return problems, counts, self.sampler.ends_epoch(self.cursor)

    def row_cost(self) -> float | None:
        """Step 6's ρ (algo.costs): config `row_cost` as given, or with 'measured' fitted on the last
        COST_WINDOW steps' phase times (None until the fit exists: the keep ratio alone decides)."""
        if self.config.row_cost != "measured":
            return self.config.row_cost
        return fit_row_cost(*zip(*self.pass_costs)) if self.pass_costs else None

    def score(self, completions: list[str], problems: list[Problem]) -> list[RewardParts]:
        """Step 3: the reward parts of each completion of its problem (format + accuracy, fastrl_core.rewards)."""
        return score_completions(completions, problems, style=self.answer_style,
                                 format_weight=self.config.format_weight, accuracy_weight=self.config.accuracy_weight)

    def _image_refs(self, problems: list[Problem]) -> tuple[list[str | None], dict[str, bytes]]:
        """Each problem's image key, and the PNGs this trainer has not handed to the store before."""
        refs, new = [], {}
        for problem in problems:
            if problem.id not in self._images:
                data = problem.image_path.read_bytes() if problem.image_path else None
                self._images[problem.id] = (image_key(data) if data else None, data)
                if data:
                    new[self._images[problem.id][0]] = data
            refs.append(self._images[problem.id][0])
        return refs, new

    # ---------------------------------------------------------------- loop
    def evaluate(self) -> dict:
        """Greedy accuracy on the test split (eval split `test_split`) and, with eval_samples = k, mean@k at the
        training temperature (split `<test_split>-sampled`, key "sampled_accuracy" of the result). Each eval row
        also holds accuracy_<kind> per problem kind. The samples draw from a generator seeded by the run's seed
        alone: every evaluation of a run, and the same seed's runs of other methods, share random numbers."""
        config = self.config
        result = self._evaluate(self.engine, self.policy, self.test_set, template=config.template,
                                progress=self.progress)
        self._write_eval(config.test_split, result)
        if config.eval_samples:
            sampled = self._evaluate(self.engine, self.policy, self.test_set, template=config.template,
                                     samples=config.eval_samples, progress=self.progress,
                                     generator=torch.Generator().manual_seed(config.seed))
            self._write_eval(sampled_split(config.test_split), sampled)
            result = {**result, "sampled_accuracy": sampled["accuracy"]}
        faults.reach("eval.written")
        return result

    def _write_eval(self, split: str, result: dict) -> None:
        per_kind = {f"accuracy_{re.sub(r'[^0-9A-Za-z_]', '_', kind)}": value
                    for kind, value in result["per_kind"].items()}
        self.writer.write_eval(self.step, split, result["accuracy"], result["n"], format_rate=result["format_rate"],
                               wall_time=self.train_seconds, **per_kind)

    def run(self) -> str:
        """Train to `config.steps` (or the time limit) with evaluations and checkpoints; returns the run id. The loop
        is `run_loop.run_interleaved` over this one run: Ctrl-C / SIGTERM mark the run stopped, an error failed."""
        return run_interleaved({self.config.run_name: self}, progress=self.progress)[self.config.run_name]

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoint_dir(self) -> Path:
        """This run's checkpoints folder (`fastrl_core.checkpoints`: one complete step folder, swapped atomically)."""
        return checkpoints.root(self.config.store_dir, self.writer.run_id)

    def save_checkpoint(self) -> Path:
        """Model, optimiser, budget state and step, as one checkpoint with its manifest, swapped in atomically (a
        kill at any instant leaves the old one or the new one whole); returns its folder."""
        from fastrl_core.policy import save_policy

        def write(folder: Path) -> None:
            save_policy(self.policy, folder / "policy")
            faults.reach("checkpoint.policy_written")
            torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step,
                        "train_seconds": self.train_seconds, "python_random": random.getstate(),
                        "pass_costs": self.pass_costs, "cursor": self.cursor}, folder / "trainer.pt")
            (folder / "budget.json").write_text(json.dumps(self.budget_state))

        return checkpoints.save(self.checkpoint_dir, self.step, write)

    def _read_checkpoint(self, path: Path) -> tuple[dict, dict, dict]:
        """A checkpoint's model weights, trainer state and budget state, read without changing the trainer (a
        damaged one raises, and `checkpoints.load_whole` goes on to the previous one)."""
        from fastrl_core.policy import load_policy

        weights = load_policy(str(path / "policy")).model.state_dict()
        state = torch.load(path / "trainer.pt", weights_only=False)
        return weights, state, json.loads((path / "budget.json").read_text())

    def _apply_checkpoint(self, weights: dict, state: dict, budget_state: dict) -> None:
        self.policy.model.load_state_dict(weights)
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the saved groups hold the run's weight decay: the config's
            group["weight_decay"] = self.config.weight_decay  # (changed on resume or not) is the one in force
        self.step, self.train_seconds = state["step"], state["train_seconds"]
        random.setstate(state["python_random"])
        self.pass_costs = state.get("pass_costs", [])  # absent in checkpoints written before row_cost
        self.cursor = state.get("cursor", self.step * self.config.prompts_per_step)  # absent before filling
        self.budget_state = budget_state

def train(config: RunConfig, *, resume: str | None = None, allow_change: Iterable[str] = (),
          progress: bool = True) -> str:
    """Train with `config` (or resume run `resume` from its newest whole checkpoint, or from its initial state when
    it was killed before its first checkpoint, letting the keys of `allow_change` differ from its record); returns
    the run id."""
    return Trainer(config, resume=resume, allow_change=allow_change, progress=progress).run()
