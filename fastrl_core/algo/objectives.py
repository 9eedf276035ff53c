"""Policy losses for GRPO-style RL, chosen by name: "grpo", "dapo", "gspo", "gspo_token", "dr_grpo".

Shapes: B rollouts, T response positions. Every loss takes per-token log-probs of the sampled tokens
under the current policy (`logprobs`, differentiable), the policy that sampled them (`old_logprobs`) and
optionally a reference model (`ref_logprobs`), all (B, T); one advantage per rollout (B,); and a
`response_mask` (B, T) of real response tokens. Old and reference log-probs are treated as constants
(detached). Padding positions are neutralised before any `exp`, so garbage there cannot give inf/NaN.

All losses are the PPO clipped surrogate (Schulman et al. 2017, eq. 7) on some importance ratio r,
    l = -min(r·A, clip(r, 1 - epsilon, 1 + epsilon_high)·A)  (+ beta·k3 KL to the reference per token),
reduced by one of the `AGGREGATIONS`. What differs is the ratio and the defaults, so they are one function
(`clipped_loss`, its ratio one of `LOG_RATIOS`) and this table (`POLICY_LOSSES`, one `PolicyLoss` entry each):

| loss        | ratio                                   | epsilon / epsilon_high | aggregation              |
|-------------|-----------------------------------------|------------------------|--------------------------|
| grpo        | token π/π_old                           | 0.2 / 0.2              | seq_mean_token_mean      |
| dapo        | token π/π_old                           | 0.2 / 0.28             | token_mean               |
| dr_grpo     | token π/π_old                           | 0.2 / 0.2              | seq_mean_token_sum_norm  |
| gspo        | sequence s_i = exp(mean_t log π/π_old)  | 3e-4 / 4e-4            | seq_mean_token_mean      |
| gspo_token  | sg[s_i]·π_t/sg[π_t] (value s_i)         | 3e-4 / 4e-4            | seq_mean_token_mean      |

Two per-rollout factors, both (B,):
- `rollout_weights` w_i multiply rollout i's values; normalisers are unchanged (pruners' loss weights).
- `rollout_counts` m_i say row i stands for m_i identical rollouts (`algo.duplicates`): its values AND its share
  of every normaliser count m_i times, so the loss, its gradient and the metrics equal those of the batch with row
  i repeated m_i times (token-mean divides by Σ_i m_i·n_i, seq-mean by Σ_i m_i, Dr.GRPO by Σ_i m_i · max_length).

`policy_loss` also takes rows of the mini-batch that are not in this call, by their response masks and
multiplicities (`absent_mask`, `absent_counts`): they add their share to the normaliser and nothing to the values,
so the loss and its gradient equal those of the batch with them present at weight 0, and need no log-probs (the
trainer's `update_rows` splits a mini-batch into parts this way).

Names follow TRL's GRPOTrainer (`epsilon`, `epsilon_high`, `beta`, `max_completion_length` -> `max_length`);
aggregation names spell out what they compute instead of TRL's loss_type names (grpo / dapo / dr_grpo).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from fastrl_core.algo.registry import Registry


@dataclass(frozen=True)
class LossOutput:
    """A policy loss and its diagnostics.

    loss: scalar, differentiable w.r.t. `logprobs`.
    metrics: floats, unweighted by `rollout_weights`, counted `rollout_counts` times per rollout:
      clip_fraction       share of ratio entries whose gradient the clip removes (r > 1+eps_high with A > 0, or
                          r < 1-eps with A < 0; TRL's clip_ratio/region_mean); over response tokens, or over
                          non-empty rollouts for the sequence-level `gspo`;
      clip_fraction_low / clip_fraction_high   the two sides of it;
      ratio_mean          mean importance ratio over the same entries;
      kl                  mean k3 KL to the reference over response tokens (0.0 without `ref_logprobs`).
    """

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


# --- Aggregation: per-token losses (B, T) -> scalar ---------------------------------------------------

Aggregation = Callable[[Tensor, Tensor, int, Tensor | None], Tensor]
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


@AGGREGATIONS.register("seq_mean_token_mean")
def _seq_mean_token_mean(masked: Tensor, mask: Tensor, max_length: int, counts: Tensor | None) -> Tensor:
    """Mean over each rollout's response tokens, then over the B rollouts (GRPO, DeepSeekMath eq. 3); with counts
    m the mean over rollouts is Σ_i m_i x_i / Σ_i m_i.

    A rollout with no response tokens contributes 0 and still counts in B (as in TRL)."""
    per_rollout = masked.sum(-1) / mask.sum(-1).clamp(min=1)
    if counts is None:
        return per_rollout.mean()
    return (counts * per_rollout).sum() / counts.sum()


@AGGREGATIONS.register("token_mean")
def _token_mean(masked: Tensor, mask: Tensor, max_length: int, counts: Tensor | None) -> Tensor:
    """Mean over all response tokens of the batch (DAPO, Yu et al. 2025, eq. 8; TRL "bnpo"/"dapo"); with counts m
    rollout i's n_i tokens count m_i times: Σ_i m_i Σ_t x_it / Σ_i m_i n_i."""
    if counts is None:
        return masked.sum() / mask.sum().clamp(min=1)
    return (counts * masked.sum(-1)).sum() / (counts * mask.sum(-1)).sum().clamp(min=1)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def _seq_mean_token_sum_norm(masked: Tensor, mask: Tensor, max_length: int, counts: Tensor | None) -> Tensor:
    """Sum over all response tokens / (B · max_length), a constant normaliser (Dr.GRPO, Liu et al. 2025, §3.1);
    with counts m: Σ_i m_i Σ_t x_it / (Σ_i m_i · max_length)."""
    if counts is None:
        return masked.sum() / (masked.shape[0] * max_length)
    return (counts * masked.sum(-1)).sum() / (counts.sum() * max_length)


# What one response (B, T) -> (B,) adds to each aggregation's normaliser; the reduce functions above divide by
# Σ_i m_i · units_i. `normaliser` reads it for rows that are not in the batch (pruned rows of a mini-batch).
NORMALISER_UNITS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "seq_mean_token_mean": lambda mask, max_length: torch.ones(mask.shape[0], dtype=torch.float64, device=mask.device),
    "token_mean": lambda mask, max_length: mask.sum(-1).double(),
    "seq_mean_token_sum_norm": lambda mask, max_length: torch.full((mask.shape[0],), float(max_length),
                                                                   dtype=torch.float64, device=mask.device),
}


