"""The streaming job's command line, whatever runner runs it: the parser (:func:`_parser`), its
check of the source options (:func:`parse_args`), the noise key's fingerprint
(:func:`key_fingerprint`) and the defaults the options share. Imports no Beam: which options the
runner knows is the runner shell's check (:func:`parse_args`' ``runner_options``)."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any, Callable, Sequence

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.streaming.kafka import (CREATE_TIME, KAFKA_TIMESTAMP_POLICIES, _consumer_setting,
                                                   kafka_settings)

#: The user id type of a new ledger when ``--id-type`` does not declare one and no replayed message shows
#: one (an unbounded source cannot be read at launch). A continuing ledger keeps the type its snapshots record.
ID_TYPE = "int64"
ID_TYPES = ("int64", "string")
#: Windows between two full ledger snapshots of a shard (``--full-snapshot-every``); the windows
#: between get a delta, the rows of the users charged in them. 7: with daily windows a week, so a
#: restart rebuilds a shard from at most one full snapshot and six deltas (seven files), while a
#: week of snapshots writes one whole ledger plus six days' active users instead of seven whole
#: ledgers (with 5% of users active a day, 1.3 ledgers' rows instead of 7). 1 writes every window whole.
FULL_SNAPSHOT_EVERY = 7


def _positive_int(text: str) -> int:
    """An integer >= 1 (argparse type: the error names the value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _parser(prog: str = "python -m renyi_stream.pipelines.streaming") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="The individual filter on an unbounded stream: Pub/Sub messages or Kafka records (Arrow IPC "
                    "batches) in, Parquet releases per window out. Other options go to Beam (--runner, "
                    "--streaming, ...); one Beam does not know either is refused.")
    arg = parser.add_argument
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--subscription", help="Pub/Sub subscription (projects/P/subscriptions/S); Dataflow only")
    source.add_argument("--kafka-topic", "--kafka_topic", dest="kafka_topic",
                        help="Kafka topic of Arrow IPC records (with --bootstrap-servers); Flink, Dataflow")
    source.add_argument("--replay", nargs="+", help="files replayed in order, each one message: Arrow IPC stream "
                        "messages, or the day files renyi-stream run reads (.parquet, .csv, .arrow)")
    arg("--timestamp-attribute", "--timestamp_attribute", dest="timestamp_attribute", default="event_time",
        help="with --subscription: the message attribute holding its event time (default event_time)")
    kafka = parser.add_argument_group("Kafka (with --kafka-topic)")
    kafka.add_argument("--bootstrap-servers", "--bootstrap_servers", dest="bootstrap_servers",
                       help="the Kafka brokers, HOST:PORT[,HOST:PORT...]")
    kafka.add_argument("--kafka-consumer-config", "--kafka_consumer_config", dest="kafka_consumer_config",
                       action="append", type=_consumer_setting, metavar="KEY=VALUE",
                       help="a Kafka consumer setting, repeatable (group.id=..., auto.offset.reset=earliest, "
                            "security.protocol=SSL, ...); with group.id, offsets are committed to Kafka as "
                            "Beam finalizes the bundles that read them")
    kafka.add_argument("--kafka-timestamp-policy", "--kafka_timestamp_policy", dest="kafka_timestamp_policy",
                       choices=KAFKA_TIMESTAMP_POLICIES, default=CREATE_TIME,
                       help="the record timestamp element timestamps and the watermark follow: CreateTime "
                            "(default; the producer sets it to the batch's earliest event time) or LogAppendTime")
    kafka.add_argument("--kafka-expansion-service", "--kafka_expansion_service", dest="kafka_expansion_service",
                       metavar="HOST:PORT",
                       help="a running Java expansion service for ReadFromKafka (e.g. "
                            "beam-sdks-java-io-expansion-service-2.77.0.jar); default: Beam starts that jar "
                            "itself, which needs java and Maven Central here")
    arg("--columns", help="numeric indicator columns of the messages, comma-separated: parsed as numbers (a value "
        "that does not parse is a dead letter); on a release root whose query catalogue has no query, each gets its "
        "per-window sum (sum:<column>). The queries answered are those of the catalogue "
        "(renyi-stream query add --releases-parquet ROOT)")
    launch.add_promise_options(parser)
    arg("--output", required=True, help="curator-only root: ledger snapshots per window, dead letters, books; the "
        "job's state folder: run the same command again after a crash and it resumes from the last window it "
        "committed there")
    arg("--full-snapshot-every", "--full_snapshot_every", dest="full_snapshot_every", type=_positive_int,
        default=FULL_SNAPSHOT_EVERY, metavar="K",
        help=f"a full ledger snapshot every K windows, deltas (the users charged) between (default "
             f"{FULL_SNAPSHOT_EVERY}; 1: every window whole)")
    arg("--dry-run", action="store_true", help="with --replay, on the DirectRunner: run into a private scratch copy "
        "of the release root and of --output, and print what the job would do (windows, queries, rows by outcome), "
        "charging and publishing nothing; every refusal is the real job's")
    arg("--quiet", action="store_true", help="print no exact counts (they stay in the curator's --output); without "
        "it, a run's end prints the rows by outcome and the messages dead-lettered by reason, its --dry-run the "
        "rows by outcome, for the curator only")
    arg("--progress", action="store_true",
        help="print a line on stderr as each shard charges a window (the shard, the window and a monotonic clock: "
             "public, never a count); every committed window gets a line whether or not")
    arg("--previous-ledger", "--previous_ledger", dest="previous_ledger", default="none",
        help="the ledger to continue from: a glob of every shard's snapshot of the last window released under "
             "--releases-parquet, as an earlier job wrote them (<its --output>/ledger/window_id=<W>/*/*.parquet; "
             "checked, and so are the promise, accounting, key, window length and release root they record: "
             "they must be this run's); 'none' for a new ledger, only where nothing is released yet")
    return parser


