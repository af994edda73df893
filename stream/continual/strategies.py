"""Factorisation strategies for running totals: ``A = B C`` with ``C`` causal.

Continual observation (Dwork, Naor, Pitassi & Rothblum 2010; Chan, Shi & Song 2011): a stream
``x_0, x_1, ...`` of per-window sums and, at every window ``t``, a release of the running total
``(A x)_t = sum_{s<=t} x_s``, where ``A`` is the lower-triangular matrix of ones. The *matrix
mechanism* factorises ``A = B C``, releases ``y = C x + z`` with ``z ~ N(0, s^2 I)`` and
reports ``B y``: an unbiased estimate of ``A x`` whose error at ``t`` is ``(B z)_t`` with
standard deviation ``s * ||B_t||_2`` (``B_t`` the ``t``-th row of ``B``).

Every strategy here is *causal* and *time-invariant in the lag*: the release at window ``t``
has ``rows_at(t)`` rows, and row ``r`` is ``sum_{s<=t} w_r(t, t - s) x_s`` for weights that
depend only on ``t`` and the lag ``t - s`` (:meth:`Strategy.lag_weights`). That is what makes
the query at ``t`` a linear function of each user's own history, known before ``t``'s release,
so Feldman & Zrnic's individual filter charges it like any window sum (see
:mod:`renyi_stream.stream.continual.running`). ``B`` is causal too: the estimate at ``t`` reads only the
releases of windows ``<= t`` (:meth:`Strategy.post_process`).

Units. ``noise_std`` is ``s``, the per-coordinate std of each released row ``(C x)_r + z_r``;
:meth:`Strategy.estimate_variance` is ``||B_t||^2`` in units of ``s^2``. Under the individual
filter with norm budget ``B_norm`` (the total ``sum_t ||q_t(x_i)||^2`` a user may contribute)
and per-user zCDP budget ``kappa``, ``s^2 = B_norm / (2 kappa) = B_norm / mu^2`` (Feldman &
Zrnic, Corollary 4.7; ``mu = sqrt(2 kappa)`` the GDP parameter), so the estimate's variance
at ``t`` is ``B_norm * ||B_t||^2 / mu^2``.

Strategies:

* :class:`WindowSums`: ``C = I``, ``B = A`` (sum the window releases); variance ``t + 1``.
* :class:`SquareRootFactorization`: ``C = B = A^{1/2}``, the lower-triangular Toeplitz matrix
  with ``c_k = binom(2k, k) / 4^k`` (Fichtenberger, Henzinger & Upadhyay 2023, "Constant
  matters: fine-grained error bound on differentially private continual observation", ICML;
  Henzinger, Upadhyay & Upadhyay 2023, SODA); variance ``sum_{k<=t} c_k^2 ~ (ln t)/pi``.
* :class:`BinaryTree`: the tree mechanism (Dwork et al. 2010; Chan et al. 2011) releasing
  each dyadic node sum when it completes, with the least-squares estimate of the running
  total from every node released by ``t`` (Honaker 2015, "Efficient use of differentially
  private binary trees"; Hay, Rastogi, Miklau & Suciu 2010); variance ``<= log2(t + 1)/2 + 1``.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.xp import array_module, host_all, to_host

# Beyond this a dense C or B (tests, planning) would not fit in memory anyway.
MAX_DENSE_HORIZON = 1 << 14
# Above this many windows the square-root post-processing convolves by FFT instead of a dense
# Toeplitz product (both O(T) memory per window otherwise).
_DENSE_CONVOLUTION_LIMIT = 2048

_SQRT_CACHE: np.ndarray = np.ones(1)


def _count(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


def _horizon(value: Any) -> int:
    horizon = _count("horizon", value, minimum=1)
    if horizon > MAX_DENSE_HORIZON:
        raise ValueError(f"horizon must be in [1, {MAX_DENSE_HORIZON}] for dense matrices, got horizon={value!r}")
    return horizon


def sqrt_coefficients(n: int) -> np.ndarray:
    """The first ``n`` coefficients of ``A^{1/2}``: ``c_k = binom(2k, k) / 4^k``, ``k < n``.

    These are the Taylor coefficients of ``(1 - z)^{-1/2}``, so ``sum_{j<=k} c_j c_{k-j} = 1``
    for every ``k``: the Toeplitz matrix ``C`` with first column ``c`` squares to the
    prefix-sum matrix ``A`` (Fichtenberger, Henzinger & Upadhyay 2023). Computed by
    the recurrence ``c_k = c_{k-1} (2k - 1) / (2k)`` (no overflowing binomials), relative error
    below ``k * 2^-52``; ``c_k ~ 1 / sqrt(pi k)``. Returns a read-only float64 array.
    """
    global _SQRT_CACHE
    n = _count("n", n, minimum=0)
    if n > _SQRT_CACHE.size:
        size = max(n, 2 * _SQRT_CACHE.size)
        k = np.arange(1, size, dtype=np.float64)
        coefficients = np.empty(size)
        coefficients[0] = 1.0
        coefficients[1:] = np.cumprod((2.0 * k - 1.0) / (2.0 * k))
        coefficients.setflags(write=False)
        _SQRT_CACHE = coefficients
    return _SQRT_CACHE[:n]


def _stack_releases(strategy: "Strategy", releases: Sequence[Any]) -> tuple[list[Any], tuple[int, ...]]:
    """Validate ``releases[t]`` of shape ``(rows_at(t), *tail)`` (one common tail), on the
    releases' device (NumPy arrays and lists are moved there). On a device the finiteness check
    is one explicit transfer of one bool per window, all at once."""
    if not isinstance(releases, Sequence) and getattr(releases, "ndim", 0) >= 1:
        releases = list(releases)  # one array of windows (NumPy or device): its first axis
    if not isinstance(releases, Sequence) or len(releases) == 0:
        raise ValueError(
            f"releases must be a non-empty sequence of arrays (one per window), got {type(releases).__name__}")
    xp = array_module(*releases)
    out: list[Any] = []
    tail: tuple[int, ...] | None = None
    for t, release in enumerate(releases):
        y = xp.asarray(release, dtype=xp.float64)
        rows = strategy.rows_at(t)
        if y.ndim == 0 or y.shape[0] != rows:
            raise ValueError(
                f"releases[{t}] must have {rows} row(s) (rows_at({t}) of {strategy.name}) on axis 0, "
                f"got shape={y.shape}"
            )
        if tail is None:
            tail = y.shape[1:]
        elif y.shape[1:] != tail:
            raise ValueError(f"releases must share their trailing shape, got {tail} and {y.shape[1:]} at window {t}")
        out.append(y)
    finite = to_host(xp.stack([xp.all(xp.isfinite(y)) for y in out]))
    if not finite.all():
        raise ValueError(f"releases must be finite, got a NaN/inf at window {int(np.argmin(finite))}")
    assert tail is not None
    return out, tail


def _one_release(strategy: "Strategy", t: int, release: Any) -> np.ndarray:
    """``release`` checked as window ``t``'s (``(rows_at(t), *tail)``, finite), as host float64."""
    y = np.asarray(release, dtype=np.float64)
    rows = strategy.rows_at(t)
    if y.ndim == 0 or y.shape[0] != rows:
        raise ValueError(f"release must have {rows} row(s) (rows_at({t}) of {strategy.name}) on axis 0, "
                         f"got shape={y.shape}")
    if not np.isfinite(y).all():
        raise ValueError(f"release must be finite, got a NaN/inf at window {t}")
    return y


