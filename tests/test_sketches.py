"""Gradient sketches: exactness against autograd, fidelity on the shipped VLM's real rollouts (what the pruner
reads) and on a tiny text model, streaming == batch, masking, hand-computed cases, token-set Jaccard."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_core.algo.sketches import (
    SKETCHES,
    LmHeadSketcher,
    SketchProjection,
    lm_head_sketch,
    logprob_sketch,
    make_projection,
    scale_sketches,
    split_sketch_dim,
    token_jaccard,
    token_sketch,
)

VOCAB, HIDDEN, ROLLOUTS, PROMPT_LEN, RESPONSE_LEN = 512, 64, 16, 6, 24


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


def upper(gram: torch.Tensor, offset: int) -> torch.Tensor:
    rows, cols = torch.triu_indices(gram.shape[0], gram.shape[1], offset)
    return gram[rows, cols]


@pytest.fixture(scope="module")
def policy():
    """A tiny Qwen2 trained briefly (120 Adam steps, ~3 s) on a fixed low-entropy bigram language, then 16 sampled rollouts of one prompt.

    Random init gives near-uniform next-token distributions (all rollouts share almost no tokens, every gradient is
    nearly orthogonal to every other one): unlike a real policy. Training on text from a peaked bigram "teacher"
    (entropy ~0.8 nats, top-1 ~0.74) gives peaked probabilities and rollouts of one prompt that overlap, like a
    GRPO group of a real model.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False)
        model = Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    teacher = (8.0 * torch.randn(VOCAB, VOCAB, generator=generator)).softmax(-1)  # (V, V) bigram

    def teacher_text(rows: int, length: int) -> torch.Tensor:
        text = torch.zeros(rows, length, dtype=torch.long)
        text[:, 0] = torch.randint(0, VOCAB, (rows,), generator=generator)
        for t in range(1, length):
            text[:, t] = torch.multinomial(teacher[text[:, t - 1]], 1, generator=generator).squeeze(1)
        return text

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(120):
        batch = teacher_text(16, 32)
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()

    sequences = teacher_text(1, PROMPT_LEN).repeat(ROLLOUTS, 1)
    with torch.no_grad():
        for _ in range(RESPONSE_LEN):
            probs = model(sequences).logits[:, -1].softmax(-1)
            sequences = torch.cat([sequences, torch.multinomial(probs, 1, generator=generator)], dim=1)
    out = model(sequences, output_hidden_states=True)
    response = slice(PROMPT_LEN - 1, -1)  # positions whose logits scored the response tokens
    lengths = torch.randint(RESPONSE_LEN // 2, RESPONSE_LEN + 1, (ROLLOUTS,), generator=generator)
    return dict(
        model=model,
        prompt=sequences[:1, :PROMPT_LEN],
        logits=out.logits[:, response],  # (B, T, V), still attached to the graph
        hidden=out.hidden_states[-1][:, response].detach(),  # (B, T, d) after the final norm
        tokens=sequences[:, PROMPT_LEN:],  # (B, T)
        mask=torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None],  # (B, T) ragged "EOS" lengths
        advantages=torch.randn(ROLLOUTS, generator=generator),
    )


def token_logprobs(policy) -> torch.Tensor:
    logits = policy["logits"]
    return logits.log_softmax(-1).gather(-1, policy["tokens"][..., None]).squeeze(-1)  # (B, T)


@pytest.fixture(scope="module")
def exact_gradients(policy):
    """(B, V·d): autograd gradient of A_i Σ_t m_t log π(y_t) w.r.t. lm_head.weight, one rollout at a time."""
    logprobs = token_logprobs(policy)
    weight = policy["model"].lm_head.weight
    rows = []
    for i in range(ROLLOUTS):
        objective = policy["advantages"][i] * (logprobs[i] * policy["mask"][i]).sum()
        (grad,) = torch.autograd.grad(objective, weight, retain_graph=True)
        rows.append(grad.flatten())
    return torch.stack(rows)


def identity_projection() -> SketchProjection:
    return SketchProjection(torch.eye(VOCAB), torch.eye(HIDDEN))


