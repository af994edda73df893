"""The vectorised id index under the ledger: exact lookups through growth and collisions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.stream.id_index import Int64Index, StringCodes


def test_positions_follow_insertion_order_and_survive_growth():
    index = Int64Index()
    rng = np.random.default_rng(2)
    keys = rng.choice(2**63 - 1, size=50_000, replace=False).astype(np.int64) - 2**62
    for chunk in np.array_split(keys, 7):
        index.add(chunk)
    assert len(index) == keys.size
    assert np.array_equal(index.lookup(keys), np.arange(keys.size))
    assert np.array_equal(index.keys_in_order(), keys)


def test_unknown_keys_give_minus_one():
    index = Int64Index()
    index.add(np.array([3, 5, 7]))
    assert index.lookup(np.array([5, 4, -7, 0])).tolist() == [1, -1, -1, -1]


def test_keys_that_collide_in_one_slot_are_all_found():
    index = Int64Index()
    candidates = np.random.default_rng(0).integers(0, 2**62, size=100_000)
    slots = index._slots(candidates)
    same_slot = candidates[slots == np.bincount(slots).argmax()][:60]  # one long probe chain
    assert same_slot.size == 60
    index.add(same_slot)
    assert np.array_equal(index.lookup(same_slot[::-1]), np.arange(60)[::-1])
    assert index.lookup(same_slot[:1] + 1).tolist() == [-1]


def test_the_reserved_key_is_refused():
    with pytest.raises(ValueError, match="reserved"):
        Int64Index().add(np.array([np.iinfo(np.int64).min]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**63) + 1, 2**63 - 1), max_size=300), max_size=6))
def test_lookup_agrees_with_a_dict(batches):
    index, reference = Int64Index(), {}
    for batch in batches:
        new = [k for k in dict.fromkeys(batch) if k not in reference]
        positions = index.add(np.array(new, dtype=np.int64))
        reference.update(zip(new, positions.tolist()))
        probe = np.array(batch + [1, -1, 12345], dtype=np.int64)
        assert index.lookup(probe).tolist() == [reference.get(k, -1) for k in probe.tolist()]


def test_string_codes_are_dense_and_stable():
    codes = StringCodes()
    first = codes.codes(pa.array(["b", "a", "b", "ü"]), add_missing=True)
    assert first.tolist() == [0, 1, 0, 2]
    again = codes.codes(pa.array(["ü", "z", "a"]), add_missing=False)
    assert again.tolist() == [2, -1, 1]
    assert codes.values().to_pylist() == ["b", "a", "ü"]
