"""Crash injection at every commit point of a daily run (issue 6; invariant 5 (release-once),
invariant 6 (charge-once) and invariant 7 (rows-counted-not-lost), docs/architecture.md).

Each test kills a real run with SIGKILL at one named point (``RENYI_STREAM_CRASH_AT``, see
:mod:`renyi_stream.stream.faults`), checks that the crash left the state that point promises, re-runs the same
day and compares everything with an uninterrupted run on a fresh store and a copy of the same new
ledger with the same noise key (every ledger here is a copy of one new ledger, so one ledger id:
two ledgers draw independent noise, issue 18): the ledger table (every user charged exactly once), every window released exactly
once with the same value, the outbox fully published, the per-window counts, the dead letters and
the row totals ``rows read = admitted + clipped + dropped + rejected + late``.

The input has all five kinds of rows: admitted, clipped (policy ``clip``, a user past their
budget), dropped (a user with no budget left), rejected (null user, NaN, a duplicate
``(user, day)``) and, in the two-day variant, a late row for an already released day.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import textwrap

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.curator.store import CuratorStore
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.release_store import ReleaseStore

from conformance.crash import run_killed_at
from declared import contract

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
USERS = 120  # 120 + 80 + 80 rows over three days, and 3 bad rows a day: 289 rows
# The ledgers' declared input (issue 28): 0/1 indicators, whose clamped sums are their plain sums.
DECLARED = contract("int64", "opened=0:1", "bought=0:1")

# Commit points in the order a run meets them, and whether the curator's transaction (ledger,
# outbox, counts) had committed when the process died.
POINTS = {
    "while_reading": False,
    "after_ledger_write": False,
    "before_publish": True,
    "during_release_insert": True,
    "during_publish": True,
    "after_publish": True,
}


def _rows(day: int, users: range) -> dict[str, list]:
    """One day of indicators. With B = 2.5 (squared norm) and policy clip: heavy users
    (``u % 3 == 0``, norm^2 2 a day) are admitted on day 0, clipped on day 1, dropped on day 2;
    light users (1 a day) are clipped on day 2; the rest contribute 0 or only on day 0."""
    ids, opened, bought = [], [], []
    for u in users:
        if u % 3 == 2 and day > 0:
            continue  # sparse users: day 0 only
        ids.append(u)
        opened.append(1.0 if u % 3 in (0, 1) or day == 0 else 0.0)
        bought.append(1.0 if u % 3 == 0 else 0.0)
    return {"user_id": ids, "opened": opened, "bought": bought}


def _write_day(path, day: int, *, late_for: int | None = None) -> str:
    rows = _rows(day, range(USERS))
    days = [DAY0 + dt.timedelta(days=day)] * len(rows["user_id"])
    # Rejected rows: null user, NaN indicator, a repeated (user, day).
    rows["user_id"] += [None, 5, 1]
    rows["opened"] += [1.0, float("nan"), 1.0]
    rows["bought"] += [0.0, 0.0, 0.0]
    days += [DAY0 + dt.timedelta(days=day)] * 3
    if late_for is not None:  # a row for a day an earlier run released
        rows["user_id"].append(7)
        rows["opened"].append(1.0)
        rows["bought"].append(1.0)
        days.append(DAY0 + dt.timedelta(days=late_for))
    pq.write_table(pa.table({
        "user_id": pa.array(rows["user_id"], type=pa.int64()),
        "day": pa.array(days, type=pa.date32()),
        "opened": pa.array(rows["opened"], type=pa.float64()),
        "bought": pa.array(rows["bought"], type=pa.float64()),
    }), path)
    return str(path)


def _config(root, inputs, start: int, end: int, name: str) -> JobConfig:
    return JobConfig(inputs=tuple(inputs), store=str(root / f"{name}.releases.duckdb"),
                     ledger=str(root / f"{name}.ledger.duckdb"), epsilon=1.0, delta=1e-6, norm_budget=2.5,
                     start_window=W0 + start, end_window=W0 + end, policy="clip", key_path=str(root / "shared.key"),
                     n_shards=4, contract=DECLARED)


def _pristine(root) -> str:
    """The one new ledger every ledger of this module starts as a copy of (created once)."""
    path = os.path.join(root, "pristine.ledger.duckdb")
    if not os.path.exists(path):
        CuratorStore(path).close()
    return path


def _same_ledger(config: JobConfig) -> JobConfig:
    """``config``, its ledger started as a copy of the module's new ledger (:func:`_pristine`)."""
    shutil.copy(_pristine(os.path.dirname(config.ledger)), config.ledger)
    return config


