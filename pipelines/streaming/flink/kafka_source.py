"""The Flink job's Kafka read (``--kafka-topic T --bootstrap-servers H:P``): the records of the one
topic as ``(name, payload)`` messages, what
:class:`renyi_stream.pipelines.streaming.codec.MessageValidator` takes, the record timestamp as
their event time and the watermark following it.

The settings are the Beam job's (:func:`renyi_stream.pipelines.streaming.kafka.kafka_settings`:
the topic, ``bootstrap.servers`` and every ``--kafka-consumer-config``, offsets committed exactly
when a ``group.id`` is configured), and so are the producer rule and a record's name
(:mod:`renyi_stream.pipelines.streaming.kafka`: ``topic/partition/offset``, the same on every read,
restore and replay, which numbers its rows and names its dead letters).

How: Flink's Kafka table connector (in Flink's ``lib/``, ``flink-connector-kafka``) with the
``raw`` format, so each record's value reaches Python as bytes (PyFlink's DataStream API has no
bytes deserialization schema) together with the record's topic, partition, offset and timestamp
(metadata columns), then ``to_data_stream``. Event time is the record's timestamp (milliseconds
since the epoch; what the topic stores: CreateTime, or LogAppendTime on a topic configured so);
the watermark is generated per partition in the source, one millisecond behind the greatest
timestamp read (the monotonous rule: a record is late only when a record with a later timestamp
was read before it on its partition), and a partition that gives no record for
:data:`IDLE_TIMEOUT` is idle, so a quiet partition (or a source subtask without one) does not hold
the watermark back. A window's shards therefore charge it as soon as the watermark passes its end,
while the stream goes on.

Where reading starts: with a ``group.id``, at the group's committed offsets (else where
``auto.offset.reset`` says, Kafka's default ``latest``), and offsets are committed on every
completed checkpoint; without one, at the earliest offsets when ``auto.offset.reset=earliest`` is
configured, else at the latest (Kafka's default, as the Beam job's read). ``bounded``: the read
ends at the offsets that are the latest when the job starts, so the job (a replay from Kafka)
ends, with the final watermark, once every record produced before it started is read; unbounded,
it never ends.

Imports no Beam."""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

from renyi_stream.pipelines.streaming.kafka import KafkaSettings, kafka_record_name, kafka_settings

#: How long a partition gives no record before it is idle and stops holding the watermark back.
IDLE_TIMEOUT = "10 s"
#: The table the job reads (a temporary table of the job's own table environment).
TABLE = "renyi_kafka_records"


class _Record(NamedTuple):
    topic: str
    partition: int
    offset: int


def _quoted(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def table_options(settings: KafkaSettings, *, bounded: bool) -> dict[str, str]:
    """The Kafka table connector's options for ``settings``: the topic, every consumer setting as
    ``properties.<key>``, the start (module docstring) and, with ``bounded``, the end at the latest
    offsets at the job's start."""
    config = dict(settings.consumer_config)
    options = {"connector": "kafka", "topic": settings.topic, "format": "raw",
               "scan.watermark.idle-timeout": IDLE_TIMEOUT}
    if settings.commit_offsets:  # group.id: its committed offsets, else auto.offset.reset (read by the connector)
        config.setdefault("auto.offset.reset", "latest")
        options["scan.startup.mode"] = "group-offsets"
    else:
        reset = config.pop("auto.offset.reset", "latest").strip().lower()
        options["scan.startup.mode"] = "earliest-offset" if reset == "earliest" else "latest-offset"
    options.update({f"properties.{key}": value for key, value in config.items()})
    if bounded:
        options["scan.bounded.mode"] = "latest-offset"
    return options


def table_ddl(settings: KafkaSettings, *, bounded: bool) -> str:
    """``CREATE TEMPORARY TABLE`` of the records: ``value`` (bytes, null for a record without one),
    ``topic``, ``partition``, ``offset``, ``ts`` (the record timestamp, the rowtime) and the
    watermark one millisecond behind it."""
    options = ",\n  ".join(f"{_quoted(k)} = {_quoted(v)}" for k, v in table_options(settings, bounded=bounded).items())
    return (f"CREATE TEMPORARY TABLE {TABLE} (\n"
            "  `value` BYTES,\n"
            "  `topic` STRING METADATA VIRTUAL,\n"
            "  `partition` INT METADATA VIRTUAL,\n"
            "  `offset` BIGINT METADATA VIRTUAL,\n"
            "  `ts` TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,\n"
            "  WATERMARK FOR `ts` AS `ts` - INTERVAL '0.001' SECOND\n"
            f") WITH (\n  {options}\n)")


def record_to_message(row: Any) -> tuple[str, bytes]:
    """A record ``(topic, partition, offset, value)`` -> ``(topic/partition/offset, value)``
    (:func:`renyi_stream.pipelines.streaming.kafka.kafka_record_name`); ``b""`` for a record without
    a value, which decodes to one ``undecodable_message`` dead letter (as in the Beam job)."""
    topic, partition, offset, value = row[0], row[1], row[2], row[3]
    return kafka_record_name(_Record(str(topic), int(partition), int(offset))), b"" if value is None else bytes(value)


def kafka_messages(env: Any, args: argparse.Namespace, *, bounded: bool) -> Any:
    """The stream of ``(name, payload)`` messages of ``args``' Kafka topic on ``env`` (a PyFlink
    ``StreamExecutionEnvironment``), at their records' timestamps with the watermark of the module
    docstring. ValueError as :func:`renyi_stream.pipelines.streaming.kafka.kafka_settings`."""
    from pyflink.table import StreamTableEnvironment

    from renyi_stream.pipelines.streaming.flink.state import PICKLED

    settings = kafka_settings(args)
    tables = StreamTableEnvironment.create(env)
    tables.execute_sql(table_ddl(settings, bounded=bounded))
    records = tables.sql_query(f"SELECT `topic`, `partition`, `offset`, `value` FROM {TABLE}")
    return tables.to_data_stream(records).map(record_to_message, output_type=PICKLED).name("KafkaRecordToMessage")
