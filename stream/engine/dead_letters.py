"""Dead letters: which rows are dead-lettered, why, and the one table they are written as.

Every job counts its late and bad rows instead of losing them (invariant 7
(rows-counted-not-lost, docs/architecture.md)): each such row becomes one row of
:data:`DEAD_LETTER_SCHEMA`, built by :func:`dead_letters` and nothing else, with a reason from the
one vocabulary :class:`stream.schema.DeadLetterReason` (its docstring says what each reason
means). Where each reason comes from, the same word in all three jobs for the same situation:

* ``null_user_id``, ``empty_user_id``, ``null_time``, ``bad_time``, ``null_value``,
  ``wrong_type``, ``non_finite_value``, ``duplicate_user_window`` (within one batch): the
  validator :func:`stream.schema.validate_batch`, for each file batch of the batch jobs
  (``ReadAndValidate``) and each message of the streaming job (``DecodeAndValidate``); written
  by :func:`rejected_letters`.
* ``malformed_row``: a CSV line the reader (:func:`stream.engine.readers.read_batches`) could not
  split, in the batch jobs (streaming messages are Arrow, never CSV).
* ``out_of_range_time`` and ``late_window``: a row's window against the schedule and what was
  charged before, in the batch jobs' reader and in the streaming filter as each row arrives;
  written by :func:`row_letters`.
* ``duplicate_user_window`` (across batches): the filter's event-time order keeps the first row
  of each (user, window) (``pipelines.beam.transforms.first_per_user_window``, both filters);
  written by :func:`row_letters`.
* ``undecodable_message``: a streaming message that does not decode or fails the schema as a
  whole, one dead letter for the message (``pipelines.streaming.job.DecodeAndValidate``).

Dead letters hold exact rows: curator only (invariant 4 (nothing-pre-noise-leaves,
docs/architecture.md)). Beam-free: the jobs' DoFns call these functions.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stream.schema import DeadLetterReason

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "ROW",
    "SOURCE",
    "DeadLetterReason",
    "dead_letters",
    "raw_json",
    "rejected_letters",
    "row_letters",
]

#: The columns of a validated row's input position, ``(source, row)``: the file index or message
#: number, and the row's index in it. The deterministic tie-break of the event-time order
#: (invariant 2) and the ``row_index`` of the row's dead letter.
SOURCE = "_source"
ROW = "_row"

#: Every job's dead-letter rows: where the row came from (a file path, a message name, or a
#: validated row's source number as text), its row index there (-1 for a whole CSV line or
#: message), the :class:`stream.schema.DeadLetterReason` value, a human-readable detail, and
#: the row itself (JSON, or the CSV line, or the message's first bytes in hex) for replay.
DEAD_LETTER_SCHEMA = pa.schema([
    ("source", pa.string()), ("row_index", pa.int64()), ("reason", pa.string()),
    ("detail", pa.string()), ("raw", pa.string()),
])

_VOCABULARY = pa.array([reason.value for reason in DeadLetterReason], type=pa.string())


def dead_letters(reason: DeadLetterReason | pa.Array | pa.ChunkedArray, *, source: Any, row_index: Any,
                 detail: Any, raw: Any) -> pa.Table:
    """The dead-letter rows (:data:`DEAD_LETTER_SCHEMA`) of ``n`` rows: the one builder every job
    calls.

    ``reason`` is one :class:`stream.schema.DeadLetterReason` for every row, or an Arrow array of
    reason values, one per row. Each of ``source`` (text or integers, written as text),
    ``row_index``, ``detail`` and ``raw`` is one value for every row or an array (Arrow, NumPy
    or a list) of one value per row; ``n`` is the arrays' common length, 1 when every argument
    is a single value. ValueError when ``reason`` holds a value outside the vocabulary, is a
    plain string, or the arrays' lengths differ."""
    given = {"reason": reason, "source": source, "row_index": row_index, "detail": detail, "raw": raw}
    lengths = {name: len(value) for name, value in given.items() if _is_array(value)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"dead letters need one value or one per row for each column, got lengths {lengths}")
    n = next(iter(lengths.values()), 1)
    if _is_array(reason):
        reasons = _column(reason, n, pa.string())
        unknown = pc.unique(reasons.filter(pc.invert(pc.is_in(reasons, value_set=_VOCABULARY)))).to_pylist()
        if unknown or reasons.null_count:
            raise ValueError(f"reason must be a DeadLetterReason value, got {unknown or [None]}")
    elif isinstance(reason, DeadLetterReason):
        reasons = _column(reason.value, n, pa.string())
    else:
        raise ValueError(f"reason must be a DeadLetterReason or an array of its values, got reason={reason!r}")
    return pa.table({
        "source": _column(source, n, pa.string()),
        "row_index": _column(row_index, n, pa.int64()),
        "reason": reasons,
        "detail": _column(detail, n, pa.string()),
        "raw": _column(raw, n, pa.string()),
    }, schema=DEAD_LETTER_SCHEMA)


def _is_array(value: Any) -> bool:
    return isinstance(value, (pa.Array, pa.ChunkedArray, np.ndarray, list, tuple))


def _column(value: Any, n: int, type_: pa.DataType) -> pa.Array:
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if isinstance(value, pa.Array):
        return value if value.type == type_ else pc.cast(value, type_)
    if isinstance(value, (np.ndarray, list, tuple)):
        array = pa.array(value)
        return array if array.type == type_ else pc.cast(array, type_)
    return pa.repeat(pa.scalar(str(value) if pa.types.is_string(type_) else value, type=type_), n)


def rejected_letters(source: str, rejected: pa.Table, *, offset: int = 0) -> pa.Table:
    """Dead letters of the validator's rejected rows (:data:`stream.schema.REJECTED_SCHEMA`) of
    one batch read from ``source``, whose first row is row ``offset`` there."""
    return dead_letters(rejected.column("reason"), source=source,
                        row_index=pc.add(rejected.column("row_index"), offset).cast(pa.int64()),
                        detail=rejected.column("detail"), raw=rejected.column("raw"))


def raw_json(rows: pa.Table) -> pa.Array:
    """Each row of ``rows`` as a JSON object (values JSON can hold, anything else as text)."""
    # Dead-letter rows are rare: a Python loop over them is fine (never over valid rows).
    return pa.array([json.dumps(r, default=str) for r in rows.to_pylist()], type=pa.string())


def row_letters(rows: pa.Table, reason: DeadLetterReason, *, detail: str | Sequence[str] | pa.Array,
                source: str | None = None) -> pa.Table:
    """Dead letters for validated ``rows`` (with their :data:`SOURCE`/:data:`ROW` input position):
    ``row_index`` is the row's index in its source, ``source`` the given one (a file path) or,
    when None, each row's source number as text; ``raw`` is the row without its input position."""
    position = [c for c in (SOURCE, ROW) if c in rows.column_names]
    return dead_letters(reason, source=rows.column(SOURCE) if source is None else source,
                        row_index=rows.column(ROW), detail=detail, raw=raw_json(rows.drop_columns(position)))
