"""Tests for renyi_stream.stream.schema: the indicator-batch schema and its validator (invariant 7
(rows-counted-not-lost, docs/architecture.md))."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from renyi_stream.stream.schema import (
    DAY,
    EVENT_TIME,
    MAX_TIME_SECONDS,
    MIN_TIME_SECONDS,
    REJECTED_SCHEMA,
    USER_ID,
    WINDOW_ID,
    RejectReason,
    SchemaError,
    ValidatedBatch,
    WindowSpec,
    indicator_schema,
    valid_schema,
    validate_batch,
)

D2024 = 19723  # days from 1970-01-01 to 2024-01-01


def _strict_json(text: str):
    def no_constants(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


def check(batch, **kwargs) -> ValidatedBatch:
    """validate_batch plus the invariants every result must satisfy."""
    result = validate_batch(batch, **kwargs)
    n = batch.num_rows
    assert result.valid.num_rows + result.rejected.num_rows == n  # conservation
    assert result.rejected.schema == REJECTED_SCHEMA
    idx = result.rejected.column("row_index").to_numpy()
    assert np.all(np.diff(idx) > 0), "rejected row_index must be unique and sorted"
    assert np.all((idx >= 0) & (idx < n))
    assert set(result.rejected.column("reason").to_pylist()) <= {r.value for r in RejectReason}
    assert result.valid.column_names == [USER_ID, WINDOW_ID, *result.indicator_columns]
    for raw in result.rejected.column("raw").to_pylist():
        _strict_json(raw)
    return result


def rejects(result: ValidatedBatch) -> dict[int, tuple[str, str]]:
    rows = result.rejected.to_pylist()
    return {r["row_index"]: (r["reason"], r["detail"]) for r in rows}


def valid_rows(result: ValidatedBatch, n: int) -> np.ndarray:
    """Input row indices of the valid rows (valid keeps input order)."""
    return np.setdiff1d(np.arange(n), result.rejected.column("row_index").to_numpy())


def day_batch(user_ids, days, **indicators) -> pa.Table:
    return pa.table({USER_ID: user_ids, DAY: days, **indicators})


# --------------------------------------------------------------------------- schemas


def test_indicator_schema_documents_user_day_and_float_indicators():
    schema = indicator_schema(["a", "b"])
    assert schema.names == [USER_ID, DAY, "a", "b"]
    assert schema.field(USER_ID).type == pa.int64()
    assert schema.field(DAY).type == pa.date32()
    assert schema.field("a").type == pa.float64()
    assert not any(f.nullable for f in schema)


def test_indicator_schema_event_time_is_utc_timestamp_and_string_ids_allowed():
    schema = indicator_schema(["a"], user_id_type=pa.string(), time_column=EVENT_TIME)
    assert schema.field(USER_ID).type == pa.string()
    assert schema.field(EVENT_TIME).type == pa.timestamp("us", tz="UTC")


def test_indicator_schema_rejects_reserved_repeated_or_bad_arguments():
    with pytest.raises(SchemaError, match="window_id"):
        indicator_schema(["a", WINDOW_ID])
    with pytest.raises(ValueError, match="more than once"):
        indicator_schema(["a", "a"])
    with pytest.raises(TypeError, match="sequence"):
        indicator_schema("a")
    with pytest.raises(ValueError, match="user_id_type"):
        indicator_schema(["a"], user_id_type=pa.float64())
    with pytest.raises(ValueError, match="time_column"):
        indicator_schema(["a"], time_column="ts")


def test_batch_in_documented_schema_is_all_valid():
    schema = indicator_schema(["a"])
    batch = pa.table({USER_ID: [1, 2], DAY: [dt.date(2024, 1, 1)] * 2, "a": [0.5, 1.0]}, schema=schema)
    result = check(batch)
    assert result.valid.num_rows == 2
    assert result.valid.schema == valid_schema(["a"])


# --------------------------------------------------------------------------- happy path


def test_valid_rows_get_window_id_days_since_epoch_and_float_indicators():
    batch = day_batch([1, 2], [dt.date(2024, 1, 1), dt.date(1970, 1, 1)], a=[1, 2], b=[0.5, -0.5])
    result = check(batch)
    expected = {USER_ID: [1, 2], WINDOW_ID: [D2024, 0], "a": [1.0, 2.0], "b": [0.5, -0.5]}
    assert result.valid.to_pydict() == expected
    assert result.valid.schema == valid_schema(["a", "b"])
    assert result.indicator_columns == ("a", "b")


def test_record_batch_and_chunked_table_are_accepted():
    table = day_batch([1, 2, 3], [dt.date(2024, 1, 1)] * 3, a=[1.0, 2.0, 3.0])
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1, 2)])
    assert chunked.column(USER_ID).num_chunks == 2
    from_batch = check(table.to_batches()[0])
    from_chunks = check(chunked)
    assert from_batch.valid.equals(from_chunks.valid)
    assert from_chunks.valid.num_rows == 3


def test_non_arrow_input_raises_type_error():
    with pytest.raises(TypeError, match="RecordBatch or Table"):
        validate_batch({USER_ID: [1]})


# --------------------------------------------------------------------------- reject reasons


def test_null_user_id_rejected():
    result = check(day_batch([1, None], [dt.date(2024, 1, 1)] * 2, a=[1.0, 2.0]))
    assert rejects(result) == {1: ("null_user_id", "user_id is null")}


def test_empty_user_id_rejected():
    result = check(day_batch(["u", ""], [dt.date(2024, 1, 1)] * 2, a=[1.0, 2.0]))
    assert rejects(result) == {1: ("empty_user_id", "user_id is an empty string")}


def test_null_time_rejected_for_null_and_blank_values():
    result = check(day_batch([1, 2, 3], ["2024-01-01", None, "  "], a=[1.0, 2.0, 3.0]))
    got = rejects(result)
    assert {k: v[0] for k, v in got.items()} == {1: "null_time", 2: "null_time"}
    assert "day" in got[1][1]


def test_null_time_rejected_for_date_column():
    result = check(day_batch([1, 2], pa.array([dt.date(2024, 1, 1), None]), a=[1.0, 2.0]))
    assert rejects(result) == {1: ("null_time", "day is null")}


def test_bad_time_rejected_for_unparseable_or_impossible_dates():
    days = ["2024-01-01", "2023-02-29", "2024-13-01", "2024-1-1", "yesterday", "2024-01-01T00:00"]
    days.append("0000-01-01")  # year 0 is outside the supported 0001..9999
    result = check(day_batch(list(range(len(days))), days, a=[1.0] * len(days)))
    got = rejects(result)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert {v[0] for v in got.values()} == {"bad_time"}
    assert got[1][1] == 'day: cannot parse "2023-02-29" as a YYYY-MM-DD date'


def test_leap_day_is_a_valid_day():
    result = check(day_batch([1, 2], ["2024-02-29", "2000-02-29"], a=[1.0, 1.0]))
    assert result.valid.column(WINDOW_ID).to_pylist() == [
        (dt.date(2024, 2, 29) - dt.date(1970, 1, 1)).days,
        (dt.date(2000, 2, 29) - dt.date(1970, 1, 1)).days,
    ]


def test_bad_time_rejected_for_unparseable_event_time_strings():
    times = ["2024-01-01T10:00:00Z", "2024-01-01T25:00:00Z", "2024-01-01T10:61"]
    times += ["2024-01-01T10:00:00+25:00", "soon"]
    batch = pa.table({USER_ID: [1, 2, 3, 4, 5], EVENT_TIME: times, "a": [1.0] * 5})
    got = rejects(check(batch))
    assert sorted(got) == [1, 2, 3, 4]
    assert {v[0] for v in got.values()} == {"bad_time"}
    assert "ISO-8601" in got[4][1]


def test_bad_time_rejected_outside_years_0001_to_9999_for_every_time_kind():
    ticks = pa.array([0, 2**62, -(2**62)], pa.int64()).cast(pa.timestamp("s", tz="UTC"))
    got = rejects(check(pa.table({USER_ID: [1, 2, 3], EVENT_TIME: ticks, "a": [1.0] * 3})))
    assert sorted(got) == [1, 2]
    span = "outside 0001-01-01..9999-12-31 UTC"
    assert got[1] == ("bad_time", f"event_time is {2**62} s from the epoch, {span}")
    days = pa.array([0, 2_932_896, 2_932_897, -719_163], pa.int32()).cast(pa.date32())  # 9999-12-31 is in
    got = rejects(check(day_batch([1, 2, 3, 4], days, a=[1.0] * 4)))
    assert {k: v[0] for k, v in got.items()} == {2: "bad_time", 3: "bad_time"}
    # valid four-digit local times whose UTC instant falls outside the span
    times = ["9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00Z"]
    got = rejects(check(pa.table({USER_ID: [1, 2, 3], EVENT_TIME: times, "a": [1.0] * 3})))
    assert {k: v[0] for k, v in got.items()} == {0: "bad_time", 1: "bad_time"}


def test_time_span_bounds_are_inclusive():
    edges = [MIN_TIME_SECONDS - 1, MIN_TIME_SECONDS, MAX_TIME_SECONDS, MAX_TIME_SECONDS + 1]
    ticks = pa.array(edges, pa.int64()).cast(pa.timestamp("s"))
    result = check(pa.table({USER_ID: [1, 2, 3, 4], EVENT_TIME: ticks, "a": [1.0] * 4}))
    assert sorted(rejects(result)) == [0, 3]
    assert result.valid.column(WINDOW_ID).to_pylist() == [e // 86_400 for e in edges[1:3]]


def test_null_value_rejected():
    result = check(day_batch([1, 2], ["2024-01-01"] * 2, a=[1.0, None]))
    assert rejects(result) == {1: ("null_value", "column 'a' is null")}


def test_blank_string_indicator_is_null_value():
    result = check(day_batch([1, 2], ["2024-01-01"] * 2, a=["1", " "]))
    assert rejects(result) == {1: ("null_value", "column 'a' is null")}


def test_wrong_type_rejected_for_unparseable_indicator_string():
    result = check(day_batch([1, 2, 3], ["2024-01-01"] * 3, a=["1.5", "abc", "0x10"]))
    got = rejects(result)
    assert got[1] == ("wrong_type", 'column \'a\': cannot parse "abc" as a number')
    assert got[2][0] == "wrong_type"
    assert result.valid.column("a").to_pylist() == [1.5]


# Each way a row becomes wrong_type, as (user ids, values of indicator "b", id_type), with rows 1
# and 2 wrong in the same column: (the column the detail must name, row 1's value, row 2's value).
_WRONG_TYPES = {
    "text_in_a_number_column": ((pa.array([1, 2, 3]), ["1", "yes", "n/a"], None), ("column 'b'", "yes", "n/a")),
    "text_id_for_an_int64_ledger": ((pa.array(["1", "abc", "x9"]), ["1"] * 3, "int64"), ("user_id", "abc", "x9")),
    "float_id_with_a_fraction": ((pa.array([1.0, 1.5, 2.25]), ["1"] * 3, "int64"), ("user_id", "1.5", "2.25")),
    "unsigned_id_beyond_int64": ((pa.array([1, 2**63, 2**64 - 1], pa.uint64()), ["1"] * 3, None),
                                 ("user_id", str(2**63), str(2**64 - 1))),
}


@pytest.mark.parametrize("case", sorted(_WRONG_TYPES))
def test_every_wrong_type_detail_names_its_column_and_its_own_rows_value_alone(case):
    (ids, values, id_type), (column, own, other) = _WRONG_TYPES[case]
    got = rejects(check(day_batch(ids, ["2024-01-01"] * 3, b=values), id_type=id_type))
    assert [reason for reason, _ in got.values()] == ["wrong_type", "wrong_type"]
    assert column in got[1][1] and own in got[1][1] and other not in got[1][1]
    assert column in got[2][1] and other in got[2][1] and own not in got[2][1]


def test_a_wrong_type_detail_names_the_first_column_that_did_not_parse():
    got = rejects(check(day_batch([1], ["2024-01-01"], a=["1"], b=["yes"], c=["no"])))
    assert got == {0: ("wrong_type", 'column \'b\': cannot parse "yes" as a number')}


def test_the_reserved_id_is_a_wrong_type_naming_user_id():
    got = rejects(check(day_batch(pa.array([1, -(2**63)], pa.int64()), ["2024-01-01"] * 2, a=[1.0] * 2)))
    assert got[1][0] == "wrong_type" and got[1][1].startswith(f"user_id {-(2**63)} is reserved")


def test_wrong_type_detail_cuts_long_values():
    long_value = "x" * 500
    result = check(day_batch([1], ["2024-01-01"], a=[long_value]))
    detail = rejects(result)[0][1]
    assert len(detail) < 100 and detail.count("x") == 40 and "..." in detail
    assert json.loads(result.rejected.column("raw")[0].as_py())["a"] == long_value


def test_non_finite_value_rejected():
    result = check(day_batch([1, 2, 3, 4], ["2024-01-01"] * 4, a=[1.0, math.nan, math.inf, -math.inf]))
    got = rejects(result)
    assert got == {
        1: ("non_finite_value", "column 'a' is nan"),
        2: ("non_finite_value", "column 'a' is inf"),
        3: ("non_finite_value", "column 'a' is -inf"),
    }


def test_non_finite_strings_and_overflowing_strings_are_non_finite_not_wrong_type():
    result = check(day_batch([1, 2, 3, 4], ["2024-01-01"] * 4, a=["NaN", "-Infinity", "1e400", "inf"]))
    assert {v[0] for v in rejects(result).values()} == {"non_finite_value"}
    assert result.rejected.num_rows == 4


def test_out_of_range_time_rejected_with_inclusive_bounds():
    days = ["2023-12-31", "2024-01-01", "2024-01-02", "2024-01-03"]
    result = check(day_batch([1, 2, 3, 4], days, a=[1.0] * 4), start_window=D2024, end_window=D2024 + 1)
    got = rejects(result)
    assert sorted(got) == [0, 3]
    assert {v[0] for v in got.values()} == {"out_of_range_time"}
    assert got[0][1] == f"window_id {D2024 - 1} is outside start_window={D2024}, end_window={D2024 + 1}"


def test_out_of_range_time_with_only_one_bound():
    days = ["2023-12-31", "2024-01-01"]
    low = check(day_batch([1, 2], days, a=[1.0, 1.0]), start_window=D2024)
    high = check(day_batch([1, 2], days, a=[1.0, 1.0]), end_window=D2024 - 1)
    assert list(rejects(low)) == [0]
    assert list(rejects(high)) == [1]


def test_duplicate_user_window_keeps_first_occurrence():
    result = check(day_batch([7, 8, 7, 7], ["2024-01-01"] * 4, a=[1.0, 2.0, 3.0, 4.0]))
    got = rejects(result)
    assert got == {
        2: ("duplicate_user_window", "(user_id, window_id) already valid at row 0"),
        3: ("duplicate_user_window", "(user_id, window_id) already valid at row 0"),
    }
    assert result.valid.column("a").to_pylist() == [1.0, 2.0]


def test_same_user_in_different_windows_is_not_a_duplicate():
    result = check(day_batch(["u", "u"], ["2024-01-01", "2024-01-02"], a=[1.0, 2.0]))
    assert result.rejected.num_rows == 0


def test_duplicate_check_ignores_rows_rejected_for_other_reasons():
    result = check(day_batch(["u", "u", "u"], ["2024-01-01"] * 3, a=[math.nan, 2.0, 3.0]))
    got = rejects(result)
    assert got[0][0] == "non_finite_value"
    assert got[2] == ("duplicate_user_window", "(user_id, window_id) already valid at row 1")
    assert result.valid.column("a").to_pylist() == [2.0]


def test_first_matching_reason_wins():
    batch = pa.table(
        {
            USER_ID: pa.array([None, "", "u", "v", "w"]),
            DAY: ["bad", None, "bad", "2024-01-01", "2024-01-01"],
            "a": ["nan", None, None, "nan", "zz"],
            "b": [None, "x", "1", None, "nan"],
        }
    )
    got = rejects(check(batch))
    reasons = [got[k][0] for k in range(5)]
    assert reasons == ["null_user_id", "empty_user_id", "bad_time", "null_value", "wrong_type"]
    assert got[3][1] == "column 'b' is null"


def test_within_a_reason_the_first_indicator_column_is_named():
    result = check(day_batch([1], ["2024-01-01"], a=[1.0], b=[math.inf], c=[math.nan]))
    assert rejects(result) == {0: ("non_finite_value", "column 'b' is inf")}


# --------------------------------------------------------------------------- input kinds


def test_csv_like_all_string_batch_parses():
    csv = (
        "user_id,day,opened_app,changed_plan,spend\n"
        "1,2024-01-01,1,0,12.5\n"
        "2, 2024-01-01 ,true,FALSE,-3e2\n"
        "3,2024-01-02,,0,1\n"
        "4,2024-01-02,yes,0,1\n"
        "5,2024-01-03,1,0, 7 \n"
    )
    names = ["user_id", "day", "opened_app", "changed_plan", "spend"]
    as_text = {name: pa.string() for name in names}
    options = pacsv.ConvertOptions(column_types=as_text, strings_can_be_null=False)
    table = pacsv.read_csv(io.BytesIO(csv.encode()), convert_options=options)
    assert all(pa.types.is_string(t) for t in table.schema.types)
    result = check(table)
    assert result.valid.to_pydict() == {
        USER_ID: ["1", "2", "5"],
        WINDOW_ID: [D2024, D2024, D2024 + 2],
        "opened_app": [1.0, 1.0, 1.0],
        "changed_plan": [0.0, 0.0, 0.0],
        "spend": [12.5, -300.0, 7.0],
    }
    got = rejects(result)
    assert got[2][0] == "null_value" and got[3][0] == "wrong_type"


def test_integer_user_ids_of_any_width_cast_to_int64():
    for t in (pa.int8(), pa.int32(), pa.uint16(), pa.uint64()):
        result = check(day_batch(pa.array([1, 2], t), ["2024-01-01"] * 2, a=[1.0, 2.0]))
        assert result.valid.schema.field(USER_ID).type == pa.int64()
        assert result.valid.column(USER_ID).to_pylist() == [1, 2]


def test_uint64_user_id_beyond_int64_is_wrong_type():
    ids = pa.array([2**63 - 1, 2**63, 2**64 - 1], pa.uint64())
    got = rejects(check(day_batch(ids, ["2024-01-01"] * 3, a=[1.0] * 3)))
    assert got == {
        1: ("wrong_type", f"user_id {2**63} does not fit in int64"),
        2: ("wrong_type", f"user_id {2**64 - 1} does not fit in int64"),
    }


def test_string_user_ids_kept_as_utf8_including_unicode_and_long_ids():
    long_id = "Ω" * 10_000
    ids = pa.array(["ünïcødé", long_id, " ", "日本"], pa.large_string())
    result = check(day_batch(ids, ["2024-01-01"] * 4, a=[1.0] * 4))
    assert result.valid.schema.field(USER_ID).type == pa.string()
    assert result.valid.column(USER_ID).to_pylist() == ["ünïcødé", long_id, " ", "日本"]


def test_dictionary_encoded_columns_are_decoded():
    ids = pa.array(["a", "b", "a"]).dictionary_encode()
    days = pa.array(["2024-01-01", "2024-01-01", "2024-01-02"]).dictionary_encode()
    result = check(day_batch(ids, days, a=[1.0, 2.0, 3.0]))
    assert result.valid.column(USER_ID).to_pylist() == ["a", "b", "a"]
    assert result.valid.column(WINDOW_ID).to_pylist() == [D2024, D2024, D2024 + 1]


def test_day_as_date32_date64_and_string_give_the_same_windows():
    dates = [dt.date(1969, 12, 31), dt.date(2024, 1, 1), dt.date(9999, 12, 31)]
    expected = [(d - dt.date(1970, 1, 1)).days for d in dates]
    for days in (pa.array(dates, pa.date32()), pa.array(dates, pa.date64()), [d.isoformat() for d in dates]):
        result = check(day_batch([1, 2, 3], days, a=[1.0] * 3))
        assert result.valid.column(WINDOW_ID).to_pylist() == expected


def test_naive_event_time_is_taken_as_utc():
    naive = [dt.datetime(2024, 1, 1, 0, 0), dt.datetime(2023, 12, 31, 23, 59, 59, 999_999)]
    times = pa.array(naive, pa.timestamp("us"))
    result = check(pa.table({USER_ID: [1, 2], EVENT_TIME: times, "a": [1.0, 1.0]}))
    assert result.valid.column(WINDOW_ID).to_pylist() == [D2024, D2024 - 1]


def test_tz_aware_event_time_is_converted_to_utc():
    tokyo = dt.timezone(dt.timedelta(hours=9))
    local = [dt.datetime(2024, 1, 1, 8, 0, tzinfo=tokyo), dt.datetime(2024, 1, 1, 9, 0, tzinfo=tokyo)]
    times = pa.array(local, pa.timestamp("ms", tz="Asia/Tokyo"))
    result = check(pa.table({USER_ID: [1, 2], EVENT_TIME: times, "a": [1.0, 1.0]}))
    # 08:00 in Tokyo is 23:00 UTC the day before; 09:00 is midnight UTC.
    assert result.valid.column(WINDOW_ID).to_pylist() == [D2024 - 1, D2024]


def test_event_time_units_floor_before_the_epoch():
    for unit, per_second in (("s", 1), ("ms", 10**3), ("us", 10**6), ("ns", 10**9)):
        ticks = pa.array([-1, 0, 86_400 * per_second - 1], pa.int64()).cast(pa.timestamp(unit))
        result = check(pa.table({USER_ID: [1, 2, 3], EVENT_TIME: ticks, "a": [1.0] * 3}))
        assert result.valid.column(WINDOW_ID).to_pylist() == [-1, 0, 0], unit


def test_event_time_iso_strings_with_offsets_fractions_and_date_only():
    times = [
        "2024-01-01T00:30:00+01:00",  # 23:30 UTC the day before
        "2024-01-01 23:30-01:00",  # 00:30 UTC the day after
        "2024-01-01T12:00:00.123456789Z",
        "2024-01-01",
        "2023-12-31 23:59:59.999",  # naive: taken as UTC
        "2024-01-01 02:02:03.000500+0100",  # Arrow's own text form of a tz-aware timestamp
    ]
    batch = pa.table({USER_ID: list(range(6)), EVENT_TIME: times, "a": [1.0] * 6})
    result = check(batch)
    expected = [D2024 - 1, D2024 + 1, D2024, D2024, D2024 - 1, D2024]
    assert result.valid.column(WINDOW_ID).to_pylist() == expected


def test_event_time_window_spec_hourly_with_origin():
    hourly = WindowSpec(length_seconds=3600, origin_seconds=1_704_067_200)  # 2024-01-01T00:00Z
    times = ["2024-01-01T00:59:59Z", "2024-01-01T01:00:00Z", "2023-12-31T23:00:00Z"]
    result = check(pa.table({USER_ID: [1, 2, 3], EVENT_TIME: times, "a": [1.0] * 3}), window=hourly)
    assert result.valid.column(WINDOW_ID).to_pylist() == [0, 1, -1]


def test_bool_and_decimal_indicators_become_float64():
    batch = day_batch(
        [1, 2],
        ["2024-01-01"] * 2,
        flag=[True, False],
        amount=pa.array([decimal.Decimal("1.25"), decimal.Decimal("-3")], pa.decimal128(10, 2)),
        half=pa.array(np.array([0.5, 2.0], np.float16)),
    )
    result = check(batch)
    assert result.valid.column("flag").to_pylist() == [1.0, 0.0]
    assert result.valid.column("amount").to_pylist() == [1.25, -3.0]
    assert result.valid.column("half").to_pylist() == [0.5, 2.0]
    assert {f.type for f in result.valid.schema if f.name not in (USER_ID, WINDOW_ID)} == {pa.float64()}


def test_integers_beyond_float64_precision_are_rounded_not_rejected():
    big = [2**63 - 1, -(2**63), 2**53 + 1]
    result = check(day_batch([1, 2, 3], ["2024-01-01"] * 3, a=pa.array(big, pa.int64())))
    assert result.valid.column("a").to_pylist() == [float(x) for x in big]


def test_explicit_indicator_columns_ignore_other_columns():
    batch = day_batch([1], ["2024-01-01"], a=[1.0], b=[2.0], tags=pa.array([["x"]]))
    result = check(batch, indicator_columns=["b"])
    assert result.indicator_columns == ("b",)
    assert result.valid.column_names == [USER_ID, WINDOW_ID, "b"]


def test_null_typed_columns_reject_every_row():
    n = 3
    null = pa.nulls(n)
    no_users = check(day_batch(null, ["2024-01-01"] * n, a=[1.0] * n))
    no_days = check(day_batch([1, 2, 3], null, a=[1.0] * n))
    no_values = check(day_batch([1, 2, 3], ["2024-01-01"] * n, a=null))
    assert no_users.reason_counts()[RejectReason.NULL_USER_ID] == n
    assert no_days.reason_counts()[RejectReason.NULL_TIME] == n
    assert no_values.reason_counts()[RejectReason.NULL_VALUE] == n
    assert no_users.valid.schema == valid_schema(["a"])


# --------------------------------------------------------------------------- outputs


def test_empty_batch_returns_empty_tables_with_schemas():
    empty = pa.array([], pa.string())
    batch = pa.table({USER_ID: empty, DAY: empty, "a": empty})
    result = check(batch)
    assert result.valid.num_rows == 0 and result.rejected.num_rows == 0
    assert result.valid.schema == valid_schema(["a"], pa.string())
    assert result.rejected.schema == REJECTED_SCHEMA


def test_raw_json_replays_the_rejected_row():
    tricky = 'quote " backslash \\ newline \n tab \t nul \x00 é 日本'
    batch = pa.table(
        {
            USER_ID: [tricky, "ok"],
            EVENT_TIME: pa.array([dt.datetime(2024, 1, 1, 12)] * 2, pa.timestamp("s", tz="UTC")),
            "a": [math.nan, 1.0],
            "b": pa.array([None, 2], pa.int64()),
            "c": ["abc", "1"],
        }
    )
    result = check(batch)
    raw = _strict_json(result.rejected.column("raw")[0].as_py())
    assert raw == {USER_ID: tricky, EVENT_TIME: "2024-01-01 12:00:00Z", "a": "NaN", "b": None, "c": "abc"}
    replayed = check(pa.table({k: [v] for k, v in raw.items()}))
    original, again = result.rejected.to_pylist()[0], replayed.rejected.to_pylist()[0]
    assert again["reason"] == original["reason"] == "null_value"
    assert again["raw"] == original["raw"]


def test_raw_json_writes_tz_aware_timestamps_in_utc():
    tokyo = dt.datetime(2024, 1, 1, 8, 0, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    times = pa.array([tokyo], pa.timestamp("ms", tz="Asia/Tokyo"))
    result = check(pa.table({USER_ID: [None], EVENT_TIME: times, "a": [1.0]}))
    assert _strict_json(result.rejected.column("raw")[0].as_py())[EVENT_TIME] == "2023-12-31 23:00:00.000Z"


def test_raw_json_writes_non_finite_floats_of_every_width_as_strings():
    for width in (np.float16, np.float32, np.float64):
        values = pa.array(np.array([math.inf, -math.inf, math.nan, 0.1], dtype=width))
        result = check(day_batch([1, 2, 3, None], ["2024-01-01"] * 4, a=values))
        raws = [_strict_json(r)["a"] for r in result.rejected.column("raw").to_pylist()]
        assert raws[:3] == ["Infinity", "-Infinity", "NaN"], width
        assert width(raws[3]) == width(0.1), width  # shortest text that round-trips in its width


def test_raw_json_writes_decimals_and_big_unsigned_ints_as_numbers():
    batch = day_batch(
        pa.array([2**64 - 1], pa.uint64()),
        ["2024-01-01"],
        a=pa.array([decimal.Decimal("-12.50")], pa.decimal128(10, 2)),
    )
    raw = _strict_json(check(batch).rejected.column("raw")[0].as_py())
    assert raw == {USER_ID: 2**64 - 1, DAY: "2024-01-01", "a": -12.5}


def test_reason_counts_cover_every_reason():
    result = check(day_batch([1, None, 1], ["2024-01-01"] * 3, a=[1.0, 1.0, 1.0]))
    counts = result.reason_counts()
    assert set(counts) == set(RejectReason)
    assert counts[RejectReason.NULL_USER_ID] == 1 and counts[RejectReason.DUPLICATE] == 1
    assert sum(counts.values()) == result.rejected.num_rows
    assert result.num_rows == 3


def test_reject_reason_str_is_its_value():
    assert str(RejectReason.DUPLICATE) == "duplicate_user_window"
    assert "reason: " + RejectReason.BAD_TIME.value == "reason: bad_time"


# --------------------------------------------------------------------------- schema errors


def test_schema_error_when_user_id_missing():
    with pytest.raises(SchemaError, match="'user_id'"):
        validate_batch(pa.table({DAY: ["2024-01-01"], "a": [1.0]}))


def test_schema_error_when_time_column_missing():
    with pytest.raises(SchemaError, match="no time column"):
        validate_batch(pa.table({USER_ID: [1], "a": [1.0]}))


def test_schema_error_when_both_day_and_event_time():
    batch = pa.table({USER_ID: [1], DAY: ["2024-01-01"], EVENT_TIME: ["2024-01-01"], "a": [1.0]})
    with pytest.raises(SchemaError, match="both 'day'.*'event_time'"):
        validate_batch(batch)


def test_schema_error_when_no_indicator_columns():
    with pytest.raises(SchemaError, match="no indicator columns"):
        validate_batch(pa.table({USER_ID: [1], DAY: ["2024-01-01"]}))
    with pytest.raises(SchemaError, match="no indicator columns"):
        validate_batch(day_batch([1], ["2024-01-01"], a=[1.0]), indicator_columns=[])


def test_schema_error_for_list_indicator_names_column_and_type():
    batch = day_batch([1], ["2024-01-01"], tags=pa.array([[1, 2]]))
    with pytest.raises(SchemaError, match=r"'tags' has unsupported type list<item: int64>"):
        validate_batch(batch)


def test_schema_error_for_unsupported_user_id_and_time_types():
    with pytest.raises(SchemaError, match="'user_id' has unsupported type double"):
        validate_batch(day_batch([1.5], ["2024-01-01"], a=[1.0]))
    with pytest.raises(SchemaError, match="'user_id' has unsupported type bool"):
        validate_batch(day_batch([True], ["2024-01-01"], a=[1.0]))
    with pytest.raises(SchemaError, match="'day' has unsupported type int64"):
        validate_batch(day_batch([1], [20240101], a=[1.0]))
    with pytest.raises(SchemaError, match="'event_time' has unsupported type date32"):
        validate_batch(pa.table({USER_ID: [1], EVENT_TIME: [dt.date(2024, 1, 1)], "a": [1.0]}))


def test_schema_error_for_named_indicator_column_missing():
    with pytest.raises(SchemaError, match="'nope'"):
        validate_batch(day_batch([1], ["2024-01-01"], a=[1.0]), indicator_columns=["a", "nope"])


def test_schema_error_for_reserved_window_id_column():
    with pytest.raises(SchemaError, match="'window_id'.*reserved"):
        validate_batch(day_batch([1], ["2024-01-01"], window_id=[3]))


def test_schema_error_for_repeated_column_names():
    batch = pa.table([[1], ["2024-01-01"], [1.0], [2.0]], names=[USER_ID, DAY, "a", "a"])
    with pytest.raises(SchemaError, match=r"repeated column names \['a'\]"):
        validate_batch(batch)


def test_empty_batch_with_bad_schema_still_raises():
    with pytest.raises(SchemaError, match="'user_id'"):
        validate_batch(pa.table({DAY: pa.array([], pa.date32()), "a": pa.array([], pa.float64())}))


# --------------------------------------------------------------------------- parameters


def test_start_window_after_end_window_raises_naming_both():
    batch = day_batch([1], ["2024-01-01"], a=[1.0])
    with pytest.raises(ValueError, match="start_window=5, end_window=4"):
        validate_batch(batch, start_window=5, end_window=4)


def test_window_bounds_must_be_integers():
    batch = day_batch([1], ["2024-01-01"], a=[1.0])
    with pytest.raises(TypeError, match="start_window"):
        validate_batch(batch, start_window=1.5)
    with pytest.raises(TypeError, match="end_window"):
        validate_batch(batch, end_window=True)


def test_window_spec_rejects_non_positive_length():
    for length in (0, -3600):
        with pytest.raises(ValueError, match="length_seconds"):
            WindowSpec(length_seconds=length)
    with pytest.raises(TypeError, match="length_seconds"):
        WindowSpec(length_seconds=1.5)
    with pytest.raises(ValueError, match="origin_seconds"):
        WindowSpec(origin_seconds=2**62)


def test_window_spec_maps_seconds_to_windows_and_back():
    spec = WindowSpec(length_seconds=10, origin_seconds=5)
    seconds = np.array([-6, -5, 4, 5, 14, 15], dtype=np.int64)
    windows = spec.window_of_seconds(seconds)
    assert windows.dtype == np.int64
    assert windows.tolist() == [-2, -1, -1, 0, 0, 1]
    assert np.all(spec.window_start_seconds(windows) <= seconds)
    assert np.all(seconds < spec.window_end_seconds(windows))
    assert spec.window_start_seconds(0) == 5 and spec.window_end_seconds(0) == 15
    with pytest.raises(TypeError, match="integer"):
        spec.window_of_seconds(np.array([1.5]))


def test_window_spec_is_frozen_and_normalises_numpy_ints():
    spec = WindowSpec(length_seconds=np.int64(60))
    assert type(spec.length_seconds) is int
    with pytest.raises(AttributeError):
        spec.length_seconds = 5  # type: ignore[misc]


# --------------------------------------------------------------------------- properties

_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 2.0**53 + 1]),
)
_NUMBERISH = st.text(alphabet="0123456789+-.eEinfatyINF xl_", max_size=8)


def _mostly(good, bad):
    """Draw from ``good`` about four times in five, else from ``bad``."""
    return st.integers(0, 4).flatmap(lambda k: bad if k == 0 else good)


def _cells(draw, n, pool):
    """n cells from a few values of ``pool`` (so keys repeat), sometimes null."""
    values = draw(st.lists(pool, min_size=1, max_size=3))
    return draw(st.lists(_mostly(st.sampled_from(values), st.none()), min_size=n, max_size=n))


@st.composite
def _user_ids(draw, n):
    kind = draw(st.sampled_from(["int64", "uint64", "string", "large_string"]))
    if kind == "int64":
        pool = st.integers(-(2**63), 2**63 - 1)
    elif kind == "uint64":
        pool = _mostly(st.integers(0, 2**63 - 1), st.integers(2**63, 2**64 - 1))
    else:
        pool = _mostly(st.text(max_size=6), st.one_of(st.just(""), st.text(min_size=300, max_size=301)))
    return pa.array(_cells(draw, n, pool), pa.string() if kind == "string" else getattr(pa, kind)())


@st.composite
def _times(draw, n):
    kind = draw(st.sampled_from(["date32", "day_string", "timestamp", "iso_string"]))
    if kind == "date32":
        return DAY, pa.array(_cells(draw, n, st.dates()), pa.date32())
    if kind == "day_string":
        pool = _mostly(st.dates().map(dt.date.isoformat), st.text(max_size=12))
        return DAY, pa.array(_cells(draw, n, pool), pa.string())
    if kind == "iso_string":
        stamps = st.datetimes(timezones=st.one_of(st.none(), st.timezones()))
        garbage = st.text(alphabet="0123456789-:TZ+. ", max_size=25)
        pool = _mostly(stamps.map(lambda d: d.isoformat(sep=" ")), garbage)
        return EVENT_TIME, pa.array(_cells(draw, n, pool), pa.string())
    unit = draw(st.sampled_from(["s", "ms", "us", "ns"]))
    tz = draw(st.sampled_from([None, "UTC", "America/New_York", "+05:30"]))
    ticks = _cells(draw, n, st.integers(-(2**63) + 1, 2**63 - 1))
    return EVENT_TIME, pa.array(ticks, pa.int64()).cast(pa.timestamp(unit, tz=tz))


@st.composite
def _indicator(draw, n):
    kinds = ["float64", "float32", "float16", "int64", "uint64", "decimal", "bool", "string"]
    kind = draw(st.sampled_from(kinds))
    if kind == "int64":
        pool = st.integers(-(2**63), 2**63 - 1)
    elif kind == "uint64":
        pool = st.integers(0, 2**64 - 1)
    elif kind == "decimal":
        pool = st.decimals(min_value=-(10**30), max_value=10**30, places=2)
    elif kind == "bool":
        pool = st.booleans()
    elif kind == "string":
        odd = st.one_of(_NUMBERISH, _FLOATS.map(repr), st.text(max_size=5))
        pool = _mostly(st.floats(allow_nan=False).map(repr), odd)
    else:
        pool = _mostly(st.floats(allow_nan=False, allow_infinity=False), _FLOATS)
    cells = draw(st.lists(_mostly(pool, st.none()), min_size=n, max_size=n))
    if kind.startswith("float"):
        width = {"float64": np.float64, "float32": np.float32, "float16": np.float16}[kind]
        missing = np.array([c is None for c in cells], dtype=bool)
        with np.errstate(over="ignore"):  # float32/float16 overflow to inf: wanted
            values = np.array([0.0 if c is None else c for c in cells], dtype=np.float64).astype(width)
        return pa.array(values, mask=missing)
    types = {"string": pa.string(), "bool": pa.bool_(), "decimal": pa.decimal128(33, 2)}
    return pa.array(cells, types.get(kind) or getattr(pa, kind)())


@st.composite
def _batches(draw):
    n = draw(st.integers(0, 10))
    time_name, times = draw(_times(n))
    columns = {USER_ID: draw(_user_ids(n)), time_name: times}
    for k in range(draw(st.integers(1, 3))):
        columns[f"x{k}"] = draw(_indicator(n))
    return pa.table(columns)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=_batches(),
    length=st.sampled_from([1, 3600, 86_400, 7 * 86_400]),
    origin=st.integers(-(10**10), 10**10),
    bounds=st.tuples(st.none() | st.integers(-(10**6), 10**6), st.none() | st.integers(0, 10**6)),
)
def test_property_arbitrary_batches_conserve_rows_and_yield_clean_valid_rows(batch, length, origin, bounds):
    start, end = bounds
    if start is not None and end is not None and start > end:
        start, end = end, start
    try:
        result = check(batch, window=WindowSpec(length, origin), start_window=start, end_window=end)
    except SchemaError:  # the only exception the validator may raise on well-typed arguments
        return
    n = batch.num_rows
    valid = result.valid
    for name in result.indicator_columns:
        assert np.all(np.isfinite(valid.column(name).to_numpy()))
        assert valid.column(name).null_count == 0
    pairs = list(zip(valid.column(USER_ID).to_pylist(), valid.column(WINDOW_ID).to_pylist()))
    assert len(set(pairs)) == len(pairs)
    windows = valid.column(WINDOW_ID).to_numpy()
    if start is not None:
        assert np.all(windows >= start)
    if end is not None:
        assert np.all(windows <= end)
    # every input row appears exactly once: rejected row indices plus the valid rows, in order
    kept = valid_rows(result, n)
    assert len(kept) == valid.num_rows
    assert valid.column(USER_ID).to_pylist() == [batch.column(USER_ID)[int(i)].as_py() for i in kept]
    for name in result.indicator_columns:
        column = batch.column(name)
        if not pa.types.is_string(column.type):
            expected = column.take(pa.array(kept, pa.int64())).cast(pa.float64(), safe=False)
            assert valid.column(name).to_pylist() == expected.to_pylist()


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(_FLOATS.map(repr), st.integers().map(str), _NUMBERISH), min_size=1, max_size=20
    )
)
def test_property_numeric_strings_never_raise_and_printed_floats_parse(values):
    n = len(values)
    batch = day_batch(list(range(n)), ["2024-01-01"] * n, a=pa.array(values, pa.string()))
    result = check(batch)
    got = rejects(result)
    for i, value in enumerate(values):
        try:
            expected = float(value)
        except ValueError:
            continue
        if value.strip() and "_" not in value:  # Python accepts 1_0; the validator does not
            assert got.get(i, ("",))[0] != "wrong_type", value
            if math.isfinite(expected) and i not in got:
                position = int(np.searchsorted(valid_rows(result, n), i))
                assert result.valid.column("a")[position].as_py() == expected


# --------------------------------------------------------------------------- category columns


def _with_plan(plan: pa.Array) -> pa.Table:
    n = len(plan)
    return pa.table({USER_ID: pa.array(range(n), pa.int64()), DAY: pa.array([dt.date(2024, 1, 1)] * n),
                     "opened": pa.array([1.0] * n), "plan": plan})


def test_category_columns_pass_through_as_utf8_with_nulls_kept():
    plan = pa.array(["free", None, "pro", "free"]).dictionary_encode()
    result = validate_batch(_with_plan(plan), category_columns=["plan"])
    assert result.valid.schema == valid_schema(["opened"], pa.int64(), ["plan"])
    assert result.valid.column("plan").to_pylist() == ["free", None, "pro", "free"]
    assert result.indicator_columns == ("opened",) and result.category_columns == ("plan",)
    assert result.rejected.num_rows == 0


def test_a_category_column_is_never_parsed_as_a_number():
    result = validate_batch(_with_plan(pa.array(["1.5", "abc"], pa.large_string())), category_columns=["plan"])
    assert result.valid.column("plan").to_pylist() == ["1.5", "abc"] and result.rejected.num_rows == 0


def test_a_rejected_rows_raw_json_carries_its_category():
    table = _with_plan(pa.array(["pro", "free"])).set_column(0, USER_ID, pa.array([None, 1], pa.int64()))
    result = validate_batch(table, category_columns=["plan"])
    assert _strict_json(result.rejected.column("raw")[0].as_py())["plan"] == "pro"


@pytest.mark.parametrize("category_columns, indicator_columns, message", [
    (["opened"], None, "expected a string type"),
    (["nosuch"], None, "not in batch"),
    (["plan"], ["opened", "plan"], "both as indicator and as category"),
    ([USER_ID], None, "reserved column"),
])
def test_bad_category_columns_are_schema_errors(category_columns, indicator_columns, message):
    with pytest.raises(SchemaError, match=message):
        validate_batch(_with_plan(pa.array(["pro", "free"])), category_columns=category_columns,
                       indicator_columns=indicator_columns)


def test_may_repeat_is_false_only_when_no_user_window_pair_repeats():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from renyi_stream.stream.schema import may_repeat

    pairs = st.lists(st.tuples(st.integers(-3, 40) | st.integers(-2**62, 2**62), st.integers(0, 3)), max_size=60)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(pairs, st.booleans())
    def check(rows, sort_by_window):
        if sort_by_window:
            rows = sorted(rows, key=lambda r: r[1])
        users = pa.array([u for u, _ in rows], type=pa.int64())
        windows = np.array([w for _, w in rows], dtype=np.int64)
        if not may_repeat(users, windows):
            assert len(set(rows)) == len(rows)

    check()


def test_may_repeat_proves_sorted_and_dense_ids_distinct_and_leaves_strings_to_grouping():
    from renyi_stream.stream.schema import may_repeat

    windows = np.repeat([5, 6], 4)
    assert not may_repeat(pa.array([1, 2, 3, 4, 1, 2, 3, 4]), windows)  # sorted within each window
    assert not may_repeat(pa.array([4, 2, 3, 1, 1, 3, 2, 4]), windows)  # dense, each cell once
    assert may_repeat(pa.array([4, 2, 4, 1, 1, 3, 2, 4]), windows)      # user 4 twice in window 5
    assert may_repeat(pa.array(["a", "b", "c", "d", "a", "b", "c", "d"]), windows)


# --- window options as the command lines write them ----------------------------------------------


@pytest.mark.parametrize("text, seconds", [("1d", 86_400), ("12h", 43_200), ("30m", 1_800), ("3600s", 3_600)])
def test_a_window_length_is_read_in_days_hours_minutes_or_seconds(text, seconds):
    assert WindowSpec.from_length(text) == WindowSpec(length_seconds=seconds)


@pytest.mark.parametrize("text", ["", "d", "1w", "1.5d", "one day", "0h", "-1d"])
def test_a_window_length_that_is_not_a_positive_count_of_a_unit_is_refused_naming_window(text):
    with pytest.raises(ValueError, match=rf"window must .*got window={re.escape(repr(text))}"):
        WindowSpec.from_length(text)


def test_a_day_names_the_window_holding_its_midnight_utc():
    assert WindowSpec().window_of_day("start", "1970-01-02") == 1
    assert WindowSpec.from_length("12h").window_of_day("end", "1970-01-02") == 2


@pytest.mark.parametrize("text", ["2026-02-30", "yesterday", "2026/03/01"])
def test_a_day_that_is_not_a_date_is_refused_naming_the_option(text):
    with pytest.raises(ValueError, match=rf"start must be a date YYYY-MM-DD, got start={re.escape(repr(text))}"):
        WindowSpec().window_of_day("start", text)
