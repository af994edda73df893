"""Which input columns a run parses as numbers is decided from public information (the ledger's
declared input contract, issue 28; before it, the registered queries and the file's declared
types), never from the values (issue 18, item 8); and a running series survives a first day with
no valid rows (issue 18, item 7). End to end through the daily job on the Beam DirectRunner, with
real CSV, Parquet and DuckDB files."""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_store import ReleaseStore
from declared import contract

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days

# Each ledger's declared input (issue 28), given on its first run; later runs keep the recorded one.
OPENED = contract("int64", "opened=0:1")
OPENED_TIER = contract("int64", "opened=0:1", "tier=0:2")
CHURNED = contract("int64", "churned=0:1")


def _job(tmp_path, inputs, start, end, *, name="s", release="window", declared=None):
    return JobConfig(inputs=tuple(str(p) for p in inputs), store=str(tmp_path / f"{name}.duckdb"),
                     ledger=str(tmp_path / f"{name}.ledger.duckdb"), epsilon=1.0, delta=1e-6, norm_budget=10.0,
                     start_window=W0 + start, end_window=W0 + end, key_path=str(tmp_path / f"{name}.key"),
                     n_shards=2, release=release, contract=declared)


def _csv(tmp_path, name, header, rows):
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _released(config) -> set[tuple[str, int]]:
    with ReleaseStore(config.store, read_only=True) as store:
        return {(r["query_id"], r["window_id"]) for r in store.read().to_pylist()}


def _catalogue(config) -> list[str]:
    with QueryRegistry(config.store, read_only=True) as registry:
        return registry.list().column("query_id").to_pylist()


def _recorded_columns(config) -> dict:
    db = duckdb.connect(config.store, read_only=True)
    try:
        return json.loads(db.execute("SELECT value FROM store_meta WHERE key = 'input_columns'").fetchone()[0])
    finally:
        db.close()


def _dead(config) -> list[tuple[str, str]]:
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        return db.execute("SELECT reason, detail FROM dead_letters ORDER BY row_index").fetchall()
    finally:
        db.close()


def _balanced(summary) -> bool:
    return summary.rows_read == summary.admitted + summary.clipped + summary.dropped + summary.rejected + summary.late


# --- item 8: one bad value is a dead letter -----------------------------------------------------------


def test_one_unparseable_value_in_a_csvs_only_indicator_column_is_a_dead_letter_and_the_day_is_released(tmp_path):
    day = _csv(tmp_path, "day0.csv", "user_id,day,opened",
               ["1,2026-03-01,1", "2,2026-03-01,abc", "3,2026-03-01,0", "4,2026-03-01,1"])
    config = _job(tmp_path, [day], 0, 0, declared=OPENED)
    summary = run_job(config)
    assert (summary.rows_read, summary.admitted, summary.rejected) == (4, 3, 1) and _balanced(summary)
    assert _released(config) == {("sum:opened", W0)}
    [(reason, detail)] = _dead(config)
    assert reason == "wrong_type" and "'opened'" in detail and "abc" in detail


def test_a_registered_numeric_column_is_parsed_whatever_its_first_1024_values_are(tmp_path):
    first = tmp_path / "day0.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1], pa.int64()), "day": pa.array([DAY0], pa.date32()),
                             "opened": pa.array([1.0])}), first)
    run_job(_job(tmp_path, [first], 0, 0, declared=OPENED))  # registers sum:opened
    rows = [f"{i},2026-03-02,pending" for i in range(1, 1501)] + [f"{i},2026-03-02,1" for i in range(1501, 1601)]
    day1 = _csv(tmp_path, "day1.csv", "user_id,day,opened", rows)
    config = _job(tmp_path, [day1], 1, 1)
    summary = run_job(config)
    assert (summary.admitted, summary.rejected) == (100, 1500) and _balanced(summary)
    assert ("sum:opened", W0 + 1) in _released(config)
    assert {reason for reason, _ in _dead(config)} == {"wrong_type"}


def _two_days_differing_only_in_values(tmp_path):
    """Two CSV files with the same header and rows; the second's ``tier`` holds text in its first
    1,100 rows and one of its ``opened`` values is not a number."""
    users = range(1, 1201)
    plain = [f"{u},2026-03-01,{u % 2},{u % 3}" for u in users]
    texty = [f"{u},2026-03-01,{'x' if u == 7 else u % 2},{'gold' if u <= 1100 else u % 3}" for u in users]
    return (_csv(tmp_path, "plain.csv", "user_id,day,opened,tier", plain),
            _csv(tmp_path, "texty.csv", "user_id,day,opened,tier", texty))


def test_the_released_queries_and_the_published_columns_do_not_depend_on_a_csvs_values(tmp_path):
    plain, texty = _two_days_differing_only_in_values(tmp_path)
    a, b = (_job(tmp_path, [day], 0, 0, name=name, declared=OPENED_TIER) for day, name in ((plain, "a"), (texty, "b")))
    run_job(a)
    summary = run_job(b)
    assert _catalogue(a) == _catalogue(b) == ["sum:opened", "sum:tier"]
    assert _released(a) == _released(b) == {("sum:opened", W0), ("sum:tier", W0)}
    assert _recorded_columns(a) == _recorded_columns(b)  # the public store says nothing about the values
    assert summary.rejected == 1100 and _balanced(summary)


