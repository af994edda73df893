"""Issue 28, end to end through `renyi-stream run` (real Beam DirectRunner, real files, real
DuckDB): a row's meaning never depends on other rows' spelling or bytes, and the declaration
the ledger keeps decides the columns, the id type and the default queries."""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _day(offset: int) -> str:
    return (DAY0 + dt.timedelta(days=offset)).isoformat()


def _run(tmp_path, inputs, *declare: str, start: int = 0, end: int | None = None, budget: str = "8",
         name: str = "a") -> int:
    end = start if end is None else end
    return main(["run", "--input", *map(str, inputs), "--store", str(tmp_path / f"{name}.releases.duckdb"),
                 "--ledger", str(tmp_path / f"{name}.ledger.duckdb"), "--start", _day(start), "--end", _day(end),
                 "--epsilon", "1", "--delta", "1e-6", "--norm-budget", budget, "--shards", "2", *declare])


def _query(path, sql: str) -> list[tuple]:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _curator(tmp_path, sql: str, name: str = "a") -> list[tuple]:
    return _query(tmp_path / f"{name}.ledger.duckdb", sql)


def _catalogue(tmp_path, name: str = "a") -> list[tuple]:
    return _query(tmp_path / f"{name}.releases.duckdb", "SELECT query_id, spec_json FROM query_registry ORDER BY query_id")


def _releases(tmp_path, name: str = "a") -> list[tuple]:
    return _query(tmp_path / f"{name}.releases.duckdb",
                  "SELECT query_id, window_id FROM releases ORDER BY query_id, window_id")


def _csv(path, lines: list[str], header: str = "user_id,day,opened") -> str:
    path.write_bytes((header + "\n" + "\n".join(lines) + "\n").encode("utf-8"))
    return str(path)


# --- 1. one person, one budget --------------------------------------------------------------------


def test_a_text_id_that_looks_like_an_integer_is_one_person_whatever_the_other_ids_look_like(tmp_path):
    # Day 0's ids all look like integers, day 1's do not: "042" must be one account either way
    # (read as 42 on day 0, the attacker's review found two accounts at 90% of the budget each).
    day0 = _csv(tmp_path / "d0.csv", [f"042,{_day(0)},1", f"7,{_day(0)},1"])
    day1 = _csv(tmp_path / "d1.csv", [f"042,{_day(1)},1", f"alice,{_day(1)},1"])
    declare = ("--id-type", "string", "--column", "opened=0:1")
    assert _run(tmp_path, [day0], *declare, start=0) == 0
    assert _run(tmp_path, [day1], start=1) == 0  # continues the recorded contract
    used = dict(_curator(tmp_path, "SELECT user_id, used FROM ledger"))
    assert set(used) == {"042", "7", "alice"}
    assert used["042"] == pytest.approx(2 * used["7"])  # both days in one account


def _recorded_before_contracts(tmp_path, id_type: str, name: str = "a") -> None:
    """The record an older version (before declared contracts) wrote on a ledger's first run, by
    hand: the promise, the id type it took from its first input (a CSV's: ``string``), the key
    beside the ledger (``<ledger>.noise.key``, where ``renyi-stream run`` looks), no columns."""
    from renyi_stream.pipelines.curator.store import CuratorStore
    from renyi_stream.stream.engine.ledger_config import LedgerConfig
    from renyi_stream.stream.noise import NoiseKey

    ledger = tmp_path / f"{name}.ledger.duckdb"
    key = NoiseKey.load_or_create(ledger.with_name(ledger.stem + ".noise.key"))
    with CuratorStore(ledger) as store:
        store.check_or_record_parameters(LedgerConfig.from_promise(
            epsilon=1.0, delta=1e-6, norm_budget=8.0, id_type=id_type, key_fingerprint=key.fingerprint, n_shards=2))
        assert store.parameters().contract is None


def test_a_csvs_ids_are_text_on_a_ledger_that_declares_no_id_type(tmp_path):
    # A ledger recorded before contracts (the only ledger a run may continue without declaring
    # one, under the older rule): its CSV ids are still text, "042" and "42" two people.
    _recorded_before_contracts(tmp_path, "string")
    day0 = _csv(tmp_path / "d0.csv", [f"042,{_day(0)},1", f"42,{_day(0)},1"])
    assert _run(tmp_path, [day0]) == 0
    assert sorted(u for (u,) in _curator(tmp_path, "SELECT user_id FROM ledger")) == ["042", "42"]


