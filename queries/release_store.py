"""The public release store: a DuckDB file of released (noisy) answers and nothing else.

Analysts query the view ``releases`` with SQL, through :func:`connect_read_only` (no file system,
no network, no other database, settings locked). Nothing pre-noise is ever written here
(invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)): true sums, user counts and
budgets live in the curator's ledger, a different file. A ``(query, window, coordinate)`` is
released once (invariant 5):
:meth:`ReleaseStore.publish` inserts only keys not yet present, skips identical re-publishes (a
retried bundle, a re-run, the outbox after a crash) and refuses a *different* row for a released
key, which could only come from a second noisy draw, another noise key or a changed query.

Schema (version 1):

* ``release_data``: the columns of :data:`RELEASE_SCHEMA` plus ``released_at``, primary key
  ``(query_id, window_id, coordinate)``;
* ``releases`` (view, the public contract): ``query_id, window_id, window_start, window_end,
  label, coordinate, value, noise_std, kind, accounting, mechanism, key_fingerprint,
  released_at``;
* ``store_meta(key, value)``: ``schema_version`` and, from the first publish on, the
  ``key_fingerprint`` of the noise key (:attr:`renyi_stream.stream.noise.NoiseKey.fingerprint`, public) and
  the ``ledger_id`` of the ledger that charged for the releases (when the publisher names it:
  :attr:`renyi_stream.pipelines.curator.store.CuratorStore.ledger_id`, a public random identifier). A store
  holds one ledger's answers: a publish naming another ledger is refused.

Version 2 adds the query registry and the analysts' views:

* ``query_registry`` (:mod:`renyi_stream.queries.registry`): one row per registered query, its spec (JSON),
  ``kind`` (``window`` or ``running``), labels, and the windows it is answered in,
  ``[effective_from, retired_from)``;
* ``query_catalogue`` (view): the registry in readable form, with ``dim`` and ``noise_scale`` (the
  query's noise std over the ledger's, from its spec; 1.0 when it declares none). A view holds no
  data, so this version's definition (:data:`_CURRENT_VIEWS`) replaces an older one on every
  read-write open, as the comments are rewritten, without a schema version of its own;
* ``releases_with_ci`` (view): ``releases`` plus ``ci95_low`` / ``ci95_high``
  (``value -/+ 1.96 noise_std``: Gaussian noise of known std, so a 95% band around each release
  that covers the *admitted* sum, :data:`ESTIMAND`, not the population's);
* ``releases_wide`` (view): one row per window, one column per query coordinate (named by the
  query id, or ``query_id[label]`` for a query with several coordinates); recreated whenever the
  registry changes, because DuckDB views cannot pivot on values found in the data.

What a release estimates (docs/architecture.md, "Two databases") is worded once, here
(:data:`ESTIMAND`, :func:`estimand`), and every public surface reads it from here: the store's
DuckDB comments on its views and their ``value``, ``noise_std``, ``ci95_low`` and ``ci95_high``
columns (``SELECT view_name, comment FROM duckdb_views() WHERE NOT internal``; written by every
read-write open whose comments are missing or out of date, so a snapshot of a Parquet release
root, :mod:`renyi_stream.queries.release_root`, carries them too), the HTML report's captions
(:mod:`renyi_stream.queries.report`), and the docs, which quote it and are tested to
(``tests/test_estimand.py``). ``releases_wide`` is recreated by the registry on every change, so
it carries no comment: its columns are the ``value`` column of ``releases``.

Timestamps are ``TIMESTAMP WITH TIME ZONE``; the connections opened here use the UTC time zone so
that ``window_start::DATE`` means the same day on every machine.
"""

from __future__ import annotations

import json

import os
from pathlib import Path
from typing import Any, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.faults import crash_point
from renyi_stream.stream.noise import check_ledger_id

SCHEMA_VERSION = 2

