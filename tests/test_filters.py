"""Privacy filters: each admits exactly what its theorem allows and never overshoots."""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.stream.accounting import (
    AdvancedCompositionFilter,
    DPFilterViaZCDP,
    GDPFilter,
    RenyiFilter,
    ZCDPFilter,
    epsilon_to_gdp,
    epsilon_to_zcdp_thm49,
)

# Spends an adversary would try: huge, tiny, subnormal, zero, and values near the budget.
adversarial_spend = st.one_of(
    st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False),
    st.floats(min_value=0.0, max_value=1e-300),
    st.sampled_from([0.0, 5e-324, 1e-308, 0.1, 0.2, 0.3, 1.0 / 3.0, 0.5, 1.0, 2.0]),
)


@settings(max_examples=300, deadline=None)
@given(budget=st.floats(min_value=1e-6, max_value=1e6), spends=st.lists(adversarial_spend, max_size=200))
def test_zcdp_filter_never_admits_past_its_budget(budget, spends):
    filt = ZCDPFilter(budget=budget)
    admitted = [s for s in spends if filt.try_spend(s)]
    assert sum(Fraction(s) for s in admitted) <= Fraction(budget)
    assert math.fsum(admitted) <= budget


@settings(max_examples=200, deadline=None)
@given(budget=st.floats(min_value=1e-6, max_value=1e6), spends=st.lists(adversarial_spend, max_size=200))
def test_renyi_filter_never_admits_past_its_budget(budget, spends):
    filt = RenyiFilter(alpha=8.0, budget=budget)
    admitted = [s for s in spends if filt.try_spend(s)]
    assert sum(Fraction(s) for s in admitted) <= Fraction(budget)


@settings(max_examples=200, deadline=None)
@given(mu=st.floats(min_value=1e-3, max_value=1e3), spends=st.lists(adversarial_spend, max_size=200))
def test_gdp_filter_never_admits_past_its_budget(mu, spends):
    filt = GDPFilter(mu=mu)
    admitted = [s for s in spends if filt.try_spend(s)]
    assert sum(Fraction(s) ** 2 for s in admitted) <= Fraction(mu) ** 2


@settings(max_examples=200, deadline=None)
@given(eps=st.floats(min_value=1e-3, max_value=10.0), spends=st.lists(adversarial_spend, max_size=200))
def test_dp_filter_via_zcdp_never_admits_past_b_star(eps, spends):
    filt = DPFilterViaZCDP(epsilon=eps, delta=1e-6)
    admitted = [s for s in spends if filt.try_spend(s)]
    assert sum(Fraction(s) ** 2 for s in admitted) / 2 <= Fraction(filt.b_star)


@settings(max_examples=200, deadline=None)
@given(
    eps=st.floats(min_value=1e-3, max_value=10.0),
    spends=st.lists(st.tuples(adversarial_spend, st.floats(min_value=0, max_value=1e-6)), max_size=200),
)
def test_advanced_composition_filter_never_passes_its_boundary(eps, spends):
    filt = AdvancedCompositionFilter(epsilon=eps, delta_prime=1e-6, delta_double_prime=1e-6)
    admitted = [(e, d) for e, d in spends if filt.try_spend(e, d)]
    v = math.fsum(e * e for e, _ in admitted)
    assert math.sqrt(2 * math.log(1e6) * v) + v / 2 <= eps
    assert math.fsum(d for _, d in admitted) <= 1e-6


def test_a_refused_spend_is_not_recorded_and_a_cheaper_one_may_follow():
    filt = ZCDPFilter(budget=1.0)
    assert filt.try_spend(0.75)
    assert not filt.try_spend(0.5)
    assert filt.spent == 0.75
    assert filt.try_spend(0.25)
    assert filt.spent == 1.0
    assert not filt.try_spend(5e-324)


def test_renyi_filter_continues_while_the_sum_is_at_most_the_budget():
    filt = RenyiFilter(alpha=2.0, budget=1.0)
    assert [filt.try_spend(0.5) for _ in range(3)] == [True, True, False]
    assert filt.steps == 2


def test_dp_filter_admits_k_pure_steps_exactly_as_theorem_4_9_allows():
    eps_g, delta_g, eps = 1.0, 1e-6, 0.05
    filt = DPFilterViaZCDP(epsilon=eps_g, delta=delta_g)
    k = 0
    while filt.try_spend(eps):
        k += 1
    b_star = epsilon_to_zcdp_thm49(eps_g, delta_g)
    assert k * eps**2 / 2 <= b_star < (k + 1) * eps**2 / 2
    # Fixed-parameter consequence stated after Theorem 4.9.
    assert 0.5 * k * eps**2 + math.sqrt(2 * k * math.log(1 / delta_g)) * eps <= eps_g * (1 + 1e-12)


