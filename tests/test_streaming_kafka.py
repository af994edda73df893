"""The Kafka source of the streaming job (renyi_stream.pipelines.streaming.beam.job and .kafka, ``--kafka-topic``).

Everything but Java KafkaIO is tested here: the options and their refusals, the ``ReadFromKafka``
the job builds and what it sends to an expansion service (a fake one in this process: the real
one is Java), and Kafka records, of the type ``ReadFromKafka(with_metadata=True)`` yields, going
through the real downstream graph on the DirectRunner under ``TestStream``, where they give the
ledger the replay path gives on the same rows and the same releases up to the noise (each job's
new ledger draws its own). Not tested: the expansion by
Java KafkaIO, a broker, Flink (deploy/README.md says what that leaves open).
"""

from __future__ import annotations

import logging
import re
import socket
import uuid
from concurrent import futures
from pathlib import Path

import apache_beam as beam
import duckdb
import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.coders import RowCoder
from apache_beam.io.kafka import ReadFromKafka
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_expansion_api_pb2, beam_expansion_api_pb2_grpc, external_transforms_pb2
from apache_beam.testing import test_pipeline as beam_test_pipeline
from apache_beam.testing import test_stream as beam_test_stream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.typehints import schemas
from apache_beam.utils.timestamp import Timestamp

from renyi_stream.pipelines.distributed import job as dist
from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.books import window_counts
from renyi_stream.pipelines.streaming.codec import _source_number, encode_message
from renyi_stream.pipelines.streaming.kafka import kafka_record_name
from renyi_stream.pipelines.streaming.options import _parser
from renyi_stream.stream.schema import DeadLetterReason, WindowSpec
from test_streaming_job import W0, _args, _key, _rows, _snapshot_ledger_ids, _without_noise

TOPIC = "indicators"
BROKERS = "kafka-0:9092,kafka-1:9092"
SPEC = WindowSpec()


def _java_record_schema():
    """The schema of Java KafkaIO's ``ByteArrayKafkaRecord`` (what ``ReadFromKafka(with_metadata=
    True)`` yields), under a fresh id: Beam then decodes it, as it does a cross-language output,
    into a ``BeamSchema_<id>`` NamedTuple generated from the schema."""
    from typing import NamedTuple, Optional, Sequence

    class KafkaHeader(NamedTuple):
        key: str
        value: Optional[bytes]

    class ByteArrayKafkaRecord(NamedTuple):
        topic: str
        partition: np.int32
        offset: np.int64
        timestamp: np.int64
        key: Optional[bytes]
        value: Optional[bytes]
        headers: Optional[Sequence[KafkaHeader]]
        timestampTypeId: np.int32
        timestampTypeName: str

    schema = schemas.named_tuple_to_schema(ByteArrayKafkaRecord)
    fresh = type(schema)()
    fresh.CopyFrom(schema)
    fresh.id = str(uuid.uuid4())
    return fresh


RECORD_SCHEMA = _java_record_schema()
KafkaRecord = schemas.named_tuple_from_schema(RECORD_SCHEMA)


def _record(value: bytes | None, *, partition: int, offset: int, millis: int) -> object:
    return KafkaRecord(topic=TOPIC, partition=partition, offset=offset, timestamp=millis, key=None, value=value,
                       headers=None, timestampTypeId=0, timestampTypeName="CreateTime")


def _day_start_millis(day: int) -> int:
    return int(SPEC.window_start_seconds(W0 + day)) * 1000


def _kafka(tmp_path, *extra: str) -> list[str]:
    """The job's arguments with the Kafka source, outputs under ``tmp_path/kafka``."""
    return _outputs(_args(tmp_path, ["--kafka-topic", TOPIC, "--bootstrap-servers", BROKERS], *extra),
                    tmp_path / "kafka")


def _outputs(argv: list[str], root: Path) -> list[str]:
    """``argv`` with its public and curator roots moved under ``root`` (the noise key stays)."""
    argv = list(argv)
    argv[argv.index("--releases-parquet") + 1] = str(root / "public")
    argv[argv.index("--output") + 1] = str(root / "curator")
    return argv