def test_identity_projection_full_vocab_equals_autograd_gradient(policy, exact_gradients):
    sketches = lm_head_sketch(policy["hidden"], policy["logits"].detach(), policy["tokens"], policy["mask"],
                              identity_projection(), top_k=VOCAB)
    scaled = scale_sketches(sketches, policy["advantages"])
    torch.testing.assert_close(scaled, exact_gradients, rtol=1e-4, atol=1e-5)


def test_gram_of_default_sketch_correlates_with_exact_gradient_gram(policy, exact_gradients):
    """Issue 2: Pearson ≥ 0.9 over the Gram entries (upper triangle WITH the diagonal) at D = 256, top-K 64."""
    projection = make_projection(VOCAB, HIDDEN)
    assert projection.dim == 256
    sketches = lm_head_sketch(policy["hidden"], policy["logits"].detach(), policy["tokens"], policy["mask"],
                              projection, top_k=64)
    scaled = scale_sketches(sketches, policy["advantages"])
    exact_gram, sketch_gram = exact_gradients @ exact_gradients.T, scaled @ scaled.T
    assert pearson(upper(exact_gram, 0), upper(sketch_gram, 0)) >= 0.9
    # Off-diagonal entries alone (the similarities a diversity pruner reads) are harder: the exact gradients' mean
    # |cosine| here is 0.08, near the ~1/√D noise of ANY 256-dim random projection. Over projection seeds 0-19:
    # all entries 0.966 (min 0.940), off-diagonal 0.78 (min 0.54); a dense i.i.d. Gaussian 256-dim projection of the
    # exact V·d gradients, for comparison: 0.989 / 0.86 (min 0.77). Seed 0 (default): 0.979 / 0.90.
    assert pearson(upper(exact_gram, 1), upper(sketch_gram, 1)) >= 0.6


@pytest.fixture(scope="module")
def vlm_rollouts(tmp_path_factory):
    """Real rollouts of the shipped warm start: 8 synthetic prompts × 8, the HF engine with the lm_head sketch
    projection and top-K exactly as the trainer builds them (TrainConfig defaults), and the exact output-layer
    gradient of Σ_t log π(y_t) per rollout by autograd through W (the lm_head input h captured by a hook on the
    re-scoring forward's decoder, so the gradient is that of the output layer alone, tied embeddings or not)."""
    from fastrl_core.config import TrainConfig
    from fastrl_core.data.problems import load_problems
    from fastrl_core.data.synthetic import ensure_dataset
    from fastrl_core.engines.hf import decoder
    from fastrl_core.policy import load_policy
    from fastrl_core.shipped import EMBEDDED_MODEL
    from fastrl_core.run_setup import make_engine

    if not (EMBEDDED_MODEL / "config.json").is_file():
        pytest.skip("no shipped warm start in fastrl_core/models/embedded")
    config = TrainConfig(share_prompts=False)  # one decoder forward per row over prompt + completion, hooked below
    root = ensure_dataset(tmp_path_factory.mktemp("data"), n_train=8, n_test=1, seed=0)
    problems = load_problems(root / "train")
    policy = load_policy("embedded")
    head = policy.model.get_output_embeddings()
    projection = make_projection(head.weight.shape[0], head.weight.shape[1], sketch_dim=config.sketch_dim,
                                 seed=config.seed)
    engine = make_engine(config, policy, projection)
    rollouts = engine.generate(problems, [8] * len(problems), generator=torch.Generator().manual_seed(0))
    captured = []
    hook = decoder(policy.model).register_forward_hook(
        lambda module, inputs, output: captured.append(output.last_hidden_state.detach()))
    with torch.no_grad():
        engine.token_logprobs(policy.model, problems, rollouts, torch.arange(len(rollouts)))
    hook.remove()
    length = int(rollouts.completion_mask.sum(dim=1).max())
    full = captured[0]  # (N, L, d): the decoder's output over prompt + completion
    hidden = full[:, full.shape[1] - length - 1 : -1].float()  # (N, T', d): the positions that scored y_0..y_T'-1
    tokens, mask = rollouts.completion_ids[:, :length], rollouts.completion_mask[:, :length]
    weight = head.weight.detach().clone().requires_grad_()
    rows = []
    for i in range(len(rollouts)):
        logprobs = (hidden[i][mask[i]] @ weight.T).log_softmax(-1).gather(-1, tokens[i][mask[i]][:, None])
        rows.append(torch.autograd.grad(logprobs.sum(), weight)[0].flatten())
    return rollouts, torch.stack(rows)


