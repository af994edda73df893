"""Dead letters: which rows are dead-lettered, why, and the one table they are written as.

Every job counts its late and bad rows instead of losing them (invariant 7
(rows-counted-not-lost, docs/architecture.md)): each such row becomes one row of
:data:`DEAD_LETTER_SCHEMA`, built by :func:`dead_letters` and nothing else, with a reason from the
one vocabulary :class:`renyi_stream.stream.schema.DeadLetterReason` (its docstring says what each reason
means). Where each reason comes from, the same word in all three jobs for the same situation:

* ``null_user_id``, ``empty_user_id``, ``null_time``, ``bad_time``, ``null_value``,
  ``wrong_type``, ``non_finite_value``, ``duplicate_user_window`` (within one batch): the
  validator :func:`renyi_stream.stream.schema.validate_batch`, for each file batch of the batch jobs
  (``ReadAndValidate``) and each message of the streaming job (``DecodeAndValidate``); written
  by :func:`rejected_letters`.
* ``malformed_row``: a CSV line the reader (:func:`renyi_stream.stream.engine.readers.read_batches`) could not
  split, in the batch jobs (streaming messages are Arrow, never CSV).
* ``out_of_range_time`` and ``late_window``: :func:`classify_windows`, the one rule for a row's
  window against the public schedule and what was charged before, called by the batch jobs'
  reader (``ReadAndValidate``) and by the streaming filter as each row arrives
  (``StreamingIndividualFilterDoFn``); written by :func:`window_letters`. The jobs pass no
  window bounds to the validator, so no other step decides these two.
* ``duplicate_user_window`` (across batches): the filter's event-time order keeps the first row
  of each (user, window) (``renyi_stream.pipelines.beam.transforms.first_per_user_window``, both filters);
  written by :func:`row_letters`.
* ``undecodable_message``: a streaming message that does not decode or fails the schema as a
  whole, one dead letter for the message (``renyi_stream.pipelines.streaming.codec.MessageValidator``).
* ``outside_file_days``: :func:`classify_windows` given the windows of the days a batch job's
  input file holds (:mod:`renyi_stream.stream.engine.input_days`): a row of another day than its
  file's, in the batch jobs' reader (``ReadAndValidate``).

Every dead letter names its input the same way in all three jobs: the file path or the message
name (a Pub/Sub message id, a Kafka ``topic/partition/offset``, a replayed file's path). Rows that
pass validation carry their input's number (:data:`SOURCE`, the tie-break of the event-time
order) and, in their schema metadata, the number's name (:data:`SOURCE_NAMES`,
:func:`with_input_position`), so the steps that dead-letter them later (the window rule, the
duplicate rule in either filter) name the input without a column per row.

Dead letters hold exact rows: curator only (invariant 4 (nothing-pre-noise-leaves,
docs/architecture.md)). Beam-free: the jobs' DoFns call these functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.schema import WINDOW_ID, DeadLetterReason

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "ROW",
    "SOURCE",
    "SOURCE_NAMES",
    "DeadLetterReason",
    "WindowClasses",
    "classify_windows",
    "dead_letters",
    "raw_json",
    "rejected_letters",
    "row_letters",
    "source_names",
    "window_letters",
    "with_input_position",
    "with_source_names",
]

#: The columns of a validated row's input position, ``(source, row)``: the input's number (a batch
#: job's file index, a replayed file's index in ``--replay``, a streaming message's number from its
#: name) and the row's index in it. The deterministic tie-break of the event-time order
#: (invariant 2) and the ``row_index`` of the row's dead letter.
SOURCE = "_source"
ROW = "_row"
#: The schema-metadata key under which validated rows carry their inputs' names, JSON
#: ``{"<source number>": "<name>"}`` (a file path, a message name): whichever step dead-letters a
#: row (the reader, either filter) names its input by it, with no column per row. Take, filter,
#: slices and Arrow IPC keep it; :func:`with_source_names` puts it back on a concatenation.
SOURCE_NAMES = b"renyi_stream.source_names"

#: Every job's dead-letter rows: where the row came from (a file path or a message name; a
#: validated row's source number as text only for rows that carry no name), its row index there
#: (-1 for a whole CSV line or message), the :class:`renyi_stream.stream.schema.DeadLetterReason` value, a
#: human-readable detail, and the row itself (JSON, or the CSV line, or the message's first bytes
#: in hex) for replay.
DEAD_LETTER_SCHEMA = pa.schema([
    ("source", pa.string()), ("row_index", pa.int64()), ("reason", pa.string()),
    ("detail", pa.string()), ("raw", pa.string()),
])

_VOCABULARY = pa.array([reason.value for reason in DeadLetterReason], type=pa.string())


def dead_letters(reason: DeadLetterReason | pa.Array | pa.ChunkedArray, *, source: Any, row_index: Any,
                 detail: Any, raw: Any) -> pa.Table:
    """The dead-letter rows (:data:`DEAD_LETTER_SCHEMA`) of ``n`` rows: the one builder every job
    calls.

    ``reason`` is one :class:`renyi_stream.stream.schema.DeadLetterReason` for every row, or an Arrow array of
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
    """Dead letters of the validator's rejected rows (:data:`renyi_stream.stream.schema.REJECTED_SCHEMA`) of
    one batch read from ``source``, whose first row is row ``offset`` there."""
    return dead_letters(rejected.column("reason"), source=source,
                        row_index=pc.add(rejected.column("row_index"), offset).cast(pa.int64()),
                        detail=rejected.column("detail"), raw=rejected.column("raw"))


