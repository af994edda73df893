"""The individual filter and its releases on an unbounded stream, window by window on the watermark.

The batch path (:class:`renyi_stream.pipelines.beam.transforms.IndividualFilterDoFn`) charges a whole run on one
timer at the end of the global window. Here the same per-window work runs as the watermark
passes each window's end, so a long-running pipeline releases every day as it closes:

* :class:`StreamingIndividualFilterDoFn`, keyed by user shard **in the global window**: the
  shard's ledger lives in keyed state for the life of the stream and is never cleared between
  windows: invariant 1 (ledger-never-window-scoped, docs/architecture.md). Rows are buffered per
  window; on the event-time timer at the window's end the window's rows are charged in
  event-time order, ties by input position, with duplicates of a (user, window) dead-lettered by
  the batch rule (invariant 2), through the same
  :meth:`renyi_stream.stream.engine.shard_state.ShardState.charge_window`. A row for a window the shard has
  already charged is dead-lettered ``late_window`` and charges nobody (invariants 5-7).
* :class:`ReleaseCompletedWindow`, keyed by window: every shard reports once per window of the
  public schedule, rows or not, with its partial sums inside; when all shards have reported, it
  releases every active query through :class:`renyi_stream.pipelines.beam.transforms.ReleaseWindow` (the same
  keyed noise: invariants 3, 5), once.
* :class:`ReleaseRunningInOrder`, keyed by running query: the query's release state
  (:class:`renyi_stream.stream.engine.running.RunningRelease`, the batch jobs' object) advanced once per window
  of the schedule, in window order, rows or not, from each completed window's ``a_t``: ``y_t =
  (C a)_t + z_t`` with the keyed noise (:meth:`renyi_stream.pipelines.beam.transforms.ReleaseRunning.release_window`),
  then the window's running-total estimate decoded online
  (:meth:`renyi_stream.stream.continual.running.RunningQuery.estimate_online`, rows by
  :class:`renyi_stream.pipelines.beam.transforms.RunningEstimates`), and the state after the window (the
  release state and the decoder's), which the job commits with the window.
* :class:`StreamingReleases` wires them together.

Why a window is never released without a shard's rows: every shard (rows or not, started by a
tick) holds one chained event-time timer at the end of its next uncharged window; it charges
that window and only then reports it. The release waits for all ``n_shards`` reports instead of
a watermark timer of its own, because runners differ in whether pending timers hold a stateful
DoFn's output watermark (the Python DirectRunner's do not, so a release timer would race the
last shard's partial sums). A row for a window its shard already charged is late; a row for a
window not yet charged by its shard cannot have been released, so nothing changes a release.
Releases equal the batch path's on the same data (up to the order of summing partial sums).

The schedule is finite and public (``start_window..end_window``): each shard steps through it
one window per timer firing, so its "charged through" mark is exact even with no rows, and the
chain ends at ``end_window`` (an open-ended stream is served by extending the schedule on a
restart from the ledger snapshot, see ``previous_ledger``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer

from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.engine.dead_letters import classify_windows, window_letters
from renyi_stream.stream.engine.running import RunningRelease
from renyi_stream.stream.engine.shard_cache import ShardCache, new_token
from renyi_stream.stream.engine.window_buffer import WIDTH, WindowBuffer
from renyi_stream.stream.engine.shard_state import (LEDGER_DELTA, LEDGER_PART, RUNNING_DELTA, RUNNING_PART, QueryPlan, ShardBooks,
                                       ShardSnapshots, ShardState, held_deltas)
from renyi_stream.pipelines.beam.transforms import (
    ReleaseRunning,
    ReleaseWindow,
    RunningEstimates,
    running_release_for,
    add_vectors,
    empty_rows,
    in_event_time_order,
    ledger_shards,
    snapshot_shards,
    TICK,
    PackedRows,
    packed_by_shard,
    unpacked,
)
from renyi_stream.stream.schema import USER_ID, WINDOW_ID, WindowSpec


#: Schema metadata of a ledger snapshot the streaming filter emits (tag ``ledger``): ``full`` (the
#: shard's whole ledger) or ``delta`` (the rows of the users charged in its window,
#: :meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`), and for a delta the window of the
#: full snapshot it goes over (every window between them has a delta): the shard's ledger at a
#: delta's window is that full snapshot with the deltas through it over it, in window order.
SNAPSHOT_KIND, SNAPSHOT_BASE = "renyi_stream.snapshot", "renyi_stream.base_window"
#: Schema metadata of a running query's state files (per-user prepaid rows, release state): its id;
#: and of a release state, its releases ``y`` from its first window through the state's (JSON
#: ``[[window, [y...]], ...]``), which the running-total estimates of later windows are computed from.
RUNNING_QUERY_ID, RUNNING_RAW = "renyi_stream.query_id", "renyi_stream.running_raw"
#: Schema metadata of a release state this version writes instead of :data:`RUNNING_RAW`: the state
#: of the query's estimates' decoder after the state's window (JSON ``{"windows": decoded,
#: "shape": [...], "values": [...]}``, :meth:`renyi_stream.stream.continual.strategies.Strategy.decode_online`): ``1 + buffers``
#: rows of ``d`` numbers for BLT whatever the window, one row for window sums, every release so far
#: only for strategies whose estimate has no finite recurrence (square root, tree).
RUNNING_DECODER = "renyi_stream.running_decoder"
#: Schema metadata of a shard's ledger snapshot when it has running-query state: its prepaid users
#: per running query after the window (JSON ``{query_id: rows}``), so that a job restoring the prepaid
#: rows beside it can tell a lost file (which would restart its users' prepaid charges from nothing)
#: from none.
PREPAID_USERS = "renyi_stream.prepaid_users"
#: Schema metadata of the same snapshot: the rows of the shard's prepaid file of this window per
#: running query (JSON ``{query_id: rows}``): every user's for a full snapshot, the users charged in
#: the window for a delta (:func:`_prepaid_parts`), so that each file of a delta chain is checked.
PREPAID_ROWS = "renyi_stream.prepaid_rows"


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


def _marked(table: pa.Table, extra: dict[str, str]) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **{k.encode(): v.encode()
                                                                             for k, v in extra.items()}})


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

#: Beam counters of the streaming filter's charging firings: a shard restored from its ``STATE``
#: bag (the bag read whole, every part unpickled and the ledger rebuilt) or taken from the cache.
#: One firing per shard and window of the schedule, rows or not: they count firings, never rows.
#: Beam counters are seen by whoever sees the job's page (Dataflow, Flink), so every counter of the
#: streaming job counts messages, files, shards or windows only, never rows or users (docs/architecture.md,
#: "Invariant 4: nothing-pre-noise-leaves"; issue 37): the buffered row parts a window read
#: (``buffered_parts_read``, 2 for a day without rows, 3 with one user's row) was such a count.
RESTORED_FROM_STATE = Metrics.counter("renyi_stream.streaming_filter", "shards_restored_from_state")
TAKEN_FROM_CACHE = Metrics.counter("renyi_stream.streaming_filter", "shards_taken_from_cache")

if WIDTH != 8:  # the filter's methods name one state parameter per bag
    raise RuntimeError(f"StreamingIndividualFilterDoFn declares 8 ring and 8 block bags, the window buffer {WIDTH}")

#: The names of the filter's row-bag parameters, as its ``process`` and ``on_window_end`` take them:
#: the ring (``rows_0..``), the blocks (``block_0..``) and ``later`` of its
#: :class:`renyi_stream.stream.engine.window_buffer.WindowBuffer`, and ``buffered_rows`` (its counts per window).
ROW_BAG_PARAMS = (*(f"rows_{i}" for i in range(WIDTH)), *(f"block_{i}" for i in range(WIDTH)), "later",
                  "buffered_rows")


class StreamingIndividualFilterDoFn(beam.DoFn):
    """The individual filter for one shard of users on an unbounded stream, in the global window.

    Input elements ``(shard, (kind, payload))``: ``("rows", table)`` validated rows (with the
    ``_source``/``_row`` input position), ``("tick", None)`` (one per shard: starts its window
    chain, so a shard without rows still steps through the schedule and never blocks the
    release), and the previous state ``("ledger", table)`` / ``("running", (query_id, table))``.

    State (per shard, global window; never window-scoped, invariant 1):
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
                    :meth:`on_window_end` takes the shard from the worker's cache when the cached
                    copy is the committed state (its token is MARK's), else restores it from STATE
                    (:class:`renyi_stream.stream.engine.shard_state.ShardSnapshots`, as the batch filter),
                    charges exactly that window, writes the shard's snapshot back to STATE with a
                    fresh token in MARK, files the shard in the cache under that token, then
                    re-arms at the next window's end (through ``end_window``). A firing before
                    that end (an extra or repeated firing) does nothing, so each window is
                    charged at most once (invariant 6).
    Cache (:class:`renyi_stream.stream.engine.shard_cache.ShardCache`, this DoFn instance's, never pickled):
      the shards this instance charged, each under the token its firing wrote, at most
      ``cached_shards`` of them (least recently charged evicted first). A shard's firings come
      once per window in turn, a cycle through the worker's shards on which a least-recently-used
      cache smaller than that cycle misses every time; the default bound is therefore the job's
      ``n_shards`` (:class:`StreamingReleases`), so no worker evicts a shard of its own, and the
      memory it holds is at most the decoded ledger of the shards it charges. 0 turns it off
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

    ROWS = tuple(BagStateSpec(f"rows_{i}", PickleCoder()) for i in range(WIDTH))
    BLOCK = tuple(BagStateSpec(f"block_{i}", PickleCoder()) for i in range(WIDTH))
    LATER = BagStateSpec("later", PickleCoder())
    HELD = ReadModifyWriteStateSpec("held", PickleCoder())
    STATE = BagStateSpec("state", PickleCoder())
    CHARGED = ReadModifyWriteStateSpec("charged", PickleCoder())
    BOOKS = ReadModifyWriteStateSpec("books", PickleCoder())
    MARK = ReadModifyWriteStateSpec("mark", PickleCoder())
    WINDOW_END = TimerSpec("window_end", TimeDomain.WATERMARK)

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
        # A job resumed after a crash (renyi_stream.pipelines.streaming.job, "Crash recovery") charged this
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
        # A copy of this DoFn (the runner pickles it to every worker, or per bundle) starts with no
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

    def process(self, element: tuple[int, tuple[str, Any]],
                state: Any = beam.DoFn.StateParam(STATE), charged: Any = beam.DoFn.StateParam(CHARGED),
                books: Any = beam.DoFn.StateParam(BOOKS), mark: Any = beam.DoFn.StateParam(MARK),
                rows_0: Any = beam.DoFn.StateParam(ROWS[0]), rows_1: Any = beam.DoFn.StateParam(ROWS[1]),
                rows_2: Any = beam.DoFn.StateParam(ROWS[2]), rows_3: Any = beam.DoFn.StateParam(ROWS[3]),
                rows_4: Any = beam.DoFn.StateParam(ROWS[4]), rows_5: Any = beam.DoFn.StateParam(ROWS[5]),
                rows_6: Any = beam.DoFn.StateParam(ROWS[6]), rows_7: Any = beam.DoFn.StateParam(ROWS[7]),
                block_0: Any = beam.DoFn.StateParam(BLOCK[0]), block_1: Any = beam.DoFn.StateParam(BLOCK[1]),
                block_2: Any = beam.DoFn.StateParam(BLOCK[2]), block_3: Any = beam.DoFn.StateParam(BLOCK[3]),
                block_4: Any = beam.DoFn.StateParam(BLOCK[4]), block_5: Any = beam.DoFn.StateParam(BLOCK[5]),
                block_6: Any = beam.DoFn.StateParam(BLOCK[6]), block_7: Any = beam.DoFn.StateParam(BLOCK[7]),
                later: Any = beam.DoFn.StateParam(LATER), buffered_rows: Any = beam.DoFn.StateParam(HELD),
                window_end: Any = beam.DoFn.TimerParam(WINDOW_END)) -> Iterator[Any]:
        _, (kind, payload) = element
        through = self._charged(charged)
        if kind == "rows":
            buffer = WindowBuffer(ring=(rows_0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7),
                                  blocks=(block_0, block_1, block_2, block_3, block_4, block_5, block_6, block_7),
                                  later=later, held=buffered_rows)
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
            window_end.set(self._end_of(through + 1))

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
            yield beam.pvalue.TaggedOutput("dead", window_letters(table, classes))
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

    @on_timer(WINDOW_END)
    def on_window_end(self, key: Any = beam.DoFn.KeyParam, timestamp: Any = beam.DoFn.TimestampParam,
                      state: Any = beam.DoFn.StateParam(STATE), charged: Any = beam.DoFn.StateParam(CHARGED),
                      books: Any = beam.DoFn.StateParam(BOOKS), mark: Any = beam.DoFn.StateParam(MARK),
                      rows_0: Any = beam.DoFn.StateParam(ROWS[0]), rows_1: Any = beam.DoFn.StateParam(ROWS[1]),
                      rows_2: Any = beam.DoFn.StateParam(ROWS[2]), rows_3: Any = beam.DoFn.StateParam(ROWS[3]),
                      rows_4: Any = beam.DoFn.StateParam(ROWS[4]), rows_5: Any = beam.DoFn.StateParam(ROWS[5]),
                      rows_6: Any = beam.DoFn.StateParam(ROWS[6]), rows_7: Any = beam.DoFn.StateParam(ROWS[7]),
                      block_0: Any = beam.DoFn.StateParam(BLOCK[0]), block_1: Any = beam.DoFn.StateParam(BLOCK[1]),
                      block_2: Any = beam.DoFn.StateParam(BLOCK[2]), block_3: Any = beam.DoFn.StateParam(BLOCK[3]),
                      block_4: Any = beam.DoFn.StateParam(BLOCK[4]), block_5: Any = beam.DoFn.StateParam(BLOCK[5]),
                      block_6: Any = beam.DoFn.StateParam(BLOCK[6]), block_7: Any = beam.DoFn.StateParam(BLOCK[7]),
                      later: Any = beam.DoFn.StateParam(LATER), buffered_rows: Any = beam.DoFn.StateParam(HELD),
                      window_end: Any = beam.DoFn.TimerParam(WINDOW_END)) -> Iterator[Any]:
        through = self._charged(charged)
        window = through + 1
        if window > self._end or timestamp < self._end_of(window):
            return  # an extra firing: this window's end is not reached, or everything is charged
        buffer = WindowBuffer(ring=(rows_0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7),
                              blocks=(block_0, block_1, block_2, block_3, block_4, block_5, block_6, block_7),
                              later=later, held=buffered_rows)
        # This window's own bag only (renyi_stream.stream.engine.window_buffer): never the rows of later windows.
        mine = unpacked(buffer.take(window)[0])
        # The cached shard only if it is exactly the committed state: its token is the one committed
        # with STATE's last change (renyi_stream.stream.engine.shard_cache). Else restore from STATE, whole.
        committed = mark.read()
        shard = self.shard_cache().take(key, committed.token if committed is not None else None)
        if shard is not None:
            deltas = committed.deltas
            TAKEN_FROM_CACHE.inc()
        else:
            held = list(state.read())
            shard, deltas = self._shards.restore(held), held_deltas(held)
            RESTORED_FROM_STATE.inc()
        data, duplicates = in_event_time_order(mine)  # exactly as the batch path
        if duplicates is not None and duplicates.num_rows and not self._window_records:
            yield beam.pvalue.TaggedOutput("dead", duplicates)
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
            yield beam.pvalue.TaggedOutput("prepaid", (key, window, parts))
            ledger = _marked(ledger, {
                PREPAID_USERS: json.dumps({q: len(prepaid) for q, prepaid in shard.running.items()}, sort_keys=True),
                PREPAID_ROWS: json.dumps({q: t.num_rows for q, t in parts}, sort_keys=True)})
        if self._snapshot_every_window or window == self._end:
            yield beam.pvalue.TaggedOutput("ledger", (key, window, ledger))
        if window == self._end:
            for kind, payload in snapshot:
                if kind == RUNNING_PART:
                    yield beam.pvalue.TaggedOutput("running", payload)
        else:
            window_end.set(self._end_of(window + 1))
            # Filed last, after every state write of this firing and under the token written with
            # them: a firing that stops before this leaves no shard in the cache. After the last
            # window the shard fires no more and is not kept.
            self.shard_cache().put(key, token, shard)
        if self._progress:  # public: the shard, the window and a monotonic clock (invariant 4: no count)
            print(f"[streaming] shard {int(key)} charged window {window} at {time.monotonic():.3f}", file=sys.stderr,
                  flush=True)

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
                yield beam.pvalue.TaggedOutput("counts", (window, result.counts))
        # One report per (shard, window), rows or not, partial sums inside: the release knows the
        # window is complete when every shard's report is in, whatever order elements travel in.
        yield window, (int(key), sums)
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
            yield beam.pvalue.TaggedOutput("books", (window, record, duplicates))
        else:
            yield beam.pvalue.TaggedOutput("books", (window, record))


class ReleaseCompletedWindow(beam.DoFn):
    """Keyed by window id: the window's release once every shard has charged it.

    Input ``(window_id, (shard, {query_id: partial sum}))``: every shard sends exactly one per
    window of the schedule, rows or not, when the watermark passes the window's end (its
    chained timer). When all ``n_shards`` have reported, the window is complete: release every
    active query through :class:`renyi_stream.pipelines.beam.transforms.ReleaseWindow` (sum of partials, 0 when
    none, plus noise keyed by (query, window)), so every scheduled window is released
    (invariant 3), once (invariant 5: a RELEASED flag ignores any later or repeated report).

    Completion is counted, not read off the watermark: runners differ in whether a stateful
    DoFn's pending timers hold its output watermark (the Python DirectRunner's do not), and a
    release timer racing the shards' last partial sums would release a window without them.
    State: SHARDS (bag of reports), RELEASED (flag). Outputs window queries' release rows (main)
    and, for each running query active in the window, ``(query_id, (window, a_t))`` (tag
    ``running_sums``: the sum of every shard's admitted contributions, pre-noise, for
    :class:`ReleaseRunningInOrder`; ``a_t`` is ``None`` when no shard admitted any).
    """

    SHARDS = BagStateSpec("shards", PickleCoder())
    RELEASED = ReadModifyWriteStateSpec("released", PickleCoder())

    def __init__(self, release: ReleaseWindow, n_shards: int, plan: QueryPlan | None = None) -> None:
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1, got n_shards={n_shards}")
        self._release = release
        self._n_shards = int(n_shards)
        self._plan = plan

    def setup(self) -> None:
        self._release.setup()

    def process(self, element: tuple[int, tuple[int, dict[str, Any]]], shards: Any = beam.DoFn.StateParam(SHARDS),
                released: Any = beam.DoFn.StateParam(RELEASED)) -> Iterator[Any]:
        window, report = element
        if released.read():
            return  # released already: a repeated report must not make a second answer
        reports = {shard: sums for shard, sums in shards.read()}
        shard, sums = report
        if shard in reports:
            return  # a repeated report of a shard (e.g. a retried bundle): already counted
        reports[shard] = sums
        if len(reports) < self._n_shards:
            shards.add(report)
            return
        by_query: dict[str, list[np.ndarray]] = {}
        for _, shard_sums in sorted(reports.items()):
            for query_id, partial in shard_sums.items():
                by_query.setdefault(query_id, []).append(np.asarray(partial, dtype=np.float64))
        totals = {(query_id, int(window)): add_vectors(parts) for query_id, parts in by_query.items()}
        released.write(True)
        shards.clear()
        yield from self._release.process(int(window), totals)
        for entry in self._plan.active(int(window)) if self._plan is not None else ():
            if entry.kind == "running":
                a = totals.get((entry.query_id, int(window)))
                yield beam.pvalue.TaggedOutput("running_sums", (entry.query_id, (int(window), a)))


def running_state_table(release: RunningRelease, decoder: np.ndarray) -> pa.Table:
    """A running query's state after a window, as the streaming job commits it with the window:
    :meth:`RunningRelease.to_arrow` with the query's id (:data:`RUNNING_QUERY_ID`) and the state of
    its estimates' decoder after the window, with the number of windows it has decoded
    (:data:`RUNNING_DECODER`), in the schema metadata."""
    table = release.to_arrow()
    decoder = np.asarray(decoder, dtype=np.float64)
    extra = {RUNNING_QUERY_ID: release.query_id,
             RUNNING_DECODER: json.dumps({"windows": release.next_window - release.start_window,
                                          "shape": list(decoder.shape), "values": decoder.ravel().tolist()})}
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          **{k.encode(): v.encode() for k, v in extra.items()}})