def test_in_group_cosines_of_distinct_real_completions_track_exact_last_layer_gradients(vlm_rollouts):
    """The similarities the pruner reads: cosines between the advantage-free sketches of two DIFFERENT completions
    of the same prompt (off-diagonal; identical completions, cosine 1 both ways, are left out), against the exact
    output-layer gradient cosines. Measured at these settings (D = 256, top-K 64, 145 distinct pairs): Pearson
    0.979, mean |difference| 0.061 (largest 0.43); 43 % of the in-group pairs are identical completions (12
    prompts: Pearson 0.958, mean |difference| 0.094). Exact cosines between distinct completions are mostly
    negative here (mean −0.42), so "diverse" is the rule, not the exception."""
    rollouts, exact = vlm_rollouts
    sketch_cos = torch.nn.functional.normalize(rollouts.sketches.double(), dim=1)
    exact_cos = torch.nn.functional.normalize(exact.double(), dim=1)
    sketch_cos, exact_cos = sketch_cos @ sketch_cos.T, exact_cos @ exact_cos.T
    same_group = rollouts.prompt_index[:, None] == rollouts.prompt_index[None, :]
    texts = rollouts.completion_ids.masked_fill(~rollouts.completion_mask, -1)
    identical = (texts[:, None, :] == texts[None, :, :]).all(-1)
    pairs = torch.triu(same_group & ~identical, diagonal=1)
    assert int(pairs.sum()) >= 30, "too few distinct in-group pairs to measure"
    assert pearson(sketch_cos[pairs], exact_cos[pairs]) >= 0.9
    assert float((sketch_cos[pairs] - exact_cos[pairs]).abs().mean()) <= 0.1
    assert identical[same_group].float().mean() > 0.2  # the shipped model repeats itself: why merging pays


def test_projection_is_deterministic_by_seed_and_unbiased_by_construction():
    first, again, other = make_projection(300, 40, seed=3), make_projection(300, 40, seed=3), make_projection(300, 40)
    assert torch.equal(first.output, again.output) and torch.equal(first.hidden, again.hidden)
    assert not torch.equal(first.output, other.output)
    assert first.output.shape == (300, 16) and first.hidden.shape == (40, 16) and first.dim == 256
    # scaled orthonormal columns: Rᵀ R = (rows / cols) I, so E[R Rᵀ] = I
    torch.testing.assert_close(first.output.T @ first.output, torch.eye(16) * 300 / 16, atol=1e-3, rtol=1e-4)
    wide = make_projection(8, 4, sketch_dim=64)  # k_o = 8 = V, k_h = 8 > d: exact isometries
    torch.testing.assert_close(wide.output @ wide.output.T, torch.eye(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(wide.hidden @ wide.hidden.T, torch.eye(4), atol=1e-5, rtol=0)


def test_sketch_dim_split():
    assert split_sketch_dim(256) == (16, 16)
    assert split_sketch_dim(512) == (32, 16)
    assert split_sketch_dim(7) == (7, 1)
    with pytest.raises(ValueError, match="sketch_dim"):
        make_projection(10, 10, sketch_dim=0)


def test_hand_computed_top_k_restriction():
    """p = (0.5, 0.3, 0.2), h = (1, 2), identity projections: φ = vec(u hᵀ)."""
    logits = torch.tensor([0.5, 0.3, 0.2]).log().view(1, 1, 3).repeat(1, 2, 1)
    hidden = torch.tensor([[[1.0, 2.0], [1.0, 2.0]]])
    projection = SketchProjection(torch.eye(3), torch.eye(2))
    outside = torch.tensor([[2, 0]])  # token 2 lies outside the top-1 {0}
    only_first = torch.tensor([[True, False]])
    got = lm_head_sketch(hidden, logits, outside, only_first, projection, top_k=1)
    # u = (−0.5, 0, 1 − 0.2) on {0} ∪ {2}
    torch.testing.assert_close(got, torch.tensor([[-0.5, -1.0, 0.0, 0.0, 0.8, 1.6]]))
    inside = torch.tensor([[0, 0]])  # token 0 is the top-1: u = (1 − 0.5, 0, 0)
    torch.testing.assert_close(lm_head_sketch(hidden, logits, inside, only_first, projection, top_k=1),
                               torch.tensor([[0.5, 1.0, 0.0, 0.0, 0.0, 0.0]]))
    # both positions, unrestricted: u_1 = (−0.5, −0.3, 0.8), u_2 = (0.5, −0.3, −0.2), sum (0, −0.6, 0.6)
    torch.testing.assert_close(lm_head_sketch(hidden, logits, outside, torch.ones(1, 2, dtype=torch.bool),
                                              projection, top_k=3),
                               torch.tensor([[0.0, 0.0, -0.6, -1.2, 0.6, 1.2]]))


def reference_sketch(hidden, logits, tokens, mask, projection, top_k):
    """Loop over rollouts and tokens with dense V-sized vectors: the definition, written plainly."""
    rows = []
    for i in range(logits.shape[0]):
        total = torch.zeros(projection.output.shape[1], projection.hidden.shape[1], dtype=torch.float64)
        for t in range(logits.shape[1]):
            if not mask[i, t]:
                continue
            probs = logits[i, t].double().softmax(-1)
            keep = torch.zeros_like(probs, dtype=torch.bool)
            keep[probs.topk(probs.numel() if top_k is None else min(top_k, probs.numel())).indices] = True
            keep[tokens[i, t]] = True
            u = torch.where(keep, -probs, torch.zeros_like(probs))
            u[tokens[i, t]] += 1.0
            total += torch.outer(projection.output.double().T @ u, projection.hidden.double().T @ hidden[i, t].double())
        rows.append(total.flatten())
    return torch.stack(rows).float()


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 4), length=st.integers(1, 6), vocab=st.integers(2, 40), width=st.integers(1, 8),
       top_k=st.one_of(st.none(), st.integers(1, 50)), sketch_dim=st.sampled_from([1, 4, 6, 16]), seed=st.integers(0, 2**16))
