"""Prepaid admission for running totals: a contribution's whole future cost is charged when it is admitted.

The mechanism (issue 20; docs/running_totals.md has the soundness argument). A running query with
factorisation ``A = B C`` releases, at window offset ``t``,

    y_t = (C a)_t + z_t,    a_s = sum of the contributions admitted at s,    z_t ~ N(0, s^2 I),

so user ``i``'s part of ``y_t`` is ``q_t(i) = (C x_i)_t``, ``x_i`` their *admitted* stream. A
contribution ``x`` admitted at ``t`` stays in every later release, so it is charged once, at
admission, the increase it causes in ``||C x_i||^2`` over the rest of the schedule:

    Delta = ||C (h + x e_t)||^2 - ||C h||^2            (rows released at t .. T - 1)
          = ||x||^2 sum_r C_{r,t}^2  +  2 sum_r C_{r,t} <(C h)_r, x>,

``h`` the user's admitted stream before ``t`` (``C`` is causal, so rows before ``t`` do not
change). The two terms are :class:`ChargeTerms` ``quadratic`` and ``cross``. Over a declared
schedule of ``T`` windows a user's charges sum to ``||C x_i||^2`` over those rows exactly (each
``Delta`` is one step of a telescoping sum), and at every ``tau`` the losses realised so far,
``sum_{t<=tau} ||q_t(i)||^2``, are at most the charges made so far: the filter keeps the charges
within the budget, so the realised losses are too (Feldman & Zrnic's Theorem 4.3, the Rényi filter,
with predictable losses; docs/running_totals.md). The filter then decides only about the new
contribution: a user over budget loses that day, never their past.

Rules (one per factorisation; the per-user state is what ``Delta`` needs, and the aggregate
state what ``(C a)_t`` needs):

* :class:`BLTPrepaid` (:class:`renyi_stream.stream.continual.blt.BufferedLinearToeplitz`): ``(C h)_r =
  sum_j omega_j theta_j^(r-t) S_j(t)`` for ``r >= t`` with the user's buffers ``S_j``, so

      Delta = ||x||^2 G(m) + 2 sum_j omega_j H_j(m) <S_j(t), x>,
      G(m) = sum_{k<m} c_k^2,   H_j(m) = sum_{k<m} theta_j^k c_k,   m = T - t,

  (``m = inf`` for the infinite tail: ``G = 1 + sum_{l,l'} omega_l omega_l' / (1 - theta_l
  theta_l')``, ``H_j = 1 + sum_l omega_l theta_j / (1 - theta_j theta_l)``). Per user: the
  ``buffers x d`` numbers ``S_j`` as of the day after the last admission, and that day; read
  and written only on days the user contributes (``S_j(t) = theta_j^(t - 1 - last) S_j(last +
  1)``). Per query: ``buffers x d`` numbers.
* :class:`TreePrepaid` (:class:`renyi_stream.stream.continual.strategies.BinaryTree`): the tree applies. ``x``
  at ``t`` enters one node per level, released when it completes, so ``Delta = sum_{released
  levels j} (||x||^2 + 2 <P_j, x>)``, ``P_j`` the user's admitted sum inside the level-``j`` node
  holding ``t``. Per user: ``levels x d`` partial sums and the day last seen. It needs a declared
  horizon (an unbounded tree has unboundedly many levels) or a finite ``height``.
* :class:`DenseHistoryPrepaid` (any strategy, a declared horizon): the exact reference. Per user:
  the whole admitted history ``T x d``; per query the aggregate history. This is the square root's
  only form (its ``C`` has no finite state), and the reference the other two are tested against.

Rounding (privacy needs the direction, not the digits). Every charge is an upper bound:
``Delta + ETA * magnitude + TINY`` (``TINY`` the smallest normal float, for the subnormal range
where a relative margin underflows) with ``magnitude`` the same sums over absolute values, which bounds
the float error of every dot product, table and buffer (relative error ``<= (d + buffers + T)
2^-52`` for the sums involved, far below ``ETA = 1e-9``; buffers of signed data that cancel by
more than ``1e7`` against their history are the stated exception), then clamped at 0 (a
contribution that lowers the user's future norm, possible with signed data, is charged nothing
rather than refunded: charging more is always safe). Non-finite charges (overflow) are infinite:
the row is dropped (docs/architecture.md, "Edges").

Kernels are xp-clean (:mod:`renyi_stream.stream.xp`): per-user arrays may live on a device; public constants
are uploaded; the only host transfers are the checks that raise, counted in each docstring.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from renyi_stream.stream.continual.blt import DEFAULT_BUFFERS, DEFAULT_HORIZON, SHIPPED_HORIZONS, BufferedLinearToeplitz
from renyi_stream.stream.continual.strategies import MAX_DENSE_HORIZON, BinaryTree, SquareRootFactorization, Strategy
# The charge, its rounding and the filter decision on it live with the ledger (one decision per
# user and window over window vectors and prepaid terms: renyi_stream.stream.ledger.Ledger.admit).
from renyi_stream.stream.ledger import ETA, TINY, ChargeTerms, prepaid_charge, prepaid_filter, prepaid_rho
from renyi_stream.stream.xp import array_module, host_all

# The infinite tail's closed forms lose relative precision like 2^-52 / (1 - theta^2); past this
# decay they would no longer be covered by ETA.
_MAX_TAIL_DECAY = 1.0 - 1e-6


def _integer(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class UserState:
    """Per-user prepaid state: ``values`` ``(n, width, d)`` float64 and ``last`` ``(n,)`` int64,
    the window offset of the user's last admission (``-1``: never admitted).

    ``values`` is the rule's summary of the user's admitted stream (:attr:`PrepaidRule.width`
    rows of ``d``). The engine keeps one row per user beside the ledger and gathers the rows of a
    window's users with :meth:`take` (vectorised, no per-user loop); :meth:`put` writes them
    back in place.
    """

    values: Any
    last: Any

    def __len__(self) -> int:
        return int(self.last.shape[0])

    def take(self, positions: Any) -> "UserState":
        """The rows at ``positions`` (a gather; on a device a host index is an upload)."""
        return UserState(values=self.values[positions], last=self.last[positions])

    def put(self, positions: Any, rows: "UserState") -> None:
        """Write ``rows`` at ``positions`` in place (distinct positions)."""
        self.values[positions] = rows.values
        self.last[positions] = rows.last


@dataclass(frozen=True)
class ReleaseState:
    """Aggregate state of one running query: ``values`` ``(width, d)`` and ``next``, the window
    offset of the next release. Sensitive until noised (invariant 4
    (nothing-pre-noise-leaves, docs/architecture.md))."""

    values: Any
    next: int


class PrepaidRule(abc.ABC):
    """A strategy under prepaid admission over a declared schedule (module docstring).

    ``horizon``: the declared schedule, releases at offsets ``0 .. horizon - 1`` (public); ``None``
    charges the infinite tail instead, where the rule allows it, and releases without end.
    """

    strategy: Strategy
    horizon: int | None

    @property
    @abc.abstractmethod
    def width(self) -> int:
        """Rows of ``d`` numbers per user (and per query) the rule keeps."""

    # -- kernels (unvalidated, xp-clean) ---------------------------------------------------

    @abc.abstractmethod
    def _terms(self, values: Any, last: Any, x: Any, t: int) -> ChargeTerms: ...

    @abc.abstractmethod
    def _admit(self, values: Any, last: Any, x: Any, t: int) -> Any: ...

    @abc.abstractmethod
    def _release(self, values: Any, a: Any, t: int) -> tuple[Any, Any]: ...

    # -- validated entry points -------------------------------------------------------------

    def new_users(self, n: int, dim: int, *, like: Any = None) -> UserState:
        """State for ``n`` users who have never been admitted (on the device of ``like``)."""
        n = _integer("n", n, minimum=0)
        dim = _integer("dim", dim, minimum=1)
        xp = np if like is None else array_module(like)
        return UserState(values=xp.zeros((n, self.width, dim)), last=xp.full((n,), -1, dtype=xp.int64))

    def new_release(self, dim: int, *, like: Any = None) -> ReleaseState:
        """The aggregate state of a query before its first window."""
        dim = _integer("dim", dim, minimum=1)
        xp = np if like is None else array_module(like)
        return ReleaseState(values=xp.zeros((self.width, dim)), next=0)

    def _window(self, t: Any) -> int:
        t = _integer("t", t, minimum=0)
        if self.horizon is not None and t >= self.horizon:
            raise ValueError(f"t must be in [0, {self.horizon}) (the declared schedule), got t={t}")
        return t

    def _check(self, state: UserState, x: Any, t: Any) -> tuple[Any, int]:
        """Validate a batch: shapes, finiteness, ``t`` in the schedule and after every row's last
        admission (one admission per user per window, in window order: invariants 2 and 6). One
        host transfer of one bool on a device."""
        t = self._window(t)
        if not isinstance(state, UserState):
            raise ValueError(f"state must be a UserState, got {type(state).__name__}")
        xp = array_module(state.values, x)
        x = xp.asarray(x, dtype=xp.float64)
        n, width, dim = state.values.shape
        if x.shape != (n, dim):
            raise ValueError(f"x must have shape ({n}, {dim}) (one row per user in the state), got shape={x.shape}")
        if width != self.width or state.last.shape != (n,):
            raise ValueError(f"state must have values of shape (n, {self.width}, d) and last of shape (n,), got "
                             f"{state.values.shape} and {state.last.shape}")
        if n and not host_all(xp.isfinite(x).all(axis=1) & (state.last < t)):
            raise ValueError(f"x must be finite and every row's last admission before t={t} (users are "
                             "charged once per window, in window order)")
        return x, t

    def charge_terms(self, state: UserState, x: Any, t: int) -> ChargeTerms:
        """:class:`ChargeTerms` of admitting ``x`` (``(n, d)``) at window offset ``t`` for users
        with ``state`` (``n`` rows, from :meth:`UserState.take`). Reads nothing but those rows,
        ``x``, ``t`` and public constants. One transfer (the check).

        A non-zero contribution is never free: where every product of the terms underflows to
        zero (``x`` around ``1e-170``: ``||x||^2`` is below the smallest subnormal), the true
        ``Delta`` is a sum of at most ``d + width`` products each below the smallest subnormal,
        so below ``TINY``; ``magnitude`` is then set to ``TINY`` and :func:`prepaid_charge`
        charges at least that (as the ledger does for a window vector)."""
        x, t = self._check(state, x, t)
        terms = self._terms(state.values, state.last, x, t)
        xp = array_module(terms.magnitude, x)
        underflowed = (terms.magnitude == 0.0) & (x != 0.0).any(axis=1)
        return ChargeTerms(quadratic=terms.quadratic, cross=terms.cross,
                           magnitude=xp.where(underflowed, TINY, terms.magnitude))

    def admit(self, state: UserState, x: Any, t: int) -> UserState:
        """The rows of ``state`` after admitting ``x`` at ``t`` (pass the scaled contribution of a
        clipped row; leave dropped rows out: their state does not change). Pure: returns new
        rows, for :meth:`UserState.put`. One transfer (the check)."""
        x, t = self._check(state, x, t)
        xp = array_module(state.values, x)
        return UserState(values=self._admit(state.values, state.last, x, t),
                         last=xp.full(state.last.shape, t, dtype=xp.int64))

    def release(self, state: ReleaseState, a: Any) -> tuple[Any, ReleaseState]:
        """``((C a)_t, state after t)`` for ``t = state.next``: ``a`` (``(d,)``) the sum of the
        contributions admitted at ``t`` (scaled ones scaled). The total has ``rows_at(t)`` rows.
        Pure (a re-run of the window from the same state gives the same bits)."""
        t = self._window(state.next)
        xp = array_module(state.values, a)
        a = xp.asarray(a, dtype=xp.float64)
        if a.shape != state.values.shape[1:]:
            raise ValueError(f"a must have shape {state.values.shape[1:]}, got shape={a.shape}")
        total, values = self._release(state.values, a, t)
        return total, ReleaseState(values=values, next=t + 1)


def _dot(values: Any, x: Any) -> Any:
    """``<values[n, k], x[n]>`` over ``d``: ``(n, k)``. Row by row, elementwise products and a
    reduction over the last axis: each row's bits do not depend on the other rows of the batch
    (a BLAS product may block differently for another batch size, and a user's charge, hence
    their filter decision, must depend on their own row alone)."""
    return (values * x[:, None, :]).sum(axis=2)


def _weigh(inner: Any, weights: Any) -> Any:
    """``sum_k inner[n, k] weights[k]``, row by row (see :func:`_dot`)."""
    return (inner * weights[None, :]).sum(axis=1)


# --------------------------------------------------------------------------- BLT


class BLTPrepaid(PrepaidRule):
    """The prepaid rule for a BLT: per user ``buffers x d`` numbers and the day last seen.

    Args:
        strategy: the BLT.
        horizon: the declared schedule (``T``, releases at ``0 .. T - 1``), or ``None`` for the
            infinite tail (decays up to ``1 - 1e-6``): charges then cover every release, without
            end, at a higher price (``blt`` module docstring).
    """

    def __init__(self, strategy: BufferedLinearToeplitz, *, horizon: int | None) -> None:
        if not isinstance(strategy, BufferedLinearToeplitz):
            raise ValueError(f"strategy must be a BufferedLinearToeplitz, got {type(strategy).__name__}")
        self.strategy = strategy
        self.horizon = None if horizon is None else _integer("horizon", horizon, minimum=1)
        theta = np.asarray(strategy.theta)
        omega = np.asarray(strategy.omega)
        if horizon is None and np.abs(theta).max() > _MAX_TAIL_DECAY:
            raise ValueError(f"theta must be within [-{_MAX_TAIL_DECAY}, {_MAX_TAIL_DECAY}] for the infinite tail, "
                             f"got theta={strategy.theta!r}")
        self._theta, self._omega = theta, omega
        if self.horizon is not None:
            # G(m), H_j(m) and their absolute versions for every m = T - t (public constants).
            c = strategy.coefficients(self.horizon)
            powers = theta[None, :] ** np.arange(self.horizon, dtype=np.float64)[:, None]  # (T, buffers)
            zero = np.zeros((1, theta.size))
            self._g = np.concatenate([[0.0], np.cumsum(c * c)])
            self._h = np.concatenate([zero, np.cumsum(powers * c[:, None], axis=0)])
            self._h_abs = np.concatenate([zero, np.cumsum(np.abs(powers * c[:, None]), axis=0)])
        else:
            pairs = 1.0 - np.outer(theta, theta)
            self._g_tail = 1.0 + float(np.sum(np.outer(omega, omega) / pairs))
            self._h_tail = 1.0 + (omega[None, :] * theta[:, None] / pairs).sum(axis=1)
            self._h_abs_tail = 1.0 + (np.abs(omega[None, :] * theta[:, None]) / pairs).sum(axis=1)

    @property
    def width(self) -> int:
        return self.strategy.buffers

    def _constants(self, t: int) -> tuple[float, np.ndarray, np.ndarray]:
        if self.horizon is None:
            return self._g_tail, self._h_tail, self._h_abs_tail
        m = self.horizon - t
        return float(self._g[m]), self._h[m], self._h_abs[m]

    def _buffers_at(self, values: Any, last: Any, t: int) -> Any:
        """``S_j(t) = theta_j^(t - 1 - last) S_j(last + 1)`` (zero buffers stay zero)."""
        xp = array_module(values, last)
        theta = xp.asarray(self._theta)
        return xp.power(theta[None, :], (t - 1 - last)[:, None].astype(xp.float64))[:, :, None] * values

    def _terms(self, values: Any, last: Any, x: Any, t: int) -> ChargeTerms:
        xp = array_module(values, x)
        g, h, h_abs = self._constants(t)
        buffers = self._buffers_at(values, last, t)
        sq = xp.einsum("nd,nd->n", x, x)
        quadratic = sq * g
        cross = _weigh(_dot(buffers, x), xp.asarray(self._omega * h))
        cross_abs = _weigh(_dot(xp.abs(buffers), xp.abs(x)), xp.asarray(np.abs(self._omega) * h_abs))
        return ChargeTerms(quadratic=quadratic, cross=cross, magnitude=quadratic + 2.0 * cross_abs)

    def _admit(self, values: Any, last: Any, x: Any, t: int) -> Any:
        xp = array_module(values, x)
        theta = xp.asarray(self._theta)
        return theta[None, :, None] * self._buffers_at(values, last, t) + x[:, None, :]

    def _release(self, values: Any, a: Any, t: int) -> tuple[Any, Any]:
        total, buffers = self.strategy.encode_step(values, a)
        return total[None, :], buffers


# --------------------------------------------------------------------------- the tree


class TreePrepaid(PrepaidRule):
    """The prepaid rule for the binary tree: per user one partial node sum per level.

    Node ``(j, m)`` covers windows ``[m 2^j, (m + 1) 2^j)`` and is released at its last window
    (:class:`renyi_stream.stream.continual.strategies.BinaryTree`), so ``x`` admitted at ``t`` is in the one
    level-``j`` node holding ``t`` for each level, and is charged ``||x||^2 + 2 <P_j, x>`` for
    each such node that will be released: within the declared ``horizon``, or at all (levels
    ``<= height``) for the infinite tail, which needs a finite ``height``.
    """

    def __init__(self, strategy: BinaryTree, *, horizon: int | None) -> None:
        if not isinstance(strategy, BinaryTree):
            raise ValueError(f"strategy must be a BinaryTree, got {type(strategy).__name__}")
        if horizon is None and strategy.height is None:
            raise ValueError("horizon must be declared for an unbounded tree (every level of the infinite tail "
                             "would be charged), got horizon=None with height=None")
        self.strategy = strategy
        self.horizon = None if horizon is None else _integer("horizon", horizon, minimum=1)
        levels = strategy.height + 1 if strategy.height is not None else self.horizon.bit_length()
        if strategy.height is not None and self.horizon is not None:
            levels = min(levels, self.horizon.bit_length())
        self._levels = levels

    @property
    def width(self) -> int:
        return self._levels

    def _released(self, t: int) -> np.ndarray:
        """Which levels' nodes holding ``t`` are released (public: depends on ``t`` alone)."""
        j = np.arange(self._levels)
        if self.horizon is None:
            return np.ones(self._levels, dtype=bool)
        ends = (((t >> j) + 1) << j) - 1
        return ends < self.horizon

    def _open_nodes(self, values: Any, last: Any, t: int) -> Any:
        """``P_j``: the user's partial sum in the level-``j`` node holding ``t`` (zero when their
        last admission was in an earlier node)."""
        xp = array_module(values, last)
        j = xp.asarray(np.arange(self._levels, dtype=np.int64))
        same = (last[:, None] >= 0) & (xp.right_shift(xp.maximum(last, 0)[:, None], j[None, :]) ==
                                       xp.right_shift(xp.full((1, 1), t, dtype=xp.int64), j[None, :]))
        return xp.where(same[:, :, None], values, 0.0)

    def _terms(self, values: Any, last: Any, x: Any, t: int) -> ChargeTerms:
        xp = array_module(values, x)
        released = self._released(t).astype(np.float64)
        partial = self._open_nodes(values, last, t)
        quadratic = xp.einsum("nd,nd->n", x, x) * float(released.sum())
        mask = xp.asarray(released)
        cross = _weigh(_dot(partial, x), mask)
        cross_abs = _weigh(_dot(xp.abs(partial), xp.abs(x)), mask)
        return ChargeTerms(quadratic=quadratic, cross=cross, magnitude=quadratic + 2.0 * cross_abs)

    def _admit(self, values: Any, last: Any, x: Any, t: int) -> Any:
        return self._open_nodes(values, last, t) + x[:, None, :]

    def _release(self, values: Any, a: Any, t: int) -> tuple[Any, Any]:
        xp = array_module(values, a)
        starts = xp.asarray((t % (1 << np.arange(self._levels)) == 0)[:, None])  # a node opens at t
        values = xp.where(starts, 0.0, values) + a[None, :]
        return values[: self.strategy.rows_at(t)], values