RELEASE_SCHEMA = pa.schema([
    ("query_id", pa.string()),
    ("window_id", pa.int64()),
    ("window_start", pa.timestamp("us", tz="UTC")),
    ("window_end", pa.timestamp("us", tz="UTC")),
    ("label", pa.string()),
    ("coordinate", pa.int32()),
    ("value", pa.float64()),
    ("noise_std", pa.float64()),
    ("kind", pa.string()),
    ("accounting", pa.string()),
    ("mechanism", pa.string()),
    ("key_fingerprint", pa.string()),
])

#: What :meth:`ReleaseStore.read` returns: the release columns and the time of the first publish.
READ_SCHEMA = RELEASE_SCHEMA.append(pa.field("released_at", pa.timestamp("us", tz="UTC")))

#: What a ``window`` release estimates: the sum over the users the individual filter admitted.
ESTIMAND_WINDOW = ("the sum over the users whose budget admitted them in that window (the admitted users), "
                   "not the sum over every user")
#: What a ``running`` release estimates: the admitted sums of its windows, added up.
ESTIMAND_RUNNING = ("the total, from the query's first window through that one, of each window's admitted sum, "
                    "not the total over every user")
#: What the 95% band (``ci95_low`` to ``ci95_high``) covers.
BAND = ("The band value ± 1.96 × noise_std (ci95_low to ci95_high in releases_with_ci) covers that admitted "
        "sum with probability 95%, not the population's sum.")
#: Why the admitted sum is not the population's.
FILTERING = ("A user whose budget has run out is filtered out (left out, or clipped to what was left), so the "
             "admitted sum can fall while the population's does not: a falling series may be filtering, "
             "not a decline.")


def estimand(kind: str | None = None) -> str:
    """What a release of ``kind`` (``window``, ``running``, or None for both) estimates and what
    its band covers, in the one wording every public surface uses."""
    if kind == "window":
        what = ESTIMAND_WINDOW
    elif kind == "running":
        what = ESTIMAND_RUNNING
    elif kind is None:
        what = f"{ESTIMAND_WINDOW} (for a running query: {ESTIMAND_RUNNING})"
    else:
        raise ValueError(f"kind must be 'window', 'running' or None, got kind={kind!r}")
    return f"Each value estimates {what}. {BAND} {FILTERING}"


#: The estimand of every release, both kinds: the text of the store's comments and the docs.
ESTIMAND = estimand()

KINDS = frozenset({"window", "running"})
MECHANISMS = frozenset({"gaussian", "discrete_gaussian"})

_KEY = ("query_id", "window_id", "coordinate")
_NON_EMPTY = ("query_id", "kind", "accounting", "mechanism", "key_fingerprint")
_COLUMNS = ", ".join(RELEASE_SCHEMA.names)
_INCOMING = "_renyi_incoming_releases"

