"""Benchmark: the daily job on Beam's DirectRunner against PipelineDP and a NumPy floor.

One command::

    python benchmarks/bench_pipeline.py                      # N=100k users x T=30 days
    python benchmarks/bench_pipeline.py --users 20000 --days 10 --systems ours,numpy

The workload is N users x T days of one binary indicator at rate 5% (every user has a row every
day), written once as one Parquet file per day. Each system runs in its own process on the same
files, so its peak memory (ru_maxrss) is its own:

* ``ours``: ``renyi-stream run`` over all T days in one run (DirectRunner, in-memory mode),
  including the DuckDB commit and publish;
* ``pipelinedp``: PipelineDP 0.3 on its Beam backend (DirectRunner), per-day SUM with public
  partitions, Gaussian noise, the same (epsilon, delta), each user bounded to T partitions;
* ``numpy``: the same individual filter in one process without Beam: read the files with
  pyarrow and run ``Ledger.admit`` day by day (the floor this pipeline cannot beat).

Printed: rows/s and peak RSS per system, and the ratios ours/pipelinedp (throughput, memory)
and ours/numpy. Targets from issue 3 at N=100k, T=30: >= 50x PipelineDP's throughput, <= 1/4
of its peak memory, within 10x of the NumPy floor.

Each system's time is the median of its runs (``--repeat``, default 3, for ours and the floor;
``--anchor-repeat``, default 1, for PipelineDP, whose 2.5-minute run varies by a few percent
while a 3-second run varies by 20% on a shared 2-core machine). Half of the other runs come
before PipelineDP's and half after, so a drift in machine speed reaches both sides of the
ratio; every run's time is printed in order. The first run after an install or an edit also
compiles bytecode; the median keeps that out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EPSILON, DELTA = 1.0, 1e-6
DAY0 = dt.date(2026, 3, 1)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def generate(folder: Path, users: int, days: int, rate: float, seed: int = 0) -> list[str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    paths = []
    for d in range(days):
        path = folder / f"day-{d:03d}.parquet"
        pq.write_table(pa.table({
            "user_id": pa.array(np.arange(users, dtype=np.int64)),
            "day": pa.array([DAY0 + dt.timedelta(days=d)] * users, type=pa.date32()),
            "active": pa.array((rng.random(users) < rate).astype(np.float64)),
        }), path)
        paths.append(str(path))
    return paths


def run_ours(paths: list[str], scratch: Path, days: int) -> None:
    from renyi_stream.pipelines.daily.job import JobConfig, run_job
    from renyi_stream.stream.contract import DeclaredColumn, InputContract

    w0 = (DAY0 - dt.date(1970, 1, 1)).days
    summary = run_job(JobConfig(
        inputs=tuple(paths), store=str(scratch / "releases.duckdb"), ledger=str(scratch / "ledger.duckdb"),
        epsilon=EPSILON, delta=DELTA, norm_budget=float(days), start_window=w0, end_window=w0 + days - 1,
        contract=InputContract("int64", (DeclaredColumn("active", "number", 0.0, 1.0),)),
    ))
    assert summary.balanced


def run_numpy(paths: list[str], scratch: Path, days: int) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    from renyi_stream.stream.accounting import calibrate
    from renyi_stream.stream.ledger import Ledger
    from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise, new_ledger_id

    cal = calibrate(epsilon=EPSILON, delta=DELTA, norm_budget=float(days))
    ledger = Ledger(budget=cal.rho)
    key = NoiseBinding(NoiseKey.load_or_create(scratch / "numpy.key"), new_ledger_id())
    for window, path in enumerate(paths):
        table = pq.read_table(path)
        result = ledger.admit(table.column("user_id"), table.column("active").to_numpy()[:, None],
                              noise_std=cal.noise_std)
        result.contributions.sum(axis=0) + gaussian_noise(key, query_id="sum:active", window_id=window, dim=1,
                                                          noise_std=cal.noise_std)


def run_pipelinedp(paths: list[str], scratch: Path, days: int) -> None:
    import apache_beam as beam
    import pipeline_dp
    from apache_beam.options.pipeline_options import PipelineOptions

    partitions = [(DAY0 + dt.timedelta(days=d)).isoformat() for d in range(days)]
    options = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    with beam.Pipeline(options=options) as p:
        rows = (p | beam.Create(paths) | beam.io.ReadAllFromParquet()
                | beam.Map(lambda r: (int(r["user_id"]), str(r["day"]), float(r["active"]))))
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=DELTA)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.GAUSSIAN, metrics=[pipeline_dp.Metrics.SUM],
            max_partitions_contributed=days, max_contributions_per_partition=1,
            min_value=0.0, max_value=1.0)
        extractors = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1], value_extractor=lambda r: r[2])
        result = engine.aggregate(rows, params, extractors, public_partitions=partitions)
        accountant.compute_budgets()
        result | beam.combiners.Count.Globally() | beam.Map(lambda n: None)


SYSTEMS = {"ours": run_ours, "pipelinedp": run_pipelinedp, "numpy": run_numpy}


def worker(system: str, folder: str, days: int) -> None:
    import logging

    logging.getLogger().setLevel(logging.ERROR)
    paths = sorted(str(p) for p in Path(folder).glob("day-*.parquet"))
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        SYSTEMS[system](paths, Path(scratch), days)
        seconds = time.perf_counter() - start
    print(json.dumps({"system": system, "seconds": seconds, "peak_rss_mb": _peak_rss_mb()}))


def _schedule(systems: list[str], repeat: int, anchor_repeat: int) -> list[str]:
    """The order of the runs: the other systems' runs split around PipelineDP's, so a drift in
    the machine's speed during the anchor's minutes reaches both sides of the ratio (on this
    shared machine it moves by 10-20% over a few minutes)."""
    others = [s for s in systems if s != "pipelinedp"]
    before = [s for _ in range((repeat + 1) // 2) for s in others]
    after = [s for _ in range(repeat // 2) for s in others]
    return before + ["pipelinedp"] * (anchor_repeat if "pipelinedp" in systems else 0) + after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--systems", default="ours,pipelinedp,numpy")
    parser.add_argument("--repeat", type=int, default=3, help="runs of ours and numpy (median reported)")
    parser.add_argument("--anchor-repeat", type=int, default=1, help="runs of pipelinedp (median reported)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.folder, args.days)
        return 0
    systems = args.systems.split(",")
    rows = args.users * args.days
    print(f"# {args.users:,} users x {args.days} days = {rows:,} rows, rate {args.rate}; "
          f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    for name in ("repeat", "anchor_repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    results = {}
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    failed: set[str] = set()
    with tempfile.TemporaryDirectory() as folder:
        generate(Path(folder), args.users, args.days, args.rate)
        for system in _schedule(systems, args.repeat, args.anchor_repeat):
            if system in failed:
                continue
            out = subprocess.run(
                [sys.executable, __file__, "--worker", system, "--folder", folder, "--days", str(args.days)],
                capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{system}: failed\n{out.stderr[-3000:]}")
                failed.add(system)
                continue
            runs[system].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for system in systems:
        if system in failed or not runs[system]:
            continue
        result = {"seconds": statistics.median(r["seconds"] for r in runs[system]),
                  "peak_rss_mb": max(r["peak_rss_mb"] for r in runs[system])}
        results[system] = result
        each = ", ".join(f"{r['seconds']:.2f}" for r in runs[system])
        print(f"{system:>10}: {result['seconds']:8.2f} s  {rows / result['seconds']:>12,.0f} rows/s  "
              f"peak RSS {result['peak_rss_mb']:8.0f} MB   (runs in order: {each} s)", flush=True)
    if "ours" in results:
        ours = results["ours"]
        if "pipelinedp" in results:
            pdp = results["pipelinedp"]
            print(f"ours / pipelinedp: throughput {pdp['seconds'] / ours['seconds']:.1f}x, "
                  f"peak memory {ours['peak_rss_mb'] / pdp['peak_rss_mb']:.2f}x")
        if "numpy" in results:
            print(f"ours / numpy floor: throughput {results['numpy']['seconds'] / ours['seconds']:.3f}x "
                  f"(the floor is {ours['seconds'] / results['numpy']['seconds']:.1f}x faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