def test_a_new_ledger_without_a_declaration_is_refused_naming_the_options_and_its_next_run_needs_none(tmp_path,
                                                                                                     capsys):
    day0 = _csv(tmp_path / "d0.csv", [f"1,{_day(0)},1", f"2,{_day(0)},0"])
    day1 = _csv(tmp_path / "d1.csv", [f"1,{_day(1)},1"])
    assert _run(tmp_path, [day0]) == 1
    err = capsys.readouterr().err
    assert "--id-type" in err and "--column" in err and "is new" in err and "Traceback" not in err, err
    assert not (tmp_path / "a.ledger.duckdb").exists()  # nobody charged, nothing left behind (issue 37)
    assert not (tmp_path / "a.ledger.noise.key").exists()
    assert not (tmp_path / "a.releases.duckdb").exists()  # nothing published
    assert _run(tmp_path, [day0], "--id-type", "int64", "--column", "opened=0:1") == 0  # the first run declares
    assert _run(tmp_path, [day1], start=1) == 0  # the next needs no declaration: the ledger keeps its own
    assert _releases(tmp_path) == [("sum:opened", W0), ("sum:opened", W0 + 1)]
    assert json.loads(dict(_catalogue(tmp_path))["sum:opened"])["spec"] == \
        {"type": "clamp", "column": "opened", "lo": 0.0, "hi": 1.0}
    assert _curator(tmp_path, "SELECT user_id FROM ledger ORDER BY 1") == [(1,), (2,)]  # int64 ids, as declared
    assert _curator(tmp_path, "SELECT count(*) FROM run_counts") == [(2,)]


def test_an_int64_ledger_reads_only_canonical_integer_ids_and_letters_the_rest(tmp_path):
    day0 = _csv(tmp_path / "d0.csv", [f"42,{_day(0)},1", f"042,{_day(0)},1", f"2.5,{_day(0)},1",
                                      f"99999999999999999999,{_day(0)},1", f"x,{_day(0)},1"])
    assert _run(tmp_path, [day0], "--id-type", "int64", "--column", "opened=0:1") == 0
    assert [u for (u,) in _curator(tmp_path, "SELECT user_id FROM ledger")] == [42]
    assert sorted(r for (r,) in _curator(tmp_path, "SELECT reason FROM dead_letters")) == ["wrong_type"] * 4


# --- 2. one line never swallows others ------------------------------------------------------------


def test_an_unterminated_quote_is_one_dead_letter_and_every_line_after_it_is_read(tmp_path):
    lines = [f"{i},{_day(0)},1" for i in range(10)] + [f'10,{_day(0)},"1'] + [f"{i},{_day(0)},1" for i in range(11, 40)]
    assert _run(tmp_path, [_csv(tmp_path / "d0.csv", lines)], "--id-type", "int64", "--column", "opened=0:1") == 0
    (read, admitted), = _curator(tmp_path, "SELECT rows_read, admitted FROM run_counts")
    assert (read, admitted) == (40, 39)
    (reason, detail), = _curator(tmp_path, "SELECT reason, detail FROM dead_letters")
    assert reason == "malformed_row" and detail.startswith("line 12:")


@pytest.mark.parametrize("line, why", [(b"5,2026-03-01,\xff\xfe", "not UTF-8"),
                                       (b"5,2026-03-01," + b"9" * (1 << 21), "longer than"),
                                       (b"5,2026-03-01,1\r6,2026-03-01,1", "carriage return")])
def test_one_unreadable_line_is_one_dead_letter_and_the_day_is_released(tmp_path, line, why):
    path = tmp_path / "d0.csv"
    path.write_bytes(b"user_id,day,opened\n1,2026-03-01,1\n" + line + b"\n2,2026-03-01,1\n")
    assert _run(tmp_path, [path], "--id-type", "int64", "--column", "opened=0:1") == 0
    assert _curator(tmp_path, "SELECT rows_read, admitted FROM run_counts") == [(3, 2)]
    (reason, detail), = _curator(tmp_path, "SELECT reason, detail FROM dead_letters")
    assert reason == "malformed_row" and detail.startswith("line 3:") and why in detail
    assert [q for q, _ in _releases(tmp_path)] == ["sum:opened"]  # the day is public


# --- 3. the catalogue follows the declaration -----------------------------------------------------


def _parquet(path, users, values) -> str:
    # pa.Table.from_pylist types a column from its values: all-missing becomes type null.
    pq.write_table(pa.Table.from_pylist([{"user_id": u, "day": DAY0, "opened": 1.0, "minutes": v}
                                         for u, v in zip(users, values)]), path)
    return str(path)


