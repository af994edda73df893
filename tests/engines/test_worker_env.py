"""The PyFlink workers' environment ``up`` builds (pipelines/engines/worker_env.py): installed with
real metadata (``pip install '<project>[flink]'``), ``pip check`` clean, PyFlink and this
project importable from it, at the pins the docs claim; and a PyFlink job on the cluster runs its
Python in it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml
from packaging.version import Version

#: Reads, in the environment's own interpreter, what it imports and which versions it resolved.
PROBE = """
import importlib.metadata as m, json, pyflink, renyi_stream.stream.ledger as ledger
print(json.dumps({"ledger": ledger.__file__, "versions": {n: m.version(n) for n in
      ("apache-flink", "apache-beam", "numpy", "pyarrow", "pandas", "renyi-stream")}}))
"""

#: A PyFlink job: each element mapped, in a Python worker, to where that worker runs; the Kafka
#: connector's builder is called first, so a connector missing from lib/ fails the job.
JOB = """
import json, sys
from pyflink.common import Types
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.connectors.kafka import KafkaSource

KafkaSource.builder().set_bootstrap_servers(sys.argv[1]).set_topics("unread").set_value_only_deserializer(
    SimpleStringSchema()).build()


def where(_):
    import json, os, sys
    from renyi_stream.stream import ledger
    return json.dumps({"pid": os.getpid(), "python": sys.executable, "ledger": ledger.__file__})


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(4)
rows = env.from_collection(list(range(40)), type_info=Types.INT()).map(where, output_type=Types.STRING())
with rows.execute_and_collect() as results:
    print("seen=" + json.dumps([json.loads(r) for r in results]))
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def test_the_workers_environment_is_pip_check_clean_at_pyflinks_pins_with_this_project_installed(cluster, tmp_path):
    env = cluster.status()["worker_env"]
    python = Path(env["python"])
    assert env["exists"] and python.exists()
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, env=_clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
    probe = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=_clean_env())
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout)
    assert Path(seen["ledger"]).is_relative_to(env["path"])  # installed there, not this checkout on a path
    versions = seen["versions"]
    assert versions == env["versions"]
    assert versions["apache-flink"] == cluster.config.flink_version
    assert Version(versions["apache-beam"]).release[:2] == (2, 61)
    assert Version(versions["numpy"]) < Version("2.2") and Version(versions["pyarrow"]) < Version("17")
    assert Version(versions["pandas"]) < Version("2.3")
    settings = yaml.safe_load((cluster.config.run / "flink-conf" / "config.yaml").read_text())
    assert settings["python.executable"] == settings["python.client.executable"] == str(python)


def test_a_pyflink_job_runs_its_python_in_the_workers_environment_in_processes_of_its_own(cluster, tmp_path):
    home, run = cluster.config.flink_home, cluster.config.run
    (tmp_path / "job.py").write_text(JOB)
    done = subprocess.run([str(home / "bin" / "flink"), "run", "-py", str(tmp_path / "job.py"),
                           f"localhost:{cluster.config.ports.kafka}"], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env={**_clean_env(), "FLINK_CONF_DIR": str(run / "flink-conf"),
                                             "FLINK_LOG_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("seen=")]
    seen = json.loads(line[len("seen="):])
    env = cluster.status()["worker_env"]
    assert len(seen) == 40
    assert {s["python"] for s in seen} == {env["python"]}
    assert all(Path(s["ledger"]).is_relative_to(env["path"]) for s in seen)
    assert len({s["pid"] for s in seen}) >= 2  # a Python worker per subtask's slot, not one process
