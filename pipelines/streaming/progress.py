"""The streaming job's progress lines for the operator (and benchmarks/bench_streaming.py): public
facts only, a window id, a shard number and a monotonic clock (invariant 4: no count, no sum)."""

from __future__ import annotations

import sys
import time


def say_progress(event: str) -> None:
    """Write ``[streaming] <event> at <monotonic seconds>`` to stderr and flush it. Written, not
    ``print``ed: PyFlink's Python workers replace ``print`` with one that takes no ``flush``."""
    sys.stderr.write(f"[streaming] {event} at {time.monotonic():.3f}\n")
    sys.stderr.flush()
