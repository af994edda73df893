"""What an Arrow IPC message's rows take once decoded, told before it is decompressed.

A record batch (or dictionary batch) message's metadata is a flatbuffer ``Message`` whose header
lists the batch's buffers by offset and length in the body (Arrow's ``format/Message.fbs``); with
body compression each buffer starts with its length once decompressed, a little-endian int64
(``-1``: stored as is), which is what Arrow's reader allocates before it decompresses
(Arrow's columnar format, "Compression"). :func:`declared_bytes` sums those lengths from the
metadata alone; :func:`decoded_bytes` measures a decoded batch as the validator will read it.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc

# Field indices of the flatbuffer tables read here (format/Message.fbs).
_MESSAGE_HEADER = 2  # Message.header: the RecordBatch or DictionaryBatch table
_DICTIONARY_BATCH_DATA = 1  # DictionaryBatch.data: RecordBatch
_RECORD_BATCH_BUFFERS = 2  # RecordBatch.buffers: [Buffer { offset: long; length: long }]
_RECORD_BATCH_COMPRESSION = 3  # RecordBatch.compression: BodyCompression, absent when none
_STORED_AS_IS = -1  # a compressed body's buffer whose bytes were not compressed
#: The least a decoded value is counted at: the validator parses each id, time and indicator into
#: 8 bytes, so a column with no buffers (Arrow's null type) still costs its rows.
VALUE_BYTES = 8


def declared_bytes(message: pa.ipc.Message) -> int:
    """The bytes ``message``'s buffers take once decompressed, as its metadata and the length
    before each compressed buffer declare them (what Arrow allocates to decode it); a schema
    message's 0. Nothing is decompressed. ValueError when the metadata or body does not hold
    what it points to."""
    body = memoryview(message.body) if message.body is not None else memoryview(b"")
    if message.type not in ("record batch", "dictionary"):
        return 0 if message.type == "schema" else len(body)
    meta = memoryview(message.metadata)
    try:
        header = _table_field(meta, _u32(meta, 0), _MESSAGE_HEADER)
        batch = header if message.type == "record batch" else _table_field(meta, header, _DICTIONARY_BATCH_DATA)
        compressed = _field(meta, batch, _RECORD_BATCH_COMPRESSION) is not None
        return sum(_decompressed_length(body, offset, length) if compressed else max(length, 0)
                   for offset, length in _buffers(meta, batch))
    except struct.error:
        raise ValueError(f"not an Arrow IPC stream: its {message.type} message's metadata points outside it") from None


def decoded_bytes(batch: pa.RecordBatch) -> int:
    """The bytes ``batch``'s rows take as the validator reads them: each column's buffers, a
    dictionary column's values expanded row by row, and at least :data:`VALUE_BYTES` a value."""
    return sum(max(_column_bytes(column), VALUE_BYTES * len(column)) for column in batch.columns)


def _column_bytes(column: pa.Array) -> int:
    if not pa.types.is_dictionary(column.type):
        return column.nbytes
    return column.indices.nbytes + _expanded_values(column)


def _expanded_values(column: pa.DictionaryArray) -> int:
    """The bytes of ``column``'s values once every row holds its own (``dictionary_decode``)."""
    values = column.dictionary
    try:
        return len(column) * values.type.bit_width // 8
    except ValueError:  # not fixed width: count each value's length once per row that uses it
        pass
    counts = pc.value_counts(column.indices)
    if not (pa.types.is_binary(values.type) or pa.types.is_string(values.type)
            or pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)):
        return len(column) * values.nbytes  # nested values: at most the whole dictionary a row
    lengths = pc.fill_null(pc.take(pc.binary_length(values), counts.field("values")), 0)
    return 4 * len(column) + int(pc.sum(pc.multiply(lengths.cast(pa.int64()), counts.field("counts"))).as_py() or 0)


def _decompressed_length(body: memoryview, offset: int, length: int) -> int:
    """A compressed body's buffer: the length it declares before its bytes."""
    if length <= 0:
        return 0
    declared = _read("<q", body, offset)[0]
    return length - 8 if declared == _STORED_AS_IS else max(declared, 0)


def _buffers(meta: memoryview, batch: int) -> list[tuple[int, int]]:
    where = _field(meta, batch, _RECORD_BATCH_BUFFERS)
    if where is None:
        return []
    vector = where + _u32(meta, where)
    return [_read("<qq", meta, vector + 4 + 16 * i) for i in range(_u32(meta, vector))]


def _read(form: str, data: memoryview, at: int) -> tuple:
    """``struct.unpack_from``, refusing a negative position (which would count from the end)."""
    if at < 0:
        raise struct.error("a negative position")
    return struct.unpack_from(form, data, at)


def _u32(meta: memoryview, at: int) -> int:
    return _read("<I", meta, at)[0]


def _field(meta: memoryview, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies, None when absent."""
    vtable = table - _read("<i", meta, table)[0]
    slot = 4 + 2 * index
    if slot >= _read("<H", meta, vtable)[0]:
        return None
    offset = _read("<H", meta, vtable + slot)[0]
    return table + offset if offset else None


def _table_field(meta: memoryview, table: int, index: int) -> int:
    """The table field ``index`` of the table at ``table`` points to."""
    where = _field(meta, table, index)
    if where is None:
        raise struct.error("a missing table")
    return where + _u32(meta, where)
