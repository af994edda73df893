"""The streaming job: indicator batches from an unbounded source, released window by window.

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

Sources (exactly one):

* ``--subscription``: a Pub/Sub subscription (Dataflow only: the Python SDK's Pub/Sub source
  runs nowhere else). A message's name is its Pub/Sub message id.
* ``--kafka-topic`` with ``--bootstrap-servers``: a Kafka topic, read by Beam's cross-language
  ``ReadFromKafka`` (Java KafkaIO; its expansion needs a Java expansion service, see
  :func:`kafka_source`): the source for Flink. Each record is read with its metadata
  (byte-array key and value); its name is ``topic/partition/offset``, which names the same
  record on every read, retry and replay.
* ``--replay FILE...``: files, each one message, for a local run or a replay; a file's name is
  its path (a path given again is a second delivery, named apart: :func:`replay_names`). Each file's
  structure is checked at launch as the daily job checks its inputs (:func:`refuse_unreplayable`):
  a file a live source's message would only dead-letter whole is refused, naming it.

Which of two rows of one user and window counts (the other is dead-lettered
``duplicate_user_window``): the first in event-time order, (window, the message's number, row in
it), invariant 2 (charge-in-event-time-order, docs/architecture.md). A replayed file's number is
its place in ``--replay``, as the batch jobs number their inputs, so a replay keeps the row the
batch jobs keep; a Pub/Sub or Kafka message's is a hash of its name (:func:`_source_number`), a
stable identity: the row kept depends on the two messages only, never on the order they arrive
in, and is the same on every retry and replay. Every dead letter names its message by its name.

A message's payload (a Kafka record's value) is one **Arrow IPC stream** of indicator rows
(``user_id``, ``day`` or ``event_time``, the ``--columns``), as ``pyarrow.ipc.new_stream``
writes it (:func:`encode_message`). Its element timestamp must not be later than any of its rows'
event times, so that the watermark means "this window's rows are in"; a row that arrives after
its shard charged its window is dead-lettered ``late_window`` and charges nobody, never released
twice. Where the timestamp comes from:

* Pub/Sub: the ``--timestamp-attribute`` the producer sets, in milliseconds since the epoch or
  RFC 3339 (the batch's earliest event time).
* Kafka: the record's timestamp (milliseconds since the epoch), which is also what the watermark
  follows (``--kafka-timestamp-policy``). With ``CreateTime`` (the default) the **producer sets
  the record's CreateTime to the batch's earliest event time** (``ProducerRecord(topic, None,
  timestamp_ms, key, value)``; ``timestamp_ms`` in kafka-python/confluent-kafka), sends a batch
  with the rows of one window only, and, within a partition, sends a window's batches before any
  batch of a later window: each partition's watermark then stays behind every batch not yet read,
  and a batch is late only when it is produced after its window closed. With ``LogAppendTime``
  the broker's append time is used: it is never earlier than the rows' event times, so a batch
  appended after its window's end is late even when it was produced in time; use it only where
  producers cannot set CreateTime.
* A replay: its earliest row's window start.

The graph: decode and validate each message (:class:`DecodeAndValidate`; an undecodable message
is one dead letter, rows that fail validation are dead letters with reasons) ->
:class:`renyi_stream.pipelines.streaming.releases.StreamingReleases` (the individual filter per user shard in keyed
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

The queries answered are those of the catalogue beside the public release root
(``<--releases-parquet>/_queries/``, :mod:`renyi_stream.queries.catalogue`), read at launch under the rules of
the daily job's registry (:mod:`renyi_stream.queries.registration`): every window query active in the
schedule, charged together per user through the same
:class:`~renyi_stream.stream.engine.shard_state.QueryPlan` as the batch jobs. On a root whose catalogue has
no query, ``main`` registers the per-window sums of ``--columns`` from ``--start``; a query
registered into windows already released but never answered (it was registered while an
earlier job ran) starts at this job's first window. Running totals (docs/running_totals.md) go
through the batch jobs' engine objects: each shard's per-user prepaid rows
(:class:`renyi_stream.stream.engine.running.PrepaidUsers`) live in its keyed state beside its ledger and are
written every window as its ledger snapshot is, whole or a delta of the users charged in the
window, ``<output>/prepaid/window_id=<W>/shard=<S>/`` (:class:`WritePrepaid`, read back by
:func:`previous_running_state`);
each running query's release state (:class:`renyi_stream.stream.engine.running.RunningRelease`) lives in the
keyed state of :class:`renyi_stream.pipelines.streaming.releases.ReleaseRunningInOrder`, advanced in window
order, and is staged with the window's releases, ``<output>/running/window_id=<W>/``
(:class:`StageWindowFile`, with the state of the estimates' decoder: ``1 + buffers`` rows for BLT); a window's commit marker
waits for both. A restarted or continuing job restores them from the window it continues from
(:func:`previous_running_state`), refusing a stored state of another strategy, horizon or first
window, and a schedule that would skip one of a running query's windows, by name. ``--columns`` names the
numeric indicator columns (parsed as numbers, a value that does not parse a dead letter);
string columns are passed through for the histograms over string categories that read them.
User ids are ``int64`` or ``string``, the ledger's for life (``--id-type``; else a continuing
ledger's own, else the first replayed message's ``user_id`` type, else ``int64``).

**Crash recovery: run the same command again.** The ``--output`` is the job's state folder
(:data:`STATE_FILE` records the command line that owns it). Each window is committed by one
marker, ``<output>/commits/window_id=<W>.json``, written whole or not at all in window order,
after every shard's ledger snapshot and records (books, duplicates) of the window and its
staged release file, and before its publication (:class:`CommitWindows`). A job launched again
with the same command line (:func:`restarting`) first brings the folder to its last marker
(:func:`recover`): it publishes every committed window not yet public (first write wins), removes
what a crash left of later windows (snapshots, staged releases, records: a dead branch, never
restored, never published), then continues from the last committed window's snapshots: its shards
start after that window, rows of the windows it committed are re-deliveries (neither charged nor
counted again: their outcome is in those windows' committed records, and a message's own records
are named by their content, so a message the restart reads again is counted once), and the later windows are
charged again from that ledger, with the same ledger id and keyed noise. The source must deliver
again every message of those later windows: a replay does; for Kafka, a new consumer group reading
from the earliest retained record; for Pub/Sub, a seek of the subscription to before the
committed window's end. Another command line given a job's ``--output`` is refused (one folder,
one job), and so is a folder of snapshots from before commit markers (no :data:`STATE_FILE`).

Snapshots are incremental: a shard's snapshot of a window is whole every ``--full-snapshot-every``
windows (:data:`FULL_SNAPSHOT_EVERY`) and at the job's first and last window, and otherwise a
delta, the ledger rows of the users charged in that window
(:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`), marked so in its metadata
(``renyi_stream.snapshot``, and ``renyi_stream.base_window``: the window of the full snapshot it
goes over). A job continuing from a delta window rebuilds each shard from that full snapshot and
the deltas after it (:func:`_whole_snapshot`); :func:`whole_ledger` does it for an audit.

The schedule is finite (``--start..--end``); to go on, start a new job after ``--end`` with
``--previous-ledger`` pointing at the last released window's snapshots, every shard's:
``<earlier --output>/ledger/window_id=<W>/*/*.parquet``. Each snapshot records its window, its
shard and the job's ``--shards`` in its Parquet schema metadata. Before anything is built,
:func:`_previous_ledger` refuses (:class:`renyi_stream.pipelines.distributed.job.RunRefused`, naming
``--previous-ledger``, the glob and what is wrong) a glob that matches a file not written as
``.../window_id=<W>/shard=<S>/...``, snapshots of more than one window (or of one window under
two roots), two files of one shard, a window other than the last one released under
``--releases-parquet`` (an older snapshot would restart users from an older, smaller budget: the
message names both windows and the glob to give instead), or not exactly shards ``0..N-1`` of
the job that wrote it (``N`` as its snapshots record it; for snapshots without that record, one
more than the highest ``shard=`` folder of that window, and every such folder must be matched).
It also refuses ``none`` when windows are released (users would restart from zero), and a
snapshot when no window is released under ``--releases-parquet`` (nothing to check it is the
latest against: give the root the earlier job released to). This run's ``--shards`` may differ
from the earlier job's: the snapshot is read whole and split again by ``hash(user) % --shards``.

A ledger keeps for life the configuration it was started with, as every job's does
(:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`): each snapshot records it in its schema
metadata (``renyi_stream.<field>``, :meth:`LedgerConfig.to_snapshot_metadata`): the promise
``epsilon``, ``delta``, ``norm_budget``, ``accounting``; its calibration ``rho``, ``noise_std``,
``tracker_step``; ``id_type``, ``key_fingerprint``, ``window_seconds``, ``origin_seconds``,
``releases`` (the ``--releases-parquet`` root), the ledger's id and the job's ``--shards``, floats
as their ``repr``. Before anything is built, :func:`_continued` reads them back and checks this
run against them (:meth:`LedgerConfig.continued_from`; release roots normalised as
:func:`renyi_stream.pipelines.beam.object_store.absolute` does, so ``gs://b/r/`` is ``gs://b/r``), refusing
and naming every differing parameter with the ledger's value and this run's: another
``--epsilon``, ``--delta``, ``--norm-budget``, ``--accounting``, noise key or ``--window`` would
change every user's promise mid-stream, their used budgets having been charged under the old
one, and a snapshot of a job releasing under another root (a staging job's, of the right window
id) charged its users for other releases. The budget and the noise std and tracker step it gives
are kept as recorded. Snapshots that do not record the parameters (written before the job
recorded them) are refused too: they cannot be checked. :func:`record_snapshot_parameters`
copies them to a new ledger root recording the earlier job's arguments, after checking what the
snapshots can confirm (the ledger's budget, tracker step and id type); give it the earlier job's
own arguments.

The ledger's identity, ``renyi_stream.ledger_id`` (:data:`SNAPSHOT_LEDGER_ID`): a new job draws
one, a continuing job keeps the snapshots' (refused when its shards record different ones), and
the release noise is bound to it (:class:`renyi_stream.stream.noise.NoiseBinding`), so another ledger given
the same key draws independent noise. Snapshots written before ledger ids existed record none:
the job continuing them draws a new one (their released windows keep their values).

The ledger lives in the runner's keyed state between (checkpointed by Flink together with the
Kafka offsets, committed with each bundle by Dataflow's streaming engine); ``deploy/README.md``
has the recovery story. A job lost for good is run again with its command line (above). A job
given an earlier job's snapshots of a window as ``--previous-ledger`` publishes that job's staged
windows after the last public one through that window first (:func:`publish_staged`).

**Lineage: a ledger cannot fork** (:mod:`renyi_stream.queries.release_lineage`, as the distributed job's). Each
job is a run (:func:`job_lineage`): a random run id recorded in :data:`STATE_FILE` with its parent's
(:data:`renyi_stream.queries.release_lineage.ORIGIN` for a new ledger, else the run that wrote the
``--previous-ledger`` snapshots), kept by the job's restarts, and written into every snapshot
(:data:`SNAPSHOT_RUN`, :data:`SNAPSHOT_PREVIOUS_RUN`). Before its first public window the job claims
the one successor of its parent (:func:`claim_lineage`, in :class:`CommitWindows` and
:func:`recover`), and each window's lineage record names it before its file; so of two jobs
continued from one snapshot only the first to publish does, and the other fails with nothing of it
public. At launch :func:`check_lineage` refuses, naming the runs, a ``--previous-ledger`` outside
the public chain.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import datetime as dt
import functools
import hashlib
import io
import json
import logging
import os
import re
import secrets
import shlex
import sys
import time
from dataclasses import fields, replace
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

_root, _level = logging.getLogger(), logging.getLogger().level
_root.setLevel(logging.ERROR)  # Beam's GCP extras warn at import when their optional clients are absent
try:
    import apache_beam as beam
    import grpc
    from apache_beam.coders import PickleCoder
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.io.kafka import ReadFromKafka
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.timestamp import Timestamp

    from renyi_stream.pipelines.beam import job_options as launch
    from renyi_stream.pipelines.beam import object_store as store
    from renyi_stream.pipelines.beam import transforms as tx
    from renyi_stream.pipelines.beam import worker_key
    from renyi_stream.pipelines.beam.local_runner import batch_runner, is_direct
    from renyi_stream.pipelines.beam.publication import PublicReleaseFiles, StagedReleases
    from renyi_stream.pipelines.streaming.releases import (PREPAID_ROWS, PREPAID_USERS, RUNNING_QUERY_ID, SNAPSHOT_BASE,
                                                           SNAPSHOT_KIND, EstimateContinuation, StreamingReleases,
                                                           running_state_of)
finally:
    _root.setLevel(_level)
from renyi_stream.pipelines.beam import preview
from renyi_stream.pipelines.cli.errors import worded
from renyi_stream.pipelines.streaming import message_sizes
from renyi_stream.stream.engine.dead_letters import DeadLetterReason, dead_letters, rejected_letters, with_input_position
from renyi_stream.stream.engine.publication import publish_outbox
from renyi_stream.stream.engine.readers import (FORMATS, InputFileError, MalformedLines, check_declared_schema,
                                                 read_batches)
from renyi_stream.stream.engine.row_balance import RowBalance, reason_counts
from renyi_stream.stream.engine.running import RunningRelease
from renyi_stream.stream.engine.shard_state import WINDOW_COUNT_NAMES, PlannedQuery, QueryPlan, merge_deltas, running_base
from renyi_stream.stream.faults import crash_point
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.queries.catalogue import CatalogueChanged, LaunchQueries, ReleaseCatalogue, queries_at_launch
from renyi_stream.queries.linear import default_queries
from renyi_stream.queries.registration import (category_reads, contract_defaults, declared_header, numeric_reads, plan_columns,
                                  recorded_plan)
from renyi_stream.stream.contract import InputContract, declaration_hint
from renyi_stream.queries.release_files import filesystem, release_file_path, release_file_table
from renyi_stream.stream.engine.ledger_config import SNAPSHOT_PREFIX, LedgerConfig, LedgerConfigError, snapshot_key
from renyi_stream.stream.ledger import STATUS_NAMES, Ledger, Policy
from renyi_stream.stream.noise import new_ledger_id
from renyi_stream.stream.private_files import (CURATOR_ONLY_NOTICE, PrivateFileError, make_private_dirs, private_dir,
                                                 private_run_dir)
from renyi_stream.stream.schema import DEFAULT_KEYS, USER_ID, WINDOW_ID, InputKeys, SchemaError, WindowSpec, validate_batch

#: The curator's record of a finished local run's row balance (:func:`books`), under ``--output``.
BOOKS_FILE = "_BOOKS.json"
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


#: The most bytes one message's rows may take decoded (:func:`decode_message`); a message past it
#: is one ``undecodable_message`` dead letter. A message is a few MB on the wire (Pub/Sub takes at
#: most 10 MB, Kafka 1 MB by default), but a compressed one can declare gigabytes (a compression
#: bomb: zeros compress a thousandfold), which would stop the worker that decodes it, again on
#: every retry. 256 MiB is 25 times the largest Pub/Sub message, so an honest message decodes even
#: compressed 25 to 1, and a few of them decoding at once fit a worker's memory.
MAX_MESSAGE_DECODED_BYTES = 256 * 2**20


def decode_message(payload: bytes) -> pa.Table:
    """The rows of one message: an Arrow IPC stream, ended by its end-of-stream marker. ValueError
    when it is not one, or when the marker is missing: a stream cut exactly between two record
    batches reads without error as its first batches, and its other rows would be lost uncounted
    (the batch jobs refuse such a file the same way, :mod:`renyi_stream.stream.engine.readers`). ValueError
    too when its rows take more than :data:`MAX_MESSAGE_DECODED_BYTES` decoded: refused on what
    its metadata declares before anything is decompressed, then batch by batch as decoded
    (:mod:`renyi_stream.pipelines.streaming.message_sizes`)."""
    try:
        ended, declared = _frame(payload)
        _refuse_past_the_cap(declared)
        reader = ipc.open_stream(pa.BufferReader(payload))
        _refuse_views(reader.schema)
        batches, decoded = [], 0
        for batch in reader:
            decoded += message_sizes.decoded_bytes(batch)
            _refuse_past_the_cap(decoded)
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=reader.schema)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise ValueError(f"not an Arrow IPC stream: {str(exc).splitlines()[0][:200]}") from None
    if not ended:
        raise ValueError("not a whole Arrow IPC stream: no end-of-stream marker after its last message (cut short, "
                         "possibly exactly between two record batches)")
    return table


def _refuse_views(schema: pa.Schema) -> None:
    """ValueError for a column of a view type (``string_view``, ``binary_view``, list views),
    at any depth: every view may point at one shared slice of a buffer, so a message of a few
    kilobytes decoded expands to gigabytes when its rows are validated (each row copies its
    slice out), past what its buffers declare. No producer needs them: ``encode_message`` writes
    plain strings."""
    def views(t: pa.DataType) -> bool:
        if (pa.types.is_string_view(t) or pa.types.is_binary_view(t) or pa.types.is_list_view(t)
                or pa.types.is_large_list_view(t)):
            return True
        if pa.types.is_dictionary(t):
            return views(t.value_type)
        return any(views(t.field(i).type) for i in range(t.num_fields))

    for field in schema:
        if views(field.type):
            raise ValueError(f"column {field.name!r} is of the view type {field.type}, which messages may not hold "
                             "(write it as string, binary or list)")


def _refuse_past_the_cap(size: int) -> None:
    if size > MAX_MESSAGE_DECODED_BYTES:
        raise ValueError(f"its rows take more than {MAX_MESSAGE_DECODED_BYTES:,} bytes decoded (at least {size:,}), "
                         "the most one message may take (MAX_MESSAGE_DECODED_BYTES of renyi_stream.pipelines.streaming.job)")


_END_OF_STREAM = (b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")  # the marker; before Arrow 0.15


def _frame(payload: bytes) -> tuple[bool, int]:
    """Read ``payload``'s messages by their framing, decompressing nothing: whether the bytes
    after its last message (found by the framing, never by looking at the last bytes, which a
    batch's own data may spell) are exactly the end-of-stream marker, and the bytes its
    messages declare decoded (:func:`renyi_stream.pipelines.streaming.message_sizes.declared_bytes`)."""
    reader = pa.BufferReader(payload)
    end, declared = 0, 0
    while True:
        try:
            message = ipc.read_message(reader)
        except EOFError:
            break
        declared += message_sizes.declared_bytes(message)
        end = reader.tell()
    return payload[end:] in _END_OF_STREAM, declared


def encode_message(table: pa.Table) -> bytes:
    """``table`` as a message payload (what a producer publishes)."""
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _message_parts(element: Any) -> tuple[str, bytes]:
    """``(name, payload)`` of a Pub/Sub message (its id), a ``(name, bytes)`` pair (a replayed file, or
    a Kafka record named ``topic/partition/offset`` by :class:`KafkaRecordToMessage`) or bare bytes."""
    if isinstance(element, tuple):
        return str(element[0]), bytes(element[1])
    if isinstance(element, (bytes, bytearray)):
        return "sha256:" + hashlib.sha256(element).hexdigest()[:16], bytes(element)
    name = getattr(element, "message_id", None) or "sha256:" + hashlib.sha256(element.data).hexdigest()[:16]
    return str(name), bytes(element.data)


def _replayed_file(item: tuple[str, str] | str, keys: InputKeys = DEFAULT_KEYS) -> tuple[str, bytes]:
    """A ``--replay`` file as a message: ``(its message name, its bytes)``. ``item`` is ``(name,
    path)`` (:func:`replay_names`: the path, or for a path given again the path and its place in
    ``--replay``), or a bare path, its own name.

    A message file (an Arrow IPC stream, as :func:`encode_message` writes, by any other name) is
    replayed as it is. A file the daily job reads, named as such (``.parquet``, ``.csv``, an Arrow
    IPC *file* ``.arrow``/``.feather``/``.ipc``), is read by the batch jobs' reader
    (:func:`renyi_stream.stream.engine.readers.read_batches`, the same row-by-row rules) and replayed as one
    message of its rows, so the same day files feed every job. A file that is neither, or that does
    not hold the contract's columns, and a CSV line the reader cannot read, are refused at launch
    (:func:`refuse_unreplayable`), never dropped or dead-lettered here. ``keys``: the id and time
    columns' names the ledger's contract declares (the message keeps the file's own names; the
    validator reads them by these)."""
    name, path = (item, item) if isinstance(item, str) else (str(item[0]), str(item[1]))
    with FileSystems.open(path) as handle:
        payload = handle.read()
    if not _is_day_file(path, payload):
        return name, payload
    return name, encode_message(pa.Table.from_batches(list(read_batches(path, malformed=MalformedLines(),
                                                                        keys=keys))))


def _is_day_file(path: str, head: bytes) -> bool:
    """Whether ``path`` is a file of the batch jobs' formats rather than a message: named as one,
    and, for an Arrow IPC name, in the IPC *file* format (which opens with ``ARROW1``)."""
    kind = FORMATS.get(PurePosixPath(str(path)).suffix.lower())
    return kind in ("parquet", "csv") or (kind == "ipc" and head[:6] == b"ARROW1")


def refuse_unreplayable(paths: Sequence[str], *, window: WindowSpec = WindowSpec(),
                        indicator_columns: Sequence[str] | None = None, category_columns: Sequence[str] = (),
                        id_type: str | None = None, contract: InputContract | None = None) -> None:
    """RunRefused, before anything is charged or published, naming the file (and the column), for a
    ``--replay`` file the daily job would refuse or the job could only dead-letter whole: a replay
    is files the operator names, so the structure of each is checked at launch, as the daily job
    checks its inputs, and a wrong file never becomes one ``undecodable_message`` dead letter with
    its day published from nothing (issue 37). Refused:

    * a day file (:func:`_is_day_file`) the batch jobs' reader refuses (not its format, no
      ``user_id``, ...), or a CSV with a line it cannot read: a message is dead-lettered whole, so
      such a line would take the file's other rows with it; the daily job (``renyi-stream run``)
      dead-letters it alone;
    * any other file that is not one whole Arrow IPC stream message (:func:`decode_message`: not
      Arrow, cut short, a view type, past :data:`MAX_MESSAGE_DECODED_BYTES`);
    * a file whose header lacks a column of the declared ``contract``, repeats a column name or
      writes a declared column in a type no value of could parse: the daily job's check,
      :func:`renyi_stream.stream.engine.readers.check_declared_schema`;
    * a file whose columns the validator refuses as a whole (no time column, an id column of no id
      type, an indicator or category column it lacks: :func:`renyi_stream.stream.schema.validate_batch`
      on the file's header with no row, with the arguments :class:`DecodeAndValidate` gives it).

    Every decision is the files' names, formats and headers', never a row's. A live source
    (Kafka, Pub/Sub) cannot be checked before it runs: there such a message stays one dead letter.
    The id and time columns are those ``contract`` names (``--id-column``, ``--day-column``,
    ``--event-time-column``; without a contract, ``user_id`` and ``day``/``event_time``)."""
    keys = contract.keys if contract is not None else DEFAULT_KEYS
    for path in paths:
        with FileSystems.open(path) as handle:
            head = handle.read(6)
        if _is_day_file(path, head):
            malformed, schema = MalformedLines(), None
            try:
                for batch in read_batches(path, malformed=malformed, keys=keys):
                    schema = batch.schema if schema is None else schema
            except InputFileError as exc:
                raise launch.RunRefused(f"--replay: {exc}") from None
            if len(malformed):
                line, _, why = next(iter(malformed))
                raise launch.RunRefused(
                    f"--replay: {path} has {len(malformed):,} line(s) the reader cannot read (line {line}: {why}); a "
                    "replayed file is one message, dead-lettered whole: fix the file, or run it with renyi-stream "
                    "run, which dead-letters each such line alone")
            where = f"input file {path}"
        else:
            with FileSystems.open(path) as handle:
                payload = handle.read()
            try:
                schema = decode_message(payload).schema
            except ValueError as exc:
                raise launch.RunRefused(
                    f"--replay: {path} is not a file the daily job reads (.parquet, .csv, an Arrow IPC file .arrow), "
                    f"and as a message (an Arrow IPC stream) it cannot be read: {exc}") from None
            where = f"replayed message {path}"
        if schema is None:
            continue
        try:
            if contract is not None:
                check_declared_schema(schema, contract, where=where)
            validate_batch(schema.empty_table(), window=window, indicator_columns=indicator_columns,
                           category_columns=category_columns, id_type=id_type, keys=keys)
        except InputFileError as exc:
            raise launch.RunRefused(f"--replay: {exc}") from None
        except SchemaError as exc:
            raise launch.RunRefused(f"--replay: {where}: {exc}") from None


def _source_number(name: str) -> int:
    """A message's number from its name (a Pub/Sub message id, a Kafka ``topic/partition/offset``):
    the first 63 bits of its SHA-256. Rows of one (user, window) from two messages are taken in
    the order (window, this number, row), so which one counts depends on the two messages only,
    never on the order they arrive in, and is the same on every retry, restore and replay of them
    (invariant 2 (charge-in-event-time-order, docs/architecture.md)). A replay numbers its files by
    their order in ``--replay`` instead, as the batch jobs number their inputs (:func:`replay_numbers`)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") >> 1


def replay_names(paths: Sequence[str]) -> list[str]:
    """The message name of each ``--replay`` file, in order: its path, and for a path given again
    (a message delivered twice) the path and its place, ``"<path> (again, --replay file <k>)"``
    (``k`` from 1). Each delivery is then a message of its own, with its own read record and dead
    letters (the curator's files are named by their content: two deliveries of one name would be
    counted once while both reach the filter, issue 37), and the same on every restart."""
    names: list[str] = []
    seen = {str(path) for path in paths}
    for index, path in enumerate(paths):
        name = str(path)
        if name in names:
            name = f"{path} (again, --replay file {index + 1})"
            while name in seen or name in names:  # a file really named so: longer, never the same
                name += "'"
        names.append(name)
    return names


def replay_numbers(paths: Sequence[str]) -> dict[str, int]:
    """``message name -> its index in --replay`` (:func:`replay_names`): the number of each
    replayed file's rows, so that of two rows of one (user, window) the one replayed first counts,
    as the batch jobs keep their first input's; a path given again is a delivery of its own, whose
    rows come after the first delivery's (and are dead-lettered ``duplicate_user_window``, as the
    daily job does for a file given twice)."""
    return {name: index for index, name in enumerate(replay_names(paths))}


# --- Kafka: everything but the cross-language read is plain Python -------------------------------

#: ``--kafka-timestamp-policy`` choices: the record timestamp the element timestamp and the
#: watermark follow. ``ProcessingTime`` (the reader's clock) is not offered: it is later than
#: every row's event time, so the watermark would not mean "this window's rows are in".
KAFKA_TIMESTAMP_POLICIES = (ReadFromKafka.create_time_policy, ReadFromKafka.log_append_time)
#: Consumer settings the job fixes itself: the brokers come from ``--bootstrap-servers``, records
#: are read as bytes, and offsets are committed only once Beam finalizes the bundle that read them.
_FIXED_CONSUMER_KEYS = ("bootstrap.servers", "key.deserializer", "value.deserializer", "enable.auto.commit")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def kafka_record_name(record: Any) -> str:
    """``topic/partition/offset`` of a Kafka record read with metadata: the same for every read of
    the record (a retried bundle, a replay after a restore), as a Pub/Sub message id is, so its
    rows keep their input position (:func:`_source_number`) and its dead letters their source."""
    return f"{record.topic}/{int(record.partition)}/{int(record.offset)}"


class KafkaRecordToMessage(beam.DoFn):
    """A Kafka record read with metadata -> ``(name, payload)``, what :class:`DecodeAndValidate`
    takes, timestamped at the record's timestamp.

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


def _host_port(option: str, text: str) -> str:
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{option} must be HOST:PORT with a port in [1, 65535], got {text!r}")
    return f"{host}:{int(port)}"


def _positive_int(text: str) -> int:
    """An integer >= 1 (argparse type: the error names the value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _consumer_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--kafka-consumer-config`` (argparse type: the error names the value)."""
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE (a Kafka consumer setting), got {text!r}")
    return key.strip(), value


def kafka_read_config(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :class:`apache_beam.io.kafka.ReadFromKafka` for ``args``: the one
    ``--kafka-topic``; ``consumer_config`` = ``bootstrap.servers`` from ``--bootstrap-servers`` plus
    every ``--kafka-consumer-config``; byte-array key and value deserializers; ``with_metadata``
    (the record's topic, partition, offset and timestamp reach :class:`KafkaRecordToMessage`);
    ``timestamp_policy`` from ``--kafka-timestamp-policy``; ``commit_offset_in_finalize`` exactly
    when a ``group.id`` is configured (KafkaIO refuses it without one); ``expansion_service`` from
    ``--kafka-expansion-service`` (None: Beam starts its Java IO expansion service jar itself).

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
    policy = getattr(args, "kafka_timestamp_policy", None) or ReadFromKafka.create_time_policy
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
    return {
        "consumer_config": config,
        "topics": [topic],
        "key_deserializer": ReadFromKafka.byte_array_deserializer,
        "value_deserializer": ReadFromKafka.byte_array_deserializer,
        "with_metadata": True,
        "timestamp_policy": policy,
        "commit_offset_in_finalize": "group.id" in config,
        "expansion_service": _host_port("--kafka-expansion-service", service) if service else None,
    }


def kafka_source(args: argparse.Namespace) -> ReadFromKafka:
    """The job's Kafka read: ``ReadFromKafka(**kafka_read_config(args))``. Constructing it
    contacts nothing; applying it to a pipeline asks the expansion service to expand it (Java
    KafkaIO), which is the one step of the Kafka path that needs Java. ValueError as
    :func:`kafka_read_config`."""
    return ReadFromKafka(**kafka_read_config(args))


class DecodeAndValidate(beam.DoFn):
    """message -> validated rows (main: an Arrow table with the ``_source``/``_row`` input position)
    and dead letters (tag ``dead``), so that every row of every message is one or the other.

    With ``stamp`` the output is timestamped at its earliest window's start (replayed files
    carry no event time of their own); otherwise it keeps the source's timestamp. A message's rows
    are numbered (:data:`renyi_stream.stream.engine.dead_letters.SOURCE`) by ``numbers`` (a replayed file: its
    index in ``--replay``, :func:`replay_numbers`), else by :func:`_source_number` of its name, and
    carry its name for their dead letters. ``keys``: the id and time columns' names the ledger's
    contract declares (:class:`renyi_stream.stream.schema.InputKeys`), read by the validator as the
    batch jobs read a file's: a message names its columns as the files do."""

    def __init__(self, *, window: WindowSpec, indicator_columns: Sequence[str], stamp: bool = False,
                 id_type: str = ID_TYPE, category_columns: Sequence[str] = (),
                 numbers: dict[str, int] | None = None, keys: InputKeys = DEFAULT_KEYS) -> None:
        self._numbers = dict(numbers or {})
        self._keys = keys
        self._window = window
        self._id_type = id_type  # the ledger's: a message's ids are parsed as it, row by row
        self._columns = list(indicator_columns)
        self._categories = list(category_columns)  # string columns histograms read (passed through as text)
        self._stamp = stamp

    def process(self, element: Any) -> Iterator[Any]:
        name, payload = _message_parts(element)
        try:
            table = decode_message(payload)
            # No window bounds: the filter classifies windows (late, out of schedule) as each row
            # arrives, by the same rule as the batch jobs' reader.
            checked = validate_batch(table, window=self._window, indicator_columns=self._columns,
                                     category_columns=self._categories,
                                     id_type=self._id_type, keys=self._keys)
        except (ValueError, SchemaError, MemoryError) as exc:
            # One dead letter stands for the whole message, so the message counts as one row read;
            # MemoryError (a message that fits the cap yet expands past the worker's memory when
            # validated) too, or the bundle would fail on every retry and stall the stream.
            yield beam.pvalue.TaggedOutput("read", _read_row(name, 1))
            yield beam.pvalue.TaggedOutput("dead", dead_letters(
                DeadLetterReason.UNDECODABLE_MESSAGE, source=name, row_index=-1, detail=str(exc)[:300],
                raw=payload[:256].hex()))
            return
        yield beam.pvalue.TaggedOutput("read", _read_row(name, table.num_rows))
        if checked.rejected.num_rows:
            yield beam.pvalue.TaggedOutput("dead", rejected_letters(name, checked.rejected))
        valid = checked.valid
        if not valid.num_rows:
            return
        number = self._numbers[name] if name in self._numbers else _source_number(name)
        valid = with_input_position(valid, source=number, name=name,
                                    row_index=np.flatnonzero(tx.valid_mask(table.num_rows, checked.rejected)))
        if self._stamp:
            first = int(pc.min(valid.column(WINDOW_ID)).as_py())
            yield TimestampedValue(valid, self._window.window_start_seconds(first))
        else:
            yield valid


def _read_row(name: str, rows: int) -> pa.Table:
    """The curator's record of one message read: its name and its number of rows (sensitive)."""
    return pa.table({"source": [name], "rows_read": pa.array([int(rows)], type=pa.int64())})


class WriteTable(beam.DoFn):
    """A curator table -> one Parquet file under ``root``, named by its content (a retried bundle
    rewrites the same file, never a second copy); outputs the path."""

    def __init__(self, root: str, folder: Any = None) -> None:
        self._root = root
        self._folder = folder  # element -> (sub-folder, table); None: the element is the table

    def process(self, element: Any) -> Iterator[str]:
        sub, table = self._folder(element) if self._folder else ("", element)
        yield _write_named(self._root, sub, table)


def _write_named(root: str, sub: str, table: pa.Table) -> str:
    """Write ``table`` as ``<root>/<sub>/<content digest>.parquet``; returns the path."""
    digest = hashlib.sha256(encode_message(table)).hexdigest()[:24]
    path = store.join(root, *([sub] if sub else []), f"{digest}.parquet")
    store.write_parquet(path, table)
    return path


#: The streaming job's outbox under its ``--output`` (curator only until published): each window's
#: release file, ``<output>/staged-releases/window_id=<W>/releases.parquet``, staged once all its
#: rows are in and published once the window is committed (:class:`CommitWindows`, or, after a
#: crash, :func:`recover` at the next launch).
STAGED_RELEASES = "staged-releases"
#: A window's commit marker, ``<output>/commits/window_id=<W>.json``: written (whole or not at all:
#: a scratch name renamed into place, :func:`renyi_stream.pipelines.beam.object_store.write_json`) once every
#: shard's ledger snapshot and records of the window are written and its releases staged, in window
#: order, and before the window's release file is published. The last marker names the window a
#: restarted job continues from (:func:`recover`).
COMMITS = "commits"
#: The state folder's record, ``<output>/_STATE.json``, written when a job first runs into it: an
#: ``--output`` holding it is one this version of the job recovers by itself. One holding snapshots
#: without it was written by an earlier version and is refused (give a new ``--output``).
STATE_FILE = "_STATE.json"
#: The curator folders whose ``window_id=<W>`` sub-folders hold one window's committed state:
#: the shards' ledger snapshots, the staged releases, the shards' books records and duplicate dead
#: letters (and ``counts``, a record of its own before the books record held the counts, kept so that a
#: folder an earlier version wrote loses its dead branch too). Those of windows after the last commit
#: marker are a crashed job's dead branch.
#: Running totals' state of a window: every shard's per-user prepaid rows (:data:`PREPAID`,
#: ``prepaid/window_id=<W>/shard=<S>/``) and each running query's release state (:data:`RUNNING_STATE`,
#: ``running/window_id=<W>/``), committed with the window like its ledger snapshots.
PREPAID, RUNNING_STATE = "prepaid", "running"
WINDOW_FOLDERS = ("ledger", STAGED_RELEASES, "books", "counts", "dead", PREPAID, RUNNING_STATE)
#: What the commit step hears of a window: its release file is staged (shard ``-1``), one shard's
#: ledger snapshot of it is written, one shard's records of it (books, duplicates), or (with
#: running queries) one shard's prepaid rows of it.
STAGED, SNAPSHOT_WRITTEN, RECORDS_WRITTEN, PREPAID_WRITTEN = "staged", "snapshot", "records", "prepaid"


class StageWindowFile(beam.DoFn):
    """``(window_id, release row)`` keyed by window -> the window's release file staged under the
    curator's ``root`` once all of its rows are in (``expected(window)`` of them: one per coordinate
    of each query active in it, and one running-query state per running query active in it);
    outputs ``(window, (STAGED, -1))``. Staged, not public: the file is the job's outbox
    (:data:`STAGED_RELEASES`), published by :class:`CommitWindows`. An element
    ``(window_id, state table)`` (a table, not a row: :class:`renyi_stream.pipelines.streaming.releases.ReleaseRunningInOrder`'s
    ``release_state``) is a running query's state after the window, written under ``running_root``
    (``window_id=<W>/``, named by its content) before the release file, so a staged window always
    has the release states that continue it.
    Written whole and ``0600`` (:func:`renyi_stream.pipelines.beam.object_store.write_parquet`); a retried
    bundle rewrites the same content (keyed noise). Crash point ``streaming_after_stage``.

    A stateful step rather than a GroupByKey: a GroupByKey on an unbounded collection needs a
    windowing and trigger, and the rows of a window are complete exactly when their count is."""

    ROWS = BagStateSpec("rows", PickleCoder())

    def __init__(self, root: str, expected: dict[int, int], running_root: str | None = None) -> None:
        self._root = root
        self._expected = dict(expected)
        self._running_root = running_root

    def process(self, element: tuple[int, dict], rows: Any = beam.DoFn.StateParam(ROWS)) -> Iterator[Any]:
        window, row = element
        rows.add(row)
        buffered = list(rows.read())
        if len(buffered) < self._expected[int(window)]:
            return
        rows.clear()
        states = [item for item in buffered if isinstance(item, pa.Table)]
        if states and self._running_root is None:
            raise ValueError("a running query's state was staged, but no running_root was given to keep it")
        for table in states:
            _write_named(self._running_root, f"window_id={int(window)}", table)
        store.write_parquet(release_file_path(self._root, int(window)),
                            release_file_table([item for item in buffered if not isinstance(item, pa.Table)]))
        crash_point("streaming_after_stage")  # test-only: staged, not committed
        yield int(window), (STAGED, -1)


def _snapshot_written(path: str) -> tuple[int, tuple[str, int]]:
    """The path of a ledger snapshot just written -> ``(window, (SNAPSHOT_WRITTEN, shard))``.
    Crash point ``streaming_after_snapshot``."""
    place = _snapshot_place(path)
    if place is None:
        raise ValueError(f"path must be a snapshot the job wrote (.../window_id=<W>/shard=<S>/...), got {path!r}")
    crash_point("streaming_after_snapshot")  # test-only: a shard's snapshot written, its window not committed
    _, window, shard = place
    return window, (SNAPSHOT_WRITTEN, shard)


class WriteWindowRecords(beam.DoFn):
    """One shard's records of one charged window, ``(window, books record, duplicates or None)``
    (:class:`renyi_stream.pipelines.streaming.releases.StreamingReleases` with ``window_records``) -> its
    duplicate dead letters, when it had any (``dead/window_id=<W>/``, named by their content), then
    ``(window, (RECORDS_WRITTEN, shard, books record))``: the shard's row books of the window and its
    counts by status (:data:`BOOKS_COLUMNS`, :func:`books_record`, as JSON). The books record travels
    to the commit step, which writes every shard's record of a window into the window's commit
    marker (:class:`CommitWindows`): one file per window holds them, never one per shard, and they
    are committed with the window or not at all (invariant 7 (rows-counted-not-lost,
    docs/architecture.md): a committed window's rows keep their outcome after a crash)."""

    def __init__(self, curator: str) -> None:
        self._curator = curator

    def process(self, element: tuple[int, dict, pa.Table | None]) -> Iterator[tuple[int, tuple[str, int, str]]]:
        window, record, duplicates = element
        row = books_record(window, record)
        if duplicates is not None and duplicates.num_rows:
            _write_named(store.join(self._curator, "dead"), f"window_id={int(window)}", duplicates)
        yield int(window), (RECORDS_WRITTEN, row["shard"], json.dumps(row, sort_keys=True))


class WritePrepaid(beam.DoFn):
    """One shard's per-user prepaid rows after one window, ``(shard, window, [(query_id, table)])``
    (:class:`renyi_stream.pipelines.streaming.releases.StreamingReleases`' ``prepaid``: whole with a full ledger
    snapshot, else a delta, the rows of the users charged in the window) -> one file per running
    query, ``prepaid/window_id=<W>/shard=<S>/``, named by its content and recording the query id
    (:data:`renyi_stream.pipelines.streaming.releases.RUNNING_QUERY_ID`); a delta without rows writes no file
    (the window's ledger snapshot records the rows of each, :data:`PREPAID_ROWS`, so a file is
    expected exactly when it has rows). Then ``(window, (PREPAID_WRITTEN, shard))``, so the
    window's commit marker is written only once they are: a lost prepaid row would restart its
    user's prepaid charge from nothing."""

    def __init__(self, curator: str) -> None:
        self._curator = curator

    def process(self, element: tuple[int, int, list[tuple[str, pa.Table]]]) -> Iterator[tuple[int, tuple[str, int]]]:
        shard, window, parts = element
        for query_id, table in parts:
            if not table.num_rows and _metadata(table).get(SNAPSHOT_KIND) == "delta":
                continue  # nobody's prepaid rows changed: nothing to write (PREPAID_ROWS records 0)
            marked = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                    RUNNING_QUERY_ID.encode(): query_id.encode()})
            _write_named(store.join(self._curator, PREPAID), f"window_id={int(window)}/shard={int(shard)}", marked)
        yield int(window), (PREPAID_WRITTEN, int(shard))


