"""The registry of queries, kept in the public release store (query specs are public).

Analysts register a query with the window it takes effect from, after looking at earlier
releases: the fully adaptive setting of Feldman & Zrnic (each query may depend on every earlier
release; the individual filter's guarantee, Theorem 4.5, holds for such adaptively chosen
queries). The daily job answers, in each window, every query active in it
(:meth:`QueryRegistry.plan`). A registration or retirement that would change an already
released window is refused: released answers never change.

The registry is the table ``query_registry`` of the store (schema version 2, see
:mod:`queries.release_store`). Every change also recreates the view ``releases_wide`` (one row
per window, one column per registered query coordinate) in the same transaction, because a
DuckDB view cannot pivot on values found in the data: any DuckDB client, read-only included,
then reads it with a plain ``SELECT * FROM releases_wide``.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

import duckdb
import pyarrow as pa

from queries.linear import LinearQuery
from queries.release_store import ReleaseStore, ReleaseStoreError, _to_table
from stream.accounting.gaussian import MAX_DIM

_WIDE_VIEW = "releases_wide"


class QueryRegistry:
    """Register, retire and list the queries of a release store.

    ``store`` is an open :class:`ReleaseStore` (the registry uses it and leaves it open), or the
    path of one, which the registry opens (read-write unless ``read_only``) and closes in
    :meth:`close` or at the end of a ``with`` block. Changing the registry needs a read-write
    store; reading it does not.
    """

    def __init__(self, store: ReleaseStore | str | os.PathLike, *, read_only: bool = False) -> None:
        if isinstance(store, ReleaseStore):
            self._store, self._owned = store, False
        elif isinstance(store, (str, os.PathLike)):
            self._store, self._owned = ReleaseStore(store, read_only=read_only), True
        else:
            raise ValueError(f"store must be a ReleaseStore or a path, got {type(store).__name__}")

    def __enter__(self) -> "QueryRegistry":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the store if this registry opened it (a store passed in stays open)."""
        if self._owned:
            self._store.close()

    @property
    def store(self) -> ReleaseStore:
        return self._store

    @property
    def _db(self) -> duckdb.DuckDBPyConnection:
        return self._store._conn  # the registry is part of the store's schema (queries.release_store)

    # -- reading ----------------------------------------------------------------------------------

    def last_released_window(self) -> int | None:
        """The latest window released for any query (None before the first release)."""
        row = self._db.execute("SELECT max(window_id) FROM release_data").fetchone()
        return None if row[0] is None else int(row[0])

    def list(self) -> pa.Table:
        """The catalogue (view ``query_catalogue``), one row per registered query, by query id:
        ``query_id, kind, description, labels, dim, effective_from, retired_from,
        registered_at, spec_json``."""
        return _to_table(self._db.execute("SELECT * FROM query_catalogue ORDER BY query_id"))

    def get(self, query_id: str) -> LinearQuery:
        """The registered query ``query_id``; ValueError if there is none."""
        row = self._db.execute("SELECT spec_json FROM query_registry WHERE query_id = ?", [query_id]).fetchone()
        if row is None:
            raise ValueError(f"query_id {query_id!r} is not registered")
        return LinearQuery.from_json(row[0])

    def plan(self, start_window: int, end_window: int) -> list[tuple[LinearQuery, int, int | None]]:
        """Each query active in some window of ``[start_window, end_window]`` (inclusive), with
        its first window and the window it is retired from (None if not retired), by query id.

        A query is active in window ``w`` when ``effective_from <= w < retired_from``.
        """
        start, end = _window("start_window", start_window), _window("end_window", end_window)
        if start > end:
            raise ValueError(f"start_window must be <= end_window, got start_window={start}, end_window={end}")
        rows = self._db.execute(
            "SELECT spec_json, effective_from, retired_from FROM query_registry "
            "WHERE effective_from <= ? AND (retired_from IS NULL OR retired_from > ?) ORDER BY query_id",
            [end, start]).fetchall()
        return [(LinearQuery.from_json(spec), int(first), None if retired is None else int(retired))
                for spec, first, retired in rows]

    def active(self, window_id: int) -> list[LinearQuery]:
        """The queries answered in ``window_id``, by query id."""
        window = _window("window_id", window_id)
        return [query for query, _, _ in self.plan(window, window)]

    # -- changing ---------------------------------------------------------------------------------

    def add(self, query: LinearQuery, *, effective_from: int) -> None:
        """Register ``query``, answered in every window from ``effective_from`` on.

        Refused (ValueError, nothing changed) when the id is already registered (a retired id
        stays taken: its releases keep its meaning), when the query reads a column the daily
        input does not have, or of the wrong kind (once a run has recorded them), when
        ``effective_from`` is not after the last window released for any query (a released
        window never changes), or when the
        queries active together in some window from ``effective_from`` on would have more than
        ``MAX_DIM`` coordinates (the ledger charges their concatenation).
        """
        if not isinstance(query, LinearQuery):
            raise ValueError(f"query must be a LinearQuery, got {type(query).__name__}")
        first = _window("effective_from", effective_from)
        if self._db.execute("SELECT 1 FROM query_registry WHERE query_id = ?", [query.query_id]).fetchone():
            raise ValueError(f"query_id {query.query_id!r} is already registered; pick another id "
                             "(a retired id stays taken: its releases keep its meaning)")
        self._refuse_released("effective_from", first)
        # A CSV column no query reads yet is undeclared: this query reads it as it needs it.
        schema = self._store.input_schema(undeclared_as=pa.string() if query.categorical else pa.float64())
        if schema is not None:  # the daily job recorded its input's columns
            query.validate_against(schema)
        self._refuse_too_wide(query, first)
        self._in_transaction(
            "INSERT INTO query_registry (query_id, kind, spec_json, labels, description, effective_from) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [query.query_id, query.kind, query.to_json(), list(query.labels), query.description, first])

    def retire(self, query_id: str, *, from_window: int) -> None:
        """Stop answering ``query_id`` from window ``from_window`` on (its releases stay).

        Refused (ValueError, nothing changed) for an unknown or already retired query, a
        ``from_window`` not after the query's first window, or not after the last released window.
        """
        last_active = _window("from_window", from_window)
        row = self._db.execute("SELECT effective_from, retired_from FROM query_registry WHERE query_id = ?",
                               [query_id]).fetchone()
        if row is None:
            raise ValueError(f"query_id {query_id!r} is not registered")
        if row[1] is not None:
            raise ValueError(f"query {query_id!r} is already retired from window {row[1]}")
        if last_active <= row[0]:
            raise ValueError(f"from_window must be after the query's first window {row[0]}, got from_window={last_active}")
        self._refuse_released("from_window", last_active)
        self._in_transaction("UPDATE query_registry SET retired_from = ? WHERE query_id = ?", [last_active, query_id])

    def defer_unanswered(self, processed_through: int) -> list[tuple[str, int, int]]:
        """Move the first window of every query that starts in a window the curator has already
        charged (``<= processed_through``) but was never answered, to ``processed_through + 1``.

        This happens only when a query is registered after a run committed a window and before it
        published it (a crash in between): the store did not yet show that window as released,
        so the registration was accepted, yet the window's answers were fixed without the new
        query. Moving its start changes no released answer and keeps the catalogue truthful (a
        running total then starts where it is first answered). Returns ``(query_id, old, new)``
        per query moved; a query whose retirement would come first is retired instead of moved.
        """
        through = _window("processed_through", processed_through)
        rows = self._db.execute(
            "SELECT q.query_id, q.effective_from, q.retired_from FROM query_registry q "
            "WHERE q.effective_from <= ? AND NOT EXISTS (SELECT 1 FROM release_data r WHERE r.query_id = q.query_id) "
            "ORDER BY q.query_id", [through]).fetchall()
        moved = []
        for query_id, first, retired in rows:
            new_first = through + 1
            if retired is not None and retired <= new_first:
                self._in_transaction("UPDATE query_registry SET effective_from = ?, retired_from = ? "
                                     "WHERE query_id = ?", [retired, retired, query_id])
            else:
                self._in_transaction("UPDATE query_registry SET effective_from = ? WHERE query_id = ?",
                                     [new_first, query_id])
            moved.append((str(query_id), int(first), new_first))
        return moved

    # -- private ----------------------------------------------------------------------------------

    def _refuse_released(self, name: str, window: int) -> None:
        last = self.last_released_window()
        if last is not None and window <= last:
            raise ValueError(f"{name} must be after the last released window {last}, got {name}={window}: "
                             "released answers never change, so a change takes effect from a future window")

    def _refuse_too_wide(self, query: LinearQuery, first: int) -> None:
        rows = self._db.execute(
            "SELECT len(labels), effective_from, retired_from FROM query_registry "
            "WHERE retired_from IS NULL OR retired_from > ?", [first]).fetchall()
        for window in sorted({first} | {int(f) for _, f, _ in rows if f > first}):
            together = query.dim + sum(int(d) for d, f, r in rows if f <= window and (r is None or r > window))
            if together > MAX_DIM:
                raise ValueError(f"query {query.query_id!r} (dim {query.dim}) would make the queries active in "
                                 f"window {window} {together} coordinates together; at most {MAX_DIM} (MAX_DIM) "
                                 "are charged in one window: retire some first")

    def _in_transaction(self, sql: str, params: list[Any]) -> None:
        """Run ``sql`` and recreate ``releases_wide``, both or neither."""
        db = self._db
        try:
            db.execute("BEGIN TRANSACTION")
        except duckdb.Error as exc:
            raise ReleaseStoreError(f"cannot change the query registry of {self._store.path}: {exc}") from exc
        try:
            db.execute(sql, params)
            self._refresh_wide_view()
            db.execute("COMMIT")
        except BaseException as exc:
            try:
                db.execute("ROLLBACK")
            except duckdb.Error:
                pass
            if isinstance(exc, duckdb.Error):
                raise ReleaseStoreError(f"cannot change the query registry of {self._store.path} "
                                        f"(nothing was changed): {exc}") from exc
            raise

    def _refresh_wide_view(self) -> None:
        """``releases_wide``: window columns, then one column per registered query coordinate,
        named by the query id (one coordinate) or ``query_id[label]`` (several), by query id."""
        rows = self._db.execute("SELECT query_id, labels FROM query_registry ORDER BY query_id").fetchall()
        names = []
        for query_id, labels in rows:
            names += [query_id] if len(labels) == 1 else [f"{query_id}[{label}]" for label in labels]
        if not names:
            return
        series = ("CASE WHEN len(q.labels) = 1 THEN r.query_id ELSE r.query_id || '[' || r.label || ']' END")
        values = ", ".join(_quote(name) for name in names)
        self._db.execute(
            f"CREATE OR REPLACE VIEW {_WIDE_VIEW} AS "
            f"PIVOT (SELECT r.window_id, r.window_start, r.window_end, {series} AS series, r.value "
            "FROM releases r JOIN query_registry q USING (query_id)) "
            f"ON series IN ({values}) USING first(value) GROUP BY window_id, window_start, window_end "
            "ORDER BY window_id")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _window(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer window id, got {name}={value!r}")
    return int(value)


__all__ = ["QueryRegistry"]
