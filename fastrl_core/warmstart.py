"""Supervised warm start of the embedded tiny VLM: the checkpoint shipped in `fastrl_core/models/embedded/`.

    python -m fastrl_core.warmstart --out DIR        (also: fastrl warmstart --out DIR; default: the shipped folder)
    fastrl warmstart --preset wide                   (a named recipe, built once into the user cache: named_models.main)

Real GRPO starts from an instruct model; a random-init tiny policy under GRPO learns the format and collapses to one
answer (docs/notes.md §2). So, deterministically by seed:
1. generate the synthetic task (`ensure_dataset`), train a byte-level BPE tokenizer on its text (questions under
   every template, targets, choices) and build a Qwen2.5-VL of the named `widths` (`fastrl_core.policy.build_vlm`;
   `tiny` for the shipped one). `tokenizer=embedded` takes the shipped warm start's tokenizer and processor instead,
   so a wider model reads and writes exactly the tokens the shipped one does;
2. supervised training on the TRAIN split, targets `<think> I look at the figure. </think> \\boxed{A}` (the
   template's answer style; the answer as the problem states it: a number, or the option letter), token-mean
   cross-entropy on the target tokens only, through the same forward as RL (`HFEngine.sequence_logprobs`);
3. every `eval_every` steps: greedy accuracy + format rate on the TEST split, and accuracy of one sample per problem
   at temperature 1 (how much probability the policy puts on right answers: GRPO only sharpens what the warm start
   half-knows, docs/notes.md §2);
4. keep the checkpoint with the highest sampled accuracy among those with greedy accuracy in [band_low, band_high]
   and format rate >= min_format (room left for RL), stop once greedy accuracy has been above the band twice;
5. save it (safetensors + tokenizer + processor config) with `warmstart.json`: arguments, the step chosen, its
   figures, the evaluation history, and the fraction of 16 test prompts x 8 samples whose rewards differ (the RL
   signal).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from typing import TYPE_CHECKING

import torch

from fastrl_core.config import option
from fastrl_core.shipped import EMBEDDED_MODEL

if TYPE_CHECKING:  # transformers loads in the functions that need it: named_models reads WarmstartArgs cheaply
    from fastrl_core.engines.base import Engine
    from fastrl_core.policy import Policy

THINK = "I look at the figure."
TOKENIZERS = ("train", "embedded")


@dataclass
class WarmstartArgs:
    out: str = option(str(EMBEDDED_MODEL), "where the chosen checkpoint is saved (default: the shipped one)")
    data_dir: str = option("runs/data", "cache folder of the synthetic dataset")
    n_train: int = option(2048, "synthetic train problems")
    n_test: int = option(256, "synthetic test problems")
    data_seed: int = option(0, "seed of the synthetic dataset")
    kinds: str = option("", "comma-separated synthetic task kinds to train on, e.g. count_dots,longest_segment "
                            "('' = every kind; the training config's synthetic_kinds)")
    levels: str = option("", "comma-separated synthetic difficulty levels, e.g. 1,2 ('' = every level)")
    seed: int = option(0, "model init and batch order")
    widths: str = option("tiny", "model size, a name in fastrl_core.policy.WIDTHS (tiny: text hidden 128, 2 layers, "
                                 "the shipped model; wide: hidden 512, 4 layers)")
    tokenizer: str = option("train", "'train': a BPE trained on the task's text (vocab_size entries; the shipped "
                                     "model's); 'embedded': the shipped warm start's tokenizer and processor")
    template: str = option("math", "prompt template the warm start is trained on")
    vocab_size: int = option(1024, "BPE vocabulary incl. special tokens (tokenizer=train)")
    batch_size: int = option(32, "problems per SFT step")
    lr: float = option(1e-3, "AdamW learning rate (constant after warmup)")
    warmup_steps: int = option(10, "linear lr warmup")
    max_steps: int = option(600, "SFT steps at most")
    eval_every: int = option(25, "steps between evaluations on the test split")
    band_low: float = option(0.25, "lowest greedy test accuracy a chosen checkpoint may have")
    band_high: float = option(0.50, "highest greedy test accuracy a chosen checkpoint may have (>= 15 points left for RL)")
    min_format: float = option(0.90, "lowest format rate a chosen checkpoint may have")
    max_new_tokens: int = option(32, "completion length at evaluation")
    threads: int = option(2, "torch threads (2-core machines: more is slower)")


def target_text(problem, answer_style: str) -> str:
    """The supervised completion for `problem` (without EOS): short think block, then the answer."""
    answer = problem.answer
    final = f"\\boxed{{{answer}}}" if answer_style == "boxed" else f"<answer>{answer}</answer>"
    return f"<think> {THINK} </think> {final}"


def tokenizer_corpus(problems, templates) -> list[str]:
    """Every text the policy reads or writes on this task, in a fixed order: prompts under each template, both
    target styles, the answers and choices."""
    from fastrl_core.data.templates import render_prompt

    texts: list[str] = []
    for problem in problems:
        for name, template in templates.items():
            texts.append(render_prompt(problem, name))
        texts.append(target_text(problem, "boxed"))
        texts.append(target_text(problem, "answer_tag"))
        texts.append(" ".join([problem.answer, problem.answer_value, *(problem.choices or ())]))
    texts += ["user\n", "assistant\n", "system\n"]
    return texts


def encode_targets(policy: Policy, problems, answer_style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Target token ids (n, T) right-padded with pad, each ending in EOS, and their mask (n, T) bool."""
    from fastrl_core.policy import EOS_TOKEN

    tokenizer = policy.tokenizer
    rows = [
        tokenizer(target_text(problem, answer_style) + EOS_TOKEN, add_special_tokens=False)["input_ids"]
        for problem in problems
    ]
    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return ids, mask


