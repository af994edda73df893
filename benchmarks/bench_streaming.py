"""Benchmark: the streaming job's replay against the daily job on the same rows (issue 30).

One command::

    python benchmarks/bench_streaming.py                          # 100,000 users x 60 days, half active a day
    python benchmarks/bench_streaming.py --users 20000 --days 30  # smaller
    python benchmarks/bench_streaming.py --long --users 200000 --running --id-type string   # 365 windows
    python benchmarks/bench_streaming.py --users 200 --days 6     # a smoke run (tests/test_bench_streaming.py)

The workload is U users x D days; each day a pseudo-random ``--active-rate`` share of the users
(default half, drawn per day from a generator seeded by the day) has one row, in random order,
with two indicator columns (``opened``, 0/1; ``bought``, in [0, 1.5)): issue 30's reference is
100,000 x 60 x 0.5 = 3M rows. It is written once as one Parquet file per day and once as one
Arrow IPC message per day (:func:`renyi_stream.pipelines.streaming.codec.encode_message`). Then, each in its own
process, so that its peak RSS (``ru_maxrss``, :func:`child_run.run_child`) is its own:

* ``daily`` (the anchor): ``renyi-stream run`` over every day in one run (DuckDB release store
  and ledger, ``--quiet``);
* ``streaming``: ``python -m renyi_stream.pipelines.streaming --replay`` of the day messages, one job over the
  whole schedule (its DirectRunner: the FnApiRunner in memory), releases under
  ``--releases-parquet``, curator files under ``--output``.

Both declare the same input contract (``--id-type``, ``--column opened=0:1 --column bought=0:1.5``)
and answer the same queries: the per-window sums of both columns and, with ``--running``, a BLT
running total of ``opened`` (registered with ``renyi-stream query add`` in each job's catalogue).

Printed: rows/s and peak RSS of each, the ratio daily/streaming of both (issue 30's targets at
100k x 60: throughput within 2x, memory within 1.5x), and, from the streaming job's progress
lines (``--progress``: ``[streaming] shard S charged window W at T``, a monotonic clock), the
mean time per window of windows 5-15 against that of the last ten (target at 365 windows: within
1.2x), and the streaming job's highest resident memory (sampled every quarter second from
``/proc``) while windows 5-15 ran against that while the last ten ran (flat: at most 1x). Never assert on timing: on a shared machine only ratios taken in the same run mean much.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_run import DAY0, EPSILON, DELTA, run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("opened", "bought")
DECLARED = ["--column", "opened=0:1", "--column", "bought=0:1.5"]
#: The streaming job's progress line (``--progress``) of a shard that charged a window
#: (renyi_stream.pipelines.streaming.shard_filter.ShardFilter). Not the commit lines: on the
#: FnApiRunner a replay runs the filter's timers through every window before the steps after it.
PROGRESS = re.compile(r"\[streaming\] shard (\d+) charged window (-?\d+) at ([0-9.]+)")
LONG_DAYS = 365
#: The per-window comparison: windows 5..15 (1-based) against the last ten.
EARLY = (5, 15)
LAST = 10


def user_ids(users: int, id_type: str):
    import numpy as np
    import pyarrow as pa

    ids = np.arange(users, dtype=np.int64)
    if id_type == "int64":
        return pa.array(ids)
    return pa.array([f"user-{i:09d}" for i in ids], type=pa.string())


def day_table(users: int, day: int, rate: float, id_type: str, ids=None, seed: int = 0):
    """Day ``day``'s rows: ``round(rate * users)`` distinct users drawn by a generator seeded by
    ``(seed, day)``, in random order, with ``opened`` (0/1) and ``bought`` (in [0, 1.5))."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng([seed, day])
    active = rng.permutation(users)[:int(round(rate * users))]
    n = active.size
    ids = user_ids(users, id_type) if ids is None else ids
    return pa.table({"user_id": ids.take(pa.array(active)),
                     "day": pa.array([DAY0 + dt.timedelta(days=day)] * n, type=pa.date32()),
                     "opened": pa.array((rng.random(n) < 0.5).astype(np.float64)),
                     "bought": pa.array(rng.random(n) * 1.5)})