def commit_marker_path(curator: str, window: int) -> str:
    """Where window ``window``'s commit marker lies in the state folder ``curator`` (:data:`COMMITS`)."""
    return store.join(curator, COMMITS, f"window_id={int(window)}.json")


def committed_windows(curator: str) -> list[int]:
    """The windows with a commit marker in the state folder ``curator`` (its ``--output``), sorted."""
    (result,) = FileSystems.match([store.join(curator, COMMITS, "window_id=*.json")])
    found = (re.fullmatch(r"window_id=(-?[0-9]+)\.json", m.path.replace("\\", "/").rsplit("/", 1)[-1])
             for m in result.metadata_list)
    return sorted(int(match[1]) for match in found if match)


class CommitWindows(beam.DoFn):
    """Under one key: commits the job's windows in window order, each once it is complete, and
    publishes them by the one publication rule (:func:`renyi_stream.stream.engine.publication.publish_outbox`,
    first write wins); outputs the public files.

    Input ``(key, (window, event))``: ``(STAGED, -1)`` from :class:`StageWindowFile`,
    ``(SNAPSHOT_WRITTEN, shard)`` from the ledger snapshot writer and ``(RECORDS_WRITTEN, shard,
    books record)`` from :class:`WriteWindowRecords`. Window ``W`` is complete when it is staged and
    all ``n_shards`` snapshots and records of it are written; it is committed when ``W - 1`` is (or
    ``W`` is the first window this job charges, ``first_window``) by writing its marker
    (:func:`commit_marker_path`, whole or not at all; it holds every shard's books record of the
    window, :data:`MARKER_BOOKS`), and only then published. So a crash between
    any two writes leaves the last marker on a complete window, whose snapshots hold every
    earlier window's charges, and no public answer without its window's marker and ledger
    snapshots (invariant 4 (nothing-pre-noise-leaves), invariant 5 (release-once), invariant 6
    (charge-once), docs/architecture.md, "The outbox rule"). A repeated event does nothing.
    State: EVENTS (bag of ``(window, event)`` of windows not yet committed), NEXT (the next
    window to commit). Crash points ``streaming_after_commit`` (a marker written, its window not
    yet public), then the publication rule's."""

    EVENTS = BagStateSpec("events", PickleCoder())
    NEXT = ReadModifyWriteStateSpec("next", PickleCoder())

    def __init__(self, curator: str, public: str, n_shards: int, *, first_window: int, end_window: int,
                 ledger_id: str | None = None, prepaid: bool = False, run: str | None = None,
                 previous_run: str | None = None) -> None:
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1, got n_shards={n_shards}")
        self._prepaid = prepaid  # running queries: every shard's prepaid rows of a window too
        self._curator = curator
        self._public = public
        self._n_shards = int(n_shards)
        self._first, self._end = int(first_window), int(end_window)
        self._ledger_id = ledger_id
        self._run, self._previous_run = run, previous_run  # the job's place in the public lineage

    def _complete(self, heard: set[tuple]) -> bool:
        snapshots = {event[1] for event in heard if event[0] == SNAPSHOT_WRITTEN}
        records = {event[1] for event in heard if event[0] == RECORDS_WRITTEN}
        prepaid = {event[1] for event in heard if event[0] == PREPAID_WRITTEN}
        return ((STAGED, -1) in heard and len(snapshots) == self._n_shards and len(records) == self._n_shards
                and (not self._prepaid or len(prepaid) == self._n_shards))

    @staticmethod
    def _books(window: int, heard: set[tuple]) -> list[dict]:
        """The shards' books records of ``window`` from its RECORDS events, in shard order. A retried
        bundle repeats its shard's record unchanged; two different records of one shard are an
        engine bug (RuntimeError, nothing committed)."""
        by_shard: dict[int, set[str]] = {}
        for event in heard:
            if event[0] == RECORDS_WRITTEN:
                by_shard.setdefault(int(event[1]), set()).add(event[2])
        twice = sorted(shard for shard, records in by_shard.items() if len(records) > 1)
        if twice:
            raise RuntimeError(f"window {window}: shard(s) {twice} reported two different books records")
        return [json.loads(next(iter(by_shard[shard]))) for shard in sorted(by_shard)]

    def process(self, element: tuple[Any, tuple[int, tuple[str, int]]], events: Any = beam.DoFn.StateParam(EVENTS),
                upcoming: Any = beam.DoFn.StateParam(NEXT)) -> Iterator[str]:
        _, (window, event) = element
        following = upcoming.read()
        following = self._first if following is None else int(following)
        if int(window) < following:
            return  # committed already: a repeated event
        events.add((int(window), tuple(event)))
        heard: dict[int, set[tuple[str, int]]] = {}
        for w, e in events.read():
            heard.setdefault(int(w), set()).add(tuple(e))
        committed = []
        while following <= self._end and self._complete(heard.get(following, set())):
            store.write_json(commit_marker_path(self._curator, following), {
                "window_id": following, "n_shards": self._n_shards, "ledger_id": self._ledger_id,
                "snapshots": store.join(self._curator, "ledger", f"window_id={following}"),
                "staged": release_file_path(store.join(self._curator, STAGED_RELEASES), following),
                MARKER_BOOKS: self._books(following, heard[following])})
            crash_point("streaming_after_commit")  # test-only: committed, not yet public
            # Progress for the operator (and benchmarks/bench_streaming.py's per-window time): the
            # window id and a monotonic clock only, both public (invariant 4: no count, no sum).
            print(f"[streaming] window {following} committed at {time.monotonic():.3f}", file=sys.stderr, flush=True)
            committed.append(following)
            following += 1
        if not committed:
            return
        upcoming.write(following)
        events.clear()
        for w, kinds in heard.items():
            for e in kinds if w >= following else ():
                events.add((w, e))
        # LineageConflict (the job fails, nothing of it public) when another job from our ledger claimed first.
        claim_lineage(self._public, self._run, self._previous_run)
        done = publish_outbox(StagedReleases(store.join(self._curator, STAGED_RELEASES), committed),
                              PublicReleaseFiles(self._public, run=self._run))
        for w in done.windows:
            yield release_file_path(self._public, w)