def reward_variance_fraction(
    engine: Engine, problems, *, template: str, prompts: int = 16, rollouts: int = 8, seed: int = 0
) -> float:
    """Fraction of `prompts` groups of `rollouts` samples from `engine` whose rewards are not all equal."""
    from fastrl_core.data.templates import answer_style
    from fastrl_core.rewards import score_completions

    chosen = list(problems[:prompts])
    out = engine.generate(chosen, [rollouts] * len(chosen), generator=torch.Generator().manual_seed(seed))
    parts = score_completions(
        out.completion_text, [chosen[i] for i in out.prompt_index.tolist()], style=answer_style(template)
    )
    rewards = torch.tensor([p.overall for p in parts]).view(len(chosen), rollouts)
    return float((rewards.std(dim=1) > 0).float().mean())


def _names(text: str) -> list[str] | None:
    """'a, b' -> ['a', 'b']; '' -> None (everything)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or None


def _levels(text: str) -> list[int] | None:
    """'1,2' -> [1, 2]; '' -> None (every level)."""
    try:
        return [int(name) for name in _names(text) or ()] or None
    except ValueError:
        raise ValueError(f"--levels expects comma-separated integers, got {text!r}") from None


def _in_band(entry: dict, args: WarmstartArgs) -> bool:
    return args.band_low <= entry["accuracy"] <= args.band_high and entry["format_rate"] >= args.min_format


def build_warmstart_policy(args: WarmstartArgs, train) -> Policy:
    """The random policy the warm start trains: `args.widths` with a tokenizer trained on `train`'s text, or with the
    shipped warm start's tokenizer and processor (`args.tokenizer`); deterministic by `args.seed`."""
    from fastrl_core.data.templates import TEMPLATES
    from fastrl_core.policy import WIDTHS, build_policy, build_random_policy

    if args.widths not in WIDTHS or args.tokenizer not in TOKENIZERS:
        raise ValueError(f"warm start: widths={args.widths!r} / tokenizer={args.tokenizer!r}: choose widths from "
                         f"{', '.join(WIDTHS)} and tokenizer from {', '.join(TOKENIZERS)}")
    if args.tokenizer == "embedded":
        return build_random_policy(WIDTHS[args.widths], seed=args.seed)
    return build_policy(tokenizer_corpus(train, TEMPLATES), WIDTHS[args.widths], tokenizer_vocab_size=args.vocab_size,
                        seed=args.seed)


