"""The shared per-user ledger, as seen by one training run: arrays aligned with the training rows.

A training run charges every user at every gradient step (and at every private accuracy
query), so it cannot afford to look users up by id each time. :class:`TrainingLedger` takes a
snapshot of the users' state from a :class:`renyi_stream.stream.ledger.Ledger` once (``used`` budget and
personal tracker, zCDP units), keeps it in arrays in the order of the training rows (NumPy, or
CuPy on a GPU), charges them with the ledger's own filter arithmetic
(:func:`renyi_stream.stream.ledger.individual_filter`, :func:`renyi_stream.stream.accounting.gaussian.gaussian_charge`,
:func:`renyi_stream.stream.accounting.odometers.tracker_update`), and at the end merges them back into a new
``Ledger`` through its checked snapshot format (``to_arrow`` / ``from_arrow``).

Same rules as the streaming ledger, so one budget ``kappa`` covers streaming and training:

* each charge is the Gaussian mechanism's individual zCDP cost ``||v_i||^2 / (2 s^2)``,
  rounded up, for a contribution ``v_i`` released with noise std ``s`` per coordinate
  (Feldman & Zrnic, Section 4.2; Proposition 5.2's proof for gradient steps);
* a user's used budget never passes ``kappa * (1 - 1e-9)`` (``renyi_stream.stream.ledger.BUDGET_SAFETY``):
  under ``clip`` a contribution that would pass it is scaled down to what is left (the clipping
  step of Algorithm 7), under ``drop`` it is left out (Algorithm 3);
* the decision for user ``i`` reads only user ``i``'s state and contribution.

The run must hold the ledger exclusively (``renyi_stream.pipelines.curator.store.RunLock``) from the snapshot
to the write-back, as the daily job does.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.accounting.odometers import advance_trackers, tracker_step_for
from renyi_stream.stream.ledger import BUDGET_SAFETY, Ledger, Policy, individual_filter
from renyi_stream.stream.xp import array_module, host_all, maybe_any, to_host


def ledger_cap(budget: float) -> float:
    """The largest used budget the ledger allows, ``kappa * (1 - BUDGET_SAFETY)`` rounded down
    (the same number ``renyi_stream.stream.ledger.Ledger`` compares against)."""
    return float(np.nextafter(budget * (1.0 - BUDGET_SAFETY), 0.0))


class TrainingLedger:
    """Per-user used budget and personal tracker of the users behind the training rows.

    Build it with :meth:`fresh` (no earlier charges) or :meth:`from_ledger` (the shared
    ledger, after streaming charges). Arrays live on the device of ``xp``.

    Attributes:
        budget: ``kappa``, the per-user zCDP budget of the whole ledger.
        cap: the largest used budget the filter allows (:func:`ledger_cap`).
        tracker_step: ``Delta`` of the personal tracker (Algorithm 5), zCDP.
        used: ``(n,)`` float64, zCDP used by each row's user (streaming + this run).
    """

    def __init__(self, *, used: Any, segment: Any, tracker: Any, budget: float, tracker_step: float,
                 user_ids: np.ndarray | pa.Array | None = None, base: Ledger | None = None) -> None:
        self.budget = check.positive("budget", budget)
        self.tracker_step = check.positive("tracker_step", tracker_step)
        self.cap = ledger_cap(self.budget)
        self.used = used
        self._segment = segment
        self._tracker = tracker
        self._ids = user_ids
        self._base = base

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def fresh(cls, n: int, *, budget: float, tracker_step: float | None = None, xp: Any = np) -> "TrainingLedger":
        """``n`` users who have spent nothing yet (a new ledger; experiments)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got n={n!r}")
        budget = check.positive("budget", budget)
        step = tracker_step_for(budget) if tracker_step is None else check.positive("tracker_step", tracker_step)
        return cls(used=xp.zeros(n), segment=xp.zeros(n), tracker=xp.full(n, step),
                   budget=budget, tracker_step=step)

    @classmethod
    def from_ledger(cls, ledger: Ledger, user_ids: Sequence[Any] | np.ndarray | pa.Array,
                    *, xp: Any = np) -> "TrainingLedger":
        """The state of ``user_ids`` (one training row each, distinct) in ``ledger``.

        Users the ledger has never seen start at zero, with the tracker at ``Delta``
        (Algorithm 5's ``O_1``). Raises ``ValueError`` for repeated ids or ids of the wrong type.
        """
        ids = _as_id_array(user_ids, ledger.id_type)  # empty: a run over nobody, charged to nobody
        if pc.count_distinct(ids).as_py() != len(ids):
            counts = pc.value_counts(ids)
            tally = counts.field("counts").to_numpy()
            repeated = counts.field("values")[int(np.argmax(tally))].as_py()
            raise ValueError(
                "user_ids must be distinct: one training row per user (aggregate per user first), "
                f"got user id {repeated!r} more than once")
        snapshot = ledger.to_arrow()
        known = snapshot.column("user_id").combine_chunks()
        where = pc.index_in(ids.cast(known.type), value_set=known)
        found = where.is_valid().to_numpy(zero_copy_only=False)
        pos = where.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)

        def take(name: str, default: float) -> np.ndarray:
            col = snapshot.column(name).to_numpy()
            if col.size == 0:
                return np.full(len(ids), default)
            return np.where(found, col[pos], default)

        return cls(
            used=xp.asarray(take("used", 0.0)), segment=xp.asarray(take("tracker_segment", 0.0)),
            tracker=xp.asarray(take("tracker_bound", ledger.tracker_step)),
            budget=ledger.budget, tracker_step=ledger.tracker_step, user_ids=ids, base=ledger,
        )

    # -- reading ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.used.shape[0])

    def remaining(self, rows: slice | None = None) -> Any:
        """zCDP each row's user may still spend (``cap - used``, at least 0)."""
        xp = array_module(self.used)
        used = self.used if rows is None else self.used[rows]
        return xp.maximum(self.cap - used, 0.0)

    def personal_odometer(self) -> np.ndarray:
        """Each row's user's personal zCDP bound ``min(O^(i), kappa)`` (Corollary 4.11); 0 for a
        user never charged. Curator-side: user ``i``'s value may be shown to user ``i`` only."""
        used, tracker = to_host(self.used), to_host(self._tracker)
        return np.where(used > 0, np.minimum(tracker, self.budget), 0.0)

    # -- charging ---------------------------------------------------------------------------------

    def charge(self, contributions: Any, *, noise_std: float, policy: Policy | str = Policy.CLIP,
               rows: slice | None = None, validate: bool = True) -> Any:
        """Filter and charge one Gaussian release's contributions, one per row's user.

        Args:
            contributions: ``(m,)`` non-negative L2 norms ``||v_i||`` of what each row contributes
                (in the units of ``noise_std``); ``m`` is the number of rows in ``rows``.
            noise_std: ``s``, the release's Gaussian noise std per coordinate (> 0).
            policy: ``clip`` (Algorithm 7's clip) or ``drop`` (Algorithm 3).
            rows: which training rows (default all).
            validate: check that every contribution is finite and ``>= 0`` and raise
                ``ValueError`` if not (on a device: one explicit transfer of one bool). With
                ``False`` (for norms computed by the caller, as a gradient step's) nothing is
                checked and nothing crosses to the host; a non-finite contribution is then
                dropped under either policy (its charge is not finite, so it never fits and
                clipping scales it to 0): its user is charged nothing and its factor is 0.

        Returns ``(m,)`` float64 factors in ``[0, 1]`` to apply to each contribution: 1 admitted,
        below 1 clipped to the user's remaining budget, 0 dropped. The users are charged
        ``(factor * ||v_i||)^2 / (2 s^2)`` at most, rounded up; ``used <= cap`` always. Apart
        from the check, pure array arithmetic on the ledger's device: no host round trip.
        """
        noise_std = check.positive("noise_std", noise_std)
        xp = array_module(self.used, contributions)
        c = xp.asarray(contributions, dtype=xp.float64)
        if c.ndim != 1:
            raise ValueError(f"contributions must be 1-d (one norm per row), got shape={c.shape}")
        sel = slice(None) if rows is None else rows
        used = self.used[sel]
        if c.shape[0] != used.shape[0]:
            raise ValueError(f"contributions must have one value per row, got {c.shape[0]} for {used.shape[0]} rows")
        if validate and not host_all(xp.isfinite(c) & (c >= 0)):
            raise ValueError("contributions must be finite norms >= 0")
        charge = gaussian_charge(contributions=c[:, None], noise_std=noise_std)
        decision = individual_filter(used, charge, cap=self.cap, policy=policy)
        self.used[sel] = decision.new_used
        charged = decision.charge > 0
        if maybe_any(charged):
            # The filter's recorded charges are finite and >= 0 (a charge that is not finite never
            # fits, and a clipped one is the finite remaining budget), so the unchecked update
            # applies; rows charged nothing keep their tracker.
            segment, tracker = self._segment[sel], self._tracker[sel]
            new_segment, new_tracker = advance_trackers(segment, tracker, decision.charge, step=self.tracker_step)
            self._segment[sel] = xp.where(charged, new_segment, segment)
            self._tracker[sel] = xp.where(charged, new_tracker, tracker)
        return decision.scale

    # -- write-back -------------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """The training users' state as a ``Ledger.to_arrow`` table (needs ``user_ids``)."""
        if self._ids is None:
            raise ValueError("this TrainingLedger was made with fresh(): it has no user ids to write back")
        ids = self._ids
        id_array = ids if isinstance(ids, pa.Array) else pa.array(np.asarray(ids, dtype=np.int64))
        return pa.table({
            "user_id": id_array,
            "used": pa.array(to_host(self.used)),
            "tracker_segment": pa.array(to_host(self._segment)),
            "tracker_bound": pa.array(to_host(self._tracker)),
        })

    def merged_ledger(self) -> Ledger:
        """A new :class:`Ledger`: the base ledger with the training users' rows replaced (or
        added). Goes through ``Ledger.from_arrow``, which refuses any used budget outside
        ``[0, kappa]``, repeated ids and trackers below the used budget."""
        if self._base is None:
            raise ValueError("this TrainingLedger was made with fresh(): it has no base ledger to merge into")
        base = self._base.to_arrow()
        mine = self.to_arrow()
        keep = pc.invert(pc.is_in(base.column("user_id"), value_set=mine.column("user_id")))
        rest = base.filter(keep)
        mine = mine.cast(rest.schema.remove_metadata())
        merged = pa.concat_tables([rest.replace_schema_metadata(None), mine])
        return Ledger.from_arrow(merged.replace_schema_metadata(base.schema.metadata))


def _as_id_array(user_ids: Any, id_type: str) -> pa.Array:
    if isinstance(user_ids, pa.ChunkedArray):
        user_ids = user_ids.combine_chunks()
    arr = user_ids if isinstance(user_ids, pa.Array) else pa.array(
        user_ids.tolist() if isinstance(user_ids, np.ndarray) else list(user_ids))
    if arr.null_count:
        raise ValueError("user_ids must not contain nulls")
    if id_type == "int64":
        if not pa.types.is_integer(arr.type):
            raise ValueError(f"user_ids must be integers for an int64 ledger, got type {arr.type}")
        return arr.cast(pa.int64())
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise ValueError(f"user_ids must be strings for a string ledger, got type {arr.type}")
    return arr.cast(pa.string())