#: Schema metadata of every ledger snapshot the job writes, beside the ledger's own and the
#: ledger's configuration (:meth:`renyi_stream.stream.engine.ledger_config.LedgerConfig.to_snapshot_metadata`,
#: ``renyi_stream.<field>``): the window and shard it is of, so that a later job given it as
#: ``--previous-ledger`` can tell whether it holds every shard of one window (:func:`_previous_ledger`).
SNAPSHOT_WINDOW, SNAPSHOT_SHARD = snapshot_key("window_id"), snapshot_key("shard")
#: The job's ``--shards`` and the ledger's identity, as the configuration records them.
SNAPSHOT_SHARDS, SNAPSHOT_LEDGER_ID = snapshot_key("n_shards"), snapshot_key("ledger_id")


#: The queries a ledger has answered, ``{query_id: first window answered}`` (JSON), recorded in every
#: snapshot (those answered through its window) and carried by a job that continues it: a query
#: registered into windows already charged but never answered is moved past them at the next launch
#: (:func:`renyi_stream.queries.catalogue.queries_at_launch`).
SNAPSHOT_QUERIES = "renyi_stream.queries"
#: The job's query plan (:func:`renyi_stream.queries.registration.recorded_plan`: which queries from which window, their
#: specs), recorded in every snapshot.
SNAPSHOT_QUERY_PLAN = "renyi_stream.query_plan"


