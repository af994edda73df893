"""The public release store: a DuckDB file of released (noisy) answers and nothing else.

Analysts query the view ``releases`` with SQL; nothing pre-noise is ever written here
(DESIGN.md invariant 4). A (query, window, coordinate) is released once (invariant 5):
:meth:`ReleaseStore.publish` inserts only keys not yet present, skips identical re-publishes
and refuses a different value for a released key, which could only come from a second noisy
draw or another noise key.

Schema (version 1):

* ``release_data``: the columns of :data:`RELEASE_SCHEMA` plus ``released_at``, primary key
  ``(query_id, window_id, coordinate)``;
* ``releases`` (view, the public contract): ``query_id, window_id, window_start, window_end,
  label, coordinate, value, noise_std, kind, accounting, mechanism, key_fingerprint,
  released_at``;
* ``store_meta``: ``schema_version`` and the ``key_fingerprint`` of the noise key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCHEMA_VERSION = 1
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

# version -> statements that bring a store from version - 1 to version.
_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE release_data (
            query_id VARCHAR NOT NULL, window_id BIGINT NOT NULL, window_start TIMESTAMPTZ NOT NULL,
            window_end TIMESTAMPTZ NOT NULL, label VARCHAR NOT NULL, coordinate INTEGER NOT NULL,
            value DOUBLE NOT NULL, noise_std DOUBLE NOT NULL, kind VARCHAR NOT NULL,
            accounting VARCHAR NOT NULL, mechanism VARCHAR NOT NULL, key_fingerprint VARCHAR NOT NULL,
            released_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (query_id, window_id, coordinate))""",
        """CREATE VIEW releases AS SELECT query_id, window_id, window_start, window_end, label,
            coordinate, value, noise_std, kind, accounting, mechanism, key_fingerprint, released_at
            FROM release_data""",
    ],
}


class ReleaseStoreError(RuntimeError):
    """The store cannot be opened or used as asked."""


class ReleaseConflictError(ReleaseStoreError):
    """A second, different answer for a released window, or another noise key."""


def _validate(releases: pa.Table) -> pa.Table:
    missing = [name for name in RELEASE_SCHEMA.names if name not in releases.column_names]
    if missing:
        raise ValueError(f"releases are missing columns {missing}")
    try:
        table = releases.select(RELEASE_SCHEMA.names).cast(RELEASE_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"releases do not match the release schema: {exc}") from exc
    for name in RELEASE_SCHEMA.names:
        if table.column(name).null_count:
            raise ValueError(f"releases column {name!r} contains nulls")
    value = table.column("value").to_numpy()
    if not np.isfinite(value).all():
        raise ValueError("releases column 'value' must be finite")
    std = table.column("noise_std").to_numpy()
    if not (np.isfinite(std).all() and (std > 0).all()):
        raise ValueError("releases column 'noise_std' must be finite and > 0")
    if table.num_rows and not pc.all(pc.greater(table.column("window_end"), table.column("window_start"))).as_py():
        raise ValueError("releases column 'window_end' must be after 'window_start'")
    return table


class ReleaseStore:
    """Read and append released answers; opened read-write by the job, read-only otherwise."""

    def __init__(self, path: str | os.PathLike, *, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only and not self.path.exists():
            raise ReleaseStoreError(f"release store {self.path} does not exist")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            raise ReleaseStoreError(f"cannot open release store {self.path}: {exc}") from exc
        self._read_only = read_only
        self._migrate()

    def __enter__(self) -> "ReleaseStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def _meta(self, key: str) -> str | None:
        exists = self._db.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'store_meta'").fetchone()[0]
        if not exists:
            return None
        row = self._db.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchone()
        return None if row is None else row[0]

    def _migrate(self) -> None:
        version = int(self._meta("schema_version") or 0)
        if version > SCHEMA_VERSION:
            raise ReleaseStoreError(
                f"release store {self.path} has schema version {version}, newer than this "
                f"renyi-stream ({SCHEMA_VERSION}); upgrade renyi-stream")
        if version == SCHEMA_VERSION or self._read_only:
            if version < SCHEMA_VERSION:
                raise ReleaseStoreError(f"release store {self.path} needs a migration; open it read-write once")
            return
        db = self._db
        db.execute("BEGIN TRANSACTION")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    db.execute(statement)
            db.execute("INSERT OR REPLACE INTO store_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def publish(self, releases: pa.Table) -> int:
        """Insert the releases not yet in the store, in one transaction; return how many.

        Identical re-publishes are skipped; a different value or noise std for a released key,
        or rows under another noise key, raise :class:`ReleaseConflictError` and insert nothing.
        """
        table = _validate(releases)
        if table.num_rows == 0:
            return 0
        fingerprints = pc.unique(table.column("key_fingerprint")).to_pylist()
        if len(fingerprints) != 1:
            raise ReleaseConflictError(f"releases carry several noise key fingerprints: {fingerprints}")
        stored = self._meta("key_fingerprint")
        if stored is not None and stored != fingerprints[0]:
            raise ReleaseConflictError(
                f"release store {self.path} was written with noise key {stored}; these releases "
                f"come from key {fingerprints[0]}: refusing to mix answers from two keys")
        db = self._db
        db.execute("BEGIN TRANSACTION")
        try:
            db.register("incoming", table)
            conflicts = db.execute("""
                SELECT i.query_id, i.window_id, i.coordinate FROM incoming i JOIN release_data r
                  USING (query_id, window_id, coordinate)
                WHERE i.value <> r.value OR i.noise_std <> r.noise_std LIMIT 3""").fetchall()
            if conflicts:
                raise ReleaseConflictError(
                    f"a different answer for already released (query, window, coordinate) {conflicts}: "
                    "a window is released once (first write wins)")
            columns = ", ".join(RELEASE_SCHEMA.names)
            inserted = db.execute(f"""
                INSERT INTO release_data ({columns})
                SELECT {columns} FROM incoming i WHERE NOT EXISTS (
                    SELECT 1 FROM release_data r WHERE r.query_id = i.query_id
                      AND r.window_id = i.window_id AND r.coordinate = i.coordinate)""").fetchone()[0]
            if stored is None:
                db.execute("INSERT OR REPLACE INTO store_meta VALUES ('key_fingerprint', ?)", [fingerprints[0]])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.unregister("incoming")
        return int(inserted)

    def released_windows(self, query_id: str) -> list[int]:
        rows = self._db.execute(
            "SELECT DISTINCT window_id FROM release_data WHERE query_id = ? ORDER BY window_id", [query_id]).fetchall()
        return [int(w) for (w,) in rows]

    def read(self, query_id: str | None = None) -> pa.Table:
        sql = "SELECT * FROM releases"
        params: list[Any] = []
        if query_id is not None:
            sql += " WHERE query_id = ?"
            params.append(query_id)
        result = self._db.execute(sql + " ORDER BY query_id, window_id, coordinate", params).arrow()
        return result.read_all() if hasattr(result, "read_all") else result


def connect_read_only(path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """A connection for analysts' SQL: read-only, no file or network access, settings locked."""
    if not Path(path).exists():
        raise ReleaseStoreError(f"release store {path} does not exist")
    return duckdb.connect(str(path), read_only=True,
                          config={"enable_external_access": False, "lock_configuration": True})
