"""Beam transforms of the daily job: read and validate, filter per shard, sum, noise.

* :class:`ReadAndValidate`: one input file -> Arrow batches validated by ``stream.schema``;
  rows for windows already released are dead-lettered as ``late_window`` (invariant 7).
* :class:`IndividualFilterDoFn`: the stateful filter, keyed by user shard **in the global
  window** (invariant 1: a window-scoped ledger would reset budgets daily). It buffers the
  shard's rows in bag state and, on a watermark timer, charges them window by window in
  event-time order (invariant 2), whatever order they arrived in.
* :class:`ReleaseWindow`: every window of the public schedule gets a release for every query,
  with or without rows (invariant 3), noise keyed by (query, window) (invariant 5).

Composite transforms wire them together, for use from any Beam pipeline:
:class:`ReadIndicators` -> :class:`IndividualFilter` -> :class:`ReleaseWindows` (and
:class:`WriteReleaseParquet`), all four in :class:`DailyReleases`, which the daily job runs.

Elements are Arrow tables (one per batch and shard), not rows: the per-row Python work of
classic Beam DP pipelines is what this design avoids.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow

from pipelines.readers import read_batches
from pipelines.sharding import shard_of
from stream.ledger import Ledger
from stream.noise import NoiseKey, gaussian_noise
from stream.schema import USER_ID, WINDOW_ID, WindowSpec, validate_batch

SOURCE = "_source"  # (file index, row index) of each row: a deterministic tie-break
ROW = "_row"
LATE_WINDOW = "late_window"
DEAD_LETTER_SCHEMA = pa.schema([
    ("source", pa.string()), ("row_index", pa.int64()), ("reason", pa.string()),
    ("detail", pa.string()), ("raw", pa.string()),
])


def query_id_for(column: str) -> str:
    """The query id of the default per-column daily sum."""
    return f"sum:{column}"


class ReadAndValidate(beam.DoFn):
    """(file index, path) -> valid tables (main), dead letters and rows-read counts (tagged)."""

    def __init__(self, *, window: WindowSpec, start_window: int, end_window: int,
                 released: Sequence[int], indicator_columns: Sequence[str], batch_rows: int = 65_536) -> None:
        self._window = window
        self._start, self._end = start_window, end_window
        self._released = np.array(sorted(released), dtype=np.int64)
        self._columns = list(indicator_columns)
        self._batch_rows = batch_rows

    def process(self, element: tuple[int, str]) -> Iterator[Any]:
        file_index, path = element
        offset = 0
        for batch in read_batches(path, batch_rows=self._batch_rows):
            yield beam.pvalue.TaggedOutput("read", (path, batch.num_rows))
            # No lower bound here: a row before the schedule is "late" if its window was released
            # and "out of range" otherwise, which the validator alone cannot tell apart.
            checked = validate_batch(batch, window=self._window, start_window=None,
                                     end_window=self._end, indicator_columns=self._columns)
            if checked.rejected.num_rows:
                yield beam.pvalue.TaggedOutput("dead", _dead_letters(path, offset, checked.rejected))
            valid = checked.valid
            rows = pa.array(np.flatnonzero(_valid_mask(batch.num_rows, checked.rejected)) + offset, type=pa.int64())
            valid = valid.append_column(SOURCE, pa.array([file_index] * valid.num_rows, type=pa.int64()))
            valid = valid.append_column(ROW, rows)
            windows = valid.column(WINDOW_ID).to_numpy()
            late = np.isin(windows, self._released)
            early = (windows < self._start) & ~late
            for mask, reason, detail in ((late, LATE_WINDOW, "window {} was already released"),
                                         (early, "out_of_range_time", "window {} is before the schedule")):
                if mask.any():
                    yield beam.pvalue.TaggedOutput(
                        "dead", _window_letters(path, valid.filter(pa.array(mask)), self._columns, reason, detail))
            if late.any() or early.any():
                valid = valid.filter(pa.array(~(late | early)))
            if valid.num_rows:
                yield valid
            offset += batch.num_rows


def _valid_mask(n: int, rejected: pa.Table) -> np.ndarray:
    mask = np.ones(n, dtype=bool)
    mask[rejected.column("row_index").to_numpy()] = False
    return mask


def _dead_letters(path: str, offset: int, rejected: pa.Table) -> pa.Table:
    return pa.table({
        "source": pa.array([path] * rejected.num_rows, type=pa.string()),
        "row_index": pc.add(rejected.column("row_index"), offset).cast(pa.int64()),
        "reason": rejected.column("reason").cast(pa.string()),
        "detail": rejected.column("detail").cast(pa.string()),
        "raw": rejected.column("raw").cast(pa.string()),
    }, schema=DEAD_LETTER_SCHEMA)


def _window_letters(path: str, rows: pa.Table, columns: Sequence[str], reason: str, detail: str) -> pa.Table:
    n = rows.num_rows
    return pa.table({
        "source": pa.array([path] * n, type=pa.string()),
        "row_index": rows.column(ROW),
        "reason": pa.array([reason] * n, type=pa.string()),
        "detail": pa.array([detail.format(w) for w in rows.column(WINDOW_ID).to_pylist()], type=pa.string()),
        "raw": _raw_json(pa.table({c: rows.column(c) for c in [USER_ID, WINDOW_ID, *columns]})),
    }, schema=DEAD_LETTER_SCHEMA)


def _raw_json(rows: pa.Table) -> pa.Array:
    # Dead-letter rows are rare: a Python loop over them is fine (never over valid rows).
    return pa.array([json.dumps(r, default=str) for r in rows.to_pylist()], type=pa.string())


def split_by_shard(table: pa.Table, n_shards: int) -> Iterator[tuple[int, tuple[str, pa.Table]]]:
    """One ``(shard, ("rows", table))`` element per shard present in ``table``."""
    shards = shard_of(table.column(USER_ID), n_shards)
    order = np.argsort(shards, kind="stable")
    sorted_shards = shards[order]
    bounds = np.flatnonzero(np.diff(sorted_shards)) + 1
    for part in np.split(order, bounds):
        if part.size:
            yield int(shards[part[0]]), ("rows", table.take(pa.array(part)))


class IndividualFilterDoFn(beam.DoFn):
    """The individual filter for one shard of users, in the global window.

    State (per shard key, global window):
      ROWS   -- bag of Arrow tables: this run's valid rows for the shard, in arrival order.
      LEDGER -- bag holding the shard's ledger snapshot from the previous run (zero or one table).
    Timer:
      FLUSH  -- event-time timer at the end of the global window: fires once all input has been
                read (batch) and charges the buffered rows window by window, in window order.
    Outputs: ``((query_id, window_id), (sum, 1))`` partial sums (main), the shard's new ledger
    snapshot (tag ``ledger``), per-window status counts (tag ``counts``) and duplicate rows
    (tag ``dead``).
    """

    ROWS = BagStateSpec("rows", PickleCoder())
    LEDGER = BagStateSpec("ledger", PickleCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def __init__(self, *, indicator_columns: Sequence[str], noise_std: float, policy: str,
                 budget: float, id_type: str, tracker_step: float) -> None:
        self._columns = list(indicator_columns)
        self._noise_std = noise_std
        self._policy = policy
        self._budget = budget
        self._id_type = id_type
        self._tracker_step = tracker_step

    def process(self, element: tuple[int, tuple[str, pa.Table]],
                rows: Any = beam.DoFn.StateParam(ROWS), ledger: Any = beam.DoFn.StateParam(LEDGER),
                flush: Any = beam.DoFn.TimerParam(FLUSH)) -> None:
        _, (kind, table) = element
        (rows if kind == "rows" else ledger).add(table)
        flush.set(GlobalWindow().max_timestamp())

    @on_timer(FLUSH)
    def charge(self, key: Any = beam.DoFn.KeyParam, rows: Any = beam.DoFn.StateParam(ROWS),
               ledger: Any = beam.DoFn.StateParam(LEDGER)) -> Iterator[Any]:
        snapshots = list(ledger.read())
        shard_ledger = (Ledger.from_arrow(snapshots[0]) if snapshots
                        else Ledger(budget=self._budget, id_type=self._id_type, tracker_step=self._tracker_step))
        buffered = list(rows.read())
        if buffered:
            data = pa.concat_tables(buffered, promote_options="default")
            # Event-time order, ties broken by input position: arrival order never matters.
            data = data.sort_by([(WINDOW_ID, "ascending"), (SOURCE, "ascending"), (ROW, "ascending")])
            data, duplicates = _first_per_user_window(data)
            if duplicates.num_rows:
                yield beam.pvalue.TaggedOutput("dead", duplicates)
            yield from self._charge_windows(shard_ledger, data)
        yield beam.pvalue.TaggedOutput("ledger", shard_ledger.to_arrow())
        rows.clear()
        ledger.clear()

    def _charge_windows(self, shard_ledger: Ledger, data: pa.Table) -> Iterator[Any]:
        windows = data.column(WINDOW_ID).to_numpy()
        bounds = np.flatnonzero(np.diff(windows)) + 1
        starts = np.r_[0, bounds]
        stops = np.r_[bounds, windows.size]
        values = np.column_stack([data.column(c).to_numpy() for c in self._columns])
        ids = data.column(USER_ID)
        for start, stop in zip(starts, stops):
            window = int(windows[start])
            result = shard_ledger.admit(ids.slice(start, stop - start), values[start:stop],
                                        noise_std=self._noise_std, policy=self._policy)
            sums = result.contributions.sum(axis=0)
            for j, column in enumerate(self._columns):
                yield (query_id_for(column), window), float(sums[j])
            yield beam.pvalue.TaggedOutput("counts", (window, result.counts()))


def _first_per_user_window(data: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Keep the first row of each (user, window) in (window, source, row) order; dead-letter the rest."""
    n = data.num_rows
    keys = pa.table({"u": data.column(USER_ID), "w": data.column(WINDOW_ID),
                     "i": pa.array(np.arange(n), type=pa.int64())})
    first = keys.group_by(["u", "w"], use_threads=False).aggregate([("i", "min")]).column("i_min").to_numpy()
    keep = np.zeros(n, dtype=bool)
    keep[first] = True
    if keep.all():
        return data, pa.table({f.name: pa.array([], type=f.type) for f in DEAD_LETTER_SCHEMA},
                              schema=DEAD_LETTER_SCHEMA)
    dup = data.filter(pa.array(~keep))
    dead = pa.table({
        "source": pc.cast(dup.column(SOURCE), pa.string()),
        "row_index": dup.column(ROW),
        "reason": pa.array(["duplicate_user_window"] * dup.num_rows, type=pa.string()),
        "detail": pa.array(["another row of this user and window came first"] * dup.num_rows, type=pa.string()),
        "raw": _raw_json(dup.drop_columns([SOURCE, ROW])),
    }, schema=DEAD_LETTER_SCHEMA)
    return data.filter(pa.array(keep)), dead