# --------------------------------------------------------------------------- the dense reference


class DenseHistoryPrepaid(PrepaidRule):
    """The exact reference for any strategy over a declared horizon: per user the admitted
    history (``horizon x d``), per query the aggregate history; ``C`` dense
    (:meth:`Strategy.query_matrix`, ``horizon x horizon`` for one row a window). The square root's
    prepaid rule (it has no finite state) and the reference :class:`BLTPrepaid` and
    :class:`TreePrepaid` are tested against. Memory: ``C``, and per window a few copies of the
    window's users' rows (``n x horizon x d``).
    """

    def __init__(self, strategy: Strategy, *, horizon: int) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError(f"strategy must be a Strategy, got {type(strategy).__name__}")
        horizon = _integer("horizon", horizon, minimum=1)
        if horizon > MAX_DENSE_HORIZON:
            raise ValueError(f"horizon must be in [1, {MAX_DENSE_HORIZON}] for a dense history, got horizon={horizon}")
        self.strategy = strategy
        self.horizon = horizon
        self._c = strategy.query_matrix(horizon)  # (rows, T)
        self._c_abs = self._c if bool((self._c >= 0).all()) else np.abs(self._c)  # no copy for sqrt, tree
        self._row_times = strategy.row_times(horizon)

    @property
    def width(self) -> int:
        return self.horizon

    def _terms(self, values: Any, last: Any, x: Any, t: int) -> ChargeTerms:
        # sum_r C_{r,t} <(C h)_r, x> = sum_s v_s <h_s, x> with v = C[:, t] C (public, ``T`` numbers):
        # no ``rows x T`` block per user (a window of ``n`` users would need ``n T^2 d`` numbers).
        xp = array_module(values, x)
        column = self._c[:, t]
        v, v_abs = column @ self._c, np.abs(column) @ self._c_abs
        quadratic = xp.einsum("nd,nd->n", x, x) * float(column @ column)
        cross = _weigh(_dot(values, x), xp.asarray(v))
        cross_abs = _weigh(_dot(xp.abs(values), xp.abs(x)), xp.asarray(v_abs))
        return ChargeTerms(quadratic=quadratic, cross=cross, magnitude=quadratic + 2.0 * cross_abs)

    def _admit(self, values: Any, last: Any, x: Any, t: int) -> Any:
        out = values.copy()
        out[:, t, :] = x
        return out

    def _release(self, values: Any, a: Any, t: int) -> tuple[Any, Any]:
        xp = array_module(values, a)
        values = values.copy()
        values[t] = a
        rows = np.flatnonzero(self._row_times == t)
        return xp.asarray(self._c[rows]) @ values, values


