"""Curator files in object storage or on local disk, for the jobs that keep their state there
(the distributed and streaming jobs): paths, globs, JSON manifests and Parquet, local files through
the OS and object stores (``gs://``, ``s3://``) through pyarrow.fs. Imports no Beam: the streaming
job's runner-independent machinery (:mod:`renyi_stream.pipelines.streaming`) reads and writes
through it under every runner. Every write is whole or not at all; a local curator file is
``0600`` from creation and one that group/others may read is refused
(:mod:`renyi_stream.stream.private_files`)."""

from __future__ import annotations

import bz2
import contextlib
import io
import json
import lzma
import os
import re
import shutil
import uuid
import zlib
from typing import BinaryIO, Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

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


def _object_store(path: str) -> tuple[pafs.FileSystem, str, str]:
    """``(file system, path inside it, scheme://)`` of an object store URI."""
    fs, inner = pafs.FileSystem.from_uri(path)
    return fs, inner, path.split("://", 1)[0] + "://"


def _glob_regex(pattern: str) -> str:
    """``pattern`` as a regular expression, as Beam's ``FileSystem.translate_pattern`` reads a glob
    (the paths this module lists are the ones Beam's ``FileSystems.match`` listed before): ``*`` is
    any run of characters but ``/`` and ``\\``, ``**`` any run at all, ``?`` one character,
    ``[...]`` a class (``[!...]`` negated); no quoting."""
    i, n, res = 0, len(pattern), ""
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if i < n and pattern[i] == "*":
                res += ".*"
                i += 1
            else:
                res += r"[^/\\]*"
        elif c == "?":
            res += "."
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                res += r"\["
            else:
                stuff = pattern[i:j].replace("\\", "\\\\")
                i = j + 1
                if stuff[0] == "!":
                    stuff = "^" + stuff[1:]
                elif stuff[0] == "^":
                    stuff = "\\" + stuff
                res = f"{res}[{stuff}]"
        else:
            res += re.escape(c)
    return r"(?ms)" + res + r"\Z"


def match(pattern: str) -> list[str]:
    """The files ``pattern`` (a path or URI with ``*``, ``**``, ``?``, ``[...]``) matches, in listing
    order: a pattern without a glob names itself when it exists; otherwise every file below the
    folder before its first glob character is listed and matched whole (:func:`_glob_regex`). A
    pattern ending in ``/`` matches what the folder holds. Nothing, not an error, when there is no
    such folder."""
    if pattern.endswith("/") or pattern.endswith("\\"):
        pattern += "*"
    prefix = re.match(r"^[^[*?]*", pattern).group(0)
    if prefix == pattern:
        return [pattern] if exists(pattern) else []
    if is_uri(pattern):
        fs, inner, scheme = _object_store(prefix)
        folder = inner.rsplit("/", 1)[0] if "/" in inner else inner
        infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
        paths = [scheme + info.path for info in infos if info.type == pafs.FileType.File]
    else:
        folder = os.path.dirname(prefix)
        paths = ([os.path.join(dirpath, name) for dirpath, _, names in os.walk(folder) for name in names]
                 if os.path.exists(folder) else [])
    wanted = re.compile(_glob_regex(pattern)).match
    return [path for path in paths if wanted(path)]


def exists(path: str) -> bool:
    """Whether the file (or folder) ``path`` exists."""
    if not is_uri(path):
        return os.path.exists(path)
    fs, inner, _ = _object_store(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


#: What a file's name says it is compressed with (as Beam's ``CompressionTypes.detect_compression_type``
#: reads it): :func:`open_input` decompresses such a file as it reads it.
_COMPRESSED = {".bz2": "bzip2", ".deflate": "deflate", ".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "lzma",
               ".lzma": "lzma"}


def _decompressor(kind: str) -> object:
    if kind == "bzip2":
        return bz2.BZ2Decompressor()
    if kind == "deflate":
        return zlib.decompressobj()
    if kind == "lzma":
        return lzma.LZMADecompressor()
    return zlib.decompressobj(zlib.MAX_WBITS | 16)  # gzip


def _decompressed(data: bytes, kind: str) -> bytes:
    """``data`` decompressed, every stream of it when several are concatenated."""
    if kind == "zstd":
        return pa.CompressedInputStream(pa.BufferReader(data), "zstd").read()
    out = []
    while data:
        decompressor = _decompressor(kind)
        out.append(decompressor.decompress(data))
        data = getattr(decompressor, "unused_data", b"")
    return b"".join(out)


@contextlib.contextmanager
def open_input(path: str, *, decompress: bool = True) -> Iterator[BinaryIO]:
    """The file ``path`` opened for reading bytes; with ``decompress``, decompressed when its name
    says it is compressed (:data:`_COMPRESSED`, read whole)."""
    kind = next((k for suffix, k in _COMPRESSED.items() if path.lower().endswith(suffix)), None) if decompress else None
    if is_uri(path):
        fs, inner, _ = _object_store(path)
        handle = fs.open_input_file(inner)
    else:
        handle = open(path, "rb")
    with handle:
        if kind is None:
            yield handle
        else:
            yield io.BytesIO(_decompressed(handle.read(), kind))


def delete(paths: Sequence[str]) -> None:
    """Remove the files (a folder with what it holds) ``paths``."""
    for path in paths:
        if is_uri(path):
            fs, inner, _ = _object_store(path)
            if fs.get_file_info(inner).type == pafs.FileType.Directory:
                fs.delete_dir(inner)
            else:
                fs.delete_file(inner)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def read_json(path: str) -> dict:
    refuse_if_shared_file(path, "the curator manifest")
    with open_input(path, decompress=False) as handle:
        return json.loads(handle.read().decode("utf-8"))


def write_json(path: str, value: dict) -> None:
    """Write ``value`` whole or not at all: a local file is renamed into place (mode ``0600`` from
    creation: a manifest is a curator file); an object store (GCS, S3) makes an object visible
    only when its upload completes."""
    data = json.dumps(value, indent=2, sort_keys=True).encode("utf-8")
    if is_uri(path):
        fs, inner, _ = _object_store(path)
        with fs.open_output_stream(inner, metadata={"Content-Type": "application/json"}) as handle:
            handle.write(data)
        return
    write_private_bytes(path, data)  # 0600 from creation, renamed into place


def read_parquet(path: str) -> pa.Table:
    """A curator Parquet file (ledger snapshot, staged releases); a local one that group/others
    may read is refused (:class:`renyi_stream.stream.private_files.PrivateFileError`)."""
    refuse_if_shared_file(path, "the curator file")
    if is_uri(path):
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
    windows = set()
    for path in match(join(root, "window_id=*", "releases.parquet")):
        folder = path.replace("\\", "/").rsplit("/", 2)[-2]
        windows.add(int(folder.split("=", 1)[1]))
    return windows
