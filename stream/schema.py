"""The Arrow schema of an indicator batch, and its vectorised validator.

An *indicator batch* is what the platform emits every day: one row per user with a few numeric
indicators. This module documents its schema and splits any batch into valid rows and rejected
(dead-letter) rows, each rejected row with a reason (invariant 7 (rows-counted-not-lost,
docs/architecture.md): late and bad rows are counted, not lost). Nothing is dropped silently::

    result.valid.num_rows + result.rejected.num_rows == batch.num_rows

Input batch (a ``pa.RecordBatch`` or ``pa.Table``)
--------------------------------------------------
The id and time columns are ``user_id`` and ``day``/``event_time`` unless ``keys=``
(:class:`InputKeys`, a ledger's declared contract: ``--id-column``, ``--day-column``,
``--event-time-column``) names others: then the declared columns are read as them, whatever
else the batch holds, and dead letters and errors name them as the input does.

``user_id`` (required)
    Any integer type (cast to int64) or a string type (utf8, large_utf8, string_view; kept as
    utf8). String ids are compared exactly, byte for byte: no trimming, no Unicode
    normalisation; very long and non-ASCII ids are fine. An unsigned id above ``2**63 - 1``
    does not fit int64 and rejects its row (``wrong_type``, detail names ``user_id``); so
    does the id ``-2**63`` (:data:`RESERVED_USER_ID`), which the ledger's index reserves.

exactly one of ``day`` or ``event_time`` (required)
    ``day``: date32, date64 or a string ``'YYYY-MM-DD'`` (surrounding whitespace ignored).
    The row's window is that of the date's midnight UTC.
    ``event_time``: a timestamp of any unit, or an ISO-8601 string
    (``YYYY-MM-DD[(T|t|space)HH:MM[:SS[.fff]]][Z|+HH[:MM]|-HH[:MM]]``). Timestamps with a time
    zone are converted to UTC; **naive timestamps and strings without an offset are taken as
    UTC**. Fractions of a second never change the window (window bounds are whole seconds).
    A string that is null, empty or blank is a missing time (``null_time``). Every kind of
    time must fall in 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z (``MIN_TIME_SECONDS``,
    ``MAX_TIME_SECONDS``), else the row is ``bad_time``.

indicator columns
    Every other column, or exactly those named by ``indicator_columns=[...]`` (then all other
    columns are ignored). Each must be numeric (integer, unsigned, floating, bool, decimal) or a
    string. Values are returned as float64: bool becomes 0.0/1.0, and integers or decimals
    beyond float64 precision (``|x| > 2**53``) are rounded to the nearest float64, which is
    accepted. A string column (e.g. read from CSV) is parsed per value after trimming
    whitespace: decimal or scientific notation, ``inf``/``infinity``/``nan`` in any case (these
    then reject as ``non_finite_value``) and ``true``/``false``; an empty or blank string is a
    missing value (``null_value``); anything else rejects the row as ``wrong_type``.

category columns (optional)
    String columns named by ``category_columns=[...]`` (e.g. a plan tier ``'free'``/``'pro'``),
    read by histogram queries over string categories: passed through as utf8, never parsed as
    numbers; a null is kept (it falls in no bucket). A non-string category column is a
    :class:`SchemaError`; so is a column named both as indicator and as category.

A column of Arrow type ``null`` (all values missing, as CSV readers infer for an empty column)
is accepted in every role and rejects all its rows. Dictionary-encoded columns are decoded.

Whole-batch problems raise :class:`SchemaError` (a ``ValueError``) naming the column and the
type found: no ``user_id``, no time column, both ``day`` and ``event_time``, no indicator
columns, an unsupported type (e.g. a list or binary column), a named indicator column that is
missing, a repeated column name, or an indicator named ``window_id`` (reserved for the output).

Output (:class:`ValidatedBatch`)
--------------------------------
``valid``: ``user_id`` (int64 or utf8, as the input), ``window_id`` (int64), then the
indicator columns as float64 in input order (no nulls), then the category columns (utf8);
rows in input order. See
:func:`valid_schema`.

``rejected``: ``row_index`` (int64, position in the input batch), ``reason`` (a
:class:`DeadLetterReason` value), ``detail`` (the offending column, and value when short) and
``raw`` (the row as a JSON object of the columns the validator read, user id, time and
indicators, so that a dead-letter row can be replayed); sorted by ``row_index``. See
:data:`REJECTED_SCHEMA`. ``raw`` is strict JSON: NaN and infinities are written as the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (which the validator parses back), dates and
timestamps as strings, decimals as numbers.

A rejected row gets the first matching reason in this order: null user id, empty user id
(then an unsigned id beyond int64 or the reserved id, as ``wrong_type``), null time, bad
time, null indicator, unparseable indicator string (``wrong_type``), NaN/inf indicator, window outside
``[start_window, end_window]``, duplicate ``(user_id, window_id)``. Within one reason the first
indicator column in input order is named. Among the rows that pass every other check, the first
occurrence (lowest row index) of a ``(user_id, window_id)`` pair stays valid and later ones are
rejected as duplicates.

All work is vectorised with ``pyarrow.compute`` and NumPy: loops run over columns, never rows.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.arrow_compat import plain_strings
from renyi_stream.stream.xp import array_module

__all__ = [
    "DAY",
    "EVENT_TIME",
    "MAX_ABS_SECONDS",
    "MAX_TIME_SECONDS",
    "MIN_TIME_SECONDS",
    "REJECTED_SCHEMA",
    "RESERVED_USER_ID",
    "USER_ID",
    "WINDOW_ID",
    "DeadLetterReason",
    "InputKeys",
    "RejectReason",
    "SchemaError",
    "ValidatedBatch",
    "WindowSpec",
    "indicator_schema",
    "valid_schema",
    "validate_batch",
]

USER_ID = "user_id"
DAY = "day"
EVENT_TIME = "event_time"
WINDOW_ID = "window_id"

#: Supported times, Unix seconds: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z, the span
#: of a four-digit ISO-8601 year. Times outside it are ``bad_time`` whatever their type.
MIN_TIME_SECONDS = -62_135_596_800
MAX_TIME_SECONDS = 253_402_300_799
#: Largest ``|origin_seconds|`` of a :class:`WindowSpec`, and largest ``|seconds|`` that
#: :meth:`WindowSpec.window_of_seconds` accepts: with both below 2**61, ``seconds - origin``
#: cannot overflow int64.
MAX_ABS_SECONDS = 2**61

#: The int64 minimum marks empty slots in the ledger's id index (``renyi_stream.stream.id_index``), so it
#: can never be a user id: a row carrying it is rejected (``wrong_type``) rather than left to
#: fail the whole job at the ledger.
RESERVED_USER_ID = -(2**63)

_SECONDS_PER_DAY = 86_400
_DETAIL_MAX_CHARS = 40  # longer values are cut in `detail` (never in `raw`)


class SchemaError(ValueError):
    """A whole batch cannot be validated: a required column is missing or has a bad type."""


#: The most characters a key column's name may have (as an indicator column's).
_MAX_KEY_NAME = 128


@dataclass(frozen=True)
class InputKeys:
    """Which input columns hold the user id and the time: a ledger's declared contract names them
    (:mod:`renyi_stream.stream.contract`, ``--id-column``, ``--day-column``, ``--event-time-column``).

    ``id_column`` (default ``user_id``) holds the id. The time is ``day_column`` (dates: date32,
    date64 or ``YYYY-MM-DD`` text) or ``event_time_column`` (timestamps or ISO-8601 text), at most
    one of them; with neither (the default) it is ``day`` or ``event_time``, whichever the input
    has (exactly one). ``day_column="day"`` and ``event_time_column="event_time"`` are that
    default (normalised to it: a declaration of the defaults is the default).

    The declared names are the only columns read as the id and the time: another column of an
    input, ``user_id`` or ``day`` among them, is read only when declared as an indicator or
    category (and those names stay reserved: no indicator is named ``user_id``, ``day``,
    ``event_time`` or ``window_id``), so which column is whose is never ambiguous. Dead letters and
    messages name the declared columns; validated rows carry the id as ``user_id`` and the window
    as ``window_id`` whatever the input called them. ValueError, naming the option, for a name
    that is not 1 to 128 printable characters, both time columns, one name for the id and the
    time, an id column named ``day``, ``event_time`` or ``window_id``, a time column named
    ``user_id`` or ``window_id``, or a day column named ``event_time`` (and the reverse)."""

    id_column: str = USER_ID
    day_column: str | None = None
    event_time_column: str | None = None

    def __post_init__(self) -> None:
        for option, name in (("--id-column", self.id_column), ("--day-column", self.day_column),
                             ("--event-time-column", self.event_time_column)):
            if name is None and option != "--id-column":
                continue
            if not isinstance(name, str) or not 0 < len(name) <= _MAX_KEY_NAME or not name.isprintable():
                raise ValueError(f"{option} must name a column of 1 to {_MAX_KEY_NAME} printable characters, "
                                 f"got {option} {name!r}")
        if self.day_column == DAY:
            object.__setattr__(self, "day_column", None)
        if self.event_time_column == EVENT_TIME:
            object.__setattr__(self, "event_time_column", None)
        if self.day_column is not None and self.event_time_column is not None:
            raise ValueError(f"give at most one time column, --day-column (dates) or --event-time-column (timestamps), "
                             f"got --day-column {self.day_column!r} and --event-time-column {self.event_time_column!r}")
        if self.id_column in (DAY, EVENT_TIME, WINDOW_ID):
            raise ValueError(f"--id-column {self.id_column!r} is a time column's or the output's name "
                             f"({DAY}, {EVENT_TIME}, {WINDOW_ID}): it cannot be the user id column")
        time_option, time_name = self.time_option, self.declared_time
        if time_name is not None:
            if time_name in (USER_ID, WINDOW_ID):
                raise ValueError(f"{time_option} {time_name!r} is the id's or the output's name ({USER_ID}, "
                                 f"{WINDOW_ID}): it cannot be the time column")
            other = EVENT_TIME if self.day_column is not None else DAY
            if time_name == other:
                right = "--event-time-column" if other == EVENT_TIME else "--day-column"
                raise ValueError(f"{time_option} {time_name!r} names the default {other} column as the other kind "
                                 f"of time: leave it out (the default reads {DAY!r} as dates, {EVENT_TIME!r} as "
                                 f"timestamps) or give {right} {time_name}")
            if time_name == self.id_column:
                raise ValueError(f"--id-column and {time_option} name the same column {time_name!r}: the id and "
                                 "the time are two columns")

    @property
    def declared_time(self) -> str | None:
        """The declared time column's name, None for the default (``day`` or ``event_time``)."""
        return self.day_column if self.day_column is not None else self.event_time_column

    @property
    def time_option(self) -> str:
        """The option that declares the time column (the default's name: ``--day-column``)."""
        return "--event-time-column" if self.event_time_column is not None else "--day-column"

    @property
    def is_default(self) -> bool:
        """Whether these are the default names (``user_id``; ``day`` or ``event_time``)."""
        return self == InputKeys()

    @property
    def names(self) -> tuple[str, ...]:
        """The columns read as the id and the time: the declared ones, or ``user_id``, ``day`` and
        ``event_time`` (one of the last two) for the default."""
        return (self.id_column, self.declared_time) if self.declared_time is not None else (
            self.id_column, DAY, EVENT_TIME)

    def to_dict(self) -> dict[str, str]:
        """The names that differ from the defaults (a contract records only those, so that a
        contract that declares none is written as before these names existed)."""
        out = {}
        if self.id_column != USER_ID:
            out["id_column"] = self.id_column
        if self.day_column is not None:
            out["day_column"] = self.day_column
        if self.event_time_column is not None:
            out["event_time_column"] = self.event_time_column
        return out

    def describe(self) -> str:
        """How the id and the time are named, for messages: ``id 'uid' (--id-column), day
        'event_date' (--day-column)``."""
        time = (f"day {self.day_column!r} (--day-column)" if self.day_column is not None else
                f"event time {self.event_time_column!r} (--event-time-column)" if self.event_time_column is not None
                else f"time {DAY!r} or {EVENT_TIME!r} (the default)")
        return f"id {self.id_column!r} ({'--id-column' if self.id_column != USER_ID else 'the default'}), {time}"

    def time_of(self, names: Sequence[str]) -> tuple[str, str] | str:
        """``(column, kind)`` of the time in an input of columns ``names`` (``kind``: ``day`` or
        ``event_time``), or the reason it has none (a declared column missing, neither default
        column, both)."""
        if self.day_column is not None:
            return (self.day_column, DAY) if self.day_column in names else \
                f"no {self.day_column!r} column (the declared day column, --day-column)"
        if self.event_time_column is not None:
            return (self.event_time_column, EVENT_TIME) if self.event_time_column in names else \
                f"no {self.event_time_column!r} column (the declared event time column, --event-time-column)"
        has = [n for n in (DAY, EVENT_TIME) if n in names]
        if len(has) == 1:
            return has[0], has[0]
        return (f"both {DAY!r} and {EVENT_TIME!r}" if has else
                f"no {DAY!r} or {EVENT_TIME!r} column (or declare the time column's name: --day-column NAME for "
                "dates, --event-time-column NAME for timestamps)")

    def id_missing(self) -> str:
        """Why an input without the id column has none, for messages."""
        if self.id_column != USER_ID:
            return f"no {self.id_column!r} column (the declared id column, --id-column)"
        return f"no {USER_ID!r} column (or declare the id column's name: --id-column NAME)"


