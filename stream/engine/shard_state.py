"""One shard's filter state and what it does per window, free of Beam (the DoFn only holds it).

A shard is restored from snapshot parts and written back to them by :class:`ShardSnapshots`,
the same for the batch filter, the distributed job's and the streaming filter.

A shard holds the ledger of its users (:class:`renyi_stream.stream.ledger.Ledger`) and, for every running
query, the per-user prepaid state of its users (:class:`renyi_stream.stream.engine.running.PrepaidUsers`:
one bounded row per user ever admitted). Per window, :meth:`ShardState.charge_window` evaluates
every query active in that window (the :class:`QueryPlan`) and charges the ledger **once** per
user (Feldman & Zrnic, Algorithm 3, drop, or Algorithm 7's clip) for the squared norm of their
window-query vectors plus the prepaid charge of their running-query contributions (each
contribution's whole future cost, :mod:`renyi_stream.stream.continual.prepaid`), and returns the per-query
partial sums of what it admitted. Charging everything together, not each query on its own, is
what makes the filter see the whole adaptive interaction: a user's budget covers window sums,
running totals and every registered query together.

A window query may declare a ``noise_scale`` ``m`` (:class:`renyi_stream.queries.linear.LinearQuery`): its
coordinates are released with noise std ``m * s`` (:func:`window_noise_std`, the one rule every
job's release reads) and charged here, the one place every job's charge is formed, as
``||q(x)||^2 / (2 s^2 m^2)``: each window query's block is divided by its ``m`` before the
ledger's single decision, which then sees exactly the Gaussian mechanism's Rényi charge with
per-coordinate scales (order ``alpha``: ``alpha/2 * v^T Sigma^-1 v``; Feldman & Zrnic Cor 4.7 per
coordinate), and the sums are the unscaled rows times the ledger's own scale ``lambda`` (1, or
the clip's factor), so ``clip``'s one factor stays exact. ``m = 1`` divides by 1.0: bit for bit
what was charged before scales existed.

A running query reads only the users with a row in the window: a user who contributed earlier
but not today is not touched (their past is in the query's release state,
:class:`renyi_stream.stream.engine.running.RunningRelease`), so a shard's work in a window is proportional to
that window's rows, whatever the day.

One user's values never decide whether a window is released (docs/architecture.md, "Edges"): a
query vector that is not finite (a weighted sum whose ``w * x`` overflows, each value finite) is
an infinite charge for that user. The user is dropped at that window under either policy (a clip
of an infinite vector has no direction, so ``clip`` scales it to zero), charged nothing, their
prepaid rows left as they were, and counted in ``counts["nonfinite"]`` for the curator; the
window is released on schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from renyi_stream.stream.continual.prepaid import (DEFAULT_PREPAID_HORIZON, DEFAULT_RUNNING_STRATEGY, PrepaidRule,
                                      refuse_running_too_big, running_rule)
from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.continual.strategies import Strategy
from renyi_stream.stream.engine.running import PREPAID_META_KEYS, PrepaidUsers, rule_meta
from renyi_stream.stream.ledger import ADMITTED, DROPPED, STATUS_NAMES, ChargeTerms, Ledger
from renyi_stream.stream.schema import USER_ID

KINDS = ("window", "running")
#: What a window's counts hold per shard and window (sensitive: curator only). The first three
#: count rows by status; ``nonfinite`` counts users dropped for a non-finite query vector.
WINDOW_COUNT_NAMES = (*STATUS_NAMES, "nonfinite")


def noise_scale_of(query: Any) -> float:
    """The noise scale ``m`` a query declares (:attr:`renyi_stream.queries.linear.LinearQuery.noise_scale`;
    1.0 for a query object without one)."""
    return float(getattr(query, "noise_scale", 1.0))


def window_noise_std(query: Any, noise_std: float) -> float:
    """The per-coordinate noise std of a window query's release: ``m * s``, its noise scale times
    the ledger's noise std ``noise_std`` (exactly ``noise_std`` when ``m = 1``). Every job's
    window release (:class:`renyi_stream.pipelines.beam.transforms.ReleaseWindow`) draws and reports this std, and
    :meth:`ShardState.charge_window` charges for it."""
    return float(noise_std) * noise_scale_of(query)


@dataclass(frozen=True)
class PlannedQuery:
    """A query and the windows it is answered in: ``[first_window, retired_from)``.

    ``query`` is a :class:`renyi_stream.queries.linear.LinearQuery` (anything with ``query_id``, ``kind``,
    ``dim``, ``labels`` and ``evaluate(table) -> (n, dim)`` float64).
    """

    query: Any
    first_window: int
    retired_from: int | None = None

    def __post_init__(self) -> None:
        if self.query.kind not in KINDS:
            raise ValueError(f"query kind must be one of {KINDS}, got kind={self.query.kind!r}")
        if self.retired_from is not None and self.retired_from <= self.first_window:
            raise ValueError(f"retired_from must be after first_window={self.first_window}, "
                             f"got retired_from={self.retired_from}")

    @property
    def query_id(self) -> str:
        return self.query.query_id

    @property
    def kind(self) -> str:
        return self.query.kind

    def active_in(self, window_id: int) -> bool:
        return self.first_window <= window_id and (self.retired_from is None or window_id < self.retired_from)


@dataclass(frozen=True)
class QueryPlan:
    """Every query a run answers, with the windows each is active in. Public (it is the query
    catalogue), and the same on every worker."""

    entries: tuple[PlannedQuery, ...]

    def __post_init__(self) -> None:
        ids = [e.query_id for e in self.entries]
        if len(set(ids)) != len(ids):
            raise ValueError(f"query ids must be distinct in a plan, got {sorted(ids)}")
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda e: e.query_id)))

    @classmethod
    def starting_at(cls, queries: Sequence[Any], first_window: int) -> "QueryPlan":
        """Every query in ``queries`` active from ``first_window`` on (e.g.
        ``renyi_stream.queries.linear.default_queries(columns)``)."""
        return cls(tuple(PlannedQuery(query, int(first_window)) for query in queries))

    def active(self, window_id: int) -> tuple[PlannedQuery, ...]:
        """The queries answered in ``window_id``, sorted by query id."""
        return tuple(e for e in self.entries if e.active_in(window_id))

    @property
    def running(self) -> tuple[PlannedQuery, ...]:
        return tuple(e for e in self.entries if e.kind == "running")

    def get(self, query_id: str) -> PlannedQuery:
        for entry in self.entries:
            if entry.query_id == query_id:
                return entry
        raise KeyError(query_id)

    def running_query(self, query_id: str, noise_std: float) -> RunningQuery:
        """The mechanism of a running query: its registered strategy from its first window."""
        entry = self.get(query_id)
        return RunningQuery(query_id=entry.query_id, dim=entry.query.dim, start_window=entry.first_window,
                            noise_std=noise_std, strategy=running_strategy(entry.query))


@dataclass(frozen=True)
class WindowCharge:
    """What one shard charged in one window (sensitive: curator only until noised).

    ``sums[query_id]`` is the shard's partial sum, flat ``float64``: ``dim`` numbers for a
    window query, and for a running query ``a_t``, the sum of the contributions it admitted
    (scaled ones scaled), ``dim`` numbers, which :class:`renyi_stream.stream.engine.running.RunningRelease`
    turns into ``(C a)_t`` once every shard's is summed. ``counts`` counts the window's rows by
    status, and ``counts["nonfinite"]`` the users dropped because a query vector was not finite
    (also in ``counts["dropped"]``). ``state_rows_read[query_id]``: the prepaid per-user rows the
    running query's kernel read (this window's rows, nobody else's); in a window with a running
    query ``counts["prepaid_rows_read"]`` is their sum (a count of work, read by the daily job).
    """

    window_id: int
    sums: dict[str, np.ndarray]
    counts: dict[str, int]
    state_rows_read: dict[str, int] = field(default_factory=dict)


class ShardState:
    """The ledger and the running queries' per-user prepaid state of one shard of users."""

    def __init__(self, plan: QueryPlan, ledger: Ledger, running: dict[str, PrepaidUsers] | None = None) -> None:
        self.plan = plan
        self.ledger = ledger
        self.running = dict(running or {})
        for entry in plan.running:
            state = self.running.get(entry.query_id)
            if state is not None:
                _refuse_a_strategy_mismatch(entry, state)

    def _running_state(self, entry: PlannedQuery) -> PrepaidUsers:
        state = self.running.get(entry.query_id)
        if state is None:
            strategy, rule = running_rule_of(entry.query)
            state = PrepaidUsers(rule, strategy=strategy, dim=entry.query.dim, start_window=entry.first_window,
                                 id_type=self.ledger.id_type)
            self.running[entry.query_id] = state
        return state

    def windows_to_step(self, data_windows: Sequence[int], last_window: int | None = None) -> list[int]:
        """The windows this shard must process: those with rows, in order. Under prepaid admission
        a running query reads only the users with a row in a window (their past is in the
        query's release state, advanced by :class:`renyi_stream.stream.engine.running.RunningRelease` for every
        window of the schedule), so a shard has nothing to do in a window without rows;
        ``last_window`` is kept for callers and ignored."""
        return sorted({int(w) for w in data_windows})

    def charge_window(self, window_id: int, rows: pa.Table, *, noise_std: float, policy: str) -> WindowCharge:
        """Evaluate, filter and charge one window; ``rows`` has one row per distinct user.

        One decision per user and window (:meth:`renyi_stream.stream.ledger.Ledger.admit`): each user's
        window-query vectors ``v_k`` (charged ``sum_k ||v_k||^2 / (2 s^2 m_k^2)``, ``m_k`` query
        ``k``'s noise scale, :func:`window_noise_std`) and, for each active running
        query, the prepaid charge of their contribution ``x`` (its whole future cost,
        :mod:`renyi_stream.stream.continual.prepaid`), decided together; under ``clip`` one scale applies to
        ``v`` and every ``x``. Only this window's users' prepaid rows are read and written
        (vectorised gather and scatter); a dropped user's row is left as it was (they keep their
        past, only today's contribution is lost). Returns per running query the shard's ``a_t``
        (the sum of admitted, scaled contributions, ``d`` numbers) and, curator-only, the
        prepaid rows read. Nothing changes when the charge is refused (a row whose last
        admission is not before this window: invariants 2 and 6).
        """
        active = self.plan.active(window_id)
        ids = rows.column(USER_ID).combine_chunks() if isinstance(rows.column(USER_ID), pa.ChunkedArray) \
            else rows.column(USER_ID)
        n = rows.num_rows
        blocks: list[tuple[str, int]] = []  # window queries: (query id, dim)
        parts: list[np.ndarray] = []
        scales: list[np.ndarray] = []  # per coordinate of the window vector: its query's noise scale m
        nonfinite = np.zeros(n, dtype=bool)
        running: list[tuple[str, PrepaidUsers, np.ndarray, Any, np.ndarray, int]] = []
        for entry in active:
            values = np.asarray(entry.query.evaluate(rows), dtype=np.float64).reshape(n, entry.query.dim)
            nonfinite |= ~np.isfinite(values).all(axis=1)
            if entry.kind == "window":
                blocks.append((entry.query_id, entry.query.dim))
                parts.append(values)
                scales.append(np.full(entry.query.dim, noise_scale_of(entry.query)))
                continue
            users = self._running_state(entry)
            positions = users.positions(ids)
            running.append((entry.query_id, users, positions, users.gather(positions), values,
                            window_id - entry.first_window))
        matrix = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
        # Each window query's block over its noise scale m: the ledger charges ||v / m||^2 / (2 s^2),
        # the Gaussian mechanism's charge at per-coordinate std m * s (1.0 divides exactly). A row a
        # tiny m overflows is an infinite charge, as a non-finite vector is.
        with np.errstate(over="ignore", invalid="ignore"):
            request = matrix / np.concatenate(scales) if scales else matrix
        nonfinite |= ~np.isfinite(request).all(axis=1)
        # An infinite charge: the ledger sees a zero request (charge 0, nothing changes) and the
        # decision is then set to dropped, which is what the filter decides for charge = inf.
        finite = np.where(nonfinite[:, None], 0.0, request)
        prepaid = []
        for _, users, _, state, values, t in running:
            x = np.where(nonfinite[:, None], 0.0, values)
            terms = users.rule.charge_terms(state, x, t)  # refuses a row already admitted at or after t
            prepaid.append(ChargeTerms(quadratic=np.where(nonfinite, 0.0, terms.quadratic),
                                       cross=np.where(nonfinite, 0.0, terms.cross),
                                       magnitude=np.where(nonfinite, 0.0, terms.magnitude)))
        if active and n:
            result = self.ledger.admit(ids, finite, noise_std=noise_std, policy=policy, prepaid=prepaid or None)
            status = result.status.copy()
            scale = np.where(nonfinite, 0.0, result.scale)
            # The admitted rows in the queries' own units: the unscaled rows times the ledger's
            # lambda (its contributions are (v / m) * lambda), so clip's one factor is exact. With
            # every m = 1 this is the ledger's contributions, the same product bit for bit.
            admitted = np.where(nonfinite[:, None], 0.0, matrix) * result.scale[:, None]
            status[nonfinite] = DROPPED
        else:  # no query asks anything in this window: nobody is charged, every row is admitted
            admitted, status, scale = np.zeros((n, matrix.shape[1])), np.full(n, ADMITTED, dtype=np.int8), np.ones(n)
        totals = admitted.sum(axis=0)
        sums, start = {}, 0
        for query_id, w in blocks:
            sums[query_id] = totals[start:start + w].copy()
            start += w
        reads: dict[str, int] = {}
        for query_id, users, positions, state, values, t in running:
            keep = np.flatnonzero(scale > 0.0)
            scaled = values[keep] * scale[keep, None]
            new_rows = users.rule.admit(state.take(keep), scaled, t)
            users.put(_take(ids, keep), positions[keep], new_rows)
            sums[query_id] = scaled.sum(axis=0)
            reads[query_id] = int(positions.size)
        tally = np.bincount(status.astype(np.int64), minlength=len(STATUS_NAMES))
        counts = {name: int(tally[i]) for i, name in enumerate(STATUS_NAMES)}
        counts["nonfinite"] = int(np.count_nonzero(nonfinite))
        if reads:  # a window with a running query: the prepaid rows its kernels read, all queries
            counts["prepaid_rows_read"] = sum(reads.values())
        return WindowCharge(window_id=window_id, sums=sums, counts=counts, state_rows_read=reads)