def _refusal(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        sj.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def days():
    """Three days of 120 of 200 users, two batches a day (disjoint users), as Arrow tables."""
    rng = np.random.default_rng(11)
    batches = []
    for d in range(3):
        table = _rows(d, rng.choice(200, 120, replace=False), seed=5)
        batches.append((d, [table.slice(0, 60), table.slice(60)]))
    return batches


def _run_kafka(tmp_path, events: list, *extra: str) -> Path:
    """Run the job's graph with the Kafka source on the DirectRunner (streaming), ``events``
    (``("records", [record, ...])`` or ``("watermark", seconds)``) replacing ReadFromKafka;
    then the watermark goes to infinity. Returns the root of its outputs."""
    logging.getLogger().setLevel(logging.ERROR)
    stream = beam_test_stream.TestStream(coder=RowCoder(RECORD_SCHEMA))
    for kind, payload in events:
        if kind == "records":  # TestStream stamps them at their CreateTime, as ReadFromKafka does
            stream = stream.add_elements(
                [TimestampedValue(r, Timestamp(micros=r.timestamp * 1000)) for r in payload])
        else:
            stream = stream.advance_watermark_to(payload)
    stream = stream.advance_watermark_to_infinity()
    args, _ = sj.parse_args(_kafka(tmp_path, *extra))
    with beam_test_pipeline.TestPipeline(options=PipelineOptions(["--streaming"])) as p:
        sj.build(p, args, messages=p | "Records" >> stream)
    return tmp_path / "kafka"


def _daily_records(batches) -> list:
    """Each day's batches as records (partition = batch index, offsets counting up per partition,
    CreateTime = the batch's earliest event time), then the watermark to that day's end."""
    events, offsets = [], {}
    for day, tables in batches:
        records = []
        for k, table in enumerate(tables):
            offsets[k] = offsets.get(k, -1) + 1
            records.append(_record(encode_message(table), partition=k, offset=offsets[k],
                                   millis=_day_start_millis(day)))
        events += [("records", records), ("watermark", int(SPEC.window_end_seconds(W0 + day)))]
    return events


def _releases(root: Path) -> list[tuple]:
    return duckdb.sql(f"SELECT query_id, window_id, coordinate, value, noise_std FROM read_parquet("
                      f"'{root / 'public'}/*/*.parquet', hive_partitioning = true) ORDER BY 1, 2, 3").fetchall()


def _ledgers(root: Path) -> dict[str, list[tuple]]:
    """Every (window) ledger snapshot, all shards together: ``window folder -> [(user, used)]``."""
    out = {}
    for folder in sorted((root / "curator" / "ledger").glob("window_id=*")):
        table = pa.concat_tables([pq.read_table(f) for f in sorted(folder.glob("shard=*/*.parquet"))])
        table = table.sort_by("user_id")
        out[folder.name] = list(zip(table.column("user_id").to_pylist(), table.column("used").to_pylist()))
    return out


def _counts(root: Path) -> list[tuple]:
    """Every shard's counts of every window it charged rows in (read from its books records)."""
    rows = window_counts(str(root / "curator")).to_pylist()
    return sorted(tuple(sorted(r.items())) for r in rows)


def _dead(root: Path) -> pa.Table | None:
    files = sorted((root / "curator" / "dead").rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


# --- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize("other", [["--subscription", "projects/p/subscriptions/s"], ["--replay", "a.arrows"]])
def test_kafka_topic_with_another_source_is_refused_naming_both_options(tmp_path, capsys, other):
    err = _refusal(capsys, _args(tmp_path, [*other, "--kafka-topic", TOPIC, "--bootstrap-servers", BROKERS]))
    assert "--kafka-topic" in err and other[0] in err and "not allowed with" in err


def test_kafka_topic_without_bootstrap_servers_is_refused(tmp_path, capsys):
    err = _refusal(capsys, _args(tmp_path, ["--kafka-topic", TOPIC]))
    assert "--kafka-topic indicators needs --bootstrap-servers" in err


def test_a_consumer_setting_without_equals_is_refused_naming_the_value(tmp_path, capsys):
    err = _refusal(capsys, _kafka(tmp_path, "--kafka-consumer-config", "group.id"))
    assert "--kafka-consumer-config" in err and "KEY=VALUE" in err and "'group.id'" in err


@pytest.mark.parametrize("extra, named", [
    (["--kafka-consumer-config", "bootstrap.servers=evil:9092"], "bootstrap.servers=evil:9092"),
    (["--kafka-consumer-config", "enable.auto.commit=true"], "enable.auto.commit=true"),
    (["--kafka-consumer-config", "group.id=a", "--kafka-consumer-config", "group.id=b"], "group.id is given twice"),
    (["--kafka-expansion-service", "expansion"], "--kafka-expansion-service must be HOST:PORT"),
    (["--kafka-timestamp-policy", "ProcessingTime"], "'ProcessingTime'"),
])
def test_a_malformed_or_job_owned_kafka_option_is_refused_naming_it(tmp_path, capsys, extra, named):
    assert named in _refusal(capsys, _kafka(tmp_path, *extra))


def test_a_bootstrap_server_without_a_port_is_refused_naming_it(tmp_path, capsys):
    argv = _kafka(tmp_path)
    argv[argv.index("--bootstrap-servers") + 1] = "kafka-0:9092,kafka-1"
    err = _refusal(capsys, argv)
    assert "--bootstrap-servers must be HOST:PORT" in err and "'kafka-1'" in err


def test_kafka_options_without_kafka_topic_are_refused(tmp_path, capsys):
    err = _refusal(capsys, _args(tmp_path, ["--replay", "a.arrows", "--bootstrap-servers", BROKERS]))
    assert "--bootstrap-servers only go with --kafka-topic" in err


# --- the ReadFromKafka the job builds ----------------------------------------------------------


def test_the_read_config_takes_the_topic_as_bytes_with_metadata_from_the_given_brokers(tmp_path):
    args, _ = sj.parse_args(_kafka(tmp_path, "--kafka-consumer-config", "group.id=renyi-stream",
                                   "--kafka-consumer-config", "auto.offset.reset=earliest",
                                   "--kafka-expansion-service", "expansion-service:8097"))
    assert sj.kafka_read_config(args) == {
        "consumer_config": {"bootstrap.servers": BROKERS, "group.id": "renyi-stream",
                            "auto.offset.reset": "earliest"},
        "topics": [TOPIC],
        "key_deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
        "value_deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
        "with_metadata": True,
        "timestamp_policy": "CreateTime",
        "commit_offset_in_finalize": True,
        "expansion_service": "expansion-service:8097",
    }


def test_offsets_are_committed_only_with_a_consumer_group(tmp_path):
    args, _ = sj.parse_args(_kafka(tmp_path, "--kafka-timestamp-policy", "LogAppendTime"))
    config = sj.kafka_read_config(args)
    assert config["commit_offset_in_finalize"] is False and config["expansion_service"] is None
    assert config["timestamp_policy"] == "LogAppendTime"


class _RecordingExpansionService(beam_expansion_api_pb2_grpc.ExpansionServiceServicer):
    """Stands where the Java expansion service would: records each request, expands nothing."""

    def __init__(self) -> None:
        self.requests: list = []

    def Expand(self, request, context):  # noqa: N802 (the gRPC method's name)
        self.requests.append(request)
        return beam_expansion_api_pb2.ExpansionResponse(error="this stand-in expands nothing")


@pytest.fixture
def expansion_service():
    service = _RecordingExpansionService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    beam_expansion_api_pb2_grpc.add_ExpansionServiceServicer_to_server(service, server)
    port = server.add_secure_port("localhost:0", grpc.local_server_credentials())  # Beam's client uses local creds
    server.start()
    yield f"localhost:{port}", service
    server.stop(None)


def test_the_job_asks_the_given_expansion_service_for_read_from_kafka_with_its_config(tmp_path, expansion_service):
    address, service = expansion_service
    argv = _kafka(tmp_path, "--kafka-consumer-config", "group.id=renyi-stream", "--kafka-expansion-service", address)
    args, _ = sj.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    with pytest.raises(dist.RunRefused, match=f"could not be expanded by {address}.*this stand-in expands nothing"):
        sj.build(beam.Pipeline(options=PipelineOptions(["--streaming"])), args)
    (request,) = service.requests
    assert request.transform.spec.urn == ReadFromKafka.URN_WITH_METADATA
    payload = external_transforms_pb2.ExternalConfigurationPayload.FromString(request.transform.spec.payload)
    sent = RowCoder(payload.schema).decode(payload.payload)
    config = sj.kafka_read_config(args)
    assert dict(sent.consumer_config) == config["consumer_config"] and list(sent.topics) == [TOPIC]
    assert sent.key_deserializer == sent.value_deserializer == ReadFromKafka.byte_array_deserializer
    assert sent.timestamp_policy == "CreateTime" and sent.commit_offset_in_finalize is True
    assert sent.start_read_time is None and sent.max_num_records is None  # unbounded, from the group's offsets


def test_an_unreachable_expansion_service_refuses_the_run_naming_it(tmp_path):
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        args, _ = sj.parse_args(_kafka(tmp_path, "--kafka-expansion-service", address))
        logging.getLogger().setLevel(logging.ERROR)
        with pytest.raises(dist.RunRefused, match=re.escape(f"could not be expanded by {address}")):
            sj.build(beam.Pipeline(options=PipelineOptions(["--streaming"])), args)


# --- records to messages -----------------------------------------------------------------------


def test_a_record_becomes_its_value_named_topic_partition_offset_at_its_timestamp():
    table = _rows(0, [1, 2], seed=0)
    millis = _day_start_millis(0) + 1234
    (out,) = sj.KafkaRecordToMessage().process(_record(encode_message(table), partition=3, offset=77,
                                                       millis=millis))
    assert out.value == ("indicators/3/77", encode_message(table))
    assert out.timestamp == Timestamp(micros=millis * 1000)
    # The name is the input position of its rows: the same on every read of the record.
    assert _source_number(out.value[0]) == _source_number(kafka_record_name(
        _record(b"other bytes", partition=3, offset=77, millis=0)))


def test_a_record_without_a_value_or_timestamp_keeps_the_source_timestamp_and_an_empty_payload():
    (out,) = sj.KafkaRecordToMessage().process(_record(None, partition=0, offset=5, millis=-1))
    assert out == ("indicators/0/5", b"")


def test_kafka_records_give_the_releases_and_ledger_of_the_replay_path(tmp_path, days):
    files = []
    for day, tables in days:
        for k, table in enumerate(tables):
            files.append(tmp_path / "messages" / f"day-{day}-{k}.arrows")
            files[-1].parent.mkdir(exist_ok=True)
            files[-1].write_bytes(encode_message(table))
    assert sj.main(_outputs(_args(tmp_path, ["--replay", *map(str, files)]), tmp_path / "replay")) == 0
    kafka = _run_kafka(tmp_path, _daily_records(days))
    replay = tmp_path / "replay"
    streamed, replayed = _releases(kafka), _releases(replay)
    assert len(streamed) == len(replayed) == 2 * 3
    # Two jobs, two new ledgers: each adds its own ledger's noise (issue 18), so compare the sums.
    (kafka_id,) = _snapshot_ledger_ids(kafka / "curator" / "ledger")
    (replay_id,) = _snapshot_ledger_ids(replay / "curator" / "ledger")
    assert kafka_id != replay_id
    streamed = _without_noise(streamed, _key(tmp_path), kafka_id)
    replayed = _without_noise(replayed, _key(tmp_path), replay_id)
    for s, r in zip(streamed, replayed):  # sums up to the order of adding shards' rows
        assert s[:3] == r[:3] and s[4] == r[4] and s[3] == pytest.approx(r[3], rel=1e-12, abs=1e-9)
    assert _ledgers(kafka) == _ledgers(replay)
    assert sorted(_ledgers(kafka)) == [f"window_id={W0 + d}" for d in range(3)]
    assert _counts(kafka) == _counts(replay) and _counts(kafka)
    assert _dead(kafka) is None and _dead(replay) is None


def test_an_undecodable_record_is_one_dead_letter_named_topic_partition_offset(tmp_path, days):
    _, (good, _) = days[0]
    records = [_record(b"not arrow at all", partition=2, offset=41, millis=_day_start_millis(0)),
               _record(encode_message(good), partition=0, offset=0, millis=_day_start_millis(0))]
    root = _run_kafka(tmp_path, [("records", records), ("watermark", int(SPEC.window_end_seconds(W0)))])
    dead = _dead(root)
    assert dead is not None and dead.num_rows == 1
    assert dead.column("reason").to_pylist() == [DeadLetterReason.UNDECODABLE_MESSAGE]
    assert dead.column("source").to_pylist() == ["indicators/2/41"]
    assert dead.column("raw").to_pylist() == [b"not arrow at all".hex()]
    charged = sum(n for row in _counts(root) for k, n in row if k in ("admitted", "clipped", "dropped"))
    assert charged == good.num_rows  # the rest charged


# --- deployment ----------------------------------------------------------------------------------

# Java FlinkPipelineOptions (runners/flink, Beam 2.77) that Python's PipelineOptions does not
# declare: --flink_submit_uber_jar retains unknown options and the Java side reads them by name.
FLINK_JAVA_OPTIONS = {"--checkpointing_interval", "--checkpointing_mode", "--checkpoint_timeout_millis",
                      "--min_pause_between_checkpoints", "--externalized_checkpoints_enabled",
                      "--retain_externalized_checkpoints_on_cancellation", "--state_backend",
                      "--state_backend_storage_path", "--savepoint_path", "--allow_non_restored_state",
                      "--number_of_execution_retries", "--execution_retry_delay",
                      "--fail_on_checkpointing_errors", "--num_concurrent_checkpoints"}


def test_every_option_of_the_flink_stream_script_is_known_to_the_job_to_beam_or_to_flink():
    root = Path(__file__).resolve().parents[1] / "deploy" / "flink"
    text = (root / "submit-stream.sh").read_text() + (root / "flink-options.txt").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # comments show other tools' flags
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]+)", code))
    ours = {s for action in _parser()._actions for s in action.option_strings}
    beam_options = {f"--{name}" for name in PipelineOptions([]).get_all_options()}
    unknown = sorted(o for o in options if o not in ours | beam_options | FLINK_JAVA_OPTIONS)
    assert not unknown, f"submit-stream.sh passes options nobody reads: {unknown}"
    assert {"--kafka-topic", "--bootstrap-servers", "--streaming", "--checkpointing_interval",
            "--externalized_checkpoints_enabled", "--kafka-expansion-service"} <= options
