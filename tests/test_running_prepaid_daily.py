"""Prepaid running totals through the daily job (issue 20), end to end on the Beam DirectRunner
with real Parquet files and real DuckDB stores: a run reads only its own users' prepaid rows, a
user's state stays one bounded row, the realised losses stay within the ledger's charges, a
dropped user keeps their past, a re-run releases nothing new, and what cannot continue (an old
history store, a window past the declared schedule) is refused by name before anyone is charged."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.store import CuratorStore, CuratorStoreError
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.release_store import ReleaseStore
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.prepaid import realised_sq_norms
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise
from declared import contract, register_unclamped_defaults

DAY0 = dt.date(2026, 5, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
DAYS = 6
NORM_BUDGET = 200.0
BLT = BufferedLinearToeplitz.shipped(365, 4)
QUERY = "running:v"
# (day, user, value): sparse days. User 0 is admitted on days 0 and 1, then asks for far more than
# their budget on day 3 (dropped), then fits again on day 4; user 2 is seen on day 1 only.
ROWS = [(0, 0, 3.0), (0, 1, 1.0), (0, 3, 1.0),
        (1, 0, 3.0), (1, 2, 1.0), (1, 3, 1.0),
        (2, 1, 1.0), (2, 3, 1.0), (2, 5, 1.0),
        (3, 0, 100.0), (3, 3, 1.0), (3, 5, 1.0),
        (4, 0, 1.0), (4, 1, 1.0), (4, 3, 1.0),
        (5, 3, 1.0), (5, 4, 1.0)]
USERS = 6
# The ledgers' declared input (issue 28): v without a bound, since user 0's 100.0 must be charged
# (and dropped) as it is; its unclamped running total is registered before each ledger's first run.
DECLARED = contract("int64", "v")


def _data() -> np.ndarray:
    data = np.zeros((USERS, DAYS))
    for day, user, value in ROWS:
        data[user, day] = value
    return data


def _file(tmp_path, day: int) -> str:
    rows = [(u, v) for d, u, v in ROWS if d == day]
    path = tmp_path / f"day{day}.parquet"
    pq.write_table(pa.table({"user_id": pa.array([u for u, _ in rows], type=pa.int64()),
                             "day": pa.array([DAY0 + dt.timedelta(days=day)] * len(rows), type=pa.date32()),
                             "v": pa.array([v for _, v in rows])}), path)
    return str(path)


def _config(tmp_path, day: int, *, name: str = "p", horizon=None, end: int | None = None) -> JobConfig:
    inputs = tuple(_file(tmp_path, d) for d in range(day, (day if end is None else end) + 1))
    return JobConfig(inputs=inputs, store=str(tmp_path / f"{name}.releases.duckdb"),
                     ledger=str(tmp_path / f"{name}.ledger.duckdb"), epsilon=1.0, delta=1e-5,
                     norm_budget=NORM_BUDGET, start_window=W0 + day, end_window=W0 + (day if end is None else end),
                     key_path=str(tmp_path / "shared.key"), n_shards=2, release="running", horizon=horizon,
                     contract=DECLARED)


def _new_ledger(tmp_path, day: int, *, name: str = "p", horizon=None) -> None:
    """Register the running total of v from window ``day`` in the new ledger ``name``'s store."""
    register_unclamped_defaults(str(tmp_path / f"{name}.releases.duckdb"), ["v"], W0 + day, kind="running",
                                horizon=horizon)


def _query(path, sql: str) -> list:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.fixture(scope="module")
def daily(tmp_path_factory):
    """Six daily runs, one day each, on one ledger and store; the state read back after each."""
    tmp_path = tmp_path_factory.mktemp("prepaid")
    states = []
    _new_ledger(tmp_path, 0)
    for day in range(DAYS):
        run_job(_config(tmp_path, day))
        states.append(dict((u, (w, len(v))) for u, w, v in _query(
            tmp_path / "p.ledger.duckdb", "SELECT CAST(user_id AS BIGINT), last_window, vals FROM prepaid_state")))
    return tmp_path, states