def warmstart(args: WarmstartArgs, *, progress: bool = True) -> dict:
    """Run the warm start (module docstring) and save the chosen checkpoint to `args.out`; returns its metadata."""
    from fastrl_core.data.problems import load_problems
    from fastrl_core.data.synthetic import ensure_dataset
    from fastrl_core.data.templates import answer_style
    from fastrl_core.engines.hf import HFEngine
    from fastrl_core.evaluate import evaluate_with
    from fastrl_core.policy import save_policy

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    kinds, levels = _names(args.kinds), _levels(args.levels)
    data_root = ensure_dataset(Path(args.data_dir), n_train=args.n_train, n_test=args.n_test, seed=args.data_seed,
                               kinds=kinds, levels=levels)
    train, test = load_problems(data_root / "train"), load_problems(data_root / "test")
    style = answer_style(args.template)
    policy = build_warmstart_policy(args, train)
    model = policy.model
    # one engine (T = 1, max_new_tokens) for the SFT forward, both evaluations and the reward-variance figure
    engine = HFEngine(policy, template=args.template, max_new_tokens=args.max_new_tokens, temperature=1.0)
    target_ids, target_mask = encode_targets(policy, train, style)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(train), generator=generator)
    cursor = 0
    history: list[dict] = []
    best: tuple[dict, dict] | None = None  # (entry, state_dict)
    above_band = 0

    def evaluate_now(step: int) -> dict:
        greedy = evaluate_with(engine, policy, test, template=args.template, progress=False)
        sampled = evaluate_with(engine, policy, test, template=args.template, samples=1,
                                generator=torch.Generator().manual_seed(args.seed + step), progress=False)
        entry = {"step": step, "accuracy": greedy["accuracy"], "format_rate": greedy["format_rate"],
                 "sample_accuracy": sampled["accuracy"], "per_kind": greedy["per_kind"],
                 "sample_per_kind": sampled["per_kind"], "seconds": time.perf_counter() - started}
        if progress:
            print(f"step {step:4d}  greedy {entry['accuracy']:.3f}  format {entry['format_rate']:.3f}  "
                  f"T=1 {entry['sample_accuracy']:.3f}  ({entry['seconds']:.0f} s)", flush=True)
        return entry

    for step in range(args.max_steps + 1):
        if step % args.eval_every == 0 or step == args.max_steps:
            model.eval()
            entry = evaluate_now(step)
            history.append(entry)
            if _in_band(entry, args) and (best is None or entry["sample_accuracy"] > best[0]["sample_accuracy"]):
                best = (entry, {k: v.detach().clone() for k, v in model.state_dict().items()})
            above_band = above_band + 1 if entry["accuracy"] > args.band_high else 0
            if above_band >= 2 or step == args.max_steps:
                break
        model.train()
        if cursor + args.batch_size > len(order):
            order, cursor = torch.randperm(len(train), generator=generator), 0
        rows = order[cursor : cursor + args.batch_size]
        cursor += args.batch_size
        batch = engine.prompt_batch([train[i] for i in rows.tolist()])  # (processing all at once: 0.6 GB of pixels)
        logprobs = engine.sequence_logprobs(model, batch, torch.arange(len(rows)), target_ids[rows],
                                            target_mask[rows])
        loss = -logprobs.sum() / target_mask[rows].sum()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / max(1, args.warmup_steps))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    if best is None:
        raise RuntimeError(
            f"no evaluated checkpoint had greedy accuracy in [{args.band_low}, {args.band_high}] with format rate "
            f">= {args.min_format}; history: " + json.dumps([{k: e[k] for k in ('step', 'accuracy', 'format_rate')}
                                                            for e in history])
        )
    chosen, state = best
    model.load_state_dict(state)
    model.eval()
    variance_fraction = reward_variance_fraction(engine, test, template=args.template, seed=args.seed)
    metadata = {
        "command": "python -m fastrl_core.warmstart " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in asdict(args).items()),
        "args": asdict(args),
        "dataset": {"kind": "synthetic", "n_train": args.n_train, "n_test": args.n_test, "seed": args.data_seed,
                    "kinds": kinds, "levels": levels, "folder": data_root.name},
        "parameters": sum(p.numel() for p in model.parameters()),
        "chosen": chosen,
        "reward_variance_groups_16x8": variance_fraction,
        "history": history,
        "seconds": time.perf_counter() - started,
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    save_policy(policy, args.out)
    (Path(args.out) / "warmstart.json").write_text(json.dumps(metadata, indent=1) + "\n")
    if progress:
        print(f"chose step {chosen['step']}: greedy {chosen['accuracy']:.3f}, format {chosen['format_rate']:.3f}, "
              f"T=1 {chosen['sample_accuracy']:.3f}; groups with reward variance {variance_fraction:.2f}; "
              f"saved to {args.out} ({metadata['seconds']:.0f} s)")
    return metadata


def parser() -> argparse.ArgumentParser:
    """Every WarmstartArgs field as a flag; flags not given stay out of the namespace (a preset fills them:
    `fastrl_core.named_models.main` adds `--preset`)."""
    parser = argparse.ArgumentParser(prog="fastrl warmstart", description=__doc__.split("\n\n")[0])
    for spec in fields(WarmstartArgs):
        parser.add_argument(f"--{spec.name.replace('_', '-')}", type=type(spec.default), default=argparse.SUPPRESS,
                            help=f"{spec.metadata['help']} (default: {spec.default})")
    return parser


def parse_args(argv: list[str] | None = None) -> WarmstartArgs:
    return WarmstartArgs(**vars(parser().parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    warmstart(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
