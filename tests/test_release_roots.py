"""A Parquet release root is a first-class release store (issue 31): ``renyi-stream sql`` and
``report`` read the root the distributed and streaming jobs answer, with the tables, views and
sandbox of a DuckDB store, and the root records the promise its releases keep."""

from __future__ import annotations

import json

import pytest

from renyi_stream.pipelines.cli.main import main
from test_contract_public import DECLARE, _distributed, _streaming


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("root")
    assert _distributed(folder, *DECLARE) == 0
    return folder / "public"


def test_sql_reads_a_parquet_release_root_as_a_store(root, capsys):
    assert main(["sql", "SELECT query_id, count(*) AS n FROM releases GROUP BY ALL", "--releases-parquet", str(root),
                 "--format", "json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"query_id": "sum:opened", "n": 1}]


def test_sql_over_a_root_has_the_stores_views_and_records(root, capsys):
    assert main(["sql", "SELECT (SELECT count(*) FROM releases_with_ci) AS ci, (SELECT count(*) FROM query_catalogue) "
                 "AS queries, (SELECT value FROM store_meta WHERE key = 'promise_epsilon') AS epsilon, "
                 "(SELECT value FROM store_meta WHERE key = 'input_contract') AS contract",
                 "--releases-parquet", str(root), "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["ci"], row["queries"], float(row["epsilon"])) == (1, 1, 1.0)
    assert json.loads(row["contract"])["columns"][0]["name"] == "opened"


def test_sql_over_a_root_keeps_the_sandbox(root, capsys):
    assert main(["sql", "SELECT * FROM read_csv('/etc/passwd')", "--releases-parquet", str(root)]) == 1
    assert "external access disabled" in capsys.readouterr().err
    assert main(["sql", "DELETE FROM releases", "--releases-parquet", str(root)]) == 1
    assert "is not a read" in capsys.readouterr().err


def test_sql_needs_exactly_one_store(root, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sql", "SELECT 1"])
    assert exit_info.value.code == 2 and "--releases-parquet" in capsys.readouterr().err
    assert main(["sql", "SELECT 1", "--releases-parquet", str(tmp_path / "none")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_report_draws_a_parquet_release_root_with_its_promise(root, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", "--releases-parquet", str(root), "--out", str(out)]) == 0
    page = out.read_text()
    assert "sum:opened" in page and "(1, 1e-06)-differential privacy" in page


def test_the_streaming_job_records_its_promise_beside_its_releases(tmp_path):
    from renyi_stream.queries.catalogue import ReleaseCatalogue

    assert _streaming(tmp_path, *DECLARE) == 0
    assert ReleaseCatalogue(str(tmp_path / "public")).promise() == {
        "epsilon": "1.0", "delta": "1e-06", "accounting": "gdp", "norm_budget": "8.0"}


def test_report_curator_variant_needs_the_daily_jobs_store(root, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--releases-parquet", str(root), "--out", str(tmp_path / "r.html"), "--ledger",
              str(tmp_path / "l.duckdb")])
    assert exit_info.value.code == 2 and "--ledger" in capsys.readouterr().err


def test_renyi_stream_stream_and_distributed_are_the_jobs_front_door(tmp_path, capsys):
    # One front door (issue 31): the streaming and distributed jobs run as renyi-stream subcommands,
    # their options passed as they are.
    import pyarrow as pa

    from renyi_stream.pipelines.streaming.codec import encode_message
    from renyi_stream.stream.schema import WindowSpec
    from renyi_stream.stream.engine.readers import read_batches
    from test_contract_public import DAY, _day_csv, _key

    common = ["--start", DAY, "--end", DAY, "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "8",
              "--noise-key", _key(tmp_path), "--shards", "2", *DECLARE]
    message = tmp_path / "d0.arrows"
    message.write_bytes(encode_message(pa.Table.from_batches(list(read_batches(_day_csv(tmp_path))))))
    assert main(["stream", "--replay", str(message), "--releases-parquet", str(tmp_path / "streamed"),
                 "--output", str(tmp_path / "curator"), *common]) == 0
    assert main(["distributed", "--input", _day_csv(tmp_path), "--previous-ledger", "none", "--output",
                 str(tmp_path / "run0"), "--releases-parquet", str(tmp_path / "batch"), "--quiet", *common]) == 0
    for root in ("streamed", "batch"):
        assert (tmp_path / root / f"window_id={WindowSpec().window_of_day('day', DAY)}").is_dir()
    with pytest.raises(SystemExit) as exit_info:
        main(["stream", "--help"])
    assert exit_info.value.code == 0 and "--replay" in capsys.readouterr().out


def _replay(tmp_path, files, *extra) -> int:
    from test_contract_public import DAY, _key

    return main(["stream", "--replay", *map(str, files), "--start", DAY, "--end", DAY, "--epsilon", "1", "--delta",
                 "1e-6", "--norm-budget", "8", "--noise-key", _key(tmp_path), "--shards", "2",
                 "--releases-parquet", str(tmp_path / "public"), "--output", str(tmp_path / "curator"), *DECLARE,
                 *extra])


@pytest.mark.parametrize("kind", ["parquet", "csv", "arrow"])
def test_the_local_replay_takes_the_daily_jobs_files(tmp_path, kind):
    # Day files given to --replay as Parquet (the natural guess) were each one undecodable_message
    # dead letter, and five noise-only windows went public with exit 0 (issue 31).
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    from renyi_stream.pipelines.streaming import books as streaming_books
    from test_contract_public import _day_csv

    table = pacsv.read_csv(_day_csv(tmp_path), convert_options=pacsv.ConvertOptions(
        column_types={"user_id": pa.int64(), "day": pa.date32()}))
    path = tmp_path / f"d0.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "arrow":
        feather.write_feather(table, path)
    else:
        path.write_text(open(_day_csv(tmp_path)).read())
    assert _replay(tmp_path, [path]) == 0
    books = streaming_books.books(str(tmp_path / "curator"))
    assert books["rows_read"] == table.num_rows and books["rejected"] == 0 and books["balanced"]
    assert books["admitted"] + books["dropped"] + books["clipped"] == table.num_rows


def test_a_replayed_csv_with_a_line_the_reader_cannot_read_is_refused_naming_it(tmp_path, capsys):
    bad = tmp_path / "d0.csv"
    bad.write_text("user_id,day,opened,minutes\n1,2026-03-01,1,3\n2,2026-03-01\n")
    assert _replay(tmp_path, [bad]) == 2
    err = capsys.readouterr().err
    assert f"--replay: {bad} has 1 line(s) the reader cannot read (line 3: 2 fields" in err
    assert not (tmp_path / "public").exists() or not list((tmp_path / "public").glob("window_id=*"))