def running_rule_of(query: Any) -> tuple[str, PrepaidRule]:
    """``(strategy name, prepaid rule)`` of a running query: its registered ``strategy``
    (:data:`renyi_stream.stream.continual.prepaid.DEFAULT_RUNNING_STRATEGY` for a query object without one)
    over its declared ``horizon`` (:data:`~renyi_stream.stream.continual.prepaid.DEFAULT_PREPAID_HORIZON`
    without one, ``"tail"`` for the infinite tail)."""
    strategy = getattr(query, "strategy", None) or DEFAULT_RUNNING_STRATEGY
    horizon = getattr(query, "horizon", None) or DEFAULT_PREPAID_HORIZON
    return strategy, running_rule(strategy, horizon)


def refuse_oversized_running(plan: QueryPlan, to_release: Sequence[int]) -> None:
    """ValueError, before anything is built or charged, when a running query active in one of the
    windows ``to_release``, alone or with those active with it, is above the bounds on what a job
    keeps (:func:`renyi_stream.stream.continual.prepaid.refuse_running_too_big`): a catalogue written by an
    older version or by hand is refused at launch as a registration would have been."""
    seen: set[tuple[str, ...]] = set()
    for window in sorted({int(w) for w in to_release}):
        active = [e.query for e in plan.running if e.active_in(window)]
        ids = tuple(q.query_id for q in active)
        if active and ids not in seen:
            seen.add(ids)
            refuse_running_too_big(active, where=f"in window {window}")


