"""Privacy filters: stopping rules that keep a fully adaptive interaction within a budget.

A filter sees each step's privacy parameter *before* the step runs (the parameter may depend on
earlier outputs) and answers whether the step may run. ``try_spend`` returns ``True`` and
records the spend if the interaction stays valid with it, and ``False`` (recording nothing) if
it would not; a refused step may be replaced by a cheaper one and asked again (Feldman & Zrnic,
remark after Lemma 4.2).

Sums are kept exactly (``fractions.Fraction`` over the float inputs) and every threshold that
needs a square root is shrunk by a relative 1e-12, so no float rounding can admit a spend past
the budget: ``try_spend`` never overshoots, which the property tests check.
"""

from __future__ import annotations

import math
from fractions import Fraction

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting.conversions import (
    epsilon_to_gdp,
    epsilon_to_zcdp_cks,
    epsilon_to_zcdp_thm49,
)

_THRESHOLD_SAFETY = Fraction(1) - Fraction(1, 10**12)


class _SumFilter:
    """Admit a step iff the exact running sum of its ``cost`` stays ``<= limit``."""

    def __init__(self, limit: float) -> None:
        self._limit = Fraction(limit)
        self._spent = Fraction(0)
        self._steps = 0

    def _admit(self, cost: float) -> bool:
        total = self._spent + Fraction(cost)
        if total > self._limit:
            return False
        self._spent = total
        self._steps += 1
        return True

    @property
    def steps(self) -> int:
        """How many spends were admitted."""
        return self._steps


class RenyiFilter(_SumFilter):
    """Renyi privacy filter of order ``alpha`` and budget ``B`` (Feldman & Zrnic, Theorem 4.3).

    Continues while ``sum_t rho_t <= B``, where ``rho_t`` is step t's RDP at order ``alpha``
    conditional on the past; the whole interaction is then ``(alpha, B)``-RDP.
    """

    def __init__(self, *, alpha: float, budget: float) -> None:
        self.alpha = check.order("alpha", alpha)
        self.budget = check.positive("budget", budget)
        super().__init__(self.budget)

    def try_spend(self, rdp: float) -> bool:
        """Admit a step that is ``(alpha, rdp)``-RDP, if the budget allows."""
        return self._admit(check.non_negative("rdp", rdp))

    @property
    def spent(self) -> float:
        return float(self._spent)


class ZCDPFilter(_SumFilter):
    """zCDP filter with budget ``kappa`` (Feldman & Zrnic, Remark 4.4).

    The Renyi filter at order ``alpha`` with budget ``alpha*kappa`` halts iff
    ``sum_t rho_t > kappa`` whatever ``alpha``, so the interaction is ``kappa``-zCDP.
    """

    def __init__(self, *, budget: float) -> None:
        self.budget = check.positive("budget", budget)
        super().__init__(self.budget)

    def try_spend(self, rho: float) -> bool:
        """Admit a ``rho``-zCDP step, if the budget allows."""
        return self._admit(check.non_negative("rho", rho))

    @property
    def spent(self) -> float:
        return float(self._spent)


class DPFilterViaZCDP(_SumFilter):
    """DP filter for pure-DP steps via zCDP (Feldman & Zrnic, Theorem 4.9).

    An ``eps_t``-DP step is ``eps_t^2/2``-zCDP; continuing while ``sum_t eps_t^2 / 2 <= B*``
    gives ``(epsilon, delta)``-DP, with ``B*`` from the seed's closed form (``conversion=
    "thm49"``) or the tighter Canonne-Kamath-Steinke conversion (``conversion="cks"``).

    ``b_star`` is the conversion's float value; the filter compares the exact sum against
    ``b_star`` shrunk by a relative 1e-12, because the float ``B*`` lies above the exact real
    ``B*`` in about half of all cases (by up to 7e-16 relative), and a spend between the two
    would pass the promise.
    """

    def __init__(self, *, epsilon: float, delta: float, conversion: str = "thm49") -> None:
        self.epsilon = check.positive("epsilon", epsilon)
        self.delta = check.probability("delta", delta)
        if conversion == "thm49":
            self.b_star = epsilon_to_zcdp_thm49(self.epsilon, self.delta)
        elif conversion == "cks":
            self.b_star = epsilon_to_zcdp_cks(self.epsilon, self.delta)
        else:
            raise ValueError(f"conversion must be 'thm49' or 'cks', got conversion={conversion!r}")
        self.conversion = conversion
        super().__init__(self.b_star)
        self._limit = Fraction(self.b_star) * _THRESHOLD_SAFETY

    def try_spend(self, epsilon: float) -> bool:
        """Admit an ``epsilon``-DP step, if the budget allows."""
        step = Fraction(check.non_negative("epsilon", epsilon))
        total = self._spent + step * step / 2
        if total > self._limit:
            return False
        self._spent = total
        self._steps += 1
        return True


