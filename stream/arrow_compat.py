"""``string_view`` where the installed pyarrow cannot handle it: the one place that knows.

The Flink environment (``pip install '.[flink]'``) pins pyarrow 16 (through apache-beam 2.61),
which has the ``string_view`` type but no cast kernel from it to ``string``, and every pyarrow
before 21 refuses to write it to Parquet ("Unhandled type for Arrow to Parquet schema
conversion"). An input file or message may still hold such a column (a newer writer made it).
"""

from __future__ import annotations

import pyarrow as pa

#: pyarrow writes ``string_view`` columns to Parquet from release 21 on.
PARQUET_WRITES_STRING_VIEW = int(pa.__version__.split(".")[0]) >= 21


def _is_string_view(t: pa.DataType) -> bool:
    return bool(getattr(pa.types, "is_string_view", lambda _t: False)(t))


def plain_strings(values: pa.Array) -> pa.Array:
    """``values`` as a ``string`` (utf8) array when it is ``string_view``; any other array as it is.

    Casts where pyarrow has the kernel; pyarrow 16 has none, so there the values are copied
    through NumPy objects (same strings, same nulls; a slower path for a rare input type)."""
    if not _is_string_view(values.type):
        return values
    try:
        return values.cast(pa.string())
    except pa.ArrowNotImplementedError:
        return _copied(values)


def _copied(values: pa.Array) -> pa.Array:
    """A ``string`` array of ``values``' strings and nulls, copied without Arrow's cast kernels."""
    return pa.array(values.to_numpy(zero_copy_only=False), type=pa.string())


def parquet_writable(table: pa.Table) -> pa.Table:
    """``table`` with each top-level ``string_view`` column as ``string`` when the installed pyarrow
    cannot write ``string_view`` to Parquet (before 21); ``table`` itself otherwise. Parquet keeps
    both as UTF-8 byte arrays: only the Arrow type recorded beside them differs."""
    if PARQUET_WRITES_STRING_VIEW or not any(_is_string_view(f.type) for f in table.schema):
        return table
    columns = [pa.chunked_array([plain_strings(chunk) for chunk in column.chunks], pa.string())
               if _is_string_view(column.type) else column for column in table.columns]
    fields = [field.with_type(pa.string()) if _is_string_view(field.type) else field for field in table.schema]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))
