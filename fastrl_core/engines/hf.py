"""Rollout engine on HF `generate` (CPU or GPU): sampled tokens, behaviour log-probs and lm_head sketches in one pass,
and the re-scoring forward the trainer runs for the policy, old and reference log-probs.

Works with Qwen-VL-family models (Qwen2-VL, Qwen2.5-VL: pixel patches + `image_grid_thw` + 3-D mRoPE), the
embedded tiny one included. Each distinct prompt's image is encoded ONCE per call and its visual embeddings are shared by all of that prompt's
rollouts: the vision tower runs on the P prompt images, and the N-row batch gets them through transformers'
`mm_encoder_outputs` (pre-encoded image features, one entry per row, rows of a prompt pointing at the same
tensor), with `image_grid_thw` / `mm_token_type_ids` expanded so the 3-D mRoPE positions are the usual ones.
`share_images=False` is the naive path (pixels repeated per rollout), kept to check and measure the saving; it is
also what runs on a transformers whose model forward has no `mm_encoder_outputs` (5.17 has none; 5.23 has it),
with the same numbers, only slower (`accepts_encoder_outputs`). Each distinct prompt also goes through
the decoder ONCE (`share_prompts`): its KV cache is computed on P rows and gathered to the N rows that continue it,
in generate (as vLLM's prefix caching does) and in the scoring passes and the update (the shared-prefix forward of
Prefix Grouper, Liu et al. 2025, arXiv 2506.05433: exact, gradients summed through the gather). The embedded
regime's prompts are ~80 tokens against ~16 sampled, so on 16 x 8 rollouts this takes a third off generate and
~60 % off a scoring forward + backward (benchmarks/bench_engine.py).

Randomness: HF sampling draws from torch's global RNG. `generate` seeds it from the passed generator (one int64
draw) inside `torch.random.fork_rng`, so a generator in a given state gives the same rollouts and the caller's
global RNG is left untouched.

Log-probs and sketches use the model's own distribution, softmax(raw logits) (the lm_head's output, before
temperature and the vision-token suppression), so `behaviour_logprobs` equal a fresh forward's log π(y_t) for any
temperature; at temperature 1 that is also the sampling distribution (up to the suppressed vision tokens' mass).
They are computed while generate runs, one decoding step at a time, and the step's logits are dropped
(`_StepRecorder`): generate is asked for no logits and no hidden states.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.modeling_outputs import BaseModelOutputWithPooling

from fastrl_core.engines.base import Rollouts
from fastrl_core.engines.logprobs import chunked_token_logprobs
from fastrl_core.policy import Policy, load_image


@dataclass
class PromptBatch:
    """The processor's output for P prompts (left-padded), images kept per prompt."""

    input_ids: Tensor  # (P, L)
    attention_mask: Tensor  # (P, L)
    mm_token_type_ids: Tensor  # (P, L): 0 text, 1 image
    pixel_values: list[Tensor]  # P x (patches_p, C·t·p·p)
    image_grid_thw: Tensor  # (P, 3)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def _first_true_inclusive_mask(is_end: Tensor) -> Tensor:
    """(N, T) bool: True up to and including the first True of `is_end` in each row (all True if none)."""
    ends_before = torch.cumsum(is_end.long(), dim=1) - is_end.long()  # EOS count strictly before t
    return ends_before == 0