#: The default names: ``user_id``, and ``day`` or ``event_time``.
DEFAULT_KEYS = InputKeys()


class DeadLetterReason(str, enum.Enum):
    """Why a row went to the dead-letter output: the one vocabulary of every job's dead letters
    (invariant 7 (rows-counted-not-lost, docs/architecture.md)). The values are what the
    curator's dead-letter tables store, so they never change. The validator's reasons come
    first, in its priority order (first match wins); :mod:`renyi_stream.stream.engine.dead_letters` says
    which step of which job gives each.

    * ``null_user_id``: the row's ``user_id`` is null.
    * ``empty_user_id``: the row's ``user_id`` is an empty string.
    * ``null_time``: the row's ``day`` or ``event_time`` is null, empty or blank.
    * ``bad_time``: the time does not parse, or falls outside 0001-01-01..9999-12-31.
    * ``null_value``: an indicator value is null (or an empty string).
    * ``wrong_type``: a value or the user id does not parse as its column's type (a text id
      that is not an integer for an int64 ledger, an id beyond int64, the reserved id).
    * ``non_finite_value``: an indicator value is NaN or infinite.
    * ``out_of_range_time``: the row's window is outside the run's public schedule
      (``start_window..end_window``) and was not charged before: out of schedule.
    * ``duplicate_user_window``: another row of the same (user, window) came first in
      (window, source, row) order; only that first row counts (invariant 2).
    * ``malformed_row``: a CSV line that does not split into the header's number of fields
      (the reader's, before any value is read).
    * ``late_window``: the row's window was already charged (and maybe released): charging it
      now would charge a user twice or change a release (invariants 5 and 6). Counted apart
      from the others, as ``late``, in every job's row balance.
    * ``undecodable_message``: a streaming message that is not an Arrow IPC stream of indicator
      rows, or whose columns fail the schema as a whole: one dead letter for the message.
    * ``outside_file_days``: the row's window is not of the days its input file holds (the day
      its path names, or ``--input-days``): a file's name is believed over its rows
      (:mod:`renyi_stream.stream.engine.input_days`).
    """

    NULL_USER_ID = "null_user_id"
    EMPTY_USER_ID = "empty_user_id"
    NULL_TIME = "null_time"
    BAD_TIME = "bad_time"
    NULL_VALUE = "null_value"
    WRONG_TYPE = "wrong_type"
    NON_FINITE = "non_finite_value"
    OUT_OF_RANGE_TIME = "out_of_range_time"
    DUPLICATE = "duplicate_user_window"
    MALFORMED_ROW = "malformed_row"
    LATE_WINDOW = "late_window"
    UNDECODABLE_MESSAGE = "undecodable_message"
    OUTSIDE_FILE_DAYS = "outside_file_days"

    def __str__(self) -> str:
        return self.value


