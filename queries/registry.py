"""The registry of queries, kept in the public release store (query specs are public).

Analysts register a query with the window it takes effect from, after looking at earlier
releases: the fully adaptive setting of Feldman & Zrnic (each query may depend on every earlier
release; the individual filter's guarantee, Theorem 4.5, holds for such adaptively chosen
queries). The daily job answers, in each window, every query active in it
(:meth:`QueryRegistry.plan`). A registration or retirement that would change an already
released window is refused: released answers never change.
"""

from __future__ import annotations

import numbers
from typing import Any

import duckdb
import pyarrow as pa

from queries.linear import LinearQuery
from queries.release_store import ReleaseStore, ReleaseStoreError

_WIDE_VIEW = "releases_wide"


class QueryRegistry:
    """Register, retire and list queries in a :class:`ReleaseStore` (opened read-write to change)."""

    def __init__(self, store: ReleaseStore) -> None:
        self._store = store

    @property
    def _db(self) -> duckdb.DuckDBPyConnection:
        return self._store._conn

    def last_released_window(self) -> int | None:
        """The latest window any query was released for (None before the first release)."""
        row = self._db.execute("SELECT max(window_id) FROM release_data").fetchone()
        return None if row[0] is None else int(row[0])

    def _refuse_released(self, what: str, window: int) -> None:
        last = self.last_released_window()
        if last is not None and window <= last:
            raise ValueError(f"{what} must be after the last released window {last}, got {window}: "
                             "released answers never change, so a query takes effect from a future window")

    def add(self, query: LinearQuery, *, effective_from: int) -> None:
        """Register ``query``, answered from window ``effective_from`` on."""
        if not isinstance(query, LinearQuery):
            raise ValueError(f"query must be a LinearQuery, got {type(query).__name__}")
        effective_from = _window("effective_from", effective_from)
        if self._db.execute("SELECT 1 FROM query_registry WHERE query_id = ?", [query.query_id]).fetchone():
            raise ValueError(f"query id {query.query_id!r} is already registered; pick another id "
                             "(a retired id stays taken: its releases keep its meaning)")
        self._refuse_released("effective_from", effective_from)
        self._db.execute(
            "INSERT INTO query_registry (query_id, kind, spec_json, labels, description, effective_from) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [query.query_id, query.kind, query.to_json(), list(query.labels), query.description, effective_from])
        self._refresh_wide_view()

    def retire(self, query_id: str, *, from_window: int) -> None:
        """Stop answering ``query_id`` from window ``from_window`` on (its releases stay)."""
        from_window = _window("from_window", from_window)
        row = self._db.execute("SELECT effective_from, retired_from FROM query_registry WHERE query_id = ?",
                               [query_id]).fetchone()
        if row is None:
            raise ValueError(f"query id {query_id!r} is not registered")
        if row[1] is not None:
            raise ValueError(f"query {query_id!r} is already retired from window {row[1]}")
        if from_window <= row[0]:
            raise ValueError(f"from_window must be after the query's first window {row[0]}, got {from_window}")
        self._refuse_released("from_window", from_window)
        self._db.execute("UPDATE query_registry SET retired_from = ? WHERE query_id = ?", [from_window, query_id])

    def list(self) -> pa.Table:
        """The catalogue: one row per registered query."""
        table = self._db.execute("SELECT * FROM query_catalogue").arrow()
        return table.read_all() if hasattr(table, "read_all") else table

    def get(self, query_id: str) -> LinearQuery:
        row = self._db.execute("SELECT spec_json FROM query_registry WHERE query_id = ?", [query_id]).fetchone()
        if row is None:
            raise ValueError(f"query id {query_id!r} is not registered")
        return LinearQuery.from_json(row[0])

    def plan(self, start_window: int, end_window: int) -> list[tuple[LinearQuery, int, int | None]]:
        """Each query active in some window of ``[start_window, end_window]``, with its first
        window and the window it is retired from (None if not retired), sorted by query id."""
        rows = self._db.execute(
            "SELECT spec_json, effective_from, retired_from FROM query_registry "
            "WHERE effective_from <= ? AND (retired_from IS NULL OR retired_from > ?) ORDER BY query_id",
            [int(end_window), int(start_window)]).fetchall()
        return [(LinearQuery.from_json(spec), int(first), None if retired is None else int(retired))
                for spec, first, retired in rows]

    def active(self, window_id: int) -> list[LinearQuery]:
        """The queries answered in ``window_id``."""
        return [query for query, _, _ in self.plan(window_id, window_id)]

    def _refresh_wide_view(self) -> None:
        """``releases_wide``: one column per (query, coordinate) of the registry."""
        rows = self._db.execute("SELECT query_id, labels FROM query_registry ORDER BY query_id").fetchall()
        names = []
        for query_id, labels in rows:
            names += [query_id] if len(labels) == 1 else [f"{query_id}[{label}]" for label in labels]
        if not names:
            return
        column = ("CASE WHEN count(*) OVER (PARTITION BY query_id, window_id) = 1 THEN query_id "
                  "ELSE query_id || '[' || label || ']' END")
        values = ", ".join(_quote(name) for name in names)
        self._db.execute(
            f"CREATE OR REPLACE VIEW {_WIDE_VIEW} AS "
            f"PIVOT (SELECT window_id, window_start, window_end, {column} AS series, value FROM releases) "
            f"ON series IN ({values}) USING first(value) GROUP BY window_id, window_start, window_end "
            "ORDER BY window_id")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _window(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer window id, got {value!r}")
    return int(value)


__all__ = ["QueryRegistry", "ReleaseStoreError"]
