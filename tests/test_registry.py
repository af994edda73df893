"""The query registry in the release store (issue 4): registering, retiring, planning, the
analysts' views, the schema migration and `renyi-stream query`. Specs: tests/test_linear_queries.py."""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_store import _MIGRATIONS, RELEASE_SCHEMA, ReleaseStore, ReleaseStoreError, connect_read_only
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.accounting.gaussian import MAX_DIM
from declared import contract

# The ledgers' declared input (issue 28): 0/1 indicators, whose clamped sums are their plain sums.
DECLARED = contract("int64", "opened=0:1", "tier=0:1")

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


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


def _job(tmp_path, inputs, start, end, declared=DECLARED):
    return JobConfig(inputs=tuple(inputs), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                     epsilon=1.0, delta=1e-6, norm_budget=10.0, start_window=W0 + start, end_window=W0 + end,
                     key_path=str(tmp_path / "k.key"), n_shards=2, contract=declared)


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


def _publish(path, query_id, windows, labels=("a",), kind="window"):
    """Release ``query_id`` for ``windows`` by hand (value = 10 * window + coordinate, std 2)."""
    start = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    rows = [{"query_id": query_id, "window_id": w, "window_start": start + dt.timedelta(days=w),
             "window_end": start + dt.timedelta(days=w + 1), "label": label, "coordinate": j,
             "value": 10.0 * w + j, "noise_std": 2.0, "kind": kind, "accounting": "gdp",
             "mechanism": "gaussian", "key_fingerprint": "0" * 16}
            for w in windows for j, label in enumerate(labels)]
    with ReleaseStore(path) as store:
        store.publish(pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA))


def test_a_registry_opened_on_a_path_opens_and_closes_its_own_store(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
    with QueryRegistry(tmp_path / "s.duckdb", read_only=True) as registry:  # the file is free again
        assert registry.get("q") == LinearQuery.columns("q", ["a"])


def test_a_registry_on_a_store_leaves_the_store_open(tmp_path):
    with ReleaseStore(tmp_path / "s.duckdb") as store:
        with QueryRegistry(store) as registry:
            registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
        assert store.schema_version() == 2


def test_a_query_takes_effect_only_after_the_last_window_released_for_any_query(tmp_path):
    path = tmp_path / "s.duckdb"
    _publish(path, "sum:a", [3, 4])
    with QueryRegistry(path) as registry:
        for window in (2, 4):
            with pytest.raises(ValueError, match="effective_from must be after the last released window 4"):
                registry.add(LinearQuery.columns("new", ["a"]), effective_from=window)
        registry.add(LinearQuery.columns("new", ["a"]), effective_from=5)
        assert registry.last_released_window() == 4


def test_registering_and_retiring_leave_every_released_row_unchanged(tmp_path):
    path = tmp_path / "s.duckdb"
    _publish(path, "sum:a", [3, 4])
    with ReleaseStore(path) as store:
        before = store.read()
        registry = QueryRegistry(store)
        registry.add(LinearQuery.columns("sum:a", ["a"]), effective_from=5)
        registry.add(LinearQuery.histogram("tiers", "tier", [0, 1]), effective_from=5)
        registry.retire("sum:a", from_window=7)
        assert store.read().equals(before)


def test_a_refused_registration_changes_nothing(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
        before = registry.list()
        with pytest.raises(ValueError):
            registry.add(LinearQuery.columns("q", ["b"]), effective_from=6)
        assert registry.list().equals(before)


def test_a_retired_id_stays_taken(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
        registry.retire("q", from_window=8)
        with pytest.raises(ValueError, match="already registered"):
            registry.add(LinearQuery.columns("q", ["a"]), effective_from=9)


def test_retiring_before_the_last_released_window_is_refused(tmp_path):
    path = tmp_path / "s.duckdb"
    with QueryRegistry(path) as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=3)
    _publish(path, "q", [3, 4])
    with QueryRegistry(path) as registry:
        with pytest.raises(ValueError, match="from_window must be after the last released window 4"):
            registry.retire("q", from_window=4)
        registry.retire("q", from_window=5)
        assert registry.plan(3, 10)[0][1:] == (3, 5)


@pytest.mark.parametrize("query_id, window, message", [
    ("nope", 9, "not registered"),
    ("q", 4, "the query's first window 5 \\(to withdraw it\\) or after it"),
])
def test_a_bad_retirement_is_refused(tmp_path, query_id, window, message):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
        with pytest.raises(ValueError, match=message):
            registry.retire(query_id, from_window=window)


def test_retiring_a_never_answered_query_from_its_first_window_withdraws_it_from_every_window(tmp_path):
    # A typo in a query's column blocked its first window's run, and retiring it from the next
    # window left it active on that one: a mistake had no way out but a new store (issue 31).
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.clamp("minutes", "minute", 0, 60), effective_from=5)
        assert registry.retire("minutes", from_window=5) is True
        assert registry.plan(0, 100) == []
        registry.add(LinearQuery.clamp("minutes_0_60", "minutes", 0, 60), effective_from=5)
        assert [q.query_id for q, _, _ in registry.plan(5, 5)] == ["minutes_0_60"]


def test_a_withdrawn_querys_id_stays_taken_so_a_pending_answer_keeps_its_meaning(tmp_path):
    # An answer charged but not yet published (the outbox) is published under its id later:
    # freeing the id let a new query change that series' meaning (the attacker's second review).
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["opened"]), effective_from=5)
        registry.retire("q", from_window=5)
        with pytest.raises(ValueError, match="already registered"):
            registry.add(LinearQuery.weighted("q", {"opened": -1.0}), effective_from=5)


