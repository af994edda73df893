"""Running totals through the daily job (issue 9), end to end on the Beam DirectRunner with real
Parquet and DuckDB files: releases of kind ``running``, individual charges of ``||C_t x_i||^2``,
state that persists between daily runs, keyed noise."""

from __future__ import annotations

import datetime as dt
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.curator.store import CuratorStore
from pipelines.daily.job import JobConfig, run_job
from queries.release_store import ReleaseStore
from stream.accounting import calibrate
from stream.continual.running import RunningState
from stream.continual.strategies import SquareRootFactorization
from stream.ledger import Ledger

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
USERS = 60
DAYS = 30


def _stream(seed: int = 3) -> np.ndarray:
    """(DAYS, USERS) binary indicator at a 30% rate."""
    return (np.random.default_rng(seed).random((DAYS, USERS)) < 0.3).astype(float)


def _files(tmp_path, data: np.ndarray) -> list[str]:
    paths = []
    for day in range(data.shape[0]):
        path = tmp_path / f"day{day:02d}.parquet"
        pq.write_table(pa.table({
            "user_id": pa.array(np.arange(USERS), type=pa.int64()),
            "day": pa.array([DAY0 + dt.timedelta(days=day)] * USERS, type=pa.date32()),
            "churned": pa.array(data[day]),
        }), path)
        paths.append(str(path))
    return paths


def _config(tmp_path, inputs, *, start, end, name="r", norm_budget=2000.0, release="running"):
    return JobConfig(
        inputs=tuple(inputs), store=str(tmp_path / f"{name}.releases.duckdb"),
        ledger=str(tmp_path / f"{name}.ledger.duckdb"), epsilon=1.0, delta=1e-5, norm_budget=norm_budget,
        start_window=W0 + start, end_window=W0 + end, key_path=str(tmp_path / "shared.key"), n_shards=3,
        release=release)


def _running(config) -> pa.Table:
    with ReleaseStore(config.store, read_only=True) as store:
        table = store.read()
    return table.filter(pa.compute.equal(table.column("kind"), "running")).sort_by("window_id").select(
        ["query_id", "window_id", "value", "noise_std"])


def _used(config) -> dict:
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        return dict(db.execute("SELECT user_id, used FROM ledger").fetchall())
    finally:
        db.close()


