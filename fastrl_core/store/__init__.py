"""The run store: every step's rollouts, advantages, gradient sketches and budgets, readable live while training.

The trainer, the TRL plug-in and the GPU check build a step's rows with `step_rows` (one definition of each
statistic) and write them through `RunWriter` (one atomic unit per step: per-step Parquet files renamed into place,
the steps row last); the app and the benchmarks read through the `read_*` functions and never build SQL.
`compact` materialises a run into one DuckDB file; `store.duckdb` holds views over the live files for ad-hoc
SQL (`duckdb -readonly <store_dir>/store.duckdb`). Layout and guarantees: `fastrl_core.store.layout`;
schemas: `fastrl_core.store.schema`; well-formed fake runs for tests and app work: `fastrl_core.store.synthetic`.
"""

from fastrl_core.store.compact import compact, compact_main
from fastrl_core.store.layout import SAMPLED_SUFFIX, list_runs, sampled_split
from fastrl_core.store.readers import (
    latest_step,
    read_budget_matrix,
    read_evals,
    read_groups,
    read_image,
    read_rollouts,
    read_runs,
    read_sketches,
    read_steps,
)
from fastrl_core.store.schema import PHASES
from fastrl_core.store.step_rows import GroupStats, StepResult, StepRows, group_stats, step_rows
from fastrl_core.store.writer import RunWriter, image_key

__all__ = [
    "PHASES", "SAMPLED_SUFFIX", "GroupStats", "RunWriter", "StepResult", "StepRows", "compact", "compact_main", "group_stats",
    "image_key", "latest_step", "list_runs", "read_budget_matrix", "read_evals", "read_groups", "read_image",
    "read_rollouts", "read_runs", "read_sketches", "read_steps", "sampled_split", "step_rows",
]
