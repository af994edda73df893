"""The composite transforms run inside any Beam pipeline, not only the daily job's."""

from __future__ import annotations

import datetime as dt

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from renyi_stream.pipelines.beam import transforms as tx
from renyi_stream.pipelines.beam.release_steps import ledger_binding
from renyi_stream.stream.engine.shard_state import QueryPlan
from renyi_stream.queries.linear import default_queries
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import NoiseKey, new_ledger_id
from renyi_stream.stream.schema import WindowSpec

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _day_file(path, offset, users):
    pq.write_table(pa.table({
        "user_id": pa.array(users, type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=offset)] * len(users), type=pa.date32()),
        "opened": pa.array(np.ones(len(users))),
    }), path)
    return str(path)


def test_the_daily_graph_composes_inside_a_users_own_pipeline(tmp_path):
    key_path = str(tmp_path / "k.key")
    key = NoiseKey.load_or_create(key_path)
    inputs = [_day_file(tmp_path / "d0.parquet", 0, [1, 2, 3]), _day_file(tmp_path / "d2.parquet", 2, [1, 4])]
    template = Ledger(budget=1.0).to_arrow()
    with test_pipeline.TestPipeline() as p:
        graph = p | tx.DailyReleases(
            inputs, window=WindowSpec(), start_window=W0, end_window=W0 + 2, released=[], schedule=[W0, W0 + 1, W0 + 2],
            plan=QueryPlan.starting_at(default_queries(["opened"]), W0),
            indicator_columns=["opened"], noise_std=2.0, policy="drop", budget=1.0, id_type="int64",
            tracker_step=1 / 32, n_shards=3, previous_ledger=template.slice(0, 0), key_path=key_path,
            accounting="gdp", key_fingerprint=key.fingerprint, ledger_id=new_ledger_id())
        windows = graph["releases"] | beam.Map(lambda r: (r["query_id"], r["window_id"]))
        # Every window of the schedule, the empty one (W0 + 1) included.
        assert_that(windows, equal_to([("sum:opened", W0 + w) for w in range(3)]), label="every_window")
        users = graph["ledger"] | beam.FlatMap(lambda t: t.column("user_id").to_pylist())
        assert_that(users, equal_to([1, 2, 3, 4]), label="every_user_charged")
        read = graph["read"] | beam.Map(lambda item: item[1]) | beam.CombineGlobally(sum)
        assert_that(read, equal_to([5]), label="rows_read")


def test_packed_rows_pickle_compressed_and_come_back_identical():
    import pickle

    from renyi_stream.pipelines.beam.rows import PackedRows, unpacked

    rng = np.random.default_rng(3)
    n = 20_000
    table = pa.table({"user_id": pa.array([f"u{i}" for i in rng.permutation(n)], type=pa.string()),
                      "window_id": pa.array(np.full(n, 20513), type=pa.int64()),
                      "opened": pa.array((rng.random(n) < 0.05).astype(np.float64)),
                      "_source": pa.array(np.zeros(n, dtype=np.int64)), "_row": pa.array(np.arange(n))})
    data = pickle.dumps(PackedRows(table))
    assert len(data) < pickle.dumps(table).__len__() / 2  # what the shuffle and the bag state hold
    assert pickle.loads(data).table.equals(table)
    assert [t.equals(table) for t in unpacked([PackedRows(table), table])] == [True, True]


def test_packed_rows_passed_through_a_second_pickle_are_not_recompressed():
    import pickle

    from renyi_stream.pipelines.beam.rows import PackedRows

    table = pa.table({"user_id": pa.array(np.arange(5_000)), "opened": pa.array(np.ones(5_000))})
    first = pickle.dumps(PackedRows(table))
    passed = pickle.loads(first)  # the shuffle's copy, on its way into the bag state
    assert pickle.dumps(passed) == first
    assert passed._table is None  # nothing decoded until the timer reads the rows
    assert pickle.loads(pickle.dumps(passed)).table.equals(table)


