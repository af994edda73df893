"""The local cluster runs what it says: Flink jobs on both TaskManagers, this project's code in the
worker pool's SDK harnesses, messages through the Kafka broker."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_flink_has_two_taskmanagers_of_two_slots(cluster):
    overview = cluster.flink_overview()
    assert (overview["taskmanagers"], overview["slots-total"], overview["flink-version"]) == \
        (2, 4, cluster.config.flink_version)


def test_a_flink_job_runs_its_parallel_subtasks_on_both_taskmanagers(cluster, tmp_path):
    """SmokeJob.java, compiled against the cluster's Flink and submitted with ``bin/flink run``."""
    home, run = cluster.config.flink_home, cluster.config.run
    subprocess.run(["javac", "-d", str(tmp_path), "-cp", f"{home}/lib/*", str(Path(__file__).with_name("SmokeJob.java"))],
                   check=True, capture_output=True, text=True)
    subprocess.run(["jar", "cf", "smoke.jar", *[p.name for p in tmp_path.glob("*.class")]], cwd=tmp_path, check=True)
    done = subprocess.run([str(home / "bin" / "flink"), "run", "-p", "4", "-c", "SmokeJob", str(tmp_path / "smoke.jar"),
                           "1000"], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "FLINK_CONF_DIR": str(run / "flink-conf"), "FLINK_LOG_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("pids=")]
    pids, total = line.split()
    taskmanagers = {s.pid for s in cluster.services() if s.name.startswith("taskmanager")}
    assert {int(p) for p in pids[len("pids="):].split(",")} == taskmanagers
    assert total == f"sum={1000 * 1001}"


def test_the_worker_pool_runs_this_projects_code_in_processes_of_its_own(cluster, tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from renyi_stream.pipelines.beam.local_runner import batch_runner

    def where(_):
        from renyi_stream import stream

        return json.dumps({"pid": os.getpid(), "stream": stream.__file__})

    options = PipelineOptions(["--environment_type=EXTERNAL",
                               f"--environment_config=localhost:{cluster.config.ports.pool}"])
    with beam.Pipeline(runner=batch_runner(options), options=options) as p:
        _ = p | beam.Create([0]) | beam.Map(where) | beam.io.WriteToText(str(tmp_path / "where"))
    (seen,) = [json.loads(line) for f in tmp_path.glob("where*") for line in f.read_text().splitlines()]
    assert seen["pid"] != os.getpid()
    assert Path(seen["stream"]).resolve() == ROOT / "stream" / "__init__.py"


def test_the_broker_gives_back_every_message_of_a_topic_its_tools_made(cluster):
    kafka = pytest.importorskip("kafka") if os.environ.get("CI") != "true" else __import__("kafka")
    topic, bootstrap = f"smoke-{uuid.uuid4().hex[:8]}", f"localhost:{cluster.config.ports.kafka}"
    made = subprocess.run(["java", "-cp", f"{cluster.config.kafka_libs}/*", "org.apache.kafka.tools.TopicCommand",
                           "--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions", "2"],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stdout + made.stderr
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(20):
        producer.send(topic, key=str(i % 2).encode(), value=f"m{i}".encode())
    producer.flush()
    producer.close()
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                   consumer_timeout_ms=10_000)
    got = sorted(m.value.decode() for m in consumer)
    consumer.close()
    assert got == sorted(f"m{i}" for i in range(20))
