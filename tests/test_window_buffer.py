"""A shard's buffered rows in a two-level timing wheel of bags (issue 30, item 2).

The streaming filter held every buffered window's rows in one bag, read whole and rewritten
without the charged window's rows at every window: quadratic in the windows a replay buffers
ahead. :class:`renyi_stream.stream.engine.window_buffer.WindowBuffer` keeps them in bags by window, so a window
reads its own bag only and a part is moved a bounded number of times. Counts, not time: bags that
record what each read returned.
"""

from __future__ import annotations

import numpy as np
import pytest

from renyi_stream.stream.engine.window_buffer import SUPER, WIDTH, WindowBuffer, place

W0 = 20513  # 2026-03-01: inside a block and a superblock, as a real schedule starts


class _Bag:
    """A bag that records the items each read returned."""

    def __init__(self) -> None:
        self.items: list = []
        self.reads: list[list] = []

    def add(self, item) -> None:
        self.items.append(item)

    def read(self):
        self.reads.append(list(self.items))
        return list(self.items)

    def clear(self) -> None:
        self.items = []


class _Value:
    def __init__(self) -> None:
        self.value = None

    def read(self):
        return self.value

    def write(self, value) -> None:
        self.value = value


def _buffer() -> tuple[WindowBuffer, dict]:
    bags = {"ring": [_Bag() for _ in range(WIDTH)], "blocks": [_Bag() for _ in range(WIDTH)], "later": _Bag(),
            "held": _Value()}
    return WindowBuffer(ring=bags["ring"], blocks=bags["blocks"], later=bags["later"], held=bags["held"]), bags


def _reads(bags: dict) -> list[list]:
    return [r for bag in [*bags["ring"], *bags["blocks"], bags["later"]] for r in bag.reads]


def _ring_reads(bags: dict) -> list[list]:
    return [r for bag in bags["ring"] for r in bag.reads]


def _forget_reads(bags: dict) -> None:
    for bag in [*bags["ring"], *bags["blocks"], bags["later"]]:
        bag.reads = []


def test_each_window_is_placed_in_its_own_ring_bag_its_blocks_bag_or_later():
    assert place(W0, W0) == ("ring", W0 % WIDTH)
    assert place(W0 + 6, W0) == ("ring", (W0 + 6) % WIDTH)  # the same block (W0 is its second window)
    assert place(W0 + 7, W0) == ("block", ((W0 + 7) // WIDTH) % WIDTH)  # the next block
    first_later = (W0 // SUPER + 1) * SUPER
    assert place(first_later - 1, W0)[0] == "block" and place(first_later, W0) == ("later", 0)
    with pytest.raises(ValueError, match="next_window"):
        place(W0 - 1, W0)  # a charged window holds no rows


@pytest.mark.parametrize("windows", [30, 365])
def test_a_replay_buffered_ahead_reads_each_windows_own_bag_and_moves_each_part_a_bounded_number_of_times(windows):
    """Every window's rows buffered before the first is charged (a replay on the FnApiRunner): each
    charge reads one bag holding exactly its window's parts; the rest is moves at block and
    superblock starts. One bag read whole every window read a part once per window before its own."""
    buffer, bags = _buffer()
    parts = {W0 + w: [f"part-{w}-{k}" for k in range(1 + w % 3)] for w in range(windows)}
    buffer.add([(w, p, 10) for w, ps in parts.items() for p in ps], next_window=W0)
    assert buffer.held_rows() == 10 * sum(len(ps) for ps in parts.values())
    total = sum(len(ps) for ps in parts.values())
    for w in range(W0, W0 + windows):
        _forget_reads(bags)
        taken, rows = buffer.take(w)
        assert (taken, rows) == (parts[w], 10 * len(parts[w]))  # its own parts, in the order they came
        assert _reads(bags) == [[(w, p) for p in parts[w]]]  # one bag read, holding nothing else
        buffer.advance(w + 1)
        assert buffer.held_rows() == 10 * sum(len(parts[v]) for v in range(w + 1, W0 + windows))
    assert all(not bag.items for bag in [*bags["ring"], *bags["blocks"], bags["later"]])
    # Each part is read when charged and moved at most twice, plus once per superblock start that
    # found it still later (64 windows each): linear in the parts for a month, ~4.7 each for a year.
    read = buffer.parts_read
    assert read <= total * (3 + windows // SUPER)
    whole_bag_every_window = sum(len(ps) * (i + 1) for i, ps in enumerate(parts.values()))
    assert read * 8 < whole_bag_every_window
    if windows < SUPER:
        assert read <= 2 * total


def test_rows_that_arrive_while_windows_are_charged_are_taken_with_their_window_exactly_once():
    """A stream: parts of windows up to 150 ahead arrive in random order between charges; every
    charge takes exactly the parts of its window, each once, whatever arrived when."""
    rng = np.random.default_rng(3)
    buffer, bags = _buffer()
    expected: dict[int, list] = {}
    next_window, end, serial = W0, W0 + 300, 0
    while next_window <= end:
        if rng.random() < 0.6:
            batch = []
            for _ in range(int(rng.integers(1, 5))):
                w = int(min(end, next_window + rng.integers(0, 150)))
                serial += 1
                batch.append((w, f"p{serial}", 1))
                expected.setdefault(w, []).append(f"p{serial}")
            buffer.add(batch, next_window=next_window)
            continue
        _forget_reads(bags)
        taken, rows = buffer.take(next_window)
        assert taken == expected.pop(next_window, []) and rows == len(taken)
        assert all(w == next_window for read in _ring_reads(bags) for w, _ in read)
        buffer.advance(next_window + 1)
        next_window += 1
    assert expected == {} and buffer.held() == {}


def test_a_window_without_rows_reads_no_bag():
    buffer, bags = _buffer()
    buffer.add([(W0 + 2, "p", 1)], next_window=W0)
    assert buffer.take(W0) == ([], 0) and buffer.take(W0 + 1) == ([], 0)
    assert _reads(bags) == [] and buffer.bags_read == 0
    assert buffer.take(W0 + 2) == (["p"], 1)


def test_a_ring_bag_holding_another_windows_rows_is_refused_not_charged():
    buffer, bags = _buffer()
    buffer.add([(W0, "mine", 1)], next_window=W0)
    bags["ring"][W0 % WIDTH].add((W0 + WIDTH, "another window's"))  # what a broken wheel would hold
    with pytest.raises(RuntimeError, match=f"ring bag of window {W0} holds rows of window"):
        buffer.take(W0)


def test_a_window_buffer_takes_a_full_wheel_of_bags():
    with pytest.raises(ValueError, match=f"{WIDTH} ring and {WIDTH} block bags"):
        WindowBuffer(ring=[_Bag()], blocks=[_Bag() for _ in range(WIDTH)], later=_Bag(), held=_Value())
