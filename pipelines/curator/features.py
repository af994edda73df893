"""Curator side: materialise one training row per user from the daily indicator files.

The training stage (``renyi-stream train``) needs one record per user: a feature vector and a
label. This module derives them from the same daily indicator inputs the streaming job reads
(Parquet, Arrow IPC or CSV; validated by :func:`stream.schema.validate_batch`, so the rows the
daily job would reject are left out here too, and counted):

* the **feature window** ``[start, end]`` (days, inclusive) gives, for every indicator column
  ``c``: ``c_mean`` = sum of ``c`` over the window / number of days in the window, and
  ``c_active`` = days with ``c != 0`` / number of days; plus ``active_days`` = days with any row
  / number of days. For binary indicators every feature lies in ``[0, 1]``;
* the **label window** ``[label_start, label_end]`` gives ``label`` = 1 if the user's
  ``label_column`` sums to more than 0 there, else 0 (e.g. "changes plan in the next 30 days").

A user is a training row when they have at least one valid row in the feature window. A
repeated ``(user, day)`` across files keeps its first occurrence (the daily job would reject the
later one). The output is sensitive (it is the users' data): it stays on the curator side, next
to the ledger: the file is written ``0600`` (folders made for it ``0700``) whatever the umask,
and :func:`load_features` refuses one that group/others may read (:mod:`stream.private_files`).
Parquet columns: ``user_id``, the features in a fixed order, ``label`` (int64);
the schema metadata records the windows and the source columns.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stream.engine.readers import read_batches
from stream.private_files import refuse_if_shared, write_private
from stream.schema import DAY, EVENT_TIME, USER_ID, WINDOW_ID, WindowSpec, validate_batch

LABEL = "label"
_EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True)
class FeatureSummary:
    """What :func:`materialise_features` wrote (curator-only counts)."""

    path: Path
    users: int
    positives: int
    feature_columns: tuple[str, ...]
    rows_read: int
    rows_rejected: int


def _day(name: str, value: dt.date | str) -> int:
    if isinstance(value, str):
        try:
            value = dt.date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name} must be a date YYYY-MM-DD, got {name}={value!r}") from None
    if not isinstance(value, dt.date):
        raise ValueError(f"{name} must be a date, got {name}={value!r}")
    return (value - _EPOCH).days


def _indicators(first: pa.Schema) -> list[str]:
    skip = {USER_ID, DAY, EVENT_TIME}
    return [f.name for f in first if f.name not in skip and
            (pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type))]


def materialise_features(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    start: dt.date | str,
    end: dt.date | str,
    label_column: str,
    label_start: dt.date | str,
    label_end: dt.date | str,
    indicator_columns: Sequence[str] | None = None,
) -> FeatureSummary:
    """Read the daily indicator files, aggregate per user, write ``out`` (Parquet).

    Raises ``ValueError`` naming the parameter for an empty input list, reversed windows, a
    label window that overlaps the feature window, or a ``label_column`` that is not an
    indicator column.
    """
    if not inputs:
        raise ValueError("inputs must name at least one indicator file")
    fs, fe = _day("start", start), _day("end", end)
    ls, le = _day("label_start", label_start), _day("label_end", label_end)
    if fs > fe:
        raise ValueError(f"start must not be after end, got start={start}, end={end}")
    if ls > le:
        raise ValueError(f"label_start must not be after label_end, got label_start={label_start}, label_end={label_end}")
    if not (le < fs or ls > fe):
        raise ValueError(f"the label window [{label_start}, {label_end}] must not overlap the feature window "
                         f"[{start}, {end}]: the label would be part of the features")
    first = next(read_batches(inputs[0], batch_rows=16, malformed=[]), None)
    if first is None:
        raise ValueError(f"input file {inputs[0]} has no rows to take indicator columns from")
    columns = list(indicator_columns) if indicator_columns else _indicators(first.schema)
    if label_column not in columns:
        raise ValueError(f"label_column must be one of the indicator columns {columns}, got label_column={label_column!r}")
    lo, hi = min(fs, ls), max(fe, le)
    valid: list[pa.Table] = []
    rows_read = rejected = 0
    for path in inputs:
        malformed: list[tuple[int, str]] = []  # CSV lines that do not split: read and rejected
        for batch in read_batches(path, malformed=malformed):
            result = validate_batch(batch, window=WindowSpec(), start_window=lo, end_window=hi,
                                    indicator_columns=columns)
            rows_read += batch.num_rows
            rejected += result.rejected.num_rows
            if result.valid.num_rows:
                valid.append(result.valid)
        rows_read += len(malformed)
        rejected += len(malformed)
    if not valid:
        raise ValueError(f"no valid rows between {min(start, label_start)} and {max(end, label_end)} in the inputs")
    rows = pa.concat_tables(valid, promote_options="default")
    rows = rows.append_column("_ord", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    days = fe - fs + 1
    feature_sql, feature_names = [], []
    for c in columns:
        q = '"' + c.replace('"', '""') + '"'
        feature_sql += [f"coalesce(sum({q}) FILTER (WHERE in_f), 0) / {days}.0",
                        f"count(*) FILTER (WHERE in_f AND {q} <> 0) / {days}.0"]
        feature_names += [f"{c}_mean", f"{c}_active"]
    feature_sql.append(f"count(*) FILTER (WHERE in_f) / {days}.0")
    feature_names.append("active_days")
    lq = '"' + label_column.replace('"', '""') + '"'
    select = ", ".join(f'{sql} AS "{name}"' for sql, name in zip(feature_sql, feature_names))
    db = duckdb.connect()
    try:
        db.register("rows_in", rows)
        table = db.execute(f"""
            WITH numbered AS (
                SELECT *, row_number() OVER (PARTITION BY {USER_ID}, {WINDOW_ID} ORDER BY _ord) AS _nth FROM rows_in),
            kept AS (
                SELECT *, {WINDOW_ID} BETWEEN {fs} AND {fe} AS in_f, {WINDOW_ID} BETWEEN {ls} AND {le} AS in_l
                FROM numbered WHERE _nth = 1)
            SELECT {USER_ID}, {select},
                   CAST(coalesce(sum({lq}) FILTER (WHERE in_l), 0) > 0 AS BIGINT) AS {LABEL}
            FROM kept GROUP BY {USER_ID} HAVING count(*) FILTER (WHERE in_f) > 0
            ORDER BY {USER_ID}""").arrow()
    finally:
        db.close()
    if hasattr(table, "read_all"):
        table = table.read_all()
    meta = {
        "renyi_stream.features": json.dumps({
            "feature_columns": feature_names, "label": LABEL, "label_column": label_column,
            "feature_window": [str(start), str(end)], "label_window": [str(label_start), str(label_end)],
            "indicator_columns": columns,
        }),
    }
    out = Path(out)
    table = table.replace_schema_metadata(meta)
    write_private(out, lambda handle: pq.write_table(table, handle))
    labels = table.column(LABEL).to_numpy()
    return FeatureSummary(path=out, users=table.num_rows, positives=int(labels.sum()),
                          feature_columns=tuple(feature_names), rows_read=rows_read, rows_rejected=rejected)


@dataclass(frozen=True)
class Features:
    """A features file loaded for training: ids ``(n,)``, ``x`` ``(n, d)`` float64, ``labels``
    ``(n,)`` int64 in ``[0, n_classes)``, and the feature column names."""

    user_ids: pa.Array
    x: np.ndarray
    labels: np.ndarray
    feature_columns: tuple[str, ...]
    n_classes: int


def load_features(path: str | os.PathLike, *, label_column: str = LABEL,
                  feature_columns: Sequence[str] | None = None) -> Features:
    """Read a features Parquet file (``user_id``, numeric features, integer ``label``).

    ``feature_columns`` defaults to the list recorded by :func:`materialise_features`, else every
    numeric column other than ``user_id`` and the label. Refuses a file that group/others may
    read (naming it and the fix, ``chmod 600``: it holds the users' data), nulls, non-finite features,
    repeated user ids and labels that are not non-negative integers, naming the column.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"features file {path} does not exist")
    refuse_if_shared(path, "features file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"features file {path} is not a readable Parquet file: {exc}") from exc
    for needed in (USER_ID, label_column):
        if needed not in table.column_names:
            raise ValueError(f"features file {path} has no column {needed!r}")
    if feature_columns is None:
        meta = (table.schema.metadata or {}).get(b"renyi_stream.features")
        if meta is not None:
            feature_columns = json.loads(meta)["feature_columns"]
        else:
            feature_columns = [f.name for f in table.schema if f.name not in (USER_ID, label_column)
                               and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                                    or pa.types.is_boolean(f.type))]
    if not feature_columns:
        raise ValueError(f"features file {path} has no numeric feature columns")
    cols: list[np.ndarray] = []
    for name in feature_columns:
        if name not in table.column_names:
            raise ValueError(f"features file {path} has no feature column {name!r}")
        col = table.column(name)
        if col.null_count:
            raise ValueError(f"feature column {name!r} in {path} has {col.null_count} null value(s)")
        cols.append(col.to_numpy().astype(np.float64))
    x = np.column_stack(cols)
    if not np.isfinite(x).all():
        bad = feature_columns[int(np.flatnonzero(~np.isfinite(x).all(axis=0))[0])]
        raise ValueError(f"feature column {bad!r} in {path} has NaN or infinite values")
    label_col = table.column(label_column)
    if label_col.null_count or not pa.types.is_integer(label_col.type):
        raise ValueError(f"label column {label_column!r} in {path} must be integers without nulls, got {label_col.type}")
    labels = label_col.to_numpy().astype(np.int64)
    if labels.min() < 0:
        raise ValueError(f"label column {label_column!r} in {path} must be >= 0, got {labels.min()}")
    ids: Any = table.column(USER_ID).combine_chunks()
    if ids.null_count:
        raise ValueError(f"user_id in {path} has null values")
    return Features(user_ids=ids, x=x, labels=labels, feature_columns=tuple(feature_columns),
                    n_classes=max(2, int(labels.max()) + 1))
