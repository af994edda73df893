"""The streaming job's commit protocol, under any runner (docs/architecture.md, "The outbox rule"):
each window's release file staged (:class:`WindowStaging`), its shards' prepaid rows written
(:func:`write_prepaid`), and the windows committed in order and published (:class:`WindowCommits`)
once their every file is written. A runner's shell gives the stateful steps their keyed state and
emits what they yield (the Beam shell: ``StageWindowFile``, ``WritePrepaid``, ``CommitWindows``).
Imports no Beam."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pyarrow as pa

from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.beam.publication import PublicReleaseFiles, StagedReleases
from renyi_stream.pipelines.streaming.file_metadata import RUNNING_QUERY_ID, SNAPSHOT_KIND, _metadata
from renyi_stream.pipelines.streaming.progress import say_progress
from renyi_stream.pipelines.streaming.recovery import claim_lineage
from renyi_stream.pipelines.streaming.state_folder import (PREPAID, STAGED_RELEASES, _snapshot_place, _write_named,
                                                           commit_marker_path)
from renyi_stream.queries.release_files import release_file_path, release_file_table
from renyi_stream.stream.engine.publication import publish_outbox
from renyi_stream.stream.faults import crash_point

#: What the commit step hears of a window: its release file is staged (shard ``-1``), one shard's
#: ledger snapshot of it is written, one shard's records of it (books, duplicates), or (with
#: running queries) one shard's prepaid rows of it.
STAGED, SNAPSHOT_WRITTEN, RECORDS_WRITTEN, PREPAID_WRITTEN = "staged", "snapshot", "records", "prepaid"
#: The commit marker's list of the window's books records, one per shard
#: (:data:`renyi_stream.pipelines.streaming.books.BOOKS_COLUMNS`).
MARKER_BOOKS = "books"


class WindowStaging:
    """``(window_id, release row)`` keyed by window -> the window's release file staged under the
    curator's ``root`` once all of its rows are in (``expected(window)`` of them: one per coordinate
    of each query active in it, and one running-query state per running query active in it);
    outputs ``(window, (STAGED, -1))``. Staged, not public: the file is the job's outbox
    (:data:`renyi_stream.pipelines.streaming.state_folder.STAGED_RELEASES`), published by
    :class:`WindowCommits`. An element ``(window_id, state table)`` (a table, not a row: the running
    release's ``release_state``, :func:`renyi_stream.pipelines.streaming.running_state.running_state_table`)
    is a running query's state after the window, written under ``running_root`` (``window_id=<W>/``,
    named by its content) before the release file, so a staged window always has the release states
    that continue it.
    Written whole and ``0600`` (:func:`renyi_stream.pipelines.beam.object_store.write_parquet`); a retried
    bundle rewrites the same content (keyed noise). Crash point ``streaming_after_stage``.

    A stateful step, keyed by window (state ROWS: a bag of the window's rows not yet staged), rather
    than a grouping: grouping an unbounded collection needs a windowing and trigger, and the rows of
    a window are complete exactly when their count is."""

    def __init__(self, root: str, expected: dict[int, int], running_root: str | None = None) -> None:
        self._root = root
        self._expected = dict(expected)
        self._running_root = running_root

    def stage(self, element: tuple[int, dict], *, rows: Any) -> Iterator[Any]:
        """Add ``element`` to the window's ``rows`` (a bag); once they are all in, stage the file."""
        window, row = element
        rows.add(row)
        buffered = list(rows.read())
        if len(buffered) < self._expected[int(window)]:
            return
        rows.clear()
        states = [item for item in buffered if isinstance(item, pa.Table)]
        if states and self._running_root is None:
            raise ValueError("a running query's state was staged, but no running_root was given to keep it")
        for table in states:
            _write_named(self._running_root, f"window_id={int(window)}", table)
        store.write_parquet(release_file_path(self._root, int(window)),
                            release_file_table([item for item in buffered if not isinstance(item, pa.Table)]))
        crash_point("streaming_after_stage")  # test-only: staged, not committed
        yield int(window), (STAGED, -1)


def _snapshot_written(path: str) -> tuple[int, tuple[str, int]]:
    """The path of a ledger snapshot just written -> ``(window, (SNAPSHOT_WRITTEN, shard))``.
    Crash point ``streaming_after_snapshot``."""
    place = _snapshot_place(path)
    if place is None:
        raise ValueError(f"path must be a snapshot the job wrote (.../window_id=<W>/shard=<S>/...), got {path!r}")
    crash_point("streaming_after_snapshot")  # test-only: a shard's snapshot written, its window not committed
    _, window, shard = place
    return window, (SNAPSHOT_WRITTEN, shard)


def write_prepaid(curator: str, element: tuple[int, int, list[tuple[str, pa.Table]]]) -> tuple[int, tuple[str, int]]:
    """One shard's per-user prepaid rows after one window, ``(shard, window, [(query_id, table)])``
    (the streaming filter's ``prepaid``, :class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter`:
    whole with a full ledger snapshot, else a delta, the rows of the users charged in the window) ->
    one file per running
    query, ``prepaid/window_id=<W>/shard=<S>/``, named by its content and recording the query id
    (:data:`renyi_stream.pipelines.streaming.file_metadata.RUNNING_QUERY_ID`); a delta without rows writes no
    file (the window's ledger snapshot records the rows of each,
    :data:`renyi_stream.pipelines.streaming.file_metadata.PREPAID_ROWS`, so a file is expected exactly when
    it has rows). Returns ``(window, (PREPAID_WRITTEN, shard))``, so the window's commit marker is
    written only once they are: a lost prepaid row would restart its user's prepaid charge from
    nothing."""
    shard, window, parts = element
    for query_id, table in parts:
        if not table.num_rows and _metadata(table).get(SNAPSHOT_KIND) == "delta":
            continue  # nobody's prepaid rows changed: nothing to write (PREPAID_ROWS records 0)
        marked = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                RUNNING_QUERY_ID.encode(): query_id.encode()})
        _write_named(store.join(curator, PREPAID), f"window_id={int(window)}/shard={int(shard)}", marked)
    return int(window), (PREPAID_WRITTEN, int(shard))


