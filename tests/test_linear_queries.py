"""Linear query specs (issue 4): what each kind computes, its labels, its canonical JSON, and
every way a spec or its input can be refused."""

from __future__ import annotations

import datetime as dt
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from renyi_stream.queries.linear import MAX_ID, LinearQuery, default_queries
from renyi_stream.stream.accounting.gaussian import MAX_DIM
from renyi_stream.stream.schema import validate_batch


def _rows(**columns) -> pa.Table:
    return pa.table({name: pa.array(values, type=pa.float64()) for name, values in columns.items()})


EVERY_TYPE = [
    LinearQuery.columns("opens", ["opened", "bought"]),
    LinearQuery.histogram("tiers", "tier", [0, 1, 2]),
    LinearQuery.histogram("plans", "plan", ["free", "pro"]),
    LinearQuery.clamp("minutes", "minutes", 0, 60),
    LinearQuery.weighted("score", {"opened": 0.5, "bought": 2}),
]


# --- what each spec computes -----------------------------------------------------------------------


def test_a_columns_query_has_one_labelled_coordinate_per_column_in_the_order_given():
    q = LinearQuery.columns("opens", ["opened", "bought"])
    assert (q.dim, q.labels, q.columns_needed) == (2, ("opened", "bought"), ("opened", "bought"))
    np.testing.assert_array_equal(q.evaluate(_rows(opened=[1, 0], bought=[2, 3])), [[1, 2], [0, 3]])


def test_a_columns_query_reads_integer_and_bool_columns_as_float64():
    rows = pa.table({"n": pa.array([3, 4], pa.int32()), "b": pa.array([True, False])})
    values = LinearQuery.columns("q", ["n", "b"]).evaluate(rows)
    assert values.dtype == np.float64
    np.testing.assert_array_equal(values, [[3, 1], [4, 0]])


def test_a_numeric_histogram_is_one_hot_over_the_declared_codes():
    q = LinearQuery.histogram("plan", "tier", [0, 1, 2])
    assert q.labels == ("tier=0", "tier=1", "tier=2")
    np.testing.assert_array_equal(q.evaluate(_rows(tier=[2, 0, 1])), [[0, 0, 1], [1, 0, 0], [0, 1, 0]])


def test_a_value_outside_the_declared_categories_is_the_zero_vector():
    q = LinearQuery.histogram("plan", "tier", [0, 1])
    np.testing.assert_array_equal(q.evaluate(_rows(tier=[7, -1, 0.5])), np.zeros((3, 2)))


def test_a_numeric_histogram_counts_minus_zero_as_zero():
    np.testing.assert_array_equal(LinearQuery.histogram("h", "t", [0, 1]).evaluate(_rows(t=[-0.0])), [[1, 0]])


def test_a_string_histogram_is_one_hot_over_the_declared_strings():
    q = LinearQuery.histogram("plans", "plan", ["free", "pro"])
    assert (q.labels, q.categorical) == (("plan=free", "plan=pro"), True)
    rows = pa.table({"plan": ["pro", "free", "enterprise"]})
    np.testing.assert_array_equal(q.evaluate(rows), [[0, 1], [1, 0], [0, 0]])


def test_a_string_histogram_reads_dictionary_encoded_columns():
    rows = pa.table({"plan": pa.array(["pro", "free", "pro"]).dictionary_encode()})
    np.testing.assert_array_equal(LinearQuery.histogram("p", "plan", ["free", "pro"]).evaluate(rows),
                                  [[0, 1], [1, 0], [0, 1]])


def test_a_null_in_a_string_column_is_the_zero_vector():
    rows = pa.table({"plan": pa.array([None, "pro"], pa.string())})
    np.testing.assert_array_equal(LinearQuery.histogram("p", "plan", ["pro"]).evaluate(rows), [[0], [1]])


