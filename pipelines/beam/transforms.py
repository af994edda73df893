"""Beam transforms of the daily job: read and validate, filter per shard, sum, noise.

* :class:`ReadAndValidate`: one input file -> Arrow batches validated by ``renyi_stream.stream.schema``;
  rows of windows already charged (``late_window``) or outside the schedule
  (``out_of_range_time``) are dead-lettered by the engine's one rule,
  :func:`renyi_stream.stream.engine.dead_letters.classify_windows` (invariant 7).
* :class:`IndividualFilterDoFn`: the stateful filter, keyed by user shard **in the global
  window** (invariant 1: a window-scoped ledger would reset budgets daily). It buffers the
  shard's rows in bag state and, on a watermark timer, charges them window by window in
  event-time order (invariant 2), whatever order they arrived in.
* :class:`ReleaseWindow`: every window of the public schedule gets a release for every query,
  with or without rows (invariant 3), noise keyed by (query, window) (invariant 5).

Composite transforms wire them together, for use from any Beam pipeline:
:class:`ReadIndicators` -> :class:`IndividualFilter` -> :class:`ReleaseWindows`, all three in
:class:`DailyReleases`, which the daily job runs; it writes nothing public: the daily job
publishes after its ledger commit (stream/engine/publication.py). :class:`WriteReleaseParquet`
writes release files where a job's outbox puts them (the distributed job's staging).

Elements are Arrow tables (one per batch and shard), not rows: the per-row Python work of
classic Beam DP pipelines is what this design avoids. The rows on the charge path (packed for the
shuffle, split by shard, put in event-time order) are :mod:`renyi_stream.pipelines.beam.rows`,
which imports no Beam.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow

from renyi_stream.pipelines.beam.release_steps import (RunningQueryReleases, RunningTotalRows, WindowQueryReleases,
                                                       add_vectors)
from renyi_stream.pipelines.beam.rows import (TICK, empty_rows, in_event_time_order, ledger_shards, packed_by_shard,
                                              snapshot_shards, unpacked, valid_mask)
from renyi_stream.stream.engine.dead_letters import (
    classify_windows,
    malformed_letters,
    rejected_letters,
    window_letters,
    with_input_position,
)
from renyi_stream.stream.engine.readers import MalformedLines, read_batches
from renyi_stream.stream.engine.shard_state import QueryPlan, ShardSnapshots, ShardState
from renyi_stream.stream.faults import crash_point
from renyi_stream.stream.schema import DEFAULT_KEYS, WINDOW_ID, InputKeys, WindowSpec, validate_batch


def query_id_for(column: str) -> str:
    """The query id of the default per-column daily sum."""
    return f"sum:{column}"


class ReadAndValidate(beam.DoFn):
    """(file index, path) -> valid tables (main), dead letters and rows-read counts (tagged).

    Files are read in batches of ``batch_rows`` rows (default 262,144: about 2 MB per numeric
    column, so memory stays bounded on any file). Each batch has a fixed cost on its way through
    validation, the shard split, the shuffle and the filter's state, so batches much smaller
    than a day's file cost real time: 65,536-row batches made a 3M-row run of 100k-row day files
    0.35 s slower (gathering a bundle's parts per shard before the shuffle saved nothing, so the
    cost is not the number of tables in the shuffle).
    """

    def __init__(self, *, window: WindowSpec, start_window: int, end_window: int,
                 released: Sequence[int], indicator_columns: Sequence[str], batch_rows: int = 262_144,
                 category_columns: Sequence[str] = (), id_type: str | None = None,
                 file_windows: Mapping[str, Tuple[int, int]] | None = None, keys: InputKeys = DEFAULT_KEYS) -> None:
        self._window = window
        # The ledger's contract's names of the id and time columns: each file is read and its rows
        # validated by them (its dead letters name them), its valid rows carry user_id and window_id.
        self._keys = keys
        # path -> the windows of the days the file holds (renyi_stream.stream.engine.input_days):
        # a row of another window is its dead letter; None: the file's days are not checked.
        self._file_windows = dict(file_windows or {})
        self._id_type = id_type  # the ledger's: every valid row's id is parsed as it
        self._start, self._end = start_window, end_window
        self._released = np.array(sorted(released), dtype=np.int64)
        self._columns = list(indicator_columns)
        self._categories = list(category_columns)
        self._batch_rows = batch_rows

    def process(self, element: tuple[int, str]) -> Iterator[Any]:
        file_index, path = element
        offset = 0
        malformed = MalformedLines()
        for batch in read_batches(path, batch_rows=self._batch_rows, malformed=malformed, keys=self._keys):
            if len(malformed):  # CSV lines the reader skipped so far: rows read, each a dead letter
                lines = malformed.drain()
                yield beam.pvalue.TaggedOutput("read", (path, lines.num_rows))
                yield beam.pvalue.TaggedOutput("dead", malformed_letters(path, lines))
            yield beam.pvalue.TaggedOutput("read", (path, batch.num_rows))
            # No window bounds here: which rows are late or out of schedule is the engine's one
            # rule, the same in the streaming filter.
            checked = validate_batch(batch, window=self._window, indicator_columns=self._columns,
                                     category_columns=self._categories, id_type=self._id_type, keys=self._keys)
            if checked.rejected.num_rows:
                yield beam.pvalue.TaggedOutput("dead", rejected_letters(path, checked.rejected, offset=offset))
            # The input's index orders its rows against other inputs' (invariant 2); its path names
            # them in any dead letter, whichever step writes it.
            valid = with_input_position(checked.valid, source=file_index, name=path,
                                        row_index=np.flatnonzero(valid_mask(batch.num_rows, checked.rejected)) + offset)
            classes = classify_windows(valid.column(WINDOW_ID), start_window=self._start, end_window=self._end,
                                       charged=self._released, file_windows=self._file_windows.get(path))
            if not classes.all_kept:
                yield beam.pvalue.TaggedOutput("dead", window_letters(valid, classes))
                valid = valid.filter(pa.array(classes.keep))
            if valid.num_rows:
                yield valid
            offset += batch.num_rows
            crash_point("while_reading")  # test-only: input read, nothing committed
        if len(malformed):  # noted after the last batch (a too-long last line without its newline)
            lines = malformed.drain()
            yield beam.pvalue.TaggedOutput("read", (path, lines.num_rows))
            yield beam.pvalue.TaggedOutput("dead", malformed_letters(path, lines))


class IndividualFilterDoFn(beam.DoFn):
    """The individual filter for one shard of users, in the global window.

    State (per shard key, global window):
      ROWS   -- bag of Arrow tables: this run's valid rows for the shard, in arrival order.
      LEDGER -- bag of the shard's snapshot parts from the previous run: ``("ledger", table)``
                (zero or one) and ``("running", (query_id, table))`` per running query, as
                :class:`renyi_stream.stream.engine.shard_state.ShardSnapshots` restores them.
    An element ``(TICK, None)`` is kept nowhere: it only makes its shard's timer fire.
    Timer:
      FLUSH  -- event-time timer at the end of the global window; its callback
                :meth:`on_end_of_input` runs once all input has been read (batch): it restores
                the shard, charges the buffered rows window by window, in window order, through
                :meth:`renyi_stream.stream.engine.shard_state.ShardState.charge_window` (every active query of
                a window charged together, running queries stepped through every window) and
                emits the shard's snapshot.
    Outputs: ``((query_id, window_id), partial sum vector)`` (main), the shard's new ledger
    snapshot (tag ``ledger``), ``(query_id, running-state snapshot)`` (tag ``running``),
    per-window row counts (tag ``counts``) and duplicate rows (tag ``dead``).
    """

    ROWS = BagStateSpec("rows", PickleCoder())
    LEDGER = BagStateSpec("ledger", PickleCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def __init__(self, *, plan: QueryPlan, indicator_columns: Sequence[str], noise_std: float, policy: str,
                 budget: float, id_type: str, tracker_step: float, last_window: int | None = None,
                 running_meta: dict[str, dict[str, str]] | None = None) -> None:
        self._plan = plan
        self._columns = list(indicator_columns)
        self._noise_std = noise_std
        self._policy = policy
        self._id_type = id_type
        self._last_window = last_window
        self._shards = ShardSnapshots(plan=plan, budget=budget, id_type=id_type, tracker_step=tracker_step,
                                      running_meta=dict(running_meta or {}))

    def process(self, element: tuple[int, tuple[str, Any]],
                rows: Any = beam.DoFn.StateParam(ROWS), ledger: Any = beam.DoFn.StateParam(LEDGER),
                flush: Any = beam.DoFn.TimerParam(FLUSH)) -> Iterator[Any]:
        # Outputs nothing (the timer does), but returns an iterable: Beam 2.78 refuses a DoFn whose
        # process is annotated as returning None ("Return value not iterable").
        _, (kind, payload) = element
        if kind == "rows":
            rows.add(payload)
        elif kind != TICK:
            ledger.add((kind, payload))
        flush.set(GlobalWindow().max_timestamp())
        return iter(())

    @on_timer(FLUSH)
    def on_end_of_input(self, key: Any = beam.DoFn.KeyParam, rows: Any = beam.DoFn.StateParam(ROWS),
                        ledger: Any = beam.DoFn.StateParam(LEDGER)) -> Iterator[Any]:
        state = self._shards.restore(ledger.read())
        data, duplicates = in_event_time_order(unpacked(rows.read()))
        if duplicates is not None and duplicates.num_rows:
            yield beam.pvalue.TaggedOutput("dead", duplicates)
        yield from self._charge_windows(state, data)
        for kind, payload in self._shards.snapshot(state):  # tags "ledger" and "running"
            yield beam.pvalue.TaggedOutput(kind, payload)
        rows.clear()
        ledger.clear()

    @property
    def steps_running_queries(self) -> bool:
        """Whether this run steps running queries (its plan has one and a schedule ends it)."""
        return bool(self._plan.running) and self._last_window is not None

    def _charge_windows(self, state: ShardState, data: pa.Table | None) -> Iterator[Any]:
        if data is None:
            data = empty_rows(self._id_type, self._columns)
        windows = data.column(WINDOW_ID).to_numpy()
        bounds = np.flatnonzero(np.diff(windows)) + 1
        starts = np.r_[0, bounds] if windows.size else np.zeros(0, dtype=np.int64)
        stops = np.r_[bounds, windows.size] if windows.size else np.zeros(0, dtype=np.int64)
        slices = {int(windows[a]): (int(a), int(b)) for a, b in zip(starts, stops)}
        empty = data.slice(0, 0)
        for window in state.windows_to_step(list(slices), self._last_window):
            a, b = slices.get(window, (0, 0))
            part = data.slice(a, b - a) if window in slices else empty
            charged = state.charge_window(window, part, noise_std=self._noise_std, policy=self._policy)
            for query_id, partial in charged.sums.items():
                yield (query_id, window), partial
            if part.num_rows:
                yield beam.pvalue.TaggedOutput("counts", (window, charged.counts))


class ReleaseWindow(WindowQueryReleases, beam.DoFn):
    """:class:`renyi_stream.pipelines.beam.release_steps.WindowQueryReleases` as a DoFn: window id ->
    release rows (``sums`` the summed partials, a side input)."""


class ReleaseRunning(RunningQueryReleases, beam.DoFn):
    """:class:`renyi_stream.pipelines.beam.release_steps.RunningQueryReleases` as a DoFn: running
    query id -> tags ``raw`` and ``release_state``."""

    def process(self, query_id: str, sums: dict, previous: dict) -> Iterator[Any]:
        for tag, value in super().process(query_id, sums, previous):
            yield beam.pvalue.TaggedOutput(tag, value)


class RunningEstimates(RunningTotalRows, beam.DoFn):
    """:class:`renyi_stream.pipelines.beam.release_steps.RunningTotalRows` as a DoFn:
    ``(query_id, [(window, y flat), ...])`` -> running-total release rows."""


def _schema_of(table_or_path: pa.Table | str) -> pa.Schema:
    if isinstance(table_or_path, pa.Table):
        return table_or_path.schema
    import pyarrow.parquet as pq

    return pq.read_schema(str(table_or_path))


def previous_state_shards(item: tuple[str, str | None, pa.Table | str],
                          n_shards: int) -> list[tuple[int, tuple[str, Any]]]:
    """``(kind, query_id, table or Parquet path)`` of the previous run's state -> the filter's
    per-shard elements: ``(shard, ("ledger", part))`` or ``(shard, ("running", (query_id, part)))``,
    one part per shard, each keeping the snapshot's metadata."""
    kind, query_id, source = item
    if isinstance(source, pa.Table):
        table = source
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(str(source))
    if kind == "ledger":
        return list(ledger_shards(table, n_shards))
    return [(shard, ("running", (query_id, part))) for shard, (_, part) in snapshot_shards(table, n_shards)]


