"""When pruning pays: how many rollouts a step keeps so that its kept signal per second is largest.

Pruning a rollout saves its log-prob passes and its share of the update, c seconds, and the rest of the step
(generation, reward, pruning, the passes' fixed part) costs T0 seconds whatever is kept. Measured on 2 CPU cores
(fastrl_core/configs/paper.yaml, docs/bench/paper-sampled): c = 1.46 + 4.12 = 5.6 ms per kept row against T0 ~ 0.65 s; the
paper's 7B profile on GPU spends 84 % of a step in the update (docs/notes.md §6). A fixed keep ratio cannot be right on
both. Counting the |A| mass a_i = m_i|A_i| of a pruned rollout as lost (pessimistic: the coreset passes much of it
on to the rows it keeps), the signal per second of keeping the k heaviest rows is

    S_k / (T0 + c·k) ∝ S_k / (1 + ρk),   S_k = a_(1) + ... + a_(k) (masses in descending order),   ρ = c / T0,

and `cost_keep_counts` keeps the k* that maximises it. Row k + 1 pays exactly when a_(k+1) / S_k > c / T_k: its
share of the kept signal beats its share of the step's seconds. ρ -> 0 keeps every row of nonzero advantage;
a large ρ keeps the heaviest few (the pruner's per-group minimum still holds). S_k is concave in k and 1 + ρk
affine, so the ratio rises then falls and the argmax is its only peak.

ρ comes from the run's own phase times (`fit_row_cost`: a least-squares line of the passes' seconds on the kept
count over recent steps) or is given as a number, which makes the decisions reproducible.

Measured (docs/bench/paper-cost, fastrl_core/configs/paper.yaml, 5 seeds, mean@4): the fitted ρ is 0.014-0.017 on average
(0.002-0.03 over 10-step windows). At that rate the coreset prunes 5-7 % of the nonzero-advantage rows instead of
24-25 % at keep ratio 0.5. That is +1.0 pts per step and +0.8 at equal training seconds over the fixed ratio,
and level with pruning nothing beyond A = 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

MIN_FIT_STEPS = 4  # steps before a fit is trusted; until then the pruner's keep ratio alone decides


def fit_row_cost(kept: Sequence[int], pass_seconds: Sequence[float], step_seconds: Sequence[float]
                 ) -> float | None:
    """ρ = c / T0 from past steps: c the least-squares slope of `pass_seconds` (log-prob + update) on `kept`
    (rows through the passes), T0 the mean of step_seconds − c·kept. Slopes below 0 (timing noise) count as 0.
    None with fewer than MIN_FIT_STEPS steps, when the kept count never varied, or when T0 <= 0."""
    if not len(kept) == len(pass_seconds) == len(step_seconds):
        raise ValueError(f"fit_row_cost: {len(kept)} kept counts, {len(pass_seconds)} pass and {len(step_seconds)} "
                         "step times")
    if len(kept) < MIN_FIT_STEPS:
        return None
    k = torch.tensor(kept, dtype=torch.float64)
    y = torch.tensor(pass_seconds, dtype=torch.float64)
    spread = ((k - k.mean()) ** 2).sum()
    if spread == 0:
        return None
    slope = max(0.0, float(((k - k.mean()) * (y - y.mean())).sum() / spread))
    fixed = float((torch.tensor(step_seconds, dtype=torch.float64) - slope * k).mean())
    return slope / fixed if fixed > 0 else None


def cost_keep_counts(mass: Tensor, row_cost: float) -> Tensor:
    """Rows each group keeps under the exchange rate ρ = `row_cost`: the batch's k* heaviest rows.

    mass (G, M) >= 0, the rows' |A| mass m_i|A_i| (0 for rows that cannot be kept: padding, A = 0); returns (G,)
    long, how many of the k* = argmax_k S_k / (1 + ρk) heaviest rows lie in each group (ties at the lower flat
    index; the pruner then chooses WHICH rows of a group it keeps)."""
    if not row_cost >= 0:  # NaN too
        raise ValueError(f"row_cost must be >= 0, got {row_cost}")
    flat = mass.reshape(-1).double()
    order = torch.sort(flat, descending=True, stable=True).indices
    cumulative = torch.cumsum(flat[order], 0)
    rows = int((flat > 0).sum())
    if rows == 0:
        return torch.zeros(mass.shape[0], dtype=torch.long)
    ratio = cumulative[:rows] / (1 + row_cost * torch.arange(1, rows + 1, dtype=torch.float64))
    best = int(torch.argmax(ratio)) + 1  # first maximum: the fewest rows for the most signal per second
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[order[:best]] = True
    return chosen.reshape(mass.shape).sum(1)
