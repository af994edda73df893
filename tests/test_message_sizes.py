"""renyi_stream.pipelines.streaming.message_sizes: what an Arrow IPC message's rows take decoded, told from its
metadata before anything is decompressed (issue 28, the attacker's finding F)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from renyi_stream.pipelines.streaming import codec
from renyi_stream.pipelines.streaming.codec import decode_message
from renyi_stream.pipelines.streaming.message_sizes import VALUE_BYTES, declared_bytes, decoded_bytes


def _encode(table: pa.Table, compression: str | None = None) -> bytes:
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _declared(payload: bytes) -> int:
    reader, total = pa.BufferReader(payload), 0
    while True:
        try:
            total += declared_bytes(ipc.read_message(reader))
        except EOFError:
            return total


def _table(rows: int = 10_000) -> pa.Table:
    return pa.table({"user_id": pa.array(np.arange(rows)), "day": pa.array(["2026-03-01"] * rows),
                     "kind": pa.array(["a", "bb"] * (rows // 2)).dictionary_encode()})


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_a_message_declares_what_its_buffers_take_decompressed(compression):
    table = _table()
    assert _declared(_encode(table, compression)) == pytest.approx(table.nbytes, abs=64)  # padding


def test_a_dictionary_column_is_counted_with_every_rows_value_expanded():
    # 1,000 rows of one 10 kB value: 1 kB of indices, 10 MB once the validator decodes them.
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1_000), pa.int8()), pa.array(["x" * 10_000]))
    assert decoded_bytes(pa.record_batch([column], names=["kind"])) >= 1_000 * 10_000


def test_a_column_without_buffers_counts_its_rows():
    assert decoded_bytes(pa.record_batch([pa.nulls(1_000)], names=["opened"])) == 1_000 * VALUE_BYTES


def test_a_dictionary_bomb_is_refused_by_decode_message(monkeypatch):
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1_000), pa.int8()), pa.array(["x" * 10_000]))
    payload = _encode(pa.table({"user_id": pa.array(np.arange(1_000)), "kind": column}), "zstd")
    monkeypatch.setattr(codec, "MAX_MESSAGE_DECODED_BYTES", 2**20)
    with pytest.raises(ValueError, match="MAX_MESSAGE_DECODED_BYTES"):
        decode_message(payload)


def test_a_corrupted_message_is_a_value_error_and_nothing_else():
    # The streaming job dead-letters a message that raises ValueError; anything else would fail
    # its bundle on every retry.
    payload = _encode(_table(100), "zstd")
    rng = random.Random(28)
    for _ in range(300):
        corrupted = bytearray(payload)
        for _ in range(3):
            corrupted[rng.randrange(len(payload))] = rng.randrange(256)
        try:
            decode_message(bytes(corrupted))
        except ValueError:
            pass


def _view_message(rows: int) -> bytes:
    """``rows`` string views all pointing at one shared 1 MiB slice: tiny buffers, huge rows."""
    data = pa.py_buffer(b"1" * 2**20)
    views = np.zeros(rows, dtype=[("length", "<i4"), ("prefix", "S4"), ("buffer", "<i4"), ("offset", "<i4")])
    views["length"], views["prefix"] = 2**20, b"1111"
    column = pa.Array.from_buffers(pa.string_view(), rows, [None, pa.py_buffer(views.tobytes()), data])
    table = pa.table({"user_id": pa.array(range(rows), pa.int64()), "day": pa.array([19000] * rows, pa.date32()),
                      "note": column})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


#: ``_view_message(64)`` as pyarrow 25 wrote it: pyarrow < 21 (the Flink environment's 16) cannot
#: build a string_view from buffers, but must still refuse such a message when it arrives.
SHIPPED_VIEW_MESSAGE = Path(__file__).parent / "data" / "view_message_64.arrows"


def test_a_message_with_a_view_column_is_refused_before_its_rows_are_read():
    # Every view may point at one shared slice: 64 rows of a 1,200-byte message took 3 GB when
    # validated, past the decoded-size cap that counts buffers (the attacker's second review).
    try:
        payload = _view_message(64)
    except (ValueError, pa.ArrowNotImplementedError):  # this pyarrow cannot build one (pyarrow 16: ValueError)
        payload = SHIPPED_VIEW_MESSAGE.read_bytes()
    assert len(payload) < 10_000
    with pytest.raises(ValueError, match="'note' is of the view type string_view"):
        decode_message(payload)


def test_the_shipped_view_message_is_the_one_this_file_builds():
    try:
        built = _view_message(64)
    except (ValueError, pa.ArrowNotImplementedError):
        pytest.skip("this pyarrow cannot build a string_view from buffers (< 21): the shipped copy stands in")
    assert ipc.open_stream(SHIPPED_VIEW_MESSAGE.read_bytes()).schema == ipc.open_stream(built).schema
    assert len(SHIPPED_VIEW_MESSAGE.read_bytes()) == len(built)
