"""What the lm_head gradient sketch costs on top of the pass it rides on (issue 2, "Speed": target < 5 %).

    .venv/bin/python benchmarks/bench_sketch.py            # 2 threads, both models, batch 8 / 32 / 128
    .venv/bin/python benchmarks/bench_sketch.py --quick    # fewer repeats

Models (random init; timing does not depend on the weights): the tiny Qwen2 of tests/test_sketches.py (V 512, d 64)
and a text config the size of the project's tiny Qwen2.5-VL (docs/notes.md §2: hidden 128, 2 layers, 4 / 2 heads,
intermediate 256, vocab 1,100). Prompt 52 tokens + 32 generated = 84 tokens per rollout.

(a) forward(output_hidden_states=True) over the 84 tokens vs the same + `lm_head_sketch` over the 32 response
    positions (what a trainer sketches; sketching all 84 costs 84/32 as much).
(b) HF generate(32 new tokens, output_logits / output_hidden_states / return_dict_in_generate) vs the same +
    sketching its outputs after it returns, two ways:
      stream  `LmHeadSketcher.update` once per step from outputs.logits[s], outputs.hidden_states[s][-1][:, -1]
              (what a custom decoding loop that does not keep the logits would do);
      stack   one `lm_head_sketch` over the stacked (B, 32, V) step logits that generate already kept.
    A LogitsProcessor is not used: it sees the logits but not the hidden states.

Two sketch settings: top-K 64 (the default) and unrestricted (top_k=None: a softmax and one (N, V) @ (V, 16)
product instead of torch's CPU top-k, which costs ~10 µs a row and dominates at these sizes).
Each row alternates base and base+sketch runs; "ratio" = best(base + sketch) / best(base) measured side by side,
"added" = best(sketch alone on the same outputs) / best(base), the less noisy figure. Best = minimum over repeats
(timeit's advice: on a shared machine noise only ever adds time). On a busy 2-core machine 2 threads mostly measure
contention: pass --threads 1 there.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from fastrl_core.algo.sketches import LmHeadSketcher, lm_head_sketch, make_projection

PROMPT_LEN, NEW_TOKENS = 52, 32
MODELS = {
    "tiny-qwen2 (fidelity test)": dict(vocab_size=512, hidden_size=64, intermediate_size=128),
    "qwen2.5-vl-tiny text": dict(vocab_size=1100, hidden_size=128, intermediate_size=256),
}


def build(sizes: dict) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         **sizes)
    return Qwen2ForCausalLM(config).eval()


def clock(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(base, sketches: list, repeats: int) -> tuple[float, list[float], list[float]]:
    """Minimum times of base(), base() + sketch(output) and sketch(output) alone for each sketch; interleaved."""
    output = base()
    for sketch in sketches:
        sketch(output)  # warm-up
    plain, combined, alone = [], [[] for _ in sketches], [[] for _ in sketches]
    for _ in range(repeats):
        plain.append(clock(base))
        for i, sketch in enumerate(sketches):
            combined[i].append(clock(lambda: sketch(base())))
            alone[i].append(clock(lambda: sketch(output)))
    return min(plain), [min(c) for c in combined], [min(a) for a in alone]


def stream(outputs, projection, top_k) -> torch.Tensor:
    batch = outputs.sequences.shape[0]
    tokens = outputs.sequences[:, -NEW_TOKENS:]
    active = torch.ones(batch, dtype=torch.bool)
    sketcher = LmHeadSketcher(batch, projection, top_k=top_k)
    for step, (logits, hidden) in enumerate(zip(outputs.logits, outputs.hidden_states)):
        sketcher.update(hidden[-1][:, -1], logits, tokens[:, step], active)
    return sketcher.result()


def stack(outputs, projection, top_k) -> torch.Tensor:
    logits = torch.stack(outputs.logits, dim=1)  # (B, 32, V)
    hidden = torch.stack([h[-1][:, -1] for h in outputs.hidden_states], dim=1)  # (B, 32, d)
    tokens = outputs.sequences[:, -NEW_TOKENS:]
    return lm_head_sketch(hidden, logits, tokens, torch.ones_like(tokens, dtype=torch.bool), projection, top_k=top_k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, prompt {PROMPT_LEN} + {NEW_TOKENS} new tokens, "
          f"sketch D 256 (16 x 16); times are minima over repeats, in ms")
    header = (f"{'model':26} {'pass':15} {'B':>4} {'base':>7} | {'top-64: ratio':>13} {'added':>6} "
              f"| {'unrestricted: ratio':>19} {'added':>6}")
    print(header)
    print("-" * len(header))
    for name, sizes in MODELS.items():
        model = build(sizes)
        projection = make_projection(sizes["vocab_size"], sizes["hidden_size"])
        for batch in args.batches:
            generator = torch.Generator().manual_seed(batch)
            prompts = torch.randint(0, sizes["vocab_size"], (batch, PROMPT_LEN), generator=generator)
            sequences = torch.randint(0, sizes["vocab_size"], (batch, PROMPT_LEN + NEW_TOKENS), generator=generator)
            response = slice(PROMPT_LEN - 1, -1)  # positions whose logits score the response tokens
            tokens = sequences[:, PROMPT_LEN:]
            mask = torch.ones_like(tokens, dtype=torch.bool)
            repeats = (3 if args.quick else 9) if batch <= 32 else (2 if args.quick else 5)

            def forward():
                return model(sequences, output_hidden_states=True)

            def forward_sketch(out, top_k):
                return lm_head_sketch(out.hidden_states[-1][:, response], out.logits[:, response], tokens, mask,
                                      projection, top_k=top_k)

            def generate():
                return model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=NEW_TOKENS,
                                      min_new_tokens=NEW_TOKENS, do_sample=True, top_k=0, pad_token_id=0,
                                      eos_token_id=None, output_logits=True, output_hidden_states=True,
                                      return_dict_in_generate=True)

            cells = [("forward", forward, forward_sketch),
                     ("generate+stream", generate, lambda out, top_k: stream(out, projection, top_k)),
                     ("generate+stack", generate, lambda out, top_k: stack(out, projection, top_k))]
            for label, base, sketch in cells:
                variants = [lambda out, k=top_k, f=sketch: f(out, k) for top_k in (64, None)]
                with torch.no_grad():
                    plain, combined, alone = side_by_side(base, variants, repeats)
                cols = " | ".join(f"{c / plain:{w}.3f} {a / plain:6.1%}" for c, a, w in zip(combined, alone, (13, 19)))
                print(f"{name:26} {label:15} {batch:>4} {plain * 1e3:7.1f} | {cols}", flush=True)


if __name__ == "__main__":
    main()
