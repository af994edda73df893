"""A vectorised hash index from user ids to dense positions.

The ledger keeps per-user state in dense arrays (position ``p`` holds the ``p``-th user ever
seen) and needs, per window, the positions of up to millions of ids at once. ``np.searchsorted``
into a sorted id array costs ~300 ns per random id on this hardware (cache misses at every
level of the binary search); a linear-probing table built from NumPy operations needs one or
two random reads per id, about 10x less. No Python loop runs per id: each probe round is one
vectorised pass over the ids still unresolved, and at a load factor <= 1/4 few ids need a second round.

String ids are first mapped to int64 codes (their position in an append-only dictionary), looked
up through the same table keyed by a hash of their bytes and confirmed by comparing the id, so a
lookup costs the ids looked up, never the dictionary.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_EMPTY = np.iinfo(np.int64).min  # reserved: never a valid int64 user id
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing multiplier (Knuth 6.4)
_MIN_BITS = 10
# Slots per key at least: at load 1/4 about 11% of lookups need a second probe (measured at 1M
# keys), against 20% at load 1/2, for 32 bytes of table per user.
_LOAD = 4


class Int64Index:
    """Map int64 keys to dense positions ``0..n-1`` in insertion order."""

    def __init__(self) -> None:
        self._bits = _MIN_BITS
        self._keys = np.full(1 << self._bits, _EMPTY, dtype=np.int64)
        self._slot_pos = np.full(1 << self._bits, -1, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.view(np.uint64) * _GOLDEN) >> np.uint64(64 - self._bits)).astype(np.intp)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Positions of ``keys`` (int64 array), ``-1`` for keys not in the index."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        mask = (1 << self._bits) - 1
        slot = self._slots(keys)
        # Rows whose slot holds another key probe onwards until their key or an empty slot
        # (whose position is -1) turns up.
        unresolved = np.flatnonzero(self._keys[slot] != keys)
        while unresolved.size:
            next_slot = (slot[unresolved] + 1) & mask
            slot[unresolved] = next_slot
            probe = self._keys[next_slot]
            unresolved = unresolved[(probe != keys[unresolved]) & (probe != _EMPTY)]
        return self._slot_pos[slot]

    def add(self, new_keys: np.ndarray) -> np.ndarray:
        """Append keys that are not in the index yet (unique among themselves); return their positions."""
        new_keys = np.ascontiguousarray(new_keys, dtype=np.int64)
        if new_keys.size and np.any(new_keys == _EMPTY):
            raise ValueError(f"user id {_EMPTY} is reserved and cannot be used")
        positions = np.arange(self._size, self._size + new_keys.size, dtype=np.int64)
        if _LOAD * (self._size + new_keys.size) > (1 << self._bits):
            self._grow(self._size + new_keys.size)
        self._insert(new_keys, positions)
        self._size += new_keys.size
        return positions

    def keys_in_order(self) -> np.ndarray:
        """All keys, indexed by position."""
        occupied = self._slot_pos >= 0
        out = np.empty(self._size, dtype=np.int64)
        out[self._slot_pos[occupied]] = self._keys[occupied]
        return out

    def _grow(self, needed: int) -> None:
        keys = self.keys_in_order()
        bits = self._bits
        while _LOAD * needed > (1 << bits):
            bits += 1
        self._bits = bits
        self._keys = np.full(1 << bits, _EMPTY, dtype=np.int64)
        self._slot_pos = np.full(1 << bits, -1, dtype=np.int64)
        self._insert(keys, np.arange(keys.size, dtype=np.int64))

    def _insert(self, keys: np.ndarray, positions: np.ndarray) -> None:
        mask = (1 << self._bits) - 1
        slot = self._slots(keys)
        pending = np.arange(keys.size)
        while pending.size:
            s = slot[pending]
            free = self._keys[s] == _EMPTY
            claimants, claimed = pending[free], s[free]
            # Several pending keys may aim at one free slot: the last write wins, the others
            # see a foreign key on read-back and probe on.
            self._keys[claimed] = keys[claimants]
            won = self._keys[claimed] == keys[claimants]
            self._slot_pos[claimed[won]] = positions[claimants[won]]
            lost = np.concatenate([pending[~free], claimants[~won]])
            slot[lost] = (slot[lost] + 1) & mask
            pending = lost


class StringCodes:
    """Append-only dictionary from string ids to int64 codes ``0..n-1``, with a persistent index.

    Each id is keyed by a 64-bit hash of its UTF-8 bytes (:func:`string_hashes`, vectorised) in an
    :class:`Int64Index`; a hit is confirmed by comparing the id with the one stored under that code,
    so a lookup costs the ids looked up (their bytes), never the dictionary: a window's rows, not its
    shard's users. Two ids of one hash are never merged: the index keeps the first, the others live
    in a small side table (a dict), consulted only for an id whose hash the index holds for another
    id. The ids are stored as one growing Arrow large-string buffer (offsets and bytes, capacity
    doubled when full), so :meth:`values` is a view, not a copy.
    """

    def __init__(self) -> None:
        self._n = 0
        self._offsets = np.zeros(1, dtype=np.int64)
        self._data = np.zeros(0, dtype=np.uint8)
        self._index = Int64Index()
        self._code_at = np.zeros(0, dtype=np.int64)  # the index's position -> the code of its id
        self._collided: dict[str, int] = {}  # ids whose hash an earlier, different id holds: id -> code

    def __len__(self) -> int:
        return self._n

    def codes(self, ids: pa.Array, *, add_missing: bool) -> np.ndarray:
        """Codes of ``ids`` (a string array without nulls); unknown ids get new codes if
        ``add_missing`` (first appearance order), else ``-1``."""
        ids = ids.cast(pa.large_string())
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        codes = self._lookup(ids)
        missing = codes < 0
        if add_missing and missing.any():
            unknown = ids.filter(pa.array(missing))
            fresh = pc.unique(unknown)  # in order of first appearance
            start = self._n
            self._append(fresh)
            found = pc.index_in(unknown, value_set=fresh).to_numpy(zero_copy_only=False)
            codes[missing] = start + found.astype(np.int64)
        return codes

    def _lookup(self, ids: pa.Array) -> np.ndarray:
        positions = self._index.lookup(_keys(ids))
        hit = np.flatnonzero(positions >= 0)
        codes = np.full(len(ids), -1, dtype=np.int64)
        if hit.size:
            codes[hit] = self._code_at[positions[hit]]
            # The index holds one id per hash: a hit is this id only if the id stored under it is.
            stored = self.values().take(pa.array(codes[hit], type=pa.int64()))
            same = pc.equal(stored, ids.take(pa.array(hit, type=pa.int64()))).to_numpy(zero_copy_only=False)
            other = hit[~same]
            if other.size:
                codes[other] = [self._collided.get(text, -1)
                                for text in ids.take(pa.array(other, type=pa.int64())).to_pylist()]
        return codes

    def _append(self, fresh: pa.Array) -> None:
        """Store ``fresh`` (distinct ids, none known) under the next codes, and index them."""
        n, count = self._n, len(fresh)
        offsets, data = _string_buffers(fresh)
        end = int(self._offsets[n])
        self._offsets = _room(self._offsets, n + 1 + count)
        self._data = _room(self._data, end + data.size)
        self._offsets[n + 1:n + 1 + count] = end + (offsets[1:] - offsets[0])
        self._data[end:end + data.size] = data
        self._n = n + count
        keys, codes = _keys(fresh), np.arange(n, n + count, dtype=np.int64)
        # The index keeps the first id of each hash; a later id of a hash it holds (or that an
        # earlier id of this batch takes) goes to the side table.
        first = np.zeros(count, dtype=bool)
        first[np.unique(keys, return_index=True)[1]] = True
        indexed = first & (self._index.lookup(keys) < 0)
        added = self._index.add(keys[indexed])
        self._code_at = _room(self._code_at, len(self._index))
        self._code_at[added] = codes[indexed]
        if not indexed.all():
            rest = np.flatnonzero(~indexed)
            self._collided.update(zip(fresh.take(pa.array(rest, type=pa.int64())).to_pylist(), codes[rest].tolist()))

    def values(self) -> pa.Array:
        """All string ids, indexed by code (a view of the stored buffers, no copy)."""
        return pa.LargeStringArray.from_buffers(self._n, pa.py_buffer(self._offsets[: self._n + 1]),
                                                pa.py_buffer(self._data[: int(self._offsets[self._n])]))


def _room(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` with room for ``size`` items (its capacity doubled when short), contents kept."""
    if size <= array.size:
        return array
    grown = np.zeros(max(size, 2 * array.size, 1024), dtype=array.dtype)
    grown[: array.size] = array
    return grown


