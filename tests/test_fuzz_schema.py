"""Hostile input for the schema validator (invariant 7 (rows-counted-not-lost, docs/architecture.md)):
property-based fuzzing.

Every batch, however malformed, ends in one of two ways: ``SchemaError`` (a ``ValueError``)
naming the offending column, or ``valid + rejected == input`` rows with a reason for every
rejected row. Never another exception, never a silently lost row.

tests/test_schema.py already fuzzes the value parsers (numeric strings, time strings, widths);
this file fuzzes what it does not: whole schemas of arbitrary (also unsupported) column types
and names, a row-by-row reference oracle on batches up to 200k rows, sliced and chunked
layouts, byte-exact Unicode and very long ids, exact duplicate rows and empty batches.
Hypothesis runs derandomized (a fixed seed per test) with bounded examples, so CI is
deterministic and fast.
"""

from __future__ import annotations

import datetime as dt
import math
import unicodedata

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.schema import (
    MAX_TIME_SECONDS,
    MIN_TIME_SECONDS,
    REJECTED_SCHEMA,
    RESERVED_USER_ID,
    RejectReason,
    SchemaError,
    WindowSpec,
    validate_batch,
)

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=120,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HUGE = settings(derandomize=True, database=None, deadline=None, max_examples=3,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REASONS = {reason.value for reason in RejectReason}
DAY_SECONDS = 86_400


def _checked(batch, **kwargs):
    """validate_batch, then the contract every result must meet."""
    result = validate_batch(batch, **kwargs)
    n = batch.num_rows
    assert result.valid.num_rows + result.rejected.num_rows == n, "a row was lost or invented"
    assert result.rejected.schema == REJECTED_SCHEMA
    idx = result.rejected.column("row_index").to_numpy()
    assert np.all(np.diff(idx) > 0) and np.all((idx >= 0) & (idx < n))
    for column in ("reason", "detail", "raw"):
        assert result.rejected.column(column).null_count == 0
    assert set(result.rejected.column("reason").to_pylist()) <= REASONS
    assert all(detail for detail in result.rejected.column("detail").to_pylist()), "a reason without detail"
    for name in result.indicator_columns:
        values = result.valid.column(name)
        assert values.null_count == 0 and np.isfinite(values.to_numpy()).all()
    return result


# --------------------------------------------------------------------------- arbitrary schemas

_N = 6


def _pool() -> dict[str, pa.Array]:
    """Columns of every kind the validator may meet, supported or not, with awkward values."""
    day = dt.date(2024, 1, 1)
    return {
        "int8": pa.array([1, 2, None, 4, -5, 1], pa.int8()),
        "int64": pa.array([1, 2**63 - 1, None, -(2**63), 0, 1], pa.int64()),
        "uint64": pa.array([1, 2**64 - 1, None, 4, 5, 1], pa.uint64()),
        "string": pa.array(["a", "", None, "é" * 50, " a", "a"]),
        "large_string": pa.array(["a", "", None, "b", "\x00", "a"], pa.large_string()),
        "string_view": pa.array(["a", "", None, "b", "🙂", "a"], pa.string_view()),
        "dict_string": pa.array(["a", "b", None, "b", "a", "a"]).dictionary_encode(),
        "dict_int": pa.array([1, 2, None, 2, 1, 1]).dictionary_encode(),
        "float16": pa.array(np.array([1, np.nan, np.inf, -1, 65504, 0], np.float16)),
        "float64": pa.array([1.0, math.nan, None, 1e308, -math.inf, 5e-324]),
        "bool": pa.array([True, False, None, True, False, True]),
        "decimal128": pa.array([1, 2, None, 4, 5, 6], pa.decimal128(38, 0)),
        "decimal256": pa.array([10**60, 2, None, 4, 5, 6], pa.decimal256(70, 0)),
        "null": pa.nulls(_N),
        "date32": pa.array([day] * 5 + [None], pa.date32()),
        "date64": pa.array([day] * 5 + [None], pa.date64()),
        "timestamp_ns_utc": pa.array([0, 10**18, None, -(10**18), 5, 0], pa.timestamp("ns", tz="UTC")),
        "timestamp_s": pa.array([0, 2**62, None, -(2**62), 5, 0], pa.timestamp("s")),
        "day_strings": pa.array(["2024-01-01", "x", None, " 2024-02-29 ", "0000-01-01", "2024-13-01"]),
        "iso_strings": pa.array(["2024-01-01T00:00:00+99:99", "2024-01-01 25:00", "", "9999-12-31T23:59:59-23:59",
                                 "2024-01-01t00:00z", "2024-01-01T00:00:00.999999999Z"]),
        "number_strings": pa.array(["1", "1e999", "nan", "true", "1_0", None]),
        "binary": pa.array([b"a"] * _N),
        "list": pa.array([[1]] * _N),
        "struct": pa.array([{"a": 1}] * _N),
        "duration": pa.array([1] * _N, pa.duration("s")),
        "time32": pa.array([1] * _N, pa.time32("s")),
        "dict_timestamp": pa.array([0, 1, None, 3, 5, 0], pa.timestamp("s")).dictionary_encode(),
    }


POOL = _pool()
NAMES = ["user_id", "day", "event_time", "window_id", "x", "y", "é", "", " user_id"]


@st.composite
def _any_table(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=5))
    columns = [POOL[draw(st.sampled_from(sorted(POOL)))] for _ in names]
    table = pa.Table.from_arrays(columns, names=names) if names else pa.table({})
    offset = draw(st.integers(0, _N))
    return table.slice(offset, draw(st.integers(0, _N)))


