"""Token log-probs from last hidden states without the (n, T, V) logits.

    log p(y | h) = z[y] − logsumexp(z),   z = W h (+ b),   W the lm_head (V, H)

computed over chunks of positions, so that at most (chunk, V) logits exist at once, in the forward and in the
backward (which recomputes them: d log p / d z = onehot(y) − softmax(z)). It is the same arithmetic as
`log_softmax(lm_head(h).float()).gather(y)` (logits in the head's dtype, softmax in float32, gradients cast back to
the head's dtype before its matmuls), without the (n, T, V) float32 logits, their log-softmax and their gradient.
At Qwen2.5-VL's 151,936-row vocabulary that is 0.6 MB per position per tensor: 256 rollouts x 128 tokens made the
first GPU check's 4-layer model peak at 95 GB on an H200 (docs/gpu.md). Only the positions asked for are computed
(the completion tokens, not the padding after them). Liger-Kernel's fused linear cross-entropy and Cut
Cross-Entropy (Wijmans et al., ICLR 2025) do the same for the SFT loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_LOGITS = 1 << 25  # float32 logits per chunk: 128 MiB, 220 positions at V = 151,936


def dense_token_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor) -> Tensor:
    """The formula this module computes, with the whole (M, V) logits: the reference of its tests and benchmark.
    hidden (M, H), weight (V, H), bias (V,) or None, targets (M,) -> (M,) float32."""
    logits = F.linear(hidden, weight, bias).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def chunked_token_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                           chunk: int | None = None) -> Tensor:
    """`dense_token_logprobs` over chunks of `chunk` positions (default: CHUNK_LOGITS // V), differentiable in
    hidden, weight and bias. hidden (M, H), weight (V, H), bias (V,) or None, targets (M,) -> (M,) float32."""
    chunk = max(1, CHUNK_LOGITS // weight.shape[0]) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 position, got {chunk}")
    return _ChunkedTokenLogprobs.apply(hidden, weight, bias, targets, chunk)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk):
        out = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
        for start in range(0, len(hidden), chunk):
            rows = slice(start, start + chunk)
            logits = F.linear(hidden[rows], weight, bias).float()  # (c, V)
            out[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # the weight gradient sums over chunks in float32: in place for a float32 head, else through one
        # head-dtype (V, H) product per chunk (a bf16 sum would round once per chunk)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        for start in range(0, len(hidden), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            g = grad_out[rows, None].float()  # (c, 1)
            grad_logits = torch.softmax(F.linear(hidden[rows], weight, bias).float(), dim=-1).mul_(-g)
            grad_logits.scatter_add_(-1, targets[rows, None], g)  # g * (onehot(y) - softmax(z)): (c, V)
            grad_logits = grad_logits.to(weight.dtype)
            if need_hidden:
                torch.mm(grad_logits, weight, out=grad_hidden[rows])
            if need_weight and weight.dtype == torch.float32:
                grad_weight.addmm_(grad_logits.T, hidden[rows])
            elif need_weight:
                grad_weight += grad_logits.T @ hidden[rows]
            if need_bias:
                grad_bias += grad_logits.float().sum(dim=0)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None)