def _ledger_file(item: tuple[int, int, pa.Table], *, recorded: dict[bytes, bytes],
                 queries: dict[str, int] | None = None, plan: list[dict] | None = None,
                 runs: tuple[str | None, str | None] = (None, None)) -> tuple[str, pa.Table]:
    """``(shard, window, ledger)`` -> ``("window_id=W/shard=S", ledger)``, the snapshot recording
    the ledger's configuration ``recorded`` (:meth:`LedgerConfig.to_snapshot_metadata`: what it
    keeps for life, its id and the job's shard count) and its window and shard in its schema
    metadata; with ``queries`` (``{query_id: first window}``), those answered through its window
    (:data:`SNAPSHOT_QUERIES`), with ``plan`` the job's query plan (:data:`SNAPSHOT_QUERY_PLAN`), and
    with ``runs`` the job's run id and its parent's (:data:`SNAPSHOT_RUN`, :data:`SNAPSHOT_PREVIOUS_RUN`)."""
    shard, window, table = item
    extra = {SNAPSHOT_WINDOW: str(int(window)), SNAPSHOT_SHARD: str(int(shard))}
    if None not in runs:
        extra[SNAPSHOT_RUN], extra[SNAPSHOT_PREVIOUS_RUN] = runs
    if queries is not None:
        extra[SNAPSHOT_QUERIES] = json.dumps({q: int(f) for q, f in sorted(queries.items()) if f <= int(window)},
                                             sort_keys=True)
    if plan is not None:
        extra[SNAPSHOT_QUERY_PLAN] = json.dumps(plan, sort_keys=True)
    metadata = {**(table.schema.metadata or {}), **recorded, **{k.encode(): v.encode() for k, v in extra.items()}}
    return f"window_id={int(window)}/shard={int(shard)}", table.replace_schema_metadata(metadata)


#: The columns of a shard's books record of a window (:func:`books_record`): the window and shard, the
#: shard's row books since its previous window (:class:`renyi_stream.stream.engine.shard_state.ShardBooks`), the
#: window's counts as the batch jobs record them (:data:`renyi_stream.stream.engine.shard_state.WINDOW_COUNT_NAMES`:
#: ``admitted``, ``clipped``, ``dropped`` by status, ``nonfinite``), the rows ``buffered`` for later
#: windows and ``balanced`` (1 or 0). One record per shard and window holds both the books and the
#: counts, and the window's commit marker holds every shard's record (:data:`MARKER_BOOKS`): a window
#: writes no file per shard for them. Sensitive: curator only.
BOOKS_COLUMNS = ("window_id", "shard", "received", "late", "out_of_range", "duplicate", *WINDOW_COUNT_NAMES,
                 "buffered", "balanced")


def books_record(window: int, record: dict) -> dict[str, int]:
    """A shard's books record of window ``window`` (:data:`BOOKS_COLUMNS`, integers): ValueError
    naming the columns missing from ``record``."""
    row = {"window_id": int(window), **{k: int(v) for k, v in dict(record).items()}}
    missing = sorted(set(BOOKS_COLUMNS) - set(row))
    if missing:
        raise ValueError(f"a shard's books record of window {int(window)} must hold {list(BOOKS_COLUMNS)}, "
                         f"missing {missing}")
    return row


#: The commit marker's list of the window's books records, one per shard (:data:`BOOKS_COLUMNS`).
MARKER_BOOKS = "books"


def books_records(curator: str) -> pa.Table:
    """Every shard's books record of every window committed in the state folder ``curator`` (a
    streaming job's ``--output``): :data:`BOOKS_COLUMNS`, one row per (window, shard), in window
    order. Read from the commit markers, which hold them (:data:`MARKER_BOOKS`); a marker an
    earlier version wrote without them has its records in ``books/window_id=<W>/``, one Parquet file
    per shard. Records of windows not committed are never read (a dead branch's, or in flight).
    Exact counts: curator only."""
    rows: list[dict] = []
    parts: list[pa.Table] = []
    for window in committed_windows(curator):
        marker = store.read_json(commit_marker_path(curator, window))
        if MARKER_BOOKS in marker:
            rows.extend(marker[MARKER_BOOKS])
        else:
            parts.extend(_curator_tables(curator, f"books/window_id={window}"))
    schema = pa.schema([(name, pa.int64()) for name in BOOKS_COLUMNS])
    tables = [pa.Table.from_pylist(rows, schema=schema)] + [t.select(BOOKS_COLUMNS).cast(schema) for t in parts]
    return pa.concat_tables(tables).sort_by([("window_id", "ascending"), ("shard", "ascending")])


def window_counts(curator: str) -> pa.Table:
    """Every shard's counts of every committed window it charged rows in, from a streaming job's
    ``--output`` ``curator``: ``window_id``, ``shard`` and
    :data:`renyi_stream.stream.engine.shard_state.WINDOW_COUNT_NAMES`, as the batch jobs record them,
    one row per (window, shard) with a charged row, sorted. Read from the books records of the
    committed windows (:func:`books_records`), which hold them: a window charged but not yet
    committed (in flight, or a crashed job's dead branch) has none. Exact counts: curator only."""
    table = books_records(curator).select(["window_id", "shard", *WINDOW_COUNT_NAMES])
    charged = pc.greater(pc.add(pc.add(table.column("admitted"), table.column("clipped")), table.column("dropped")), 0)
    return table.filter(charged)


def _curator_tables(curator: str, folder: str) -> list[pa.Table]:
    """Every Parquet file under ``<curator>/<folder>``, read, in path order."""
    paths = [m.path for r in FileSystems.match([store.join(curator, folder, "**.parquet")]) for m in r.metadata_list]
    return [store.read_parquet(path) for path in sorted(paths)]


