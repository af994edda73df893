"""One filter decision per user and window over their window vectors and their prepaid terms.

``Ledger.admit(..., prepaid=terms)``: a user's whole request in a window is their window-query
vector ``v`` (charged ``||v||^2 / (2 s^2)``) plus, for each active running query, the prepaid
charge of their contribution ``x`` (renyi_stream.stream.continual.prepaid); the ledger decides once over the
sum, and under ``clip`` one scale applies to ``v`` and every ``x``.
"""

from __future__ import annotations

import numpy as np
import pytest

from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.prepaid import BLTPrepaid, prepaid_charge, prepaid_rho
from renyi_stream.stream.ledger import ADMITTED, CLIPPED, DROPPED, ChargeTerms, Ledger

S = 2.0
RULE = BLTPrepaid(BufferedLinearToeplitz(), horizon=365)


def _terms_with_history(rng: np.random.Generator, n: int, dim: int, t: int) -> tuple[ChargeTerms, np.ndarray]:
    """Prepaid terms at window ``t`` of users who were admitted at ``t - 3`` (so the cross term
    is non-zero), and their contributions at ``t``."""
    state = RULE.new_users(n, dim)
    state = RULE.admit(state, rng.uniform(0.5, 1.0, (n, dim)), t - 3)
    x = rng.uniform(0.5, 1.0, (n, dim))
    return RULE.charge_terms(state, x, t), x


def test_a_window_without_prepaid_terms_charges_exactly_what_the_window_filter_charges():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(50, 3))
    plain = Ledger(budget=10.0).admit(np.arange(50), v, noise_std=S)
    expected = gaussian_charge(contributions=v, noise_std=S)
    np.testing.assert_array_equal(plain.charge, expected)
    assert np.all(plain.scale == 1.0)


def test_the_charge_is_the_window_part_plus_the_prepaid_part():
    rng = np.random.default_rng(2)
    terms, _ = _terms_with_history(rng, 40, 2, t=10)
    v = rng.normal(size=(40, 3))
    result = Ledger(budget=1e6).admit(np.arange(40), v, noise_std=S, prepaid=[terms])
    window_part = gaussian_charge(contributions=v, noise_std=S)
    prepaid_part = prepaid_rho(terms, noise_std=S)
    assert np.all(result.status == ADMITTED)
    np.testing.assert_allclose(result.charge, window_part + prepaid_part, rtol=1e-8)
    # never below the exact sum of the two exact charges
    exact = (np.einsum("nd,nd->n", v, v) + terms.quadratic + 2 * terms.cross) / (2 * S * S)
    assert np.all(result.charge >= exact)


def test_two_running_queries_are_charged_together_with_the_window_vector():
    rng = np.random.default_rng(3)
    first, _ = _terms_with_history(rng, 20, 1, t=5)
    second, _ = _terms_with_history(rng, 20, 2, t=5)
    v = rng.normal(size=(20, 1))
    both = Ledger(budget=1e6).admit(np.arange(20), v, noise_std=S, prepaid=[first, second])
    summed = ChargeTerms(quadratic=first.quadratic + second.quadratic, cross=first.cross + second.cross,
                         magnitude=first.magnitude + second.magnitude)
    one = Ledger(budget=1e6).admit(np.arange(20), v, noise_std=S, prepaid=summed)
    np.testing.assert_allclose(both.charge, one.charge, rtol=1e-12)


def test_clip_scales_the_window_vector_and_the_prepaid_contribution_by_one_factor():
    rng = np.random.default_rng(4)
    terms, x = _terms_with_history(rng, 30, 2, t=20)
    v = rng.normal(size=(30, 2))
    full = prepaid_charge(ChargeTerms(quadratic=terms.quadratic + np.einsum("nd,nd->n", v, v), cross=terms.cross,
                                      magnitude=terms.magnitude)) / (2 * S * S)
    budget = float(np.median(full))  # about half the users must be clipped
    ledger = Ledger(budget=budget)
    result = ledger.admit(np.arange(30), v, noise_std=S, policy="clip", prepaid=[terms])
    clipped = result.status == CLIPPED
    assert 5 < clipped.sum() < 25
    lam = result.scale
    np.testing.assert_array_equal(result.contributions, v * lam[:, None])
    # the scaled request's exact charge, a quadratic in lambda, is within what was recorded
    scaled = lam**2 * (np.einsum("nd,nd->n", v, v) + terms.quadratic) + 2 * lam * terms.cross
    assert np.all(scaled / (2 * S * S) <= result.charge)
    assert np.all(ledger.used(np.arange(30)) <= budget)
    # and the clipped users used their budget up
    np.testing.assert_allclose(ledger.used(np.flatnonzero(clipped)), budget, rtol=1e-8)


def test_a_user_over_budget_keeps_their_used_budget_and_only_todays_request_is_dropped():
    rng = np.random.default_rng(5)
    terms, _ = _terms_with_history(rng, 10, 1, t=30)
    ledger = Ledger(budget=1.0)
    ledger.admit(np.arange(10), np.full((10, 1), 2.5), noise_std=S)  # 6.25 / 8 = 0.78 used
    before = ledger.used(np.arange(10))
    big = ChargeTerms(quadratic=terms.quadratic + 10.0, cross=terms.cross, magnitude=terms.magnitude + 10.0)
    result = ledger.admit(np.arange(10), np.zeros((10, 0)), noise_std=S, prepaid=[big])
    assert np.all(result.status == DROPPED) and np.all(result.charge == 0.0) and np.all(result.scale == 0.0)
    np.testing.assert_array_equal(ledger.used(np.arange(10)), before)


def test_a_nonzero_window_vector_is_never_free_even_when_its_square_underflows():
    v = np.full((1, 1), 1e-170)
    zero = ChargeTerms(quadratic=np.zeros(1), cross=np.zeros(1), magnitude=np.zeros(1))
    result = Ledger(budget=1.0).admit([1], v, noise_std=S, prepaid=[zero])
    assert result.charge[0] > 0.0


@pytest.mark.parametrize("strategy", ["blt", "tree", "sqrt"])
def test_a_nonzero_running_contribution_is_never_free_even_when_its_square_underflows(strategy):
    """x = 1e-170 in a window that asks only a running query: x^2 underflows to 0 in every term,
    yet its true loss is positive, so it must be charged (found by the attacker's review)."""
    from renyi_stream.stream.continual.prepaid import running_rule

    rule = running_rule(strategy, 16)
    state = rule.new_users(1, 1)
    terms = rule.charge_terms(state, np.full((1, 1), 1e-170), 0)
    assert prepaid_charge(terms)[0] > 0.0
    result = Ledger(budget=1.0).admit([1], np.zeros((1, 0)), noise_std=S, prepaid=[terms])
    assert result.status[0] == ADMITTED and result.charge[0] > 0.0


def test_prepaid_terms_of_the_wrong_shape_are_refused_naming_the_parameter():
    terms = ChargeTerms(quadratic=np.zeros(3), cross=np.zeros(3), magnitude=np.zeros(3))
    with pytest.raises(ValueError, match="prepaid"):
        Ledger(budget=1.0).admit(np.arange(2), np.zeros((2, 1)), noise_std=S, prepaid=[terms])
