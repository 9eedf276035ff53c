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
"""Training-step phases timed in the steps table, as `time_<phase>` wall-clock and `cpu_<phase>` CPU seconds."""


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
TOKEN_TEXT = pa.list_(pa.string())  # one rollout's completion tokens, each as its text
TOKEN_LOGPROB = pa.list_(pa.float32())  # their sampling log-probs, one per token
TOKEN_LISTS = {"token_text": ((str,), "str"),  # list columns by name (TOKEN_LOGPROB is SKETCH's type)
               "token_logprob": ((int, float, np.integer, np.floating), "number")}
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
    _c("error", STR, nullable=True),  # first line of why a failed or stopped run ended
    _c("config_history", STR, nullable=True),  # JSON text: changes allowed on resume (store.config_history)
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
    _c("row_cost", FLOAT, nullable=True, required=False),  # rho the pruner's cost rule used (algo.costs); null: none
    # the split of the step's rollouts (store.step_rows): G·n of plain GRPO = skipped + merged + pruned + kept
    *[_c(f"rollouts_{part}", INT, nullable=True, required=False) for part in ("nominal", "skipped", "merged",
                                                                               "pruned")],
    *[_c(f"time_{phase}", FLOAT, nullable=True, required=False) for phase in PHASES],
    # process CPU seconds per phase (PhaseTimer); absent in stores written before they were recorded
    *[_c(f"cpu_{phase}", FLOAT, nullable=True, required=False) for phase in PHASES],
]

GROUPS = [
    _c("prompt_id", STR),
    _c("reward_mean", FLOAT),
    _c("reward_std", FLOAT),
    _c("sampled", INT),
    _c("kept", INT),
    _c("merged", INT, nullable=True, required=False),  # copies of an identical completion (store.step_rows)
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
    # the completion's tokens (each as its text) and their sampling log-probs, one list each, equally long
    # (store.step_rows); not read by default: `read_tokens` reads one rollout's. Stores written before 2026-12-07
    # hold them as JSON text in a `tokens` column instead, which read_tokens reads too.
    _c("token_text", TOKEN_TEXT, nullable=True, required=False),
    _c("token_logprob", TOKEN_LOGPROB, nullable=True, required=False),
    _c("proj_x", FLOAT, nullable=True, required=False),  # 2-D map coordinates; usually set later by set_projection
    _c("proj_y", FLOAT, nullable=True, required=False),
]

EVALS = [_c("split", STR), _c("accuracy", FLOAT), _c("n", INT)]

IMAGES = [_c("image_ref", STR), _c("png", pa.binary())]  # a prompt's image, in the step that first used it

PROJ = [_c("rollout_id", STR), _c("proj_x", FLOAT), _c("proj_y", FLOAT)]


def arrow_schema(key: list[Column], columns: list[Column], extra: dict[str, pa.DataType] | None = None) -> pa.Schema:
    """The Arrow schema of a table file: key columns, declared columns, then extra columns (nullable)."""
    fields = [pa.field(c.name, c.type, nullable=c.nullable) for c in key + columns]
    return pa.schema(fields + [pa.field(name, type_, nullable=True) for name, type_ in (extra or {}).items()])


def extra_type(values: list) -> pa.DataType:
    """Column type of an extra key: BOOLEAN when every value is a bool (or None), else DOUBLE."""
    return BOOL if all(v is None or isinstance(v, (bool, np.bool_)) for v in values) else FLOAT


_ACCEPTS = {  # column type -> (accepted Python types, excluded subtypes, what the error calls it)
    STR: ((str,), (), "a str"),
    INT: ((int, np.integer), (bool, np.bool_), "an int"),
    FLOAT: ((int, float, np.integer, np.floating), (bool, np.bool_), "a number"),
    BOOL: ((bool, np.bool_), (), "a bool"),
}


_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _accepts(column_type: pa.DataType, value_type: type) -> bool:
    accepted, excluded, _ = _ACCEPTS[column_type]
    return issubclass(value_type, accepted) and not issubclass(value_type, excluded)


