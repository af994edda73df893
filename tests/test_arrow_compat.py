"""``string_view`` under the oldest pyarrow the project installs with (16, in the Flink
environment): read into plain strings, and made writable to Parquet (stream/arrow_compat.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from renyi_stream.stream import arrow_compat
from renyi_stream.stream.arrow_compat import parquet_writable, plain_strings
from renyi_stream.stream.schema import _normalise

#: Inline (up to 12 bytes) and out-of-line views, an empty string, a null, non-ASCII.
VALUES = ["a", "", None, "longer than twelve bytes", "é🙂" * 5]


def _views() -> pa.Array:
    return pa.array(VALUES, pa.string_view())


def test_a_string_view_array_becomes_the_same_strings_and_nulls_as_utf8():
    plain = plain_strings(_views())
    assert plain.type == pa.string() and plain.to_pylist() == VALUES


def test_the_copy_pyarrow_16_takes_gives_what_the_cast_gives():
    # pyarrow 16 has no cast kernel from string_view: plain_strings copies instead.
    copied = arrow_compat._copied(_views().slice(1))
    assert copied.type == pa.string() and copied.to_pylist() == VALUES[1:]


def test_any_other_array_is_returned_as_it_is():
    for values in (pa.array(["a"]), pa.array(["a"], pa.large_string()), pa.array([1, 2])):
        assert plain_strings(values) is values


def test_validation_normalises_a_string_view_column_to_utf8():
    normalised = _normalise(pa.chunked_array([_views(), _views().slice(0, 0)]))
    assert normalised.type == pa.string() and normalised.to_pylist() == VALUES


def test_a_table_is_made_writable_where_pyarrow_cannot_write_string_view(tmp_path, monkeypatch):
    table = pa.table({"id": _views(), "x": pa.array([1.0] * len(VALUES))}).replace_schema_metadata({"k": "v"})
    monkeypatch.setattr(arrow_compat, "PARQUET_WRITES_STRING_VIEW", False)  # as before pyarrow 21
    writable = parquet_writable(table)
    assert writable.schema == pa.schema([("id", pa.string()), ("x", pa.float64())], metadata={"k": "v"})
    pq.write_table(writable, tmp_path / "t.parquet")
    back = pq.read_table(tmp_path / "t.parquet")
    assert back.column("id").to_pylist() == VALUES and back.column("x").to_pylist() == [1.0] * len(VALUES)


def test_a_table_is_left_alone_where_pyarrow_writes_string_view_or_it_holds_none(monkeypatch):
    table = pa.table({"id": _views()})
    monkeypatch.setattr(arrow_compat, "PARQUET_WRITES_STRING_VIEW", True)
    assert parquet_writable(table) is table
    monkeypatch.setattr(arrow_compat, "PARQUET_WRITES_STRING_VIEW", False)
    plain = pa.table({"id": pa.array(["a"])})
    assert parquet_writable(plain) is plain


def test_the_version_flag_says_what_the_installed_pyarrow_does():
    assert arrow_compat.PARQUET_WRITES_STRING_VIEW == (int(pa.__version__.split(".")[0]) >= 21)