class ReleaseWindow(beam.DoFn):
    """window id -> one release row per query: the sum (0 when no rows) plus keyed noise."""

    def __init__(self, *, key_path: str, indicator_columns: Sequence[str], noise_std: float,
                 window: WindowSpec, accounting: str, key_fingerprint: str) -> None:
        self._key_path = key_path
        self._columns = list(indicator_columns)
        self._noise_std = noise_std
        self._window = window
        self._accounting = accounting
        self._fingerprint = key_fingerprint
        self._key: NoiseKey | None = None

    def setup(self) -> None:
        self._key = NoiseKey.load(self._key_path)
        if self._key.fingerprint != self._fingerprint:
            raise RuntimeError(f"the noise key at {self._key_path} is not the one this ledger was started with")

    def process(self, window: int, sums: dict) -> Iterator[dict]:
        assert self._key is not None
        start = dt.datetime.fromtimestamp(int(self._window.window_start_seconds(window)), tz=dt.timezone.utc)
        end = dt.datetime.fromtimestamp(int(self._window.window_end_seconds(window)), tz=dt.timezone.utc)
        for column in self._columns:
            query_id = query_id_for(column)
            true_sum = sums.get((query_id, window), 0.0)
            noise = gaussian_noise(self._key, query_id=query_id, window_id=window, dim=1, noise_std=self._noise_std)
            yield {
                "query_id": query_id, "window_id": window, "window_start": start, "window_end": end,
                "label": column, "coordinate": 0, "value": float(true_sum + noise[0]),
                "noise_std": self._noise_std, "kind": "window", "accounting": self._accounting,
                "mechanism": "gaussian", "key_fingerprint": self._fingerprint,
            }