@dataclass(frozen=True, eq=False)
class EstimateContinuation:
    """Where a running query's estimates continue from after a committed window: the decoder's
    state then and the number of windows it has decoded
    (:meth:`renyi_stream.stream.continual.strategies.Strategy.decode_online`; what this version
    commits), or, in a state file an earlier version wrote, the releases ``y`` from the query's
    first window through that window, folded into it when first used."""

    decoder: np.ndarray | None = None
    windows: int | None = None
    releases: tuple[tuple[int, tuple[float, ...]], ...] = ()

    def check(self, start_window: int, next_window: int) -> None:
        """ValueError unless this continues a query first released at ``start_window`` whose next
        window is ``next_window`` (its release state's): a decoder of as many windows, finite, or
        recorded releases of exactly those windows. The decoder's shape is checked against the
        query's strategy when it is used."""
        expected = int(next_window) - int(start_window)
        if self.decoder is not None:
            if self.windows != expected:
                raise ValueError(f"the estimates' decoder state has decoded {self.windows} window(s), its release "
                                 f"state {expected} (windows {int(start_window)} to {int(next_window) - 1})")
            if not np.isfinite(self.decoder).all():
                raise ValueError("the estimates' decoder state has non-finite values")
            return
        windows = [w for w, _ in self.releases]
        if windows != list(range(int(start_window), int(next_window))):
            raise ValueError(f"the recorded releases are for windows {windows[:5]}..., not every window from the "
                             f"query's first window {int(start_window)} to {int(next_window) - 1}")

    def state(self, running: RunningQuery, next_window: int) -> np.ndarray | None:
        """The decoder's state for ``running`` before ``next_window`` (its release state's next
        window), checked (:meth:`check`; ValueError naming the query)."""
        try:
            self.check(running.start_window, next_window)
        except ValueError as exc:
            raise ValueError(f"running query {running.query_id!r}: {exc}") from None
        if self.decoder is not None:
            return self.decoder
        series = [np.asarray(y, dtype=np.float64).reshape(running.rows_at(w), running.dim) for w, y in self.releases]
        return running.strategy.decoder_state(series)


