"""The streaming job's releases, with no runner in them: a window's release once every shard has
charged it (:class:`CompletedWindowRelease`, keyed by window) and each running query's releases in
window order (:class:`RunningReleaseInOrder`, keyed by query), and the elements that start every
shard (:func:`shard_ticks`). Each runner shell runs them with its keyed state (Beam:
:mod:`renyi_stream.pipelines.streaming.beam.releases`; Flink:
:mod:`renyi_stream.pipelines.streaming.flink.job`): a bag (``add``, ``read``, ``clear``) and a value
(``read``, ``write``). Outputs are ``(tag, value)`` pairs, tag None the main output."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from renyi_stream.pipelines.beam.release_steps import (RunningQueryReleases, RunningTotalRows, WindowQueryReleases,
                                                       add_vectors)
from renyi_stream.pipelines.beam.rows import TICK, ledger_shards, snapshot_shards
from renyi_stream.pipelines.beam.running_releases import running_release_for
from renyi_stream.pipelines.streaming.running_state import EstimateContinuation, running_state_table
from renyi_stream.stream.engine.running import RunningRelease
from renyi_stream.stream.engine.shard_state import QueryPlan


def shard_ticks(n_shards: int, previous_ledger: pa.Table | None = None,
                previous_running: dict[str, pa.Table] | None = None) -> list[tuple[int, tuple[str, Any]]]:
    """The elements that start the shards: every shard's tick (so a shard without rows still
    charges and reports every window, invariant 3), then the previous ledger's and the running
    queries' prepaid rows, split by shard."""
    initial: list[tuple[int, tuple[str, Any]]] = [(shard, (TICK, None)) for shard in range(n_shards)]
    if previous_ledger is not None and previous_ledger.num_rows:
        initial += list(ledger_shards(previous_ledger, n_shards))
    for query_id, table in sorted((previous_running or {}).items()):
        initial += [(shard, ("running", (query_id, part))) for shard, (_, part) in snapshot_shards(table, n_shards)]
    return initial


class CompletedWindowRelease:
    """Keyed by window id: the window's release once every shard has charged it.

    Input ``(window_id, (shard, {query_id: partial sum}))``: every shard sends exactly one per
    window of the schedule, rows or not, when the watermark passes the window's end (its
    chained timer). When all ``n_shards`` have reported, the window is complete: release every
    active query through :class:`renyi_stream.pipelines.beam.release_steps.WindowQueryReleases` (sum of partials, 0 when
    none, plus noise keyed by (query, window)), so every scheduled window is released
    (invariant 3), once (invariant 5: a RELEASED flag ignores any later or repeated report).

    Completion is counted, not read off the watermark: runners differ in whether a stateful
    DoFn's pending timers hold its output watermark (the Python DirectRunner's do not), and a
    release timer racing the shards' last partial sums would release a window without them.
    State: SHARDS (bag of reports), RELEASED (flag). Outputs window queries' release rows (main)
    and, for each running query active in the window, ``(query_id, (window, a_t))`` (tag
    ``running_sums``: the sum of every shard's admitted contributions, pre-noise, for
    :class:`RunningReleaseInOrder`; ``a_t`` is ``None`` when no shard admitted any).
    """

    def __init__(self, release: WindowQueryReleases, n_shards: int, plan: QueryPlan | None = None) -> None:
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1, got n_shards={n_shards}")
        self._release = release
        self._n_shards = int(n_shards)
        self._plan = plan

    def setup(self) -> None:
        self._release.setup()

    def process(self, element: tuple[int, tuple[int, dict[str, Any]]], *, shards: Any,
                released: Any) -> Iterator[tuple[str | None, Any]]:
        window, report = element
        if released.read():
            return  # released already: a repeated report must not make a second answer
        reports = {shard: sums for shard, sums in shards.read()}
        shard, sums = report
        if shard in reports:
            return  # a repeated report of a shard (e.g. a retried bundle): already counted
        reports[shard] = sums
        if len(reports) < self._n_shards:
            shards.add(report)
            return
        by_query: dict[str, list[np.ndarray]] = {}
        for _, shard_sums in sorted(reports.items()):
            for query_id, partial in shard_sums.items():
                by_query.setdefault(query_id, []).append(np.asarray(partial, dtype=np.float64))
        totals = {(query_id, int(window)): add_vectors(parts) for query_id, parts in by_query.items()}
        released.write(True)
        shards.clear()
        for row in self._release.process(int(window), totals):
            yield None, row
        for entry in self._plan.active(int(window)) if self._plan is not None else ():
            if entry.kind == "running":
                a = totals.get((entry.query_id, int(window)))
                yield "running_sums", (entry.query_id, (int(window), a))


