"""Running totals under the individual filter: per-user history, the query at each window, the charge.

The mechanism. A running query with strategy ``A = B C`` (:mod:`renyi_stream.stream.continual.strategies`)
releases at window offset ``t`` (``t = window_id - start_window``)

    y_t = sum_{i admitted at t} q_t(x_i) + z_t,    z_t ~ N(0, s^2 I),  q_t(x_i) = C_t x_i,

where ``x_i = (x_{i,0}, x_{i,1}, ...)`` is user ``i``'s timeline of per-window contributions
(``d`` numbers each) and ``C_t`` the rows of ``C`` released at ``t``: for the square-root
factorisation ``q_t(x_i) = sum_{s<=t} c_{t-s} x_{i,s}``, for the tree the node sums completing at
``t``. The running total through ``t`` is then estimated by ``(B y)_t`` from ``y_0..y_t``.

Individual accounting (Feldman & Zrnic, "Individual Privacy Accounting via a Rényi Filter",
Section 4). Each ``y_t`` is a Gaussian mechanism on a sum, so user ``i``'s individual loss at
``t`` is ``rho_t(i) = ||q_t(x_i)||^2 / (2 s^2)`` zCDP (Section 4.2). :meth:`RunningState.step`
hands the vectors ``q_t(x_i)`` to :meth:`renyi_stream.stream.ledger.Ledger.admit`, the same ledger as window
sums, which admits, drops (Algorithm 3) or clips (Algorithm 7) each user exactly as for a window
sum. Why this is sound: the record of user ``i`` is their whole timeline (user-level privacy);
``q_t`` is a fixed linear function of that record which reads only windows ``<= t`` (``C`` is
lower-triangular), so it is determined before ``t``'s release, as Algorithm 3 requires of an
adaptively chosen query; the filter's decision for user ``i`` reads only user ``i``'s used budget
and ``q_t(x_i)``. Theorem 4.5 / Corollary 4.7 then give ``kappa``-zCDP (``sqrt(2 kappa)``-GDP,
Smith & Thakurta 2022) for every user over all windows, together with every other release that
charges the same ledger.

What a dropped user's history means afterwards (the semantic chosen here). A user dropped (or
clipped) at ``t`` contributes nothing (or a scaled ``q_t``) to ``y_t`` and is charged nothing
(or the rest of the budget) at ``t``. Their history is *not* edited: ``x_{i,t}`` is stored as
their true data, and the query at every later window is still ``q_{t'}(x_i) = C_{t'} x_i`` on
the true timeline, charged and admitted (or not) afresh. This is exactly Algorithm 3: dropping
removes the user from *one* step's dataset, it does not change their record, and every query is
the same fixed function of records whatever the filter decided. (Zeroing the dropped windows
instead would also be sound, since the decisions depend only on the user's own data and past
releases, but it would make the stored state depend on filter outcomes; here the state update
is independent of them, so a caller may charge the query vectors together with other queries,
see :meth:`RunningState.queries_at`.) Consequences: under ``clip`` a user who exhausts the
budget is dropped from then on (every later ``q_t`` is non-zero for the square-root strategy);
under ``drop`` a user's later, smaller queries may be admitted again. Either way the estimate
then misses part of that user's contribution: the filter's bias, which the norm budget is set
to make rare.

Assumption (stated, not checked): as in Feldman & Zrnic the data are fixed in advance; a
user's data are not chosen adaptively from earlier releases.

Execution. :class:`RunningState` holds, per shard, every user's non-zero contributions as
sparse ``(user, window, values)`` entries, vectorised (no Python loop per user). History older
than the strategy's ``max_lag`` is forgotten (window sums keep none; the square-root strategy
keeps all, the capped tree ``2^height`` windows). It persists as an Arrow table beside the
ledger (:meth:`RunningState.to_arrow`, :meth:`RunningState.from_arrow`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.continual.strategies import SquareRootFactorization, Strategy, strategy_from_spec
from renyi_stream.stream.id_index import Int64Index, StringCodes
from renyi_stream.stream.ledger import STATUS_NAMES, Ledger, Policy
from renyi_stream.stream.noise import NoiseBinding, gaussian_noise

SNAPSHOT_VERSION = 1
MAX_QUERY_DIM = 4096  # the ledger's limit on rows * d (renyi_stream.stream.accounting.gaussian.MAX_DIM)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {name}={value!r}")
    return int(value)


def _policy(policy: Policy | str) -> Policy:
    try:
        return Policy(policy)
    except ValueError:
        raise ValueError(f"policy must be one of {[p.value for p in Policy]}, got policy={policy!r}") from None


@dataclass(frozen=True)
class RunningQuery:
    """The public description of one running query: what is released and with which noise.

    Attributes:
        query_id: the release's query id; its keyed noise is drawn for ``(query_id,
            window_id)``, so it must differ from the id of any other release (e.g. the window
            release of the same column).
        strategy: the factorisation (default :class:`SquareRootFactorization`).
        dim: ``d``, numbers per user per window.
        start_window: the window id of the running total's first window (offset 0).
        noise_std: ``s``, the per-coordinate noise std of each released row ``C_t x + z_t``
            (from ``renyi_stream.stream.accounting.calibrate``; the estimate's std is larger, see
            :meth:`estimate_std`).
    """

    query_id: str
    dim: int
    start_window: int
    noise_std: float
    strategy: Strategy = field(default_factory=SquareRootFactorization)

    def __post_init__(self) -> None:
        if not isinstance(self.query_id, str) or not self.query_id:
            raise ValueError(f"query_id must be a non-empty string, got query_id={self.query_id!r}")
        if not isinstance(self.strategy, Strategy):
            raise ValueError(f"strategy must be a Strategy, got strategy of type {type(self.strategy).__name__}")
        dim = _integer("dim", self.dim)
        if not 1 <= dim <= MAX_QUERY_DIM:
            raise ValueError(f"dim must be in [1, {MAX_QUERY_DIM}], got dim={self.dim!r}")
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "start_window", _integer("start_window", self.start_window))
        object.__setattr__(self, "noise_std", check.positive("noise_std", self.noise_std))

    def offset(self, window_id: int) -> int:
        """``t = window_id - start_window`` (>= 0)."""
        t = _integer("window_id", window_id) - self.start_window
        if t < 0:
            raise ValueError(f"window_id must be >= start_window={self.start_window}, got window_id={window_id!r}")
        return t

    def rows_at(self, window_id: int) -> int:
        """Rows (``d``-vectors) released at ``window_id``."""
        return self.strategy.rows_at(self.offset(window_id))

    def new_state(self, *, id_type: str = "int64") -> "RunningState":
        """An empty per-shard state for this query."""
        return RunningState(strategy=self.strategy, dim=self.dim, start_window=self.start_window, id_type=id_type)

    def noisy_release(self, total: Any, *, binding: NoiseBinding, window_id: int) -> np.ndarray:
        """``y_t = total + z_t``: ``total`` the ``(rows_at, d)`` sum of every shard's
        :attr:`RunningStep.total`; ``z_t`` the keyed noise of ``(query_id, window_id)`` at
        :attr:`noise_std` for ``binding``'s ledger (:func:`renyi_stream.stream.noise.gaussian_noise`, dim
        ``rows * d``, row-major), so a re-run releases the identical ``y_t`` (invariant 5
        (release-once, docs/architecture.md)) and another ledger under the same key an independent
        one."""
        rows = self.rows_at(window_id)
        y = np.asarray(total, dtype=np.float64)
        if y.shape != (rows, self.dim):
            raise ValueError(
                f"total must have shape ({rows}, {self.dim}) at window_id={window_id}, got shape={y.shape}")
        if not np.isfinite(y).all():
            raise ValueError("total must be finite")
        noise = gaussian_noise(binding, query_id=self.query_id, window_id=int(window_id), dim=rows * self.dim,
                               noise_std=self.noise_std)
        return y + noise.reshape(rows, self.dim)

    def estimates(self, releases: Sequence[Any]) -> np.ndarray:
        """Running-total estimates ``(T, d)`` from the releases ``y`` of windows
        ``start_window .. start_window + T - 1`` (:meth:`Strategy.post_process`). Post-processing
        of released values: free of privacy cost."""
        return self.strategy.post_process(releases)

    def estimate_online(self, window_id: int, state: np.ndarray | None, release: Any) -> tuple[np.ndarray, np.ndarray]:
        """The running-total estimate at ``window_id`` (``d`` numbers) and the decoder's state after
        it, from its state after the window before (``None`` at :attr:`start_window`) and the
        window's release ``y`` (``rows_at * d`` numbers, row-major): :meth:`Strategy.decode_online`,
        equal to :meth:`estimates` of the series through that window, bit for bit. Post-processing
        of released values: free of privacy cost."""
        rows = self.rows_at(window_id)
        y = np.asarray(release, dtype=np.float64).reshape(rows, self.dim)
        estimate, state = self.strategy.decode_online(self.offset(window_id), state, y)
        return np.asarray(estimate).reshape(self.dim), state

    def estimate_std(self, window_id: int) -> float:
        """Std (per coordinate) of the running-total estimate at ``window_id``: the
        ``noise_std`` of a ``running`` release row."""
        t = self.offset(window_id)
        return float(self.strategy.estimate_std(t + 1, noise_std=self.noise_std)[t])

    def describe(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "strategy": self.strategy.spec(), "dim": self.dim,
                "start_window": self.start_window, "noise_std": self.noise_std,
                "mechanism": "gaussian", "units": "zCDP rho = ||C_t x_i||^2 / (2 noise_std^2)"}


@dataclass(frozen=True)
class RunningQueries:
    """The query vectors of one window, before charging (sensitive: never leaves the curator).

    ``user_ids[i]``'s query is ``vectors[i]`` = ``q_t(x_i)`` flattened row-major from
    ``(rows, dim)``. Users whose query is zero are left out (they are charged nothing and
    contribute nothing). Pass to :meth:`RunningState.commit` once charged.
    """

    window_id: int
    rows: int
    dim: int
    user_ids: Any  # (n,) int64 ndarray or pyarrow large_string array
    vectors: np.ndarray  # (n, rows * dim) float64
    _generation: int = field(repr=False)
    _new_ids: Any = field(repr=False)  # ids with a non-zero contribution at this window
    _new_values: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class RunningStep:
    """What :meth:`RunningState.step` charged and what the shard adds to the release.

    ``contributions`` (``(n, rows * dim)``), ``charge`` (zCDP) and ``status`` are the ledger's
    :class:`renyi_stream.stream.ledger.AdmitResult` for ``user_ids``; ``total`` (``(rows, dim)``) is their
    sum: the shard's part of ``C_t x`` over admitted users (sensitive until noised).
    """

    window_id: int
    user_ids: Any
    contributions: np.ndarray
    charge: np.ndarray
    status: np.ndarray
    total: np.ndarray

    def counts(self) -> dict[str, int]:
        """Queried users per status (sensitive: curator only)."""
        tally = np.bincount(self.status, minlength=len(STATUS_NAMES))
        return {name: int(tally[i]) for i, name in enumerate(STATUS_NAMES)}


class _Growable:
    """Append-only float64/int64 columns with amortised O(1) appends and in-place filtering."""

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.user = np.zeros(0, dtype=np.int64)
        self.offset = np.zeros(0, dtype=np.int64)
        self.values = np.zeros((0, dim))

    def append(self, user: np.ndarray, offset: np.ndarray, values: np.ndarray) -> None:
        need = self.n + user.size
        if need > self.user.size:
            capacity = max(need, 2 * self.user.size, 1024)
            for name in ("user", "offset", "values"):
                old = getattr(self, name)
                grown = np.zeros((capacity, *old.shape[1:]), dtype=old.dtype)
                grown[: self.n] = old[: self.n]
                setattr(self, name, grown)
        self.user[self.n:need] = user
        self.offset[self.n:need] = offset
        self.values[self.n:need] = values
        self.n = need

    def keep(self, mask: np.ndarray) -> None:
        k = int(mask.sum())
        if k == self.n:
            return
        self.user[:k] = self.user[: self.n][mask]
        self.offset[:k] = self.offset[: self.n][mask]
        self.values[:k] = self.values[: self.n][mask]
        self.n = k


class RunningState:
    """Per-shard state of one running query: every user's history, keyed like the ledger.

    Args:
        strategy: the factorisation (see :mod:`renyi_stream.stream.continual.strategies`).
        dim: ``d``, numbers per user per window.
        start_window: window id of offset 0.
        id_type: ``"int64"`` or ``"string"``, as the ledger's.

    Call :meth:`step` once per window of the public schedule, in window order, starting at
    ``start_window``, *including windows with no rows* (invariant 3: every user with history
    has a non-zero query at later windows under the square-root strategy). A window is
    processed once: :meth:`step` refuses any window but :attr:`next_window` (invariant 6).
    """

    def __init__(self, *, strategy: Strategy, dim: int, start_window: int, id_type: str = "int64") -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError(f"strategy must be a Strategy, got strategy of type {type(strategy).__name__}")
        dim = _integer("dim", dim)
        if not 1 <= dim <= MAX_QUERY_DIM:
            raise ValueError(f"dim must be in [1, {MAX_QUERY_DIM}], got dim={dim!r}")
        if id_type not in ("int64", "string"):
            raise ValueError(f"id_type must be 'int64' or 'string', got id_type={id_type!r}")
        self.strategy = strategy
        self.dim = dim
        self.start_window = _integer("start_window", start_window)
        self.id_type = id_type
        self._offset = 0
        self._generation = 0
        self._index = Int64Index() if id_type == "int64" else None
        self._codes = StringCodes() if id_type == "string" else None
        self._ids = np.zeros(0, dtype=np.int64)  # int64 ids by position
        self._n_users = 0
        self._entries = _Growable(dim)

    # -- reading ----------------------------------------------------------------------------

    @property
    def next_window(self) -> int:
        """The window id the next :meth:`step` must process."""
        return self.start_window + self._offset

    @property
    def n_entries(self) -> int:
        """Stored ``(user, window)`` history entries."""
        return self._entries.n

    def users(self) -> Any:
        """Ids of the users with stored history (int64 array or string array)."""
        positions = np.unique(self._entries.user[: self._entries.n])
        return self._ids_at(positions)

    # -- ids --------------------------------------------------------------------------------

    def _as_ids(self, user_ids: Any) -> np.ndarray | pa.Array:
        if isinstance(user_ids, (str, bytes, set, frozenset)) or user_ids is None:
            raise ValueError(f"user_ids must be an ordered sequence or array of ids, got {type(user_ids).__name__}")
        if self.id_type == "int64":
            if isinstance(user_ids, (pa.Array, pa.ChunkedArray)):
                if not pa.types.is_integer(user_ids.type):
                    raise ValueError(f"user_ids must be integers for id_type='int64', got type {user_ids.type}")
                if user_ids.null_count:
                    raise ValueError("user_ids must not contain nulls")
                return np.asarray(user_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
            ids = np.asarray(user_ids)
            if ids.size == 0:
                return np.zeros(0, dtype=np.int64)
            if ids.dtype.kind not in "iu":
                raise ValueError(f"user_ids must be integers for id_type='int64', got dtype {ids.dtype}")
            if ids.dtype.kind == "u" and ids.max() > np.iinfo(np.int64).max:
                raise ValueError("user_ids must fit in int64")
            return ids.astype(np.int64, copy=False).ravel()
        if isinstance(user_ids, (pa.Array, pa.ChunkedArray)):
            ids = user_ids
        else:
            try:
                ids = pa.array(user_ids.tolist() if isinstance(user_ids, np.ndarray) else list(user_ids),
                               type=pa.large_string())
            except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ValueError(f"user_ids must be strings for id_type='string': {exc}") from exc
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if len(ids) == 0:
            return pa.array([], type=pa.large_string())
        if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
            raise ValueError(f"user_ids must be strings for id_type='string', got type {ids.type}")
        if ids.null_count:
            raise ValueError("user_ids must not contain nulls")
        return ids.cast(pa.large_string())

    def _lookup(self, ids: np.ndarray | pa.Array) -> np.ndarray:
        if self.id_type == "int64":
            assert self._index is not None
            return self._index.lookup(ids) if len(ids) else np.zeros(0, dtype=np.int64)
        assert self._codes is not None
        return self._codes.codes(ids, add_missing=False) if len(ids) else np.zeros(0, dtype=np.int64)

    def _add(self, ids: np.ndarray | pa.Array) -> np.ndarray:
        """Positions of ``ids`` (distinct), adding the unknown ones."""
        if self.id_type == "string":
            assert self._codes is not None
            positions = self._codes.codes(ids, add_missing=True) if len(ids) else np.zeros(0, dtype=np.int64)
            self._n_users = len(self._codes)
            return positions
        assert self._index is not None
        positions = self._lookup(ids)
        missing = positions < 0
        if missing.any():
            positions[missing] = self._index.add(ids[missing])
            self._ids = np.concatenate([self._ids, ids[missing]])
            self._n_users = len(self._index)
        return positions

    def _ids_at(self, positions: np.ndarray) -> Any:
        if self.id_type == "int64":
            return self._ids[positions]
        assert self._codes is not None
        return self._codes.values().take(pa.array(positions, type=pa.int64()))

    @staticmethod
    def _refuse_repeats(ids: np.ndarray | pa.Array) -> None:
        if len(ids) < 2:
            return
        if isinstance(ids, np.ndarray):
            uniq, counts = np.unique(ids, return_counts=True)
            if counts.max() > 1:
                raise ValueError(f"user_ids must be distinct within one window, got user id "
                                 f"{int(uniq[np.argmax(counts)])!r} more than once")
            return
        counts = pc.value_counts(ids)
        tally = counts.field("counts").to_numpy()
        if tally.max() > 1:
            raise ValueError(f"user_ids must be distinct within one window, got user id "
                             f"{counts.field('values')[int(np.argmax(tally))].as_py()!r} more than once")

    # -- the query at a window --------------------------------------------------------------

    def queries_at(self, user_ids: Any, contributions: Any, *, window_id: int) -> RunningQueries:
        """Every user's query ``q_t(x_i)`` at ``window_id``, without charging or changing state.

        ``user_ids`` (distinct) have this window's contributions ``(n, dim)`` (``(n,)`` when
        ``dim == 1``); every other user with history contributes zero this window but is still
        queried on their history. Validates everything first (STYLE habit 2).
        """
        window_id = _integer("window_id", window_id)
        if window_id != self.next_window:
            raise ValueError(
                f"window_id must be the next unprocessed window {self.next_window} (windows are "
                f"processed once, in order), got window_id={window_id}"
            )
        x = np.asarray(contributions, dtype=np.float64)
        if x.ndim == 1 and self.dim == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"contributions must have shape (n, {self.dim}), got shape={np.shape(contributions)}")
        ids = self._as_ids(user_ids)
        if len(ids) != x.shape[0]:
            raise ValueError(f"user_ids and contributions must have the same number of rows, got "
                             f"{len(ids)} ids and {x.shape[0]} rows")
        if not np.isfinite(x).all():
            raise ValueError("contributions must be finite, got a NaN/inf; validate batches with "
                             "renyi_stream.stream.schema.validate_batch first")
        self._refuse_repeats(ids)
        t = self._offset
        rows = self.strategy.rows_at(t)
        if rows * self.dim > MAX_QUERY_DIM:
            raise ValueError(f"rows * dim must be <= {MAX_QUERY_DIM}, got {rows} * {self.dim} at window_id={window_id}")
        d = self.dim
        # History part: sum over stored entries (all from windows < t, so lags >= 1).
        e = self._entries
        history = np.zeros((self._n_users, rows, d))
        if e.n:
            weights = self.strategy._lag_weights(t, t - e.offset[: e.n])  # (rows, nnz)
            for r in range(rows):
                w = weights[r]
                if not w.any():
                    continue
                for j in range(d):
                    history[:, r, j] = np.bincount(e.user[: e.n], weights=w * e.values[: e.n, j],
                                                   minlength=self._n_users)
        # This window's part: lag 0.
        lag0 = self.strategy._lag_weights(t, np.zeros(1, dtype=np.int64))[:, 0]  # (rows,)
        current = lag0[None, :, None] * x[:, None, :]  # (n, rows, d)
        positions = self._lookup(ids)
        known = positions >= 0
        with np.errstate(over="ignore", invalid="ignore"):
            # A user's finite values can sum past float64's range: their query is then not
            # finite, which the caller treats as an infinite charge (renyi_stream.stream.engine.shard_state).
            current[known] += history[positions[known]]
        covered = np.zeros(self._n_users, dtype=bool)
        covered[positions[known]] = True
        flat_history = history.reshape(self._n_users, rows * d)
        others = np.flatnonzero(~covered & (flat_history != 0.0).any(axis=1))
        flat_current = current.reshape(len(ids), rows * d)
        asked = (flat_current != 0.0).any(axis=1)
        vectors = np.concatenate([flat_current[asked], flat_history[others]], axis=0)
        if self.id_type == "int64":
            queried: Any = np.concatenate([ids[asked], self._ids_at(others)])
        else:
            queried = pa.concat_arrays([ids.filter(pa.array(asked)), self._ids_at(others)])
        nonzero = (x != 0.0).any(axis=1)
        new_ids = ids[nonzero] if self.id_type == "int64" else ids.filter(pa.array(nonzero))
        return RunningQueries(window_id=window_id, rows=rows, dim=d, user_ids=queried, vectors=vectors,
                              _generation=self._generation, _new_ids=new_ids, _new_values=x[nonzero])

    def commit(self, queries: RunningQueries) -> None:
        """Record the window of ``queries`` as processed: store its non-zero contributions as
        history and move to the next window. Call it after charging ``renyi_stream.queries.vectors``
        (possibly concatenated with other queries of the window) into the ledger."""
        if not isinstance(queries, RunningQueries):
            raise ValueError(f"queries must come from queries_at, got {type(queries).__name__}")
        if queries._generation != self._generation or queries.window_id != self.next_window:
            raise ValueError(f"queries are stale: made for window {queries.window_id} at generation "
                             f"{queries._generation}, state is at window {self.next_window}")
        t = self._offset
        positions = self._add(queries._new_ids)
        self._entries.append(positions, np.full(positions.size, t, dtype=np.int64), queries._new_values)
        self._offset += 1
        self._generation += 1
        max_lag = self.strategy.max_lag
        if max_lag is not None and self._entries.n:
            self._entries.keep(self._offset - self._entries.offset[: self._entries.n] <= max_lag)

    def step(self, user_ids: Any, contributions: Any, *, window_id: int, ledger: Ledger,
             noise_std: float, policy: Policy | str = Policy.DROP) -> RunningStep:
        """Query, filter and charge one window (Algorithm 3 / 7 via ``ledger.admit``), then commit.

        Args:
            user_ids, contributions: this window's rows, one per distinct user (``(n, dim)``).
            window_id: must equal :attr:`next_window`.
            ledger: the shard's ledger (same ``id_type``), shared with every other release.
            noise_std: ``s``, per-coordinate noise std of the release (the query's ``noise_std``).
            policy: ``drop`` (Algorithm 3) or ``clip`` (Algorithm 7).
        """
        if not isinstance(ledger, Ledger):
            raise ValueError(f"ledger must be a renyi_stream.stream.ledger.Ledger, got {type(ledger).__name__}")
        if ledger.id_type != self.id_type:
            raise ValueError(f"ledger id_type must match the state's id_type={self.id_type!r}, "
                             f"got id_type={ledger.id_type!r}")
        noise_std = check.positive("noise_std", noise_std)
        policy = _policy(policy)
        queries = self.queries_at(user_ids, contributions, window_id=window_id)
        width = queries.rows * self.dim
        if len(queries.user_ids):
            result = ledger.admit(queries.user_ids, queries.vectors, noise_std=noise_std, policy=policy)
            admitted, charge, status = result.contributions, result.charge, result.status
        else:
            admitted, charge, status = np.zeros((0, width)), np.zeros(0), np.zeros(0, dtype=np.int8)
        self.commit(queries)
        total = admitted.sum(axis=0).reshape(queries.rows, self.dim)
        return RunningStep(window_id=queries.window_id, user_ids=queries.user_ids, contributions=admitted,
                           charge=charge, status=status, total=total)

    # -- snapshots ----------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """The state as an Arrow table, one row per stored ``(user, window)`` entry, sorted.

        Columns ``user_id``, ``window_id`` (int64, absolute), ``values`` (fixed-size list of
        ``dim`` float64); the strategy, ``dim``, ``start_window``, ``next_window`` and
        ``id_type`` in the schema metadata. Split it by ``user_id`` shard like the ledger's
        snapshot and store it in the same transaction as the ledger (the two must not drift).
        """
        e = self._entries
        if self.id_type == "int64":
            ids: Any = pa.array(self._ids_at(e.user[: e.n]), type=pa.int64())
        else:
            ids = self._ids_at(e.user[: e.n])
        flat = pa.array(e.values[: e.n].ravel(), type=pa.float64())
        values = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        table = pa.table({"user_id": ids,
                          "window_id": pa.array(self.start_window + e.offset[: e.n], type=pa.int64()),
                          "values": values})
        table = table.sort_by([("user_id", "ascending"), ("window_id", "ascending")])
        metadata = {
            "renyi_stream.running_version": str(SNAPSHOT_VERSION),
            "strategy": json.dumps(self.strategy.spec(), sort_keys=True),
            "dim": str(self.dim),
            "start_window": str(self.start_window),
            "next_window": str(self.next_window),
            "id_type": self.id_type,
        }
        return table.replace_schema_metadata(metadata)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "RunningState":
        """Restore from :meth:`to_arrow` (or a shard of it), refusing anything inconsistent:
        version, metadata, columns, nulls, repeated ``(user, window)``, windows outside
        ``[start_window, next_window)``, non-finite values. A state that silently lost history
        would under-charge users: a privacy failure, so every check fails loudly."""
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        version = meta.get("renyi_stream.running_version")
        if version != str(SNAPSHOT_VERSION):
            raise ValueError(f"running-state snapshot version must be {SNAPSHOT_VERSION}, got {version!r}")
        try:
            strategy = strategy_from_spec(json.loads(meta["strategy"]))
            dim, start, next_window = int(meta["dim"]), int(meta["start_window"]), int(meta["next_window"])
            id_type = meta["id_type"]
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"running-state snapshot metadata is incomplete or malformed: {exc!r}") from exc
        if next_window < start:
            raise ValueError(f"running-state snapshot has next_window={next_window} < start_window={start}")
        missing = [c for c in ("user_id", "window_id", "values") if c not in table.column_names]
        if missing:
            raise ValueError(f"running-state snapshot is missing columns {missing}")
        for name in ("user_id", "window_id", "values"):
            if table.column(name).null_count:
                raise ValueError(f"running-state snapshot column {name!r} contains nulls")
        state = cls(strategy=strategy, dim=dim, start_window=start, id_type=id_type)
        n = table.num_rows
        values_col = table.column("values").combine_chunks()
        if not pa.types.is_fixed_size_list(values_col.type) or values_col.type.list_size != dim:
            raise ValueError(f"running-state snapshot column 'values' must be fixed_size_list<double>[{dim}], "
                             f"got {values_col.type}")
        values = values_col.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(n, dim)
        windows = table.column("window_id").to_numpy().astype(np.int64)
        if not np.isfinite(values).all():
            raise ValueError("running-state snapshot has non-finite values")
        if n and (windows.min() < start or windows.max() >= next_window):
            raise ValueError(f"running-state snapshot has windows outside [{start}, {next_window})")
        ids = state._as_ids(table.column("user_id").combine_chunks())
        pairs = pa.table({"u": table.column("user_id"), "w": table.column("window_id")})
        if n and pairs.group_by(["u", "w"], use_threads=False).aggregate([]).num_rows != n:
            raise ValueError("running-state snapshot repeats a (user_id, window_id) entry")
        # Distinct ids in first-appearance order, then every entry's position.
        if id_type == "int64":
            _, first = np.unique(ids, return_index=True)
            distinct: Any = ids[np.sort(first)]
        else:
            distinct = pc.unique(ids)
        state._add(distinct)
        positions = state._lookup(ids)
        state._entries.append(positions, windows - start, values)
        state._offset = next_window - start
        return state