#: The validator's name for :class:`DeadLetterReason` (the same class, not a second vocabulary).
RejectReason = DeadLetterReason

_REASONS: tuple[DeadLetterReason, ...] = tuple(DeadLetterReason)
_REASON_CODE = {reason: code for code, reason in enumerate(_REASONS, start=1)}

#: Schema of :attr:`ValidatedBatch.rejected`.
REJECTED_SCHEMA = pa.schema(
    [
        pa.field("row_index", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),
    ]
)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class WindowSpec:
    """Fixed windows of ``length_seconds`` (1 to 2**61); window 0 is ``[origin, origin + length)`` (UTC).

    The default is daily windows from 1970-01-01, so a row's ``window_id`` is its day number
    since the Unix epoch. Windows are half-open and computed with floor division, so times
    before the origin get negative ids.
    """

    length_seconds: int = _SECONDS_PER_DAY
    origin_seconds: int = 0

    def __post_init__(self) -> None:
        length = _as_int("length_seconds", self.length_seconds)
        if not 0 < length <= MAX_ABS_SECONDS:  # above 2**61 the int64 window arithmetic overflows
            raise ValueError(f"length_seconds must be in [1, 2**61], got length_seconds={length}")
        origin = _as_int("origin_seconds", self.origin_seconds)
        if abs(origin) > MAX_ABS_SECONDS:
            raise ValueError(
                f"origin_seconds must be within +-2**61 of the epoch, got origin_seconds={origin}"
            )
        object.__setattr__(self, "length_seconds", length)
        object.__setattr__(self, "origin_seconds", origin)

    @classmethod
    def from_length(cls, text: str) -> "WindowSpec":
        """Windows from 1970-01-01 of a length written ``1d``, ``12h``, ``30m`` or ``3600s`` (the
        command lines' ``--window``); ValueError naming ``window`` otherwise."""
        units = {"d": _SECONDS_PER_DAY, "h": 3600, "m": 60, "s": 1}
        try:
            value, unit = int(text[:-1]), units[text[-1]]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ValueError(f"window must look like 1d, 12h, 30m or 3600s, got window={text!r}") from None
        if value <= 0:
            raise ValueError(f"window must be positive, got window={text!r}")
        return cls(length_seconds=value * unit)

    def window_of_day(self, name: str, text: str) -> int:
        """The window holding the start (00:00 UTC) of the day ``text`` (``YYYY-MM-DD``), as the
        command lines' ``--start`` and ``--end`` name windows; ValueError naming ``name`` otherwise."""
        try:
            day = dt.date.fromisoformat(text)
        except (ValueError, TypeError):
            raise ValueError(f"{name} must be a date YYYY-MM-DD, got {name}={text!r}") from None
        seconds = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp())
        return int(self.window_of_seconds(seconds))

    def window_of_seconds(self, seconds: Any) -> Any:
        """Window id (int64) of each Unix time in ``seconds`` (integers, ``|s| <= 2**61``)."""
        xp = array_module(seconds)
        s = xp.asarray(seconds)
        if s.dtype.kind not in "iu":
            raise TypeError(f"seconds must be an integer array, got dtype={s.dtype}")
        s = s.astype(xp.int64, copy=False)
        return xp.floor_divide(s - self.origin_seconds, self.length_seconds)

    def window_start_seconds(self, window_id: Any) -> Any:
        """Unix time (seconds, UTC) at which ``window_id`` starts (inclusive)."""
        if isinstance(window_id, (int, np.integer)) and not isinstance(window_id, bool):
            return self.origin_seconds + int(window_id) * self.length_seconds
        xp = array_module(window_id)
        w = xp.asarray(window_id)
        if w.dtype.kind not in "iu":
            raise TypeError(f"window_id must be integer, got dtype={w.dtype}")
        return self.origin_seconds + w.astype(xp.int64, copy=False) * self.length_seconds

    def window_end_seconds(self, window_id: Any) -> Any:
        """Unix time (seconds, UTC) at which ``window_id`` ends (exclusive)."""
        return self.window_start_seconds(window_id) + self.length_seconds