def refuse_running_gaps(plan: QueryPlan, next_windows: Mapping[str, int], to_release: Sequence[int]) -> None:
    """ValueError, before anything is charged, when a run releasing ``to_release`` would skip a
    running query's window, go back to one, or release one past its declared schedule: a running
    total is released for every window from its first, once each, in order (invariants 3 and 5
    (public-schedule, release-once, docs/architecture.md)). ``next_windows`` maps a running query
    to the window its stored release state releases next (absent: none stored, its first window).
    Every job checks its launch with this one rule, which first refuses a running query too big
    for a job to keep (:func:`refuse_oversized_running`)."""
    refuse_oversized_running(plan, to_release)
    pending = set(int(w) for w in to_release)
    for entry in plan.running:
        next_window = int(next_windows.get(entry.query_id, entry.first_window))
        mine = [w for w in sorted(pending) if entry.active_in(w)]
        if not mine:
            continue
        needed = [w for w in range(next_window, max(mine) + 1) if entry.active_in(w)]
        skipped = [w for w in needed if w not in pending]
        early = [w for w in mine if w < next_window]
        if skipped or early:
            raise ValueError(
                f"running query {entry.query_id!r} must be released window by window from window {next_window}; "
                f"this run would {'skip window ' + str(skipped[0]) if skipped else 'go back to window ' + str(early[0])}. "
                "Run the missing days in order (or set --start to the first unreleased day)"
            )
        horizon = running_rule_of(entry.query)[1].horizon
        if horizon is not None and max(mine) >= entry.first_window + horizon:
            raise ValueError(
                f"running query {entry.query_id!r} was declared for {horizon} windows (windows {entry.first_window} "
                f"to {entry.first_window + horizon - 1}); this run would release window {max(mine)}, past its "
                "schedule, which nobody was charged for. Retire it (`renyi-stream query retire ID --from WINDOW`) "
                "and register a new running query (a longer --horizon, or --horizon tail)")


