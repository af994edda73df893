"""Stable, vectorised user -> shard assignment.

The individual filter runs keyed by ``hash(user) % n_shards`` (docs/architecture.md, "Keyed by
shard"). The hash must be the same in every process and every run (a user whose shard changed
between days would find an empty ledger there: a fresh budget, a privacy bug), so Python's
salted ``hash`` is out. Int64 ids are mixed with SplitMix64's finaliser; string ids are hashed over their
UTF-8 bytes with a 64-bit polynomial hash computed in NumPy (no Python loop per id), then
mixed the same way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BASE = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime, as the polynomial base


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijection on uint64 with good avalanche."""
    z = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def _string_hashes(ids: pa.Array) -> np.ndarray:
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


def shard_of(user_ids: pa.Array | pa.ChunkedArray | np.ndarray, n_shards: int) -> np.ndarray:
    """The shard (0..n_shards-1) of each user id: int64 for ints, int64 for strings.

    Deterministic across processes, runs and machines; uniform for any id distribution.
    """
    if isinstance(n_shards, bool) or not isinstance(n_shards, (int, np.integer)) or n_shards < 1:
        raise ValueError(f"n_shards must be an integer >= 1, got n_shards={n_shards!r}")
    if isinstance(user_ids, pa.ChunkedArray):
        user_ids = user_ids.combine_chunks()
    if isinstance(user_ids, pa.Array):
        if pa.types.is_string(user_ids.type) or pa.types.is_large_string(user_ids.type):
            raw = _string_hashes(user_ids)
        else:
            raw = np.asarray(user_ids.to_numpy(zero_copy_only=False), dtype=np.int64).view(np.uint64)
    else:
        raw = np.asarray(user_ids, dtype=np.int64).view(np.uint64)
    return (_mix(raw) % np.uint64(n_shards)).astype(np.int64)
