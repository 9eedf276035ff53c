"""Policy losses: hand-computed values, invariants (GSPO = GRPO at ratio 1, no clipping on-policy),
a loop-over-rollouts reference for every loss and aggregation, rollout weights, errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.objectives import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    hyperparameters,
    kl_k3,
    overlong_reward_penalty,
    policy_loss,
)

F64 = torch.float64
LOSSES = ["grpo", "dapo", "dr_grpo", "gspo", "gspo_token"]
MODES = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]


def _hand_batch():
    """Two rollouts, T = 3. Row 0: 2 tokens, ratios 1.5, 0.9, A = +1. Row 1: 3 tokens, ratios 0.5, 1.0, 1.3, A = -2.

    The padding position (0, 2) holds garbage old log-prob -1e4 (ratio e^1e4 if it were not masked)."""
    logprobs = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, -1.0, -0.3]], dtype=F64, requires_grad=True)
    log_ratio = torch.tensor([[math.log(1.5), math.log(0.9), 0.0], [math.log(0.5), 0.0, math.log(1.3)]], dtype=F64)
    old = logprobs.detach() - log_ratio
    old[0, 2] = -1e4
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages = torch.tensor([1.0, -2.0], dtype=F64)
    return logprobs, old, advantages, mask


def _loss_and_grad(name, logprobs, old, advantages, mask, **kwargs):
    out = policy_loss(name, logprobs, old, advantages, mask, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    return out, grad


# --- Hand-computed values ----------------------------------------------------------------------------------


def test_grpo_by_hand():
    # eps 0.2. Row 0 (A=+1): min(1.5, 1.2) = 1.2 -> -1.2 (clipped, no grad); 0.9 -> -0.9. Mean -1.05.
    # Row 1 (A=-2): -min(rA, clip(r)A) = 2·max(r, clip r): 0.5 -> 1.6 (clipped), 1.0 -> 2, 1.3 -> 2.6 (not clipped:
    # A < 0). Mean 6.2 / 3. Loss (-1.05 + 6.2/3) / 2 = 0.508333...
    out, grad = _loss_and_grad("grpo", *_hand_batch())
    assert out.loss.item() == pytest.approx((-1.05 + 6.2 / 3) / 2)
    # d/dlp of -r·A / (n_i · B) on unclipped tokens: -0.9/(2·2); 2·1.0/(3·2); 2·1.3/(3·2).
    expected = torch.tensor([[0.0, -0.9 / 4, 0.0], [0.0, 2.0 / 6, 2.6 / 6]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert out.metrics["clip_fraction_low"] == pytest.approx(1 / 5)
    assert out.metrics["clip_fraction_high"] == pytest.approx(1 / 5)
    assert out.metrics["ratio_mean"] == pytest.approx((1.5 + 0.9 + 0.5 + 1.0 + 1.3) / 5)
    assert out.metrics["kl"] == 0.0


def test_dapo_by_hand():
    # eps 0.2 / 0.28: row 0: -1.28 (clipped), -0.9; row 1: 1.6 (clipped), 2.0, 2.6 (1.3 > 1.28 but A < 0).
    # Token mean over 5 tokens: (-1.28 - 0.9 + 1.6 + 2 + 2.6) / 5 = 0.804.
    out, grad = _loss_and_grad("dapo", *_hand_batch())
    assert out.loss.item() == pytest.approx(0.804)
    expected = torch.tensor([[0.0, -0.9 / 5, 0.0], [0.0, 2.0 / 5, 2.6 / 5]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 5)


def test_dr_grpo_by_hand():
    # Token losses -1.2, -0.9, 1.6, 2, 2.6 sum to 4.1; normaliser B · max_length.
    out, grad = _loss_and_grad("dr_grpo", *_hand_batch(), max_length=4)
    assert out.loss.item() == pytest.approx(4.1 / 8)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.9, 0.0], [0.0, 2.0, 2.6]], dtype=F64) / 8)
    out, _ = _loss_and_grad("dr_grpo", *_hand_batch())  # max_length None -> T = 3
    assert out.loss.item() == pytest.approx(4.1 / 6)


def test_grpo_kl_term_by_hand():
    logprobs, old, advantages, mask = _hand_batch()
    ref = logprobs.detach().clone()
    ref[1, 1] += math.log(2)  # k3 there: e^{ln 2} - ln 2 - 1 = 1 - ln 2; 0 elsewhere
    ref[0, 2] = 1e4  # padding garbage must not count
    out, grad = _loss_and_grad("grpo", logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    k3 = 1 - math.log(2)
    assert out.loss.item() == pytest.approx((-1.05 + 6.2 / 3) / 2 + 0.1 * k3 / 3 / 2)
    assert out.metrics["kl"] == pytest.approx(k3 / 5)
    # d k3/d lp = 1 - e^{ref - lp} = 1 - 2 = -1 at (1, 1), weighted 0.1 / (3 · 2).
    assert grad[1, 1].item() == pytest.approx(2.0 / 6 - 0.1 / 6)
    # beta = 0 with a reference: KL is reported but not in the loss.
    out0 = policy_loss("grpo", logprobs, old, advantages, mask, ref_logprobs=ref)
    assert out0.loss.item() == pytest.approx((-1.05 + 6.2 / 3) / 2)
    assert out0.metrics["kl"] == pytest.approx(k3 / 5)


def _gspo_hand_batch():
    """Row 0: token log-ratios 0.001, 0 (+ padding): s_0 = e^{0.0005} > 1 + 4e-4, A = +1 -> clipped to 1.0004.
    Row 1: log-ratios 2e-4, -1e-4, -4e-4: s_1 = e^{-1e-4} inside [1 - 3e-4, 1 + 4e-4], A = -2."""
    logprobs = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, -1.0, -0.3]], dtype=F64, requires_grad=True)
    log_ratio = torch.tensor([[1e-3, 0.0, 0.0], [2e-4, -1e-4, -4e-4]], dtype=F64)
    old = logprobs.detach() - log_ratio
    old[0, 2] = 1e4
    return logprobs, old, torch.tensor([1.0, -2.0], dtype=F64), torch.tensor([[1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_by_hand(name):
    out, grad = _loss_and_grad(name, *_gspo_hand_batch())
    s1 = math.exp(-1e-4)
    assert out.loss.item() == pytest.approx((-1.0004 + 2 * s1) / 2, rel=1e-12)
    # Row 0 clipped: no gradient. Row 1: d(2 s_1)/d lp_t / B = 2 s_1 · (1/3) / 2.
    expected = torch.tensor([[0.0, 0.0, 0.0], [s1 / 3, s1 / 3, s1 / 3]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    if name == "gspo":  # per rollout: one of two clipped
        assert out.metrics["clip_fraction"] == pytest.approx(0.5)
        assert out.metrics["ratio_mean"] == pytest.approx((math.exp(5e-4) + s1) / 2)
    else:  # per token: the 2 tokens of row 0 of 5
        assert out.metrics["clip_fraction"] == pytest.approx(2 / 5)
        assert out.metrics["ratio_mean"] == pytest.approx((2 * math.exp(5e-4) + 3 * s1) / 5)


def test_rollout_weights_by_hand():
    # grpo rows -1.05 and 6.2/3 weighted 0.5 and 2; normaliser still B = 2.
    out, grad = _loss_and_grad("grpo", *_hand_batch(), rollout_weights=torch.tensor([0.5, 2.0], dtype=F64))
    assert out.loss.item() == pytest.approx((0.5 * -1.05 + 2 * 6.2 / 3) / 2)
    expected = torch.tensor([[0.0, -0.5 * 0.9 / 4, 0.0], [0.0, 4.0 / 6, 5.2 / 6]], dtype=F64)
    torch.testing.assert_close(grad, expected)


def test_aggregations_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(7 / 3)
    assert aggregate(x, mask, "seq_mean_token_sum_norm", max_length=5).item() == pytest.approx(7 / 10)
    assert aggregate(x, mask, "seq_mean_token_sum_norm").item() == pytest.approx(7 / 6)
    w = torch.tensor([2.0, 0.5])
    assert aggregate(x, mask, "seq_mean_token_mean", rollout_weights=w).item() == pytest.approx((3 + 2) / 2)
    assert aggregate(x, mask, "token_mean", rollout_weights=w).item() == pytest.approx(8 / 3)
    assert aggregate(x, mask, "seq_mean_token_sum_norm", max_length=5, rollout_weights=w).item() == pytest.approx(0.8)
    # An empty rollout contributes 0 but still counts in B.
    empty = torch.tensor([[True, True, False], [False, False, False]])
    assert aggregate(x, empty, "seq_mean_token_mean").item() == pytest.approx(1.5 / 2)


def test_kl_k3_by_hand_and_nonnegative():
    lp = torch.tensor([[0.0, -1.0, -2.0]])
    ref = torch.tensor([[math.log(2), -1.0, -1.0]])
    expected = torch.tensor([[1 - math.log(2), 0.0, math.e - 1 - 1]])
    torch.testing.assert_close(kl_k3(lp, ref), expected)
    gen = torch.Generator().manual_seed(0)
    assert (kl_k3(torch.randn(50, 50, generator=gen), torch.randn(50, 50, generator=gen)) >= 0).all()


def test_overlong_penalty_at_boundaries():
    # max 10, buffer 4: no penalty up to 6; -(len - 6)/4 for 6 < len <= 10; -1 beyond (DAPO eq. 13).
    lengths = torch.tensor([0, 6, 7, 8, 9, 10, 11, 500])
    got = overlong_reward_penalty(lengths, max_length=10, buffer_length=4)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    got = overlong_reward_penalty(lengths.float(), max_length=10, buffer_length=4, penalty_factor=0.5)
    assert got.tolist() == [0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5, -0.5]
    whole = overlong_reward_penalty(torch.tensor([0, 9, 10, 11]), max_length=10, buffer_length=10)
    assert whole.tolist() == pytest.approx([0.0, -0.9, -1.0, -1.0])
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_reward_penalty(lengths, max_length=10, buffer_length=0)
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_reward_penalty(lengths, max_length=10, buffer_length=11)


def test_documented_defaults():
    assert hyperparameters("grpo") == dict(
        epsilon=0.2, epsilon_high=None, beta=0.0, aggregation="seq_mean_token_mean", max_length=None)
    assert hyperparameters("dapo") == dict(
        epsilon=0.2, epsilon_high=0.28, beta=0.0, aggregation="token_mean", max_length=None)
    assert hyperparameters("dr_grpo")["aggregation"] == "seq_mean_token_sum_norm"
    for name in ["gspo", "gspo_token"]:
        assert hyperparameters(name) == dict(
            epsilon=3e-4, epsilon_high=4e-4, beta=0.0, aggregation="seq_mean_token_mean", max_length=None)
    assert POLICY_LOSSES.names() == sorted(LOSSES)
    assert AGGREGATIONS.names() == sorted(MODES)


# --- Invariants ------------------------------------------------------------------------------------------


def _random_batch(seed, B=6, T=7, scale=0.3, mask_kind="random"):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(B, T, generator=gen, dtype=F64) * 3).requires_grad_()
    old = logprobs.detach() + scale * torch.randn(B, T, generator=gen, dtype=F64)
    ref = logprobs.detach() + 0.5 * torch.randn(B, T, generator=gen, dtype=F64)
    advantages = torch.randn(B, generator=gen, dtype=F64)
    if mask_kind == "full":
        mask = torch.ones(B, T, dtype=torch.bool)
    elif mask_kind == "right_padded":  # each response is a prefix of length 1..T
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        mask = torch.arange(T) < lengths[:, None]
    else:  # random holes, with one rollout left empty
        mask = torch.rand(B, T, generator=gen) < 0.6
        mask[0] = False
    old = torch.where(mask, old, torch.full_like(old, -1e4))  # garbage on padding
    ref = torch.where(mask, ref, torch.full_like(ref, 1e4))
    weights = torch.rand(B, generator=gen, dtype=F64) * 2
    return logprobs, old, advantages, mask, ref, weights


@pytest.mark.parametrize("mask_kind", ["full", "right_padded", "random"])
@pytest.mark.parametrize("seed", range(3))
def test_gspo_equals_grpo_when_every_ratio_is_one(seed, mask_kind):
    logprobs, _, advantages, mask, _, _ = _random_batch(seed, mask_kind=mask_kind)
    old = logprobs.detach().clone()
    grpo, grpo_grad = _loss_and_grad("grpo", logprobs, old, advantages, mask)
    for name in ["gspo", "gspo_token"]:
        gspo, gspo_grad = _loss_and_grad(name, logprobs, old, advantages, mask)
        torch.testing.assert_close(gspo.loss, grpo.loss)
        torch.testing.assert_close(gspo_grad, grpo_grad)


@pytest.mark.parametrize("name", LOSSES)
def test_no_clipping_on_policy(name):
    logprobs, _, advantages, mask, _, _ = _random_batch(1, mask_kind="right_padded")
    out = policy_loss(name, logprobs, logprobs.detach(), advantages, mask)
    assert out.metrics["clip_fraction"] == 0.0
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    # ratio 1 everywhere: every token's loss is -A_i, aggregated.
    n = mask.sum(-1).to(F64)
    expected = {
        "seq_mean_token_mean": -advantages.mean(),
        "token_mean": -(advantages * n).sum() / n.sum(),
        "seq_mean_token_sum_norm": -(advantages * n).sum() / (mask.numel()),
    }[hyperparameters(name)["aggregation"]]
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("seed", range(4))
def test_gspo_token_has_gspo_value_and_gradient(seed):
    # Small log-ratios so that some rollouts are clipped and some are not.
    logprobs, old, advantages, mask, _, _ = _random_batch(seed, scale=1e-3, mask_kind="right_padded")
    gspo, gspo_grad = _loss_and_grad("gspo", logprobs, old, advantages, mask)
    token, token_grad = _loss_and_grad("gspo_token", logprobs, old, advantages, mask)
    torch.testing.assert_close(token.loss, gspo.loss)
    torch.testing.assert_close(token_grad, gspo_grad)
    assert 0 < gspo.metrics["clip_fraction"] < 1


@pytest.mark.parametrize("name", LOSSES)
def test_rollout_weights_all_ones_equals_none_and_zero_weight_removes_rollout(name):
    logprobs, old, advantages, mask, ref, _ = _random_batch(2, mask_kind="right_padded")
    kwargs = dict(ref_logprobs=ref, beta=0.05)
    base, base_grad = _loss_and_grad(name, logprobs, old, advantages, mask, **kwargs)
    ones, ones_grad = _loss_and_grad(name, logprobs, old, advantages, mask, rollout_weights=torch.ones(6), **kwargs)
    assert torch.equal(base.loss, ones.loss) and torch.equal(base_grad, ones_grad)

    weights = torch.ones(6, dtype=F64)
    weights[3] = 0.0
    out, grad = _loss_and_grad(name, logprobs, old, advantages, mask, rollout_weights=weights, **kwargs)
    assert (grad[3] == 0).all() and (grad[2] != 0).any()
    changed = advantages.clone()
    changed[3] = 100.0  # what the removed rollout says no longer matters
    moved = policy_loss(name, logprobs, old, changed, mask, rollout_weights=weights, **kwargs)
    assert torch.equal(moved.loss, out.loss)


@pytest.mark.parametrize("name", LOSSES)
def test_padding_garbage_never_leaks(name):
    logprobs, old, advantages, mask, ref, _ = _random_batch(3, mask_kind="random")
    lp = logprobs.detach().clone()
    lp[~mask] = float("inf")
    lp.requires_grad_()
    out, grad = _loss_and_grad(name, lp, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all() and (grad[~mask] == 0).all()
    clean, _ = _loss_and_grad(name, logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    torch.testing.assert_close(out.loss, clean.loss)


# --- Loop-over-rollouts reference ------------------------------------------------------------------------


def _reference_loss(name, logprobs, old, advantages, mask, ref, weights, *, epsilon, epsilon_high, beta,
                    aggregation, max_length):
    """One rollout at a time, one token at a time, straight from the papers' formulas."""
    B, T = logprobs.shape
    high = epsilon if epsilon_high is None else epsilon_high
    row_sums, row_counts = [], []
    for i in range(B):
        tokens = [t for t in range(T) if mask[i, t]]
        log_s = sum((logprobs[i, t] - old[i, t] for t in tokens), torch.zeros((), dtype=F64)) / max(len(tokens), 1)
        total = torch.zeros((), dtype=F64)
        for t in tokens:
            if name == "gspo":
                ratio = torch.exp(log_s)
            elif name == "gspo_token":
                ratio = torch.exp(log_s.detach() + logprobs[i, t] - logprobs[i, t].detach())
            else:
                ratio = torch.exp(logprobs[i, t] - old[i, t])
            a = advantages[i]
            loss = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + high) * a)
            if beta:
                d = ref[i, t] - logprobs[i, t]
                loss = loss + beta * (torch.exp(d) - d - 1)
            total = total + loss
        weight = 1.0 if weights is None else weights[i]
        row_sums.append(weight * total)
        row_counts.append(len(tokens))
    if aggregation == "seq_mean_token_mean":
        return sum(s / max(n, 1) for s, n in zip(row_sums, row_counts)) / B
    if aggregation == "token_mean":
        return sum(row_sums) / max(sum(row_counts), 1)
    return sum(row_sums) / (B * (T if max_length is None else max_length))