def test_dp_filter_with_the_cks_conversion_admits_more_steps():
    def steps(conversion: str) -> int:
        filt = DPFilterViaZCDP(epsilon=1.0, delta=1e-6, conversion=conversion)
        n = 0
        while filt.try_spend(0.01):
            n += 1
        return n

    assert steps("cks") > steps("thm49")


def test_gdp_filter_for_a_promise_uses_the_exact_gdp_conversion():
    filt = GDPFilter.for_epsilon_delta(epsilon=0.3, delta=1e-5)
    assert filt.mu == epsilon_to_gdp(0.3, 1e-5)


def test_advanced_composition_filter_stops_at_the_delta_budget():
    filt = AdvancedCompositionFilter(epsilon=10.0, delta_prime=1e-6, delta_double_prime=1e-6)
    assert filt.try_spend(0.01, 6e-7)
    assert not filt.try_spend(0.01, 6e-7)
    assert filt.try_spend(0.01, 4e-7)


def test_advanced_composition_filter_fills_to_its_variance_limit():
    filt = AdvancedCompositionFilter(epsilon=1.0, delta_prime=1e-6)
    while filt.try_spend(0.001):
        pass
    assert filt.epsilon_spent() <= 1.0
    assert filt.variance + 0.001**2 > filt.variance_limit * (1 - 1e-9)


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: RenyiFilter(alpha=1.0, budget=1.0), "alpha"),
        (lambda: RenyiFilter(alpha=2.0, budget=0.0), "budget"),
        (lambda: ZCDPFilter(budget=-1.0), "budget"),
        (lambda: DPFilterViaZCDP(epsilon=1.0, delta=2.0), "delta"),
        (lambda: DPFilterViaZCDP(epsilon=1.0, delta=1e-5, conversion="x"), "conversion"),
        (lambda: GDPFilter(mu=float("inf")), "mu"),
        (lambda: AdvancedCompositionFilter(epsilon=1.0, delta_prime=0.0), "delta_prime"),
        (lambda: AdvancedCompositionFilter(epsilon=1.0, delta_prime=0.6, delta_double_prime=0.5), "delta_prime"),
        (lambda: ZCDPFilter(budget=1.0).try_spend(-0.1), "rho"),
        (lambda: ZCDPFilter(budget=1.0).try_spend(float("nan")), "rho"),
    ],
)
def test_bad_filter_parameters_raise_naming_the_parameter(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def _exact_b_star(epsilon: float, delta: float) -> Decimal:
    """Theorem 4.9's ``B* = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2`` in 60 digits,
    from the exact values of the float inputs."""
    with localcontext() as ctx:
        ctx.prec = 60
        log_inv = (1 / Decimal(delta)).ln()
        return ((log_inv + Decimal(epsilon)).sqrt() - log_inv.sqrt()) ** 2


def _largest_step_under(b_star: float) -> float:
    """The largest float epsilon whose exact ``epsilon^2 / 2`` is at most the float ``b_star``."""
    step = math.sqrt(2.0 * b_star)
    while Fraction(step) ** 2 / 2 > Fraction(b_star):
        step = math.nextafter(step, 0.0)
    while Fraction(math.nextafter(step, math.inf)) ** 2 / 2 <= Fraction(b_star):
        step = math.nextafter(step, math.inf)
    return step


def test_dp_filter_via_zcdp_never_admits_past_the_exact_b_star():
    # The float B* exceeds the real one in about half of all cases; a single step just under the
    # float value then spends more than the promise allows unless the threshold is shrunk.
    rng = random.Random(20261123)
    past = []
    for _ in range(300):
        epsilon, delta = 10 ** rng.uniform(-3, 1), 10 ** rng.uniform(-12, -2)
        filt = DPFilterViaZCDP(epsilon=epsilon, delta=delta)
        step = _largest_step_under(filt.b_star)
        if filt.try_spend(step):
            spent = Fraction(step) ** 2 / 2
            if Decimal(spent.numerator) / Decimal(spent.denominator) > _exact_b_star(epsilon, delta):
                past.append((epsilon, delta))
    assert past == []
