"""What a run needs before its first step, outside the training loop: the up-front checks of the store and of a
run to resume (`preflight`, before any data set is generated or model loaded), the train and test problems
(`load_datasets`), and the rollout engine named by the config (`make_engine`). `Trainer` calls them in that order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fastrl_core.config import ConfigError, TrainConfig
from fastrl_core.data.problems import DataError, LoadedProblems, Problem
from fastrl_core.engines.base import Engine
from fastrl_core.engines.resolve import ENGINES
from fastrl_core.resume import check_resumable
from fastrl_core.store import layout as store_layout

if TYPE_CHECKING:
    from fastrl_core.algo.sketches import SketchProjection
    from fastrl_core.policy import Policy


def preflight(config: TrainConfig, resume: str | None) -> int | None:
    """What can be checked before any data set is generated or model loaded: the store folder can be made, the
    run name is usable, and a run to resume exists (and is not being written: its lock is taken and returned)."""
    store = Path(config.store_dir)
    existing = store  # the store folder, or its nearest existing parent (nothing is created before the data checks)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == store else f"cannot be made: {str(existing)!r} is a file"
        raise ConfigError(f"store_dir={config.store_dir!r} {where} (the store must be a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"store_dir={config.store_dir!r}: no permission to write in {str(existing)!r}")
    if not config.run_name.strip():
        raise ConfigError(f"run_name={config.run_name!r} is empty; give a name (letters, digits, '.', '_', '-'; "
                          "a timestamp is appended for the run id)")
    if resume is None:
        return None
    check_resumable(config.store_dir, resume)
    return store_layout.lock_run(store, resume)


def load_datasets(config: TrainConfig) -> tuple[list[Problem], list[Problem]]:
    """The train and test problems, each text within `max_text_chars` (None: the loader's default); DataError
    when the train split has fewer problems than one step takes."""
    from fastrl_core.data.problems import load_problems

    if config.dataset == "synthetic":
        from fastrl_core.data.synthetic import ensure_dataset

        root = ensure_dataset(Path(config.store_dir) / "data", n_train=config.synthetic_train,
                              n_test=config.synthetic_test, seed=0, kinds=config.synthetic_kinds or None,
                              levels=config.synthetic_levels or None)
        train, test = (load_problems(root / split, max_text_chars=config.max_text_chars)
                       for split in (config.train_split, config.test_split))
    else:
        train, test = (load_problems(config.dataset, split=split, skip_bad=config.dataset_skip_bad,
                                     allow_outside_paths=config.dataset_allow_outside_paths,
                                     max_text_chars=config.max_text_chars)
                       for split in (config.train_split, config.test_split))
    check_enough_problems(config, train)
    return train, test


def check_enough_problems(config: TrainConfig, train: LoadedProblems) -> None:
    """A step takes prompts_per_step distinct problems: fewer is refused in one line (DataError)."""
    if len(train) < config.prompts_per_step:
        skipped = f" ({len(train.skipped)} bad rows skipped)" if train.skipped else ""
        raise DataError(f"dataset {config.dataset!r} split {config.train_split!r}: {len(train)} usable problems"
                        f"{skipped}, fewer than prompts_per_step={config.prompts_per_step} (one step takes that "
                        "many distinct problems): lower prompts_per_step or add problems")


def make_engine(config: TrainConfig, policy: Policy, projection: SketchProjection | None) -> Engine:
    """The rollout engine `config.engine` on `policy`; `projection` is set exactly when the resolved sketch
    (`resolve_sketch`) is computed while sampling (lm_head on HF, logprob on vLLM), and sketch_top_k goes to the
    engine as given."""
    if config.engine == "hf":
        from fastrl_core.engines.hf import HFEngine

        return HFEngine(policy, template=config.template, max_new_tokens=config.max_new_tokens,
                        temperature=config.temperature, sketch_projection=projection,
                        sketch_top_k=config.sketch_top_k or None,  # 0 = the whole vocabulary
                        share_prompts=config.share_prompts)
    if config.engine == "vllm":
        from fastrl_core.engines.vllm import VLLMEngine

        return VLLMEngine(policy, template=config.template, max_new_tokens=config.max_new_tokens,
                          temperature=config.temperature, sketch_projection=projection,
                          sketch_top_k=config.sketch_top_k, share_prompts=config.share_prompts)
    raise ValueError(f"unknown engine {config.engine!r}; choose one of {sorted(ENGINES)}")