# Schema migrations: version -> the SQL statements that bring a store from ``version - 1`` to
# ``version``. Version 0 is an empty database file. Every migration runs in one transaction
# together with the update of ``store_meta.schema_version``, so a failed one leaves the store
# at its previous version. Add a version here (never edit a released one) and bump SCHEMA_VERSION.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        """CREATE TABLE release_data (
            query_id VARCHAR NOT NULL,
            window_id BIGINT NOT NULL,
            window_start TIMESTAMP WITH TIME ZONE NOT NULL,
            window_end TIMESTAMP WITH TIME ZONE NOT NULL,
            label VARCHAR NOT NULL,
            coordinate INTEGER NOT NULL,
            value DOUBLE NOT NULL,
            noise_std DOUBLE NOT NULL,
            kind VARCHAR NOT NULL,
            accounting VARCHAR NOT NULL,
            mechanism VARCHAR NOT NULL,
            key_fingerprint VARCHAR NOT NULL,
            released_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
            PRIMARY KEY (query_id, window_id, coordinate))""",
        """CREATE VIEW releases AS
            SELECT query_id, window_id, window_start, window_end, label, coordinate, value,
                   noise_std, kind, accounting, mechanism, key_fingerprint, released_at
            FROM release_data""",
    ),
    # Version 2: the query registry (renyi_stream.queries.registry) and the analysts' views.
    2: (
        """CREATE TABLE query_registry (
            query_id VARCHAR PRIMARY KEY,
            kind VARCHAR NOT NULL,
            spec_json VARCHAR NOT NULL,
            labels VARCHAR[] NOT NULL,
            description VARCHAR NOT NULL,
            effective_from BIGINT NOT NULL,
            retired_from BIGINT,
            registered_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now())""",
        """CREATE VIEW releases_with_ci AS
            SELECT *, value - 1.959963984540054 * noise_std AS ci95_low,
                      value + 1.959963984540054 * noise_std AS ci95_high
            FROM releases""",
        """CREATE VIEW query_catalogue AS
            SELECT query_id, kind, description, labels, len(labels) AS dim, effective_from,
                   retired_from, registered_at, spec_json
            FROM query_registry ORDER BY query_id""",
        """CREATE VIEW releases_wide AS
            SELECT DISTINCT window_id, window_start, window_end FROM releases ORDER BY window_id""",
    ),
}


# The analysts' derived views as this version defines them: ``(view, a column only this definition
# has, the statement)``. A migration creates a view as its version did (never edited); a read-write
# open whose view lacks the column replaces it (a view holds no data), then rewrites the comments
# the replacement dropped, in one transaction.
_CURRENT_VIEWS: tuple[tuple[str, str, str], ...] = (
    ("query_catalogue", "noise_scale",
     """CREATE OR REPLACE VIEW query_catalogue AS
            SELECT query_id, kind, description, labels, len(labels) AS dim,
                   COALESCE(CAST(json_extract(spec_json, '$.noise_scale') AS DOUBLE), 1.0) AS noise_scale,
                   effective_from, retired_from, registered_at, spec_json
            FROM query_registry ORDER BY query_id"""),
)


def _views_current(db: duckdb.DuckDBPyConnection) -> bool:
    """Whether every view of :data:`_CURRENT_VIEWS` has this version's columns."""
    columns = set(db.execute("SELECT table_name, column_name FROM duckdb_columns() "
                             "WHERE NOT internal AND database_name = current_database()").fetchall())
    return all((view, column) in columns for view, column, _ in _CURRENT_VIEWS)


def _write_views(db: duckdb.DuckDBPyConnection) -> None:
    for _, _, statement in _CURRENT_VIEWS:
        db.execute(statement)


def _comments() -> dict[tuple[str, str | None], str]:
    """The DuckDB comment of each ``(view, column)`` (column None: the view itself)."""
    low = f"value - 1.96 × noise_std, the low end of the 95% band. {ESTIMAND}"
    high = f"value + 1.96 × noise_std, the high end of the 95% band. {ESTIMAND}"
    value = f"The released noisy answer. {ESTIMAND}"
    noise = f"The standard deviation of the Gaussian noise in value. {ESTIMAND}"
    return {
        ("releases", None): f"Released noisy answers, one row per (query, window, coordinate). {ESTIMAND}",
        ("releases", "value"): value,
        ("releases", "noise_std"): noise,
        ("releases_with_ci", None): f"releases plus ci95_low and ci95_high. {ESTIMAND}",
        ("releases_with_ci", "value"): value,
        ("releases_with_ci", "noise_std"): noise,
        ("releases_with_ci", "ci95_low"): low,
        ("releases_with_ci", "ci95_high"): high,
        ("query_catalogue", None): f"Every registered query and the windows it is answered in. {ESTIMAND}",
    }


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _comments_current(db: duckdb.DuckDBPyConnection) -> bool:
    """Whether every comment of :func:`_comments` is in place, worded as now."""
    views = dict(db.execute("SELECT view_name, comment FROM duckdb_views() "
                            "WHERE NOT internal AND database_name = current_database()").fetchall())
    columns = {(table, column): comment for table, column, comment in db.execute(
        "SELECT table_name, column_name, comment FROM duckdb_columns() "
        "WHERE NOT internal AND database_name = current_database()").fetchall()}
    return all((views.get(view) if column is None else columns.get((view, column))) == text
               for (view, column), text in _comments().items())


