"""A shard is restored from its snapshot parts and written back to them by the engine
(:class:`renyi_stream.stream.engine.shard_state.ShardSnapshots`), the same for every job's filter (issue 19,
item 1): a restored shard is the shard that was snapshotted, and a shard's parts that would
restart some of its users from zero budget are refused (invariant 1
(ledger-never-window-scoped, docs/architecture.md))."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from renyi_stream.pipelines.beam.transforms import IndividualFilterDoFn
from renyi_stream.pipelines.streaming.beam.releases import StreamingIndividualFilterDoFn
from renyi_stream.queries.linear import default_queries
from renyi_stream.stream.engine.shard_state import QueryPlan, ShardSnapshots
from renyi_stream.stream.schema import WindowSpec

W0 = (dt.date(2026, 3, 1) - dt.date(1970, 1, 1)).days
PLAN = QueryPlan.starting_at(default_queries(["opened"]) + default_queries(["opened"], kind="running"), W0)
SNAPSHOTS = ShardSnapshots(plan=PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32)


def _rows(window: int, users, opened) -> pa.Table:
    return pa.table({"user_id": pa.array(users, pa.int64()), "window_id": pa.array([window] * len(users), pa.int64()),
                     "opened": pa.array(opened, pa.float64())})


def _charged_shard():
    shard = SNAPSHOTS.restore([])
    shard.charge_window(W0, _rows(W0, [1, 2, 3], [1.0, 0.5, 0.0]), noise_std=2.0, policy="drop")
    shard.charge_window(W0 + 1, _rows(W0 + 1, [2, 4], [1.0, 1.0]), noise_std=2.0, policy="drop")
    return shard


def test_a_restored_shard_snapshots_to_the_same_parts_as_the_shard_it_was_restored_from():
    parts = SNAPSHOTS.snapshot(_charged_shard())
    again = SNAPSHOTS.snapshot(SNAPSHOTS.restore(parts))
    assert [kind for kind, _ in again] == ["ledger", "running"]
    assert again[0][1].equals(parts[0][1], check_metadata=True)
    assert again[1][0] == parts[1][0] and again[1][1][1].equals(parts[1][1][1], check_metadata=True)


def test_a_restored_shard_charges_the_next_window_exactly_as_the_shard_it_was_restored_from():
    original = _charged_shard()
    restored = SNAPSHOTS.restore(SNAPSHOTS.snapshot(original))
    rows = _rows(W0 + 2, [1, 5], [1.0, 0.25])  # user 1 has history but no row at W0 + 1
    a = original.charge_window(W0 + 2, rows, noise_std=2.0, policy="drop")
    b = restored.charge_window(W0 + 2, rows, noise_std=2.0, policy="drop")
    assert a.counts == b.counts
    assert a.sums.keys() == b.sums.keys() and all(np.array_equal(a.sums[q], b.sums[q]) for q in a.sums)
    assert original.ledger.to_arrow().equals(restored.ledger.to_arrow())


def test_a_shard_without_a_snapshot_starts_an_empty_ledger_under_the_runs_budget():
    shard = SNAPSHOTS.restore([])
    ledger = shard.ledger.to_arrow()
    assert ledger.num_rows == 0 and shard.ledger.budget == 1.0 and shard.ledger.tracker_step == 1 / 32


def test_a_shard_without_prepaid_rows_takes_the_running_querys_recorded_rule_and_refuses_another():
    (_, (query_id, users)), = [p for p in SNAPSHOTS.snapshot(_charged_shard()) if p[0] == "running"]
    meta = {k.decode(): v.decode() for k, v in users.schema.metadata.items()}
    fresh = ShardSnapshots(plan=PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32,
                           running_meta={query_id: meta}).restore([])
    assert len(fresh.running[query_id]) == 0 and fresh.running[query_id].meta == {
        k: v for k, v in meta.items() if k != "id_type"}
    other = {**meta, "horizon": "tail"}  # the same query id, stored under another schedule
    with pytest.raises(ValueError, match="registered with strategy"):
        ShardSnapshots(plan=PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32,
                       running_meta={query_id: other}).restore([])


def test_restoring_refuses_a_shard_given_two_ledgers():
    ledger = SNAPSHOTS.snapshot(_charged_shard())[0]
    with pytest.raises(ValueError, match="at most one ledger, got 2"):
        SNAPSHOTS.restore([ledger, ledger])


def test_restoring_refuses_two_histories_of_one_running_query():
    running = SNAPSHOTS.snapshot(_charged_shard())[1]
    with pytest.raises(ValueError, match="two histories of running query 'running:opened'"):
        SNAPSHOTS.restore([running, running])


def test_restoring_refuses_a_part_of_another_kind():
    with pytest.raises(ValueError, match="kind='rows'"):
        SNAPSHOTS.restore([("rows", pa.table({"x": [1]}))])


def test_the_streaming_filter_restores_through_the_engine_and_holds_no_batch_filter():
    fn = StreamingIndividualFilterDoFn(plan=PLAN, window=WindowSpec(), start_window=W0, end_window=W0 + 1,
                                       indicator_columns=["opened"], noise_std=2.0, policy="drop", budget=1.0,
                                       id_type="int64", tracker_step=1 / 32)
    held = list(vars(fn).values())
    assert not any(isinstance(value, IndividualFilterDoFn) for value in held)
    assert any(isinstance(value, ShardSnapshots) for value in held)


# --- incremental snapshots: a full snapshot every K windows, deltas between -------------------------

WINDOW_PLAN = QueryPlan.starting_at(default_queries(["opened"]), W0)


def _windows(n: int, seed: int = 7) -> list[pa.Table]:
    """``n`` windows of 10 to 40 of 60 users each, values in [0, 1.5): enough to drop some users."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(n):
        users = np.sort(rng.choice(60, int(rng.integers(10, 41)), replace=False))
        out.append(_rows(W0 + w, users, rng.random(len(users)) * 1.5))
    return out


