"""Buffered Linear Toeplitz (BLT) factorisation: the square root's error with a few numbers of state.

Dvijotham, McMahan, Pillutla, Steinke & Thakurta 2024, "Efficient and Near-Optimal Noise
Generation for Streaming Differential Privacy" (FOCS; arXiv:2404.16706); the inverse of a BLT is a
BLT: McMahan & Pillutla 2025, "An Inversion Theorem for Buffered Linear Toeplitz (BLT) Matrices and
Applications to Streaming Differential Privacy" (arXiv:2504.21413). Read, not copied, against
google-deepmind/jax_privacy, ``matrix_factorization/buffered_toeplitz.py``.

The matrix. ``C`` is lower-triangular Toeplitz with first column

    c_0 = 1,    c_k = sum_j omega_j theta_j^(k-1)    (k >= 1),

``n`` buffers (``theta`` the buffer decays, ``omega`` the output scales, ``|theta_j| < 1``). Its
generating function is rational, ``sum_k c_k z^k = prod_j (1 - theta_hat_j z) / prod_j (1 -
theta_j z)``, so ``C^{-1}`` is the BLT with the roles of the two products swapped: decays
``theta_hat`` and scales ``omega_hat`` (:func:`inverse_parameters`). The running-total estimate is
``B y`` with ``B = A C^{-1}``, Toeplitz with first column ``b_k = sum_{l<=k} c^{-1}_l``.

Streaming, with ``O(n d)`` state (Dvijotham et al. 2024, Algorithms 2 and 3 of McMahan et al.
2024, arXiv:2408.08868). Buffers ``S_j(t) = sum_{s<t} theta_j^(t-1-s) a_s``:

* encode (:meth:`BufferedLinearToeplitz.encode_step`): ``(C a)_t = a_t + sum_j omega_j S_j(t)``,
  then ``S_j(t+1) = theta_j S_j(t) + a_t``;
* decode (:meth:`BufferedLinearToeplitz.decode_step`): ``u_t = y_t - sum_j omega_j U_j(t)``
  (that is ``(C^{-1} y)_t``, forward substitution with ``C``'s own parameters), ``U_j(t+1) =
  theta_j U_j(t) + u_t``, and the estimate is the running sum of ``u``. No inverse parameters are
  needed to decode; they are derived for the error formulas and tested against the recurrence.

The objective (what "optimised for a horizon ``T``" means here). Max error on prefix sums, as the
issue states it: the largest std over ``t < T`` of the running-total estimate, for noise
calibrated to the sensitivity,

    loss(C) = sens^2(C) * max_{t<T} ||B_t||^2,    sens^2(C) = sum_{k<T} c_k^2,

whose square root is the max error in units of ``sqrt(sens^2 / mu^2)`` (``mu`` the GDP
parameter). ``B`` is lower-triangular Toeplitz, so ``||B_t||^2 = sum_{k<=t} b_k^2`` grows with
``t`` and the max is at ``t = T - 1``. The mean over ``t`` is not used.

Which sensitivity, and why it is the apples-to-apples one. Running totals here are charged by
the prepaid rule (:mod:`renyi_stream.stream.continual.prepaid`): a contribution ``x`` admitted at ``t`` is
charged, once, the increase of ``||C x_i||^2`` over the rest of the declared schedule ``[t, T)``,
so a user's charges sum to exactly ``||C x_i^admitted||^2`` over the ``T`` rows and the noise is
``s^2 = B_norm / mu^2`` for the norm budget ``B_norm`` those totals must fit in (Feldman & Zrnic,
Corollary 4.7). For a user who contributes one unit once, at day ``t``, the total is
``sum_{k<T-t} c_k^2``, largest at ``t = 0``: ``sum_{k<T} c_k^2``, the norm of ``C``'s first column,
which is the single-participation sensitivity of Dvijotham et al. and the ``sens^2`` above
(``sensitivity="horizon"``, the default and what the shipped parameters optimise). The square
root is charged by the same rule over the same ``T`` rows (its infinite tail diverges:
``c_k^2 ~ 1 / (pi k)``), so ``sens^2`` is the same functional of ``C`` for both: the
comparison is apples to apples. Two alternatives, and why not:

* the infinite tail (``sensitivity="tail"``, ``sens^2 = sum_{k>=0} c_k^2``, finite for a BLT):
  the charge when the query has no declared end. It pays for releases after ``T`` that the
  square root never makes; with the horizon-optimised parameters it costs ``7.5%`` more
  variance for a one-day user at ``T = 365``, and 60% to 75% more norm budget for users
  active on 5% or 50% of days. :func:`optimize_blt` offers it for queries without an end.
* the user-level norm budget (a quantile of ``||C x||^2`` over users of a public model): it is
  what sets the noise in a deployment, but it depends on the model (activity rate, dim). For
  Bernoulli(0.05) and Bernoulli(0.5) users at ``T = 365``, the max error at the 99.9% quantile
  of each one's own ``||C x||^2`` is within 0.02% of the square root's (measured,
  ``tests/test_blt.py::test_under_the_user_level_norm_budget_the_blt_error_is_within_1_percent_of_sqrt``),
  so the single-participation optimum carries over.

Shipped parameters (:data:`SHIPPED_PARAMETERS`): optimised by :func:`optimize_blt` (L-BFGS-B
on the interlaced decays ``1 > theta_1 > theta_hat_1 > ... > theta_n > theta_hat_n > 0``, which
keep ``omega > 0`` and ``omega_hat < 0``, McMahan & Pillutla 2025 Theorem 1, with an analytic
gradient) for ``T`` in :data:`SHIPPED_HORIZONS` and 3 or 4 buffers;
``tests/test_blt.py`` re-derives each to ``1e-7`` on the objective. Max error relative to the
square root (std units, ``sqrt(loss_blt / loss_sqrt)``), measured:

=====  ==========  ==========
T      3 buffers   4 buffers
=====  ==========  ==========
90     1.000042    1.0000009
365    1.000461    1.000024
730    1.001078    1.000074
1095   1.001649    1.000130
4096   1.004979    1.000581
=====  ==========  ==========

So 4 buffers are within 0.1% of the square root at every shipped horizon, 365 and 4096
included, and 3 buffers up to ``T = 365``; the default is 4 (state ``4 d`` numbers per user and
per query, plus a day).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from renyi_stream.stream.continual.strategies import (Strategy, _count, _one_release, register_strategy,
                                                      sqrt_coefficients)
from renyi_stream.stream.xp import array_module

SHIPPED_HORIZONS: tuple[int, ...] = (90, 365, 730, 1095, 4096)
DEFAULT_HORIZON = 365
DEFAULT_BUFFERS = 4
MAX_BUFFERS = 8
SENSITIVITIES = ("horizon", "tail")

# (horizon, buffers) -> (theta, omega), from optimize_blt(horizon, buffers) (sensitivity
# "horizon"); tests/test_blt.py re-derives every entry and compares the objective.
SHIPPED_PARAMETERS: dict[tuple[int, int], tuple[tuple[float, ...], tuple[float, ...]]] = {
    (90, 3): ((0.9919497397072379, 0.8982433108072699, 0.5076600193514856),
                 (0.1182016340375422, 0.17747460106188406, 0.20286175732664735)),
    (90, 4): ((0.9941876544095432, 0.9387299003879056, 0.7611643010326448, 0.34095903172664255),
                 (0.09853913260879854, 0.12105086184530331, 0.16238062331301817, 0.1179693359719381)),
    (365, 3): ((0.9975178377474889, 0.9582118659313368, 0.6574331550675087),
                 (0.06764599616591455, 0.14598587048482597, 0.27658031902414676)),
    (365, 4): ((0.9981218950635614, 0.9765210134825387, 0.8724328531275388, 0.47313377060904366),
                 (0.057168320925638096, 0.08910930489206695, 0.16832208726960923, 0.18450824055688894)),
    (730, 3): ((0.9986283814294298, 0.9733397276440767, 0.717557720957331),
                 (0.050996609992372585, 0.12869621376349902, 0.3019850181697388)),
    (730, 4): ((0.9989637594144336, 0.9857595453651755, 0.907943025787481, 0.5341448468176462),
                 (0.042885247673953825, 0.07525230843596664, 0.16368204690159915, 0.21595534502951957)),
    (1095, 3): ((0.9990299550291681, 0.9794613586516429, 0.748106514919155),
                 (0.04324909580438226, 0.11896595312453369, 0.3130257367541859)),
    (1095, 4): ((0.9992734428811255, 0.9894383377921286, 0.9243466271505174, 0.5683570257501757),
                 (0.036110144934121916, 0.06777154312399905, 0.1592437635062671, 0.2333738996596586)),
    (4096, 3): ((0.9996820126624634, 0.9910029716516887, 0.8263652489718456),
                 (0.025529441581166677, 0.09095414612525668, 0.33154434801559723)),
    (4096, 4): ((0.9997748407589843, 0.9960497157807489, 0.960515744472659, 0.6684024387121065),
                 (0.020466021768750908, 0.04735541753517254, 0.13962918061712637, 0.2814195438845856)),
}

# The closed-form inverse needs distinct decays; below this gap it loses all precision.
_MIN_DECAY_GAP = 1e-9
# Imaginary parts (relative to the decays) tolerated in the eigenvalues of the inverse.
_REAL_TOLERANCE = 1e-9


def _parameters(name: str, values: Any) -> tuple[float, ...]:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {name}={values!r}") from None
    if array.ndim != 1 or not 1 <= array.size <= MAX_BUFFERS:
        raise ValueError(f"{name} must hold 1 to {MAX_BUFFERS} numbers, got {name}={values!r}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} must be finite, got {name}={values!r}")
    return tuple(float(v) for v in array)


def _check_decays(theta: np.ndarray, name: str = "theta") -> None:
    if not np.all(np.abs(theta) < 1.0):
        raise ValueError(f"{name} must lie in (-1, 1) (|theta_j| < 1), got {name}={theta.tolist()!r}")
    if theta.size > 1:
        gaps = np.abs(theta[:, None] - theta[None, :]) + np.eye(theta.size)
        if gaps.min() < _MIN_DECAY_GAP:
            raise ValueError(f"{name} must be distinct (gaps >= {_MIN_DECAY_GAP:g}), got {name}={theta.tolist()!r}")


# --------------------------------------------------------------------------- the coefficients


def blt_coefficients(theta: Sequence[float], omega: Sequence[float], n: int) -> np.ndarray:
    """``c_0 .. c_{n-1}`` of the BLT ``(theta, omega)``: ``c_0 = 1``, ``c_k = sum_j omega_j
    theta_j^(k-1)``. Float64 on the host (public constants); ``O(n * buffers)``."""
    n = _count("n", n, minimum=0)
    theta_a, omega_a = np.asarray(theta, dtype=np.float64), np.asarray(omega, dtype=np.float64)
    out = np.empty(n)
    if n:
        out[0] = 1.0
        powers = theta_a[None, :] ** np.arange(n - 1, dtype=np.float64)[:, None]  # (n-1, buffers)
        out[1:] = powers @ omega_a
    return out


def omega_from_decays(theta: Sequence[float], theta_hat: Sequence[float]) -> np.ndarray:
    """The output scales of the BLT whose generating function is ``prod_j (1 - theta_hat_j z) /
    prod_j (1 - theta_j z)``: ``omega_i = prod_j (theta_i - theta_hat_j) / prod_{j != i}
    (theta_i - theta_j)`` (Dvijotham et al. 2024, Lemma 5.2; McMahan & Pillutla 2025, Theorem 2).

    With the arguments swapped it gives the inverse's scales: the BLT ``(theta, omega)`` and
    ``(theta_hat, omega_from_decays(theta_hat, theta))`` are inverse matrices.
    """
    t = np.asarray(theta, dtype=np.float64)
    h = np.asarray(theta_hat, dtype=np.float64)
    numerators = np.prod(t[:, None] - h[None, :], axis=1)
    differences = t[:, None] - t[None, :]
    np.fill_diagonal(differences, 1.0)
    return numerators / np.prod(differences, axis=1)


def inverse_parameters(theta: Sequence[float], omega: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """``(theta_hat, omega_hat)``: the BLT of ``C^{-1}`` (McMahan & Pillutla 2025, Theorem 2).

    Decoding ``C u = y`` by forward substitution runs the buffers through ``Theta - 1 omega^T``
    (``U(t+1) = Theta U(t) + 1 (y_t - omega^T U(t))``), so the inverse's decays are that
    matrix's eigenvalues (the zeros of ``C``'s generating function, inverted) and its scales
    follow from :func:`omega_from_decays`. Raises ``ValueError`` when the eigenvalues are not
    real, distinct and inside ``(-1, 1)``: then ``C^{-1}`` is no stable real BLT (its decode
    would grow), which never happens for the shipped or optimised parameters (``omega > 0`` and
    interlaced decays, McMahan & Pillutla 2025 Theorem 1).
    """
    t = np.asarray(_parameters("theta", theta))
    w = np.asarray(_parameters("omega", omega))
    if t.size != w.size:
        raise ValueError(f"theta and omega must have the same length, got {t.size} and {w.size}")
    _check_decays(t)
    eigenvalues = np.linalg.eigvals(np.diag(t) - np.outer(np.ones(t.size), w))
    if np.abs(eigenvalues.imag).max() > _REAL_TOLERANCE:
        raise ValueError(f"theta={t.tolist()!r}, omega={w.tolist()!r} has no real BLT inverse "
                         f"(complex decays {eigenvalues.tolist()!r})")
    theta_hat = np.sort(eigenvalues.real)[::-1].copy()
    _check_decays(theta_hat, "the inverse's decays theta_hat")
    return theta_hat, omega_from_decays(theta_hat, t)


# --------------------------------------------------------------------------- the objective


def _sensitivity(sensitivity: str) -> str:
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"sensitivity must be one of {SENSITIVITIES}, got sensitivity={sensitivity!r}")
    return sensitivity


def tail_sq_norm(theta: Sequence[float], omega: Sequence[float]) -> float:
    """``sum_{k>=0} c_k^2 = 1 + sum_{i,j} omega_i omega_j / (1 - theta_i theta_j)``: the squared
    norm of ``C``'s whole first column (finite because ``|theta_j| < 1``)."""
    t = np.asarray(theta, dtype=np.float64)
    w = np.asarray(omega, dtype=np.float64)
    return float(1.0 + np.sum(np.outer(w, w) / (1.0 - np.outer(t, t))))