@dataclass(frozen=True)
class ValidatedBatch:
    """The two outputs of :func:`validate_batch`; together they hold every input row once."""

    valid: pa.Table
    rejected: pa.Table
    indicator_columns: tuple[str, ...]
    category_columns: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        """Rows of the input batch: ``valid.num_rows + rejected.num_rows``."""
        return self.valid.num_rows + self.rejected.num_rows

    def reason_counts(self) -> dict[DeadLetterReason, int]:
        """Number of rejected rows per reason, every reason present (zero if unused)."""
        counts = dict.fromkeys(_REASONS, 0)
        if self.rejected.num_rows:
            for item in pc.value_counts(self.rejected.column("reason")).to_pylist():
                counts[DeadLetterReason(item["values"])] = int(item["counts"])
        return counts


# --------------------------------------------------------------------------- schemas


def _check_indicator_names(names: Sequence[str], *, what: str) -> tuple[str, ...]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"{what} must be a sequence of column names, got {names!r}")
    out = tuple(names)
    for name in out:
        if not isinstance(name, str):
            raise TypeError(f"{what} must hold strings, got {name!r}")
        if name in (USER_ID, DAY, EVENT_TIME, WINDOW_ID):
            raise SchemaError(f"{what} may not include the reserved column {name!r}")
    repeated = sorted({name for name in out if out.count(name) > 1})
    if repeated:
        raise ValueError(f"{what} names a column more than once: {repeated}")
    return out


def indicator_schema(
    indicator_columns: Sequence[str],
    user_id_type: pa.DataType = pa.int64(),
    time_column: str = DAY,
) -> pa.Schema:
    """The documented schema an indicator batch should have.

    ``user_id`` (``user_id_type``: int64 or utf8), then ``day`` (date32) or ``event_time``
    (timestamp, microseconds, UTC), then each indicator column as float64; no nulls.
    :func:`validate_batch` accepts more than this (see the module docstring).
    """
    names = _check_indicator_names(indicator_columns, what="indicator_columns")
    if user_id_type not in (pa.int64(), pa.string()):
        raise ValueError(f"user_id_type must be pa.int64() or pa.string(), got {user_id_type}")
    if time_column == DAY:
        time_type: pa.DataType = pa.date32()
    elif time_column == EVENT_TIME:
        time_type = pa.timestamp("us", tz="UTC")
    else:
        raise ValueError(f"time_column must be {DAY!r} or {EVENT_TIME!r}, got {time_column!r}")
    return pa.schema(
        [pa.field(USER_ID, user_id_type, nullable=False), pa.field(time_column, time_type, nullable=False)]
        + [pa.field(name, pa.float64(), nullable=False) for name in names]
    )


def valid_schema(indicator_columns: Sequence[str], user_id_type: pa.DataType = pa.int64(),
                 category_columns: Sequence[str] = ()) -> pa.Schema:
    """Schema of :attr:`ValidatedBatch.valid`: user_id, window_id (int64), indicators (float64),
    then category columns (utf8, nullable: a missing category is in no bucket)."""
    names = _check_indicator_names(indicator_columns, what="indicator_columns")
    categories = _check_indicator_names(category_columns, what="category_columns")
    if user_id_type not in (pa.int64(), pa.string()):
        raise ValueError(f"user_id_type must be pa.int64() or pa.string(), got {user_id_type}")
    return pa.schema(
        [pa.field(USER_ID, user_id_type, nullable=False), pa.field(WINDOW_ID, pa.int64(), nullable=False)]
        + [pa.field(name, pa.float64(), nullable=False) for name in names]
        + [pa.field(name, pa.string(), nullable=True) for name in categories]
    )


# --------------------------------------------------------------------------- column kinds


def _value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_string(t: pa.DataType) -> bool:
    is_view = getattr(pa.types, "is_string_view", lambda _t: False)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or is_view(t)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _user_kind(t: pa.DataType) -> str | None:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if _is_string(t):
        return "string"
    return None


def _time_kind(kind: str, t: pa.DataType) -> str | None:
    """The kind of a time column of type ``t`` read as ``kind`` (``day``: dates; ``event_time``:
    timestamps), None when no value of that type could be one."""
    if pa.types.is_null(t):
        return "null"
    if _is_string(t):
        return "string"
    if kind == DAY and (pa.types.is_date32(t) or pa.types.is_date64(t)):
        return "date"
    if kind == EVENT_TIME and pa.types.is_timestamp(t):
        return "timestamp"
    return None


def _indicator_kind(t: pa.DataType) -> str | None:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_boolean(t) or _is_number(t):
        return "number"
    if _is_string(t):
        return "string"
    return None


@dataclass(frozen=True)
class _Layout:
    time_column: str
    indicators: tuple[str, ...]
    categories: tuple[str, ...] = ()
    id_column: str = USER_ID
    time_kind: str = DAY  # DAY (dates) or EVENT_TIME (timestamps)