@pytest.mark.parametrize("mask_kind", ["full", "right_padded", "random"])
@pytest.mark.parametrize("aggregation", MODES)
@pytest.mark.parametrize("name", LOSSES)
def test_vectorised_matches_loop_reference(name, aggregation, mask_kind):
    for seed, scale, beta, weighted, max_length in [(0, 0.3, 0.0, False, None), (1, 1e-3, 0.04, True, 11)]:
        logprobs, old, advantages, mask, ref, weights = _random_batch(seed, scale=scale, mask_kind=mask_kind)
        weights = weights if weighted else None
        hp = dict(hyperparameters(name), beta=beta, aggregation=aggregation, max_length=max_length)
        out, grad = _loss_and_grad(name, logprobs, old, advantages, mask, ref_logprobs=ref,
                                   rollout_weights=weights, **hp)
        expected = _reference_loss(name, logprobs, old, advantages, mask, ref, weights, **hp)
        (expected_grad,) = torch.autograd.grad(expected, logprobs)
        torch.testing.assert_close(out.loss, expected)
        torch.testing.assert_close(grad, expected_grad)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(LOSSES), st.integers(0, 10_000), st.floats(0.0, 0.5))
def test_loss_is_finite_and_kl_nonnegative(name, seed, beta):
    logprobs, old, advantages, mask, ref, weights = _random_batch(seed, mask_kind="random")
    out = policy_loss(name, logprobs, old, advantages, mask, ref_logprobs=ref, rollout_weights=weights, beta=beta)
    assert torch.isfinite(out.loss)
    assert out.metrics["kl"] >= 0 and 0 <= out.metrics["clip_fraction"] <= 1