# --- launch ----------------------------------------------------------------------------------


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
                       choices=KAFKA_TIMESTAMP_POLICIES, default=ReadFromKafka.create_time_policy,
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
    options without ``--kafka-topic``, or a Kafka configuration :func:`kafka_read_config` refuses."""
    if getattr(args, "kafka_topic", None):
        kafka_read_config(args)
        return
    given = [f"--{name.replace('_', '-')}" for name in _KAFKA_ONLY if getattr(args, name, None)]
    if given:
        raise ValueError(f"{', '.join(given)} only go with --kafka-topic, which was not given")


def parse_args(argv: Sequence[str], prog: str = "python -m renyi_stream.pipelines.streaming") -> tuple[argparse.Namespace, list[str]]:
    """``(job arguments, Beam arguments)`` of ``argv``. Exits with status 2 and a message naming
    the options (argparse's ``error``) when the source options do not fit together: two sources
    (``--kafka-topic`` with ``--subscription`` or ``--replay``), ``--kafka-topic`` without
    ``--bootstrap-servers``, a malformed Kafka option, a Kafka option without ``--kafka-topic``, or
    an option neither this job's nor Beam's (:func:`renyi_stream.pipelines.beam.job_options.refuse_unknown_options`:
    a typo would run the job without it)."""
    parser = _parser(prog)
    args, beam_args = parser.parse_known_args(list(argv))
    try:
        launch.refuse_unknown_options(beam_args, launch.long_options(parser), command=parser.prog)
        _check_source(args)
    except (ValueError, launch.RunRefused) as exc:
        parser.error(str(exc))
    return args, list(beam_args)


#: Where the job writes a ledger snapshot: ``<output>/ledger/window_id=<W>/shard=<S>/<digest>.parquet``.
_SNAPSHOT_PATH = re.compile(r"(?P<root>.+)/window_id=(?P<window>-?[0-9]+)/shard=(?P<shard>[0-9]+)/[^/]+")


def _snapshot_place(path: str) -> tuple[str, int, int] | None:
    """``(ledger root, window, shard)`` of a snapshot file the job wrote, from its path; None for
    a path without the ``window_id=<W>/shard=<S>/`` folders."""
    match = _SNAPSHOT_PATH.fullmatch(path.replace("\\", "/"))
    return None if match is None else (match["root"], int(match["window"]), int(match["shard"]))


def _snapshot_glob(root: str, window: int) -> str:
    return store.join(root, f"window_id={int(window)}", "*", "*.parquet")


def _check_snapshot_paths(pattern: str, paths: Sequence[str], *, releases: str,
                          released: Sequence[int]) -> tuple[str, int, dict[int, str]]:
    """``(ledger root, window, {shard: path})`` of the files ``--previous-ledger`` matched, refused
    (:class:`renyi_stream.pipelines.distributed.job.RunRefused`) unless they are this job's snapshots of one window,
    at most one file per shard, and that window is the last one released under ``releases``."""
    option = f"--previous-ledger {pattern!r}"
    last = max(released) if released else None
    places = {path: _snapshot_place(path) for path in paths}
    foreign = [path for path, place in places.items() if place is None]
    if foreign:
        hint = (f"; give the last released window's, e.g. --previous-ledger "
                f"'<earlier --output>/ledger/window_id={last}/*/*.parquet'" if last is not None else "")
        raise launch.RunRefused(
            f"{option} matches {len(foreign)} file(s) that are not ledger snapshots of this job, e.g. {foreign[0]}: "
            f"the job writes them as <output>/ledger/window_id=<W>/shard=<S>/<name>.parquet{hint}")
    windows = sorted({window for _, window, _ in places.values()})
    roots = sorted({root for root, _, _ in places.values()})
    if len(windows) > 1:
        suggest = f": give the last released window's, '{_snapshot_glob(roots[0], last)}'" if last is not None else ""
        raise launch.RunRefused(
            f"{option} matches the snapshots of {len(windows)} windows ({windows[:5]}): a ledger to continue is one "
            f"window's snapshot, every shard of it, and read together these would count users twice or mix "
            f"budgets of different days{suggest}")
    (window,) = windows
    if len(roots) > 1:
        raise launch.RunRefused(f"{option} matches snapshots of window {window} under {len(roots)} ledger roots "
                              f"({roots[:3]}): give the snapshot of one job, '{_snapshot_glob(roots[0], window)}'")
    (root,) = roots
    if last is None:
        raise launch.RunRefused(
            f"{option} is the snapshot of window {window}, but no window is released under --releases-parquet "
            f"{releases}: only the releases tell whether it is the snapshot of the last released window (an "
            f"older one would restart users from an older, smaller budget), so give the --releases-parquet root "
            f"the earlier job released to")
    if window != last:
        state = "an earlier window" if window < last else "a window that is not released"
        raise launch.RunRefused(
            f"{option} is the snapshot of window {window} ({state}), but the last window released under {releases} "
            f"is {last}: users would go on from the budget they had after window {window}, not after {last}, and be "
            f"under-charged; give window {last}'s snapshots, e.g. --previous-ledger '{_snapshot_glob(root, last)}'")
    by_shard: dict[int, list[str]] = {}
    for path, (_, _, shard) in places.items():
        by_shard.setdefault(shard, []).append(path)
    repeated = {shard: sorted(found) for shard, found in by_shard.items() if len(found) > 1}
    if repeated:
        shard, found = min(repeated.items())
        raise launch.RunRefused(
            f"{option} matches {len(found)} files of shard {shard} of window {window} ({found[:2]}): a shard writes "
            f"one snapshot per window, two are diverging replays of it and neither is known to be the one charged")
    return root, window, {shard: found[0] for shard, found in by_shard.items()}


def _recorded_shards(files: dict[int, str], tables: dict[int, pa.Table], window: int, pattern: str) -> int | None:
    """The earlier job's shard count as its snapshots record it (None for snapshots written before
    it was recorded); RunRefused when a file's recorded window or shard is not its folder's, or
    the files record different counts."""
    counts = set()
    for shard, table in tables.items():
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        said = (meta.get(SNAPSHOT_WINDOW), meta.get(SNAPSHOT_SHARD))
        if said != (None, None) and said != (str(window), str(shard)):
            raise launch.RunRefused(f"--previous-ledger {pattern!r}: {files[shard]} records window {said[0]}, shard "
                                  f"{said[1]} but lies in window_id={window}/shard={shard}: a snapshot moved by hand")
        if SNAPSHOT_SHARDS in meta:
            counts.add(int(meta[SNAPSHOT_SHARDS]))
    if len(counts) > 1:
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: the snapshots of window {window} record different "
                              f"shard counts {sorted(counts)}: they are not one job's")
    return counts.pop() if counts else None


def _check_every_shard(pattern: str, root: str, window: int, present: set[int], recorded: int | None) -> None:
    """RunRefused unless ``present`` is exactly shards 0..N-1 of the job that wrote window
    ``window``'s snapshot: N as the snapshots record it, else one more than the highest shard
    folder there is; and every shard folder under ``root/window_id=<window>`` is matched."""
    folder = store.join(root, f"window_id={int(window)}")
    (result,) = FileSystems.match([store.join(folder, "shard=*", "*.parquet")])
    on_disk = {place[2] for place in (_snapshot_place(m.path) for m in result.metadata_list) if place is not None}
    if recorded is not None:
        n_shards, source = recorded, "as its snapshots record"
    else:
        n_shards, source = max(on_disk | present) + 1, f"as the shard folders under {folder} say"
    missing = sorted(set(range(n_shards)) - present)
    beyond = sorted((present | on_disk) - set(range(n_shards)))
    if not missing and not beyond:
        return
    if beyond:
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: window {window} has snapshots of shard(s) {beyond[:10]} "
                              f"beyond the {n_shards} shards of the job that wrote it ({source}): not one job's")
    absent = [s for s in missing if s not in on_disk]
    lost = (f"; shard(s) {absent[:10]} have no snapshot under {folder} at all: the earlier job stopped before "
            f"writing them or they were lost, and that ledger cannot be continued without them" if absent else "")
    raise launch.RunRefused(
        f"--previous-ledger {pattern!r} matches {len(present)} of the {n_shards} shards of window {window} "
        f"({source}): missing shard(s) {missing[:10]}{' ...' if len(missing) > 10 else ''}, whose users would "
        f"restart from zero budget; give every shard's snapshot, '{_snapshot_glob(root, window)}'{lost}")


def _metadata(table: pa.Table) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _compared(name: str, text: str) -> str:
    """A recorded value as compared: a release root normalised as :func:`renyi_stream.pipelines.beam.object_store.absolute`
    does (``gs://b/r/`` is ``gs://b/r``), anything else as it is."""
    return store.absolute(text) if name == "releases" else text


#: During a dry run (:func:`dry_run`) only: ``(the real release root, its scratch copy)``. The
#: ledger's snapshots record the root it answers into, which the real run checks; the preview
#: answers into the copy and reads the recorded root as the copy, so it passes where the real run
#: passes and is refused where the real run is refused.
_PREVIEWED_ROOT: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("previewed_root",
                                                                                       default=None)


def _previewed(root: str) -> str:
    """``root``, or its scratch copy during a dry run of the job releasing under it."""
    previewed = _PREVIEWED_ROOT.get()
    return previewed[1] if previewed is not None and root == previewed[0] else root


def _recorded_config(pattern: str, files: dict[int, str], metadata: dict[int, dict[str, str]]) -> LedgerConfig:
    """The ledger configuration every shard's snapshot records
    (:meth:`LedgerConfig.from_snapshot_metadata`, the release root normalised as
    :func:`renyi_stream.pipelines.beam.object_store.absolute` does). RunRefused when a snapshot does not record
    it (written before the job recorded it: it cannot be checked; the message says how to go on),
    records a malformed value, or the shards record different values (not one ledger's)."""
    option = f"--previous-ledger {pattern!r}"
    configs: dict[int, LedgerConfig] = {}
    for shard, meta in sorted(metadata.items()):
        try:
            config = LedgerConfig.from_snapshot_metadata(meta, where=f"{option}: {files[shard]}", n_shards=len(files))
        except LedgerConfigError as exc:
            if not exc.missing:
                raise launch.RunRefused(str(exc)) from None
            raise launch.RunRefused(
                f"{option}: {files[shard]} does not record the parameters its ledger keeps for life "
                f"({list(exc.missing)}; written before the streaming job recorded them), so this run cannot check "
                f"that it keeps the promise the earlier job made to every user (a larger epsilon or norm budget, "
                f"another accounting, delta, key, window length or release root would silently break it). If this "
                f"run's parameters are exactly the earlier job's, record them in a copy of the snapshots with "
                f"renyi_stream.pipelines.streaming.job.record_snapshot_parameters(<this glob>, <a new ledger root>, <the earlier "
                f"job's arguments>) (deploy/README.md, 'Streaming mode') and give the copy as --previous-ledger"
            ) from None
        configs[shard] = replace(config, releases=_previewed(store.absolute(config.releases)))
    for name in (f.name for f in fields(LedgerConfig)):
        values = {shard: getattr(config, name) for shard, config in configs.items()}
        if len(set(values.values())) > 1:
            shown = {shard: values[shard] for shard in sorted(values)[:6]}
            what = "ledger ids" if name == "ledger_id" else f"values of {name}"
            raise launch.RunRefused(f"{option}: the snapshots record different {what} (by shard: {shown}): they are "
                                    "not one ledger's")
    return configs[min(configs)]


def _continued(pattern: str, files: dict[int, str], metadata: dict[int, dict[str, str]],
               wanted: LedgerConfig) -> LedgerConfig:
    """This run's configuration ``wanted`` continuing the ledger the snapshots record
    (:func:`_recorded_config`, :meth:`LedgerConfig.continued_from`: RunRefused naming every field
    whose value differs, with the ledger's value and this run's; the ledger's budget, noise std,
    tracker step and id kept), with a new ledger id for snapshots from before ledger ids (their
    released windows keep their values, later ones are drawn for the new id)."""
    option = f"--previous-ledger {pattern!r}"
    try:
        config = wanted.continued_from(_recorded_config(pattern, files, metadata), where=option)
    except LedgerConfigError as exc:
        raise launch.RunRefused(str(exc)) from None
    return config if config.ledger_id is not None else replace(config, ledger_id=new_ledger_id())


def _read_snapshots(pattern: str, *, releases: str,
                    released: Sequence[int]) -> tuple[str, int, dict[int, str], dict[int, pa.Table]]:
    """``(ledger root, window, {shard: path}, {shard: table})``: every shard's snapshot of the last
    window released under ``releases`` that ``pattern`` matches, checked as :func:`_previous_ledger` says."""
    (result,) = FileSystems.match([store.absolute(pattern)])
    if not result.metadata_list:
        raise launch.RunRefused(f"--previous-ledger {pattern!r} matches no file")
    root, window, files = _check_snapshot_paths(pattern, [m.path for m in result.metadata_list],
                                                releases=releases, released=released)
    try:
        tables = {shard: store.read_parquet(path) for shard, path in sorted(files.items())}
    except PrivateFileError as exc:  # a snapshot others may read: the curator decides what leaked
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: {exc}") from None
    _check_every_shard(pattern, root, window, set(files), _recorded_shards(files, tables, window, pattern))
    tables = {shard: _whole_snapshot(pattern, root, window, shard, table) for shard, table in tables.items()}
    return root, window, files, tables


def _whole_snapshot(pattern: str, root: str, window: int, shard: int, table: pa.Table) -> pa.Table:
    """Shard ``shard``'s whole ledger at ``window`` from its snapshot ``table`` there: the table
    itself when it is full; for a delta (:data:`renyi_stream.pipelines.streaming.releases.SNAPSHOT_KIND`), the
    full snapshot of its base window with the deltas of the windows after it through ``window`` over
    it (:func:`renyi_stream.stream.engine.shard_state.merge_deltas`), with ``table``'s metadata.
    RunRefused, naming the file missing or doubled, when that chain is not one file per window."""
    meta = _metadata(table)
    if meta.get(SNAPSHOT_KIND, "full") != "delta":
        return table
    base = int(meta[SNAPSHOT_BASE])
    chain = []
    for w in range(base, int(window)):
        chain.append(store.read_parquet(_one_snapshot(pattern, root, w, shard, int(window), rebuilt="ledger")))
    if _metadata(chain[0]).get(SNAPSHOT_KIND, "full") != "full":
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: shard {shard}'s snapshot of window {base}, the base "
                                f"of window {window}'s delta, is not a full snapshot")
    merged = merge_deltas(chain[0], [(w, t) for w, t in zip(range(base + 1, int(window) + 1), [*chain[1:], table])])
    extra = {k: v for k, v in (table.schema.metadata or {}).items() if k.decode() not in (SNAPSHOT_KIND, SNAPSHOT_BASE)}
    return merged.replace_schema_metadata({**(merged.schema.metadata or {}), **extra, SNAPSHOT_KIND.encode(): b"full"})


def _previous_ledger(pattern: str, wanted: LedgerConfig, *, released: Sequence[int],
                     id_type_declared: bool = True) -> tuple[pa.Table, LedgerConfig, dict[str, int] | None]:
    """The ledger to continue from, this run's configuration continuing it and the queries it has
    answered: every shard's snapshot of the last window released under ``wanted.releases``, read
    together (a ``--shards`` other than the earlier job's re-shards it by user), ``wanted`` with
    the budget, noise std, tracker step and ledger id the snapshots record (:func:`_continued`),
    and ``{query_id: first window answered}`` as they record it (:data:`SNAPSHOT_QUERIES`; None for
    snapshots written before it was recorded); for a new ledger, an empty one, ``wanted`` with a
    new ledger id, and None. Without ``id_type_declared``, the id type is the one the snapshots
    record (a ledger's for life) rather than ``wanted``'s.

    RunRefused, before anything is read into the graph, when ``pattern`` is ``none`` but windows
    are released; when it matches no file, a file that is not a snapshot this job wrote
    (``.../window_id=<W>/shard=<S>/...``), snapshots of more than one window or job, or two files
    of one shard; when no window is released (nothing to check the snapshot against), or its
    window is not the last released one; when it misses a shard of the job that wrote it (the
    count its snapshots record, or else the shard folders there); when the snapshots do not
    record the ledger's configuration or record values other than ``wanted``'s
    (:func:`_continued`); and when the ledger itself is inconsistent
    (:meth:`renyi_stream.stream.ledger.Ledger.from_arrow`)."""
    releases = wanted.releases
    if pattern.lower() == "none":
        if released:
            raise launch.RunRefused(f"the releases under {releases} include window(s) {list(released)[:5]} but no "
                                  "--previous-ledger was given: users would restart from zero budget")
        return wanted.empty_ledger().to_arrow(), replace(wanted, ledger_id=new_ledger_id()), None
    _, _, files, tables = _read_snapshots(pattern, releases=releases, released=released)
    metadata = {shard: _metadata(t) for shard, t in tables.items()}
    if not id_type_declared:  # the ledger's own, as its snapshots record it
        recorded = {meta.get(snapshot_key("id_type"), meta.get("id_type")) for meta in metadata.values()}
        if len(recorded) == 1 and next(iter(recorded)) in ("int64", "string"):
            wanted = replace(wanted, id_type=recorded.pop())
    config = _continued(pattern, files, metadata, wanted)
    template = config.empty_ledger().to_arrow()
    parts = [table.replace_schema_metadata(None).cast(template.schema.remove_metadata()) for table in tables.values()]
    table = pa.concat_tables(parts).replace_schema_metadata(template.schema.metadata)
    # The rows only: nulls, a user listed twice, used budgets outside [0, the ledger's rho], trackers below
    # them. The metadata it reads is the continued configuration's; the snapshots' own configuration
    # was checked against this run's by _continued above.
    Ledger.from_arrow(table)
    return table, config, _snapshot_queries(pattern, files, metadata)


def whole_ledger(ledger_root: str, window: int) -> pa.Table:
    """The ledger every shard's snapshot of ``window`` under ``ledger_root`` (a job's
    ``<output>/ledger``) holds, delta chains rebuilt (:func:`_whole_snapshot`), sorted by user id,
    without metadata: what a job continuing from that window starts from. For audits and tests;
    unchecked otherwise (:func:`_previous_ledger` checks what a job continues)."""
    (result,) = FileSystems.match([_snapshot_glob(ledger_root, window)])
    pattern = _snapshot_glob(ledger_root, window)
    parts = []
    for meta in sorted(result.metadata_list, key=lambda m: m.path):
        _, _, shard = _snapshot_place(meta.path)
        table = _whole_snapshot(pattern, ledger_root, window, shard, store.read_parquet(meta.path))
        parts.append(table.replace_schema_metadata(None))
    return pa.concat_tables(parts).sort_by(USER_ID)


def publish_staged(pattern: str, releases: str) -> list[int]:
    """Publish what an earlier job committed but did not publish: a job lost after every shard's
    snapshot of window ``W`` was written, but before its release files were public, left those
    windows staged under its ``--output`` (:data:`STAGED_RELEASES`). Given ``W``'s snapshots as
    ``pattern`` (``--previous-ledger``), publish every staged window after the last one public under
    ``releases`` through ``W``, in window order, first write wins
    (:func:`renyi_stream.stream.engine.publication.publish_outbox`): ``W``'s snapshots hold the charges of every
    window through ``W``, so each of those answers has a durable ledger that charged its users.
    Returns the windows newly published (then ``W`` is the last released window, and the job
    continues from its snapshots as from any other's).

    Publishes nothing when ``pattern`` is not one job's snapshots of one window, when nothing is
    public yet (where the schedule began is then unknown, and a window before the first one staged
    would never be released: start the ledger anew, nothing of it was public), when a window from
    the last public one to ``W`` is not staged (it cannot be published, so ``W`` cannot become the
    last released: :func:`_previous_ledger` refuses ``W``'s snapshots, naming the window to continue
    from instead), or when the snapshots record another release root. RunRefused (nothing
    published) when the snapshots of ``W`` miss a shard: the charge is not durable. The windows
    are the earlier job's: published under its lineage claim (:func:`claim_lineage`, the run ids
    the snapshots record), LineageConflict (nothing published) when another run holds it."""
    if pattern.lower() == "none":
        return []
    (result,) = FileSystems.match([store.absolute(pattern)])
    places = {_snapshot_place(m.path) for m in result.metadata_list}
    if not places or None in places or len({(root, window) for root, window, _ in places}) != 1:
        return []  # not one job's snapshots of one window: _previous_ledger refuses them, saying why
    root, window, _ = next(iter(places))
    if not root.endswith("/ledger"):
        return []
    staging = store.join(root[:-len("/ledger")], STAGED_RELEASES)
    public = sorted(store.release_windows_present(releases))
    pending = list(range(public[-1] + 1, window + 1)) if public else []
    if not pending or not set(pending) <= store.release_windows_present(staging):
        return []
    _, _, files, tables = _read_snapshots(pattern, releases=releases, released=[*public, window])
    recorded = _recorded_config(pattern, files, {shard: _metadata(t) for shard, t in tables.items()})
    if store.absolute(recorded.releases) != releases:
        return []  # another root's ledger: _previous_ledger refuses it
    run, previous_run = snapshot_runs(pattern)  # the earlier job's windows: published under its claim
    claim_lineage(releases, run, previous_run)
    return list(publish_outbox(StagedReleases(staging, pending), PublicReleaseFiles(releases, run=run)).windows)