def key_fingerprint(args: argparse.Namespace) -> tuple[str, str, Any]:
    """``(worker key path, fingerprint, the key when readable here)`` of the job's noise key, as
    :func:`renyi_stream.pipelines.beam.job_options.key_fingerprint` gives them; RunRefused, naming
    the command that creates one, when ``--noise-key`` names no file and no ``--key-fingerprint``
    says the workers load a key this machine cannot see: a new curator's first replay has no key
    yet, and ``renyi-stream key create PATH`` makes it (0600 in a 0700 folder, its fingerprint
    printed)."""
    if (args.noise_key and not args.noise_key_secret and not args.key_fingerprint
            and not os.path.lexists(args.noise_key)):
        raise launch.RunRefused(
            f"the noise key {args.noise_key} does not exist: create it with 'renyi-stream key create "
            f"{shlex.quote(str(args.noise_key))}' (0600, in a 0700 folder; it prints the key's fingerprint) and back "
            "it up with the curator's files, or restore the curator's key; where the workers load a key this "
            "machine cannot read (a mounted secret), give --key-fingerprint instead")
    return launch.key_fingerprint(args)


_KAFKA_ONLY = ("bootstrap_servers", "kafka_consumer_config", "kafka_expansion_service")


def _check_source(args: argparse.Namespace) -> None:
    """ValueError naming the options when the source's options do not fit together: Kafka
    options without ``--kafka-topic``, or a Kafka configuration
    :func:`renyi_stream.pipelines.streaming.kafka.kafka_settings` refuses."""
    if getattr(args, "kafka_topic", None):
        kafka_settings(args)
        return
    given = [f"--{name.replace('_', '-')}" for name in _KAFKA_ONLY if getattr(args, name, None)]
    if given:
        raise ValueError(f"{', '.join(given)} only go with --kafka-topic, which was not given")


def parse_args(argv: Sequence[str], prog: str = "python -m renyi_stream.pipelines.streaming", *,
               runner_options: Callable[..., None] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """``(job arguments, the runner's arguments)`` of ``argv``. Exits with status 2 and a message
    naming the options (argparse's ``error``) when the source options do not fit together: two
    sources (``--kafka-topic`` with ``--subscription`` or ``--replay``), ``--kafka-topic`` without
    ``--bootstrap-servers``, a malformed Kafka option, a Kafka option without ``--kafka-topic``, or,
    given the runner's check ``runner_options(runner arguments, this job's long options,
    command=...)``, an option neither this job's nor the runner's (the Beam shell's:
    :func:`renyi_stream.pipelines.beam.job_options.refuse_unknown_options`: a typo would run the job
    without it)."""
    parser = _parser(prog)
    args, beam_args = parser.parse_known_args(list(argv))
    try:
        if runner_options is not None:
            runner_options(beam_args, launch.long_options(parser), command=parser.prog)
        _check_source(args)
    except (ValueError, launch.RunRefused) as exc:
        parser.error(str(exc))
    return args, list(beam_args)
