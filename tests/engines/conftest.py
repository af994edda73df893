"""The session's local cluster (:mod:`renyi_stream.pipelines.engines.local_cluster`): started once for all the
xdist workers of a test run, and stopped by the last worker done with it.

Without ``java``, ``javac`` or ``mvn`` the tests that need the cluster are skipped naming what to
install; with ``CI=true`` they fail instead, so CI cannot pass without running them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from renyi_stream.pipelines.engines.local_cluster import ROOT, Config, LocalCluster, Ports
from renyi_stream.pipelines.engines.worker_env import _locked
from renyi_stream.stream.private_files import process_alive

#: Off the command's own defaults, so a user's cluster and the tests' do not meet.
TEST_PORTS = Ports(rest=28081, rpc=26123, pool=25000, kafka=29092, controller=29093)
INSTALL = "install Java 17 and Maven (Debian: apt-get install openjdk-17-jdk-headless maven)"


def unavailable(reason: str) -> None:
    """Skip, or fail under ``CI=true``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a skip here is a failure)", pytrace=False)
    pytest.skip(reason)




def _users(path: Path, *, but: int | None = None) -> list[int]:
    """The live processes (test workers) using the cluster, less ``but``."""
    pids = json.loads(path.read_text()) if path.exists() else []
    return [pid for pid in pids if pid != but and process_alive(pid)]


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """The cluster, in the cache's ``test-run`` folder, shared by the run's xdist workers through a
    file lock and a list of the workers using it. A session killed outright left its processes
    recorded there with no live user: the next one stops them before it starts its own."""
    missing = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not on PATH: {INSTALL}")
    cache = Config.default().cache
    config = Config.default(cache=cache, run=cache / "test-run", ports=TEST_PORTS)
    config.run.mkdir(parents=True, exist_ok=True)
    lock, users = config.run / "cluster.lock", config.run / "users.json"
    local = LocalCluster(config)
    with _locked(lock):
        others = _users(users, but=os.getpid())
        if not others:
            local.down()
        elif local.project() != str(ROOT):  # its worker pool runs another checkout's code
            unavailable(f"the test cluster in {config.run} is in use by a test run of {local.project()}")
        local.up(timeout_s=300)  # "already up" when another worker started it
        users.write_text(json.dumps(others + [os.getpid()]))
    try:
        yield local
    finally:
        with _locked(lock):
            others = _users(users, but=os.getpid())
            users.write_text(json.dumps(others))
            if not others:
                local.down()  # raises when a process it started is still there after KILL