@FUZZ
@given(table=_any_table(), use_names=st.booleans(), names=st.lists(st.sampled_from(NAMES), max_size=3))
def test_any_schema_gives_conserved_rows_or_a_schema_error_naming_a_column(table, use_names, names):
    chosen = names if use_names else None
    try:
        _checked(table, indicator_columns=chosen, start_window=-(10**6), end_window=10**6)
    except SchemaError as exc:
        message = str(exc)
        mentioned = set(table.column_names) | {"user_id", "day", "event_time", "window_id", *names}
        assert any(repr(name) in message for name in mentioned), message


# --------------------------------------------------------------------------- a reference oracle


def _oracle(users, days, indicators, start, end) -> list[str | None]:
    """Row-by-row reference: the reason of each row (None if valid), in the documented order."""
    reasons: list[str | None] = []
    seen: set = set()
    names = list(indicators)
    for i, (user, day) in enumerate(zip(users, days)):
        values = [indicators[name][i] for name in names]
        seconds = None if day is None else day * DAY_SECONDS
        if user is None:
            reason = "null_user_id"
        elif user == "":
            reason = "empty_user_id"
        elif user == RESERVED_USER_ID:
            reason = "wrong_type"
        elif day is None:
            reason = "null_time"
        elif not MIN_TIME_SECONDS <= seconds <= MAX_TIME_SECONDS:
            reason = "bad_time"
        elif any(v is None for v in values):
            reason = "null_value"
        elif any(not math.isfinite(v) for v in values):
            reason = "non_finite_value"
        elif (start is not None and day < start) or (end is not None and day > end):
            reason = "out_of_range_time"
        elif (user, day) in seen:
            reason = "duplicate_user_window"
        else:
            reason = None
            seen.add((user, day))
        reasons.append(reason)
    return reasons


def _reasons(result, n: int) -> list[str | None]:
    out: list[str | None] = [None] * n
    for i, reason in zip(result.rejected.column("row_index").to_pylist(), result.rejected.column("reason").to_pylist()):
        out[i] = reason
    return out


_VALUES = st.one_of(
    st.none(), st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.just(1e308), st.just(-1e308),
    st.just(5e-324), st.just(-0.0), st.floats(allow_nan=False, allow_infinity=False),
)
_DAYS = st.one_of(st.none(), st.integers(19_700, 19_705), st.integers(-(2**31), 2**31 - 1))


