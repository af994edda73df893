"""The streaming job's Kafka source, whatever runner reads it: the settings ``--kafka-topic``,
``--bootstrap-servers``, ``--kafka-consumer-config`` and ``--kafka-timestamp-policy`` give, checked
(:func:`kafka_settings`), and a record's name (:func:`kafka_record_name`). Each runner's shell maps
them to its own read (the Beam shell: ``ReadFromKafka``'s arguments).

Each record is read with its metadata (byte-array key and value); its name is
``topic/partition/offset``, which names the same record on every read, retry and replay. Its
value is one message (:mod:`renyi_stream.pipelines.streaming.codec`); its event time is the
record's timestamp (milliseconds since the epoch), which is also what the watermark follows
(``--kafka-timestamp-policy``). With ``CreateTime`` (the default) the **producer sets the record's
CreateTime to the batch's earliest event time** (``ProducerRecord(topic, None, timestamp_ms, key,
value)``; ``timestamp_ms`` in kafka-python/confluent-kafka), sends a batch with the rows of one
window only, and, within a partition, sends a window's batches before any batch of a later window:
each partition's watermark then stays behind every batch not yet read, and a batch is late only
when it is produced after its window closed. With ``LogAppendTime`` the broker's append time is
used: it is never earlier than the rows' event times, so a batch appended after its window's end
is late even when it was produced in time; use it only where producers cannot set CreateTime.

Imports no Beam."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

#: ``--kafka-timestamp-policy`` choices: the record timestamp the element timestamp and the
#: watermark follow. ``ProcessingTime`` (the reader's clock) is not offered: it is later than
#: every row's event time, so the watermark would not mean "this window's rows are in".
CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"
KAFKA_TIMESTAMP_POLICIES = (CREATE_TIME, LOG_APPEND_TIME)
#: Consumer settings the job fixes itself: the brokers come from ``--bootstrap-servers``, records
#: are read as bytes, and offsets are committed only once the runner has made what read them durable
#: (Beam: once it finalizes the bundle that read them).
_FIXED_CONSUMER_KEYS = ("bootstrap.servers", "key.deserializer", "value.deserializer", "enable.auto.commit")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def kafka_record_name(record: Any) -> str:
    """``topic/partition/offset`` of a Kafka record read with metadata: the same for every read of
    the record (a retried bundle, a replay after a restore), as a Pub/Sub message id is, so its
    rows keep their input position (:func:`renyi_stream.pipelines.streaming.codec._source_number`) and its
    dead letters their source."""
    return f"{record.topic}/{int(record.partition)}/{int(record.offset)}"


def _host_port(option: str, text: str) -> str:
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{option} must be HOST:PORT with a port in [1, 65535], got {text!r}")
    return f"{host}:{int(port)}"


def _consumer_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--kafka-consumer-config`` (argparse type: the error names the value)."""
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE (a Kafka consumer setting), got {text!r}")
    return key.strip(), value


@dataclass(frozen=True)
class KafkaSettings:
    """The job's Kafka read, whatever reads it: the one ``topic``; ``consumer_config`` =
    ``bootstrap.servers`` from ``--bootstrap-servers`` plus every ``--kafka-consumer-config``;
    ``timestamp_policy`` (:data:`KAFKA_TIMESTAMP_POLICIES`) from ``--kafka-timestamp-policy``;
    ``commit_offsets`` exactly when a ``group.id`` is configured (Kafka refuses to commit offsets
    without one); ``expansion_service`` from ``--kafka-expansion-service``, the Java expansion
    service of Beam's cross-language read (None: Beam starts its Java IO expansion service jar
    itself). Records are read as bytes, with their metadata (topic, partition, offset, timestamp)."""

    topic: str
    consumer_config: dict[str, str]
    timestamp_policy: str
    commit_offsets: bool
    expansion_service: str | None


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    """The :class:`KafkaSettings` of ``args``.

    Raises ValueError naming the option and the value when one is malformed: a topic Kafka would
    refuse, a bootstrap server or expansion service that is not HOST:PORT, a consumer setting that
    is not KEY=VALUE, given twice, or one the job fixes itself (bootstrap.servers,
    key/value.deserializer, enable.auto.commit)."""
    topic = getattr(args, "kafka_topic", None)
    if not topic or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(f"--kafka-topic must be a Kafka topic name (1-249 of A-Z a-z 0-9 . _ -), got {topic!r}")
    servers = getattr(args, "bootstrap_servers", None)
    if not servers:
        raise ValueError(f"--kafka-topic {topic} needs --bootstrap-servers HOST:PORT[,HOST:PORT...]")
    brokers = ",".join(_host_port("--bootstrap-servers", s) for s in str(servers).split(",") if s.strip())
    if not brokers:
        raise ValueError(f"--bootstrap-servers must list HOST:PORT[,HOST:PORT...], got {servers!r}")
    policy = getattr(args, "kafka_timestamp_policy", None) or CREATE_TIME
    if policy not in KAFKA_TIMESTAMP_POLICIES:
        raise ValueError(f"--kafka-timestamp-policy must be one of {list(KAFKA_TIMESTAMP_POLICIES)}, got {policy!r}")
    config = {"bootstrap.servers": brokers}
    for setting in getattr(args, "kafka_consumer_config", None) or []:
        try:
            key, value = setting if isinstance(setting, tuple) else _consumer_setting(setting)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"--kafka-consumer-config {exc}") from None
        if key in _FIXED_CONSUMER_KEYS:
            raise ValueError(f"--kafka-consumer-config {key}={value}: {key} is set by the job (fixed: "
                             f"{', '.join(_FIXED_CONSUMER_KEYS)}; the brokers come from --bootstrap-servers)")
        if key in config:
            raise ValueError(f"--kafka-consumer-config {key} is given twice, got {config[key]!r} and {value!r}")
        config[key] = value
    service = getattr(args, "kafka_expansion_service", None)
    return KafkaSettings(topic=topic, consumer_config=config, timestamp_policy=policy,
                         commit_offsets="group.id" in config,
                         expansion_service=_host_port("--kafka-expansion-service", service) if service else None)