# --- Errors --------------------------------------------------------------------------------------------------


def test_unknown_names_and_hyperparameters_raise_naming_the_choices():
    batch = _hand_batch()
    with pytest.raises(KeyError, match=r"gspo_token"):
        policy_loss("ppo", *batch)
    with pytest.raises(TypeError, match=r"clip_ratio.*valid: \['aggregation', 'beta', 'epsilon'"):
        policy_loss("grpo", *batch, clip_ratio=0.2)
    with pytest.raises(KeyError, match=r"seq_mean_token_sum_norm"):
        policy_loss("grpo", *batch, aggregation="bnpo")
    with pytest.raises(KeyError, match=r"token_mean"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "sum")


def test_bad_values_and_shapes_raise_clear_errors():
    logprobs, old, advantages, mask = _hand_batch()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss("grpo", logprobs, old, advantages, mask, beta=0.1)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("grpo", logprobs, old, advantages[:1], mask)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss("grpo", logprobs, old[:, :2], advantages, mask)
    with pytest.raises(ValueError, match="rollout_weights"):
        policy_loss("grpo", logprobs, old, advantages, mask, rollout_weights=torch.ones(3))
    with pytest.raises(ValueError, match="response_mask"):
        policy_loss("grpo", logprobs, old, advantages, mask * 2)
    with pytest.raises(ValueError, match=r"logprobs must be \(B, T\)"):
        policy_loss("grpo", logprobs[0], old[0], advantages, mask[0])
    with pytest.raises(ValueError, match="epsilon"):
        policy_loss("dapo", logprobs, old, advantages, mask, epsilon=1.5)
    with pytest.raises(ValueError, match="max_length"):
        policy_loss("dr_grpo", logprobs, old, advantages, mask, max_length=0)