def _string_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (``len + 1``, int64) and the UTF-8 bytes of a large-string array, zero-copy."""
    n = len(ids)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64, count=n + 1, offset=ids.offset * 8)
    raw = ids.buffers()[2]
    data = np.frombuffer(raw, dtype=np.uint8) if raw is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data[offsets[0]:offsets[-1]]


def _keys(ids: pa.Array) -> np.ndarray:
    """A 64-bit :class:`Int64Index` key per string id: equal ids, equal keys; unequal ids may share
    one, which :class:`StringCodes` resolves by comparing the ids."""
    keys = mix64(string_hashes(ids)).view(np.int64)
    return np.where(keys == _EMPTY, _EMPTY + 1, keys)


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BASE = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime, as the polynomial base


def mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijection on uint64 with good avalanche."""
    z = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def string_hashes(ids: pa.Array) -> np.ndarray:
    """A 64-bit polynomial hash of each string id's UTF-8 bytes (uint64), computed in NumPy with no
    loop over the ids: stable across processes and runs (:func:`renyi_stream.stream.engine.sharding.shard_of`
    assigns shards by it, so it must never change)."""
    ids = ids.cast(pa.large_string())
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64, count=n + 1, offset=ids.offset * 8)
    data_buffer = ids.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    start, stop = offsets[0], offsets[-1]
    data = data[start:stop].astype(np.uint64)
    lengths = np.diff(offsets)
    starts = offsets[:-1] - start
    # h = sum_j (byte_j + 1) * BASE^j  (mod 2^64); "+1" so that zero bytes still count.
    longest = int(lengths.max()) if n else 0
    powers = np.ones(max(longest, 1), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(1, longest):  # loop over character positions, not over ids
            powers[j] = powers[j - 1] * _BASE
        position = np.arange(data.size, dtype=np.int64) - np.repeat(starts, lengths)
        terms = (data + np.uint64(1)) * powers[position] if data.size else data
    hashes = np.zeros(n, dtype=np.uint64)
    nonempty = lengths > 0
    if data.size:
        sums = np.add.reduceat(terms, starts[nonempty]) if nonempty.any() else np.zeros(0, np.uint64)
        hashes[nonempty] = sums
    with np.errstate(over="ignore"):
        hashes += lengths.astype(np.uint64) * _M1  # distinguishes lengths
    return hashes
