"""End to end on the real Beam DirectRunner, real Parquet and real DuckDB files: one test per
streaming invariant of docs/architecture.md, plus crash recovery and the multi-process runner."""

from __future__ import annotations

import datetime as dt
import math
import os
import subprocess
import sys
import textwrap

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.curator.store import CuratorStore, CuratorStoreError, RunLock
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.release_store import ReleaseConflictError, ReleaseStore
from declared import contract

# The ledgers' declared input (issue 28): 0/1 indicators, whose clamped sums are their plain sums.
DECLARED = contract("int64", "opened=0:1", "bought=0:1")

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _write_day(path, day_offset, users, opened, bought, *, extra_rows=None):
    table = pa.table({
        "user_id": pa.array(users, type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=day_offset)] * len(users), type=pa.date32()),
        "opened": pa.array(opened, type=pa.float64()),
        "bought": pa.array(bought, type=pa.float64()),
    })
    if extra_rows is not None:
        table = pa.concat_tables([table, extra_rows.cast(table.schema)])
    pq.write_table(table, path)
    return str(path)


def _config(tmp_path, inputs, *, start=0, end=2, norm_budget=2.5, name="a", **kw):
    return JobConfig(
        inputs=tuple(inputs), store=str(tmp_path / f"{name}.releases.duckdb"), ledger=str(tmp_path / f"{name}.ledger.duckdb"),
        epsilon=1.0, delta=1e-6, norm_budget=norm_budget, start_window=W0 + start, end_window=W0 + end,
        key_path=str(tmp_path / "shared.key"), n_shards=4, **{"contract": DECLARED, **kw},
    )


def _same_ledger(first, *others) -> None:
    """Start each config's ledger as a copy of ``first``'s new, empty ledger: one ledger (one
    ledger id) run several times, whose runs must agree bit for bit. Two ledgers never draw the
    same noise, even with one key file (issue 18)."""
    import shutil

    CuratorStore(first.ledger).close()
    for other in others:
        shutil.copy(first.ledger, other.ledger)


def _releases(config) -> pa.Table:
    with ReleaseStore(config.store, read_only=True) as store:
        return store.read().select(["query_id", "window_id", "coordinate", "value", "noise_std"])


def _run_totals(config) -> list[tuple]:
    """The curator's row totals of every run: (rows_read, admitted, clipped, dropped, rejected, late)."""
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        return db.execute("SELECT rows_read, admitted, clipped, dropped, rejected, late FROM run_counts "
                          "ORDER BY run_id").fetchall()
    finally:
        db.close()


def _ledger(config) -> dict:
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        return dict(db.execute("SELECT user_id, used FROM ledger ORDER BY user_id").fetchall())
    finally:
        db.close()


def test_every_window_of_the_schedule_is_released_even_without_rows(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2], [1.0, 0.0], [0.0, 1.0])
    config = _config(tmp_path, [day0], start=0, end=3)
    summary = run_job(config)
    released = _releases(config)
    assert sorted(set(released.column("window_id").to_pylist())) == [W0, W0 + 1, W0 + 2, W0 + 3]
    assert released.num_rows == 4 * 2  # every window x every query (column)
    assert summary.windows_released == [W0, W0 + 1, W0 + 2, W0 + 3]


def test_budgets_accumulate_across_daily_runs(tmp_path):
    # ||q||^2 = 1 per day against B = 2.5: two days fit, the third must be dropped. A ledger
    # scoped to the window (invariant 1 broken) would admit all three.
    statuses = []
    for day in range(3):
        path = _write_day(tmp_path / f"d{day}.parquet", day, [7], [1.0], [0.0])
        summary = run_job(_config(tmp_path, [path], start=day, end=day))
        statuses.append((summary.admitted, summary.dropped))
    assert statuses == [(1, 0), (1, 0), (0, 1)]


