"""Conversions between zCDP, RDP, GDP and (epsilon, delta), each against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from renyi_stream.stream.accounting import conversions as cv

DELTAS = [1e-3, 1e-5, 1e-9]
RHOS = [1e-4, 0.01, 0.5, 3.0]


def _grid_min_fact24(rho: float, delta: float) -> float:
    alphas = 1.0 + np.logspace(-6, 6, 200_001)
    return float(np.min(alphas * rho + math.log(1 / delta) / (alphas - 1.0)))


def _grid_min_cks(rho: float, delta: float) -> float:
    alphas = 1.0 + np.logspace(-6, 6, 200_001)
    return float(np.min(alphas * rho + np.log1p(-1 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1)))


def _gaussian_delta_by_integration(mu: float, eps: float) -> float:
    """delta(eps) = E[(1 - e^(eps - L))_+] with the privacy loss L ~ N(mu^2/2, mu^2) (Dong et al.)."""
    mean, sd = mu * mu / 2, mu

    def integrand(loss: float) -> float:
        return (1.0 - math.exp(eps - loss)) * stats.norm.pdf(loss, mean, sd)

    value, _ = integrate.quad(integrand, eps, mean + 40 * sd, limit=400, epsabs=1e-14, epsrel=1e-10)
    return value


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_thm49_epsilon_is_fact24_minimised_over_alpha(rho, delta):
    assert cv.zcdp_to_epsilon_thm49(rho, delta) == pytest.approx(_grid_min_fact24(rho, delta), rel=1e-6)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", [0.1, 0.3, 1.0, 8.0])
def test_thm49_budget_is_the_closed_form_b_star(epsilon, delta):
    log_inv = math.log(1 / delta)
    closed = (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2
    assert cv.epsilon_to_zcdp_thm49(epsilon, delta) == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", [0.1, 0.3, 1.0, 8.0])
def test_thm49_round_trips(epsilon, delta):
    rho = cv.epsilon_to_zcdp_thm49(epsilon, delta)
    assert cv.zcdp_to_epsilon_thm49(rho, delta) == pytest.approx(epsilon, rel=1e-12)
    assert cv.zcdp_to_delta_thm49(rho, epsilon) == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_cks_epsilon_matches_a_brute_force_minimum_over_alpha(rho, delta):
    assert cv.zcdp_to_epsilon_cks(rho, delta) == pytest.approx(_grid_min_cks(rho, delta), rel=1e-6)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_cks_is_tighter_than_thm49_and_looser_than_the_exact_gaussian(rho, delta):
    eps_cks = cv.zcdp_to_epsilon_cks(rho, delta)
    assert eps_cks <= cv.zcdp_to_epsilon_thm49(rho, delta)
    # A Gaussian mechanism with charge rho is exactly sqrt(2 rho)-GDP: no valid zCDP conversion
    # can promise less than its exact epsilon.
    assert eps_cks >= cv.gdp_to_epsilon(math.sqrt(2 * rho), delta) * (1 - 1e-9)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", [0.1, 0.3, 1.0, 8.0])
def test_cks_inverse_is_on_the_safe_side_and_tight(epsilon, delta):
    rho = cv.epsilon_to_zcdp_cks(epsilon, delta)
    assert cv.zcdp_to_epsilon_cks(rho, delta) <= epsilon
    assert cv.zcdp_to_epsilon_cks(rho * (1 + 1e-8), delta) > epsilon * (1 - 1e-7)
    assert rho >= cv.epsilon_to_zcdp_thm49(epsilon, delta)


@pytest.mark.parametrize("rho", RHOS)
def test_cks_delta_is_the_inverse_of_cks_epsilon(rho):
    eps = cv.zcdp_to_epsilon_cks(rho, 1e-6)
    assert cv.zcdp_to_delta_cks(rho, eps) == pytest.approx(1e-6, rel=1e-4)


@pytest.mark.parametrize("mu,eps", [(0.1, 0.05), (0.5, 0.3), (1.0, 1.0), (2.0, 3.0), (0.05, 0.3)])
def test_gdp_delta_matches_numerical_integration_of_the_privacy_loss(mu, eps):
    assert cv.gdp_to_delta(mu, eps) == pytest.approx(_gaussian_delta_by_integration(mu, eps), rel=1e-6, abs=1e-15)


def test_gdp_delta_has_the_published_value_at_mu_1_eps_1():
    # Dong, Roth & Su (2019), Figure/Table: 1-GDP at eps=1 has delta = 0.1269...
    assert cv.gdp_to_delta(1.0, 1.0) == pytest.approx(0.126936737507, rel=1e-9)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("mu", [0.01, 0.3, 1.0, 4.0])
def test_gdp_epsilon_round_trips(mu, delta):
    eps = cv.gdp_to_epsilon(mu, delta)
    assert cv.gdp_to_delta(mu, eps) <= delta
    assert cv.gdp_to_delta(mu, eps) == pytest.approx(delta, rel=1e-6)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0, 5.0])
def test_gdp_mu_round_trips_and_is_on_the_safe_side(epsilon, delta):
    mu = cv.epsilon_to_gdp(epsilon, delta)
    assert cv.gdp_to_delta(mu, epsilon) <= delta
    assert cv.gdp_to_delta(mu * (1 + 1e-7), epsilon) > delta * (1 - 1e-5)
    assert cv.gdp_to_epsilon(mu, delta) == pytest.approx(epsilon, rel=1e-6)


def test_gdp_and_zcdp_units_convert_for_gaussian_mechanisms():
    assert cv.gdp_to_zcdp(0.4) == pytest.approx(0.08)
    assert cv.zcdp_to_gdp(0.08) == pytest.approx(0.4)


def test_rdp_curve_of_a_gaussian_reproduces_the_zcdp_conversion():
    rho, delta = 0.05, 1e-6
    orders = np.concatenate([1 + np.logspace(-3, 0, 200), np.linspace(2, 512, 4000)])
    eps_curve = cv.rdp_to_epsilon(orders, orders * rho, delta)
    assert eps_curve >= cv.zcdp_to_epsilon_cks(rho, delta) * (1 - 1e-9)
    assert eps_curve == pytest.approx(cv.zcdp_to_epsilon_cks(rho, delta), rel=1e-3)


def test_rdp_curve_delta_is_the_inverse_of_its_epsilon():
    orders = np.arange(2, 257, dtype=float)
    rdp = orders * 0.02
    eps = cv.rdp_to_epsilon(orders, rdp, 1e-5)
    assert cv.rdp_to_delta(orders, rdp, eps) <= 1e-5 * (1 + 1e-9)
    assert cv.rdp_to_delta(orders, rdp, eps * 0.9) > 1e-5


def test_rdp_curve_takes_the_best_order():
    # Only order 8 is tight; the conversion must use it.
    eps_all = cv.rdp_to_epsilon([2.0, 8.0, 64.0], [10.0, 0.1, 10.0], 1e-5)
    eps_one = cv.rdp_to_epsilon([8.0], [0.1], 1e-5)
    assert eps_all == eps_one


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: cv.zcdp_to_epsilon_thm49(-1.0, 1e-5), "rho"),
        (lambda: cv.zcdp_to_epsilon_thm49(0.1, 1.0), "delta"),
        (lambda: cv.zcdp_to_epsilon_cks(0.1, 0.0), "delta"),
        (lambda: cv.epsilon_to_zcdp_thm49(0.0, 1e-5), "epsilon"),
        (lambda: cv.epsilon_to_zcdp_cks(-2.0, 1e-5), "epsilon"),
        (lambda: cv.epsilon_to_gdp(float("nan"), 1e-5), "epsilon"),
        (lambda: cv.gdp_to_epsilon(-0.5, 1e-5), "mu"),
        (lambda: cv.gdp_to_delta(1.0, float("inf")), "epsilon"),
        (lambda: cv.rdp_to_epsilon([1.0], [0.1], 1e-5), "orders"),
        (lambda: cv.rdp_to_epsilon([2.0, 3.0], [0.1], 1e-5), "orders"),
        (lambda: cv.rdp_to_epsilon([2.0], [-0.1], 1e-5), "rdp"),
        (lambda: cv.zcdp_to_epsilon_thm49(True, 1e-5), "rho"),
    ],
)
def test_out_of_range_parameters_raise_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_closed_form_conversions_are_vectorised_and_agree_with_the_scalar_calls():
    rhos = np.array([0.0, 1e-4, 0.3, 2.0])
    assert np.array_equal(cv.zcdp_to_epsilon_thm49(rhos, 1e-6),
                          [cv.zcdp_to_epsilon_thm49(float(r), 1e-6) for r in rhos])
    eps = np.array([0.1, 1.0, 4.0])
    assert np.array_equal(cv.epsilon_to_zcdp_thm49(eps, 1e-6), [cv.epsilon_to_zcdp_thm49(float(e), 1e-6) for e in eps])
    mus = np.array([0.0, 0.2, 1.0, 3.0])
    assert np.array_equal(cv.gdp_to_delta(mus, 0.5), [cv.gdp_to_delta(float(m), 0.5) for m in mus])
    assert np.allclose(cv.zcdp_to_gdp(cv.gdp_to_zcdp(mus)), mus)
    with pytest.raises(ValueError, match="rho"):
        cv.zcdp_to_epsilon_thm49(np.array([0.1, -0.1]), 1e-6)


@pytest.mark.parametrize("epsilon, delta", [(1e-6, 1e-100), (1e-6, 1e-300), (1e-4, 1e-300), (1e-6, 1e-12)])
def test_epsilon_to_gdp_keeps_the_promise_where_the_curve_is_ill_conditioned(epsilon, delta):
    # At epsilon << mu's scale, -eps/mu +- mu/2 differ by rounding at ~1e-7 relative, so the
    # curve is not monotone there: the returned mu must itself have been checked.
    mu = cv.epsilon_to_gdp(epsilon, delta)
    assert mu > 0 and cv.gdp_to_delta(mu, epsilon) <= delta


@pytest.mark.parametrize("epsilon, delta", [(1e-6, 1e-30), (1e-6, 1e-12), (1e-6, 1e-9)])
def test_epsilon_to_zcdp_cks_returns_a_budget_that_keeps_the_promise_for_tiny_epsilon(epsilon, delta):
    # The brentq version looped for ever here (its last-bit guard shrank rho by 1e-9 per try).
    rho = cv.epsilon_to_zcdp_cks(epsilon, delta)
    assert rho >= cv.epsilon_to_zcdp_thm49(epsilon, delta) * (1 - 1e-6)
    assert cv.zcdp_to_epsilon_cks(rho, delta) <= epsilon