# --- crash recovery: the state folder's last commit marker -----------------------------------


def _window_of(path: str) -> int | None:
    """The window of a path below a ``window_id=<W>`` folder, None for another path."""
    match = re.search(r"/window_id=(-?[0-9]+)/", path.replace("\\", "/"))
    return None if match is None else int(match[1])


def _window_files(curator: str) -> dict[str, list[str]]:
    """Every file below a ``window_id=<W>`` folder of :data:`WINDOW_FOLDERS` in ``curator``, by folder."""
    found = {}
    for folder in WINDOW_FOLDERS:
        (result,) = FileSystems.match([store.join(curator, folder, "window_id=*", "**")])
        found[folder] = sorted(m.path for m in result.metadata_list if _window_of(m.path) is not None)
    return found


def job_identity(args: argparse.Namespace) -> dict[str, Any]:
    """What makes a launch a restart of the job that wrote a state folder (its :data:`STATE_FILE`):
    the same schedule (``--start``, ``--end``), source (``--replay`` files in order,
    ``--subscription``, or ``--kafka-topic`` and ``--bootstrap-servers``) and ``--previous-ledger``:
    the same command line, as an operator re-runs it after a crash."""
    return {"start": args.start, "end": args.end, "previous_ledger": args.previous_ledger,
            "replay": [store.absolute(path) for path in args.replay or ()], "subscription": args.subscription,
            "kafka_topic": args.kafka_topic, "bootstrap_servers": getattr(args, "bootstrap_servers", None)}


def _state(curator: str) -> dict[str, Any] | None:
    path = store.join(curator, STATE_FILE)
    return store.read_json(path) if FileSystems.exists(path) else None


def restarting(curator: str, args: argparse.Namespace) -> bool:
    """Whether this launch restarts the job whose state folder ``curator`` is: its
    :data:`STATE_FILE` records this launch's :func:`job_identity`."""
    state = _state(curator)
    return state is not None and state.get("job") == job_identity(args)


# --- the public lineage: which job may publish as the continuation of which ledger ------------
#: Schema metadata of every ledger snapshot: the run id of the job that wrote it (:data:`STATE_FILE`
#: records it) and of the job whose ledger that job continued (:data:`renyi_stream.queries.release_lineage.ORIGIN`
#: for a new ledger). A job continuing the snapshot is the successor of its ``SNAPSHOT_RUN``.
SNAPSHOT_RUN, SNAPSHOT_PREVIOUS_RUN = snapshot_key("run"), snapshot_key("previous_run")


def new_run_id() -> str:
    """A new job's run id: 48 random bits as 12 lowercase hex digits (public, like the distributed
    job's attempt ids: it only names a branch of the ledger)."""
    return secrets.token_hex(6)


def snapshot_runs(pattern: str) -> tuple[str | None, str | None]:
    """``(run, previous run)`` as the snapshots ``pattern`` matches record them
    (:data:`SNAPSHOT_RUN`, :data:`SNAPSHOT_PREVIOUS_RUN`); ``(None, None)`` for snapshots written
    before lineage was recorded, or when the files do not all record the same pair (then
    :func:`_previous_ledger` refuses them as not one job's snapshots)."""
    found = set()
    for path in _matched(store.absolute(pattern)):
        with FileSystems.open(path) as handle:
            meta = pq.read_schema(handle).metadata or {}
        found.add((meta.get(SNAPSHOT_RUN.encode()), meta.get(SNAPSHOT_PREVIOUS_RUN.encode())))
    if len(found) != 1 or None in next(iter(found)):
        return None, None
    run, previous = next(iter(found))
    return run.decode(), previous.decode()


def job_lineage(curator: str, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(run, previous run)`` of the job this launch is: a restart (:func:`restarting`) keeps the
    run id and parent its :data:`STATE_FILE` records (``(None, None)`` for a state folder from
    before lineage: unchecked, as snapshots without it); a new job draws a new run id
    (:func:`new_run_id`) and continues :data:`renyi_stream.queries.release_lineage.ORIGIN` (``--previous-ledger
    none``) or the run that wrote its ``--previous-ledger`` snapshots (None when they do not record
    it)."""
    state = _state(curator)
    if state is not None and state.get("job") == job_identity(args):
        return state.get("run"), state.get("previous_run")
    if args.previous_ledger.lower() == "none":
        return new_run_id(), lineage.ORIGIN
    return new_run_id(), snapshot_runs(args.previous_ledger)[0]


def check_lineage(releases: str, args: argparse.Namespace, run: str | None, previous_run: str | None, *,
                  restart: bool) -> None:
    """Refuse (RunRefused, naming both runs and the ledger to continue instead) a job that would
    fork the public lineage under ``releases`` (:mod:`renyi_stream.queries.release_lineage`): a new ledger on a
    root whose lineage another run started; a ``--previous-ledger`` that is not the public chain's
    (:func:`renyi_stream.queries.release_lineage.check_continuation`: another run already continued its ledger,
    or published as the successor of its parent, or published a window it charged); a restart
    whose parent another run continued publicly. Snapshots or state folders from before lineage
    are not checked."""
    if run is None:
        return
    if restart or args.previous_ledger.lower() == "none":
        holder = lineage.successor(releases, previous_run) if previous_run is not None else None
        if holder not in (None, run):
            if previous_run == lineage.ORIGIN:
                raise launch.RunRefused(
                    f"--previous-ledger none, but the releases under {releases} already continue a ledger started "
                    f"by run {holder}, not by this job (run {run}): continue from the last released window's "
                    "snapshots of that lineage")
            raise launch.RunRefused(
                f"run {previous_run}'s ledger was continued publicly under {releases} by run {holder}, not by this "
                f"job (run {run}): its releases would fork the ledger; continue from the last released window's "
                f"snapshots of run {holder}'s lineage")
        return
    parent, grandparent = snapshot_runs(args.previous_ledger)
    if parent is None:
        return
    root, _, _ = _snapshot_place(_matched(store.absolute(args.previous_ledger))[0]) or ("", 0, 0)
    charged = committed_windows(root[:-len("/ledger")]) if root.endswith("/ledger") else []
    try:
        lineage.check_continuation(releases, run=parent, previous_run=grandparent, charged=charged)
    except lineage.LineageConflict as exc:
        raise launch.RunRefused(f"--previous-ledger {args.previous_ledger!r} (written by run {parent}) is not the "
                                f"ledger of what is public: {exc}") from None


def claim_lineage(public: str, run: str | None, previous_run: str | None) -> None:
    """Claim run ``run`` the one public successor of ``previous_run``'s ledger under ``public``
    before any of its windows is published (:func:`renyi_stream.queries.release_lineage.claim`; idempotent for
    its holder, so a restarted job keeps its claim). LineageConflict, naming both runs, when
    another run holds it: then nothing of ``run`` may be published. Nothing to claim for a job or
    snapshots from before lineage (either id None)."""
    if run is not None and previous_run is not None:
        lineage.claim(public, previous_run, run)


def _refuse_another_jobs_output(curator: str, args: argparse.Namespace) -> None:
    """RunRefused when ``curator`` is the state folder of a job other than this launch's: its
    commits are that job's ledger, and this job's windows would mix with them."""
    state = _state(curator)
    if state is not None and state.get("job") != job_identity(args):
        theirs, mine = state.get("job") or {}, job_identity(args)
        differ = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        raise launch.RunRefused(
            f"--output {curator} is the state folder of another job ({store.join(curator, STATE_FILE)}: its "
            f"{', '.join('--' + k.replace('_', '-') for k in differ)} differ from this launch's): restart that job "
            "with exactly its command line, or give this job a new --output (and that job's last committed "
            "window's snapshots as --previous-ledger)")


def _refuse_an_output_from_before_commit_markers(curator: str) -> None:
    """RunRefused when ``curator`` holds ledger snapshots but no :data:`STATE_FILE`: a job of an
    earlier version wrote them, without commit markers, so which window is complete is unknown."""
    if _state(curator) is None and _window_files(curator)["ledger"]:
        raise launch.RunRefused(
            f"--output {curator} holds ledger snapshots of a job from before commit markers, which this version "
            "cannot tell complete from a crashed job's: give a new --output and the last released window's "
            f"snapshots as --previous-ledger ('{_snapshot_glob(store.join(curator, 'ledger'), 0)}' for window 0)")


def last_committed(curator: str) -> int | None:
    """The last window committed in the state folder ``curator`` (its last commit marker), None
    when none is."""
    windows = committed_windows(curator)
    return windows[-1] if windows else None


def recover(curator: str, releases: str) -> tuple[int | None, list[int], int]:
    """Bring the state folder ``curator`` (a job's ``--output``) to its last commit, as a job
    restarted into it does before it builds anything: returns ``(last committed window or None,
    windows published now, dead-branch files removed)``.

    1. The last commit marker names the last complete window ``C`` (:class:`CommitWindows` writes
       markers in window order, each after every shard's snapshot and records of its window and
       its staged releases).
    2. Every committed window not yet public under ``releases`` is published, in window order,
       first write wins (:func:`renyi_stream.stream.engine.publication.publish_outbox`): each has its ledger
       snapshots, so its answer has a durable ledger that charged its users.
    3. The files of windows after ``C`` (snapshots, staged releases, books, duplicates)
       are the crashed job's dead branch: removed, never restored nor published (no marker names
       them, so none of them is public). Their windows are charged again from ``C``'s snapshots.

    Publishing first claims the job's place in the public lineage (:func:`claim_lineage`, the run
    ids its :data:`STATE_FILE` records), so a restarted job keeps its claim, and one whose claim
    another run holds publishes nothing (LineageConflict).

    Call it only for a restart (:func:`restarting`): the folder is then this job's."""
    last = last_committed(curator)
    committed = committed_windows(curator)
    pending = sorted(set(committed) - store.release_windows_present(releases))
    state = _state(curator) or {}
    run = state.get("run")
    if pending:  # this job's claim first (LineageConflict when another run holds it: nothing published)
        claim_lineage(releases, run, state.get("previous_run"))
    published = list(publish_outbox(StagedReleases(store.join(curator, STAGED_RELEASES), pending),
                                    PublicReleaseFiles(releases, run=run)).windows) if pending else []
    dead = [path for paths in _window_files(curator).values() for path in paths
            if last is None or _window_of(path) > last]
    if dead:
        FileSystems.delete(dead)
    return last, published, len(dead)


def _matched(pattern: str) -> list[str]:
    (result,) = FileSystems.match([pattern])
    return sorted(m.path for m in result.metadata_list)


def previous_running_state(pattern: str) -> tuple[dict[str, pa.Table], dict[str, pa.Table],
                                                   dict[str, EstimateContinuation]]:
    """The running totals' state beside the ledger snapshots ``pattern`` (``--previous-ledger``, or
    a restarted job's own last committed window), as :class:`StreamingReleases` continues it:
    ``(per-user prepaid rows, release states, where the estimates continue from)``, each by running
    query id. The
    prepaid rows are every shard's at that window (:class:`WritePrepaid`; a shard whose snapshot is
    a delta rebuilt from the full prepaid file of its base window and the deltas after it,
    :func:`_shard_prepaid`) concatenated per query (re-split by this job's ``--shards``), the
    release states and estimate decoders those staged with the window (:class:`StageWindowFile`).
    Empty for ``none`` or snapshots outside a job's ``--output`` (a copy made by
    :func:`record_snapshot_parameters`): a running query they should have continued is then
    refused by the schedule rule (:func:`renyi_stream.stream.engine.shard_state.refuse_running_gaps`).
    RunRefused for a file without its query id, shards disagreeing on a query's metadata, a prepaid
    file of a window missing, doubled or of other rows than its ledger snapshot records
    (:data:`PREPAID_ROWS`), prepaid rows other than the users the shards' ledger snapshots record
    (:data:`PREPAID_USERS`: a lost file would restart its users' prepaid charges from nothing), or
    two release states of one query; the states themselves are checked when restored
    (:class:`renyi_stream.stream.engine.running.PrepaidUsers`, :class:`renyi_stream.stream.engine.running.RunningRelease`)."""
    if pattern.lower() == "none":
        return {}, {}, {}
    snapshots = _matched(store.absolute(pattern))
    places = {_snapshot_place(path) for path in snapshots}
    windows = {(root, window) for root, window, _ in places - {None}}
    if len(windows) != 1 or not next(iter(windows))[0].endswith("/ledger"):
        return {}, {}, {}
    root, window = windows.pop()
    base = root[: -len("/ledger")]
    parts: dict[str, list[pa.Table]] = {}
    recorded: dict[str, int] = {}
    for path in snapshots:
        meta = _schema_metadata(path)
        text = meta.get(PREPAID_USERS)
        for query_id, rows in (json.loads(text) if text else {}).items():
            recorded[query_id] = recorded.get(query_id, 0) + int(rows)
        place = _snapshot_place(path)
        if place is not None:
            for query_id, table in _shard_prepaid(pattern, base, window, place[2], meta).items():
                parts.setdefault(query_id, []).append(table)
    prepaid = {}
    for query_id, tables in sorted(parts.items()):
        if any(t.schema.metadata != tables[0].schema.metadata for t in tables):
            raise launch.RunRefused(f"the prepaid rows of running query {query_id!r} beside --previous-ledger "
                                    f"{pattern!r} disagree between shards on the query's strategy or schedule")
        prepaid[query_id] = pa.concat_tables(tables)
    found = {q: t.num_rows for q, t in prepaid.items() if t.num_rows}
    if found != {q: n for q, n in recorded.items() if n}:
        raise launch.RunRefused(f"the prepaid rows beside --previous-ledger {pattern!r} hold {found} users per running "
                                f"query, its ledger snapshots record {recorded}: a prepaid file is missing or extra, "
                                "and a lost row would restart its user's prepaid charge from nothing")
    releases, estimates = {}, {}
    for path in _matched(store.join(base, RUNNING_STATE, f"window_id={window}", "*.parquet")):
        try:
            query_id, table, continuation = running_state_of(store.read_parquet(path))
        except ValueError as exc:
            raise launch.RunRefused(f"{path}: {exc}") from None
        if query_id in releases:
            raise launch.RunRefused(f"window {window} beside --previous-ledger {pattern!r} holds two release "
                                    f"states of running query {query_id!r}")
        try:  # the estimates continue exactly where the release state does, or the job does not start
            restored = RunningRelease.from_arrow(table)
            continuation.check(restored.start_window, restored.next_window)
        except ValueError as exc:
            raise launch.RunRefused(f"{path}: running query {query_id!r}: {exc}") from None
        releases[query_id], estimates[query_id] = table, continuation
    return prepaid, releases, estimates


def _schema_metadata(path: str) -> dict[str, str]:
    """A Parquet file's schema metadata, decoded, read from its footer only."""
    with FileSystems.open(path) as handle:
        return {k.decode(): v.decode() for k, v in (pq.read_schema(handle).metadata or {}).items()}


