"""The run store: every step's rollouts, advantages, gradient sketches and budgets, readable live while training.

The trainer, the TRL plug-in and the GPU check build a step's rows with `step_rows` (one definition of each
statistic) and write them through `RunWriter` (one atomic unit per step: per-step Parquet files renamed into place,
the steps row last); the app and the benchmarks read through the `read_*` functions and never build SQL.
`read_tokens` reads one rollout's tokens and `read_image` one of a run's images without reading the whole file.
`compact` materialises a run into one DuckDB file, `write_summaries` its whole-run tables into three small files a
fresh reader starts from (`fastrl_core.store.summary`; the step files stay the truth); `check_store` / `quarantine`
(`fastrl store check`) find and move aside damaged files, which the readers skip and list (`damaged_files`).
`store.duckdb` holds views over the live files for ad-hoc SQL (`cd <store_dir> && duckdb -readonly store.duckdb`:
its paths are relative, so a copied store reads its own files). Layout and guarantees: `fastrl_core.store.layout`;
schemas: `fastrl_core.store.schema`; well-formed fake runs for tests and app work: `fastrl_core.store.fake_runs`.
"""

from fastrl_core.store.check import check_store, quarantine
from fastrl_core.store.compact import compact, write_summaries
from fastrl_core.store.damage import DamagedFile, damaged_files
from fastrl_core.store.layout import SAMPLED_SUFFIX, RunLocked, list_runs, run_version, sampled_split
from fastrl_core.store.readers import (
    latest_step,
    read_budget_matrix,
    read_evals,
    read_groups,
    read_image,
    read_reason_counts,
    read_rollouts,
    read_runs,
    read_sketches,
    read_steps,
    read_tokens,
    run_state,
    run_states,
)
from fastrl_core.store.schema import PHASES
from fastrl_core.store.step_rows import StepRecord, StepTables, step_rows
from fastrl_core.store.writer import RunWriter, image_key

__all__ = [
    "PHASES", "SAMPLED_SUFFIX", "DamagedFile", "RunLocked", "RunWriter", "check_store", "damaged_files",
    "quarantine", "read_reason_counts", "read_tokens", "run_version",
    "run_state", "run_states", "StepRecord", "StepTables", "compact",
    "image_key", "latest_step", "list_runs", "read_budget_matrix", "read_evals", "read_groups", "read_image",
    "read_rollouts", "read_runs", "read_sketches", "read_steps", "sampled_split", "step_rows", "write_summaries",
]
