"""Running totals in the engine: per-user prepaid state on a shard, and the query's one release state.

The mechanism is :mod:`renyi_stream.stream.continual.prepaid` (docs/running_totals.md): a running query
releases ``y_t = (C a)_t + z_t`` with ``a_t`` the sum of the contributions admitted at ``t``, and
each admitted contribution is charged its whole future cost at admission. Two pieces of state:

* :class:`PrepaidUsers`, per shard and running query: one :class:`~renyi_stream.stream.continual.prepaid.UserState`
  row per user ever admitted (``width x d`` numbers and the window of the last admission), keyed
  like the ledger (:mod:`renyi_stream.stream.id_index`). A window reads and writes only the rows of its own
  users (vectorised gathers and scatters, no loop per user): users without a row that window are
  not touched, the release state carries their past.
* :class:`RunningRelease`, one per running query (not per shard): the
  :class:`~renyi_stream.stream.continual.prepaid.ReleaseState`, advanced once per window of the schedule, in
  window order, with or without rows (invariant 3 (public-schedule, docs/architecture.md)). Given
  every shard's ``a_t`` summed it returns ``(C a)_t``; the caller adds the keyed noise
  (:func:`noisy_release`). Sensitive until noised (invariant 4 (nothing-pre-noise-leaves)).

Both persist as Arrow tables with versioned metadata (the strategy's spec, the declared horizon,
``dim``, the first window and, for the release, the next window), so any store can keep them: the
DuckDB curator store today, a distributed manifest or a streaming snapshot part later
(:data:`renyi_stream.stream.engine.shard_state.RUNNING_PART` carries a shard's :class:`PrepaidUsers`). A
restored state that is inconsistent fails loudly: a lost or altered row would under-charge its
user, a privacy failure. Snapshots of the pre-prepaid history format
(``renyi_stream.running_version`` 1, :class:`renyi_stream.stream.continual.running.RunningState`) are refused
with the way to migrate (:data:`MIGRATION`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.continual.prepaid import TAIL, PrepaidRule, ReleaseState, UserState, parse_horizon, running_rule
from renyi_stream.stream.id_index import Int64Index, StringCodes
from renyi_stream.stream.noise import NoiseBinding, gaussian_noise

#: ``renyi_stream.running_version`` of the prepaid snapshots (1 was the per-window history format).
RUNNING_VERSION = 2
VERSION_KEY = "renyi_stream.running_version"
#: How to leave a store that holds square-root histories (version 1) behind.
MIGRATION = ("running totals are now released under prepaid admission (docs/running_totals.md), and a history "
             "charged per window cannot continue as a prepaid query. To migrate: retire the query from the first "
             "unreleased day (`renyi-stream query retire --store STORE --id ID --from DAY`) and register a new "
             "running query under a new id from that day (`renyi-stream query add --store STORE --id NEW_ID "
             "--columns ... --kind running --from DAY`); the windows already released stay public")


class OldRunningFormatError(ValueError):
    """A snapshot of the history format (version 1): refused with :data:`MIGRATION`."""


def _meta(table: pa.Table) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}


def _check_version(meta: Mapping[str, str], what: str) -> None:
    version = meta.get(VERSION_KEY)
    if version == "1":
        raise OldRunningFormatError(f"{what} holds the old per-window history format (running version 1): {MIGRATION}")
    if version != str(RUNNING_VERSION):
        raise ValueError(f"{what} version must be {RUNNING_VERSION}, got {version!r}")


def rule_meta(rule: PrepaidRule, *, strategy: str, dim: int, start_window: int) -> dict[str, str]:
    """The public description of a running query's prepaid state (every snapshot carries it):
    the strategy's name and spec (``theta``, ``omega`` for a BLT), the declared horizon (or
    ``"tail"``), ``width``, ``dim`` and the first window."""
    return {VERSION_KEY: str(RUNNING_VERSION), "rule": "prepaid", "strategy_name": strategy,
            "strategy": json.dumps(rule.strategy.spec(), sort_keys=True),
            "horizon": TAIL if rule.horizon is None else str(rule.horizon), "width": str(rule.width),
            "dim": str(int(dim)), "start_window": str(int(start_window))}


#: The schema metadata keys that say which query a prepaid table is of (:func:`rule_meta`'s and the
#: id type): two tables of one running query agree on them.
PREPAID_META_KEYS = (VERSION_KEY, "rule", "strategy_name", "strategy", "horizon", "width", "dim", "start_window",
                     "id_type")


def _rule_from_meta(meta: Mapping[str, str], what: str) -> tuple[PrepaidRule, str, int, int]:
    try:
        name, horizon = meta["strategy_name"], parse_horizon(meta["horizon"])
        dim, start = int(meta["dim"]), int(meta["start_window"])
        rule = running_rule(name, horizon)
        spec = json.loads(meta["strategy"])
        width = int(meta["width"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} metadata is incomplete or malformed: {exc!r}") from exc
    if spec != rule.strategy.spec() or width != rule.width or dim < 1:
        raise ValueError(f"{what} was made with strategy {spec} (width {width}) but {name!r} over horizon "
                         f"{meta['horizon']} is {rule.strategy.spec()} (width {rule.width}): refusing it")
    return rule, name, dim, start


# --------------------------------------------------------------------------- per-user state


class PrepaidUsers:
    """Per-user prepaid state of one running query on one shard (module docstring).

    Args:
        rule: the query's prepaid rule (:func:`renyi_stream.stream.continual.prepaid.running_rule`).
        strategy: its registered strategy name (recorded).
        dim: ``d``, numbers per user per window.
        start_window: the query's first window (offset 0).
        id_type: ``"int64"`` or ``"string"``, as the ledger's.
    """

    def __init__(self, rule: PrepaidRule, *, strategy: str, dim: int, start_window: int,
                 id_type: str = "int64") -> None:
        if id_type not in ("int64", "string"):
            raise ValueError(f"id_type must be 'int64' or 'string', got id_type={id_type!r}")
        self.rule = rule
        self.strategy = strategy
        self.dim = int(dim)
        self.start_window = int(start_window)
        self.id_type = id_type
        self._index = Int64Index() if id_type == "int64" else None
        self._codes = StringCodes() if id_type == "string" else None
        self._values = np.zeros((0, rule.width, self.dim))
        self._last = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        """Users with a row (ever admitted)."""
        return len(self._index) if self._index is not None else len(self._codes)

    @property
    def meta(self) -> dict[str, str]:
        return rule_meta(self.rule, strategy=self.strategy, dim=self.dim, start_window=self.start_window)

    def _ids(self, ids: Any) -> Any:
        if self.id_type == "int64":
            if isinstance(ids, (pa.Array, pa.ChunkedArray)):
                ids = ids.to_numpy(zero_copy_only=False)
            return np.asarray(ids, dtype=np.int64)
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        return ids if isinstance(ids, pa.Array) else pa.array(list(ids), type=pa.large_string())

    def positions(self, ids: Any) -> np.ndarray:
        """Each id's row, ``-1`` for a user never admitted. Reads nothing else."""
        ids = self._ids(ids)
        if self._index is not None:
            return self._index.lookup(ids)
        return self._codes.codes(ids, add_missing=False)

    def gather(self, positions: np.ndarray) -> UserState:
        """The rows at ``positions`` (``-1``: a fresh row, never admitted), as offsets of the
        query's schedule. One vectorised gather."""
        known = positions >= 0
        safe = np.where(known, positions, 0)
        if self._last.size == 0:
            return self.rule.new_users(positions.size, self.dim)
        values = np.where(known[:, None, None], self._values[safe], 0.0)
        last = np.where(known, self._last[safe], -1)
        return UserState(values=values, last=last)

    def put(self, ids: Any, positions: np.ndarray, rows: UserState) -> None:
        """Write ``rows`` (from :meth:`PrepaidRule.admit`) for ``ids`` at ``positions`` (``-1``:
        a new user, appended). Distinct ids. One vectorised scatter."""
        new = positions < 0
        if new.any():
            ids = self._ids(ids)
            fresh = ids[np.flatnonzero(new)] if self.id_type == "int64" else ids.filter(pa.array(new))
            if self._index is not None:
                added = self._index.add(fresh)
            else:
                added = self._codes.codes(fresh, add_missing=True)
            positions = positions.copy()
            positions[new] = added
            self._grow(len(self))
        self._values[positions] = rows.values
        self._last[positions] = rows.last

    def _grow(self, n: int) -> None:
        if n <= self._last.size:
            return
        capacity = max(n, 2 * self._last.size, 1024)
        values = np.zeros((capacity, self.rule.width, self.dim))
        values[: self._last.size] = self._values
        last = np.full(capacity, -1, dtype=np.int64)
        last[: self._last.size] = self._last
        self._values, self._last = values, last

    def row_floats(self) -> int:
        """Floats stored per user row (``width x d``): the bound the per-user state must keep."""
        return self.rule.width * self.dim

    # -- snapshots ------------------------------------------------------------------------------

    def to_arrow(self, users: Any = None) -> pa.Table:
        """One row per user, sorted by id: ``user_id``, ``last_window`` (absolute window of the
        last admission), ``values`` (``width x d`` float64, row-major); :meth:`meta` in the
        schema metadata. Split it by ``user_id`` shard like the ledger.

        With ``users`` (ids as :meth:`positions` takes them), the rows of those users only: each
        id with a row, once, as in the whole table (same columns, order and metadata); ids
        without a row have none. Its cost grows with ``len(users)``, not with the shard, so the
        rows one window wrote (the users with a row in it,
        :meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`) cost that window's users."""
        if users is None:
            n = len(self)
            if self._index is not None:
                keys = self._index.keys_in_order()
                order = np.argsort(keys, kind="stable")
                ids: Any = pa.array(keys[order], type=pa.int64())
            else:
                values = self._codes.values()
                order = np.asarray(pc.sort_indices(values)) if n else np.zeros(0, dtype=np.int64)
                ids = values.take(pa.array(order, type=pa.int64()))
            rows = order
        else:
            wanted = self._ids(users)
            positions = self.positions(wanted)
            known = positions >= 0
            if self._index is not None:
                keys = np.unique(np.asarray(wanted)[known])  # sorted and distinct, as the whole table
                rows = self._index.lookup(keys)
                ids = pa.array(keys, type=pa.int64())
            else:
                codes = np.unique(positions[known])
                values = self._codes.values().take(pa.array(codes, type=pa.int64()))
                order = np.asarray(pc.sort_indices(values)) if len(codes) else np.zeros(0, dtype=np.int64)
                rows = codes[order]
                ids = values.take(pa.array(order, type=pa.int64()))
        width = self.rule.width * self.dim
        flat = pa.array(self._values[rows].reshape(-1), type=pa.float64())
        table = pa.table({"user_id": ids,
                          "last_window": pa.array(self._last[rows] + self.start_window, type=pa.int64()),
                          "values": pa.FixedSizeListArray.from_arrays(flat, width)})
        return table.replace_schema_metadata({**self.meta, "id_type": self.id_type})

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "PrepaidUsers":
        """Restore :meth:`to_arrow` (or one shard of it), refusing anything inconsistent: the old
        history format (:class:`OldRunningFormatError`), version, metadata that does not rebuild
        the recorded strategy, columns, nulls, repeated users, non-finite values, a last
        admission before the first window or past the declared schedule."""
        what = "running-state snapshot"
        meta = _meta(table)
        _check_version(meta, what)
        rule, name, dim, start = _rule_from_meta(meta, what)
        id_type = meta.get("id_type", "int64")
        state = cls(rule, strategy=name, dim=dim, start_window=start, id_type=id_type)
        missing = [c for c in ("user_id", "last_window", "values") if c not in table.column_names]
        if missing:
            raise ValueError(f"{what} is missing columns {missing}")
        for column in ("user_id", "last_window", "values"):
            if table.column(column).null_count:
                raise ValueError(f"{what} column {column!r} contains nulls")
        n = table.num_rows
        width = rule.width * dim
        values_col = table.column("values").combine_chunks()
        if not pa.types.is_fixed_size_list(values_col.type) or values_col.type.list_size != width:
            raise ValueError(f"{what} column 'values' must be fixed_size_list<double>[{width}], got {values_col.type}")
        values = values_col.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(n, rule.width, dim)
        last = table.column("last_window").to_numpy().astype(np.int64) - start
        if not np.isfinite(values).all():
            raise ValueError(f"{what} has non-finite values")
        if n and (last.min() < 0 or (rule.horizon is not None and last.max() >= rule.horizon)):
            raise ValueError(f"{what} has last admissions outside the schedule [{start}, "
                             f"{'...' if rule.horizon is None else start + rule.horizon})")
        ids = state._ids(table.column("user_id"))
        if n and (np.unique(ids).size if id_type == "int64" else len(pc.unique(ids))) != n:
            raise ValueError(f"{what} repeats a user")
        state.put(ids, np.full(n, -1, dtype=np.int64), UserState(values=values, last=last))
        return state

    @classmethod
    def empty(cls, meta: Mapping[str, str], id_type: str) -> "PrepaidUsers":
        """No user yet, for the query described by ``meta`` (:func:`rule_meta`)."""
        _check_version(meta, "running-state metadata")
        rule, name, dim, start = _rule_from_meta(meta, "running-state metadata")
        return cls(rule, strategy=name, dim=dim, start_window=start, id_type=id_type)


