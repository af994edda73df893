"""Bisection to the last float: the root finder behind every numerically inverted budget.

Calibration inverts monotone curves (delta of mu-GDP in mu, epsilon of rho-zCDP in rho). A
bracketing bisection on the *predicate* ("keeps the promise"), run until the bracket's ends are
adjacent floats, returns a point where the predicate was evaluated true: the answer is on the
safe side of the curve as computed, with no solver tolerance to argue about, and it uses only
the standard library (no scipy import on the calibration path).
"""

from __future__ import annotations

from typing import Callable


def _adjacent(low_side: Callable[[float], bool], lo: float, hi: float) -> tuple[float, float]:
    """Halve ``[lo, hi]`` until its ends are adjacent floats, keeping ``low_side(lo)`` true and
    ``low_side(hi)`` false (as the caller guarantees at the start)."""
    if not lo < hi:
        raise ValueError(f"bracket must have lo < hi, got lo={lo!r}, hi={hi!r}")
    while True:
        mid = lo + 0.5 * (hi - lo)
        if not lo < mid < hi:
            return lo, hi
        if low_side(mid):
            lo = mid
        else:
            hi = mid


def last_true(keeps: Callable[[float], bool], lo: float, hi: float) -> float:
    """The largest ``x`` in ``[lo, hi)`` found with ``keeps(x)`` true, to adjacent floats.

    Requires ``keeps(lo)`` true, ``keeps(hi)`` false and ``keeps`` monotone (true, then false).
    Returns ``lo`` itself when the bracket cannot be split. At most about 1,100 halvings
    (the whole float range); about 60 for a bracket within a few powers of two of the answer.
    """
    return _adjacent(keeps, lo, hi)[0]


def first_true(keeps: Callable[[float], bool], lo: float, hi: float) -> float:
    """The smallest ``x`` in ``(lo, hi]`` found with ``keeps(x)`` true, to adjacent floats.

    Requires ``keeps(lo)`` false, ``keeps(hi)`` true and ``keeps`` monotone (false, then true).
    Returns ``hi`` itself when the bracket cannot be split.
    """
    return _adjacent(lambda x: not keeps(x), lo, hi)[1]
