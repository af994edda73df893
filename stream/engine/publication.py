"""The outbox rule, written once: publish committed releases window by window, first write wins.

A public answer must always have a committed ledger that charged its users: an answer nobody was
charged for must never exist, even after a crash (docs/architecture.md, "The outbox rule";
invariant 4 (nothing-pre-noise-leaves) and invariant 5 (release-once), docs/architecture.md). So
every job keeps its noisy releases in two places:

* an :class:`Outbox`: the releases of windows whose charges are committed (the ledger that
  charged them is durable) and that are not yet known to be public;
* the :class:`PublicReleases`: where analysts read them, written first-write-wins.

and :func:`publish_outbox` moves them from one to the other. Each job has its own pair:

* the daily job: the curator store's ``outbox`` table (committed in the ledger's own DuckDB
  transaction) -> the DuckDB release store, and release files with ``--releases-parquet``
  (``pipelines/daily/job.py``);
* the distributed job: the staged release files of a committed run (its ``_COMMITTED.json``
  written, its place in the public lineage claimed) -> the public release root, with a lineage
  record per window (``pipelines/beam/publication.py``, ``pipelines/distributed/job.py``);
* the streaming job: a window's release file staged under its curator ``--output``, committed
  once every shard's ledger snapshot of that window (or of a later one) is written -> the public
  release root (``pipelines/beam/publication.py``, ``pipelines/streaming/commits.py``).

A crash anywhere leaves some windows public and the rest in the outbox; calling
:func:`publish_outbox` again publishes the rest, once (the public side skips a window already
public, so a window published but not yet marked is not published twice).

Test-only crash points (:func:`renyi_stream.stream.faults.crash_point`), at the same places for every job:
``during_publish`` before each window but the first (earlier windows public, later ones not) and
``after_publish`` once every window is public and before any is marked published.
Beam-free and storage-free: the implementations live with their jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.faults import crash_point
from renyi_stream.stream.schema import WINDOW_ID

__all__ = ["Outbox", "Publication", "PublicReleases", "publish_outbox"]


@runtime_checkable
class Outbox(Protocol):
    """Committed releases not yet public: per window, the noisy release rows (the columns of
    ``renyi_stream.queries.release_store.RELEASE_SCHEMA``; nothing pre-noise) of a ledger already durable."""

    def committed_windows(self) -> Sequence[int]:
        """The windows whose releases are committed and not marked published, in any order. A
        window whose charge is not committed is never listed."""

    def rows(self, window: int) -> pa.Table:
        """Window ``window``'s committed release rows, every one of them."""

    def mark_published(self, window: int) -> None:
        """Record that window ``window`` is public (a no-op where the public file is the mark)."""


@runtime_checkable
class PublicReleases(Protocol):
    """Where analysts read releases; first write wins: an answer once public never changes."""

    def check(self, rows: Mapping[int, pa.Table]) -> None:
        """Raise, before any window is published, when publishing ``rows`` (window -> rows)
        would contradict an answer already public; nothing is published then."""

    def publish(self, window: int, rows: pa.Table) -> int:
        """Make window ``window``'s ``rows`` public unless they already are (first write wins);
        return how many rows this call made public (0 when the window was public already)."""


@dataclass(frozen=True)
class Publication:
    """What one :func:`publish_outbox` did: the windows it made public (in window order; a
    window already public is not listed) and how many rows that took."""

    windows: tuple[int, ...] = ()
    rows: int = 0


def publish_outbox(outbox: Outbox, public: PublicReleases) -> Publication:
    """Publish every committed window of ``outbox`` to ``public``, one window at a time in window
    order, then mark each published; return what became public.

    Guarantees: only windows ``outbox`` lists as committed are published, with exactly their rows
    (ValueError, before anything is published, when a window's rows name another window);
    ``public.check`` sees every window before the first is published, so a conflict publishes
    nothing; a window is marked published only once every window of the call is public, so a
    crash at any point leaves each window public or still in the outbox (or both), and calling
    this again publishes the rest, once (first write wins makes a public window a no-op)."""
    windows = sorted({int(w) for w in outbox.committed_windows()})
    rows = {window: outbox.rows(window) for window in windows}
    for window, table in rows.items():
        if table.num_rows and not pc.all(pc.equal(table.column(WINDOW_ID), window)).as_py():
            others = sorted(set(pc.unique(table.column(WINDOW_ID)).to_pylist()) - {window})
            raise ValueError(f"the outbox's rows of window {window} include rows of window(s) {others[:5]}: a "
                             "window publishes its own rows only")
    public.check(rows)
    published, count = [], 0
    for index, window in enumerate(windows):
        if index:
            crash_point("during_publish")  # test-only: earlier windows public, later ones not
        new = int(public.publish(window, rows[window]))
        if new:
            published.append(window)
            count += new
    if windows:
        crash_point("after_publish")  # test-only: every window public, none marked yet
    for window in windows:
        outbox.mark_published(window)
    return Publication(windows=tuple(published), rows=count)