class WriteReleaseFiles(beam.DoFn):
    """(window id, release rows) -> ``<root>/window_id=<id>/releases.parquet``, first write wins.

    The Parquet release path for runs without a DuckDB writer (distributed runners write to
    object storage): one file per window, Hive-partitioned so that DuckDB reads the folder with
    ``read_parquet('<root>/*/*.parquet', hive_partitioning = true)``. A file already there is
    kept: noise is keyed, so a retried or re-run window computes the identical rows anyway, and
    a released window is never rewritten (invariant 5). ``root`` may be a local path or any URI
    ``pyarrow.fs`` understands.
    """

    def __init__(self, root: str) -> None:
        self._root = root

    def process(self, element: tuple[int, list[dict]]) -> Iterator[str]:
        from renyi_stream.queries.release_files import write_release_file

        window, rows = element
        written = write_release_file(self._root, window, rows)
        if written is not None:
            yield written


# --- composite transforms: the daily job's graph, usable from any Beam pipeline ------------------


class ReadIndicators(beam.PTransform):
    """``PBegin`` -> tagged outputs ``valid`` (Arrow tables of validated rows, with their input
    position), ``dead`` (dead-letter tables) and ``read`` (``(path, rows)`` per batch read,
    curator only).

    With ``file_windows`` (path -> the windows of the days the file holds), a row of another
    window is dead-lettered ``outside_file_days``; rows of windows in ``released`` as
    ``late_window`` (invariant 7), rows before ``start_window`` or after ``end_window`` as
    ``out_of_range_time`` (:func:`renyi_stream.stream.engine.dead_letters.classify_windows`), so
    ``rows read = valid + dead`` holds per file. ``keys``: the id and time columns' names (the
    ledger's contract's, :class:`renyi_stream.stream.schema.InputKeys`).
    """

    def __init__(self, inputs: Sequence[str], *, window: WindowSpec, start_window: int, end_window: int,
                 released: Sequence[int], indicator_columns: Sequence[str], batch_rows: int = 262_144,
                 category_columns: Sequence[str] = (), id_type: str | None = None,
                 file_windows: Mapping[str, Tuple[int, int]] | None = None, keys: InputKeys = DEFAULT_KEYS) -> None:
        super().__init__()
        self._inputs = [str(path) for path in inputs]
        self._read = ReadAndValidate(window=window, start_window=start_window, end_window=end_window,
                                     released=released, indicator_columns=indicator_columns, batch_rows=batch_rows,
                                     category_columns=category_columns, id_type=id_type, file_windows=file_windows,
                                     keys=keys)

    def expand(self, pbegin: Any) -> Any:
        return (pbegin
                | "Files" >> beam.Create(list(enumerate(self._inputs)))
                | "ReadAndValidate" >> beam.ParDo(self._read).with_outputs("dead", "read", main="valid"))


