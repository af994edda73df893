"""The analysts' SQL entry point over the public release store.

:func:`run_sql` opens the store through ``connect_read_only`` (read-only, no external access,
configuration locked) and returns the result as Arrow. A statement that tries to write, to read
or write a file, to ATTACH another database (the curator's ledger) or to install or load an
extension fails inside DuckDB; :class:`SqlRefused` carries DuckDB's message with a plain-words
explanation of why such statements are not allowed here.

Writing the result to a file (``--format parquet --out F``) happens in this process, after the
query, never from inside SQL.

What a release estimates is in the store itself, as DuckDB comments on its views and columns
(:data:`renyi_stream.queries.release_store.ESTIMAND`): each value estimates the sum over the users
whose budget admitted them in that window, and its band covers that admitted sum, not the
population's. Analysts read them with ``SELECT view_name, comment FROM duckdb_views() WHERE NOT
internal`` (and ``duckdb_columns()`` for ``value``, ``noise_std``, ``ci95_low``, ``ci95_high``),
over a DuckDB store or a Parquet release root alike.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from renyi_stream.queries.release_store import connect_read_only

FORMATS = ("table", "csv", "json", "parquet")


class SqlRefused(ValueError):
    """A statement the analyst entry point does not run: writes, files, ATTACH, extensions."""


def run_sql(store: str | os.PathLike, statement: str) -> pa.Table:
    """Run one SQL statement read-only against the release store and return its rows."""
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("sql must be a non-empty SQL statement")
    _refuse_writes(statement)
    db = connect_read_only(store)
    try:
        result = db.execute(statement)
        if result.description is None:  # a statement without rows (SET, PRAGMA ...)
            return pa.table({})
        table = result.arrow()
        return table.read_all() if hasattr(table, "read_all") else table
    except (duckdb.PermissionException, duckdb.InvalidInputException, duckdb.CatalogException,
            duckdb.BinderException, duckdb.IOException, duckdb.NotImplementedException) as exc:
        message = str(exc)
        if _is_refusal(message):
            raise SqlRefused(f"{_SANDBOX} (DuckDB said: {message.splitlines()[0]})") from exc
        raise
    finally:
        db.close()


_SANDBOX = ("the release store is opened read-only with external access disabled: queries may read its tables and "
            "views, not write, touch files, attach databases or load extensions")

#: The statement kinds the entry point runs: reads (SELECT, and what DuckDB parses as one: FROM,
#: SHOW, DESCRIBE, SUMMARIZE, PRAGMA) and EXPLAIN of them.
_READS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


def _refuse_writes(statement: str) -> None:
    """SqlRefused, in plain words, for a statement that is not a read (DELETE, UPDATE, INSERT ...),
    before the store opens. A courtesy: DuckDB's read-only, locked connection is what enforces it
    (some writes to a view otherwise fail with a binder error that says nothing of why)."""
    try:
        kinds = [s.type for s in duckdb.extract_statements(statement)]
    except duckdb.Error:
        return  # a statement DuckDB cannot parse: its own error says where
    writes = sorted({kind.name for kind in kinds if kind not in _READS})
    if writes:
        raise SqlRefused(f"{_SANDBOX} ({', '.join(writes)} is not a read)")


def _is_refusal(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in (
        "read-only", "read only", "external access", "disabled", "permission", "lock_configuration",
        "configuration has been locked", "cannot change", "not allowed",
    ))


def format_result(table: pa.Table, fmt: str) -> str:
    """Render rows as an aligned text table, CSV or JSON lines (one object per row)."""
    if fmt == "csv":
        buffer = io.BytesIO()
        pacsv.write_csv(table, buffer)
        return buffer.getvalue().decode()
    if fmt == "json":
        return "".join(json.dumps(row, default=str) + "\n" for row in table.to_pylist())
    if fmt == "table":
        return _text_table(table)
    raise ValueError(f"format must be one of {FORMATS[:-1]} for text output, got format={fmt!r}")


def write_parquet(table: pa.Table, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _text_table(table: pa.Table, max_rows: int = 200) -> str:
    names = table.column_names
    rows = [[_cell(v) for v in row.values()] for row in table.slice(0, max_rows).to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    if table.num_rows > max_rows:
        lines.append(f"... {table.num_rows - max_rows} more rows (use --format csv or parquet for all)")
    lines.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