def _fresh(config: JobConfig, tmp_path) -> JobConfig:
    """``config`` on a store and a copy of the module's new ledger of its own (the key stays the
    shared one)."""
    fresh = dataclasses.replace(config, store=str(tmp_path / "releases.duckdb"), ledger=str(tmp_path / "ledger.duckdb"))
    shutil.copy(_pristine(os.path.dirname(config.ledger)), fresh.ledger)
    return fresh


_CRASHING_RUN = textwrap.dedent("""
    import json, sys
    from renyi_stream.pipelines.daily.job import JobConfig, run_job
    from renyi_stream.stream.contract import InputContract
    fields = json.loads(sys.argv[1])
    fields["inputs"] = tuple(fields["inputs"])
    fields["contract"] = InputContract.from_dict(fields["contract"])
    run_job(JobConfig(**fields))
""")


def _crash(config: JobConfig, point: str) -> None:
    """Run ``config`` in a child process that SIGKILLs itself at ``point``."""
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("window", "beam_args")}
    fields["contract"] = json.loads(config.contract.to_json())  # its own JSON form, which from_dict reads back
    result = run_killed_at(point, ["-c", _CRASHING_RUN, json.dumps(fields)])
    assert result.returncode == -9, f"the run did not die at {point}: {result.stderr[-2000:]}"


def _query(path: str, sql: str) -> list[tuple]:
    if not os.path.exists(path):
        return []
    db = duckdb.connect(path, read_only=True)
    try:
        return db.execute(sql).fetchall()
    except duckdb.CatalogException:
        return []  # a ledger whose first transaction never committed: no tables yet
    finally:
        db.close()


def _releases(config: JobConfig) -> pa.Table:
    if not os.path.exists(config.store):
        return pa.table({})
    with ReleaseStore(config.store, read_only=True) as store:
        return store.read().drop_columns(["released_at"])  # the only column a re-run may change


def _state(config: JobConfig) -> dict[str, list[tuple]]:
    """Everything a run commits, curator side and public side, in a comparable form."""
    ledger = config.ledger
    return {
        "ledger": _query(ledger, "SELECT user_id, used, tracker_segment, tracker_bound FROM ledger ORDER BY user_id"),
        "processed": _query(ledger, "SELECT query_id, window_id, run_id FROM processed_windows ORDER BY ALL"),
        "outbox": _query(ledger, "SELECT query_id, window_id, coordinate, value, noise_std, published, run_id "
                                 "FROM outbox ORDER BY query_id, window_id, coordinate"),
        "window_counts": _query(ledger, "SELECT run_id, window_id, admitted, clipped, dropped FROM window_counts "
                                        "ORDER BY ALL"),
        "dead": _query(ledger, "SELECT run_id, source, row_index, reason FROM dead_letters ORDER BY ALL"),
        "totals": _query(ledger, "SELECT run_id, rows_read, admitted, clipped, dropped, rejected, late "
                                 "FROM run_counts ORDER BY run_id"),
        "releases": _releases(config).to_pylist(),
    }


def _assert_balanced(state: dict) -> None:
    for run_id, rows_read, admitted, clipped, dropped, rejected, late in state["totals"]:
        assert rows_read == admitted + clipped + dropped + rejected + late, f"run {run_id} does not balance"