def malformed_letters(source: str, lines: pa.Table) -> pa.Table:
    """Dead letters (``malformed_row``) of the CSV lines ``lines`` read from ``source``: what
    :meth:`renyi_stream.stream.engine.readers.MalformedLines.drain` gives (columns ``line``, ``raw``,
    ``why``). Each says its line number and why in ``detail``; ``row_index`` is -1 (the line is
    no row). Built column-wise, so a file of millions of bad lines costs no Python per line."""
    detail = pc.binary_join_element_wise("line ", pc.cast(lines.column("line"), pa.string()), ": ",
                                         pc.cast(lines.column("why"), pa.string()), "")
    return dead_letters(DeadLetterReason.MALFORMED_ROW, source=source, row_index=-1, detail=detail,
                        raw=lines.column("raw"))


def raw_json(rows: pa.Table) -> pa.Array:
    """Each row of ``rows`` as a JSON object (values JSON can hold, anything else as text)."""
    # Dead-letter rows are rare: a Python loop over them is fine (never over valid rows).
    return pa.array([json.dumps(r, default=str) for r in rows.to_pylist()], type=pa.string())


def with_input_position(rows: pa.Table, *, source: int, name: str, row_index: Any) -> pa.Table:
    """``rows``, the validated rows of one input, with their input position: :data:`SOURCE`
    ``source`` (the input's number), :data:`ROW` ``row_index`` (each row's index in the input, one
    per row) and the input's ``name`` (its path or message name) under :data:`SOURCE_NAMES`.
    What the batch jobs' reader and the streaming job's decoder give every valid row."""
    positioned = rows.append_column(SOURCE, pa.array(np.full(rows.num_rows, int(source), dtype=np.int64)))
    positioned = positioned.append_column(ROW, _column(row_index, rows.num_rows, pa.int64()))
    return with_source_names(positioned, {int(source): str(name)})


def source_names(tables: Iterable[pa.Table]) -> dict[int, str]:
    """``source number -> name`` of every input the rows of ``tables`` carry (:data:`SOURCE_NAMES`);
    one entry per input, read once per table, never per row."""
    names: dict[int, str] = {}
    for table in tables:
        text = (table.schema.metadata or {}).get(SOURCE_NAMES)
        if text:
            names.update((int(number), name) for number, name in json.loads(text).items())
    return names


def with_source_names(table: pa.Table, names: dict[int, str]) -> pa.Table:
    """``table`` carrying ``names`` (``source number -> name``) under :data:`SOURCE_NAMES`, its
    other schema metadata kept: for a concatenation of positioned tables, whose schema keeps only
    the first table's metadata."""
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != SOURCE_NAMES}
    if names:
        metadata[SOURCE_NAMES] = json.dumps({str(k): v for k, v in sorted(names.items())}).encode()
    return table.replace_schema_metadata(metadata or None)


def _named_sources(rows: pa.Table) -> pa.Array:
    """Each row's input name from :data:`SOURCE_NAMES` (vectorised: one lookup per distinct
    input), its :data:`SOURCE` number as text where ``rows`` carries no name for it."""
    numbers = rows.column(SOURCE).combine_chunks().cast(pa.int64())
    names = source_names([rows])
    as_text = pc.cast(numbers, pa.string())
    if not names:
        return as_text
    index = pc.index_in(numbers, value_set=pa.array(list(names), type=pa.int64()))
    return pc.coalesce(pc.take(pa.array(list(names.values()), type=pa.string()), index), as_text)


def row_letters(rows: pa.Table, reason: DeadLetterReason, *, detail: str | Sequence[str] | pa.Array) -> pa.Table:
    """Dead letters for validated ``rows`` (with their :data:`SOURCE`/:data:`ROW` input position):
    ``source`` is each row's input name (:data:`SOURCE_NAMES`: the file path or message name, the
    same in every job; the source number as text for rows that carry none), ``row_index`` the
    row's index there, ``raw`` the row without its input position."""
    position = [c for c in (SOURCE, ROW) if c in rows.column_names]
    return dead_letters(reason, source=_named_sources(rows), row_index=rows.column(ROW), detail=detail,
                        raw=raw_json(rows.drop_columns(position)))