def test_the_catalogue_is_the_same_whether_or_not_one_user_gave_a_value_in_a_column(tmp_path):
    declare = ("--id-type", "int64", "--column", "opened=0:1", "--column", "minutes=0:60")
    quiet = _parquet(tmp_path / "quiet.parquet", [1, 2, 3], [None, None, None])
    loud = _parquet(tmp_path / "loud.parquet", [1, 2, 3], [None, 30.0, None])
    # Others' rows, after the first file (whose types once decided the catalogue).
    others = _parquet(tmp_path / "others.parquet", [4, 5], [12.0, 7.0])
    assert pq.read_schema(quiet).field("minutes").type == pa.null()
    assert _run(tmp_path, [quiet, others], *declare, name="quiet") == 0
    assert _run(tmp_path, [loud, others], *declare, name="loud") == 0
    assert _catalogue(tmp_path, "quiet") == _catalogue(tmp_path, "loud")
    assert [q for q, _ in _catalogue(tmp_path, "quiet")] == ["sum:minutes", "sum:opened"]


def test_a_declared_column_missing_from_an_input_refuses_the_run_before_anyone_is_charged(tmp_path, capsys):
    day0 = _csv(tmp_path / "d0.csv", [f"1,{_day(0)},1"])
    assert _run(tmp_path, [day0], "--id-type", "int64", "--column", "opened=0:1", "--column", "spent=0:9") == 1
    assert "lacks the declared column(s) ['spent']" in capsys.readouterr().err
    assert not (tmp_path / "a.ledger.duckdb").exists()  # a refused first run leaves nothing behind


def test_a_run_declaring_another_contract_than_the_ledgers_is_refused_naming_both(tmp_path, capsys):
    day0 = _csv(tmp_path / "d0.csv", [f"1,{_day(0)},1"])
    day1 = _csv(tmp_path / "d1.csv", [f"1,{_day(1)},1"])
    assert _run(tmp_path, [day0], "--id-type", "int64", "--column", "opened=0:1") == 0
    assert _run(tmp_path, [day1], "--id-type", "int64", "--column", "opened=0:2", start=1) == 1
    err = capsys.readouterr().err
    assert "columns: ledger has" in err and '"hi":1.0' in err and '"hi":2.0' in err
    assert _curator(tmp_path, "SELECT max(window_id) FROM processed_windows") == [((DAY0 - dt.date(1970, 1, 1)).days,)]


# --- 9. an unbounded column gets no default sum -----------------------------------------------------


def test_an_unbounded_column_gets_no_default_sum_and_a_run_with_nothing_else_is_refused_naming_the_option(tmp_path,
                                                                                                         capsys):
    day0 = _csv(tmp_path / "d0.csv", [f"1,{_day(0)},12.5"], header="user_id,day,minutes")
    assert _run(tmp_path, [day0], "--id-type", "int64", "--column", "minutes") == 1
    err = capsys.readouterr().err
    assert "['minutes']" in err and "--column minutes=0:60" in err


def test_a_bounded_sum_keeps_users_with_large_values_in_the_release(tmp_path):
    # An exponential column (mean 12) answered unclamped dropped 60% of users on day 1; its
    # declared bound clamps each value, so every user's charge is at most hi**2.
    rng = np.random.default_rng(3)
    minutes = rng.exponential(12.0, size=300)
    path = _csv(tmp_path / "d0.csv", [f"{i},{_day(0)},1,{m:.3f}" for i, m in enumerate(minutes)],
                header="user_id,day,opened,minutes")
    assert _run(tmp_path, [path], "--id-type", "int64", "--column", "opened=0:1", "--column", "minutes=0:1",
                budget="4") == 0
    (admitted, dropped), = _curator(tmp_path, "SELECT admitted, dropped FROM run_counts")
    assert (admitted, dropped) == (300, 0)
    spec = dict(_catalogue(tmp_path))["sum:minutes"]
    assert json.loads(spec)["spec"] == {"type": "clamp", "column": "minutes", "lo": 0.0, "hi": 1.0}


# --- every job keeps the same declaration -------------------------------------------------------------

DECLARE = ("--id-type", "int64", "--column", "opened=0:1", "--column", "minutes")


def _distributed(tmp_path, inputs, *extra: str, start: int, previous: str = "none", out: str) -> int:
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.stream.noise import NoiseKey

    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    return dist.main(["--input", *map(str, inputs), "--start", _day(start), "--end", _day(start), "--epsilon", "1",
                      "--delta", "1e-6", "--norm-budget", "8", "--previous-ledger", previous,
                      "--output", str(tmp_path / out), "--releases-parquet", str(tmp_path / "public"),
                      "--noise-key", str(key), "--shards", "2", "--quiet", *extra])


def _public_catalogue(tmp_path) -> dict:
    from renyi_stream.queries.catalogue import ReleaseCatalogue

    return {r.query_id: json.loads(r.query.to_json())["spec"]
            for r in ReleaseCatalogue(str(tmp_path / "public")).read().registrations}