def max_error_loss(theta: Sequence[float], omega: Sequence[float], horizon: int, *,
                   sensitivity: str = "horizon") -> float:
    """``sens^2(C) * max_{t<T} ||B_t||^2`` for the BLT ``(theta, omega)`` (module docstring).

    ``sensitivity="horizon"``: ``sum_{k<T} c_k^2``; ``"tail"``: :func:`tail_sq_norm`. Its square
    root is the max std of the running-total estimate over ``T = horizon`` windows, for unit
    GDP noise calibrated to that sensitivity. ``O(T * buffers)``.
    """
    horizon = _count("horizon", horizon, minimum=1)
    sensitivity = _sensitivity(sensitivity)
    theta_hat, omega_hat = inverse_parameters(theta, omega)
    c = blt_coefficients(theta, omega, horizon)
    b = np.cumsum(blt_coefficients(theta_hat, omega_hat, horizon))
    sens = float(c @ c) if sensitivity == "horizon" else tail_sq_norm(theta, omega)
    return sens * float(b @ b)


def sqrt_max_error_loss(horizon: int) -> float:
    """The square root's ``sens^2 * max_t ||B_t||^2 = (sum_{k<T} c_k^2)^2`` (``B = C = A^{1/2}``,
    :func:`renyi_stream.stream.continual.strategies.sqrt_coefficients`)."""
    horizon = _count("horizon", horizon, minimum=1)
    c = sqrt_coefficients(horizon)
    return float(c @ c) ** 2


