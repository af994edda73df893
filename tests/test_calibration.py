"""Calibration: (epsilon, delta) and a squared-norm budget -> zCDP budget and noise std."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.stream.accounting.calibration import NOISE_HEADROOM
from renyi_stream.stream.accounting import (
    ACCOUNTINGS,
    calibrate,
    epsilon_for_budget,
    gdp_to_delta,
    noise_std_for,
    resume,
    zcdp_budget_for,
    zcdp_to_epsilon_cks,
)
from renyi_stream.stream.ledger import Ledger


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_noise_std_is_corollary_4_7(accounting):
    cal = calibrate(epsilon=0.5, delta=1e-6, norm_budget=10.0, accounting=accounting)
    assert cal.noise_std == pytest.approx(math.sqrt(10.0 / (2 * cal.rho)) * (1 + NOISE_HEADROOM), rel=1e-14)
    assert cal.mu == pytest.approx(math.sqrt(2 * cal.rho), rel=1e-14)
    assert noise_std_for(0.5, 1e-6, 10.0, accounting) == cal.noise_std


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_every_calibration_states_its_accounting(accounting):
    cal = calibrate(epsilon=1.0, delta=1e-5, norm_budget=1.0, accounting=accounting)
    assert cal.accounting == accounting
    assert cal.description


def test_gdp_calibration_meets_the_promise_tightly():
    cal = calibrate(epsilon=0.3, delta=1e-5, norm_budget=4.0, accounting="gdp")
    assert gdp_to_delta(cal.mu, 0.3) <= 1e-5
    assert gdp_to_delta(cal.mu * (1 + 1e-6), 0.3) > 1e-5 * (1 - 1e-4)


def test_cks_calibration_meets_the_promise():
    cal = calibrate(epsilon=0.3, delta=1e-5, norm_budget=4.0, accounting="zcdp-cks")
    assert zcdp_to_epsilon_cks(cal.rho, 1e-5) <= 0.3


def test_thm49_calibration_is_the_seed_b_star():
    log_inv = math.log(1e5)
    b_star = (math.sqrt(log_inv + 0.3) - math.sqrt(log_inv)) ** 2
    assert zcdp_budget_for(epsilon=0.3, delta=1e-5, accounting="zcdp-thm49") == pytest.approx(b_star, rel=1e-12)


def test_gdp_buys_about_twice_the_thm49_budget_at_eps_0_3_delta_1e_5():
    # docs/architecture.md, "The math": "At eps=0.3, delta=1e-5 this allows about 2x the zCDP budget of
    # Theorem 4.9".
    ratio = zcdp_budget_for(epsilon=0.3, delta=1e-5, accounting="gdp") / zcdp_budget_for(
        epsilon=0.3, delta=1e-5, accounting="zcdp-thm49"
    )
    assert 1.9 < ratio < 2.2


def test_accountings_order_from_least_to_most_noise():
    stds = [noise_std_for(0.3, 1e-5, 10.0, a) for a in ("gdp", "zcdp-cks", "zcdp-thm49")]
    assert stds[0] < stds[1] < stds[2]


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_epsilon_for_budget_inverts_the_calibration(accounting):
    rho = zcdp_budget_for(epsilon=0.7, delta=1e-6, accounting=accounting)
    assert epsilon_for_budget(rho=rho, delta=1e-6, accounting=accounting) == pytest.approx(0.7, rel=1e-6)


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
@pytest.mark.parametrize("norm_budget,windows", [(10.0, 40), (365.0, 1460), (3.0, 3)])
def test_a_user_contributing_exactly_the_norm_budget_is_never_filtered(accounting, norm_budget, windows):
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=norm_budget, accounting=accounting)
    ledger = Ledger(budget=cal.rho)
    per_window = math.sqrt(norm_budget / windows)  # squared norms sum to exactly B
    statuses = [ledger.admit([7], [[per_window]], noise_std=cal.noise_std).status[0] for _ in range(windows)]
    assert statuses == [0] * windows


@pytest.mark.parametrize("policy", ["drop", "clip"])
def test_a_worst_case_user_joins_exactly_b_over_c_squared_windows(policy):
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=10.0)
    ledger = Ledger(budget=cal.rho)
    results = [ledger.admit([7], [[1.0]], noise_std=cal.noise_std, policy=policy) for _ in range(12)]
    admitted = sum(int(r.status[0] == 0) for r in results)
    assert admitted == cal.worst_case_windows(1.0) == 10.0
    # The 11th window finds (almost) nothing left: under clip its share is below 1e-3 of a row.
    assert all(float(np.abs(r.contributions).max()) < 1e-3 for r in results[10:])
    assert cal.worst_case_windows(2.0) == 2.5


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(epsilon=0.0, delta=1e-5, norm_budget=1.0), "epsilon"),
        (dict(epsilon=-1.0, delta=1e-5, norm_budget=1.0), "epsilon"),
        (dict(epsilon=1.0, delta=1.0, norm_budget=1.0), "delta"),
        (dict(epsilon=1.0, delta=0.0, norm_budget=1.0), "delta"),
        (dict(epsilon=1.0, delta=1e-5, norm_budget=0.0), "norm_budget"),
        (dict(epsilon=1.0, delta=1e-5, norm_budget=1.0, accounting="rdp"), "accounting"),
    ],
)
def test_out_of_range_calibration_raises_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        calibrate(**kwargs)


# --- resume: a ledger keeps the budget it was started with ---------------------------------------


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_resume_keeps_a_recorded_budget_that_differs_from_this_calibration_in_its_last_bits(accounting):
    cal = calibrate(epsilon=0.5, delta=1e-6, norm_budget=10.0, accounting=accounting)
    recorded = cal.rho * (1 + 5e-13)  # another version's root finder, another libm
    kept = resume(cal, recorded)
    assert kept.rho == recorded
    assert kept.noise_std == math.sqrt(10.0 / (2 * recorded)) * (1 + NOISE_HEADROOM)
    assert (kept.epsilon, kept.delta, kept.norm_budget, kept.accounting) == (0.5, 1e-6, 10.0, accounting)


def test_resume_refuses_a_recorded_budget_above_the_promise_naming_it():
    cal = calibrate(epsilon=0.5, delta=1e-6, norm_budget=10.0)
    with pytest.raises(ValueError, match=r"recorded_rho must be at most .*got recorded_rho="):
        resume(cal, cal.rho * (1 + 1e-9))


def test_resume_keeps_a_smaller_recorded_budget_which_is_always_safe():
    cal = calibrate(epsilon=0.5, delta=1e-6, norm_budget=10.0)
    kept = resume(cal, cal.rho / 2)
    assert kept.rho == cal.rho / 2 and kept.noise_std > cal.noise_std


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_resume_refuses_a_recorded_budget_that_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match="recorded_rho"):
        resume(calibrate(epsilon=0.5, delta=1e-6, norm_budget=10.0), bad)


def test_a_calibration_is_resumed_from_its_own_budget_unchanged():
    cal = calibrate(epsilon=0.5, delta=1e-6, norm_budget=10.0)
    assert resume(cal, cal.rho) == cal


# --- property: every calibrated budget keeps its promise, across the whole parameter range -------

_LOG_EPSILON = st.floats(min_value=-6.0, max_value=2.0)  # epsilon = 10^x: 1e-6 .. 100
_LOG_DELTA = st.floats(min_value=-300.0, max_value=-0.5)  # delta = 10^x: 1e-300 .. 0.32


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_LOG_EPSILON, _LOG_DELTA)
def test_a_gdp_calibration_keeps_its_promise_anywhere(log_epsilon, log_delta):
    epsilon, delta = 10.0**log_epsilon, 10.0**log_delta
    cal = calibrate(epsilon=epsilon, delta=delta, norm_budget=1.0, accounting="gdp")
    assert cal.rho > 0 and gdp_to_delta(cal.mu, epsilon) <= delta
    assert epsilon_for_budget(rho=cal.rho, delta=delta) >= epsilon * (1 - 1e-6)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_LOG_EPSILON, st.floats(min_value=-100.0, max_value=-0.5))
def test_a_zcdp_cks_calibration_keeps_its_promise_anywhere(log_epsilon, log_delta):
    epsilon, delta = 10.0**log_epsilon, 10.0**log_delta
    cal = calibrate(epsilon=epsilon, delta=delta, norm_budget=1.0, accounting="zcdp-cks")
    assert cal.rho > 0 and zcdp_to_epsilon_cks(cal.rho, delta) <= epsilon
