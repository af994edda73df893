"""The streaming job's state folder, its ``--output``, as every runner lays it out: the folders of
each window's committed state (:data:`WINDOW_FOLDERS`), the outbox (:data:`STAGED_RELEASES`), the
commit markers (:data:`COMMITS`, :func:`commit_marker_path`, :func:`committed_windows`), the state
file (:data:`STATE_FILE`), where a ledger snapshot lies (:func:`_snapshot_place`), and curator files
named by their content (:func:`_write_named`). Imports no Beam."""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa
import pyarrow.parquet as pq

from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.streaming.codec import encode_message

#: The streaming job's outbox under its ``--output`` (curator only until published): each window's
#: release file, ``<output>/staged-releases/window_id=<W>/releases.parquet``, staged once all its
#: rows are in and published once the window is committed
#: (:class:`renyi_stream.pipelines.streaming.commits.WindowCommits`, or, after a crash,
#: :func:`renyi_stream.pipelines.streaming.recovery.recover` at the next launch).
STAGED_RELEASES = "staged-releases"
#: A window's commit marker, ``<output>/commits/window_id=<W>.json``: written (whole or not at all:
#: a scratch name renamed into place, :func:`renyi_stream.pipelines.beam.object_store.write_json`) once every
#: shard's ledger snapshot and records of the window are written and its releases staged, in window
#: order, and before the window's release file is published. The last marker names the window a
#: restarted job continues from (:func:`renyi_stream.pipelines.streaming.recovery.recover`).
COMMITS = "commits"
#: The state folder's record, ``<output>/_STATE.json``, written when a job first runs into it: an
#: ``--output`` holding it is one this version of the job recovers by itself. One holding snapshots
#: without it was written by an earlier version and is refused (give a new ``--output``).
STATE_FILE = "_STATE.json"
#: Running totals' state of a window: every shard's per-user prepaid rows (:data:`PREPAID`,
#: ``prepaid/window_id=<W>/shard=<S>/``) and each running query's release state (:data:`RUNNING_STATE`,
#: ``running/window_id=<W>/``), committed with the window like its ledger snapshots.
PREPAID, RUNNING_STATE = "prepaid", "running"
#: The curator folders whose ``window_id=<W>`` sub-folders hold one window's committed state:
#: the shards' ledger snapshots, the staged releases, the shards' books records and duplicate dead
#: letters (and ``counts``, a record of its own before the books record held the counts, kept so that a
#: folder an earlier version wrote loses its dead branch too), the running totals' state. Those of
#: windows after the last commit marker are a crashed job's dead branch.
WINDOW_FOLDERS = ("ledger", STAGED_RELEASES, "books", "counts", "dead", PREPAID, RUNNING_STATE)


def _write_named(root: str, sub: str, table: pa.Table) -> str:
    """Write ``table`` as ``<root>/<sub>/<content digest>.parquet``; returns the path."""
    digest = hashlib.sha256(encode_message(table)).hexdigest()[:24]
    path = store.join(root, *([sub] if sub else []), f"{digest}.parquet")
    store.write_parquet(path, table)
    return path


def commit_marker_path(curator: str, window: int) -> str:
    """Where window ``window``'s commit marker lies in the state folder ``curator`` (:data:`COMMITS`)."""
    return store.join(curator, COMMITS, f"window_id={int(window)}.json")


def committed_windows(curator: str) -> list[int]:
    """The windows with a commit marker in the state folder ``curator`` (its ``--output``), sorted."""
    found = (re.fullmatch(r"window_id=(-?[0-9]+)\.json", path.replace("\\", "/").rsplit("/", 1)[-1])
             for path in store.match(store.join(curator, COMMITS, "window_id=*.json")))
    return sorted(int(match[1]) for match in found if match)


def last_committed(curator: str) -> int | None:
    """The last window committed in the state folder ``curator`` (its last commit marker), None
    when none is."""
    windows = committed_windows(curator)
    return windows[-1] if windows else None


#: Where the job writes a ledger snapshot: ``<output>/ledger/window_id=<W>/shard=<S>/<digest>.parquet``.
_SNAPSHOT_PATH = re.compile(r"(?P<root>.+)/window_id=(?P<window>-?[0-9]+)/shard=(?P<shard>[0-9]+)/[^/]+")


def _snapshot_place(path: str) -> tuple[str, int, int] | None:
    """``(ledger root, window, shard)`` of a snapshot file the job wrote, from its path; None for
    a path without the ``window_id=<W>/shard=<S>/`` folders."""
    match = _SNAPSHOT_PATH.fullmatch(path.replace("\\", "/"))
    return None if match is None else (match["root"], int(match["window"]), int(match["shard"]))


def _snapshot_glob(root: str, window: int) -> str:
    return store.join(root, f"window_id={int(window)}", "*", "*.parquet")


def _window_of(path: str) -> int | None:
    """The window of a path below a ``window_id=<W>`` folder, None for another path."""
    match = re.search(r"/window_id=(-?[0-9]+)/", path.replace("\\", "/"))
    return None if match is None else int(match[1])


def _window_files(curator: str) -> dict[str, list[str]]:
    """Every file below a ``window_id=<W>`` folder of :data:`WINDOW_FOLDERS` in ``curator``, by folder."""
    found = {}
    for folder in WINDOW_FOLDERS:
        paths = store.match(store.join(curator, folder, "window_id=*", "**"))
        found[folder] = sorted(path for path in paths if _window_of(path) is not None)
    return found


def _matched(pattern: str) -> list[str]:
    return sorted(store.match(pattern))


def _schema_metadata(path: str) -> dict[str, str]:
    """A Parquet file's schema metadata, decoded, read from its footer only."""
    with store.open_input(path) as handle:
        return {k.decode(): v.decode() for k, v in (pq.read_schema(handle).metadata or {}).items()}


def _curator_tables(curator: str, folder: str) -> list[pa.Table]:
    """Every Parquet file under ``<curator>/<folder>``, read, in path order."""
    paths = store.match(store.join(curator, folder, "**.parquet"))
    return [store.read_parquet(path) for path in sorted(paths)]

