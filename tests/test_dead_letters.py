"""Dead letters have one vocabulary and one builder (issue 19, item 1): every reason is spelled
once, in :class:`renyi_stream.stream.schema.DeadLetterReason`, and every job writes its dead letters through
:func:`renyi_stream.stream.engine.dead_letters.dead_letters`."""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
from pathlib import Path

import apache_beam as beam
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.beam.rows import in_event_time_order
from renyi_stream.stream.engine.dead_letters import (DEAD_LETTER_SCHEMA, ROW, SOURCE, classify_windows, dead_letters, window_letters,
                                        with_input_position)
from renyi_stream.stream.engine.readers import read_batches
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.schema import DeadLetterReason, WindowSpec

from declared import contract

ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = {reason.value for reason in DeadLetterReason}


def _statement_strings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own (docstrings): prose that
    may name a reason, never a value the code compares or writes."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _vocabulary_members(tree: ast.AST) -> set[int]:
    """ids of the constants inside ``class DeadLetterReason``: the one place reasons are spelled."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "DeadLetterReason"
            for inner in ast.walk(node)}


def _reason_literals(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _statement_strings(tree) | _vocabulary_members(tree)
    quoted = re.compile(r"""['"](%s)['"]""" % "|".join(sorted(VOCABULARY)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # The reason itself, or quoted inside a longer string (an SQL literal).
            if node.value in VOCABULARY or quoted.search(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_dead_letter_reason_is_spelled_outside_its_vocabulary():
    files = sorted(p for folder in ("pipelines", "stream") for p in (ROOT / folder).rglob("*.py"))
    found = [hit for path in files for hit in _reason_literals(path)]
    assert found == [], "use renyi_stream.stream.schema.DeadLetterReason instead of spelling a reason: " + "; ".join(found)


def test_the_scan_finds_a_reason_spelled_in_code_and_in_sql(tmp_path):
    # The rule above must be able to fail: a reason compared in code or inside SQL is found.
    path = tmp_path / "probe.py"
    path.write_text('"""Docs may say late_window."""\n'
                    'LATE = "late_window"\n'
                    'SQL = "SELECT count(*) FROM dead_letters WHERE reason = \'malformed_row\'"\n')
    assert [hit.split(": ", 1)[0] for hit in _reason_literals(path, tmp_path)] == ["probe.py:2", "probe.py:3"]


def test_every_reason_is_documented_with_its_meaning_and_where_it_comes_from():
    import renyi_stream.stream.engine.dead_letters as engine

    for reason in DeadLetterReason:
        assert f"``{reason.value}``" in DeadLetterReason.__doc__, reason
        assert f"``{reason.value}``" in engine.__doc__, reason


def test_the_reason_values_are_the_words_stored_dead_letters_already_hold():
    assert sorted(VOCABULARY) == sorted([
        "null_user_id", "empty_user_id", "null_time", "bad_time", "null_value", "wrong_type", "non_finite_value",
        "out_of_range_time", "duplicate_user_window", "malformed_row", "late_window", "undecodable_message",
        "outside_file_days"])


def test_the_builder_broadcasts_single_values_over_the_rows_it_is_given():
    table = dead_letters(DeadLetterReason.MALFORMED_ROW, source="day.csv", row_index=-1,
                         detail=["line 3", "line 7"], raw=["a,b,c", "d"])
    assert table.schema == DEAD_LETTER_SCHEMA
    assert table.to_pylist() == [
        {"source": "day.csv", "row_index": -1, "reason": "malformed_row", "detail": "line 3", "raw": "a,b,c"},
        {"source": "day.csv", "row_index": -1, "reason": "malformed_row", "detail": "line 7", "raw": "d"}]


def test_the_builder_writes_one_row_when_every_value_is_single():
    table = dead_letters(DeadLetterReason.UNDECODABLE_MESSAGE, source="topic/0/4", row_index=-1,
                         detail="not an Arrow IPC stream", raw="6e6f")
    assert table.column("reason").to_pylist() == ["undecodable_message"] and table.num_rows == 1


def test_the_builder_writes_integer_sources_as_text():
    table = dead_letters(DeadLetterReason.DUPLICATE, source=pa.array([0, 2], type=pa.int64()),
                         row_index=pa.array([5, 1], type=pa.int64()), detail="came second", raw=["{}", "{}"])
    assert table.column("source").to_pylist() == ["0", "2"]


@pytest.mark.parametrize("reason", ["late_window", pa.array(["late_window", "late"]), pa.array([None], pa.string())])
def test_the_builder_refuses_a_reason_outside_the_vocabulary_or_spelled_as_a_plain_string(reason):
    with pytest.raises(ValueError, match="reason"):
        dead_letters(reason, source="f", row_index=0, detail="d", raw="r")


def test_the_builder_refuses_columns_of_different_lengths():
    with pytest.raises(ValueError, match="lengths"):
        dead_letters(DeadLetterReason.LATE_WINDOW, source="f", row_index=[1, 2], detail=["a"], raw="r")


# --------------------------------------------------------------------------- one window classification

W0 = (dt.date(2026, 3, 1) - dt.date(1970, 1, 1)).days


def _classes(windows, **kwargs):
    found = classify_windows(np.array(windows, dtype=np.int64), **kwargs)
    return list(zip(found.late.tolist(), found.out_of_schedule.tolist()))


def test_a_row_of_a_window_charged_by_an_earlier_run_is_late():
    assert _classes([W0 + 1, W0 + 2], start_window=W0, end_window=W0 + 3, charged=[W0 + 1]) == [
        (True, False), (False, False)]


def test_a_row_of_a_window_this_streaming_shard_already_charged_is_late():
    assert _classes([W0, W0 + 1, W0 + 2], start_window=W0, end_window=W0 + 3, charged_through=W0 + 1) == [
        (True, False), (True, False), (False, False)]


def test_a_row_outside_the_schedule_and_never_charged_is_out_of_schedule_on_either_side():
    assert _classes([W0 - 1, W0, W0 + 3, W0 + 4], start_window=W0, end_window=W0 + 3) == [
        (False, True), (False, False), (False, False), (False, True)]


def test_a_row_of_a_window_charged_before_the_schedule_is_late_not_out_of_schedule():
    # An earlier run's window is before this run's schedule too: it was charged, so it is late.
    assert _classes([W0 - 1], start_window=W0, end_window=W0 + 3, charged=(W0 - 1,)) == [(True, False)]


def test_classifying_refuses_a_schedule_that_ends_before_it_starts():
    with pytest.raises(ValueError, match=r"end_window must be >= start_window"):
        classify_windows(np.array([W0]), start_window=W0, end_window=W0 - 1)


def test_window_letters_give_each_row_its_reason_window_and_input_position():
    rows = pa.table({"user_id": pa.array([7, 8], pa.int64()), "window_id": pa.array([W0 - 1, W0 + 9], pa.int64()),
                     "opened": [1.0, 0.0], SOURCE: pa.array([2, 2], pa.int64()), ROW: pa.array([4, 5], pa.int64())})
    classes = classify_windows(rows.column("window_id"), start_window=W0, end_window=W0 + 1, charged=[W0 - 1])
    letters = window_letters(rows, classes).to_pylist()
    assert [(r["source"], r["row_index"], r["reason"]) for r in letters] == [
        ("2", 4, "late_window"), ("2", 5, "out_of_range_time")]
    assert letters[0]["detail"] == f"window {W0 - 1} was already charged"
    assert letters[1]["detail"] == f"window {W0 + 9} is outside the schedule {W0}..{W0 + 1}"
    assert json.loads(letters[0]["raw"]) == {"user_id": 7, "window_id": W0 - 1, "opened": 1.0}


def _positioned(name: str, number: int, users: list[int], rows: list[int]) -> pa.Table:
    table = pa.table({"user_id": pa.array(users, pa.int64()), "window_id": pa.array([W0] * len(users), pa.int64()),
                      "opened": [1.0] * len(users)})
    return with_input_position(table, source=number, name=name, row_index=np.array(rows))


def test_a_dead_letter_names_its_rows_input_by_the_name_the_rows_carry():
    rows = _positioned("in/day-1.parquet", 3, [7, 8], [4, 9])
    classes = classify_windows(rows.column("window_id"), start_window=W0 + 1, end_window=W0 + 2)
    letters = window_letters(rows.take([1, 0]), classes).to_pylist()  # a take keeps the names
    assert [(r["source"], r["row_index"]) for r in letters] == [("in/day-1.parquet", 9), ("in/day-1.parquet", 4)]
    assert json.loads(letters[0]["raw"]) == {"user_id": 8, "window_id": W0, "opened": 1.0}  # no position


def test_a_duplicate_found_across_inputs_is_named_by_its_own_input_not_the_first_one():
    # Arrow's concatenation of the two inputs' rows keeps the first table's schema metadata only.
    first, later = _positioned("topic/0/17", 5, [7, 8], [0, 1]), _positioned("topic/1/3", 9, [8], [0])
    kept, duplicates = in_event_time_order([first, later])
    assert kept.column(SOURCE).to_pylist() == [5, 5]
    assert [(r["source"], r["row_index"], r["reason"]) for r in duplicates.to_pylist()] == [
        ("topic/1/3", 0, "duplicate_user_window")]


# --------------------------------------------------------------------------- the same word in every job


def _day(offset: int) -> str:
    return (dt.date(2026, 3, 1) + dt.timedelta(days=offset)).isoformat()


#: One situation per user id (day offsets from W0); the schedule is W0 + 1 .. W0 + 2.
SITUATIONS = {
    1: ("out_of_range_time", f"1,{_day(0)},1,0"),  # before the schedule, never charged
    2: ("out_of_range_time", f"2,{_day(5)},1,0"),  # after the schedule
    3: ("non_finite_value", f"3,{_day(1)},nan,0"),  # fails the schema
    4: ("duplicate_user_window", f"4,{_day(1)},1,0\n4,{_day(1)},0,1"),  # twice in one input
    5: ("duplicate_user_window", f"5,{_day(1)},1,0"),  # and again in the second input
}
SECOND_INPUT = f"user_id,day,opened,bought\n5,{_day(1)},0,1\n6,{_day(2)},1,1\n"
MALFORMED = f"7,{_day(1)},1"  # one field short: a CSV line that does not split


def _first_input(*, malformed: bool) -> str:
    lines = [line for _, line in SITUATIONS.values()] + ([MALFORMED] if malformed else []) + [f"8,{_day(2)},1,1"]
    return "user_id,day,opened,bought\n" + "\n".join(lines) + "\n"


def _by_situation(dead: pa.Table) -> dict:
    """``user id (as text) -> reasons`` of the dead letters (a malformed line or message under its
    raw text). A row the validator rejects keeps its id as read (a CSV's is text), one rejected
    later its parsed id."""
    found: dict = {}
    for row in dead.to_pylist():
        try:
            who = str(json.loads(row["raw"])["user_id"])
        except (ValueError, TypeError, KeyError):
            who = row["raw"]
        found.setdefault(who, []).append(row["reason"])
    return {who: sorted(reasons) for who, reasons in found.items()}


EXPECTED = {str(user): [reason] for user, (reason, _) in SITUATIONS.items()}


def test_the_daily_job_gives_each_situation_its_reason(tmp_path):
    from renyi_stream.pipelines.daily.job import JobConfig, run_job

    (tmp_path / "a.csv").write_text(_first_input(malformed=True))
    (tmp_path / "b.csv").write_text(SECOND_INPUT)
    run_job(JobConfig(inputs=(str(tmp_path / "a.csv"), str(tmp_path / "b.csv")), store=str(tmp_path / "s.duckdb"),
                      ledger=str(tmp_path / "l.duckdb"), epsilon=1.0, delta=1e-6, norm_budget=4.0,
                      start_window=W0 + 1, end_window=W0 + 2, n_shards=2, contract=contract("int64", "opened=0:1", "bought=0:1")))
    db = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    try:
        dead = db.execute("SELECT reason, raw FROM dead_letters").arrow().read_all()
    finally:
        db.close()
    assert _by_situation(dead) == {**EXPECTED, MALFORMED: ["malformed_row"]}


def test_the_distributed_job_gives_each_situation_the_same_reason(tmp_path):
    from renyi_stream.pipelines.distributed import job as dist

    (tmp_path / "a.csv").write_text(_first_input(malformed=True))
    (tmp_path / "b.csv").write_text(SECOND_INPUT)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    out = tmp_path / "curator"
    assert dist.main(["--input", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--id-type", "int64", "--start", _day(1),
                      "--end", _day(2), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4",
                      "--column", "opened=0:1", "--column", "bought=0:1", "--previous-ledger", "none",
                      "--output", str(out),
                      "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key), "--shards", "2",
                      "--quiet"]) == 0
    dead = pa.concat_tables([pq.read_table(f) for f in (out / "dead").glob("*.parquet")])
    assert _by_situation(dead) == {**EXPECTED, MALFORMED: ["malformed_row"]}


def test_the_streaming_job_gives_each_situation_the_same_reason(tmp_path):
    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.codec import encode_message

    # The same rows as Arrow messages, as the batch jobs' reader reads them (a stream has no CSV
    # lines; a live source's message that is not Arrow is its one undecodable_message letter, while
    # a replayed file that is not one is refused at launch, as the daily job refuses it: issue 37).
    paths = []
    for name, text in (("a", _first_input(malformed=False)), ("b", SECOND_INPUT)):
        (tmp_path / f"{name}.csv").write_text(text)
        paths.append(tmp_path / f"{name}.arrows")
        paths[-1].write_bytes(encode_message(pa.Table.from_batches(list(read_batches(tmp_path / f"{name}.csv")))))
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    assert sj.main(["--replay", *map(str, paths), "--column", "opened=0:1", "--column", "bought=0:1",
                    "--id-type", "int64", "--start", _day(1),
                    "--end", _day(2), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4",
                    "--releases-parquet", str(tmp_path / "public"), "--output", str(tmp_path / "curator"),
                    "--noise-key", str(key), "--shards", "2"]) == 0
    # rglob: a window's duplicates lie under dead/window_id=<W>/, committed with that window.
    dead = pa.concat_tables([pq.read_table(f) for f in (tmp_path / "curator" / "dead").rglob("*.parquet")])
    # A Kafka record or Pub/Sub message that is not Arrow, through the step every source shares.
    decode = sj.DecodeAndValidate(window=WindowSpec(), indicator_columns=["opened", "bought"], id_type="int64")
    (undecodable,) = [o.value for o in decode.process(("indicators/0/3", b"not arrow at all"))
                      if isinstance(o, beam.pvalue.TaggedOutput) and o.tag == "dead"]
    assert _by_situation(pa.concat_tables([dead, undecodable])) == {
        **EXPECTED, b"not arrow at all".hex(): ["undecodable_message"]}


def test_a_late_row_is_late_window_in_the_batch_reader_and_in_the_streaming_filter(tmp_path):
    # Lateness needs a window charged before: the batch jobs learn it from their earlier runs
    # (``released``), a streaming shard from earlier runs and from its own charges.
    from renyi_stream.pipelines.beam import transforms as tx
    from renyi_stream.pipelines.streaming.beam.releases import StreamingIndividualFilterDoFn
    from renyi_stream.queries.linear import default_queries
    from renyi_stream.stream.engine.shard_state import QueryPlan
    from test_streaming import _Bag, _row_bags, _Timer, _Value

    path = tmp_path / "late.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 3], pa.int64()),
                             "day": pa.array([dt.date(2026, 3, 1) + dt.timedelta(days=d) for d in (0, -3, 9)],
                                             pa.date32()),
                             "opened": [1.0, 1.0, 1.0]}), path)
    outputs = list(tx.ReadAndValidate(window=WindowSpec(), start_window=W0 + 1, end_window=W0 + 2, released=[W0],
                                      indicator_columns=["opened"]).process((0, str(path))))
    batch = pa.concat_tables([o.value for o in outputs if getattr(o, "tag", None) == "dead"])
    (valid,) = [o for o in tx.ReadAndValidate(window=WindowSpec(), start_window=W0 - 5, end_window=W0 + 20,
                                              released=[], indicator_columns=["opened"]).process((0, str(path)))
                if not isinstance(o, beam.pvalue.TaggedOutput)]
    fn = StreamingIndividualFilterDoFn(
        plan=QueryPlan.starting_at(default_queries(["opened"]), W0 + 1), window=WindowSpec(), start_window=W0 + 1,
        end_window=W0 + 2, indicator_columns=["opened"], noise_std=2.0, policy="drop", budget=1.0, id_type="int64",
        tracker_step=1 / 32, released=[W0])
    state = dict(**_row_bags(), state=_Bag(), charged=_Value(), books=_Value(), window_end=_Timer())
    streamed = pa.concat_tables([o.value for o in fn.process((0, ("rows", valid)), **state)])
    expected = {"1": ["late_window"], "2": ["out_of_range_time"], "3": ["out_of_range_time"]}
    assert _by_situation(batch) == _by_situation(streamed) == expected
