"""A run's config history: the changes a resume was explicitly allowed to make (`fastrl train --resume RUN
--allow-change KEY`), each from the step it applies to. Pure functions over the lists kept in run.json:

    "config":         the config in force now (after every change below)
    "config_history": [{"step": 40, "changes": {"lr": {"from": 0.0002, "to": 0.001}}, "time": "2026-12-06T..."}]

Steps before an entry's step ran with its "from" values, steps from it on with its "to" values (`config_at`). A
resume from an earlier checkpoint re-runs the steps after it under the config in force now, so the changes recorded
after that step move to it (`fold_after`).
"""

from __future__ import annotations

import copy


def _merged(older: dict, newer: dict) -> dict:
    """Two entries' changes as one: each key from its first "from" to its last "to"; keys back where they were
    are left out."""
    out = {key: dict(change) for key, change in older.items()}
    for key, change in newer.items():
        out[key] = {"from": out[key]["from"] if key in out else change["from"], "to": change["to"]}
    return {key: change for key, change in out.items() if change["from"] != change["to"]}


def fold_after(history: list[dict], step: int) -> list[dict]:
    """`history` after a resume from `step`: the entries recorded after `step` become one entry at `step`."""
    kept = [entry for entry in history if entry["step"] <= step]
    later = [entry for entry in history if entry["step"] > step]
    if not later:
        return list(history)
    changes: dict = {}
    for entry in later:
        changes = _merged(changes, entry["changes"])
    return with_change(kept, step, changes, later[-1]["time"])


def with_change(history: list[dict], step: int, changes: dict, time: str) -> list[dict]:
    """`history` plus `changes` ({key: {"from", "to"}}) from `step` (folded into an entry of the same step)."""
    history = fold_after(history, step)
    if history and history[-1]["step"] == step:
        changes = _merged(history[-1]["changes"], changes)
        history = history[:-1]
    return history + ([{"step": step, "changes": changes, "time": time}] if changes else [])


def config_at(config: dict, history: list[dict], step: int) -> dict:
    """The config in force at `step`, from the config in force now and its history."""
    out = copy.deepcopy(config)
    for entry in reversed(history):
        if entry["step"] > step:
            for key, change in entry["changes"].items():
                out[key] = copy.deepcopy(change["from"])
    return out