def test_vectorised_sketch_matches_reference_loop_and_streaming(batch, length, vocab, width, top_k, sketch_dim, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(batch, length, vocab, generator=generator)
    hidden = torch.randn(batch, length, width, generator=generator)
    tokens = torch.randint(0, vocab, (batch, length), generator=generator)
    mask = torch.rand(batch, length, generator=generator) < 0.7
    projection = make_projection(vocab, width, sketch_dim=sketch_dim, seed=seed)
    batch_sketch = lm_head_sketch(hidden, logits, tokens, mask, projection, top_k=top_k)
    torch.testing.assert_close(batch_sketch, reference_sketch(hidden, logits, tokens, mask, projection, top_k),
                               rtol=1e-4, atol=1e-5)
    sketcher = LmHeadSketcher(batch, projection, top_k=top_k)
    for t in range(length):
        sketcher.update(hidden[:, t], logits[:, t], tokens[:, t], mask[:, t])
    torch.testing.assert_close(sketcher.result(), batch_sketch, rtol=1e-4, atol=1e-5)


def test_top_k_at_vocab_size_is_the_unrestricted_sketch(policy):
    args = (policy["hidden"], policy["logits"].detach(), policy["tokens"], policy["mask"], make_projection(VOCAB, HIDDEN))
    full = lm_head_sketch(*args, top_k=None)
    torch.testing.assert_close(lm_head_sketch(*args, top_k=VOCAB), full)
    torch.testing.assert_close(lm_head_sketch(*args, top_k=VOCAB - 1), full, rtol=1e-3, atol=1e-4)  # top-k path
    torch.testing.assert_close(full, reference_sketch(*args, top_k=VOCAB), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(lm_head_sketch(*args, top_k=8), full, rtol=1e-3, atol=1e-4)


def test_masked_tokens_contribute_nothing(policy):
    hidden, logits, tokens, mask = policy["hidden"], policy["logits"].detach(), policy["tokens"], policy["mask"]
    projection = make_projection(VOCAB, HIDDEN)
    clean = lm_head_sketch(hidden, logits, tokens, mask, projection)
    garbage_logits = torch.where(mask[..., None], logits, torch.full_like(logits, float("nan")))
    garbage_hidden = torch.where(mask[..., None], hidden, torch.full_like(hidden, float("inf")))
    garbage_tokens = torch.where(mask, tokens, torch.full_like(tokens, -100))  # the usual ignore index
    torch.testing.assert_close(lm_head_sketch(garbage_hidden, garbage_logits, garbage_tokens, mask, projection), clean)
    nothing = torch.zeros_like(mask)
    assert torch.equal(lm_head_sketch(hidden, logits, tokens, nothing, projection), torch.zeros(ROLLOUTS, 256))
    # additivity over tokens: the sketch of a rollout is the sum of its per-token sketches
    first_half = mask & (torch.arange(RESPONSE_LEN) < RESPONSE_LEN // 2)
    halves = lm_head_sketch(hidden, logits, tokens, first_half, projection) \
        + lm_head_sketch(hidden, logits, tokens, mask & ~first_half, projection)
    torch.testing.assert_close(halves, clean, rtol=1e-4, atol=1e-5)


def test_streaming_from_hf_generate_outputs_matches_rescored_batch(policy):
    """The recipe the trainer uses: feed LmHeadSketcher from generate(output_logits, output_hidden_states)."""
    model, projection = policy["model"], make_projection(VOCAB, HIDDEN)
    prompts = policy["prompt"].repeat(4, 1)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(5)
        out = model.generate(prompts, max_new_tokens=10, do_sample=True, top_k=0, pad_token_id=0, eos_token_id=None,
                             output_logits=True, output_hidden_states=True, return_dict_in_generate=True)
    tokens = out.sequences[:, PROMPT_LEN:]
    active = torch.arange(10)[None, :] < torch.tensor([[10], [3], [7], [1]])
    sketcher = LmHeadSketcher(4, projection)
    for step, (step_logits, step_hidden) in enumerate(zip(out.logits, out.hidden_states)):
        sketcher.update(step_hidden[-1][:, -1], step_logits, tokens[:, step], active[:, step])
    with torch.no_grad():
        rescored = model(out.sequences, output_hidden_states=True)
    response = slice(PROMPT_LEN - 1, -1)
    batch = lm_head_sketch(rescored.hidden_states[-1][:, response], rescored.logits[:, response], tokens, active,
                           projection)
    torch.testing.assert_close(sketcher.result(), batch, rtol=1e-3, atol=1e-4)


def test_bfloat16_inputs_give_close_float32_sketches(policy):
    args = (policy["tokens"], policy["mask"], make_projection(VOCAB, HIDDEN))
    full = lm_head_sketch(policy["hidden"], policy["logits"].detach(), *args)
    half = lm_head_sketch(policy["hidden"].bfloat16(), policy["logits"].detach().bfloat16(), *args)
    assert half.dtype == torch.float32
    assert pearson(full.flatten(), half.flatten()) > 0.999


def test_shape_and_projection_errors_name_the_problem(policy):
    hidden, logits, tokens, mask = policy["hidden"], policy["logits"].detach(), policy["tokens"], policy["mask"]
    with pytest.raises(ValueError, match="projection is for vocab 100"):
        lm_head_sketch(hidden, logits, tokens, mask, make_projection(100, HIDDEN))
    with pytest.raises(ValueError, match="lm_head_sketch: need hidden"):
        lm_head_sketch(hidden, logits, tokens[:, :3], mask, make_projection(VOCAB, HIDDEN))
    with pytest.raises(ValueError, match="B = 3"):
        LmHeadSketcher(3, make_projection(VOCAB, HIDDEN)).update(hidden[:, 0], logits[:, 0], tokens[:, 0], mask[:, 0])
    with pytest.raises(ValueError, match="top_k must be ≥ 1 or None"):
        lm_head_sketch(hidden, logits, tokens, mask, make_projection(VOCAB, HIDDEN), top_k=0)
    with pytest.raises(ValueError, match="advantages"):
        scale_sketches(torch.ones(4, 8), torch.ones(3))


def test_scale_sketches_hand_values():
    sketches = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    advantages = torch.tensor([2.0, -1.0, 0.0])
    torch.testing.assert_close(scale_sketches(sketches, advantages),
                               torch.tensor([[2.0, 4.0], [-3.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(scale_sketches(sketches, advantages, torch.tensor([4.0, 2.0, 1.0])),
                               torch.tensor([[0.5, 1.0], [-1.5, 0.5], [0.0, 0.0]]))


def test_logprob_sketch_is_the_output_bias_gradient(policy):
    """With identity projections the sketch's inner products equal those of the exact gradient of Σ_t log π(y_t)
    w.r.t. an output bias b (logits + b), which autograd gives; with top-K = V it is that gradient exactly."""
    logits, tokens, mask = policy["logits"].detach(), policy["tokens"], policy["mask"]
    bias = torch.zeros(VOCAB, requires_grad=True)
    logprobs = (logits + bias).log_softmax(-1)
    rows = []
    for i in range(ROLLOUTS):
        objective = (logprobs[i].gather(-1, tokens[i, :, None]).squeeze(-1) * mask[i]).sum()
        rows.append(torch.autograd.grad(objective, bias, retain_graph=True)[0])
    exact = torch.stack(rows)  # (B, V)
    top_logprobs, top_ids = logprobs.detach().topk(VOCAB, dim=-1)
    sketches = logprob_sketch(top_ids, top_logprobs, tokens, mask, identity_projection())
    assert sketches.shape == (ROLLOUTS, VOCAB * HIDDEN)
    torch.testing.assert_close(sketches @ sketches.T, exact @ exact.T, rtol=1e-4, atol=1e-4)
    # vLLM-like top-20 at the default dimension still tracks the exact bias-gradient Gram
    top_logprobs, top_ids = logprobs.detach().topk(20, dim=-1)
    sketches = logprob_sketch(top_ids, top_logprobs, tokens, mask, make_projection(VOCAB, HIDDEN))
    assert sketches.shape == (ROLLOUTS, 256)
    assert pearson(upper(sketches @ sketches.T, 0), upper(exact @ exact.T, 0)) >= 0.9


def test_logprob_sketch_hand_computed_and_masked():
    """V = 4, d = 2, identity projections: φ = Σ_j b_j vec(e_j e_{j mod 2}ᵀ)."""
    projection = SketchProjection(torch.eye(4), torch.eye(2))
    top_ids = torch.tensor([[[1, 2], [0, 3]]])
    top_logprobs = torch.tensor([[[0.6, 0.3], [0.5, 0.5]]]).log()
    tokens = torch.tensor([[3, 0]])
    mask = torch.tensor([[True, False]])
    # b = e_3 − 0.6 e_1 − 0.3 e_2 (token 3 outside the top-2: its probability counts as 0)
    expected = torch.zeros(4, 2)
    expected[3, 1], expected[1, 1], expected[2, 0] = 1.0, -0.6, -0.3
    torch.testing.assert_close(logprob_sketch(top_ids, top_logprobs, tokens, mask, projection), expected.view(1, -1))
    garbage = torch.where(mask[..., None], top_ids, torch.full_like(top_ids, -1))
    torch.testing.assert_close(logprob_sketch(garbage, top_logprobs, tokens, mask, projection), expected.view(1, -1))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 4\)"):
        logprob_sketch(top_ids + 3, top_logprobs, tokens, mask, projection)


def test_lm_head_sketch_from_hidden_is_lm_head_sketch_of_the_heads_logits(monkeypatch):
    """From hidden states and the head's weight and bias, a few positions at a time (the chunk forced small here):
    lm_head_sketch of the logits (W h + b) / temperature."""
    import fastrl_core.algo.sketches as sketches_module
    from fastrl_core.algo.sketches import lm_head_sketch, lm_head_sketch_from_hidden

    generator = torch.Generator().manual_seed(6)
    hidden = torch.randn(3, 7, 12, generator=generator)
    weight, bias = torch.randn(50, 12, generator=generator), torch.randn(50, generator=generator)
    tokens = torch.randint(0, 50, (3, 7), generator=generator)
    mask = torch.rand(3, 7, generator=generator) < 0.8
    projection = make_projection(50, 12, sketch_dim=16, seed=1)
    expected = lm_head_sketch(hidden, (hidden @ weight.T + bias) / 0.7, tokens, mask, projection, top_k=5)
    monkeypatch.setattr(sketches_module, "_CHUNK_ELEMENTS", 3 * 50 * 2)  # 2 positions per chunk
    torch.testing.assert_close(lm_head_sketch_from_hidden(hidden, weight, bias, tokens, mask, projection, top_k=5,
                                                          temperature=0.7), expected, rtol=1e-5, atol=1e-5)


def test_logprob_sketch_dense_and_gathered_give_the_same_sums():
    """The two ways `logprob_sketch` computes (dense b @ M when V <= T·(K + 1), else gathered rows) agree, on a
    vocabulary small enough for the dense way and, through logprob_sketch, one large enough for the gathered."""
    from fastrl_core.algo.sketches import _bias_gradient_sketch, _gathered_sketch

    generator = torch.Generator().manual_seed(4)
    for vocab, length, k in ((40, 8, 5), (500, 3, 2)):
        projection = make_projection(vocab, 16, sketch_dim=64, seed=2)
        ids = torch.randint(0, vocab, (6, length * (k + 1)), generator=generator)
        weights = torch.randn(6, length * (k + 1), generator=generator)
        dense = _bias_gradient_sketch(ids, weights, projection)
        torch.testing.assert_close(dense, _gathered_sketch(ids, weights, projection), rtol=1e-5, atol=1e-5)
        top_ids = ids.view(6, length, k + 1)[..., 1:]
        top_logprobs = -torch.rand(6, length, k, generator=generator)
        tokens, mask = ids.view(6, length, k + 1)[..., 0], torch.rand(6, length, generator=generator) < 0.7
        weights = torch.cat([torch.ones(6, length, 1), -top_logprobs.exp()], -1) * mask[..., None]
        torch.testing.assert_close(logprob_sketch(top_ids, top_logprobs, tokens, mask, projection),
                                   _gathered_sketch(ids, weights.view(6, -1), projection), rtol=1e-5, atol=1e-5)
    assert _bias_gradient_sketch(ids[:0], weights.view(6, -1)[:0], projection).shape == (0, 64)


def exact_jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def test_token_sketch_is_a_deterministic_binary_set_sketch():
    tokens = torch.tensor([[5, 9, 5, 300, 0], [300, 9, 5, 5, 7]])
    mask = torch.tensor([[True, True, True, True, False], [True, True, True, True, False]])
    sketch = token_sketch(tokens, mask)
    assert sketch.shape == (2, 256) and set(sketch.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(sketch[0], sketch[1])  # same set {5, 9, 300}: order and repeats do not matter
    assert int(sketch[0].sum()) <= 3
    assert torch.equal(token_sketch(tokens, mask), sketch)
    assert not torch.equal(token_sketch(tokens, mask, seed=1), sketch)
    assert torch.equal(token_sketch(tokens, torch.zeros_like(mask)), torch.zeros(2, 256))
    assert token_jaccard(token_sketch(tokens, torch.zeros_like(mask)))[0, 1] == 1.0  # two empty sets
    with pytest.raises(ValueError, match="≥ 0"):
        token_sketch(torch.tensor([[-1]]), torch.tensor([[True]]))


def test_token_jaccard_estimate_is_close_to_exact_jaccard():
    generator = torch.Generator().manual_seed(0)
    errors = []
    for _ in range(40):
        shared = torch.randint(0, 2000, (int(torch.randint(0, 40, (), generator=generator)),), generator=generator)
        a = torch.cat([shared, torch.randint(0, 2000, (int(torch.randint(1, 40, (), generator=generator)),),
                                             generator=generator)])
        b = torch.cat([shared, torch.randint(0, 2000, (int(torch.randint(1, 40, (), generator=generator)),),
                                             generator=generator)])
        length = max(len(a), len(b))
        tokens = torch.zeros(2, length, dtype=torch.long)
        mask = torch.zeros(2, length, dtype=torch.bool)
        tokens[0, :len(a)], tokens[1, :len(b)], mask[0, :len(a)], mask[1, :len(b)] = a, b, True, True
        estimate = float(token_jaccard(token_sketch(tokens, mask))[0, 1])
        errors.append(abs(estimate - exact_jaccard(set(a.tolist()), set(b.tolist()))))
    assert sum(errors) / len(errors) < 0.05 and max(errors) < 0.2


def test_registry_names():
    assert SKETCHES.names() == ["lm_head", "logprob", "tokens"]
    assert SKETCHES.get("lm_head") is lm_head_sketch and SKETCHES.get("tokens") is token_sketch
    assert math.isclose(float(token_jaccard(torch.ones(1, 8))[0, 0]), 1.0)