class IndividualFilter(beam.PTransform):
    """Validated tables -> the individual filter per user shard, in the global window.

    Input: Arrow tables from :class:`ReadIndicators` (``valid``). ``previous_ledger`` is the
    ledger snapshot to continue from (empty for a new ledger), ``previous_running`` the running
    queries' history snapshots (``query_id -> table``): each shard starts from its part. Each
    may be a table or the path of a Parquet file holding it (schema metadata included): a path
    is read inside the pipeline, so a large ledger is not embedded in the job graph (Beam
    pickles and compresses every ``Create``'d value when it builds the graph: about 20 CPU
    seconds for a 1M-user ledger). ``previous_ledger`` may also be a PCollection of
    ``(shard, ("ledger", table))`` elements, exactly one per shard that has users (the
    distributed job's ``ReadLedgerSnapshot``): a shard given two refuses to restore
    (:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.restore`); that PCollection may also carry
    ``(shard, ("running", (query_id, table)))`` parts, one per shard and running query, whose
    snapshot metadata (:func:`renyi_stream.stream.engine.running.rule_meta`) is then given as ``running_meta``
    (``query_id -> metadata``), so that a shard without a part still checks the stored strategy.
    ``last_window`` is the last window of this run's schedule: running queries step every
    window through it. Tagged outputs: ``sums`` (``((query_id, window_id), partial vector)`` per
    shard, to be summed across shards), ``ledger`` (each shard's new snapshot), ``running``
    (``(query_id, snapshot)`` per shard), ``counts`` (``(window, counts)``) and ``dead``
    (duplicate rows).
    """

    def __init__(self, *, plan: QueryPlan, indicator_columns: Sequence[str], noise_std: float, policy: str,
                 budget: float, id_type: str, tracker_step: float, n_shards: int,
                 previous_ledger: pa.Table | str | beam.pvalue.PCollection,
                 previous_running: dict[str, pa.Table | str] | None = None, last_window: int | None = None,
                 running_meta: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__()
        self._n_shards = n_shards
        self._previous = previous_ledger
        self._running = dict(previous_running or {})
        meta = {q: {k.decode(): v.decode() for k, v in _schema_of(t).metadata.items()}
                for q, t in self._running.items()}
        meta.update(running_meta or {})
        self._filter = IndividualFilterDoFn(plan=plan, indicator_columns=indicator_columns, noise_std=noise_std,
                                            policy=policy, budget=budget, id_type=id_type, tracker_step=tracker_step,
                                            last_window=last_window, running_meta=meta)

    def expand(self, valid: Any) -> Any:
        keyed = valid | "ByShard" >> beam.FlatMap(packed_by_shard, self._n_shards)
        split = isinstance(self._previous, beam.pvalue.PCollection)  # already one part per shard
        sources = ([] if split else [("ledger", None, self._previous)]) + [
            ("running", q, t) for q, t in sorted(self._running.items())]
        tables = [item for item in sources if isinstance(item[2], pa.Table)]
        files = [(kind, query_id, str(path)) for kind, query_id, path in sources if not isinstance(path, pa.Table)]
        initial = [element for item in tables for element in previous_state_shards(item, self._n_shards)]
        if self._filter.steps_running_queries:
            # A running query is stepped through every window of the schedule and its position
            # (next window) lives only in the shards' snapshots: with no rows and no history
            # anywhere (an empty first day), no shard would fire and the next run would find the
            # query still at its first window. Shard 0 always fires (it charges nobody there).
            initial.append((0, (TICK, None)))
        # A handful of elements each: no reshuffle (Create's default adds a shuffle stage per
        # Create, which costs more to plan than it could spread).
        previous = [valid.pipeline | "PreviousState" >> beam.Create(initial, reshuffle=False)] if initial else []
        if split:
            previous.append(self._previous)
        if files:
            previous.append(valid.pipeline | "PreviousStateFiles" >> beam.Create(files, reshuffle=False)
                            | "ReadPreviousState" >> beam.FlatMap(previous_state_shards, self._n_shards))
        # Typed as (int, Any): shard keys then get a deterministic coder, as state needs.
        return ((keyed, *previous) | "Merge" >> beam.Flatten().with_output_types(Tuple[int, Any])
                | "Filter" >> beam.ParDo(self._filter)
                .with_output_types(Tuple[Tuple[str, int], Any])  # (query, window) keys: deterministic coder
                .with_outputs("ledger", "running", "counts", "dead", main="sums"))


class ReleaseWindows(beam.PTransform):
    """Per-shard partial sums -> release rows for every (query, window, coordinate) of ``schedule``.

    Every window of ``schedule`` is released for every query active in it, with or without rows
    (invariant 3); the noise is keyed by (query, window) (invariant 5), so a retried bundle or a
    re-run computes the identical row; the noise is bound to the ledger ``ledger_id``, so another
    ledger under the same key draws its own. Running queries' releases ``y`` (tag ``raw``, to be kept
    by the curator for later runs) become running-total rows with ``previous_raw``
    (``query_id -> [(window, y flat)]`` of earlier runs).
    Running queries are released by :class:`ReleaseRunning` from ``previous_release``
    (``query_id -> release state table``).
    Outputs a dict: ``releases`` (rows), ``raw`` (``(query_id, window, y flat)``) and
    ``release_state`` (``(query_id, table)``, each running query's state after the run).
    """

    def __init__(self, schedule: Sequence[int], *, key_path: str, plan: QueryPlan, noise_std: float,
                 window: WindowSpec, accounting: str, key_fingerprint: str, ledger_id: str,
                 previous_raw: dict[str, list[tuple[int, list[float]]]] | None = None,
                 previous_release: dict[str, pa.Table] | None = None) -> None:
        super().__init__()
        self._schedule = [int(w) for w in schedule]
        self._previous_raw = dict(previous_raw or {})
        self._previous_release = dict(previous_release or {})
        self._running_ids = [e.query_id for e in plan.running if any(e.active_in(w) for w in self._schedule)]
        self._release = ReleaseWindow(key_path=key_path, plan=plan, noise_std=noise_std, window=window,
                                      accounting=accounting, key_fingerprint=key_fingerprint, ledger_id=ledger_id)
        self._running = ReleaseRunning(key_path=key_path, plan=plan, noise_std=noise_std, schedule=self._schedule,
                                       key_fingerprint=key_fingerprint, ledger_id=ledger_id)
        self._estimates = RunningEstimates(plan=plan, noise_std=noise_std, window=window, accounting=accounting,
                                           key_fingerprint=key_fingerprint)

    def expand(self, partial_sums: Any) -> dict[str, Any]:
        sums = partial_sums | "SumShards" >> beam.CombinePerKey(add_vectors)
        released = (partial_sums.pipeline
                    | "Schedule" >> beam.Create(self._schedule, reshuffle=False)
                    | "Release" >> beam.ParDo(self._release, sums=beam.pvalue.AsDict(sums)))
        states = partial_sums.pipeline | "PreviousRelease" >> beam.Create([self._previous_release], reshuffle=False)
        running_out = (partial_sums.pipeline
                       | "RunningQueries" >> beam.Create(self._running_ids, reshuffle=False)
                       | "ReleaseRunning" >> beam.ParDo(self._running, sums=beam.pvalue.AsDict(sums),
                                                        previous=beam.pvalue.AsSingleton(states))
                       .with_outputs("raw", "release_state"))
        previous = partial_sums.pipeline | "PreviousRaw" >> beam.Create([self._previous_raw], reshuffle=False)
        running = (running_out.raw
                   | "RawByQuery" >> beam.Map(lambda r: (r[0], (r[1], r[2]))).with_output_types(Tuple[str, Any])
                   | "GroupRaw" >> beam.GroupByKey()
                   | "RunningTotals" >> beam.ParDo(self._estimates, previous=beam.pvalue.AsSingleton(previous)))
        rows = (released, running) | "AllReleases" >> beam.Flatten()
        return {"releases": rows, "raw": running_out.raw, "release_state": running_out.release_state}


class WriteReleaseParquet(beam.PTransform):
    """Release rows -> one Parquet file per window under ``root`` (:class:`WriteReleaseFiles`);
    outputs the paths written (windows already on disk are kept and not listed)."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self._root = root

    def expand(self, releases: Any) -> Any:
        return (releases
                | "ByWindow" >> beam.Map(_by_window).with_output_types(Tuple[int, Any])
                | "GroupWindow" >> beam.GroupByKey()
                | "ReleaseFiles" >> beam.ParDo(WriteReleaseFiles(self._root)))


def _by_window(row: dict) -> tuple[int, dict]:
    return int(row["window_id"]), row


class DailyReleases(beam.PTransform):
    """The whole daily graph from ``PBegin``: read -> individual filter -> sum -> noisy releases.

    Returns a dict of PCollections: ``releases`` (release rows, dicts of
    :data:`renyi_stream.queries.release_store.RELEASE_SCHEMA`), ``ledger`` (shard snapshots), ``running``
    (running queries' per-user prepaid rows per shard), ``raw`` (running queries' releases ``y``),
    ``release_state`` (each running query's release state after the run),
    ``counts``, ``dead`` (dead-letter tables from reading and from the filter) and ``read`` (rows
    read per batch). ``category_columns`` are string columns read by histograms over string categories
    (passed through validation unparsed). The caller decides where the curator's outputs go
    (the daily job collects them into one transaction; a distributed job writes them to its own
    sinks). ``file_windows``: the windows of each input's days (:class:`ReadIndicators`).
    """

    def __init__(self, inputs: Sequence[str], *, window: WindowSpec, start_window: int, end_window: int,
                 released: Sequence[int], schedule: Sequence[int], plan: QueryPlan,
                 indicator_columns: Sequence[str], noise_std: float, policy: str, budget: float, id_type: str,
                 tracker_step: float, n_shards: int, previous_ledger: pa.Table | str, key_path: str,
                 accounting: str, key_fingerprint: str, ledger_id: str,
                 previous_running: dict[str, pa.Table | str] | None = None,
                 previous_raw: dict[str, list[tuple[int, list[float]]]] | None = None,
                 category_columns: Sequence[str] = (),
                 previous_release: dict[str, pa.Table] | None = None,
                 file_windows: Mapping[str, Tuple[int, int]] | None = None, keys: InputKeys = DEFAULT_KEYS) -> None:
        super().__init__()
        self._read = ReadIndicators(inputs, window=window, start_window=start_window, end_window=end_window,
                                    released=released, indicator_columns=indicator_columns,
                                    category_columns=category_columns, id_type=id_type, file_windows=file_windows,
                                    keys=keys)
        self._filter = IndividualFilter(plan=plan, indicator_columns=indicator_columns, noise_std=noise_std,
                                        policy=policy, budget=budget, id_type=id_type, tracker_step=tracker_step,
                                        n_shards=n_shards, previous_ledger=previous_ledger,
                                        previous_running=previous_running,
                                        last_window=max(schedule) if schedule else None)
        self._release = ReleaseWindows(schedule, key_path=key_path, plan=plan, noise_std=noise_std, window=window,
                                       accounting=accounting, key_fingerprint=key_fingerprint,
                                       ledger_id=ledger_id, previous_raw=previous_raw,
                                       previous_release=previous_release)

    def expand(self, pbegin: Any) -> dict[str, Any]:
        read = pbegin | "ReadIndicators" >> self._read
        filtered = read.valid | "IndividualFilter" >> self._filter
        released = filtered.sums | "ReleaseWindows" >> self._release
        dead = (read.dead, filtered.dead) | "DeadLetters" >> beam.Flatten()
        return {"releases": released["releases"], "raw": released["raw"], "ledger": filtered.ledger,
                "running": filtered.running, "counts": filtered.counts, "dead": dead, "read": read.read,
                "release_state": released["release_state"]}