def test_the_distributed_job_answers_the_declared_bounded_columns_and_its_next_run_keeps_the_declaration(tmp_path,
                                                                                                        capsys):
    header = "user_id,day,opened,minutes"
    day0 = _csv(tmp_path / "d0.csv", [f"1,{_day(0)},1,500", f"042,{_day(0)},1,3"], header=header)
    day1 = _csv(tmp_path / "d1.csv", [f"1,{_day(1)},1,7"], header=header)
    assert _distributed(tmp_path, [day0], *DECLARE, start=0, out="run0") == 0
    assert _public_catalogue(tmp_path) == {"sum:opened": {"type": "clamp", "column": "opened", "lo": 0.0, "hi": 1.0}}
    assert _distributed(tmp_path, [day1], start=1, previous=str(tmp_path / "run0"), out="run1") == 0
    manifest = json.loads((tmp_path / "run1" / "_COMMITTED.json").read_text())
    assert json.loads(manifest["parameters"]["columns"]) == [{"name": "opened", "kind": "number", "lo": 0.0, "hi": 1.0},
                                                            {"name": "minutes", "kind": "number"}]
    assert _distributed(tmp_path, [day1], "--id-type", "int64", "--column", "opened=0:5", start=1,
                        previous=str(tmp_path / "run0"), out="run1b") != 0
    assert "columns: ledger has" in capsys.readouterr().err


def test_the_streaming_job_answers_the_declared_bounded_columns_and_refuses_columns_given_both_ways(tmp_path,
                                                                                                   capsys):
    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.codec import encode_message
    from renyi_stream.stream.engine.readers import read_batches
    from renyi_stream.stream.noise import NoiseKey

    day0 = _csv(tmp_path / "d0.csv", [f"1,{_day(0)},1,500", f"2,{_day(0)},0,3"], header="user_id,day,opened,minutes")
    message = tmp_path / "d0.arrows"
    message.write_bytes(encode_message(pa.Table.from_batches(list(read_batches(day0)))))
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    common = ["--replay", str(message), "--start", _day(0), "--end", _day(0), "--epsilon", "1", "--delta", "1e-6",
              "--norm-budget", "8", "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key),
              "--shards", "2"]
    assert sj.main([*common, *DECLARE, "--columns", "opened", "--output", str(tmp_path / "both")]) != 0
    assert "not both" in capsys.readouterr().err
    assert sj.main([*common, *DECLARE, "--output", str(tmp_path / "curator")]) == 0
    assert _public_catalogue(tmp_path) == {"sum:opened": {"type": "clamp", "column": "opened", "lo": 0.0, "hi": 1.0}}


@pytest.mark.parametrize("column, declare, why", [
    (pa.array([[1.0], [2.0]]), ("--column", "opened=0:1"), "holds no numbers"),
    (pa.array([b"\x01", b"\x02"]), ("--column", "opened=0:1"), "holds no numbers"),
    (pa.array([1, 2]), ("--category", "opened"), "holds no text"),
])
def test_a_declared_column_of_a_type_that_holds_no_such_value_refuses_the_file_before_anyone_is_charged(
        tmp_path, capsys, column, declare, why):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"user_id": [1, 2], "day": [DAY0, DAY0], "opened": column}), path)
    assert _run(tmp_path, [path], "--id-type", "int64", *declare) == 1
    err = capsys.readouterr().err
    assert "'opened'" in err and why in err and "Traceback" not in err
    assert not (tmp_path / "a.ledger.duckdb").exists()  # a refused first run leaves nothing behind


def test_a_csv_header_that_repeats_a_name_refuses_the_file_before_anyone_is_charged(tmp_path, capsys):
    path = _csv(tmp_path / "d.csv", [f"1,{_day(0)},1,0"], header="user_id,day,opened,opened")
    assert _run(tmp_path, [path], "--id-type", "int64", "--column", "opened=0:1") == 1
    assert "repeats the column name(s) ['opened']" in capsys.readouterr().err
    assert not (tmp_path / "a.ledger.duckdb").exists()  # a refused first run leaves nothing behind


def test_a_float_id_column_with_one_missing_id_is_that_rows_dead_letter_and_the_day_is_released(tmp_path):
    # What pandas writes for integer ids when one is missing: float64 (refused the day before).
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1.0, None, 3.0]), "day": [DAY0] * 3, "opened": [1.0] * 3}), path)
    assert _run(tmp_path, [path], "--id-type", "int64", "--column", "opened=0:1") == 0
    assert sorted(u for (u,) in _curator(tmp_path, "SELECT user_id FROM ledger")) == [1, 3]
    assert _curator(tmp_path, "SELECT reason FROM dead_letters") == [("null_user_id",)]
    assert [q for q, _ in _releases(tmp_path)] == ["sum:opened"]