def running_state_of(table: pa.Table) -> tuple[str, pa.Table, EstimateContinuation]:
    """:func:`running_state_table` back: ``(query_id, release state table, where its estimates
    continue from)``; a file an earlier version wrote records the releases ``y`` instead
    (:data:`RUNNING_RAW`). The release state is checked when it is restored
    (:meth:`RunningRelease.from_arrow`), the continuation against it by
    :meth:`EstimateContinuation.check`."""
    meta = dict(table.schema.metadata or {})
    try:
        query_id = meta.pop(RUNNING_QUERY_ID.encode()).decode()
        if RUNNING_DECODER.encode() in meta:
            recorded = json.loads(meta.pop(RUNNING_DECODER.encode()))
            decoder = np.asarray(recorded["values"], dtype=np.float64).reshape([int(n) for n in recorded["shape"]])
            continuation = EstimateContinuation(decoder=decoder, windows=int(recorded["windows"]))
        else:
            raw = json.loads(meta.pop(RUNNING_RAW.encode()))
            continuation = EstimateContinuation(releases=tuple((int(w), tuple(float(v) for v in y)) for w, y in raw))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"a running-state file's metadata is incomplete or malformed: {exc!r}") from None
    return query_id, table.replace_schema_metadata(meta), continuation


class ReleaseRunningInOrder(beam.DoFn):
    """Keyed by running query id: its releases, window by window, in window order.

    Input ``(query_id, (window, a_t))`` from :class:`ReleaseCompletedWindow` (tag
    ``running_sums``), one per window of the schedule the query is active in, in any order. The
    query's :class:`renyi_stream.stream.engine.running.RunningRelease` (restored from ``previous_release`` or
    new at its first window, :func:`renyi_stream.pipelines.beam.transforms.running_release_for`, which refuses
    another strategy's state) releases its next window as soon as that window's ``a_t`` is in:
    ``y_t = (C a)_t + z_t`` (:meth:`renyi_stream.pipelines.beam.transforms.ReleaseRunning.release_window`, the
    keyed noise), so windows are released once each, in order, rows or not (invariants 3 and 5).
    Outputs the running-total release rows (main: the estimate ``(B y)_t`` decoded online,
    :meth:`renyi_stream.stream.continual.running.RunningQuery.estimate_online`, from the decoder's
    state after the window before, which ``previous_estimates`` gives for a query earlier jobs
    released: bit for bit the batch decode of the series through the window), ``(query_id, window, y flat)`` (tag
    ``raw``) and ``(window, state table)`` (tag ``release_state``, :func:`running_state_table`: the
    release and decoder states after the window, to be committed with it). State: RELEASE
    (``(release state table, decoder state)`` after the last released window: ``O(buffers x d)``
    numbers for BLT, never the series so far), PENDING (``(window, a_t)`` that came before their
    turn). A repeated window does nothing."""

    RELEASE = ReadModifyWriteStateSpec("release", PickleCoder())
    PENDING = BagStateSpec("pending", PickleCoder())

    def __init__(self, release: ReleaseRunning, estimates: RunningEstimates, plan: QueryPlan, *,
                 previous_release: dict[str, pa.Table] | None = None,
                 previous_estimates: dict[str, EstimateContinuation] | None = None) -> None:
        self._release = release
        self._estimates = estimates
        self._plan = plan
        self._previous_release = dict(previous_release or {})
        self._previous_estimates = dict(previous_estimates or {})

    def setup(self) -> None:
        self._release.setup()

    def process(self, element: tuple[str, tuple[int, Any]], kept: Any = beam.DoFn.StateParam(RELEASE),
                pending: Any = beam.DoFn.StateParam(PENDING)) -> Iterator[Any]:
        query_id, (window, a) = element
        held = kept.read()
        running = self._estimates.running_query(query_id)
        if held is None:
            release = running_release_for(self._plan.get(query_id), self._previous_release.get(query_id))
            continued = self._previous_estimates.get(query_id)
            decoder = continued.state(running, release.next_window) if continued is not None else None
        else:
            release, decoder = RunningRelease.from_arrow(held[0]), held[1]
        waiting = {int(w): value for w, value in pending.read()}
        if int(window) < release.next_window or int(window) in waiting:
            return  # released already, or waiting already: a repeated report (invariant 5)
        waiting[int(window)] = a
        released = False
        while release.next_window in waiting:
            w = release.next_window
            y = self._release.release_window(release, w, waiting.pop(w))
            estimate, decoder = running.estimate_online(w, decoder, y)
            released = True
            yield beam.pvalue.TaggedOutput("raw", (query_id, w, y.ravel().tolist()))
            yield beam.pvalue.TaggedOutput("release_state", (w, running_state_table(release, decoder)))
            yield from self._estimates.rows(query_id, w, estimate)
        pending.clear()
        for w, value in sorted(waiting.items()):
            pending.add((w, value))
        if released:
            kept.write((release.to_arrow(), decoder))


