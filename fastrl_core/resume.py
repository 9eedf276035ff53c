"""Resuming a run under its own config: the run's record (the config in its run.json) is its truth.

`fastrl train [CONFIG] [key=value ...] --resume RUN [--allow-change KEY,...]`:

- `load_resume_config`: the config is the run's record, under what the config file and the command line set (so
  `fastrl train store_dir=S --resume RUN` alone continues it);
- `allowed_changes`: what differs from the record is refused in one line naming the keys, unless each was allowed
  with --allow-change; a key of FIXED_ON_RESUME is refused even then (it defines what the run is);
- the trainer records the allowed changes in the run's config history from the step it resumes at
  (`RunWriter.record_config`, `fastrl_core.store.config_history`); the dashboard shows them.

`store_dir` is not compared: it says where the store is now (a store may be moved), not what the run is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from collections.abc import Iterable
from pathlib import Path

from fastrl_core.config import ConfigError, TrainConfig, read_config
from fastrl_core.run_config import RunConfig, check_store_dir, load_config
from fastrl_core.store import layout
from fastrl_core.store.damage import why

FIXED_ON_RESUME: dict[str, str] = {key: why for keys, why in (
    (("run_name",), "it names the run"),
    (("model",), "the checkpoint holds its weights"),
    (("dataset", "dataset_skip_bad", "dataset_allow_outside_paths", "max_text_chars", "train_split",
      "synthetic_train", "synthetic_kinds", "synthetic_levels"), "it decides the problems the prompt stream draws "
                                                                  "from"),
    (("seed", "resample", "prompts_per_step"), "it decides the prompt stream and each step's random numbers, which "
                                                "the resume replays"),
    (("test_split", "synthetic_test", "eval_size"), "it decides the test set of every evaluation of the run"),
    (("rollouts_per_prompt", "budget"), "the budget controller's saved state is built on it"),
    (("sketch_dim",), "a run stores sketches of one length"),
) for key in keys}
NOT_COMPARED = ("store_dir",)
# keys added since a run may have been recorded, with the value such a run ran under (not today's default): a resume
# continues it as it ran
BEFORE_THE_KEY: dict[str, object] = {"merge_scope": "step"}


def as_recorded(record: dict) -> dict:
    """A run's recorded config under today's keys: a key added since the record was written takes the value such a
    run ran under (BEFORE_THE_KEY, else its default: a key that changed nothing when it came). Resume continues a
    run under it, and `fastrl bench` knows a finished run by it."""
    return {**_defaults(), **BEFORE_THE_KEY, **record}


@functools.cache
def _defaults() -> dict:
    """Every key's default as a record holds it (JSON values); read-only: callers copy it."""
    return json.loads(json.dumps(TrainConfig().options(), default=str))


def resume_command(store_dir: str | Path, run_id: str) -> str:
    """The command that continues run `run_id` of the store (under its recorded config)."""
    return f"fastrl train --resume {shlex.quote(run_id)} store_dir={shlex.quote(str(store_dir))}"


def check_resumable(store_dir: str | Path, run_id: str) -> None:
    """ConfigError unless `run_id` names a run of the store (its run.json exists)."""
    store = Path(store_dir)
    if not isinstance(run_id, str) or not layout.RUN_ID.fullmatch(run_id) or not (
            layout.run_dir(store, run_id) / "run.json").is_file():
        known = layout.list_runs(store)
        raise ConfigError(f"--resume {run_id!r}: no such run in store {str(store_dir)!r} ("
                          + (f"runs: {', '.join(known[-5:])}" if known else "it has no runs") + ")")


def recorded_config(store_dir: str | Path, run_id: str) -> dict:
    """The config in force in the run's record (after every change its history holds); ConfigError in one line
    when its run.json does not read (damaged: not UTF-8, not JSON, not an object) or records no config."""
    check_resumable(store_dir, run_id)
    path = layout.run_dir(Path(store_dir), run_id) / "run.json"
    try:
        record = layout.read_run_json(Path(store_dir), run_id)
    except (ValueError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        record = error
    if not isinstance(record, dict):
        problem = why(record) if isinstance(record, BaseException) else f"a JSON {type(record).__name__}, not an object"
        raise ConfigError(f"--resume {run_id}: its record {str(path)!r} is damaged ({problem}), so the run cannot "
                          f"resume; `fastrl store check {shlex.quote(str(store_dir))}` lists the store's damage; "
                          "start a new run")
    config = record.get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"--resume {run_id}: its run.json records no config")
    return config


def load_resume_config(path: str | Path | None, overrides: list[str], run_id: str) -> RunConfig:
    """Run `run_id`'s recorded config under the config file and the overrides given (the store is the one they
    name, else the default)."""
    store_dir = read_config(path, overrides)[0].store_dir
    check_store_dir(store_dir)
    record = {key: value for key, value in recorded_config(store_dir, run_id).items() if key not in NOT_COMPARED}
    record = as_recorded(record)
    return load_config(path, overrides, base=record, base_source=f"run {run_id}'s record")


def config_changes(config: TrainConfig, record: dict) -> dict[str, tuple]:
    """{key: (recorded, given)} for each key whose value differs from the record (keys the record lacks, added
    since it was written, are not changes)."""
    given = json.loads(json.dumps(config.options(), default=str))
    return {key: (record[key], value) for key, value in given.items()
            if key not in NOT_COMPARED and key in record and record[key] != value}


def _listed(changes: dict[str, tuple], why: dict[str, str] | None = None) -> str:
    return ", ".join(f"{key} ({old!r} -> {new!r}{': ' + why[key] if why else ''})"
                     for key, (old, new) in changes.items())


def allowed_changes(config: TrainConfig, run_id: str, allow: Iterable[str] = ()) -> dict[str, tuple]:
    """The changes of `config` from run `run_id`'s record, each allowed by `allow`; ConfigError (one line naming
    the keys) for a change not allowed, for any change of a FIXED_ON_RESUME key, and for an unknown key."""
    allow = list(dict.fromkeys(allow))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in allow:
        if key not in fields:
            raise ConfigError(f"--allow-change {key!r}: unknown config key; valid keys: {', '.join(sorted(fields))}")
        if key in FIXED_ON_RESUME or key in NOT_COMPARED:
            why = FIXED_ON_RESUME.get(key, "it is where the store is, not part of the run")
            raise ConfigError(f"--allow-change {key}: {key} cannot change when a run resumes ({why}); start a new "
                              "run for it")
    changes = config_changes(config, recorded_config(config.store_dir, run_id))
    fixed = {key: change for key, change in changes.items() if key in FIXED_ON_RESUME}
    if fixed:
        raise ConfigError(f"--resume {run_id}: {_listed(fixed, FIXED_ON_RESUME)} cannot change when a run resumes; "
                          "give the run's own values, or start a new run")
    refused = {key: change for key, change in changes.items() if key not in allow}
    if refused:
        keys = ",".join(refused)
        differ = "differs" if len(refused) == 1 else "differ"
        raise ConfigError(f"--resume {run_id}: {_listed(refused)} {differ} from the run's record; a resume continues "
                          "the run under its own config: drop these overrides, or change them from the step it "
                          f"resumes at with --allow-change {keys}")
    return changes