def _prepaid_files(pattern: str, base: str, window: int, shard: int) -> dict[str, pa.Table]:
    """Shard ``shard``'s prepaid files of ``window`` in the job folder ``base``, by query id, each
    without its query id and base window in its metadata and with its kind (:data:`SNAPSHOT_KIND`:
    ``full``, also for a file written before prepaid deltas, or ``delta``). RunRefused for a file
    that records no query id, or two files of one query."""
    found: dict[str, pa.Table] = {}
    for path in _matched(store.join(base, PREPAID, f"window_id={int(window)}", f"shard={int(shard)}", "*.parquet")):
        table = store.read_parquet(path)
        meta = dict(table.schema.metadata or {})
        query_id = meta.pop(RUNNING_QUERY_ID.encode(), None)
        if query_id is None:
            raise launch.RunRefused(f"{path} (the prepaid rows beside --previous-ledger {pattern!r}) records no "
                                    f"{RUNNING_QUERY_ID}: it was not written by this job")
        if query_id.decode() in found:
            raise launch.RunRefused(f"shard {shard} has two prepaid files of running query {query_id.decode()!r} in "
                                    f"window {window} beside --previous-ledger {pattern!r}: they are not one job's")
        kind = meta.pop(SNAPSHOT_KIND.encode(), b"full").decode()
        meta.pop(SNAPSHOT_BASE.encode(), None)
        found[query_id.decode()] = table.replace_schema_metadata({**meta, SNAPSHOT_KIND.encode(): kind.encode()})
    return found


def _shard_prepaid(pattern: str, base: str, window: int, shard: int, meta: dict[str, str]) -> dict[str, pa.Table]:
    """Shard ``shard``'s whole prepaid rows at ``window`` by running query, from its prepaid files in
    the job folder ``base``: those of ``window`` when its ledger snapshot (metadata ``meta``) is full;
    for a delta, the full files of its base window (:data:`SNAPSHOT_BASE`) with the deltas of every
    window after it through ``window`` over them (:func:`renyi_stream.stream.engine.shard_state.merge_deltas`),
    as the shard's own state is rebuilt (:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.restore`).
    Each window's files are checked against its ledger snapshot's :data:`PREPAID_ROWS` (one file per
    query with rows, that many rows; recorded from this version on) and their kind against the chain:
    RunRefused naming the window and shard otherwise, since a lost delta would restore its users'
    prepaid rows of an earlier window, and their later charges would be too small."""
    kind = meta.get(SNAPSHOT_KIND, "full")
    chain = [(int(window), meta)]
    if kind == "delta":
        first = int(meta[SNAPSHOT_BASE])
        ledger = store.join(base, "ledger")
        chain = [(w, _schema_metadata(_one_snapshot(pattern, ledger, w, shard, window))) for w in range(first, window)]
        chain.append((int(window), meta))
    files = {}
    for position, (w, recorded_meta) in enumerate(chain):
        files[w] = _prepaid_files(pattern, base, w, shard)
        expected_kind = "full" if position == 0 else "delta"
        wrong = sorted(q for q, t in files[w].items() if _metadata(t).get(SNAPSHOT_KIND) != expected_kind)
        if wrong:
            raise launch.RunRefused(f"shard {shard}'s prepaid file(s) of running query {wrong[0]!r} in window {w} beside "
                                    f"--previous-ledger {pattern!r} are not the {expected_kind} rows its ledger "
                                    "snapshot's chain needs")
        text = recorded_meta.get(PREPAID_ROWS)
        if text is not None:
            rows = {q: int(n) for q, n in json.loads(text).items() if int(n)}
            held = {q: t.num_rows for q, t in files[w].items() if t.num_rows}
            if held != rows:
                raise launch.RunRefused(f"shard {shard}'s prepaid files of window {w} beside --previous-ledger "
                                        f"{pattern!r} hold {held} rows per running query, its ledger snapshot records "
                                        f"{rows}: a prepaid file is missing or extra, and a lost row would restore its "
                                        "user's prepaid charge of an earlier window")
    first_window, *later = [w for w, _ in chain]
    out = {}
    for query_id in sorted({q for tables in files.values() for q in tables}):
        full = files[first_window].get(query_id)
        deltas = [(w, files[w][query_id]) for w in later if query_id in files[w]]
        table = merge_deltas(running_base(full, deltas, query_id), deltas) if deltas else full
        meta_out = dict(table.schema.metadata or {})
        meta_out.pop(SNAPSHOT_KIND.encode(), None)
        out[query_id] = table.replace_schema_metadata(meta_out)
    return out


def _one_snapshot(pattern: str, ledger: str, window: int, shard: int, of_window: int,
                  rebuilt: str = "prepaid rows") -> str:
    """The path of shard ``shard``'s one ledger snapshot of ``window`` under ``ledger``, a window of
    the delta chain of ``of_window``'s; RunRefused when there is not exactly one, saying that the
    shard's ``rebuilt`` (its ledger, its prepaid rows) cannot be rebuilt."""
    (result,) = FileSystems.match([store.join(ledger, f"window_id={int(window)}", f"shard={int(shard)}", "*.parquet")])
    if len(result.metadata_list) != 1:
        raise launch.RunRefused(
            f"--previous-ledger {pattern!r}: shard {shard}'s snapshot of window {of_window} is a delta, but window "
            f"{window} of its chain has {len(result.metadata_list)} snapshot file(s) of that shard under {ledger}, "
            f"not one: the shard's {rebuilt} cannot be rebuilt")
    return result.metadata_list[0].path


def _snapshot_queries(pattern: str, files: dict[int, str], metadata: dict[int, dict[str, str]]) -> dict[str, int] | None:
    """``{query_id: first window answered}`` as the snapshots record it (:data:`SNAPSHOT_QUERIES`),
    None when none does (written before it was recorded). RunRefused for a malformed record."""
    found: dict[str, int] = {}
    recorded = False
    for shard, meta in sorted(metadata.items()):
        text = meta.get(SNAPSHOT_QUERIES)
        if text is None:
            continue
        recorded = True
        try:
            found.update({str(q): int(w) for q, w in json.loads(text).items()})
        except (ValueError, TypeError, AttributeError):
            raise launch.RunRefused(f"--previous-ledger {pattern!r}: {files[shard]} records a malformed "
                                    f"{SNAPSHOT_QUERIES}: it was edited") from None
    return found if recorded else None


def record_snapshot_parameters(pattern: str, destination: str, argv: Sequence[str]) -> list[str]:
    """Copy snapshots written before the job recorded its parameters to a new ledger root
    ``destination``, recording those of ``argv``; returns the paths written. Give the copy
    (``<destination>/window_id=<W>/*/*.parquet``) as the next job's ``--previous-ledger``.

    ``argv`` must be **the earlier job's arguments**, as it was launched (the options of
    ``python -m renyi_stream.pipelines.streaming``): what is recorded is what every later job is checked
    against, and the snapshots can confirm only part of it. Checked, RunRefused otherwise: the
    snapshots are every shard's of the last window released under ``argv``'s
    ``--releases-parquet`` (as :func:`_previous_ledger` checks them), ``destination`` is not
    their ledger root (a snapshot is never rewritten), and ``argv`` gives the budget (rho, up to
    another version's last bits: the copy then records the snapshots' own budget and the noise std
    it gives), tracker step and id type of the snapshots' ledgers and any parameter they already
    record. Not checkable: a delta, epsilon and accounting giving the same rho, the norm budget,
    the key and the window length."""
    args, _ = parse_args(argv)
    spec = WindowSpec(length_seconds=launch.window_seconds(args.window))
    _, fingerprint, _ = key_fingerprint(args)
    releases = store.absolute(args.releases_parquet)
    config = LedgerConfig.from_promise(epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget,
                                       accounting=args.accounting, id_type=args.id_type or ID_TYPE,
                                       key_fingerprint=fingerprint,
                                       window=spec, n_shards=args.shards, releases=releases)
    root, window, files, tables = _read_snapshots(pattern, releases=releases,
                                                  released=sorted(store.release_windows_present(releases)))
    if store.absolute(destination) == root:
        raise launch.RunRefused(f"the copy's root {destination} is the snapshots' own: give a new ledger root")
    budgets = {_metadata(table).get("budget") for table in tables.values()}
    if len(budgets) == 1 and None not in budgets:
        # The budget is the evidence that argv is the earlier job's: it must be argv's calibration up to
        # another version's last bits (a relative 1e-9 down; resume's float rounding up). Then the copy
        # records the budget the snapshots were charged against, as a continuing job keeps it.
        recorded = _float_or_none(next(iter(budgets)))
        if recorded is not None and config.rho * (1.0 - 1e-9) <= recorded:
            try:
                config = config.resumed(recorded, where=f"{pattern!r}")
            except LedgerConfigError as exc:
                raise launch.RunRefused(str(exc)) from None
    config = replace(config, n_shards=len(files))  # the earlier job's: every one of its shards is here
    text = {key.decode()[len(SNAPSHOT_PREFIX):]: value.decode() for key, value in config.to_snapshot_metadata().items()}
    own = (("budget", "rho"), ("tracker_step", "tracker_step"), ("id_type", "id_type"))  # Ledger.to_arrow's
    for shard, table in tables.items():
        meta = _metadata(table)
        keys = [*own, *((snapshot_key(name), name) for name in text if snapshot_key(name) in meta)]
        differ = [(key, name) for key, name in keys
                  if key not in meta or _compared(name, meta[key]) != _compared(name, text[name])]
        if differ:
            raise launch.RunRefused(
                f"{files[shard]} records {({key: meta.get(key) for key, _ in differ})}, these arguments give "
                f"{({key: text[name] for key, name in differ})}: they are not the arguments of the job that wrote it")
    recorded_config = config.to_snapshot_metadata()
    return [_write_named(store.absolute(destination), *_ledger_file((shard, window, table), recorded=recorded_config))
            for shard, table in sorted(tables.items())]


def build(p: beam.Pipeline, args: argparse.Namespace,
          messages: beam.pvalue.PCollection | None = None) -> dict[str, Any]:
    """Check the arguments and apply the streaming graph to ``p``; returns its PCollections.
    Raises :class:`renyi_stream.pipelines.distributed.job.RunRefused` (nothing built) when a check fails, and
    ValueError naming the option when the source options do not fit together.

    ``messages``, when given, is a PCollection that replaces the source's read step, and only that
    step: Kafka records (as ``ReadFromKafka(with_metadata=True)`` yields them) with
    ``--kafka-topic``, Pub/Sub messages with ``--subscription``, ``(name, payload)`` pairs with
    ``--replay``. Everything after the read is built exactly as for the real source, so a test
    can run the Kafka path without a Java expansion service."""
    _check_source(args)
    # The job's place in the public lineage (main's job_lineage; a graph built without main has none).
    runs = tuple(getattr(args, "lineage", None) or (None, None))
    spec = WindowSpec(length_seconds=launch.window_seconds(args.window))
    start, end = launch.parse_day("start", args.start, spec), launch.parse_day("end", args.end, spec)
    if start > end:
        raise launch.RunRefused(f"start must not be after end, got {args.start} > {args.end}")
    Policy(args.policy)
    columns = [c for c in (args.columns or "").split(",") if c]
    key_path, fingerprint, _ = key_fingerprint(args)
    # A job restarted into its --output continues from the last window committed there (recover):
    # that window's snapshots are the ledger, and this schedule's windows through it are charged.
    curator = store.absolute(args.output)
    _refuse_an_output_from_before_commit_markers(curator)
    resumed = last_committed(curator) if restarting(curator, args) else None
    if resumed is not None and resumed > end:
        raise launch.RunRefused(f"--output {curator} has committed window {resumed}, after this job's --end "
                                f"{args.end}: its ledger is ahead of this schedule; give a new --output")
    previous_ledger = (_snapshot_glob(store.join(curator, "ledger"), resumed) if resumed is not None
                       else args.previous_ledger)
    # The id type is the ledger's for life: declared (a new ledger must), else a continuing ledger's
    # own (its snapshots record it).
    new_ledger = previous_ledger.lower() == "none"
    try:
        declared_input = launch.declared_contract(args)
    except ValueError as exc:
        raise launch.RunRefused(str(exc)) from None
    if declared_input is not None and columns:
        raise launch.RunRefused("give the indicator columns either declared (--column, --category, --schema) or as "
                                "--columns, not both")
    if declared_input is None and new_ledger:
        raise launch.RunRefused(f"a new ledger (--previous-ledger none) needs its input contract: {declaration_hint()}")
    id_type = declared_input.id_type if declared_input else args.id_type
    releases = store.absolute(args.releases_parquet)
    released = sorted(store.release_windows_present(releases))
    # Windows this job charged before a restart are its own; rows of them are not late, but re-delivered.
    own = resumed if resumed is not None and resumed >= start else start - 1
    wanted = LedgerConfig.from_promise(epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget,
                                       accounting=args.accounting, id_type=id_type or ID_TYPE,
                                       key_fingerprint=fingerprint, window=spec, n_shards=args.shards,
                                       releases=releases, contract=declared_input)
    previous, config, answered = _previous_ledger(previous_ledger, wanted, released=released,
                                                  id_type_declared=id_type is not None)
    # Only the public chain's ledger may be continued (a fork's windows could never be published).
    check_lineage(releases, args, *runs, restart=restarting(curator, args))
    prepaid, release_states, estimates = previous_running_state(previous_ledger)
    id_type = config.id_type
    _refuse_another_jobs_output(curator, args)
    if released and max(released) > own:
        raise launch.RunRefused(f"window {max(released)} under {releases} is already released; start after it"
                                + (f" (this job committed windows {start}..{own} in --output {curator})"
                                   if own >= start else ""))
    contract = config.contract  # declared by this job or recorded by the ledger's snapshots
    if contract is not None:
        if columns:
            raise launch.RunRefused(f"--columns is for ledgers started before declared contracts; this ledger "
                                    f"records its contract (columns {list(contract.names)}): leave --columns out")
        columns = list(contract.numeric)
    queries = _launch_queries(releases, columns=contract or columns, start=start, released=released,
                              answered=answered)
    plan = QueryPlan(tuple(PlannedQuery(r.query, r.effective_from, r.retired_from if r.retired_from is not None
                                        and r.retired_from <= end else None) for r in queries.plan(start, end)))
    try:
        tx.refuse_running_continuation(plan, release_states, range(own + 1, end + 1), stored_where="beside --previous-ledger")
        # No header to read at launch: the columns are those --columns names (numbers) and those the
        # queries read, as they read them; a column read both ways is refused.
        reads = [e.query for e in plan.entries]
        header = declared_header(contract) if contract is not None else pa.schema(
            [(c, pa.float64()) for c in columns]
            + [(c, pa.null()) for c in sorted((numeric_reads(reads) | category_reads(reads)) - set(columns))])
        kinds = plan_columns(reads, reads, header, declared_types=True,
                             where="the declared contract" if contract is not None else
                             "the messages (--columns and the registered queries)", parsed=columns)
    except ValueError as exc:
        raise launch.RunRefused(str(exc)) from None
    indicators, categories = list(kinds.numeric), sorted(category_reads(reads))
    # The ledger's names of the id and time columns: every message and replayed file is read by them.
    keys = contract.keys if contract is not None else DEFAULT_KEYS
    # Every query this ledger has answered, with the first window it answered it in (the snapshots
    # record those answered through their window).
    first_answered = dict(answered or {})
    for entry in plan.entries:
        first_answered.setdefault(entry.query_id, max(entry.first_window, start))

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
        missing = [path for path in args.replay if not FileSystems.exists(path)]
        if missing:
            raise launch.RunRefused(f"--replay: no such file: {', '.join(missing[:5])}"
                                    + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))
        refuse_unreplayable(args.replay, window=spec, indicator_columns=indicators, category_columns=categories,
                            id_type=id_type, contract=contract)
        messages = (p | "Replay" >> beam.Create(list(zip(replay_names(args.replay), args.replay)))
                    | "ReadReplayed" >> beam.Map(_replayed_file, keys).with_output_types(Tuple[str, bytes]))
    stamp = not (args.subscription or args.kafka_topic)  # files carry no event time; the sources do
    decoded = messages | "DecodeAndValidate" >> beam.ParDo(
        DecodeAndValidate(window=spec, indicator_columns=indicators, stamp=stamp, id_type=id_type,
                          category_columns=categories, numbers=replay_numbers(args.replay or ()), keys=keys)
    ).with_outputs("dead", "read", main="valid")
    out = StreamingReleases(
        window=spec, start_window=start, end_window=end, plan=plan, indicator_columns=indicators,
        noise_std=config.noise_std, policy=args.policy, budget=config.rho, id_type=config.id_type,
        tracker_step=config.tracker_step, n_shards=config.n_shards, key_path=key_path, accounting=config.accounting,
        key_fingerprint=config.key_fingerprint, ledger_id=config.ledger_id,
        previous_ledger=previous if previous.num_rows else None,
        released=[w for w in released if w < start], snapshot_every_window=True,
        resumed_through=own if own >= start else None, window_records=True,
        compact_every=args.full_snapshot_every, previous_running=prepaid, previous_release=release_states,
        previous_estimates=estimates, progress=bool(getattr(args, "progress", False)))
    graph = decoded.valid | "StreamingReleases" >> out
    # One release row per coordinate of each active query, and one state per active running query.
    expected = {w: sum(e.query.dim + (e.kind == "running") for e in plan.active(w)) for w in range(start, end + 1)}
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
                                                        queries=first_answered, plan=recorded_plan(plan.entries),
                                                        runs=runs)))
    # A shard's books record (its counts inside) and duplicates of a window are written together
    # (WriteWindowRecords).
    record_files = graph["books"] | "WriteWindowRecords" >> beam.ParDo(WriteWindowRecords(curator))
    # A window goes public only once it is committed: staged, and every shard's snapshot and records of
    # it written; windows are committed in order, under one key (CommitWindows).
    written = ledger_files | "SnapshotWritten" >> beam.Map(_snapshot_written).with_output_types(Tuple[int, Any])
    with_prepaid = bool(plan.running or prepaid)  # the filter then reports every window's prepaid rows
    prepaid_files = (graph["prepaid"] | "WritePrepaid" >> beam.ParDo(WritePrepaid(curator))
                     .with_output_types(Tuple[int, Any]))
    release_files = ((staged, written, record_files, prepaid_files)
                     | "StagedSnapshotsAndRecords" >> beam.Flatten().with_output_types(Tuple[int, Any])
                     | "OneKey" >> beam.Map(lambda event: (0, event)).with_output_types(Tuple[int, Any])
                     | "CommitWindows" >> beam.ParDo(
                         CommitWindows(curator, releases, config.n_shards, first_window=own + 1, end_window=end,
                                       ledger_id=config.ledger_id, prepaid=with_prepaid, run=runs[0],
                                       previous_run=runs[1])))
    read_files = decoded.read | "WriteRead" >> beam.ParDo(WriteTable(store.join(curator, "read")))
    return {"releases": graph["releases"], "staged": staged, "release_files": release_files, "dead_files": dead_files,
            "ledger_files": ledger_files, "record_files": record_files, "read_files": read_files, "dead": dead,
            "queries": queries, "contract": contract, "config": config, "resumed": resumed}