# --------------------------------------------------------------------------- optimisation


def _unpack(params: np.ndarray) -> np.ndarray:
    """Interlaced decays ``v_0 > v_1 > ... > v_{2n-1}`` in ``(0, 1)`` from unconstrained
    parameters: ``logit(v_0) = p_0``, ``logit(v_k) = logit(v_{k-1}) - exp(p_k)``."""
    logits = params[0] - np.concatenate([[0.0], np.cumsum(np.exp(params[1:]))])
    return 1.0 / (1.0 + np.exp(-logits))


def _pack(decays: np.ndarray) -> np.ndarray:
    logits = np.log(decays / (1.0 - decays))
    return np.concatenate([[logits[0]], np.log(-np.diff(logits))])


def _series(theta: np.ndarray, omega: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``c`` and its derivatives in ``theta`` and ``omega`` (rows ``k >= 1``)."""
    k = np.arange(horizon - 1, dtype=np.float64)[:, None]
    powers = theta[None, :] ** k  # theta^(k) for c_{k+1}
    c = np.concatenate([[1.0], powers @ omega])
    d_theta = np.where(k > 0, k * theta[None, :] ** np.maximum(k - 1.0, 0.0), 0.0) * omega[None, :]
    return c, d_theta, powers


def _log_omega_jacobian(theta: np.ndarray, theta_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``d log omega_i / d theta_l`` and ``d log omega_i / d theta_hat_j`` of
    :func:`omega_from_decays`."""
    n = theta.size
    to_hat = 1.0 / (theta[:, None] - theta_hat[None, :])
    differences = theta[:, None] - theta[None, :]
    np.fill_diagonal(differences, np.inf)
    to_theta = 1.0 / differences
    d_theta = to_theta.copy()
    d_theta[np.arange(n), np.arange(n)] = to_hat.sum(axis=1) - to_theta.sum(axis=1)
    return d_theta, -to_hat


def _objective(params: np.ndarray, horizon: int, sensitivity: str) -> tuple[float, np.ndarray]:
    """``log loss`` and its gradient in the unconstrained parameters (analytic)."""
    decays = _unpack(params)
    theta, theta_hat = decays[0::2], decays[1::2]
    omega, omega_hat = omega_from_decays(theta, theta_hat), omega_from_decays(theta_hat, theta)
    c, dc_theta, dc_omega = _series(theta, omega, horizon)
    c_inv, dci_theta, dci_omega = _series(theta_hat, omega_hat, horizon)
    b = np.cumsum(c_inv)
    error = float(b @ b)
    g_inv = 2.0 * np.cumsum(b[::-1])[::-1][1:] / error  # d log error / d c_inv_l, l >= 1
    g_theta_hat = g_inv @ dci_theta
    g_omega_hat = g_inv @ dci_omega
    if sensitivity == "horizon":
        sens = float(c @ c)
        g_c = 2.0 * c[1:] / sens
        g_theta = g_c @ dc_theta
        g_omega = g_c @ dc_omega
    else:
        denominator = 1.0 - np.outer(theta, theta)
        sens = 1.0 + float(np.sum(np.outer(omega, omega) / denominator))
        g_omega = 2.0 * (omega[None, :] / denominator).sum(axis=1) / sens
        g_theta = 2.0 * (omega[:, None] * omega[None, :] * theta[None, :] / denominator**2).sum(axis=1) / sens
    j_theta, j_hat = _log_omega_jacobian(theta, theta_hat)
    jh_hat, jh_theta = _log_omega_jacobian(theta_hat, theta)
    g_theta = g_theta + (g_omega * omega) @ j_theta + (g_omega_hat * omega_hat) @ jh_theta
    g_theta_hat = g_theta_hat + (g_omega * omega) @ j_hat + (g_omega_hat * omega_hat) @ jh_hat
    g_decays = np.empty_like(decays)
    g_decays[0::2], g_decays[1::2] = g_theta, g_theta_hat
    g_logits = g_decays * decays * (1.0 - decays)
    grad = np.empty_like(params)
    grad[0] = g_logits.sum()
    grad[1:] = -np.exp(params[1:]) * np.cumsum(g_logits[::-1])[::-1][1:]
    return math.log(sens) + math.log(error), grad


@dataclass(frozen=True)
class BLTFit:
    """The result of :func:`optimize_blt`: parameters, their inverse and the objective."""

    horizon: int
    sensitivity: str
    theta: tuple[float, ...]
    omega: tuple[float, ...]
    theta_hat: tuple[float, ...]
    omega_hat: tuple[float, ...]
    loss: float  # sens^2 * max_t ||B_t||^2 (max_error_loss)
    sqrt_loss: float  # the square root's, sqrt_max_error_loss(horizon)

    @property
    def error_ratio(self) -> float:
        """Max error (std) relative to the square root's: ``sqrt(loss / sqrt_loss)``."""
        return math.sqrt(self.loss / self.sqrt_loss)

    def strategy(self) -> "BufferedLinearToeplitz":
        return BufferedLinearToeplitz(theta=self.theta, omega=self.omega, horizon=self.horizon)


def optimize_blt(horizon: int, buffers: int = DEFAULT_BUFFERS, *, sensitivity: str = "horizon") -> BLTFit:
    """The BLT with ``buffers`` buffers minimising :func:`max_error_loss` over ``horizon`` windows.

    Parameterised by interlaced decays (``1 > theta_1 > theta_hat_1 > ... > theta_hat_n > 0``,
    logit scale, log gaps: unconstrained and always a valid pair ``C``, ``C^{-1}`` with
    ``omega > 0``), started from decays spread geometrically in ``1 - theta`` between
    ``0.5 / T`` and ``0.7``, minimised with L-BFGS-B on ``log loss`` with its analytic gradient,
    then restarted once from the result. Deterministic; a fraction of a second for ``T <= 4096``.
    ``sensitivity`` as in :func:`max_error_loss`.
    """
    from scipy.optimize import minimize  # scipy is a dependency; imported here to keep import light

    horizon = _count("horizon", horizon, minimum=2)
    buffers = _count("buffers", buffers, minimum=1)
    if buffers > MAX_BUFFERS:
        raise ValueError(f"buffers must be in [1, {MAX_BUFFERS}], got buffers={buffers}")
    sensitivity = _sensitivity(sensitivity)
    start = 1.0 - np.exp(np.linspace(math.log(0.5 / horizon), math.log(0.7), 2 * buffers))
    params = _pack(start)
    options = {"maxiter": 5000, "maxcor": 30, "ftol": 1e-16, "gtol": 1e-13}
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for _ in range(2):
            result = minimize(_objective, params, args=(horizon, sensitivity), jac=True, method="L-BFGS-B",
                              options=options)
            params = result.x
    decays = _unpack(params)
    theta = decays[0::2]
    omega = omega_from_decays(theta, decays[1::2])
    theta_hat, omega_hat = inverse_parameters(theta, omega)
    return BLTFit(horizon=horizon, sensitivity=sensitivity, theta=tuple(float(v) for v in theta),
                  omega=tuple(float(v) for v in omega), theta_hat=tuple(float(v) for v in theta_hat),
                  omega_hat=tuple(float(v) for v in omega_hat),
                  loss=max_error_loss(theta, omega, horizon, sensitivity=sensitivity),
                  sqrt_loss=sqrt_max_error_loss(horizon))


def shipped_parameters(horizon: int = DEFAULT_HORIZON, buffers: int = DEFAULT_BUFFERS) -> tuple[tuple[float, ...],
                                                                                                  tuple[float, ...]]:
    """``(theta, omega)`` shipped for ``horizon`` (one of :data:`SHIPPED_HORIZONS`) and ``buffers``
    (3 or 4). For another horizon call :func:`optimize_blt` (and record the parameters: the
    strategy's spec carries them)."""
    key = (horizon, buffers)
    if key not in SHIPPED_PARAMETERS:
        raise ValueError(f"(horizon, buffers) must be one of {sorted(SHIPPED_PARAMETERS)} for shipped parameters, "
                         f"got horizon={horizon!r}, buffers={buffers!r}; optimise others with optimize_blt")
    return SHIPPED_PARAMETERS[key]


# --------------------------------------------------------------------------- the strategy


@register_strategy
@dataclass(frozen=True)
class BufferedLinearToeplitz(Strategy):
    """``C`` a BLT (module docstring), ``B = A C^{-1}``: one row per window, ``O(buffers * d)``
    state to encode and to decode.

    ``BufferedLinearToeplitz()`` is the shipped 4-buffer BLT for ``T = 365``;
    ``BufferedLinearToeplitz(horizon=4096)`` the one for 4096; explicit ``theta`` and ``omega``
    (say from :func:`optimize_blt`) define any other; pass with them the horizon they were
    optimised for, or ``None`` (the default, 365, names the shipped set). ``horizon`` is a record
    (public, in the spec); the strategy itself releases for any number of windows
    (its error keeps growing like ``log t`` past the horizon, a little faster than the square
    root's). Under the prepaid rule the charges are a matter of the declared schedule, not of
    this field (:mod:`renyi_stream.stream.continual.prepaid`).
    """

    name: ClassVar[str] = "blt"
    theta: tuple[float, ...] = ()
    omega: tuple[float, ...] = ()
    horizon: int | None = DEFAULT_HORIZON
    _inverse: tuple[tuple[float, ...], tuple[float, ...]] = field(default=((), ()), init=False, repr=False,
                                                                  compare=False)

    def __post_init__(self) -> None:
        horizon = self.horizon
        if horizon is not None:
            horizon = _count("horizon", horizon, minimum=1)
        if not self.theta and not self.omega:
            if horizon is None:
                raise ValueError("horizon must name a shipped horizon when theta and omega are not given, got None")
            theta, omega = shipped_parameters(horizon, DEFAULT_BUFFERS)
        else:
            theta, omega = _parameters("theta", self.theta), _parameters("omega", self.omega)
        if len(theta) != len(omega):
            raise ValueError(f"theta and omega must have the same length, got {len(theta)} and {len(omega)}")
        theta_hat, omega_hat = inverse_parameters(theta, omega)  # validates the decays
        object.__setattr__(self, "theta", theta)
        object.__setattr__(self, "omega", omega)
        object.__setattr__(self, "horizon", horizon)
        object.__setattr__(self, "_inverse", (tuple(theta_hat.tolist()), tuple(omega_hat.tolist())))

    @classmethod
    def shipped(cls, horizon: int = DEFAULT_HORIZON, buffers: int = DEFAULT_BUFFERS) -> "BufferedLinearToeplitz":
        """The shipped BLT for ``horizon`` with ``buffers`` (3 or 4) buffers."""
        theta, omega = shipped_parameters(horizon, buffers)
        return cls(theta=theta, omega=omega, horizon=horizon)

    @property
    def buffers(self) -> int:
        return len(self.theta)

    def inverse(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(theta_hat, omega_hat)``: ``C^{-1}`` as a BLT (:func:`inverse_parameters`)."""
        return self._inverse

    # -- coefficients (public constants, on the host) ----------------------------------------

    def coefficients(self, n: int) -> np.ndarray:
        """``c_0 .. c_{n-1}`` (:func:`blt_coefficients`)."""
        return blt_coefficients(self.theta, self.omega, n)

    def inverse_coefficients(self, n: int) -> np.ndarray:
        """The first ``n`` coefficients of ``C^{-1}`` (a BLT with :meth:`inverse`'s parameters)."""
        return blt_coefficients(*self._inverse, n)

    def reconstruction_coefficients(self, n: int) -> np.ndarray:
        """``b_0 .. b_{n-1}``: the first column of ``B = A C^{-1}``, ``b_k = sum_{l<=k} c^{-1}_l``."""
        return np.cumsum(self.inverse_coefficients(n))

    # -- Strategy ------------------------------------------------------------------------------

    def rows_at(self, t: int) -> int:
        return 1

    @property
    def max_lag(self) -> int | None:
        return None  # every lag has a weight; the buffers summarise the history instead

    def _lag_weights(self, t: int, lags: Any) -> Any:
        xp = array_module(lags)
        return xp.asarray(self.coefficients(t + 1))[lags][None, :]  # public constants: uploaded

    def _device_parameters(self, xp: Any, trailing: int) -> tuple[Any, Any]:
        """``theta`` and ``omega`` shaped ``(buffers, 1, ..., 1)`` on ``xp`` (two uploads)."""
        shape = (self.buffers,) + (1,) * trailing
        return (xp.asarray(np.asarray(self.theta).reshape(shape)),
                xp.asarray(np.asarray(self.omega).reshape(shape)))

    def new_buffers(self, tail: tuple[int, ...], *, like: Any = None) -> Any:
        """Zero buffers ``(buffers, *tail)`` on the device of ``like`` (NumPy when ``None``)."""
        xp = np if like is None else array_module(like)
        return xp.zeros((self.buffers, *tail))

    def encode_step(self, buffers: Any, a: Any) -> tuple[Any, Any]:
        """``((C a)_t, buffers after t)`` from ``buffers`` (``S_j(t)``, shape ``(buffers, *tail)``)
        and ``a = a_t`` (shape ``tail``). Pure (returns new arrays; a re-run of a window from
        the same buffers gives the same bits). On a device: two uploads (the parameters), no
        transfer."""
        xp = array_module(buffers, a)
        theta, omega = self._device_parameters(xp, buffers.ndim - 1)
        return a + (omega * buffers).sum(axis=0), theta * buffers + a

    def decode_step(self, buffers: Any, estimate: Any, y: Any) -> tuple[Any, Any]:
        """``(estimate_t, buffers after t)`` from the decoder's ``buffers`` (``U_j(t)``), the
        previous ``estimate`` (``(B y)_{t-1}``, zeros before the first window) and ``y = y_t``:
        ``u_t = y_t - sum_j omega_j U_j(t) = (C^{-1} y)_t`` and ``(B y)_t = (B y)_{t-1} + u_t``.
        Pure; on a device two uploads, no transfer. :meth:`post_process` is this recurrence, bit
        for bit, so an online decoder releases exactly what the batch decode computes."""
        xp = array_module(buffers, estimate, y)
        theta, omega = self._device_parameters(xp, buffers.ndim - 1)
        u = y - (omega * buffers).sum(axis=0)
        return estimate + u, theta * buffers + u

    def decode_online(self, t: int, state: np.ndarray | None, release: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`Strategy.decode_online` keeping ``1 + buffers`` rows whatever ``t``: the estimate
        (row 0) and the decoder's buffers ``U_j(t)`` (:meth:`decode_step`, the recurrence
        :meth:`post_process` runs)."""
        t = _count("t", t, minimum=0)
        y = _one_release(self, t, release)
        tail = y.shape[1:]
        if t == 0 and state is None:
            buffers, estimate = np.zeros((self.buffers, *tail)), np.zeros(tail)
        else:
            held = self._decoder_state(t, state, tail)
            estimate, buffers = held[0], held[1:]
        estimate, buffers = self.decode_step(buffers, estimate, y[0])
        return estimate, np.concatenate([estimate[None], buffers], axis=0)

    decodes_by_recurrence: ClassVar[bool] = True

    def decoder_rows(self, windows: int) -> int:
        return 0 if _count("windows", windows, minimum=0) == 0 else 1 + self.buffers

    def _post_process(self, releases: list[Any]) -> Any:
        xp = array_module(*releases)
        y = xp.concatenate(releases, axis=0)  # (T, *tail): one row per window
        tail = y.shape[1:]
        theta, omega = self._device_parameters(xp, len(tail))
        buffers = xp.zeros((self.buffers, *tail))
        running = xp.zeros(tail)
        out = xp.empty(y.shape)
        for t in range(y.shape[0]):  # O(T * buffers * tail): the online decode, window by window
            u = y[t] - (omega * buffers).sum(axis=0)
            running = running + u
            buffers = theta * buffers + u
            out[t] = running
        return out

    def estimate_variance(self, horizon: int) -> np.ndarray:
        b = self.reconstruction_coefficients(_count("horizon", horizon, minimum=1))
        return np.cumsum(b * b)

    def worst_case_sq_norm(self, horizon: int) -> float:
        row_sums = np.cumsum(self.coefficients(_count("horizon", horizon, minimum=1)))
        return float(row_sums @ row_sums)

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "theta": list(self.theta), "omega": list(self.omega), "horizon": self.horizon}