def _write_comments(db: duckdb.DuckDBPyConnection) -> None:
    for (view, column), text in _comments().items():
        target = f"VIEW {view}" if column is None else f"COLUMN {view}.{column}"
        db.execute(f"COMMENT ON {target} IS {_sql_text(text)}")


class ReleaseStoreError(RuntimeError):
    """The release store cannot be opened or used as asked."""


class ReleaseConflictError(ReleaseStoreError):
    """A second, different answer for a released key, or releases made with another noise key or
    charged by another ledger."""


# --- validation (pure, before anything touches the database) -------------------------------


def _validate(releases: Any) -> pa.Table:
    """Return ``releases`` cast to :data:`RELEASE_SCHEMA`, or raise ValueError naming the column.

    Messages never quote released values: a refused row may be a second noisy draw of a
    released window, and two draws of one window average the noise away.
    """
    if not isinstance(releases, pa.Table):
        raise ValueError(f"releases must be a pyarrow.Table, got releases={type(releases).__name__}")
    names = releases.column_names
    if len(set(names)) != len(names):
        raise ValueError(f"releases have duplicate columns {sorted({n for n in names if names.count(n) > 1})}")
    missing = [name for name in RELEASE_SCHEMA.names if name not in names]
    if missing:
        raise ValueError(f"releases are missing column(s) {missing}; expected {RELEASE_SCHEMA.names}")
    # Refuse rather than drop: an unexpected column (a true sum, a user count) means the caller
    # is about to publish something that is not a release.
    extra = [name for name in names if name not in RELEASE_SCHEMA.names]
    if extra:
        raise ValueError(f"releases have unexpected column(s) {extra}; the release store holds only "
                         f"{RELEASE_SCHEMA.names}")
    columns = []
    for field in RELEASE_SCHEMA:
        column = releases.column(field.name)
        try:
            columns.append(column.cast(field.type))  # safe cast: no truncation, no overflow
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ValueError(f"releases column {field.name!r} of type {column.type} cannot be cast to "
                             f"{field.type}: {exc}") from exc
        if columns[-1].null_count:
            raise ValueError(f"releases column {field.name!r} has {columns[-1].null_count} null(s)")
    table = pa.Table.from_arrays(columns, schema=RELEASE_SCHEMA)
    if table.num_rows == 0:
        return table

    value = table.column("value").to_numpy()
    bad = int(np.count_nonzero(~np.isfinite(value)))
    if bad:
        raise ValueError(f"releases column 'value' must be finite; {bad} row(s) are NaN or infinite")
    std = table.column("noise_std").to_numpy()
    bad = int(np.count_nonzero(~(np.isfinite(std) & (std > 0))))
    if bad:
        raise ValueError(f"releases column 'noise_std' must be finite and > 0; {bad} row(s) are not")
    bad = table.num_rows - pc.sum(pc.greater(table.column("window_end"), table.column("window_start"))).as_py()
    if bad:
        raise ValueError(f"releases column 'window_end' must be after 'window_start'; {bad} row(s) are not")
    bad = int(pc.sum(pc.less(table.column("coordinate"), 0)).as_py() or 0)
    if bad:
        raise ValueError(f"releases column 'coordinate' must be >= 0; {bad} row(s) are negative")
    for name in _NON_EMPTY:
        bad = int(pc.sum(pc.equal(pc.utf8_length(table.column(name)), 0)).as_py() or 0)
        if bad:
            raise ValueError(f"releases column {name!r} must be non-empty; {bad} row(s) are empty")
    for name, allowed in (("kind", KINDS), ("mechanism", MECHANISMS)):
        unknown = sorted(set(pc.unique(table.column(name)).to_pylist()) - allowed)
        if unknown:
            raise ValueError(f"releases column {name!r} has unknown value(s) {unknown}; "
                             f"expected one of {sorted(allowed)}")
    distinct = table.select(list(_KEY)).group_by(list(_KEY)).aggregate([]).num_rows
    if distinct != table.num_rows:
        raise ValueError(f"releases repeat the key {list(_KEY)}: {table.num_rows - distinct} duplicate row(s) "
                         "in one batch")
    return table


