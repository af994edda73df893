"""A shard's rows on the charge path, the same for every job and runner: the validated rows'
mask, :class:`PackedRows` (rows packed for the shuffle and keyed state), the split by user shard,
and :func:`in_event_time_order` (invariant 2 (charge-in-event-time-order, docs/architecture.md)).
Imports no Beam: the Beam jobs' transforms (:mod:`renyi_stream.pipelines.beam.transforms`) and the
streaming job's runner-independent filter (:mod:`renyi_stream.pipelines.streaming.shard_filter`)
share it."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.engine.dead_letters import (DEAD_LETTER_SCHEMA, ROW, SOURCE, DeadLetterReason, row_letters,
                                                     source_names, with_source_names)
from renyi_stream.stream.engine.sharding import shard_of
from renyi_stream.stream.schema import USER_ID, WINDOW_ID, may_repeat

#: The kind of an element that carries nothing and only makes its shard's filter fire.
TICK = "tick"


def valid_mask(n: int, rejected: pa.Table) -> np.ndarray:
    mask = np.ones(n, dtype=bool)
    mask[rejected.column("row_index").to_numpy()] = False
    return mask


class PackedRows:
    """A shard's validated rows on their way into the filter's state: an Arrow table that
    pickles as an LZ4-compressed Arrow IPC stream. The runner's shuffle and the filter's bag
    state hold what pickling gives them, and indicator rows (sparse 0/1 values, one window,
    consecutive row numbers) compress about 5x, so a run's rows take a fifth of the memory
    while they wait for the end-of-input timer. LZ4 rather than zstd: zstd packs about 15x but
    costs twice the CPU, and a 3M-row run spent 0.3 s more in it for 17 MB less peak memory.

    Compression happens once: an unpickled instance keeps its compressed bytes and decodes them
    only when ``table`` is first read, so rows that pass from the shuffle straight into state are
    never decompressed and recompressed on the way (that round trip was a sixth of a run).
    """

    __slots__ = ("_table", "_packed", "_rows", "_window")

    def __init__(self, table: pa.Table | None = None, *, packed: bytes | None = None,
                 rows: int | None = None, window: int | None = None) -> None:
        if (table is None) == (packed is None):
            raise ValueError("PackedRows needs exactly one of table or packed")
        self._table = table
        self._packed = packed
        self._rows = table.num_rows if table is not None else (None if rows is None else int(rows))
        # From the rows themselves when they are given: a window said otherwise is never believed.
        window = one_window(table) if table is not None else window
        self._window = None if window is None else int(window)

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            self._table = pa.ipc.open_stream(self._packed).read_all()
            self._rows = self._table.num_rows
        return self._table

    @property
    def num_rows(self) -> int:
        """The number of rows, without decoding them when it travelled with the packed bytes (the
        streaming filter counts the rows it holds for later windows at every window)."""
        return self._rows if self._rows is not None else self.table.num_rows

    @property
    def window(self) -> int | None:
        """The window every row is of (:func:`one_window`), known without decoding them; None when
        they span several, have no window column, or none: the streaming filter then decodes them
        to sort them by window."""
        return self._window

    def __reduce__(self) -> tuple[Any, tuple[bytes, int | None, int | None]]:
        if self._packed is None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, self._table.schema,
                                   options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
                writer.write_table(self._table)
            self._packed = sink.getvalue().to_pybytes()
        return _unpack_rows, (self._packed, self.num_rows, self._window)


def one_window(table: pa.Table) -> int | None:
    """The window id every row of ``table`` has (its ``window_id`` column), or None: no rows, no
    such column, or more than one window."""
    if not table.num_rows or WINDOW_ID not in table.column_names:
        return None
    span = pc.min_max(table.column(WINDOW_ID))
    low, high = span["min"].as_py(), span["max"].as_py()
    return int(low) if low is not None and low == high else None


def _unpack_rows(data: bytes, rows: int | None = None, window: int | None = None) -> PackedRows:
    # ``rows`` and ``window`` are absent from a pickle made before they travelled (state an older
    # version wrote): then counting or sorting the rows decodes them.
    return PackedRows(packed=data, rows=rows, window=window)


def unpacked(parts: Iterable[Any]) -> list[pa.Table]:
    """The tables of buffered rows, packed (:class:`PackedRows`) or not."""
    return [p.table if isinstance(p, PackedRows) else p for p in parts]


def row_count(parts: Iterable[Any]) -> int:
    """How many rows ``parts`` (packed, :class:`PackedRows`, or tables) hold, decoding none that
    knows its count."""
    return sum(p.num_rows for p in parts)


def packed_by_shard(table: pa.Table, n_shards: int) -> Iterator[tuple[int, tuple[str, PackedRows]]]:
    """:func:`split_by_shard` with each part packed for the shuffle and the state."""
    for shard, (kind, part) in split_by_shard(table, n_shards):
        yield shard, (kind, PackedRows(part))


def split_by_shard(table: pa.Table, n_shards: int) -> Iterator[tuple[int, tuple[str, pa.Table]]]:
    """One ``(shard, ("rows", table))`` element per shard present in ``table``, rows in their
    original order within each shard."""
    shards = shard_of(table.column(USER_ID), n_shards)
    # Shard numbers fit 16 bits unsigned (every job allows at most 65,536 shards), where NumPy's
    # stable sort is a radix sort.
    order = np.argsort(shards.astype(np.uint16) if n_shards <= 1 << 16 else shards, kind="stable")
    sorted_shards = shards[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(sorted_shards)) + 1, order.size]
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            # A gather per shard, not slices of one gathered table: a pickled Arrow slice carries
            # its parent's whole buffers, so every shard's element would hold every shard's rows.
            yield int(sorted_shards[a]), ("rows", table.take(pa.array(order[a:b])))


def empty_rows(id_type: str, columns: Sequence[str]) -> pa.Table:
    fields = [(USER_ID, pa.int64() if id_type == "int64" else pa.string()), (WINDOW_ID, pa.int64())]
    fields += [(c, pa.float64()) for c in columns]
    return pa.schema(fields).empty_table()


def in_event_time_order(parts: list[pa.Table]) -> tuple[pa.Table | None, pa.Table | None]:
    """Buffered row tables -> ``(rows, duplicates)``: the rows in event-time order, ties broken by
    input position (so arrival order never matters: invariant 2 (charge-in-event-time-order,
    docs/architecture.md)), with every (user, window) after its first split off as duplicates.
    ``(None, None)`` when nothing is buffered."""
    if not parts:
        return None, None
    # The concatenation keeps the first part's inputs' names only: every part's, for the dead letters.
    data = with_source_names(pa.concat_tables(parts, promote_options="default"), source_names(parts))
    order = event_time_order(data)
    if order is not None:
        data = data.take(pa.array(order))
    return first_per_user_window(data)


def _int_column(data: pa.Table, name: str) -> np.ndarray:
    return np.asarray(data.column(name).to_numpy(), dtype=np.int64)


def event_time_order(data: pa.Table) -> np.ndarray | None:
    """The permutation that sorts ``data`` by (window, source, row), or ``None`` when it is
    sorted already (the usual case: one file per day, read in order).

    The three keys are packed into one int64 when their ranges fit 62 bits, which they do
    unless a run reads more than about a billion rows per file and thousands of files; a
    stable argsort of that key is a merge of the already-sorted runs (one per buffered table).
    """
    if data.num_rows < 2:
        return None
    keys = [_int_column(data, name) for name in (WINDOW_ID, SOURCE, ROW)]
    spans = [int(k.max()) - int(k.min()) for k in keys]
    bits = [max(span, 1).bit_length() for span in spans]
    if sum(bits) <= 62:
        packed = np.zeros(data.num_rows, dtype=np.int64)
        for k, b in zip(keys, bits):
            packed = (packed << b) | (k - k.min())
        if np.all(packed[1:] > packed[:-1]):
            return None
        return np.argsort(packed, kind="stable")
    return np.lexsort(keys[::-1])


def first_per_user_window(data: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Keep the first row of each (user, window) in (window, source, row) order; dead-letter the rest."""
    keep = _first_of_each_user_window(data)
    if keep is None:
        return data, DEAD_LETTER_SCHEMA.empty_table()
    dead = row_letters(data.filter(pa.array(~keep)), DeadLetterReason.DUPLICATE,
                       detail="another row of this user and window came first")
    return data.filter(pa.array(keep)), dead