class Strategy(abc.ABC):
    """A causal factorisation ``A = B C`` of the prefix-sum matrix (see the module docstring).

    Subclasses are small frozen dataclasses; everything they compute is a pure function of
    their parameters. Window offsets ``t`` count from the query's first window (``t = 0``).
    """

    name: ClassVar[str]

    # -- the query ``C`` --------------------------------------------------------------------

    @abc.abstractmethod
    def rows_at(self, t: int) -> int:
        """Number of rows released at window offset ``t`` (each row is one ``d``-vector)."""

    @property
    @abc.abstractmethod
    def max_lag(self) -> int | None:
        """The largest lag with a non-zero weight at any window, or ``None`` if unbounded:
        history older than this may be forgotten."""

    @abc.abstractmethod
    def _lag_weights(self, t: int, lags: Any) -> Any:
        """Unvalidated :meth:`lag_weights`, on the device of ``lags`` (int64)."""

    def lag_weights(self, t: int, lags: Any) -> Any:
        """Weights ``W[r, e]`` of ``x_{t - lags[e]}`` in row ``r`` of the query at window ``t``.

        ``lags`` are integers in ``[0, t]``. Returns float64 of shape ``(rows_at(t), len(lags))``
        on the lags' device: row ``r`` of the release at ``t`` is ``sum_e W[r, e] x_{t - lags[e]}``
        (rows of ``C``). On a device the range check is one explicit transfer (one bool); the
        weights themselves (:meth:`_lag_weights`) make none.
        """
        t = _count("t", t, minimum=0)
        xp = array_module(lags)
        lag_array = xp.asarray(lags)
        if lag_array.ndim != 1 or (lag_array.size and lag_array.dtype.kind not in "iu"):
            raise ValueError(f"lags must be a 1-d integer array, got dtype={lag_array.dtype} shape={lag_array.shape}")
        if lag_array.size and not host_all((lag_array >= 0) & (lag_array <= t)):
            low, high = to_host(lag_array.min()), to_host(lag_array.max())
            raise ValueError(f"lags must be in [0, t={t}], got range [{low}, {high}]")
        return self._lag_weights(t, lag_array.astype(xp.int64))

    def row_times(self, horizon: int) -> np.ndarray:
        """The window offset at which each row of ``C`` (for ``horizon`` windows) is released."""
        horizon = _horizon(horizon)
        return np.repeat(np.arange(horizon), [self.rows_at(t) for t in range(horizon)])

    def query_matrix(self, horizon: int) -> np.ndarray:
        """Dense ``C``: ``(n_rows, horizon)``, rows in release order (for tests and planning)."""
        horizon = _horizon(horizon)
        times = self.row_times(horizon)
        out = np.zeros((times.size, horizon))  # filled in place: one copy of C, never two
        start = 0
        for t in range(horizon):
            rows = self.rows_at(t)
            out[start:start + rows, : t + 1] = self._lag_weights(t, t - np.arange(t + 1))
            start += rows
        return out

    # -- the reconstruction ``B`` -----------------------------------------------------------

    @abc.abstractmethod
    def _post_process(self, releases: list[Any]) -> Any:
        """Unvalidated :meth:`post_process`, on the releases' device; no host round trip."""

    def post_process(self, releases: Sequence[Any]) -> Any:
        """Running-total estimates ``B y`` from the releases of windows ``0..T-1``.

        ``releases[t]`` has shape ``(rows_at(t), *tail)`` (``tail`` is typically ``(d,)``,
        or ``(d, draws)`` in simulations). Returns ``(T, *tail)``: row ``t`` is the estimate of
        the running total through window ``t`` and depends only on ``releases[:t + 1]``, so
        it equals what an online run would have released at ``t``.

        Runs on the releases' device (NumPy or CuPy). There, the finiteness check is the one
        explicit transfer; the result equals NumPy's bit for bit up to the device's own
        arithmetic, except past ``_DENSE_CONVOLUTION_LIMIT`` windows under the square-root
        strategy, where the device convolves with its own FFT (equal to ``1e-12`` relative).
        """
        checked, _ = _stack_releases(self, releases)
        return self._post_process(checked)

    # -- online decoding: one window at a time, keeping only what the next windows need -----------

    def decode_online(self, t: int, state: np.ndarray | None, release: Any) -> tuple[np.ndarray, np.ndarray]:
        """The running-total estimate at window offset ``t`` from the decoder's ``state`` after
        window ``t - 1`` (``None`` at ``t = 0`` only) and that window's release ``y_t`` (shape
        ``(rows_at(t), *tail)``, host NumPy): ``(estimate_t (tail), state after t)``. The estimate
        equals ``post_process(y_0 .. y_t)[t]`` bit for bit: what decoding the series through the
        window gives, as the streaming job always did (for :class:`WindowSums`, :class:`BinaryTree`
        and :class:`renyi_stream.stream.continual.blt.BufferedLinearToeplitz` also what decoding any
        longer series gives at ``t``; for :class:`SquareRootFactorization` a longer series is one
        larger matrix product, equal to the last bits only, ``1e-15`` relative). Post-processing:
        no privacy cost.

        The state is a float64 array ``(decoder_rows(t + 1), *tail)`` holding only what later
        windows need: here, for a strategy whose estimate has no finite recurrence (every earlier
        release enters it: :class:`SquareRootFactorization`, :class:`BinaryTree`), every release so
        far; :class:`WindowSums` keeps the running sum (one row) and
        :class:`renyi_stream.stream.continual.blt.BufferedLinearToeplitz` the estimate and its
        buffers (``1 + buffers`` rows), whatever ``t``. ValueError for a state missing after window
        0, a state or release of another shape, or one that is not finite."""
        t = _count("t", t, minimum=0)
        y = _one_release(self, t, release)
        history = y if t == 0 and state is None else np.concatenate(
            [self._decoder_state(t, state, y.shape[1:]), y], axis=0)
        releases, start = [], 0
        for s in range(t + 1):
            releases.append(history[start:start + self.rows_at(s)])
            start += self.rows_at(s)
        return np.asarray(self._post_process(releases)[t]), history

    #: Whether :meth:`decode_online` keeps a fixed-size state by a recurrence (overridden) rather
    #: than every release so far.
    decodes_by_recurrence: ClassVar[bool] = False

    def decoder_rows(self, windows: int) -> int:
        """Rows of the decoder's state after ``windows`` windows (:meth:`decode_online`)."""
        return int(sum(self.rows_at(s) for s in range(_count("windows", windows, minimum=0))))

    def decoder_state(self, releases: Sequence[Any]) -> np.ndarray | None:
        """The decoder's state after the releases ``releases[0..T-1]`` (each ``(rows_at(t), *tail)``),
        as :meth:`decode_online` leaves it (``None`` for none): :meth:`decode_online` folded over
        them for a strategy with a recurrence (:attr:`decodes_by_recurrence`), else every release
        stacked, in one pass (folding would decode every prefix: cubic in windows for
        :class:`SquareRootFactorization`). How a job continues the estimates of a series recorded
        whole (an earlier version's files)."""
        if self.decodes_by_recurrence:
            state = None
            for t, release in enumerate(releases):
                _, state = self.decode_online(t, state, release)
            return state
        checked = [_one_release(self, t, y) for t, y in enumerate(releases)]
        return np.concatenate(checked, axis=0) if checked else None

    def _decoder_state(self, t: int, state: Any, tail: tuple[int, ...]) -> np.ndarray:
        """``state`` checked as the decoder's state after ``t`` windows for releases of trailing
        shape ``tail``: present (``t > 0``), of its shape, finite."""
        if state is None:
            raise ValueError(f"state must be the {self.name} decoder's state after {t} window(s), got None: only the "
                             f"first window (t=0) starts without one")
        state = np.asarray(state, dtype=np.float64)
        shape = (self.decoder_rows(t), *tail)
        if state.shape != shape:
            raise ValueError(f"state must be the {self.name} decoder's state after {t} window(s), shape {shape}, "
                             f"got shape={state.shape}")
        if not np.isfinite(state).all():
            raise ValueError(f"state must be finite, got a NaN/inf in the {self.name} decoder's state after {t} "
                             f"window(s)")
        return state

    def reconstruction_matrix(self, horizon: int) -> np.ndarray:
        """Dense ``B``: ``(horizon, n_rows)`` with ``B C = A`` (for tests and planning)."""
        horizon = _horizon(horizon)
        n_rows = int(sum(self.rows_at(t) for t in range(horizon)))
        eye = np.eye(n_rows)
        releases, start = [], 0
        for t in range(horizon):
            rows = self.rows_at(t)
            releases.append(eye[start:start + rows])
            start += rows
        return self._post_process(releases)

    @abc.abstractmethod
    def estimate_variance(self, horizon: int) -> np.ndarray:
        """``||B_t||^2`` for ``t < horizon``: the variance of the running-total estimate at
        ``t`` in units of ``s^2`` (per coordinate)."""

    def estimate_std(self, horizon: int, *, noise_std: float) -> np.ndarray:
        """Std of the running-total estimate at each ``t < horizon`` (per coordinate), for
        releases with per-coordinate noise std ``noise_std``: ``s * ||B_t||``."""
        noise_std = check.positive("noise_std", noise_std)
        return noise_std * np.sqrt(self.estimate_variance(horizon))

    # -- sensitivity ------------------------------------------------------------------------

    def worst_case_sq_norm(self, horizon: int) -> float:
        """``||C 1||^2``: the total squared norm of a user with ``x_s = 1`` at every window.

        With non-negative ``C`` and data in ``[0, 1]`` this is the largest ``sum_t ||q_t(x)||^2``
        any user can reach over ``horizon`` windows: the norm budget classical (worst-case)
        accounting must assume for every user.
        """
        horizon = _horizon(horizon)
        row_sums = [self._lag_weights(t, np.arange(t + 1)).sum(axis=1) for t in range(horizon)]
        return float(sum(float(np.dot(r, r)) for r in row_sums))

    def spec(self) -> dict[str, Any]:
        """JSON-able description, inverted by :func:`strategy_from_spec`."""
        return {"name": self.name}


