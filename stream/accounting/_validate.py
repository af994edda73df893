"""Boundary checks shared by the accounting modules.

Every public accounting function validates here and raises ``ValueError`` naming the
parameter, the value and the allowed range (STYLE habit 4), before any arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _is_real_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def real(name: str, value: Any) -> float:
    """``value`` as a finite float, else ``ValueError`` naming ``name``."""
    if not _is_real_scalar(value):
        raise ValueError(f"{name} must be a real number, got {name}={value!r}")
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{name} must be finite, got {name}={value!r}")
    return as_float


def positive(name: str, value: Any) -> float:
    as_float = real(name, value)
    if as_float <= 0:
        raise ValueError(f"{name} must be > 0, got {name}={value!r}")
    return as_float


def non_negative(name: str, value: Any) -> float:
    as_float = real(name, value)
    if as_float < 0:
        raise ValueError(f"{name} must be >= 0, got {name}={value!r}")
    return as_float


def probability(name: str, value: Any) -> float:
    """A delta: strictly inside (0, 1)."""
    as_float = real(name, value)
    if not 0.0 < as_float < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {name}={value!r}")
    return as_float


def order(name: str, value: Any) -> float:
    """A Renyi order alpha > 1."""
    as_float = real(name, value)
    if as_float <= 1.0:
        raise ValueError(f"{name} must be > 1, got {name}={value!r}")
    return as_float


def real_array(name: str, value: Any, *, minimum: float | None = None) -> np.ndarray:
    """``value`` as a float64 array of finite numbers, each >= ``minimum`` when given."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric, got {name}={value!r}") from exc
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got {name}={value!r}")
    if minimum is not None and np.any(array < minimum):
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value!r}")
    return array
