"""The streaming benchmark (issue 30) runs end to end at a tiny size and prints its ratio lines.

A benchmark, not a timed test: 200 users x 6 days, string ids and a BLT running total (the
heaviest path), through ``renyi-stream run`` and ``python -m renyi_stream.pipelines.streaming --replay``, each in
its own process. It checks the command prints each system's rows/s and peak RSS, the ratio of the
two, and the per-window line from the streaming job's progress lines; the timings themselves are
never asserted (2 shared cores).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
BENCH = BENCHMARKS / "bench_streaming.py"


@pytest.fixture
def bench(monkeypatch):
    """``benchmarks/bench_streaming.py`` imported by name, as when it runs as a script."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_streaming

    return bench_streaming


def test_a_tiny_run_prints_both_jobs_rows_per_second_the_ratios_and_the_per_window_line(tmp_path):
    log = tmp_path / "streaming.log"
    done = subprocess.run([sys.executable, str(BENCH), "--users", "200", "--days", "6", "--id-type", "string",
                           "--running", "--work-dir", str(tmp_path / "work"), "--streaming-log", str(log)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# 200 users x 6 days, active rate 0.5 = 600 rows, string ids")
    for system in ("daily", "streaming"):
        assert any(re.match(rf"\s*{system}: +[\d.]+ s +[\d,]+ rows/s +peak RSS +\d+ MB", line) for line in lines)
    assert any(re.match(r"daily / streaming: throughput [\d.]+x .* peak memory streaming/daily [\d.]+x", line)
               for line in lines)
    assert any(line.startswith("streaming per window: 6 windows") for line in lines)
    assert any(line.startswith("streaming memory per window: too few windows") for line in lines)
    # Every shard's progress line of every window, in the log of the streaming job.
    text = log.read_text()
    assert len(set(re.findall(r"\[streaming\] shard (\d+) charged window (\d+) at", text))) == 16 * 6


def test_the_per_window_line_compares_windows_5_to_15_with_the_last_ten(bench):
    # Window w (1-based) is charged by its last shard at about w seconds: every gap is 1 s.
    text = "\n".join(f"[streaming] shard {s} charged window {100 + w} at {w + s / 100:.3f}"
                     for w in range(1, 41) for s in range(3))
    gaps = bench.window_times(text)
    assert gaps == pytest.approx([1.0] * 39)
    assert bench.per_window_line(gaps) == ("streaming per window: windows 5-15 1000.0 ms, last 10 1000.0 ms, "
                                           "last/early 1.00x")
    assert "too few to compare" in bench.per_window_line(gaps[:10])


def test_the_memory_line_compares_the_peak_rss_while_windows_5_to_15_ran_with_the_last_tens(bench):
    # Window w charged at w seconds; memory 100 MB + w MB sampled every half second.
    text = "\n".join(f"[streaming] shard 0 charged window {100 + w} at {w:.3f}" for w in range(1, 41))
    samples = [(t / 2, 100 + t / 2) for t in range(0, 82)]
    # Windows 5-15 run from window 4's charge (4 s) to window 15's (15 s); the last ten from 30 s to 40 s.
    assert bench.per_window_memory_line(text, samples) == (
        "streaming memory per window: peak RSS while windows 5-15 ran 115 MB, while the last 10 ran 140 MB, "
        "last/early 1.22x")
    assert "too few windows" in bench.per_window_memory_line(text, [])


def test_a_childs_resident_memory_is_sampled_on_the_monotonic_clock_while_it_runs(bench):
    import time

    import child_run

    samples: list = []
    before = time.monotonic()
    child_run.run_child([sys.executable, "-c", "import time; b = bytearray(50 * 2**20); time.sleep(1.2)"],
                        rss_samples=samples)
    assert len(samples) >= 2 and all(before <= t <= time.monotonic() for t, _ in samples)
    assert max(mb for _, mb in samples) > 50