@dataclass(frozen=True)
class WindowSums(Strategy):
    """``C = I``, ``B = A``: release each window's sum, sum the releases for the running total.

    The baseline: the estimate's variance at ``t`` is ``(t + 1) s^2``, growing linearly.
    """

    name: ClassVar[str] = "window_sums"

    def rows_at(self, t: int) -> int:
        return 1

    @property
    def max_lag(self) -> int | None:
        return 0

    def _lag_weights(self, t: int, lags: Any) -> Any:
        xp = array_module(lags)
        return (lags == 0).astype(xp.float64)[None, :]

    def _post_process(self, releases: list[Any]) -> Any:
        xp = array_module(*releases)
        return xp.cumsum(xp.concatenate(releases, axis=0), axis=0)

    def decode_online(self, t: int, state: np.ndarray | None, release: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`Strategy.decode_online` keeping the running sum only (one row): ``y_t`` added to
        it, as ``cumsum`` adds, left to right."""
        t = _count("t", t, minimum=0)
        y = _one_release(self, t, release)
        estimate = y[0] if t == 0 and state is None else self._decoder_state(t, state, y.shape[1:])[0] + y[0]
        return estimate, estimate[None]

    decodes_by_recurrence: ClassVar[bool] = True

    def decoder_rows(self, windows: int) -> int:
        return 0 if _count("windows", windows, minimum=0) == 0 else 1

    def estimate_variance(self, horizon: int) -> np.ndarray:
        return np.arange(1, _horizon(horizon) + 1, dtype=np.float64)

    def worst_case_sq_norm(self, horizon: int) -> float:
        return float(_horizon(horizon))


@dataclass(frozen=True)
class SquareRootFactorization(Strategy):
    """``C = B = A^{1/2}``: lower-triangular Toeplitz with ``c_k = binom(2k, k) / 4^k``.

    Fichtenberger, Henzinger & Upadhyay 2023 (ICML), Henzinger, Upadhyay & Upadhyay 2023
    (SODA): the release at ``t`` is ``sum_{s<=t} c_{t-s} x_s`` (one row), the estimate
    ``sum_{s<=t} c_{t-s} y_s``; its variance is ``sum_{k<=t} c_k^2 = (ln t + gamma +
    4 ln 2) / pi + o(1)`` in units of ``s^2`` (2.944 at ``t + 1 = 365``). Every user's
    whole history enters every later query (``max_lag`` is unbounded), and a user present in
    every window has ``||C 1||^2 ~ 2 T^2 / pi`` (about 84,930 at ``T = 365``).
    """

    name: ClassVar[str] = "sqrt"

    def rows_at(self, t: int) -> int:
        return 1

    @property
    def max_lag(self) -> int | None:
        return None

    def coefficients(self, n: int) -> np.ndarray:
        """``c_0 .. c_{n-1}`` (see :func:`sqrt_coefficients`)."""
        return sqrt_coefficients(n)

    def _lag_weights(self, t: int, lags: Any) -> Any:
        xp = array_module(lags)
        return xp.asarray(sqrt_coefficients(t + 1))[lags][None, :]  # public constants: uploaded

    def _post_process(self, releases: list[Any]) -> Any:
        xp = array_module(*releases)
        y = xp.concatenate(releases, axis=0)  # (T, *tail)
        horizon = y.shape[0]
        flat = y.reshape(horizon, -1)
        c = xp.asarray(sqrt_coefficients(horizon))
        if horizon <= _DENSE_CONVOLUTION_LIMIT:
            steps = xp.arange(horizon)
            lag = steps[:, None] - steps[None, :]
            toeplitz = xp.where(lag >= 0, c[xp.maximum(lag, 0)], 0.0)
            out = toeplitz @ flat
        elif xp is np:
            from scipy.signal import fftconvolve

            out = fftconvolve(flat, c[:, None], axes=0)[:horizon]
        else:  # a device's own FFT: the causal linear convolution, zero-padded past 2T - 1
            size = 1 << (2 * horizon - 1).bit_length()
            spectrum = xp.fft.rfft(flat, n=size, axis=0) * xp.fft.rfft(c, n=size)[:, None]
            out = xp.fft.irfft(spectrum, n=size, axis=0)[:horizon]
        return out.reshape(y.shape)

    def estimate_variance(self, horizon: int) -> np.ndarray:
        horizon = _count("horizon", horizon, minimum=1)
        return np.cumsum(sqrt_coefficients(horizon) ** 2)

    def worst_case_sq_norm(self, horizon: int) -> float:
        horizon = _count("horizon", horizon, minimum=1)
        return float(np.sum(np.cumsum(sqrt_coefficients(horizon)) ** 2))


def _two_adic(n: int) -> int:
    """The exponent of the largest power of two dividing ``n >= 1``."""
    return (n & -n).bit_length() - 1


def tree_node_variance(level: int) -> float:
    """Variance (units of ``s^2``) of the least-squares estimate of a level-``level`` node's
    sum from the releases of its own subtree: ``v_h = 2^h / (2^{h+1} - 1)``.

    Bottom-up inverse-variance weighting (Hay et al. 2010; Honaker 2015): a leaf is
    its release (``v_0 = 1``); a node combines its own release (variance 1) with the sum of its
    children's estimates (variance ``2 v_{h-1}``), so ``1 / v_h = 1 + 1 / (2 v_{h-1})``.
    """
    level = _count("level", level, minimum=0)
    return math.ldexp(1.0, level) / (math.ldexp(1.0, level + 1) - 1.0)


@dataclass(frozen=True)
class BinaryTree(Strategy):
    """The binary tree mechanism with least-squares (Honaker) post-processing.

    Dwork, Naor, Pitassi & Rothblum 2010; Chan, Shi & Song 2011. Node ``(j, m)`` is the sum of
    windows ``[m 2^j, (m + 1) 2^j - 1]`` and is released at its last window, so the release at
    ``t`` has one row per level ``j <= height`` with ``2^j | t + 1`` (row ``r`` is level ``r``).

    Post-processing: the estimate at ``t`` is the least-squares (best linear unbiased)
    estimate of ``sum_{s<=t} x_s`` from every node released by ``t``. The prefix ``[0, t]``
    splits into maximal complete dyadic blocks (the binary digits of ``t + 1``, plus whole
    level-``height`` blocks when the tree is capped); every released node lies inside exactly
    one block and blocks share no data or noise, so the estimate is the sum of each block
    root's bottom-up estimate (Honaker 2015; Hay et al. 2010), variance
    ``sum_blocks v_h`` (:func:`tree_node_variance`). ``tests/test_continual.py`` checks this
    against a dense least-squares solve.

    ``height=None`` (default) is the unbounded tree: only nodes that complete are released, so
    a horizon need not be fixed in advance, and under individual accounting a user is charged
    only for the nodes actually released. A finite ``height`` caps the levels (and the history
    a user's state must keep: ``max_lag = 2^height - 1``).
    """

    name: ClassVar[str] = "tree"
    height: int | None = None

    def __post_init__(self) -> None:
        if self.height is not None:
            if isinstance(self.height, bool) or not isinstance(self.height, (int, np.integer)) \
                    or not 0 <= self.height <= 62:
                raise ValueError(f"height must be None or an integer in [0, 62], got height={self.height!r}")
            object.__setattr__(self, "height", int(self.height))

    def rows_at(self, t: int) -> int:
        top = _two_adic(int(t) + 1)
        return (top if self.height is None else min(top, self.height)) + 1

    @property
    def max_lag(self) -> int | None:
        return None if self.height is None else (1 << self.height) - 1

    def _lag_weights(self, t: int, lags: Any) -> Any:
        xp = array_module(lags)
        spans = xp.asarray(np.left_shift(1, np.arange(self.rows_at(t), dtype=np.int64)))  # public: uploaded
        return (lags[None, :] < spans[:, None]).astype(xp.float64)

    def _top_level(self, horizon: int) -> int:
        """The highest level with at least one node in ``horizon`` windows."""
        top = horizon.bit_length() - 1
        return top if self.height is None else min(top, self.height)

    def _post_process(self, releases: list[Any]) -> Any:
        xp = array_module(*releases)
        horizon = len(releases)
        tail = releases[0].shape[1:]
        top = self._top_level(horizon)
        # Every release's rows, stacked: node (level, window e) is row first_row[e] + level. The
        # row numbers are public (they follow from the horizon alone), so each level's nodes are
        # one gather with a host index, uploaded, on a device.
        y = xp.concatenate(releases, axis=0)
        first_row = np.cumsum([0] + [self.rows_at(t) for t in range(horizon - 1)])
        # Bottom-up estimate of every node (Hay et al. 2010 / Honaker 2015, first pass).
        estimates: list[Any] = []
        for level in range(top + 1):
            span = 1 << level
            count = horizon >> level
            ends = (np.arange(count) + 1) * span - 1
            own = y[first_row[ends] + level]  # (count, *tail)
            if level == 0:
                estimates.append(own)
                continue
            below = estimates[level - 1]
            children = below[0:2 * count:2] + below[1:2 * count:2]
            weight = tree_node_variance(level)  # weight on the node's own release: v_h / 1
            estimates.append(weight * own + (1.0 - weight) * children)
        n = np.arange(1, horizon + 1)  # prefix lengths
        out = xp.zeros((horizon, *tail))
        capped = self.height is not None and top == self.height
        for level in range(top + 1):
            blocks = n >> level
            if capped and level == top:
                cumulative = xp.cumsum(estimates[level], axis=0)
                take = np.flatnonzero(blocks >= 1)  # host indices (a mask would make a device wait)
                out[take] += cumulative[blocks[take] - 1]
            else:
                take = np.flatnonzero((blocks & 1) == 1)
                out[take] += estimates[level][blocks[take] - 1]
        return out

    def estimate_variance(self, horizon: int) -> np.ndarray:
        horizon = _count("horizon", horizon, minimum=1)
        n = np.arange(1, horizon + 1)
        top = self._top_level(horizon)
        capped = self.height is not None and top == self.height
        out = np.zeros(horizon)
        for level in range(top + 1):
            blocks = n >> level
            v = tree_node_variance(level)
            out += v * (blocks if capped and level == top else (blocks & 1))
        return out

    def worst_case_sq_norm(self, horizon: int) -> float:
        horizon = _count("horizon", horizon, minimum=1)
        return float(sum((horizon >> j) * 4.0**j for j in range(self._top_level(horizon) + 1)))

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "height": self.height}


_STRATEGIES: dict[str, type[Strategy]] = {
    WindowSums.name: WindowSums,
    SquareRootFactorization.name: SquareRootFactorization,
    BinaryTree.name: BinaryTree,
}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Make ``cls`` known to :func:`strategy_from_spec` (used by optional strategies)."""
    _STRATEGIES[cls.name] = cls
    return cls


def strategy_from_spec(spec: dict[str, Any]) -> Strategy:
    """Rebuild a strategy from :meth:`Strategy.spec` (snapshots store it as JSON)."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"strategy spec must be a dict with a 'name', got spec={spec!r}")
    name = spec["name"]
    if name not in _STRATEGIES:
        raise ValueError(f"strategy name must be one of {sorted(_STRATEGIES)}, got name={name!r}")
    params = {k: v for k, v in spec.items() if k != "name"}
    try:
        return _STRATEGIES[name](**params)
    except TypeError as exc:
        raise ValueError(f"strategy spec {spec!r} has unknown parameters: {exc}") from exc


def strategy_by_name(name: str) -> Strategy:
    """The default instance of a strategy: ``"sqrt"`` (default), ``"tree"`` or ``"window_sums"``."""
    return strategy_from_spec({"name": name})