def _assert_same_outcome(crashed: dict, clean: dict, *, committed_before_crash: bool, runs_before: int = 0) -> None:
    """``crashed`` (after its re-run) equals ``clean``, except that a re-run of a day whose run
    committed before the crash is one more run, reading every row again and counting it as late."""
    assert crashed["ledger"] == clean["ledger"]  # every user charged exactly once
    assert crashed["releases"] == clean["releases"]  # every window released once, same answer
    keys = [(r["query_id"], r["window_id"], r["coordinate"]) for r in crashed["releases"]]
    assert len(keys) == len(set(keys))
    assert crashed["outbox"] == clean["outbox"] and all(row[5] for row in crashed["outbox"])  # all published
    assert crashed["processed"] == clean["processed"]
    assert crashed["window_counts"] == clean["window_counts"]
    _assert_balanced(crashed)
    if not committed_before_crash:  # the re-run is the run the crash interrupted
        assert crashed["totals"] == clean["totals"] and crashed["dead"] == clean["dead"]
        return
    assert crashed["totals"][:-1] == clean["totals"]
    extra_run, rows_read, admitted, clipped, dropped, rejected, late = crashed["totals"][-1]
    assert extra_run == runs_before + 2
    assert (admitted, clipped, dropped) == (0, 0, 0)  # nobody charged a second time
    last_clean = clean["totals"][-1]
    assert rows_read == last_clean[1]  # the same rows read again: all late, or rejected as before
    assert late >= sum(last_clean[2:5]) and 0 < rejected <= last_clean[5]
    assert [d for d in crashed["dead"] if d[0] != extra_run] == clean["dead"]
    reasons = [d[3] for d in crashed["dead"] if d[0] == extra_run]
    assert reasons.count("late_window") == late and len(reasons) == rejected + late


