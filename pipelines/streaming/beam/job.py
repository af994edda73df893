"""The streaming job in Beam: indicator batches from an unbounded source, released window by window.

::

    python -m renyi_stream.pipelines.streaming \\
        --subscription projects/acme/subscriptions/indicators --timestamp-attribute event_time \\
        --columns opened,bought --start 2026-03-01 --end 2026-12-31 \\
        --epsilon 1 --delta 1e-6 --norm-budget 30 \\
        --releases-parquet gs://acme-public/releases --output gs://acme-curator/stream \\
        --noise-key-secret projects/acme/secrets/renyi-noise-key/versions/1 --key-fingerprint 0123abcd... \\
        --runner DataflowRunner --streaming --enable_streaming_engine --project acme --region europe-west1 ...

    python -m renyi_stream.pipelines.streaming \\
        --kafka-topic indicators --bootstrap-servers kafka-0:9092,kafka-1:9092 \\
        --kafka-consumer-config group.id=renyi-stream --kafka-consumer-config auto.offset.reset=earliest \\
        --kafka-expansion-service localhost:8097 \\
        --columns opened,bought --start 2026-03-01 --end 2026-12-31 ... \\
        --runner FlinkRunner --streaming --flink_submit_uber_jar --checkpointing_interval 60000 ...

This module says only how Beam wires the job; what it does, under any runner, is the
runner-independent machinery of :mod:`renyi_stream.pipelines.streaming` (the command line
:mod:`~renyi_stream.pipelines.streaming.options`, the launch :mod:`~renyi_stream.pipelines.streaming.job_plan`,
the message :mod:`~renyi_stream.pipelines.streaming.codec`, the filter
:mod:`~renyi_stream.pipelines.streaming.shard_filter`, the commit protocol
:mod:`~renyi_stream.pipelines.streaming.commits`, recovery and lineage
:mod:`~renyi_stream.pipelines.streaming.recovery`, snapshots, books).

Sources (exactly one):

* ``--subscription``: a Pub/Sub subscription (Dataflow only: the Python SDK's Pub/Sub source
  runs nowhere else). A message's name is its Pub/Sub message id; its event time the
  ``--timestamp-attribute`` the producer sets, in milliseconds since the epoch or RFC 3339 (the
  batch's earliest event time).
* ``--kafka-topic`` with ``--bootstrap-servers``: a Kafka topic, read by Beam's cross-language
  ``ReadFromKafka`` (Java KafkaIO; its expansion needs a Java expansion service, see
  :func:`kafka_source`), with the settings and the producer rule of
  :mod:`renyi_stream.pipelines.streaming.kafka`.
* ``--replay FILE...``: files, each one message, for a local run or a replay
  (:mod:`renyi_stream.pipelines.streaming.replay`), stamped at their earliest row's window start.

The graph: decode and validate each message (:class:`DecodeAndValidate`; an undecodable message
is one dead letter, rows that fail validation are dead letters with reasons) ->
:class:`renyi_stream.pipelines.streaming.beam.releases.StreamingReleases` (the individual filter per user shard in keyed
state, a chained event-time timer per window end, a release once every shard has charged the
window, keyed noise) -> in the curator's ``--output``, a ledger snapshot and a books record (the
shard's row books and counts of the window) per (window, shard), dead letters, and each window's
release file staged (:class:`StageWindowFile`), which goes to the public Parquet release root
(first write wins) only once the window is committed: staged, every shard's snapshot and records
of it written, its marker written after the previous window's (:class:`CommitWindows`: the
outbox rule, docs/architecture.md, "The outbox rule"). The three sources differ only in the read
step: everything from :class:`KafkaRecordToMessage` (Kafka) or :class:`DecodeAndValidate` (the
others) on is the same code, and :func:`build` takes the read step's output as an argument for
tests.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import io
import json
import logging
import re
import sys
from typing import Any, Iterator, Sequence, Tuple

import pyarrow as pa

_root, _level = logging.getLogger(), logging.getLogger().level
_root.setLevel(logging.ERROR)  # Beam's GCP extras warn at import when their optional clients are absent
try:
    import apache_beam as beam
    import grpc
    from apache_beam.coders import PickleCoder
    from apache_beam.io.kafka import ReadFromKafka
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.timestamp import Timestamp

    from renyi_stream.pipelines.beam import job_options as launch
    from renyi_stream.pipelines.beam import object_store as store
    from renyi_stream.pipelines.beam import worker_key
    from renyi_stream.pipelines.beam.local_runner import batch_runner, is_direct
    from renyi_stream.pipelines.streaming.beam.releases import StreamingReleases
finally:
    _root.setLevel(_level)
from renyi_stream.pipelines.beam import preview
from renyi_stream.pipelines.cli.errors import worded
from renyi_stream.pipelines.streaming import dry_run as preview_root
from renyi_stream.pipelines.streaming.books import BOOKS_FILE, record_books, write_window_records
from renyi_stream.pipelines.streaming.codec import MessageValidator
from renyi_stream.pipelines.streaming.commits import WindowCommits, WindowStaging, _snapshot_written, write_prepaid
from renyi_stream.pipelines.streaming.dry_run import _private_copy
from renyi_stream.pipelines.streaming.job_plan import _record_queries, plan_job, prepare_output
from renyi_stream.pipelines.streaming.kafka import CREATE_TIME, LOG_APPEND_TIME, kafka_record_name, kafka_settings
from renyi_stream.pipelines.streaming.options import _parser, key_fingerprint
from renyi_stream.pipelines.streaming.options import parse_args as parse_job_args
from renyi_stream.pipelines.streaming.recovery import record_state_file
from renyi_stream.pipelines.streaming.replay import _replayed_file, check_replay, replay_names, replay_numbers
from renyi_stream.pipelines.streaming.snapshots import _ledger_file
from renyi_stream.pipelines.streaming.state_folder import RUNNING_STATE, STAGED_RELEASES, _write_named
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.queries.catalogue import CatalogueChanged
from renyi_stream.queries.registration import recorded_plan
from renyi_stream.stream.private_files import private_run_dir


# --- Kafka: everything but the cross-language read is runner-independent (pipelines/streaming/kafka.py) ---

#: Beam's names of the record timestamp policies
#: (:data:`renyi_stream.pipelines.streaming.kafka.KAFKA_TIMESTAMP_POLICIES`).
BEAM_TIMESTAMP_POLICIES = {CREATE_TIME: ReadFromKafka.create_time_policy,
                           LOG_APPEND_TIME: ReadFromKafka.log_append_time}


class KafkaRecordToMessage(beam.DoFn):
    """A Kafka record read with metadata -> ``(name, payload)``, what :class:`DecodeAndValidate`
    takes, named by :func:`renyi_stream.pipelines.streaming.kafka.kafka_record_name` and timestamped
    at the record's timestamp.

    Input: what ``ReadFromKafka(with_metadata=True)`` yields, a schema row with the fields of
    Java KafkaIO's ``ByteArrayKafkaRecord``: ``topic``, ``partition``, ``offset``, ``timestamp``
    (milliseconds since the epoch), ``key``, ``value`` (bytes or None), ``headers``,
    ``timestampTypeId``, ``timestampTypeName``. Output: ``(topic/partition/offset, value)``
    (``b""`` for a record without a value, which then decodes to one ``undecodable_message``
    dead letter) at ``timestamp``; that is the timestamp ReadFromKafka's CreateTime or
    LogAppendTime policy already gave the element, so the watermark and the element agree. A
    record without a timestamp (Kafka's -1) keeps the timestamp the source gave it."""

    def process(self, record: Any) -> Iterator[Any]:
        value = record.value
        message = (kafka_record_name(record), b"" if value is None else bytes(value))
        millis = record.timestamp
        if millis is None or int(millis) < 0:
            yield message
        else:
            yield TimestampedValue(message, Timestamp(micros=int(millis) * 1000))


def kafka_read_config(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :class:`apache_beam.io.kafka.ReadFromKafka` for ``args``
    (:func:`renyi_stream.pipelines.streaming.kafka.kafka_settings`): the one ``--kafka-topic``;
    ``consumer_config`` = ``bootstrap.servers`` from ``--bootstrap-servers`` plus every
    ``--kafka-consumer-config``; byte-array key and value deserializers; ``with_metadata`` (the
    record's topic, partition, offset and timestamp reach :class:`KafkaRecordToMessage`);
    ``timestamp_policy`` from ``--kafka-timestamp-policy`` (:data:`BEAM_TIMESTAMP_POLICIES`);
    ``commit_offset_in_finalize`` exactly when a ``group.id`` is configured (KafkaIO refuses it
    without one); ``expansion_service`` from ``--kafka-expansion-service`` (None: Beam starts its
    Java IO expansion service jar itself). ValueError as
    :func:`renyi_stream.pipelines.streaming.kafka.kafka_settings`."""
    settings = kafka_settings(args)
    return {
        "consumer_config": dict(settings.consumer_config),
        "topics": [settings.topic],
        "key_deserializer": ReadFromKafka.byte_array_deserializer,
        "value_deserializer": ReadFromKafka.byte_array_deserializer,
        "with_metadata": True,
        "timestamp_policy": BEAM_TIMESTAMP_POLICIES[settings.timestamp_policy],
        "commit_offset_in_finalize": settings.commit_offsets,
        "expansion_service": settings.expansion_service,
    }


def kafka_source(args: argparse.Namespace) -> ReadFromKafka:
    """The job's Kafka read: ``ReadFromKafka(**kafka_read_config(args))``. Constructing it
    contacts nothing; applying it to a pipeline asks the expansion service to expand it (Java
    KafkaIO), which is the one step of the Kafka path that needs Java. ValueError as
    :func:`kafka_read_config`."""
    return ReadFromKafka(**kafka_read_config(args))


def _read_kafka(p: beam.Pipeline, args: argparse.Namespace) -> Any:
    """Apply :func:`kafka_source` to ``p`` (the cross-language expansion). RunRefused naming the
    expansion service when it cannot be reached or refuses the transform."""
    source = kafka_source(args)
    where = args.kafka_expansion_service or "Beam's default Java IO expansion service jar"
    try:
        return p | "ReadFromKafka" >> source
    except (grpc.RpcError, RuntimeError, OSError) as exc:
        text = exc.details() if isinstance(exc, grpc.Call) else str(exc)  # an RpcError's str is its repr
        first = (str(text or "").strip().splitlines() or [type(exc).__name__])[0][:300]
        raise launch.RunRefused(f"ReadFromKafka could not be expanded by {where} (--kafka-expansion-service): "
                              f"{first}") from exc


# --- the shared steps as DoFns ------------------------------------------------------------------


class DecodeAndValidate(MessageValidator, beam.DoFn):
    """:class:`renyi_stream.pipelines.streaming.codec.MessageValidator` as a DoFn: message -> validated
    rows (main, timestamped at their earliest window's start with ``stamp``), dead letters (tag
    ``dead``) and the message's record of rows read (tag ``read``)."""

    def process(self, element: Any) -> Iterator[Any]:
        for tag, value in self.validate(element):
            if tag is not None:
                yield beam.pvalue.TaggedOutput(tag, value)
                continue
            at = self.event_time(value)
            yield value if at is None else TimestampedValue(value, at)


class WriteTable(beam.DoFn):
    """A curator table -> one Parquet file under ``root``, named by its content (a retried bundle
    rewrites the same file, never a second copy); outputs the path."""

    def __init__(self, root: str, folder: Any = None) -> None:
        self._root = root
        self._folder = folder  # element -> (sub-folder, table); None: the element is the table

    def process(self, element: Any) -> Iterator[str]:
        sub, table = self._folder(element) if self._folder else ("", element)
        yield _write_named(self._root, sub, table)


class StageWindowFile(WindowStaging, beam.DoFn):
    """:class:`renyi_stream.pipelines.streaming.commits.WindowStaging` as a stateful DoFn, keyed by
    window: ROWS is the bag of the window's rows not yet staged. A stateful step rather than a
    GroupByKey: a GroupByKey on an unbounded collection needs a windowing and trigger, and the rows of
    a window are complete exactly when their count is."""

    ROWS = BagStateSpec("rows", PickleCoder())

    def process(self, element: tuple[int, dict], rows: Any = beam.DoFn.StateParam(ROWS)) -> Iterator[Any]:
        yield from self.stage(element, rows=rows)


class WriteWindowRecords(beam.DoFn):
    """One shard's records of one charged window written
    (:func:`renyi_stream.pipelines.streaming.books.write_window_records`); outputs
    ``(window, (RECORDS_WRITTEN, shard, books record))`` for :class:`CommitWindows`."""

    def __init__(self, curator: str) -> None:
        self._curator = curator

    def process(self, element: tuple[int, dict, pa.Table | None]) -> Iterator[tuple[int, tuple[str, int, str]]]:
        yield write_window_records(self._curator, element)


class WritePrepaid(beam.DoFn):
    """One shard's per-user prepaid rows after one window written
    (:func:`renyi_stream.pipelines.streaming.commits.write_prepaid`); outputs
    ``(window, (PREPAID_WRITTEN, shard))`` for :class:`CommitWindows`."""

    def __init__(self, curator: str) -> None:
        self._curator = curator

    def process(self, element: tuple[int, int, list[tuple[str, pa.Table]]]) -> Iterator[tuple[int, tuple[str, int]]]:
        yield write_prepaid(self._curator, element)


class CommitWindows(WindowCommits, beam.DoFn):
    """:class:`renyi_stream.pipelines.streaming.commits.WindowCommits` as a stateful DoFn under one key:
    EVENTS is the bag of ``(window, event)`` of windows not yet committed, NEXT the next window to
    commit. Outputs the public files."""

    EVENTS = BagStateSpec("events", PickleCoder())
    NEXT = ReadModifyWriteStateSpec("next", PickleCoder())

    def process(self, element: tuple[Any, tuple[int, tuple[str, int]]], events: Any = beam.DoFn.StateParam(EVENTS),
                upcoming: Any = beam.DoFn.StateParam(NEXT)) -> Iterator[str]:
        yield from self.commit(element, events=events, upcoming=upcoming)


# --- the graph -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str], prog: str = "python -m renyi_stream.pipelines.streaming") -> tuple[argparse.Namespace, list[str]]:
    """``(job arguments, Beam arguments)`` of ``argv``
    (:func:`renyi_stream.pipelines.streaming.options.parse_args`), refusing (exit status 2) an option
    neither this job's nor Beam's (:func:`renyi_stream.pipelines.beam.job_options.refuse_unknown_options`:
    a typo would run the job without it)."""
    return parse_job_args(argv, prog, runner_options=launch.refuse_unknown_options)


def build(p: beam.Pipeline, args: argparse.Namespace,
          messages: beam.pvalue.PCollection | None = None) -> dict[str, Any]:
    """Check the arguments and apply the streaming graph to ``p``; returns its PCollections.
    Raises :class:`renyi_stream.pipelines.beam.job_options.RunRefused` (nothing built) when a check
    of :func:`renyi_stream.pipelines.streaming.job_plan.plan_job` fails, and ValueError naming the
    option when the source options do not fit together.

    ``messages``, when given, is a PCollection that replaces the source's read step, and only that
    step: Kafka records (as ``ReadFromKafka(with_metadata=True)`` yields them) with
    ``--kafka-topic``, Pub/Sub messages with ``--subscription``, ``(name, payload)`` pairs with
    ``--replay``. Everything after the read is built exactly as for the real source, so a test
    can run the Kafka path without a Java expansion service."""
    job = plan_job(args)
    config, curator = job.config, job.curator

    if args.kafka_topic:
        records = _read_kafka(p, args) if messages is None else messages
        messages = records | "KafkaRecordToMessage" >> beam.ParDo(KafkaRecordToMessage())
    elif messages is None and args.subscription:
        messages = p | "ReadPubSub" >> beam.io.ReadFromPubSub(
            subscription=args.subscription, timestamp_attribute=args.timestamp_attribute, with_attributes=True)
    elif messages is None:
        # The files are read inside the pipeline, one element per file: a Create of their bytes put
        # every payload into the graph, which Beam pickled and bz2-compressed several times over
        # (graph walks, bundle set-up): two thirds of a 3M-row replay's time.
        check_replay(args.replay, window=job.spec, indicator_columns=job.indicators, category_columns=job.categories,
                     id_type=job.id_type, contract=job.contract)
        messages = (p | "Replay" >> beam.Create(list(zip(replay_names(args.replay), args.replay)))
                    | "ReadReplayed" >> beam.Map(_replayed_file, job.keys).with_output_types(Tuple[str, bytes]))
    stamp = not (args.subscription or args.kafka_topic)  # files carry no event time; the sources do
    decoded = messages | "DecodeAndValidate" >> beam.ParDo(
        DecodeAndValidate(window=job.spec, indicator_columns=job.indicators, stamp=stamp, id_type=job.id_type,
                          category_columns=job.categories, numbers=replay_numbers(args.replay or ()), keys=job.keys)
    ).with_outputs("dead", "read", main="valid")
    out = StreamingReleases(
        window=job.spec, start_window=job.start, end_window=job.end, plan=job.plan, indicator_columns=job.indicators,
        noise_std=config.noise_std, policy=args.policy, budget=config.rho, id_type=config.id_type,
        tracker_step=config.tracker_step, n_shards=config.n_shards, key_path=job.key_path, accounting=config.accounting,
        key_fingerprint=config.key_fingerprint, ledger_id=config.ledger_id,
        previous_ledger=job.previous if job.previous.num_rows else None,
        released=[w for w in job.released if w < job.start], snapshot_every_window=True,
        resumed_through=job.own if job.own >= job.start else None, window_records=True,
        compact_every=args.full_snapshot_every, previous_running=job.prepaid, previous_release=job.release_states,
        previous_estimates=job.estimates, progress=bool(getattr(args, "progress", False)))
    graph = decoded.valid | "StreamingReleases" >> out
    # One release row per coordinate of each active query, and one state per active running query.
    expected = job.release_rows()
    staging = store.join(curator, STAGED_RELEASES)
    rows = graph["releases"] | "ByWindow" >> beam.Map(lambda row: (int(row["window_id"]), row)).with_output_types(
        Tuple[int, Any])
    staged = ((rows, graph["release_state"]) | "RowsAndStates" >> beam.Flatten().with_output_types(Tuple[int, Any])
              | "StageReleaseFiles" >> beam.ParDo(StageWindowFile(staging, expected,
                                                                 store.join(curator, RUNNING_STATE))))
    dead = (decoded.dead, graph["dead"]) | "DeadLetters" >> beam.Flatten()
    dead_files = dead | "WriteDead" >> beam.ParDo(WriteTable(store.join(curator, "dead")))
    ledger_files = graph["ledger"] | "WriteLedger" >> beam.ParDo(WriteTable(
        store.join(curator, "ledger"), functools.partial(_ledger_file, recorded=config.to_snapshot_metadata(),
                                                        queries=job.first_answered,
                                                        plan=recorded_plan(job.plan.entries), runs=job.runs)))
    # A shard's books record (its counts inside) and duplicates of a window are written together
    # (WriteWindowRecords).
    record_files = graph["books"] | "WriteWindowRecords" >> beam.ParDo(WriteWindowRecords(curator))
    # A window goes public only once it is committed: staged, and every shard's snapshot and records of
    # it written; windows are committed in order, under one key (CommitWindows).
    written = ledger_files | "SnapshotWritten" >> beam.Map(_snapshot_written).with_output_types(Tuple[int, Any])
    prepaid_files = (graph["prepaid"] | "WritePrepaid" >> beam.ParDo(WritePrepaid(curator))
                     .with_output_types(Tuple[int, Any]))
    release_files = ((staged, written, record_files, prepaid_files)
                     | "StagedSnapshotsAndRecords" >> beam.Flatten().with_output_types(Tuple[int, Any])
                     | "OneKey" >> beam.Map(lambda event: (0, event)).with_output_types(Tuple[int, Any])
                     | "CommitWindows" >> beam.ParDo(
                         CommitWindows(curator, job.releases, config.n_shards, first_window=job.own + 1,
                                       end_window=job.end, ledger_id=config.ledger_id,
                                       # the filter then reports every window's prepaid rows
                                       prepaid=job.with_prepaid, run=job.runs[0], previous_run=job.runs[1])))
    read_files = decoded.read | "WriteRead" >> beam.ParDo(WriteTable(store.join(curator, "read")))
    return {"releases": graph["releases"], "staged": staged, "release_files": release_files, "dead_files": dead_files,
            "ledger_files": ledger_files, "record_files": record_files, "read_files": read_files, "dead": dead,
            "queries": job.queries, "contract": job.contract, "config": config, "resumed": job.resumed}


def dry_run(argv: list[str], args: argparse.Namespace, beam_args: list[str], prog: str) -> int:
    """``--dry-run``: the job itself, on the DirectRunner, into a ``0700`` scratch folder holding a
    private copy of the release root and of ``--output``
    (:func:`renyi_stream.pipelines.streaming.dry_run._private_copy`: files ``0600``, folders ``0700``, as
    the job's own, so a restart previews the restart), with the root the ledger's snapshots record
    read as the copy (:data:`renyi_stream.pipelines.streaming.dry_run._PREVIEWED_ROOT`). Prints the windows
    and queries it would release and (curator only, without ``--quiet``) the rows by outcome; the
    real root, ``--output`` and ``--previous-ledger`` are never written. A replay only: a stream
    from Kafka or Pub/Sub has no end to preview. Its refusals are the real job's, worded with the
    real paths."""
    refusal = preview.runner_refusal(beam_args) or (
        "a dry run replays files (--replay): a stream from Kafka or Pub/Sub has no end to preview" if not args.replay
        else "a dry run replays files to their end; leave --streaming out" if "--streaming" in beam_args else None)
    if refusal:
        print(f"{prog}: refused: argument --dry-run: {refusal}", file=sys.stderr)
        return 2
    real_root, real_output = store.absolute(args.releases_parquet), store.absolute(args.output)
    with private_run_dir("renyi-preview-") as scratch:
        public, output = scratch / "public", scratch / "output"
        _private_copy(real_root, public)
        _private_copy(real_output, output)
        before = store.release_windows_present(str(public))
        inner = [a for a in argv if a != "--dry-run"] + ["--releases-parquet", str(public), "--output", str(output)]
        said = io.StringIO()
        token = preview_root._PREVIEWED_ROOT.set((real_root, str(public)))
        try:
            with contextlib.redirect_stderr(said):
                status = main(inner, prog=prog)
        finally:
            preview_root._PREVIEWED_ROOT.reset(token)
        text = said.getvalue().replace(str(public), real_root).replace(str(output), real_output)
        if status != 0 or not (output / BOOKS_FILE).exists():
            sys.stderr.write(text)
            return status or 1
        windows = sorted(store.release_windows_present(str(public)) - before)
        queries = preview.released_queries(public, windows)
        balance = json.loads((output / BOOKS_FILE).read_text())
    preview.print_summary(windows=len(windows), queries=queries, totals=balance, balanced=balance["balanced"],
                          quiet=args.quiet, untouched=(args.releases_parquet, args.output))
    return status


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m renyi_stream.pipelines.streaming") -> int:
    parser = _parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    args, beam_args = parse_args(argv, prog)
    if args.dry_run:
        return dry_run(argv, args, beam_args, prog)
    logging.getLogger().setLevel(logging.ERROR)
    flags = list(beam_args)
    if not any(a.startswith("--runner") for a in flags):
        flags += ["--runner=DirectRunner"]
    try:
        key_path = key_fingerprint(args)[0]
        if args.noise_key_secret:  # each worker fetches the key at start-up (renyi_stream.pipelines.beam.worker_key)
            flags += [f"--{worker_key.SECRET_OPTION}={args.noise_key_secret}",
                      f"--{worker_key.PATH_OPTION}={key_path}", f"--beam_plugins={worker_key.PLUGIN}"]
        options = PipelineOptions(flags)
        direct = "Direct" in str(options.view_as(StandardOptions).runner or "DirectRunner")
        # A local replay runs on the FnApiRunner in this process, chosen up front as the batch jobs'
        # (renyi_stream.pipelines.beam.local_runner: no graph walks to choose, no SDK state cache to weigh); a
        # local --streaming run keeps Beam's own choice (its streaming DirectRunner).
        runner = (batch_runner(options) if direct and not options.view_as(StandardOptions).streaming
                  and is_direct(options) else None)
        prepare_output(args)
        for attempt in range(3):  # the catalogue as planned, unless a curator changed it meanwhile
            p = beam.Pipeline(runner=runner, options=options)
            graph = build(p, args)
            try:
                for change in _record_queries(store.absolute(args.releases_parquet), graph["queries"],
                                              graph["contract"], graph["config"]):
                    print(f"[streaming] {change}", file=sys.stderr)
                break
            except CatalogueChanged:
                continue
        else:
            raise launch.RunRefused(f"the query catalogue under {store.absolute(args.releases_parquet)} kept "
                                    "changing while this job was launched; launch it again")
    except (launch.RunRefused, ValueError, lineage.LineageConflict) as exc:
        print(f"{parser.prog}: refused: {worded(str(exc), args, parser)}", file=sys.stderr)
        return 2
    if args.noise_key_secret and direct:  # no worker start-up on the DirectRunner: fetch here
        worker_key.materialise(args.noise_key_secret, key_path)
    record_state_file(args)
    try:
        result = p.run()
        if not direct:
            print(f"[streaming] submitted at {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
                  file=sys.stderr)
            return 0
        result.wait_until_finish()
    except Exception as exc:  # the runner wraps what a DoFn raised; a lost lineage claim is a refusal
        if lineage.LineageConflict.__name__ not in f"{type(exc).__name__}: {exc}":
            raise
        conflict = re.search(r"LineageConflict: (.*)", str(exc))
        print(f"{parser.prog}: refused: {conflict[1] if conflict else exc} (nothing of this job was published)",
              file=sys.stderr)
        return 2
    return record_books(args)


if __name__ == "__main__":
    sys.exit(main())
