"""Both batch jobs on Beam's portable workers, as Flink and Dataflow run Python (issue 19, item 4).

The daily job (``renyi-stream run``) and the distributed job (``python -m renyi_stream.pipelines.distributed``)
run their DoFns in SDK harness processes started by a worker pool (``worker_pool_main``), which
reach the runner over the Fn API: control, data, state and timers over gRPC (the filter's bag
state and its event-time timer included). Two runner routes:

* ``fn-api-runner`` (both jobs): ``--environment_type=EXTERNAL --environment_config=HOST:PORT
  --direct_num_workers=2``: Beam's FnApiRunner in the job's process drives two harnesses, the
  bundles of every stage going to both in turn;
* ``portable-runner`` (the daily job): ``--runner=PortableRunner --job_endpoint=embed`` with the
  same environment: the pipeline is submitted over the Job API to Beam's job service (as to
  Flink's job server), which drives one harness. The job service runs the same portable graph
  on the same FnApiRunner, so one job is enough to check the submission route.

The pool lives in a network namespace of its own where the machine allows it, else on loopback
(``tests/portable_workers.py``; ``RENYI_PORTABLE_WORKERS=netns|loopback`` forces one); the test
output says which mode ran.

Each job continues a ledger that an in-process run started, once in process (the reference) and
once per route on the workers, each from an identical copy of that state: the public releases,
the ledger and the curator's row counts must be identical, bit for bit (the inputs are halves,
so the sums are exact whatever order the shards' partial sums are added in).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from portable_workers import WorkerPool, run_job, worker_pool

from renyi_stream.pipelines.cli import main as cli
from renyi_stream.pipelines.distributed import job as dist
from renyi_stream.queries.release_store import RELEASE_SCHEMA
from renyi_stream.stream.noise import NoiseKey

DAY0 = dt.date(2026, 3, 1)
WINDOWS = [20513, 20514, 20515]  # 2026-03-01 .. 03
TIMEOUT_S = 180.0  # a run takes a few seconds; harnesses that cannot reach the runner hang it
PROMISE = ["--epsilon", "1.0", "--delta", "1e-6", "--norm-budget", "2.0", "--shards", "4", "--quiet"]
#: The input contract each new ledger's first run declares (issue 28): the days' columns, bounded
#: so that every value is inside its clamp (0/1 indicators, spends of 0 to 1.5 in halves).
DECLARE = ["--id-type", "int64", "--column", "opened=0:1", "--column", "spent=0:1.5"]


@dataclass(frozen=True)
class Route:
    """How a job reaches the pool's harnesses, and how many harnesses it asks the pool for."""

    options: Callable[[WorkerPool], list[str]]
    harnesses: int