def _same(item: Any) -> Any:
    return item


class StreamingReleases(beam.PTransform):
    """Validated tables (unbounded) -> releases as the watermark passes each window's end.

    Input: Arrow tables of validated rows with their input position (as
    :class:`renyi_stream.pipelines.beam.transforms.ReadIndicators` emits them), timestamped at or before their
    rows' event times so that the watermark means "this window's rows are in". The schedule is
    ``start_window..end_window``; every window of it is released for every query active in it
    (invariant 3), running queries as running totals too. ``previous_ledger`` /
    ``previous_running`` (per-user prepaid rows) / ``previous_release`` (release states) /
    ``previous_estimates`` (where each running query's estimates continue from,
    :class:`EstimateContinuation`) are the state to continue from, ``released`` the
    windows released before (their rows are late). ``resumed_through``: this schedule's windows
    through it were charged by the job this one resumes (its state is then that window's), so its
    shards start after it and rows of those windows, re-delivered, are neither charged nor counted
    again. ``window_records``: a shard's duplicates of a window travel in its ``books`` element,
    ``(window, record, duplicates or None)``, rather than as dead letters, so that a job writes a
    window's records together. ``compact_every`` (K): a shard's state and its ``ledger`` snapshots are
    a full snapshot every K windows and, between, deltas of the users charged in each window
    (:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`; the first and last windows are
    full); 1 (the default): whole every window. ``ledger_id`` is the ledger's identifier
    (:func:`renyi_stream.stream.noise.new_ledger_id`), which the keyed noise is bound to. ``cached_shards``: how
    many restored shards a filter instance keeps between windows (:class:`StreamingIndividualFilterDoFn`,
    "Cache"); default ``n_shards``, 0 restores every shard from its keyed state every window.
    ``progress``: each shard prints a line on stderr as it charges a window (the job's ``--progress``).

    Returns a dict: ``releases`` (release rows), ``raw`` (running queries' releases ``y``),
    ``release_state`` (``(window, state table)`` per running query and window,
    :class:`ReleaseRunningInOrder`), ``prepaid`` (``(shard, window, [(query_id, prepaid rows)])``
    per charged window, when the plan or the restored state has running queries),
    ``ledger`` (``(shard, window, snapshot)``), ``running``, ``counts``, ``books`` (the shards'
    row books per charged window), ``dead`` (late,
    out-of-range and duplicate rows) and ``sums`` (the shards' reports ``(window, (shard,
    {query: partial}))``, curator only: pre-noise, invariant 4).
    """

    def __init__(self, *, window: WindowSpec, start_window: int, end_window: int, plan: QueryPlan,
                 indicator_columns: Sequence[str], noise_std: float, policy: str, budget: float, id_type: str,
                 tracker_step: float, n_shards: int, key_path: str, accounting: str, key_fingerprint: str,
                 ledger_id: str, previous_ledger: pa.Table | None = None,
                 previous_running: dict[str, pa.Table] | None = None,
                 released: Sequence[int] = (), snapshot_every_window: bool = False,
                 previous_estimates: dict[str, EstimateContinuation] | None = None,
                 resumed_through: int | None = None, window_records: bool = False, compact_every: int = 1,
                 cached_shards: int | None = None, previous_release: dict[str, pa.Table] | None = None,
                 progress: bool = False) -> None:
        super().__init__()
        self._n_shards = n_shards
        self._previous = previous_ledger
        self._running = dict(previous_running or {})
        meta = {q: {k.decode(): v.decode() for k, v in t.schema.metadata.items()} for q, t in self._running.items()}
        self._filter = StreamingIndividualFilterDoFn(
            plan=plan, window=window, start_window=start_window, end_window=end_window,
            indicator_columns=indicator_columns, noise_std=noise_std, policy=policy, budget=budget, id_type=id_type,
            tracker_step=tracker_step, released=released, running_meta=meta,
            snapshot_every_window=snapshot_every_window, resumed_through=resumed_through,
            window_records=window_records, compact_every=compact_every,
            cached_shards=n_shards if cached_shards is None else cached_shards,
            prepaid_every_window=bool(plan.running or meta), progress=progress)
        self._release = ReleaseCompletedWindow(
            ReleaseWindow(key_path=key_path, plan=plan, noise_std=noise_std, window=window, accounting=accounting,
                          key_fingerprint=key_fingerprint, ledger_id=ledger_id), n_shards, plan)
        self._running_release = ReleaseRunningInOrder(
            ReleaseRunning(key_path=key_path, plan=plan, noise_std=noise_std, schedule=(),
                           key_fingerprint=key_fingerprint, ledger_id=ledger_id),
            RunningEstimates(plan=plan, noise_std=noise_std, window=window, accounting=accounting,
                             key_fingerprint=key_fingerprint), plan,
            previous_release=previous_release, previous_estimates=previous_estimates)

    def expand(self, valid: Any) -> dict[str, Any]:
        keyed = valid | "ByShard" >> beam.FlatMap(packed_by_shard, self._n_shards)
        initial: list[tuple[int, tuple[str, Any]]] = [(shard, (TICK, None)) for shard in range(self._n_shards)]
        if self._previous is not None:
            initial += list(ledger_shards(self._previous, self._n_shards))
        for query_id, table in sorted(self._running.items()):
            initial += [(shard, ("running", (query_id, part)))
                        for shard, (_, part) in snapshot_shards(table, self._n_shards)]
        shards = valid.pipeline | "ShardTicks" >> beam.Create(initial)
        filtered = ((keyed, shards) | "MergeShards" >> beam.Flatten().with_output_types(Tuple[int, Any])
                    | "StreamingFilter" >> beam.ParDo(self._filter).with_output_types(Tuple[int, Any])
                    .with_outputs("ledger", "running", "prepaid", "counts", "books", "dead", main="sums"))
        released = (filtered.sums
                    | "ReleaseCompletedWindow" >> beam.ParDo(self._release)
                    .with_outputs("running_sums", main="releases"))
        running = (released.running_sums
                   | "RunningSumsByQuery" >> beam.Map(_same).with_output_types(Tuple[str, Any])  # a deterministic key coder
                   | "ReleaseRunning" >> beam.ParDo(self._running_release).with_outputs("raw", "release_state",
                                                                                         main="releases"))
        releases = (released.releases, running.releases) | "AllReleases" >> beam.Flatten()
        return {"releases": releases, "raw": running.raw, "release_state": running.release_state,
                "prepaid": filtered.prepaid, "ledger": filtered.ledger,
                "running": filtered.running, "counts": filtered.counts, "books": filtered.books,
                "dead": filtered.dead, "sums": filtered.sums}
