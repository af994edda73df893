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


# --- string ids: a persistent index, so a lookup costs the ids looked up (issue 30, item 3) ----------

@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.text(max_size=6), max_size=40), st.booleans()), max_size=8))
def test_string_codes_agree_with_a_dict(batches):
    codes, reference = StringCodes(), {}
    for batch, add in batches:
        got = codes.codes(pa.array(batch, type=pa.string()), add_missing=add)
        if add:
            for text in batch:
                reference.setdefault(text, len(reference))
        assert got.tolist() == [reference.get(text, -1) for text in batch]
        assert codes.values().to_pylist() == list(reference) and len(codes) == len(reference)


@pytest.mark.parametrize("keys", ["one key for every id", "a key per length"])
def test_ids_whose_hashes_collide_keep_codes_of_their_own(monkeypatch, keys):
    """Unequal ids of one hash are never merged (two users sharing a ledger row would be a privacy
    failure): the index keeps the first id of a hash, the others are found in the side table."""
    import renyi_stream.stream.id_index as id_index

    def colliding(ids):
        lengths = pa.compute.utf8_length(ids.cast(pa.large_string())).to_numpy(zero_copy_only=False)
        return np.zeros(len(ids), dtype=np.int64) if keys == "one key for every id" else lengths.astype(np.int64)

    monkeypatch.setattr(id_index, "_keys", colliding)
    codes = StringCodes()
    words = ["ab", "cd", "ab", "efg", "", "hij", "cd"]
    assert codes.codes(pa.array(words), add_missing=True).tolist() == [0, 1, 0, 2, 3, 4, 1]
    assert codes.codes(pa.array(["hij", "zz", "efg", "ab", ""]), add_missing=False).tolist() == [4, -1, 2, 0, 3]
    assert codes.codes(pa.array(["zz", "cd", "kl"]), add_missing=True).tolist() == [5, 1, 6]
    assert codes.values().to_pylist() == ["ab", "cd", "efg", "", "hij", "zz", "kl"]


def test_a_lookup_works_on_the_ids_it_is_given_never_on_the_whole_dictionary(monkeypatch):
    """The dictionary holds 50,000 ids; looking up ten, or adding ten new ones, hashes, compares and
    indexes arrays of at most ten ids: ``pc.index_in`` over the whole dictionary (what each lookup
    did before) is never called. (Its stored buffers grow by doubling: an append copies them
    only when full, amortised over the ids added.)"""
    import renyi_stream.stream.id_index as id_index

    codes = StringCodes()
    codes.codes(pa.array([f"user-{i}" for i in range(50_000)]), add_missing=True)
    sizes: list[tuple[str, int]] = []

    def spy(name, function):
        def wrapped(*args, **kwargs):
            sizes.append((name, max([len(a) for a in args if hasattr(a, "__len__")]
                                    + [len(v) for v in kwargs.values() if hasattr(v, "__len__")], default=0)))
            return function(*args, **kwargs)
        return wrapped

    for name in ("index_in", "equal", "unique", "filter"):
        monkeypatch.setattr(id_index.pc, name, spy(name, getattr(id_index.pc, name)), raising=False)
    monkeypatch.setattr(id_index, "_keys", spy("keys", id_index._keys))
    looked_up = [f"user-{i}" for i in range(0, 50_000, 5_000)]
    assert codes.codes(pa.array(looked_up), add_missing=False).tolist() == list(range(0, 50_000, 5_000))
    fresh = [f"new-{i}" for i in range(10)]
    assert codes.codes(pa.array(fresh + looked_up[:3]), add_missing=True).tolist() == \
        list(range(50_000, 50_010)) + [0, 5_000, 10_000]
    assert {name for name, _ in sizes} >= {"keys", "equal", "index_in"}
    assert [(name, size) for name, size in sizes if size > 13] == []
    assert codes.values().to_pylist()[-10:] == fresh and len(codes) == 50_010