def test_histogram_labels_tell_close_codes_apart():
    q = LinearQuery.histogram("h", "t", [1, 1.0000001, 123456789, 1e6])
    assert q.labels == ("t=1", "t=1.0000001", "t=123456789", "t=1e+06")


def test_a_clamped_query_bounds_each_contribution():
    q = LinearQuery.clamp("minutes", "minutes", 0, 60)
    assert q.labels == ("clamp(minutes,0,60)",)
    np.testing.assert_array_equal(q.evaluate(_rows(minutes=[-5, 30, 500])), [[0], [30], [60]])


def test_a_weighted_query_is_one_coordinate_of_the_weighted_sum():
    q = LinearQuery.weighted("score", {"opened": 0.5, "bought": 2})
    assert (q.dim, q.labels) == (1, ("2*bought+0.5*opened",))
    np.testing.assert_array_equal(q.evaluate(_rows(opened=[2, 0], bought=[1, 1])), [[3], [2]])


@pytest.mark.parametrize("query", EVERY_TYPE, ids=lambda q: q.query_id)
def test_evaluate_on_no_rows_is_an_empty_n_by_dim_array(query):
    empty = pa.table({c: pa.array([], pa.string() if query.categorical else pa.float64())
                      for c in query.columns_needed})
    values = query.evaluate(empty)
    assert values.shape == (0, query.dim) and values.dtype == np.float64


@pytest.mark.parametrize("query", EVERY_TYPE, ids=lambda q: q.query_id)
def test_evaluate_gives_finite_n_by_dim_float64_on_finite_input(query):
    rng = np.random.default_rng(4)
    n = 1000
    columns = {c: (pa.array(rng.choice(["free", "pro", "x"], n)) if query.categorical
                   else pa.array(rng.normal(0, 1e6, n) * rng.integers(0, 2, n)))
               for c in query.columns_needed}
    values = query.evaluate(pa.table(columns))
    assert values.shape == (n, query.dim) and values.dtype == np.float64 and np.isfinite(values).all()


def test_evaluate_accepts_a_record_batch():
    batch = pa.record_batch({"opened": pa.array([1.0, 2.0])})
    np.testing.assert_array_equal(LinearQuery.columns("q", ["opened"]).evaluate(batch), [[1], [2]])


def test_evaluate_runs_on_the_rows_validate_batch_returns():
    batch = pa.table({"user_id": pa.array([1, 2], pa.int64()), "day": pa.array([dt.date(2026, 3, 1)] * 2),
                      "opened": pa.array([1, 0], pa.int8()), "tier": pa.array(["2", "0"])})
    valid = validate_batch(batch).valid
    q = LinearQuery.histogram("tiers", "tier", [0, 1, 2])
    q.validate_against(valid.schema)
    np.testing.assert_array_equal(q.evaluate(valid), [[0, 0, 1], [1, 0, 0]])


def test_evaluate_names_a_column_absent_from_the_rows():
    with pytest.raises(ValueError, match="'bought', absent"):
        LinearQuery.columns("q", ["bought"]).evaluate(_rows(opened=[1]))


def test_evaluate_refuses_nulls_in_a_numeric_column():
    with pytest.raises(ValueError, match="null.*validate_batch"):
        LinearQuery.columns("q", ["a"]).evaluate(pa.table({"a": pa.array([1.0, None])}))


# --- canonical JSON --------------------------------------------------------------------------------


def test_the_same_spec_serialises_to_the_same_text_whatever_the_order_or_number_type():
    a = LinearQuery.weighted("score", {"b": 2, "a": 0.5}, description="d")
    b = LinearQuery.weighted("score", {"a": 0.5, "b": 2.0}, description="d")
    assert a.to_json() == b.to_json() and a == b


def test_the_json_of_a_default_query_is_pinned():
    # Stores hold this text in query_registry.spec_json: it must never change.
    assert default_queries(["opened"])[0].to_json() == (
        '{"description":"daily sum of opened","kind":"window","query_id":"sum:opened",'
        '"spec":{"columns":["opened"],"type":"columns"}}')