def _to_table(result: Any) -> pa.Table:
    """An Arrow table from a DuckDB result, across the supported DuckDB versions."""
    if hasattr(result, "to_arrow_table"):  # duckdb >= 1.4
        return result.to_arrow_table()
    return result.fetch_arrow_table()


# --- the store ---------------------------------------------------------------------------------


class ReleaseStore:
    """Read and append released answers; opened read-write by the job, read-only otherwise.

    The first read-write open of a missing or empty file creates it (and its parent folders)
    with the current schema; an older store is migrated; a newer one, or a database that is not
    a release store (the curator's ledger, say), is refused.
    """

    def __init__(self, path: str | os.PathLike, *, read_only: bool = False) -> None:
        self._path = Path(path)
        self._read_only = bool(read_only)
        if self._read_only and not self._path.exists():
            raise ReleaseStoreError(f"release store {self._path} does not exist (opened read-only, so it "
                                    "is not created); publish to it once first")
        if not self._read_only:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db: duckdb.DuckDBPyConnection | None = duckdb.connect(str(self._path), read_only=self._read_only)
        except duckdb.Error as exc:
            raise ReleaseStoreError(f"cannot open release store {self._path}: {exc}") from exc
        try:
            self._db.execute("SET TimeZone = 'UTC'")
            self._migrate()
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> Path:
        return self._path

    def __enter__(self) -> "ReleaseStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else ("read-only" if self._read_only else "read-write")
        return f"ReleaseStore({str(self._path)!r}, {state})"

    def close(self) -> None:
        """Close the connection; a second call does nothing."""
        if self._db is not None:
            db, self._db = self._db, None
            db.close()

    @property
    def _conn(self) -> duckdb.DuckDBPyConnection:
        if self._db is None:
            raise ReleaseStoreError(f"release store {self._path} is closed")
        return self._db

    # --- schema -------------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The schema version recorded in the file (0 for an empty file)."""
        return _schema_version(self._conn, self._path)

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchone()
        return None if row is None else row[0]

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise ReleaseStoreError(
                f"release store {self._path} has schema version {version}, newer than this renyi-stream "
                f"understands ({SCHEMA_VERSION}); upgrade renyi-stream")
        if version == SCHEMA_VERSION:
            if not self._read_only and not (_views_current(self._conn) and _comments_current(self._conn)):
                self._describe()
            return
        if self._read_only:
            raise ReleaseStoreError(
                f"release store {self._path} has schema version {version} and needs a migration to "
                f"{SCHEMA_VERSION}; open it read-write once (the next daily run does)")
        db = self._conn
        db.execute("BEGIN TRANSACTION")
        try:
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    db.execute(statement)
            _write_views(db)
            _write_comments(db)
            db.execute("INSERT OR REPLACE INTO store_meta (key, value) VALUES ('schema_version', ?)",
                       [str(SCHEMA_VERSION)])
            db.execute("COMMIT")
        except BaseException as exc:
            _rollback(db)
            if isinstance(exc, duckdb.Error):
                raise ReleaseStoreError(f"migrating release store {self._path} from schema version {version} "
                                        f"to {SCHEMA_VERSION} failed (nothing was changed): {exc}") from exc
            raise

    def _describe(self) -> None:
        """Write this version's views (:data:`_CURRENT_VIEWS`) and the comments of :func:`_comments`
        (what each release estimates), in one transaction."""
        db = self._conn
        db.execute("BEGIN TRANSACTION")
        try:
            if not _views_current(db):
                _write_views(db)
            _write_comments(db)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    # --- writing ------------------------------------------------------------------------------

    def publish(self, releases: pa.Table, *, ledger_id: str | None = None) -> int:
        """Insert the releases not yet in the store, in one transaction; return how many.

        ``releases`` has the columns of :data:`RELEASE_SCHEMA` (types castable to them, no
        nulls, finite values, ``noise_std > 0``, ``window_end > window_start``, one row per
        ``(query_id, window_id, coordinate)``), else ValueError naming the column. A row whose key
        is already released with identical contents is skipped (invariant 5: a re-run publishes
        nothing new). A row that differs from the released one, a noise key other than the
        store's, or a ``ledger_id`` other than the store's (:meth:`check_ledger`), raises
        :class:`ReleaseConflictError` and nothing of the batch is inserted. ``ledger_id``, the
        ledger that charged for the releases, is recorded with the first publish that names one.
        """
        return self._publish(releases, ledger_id=ledger_id)

    def check_publishable(self, releases: pa.Table, *, ledger_id: str | None = None) -> None:
        """Every check :meth:`publish` makes before it inserts, inserting nothing: ValueError for
        malformed ``releases``, :class:`ReleaseConflictError` for another ledger, another noise
        key or a row differing from a released one (first write wins). The daily job calls it on
        every committed window before it publishes the first (``renyi_stream.stream.engine.publication``)."""
        table = _validate(releases)
        if table.num_rows == 0:
            return
        self._check_batch(table, ledger_id)
        self._conn.register(_INCOMING, table)
        try:
            self._refuse_conflicts()
        finally:
            self._conn.unregister(_INCOMING)

    def _check_batch(self, table: pa.Table, ledger_id: str | None) -> tuple[str, str | None]:
        """``(the batch's key fingerprint, the store's or None)``, after refusing another ledger,
        a batch of several keys or a key other than the store's."""
        if ledger_id is not None:
            self.check_ledger(ledger_id)
        fingerprints = sorted(pc.unique(table.column("key_fingerprint")).to_pylist())
        if len(fingerprints) != 1:
            raise ReleaseConflictError(
                f"releases carry several noise key fingerprints {fingerprints}; one batch comes from one key")
        fingerprint = fingerprints[0]
        stored = self._meta("key_fingerprint")
        if stored is not None and stored != fingerprint:
            raise ReleaseConflictError(
                f"release store {self._path} holds releases made with noise key {stored}; these releases "
                f"come from noise key {fingerprint}: refusing to mix answers from two keys (a re-run with "
                "another key would be a second, independent noisy draw)")
        return fingerprint, stored

    def _publish(self, releases: pa.Table, *, ledger_id: str | None = None) -> int:
        if self._read_only:
            raise ReleaseStoreError(f"release store {self._path} is open read-only; cannot publish")
        table = _validate(releases)
        if table.num_rows == 0:
            return 0
        # One writer at a time: DuckDB locks the file against other processes, and this
        # connection runs nothing else in between, so the checks hold for the insert below.
        fingerprint, stored = self._check_batch(table, ledger_id)
        db = self._conn
        db.register(_INCOMING, table)
        try:
            self._refuse_conflicts()
            db.execute("BEGIN TRANSACTION")
            try:
                inserted = self._insert_new()
                if stored is None:
                    db.execute("INSERT INTO store_meta (key, value) VALUES ('key_fingerprint', ?)", [fingerprint])
                if ledger_id is not None and self.ledger_id() is None:
                    db.execute("INSERT INTO store_meta (key, value) VALUES ('ledger_id', ?)", [ledger_id])
                crash_point("during_release_insert")  # test-only: rows inserted, transaction not committed
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
        finally:
            db.unregister(_INCOMING)
        return inserted

    def _refuse_conflicts(self) -> None:
        """ReleaseConflictError when a registered incoming row differs from the released row of
        its key (first write wins)."""
        compared = [name for name in RELEASE_SCHEMA.names if name not in _KEY]
        differs = " OR ".join(f"i.{name} IS DISTINCT FROM r.{name}" for name in compared)
        which = ", ".join(f"i.{name} IS DISTINCT FROM r.{name}" for name in compared)
        rows = self._conn.execute(f"""
            SELECT i.query_id, i.window_id, i.coordinate, {which}
            FROM {_INCOMING} i JOIN release_data r USING (query_id, window_id, coordinate)
            WHERE {differs}
            ORDER BY i.query_id, i.window_id, i.coordinate""").fetchall()
        if rows:
            columns = sorted({name for row in rows for name, d in zip(compared, row[3:]) if d})
            keys = [tuple(row[:3]) for row in rows[:3]]
            raise ReleaseConflictError(
                f"{len(rows)} release(s) differ from what release store {self._path} already holds for "
                f"the same (query_id, window_id, coordinate), e.g. {keys}, in column(s) {columns}: a "
                "window is released once (first write wins); nothing from this batch was inserted")

    def _insert_new(self) -> int:
        """Insert the registered incoming rows whose key is not released yet."""
        return int(self._conn.execute(f"""
            INSERT INTO release_data ({_COLUMNS})
            SELECT {_COLUMNS} FROM {_INCOMING} i
            WHERE NOT EXISTS (
                SELECT 1 FROM release_data r
                WHERE r.query_id = i.query_id AND r.window_id = i.window_id
                  AND r.coordinate = i.coordinate)""").fetchone()[0])

    # --- reading ------------------------------------------------------------------------------

    def record_promise(self, *, epsilon: float, delta: float, accounting: str, norm_budget: float) -> None:
        """Record the public promise every user has, ``(epsilon, delta)`` under ``accounting`` with
        squared-norm budget ``norm_budget``, in ``store_meta`` (keys ``promise_*``), for reports."""
        values = {"promise_epsilon": repr(float(epsilon)), "promise_delta": repr(float(delta)),
                  "promise_accounting": str(accounting), "promise_norm_budget": repr(float(norm_budget))}
        for key, value in values.items():
            self._conn.execute("INSERT OR REPLACE INTO store_meta (key, value) VALUES (?, ?)", [key, value])

    def promise(self) -> dict[str, str]:
        """The recorded promise (``epsilon``, ``delta``, ``accounting``, ``norm_budget``), or {}."""
        rows = self._conn.execute("SELECT key, value FROM store_meta WHERE key LIKE 'promise_%'").fetchall()
        return {key.removeprefix("promise_"): value for key, value in rows}

    def record_input_columns(self, numeric: Sequence[str], strings: Sequence[str] = (),
                             undeclared: Sequence[str] = ()) -> None:
        """Record the daily input's columns (public schema, no data) in ``store_meta`` (key
        ``input_columns``, JSON): its numeric indicator columns, its string columns (which
        histograms over string categories read) and its undeclared ones (CSV columns no query
        reads yet, which either kind of query may read). A query reading a column the input does
        not have, or of the wrong kind, is then refused when it is registered, not when the
        curator's job runs. The kinds come from declared types and registered queries, never
        from values (:mod:`renyi_stream.stream.columns`): this record is public."""
        self._conn.execute("INSERT OR REPLACE INTO store_meta (key, value) VALUES ('input_columns', ?)",
                           [json.dumps({"numeric": list(numeric), "string": list(strings),
                                        "undeclared": list(undeclared)})])

    def record_input_contract(self, contract_json: str) -> None:
        """Record the ledger's declared input contract (:meth:`renyi_stream.stream.contract.InputContract.to_json`:
        the id type, the columns, their kinds and bounds; public, declared, no data) in
        ``store_meta`` (key ``input_contract``), so analysts read the bound a default sum clamps to."""
        self._conn.execute("INSERT OR REPLACE INTO store_meta (key, value) VALUES ('input_contract', ?)",
                           [contract_json])

    def input_contract(self) -> str | None:
        """The recorded input contract's JSON text (None when no run recorded one)."""
        return self._meta("input_contract")

    def input_schema(self, *, undeclared_as: pa.DataType = pa.float64()) -> pa.Schema | None:
        """The columns a query may read, as the last run saw them: numeric ones as float64 (as
        validation leaves them), string ones as utf8, undeclared ones as ``undeclared_as`` (the
        type the query at hand would have them parsed to). None before the first run."""
        value = self._meta("input_columns")
        if value is None:
            return None
        recorded = json.loads(value)
        return pa.schema([(name, pa.float64()) for name in recorded.get("numeric", [])]
                         + [(name, pa.string()) for name in recorded.get("string", [])]
                         + [(name, undeclared_as) for name in recorded.get("undeclared", [])])

    def key_fingerprint(self) -> str | None:
        """The fingerprint of the noise key of the releases here (None before the first publish)."""
        return self._meta("key_fingerprint")

    def ledger_id(self) -> str | None:
        """The id of the ledger that charged for the releases here (None before the first publish
        that named one, e.g. in a store last written before ledger ids existed)."""
        return self._meta("ledger_id")

    def check_ledger(self, ledger_id: str) -> None:
        """Refuse (:class:`ReleaseConflictError`, naming both ids) a ledger other than the one
        this store's releases were charged by; a store that records none accepts any.

        One store answers for one ledger: the promise to each user is kept by one ledger's
        account of every answer they are in, and a second ledger publishing here would charge
        its users for answers the first ledger never counted. Call it before anyone is charged."""
        ledger_id = check_ledger_id(ledger_id)
        stored = self.ledger_id()
        if stored is not None and stored != ledger_id:
            raise ReleaseConflictError(
                f"release store {self._path} holds releases charged by ledger {stored}; this ledger is {ledger_id}: "
                "refusing to mix answers of two ledgers in one store (their users' budgets would not account for "
                "each other's answers). Use the ledger that made this store, or another store")

    def released_windows(self, query_id: str) -> list[int]:
        """The sorted window ids released for ``query_id`` (empty for an unknown query)."""
        rows = self._conn.execute(
            "SELECT DISTINCT window_id FROM release_data WHERE query_id = ? ORDER BY window_id",
            [query_id]).fetchall()
        return [int(window) for (window,) in rows]

    def read(self, query_id: str | None = None) -> pa.Table:
        """Releases (all, or one query's), ordered by query_id, window_id, coordinate."""
        sql = f"SELECT {_COLUMNS}, released_at FROM releases"
        params: list[Any] = []
        if query_id is not None:
            sql += " WHERE query_id = ?"
            params.append(query_id)
        sql += " ORDER BY query_id, window_id, coordinate"
        return _to_table(self._conn.execute(sql, params)).cast(READ_SCHEMA)


