"""Models a config names instead of giving a path.

- `embedded`: the tiny Qwen2.5-VL warm start the package ships (`fastrl_core.shipped`; text hidden 128, 2 layers).
- `embedded-<preset>`: a warm start too large to ship, made by `fastrl_core.warmstart` from the recipe
  `PRESETS[preset]` (the `WarmstartArgs` it changes), either by `fastrl warmstart --preset <preset>` (`main`) or by
  the first `model_path("embedded-<preset>")` (the trainer and `fastrl eval` call it, so `fastrl train` / `fastrl
  bench` with `model: embedded-<preset>` build it before their first step, with one line saying so).
  `policy.load_policy` takes the folder `model_path` returns, never the name. The recipe is deterministic by its
  seed on one machine and library version, so building it on first use changes no result; it is only slow once.

Where it is kept: `cache_root()/warmstart/<preset>-<key>/`, key = the first 12 hex digits of the SHA-256 of the
recipe's arguments (every `WarmstartArgs` field but `out` and `data_dir`): a changed recipe builds a new folder
instead of loading a stale model. `cache_root()` is `$XDG_CACHE_HOME/fastrl`, else `~/.cache/fastrl` (the user
cache folder pip and Hugging Face use too); the synthetic data a recipe trains on goes to `cache_root()/data/`.
A build is written to a temporary folder beside its final one and renamed into place when whole, under an
exclusive lock (`<folder>.lock`, freed by the OS if the process dies): a second process waits for the first's
build and then loads it, and a killed build leaves nothing that could be mistaken for a model.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fastrl_core.shipped import EMBEDDED, EMBEDDED_MODEL
from fastrl_core.shipped import NAMED_PREFIX as PREFIX
from fastrl_core.shipped import model_path as shipped_model_path

# Recipes of the warm starts built on first use (WarmstartArgs fields they change), and the build time measured for
# each (BUILD_MINUTES), which the line printed before a build gives.
PRESETS: dict[str, dict] = {
    # paper-wide.yaml's policy: text hidden 512, 4 layers (policy.WIDE_WIDTHS), the shipped tokenizer and processor,
    # 60 supervised steps on that config's task (count_dots + longest_segment), keeping the evaluated checkpoint with
    # the best T=1 accuracy whose greedy accuracy lies in [0.30, 0.55]: it chose step 60, greedy 0.312 and T=1 0.379
    # on its test split (chance 0.31): half-known, so GRPO has a gain to make (the config's header has its curve).
    "wide": {"widths": "wide", "tokenizer": "embedded", "kinds": "count_dots,longest_segment", "lr": 5e-4,
             "eval_every": 10, "max_steps": 60, "band_low": 0.30, "band_high": 0.55},
}
BUILD_MINUTES = {"wide": "3.7 min on a quiet 2-core machine, 48 min on one busy with other jobs"}


def cache_root() -> Path:
    """The user cache folder of FastRL: `$XDG_CACHE_HOME/fastrl`, else `~/.cache/fastrl`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastrl"


def preset_of(model: str) -> str | None:
    """`"embedded-wide"` -> `"wide"`; None for `embedded`, a hub name or a path. Raises ValueError for an
    `embedded-<name>` that names no preset, listing the named models."""
    model = str(model)
    if not model.startswith(PREFIX):
        return None
    preset = model.removeprefix(PREFIX)
    if preset not in PRESETS:
        raise ValueError(f"{model!r} names no warm start; named models: {', '.join(named_models())}")
    return preset


def named_models() -> list[str]:
    return [EMBEDDED, *(PREFIX + name for name in PRESETS)]


def preset_args(preset: str, **overrides):
    """The preset's `WarmstartArgs` (under `overrides`), `out` and `data_dir` in the cache (`preset_dir`)."""
    from fastrl_core.warmstart import WarmstartArgs

    fields = {f.name for f in dataclasses.fields(WarmstartArgs)}
    unknown = sorted(set(overrides) - fields)
    if preset not in PRESETS or unknown or {"out", "data_dir"} & set(overrides):
        raise ValueError(f"warm start preset {preset!r} with {sorted(overrides)}: presets are {', '.join(PRESETS)}; "
                         f"out and data_dir are the cache's, and every other override a WarmstartArgs field")
    args = WarmstartArgs(**{**PRESETS[preset], **overrides})
    return dataclasses.replace(args, out=str(preset_dir(preset, args)), data_dir=str(cache_root() / "data"))