@pytest.mark.parametrize("query", EVERY_TYPE + [LinearQuery.columns("r", ["a"], kind="running", description="é")],
                         ids=lambda q: q.query_id)
def test_a_query_round_trips_through_json(query):
    back = LinearQuery.from_json(query.to_json())
    assert back == query and back.kind == query.kind and back.labels == query.labels
    assert back.to_json() == query.to_json()


def test_equal_queries_hash_equal_and_survive_pickling():
    a = LinearQuery.histogram("t", "tier", [0, 1])
    assert hash(a) == hash(LinearQuery.from_json(a.to_json()))
    assert pickle.loads(pickle.dumps(a)) == a
    assert len({a, LinearQuery.histogram("t", "tier", [0.0, 1.0])}) == 1


@pytest.mark.parametrize("text, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"query_id": "q"}', "JSON object"),
    ('{"query_id": "q", "spec": {"type": "columns", "columns": ["a"]}, "extra": 1}', "unknown key"),
])
def test_from_json_refuses_what_to_json_never_writes(text, message):
    with pytest.raises(ValueError, match=message):
        LinearQuery.from_json(text)


# --- refused specs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("build, message", [
    (lambda: LinearQuery.columns("q", []), "columns must list at least one"),
    (lambda: LinearQuery.columns("q", ["a", "a"]), "columns must be distinct"),
    (lambda: LinearQuery.columns("q", [""]), "column must be a non-empty"),
    (lambda: LinearQuery.columns("q", ["user_id"]), "reserved column 'user_id'"),
    (lambda: LinearQuery.columns("q", ["window_id"]), "reserved column 'window_id'"),
    (lambda: LinearQuery.histogram("q", "t", []), "categories must list at least one"),
    (lambda: LinearQuery.histogram("q", "t", [1, 1.0]), "categories must be distinct"),
    (lambda: LinearQuery.histogram("q", "t", [0.0, -0.0]), "categories must be distinct"),
    (lambda: LinearQuery.histogram("q", "t", [1, "a"]), "all numbers or all strings"),
    (lambda: LinearQuery.histogram("q", "t", [True]), "finite number"),
    (lambda: LinearQuery.histogram("q", "t", [float("nan")]), "finite number"),
    (lambda: LinearQuery.histogram("q", "t", list(range(MAX_DIM + 1))), f"at most {MAX_DIM} coordinates"),
    (lambda: LinearQuery.clamp("q", "m", 5, 5), "lo must be below hi"),
    (lambda: LinearQuery.clamp("q", "m", 6, 5), "lo must be below hi"),
    (lambda: LinearQuery.clamp("q", "m", 0, float("inf")), "hi must be a finite number"),
    (lambda: LinearQuery.weighted("q", {}), "weights must map at least one"),
    (lambda: LinearQuery.weighted("q", {"a": float("nan")}), "weight of 'a' must be a finite number"),
    (lambda: LinearQuery.weighted("q", {"a": float("-inf")}), "weight of 'a' must be a finite number"),
    (lambda: LinearQuery.weighted("q", {"a": "2"}), "weight of 'a' must be a finite number"),
    (lambda: LinearQuery.columns("", ["a"]), "query_id must be"),
    (lambda: LinearQuery.columns(" q", ["a"]), "query_id must be"),
    (lambda: LinearQuery.columns("q\n", ["a"]), "query_id must be"),
    (lambda: LinearQuery.columns("q[1]", ["a"]), "query_id must be"),
    (lambda: LinearQuery.columns("q" * (MAX_ID + 1), ["a"]), "query_id must be"),
    (lambda: LinearQuery.columns(7, ["a"]), "query_id must be"),
    (lambda: LinearQuery.columns("q", ["a"], kind="hourly"), "kind must be one of"),
    (lambda: LinearQuery.columns("q", ["a"], description="x" * 2001), "description"),
    (lambda: LinearQuery("q", {"type": "cube"}), "type in"),
    (lambda: LinearQuery("q", {"type": "clamp", "column": "m", "lo": 0, "hi": 1, "scale": 2}), "unknown key"),
])
def test_a_bad_spec_is_refused_with_a_message_naming_the_problem(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_the_largest_allowed_histogram_has_max_dim_coordinates():
    assert LinearQuery.histogram("q", "t", list(range(MAX_DIM))).dim == MAX_DIM


# --- validation against the data's schema ------------------------------------------------------------

SCHEMA = pa.schema([("user_id", pa.int64()), ("window_id", pa.int64()), ("opened", pa.float64()),
                    ("visits", pa.int32()), ("plan", pa.string())])


def test_a_query_on_an_unknown_column_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['nope'\]"):
        LinearQuery.columns("q", ["opened", "nope"]).validate_against(SCHEMA)


def test_a_numeric_query_on_a_string_column_is_refused():
    with pytest.raises(ValueError, match="'plan' to be a numeric column.*string"):
        LinearQuery.weighted("q", {"opened": 1, "plan": 2}).validate_against(SCHEMA)


def test_a_string_histogram_on_a_numeric_column_is_refused():
    with pytest.raises(ValueError, match="'visits' to be a string column"):
        LinearQuery.histogram("q", "visits", ["a", "b"]).validate_against(SCHEMA)


def test_a_numeric_histogram_on_a_string_column_is_refused():
    with pytest.raises(ValueError, match="'plan' to be a numeric column"):
        LinearQuery.histogram("q", "plan", [0, 1]).validate_against(SCHEMA)


@pytest.mark.parametrize("query", [LinearQuery.columns("a", ["opened", "visits"]),
                                   LinearQuery.histogram("b", "plan", ["free"]),
                                   LinearQuery.histogram("c", "visits", [1, 2]),
                                   LinearQuery.clamp("d", "visits", 0, 9),
                                   LinearQuery.weighted("e", {"opened": 1, "visits": -1})], ids=lambda q: q.query_id)
def test_a_query_whose_columns_exist_with_the_right_kind_is_accepted(query):
    query.validate_against(SCHEMA)


def test_a_list_of_names_stands_for_numeric_columns():
    LinearQuery.columns("q", ["opened"]).validate_against(["opened"])
    with pytest.raises(ValueError, match="string column"):
        LinearQuery.histogram("q", "plan", ["free"]).validate_against(["plan"])


# --- defaults ----------------------------------------------------------------------------------------


def test_default_window_queries_are_the_per_column_sums_with_ids_sum_column():
    queries = default_queries(["opened", "bought"])
    assert [(q.query_id, q.kind, q.labels, q.columns_needed) for q in queries] == [
        ("sum:opened", "window", ("opened",), ("opened",)), ("sum:bought", "window", ("bought",), ("bought",))]


def test_default_running_queries_have_ids_running_column():
    assert [(q.query_id, q.kind) for q in default_queries(["a"], kind="running")] == [("running:a", "running")]


def test_default_ids_keep_any_column_name_as_it_is():
    # Column names come from the input files; the ids existing stores hold are sum:<column>.
    assert [q.query_id for q in default_queries(["Opened App", "x" * 128])] == ["sum:Opened App", "sum:" + "x" * 128]


def test_default_queries_refuse_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of"):
        default_queries(["a"], kind="hourly")


def test_a_spec_keeps_its_kind_as_metadata_only():
    window, running = LinearQuery.columns("a", ["x"]), LinearQuery.columns("a", ["x"], kind="running")
    np.testing.assert_array_equal(window.evaluate(_rows(x=[2])), running.evaluate(_rows(x=[2])))
    assert window != running and json.loads(running.to_json())["kind"] == "running"
