"""The store and the dashboard at a real run's size: the paper's Geometry3K run (2,101 problems, 25 epochs, 64
prompts x 8 rollouts = 512 a step, so ~800 steps; completions of several hundred tokens with their tokens and
sampling log-probs; 256-dim sketches; 300x300 diagrams), written through the trainer's own code (`step_rows` ->
`RunWriter.write_step`), for FastRL (adaptive budget, pruned) and plain GRPO (bench run names, so the Demo page
pairs them).

    .venv/bin/python benchmarks/bench_store_scale.py --store /tmp/scale              # build (once) and measure
    .venv/bin/python benchmarks/bench_store_scale.py --store /tmp/scale --scale 0.02 # a small one (smoke, tests)
    .venv/bin/python benchmarks/bench_store_scale.py --store /tmp/scale --steps 40   # full-size steps, fewer

--scale s multiplies steps (800), prompts a step (64), completion tokens (512) and problems (2,101); --steps
overrides the step count alone. An existing store is reused (its build figures are then not printed). Measured, each
with the machine's load average (other work inflates every timing):
  (1) the trainer's write per step (`step_rows` + `write_step`, what its `store` phase times), median / p90 / max,
      first-epoch steps (they write their prompts' images) apart; against 2 % of a step of the paper's profile on
      a GPU, ASSUMED_STEP_S (Table 8: ~530 s for 256 prompts x 8; a 512-rollout step ~ a quarter of it);
  (2) disk: the store, each table, bytes per rollout, and the rollouts files' columns;
  (3) the store's reads the pages make, in a fresh process (cold) and again (warm): the token view of one
      rollout, one step's rollouts, the embedding map's sample over the whole run, the budget heatmap, ...;
  (4) `fastrl store check` and `fastrl store compact` (the DuckDB file and the summary files) on the FastRL run;
  (5) every page in headless Chromium (benchmarks/bench_pages.py's timing: until the whole page is drawn): cold =
      the first load after a fresh app start (empty data caches; the OS file cache is whatever the build left),
      warm = the median of --repeats reloads. Targets: <= 2 s warm, <= 5 s cold. --no-pages skips (5).
(3) and (5) also give each cold figure from the step files alone (the runs' summary files, `store.summary`, set
aside for that measurement): the store as it was read before 2026-12-06, side by side in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from fastrl_app import metrics
from fastrl_core import store
from fastrl_core.store import PHASES, StepRecord, image_key, step_rows, summary

REAL = {"steps": 800, "prompts": 64, "tokens": 512, "problems": 2101}  # the paper's Geometry3K run
ROLLOUTS_PER_PROMPT = 8
SKETCH_DIM = 256
IMAGE_SIDE = 300
ASSUMED_STEP_S = 530.0 / 4  # paper Table 8: GRPO step ~530 s for 2,048 rollouts on 4 GPUs -> ~130 s for 512
WRITE_TARGET_S = 1.0  # the aim; 2 % of ASSUMED_STEP_S is 2.65 s
EVAL_EVERY = 25


@dataclass(frozen=True)
class Scale:
    """The size of the run the benchmark writes."""

    steps: int
    prompts: int  # per step
    tokens: int  # mean completion tokens
    problems: int  # distinct prompts (and images) of the training set

    @classmethod
    def of(cls, scale: float, steps: int | None = None) -> "Scale":
        if not 0 < scale <= 1:
            raise ValueError(f"--scale must lie in (0, 1], got {scale}")
        prompts = max(2, round(REAL["prompts"] * scale))
        return cls(steps=steps or max(3, round(REAL["steps"] * scale)), prompts=prompts,
                   tokens=max(8, round(REAL["tokens"] * scale)),
                   problems=max(prompts, round(REAL["problems"] * scale)))

    @property
    def rollouts(self) -> int:
        return self.prompts * ROLLOUTS_PER_PROMPT


# ------------------------------------------------------------------------------------------------- the run's data
def vocabulary(size: int = 8192, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Token strings (pseudo-words with a leading space, digits, LaTeX pieces, punctuation) and Zipf probabilities,
    so completions and token lists compress like text rather than noise."""
    rng = np.random.default_rng(seed)
    syllables = ["an", "ge", "le", "tri", "ang", "side", "ra", "di", "us", "the", "of", "is", "x", "y", "co", "sin",
                 "area", "per", "pen", "dic", "u", "lar", "so", "we", "find", "eq", "ual", "to", "by", "len", "gth"]
    fixed = [" ", ".", ",", "\n", "{", "}", "\\frac", "\\sqrt", "^", "=", "+", "-", "(", ")", "<think>", "</think>",
             "\\boxed{", *[str(d) for d in range(10)], "°", " therefore", " angle", " triangle"]
    words = {w for w in fixed}
    while len(words) < size:
        words.add(" " + "".join(rng.choice(syllables, size=int(rng.integers(1, 4)))))
    tokens = sorted(words, key=lambda w: (w not in fixed, len(w), w))[:size]
    probabilities = 1.0 / np.arange(2, size + 2) ** 1.1
    return tokens, probabilities / probabilities.sum()