def generate(folder: Path, *, users: int, days: int, rate: float, id_type: str) -> tuple[list[str], list[str], int]:
    """Write the days as Parquet files and as messages; ``(parquet paths, message paths, rows)``."""
    import pyarrow.parquet as pq

    from renyi_stream.pipelines.streaming.codec import encode_message

    (folder / "parquet").mkdir()
    (folder / "messages").mkdir()
    ids = user_ids(users, id_type)
    files, messages, rows = [], [], 0
    for d in range(days):
        table = day_table(users, d, rate, id_type, ids)
        rows += table.num_rows
        files.append(str(folder / "parquet" / f"day-{d:03d}.parquet"))
        pq.write_table(table, files[-1])
        messages.append(str(folder / "messages" / f"day-{d:03d}.arrows"))
        Path(messages[-1]).write_bytes(encode_message(table))
    return files, messages, rows


def _promise(days: int, norm_budget: float | None) -> list[str]:
    first, last = DAY0, DAY0 + dt.timedelta(days=days - 1)
    return ["--start", first.isoformat(), "--end", last.isoformat(), "--epsilon", str(EPSILON),
            "--delta", str(DELTA), "--norm-budget", str(norm_budget if norm_budget is not None else float(days))]


def _register(where: list[str], running: bool) -> list[list[str]]:
    """The ``renyi-stream query add`` command lines of the queries both jobs answer with ``--running``
    (without it each job registers the per-window sums of the declared columns itself)."""
    if not running:
        return []
    cli = [sys.executable, "-m", "renyi_stream.pipelines.cli.main", "query", "add", *where, "--create", "--from",
           DAY0.isoformat()]  # before each job's first run: the store (or root) is made here
    return [[*cli, "--id", f"sum:{c}", "--columns", c] for c in COLUMNS] + [
        [*cli, "--id", "running:opened", "--columns", "opened", "--kind", "running", "--strategy", "blt"]]


def daily_argv(folder: Path, files: list[str], args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "renyi_stream.pipelines.cli.main", "run", "--input", *files,
            "--store", str(folder / "releases.duckdb"), "--ledger", str(folder / "ledger.duckdb"),
            *_promise(args.days, args.norm_budget), "--shards", str(args.shards), "--id-type", args.id_type,
            *DECLARED, "--quiet"]


def streaming_argv(folder: Path, messages: list[str], args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "renyi_stream.pipelines.streaming", "--replay", *messages,
            "--releases-parquet", str(folder / "public"), "--output", str(folder / "curator"),
            "--noise-key", str(folder / "noise.key"), *_promise(args.days, args.norm_budget),
            "--shards", str(args.shards), "--id-type", args.id_type, *DECLARED, "--progress"]


def window_stamps(text: str) -> list[tuple[int, float]]:
    """``(window, monotonic time the last shard charged it)`` from the streaming job's progress
    lines, in window order."""
    done: dict[int, float] = {}
    for _, w, t in PROGRESS.findall(text):
        done[int(w)] = max(done.get(int(w), 0.0), float(t))
    return sorted(done.items())


def per_window_memory_line(text: str, samples: list[tuple[float, float]]) -> str:
    """The streaming child's highest resident memory while windows 5-15 were charged against
    that while the last ten were (sampled, :func:`child_run.run_child`): flat memory is a last/early
    ratio at or below 1."""
    stamps = window_stamps(text)
    if len(stamps) < EARLY[1] + LAST or not samples:
        return "streaming memory per window: too few windows or no samples (Linux /proc) to compare"

    def peak(a: float, b: float) -> float | None:
        inside = [mb for t, mb in samples if a <= t <= b]
        return max(inside) if inside else None

    early = peak(stamps[EARLY[0] - 2][1], stamps[EARLY[1] - 1][1])
    last = peak(stamps[-LAST - 1][1], stamps[-1][1])
    if early is None or last is None:
        return "streaming memory per window: windows too short to sample, no comparison"
    return (f"streaming memory per window: peak RSS while windows {EARLY[0]}-{EARLY[1]} ran {early:.0f} MB, "
            f"while the last {LAST} ran {last:.0f} MB, last/early {last / early:.2f}x")


def window_times(text: str) -> list[float]:
    """Seconds each window took, from the streaming job's progress lines, in window order: from the
    time the last shard charged the previous window to the time the last shard charged this one
    (the first window's is left out: there is nothing before it on the same clock)."""
    stamps = window_stamps(text)
    return [b[1] - a[1] for a, b in zip(stamps, stamps[1:])]


