"""The streaming job on Flink (pipelines/streaming/flink/, issue 38 items 1 and 4, first step): the
conformance scenario's replay through the PyFlink job on the real local cluster gives what the
DirectRunner replay of the same files gives: the same public part of every release (keys, labels,
kinds, noise scales, key fingerprint, accounting), the same exact sums under the noise (each
ledger's own noise taken off with the one key, bit for bit), the same ledger (every user's used
budget and odometer), the same books (rows read, admitted, clipped, dropped, dead letters by reason)
and the same dead letters, after every step of the scenario (each step a job continuing from the
last one's snapshots). The first step's Flink job is given the DirectRunner job's ledger id (a test
wrapper around the job's ``main``, :data:`SAME_LEDGER`: a new ledger's id is random), so the two
ledgers draw the same keyed noise and every public release file row must be equal bit for bit; the
later steps continue that ledger as a user runs the job: ``renyi-stream stream --runner flink``.

Without ``java``, ``javac`` or ``mvn`` this is skipped naming what to install; under ``CI=true`` it
fails instead (tests/engines/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conformance import scenario as sc
from conformance.adapters import StreamingJob
from conformance.conftest import write_inputs
from conformance.outcome import differing_sums, public_part, without_noise

from renyi_stream.pipelines.engines.local_cluster import CACHE_VARIABLE, RUN_VARIABLE
from renyi_stream.pipelines.streaming.flink.launch import FlinkTarget, flink_run_command, submit
from renyi_stream.stream.noise import NoiseKey

#: The conformance scenario replayed (three steps: a new ledger, then two jobs continuing it).
SCENARIO = sc.CRASH_SCENARIO
#: ``flink run -p``: every slot of the local cluster's two TaskManagers of two slots.
PARALLELISM = 4
#: The first step's client: the job's main with a new ledger's id taken from the environment.
SAME_LEDGER = """
import os, sys
import renyi_stream.pipelines.streaming.snapshots as snapshots
from renyi_stream.pipelines.streaming.flink.job import main

snapshots.new_ledger_id = lambda: os.environ["RENYI_TEST_LEDGER_ID"]
sys.exit(main(sys.argv[1:]))
"""


class FlinkStreamingJob(StreamingJob):
    """The conformance adapter of the Beam streaming job, each step submitted instead with ``flink
    run`` to the local cluster (``python -m renyi_stream.pipelines.streaming.flink``, the same
    options): its outputs are read back as the Beam job's are."""

    name = "flink-streaming"
    module = "renyi_stream.pipelines.streaming.flink"

    def __init__(self, *args, cluster, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cluster = cluster
        self.seconds: list[float] = []
        self.ledger_id: str | None = None  # a new ledger's id, for the next run (then forgotten)

    def main(self, argv: list[str]) -> int:
        """The first step through the test's wrapper (the DirectRunner ledger's id), the others as a
        user runs them: ``renyi-stream stream --runner flink <options>``."""
        began = time.monotonic()
        if self.ledger_id:
            script = self.root / "same_ledger.py"
            script.write_text(SAME_LEDGER)
            done = submit(argv, FlinkTarget.local(self.cluster.config), parallelism=PARALLELISM, timeout_s=420,
                          cwd=self.root, script=script, env={"RENYI_TEST_LEDGER_ID": self.ledger_id})
            self.ledger_id = None
        else:
            env = {**os.environ, RUN_VARIABLE: str(self.cluster.config.run),
                   CACHE_VARIABLE: str(self.cluster.config.cache)}
            done = subprocess.run([sys.executable, "-m", "renyi_stream.pipelines.cli.main", "stream", "--runner", "flink",
                                   *argv, "--parallelism", str(PARALLELISM)], env=env, cwd=self.root,
                                  capture_output=True, text=True, timeout=420)
        self.seconds.append(time.monotonic() - began)
        sys.stderr.write(done.stdout[-20000:] + done.stderr[-20000:])
        return done.returncode


def test_the_launcher_passes_the_stream_jobs_options_after_flink_runs_own(cluster):
    command, env = flink_run_command(["--replay", "a.arrow", "--parallelism", "2"],
                                     FlinkTarget.local(cluster.config), parallelism=4)
    assert command[0] == str(cluster.config.flink_home / "bin" / "flink")
    assert command[1:] == ["run", "-p", "4", "-pym", "renyi_stream.pipelines.streaming.flink", "--", "--replay",
                           "a.arrow", "--parallelism", "2"]
    assert env["FLINK_CONF_DIR"] == str(cluster.config.run / "flink-conf")
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env


def test_the_conformance_replay_on_flink_gives_the_directrunner_replays_releases_ledger_and_books(cluster, tmp_path):
    key_path = tmp_path / "noise.key"
    key = NoiseKey.load_or_create(key_path)
    scenario = sc.SCENARIOS[SCENARIO]
    inputs = write_inputs(tmp_path / "inputs", scenario)
    direct = StreamingJob(tmp_path / "direct", scenario, str(key_path), inputs)
    flink = FlinkStreamingJob(tmp_path / "flink", scenario, str(key_path), inputs, cluster=cluster)
    plan = scenario.query_plan()
    for number, step in enumerate(scenario.steps, 1):
        direct.run(step)
        if number == 1:
            flink.ledger_id = direct.outcome().ledger_id
        flink.run(step)  # RunFailed (with what flink run printed) unless it exits 0 with balanced books
        want, got = direct.outcome(), flink.outcome()
        where = f"after step {number} of scenario {SCENARIO}"
        assert got.ledger_id == want.ledger_id, where  # one ledger id, two ledgers' files
        assert public_part(got) == public_part(want), where
        exact = differing_sums(without_noise(got, key, plan), without_noise(want, key, plan), tolerance=0.0)
        assert exact == {}, f"{where}: sums under the noise differ: {exact}"
        assert got.releases == want.releases, where  # every public row, bit for bit
        assert got.ledger == want.ledger, where
        assert got.runs == want.runs, where
        assert got.dead == want.dead, where
    print(f"flink job seconds per step (submission included): {[round(s, 1) for s in flink.seconds]}")
