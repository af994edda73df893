"""Directed rounding for budget arithmetic, without switching the FPU rounding mode.

Privacy budgets are compared against sums of float64 charges; a sum rounded down could admit a
spend the exact sum would refuse. For a float64 value ``v >= 0`` produced by one correctly
rounded operation (relative error <= 2^-53 in the normal range; additions of subnormals are
exact and products of subnormals err by at most half the smallest subnormal),
``v * (1 + 2^-50) + tiniest`` is at least the exact result and ``v * (1 - 2^-50) - tiniest``
is at most it. Both are two vectorised operations on NumPy or CuPy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TINIEST = float(np.nextafter(0.0, 1.0))  # the smallest positive float64 (subnormal)
_UP = 1.0 + 2.0**-50
_DOWN = 1.0 - 2.0**-50


def round_up(values: Any) -> Any:
    """An upper bound on the exact result of the one operation that produced ``values`` (>= 0)."""
    with np.errstate(over="ignore"):
        return values * _UP + TINIEST


def round_down(values: Any) -> Any:
    """A lower bound on the exact result of the one operation that produced ``values`` (>= 0)."""
    return values * _DOWN - TINIEST