def _run(snapshots: ShardSnapshots, windows: list[pa.Table]) -> list[tuple[list, pa.Table]]:
    """Charge ``windows`` one by one as the streaming filter does (restore from the parts held,
    charge, keep the parts :meth:`ShardSnapshots.after_window` gives); after each window, the
    parts held and the shard's ledger as restored from them."""
    held, out = [], []
    for table in windows:
        shard = snapshots.restore(held)
        window = int(table.column("window_id")[0].as_py())
        shard.charge_window(window, table, noise_std=1.0, policy="drop")
        parts, whole = snapshots.after_window(shard, window=window, charged=table.column("user_id"), held=held)
        held = parts if whole else held + parts
        out.append((list(held), snapshots.restore(held).ledger.to_arrow()))
    return out


@pytest.mark.parametrize("k", [1, 3, 1000])
def test_a_full_snapshot_and_its_deltas_restore_the_ledger_whole_snapshots_give_after_every_window(k):
    windows = _windows(10)
    whole = _run(ShardSnapshots(plan=WINDOW_PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32), windows)
    incremental = _run(ShardSnapshots(plan=WINDOW_PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32,
                                      compact_every=k), windows)
    assert all(a.equals(b) for (_, a), (_, b) in zip(whole, incremental))
    assert whole[-1][1].num_rows > 50 and pa.compute.sum(whole[-1][1].column("used")).as_py() > 0
    # K windows to a full snapshot: at most one full snapshot and K - 1 deltas held.
    assert max(len(parts) for parts, _ in incremental) == min(k, 10)


def test_a_delta_holds_the_ledger_rows_of_the_users_charged_in_its_window_only():
    windows = _windows(4)
    snapshots = ShardSnapshots(plan=WINDOW_PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32, compact_every=10)
    for (held, ledger), table in zip(_run(snapshots, windows)[1:], windows[1:]):
        kind, (window, rows) = held[-1]
        assert (kind, window) == ("ledger_delta", table.column("window_id")[0].as_py())
        assert rows.column("user_id").to_pylist() == table.column("user_id").to_pylist()  # sorted, one per user
        assert rows.num_rows < ledger.num_rows


def test_deltas_go_over_the_full_snapshot_in_window_order_whatever_order_they_are_held_in():
    snapshots = ShardSnapshots(plan=WINDOW_PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32, compact_every=10)
    held, ledger = _run(snapshots, _windows(6))[-1]
    assert snapshots.restore([held[0], *reversed(held[1:])]).ledger.to_arrow().equals(ledger)


def test_a_string_id_shard_restores_from_deltas_as_from_whole_snapshots():
    def as_text(table: pa.Table) -> pa.Table:
        return table.set_column(0, "user_id", pa.compute.cast(table.column("user_id"), pa.string()))

    windows = [as_text(t) for t in _windows(5)]
    make = lambda k: ShardSnapshots(plan=WINDOW_PLAN, budget=1.0, id_type="string", tracker_step=1 / 32,  # noqa: E731
                                    compact_every=k)
    assert _run(make(1), windows)[-1][1].equals(_run(make(4), windows)[-1][1])


@pytest.mark.parametrize("k", [0, -2, 1.5])
def test_a_compaction_interval_that_is_not_a_positive_integer_is_refused_naming_it(k):
    with pytest.raises(ValueError, match="compact_every"):
        ShardSnapshots(plan=WINDOW_PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32, compact_every=k)


# --- running queries: their prepaid rows are deltas beside the ledger's (issue 30, item 1) -----------


