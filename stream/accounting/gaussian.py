"""The Gaussian mechanism's individual charge, in zCDP units.

Releasing ``sum_i q(x_i) + N(0, s^2 I_d)`` costs user ``i`` exactly
``rho(i) = ||q(x_i)||^2 / (2 s^2)`` in zCDP (Bun & Steinke 2016, Prop. 1.6; the individual
version is Feldman & Zrnic, Section 4.2): ``(alpha, alpha*rho(i))``-RDP at every order, and
``sqrt(2 rho(i))``-GDP.

:func:`gaussian_charge` returns that number *rounded up*: the ledger compares sums of charges
against a budget, so a charge computed a few ulps low, or a tiny non-zero contribution whose
square underflows to zero, would let a user spend more than the budget without it showing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.xp import array_module, maybe_any

# Relative error of a float64 sum of d squares is below d * 2^-53; with d <= MAX_DIM this factor
# is an upper bound on the computed-vs-exact ratio of ||q||^2 / (2 s^2).
MAX_DIM = 4096
_ROUND_UP = 1.0 + 1e-12
# Smallest positive float64: the charge of any non-zero contribution, however tiny.
_TINIEST = float(np.nextafter(0.0, 1.0))
# Below this a computed ||q||^2 may have lost its relative precision to subnormal rounding
# (float64's smallest normal is 2**-1022), so such rows are recomputed in a scaled form.
_SUBNORMAL_RISK = 2.0**-1000


def squared_norms(contributions: Any) -> Any:
    """Row-wise squared L2 norms of a ``(n, d)`` array (NumPy or CuPy), computed without overflow
    for any finite input: rows whose plain sum of squares overflows are scaled by their largest
    magnitude first. No host round trip on a device (the rescaling pass is masked, see
    :func:`renyi_stream.stream.xp.maybe_any`)."""
    xp = array_module(contributions)
    sq = xp.einsum("ij,ij->i", contributions, contributions)
    if contributions.shape[1] <= 1:  # at most one square: rescaling gives the same inf, skip it
        return sq
    overflow = ~xp.isfinite(sq)
    if maybe_any(overflow):
        scale = xp.where(overflow, xp.max(xp.abs(contributions), axis=1), 1.0)
        scaled = contributions / scale[:, None]
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite rows stay non-finite
            sq = xp.where(overflow, xp.einsum("ij,ij->i", scaled, scaled) * scale * scale, sq)  # may be inf: fine
    return sq


def nonzero_rows(contributions: Any) -> Any:
    """Boolean ``(n,)``: which rows have any non-zero coordinate."""
    if contributions.shape[1] == 1:
        return contributions[:, 0] != 0.0
    return (contributions != 0.0).any(axis=1)


def gaussian_charge(*, contributions: Any, noise_std: float) -> Any:
    """Upper bound on each row's zCDP charge ``||q||^2 / (2 s^2)`` under noise std ``s``.

    ``contributions`` is ``(n, d)`` float64, finite. Returns ``(n,)`` float64 on the same device:
    ``0`` exactly for all-zero rows, ``> 0`` for every other row (never underflowing to 0), and
    ``inf`` where the true charge exceeds float64 range. Never below the exact charge: the
    relative factor covers the rounding of the ``d``-term sum and the division, and adding the
    smallest subnormal covers results too small for relative bounds. On a device it makes no
    host round trip: the rare-case passes (overflowing and subnormal rows) run masked over every
    row instead of on the rows found by asking the device.
    """
    noise_std = check.positive("noise_std", noise_std)
    xp = array_module(contributions)
    if contributions.ndim != 2:
        raise ValueError(f"contributions must be 2-d (rows, dim), got shape={contributions.shape}")
    if contributions.shape[1] > MAX_DIM:
        raise ValueError(f"contributions dim must be <= {MAX_DIM}, got dim={contributions.shape[1]}")
    sq = squared_norms(contributions)
    nonzero = nonzero_rows(contributions)
    with np.errstate(over="ignore", under="ignore"):
        charge = sq * (_ROUND_UP / (2.0 * noise_std * noise_std))
        tiny = nonzero & (sq < _SUBNORMAL_RISK)
        if contributions.shape[1] and maybe_any(tiny):  # on a device: always, masked (no host round trip)
            with np.errstate(invalid="ignore"):  # rows that are not tiny are discarded by the mask
                charge = xp.where(tiny, _tiny_row_charge(contributions, noise_std), charge)
        charge += _TINIEST
    return xp.where(nonzero, charge, 0.0)


def _tiny_row_charge(rows: Any, noise_std: float) -> Any:
    """The rounded-up charge of rows whose squares fall into float64's subnormal range.

    Each row is divided by the power of two ``2**e`` nearest its largest magnitude (exact), the
    charge of the scaled row (a normal number: its squares sum to ``[0.25, d]``) is rounded up,
    and ``2**(2e)`` is applied last with ``ldexp``, whose single rounding (at most half the
    smallest subnormal) the caller's ``+ _TINIEST`` covers.
    """
    xp = array_module(rows)
    _, exponent = xp.frexp(xp.max(xp.abs(rows), axis=1))
    scaled = xp.ldexp(rows, -exponent[:, None])
    inner = xp.einsum("ij,ij->i", scaled, scaled) * (_ROUND_UP / (2.0 * noise_std * noise_std))
    return xp.ldexp(inner, 2 * exponent)