class GDPFilter(_SumFilter):
    """Gaussian DP filter (Smith & Thakurta 2022, Theorem 1.1).

    Continues while ``sum_t mu_t^2 <= mu^2``; the fully adaptive interaction is then ``mu``-GDP.
    Construct from ``mu`` or from a promise with :meth:`for_epsilon_delta`.
    """

    def __init__(self, *, mu: float) -> None:
        self.mu = check.positive("mu", mu)
        super().__init__(self.mu)
        self._limit = Fraction(self.mu) ** 2

    @classmethod
    def for_epsilon_delta(cls, *, epsilon: float, delta: float) -> "GDPFilter":
        """The filter whose whole interaction is ``(epsilon, delta)``-DP (Dong, Roth & Su Cor. 2.13)."""
        return cls(mu=epsilon_to_gdp(epsilon, delta))

    def try_spend(self, mu: float) -> bool:
        """Admit a ``mu``-GDP step, if the budget allows."""
        step = Fraction(check.non_negative("mu", mu))
        total = self._spent + step * step
        if total > self._limit:
            return False
        self._spent = total
        self._steps += 1
        return True


class AdvancedCompositionFilter:
    """Whitehouse, Ramdas, Rogers & Wu (2023), Theorem 1: a filter at the rate of advanced composition.

    With ``delta = delta' + delta''``: continue while
    ``sqrt(2 log(1/delta') V) + V/2 <= epsilon`` and ``sum_n delta_n <= delta''``, where
    ``V = sum_n eps_n^2``. The interaction is then ``(epsilon, delta)``-DP for conditionally
    ``(eps_n, delta_n)``-DP steps.

    The first condition is ``V <= V*`` with ``V* = (sqrt(2L + 2 epsilon) - sqrt(2L))^2``,
    ``L = log(1/delta')``; ``V*`` is shrunk by 1e-12 relative before the exact comparison.
    """

    def __init__(self, *, epsilon: float, delta_prime: float, delta_double_prime: float = 0.0) -> None:
        self.epsilon = check.positive("epsilon", epsilon)
        self.delta_prime = check.probability("delta_prime", delta_prime)
        self.delta_double_prime = check.non_negative("delta_double_prime", delta_double_prime)
        if self.delta_prime + self.delta_double_prime >= 1.0:
            raise ValueError(
                "delta_prime + delta_double_prime must be < 1, got "
                f"{self.delta_prime} + {self.delta_double_prime}"
            )
        two_log = 2.0 * math.log(1.0 / self.delta_prime)
        v_star = (2.0 * self.epsilon) ** 2 / (
            math.sqrt(two_log + 2.0 * self.epsilon) + math.sqrt(two_log)
        ) ** 2
        self.variance_limit = v_star
        self._v_limit = Fraction(v_star) * _THRESHOLD_SAFETY
        self._delta_limit = Fraction(self.delta_double_prime)
        self._v = Fraction(0)
        self._delta_sum = Fraction(0)
        self._steps = 0

    def try_spend(self, epsilon: float, delta: float = 0.0) -> bool:
        """Admit a conditionally ``(epsilon, delta)``-DP step, if the filter allows."""
        eps = Fraction(check.non_negative("epsilon", epsilon))
        new_v = self._v + eps * eps
        new_delta = self._delta_sum + Fraction(check.non_negative("delta", delta))
        if new_v > self._v_limit or new_delta > self._delta_limit:
            return False
        self._v, self._delta_sum = new_v, new_delta
        self._steps += 1
        return True

    @property
    def variance(self) -> float:
        """``V = sum eps_n^2`` of the admitted steps (the "intrinsic time")."""
        return float(self._v)

    @property
    def steps(self) -> int:
        return self._steps

    def epsilon_spent(self) -> float:
        """``sqrt(2 log(1/delta') V) + V/2`` for the admitted steps (at most ``epsilon``)."""
        v = float(self._v)
        return math.sqrt(2.0 * math.log(1.0 / self.delta_prime) * v) + 0.5 * v