class RunningReleaseInOrder:
    """Keyed by running query id: its releases, window by window, in window order.

    Input ``(query_id, (window, a_t))`` from :class:`CompletedWindowRelease` (tag
    ``running_sums``), one per window of the schedule the query is active in, in any order. The
    query's :class:`renyi_stream.stream.engine.running.RunningRelease` (restored from ``previous_release`` or
    new at its first window, :func:`renyi_stream.pipelines.beam.running_releases.running_release_for`, which refuses
    another strategy's state) releases its next window as soon as that window's ``a_t`` is in:
    ``y_t = (C a)_t + z_t`` (:meth:`renyi_stream.pipelines.beam.release_steps.RunningQueryReleases.release_window`, the
    keyed noise), so windows are released once each, in order, rows or not (invariants 3 and 5).
    Outputs the running-total release rows (main: the estimate ``(B y)_t`` decoded online,
    :meth:`renyi_stream.stream.continual.running.RunningQuery.estimate_online`, from the decoder's
    state after the window before, which ``previous_estimates`` gives for a query earlier jobs
    released: bit for bit the batch decode of the series through the window), ``(query_id, window, y flat)`` (tag
    ``raw``) and ``(window, state table)`` (tag ``release_state``,
    :func:`renyi_stream.pipelines.streaming.running_state.running_state_table`: the
    release and decoder states after the window, to be committed with it). State: RELEASE
    (``(release state table, decoder state)`` after the last released window: ``O(buffers x d)``
    numbers for BLT, never the series so far), PENDING (``(window, a_t)`` that came before their
    turn). A repeated window does nothing."""

    def __init__(self, release: RunningQueryReleases, estimates: RunningTotalRows, plan: QueryPlan, *,
                 previous_release: dict[str, pa.Table] | None = None,
                 previous_estimates: dict[str, EstimateContinuation] | None = None) -> None:
        self._release = release
        self._estimates = estimates
        self._plan = plan
        self._previous_release = dict(previous_release or {})
        self._previous_estimates = dict(previous_estimates or {})

    def setup(self) -> None:
        self._release.setup()

    def process(self, element: tuple[str, tuple[int, Any]], *, kept: Any,
                pending: Any) -> Iterator[tuple[str | None, Any]]:
        query_id, (window, a) = element
        held = kept.read()
        running = self._estimates.running_query(query_id)
        if held is None:
            release = running_release_for(self._plan.get(query_id), self._previous_release.get(query_id))
            continued = self._previous_estimates.get(query_id)
            decoder = continued.state(running, release.next_window) if continued is not None else None
        else:
            release, decoder = RunningRelease.from_arrow(held[0]), held[1]
        waiting = {int(w): value for w, value in pending.read()}
        if int(window) < release.next_window or int(window) in waiting:
            return  # released already, or waiting already: a repeated report (invariant 5)
        waiting[int(window)] = a
        released = False
        while release.next_window in waiting:
            w = release.next_window
            y = self._release.release_window(release, w, waiting.pop(w))
            estimate, decoder = running.estimate_online(w, decoder, y)
            released = True
            yield "raw", (query_id, w, y.ravel().tolist())
            yield "release_state", (w, running_state_table(release, decoder))
            for row in self._estimates.rows(query_id, w, estimate):
                yield None, row
        pending.clear()
        for w, value in sorted(waiting.items()):
            pending.add((w, value))
        if released:
            kept.write((release.to_arrow(), decoder))
