"""The features job under a declared input contract (issue 28): the features, and so the trained
model's shape, come from the declaration, never from what one user's value made a writer type."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main

DAY0 = dt.date(2026, 3, 1)


def _day(offset: int) -> str:
    return (DAY0 + dt.timedelta(days=offset)).isoformat()


def _file(path, rows: list[dict]) -> str:
    # from_pylist types a column from its values: all missing makes it type null.
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _inputs(tmp_path, name: str, y_value) -> list[str]:
    rows0 = [{"user_id": 1, "day": DAY0, "x": 1.0, "y": None}, {"user_id": 2, "day": DAY0, "x": 0.0, "y": y_value}]
    rows1 = [{"user_id": 1, "day": DAY0 + dt.timedelta(days=3), "x": 1.0, "y": None}]
    return [_file(tmp_path / f"{name}0.parquet", rows0), _file(tmp_path / f"{name}1.parquet", rows1)]


def _features(inputs, out, *declare: str) -> int:
    return main(["features", "--input", *inputs, "--out", str(out), "--start", _day(0), "--end", _day(1),
                 "--label-column", "x", "--label-start", _day(2), "--label-end", _day(4), *declare])


def test_the_features_follow_the_declaration_not_one_users_value(tmp_path):
    # Undeclared, the loud file's y (typed double by its writer) added y's features and made user 1,
    # whose y is missing, a dead letter; the quiet file's y (typed null) was no column at all.
    declare = ("--id-type", "int64", "--column", "x=0:1")
    quiet, loud = _inputs(tmp_path, "quiet", None), _inputs(tmp_path, "loud", 5.0)
    assert pq.read_schema(quiet[0]).field("y").type == pa.null()
    assert _features(quiet, tmp_path / "quiet.parquet", *declare) == 0
    assert _features(loud, tmp_path / "loud.parquet", *declare) == 0
    assert pq.read_table(tmp_path / "quiet.parquet").equals(pq.read_table(tmp_path / "loud.parquet"))


def test_the_features_job_reads_the_contract_a_ledger_records(tmp_path):
    day = tmp_path / "d.csv"
    day.write_text(f"user_id,day,x,y\n1,{_day(0)},1,2\n2,{_day(0)},0,3\n")
    ledger = tmp_path / "l.duckdb"
    assert main(["run", "--input", str(day), "--store", str(tmp_path / "s.duckdb"), "--ledger", str(ledger),
                 "--start", _day(0), "--end", _day(0), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4",
                 "--id-type", "int64", "--column", "x=0:1", "--column", "y"]) == 0
    assert _features([str(day)], tmp_path / "f.parquet", "--ledger", str(ledger)) == 0
    table = pq.read_table(tmp_path / "f.parquet")
    assert table.schema.field("user_id").type == pa.int64()  # the ledger's ids, though a CSV's are text
    assert {"x_mean", "y_mean"} <= set(table.column_names)


@pytest.mark.parametrize("argv, message", [
    (("--id-type", "int64"), "declares no column"),
    (("--ledger", "nowhere.duckdb", "--id-type", "int64", "--column", "x=0:1"), "not both"),
    (("--ledger", "nowhere.duckdb"), "does not exist"),
])
def test_a_features_contract_given_badly_is_refused_naming_the_option(tmp_path, capsys, argv, message):
    assert _features(_inputs(tmp_path, "a", None), tmp_path / "f.parquet", *argv) == 2
    assert message in capsys.readouterr().err