def per_window_line(gaps: list[float]) -> str:
    """Mean seconds per window of windows 5-15 against the last ten, and their ratio. ``gaps[i]`` is
    window ``i + 2``'s (1-based) time."""
    early = gaps[EARLY[0] - 2:EARLY[1] - 1]
    last = gaps[-LAST:]
    if len(gaps) < EARLY[1] + LAST - 1 or not early or not last:
        return (f"streaming per window: {len(gaps) + 1} windows committed, too few to compare windows "
                f"{EARLY[0]}-{EARLY[1]} with the last {LAST} (needs {EARLY[1] + LAST})"
                + (f"; mean {sum(gaps) / len(gaps) * 1000:.1f} ms" if gaps else ""))
    a, b = sum(early) / len(early), sum(last) / len(last)
    return (f"streaming per window: windows {EARLY[0]}-{EARLY[1]} {a * 1000:.1f} ms, last {LAST} {b * 1000:.1f} ms, "
            f"last/early {b / a:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--long", action="store_true", help=f"{LONG_DAYS} windows (overrides --days)")
    parser.add_argument("--id-type", choices=("int64", "string"), default="int64")
    parser.add_argument("--running", action="store_true", help="also a BLT running total of opened")
    parser.add_argument("--active-rate", type=float, default=0.5, help="share of users with a row each day")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--norm-budget", type=float, default=None, help="default: --days")
    parser.add_argument("--systems", default="daily,streaming")
    parser.add_argument("--work-dir", default=None, help="keep the data and outputs here (default: a temp folder)")
    parser.add_argument("--streaming-log", default=None, help="also write the streaming job's output to this file")
    args = parser.parse_args(argv)
    if args.long:
        args.days = LONG_DAYS
    if args.users < 1 or args.days < 1 or not 0.0 < args.active_rate <= 1.0:
        parser.error("--users and --days must be >= 1 and --active-rate in (0, 1]")
    systems = [s for s in args.systems.split(",") if s]
    if not set(systems) <= {"daily", "streaming"}:
        parser.error(f"--systems takes daily and streaming, got {args.systems}")
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env_path if env_path else "")
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as scratch:
        work = Path(args.work_dir) if args.work_dir else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        files, messages, rows = generate(work, users=args.users, days=args.days, rate=args.active_rate,
                                         id_type=args.id_type)
        print(f"# {args.users:,} users x {args.days} days, active rate {args.active_rate} = {rows:,} rows, "
              f"{args.id_type} ids, {args.shards} shards{', BLT running total' if args.running else ''}; "
              f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}", flush=True)
        results: dict[str, tuple[float, float, str, float]] = {}
        samples: list[tuple[float, float]] = []
        for system in systems:
            folder = work / system
            folder.mkdir()
            where = (["--store", str(folder / "releases.duckdb")] if system == "daily"
                     else ["--releases-parquet", str(folder / "public")])
            for command in _register(where, args.running):
                run_child(command)
            if system == "streaming":  # the streaming job takes an existing key (or a secret and its fingerprint)
                from renyi_stream.stream.noise import NoiseKey

                NoiseKey.load_or_create(folder / "noise.key")
            argv_ = daily_argv(folder, files, args) if system == "daily" else streaming_argv(folder, messages, args)
            results[system] = run_child(argv_, rss_samples=samples if system == "streaming" else None)
            seconds, rss, text, cpu = results[system]
            print(f"{system:>10}: {seconds:8.2f} s  {rows / seconds:>12,.0f} rows/s  peak RSS {rss:8.0f} MB  "
                  f"(CPU {cpu:.1f} s)", flush=True)
            if system == "streaming" and args.streaming_log:
                Path(args.streaming_log).write_text(text)
    if {"daily", "streaming"} <= results.keys():
        d, s = results["daily"], results["streaming"]
        print(f"daily / streaming: throughput {s[0] / d[0]:.2f}x (streaming is {s[0] / d[0]:.2f}x slower), "
              f"peak memory streaming/daily {s[1] / d[1]:.2f}x")
    if "streaming" in results:
        print(per_window_line(window_times(results["streaming"][2])))
        print(per_window_memory_line(results["streaming"][2], samples))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
