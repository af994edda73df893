"""The streaming individual filter of one shard of users, under any runner (:class:`ShardFilter`):
rows buffered by window as they arrive, each window charged on a timer at its end, in event-time
order, through the engine's :meth:`renyi_stream.stream.engine.shard_state.ShardState.charge_window`,
and the shard's snapshot kept after every window. A runner's shell gives it the shard's keyed
state and timer and emits what it yields (the Beam shell:
:class:`renyi_stream.pipelines.streaming.beam.releases.StreamingIndividualFilterDoFn`).

Keyed by user shard **in the global window**: the shard's ledger lives in keyed state for the life
of the stream and is never cleared between windows: invariant 1 (ledger-never-window-scoped,
docs/architecture.md). A row for a window the shard has already charged is dead-lettered
``late_window`` and charges nobody (invariants 5-7).

Imports no Beam. Its steps yield ``(tag, value)``: tag None is the main output, any other a tagged
one; keyed state is anything with Beam's state methods (a bag: ``add``, ``read``, ``clear``; a
value: ``read``, ``write``, ``clear``), a timer anything with ``set(seconds)``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.pipelines.beam.rows import TICK, PackedRows, empty_rows, in_event_time_order, unpacked
from renyi_stream.pipelines.streaming.file_metadata import (PREPAID_ROWS, PREPAID_USERS, SNAPSHOT_BASE, SNAPSHOT_KIND,
                                                            _marked)
from renyi_stream.pipelines.streaming.progress import say_progress
from renyi_stream.stream.engine.dead_letters import classify_windows, window_letters
from renyi_stream.stream.engine.shard_cache import ShardCache, new_token
from renyi_stream.stream.engine.shard_state import (LEDGER_DELTA, LEDGER_PART, RUNNING_DELTA, RUNNING_PART, QueryPlan,
                                                    ShardBooks, ShardSnapshots, ShardState, held_deltas)
from renyi_stream.stream.engine.window_buffer import WindowBuffer
from renyi_stream.stream.schema import USER_ID, WINDOW_ID, WindowSpec

def _snapshot_table(parts: list[tuple[str, Any]], window: int, deltas_before: int) -> pa.Table:
    """The ledger table of the parts a shard keeps after ``window`` (a full snapshot or one delta),
    marked as :data:`SNAPSHOT_KIND` and, for a delta, :data:`SNAPSHOT_BASE` (``deltas_before``: the
    deltas the shard held before this window, one per window since its full snapshot)."""
    for kind, payload in parts:
        if kind == LEDGER_PART:
            return _marked(payload, {SNAPSHOT_KIND: "full"})
        if kind == LEDGER_DELTA:
            base = int(window) - 1 - int(deltas_before)
            return _marked(payload[1], {SNAPSHOT_KIND: "delta", SNAPSHOT_BASE: str(base)})
    raise ValueError("a shard's parts after a window hold no ledger")


def _prepaid_parts(parts: list[tuple[str, Any]], window: int, deltas_before: int) -> list[tuple[str, pa.Table]]:
    """The prepaid rows a shard keeps after ``window`` per running query, ``[(query_id, table)]`` by
    query id: its whole prepaid rows after a full snapshot, the rows of the users charged in the
    window for a delta, each marked as its window's ledger snapshot is (:func:`_snapshot_table`:
    :data:`SNAPSHOT_KIND`, and for a delta :data:`SNAPSHOT_BASE`)."""
    out = []
    for kind, payload in parts:
        if kind == RUNNING_PART:
            query_id, table = payload
            out.append((query_id, _marked(table, {SNAPSHOT_KIND: "full"})))
        elif kind == RUNNING_DELTA:
            _, query_id, table = payload
            base = int(window) - 1 - int(deltas_before)
            out.append((query_id, _marked(table, {SNAPSHOT_KIND: "delta", SNAPSHOT_BASE: str(base)})))
    return sorted(out, key=lambda item: item[0])


def split_by_window(table: pa.Table) -> list[tuple[int, pa.Table]]:
    """``table`` as ``(window_id, rows of that window)`` pairs, rows keeping their order."""
    if table.num_rows == 0:
        return []
    windows = table.column(WINDOW_ID).to_numpy()
    order = np.argsort(windows, kind="stable")
    bounds = np.flatnonzero(np.diff(windows[order])) + 1
    return [(int(windows[part[0]]), table.take(pa.array(part))) for part in np.split(order, bounds)]


class StateMark(NamedTuple):
    """What a shard's keyed state says about its ``STATE`` bag without reading it: ``token``, the
    state token (:func:`renyi_stream.stream.engine.shard_cache.new_token`) written with the bag's last change,
    and ``deltas``, how many ledger deltas the bag holds after its full snapshot (what
    :meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window` compacts on)."""

    token: str
    deltas: int


#: The default bound of a filter's shard cache when none is given: the default ``--shards``.
CACHED_SHARDS = 16


#: What a charging firing tells its runner's counters (:meth:`ShardFilter.counted`): its shard was
#: restored from its ``STATE`` bag (the bag read whole, every part unpickled and the ledger rebuilt)
#: or taken from the cache. One firing per shard and window of the schedule, rows or not.
RESTORED, TAKEN = "shards_restored_from_state", "shards_taken_from_cache"


class ShardFilter:
    """The individual filter for one shard of users on an unbounded stream, in the global window.

    Input elements ``(shard, (kind, payload))``: ``("rows", table)`` validated rows (with the
    ``_source``/``_row`` input position), ``("tick", None)`` (one per shard: starts its window
    chain, so a shard without rows still steps through the schedule and never blocks the
    release), and the previous state ``("ledger", table)`` / ``("running", (query_id, table))``.

    State (per shard, global window; never window-scoped, invariant 1), kept by the runner:
      ROWS_i, BLOCK_i, LATER, HELD -- the rows buffered for windows not yet charged, as
                 ``(window_id, packed rows)`` in a two-level timing wheel of bags by window
                 (:class:`renyi_stream.stream.engine.window_buffer.WindowBuffer`: a ring bag per window of the
                 current block of 8, a bag per later block of the current 64 windows, one for the
                 rest) and their rows counted per window (HELD): a window reads its own bag only.
      STATE   -- bag of the shard's snapshot parts (``("ledger", table)``, ``("running", ...)``,
                 ``("ledger_delta", (window, rows))`` and ``("running_delta", (window, query_id,
                 rows))``): the persistent ledger and prepaid rows, a full snapshot and the deltas
                 after it (``compact_every``), never cleared but to be replaced by a full snapshot.
      CHARGED -- the last window this shard charged (``start_window - 1`` before the first).
      MARK    -- :class:`StateMark`: the state token written with STATE's last change and the
                 deltas STATE holds, so a firing that finds its shard in the cache reads neither.
      BOOKS   -- ``(now, at the last charge)``: the shard's cumulative
                 :class:`renyi_stream.stream.engine.shard_state.ShardBooks` (rows received, dead, charged), checked
                 against the buffer at every charged window, and as they were at the last one.
    Timer:
      WINDOW_END -- event-time timer at the end of the next uncharged window. Its callback
                    :meth:`window_end` takes the shard from the worker's cache when the cached
                    copy is the committed state (its token is MARK's), else restores it from STATE
                    (:class:`renyi_stream.stream.engine.shard_state.ShardSnapshots`, as the batch filter),
                    charges exactly that window, writes the shard's snapshot back to STATE with a
                    fresh token in MARK, files the shard in the cache under that token, then
                    re-arms at the next window's end (through ``end_window``). A firing before
                    that end (an extra or repeated firing) does nothing, so each window is
                    charged at most once (invariant 6).
    Cache (:class:`renyi_stream.stream.engine.shard_cache.ShardCache`, this instance's, never pickled):
      the shards this instance charged, each under the token its firing wrote, at most
      ``cached_shards`` of them (least recently charged evicted first). A shard's firings come
      once per window in turn, a cycle through the worker's shards on which a least-recently-used
      cache smaller than that cycle misses every time; the default bound is therefore the job's
      ``n_shards`` (the Beam shell's ``StreamingReleases``), so no worker evicts a shard of its own,
      and the memory it holds is at most the decoded ledger of the shards it charges. 0 turns it off
      (every firing restores from STATE, as before the cache).
    Progress (``progress``): a line ``[streaming] shard S charged window W at T`` on stderr after
      each charged window, ``T`` a monotonic clock in seconds: public (the schedule and the shard
      count are), never a count or a sum (invariant 4).
    Outputs: ``(window_id, (shard, {query_id: partial sum vector}))`` (main: one report per
    window of the schedule, ``{}`` when nothing was charged), dead letters (tag ``dead``:
    late, out-of-range and duplicate rows), ``(window, counts)`` (tag ``counts``, windows with
    rows), ``(window, books)`` (tag ``books``, every charged window: the ``shard`` and its books
    since its previous charge, ``received``, ``late``, ``out_of_range``, ``duplicate``,
    ``admitted``, ``clipped``, ``dropped``, ``nonfinite``, the rows ``buffered`` for later windows
    and ``balanced``, 1 or 0; with ``window_records``, ``(window, books, duplicates)``: the
    window's duplicate dead letters there rather than under ``dead``), ``(shard, window, ledger snapshot)`` (tag ``ledger``: after ``end_window``, or every
    window with ``snapshot_every_window``) and ``(query_id, snapshot)`` (tag ``running``,
    with the final ledger). With ``prepaid_every_window`` (a plan or a restored state with
    running queries), every charged window also ``(shard, window, [(query_id, prepaid rows)])``
    (tag ``prepaid``, :func:`_prepaid_parts`): the shard's per-user prepaid rows after the window as
    its ledger snapshot has them, whole with a full snapshot and otherwise the rows of the users
    charged in the window (:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`), ``[]``
    while it has none.
    """

    def __init__(self, *, plan: QueryPlan, window: WindowSpec, start_window: int, end_window: int,
                 indicator_columns: Sequence[str], noise_std: float, policy: str, budget: float, id_type: str,
                 tracker_step: float, released: Sequence[int] = (),
                 running_meta: dict[str, dict[str, str]] | None = None, snapshot_every_window: bool = False,
                 resumed_through: int | None = None, window_records: bool = False, compact_every: int = 1,
                 cached_shards: int = CACHED_SHARDS, prepaid_every_window: bool = False,
                 progress: bool = False) -> None:
        if end_window < start_window:
            raise ValueError(f"end_window must be >= start_window={start_window}, got end_window={end_window}")
        if resumed_through is not None and not start_window - 1 <= resumed_through <= end_window:
            raise ValueError(f"resumed_through must be in [{start_window - 1}, {end_window}] (start_window - 1 .. "
                             f"end_window), got resumed_through={resumed_through}")
        if any(int(w) >= start_window for w in released):
            raise ValueError(f"released windows must be before start_window={start_window} (earlier runs), "
                             f"got released={sorted(int(w) for w in released if int(w) >= start_window)}")
        self._window = window
        self._start, self._end = int(start_window), int(end_window)
        self._columns = list(indicator_columns)
        self._noise_std = noise_std
        self._policy = policy
        self._released = tuple(sorted(int(w) for w in released))
        self._snapshot_every_window = snapshot_every_window
        # A job resumed after a crash (renyi_stream.pipelines.streaming.recovery, "Crash recovery") charged this
        # schedule's windows through ``resumed_through`` before: every shard starts there.
        self._resumed = self._start - 1 if resumed_through is None else int(resumed_through)
        self._window_records = window_records
        self._prepaid_every_window = prepaid_every_window
        # The engine restores and snapshots a shard, as for the batch filter.
        self._shards = ShardSnapshots(plan=plan, budget=budget, id_type=id_type, tracker_step=tracker_step,
                                      running_meta=dict(running_meta or {}), compact_every=compact_every)
        self._id_type = id_type
        if int(cached_shards) != cached_shards or cached_shards < 0:
            raise ValueError(f"cached_shards must be an integer >= 0 (shards a worker keeps between windows), "
                             f"got cached_shards={cached_shards!r}")
        self._cached_shards = int(cached_shards)
        self._progress = bool(progress)
        self._cache: ShardCache | None = None  # made on first use on the worker, never pickled

    def __getstate__(self) -> dict[str, Any]:
        # A copy of this filter (the runner pickles it to every worker, or per bundle) starts with no
        # cache: shards are filed by the instance whose firings charged them.
        return {**self.__dict__, "_cache": None}

    def shard_cache(self) -> ShardCache:
        """This instance's cache of restored shards (made on first use)."""
        if self._cache is None:
            self._cache = ShardCache(self._cached_shards)
        return self._cache

    def _end_of(self, window: int) -> int:
        return int(self._window.window_end_seconds(int(window)))

    def _charged(self, charged: Any) -> int:
        value = charged.read()
        return self._resumed if value is None else int(value)

    def counted(self, name: str) -> None:
        """A charging firing restored its shard (:data:`RESTORED`) or took it from the cache
        (:data:`TAKEN`): a runner counts it where its operators see it (a count of firings, never of
        rows). Nothing here."""

    def receive(self, element: tuple[int, tuple[str, Any]], *, buffer: WindowBuffer, state: Any, charged: Any,
                books: Any, mark: Any, timer: Any) -> Iterator[tuple[str | None, Any]]:
        """An element of the shard: rows buffered by window, a tick, or a part of its previous state;
        then the timer set at the end of the next uncharged window."""
        _, (kind, payload) = element
        through = self._charged(charged)
        if kind == "rows":
            if not (isinstance(payload, PackedRows) and self._buffer_whole(payload, through, buffer, books)):
                yield from self._buffer(unpacked([payload])[0], through, buffer, books,
                                        packed=payload if isinstance(payload, PackedRows) else None)
        elif kind in (LEDGER_PART, RUNNING_PART):
            state.add((kind, payload))
            # STATE changed without a charge: no cached shard is this state any more, and the
            # deltas it holds are unknown until it is read (the next firing restores from it).
            mark.clear()
        elif kind != TICK:
            raise ValueError(f"element kind must be rows, tick, ledger or running, got kind={kind!r}")
        if through < self._end:
            # Idempotent: the timer always points at the end of the next uncharged window.
            timer.set(self._end_of(through + 1))

    def _buffer_whole(self, packed: PackedRows, through: int, buffer: WindowBuffer, books: Any) -> bool:
        """Buffer ``packed`` as it came, without decoding it, when its rows are all of one window
        (:attr:`PackedRows.window`, as a producer's message per window gives them) and that window
        keeps them all: the rule of :meth:`_buffer` for a single window id, which it applies to
        every row alike. Returns whether it did; otherwise (several windows, or rows that are late,
        out of the schedule or re-delivered to a resumed job) :meth:`_buffer` sorts the rows."""
        window = packed.window
        if window is None or (self._resumed >= self._start and self._start <= window <= self._resumed):
            return False
        classes = classify_windows(np.array([window], dtype=np.int64), start_window=self._start,
                                   end_window=self._end, charged=self._released, charged_through=through)
        if not classes.all_kept:
            return False
        buffer.add([(window, packed, packed.num_rows)], next_window=through + 1)
        now, closed = books.read() or (ShardBooks(), ShardBooks())
        books.write((now.plus(received=packed.num_rows), closed))
        return True

    def _buffer(self, table: pa.Table, through: int, buffer: WindowBuffer, books: Any,
                packed: PackedRows | None = None) -> Iterator[Any]:
        arrived = table
        if self._resumed >= self._start:
            # Re-delivered to a resumed job: rows of this schedule's windows up to the one it resumed
            # from were read, charged and counted in those windows' committed records by the job it
            # resumes (invariant 6 (charge-once), invariant 7 (rows-counted-not-lost)). Neither
            # charged nor counted again.
            windows = table.column(WINDOW_ID)
            again = pc.and_(pc.greater_equal(windows, self._start), pc.less_equal(windows, self._resumed))
            if pc.any(again).as_py():
                table = table.filter(pc.invert(again))
        # A window this shard charged may be released: charging it now would change a release.
        classes = classify_windows(table.column(WINDOW_ID), start_window=self._start, end_window=self._end,
                                   charged=self._released, charged_through=through)
        received = table.num_rows
        if not classes.all_kept:
            yield "dead", window_letters(table, classes)
            table = table.filter(pa.array(classes.keep))
        span = pc.min_max(table.column(WINDOW_ID)) if table.num_rows else None
        if packed is not None and table is arrived and span is not None and span["min"] == span["max"]:
            # Every row kept, all of one window (a message per window, as producers send them): the
            # packed bytes that came in are kept as they are, never split, copied or recompressed.
            buffer.add([(int(span["min"].as_py()), packed, table.num_rows)], next_window=through + 1)
        elif table.num_rows:  # each window's rows in its own bag, compressed while they wait (as in batch)
            buffer.add([(window, PackedRows(part), part.num_rows) for window, part in split_by_window(table)],
                       next_window=through + 1)
        now, closed = books.read() or (ShardBooks(), ShardBooks())
        books.write((now.plus(received=received, late=np.count_nonzero(classes.late),
                              out_of_range=np.count_nonzero(classes.out_of_schedule)), closed))

    def window_end(self, key: Any, timestamp: Any, *, buffer: WindowBuffer, state: Any, charged: Any, books: Any,
                   mark: Any, timer: Any) -> Iterator[tuple[str | None, Any]]:
        """The timer at ``timestamp`` (seconds): charge the next uncharged window once its end is
        reached, snapshot the shard and set the timer at the next window's end."""
        through = self._charged(charged)
        window = through + 1
        if window > self._end or timestamp < self._end_of(window):
            return  # an extra firing: this window's end is not reached, or everything is charged
        # This window's own bag only (renyi_stream.stream.engine.window_buffer): never the rows of later windows.
        mine = unpacked(buffer.take(window)[0])
        # The cached shard only if it is exactly the committed state: its token is the one committed
        # with STATE's last change (renyi_stream.stream.engine.shard_cache). Else restore from STATE, whole.
        committed = mark.read()
        shard = self.shard_cache().take(key, committed.token if committed is not None else None)
        if shard is not None:
            deltas = committed.deltas
            self.counted(TAKEN)
        else:
            held = list(state.read())
            shard, deltas = self._shards.restore(held), held_deltas(held)
            self.counted(RESTORED)
        data, duplicates = in_event_time_order(mine)  # exactly as the batch path
        if duplicates is not None and duplicates.num_rows and not self._window_records:
            yield "dead", duplicates
        counts = yield from self._charge(key, shard, window, data)
        # The rows held for later windows, as counted when they were buffered (no bag is read): a
        # window whose bag held other rows than counted leaves the books unbalanced.
        yield from self._close_books(key, window, books, counts, duplicates, buffered=buffer.held_rows())
        # Persist before anything else can observe the shard: the ledger is replaced (a full snapshot)
        # or added to (a delta of the users charged in this window), never cleared. The first window
        # a job charges and its last are full, so that each job's chain of deltas starts in its own
        # snapshots and the next job continues from one full snapshot per shard.
        users = data.column(USER_ID) if data is not None else []
        snapshot, whole = self._shards.after_window(shard, window=window, charged=users, deltas_held=deltas,
                                                    full=window in (self._resumed + 1, self._end))
        if whole:
            state.clear()
        for part in snapshot:
            state.add(part)
        # A fresh token, committed with STATE's change or not at all (one bundle's state writes).
        token = new_token()
        mark.write(StateMark(token, 0 if whole else deltas + 1))
        charged.write(window)
        buffer.advance(window + 1)  # at a block's start, its rows move to their own bags
        ledger = _snapshot_table(snapshot, window, deltas)
        if self._prepaid_every_window:
            # Like the ledger: whole with a full snapshot, else the rows of the users charged in the window.
            parts = _prepaid_parts(snapshot, window, deltas)
            yield "prepaid", (key, window, parts)
            ledger = _marked(ledger, {
                PREPAID_USERS: json.dumps({q: len(prepaid) for q, prepaid in shard.running.items()}, sort_keys=True),
                PREPAID_ROWS: json.dumps({q: t.num_rows for q, t in parts}, sort_keys=True)})
        if self._snapshot_every_window or window == self._end:
            yield "ledger", (key, window, ledger)
        if window == self._end:
            for kind, payload in snapshot:
                if kind == RUNNING_PART:
                    yield "running", payload
        else:
            timer.set(self._end_of(window + 1))
            # Filed last, after every state write of this firing and under the token written with
            # them: a firing that stops before this leaves no shard in the cache. After the last
            # window the shard fires no more and is not kept.
            self.shard_cache().put(key, token, shard)
        if self._progress:  # public: the shard, the window and a monotonic clock (invariant 4: no count)
            say_progress(f"shard {int(key)} charged window {window}")

    def _charge(self, key: int, shard: ShardState, window: int, data: pa.Table | None) -> Iterator[Any]:
        # The batch path charges a window that has rows or a running query active in it; charging
        # the same windows keeps the ledger and the releases identical to it.
        steps = shard.windows_to_step([window] if data is not None else [], window)
        if any(step != window for step in steps):
            # The chain charges every window in turn, so a running query's history is never behind.
            raise RuntimeError(f"shard {key} would step windows {steps} at window {window}: its running-query "
                               "history is behind the stream")
        sums: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        if steps:
            part = data if data is not None else empty_rows(self._id_type, self._columns)
            result = shard.charge_window(window, part, noise_std=self._noise_std, policy=self._policy)
            sums = dict(result.sums)
            if part.num_rows:
                counts = dict(result.counts)
                yield "counts", (window, result.counts)
        # One report per (shard, window), rows or not, partial sums inside: the release knows the
        # window is complete when every shard's report is in, whatever order elements travel in.
        yield None, (window, (int(key), sums))
        return counts

    def _close_books(self, key: int, window: int, books: Any, counts: dict[str, int],
                     duplicates: pa.Table | None, buffered: int) -> Iterator[Any]:
        """Add the window's charged and duplicate rows to the shard's books, check them against the
        rows still buffered for later windows, and record both (tag ``books``, every window)."""
        now, before = books.read() or (ShardBooks(), ShardBooks())
        after = now.plus(duplicate=0 if duplicates is None else duplicates.num_rows, **counts)
        balanced = after.balances(buffered)
        if not balanced:
            # An engine bug, never a data-dependent event: say so without the (sensitive) counts.
            logging.getLogger(__name__).error("window %d: a shard's row books do not balance (curator "
                                              "counts record the details)", window)
        books.write((after, after))
        # The shard is part of the record: two shards' records are otherwise equal whenever their
        # counts are, and the curator's files are named by their content.
        record = {"shard": int(key), **after.since(before), "nonfinite": int(counts.get("nonfinite", 0)),
                  "buffered": buffered, "balanced": int(balanced)}
        if self._window_records:  # the window's duplicates travel with its books: one record, committed together
            yield "books", (window, record, duplicates)
        else:
            yield "books", (window, record)