def normaliser(mode: str, response_mask: Tensor, *, max_length: int, rollout_counts: Tensor | None = None) -> float:
    """Σ_i m_i · units_i: the share rows with these response masks (B, T) and multiplicities (B,) take in the
    normaliser of aggregation `mode` (rows for seq-mean, response tokens for token-mean, rows x max_length for
    Dr.GRPO); 0.0 for no rows."""
    AGGREGATIONS.get(mode)  # an unknown name raises, naming the choices
    units = NORMALISER_UNITS[mode](response_mask.bool(), max_length)
    counts = torch.ones_like(units) if rollout_counts is None else rollout_counts.double()
    return float((counts * units).sum())


def aggregate(
    per_token: Tensor,
    response_mask: Tensor,
    mode: str,
    *,
    max_length: int | None = None,
    rollout_weights: Tensor | None = None,
    rollout_counts: Tensor | None = None,
) -> Tensor:
    """Reduce per-token values (B, T) over response tokens (B, T) to a scalar by `mode` (see `AGGREGATIONS`).

    rollout_weights (B,) multiplies each rollout's values; normalisers are unchanged, so all-ones == None.
    rollout_counts (B,) counts each rollout m_i times in values and normalisers: the result equals that of the
    batch with row i repeated m_i times (all-ones == None up to rounding).
    max_length is used only by "seq_mean_token_sum_norm": None means T, the batch's padded response length.
    """
    reduce = AGGREGATIONS.get(mode)
    mask = response_mask.bool()
    if max_length is None:
        max_length = max(per_token.shape[-1], 1)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))  # (B, T)
    if rollout_weights is not None:
        masked = masked * rollout_weights.to(masked.dtype).unsqueeze(-1)
    counts = None if rollout_counts is None else rollout_counts.to(masked.dtype)
    return reduce(masked, mask, max_length, counts)


