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
rho or larger mu than the exact answer would give). Inverses bisect on the promise itself
(:mod:`renyi_stream.stream.accounting._bisect`), so the answer is a point where the promise was checked.

Only the ``zcdp-cks`` conversions import scipy (its bounded scalar minimiser), and only when
called: the default GDP calibration runs on the standard library and NumPy.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Union

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting._bisect import first_true, last_true
from renyi_stream.stream.accounting.normal import log_ndtr_scalar

ArrayOrFloat = Union[float, np.ndarray]

# Relative slack applied to numerically inverted budgets so that they stay on the safe side of
# the root-finder's tolerance.
_INVERSE_SAFETY = 1e-12


def _checked(keeps: Callable[[float], bool], value: float, step: float) -> float:
    """``value``, moved by the relative ``step`` (towards the safe side) until ``keeps`` it.

    The inverses return their bisection's answer moved by a relative 1e-12 to the safe side; where
    the curve is ill-conditioned (epsilon far below the GDP parameter's scale, say epsilon = 1e-6)
    rounding makes it non-monotone at about 1e-7 relative, so the moved value is evaluated again:
    what is returned is always a value at which the promise was checked."""
    while not keeps(value):
        value *= step
    return value


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

    from scipy import optimize  # only this accounting needs it; its import costs ~0.1 s

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

    from scipy import optimize

    result = optimize.minimize_scalar(log_delta_at, bounds=(1.0 + 1e-9, hi), method="bounded",
                                      options={"xatol": 1e-10})
    return float(min(1.0, math.exp(result.fun), zcdp_to_delta_thm49(rho, epsilon)))


def epsilon_to_zcdp_cks(epsilon: float, delta: float) -> float:
    """Largest rho (to solver precision, on the safe side) with ``zcdp_to_epsilon_cks(rho) <= epsilon``.

    Inverse of :func:`zcdp_to_epsilon_cks` by bisection; epsilon is increasing in rho. The
    answer is at least the Theorem 4.9 ``B*``, which is used as the lower bracket; the result
    is lowered by a relative ``1e-12`` below the last rho found to keep the promise.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)

    def keeps(rho: float) -> bool:
        return zcdp_to_epsilon_cks(rho, delta) <= epsilon

    # CKS is never above Fact 2.4, whose epsilon at B* is the target up to rounding.
    lo = epsilon_to_zcdp_thm49(epsilon, delta) * (1.0 - 1e-9)
    while not keeps(lo):  # defensive: a bracket's low end must keep the promise
        lo *= 0.5
    hi = 2.0 * lo
    while keeps(hi):
        lo, hi = hi, 2.0 * hi
    # The minimiser inside zcdp_to_epsilon_cks may wobble in the last bits; bisection still ends
    # on a rho whose epsilon was computed <= epsilon, and the margin covers the wobble.
    return _checked(keeps, last_true(keeps, lo, hi) * (1.0 - _INVERSE_SAFETY), 1.0 - 1e-9)


# ---------------------------------------------------------------------------------------------
# Gaussian DP <-> (epsilon, delta): Dong, Roth & Su 2019, Corollary 2.13 (exact)
# ---------------------------------------------------------------------------------------------


def _gdp_delta(mu: float, epsilon: float) -> float:
    """:func:`gdp_to_delta` for one float ``mu`` (validated by the caller); the root finders' curve."""
    if mu <= 0.0:
        return 0.0
    log_first = log_ndtr_scalar(-epsilon / mu + mu / 2.0)
    if log_first == -math.inf:  # both terms underflow even in log space: delta is 0 to double precision
        return 0.0
    log_second = epsilon + log_ndtr_scalar(-epsilon / mu - mu / 2.0)
    return max(0.0, -math.exp(log_first) * math.expm1(log_second - log_first))


_gdp_delta_elementwise = np.frompyfunc(_gdp_delta, 2, 1)


def gdp_to_delta(mu: ArrayOrFloat, epsilon: float) -> ArrayOrFloat:
    """The exact delta of ``mu``-GDP at ``epsilon`` (vectorised in mu).

    Dong, Roth & Su 2019, Corollary 2.13:
    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, evaluated in log space
    (:mod:`renyi_stream.stream.accounting.normal`) so the difference of two tiny terms does not cancel. An
    array gives, element by element, the same numbers as the scalar calls.
    """
    mu_arr = _reals("mu", mu, minimum=0.0)
    epsilon = check.non_negative("epsilon", epsilon)
    if np.ndim(mu) == 0:
        return _gdp_delta(float(mu_arr), epsilon)
    return _gdp_delta_elementwise(mu_arr, epsilon).astype(np.float64)


def gdp_to_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon (to the last float, then raised by a relative 1e-12) with
    ``gdp_to_delta(mu, eps) <= delta``: on the safe side, never below the exact answer."""
    mu = check.non_negative("mu", mu)
    delta = check.probability("delta", delta)
    if _gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while _gdp_delta(mu, hi) > delta:
        hi *= 2.0
    def keeps(e: float) -> bool:
        return _gdp_delta(mu, e) <= delta

    return _checked(keeps, first_true(keeps, 0.0, hi) * (1.0 + _INVERSE_SAFETY), 1.0 + 1e-9)


def epsilon_to_gdp(epsilon: float, delta: float) -> float:
    """Largest mu (to the last float, then lowered by a relative 1e-12) such that ``mu``-GDP is
    ``(epsilon, delta)``-DP: on the safe side, never above the exact answer.

    Inverse of :func:`gdp_to_delta` in mu; delta is increasing in mu at fixed epsilon.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    hi = 1.0
    while _gdp_delta(hi, epsilon) <= delta:
        hi *= 2.0
    def keeps(m: float) -> bool:
        return _gdp_delta(m, epsilon) <= delta

    return _checked(keeps, last_true(keeps, 0.0, hi) * (1.0 - _INVERSE_SAFETY), 1.0 - 1e-9)


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