def test_a_ledger_continued_with_another_shard_count_gives_the_ledger_and_releases_of_the_same_count(tmp_path):
    # Invariant 1 (ledger-never-window-scoped) across a change of --shards: the ledger is restored
    # whole and split again by user (renyi_stream.stream.engine.sharding.shard_of), so every user finds their
    # own budget, as in the distributed and streaming jobs (renyi_stream.stream.engine.ledger_config, "per run").
    from dataclasses import replace

    rng = np.random.default_rng(11)
    users = np.arange(200)
    days = [_write_day(tmp_path / f"d{d}.parquet", d, users, (rng.random(200) < 0.8).astype(float),
                       (rng.random(200) < 0.5).astype(float)) for d in range(3)]
    kept, resharded = (_config(tmp_path, days[:2], start=0, end=1, norm_budget=2.5, name=n) for n in ("kept", "re"))
    _same_ledger(kept, resharded)
    run_job(kept)
    run_job(resharded)
    run_job(_config(tmp_path, days[2:], start=2, end=2, norm_budget=2.5, name="kept"))
    run_job(replace(_config(tmp_path, days[2:], start=2, end=2, norm_budget=2.5, name="re"), n_shards=7))
    assert _ledger(resharded) == _ledger(kept) and len(_ledger(kept)) == 200
    ours, theirs = _releases(resharded).to_pylist(), _releases(kept).to_pylist()
    assert [r["query_id"] for r in ours] == [r["query_id"] for r in theirs] and len(ours) == 6
    # Equal but for the order in which the shards' partial sums are added (last bits).
    assert [r["value"] for r in ours] == pytest.approx([r["value"] for r in theirs], rel=1e-12, abs=1e-9)


def test_budgets_accumulate_across_windows_within_one_run(tmp_path):
    paths = [_write_day(tmp_path / f"d{d}.parquet", d, [7], [1.0], [0.0]) for d in range(3)]
    summary = run_job(_config(tmp_path, paths, start=0, end=2))
    assert (summary.admitted, summary.dropped) == (2, 1)


def test_shuffled_input_order_gives_identical_ledger_and_releases(tmp_path):
    rng = np.random.default_rng(4)
    users = np.arange(300)
    files = []
    for day in range(3):
        opened = (rng.random(300) < 0.6).astype(float)
        bought = (rng.random(300) < 0.3).astype(float)
        files.append((day, users, opened, bought))
    ordered = [_write_day(tmp_path / f"o{d}.parquet", d, u, o, b) for d, u, o, b in files]
    shuffled = []
    for d, u, o, b in reversed(files):
        perm = rng.permutation(len(u))
        shuffled.append(_write_day(tmp_path / f"s{d}.parquet", d, u[perm], o[perm], b[perm]))
    first = _config(tmp_path, ordered, name="ordered")
    second = _config(tmp_path, shuffled, name="shuffled")
    _same_ledger(first, second)
    run_job(first)
    run_job(second)
    assert _releases(first).equals(_releases(second))
    assert _ledger(first) == _ledger(second)


def test_a_rerun_of_a_processed_day_charges_nobody_and_releases_nothing_new(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2, 3], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0])
    config = _config(tmp_path, [day0], start=0, end=0)
    run_job(config)
    releases, ledger = _releases(config), _ledger(config)
    again = run_job(config)
    assert _releases(config).equals(releases)
    assert _ledger(config) == ledger
    assert again.releases_published == 0
    assert (again.admitted, again.late) == (0, 3)
    assert again.windows_skipped == [W0]


def test_bad_and_late_rows_are_dead_lettered_and_the_totals_hold(tmp_path):
    first = _write_day(tmp_path / "d0.parquet", 0, [1], [1.0], [0.0])
    config = _config(tmp_path, [first], start=0, end=1)
    run_job(_config(tmp_path, [first], start=0, end=0))
    bad = pa.table({
        "user_id": pa.array([None, 5, 5, 6], type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=1)] * 3 + [DAY0], type=pa.date32()),
        "opened": pa.array([1.0, float("nan"), 1.0, 1.0]),
        "bought": pa.array([0.0, 0.0, 0.0, 0.0]),
    })
    second = _write_day(tmp_path / "d1.parquet", 1, [1, 2, 2], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0], extra_rows=bad)
    summary = run_job(_config(tmp_path, [second], start=0, end=1))
    assert summary.rows_read == 7
    assert summary.balanced
    assert summary.late == 1  # user 6's row for the already released day 0
    db = duckdb.connect(config.ledger, read_only=True)
    reasons = sorted(r for (r,) in db.execute("SELECT reason FROM dead_letters").fetchall())
    db.close()
    assert reasons == ["duplicate_user_window", "late_window", "non_finite_value", "null_user_id"]


