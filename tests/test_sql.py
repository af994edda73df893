"""renyi-stream sql: analysts read the release store; writes, files, ATTACH and extensions fail."""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.queries.release_store import RELEASE_SCHEMA, ReleaseStore, connect_read_only
from renyi_stream.queries.sql import SqlRefused, run_sql


@pytest.fixture
def store(tmp_path):
    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    rows = [{"query_id": "sum:a", "window_id": w, "window_start": start + dt.timedelta(days=w),
             "window_end": start + dt.timedelta(days=w + 1), "label": "a", "coordinate": 0,
             "value": 10.0 + w, "noise_std": 2.0, "kind": "window", "accounting": "gdp",
             "mechanism": "gaussian", "key_fingerprint": "0" * 16} for w in range(3)]
    path = tmp_path / "releases.duckdb"
    with ReleaseStore(path) as s:
        s.publish(pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA))
    ledger = duckdb.connect(str(tmp_path / "ledger.duckdb"))  # a curator database beside it
    ledger.execute("CREATE TABLE ledger AS SELECT 1 AS user_id, 0.5 AS used")
    ledger.close()
    return path


def test_select_returns_the_released_rows(store):
    table = run_sql(store, "SELECT window_id, value FROM releases ORDER BY window_id")
    assert table.to_pylist() == [{"window_id": w, "value": 10.0 + w} for w in range(3)]


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_cli_prints_each_text_format(store, capsys, fmt):
    assert main(["sql", "SELECT window_id, value FROM releases ORDER BY 1", "--store", str(store),
                 "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert [json.loads(line)["value"] for line in out.splitlines()] == [10.0, 11.0, 12.0]
    else:
        assert "window_id" in out and "12" in out


def test_cli_writes_parquet_from_python_not_from_sql(store, tmp_path, capsys):
    out = tmp_path / "result.parquet"
    assert main(["sql", "SELECT * FROM releases", "--store", str(store), "--format", "parquet",
                 "--out", str(out)]) == 0
    assert pq.read_table(out).num_rows == 3


def test_parquet_output_needs_a_file(store, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sql", "SELECT 1", "--store", str(store), "--format", "parquet"])
    assert exit_info.value.code == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("statement", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "COPY releases TO '{tmp}/leak.csv'",
    "ATTACH '{tmp}/ledger.duckdb' AS curator",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "CREATE TABLE notes (x INTEGER)",
    "INSERT INTO release_data SELECT * FROM release_data",
])
def test_statements_that_escape_the_store_are_refused(store, tmp_path, statement):
    with pytest.raises(SqlRefused, match="read-only with external access disabled"):
        run_sql(store, statement.format(tmp=tmp_path))
    assert not (tmp_path / "leak.csv").exists()


@pytest.mark.parametrize("statement", [
    "SELECT * FROM read_csv('/etc/passwd')", "COPY releases TO '{tmp}/leak.csv'", "ATTACH '{tmp}/l.duckdb' AS c",
    "INSTALL httpfs", "LOAD httpfs", "SET enable_external_access = true", "CREATE TABLE notes (x INTEGER)",
    "INSERT INTO release_data SELECT * FROM release_data", "DELETE FROM release_data", "DROP VIEW releases",
])
def test_the_connection_itself_refuses_what_escapes_the_store(store, tmp_path, statement):
    # The plain-words refusal before a statement runs is a courtesy: the read-only, locked
    # connection is what keeps the store and the machine safe, whatever the statement parses as.
    db = connect_read_only(store)
    try:
        with pytest.raises(duckdb.Error):
            db.execute(statement.format(tmp=tmp_path))
    finally:
        db.close()
    assert not (tmp_path / "leak.csv").exists()


@pytest.mark.parametrize("statement", ["DELETE FROM releases", "UPDATE releases SET value = 0",
                                       "INSERT INTO releases SELECT * FROM releases"])
def test_a_write_to_a_view_is_refused_in_plain_words_not_with_a_binder_error(store, statement):
    with pytest.raises(SqlRefused, match=r"read-only with external access disabled.*is not a read"):
        run_sql(store, statement)


def test_a_refused_statement_exits_non_zero_with_the_reason(store, capsys):
    assert main(["sql", "SELECT * FROM read_csv('/etc/passwd')", "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert "external access disabled" in err and "/etc/passwd" in err


def test_a_syntax_error_exits_non_zero_with_duckdbs_message(store, capsys):
    assert main(["sql", "SELEC 1", "--store", str(store)]) == 1
    assert "syntax error" in capsys.readouterr().err


def test_a_missing_store_exits_non_zero_naming_it(tmp_path, capsys):
    assert main(["sql", "SELECT 1", "--store", str(tmp_path / "nope.duckdb")]) == 1
    assert "nope.duckdb" in capsys.readouterr().err
