"""A run's config, resolved once: `load_config` reads the options (`fastrl_core.config`), checks them and decides
everything they leave open before any model, dataset or store is touched. The result is a `RunConfig`, which the
trainer takes as it is and checks no more.

Everything is read from the code at call time, never from a list kept here, so a pruner, budget controller,
loss or config key added elsewhere is checked the same way:

- names (`objective`, `advantage`, `pruner`, `budget`, `sketch`, `engine`, `template`) against their registries;
- the keys of `objective_args`, `pruner_args`, `budget_args` against the keyword parameters of the registered
  function / controller init (`inspect.signature`, minus those the trainer passes itself), and their values
  against the parameters' annotations (or the default's type);
- the argument values the way the code itself checks them: `budget_init` and a one-token `policy_loss` dry run
  (both pure and cheap), so a range rule lives in one place, next to the code that needs it;
- each `TrainConfig` field's `bounds` and its sane upper bound (`UPPER_BOUNDS`, config.py), and finiteness;
  `device`;
- the engine / sketch combination (`fastrl_core.engines.resolve.resolve_sketch`): the sketch kind the run computes,
  and `engine` and `recompute_old_logprobs` auto resolved (where the old log-probs come from: the engine's own
  behaviour log-probs, or a recomputation by the trainer's forward);
- `model` and `dataset` given as local paths that do not exist, and `model` naming no warm start
  (`embedded-<preset>`, fastrl_core.named_models);
- `store_dir` not empty, and `synthetic_kinds` / `synthetic_levels` naming kinds and levels the synthetic task has;
- `max_text_chars` auto resolved from the model's context (`model_context`, `data.problems.text_limit`).

`check_environment` is the machine-side part (vLLM installed, a CUDA device visible), run by the trainer.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fastrl_core.config import (UPPER_BOUNDS, ConfigError, TrainConfig, allowed_types, choices, coerce, describe_range,
                                 in_bounds, read_config)


@dataclass
class RunConfig(TrainConfig):
    """A `TrainConfig` checked and resolved for one run (`load_config`, `resolve_config`): every value coerced to its
    type, `engine` and `recompute_old_logprobs` decided (no "auto" left), and what the options imply, decided here
    once. The trainer takes it as it is. Derive another run's with `resolve_config(dataclasses.replace(...))`.
    `options()` leaves the resolved facts out (the store records the options).

    sketch_kind: the sketch the run computes (`engines.resolve.resolve_sketch`); None when the pruner reads none."""

    sketch_kind: str | None = field(default=None, kw_only=True)


def _keyword_parameters(fn: Callable, exclude: set[str]) -> tuple[dict[str, inspect.Parameter], bool]:
    """(keyword parameters of `fn` a config may set, whether it also takes **kwargs)."""
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, SyntaxError):  # an annotation that does not evaluate: names only
        signature = inspect.signature(fn)
    params = {p.name: p for p in signature.parameters.values() if p.name not in exclude and (
        p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty)}
    return params, any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


def argument_parameters(key: str, name: str) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword parameters `<key>` (objective_args, pruner_args, budget_args) may set for registry entry
    `name`, and whether the entry takes any keyword (**kwargs)."""
    if key == "objective_args":
        from fastrl_core.algo.objectives import NOT_HYPERPARAMETERS, clipped_loss, hyperparameters

        settable = set(hyperparameters(name))  # raises naming the losses for an unknown name
        params, var_keyword = _keyword_parameters(clipped_loss, NOT_HYPERPARAMETERS)
        return {k: p for k, p in params.items() if k in settable}, var_keyword
    if key == "pruner_args":
        from fastrl_core.algo.pruners import PRUNERS, prune

        passed = {p.name for p in inspect.signature(prune).parameters.values() if p.kind is p.KEYWORD_ONLY}
        return _keyword_parameters(PRUNERS.get(name).prune, passed)  # prune() passes keep_ratio, min_keep, generator
    if key == "budget_args":
        from fastrl_core.algo.budgets import BUDGETS

        return _keyword_parameters(BUDGETS.get(name).init, {"n"})  # n is the trainer's rollouts_per_prompt
    raise KeyError(key)


ARGUMENT_KEYS = {"objective_args": ("objective", "policy loss"), "pruner_args": ("pruner", "pruner"),
                 "budget_args": ("budget", "budget controller")}


