"""Materialise a run: one DuckDB file of real tables (`compact`), for plain SQL and sharing, and its summary files
(`write_summaries`, `store.summary`), so a fresh reader opens three files instead of three per step."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import duckdb

from fastrl_core.store import damage, layout, readers, schema, summary


def compact(store_dir: str | Path, run_id: str) -> Path:
    """Write runs/<run_id>/<run_id>.duckdb with tables runs, steps, groups, rollouts (sketch FLOAT[D], projection
    merged in), evals and images (image_ref, png BLOB) holding the run's visible steps, after writing the run's
    summary files (`write_summaries`: first, so a compact killed midway leaves them whole); return the DuckDB file.

    Built under a temp name and renamed, so it can run on a live run (it is a snapshot) and readers of an older
    compact file keep theirs. Query it with `duckdb -readonly <file>`. Damaged files are left out as the readers
    leave them out (a damaged steps file hides its step; `damage.damaged_files` lists them).
    """
    store_dir = Path(store_dir).resolve()
    meta = layout.read_run_json(store_dir, run_id)
    write_summaries(store_dir, run_id)
    steps = readers._run_steps(store_dir, run_id)["step"].astype(int).tolist()
    out = layout.compact_file(store_dir, run_id)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    def _create(*args, **kwargs):
        _create_tolerant(con, store_dir, *args, **kwargs)

    try:
        _create_runs(con, meta)
        _create("steps", "SELECT * FROM read_parquet($files, union_by_name=true) ORDER BY step",
                {"files": readers._files(store_dir, run_id, "steps", steps)}, schema.STEPS)
        _create("groups", "SELECT * EXCLUDE (file_row_number) FROM read_parquet($files, file_row_number=true) "
                "ORDER BY step, file_row_number", {"files": readers._files(store_dir, run_id, "groups", steps)},
                schema.GROUPS)
        sql, params = _rollouts_sql(store_dir, run_id, steps, meta.get("sketch_dim"))
        _create("rollouts", sql, params, schema.ROLLOUTS)
        _create("evals", "SELECT * FROM read_parquet($files, union_by_name=true) ORDER BY step, split",
                {"files": layout.eval_files(store_dir, run_id)}, schema.EVALS)
        _create("images", "SELECT image_ref, any_value(png) AS png FROM read_parquet($files) WHERE image_ref IN "
                "(SELECT image_ref FROM rollouts) GROUP BY image_ref ORDER BY image_ref",
                {"files": layout.table_files(store_dir, run_id, "images")}, schema.IMAGES, key=[])
    finally:
        con.close()
    os.replace(tmp, out)
    Path(f"{tmp}.wal").unlink(missing_ok=True)
    return out


def write_summaries(store_dir: str | Path, run_id: str) -> list[Path]:
    """Write the run's summary files (`store.summary`) from its visible steps; return their paths. The step files
    are read through the readers' per-process cache, so a writer refreshing them reads only its new steps."""
    store_dir = Path(store_dir)
    for table, (stamps, frame) in readers.whole_run_tables(store_dir, run_id).items():
        summary.save(store_dir, run_id, table, stamps, frame)
    return summary.summary_files(store_dir, run_id)


def _rollouts_sql(store_dir: Path, run_id: str, steps: list[int], sketch_dim: int | None) -> tuple[str, dict]:
    """Every rollout of `steps` with set_projection's coordinates merged in and the sketch as FLOAT[D]."""
    proj_steps = [s for s in layout.step_numbers(store_dir, run_id, "proj") if s in set(steps)]
    select = []
    for name in readers.ROLLOUT_COLUMNS:
        if name == "sketch" and sketch_dim:
            select.append(f"r.sketch::FLOAT[{int(sketch_dim)}] AS sketch")
        elif name in ("proj_x", "proj_y") and proj_steps:
            select.append(f"coalesce(p.{name}, r.{name}) AS {name}")
        else:
            select.append(f"r.{name}")
    sql = f"SELECT {', '.join(select)} FROM read_parquet($rollouts, file_row_number=true, union_by_name=true) r"
    params = {"rollouts": readers._files(store_dir, run_id, "rollouts", steps)}
    if proj_steps:
        sql += " LEFT JOIN read_parquet($proj) p ON p.step = r.step AND p.rollout_id = r.rollout_id"
        params["proj"] = readers._files(store_dir, run_id, "proj", proj_steps)
    return sql + " ORDER BY r.step, r.file_row_number", params


def _create_tolerant(con: duckdb.DuckDBPyConnection, store_dir: Path, name: str, sql: str, params: dict,
                     columns: list, key: list = schema.STEP_KEY) -> None:
    """_create without the damaged files of `params` (the readers' rule: known ones left out, the rest checked
    one by one when DuckDB fails)."""
    params = {k: [f for f in files if not damage.known_damaged(store_dir, f)] for k, files in params.items()}
    for attempt in range(3):
        try:
            return _create(con, name, sql, params, columns, key)
        except (duckdb.Error, OSError):
            bad = damage.sort_out(store_dir, [f for files in params.values() for f in files])
            if not bad or attempt == 2:
                raise
            con.execute(f"DROP TABLE IF EXISTS {name}")
            params = {k: [f for f in files if f not in bad] for k, files in params.items()}


def _create(con: duckdb.DuckDBPyConnection, name: str, sql: str, params: dict, columns: list,
            key: list = schema.STEP_KEY) -> None:
    if all(params.values()):
        con.execute(f"CREATE TABLE {name} AS {sql}", params)
    else:  # no files yet: an empty table with the declared columns
        con.register("empty_arrow", schema.arrow_schema(key, columns).empty_table())
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM empty_arrow")
        con.unregister("empty_arrow")


def _create_runs(con: duckdb.DuckDBPyConnection, meta: dict) -> None:
    row = {c.name: [meta.get(c.name)] for c in schema.RUNS}
    row["config"] = [json.dumps(meta.get("config", {}))]
    row["config_history"] = [json.dumps(meta.get("config_history", []))]
    for key in ("started", "finished"):
        row[key] = [datetime.fromisoformat(row[key][0]) if row[key][0] else None]
    con.register("runs_arrow", schema.to_arrow({}, row, [], schema.RUNS, 1))
    con.execute("CREATE TABLE runs AS SELECT * REPLACE (config::JSON AS config, config_history::JSON AS "
                "config_history) FROM runs_arrow")
    con.unregister("runs_arrow")