@dataclass(frozen=True)
class WindowClasses:
    """What :func:`classify_windows` decided for each row: ``late`` (its window was charged
    before), ``out_of_schedule`` (outside ``start_window..end_window`` and not late), or kept."""

    late: np.ndarray
    out_of_schedule: np.ndarray
    start_window: int
    end_window: int
    outside_file: np.ndarray | None = None
    file_windows: tuple[int, int] | None = None

    @property
    def keep(self) -> np.ndarray:
        """The rows neither outside their file's days, late nor out of schedule: the ones to charge."""
        kept = ~(self.late | self.out_of_schedule)
        return kept if self.outside_file is None else kept & ~self.outside_file

    @property
    def all_kept(self) -> bool:
        return not (self.late.any() or self.out_of_schedule.any()
                    or (self.outside_file is not None and self.outside_file.any()))

    def reasons(self) -> Iterator[tuple[DeadLetterReason, np.ndarray]]:
        """``(reason, mask)`` for each reason some row has."""
        for reason, mask in ((DeadLetterReason.OUTSIDE_FILE_DAYS, self.outside_file),
                             (DeadLetterReason.LATE_WINDOW, self.late),
                             (DeadLetterReason.OUT_OF_RANGE_TIME, self.out_of_schedule)):
            if mask is not None and mask.any():
                yield reason, mask


def classify_windows(window_ids: Any, *, start_window: int, end_window: int, charged: Iterable[int] = (),
                     charged_through: int | None = None,
                     file_windows: tuple[int, int] | None = None) -> WindowClasses:
    """The one rule for a row's window, used by every job before a row reaches a charge.

    First, with ``file_windows`` (the first and last window of the days the row's input file
    holds: :meth:`renyi_stream.stream.engine.input_days.FileDays.window_range`), a row of a window
    outside them is **outside its file's days** (``outside_file_days``): a file's name is believed
    over its rows, so a stray row never charges a day its file does not name. Then:
    A row is **late** (``late_window``) when its window was charged before: it is in
    ``charged`` (windows charged by earlier runs, hence perhaps released), or in
    ``start_window..charged_through`` (windows this streaming shard has charged; None for a
    batch run, which charges its schedule only at the end). Charging it now would charge its
    user twice for a window or change a release (invariant 6 (charge-once, docs/architecture.md)
    and invariant 5 (release-once, docs/architecture.md)). Otherwise a row outside the public schedule
    ``start_window..end_window`` is **out of schedule** (``out_of_range_time``): the schedule is
    decided before the data (invariant 3 (public-schedule, docs/architecture.md)). Every other
    row is kept. Vectorised over ``window_ids`` (int64). ValueError when ``end_window <
    start_window``."""
    start, end = int(start_window), int(end_window)
    if end < start:
        raise ValueError(f"end_window must be >= start_window={start}, got end_window={end}")
    windows = np.asarray(window_ids.to_numpy() if isinstance(window_ids, (pa.Array, pa.ChunkedArray))
                         else window_ids, dtype=np.int64)
    before = np.fromiter((int(w) for w in charged), dtype=np.int64)
    outside = None
    if file_windows is not None:
        low, high = int(file_windows[0]), int(file_windows[1])
        outside = (windows < low) | (windows > high)
    late = np.isin(windows, before) if before.size else np.zeros(windows.shape, dtype=bool)
    if charged_through is not None:
        late |= (windows >= start) & (windows <= int(charged_through))
    if outside is not None:
        late &= ~outside
    out_of_schedule = ~late & ((windows < start) | (windows > end))
    if outside is not None:
        out_of_schedule &= ~outside
    return WindowClasses(late=late, out_of_schedule=out_of_schedule, start_window=start, end_window=end,
                         outside_file=outside, file_windows=None if file_windows is None else (low, high))


def window_letters(rows: pa.Table, classes: WindowClasses) -> pa.Table:
    """Dead letters for the rows of ``rows`` that ``classes`` (of the same rows) does not keep,
    each with its reason and its window in the detail, named as :func:`row_letters` names them."""
    parts = [DEAD_LETTER_SCHEMA.empty_table()]
    for reason, mask in classes.reasons():
        dead = rows.filter(pa.array(mask))
        what = ("was already charged" if reason is DeadLetterReason.LATE_WINDOW
                else f"is outside its file's windows {classes.file_windows[0]}..{classes.file_windows[1]}"
                if reason is DeadLetterReason.OUTSIDE_FILE_DAYS
                else f"is outside the schedule {classes.start_window}..{classes.end_window}")
        detail = pc.binary_join_element_wise("window ", pc.cast(dead.column(WINDOW_ID), pa.string()), f" {what}", "")
        parts.append(row_letters(dead, reason, detail=detail))
    return pa.concat_tables(parts)