def test_a_numeric_query_over_a_csv_column_of_category_names_dead_letters_its_rows_naming_the_column(tmp_path):
    first = tmp_path / "day0.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2], pa.int64()), "day": pa.array([DAY0] * 2, pa.date32()),
                             "opened": pa.array([1.0, 1.0]), "tier": pa.array([0.0, 1.0])}), first)
    run_job(_job(tmp_path, [first], 0, 0, declared=OPENED_TIER))  # sum:tier reads tier as numbers
    # A CSV declares no types: its values are parsed row by row, the category names are that row's
    # dead letters, and user 3's number counts.
    day1 = _csv(tmp_path, "day1.csv", "user_id,day,opened,tier",
                ["1,2026-03-02,1,free", "2,2026-03-02,0,pro", "3,2026-03-02,1,1"])
    config = _job(tmp_path, [day1], 1, 1)
    summary = run_job(config)
    assert (summary.admitted, summary.rejected) == (1, 2) and _balanced(summary)
    assert {("sum:opened", W0 + 1), ("sum:tier", W0 + 1)} <= _released(config)
    assert [reason for reason, _ in _dead(config)] == ["wrong_type", "wrong_type"]
    assert all("'tier'" in detail for _, detail in _dead(config))  # the curator sees which column


def test_a_csv_column_no_registered_query_reads_may_later_get_a_numeric_or_a_category_query(tmp_path):
    store = tmp_path / "s.duckdb"
    with QueryRegistry(store) as registry:  # registered before the first run: the only query on day 0
        registry.add(LinearQuery.columns("sum:opened", ["opened"]), effective_from=W0)
    day = _csv(tmp_path, "day0.csv", "user_id,day,opened,plan,visits", ["1,2026-03-01,1,free,3", "2,2026-03-01,0,pro,1"])
    # plan a declared category and visits a declared number without a bound: neither gets a default query
    declared = contract("int64", "opened=0:1", "visits", categories=["plan"])
    summary = run_job(_job(tmp_path, [day], 0, 0, declared=declared))
    assert (summary.admitted, summary.rejected) == (2, 0)  # unread text columns reject nobody
    with QueryRegistry(store) as registry:
        registry.add(LinearQuery.histogram("plans", "plan", ["free", "pro"]), effective_from=W0 + 1)
        registry.add(LinearQuery.columns("sum:visits", ["visits"]), effective_from=W0 + 1)
    day1 = _csv(tmp_path, "day1.csv", "user_id,day,opened,plan,visits", ["1,2026-03-02,1,pro,2"])
    config = _job(tmp_path, [day1], 1, 1)
    summary = run_job(config)
    assert (summary.admitted, summary.rejected) == (1, 0)
    assert {("plans", W0 + 1), ("sum:visits", W0 + 1), ("sum:opened", W0 + 1)} <= _released(config)


def _as_before_contracts(config) -> None:
    """Leave ``config``'s ledger as a version from before input contracts recorded it: no declared
    columns in its ``meta`` (it goes on under the rule of :mod:`renyi_stream.stream.columns`)."""
    db = duckdb.connect(config.ledger)
    try:
        db.execute("DELETE FROM meta WHERE key = 'columns'")
    finally:
        db.close()


def test_a_numeric_query_over_a_column_a_parquet_file_declares_as_text_is_refused_before_anyone_is_charged(tmp_path):
    # On a ledger recorded before contracts, the file's declared types decide how a column is read.
    first = tmp_path / "day0.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2], pa.int64()), "day": pa.array([DAY0] * 2, pa.date32()),
                             "opened": pa.array([1.0, 1.0]), "tier": pa.array([0.0, 1.0])}), first)
    run_job(_job(tmp_path, [first], 0, 0, declared=OPENED_TIER))
    _as_before_contracts(_job(tmp_path, [first], 0, 0))
    day1 = tmp_path / "day1.parquet"  # numbers written as text: the file declares tier a string column
    pq.write_table(pa.table({"user_id": pa.array([1, 2], pa.int64()), "day": pa.array([DAY0 + dt.timedelta(1)] * 2,
                                                                                       pa.date32()),
                             "opened": pa.array([1.0, 0.0]), "tier": pa.array(["0", "1"])}), day1)
    with pytest.raises(ValueError, match="needs column 'tier' to be a numeric column"):
        run_job(_job(tmp_path, [day1], 1, 1))
    db = duckdb.connect(str(tmp_path / "s.ledger.duckdb"), read_only=True)
    assert db.execute("SELECT count(*) FROM processed_windows WHERE window_id = ?", [W0 + 1]).fetchone() == (0,)