def diagram_png(problem: int) -> bytes:
    """A 300x300 geometry-like diagram (a polygon with labelled vertices and a few segments) as PNG bytes."""
    rng = np.random.default_rng(problem)
    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    corners = [tuple(int(v) for v in rng.integers(20, IMAGE_SIDE - 20, size=2)) for _ in range(int(rng.integers(3, 7)))]
    draw.polygon(corners, outline=(0, 0, 0), width=2)
    for _ in range(int(rng.integers(1, 4))):
        a, b = rng.choice(len(corners), size=2, replace=False)
        draw.line([corners[a], corners[b]], fill=(0, 0, 0), width=1)
    for label, corner in zip("ABCDEFG", corners):
        draw.text((corner[0] + 4, corner[1] + 4), label, fill=(0, 0, 0))
    draw.text((IMAGE_SIDE // 2, IMAGE_SIDE // 2), f"{int(rng.integers(2, 90))}", fill=(0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def question(problem: int) -> str:
    rng = np.random.default_rng([problem, 1])
    what = ["Find x.", "Find the area of the figure.", "Find the measure of angle 1.", "Find y in the figure."]
    choices = rng.integers(2, 120, size=4)
    return (f"<image>{what[problem % len(what)]} Round to the nearest tenth if necessary. Choices: "
            + " ".join(f"{letter}: {value}" for letter, value in zip("ABCD", choices)))


class RunData:
    """Training steps of one method as the trainer would record them: `result(step)` is the step's StepRecord."""

    def __init__(self, scale: Scale, method: str, seed: int = 0) -> None:
        self.scale, self.method, self.seed = scale, method, seed
        self.tokens, self.probabilities = vocabulary()
        self.difficulty = np.random.default_rng([seed, 7]).beta(0.6, 0.6, size=scale.problems)  # p(correct)
        self.images: dict[int, tuple[str, bytes]] = {}
        self.stored: set[int] = set()

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, 11, epoch]).permutation(self.scale.problems)

    def problems(self, step: int) -> np.ndarray:
        """The step's prompts: epoch after epoch, each a permutation of every problem (a step that spans two epochs
        takes the next epoch's first problems that it does not already have)."""
        epoch, offset = divmod(step * self.scale.prompts, self.scale.problems)
        this = self._order(epoch)[offset: offset + self.scale.prompts]
        taken = set(this.tolist())
        following = [p for p in self._order(epoch + 1).tolist() if p not in taken]
        return np.concatenate([this, following[: self.scale.prompts - this.size]]).astype(np.int64)

    def image(self, problem: int) -> tuple[str, bytes]:
        if problem not in self.images:
            png = diagram_png(problem)
            self.images[problem] = (image_key(png), png)
        return self.images[problem]

    def counts(self, rng: np.random.Generator, problems: np.ndarray, step: int) -> np.ndarray:
        """Rollouts per prompt: 8 for GRPO; FastRL's adaptive budget probes (2) or skips (0) decided prompts once
        they have been seen (after the first epoch)."""
        n = np.full(len(problems), ROLLOUTS_PER_PROMPT)
        if self.method == "grpo" or step * self.scale.prompts < self.scale.problems:
            return n
        decided = np.abs(self.difficulty[problems] - 0.5) > 0.4
        draw = rng.random(len(problems))
        n[decided & (draw < 0.6)] = 2
        n[decided & (draw >= 0.6) & (draw < 0.8)] = 0
        return n

    def result(self, step: int, seconds: dict[str, float], wall_time: float) -> StepRecord:
        rng = np.random.default_rng([self.seed, step, 3])
        problems = self.problems(step)
        counts = self.counts(rng, problems, step)
        group = np.repeat(np.arange(len(problems)), counts)  # (N,)
        n, index = group.size, np.arange(group.size)
        lengths = np.clip(rng.normal(self.scale.tokens, self.scale.tokens / 4, size=n), 4, 2 * self.scale.tokens
                          ).astype(np.int64)
        width = int(lengths.max()) if n else 1
        ids = rng.choice(len(self.tokens), size=(n, width), p=self.probabilities)  # (N, T)
        logprobs = -rng.exponential(0.35, size=(n, width)).astype(np.float32)
        correct = rng.random(n) < self.difficulty[problems][group]
        formatted = rng.random(n) < 0.95
        source = index.copy()  # ~2 % of rollouts repeat an earlier rollout of their group word for word
        for i in np.flatnonzero(rng.random(n) < 0.02):
            earlier = np.flatnonzero((group == group[i]) & (source == index) & (index < i))
            if earlier.size:
                source[i] = earlier[0]
        ids, logprobs, lengths, correct, formatted = (a[source] for a in (ids, logprobs, lengths, correct, formatted))
        mask = np.arange(width)[None, :] < lengths[:, None]  # (N, T)
        ids, logprobs = np.where(mask, ids, 0), np.where(mask, logprobs, 0.0)
        copies = source != index
        multiplicity = np.bincount(source, minlength=n) * ~copies  # class size at its first, 0 at a copy
        rewards = 1.0 * correct + 0.5 * formatted
        sizes = np.maximum(np.bincount(group, minlength=len(problems)), 1)
        means = np.bincount(group, rewards, len(problems)) / sizes
        stds = np.sqrt(np.bincount(group, (rewards - means[group]) ** 2, len(problems)) / sizes)
        advantages = (rewards - means[group]) / (stds[group] + 1e-6)
        keep, reasons = self._prune(rng, advantages, source)
        texts = ["".join(self.tokens[t] for t in row[:length]) for row, length in zip(ids.tolist(), lengths.tolist())]
        refs = [self.image(int(p))[0] for p in problems]
        new = {self.image(int(p))[0]: self.image(int(p))[1] for p in problems if int(p) not in self.stored}
        self.stored.update(int(p) for p in problems)
        return StepRecord(
            step=step, prompt_ids=[f"geo3k-{p:04d}" for p in problems], questions=[question(int(p)) for p in problems],
            answers=[str(int(p) % 90 + 2) for p in problems], image_refs=refs, images=new, group_index=group,
            completions=texts, lengths=lengths, rewards=rewards, advantages=advantages, keep_mask=keep,
            reasons=reasons, scores=np.abs(advantages), weights=keep.astype(np.float64),
            sketches=rng.standard_normal((n, SKETCH_DIM), dtype=np.float32),
            format_rewards=0.5 * formatted, accuracy_rewards=correct.astype(float).tolist(), seconds=seconds,
            metrics={"loss": float(rng.normal(0, 0.1)), "kl": 1e-3 * (1 + step / 100), "lr": 1e-6,
                     "clip_fraction": 0.01, "epoch_end": False},
            wall_time=wall_time, multiplicity=multiplicity, nominal_per_prompt=ROLLOUTS_PER_PROMPT,
            token_ids=ids, token_mask=mask, token_logprobs=logprobs, decode_token=self.tokens.__getitem__)

    def _prune(self, rng: np.random.Generator, advantages: np.ndarray, source: np.ndarray
               ) -> tuple[np.ndarray, list[str]]:
        """Keep mask and reasons as the trainer's pruner gives them (`algo.duplicates.prune_distinct`): a copy
        (source[i] != i) is never kept and has reason DUPLICATE when its first is kept, else its first's reason
        (the store records DUPLICATE for every copy). GRPO keeps every first; FastRL drops A = 0 and about a third
        of the rest at random (LOW_ADVANTAGE or REDUNDANT)."""
        n = advantages.size
        first = source == np.arange(n)
        if self.method == "grpo":
            keep = first
            reasons = np.full(n, "KEPT", dtype=object)
        else:
            zero = np.abs(advantages) < 1e-6
            keep = first & ~zero & (rng.random(n) >= 0.35)
            reasons = np.where(keep, "KEPT", np.where(zero, "ZERO_ADVANTAGE", np.where(
                rng.random(n) < 0.5, "LOW_ADVANTAGE", "REDUNDANT"))).astype(object)
        reasons = np.where(first, reasons, np.where(keep[source], "DUPLICATE", reasons[source]))
        return keep, reasons.tolist()