def is_int(value: object) -> bool:
    """An int or NumPy integer, not a bool."""
    return _accepts(INT, type(value))


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

    Checked a column at a time on the set of value types it holds (benchmarks/bench_store.py (a) times it); the
    first offending row is looked up only to name it in the error. Sketches come back as one (n, D) float32
    array, or None when no row has one (all rows must agree, and every sketch of the table must have the same
    D). With `extra_numeric`, unknown keys are accepted as extra columns of numbers or of bools (None allowed);
    otherwise an unknown key is an error.
    """
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"{table}: expected a list of dicts, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{table} row {i}: expected a dict, got {type(row).__name__}")
    declared = {c.name: c for c in columns}
    keysets = {frozenset(row) for row in rows}
    common = frozenset.intersection(*keysets) if keysets else frozenset(declared)  # no rows: nothing missing
    extra = sorted(frozenset().union(*keysets) - declared.keys(), key=str)

    def first(bad) -> int:  # the first row for which bad(row) holds
        return next(i for i, row in enumerate(rows) if bad(row))

    for column in columns:
        if column.required and column.name not in common:
            i = first(lambda row: column.name not in row)
            raise ValueError(f"{table} row {i}: missing key {column.name!r}")
    for key in extra:
        if not extra_numeric:
            raise ValueError(f"{table} row {first(lambda row: key in row)}: unknown key {key!r} "
                             f"(expected {sorted(declared)})")
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"{table} row {first(lambda row: key in row)}: extra key {key!r} must be an identifier")

    values = {}
    for column in columns:
        column_values = [row.get(column.name) for row in rows]
        types = set(map(type, column_values))
        if type(None) in types and not column.nullable:  # None from an absent optional key is fine
            i = next((i for i, row in enumerate(rows) if column.name in row and row[column.name] is None), None)
            if i is not None:
                raise ValueError(f"{table} row {i}: key {column.name!r} must not be None")
        if column.name in TOKEN_LISTS:
            _check_lists(table, column_values, column)
        elif column.type == SKETCH:
            column_values = _sketch_matrix(table, column_values, column.name)
        elif not all(t is type(None) or _accepts(column.type, t) for t in types):
            i, value = next((i, v) for i, v in enumerate(column_values)
                            if v is not None and not _accepts(column.type, type(v)))
            raise ValueError(f"{table} row {i}: key {column.name!r} must be {_ACCEPTS[column.type][2]}, "
                             f"got {type(value).__name__} {value!r:.60}")
        elif column.type == INT and (int in types or np.uint64 in types):
            i = next((i for i, v in enumerate(column_values) if v is not None and not _INT64[0] <= v <= _INT64[1]),
                     None)
            if i is not None:
                raise ValueError(f"{table} row {i}: key {column.name!r} must fit a 64-bit int, got {column_values[i]}")
        values[column.name] = column_values
    for key in extra:
        column_values = [row.get(key) for row in rows]
        for t in set(map(type, column_values)):
            if not (t is type(None) or _accepts(FLOAT, t) or _accepts(BOOL, t)):
                i, value = next((i, v) for i, v in enumerate(column_values) if type(v) is t)
                raise ValueError(f"{table} row {i}: extra key {key!r} must be a number, a bool or None, "
                                 f"got {type(value).__name__} {value!r:.60}")
        values[key] = column_values
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


def _check_lists(table: str, values: list, column: Column) -> None:
    """A token list column: each value None or a list, tuple or 1-D array (its items are checked when the column
    is converted, `_list_array`)."""
    for i, value in enumerate(values):
        if value is not None and not (isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray)
                                                                            and value.ndim == 1)):
            raise ValueError(f"{table} row {i}: key {column.name!r} must be a list of "
                             f"{TOKEN_LISTS[column.name][1]}s, got {type(value).__name__}")


def _list_array(values: list, field: pa.Field, table: str) -> pa.Array:
    """A list column (one list or None per row) as one Arrow ListArray built from the rows' concatenation."""
    lengths = np.array([0 if v is None else len(v) for v in values], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    item = field.type.value_type
    dtype = np.float32 if item == pa.float32() else object
    try:
        parts = [np.asarray(v, dtype=dtype) for v in values if v is not None and len(v)]
        items = pa.array(np.concatenate(parts) if parts else np.array([], dtype=dtype), item)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        accepted, what = TOKEN_LISTS[field.name]
        for i, value in enumerate(values):
            for item_value in [] if value is None else value:
                if not isinstance(item_value, accepted) or isinstance(item_value, (bool, np.bool_)):
                    raise ValueError(f"{table} row {i}: key {field.name!r} must hold only {what}s, got "
                                     f"{type(item_value).__name__} {item_value!r:.60}") from None
        raise
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), items, mask=mask)


def _scalar_array(column: list, field: pa.Field) -> pa.Array:
    try:
        return pa.array(column, field.type)
    except pa.ArrowInvalid:
        if field.type != FLOAT:
            raise
        return pa.array([None if v is None else float(v) for v in column], field.type)  # an int beyond 2**53


def to_arrow(key_values: dict, values: dict, key: list[Column], columns: list[Column], n: int,
             table: str = "rows") -> pa.Table:
    """Build a table file's Arrow table from validated `values` (see validate_rows) and constant key values."""
    declared = {c.name for c in columns}
    extra = {name: extra_type(column) for name, column in values.items() if name not in declared}
    schema = arrow_schema(key, columns, extra)
    arrays = []
    for field in schema:
        if field.name in key_values:
            arrays.append(pa.array([key_values[field.name]] * n, field.type))
        elif field.name in TOKEN_LISTS:
            arrays.append(_list_array(values[field.name], field, table))
        elif field.type == SKETCH:
            matrix = values[field.name]
            if matrix is None:
                arrays.append(pa.nulls(n, SKETCH))
            else:
                offsets = np.arange(0, matrix.size + 1, matrix.shape[1], dtype=np.int32)
                arrays.append(pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel(), pa.float32())))
        else:  # validated: Python or NumPy scalars of the column's kind, which pa.array converts itself
            arrays.append(_scalar_array(values[field.name], field))
    return pa.Table.from_arrays(arrays, schema=schema)