def ledger_shards(snapshot: pa.Table, n_shards: int) -> Iterable[tuple[int, tuple[str, pa.Table]]]:
    """The previous ledger split into ``(shard, ("ledger", table))`` elements."""
    if snapshot.num_rows == 0:
        return []
    metadata = snapshot.schema.metadata
    return [(shard, ("ledger", part.replace_schema_metadata(metadata)))
            for shard, (_, part) in split_by_shard(snapshot, n_shards)]


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
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq

        from queries.release_store import RELEASE_SCHEMA

        window, rows = element
        fs, root = pafs.FileSystem.from_uri(self._root) if "://" in self._root else (
            pafs.LocalFileSystem(), str(Path(self._root).resolve()))
        folder = f"{root}/window_id={int(window)}"
        target = f"{folder}/releases.parquet"
        if fs.get_file_info(target).type != pafs.FileType.NotFound:
            return
        fs.create_dir(folder, recursive=True)
        table = pa.Table.from_pylist(sorted(rows, key=lambda r: (r["query_id"], r["coordinate"])),
                                     schema=RELEASE_SCHEMA).drop_columns(["window_id"])
        scratch = f"{folder}/.releases.parquet.tmp"
        pq.write_table(table, scratch, filesystem=fs)
        fs.move(scratch, target)  # a reader sees the whole file or none of it
        yield target


