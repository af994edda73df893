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

# One definition of the string hash (bytes -> uint64 polynomial) and the SplitMix64 finaliser, shared
# with the id index that keys string ids by them.
from renyi_stream.stream.id_index import mix64, string_hashes


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
            raw = string_hashes(user_ids)
        else:
            raw = np.asarray(user_ids.to_numpy(zero_copy_only=False), dtype=np.int64).view(np.uint64)
    else:
        raw = np.asarray(user_ids, dtype=np.int64).view(np.uint64)
    return (mix64(raw) % np.uint64(n_shards)).astype(np.int64)