def _first_of_each_user_window(data: pa.Table) -> np.ndarray | None:
    """Mask of the rows that are the first of their (user, window), ``None`` when all are.
    Rows come sorted by window; :func:`renyi_stream.stream.schema.may_repeat` spares the hash grouping when
    a linear check proves every (user, window) distinct."""
    n = data.num_rows
    users = data.column(USER_ID)
    windows = _int_column(data, WINDOW_ID)
    if not may_repeat(users, windows):
        return None
    keys = pa.table({"u": users, "w": windows, "i": pa.array(np.arange(n), type=pa.int64())})
    first = keys.group_by(["u", "w"], use_threads=False).aggregate([("i", "min")]).column("i_min").to_numpy()
    keep = np.zeros(n, dtype=bool)
    keep[first] = True
    return None if keep.all() else keep


def ledger_shards(snapshot: pa.Table, n_shards: int) -> Iterable[tuple[int, tuple[str, pa.Table]]]:
    """The previous ledger split into ``(shard, ("ledger", table))`` elements."""
    return [(shard, ("ledger", part)) for shard, (_, part) in snapshot_shards(snapshot, n_shards)]


def snapshot_shards(snapshot: pa.Table, n_shards: int) -> list[tuple[int, tuple[str, pa.Table]]]:
    """A per-user snapshot (``user_id`` column) split by shard, each part keeping the metadata."""
    if snapshot.num_rows == 0:
        return []
    metadata = snapshot.schema.metadata
    return [(shard, ("rows", part.replace_schema_metadata(metadata)))
            for shard, (_, part) in split_by_shard(snapshot, n_shards)]