def _check_value(value: Any, param: inspect.Parameter, key: str, where: str) -> Any:
    """`value` checked (and int -> float coerced) against the parameter's annotation, or its default's type."""
    annotation = param.annotation
    if typing.get_origin(annotation) is typing.Literal:
        options = typing.get_args(annotation)
        if value not in options:
            raise ConfigError(f"{where}{key}={value!r}: choose one of {list(options)}")
        return value
    allowed = None if annotation is param.empty or isinstance(annotation, str) else allowed_types(annotation)
    if allowed is None and param.default is not param.empty and param.default is not None:
        allowed = (type(param.default),)
    return value if allowed is None else coerce(value, allowed, key, where)


def _check_arguments(config: TrainConfig, key: str, where: Callable[[str], str]) -> dict:
    name_key, kind = ARGUMENT_KEYS[key]
    name = getattr(config, name_key)
    params, var_keyword = argument_parameters(key, name)
    checked = {}
    for sub, value in getattr(config, key).items():
        if sub not in params:
            if var_keyword:
                checked[sub] = value
                continue
            valid = ", ".join(sorted(params)) or "none (it takes no keyword arguments)"
            raise ConfigError(f"{where(key)}{key}.{sub}: {kind} {name!r} has no parameter {sub!r}; valid: {valid}")
        checked[sub] = _check_value(value, params[sub], f"{key}.{sub}", where(key))
    return checked


def _check_objective_values(name: str, objective_args: dict, where: str) -> None:
    """Run the loss once on a one-token batch, called as the trainer calls it, so that the loss's own value
    checks (epsilon, beta, aggregation, ...) report a bad value now rather than after the first rollouts."""
    import torch

    from fastrl_core.algo.objectives import policy_loss

    zeros = torch.zeros(1, 1)
    try:
        policy_loss(name, zeros.clone().requires_grad_(), zeros, torch.zeros(1), torch.ones(1, 1, dtype=torch.bool),
                    ref_logprobs=zeros, rollout_weights=torch.ones(1), **objective_args)
    except (ValueError, TypeError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise ConfigError(f"{where}objective_args {objective_args}: policy loss {name!r}: {message}") from None


def _check_budget_values(name: str, n: int, budget_args: dict, where: str) -> None:
    from fastrl_core.algo.budgets import budget_init

    try:
        budget_init(name, n=n, **budget_args)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{where}budget_args {budget_args} with rollouts_per_prompt={n}: {error}") from None


def _looks_local(value: str) -> bool:
    """A path rather than a hub name ("owner/name"): absolute, starting with '.' or '~', a .jsonl/.parquet file, or
    more than two path parts."""
    path = Path(value)
    return path.is_absolute() or value.startswith((".", "~")) or path.suffix in (".jsonl", ".parquet") \
        or len(path.parts) > 2


def _check_row_cost(row_cost: float | str, pruner: str, where: Callable[..., str]) -> float | str:
    """row_cost as `check_cost_rule` takes it (with 'measured'), given as a number or a numeric string ("1e-3",
    which YAML 1.1 reads as a string); its refusal as a ConfigError prefixed with where the keys were set."""
    from fastrl_core.algo.pruners import CostRuleError, check_cost_rule

    if isinstance(row_cost, str) and row_cost != "measured":
        try:
            row_cost = float(row_cost)
        except ValueError:
            pass
    try:
        return check_cost_rule(pruner, row_cost, measured=True)
    except CostRuleError as error:
        raise ConfigError(f"{where(*error.keys)}{error}") from None


def check_source(key: str, value: str, special: str, where: str = "") -> None:
    """A model / dataset given as a local path must exist (a hub name 'owner/name' is left to the loader)."""
    if value != special and _looks_local(value) and not Path(value).expanduser().exists():
        raise ConfigError(f"{where}{key}={value!r}: no such file or folder (give {special!r}, a hub name "
                          "'owner/name' or an existing local path)")


def check_model(key: str, value: str, where: str = "") -> None:
    """A model name: `embedded`, a named warm start `embedded-<preset>` (fastrl_core.named_models), a hub name, or
    an existing local path."""
    from fastrl_core.named_models import preset_of

    try:
        preset_of(value)
    except ValueError as error:
        raise ConfigError(f"{where}{key}: {error}") from None
    check_source(key, value, "embedded", where)


def check_store_dir(value: str, where: str = "") -> None:
    """A store folder is named: an empty `store_dir` would write into whatever folder the command runs in."""
    if not str(value).strip():
        raise ConfigError(f"{where}store_dir={value!r} is empty; name the store's folder (default: runs)")


def check_synthetic(kinds: list, levels: list, where: Callable[..., str] = lambda *keys: "") -> None:
    """`synthetic_kinds` and `synthetic_levels` name kinds and levels of the synthetic task (fastrl_core.data.
    synthetic.KINDS), and leave at least one (kind, level) pair; ConfigError naming the valid ones."""
    from fastrl_core.data.synthetic import KINDS, dataset_mix

    valid_levels = sorted({level for name in KINDS.names() for level in KINDS.get(name).levels})
    for kind in kinds:
        if not isinstance(kind, str) or kind not in KINDS:
            raise ConfigError(f"{where('synthetic_kinds')}synthetic_kinds: {kind!r} is not a synthetic task kind; "
                              f"valid: {', '.join(KINDS.names())}")
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, int) or level not in valid_levels:
            raise ConfigError(f"{where('synthetic_levels')}synthetic_levels: {level!r} is not a level of the "
                              f"synthetic task; valid: {', '.join(map(str, valid_levels))}")
    try:
        dataset_mix(kinds or None, levels or None)
    except ValueError:
        has = "; ".join(f"{k}: {', '.join(map(str, KINDS.get(k).levels))}" for k in kinds)
        raise ConfigError(f"{where('synthetic_kinds', 'synthetic_levels')}synthetic_kinds={kinds} with "
                          f"synthetic_levels={levels} leaves no task: the kinds' levels are {has}") from None


