"""The filter's buffered rows in event-time order, duplicates split off: the fast paths
(already sorted input, dense integer ids) agree with the general sort and hash grouping."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from renyi_stream.pipelines.beam.rows import event_time_order, in_event_time_order

ROW_COLUMNS = ("user_id", "window_id", "_source", "_row")


def _reference(parts: list[pa.Table]) -> tuple[list[tuple], list[tuple]]:
    """The definition, row by row: sort by (window, source, row), keep each (user, window)'s first."""
    rows = [r for t in parts for r in zip(*(t.column(c).to_pylist() for c in ROW_COLUMNS))]
    rows.sort(key=lambda r: (r[1], r[2], r[3]))
    seen, kept, dups = set(), [], []
    for r in rows:
        (dups if (r[0], r[1]) in seen else kept).append(r)
        seen.add((r[0], r[1]))
    return kept, dups


def _parts(rng: np.random.Generator, *, ids: str, duplicates: bool, shuffled: bool) -> list[pa.Table]:
    parts = []
    for source in range(4):
        for first_row in range(0, 600, 200):  # three batches per file
            n = 200
            window = 20_500 + rng.integers(0, 3, size=n) if source == 3 else np.full(n, 20_500 + source)
            if ids == "sorted":
                users = np.arange(first_row, first_row + n)
            elif ids == "dense":
                users = rng.permutation(1_000)[:n]
            elif ids == "sparse":
                users = rng.integers(-2**62, 2**62, size=n)
            else:
                users = np.array([f"user-{u}" for u in rng.permutation(1_000)[:n]], dtype=object)
            if duplicates:
                users[5:9] = users[0]  # repeats inside the batch
                if first_row:  # and across batches of one file
                    users[10] = parts[-1].column("user_id")[3].as_py()
            parts.append(pa.table({
                "user_id": pa.array(users, type=pa.string() if ids == "strings" else pa.int64()),
                "window_id": pa.array(window, type=pa.int64()),
                "_source": pa.array(np.full(n, source), type=pa.int64()),
                "_row": pa.array(np.arange(first_row, first_row + n), type=pa.int64()),
            }))
    if shuffled:
        parts = [parts[i] for i in rng.permutation(len(parts))]
    return parts


@pytest.mark.parametrize("ids", ["sorted", "dense", "sparse", "strings"])
@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("shuffled", [False, True])
def test_rows_come_out_in_event_time_order_with_each_user_windows_first_row_kept(ids, duplicates, shuffled):
    parts = _parts(np.random.default_rng(7), ids=ids, duplicates=duplicates, shuffled=shuffled)
    kept, dead = in_event_time_order(parts)
    want_kept, want_dups = _reference(parts)
    assert list(zip(*(kept.column(c).to_pylist() for c in ROW_COLUMNS))) == want_kept
    assert dead.num_rows == len(want_dups)
    assert dead.column("row_index").to_pylist() == [r[3] for r in want_dups]
    assert set(dead.column("reason").to_pylist()) <= {"duplicate_user_window"}


def test_rows_already_in_event_time_order_are_not_reordered():
    table = pa.table({"window_id": pa.array([1, 1, 2, 2], type=pa.int64()),
                      "_source": pa.array([0, 1, 0, 0], type=pa.int64()),
                      "_row": pa.array([5, 0, 1, 9], type=pa.int64())})
    assert event_time_order(table) is None


def test_keys_too_wide_to_pack_are_ordered_by_a_three_key_sort():
    table = pa.table({"window_id": pa.array([3, 1, 1], type=pa.int64()),
                      "_source": pa.array([0, 2**40, 0], type=pa.int64()),
                      "_row": pa.array([0, 0, 2**40], type=pa.int64())})
    assert event_time_order(table).tolist() == [2, 1, 0]
