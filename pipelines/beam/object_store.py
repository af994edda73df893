"""Curator files in object storage or on local disk, for the jobs that keep their state there
(the distributed and streaming jobs): paths, JSON manifests through Beam's FileSystems, Parquet
through pyarrow.fs. Every write is whole or not at all; a local curator file is ``0600`` from
creation and one that group/others may read is refused (:mod:`renyi_stream.stream.private_files`)."""

from __future__ import annotations

import json
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from renyi_stream.stream.private_files import refuse_if_shared, write_private, write_private_bytes


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for a local path or a URI alike."""
    return "/".join([root.rstrip("/"), *parts])


def is_uri(path: str) -> bool:
    """Whether ``path`` names an object store (``gs://``, ``s3://``) rather than a local file."""
    return "://" in path


def absolute(path: str) -> str:
    """A URI as it is; a local path made absolute (manifests list files that later runs, started
    from anywhere, must find)."""
    return path.rstrip("/") if is_uri(path) else os.path.abspath(path)


def read_json(path: str) -> dict:
    refuse_if_shared_file(path, "the curator manifest")
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return json.loads(handle.read().decode("utf-8"))


def write_json(path: str, value: dict) -> None:
    """Write ``value`` whole or not at all: a local file is renamed into place (mode ``0600`` from
    creation: a manifest is a curator file); an object store (GCS, S3) makes an object visible
    only when its upload completes."""
    data = json.dumps(value, indent=2, sort_keys=True).encode("utf-8")
    if is_uri(path):
        with FileSystems.create(path, mime_type="application/json",
                                compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.write(data)
        return
    write_private_bytes(path, data)  # 0600 from creation, renamed into place


def read_parquet(path: str) -> pa.Table:
    """A curator Parquet file (ledger snapshot, staged releases); a local one that group/others
    may read is refused (:class:`renyi_stream.stream.private_files.PrivateFileError`)."""
    refuse_if_shared_file(path, "the curator file")
    if is_uri(path):
        import pyarrow.fs as pafs

        fs, inner = pafs.FileSystem.from_uri(path)
        return pq.read_table(inner, filesystem=fs)
    return pq.read_table(path)


#: How the jobs' curator Parquet files are encoded: no dictionary pages. Their big tables are keyed by
#: user (ledger snapshots, prepaid rows: one row per user, every id distinct, so a dictionary only
#: costs time and bytes: a 3,000-row ledger delta writes 3x faster and 12% smaller without one), and
#: the rest are a few rows each. Written once per shard and window by the streaming job.
PARQUET_WRITE_OPTIONS = {"use_dictionary": False}


def write_parquet(path: str, table: pa.Table) -> None:
    """Write ``table`` to ``path`` whole or not at all (a scratch name, then a rename; an object
    store publishes an object only when its upload completes), encoded as
    :data:`PARQUET_WRITE_OPTIONS` says. A local file is a curator file: ``0600`` from creation, in
    folders created ``0700``."""
    import pyarrow.fs as pafs

    if not is_uri(path):
        write_private(os.path.abspath(path), lambda handle: pq.write_table(table, handle, **PARQUET_WRITE_OPTIONS))
        return
    fs, inner = pafs.FileSystem.from_uri(path)
    folder = inner.rsplit("/", 1)[0]
    fs.create_dir(folder, recursive=True)
    scratch = f"{folder}/.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, scratch, filesystem=fs, **PARQUET_WRITE_OPTIONS)
    fs.move(scratch, inner)


def refuse_if_shared_file(path: str, what: str) -> None:
    """Refuse a local curator file that group/others may read (:func:`renyi_stream.stream.private_files.refuse_if_shared`)."""
    if not is_uri(path):  # an object store's permissions are its IAM policy's
        refuse_if_shared(path, what)


def release_windows_present(root: str) -> set[int]:
    """Windows with a release file under ``root``."""
    (result,) = FileSystems.match([join(root, "window_id=*", "releases.parquet")])
    windows = set()
    for meta in result.metadata_list:
        folder = meta.path.replace("\\", "/").rsplit("/", 2)[-2]
        windows.add(int(folder.split("=", 1)[1]))
    return windows
