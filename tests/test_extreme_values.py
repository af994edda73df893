"""One user's values never decide whether a window is released (issue 18, item 1).

A query vector that is not finite (a weighted sum whose ``w * x`` overflows, a running total whose
sum over one user's history overflows, each value finite) is an infinite charge for that user:
they are dropped at that window (``clip`` scales them to zero), charged nothing, counted for the
curator, and the window is released on schedule. Before, the filter raised, the run failed and
that day was never released: an analyst who registers such a query learns one bit per day from
whether the release appears. End to end through the daily job (real Parquet, DuckDB, Beam), and
at the engine (``ShardState``) that every job charges through.
"""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.stream.engine.shard_state import QueryPlan, ShardState
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_store import ReleaseStore
from renyi_stream.stream.ledger import Ledger
from declared import contract, register_unclamped_defaults

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
EXTREME = 1e308  # finite, and the largest magnitude a float64 column can hold with room to spare
HEAVY = 3  # the user whose value is extreme
# The ledgers' declared input (issue 28): numbers without a bound, since the extreme values must
# reach the queries as they are; each ledger's unclamped default sums are registered before its
# first run (:func:`_new_ledger`).
DECLARED = contract("int64", "spend", "tier")


def _day(tmp_path, offset: int, heavy_value: float, *, users: int = 6) -> str:
    path = tmp_path / f"day{offset}.parquet"
    values = np.ones(users)
    values[HEAVY] = heavy_value
    pq.write_table(pa.table({
        "user_id": pa.array(np.arange(users), type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=offset)] * users, type=pa.date32()),
        "spend": pa.array(values),
        "tier": pa.array(np.where(np.arange(users) == HEAVY, heavy_value, 1.0)),
    }), path)
    return str(path)


def _job(tmp_path, inputs, start: int, end: int, **kw) -> JobConfig:
    return JobConfig(inputs=tuple(inputs), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                     epsilon=1.0, delta=1e-6, norm_budget=10.0, start_window=W0 + start, end_window=W0 + end,
                     key_path=str(tmp_path / "k.key"), n_shards=2, contract=DECLARED, **kw)


def _new_ledger(tmp_path, **kw) -> None:
    """Register the unclamped sums (or, with ``kind="running"``, running totals) of spend and tier
    from window 0 in a new ledger's store: the default queries of a ledger declared without bounds."""
    register_unclamped_defaults(str(tmp_path / "s.duckdb"), ["spend", "tier"], W0, **kw)


def _released(tmp_path) -> dict[str, set[int]]:
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        table = store.read()
    windows: dict[str, set[int]] = {}
    for q, w in zip(table.column("query_id").to_pylist(), table.column("window_id").to_pylist()):
        windows.setdefault(q, set()).add(w - W0)
    return windows


def _curator(tmp_path, sql: str) -> list[tuple]:
    db = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _register(tmp_path, query: LinearQuery, effective_from: int) -> None:
    with ReleaseStore(tmp_path / "s.duckdb") as store:
        QueryRegistry(store).add(query, effective_from=W0 + effective_from)


def test_a_weighted_query_that_overflows_for_one_user_still_releases_the_window(tmp_path):
    _new_ledger(tmp_path)
    run_job(_job(tmp_path, [_day(tmp_path, 0, 1.0)], 0, 0))
    before = dict(_curator(tmp_path, "SELECT user_id, used FROM ledger"))
    _register(tmp_path, LinearQuery.weighted("big", {"spend": 1e300}), 1)
    run_job(_job(tmp_path, [_day(tmp_path, 1, 1e10)], 1, 1))  # 1e300 * 1e10 overflows

    assert 1 in _released(tmp_path)["big"]
    after = dict(_curator(tmp_path, "SELECT user_id, used FROM ledger"))
    assert after[HEAVY] == before[HEAVY]  # an infinite charge: dropped, charged nothing
    assert _curator(tmp_path, f"SELECT sum(nonfinite) FROM window_counts WHERE window_id = {W0 + 1}") == [(1,)]