# --- composite transforms: the daily job's graph, usable from any Beam pipeline ------------------


class ReadIndicators(beam.PTransform):
    """``PBegin`` -> tagged outputs ``valid`` (Arrow tables of validated rows, with their input
    position), ``dead`` (dead-letter tables) and ``read`` (``(path, rows)`` per batch read).

    Rows of windows in ``released`` are dead-lettered as ``late_window`` (invariant 7), rows
    before ``start_window`` or after ``end_window`` as out of range, so ``rows read = valid +
    dead`` holds per file.
    """

    def __init__(self, inputs: Sequence[str], *, window: WindowSpec, start_window: int, end_window: int,
                 released: Sequence[int], indicator_columns: Sequence[str], batch_rows: int = 65_536) -> None:
        super().__init__()
        self._inputs = [str(path) for path in inputs]
        self._read = ReadAndValidate(window=window, start_window=start_window, end_window=end_window,
                                     released=released, indicator_columns=indicator_columns, batch_rows=batch_rows)

    def expand(self, pbegin: Any) -> Any:
        return (pbegin
                | "Files" >> beam.Create(list(enumerate(self._inputs)))
                | "ReadAndValidate" >> beam.ParDo(self._read).with_outputs("dead", "read", main="valid"))


class IndividualFilter(beam.PTransform):
    """Validated tables -> the individual filter per user shard, in the global window.

    Input: Arrow tables from :class:`ReadIndicators` (``valid``). ``previous_ledger`` is the
    ledger snapshot to continue from (empty for a new ledger): each shard starts from its part.
    Tagged outputs: ``sums`` (``((query_id, window_id), partial sum)`` per shard, to be summed
    across shards), ``ledger`` (each shard's new snapshot), ``counts`` (``(window, counts)``) and
    ``dead`` (duplicate rows).
    """

    def __init__(self, *, indicator_columns: Sequence[str], noise_std: float, policy: str, budget: float,
                 id_type: str, tracker_step: float, n_shards: int, previous_ledger: pa.Table) -> None:
        super().__init__()
        self._n_shards = n_shards
        self._previous = previous_ledger
        self._filter = IndividualFilterDoFn(indicator_columns=indicator_columns, noise_std=noise_std, policy=policy,
                                            budget=budget, id_type=id_type, tracker_step=tracker_step)

    def expand(self, valid: Any) -> Any:
        keyed = valid | "ByShard" >> beam.FlatMap(split_by_shard, self._n_shards)
        initial = valid.pipeline | "PreviousLedger" >> beam.Create(list(ledger_shards(self._previous, self._n_shards)))
        # Typed as (int, Any): shard keys then get a deterministic coder, as state needs.
        return ((keyed, initial) | "Merge" >> beam.Flatten().with_output_types(Tuple[int, Any])
                | "Filter" >> beam.ParDo(self._filter).with_outputs("ledger", "counts", "dead", main="sums"))


