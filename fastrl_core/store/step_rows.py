"""One builder of a training step's store rows (steps row, groups rows, rollouts rows, images), used by the trainer,
the TRL plug-in and scripts/gpu_check.py, so each fact of a step is computed in one place.

A caller fills a `StepRecord` (N rollouts in G prompt groups; arrays may be NumPy arrays, CPU tensors or lists)
and writes `step_rows(record).write_to(writer)`. The per-group statistics (`group_stats`) are the ones the budget
controllers read too. NumPy only: the store (and the app that reads it) does not import torch.

Definitions (one place each):
- group reward mean / std: over the group's rollouts whose reward is not NaN (a TRL reward function may return
  None); std is the population std, set to exactly 0 below `ZERO_STD` (a group of equal rewards). A group with no
  rollouts has mean 0 and std 0; one whose rewards are all NaN has mean NaN and std 0.
- `zero_variance_groups`: sampled groups with std 0 (a prompt a budget skipped, 0 rollouts, is not one). `rollouts_per_prompt`: N / G. `reward_mean`: mean of the non-NaN
  rewards. `accuracy`: mean of the accuracy rewards given (NaN without any). `format_rate`: mean format reward
  (only when format rewards are given).
- a rollout's recorded `weight` is its loss weight when kept and 0 when pruned.
- a merged copy's recorded `reason` is DUPLICATE, whatever the pruner decided about its representative (the pruner
  gives a copy of a pruned row that row's reason, `algo.duplicates.prune_distinct`): in every run a row is kept,
  merged (reason DUPLICATE) or pruned by the rule, the three parts the split below counts. Its representative's row
  holds the rule's reason for the whole class.
- the split of a step's rollouts (`fastrl_app.savings.rollout_split` reads it), given `nominal_per_prompt` n (the
  fixed budget's count, what plain GRPO samples per prompt): `rollouts_nominal` = G·n; `rollouts_skipped` = G·n − N,
  what the budget did not sample; `rollouts_merged`: copies of an identical completion of their group (multiplicity
  0: every method that merges duplicates skips them, whatever the pruner decided about their representative);
  `rollouts_pruned` = N − kept − merged, distinct rollouts the pruner's own rule dropped. Per group `merged`.
- a rollout's `token_text` and `token_logprob` (with token_ids, token_mask, token_logprobs and decode_token given):
  its completion tokens, each decoded alone (once per distinct id and step), and their sampling log-probs rounded
  to 3 decimals, for kept and pruned rollouts alike (the Rollouts page's token view); absent otherwise. Built from
  the (N, T) arrays at once, not token by token: 512 rollouts of ~512 tokens take ~0.06 s
  (benchmarks/bench_store_scale.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastrl_core.algo.group_stats import GroupStats, as_numpy, group_stats


def _mean(values: np.ndarray) -> float:
    """Mean of the non-NaN values; NaN when there are none (no warning)."""
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")


@dataclass
class StepRecord:
    """One training step as the store records it: N rollouts in G prompt groups (group g = the step's prompt g)."""

    step: int
    prompt_ids: Sequence[str]  # (G,) unique within the step
    questions: Sequence[str | None]  # (G,)
    answers: Sequence[str | None]  # (G,) gold answers
    image_refs: Sequence[str | None]  # (G,) image_key of each prompt's PNG, None without an image
    images: Mapping[str, bytes]  # {image_ref: PNG} for refs the run's store may not hold yet
    group_index: Any  # (N,) int: each rollout's group, in [0, G)
    completions: Sequence[str]  # (N,)
    lengths: Any  # (N,) int: completion tokens
    rewards: Any  # (N,) float: overall reward (NaN: no reward)
    advantages: Any  # (N,) float
    keep_mask: Any  # (N,) bool: the rollout entered the update
    reasons: Sequence[str]  # (N,) why it was kept or pruned (pruner `Reason` names, or a caller's own)
    scores: Any  # (N,) float: the pruner's score
    weights: Any  # (N,) float: loss weight of each kept rollout
    sketches: Any | None = None  # (N, D) gradient sketches
    format_rewards: Any | None = None  # (N,) float
    accuracy_rewards: Sequence[float | None] | None = None  # (N,); None where a rollout has none
    seconds: Mapping[str, float] = field(default_factory=dict)  # wall-clock seconds per phase -> `time_<phase>`
    cpu_seconds: Mapping[str, float] = field(default_factory=dict)  # process CPU seconds per phase -> `cpu_<phase>`
    metrics: Mapping[str, Any] = field(default_factory=dict)  # further steps columns: loss, kl, lr, epoch_end, ...
    wall_time: float | None = None  # training seconds so far (None: the writer's clock)
    multiplicity: Any | None = None  # (N,) int: identical-completion class size at a representative, 0 at a copy
    #                                  (algo.duplicates); None: nothing merged (all ones)
    nominal_per_prompt: int | None = None  # n of the fixed budget (config rollouts_per_prompt); None: no split
    token_ids: Any | None = None  # (N, T) completion token ids, right-padded; with token_mask, token_logprobs and
    token_mask: Any | None = None  # (N, T) bool                               decode_token: each rollout's
    token_logprobs: Any | None = None  # (N, T) behaviour log-probs            `token_text` and `token_logprob`
    decode_token: Any | None = None  # (int) -> str: one token's text


@dataclass(frozen=True)
class StepTables:
    """One step's rows for each store table (the arguments of `RunWriter.write_step`), and the groups' statistics."""

    step: int
    step_row: dict
    groups: list[dict]
    rollouts: list[dict]  # empty when rollouts are not logged
    images: dict[str, bytes]
    stats: GroupStats

    def write_to(self, writer) -> None:
        writer.write_step(self.step, step_row=self.step_row, groups=self.groups, rollouts=self.rollouts,
                          images=self.images)


def step_rows(record: StepRecord, *, log_rollouts: bool = True) -> StepTables:
    """The store rows of `record` (module docstring for each definition); `log_rollouts=False` leaves the
    rollouts rows (texts and sketches) out, as `RunWriter.write_step` allows."""
    num_groups = len(record.prompt_ids)
    for name in ("questions", "answers", "image_refs"):
        if len(getattr(record, name)) != num_groups:
            raise ValueError(f"StepRecord.{name} has {len(getattr(record, name))} entries for {num_groups} prompts")
    rewards = as_numpy(record.rewards, np.float64).reshape(-1)
    keep = as_numpy(record.keep_mask, bool).reshape(-1)
    stats = group_stats(rewards, record.group_index, keep, num_groups)
    n = rewards.size
    multiplicity = (np.ones(n, np.int64) if record.multiplicity is None
                    else as_numpy(record.multiplicity, np.int64).reshape(-1))
    if multiplicity.size != n:
        raise ValueError(f"StepRecord.multiplicity has {multiplicity.size} entries for {n} rollouts")
    copies = multiplicity == 0
    merged = np.bincount(as_numpy(record.group_index, np.int64).reshape(-1)[copies], minlength=num_groups)
    per_rollout = {"completions": record.completions, "lengths": record.lengths, "advantages": record.advantages,
                   "reasons": record.reasons, "scores": record.scores, "weights": record.weights,
                   "format_rewards": record.format_rewards, "accuracy_rewards": record.accuracy_rewards,
                   "sketches": record.sketches}
    for name, values in per_rollout.items():
        if values is not None and len(values) != n:
            raise ValueError(f"StepRecord.{name} has {len(values)} entries for {n} rollouts")

    accuracy = record.accuracy_rewards
    accuracy_values = np.array([np.nan if a is None else a for a in accuracy] if accuracy is not None else [],
                               dtype=np.float64)
    step_row = {
        "rollouts_sampled": int(n), "rollouts_kept": int(keep.sum()),
        "rollouts_per_prompt": n / num_groups if num_groups else 0.0,
        "reward_mean": _mean(rewards), "accuracy": _mean(accuracy_values),
        "zero_variance_groups": int(((stats.reward_std == 0) & (stats.sampled > 0)).sum()),
    }
    if record.nominal_per_prompt is not None:
        nominal = int(record.nominal_per_prompt) * num_groups
        merged_total = int(copies.sum())
        if (copies & keep).any():
            raise ValueError("StepRecord: a merged copy (multiplicity 0) is marked kept")
        pruned = int(n - keep.sum() - merged_total)
        step_row.update({"rollouts_nominal": nominal, "rollouts_skipped": nominal - int(n),
                         "rollouts_merged": merged_total, "rollouts_pruned": pruned})
    if record.format_rewards is not None:
        step_row["format_rate"] = _mean(as_numpy(record.format_rewards, np.float64).reshape(-1))
    step_row.update(record.metrics)
    step_row.update({f"time_{phase}": float(seconds) for phase, seconds in record.seconds.items()})
    step_row.update({f"cpu_{phase}": float(seconds) for phase, seconds in record.cpu_seconds.items()})
    if record.wall_time is not None:
        step_row["wall_time"] = float(record.wall_time)

    groups = [{"prompt_id": prompt_id, "reward_mean": float(mean), "reward_std": float(std), "sampled": int(s),
               "kept": int(k), "merged": int(m)}
              for prompt_id, mean, std, s, k, m in zip(record.prompt_ids, stats.reward_mean.tolist(),
                                                       stats.reward_std.tolist(), stats.sampled.tolist(),
                                                       stats.kept.tolist(), merged.tolist())]
    rollouts = _rollout_rows(record, rewards, keep, copies) if log_rollouts else []
    if rollouts and record.decode_token is not None:
        for row, (texts, logprobs) in zip(rollouts, token_lists(record)):
            row["token_text"], row["token_logprob"] = texts, logprobs
    return StepTables(int(record.step), step_row, groups, rollouts, dict(record.images), stats)


def _rollout_rows(record: StepRecord, rewards: np.ndarray, keep: np.ndarray, copies: np.ndarray) -> list[dict]:
    """One row per rollout; plain lists first (indexing an array once per value is slow)."""
    group = as_numpy(record.group_index, np.int64).reshape(-1).tolist()
    lengths = as_numpy(record.lengths, np.int64).reshape(-1).tolist()
    advantages = as_numpy(record.advantages, np.float64).reshape(-1).tolist()
    scores = as_numpy(record.scores, np.float64).reshape(-1).tolist()
    weights = np.where(keep, as_numpy(record.weights, np.float64).reshape(-1), 0.0).tolist()
    kept, reward = keep.tolist(), rewards.tolist()
    formats = (as_numpy(record.format_rewards, np.float64).reshape(-1).tolist() if record.format_rewards is not None
               else [None] * len(reward))
    accuracy = ([None if a is None else float(a) for a in record.accuracy_rewards]
                if record.accuracy_rewards is not None else [None] * len(reward))
    sketches = as_numpy(record.sketches, np.float32) if record.sketches is not None else None  # rows are views
    reasons = ["DUPLICATE" if copy else reason for reason, copy in zip(record.reasons, copies.tolist())]
    prefix = f"{int(record.step)}-"
    return [{
        "rollout_id": f"{prefix}{i}", "prompt_id": record.prompt_ids[g], "image_ref": record.image_refs[g],
        "question": record.questions[g], "answer": record.answers[g], "completion": record.completions[i],
        "reward": reward[i], "format_reward": formats[i], "accuracy_reward": accuracy[i],
        "advantage": advantages[i], "kept": kept[i], "reason": reasons[i], "score": scores[i],
        "weight": weights[i], "length": lengths[i], "sketch": sketches[i] if sketches is not None else None,
    } for i, g in enumerate(group)]


def token_lists(record: StepRecord) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each rollout's (token texts (T_i,) object array, sampling log-probs (T_i,) float32 rounded to 3 decimals) over
    its masked positions (module docstring); views into two flat arrays."""
    ids = as_numpy(record.token_ids, np.int64)
    mask = as_numpy(record.token_mask, bool)
    logprobs = as_numpy(record.token_logprobs, np.float64)
    if not ids.shape == mask.shape == logprobs.shape or ids.ndim != 2:
        raise ValueError(f"StepRecord: token_ids {ids.shape}, token_mask {mask.shape} and token_logprobs "
                         f"{logprobs.shape} must have one (N, T) shape")
    distinct, inverse = np.unique(ids[mask], return_inverse=True)  # row-major: rollout by rollout
    decoded = np.empty(distinct.size, dtype=object)
    decoded[:] = [record.decode_token(int(token)) for token in distinct]
    texts = decoded[inverse]
    values = np.round(logprobs[mask], 3).astype(np.float32)
    ends = np.cumsum(mask.sum(1))
    starts = ends - mask.sum(1)
    return [(texts[a:b], values[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]