def test_packed_rows_count_their_rows_without_decoding_them_and_old_pickles_still_load():
    """The streaming filter counts the rows it holds for later windows at every window (its row
    books): the count travels with the packed bytes, so nothing is decoded for it (issue 30). A
    pickle from before the count travelled (state written by an older version) still loads."""
    import pickle

    from renyi_stream.pipelines.beam.rows import PackedRows, _unpack_rows, row_count

    table = pa.table({"user_id": pa.array(np.arange(3_000)), "opened": pa.array(np.ones(3_000))})
    passed = pickle.loads(pickle.dumps(PackedRows(table)))
    assert row_count([passed, table.slice(0, 7)]) == 3_007 and passed._table is None
    old = _unpack_rows(pickle.loads(pickle.dumps(PackedRows(table)))._packed)  # no count: decoded to count
    assert old.num_rows == 3_000 and old.table.equals(table)


def test_packed_rows_know_their_one_window_without_decoding_and_none_for_several_or_none():
    """The streaming filter sorts a message's rows by window only when they span several: the one
    window travels with the packed bytes (issue 30: decoding every message on arrival was 6% of a
    replay). Rows of several windows, no window column or no rows have none."""
    import pickle

    from renyi_stream.pipelines.beam.rows import PackedRows, _unpack_rows

    one = pa.table({"user_id": pa.array(np.arange(100)), "window_id": pa.array(np.full(100, 20513))})
    passed = pickle.loads(pickle.dumps(PackedRows(one)))
    assert passed.window == 20513 and passed._table is None
    two = one.set_column(1, "window_id", pa.array(np.r_[np.full(50, 20513), np.full(50, 20514)]))
    assert pickle.loads(pickle.dumps(PackedRows(two))).window is None
    assert PackedRows(one.drop_columns(["window_id"])).window is None
    assert PackedRows(one.slice(0, 0)).window is None
    old = _unpack_rows(pickle.loads(pickle.dumps(PackedRows(one)))._packed, 100)  # from before the window travelled
    assert old.window is None and old.table.equals(one)


def test_split_by_shard_keeps_every_row_once_in_its_shard_for_any_shard_count():
    from renyi_stream.stream.engine.sharding import shard_of
    from renyi_stream.pipelines.beam.rows import split_by_shard

    ids = np.random.default_rng(5).integers(-2**62, 2**62, size=3_000)
    table = pa.table({"user_id": pa.array(ids), "_row": pa.array(np.arange(ids.size))})
    for n_shards in (1, 7, 4_096, 65_536, 70_000):
        parts = list(split_by_shard(table, n_shards))
        rows = np.concatenate([part.column("_row").to_numpy() for _, (_, part) in parts])
        assert sorted(rows.tolist()) == list(range(ids.size)), n_shards
        for shard, (_, part) in parts:
            assert set(shard_of(part.column("user_id"), n_shards).tolist()) == {shard}
            assert np.all(np.diff(part.column("_row").to_numpy()) > 0)  # input order kept


def test_each_shards_part_pickles_to_its_own_rows_not_the_whole_table():
    import pickle

    from renyi_stream.pipelines.beam.rows import split_by_shard

    n = 200_000
    table = pa.table({"user_id": pa.array(np.arange(n)), "used": pa.array(np.random.default_rng(0).random(n))})
    whole = len(pickle.dumps(table))
    parts = list(split_by_shard(table, 16))
    sizes = [len(pickle.dumps(part)) for _, (_, part) in parts]
    assert sum(sizes) < 1.1 * whole  # a slice would carry its parent's buffers: 16x the table


def test_a_release_step_refuses_a_noise_key_other_than_the_ledgers(tmp_path):
    """A swapped key file would draw a second, independent noise for windows already released."""
    import pytest

    started = NoiseKey.load_or_create(tmp_path / "started.key")
    swapped_path = tmp_path / "swapped.key"
    NoiseKey.load_or_create(swapped_path)
    ledger_id = new_ledger_id()
    assert ledger_binding(str(tmp_path / "started.key"), started.fingerprint, ledger_id) is not None
    with pytest.raises(RuntimeError, match="not the one this ledger was started with"):
        ledger_binding(str(swapped_path), started.fingerprint, ledger_id)


def test_packed_rows_given_their_table_take_the_window_from_the_rows_never_from_the_caller():
    from renyi_stream.pipelines.beam.rows import PackedRows

    rows = pa.table({"user_id": pa.array(np.arange(10)), "window_id": pa.array(np.full(10, 20513))})
    assert PackedRows(rows, window=20600).window == 20513
    assert PackedRows(rows.slice(0, 0), window=20600).window is None