def _as_text(table: pa.Table) -> pa.Table:
    return table.set_column(0, "user_id", pa.compute.cast(table.column("user_id"), pa.string()))


def _whole_parts(snapshots: ShardSnapshots, windows: list[pa.Table]) -> list[list]:
    """After each window, the shard restored from the parts :meth:`ShardSnapshots.after_window` left,
    snapshotted whole (:meth:`ShardSnapshots.snapshot`: the ledger, then each running query's rows)."""
    held, out = [], []
    for table in windows:
        shard = snapshots.restore(held)
        window = int(table.column("window_id")[0].as_py())
        shard.charge_window(window, table, noise_std=1.0, policy="drop")
        parts, whole = snapshots.after_window(shard, window=window, charged=table.column("user_id"), held=held)
        held = parts if whole else held + parts
        out.append(snapshots.snapshot(snapshots.restore(held)))
    return out


def _same_parts(a: list, b: list) -> bool:
    if [kind for kind, _ in a] != [kind for kind, _ in b]:
        return False
    tables = [(x, y) if kind == "ledger" else (x[1], y[1]) for (kind, x), (_, y) in zip(a, b)]
    return all(x.equals(y, check_metadata=True) for x, y in tables)


@pytest.mark.parametrize("id_type", ["int64", "string"])
@pytest.mark.parametrize("k", [3, 1000])
def test_a_shard_with_a_running_query_restores_from_deltas_the_ledger_and_prepaid_rows_whole_snapshots_give(k, id_type):
    windows = _windows(10) if id_type == "int64" else [_as_text(t) for t in _windows(10)]
    make = lambda k: ShardSnapshots(plan=PLAN, budget=1.0, id_type=id_type, tracker_step=1 / 32,  # noqa: E731
                                    compact_every=k)
    whole, incremental = _whole_parts(make(1), windows), _whole_parts(make(k), windows)
    assert [_same_parts(a, b) for a, b in zip(whole, incremental)] == [True] * 10
    (_, ledger), (_, (query_id, prepaid)) = whole[-1]
    assert query_id == "running:opened" and prepaid.num_rows > 50 and ledger.num_rows > 50


def test_a_shard_with_a_running_query_keeps_deltas_of_the_users_charged_in_each_window_only():
    windows = _windows(4)
    snapshots = ShardSnapshots(plan=PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32, compact_every=10)
    held = []
    for table in windows:
        shard = snapshots.restore(held)
        window = int(table.column("window_id")[0].as_py())
        shard.charge_window(window, table, noise_std=1.0, policy="drop")
        parts, whole = snapshots.after_window(shard, window=window, charged=table.column("user_id"), held=held,
                                              full=window == W0)  # a job's first window is full
        held = parts if whole else held + parts
        if window == W0:
            assert whole and [kind for kind, _ in parts] == ["ledger", "running"]
            continue
        assert not whole and [kind for kind, _ in parts] == ["ledger_delta", "running_delta"]
        (_, (w, ledger_rows)), (_, (w2, query_id, rows)) = parts
        assert (w, w2, query_id) == (window, window, "running:opened")
        users = set(table.column("user_id").to_pylist())
        # Every user with a prepaid row among the window's, none else: not the shard's.
        assert set(rows.column("user_id").to_pylist()) <= users
        assert set(rows.column("user_id").to_pylist()) == users & set(
            shard.running["running:opened"].to_arrow().column("user_id").to_pylist())
        assert rows.num_rows < len(shard.running["running:opened"])
        assert set(rows.column("last_window").to_pylist()) <= set(range(W0, window + 1))


def test_a_running_delta_of_another_strategy_than_its_full_part_is_refused_naming_the_query():
    snapshots = ShardSnapshots(plan=PLAN, budget=1.0, id_type="int64", tracker_step=1 / 32, compact_every=10)
    shard = snapshots.restore([])
    shard.charge_window(W0, _rows(W0, [1, 2], [1.0, 0.5]), noise_std=2.0, policy="drop")
    full, _ = snapshots.after_window(shard, window=W0, charged=pa.array([1, 2]), held=[])
    shard.charge_window(W0 + 1, _rows(W0 + 1, [2, 3], [1.0, 0.5]), noise_std=2.0, policy="drop")
    delta, _ = snapshots.after_window(shard, window=W0 + 1, charged=pa.array([2, 3]), deltas_held=0)
    kind, (window, query_id, rows) = delta[1]
    other = rows.replace_schema_metadata({**rows.schema.metadata, b"horizon": b"400"})
    with pytest.raises(ValueError, match="'running:opened'.*disagree"):
        snapshots.restore([*full, delta[0], (kind, (window, query_id, other))])
    assert _same_parts(snapshots.snapshot(snapshots.restore([*full, *delta])), snapshots.snapshot(shard))
