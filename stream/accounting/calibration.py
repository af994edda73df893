"""Calibration: from a promise ``(epsilon, delta)`` and a squared-norm budget to a noise std.

The individual filter (Feldman & Zrnic, Algorithm 3) charges user ``i`` at window ``t`` the
zCDP amount ``rho_t(i) = ||q_t(x_i)||^2 / (2 s^2)`` and stops them before their sum passes the
budget ``kappa``. Stating the budget as a total squared norm ``B`` (``sum_t ||q_t(x_i)||^2 <= B``)
gives ``kappa = B / (2 s^2)``, i.e. ``s = sqrt(B / (2 kappa))`` (the seed's Corollary 4.7 with
``sigma^2 = B / (2 kappa)``). What is left is to choose ``kappa`` for ``(epsilon, delta)``, and
that depends on the accounting:

* ``gdp`` (default): every release is Gaussian, so the filtered interaction is
  ``mu``-GDP with ``mu = sqrt(2 kappa)`` under fully adaptive composition (Smith & Thakurta 2022;
  individual filtering: Koskela, Tobaben & Honkela 2023), converted exactly to
  ``(epsilon, delta)`` by Dong, Roth & Su (2019, Cor. 2.13).
* ``zcdp-cks``: ``kappa``-zCDP (Theorem 4.5 / Cor. 4.7) converted by Canonne, Kamath & Steinke
  (2020, Prop. 12).
* ``zcdp-thm49``: the seed's own conversion, ``kappa = B*`` of Theorem 4.9.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting.conversions import (
    epsilon_to_gdp,
    epsilon_to_zcdp_cks,
    epsilon_to_zcdp_thm49,
    gdp_to_epsilon,
    gdp_to_zcdp,
    zcdp_to_epsilon_cks,
    zcdp_to_epsilon_thm49,
    zcdp_to_gdp,
)

# The noise std is raised by this relative amount above sqrt(B / (2 kappa)). Charges are rounded
# up and the ledger's cap sits 1e-9 below kappa (renyi_stream.stream.ledger.BUDGET_SAFETY); without headroom
# a user contributing exactly B in total (say C = 1 every day for B days) would lose the last
# day to rounding. With it, their charges sum to kappa * (1 - 2e-8): they get all B / C^2 windows.
NOISE_HEADROOM = 1e-8

# How far, relatively, a ledger's recorded budget may sit above this version's calibration of the
# same promise and still be continued (see :func:`resume`). The conversions are computed to the
# last float and then lowered by a relative 1e-12 (gdp, zcdp-cks) or are closed forms (zcdp-thm49),
# so two versions, platforms or libm builds agree to about 1e-13: this admits their last-bit
# differences and nothing material (epsilon moves by about the same relative 1e-12).
BUDGET_RTOL = 1e-12

ACCOUNTINGS: tuple[str, ...] = ("gdp", "zcdp-cks", "zcdp-thm49")
DEFAULT_ACCOUNTING = "gdp"

_DESCRIPTIONS = {
    "gdp": "Gaussian DP under fully adaptive composition (Smith & Thakurta 2022), "
    "exact (eps, delta) conversion (Dong, Roth & Su 2019)",
    "zcdp-cks": "zCDP filter (Feldman & Zrnic Thm 4.5) with the conversion of "
    "Canonne, Kamath & Steinke 2020",
    "zcdp-thm49": "zCDP filter with the seed's conversion (Feldman & Zrnic Thm 4.9, B*)",
}


def check_accounting(accounting: str) -> str:
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got accounting={accounting!r}")
    return accounting


def describe_accounting(accounting: str) -> str:
    """One line, in words, of what an accounting name means and which theorem it rests on."""
    return _DESCRIPTIONS[check_accounting(accounting)]


def zcdp_budget_for(*, epsilon: float, delta: float, accounting: str = DEFAULT_ACCOUNTING) -> float:
    """The zCDP budget ``kappa`` that the ledger may spend per user for ``(epsilon, delta)``.

    For ``gdp`` this is ``mu^2 / 2`` with ``mu`` the largest GDP parameter that is
    ``(epsilon, delta)``-DP: the ledger's rule ``sum rho_t <= kappa`` is then exactly the GDP
    filter's ``sum mu_t^2 <= mu^2``.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    accounting = check_accounting(accounting)
    if accounting == "gdp":
        return gdp_to_zcdp(epsilon_to_gdp(epsilon, delta))
    if accounting == "zcdp-cks":
        return epsilon_to_zcdp_cks(epsilon, delta)
    return epsilon_to_zcdp_thm49(epsilon, delta)


def epsilon_for_budget(*, rho: float, delta: float, accounting: str = DEFAULT_ACCOUNTING) -> float:
    """Epsilon at ``delta`` of a zCDP budget ``rho`` spent through the individual filter.

    The inverse of :func:`zcdp_budget_for` for each accounting. Used for personal reports: a
    user whose filter shows ``rho`` spent has (at most) this epsilon.
    """
    rho = check.non_negative("rho", rho)
    delta = check.probability("delta", delta)
    accounting = check_accounting(accounting)
    if accounting == "gdp":
        return gdp_to_epsilon(zcdp_to_gdp(rho), delta)
    if accounting == "zcdp-cks":
        return zcdp_to_epsilon_cks(rho, delta)
    return zcdp_to_epsilon_thm49(rho, delta)