class ReleaseWindows(beam.PTransform):
    """Per-shard partial sums -> one release row per (query, window, coordinate) of ``schedule``.

    Every window of ``schedule`` is released for every query, with or without rows (invariant
    3); the noise is keyed by (query, window) (invariant 5), so a retried bundle or a re-run
    computes the identical row.
    """

    def __init__(self, schedule: Sequence[int], *, key_path: str, indicator_columns: Sequence[str],
                 noise_std: float, window: WindowSpec, accounting: str, key_fingerprint: str) -> None:
        super().__init__()
        self._schedule = [int(w) for w in schedule]
        self._release = ReleaseWindow(key_path=key_path, indicator_columns=indicator_columns, noise_std=noise_std,
                                      window=window, accounting=accounting, key_fingerprint=key_fingerprint)

    def expand(self, partial_sums: Any) -> Any:
        sums = partial_sums | "SumShards" >> beam.CombinePerKey(sum)
        return (partial_sums.pipeline
                | "Schedule" >> beam.Create(self._schedule)
                | "Release" >> beam.ParDo(self._release, sums=beam.pvalue.AsDict(sums)))


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
    :data:`queries.release_store.RELEASE_SCHEMA`), ``ledger`` (shard snapshots), ``counts``,
    ``dead`` (dead-letter tables from reading and from the filter) and ``read`` (rows read per
    batch). With ``releases_parquet`` the releases are also written as Parquet files per window.
    The caller decides where the curator's outputs go (the daily job collects them into one
    transaction; a distributed job writes them to its own sinks).
    """

    def __init__(self, inputs: Sequence[str], *, window: WindowSpec, start_window: int, end_window: int,
                 released: Sequence[int], schedule: Sequence[int], indicator_columns: Sequence[str],
                 noise_std: float, policy: str, budget: float, id_type: str, tracker_step: float, n_shards: int,
                 previous_ledger: pa.Table, key_path: str, accounting: str, key_fingerprint: str,
                 releases_parquet: str | None = None) -> None:
        super().__init__()
        self._read = ReadIndicators(inputs, window=window, start_window=start_window, end_window=end_window,
                                    released=released, indicator_columns=indicator_columns)
        self._filter = IndividualFilter(indicator_columns=indicator_columns, noise_std=noise_std, policy=policy,
                                        budget=budget, id_type=id_type, tracker_step=tracker_step,
                                        n_shards=n_shards, previous_ledger=previous_ledger)
        self._release = ReleaseWindows(schedule, key_path=key_path, indicator_columns=indicator_columns,
                                       noise_std=noise_std, window=window, accounting=accounting,
                                       key_fingerprint=key_fingerprint)
        self._parquet = releases_parquet

    def expand(self, pbegin: Any) -> dict[str, Any]:
        read = pbegin | "ReadIndicators" >> self._read
        filtered = read.valid | "IndividualFilter" >> self._filter
        releases = filtered.sums | "ReleaseWindows" >> self._release
        if self._parquet:
            _ = releases | "WriteReleaseParquet" >> WriteReleaseParquet(self._parquet)
        dead = (read.dead, filtered.dead) | "DeadLetters" >> beam.Flatten()
        return {"releases": releases, "ledger": filtered.ledger, "counts": filtered.counts, "dead": dead,
                "read": read.read}