def _assert_left_as_promised(point: str, state: dict, before: dict, windows: list[int]) -> None:
    """What the crash itself left: nothing of this run before the curator's commit; after it,
    the ledger committed and the store holding none, some or all of this run's windows."""
    new_releases = [r for r in state["releases"] if r not in before["releases"]]
    published = sorted({r["window_id"] for r in new_releases})
    if not POINTS[point]:
        assert state["ledger"] == before["ledger"] and state["totals"] == before["totals"]
        assert state["outbox"] == before["outbox"] and not new_releases
        return
    assert len(state["totals"]) == len(before["totals"]) + 1  # the curator's transaction committed
    pending = [row for row in state["outbox"] if not row[5]]
    if point in ("before_publish", "during_release_insert"):
        assert published == [] and {row[1] for row in pending} == set(windows)
    elif point == "during_publish":
        assert published == windows[:1] and {row[1] for row in pending} == set(windows)
    else:  # after_publish: all public, none marked yet
        assert published == windows and {row[1] for row in pending} == set(windows)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Uninterrupted runs on fresh stores, with copies of one new ledger and the shared key: one
    run over days 0-2, and a two-day stream (day 0, then days 1-2 with a late row for day 0)."""
    root = tmp_path_factory.mktemp("crash")
    files = {"d0": _write_day(root / "d0.parquet", 0), "d1": _write_day(root / "d1.parquet", 1),
             "d2": _write_day(root / "d2.parquet", 2), "d2_late": _write_day(root / "d2-late.parquet", 2, late_for=0)}
    one = _same_ledger(_config(root, [files["d0"], files["d1"], files["d2"]], 0, 2, "clean"))
    run_job(one)
    first = _same_ledger(_config(root, [files["d0"]], 0, 0, "clean2"))
    second = _config(root, [files["d1"], files["d2_late"]], 1, 2, "clean2")
    run_job(first)
    day_one = _state(first)
    run_job(second)
    return {"root": root, "files": files, "one": _state(one), "day_one": day_one, "two": _state(second)}


def test_the_input_exercises_every_kind_of_row(clean):
    """Otherwise the row totals below would compare zeros."""
    (_, rows_read, admitted, clipped, dropped, rejected, late), = clean["one"]["totals"]
    assert rows_read == USERS + 2 * (USERS - USERS // 3) + 3 * 3
    assert min(admitted, clipped, dropped) >= USERS // 3 and rejected == 3 * 3 and late == 0
    assert rows_read == admitted + clipped + dropped + rejected + late
    assert clean["two"]["totals"][1][6] == 1  # the late row of the two-day stream


@pytest.mark.parametrize("point", list(POINTS))
def test_a_run_killed_at_each_commit_point_recovers_to_the_uninterrupted_outcome(clean, tmp_path, point):
    files = clean["files"]
    config = _fresh(_config(clean["root"], [files["d0"], files["d1"], files["d2"]], 0, 2, "crash"), tmp_path)
    _crash(config, point)
    nothing = {"ledger": [], "totals": [], "outbox": [], "releases": []}
    _assert_left_as_promised(point, _state(config), nothing, [W0, W0 + 1, W0 + 2])
    summary = run_job(config)  # the same day again, the dead run's lock file still there
    assert summary.balanced
    _assert_same_outcome(_state(config), clean["one"], committed_before_crash=POINTS[point])


@pytest.mark.parametrize("point", ["after_ledger_write", "during_publish"])
def test_a_crash_on_the_second_day_leaves_the_first_day_intact(clean, tmp_path, point):
    files = clean["files"]
    first = _fresh(_config(clean["root"], [files["d0"]], 0, 0, "crash"), tmp_path)
    second = dataclasses.replace(first, inputs=(files["d1"], files["d2_late"]), start_window=W0 + 1,
                                 end_window=W0 + 2)
    run_job(first)
    day_one = _state(first)
    assert day_one == clean["day_one"]
    _crash(second, point)
    after_crash = _state(second)
    # Day 0 is untouched: its releases, its users' charges (in the ledger or, after the commit,
    # the day-0 part of every user's history), its counts and dead letters.
    assert [r for r in after_crash["releases"] if r["window_id"] == W0] == day_one["releases"]
    assert [row for row in after_crash["totals"] if row[0] == 1] == day_one["totals"]
    assert [row for row in after_crash["dead"] if row[0] == 1] == day_one["dead"]
    assert [row for row in after_crash["outbox"] if row[1] == W0] == day_one["outbox"]
    if not POINTS[point]:
        assert after_crash["ledger"] == day_one["ledger"]
    _assert_left_as_promised(point, after_crash, day_one, [W0 + 1, W0 + 2])
    run_job(second)
    _assert_same_outcome(_state(second), clean["two"], committed_before_crash=POINTS[point], runs_before=1)


def test_a_query_registered_between_a_crashed_commit_and_its_publish_starts_after_the_charged_windows(
        clean, tmp_path):
    from renyi_stream.queries.linear import LinearQuery
    from renyi_stream.queries.registry import QueryRegistry

    files = clean["files"]
    first = _fresh(_config(clean["root"], [files["d0"]], 0, 0, "x"), tmp_path)
    run_job(first)
    second = dataclasses.replace(first, inputs=(files["d1"],), start_window=W0 + 1, end_window=W0 + 1)
    _crash(second, "before_publish")  # day 1 charged, not yet public
    with QueryRegistry(first.store) as registry:  # the store still shows day 0 as the last release
        registry.add(LinearQuery.columns("both", ["opened", "bought"], kind="running"), effective_from=W0 + 1)
    third = dataclasses.replace(first, inputs=(files["d2"],), start_window=W0 + 2, end_window=W0 + 2)
    run_job(third)  # publishes day 1 (without the new query), then answers it from day 2

    with QueryRegistry(first.store, read_only=True) as registry:
        row = [r for r in registry.list().to_pylist() if r["query_id"] == "both"][0]
    assert row["effective_from"] == W0 + 2
    windows = {(r["query_id"], r["window_id"]) for r in _releases(third).to_pylist()}
    assert ("both", W0 + 2) in windows and ("both", W0 + 1) not in windows
    assert {("sum:opened", W0 + w) for w in range(3)} <= windows