def test_nothing_pre_noise_reaches_the_release_store(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, list(range(50)), [1.0] * 50, [0.0] * 50)
    config = _config(tmp_path, [day0], start=0, end=0, norm_budget=100.0)
    run_job(config)
    db = duckdb.connect(config.store, read_only=True)
    tables = {name for (name,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    columns = {c for (c,) in db.execute("SELECT column_name FROM information_schema.columns").fetchall()}
    values = dict(db.execute("SELECT label, value FROM releases").fetchall())
    db.close()
    assert not tables & {"ledger", "outbox", "window_counts", "run_counts", "dead_letters"}
    assert not columns & {"used", "true_sum", "admitted", "clipped", "dropped", "user_id"}
    assert values["clamp(opened,0,1)"] != 50.0  # the exact sum is never what is stored


def test_a_second_concurrent_run_on_the_same_ledger_is_refused(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1], [1.0], [0.0])
    config = _config(tmp_path, [day0], start=0, end=0)
    with RunLock(config.ledger):
        with pytest.raises(CuratorStoreError, match="another renyi-stream run"):
            run_job(config)


def test_a_run_with_a_different_promise_is_refused(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1], [1.0], [0.0])
    run_job(_config(tmp_path, [day0], start=0, end=0))
    day1 = _write_day(tmp_path / "d1.parquet", 1, [1], [1.0], [0.0])
    with pytest.raises(CuratorStoreError, match="epsilon"):
        run_job(JobConfig(**{**_config(tmp_path, [day1], start=1, end=1).__dict__, "epsilon": 2.0}))


def _record_in_meta(config, **values) -> None:
    """Write ledger parameters as another version of renyi-stream might have recorded them."""
    db = duckdb.connect(config.ledger)
    try:
        for name, value in values.items():
            db.execute("UPDATE meta SET value = ? WHERE key = ?", [repr(float(value)), name])
    finally:
        db.close()


def _recorded(config) -> dict:
    db = duckdb.connect(config.ledger, read_only=True)
    try:
        return {k: float(v) for k, v in db.execute(
            "SELECT key, value FROM meta WHERE key IN ('rho', 'noise_std', 'tracker_step')").fetchall()}
    finally:
        db.close()


def _as_another_version(tmp_path, rho_factor: float) -> tuple:
    """Day 0 run, then its ledger's budget rescaled by ``rho_factor`` with the noise std and tracker
    step that budget gives (what a version whose root finder ends elsewhere records)."""
    from renyi_stream.stream.accounting.calibration import NOISE_HEADROOM

    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2], [1.0, 0.0], [0.0, 1.0])
    config = _config(tmp_path, [day0], start=0, end=0)
    run_job(config)
    rho = _recorded(config)["rho"] * rho_factor
    _record_in_meta(config, rho=rho, noise_std=math.sqrt(config.norm_budget / (2 * rho)) * (1 + NOISE_HEADROOM),
                    tracker_step=rho / 32)
    day1 = _write_day(tmp_path / "d1.parquet", 1, [1, 2], [1.0, 1.0], [0.0, 1.0])
    return _config(tmp_path, [day1], start=1, end=1), _recorded(config)


def test_a_ledger_whose_budget_differs_in_its_last_bits_continues_with_its_own_budget_and_noise(tmp_path):
    follow_up, recorded = _as_another_version(tmp_path, 1 - 3e-14)
    run_job(follow_up)
    assert _recorded(follow_up) == recorded
    day1 = _releases(follow_up).filter(pa.compute.equal(_releases(follow_up).column("window_id"), W0 + 1))
    assert day1.num_rows > 0 and set(day1.column("noise_std").to_pylist()) == {recorded["noise_std"]}


