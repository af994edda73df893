"""A worker's cache of restored shards, used only while it is exactly the committed keyed state.

The streaming filter (:class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter`) keeps a
shard's ledger in keyed state for the life of the job (invariant 1 (ledger-never-window-scoped,
docs/architecture.md)). Restoring it from there every window costs the whole shard: every
snapshot part unpickled and the :class:`renyi_stream.stream.ledger.Ledger` rebuilt. This cache keeps the
:class:`renyi_stream.stream.engine.shard_state.ShardState` a firing charged between firings, so a window costs
the users charged in it.

Soundness (a cached shard ahead of the committed state would charge its users twice, one behind
it would under-charge them: both break the filter's guarantee):

* every firing that changes a shard's keyed state also writes a **state token**, a fresh random id
  (:func:`new_token`), into the same keyed state, so the runner commits the token together with
  the ledger it describes, or neither (a bundle's state writes are committed atomically);
* the firing files its shard here under that token only after its last state write
  (:meth:`ShardCache.put`); a firing uses a cached shard only when its token is the token it reads
  from the committed state (:meth:`ShardCache.take`). A retried bundle (its writes discarded after
  its shard was filed), another worker, a restart or a rebalanced key all read a token that is
  not the cached one, or find nothing, and restore from the snapshot parts as before;
* :meth:`ShardCache.take` removes the entry: a firing owns the shard it charges, so a firing that
  fails half-way leaves nothing behind, and two firings never mutate one object.

Beam-free: the DoFn reads and writes the token in its keyed state and calls this.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Hashable

from renyi_stream.stream.engine.shard_state import ShardState

__all__ = ["ShardCache", "new_token"]


def new_token() -> str:
    """A fresh state token: 128 random bits as hex. Two firings never write the same token (the
    chance is 2**-128 per pair), so a token names exactly one firing's state writes."""
    return secrets.token_hex(16)


class ShardCache:
    """At most ``capacity`` shards, each filed under the state token it corresponds to; the least
    recently filed one is evicted first. ``capacity`` 0 caches nothing (every firing restores).

    ``hits`` and ``misses`` count :meth:`take` calls that returned a shard and those that did not.
    """

    def __init__(self, capacity: int) -> None:
        if int(capacity) != capacity or capacity < 0:
            raise ValueError(f"capacity must be an integer >= 0 (shards a worker holds), got capacity={capacity!r}")
        self.capacity = int(capacity)
        self._entries: OrderedDict[Hashable, tuple[str, ShardState]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: Hashable, token: str | None) -> ShardState | None:
        """The shard filed under ``key``, removed from the cache, if it was filed with ``token`` (the
        token read from the committed state); else None, and whatever was filed under ``key`` is
        dropped (it is not the committed state: ahead of it after a failed bundle, behind it after
        another worker charged the key). ``token`` None (no token committed yet, or the state was
        changed without one) never matches."""
        entry = self._entries.pop(key, None)
        if entry is not None and token is not None and entry[0] == token:
            self.hits += 1
            return entry[1]
        self.misses += 1
        return None

    def put(self, key: Hashable, token: str, shard: ShardState) -> None:
        """File ``shard`` under ``key`` as the state committed with ``token``: call it after the
        firing's last state write, with the token written there. Evicts the least recently filed
        shards beyond ``capacity``."""
        if self.capacity == 0:
            return
        self._entries.pop(key, None)
        self._entries[key] = (token, shard)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every shard (e.g. a worker that gives its keys back); the next firings restore."""
        self._entries.clear()
