"""A running query's release state as every job continues it: restored from what an earlier run
stored, or new at its first window (:func:`running_release_for`), and the check, at launch, that
a job can continue it (:func:`refuse_running_continuation`). Imports no Beam: the Beam jobs'
transforms and the streaming job's runner-independent launch share it."""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from renyi_stream.stream.engine.running import RunningRelease, rule_meta
from renyi_stream.stream.engine.shard_state import (QueryPlan, refuse_oversized_running, refuse_running_gaps,
                                                    running_rule_of)


def running_release_for(entry: Any, stored: pa.Table | None) -> RunningRelease:
    """A running query's release state: ``stored`` restored (refused when it was made for another
    strategy, horizon or first window than the registered query's), or new at its first window."""
    strategy, rule = running_rule_of(entry.query)
    if stored is None:
        return RunningRelease(rule, query_id=entry.query_id, strategy=strategy, dim=entry.query.dim,
                              start_window=entry.first_window)
    release = RunningRelease.from_arrow(stored)
    expected = rule_meta(rule, strategy=strategy, dim=entry.query.dim, start_window=entry.first_window)
    found = {k: v for k, v in release.meta.items() if k in expected}
    if found != expected or release.query_id != entry.query_id:
        raise ValueError(f"running query {entry.query_id!r} is registered with strategy {strategy!r} as {expected} but "
                         f"its stored release state (ledger database) was made as {found}: refusing to continue it. Use the ledger and release "
                         "store that belong together, or register a new query id")
    return release


def refuse_running_continuation(plan: QueryPlan, states: dict[str, pa.Table], schedule: Sequence[int], *,
                                stored_where: str) -> None:
    """ValueError, at launch, for a running query a job cannot continue: a stored release state
    (``states``, by query id) made under another strategy, horizon or first window than the
    registered query (:func:`running_release_for`), or a schedule that skips, repeats or passes
    one of its windows (:func:`renyi_stream.stream.engine.shard_state.refuse_running_gaps`). ``stored_where``
    says where the states came from, for the message (e.g. ``"the previous manifest"``). A running
    query too big for a job to keep is refused first, before its rule is built
    (:func:`renyi_stream.stream.engine.shard_state.refuse_oversized_running`)."""
    refuse_oversized_running(plan, schedule)
    for entry in plan.running:
        if any(entry.active_in(w) for w in schedule):
            try:
                running_release_for(entry, states.get(entry.query_id))
            except ValueError as exc:
                if repr(entry.query_id) in str(exc):
                    raise
                raise ValueError(f"running query {entry.query_id!r}, stored in {stored_where}: {exc}") from None
    refuse_running_gaps(plan, {q: int(t.schema.metadata[b"next_window"]) for q, t in states.items()}, schedule)