def prepaid_rule(strategy: Strategy, *, horizon: int | None) -> PrepaidRule:
    """The compact rule for ``strategy`` (BLT, tree) or the dense reference (any other, which
    needs a declared ``horizon``)."""
    if isinstance(strategy, BufferedLinearToeplitz):
        return BLTPrepaid(strategy, horizon=horizon)
    if isinstance(strategy, BinaryTree):
        return TreePrepaid(strategy, horizon=horizon)
    if horizon is None:
        raise ValueError(f"horizon must be declared for strategy {strategy.name!r} (its infinite tail is not "
                         "finite or has no compact form), got horizon=None")
    return DenseHistoryPrepaid(strategy, horizon=horizon)


# --------------------------------------------------------------------------- running queries by name

#: The strategies a running query may name, each under the prepaid rule (the one list: the CLI's
#: ``--strategy`` choices and :mod:`renyi_stream.queries.linear` take it from here). ``blt`` is the default:
#: its max error is within 1% of the square root's (1.000024 at ``T = 365``, 4 buffers).
RUNNING_STRATEGIES: tuple[str, ...] = ("blt", "sqrt", "tree")
DEFAULT_RUNNING_STRATEGY = "blt"
#: The declared schedule of a running query that names none: 365 windows from its first. Chosen
#: over the infinite tail by measurement (docs/running_totals.md, "The declared horizon"): at the
#: 99.9% budget rule the tail's norm budget is 1.66x (Bernoulli(0.05) users) to 1.75x
#: (Bernoulli(0.5)) the declared one, so the day-365 RMSE is 1.19x to 1.32x higher.
DEFAULT_PREPAID_HORIZON = 365
#: The horizon value that charges the infinite tail (releases without end; BLT only).
TAIL = "tail"


