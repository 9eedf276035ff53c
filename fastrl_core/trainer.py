"""The FastRL training loop: orchestration only, one call into a pure module per numbered step.

Each step (README "The algorithm"):
  1. budget    -- rollouts per prompt from the budget controller's state            (algo.budgets)
  2. sample    -- generate rollouts; the lm_head gradient sketch rides on generate   (engines)
  3. reward    -- format + accuracy reward per rollout                               (rewards)
  4. advantage -- group advantages over groups of unequal size                      (algo.advantages)
  5. sketch    -- gradient sketches scaled by nothing: pruners weigh them by |A|     (algo.sketches)
  6. prune     -- keep mask, scores, reasons, loss weights per rollout               (algo.pruners)
  7. logprob   -- reference (and, if asked, old) log-probs on KEPT rollouts only     (engines)
  8. update    -- updates_per_step optimiser steps on PPO mini-batches of KEPT rollouts (algo.minibatches,
                  algo.objectives)
  9. record    -- the step's rollouts, groups, decisions and timings to the store   (store)
 10. budget    -- the controller's new state from this step's kept counts           (algo.budgets)

Departures from the authors' verl fork, on purpose: pruning acts per prompt group with a
gradient-sketch DPP (`fastrl`) instead of a token-overlap rule (available as `fastrl_official`);
with the HF engine the behaviour log-probs from generate are the old log-probs (they match a fresh
forward to ~1e-6, NOTES §2), so the old pass is skipped for every method alike unless
`recompute_old_logprobs` is set.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fastrl_core.algo.advantages import compute_advantages
from fastrl_core.algo.budgets import StepOutcome, budget_allocate, budget_init, budget_update
from fastrl_core.algo.minibatches import minibatch_indices
from fastrl_core.algo.objectives import policy_loss
from fastrl_core.algo.pruners import GroupBatch, Reason, prune
from fastrl_core.algo.sketches import make_projection, token_sketch
from fastrl_core.config import TrainConfig
from fastrl_core.data.problems import Problem
from fastrl_core.data.templates import answer_style
from fastrl_core.rewards import score_completions
from fastrl_core.store import RunWriter, image_key

PHASES = ("generate", "reward", "sketch", "prune", "logprob", "update", "store")
SKETCH_PRUNERS = {"fastrl"}  # pruners that read gradient sketches; others are not charged for computing them


@dataclass
class PhaseTimer:
    """Seconds spent per phase within one step."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


