"""Pruning quality on real rollouts: how close each pruner's kept, weighted update is to the full batch's update.

    .venv/bin/python benchmarks/bench_prune_quality.py [--train-steps 40] [--checkpoint RUN_DIR/checkpoints/ID]
        [--choose-seeds 0-5] [--report-seeds 100-105] [--ties 10] [--threads 1] [--policies warm,trained]
        [--sketches lm_head,logprob,tokens] [--logprob-top-k 20]

For two policies — the shipped warm start (`load_policy("embedded")`) and a partly trained one (`--train-steps`
GRPO steps of the trainer on the embedded default, or `--checkpoint`) — and for each seed: 16 prompts × 8
rollouts of the synthetic task, sampled by the HF engine with the lm_head sketch projection exactly as the trainer
builds it (sketch_dim 256, top-K 64, seed 0); rewards and GRPO advantages as in training. Per rollout, the
full-model gradient g_i = ∇_θ A_i Σ_t log π(y_t) by autograd (one backward per distinct completion; identical
completions have identical gradients). The full update is g = (1/N) Σ_i g_i (the trainer's sequence-sum loss
normalised by the batch); a pruner's is ĝ = Σ_kept m_j w_j g_j / Σ_kept m_j (w its loss weights, m the
multiplicities with duplicate merging, 1 without).

Every pruner breaks ties by its generator's random slot order, and with ~3 distinct completions per group ties
are common (CPPO's cosine moves by up to 0.025 with the draw), so each batch is measured over `--ties` draws: each
draw reseeds every pruner (the first draw uses the batch seed) and runs the baselines at that draw's fastrl counts.
Printed per setting (policy × merge × keep ratio): mean ± std over the batches of the per-batch mean over the draws
of cosine(ĝ, g) and of the relative error ||ĝ − g|| / ||g||, the mean kept fraction, and for each fastrl variant
against CPPO / PODS at the same kept counts and the official rule: the batches where its mean over the draws is
closer (higher cosine: direction) and nearer (lower relative error: direction and the step's size), and the share
of (batch, its draw, their draw) pairs where it is.

Sketches (`--sketches`): the same batches are pruned by fastrl once per sketch, each as the trainer computes it:
`lm_head` the HF engine's (top-K 64 of generate's logits, with the hidden states); `logprob` what the vLLM engine
computes (`engines.vllm.rollouts_from_outputs`) from what vLLM returns, each position's top `--logprob-top-k`
log-probs plus the sampled token's, here taken from the HF scoring forward's raw logits (vLLM's float32 log-probs
equal HF's to ~4e-6, docs/notes.md §8); `tokens` the hashed token sets (`token_sketch`, the TRL plug-in's before
issue 47).
The baselines read no sketch: fastrl's per-group counts do not depend on it, so they are run once.

Equal counts: every fastrl variant keeps k_g = max(#signs present, ceil(keep·n'_g)) (min_keep 2) of the n'_g
nonzero-advantage rows of group g;
CPPO, PODS and random are then run per group with exactly each variant's k_g (their own rules, `keep_ratio` tiny
and `min_keep = k_g`), and the script checks every count. The table lists them at the default's counts; each
variant's line counts its wins against CPPO and PODS at its own counts. `fastrl_official` keeps what its rule
keeps; CPPO is run again at its per-group counts. With merging, rows are distinct completions (the cost that
passes through the log-prob passes and the update): fastrl weighs a row's |A| by its multiplicity, CPPO / PODS /
random / the official rule see distinct rows only, and every kept row enters ĝ with its multiplicity.

The selection rules are compared on `--choose-seeds`; the default was chosen there, and `--report-seeds` (disjoint)
give the figures quoted in docs/experiments.md. A quality figure, not a timing: threads 1, a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from fastrl_core.algo.advantages import compute_advantages
from fastrl_core.algo.duplicates import find_duplicates
from fastrl_core.algo.groups import GroupBatch
from fastrl_core.algo.pruners import prune
from fastrl_core.algo.sketches import SKETCHES, logprob_sketch, make_projection, token_sketch
from fastrl_core.config import TrainConfig
from fastrl_core.data.problems import load_problems
from fastrl_core.data.synthetic import ensure_dataset
from fastrl_core.data.templates import answer_style
from fastrl_core.rewards import score_completions
from fastrl_core.run_config import resolve_config

FASTRL_VARIANTS = {  # label -> fastrl options; the variants compared before issue 40 are in docs/experiments.md
    "fastrl (coreset, euclidean; default)": {},
}


def seed_list(text: str) -> list[int]:
    if not text:
        return []
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def trained_policy(config: TrainConfig, steps: int):
    """The policy after `steps` GRPO steps of the trainer (pruner none, fixed budget) on the embedded default."""
    from fastrl_core.trainer import Trainer

    trainer = Trainer(config, progress=False)
    for _ in range(steps):
        trainer.train_step()
    trainer.writer.finish()
    return trainer.policy


def scored_logprob_sketch(engine, policy, problems, rollouts, projection, top_k: int):
    """(N, D) `logprob_sketch` of each position's top_k log-probs plus the sampled token's (when outside them), as
    vLLM returns them, from the HF scoring forward's raw logits (`HFEngine._completion_hidden`, then the lm_head)."""
    ids, mask = rollouts.completion_ids, rollouts.completion_mask
    with torch.no_grad():
        hidden = engine._completion_hidden(policy.model, engine.prompt_batch(problems), rollouts.prompt_index, ids,
                                           mask)  # (N, T, H)
        logprobs = torch.log_softmax(policy.model.get_output_embeddings()(hidden).float(), dim=-1)  # (N, T, V)
    top_values, top_ids = logprobs.topk(top_k, dim=-1)  # (N, T, K)
    sampled = ids.masked_fill(~mask, 0)[..., None]  # (N, T, 1)
    inside = (top_ids == sampled).any(dim=-1, keepdim=True)
    sketch_ids = torch.cat([top_ids, sampled.masked_fill(inside, 0)], dim=-1)  # (N, T, K + 1): top-K, then y
    sketch_values = torch.cat([top_values, logprobs.gather(-1, sampled).masked_fill(inside, -torch.inf)], dim=-1)
    return logprob_sketch(sketch_ids, sketch_values, ids, mask, projection)


