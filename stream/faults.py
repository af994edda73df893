"""Test-only fault injection: a process that kills itself at a named commit point.

``RENYI_STREAM_CRASH_AT=<point>`` makes :func:`crash_point` send SIGKILL to its own process
there, as a power cut would (no cleanup, no ``finally``). Points: ``while_reading`` (the
pipeline has read input, nothing is committed), ``after_ledger_write`` (inside the curator's
transaction, before COMMIT), ``before_publish``, ``during_release_insert`` (inside the release
store's transaction, before COMMIT), ``during_publish`` (some windows published, the later ones
not), ``after_publish`` (published, not yet marked): the last two are the publication rule's
(:func:`renyi_stream.stream.engine.publication.publish_outbox`), the same for every job. The streaming job's
window commit (``pipelines/streaming/commits.py``): ``streaming_after_snapshot`` (a shard's ledger
snapshot of a window written), ``streaming_after_stage`` (a window's releases staged),
``streaming_after_commit`` (a window's commit marker written, not yet public). Unset in production:
the check is one environment lookup.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "RENYI_STREAM_CRASH_AT"


def crash_point(name: str) -> None:
    """Die here with SIGKILL when ``RENYI_STREAM_CRASH_AT`` names this point."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