@dataclass(frozen=True)
class Calibration:
    """The noise that the individual filter needs for a promise, and which accounting gave it.

    Attributes:
        accounting: one of :data:`ACCOUNTINGS`.
        epsilon, delta: the promise, ``(epsilon, delta)``-DP per user over the whole interaction.
        norm_budget: ``B``, the total squared L2 norm a user may contribute over all windows.
        rho: ``kappa``, the per-user zCDP budget (ledger units).
        mu: ``sqrt(2 kappa)``, the GDP parameter of the whole interaction (Gaussian releases).
        noise_std: ``s = sqrt(B / (2 kappa)) * (1 + 1e-8)``, Gaussian noise std per coordinate
            (the tiny headroom absorbs float rounding; see ``NOISE_HEADROOM``).
    """

    accounting: str
    epsilon: float
    delta: float
    norm_budget: float
    rho: float
    mu: float
    noise_std: float

    def worst_case_windows(self, per_window_bound: float = 1.0) -> float:
        """Windows a user contributing the worst case ``C`` every window can join: ``B / C^2``."""
        bound = check.positive("per_window_bound", per_window_bound)
        return self.norm_budget / bound**2

    def charge_for(self, sq_norm: float) -> float:
        """The zCDP charge of one contribution with squared norm ``sq_norm`` under this noise."""
        return check.non_negative("sq_norm", sq_norm) / (2.0 * self.noise_std**2)

    @property
    def description(self) -> str:
        return describe_accounting(self.accounting)


def calibrate(
    *, epsilon: float, delta: float, norm_budget: float, accounting: str = DEFAULT_ACCOUNTING
) -> Calibration:
    """Calibrate the individual filter for ``(epsilon, delta)`` and squared-norm budget ``B``.

    Returns the zCDP budget ``kappa`` (see :func:`zcdp_budget_for`) and the per-coordinate noise
    std ``s = sqrt(B / (2 kappa))`` (Feldman & Zrnic, Corollary 4.7), raised by a relative
    ``NOISE_HEADROOM`` so that a user whose contributions' squared norms sum to at most ``B`` is
    never filtered, float rounding included. More noise than needed is always safe.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    norm_budget = check.positive("norm_budget", norm_budget)
    rho = zcdp_budget_for(epsilon=epsilon, delta=delta, accounting=accounting)
    return _with_budget(accounting, epsilon, delta, norm_budget, rho)


def _with_budget(accounting: str, epsilon: float, delta: float, norm_budget: float, rho: float) -> Calibration:
    # Correctly rounded IEEE operations only: the same rho gives the same noise_std on every
    # platform and version, so a recorded noise_std can be checked against its recorded rho exactly.
    return Calibration(
        accounting=accounting,
        epsilon=epsilon,
        delta=delta,
        norm_budget=norm_budget,
        rho=rho,
        mu=math.sqrt(2.0 * rho),
        noise_std=math.sqrt(norm_budget / (2.0 * rho)) * (1.0 + NOISE_HEADROOM),
    )


def resume(calibration: Calibration, recorded_rho: float) -> Calibration:
    """The calibration a ledger started with zCDP budget ``recorded_rho`` continues under.

    A ledger keeps the budget it was started with: its users' charges were counted against it,
    and the noise std follows from it (``sqrt(B / (2 rho))``, as :func:`calibrate`), so every
    later run answers with the same noise. ``calibration`` is this run's, for the same promise
    ``(epsilon, delta, B, accounting)``; the caller has checked the promise itself, exactly.

    The recorded budget is accepted when it keeps that promise as this version computes it: at
    most ``calibration.rho * (1 + BUDGET_RTOL)``, so another version's last-bit difference in
    the root finder does not refuse a ledger, and a budget above the promise is refused. A
    smaller recorded budget is always safe and is kept.

    Raises:
        ValueError: naming ``recorded_rho``, when it is not a positive finite number or exceeds
            the promise's budget.
    """
    recorded_rho = check.positive("recorded_rho", recorded_rho)
    allowed = calibration.rho * (1.0 + BUDGET_RTOL)
    if recorded_rho > allowed:
        raise ValueError(
            f"recorded_rho must be at most {allowed!r}, the zCDP budget of (epsilon={calibration.epsilon!r}, "
            f"delta={calibration.delta!r}) under {calibration.accounting} accounting (up to a relative "
            f"{BUDGET_RTOL:g} of float rounding), got recorded_rho={recorded_rho!r}: that budget would let "
            "users spend more than the promise allows")
    return _with_budget(calibration.accounting, calibration.epsilon, calibration.delta,
                        calibration.norm_budget, recorded_rho)


def noise_std_for(
    epsilon: float, delta: float, norm_budget: float, accounting: str = DEFAULT_ACCOUNTING
) -> float:
    """Per-coordinate Gaussian noise std ``s`` for ``(epsilon, delta)`` and squared-norm budget ``B``.

    Shorthand for ``calibrate(...).noise_std``; use :func:`calibrate` to keep the record of which
    accounting produced the number.
    """
    return calibrate(
        epsilon=epsilon, delta=delta, norm_budget=norm_budget, accounting=accounting
    ).noise_std