# --- Shared pieces -----------------------------------------------------------------------------------


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(π || π_ref): exp(ref - lp) - (ref - lp) - 1 >= 0  (B, T).

    Schulman, "Approximating KL Divergence" (2020); DeepSeekMath eq. 4; TRL's per_token_kl."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, epsilon: float, epsilon_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped surrogate loss -min(r·A, clip(r, 1-eps, 1+eps_high)·A) (Schulman et al. 2017 eq. 7;
    asymmetric bounds: DAPO "clip-higher", eq. 10).  ratio (B, T) or (B, 1); advantages (B, 1).

    Returns (loss like ratio, low_clipped, high_clipped): the masks of entries whose gradient the clip removes."""
    clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    low_clipped = (ratio < 1 - epsilon) & (advantages < 0)
    high_clipped = (ratio > 1 + epsilon_high) & (advantages > 0)
    return loss, low_clipped, high_clipped


def _masked_mean(values: Tensor, mask: Tensor, counts: Tensor | None = None) -> float:
    """Mean of `values` where `mask` (same shape, (B, T') ) holds, row i counted counts[i] times; 0.0 if the mask
    holds nowhere."""
    if counts is None:
        return float(torch.where(mask, values, torch.zeros_like(values)).sum() / mask.sum().clamp(min=1))
    weight = torch.where(mask, counts.to(values.dtype)[:, None].expand_as(values), torch.zeros_like(values))
    return float((weight * torch.where(mask, values, torch.zeros_like(values))).sum() / weight.sum().clamp(min=1e-30))


def clipped_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ratio_kind: str,
    ref_logprobs: Tensor | None = None,
    rollout_weights: Tensor | None = None,
    rollout_counts: Tensor | None = None,
    epsilon: float,
    epsilon_high: float | None,
    beta: float = 0.0,
    aggregation: str,
    max_length: int | None = None,
) -> LossOutput:
    """Every policy loss: the clipped surrogate on the importance ratio `ratio_kind` (a `LOG_RATIOS` name: (B, T)
    token-level or (B, 1) sequence-level) + beta·k3 to the reference, reduced by `aggregation`. epsilon_high None
    means epsilon. Tensors as `policy_loss` passes them (old and reference log-probs detached, mask bool)."""
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    if not 0 <= epsilon < 1 or epsilon_high < 0:
        raise ValueError(f"need 0 <= epsilon < 1 and epsilon_high >= 0, got {epsilon}, {epsilon_high}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} > 0 adds a KL term to the reference model: pass ref_logprobs (B, T)")
    ratio = torch.exp(LOG_RATIOS[ratio_kind](logprobs, old_logprobs, mask))
    per_token, low_clipped, high_clipped = clipped_surrogate(ratio, advantages.unsqueeze(-1), epsilon, epsilon_high)
    per_token = per_token.expand_as(logprobs)  # (B, T)
    kl = None
    if ref_logprobs is not None:
        zeros = torch.zeros_like(logprobs)
        kl = kl_k3(torch.where(mask, logprobs, zeros), torch.where(mask, ref_logprobs, zeros))  # (B, T)
        if beta > 0:
            per_token = per_token + beta * kl
    loss = aggregate(per_token, mask, aggregation, max_length=max_length, rollout_weights=rollout_weights,
                     rollout_counts=rollout_counts)
    with torch.no_grad():
        ratio_mask = mask if ratio.shape == mask.shape else mask.any(-1, keepdim=True)  # tokens or rollouts
        ratio_mask = ratio_mask.expand_as(ratio)
        counts = rollout_counts
        metrics = {
            "clip_fraction": _masked_mean((low_clipped | high_clipped).to(ratio.dtype), ratio_mask, counts),
            "clip_fraction_low": _masked_mean(low_clipped.to(ratio.dtype), ratio_mask, counts),
            "clip_fraction_high": _masked_mean(high_clipped.to(ratio.dtype), ratio_mask, counts),
            "ratio_mean": _masked_mean(ratio, ratio_mask, counts),
            "kl": 0.0 if kl is None else _masked_mean(kl, mask, counts),
        }
    return LossOutput(loss=loss, metrics=metrics)


def _token_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log π/π_old per response token, 0 on padding  (B, T)."""
    return torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))


def _sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log s_i = mean over response tokens of log π/π_old (GSPO eq. 7); 0 for an empty rollout  (B, 1)."""
    token = _token_log_ratio(logprobs, old_logprobs, mask)
    return token.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def _sequence_token_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token: log of sg[s_i]·π_t/sg[π_t], whose value is log s_i and whose gradient flows through each token;
    0 on padding  (B, T)."""
    log_ratio = _sequence_log_ratio(logprobs, old_logprobs, mask).detach() + logprobs - logprobs.detach()
    return torch.where(mask, log_ratio, torch.zeros_like(log_ratio))