def test_a_ledger_whose_budget_is_above_the_promise_is_refused(tmp_path):
    follow_up, _ = _as_another_version(tmp_path, 1 + 1e-9)
    with pytest.raises(CuratorStoreError, match=r"rho: ledger has .*recorded_rho must be at most"):
        run_job(follow_up)


@pytest.mark.parametrize("name", ["noise_std", "tracker_step"])
def test_a_ledger_whose_noise_or_tracker_does_not_follow_from_its_budget_is_refused(tmp_path, name):
    follow_up, recorded = _as_another_version(tmp_path, 1.0)
    _record_in_meta(follow_up, **{name: recorded[name] * (1 + 1e-15)})
    with pytest.raises(CuratorStoreError, match=rf"{name}: ledger has .*the ledger was edited"):
        run_job(follow_up)


_CRASHING_RUN = textwrap.dedent("""
    import sys
    from renyi_stream.pipelines.daily.job import JobConfig, run_job
    from renyi_stream.stream.contract import InputContract
    from renyi_stream.stream.schema import WindowSpec
    inputs, store, ledger, key, start, end, declared = sys.argv[1:8]
    run_job(JobConfig(inputs=(inputs,), store=store, ledger=ledger, epsilon=1.0, delta=1e-6,
                      norm_budget=2.5, start_window=int(start), end_window=int(end), key_path=key, n_shards=4,
                      contract=InputContract.from_json(declared)))
""")


@pytest.mark.parametrize("crash_at", ["while_reading", "after_ledger_write", "before_publish",
                                      "during_release_insert", "after_publish"])
def test_a_run_killed_mid_commit_recovers_to_the_uninterrupted_outcome(tmp_path, crash_at):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2, 3], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0])
    clean = _config(tmp_path, [day0], start=0, end=1, name="clean")
    crashed = _config(tmp_path, [day0], start=0, end=1, name="crashed")
    _same_ledger(clean, crashed)
    run_job(clean)
    args = [sys.executable, "-c", _CRASHING_RUN, day0, crashed.store, crashed.ledger, crashed.key_path,
            str(crashed.start_window), str(crashed.end_window), DECLARED.to_json()]
    result = subprocess.run(args, env={**os.environ, "RENYI_STREAM_CRASH_AT": crash_at}, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()[-2000:]  # SIGKILL, mid-commit
    rerun = run_job(crashed)  # the re-run, with the lock left behind by the dead process
    assert _releases(crashed).equals(_releases(clean))  # each window released once, same answer
    assert _ledger(crashed) == _ledger(clean)  # each user charged once
    # Row totals exact: the committed run counts as the clean one did; a re-run of a committed
    # day (crash after the commit) reads its rows again and counts every one as late.
    totals = _run_totals(crashed)
    assert totals[0] == _run_totals(clean)[0]
    committed_before_crash = crash_at in ("before_publish", "during_release_insert", "after_publish")
    assert len(totals) == (2 if committed_before_crash else 1)
    if committed_before_crash:
        assert totals[1] == (3, 0, 0, 0, 0, 3) and rerun.balanced


@pytest.mark.slow
def test_the_multi_process_direct_runner_gives_the_same_outcome(tmp_path):
    paths = [_write_day(tmp_path / f"d{d}.parquet", d, list(range(40)), [1.0] * 40, [float(d % 2)] * 40)
             for d in range(3)]
    in_memory = _config(tmp_path, paths, name="memory")
    multi = _config(tmp_path, paths, name="multi",
                    beam_args=("--runner=DirectRunner", "--direct_running_mode=multi_processing",
                               "--direct_num_workers=2"))
    _same_ledger(in_memory, multi)
    run_job(in_memory)
    summary = run_job(multi)
    assert summary.balanced
    assert _releases(multi).equals(_releases(in_memory))
    assert _ledger(multi) == _ledger(in_memory)


def test_releases_are_also_written_as_parquet_files_that_duckdb_reads(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2, 3], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0])
    root = tmp_path / "release-files"
    config = _config(tmp_path, [day0], start=0, end=2, releases_parquet=str(root))
    run_job(config)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.parquet"))
    assert files == [f"window_id={W0 + d}/releases.parquet" for d in range(3)]
    db = duckdb.connect()
    from_files = db.execute(
        f"SELECT query_id, window_id, coordinate, value, noise_std FROM read_parquet('{root}/*/*.parquet', "
        "hive_partitioning = true) ORDER BY query_id, window_id, coordinate").fetchall()
    db.close()
    from_store = [tuple(r.values()) for r in _releases(config).to_pylist()]
    assert from_files == from_store
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")}
    run_job(config)  # a re-run rewrites nothing
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")} == stamps


