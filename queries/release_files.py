"""The Parquet release path: one public file per window, ``<root>/window_id=<id>/releases.parquet``.

For readers without the DuckDB release store (distributed runs write to object storage; any
tool reads Parquet). The folder is Hive-partitioned, so DuckDB reads it with
``read_parquet('<root>/*/*.parquet', hive_partitioning = true)``. First write wins: a file
already there is kept, since noise is keyed and a re-released window computes identical rows
anyway, and a released answer never changes: invariant 5 (release-once, docs/architecture.md).
Files are written whole (to a scratch name of the writer's own, then published), so a reader
never sees half a window.

**Concurrent writers.** On a local (or network) filesystem the publish is a hard link of the
scratch file to the public name, which the kernel refuses when that name exists: of two
writers of one window exactly one creates the file, the other keeps it and is told so, and
neither can replace it. Object stores reached through ``pyarrow.fs`` (``gs://``, ``s3://``)
offer no create-if-absent there, so a URI root keeps check-then-move: two writers of one
window *at the same moment* may both publish, the last one's object winning (each writes its
own scratch object, so neither sees a torn file). Keyed noise makes their rows identical when
both were charged from the same ledger; keeping two runs from charging the same window from
different ledgers is :mod:`renyi_stream.queries.release_lineage`'s job, with the same caveat for URIs.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from renyi_stream.queries.release_store import RELEASE_SCHEMA

FILE_NAME = "releases.parquet"


def release_file_path(root: str, window: int) -> str:
    """Where window ``window``'s file lives under ``root`` (a local path or a URI)."""
    return f"{root.rstrip('/')}/window_id={int(window)}/{FILE_NAME}"


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path inside it)`` of ``root``: a URI through ``pyarrow.fs``, a local path
    made absolute."""
    if "://" in root:
        return pafs.FileSystem.from_uri(root)
    return pafs.LocalFileSystem(), str(Path(root).resolve())


def create_once(root: str, relative: str, write: Callable[[pafs.FileSystem, str], None]) -> bool:
    """Create ``<root>/<relative>`` unless it exists: ``write(fs, path)`` writes the content to a
    scratch name of this call's own (a uuid, so concurrent writers never share one), which is
    then published without replacing anything. True when this call created the file, False when
    it existed (then it is left as it is). No scratch file survives either way.

    Guaranteed for local paths (a hard link, refused by the kernel when the name exists: exactly
    one of any number of concurrent callers gets True). For URIs only check-then-move, see the
    module docstring."""
    fs, base = filesystem(root)
    target = f"{base}/{relative.strip('/')}"
    if fs.get_file_info(target).type != pafs.FileType.NotFound:
        return False  # the common case for a retried or re-run window: skip the write
    folder, name = target.rsplit("/", 1)
    fs.create_dir(folder, recursive=True)
    scratch = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        write(fs, scratch)
        if isinstance(fs, pafs.LocalFileSystem):
            try:
                os.link(scratch, target)  # atomic and never replaces: the first link wins
            except FileExistsError:
                return False
            return True
        if fs.get_file_info(target).type != pafs.FileType.NotFound:
            return False
        fs.move(scratch, target)
        return True
    finally:
        if fs.get_file_info(scratch).type != pafs.FileType.NotFound:
            fs.delete_file(scratch)


def released_windows(root: str) -> set[int]:
    """The windows with a release file under ``root`` (a local path or a URI); empty when
    ``root`` does not exist."""
    fs, base = filesystem(root)
    windows = []
    for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        prefix, _, number = info.base_name.partition("=")
        if info.type == pafs.FileType.Directory and prefix == "window_id" and number.lstrip("-").isdigit():
            windows.append(int(number))
    present = fs.get_file_info([f"{base}/window_id={w}/{FILE_NAME}" for w in windows])
    return {w for w, info in zip(windows, present) if info.type == pafs.FileType.File}


def release_file_table(rows: pa.Table | Sequence[dict[str, Any]]) -> pa.Table:
    """What a window's release file holds: ``rows`` (:data:`RELEASE_SCHEMA`) sorted by
    ``(query_id, coordinate)``, without ``window_id`` (the folder names it)."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=RELEASE_SCHEMA)
    table = table.select(RELEASE_SCHEMA.names).cast(RELEASE_SCHEMA)
    return table.sort_by([("query_id", "ascending"), ("coordinate", "ascending")]).drop_columns(["window_id"])


def write_release_file(root: str, window: int, rows: pa.Table | Sequence[dict[str, Any]]) -> str | None:
    """Write window ``window``'s release rows (:data:`RELEASE_SCHEMA`, ``window_id`` implied by the
    folder) under ``root``, sorted by ``(query_id, coordinate)``. Returns the file written, or
    None when the window's file already exists (kept as it is; under a local root this holds
    for concurrent writers too: exactly one of them gets the path). ``root`` is a local path or
    any URI ``pyarrow.fs`` understands (``gs://``, ``s3://``)."""
    def write(fs: pafs.FileSystem, scratch: str) -> None:
        pq.write_table(release_file_table(rows), scratch, filesystem=fs)

    if not create_once(root, f"window_id={int(window)}/{FILE_NAME}", write):
        return None
    return release_file_path(root if "://" in root else filesystem(root)[1], window)
