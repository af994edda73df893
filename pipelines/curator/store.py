"""The curator's ledger database: per-user budgets, processed windows, the release outbox.

Everything here is sensitive (used budgets, row counts, dead-letter rows): it never goes to the
public release store: invariant 4 (nothing-pre-noise-leaves, docs/architecture.md). One DuckDB
file holds:

* ``meta``: the configuration the ledger was started with, as
  :meth:`renyi_stream.stream.engine.ledger_config.LedgerConfig.to_meta` writes it (a daily job must not change
  the promise half-way: a run with other parameters is refused), and the ledger's random
  identifier ``ledger_id`` (:attr:`CuratorStore.ledger_id`), which its releases' noise is bound to;
* ``ledger``: per user, the used zCDP budget and the personal tracker;
* ``processed_windows``: windows already charged and released (invariant 6: never twice);
* ``outbox``: released (noisy) answers committed with the ledger in one transaction and then
  published to the release store window by window (the daily job's outbox for
  :func:`renyi_stream.stream.engine.publication.publish_outbox`: at-least-once publish, idempotent insert there);
* ``window_counts`` and ``dead_letters``: row accounting (invariant 7);
* under ``meta`` too, the release store the ledger publishes to (``release_store``, a resolved
  absolute path) and where the ledger itself was when it recorded it (``release_store_bound_at``):
  :meth:`CuratorStore.bind_release_store`, one ledger bound to one store.

A run commits everything in one transaction (:meth:`CuratorStore.commit_run`), so a crash
leaves either the previous state or the new one, never a ledger without its releases.

The file, its write-ahead log and the lock file are created ``0600`` (folders made for them
``0700``) whatever the umask, and a ledger or log that group/others may read is refused before
it is opened (:mod:`renyi_stream.stream.private_files`, :func:`refuse_a_shared_ledger`). What DuckDB spills to
disk (a sort or join larger than its memory) goes to ``<ledger>.tmp/``, a ``0700`` folder of ours
(:func:`connect_curator`), in files created ``0600``.
"""

from __future__ import annotations

import contextlib

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.queries.release_store import RELEASE_SCHEMA
from renyi_stream.stream.engine.ledger_config import LedgerConfig, LedgerConfigError
from renyi_stream.stream.faults import crash_point
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import check_ledger_id, new_ledger_id
from renyi_stream.stream.private_files import (PrivateFileError, make_private_dirs, private_temp_dir, private_umask,
                                  process_alive, refuse_if_shared, under_private_umask)

SCHEMA_VERSION = 1

#: ``meta`` keys of the store binding (:meth:`CuratorStore.bind_release_store`): the release store
#: the ledger publishes to, and the ledger's own place when it recorded it (both resolved paths).
STORE_KEY = "release_store"
STORE_BOUND_AT_KEY = "release_store_bound_at"
#: The ``renyi-stream run`` option that says the release store moved (re-records its place).
STORE_MOVED_OPTION = "--store-moved"


class CuratorStoreError(RuntimeError):
    """The ledger database cannot be used as asked (locked, corrupted, other parameters)."""


