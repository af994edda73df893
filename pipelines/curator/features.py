"""Curator side: one training row per user from the daily indicator files (the features stage's
Beam-free part) and the file the training stage reads.

The training stage (``renyi-stream train``) needs one record per user: a feature vector and a
label. The features job (:mod:`renyi_stream.pipelines.features.job`, ``renyi-stream features``) derives them
from the same daily indicator inputs the daily job reads, through the daily job's own read and
validation (so the rows the daily job would reject are left out here too, and counted); this
module holds what it computes, Beam-free:

* the **feature window** ``[start, end]`` (days, inclusive) gives, for every indicator column
  ``c``: ``c_mean`` = sum of ``c`` over the window / number of days in the window, and
  ``c_active`` = days with ``c != 0`` / number of days; plus ``active_days`` = days with any row
  / number of days. For binary indicators every feature lies in ``[0, 1]``;
* the **label window** ``[label_start, label_end]`` gives ``label`` = 1 if the user's
  ``label_column`` sums to more than 0 there, else 0 (e.g. "changes plan in the next 30 days"):
  two classes, recorded as ``classes: 2`` in the file's metadata, so that the trained model's
  shape is declared and never read off the labels.

A user is a training row when they have at least one valid row in the feature window. A
repeated ``(user, day)`` keeps its first occurrence in (input, row) order, the daily job's rule
(invariant 2 (charge-in-event-time-order, docs/architecture.md)); the later ones are
``duplicate_user_window`` dead letters. The output is sensitive (it is the users' data): it
stays on the curator side, next to the ledger: the file is written ``0600`` (folders made for it
``0700``) whatever the umask, and :func:`load_features` refuses one that group/others may read
(:mod:`renyi_stream.stream.private_files`). Parquet columns: ``user_id``, the features in a fixed order,
``label`` (int64); the schema metadata records the windows and the source columns
(:data:`FEATURES_KEY`) and, apart, the run's exact row counts (:data:`ROWS_KEY`, curator only as
the file is).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from renyi_stream.stream.columns import default_columns
from renyi_stream.stream.engine.readers import MalformedLines, declares_types, read_batches
from renyi_stream.stream.private_files import refuse_if_shared, write_private
from renyi_stream.stream.schema import USER_ID, WINDOW_ID

LABEL = "label"
#: The features job's labels are 0 or 1: the classes it records (``classes`` in FEATURES_KEY).
BINARY_CLASSES = 2
#: Schema-metadata key of what the features are: feature and indicator columns, windows, label
#: and its declared number of classes.
FEATURES_KEY = b"renyi_stream.features"
#: Schema-metadata key of the run that wrote the file: its token and exact row counts (JSON).
ROWS_KEY = b"renyi_stream.features_rows"
_EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True)
class FeatureSummary:
    """What the features stage wrote (curator-only counts): users and positive labels in the
    file, rows read, rows rejected (dead letters, every reason) and the rejected rows by reason."""

    path: Path | str
    users: int
    positives: int
    feature_columns: tuple[str, ...]
    rows_read: int
    rows_rejected: int
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)


def _day(name: str, value: dt.date | str) -> int:
    if isinstance(value, str):
        try:
            value = dt.date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name} must be a date YYYY-MM-DD, got {name}={value!r}") from None
    if not isinstance(value, dt.date):
        raise ValueError(f"{name} must be a date, got {name}={value!r}")
    return (value - _EPOCH).days


@dataclass(frozen=True)
class FeatureWindows:
    """The feature window ``[start, end]`` and the label window ``[label_start, label_end]`` as
    day numbers (days since 1970-01-01, the daily window ids), with the dates as given (for the
    file's metadata). Build with :meth:`of`, which validates them."""

    start: int
    end: int
    label_start: int
    label_end: int
    given: tuple[str, str, str, str]

    @classmethod
    def of(cls, *, start: dt.date | str, end: dt.date | str, label_start: dt.date | str,
           label_end: dt.date | str) -> "FeatureWindows":
        """ValueError naming the parameter for a date that does not parse, a reversed window, or a
        label window that overlaps the feature window (the label would be part of the features)."""
        fs, fe = _day("start", start), _day("end", end)
        ls, le = _day("label_start", label_start), _day("label_end", label_end)
        if fs > fe:
            raise ValueError(f"start must not be after end, got start={start}, end={end}")
        if ls > le:
            raise ValueError(f"label_start must not be after label_end, got label_start={label_start}, "
                             f"label_end={label_end}")
        if not (le < fs or ls > fe):
            raise ValueError(f"the label window [{label_start}, {label_end}] must not overlap the feature window "
                             f"[{start}, {end}]: the label would be part of the features")
        return cls(fs, fe, ls, le, (str(start), str(end), str(label_start), str(label_end)))

    @property
    def first(self) -> int:
        """The first day any row is read for (the schedule's start: earlier rows are out of range)."""
        return min(self.start, self.label_start)

    @property
    def last(self) -> int:
        """The last day any row is read for."""
        return max(self.end, self.label_end)

    @property
    def days(self) -> int:
        """Days in the feature window: the denominator of every feature."""
        return self.end - self.start + 1


def indicator_columns_of(path: str | os.PathLike, label_column: str,
                         indicator_columns: Sequence[str] | None = None) -> list[str]:
    """The indicator columns the features are made of: ``indicator_columns`` when given, else the
    daily job's default columns of the first input (:func:`renyi_stream.stream.columns.default_columns`: the
    declared numeric columns of a Parquet/Arrow file, every non-key column of a CSV). ValueError
    naming ``label_column`` when it is not one of them."""
    if indicator_columns:
        columns = list(indicator_columns)
    else:
        first = next(read_batches(path, batch_rows=16, malformed=MalformedLines()))
        columns = default_columns(first.schema, declared_types=declares_types(path))
    if label_column not in columns:
        raise ValueError(f"label_column must be one of the indicator columns {columns}, got label_column={label_column!r}")
    return columns


def feature_names(columns: Sequence[str]) -> list[str]:
    """The feature columns, in the file's order: ``<c>_mean``, ``<c>_active`` per indicator, then
    ``active_days``."""
    return [name for c in columns for name in (f"{c}_mean", f"{c}_active")] + ["active_days"]


def features_schema(columns: Sequence[str], id_type: str) -> pa.Schema:
    """The features file's columns: ``user_id`` (int64 or string, the inputs' id type), the
    features (float64) and ``label`` (int64)."""
    return pa.schema([(USER_ID, pa.int64() if id_type == "int64" else pa.string())]
                     + [(name, pa.float64()) for name in feature_names(columns)] + [(LABEL, pa.int64())])


def user_features(rows: pa.Table, windows: FeatureWindows, columns: Sequence[str], label_column: str) -> pa.Table:
    """One row per user of ``rows`` with a row in the feature window (:func:`features_schema`
    columns, users in first-appearance order), from validated rows (``user_id``, ``window_id``,
    the indicator columns as float64 without nulls) holding at most one row per (user, window).

    Vectorised: one hash aggregation over the rows (Arrow's ``group_by``), no Python loop per row
    or user. Sums are of the feature window's values only (0 added for the other rows, which
    changes no sum), divided by :attr:`FeatureWindows.days`."""
    w = np.asarray(rows.column(WINDOW_ID).to_numpy(), dtype=np.int64)
    in_f = (w >= windows.start) & (w <= windows.end)
    in_l = (w >= windows.label_start) & (w <= windows.label_end)
    sums: dict[str, Any] = {USER_ID: rows.column(USER_ID)}
    for i, c in enumerate(columns):
        v = np.asarray(rows.column(c).to_numpy(), dtype=np.float64)
        sums[f"s{i}"] = np.where(in_f, v, 0.0)
        sums[f"a{i}"] = (in_f & (v != 0)).astype(np.int64)
    sums["f"] = in_f.astype(np.int64)
    sums["l"] = np.where(in_l, np.asarray(rows.column(label_column).to_numpy(), dtype=np.float64), 0.0)
    names = [k for k in sums if k != USER_ID]
    grouped = pa.table(sums).group_by(USER_ID, use_threads=False).aggregate([(k, "sum") for k in names])
    grouped = grouped.filter(pa.array(grouped.column("f_sum").to_numpy() > 0))
    days = float(windows.days)
    out: dict[str, Any] = {USER_ID: grouped.column(USER_ID)}
    for i, c in enumerate(columns):
        out[f"{c}_mean"] = grouped.column(f"s{i}_sum").to_numpy() / days
        out[f"{c}_active"] = grouped.column(f"a{i}_sum").to_numpy().astype(np.float64) / days
    out["active_days"] = grouped.column("f_sum").to_numpy().astype(np.float64) / days
    out[LABEL] = (grouped.column("l_sum").to_numpy() > 0).astype(np.int64)
    id_type = "int64" if pa.types.is_integer(rows.schema.field(USER_ID).type) else "string"
    return pa.table(out, schema=features_schema(columns, id_type))


def features_table(parts: Iterable[pa.Table], *, windows: FeatureWindows, columns: Sequence[str], label_column: str,
                   id_type: str, rows: Mapping[str, Any]) -> pa.Table:
    """The features file's table: the per-user parts (:func:`user_features` of disjoint sets of
    users) in one table sorted by ``user_id``, with the schema metadata :data:`FEATURES_KEY` (what
    the features are) and :data:`ROWS_KEY` (``rows``: the run's token and exact row counts)."""
    schema = features_schema(columns, id_type)
    table = pa.concat_tables([schema.empty_table(), *(p.cast(schema) for p in parts)])
    table = table.sort_by(USER_ID) if table.num_rows else table
    start, end, label_start, label_end = windows.given
    meta = {
        FEATURES_KEY: json.dumps({
            "feature_columns": feature_names(columns), "label": LABEL, "label_column": label_column,
            "feature_window": [start, end], "label_window": [label_start, label_end],
            "indicator_columns": list(columns), "classes": BINARY_CLASSES,
        }),
        ROWS_KEY: json.dumps(dict(rows), sort_keys=True),
    }
    return table.combine_chunks().replace_schema_metadata(meta)


def write_features(table: pa.Table, out: str | os.PathLike) -> None:
    """Write ``table`` to ``out`` whole or not at all: a local path through
    :func:`renyi_stream.stream.private_files.write_private` (a scratch file ``0600`` beside it, renamed over it;
    missing folders ``0700``); a URI (``gs://``, ``s3://``) through ``pyarrow.fs`` to a scratch
    object beside it, then moved (its permissions are the bucket's IAM policy)."""
    text = str(out)
    if "://" not in text:
        write_private(Path(text), lambda handle: pq.write_table(table, handle))
        return
    fs, path = pafs.FileSystem.from_uri(text)
    folder, name = path.rsplit("/", 1)
    fs.create_dir(folder, recursive=True)
    scratch = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with fs.open_output_stream(scratch) as handle:
            pq.write_table(table, handle)
        fs.move(scratch, path)
    finally:
        if fs.get_file_info(scratch).type != pafs.FileType.NotFound:
            fs.delete_file(scratch)


def read_rows_record(out: str | os.PathLike) -> dict[str, Any] | None:
    """The :data:`ROWS_KEY` record of the features file at ``out`` (a path or URI), None when
    there is no such file or it has none."""
    text = str(out)
    try:
        if "://" in text:
            fs, path = pafs.FileSystem.from_uri(text)
            with fs.open_input_file(path) as handle:
                schema = pq.read_schema(handle)
        else:
            if not Path(text).is_file():
                return None
            schema = pq.read_schema(text)
    except (pa.ArrowException, OSError):
        return None
    raw = (schema.metadata or {}).get(ROWS_KEY)
    return json.loads(raw) if raw is not None else None


#: Why a features row is not trained on (curator-only counts in the training report), in the
#: order a row is given its one reason: feature reasons first, then label reasons.
FEATURE_DEAD_LETTERS = ("feature_null", "feature_not_finite")
LABEL_DEAD_LETTERS = ("label_null", "label_not_integer", "label_negative", "label_out_of_range")


@dataclass(frozen=True)
class Features:
    """A features file loaded for training: the rows to train on (ids ``(n,)``, ``x`` ``(n, d)``
    float64, ``labels`` ``(n,)`` int64 in ``[0, n_classes)``), the feature column names, the
    declared number of classes and where it was declared, and the rows left out.

    ``dead_letters`` (reason -> rows, curator-only: exact counts) holds every reason of
    :data:`FEATURE_DEAD_LETTERS` and :data:`LABEL_DEAD_LETTERS`; each row left out has one."""

    user_ids: pa.Array
    x: np.ndarray
    labels: np.ndarray
    feature_columns: tuple[str, ...]
    n_classes: int
    classes_from: str = "features file"
    dead_letters: Mapping[str, int] = field(default_factory=dict)


def _classes_at_least_2(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise ValueError(f"{name} must be an integer >= 2, got {name}={value!r}")
    return int(value)


def declared_classes(path: str | os.PathLike, recorded: Any, classes: int | None) -> tuple[int, str]:
    """The number of classes a training run uses and who declared it: ``classes`` (the curator,
    ``--classes``) or the features file's record (:data:`FEATURES_KEY` ``classes``). Never the
    labels. ValueError naming ``classes`` when neither declares it, when they differ, or when a
    value is not an integer >= 2."""
    if recorded is not None:
        try:
            recorded = _classes_at_least_2("classes", recorded)
        except ValueError:
            raise ValueError(f"features file {path} records classes={recorded!r}, not an integer >= 2") from None
    if classes is None:
        if recorded is None:
            raise ValueError(f"classes must be declared (--classes N, an integer >= 2): the features file {path} "
                             "records none, and a model's shape is never read off its labels")
        return recorded, "features file"
    classes = _classes_at_least_2("classes", classes)
    if recorded is not None and recorded != classes:
        raise ValueError(f"classes must equal the features file's declared classes={recorded} (labels 0 to "
                         f"{recorded - 1}), got classes={classes}")
    return classes, "--classes"


def _row_reasons(table: pa.Table, feature_columns: Sequence[str], label_column: str, n_classes: int,
                 dtype: Any, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x float64, labels int64, reason)`` for every row: ``reason`` indexes
    ``FEATURE_DEAD_LETTERS + LABEL_DEAD_LETTERS`` (-1: trained on). Vectorised per column."""
    n = table.num_rows
    reasons = FEATURE_DEAD_LETTERS + LABEL_DEAD_LETTERS
    reason = np.full(n, -1, dtype=np.int64)

    def mark(code: str, rows: np.ndarray) -> None:  # the first reason a row meets is its reason
        reason[(reason < 0) & rows] = reasons.index(code)

    cols: list[np.ndarray] = []
    null = np.zeros(n, dtype=bool)
    for name in feature_columns:
        if name not in table.column_names:
            raise ValueError(f"features file {path} has no feature column {name!r}")
        col = table.column(name)
        null |= np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        filled = pc.fill_null(col, pa.scalar(0).cast(col.type)) if col.null_count else col
        cols.append(np.asarray(filled.to_numpy(zero_copy_only=False)).astype(np.float64))
    x = np.column_stack(cols)
    mark("feature_null", null)
    # Not finite, or past the range of the dtype the run computes in (1e39 is inf in float32).
    with np.errstate(over="ignore"):
        mark("feature_not_finite", ~np.isfinite(x.astype(dtype)).all(axis=1))

    label_col = table.column(label_column)
    kind = label_col.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise ValueError(f"label column {label_column!r} in {path} must be integers, got {kind}")
    mark("label_null", np.asarray(label_col.is_null().to_numpy(zero_copy_only=False), dtype=bool))
    values = np.asarray(pc.fill_null(label_col, pa.scalar(0).cast(kind)).to_numpy(zero_copy_only=False))
    if pa.types.is_floating(kind):
        whole = np.isfinite(values) & (np.floor(values) == values)
        mark("label_not_integer", ~whole)
        values = np.where(whole, values, 0.0)
    mark("label_negative", values < 0)
    mark("label_out_of_range", values >= n_classes)
    labels = np.where(reason < 0, values, 0).astype(np.int64)
    return x, labels, reason


def load_features(path: str | os.PathLike, *, label_column: str = LABEL,
                  feature_columns: Sequence[str] | None = None, classes: int | None = None,
                  dtype: Any = np.float64) -> Features:
    """Read a features Parquet file (``user_id``, numeric features, a numeric ``label``) for
    training with ``n_classes`` declared by ``classes`` or by the file (:func:`declared_classes`).

    ``feature_columns`` defaults to the list recorded by the features stage (:data:`FEATURES_KEY`), else every
    numeric column other than ``user_id`` and the label. A row whose feature is null or not finite
    in ``dtype`` (the run's), or whose label is null, not an integer, negative or ``>= n_classes``,
    is left out (one user's bytes never stop the others' run) and counted by reason in
    ``dead_letters``. Refuses a file that group/others may read (naming it and the fix,
    ``chmod 600``: it holds the users' data), missing columns, a label column that is not numeric
    and null user ids, naming the column.
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
    raw = (table.schema.metadata or {}).get(FEATURES_KEY)
    meta = json.loads(raw) if raw is not None else {}
    if feature_columns is None:
        if raw is not None:
            feature_columns = meta["feature_columns"]
        else:
            feature_columns = [f.name for f in table.schema if f.name not in (USER_ID, label_column)
                               and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                                    or pa.types.is_boolean(f.type))]
    if not feature_columns:
        raise ValueError(f"features file {path} has no numeric feature columns")
    n_classes, classes_from = declared_classes(path, meta.get("classes"), classes)
    ids: Any = table.column(USER_ID).combine_chunks()
    if ids.null_count:
        raise ValueError(f"user_id in {path} has null values")
    x, labels, reason = _row_reasons(table, feature_columns, label_column, n_classes, dtype, path)
    # No row left to train on is not refused: whether a model is trained (and published) must not
    # hinge on one user's row (issue 37, item 1); a run over nobody releases noise, charged to nobody.
    keep = reason < 0
    counts = np.bincount(reason[~keep], minlength=len(FEATURE_DEAD_LETTERS) + len(LABEL_DEAD_LETTERS))
    dead = {code: int(c) for code, c in zip(FEATURE_DEAD_LETTERS + LABEL_DEAD_LETTERS, counts)}
    return Features(user_ids=ids.filter(pa.array(keep)), x=x[keep], labels=labels[keep],
                    feature_columns=tuple(feature_columns), n_classes=n_classes, classes_from=classes_from,
                    dead_letters=dead)