@FUZZ
@given(
    data=st.data(),
    n=st.integers(0, 40),
    string_ids=st.booleans(),
    width=st.integers(1, 3),
    bounds=st.tuples(st.none() | st.integers(19_700, 19_702), st.none() | st.integers(19_702, 19_705)),
)
def test_small_batches_match_the_row_by_row_oracle(data, n, string_ids, width, bounds):
    id_pool = st.text(max_size=4) if string_ids else st.integers(-(2**63), 2**63 - 1) | st.just(RESERVED_USER_ID)
    ids = data.draw(st.lists(st.sampled_from(data.draw(st.lists(id_pool, min_size=1, max_size=4))) | st.none(),
                             min_size=n, max_size=n))
    days = data.draw(st.lists(_DAYS, min_size=n, max_size=n))
    indicators = {f"x{k}": data.draw(st.lists(_VALUES, min_size=n, max_size=n)) for k in range(width)}
    table = pa.table({
        "user_id": pa.array(ids, pa.string() if string_ids else pa.int64()),
        "day": pa.array(days, pa.int32()).cast(pa.date32()),
        **{name: pa.array(values, pa.float64()) for name, values in indicators.items()},
    })
    start, end = bounds
    result = _checked(table, start_window=start, end_window=end)
    assert _reasons(result, n) == _oracle(ids, days, indicators, start, end)


@HUGE
@given(seed=st.integers(0, 2**32 - 1), string_ids=st.booleans(),
       share=st.sampled_from([0.0, 0.01, 0.2]))
def test_huge_batches_of_200k_rows_match_the_oracle(seed, string_ids, share):
    """200k rows with nulls, NaN/inf, extreme magnitudes, out-of-range days and many repeated
    (user, day) pairs; the validator agrees with the reference on every row."""
    n = 200_000
    rng = np.random.default_rng(seed)
    raw_ids = rng.integers(0, n // 2, n)
    ids: list = [f"ü{v}" if string_ids else int(v) for v in raw_ids]
    days: list = rng.integers(19_700, 19_704, n).tolist()
    x = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, n)
    bad = rng.random(n) < share
    x[bad] = rng.choice([math.nan, math.inf, -math.inf], size=int(bad.sum()))
    xs: list = x.tolist()
    for column, missing in ((ids, rng.random(n) < share / 4), (days, rng.random(n) < share / 4),
                            (xs, rng.random(n) < share / 4)):
        for i in np.flatnonzero(missing):
            column[i] = None
    if string_ids:
        for i in np.flatnonzero(rng.random(n) < share / 4):
            ids[i] = ""
    table = pa.table({
        "user_id": pa.array(ids, pa.string() if string_ids else pa.int64()),
        "day": pa.array(days, pa.int32()).cast(pa.date32()),
        "x": pa.array(xs, pa.float64()),
    })
    result = _checked(table, start_window=19_700, end_window=19_702)
    assert _reasons(result, n) == _oracle(ids, days, {"x": xs}, 19_700, 19_702)


# --------------------------------------------------------------------------- layouts


@FUZZ
@given(table=_any_table(), cuts=st.lists(st.integers(0, _N), max_size=4))
def test_sliced_and_chunked_tables_validate_like_their_contiguous_copy(table, cuts):
    try:
        expected = validate_batch(table, start_window=-(10**6), end_window=10**6)
    except SchemaError:
        return
    edges = sorted({0, table.num_rows, *[min(c, table.num_rows) for c in cuts]})
    chunked = pa.concat_tables([table.slice(a, b - a) for a, b in zip(edges, edges[1:])] or [table.slice(0, 0)])
    got = _checked(chunked, start_window=-(10**6), end_window=10**6)
    assert got.valid.equals(expected.valid)
    assert got.rejected.equals(expected.rejected)


# --------------------------------------------------------------------------- ids


@FUZZ
@given(ids=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=30))
def test_unicode_ids_are_compared_byte_for_byte(ids):
    """Every non-empty text is a user id as it is: no trimming, no normalisation (NFC and NFD
    forms, or ' a' and 'a', are different users); the first occurrence of each id is kept."""
    variants = ids + [unicodedata.normalize("NFD", i) for i in ids] + [f" {i}" for i in ids]
    n = len(variants)
    table = pa.table({"user_id": pa.array(variants), "day": pa.array([dt.date(2024, 1, 1)] * n), "x": [1.0] * n})
    result = _checked(table)
    assert result.valid.column("user_id").to_pylist() == list(dict.fromkeys(variants))