def running_strategy(query: Any) -> Strategy:
    """The strategy object of a running query (its prepaid rule's: a BLT carries its parameters)."""
    return running_rule_of(query)[1].strategy


def _refuse_a_strategy_mismatch(entry: PlannedQuery, state: PrepaidUsers) -> None:
    """A stored state made under one strategy or horizon cannot continue under another: its rows
    are the buffers of another ``C``, and the charges already made paid for another schedule."""
    strategy, rule = running_rule_of(entry.query)
    expected = rule_meta(rule, strategy=strategy, dim=entry.query.dim, start_window=entry.first_window)
    if state.meta != expected:
        raise ValueError(
            f"running query {entry.query_id!r} is registered with strategy {strategy!r} {rule.strategy.spec()} over "
            f"horizon {expected['horizon']} from window {entry.first_window}, but its stored running state (ledger "
            f"database) was made with {state.strategy!r} {state.rule.strategy.spec()} over horizon "
            f"{state.meta['horizon']} from window {state.start_window}: refusing to continue it. Use the ledger and "
            "release store that belong together, or register a new query id")


def _take(ids: pa.Array, positions: np.ndarray) -> pa.Array:
    return ids.take(pa.array(positions, type=pa.int64()))


#: The kinds of a shard's snapshot parts: ``("ledger", table)`` (:meth:`renyi_stream.stream.ledger.Ledger.to_arrow`,
#: at most one per shard) and ``("running", (query_id, table))``
#: (:meth:`renyi_stream.stream.engine.running.PrepaidUsers.to_arrow`, one per running query: the per-user
#: prepaid rows). The filters keep a shard's state in their keyed state in this form and receive a
#: previous run's state in it. A query's release state is not per shard
#: (:class:`renyi_stream.stream.engine.running.RunningRelease`).
LEDGER_PART, RUNNING_PART = "ledger", "running"
#: A ledger delta part, ``("ledger_delta", (window, table))``: the :meth:`renyi_stream.stream.ledger.Ledger.to_arrow`
#: rows, whole, of the users charged in ``window`` (:meth:`ShardSnapshots.after_window`). A shard's
#: ledger is its ``"ledger"`` part (the last full snapshot) with each delta's rows over it in window order.
LEDGER_DELTA = "ledger_delta"
#: A running query's delta part, ``("running_delta", (window, query_id, table))``: the
#: :meth:`renyi_stream.stream.engine.running.PrepaidUsers.to_arrow` rows, whole, of the users charged in ``window``
#: (those with a prepaid row), written beside that window's ledger delta. A running query's prepaid
#: rows are its ``"running"`` part of the last full snapshot (none: no user yet) with each delta's
#: rows over it in window order, as the ledger's.
RUNNING_DELTA = "running_delta"