def _resolve_columns(schema: pa.Schema, indicator_columns: Sequence[str] | None,
                     category_columns: Sequence[str] = (), id_type: str | None = None,
                     keys: InputKeys = DEFAULT_KEYS) -> _Layout:
    names = schema.names
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise SchemaError(f"batch has repeated column names {repeated}; each column must be unique")

    def type_of(name: str) -> pa.DataType:
        return _value_type(schema.field(name).type)

    id_column = keys.id_column
    if id_column not in names:
        raise SchemaError(f"batch has {keys.id_missing()}; columns found: {names}")
    float_ids = id_type == "int64" and pa.types.is_floating(type_of(id_column))  # parsed row by row
    if _user_kind(type_of(id_column)) is None and not float_ids:
        raise SchemaError(
            f"column {id_column!r} has unsupported type {schema.field(id_column).type}; "
            "expected an integer or string type"
        )
    time = keys.time_of(names)
    if isinstance(time, str):
        if keys.declared_time is None and DAY in names and EVENT_TIME in names:
            raise SchemaError(
                f"batch has both {DAY!r} ({schema.field(DAY).type}) and {EVENT_TIME!r} "
                f"({schema.field(EVENT_TIME).type}); give exactly one time column"
            )
        raise SchemaError(f"batch has no time column: {time}; columns found: {names}")
    time_column, time_kind = time
    expected = "date32, date64 or a 'YYYY-MM-DD' string" if time_kind == DAY else "a timestamp or an ISO-8601 string"
    if _time_kind(time_kind, type_of(time_column)) is None:
        raise SchemaError(
            f"column {time_column!r} has unsupported type {schema.field(time_column).type}; "
            f"expected {expected}"
        )

    categories = _check_indicator_names(category_columns, what="category_columns")
    for name in categories:
        if name not in names:
            raise SchemaError(f"category column {name!r} not in batch; columns found: {names}")
        if not (_is_string(type_of(name)) or pa.types.is_null(type_of(name))):
            raise SchemaError(
                f"category column {name!r} has type {schema.field(name).type}; expected a string type "
                "(a numeric category code is an indicator column: use a histogram over numbers)"
            )
    if indicator_columns is None:
        chosen = tuple(name for name in names if name not in (USER_ID, DAY, EVENT_TIME, *keys.names, *categories))
        if WINDOW_ID in chosen:
            raise SchemaError(
                f"column {WINDOW_ID!r} ({schema.field(WINDOW_ID).type}) is reserved for the output; "
                "rename it or pass indicator_columns"
            )
    else:
        chosen = _check_indicator_names(indicator_columns, what="indicator_columns")
        both = sorted(set(chosen) & set(categories))
        if both:
            raise SchemaError(f"column(s) {both} named both as indicator and as category columns")
        missing = [name for name in chosen if name not in names]
        if missing:
            raise SchemaError(f"indicator column(s) {missing} not in batch; columns found: {names}")
    keyed = sorted(set(chosen + categories) & {id_column, time_column})
    if keyed:
        raise SchemaError(f"column(s) {keyed} are the id or time column: they cannot also be indicator or "
                          "category columns")
    if not chosen:
        raise SchemaError(f"batch has no indicator columns; columns found: {names}")
    for name in chosen:
        if _indicator_kind(type_of(name)) is None:
            raise SchemaError(
                f"indicator column {name!r} has unsupported type {schema.field(name).type}; "
                "expected an integer, float, bool, decimal or string type"
            )
    return _Layout(time_column=time_column, indicators=chosen, categories=categories, id_column=id_column,
                   time_kind=time_kind)


# --------------------------------------------------------------------------- small kernels


