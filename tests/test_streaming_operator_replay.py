"""A replay is files the operator names: the streaming job refuses what the daily job refuses, before
anything is public, counts a message delivered twice twice, and previews a restart (issue 37).

* A replayed file that does not hold the declared contract (a misspelt column in its header) or is
  not in its format is refused at launch, in one line naming the file and the column, with the
  daily job's check (:func:`renyi_stream.stream.engine.readers.check_declared_schema`): it is never
  one ``undecodable_message`` dead letter with its day published from nothing. A live source's
  such message stays one dead letter, and the end of a run says, for the curator, how many
  messages were dead-lettered and why.
* A file given twice is two deliveries: 8 rows read, 4 admitted, 4 ``duplicate_user_window``,
  balanced, as the daily job counts a file given twice.
* ``--dry-run`` of a restart copies the state folder privately (0600 files, 0700 folders), so it
  previews the restart instead of refusing its own copy; a refusal names what is really wrong.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.streaming import books as streaming_books
from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.codec import encode_message
from renyi_stream.pipelines.streaming.dry_run import _private_copy
from renyi_stream.pipelines.streaming.replay import replay_names, replay_numbers
from renyi_stream.pipelines.streaming.state_folder import STATE_FILE, commit_marker_path
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE
from test_streaming_job import DECLARED, W0, _rows


def _argv(tmp_path: Path, files: list, *extra: str, end: str = "2026-03-02") -> list[str]:
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    return ["stream", "--replay", *map(str, files), *DECLARED, "--start", "2026-03-01", "--end", end,
            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "10", "--previous-ledger", "none",
            "--releases-parquet", str(tmp_path / "public"), "--output", str(tmp_path / "curator"),
            "--noise-key", str(key), "--shards", "2", *extra]


def _day(tmp_path: Path, day: int, users=(1, 2, 3, 4), name: str | None = None) -> Path:
    path = tmp_path / "input" / (name or f"day={dt.date(2026, 3, 1 + day)}.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_rows(day, list(users), seed=2), path)
    return path


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- a replay refuses what the daily job refuses ---------------------------------------------------

def _misspelt(tmp_path: Path, kind: str) -> Path:
    """Day 1's file with its declared column ``opened`` written ``opend``, as ``kind``."""
    table = _rows(1, [1, 2, 3], seed=2).rename_columns(["user_id", "day", "opend", "bought"])
    path = tmp_path / "input" / f"day=2026-03-02.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    else:
        path.write_bytes(encode_message(table))
    return path


@pytest.mark.parametrize("kind", ["parquet", "csv", "arrows"])
def test_a_replayed_file_without_a_declared_column_is_refused_naming_file_and_column_before_anything_is_public(
        tmp_path, capsys, kind):
    good = _day(tmp_path, 0)
    bad = _misspelt(tmp_path, kind)
    assert main(_argv(tmp_path, [good, bad])) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert str(bad) in err and "'opened'" in err and "lacks the declared column" in err
    assert not (tmp_path / "public").exists() and not (tmp_path / "curator").exists()


@pytest.mark.parametrize("name, payload", [("day.arrows", b"not arrow at all"),
                                           ("day=2026-03-02.arrow", b"user_id,day,opened,bought\n1,2026-03-02,1,0\n"),
                                           ("day=2026-03-02", b"\x00" * 40)],
                         ids=["garbage-message", "csv-named-arrow", "no-extension"])
def test_a_replayed_file_not_in_its_format_is_refused_naming_it_before_anything_is_public(tmp_path, capsys, name,
                                                                                          payload):
    good = _day(tmp_path, 0)
    bad = tmp_path / "input" / name
    bad.write_bytes(payload)
    assert main(_argv(tmp_path, [good, bad])) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"--replay: {bad} is not a file the daily job reads" in err, err
    assert not (tmp_path / "public").exists() and not (tmp_path / "curator").exists()


def test_a_replayed_message_without_a_time_column_is_refused_naming_it(tmp_path, capsys):
    path = tmp_path / "input" / "day.arrows"
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_message(_rows(0, [1, 2], seed=2).rename_columns(["user_id", "date", "opened", "bought"])))
    assert main(_argv(tmp_path, [path])) == 2
    err = capsys.readouterr().err
    assert f"--replay: replayed message {path}: batch has no time column" in err, err
    assert not (tmp_path / "public").exists()


def test_the_end_of_a_run_says_for_the_curator_how_many_messages_were_dead_lettered_and_why(tmp_path, capsys):
    nan = tmp_path / "input" / "nan.arrows"
    nan.parent.mkdir(parents=True)
    nan.write_bytes(encode_message(_rows(1, [7, 8], seed=2).set_column(2, "opened", pa.array([float("nan"), 1.0]))))
    day = _day(tmp_path, 0)
    assert main(_argv(tmp_path, [day, day, nan])) == 0
    err = capsys.readouterr().err.splitlines()
    summary = err[err.index(CURATOR_ONLY_NOTICE):]
    assert summary[1] == "rows read 10 = admitted 5 + clipped 0 + dropped 0 + rejected 5 + late 0  [balanced]"
    assert summary[2:] == ["messages read 3; 2 of them dead-lettered whole or in part, by reason:",
                           "  duplicate_user_window: 4 row(s) of 1 message(s)",
                           "  non_finite_value: 1 row(s) of 1 message(s)"]


