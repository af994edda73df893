"""A message of the streaming job, under any runner: its codec (one Arrow IPC stream of indicator
rows, :func:`encode_message`, :func:`decode_message`), its name and number, and its validation
into rows and dead letters (:class:`MessageValidator`).

A message's payload (a Kafka record's value, a Pub/Sub message's data, a replayed file) is one
**Arrow IPC stream** of indicator rows (``user_id``, ``day`` or ``event_time``, the indicator
columns, by the names the ledger's contract declares), as ``pyarrow.ipc.new_stream`` writes it.
Its event time, where the source gives one, must not be later than any of its rows' event times,
so that the watermark means "this window's rows are in"; a row that arrives after its shard charged
its window is dead-lettered ``late_window`` and charges nobody, never released twice.

Which of two rows of one user and window counts (the other is dead-lettered
``duplicate_user_window``): the first in event-time order, (window, the message's number, row in
it), invariant 2 (charge-in-event-time-order, docs/architecture.md). A replayed file's number is
its place in ``--replay``, as the batch jobs number their inputs, so a replay keeps the row the
batch jobs keep; a Pub/Sub or Kafka message's is a hash of its name (:func:`_source_number`), a
stable identity: the row kept depends on the two messages only, never on the order they arrive
in, and is the same on every retry and replay. Every dead letter names its message by its name.

Imports no Beam: each runner's shell wraps :class:`MessageValidator` (the Beam shell's
``DecodeAndValidate``).
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from renyi_stream.pipelines.beam.rows import valid_mask
from renyi_stream.pipelines.streaming import message_sizes
from renyi_stream.pipelines.streaming.options import ID_TYPE
from renyi_stream.stream.engine.dead_letters import DeadLetterReason, dead_letters, rejected_letters, with_input_position
from renyi_stream.stream.schema import DEFAULT_KEYS, WINDOW_ID, InputKeys, SchemaError, WindowSpec, validate_batch


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
                         "the most one message may take "
                         "(MAX_MESSAGE_DECODED_BYTES of renyi_stream.pipelines.streaming.codec)")


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
    a Kafka record named ``topic/partition/offset``, :func:`renyi_stream.pipelines.streaming.kafka.kafka_record_name`)
    or bare bytes."""
    if isinstance(element, tuple):
        return str(element[0]), bytes(element[1])
    if isinstance(element, (bytes, bytearray)):
        return "sha256:" + hashlib.sha256(element).hexdigest()[:16], bytes(element)
    name = getattr(element, "message_id", None) or "sha256:" + hashlib.sha256(element.data).hexdigest()[:16]
    return str(name), bytes(element.data)


def _source_number(name: str) -> int:
    """A message's number from its name (a Pub/Sub message id, a Kafka ``topic/partition/offset``):
    the first 63 bits of its SHA-256. Rows of one (user, window) from two messages are taken in
    the order (window, this number, row), so which one counts depends on the two messages only,
    never on the order they arrive in, and is the same on every retry, restore and replay of them
    (invariant 2 (charge-in-event-time-order, docs/architecture.md)). A replay numbers its files by
    their order in ``--replay`` instead, as the batch jobs number their inputs
    (:func:`renyi_stream.pipelines.streaming.replay.replay_numbers`)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") >> 1


class MessageValidator:
    """message -> validated rows (main: an Arrow table with the ``_source``/``_row`` input position)
    and dead letters (tag ``dead``), so that every row of every message is one or the other
    (:meth:`validate`), and each message's record of rows read (tag ``read``).

    With ``stamp`` the output is timestamped at its earliest window's start (replayed files
    carry no event time of their own); otherwise it keeps the source's timestamp. A message's rows
    are numbered (:data:`renyi_stream.stream.engine.dead_letters.SOURCE`) by ``numbers`` (a replayed file: its
    index in ``--replay``, :func:`renyi_stream.pipelines.streaming.replay.replay_numbers`), else by
    :func:`_source_number` of its name, and carry its name for their dead letters. ``keys``: the id and time columns' names the ledger's
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

    def validate(self, element: Any) -> Iterator[tuple[str | None, Any]]:
        """``element``'s outputs as ``(tag, value)``: ``("read", record)``, ``("dead", letters)`` and
        ``(None, valid rows)``, the main output, which a runner emits at :meth:`event_time`."""
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
            yield "read", _read_row(name, 1)
            yield "dead", dead_letters(
                DeadLetterReason.UNDECODABLE_MESSAGE, source=name, row_index=-1, detail=str(exc)[:300],
                raw=payload[:256].hex())
            return
        yield "read", _read_row(name, table.num_rows)
        if checked.rejected.num_rows:
            yield "dead", rejected_letters(name, checked.rejected)
        valid = checked.valid
        if not valid.num_rows:
            return
        number = self._numbers[name] if name in self._numbers else _source_number(name)
        valid = with_input_position(valid, source=number, name=name,
                                    row_index=np.flatnonzero(valid_mask(table.num_rows, checked.rejected)))
        yield None, valid

    def event_time(self, valid: pa.Table) -> int | None:
        """The event time (seconds since the epoch) ``valid`` rows are emitted at: with ``stamp``,
        their earliest window's start; None keeps the source's timestamp."""
        if self._stamp:
            first = int(pc.min(valid.column(WINDOW_ID)).as_py())
            return self._window.window_start_seconds(first)
        return None


def _read_row(name: str, rows: int) -> pa.Table:
    """The curator's record of one message read: its name and its number of rows (sensitive)."""
    return pa.table({"source": [name], "rows_read": pa.array([int(rows)], type=pa.int64())})
