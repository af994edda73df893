"""Privacy odometers: running upper bounds on the privacy spent so far.

Two kinds live here.

* **The personal tracker** of Feldman & Zrnic (Algorithm 5, Proposition 4.10, Corollary 4.11):
  a chain of Renyi filters of budget ``Delta`` each; every time one would halt, a new one
  starts and the tracker grows by ``Delta``. For user ``i`` the tracker ``O^(i)`` bounds
  their zCDP loss and depends only on their own charges (and released outputs), so it can be
  disclosed to that user. :func:`tracker_update` advances it for many users at once.

* **Whitehouse, Ramdas, Rogers & Wu (2023), Theorem 2**: the filter, mixture and stitched
  odometers, functions of the "intrinsic time" ``V = sum eps_n^2`` and ``delta'``, and
  Rogers, Roth, Ullman & Vadhan's odometer (their Lemma 4) as the baseline they improve on.
  Each is a ``delta``-privacy odometer for conditionally ``(eps_n, delta_n)``-pDP steps; the
  ``delta''`` part (the ``n > N`` case, infinite bound) is kept by :class:`Odometer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.rounding import round_down, round_up
from renyi_stream.stream.xp import array_module, host_all, maybe_any

# ---------------------------------------------------------------------------------------------
# Personal tracker (Feldman & Zrnic, Algorithm 5 / Corollary 4.11), vectorised over users
# ---------------------------------------------------------------------------------------------


def tracker_step_for(rho: float) -> float:
    """``Delta``, the personal tracker's step (Algorithm 5's discretisation error), of a ledger
    whose per-user zCDP budget is ``rho``: ``rho / 32``, zCDP. The one definition of a new
    ledger's step; a ledger records its own with its budget and keeps it for life
    (:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`), since its users' trackers were counted
    in it. ValueError naming ``rho`` unless it is a positive finite number."""
    # Why 32: the tracker overstates a user's loss by less than one step
    # (O^(i) < Delta + sum_t rho_t(i) / (1 - 1e-9), tracker_update), so rho / 32 keeps every
    # personal report within about 3% of the budget above the loss it bounds, while a user's
    # tracker stays a count of at most about 32 filters. The step decides only the report's
    # resolution, never its validity: Corollary 4.11 needs each charge rho_t <= Delta, and
    # tracker_update feeds a larger charge as pieces (a post-processing of its one release).
    # 32 is this project's choice, not the paper's (Feldman & Zrnic leave Delta open).
    return check.positive("rho", rho) / 32.0


# A filter is treated as full at Delta * (1 - 1e-9): float sums of its contents, rounded up,
# then never exceed Delta in exact arithmetic.
_FILTER_FILL = 1.0 - 1e-9


def tracker_update(segment: Any, bound: Any, charge: Any, *, step: float) -> tuple[Any, Any]:
    """Advance the personal trackers of many users by one charge each (zCDP units).

    State per user: ``segment``, the charge inside the currently open filter, and ``bound``,
    the tracker ``O`` (``Delta`` times the number of filters opened). A fresh user has
    ``segment = 0, bound = Delta`` (Algorithm 5 initialises ``O_1 = Delta``). Returns the new
    ``(segment, bound)``.

    Algorithm 5 needs every charge ``rho_t <= Delta``, and a filter that cannot take the whole
    next charge halts. For Gaussian releases we split the charge instead: one release with noise
    ``s`` is the inverse-variance average of independent releases whose charges add up to
    ``rho_t`` (a post-processing), so ``rho_t`` may be fed as pieces: first what fills the open
    filter, then whole filters of ``Delta``, then the rest in a new open filter. Each filter
    then holds at most ``Delta`` and Corollary 4.11 holds as stated: ``O^(i)`` bounds user
    ``i``'s zCDP loss, and ``O^(i) < Delta + sum_t rho_t(i) / (1 - 1e-9)``.

    On a device the input check is one explicit transfer (one bool); the update itself is
    :func:`advance_trackers`, which makes none.
    """
    step = check.positive("step", step)
    xp = array_module(segment, bound, charge)
    charge = xp.asarray(charge, dtype=xp.float64)
    if not host_all(xp.isfinite(charge) & (charge >= 0)):  # one explicit transfer on a device
        raise ValueError("charge must be finite and >= 0 for the personal tracker")
    return advance_trackers(segment, bound, charge, step=step)


def advance_trackers(segment: Any, bound: Any, charge: Any, *, step: float) -> tuple[Any, Any]:
    """:func:`tracker_update` without its input check, for charges that are finite and ``>= 0``
    by construction (the filter's recorded charges, :func:`renyi_stream.stream.ledger.individual_filter`).

    Pure array arithmetic, element by element: no host round trip on a device (the spill pass
    runs masked over every row, see :func:`renyi_stream.stream.xp.maybe_any`), and each row's result is the
    same whether it is computed alone or with others.
    """
    xp = array_module(segment, bound, charge)
    fill = step * _FILTER_FILL
    room = round_down(fill - segment)
    fits = charge <= room
    new_segment = xp.where(fits, round_up(segment + charge), 0.0)
    new_bound = bound.copy()
    spill = ~fits
    if maybe_any(spill):  # the open filter halts: what does not fit goes to new filters
        rest = xp.maximum(round_up(charge - room), 0.0)
        new_filters = xp.maximum(xp.ceil(rest / fill), 1.0)
        last = round_up(rest - (new_filters - 1.0) * fill)
        over = last > fill  # rounding left a hair too much for the last filter
        new_filters = xp.where(over, new_filters + 1.0, new_filters)
        last = xp.where(over, round_up(rest - (new_filters - 1.0) * fill), last)
        new_segment = xp.where(spill, last, new_segment)
        new_bound = xp.where(spill, bound + new_filters * step, bound)
    return new_segment, new_bound


def tracker_reference(charges: list[float], *, step: float) -> tuple[float, float]:
    """Algorithm 5 with split charges, in exact rational arithmetic, for one user.

    The independent check of :func:`tracker_update` (tests and docs): the open filter takes
    what fits (up to ``Delta * (1 - 1e-9)``), each halt opens a new filter and adds ``Delta``.
    Returns ``(segment, bound)``.
    """
    step_q = Fraction(check.positive("step", step))
    fill = Fraction(step) * Fraction(_FILTER_FILL)
    segment, bound = Fraction(0), step_q
    for rho in charges:
        rest = Fraction(rho)
        while segment + rest > fill:  # the open filter halts: fill it, open the next
            rest -= fill - segment
            bound += step_q
            segment = Fraction(0)
        segment += rest
    return float(segment), float(bound)


# ---------------------------------------------------------------------------------------------
# Whitehouse et al. (2023) Theorem 2 odometers and Rogers et al.'s (their Lemma 4)
# ---------------------------------------------------------------------------------------------


def filter_odometer(variance: Any, *, epsilon: float, delta_prime: float) -> Any:
    """Filter odometer ``u^F`` (Whitehouse et al., Theorem 2.1), tightest near ``V = y*``.

    ``y* = (sqrt(2L + epsilon) - sqrt(2L))^2`` with ``L = log(1/delta')``, and
    ``u^F(V) = sqrt(2 y* L)/2 + sqrt(2L) V / (2 sqrt(y*)) + V/2``: a line tangent to
    ``sqrt(2 L V) + V/2`` at ``V = y*``.
    """
    epsilon = check.positive("epsilon", epsilon)
    two_log = 2.0 * math.log(1.0 / check.probability("delta_prime", delta_prime))
    v = _variance(variance)
    y_star = (math.sqrt(two_log + epsilon) - math.sqrt(two_log)) ** 2
    return math.sqrt(y_star * two_log) / 2.0 + math.sqrt(two_log) / (2.0 * math.sqrt(y_star)) * v + v / 2.0


def mixture_odometer(variance: Any, *, rho: float, delta_prime: float) -> Any:
    """Mixture odometer ``u^M`` (Whitehouse et al., Theorem 2.2), method of mixtures with scale ``rho``.

    ``u^M(V) = sqrt(2 log(sqrt((V + rho)/rho) / delta') (rho + V)) + V/2``.
    """
    rho = check.positive("rho", rho)
    delta_prime = check.probability("delta_prime", delta_prime)
    v = _variance(variance)
    log_term = np.log(np.sqrt((v + rho) / rho) / delta_prime)
    return np.sqrt(2.0 * log_term * (rho + v)) + v / 2.0


def stitched_odometer(variance: Any, *, v0: float, delta_prime: float) -> Any:
    """Stitched odometer ``u^S`` (Whitehouse et al., Theorem 2.3); infinite while ``V < v0``.

    ``u^S(V) = 1.7 sqrt(V (log log(2V / v0) + 0.72 log(5.2 / delta'))) + V/2`` for ``V >= v0``.
    """
    v0 = check.positive("v0", v0)
    delta_prime = check.probability("delta_prime", delta_prime)
    v = _variance(variance)
    safe_v = np.maximum(v, v0)
    value = 1.7 * np.sqrt(safe_v * (np.log(np.log(2.0 * safe_v / v0)) + 0.72 * np.log(5.2 / delta_prime))) + safe_v / 2.0
    return np.where(v < v0, np.inf, value)


def rogers_odometer(variance: Any, *, n: int, delta_prime: float) -> Any:
    """Rogers, Roth, Ullman & Vadhan's odometer (their Theorem 6.5; Whitehouse et al., Lemma 4).

    Needs ``delta' <= 1/e`` and the dataset size ``n >= 2``. For ``V in [1/n^2, 1]``:
    ``sqrt(2V (log(110e) + 2 log(log(n) / delta'))) + V/2``; otherwise
    ``sqrt(2 (1/n^2 + V)(1 + log(1 + n^2 V)/2) log(4 log2(n) / delta')) + V/2``. (We read the
    extracted text's ``log log(4/delta' log2 n)`` as ``log(4 log2(n) / delta')``, Rogers et al.'s
    form.) It is the baseline the three odometers above improve on.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got n={n!r}")
    delta_prime = check.probability("delta_prime", delta_prime)
    if delta_prime > 1.0 / math.e:
        raise ValueError(f"delta_prime must be <= 1/e, got delta_prime={delta_prime!r}")
    v = _variance(variance)
    inner = np.sqrt(2.0 * v * (math.log(110.0 * math.e) + 2.0 * math.log(math.log(n) / delta_prime)))
    outer = np.sqrt(
        2.0 * (1.0 / n**2 + v) * (1.0 + 0.5 * np.log1p(n**2 * v)) * math.log(4.0 * math.log2(n) / delta_prime)
    )
    in_band = (v >= 1.0 / n**2) & (v <= 1.0)
    return np.where(in_band, inner, outer) + v / 2.0


def _variance(variance: Any) -> Any:
    v = check.real_array("variance", variance, minimum=0.0)
    return v if v.ndim else float(v)


_ODOMETERS: dict[str, Callable[..., Any]] = {
    "filter": filter_odometer,
    "mixture": mixture_odometer,
    "stitched": stitched_odometer,
    "rogers": rogers_odometer,
}


@dataclass
class Odometer:
    """A running ``delta``-privacy odometer over adaptively chosen ``(eps_n, delta_n)`` steps.

    ``kind`` is one of ``filter``, ``mixture``, ``stitched``, ``rogers``; ``params`` are that
    formula's keyword parameters (``delta_prime`` plus ``epsilon``, ``rho``, ``v0`` or ``n``).
    Once ``sum delta_n`` would exceed ``delta_double_prime`` the bound is infinite (the
    ``n > N`` branch of Whitehouse et al., Theorem 2).
    """

    kind: str
    params: dict[str, float]
    delta_double_prime: float = 0.0
    _variance: Fraction = field(default=Fraction(0), init=False, repr=False)
    _delta_sum: Fraction = field(default=Fraction(0), init=False, repr=False)
    _exhausted: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in _ODOMETERS:
            raise ValueError(f"kind must be one of {tuple(_ODOMETERS)}, got kind={self.kind!r}")
        check.non_negative("delta_double_prime", self.delta_double_prime)
        _ODOMETERS[self.kind](0.0, **self.params)  # validates the parameters now

    def record(self, epsilon: float, delta: float = 0.0) -> None:
        """Record one step that is ``(epsilon, delta)``-pDP conditionally on the past."""
        eps = Fraction(check.non_negative("epsilon", epsilon))
        self._delta_sum += Fraction(check.non_negative("delta", delta))
        self._variance += eps * eps
        if self._delta_sum > Fraction(self.delta_double_prime):
            self._exhausted = True

    @property
    def variance(self) -> float:
        return float(self._variance)

    def epsilon(self) -> float:
        """The current bound on the privacy loss (``inf`` once the delta budget is exceeded)."""
        if self._exhausted:
            return math.inf
        return float(_ODOMETERS[self.kind](float(self._variance), **self.params))
