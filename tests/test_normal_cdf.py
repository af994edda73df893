"""log Phi without scipy (renyi_stream.stream.accounting.normal) and the bisection behind every inverted budget
(renyi_stream.stream.accounting._bisect): the default calibration's two numerical parts."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

from renyi_stream.stream.accounting._bisect import first_true, last_true
from renyi_stream.stream.accounting.normal import log_ndtr, log_ndtr_scalar


def _relative_error(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return np.abs(ours - reference) / np.abs(reference)


@pytest.mark.parametrize("lo, hi", [(-1e4, -30.0), (-30.0, -5.0), (-5.0, 0.0), (0.0, 8.0)],
                         ids=["series", "far-tail", "near-tail", "upper-half"])
def test_log_ndtr_agrees_with_scipy_to_near_double_precision(lo, hi):
    x = np.linspace(lo, hi, 20_001)
    x = x[x != 0.0] if lo < 0.0 < hi else x
    # 1e-13: both are within about 1e-14 of a 40-digit reference (mpmath) on these ranges.
    assert _relative_error(log_ndtr(x), special.log_ndtr(x)).max() < 1e-13


def test_log_ndtr_keeps_relative_precision_where_phi_is_near_one():
    x = np.linspace(8.0, 37.0, 1_001)  # log Phi(x) = log1p(-Q(x)) ~ -Q(x), from 6e-16 down to 1e-300
    assert _relative_error(log_ndtr(x), special.log_ndtr(x)).max() < 1e-13


def test_log_ndtr_is_continuous_where_it_switches_to_the_series():
    below, at = log_ndtr_scalar(math.nextafter(-30.0, -math.inf)), log_ndtr_scalar(-30.0)
    assert at - 1e-13 * abs(at) < below < at  # decreasing, and no jump beyond rounding


def test_log_ndtr_has_the_exact_values_it_should():
    assert log_ndtr_scalar(0.0) == math.log(0.5)
    assert log_ndtr_scalar(-math.inf) == -math.inf
    assert log_ndtr_scalar(math.inf) == 0.0
    assert math.isnan(log_ndtr_scalar(math.nan))


def test_log_ndtr_of_an_array_is_its_scalar_values_to_the_bit():
    x = np.array([-1e6, -40.0, -30.0, -3.5, -1e-300, 0.0, 2.0, 40.0])
    assert log_ndtr(x).tolist() == [log_ndtr_scalar(float(v)) for v in x]
    assert isinstance(log_ndtr(1.5), float) and log_ndtr(np.float64(1.5)) == log_ndtr_scalar(1.5)


def test_last_true_returns_a_point_that_keeps_the_predicate_next_to_one_that_does_not():
    root = math.sqrt(2.0)
    found = last_true(lambda x: x * x <= 2.0, 0.0, 4.0)
    assert found * found <= 2.0 and math.nextafter(found, math.inf) ** 2 > 2.0
    assert found == pytest.approx(root, rel=1e-15)


def test_first_true_returns_a_point_that_keeps_the_predicate_next_to_one_that_does_not():
    found = first_true(lambda x: x * x >= 2.0, 0.0, 4.0)
    assert found * found >= 2.0 and math.nextafter(found, -math.inf) ** 2 < 2.0


def test_bisection_reaches_answers_far_below_its_bracket():
    found = last_true(lambda x: x <= 1e-300, 0.0, 1.0)  # ~1,000 halvings: the float range, not a loop
    assert found <= 1e-300 and math.nextafter(found, math.inf) > 1e-300


@pytest.mark.parametrize("finder", [last_true, first_true])
def test_bisection_refuses_an_empty_bracket_naming_both_ends(finder):
    with pytest.raises(ValueError, match=r"lo < hi, got lo=1\.0, hi=1\.0"):
        finder(lambda x: True, 1.0, 1.0)


def test_the_default_calibration_imports_no_scipy():
    # scipy.optimize and scipy.special cost every run about 0.25 s of imports; only zcdp-cks needs scipy.
    code = ("import sys; from renyi_stream.stream.accounting import calibrate, epsilon_for_budget; "
            "calibrate(epsilon=1.0, delta=1e-6, norm_budget=30.0); epsilon_for_budget(rho=0.1, delta=1e-6); "
            "calibrate(epsilon=1.0, delta=1e-6, norm_budget=30.0, accounting='zcdp-thm49'); "
            "print(sorted(m for m in sys.modules if m == 'scipy' or m.startswith('scipy.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