def recipe_key(args) -> str:
    """12 hex digits naming a recipe: SHA-256 of its arguments without `out` and `data_dir`."""
    recipe = {k: v for k, v in dataclasses.asdict(args).items() if k not in ("out", "data_dir")}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def preset_dir(preset: str, args=None) -> Path:
    """Where the preset's warm start (under `args`, default the preset's own) is kept."""
    args = preset_args(preset) if args is None else args
    return cache_root() / "warmstart" / f"{preset}-{recipe_key(args)}"


def ensure_preset(preset: str, *, log: Callable[[str], None] = print, progress: bool = True, **overrides) -> Path:
    """The folder of the preset's warm start, built first if it is not in the cache (module docstring); `log` gets
    one line before a build and one after it."""
    from fastrl_core.warmstart import warmstart

    args = preset_args(preset, **overrides)
    final = Path(args.out)
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building it: wait, then find it built
        if (final / "config.json").is_file():
            return final
        log(f"model {PREFIX}{preset} is not in the cache yet: building it now (`fastrl warmstart --preset {preset}`, "
            f"{BUILD_MINUTES.get(preset, 'time not measured')}; once) into {final}")
        started = time.perf_counter()
        building = final.parent / f".{final.name}.building"
        shutil.rmtree(building, ignore_errors=True)  # what a killed build left
        try:
            warmstart(dataclasses.replace(args, out=str(building)), progress=progress)
            os.replace(building, final)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        log(f"built {PREFIX}{preset} in {(time.perf_counter() - started) / 60:.1f} min: {final}")
    return final


def text_config_value(preset: str, key: str) -> int | None:
    """A text-config value (`hidden_size`, `vocab_size`, ...) of the preset's model without building it: from its
    widths, the vocabulary from the shipped tokenizer's model when the recipe takes that tokenizer; None if unknown."""
    from fastrl_core.policy import WIDTHS

    args = preset_args(preset)
    value = getattr(WIDTHS[args.widths], key, None)
    if value is None and key == "vocab_size" and args.tokenizer == "embedded":
        value = json.loads((EMBEDDED_MODEL / "config.json").read_text())["text_config"]["vocab_size"]
    return value if isinstance(value, int) else None


def model_path(model: str) -> Path | str:
    """What `policy.load_policy` loads for a config's `model`: the (built if need be) cache folder for
    `embedded-<preset>`, else `model` itself (`embedded`, a hub name or a path)."""
    preset = preset_of(model)
    return ensure_preset(preset) if preset else model


def model_config_value(model: str, key: str = "hidden_size") -> int | None:
    """The text hidden size (or another text-config `key`, e.g. "vocab_size") from a local checkpoint's
    config.json ("embedded": the shipped warm start; "embedded-<preset>": its cache folder, or its recipe's widths
    before it is built), without loading weights; None for a hub name (a config check downloads nothing) or a
    config without one. What `engine=auto` reads (`engines.resolve.choose_engine`)."""
    preset = preset_of(model)
    root = preset_dir(preset) if preset else shipped_model_path(model)
    if preset and not (root / "config.json").is_file():
        return text_config_value(preset, key)
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    size = text.get(key, config.get(key))
    return int(size) if isinstance(size, int) else None


def main(argv: list[str] | None = None) -> int:
    """`fastrl warmstart`: `--preset NAME` builds a named recipe into the user cache (nothing when it is there
    already; other flags change the recipe, and so its folder); without it, `fastrl_core.warmstart.main`."""
    from fastrl_core.warmstart import parser as warmstart_parser
    from fastrl_core.warmstart import WarmstartArgs, warmstart

    parser = warmstart_parser()
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="build a named recipe (fastrl_core.named_models.PRESETS) into the user cache, where "
                             "model=embedded-<preset> finds it; nothing is done when it is there already. Other flags "
                             "change the recipe (and so its cache folder); --out and --data-dir are the cache's")
    given = vars(parser.parse_args(argv))
    preset = given.pop("preset")
    if preset is None:
        warmstart(WarmstartArgs(**given))
        return 0
    try:
        built = (Path(preset_args(preset, **given).out) / "config.json").is_file()
    except ValueError as error:
        parser.error(str(error))
    folder = ensure_preset(preset, **given)
    print(f"{PREFIX}{preset}: " + ("already built, in " if built else "") + str(folder))
    return 0