def parse_horizon(value: Any) -> int | str:
    """A running query's declared schedule: a window count ``>= 1`` or ``"tail"`` (the infinite
    tail). Accepts the string form of either (the command line, JSON). ValueError naming
    ``horizon`` otherwise."""
    if isinstance(value, str) and value.strip().lower() == TAIL:
        return TAIL
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_DENSE_HORIZON:
        raise ValueError(f"horizon must be a number of windows in [1, {MAX_DENSE_HORIZON}] or {TAIL!r} (the infinite "
                         f"tail, blt only), got horizon={value!r}"[:300])
    return int(value)


def running_factorisation(strategy: str, horizon: int | str) -> Strategy:
    """The factorisation of a running query registered with ``strategy`` (one of
    :data:`RUNNING_STRATEGIES`) over ``horizon`` (:func:`parse_horizon`), cheaply (no dense
    matrix): ``blt`` with the shipped 4-buffer parameters of the smallest shipped horizon ``>= T``
    (the largest for longer schedules; ``T = 365``'s for the tail), the square root, the binary
    tree. ValueError naming the parameter for an unknown strategy, or the tail with a strategy
    whose tail is not finite."""
    horizon = parse_horizon(horizon)
    if strategy not in RUNNING_STRATEGIES:
        raise ValueError(f"strategy must be one of {RUNNING_STRATEGIES}, got strategy={strategy!r}"[:300])
    if horizon == TAIL and strategy != "blt":
        raise ValueError(f"horizon {TAIL!r} (the infinite tail) needs strategy 'blt': the {strategy!r} strategy's tail "
                         f"is not finite; declare a number of windows, got horizon='tail' with strategy={strategy!r}")
    if strategy == "blt":
        fitted = DEFAULT_HORIZON if horizon == TAIL else next(
            (h for h in SHIPPED_HORIZONS if h >= horizon), SHIPPED_HORIZONS[-1])
        return BufferedLinearToeplitz.shipped(fitted, DEFAULT_BUFFERS)
    return BinaryTree() if strategy == "tree" else SquareRootFactorization()