def batch_sketches(engine, policy, problems, rollouts, config: TrainConfig, names: list[str],
                   logprob_top_k: int) -> dict[str, torch.Tensor]:
    """name -> (N, D) sketches of the rollouts (module docstring, "Sketches")."""
    made = {"lm_head": lambda: rollouts.sketches,
            "logprob": lambda: scored_logprob_sketch(engine, policy, problems, rollouts, engine.sketch_projection,
                                                     logprob_top_k),
            "tokens": lambda: token_sketch(rollouts.completion_ids, rollouts.completion_mask,
                                           dim=config.sketch_dim, seed=config.seed)}
    return {name: made[name]() for name in names}


def sample_batch(engine, policy, problems, seed: int, config: TrainConfig, sketches: list[str] = ("lm_head",),
                 logprob_top_k: int = 20):
    """Rollouts, rewards, advantages, the advantage-free per-rollout full-model gradients (N, P) and the
    `batch_sketches` named by `sketches` (the batch's own sketches are the first of them)."""
    counts = [config.rollouts_per_prompt] * len(problems)
    policy.model.eval()
    rollouts = engine.generate(problems, counts, generator=torch.Generator().manual_seed(seed))
    group_ids = rollouts.prompt_index
    parts = score_completions(rollouts.completion_text, [problems[i] for i in group_ids.tolist()],
                              style=answer_style(config.template), format_weight=config.format_weight,
                              accuracy_weight=config.accuracy_weight)
    rewards = torch.tensor([p.overall for p in parts])
    advantages = compute_advantages(config.advantage, rewards, group_ids)
    duplicates = find_duplicates(group_ids, rollouts.completion_ids, rollouts.completion_mask)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    gradients = torch.zeros(len(group_ids), sum(p.numel() for p in params))
    for j in duplicates.unique.tolist():  # one backward per distinct completion; zero advantage needs none
        if abs(float(advantages[j])) <= 1e-6:
            continue
        logprobs = engine.token_logprobs(policy.model, problems, rollouts, torch.tensor([j]))
        grads = torch.autograd.grad(logprobs.sum(), params)
        gradients[j] = torch.cat([g.reshape(-1) for g in grads])
    gradients = gradients[duplicates.representative]  # copies share their representative's gradient
    token_ids = tuple(ids[mask] for ids, mask in zip(rollouts.completion_ids, rollouts.completion_mask))
    made = batch_sketches(engine, policy, problems, rollouts, config, list(sketches), logprob_top_k)
    batch = GroupBatch(group_ids, rewards, advantages, made[sketches[0]], token_ids)
    return batch, duplicates, gradients * advantages[:, None], made