def phase_seconds(method: str, sampled: int, kept: int, scale: Scale) -> dict[str, float]:
    """A step's phase times on the paper's profile (Table 8, scaled to the step's rollouts): generation by the
    rollouts sampled, the two scoring passes and the update by the rows kept."""
    full = scale.rollouts
    per_sample, per_kept = {"generate": 87 / 4}, {"logprob": (70 + 55) / 4, "update": 319 / 4}
    seconds = {p: v * sampled / full for p, v in per_sample.items()}
    seconds |= {p: v * kept / full for p, v in per_kept.items()}
    return {p: seconds.get(p, 0.2) for p in PHASES if p != "store"}


def build(root: Path, scale: Scale, methods: tuple[str, ...] = ("fastrl", "grpo"), *, log=print) -> dict[str, list]:
    """Write one run per method into `root` through `step_rows` and `RunWriter`; returns {method: [(step, write
    seconds, "images" | "summaries" | ""), ...]} (what else the step wrote: its first-epoch images, or the run's
    summary files), each step's write timed as the trainer times its `store` phase."""
    writes: dict[str, list] = {}
    config = {"rollouts_per_prompt": ROLLOUTS_PER_PROMPT, "prompts_per_step": scale.prompts, "steps": scale.steps,
              "budget_args": {"n_min": 2}, "objective_args": {"beta": 0.01}, "log_rollouts": True,
              "sketch_dim": SKETCH_DIM, "seed": 0}
    for method in methods:
        pruned = method != "grpo"
        writer = store.RunWriter(root, name=metrics.bench_run_name(method, 0), config=config, model="Qwen2.5-VL-7B",
                                 dataset="geometry3k (synthetic, benchmarks/bench_store_scale.py)", objective="grpo",
                                 pruner="fastrl" if pruned else "none", budget="adaptive" if pruned else "fixed",
                                 code_version="bench-store-scale")
        data, clock, last_write, rows = RunData(scale, method), 0.0, 0.0, []
        started = time.perf_counter()
        for step in range(scale.steps):
            result = data.result(step, {}, 0.0)
            keep = int(np.asarray(result.keep_mask).sum())
            seconds = phase_seconds(method, len(result.completions), keep, scale) | {"store": last_write}
            clock += sum(seconds.values())
            result.seconds, result.wall_time = seconds, clock
            begin = time.perf_counter()
            step_rows(result).write_to(writer)  # the trainer's store phase: these two calls
            last_write = time.perf_counter() - begin
            rows.append((step, last_write, "images" if result.images else
                         "summaries" if (step + 1) % summary.EVERY == 0 else ""))
            if step % EVAL_EVERY == 0 or step == scale.steps - 1:
                accuracy = 0.37 + (0.13 if pruned else 0.11) * (1 - math.exp(-step / (scale.steps / 3)))
                writer.write_eval(step, "test", accuracy, 601, wall_time=clock)
            if (step + 1) % max(1, scale.steps // 10) == 0:
                log(f"  {method}: step {step + 1}/{scale.steps}, {time.perf_counter() - started:.0f} s", flush=True)
        begin = time.perf_counter()
        writer.finish()  # compacts the run into its .duckdb file, as a trainer's finished run does
        log(f"  {method}: finish() (compact) {time.perf_counter() - begin:.1f} s", flush=True)
        writes[method] = rows
    return writes


# ---------------------------------------------------------------------------------------------------- measuring
def load() -> str:
    """The machine's load, as `uptime` gives it (other work inflates every timing)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average {os.getloadavg()[0]:.2f}"


def spread(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return (f"median {statistics.median(ordered):.3f} s, p90 {ordered[int(0.9 * (len(ordered) - 1))]:.3f} s, "
            f"max {ordered[-1]:.3f} s over {len(ordered)} steps")


def report_writes(writes: dict[str, list]) -> None:
    print(f"\n(1) the trainer's write per step (step_rows + write_step), {load()}")
    budget = 0.02 * ASSUMED_STEP_S
    print(f"    assumed step of the paper's profile on a GPU: {ASSUMED_STEP_S:.0f} s (Table 8: ~530 s for 256 x 8 "
          f"rollouts, a 512-rollout step a quarter); 2 % of it is {budget:.2f} s; aim {WRITE_TARGET_S:.1f} s")
    labels = {"images": "steps writing new images (first epoch)",
              "summaries": f"steps refreshing the summaries (every {summary.EVERY})", "": "other steps"}
    for method, rows in writes.items():
        for kind, label in labels.items():
            seconds = [s for _, s, what in rows if what == kind]
            if seconds:
                worst = max(seconds)
                print(f"    {method:<7} {label:<40} {spread(seconds)}  "
                      f"{'ok' if worst <= WRITE_TARGET_S else 'OVER the aim' if worst <= budget else 'OVER 2 %'}")


def report_disk(root: Path, run_ids: dict[str, str]) -> None:
    import pyarrow.parquet as pq

    print(f"\n(2) disk, {load()}")
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    print(f"    whole store {total / 1e9:.2f} GB ({len(run_ids)} runs, compacted .duckdb files included)")
    for method, run_id in run_ids.items():
        run_dir = store.layout.run_dir(root, run_id)
        rollouts = len(store.read_rollouts(root, run_id, columns=["rollout_id"]))
        sizes = {d.name: sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
                 for d in run_dir.iterdir() if d.is_dir()}
        compacted = store.layout.compact_file(root, run_id)
        sizes["<run>.duckdb (compact)"] = compacted.stat().st_size if compacted.exists() else 0
        parquet = sum(v for k, v in sizes.items() if not k.startswith("<run>"))
        print(f"    {method}: {rollouts:,} rollouts; Parquet {parquet / 1e9:.2f} GB = {parquet / max(rollouts, 1):,.0f} "
              f"bytes a rollout; " + ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in sorted(sizes.items(),
                                                                                        key=lambda kv: -kv[1])))
        columns: dict[str, int] = {}
        files = store.layout.table_files(root, run_id, "rollouts")
        for path in files[:: max(1, len(files) // 20)]:  # a sample of 20 steps
            metadata = pq.ParquetFile(path).metadata
            for group in range(metadata.num_row_groups):
                for column in range(metadata.num_columns):
                    chunk = metadata.row_group(group).column(column)
                    name = chunk.path_in_schema.split(".")[0]
                    columns[name] = columns.get(name, 0) + chunk.total_compressed_size
        share = sum(columns.values())
        print("      rollouts files by column (20 sampled steps): " + ", ".join(
            f"{k} {100 * v / share:.0f} %" for k, v in sorted(columns.items(), key=lambda kv: -kv[1])[:6]))


@contextlib.contextmanager
def summaries_aside(root: Path):
    """The store as it was before summary files (2026-12-06): each run's summary folder renamed away meanwhile."""
    folders = [store.layout.run_dir(root, run_id) / summary.FOLDER for run_id in store.list_runs(root)]
    moved = [folder for folder in folders if folder.is_dir()]
    aside = f"{summary.FOLDER}-aside"
    for folder in moved:
        folder.rename(folder.with_name(aside))
    try:
        yield
    finally:
        for folder in moved:
            folder.with_name(aside).rename(folder)


def cold_call(fn) -> float:
    """Seconds of `fn()` right after the store's per-process caches are cleared."""
    from fastrl_core.store import readers

    readers._table_cache.clear()
    readers._images_cache.clear()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed(fn, root: Path, repeat: int = 3) -> tuple[float, float, float]:
    """(cold: the first call after the store's per-process caches are cleared, warm: median of `repeat` more,
    cold from the step files alone: the summary files set aside)."""
    with summaries_aside(root):
        without = cold_call(fn)
    cold = cold_call(fn)
    warm = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - start)
    return cold, statistics.median(warm), without