def running_rule(strategy: str, horizon: int | str) -> PrepaidRule:
    """The prepaid rule of a running query registered with ``strategy`` over ``horizon``
    (:func:`running_factorisation`). Deterministic: the same name and horizon give the same public
    constants on every worker and in every run. ``blt``: :class:`BLTPrepaid`; ``tree``:
    :class:`TreePrepaid`; ``sqrt``: :class:`DenseHistoryPrepaid`, the exact reference, whose per-user
    state is the whole admitted history, ``T x d`` numbers. ValueError above
    :data:`MAX_RUNNING_HORIZON` (before anything is built)."""
    _refuse_long_horizon(strategy, horizon)
    factorisation = running_factorisation(strategy, horizon)
    declared = None if parse_horizon(horizon) == TAIL else int(horizon)
    return prepaid_rule(factorisation, horizon=declared)


# --------------------------------------------------------------------------- bounds on a running query

#: Numbers a user, ``width x dim`` float64, that the running queries active together keep: 1024
#: (8 KiB a user; 8 GiB for 1,000,000 users, the scale of docs/running_totals.md, "Measured: a flat daily
#: cost", on a 24 GB machine).
#: ``blt`` up to 256 coordinates, ``tree`` 113 at 365 windows, ``sqrt`` ``horizon x dim <= 1024``.
MAX_USER_STATE = 1024
#: The longest declared horizon a running query may name, per strategy (windows). ``sqrt`` keeps
#: ``horizon x dim`` numbers a user and a dense ``horizon x horizon`` ``C`` (8 MiB at 1024);
#: ``blt`` and ``tree`` ``O(horizon)`` public constants, to :data:`MAX_DENSE_HORIZON`. With
#: :data:`MAX_USER_STATE`, a query releases at most ``2^22`` numbers over its schedule.
MAX_RUNNING_HORIZON: Mapping[str, int] = MappingProxyType({"blt": MAX_DENSE_HORIZON, "sqrt": MAX_USER_STATE,
                                                            "tree": MAX_DENSE_HORIZON})