def setup(work: Path, threads: int) -> tuple[TrainConfig, list]:
    """The benchmark's config (no pruner, fixed budget, nothing stored) and the synthetic training problems."""
    config = resolve_config(TrainConfig(store_dir=str(work), synthetic_train=512, synthetic_test=64, threads=threads,
                                        pruner="none", budget="fixed", eval_every=0, checkpoint_every=0,
                                        log_rollouts=False))
    root = ensure_dataset(work / "data", n_train=config.synthetic_train, n_test=config.synthetic_test, seed=0)
    return config, load_problems(root / "train")


def sketching_engine(config: TrainConfig, policy):
    """The HF engine with the lm_head sketch projection exactly as the trainer builds it."""
    from fastrl_core.run_setup import make_engine

    out = policy.model.get_output_embeddings().weight
    projection = make_projection(out.shape[0], out.shape[1], sketch_dim=config.sketch_dim, seed=config.seed)
    return make_engine(config, policy, projection)


def seed_batch(engine, policy, problems, seed: int, config: TrainConfig, **sketch_options):
    """`sample_batch` on the prompts_per_step problems that `seed` draws: the batch of that seed."""
    order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(10_000 + seed))
    chosen = [problems[i] for i in order[: config.prompts_per_step].tolist()]
    return sample_batch(engine, policy, chosen, seed, config, **sketch_options)


def merged(batch: GroupBatch, duplicates) -> GroupBatch:
    u = duplicates.unique
    return GroupBatch(batch.group_ids[u], batch.rewards[u], batch.advantages[u], batch.sketches[u],
                      tuple(batch.token_ids[i] for i in u.tolist()), duplicates.counts.float())


def kept_per_group(batch: GroupBatch, keep: torch.Tensor) -> dict[int, int]:
    return {int(g): int(keep[batch.group_ids == g].sum()) for g in batch.group_ids.unique()}