def _noise_free_totals(tmp_path) -> np.ndarray:
    """``(C a)_t`` of each window: the stored release ``y_t`` minus its keyed noise, recomputed."""
    s = calibrate(epsilon=1.0, delta=1e-5, norm_budget=NORM_BUDGET).noise_std
    with CuratorStore(tmp_path / "p.ledger.duckdb") as curator:
        binding = NoiseBinding(NoiseKey.load(str(tmp_path / "shared.key")), curator.ledger_id)
        raw = curator.load_running_releases()[QUERY]
    return np.array([np.asarray(y) - gaussian_noise(binding, query_id=QUERY, window_id=w, dim=1, noise_std=s)
                     for w, y in raw])


def test_a_daily_run_reads_exactly_that_days_users_prepaid_rows(daily):
    tmp_path, states = daily
    read = dict(_query(tmp_path / "p.ledger.duckdb", "SELECT window_id, prepaid_rows_read FROM window_counts"))
    per_day = {W0 + d: sum(1 for day, _, _ in ROWS if day == d) for d in range(DAYS)}
    assert read == per_day
    # user 2 contributed on day 1 only: no later run touched their row
    assert all(state[2] == (W0 + 1, 4) for state in states[1:])


def test_the_stored_state_is_one_row_of_buffers_per_user_whatever_the_number_of_days(daily):
    tmp_path, states = daily
    rows = _query(tmp_path / "p.ledger.duckdb",
                  "SELECT count(*), count(DISTINCT (query_id, user_id)), max(len(vals)) FROM prepaid_state")
    assert rows == [(USERS, USERS, BLT.buffers)]  # (buffers + 1) x d with last_window: 5 numbers
    assert [len(s) for s in states] == [3, 4, 5, 5, 5, 6]  # users ever admitted, never more


def test_every_users_realised_loss_is_at_most_their_ledger_charge(daily):
    tmp_path, _ = daily
    s = calibrate(epsilon=1.0, delta=1e-5, norm_budget=NORM_BUDGET).noise_std
    admitted = _data()
    admitted[0, 3] = 0.0  # the one contribution the filter dropped (checked below)
    realised = realised_sq_norms(BLT, admitted[:, :, None]).sum(axis=1) / (2 * s * s)
    used = dict(_query(tmp_path / "p.ledger.duckdb", "SELECT user_id, used FROM ledger"))
    kappa = calibrate(epsilon=1.0, delta=1e-5, norm_budget=NORM_BUDGET).rho
    for user in range(USERS):
        assert realised[user] <= used[user] <= kappa


def test_a_dropped_user_keeps_their_past_in_every_later_release(daily):
    tmp_path, _ = daily
    counts = dict(_query(tmp_path / "p.ledger.duckdb", "SELECT window_id, dropped FROM window_counts"))
    assert counts[W0 + 3] == 1 and sum(counts.values()) == 1  # user 0's 100.0 on day 3, nothing else
    # The releases' noise-free totals decode to the prefix sums of what was admitted: user 0's
    # days 0 and 1 (6.0) stay in every later release; only day 3's contribution is missing.
    prefix = BLT.post_process([t[None, :] for t in _noise_free_totals(tmp_path)])[:, 0]
    admitted = _data()
    admitted[0, 3] = 0.0
    np.testing.assert_allclose(prefix, np.cumsum(admitted.sum(axis=0)), rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.cumsum(_data().sum(axis=0)) - prefix, [0, 0, 0, 100, 100, 100], atol=1e-9)