def test_the_reserved_int64_id_is_dead_lettered_not_left_to_fail_the_ledger():
    """The ledger's index reserves -2**63 and refuses it with a ValueError; one such row used to
    pass validation and crash the whole daily job at the filter. Now it is dead-lettered."""
    table = pa.table({
        "user_id": pa.array([1, RESERVED_USER_ID, RESERVED_USER_ID + 1], pa.int64()),
        "day": pa.array([dt.date(2024, 1, 1)] * 3),
        "x": [1.0, 2.0, 3.0],
    })
    result = _checked(table)
    assert result.valid.column("user_id").to_pylist() == [1, RESERVED_USER_ID + 1]
    assert result.rejected.column("reason").to_pylist() == ["wrong_type"]
    assert "reserved" in result.rejected.column("detail")[0].as_py()
    ledger = Ledger(budget=1.0)
    ledger.admit(result.valid.column("user_id"), result.valid.column("x").to_numpy(), noise_std=1.0)
    with pytest.raises(ValueError, match="reserved"):
        ledger.admit([RESERVED_USER_ID], [1.0], noise_std=1.0)


def test_very_long_ids_of_a_hundred_thousand_characters_are_kept_and_deduplicated():
    long_a, long_b = "é" * 100_000, "é" * 99_999 + "e"
    table = pa.table({
        "user_id": pa.array([long_a, long_b, long_a]),
        "day": pa.array([dt.date(2024, 1, 1)] * 3),
        "x": [1.0, 2.0, 3.0],
    })
    result = _checked(table)
    assert result.valid.column("user_id").to_pylist() == [long_a, long_b]
    assert result.rejected.column("reason").to_pylist() == ["duplicate_user_window"]
    assert len(result.rejected.column("detail")[0].as_py()) < 200  # the detail stays short
    assert long_a in result.rejected.column("raw")[0].as_py()  # the raw row is whole, for replay


@FUZZ
@given(copies=st.integers(1, 50), extra=st.integers(0, 5))
def test_exact_duplicate_rows_keep_one_and_dead_letter_the_rest(copies, extra):
    n = copies + extra
    table = pa.table({
        "user_id": pa.array([7] * copies + list(range(100, 100 + extra)), pa.int64()),
        "day": pa.array([dt.date(2024, 1, 1)] * n),
        "x": [1.0] * n,
    })
    result = _checked(table)
    assert result.valid.num_rows == 1 + extra
    assert result.reason_counts()[RejectReason.DUPLICATE] == copies - 1


@pytest.mark.parametrize("kind", sorted(POOL))
def test_empty_batches_of_every_column_kind_give_empty_outputs_or_a_schema_error(kind):
    column = POOL[kind].slice(0, 0)
    for time_name, time_column in (("day", pa.array([], pa.date32())), ("event_time", pa.array([], pa.string()))):
        for role in ("user_id", "indicator", "time"):
            columns = {"user_id": pa.array([], pa.int64()), time_name: time_column, "x": pa.array([], pa.float64())}
            columns[{"user_id": "user_id", "indicator": "x", "time": time_name}[role]] = column
            try:
                result = _checked(pa.table(columns))
            except SchemaError:
                continue
            assert result.valid.num_rows == 0 and result.rejected.num_rows == 0


def test_a_table_with_no_columns_is_a_schema_error_naming_user_id():
    with pytest.raises(SchemaError, match="'user_id'"):
        validate_batch(pa.table({}))


@FUZZ
@given(length=st.integers(-(2**70), 2**70) | st.sampled_from([2**61, 2**61 + 1, 2**63]),
       origin=st.integers(-(2**70), 2**70) | st.sampled_from([2**61, -(2**61)]))
def test_window_spec_accepts_or_refuses_any_integers_with_a_value_error(length, origin):
    try:
        spec = WindowSpec(length_seconds=length, origin_seconds=origin)
    except ValueError as exc:
        assert "length_seconds" in str(exc) or "origin_seconds" in str(exc)
        return
    # The earliest and latest supported instants, and one just outside each end.
    seconds = [MIN_TIME_SECONDS, MAX_TIME_SECONDS, MIN_TIME_SECONDS - 1, MAX_TIME_SECONDS + 1]
    table = pa.table({"user_id": [1, 2, 3, 4], "event_time": pa.array(seconds, pa.timestamp("s")), "x": [1.0] * 4})
    result = _checked(table, window=spec)
    assert result.valid.num_rows == 2
    windows = result.valid.column("window_id").to_numpy()
    starts = np.array([spec.window_start_seconds(int(w)) for w in windows])
    assert np.all(starts <= np.array(seconds[:2])) and np.all(np.array(seconds[:2]) < starts + spec.length_seconds)