# --------------------------------------------------------------------------- the release


class RunningRelease:
    """A running query's aggregate state: ``(C a)_t`` window by window, in order (module
    docstring). ``release(window_id, a)`` refuses any window but :attr:`next_window`, and (over a
    declared horizon) any window past the schedule, by name."""

    def __init__(self, rule: PrepaidRule, *, query_id: str, strategy: str, dim: int, start_window: int,
                 state: ReleaseState | None = None) -> None:
        self.rule = rule
        self.query_id = query_id
        self.strategy = strategy
        self.dim = int(dim)
        self.start_window = int(start_window)
        self.state = state if state is not None else rule.new_release(self.dim)

    @property
    def next_window(self) -> int:
        return self.start_window + self.state.next

    @property
    def meta(self) -> dict[str, str]:
        return {**rule_meta(self.rule, strategy=self.strategy, dim=self.dim, start_window=self.start_window),
                "query_id": self.query_id, "next_window": str(self.next_window)}

    def release(self, window_id: int, a: Any) -> np.ndarray:
        """``(C a)_t`` (``(rows_at(t), d)``) for ``window_id``, ``a`` the sum of every shard's
        admitted contributions in it (``d`` numbers); the state moves to the next window.
        ValueError for a window out of order or past the declared schedule (before any change)."""
        window_id = int(window_id)
        if window_id != self.next_window:
            raise ValueError(f"running query {self.query_id!r} releases window {self.next_window} next, got window "
                             f"{window_id}: windows are released once each, in order")
        t = window_id - self.start_window
        if self.rule.horizon is not None and t >= self.rule.horizon:
            raise ValueError(f"running query {self.query_id!r} was declared for {self.rule.horizon} windows "
                             f"(windows {self.start_window} to {self.start_window + self.rule.horizon - 1}); window "
                             f"{window_id} is past its schedule and would be unpaid: register a new query")
        total, self.state = self.rule.release(self.state, np.asarray(a, dtype=np.float64).reshape(self.dim))
        return np.asarray(total).reshape(-1, self.dim)

    def to_arrow(self) -> pa.Table:
        """``width`` rows of ``d`` numbers (``values``) with :attr:`meta` in the schema metadata."""
        flat = pa.array(np.asarray(self.state.values, dtype=np.float64).reshape(-1), type=pa.float64())
        table = pa.table({"values": pa.FixedSizeListArray.from_arrays(flat, self.dim)})
        return table.replace_schema_metadata(self.meta)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "RunningRelease":
        """Restore :meth:`to_arrow`, refusing the old format, a malformed table, a next window
        before the first or past the schedule, non-finite values."""
        what = "running release state"
        meta = _meta(table)
        _check_version(meta, what)
        rule, name, dim, start = _rule_from_meta(meta, what)
        try:
            query_id, next_window = meta["query_id"], int(meta["next_window"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{what} metadata is incomplete or malformed: {exc!r}") from exc
        offset = next_window - start
        if offset < 0 or (rule.horizon is not None and offset > rule.horizon):
            raise ValueError(f"{what} of {query_id!r} has next window {next_window} outside its schedule")
        column = table.column("values").combine_chunks() if "values" in table.column_names else None
        if column is None or column.null_count or table.num_rows != rule.width or \
                not pa.types.is_fixed_size_list(column.type) or column.type.list_size != dim:
            raise ValueError(f"{what} of {query_id!r} must hold {rule.width} rows of {dim} numbers")
        values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(rule.width, dim)
        if not np.isfinite(values).all():
            raise ValueError(f"{what} of {query_id!r} has non-finite values")
        return cls(rule, query_id=query_id, strategy=name, dim=dim, start_window=start,
                   state=ReleaseState(values=values, next=offset))


def noisy_release(total: np.ndarray, *, binding: NoiseBinding, query_id: str, window_id: int,
                  noise_std: float) -> np.ndarray:
    """``y_t = (C a)_t + z_t``: the keyed noise of ``(query_id, window_id)`` at ``noise_std``
    (:func:`renyi_stream.stream.noise.gaussian_noise`, ``rows * d`` numbers, row-major), so a re-run releases
    the identical bits (invariant 5 (release-once, docs/architecture.md))."""
    total = np.asarray(total, dtype=np.float64)
    if not np.isfinite(total).all():
        raise ValueError("total must be finite")
    noise = gaussian_noise(binding, query_id=query_id, window_id=int(window_id), dim=total.size, noise_std=noise_std)
    return total + noise.reshape(total.shape)


__all__ = ["MIGRATION", "OldRunningFormatError", "PREPAID_META_KEYS", "PrepaidUsers", "RUNNING_VERSION",
           "RunningRelease", "noisy_release", "rule_meta"]