class RunLock:
    """An exclusive lock file next to the ledger: one run at a time per ledger.

    A lock left by a process that no longer exists (killed mid-run) is taken over: the ledger's
    transaction guarantees that such a run left either all or none of its state.
    """

    def __init__(self, ledger_path: str | os.PathLike) -> None:
        self.path = Path(str(ledger_path) + ".lock")
        self._held = False

    def __enter__(self) -> "RunLock":
        make_private_dirs(self.path.parent)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and process_alive(holder):
                    raise CuratorStoreError(
                        f"another renyi-stream run (pid {holder}) is using the ledger "
                        f"{str(self.path)[:-5]}; wait for it to finish (lock file {self.path})"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(str(os.getpid()))
            self._held = True
            return self
        raise CuratorStoreError(f"could not take the lock {self.path}")

    def __exit__(self, *exc: Any) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def _holder(self) -> int | None:
        try:
            return int(self.path.read_text().strip() or "0") or None
        except (OSError, ValueError):
            return None


def refuse_a_shared_ledger(path: str | os.PathLike) -> None:
    """CuratorStoreError naming the file and the fix (``chmod 600``) when the ledger database
    or its write-ahead log exists and group/others may read or write it. A shared file that is
    not a ledger at all (the public release store given as the ledger) is refused as such, so
    that nobody is told to make a public file private."""
    try:
        refuse_if_shared(path, "the ledger")
        refuse_if_shared(f"{path}.wal", "the ledger's write-ahead log")
    except PrivateFileError as exc:
        raise CuratorStoreError(_not_a_ledger(Path(path)) or str(exc)) from None


def connect_curator(path: str | os.PathLike, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to the curator database ``path`` (the ledger) that spills only into
    its private folder ``<path>.tmp`` (:func:`renyi_stream.stream.private_files.private_temp_dir`, ``0700``),
    set at connect time (``SET temp_directory`` after connecting works too, but SQL could change
    it). Every connection to the ledger is made here, so they agree (DuckDB refuses a second
    connection to a file with another configuration). Run its queries under
    :func:`renyi_stream.stream.private_files.private_umask` so that the spill files are ``0600`` as well.
    CuratorStoreError naming the folder and the fix when it is not private; duckdb.Error as is."""
    try:
        folder = private_temp_dir(path)
    except PrivateFileError as exc:
        raise CuratorStoreError(str(exc)) from None
    return duckdb.connect(str(path), read_only=read_only, config={"temp_directory": str(folder)})


@contextlib.contextmanager
def ledger_read_only(path: str | os.PathLike) -> Iterator[tuple[duckdb.DuckDBPyConnection, set[str], LedgerConfig | None]]:
    """The ledger at ``path`` opened read-only, with its tables and the configuration it records
    (None when no run has recorded one): nothing is created, migrated or given an id. Call it
    under :func:`renyi_stream.stream.private_files.private_umask` (what DuckDB spills to
    ``<ledger>.tmp/`` is then 0600). CuratorStoreError for a path that does not exist, a ledger
    others may read, a file that is not a ledger (a release store is named as one), or a record
    that cannot be read. The one way every read-only reader of a ledger opens it."""
    path = Path(path)
    if not path.is_file():
        raise CuratorStoreError(f"the ledger {path} does not exist")
    refuse_a_shared_ledger(path)
    try:
        db = connect_curator(path, read_only=True)
    except duckdb.Error as exc:
        raise CuratorStoreError(f"cannot open the ledger {path} read-only: {exc}") from exc
    try:
        tables = {name for (name,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        foreign = _foreign_tables(path, tables)
        if foreign or "meta" not in tables:
            raise CuratorStoreError(foreign or f"{path} is not a renyi-stream ledger (no meta table)")
        rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
        try:
            params = LedgerConfig.from_meta(rows, where=f"the ledger {path}")
        except LedgerConfigError as exc:
            raise CuratorStoreError(str(exc)) from None
        yield db, tables, params
    finally:
        db.close()


@under_private_umask  # what DuckDB spills to <ledger>.tmp/ is 0600
def recorded_parameters(path: str | os.PathLike) -> LedgerConfig | None:
    """The configuration the ledger at ``path`` records (None when no run has recorded one), read
    without writing anything (:func:`ledger_read_only`, whose refusals it shares)."""
    with ledger_read_only(path) as (_, _, params):
        return params


def _not_a_ledger(path: Path) -> str | None:
    """Why the DuckDB file ``path`` is not a ledger, read-only; None for a ledger (or a file
    DuckDB cannot read: its own error comes when it is opened). It reads only the catalogue and
    may be a public file: DuckDB may not spill (an empty ``temp_directory``), so nothing is
    created beside it."""
    try:
        with duckdb.connect(str(path), read_only=True, config={"temp_directory": ""}) as db:
            tables = {name for (name,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    except duckdb.Error:
        return None
    return _foreign_tables(path, tables)


def _foreign_tables(path: Path, tables: set[str]) -> str | None:
    if "store_meta" in tables or (tables and "meta" not in tables):
        return (f"{path} is a DuckDB database but not a renyi-stream ledger (it has tables "
                f"{sorted(tables)[:8]} and no ledger meta); refusing to use it"
                + ("; it is a public release store: give the curator's ledger file" if "store_meta" in tables else ""))
    return None


class CuratorStore:
    """The ledger database (DuckDB), opened read-write by one run at a time.

    Private whatever the umask: an existing file (or write-ahead log) that group/others may
    read is refused; every step that may create the file or its log (DuckDB creates the log at
    the first write after a checkpoint), or spill a large read to ``<ledger>.tmp/``
    (:func:`connect_curator`), runs under :func:`renyi_stream.stream.private_files.private_umask`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._binding: dict[str, str] | None = None  # a store binding to record with the next commit
        refuse_a_shared_ledger(self.path)
        make_private_dirs(self.path.parent)
        with private_umask():
            self._open()

    def _open(self) -> None:
        try:
            self._db = connect_curator(self.path)
        except duckdb.IOException as exc:
            raise CuratorStoreError(
                f"cannot open the ledger {self.path}: {exc}. Is another process using it?"
            ) from exc
        except duckdb.Error as exc:
            raise CuratorStoreError(f"the ledger {self.path} is not a readable DuckDB database: {exc}") from exc
        self._create()

    def close(self) -> None:
        with private_umask():  # the closing checkpoint writes the file
            self._db.close()

    def __enter__(self) -> "CuratorStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- schema ---------------------------------------------------------------------------------

    def _create(self) -> None:
        db = self._db
        tables = {name for (name,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        foreign = _foreign_tables(self.path, tables)
        if foreign:
            db.close()  # never write per-user budgets and dead letters into another file
            raise CuratorStoreError(foreign)
        db.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version is not None and int(version[0]) > SCHEMA_VERSION:
            raise CuratorStoreError(
                f"the ledger {self.path} has schema version {version[0]}, newer than this "
                f"renyi-stream ({SCHEMA_VERSION}); upgrade renyi-stream"
            )
        release_columns = ", ".join(f"{f.name} {_duck_type(f.type)} NOT NULL" for f in RELEASE_SCHEMA)
        db.execute(f"""
            CREATE TABLE IF NOT EXISTS outbox ({release_columns}, run_id BIGINT NOT NULL,
                published BOOLEAN NOT NULL DEFAULT false, PRIMARY KEY (query_id, window_id, coordinate))""")
        db.execute("""
            CREATE TABLE IF NOT EXISTS processed_windows (query_id VARCHAR NOT NULL, window_id BIGINT NOT NULL,
                run_id BIGINT NOT NULL, PRIMARY KEY (query_id, window_id))""")
        db.execute("""
            CREATE TABLE IF NOT EXISTS window_counts (run_id BIGINT NOT NULL, window_id BIGINT NOT NULL,
                admitted BIGINT NOT NULL, clipped BIGINT NOT NULL, dropped BIGINT NOT NULL,
                nonfinite BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (run_id, window_id))""")
        # ``nonfinite``: users dropped for a non-finite query vector (a subset of dropped). Ledgers
        # made before it existed get the column, 0 for their old windows.
        db.execute("ALTER TABLE window_counts ADD COLUMN IF NOT EXISTS nonfinite BIGINT DEFAULT 0")
        db.execute("""
            CREATE TABLE IF NOT EXISTS run_counts (run_id BIGINT PRIMARY KEY, rows_read BIGINT NOT NULL,
                admitted BIGINT NOT NULL, clipped BIGINT NOT NULL, dropped BIGINT NOT NULL,
                rejected BIGINT NOT NULL, late BIGINT NOT NULL, finished_at TIMESTAMPTZ DEFAULT now())""")
        db.execute("""
            CREATE TABLE IF NOT EXISTS dead_letters (run_id BIGINT NOT NULL, source VARCHAR NOT NULL,
                row_index BIGINT NOT NULL, reason VARCHAR NOT NULL, detail VARCHAR NOT NULL, raw VARCHAR NOT NULL)""")
        # Running queries: each one's released rows y (noisy, needed to estimate later running
        # totals) and each user's history (sensitive, like the ledger; replaced every run).
        db.execute("""
            CREATE TABLE IF NOT EXISTS running_releases (query_id VARCHAR NOT NULL, window_id BIGINT NOT NULL,
                y DOUBLE[] NOT NULL, run_id BIGINT NOT NULL, PRIMARY KEY (query_id, window_id))""")
        db.execute("CREATE TABLE IF NOT EXISTS running_meta (query_id VARCHAR PRIMARY KEY, meta VARCHAR NOT NULL)")
        # ``running_state``/``running_meta`` hold the per-window histories of the square-root era
        # (running version 1): kept as they are, and a run that would continue one is refused with
        # the way to migrate. Prepaid running queries (version 2, docs/running_totals.md) keep per
        # user one bounded row (``prepaid_state``, sensitive like the ledger; its metadata per query
        # in ``prepaid_meta``) and per query one release state (``running_release_state``,
        # sensitive until noised), all replaced in the run's transaction with the ledger.
        db.execute("CREATE TABLE IF NOT EXISTS prepaid_meta (query_id VARCHAR PRIMARY KEY, meta VARCHAR NOT NULL)")
        db.execute("""
            CREATE TABLE IF NOT EXISTS prepaid_state (query_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL,
                last_window BIGINT NOT NULL, vals DOUBLE[] NOT NULL)""")
        db.execute("""
            CREATE TABLE IF NOT EXISTS running_release_state (query_id VARCHAR PRIMARY KEY, meta VARCHAR NOT NULL,
                vals DOUBLE[] NOT NULL)""")
        db.execute("ALTER TABLE window_counts ADD COLUMN IF NOT EXISTS prepaid_rows_read BIGINT DEFAULT 0")
        if version is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        # The ledger's identity, created with it and kept for life. A ledger made before ledger
        # ids existed gets its id here, at its first open by this version: its released windows
        # keep their values (never drawn again), its later ones are drawn for this id.
        db.execute("INSERT INTO meta VALUES ('ledger_id', ?) ON CONFLICT DO NOTHING", [new_ledger_id()])

    # -- parameters -----------------------------------------------------------------------------

    @property
    def ledger_id(self) -> str:
        """This ledger's identifier (:func:`renyi_stream.stream.noise.new_ledger_id`: 128 random bits as hex),
        created with the ledger and kept for its life; public. The noise of every release it
        charges for is bound to it (:class:`renyi_stream.stream.noise.NoiseBinding`), so a second ledger using
        the same key file draws independent noise. A copy of the ledger file is the same ledger
        and has the same id."""
        (value,) = self._db.execute("SELECT value FROM meta WHERE key = 'ledger_id'").fetchone()
        try:
            return check_ledger_id(value)
        except ValueError as exc:
            raise CuratorStoreError(f"the ledger {self.path} records a malformed ledger id ({exc}): it was edited; "
                                    "restore it from its backup") from None

    def parameters(self) -> LedgerConfig | None:
        """The configuration the ledger records in ``meta`` (:meth:`LedgerConfig.from_meta`);
        None for a ledger no run has used yet. CuratorStoreError for a record that cannot be read."""
        rows = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        try:
            return LedgerConfig.from_meta(rows, where=f"the ledger {self.path}")
        except LedgerConfigError as exc:
            raise CuratorStoreError(str(exc)) from None

    @under_private_umask  # may create the write-ahead log
    def check_or_record_parameters(self, wanted: LedgerConfig) -> LedgerConfig:
        """Record ``wanted`` on a new ledger, with this ledger's :attr:`ledger_id` (``wanted``'s
        must be None or the same). On an existing one, return ``wanted`` continuing the recorded
        configuration (:meth:`LedgerConfig.continued_from`: another promise, key, id type or
        windows is refused, as CuratorStoreError naming the ledger and each field; the budget
        and the noise std and tracker step it gives are the ledger's own, kept as recorded).
        """
        if wanted.ledger_id not in (None, self.ledger_id):
            raise CuratorStoreError(f"the ledger {self.path} has ledger id {self.ledger_id}, this run was configured "
                                    f"for {wanted.ledger_id}")
        wanted = replace(wanted, ledger_id=self.ledger_id)
        existing = self.parameters()
        if existing is None:
            # ledger_id is there since the file was created (_create): the same value, kept.
            self._db.executemany("INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING",
                                 list(wanted.to_meta().items()))
            return wanted
        try:
            continued = wanted.continued_from(existing, where=f"the ledger {self.path}")
        except LedgerConfigError as exc:
            raise CuratorStoreError(str(exc)) from None
        if existing.columns is None and continued.columns is not None:  # a ledger from before declared contracts
            self._db.execute("INSERT INTO meta VALUES ('columns', ?) ON CONFLICT DO NOTHING", [continued.columns])
        return continued

    # -- the release store it publishes to -------------------------------------------------------

    def release_store(self) -> str | None:
        """The release store this ledger publishes to, as the resolved absolute path its first
        publishing run recorded (:meth:`bind_release_store`); None before that (a new ledger, a
        ledger only trained on, or one from before ledgers recorded their store)."""
        return self._meta_value(STORE_KEY)

    def bind_release_store(self, store: Any, *, moved: bool = False) -> None:
        """Refuse a release store other than the one this ledger publishes to; remember, for the
        run's commit, the store to record. Call it before anyone is charged, with the run's open
        :class:`renyi_stream.queries.release_store.ReleaseStore` (its ``path`` and ``read()``).

        Guarantees, for the ledger file at the place it recorded its store from:

        * a run whose store resolves to another path than the recorded one is refused
          (CuratorStoreError naming both paths and ``--store-moved``), unless ``moved``: then the
          new store must hold every release this ledger has published (else refused, naming one
          it lacks, with its date), and its place is recorded. A day is therefore never published
          to a store other than the ledger's (a typo in ``--store`` would leave the real store
          without that day for good, and a running total registered there stuck);
        * a ledger that records no store yet (new, or from before this rule) records this one,
          once the store holds every release the ledger has published (nothing, for a new
          ledger): an old ledger pointed at a wrong store is refused at its next run too;
        * a copy of the ledger at another place (a dry run's private copy, a ledger moved together
          with its store) is checked on content, as a moved store is: its store must hold every
          release it has published; then the new places are recorded.

        Nothing is written here: the binding is recorded by :meth:`commit_run`, in the run's own
        transaction, so a refused or failed run records nothing and a ledger is bound to the store
        its committed releases go to. That the store holds no release the ledger never charged is
        the daily job's check (``_refuse_a_ledger_behind_the_store``); that it holds no other
        ledger's releases, the store's (:meth:`ReleaseStore.check_ledger`)."""
        place, here = _place(store.path), _place(self.path)
        recorded, bound_at = self.release_store(), self._meta_value(STORE_BOUND_AT_KEY)
        self._binding = None
        if recorded is not None and bound_at == here:
            if recorded == place:
                return  # the ledger's own store: nothing to check or record
            if not moved:
                raise CuratorStoreError(
                    f"release store {place} is not the store the ledger {self.path} publishes to, {recorded} "
                    f"(recorded by its first publishing run): refusing before anyone is charged, since a day "
                    f"published to another store is missing from {recorded} for good (and a running total "
                    f"registered there could not go on). A typo: give --store {recorded}. If the store really "
                    f"moved, give {STORE_MOVED_OPTION} to record {place} as the ledger's store (it must hold "
                    "every release the ledger has published)")
        self._refuse_a_store_behind_the_ledger(store, place, recorded)
        self._binding = {STORE_KEY: place, STORE_BOUND_AT_KEY: here}

    def _refuse_a_store_behind_the_ledger(self, store: Any, place: str, recorded: str | None) -> None:
        """CuratorStoreError when the store at ``place`` lacks a release this ledger has published
        (marked published in its outbox), naming one with its date."""
        published = set(self._db.execute(
            "SELECT DISTINCT query_id, window_id FROM outbox WHERE published").fetchall())
        if not published:
            return
        releases = store.read()
        held = set(zip(releases.column("query_id").to_pylist(), releases.column("window_id").to_pylist()))
        missing = sorted((q, int(w)) for q, w in published - held)
        if not missing:
            return
        query_id, window = missing[0]
        params = self.parameters()
        day = _window_date(params.window if params is not None else None, window)
        where = (f"the ledger publishes to {recorded}" if recorded is not None and recorded != place
                 else "this ledger records no release store yet (it predates the record), so this one would be")
        raise CuratorStoreError(
            f"release store {place} lacks {len(missing)} release(s) the ledger {self.path} has published (e.g. "
            f"query {query_id!r}, window {window} ({day})): it is not the store this ledger publishes to ({where}). "
            f"Give the ledger's own release store with --store; a store that moved holds every one of them "
            f"({STORE_MOVED_OPTION} records a moved store, never a new one)")

    def _meta_value(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return None if row is None else row[0]

    # -- reading --------------------------------------------------------------------------------

    def next_run_id(self) -> int:
        last = self._db.execute("SELECT max(run_id) FROM run_counts").fetchone()[0]
        return 1 if last is None else int(last) + 1

    @under_private_umask  # a large read may spill to disk
    def processed_keys(self) -> set[tuple[str, int]]:
        """Every (query_id, window_id) this ledger has charged and released."""
        return {(q, int(w)) for q, w in self._db.execute("SELECT query_id, window_id FROM processed_windows").fetchall()}

    @under_private_umask  # a large read may spill to disk
    def processed_windows(self) -> set[int]:
        return {int(w) for (w,) in self._db.execute("SELECT DISTINCT window_id FROM processed_windows").fetchall()}

    @under_private_umask  # a large read may spill to disk
    def load_ledger(self, params: LedgerConfig) -> pa.Table:
        """The ledger snapshot (``Ledger.to_arrow`` layout), empty on a new ledger."""
        if not self._has_ledger_table():
            return params.empty_ledger().to_arrow()
        table = self._db.execute(
            "SELECT user_id, used, tracker_segment, tracker_bound FROM ledger ORDER BY user_id").arrow()
        if hasattr(table, "read_all"):
            table = table.read_all()
        template = params.empty_ledger().to_arrow()
        table = table.cast(template.schema.remove_metadata()).replace_schema_metadata(template.schema.metadata)
        Ledger.from_arrow(table)  # refuses a corrupted ledger (nulls, repeats, budgets out of range)
        return table

    @under_private_umask  # a large read may spill to disk
    def load_running(self, id_type: str) -> dict[str, pa.Table]:
        """Every prepaid running query's per-user state (:meth:`renyi_stream.stream.engine.running.PrepaidUsers.to_arrow`
        layout, metadata included), by query id; empty when no running query has run."""
        metas = dict(self._db.execute("SELECT query_id, meta FROM prepaid_meta").fetchall())
        if not metas:
            return {}
        rows = self._db.execute(
            "SELECT query_id, user_id, last_window, vals FROM prepaid_state ORDER BY query_id, user_id").arrow()
        rows = rows.read_all() if hasattr(rows, "read_all") else rows
        out = {}
        id_arrow = pa.int64() if id_type == "int64" else pa.large_string()
        for query_id, meta_json in metas.items():
            meta = json.loads(meta_json)
            part = rows.filter(pc.equal(rows.column("query_id"), query_id))
            width = int(meta["width"]) * int(meta["dim"])
            flat = pc.list_flatten(part.column("vals")).cast(pa.float64()) if part.num_rows else pa.array([], pa.float64())
            flat = flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat
            lengths = pc.list_value_length(part.column("vals"))
            if part.num_rows and (lengths.null_count or pc.min(lengths).as_py() != width
                                  or pc.max(lengths).as_py() != width):
                raise CuratorStoreError(f"the ledger {self.path} holds prepaid state rows of running query {query_id!r} "
                                        f"that are not {width} numbers each: it was edited; restore it from its backup")
            table = pa.table({"user_id": part.column("user_id").cast(id_arrow),
                              "last_window": part.column("last_window").cast(pa.int64()),
                              "values": pa.FixedSizeListArray.from_arrays(flat, width)})
            out[query_id] = table.replace_schema_metadata(meta)
        return out

    @under_private_umask  # a large read may spill to disk
    def load_release_states(self) -> dict[str, pa.Table]:
        """Every prepaid running query's release state (:meth:`renyi_stream.stream.engine.running.RunningRelease.to_arrow`
        layout), by query id."""
        out = {}
        for query_id, meta_json, vals in self._db.execute(
                "SELECT query_id, meta, vals FROM running_release_state ORDER BY query_id").fetchall():
            meta = json.loads(meta_json)
            dim = int(meta["dim"])
            flat = pa.array([float(v) for v in vals], type=pa.float64())
            if len(flat) % dim:
                raise CuratorStoreError(f"the ledger {self.path} holds a malformed release state of running query "
                                        f"{query_id!r}: it was edited; restore it from its backup")
            out[query_id] = pa.table({"values": pa.FixedSizeListArray.from_arrays(flat, dim)}).replace_schema_metadata(meta)
        return out

    def history_running_queries(self) -> list[str]:
        """The running queries whose state is a per-window history of the square-root era
        (``renyi_stream.running_version`` 1): they cannot continue under prepaid admission."""
        return sorted(q for q, meta in self._db.execute("SELECT query_id, meta FROM running_meta").fetchall()
                      if json.loads(meta).get("renyi_stream.running_version", "1") == "1")

    @under_private_umask  # a large read may spill to disk
    def load_running_releases(self) -> dict[str, list[tuple[int, list[float]]]]:
        """Every running query's released rows ``y`` so far: ``query_id -> [(window, y flat)]``."""
        out: dict[str, list[tuple[int, list[float]]]] = {}
        for query_id, window, y in self._db.execute(
                "SELECT query_id, window_id, y FROM running_releases ORDER BY query_id, window_id").fetchall():
            out.setdefault(query_id, []).append((int(window), [float(v) for v in y]))
        return out

    @under_private_umask  # a large read may spill to disk
    def pending_windows(self) -> list[int]:
        """The windows with releases in the outbox not yet marked published: committed with the
        ledger that charged them (:meth:`commit_run`), so they may be published."""
        return [int(w) for (w,) in self._db.execute(
            "SELECT DISTINCT window_id FROM outbox WHERE NOT published ORDER BY window_id").fetchall()]

    @under_private_umask  # a large read may spill to disk
    def pending_releases(self, window: int | None = None) -> pa.Table:
        """The outbox's releases not yet marked published (of ``window``, or of every window),
        ordered by ``(query_id, window_id, coordinate)``."""
        columns = ", ".join(RELEASE_SCHEMA.names)
        only = "" if window is None else " AND window_id = ?"
        table = self._db.execute(
            f"SELECT {columns} FROM outbox WHERE NOT published{only} ORDER BY query_id, window_id, coordinate",
            [] if window is None else [int(window)]).arrow()
        if hasattr(table, "read_all"):
            table = table.read_all()
        return table.cast(RELEASE_SCHEMA)

    def _has_ledger_table(self) -> bool:
        return bool(self._db.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'ledger'").fetchone()[0])

    # -- writing --------------------------------------------------------------------------------

    @under_private_umask  # may create the write-ahead log
    def commit_run(
        self,
        *,
        run_id: int,
        ledger: pa.Table,
        releases: pa.Table,
        window_counts: pa.Table,
        run_counts: Mapping[str, int],
        dead_letters: pa.Table,
        previous_users: int,
        running: Mapping[str, pa.Table] | None = None,
        running_releases: Sequence[tuple[str, int, Sequence[float]]] = (),
        release_states: Mapping[str, pa.Table] | None = None,
    ) -> None:
        """Write one run's outcome in a single transaction (the outbox pattern).

        ``ledger`` is the complete new snapshot; it must hold at least ``previous_users`` users
        (a ledger that lost users would restart their budgets: refused). ``running`` (per query,
        the per-user prepaid rows) and ``release_states`` (per query) replace the stored ones of
        those queries, in the same transaction: a ledger that charged a prepaid admission never
        lands without the state that remembers it (a lost row would under-charge). The release
        store a :meth:`bind_release_store` of this run accepted is recorded in the same transaction.
        """
        if ledger.num_rows < previous_users:
            raise CuratorStoreError(
                f"refusing to commit a ledger of {ledger.num_rows} users over one of {previous_users}: "
                "users would lose their used budget"
            )
        db = self._db
        db.execute("BEGIN TRANSACTION")
        try:
            new_ledger = ledger.replace_schema_metadata(None)
            db.register("new_ledger", new_ledger)
            db.execute("CREATE OR REPLACE TABLE ledger AS SELECT * FROM new_ledger")
            db.unregister("new_ledger")
            rel = releases.append_column("run_id", pa.array([run_id] * releases.num_rows, type=pa.int64()))
            db.register("new_releases", rel)
            columns = ", ".join(RELEASE_SCHEMA.names)
            db.execute(f"INSERT INTO outbox ({columns}, run_id) SELECT {columns}, run_id FROM new_releases")
            db.execute("""INSERT INTO processed_windows SELECT DISTINCT query_id, window_id, run_id
                          FROM new_releases""")
            db.unregister("new_releases")
            if "nonfinite" not in window_counts.column_names:  # callers that charge no query vectors
                window_counts = window_counts.append_column(
                    "nonfinite", pa.array([0] * window_counts.num_rows, type=pa.int64()))
            counts = window_counts.append_column("run_id", pa.array([run_id] * window_counts.num_rows, type=pa.int64()))
            db.register("new_counts", counts)
            if "prepaid_rows_read" not in counts.column_names:
                counts = counts.append_column("prepaid_rows_read", pa.array([0] * counts.num_rows, type=pa.int64()))
                db.unregister("new_counts")
                db.register("new_counts", counts)
            db.execute("""INSERT INTO window_counts (run_id, window_id, admitted, clipped, dropped, nonfinite,
                          prepaid_rows_read)
                          SELECT run_id, window_id, admitted, clipped, dropped, nonfinite, prepaid_rows_read
                          FROM new_counts""")
            db.unregister("new_counts")
            dead = dead_letters.append_column("run_id", pa.array([run_id] * dead_letters.num_rows, type=pa.int64()))
            db.register("new_dead", dead)
            db.execute("INSERT INTO dead_letters SELECT run_id, source, row_index, reason, detail, raw FROM new_dead")
            db.unregister("new_dead")
            db.execute(
                "INSERT INTO run_counts (run_id, rows_read, admitted, clipped, dropped, rejected, late) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, run_counts["rows_read"], run_counts["admitted"], run_counts["clipped"],
                 run_counts["dropped"], run_counts["rejected"], run_counts["late"]],
            )
            if running:
                self._write_running(running)
            if release_states:
                self._write_release_states(release_states)
            if running_releases:
                raw = pa.table({
                    "query_id": pa.array([q for q, _, _ in running_releases], type=pa.string()),
                    "window_id": pa.array([int(w) for _, w, _ in running_releases], type=pa.int64()),
                    "y": pa.array([list(map(float, y)) for _, _, y in running_releases], type=pa.list_(pa.float64())),
                })
                db.register("new_raw", raw)
                db.execute("INSERT INTO running_releases SELECT query_id, window_id, y, ? FROM new_raw", [run_id])
                db.unregister("new_raw")
            if self._binding:  # the store this run publishes to (bind_release_store)
                db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", sorted(self._binding.items()))
            crash_point("after_ledger_write")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._binding = None

    def _write_running(self, running: Mapping[str, pa.Table]) -> None:
        """Replace the per-user prepaid rows of each query in ``running`` (others are kept)."""
        db = self._db
        for query_id, table in sorted(running.items()):
            meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
            values = table.column("values").combine_chunks()
            width = values.type.list_size
            flat = values.flatten()
            # 64-bit offsets: past 2^31 stored numbers (the square root's T x d rows of a few million
            # users) 32-bit ones would wrap negative.
            offsets = pa.array(np.arange(0, len(flat) + 1, width, dtype=np.int64))
            part = pa.table({
                "user_id": table.column("user_id").cast(pa.string()),
                "last_window": table.column("last_window").cast(pa.int64()),
                "vals": pa.LargeListArray.from_arrays(offsets, flat),
            })
            db.execute("DELETE FROM prepaid_state WHERE query_id = ?", [query_id])
            db.register("new_prepaid", part)
            db.execute("INSERT INTO prepaid_state SELECT ?, user_id, last_window, vals FROM new_prepaid", [query_id])
            db.unregister("new_prepaid")
            db.execute("INSERT OR REPLACE INTO prepaid_meta VALUES (?, ?)", [query_id, json.dumps(meta, sort_keys=True)])

    def _write_release_states(self, states: Mapping[str, pa.Table]) -> None:
        for query_id, table in sorted(states.items()):
            meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
            flat = table.column("values").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            self._db.execute("INSERT OR REPLACE INTO running_release_state VALUES (?, ?, ?)",
                             [query_id, json.dumps(meta, sort_keys=True), [float(v) for v in flat]])

    @under_private_umask  # may create the write-ahead log
    def mark_published(self, window: int) -> None:
        """Mark window ``window``'s outbox releases published (they are public): the next
        :meth:`pending_windows` no longer lists it."""
        self._db.execute("UPDATE outbox SET published = true WHERE window_id = ? AND NOT published", [int(window)])

    @under_private_umask  # a large read may spill to disk
    def run_totals(self) -> pa.Table:
        table = self._db.execute("SELECT * FROM run_counts ORDER BY run_id").arrow()
        return table.read_all() if hasattr(table, "read_all") else table


def _place(path: str | os.PathLike) -> str:
    """``path`` as the absolute path it resolves to (symbolic links followed): what a ledger
    records of its release store, and of itself."""
    return str(Path(path).expanduser().resolve())


def _window_date(window: Any, window_id: int) -> str:
    """The UTC date (and time, for windows shorter than a day) window ``window_id`` of the
    :class:`renyi_stream.stream.schema.WindowSpec` ``window`` starts at (daily windows when None)."""
    import datetime as dt

    from renyi_stream.stream.schema import WindowSpec

    spec = window if window is not None else WindowSpec()
    start = dt.datetime.fromtimestamp(int(spec.window_start_seconds(int(window_id))), tz=dt.timezone.utc)
    return start.strftime("%Y-%m-%d" if start.time() == dt.time(0) else "%Y-%m-%d %H:%M")


def _duck_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "VARCHAR"
    if pa.types.is_int64(arrow_type):
        return "BIGINT"
    if pa.types.is_int32(arrow_type):
        return "INTEGER"
    if pa.types.is_floating(arrow_type):
        return "DOUBLE"
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMPTZ" if arrow_type.tz else "TIMESTAMP"
    raise TypeError(f"no DuckDB column type for {arrow_type}")