def _mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Boolean Arrow array -> NumPy bool array, null counted as False."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _ints(arr: pa.Array) -> np.ndarray:
    """Integer-valued Arrow array -> int64 NumPy array, null as 0."""
    return np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _normalise(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array; dictionaries decoded; every string type as utf8."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], type=arr.type)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if _is_string(arr.type) and not pa.types.is_string(arr.type):
        arr = plain_strings(arr)  # string_view: pyarrow 16 has no cast kernel from it
        arr = arr if pa.types.is_string(arr.type) else arr.cast(pa.string())
    return arr


def _json_string(arr: pa.Array) -> pa.Array:
    """utf8 array -> JSON string literals (quoted, escaped); nulls stay null."""
    s = pc.replace_substring(arr, "\\", "\\\\")
    s = pc.replace_substring(s, '"', '\\"')
    if pc.any(pc.match_substring_regex(s, "[\\x00-\\x1f]")).as_py():
        for code in range(0x20):  # loop over the 32 control characters, not over rows
            s = pc.replace_substring(s, chr(code), f"\\u{code:04x}")
    return pc.binary_join_element_wise('"', s, '"', "")


def _snippet(arr: pa.Array) -> pa.Array:
    """utf8 array -> short quoted form for `detail`, cut after _DETAIL_MAX_CHARS characters."""
    cut = pc.utf8_slice_codeunits(arr, 0, _DETAIL_MAX_CHARS)
    too_long = pc.greater(pc.utf8_length(arr), _DETAIL_MAX_CHARS)
    short = pc.if_else(too_long, pc.binary_join_element_wise(cut, "...", ""), arr)
    return _json_string(short)


def _join(*parts: Any) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _json_values(arr: pa.Array) -> pa.Array:
    """Any supported input column -> its values as JSON text (null as ``null``)."""
    t = arr.type
    if pa.types.is_null(t):
        return pa.repeat(pa.scalar("null"), len(arr))
    if pa.types.is_floating(t):
        text = arr.cast(pa.string())  # shortest text that round-trips in the column's own width
        wide = arr.cast(pa.float64())  # exact; not every kernel exists for float16
        text = pc.if_else(pc.is_nan(wide), '"NaN"', text)
        text = pc.if_else(pc.equal(wide, math.inf), '"Infinity"', text)
        text = pc.if_else(pc.equal(wide, -math.inf), '"-Infinity"', text)
    elif pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_decimal(t):
        text = arr.cast(pa.string())
    elif pa.types.is_string(t):
        text = _json_string(arr)
    else:  # dates and timestamps: ISO text (tz-aware as UTC), which the validator parses back
        if pa.types.is_timestamp(t) and t.tz is not None:
            arr = arr.cast(pa.timestamp(t.unit, tz="UTC"))
        text = _json_string(arr.cast(pa.string()))
    return pc.fill_null(text, "null")


# --------------------------------------------------------------------------- time parsing

_DATE_RE = r"^(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})$"
_ISO_RE = (
    r"^(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})"
    r"(?:[Tt ](?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:[.,]\d+)?)?"
    r"(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2})(?::?(?P<om>\d{2}))?)?)?$"
)
_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil)."""
    y = y - (m <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    doy = (153 * ((m + 9) % 12) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


_DAYS_IN_MONTH = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def _parse_iso(text: pa.Array, pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """Parse trimmed non-blank strings; returns (ok mask, UTC seconds, 0 where not ok)."""
    parts = pc.extract_regex(text, pattern)
    ok = _mask(parts.is_valid())
    groups = {parts.type.field(k).name for k in range(parts.type.num_fields)}

    def field(name: str) -> np.ndarray:
        if name not in groups:
            return np.zeros(len(text), dtype=np.int64)
        raw = parts.field(name)
        raw = pc.if_else(pc.equal(pc.fill_null(raw, ""), ""), "0", raw)
        return _ints(raw.cast(pa.int64()))

    y, mo, d = field("y"), field("mo"), field("d")
    h, mi, s = field("h"), field("mi"), field("s")
    oh, om = field("oh"), field("om")
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_ok = (mo >= 1) & (mo <= 12)
    dim = _DAYS_IN_MONTH[np.clip(mo, 1, 12) - 1] + ((mo == 2) & leap)
    ok &= (y >= 1) & month_ok & (d >= 1) & (d <= dim)
    ok &= (h <= 23) & (mi <= 59) & (s <= 59) & (oh <= 23) & (om <= 59)
    seconds = _days_from_civil(y, mo, d) * _SECONDS_PER_DAY + h * 3600 + mi * 60 + s
    if "sign" in groups:
        sign = np.where(_mask(pc.equal(parts.field("sign"), "-")), -1, 1)
        seconds = seconds - sign * (oh * 3600 + om * 60)
    return ok, np.where(ok, seconds, 0)


# --------------------------------------------------------------------------- rejections


class _Rejections:
    """Per-row reason codes (0 = still valid) and details; the first reason added wins."""

    def __init__(self, n: int) -> None:
        self.code = np.zeros(n, dtype=np.int8)
        self.detail: pa.Array = pa.nulls(n, pa.string())

    def add(self, mask: np.ndarray, reason: DeadLetterReason, detail: str | Callable[[], pa.Array]) -> None:
        new = np.asarray(mask, dtype=bool) & (self.code == 0)
        if not new.any():
            return
        self.code[new] = _REASON_CODE[reason]
        text = detail if isinstance(detail, str) else detail()
        self.detail = pc.if_else(pa.array(new), text, self.detail)


def _user_ids(arr: pa.Array, rej: _Rejections, name: str = USER_ID) -> pa.Array:
    """Check and normalise user ids (int64 or utf8) of the id column ``name``; adds user-id
    rejections, their details naming ``name``."""
    n = len(arr)
    rej.add(~_mask(arr.is_valid()), DeadLetterReason.NULL_USER_ID, f"{name} is null")
    if pa.types.is_null(arr.type):
        return pa.nulls(n, pa.int64())
    if pa.types.is_floating(arr.type):  # only for an int64 ledger (_resolve_columns)
        return _float_ids(arr, rej, name)
    if pa.types.is_string(arr.type):
        rej.add(_mask(pc.equal(arr, "")), DeadLetterReason.EMPTY_USER_ID, f"{name} is an empty string")
        return arr
    if arr.type == pa.uint64():
        too_big = _mask(pc.greater(arr, pa.scalar(2**63 - 1, pa.uint64())))
        rej.add(
            too_big,
            DeadLetterReason.WRONG_TYPE,
            lambda: _join(f"{name} ", arr.cast(pa.string()), " does not fit in int64"),
        )
        arr = pc.if_else(pa.array(too_big), pa.scalar(0, pa.uint64()), arr)
    ids = arr.cast(pa.int64())
    rej.add(
        _mask(pc.equal(ids, pa.scalar(RESERVED_USER_ID, pa.int64()))),
        DeadLetterReason.WRONG_TYPE,
        f"{name} {RESERVED_USER_ID} is reserved (the int64 minimum) and cannot be a user id",
    )
    return ids


#: The bound a float id read as an int64 id must stay strictly below in magnitude. Every integer up
#: to 2**53 is exactly a float64, but 2**53 is also what 2**53 + 1 rounds to, so a float equal to
#: 2**53 may be either person: only ``|x| < 2**53`` names one id, and one id one person.
MAX_FLOAT_ID = 2**53


def _float_ids(arr: pa.Array, rej: _Rejections, name: str = USER_ID) -> pa.Array:
    """A float column's ids for an int64 ledger (pandas writes integer ids as float64 when one is
    missing), row by row: an integral value of magnitude strictly below ``MAX_FLOAT_ID`` is that
    id; NaN, inf, a fraction or a value of magnitude ``2**53`` or more (which the float may
    already have rounded onto another user's id: ``2**53 + 1`` is stored as ``2**53``) is that
    row's ``wrong_type``."""
    values = np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(values) & (values == np.trunc(values)) & (np.abs(values) < MAX_FLOAT_ID)
    rej.add(_mask(arr.is_valid()) & ~ok, DeadLetterReason.WRONG_TYPE,
            lambda: _join(f"{name} ", arr.cast(pa.string()), " is not an integer id of magnitude below 2**53 (a float "
                          "column's ids are read only when exact)"))
    return pa.array(np.where(ok, values, 0.0).astype(np.int64), pa.int64())


# A declared int64 id written as text must be the integer's one canonical spelling (no sign but a
# minus, no leading zero, no space): "042" and "42" are not read as one person. Up to 18 digits
# always fit in int64 (9.2e18); a 19-digit id is checked against the bounds as text.
_INT_TEXT = r"^(0|-?[1-9][0-9]{0,18})$"
_INT64_MAX_TEXT = str(2**63 - 1)


def _as_id_type(users: pa.Array, id_type: str | None, rej: _Rejections, name: str = USER_ID) -> pa.Array:
    """``users`` (int64 or utf8, from :func:`_user_ids`) as ``id_type``; adds ``wrong_type`` for
    text ids that are not a canonical int64 integer when ``id_type`` is ``"int64"``."""
    if id_type is None or len(users) == 0:
        return users
    if id_type == "string":
        return users if pa.types.is_string(users.type) else pc.cast(users, pa.string())
    if pa.types.is_integer(users.type):
        return users
    digits = pc.utf8_ltrim(users, characters="-")
    fits = _mask(pc.match_substring_regex(users, _INT_TEXT)) & (
        _mask(pc.less(pc.utf8_length(digits), 19))
        | (_mask(pc.equal(pc.utf8_length(digits), 19)) & _mask(pc.less_equal(digits, _INT64_MAX_TEXT))))
    parsed = pc.cast(pc.if_else(pa.array(fits), users, pa.scalar("0")), pa.int64())
    rej.add(_mask(users.is_valid()) & ~fits, DeadLetterReason.WRONG_TYPE,
            lambda: _join(f"{name}: ", _snippet(users), " is not an int64 user id written canonically (the "
                          "ledger's declared id type)"))
    rej.add(fits & _mask(pc.equal(parsed, pa.scalar(RESERVED_USER_ID, pa.int64()))), DeadLetterReason.WRONG_TYPE,
            f"{name} {RESERVED_USER_ID} is reserved (the int64 minimum) and cannot be a user id")
    return parsed


def _time_seconds(name: str, arr: pa.Array, rej: _Rejections, kind: str | None = None) -> np.ndarray:
    """UTC Unix seconds of each row's time (0 where rejected) in the column ``name``, read as
    ``kind`` (``day``: dates; ``event_time``: timestamps; None: as ``name`` says); adds time
    rejections, their details naming ``name``."""
    kind = name if kind is None else kind
    t = arr.type
    if pa.types.is_string(t):
        text = pc.utf8_trim_whitespace(arr)
        missing = ~_mask(text.is_valid()) | _mask(pc.equal(text, ""))
        rej.add(missing, DeadLetterReason.NULL_TIME, f"{name} is null or empty")
        if kind == DAY:
            ok, seconds = _parse_iso(text, _DATE_RE)
            expected = "as a YYYY-MM-DD date"
        else:
            ok, seconds = _parse_iso(text, _ISO_RE)
            expected = "as an ISO-8601 timestamp"
        rej.add(
            ~ok,
            DeadLetterReason.BAD_TIME,
            lambda: _join(f"{name}: cannot parse ", _snippet(text), f" {expected}"),
        )
    else:
        rej.add(~_mask(arr.is_valid()), DeadLetterReason.NULL_TIME, f"{name} is null")
        if pa.types.is_null(t):
            seconds = np.zeros(len(arr), dtype=np.int64)
        elif pa.types.is_date32(t):
            seconds = _ints(arr.cast(pa.int32())) * _SECONDS_PER_DAY
        elif pa.types.is_date64(t):
            ms_per_day = 1000 * _SECONDS_PER_DAY
            seconds = np.floor_divide(_ints(arr.cast(pa.int64())), ms_per_day) * _SECONDS_PER_DAY
        else:  # timestamp: Arrow stores UTC instants when tz-aware; naive wall clock is taken as UTC
            seconds = np.floor_divide(_ints(arr.cast(pa.int64())), _UNIT_PER_SECOND[t.unit])
    outside = (seconds < MIN_TIME_SECONDS) | (seconds > MAX_TIME_SECONDS)
    rej.add(
        outside,
        DeadLetterReason.BAD_TIME,
        lambda: _join(
            f"{name} is ",
            pa.array(seconds).cast(pa.string()),
            " s from the epoch, outside 0001-01-01..9999-12-31 UTC",
        ),
    )
    return np.where(outside, 0, seconds)


_NUMBER_RE = r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)$"