def test_with_quiet_the_end_of_a_run_prints_no_count(tmp_path, capsys):
    day = _day(tmp_path, 0)
    assert main(_argv(tmp_path, [day, day], "--quiet")) == 0
    err = capsys.readouterr().err
    assert CURATOR_ONLY_NOTICE not in err and "rows read" not in err and "dead-lettered" not in err


def test_a_live_sources_undecodable_messages_are_dead_letters_the_end_of_its_run_counts_whole(
        tmp_path, capsys, monkeypatch):
    """A Kafka record that is not Arrow stays one ``undecodable_message`` dead letter (a stream
    cannot be checked before it runs), and the end of the run counts it as a message
    dead-lettered whole. The records come from a ``TestStream`` in place of ReadFromKafka."""
    from apache_beam.coders import RowCoder
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.timestamp import Timestamp
    from test_streaming_kafka import RECORD_SCHEMA, _day_start_millis, _kafka, _record

    records = [_record(b"not arrow at all", partition=2, offset=41, millis=_day_start_millis(0)),
               _record(b"nor this", partition=2, offset=42, millis=_day_start_millis(0)),
               _record(encode_message(_rows(0, [1, 2], seed=2)), partition=0, offset=0, millis=_day_start_millis(0))]

    def read_kafka(p, args):
        return p | "Records" >> TestStream(coder=RowCoder(RECORD_SCHEMA)).add_elements(
            [TimestampedValue(r, Timestamp(micros=r.timestamp * 1000)) for r in records]).advance_watermark_to_infinity()

    monkeypatch.setattr(sj, "_read_kafka", read_kafka)
    assert main(["stream", *_kafka(tmp_path), "--streaming"]) == 0
    err = capsys.readouterr().err.splitlines()
    summary = err[err.index(CURATOR_ONLY_NOTICE):]
    assert summary[1].startswith("rows read 4 = ") and summary[1].endswith("+ rejected 2 + late 0  [balanced]")
    assert summary[2:] == ["messages read 3; 2 of them dead-lettered whole or in part, by reason:",
                           "  undecodable_message: 2 message(s), each dead-lettered whole"]


# --- a message delivered twice is counted twice --------------------------------------------------

def test_a_file_given_twice_is_read_twice_and_its_second_copy_dead_lettered_so_the_books_balance(tmp_path):
    day = _day(tmp_path, 0)
    assert main(_argv(tmp_path, [day, day], end="2026-03-01")) == 0
    books = streaming_books.books(str(tmp_path / "curator"))
    assert (books["rows_read"], books["admitted"], books["rejected"], books["balanced"]) == (8, 4, 4, True)
    dead = pa.concat_tables([pq.read_table(f) for f in (tmp_path / "curator" / "dead").rglob("*.parquet")])
    assert set(dead.column("reason").to_pylist()) == {"duplicate_user_window"}
    assert set(dead.column("source").to_pylist()) == {f"{day} (again, --replay file 2)"}  # the second delivery's


def test_the_message_names_of_a_replay_name_each_delivery_once():
    assert replay_names(["a", "b", "a", "a"]) == ["a", "b", "a (again, --replay file 3)",
                                                  "a (again, --replay file 4)"]
    assert replay_numbers(["a", "b", "a"]) == {"a": 0, "b": 1, "a (again, --replay file 3)": 2}
    tricky = ["a", "a (again, --replay file 3)", "a"]  # a file really named as a delivery would be
    assert len(set(replay_names(tricky))) == 3


# --- the dry run of a restart -------------------------------------------------------------------

def _stopped_after_day_one(tmp_path) -> list[str]:
    """The command line of a two-day job that committed and published day 1 only (it was lost
    before day 2's marker): what a restart, and its dry run, continue."""
    argv = _argv(tmp_path, [_day(tmp_path, 0), _day(tmp_path, 1, users=(3, 4, 5))])
    assert main(argv) == 0
    Path(commit_marker_path(str(tmp_path / "curator"), W0 + 1)).unlink()
    (tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet").unlink()
    return argv


def test_the_dry_run_of_a_restart_previews_the_restart_and_writes_nothing_real(tmp_path, capsys, umask_022):
    argv = _stopped_after_day_one(tmp_path)
    before = {name: _tree(tmp_path / name) for name in ("public", "curator")}
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 1 window(s) for 2 queries" in out, out
    assert {name: _tree(tmp_path / name) for name in ("public", "curator")} == before
    assert main(argv) == 0  # the restart itself: the window the preview said
    assert sorted(p.name for p in (tmp_path / "public").glob("window_id=*")) == [f"window_id={W0}",
                                                                                 f"window_id={W0 + 1}"]


def test_the_dry_runs_copy_of_the_state_folder_is_0600_in_0700_folders_under_umask_022(tmp_path, umask_022,
                                                                                       not_private):
    _stopped_after_day_one(tmp_path)
    copy = tmp_path / "scratch" / "output"
    assert _private_copy(str(tmp_path / "curator"), copy)
    assert _tree(copy) == _tree(tmp_path / "curator") and not_private(copy) == {}


def test_the_dry_run_of_a_restart_refuses_a_loose_state_file_naming_the_real_file_and_its_mode(tmp_path, capsys):
    argv = _stopped_after_day_one(tmp_path)
    state = tmp_path / "curator" / STATE_FILE
    os.chmod(state, 0o644)
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{state} is accessible to group/others (mode 0644)" in err and "renyi-preview-" not in err
    assert stat.S_IMODE(state.stat().st_mode) == 0o644 and json.loads(state.read_text())["job"]
