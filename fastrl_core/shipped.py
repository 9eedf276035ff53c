"""What the package ships beside its code, read through `importlib.resources`; every path to it is defined here.

    fastrl_core/configs/<name>.yaml     the training configs (`fastrl train paper` or a path to any YAML file)
    fastrl_core/configs/methods.yaml    the named method recipes (`fastrl_core.methods`)
    fastrl_core/models/embedded/        the embedded tiny Qwen2.5-VL's warm start (`model=embedded`)

They are package data (pyproject.toml), so an installed wheel reads them from its own folder whatever the working
directory is. The package must be installed as files (pip's default; a zipped package has no path to give a model
loader).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _path(*parts: str) -> Path:
    resource = files("fastrl_core").joinpath(*parts)
    if not isinstance(resource, Path):  # a zip import: transformers and the YAML reader need a file on disk
        raise RuntimeError(f"fastrl_core is not installed as files, so {'/'.join(parts)} has no path")
    return resource


CONFIGS_DIR = _path("configs")
METHODS_FILE = CONFIGS_DIR / "methods.yaml"
EMBEDDED_MODEL = _path("models", "embedded")
EMBEDDED = "embedded"  # the `model` value that names EMBEDDED_MODEL
NAMED_PREFIX = "embedded-"  # `embedded-<preset>`: a warm start built on first use (fastrl_core.named_models)


def config_names() -> list[str]:
    """The shipped training configs by name (`demo`, `embedded`, `paper`, ...): every YAML file but the recipes."""
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.yaml") if path != METHODS_FILE)


def config_path(config: str | Path) -> Path:
    """`config` as a file: a shipped config's name (`paper`) gives its file in the package; anything else is a path
    as given (checked by whoever reads it)."""
    if isinstance(config, str) and config in config_names():
        return CONFIGS_DIR / f"{config}.yaml"
    return Path(config)


def model_path(model: str) -> Path:
    """`model` as a folder: `embedded` gives the shipped warm start, anything else is a path as given. A named model
    (`embedded-<preset>`) is not shipped: `fastrl_core.named_models.model_path` finds (or builds) its folder."""
    if model.startswith(NAMED_PREFIX):
        raise ValueError(f"{model!r} is a named model, built on first use: pass "
                         f"fastrl_core.named_models.model_path({model!r}) (its folder, built if need be)")
    return EMBEDDED_MODEL if model == EMBEDDED else Path(model)