@pytest.fixture(scope="module")
def thirty_days(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("running")
    data = _stream()
    paths = _files(tmp_path, data)
    config = _config(tmp_path, paths, start=0, end=DAYS - 1)
    CuratorStore(config.ledger).close()  # a backup of the new ledger, before its first run
    shutil.copy(config.ledger, tmp_path / "pristine.ledger.duckdb")
    summary = run_job(config)
    return tmp_path, data, paths, config, summary


def test_every_window_gets_a_running_total_release(thirty_days):
    _, _, _, config, summary = thirty_days
    released = _running(config)
    assert released.column("window_id").to_pylist() == [W0 + d for d in range(DAYS)]
    assert set(released.column("query_id").to_pylist()) == {"running:churned"}
    assert summary.balanced


def test_running_totals_track_the_true_running_totals_within_their_declared_std(thirty_days):
    _, data, _, config, _ = thirty_days
    released = _running(config)
    truth = np.cumsum(data.sum(axis=1))
    z = (np.asarray(released.column("value").to_pylist()) - truth) / np.asarray(released.column("noise_std").to_pylist())
    # Nobody is filtered at this budget, so the estimates are unbiased; the 30 z-scores are
    # correlated N(0, 1) draws, and |z| > 4.5 for any of them has probability < 30 * 7e-6.
    assert np.all(np.abs(z) < 4.5)


def test_noise_std_of_a_running_release_is_the_estimates_not_one_windows(thirty_days):
    _, _, _, config, _ = thirty_days
    std = np.asarray(_running(config).column("noise_std").to_pylist())
    s = calibrate(epsilon=1.0, delta=1e-5, norm_budget=2000.0, accounting="gdp").noise_std
    expected = SquareRootFactorization().estimate_std(DAYS, noise_std=s)
    np.testing.assert_allclose(std, expected, rtol=1e-12)
    assert std[-1] > std[0]  # the running total's error grows (slowly) with t


def test_each_user_is_charged_the_squared_norm_of_their_running_queries(thirty_days):
    _, data, _, config, _ = thirty_days
    s = calibrate(epsilon=1.0, delta=1e-5, norm_budget=2000.0, accounting="gdp").noise_std
    # The reference: the same user's queries q_t(x_i) = sum_{u<=t} c_{t-u} x_{i,u}, charged one by one.
    coefficients = SquareRootFactorization().coefficients(DAYS)
    used = _used(config)
    for user in (0, 7, 42):
        x = data[:, user]
        q = np.array([np.dot(coefficients[: t + 1][::-1], x[: t + 1]) for t in range(DAYS)])
        assert used[user] == pytest.approx(np.sum(q ** 2) / (2 * s * s), rel=1e-9)


def test_day_by_day_runs_release_the_same_running_totals_as_one_run(thirty_days):
    tmp_path, _, paths, config, _ = thirty_days
    # Day by day for the first days, then the rest in two runs: every boundary continues the
    # stored history (each run costs a Beam pipeline, ~1.5 s; thirty of them took ~48 s). The
    # same ledger, restored from before its first run: one ledger id, so the same noise.
    shutil.copy(tmp_path / "pristine.ledger.duckdb", _config(tmp_path, paths, start=0, end=0, name="daily").ledger)
    for start, end in ((0, 0), (1, 1), (2, 2), (3, 10), (11, DAYS - 1)):
        run_job(_config(tmp_path, paths[start:end + 1], start=start, end=end, name="daily"))
    daily = _config(tmp_path, paths, start=0, end=DAYS - 1, name="daily")
    np.testing.assert_allclose(_running(daily).column("value").to_numpy(),
                               _running(config).column("value").to_numpy(), rtol=0, atol=1e-9)
    assert _used(daily) == pytest.approx(_used(config), rel=1e-12)


def test_a_run_that_would_skip_a_window_of_a_running_total_is_refused(tmp_path):
    paths = _files(tmp_path, _stream()[:5])
    run_job(_config(tmp_path, paths[:2], start=0, end=1))
    with pytest.raises(ValueError, match="window by window"):
        run_job(_config(tmp_path, [paths[3]], start=3, end=3))


def test_a_user_dropped_from_a_running_total_is_never_charged_above_the_budget(tmp_path):
    data = np.ones((10, USERS))
    paths = _files(tmp_path, data[:, :])
    config = _config(tmp_path, paths, start=0, end=9, norm_budget=20.0)
    summary = run_job(config)
    s = calibrate(epsilon=1.0, delta=1e-5, norm_budget=20.0, accounting="gdp").noise_std
    rho = 20.0 / (2 * s * s)
    assert summary.dropped > 0
    assert max(_used(config).values()) <= rho * (1 + 1e-9)


def test_window_release_stays_the_default(tmp_path):
    paths = _files(tmp_path, _stream()[:2])
    config = _config(tmp_path, paths, start=0, end=1, release="window")
    run_job(config)
    with ReleaseStore(config.store, read_only=True) as store:
        kinds = set(store.read().column("kind").to_pylist())
        ids = set(store.read().column("query_id").to_pylist())
    assert kinds == {"window"} and ids == {"sum:churned"}


def test_running_history_survives_between_runs_in_the_ledger_database(thirty_days):
    _, _, _, config, _ = thirty_days  # its own ledger: another test's was there only when that test ran first
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        entries = db.execute("SELECT count(*) FROM running_state").fetchone()[0]
        raw = db.execute("SELECT count(*) FROM running_releases").fetchone()[0]
    finally:
        db.close()
    assert raw == DAYS
    assert entries == int(_stream().sum())  # every non-zero (user, day) is history


def test_running_state_round_trips_through_the_ledger_store(tmp_path):
    from pipelines.curator.store import CuratorStore

    state = RunningState(strategy=SquareRootFactorization(), dim=1, start_window=W0)
    ledger = Ledger(budget=10.0)
    state.step(np.array([1, 2]), np.array([[1.0], [2.0]]), window_id=W0, ledger=ledger, noise_std=3.0)
    with CuratorStore(tmp_path / "l.duckdb") as curator:
        curator.commit_run(run_id=1, ledger=ledger.to_arrow(), releases=_empty_releases(),
                           window_counts=pa.table({"window_id": pa.array([], pa.int64()),
                                                   "admitted": pa.array([], pa.int64()),
                                                   "clipped": pa.array([], pa.int64()),
                                                   "dropped": pa.array([], pa.int64())}),
                           run_counts=dict(rows_read=0, admitted=0, clipped=0, dropped=0, rejected=0, late=0),
                           dead_letters=_empty_dead(), previous_users=0, running={"running:x": state.to_arrow()})
        restored = curator.load_running("int64")["running:x"]
    assert RunningState.from_arrow(restored).to_arrow().equals(state.to_arrow())


def _empty_releases() -> pa.Table:
    from queries.release_store import RELEASE_SCHEMA

    return RELEASE_SCHEMA.empty_table()


def _empty_dead() -> pa.Table:
    from pipelines.beam.transforms import DEAD_LETTER_SCHEMA

    return DEAD_LETTER_SCHEMA.empty_table()