def test_a_query_answered_in_its_first_window_is_never_withdrawn(tmp_path):
    path = tmp_path / "s.duckdb"
    with QueryRegistry(path) as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=3)
    _publish(path, "q", [3])
    with QueryRegistry(path) as registry:
        with pytest.raises(ValueError, match="after the last released window 3"):
            registry.retire("q", from_window=3)
        assert registry.list().column("query_id").to_pylist() == ["q"]


def test_a_parquet_catalogue_withdraws_a_never_answered_query_from_its_first_window(tmp_path):
    from renyi_stream.queries.catalogue import ReleaseCatalogue

    catalogue = ReleaseCatalogue(str(tmp_path / "public"))
    catalogue.add(LinearQuery.clamp("minutes", "minute", 0, 60), effective_from=5)
    assert catalogue.retire("minutes", from_window=5) is True
    assert catalogue.plan(0, 100) == []
    with pytest.raises(ValueError, match="already registered"):
        catalogue.add(LinearQuery.clamp("minutes", "minutes", 0, 60), effective_from=5)
    catalogue.add(LinearQuery.clamp("minutes_0_60", "minutes", 0, 60), effective_from=5)
    assert catalogue.retire("minutes_0_60", from_window=7) is False
    assert [(r.query_id, r.effective_from, r.retired_from) for r in catalogue.registrations()] == [
        ("minutes", 5, 5), ("minutes_0_60", 5, 7)]


def test_query_retire_from_the_first_window_says_the_query_was_withdrawn(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--create", "--id", "m", "--clamp", "minute", "--lo", "0",
                 "--hi", "60", "--from", "2026-03-05"]) == 0
    assert main(["query", "retire", "--store", store, "--id", "m", "--from", "2026-03-05"]) == 0
    assert "withdrew m: it was never answered in public" in capsys.readouterr().out


