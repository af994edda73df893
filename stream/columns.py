"""Which input columns a run parses as numbers, for a ledger recorded before declared contracts.

A ledger with a declared contract (:mod:`renyi_stream.stream.contract`; every new ledger has one) takes its
columns from the declaration alone. A ledger recorded before contracts existed goes on under the
rule below until a run declares its contract: decided from public information, never from values.

A numeric *indicator* column is parsed as numbers by :func:`renyi_stream.stream.schema.validate_batch`: a
value that does not parse makes its row a dead letter (``wrong_type``, the column named), counted
in ``admitted + clipped + dropped + rejected = rows read``; it never refuses the run. A *string*
column is passed through as text for histograms over string categories. Deciding a column's
kind from its values (say, "most of the first 1,024 read as numbers") would let one user's value
decide which queries are registered and released, which rows are parsed, whether a day is
refused, and what the public store records about the input: each of those is public (invariant 3
(public-schedule, docs/architecture.md)). So the rule reads only

* the file's **declared** types: a Parquet or Arrow IPC file declares its schema. Integer,
  floating, bool and decimal columns are numeric, string columns are text, a ``null`` column
  (every value missing) takes the kind a query gives it, any other type is no indicator. A CSV
  declares no types: its columns are *undeclared* (read as text, see
  :func:`renyi_stream.stream.engine.readers.read_batches`);
* the **registered queries** (the public catalogue): a column a numeric query reads is numeric,
  a column a histogram over string categories reads is a category.

The rule, over the non-key columns of the input (every column but ``user_id``, ``day`` and
``event_time``):

1. numeric: the declared numeric columns, and every column a registered numeric query reads
   (an undeclared or null one is parsed; a declared string one is not numeric, and the query is
   refused before anyone is charged, since the file says that column holds no numbers);
2. strings: the declared string columns, and the undeclared ones a histogram reads;
3. undeclared: the CSV columns no registered query reads. Nobody's row is parsed by them; a
   later query may read them either way.

On a store with no registered query (the first run), the default per-column queries go to
:func:`default_columns`: the declared numeric columns of a Parquet/Arrow input, and *every*
non-key column of a CSV. To answer only some columns of a CSV, register the queries before its
first run (``renyi-stream query add``): the first run then answers those.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import pyarrow as pa

from renyi_stream.stream.schema import DAY, EVENT_TIME, USER_ID

__all__ = ["KEY_COLUMNS", "InputColumns", "declared_kind", "default_columns", "input_columns"]

#: Columns that are never indicators: the user and the time.
KEY_COLUMNS = (USER_ID, DAY, EVENT_TIME)


def declared_kind(t: pa.DataType) -> str | None:
    """``"number"`` (integer, floating, bool, decimal), ``"string"``, ``"null"`` or None (any
    other type: no indicator) for a declared Arrow type; dictionaries by their values."""
    t = t.value_type if pa.types.is_dictionary(t) else t
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "string"
    if pa.types.is_null(t):
        return "null"
    return None


@dataclass(frozen=True)
class InputColumns:
    """The kinds of an input's non-key columns, each in the input's column order.

    ``numeric``: parsed as numbers (the validator's indicator columns). ``strings``: text that
    histograms over string categories may read. ``undeclared``: CSV columns no registered query
    reads (either kind of query may be registered over them).
    """

    numeric: tuple[str, ...]
    strings: tuple[str, ...]
    undeclared: tuple[str, ...] = ()

    def schema(self) -> pa.Schema:
        """The columns queries see after validation: numeric ones float64, strings utf8."""
        return pa.schema([(c, pa.float64()) for c in self.numeric] + [(c, pa.string()) for c in self.strings])


def _non_key(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if f.name not in KEY_COLUMNS]


def default_columns(schema: pa.Schema, *, declared_types: bool) -> list[str]:
    """The columns that get a default query on a store with none: the declared numeric columns
    of ``schema`` when the file declares its types (Parquet, Arrow), else (CSV) every non-key
    column. Depends on the header and the declared types only."""
    if not declared_types:
        return [f.name for f in _non_key(schema)]
    return [f.name for f in _non_key(schema) if declared_kind(f.type) == "number"]


def input_columns(schema: pa.Schema, *, declared_types: bool, numeric_reads: Collection[str],
                  category_reads: Collection[str]) -> InputColumns:
    """The kinds of the non-key columns of ``schema`` (module docstring), from the types it
    declares (``declared_types``: False for a CSV, whose types are not declared) and the columns
    the registered queries read as numbers (``numeric_reads``) and as categories
    (``category_reads``). Columns of ``*_reads`` absent from ``schema`` are left out (the
    queries reading them are refused by their own validation)."""
    kinds: dict[str, list[str]] = {"number": [], "string": [], "undeclared": []}
    for f in _non_key(schema):
        kind = declared_kind(f.type) if declared_types else "undeclared"
        if kind in ("undeclared", "null"):  # the file declares no kind: the queries give it one
            kind = "number" if f.name in numeric_reads else "string" if f.name in category_reads else kind
        if kind in kinds:  # a null column no query reads, or another type, is no indicator
            kinds[kind].append(f.name)
    return InputColumns(tuple(kinds["number"]), tuple(kinds["string"]), tuple(kinds["undeclared"]))