def model_context(model: str) -> int | None:
    """The model's context in tokens (max_position_embeddings of its text config) from a config on this machine:
    the shipped or a named warm start's, a local checkpoint's, or a hub model's already in the Hugging Face cache;
    None otherwise (nothing is downloaded)."""
    import json

    from fastrl_core.named_models import model_config_value

    tokens = model_config_value(model, "max_position_embeddings")
    if tokens is not None or _looks_local(model) or model.count("/") != 1:
        return tokens
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
        config = json.loads(Path(cached).read_text()) if isinstance(cached, str) else {}
    except (ImportError, OSError, ValueError):
        return None
    value = (config.get("text_config") or config).get("max_position_embeddings", config.get("max_position_embeddings"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def resolve_config(config: TrainConfig, *, sources: dict[str, str] | None = None) -> RunConfig:
    """`config` checked and resolved into a `RunConfig` (argument values coerced to their parameter types, engine and
    `recompute_old_logprobs` auto decided, the sketch kind); raises ConfigError naming the key, the bad value and
    the valid ones. Touches no model, dataset or store. `sources` maps keys to where they were set (a file name or
    "command line"), for the message. Idempotent: resolve_config(resolve_config(c)) == resolve_config(c)."""
    from fastrl_core.engines.resolve import (AUTO, ENGINES, UnsupportedSketch, auto_top_k,
                                             resolve_recompute_old_logprobs, resolve_sketch, sketch_name)

    sources = sources or {}

    def where(*keys: str) -> str:
        found = [sources[k] for k in keys if k in sources]
        return f"{found[-1]}: " if found else ""

    hints, coerced = typing.get_type_hints(type(config)), {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        allowed = allowed_types(hints.get(f.name))
        if allowed is not None:
            value = coerced[f.name] = coerce(value, allowed, f.name, where(f.name))
        _check_range(f.name, value, f.metadata.get("bounds"), where(f.name))
    config = dataclasses.replace(config, **coerced)  # a TrainConfig built in code may hold an int for a float

    for key, valid in choices().items():
        value = getattr(config, key)
        if value not in valid:
            raise ConfigError(f"{where(key)}{key}={value!r} is unknown; valid: {', '.join(valid)}")

    updates = {key: _check_arguments(config, key, where) for key in ARGUMENT_KEYS}
    _check_objective_values(config.objective, updates["objective_args"], where("objective_args", "objective"))
    _check_budget_values(config.budget, config.rollouts_per_prompt, updates["budget_args"],
                         where("budget_args", "budget", "rollouts_per_prompt"))

    import torch

    if config.engine == AUTO:  # resolved here, once: one line says which engine and why
        config = dataclasses.replace(config, engine=_choose_engine(config))
    top_k = auto_top_k(config.engine, config.sketch, config.sketch_top_k)
    if top_k is not None:  # sketch=auto where sketch_top_k cannot be honoured: the engine's own, in the record
        config = dataclasses.replace(config, sketch_top_k=top_k)
    config = dataclasses.replace(config, sketch=sketch_name(config.engine, config.sketch))  # the record names it
    try:
        device = torch.device(config.device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{where('device')}device={config.device!r} is not a torch device; valid: cpu, cuda, "
                          "cuda:<index>") from None
    devices = ENGINES[config.engine].devices
    if devices is not None and device.type not in devices:
        raise ConfigError(f"{where('device', 'engine')}device={config.device!r} with engine={config.engine!r}: "
                          f"that engine needs device {' or '.join(devices)}")
    try:
        sketch_kind = resolve_sketch(config.engine, config.sketch, config.sketch_top_k, config.pruner)
    except UnsupportedSketch as error:
        raise ConfigError(f"{where('sketch', 'sketch_top_k', 'engine', 'pruner')}{error}") from None

    if config.row_cost is not None:
        updates["row_cost"] = _check_row_cost(config.row_cost, config.pruner, where)
    if config.eval_samples and not config.eval_every:
        raise ConfigError(f"{where('eval_samples', 'eval_every')}eval_samples={config.eval_samples} needs "
                          "eval_every >= 1: with eval_every=0 the run is never evaluated")
    check_model("model", config.model, where("model"))
    check_source("dataset", config.dataset, "synthetic", where("dataset"))
    check_store_dir(config.store_dir, where("store_dir"))
    check_synthetic(config.synthetic_kinds, config.synthetic_levels, where)
    if config.max_text_chars is None:
        from fastrl_core.data.problems import text_limit

        updates["max_text_chars"] = text_limit(model_context(config.model))

    updates["recompute_old_logprobs"] = resolve_recompute_old_logprobs(config.engine, config.recompute_old_logprobs)
    return RunConfig(**{**config.options(), **updates}, sketch_kind=sketch_kind)


def _check_range(key: str, value: Any, bounds: str | None, where: str) -> None:
    """A number within its field's bounds and its sane upper bound (UPPER_BOUNDS), else ConfigError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    upper = UPPER_BOUNDS.get(key)
    if bounds and not in_bounds(value, bounds) or upper is not None and not value <= upper:
        raise ConfigError(f"{where}{key}={value!r} is out of range: it must be {describe_range(key, bounds)}")


def _choose_engine(config: TrainConfig) -> str:
    """`engine=auto` -> hf or vllm by `fastrl_core.engines.resolve.choose_engine`; prints the choice and its reason."""
    import sys

    import torch

    from fastrl_core.engines.resolve import choose_engine
    from fastrl_core.named_models import model_config_value

    engine, reason = choose_engine(torch.device(config.device).type, config.sketch, config.pruner,
                                   vllm_importable=importlib.util.find_spec("vllm") is not None,
                                   hidden_size=model_config_value(config.model),
                                   vocab_size=model_config_value(config.model, "vocab_size"))
    print(f"engine=auto -> {engine}: {reason}", file=sys.stderr)
    return engine


def check_environment(config: TrainConfig) -> None:
    """What this machine must have for `config` (vLLM installed, a CUDA device); ConfigError otherwise."""
    import torch

    if config.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from fastrl_core.engines.vllm import INSTALL_HINT

        raise ConfigError(f"engine='vllm': {INSTALL_HINT}")
    if torch.device(config.device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={config.device!r}: no CUDA device is visible on this machine")


def load_config(path: str | Path | None = None, overrides: list[str] = (), *, base: dict | None = None,
                base_source: str = "the run's record") -> RunConfig:
    """The config `path` (a shipped config's name, e.g. "paper", or a YAML file; None: the defaults) under
    `key=value` overrides, over `base` (a resumed run's recorded config: `fastrl_core.config.read_config`), then
    checked and resolved by `resolve_config` (every name, sub-key, type and range, and the engine / sketch
    combination) before anything loads."""
    config, sources = read_config(path, overrides, base=base, base_source=base_source)
    return resolve_config(config, sources=sources)
