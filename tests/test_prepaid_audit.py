"""Empirical privacy audit of prepaid BLT running totals (stream/continual/prepaid_audit.py).

The real prepaid rule, filter and keyed noise run on neighbouring inputs (a target present /
absent) against an adaptive white-box adversary that spreads the target's budget over the days;
the most powerful test's error rates become a Clopper-Pearson lower bound on epsilon
(Jagielski et al. 2020; Nasr et al. 2021), as tests/test_privacy_audit.py does for window sums.

False-alarm rate: ``alpha = 1e-3`` per audit, so an honest mechanism reports a bound above its
claim with probability at most 0.1%; the seed is fixed, so the outcome is deterministic in CI. The
broken variants are caught by a wide margin at the same confidence.
"""

from __future__ import annotations

import pytest

from renyi_stream.stream.continual.prepaid_audit import PrepaidAuditConfig, PrepaidVariant, run_prepaid_audit

CLAIM = PrepaidAuditConfig()  # epsilon = 1 at delta = 1e-2, 6 windows, 200k runs per world, alpha = 1e-3


@pytest.fixture(scope="module")
def audits():
    cache = {}

    def get(variant: str):
        if variant not in cache:
            cache[variant] = run_prepaid_audit(CLAIM, variant)
        return cache[variant]

    return get


def test_the_honest_prepaid_rule_passes_the_audit_and_the_bound_is_close_to_the_claim(audits):
    result = audits("honest")
    assert not result.caught
    assert 0.7 < result.epsilon_lower_bound <= CLAIM.epsilon  # measured 0.873: the audit is tight


def test_under_the_honest_rule_the_adversary_exposes_exactly_its_budget_never_more(audits):
    result = audits("honest")
    # sum_t ||q_t(target)||^2 / s^2 over every release, maximised over 200k adaptive runs
    assert result.realised_mu <= result.mu
    assert result.realised_mu == pytest.approx(result.mu, rel=1e-6)  # and spends all of it


@pytest.mark.parametrize("variant", ["window_sum_charge", "no_cross_term"])
def test_a_charge_that_leaves_part_of_the_future_unpaid_is_caught(audits, variant):
    result = audits(variant)
    assert result.caught
    assert result.epsilon_lower_bound > 1.5 * CLAIM.epsilon  # measured 2.28 and 1.86
    assert result.realised_mu > 1.5 * result.mu


@pytest.mark.parametrize("kwargs, message", [
    ({"windows": 1}, "windows must be an integer >= 2"),
    ({"trials": 10}, "trials must be an integer >= 1000"),
])
def test_invalid_audit_configurations_are_refused_with_the_parameter_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrepaidAuditConfig(**kwargs)


def test_an_unknown_variant_is_refused_with_the_parameter_named():
    with pytest.raises(ValueError, match="variant must be one of"):
        run_prepaid_audit(PrepaidAuditConfig(trials=1000), "lenient")
    assert str(PrepaidVariant.HONEST) == "honest"
