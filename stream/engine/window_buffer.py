"""A shard's rows held for windows not yet charged, in a small timing wheel of state bags.

The streaming filter buffers each window's rows until the watermark passes the window's end
(invariant 2 (charge-in-event-time-order, docs/architecture.md)). A replay delivers every window's
rows before the first timer fires, so one bag of every buffered window, read whole and rewritten
without the charged window's rows at every window, cost work quadratic in the windows. Beam's
Python SDK has no map state, so the rows are spread over a fixed set of bags by window, a
two-level timing wheel (``WIDTH`` = 8):

* ``ring[w % 8]``: the rows of window ``w`` of the current block (``w // 8 == next // 8``, ``next``
  the next window to charge). Each ring bag holds one window's rows: charging ``w`` reads exactly
  its own bag, and nothing else.
* ``blocks[(w // 8) % 8]``: the rows of a later block of the current superblock (``w // 64 ==
  next // 64``). Each holds one block; it is read once, when its block becomes the current one,
  and its rows move to the ring.
* ``later``: every window after the current superblock; read once per superblock (every 64
  windows), when it holds rows of the superblock that begins, which move to the blocks and ring.

So a window's rows are read where they are charged once, and moved at most twice before; the only
re-reading is of ``later`` every 64 windows. ``held`` (a small read/write value,
``{window: rows}``) counts the rows buffered per window, so that an empty bag is never read, and a
shard's books count the rows held for later windows without reading them
(:class:`renyi_stream.stream.engine.shard_state.ShardBooks`: a window whose bag holds other rows than counted
does not balance).

Beam-free: the bags are anything with ``add``, ``read`` and ``clear`` (Beam's bag state), ``held``
anything with ``read`` and ``write``; parts are opaque (the filter's packed rows) and never decoded
here.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

#: Windows per block and blocks per superblock of the wheel: the filter declares ``WIDTH`` ring
#: bags, ``WIDTH`` block bags and one ``later`` bag.
WIDTH = 8
SUPER = WIDTH * WIDTH
RING, BLOCK, LATER = "ring", "block", "later"


class Bag(Protocol):
    def add(self, item: Any) -> None: ...

    def read(self) -> Iterable[Any]: ...

    def clear(self) -> None: ...


class Value(Protocol):
    def read(self) -> Any: ...

    def write(self, value: Any) -> None: ...


def place(window: int, next_window: int) -> tuple[str, int]:
    """Where the rows of ``window`` (at or after ``next_window``, the next window to charge) are
    held: ``(RING, window % WIDTH)``, ``(BLOCK, (window // WIDTH) % WIDTH)`` or ``(LATER, 0)``."""
    window, next_window = int(window), int(next_window)
    if window < next_window:
        raise ValueError(f"window must not be before next_window={next_window} (charged windows hold no rows), "
                         f"got window={window}")
    if window // WIDTH == next_window // WIDTH:
        return RING, window % WIDTH
    if window // SUPER == next_window // SUPER:
        return BLOCK, (window // WIDTH) % WIDTH
    return LATER, 0


class WindowBuffer:
    """One shard's buffered rows (module docstring), over its keyed state: ``ring`` and ``blocks``
    (``WIDTH`` bags each), ``later`` (a bag) and ``held`` (a value, ``{window: rows}``).

    :attr:`parts_read` and :attr:`bags_read` count what this object read (for the filter's Beam
    counters and tests)."""

    def __init__(self, *, ring: Sequence[Bag], blocks: Sequence[Bag], later: Bag, held: Value) -> None:
        if len(ring) != WIDTH or len(blocks) != WIDTH:
            raise ValueError(f"a window buffer takes {WIDTH} ring and {WIDTH} block bags, got {len(ring)} and "
                             f"{len(blocks)}")
        self._ring, self._blocks, self._later, self._held = list(ring), list(blocks), later, held
        self.parts_read = 0
        self.bags_read = 0

    def _bag(self, where: tuple[str, int]) -> Bag:
        kind, slot = where
        return self._ring[slot] if kind == RING else self._blocks[slot] if kind == BLOCK else self._later

    def _read(self, bag: Bag) -> list[tuple[int, Any]]:
        items = [(int(w), part) for w, part in bag.read()]
        self.bags_read += 1
        self.parts_read += len(items)
        return items

    def held(self) -> dict[int, int]:
        """Rows held per window (a copy)."""
        return dict(self._held.read() or {})

    def held_rows(self) -> int:
        """Rows held for every window not yet charged, read from the counts (no bag is read)."""
        return sum(self.held().values())

    def add(self, parts: Iterable[tuple[int, Any, int]], *, next_window: int) -> None:
        """Hold ``(window, part, rows)`` parts (windows at or after ``next_window``), each in the bag
        of its window (:func:`place`), and count their rows."""
        counts = self.held()
        for window, part, rows in parts:
            self._bag(place(window, next_window)).add((int(window), part))
            counts[int(window)] = counts.get(int(window), 0) + int(rows)
        self._held.write(counts)

    def take(self, window: int) -> tuple[list[Any], int]:
        """The parts held for ``window``, the next window to charge, and the rows counted for it;
        both leave the buffer. Reads ``window``'s ring bag only, and only when rows are counted for
        it. RuntimeError when that bag holds another window's rows (the wheel is broken: charging
        them now would charge a window out of order)."""
        counts = self.held()
        expected = counts.pop(int(window), 0)
        if not expected:
            return [], 0
        bag = self._bag(place(window, window))
        items = self._read(bag)
        others = sorted({w for w, _ in items if w != int(window)})
        if others:
            raise RuntimeError(f"the ring bag of window {window} holds rows of window(s) {others[:5]}: the shard's "
                               "buffer is inconsistent")
        bag.clear()
        self._held.write(counts)
        return [part for _, part in items], expected

    def advance(self, next_window: int) -> None:
        """After the window before ``next_window`` was charged (and taken): at a block or superblock
        boundary, move the rows of the block (superblock) that begins from the bag that held them to
        their place in the wheel. Reads a bag only when rows are counted for that block or superblock."""
        next_window = int(next_window)
        counts = self.held()
        if next_window % SUPER == 0:
            # Every block bag is empty here (the superblock before had exactly one block per bag).
            if any(w // SUPER == next_window // SUPER for w in counts):
                items = self._read(self._later)
                self._later.clear()
                for w, part in items:
                    self._bag(place(w, next_window)).add((w, part))
        elif next_window % WIDTH == 0 and any(w // WIDTH == next_window // WIDTH for w in counts):
            bag = self._blocks[(next_window // WIDTH) % WIDTH]
            items = self._read(bag)
            bag.clear()
            for w, part in items:
                where = place(w, next_window)
                if where[0] != RING:
                    raise RuntimeError(f"the block bag of window {next_window} holds rows of window {w}: the shard's "
                                       "buffer is inconsistent")
                self._bag(where).add((w, part))


__all__ = ["BLOCK", "LATER", "RING", "SUPER", "WIDTH", "WindowBuffer", "place"]