class PromptSampler:
    """Deterministic prompt order: a fresh seeded permutation per epoch; step s takes the next P prompts."""

    def __init__(self, num_problems: int, prompts_per_step: int, seed: int) -> None:
        if num_problems < prompts_per_step:
            raise ValueError(f"dataset has {num_problems} problems, fewer than prompts_per_step={prompts_per_step}")
        self.n, self.per_step, self.seed = num_problems, prompts_per_step, seed
        self.steps_per_epoch = num_problems // prompts_per_step

    def batch(self, step: int) -> tuple[list[int], bool]:
        """Problem indices for `step` and whether the step ends an epoch."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
        start = within * self.per_step
        return order[start : start + self.per_step].tolist(), within == self.steps_per_epoch - 1


def step_seed(seed: int, step: int) -> int:
    """Everything random in a step derives from (seed, step): resuming at step s replays it exactly."""
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**63 - 1)


def load_datasets(config: TrainConfig) -> tuple[list[Problem], list[Problem]]:
    from fastrl_core.data.problems import load_problems

    if config.dataset == "synthetic":
        from fastrl_core.data.synthetic import ensure_dataset

        root = ensure_dataset(Path(config.store_dir) / "data", n_train=config.synthetic_train,
                              n_test=config.synthetic_test, seed=0, kinds=config.synthetic_kinds or None,
                              levels=config.synthetic_levels or None)
        return load_problems(root / config.train_split), load_problems(root / config.test_split)
    return (load_problems(config.dataset, split=config.train_split),
            load_problems(config.dataset, split=config.test_split))


def make_engine(config: TrainConfig, policy, projection):
    if config.engine == "hf":
        from fastrl_core.engines.hf import HFEngine

        return HFEngine(policy, template=config.template, max_new_tokens=config.max_new_tokens,
                        temperature=config.temperature, sketch_projection=projection,
                        sketch_top_k=config.sketch_top_k or None)
    if config.engine == "vllm":
        from fastrl_core.engines.vllm import VLLMEngine

        return VLLMEngine(policy, template=config.template, max_new_tokens=config.max_new_tokens,
                          temperature=config.temperature, sketch_projection=projection,
                          sketch_top_k=config.sketch_top_k or 20)
    raise ValueError(f"unknown engine {config.engine!r}; choose 'hf' or 'vllm'")


class Trainer:
    """Holds the run's state; `run()` executes the numbered steps until `config.steps` or the time limit."""

    def __init__(self, config: TrainConfig, *, resume: str | None = None, progress: bool = True) -> None:
        from fastrl_core.evaluate import evaluate
        from fastrl_core.policy import load_policy

        self.config, self.progress, self._evaluate = config, progress, evaluate
        torch.set_num_threads(config.threads)
        self.train_set, self.test_set = load_datasets(config)
        self.test_set = self.test_set[: config.eval_size]
        self.sampler = PromptSampler(len(self.train_set), config.prompts_per_step, config.seed)
        self.policy = load_policy(config.model, device=config.device)
        model = self.policy.model
        self.beta = float(config.objective_args.get("beta", 0.0))
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if self.beta > 0 else None
        self.projection = None
        if config.pruner in SKETCH_PRUNERS and config.sketch == "lm_head":
            out = model.get_output_embeddings().weight
            self.projection = make_projection(out.shape[0], out.shape[1], sketch_dim=config.sketch_dim,
                                              seed=config.seed).to(out.device)
        self.engine = make_engine(config, self.policy, self.projection)
        self.answer_style = answer_style(config.template)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.budget_state = budget_init(config.budget, n=config.rollouts_per_prompt, **config.budget_args)
        self.step, self.train_seconds, self._last_store_seconds = 0, 0.0, 0.0
        self._images: dict[str, tuple[str, bytes]] = {}
        store_meta = dict(model=config.model, dataset=config.dataset, objective=config.objective,
                          pruner=config.pruner, budget=config.budget)
        if resume:
            self._load_checkpoint(Path(config.store_dir) / "checkpoints" / resume)
            # steps written after the checkpoint are dropped: the resumed run rewrites them exactly
            self.writer = RunWriter.resume(config.store_dir, resume, from_step=self.step)
        else:
            self.writer = RunWriter(config.store_dir, name=config.run_name, config=asdict(config), **store_meta)

    # ---------------------------------------------------------------- one step
    def train_step(self) -> dict:
        config, step, timer = self.config, self.step, PhaseTimer()
        seed = step_seed(config.seed, step)
        indices, epoch_end = self.sampler.batch(step)
        problems = [self.train_set[i] for i in indices]
        prompt_ids = [p.id for p in problems]
        model = self.policy.model

        # 1. budget: rollouts per prompt
        counts = budget_allocate(config.budget, self.budget_state, prompt_ids)

        # 2. sample (the lm_head sketch accumulates inside generate when a projection is set)
        with timer.phase("generate"):
            model.eval()
            rollouts = self.engine.generate(problems, counts, generator=torch.Generator().manual_seed(seed))
        group_ids = rollouts.prompt_index
        rollout_problems = [problems[i] for i in group_ids.tolist()]

        # 3. reward
        with timer.phase("reward"):
            parts = score_completions(rollouts.completion_text, rollout_problems, style=self.answer_style,
                                      format_weight=config.format_weight, accuracy_weight=config.accuracy_weight)
            rewards = torch.tensor([p.overall for p in parts])
            accuracy = torch.tensor([p.accuracy for p in parts])

        # 4. advantage
        advantages = compute_advantages(config.advantage, rewards, group_ids)

        # 5. sketch
        with timer.phase("sketch"):
            sketches = rollouts.sketches
            if config.pruner in SKETCH_PRUNERS and config.sketch == "tokens":
                sketches = token_sketch(rollouts.completion_ids, rollouts.completion_mask, dim=config.sketch_dim,
                                        seed=config.seed)
            token_ids = None
            if config.pruner == "fastrl_official":
                token_ids = tuple(ids[mask] for ids, mask in zip(rollouts.completion_ids, rollouts.completion_mask))

        # 6. prune
        with timer.phase("prune"):
            decision = prune(config.pruner, GroupBatch(group_ids, rewards, advantages, sketches, token_ids),
                             keep_ratio=config.keep_ratio, min_keep=config.min_keep,
                             generator=torch.Generator().manual_seed(seed + 1), **config.pruner_args)
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
            minibatches = minibatch_indices(
                len(kept), updates=config.updates_per_step, mode=config.minibatch_mode,
                full_rows=config.prompts_per_step * config.rollouts_per_prompt,
                generator=torch.Generator().manual_seed(seed + 2))
            if minibatches:
                model.train()
            per_update = []
            for rows in minibatches:  # rows index into `kept`; each update's loss is normalised over its own rows
                index = kept[rows]
                logprobs = self.engine.token_logprobs(model, problems, rollouts, index)
                on = logprobs.device  # the loss runs where the model is
                out = policy_loss(config.objective, logprobs, old_logprobs[rows].to(on), advantages[index].to(on),
                                  rollouts.completion_mask[index].to(on),
                                  ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows].to(on),
                                  rollout_weights=decision.weights[index].to(on), **config.objective_args)
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                self.optimizer.step()
                per_update.append({"loss": out.loss.item(), **{k: float(v) for k, v in out.metrics.items()}})
            if per_update:  # unweighted mean over the step's mini-batches
                metrics = {k: sum(u[k] for u in per_update) / len(per_update) for k in per_update[0]}
                metrics["updates"] = len(per_update)
            if self.engine_needs_sync:
                self.engine.sync_weights(model)

        # 9. record
        group_reward_mean, group_reward_std, sampled, kept_counts = _group_stats(
            rewards, group_ids, decision.keep_mask, len(problems))
        self.train_seconds += timer.total
        row = {
            "step": step, "rollouts_sampled": len(rewards), "rollouts_kept": len(kept),
            "rollouts_per_prompt": len(rewards) / len(problems), "reward_mean": rewards.mean().item(),
            "accuracy": accuracy.mean().item(), "format_rate": sum(p.format for p in parts) / len(parts),
            "zero_variance_groups": int((group_reward_std == 0).sum()), "lr": self.optimizer.param_groups[0]["lr"],
            "epoch_end": epoch_end, **metrics,
        }
        # a step's own write cannot be in its own row: time_store is the previous step's write
        timer.seconds["store"] = self._last_store_seconds
        start = time.perf_counter()
        self._record(row, timer, problems, rollouts, rollout_problems, parts, advantages, decision, sketches,
                     group_reward_mean, group_reward_std, sampled, kept_counts)
        self._last_store_seconds = time.perf_counter() - start
        self.train_seconds += self._last_store_seconds

        # 10. budget: new state from this step's pruning decisions
        self.budget_state = budget_update(config.budget, self.budget_state, StepOutcome(
            prompt_ids=tuple(prompt_ids), sampled=sampled, kept=kept_counts, reward_mean=group_reward_mean,
            reward_std=group_reward_std, step=step, total_steps=config.steps, epoch_end=epoch_end))
        self.step += 1
        return row

    @property
    def engine_needs_sync(self) -> bool:
        return hasattr(self.engine, "sync_weights")

    def _record(self, row, timer, problems, rollouts, rollout_problems, parts, advantages, decision, sketches,
                group_reward_mean, group_reward_std, sampled, kept_counts) -> None:
        images = {}
        refs = []
        for problem in problems:
            if problem.id not in self._images:
                data = problem.image_path.read_bytes() if problem.image_path else None
                self._images[problem.id] = (image_key(data) if data else None, data)
                if data:
                    images[self._images[problem.id][0]] = data
            refs.append(self._images[problem.id][0])
        groups = [
            {"prompt_id": p.id, "reward_mean": float(group_reward_mean[g]), "reward_std": float(group_reward_std[g]),
             "sampled": int(sampled[g]), "kept": int(kept_counts[g])}
            for g, p in enumerate(problems)
        ]
        rows = []
        if self.config.log_rollouts:  # plain lists first: indexing a tensor once per value is slow
            lengths = rollouts.completion_mask.sum(1).tolist()
            sketch_rows = sketches.detach().float().cpu().numpy() if sketches is not None else None  # rows: views
            prompt_index, advantage = rollouts.prompt_index.tolist(), advantages.tolist()
            kept, score, weight = decision.keep_mask.tolist(), decision.scores.tolist(), decision.weights.tolist()
            reasons = [Reason(r).name for r in decision.reasons.tolist()]
            for i, problem in enumerate(rollout_problems):
                rows.append({
                    "rollout_id": f"{row['step']}-{i}", "prompt_id": problem.id, "image_ref": refs[prompt_index[i]],
                    "question": problem.question, "answer": problem.answer, "completion": rollouts.completion_text[i],
                    "reward": parts[i].overall, "format_reward": parts[i].format, "accuracy_reward": parts[i].accuracy,
                    "advantage": advantage[i], "kept": kept[i], "reason": reasons[i], "score": score[i],
                    "weight": weight[i], "length": lengths[i],
                    "sketch": sketch_rows[i] if sketch_rows is not None else None,
                })
        step_row = {**row, "wall_time": self.train_seconds,
                    **{f"time_{name}": seconds for name, seconds in timer.seconds.items()}}
        self.writer.write_step(row["step"], step_row=step_row, groups=groups, rollouts=rows, images=images)

    # ---------------------------------------------------------------- loop
    def evaluate(self) -> dict:
        result = self._evaluate(self.policy, self.test_set, template=self.config.template)
        self.writer.write_eval(self.step, self.config.test_split, result["accuracy"], result["n"],
                               format_rate=result["format_rate"], wall_time=self.train_seconds)
        return result

    def run(self) -> str:
        config = self.config
        if self.step == 0 and config.eval_every:
            self.evaluate()
        bar = tqdm(total=config.steps, initial=self.step, disable=not self.progress, desc=config.run_name,
                   dynamic_ncols=True)
        last_eval = None
        while self.step < config.steps:
            if config.time_limit_s and self.train_seconds >= config.time_limit_s:
                break
            row = self.train_step()
            if config.eval_every and self.step % config.eval_every == 0:
                last_eval = self.evaluate()["accuracy"]
            if config.checkpoint_every and self.step % config.checkpoint_every == 0:
                self.save_checkpoint()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward_mean']:.2f}", acc=f"{row['accuracy']:.2f}",
                            kept=f"{row['rollouts_kept'] / row['rollouts_sampled']:.2f}",
                            n=f"{row['rollouts_per_prompt']:.1f}",
                            **({"test": f"{last_eval:.3f}"} if last_eval is not None else {}))
        bar.close()
        if config.eval_every and self.step % config.eval_every:
            self.evaluate()
        self.save_checkpoint()
        self.writer.finish()
        return self.writer.run_id

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.config.store_dir) / "checkpoints" / self.writer.run_id

    def save_checkpoint(self) -> Path:
        """Model, optimiser, budget state and step; written to a temp dir and renamed (never half-written)."""
        from fastrl_core.policy import save_policy

        final = self.checkpoint_dir
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_policy(self.policy, tmp / "policy")
        torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step,
                    "train_seconds": self.train_seconds, "python_random": random.getstate()}, tmp / "trainer.pt")
        (tmp / "budget.json").write_text(json.dumps(self.budget_state))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        return final

    def _load_checkpoint(self, path: Path) -> None:
        from fastrl_core.policy import load_policy

        if not path.exists():
            raise FileNotFoundError(f"no checkpoint to resume from at {path}")
        loaded = load_policy(str(path / "policy"))
        self.policy.model.load_state_dict(loaded.model.state_dict())
        state = torch.load(path / "trainer.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.train_seconds = state["step"], state["train_seconds"]
        random.setstate(state["python_random"])
        self.budget_state = json.loads((path / "budget.json").read_text())


def _group_stats(rewards, group_ids, keep_mask, num_groups):
    """Per-prompt reward mean, std (population), rollouts sampled and kept; group_ids are 0..G-1."""
    sampled = torch.bincount(group_ids, minlength=num_groups)
    kept = torch.bincount(group_ids[keep_mask], minlength=num_groups)
    total = torch.zeros(num_groups).index_add_(0, group_ids, rewards)
    mean = total / sampled.clamp(min=1)
    sq = torch.zeros(num_groups).index_add_(0, group_ids, (rewards - mean[group_ids]) ** 2)
    std = (sq / sampled.clamp(min=1)).sqrt()
    std = torch.where(std < 1e-9, torch.zeros_like(std), std)
    return mean, std, sampled, kept


def train(config: TrainConfig, *, resume: str | None = None, progress: bool = True) -> str:
    """Train with `config` (or resume run `resume` from its last checkpoint); returns the run id."""
    return Trainer(config, resume=resume, progress=progress).run()