# --- Multiplicities: merging identical rollouts is lossless ---------------------------------------------------


def _tiny_policy_batch(seed):
    """A real (if small) differentiable policy: logits = (E[y_<t-context] + P[group]) W, log-probs of the sampled
    tokens, so identical (group, tokens) rows have identical log-probs as functions of the shared parameters.
    10 rollouts in 3 groups, with copies; old / ref log-probs from perturbed parameters; rewards are a function of
    the sequence, advantages GRPO's (no group all equal)."""
    from fastrl_core.algo.advantages import compute_advantages

    gen = torch.Generator().manual_seed(seed)
    vocab, width, T = 6, 4, 5
    params = {"E": torch.randn(vocab, width, generator=gen, dtype=F64), "P": torch.randn(3, width, generator=gen,
              dtype=F64), "W": torch.randn(width, vocab, generator=gen, dtype=F64)}
    params = {k: v.requires_grad_() for k, v in params.items()}
    distinct = torch.randint(0, vocab, (6, T), generator=gen)
    lengths = torch.tensor([5, 3, 5, 2, 4, 5])
    rows = torch.tensor([0, 0, 1, 0, 2, 3, 3, 4, 5, 4])  # copies: 0 x3, 3 x2, 4 x2
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    tokens = distinct[rows]
    mask = torch.arange(T)[None, :] < lengths[rows][:, None]
    tokens = torch.where(mask, tokens, torch.randint(0, vocab, tokens.shape, generator=gen))  # padding garbage

    def logprobs_of(p, index):
        previous = torch.cat([torch.zeros(len(index), 1, dtype=torch.long), tokens[index][:, :-1]], 1)
        hidden = p["E"][previous] + p["P"][group_ids[index]][:, None, :]  # (n, T, width)
        return (hidden @ p["W"]).log_softmax(-1).gather(-1, tokens[index][..., None]).squeeze(-1)

    with torch.no_grad():
        old_p = {k: v + 0.3 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in params.items()}
        ref_p = {k: v + 0.3 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in params.items()}
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.5, 0.0, 1.0], dtype=F64)[rows]
    advantages = compute_advantages("group_normalized", rewards, group_ids).to(F64)
    weights = torch.tensor([0.5, 1.5, 2.0, 0.7, 1.0, 0.3, 0.9, 1.2, 0.8, 1.1], dtype=F64)[rows]  # same per class
    return params, logprobs_of, old_p, ref_p, tokens, mask, group_ids, advantages, weights


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("aggregation", [None, *MODES])
@pytest.mark.parametrize("name", LOSSES)
def test_merged_duplicates_give_the_same_loss_gradient_and_metrics(name, aggregation, beta):
    """Loss, autograd gradient w.r.t. the shared parameters, and every metric of the batch with its copies equal
    those of one representative per class with rollout_counts = multiplicity (pruner weights on, too)."""
    from fastrl_core.algo.duplicates import find_duplicates

    params, logprobs_of, old_p, ref_p, tokens, mask, group_ids, advantages, weights = _tiny_policy_batch(0)
    found = find_duplicates(group_ids, tokens, mask)
    assert found.counts.tolist() == [3, 1, 1, 2, 2, 1]
    hp = dict(beta=beta, epsilon=0.2, epsilon_high=0.2)  # GSPO's 3e-4 / 4e-4 would clip every perturbed rollout
    hp |= dict(max_length=7) if aggregation is None else dict(aggregation=aggregation)
    results = []
    for index, counts in ((torch.arange(10), None), (found.unique, found.counts)):
        with torch.no_grad():
            old, ref = logprobs_of(old_p, index), logprobs_of(ref_p, index)
        for weighted in (False, True):
            out = policy_loss(name, logprobs_of(params, index), old, advantages[index], mask[index],
                              ref_logprobs=ref, rollout_weights=weights[index] if weighted else None,
                              rollout_counts=counts, **hp)
            grads = torch.autograd.grad(out.loss, list(params.values()))
            results.append((out, grads))
    for (full, full_grads), (merged, merged_grads) in ((results[0], results[2]), (results[1], results[3])):
        torch.testing.assert_close(merged.loss, full.loss, rtol=1e-12, atol=1e-14)
        for a, b in zip(merged_grads, full_grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
        for key, value in full.metrics.items():
            assert merged.metrics[key] == pytest.approx(value, rel=1e-10, abs=1e-13), key
    assert 0 < results[0][0].metrics["clip_fraction"] < 1  # the case exercises clipping


def test_rollout_counts_by_hand_and_errors():
    # grpo rows -1.05 and 6.2/3 counted 3 and 1: (3·-1.05 + 6.2/3) / 4. dapo: token sums -2.18·3 + 6.2 over 2·3 + 3.
    batch = _hand_batch()
    counts = torch.tensor([3.0, 1.0], dtype=F64)
    assert policy_loss("grpo", *batch, rollout_counts=counts).loss.item() == pytest.approx((-3.15 + 6.2 / 3) / 4)
    assert policy_loss("dapo", *batch, rollout_counts=counts).loss.item() == pytest.approx((-2.18 * 3 + 6.2) / 9)
    assert policy_loss("dr_grpo", *batch, rollout_counts=counts, max_length=4).loss.item() == pytest.approx(
        (-2.1 * 3 + 6.2) / 16)
    # clip fraction over 2·3 + 3 = 9 token copies: row 0's clipped token 3 times, row 1's once
    assert policy_loss("grpo", *batch, rollout_counts=counts).metrics["clip_fraction"] == pytest.approx(4 / 9)
    ones = policy_loss("grpo", *batch, rollout_counts=torch.ones(2, dtype=F64)).loss
    torch.testing.assert_close(ones, policy_loss("grpo", *batch).loss)
    with pytest.raises(ValueError, match="rollout_counts must have shape"):
        policy_loss("grpo", *batch, rollout_counts=torch.ones(3))
    with pytest.raises(ValueError, match=r"rollout_counts must be finite and > 0; rows \[1\]"):
        policy_loss("grpo", *batch, rollout_counts=torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("aggregation", [None, *MODES])
@pytest.mark.parametrize("name", LOSSES)
def test_absent_rows_count_as_rows_of_weight_zero(name, aggregation, beta):
    """Pruned rows passed as absent_mask / absent_counts give the loss and gradient of the whole batch with those
    rows present at weight 0 (multiplicities and pruner weights on), and the present rows' metrics."""
    params, logprobs_of, old_p, ref_p, tokens, mask, group_ids, advantages, weights = _tiny_policy_batch(1)
    counts = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0], dtype=F64)
    present, absent = torch.tensor([0, 2, 3, 7, 9]), torch.tensor([1, 4, 5, 6, 8])
    hp = dict(beta=beta, epsilon=0.2, epsilon_high=0.2)
    hp |= dict(max_length=7) if aggregation is None else dict(aggregation=aggregation)
    everything = torch.arange(10)
    with torch.no_grad():
        old, ref = logprobs_of(old_p, everything), logprobs_of(ref_p, everything)
    zeroed = weights.clone()
    zeroed[absent] = 0.0
    full = policy_loss(name, logprobs_of(params, everything), old, advantages, mask, ref_logprobs=ref,
                       rollout_weights=zeroed, rollout_counts=counts, **hp)
    pruned = policy_loss(name, logprobs_of(params, present), old[present], advantages[present], mask[present],
                         ref_logprobs=ref[present], rollout_weights=weights[present], rollout_counts=counts[present],
                         absent_mask=mask[absent], absent_counts=counts[absent], **hp)
    alone = policy_loss(name, logprobs_of(params, present), old[present], advantages[present], mask[present],
                        ref_logprobs=ref[present], rollout_weights=weights[present], rollout_counts=counts[present],
                        **hp)
    torch.testing.assert_close(pruned.loss, full.loss, rtol=1e-12, atol=1e-14)
    for a, b in zip(torch.autograd.grad(pruned.loss, list(params.values())),
                    torch.autograd.grad(full.loss, list(params.values()))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    assert pruned.metrics == alone.metrics
    assert abs(pruned.loss.item()) < abs(alone.loss.item()), "absent rows must shrink the loss"


def test_every_aggregation_has_its_normaliser_units():
    from fastrl_core.algo.objectives import NORMALISER_UNITS

    assert set(NORMALISER_UNITS) == set(AGGREGATIONS.names()) == set(MODES)
    mask = torch.ones(3, 5, dtype=torch.bool, device="meta")  # units live where the mask does (a GPU run found it)
    assert all(units(mask, 5).device == mask.device for units in NORMALISER_UNITS.values())


def test_absent_rows_by_hand_and_errors():
    logprobs, old, advantages, mask = _hand_batch()
    alone = policy_loss("grpo", logprobs, old, advantages, mask).loss
    two_absent = torch.tensor([[1, 0, 0], [1, 1, 1]])  # 1 + 3 tokens, 2 rows
    for aggregation, share in (("seq_mean_token_mean", 2 / 4), ("token_mean", 5 / 9),
                               ("seq_mean_token_sum_norm", 2 / 4)):
        base = policy_loss("grpo", logprobs, old, advantages, mask, aggregation=aggregation).loss
        out = policy_loss("grpo", logprobs, old, advantages, mask, aggregation=aggregation, absent_mask=two_absent)
        assert float(out.loss) == pytest.approx(float(base) * share, rel=1e-12)
    counted = policy_loss("grpo", logprobs, old, advantages, mask, absent_mask=two_absent[:1],
                          absent_counts=torch.tensor([2.0])).loss
    assert float(counted) == pytest.approx(float(alone) * 2 / 4, rel=1e-12)  # one absent row standing for two
    empty = policy_loss("grpo", logprobs, old, advantages, mask, absent_mask=torch.zeros(0, 3, dtype=torch.bool))
    assert float(empty.loss) == float(alone)
    with pytest.raises(ValueError, match="absent_mask must be"):
        policy_loss("grpo", logprobs, old, advantages, mask, absent_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="absent_counts must have shape"):
        policy_loss("grpo", logprobs, old, advantages, mask, absent_mask=two_absent, absent_counts=torch.ones(3))
    with pytest.raises(ValueError, match="absent_counts must be finite"):
        policy_loss("grpo", logprobs, old, advantages, mask, absent_mask=two_absent,
                    absent_counts=torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="absent_counts given without absent_mask"):
        policy_loss("grpo", logprobs, old, advantages, mask, absent_counts=torch.ones(2))
