"""Personal privacy reports, from the curator's ledger (never from or to the public store).

For each user: the zCDP budget used and remaining (the filter's state), and the personal
odometer of Feldman & Zrnic, Algorithm 5 / Corollary 4.11. The ledger runs, per user, a chain of
Rényi filters of budget ``Delta`` (the ledger's ``tracker_step``): the open filter takes what
fits of each charge, and every filter that halts opens a new one and adds ``Delta`` to the
tracker ``O^(i)`` (``O_1 = Delta``; :func:`renyi_stream.stream.accounting.odometers.tracker_update` feeds a
charge above ``Delta`` as pieces, a post-processing of the one Gaussian release). By
Corollary 4.11, ``min(O^(i), kappa)`` bounds user ``i``'s zCDP loss so far; converted with the
ledger's accounting it gives ``(epsilon_i, delta)``. A user never charged has lost nothing (0).

The odometer is computed from the user's own data, so it may be disclosed to that user alone
(Section 4.4 of the paper): these reports are for the curator and the user, never for the
public release store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from renyi_stream.pipelines.curator.store import CuratorStoreError, ledger_read_only
from renyi_stream.stream.engine.ledger_config import LedgerConfig
from renyi_stream.stream.accounting import epsilon_for_budget
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.private_files import under_private_umask

#: One row per user. ``used_rho``, ``remaining_rho``, ``budget_rho`` (kappa), ``odometer_rho``
#: (``min(O^(i), kappa)``) and ``tracker_step`` (Delta) are zCDP; ``odometer_epsilon`` is the
#: odometer at ``delta`` and ``promised_epsilon`` the promise every user has at that ``delta``,
#: both with the ledger's ``accounting``.
REPORT_SCHEMA = pa.schema([
    ("user_id", pa.string()), ("used_rho", pa.float64()), ("remaining_rho", pa.float64()),
    ("budget_rho", pa.float64()), ("odometer_rho", pa.float64()), ("odometer_epsilon", pa.float64()),
    ("delta", pa.float64()), ("promised_epsilon", pa.float64()), ("accounting", pa.string()),
    ("tracker_step", pa.float64()),
])


@under_private_umask  # what DuckDB spills to <ledger>.tmp/ is 0600 (renyi_stream.pipelines.curator.store.connect_curator)
def load_ledger(path: str | os.PathLike, *, user: Any = None) -> tuple[LedgerConfig, Ledger]:
    """The ledger's parameters and its users (only ``user``, when given), opened read-only.

    Raises :class:`CuratorStoreError` for a missing file, a database that is not a ledger, or
    a ledger that no daily run has used yet; ValueError for a ``user`` that cannot be an id of
    this ledger (a string on an integer-id ledger).
    """
    path = Path(path)
    with ledger_read_only(path) as (db, tables, params):
        if params is None:
            raise CuratorStoreError(f"the ledger {path} has no parameters: no daily run has used it")
        template = params.empty_ledger().to_arrow()
        if "ledger" not in tables:
            return params, Ledger.from_arrow(template)
        sql = "SELECT user_id, used, tracker_segment, tracker_bound FROM ledger"
        args: list[Any] = []
        if user is not None:
            sql += " WHERE user_id = ?"
            args.append(_user_id(user, params.id_type))
        try:
            table = db.execute(sql, args).arrow()
            table = table.read_all() if hasattr(table, "read_all") else table
        except duckdb.Error as exc:
            raise CuratorStoreError(f"the ledger {path} cannot be read: {exc}") from exc
    table = table.cast(template.schema.remove_metadata()).replace_schema_metadata(template.schema.metadata)
    return params, Ledger.from_arrow(table)


def privacy_report(path: str | os.PathLike, *, user: Any = None, delta: float | None = None) -> pa.Table:
    """Reports (:data:`REPORT_SCHEMA`) for ``user``, or for every user when ``user`` is None.

    ``delta`` defaults to the ledger's. A user the ledger has never seen gets an empty table
    (nothing of theirs was ever charged). Reads only the ledger; writes nothing.
    """
    if delta is not None and not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got delta={delta!r}")
    params, ledger = load_ledger(path, user=user)
    delta = params.delta if delta is None else float(delta)
    users = ledger.to_arrow().column("user_id")
    n = len(users)
    odometer = ledger.personal_odometer(users)
    return pa.table({
        "user_id": users.cast(pa.string()),
        "used_rho": ledger.used(users),
        "remaining_rho": ledger.remaining(users),
        "budget_rho": np.full(n, params.rho),
        "odometer_rho": odometer,
        "odometer_epsilon": (ledger.personal_epsilon(users, delta=delta, accounting=params.accounting)
                             if n else np.zeros(0)),
        "delta": np.full(n, delta),
        "promised_epsilon": np.full(n, epsilon_for_budget(rho=params.rho, delta=delta, accounting=params.accounting)),
        "accounting": pa.array([params.accounting] * n, type=pa.string()),
        "tracker_step": np.full(n, params.tracker_step),
    }, schema=REPORT_SCHEMA)


def _user_id(user: Any, id_type: str) -> int | str:
    if id_type == "int64":
        try:
            value = int(str(user).strip())
        except ValueError:
            value = None
        if value is None or not -(2**63) < value < 2**63:
            raise ValueError(f"user must be an integer id for this ledger (its user ids are int64), "
                             f"got user={user!r}")
        return value
    return str(user)


__all__ = ["REPORT_SCHEMA", "load_ledger", "privacy_report"]