def test_a_release_file_is_never_rewritten_first_write_wins(tmp_path):
    from renyi_stream.pipelines.beam.transforms import WriteReleaseFiles

    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    row = {"query_id": "sum:a", "window_id": 5, "window_start": start, "window_end": start + dt.timedelta(days=1),
           "label": "a", "coordinate": 0, "value": 1.5, "noise_std": 2.0, "kind": "window",
           "accounting": "gdp", "mechanism": "gaussian", "key_fingerprint": "f" * 16}
    writer = WriteReleaseFiles(str(tmp_path))
    assert list(writer.process((5, [row]))) == [str(tmp_path.resolve() / "window_id=5" / "releases.parquet")]
    assert list(writer.process((5, [{**row, "value": 99.0}]))) == []
    assert pq.read_table(tmp_path / "window_id=5" / "releases.parquet").column("value").to_pylist() == [1.5]


def test_a_missing_ledger_for_a_store_with_releases_is_refused(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1], [1.0], [0.0])
    config = _config(tmp_path, [day0], start=0, end=0)
    run_job(config)
    for suffix in ("", ".wal"):
        (tmp_path / ("a.ledger.duckdb" + suffix)).unlink(missing_ok=True)  # the ledger is lost
    day1 = _write_day(tmp_path / "d1.parquet", 1, [1], [1.0], [0.0])
    with pytest.raises(CuratorStoreError, match="never charged") as refused:
        run_job(_config(tmp_path, [day1], start=1, end=1))
    assert f"({DAY0.isoformat()})" in str(refused.value)  # the window's date beside its number


def test_a_ledger_restored_from_an_older_backup_is_refused(tmp_path):
    import shutil

    day0 = _write_day(tmp_path / "d0.parquet", 0, [1], [1.0], [0.0])
    run_job(_config(tmp_path, [day0], start=0, end=0))
    shutil.copy(tmp_path / "a.ledger.duckdb", tmp_path / "backup.duckdb")
    day1 = _write_day(tmp_path / "d1.parquet", 1, [1], [1.0], [0.0])
    run_job(_config(tmp_path, [day1], start=1, end=1))
    shutil.copy(tmp_path / "backup.duckdb", tmp_path / "a.ledger.duckdb")  # yesterday's ledger
    day2 = _write_day(tmp_path / "d2.parquet", 2, [1], [1.0], [0.0])
    with pytest.raises(CuratorStoreError, match="older than the store"):
        run_job(_config(tmp_path, [day2], start=2, end=2))


# --- noise bound to one ledger (issue 18) ---------------------------------------------------------


def _ledger_id(config) -> str:
    with CuratorStore(config.ledger) as curator:
        return curator.ledger_id


def _values(config) -> dict:
    return {(r["query_id"], r["window_id"], r["coordinate"]): r["value"] for r in _releases(config).to_pylist()}


def test_two_ledgers_sharing_a_key_file_release_noise_that_does_not_cancel(tmp_path):
    # A staging copy of the key file: ledger "b" runs the same day without user 3. Were the noise
    # the same, release_a - release_b would be user 3's values exactly.
    users, opened, bought = [1, 2, 3, 4], [1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]
    full = _write_day(tmp_path / "full.parquet", 0, users, opened, bought)
    without = _write_day(tmp_path / "without.parquet", 0, users[:2] + users[3:], opened[:2] + opened[3:],
                         bought[:2] + bought[3:])
    a, b = _config(tmp_path, [full], start=0, end=0, name="a"), _config(tmp_path, [without], start=0, end=0, name="b")
    assert a.key_path == b.key_path
    run_job(a)
    run_job(b)
    released_a, released_b = _values(a), _values(b)
    assert released_a.keys() == released_b.keys() == {("sum:opened", W0, 0), ("sum:bought", W0, 0)}
    user_3 = {"sum:opened": 1.0, "sum:bought": 1.0}  # both admitted: ||q||^2 = 2 <= B = 2.5
    for key, value in released_a.items():
        leaked = user_3[key[0]]
        # The two noises are independent N(0, s^2) draws (s = 6.7 here): their difference is
        # within 1e-6 of zero with probability below 1e-6.
        assert abs((value - released_b[key]) - leaked) > 1e-6
    assert _ledger_id(a) != _ledger_id(b)