class _StepRecorder(StoppingCriteria):
    """Behaviour log-probs and lm_head sketches streamed out of HF `generate`, one decoding step at a time.

    How: a forward hook on the output embedding (lm_head) keeps the input h (N, d) and output z (N, V) at the last
    position of each forward (prefill computes only that position's logits: generate passes `logits_to_keep=1`;
    a model without it gives (N, L, V) there, of which the last position is the one used; with chunked prefill the
    last chunk's call is the one kept). HF then samples y from z and appends it to `input_ids`, and calls its
    stopping criteria with the new `input_ids` in the same step: this criterion (which never stops anything) reads
    y = input_ids[:, -1], adds log_softmax(z)[y] to the (N, T) log-probs and (h, z, y) to the `LmHeadSketcher`,
    then drops h and z. Rows count up to and including their first EOS (`eos_ids`); later steps (HF's pad tokens)
    contribute 0 log-prob and nothing to the sketch. Steps HF runs and then undoes (its deferred stop check, MPS
    only) come after every row has ended, so they contribute nothing; `logprobs(T)` keeps the first T.

    Why not the alternatives: `output_logits` / `output_hidden_states` keep every step's (N, V) logits and every
    layer's (N, d) states until generate returns; a LogitsProcessor sees the logits but not the hidden state, and
    only after HF's own processors if it is not first; an own decode loop would have to re-implement Qwen-VL's
    mRoPE positions, cache and sampling to stay bit-identical to generate. Generation itself is unchanged (same
    forwards, same RNG draws), so the sampled tokens are those of a plain `generate` call.

    Memory: O(N·V) per step, transient (this step's logits, HF's float32 copy and its sampling scores, and the
    log-softmax here) + O(N·D) sketch accumulator + O(N·T) log-probs; never (N, T, V).
    Do not give this class an `eos_token_id` attribute: HF treats any criterion that has one as its EOS check."""

    def __init__(self, lm_head: torch.nn.Module, batch_size: int, eos_ids: Sequence[int], sketcher=None) -> None:
        self.device = lm_head.weight.device
        self.eos_ids = torch.tensor(list(eos_ids), device=self.device)
        self.sketcher = sketcher  # LmHeadSketcher on `device`, or None
        self._steps: list[Tensor] = []  # T x (N,) log π(y_t), 0 where masked
        self._ended = torch.zeros(batch_size, dtype=torch.bool, device=self.device)
        self._hidden: Tensor | None = None  # (N, d) this step's lm_head input
        self._logits: Tensor | None = None  # (N, V) this step's raw logits
        self._handle = lm_head.register_forward_hook(self._capture)

    def _capture(self, module, inputs, output) -> None:
        self._hidden, self._logits = inputs[0][:, -1], output[:, -1]

    def __call__(self, input_ids: Tensor, scores, **kwargs) -> Tensor:
        if self._logits is None:
            raise RuntimeError("HFEngine: a decoding step ran without calling the model's output embedding (lm_head);"
                               " the streamed log-probs need its forward hook")
        tokens = input_ids[:, -1].to(self.device)  # (N,) the token sampled from this step's logits
        active = ~self._ended
        logprobs = torch.log_softmax(self._logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        self._steps.append(torch.where(active, logprobs, torch.zeros_like(logprobs)))
        if self.sketcher is not None:
            self.sketcher.update(self._hidden, self._logits, tokens, active)
        self._ended |= torch.isin(tokens, self.eos_ids)
        self._hidden = self._logits = None
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def logprobs(self, length: int) -> Tensor:
        """(N, length) float32 log π(y_t) of the first `length` steps, 0 where masked."""
        if len(self._steps) < length:
            raise RuntimeError(f"HFEngine: recorded {len(self._steps)} decoding steps for {length} generated tokens")
        return torch.stack(self._steps[:length], dim=1) if length else torch.zeros(len(self._ended), 0)

    def remove(self) -> None:
        self._handle.remove()


def decoder(model):
    """The model without its lm_head (`model.model`: hidden states in, as `model.forward` computes them before its
    head). Refused for heads that do more than `lm_head(h)` (logit soft-capping or scaling), which
    `engines.logprobs` would leave out."""
    text = model.config.get_text_config()
    for key in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(text, key, None) not in (None, 1, 1.0):
            raise ValueError(f"HFEngine scores log-probs as log_softmax(lm_head(h)); {type(model).__name__} sets "
                             f"{key}={getattr(text, key)}, which that leaves out")
    return model.model


def _checkpointing(model) -> bool:
    """Whether `model` runs with activation (gradient) checkpointing (the property's newer name first)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if isinstance(getattr(type(model), name, None), property):
            return bool(getattr(model, name))
    return False


def accepts_encoder_outputs(model) -> bool:
    """Whether `model.forward` takes pre-encoded image features (`mm_encoder_outputs`, transformers >= 5.20 or so)."""
    return "mm_encoder_outputs" in inspect.signature(model.forward).parameters


class HFEngine:
    """Samples rollouts with `policy.model.generate` and re-scores them with a forward pass.

    `sketch_projection`: a `SketchProjection` to accumulate lm_head sketches during generation (None: no sketches);
    `sketch_top_k`: vocabulary entries per token in the sketch (None: the whole vocabulary);
    `share_images` / `share_prompts`: encode each prompt's image / run each prompt through the decoder once for all of
    its rows, in generate and in the scoring passes (off: once per row, the naive path, kept to check and measure
    both savings; `share_prompts` needs a Qwen-VL decoder's mRoPE offsets, `rope_deltas`)."""

    def __init__(
        self,
        policy: Policy,
        *,
        template: str = "math",
        max_new_tokens: int = 32,
        temperature: float = 1.0,
        sketch_projection=None,
        sketch_top_k: int | None = 64,
        share_images: bool = True,
        share_prompts: bool = True,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use `greedy` for argmax decoding), got {temperature}")
        self.policy = policy
        self.template = template
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.sketch_projection = sketch_projection
        self.sketch_top_k = sketch_top_k
        self.share_images = share_images and accepts_encoder_outputs(policy.model)
        self.share_prompts = share_prompts and hasattr(decoder(policy.model), "rope_deltas")
        self._cached: tuple[tuple[str, ...], PromptBatch] | None = None
        config = policy.model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else policy.eos_token_id
        self.eos_token_ids = sorted({*(eos if isinstance(eos, list) else [eos]), policy.eos_token_id})
        pad = config.pad_token_id if config.pad_token_id is not None else policy.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])

    # ---- prompts and images -------------------------------------------------------------------------------------

    def prompt_batch(self, problems: Sequence) -> PromptBatch:
        """Tokenised prompts + pixels for `problems` (the last call's result is reused for the same problem ids)."""
        key = (self.template, *(problem.id for problem in problems))
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        processor = self.policy.processor
        texts = [self.policy.chat_prompt(problem, self.template) for problem in problems]
        images = [load_image(problem.image_path) for problem in problems]  # clear error naming a missing file
        processor.tokenizer.padding_side = "left"
        encoded = processor(text=texts, images=images, padding=True, return_tensors="pt")
        if "image_grid_thw" not in encoded or "mm_token_type_ids" not in encoded:
            raise ValueError(
                f"HFEngine needs a Qwen-VL-style processor (pixel patches + image_grid_thw + mm_token_type_ids); "
                f"{type(processor).__name__} returned {sorted(encoded)}"
            )
        grid = encoded["image_grid_thw"]
        patches = grid.prod(dim=-1).tolist()
        batch = PromptBatch(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            mm_token_type_ids=encoded["mm_token_type_ids"],
            pixel_values=list(torch.split(encoded["pixel_values"], patches)),
            image_grid_thw=grid,
        )
        self._cached = (key, batch)
        return batch

    def _vision_inputs(self, model, prompts: PromptBatch, prompt_index: Tensor) -> dict:
        """Image inputs for rows `prompt_index` (N,): the vision tower runs once per distinct prompt (shared path)
        or once per row (naive path). Runs with grad if grad is enabled."""
        grid = prompts.image_grid_thw[prompt_index]  # (N, 3)
        if not self.share_images:
            pixels = torch.cat([prompts.pixel_values[i] for i in prompt_index.tolist()])
            return {"pixel_values": pixels.to(model.device), "image_grid_thw": grid.to(model.device)}
        distinct, row_to_distinct = torch.unique(prompt_index, return_inverse=True)
        pixels = torch.cat([prompts.pixel_values[i] for i in distinct.tolist()]).to(model.device)
        features = model.get_image_features(pixels, prompts.image_grid_thw[distinct].to(model.device))
        per_prompt = features.pooler_output  # tuple of (tokens_p, hidden), one per distinct prompt
        per_row = [per_prompt[j] for j in row_to_distinct.tolist()]
        return {
            "image_grid_thw": grid.to(model.device),
            "mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=per_row)},
        }

    # ---- sampling -----------------------------------------------------------------------------------------------

    def _generation_config(self, *, do_sample: bool, max_new_tokens: int, **outputs) -> GenerationConfig:
        """A fresh config (a real checkpoint's top_k / top_p / repetition penalty would change the distribution)."""
        sampling = dict(temperature=self.temperature, top_k=0, top_p=1.0) if do_sample else {}
        return GenerationConfig(
            do_sample=do_sample,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            suppress_tokens=list(self.policy.suppress_token_ids) or None,
            use_cache=True,
            **sampling,
            **outputs,
        )

    def _run_generate(self, prompts: PromptBatch, prompt_index: Tensor, config: GenerationConfig, **generate_kwargs):
        """`model.generate` on rows `prompt_index` (N,) of `prompts`. With `share_prompts` and a prompt on several
        rows, each distinct prompt but its last token is prefilled once (`_shared_prompts`) and generate continues
        every row from that cache: it runs the last prompt token (always text, as the template ends with the
        assistant header) and decodes from there, as vLLM's prefix caching would. Else every row is prefilled."""
        model = self.policy.model
        rows = dict(
            input_ids=prompts.input_ids[prompt_index].to(model.device),
            attention_mask=prompts.attention_mask[prompt_index].to(model.device),
        )
        with torch.no_grad():
            if self._shares(model, prompt_index):
                if prompts.mm_token_type_ids[:, -1].any():
                    raise ValueError("HFEngine: a shared prefill needs prompts that end in a text token")
                _, rows["past_key_values"] = self._shared_prompts(model, prompts, prompt_index, drop_last=True)
            else:
                rows["mm_token_type_ids"] = prompts.mm_token_type_ids[prompt_index].to(model.device)
                rows |= self._vision_inputs(model, prompts, prompt_index)
            return model.generate(**rows, generation_config=config, **generate_kwargs)

    def _shares(self, model, prompt_index: Tensor) -> bool:
        """Whether rows `prompt_index` go through a shared prompt: sharing is on, some prompt has several rows, and
        `model` keeps a KV cache (HF drops it under gradient checkpointing)."""
        return (self.share_prompts and not _checkpointing(model)
                and len(torch.unique(prompt_index)) < len(prompt_index))

    def _shared_prompts(self, model, prompts: PromptBatch, prompt_index: Tensor, *, drop_last: bool):
        """Each distinct prompt of `prompt_index` (N,) through `model`'s decoder once (with grad if enabled), its
        KV cache then gathered to the N rows (rows of a prompt share its keys and values, and autograd sums their
        gradients back into the one prompt forward). The decoder's mRoPE offsets (`rope_deltas`, (P, 1) from the
        forward) are gathered alike: text positions after the prompt are the attended-token count + the offset,
        which is how HF's generate continues a cached multimodal prompt (Qwen2.5-VL
        `_prepare_position_ids_for_generation`). `drop_last`: leave each prompt's last token out (generate needs
        one uncached token). Returns the prompts' last hidden state gathered to rows, (N, H), and the cache."""
        distinct, row_to_distinct = torch.unique(prompt_index, return_inverse=True)
        end = prompts.input_ids.shape[1] - int(drop_last)
        inner = decoder(model)
        inputs = {
            key: getattr(prompts, key)[distinct][:, :end].to(model.device)
            for key in ("input_ids", "attention_mask", "mm_token_type_ids")
        }
        inputs |= self._vision_inputs(model, prompts, distinct)
        out = inner(**inputs, use_cache=True)  # per layer: keys / values (P, kv_heads, end, head_dim)
        rows = row_to_distinct.to(model.device)
        out.past_key_values.batch_select_indices(rows)  # -> (N, kv_heads, end, head_dim)
        inner.rope_deltas = inner.rope_deltas[rows]
        return out.last_hidden_state[rows, -1], out.past_key_values

    def generate(
        self,
        problems: Sequence,
        rollouts_per_prompt: Sequence[int],
        *,
        generator: torch.Generator | None = None,
    ) -> Rollouts:
        """Sample `rollouts_per_prompt[p]` completions of each problem p (counts may differ, 0 allowed).

        Behaviour log-probs and sketches are streamed out of generate step by step (`_StepRecorder`): memory
        O(N·V) per step, transient + O(N·D) sketch accumulator + O(N·T) log-probs (N rollouts, T steps, V vocabulary,
        D sketch dim), besides the model's own KV cache; no (N, T, V) logits and no per-layer hidden states."""
        if len(rollouts_per_prompt) != len(problems):
            raise ValueError(f"rollouts_per_prompt has {len(rollouts_per_prompt)} entries for {len(problems)} problems")
        counts = torch.as_tensor(list(rollouts_per_prompt), dtype=torch.long)
        if (counts < 0).any():
            raise ValueError(f"rollouts_per_prompt must be >= 0, got {counts.tolist()}")
        prompt_index = torch.repeat_interleave(torch.arange(len(problems)), counts)  # (N,)
        if prompt_index.numel() == 0:
            empty = torch.zeros(0, 0)
            return Rollouts(prompt_index, empty.long(), empty.bool(), [], empty, None)
        prompts = self.prompt_batch(problems)
        recorder = self._step_recorder(len(prompt_index))
        config = self._generation_config(do_sample=True, max_new_tokens=self.max_new_tokens)
        seed = int(torch.randint(0, 2**63 - 1, (), generator=generator))
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                sequences = self._run_generate(
                    prompts, prompt_index, config, stopping_criteria=StoppingCriteriaList([recorder])
                )
        finally:
            recorder.remove()
        prompt_length = prompts.input_ids.shape[1]
        completion_ids = sequences[:, prompt_length:].cpu()  # (N, T)
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids))
        completion_mask = _first_true_inclusive_mask(is_eos)
        completion_ids = completion_ids.masked_fill(~completion_mask, self.pad_token_id)
        sketcher = recorder.sketcher
        return Rollouts(
            prompt_index=prompt_index,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            completion_text=self.decode(completion_ids, completion_mask),
            behaviour_logprobs=recorder.logprobs(completion_ids.shape[1]).cpu(),
            sketches=None if sketcher is None else sketcher.result().cpu(),
        )

    def _step_recorder(self, batch_size: int) -> _StepRecorder:
        """A `_StepRecorder` hooked on the policy's lm_head, with an `LmHeadSketcher` (on the lm_head's device) if
        the engine has a sketch projection."""
        lm_head = self.policy.model.get_output_embeddings()
        sketcher = None
        if self.sketch_projection is not None:
            from fastrl_core.algo.sketches import LmHeadSketcher

            sketcher = LmHeadSketcher(batch_size, self.sketch_projection, top_k=self.sketch_top_k,
                                      device=lm_head.weight.device)
        return _StepRecorder(lm_head, batch_size, self.eos_token_ids, sketcher)

    def decode(self, completion_ids: Tensor, completion_mask: Tensor) -> list[str]:
        """Texts of the masked completions, special tokens dropped, and ids the tokenizer does not have
        (>= len(tokenizer): the padding rows of a model's unembedding, e.g. Qwen2.5-VL's 151,936 rows for a
        151,665-entry tokenizer, which a random or barely trained model can sample) dropped too. `tokenizers`
        would drop them silently as well (checked: decode([50, 150000]) == decode([50]) with 0.23); filtering here
        makes it explicit and independent of that version."""
        tokenizer = self.policy.tokenizer
        known = completion_ids < len(tokenizer)
        rows = [ids[keep].tolist() for ids, keep in zip(completion_ids, completion_mask.bool() & known)]
        return tokenizer.batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def greedy(self, problems: Sequence, *, batch_size: int = 64) -> list[str]:
        """Argmax-decoded completion text for each problem, in batches of `batch_size` prompts."""
        texts: list[str] = []
        config = self._generation_config(do_sample=False, max_new_tokens=self.max_new_tokens)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            prompts = self.prompt_batch(chunk)
            sequences = self._run_generate(prompts, torch.arange(len(chunk)), config)
            ids = sequences[:, prompts.input_ids.shape[1] :].cpu()
            mask = _first_true_inclusive_mask(torch.isin(ids, torch.tensor(self.eos_token_ids)))
            texts += self.decode(ids, mask)
        return texts

    def sync_weights(self, model) -> None:
        """Nothing to copy: this engine samples with `policy.model`, the trainer's own model (engines.base)."""

    # ---- re-scoring ---------------------------------------------------------------------------------------------

    def token_logprobs(self, model, problems: Sequence, rollouts: Rollouts, index: Tensor) -> Tensor:
        """log `model`(y_t | prompt, y_<t) for rollouts[index]: (n, T) float32, 0 where masked, with grad if enabled."""
        index = torch.as_tensor(index, dtype=torch.long)
        return self.sequence_logprobs(
            model,
            self.prompt_batch(problems),
            rollouts.prompt_index[index],
            rollouts.completion_ids[index],
            rollouts.completion_mask[index],
        )

    def sequence_logprobs(
        self, model, prompts: PromptBatch, prompt_index: Tensor, completion_ids: Tensor, completion_mask: Tensor
    ) -> Tensor:
        """log `model`(y_t | prompt, y_<t) of completions (n, T) after prompts `prompt_index` (n,): (n, T) float32,
        0 where masked, with grad if grad is enabled.

        The decoder's hidden states at the positions predicting y_0..y_T'-1 (`_completion_hidden`), then the
        lm_head on the completion tokens only, a chunk of positions at a time (`engines.logprobs`): never the
        (n, T, V) logits."""
        full_length = completion_ids.shape[1]
        length = int(completion_mask.sum(dim=1).max()) if len(prompt_index) else 0  # trim the all-pad tail
        completion_ids, completion_mask = completion_ids[:, :length], completion_mask[:, :length].bool()
        device = model.device
        hidden = self._completion_hidden(model, prompts, prompt_index, completion_ids, completion_mask)
        mask = completion_mask.to(device)
        head = model.get_output_embeddings()
        token_logprobs = torch.zeros(mask.shape, dtype=torch.float32, device=device)
        token_logprobs = token_logprobs.masked_scatter(mask, chunked_token_logprobs(
            hidden[mask], head.weight, head.bias, completion_ids.to(device)[mask]))
        return torch.nn.functional.pad(token_logprobs, (0, full_length - length))

    def _completion_hidden(self, model, prompts: PromptBatch, prompt_index: Tensor, completion_ids: Tensor,
                           completion_mask: Tensor) -> Tensor:
        """(n, T, H): the decoder's last hidden states at the positions predicting completion tokens 0..T-1.

        Shared (`share_prompts`, a prompt on several rows): each prompt once (`_shared_prompts`), then the
        completions alone on its gathered cache, at text positions after the prompt (completion tokens are text:
        mRoPE's three components equal, the attended-token count + the prompt's offset). Same values and
        gradients as the per-row forward up to float rounding (tests/test_engine.py); on the embedded regime's
        ~80-token prompts and ~16-token completions, 16 x 8 rollouts, ~2.4x less time (benchmarks/bench_engine.py).
        Per row: one forward over prompt + completion (`mm_token_type_ids` extended with zeros, docs/notes.md §2)."""
        device, inner = model.device, decoder(model)
        attention_mask = torch.cat([prompts.attention_mask[prompt_index], completion_mask.long()], dim=1).to(device)
        length = completion_ids.shape[1]
        if length and self._shares(model, prompt_index):
            last_prompt_hidden, cache = self._shared_prompts(model, prompts, prompt_index, drop_last=False)
            offsets = inner.rope_deltas  # (n, 1): gathered to the rows by `_shared_prompts`
            positions = (attention_mask.cumsum(-1) - 1)[:, attention_mask.shape[1] - length:] + offsets  # (n, T)
            completion_hidden = inner(
                input_ids=completion_ids.to(device), attention_mask=attention_mask, past_key_values=cache,
                position_ids=positions[None].expand(3, -1, -1), use_cache=True,
            ).last_hidden_state  # (n, T, H): position t predicts y_t+1
            return torch.cat([last_prompt_hidden[:, None], completion_hidden[:, :-1]], dim=1)
        input_ids = torch.cat([prompts.input_ids[prompt_index], completion_ids], dim=1)
        mm_token_type_ids = torch.cat(
            [prompts.mm_token_type_ids[prompt_index], torch.zeros_like(completion_ids)], dim=1
        )
        inputs = dict(input_ids=input_ids.to(device), attention_mask=attention_mask,
                      mm_token_type_ids=mm_token_type_ids.to(device))
        inputs |= self._vision_inputs(model, prompts, prompt_index)
        hidden = inner(**inputs, use_cache=False).last_hidden_state  # (n, L, H)
        return hidden[:, hidden.shape[1] - length - 1 : -1]