def test_a_query_is_retired_once(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
        registry.retire("q", from_window=8)
        with pytest.raises(ValueError, match="already retired from window 8"):
            registry.retire("q", from_window=9)


def test_active_lists_the_queries_whose_windows_contain_it_by_query_id(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("z", ["a"]), effective_from=5)
        registry.add(LinearQuery.columns("b", ["a"]), effective_from=5)
        registry.add(LinearQuery.columns("m", ["a"]), effective_from=6)
        registry.retire("z", from_window=7)
        assert {w: [q.query_id for q in registry.active(w)] for w in range(4, 9)} == {
            4: [], 5: ["b", "z"], 6: ["b", "m", "z"], 7: ["b", "m"], 8: ["b", "m"]}


def test_a_plan_with_its_start_after_its_end_is_refused(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry, pytest.raises(ValueError, match="start_window must be"):
        registry.plan(6, 5)


@pytest.mark.parametrize("window", [5.0, "5", True, None])
def test_a_window_id_that_is_not_an_integer_is_refused(tmp_path, window):
    with QueryRegistry(tmp_path / "s.duckdb") as registry, pytest.raises(ValueError, match="effective_from must be an integer"):
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=window)


def test_queries_answered_together_may_not_exceed_max_dim_coordinates(tmp_path):
    half = LinearQuery.histogram("h1", "t", list(range(MAX_DIM // 2)))
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(half, effective_from=5)
        registry.add(LinearQuery.histogram("h2", "t", list(range(MAX_DIM // 2))), effective_from=9)
        with pytest.raises(ValueError, match=f"window 9 {MAX_DIM + 1} coordinates together"):
            registry.add(LinearQuery.columns("one_more", ["a"]), effective_from=6)
        registry.retire("h1", from_window=9)
        registry.add(LinearQuery.columns("one_more", ["a"]), effective_from=6)  # h1 and h2 never overlap now


def test_a_read_only_store_refuses_changes_and_changes_nothing(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("q", ["a"]), effective_from=5)
    with QueryRegistry(tmp_path / "s.duckdb", read_only=True) as registry:
        with pytest.raises(ReleaseStoreError, match="cannot change the query registry"):
            registry.add(LinearQuery.columns("r", ["a"]), effective_from=6)
        assert registry.list().column("query_id").to_pylist() == ["q"]


def test_the_wide_view_has_one_column_per_query_coordinate_holding_the_released_values(tmp_path):
    path = tmp_path / "s.duckdb"
    with QueryRegistry(path) as registry:
        registry.add(LinearQuery.columns("sum:a", ["a"]), effective_from=3)
        registry.add(LinearQuery.histogram("tiers", "tier", [0, 1]), effective_from=4)
    _publish(path, "sum:a", [3, 4])
    _publish(path, "tiers", [4], labels=("tier=0", "tier=1"))
    db = connect_read_only(path)
    try:
        rows = db.execute("SELECT * FROM releases_wide").fetchall()
        names = [d[0] for d in db.description]
    finally:
        db.close()
    assert names == ["window_id", "window_start", "window_end", "sum:a", "tiers[tier=0]", "tiers[tier=1]"]
    assert [(r[0], *r[3:]) for r in rows] == [(3, 30.0, None, None), (4, 40.0, 40.0, 41.0)]


def test_the_views_are_there_for_a_store_opened_read_only(tmp_path):
    path = tmp_path / "s.duckdb"
    with QueryRegistry(path) as registry:
        registry.add(LinearQuery.columns("sum:a", ["a"]), effective_from=3)
    _publish(path, "sum:a", [3])
    with ReleaseStore(path, read_only=True) as store:
        db = store._conn
        assert db.execute("SELECT ci95_low, ci95_high FROM releases_with_ci").fetchall() == [
            (pytest.approx(30 - 1.959964 * 2), pytest.approx(30 + 1.959964 * 2))]
        assert db.execute('SELECT "sum:a" FROM releases_wide').fetchall() == [(30.0,)]
        assert db.execute("SELECT query_id, dim, effective_from FROM query_catalogue").fetchall() == [("sum:a", 1, 3)]


def test_a_plain_duckdb_client_reads_the_views(tmp_path):
    path = tmp_path / "s.duckdb"
    with QueryRegistry(path) as registry:
        registry.add(LinearQuery.columns("sum:a", ["a"]), effective_from=3)
    _publish(path, "sum:a", [3])
    db = duckdb.connect(str(path), read_only=True)
    try:
        assert db.execute('SELECT window_id, "sum:a" FROM releases_wide').fetchall() == [(3, 30.0)]
        assert db.execute("SELECT count(*) FROM releases_with_ci").fetchone() == (1,)
    finally:
        db.close()


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


def _version_1_store(path, windows=()):
    db = duckdb.connect(str(path))
    db.execute("BEGIN")
    for statement in _MIGRATIONS[1]:
        db.execute(statement)
    db.execute("INSERT INTO store_meta VALUES ('schema_version', '1')")
    for w in windows:
        db.execute("INSERT INTO release_data (query_id, window_id, window_start, window_end, label, coordinate, value, "
                   "noise_std, kind, accounting, mechanism, key_fingerprint) VALUES ('sum:a', ?, to_timestamp(?), "
                   "to_timestamp(?), 'a', 0, 1.5, 2.0, 'window', 'gdp', 'gaussian', '0000000000000000')",
                   [w, 86400 * w, 86400 * (w + 1)])
    db.execute("COMMIT")
    db.close()


def test_a_version_1_store_migrates_to_the_registry_on_open(tmp_path):
    path = tmp_path / "old.duckdb"
    _version_1_store(path)
    with ReleaseStore(path) as store:
        assert store.schema_version() == 2
        assert QueryRegistry(store).list().num_rows == 0


def test_migrating_keeps_the_released_rows_and_adds_the_views(tmp_path):
    path = tmp_path / "old.duckdb"
    _version_1_store(path, windows=[3, 4])
    with ReleaseStore(path) as store:
        assert store.read().column("window_id").to_pylist() == [3, 4]
        assert store._conn.execute("SELECT count(*) FROM releases_with_ci").fetchone() == (2,)
        with pytest.raises(ValueError, match="after the last released window 4"):
            QueryRegistry(store).add(LinearQuery.columns("q", ["a"]), effective_from=4)


def test_a_version_1_store_opened_read_only_asks_for_the_migration(tmp_path):
    path = tmp_path / "old.duckdb"
    _version_1_store(path)
    with pytest.raises(ReleaseStoreError, match="needs a migration to 2"):
        ReleaseStore(path, read_only=True)
    with pytest.raises(ReleaseStoreError, match="open it read-write once to migrate"):
        connect_read_only(path)


# --- CLI ---------------------------------------------------------------------------------------


def test_query_add_list_retire_from_the_command_line(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--create", "--id", "tiers", "--histogram", "tier",
                 "--categories", "0,1,2", "--from", "2026-03-05", "--description", "users per tier"]) == 0
    assert main(["query", "add", "--store", store, "--id", "score", "--weighted", "opened=0.5,bought=2",
                 "--kind", "running", "--from", "2026-03-05"]) == 0
    assert main(["query", "retire", "--store", store, "--id", "tiers", "--from", "2026-03-09"]) == 0
    capsys.readouterr()
    assert main(["query", "list", "--store", store, "--format", "json"]) == 0
    listed = capsys.readouterr().out
    assert '"tiers"' in listed and '"score"' in listed and '"running"' in listed


def test_query_list_shows_each_window_as_the_date_it_starts(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--create", "--id", "q", "--columns", "a", "--from",
                 "2026-03-05"]) == 0
    assert main(["query", "retire", "--store", store, "--id", "q", "--from", "2026-03-09"]) == 0
    capsys.readouterr()
    assert main(["query", "list", "--store", store]) == 0
    first = (dt.date(2026, 3, 5) - dt.date(1970, 1, 1)).days
    assert f"from 2026-03-05 (window {first}), retired from 2026-03-09 (window {first + 4})" in capsys.readouterr().out


@pytest.mark.parametrize("argv, parameter", [
    (["query", "add", "--id", "q", "--columns", "a", "--from", "2026-03-01"], "--store"),
    (["query", "add", "--store", "S", "--id", "bad[1]", "--columns", "a", "--from", "2026-03-01"], "query_id"),
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


def test_query_add_takes_string_categories_for_a_string_column(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--create", "--id", "plans", "--histogram", "plan",
                 "--categories", "free,pro", "--from", "5"]) == 0
    with QueryRegistry(store, read_only=True) as registry:
        assert registry.get("plans").labels == ("plan=free", "plan=pro")


def test_query_add_for_a_released_window_exits_2_naming_from(tmp_path, capsys):
    store = tmp_path / "s.duckdb"
    _publish(store, "sum:a", [3, 4])
    with pytest.raises(SystemExit) as exit_info:
        main(["query", "add", "--store", str(store), "--id", "q", "--columns", "a", "--from", "4"])
    assert exit_info.value.code == 2
    assert "--from must be after the last released window 4" in capsys.readouterr().err


MARCH_4 = (dt.date(2026, 3, 4) - dt.date(1970, 1, 1)).days  # window ids: days since 1970-01-01


def _refusal(argv: list[str], capsys) -> tuple[object, str]:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("where", ["--store", "--releases-parquet"])
def test_query_add_before_the_last_released_window_names_both_windows_dates(tmp_path, capsys, where):
    target = tmp_path / ("s.duckdb" if where == "--store" else "public")
    if where == "--store":
        _publish(target, "sum:a", [MARCH_4 - 1, MARCH_4])
    else:
        from renyi_stream.queries.release_files import write_release_file

        _publish(tmp_path / "rows.duckdb", "sum:a", [MARCH_4])
        with ReleaseStore(tmp_path / "rows.duckdb", read_only=True) as store:  # a released window of the root
            write_release_file(str(target), MARCH_4, store.read().drop_columns(["released_at"]).cast(RELEASE_SCHEMA))
    status, err = _refusal(["query", "add", where, str(target), "--id", "q", "--columns", "a", "--from",
                            str(MARCH_4 - 1)], capsys)
    assert status == 2
    assert f"last released window {MARCH_4} (2026-03-04)" in err and f"window {MARCH_4 - 1} (2026-03-03)" in err


def test_query_retire_errors_name_each_windows_date(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--create", "--id", "q", "--columns", "a", "--from",
                 "2026-03-05"]) == 0
    status, err = _refusal(["query", "retire", "--store", store, "--id", "q", "--from", "2026-03-04"], capsys)
    assert status == 2 and f"window {MARCH_4 + 1} (2026-03-05)" in err and f"={MARCH_4} (2026-03-04)" in err
    assert main(["query", "retire", "--store", store, "--id", "q", "--from", "2026-03-07"]) == 0
    assert f"retired q from window {MARCH_4 + 3} (2026-03-07)" in capsys.readouterr().out
    status, err = _refusal(["query", "retire", "--store", store, "--id", "q", "--from", "2026-03-09"], capsys)
    assert status == 2 and f"already retired from window {MARCH_4 + 3} (2026-03-07)" in err


def test_query_add_says_the_date_of_the_window_it_registers_from(tmp_path, capsys):
    assert main(["query", "add", "--store", str(tmp_path / "s.duckdb"), "--create", "--id", "q", "--columns", "a",
                 "--from", str(MARCH_4)]) == 0
    assert f"from window {MARCH_4} (2026-03-04)" in capsys.readouterr().out


@pytest.mark.parametrize("action", [["list"], ["retire", "--id", "q", "--from", "9"]])
def test_query_list_and_retire_on_a_missing_store_exit_1_and_create_nothing(tmp_path, capsys, action):
    store = tmp_path / "none.duckdb"
    assert main(["query", action[0], "--store", str(store), *action[1:]]) == 1
    assert "does not exist" in capsys.readouterr().err and not store.exists()


def test_a_query_reading_a_column_the_daily_input_lacks_is_refused_at_registration(tmp_path):
    from renyi_stream.queries.release_store import ReleaseStore

    with ReleaseStore(tmp_path / "s.duckdb") as store:
        store.record_input_columns(["opened", "bought"], ["tier"])  # as the daily job does on every run
        registry = QueryRegistry(store)
        with pytest.raises(ValueError, match="unknown column"):
            registry.add(LinearQuery.columns("typo", ["opend"]), effective_from=5)
        with pytest.raises(ValueError, match="string column"):
            registry.add(LinearQuery.histogram("tiers", "opened", ["free", "pro"]), effective_from=5)
        with pytest.raises(ValueError, match="numeric column"):
            registry.add(LinearQuery.columns("sum:tier", ["tier"]), effective_from=5)
        registry.add(LinearQuery.columns("ok", ["opened"]), effective_from=5)
        registry.add(LinearQuery.histogram("tiers", "tier", ["free", "pro"]), effective_from=5)
        assert registry.list().column("query_id").to_pylist() == ["ok", "tiers"]


def _day_with_plan(tmp_path, offset, users, opened, plan):
    path = tmp_path / f"plan-day{offset}.parquet"
    pq.write_table(pa.table({
        "user_id": pa.array(users, type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=offset)] * len(users), type=pa.date32()),
        "opened": pa.array(opened, type=pa.float64()),
        "plan": pa.array(plan, type=pa.string()),
    }), path)
    return str(path)


def test_a_histogram_over_a_string_column_of_the_input_is_answered_end_to_end(tmp_path):
    from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise

    day0 = _day_with_plan(tmp_path, 0, [1, 2, 3], [1, 1, 0], ["free", "pro", "free"])
    plans = contract("int64", "opened=0:1", categories=["plan"])
    run_job(_job(tmp_path, [day0], 0, 0, plans))  # the string column is not an indicator: sum:opened only
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        assert registry.list().column("query_id").to_pylist() == ["sum:opened"]
        registry.add(LinearQuery.histogram("plans", "plan", ["free", "pro"]), effective_from=W0 + 1)
    # Four users; one has a plan outside the list and one a null plan: both count in no bucket.
    day1 = _day_with_plan(tmp_path, 1, [1, 2, 3, 4, 5], [1, 0, 1, 1, 0], ["pro", "pro", "free", "team", None])
    summary = run_job(_job(tmp_path, [day1], 1, 1, plans))
    assert summary.rejected == 0 and summary.admitted == 5
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        rows = [r for r in store.read().to_pylist() if r["query_id"] == "plans"]
        params = json.loads(json.dumps(store.promise()))
        ledger_id = store.ledger_id()  # the ledger that charged for the releases: the noise is bound to it
    key = NoiseBinding(NoiseKey.load(tmp_path / "k.key"), ledger_id)
    noise_std = rows[0]["noise_std"]
    noise = gaussian_noise(key, query_id="plans", window_id=W0 + 1, dim=2, noise_std=noise_std)
    assert [r["label"] for r in rows] == ["plan=free", "plan=pro"] and params
    assert [r["value"] - z for r, z in zip(rows, noise)] == pytest.approx([1.0, 2.0], abs=1e-9)


def test_a_csv_day_whose_numeric_column_reads_as_text_dead_letters_the_bad_row_not_the_run(tmp_path):
    day0 = _day(tmp_path, 0, [1, 2], [1, 1], [0, 1])
    run_job(_job(tmp_path, [day0], 0, 0))  # registers sum:opened and sum:tier
    csv = tmp_path / "day1.csv"  # one unparseable value in a declared number column (a CSV declares no types)
    csv.write_text("user_id,day,opened,tier\n1,2026-03-02,1,0\n2,2026-03-02,abc,1\n3,2026-03-02,1,1\n")
    summary = run_job(_job(tmp_path, [str(csv)], 1, 1))
    assert (summary.admitted, summary.rejected) == (2, 1)
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        windows = {(r["query_id"], r["window_id"]) for r in store.read().to_pylist()}
        assert {("sum:opened", W0 + 1), ("sum:tier", W0 + 1)} <= windows
        assert "opened" in store.input_schema().names and store.input_schema().field("opened").type == pa.float64()
    db = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    assert db.execute("SELECT reason FROM dead_letters").fetchall() == [("wrong_type",)]
