"""Linear query specs and the query registry in the release store (issue 4)."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.daily_job import JobConfig, run_job
from queries.linear import LinearQuery, default_queries
from stream.accounting import calibrate
from queries.registry import QueryRegistry
from queries.release_store import ReleaseStore, connect_read_only

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


# --- specs -------------------------------------------------------------------------------------


def _rows(**columns) -> pa.Table:
    return pa.table({name: pa.array(values, type=pa.float64()) for name, values in columns.items()})


def test_a_columns_query_has_one_labelled_coordinate_per_column():
    q = LinearQuery.columns("opens", ["opened", "bought"])
    assert (q.dim, q.labels) == (2, ("opened", "bought"))
    np.testing.assert_array_equal(q.evaluate(_rows(opened=[1, 0], bought=[2, 3])), [[1, 2], [0, 3]])


def test_a_histogram_is_one_hot_over_declared_categories_and_zero_outside_them():
    q = LinearQuery.histogram("plan", "tier", [0, 1, 2])
    np.testing.assert_array_equal(q.evaluate(_rows(tier=[2, 0, 7])), [[0, 0, 1], [1, 0, 0], [0, 0, 0]])
    assert q.labels == ("tier=0", "tier=1", "tier=2")


def test_a_clamped_query_bounds_each_contribution():
    q = LinearQuery.clamp("minutes", "minutes", 0, 60)
    np.testing.assert_array_equal(q.evaluate(_rows(minutes=[-5, 30, 500])), [[0], [30], [60]])


def test_a_weighted_query_is_one_coordinate():
    q = LinearQuery.weighted("score", {"opened": 0.5, "bought": 2})
    np.testing.assert_array_equal(q.evaluate(_rows(opened=[2, 0], bought=[1, 1])), [[3], [2]])


def test_a_spec_serialises_canonically_and_round_trips():
    a = LinearQuery.weighted("score", {"b": 2, "a": 0.5}, description="d")
    b = LinearQuery.weighted("score", {"a": 0.5, "b": 2.0}, description="d")
    assert a.to_json() == b.to_json()
    assert LinearQuery.from_json(a.to_json()) == a


@pytest.mark.parametrize("build, message", [
    (lambda: LinearQuery.columns("q", []), "at least one column"),
    (lambda: LinearQuery.columns("q", ["a", "a"]), "distinct"),
    (lambda: LinearQuery.histogram("q", "t", []), "at least one category"),
    (lambda: LinearQuery.histogram("q", "t", [1, 1]), "distinct"),
    (lambda: LinearQuery.histogram("q", "t", list(range(5000))), "at most 4096"),
    (lambda: LinearQuery.clamp("q", "m", 5, 5), "lo must be below hi"),
    (lambda: LinearQuery.clamp("q", "m", 0, float("inf")), "finite"),
    (lambda: LinearQuery.weighted("q", {"a": float("nan")}), "finite"),
    (lambda: LinearQuery.columns("bad[id]", ["a"]), "query_id"),
    (lambda: LinearQuery.columns(" padded", ["a"]), "query_id"),
    (lambda: LinearQuery.columns("q", ["a"], kind="hourly"), "kind"),
    (lambda: LinearQuery("q", {"type": "cube"}), "type"),
    (lambda: LinearQuery.from_json("{not json"), "not a query spec"),
])
def test_a_bad_spec_is_refused_with_a_message_naming_the_problem(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_query_on_an_unknown_column_is_refused():
    with pytest.raises(ValueError, match="unknown column"):
        LinearQuery.columns("q", ["nope"]).validate_against(["opened"])


def test_default_queries_exist_for_any_column_name():
    (query,) = default_queries(["Opened App (%)"])
    assert query.query_id == "sum:Opened App (%)"


def test_default_queries_are_the_per_column_sums_or_running_totals():
    assert [q.query_id for q in default_queries(["a", "b"])] == ["sum:a", "sum:b"]
    assert [(q.query_id, q.kind) for q in default_queries(["a"], kind="running")] == [("running:a", "running")]


# --- registry ----------------------------------------------------------------------------------


def _day(tmp_path, offset, users, opened, tier):
    path = tmp_path / f"day{offset}.parquet"
    pq.write_table(pa.table({
        "user_id": pa.array(users, type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=offset)] * len(users), type=pa.date32()),
        "opened": pa.array(opened, type=pa.float64()),
        "tier": pa.array(tier, type=pa.float64()),
    }), path)
    return str(path)


def _job(tmp_path, inputs, start, end):
    return JobConfig(inputs=tuple(inputs), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                     epsilon=1.0, delta=1e-6, norm_budget=10.0, start_window=W0 + start, end_window=W0 + end,
                     key_path=str(tmp_path / "k.key"), n_shards=2)


def test_registering_a_query_for_a_released_window_is_refused_and_changes_nothing(tmp_path):
    run_job(_job(tmp_path, [_day(tmp_path, 0, [1, 2], [1, 1], [0, 1])], 0, 1))
    with ReleaseStore(tmp_path / "s.duckdb") as store:
        before = store.read()
        registry = QueryRegistry(store)
        with pytest.raises(ValueError, match="after the last released window"):
            registry.add(LinearQuery.histogram("tiers", "tier", [0, 1]), effective_from=W0 + 1)
        with pytest.raises(ValueError, match="after the last released window"):
            registry.retire("sum:opened", from_window=W0 + 1)
        assert store.read().equals(before)
        assert [q for q in registry.list().column("query_id").to_pylist()] == ["sum:opened", "sum:tier"]


def test_a_query_registered_for_tomorrow_is_answered_from_tomorrow_and_charged_with_the_others(tmp_path):
    run_job(_job(tmp_path, [_day(tmp_path, 0, [1, 2], [1, 1], [0, 1])], 0, 0))
    with ReleaseStore(tmp_path / "s.duckdb") as store:
        QueryRegistry(store).add(LinearQuery.histogram("tiers", "tier", [0, 1]), effective_from=W0 + 1)
        QueryRegistry(store).retire("sum:tier", from_window=W0 + 1)
    run_job(_job(tmp_path, [_day(tmp_path, 1, [1, 2], [1, 0], [1, 1])], 1, 1))
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        table = store.read()
    by_window = {}
    for q, w in zip(table.column("query_id").to_pylist(), table.column("window_id").to_pylist()):
        by_window.setdefault(w - W0, set()).add(q)
    assert by_window == {0: {"sum:opened", "sum:tier"}, 1: {"sum:opened", "tiers"}}
    db = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    used = dict(db.execute("SELECT user_id, used FROM ledger").fetchall())
    db.close()
    # One charge per user and window for the concatenation of every active query's vector:
    # user 1: day 0 ||(1, 0)||^2 = 1, day 1 ||(1 | 0, 1)||^2 = 2; user 2: ||(1, 1)||^2 = 2, then
    # ||(0 | 0, 1)||^2 = 1. Both 3 / (2 s^2).
    s = calibrate(epsilon=1.0, delta=1e-6, norm_budget=10.0, accounting="gdp").noise_std
    assert used[1] == pytest.approx(3 / (2 * s * s), rel=1e-9)
    assert used[2] == pytest.approx(3 / (2 * s * s), rel=1e-9)


def test_a_registered_query_id_cannot_be_registered_twice(tmp_path):
    with ReleaseStore(tmp_path / "s.duckdb") as store:
        registry = QueryRegistry(store)
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
        with pytest.raises(ValueError, match="already registered"):
            registry.add(LinearQuery.columns("q", ["b"]), effective_from=6)


def test_the_plan_lists_queries_active_in_a_range_with_their_windows(tmp_path):
    with ReleaseStore(tmp_path / "s.duckdb") as store:
        registry = QueryRegistry(store)
        registry.add(LinearQuery.columns("a", ["x"]), effective_from=5)
        registry.add(LinearQuery.columns("b", ["x"]), effective_from=9)
        registry.retire("a", from_window=7)
        assert [(q.query_id, f, r) for q, f, r in registry.plan(5, 8)] == [("a", 5, 7)]
        assert [q.query_id for q in registry.active(9)] == ["b"]


def test_analyst_views_give_confidence_intervals_a_wide_table_and_the_catalogue(tmp_path):
    run_job(_job(tmp_path, [_day(tmp_path, 0, [1, 2], [1, 1], [0, 1])], 0, 1))
    db = connect_read_only(tmp_path / "s.duckdb")
    try:
        low, value, high, std = db.execute(
            "SELECT ci95_low, value, ci95_high, noise_std FROM releases_with_ci LIMIT 1").fetchone()
        assert high - value == pytest.approx(1.959964 * std) and value - low == pytest.approx(1.959964 * std)
        wide = db.execute("SELECT * FROM releases_wide").arrow()
        wide = wide.read_all() if hasattr(wide, "read_all") else wide
        assert wide.num_rows == 2 and {"sum:opened", "sum:tier"} <= set(wide.column_names)
        catalogue = db.execute("SELECT query_id, kind, dim FROM query_catalogue").fetchall()
        assert catalogue == [("sum:opened", "window", 1), ("sum:tier", "window", 1)]
    finally:
        db.close()


def test_a_version_1_store_migrates_to_the_registry_on_open(tmp_path):
    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    from queries.release_store import _MIGRATIONS

    db.execute("BEGIN")
    for statement in _MIGRATIONS[1]:
        db.execute(statement)
    db.execute("INSERT INTO store_meta VALUES ('schema_version', '1')")
    db.execute("COMMIT")
    db.close()
    with ReleaseStore(path) as store:
        assert store.schema_version() == 2
        assert QueryRegistry(store).list().num_rows == 0


# --- CLI ---------------------------------------------------------------------------------------


def test_query_add_list_retire_from_the_command_line(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--id", "tiers", "--histogram", "tier",
                 "--categories", "0,1,2", "--from", "2026-03-05", "--description", "users per tier"]) == 0
    assert main(["query", "add", "--store", store, "--id", "score", "--weighted", "opened=0.5,bought=2",
                 "--kind", "running", "--from", "2026-03-05"]) == 0
    assert main(["query", "retire", "--store", store, "--id", "tiers", "--from", "2026-03-09"]) == 0
    capsys.readouterr()
    assert main(["query", "list", "--store", store, "--format", "json"]) == 0
    listed = capsys.readouterr().out
    assert '"tiers"' in listed and '"score"' in listed and '"running"' in listed


@pytest.mark.parametrize("argv, parameter", [
    (["query", "add", "--id", "q", "--columns", "a", "--from", "2026-03-01"], "--store"),
    (["query", "add", "--store", "S", "--id", "bad[id]", "--columns", "a", "--from", "2026-03-01"], "query_id"),
    (["query", "add", "--store", "S", "--id", "q", "--clamp", "m", "--lo", "3", "--hi", "1", "--from", "2026-03-01"],
     "lo"),
    (["query", "add", "--store", "S", "--id", "q", "--columns", "a", "--from", "March"], "--from"),
    (["query", "add", "--store", "S", "--id", "q", "--weighted", "a=x", "--from", "2026-03-01"], "--weighted"),
    (["query", "add", "--store", "S", "--id", "q", "--from", "2026-03-01"], "--columns"),
])
def test_query_add_with_bad_parameters_exits_2_naming_the_parameter(tmp_path, capsys, argv, parameter):
    argv = [str(tmp_path / a) if a == "S" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert parameter in capsys.readouterr().err