def test_each_store_records_the_ledger_that_charged_for_its_releases(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2], [1.0, 0.0], [0.0, 1.0])
    config = _config(tmp_path, [day0], start=0, end=0)
    run_job(config)
    with ReleaseStore(config.store, read_only=True) as store:
        assert store.ledger_id() == _ledger_id(config) and len(store.ledger_id()) == 32


def test_a_store_holding_another_ledgers_releases_refuses_this_ledger_before_anyone_is_charged(tmp_path):
    # Both ledgers charged window W0 (same key file), so neither the key check nor the "ledger
    # behind the store" check can tell them apart: only the ledger id does.
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2], [1.0, 0.0], [0.0, 1.0])
    a, b = _config(tmp_path, [day0], start=0, end=0, name="a"), _config(tmp_path, [day0], start=0, end=0, name="b")
    run_job(a)
    run_job(b)
    day1 = _write_day(tmp_path / "d1.parquet", 1, [1, 2], [1.0, 1.0], [0.0, 1.0])
    # Ledger b records its own store: told that store moved to a's (which holds every window b
    # published, so the move is believable), only the ledger id can still tell them apart.
    b_into_a = JobConfig(**{**_config(tmp_path, [day1], start=1, end=1, name="b").__dict__, "store": a.store,
                            "store_moved": True})
    ledger_before, store_before = _ledger(b), _releases(a)
    with pytest.raises(ReleaseConflictError, match="ledger") as refused:
        run_job(b_into_a)
    assert _ledger_id(a) in str(refused.value) and _ledger_id(b) in str(refused.value)
    assert _ledger(b) == ledger_before and len(_run_totals(b)) == 1  # nobody charged, no run recorded
    assert _releases(a).equals(store_before)


def test_a_rerun_of_a_day_restored_from_backup_draws_the_identical_release(tmp_path):
    # The same ledger re-running the same day (ledger and store restored from a backup taken
    # before the run): the noise is derived again and must be the same draw (invariant 5).
    import shutil

    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2, 3], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0])
    config = _config(tmp_path, [day0], start=0, end=1)
    CuratorStore(config.ledger).close()
    shutil.copy(config.ledger, tmp_path / "backup.duckdb")
    run_job(config)
    first = _releases(config)
    os.remove(config.store)
    shutil.copy(tmp_path / "backup.duckdb", config.ledger)
    run_job(config)
    assert _releases(config).equals(first)


def test_a_ledger_and_store_from_before_ledger_ids_get_one_at_the_next_run_and_keep_their_releases(tmp_path):
    day0 = _write_day(tmp_path / "d0.parquet", 0, [1, 2], [1.0, 0.0], [0.0, 1.0])
    config = _config(tmp_path, [day0], start=0, end=0)
    run_job(config)
    for path, table in ((config.ledger, "meta"), (config.store, "store_meta")):  # as an older version left them
        with duckdb.connect(path) as db:
            db.execute(f"DELETE FROM {table} WHERE key = 'ledger_id'")
    published = _releases(config)
    day1 = _write_day(tmp_path / "d1.parquet", 1, [1, 2], [1.0, 1.0], [0.0, 1.0])
    run_job(_config(tmp_path, [day1], start=1, end=1))
    ledger_id = _ledger_id(config)
    with ReleaseStore(config.store, read_only=True) as store:
        assert store.ledger_id() == ledger_id
    now = _releases(config)
    assert now.filter(pa.compute.equal(now.column("window_id"), W0)).equals(published)
    assert set(now.column("window_id").to_pylist()) == {W0, W0 + 1}
