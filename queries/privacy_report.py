"""Personal privacy reports, from the curator's ledger (never from or to the public store).

For each user: the zCDP budget used and remaining (the filter's state), and the personal
odometer of Feldman & Zrnic, Algorithm 5 / Corollary 4.11: the tracker ``R_t(i)`` (used budget
rounded up to the grid of step ``Delta``) is a valid bound on what user ``i`` has lost so far, so
user ``i`` is ``(epsilon_i, delta)``-DP for ``epsilon_i`` converted from ``R_t(i)`` with the ledger's
accounting. The odometer is computed from the user's own data, so it is disclosed to that user
alone (Section 4.3 of the paper: publishing it would leak).
"""

from __future__ import annotations

import os

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.curator_store import CuratorStoreError, LedgerParameters, _parameters_from_meta
from stream.accounting import epsilon_for_budget
from stream.ledger import Ledger

REPORT_SCHEMA = pa.schema([
    ("user_id", pa.string()), ("used_rho", pa.float64()), ("remaining_rho", pa.float64()),
    ("budget_rho", pa.float64()), ("odometer_rho", pa.float64()), ("odometer_epsilon", pa.float64()),
    ("delta", pa.float64()), ("promised_epsilon", pa.float64()), ("accounting", pa.string()),
])


def load_ledger(path: str | os.PathLike) -> tuple[LedgerParameters, Ledger]:
    """The ledger's parameters and its users, read-only (refuses a ledger that never ran)."""
    try:
        db = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise CuratorStoreError(f"cannot open the ledger {path} read-only: {exc}") from exc
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if "rho" not in meta:
            raise CuratorStoreError(f"the ledger {path} has no parameters: no daily run has used it")
        params = _parameters_from_meta(meta)
        template = Ledger(budget=params.rho, id_type=params.id_type, tracker_step=params.tracker_step).to_arrow()
        has = db.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ledger'").fetchone()[0]
        if not has:
            return params, Ledger.from_arrow(template)
        table = db.execute("SELECT user_id, used, tracker_segment, tracker_bound FROM ledger").arrow()
        table = table.read_all() if hasattr(table, "read_all") else table
    except duckdb.Error as exc:
        raise CuratorStoreError(f"the ledger {path} cannot be read: {exc}") from exc
    finally:
        db.close()
    table = table.cast(template.schema.remove_metadata()).replace_schema_metadata(template.schema.metadata)
    return params, Ledger.from_arrow(table)


def privacy_report(path: str | os.PathLike, *, user: str | None = None, delta: float | None = None) -> pa.Table:
    """Reports (:data:`REPORT_SCHEMA`) for ``user``, or for every user when ``user`` is None.

    ``odometer_epsilon`` is the personal odometer at ``delta`` (default: the ledger's delta);
    ``promised_epsilon`` the promise every user has (``epsilon`` of the ledger at that delta).
    An unknown user gets an empty table: nothing of theirs was ever charged.
    """
    params, ledger = load_ledger(path)
    delta = params.delta if delta is None else float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got delta={delta}")
    users = ledger.to_arrow().column("user_id")
    if user is not None:
        if params.id_type == "int64":
            try:
                wanted = pa.array([int(user)], type=pa.int64())
            except ValueError:
                raise ValueError(f"user must be an integer id for this ledger, got user={user!r}") from None
        else:
            wanted = pa.array([str(user)], type=users.type)
        if float(ledger.used(wanted)[0]) == 0.0 and float(ledger.personal_odometer(wanted)[0]) == 0.0:
            known = bool(np.isin(wanted.to_numpy(zero_copy_only=False), users.to_numpy(zero_copy_only=False))[0])
            if not known:
                return REPORT_SCHEMA.empty_table()
        users = wanted
    used = ledger.used(users)
    odometer = ledger.personal_odometer(users)
    levels, inverse = np.unique(odometer, return_inverse=True)
    eps = np.array([epsilon_for_budget(rho=float(r), delta=delta, accounting=params.accounting) if r > 0 else 0.0
                    for r in levels])[inverse] if len(levels) else np.zeros(0)
    promised = epsilon_for_budget(rho=params.rho, delta=delta, accounting=params.accounting)
    n = len(users)
    return pa.table({
        "user_id": users.cast(pa.string()), "used_rho": used, "remaining_rho": ledger.remaining(users),
        "budget_rho": np.full(n, params.rho), "odometer_rho": odometer, "odometer_epsilon": eps,
        "delta": np.full(n, delta), "promised_epsilon": np.full(n, promised),
        "accounting": pa.array([params.accounting] * n, type=pa.string()),
    }, schema=REPORT_SCHEMA)
