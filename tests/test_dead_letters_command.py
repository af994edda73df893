"""``renyi-stream dead-letters``: the curator reads the rows the jobs refused without opening the
ledger by hand (issue 37, friction): counts by the day of the row and the reason, the letters
themselves with ``--rows``, curator only, read-only, never the release store.

The ledger here is two daily runs of CSV exports with the mistakes a real export has: text in a
declared number column, an id that is no int64, a repeated user, an empty id, a date that does
not parse and a line that does not split.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import shutil
from pathlib import Path

import pytest

from renyi_stream.pipelines.cli.dead_letters import letter_windows
from renyi_stream.pipelines.cli.main import main
from renyi_stream.stream.engine.dead_letters import dead_letters
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE
from renyi_stream.stream.schema import DeadLetterReason, WindowSpec
from declared import flags

DECLARED = flags("int64", "opened=0:1")
EPOCH = dt.date(1970, 1, 1)
W1, W2 = (dt.date(2026, 3, 1) - EPOCH).days, (dt.date(2026, 3, 2) - EPOCH).days
DAY1_CSV = "user_id,day,opened\n1,2026-03-01,1\n2,2026-03-01,0\n3,2026-03-01,yes\n"
# Row 0 is valid; 1 an id that is no int64; 2 and 3 the same user twice; 4 an empty id; 5 a day
# that does not parse; the last line does not split into the header's fields.
DAY2_ROWS = ("user_id,day,opened\n1,2026-03-02,1\nabc,2026-03-02,1\n3,2026-03-02,1\n3,2026-03-02,0\n"
             ",2026-03-02,1\n4,not-a-date,1\n")
DAY2_CSV = DAY2_ROWS + "5,2026-03-02\n"


def _run(root: Path, name: str, text: str, day: str) -> None:
    path = root / name
    path.write_text(text)
    assert main(["run", "--input", str(path), "--store", str(root / "releases.duckdb"), "--ledger",
                 str(root / "ledger.duckdb"), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4",
                 "--start", day, "--end", day, "--shards", "2", "--quiet", *DECLARED]) == 0


@pytest.fixture(scope="module")
def books(tmp_path_factory) -> Path:
    """A ledger and store after two daily runs whose CSVs hold bad rows."""
    root = tmp_path_factory.mktemp("books")
    _run(root, "day-2026-03-01.csv", DAY1_CSV, "2026-03-01")
    _run(root, "day-2026-03-02.csv", DAY2_CSV, "2026-03-02")
    return root


def _letters(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["dead-letters", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def _cells(line: str) -> list[str]:
    return line.split()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


# --------------------------------------------------------------------------- the daily job's ledger


def test_it_prints_the_curator_only_notice_first_then_the_counts_by_day_and_reason(books, capsys):
    status, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"))
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == CURATOR_ONLY_NOTICE
    assert f"dead letters in the ledger {books / 'ledger.duckdb'}: 6" in lines[1]
    assert _cells(lines[2]) == ["day", "window_id", "reason", "letters"]
    assert [_cells(line) for line in lines[4:10]] == [
        ["2026-03-01", str(W1), "wrong_type", "1"],
        ["2026-03-02", str(W2), "duplicate_user_window", "1"],
        ["2026-03-02", str(W2), "empty_user_id", "1"],
        ["2026-03-02", str(W2), "wrong_type", "1"],
        ["-", "-", "bad_time", "1"],
        ["-", "-", "malformed_row", "1"],
    ]


def test_a_letter_whose_row_has_no_readable_day_is_counted_last_without_a_day_and_the_dash_is_explained(
        books, capsys):
    _, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"))
    assert '("-": the row has no readable day' in out


def test_rows_lists_each_letters_day_source_row_index_reason_and_detail(books, capsys):
    status, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--rows")
    assert status == 0
    rows = out.split("the dead letters, 6, by day, source and row:\n")[1].splitlines()
    assert _cells(rows[0]) == ["day", "window_id", "source", "row_index", "reason", "detail"]
    day2 = str(books / "day-2026-03-02.csv")
    assert [_cells(line)[:5] for line in rows[2:]] == [
        ["2026-03-01", str(W1), str(books / "day-2026-03-01.csv"), "2", "wrong_type"],
        ["2026-03-02", str(W2), day2, "1", "wrong_type"],
        ["2026-03-02", str(W2), day2, "3", "duplicate_user_window"],
        ["2026-03-02", str(W2), day2, "4", "empty_user_id"],
        ["-", "-", day2, "-1", "malformed_row"],
        ["-", "-", day2, "5", "bad_time"],
    ]
    assert rows[-1].endswith('day: cannot parse "not-a-date" as a YYYY-MM-DD date')


def test_a_wrong_type_letter_of_a_daily_run_names_its_column_and_the_value_that_did_not_parse(books, capsys):
    # issue 37, friction: text in a declared number column, and an id that is no int64
    _, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--rows", "--format", "json")
    details = [row["detail"] for row in json.loads(out)["rows"] if row["reason"] == "wrong_type"]
    assert details == ['column \'opened\': cannot parse "yes" as a number',
                       'user_id: "abc" is not an int64 user id written canonically (the ledger\'s declared id type)']


def test_limit_caps_the_letters_printed_and_says_how_many_there_are(books, capsys):
    status, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--rows", "--limit", "2")
    assert status == 0
    shown = out.split("the dead letters, 2 of 6 (--limit 2), by day, source and row:\n")[1].splitlines()
    assert len(shown) == 2 + 2  # header, rule, two letters
    assert _cells(shown[3])[4] == "wrong_type" and _cells(shown[3])[0] == "2026-03-02"


def test_json_is_one_document_opening_with_the_notice(books, capsys):
    status, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--format", "json", "--rows",
                              "--limit", "1")
    document = json.loads(out)
    assert status == 0 and next(iter(document)) == "notice" and document["notice"] == CURATOR_ONLY_NOTICE
    assert document["letters"] == 6 and document["rows_shown"] == 1
    assert document["by_day_and_reason"][0] == {"day": "2026-03-01", "window_id": W1, "reason": "wrong_type",
                                                "letters": 1}
    assert document["by_day_and_reason"][-1] == {"day": None, "window_id": None, "reason": "malformed_row",
                                                 "letters": 1}
    assert set(document["rows"][0]) == {"day", "window_id", "source", "row_index", "reason", "detail"}


def test_csv_prints_one_csv_table_on_stdout_and_the_notice_on_stderr(books, capsys):
    status, out, err = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--format", "csv")
    assert status == 0 and err.splitlines()[0] == CURATOR_ONLY_NOTICE
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0] == {"day": "2026-03-01", "window_id": str(W1), "reason": "wrong_type", "letters": "1"}
    assert len(rows) == 6
    _, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--format", "csv", "--rows")
    assert list(csv.DictReader(io.StringIO(out)))[0]["detail"] == 'column \'opened\': cannot parse "yes" as a number'


def test_a_raw_row_is_never_printed(books, capsys):
    # the detail names the column and the value at fault; the rest of the row stays in the ledger
    _, out, _ = _letters(capsys, "--ledger", str(books / "ledger.duckdb"), "--rows", "--format", "json")
    assert '"raw"' not in out and '\\"user_id\\":' not in out


def test_it_writes_nothing_to_the_ledger_the_store_or_beside_them(books, tmp_path, capsys):
    root = tmp_path / "copy"
    shutil.copytree(books, root)
    shutil.rmtree(root / "ledger.duckdb.tmp", ignore_errors=True)
    before = _files(root)
    for extra in ([], ["--rows"], ["--format", "json", "--rows"], ["--format", "csv"]):
        assert _letters(capsys, "--ledger", str(root / "ledger.duckdb"), *extra)[0] == 0
    assert _files(root) == before


def test_an_empty_ledger_says_it_has_no_dead_letters(tmp_path, capsys):
    _run(tmp_path, "day-2026-03-01.csv", "user_id,day,opened\n1,2026-03-01,1\n", "2026-03-01")
    status, out, _ = _letters(capsys, "--ledger", str(tmp_path / "ledger.duckdb"))
    assert status == 0
    assert out.splitlines() == [CURATOR_ONLY_NOTICE, f"no dead letters in the ledger {tmp_path / 'ledger.duckdb'}"]


# --------------------------------------------------------------------------- refusals


def test_a_ledger_path_that_does_not_exist_is_refused_and_nothing_is_created(tmp_path, capsys):
    missing = tmp_path / "ledgr.duckdb"  # a typo
    status, out, err = _letters(capsys, "--ledger", str(missing))
    assert status == 1 and out == ""
    assert f"renyi-stream dead-letters: error: argument --ledger: the ledger {missing} does not exist" in err
    assert list(tmp_path.iterdir()) == []


def test_the_release_store_given_as_the_ledger_is_refused(books, tmp_path, capsys):
    store = tmp_path / "releases.duckdb"
    shutil.copy(books / "releases.duckdb", store)
    store.chmod(0o600)
    status, _, err = _letters(capsys, "--ledger", str(store))
    assert status == 1
    assert "argument --ledger:" in err and "public release store" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["releases.duckdb"]  # no spill folder beside it


def test_limit_without_rows_is_refused_naming_both_options(books, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["dead-letters", "--ledger", str(books / "ledger.duckdb"), "--limit", "5"])
    assert exit_.value.code == 2
    assert "argument --limit: applies only with --rows, got --limit 5 without --rows" in capsys.readouterr().err


def test_a_limit_below_one_is_refused_naming_it(books, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["dead-letters", "--ledger", str(books / "ledger.duckdb"), "--rows", "--limit", "0"])
    assert exit_.value.code == 2
    assert "argument --limit: must be a positive number of rows, got --limit 0" in capsys.readouterr().err


def test_exactly_one_of_ledger_or_curator_output_is_required(books, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["dead-letters"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        main(["dead-letters", "--ledger", str(books / "ledger.duckdb"), "--curator-output", str(tmp_path)])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --------------------------------------------------------------------------- the other jobs' curator outputs


def _key(tmp_path: Path) -> str:
    from renyi_stream.stream.noise import NoiseKey

    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    return str(key)


def _job_options(tmp_path: Path, output: Path) -> list[str]:
    return ["--start", "2026-03-02", "--end", "2026-03-02", "--epsilon", "1", "--delta", "1e-6",
            "--norm-budget", "4", "--output", str(output), "--releases-parquet", str(tmp_path / "public"),
            "--noise-key", _key(tmp_path), *DECLARED]


def test_a_streaming_jobs_curator_output_is_read_as_the_ledger_is(tmp_path, capsys):
    day = tmp_path / "day-2026-03-02.csv"
    day.write_text(DAY2_ROWS)  # a replayed file is one message: no line that does not split
    output = tmp_path / "curator"
    assert main(["stream", "--replay", str(day), *_job_options(tmp_path, output)]) == 0
    status, out, _ = _letters(capsys, "--curator-output", str(output), "--format", "json", "--rows")
    document = json.loads(out)
    assert status == 0 and document["notice"] == CURATOR_ONLY_NOTICE
    assert document["from"] == f"the streaming job {output}"
    assert [(r["day"], r["reason"], r["letters"]) for r in document["by_day_and_reason"]] == [
        ("2026-03-02", "duplicate_user_window", 1), ("2026-03-02", "empty_user_id", 1),
        ("2026-03-02", "wrong_type", 1), (None, "bad_time", 1)]
    assert {r["source"] for r in document["rows"]} == {str(day)}


def test_a_distributed_runs_curator_output_is_read_from_the_files_its_manifest_lists(tmp_path, capsys):
    day = tmp_path / "day-2026-03-02.csv"
    day.write_text(DAY2_CSV)
    output = tmp_path / "run1"
    assert main(["distributed", "--input", str(day), "--previous-ledger", "none", "--quiet",
                 *_job_options(tmp_path, output)]) == 0
    (output / "dead" / "stray.parquet").write_bytes(b"not listed in the manifest: never read")
    status, out, _ = _letters(capsys, "--curator-output", str(output))
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == CURATOR_ONLY_NOTICE and f"the distributed run {output}: 5" in lines[1]
    assert [_cells(line) for line in lines[4:9]] == [
        ["2026-03-02", str(W2), "duplicate_user_window", "1"], ["2026-03-02", str(W2), "empty_user_id", "1"],
        ["2026-03-02", str(W2), "wrong_type", "1"], ["-", "-", "bad_time", "1"], ["-", "-", "malformed_row", "1"]]


def test_a_distributed_run_that_did_not_commit_is_refused(tmp_path, capsys):
    output = tmp_path / "run1"
    output.mkdir()
    (output / "_INTENT.json").write_text("{}")
    status, _, err = _letters(capsys, "--curator-output", str(output))
    assert status == 1
    assert f"argument --curator-output: the distributed run {output} did not commit" in err


def test_a_folder_that_is_no_jobs_output_is_refused(tmp_path, capsys):
    status, _, err = _letters(capsys, "--curator-output", str(tmp_path))
    assert status == 1 and "is not the --output of a distributed run or a streaming job" in err
    status, _, err = _letters(capsys, "--curator-output", str(tmp_path / "missing"))
    assert status == 1 and f"argument --curator-output: {tmp_path / 'missing'} does not exist" in err
    assert not (tmp_path / "missing").exists()


# --------------------------------------------------------------------------- a letter's day


def test_a_letters_day_is_its_rows_own_window_and_none_without_a_readable_time():
    raws = ['{"user_id": 4, "window_id": 20513, "opened": 1.0}',  # dead-lettered after validation
            '{"user_id":"abc","day":"2026-03-02","opened":"1"}',  # by the validator, with its day
            '{"user_id":"7","event_time":"2026-03-02T13:00:00+00:00","opened":"x"}',
            '{"user_id":"8","day":"not-a-date","opened":"1"}',
            "5,2026-03-02",  # a CSV line
            "ffee00"]  # a message's bytes
    letters = dead_letters(DeadLetterReason.WRONG_TYPE, source="f.csv", row_index=list(range(len(raws))),
                           detail="d", raw=raws)
    half_days = WindowSpec(length_seconds=12 * 3600)
    assert letter_windows(letters, WindowSpec()).to_pylist() == [20513, W2, W2, None, None, None]
    assert letter_windows(letters, half_days).to_pylist() == [20513, 2 * W2, 2 * W2 + 1, None, None, None]
