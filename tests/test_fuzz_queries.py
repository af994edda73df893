"""Property-based fuzzing of query specs (issue 6): any spec is either a valid query, whose
evaluation on finite rows is a finite (n, dim) array, or a ValueError; never anything else."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.queries.linear import LinearQuery

COLUMNS = ["a", "b", "c"]
anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=10)
names = st.sampled_from(COLUMNS) | st.text(max_size=6)
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**6)
specs = st.one_of(
    st.fixed_dictionaries({"type": st.just("columns"), "columns": st.lists(names, max_size=5)}),
    st.fixed_dictionaries({"type": st.just("histogram"), "column": names, "categories": st.lists(numbers, max_size=6)}),
    st.fixed_dictionaries({"type": st.just("clamp"), "column": names, "lo": numbers, "hi": numbers}),
    st.fixed_dictionaries({"type": st.just("weighted"), "weights": st.dictionaries(names, numbers, max_size=4)}),
    st.dictionaries(st.text(max_size=6), anything, max_size=4),
    anything,
)
rows = st.integers(0, 20).flatmap(lambda n: st.lists(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=3, max_size=3), min_size=n, max_size=n))


@settings(max_examples=300, deadline=None)
@given(spec=specs, query_id=st.text(max_size=10) | st.just("q"), kind=st.sampled_from(["window", "running", "x"]),
       data=rows)
def test_a_spec_is_a_valid_query_or_a_value_error(spec, query_id, kind, data):
    try:
        query = LinearQuery(query_id, spec, kind=kind)
    except ValueError:
        return
    assert query.dim == len(query.labels) >= 1
    assert LinearQuery.from_json(query.to_json()) == query
    table = pa.table({c: pa.array([r[j] for r in data], type=pa.float64()) for j, c in enumerate(COLUMNS)})
    try:
        query.validate_against(COLUMNS)
    except ValueError:
        return
    values = query.evaluate(table)
    assert values.shape == (len(data), query.dim)
    # Finite inputs and finite weights give finite vectors, except when a huge weight times a
    # huge value overflows, which the ledger then refuses loudly (never a silent charge).
    weights = spec.get("weights", {}) if isinstance(spec, dict) else {}
    if all(abs(float(w)) < 1e300 for w in weights.values() if isinstance(w, (int, float)) and math.isfinite(w)):
        assert np.isfinite(values).all()