# The way out, per strategy, when a query is too big for it.
_ALTERNATIVE = {"sqrt": f"use --strategy blt, whose state is {DEFAULT_BUFFERS} x dim numbers a user at any horizon",
                "tree": f"use --strategy blt, whose state is {DEFAULT_BUFFERS} x dim numbers a user",
                "blt": "use fewer coordinates, or a window query (kind window) for the rest"}


@dataclass(frozen=True)
class RunningFootprint:
    """What a job keeps for one running query, in float64 numbers (:func:`running_footprint`):
    ``per_user`` (``width x dim``) for every user ever admitted, ``constants`` once (the rule's
    public constants: ``sqrt``'s dense ``C``, ``T x T``), and ``history``, the released numbers
    over the schedule (``rows x dim``; None for the tail: ``dim`` a window, without end)."""

    width: int
    per_user: int
    constants: int
    history: int | None

    def bytes(self, users: int) -> int:
        """Bytes kept for ``users`` users ever admitted, the schedule's releases included."""
        return 8 * (self.constants + (self.history or 0) + users * self.per_user)


def running_footprint(strategy: str, horizon: int | str, dim: int) -> RunningFootprint:
    """The footprint of a running query (``strategy``, ``horizon``, ``dim`` coordinates), by
    arithmetic: nothing is built. Widths as the rules': ``blt`` its buffers, ``tree`` one partial
    sum per level (``floor(log2 T) + 1``), ``sqrt`` the whole history (``T``)."""
    running_factorisation(strategy, horizon)  # names a bad strategy or horizon
    horizon, dim = parse_horizon(horizon), _integer("dim", dim, minimum=1)
    if horizon == TAIL:
        return RunningFootprint(DEFAULT_BUFFERS, DEFAULT_BUFFERS * dim, 3 * DEFAULT_BUFFERS, None)
    if strategy == "blt":  # G, H, |H| and the powers of theta per window offset
        width, constants, rows = DEFAULT_BUFFERS, (3 * DEFAULT_BUFFERS + 2) * (horizon + 1), horizon
    elif strategy == "tree":  # a node of level j completes every 2^j windows
        width = horizon.bit_length()
        constants, rows = width, sum(horizon >> j for j in range(width))
    else:
        width, constants, rows = horizon, horizon * horizon, horizon
    return RunningFootprint(width, width * dim, constants, rows * dim)


