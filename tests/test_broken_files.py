"""Broken input files: each is refused with one clear line naming it, and a daily run that meets
one exits non-zero leaving the curator's ledger, the public release store and the noise key
exactly as the last good run left them.

tests/test_readers.py covers a truncated Parquet file, an Arrow stream cut mid-batch, CSV text
named .parquet and an empty .parquet; this file adds the cases they do not (a CSV with a wrong
header, a stream cut exactly between two batches, a cut IPC file, empty files of every
extension, files of one format named as another, binary garbage, a header without rows) and
runs the worst of them through ``renyi-stream run`` on a store that already holds a released
day.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.stream.engine.readers import InputFileError, MalformedLines, read_batches
from declared import contract, flags

DAY1, DAY2 = dt.date(2026, 3, 1), dt.date(2026, 3, 2)
# Files named for their day (renyi_stream.stream.engine.input_days): a run is refused when a
# window it would release has no file of its day, whatever the rows hold.
DAY1_FILE, DAY2_FILE = "day-2026-03-01.parquet", "day-2026-03-02.parquet"
# The ledgers' declared input (issue 28): int64 ids and a 0/1 indicator.
DECLARED = ("int64", "opened=0:1")


def _day(day: dt.date, users=(1, 2, 3)) -> pa.Table:
    return pa.table({
        "user_id": pa.array(list(users), pa.int64()),
        "day": pa.array([day] * len(users), pa.date32()),
        "opened": pa.array([1.0, 0.0, 1.0][: len(users)]),
    })


TABLE = _day(DAY2)


def _parquet_bytes(table: pa.Table = TABLE) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _stream_bytes(*, close: bool = True) -> bytes:
    sink = pa.BufferOutputStream()
    writer = ipc.new_stream(sink, TABLE.schema)
    writer.write_table(TABLE)
    writer.write_table(TABLE)
    if close:
        writer.close()  # writes the end-of-stream marker
    return sink.getvalue().to_pybytes()


def _ipc_file_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, TABLE.schema) as writer:
        writer.write_table(TABLE)
    return sink.getvalue().to_pybytes()


def _csv_text(table: pa.Table = TABLE) -> bytes:
    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink)
    return sink.getvalue().to_pybytes()


# name -> (file name, bytes); every one must be refused naming the file.
BROKEN = {
    "csv_with_a_wrong_header": ("wrong-header.csv", _csv_text(TABLE.rename_columns(["uid", "date", "opened"]))),
    "csv_without_a_time_column": ("no-time.csv", b"user_id,opened\n1,1\n"),
    "csv_with_both_time_columns": ("two-times.csv", b"user_id,day,event_time,opened\n1,2026-03-02,2026-03-02,1\n"),
    "csv_with_a_short_row": ("ragged.csv", b"user_id,day,opened\n1,2026-03-02,1\n2,2026-03-02\n"),
    "csv_of_binary_garbage": ("garbage.csv", bytes(range(256)) * 4),
    "parquet_with_the_wrong_columns": ("wrong-columns.parquet",
                                       _parquet_bytes(TABLE.rename_columns(["uid", "date", "opened"]))),
    "parquet_cut_before_its_footer": ("cut-footer.parquet", _parquet_bytes()[:-3]),
    "parquet_overwritten_in_the_middle": ("overwritten.parquet", (lambda b: b[:40] + b"\xff" * 64 + b[104:])(
        _parquet_bytes())),
    "arrow_stream_cut_between_two_batches": ("cut-between.arrow", _stream_bytes(close=False)),
    "arrow_stream_cut_mid_batch": ("cut-mid.ipc", _stream_bytes()[:-50]),
    "arrow_file_cut_before_its_footer": ("cut-file.feather", _ipc_file_bytes()[:-16]),
    "empty_csv": ("empty.csv", b""),
    "empty_parquet": ("empty.pq", b""),
    "empty_arrow": ("empty.arrow", b""),
    "empty_ipc": ("empty.ipc", b""),
    "empty_feather": ("empty.feather", b""),
    "csv_named_arrow": ("really-csv.arrow", _csv_text()),
    "parquet_named_csv": ("really-parquet.csv", _parquet_bytes()),
    "parquet_named_arrow": ("really-parquet.arrow", _parquet_bytes()),
    "arrow_named_parquet": ("really-arrow.parquet", _stream_bytes()),
}


def _write(tmp_path: Path, kind: str) -> Path:
    name, data = BROKEN[kind]
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_file_is_refused_with_one_printable_line_naming_it(tmp_path, kind):
    path = _write(tmp_path, kind)
    with pytest.raises(InputFileError) as info:
        list(read_batches(path))
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message and message.isprintable() and len(message) < len(str(path)) + 400


def test_a_complete_arrow_stream_and_file_still_read(tmp_path):
    (tmp_path / "whole.arrow").write_bytes(_stream_bytes())
    (tmp_path / "whole.feather").write_bytes(_ipc_file_bytes())
    assert sum(b.num_rows for b in read_batches(tmp_path / "whole.arrow")) == 6
    assert sum(b.num_rows for b in read_batches(tmp_path / "whole.feather")) == 3


@pytest.mark.parametrize("name,data", [("header-only.csv", b"user_id,day,opened\n"),
                                       ("no-rows.parquet", _parquet_bytes(TABLE.slice(0, 0)))])
def test_a_file_with_a_header_and_no_rows_reads_as_one_empty_batch_with_its_schema(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    batches = list(read_batches(tmp_path / name))
    assert len(batches) == 1 and batches[0].num_rows == 0
    assert batches[0].schema.names == ["user_id", "day", "opened"]


def test_a_directory_with_an_input_extension_is_refused_naming_it(tmp_path):
    (tmp_path / "folder.parquet").mkdir()
    with pytest.raises(InputFileError, match="folder.parquet"):
        list(read_batches(tmp_path / "folder.parquet"))


# --------------------------------------------------------------------------- through the job


def _run_args(root: Path, inputs: list[str], start: dt.date, end: dt.date) -> list[str]:
    return ["run", "--input", *inputs, "--store", str(root / "releases.duckdb"), "--ledger", str(root / "ledger.duckdb"),
            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--start", start.isoformat(),
            "--end", end.isoformat(), "--shards", "2", "--quiet", *flags(*DECLARED)]


def _snapshot(root: Path) -> dict:
    """Every table of both databases (all rows, sorted), the key's bytes and the files present."""
    state: dict = {"files": sorted(p.name for p in root.iterdir() if p.suffix != ".wal")}
    for db_name in ("ledger.duckdb", "releases.duckdb"):
        db = duckdb.connect(str(root / db_name), read_only=True)
        try:
            tables = [r[0] for r in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY 1").fetchall()]
            for table in tables:
                state[(db_name, table)] = db.execute(f'SELECT * FROM "{table}" ORDER BY ALL').fetchall()
        finally:
            db.close()
    state["key"] = (root / "ledger.noise.key").read_bytes()
    return state


@pytest.fixture(scope="module")
def released_day(tmp_path_factory) -> Path:
    """A store and ledger after one good run that released DAY1."""
    root = tmp_path_factory.mktemp("released")
    pq.write_table(_day(DAY1), root / DAY1_FILE)
    assert main(_run_args(root, [str(root / DAY1_FILE)], DAY1, DAY1)) == 0
    return root


@pytest.mark.parametrize(
    "kind,position",
    [
        ("csv_with_a_wrong_header", "first"),  # refused before the pipeline starts
        ("arrow_stream_cut_mid_batch", "second"),  # refused inside the Beam pipeline
        ("arrow_stream_cut_between_two_batches", "second"),
        ("parquet_cut_before_its_footer", "second"),
        ("empty_csv", "first"),
        ("csv_named_arrow", "second"),
    ],
)
def test_run_with_a_broken_file_exits_non_zero_naming_it_and_leaves_everything_committed_as_it_was(
        released_day, tmp_path, capsys, kind, position):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    good = tmp_path / "day2.parquet"
    pq.write_table(_day(DAY2), good)
    broken = _write(tmp_path, kind)
    inputs = [str(broken), str(good)] if position == "first" else [str(good), str(broken)]
    capsys.readouterr()
    assert main(_run_args(root, inputs, DAY2, DAY2)) != 0
    err = capsys.readouterr().err
    assert f"renyi-stream run: error: argument --input: input file {broken}" in err
    assert _snapshot(root) == before  # nothing committed is harmed, nothing half-written is added
    assert not any(p.name.endswith(".lock") for p in root.iterdir())


def test_after_a_refused_run_the_fixed_input_runs_the_day_normally(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    good = tmp_path / "day2.parquet"
    pq.write_table(_day(DAY2), good)
    broken = _write(tmp_path, "parquet_cut_before_its_footer")
    assert main(_run_args(root, [str(good), str(broken)], DAY2, DAY2)) != 0
    assert main(_run_args(root, [str(good)], DAY2, DAY2)) == 0
    assert "released 1 window(s)" in capsys.readouterr().out
    db = duckdb.connect(str(root / "releases.duckdb"), read_only=True)
    try:
        windows = [r[0] for r in db.execute("SELECT DISTINCT window_id FROM releases ORDER BY 1").fetchall()]
    finally:
        db.close()
    epoch = dt.date(1970, 1, 1)
    assert windows == [(DAY1 - epoch).days, (DAY2 - epoch).days]


def test_run_on_an_input_with_a_header_and_no_rows_releases_noise_only(tmp_path, capsys):
    """An empty day is valid input (the schedule is public, invariant 3); it used to stop the
    job with a bare StopIteration when it came first."""
    (tmp_path / "empty-day.parquet").write_bytes(_parquet_bytes(TABLE.slice(0, 0)))
    argv = [a for a in _run_args(tmp_path, [str(tmp_path / "empty-day.parquet")], DAY2, DAY2) if a != "--quiet"]
    assert main(argv) == 0  # the default summary: --quiet prints no exact count (issue 18)
    out = capsys.readouterr().out
    assert "released 1 window(s)" in out and "rows read 0" in out


# --------------------------------------------------------------------------- one bad line, not a bad file

_RAGGED = (b"user_id,day,opened\n1,2026-03-02,1\n2,2026-03-02\n3,2026-03-02,1,extra\n4,2026-03-02,0\n")


def test_a_reader_given_a_sink_skips_a_csv_line_that_does_not_split_and_hands_it_over(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_bytes(_RAGGED)
    malformed = MalformedLines()
    assert sum(b.num_rows for b in read_batches(path, malformed=malformed)) == 2
    malformed = list(malformed)
    assert [text for _, text, _ in malformed] == ["2,2026-03-02", "3,2026-03-02,1,extra"]
    assert [(line, why) for line, _, why in malformed] == [(3, "2 fields, not the header's 3"),
                                                           (4, "4 fields, not the header's 3")]


def test_a_csv_line_that_does_not_split_is_a_dead_letter_and_the_day_is_released(tmp_path):
    from renyi_stream.pipelines.daily.job import JobConfig, run_job

    path = tmp_path / "ragged.csv"
    path.write_bytes(_RAGGED)
    w = (DAY2 - dt.date(1970, 1, 1)).days
    summary = run_job(JobConfig(inputs=(str(path),), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                                epsilon=1.0, delta=1e-6, norm_budget=4.0, start_window=w, end_window=w, n_shards=2,
                                contract=contract(*DECLARED)))
    assert (summary.rows_read, summary.admitted + summary.dropped, summary.rejected) == (4, 2, 2)
    assert summary.balanced and summary.windows_released == [w]
    db = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    try:
        letters = db.execute("SELECT reason, raw FROM dead_letters ORDER BY raw").fetchall()
    finally:
        db.close()
    assert letters == [("malformed_row", "2,2026-03-02"), ("malformed_row", "3,2026-03-02,1,extra")]


def test_the_distributed_job_dead_letters_a_csv_line_that_does_not_split(tmp_path):
    import json

    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.stream.noise import NoiseKey

    path = tmp_path / "ragged.csv"
    path.write_bytes(_RAGGED)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    day = DAY2.isoformat()
    out = tmp_path / "curator" / "run1"
    assert dist.main(["--input", str(path), "--start", day, "--end", day, "--epsilon", "1", "--delta", "1e-6",
                      "--norm-budget", "4", "--previous-ledger", "none", "--output", str(out),
                      "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key), "--quiet",
                      *flags(*DECLARED)]) == 0
    manifest = json.loads((out / dist.COMMITTED).read_text())
    assert manifest["balanced"] and manifest["totals"]["rows_read"] == 4
    assert manifest["dead_reasons"] == {"malformed_row": 2}


# --------------------------------------------------------------------------- a window no file covers
# The structural rule (issue 37): whether a run is refused depends on its arguments and its files'
# names, never on whether one user's row is there or valid. It replaced a rule that refused a run
# none of whose rows a window could use, which made the release of a day one user's bit.


def test_the_file_of_another_day_is_refused_before_anyone_is_charged(released_day, tmp_path, capsys):
    # Day 1's file run with day 2's schedule published day 2 as pure noise, for good (issue 31).
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    capsys.readouterr()
    assert main(_run_args(root, [str(root / DAY1_FILE)], DAY2, DAY2)) == 1
    err = capsys.readouterr().err
    assert "no input holds window 20514 (2026-03-02), which this run would release" in err
    assert "the inputs hold 2026-03-01" in err and "--start/--end" in err and "--no-data-days" in err
    assert _snapshot(root) == before


def test_a_too_wide_end_is_refused_instead_of_publishing_a_noise_only_day_for_good(released_day, tmp_path, capsys):
    # Day 2's file with --end one day later released day 3 as noise; day 3's real file then came
    # back all late (issue 37, finding 6).
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    good = tmp_path / DAY2_FILE
    pq.write_table(_day(DAY2), good)
    capsys.readouterr()
    assert main(_run_args(root, [str(good)], DAY2, DAY2 + dt.timedelta(days=1))) == 1
    assert "no input holds window 20515 (2026-03-03)" in capsys.readouterr().err
    assert _snapshot(root) == before


def test_a_day_declared_to_have_no_file_is_released_as_noise_only(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    good = tmp_path / DAY2_FILE
    pq.write_table(_day(DAY2), good)
    capsys.readouterr()
    assert main([*_run_args(root, [str(good)], DAY2, DAY2 + dt.timedelta(days=1)),
                 "--no-data-days", "2026-03-03"]) == 0
    assert "released 2 window(s)" in capsys.readouterr().out


def test_a_range_rerun_given_only_the_charged_days_file_is_refused(released_day, tmp_path, capsys):
    # Days 1..2 with day 1's file alone: day 2 went out as noise (the attacker's second review, 4b).
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    assert main(_run_args(root, [str(root / DAY1_FILE)], DAY1, DAY2)) == 1
    assert "no input holds window 20514 (2026-03-02)" in capsys.readouterr().err
    assert _snapshot(root) == before


def _one_row_apart(tmp_path: Path, day: dt.date, name: str) -> tuple[Path, Path]:
    """Two files of ``day`` under one ``name`` (in two folders) that differ by one user's row."""
    empty, one = tmp_path / "without" / name, tmp_path / "with" / name
    for path, users in ((empty, ()), (one, (4,))):
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_day(day, users=users), path)
    return empty, one


def _outcome(root: Path, argv: list[str], capsys) -> tuple[int, str, str, list]:
    """A run's exit code, its console (paths made relative to ``root``'s parent) and the public
    store's windows: what anyone who sees the job sees."""
    capsys.readouterr()
    status = main(argv)
    out, err = capsys.readouterr()
    db = duckdb.connect(str(root / "releases.duckdb"), read_only=True)
    try:
        windows = db.execute("SELECT DISTINCT window_id FROM releases ORDER BY 1").fetchall()
    finally:
        db.close()
    strip = lambda text: text.replace(str(root.parent), "ROOT").replace("/with/", "/X/").replace("/without/", "/X/")
    return status, strip(out), strip(err), windows


@pytest.mark.parametrize("right_day", [True, False], ids=["todays-file", "another-days-file"])
def test_whether_a_run_is_refused_never_depends_on_one_users_row(released_day, tmp_path, capsys, right_day):
    # With yesterday's file beside today's, an empty today was refused and a today with one
    # user's row released: whether the day went out was that user's bit (issue 37, finding 2).
    day = DAY2 if right_day else DAY1 + dt.timedelta(days=5)
    outcomes = []
    for variant, path in zip(("without", "with"), _one_row_apart(tmp_path, day, f"day-{day}.parquet")):
        root = tmp_path / f"store-{variant}"
        shutil.copytree(released_day, root)
        argv = [a for a in _run_args(root, [str(root / DAY1_FILE), str(path)], DAY2, DAY2) if a != "--quiet"]
        status, out, err, windows = _outcome(root, argv, capsys)
        # what follows the curator-only heading (exact counts, on either stream) differs, by design;
        # everything before it, the exit code and the released windows must not
        public = [text.replace(f"store-{variant}", "store").split("curator only")[0] for text in (out, err)]
        outcomes.append((status, public, windows))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == (0 if right_day else 1)


def test_a_first_run_whose_declared_column_is_all_null_is_treated_as_one_with_a_value(tmp_path, capsys):
    # A first run whose rows all had a null in a declared column was refused, and released when
    # one user had a value (issue 37, finding 2): now both are released, the nulls dead-lettered.
    outcomes = []
    for users in ((), (9,)):
        root = tmp_path / f"first-{len(users)}"
        root.mkdir()
        path = root / DAY1_FILE
        table = pa.table({"user_id": pa.array([1, 2, *users], pa.int64()), "day": pa.array([DAY1] * (2 + len(users)),
                          pa.date32()), "opened": pa.array([None, None, *([1.0] * len(users))], pa.float64())})
        pq.write_table(table, path)
        status, out, err, windows = _outcome(root, _run_args(root, [str(path)], DAY1, DAY1), capsys)
        outcomes.append((status, out, err.replace(root.name, "first"), windows))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == 0


def test_a_row_of_another_day_than_its_files_is_a_dead_letter(released_day, tmp_path, capsys):
    # A file is believed over its rows: a stray row of day 3 in day 2's file charges nobody for
    # day 3, though day 3 is in the schedule.
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    day2 = tmp_path / DAY2_FILE
    stray = _day(DAY2).to_pylist()
    stray[0]["day"] = DAY2 + dt.timedelta(days=1)
    pq.write_table(pa.Table.from_pylist(stray, schema=_day(DAY2).schema), day2)
    argv = [*_run_args(root, [str(day2)], DAY2, DAY2 + dt.timedelta(days=1)), "--no-data-days", "2026-03-03"]
    assert main(argv) == 0
    db = duckdb.connect(str(root / "ledger.duckdb"), read_only=True)
    try:
        letters = db.execute("SELECT reason, detail FROM dead_letters WHERE source LIKE '%2026-03-02%'").fetchall()
    finally:
        db.close()
    assert letters == [("outside_file_days", "window 20515 is outside its file's windows 20514..20514")]


def test_files_naming_no_day_hold_the_declared_input_days_and_are_said_to(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    export = tmp_path / "export.parquet"
    pq.write_table(_day(DAY2), export)
    argv = [a for a in _run_args(root, [str(export)], DAY2, DAY2 + dt.timedelta(days=1)) if a != "--quiet"]
    capsys.readouterr()
    assert main([*argv, "--input-days", "2026-03-02"]) == 1  # day 3: no input holds it
    assert "no input holds window 20515 (2026-03-03)" in capsys.readouterr().err
    assert main(argv) == 0  # without --input-days the file is taken as holding the schedule, and the run says so
    assert (f"1 input file(s) name no day ({export}): taken as holding 2026-03-02..2026-03-03 (the schedule, "
            "--start..--end)") in capsys.readouterr().err


def test_a_file_naming_two_days_is_refused(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    path = tmp_path / "day=2026-03-02" / "events-2026-03-03.parquet"
    path.parent.mkdir()
    pq.write_table(_day(DAY2), path)
    assert main(_run_args(root, [str(path)], DAY2, DAY2)) == 1
    assert "names the days 2026-03-02, 2026-03-03" in capsys.readouterr().err


def test_one_users_bad_row_in_a_file_of_their_own_refuses_nobodys_day(released_day, tmp_path, capsys):
    # Per file, one user's wrong-typed row in a per-client upload refused the whole day, and the
    # late release told analysts their row was bad (the attacker's second review, finding 4a).
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    good = tmp_path / "client-a-2026-03-02.parquet"
    pq.write_table(_day(DAY2), good)
    lone = tmp_path / "client-b-2026-03-02.csv"
    lone.write_text("user_id,day,opened\n4,2026-03-02,1.0x\n")
    assert main(_run_args(root, [str(good), str(lone)], DAY2, DAY2)) == 0


def test_older_days_files_beside_the_new_days_file_are_not_refused(released_day, tmp_path, capsys):
    # A glob over every day's files with a one-day schedule: the older files' rows are late.
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    good = tmp_path / DAY2_FILE
    pq.write_table(_day(DAY2), good)
    assert main(_run_args(root, [str(root / DAY1_FILE), str(good)], DAY2, DAY2)) == 0


def test_a_rerun_of_a_charged_day_and_an_empty_day_are_released_as_usual(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    assert main(_run_args(root, [str(root / DAY1_FILE)], DAY1, DAY1)) == 0
    empty = tmp_path / DAY2_FILE
    pq.write_table(_day(DAY2).slice(0, 0), empty)
    capsys.readouterr()
    assert main(_run_args(root, [str(empty)], DAY2, DAY2)) == 0
    assert "released 1 window(s)" in capsys.readouterr().out


def test_a_refused_first_run_leaves_nothing_behind(tmp_path, capsys):
    # It left a ledger and a key behind, so the fixed second try was no longer a first run.
    data = tmp_path / "in" / DAY1_FILE
    data.parent.mkdir()
    pq.write_table(_day(DAY1), data)
    root = tmp_path / "books" / "new"
    assert main(_run_args(root, [str(data)], DAY2, DAY2)) == 1
    assert not (tmp_path / "books").exists()
    assert main(_run_args(root, [str(data)], DAY1, DAY1)) == 0  # the fixed try runs as a first run
    assert {"ledger.duckdb", "ledger.noise.key", "releases.duckdb"} <= {p.name for p in root.iterdir()}


def test_a_run_refused_on_a_new_store_leaves_no_store_but_keeps_the_ledger(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    argv = _run_args(root, [str(root / DAY1_FILE)], DAY2, DAY2)
    argv[argv.index("--store") + 1] = str(tmp_path / "typo" / "releases.duckdb")
    assert main(argv) == 1
    assert not (tmp_path / "typo").exists() and _snapshot(root) == before


def test_a_dry_runs_progress_speaks_in_the_conditional(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    good = tmp_path / DAY2_FILE
    pq.write_table(_day(DAY2), good)
    argv = [a for a in _run_args(root, [str(good)], DAY2, DAY2) if a != "--quiet"]
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "[dry run] would commit the ledger" in err
    assert "[run]" not in err and "committed" not in err


def test_the_distributed_job_refuses_the_file_of_another_day_before_anything_is_written(tmp_path, capsys):
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.stream.noise import NoiseKey

    path = tmp_path / DAY1_FILE
    pq.write_table(_day(DAY1), path)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    out = tmp_path / "curator" / "run1"
    status = dist.main(["--input", str(path), "--start", DAY2.isoformat(), "--end", DAY2.isoformat(), "--epsilon",
                        "1", "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", "none", "--output",
                        str(out), "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key), "--quiet",
                        *flags(*DECLARED)])
    assert status != 0
    assert "no input holds window 20514 (2026-03-02), which this run would release" in capsys.readouterr().err
    assert not out.exists()
    assert not list((tmp_path / "public").glob("window_id=*"))


def test_the_distributed_jobs_refusal_never_depends_on_one_users_row(tmp_path, capsys):
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.stream.noise import NoiseKey

    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    outcomes = []
    for variant, path in zip(("without", "with"), _one_row_apart(tmp_path, DAY2, DAY2_FILE)):
        out = tmp_path / variant / "curator"
        capsys.readouterr()
        status = dist.main(["--input", str(path), "--start", DAY2.isoformat(), "--end", DAY2.isoformat(),
                            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", "none",
                            "--output", str(out), "--releases-parquet", str(tmp_path / variant / "public"),
                            "--noise-key", str(key), "--quiet", *flags(*DECLARED)])
        console = capsys.readouterr()
        scrub = lambda text: (text.replace(str(tmp_path / variant), "ROOT")
                              .replace(str(path), "INPUT"))
        import re
        attempt = lambda text: re.sub(r"attempt [0-9a-f]{12}", "attempt A", text)
        outcomes.append((status, attempt(scrub(console.out)), attempt(scrub(console.err)),
                         sorted(p.name for p in (tmp_path / variant / "public").glob("window_id=*"))))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == 0


def test_a_too_long_last_line_without_its_newline_is_a_dead_letter_not_lost(tmp_path):
    # The reader notes it after its last batch: drained only before each batch, it was never
    # dead-lettered, and the books said balanced (the attacker's second review, finding 5).
    from renyi_stream.pipelines.daily.job import JobConfig, run_job
    from renyi_stream.stream.engine import readers

    path = tmp_path / "long.csv"
    path.write_bytes(b"user_id,day,opened\n1,2026-03-02,1\n2,2026-03-02,0\n3,2026-03-02," +
                     b"1" * (readers.MAX_LINE_BYTES + 10))
    w = (DAY2 - dt.date(1970, 1, 1)).days
    summary = run_job(JobConfig(inputs=(str(path),), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                                epsilon=1.0, delta=1e-6, norm_budget=4.0, start_window=w, end_window=w, n_shards=2,
                                contract=contract(*DECLARED)))
    assert (summary.rows_read, summary.admitted + summary.dropped, summary.rejected) == (3, 2, 1)
    assert summary.balanced


# --------------------------------------------------------------------------- see before you publish


def test_a_dry_run_says_what_the_run_would_do_and_changes_nothing(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    good = tmp_path / "day2.parquet"
    pq.write_table(_day(DAY2), good)
    capsys.readouterr()
    argv = [a for a in _run_args(root, [str(good)], DAY2, DAY2) if a != "--quiet"]
    assert main([*argv, "--dry-run", "--releases-parquet", str(tmp_path / "public")]) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 1 window(s) (0 already released), 1 release rows for 1 query: sum:opened" in out
    assert "would read 3 rows = admitted 3" in out and "nothing was charged or published" in out
    assert _snapshot(root) == before and not (tmp_path / "public").exists()
    assert main(argv) == 0  # the real run after it charges as if the preview had never been
    assert "released 1 window(s)" in capsys.readouterr().out


def test_a_dry_run_refuses_what_the_run_would_refuse(released_day, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(released_day, root)
    before = _snapshot(root)
    assert main([*_run_args(root, [str(root / DAY1_FILE)], DAY2, DAY2), "--dry-run"]) == 1
    assert "no input holds window 20514 (2026-03-02)" in capsys.readouterr().err
    assert _snapshot(root) == before


def test_a_dry_run_on_a_new_ledger_creates_no_file(tmp_path, capsys):
    good = tmp_path / "day1.parquet"
    pq.write_table(_day(DAY1), good)
    root = tmp_path / "new"
    root.mkdir()
    assert main([*_run_args(root, [str(good)], DAY1, DAY1), "--dry-run"]) == 0
    assert sorted(p.name for p in root.iterdir()) == []


def test_the_distributed_jobs_dry_run_says_what_it_would_do_and_writes_nothing_real(tmp_path, capsys):
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.stream.noise import NoiseKey

    path = tmp_path / "day2.parquet"
    pq.write_table(_day(DAY2), path)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    argv = ["--input", str(path), "--start", DAY2.isoformat(), "--end", DAY2.isoformat(), "--epsilon", "1",
            "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", "none", "--output", str(tmp_path / "run1"),
            "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key), *flags(*DECLARED)]
    capsys.readouterr()
    assert dist.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 1 window(s) for 1 query: sum:opened" in out
    assert "would read 3 rows = admitted 3" in out and "nothing was charged or published" in out
    assert not (tmp_path / "run1").exists() and not (tmp_path / "public").exists()
    assert dist.main([*argv, "--quiet"]) == 0  # the real run after it, as if the preview had never been
    assert (tmp_path / "run1" / dist.COMMITTED).exists()


def test_the_distributed_jobs_dry_run_refuses_what_the_run_would_refuse(tmp_path, capsys):
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.stream.noise import NoiseKey

    path = tmp_path / DAY1_FILE
    pq.write_table(_day(DAY1), path)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    assert dist.main(["--input", str(path), "--start", DAY2.isoformat(), "--end", DAY2.isoformat(), "--epsilon", "1",
                      "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", "none", "--output",
                      str(tmp_path / "run1"), "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key),
                      "--dry-run", *flags(*DECLARED)]) != 0
    assert "no input holds window 20514 (2026-03-02)" in capsys.readouterr().err
    assert not (tmp_path / "run1").exists() and not (tmp_path / "public").exists()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _distributed_day(tmp_path: Path, day: dt.date, previous: str, output: str) -> list[str]:
    from renyi_stream.stream.noise import NoiseKey

    path = tmp_path / f"{day}.parquet"
    pq.write_table(_day(day), path)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    return ["--input", str(path), "--start", day.isoformat(), "--end", day.isoformat(), "--epsilon", "1",
            "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", previous, "--output", str(tmp_path / output),
            "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key), *flags(*DECLARED)]


def test_the_distributed_jobs_dry_run_of_a_continuing_run_previews_it_and_writes_nothing_real(tmp_path, capsys):
    """The ledger records the root it answers into; the preview answers into a scratch copy of it
    and must still pass the check the real run passes."""
    from renyi_stream.pipelines.distributed import job as dist

    assert dist.main(_distributed_day(tmp_path, DAY1, "none", "run1")) == 0
    before = {name: _tree(tmp_path / name) for name in ("public", "run1")}
    capsys.readouterr()
    day2 = _distributed_day(tmp_path, DAY2, str(tmp_path / "run1"), "run2")
    assert dist.main([*day2, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 1 window(s)" in out and "would read 3 rows = admitted 3" in out
    assert {name: _tree(tmp_path / name) for name in ("public", "run1")} == before
    assert not (tmp_path / "run2").exists()
    assert dist.main(day2) == 0  # the real run after it, as if the preview had never been
    assert (tmp_path / "run2" / dist.COMMITTED).exists()


def test_the_distributed_jobs_dry_run_refuses_a_previous_ledger_of_another_root_as_the_run_does(tmp_path, capsys):
    from renyi_stream.pipelines.distributed import job as dist

    assert dist.main(_distributed_day(tmp_path, DAY1, "none", "run1")) == 0
    day2 = _distributed_day(tmp_path, DAY2, str(tmp_path / "run1"), "run2")
    elsewhere = [*day2, "--releases-parquet", str(tmp_path / "other-public")]
    capsys.readouterr()
    assert dist.main(elsewhere) == 2
    real = capsys.readouterr().err
    assert dist.main([*elsewhere, "--dry-run"]) == 2
    assert "a ledger answers into the release root it was started with" in real
    assert "a ledger answers into the release root it was started with" in capsys.readouterr().err


def test_a_dry_run_on_another_runner_than_the_direct_runner_is_refused_before_anything_runs(tmp_path, capsys):
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.pipelines.streaming.beam import job as sj

    day1 = _distributed_day(tmp_path, DAY1, "none", "run1")
    assert dist.main([*day1, "--dry-run", "--runner=FlinkRunner"]) == 2
    assert "a dry run runs here, on the DirectRunner, got --runner=FlinkRunner" in capsys.readouterr().err
    replay = ["--replay", str(tmp_path / f"{DAY1}.parquet"), *day1[2:]]
    replay = [a for a in replay if a not in ("--previous-ledger", "none")]
    assert sj.main([*replay, "--output", str(tmp_path / "s"), "--dry-run", "--runner=FlinkRunner"]) == 2
    assert "a dry run runs here, on the DirectRunner, got --runner=FlinkRunner" in capsys.readouterr().err
    assert not (tmp_path / "run1").exists() and not (tmp_path / "s").exists() and not (tmp_path / "public").exists()