class WindowCommits:
    """Under one key: commits the job's windows in window order, each once it is complete, and
    publishes them by the one publication rule (:func:`renyi_stream.stream.engine.publication.publish_outbox`,
    first write wins); outputs the public files.

    Input ``(key, (window, event))``: ``(STAGED, -1)`` from :class:`WindowStaging`,
    ``(SNAPSHOT_WRITTEN, shard)`` from the ledger snapshot writer (:func:`_snapshot_written`),
    ``(RECORDS_WRITTEN, shard, books record)`` from
    :func:`renyi_stream.pipelines.streaming.books.write_window_records` and ``(PREPAID_WRITTEN,
    shard)`` from :func:`write_prepaid`. Window ``W`` is complete when it is staged and
    all ``n_shards`` snapshots and records of it are written; it is committed when ``W - 1`` is (or
    ``W`` is the first window this job charges, ``first_window``) by writing its marker
    (:func:`renyi_stream.pipelines.streaming.state_folder.commit_marker_path`, whole or not at all; it
    holds every shard's books record of the window, :data:`MARKER_BOOKS`), and only then published. So a crash between
    any two writes leaves the last marker on a complete window, whose snapshots hold every
    earlier window's charges, and no public answer without its window's marker and ledger
    snapshots (invariant 4 (nothing-pre-noise-leaves), invariant 5 (release-once), invariant 6
    (charge-once), docs/architecture.md, "The outbox rule"). A repeated event does nothing.
    State: EVENTS (bag of ``(window, event)`` of windows not yet committed), NEXT (the next
    window to commit). Crash points ``streaming_after_commit`` (a marker written, its window not
    yet public), then the publication rule's."""

    def __init__(self, curator: str, public: str, n_shards: int, *, first_window: int, end_window: int,
                 ledger_id: str | None = None, prepaid: bool = False, run: str | None = None,
                 previous_run: str | None = None) -> None:
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1, got n_shards={n_shards}")
        self._prepaid = prepaid  # running queries: every shard's prepaid rows of a window too
        self._curator = curator
        self._public = public
        self._n_shards = int(n_shards)
        self._first, self._end = int(first_window), int(end_window)
        self._ledger_id = ledger_id
        self._run, self._previous_run = run, previous_run  # the job's place in the public lineage

    def _complete(self, heard: set[tuple]) -> bool:
        snapshots = {event[1] for event in heard if event[0] == SNAPSHOT_WRITTEN}
        records = {event[1] for event in heard if event[0] == RECORDS_WRITTEN}
        prepaid = {event[1] for event in heard if event[0] == PREPAID_WRITTEN}
        return ((STAGED, -1) in heard and len(snapshots) == self._n_shards and len(records) == self._n_shards
                and (not self._prepaid or len(prepaid) == self._n_shards))

    @staticmethod
    def _books(window: int, heard: set[tuple]) -> list[dict]:
        """The shards' books records of ``window`` from its RECORDS events, in shard order. A retried
        bundle repeats its shard's record unchanged; two different records of one shard are an
        engine bug (RuntimeError, nothing committed)."""
        by_shard: dict[int, set[str]] = {}
        for event in heard:
            if event[0] == RECORDS_WRITTEN:
                by_shard.setdefault(int(event[1]), set()).add(event[2])
        twice = sorted(shard for shard, records in by_shard.items() if len(records) > 1)
        if twice:
            raise RuntimeError(f"window {window}: shard(s) {twice} reported two different books records")
        return [json.loads(next(iter(by_shard[shard]))) for shard in sorted(by_shard)]

    def commit(self, element: tuple[Any, tuple[int, tuple[str, int]]], *, events: Any, upcoming: Any) -> Iterator[str]:
        """Hear ``element``'s event (``events``: a bag, ``upcoming``: a value), commit every window now
        complete in order, publish them; yields the public files written."""
        _, (window, event) = element
        following = upcoming.read()
        following = self._first if following is None else int(following)
        if int(window) < following:
            return  # committed already: a repeated event
        events.add((int(window), tuple(event)))
        heard: dict[int, set[tuple[str, int]]] = {}
        for w, e in events.read():
            heard.setdefault(int(w), set()).add(tuple(e))
        committed = []
        while following <= self._end and self._complete(heard.get(following, set())):
            store.write_json(commit_marker_path(self._curator, following), {
                "window_id": following, "n_shards": self._n_shards, "ledger_id": self._ledger_id,
                "snapshots": store.join(self._curator, "ledger", f"window_id={following}"),
                "staged": release_file_path(store.join(self._curator, STAGED_RELEASES), following),
                MARKER_BOOKS: self._books(following, heard[following])})
            crash_point("streaming_after_commit")  # test-only: committed, not yet public
            # Progress for the operator (and benchmarks/bench_streaming.py's per-window time): the
            # window id and a monotonic clock only, both public (invariant 4: no count, no sum).
            say_progress(f"window {following} committed")
            committed.append(following)
            following += 1
        if not committed:
            return
        upcoming.write(following)
        events.clear()
        for w, kinds in heard.items():
            for e in kinds if w >= following else ():
                events.add((w, e))
        # LineageConflict (the job fails, nothing of it public) when another job from our ledger claimed first.
        claim_lineage(self._public, self._run, self._previous_run)
        done = publish_outbox(StagedReleases(store.join(self._curator, STAGED_RELEASES), committed),
                              PublicReleaseFiles(self._public, run=self._run))
        for w in done.windows:
            yield release_file_path(self._public, w)