# The importance ratio a loss clips, by name: (logprobs, old_logprobs, mask) -> log r, (B, T) or (B, 1).
LOG_RATIOS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": _token_log_ratio, "sequence": _sequence_log_ratio, "sequence_token": _sequence_token_log_ratio}


# --- The losses ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss: `clipped_loss` with its ratio and defaults (the module docstring's table)."""

    ratio_kind: str  # a LOG_RATIOS name
    epsilon: float
    epsilon_high: float | None  # None: epsilon
    aggregation: str  # an AGGREGATIONS name
    source: str  # where it is defined


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
for _name, _loss in {
    "grpo": PolicyLoss("token", 0.2, None, "seq_mean_token_mean", "GRPO (Shao et al. 2024, DeepSeekMath eq. 3): "
                       "KL-as-loss beta·k3, mean over each sequence's tokens then over the batch"),
    "dapo": PolicyLoss("token", 0.2, 0.28, "token_mean", "DAPO (Yu et al. 2025, eq. 8; clip-higher eq. 10): token-mean "
                       "over the batch, no KL; its overlong shaping is `overlong_reward_penalty`, dynamic sampling a "
                       "pruner"),
    "dr_grpo": PolicyLoss("token", 0.2, None, "seq_mean_token_sum_norm", "Dr.GRPO (Liu et al. 2025, §3.1, eq. 3 "
                          "with a constant normaliser): token sums / (B · max_length); max_length should be the "
                          "generation limit (None: T of this batch); pair with `mean_only` advantages"),
    "gspo": PolicyLoss("sequence", 3e-4, 4e-4, "seq_mean_token_mean", "GSPO (Zheng et al. 2025, eq. 5-7): "
                       "sequence ratio clipped per sequence to the §5.1 ranges, one term per rollout, no KL"),
    "gspo_token": PolicyLoss("sequence_token", 3e-4, 4e-4, "seq_mean_token_mean", "GSPO-token (Zheng et al. 2025, "
                             "eq. 13-14): with one advantage per rollout its value, clipping and gradient equal "
                             "gspo's (§4.3); it exists for per-token advantages"),
}.items():
    POLICY_LOSSES.register(_name)(_loss)


NOT_HYPERPARAMETERS = {"ratio_kind", "ref_logprobs", "rollout_weights", "rollout_counts"}  # clipped_loss's other keywords


def hyperparameters(name: str) -> dict[str, object]:
    """The hyperparameters of loss `name` with their defaults: its table entry's, else `clipped_loss`'s."""
    loss = POLICY_LOSSES.get(name)
    return {p.name: getattr(loss, p.name, p.default) for p in inspect.signature(clipped_loss).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in NOT_HYPERPARAMETERS}


def _check_shapes(logprobs, old_logprobs, advantages, response_mask, ref_logprobs, rollout_weights,
                  rollout_counts=None) -> Tensor:
    """Raise a ValueError naming the argument whose shape is wrong; return the mask as bool."""
    if logprobs.dim() != 2 or logprobs.shape[0] == 0:
        raise ValueError(f"logprobs must be (B, T) with B >= 1, got shape {tuple(logprobs.shape)}")
    B = logprobs.shape[0]
    expected = {"old_logprobs": (old_logprobs, logprobs.shape), "response_mask": (response_mask, logprobs.shape),
                "ref_logprobs": (ref_logprobs, logprobs.shape), "advantages": (advantages, (B,)),
                "rollout_weights": (rollout_weights, (B,)), "rollout_counts": (rollout_counts, (B,))}
    for arg, (tensor, shape) in expected.items():
        if tensor is not None and tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{arg} must have shape {tuple(shape)} like logprobs, got {tuple(tensor.shape)}")
    if rollout_counts is not None and not bool((torch.isfinite(rollout_counts) & (rollout_counts > 0)).all()):
        bad = (~(torch.isfinite(rollout_counts) & (rollout_counts > 0))).nonzero().flatten()[:10].tolist()
        raise ValueError(f"rollout_counts must be finite and > 0; rows {bad} are not")
    if response_mask.dtype != torch.bool:
        if not bool(((response_mask == 0) | (response_mask == 1)).all()):
            raise ValueError("response_mask must be bool or hold only 0 and 1")
        response_mask = response_mask.bool()
    return response_mask