def _rollback(db: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if any: a failed COMMIT has already ended it, and its
    error, not a second one from ROLLBACK, is the one to report."""
    try:
        db.execute("ROLLBACK")
    except duckdb.Error:
        pass


def _schema_version(db: duckdb.DuckDBPyConnection, path: Path) -> int:
    tables = {name for (name,) in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database()").fetchall()}
    if "store_meta" not in tables:
        if tables:
            raise ReleaseStoreError(
                f"{path} is a DuckDB database but not a renyi-stream release store (it has tables "
                f"{sorted(tables)[:5]} and no store_meta); refusing to use it")
        return 0
    row = db.execute("SELECT value FROM store_meta WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise ReleaseStoreError(f"release store {path} has no valid schema_version in store_meta "
                                f"(found {None if row is None else row[0]!r})") from None


# --- the analysts' entry point -----------------------------------------------------------------


def connect_read_only(path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection for analysts' SQL over the release store at ``path``.

    Read-only, with external access disabled (no files, no network, no ATTACH of another
    database such as the curator's ledger, no extension install or load from disk) and the
    configuration locked, so SQL cannot turn any of that back on. The session time zone is UTC.
    """
    path = Path(path)
    if not path.exists():
        raise ReleaseStoreError(f"release store {path} does not exist")
    try:
        db = duckdb.connect(str(path), read_only=True, config={
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        })
    except duckdb.Error as exc:
        raise ReleaseStoreError(f"cannot open release store {path} read-only: {exc}") from exc
    try:
        # TimeZone is provided by the ICU extension, so it is not a connect-time option; set it,
        # then lock the configuration before any analyst SQL runs.
        db.execute("SET TimeZone = 'UTC'")
        db.execute("SET lock_configuration = true")
        version = _schema_version(db, path)
        if version != SCHEMA_VERSION:
            raise ReleaseStoreError(
                f"release store {path} has schema version {version}, this renyi-stream reads version "
                f"{SCHEMA_VERSION}" + ("; open it read-write once to migrate it" if version < SCHEMA_VERSION
                                       else "; upgrade renyi-stream"))
    except BaseException:
        db.close()
        raise
    return db
