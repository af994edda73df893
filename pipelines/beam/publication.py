"""The outbox and the public side of the jobs that keep releases as Parquet files (the distributed
and streaming jobs), for the one publication rule :func:`renyi_stream.stream.engine.publication.publish_outbox`.

* :class:`StagedReleases`, the outbox: release files staged in the curator's ``--output``, one
  per window, as :mod:`renyi_stream.queries.release_files` lays them out
  (``<staging>/window_id=<W>/releases.parquet``). Staged files are committed by what the job
  writes after them, never by being there: the caller gives only a committed staging (the
  distributed job: a run whose ``_COMMITTED.json`` exists, after its lineage claim) or only the
  windows committed (the streaming job: windows whose every shard's ledger snapshot, of that
  window or a later one, is written).
* :class:`PublicReleaseFiles`, the public side: the public release root, one file per window,
  first write wins (:func:`renyi_stream.queries.release_files.write_release_file`), with, for the distributed
  job, the lineage record of the run that charged the window written before its file
  (:func:`renyi_stream.queries.release_lineage.record_window`).

The public file is the mark of a published window, so marking is a no-op and a window published
before a crash is skipped when publishing resumes (docs/architecture.md, "The outbox rule").
Imports no Beam (the streaming job's runners share it).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import pyarrow as pa

from renyi_stream.pipelines.beam.object_store import exists, read_parquet, release_windows_present
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.queries.release_files import release_file_path, write_release_file
from renyi_stream.stream.schema import WINDOW_ID


class StagedReleases:
    """Release files staged under ``root``: every window there, or with ``windows`` only those
    (:class:`renyi_stream.stream.engine.publication.Outbox`). Staged files are curator files, read through
    :func:`renyi_stream.pipelines.beam.object_store.read_parquet` (a local one others may read is refused)."""

    def __init__(self, root: str, windows: Iterable[int] | None = None) -> None:
        self._root = root
        self._windows = None if windows is None else {int(w) for w in windows}

    def committed_windows(self) -> list[int]:
        if self._windows is None:
            return sorted(release_windows_present(self._root))
        # Only the given windows' files are looked for: the streaming job publishes each window as it
        # commits, and listing the whole staging folder each time would cost every window so far.
        return sorted(w for w in self._windows if exists(release_file_path(self._root, w)))

    def rows(self, window: int) -> pa.Table:
        table = read_parquet(release_file_path(self._root, window))
        return table.append_column(WINDOW_ID, pa.array([int(window)] * table.num_rows, type=pa.int64()))

    def mark_published(self, window: int) -> None:
        """Nothing to record: the public file is the mark (first write wins)."""


class PublicReleaseFiles:
    """The public release root ``root`` (:class:`renyi_stream.stream.engine.publication.PublicReleases`): one
    file per window, first write wins. With ``run``, each window's lineage record names that run
    (written before the file; LineageConflict when another run's is recorded)."""

    def __init__(self, root: str, *, run: str | None = None) -> None:
        self._root = root
        self._run = run

    def check(self, rows: Mapping[int, pa.Table]) -> None:
        """Nothing to check before publishing: a window already public keeps its file (rows of
        the lineage's own ledger are identical there, keyed noise), and which ledger may publish
        at all is decided before (the distributed job's lineage claim)."""

    def publish(self, window: int, rows: pa.Table) -> int:
        if self._run is not None:
            lineage.record_window(self._root, window, self._run)
        return rows.num_rows if write_release_file(self._root, window, rows) is not None else 0