@dataclass(frozen=True)
class ShardSnapshots:
    """How a shard's :class:`ShardState` is rebuilt from snapshot parts and written back to them:
    the one restore and snapshot of every job's filter (batch, distributed, streaming).

    ``budget``, ``id_type`` and ``tracker_step`` make the ledger of a shard that has no snapshot
    yet (a new ledger, or a shard none of whose users was seen); ``running_meta`` holds, per
    running query, the metadata of its per-user snapshot (:func:`renyi_stream.stream.engine.running.rule_meta`),
    so that a shard none of whose users has a row still checks the stored strategy and horizon
    against the registered query. Beam-free: the DoFns keep the parts in their state and call this.

    Incremental snapshots (:meth:`after_window`): with ``compact_every`` ``K > 1`` a window's parts
    are a delta, the ledger rows and each running query's prepaid rows of the users charged in it
    only, and every ``K``-th window (or when the caller asks) a full snapshot that replaces the full
    one and the deltas before it, so a shard is at most one full snapshot and ``K - 1`` windows of
    deltas. ``K = 1`` (the default) snapshots whole every window. :meth:`restore` gives the same
    shard either way.
    """

    plan: QueryPlan
    budget: float
    id_type: str
    tracker_step: float
    running_meta: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    compact_every: int = 1

    def __post_init__(self) -> None:
        if int(self.compact_every) != self.compact_every or self.compact_every < 1:
            raise ValueError(f"compact_every must be an integer >= 1 (windows between full snapshots), "
                             f"got compact_every={self.compact_every!r}")

    def restore(self, parts: Iterable[tuple[str, Any]]) -> ShardState:
        """The shard's state from its snapshot parts (a fresh ledger when there is none).

        The ledger snapshot is checked as :meth:`renyi_stream.stream.ledger.Ledger.from_arrow` checks it.
        ValueError naming the problem when the parts hold two ledgers (a shard's users split in
        two pieces would restart the second piece from zero budget: invariant 1
        (ledger-never-window-scoped, docs/architecture.md)), two histories of one running query,
        or a part of another kind. Delta parts (:data:`LEDGER_DELTA`, :data:`RUNNING_DELTA`) go over
        the ledger part and the query's running part in window order, whatever order the parts come
        in (:func:`merge_deltas`); a running delta of another strategy or schedule than its query's
        full part is refused."""
        ledgers: list[pa.Table] = []
        deltas: list[tuple[int, pa.Table]] = []
        full_running: dict[str, pa.Table] = {}
        running_deltas: dict[str, list[tuple[int, pa.Table]]] = {}
        for kind, payload in parts:
            if kind == LEDGER_PART:
                ledgers.append(payload)
            elif kind == LEDGER_DELTA:
                window, table = payload
                deltas.append((int(window), table))
            elif kind == RUNNING_PART:
                query_id, table = payload
                if query_id in full_running:
                    raise ValueError(f"a shard's snapshot parts hold two histories of running query {query_id!r}")
                full_running[query_id] = table
            elif kind == RUNNING_DELTA:
                window, query_id, table = payload
                running_deltas.setdefault(query_id, []).append((int(window), table))
            else:
                raise ValueError(f"snapshot part kind must be {LEDGER_PART!r}, {LEDGER_DELTA!r}, {RUNNING_PART!r} or "
                                 f"{RUNNING_DELTA!r}, got kind={kind!r}")
        running: dict[str, PrepaidUsers] = {}
        for query_id in sorted(set(full_running) | set(running_deltas)):
            table = full_running.get(query_id)
            if query_id in running_deltas:
                table = merge_deltas(running_base(table, running_deltas[query_id], query_id),
                                     running_deltas[query_id])
            running[query_id] = PrepaidUsers.from_arrow(table)
        if len(ledgers) > 1:
            raise ValueError(f"a shard's snapshot parts must hold at most one ledger, got {len(ledgers)}: its users "
                             "would be split across ledgers and some restarted from zero budget")
        if deltas:
            base = ledgers[0] if ledgers else Ledger(budget=self.budget, id_type=self.id_type,
                                                     tracker_step=self.tracker_step).to_arrow()
            ledgers = [merge_deltas(base, deltas)]
        ledger = (Ledger.from_arrow(ledgers[0]) if ledgers
                  else Ledger(budget=self.budget, id_type=self.id_type, tracker_step=self.tracker_step))
        for query_id, meta in self.running_meta.items():
            if query_id not in running:
                running[query_id] = PrepaidUsers.empty(meta, self.id_type)
        return ShardState(self.plan, ledger, running)

    @staticmethod
    def snapshot(state: ShardState) -> list[tuple[str, Any]]:
        """``state`` as snapshot parts: the ledger first, then each running query's per-user
        prepaid rows by query id. ``restore(snapshot(state))`` is a shard equal to ``state``."""
        return [(LEDGER_PART, state.ledger.to_arrow()),
                *((RUNNING_PART, (query_id, running.to_arrow())) for query_id, running in sorted(state.running.items()))]

    def after_window(self, state: ShardState, *, window: int, charged: Any,
                     held: Iterable[tuple[str, Any]] | None = None, deltas_held: int | None = None,
                     full: bool = False) -> tuple[list[tuple[str, Any]], bool]:
        """The parts to keep after ``state`` charged window ``window``, and whether they replace
        the parts held (those it was restored from, ``held``, of which ``deltas_held`` are ledger
        deltas, one per window since the full snapshot: give one of the two, the count when the
        caller keeps it rather than the parts): ``(snapshot(state), True)``, a full snapshot, when
        ``full`` is asked or ``compact_every - 1`` windows of deltas are already held; otherwise
        ``([(LEDGER_DELTA, (window, rows)), (RUNNING_DELTA, (window, query_id, rows)), ...], False)``,
        to be kept beside the parts held: the ledger rows and each running query's prepaid rows
        (by query id) of the users ``charged`` (their ids, e.g. the window's ``user_id`` column),
        so the parts written per window grow with the users charged in it, not with the shard.
        ``restore(held + delta)`` is the shard ``restore(snapshot(state))`` is, provided ``charged``
        holds every user whose ledger or prepaid row the window changed (the users of its rows:
        :meth:`ShardState.charge_window` reads and writes no one else's)."""
        if (held is None) == (deltas_held is None):
            raise ValueError("after_window takes exactly one of held (the parts) and deltas_held (their count of "
                             f"deltas), got held={'None' if held is None else 'parts'}, deltas_held={deltas_held!r}")
        deltas = held_deltas(held) if held is not None else int(deltas_held)
        if deltas < 0:
            raise ValueError(f"deltas_held must be >= 0, got deltas_held={deltas_held!r}")
        if full or deltas + 1 >= self.compact_every:
            return self.snapshot(state), True
        return [(LEDGER_DELTA, (int(window), state.ledger.to_arrow(users=charged))),
                *((RUNNING_DELTA, (int(window), query_id, running.to_arrow(users=charged)))
                  for query_id, running in sorted(state.running.items()))], False


