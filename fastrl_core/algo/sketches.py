"""Gradient sketches: one fixed-size vector per rollout whose inner products stand in for gradient inner products.

The pruners compare rollouts of a prompt group through these vectors (a kernel for diversity). All three are
deterministic by seed and need no backward pass.

- `lm_head`  (docs/notes.md §1) For logits z_t = W h_t the gradient of log π(y_t) w.r.t. the unembedding W (V, d) is
             (e_{y_t} − p_t) h_tᵀ, so a rollout's last-layer policy gradient is G_i = (A_i / n_i) Σ_t (e_{y_t} − p_t) h_tᵀ
             (n_i the loss normaliser). Sketch both factors with fixed random projections R_o (V, k_o), R_h (d, k_h)
             (E[R Rᵀ] = I, `make_projection`):
                 φ_i = vec(Σ_t (R_oᵀ u_t)(R_hᵀ h_t)ᵀ),   u_t = (e_{y_t} − p_t) restricted to top-K(p_t) ∪ {y_t}
             (top_k=None: unrestricted, the exact projection; see `lm_head_sketch` for which is cheaper),
             i.e. φ_i = (R_o ⊗ R_h)ᵀ vec(G_i) without the advantage: a Kronecker-structured random projection (as in
             LoGra, Choe et al. 2024, "What is your data worth to GPT?") with E⟨φ_i, φ_j⟩ = ⟨G_i, G_j⟩.
             Needs only the logits and last hidden states of a forward pass or of HF generate.
- `logprob`  For engines that return only top-K log-probs (vLLM): the vocabulary factor alone. See `logprob_sketch`.
- `tokens`   Hashed token-set bits (the authors' token-overlap notion), model-free. See `token_sketch`.

Sketches are NOT scaled by the advantage: advantages exist only after rewards, and generation-time accumulation
must not wait for them. `scale_sketches` applies A_i / n_i.

`vec` is row-major over (k_o, k_h): entry o * k_h + h. The default `sketch_dim` 256 splits into k_o = k_h = 16
(`make_projection`: k_h = the largest divisor of sketch_dim not above its square root, k_o = sketch_dim / k_h).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fastrl_core.algo.registry import Registry

Sketch = Callable[..., Tensor]
SKETCHES: Registry[Sketch] = Registry("sketch")

_HASH_PRIME = 2**31 - 1  # Mersenne prime for the universal hash of token ids (ids < 2^31, products fit int64)
_CHUNK_ELEMENTS = 2**24  # logits per chunk in `lm_head_sketch` (64 MB of float32): bounds float copies and softmaxes
_CHUNK_ROWS = 2**19  # gathered rows per chunk in `logprob_sketch`


@dataclass(frozen=True)
class SketchProjection:
    """Fixed random projections of the two factors of the last-layer gradient."""

    output: Tensor  # (V, k_o) vocabulary side
    hidden: Tensor  # (d, k_h) hidden side

    @property
    def dim(self) -> int:
        return self.output.shape[1] * self.hidden.shape[1]

    def to(self, *args, **kwargs) -> SketchProjection:
        """A copy with both matrices moved/cast like `Tensor.to`."""
        return SketchProjection(self.output.to(*args, **kwargs), self.hidden.to(*args, **kwargs))


def split_sketch_dim(sketch_dim: int) -> tuple[int, int]:
    """(k_o, k_h) with k_o * k_h = sketch_dim: k_h = largest divisor ≤ √sketch_dim. 256 -> (16, 16), 512 -> (32, 16)."""
    if sketch_dim < 1:
        raise ValueError(f"sketch_dim must be a positive integer, got {sketch_dim}")
    k_h = max(k for k in range(1, math.isqrt(sketch_dim) + 1) if sketch_dim % k == 0)
    return sketch_dim // k_h, k_h


def _orthogonal_projection(rows: int, cols: int, generator: torch.Generator) -> Tensor:
    """(rows, cols) with E[R Rᵀ] = I: √(rows/cols)·(orthonormal columns of a Gaussian draw) when cols < rows
    (lower variance than i.i.d. N(0, 1/cols), same mean), orthonormal rows (R Rᵀ = I exactly) otherwise."""
    gaussian = torch.randn(max(rows, cols), min(rows, cols), generator=generator, dtype=torch.float64)
    basis = torch.linalg.qr(gaussian).Q  # (max, min), orthonormal columns spanning a uniformly random subspace
    if cols < rows:
        return (basis * math.sqrt(rows / cols)).float()
    return basis.T.contiguous().float()


def make_projection(vocab_size: int, hidden_size: int, *, sketch_dim: int = 256, seed: int = 0) -> SketchProjection:
    """R_o (V, k_o) and R_h (d, k_h), (k_o, k_h) = `split_sketch_dim(sketch_dim)`, each with E[R Rᵀ] = I so that
    E⟨φ_i, φ_j⟩ = ⟨G_i, G_j⟩. Drawn on CPU from their own `torch.Generator(seed)` (output first), float32.

    Scaled orthonormal columns rather than i.i.d. Gaussians: on the fidelity test's rollouts (V 512, d 64, D 256,
    20 seeds) the Pearson correlation with the exact gradient Gram went from 0.956 to 0.966 (all entries) and from
    0.76 to 0.78 (off-diagonal). The 16 x 16 split beat 32 x 8, 64 x 4 and 8 x 32 on all entries there (32 x 8 was
    0.03 better off-diagonal but had a worse minimum).
    """
    if vocab_size < 1 or hidden_size < 1:
        raise ValueError(f"vocab_size and hidden_size must be positive, got {vocab_size} and {hidden_size}")
    k_o, k_h = split_sketch_dim(sketch_dim)
    generator = torch.Generator().manual_seed(seed)
    output = _orthogonal_projection(vocab_size, k_o, generator)
    hidden = _orthogonal_projection(hidden_size, k_h, generator)
    return SketchProjection(output, hidden)


def scale_sketches(sketches: Tensor, advantages: Tensor, normalizer: Tensor | None = None) -> Tensor:
    """A_i / n_i · φ_i: the sketch of the rollout's actual policy gradient.  sketches (B, D), advantages (B,),
    normalizer (B,) e.g. the token count for sequence-mean losses, or a constant for token-mean / Dr.GRPO."""
    if sketches.ndim != 2 or advantages.shape != sketches.shape[:1]:
        raise ValueError(f"scale_sketches: sketches must be (B, D) and advantages (B,), got "
                         f"{tuple(sketches.shape)} and {tuple(advantages.shape)}")
    weights = advantages.to(sketches.dtype)
    if normalizer is not None:
        if normalizer.shape != advantages.shape:
            raise ValueError(f"scale_sketches: normalizer must be (B,) = {tuple(advantages.shape)}, "
                             f"got {tuple(normalizer.shape)}")
        weights = weights / normalizer.to(sketches.dtype)
    return sketches * weights[:, None]


def _vocab_factor(logits: Tensor, tokens: Tensor, output: Tensor, top_k: int | None) -> Tensor:
    """R_oᵀ u for u = (e_y − p) restricted to top-K(p) ∪ {y}.  logits (N, V), tokens (N,), output (V, k_o) -> (N, k_o).

    u has −p_j on the top-K ids and 1 − p_y on y, whether or not y is among them:
    R_oᵀ u = (1 − [y ∉ top-K] p_y) R_o[y] − Σ_{j ∈ top-K} p_j R_o[j]  (one logsumexp, one top-k, an embedding-bag
    sum of K rows; no V-sized one-hot). Unrestricted (top_k None or ≥ V): R_oᵀ u = R_o[y] − softmax(z) @ R_o, which
    on CPU was 8-30x cheaper than a top-64 at V ~ 1,000 (torch's CPU top-k costs ~5-10 µs a row,
    benchmarks/bench_sketch.py); at V ~ 150k the top-k path was the cheaper one and it never materialises an (N, V)
    softmax.
    """
    logits = logits.float()
    if top_k is None or top_k >= logits.shape[-1]:
        return output[tokens] - logits.softmax(dim=-1) @ output
    log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)  # (N, 1)
    top_logits, top_ids = logits.topk(top_k, dim=-1, sorted=False)  # (N, K)
    top_probs = (top_logits - log_norm).exp()  # (N, K)
    token_prob = (logits.gather(-1, tokens[:, None]) - log_norm).exp().squeeze(-1)  # (N,)
    token_outside = (top_ids != tokens[:, None]).all(dim=-1)  # (N,)
    token_weight = 1.0 - torch.where(token_outside, token_prob, torch.zeros_like(token_prob))  # (N,)
    top_sum = F.embedding_bag(top_ids, output, per_sample_weights=top_probs, mode="sum")  # (N, k_o) Σ_K p_j R_o[j]
    return token_weight[:, None] * output[tokens] - top_sum


def _check_projection(projection: SketchProjection, vocab_size: int, hidden_size: int, where: str) -> None:
    if projection.output.shape[0] != vocab_size or projection.hidden.shape[0] != hidden_size:
        raise ValueError(f"{where}: projection is for vocab {projection.output.shape[0]} x hidden "
                         f"{projection.hidden.shape[0]}, inputs have vocab {vocab_size} x hidden {hidden_size}")


def lm_head_sketch(hidden: Tensor, logits: Tensor, tokens: Tensor, response_mask: Tensor,
                   projection: SketchProjection, *, top_k: int | None = 64) -> Tensor:
    """φ_i = vec(Σ_t m_it (R_oᵀ u_it)(R_hᵀ h_it)ᵀ), u = (e_y − p) on top-K(p) ∪ {y}  (module docstring,
    docs/notes.md §1).

    hidden (B, T, d) the last hidden states (after the final norm: HF `hidden_states[-1]`) that produced
    logits (B, T, V) for the sampled tokens (B, T); response_mask (B, T) bool or 0/1. Pass the logits of the
    distribution the loss differentiates (divide by the sampling temperature if the loss does).
    Returns (B, D), D = projection.dim, float32, not scaled by the advantage (`scale_sketches`). top_k None (or ≥ V)
    gives the unrestricted sketch, i.e. the exact projection of the last-layer gradient; it is also the cheaper one
    for small vocabularies on CPU (`_vocab_factor`). Masked positions contribute exactly nothing (their logits,
    hidden states and token ids may be garbage: NaN, inf, -100).
    """
    if hidden.ndim != 3 or logits.ndim != 3 or hidden.shape[:2] != logits.shape[:2] \
            or tokens.shape != logits.shape[:2] or response_mask.shape != logits.shape[:2]:
        raise ValueError(f"lm_head_sketch: need hidden (B, T, d), logits (B, T, V), tokens and response_mask (B, T); "
                         f"got {tuple(hidden.shape)}, {tuple(logits.shape)}, {tuple(tokens.shape)}, "
                         f"{tuple(response_mask.shape)}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"lm_head_sketch: top_k must be ≥ 1 or None, got {top_k}")
    _check_projection(projection, logits.shape[-1], hidden.shape[-1], "lm_head_sketch")
    batch, length, vocab = logits.shape
    mask = response_mask.bool()
    tokens = torch.where(mask, tokens, torch.zeros_like(tokens))  # any valid id at masked positions
    k_o, k_h = projection.output.shape[1], projection.hidden.shape[1]
    sums = torch.zeros(batch, k_o, k_h, dtype=torch.float32, device=logits.device)
    step = max(1, _CHUNK_ELEMENTS // max(batch * vocab, 1))  # time steps per chunk
    for start in range(0, length, step):
        chunk = slice(start, start + step)
        width = min(step, length - start)
        vocab_side = _vocab_factor(logits[:, chunk].reshape(-1, vocab), tokens[:, chunk].reshape(-1),
                                   projection.output, top_k).view(batch, width, k_o)
        vocab_side = torch.where(mask[:, chunk, None], vocab_side, torch.zeros_like(vocab_side))  # NaN-safe mask
        hidden_side = hidden[:, chunk].float() @ projection.hidden  # (B, t, k_h)
        hidden_side = torch.where(mask[:, chunk, None], hidden_side, torch.zeros_like(hidden_side))
        sums += vocab_side.transpose(1, 2) @ hidden_side  # (B, k_o, k_h)
    return sums.reshape(batch, k_o * k_h)


def lm_head_sketch_from_hidden(hidden: Tensor, weight: Tensor, bias: Tensor | None, tokens: Tensor,
                               response_mask: Tensor, projection: SketchProjection, *, top_k: int | None = 64,
                               temperature: float = 1.0) -> Tensor:
    """`lm_head_sketch` from the last hidden states and the lm_head's weight (V, d) and bias (V,) or None, the logits
    z = (W h + b) / temperature made a chunk of positions at a time (`_CHUNK_ELEMENTS` logits, never (B, T, V)).
    hidden (B, T, d) at the positions that predict tokens (B, T); response_mask (B, T). -> (B, D) float32. The
    sketch of a scoring forward that hands over only hidden states (TRL's fused log-prob head: integrations.trl)."""
    if hidden.ndim != 3 or tokens.shape != hidden.shape[:2] or response_mask.shape != tokens.shape:
        raise ValueError(f"lm_head_sketch_from_hidden: need hidden (B, T, d), tokens and response_mask (B, T); got "
                         f"{tuple(hidden.shape)}, {tuple(tokens.shape)}, {tuple(response_mask.shape)}")
    batch, length, _ = hidden.shape
    sketch = torch.zeros(batch, projection.dim, dtype=torch.float32, device=hidden.device)
    step = max(1, _CHUNK_ELEMENTS // max(batch * weight.shape[0], 1))  # positions per chunk
    for start in range(0, length, step):
        chunk = slice(start, start + step)
        logits = F.linear(hidden[:, chunk], weight, bias).float() / temperature  # (B, t, V)
        sketch += lm_head_sketch(hidden[:, chunk], logits, tokens[:, chunk], response_mask[:, chunk], projection,
                                 top_k=top_k)
    return sketch


class LmHeadSketcher:
    """Streaming `lm_head_sketch` during generation: one `update` per decoding step; it keeps only the (B, k_o, k_h)
    sums, memory O(B·D), plus one step's (B, V) transients inside `update`, instead of O(B·T·V).
    Feed it each step's lm_head input h (B, d) (the last hidden state, after the final norm) and raw logits z (B, V)
    (before temperature / logits processors), the sampled tokens and which rows are still generating.
    `HFEngine.generate` does so from a forward hook on the lm_head (engines/hf.py `_StepRecorder`), so generate
    never keeps the step logits; `outputs.hidden_states[s][-1][:, -1]` and `outputs.logits[s]` of
    generate(output_hidden_states, output_logits) are the same tensors, but keeping them costs O(B·T·V)."""

    def __init__(self, batch_size: int, projection: SketchProjection, *, top_k: int | None = 64, device=None,
                 dtype=torch.float32) -> None:
        if top_k is not None and top_k < 1:
            raise ValueError(f"LmHeadSketcher: top_k must be ≥ 1 or None, got {top_k}")
        device = projection.output.device if device is None else device
        self.projection = projection.to(device=device, dtype=dtype)
        self.top_k = top_k
        self._sums = torch.zeros(batch_size, projection.output.shape[1], projection.hidden.shape[1],
                                 dtype=dtype, device=device)  # (B, k_o, k_h)

    def update(self, hidden: Tensor, logits: Tensor, tokens: Tensor, active: Tensor) -> None:
        """hidden (B, d), logits (B, V), tokens (B,), active (B,) bool: rows whose token counts in the loss."""
        batch = self._sums.shape[0]
        if hidden.shape[:1] != (batch,) or logits.shape[:1] != (batch,) or tokens.shape != (batch,) \
                or active.shape != (batch,) or hidden.ndim != 2 or logits.ndim != 2:
            raise ValueError(f"LmHeadSketcher.update: need hidden (B, d), logits (B, V), tokens and active (B,) with "
                             f"B = {batch}; got {tuple(hidden.shape)}, {tuple(logits.shape)}, {tuple(tokens.shape)}, "
                             f"{tuple(active.shape)}")
        _check_projection(self.projection, logits.shape[-1], hidden.shape[-1], "LmHeadSketcher.update")
        active = active.bool()
        tokens = torch.where(active, tokens, torch.zeros_like(tokens))
        vocab_side = _vocab_factor(logits, tokens, self.projection.output, self.top_k).to(self._sums.dtype)
        vocab_side = torch.where(active[:, None], vocab_side, torch.zeros_like(vocab_side))  # (B, k_o)
        hidden_side = hidden.to(self._sums.dtype) @ self.projection.hidden  # (B, k_h)
        hidden_side = torch.where(active[:, None], hidden_side, torch.zeros_like(hidden_side))
        self._sums += vocab_side[:, :, None] * hidden_side[:, None, :]

    def result(self) -> Tensor:
        """(B, D) sketches accumulated so far (a copy)."""
        return self._sums.reshape(self._sums.shape[0], -1).clone()


def logprob_sketch(topk_ids: Tensor, topk_logprobs: Tensor, tokens: Tensor, response_mask: Tensor,
                   projection: SketchProjection) -> Tensor:
    """Vocabulary-side sketch from top-K log-probs only (vLLM returns no hidden states).  (B, D), D = projection.dim.

    topk_ids, topk_logprobs (B, T, K); tokens, response_mask (B, T). With u_t = e_{y_t} − Σ_{j ∈ top-K} p_tj e_j,
    what it sketches is b_i = Σ_t m_t u_t, the exact gradient of Σ_t log π(y_t) w.r.t. an output *bias* (logits
    W h_t + b), restricted to the top-K. It equals the lm_head gradient with every h_t replaced by one shared vector:
    what it loses is the hidden factor, i.e. which context each token's probability shift happened in.
    If y_t is not among the K returned ids its probability is unknown and counts as 0 (error < p_K).

    To give the same D as `lm_head` without another stored matrix, b is projected by rows R_o[j] ⊗ R_h[j mod d]:
    φ = Σ_j b_j vec(R_o[j] R_h[j mod d]ᵀ). E[R_o R_oᵀ] = I, E[R_h R_hᵀ] = I and R_o, R_h are independent, so
    E⟨row_j, row_j'⟩ = δ_jj' and E⟨φ_i, φ_j⟩ = ⟨b_i, b_j⟩ (a JL map V -> D; ids sharing j mod d add a little
    variance). With identity projections (k_o = V, k_h = d) the map is an isometry.

    Two ways to the same sums: when V ≤ T·(K + 1) (the vocabulary no larger than a row's entries, as at the
    embedded model's 482 tokens with T 32 and K 20), b densely, by one scatter-add and one (B, V) x (V, D) product
    (`_bias_gradient_sketch`); else the rows of R_o and R_h gathered entry by entry (`_gathered_sketch`), which never
    holds a (B, V) array. On the vLLM engine this runs inside `generate` (benchmarks/bench_vllm_sketch.py times it).
    """
    if topk_ids.ndim != 3 or topk_logprobs.shape != topk_ids.shape or tokens.shape != topk_ids.shape[:2] \
            or response_mask.shape != tokens.shape:
        raise ValueError(f"logprob_sketch: need topk_ids and topk_logprobs (B, T, K), tokens and response_mask (B, T);"
                         f" got {tuple(topk_ids.shape)}, {tuple(topk_logprobs.shape)}, {tuple(tokens.shape)}, "
                         f"{tuple(response_mask.shape)}")
    batch, length, k = topk_ids.shape
    mask = response_mask.bool()
    ids = torch.cat([tokens[..., None], topk_ids], dim=-1)  # (B, T, 1 + K)
    weights = torch.cat([torch.ones_like(topk_logprobs[..., :1], dtype=torch.float32),
                         -topk_logprobs.float().exp()], dim=-1)  # (B, T, 1 + K): +1 for e_y, −p for the top-K
    weights = torch.where(mask[..., None], weights, torch.zeros_like(weights))
    ids = torch.where(mask[..., None], ids, torch.zeros_like(ids))
    vocab_size = projection.output.shape[0]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"logprob_sketch: token ids must lie in [0, {vocab_size}) at unmasked positions, "
                         f"got range [{int(ids.min())}, {int(ids.max())}]")
    entries = length * (k + 1)
    sketch = _bias_gradient_sketch if vocab_size <= entries else _gathered_sketch
    return sketch(ids.reshape(batch, entries), weights.reshape(batch, entries), projection)


def _bias_gradient_sketch(ids: Tensor, weights: Tensor, projection: SketchProjection) -> Tensor:
    """`logprob_sketch` densely: b (B, V) by one scatter-add of the entries, then φ = b @ M with M (V, D) the rows
    vec(R_o[j] R_h[j mod d]ᵀ). ids, weights (B, n) -> (B, D). `_CHUNK_ELEMENTS` entries of b at a time."""
    vocab_size, hidden_size = projection.output.shape[0], projection.hidden.shape[0]
    rows = torch.arange(vocab_size, device=projection.output.device) % hidden_size
    kronecker = (projection.output[:, :, None] * projection.hidden[rows][:, None, :]).reshape(vocab_size, -1)
    step = max(1, _CHUNK_ELEMENTS // vocab_size)  # rollouts per chunk
    parts = [torch.zeros(len(chunk), vocab_size, device=ids.device).scatter_add_(1, chunk, chunk_weights) @ kronecker
             for chunk, chunk_weights in zip(ids.split(step), weights.split(step))]
    return torch.cat(parts) if parts else torch.zeros(0, kronecker.shape[1], device=ids.device)


def _gathered_sketch(ids: Tensor, weights: Tensor, projection: SketchProjection) -> Tensor:
    """`logprob_sketch` entry by entry: Σ_n w_n vec(R_o[id_n] R_h[id_n mod d]ᵀ) from gathered rows of R_o and R_h.
    ids, weights (B, n) -> (B, D). `_CHUNK_ROWS` gathered rows at a time."""
    batch, entries = ids.shape
    hidden_size = projection.hidden.shape[0]
    k_o, k_h = projection.output.shape[1], projection.hidden.shape[1]
    sums = torch.zeros(batch, k_o, k_h, dtype=torch.float32, device=ids.device)
    step = max(1, _CHUNK_ROWS // max(batch, 1))  # entries per chunk
    for start in range(0, entries, step):
        chunk_ids = ids[:, start:start + step]  # (B, n)
        vocab_rows = projection.output[chunk_ids] * weights[:, start:start + step, None]  # (B, n, k_o)
        hidden_rows = projection.hidden[chunk_ids % hidden_size]  # (B, n, k_h)
        sums += vocab_rows.transpose(1, 2) @ hidden_rows
    return sums.reshape(batch, k_o * k_h)


def _token_hash(tokens: Tensor, dim: int, seed: int) -> Tensor:
    """Universal hash ((a·id + b) mod p) mod dim with a, b from `torch.Generator(seed)`.  Same shape as tokens."""
    generator = torch.Generator().manual_seed(seed)
    a = int(torch.randint(1, _HASH_PRIME, (), generator=generator))
    b = int(torch.randint(0, _HASH_PRIME, (), generator=generator))
    return (tokens.long() * a + b) % _HASH_PRIME % dim


def token_sketch(tokens: Tensor, response_mask: Tensor, *, dim: int = 256, seed: int = 0) -> Tensor:
    """Hashed token-SET bits: bit h(id) is 1 iff some unmasked token hashes to it.  tokens, response_mask (B, T)
    -> (B, dim) float32 of 0/1 (a one-hash Bloom filter; float so pruners can take inner products).

    Jaccard is estimated by linear counting (Whang et al. 1990), see `token_jaccard`: a set of n distinct ids
    leaves dim·(1 − 1/dim)^n ≈ dim·e^{−n/dim} bits at 0, so n̂ = −dim·ln(zeros/dim); the union's bits are the OR,
    so J = (n̂_A + n̂_B − n̂_{A∪B}) / n̂_{A∪B}. Accurate while the distinct count stays below a few times dim.
    """
    if tokens.ndim != 2 or response_mask.shape != tokens.shape:
        raise ValueError(f"token_sketch: need tokens and response_mask (B, T), got {tuple(tokens.shape)} and "
                         f"{tuple(response_mask.shape)}")
    if dim < 1:
        raise ValueError(f"token_sketch: dim must be positive, got {dim}")
    mask = response_mask.bool()
    if mask.any() and int(tokens[mask].min()) < 0:
        raise ValueError(f"token_sketch: token ids must be ≥ 0 at unmasked positions, got {int(tokens[mask].min())}")
    bits = _token_hash(torch.where(mask, tokens, torch.zeros_like(tokens)), dim, seed)  # (B, T)
    sketch = torch.zeros(tokens.shape[0], dim, dtype=torch.float32, device=tokens.device)
    return sketch.scatter_reduce_(1, bits, mask.float(), reduce="amax")


def _distinct_count(set_bits: Tensor, dim: int) -> Tensor:
    """Linear-counting estimate −dim·ln(zero fraction); a full filter is read as dim − 0.5 bits set."""
    zero_fraction = (dim - set_bits).clamp(min=0.5) / dim
    return -dim * zero_fraction.log()


def token_jaccard(sketches: Tensor) -> Tensor:
    """Estimated Jaccard similarity of the token sets behind `token_sketch` bits.  (B, dim) -> (B, B) in [0, 1];
    two empty sets count as identical (1)."""
    bits = (sketches > 0).float()
    dim = bits.shape[1]
    ones = bits.sum(dim=1)  # (B,)
    both = bits @ bits.T  # (B, B) bits set in both
    union_bits = ones[:, None] + ones[None, :] - both
    count, union = _distinct_count(ones, dim), _distinct_count(union_bits, dim)
    intersection = count[:, None] + count[None, :] - union
    jaccard = torch.where(union > 0, intersection / union.clamp(min=1e-12), torch.ones_like(union))
    return jaccard.clamp(0.0, 1.0)


SKETCHES.register("lm_head")(lm_head_sketch)
SKETCHES.register("logprob")(logprob_sketch)
SKETCHES.register("tokens")(token_sketch)
