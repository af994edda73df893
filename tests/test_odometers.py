"""Odometers: the personal tracker (Algorithm 5) and Whitehouse et al.'s Theorem 2 family."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.stream.accounting import (
    Odometer,
    filter_odometer,
    mixture_odometer,
    rogers_odometer,
    stitched_odometer,
    tracker_update,
)
from renyi_stream.stream.accounting.odometers import tracker_reference

charges = st.lists(
    st.one_of(
        st.floats(min_value=0.0, max_value=5.0),
        st.sampled_from([0.0, 5e-324, 0.1, 0.25, 1.0, 2.0]),
    ),
    max_size=60,
)


def _vectorised(sequence: list[float], step: float) -> tuple[float, float]:
    segment, bound = np.zeros(1), np.full(1, step)
    for rho in sequence:
        segment, bound = tracker_update(segment, bound, np.array([rho]), step=step)
    return float(segment[0]), float(bound[0])


@settings(max_examples=300, deadline=None)
@given(sequence=charges, step=st.sampled_from([0.05, 0.1, 0.3, 1.0]))
def test_tracker_matches_algorithm_5_in_exact_arithmetic(sequence, step):
    segment, bound = _vectorised(sequence, step)
    ref_segment, ref_bound = tracker_reference(sequence, step=step)
    # Float rounding may open a filter a hair early (conservative), never late.
    assert ref_bound * (1 - 1e-12) <= bound <= ref_bound + step * (1 + 1e-9)
    if bound == pytest.approx(ref_bound, rel=1e-12):
        assert segment == pytest.approx(ref_segment, rel=1e-6, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(sequence=charges, step=st.sampled_from([0.05, 0.1, 0.3, 1.0]))
def test_tracker_bounds_the_total_charge_and_keeps_each_filter_within_delta(sequence, step):
    segment, bound = _vectorised(sequence, step)
    total = math.fsum(sequence)
    assert bound >= total
    assert 0.0 <= segment <= step
    assert bound <= step + total / (1 - 1e-9) + step * (1 + 1e-9)


def test_tracker_grows_by_delta_each_time_a_filter_fills():
    # Charges 0.4 with Delta = 1: 2.0 in all fills two filters and reaches into a third.
    segment, bound = _vectorised([0.4] * 5, 1.0)
    assert bound == 3.0
    assert segment == pytest.approx(0.0, abs=1e-8)
    segment, bound = _vectorised([0.4] * 2, 1.0)
    assert (segment, bound) == (pytest.approx(0.8), 1.0)


def test_a_charge_larger_than_delta_opens_as_many_filters_as_it_needs():
    segment, bound = _vectorised([2.5], 1.0)
    assert bound == 3.0
    assert segment == pytest.approx(0.5)


def test_tracker_starts_at_delta():
    segment, bound = _vectorised([], 0.2)
    assert (segment, bound) == (0.0, 0.2)


def test_tracker_refuses_negative_or_infinite_charges():
    with pytest.raises(ValueError, match="charge"):
        tracker_update(np.zeros(1), np.ones(1), np.array([-1.0]), step=1.0)
    with pytest.raises(ValueError, match="charge"):
        tracker_update(np.zeros(1), np.ones(1), np.array([np.inf]), step=1.0)


V = np.logspace(-6, 3, 400)
DELTA_PRIME = 1e-6
LOG2 = 2 * math.log(1 / DELTA_PRIME)


def _pointwise_advanced(v: np.ndarray) -> np.ndarray:
    return np.sqrt(LOG2 * v) + v / 2


def test_filter_odometer_is_tangent_to_advanced_composition_at_y_star():
    eps = 1.0
    y_star = (math.sqrt(LOG2 + eps) - math.sqrt(LOG2)) ** 2
    assert filter_odometer(y_star, epsilon=eps, delta_prime=DELTA_PRIME) == pytest.approx(
        math.sqrt(LOG2 * y_star) + y_star / 2, rel=1e-12
    )
    assert np.all(filter_odometer(V, epsilon=eps, delta_prime=DELTA_PRIME) >= _pointwise_advanced(V) * (1 - 1e-12))


@pytest.mark.parametrize("rho", [1e-3, 0.1, 1.0])
def test_mixture_odometer_is_its_formula_and_dominates_pointwise_composition(rho):
    v = 0.37
    expected = math.sqrt(2 * math.log(math.sqrt((v + rho) / rho) / DELTA_PRIME) * (rho + v)) + v / 2
    assert mixture_odometer(v, rho=rho, delta_prime=DELTA_PRIME) == pytest.approx(expected, rel=1e-12)
    assert np.all(mixture_odometer(V, rho=rho, delta_prime=DELTA_PRIME) >= _pointwise_advanced(V))


def test_stitched_odometer_is_infinite_below_v0_and_its_formula_above():
    v0 = 0.01
    assert stitched_odometer(v0 / 2, v0=v0, delta_prime=DELTA_PRIME) == math.inf
    v = 3.0
    expected = 1.7 * math.sqrt(v * (math.log(math.log(2 * v / v0)) + 0.72 * math.log(5.2 / DELTA_PRIME))) + v / 2
    assert stitched_odometer(v, v0=v0, delta_prime=DELTA_PRIME) == pytest.approx(expected, rel=1e-12)
    above = V[V >= v0]
    assert np.all(stitched_odometer(above, v0=v0, delta_prime=DELTA_PRIME) >= _pointwise_advanced(above))


def test_every_new_odometer_beats_rogers_somewhere_as_in_figure_3():
    n = 10**6
    rogers = rogers_odometer(V, n=n, delta_prime=DELTA_PRIME)
    assert np.any(filter_odometer(V, epsilon=1.0, delta_prime=DELTA_PRIME) < rogers)
    assert np.any(mixture_odometer(V, rho=0.1, delta_prime=DELTA_PRIME) < rogers)
    assert np.any(stitched_odometer(V, v0=1e-4, delta_prime=DELTA_PRIME) < rogers)
    # The stitched odometer's sqrt(v log log v) rate wins for large intrinsic time.
    assert stitched_odometer(1e3, v0=1e-4, delta_prime=DELTA_PRIME) < rogers_odometer(1e3, n=n, delta_prime=DELTA_PRIME)


def test_rogers_odometer_needs_delta_prime_at_most_one_over_e_and_n_at_least_2():
    with pytest.raises(ValueError, match="delta_prime"):
        rogers_odometer(0.1, n=100, delta_prime=0.5)
    with pytest.raises(ValueError, match="n must"):
        rogers_odometer(0.1, n=1, delta_prime=1e-6)


def test_odometer_tracks_the_intrinsic_time_and_goes_infinite_past_delta_double_prime():
    odo = Odometer("mixture", {"rho": 0.1, "delta_prime": 1e-6}, delta_double_prime=1.5e-7)
    for _ in range(10):
        odo.record(0.1, 1e-8)
    assert odo.variance == pytest.approx(0.1)
    assert odo.epsilon() == pytest.approx(float(mixture_odometer(0.1, rho=0.1, delta_prime=1e-6)))
    odo.record(0.1, 1e-7)
    assert odo.epsilon() == math.inf


def test_odometer_rejects_unknown_kinds_and_bad_parameters():
    with pytest.raises(ValueError, match="kind"):
        Odometer("magic", {})
    with pytest.raises(ValueError, match="v0"):
        Odometer("stitched", {"v0": 0.0, "delta_prime": 1e-6})
