"""The Parquet release path: one public file per window, ``<root>/window_id=<id>/releases.parquet``.

For readers without the DuckDB release store (distributed runs write to object storage; any
tool reads Parquet). The folder is Hive-partitioned, so DuckDB reads it with
``read_parquet('<root>/*/*.parquet', hive_partitioning = true)``. First write wins: a file
already there is kept, since noise is keyed and a re-released window computes identical rows
anyway, and a released answer never changes (DESIGN.md invariant 5). Files are written whole
(to a hidden scratch name, then moved), so a reader never sees half a window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from queries.release_store import RELEASE_SCHEMA

FILE_NAME = "releases.parquet"


def release_file_path(root: str, window: int) -> str:
    """Where window ``window``'s file lives under ``root`` (a local path or a URI)."""
    return f"{root.rstrip('/')}/window_id={int(window)}/{FILE_NAME}"


def write_release_file(root: str, window: int, rows: pa.Table | Sequence[dict[str, Any]]) -> str | None:
    """Write window ``window``'s release rows (:data:`RELEASE_SCHEMA`, ``window_id`` implied by the
    folder) under ``root``, sorted by ``(query_id, coordinate)``. Returns the file written, or
    None when the window's file already exists (kept as it is). ``root`` is a local path or any
    URI ``pyarrow.fs`` understands (``gs://``, ``s3://``)."""
    fs, base = (pafs.FileSystem.from_uri(root) if "://" in root
                else (pafs.LocalFileSystem(), str(Path(root).resolve())))
    folder = f"{base}/window_id={int(window)}"
    target = f"{folder}/{FILE_NAME}"
    if fs.get_file_info(target).type != pafs.FileType.NotFound:
        return None
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=RELEASE_SCHEMA)
    table = table.select(RELEASE_SCHEMA.names).cast(RELEASE_SCHEMA)
    table = table.sort_by([("query_id", "ascending"), ("coordinate", "ascending")]).drop_columns(["window_id"])
    fs.create_dir(folder, recursive=True)
    scratch = f"{folder}/.{FILE_NAME}.tmp"
    pq.write_table(table, scratch, filesystem=fs)
    fs.move(scratch, target)
    return target if "://" not in root else release_file_path(root, window)