def _refuse_long_horizon(strategy: str, horizon: int | str, query_id: str | None = None) -> None:
    """ValueError when ``horizon`` is above ``strategy``'s :data:`MAX_RUNNING_HORIZON`."""
    limit, declared = MAX_RUNNING_HORIZON.get(strategy), parse_horizon(horizon)
    if limit is None or declared == TAIL or declared <= limit:
        return
    which = "" if query_id is None else f" for running query {query_id!r}"
    raise ValueError(f"horizon must be in [1, {limit}] for strategy {strategy!r} (a user's state is their whole "
                     f"admitted history, horizon x dim numbers, at most {MAX_USER_STATE}), got horizon={declared}"
                     f"{which}: {_ALTERNATIVE[strategy]}, or declare a shorter horizon")


def check_running_size(strategy: str, horizon: int | str, dim: int, *, query_id: str | None = None) -> RunningFootprint:
    """The footprint of one running query, or ValueError naming the parameter (``horizon``, then
    ``dim``), its value, the allowed range and the way out: a horizon above
    :data:`MAX_RUNNING_HORIZON`, a per-user state above :data:`MAX_USER_STATE` numbers."""
    _refuse_long_horizon(strategy, horizon, query_id)
    found = running_footprint(strategy, horizon, dim)
    if found.per_user > MAX_USER_STATE:
        which = "" if query_id is None else f" for running query {query_id!r}"
        state = {"sqrt": "the whole admitted history, horizon x dim", "tree": "one partial sum per level, "
                 f"{found.width} x dim", "blt": f"its buffers, {found.width} x dim"}[strategy]
        raise ValueError(f"dim must be in [1, {MAX_USER_STATE // found.width}] for strategy {strategy!r} over horizon "
                         f"{horizon} (a user's state is {state} numbers, at most {MAX_USER_STATE}), got "
                         f"dim={dim}{which}: {_ALTERNATIVE[strategy]}")
    return found


