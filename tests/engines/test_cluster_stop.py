"""``down`` stops exactly what ``up`` recorded, and everything those processes started, whatever
they do with SIGTERM; it never signals a process that merely reuses a recorded id. No Java needed:
the recorded processes here are Python sleepers."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict

from renyi_stream.pipelines.engines.local_cluster import Config, LocalCluster, Service, _alive, _group_members, _stat

#: Ignores SIGTERM, starts a child in its process group that ignores it too, prints the child's id.
STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']); print(child.pid, flush=True); "
            "time.sleep(120)")


def _cluster(tmp_path) -> LocalCluster:
    config = Config.default(cache=tmp_path / "cache", run=tmp_path / "run")
    (config.run / "logs").mkdir(parents=True)
    return LocalCluster(config)


def test_down_terminates_a_recorded_process_and_kills_one_that_ignores_term_with_its_children(tmp_path):
    cluster = _cluster(tmp_path)
    polite = cluster._spawn("polite", [sys.executable, "-c", "import time; time.sleep(120)"])
    stubborn = cluster._spawn("stubborn", [sys.executable, "-c", STUBBORN])
    deadline = time.monotonic() + 30
    while not open(stubborn.log).read().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(open(stubborn.log).read().split()[0])
    assert _stat(child)[1] == stubborn.pid  # in the recorded process's group
    started = time.monotonic()
    assert cluster.down(grace_s=1.0) == ["polite", "stubborn"]
    assert time.monotonic() - started < 10
    assert not _alive(polite) and not _alive(stubborn)
    assert _stat(child) is None or _stat(child)[0] == "Z"  # gone, or dead and not yet reaped
    assert _group_members({polite.pid, stubborn.pid}) == []
    assert cluster.services() == [] and cluster.down() == []


def test_down_leaves_alone_a_process_that_only_reuses_a_recorded_id(tmp_path):
    cluster = _cluster(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ticks = _stat(other.pid)[2]
        cluster._record(services=[asdict(Service("reused", other.pid, ticks + 1, str(tmp_path / "x.log")))])
        assert cluster.down(grace_s=0.5) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