def held_deltas(parts: Iterable[tuple[str, Any]]) -> int:
    """How many of a shard's snapshot parts are ledger deltas (:data:`LEDGER_DELTA`): the windows
    since its last full snapshot, which :meth:`ShardSnapshots.after_window` compacts on."""
    return sum(1 for kind, _ in parts if kind == LEDGER_DELTA)


def running_base(full: pa.Table | None, deltas: Sequence[tuple[int, pa.Table]], query_id: str) -> pa.Table:
    """The table a running query's prepaid deltas go over: its full part ``full``, or, when the full
    snapshot held none (no user of the shard had a row yet), no row with the deltas' own metadata.
    ValueError, naming the query, when a delta's metadata (the query's strategy, schedule and id
    type, :func:`renyi_stream.stream.engine.running.rule_meta`) is not the full part's, or the deltas disagree:
    prepaid rows of another ``C`` would charge its users for another schedule."""
    metas = {_running_meta(t) for _, t in deltas} | ({_running_meta(full)} if full is not None else set())
    if len(metas) > 1:
        raise ValueError(f"a shard's prepaid parts of running query {query_id!r} disagree on its strategy or schedule: "
                         "they are not one query's")
    return full if full is not None else deltas[0][1].slice(0, 0)


def _running_meta(table: pa.Table) -> tuple:
    meta = table.schema.metadata or {}
    return tuple((key, meta.get(key.encode())) for key in PREPAID_META_KEYS)