@dataclass(frozen=True)
class _Indicator:
    values: pa.Array  # float64, null where missing or unparseable
    null: np.ndarray
    wrong: np.ndarray
    text: pa.Array | None  # trimmed strings, for wrong_type details


def _indicator(arr: pa.Array) -> _Indicator:
    t = arr.type
    if not pa.types.is_string(t):
        values = arr.cast(pa.float64(), safe=False)  # precision beyond 2**53 rounds: documented
        return _Indicator(values, ~_mask(arr.is_valid()), np.zeros(len(arr), dtype=bool), None)
    text = pc.utf8_trim_whitespace(arr)
    null = ~_mask(text.is_valid()) | _mask(pc.equal(text, ""))
    is_number = _mask(pc.match_substring_regex(text, _NUMBER_RE, ignore_case=True))
    is_true = _mask(pc.match_substring_regex(text, "^true$", ignore_case=True))
    is_false = _mask(pc.match_substring_regex(text, "^false$", ignore_case=True))
    values = pc.if_else(pa.array(is_number), text, pa.scalar(None, pa.string())).cast(pa.float64())
    values = pc.if_else(pa.array(is_true), 1.0, pc.if_else(pa.array(is_false), 0.0, values))
    wrong = ~null & ~is_number & ~is_true & ~is_false
    return _Indicator(values, null, wrong, text)


# --------------------------------------------------------------------------- the validator


def _as_table(batch: Any) -> pa.Table:
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, pa.Table):
        return batch
    raise TypeError(f"batch must be a pyarrow RecordBatch or Table, got {type(batch).__name__}")


def validate_batch(
    batch: pa.RecordBatch | pa.Table,
    *,
    window: WindowSpec = WindowSpec(),
    start_window: int | None = None,
    end_window: int | None = None,
    indicator_columns: Sequence[str] | None = None,
    category_columns: Sequence[str] = (),
    id_type: str | None = None,
    keys: InputKeys = DEFAULT_KEYS,
) -> ValidatedBatch:
    """Split ``batch`` into valid rows and rejected rows with reasons (see the module docstring).

    ``keys`` (:class:`InputKeys`, a declared contract's) names the id and time columns the batch
    holds (default ``user_id``, and ``day`` or ``event_time``): rejections' details and ``raw``
    name them as the input does, valid rows carry ``user_id`` and ``window_id`` whatever they are.

    ``category_columns`` names string columns passed through unparsed (utf8, nulls kept: a
    missing category counts in no bucket of a histogram); they are never indicator columns.

    ``id_type`` is the ledger's user id type (``"int64"`` or ``"string"``; None: as the batch has
    it). Valid rows then always carry it, whatever type the batch declares: text ids are parsed
    row by row for an ``int64`` ledger (a text id that is not an integer in int64's range is a
    ``wrong_type`` dead letter), integer ids are written as text for a ``string`` ledger. So a
    file or message whose ids are typed otherwise (a CSV with one text id, a producer sending
    text) costs its bad rows, never the day.

    ``start_window``/``end_window`` bound the accepted window ids, inclusive; rows outside are
    rejected as ``out_of_range_time``. Raises :class:`SchemaError` for whole-batch problems,
    ``ValueError`` for ``start_window > end_window`` and ``TypeError`` for wrong argument types.
    """
    table = _as_table(batch)
    if not isinstance(window, WindowSpec):
        raise TypeError(f"window must be a WindowSpec, got {type(window).__name__}")
    start = None if start_window is None else _as_int("start_window", start_window)
    end = None if end_window is None else _as_int("end_window", end_window)
    if start is not None and end is not None and start > end:
        raise ValueError(
            f"start_window must be <= end_window, got start_window={start}, end_window={end}"
        )
    if id_type not in (None, "int64", "string"):
        raise ValueError(f"id_type must be 'int64', 'string' or None, got id_type={id_type!r}")
    if not isinstance(keys, InputKeys):
        raise TypeError(f"keys must be an InputKeys, got {type(keys).__name__}")
    layout = _resolve_columns(table.schema, indicator_columns, category_columns, id_type, keys)
    return _validate(table, layout, window, start, end, id_type)


