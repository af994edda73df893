"""Running totals through the daily job (issues 9 and 20), end to end on the Beam DirectRunner with
real Parquet and DuckDB files: releases of kind ``running`` (the BLT by default, each admitted
contribution prepaid over the declared 365 windows), prepaid state that persists between daily
runs, keyed noise."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.curator.store import CuratorStore
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.release_store import ReleaseStore
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.prepaid import running_rule
from renyi_stream.stream.engine.running import PrepaidUsers, RunningRelease
from renyi_stream.stream.ledger import Ledger
from declared import contract

BLT = BufferedLinearToeplitz.shipped(365, 4)  # the default strategy, fitted for the default horizon

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
USERS = 60
DAYS = 30
# The ledgers' declared input (issue 28): a 0/1 indicator, whose clamped sum is its plain sum.
DECLARED = contract("int64", "churned=0:1")


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
        release=release, contract=DECLARED)


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
    expected = BLT.estimate_std(DAYS, noise_std=s)
    np.testing.assert_allclose(std, expected, rtol=1e-12)
    assert std[-1] > std[0]  # the running total's error grows (slowly) with t


def test_each_user_is_prepaid_the_squared_norm_of_their_stream_over_the_declared_schedule(thirty_days):
    _, data, _, config, _ = thirty_days
    s = calibrate(epsilon=1.0, delta=1e-5, norm_budget=2000.0, accounting="gdp").noise_std
    # The reference: ||C x_i||^2 over the 365 declared windows (releases still to come included),
    # with the user's 30 days and zeros after: what their admissions prepaid, up to the margin.
    c = BLT.query_matrix(365)
    used = _used(config)
    for user in (0, 7, 42):
        x = np.zeros(365)
        x[:DAYS] = data[:, user]
        q = c @ x
        assert used[user] == pytest.approx(np.sum(q ** 2) / (2 * s * s), rel=1e-8)


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


def test_prepaid_state_survives_between_runs_in_the_ledger_database_one_bounded_row_per_user(thirty_days):
    _, _, _, config, _ = thirty_days  # its own ledger: another test's was there only when that test ran first
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        rows = db.execute("SELECT count(*), count(DISTINCT user_id), max(len(vals)) FROM prepaid_state").fetchone()
        raw = db.execute("SELECT count(*) FROM running_releases").fetchone()[0]
        release = db.execute("SELECT meta, len(vals) FROM running_release_state").fetchall()
    finally:
        db.close()
    assert raw == DAYS
    # one row per user (every user has a row every day in these files), of 4 buffers x 1 number,
    # after 30 days: a user's state does not grow with the days
    assert rows == (USERS, USERS, 4)
    (meta, width), = release
    assert width == 4 and json.loads(meta)["next_window"] == str(W0 + DAYS)


def test_prepaid_and_release_state_round_trip_through_the_ledger_store(tmp_path):
    from renyi_stream.pipelines.curator.store import CuratorStore

    rule = running_rule("blt", 365)
    state = PrepaidUsers(rule, strategy="blt", dim=1, start_window=W0)
    rows = state.gather(state.positions(np.array([1, 2])))
    state.put(np.array([1, 2]), state.positions(np.array([1, 2])), rule.admit(rows, np.array([[1.0], [2.0]]), 0))
    release = RunningRelease(rule, query_id="running:x", strategy="blt", dim=1, start_window=W0)
    release.release(W0, np.array([3.0]))
    ledger = Ledger(budget=10.0)
    with CuratorStore(tmp_path / "l.duckdb") as curator:
        curator.commit_run(run_id=1, ledger=ledger.to_arrow(), releases=_empty_releases(),
                           window_counts=pa.table({"window_id": pa.array([], pa.int64()),
                                                   "admitted": pa.array([], pa.int64()),
                                                   "clipped": pa.array([], pa.int64()),
                                                   "dropped": pa.array([], pa.int64())}),
                           run_counts=dict(rows_read=0, admitted=0, clipped=0, dropped=0, rejected=0, late=0),
                           dead_letters=_empty_dead(), previous_users=0, running={"running:x": state.to_arrow()},
                           release_states={"running:x": release.to_arrow()})
        restored = curator.load_running("int64")["running:x"]
        restored_release = curator.load_release_states()["running:x"]
    assert PrepaidUsers.from_arrow(restored).to_arrow().equals(state.to_arrow())
    assert RunningRelease.from_arrow(restored_release).to_arrow().equals(release.to_arrow())


def test_a_store_whose_prepaid_rows_were_edited_to_other_widths_is_refused(tmp_path):
    """One row one number longer and another one shorter keep the total length: the numbers would
    shift between users' buffers (and their cross terms) unless every row is checked."""
    import duckdb

    from renyi_stream.pipelines.curator.store import CuratorStore, CuratorStoreError

    rule = running_rule("blt", 365)
    state = PrepaidUsers(rule, strategy="blt", dim=1, start_window=W0)
    rows = state.gather(state.positions(np.array([1, 2])))
    state.put(np.array([1, 2]), state.positions(np.array([1, 2])), rule.admit(rows, np.array([[1.0], [2.0]]), 0))
    with CuratorStore(tmp_path / "l.duckdb") as curator:
        curator.commit_run(run_id=1, ledger=Ledger(budget=10.0).to_arrow(), releases=_empty_releases(),
                           window_counts=pa.table({"window_id": pa.array([], pa.int64()),
                                                   "admitted": pa.array([], pa.int64()),
                                                   "clipped": pa.array([], pa.int64()),
                                                   "dropped": pa.array([], pa.int64())}),
                           run_counts=dict(rows_read=0, admitted=0, clipped=0, dropped=0, rejected=0, late=0),
                           dead_letters=_empty_dead(), previous_users=0, running={"running:x": state.to_arrow()})
    with duckdb.connect(str(tmp_path / "l.duckdb")) as db:
        db.execute("UPDATE prepaid_state SET vals = list_concat(vals, [0.5]) WHERE user_id = '1'")
        db.execute("UPDATE prepaid_state SET vals = vals[1:len(vals) - 1] WHERE user_id = '2'")
        assert db.execute("SELECT sum(len(vals)) FROM prepaid_state").fetchone()[0] == 2 * rule.width
    with CuratorStore(tmp_path / "l.duckdb") as curator, pytest.raises(CuratorStoreError, match="edited"):
        curator.load_running("int64")


def _empty_releases() -> pa.Table:
    from renyi_stream.queries.release_store import RELEASE_SCHEMA

    return RELEASE_SCHEMA.empty_table()


def _empty_dead() -> pa.Table:
    from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA

    return DEAD_LETTER_SCHEMA.empty_table()