def test_a_declared_number_column_a_parquet_file_writes_as_text_is_read_by_the_declaration_row_by_row(tmp_path):
    # Under a contract the writer's type decides nothing: the declared number column is parsed in
    # each row, and only the row whose value is not a number is a dead letter.
    first = tmp_path / "day0.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2], pa.int64()), "day": pa.array([DAY0] * 2, pa.date32()),
                             "opened": pa.array([1.0, 1.0]), "tier": pa.array([0.0, 1.0])}), first)
    run_job(_job(tmp_path, [first], 0, 0, declared=OPENED_TIER))
    day1 = tmp_path / "day1.parquet"  # the file declares tier a string column
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 3], pa.int64()),
                             "day": pa.array([DAY0 + dt.timedelta(1)] * 3, pa.date32()),
                             "opened": pa.array([1.0, 0.0, 1.0]), "tier": pa.array(["0", "1", "gold"])}), day1)
    config = _job(tmp_path, [day1], 1, 1)
    summary = run_job(config)
    assert (summary.admitted, summary.rejected) == (2, 1) and _balanced(summary)
    assert {("sum:opened", W0 + 1), ("sum:tier", W0 + 1)} <= _released(config)
    [(reason, detail)] = _dead(config)
    assert reason == "wrong_type" and "'tier'" in detail and "gold" in detail


def test_the_column_rule_reads_the_declared_types_and_the_queries_never_the_values():
    from renyi_stream.stream.columns import InputColumns, default_columns, input_columns

    parquet = pa.schema([("user_id", pa.int64()), ("day", pa.date32()), ("opened", pa.float64()),
                         ("n", pa.int32()), ("plan", pa.string()), ("at", pa.timestamp("s"))])
    csv = pa.schema([("user_id", pa.int64()), ("day", pa.string()), ("opened", pa.string()), ("plan", pa.string())])
    assert default_columns(parquet, declared_types=True) == ["opened", "n"]
    assert default_columns(csv, declared_types=False) == ["opened", "plan"]
    assert input_columns(parquet, declared_types=True, numeric_reads={"opened"}, category_reads={"plan"}) == \
        InputColumns(numeric=("opened", "n"), strings=("plan",), undeclared=())
    assert input_columns(csv, declared_types=False, numeric_reads={"opened"}, category_reads=set()) == \
        InputColumns(numeric=("opened",), strings=(), undeclared=("plan",))


# --- item 7: a running series survives an empty first day ------------------------------------------------


def _churn_parquet(tmp_path, name, day, users, churned):
    path = tmp_path / name
    pq.write_table(pa.table({"user_id": pa.array(users, pa.int64()), "day": pa.array([day] * len(users), pa.date32()),
                             "churned": pa.array(churned, pa.float64())}), path)
    return path


def _empty_first_day(tmp_path, kind):
    if kind == "parquet_with_zero_rows":
        return _churn_parquet(tmp_path, "day0.parquet", DAY0, [], [])
    if kind == "csv_with_a_header_only":
        return _csv(tmp_path, "day0.csv", "user_id,day,churned", [])
    if kind == "csv_of_malformed_rows":
        return _csv(tmp_path, "day0.csv", "user_id,day,churned", ["1,2026-03-01,abc", "2,not-a-day,1", ",2026-03-01,1"])
    raise AssertionError(kind)


# Every row of the first day malformed was refused as an "idle run" (issue 31), until that rule was
# seen to make the day's release one user's bit (issue 37): the file names the day, so its day is
# released like a day whose file has no rows, its rows dead-lettered.
@pytest.mark.parametrize("kind", ["parquet_with_zero_rows", "csv_with_a_header_only", "csv_of_malformed_rows"])
def test_a_running_series_whose_first_day_has_no_valid_rows_is_released_the_next_day(tmp_path, kind):
    first = run_job(_job(tmp_path, [_empty_first_day(tmp_path, kind)], 0, 0, release="running", declared=CHURNED))
    assert first.admitted == 0 and _balanced(first)
    day1 = _churn_parquet(tmp_path, "day1.parquet", DAY0 + dt.timedelta(1), [1, 2, 3], [1.0, 0.0, 1.0])
    config = _job(tmp_path, [day1], 1, 1, release="running")
    second = run_job(config)
    assert second.windows_released == [W0 + 1] and second.admitted == 3
    assert _released(config) == {("running:churned", W0), ("running:churned", W0 + 1)}


def test_a_running_series_declared_from_before_its_first_files_day_continues_the_next_day(tmp_path):
    empty = _churn_parquet(tmp_path, "day0.parquet", DAY0, [], [])
    first = run_job(_job(tmp_path, [empty], -2, 0, release="running", declared=CHURNED))  # --start before the file
    assert first.windows_released == [W0 - 2, W0 - 1, W0]
    day1 = _churn_parquet(tmp_path, "day1.parquet", DAY0 + dt.timedelta(1), [1, 2], [1.0, 1.0])
    config = _job(tmp_path, [day1], 1, 1, release="running")
    run_job(config)
    assert _released(config) == {("running:churned", w) for w in range(W0 - 2, W0 + 2)}
    with QueryRegistry(config.store, read_only=True) as registry:
        assert registry.list().column("effective_from").to_pylist() == [W0 - 2]  # the declared start, public
