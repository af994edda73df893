"""The individual filter and its releases on an unbounded stream, window by window on the watermark.

The batch path (:class:`renyi_stream.pipelines.beam.transforms.IndividualFilterDoFn`) charges a whole run on one
timer at the end of the global window. Here the same per-window work runs as the watermark
passes each window's end, so a long-running pipeline releases every day as it closes:

* :class:`StreamingIndividualFilterDoFn` (the runner-independent
  :class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter` in Beam's keyed state and timers),
  keyed by user shard **in the global window**: the
  shard's ledger lives in keyed state for the life of the stream and is never cleared between
  windows: invariant 1 (ledger-never-window-scoped, docs/architecture.md). Rows are buffered per
  window; on the event-time timer at the window's end the window's rows are charged in
  event-time order, ties by input position, with duplicates of a (user, window) dead-lettered by
  the batch rule (invariant 2), through the same
  :meth:`renyi_stream.stream.engine.shard_state.ShardState.charge_window`. A row for a window the shard has
  already charged is dead-lettered ``late_window`` and charges nobody (invariants 5-7).
* :class:`ReleaseCompletedWindow`, keyed by window: every shard reports once per window of the
  public schedule, rows or not, with its partial sums inside; when all shards have reported, it
  releases every active query through :class:`renyi_stream.pipelines.beam.release_steps.WindowQueryReleases` (the same
  keyed noise: invariants 3, 5), once.
* :class:`ReleaseRunningInOrder`, keyed by running query: the query's release state
  (:class:`renyi_stream.stream.engine.running.RunningRelease`, the batch jobs' object) advanced once per window
  of the schedule, in window order, rows or not, from each completed window's ``a_t``: ``y_t =
  (C a)_t + z_t`` with the keyed noise (:meth:`renyi_stream.pipelines.beam.release_steps.RunningQueryReleases.release_window`),
  then the window's running-total estimate decoded online
  (:meth:`renyi_stream.stream.continual.running.RunningQuery.estimate_online`, rows by
  :class:`renyi_stream.pipelines.beam.release_steps.RunningTotalRows`), and the state after the window (the
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

from typing import Any, Iterator, Sequence, Tuple

import apache_beam as beam
import pyarrow as pa
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer

from renyi_stream.pipelines.beam.release_steps import RunningQueryReleases, RunningTotalRows, WindowQueryReleases
from renyi_stream.pipelines.beam.rows import packed_by_shard
from renyi_stream.pipelines.streaming.running_state import EstimateContinuation
from renyi_stream.pipelines.streaming.shard_filter import RESTORED, ShardFilter
from renyi_stream.pipelines.streaming.window_releases import (CompletedWindowRelease, RunningReleaseInOrder,
                                                              shard_ticks)
from renyi_stream.stream.engine.shard_state import QueryPlan
from renyi_stream.stream.engine.window_buffer import WIDTH, WindowBuffer
from renyi_stream.stream.schema import WindowSpec


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


class StreamingIndividualFilterDoFn(ShardFilter, beam.DoFn):
    """The streaming individual filter of one shard
    (:class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter`, which says what it keeps and
    does) in Beam: keyed by shard in the global window, its state in the keyed state below, its
    timer ``WINDOW_END`` an event-time timer, its firings counted on Beam counters
    (:data:`RESTORED_FROM_STATE`, :data:`TAKEN_FROM_CACHE`). Outputs: the reports (main) and the
    tags ``ledger``, ``running``, ``prepaid``, ``counts``, ``books`` and ``dead``."""

    ROWS = tuple(BagStateSpec(f"rows_{i}", PickleCoder()) for i in range(WIDTH))
    BLOCK = tuple(BagStateSpec(f"block_{i}", PickleCoder()) for i in range(WIDTH))
    LATER = BagStateSpec("later", PickleCoder())
    HELD = ReadModifyWriteStateSpec("held", PickleCoder())
    STATE = BagStateSpec("state", PickleCoder())
    CHARGED = ReadModifyWriteStateSpec("charged", PickleCoder())
    BOOKS = ReadModifyWriteStateSpec("books", PickleCoder())
    MARK = ReadModifyWriteStateSpec("mark", PickleCoder())
    WINDOW_END = TimerSpec("window_end", TimeDomain.WATERMARK)


    def counted(self, name: str) -> None:
        (RESTORED_FROM_STATE if name == RESTORED else TAKEN_FROM_CACHE).inc()

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
        buffer = WindowBuffer(ring=(rows_0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7),
                              blocks=(block_0, block_1, block_2, block_3, block_4, block_5, block_6, block_7),
                              later=later, held=buffered_rows)
        yield from _emitted(self.receive(element, buffer=buffer, state=state, charged=charged, books=books, mark=mark,
                                         timer=window_end))

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
        buffer = WindowBuffer(ring=(rows_0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7),
                              blocks=(block_0, block_1, block_2, block_3, block_4, block_5, block_6, block_7),
                              later=later, held=buffered_rows)
        yield from _emitted(self.window_end(key, timestamp, buffer=buffer, state=state, charged=charged, books=books,
                                            mark=mark, timer=window_end))


def _emitted(outputs: Iterator[tuple[str | None, Any]]) -> Iterator[Any]:
    """A shared step's ``(tag, value)`` outputs as Beam's: the main output (tag None) as it is, any
    other tagged."""
    for tag, value in outputs:
        yield value if tag is None else beam.pvalue.TaggedOutput(tag, value)


class ReleaseCompletedWindow(CompletedWindowRelease, beam.DoFn):
    """:class:`renyi_stream.pipelines.streaming.window_releases.CompletedWindowRelease` in Beam's keyed
    state: SHARDS (the shards' reports), RELEASED (a flag). Outputs release rows (main) and the tag
    ``running_sums``."""

    SHARDS = BagStateSpec("shards", PickleCoder())
    RELEASED = ReadModifyWriteStateSpec("released", PickleCoder())

    def process(self, element: tuple[int, tuple[int, dict[str, Any]]], shards: Any = beam.DoFn.StateParam(SHARDS),
                released: Any = beam.DoFn.StateParam(RELEASED)) -> Iterator[Any]:
        yield from _emitted(super().process(element, shards=shards, released=released))


class ReleaseRunningInOrder(RunningReleaseInOrder, beam.DoFn):
    """:class:`renyi_stream.pipelines.streaming.window_releases.RunningReleaseInOrder` in Beam's keyed
    state: RELEASE (the release and decoder states after the last released window), PENDING (windows'
    sums that came before their turn). Outputs release rows (main) and the tags ``raw`` and
    ``release_state``."""

    RELEASE = ReadModifyWriteStateSpec("release", PickleCoder())
    PENDING = BagStateSpec("pending", PickleCoder())

    def process(self, element: tuple[str, tuple[int, Any]], kept: Any = beam.DoFn.StateParam(RELEASE),
                pending: Any = beam.DoFn.StateParam(PENDING)) -> Iterator[Any]:
        yield from _emitted(super().process(element, kept=kept, pending=pending))


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
    :class:`renyi_stream.pipelines.streaming.running_state.EstimateContinuation`) are the state to
    continue from, ``released`` the windows released before (their rows are late). ``resumed_through``: this schedule's windows
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
            WindowQueryReleases(key_path=key_path, plan=plan, noise_std=noise_std, window=window, accounting=accounting,
                          key_fingerprint=key_fingerprint, ledger_id=ledger_id), n_shards, plan)
        self._running_release = ReleaseRunningInOrder(
            RunningQueryReleases(key_path=key_path, plan=plan, noise_std=noise_std, schedule=(),
                           key_fingerprint=key_fingerprint, ledger_id=ledger_id),
            RunningTotalRows(plan=plan, noise_std=noise_std, window=window, accounting=accounting,
                             key_fingerprint=key_fingerprint), plan,
            previous_release=previous_release, previous_estimates=previous_estimates)

    def expand(self, valid: Any) -> dict[str, Any]:
        keyed = valid | "ByShard" >> beam.FlatMap(packed_by_shard, self._n_shards)
        shards = valid.pipeline | "ShardTicks" >> beam.Create(shard_ticks(self._n_shards, self._previous,
                                                                          self._running))
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
