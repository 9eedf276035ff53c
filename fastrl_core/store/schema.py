"""Arrow schemas of the run store's tables, and validation of incoming rows against them.

Every table starts with the key columns the writer fills in itself (`run_id`, and `step` where the table has
one); the rest come from the trainer's dicts and are checked here before anything is written: a missing key,
an unknown key or a value of the wrong type raises one `ValueError` naming the table, the row index and the key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

PHASES = ("generate", "reward", "sketch", "prune", "logprob", "update", "store")
"""Training-step phases timed in the steps table, as `time_<phase>` seconds."""


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool = False  # the value may be None
    required: bool = True  # the key must be present in every incoming row


def _c(name: str, type_: pa.DataType, nullable: bool = False, required: bool = True) -> Column:
    return Column(name, type_, nullable, required)


STR, INT, FLOAT, BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
SKETCH = pa.list_(pa.float32())  # FLOAT[D] per rollout; stored as a list (Parquet has no fixed-size list)
TIMESTAMP = pa.timestamp("us", tz="UTC")

RUN_KEY = [_c("run_id", STR)]
STEP_KEY = [_c("run_id", STR), _c("step", INT)]

RUNS = [
    *RUN_KEY,
    _c("name", STR),
    _c("config", STR),  # JSON text
    _c("code_version", STR),
    _c("model", STR),
    _c("dataset", STR),
    _c("objective", STR),
    _c("pruner", STR),
    _c("budget", STR),
    _c("started", TIMESTAMP),
    _c("finished", TIMESTAMP, nullable=True),
    _c("status", STR),
]

STEPS = [
    _c("wall_time", FLOAT, required=False),  # seconds since the run started; the writer fills it when absent
    _c("rollouts_sampled", INT),
    _c("rollouts_kept", INT),
    _c("rollouts_per_prompt", FLOAT),  # mean over the step's prompts
    _c("reward_mean", FLOAT),
    _c("accuracy", FLOAT),
    _c("loss", FLOAT, nullable=True, required=False),  # absent when no update ran; kl/clip absent per objective
    _c("kl", FLOAT, nullable=True, required=False),
    _c("clip_fraction", FLOAT, nullable=True, required=False),
    _c("zero_variance_groups", INT),
    *[_c(f"time_{phase}", FLOAT, nullable=True, required=False) for phase in PHASES],
]

GROUPS = [
    _c("prompt_id", STR),
    _c("reward_mean", FLOAT),
    _c("reward_std", FLOAT),
    _c("sampled", INT),
    _c("kept", INT),
]

ROLLOUTS = [
    _c("rollout_id", STR),
    _c("prompt_id", STR),
    _c("image_ref", STR, nullable=True),  # image_key() of the prompt's PNG
    _c("question", STR, nullable=True),
    _c("answer", STR, nullable=True),
    _c("completion", STR),
    _c("reward", FLOAT),
    _c("format_reward", FLOAT, nullable=True),
    _c("accuracy_reward", FLOAT, nullable=True),
    _c("advantage", FLOAT),
    _c("kept", BOOL),
    _c("reason", STR, nullable=True),  # why the pruner kept or dropped it
    _c("score", FLOAT, nullable=True),  # the pruner's score
    _c("weight", FLOAT, nullable=True),  # loss weight of a kept rollout (e.g. importance reweighting)
    _c("length", INT, nullable=True),  # completion tokens
    _c("sketch", SKETCH, nullable=True),  # gradient sketch, (D,) float32
    _c("proj_x", FLOAT, nullable=True, required=False),  # 2-D map coordinates; usually set later by set_projection
    _c("proj_y", FLOAT, nullable=True, required=False),
]

EVALS = [_c("split", STR), _c("accuracy", FLOAT), _c("n", INT)]

PROJ = [_c("rollout_id", STR), _c("proj_x", FLOAT), _c("proj_y", FLOAT)]


def arrow_schema(key: list[Column], columns: list[Column], extra: dict[str, pa.DataType] | None = None) -> pa.Schema:
    """The Arrow schema of a table file: key columns, declared columns, then extra columns (nullable)."""
    fields = [pa.field(c.name, c.type, nullable=c.nullable) for c in key + columns]
    return pa.schema(fields + [pa.field(name, type_, nullable=True) for name, type_ in (extra or {}).items()])


def extra_type(values: list) -> pa.DataType:
    """Column type of an extra key: BOOLEAN when every value is a bool (or None), else DOUBLE."""
    return BOOL if all(v is None or isinstance(v, (bool, np.bool_)) for v in values) else FLOAT


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_float(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


_CHECKS = {
    STR: (lambda v: isinstance(v, str), "a str"),
    INT: (_is_int, "an int"),
    FLOAT: (_is_float, "a number"),
    BOOL: (lambda v: isinstance(v, (bool, np.bool_)), "a bool"),
}


def _sketch_array(value: object, where: str) -> np.ndarray:
    try:
        vector = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a 1-D float vector, got {type(value).__name__}") from None
    if vector.ndim != 1 or vector.size == 0:
        raise ValueError(f"{where} must be a non-empty 1-D float vector, got shape {vector.shape}")
    return vector


def validate_rows(table: str, rows: list[dict], columns: list[Column], *, extra_numeric: bool = False) -> dict:
    """Check `rows` against `columns`; return {column: values} (extra keys sorted after the declared ones).

    Sketches come back as one (n, D) float32 array, or None when no row has one (all rows must agree, and
    every sketch of the table must have the same D). With `extra_numeric`, unknown keys are accepted as
    extra columns of numbers or of bools (None allowed); otherwise an unknown key is an error.
    """
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"{table}: expected a list of dicts, got {type(rows).__name__}")
    declared = {c.name: c for c in columns}
    extra: list[str] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{table} row {i}: expected a dict, got {type(row).__name__}")
        for column in columns:
            if column.required and column.name not in row:
                raise ValueError(f"{table} row {i}: missing key {column.name!r}")
        for key, value in row.items():
            column = declared.get(key)
            if column is None:
                if not extra_numeric:
                    raise ValueError(f"{table} row {i}: unknown key {key!r} (expected {sorted(declared)})")
                if not isinstance(key, str) or not key.isidentifier():
                    raise ValueError(f"{table} row {i}: extra key {key!r} must be an identifier")
                if value is not None and not (_is_float(value) or isinstance(value, (bool, np.bool_))):
                    raise ValueError(f"{table} row {i}: extra key {key!r} must be a number, a bool or None, "
                                     f"got {type(value).__name__} {value!r:.60}")
                if key not in extra:
                    extra.append(key)
                continue
            if value is None:
                if not column.nullable:
                    raise ValueError(f"{table} row {i}: key {key!r} must not be None")
                continue
            if column.type == SKETCH:
                continue  # checked below, all rows together
            check, expected = _CHECKS[column.type]
            if not check(value):
                raise ValueError(f"{table} row {i}: key {key!r} must be {expected}, "
                                 f"got {type(value).__name__} {value!r:.60}")
    values = {c.name: [row.get(c.name) for row in rows] for c in columns}
    for name in sorted(extra):
        values[name] = [row.get(name) for row in rows]
    for column in columns:
        if column.type == SKETCH:
            values[column.name] = _sketch_matrix(table, values[column.name], column.name)
    return values


def _sketch_matrix(table: str, sketches: list, key: str) -> np.ndarray | None:
    present = [s is not None for s in sketches]
    if not any(present):
        return None
    if not all(present):
        i = present.index(False)
        raise ValueError(f"{table} row {i}: key {key!r} is None but other rows have one (all or none)")
    vectors = [_sketch_array(s, f"{table} row {i}: key {key!r}") for i, s in enumerate(sketches)]
    dim = vectors[0].size
    for i, vector in enumerate(vectors):
        if vector.size != dim:
            raise ValueError(f"{table} row {i}: key {key!r} has length {vector.size}, row 0 has {dim}")
    return np.stack(vectors)  # (n, D)


def to_arrow(key_values: dict, values: dict, key: list[Column], columns: list[Column], n: int) -> pa.Table:
    """Build a table file's Arrow table from validated `values` (see validate_rows) and constant key values."""
    declared = {c.name for c in columns}
    extra = {name: extra_type(column) for name, column in values.items() if name not in declared}
    schema = arrow_schema(key, columns, extra)
    arrays = []
    for field in schema:
        if field.name in key_values:
            arrays.append(pa.array([key_values[field.name]] * n, field.type))
        elif field.type == SKETCH:
            matrix = values[field.name]
            if matrix is None:
                arrays.append(pa.nulls(n, SKETCH))
            else:
                offsets = np.arange(0, matrix.size + 1, matrix.shape[1], dtype=np.int32)
                arrays.append(pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel(), pa.float32())))
        else:
            column = values[field.name]
            if field.type in (FLOAT, INT):
                column = [None if v is None else (float(v) if field.type == FLOAT else int(v)) for v in column]
            elif field.type == BOOL:
                column = [None if v is None else bool(v) for v in column]
            arrays.append(pa.array(column, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
