"""The registry of queries, kept in the public release store (query specs are public).

Analysts register a query with the window it takes effect from, after looking at earlier
releases: the fully adaptive setting of Feldman & Zrnic (each query may depend on every earlier
release; the individual filter's guarantee, Theorem 4.5, holds for such adaptively chosen
queries). The daily job answers, in each window, every query active in it
(:meth:`QueryRegistry.plan`). A registration or retirement that would change an already
released window is refused: released answers never change.

The registry is the table ``query_registry`` of the store (schema version 2, see
:mod:`renyi_stream.queries.release_store`). Every change also recreates the view ``releases_wide`` (one row
per window, one column per registered query coordinate) in the same transaction, because a
DuckDB view cannot pivot on values found in the data: any DuckDB client, read-only included,
then reads it with a plain ``SELECT * FROM releases_wide``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import duckdb
import pyarrow as pa

from renyi_stream.queries import registration as rules
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registration import Registration
from renyi_stream.queries.release_store import ReleaseStore, ReleaseStoreError, _to_table

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
        return self._store._conn  # the registry is part of the store's schema (renyi_stream.queries.release_store)

    # -- reading ----------------------------------------------------------------------------------

    def last_released_window(self) -> int | None:
        """The latest window released for any query (None before the first release)."""
        row = self._db.execute("SELECT max(window_id) FROM release_data").fetchone()
        return None if row[0] is None else int(row[0])

    def list(self) -> pa.Table:
        """The catalogue (view ``query_catalogue``), one row per registered query, by query id:
        ``query_id, kind, description, labels, dim, noise_scale, effective_from, retired_from,
        registered_at, spec_json`` (``noise_scale``: the query's noise std over the ledger's)."""
        return _to_table(self._db.execute("SELECT * FROM query_catalogue ORDER BY query_id"))

    def get(self, query_id: str) -> LinearQuery:
        """The registered query ``query_id``; ValueError if there is none."""
        row = self._db.execute("SELECT spec_json FROM query_registry WHERE query_id = ?", [query_id]).fetchone()
        if row is None:
            raise ValueError(f"query_id {query_id!r} is not registered")
        return LinearQuery.from_json(row[0])

    def registrations(self) -> list[Registration]:
        """Every registered query with its windows (:class:`renyi_stream.queries.registration.Registration`), by query id."""
        rows = self._db.execute("SELECT spec_json, effective_from, retired_from, CAST(registered_at AS VARCHAR) "
                                "FROM query_registry ORDER BY query_id").fetchall()
        return [Registration(LinearQuery.from_json(spec), int(first), None if retired is None else int(retired),
                             registered or "") for spec, first, retired, registered in rows]

    def plan(self, start_window: int, end_window: int) -> list[tuple[LinearQuery, int, int | None]]:
        """Each query active in some window of ``[start_window, end_window]`` (inclusive), with
        its first window and the window it is retired from (None if not retired), by query id
        (:func:`renyi_stream.queries.registration.active_between`).

        A query is active in window ``w`` when ``effective_from <= w < retired_from``.
        """
        return [(r.query, r.effective_from, r.retired_from)
                for r in rules.active_between(self.registrations(), start_window, end_window)]

    def active(self, window_id: int) -> list[LinearQuery]:
        """The queries answered in ``window_id``, by query id."""
        window = rules.window_id("window_id", window_id)
        return [query for query, _, _ in self.plan(window, window)]

    # -- changing ---------------------------------------------------------------------------------

    def add(self, query: LinearQuery, *, effective_from: int) -> None:
        """Register ``query``, answered in every window from ``effective_from`` on.

        Refused (ValueError, nothing changed) by the catalogue rules of
        :func:`renyi_stream.queries.registration.check_new`: when the id is already registered (a retired id
        stays taken: its releases keep its meaning), when the query reads a column the daily
        input does not have, or of the wrong kind (once a run has recorded them), when
        ``effective_from`` is not after the last window released for any query (a released
        window never changes), or when the queries active together in some window from
        ``effective_from`` on would have more than ``MAX_DIM`` coordinates (the ledger charges
        their concatenation), or when a running query is above the bounds on what a job keeps for
        it, alone or with the running queries active with it (docs/running_totals.md, "Bounds").
        """
        if not isinstance(query, LinearQuery):
            raise ValueError(f"query must be a LinearQuery, got {type(query).__name__}")
        # A CSV column no query reads yet is undeclared: this query reads it as it needs it.
        schema = self._store.input_schema(undeclared_as=pa.string() if query.categorical else pa.float64())
        registration = rules.check_new(self.registrations(), query, effective_from,
                                       last_released=self.last_released_window(), schema=schema)
        self._in_transaction(
            "INSERT INTO query_registry (query_id, kind, spec_json, labels, description, effective_from) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [query.query_id, query.kind, query.to_json(), list(query.labels), query.description,
             registration.effective_from])

    def retire(self, query_id: str, *, from_window: int) -> bool:
        """Stop answering ``query_id`` from window ``from_window`` on (its releases stay); from its
        first window, withdraw it (active in no window; its id stays taken). True when withdrawn.

        Refused (ValueError, nothing changed) by :func:`renyi_stream.queries.registration.check_retirement`:
        an unknown or already retired query, a ``from_window`` before the query's first window,
        or not after the last released window.
        """
        retired = rules.check_retirement(self.registrations(), query_id, from_window,
                                         last_released=self.last_released_window())
        self._in_transaction("UPDATE query_registry SET retired_from = ? WHERE query_id = ?",
                             [retired.retired_from, query_id])
        return retired.retired_from == retired.effective_from

    def import_registrations(self, registrations: Sequence[Registration]) -> None:
        """Copy ``registrations`` (another catalogue's: :meth:`renyi_stream.queries.catalogue.ReleaseCatalogue.registrations`)
        into this registry as they are, first windows and retirements included, without the
        rules of :meth:`add`: for a snapshot of a Parquet release root as a store
        (:func:`renyi_stream.queries.release_root.snapshot_store`), whose catalogue already kept them."""
        for r in registrations:
            self._in_transaction(
                "INSERT INTO query_registry (query_id, kind, spec_json, labels, description, effective_from, "
                "retired_from) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [r.query_id, r.query.kind, r.query.to_json(), list(r.query.labels), r.query.description,
                 r.effective_from, r.retired_from])

    def defer_unanswered(self, processed_through: int) -> list[tuple[str, int, int]]:
        """Move the first window of every query that starts in a window the curator has already
        charged (``<= processed_through``) but was never answered, to ``processed_through + 1``
        (:func:`renyi_stream.queries.registration.deferrals`).

        This happens only when a query is registered after a run committed a window and before it
        published it (a crash in between): the store did not yet show that window as released,
        so the registration was accepted, yet the window's answers were fixed without the new
        query. Moving its start changes no released answer and keeps the catalogue truthful (a
        running total then starts where it is first answered). Returns ``(query_id, old, new)``
        per query moved; a query whose retirement would come first is retired instead of moved.
        """
        answered = {str(q) for (q,) in self._db.execute("SELECT DISTINCT query_id FROM release_data").fetchall()}
        moved = []
        for registration, old in rules.deferrals(self.registrations(), processed_through, answered):
            self._in_transaction("UPDATE query_registry SET effective_from = ?, retired_from = ? WHERE query_id = ?",
                                 [registration.effective_from, registration.retired_from, registration.query_id])
            moved.append((registration.query_id, old, int(processed_through) + 1))
        return moved

    # -- private ----------------------------------------------------------------------------------

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


__all__ = ["QueryRegistry"]
