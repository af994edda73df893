"""A Parquet release root read as a release store: what ``renyi-stream sql`` and ``report``
read for the distributed and streaming jobs, which keep no DuckDB store.

:func:`snapshot_store` copies the root's public content (every window's release file,
:mod:`renyi_stream.queries.release_files`; its query catalogue, :mod:`renyi_stream.queries.catalogue`; its recorded
promise and input contract) into a new DuckDB release store file, with the tables and views of
:class:`renyi_stream.queries.release_store.ReleaseStore` (``releases``, ``releases_with_ci``,
``query_catalogue``, ``releases_wide``, ``store_meta``). Analysts' SQL then runs over that
file through the same sandbox as over a store (:func:`renyi_stream.queries.release_store.connect_read_only`:
read-only, no files, no extensions), so one set of rules holds for every release store. The
snapshot is made by :class:`~renyi_stream.queries.release_store.ReleaseStore`, so its views carry the
same comments saying what each release estimates (the sum over the users whose budget admitted
them in that window; :data:`renyi_stream.queries.release_store.ESTIMAND`). The root itself is only
read; everything in it is public.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from renyi_stream.queries.catalogue import ReleaseCatalogue
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_files import FILE_NAME, filesystem, released_windows
from renyi_stream.queries.release_store import RELEASE_SCHEMA, ReleaseStore, ReleaseStoreError


def read_release_root(root: str) -> pa.Table:
    """Every release row under ``root`` (a local path or a URI), :data:`RELEASE_SCHEMA`, by window.
    ReleaseStoreError when ``root`` does not exist (a local path) or holds a file that is not a
    window's release file."""
    if "://" not in root and not Path(root).is_dir():
        raise ReleaseStoreError(f"release root {root} does not exist")
    fs, base = filesystem(root)
    parts = [RELEASE_SCHEMA.empty_table()]
    for window in sorted(released_windows(root)):
        path = f"{base}/window_id={window}/{FILE_NAME}"
        try:
            table = pq.read_table(path, filesystem=fs)
        except (pa.ArrowException, OSError) as exc:
            raise ReleaseStoreError(f"release root {root}: {path} is not a release file: {exc}") from exc
        table = table.append_column("window_id", pa.repeat(pa.scalar(window, pa.int64()), table.num_rows))
        parts.append(table.select(RELEASE_SCHEMA.names).cast(RELEASE_SCHEMA))
    return pa.concat_tables(parts)


def snapshot_store(root: str, path: str | os.PathLike) -> Path:
    """Write a new DuckDB release store at ``path`` (which must not exist) holding ``root``'s
    releases, query catalogue, promise and input contract; return its path. Open it read-only
    (:func:`renyi_stream.queries.sql.run_sql`, :func:`renyi_stream.queries.report.render_report`) like any store."""
    path = Path(path)
    if path.exists():
        raise ValueError(f"path must be a new file for the snapshot of {root}, got the existing {path}")
    releases = read_release_root(root)
    catalogue = ReleaseCatalogue(root)
    with ReleaseStore(path) as store:
        store.publish(releases)
        promise = catalogue.promise()
        if promise:
            store.record_promise(epsilon=float(promise["epsilon"]), delta=float(promise["delta"]),
                                 accounting=promise["accounting"], norm_budget=float(promise["norm_budget"]))
        contract = catalogue.input_contract()
        if contract is not None:
            store.record_input_contract(contract.to_json())
        QueryRegistry(store).import_registrations(catalogue.registrations())
    return path


@contextlib.contextmanager
def readable_store(store: str | None, releases_parquet: str | None) -> Iterator[Path]:
    """The DuckDB release store to read: ``store`` itself, or a snapshot of the Parquet release
    root ``releases_parquet`` in a private temporary folder, removed when the block ends. Exactly
    one must be given (ValueError otherwise)."""
    if (store is None) == (releases_parquet is None):
        raise ValueError("give exactly one of --store (a DuckDB release store) or --releases-parquet (a Parquet "
                         "release root)")
    if store is not None:
        yield Path(store)
        return
    with tempfile.TemporaryDirectory(prefix="renyi-root-") as folder:
        yield snapshot_store(releases_parquet, Path(folder) / "releases.duckdb")