def _validate(
    table: pa.Table, layout: _Layout, window: WindowSpec, start: int | None, end: int | None,
    id_type: str | None = None,
) -> ValidatedBatch:
    n = table.num_rows
    rej = _Rejections(n)
    user_raw = _normalise(table.column(layout.id_column))
    time_raw = _normalise(table.column(layout.time_column))
    ind_raw = [_normalise(table.column(name)) for name in layout.indicators]
    cat_raw = [_normalise(table.column(name)) for name in layout.categories]

    users = _as_id_type(_user_ids(user_raw, rej, layout.id_column), id_type, rej, layout.id_column)
    seconds = _time_seconds(layout.time_column, time_raw, rej, layout.time_kind)

    parsed = [_indicator(arr) for arr in ind_raw]
    for name, ind in zip(layout.indicators, parsed):
        rej.add(ind.null, DeadLetterReason.NULL_VALUE, f"column {name!r} is null")
    for name, ind in zip(layout.indicators, parsed):
        if ind.text is not None:
            text = ind.text
            rej.add(
                ind.wrong,
                DeadLetterReason.WRONG_TYPE,
                lambda name=name, text=text: _join(
                    f"column {name!r}: cannot parse ", _snippet(text), " as a number"
                ),
            )
    for name, ind in zip(layout.indicators, parsed):
        finite = _mask(pc.is_finite(ind.values))
        non_finite = _mask(ind.values.is_valid()) & ~finite
        rej.add(
            non_finite,
            DeadLetterReason.NON_FINITE,
            lambda name=name, values=ind.values: _join(f"column {name!r} is ", values.cast(pa.string())),
        )

    windows = window.window_of_seconds(seconds)
    if start is not None or end is not None:
        outside = np.zeros(n, dtype=bool)
        if start is not None:
            outside |= windows < start
        if end is not None:
            outside |= windows > end
        rej.add(
            outside,
            DeadLetterReason.OUT_OF_RANGE_TIME,
            lambda: _join(
                f"{WINDOW_ID} ",
                pa.array(windows).cast(pa.string()),
                f" is outside start_window={start}, end_window={end}",
            ),
        )

    _reject_duplicates(users, windows, rej, layout.id_column)

    user_type = pa.string() if pa.types.is_string(users.type) else pa.int64()
    keep = pa.array(rej.code == 0)
    valid = pa.Table.from_arrays(
        [users.filter(keep), pa.array(windows, pa.int64()).filter(keep)]
        + [ind.values.filter(keep) for ind in parsed]
        + [pc.cast(cat, pa.string()).filter(keep) for cat in cat_raw],
        schema=valid_schema(layout.indicators, user_type, layout.categories),
    )
    rejected = _rejected_table(
        rej, [user_raw, time_raw, *ind_raw, *cat_raw],
        [layout.id_column, layout.time_column, *layout.indicators, *layout.categories],
    )
    return ValidatedBatch(valid=valid, rejected=rejected, indicator_columns=layout.indicators,
                          category_columns=layout.categories)


def may_repeat(users: pa.Array | pa.ChunkedArray, windows: np.ndarray) -> bool:
    """False when a linear-time check proves that no (user, window) pair occurs twice; True
    means "maybe" (the caller then groups by hash or sort).

    Two checks, both for integer ids: rows strictly increasing in (window, id) order (a daily
    dump sorted by user), or ids from a dense range whose (window, id) cells a single
    bincount finds each used at most once. String ids always answer True.
    """
    n = len(users)
    if n < 2:
        return False
    if not pa.types.is_integer(users.type) or users.null_count:
        return True
    ids = np.asarray(users.to_numpy(), dtype=np.int64)
    windows = np.asarray(windows, dtype=np.int64)
    if np.all((windows[1:] > windows[:-1]) | ((windows[1:] == windows[:-1]) & (ids[1:] > ids[:-1]))):
        return False  # strictly increasing in (window, id): no pair can come twice
    id_span = int(ids.max()) - int(ids.min()) + 1
    cells = id_span * (int(windows.max()) - int(windows.min()) + 1)
    if cells > max(8 * n, 1 << 20):
        return True
    cell = (windows - windows.min()) * id_span + (ids - ids.min())
    return bool(np.bincount(cell, minlength=cells).max() > 1)


def _reject_duplicates(users: pa.Array, windows: np.ndarray, rej: _Rejections, name: str = USER_ID) -> None:
    """Among still-valid rows, reject every (user, window) occurrence after the first."""
    rows = np.flatnonzero(rej.code == 0)
    if len(rows) < 2:
        return
    if len(rows) == len(rej.code) and not may_repeat(users, windows):
        return
    keys = pa.table({"u": users.take(pa.array(rows)), "w": windows[rows], "i": rows})
    order = pc.sort_indices(keys, sort_keys=[("u", "ascending"), ("w", "ascending"), ("i", "ascending")])
    order_np = _ints(order)
    u = keys.column("u").take(order).combine_chunks()
    w = windows[rows][order_np]
    i = rows[order_np]
    same = np.zeros(len(rows), dtype=bool)
    same[1:] = _mask(pc.equal(u.slice(1), u.slice(0, len(u) - 1))) & (w[1:] == w[:-1])
    if not same.any():
        return
    group_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(rows))))
    first_row = np.zeros(len(rej.code), dtype=np.int64)
    first_row[i] = i[group_start]
    duplicate = np.zeros(len(rej.code), dtype=bool)
    duplicate[i[same]] = True
    rej.add(
        duplicate,
        DeadLetterReason.DUPLICATE,
        lambda: _join(
            f"({name}, {WINDOW_ID}) already valid at row ", pa.array(first_row).cast(pa.string())
        ),
    )


def _rejected_table(rej: _Rejections, columns: list[pa.Array], names: list[str]) -> pa.Table:
    rows = np.flatnonzero(rej.code != 0)
    if len(rows) == 0:
        return REJECTED_SCHEMA.empty_table()
    take = pa.array(rows)
    reasons = pa.array([reason.value for reason in _REASONS]).take(pa.array(rej.code[rows] - 1))
    parts: list[Any] = []
    for k, (name, arr) in enumerate(zip(names, columns)):
        parts.append(("{" if k == 0 else ",") + json.dumps(name) + ":")
        parts.append(_json_values(arr.take(take)))
    parts.append("}")
    return pa.Table.from_arrays(
        [take.cast(pa.int64()), reasons, rej.detail.take(take), _join(*parts)], schema=REJECTED_SCHEMA
    )