def report_reads(root: Path, run_ids: dict[str, str], repeat: int) -> None:
    import pyarrow.parquet as pq

    from fastrl_app.analysis import map_steps
    from fastrl_app.projection import pca_2d

    run_id = run_ids.get("fastrl") or next(iter(run_ids.values()))
    steps = store.read_steps(root, run_id)
    last = int(steps["step"].iloc[-1])
    rollout_ids = store.read_rollouts(root, run_id, step=last, columns=["rollout_id", "image_ref"])
    rollout, image = rollout_ids["rollout_id"].iloc[-1], rollout_ids["image_ref"].iloc[0]
    prompt = store.read_groups(root, run_id, step=last)["prompt_id"].iloc[0]
    mapped = map_steps(steps, 8192)
    step_file = str(store.layout.step_file(root, run_id, "rollouts", last))
    token_columns = [c for c in ("token_text", "token_logprob") if c in pq.ParquetFile(step_file).schema_arrow.names]

    def embedding_map():
        meta, matrix = store.read_sketches(root, run_id, steps=mapped, limit=8192)
        return pca_2d(matrix)

    queries = {
        "read_runs (Runs page; every run's steps rows)": lambda: store.read_runs(root),
        "read_steps (one run)": lambda: store.read_steps(root, run_id),
        "read_groups, every step (Budget heatmap, timeline)": lambda: store.read_groups(root, run_id),
        "read_reason_counts (Budget: why left out)": lambda: store.read_reason_counts(root, run_id),
        "read_groups, one step": lambda: store.read_groups(root, run_id, step=last),
        "read_rollouts, one step (Rollouts page)": lambda: store.read_rollouts(root, run_id, step=last),
        "read_rollouts, one prompt of one step": lambda: store.read_rollouts(root, run_id, step=last, prompt_id=prompt),
        "read_tokens, one rollout (token view)": lambda: store.read_tokens(root, run_id, last, rollout),
        "  the same step's tokens read whole (the old token view)": lambda: pq.read_table(step_file,
                                                                                           columns=token_columns),
        f"embedding map sample: read_sketches of {len(mapped)} of {len(steps)} steps + PCA":
            embedding_map,
        "read_image, one of the run's (cold: indexes its images files)": lambda: store.read_image(root, run_id, image),
        "latest_step + run_version (every page, every rerun)":
            lambda: (store.latest_step(root, run_id), store.run_version(root, run_id)),
    }
    print(f"\n(3) store reads on the {run_id} run ({len(steps)} steps), cold (the store's per-process caches "
          f"cleared; OS file cache warm) / warm (median of {repeat}) / cold from the step files alone (the run's "
          f"summary files set aside, as before they existed), {load()}")
    width = max(map(len, queries))
    for name, fn in queries.items():
        cold, warm, without = timed(fn, root, repeat)
        print(f"    {name:<{width}}  cold {cold:7.3f} s  warm {warm:7.3f} s  without summaries {without:7.3f} s")


