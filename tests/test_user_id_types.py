"""A user id typed otherwise than the ledger's ids costs its row, never the day (issue 18, edges).

The ledger's id type is public and fixed for life; each row's id is parsed as it by the validator
(``renyi_stream.stream.schema.validate_batch(id_type=...)``). Before, a producer sending text ids stopped the
streaming job (its int64 ledger raised in a shard's timer, so that window and every later one
went unreleased), and a CSV day with one text id among integers was refused by the daily and
distributed jobs ("parameters differ"): one row decided whether a day was released.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.distributed import job as dist
from renyi_stream.pipelines.streaming import books as streaming_books
from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.codec import encode_message
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.schema import RejectReason, SchemaError, validate_batch
from declared import contract, flags

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
# The ledgers' declared input (issue 28): int64 ids and a 0/1 indicator.
DECLARED = ("int64", "opened=0:1")


def _batch(ids, day=DAY0) -> pa.Table:
    return pa.table({"user_id": ids, "day": [day] * len(ids), "opened": [1.0] * len(ids)})


# --- the rule, in the validator --------------------------------------------------------------


def test_text_ids_are_parsed_row_by_row_for_an_int64_ledger():
    checked = validate_batch(_batch(["12", "-5", "x7", "9223372036854775808", "9223372036854775807"]),
                             indicator_columns=["opened"], id_type="int64")
    assert checked.valid.column("user_id").to_pylist() == [12, -5, 2**63 - 1]
    assert checked.valid.schema.field("user_id").type == pa.int64()
    rejected = checked.rejected.to_pylist()
    assert [(r["row_index"], r["reason"]) for r in rejected] == [(2, RejectReason.WRONG_TYPE.value),
                                                                (3, RejectReason.WRONG_TYPE.value)]
    assert "x7" in rejected[0]["detail"] and "int64" in rejected[0]["detail"]


@pytest.mark.parametrize("spelling", ["042", " 42", "42 ", "+42", "-0", "4_2", "42.0", "0x2a", "\u0664\u0662"])
def test_an_int64_id_in_another_spelling_than_the_canonical_one_is_a_wrong_type_dead_letter(spelling):
    # Were "042" read as 42, a platform's text ids "042" and "42" (two people) would share one budget.
    checked = validate_batch(_batch(["42", spelling]), indicator_columns=["opened"], id_type="int64")
    assert checked.valid.column("user_id").to_pylist() == [42]
    assert [(r["row_index"], r["reason"]) for r in checked.rejected.to_pylist()] == [(1, RejectReason.WRONG_TYPE.value)]


def test_integer_ids_are_text_for_a_string_ledger():
    checked = validate_batch(_batch(pa.array([1, 2], type=pa.int64())), indicator_columns=["opened"],
                             id_type="string")
    assert checked.valid.column("user_id").to_pylist() == ["1", "2"]


def test_an_unknown_id_type_is_refused_naming_it():
    with pytest.raises(ValueError, match="id_type must be"):
        validate_batch(_batch([1]), indicator_columns=["opened"], id_type="uuid")


# --- every job ---------------------------------------------------------------------------------


def _parquet_day(path: Path, offset: int, users) -> str:
    pq.write_table(pa.table({"user_id": pa.array(users, type=pa.int64()),
                             "day": pa.array([DAY0 + dt.timedelta(days=offset)] * len(users), type=pa.date32()),
                             "opened": pa.array([1.0] * len(users))}), path)
    return str(path)


def _csv_day_with_one_text_id(path: Path, offset: int) -> str:
    day = (DAY0 + dt.timedelta(days=offset)).isoformat()
    path.write_text(f"user_id,day,opened\n1,{day},1\nabc,{day},1\n2,{day},0\n")
    return str(path)


def test_a_csv_day_with_one_text_id_is_released_with_that_row_dead_lettered_by_renyi_stream_run(tmp_path):
    def job(inputs, day):
        return JobConfig(inputs=tuple(inputs), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                         epsilon=1.0, delta=1e-6, norm_budget=10.0, start_window=W0 + day, end_window=W0 + day,
                         key_path=str(tmp_path / "k.key"), n_shards=2, contract=contract(*DECLARED))

    run_job(job([_parquet_day(tmp_path / "d0.parquet", 0, [1, 2, 3])], 0))
    summary = run_job(job([_csv_day_with_one_text_id(tmp_path / "d1.csv", 1)], 1))
    assert (summary.rows_read, summary.rejected) == (3, 1) and summary.balanced
    db = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    try:
        assert db.execute("SELECT reason FROM dead_letters WHERE raw LIKE '%abc%'").fetchall() == [("wrong_type",)]
    finally:
        db.close()
    store = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    try:
        assert store.execute(f"SELECT count(*) FROM releases WHERE window_id = {W0 + 1}").fetchone() == (1,)
    finally:
        store.close()


def test_a_csv_day_with_one_text_id_is_released_by_the_distributed_job(tmp_path):
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)

    def args(inputs, day, previous, output):
        when = (DAY0 + dt.timedelta(days=day)).isoformat()
        return ["--input", *inputs, "--start", when, "--end", when, "--epsilon", "1", "--delta", "1e-6",
                "--norm-budget", "10", "--previous-ledger", previous, "--output", str(output),
                "--releases-parquet", str(tmp_path / "public"), "--noise-key", str(key), "--quiet", *flags(*DECLARED)]

    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(args([_parquet_day(tmp_path / "d0.parquet", 0, [1, 2, 3])], 0, "none", run1)) == 0
    assert dist.main(args([_csv_day_with_one_text_id(tmp_path / "d1.csv", 1)], 1, str(run1), run2)) == 0
    manifest = json.loads((run2 / dist.COMMITTED).read_text())
    assert manifest["balanced"] and manifest["dead_reasons"] == {"wrong_type": 1}
    assert (tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet").exists()


def test_a_streamed_message_with_text_ids_costs_its_bad_rows_never_the_window(tmp_path):
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    messages = []
    for day, ids in ((0, pa.array([1, 2, 3], type=pa.int64())), (1, pa.array(["1", "x", "3"]))):
        path = tmp_path / f"m{day}.arrows"
        path.write_bytes(encode_message(_batch(ids, DAY0 + dt.timedelta(days=day))))
        messages.append(str(path))
    code = sj.main(["--replay", *messages, *flags(*DECLARED), "--start", "2026-03-01", "--end", "2026-03-02",
                    "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "10", "--releases-parquet",
                    str(tmp_path / "public"), "--output", str(tmp_path / "curator"), "--noise-key", str(key),
                    "--shards", "2"])
    assert code == 0
    assert {p.parent.name for p in (tmp_path / "public").rglob("releases.parquet")} == {
        f"window_id={W0}", f"window_id={W0 + 1}"}
    books = streaming_books.books(str(tmp_path / "curator"))
    assert books["balanced"] and (books["rows_read"], books["rejected"], books["admitted"]) == (6, 1, 5)


def test_a_float_id_column_is_read_row_by_row_for_an_int64_ledger():
    # pandas writes integer ids as float64 when one is missing: that refused the whole day. Each
    # row is now its own: an exact integer is the id, anything else that row's dead letter.
    ids = pa.array([7.0, None, 2.5, float("nan"), float(2**53 - 1), float(2**53 + 2)], pa.float64())
    checked = validate_batch(_batch(ids), indicator_columns=["opened"], id_type="int64")
    assert checked.valid.column("user_id").to_pylist() == [7, 2**53 - 1]
    assert [(r["row_index"], r["reason"]) for r in checked.rejected.to_pylist()] == [
        (1, RejectReason.NULL_USER_ID.value), (2, RejectReason.WRONG_TYPE.value), (3, RejectReason.WRONG_TYPE.value),
        (5, RejectReason.WRONG_TYPE.value)]


def test_a_float_id_of_magnitude_2_to_the_53_is_a_wrong_type_since_two_people_round_onto_it():
    # 2**53 and 2**53 + 1 are the same float64: accepting it would charge one person for both and
    # dead-letter the other as a duplicate. Both signs, and the last exact integers stay ids.
    assert float(2**53) == float(2**53 + 1)
    ids = pa.array([float(2**53), float(-(2**53)), float(2**53 - 1), float(-(2**53 - 1))], pa.float64())
    checked = validate_batch(_batch(ids), indicator_columns=["opened"], id_type="int64")
    assert checked.valid.column("user_id").to_pylist() == [2**53 - 1, -(2**53 - 1)]
    assert [(r["row_index"], r["reason"]) for r in checked.rejected.to_pylist()] == [
        (0, RejectReason.WRONG_TYPE.value), (1, RejectReason.WRONG_TYPE.value)]


def test_a_float_id_column_is_no_string_ledgers_id():
    with pytest.raises(SchemaError, match="'user_id' has unsupported type double"):
        validate_batch(_batch(pa.array([7.0], pa.float64())), indicator_columns=["opened"], id_type="string")
