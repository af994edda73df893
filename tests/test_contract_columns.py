"""The id and time columns are named by the input contract (issue 37, item 5: a CSV export whose
day column is ``event_date`` had to be renamed in every file).

``--id-column NAME`` and ``--day-column NAME`` (or ``--event-time-column NAME``), in every job's
contract options and as ``"id_column"``/``"day_column"``/``"event_time_column"`` in ``--schema``,
are declared with the contract and kept by the ledger for life. Every job reads the declared
columns as the id and the time (the reader's header check and the validator take the names,
:class:`renyi_stream.stream.schema.InputKeys`), so a file named ``uid,event_date,opened`` is
charged and released exactly as the same rows named ``user_id,day,opened``; its dead letters and
refusals name the operator's own columns. A contract recorded before the names existed reads as
the defaults and equals a declaration of them. Driven through the CLI
(:func:`renyi_stream.pipelines.cli.main.main`).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.streaming.codec import encode_message
from renyi_stream.stream.contract import InputContract
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise
from renyi_stream.stream.schema import InputKeys

DAY1, DAY2 = "2026-03-01", "2026-03-02"
W1 = 20513  # 2026-03-01, days since the epoch
PROMISE = ["--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--shards", "2"]
DECLARE = ["--id-type", "int64", "--column", "opened=0:1"]
NAMES = ["--id-column", "uid", "--day-column", "event_date"]
#: Day 1: four users, one with a value that does not parse (a wrong_type dead letter) and one row
#: without an id (an empty_user_id dead letter, which names the id column).
ROWS1 = [("1", DAY1, "1"), ("2", DAY1, "0"), ("3", DAY1, "1"), ("4", DAY1, "x"), ("", DAY1, "1")]
ROWS2 = [("1", DAY2, "1"), ("3", DAY2, "1"), ("5", DAY2, "0")]


def _csv(path: Path, header: str, rows: list[tuple[str, ...]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows))
    return str(path)


def _key(tmp_path: Path) -> str:
    key = tmp_path / "keys" / "noise.key"
    if not key.exists():
        NoiseKey.load_or_create(key)
    return str(key)


def _run(root: Path, inputs: list[str], day: str, *options: str, key: str) -> int:
    return main(["run", "--input", *inputs, "--store", str(root / "releases.duckdb"), "--ledger",
                 str(root / "ledger.duckdb"), *PROMISE, "--start", day, "--end", day, "--quiet",
                 "--noise-key", key, *options])


def _used(ledger: Path) -> list[tuple]:
    with duckdb.connect(str(ledger), read_only=True) as con:
        return con.execute("SELECT user_id, used FROM ledger ORDER BY user_id").fetchall()


def _releases(root: Path, key: str) -> list[tuple]:
    """The store's release rows (query, window, coordinate, label, value, noise std), the keyed
    noise of its ledger taken off each value: the sums that were noised (tests/test_job_parity.py)."""
    with duckdb.connect(str(root / "releases.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT query_id, window_id, coordinate, label, value, noise_std FROM releases "
                           "ORDER BY 1, 2, 3").fetchall()
        (ledger_id,) = con.execute("SELECT value FROM store_meta WHERE key = 'ledger_id'").fetchone()
    binding = NoiseBinding(NoiseKey.load(key), ledger_id)
    return [(q, w, c, label, round(v - float(gaussian_noise(binding, query_id=q, window_id=w, dim=c + 1,
                                                                noise_std=s)[c]), 9), s)
            for q, w, c, label, v, s in rows]


def _meta(ledger: Path, name: str) -> str | None:
    with duckdb.connect(str(ledger), read_only=True) as con:
        row = con.execute("SELECT value FROM meta WHERE key = ?", [name]).fetchone()
    return None if row is None else row[0]


def _dead(ledger: Path) -> list[tuple]:
    with duckdb.connect(str(ledger), read_only=True) as con:
        return con.execute("SELECT reason, detail, raw FROM dead_letters ORDER BY row_index").fetchall()


@pytest.fixture
def named(tmp_path) -> dict:
    """Day 1 as the operator's export names it (``uid,event_date,opened``), released by a first
    run that declares those names; beside it, the same rows named ``user_id,day,opened`` released
    by a first run of the default names, with the same noise key."""
    key = _key(tmp_path)
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    file = _csv(theirs / "in" / f"day-{DAY1}.csv", "uid,event_date,opened", ROWS1)
    default = _csv(ours / "in" / f"day-{DAY1}.csv", "user_id,day,opened", ROWS1)
    assert _run(theirs, [file], DAY1, *DECLARE, *NAMES, key=key) == 0
    assert _run(ours, [default], DAY1, *DECLARE, key=key) == 0
    return {"theirs": theirs, "ours": ours, "key": key, "tmp": tmp_path}


# --------------------------------------------------------------------------- the daily job


def test_a_daily_run_of_declared_column_names_charges_and_releases_what_the_default_names_do(named):
    theirs, ours, key = named["theirs"], named["ours"], named["key"]
    assert _used(theirs / "ledger.duckdb") == _used(ours / "ledger.duckdb")
    assert [u for u, _ in _used(theirs / "ledger.duckdb")] == [1, 2, 3]
    released = _releases(theirs, key)
    assert released == _releases(ours, key)
    assert [(q, w, v) for q, w, _, _, v, _ in released] == [("sum:opened", W1, 2.0)]


def test_the_ledger_records_the_declared_names_with_its_contract(named):
    columns = json.loads(_meta(named["theirs"] / "ledger.duckdb", "columns"))
    assert columns["id_column"] == "uid" and columns["day_column"] == "event_date"
    # The default names are recorded exactly as before the names existed: the list of columns alone.
    assert isinstance(json.loads(_meta(named["ours"] / "ledger.duckdb", "columns")), list)


def test_dead_letters_name_the_declared_columns(named):
    letters = _dead(named["theirs"] / "ledger.duckdb")
    assert [(reason, detail) for reason, detail, _ in letters] == [
        ("wrong_type", "column 'opened': cannot parse \"x\" as a number"), ("empty_user_id", "uid is an empty string")]
    assert all(set(json.loads(raw)) == {"uid", "event_date", "opened"} for _, _, raw in letters)


def test_the_dead_letters_command_finds_a_letters_day_in_the_declared_day_column(named, capsys):
    capsys.readouterr()
    assert main(["dead-letters", "--ledger", str(named["theirs"] / "ledger.duckdb"), "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["by_day_and_reason"]
    assert [(r["day"], r["reason"], r["letters"]) for r in counts] == [
        (DAY1, "empty_user_id", 1), (DAY1, "wrong_type", 1)]


def test_the_next_run_without_the_options_keeps_the_recorded_names(named):
    theirs, key = named["theirs"], named["key"]
    day2 = _csv(theirs / "in" / f"day-{DAY2}.csv", "uid,event_date,opened", ROWS2)
    assert _run(theirs, [day2], DAY2, key=key) == 0
    assert [u for u, _ in _used(theirs / "ledger.duckdb")] == [1, 2, 3, 5]
    assert json.loads(_meta(theirs / "ledger.duckdb", "columns"))["id_column"] == "uid"


def test_a_run_declaring_other_names_is_refused_naming_both(named, capsys):
    theirs, key = named["theirs"], named["key"]
    day2 = _csv(theirs / "in" / f"day-{DAY2}.csv", "user,event_date,opened", ROWS2)
    before = _used(theirs / "ledger.duckdb")
    capsys.readouterr()
    assert _run(theirs, [day2], DAY2, *DECLARE, "--id-column", "user", "--day-column", "event_date", key=key) == 1
    err = capsys.readouterr().err
    assert "the id column: the ledger's contract names 'uid', this run declares 'user' (--id-column)" in err
    assert _used(theirs / "ledger.duckdb") == before


def test_a_run_declaring_the_default_names_on_a_ledger_of_the_default_names_is_accepted(named):
    ours, key = named["ours"], named["key"]
    day2 = _csv(ours / "in" / f"day-{DAY2}.csv", "user_id,day,opened", ROWS2)
    assert _run(ours, [day2], DAY2, *DECLARE, "--id-column", "user_id", "--day-column", "day", key=key) == 0


@pytest.mark.parametrize("header, missing, option", [
    ("user_id,event_date,opened", "uid", "--id-column"),
    ("uid,day,opened", "event_date", "--day-column"),
], ids=["id", "day"])
def test_a_file_without_a_declared_column_is_refused_naming_it_and_the_file(named, capsys, header, missing, option):
    theirs, key = named["theirs"], named["key"]
    day2 = _csv(theirs / "in" / f"day-{DAY2}.csv", header, ROWS2)
    before = _used(theirs / "ledger.duckdb")
    capsys.readouterr()
    assert _run(theirs, [day2], DAY2, key=key) == 1
    err = capsys.readouterr().err
    assert f"input file {day2} has no {missing!r} column" in err and option in err
    assert _used(theirs / "ledger.duckdb") == before


def test_a_first_run_without_the_names_says_how_to_declare_them(tmp_path, capsys):
    file = _csv(tmp_path / "in" / f"day-{DAY1}.csv", "uid,event_date,opened", ROWS1)
    assert _run(tmp_path / "run", [file], DAY1, *DECLARE, key=_key(tmp_path)) == 1
    err = capsys.readouterr().err
    assert "no 'user_id' column" in err and "--id-column NAME" in err
    assert not (tmp_path / "run" / "ledger.duckdb").exists()


def test_columns_named_user_id_and_day_beside_the_declared_ones_are_not_read(named):
    # The declared names decide which column is the id and which the day: another column named
    # user_id or day is an undeclared column, read by nothing (so never ambiguous).
    tmp_path, key = named["tmp"], named["key"]
    rows = [(u, d, o, "99", "1999-01-01") for u, d, o in ROWS1]
    file = _csv(tmp_path / "both" / "in" / f"day-{DAY1}.csv", "uid,event_date,opened,user_id,day", rows)
    assert _run(tmp_path / "both", [file], DAY1, *DECLARE, *NAMES, key=key) == 0
    assert _used(tmp_path / "both" / "ledger.duckdb") == _used(named["ours"] / "ledger.duckdb")


def test_an_event_time_column_is_read_as_timestamps(named):
    tmp_path, key = named["tmp"], named["key"]
    rows = [(u, f"{d}T13:30:00Z", o) for u, d, o in ROWS1]
    file = _csv(tmp_path / "ts" / "in" / f"day-{DAY1}.csv", "uid,ts,opened", rows)
    assert _run(tmp_path / "ts", [file], DAY1, *DECLARE, "--id-column", "uid", "--event-time-column", "ts",
                key=key) == 0
    assert _used(tmp_path / "ts" / "ledger.duckdb") == _used(named["ours"] / "ledger.duckdb")
    assert _releases(tmp_path / "ts", key) == _releases(named["ours"], key)


def test_a_schema_file_declares_the_names(named):
    tmp_path, key = named["tmp"], named["key"]
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"id_type": "int64", "columns": [{"name": "opened", "lo": 0, "hi": 1}],
                                  "id_column": "uid", "day_column": "event_date"}))
    file = _csv(tmp_path / "schema" / "in" / f"day-{DAY1}.csv", "uid,event_date,opened", ROWS1)
    assert _run(tmp_path / "schema", [file], DAY1, "--schema", str(schema), key=key) == 0
    assert _meta(tmp_path / "schema" / "ledger.duckdb", "columns") == _meta(named["theirs"] / "ledger.duckdb",
                                                                            "columns")
    assert _used(tmp_path / "schema" / "ledger.duckdb") == _used(named["ours"] / "ledger.duckdb")


# --------------------------------------------------------------------------- an old contract


def test_a_contract_recorded_before_the_names_existed_reads_as_the_defaults_and_equals_them():
    old = '{"columns":[{"hi":1.0,"kind":"number","lo":0.0,"name":"opened"}],"id_type":"int64"}'
    recorded = InputContract.from_json(old)
    declared = InputContract.from_options(id_type="int64", columns=["opened=0:1"], id_column="user_id",
                                          day_column="day")
    assert recorded.keys == InputKeys() and recorded == declared
    assert declared.to_json() == old
    assert InputContract.from_columns_json("int64", recorded.columns_json()) == recorded
    assert declared.columns_json() == '[{"hi":1.0,"kind":"number","lo":0.0,"name":"opened"}]'


# --------------------------------------------------------------------------- the other jobs


def _job_options(tmp_path: Path, output: Path, key: str) -> list[str]:
    return ["--start", DAY1, "--end", DAY1, *PROMISE, "--output", str(output), "--releases-parquet",
            str(tmp_path / f"{output.name}-public"), "--noise-key", key, *DECLARE, *NAMES]


def test_the_distributed_job_reads_the_declared_columns_and_charges_as_the_daily_job(named):
    tmp_path, key = named["tmp"], named["key"]
    file = _csv(tmp_path / "dist" / f"day-{DAY1}.csv", "uid,event_date,opened", ROWS1)
    output = tmp_path / "dist-run1"
    assert main(["distributed", "--input", file, "--previous-ledger", "none", "--quiet",
                 *_job_options(tmp_path, output, key)]) == 0
    manifest = json.loads((output / "_COMMITTED.json").read_text())
    ledger = pa.concat_tables([pq.read_table(f) for f in manifest["ledger_files"]]).sort_by("user_id")
    assert list(zip(ledger.column("user_id").to_pylist(), ledger.column("used").to_pylist())) == \
        _used(named["ours"] / "ledger.duckdb")
    assert json.loads(manifest["parameters"]["columns"])["day_column"] == "event_date"


def _streamed(output: Path) -> list[tuple]:
    ledger = pa.concat_tables([pq.read_table(f) for f in sorted((output / "ledger").rglob("*.parquet"))])
    ledger = ledger.sort_by("user_id")
    return list(zip(ledger.column("user_id").to_pylist(), ledger.column("used").to_pylist()))


def test_a_streaming_replay_reads_the_declared_columns_and_charges_as_the_daily_job(named):
    tmp_path, key = named["tmp"], named["key"]
    file = _csv(tmp_path / "stream" / f"day-{DAY1}.csv", "uid,event_date,opened", ROWS1)
    output = tmp_path / "stream-job1"
    assert main(["stream", "--replay", file, *_job_options(tmp_path, output, key)]) == 0
    assert _streamed(output) == _used(named["ours"] / "ledger.duckdb")


def test_a_streaming_message_is_read_by_the_declared_names(named):
    tmp_path, key = named["tmp"], named["key"]
    message = tmp_path / "messages" / "m1.arrows"
    message.parent.mkdir()
    message.write_bytes(encode_message(pa.table({
        "uid": pa.array([1, 2, 3, 4], pa.int64()), "event_date": pa.array([DAY1] * 4),
        "opened": pa.array([1.0, 0.0, 1.0, None])})))
    output = tmp_path / "stream-job2"
    assert main(["stream", "--replay", str(message), *_job_options(tmp_path, output, key)]) == 0
    assert _streamed(output) == _used(named["ours"] / "ledger.duckdb")
    letters = pa.concat_tables([pq.read_table(f) for f in (output / "dead").rglob("*.parquet")])
    assert letters.column("reason").to_pylist() == ["null_value"]
    assert set(json.loads(letters.column("raw")[0].as_py())) == {"uid", "event_date", "opened"}


def test_a_streaming_replay_of_a_file_without_a_declared_column_is_refused_naming_it(named, capsys):
    tmp_path, key = named["tmp"], named["key"]
    file = _csv(tmp_path / "stream-bad" / f"day-{DAY1}.csv", "uid,day,opened", ROWS1)
    output = tmp_path / "stream-job3"
    assert main(["stream", "--replay", file, *_job_options(tmp_path, output, key)]) == 2
    err = capsys.readouterr().err
    assert f"input file {file} has no 'event_date' column (the declared day column, --day-column)" in err
    assert not output.exists()


def test_features_read_the_declared_columns_of_the_ledger(named, capsys):
    tmp_path = named["tmp"]
    days = [_csv(tmp_path / "feat" / f"day-{day}.csv", "uid,event_date,opened", rows)
            for day, rows in ((DAY1, ROWS1), (DAY2, ROWS2))]
    out = tmp_path / "features.parquet"
    assert main(["features", "--input", *days, "--out", str(out), "--start", DAY1, "--end", DAY1,
                 "--label-column", "opened", "--label-start", DAY2, "--label-end", DAY2,
                 "--ledger", str(named["theirs"] / "ledger.duckdb"), "--quiet"]) == 0
    table = pq.read_table(out).sort_by("user_id")
    # The users of the feature window (user 4's value and the row without an id are dead letters),
    # labelled by their day-2 rows.
    assert table.column("user_id").to_pylist() == [1, 2, 3]
    assert table.column("label").to_pylist() == [1, 0, 1]