def _launch_queries(releases: str, *, columns: "Sequence[str] | InputContract", start: int,
                    released: Sequence[int], answered: dict[str, int] | None) -> LaunchQueries:
    """The query catalogue under ``releases`` as this job launches with it
    (:func:`renyi_stream.queries.catalogue.queries_at_launch`, nothing written): queries registered into
    windows already released (the ledger charged them) but never ``answered`` move to the first
    window after them, and on a catalogue with no query the per-window sums of ``columns`` are
    registered from ``start`` (a declared contract's: :func:`renyi_stream.queries.registration.contract_defaults`).
    RunRefused when there is nothing to answer, the catalogue cannot be read or a default cannot be
    registered."""
    catalogue = ReleaseCatalogue(releases)
    if isinstance(columns, InputContract):  # a root keeps its ledger's contract: refused before anything runs
        catalogue.check_input_contract(columns)
    try:
        state = catalogue.read()
        if isinstance(columns, InputContract):
            defaults = [] if state.registrations else contract_defaults(columns)
        elif not state.registrations and not columns:
            raise ValueError("it has no query and --columns names no column to answer: register the queries "
                             f"(renyi-stream query add --releases-parquet {releases} ...) or give --columns")
        else:
            defaults = default_queries(list(columns))
        return queries_at_launch(state, defaults=defaults, first_window=start,
                                 processed_through=max(released) if released else None,
                                 answered=None if answered is None else set(answered),
                                 last_released=catalogue.last_released_window())
    except ValueError as exc:
        raise launch.RunRefused(f"the query catalogue under {releases}: {exc}") from None


def _record_queries(releases: str, queries: LaunchQueries, contract: InputContract | None = None,
                    config: LedgerConfig | None = None) -> list[str]:
    """Write the catalogue changes the job launches with (:meth:`renyi_stream.queries.catalogue.ReleaseCatalogue.record_launch`)
    and the ledger's input ``contract`` beside them, once (:meth:`~renyi_stream.queries.catalogue.ReleaseCatalogue.record_input_contract`),
    and return them in words. CatalogueChanged when the catalogue changed since :func:`build` read
    it; ContractError, nothing written, when the root records another contract."""
    catalogue = ReleaseCatalogue(releases)
    recorded = contract is not None and catalogue.record_input_contract(contract)
    if config is not None:  # the public promise, for reports over the root
        catalogue.record_promise(epsilon=config.epsilon, delta=config.delta, accounting=config.accounting,
                                 norm_budget=config.norm_budget)
    catalogue.record_launch(queries)
    first = {r.query_id: r.effective_from for r in queries.registrations}
    return ((["recorded the ledger's input contract beside the releases"] if recorded else [])
            + [f"registered the default query {q} from window {first[q]} (the catalogue had no query)"
             for q in queries.registered]
            + [f"query {q!r} was registered from window {old}, which this ledger had already released without it; "
               f"it now starts at window {new}" for q, old, new in queries.moved])


def books(curator: str) -> dict[str, Any]:
    """The row balance of a streaming job's curator output ``curator`` (its ``--output``), from the
    files it wrote, as every job records it (:meth:`renyi_stream.stream.engine.row_balance.RowBalance.totals`):
    ``rows_read`` (every message's rows, ``read/``), ``admitted``, ``clipped`` and ``dropped``
    (the shards' per-window books records in the commit markers, :func:`books_records`), ``rejected`` and ``late`` (``dead/``, by
    reason), and ``balanced``: whether the balance holds (:attr:`RowBalance.balanced`) and every
    shard's books balanced at every window it charged (the same records). Exact counts: curator only.

    Complete once the job has charged its last window and read its last message (a replay, or a
    drained stream); earlier, rows in flight or buffered for later windows are not yet counted."""
    def tables(folder: str) -> list[pa.Table]:
        return _curator_tables(curator, folder)

    def total(parts: list[pa.Table], column: str) -> int:
        return int(sum(pc.sum(t.column(column)).as_py() or 0 for t in parts if column in t.column_names))

    read, dead, shard_books = tables("read"), tables("dead"), books_records(curator)
    balance = RowBalance.of(rows_read=total(read, "rows_read"),
                            statuses={name: total([shard_books], name) for name in STATUS_NAMES},
                            reasons=reason_counts(dead))
    shards_balanced = pc.all(pc.equal(shard_books.column("balanced"), 1)).as_py() is not False
    return {**balance.totals(), "balanced": bool(balance.balanced and shards_balanced)}


def curator_summary(curator: str, balance: dict[str, Any] | None = None) -> list[str]:
    """What a finished run says to the curator about its rows and messages, from the files it wrote
    under ``curator`` (its ``--output``): the row books (``balance``, :func:`books`, read when not
    given), the messages read, and the dead letters by reason, each with its rows and the messages
    they came from (an ``undecodable_message`` is a message dead-lettered whole, one row read). Exact
    counts, so the lines open with :data:`renyi_stream.stream.private_files.CURATOR_ONLY_NOTICE`, and
    ``main`` prints them only without ``--quiet``: never public, never at INFO, never a Beam counter
    (invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)). Counted by Arrow, not row by row."""
    balance = books(curator) if balance is None else balance
    read = _curator_tables(curator, "read")
    messages = sum(t.num_rows for t in read)
    dead = [t.select(["source", "reason"]) for t in _curator_tables(curator, "dead") if t.num_rows]
    lines = [CURATOR_ONLY_NOTICE,
             f"rows read {balance['rows_read']:,} = admitted {balance['admitted']:,} + clipped {balance['clipped']:,} "
             f"+ dropped {balance['dropped']:,} + rejected {balance['rejected']:,} + late {balance['late']:,}"
             f"  [{'balanced' if balance['balanced'] else 'MISMATCH'}]"]
    if not dead:
        return lines + [f"messages read {messages:,}; dead letters: none"]
    letters = pa.concat_tables(dead)
    by_reason = letters.group_by("reason").aggregate([("source", "count"), ("source", "count_distinct")])
    with_letters = len(pc.unique(letters.column("source")))
    lines.append(f"messages read {messages:,}; {with_letters:,} of them dead-lettered whole or in part, by reason:")
    for row in sorted(by_reason.to_pylist(), key=lambda r: r["reason"]):
        rows, sources = int(row["source_count"]), int(row["source_count_distinct"])
        if row["reason"] == DeadLetterReason.UNDECODABLE_MESSAGE.value:
            lines.append(f"  {row['reason']}: {sources:,} message(s), each dead-lettered whole")
        else:
            lines.append(f"  {row['reason']}: {rows:,} row(s) of {sources:,} message(s)")
    return lines


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


def _private_copy(source: str, destination: Path) -> bool:
    """Copy the folder ``source`` (a local path or a URI pyarrow reaches) to the local
    ``destination`` as curator files: every folder made ``0700``, every file created ``0600``
    from its first byte (``O_CREAT | O_EXCL``), whatever the umask; False, nothing copied, when
    there is no such folder. A dry run's scratch copy of ``--output`` is then what the job's
    own files are, so the preview of a restart reads it as the restart reads the real folder,
    instead of refusing its own copy as loose (issue 37). A local file that group or others may
    read keeps that mode in the copy (inside the ``0700`` scratch folder nobody else may enter):
    the preview refuses it as the real job refuses the real file, naming the real path and mode."""
    source_fs, where = filesystem(source)
    if source_fs.get_file_info(where).type != pafs.FileType.Directory:
        return False
    local = isinstance(source_fs, pafs.LocalFileSystem)
    make_private_dirs(destination)
    os.chmod(destination, 0o700)
    entries = source_fs.get_file_info(pafs.FileSelector(where, recursive=True))
    for entry in sorted(entries, key=lambda e: e.path):
        target = destination / PurePosixPath(entry.path).relative_to(PurePosixPath(where))
        if entry.type == pafs.FileType.Directory:
            make_private_dirs(target)
        elif entry.type == pafs.FileType.File:
            make_private_dirs(target.parent)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as sink, source_fs.open_input_stream(entry.path) as stream:
                while chunk := stream.read(1 << 20):
                    sink.write(chunk)
            loose = os.stat(entry.path).st_mode & 0o077 if local else 0
            if loose:
                os.chmod(target, 0o600 | loose)
    return True


def dry_run(argv: list[str], args: argparse.Namespace, beam_args: list[str], prog: str) -> int:
    """``--dry-run``: the job itself, on the DirectRunner, into a ``0700`` scratch folder holding a
    private copy of the release root and of ``--output`` (:func:`_private_copy`: files ``0600``,
    folders ``0700``, as the job's own, so a restart previews the restart), with the root
    the ledger's snapshots record read as the copy (:data:`_PREVIEWED_ROOT`). Prints the windows
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
        token = _PREVIEWED_ROOT.set((real_root, str(public)))
        try:
            with contextlib.redirect_stderr(said):
                status = main(inner, prog=prog)
        finally:
            _PREVIEWED_ROOT.reset(token)
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
        # The job's place in the public lineage (checked by build, after the ledger's own checks).
        args.lineage = job_lineage(store.absolute(args.output), args)
        # An earlier job lost between a window's snapshots and its publication left it staged.
        caught_up = publish_staged(args.previous_ledger, store.absolute(args.releases_parquet))
        if caught_up:
            print(f"[streaming] published {len(caught_up)} window(s) an earlier job committed but had not "
                  f"published: {caught_up[:5]}", file=sys.stderr)
        # This job restarted into its --output after a crash: publish what it committed, drop the rest.
        resumed, published, dropped = (recover(store.absolute(args.output), store.absolute(args.releases_parquet))
                                       if restarting(store.absolute(args.output), args) else (None, [], 0))
        if resumed is not None:
            print(f"[streaming] resuming from window {resumed}, the last committed in --output "
                  f"{store.absolute(args.output)}" + (f"; published {published[:5]}, committed before a crash"
                                                      if published else "")
                  # Not how many files: which ones a shard wrote (duplicates) depends on its rows.
                  + ("; removed the files of uncommitted windows" if dropped else ""), file=sys.stderr)
        elif dropped:
            print(f"[streaming] no window was committed in --output {store.absolute(args.output)}: removed "
                  "the files a crashed job left and starting from --previous-ledger", file=sys.stderr)
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
    if "://" not in args.output:  # curator-only: 0700, tightened if it exists (snapshots are 0600)
        private_dir(store.absolute(args.output))
    state = store.join(store.absolute(args.output), STATE_FILE)
    if not FileSystems.exists(state):  # from now on this --output is recovered by a restart (recover)
        run, previous_run = args.lineage  # kept by a restart (job_lineage), so it keeps its claim
        store.write_json(state, {"format": 1, "commits": COMMITS, "job": job_identity(args), "run": run,
                                 "previous_run": previous_run})
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
    # The replay is finite, so every row is in the books now: check and record the balance as the
    # batch jobs do (exact counts go to the curator's file only, never to the output).
    balance = books(store.absolute(args.output))
    store.write_json(store.join(store.absolute(args.output), BOOKS_FILE), balance)
    print(f"[streaming] done: releases under {store.absolute(args.releases_parquet)}, curator files under "
          f"{store.absolute(args.output)}; row books {'balanced' if balance['balanced'] else 'MISMATCH'} "
          f"({BOOKS_FILE})", file=sys.stderr)
    if not args.quiet:  # exact counts: the curator's, under their heading, never under --quiet
        for line in curator_summary(store.absolute(args.output), balance):
            print(line, file=sys.stderr)
    return 0 if balance["balanced"] else 1


if __name__ == "__main__":
    sys.exit(main())