def test_a_rerun_of_a_released_window_releases_and_charges_nothing_new(daily):
    tmp_path, _ = daily
    with ReleaseStore(str(tmp_path / "p.releases.duckdb"), read_only=True) as store:
        before = store.read()
    state = _query(tmp_path / "p.ledger.duckdb", "SELECT * FROM prepaid_state ORDER BY user_id")
    release = _query(tmp_path / "p.ledger.duckdb", "SELECT * FROM running_release_state")
    summary = run_job(_config(tmp_path, DAYS - 1))
    assert summary.windows_released == [] and summary.late > 0
    with ReleaseStore(str(tmp_path / "p.releases.duckdb"), read_only=True) as store:
        assert store.read().equals(before)
    assert _query(tmp_path / "p.ledger.duckdb", "SELECT * FROM prepaid_state ORDER BY user_id") == state
    assert _query(tmp_path / "p.ledger.duckdb", "SELECT * FROM running_release_state") == release


def test_a_store_with_old_history_state_is_refused_with_how_to_migrate(daily, capsys):
    tmp_path, _ = daily
    for suffix in ("releases", "ledger"):  # copies keep their modes (a ledger must stay 0600)
        shutil.copy(tmp_path / f"p.{suffix}.duckdb", tmp_path / f"old.{suffix}.duckdb")
    db = duckdb.connect(str(tmp_path / "old.ledger.duckdb"))
    try:  # what a store written before prepaid admission holds for its running query
        db.execute("INSERT INTO running_meta VALUES (?, ?)", [QUERY, json.dumps(
            {"renyi_stream.running_version": "1", "strategy": '{"name": "sqrt"}', "dim": "1",
             "start_window": str(W0), "next_window": str(W0 + DAYS), "id_type": "int64"})])
    finally:
        db.close()
    used = _query(tmp_path / "old.ledger.duckdb", "SELECT user_id, used FROM ledger ORDER BY user_id")
    extra = tmp_path / "day6.parquet"
    pq.write_table(pa.table({"user_id": pa.array([3], type=pa.int64()),
                             "day": pa.array([DAY0 + dt.timedelta(days=DAYS)], type=pa.date32()),
                             "v": pa.array([1.0])}), extra)
    config = JobConfig(inputs=(str(extra),), store=str(tmp_path / "old.releases.duckdb"),
                       ledger=str(tmp_path / "old.ledger.duckdb"), epsilon=1.0, delta=1e-5, norm_budget=NORM_BUDGET,
                       start_window=W0 + DAYS, end_window=W0 + DAYS, key_path=str(tmp_path / "shared.key"),
                       n_shards=2, release="running")
    with pytest.raises(CuratorStoreError, match="old per-window history format.*query retire.*query add"):
        run_job(config)
    assert _query(tmp_path / "old.ledger.duckdb", "SELECT user_id, used FROM ledger ORDER BY user_id") == used
    # The migration the message describes: retire the query, register a new one, run.
    day = str(DAY0 + dt.timedelta(days=DAYS))
    store = str(tmp_path / "old.releases.duckdb")
    assert main(["query", "retire", "--store", store, "--id", QUERY, "--from", day]) == 0
    assert main(["query", "add", "--store", store, "--id", "running2:v", "--columns", "v", "--kind", "running",
                 "--from", day]) == 0
    summary = run_job(config)
    assert summary.windows_released == [W0 + DAYS]
    with ReleaseStore(store, read_only=True) as public:
        ids = set(public.read().filter(pa.compute.equal(public.read().column("window_id"), W0 + DAYS))
                  .column("query_id").to_pylist())
    assert ids == {"running2:v"}


def test_a_window_out_of_order_is_refused_before_anyone_is_charged(tmp_path):
    _new_ledger(tmp_path, 0, name="gap")
    run_job(_config(tmp_path, 0, name="gap"))
    with pytest.raises(ValueError, match="window by window from window"):
        run_job(_config(tmp_path, 2, name="gap"))


def test_a_window_past_the_declared_schedule_is_refused_by_name(tmp_path):
    _new_ledger(tmp_path, 0, name="short", horizon=2)
    run_job(_config(tmp_path, 0, name="short", horizon=2, end=1))
    with pytest.raises(ValueError, match="declared for 2 windows.*past its schedule"):
        run_job(_config(tmp_path, 2, name="short", horizon=2))
