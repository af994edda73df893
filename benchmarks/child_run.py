"""What the scale benchmarks share: running ``renyi-stream run`` in a fresh process and measuring it.

Used by ``bench_scale.py`` (the daily job at 100k to 10M rows) and ``bench_running_scale.py``
(running totals, one run per day). A benchmark script imports it by name: the script's own
folder is on ``sys.path`` when it is run as ``python benchmarks/<script>.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

#: The promise every scale benchmark runs under (its value does not change the job's work).
EPSILON, DELTA = 1.0, 1e-6
#: The first day of every generated stream.
DAY0 = dt.date(2026, 3, 1)
_EPOCH = dt.date(1970, 1, 1)


def day_number(day: dt.date) -> int:
    """``day`` as days since 1970-01-01, the integer behind an Arrow ``date32``."""
    return (day - _EPOCH).days


def run_child(argv: Sequence[str], rss_samples: list[tuple[float, float]] | None = None) -> tuple[float, float, str, float]:
    """Run ``argv`` to completion; ``(wall seconds, peak RSS in MB, stdout+stderr, CPU seconds)``.

    Peak RSS and CPU time are that child's own (``os.wait4`` returns the rusage of the one
    process it reaps, with the children it reaped in turn), not the caller's: the caller may
    hold generated data in memory without inflating the figure. With ``rss_samples``, the child's
    resident memory is also appended there every :data:`RSS_PERIOD` seconds as ``(time.monotonic(),
    MB)`` (Linux ``/proc``; nothing elsewhere), on the clock the streaming job's progress lines
    use. RuntimeError with the tail of the output when the child exits non-zero.
    """
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as log:
        child = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT)
        done = threading.Event()
        sampler = None
        if rss_samples is not None:
            sampler = threading.Thread(target=_sample_rss, args=(child.pid, rss_samples, done), daemon=True)
            sampler.start()
        _, status, usage = os.wait4(child.pid, 0)
        done.set()
        if sampler is not None:
            sampler.join()
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    if child.returncode != 0:
        raise RuntimeError(f"{list(argv)[:3]} failed ({child.returncode}):\n{text[-3000:]}")
    return seconds, usage.ru_maxrss / 1024.0, text, usage.ru_utime + usage.ru_stime  # ru_maxrss: KiB


#: Seconds between two samples of a child's resident memory (:func:`run_child`).
RSS_PERIOD = 0.25


def _sample_rss(pid: int, samples: list[tuple[float, float]], done: threading.Event) -> None:
    status = f"/proc/{pid}/status"
    while not done.wait(RSS_PERIOD):
        try:
            with open(status) as handle:
                kib = next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), None)
        except OSError:  # exited (or no /proc): nothing more to sample
            return
        if kib is not None:
            samples.append((time.monotonic(), kib / 1024.0))


def cli_run_args(inputs: Sequence[str], folder: str, first: dt.date, last: dt.date, *, norm_budget: float,
                 shards: int, extra: Sequence[str] = ()) -> list[str]:
    """The argv of ``renyi-stream run`` over ``inputs`` for windows ``first..last``, with the
    release store ``folder/releases.duckdb`` and the ledger ``folder/ledger.duckdb`` (noise key
    beside it, created by the first run). ``extra`` is appended as given (``--release running``,
    ``--quiet``, ...)."""
    return [sys.executable, "-m", "renyi_stream.pipelines.cli.main", "run", "--input", *inputs,
            "--store", f"{folder}/releases.duckdb", "--ledger", f"{folder}/ledger.duckdb",
            "--epsilon", str(EPSILON), "--delta", str(DELTA), "--norm-budget", str(norm_budget),
            "--start", first.isoformat(), "--end", last.isoformat(), "--shards", str(shards), *extra]