def report_maintenance(root: Path, run_ids: dict[str, str]) -> None:
    print(f"\n(4) `fastrl store check` and `fastrl store compact` (the functions they run), {load()}")
    start = time.perf_counter()
    damage = store.check_store(root)
    print(f"    check_store(store): {time.perf_counter() - start:.1f} s, {len(damage)} damaged files "
          f"(reads every file of every run whole)")
    run_id = run_ids.get("fastrl") or next(iter(run_ids.values()))
    seconds = cold_call(lambda: store.write_summaries(root, run_id))
    print(f"    write_summaries({run_id}) from the step files alone (after copying a store): {seconds:.1f} s")
    start = time.perf_counter()
    path = store.compact(root, run_id)
    print(f"    compact({run_id}): {time.perf_counter() - start:.1f} s -> {path.stat().st_size / 1e9:.2f} GB")


def report_pages(root: Path, run_ids: dict[str, str], repeats: int, port: int) -> None:
    from playwright.sync_api import sync_playwright

    from fastrl_app.launch import serve
    from bench_pages import CHROMIUM, floor_times, time_page

    run_id = run_ids.get("fastrl") or next(iter(run_ids.values()))
    steps = store.read_steps(root, run_id)
    first, last = int(steps["step"].iloc[0]), int(steps["step"].iloc[-1])
    prompt = store.read_groups(root, run_id, step=last)["prompt_id"].iloc[0]
    pages = {
        "runs": "runs",
        "budget": f"budget?run={run_id}",
        "rollouts (a group)": f"rollouts?run={run_id}&step={last}&prompt={prompt}",
        "rollouts (every prompt, a page)": f"rollouts?run={run_id}&step={last}&prompt=all",
        "embeddings (last 5 steps)": f"embeddings?run={run_id}",
        "embeddings (whole run, sampled)": f"embeddings?run={run_id}&steps={first}-{last}",
        "demo": f"demo?run={run_id}",
    }
    print(f"\n(5) pages in headless Chromium, until the whole page is drawn (bench_pages.READY): cold = the first "
          f"load after a fresh app start, warm = median [min, max] of {repeats} reloads, and cold again from the "
          f"step files alone (summary files set aside); targets <= 5 s cold, <= 2 s warm; {load()}")

    def fresh_app_loads(url: str, reloads: int) -> list[float]:
        app = serve(root, port=port, timeout=120)
        try:
            return [time_page(browser, url) for _ in range(1 + reloads)]
        finally:
            app.terminate()
            app.wait(30)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        cold, warm = floor_times(browser, repeats, port + 1)
        print(f"    {'floor: a title and one small chart':<34} cold {cold:5.2f} s  warm "
              f"{statistics.median(warm):5.2f} s [{min(warm):.2f}, {max(warm):.2f}]  (benchmarks/floor_page.py, "
              "the same Streamlit and browser)", flush=True)
        for name, path in pages.items():
            url = f"http://127.0.0.1:{port}/{path}"
            cold, *warm = fresh_app_loads(url, repeats)
            with summaries_aside(root):
                without = fresh_app_loads(url, 0)[0]
            verdict = "ok" if cold <= 5 and statistics.median(warm) <= 2 else "OVER"
            print(f"    {name:<34} cold {cold:5.2f} s  warm {statistics.median(warm):5.2f} s [{min(warm):.2f}, "
                  f"{max(warm):.2f}]  {verdict:<4}  without summaries: cold {without:5.2f} s", flush=True)
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="the store (built there when it has no runs)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the real run's size (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="steps, overriding --scale's")
    parser.add_argument("--repeats", type=int, default=3, help="warm repeats of each read and page")
    parser.add_argument("--no-pages", action="store_true", help="skip (5), the browser")
    parser.add_argument("--port", type=int, default=8598)
    args = parser.parse_args(argv)
    scale = Scale.of(args.scale, args.steps)
    print(f"{load()}\nrun size: {scale.steps} steps x {scale.prompts} prompts x {ROLLOUTS_PER_PROMPT} = {scale.rollouts} "
          f"rollouts a step (GRPO; FastRL's budget samples fewer), ~{scale.tokens} tokens a completion, "
          f"{scale.problems:,} problems ({IMAGE_SIDE}x{IMAGE_SIDE} PNGs), {SKETCH_DIM}-dim sketches")
    if store.read_runs(args.store).empty:
        started = time.perf_counter()
        writes = build(args.store, scale)
        print(f"built {args.store} in {time.perf_counter() - started:.0f} s")
        report_writes(writes)
    else:
        print(f"reusing the store in {args.store} ((1), the writes, needs a fresh build: an empty --store)")
    runs = store.read_runs(args.store)
    run_ids = {metrics.BENCH_NAME.match(name)["method"]: run_id for name, run_id in zip(runs["name"], runs["run_id"])
               if metrics.BENCH_NAME.match(str(name))}
    report_disk(args.store, run_ids)
    report_reads(args.store, run_ids, args.repeats)
    report_maintenance(args.store, run_ids)
    if not args.no_pages:
        report_pages(args.store, run_ids, args.repeats, args.port)
    print(f"\n{load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
