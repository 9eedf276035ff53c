"""Named recipes (`fastrl_core/configs/methods.yaml`, `shipped.METHODS_FILE`): a method name -> the config overrides that make it, read by
`fastrl bench --methods`, `fastrl train --method` and `fastrl demo`."""

from __future__ import annotations

from pathlib import Path

import yaml

from fastrl_core.shipped import METHODS_FILE


def load_methods(path: str | Path = METHODS_FILE) -> dict[str, list[str]]:
    """{name: ["key=value", ...]} in file order; a bad file raises ValueError naming the file and the method."""
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: cannot read the method recipes ({' '.join(str(error).split())})") from None
    if not isinstance(loaded, dict) or not loaded:
        raise ValueError(f"{path}: expected a mapping of method name -> list of key=value overrides")
    for name, overrides in loaded.items():
        if not isinstance(name, str) or not isinstance(overrides, list) or not all(
                isinstance(item, str) and "=" in item and not item.startswith("=") for item in overrides):
            raise ValueError(f"{path}: method {name!r} must be a list of key=value overrides, got {overrides!r}")
    return {name: list(overrides) for name, overrides in loaded.items()}


METHODS: dict[str, list[str]] = load_methods()
