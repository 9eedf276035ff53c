"""Training configuration: dataclass defaults <- YAML file <- `key=value` overrides (EasyR1 style).

Every field carries its help text; `fastrl train --help` prints them. Dict-valued fields (the
objective's, pruner's and budget controller's own keyword arguments) take dotted overrides such as
`objective_args.beta=0.01`. An unknown key is rejected with the list of valid names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


def option(default: Any, help: str) -> Any:
    """A dataclass field carrying its help text (CLI help comes from it)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # -- run and store
    run_name: str = option("fastrl", "name of the run in the store (a timestamp is appended for the run id)")
    store_dir: str = option("runs", "store directory: Parquet step files, DuckDB views, images, checkpoints")
    seed: int = option(0, "seed for data order, sampling, sketches and pruning")
    threads: int = option(2, "torch CPU threads (more than physical cores is ~2x slower)")
    # -- model and data
    model: str = option("embedded", "'embedded' (the shipped tiny Qwen2.5-VL warm start), a hub name or a local path")
    engine: str = option("hf", "rollout engine: 'hf' (transformers generate, CPU or GPU) or 'vllm' (GPU only)")
    device: str = option("cpu", "device of the policy and the update: 'cpu' or 'cuda'")
    dataset: str = option("synthetic", "'synthetic' (embedded geometry task), a problems.jsonl folder, a Parquet/JSONL file or a hub dataset")
    train_split: str = option("train", "split used for training")
    test_split: str = option("test", "split used for evaluation")
    synthetic_train: int = option(2048, "synthetic dataset: training problems")
    synthetic_test: int = option(256, "synthetic dataset: test problems")
    synthetic_kinds: list = option([], "synthetic dataset: task kinds to include, e.g. [count_dots, longest_segment] "
                                   "([] = every kind; weights from synthetic.DEFAULT_MIX)")
    synthetic_levels: list = option([], "synthetic dataset: difficulty levels to include, e.g. [1] ([] = every level)")
    template: str = option("math", "prompt template: 'math' (<think> then \\boxed{}) or 'r1v' (<answer> tags)")
    # -- sampling
    steps: int = option(100, "training steps (one rollout batch and updates_per_step optimiser updates each)")
    time_limit_s: float = option(0.0, "stop after this many seconds of training (0 = no limit)")
    prompts_per_step: int = option(16, "prompts sampled per step")
    rollouts_per_prompt: int = option(8, "initial rollouts per prompt (n0); the budget controller may change it per prompt")
    max_new_tokens: int = option(32, "maximum completion length in tokens")
    temperature: float = option(1.0, "sampling temperature")
    # -- reward and advantage
    format_weight: float = option(0.5, "reward weight of the format part (<think>...</think> then the final answer)")
    accuracy_weight: float = option(1.0, "reward weight of the accuracy part")
    advantage: str = option("group_normalized", "advantage estimator: group_normalized (GRPO), mean_only (Dr.GRPO), batch_scaled")
    # -- objective and optimiser
    objective: str = option("grpo", "policy loss: grpo, dapo, gspo, gspo_token, dr_grpo")
    objective_args: dict = option({}, "keyword arguments of the policy loss, e.g. epsilon, epsilon_high, beta")
    lr: float = option(5e-4, "AdamW learning rate (NOTES: 5e-4 for the tiny model; ~1e-6 for 7B models)")
    warmup_steps: int = option(5, "linear learning-rate warmup steps")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(1.0, "gradient clipping norm")
    updates_per_step: int = option(1, "optimiser updates per rollout batch: kept rollouts are split into PPO "
                                   "mini-batches (EasyR1/verl: rollout batch / global batch; the paper uses 4)")
    minibatch_mode: str = option("equal_updates", "how pruning sizes mini-batches: 'equal_updates' (always "
                                 "updates_per_step mini-batches, smaller when pruned: the authors' script) or "
                                 "'fixed_size' (mini-batch = prompts_per_step*rollouts_per_prompt/updates_per_step "
                                 "rows, so a pruned step makes fewer updates)")
    recompute_old_logprobs: bool = option(False, "recompute old log-probs with the training model on kept rollouts "
                                             "(needed when the rollout engine's numerics differ, e.g. vLLM)")
    # -- FastRL
    sketch: str = option("lm_head", "gradient sketch: lm_head, logprob, tokens")
    sketch_dim: int = option(256, "gradient sketch dimension")
    sketch_top_k: int = option(64, "vocabulary entries (top-K probabilities plus the sampled token) used by the sketch; "
                               "0 = the whole vocabulary (exact, and cheapest for small vocabularies)")
    pruner: str = option("fastrl", "rollout pruner: none, dapo_filter, cppo, pods, fastrl_official, fastrl")
    pruner_args: dict = option({}, "keyword arguments of the pruner")
    keep_ratio: float = option(0.5, "largest fraction of each group the pruner keeps")
    min_keep: int = option(2, "smallest number of rollouts kept in a group with informative rollouts")
    budget: str = option("adaptive", "rollout budget controller: fixed, rollout_sa, adaptive")
    budget_args: dict = option({}, "keyword arguments of the budget controller")
    # -- evaluation and checkpoints
    eval_every: int = option(10, "evaluate greedy accuracy on the test split every N steps (0 = never)")
    eval_size: int = option(256, "test problems used per evaluation")
    checkpoint_every: int = option(25, "save a resumable checkpoint every N steps (0 = only at the end)")
    log_rollouts: bool = option(True, "store every rollout's text and sketch (the dashboard's rollout and map pages)")


def field_help() -> dict[str, str]:
    return {f.name: f.metadata["help"] for f in dataclasses.fields(TrainConfig)}


def _coerce(value: Any, like: Any, key: str, source: str) -> Any:
    """Check `value` against the type of the default `like` (ints are accepted for floats)."""
    if isinstance(like, float) and isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            pass
    if isinstance(like, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(like, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if type(value) is not type(like):
        raise ValueError(f"{source}: {key} expects {type(like).__name__}, got {value!r}")
    return value


def merge(values: dict, updates: dict, *, source: str) -> dict:
    """Return a copy of `values` updated from `updates`; unknown keys and wrong types raise naming `source`."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    for key, value in updates.items():
        head, _, sub = key.partition(".")
        if head not in out:
            raise KeyError(f"{source}: unknown config key {head!r}; valid keys: {', '.join(sorted(out))}")
        if sub:
            if not isinstance(out[head], dict):
                raise KeyError(f"{source}: {head!r} has no sub-keys (got {key!r})")
            out[head][sub] = value
        elif isinstance(out[head], dict):
            out[head] = dict(_coerce(value, out[head], key, source))
        else:
            out[head] = _coerce(value, out[head], key, source)
    return out


def parse_overrides(overrides: list[str]) -> dict:
    """`["a=1", "b.c=x"]` -> `{"a": 1, "b.c": "x"}` with YAML-typed values."""
    parsed = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"command line: override {item!r} is not key=value")
        parsed[key] = yaml.safe_load(text) if text else ""
    return parsed


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> TrainConfig:
    """Defaults <- YAML file <- `key=value` overrides."""
    values = dataclasses.asdict(TrainConfig())
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping of config keys, got {type(loaded).__name__}")
        values = merge(values, loaded, source=str(path))
    values = merge(values, parse_overrides(list(overrides)), source="command line")
    return TrainConfig(**values)
