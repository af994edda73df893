"""The streaming job's books, under any runner: each shard's books record of each window
(:func:`books_record`, written into the window's commit marker, :func:`write_window_records`), read
back (:func:`books_records`, :func:`window_counts`), and a finished run's row balance
(:func:`books`, :func:`curator_summary`, :func:`record_books`). Exact counts: curator only
(invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)). Imports no Beam."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.streaming.commits import MARKER_BOOKS, RECORDS_WRITTEN
from renyi_stream.pipelines.streaming.state_folder import (_curator_tables, _write_named, commit_marker_path,
                                                           committed_windows)
from renyi_stream.stream.engine.dead_letters import DeadLetterReason
from renyi_stream.stream.engine.row_balance import RowBalance, reason_counts
from renyi_stream.stream.engine.shard_state import WINDOW_COUNT_NAMES
from renyi_stream.stream.ledger import STATUS_NAMES
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE

#: The curator's record of a finished local run's row balance (:func:`books`), under ``--output``.
BOOKS_FILE = "_BOOKS.json"
#: The user id type of a new ledger when ``--id-type`` does not declare one and no replayed message shows

#: The columns of a shard's books record of a window (:func:`books_record`): the window and shard, the
#: shard's row books since its previous window (:class:`renyi_stream.stream.engine.shard_state.ShardBooks`), the
#: window's counts as the batch jobs record them (:data:`renyi_stream.stream.engine.shard_state.WINDOW_COUNT_NAMES`:
#: ``admitted``, ``clipped``, ``dropped`` by status, ``nonfinite``), the rows ``buffered`` for later
#: windows and ``balanced`` (1 or 0). One record per shard and window holds both the books and the
#: counts, and the window's commit marker holds every shard's record (:data:`MARKER_BOOKS`): a window
#: writes no file per shard for them. Sensitive: curator only.
BOOKS_COLUMNS = ("window_id", "shard", "received", "late", "out_of_range", "duplicate", *WINDOW_COUNT_NAMES,
                 "buffered", "balanced")


def books_record(window: int, record: dict) -> dict[str, int]:
    """A shard's books record of window ``window`` (:data:`BOOKS_COLUMNS`, integers): ValueError
    naming the columns missing from ``record``."""
    row = {"window_id": int(window), **{k: int(v) for k, v in dict(record).items()}}
    missing = sorted(set(BOOKS_COLUMNS) - set(row))
    if missing:
        raise ValueError(f"a shard's books record of window {int(window)} must hold {list(BOOKS_COLUMNS)}, "
                         f"missing {missing}")
    return row


def write_window_records(curator: str, element: tuple[int, dict, pa.Table | None]) -> tuple[int, tuple[str, int, str]]:
    """One shard's records of one charged window, ``(window, books record, duplicates or None)``
    (the streaming filter's ``books`` with ``window_records``,
    :class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter`) -> its
    duplicate dead letters, when it had any (``dead/window_id=<W>/`` under ``curator``, named by their
    content); returns ``(window, (RECORDS_WRITTEN, shard, books record))``: the shard's row books of the window and its
    counts by status (:data:`BOOKS_COLUMNS`, :func:`books_record`, as JSON). The books record travels
    to the commit step, which writes every shard's record of a window into the window's commit
    marker (:class:`renyi_stream.pipelines.streaming.commits.WindowCommits`): one file per window
    holds them, never one per shard, and they are committed with the window or not at all (invariant 7 (rows-counted-not-lost,
    docs/architecture.md): a committed window's rows keep their outcome after a crash)."""
    window, record, duplicates = element
    row = books_record(window, record)
    if duplicates is not None and duplicates.num_rows:
        _write_named(store.join(curator, "dead"), f"window_id={int(window)}", duplicates)
    return int(window), (RECORDS_WRITTEN, row["shard"], json.dumps(row, sort_keys=True))


def books_records(curator: str) -> pa.Table:
    """Every shard's books record of every window committed in the state folder ``curator`` (a
    streaming job's ``--output``): :data:`BOOKS_COLUMNS`, one row per (window, shard), in window
    order. Read from the commit markers, which hold them (:data:`MARKER_BOOKS`); a marker an
    earlier version wrote without them has its records in ``books/window_id=<W>/``, one Parquet file
    per shard. Records of windows not committed are never read (a dead branch's, or in flight).
    Exact counts: curator only."""
    rows: list[dict] = []
    parts: list[pa.Table] = []
    for window in committed_windows(curator):
        marker = store.read_json(commit_marker_path(curator, window))
        if MARKER_BOOKS in marker:
            rows.extend(marker[MARKER_BOOKS])
        else:
            parts.extend(_curator_tables(curator, f"books/window_id={window}"))
    schema = pa.schema([(name, pa.int64()) for name in BOOKS_COLUMNS])
    tables = [pa.Table.from_pylist(rows, schema=schema)] + [t.select(BOOKS_COLUMNS).cast(schema) for t in parts]
    return pa.concat_tables(tables).sort_by([("window_id", "ascending"), ("shard", "ascending")])


def window_counts(curator: str) -> pa.Table:
    """Every shard's counts of every committed window it charged rows in, from a streaming job's
    ``--output`` ``curator``: ``window_id``, ``shard`` and
    :data:`renyi_stream.stream.engine.shard_state.WINDOW_COUNT_NAMES`, as the batch jobs record them,
    one row per (window, shard) with a charged row, sorted. Read from the books records of the
    committed windows (:func:`books_records`), which hold them: a window charged but not yet
    committed (in flight, or a crashed job's dead branch) has none. Exact counts: curator only."""
    table = books_records(curator).select(["window_id", "shard", *WINDOW_COUNT_NAMES])
    charged = pc.greater(pc.add(pc.add(table.column("admitted"), table.column("clipped")), table.column("dropped")), 0)
    return table.filter(charged)


def books(curator: str) -> dict[str, Any]:
    """The row balance of a streaming job's curator output ``curator`` (its ``--output``), from the
    files it wrote, as every job records it (:meth:`renyi_stream.stream.engine.row_balance.RowBalance.totals`):
    ``rows_read`` (every message's rows, ``read/``), ``admitted``, ``clipped`` and ``dropped``
    (the shards' per-window books records in the commit markers, :func:`books_records`), ``rejected`` and ``late`` (``dead/``, by
    reason), and ``balanced``: whether the balance holds (:attr:`RowBalance.balanced`) and every
    shard's books balanced at every window it charged (the same records). Exact counts: curator only.

    Complete once the job has charged its last window and read its last message (a replay, or a
    drained stream); earlier, rows in flight or buffered for later windows are not yet counted."""
    def tables(folder: str) -> list[pa.Table]:
        return _curator_tables(curator, folder)

    def total(parts: list[pa.Table], column: str) -> int:
        return int(sum(pc.sum(t.column(column)).as_py() or 0 for t in parts if column in t.column_names))

    read, dead, shard_books = tables("read"), tables("dead"), books_records(curator)
    balance = RowBalance.of(rows_read=total(read, "rows_read"),
                            statuses={name: total([shard_books], name) for name in STATUS_NAMES},
                            reasons=reason_counts(dead))
    shards_balanced = pc.all(pc.equal(shard_books.column("balanced"), 1)).as_py() is not False
    return {**balance.totals(), "balanced": bool(balance.balanced and shards_balanced)}


def curator_summary(curator: str, balance: dict[str, Any] | None = None) -> list[str]:
    """What a finished run says to the curator about its rows and messages, from the files it wrote
    under ``curator`` (its ``--output``): the row books (``balance``, :func:`books`, read when not
    given), the messages read, and the dead letters by reason, each with its rows and the messages
    they came from (an ``undecodable_message`` is a message dead-lettered whole, one row read). Exact
    counts, so the lines open with :data:`renyi_stream.stream.private_files.CURATOR_ONLY_NOTICE`, and
    ``main`` prints them only without ``--quiet``: never public, never at INFO, never a Beam counter
    (invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)). Counted by Arrow, not row by row."""
    balance = books(curator) if balance is None else balance
    read = _curator_tables(curator, "read")
    messages = sum(t.num_rows for t in read)
    dead = [t.select(["source", "reason"]) for t in _curator_tables(curator, "dead") if t.num_rows]
    lines = [CURATOR_ONLY_NOTICE,
             f"rows read {balance['rows_read']:,} = admitted {balance['admitted']:,} + clipped {balance['clipped']:,} "
             f"+ dropped {balance['dropped']:,} + rejected {balance['rejected']:,} + late {balance['late']:,}"
             f"  [{'balanced' if balance['balanced'] else 'MISMATCH'}]"]
    if not dead:
        return lines + [f"messages read {messages:,}; dead letters: none"]
    letters = pa.concat_tables(dead)
    by_reason = letters.group_by("reason").aggregate([("source", "count"), ("source", "count_distinct")])
    with_letters = len(pc.unique(letters.column("source")))
    lines.append(f"messages read {messages:,}; {with_letters:,} of them dead-lettered whole or in part, by reason:")
    for row in sorted(by_reason.to_pylist(), key=lambda r: r["reason"]):
        rows, sources = int(row["source_count"]), int(row["source_count_distinct"])
        if row["reason"] == DeadLetterReason.UNDECODABLE_MESSAGE.value:
            lines.append(f"  {row['reason']}: {sources:,} message(s), each dead-lettered whole")
        else:
            lines.append(f"  {row['reason']}: {rows:,} row(s) of {sources:,} message(s)")
    return lines


def record_books(args: argparse.Namespace) -> int:
    """After a finished run (a replay, or a drained stream): record its row balance
    (:func:`books`) in ``<--output>/`` :data:`BOOKS_FILE`, say where its files are and, without
    ``--quiet``, the curator's summary (:func:`curator_summary`) on stderr; returns the exit status,
    0 when the books balance, else 1."""
    # The replay is finite, so every row is in the books now: check and record the balance as the
    # batch jobs do (exact counts go to the curator's file only, never to the output).
    balance = books(store.absolute(args.output))
    store.write_json(store.join(store.absolute(args.output), BOOKS_FILE), balance)
    print(f"[streaming] done: releases under {store.absolute(args.releases_parquet)}, curator files under "
          f"{store.absolute(args.output)}; row books {'balanced' if balance['balanced'] else 'MISMATCH'} "
          f"({BOOKS_FILE})", file=sys.stderr)
    if not args.quiet:  # exact counts: the curator's, under their heading, never under --quiet
        for line in curator_summary(store.absolute(args.output), balance):
            print(line, file=sys.stderr)
    return 0 if balance["balanced"] else 1