ROUTES = {
    "fn-api-runner": Route(lambda pool: pool.beam_options(2), 2),
    "portable-runner": Route(WorkerPool.portable_runner_options, 1),
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> WorkerPool:
    with worker_pool(tmp_path_factory.mktemp("pool")) as running:
        yield running


@pytest.fixture(autouse=True)
def _say_which_mode_runs(pool, capsys) -> None:
    with capsys.disabled():  # in the test output at any verbosity, passed or failed
        print(f"\n[portable workers] mode {pool.mode}: {pool.detail}")


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> list[str]:
    """Three days of 40 of 60 users; day 2 also has a duplicate (user, day) and a NaN value."""
    folder, rng = tmp_path_factory.mktemp("in"), np.random.default_rng(19)
    paths = []
    for d in range(3):
        users = rng.choice(60, 40, replace=False)
        # Halves: every sum is exact in floating point, whatever the order of the additions.
        opened, spent = (rng.random(40) < 0.5).astype(np.float64), rng.integers(0, 4, 40) * 0.5
        if d == 1:
            users, opened, spent = (np.append(users, users[:2]), np.append(opened, [1.0, 0.0]),
                                    np.append(spent, [0.5, np.nan]))
        pq.write_table(pa.table({
            "user_id": pa.array(users, type=pa.int64()),
            "day": pa.array([DAY0 + dt.timedelta(days=d)] * len(users), type=pa.date32()),
            "opened": pa.array(opened), "spent": pa.array(spent),
        }), folder / f"day-{d}.parquet")
        paths.append(str(folder / f"day-{d}.parquet"))
    return paths


def _in_process(argv: list[str]) -> None:
    """Run ``python -m <module> <args>`` (``argv``) in this process, on the in-process runner."""
    _, module, *args = argv
    main = {"renyi_stream.pipelines.cli.main": cli.main, "renyi_stream.pipelines.distributed": dist.main}[module]
    assert main(args) == 0


def _on_workers(pool: WorkerPool, route: Route, argv: list[str]) -> None:
    """Run ``python <argv>`` on ``route`` in a process of its own (killed with its group if the
    harnesses cannot reach it) and check that the pool started the harnesses it asked for."""
    started = pool.harnesses_started()
    done = run_job(argv + route.options(pool), timeout=TIMEOUT_S)
    assert done.returncode == 0, f"[portable workers: {pool.detail}]\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert pool.harnesses_started() - started == route.harnesses, pool.detail


# --- renyi-stream run ------------------------------------------------------------------------------


def _daily(folder: Path, inputs: list[str], start: str, end: str, key: Path, *declare: str) -> list[str]:
    return ["-m", "renyi_stream.pipelines.cli.main", "run", "--input", *inputs, "--store", str(folder / "releases.duckdb"),
            "--ledger", str(folder / "ledger.duckdb"), "--start", start, "--end", end, "--key", str(key), *PROMISE,
            *declare]


def _curator_and_public(folder: Path) -> dict[str, list[tuple]]:
    """What a daily run leaves: the public releases and the curator's ledger and books."""
    queries = {
        "releases": f"SELECT {', '.join(RELEASE_SCHEMA.names)} FROM releases ORDER BY query_id, window_id, coordinate",
        "ledger": "SELECT * FROM ledger ORDER BY user_id",
        "run_counts": "SELECT run_id, rows_read, admitted, clipped, dropped, rejected, late FROM run_counts ORDER BY run_id",
        "window_counts": "SELECT * FROM window_counts ORDER BY run_id, window_id",
        "dead_letters": "SELECT * FROM dead_letters ORDER BY ALL",
    }
    out = {}
    for name, sql in queries.items():
        with duckdb.connect(str(folder / ("releases.duckdb" if name == "releases" else "ledger.duckdb")),
                            read_only=True) as con:
            out[name] = con.execute(sql).fetchall()
    return out


@dataclass(frozen=True)
class DailyCase:
    key: Path
    day1: Path  # the ledger and release store after the first day, which every later run copies
    expected: dict[str, list[tuple]]  # what the next run leaves in process


@pytest.fixture(scope="module")
def daily(tmp_path_factory, days) -> DailyCase:
    root = tmp_path_factory.mktemp("daily")
    key, day1, reference = root / "key" / "noise.key", root / "day-1", root / "in-process"
    _in_process(_daily(day1, days[:1], "2026-03-01", "2026-03-01", key, *DECLARE))  # the new ledger declares
    shutil.copytree(day1, reference)  # one ledger (one ledger id, so one noise), continued from copies
    _in_process(_daily(reference, days[1:], "2026-03-02", "2026-03-03", key))
    expected = _curator_and_public(reference)
    assert {w for _, w, *_ in expected["releases"]} == set(WINDOWS)
    assert {r[3] for r in expected["dead_letters"]} == {"duplicate_user_window", "non_finite_value"}
    return DailyCase(key, day1, expected)


@pytest.mark.parametrize("route", ROUTES)
def test_renyi_stream_run_on_sdk_harnesses_gives_the_in_process_releases_and_ledger(tmp_path, pool, daily, days,
                                                                                    route):
    folder = tmp_path / "workers"
    shutil.copytree(daily.day1, folder)
    _on_workers(pool, ROUTES[route], _daily(folder, days[1:], "2026-03-02", "2026-03-03", daily.key))
    got = _curator_and_public(folder)
    for name, expected in daily.expected.items():
        assert got[name] == expected, f"{name} differ on {route} [portable workers: {pool.detail}]"


# --- python -m renyi_stream.pipelines.distributed ---------------------------------------------------------------


def _distributed(inputs: list[str], start: str, end: str, previous: Path | str, output: Path, public: Path,
                 key: Path) -> list[str]:
    # --wait: the launcher waits for the job (and prints its totals) on any runner, not only the DirectRunner.
    # A new ledger (previous "none") declares its contract; a continuation keeps the recorded one.
    declare = DECLARE if str(previous) == "none" else []
    return ["-m", "renyi_stream.pipelines.distributed", "--input", *inputs, "--start", start, "--end", end,
            "--previous-ledger", str(previous), "--output", str(output), "--releases-parquet", str(public),
            "--noise-key", str(key), "--wait", *PROMISE, *declare]


def _release_files(public: Path) -> dict[str, pa.Table]:
    return {str(f.relative_to(public)): pq.read_table(f) for f in sorted(public.glob("window_id=*/*.parquet"))}


def _snapshot(output: Path) -> tuple[pa.Table, dict]:
    manifest = json.loads((output / dist.COMMITTED).read_text())
    ledger = pa.concat_tables([pq.read_table(f) for f in manifest["ledger_files"]]).sort_by("user_id")
    return ledger, manifest["totals"]


@dataclass(frozen=True)
class DistributedCase:
    key: Path
    public: Path
    day1: Path  # the first day's --output, the --previous-ledger of every later run
    saved: Path  # copies of public and day1 as the first day left them
    expected_files: dict[str, pa.Table]  # the release files after the next run in process
    expected_ledger: pa.Table
    expected_totals: dict

    def restore(self) -> None:
        """Put the public root and the first day's output back as the first day left them: their
        manifests name their paths, so every continuation must run at the same paths."""
        for path in (self.public, self.day1):
            if path.exists():
                shutil.rmtree(path)
            shutil.copytree(self.saved / path.name, path)


@pytest.fixture(scope="module")
def distributed(tmp_path_factory, days) -> DistributedCase:
    root = tmp_path_factory.mktemp("distributed")
    key, public, day1 = root / "key" / "noise.key", root / "public", root / "runs" / "day-1"
    NoiseKey.load_or_create(key)
    _in_process(_distributed(days[:1], "2026-03-01", "2026-03-01", "none", day1, public, key))
    for path in (public, day1):
        shutil.copytree(path, root / "saved" / path.name)
    _in_process(_distributed(days[1:], "2026-03-02", "2026-03-03", day1, root / "runs" / "in-process", public, key))
    files = _release_files(public)
    assert sorted(files) == [f"window_id={w}/releases.parquet" for w in WINDOWS]
    ledger, totals = _snapshot(root / "runs" / "in-process")
    assert totals["rejected"] + totals["late"] >= 2  # the test's bad rows
    return DistributedCase(key, public, day1, root / "saved", files, ledger, totals)


def test_the_distributed_job_on_two_sdk_harnesses_gives_the_in_process_releases_and_ledger(tmp_path, pool,
                                                                                           distributed, days):
    case, route = distributed, "fn-api-runner"
    case.restore()
    output = tmp_path / "workers"
    _on_workers(pool, ROUTES[route],
                _distributed(days[1:], "2026-03-02", "2026-03-03", case.day1, output, case.public, case.key))
    files = _release_files(case.public)
    assert files.keys() == case.expected_files.keys()
    for name, table in case.expected_files.items():
        assert files[name].equals(table), f"{name} differs on {route} [portable workers: {pool.detail}]"
    ledger, totals = _snapshot(output)
    assert ledger.equals(case.expected_ledger), f"ledger snapshots differ on {route} [portable workers: {pool.detail}]"
    assert totals == case.expected_totals
