"""The streaming job on Flink reading Kafka (pipelines/streaming/flink/kafka_source.py, issue 38
items 1 and 4): the conformance scenario's messages, produced to a fresh topic of the local
cluster's broker per step (one partition, in input order, each record's CreateTime its batch's
earliest event time, the producer rule of renyi_stream.pipelines.streaming.kafka), read by the
PyFlink job with ``--kafka-topic --kafka-bounded`` give what the DirectRunner replay of the same
files gives: the same public part of every release, the same exact sums under the noise, the same
ledger, the same books and the same dead letters (a Kafka message is named
``topic/partition/offset``, a replayed file by its path: each dead letter's record is mapped back to
its file), after every step of the scenario. The first step's Flink job is given the DirectRunner
ledger's id (tests/engines/test_flink_stream.py's wrapper), so every public release row must be
equal bit for bit.

Without ``java``, ``javac`` or ``mvn`` this is skipped naming what to install; under ``CI=true`` it
fails instead (tests/engines/conftest.py)."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from pathlib import Path

import pytest
from conformance import scenario as sc
from conformance.adapters import StreamingJob
from conformance.conftest import write_inputs
from conformance.outcome import Outcome, differing_sums, public_part, without_noise
from engines.test_flink_stream import SCENARIO, FlinkStreamingJob

from renyi_stream.stream.noise import NoiseKey


def _kafka() -> object:
    return pytest.importorskip("kafka") if os.environ.get("CI") != "true" else __import__("kafka")


def _created_millis(message: sc.Message, step: sc.Step) -> int:
    """The record's CreateTime: the batch's earliest event time (a batch without rows: its step's start)."""
    day = min(message.day) if message.day else step.first_day
    start = dt.datetime.combine(sc.DAY0 + dt.timedelta(days=day), dt.time(), dt.timezone.utc)
    return int(start.timestamp()) * 1000


class FlinkKafkaJob(FlinkStreamingJob):
    """The Flink job of tests/engines/test_flink_stream.py, each step reading its messages from a
    fresh topic they were produced to, not from the files."""

    name = "flink-kafka"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bootstrap = f"localhost:{self.cluster.config.ports.kafka}"
        self.sources: dict[tuple[int, str], str] = {}  # (run, offset) -> the message's file name
        self.topic: str | None = None

    def produce(self, step: sc.Step) -> None:
        kafka = _kafka()
        from kafka.admin import KafkaAdminClient, NewTopic

        self.topic = f"conformance-{uuid.uuid4().hex[:10]}"
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:  # old event times: kept whatever their age
            admin.create_topics([NewTopic(self.topic, 1, 1, topic_configs={"retention.ms": "-1"})])
        finally:
            admin.close()
        producer = kafka.KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", max_in_flight_requests_per_connection=1)
        run = len(self.outputs)
        for message in sorted(step.messages, key=lambda m: m.name):  # input order, as the replay's
            path = Path(self.inputs[message.name])
            sent = producer.send(self.topic, value=path.read_bytes(), partition=0,
                                 timestamp_ms=_created_millis(message, step)).get(timeout=30)
            self.sources[(run, str(sent.offset))] = path.name
        producer.flush()
        producer.close()

    def argv(self, step: sc.Step) -> list[str]:
        replayed = StreamingJob.argv(self, step)
        assert replayed[0] == "--replay"
        rest = replayed[1 + len(self.paths(step)):]
        return ["--kafka-topic", self.topic, "--bootstrap-servers", self.bootstrap,
                "--kafka-consumer-config", "auto.offset.reset=earliest", "--kafka-bounded", *rest]

    def run(self, step: sc.Step) -> None:
        self.produce(step)
        super().run(step)

    def outcome(self) -> Outcome:
        """The outcome, each dead letter's source the file its message was produced from."""
        got = super().outcome()
        dead = tuple(sorted((run, self.sources[(run, name)], row, reason) for run, name, row, reason in got.dead))
        return Outcome(releases=got.releases, ledger_id=got.ledger_id, ledger=got.ledger, runs=got.runs, dead=dead)


def test_the_conformance_scenario_from_kafka_on_flink_gives_the_directrunner_replays_outcome(cluster, tmp_path):
    _kafka()
    key_path = tmp_path / "noise.key"
    key = NoiseKey.load_or_create(key_path)
    scenario = sc.SCENARIOS[SCENARIO]
    inputs = write_inputs(tmp_path / "inputs", scenario)
    direct = StreamingJob(tmp_path / "direct", scenario, str(key_path), inputs)
    flink = FlinkKafkaJob(tmp_path / "flink", scenario, str(key_path), inputs, cluster=cluster)
    plan = scenario.query_plan()
    for number, step in enumerate(scenario.steps, 1):
        direct.run(step)
        if number == 1:
            flink.ledger_id = direct.outcome().ledger_id
        flink.run(step)  # RunFailed (with what flink run printed) unless it exits 0 with balanced books
        want, got = direct.outcome(), flink.outcome()
        where = f"after step {number} of scenario {SCENARIO} (from Kafka)"
        assert got.ledger_id == want.ledger_id, where
        assert public_part(got) == public_part(want), where
        exact = differing_sums(without_noise(got, key, plan), without_noise(want, key, plan), tolerance=0.0)
        assert exact == {}, f"{where}: sums under the noise differ: {exact}"
        assert got.releases == want.releases, where  # every public row, bit for bit
        assert got.ledger == want.ledger, where
        assert got.runs == want.runs, where
        assert got.dead == want.dead, where
    print(f"flink job seconds per step (submission included): {[round(s, 1) for s in flink.seconds]}")
