"""Conversions between zCDP, Renyi DP, Gaussian DP and (epsilon, delta)-DP.

Units used throughout the project:

* ``rho``: zero-concentrated DP (zCDP, Bun & Steinke 2016, Def. 1.1): ``(alpha, alpha*rho)``-RDP
  for every order ``alpha > 1``. The ledger stores budgets in these units.
* ``mu``: Gaussian DP (GDP, Dong, Roth & Su 2019, Def. 2.6). A Gaussian mechanism with
  sensitivity ``D`` and noise std ``s`` is ``D/s``-GDP and ``D^2/(2 s^2)``-zCDP, so for the
  Gaussian mechanisms this engine runs ``mu = sqrt(2 rho)``.
* ``(epsilon, delta)``: approximate DP.

Every conversion comes with its inverse and is *conservative by construction*: where a value is
found numerically, the returned number is on the safe side (never a smaller epsilon, larger
rho or larger mu than the exact answer would give).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Union

import numpy as np
from scipy import optimize, special

from stream.accounting import _validate as check

ArrayOrFloat = Union[float, np.ndarray]

# Relative slack applied to numerically inverted budgets so that they stay on the safe side of
# the root-finder's tolerance.
_INVERSE_SAFETY = 1e-12


# ---------------------------------------------------------------------------------------------
# zCDP -> (epsilon, delta): Fact 2.4 optimised over alpha, i.e. the seed's Theorem 4.9
# ---------------------------------------------------------------------------------------------


def zcdp_to_epsilon_thm49(rho: ArrayOrFloat, delta: float) -> ArrayOrFloat:
    """Epsilon such that ``rho``-zCDP implies ``(epsilon, delta)``-DP, via Fact 2.4 (vectorised in rho).

    Feldman & Zrnic, Fact 2.4 (Mironov 2017, Prop. 3) gives ``alpha*rho + log(1/delta)/(alpha-1)``
    for every order; the minimum over ``alpha > 1`` (at ``alpha = 1 + sqrt(log(1/delta)/rho)``)
    is ``rho + 2 sqrt(rho log(1/delta))`` (Bun & Steinke 2016, Prop. 1.3). This is the conversion
    behind Theorem 4.9 of Feldman & Zrnic.
    """
    rho_arr = _reals("rho", rho, minimum=0.0)
    delta = check.probability("delta", delta)
    return _same_kind(rho, rho_arr + 2.0 * np.sqrt(rho_arr * math.log(1.0 / delta)))


def epsilon_to_zcdp_thm49(epsilon: ArrayOrFloat, delta: float) -> ArrayOrFloat:
    """The seed's ``B*``: the largest rho whose Fact 2.4 conversion gives ``(epsilon, delta)``.

    Feldman & Zrnic, Theorem 4.9: ``B* = (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2``.
    Written as ``epsilon^2 / (sqrt(L + epsilon) + sqrt(L))^2`` to avoid cancellation when
    ``epsilon << log(1/delta)``. Vectorised in epsilon.
    """
    eps_arr = _reals("epsilon", epsilon, minimum=0.0)
    if np.any(eps_arr <= 0):
        raise ValueError(f"epsilon must be > 0, got epsilon={epsilon!r}")
    delta = check.probability("delta", delta)
    log_inv_delta = math.log(1.0 / delta)
    return _same_kind(epsilon, eps_arr**2 / (np.sqrt(log_inv_delta + eps_arr) + math.sqrt(log_inv_delta)) ** 2)


def zcdp_to_delta_thm49(rho: float, epsilon: float) -> float:
    """Delta such that ``rho``-zCDP implies ``(epsilon, delta)``-DP via Fact 2.4 (inverse in delta).

    Solving ``epsilon = rho + 2 sqrt(rho log(1/delta))`` for delta gives
    ``delta = exp(-(epsilon - rho)^2 / (4 rho))`` for ``epsilon >= rho``, and 1 otherwise.
    """
    rho = check.non_negative("rho", rho)
    epsilon = check.non_negative("epsilon", epsilon)
    if rho == 0.0:
        return 0.0
    if epsilon <= rho:
        return 1.0
    return math.exp(-((epsilon - rho) ** 2) / (4.0 * rho))


# ---------------------------------------------------------------------------------------------
# RDP -> (epsilon, delta): Canonne, Kamath & Steinke 2020, Proposition 12 (tight conversion)
# ---------------------------------------------------------------------------------------------


def _cks_epsilon_at(alpha: np.ndarray, rdp: np.ndarray, log_delta: float) -> np.ndarray:
    # CKS 2020 Prop. 12 / Asoodeh et al. 2020 eq. 20:
    # eps = rdp + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1)
    return rdp + np.log1p(-1.0 / alpha) - (log_delta + np.log(alpha)) / (alpha - 1.0)


def _cks_log_delta_at(alpha: np.ndarray, rdp: np.ndarray, epsilon: float) -> np.ndarray:
    # CKS 2020 Prop. 12 solved for delta:
    # delta = exp((alpha - 1)(rdp - eps)) * (1 - 1/alpha)^(alpha - 1) / alpha
    return (alpha - 1.0) * (rdp - epsilon + np.log1p(-1.0 / alpha)) - np.log(alpha)


def _fact24_epsilon_at(alpha: np.ndarray, rdp: np.ndarray, log_delta: float) -> np.ndarray:
    return rdp - log_delta / (alpha - 1.0)


def _orders_and_rdp(orders: Iterable[float], rdp: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    orders_arr = np.atleast_1d(check.real_array("orders", list(orders)))
    rdp_arr = np.atleast_1d(check.real_array("rdp", list(rdp), minimum=0.0))
    if orders_arr.shape != rdp_arr.shape or orders_arr.ndim != 1 or orders_arr.size == 0:
        raise ValueError(
            f"orders and rdp must be non-empty 1-d sequences of equal length, got "
            f"len(orders)={orders_arr.size}, len(rdp)={rdp_arr.size}"
        )
    if np.any(orders_arr <= 1.0):
        raise ValueError(f"orders must all be > 1, got orders={orders_arr.tolist()}")
    return orders_arr, rdp_arr


def rdp_to_epsilon(orders: Iterable[float], rdp: Iterable[float], delta: float) -> float:
    """Smallest epsilon certified by an RDP curve at ``delta``.

    ``rdp[j]`` is the Renyi divergence bound at order ``orders[j]``. Each order gives a valid
    epsilon by Fact 2.4 of Feldman & Zrnic and, tighter, by Canonne, Kamath & Steinke 2020,
    Proposition 12; the minimum over both and all orders is returned.
    """
    alphas, rdps = _orders_and_rdp(orders, rdp)
    log_delta = math.log(check.probability("delta", delta))
    candidates = np.minimum(
        _cks_epsilon_at(alphas, rdps, log_delta), _fact24_epsilon_at(alphas, rdps, log_delta)
    )
    return max(0.0, float(np.min(candidates)))


def rdp_to_delta(orders: Iterable[float], rdp: Iterable[float], epsilon: float) -> float:
    """Smallest delta certified by an RDP curve at ``epsilon`` (CKS 2020 Prop. 12 and Fact 2.4)."""
    alphas, rdps = _orders_and_rdp(orders, rdp)
    epsilon = check.non_negative("epsilon", epsilon)
    log_deltas = np.minimum(
        _cks_log_delta_at(alphas, rdps, epsilon), (alphas - 1.0) * (rdps - epsilon)
    )
    return float(min(1.0, math.exp(float(np.min(log_deltas)))))


def _zcdp_alpha_bounds(rho: float, log_inv_delta: float) -> tuple[float, float]:
    # The Fact 2.4 optimum 1 + sqrt(L/rho) sets the scale; the CKS optimum lies below it.
    scale = 1.0 + math.sqrt(log_inv_delta / rho)
    return 1.0 + 1e-9, 4.0 * scale + 10.0


def zcdp_to_epsilon_cks(rho: float, delta: float) -> float:
    """Epsilon such that ``rho``-zCDP implies ``(epsilon, delta)``-DP, tight conversion.

    Canonne, Kamath & Steinke 2020, Proposition 12 (with RDP ``alpha*rho`` at every order),
    minimised over the continuous order ``alpha > 1``. Any order gives a valid bound, so an
    imperfect minimisation errs on the safe side; the result is never above Fact 2.4's.
    """
    rho = check.non_negative("rho", rho)
    delta = check.probability("delta", delta)
    if rho == 0.0:
        return 0.0
    log_delta = math.log(delta)
    lo, hi = _zcdp_alpha_bounds(rho, -log_delta)

    def eps_at(alpha: float) -> float:
        return float(_cks_epsilon_at(np.float64(alpha), np.float64(alpha * rho), log_delta))

    result = optimize.minimize_scalar(eps_at, bounds=(lo, hi), method="bounded",
                                      options={"xatol": 1e-10})
    return max(0.0, min(float(result.fun), zcdp_to_epsilon_thm49(rho, delta)))


def zcdp_to_delta_cks(rho: float, epsilon: float) -> float:
    """Delta such that ``rho``-zCDP implies ``(epsilon, delta)``-DP (CKS 2020 Prop. 12)."""
    rho = check.non_negative("rho", rho)
    epsilon = check.non_negative("epsilon", epsilon)
    if rho == 0.0:
        return 0.0
    hi = 1.0 + 4.0 * (1.0 + epsilon) / rho + 10.0

    def log_delta_at(alpha: float) -> float:
        return float(_cks_log_delta_at(np.float64(alpha), np.float64(alpha * rho), epsilon))

    result = optimize.minimize_scalar(log_delta_at, bounds=(1.0 + 1e-9, hi), method="bounded",
                                      options={"xatol": 1e-10})
    return float(min(1.0, math.exp(result.fun), zcdp_to_delta_thm49(rho, epsilon)))


def epsilon_to_zcdp_cks(epsilon: float, delta: float) -> float:
    """Largest rho (to solver precision, on the safe side) with ``zcdp_to_epsilon_cks(rho) <= epsilon``.

    Inverse of :func:`zcdp_to_epsilon_cks` by bisection; epsilon is increasing in rho. The
    answer is at least the Theorem 4.9 ``B*``, which is used as the lower bracket.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    lo = epsilon_to_zcdp_thm49(epsilon, delta)
    hi = lo
    while zcdp_to_epsilon_cks(hi, delta) <= epsilon:
        lo, hi = hi, hi * 2.0
    root = optimize.brentq(lambda r: zcdp_to_epsilon_cks(r, delta) - epsilon, lo, hi,
                           xtol=1e-15, rtol=1e-13)
    rho = root * (1.0 - _INVERSE_SAFETY)
    while zcdp_to_epsilon_cks(rho, delta) > epsilon:  # guard the solver's last bit
        rho *= 1.0 - 1e-9
    return rho


# ---------------------------------------------------------------------------------------------
# Gaussian DP <-> (epsilon, delta): Dong, Roth & Su 2019, Corollary 2.13 (exact)
# ---------------------------------------------------------------------------------------------


def gdp_to_delta(mu: ArrayOrFloat, epsilon: float) -> ArrayOrFloat:
    """The exact delta of ``mu``-GDP at ``epsilon`` (vectorised in mu).

    Dong, Roth & Su 2019, Corollary 2.13:
    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, evaluated in log space so
    the difference of two tiny terms does not cancel.
    """
    mu_arr = _reals("mu", mu, minimum=0.0)
    epsilon = check.non_negative("epsilon", epsilon)
    safe = np.where(mu_arr > 0, mu_arr, 1.0)
    log_first = special.log_ndtr(-epsilon / safe + safe / 2.0)
    log_second = epsilon + special.log_ndtr(-epsilon / safe - safe / 2.0)
    delta = np.maximum(0.0, -np.exp(log_first) * np.expm1(log_second - log_first))
    return _same_kind(mu, np.where(mu_arr > 0, delta, 0.0))


def gdp_to_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon (to solver precision, on the safe side) with ``gdp_to_delta(mu, eps) <= delta``."""
    mu = check.non_negative("mu", mu)
    delta = check.probability("delta", delta)
    if gdp_to_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_to_delta(mu, hi) > delta:
        hi *= 2.0
    root = optimize.brentq(lambda e: gdp_to_delta(mu, e) - delta, 0.0, hi, xtol=1e-15, rtol=1e-13)
    eps = root * (1.0 + _INVERSE_SAFETY)
    while gdp_to_delta(mu, eps) > delta:
        eps *= 1.0 + 1e-9
    return eps


def epsilon_to_gdp(epsilon: float, delta: float) -> float:
    """Largest mu (to solver precision, on the safe side) such that ``mu``-GDP is ``(epsilon, delta)``-DP.

    Inverse of :func:`gdp_to_delta` in mu; delta is increasing in mu at fixed epsilon.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    hi = 1.0
    while gdp_to_delta(hi, epsilon) <= delta:
        hi *= 2.0
    root = optimize.brentq(lambda m: gdp_to_delta(m, epsilon) - delta, 0.0, hi,
                           xtol=1e-15, rtol=1e-13)
    mu = root * (1.0 - _INVERSE_SAFETY)
    while gdp_to_delta(mu, epsilon) > delta:
        mu *= 1.0 - 1e-9
    return mu


def gdp_to_zcdp(mu: ArrayOrFloat) -> ArrayOrFloat:
    """rho = mu^2 / 2: the zCDP of a Gaussian mechanism that is mu-GDP (Bun & Steinke Prop. 1.6)."""
    mu_arr = _reals("mu", mu, minimum=0.0)
    return _same_kind(mu, 0.5 * mu_arr * mu_arr)


def zcdp_to_gdp(rho: ArrayOrFloat) -> ArrayOrFloat:
    """mu = sqrt(2 rho): the GDP of a Gaussian mechanism with zCDP charge rho.

    Valid for Gaussian mechanisms only (where both describe the same privacy-loss
    distribution); a generic rho-zCDP mechanism is not sqrt(2 rho)-GDP.
    """
    rho_arr = _reals("rho", rho, minimum=0.0)
    return _same_kind(rho, np.sqrt(2.0 * rho_arr))


def _reals(name: str, value: Any, *, minimum: float) -> np.ndarray:
    """A scalar or array parameter as a float64 array, validated like the scalar checks."""
    if np.ndim(value) == 0:
        check.real(name, value if not isinstance(value, np.ndarray) else value.item())
    array = check.real_array(name, value)
    if np.any(array < minimum):
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value!r}")
    return array


def _same_kind(template: Any, result: np.ndarray) -> ArrayOrFloat:
    """A float for scalar input, an array for array input."""
    return float(result) if np.ndim(template) == 0 else result
