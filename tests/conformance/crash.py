"""Running a job in a child process that kills itself at a named crash point (test-only fault
injection, :mod:`renyi_stream.stream.faults`): one helper for the conformance suite, ``test_crash_points``
and ``test_deploy``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from renyi_stream.stream.faults import CRASH_ENV

ROOT = Path(__file__).resolve().parents[2]


def run_killed_at(point: str, args: Sequence[str], *, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python <args>`` (``-m module ...`` or ``-c code ...``) in a child process that sends
    itself SIGKILL at crash point ``point``, run from the repository root with this tree first on
    its path (the child imports the code under test, never an installed copy). Returns the
    finished process, text output captured; a run that died there has ``returncode == -9``."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, CRASH_ENV: point, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=timeout)