def merge_deltas(base: pa.Table, deltas: Iterable[tuple[int, pa.Table]]) -> pa.Table:
    """A snapshot table keyed by ``user_id`` (a ledger, :meth:`renyi_stream.stream.ledger.Ledger.to_arrow`, or a
    running query's prepaid rows, :meth:`renyi_stream.stream.engine.running.PrepaidUsers.to_arrow`; sorted by
    user id, ``base``'s metadata) from the full ``base`` and the ``(window, rows)`` deltas over it:
    per user, the row of the latest window that holds one, else ``base``'s. Vectorised: one
    concatenation and one hash aggregation, no loop over users. ValueError when two deltas are of
    one window with different rows (two branches of one shard)."""
    ordered = sorted(((int(w), t) for w, t in deltas), key=lambda item: item[0])
    windows = [w for w, _ in ordered]
    if len(set(windows)) != len(windows):
        seen = sorted({w for w in windows if windows.count(w) > 1})
        tables = {w: [t for v, t in ordered if v == w] for w in seen}
        if any(not all(t.equals(ts[0]) for t in ts) for ts in tables.values()):
            raise ValueError(f"a shard's snapshot parts hold different deltas of window(s) {seen[:5]}: two branches "
                             "of one shard")
    schema = base.schema.remove_metadata()
    parts = [base.replace_schema_metadata(None)] + [t.replace_schema_metadata(None).cast(schema) for _, t in ordered]
    table = pa.concat_tables(parts)
    table = table.append_column("_order", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    last = table.group_by(USER_ID).aggregate([("_order", "max")]).column("_order_max")
    merged = table.take(last).drop_columns(["_order"]).sort_by(USER_ID)
    return merged.replace_schema_metadata(base.schema.metadata)


@dataclass(frozen=True)
class ShardBooks:
    """Cumulative row books of one shard's filter (invariant 7: rows are counted, not lost).
    Sensitive: exact counts, curator only (invariant 4).

    Every row that reaches the shard is ``received``; from then on it is exactly one of: dead
    (``late``, ``out_of_range``, ``duplicate``), charged in a window (``admitted``, ``clipped``,
    ``dropped``), or still buffered for a window not yet charged. :meth:`balances` checks that
    identity against the rows actually found in the buffer, which a lost or double-counted row
    breaks.
    """

    received: int = 0
    late: int = 0
    out_of_range: int = 0
    duplicate: int = 0
    admitted: int = 0
    clipped: int = 0
    dropped: int = 0

    def plus(self, **counts: int) -> "ShardBooks":
        """These books with ``counts`` added (names of this record's fields; others ignored)."""
        names = {f.name for f in fields(self)}
        return replace(self, **{k: getattr(self, k) + int(v) for k, v in counts.items() if k in names})

    @property
    def held(self) -> int:
        """Rows received and neither dead nor charged: what the buffer must hold."""
        return self.received - sum(getattr(self, f.name) for f in fields(self) if f.name != "received")

    def balances(self, buffered: int) -> bool:
        """Whether ``buffered``, the rows counted in the shard's buffer, is exactly :attr:`held`."""
        return self.held == int(buffered)

    def since(self, earlier: "ShardBooks") -> dict[str, int]:
        """Each count's increase from ``earlier`` to these books."""
        return {f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