def at_counts(name: str, batch: GroupBatch, counts: dict[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run pruner `name` per group with exactly counts[g] kept (keep_ratio tiny, min_keep = counts[g]); `random`
    keeps counts[g] uniformly drawn rows. Returns (keep (N,), weights (N,))."""
    keep = torch.zeros(batch.group_ids.numel(), dtype=torch.bool)
    weights = torch.zeros(batch.group_ids.numel())
    generator = torch.Generator().manual_seed(seed)
    for g, k in counts.items():
        rows = (batch.group_ids == g).nonzero().flatten()
        if k == 0:
            continue
        if name == "random":
            chosen = rows[torch.randperm(rows.numel(), generator=generator)[:k]]
            keep[chosen], weights[chosen] = True, 1.0
            continue
        sub = GroupBatch(batch.group_ids[rows], batch.rewards[rows], batch.advantages[rows], batch.sketches[rows])
        result = prune(name, sub, keep_ratio=1e-9, min_keep=k, generator=generator)
        keep[rows], weights[rows] = result.keep_mask, result.weights
    assert kept_per_group(batch, keep) == counts, (name, kept_per_group(batch, keep), counts)
    return keep, weights


@dataclass
class Geometry:
    """A batch's update geometry in float64: the Gram matrix (n, n) of its rows' gradients and the rows'
    multiplicities (n,). The full update is g = Σ m_i g_i / Σ m_i, so the cosine and error of any kept, weighted
    update cost O(n²) here instead of O(n·P) over the P parameters."""
    gram: torch.Tensor
    multiplicity: torch.Tensor

    @classmethod
    def of(cls, rows: torch.Tensor, multiplicity: torch.Tensor) -> Geometry:
        """rows (n, P): the rows' gradients; multiplicity (n,): their copies (1 without merging)."""
        rows = rows.double()
        return cls(rows @ rows.T, multiplicity.double())

    def fidelity(self, keep: torch.Tensor, weights: torch.Tensor) -> tuple[float, float]:
        """cosine and relative error ||ĝ − g|| / ||g|| of ĝ = Σ_kept m w g / Σ_kept m against the full update g."""
        m = self.multiplicity
        mine = torch.where(keep, m * weights.double(), 0.0) / torch.where(keep, m, 0.0).sum().clamp(min=1e-30)
        full = m / m.sum()
        norm = lambda c: float(c @ self.gram @ c) ** 0.5  # noqa: E731  ||Σ c_i g_i||
        cross = float(mine @ self.gram @ full)
        return cross / max(norm(mine) * norm(full), 1e-300), norm(mine - full) / max(norm(full), 1e-300)


@dataclass
class Fidelity:
    """One method on one batch, over the tie draws: cosine(ĝ, g) and ||ĝ − g|| / ||g|| per draw."""
    cosines: list[float]
    errors: list[float]
    kept: float  # kept fraction of the sampled rollouts, mean over the draws
    at: str = ""  # for a fastrl variant: the key suffix of the baselines run at its counts

    @property
    def cosine(self) -> float:
        return statistics.mean(self.cosines)

    @property
    def error(self) -> float:
        return statistics.mean(self.errors)


def tie_seeds(seed: int, ties: int) -> list[int]:
    """The generator seeds of a batch's tie draws; the first is the batch seed (the single draw of earlier runs)."""
    return [seed] + [1000 * seed + r for r in range(1, ties)]


def variant_label(label: str, sketch: str, sketches: list[str]) -> str:
    """A fastrl variant's table label, naming its sketch when several are compared."""
    return label if len(sketches) == 1 else f"{label}, {sketch} sketch"


def evaluate_draw(work: GroupBatch, geometry: Geometry, sampled: int, keep_ratio: float, min_keep: int,
                  seed: int, sketches: dict[str, torch.Tensor] | None = None) -> dict[str, tuple]:
    """One tie draw (every pruner's generator seeded `seed`): method -> (cosine, relative error, kept fraction,
    for a fastrl variant the key suffix of the baselines at its counts, else ""). `sketches`: name -> (n, D) rows of
    `work`, each pruned by every fastrl variant (None: `work.sketches` alone)."""
    out = {}

    def record(label, keep, weights):
        cosine, error = geometry.fidelity(keep, weights)
        out[label] = (cosine, error, int(keep.sum()) / sampled, "")

    rows = work.group_ids.numel()
    record("none (full batch)", torch.ones(rows, dtype=torch.bool), torch.ones(rows))
    done: dict[tuple, tuple] = {}  # (baseline, per-group counts) -> its record at those counts
    sketches = sketches if sketches is not None else {"": work.sketches}
    variants = [(variant_label(label, name, list(sketches)), options, rows)
                for label, options in FASTRL_VARIANTS.items() for name, rows in sketches.items()]
    for index, (label, options, rows_sketches) in enumerate(variants):
        result = prune("fastrl", dataclasses.replace(work, sketches=rows_sketches), keep_ratio=keep_ratio,
                       min_keep=min_keep, generator=torch.Generator().manual_seed(seed), **options)
        record(label, result.keep_mask, result.weights)
        counts = kept_per_group(work, result.keep_mask)
        # the baselines at exactly these counts; only the default's are table rows ("@" keys are not printed)
        at = "fastrl's counts" if index == 0 else f"@ the counts of {label}"
        out[label] = out[label][:3] + (at,)
        for name in ("cppo", "pods", "random") if index == 0 else ("cppo", "pods"):
            key = (name, tuple(sorted(counts.items())))
            if key not in done:
                record(f"{name} @ {at}", *at_counts(name, work, counts, seed))
                done[key] = out[f"{name} @ {at}"]
            out[f"{name} @ {at}"] = done[key]
    official = prune("fastrl_official", work, generator=torch.Generator().manual_seed(seed))
    record("fastrl_official (own count)", official.keep_mask, official.weights)
    record("cppo @ official's counts", *at_counts("cppo", work, kept_per_group(work, official.keep_mask), seed))
    return out


def evaluate_batch(batch: GroupBatch, duplicates, gradients: torch.Tensor, keep_ratio: float, merge: bool,
                   min_keep: int, seeds: list[int], sketches: dict[str, torch.Tensor] | None = None
                   ) -> dict[str, Fidelity]:
    """method -> its Fidelity over the tie draws `seeds` (every pruner breaks ties by its generator's slot order,
    so each draw reruns them all; a draw's CPPO / PODS run at that draw's fastrl counts). `sketches`: name ->
    (N, D), each pruned by fastrl (None: the batch's own)."""
    if merge:
        work, geometry = merged(batch, duplicates), Geometry.of(gradients[duplicates.unique], duplicates.counts)
        rows = duplicates.unique
    else:
        work, geometry = batch, Geometry.of(gradients, torch.ones(len(gradients)))
        rows = torch.arange(len(gradients))
    sketches = None if sketches is None else {name: value[rows] for name, value in sketches.items()}
    draws = [evaluate_draw(work, geometry, len(gradients), keep_ratio, min_keep, s, sketches) for s in seeds]
    return {label: Fidelity([d[label][0] for d in draws], [d[label][1] for d in draws],
                            statistics.mean(d[label][2] for d in draws), draws[0][label][3])
            for label in draws[0]}


def beats(per_batch: list[dict[str, Fidelity]], label: str, other: str, nearer: bool = False) -> tuple[int, float]:
    """(batches where `label`'s mean over the draws beats `other`'s, share of the (batch, draw, draw) pairs where a
    draw of `label` beats a draw of `other`); beating is a higher cosine, or with `nearer` a smaller error."""
    def better(a: float, b: float) -> bool:
        return a < b if nearer else a > b

    def values(f: Fidelity) -> list[float]:
        return f.errors if nearer else f.cosines

    batches = sum(better(statistics.mean(values(b[label])), statistics.mean(values(b[other]))) for b in per_batch)
    pairs = [better(x, y) for b in per_batch for x in values(b[label]) for y in values(b[other])]
    return batches, sum(pairs) / len(pairs)


def summarise(title: str, per_batch: list[dict[str, Fidelity]]) -> None:
    methods = [m for m in per_batch[0] if " @ @ " not in m]  # baselines at a non-default variant's counts
    draws = len(per_batch[0][methods[0]].cosines)
    print(f"\n{title}  ({len(per_batch)} batches × {draws} tie draws; means over the draws, then over the batches)")
    width = max(44, *(len(m) for m in methods))
    print(f"| {'method':{width}s} | cosine mean ± std | rel. error mean ± std | kept |")
    print(f"|{'-' * (width + 2)}|-------------------|-----------------------|------|")
    spread = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
    for method in methods:
        cos = [b[method].cosine for b in per_batch]
        err = [b[method].error for b in per_batch]
        kept = statistics.mean(b[method].kept for b in per_batch)
        print(f"| {method:{width}s} | {statistics.mean(cos):.3f} ± {spread(cos):.3f}     | "
              f"{statistics.mean(err):.3f} ± {spread(err):.3f}         | {kept:.2f} |")
    official, cppo_official = "fastrl_official (own count)", "cppo @ official's counts"
    n = len(per_batch)
    for label in [m for m in methods if per_batch[0][m].at]:  # the fastrl variants
        counts = per_batch[0][label].at  # the baselines ran at the variant's own per-group counts
        cppo, pods = f"cppo @ {counts}", f"pods @ {counts}"
        closer = [beats(per_batch, label, other) for other in (cppo, pods, official)]
        nearer = [beats(per_batch, label, other, nearer=True) for other in (cppo, pods, official)]
        margin = statistics.mean(b[label].cosine - b[cppo].cosine for b in per_batch)
        said = lambda r: f"{r[0]}/{n} ({100 * r[1]:.0f} % of draw pairs)"  # noqa: E731
        print(f"  {label}: closer than CPPO in {said(closer[0])}, PODS {said(closer[1])} at "
              f"{counts.lstrip('@ ')}, the official rule {said(closer[2])}; cosine minus CPPO's {margin:+.3f}; "
              f"nearer than CPPO in {said(nearer[0])}, PODS {said(nearer[1])}, the official rule {said(nearer[2])}")
    margin = statistics.mean(b[official].cosine - b[cppo_official].cosine for b in per_batch)
    print(f"  fastrl_official minus CPPO at its counts: {margin:+.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-steps", type=int, default=40, help="GRPO steps for the partly trained policy")
    parser.add_argument("--checkpoint", default=None, help="a saved policy dir instead of training (…/policy)")
    parser.add_argument("--choose-seeds", default="0-5")
    parser.add_argument("--report-seeds", default="100-105")
    parser.add_argument("--keep", default="0.5,0.25")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ties", type=int, default=10, help="tie draws per batch (every pruner's generator seed)")
    parser.add_argument("--policies", default="warm,trained", help="which of warm (start), trained to measure")
    parser.add_argument("--work", default=None, help="directory for the dataset and the training run (temp dir)")
    parser.add_argument("--sketches", default="lm_head,logprob,tokens",
                        help=f"sketches fastrl prunes the same batches with, of {', '.join(SKETCHES.names())}")
    parser.add_argument("--logprob-top-k", type=int, default=20,
                        help="top-K log-probs of the logprob sketch (the vLLM runs' sketch_top_k)")
    args = parser.parse_args()
    sketches = args.sketches.split(",")
    unknown = sorted(set(sketches) - set(SKETCHES.names()))
    if unknown or not sketches:
        parser.error(f"--sketches: unknown {unknown}; choose from {', '.join(SKETCHES.names())}")
    if args.logprob_top_k < 1:
        parser.error("--logprob-top-k must be >= 1")
    torch.set_num_threads(args.threads)

    from fastrl_core.policy import load_policy

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_prune_quality_"))
    config, problems = setup(work, args.threads)
    wanted = set(args.policies.split(","))
    policies = {"warm start": load_policy("embedded")} if "warm" in wanted else {}
    if "trained" in wanted and args.checkpoint:
        policies["checkpoint"] = load_policy(args.checkpoint)
    elif "trained" in wanted and args.train_steps:
        policies[f"after {args.train_steps} GRPO steps"] = trained_policy(config, args.train_steps)
    keeps = [float(k) for k in args.keep.split(",")]
    for phase, seeds in (("choose", seed_list(args.choose_seeds)), ("report", seed_list(args.report_seeds))):
        if not seeds:
            continue
        results: dict[tuple, list] = {}
        for policy_name, policy in policies.items():
            engine = sketching_engine(config, policy)
            for seed in seeds:
                batch, duplicates, gradients, made = seed_batch(engine, policy, problems, seed, config,
                                                                sketches=sketches,
                                                                logprob_top_k=args.logprob_top_k)
                for merge in (False, True):
                    for keep in keeps:
                        results.setdefault((policy_name, merge, keep), []).append(
                            evaluate_batch(batch, duplicates, gradients, keep, merge, config.min_keep,
                                           tie_seeds(seed, args.ties), made))
        print(f"\n===== {phase} seeds {seeds} =====")
        for (policy_name, merge, keep), per_batch in results.items():
            summarise(f"[{phase}] {policy_name}, merge {'on' if merge else 'off'}, keep {keep}", per_batch)


if __name__ == "__main__":
    main()