def refuse_running_too_big(queries: Sequence[Any], *, where: str) -> None:
    """ValueError when a running query among ``queries`` (anything with ``query_id``, ``kind``,
    ``strategy``, ``horizon``, ``dim``; others are skipped) is too big (:func:`check_running_size`),
    or those active together, ``where`` (e.g. ``"in window 20512"``), keep more than
    :data:`MAX_USER_STATE` numbers a user."""
    running = [q for q in queries if getattr(q, "kind", None) == "running"]
    found = [check_running_size(getattr(q, "strategy", None) or DEFAULT_RUNNING_STRATEGY,
                                getattr(q, "horizon", None) or DEFAULT_PREPAID_HORIZON, q.dim, query_id=q.query_id)
             for q in running]
    per_user = sum(f.per_user for f in found)
    if per_user > MAX_USER_STATE:
        ids = ", ".join(repr(q.query_id) for q in running)
        raise ValueError(f"the running queries active together {where} ({ids}) would keep {per_user} numbers a user; "
                         f"at most {MAX_USER_STATE} (MAX_USER_STATE) are kept a user: retire some first, or use "
                         f"--strategy blt ({DEFAULT_BUFFERS} x dim numbers a user)"[:600])


def realised_sq_norms(strategy: Strategy, admitted: np.ndarray) -> np.ndarray:
    """``||q_t(i)||^2`` for every user and window: the squared norm of user ``i``'s part of the
    release at ``t``, ``(C x_i)`` over the rows released at ``t``, from their admitted stream
    ``admitted`` (``(users, T, d)``). The losses the prepaid charges must cover (tests, audits)."""
    users, horizon, _ = admitted.shape
    q = np.einsum("rT,uTd->urd", strategy.query_matrix(horizon), admitted)
    per_row = np.einsum("urd,urd->ur", q, q)
    out = np.zeros((users, horizon))
    np.add.at(out.T, strategy.row_times(horizon), per_row.T)
    return out


__all__ = [
    "ETA", "TINY", "BLTPrepaid", "ChargeTerms", "DenseHistoryPrepaid", "PrepaidRule", "ReleaseState", "TreePrepaid",
    "UserState", "prepaid_charge", "prepaid_filter", "prepaid_rho", "prepaid_rule", "realised_sq_norms",
    "DEFAULT_PREPAID_HORIZON", "DEFAULT_RUNNING_STRATEGY", "RUNNING_STRATEGIES", "TAIL", "parse_horizon",
    "running_factorisation", "running_rule", "MAX_RUNNING_HORIZON", "MAX_USER_STATE",
    "RunningFootprint", "check_running_size", "refuse_running_too_big", "running_footprint",
]