def policy_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    rollout_weights: Tensor | None = None,
    rollout_counts: Tensor | None = None,
    absent_mask: Tensor | None = None,
    absent_counts: Tensor | None = None,
    **hyperparams,
) -> LossOutput:
    """Loss `name` (see `POLICY_LOSSES`) on log-probs (B, T), advantages (B,), response_mask (B, T).

    rollout_weights (B,): per-rollout weights (e.g. importance weights after pruning) multiplying each rollout's
    contribution with the normaliser unchanged; None == all ones. rollout_counts (B,) > 0: multiplicities (row i
    stands for m_i identical rollouts, `algo.duplicates`), counted in values, normalisers and metrics, so the loss
    and its gradient equal the unmerged batch's; None == all ones. absent_mask (A, T) and absent_counts (A,) > 0
    (None == ones): rows of this mini-batch that were pruned; they count in the normaliser as rows of weight 0
    would (the loss is scaled by present / (present + absent) normaliser), and the metrics stay over the present
    rows. hyperparams: that loss's keyword arguments (`hyperparameters(name)` lists them with defaults); an
    unknown one raises TypeError naming the valid ones.
    """
    valid = hyperparameters(name)
    unknown = sorted(set(hyperparams) - set(valid))
    if unknown:
        raise TypeError(f"policy loss {name!r} got unknown hyperparameter(s) {unknown}; valid: {sorted(valid)}")
    mask = _check_shapes(logprobs, old_logprobs, advantages, response_mask, ref_logprobs, rollout_weights,
                         rollout_counts)
    out = clipped_loss(
        logprobs, old_logprobs.detach(), advantages.detach().to(logprobs.dtype), mask,
        ratio_kind=POLICY_LOSSES.get(name).ratio_kind,
        ref_logprobs=None if ref_logprobs is None else ref_logprobs.detach(),
        rollout_weights=None if rollout_weights is None else rollout_weights.detach(),
        rollout_counts=None if rollout_counts is None else rollout_counts.detach(),
        **{**valid, **hyperparams},
    )
    if absent_mask is None or absent_mask.shape[0] == 0:
        if absent_counts is not None and absent_counts.numel():
            raise ValueError("absent_counts given without absent_mask")
        return out
    absent = _check_absent(absent_mask, absent_counts, logprobs.shape[1])
    aggregation = hyperparams.get("aggregation", valid["aggregation"])
    max_length = hyperparams.get("max_length", valid["max_length"]) or max(logprobs.shape[-1], 1)
    present = normaliser(aggregation, mask, max_length=max_length, rollout_counts=rollout_counts)
    missing = normaliser(aggregation, absent, max_length=max_length, rollout_counts=absent_counts)
    share = present / (present + missing) if present + missing > 0 else 1.0
    return LossOutput(loss=out.loss * share, metrics=out.metrics)


def _check_absent(absent_mask: Tensor, absent_counts: Tensor | None, length: int) -> Tensor:
    """Raise a ValueError naming the argument whose shape or values are wrong; return the absent mask as bool."""
    if absent_mask.dim() != 2 or absent_mask.shape[1] != length:
        raise ValueError(f"absent_mask must be (A, {length}) like the response mask, got {tuple(absent_mask.shape)}")
    if absent_counts is not None:
        if tuple(absent_counts.shape) != (absent_mask.shape[0],):
            raise ValueError(f"absent_counts must have shape ({absent_mask.shape[0]},), got "
                             f"{tuple(absent_counts.shape)}")
        if not bool((torch.isfinite(absent_counts) & (absent_counts > 0)).all()):
            raise ValueError("absent_counts must be finite and > 0")
    if absent_mask.dtype != torch.bool and not bool(((absent_mask == 0) | (absent_mask == 1)).all()):
        raise ValueError("absent_mask must be bool or hold only 0 and 1")
    return absent_mask.bool()


# --- Reward shaping ------------------------------------------------------------------------------------


def overlong_reward_penalty(
    lengths: Tensor, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward  (N,) float.

    0 for len <= max_length - buffer_length; (max_length - buffer_length - len) / buffer_length · penalty_factor
    inside the buffer (linear from 0 to -penalty_factor at len = max_length); -penalty_factor beyond max_length."""
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"need 0 < buffer_length <= max_length, got {buffer_length} and {max_length}")
    lengths = lengths.to(torch.get_default_dtype()) if not lengths.is_floating_point() else lengths
    inside = (max_length - buffer_length - lengths) / buffer_length
    penalty = inside.clamp(min=-1.0, max=0.0)  # 0 before the buffer; -1 at and beyond max_length
    return penalty * penalty_factor