@pytest.mark.parametrize("strategy", ["blt", "sqrt", "tree"])
def test_a_running_total_whose_history_overflows_for_one_user_keeps_releasing(tmp_path, strategy):
    # 1e308 every day: each value is finite, the weighted history sum passes float64's range.
    inputs = [_day(tmp_path, d, EXTREME) for d in range(4)]
    _new_ledger(tmp_path, kind="running", strategy=strategy)
    for day, path in enumerate(inputs):
        run_job(_job(tmp_path, [path], day, day, release="running", strategy=strategy))
    released = _released(tmp_path)
    assert released["running:spend"] == {0, 1, 2, 3}
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        values = store.read().column("value").to_numpy()
    assert np.isfinite(values).all()


def test_a_weighted_query_that_is_nan_for_one_user_still_releases_the_window(tmp_path):
    _new_ledger(tmp_path)  # the default sums
    run_job(_job(tmp_path, [_day(tmp_path, 0, 1.0)], 0, 0))
    _register(tmp_path, LinearQuery.weighted("big", {"spend": -1e300, "tier": 1e300}), 1)
    run_job(_job(tmp_path, [_day(tmp_path, 1, 1e10)], 1, 1))  # -inf + inf is NaN: also dropped
    assert 1 in _released(tmp_path)["big"]
    assert _curator(tmp_path, f"SELECT sum(nonfinite) FROM window_counts WHERE window_id = {W0 + 1}") == [(1,)]


@pytest.mark.parametrize("query", [
    LinearQuery.clamp("clamped", "spend", 0.0, 1.0),
    LinearQuery.histogram("tiers", "tier", [1.0, EXTREME]),
    LinearQuery.columns("both", ["spend", "tier"]),  # ||(1e308, 1e308)||^2 overflows
])
def test_extreme_finite_values_are_released_for_every_query_kind(tmp_path, query):
    _new_ledger(tmp_path)
    run_job(_job(tmp_path, [_day(tmp_path, 0, 1.0)], 0, 0))
    _register(tmp_path, query, 1)
    run_job(_job(tmp_path, [_day(tmp_path, 1, EXTREME)], 1, 1))
    assert 1 in _released(tmp_path)[query.query_id]


# --- the engine every job charges through ------------------------------------------------------


def _rows(values: list[float]) -> pa.Table:
    return pa.table({"user_id": pa.array(range(len(values)), type=pa.int64()), "spend": pa.array(values)})


@pytest.mark.parametrize("policy", ["drop", "clip"])
def test_a_non_finite_query_vector_is_dropped_uncharged_under_either_policy(policy):
    # Users 0 and 2 contribute 1e150 and 0.5e150, charged 0.5 and 0.125 at s = 1e150; user 1's
    # 1e150 * 1e160 overflows.
    plan = QueryPlan.starting_at([LinearQuery.weighted("big", {"spend": 1e150})], W0)
    state = ShardState(plan, Ledger(budget=1.0))
    charged = state.charge_window(W0, _rows([1.0, 1e160, 0.5]), noise_std=1e150, policy=policy)
    assert charged.counts == {"admitted": 2, "clipped": 0, "dropped": 1, "nonfinite": 1}
    assert charged.sums["big"].tolist() == [1e150 + 0.5e150]
    assert state.ledger.used([1]).tolist() == [0.0]


def test_a_running_history_keeps_only_finite_values():
    plan = QueryPlan.starting_at([LinearQuery.weighted("big", {"spend": 1e150}, kind="running")], W0)
    state = ShardState(plan, Ledger(budget=1.0))
    first = state.charge_window(W0, _rows([0.1, 1e160]), noise_std=1e150, policy="drop")
    second = state.charge_window(W0 + 1, _rows([0.1, 0.1]), noise_std=1e150, policy="drop")
    assert first.counts["nonfinite"] == 1
    # User 1's overflowing day is not in their history, so their next day is an ordinary row.
    assert second.counts["nonfinite"] == 0
    assert np.isfinite(second.sums["big"]).all()
