"""The noisy releases every job makes, with no runner in them: a window query's release of a window
(:class:`WindowQueryReleases`), a running query's releases ``y_t = (C a)_t + z_t`` in window order
(:class:`RunningQueryReleases`) and its running totals ``(B y)_t`` (:class:`RunningTotalRows`), the
noise key bound to the ledger (:func:`ledger_binding`) and the release row they all write
(:func:`release_row`). The Beam jobs run them as DoFns
(:mod:`renyi_stream.pipelines.beam.transforms`), the streaming job's shells with their runner's keyed
state (:mod:`renyi_stream.pipelines.streaming.window_releases`); imports no Beam.

A step's outputs are its main output as it is and any other as ``(tag, value)`` (the Beam DoFns
turn those into Beam's tagged outputs)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from renyi_stream.pipelines.beam.running_releases import running_release_for
from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.engine.running import RunningRelease, noisy_release
from renyi_stream.stream.engine.shard_state import QueryPlan, window_noise_std
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, check_ledger_id, gaussian_noise
from renyi_stream.stream.schema import WindowSpec


def ledger_binding(key_path: str, fingerprint: str, ledger_id: str) -> NoiseBinding:
    """The noise key at ``key_path`` bound to ``ledger_id``, loaded on the worker (each release
    step's ``setup``); RuntimeError when it is not the key the ledger was started with (its
    fingerprint), so a swapped key file never draws a second, independent noise."""
    key = NoiseKey.load(key_path)
    if key.fingerprint != fingerprint:
        raise RuntimeError(f"the noise key at {key_path} is not the one this ledger was started with")
    return NoiseBinding(key, ledger_id)


class WindowQueryReleases:
    """window id -> one release row per (query, coordinate) for each window query active in it:
    the sum (0 when no rows) plus keyed noise (running queries are released in window order by
    :class:`RunningQueryReleases`). The noise is the key's bound to the ledger ``ledger_id``
    (:class:`renyi_stream.stream.noise.NoiseBinding`): another ledger under the same key draws independent
    noise. Each query's coordinates get its own std, ``m * s`` (its ``noise_scale`` times the ledger's
    ``noise_std``: :func:`renyi_stream.stream.engine.shard_state.window_noise_std`, what the charge paid
    for), drawn at and reported as that std; every job releases window queries here."""

    def __init__(self, *, key_path: str, plan: QueryPlan, noise_std: float, window: WindowSpec, accounting: str,
                 key_fingerprint: str, ledger_id: str) -> None:
        self._ledger_id = check_ledger_id(ledger_id)  # refused when the graph is built, not on a worker
        self._key_path = key_path
        self._plan = plan
        self._noise_std = noise_std
        self._window = window
        self._accounting = accounting
        self._fingerprint = key_fingerprint
        self._binding: NoiseBinding | None = None

    def setup(self) -> None:
        self._binding = ledger_binding(self._key_path, self._fingerprint, self._ledger_id)

    def process(self, window: int, sums: dict) -> Iterator[Any]:
        assert self._binding is not None
        for entry in self._plan.active(window):
            query = entry.query
            if entry.kind == "running":
                continue  # RunningQueryReleases: its state advances window by window, in order
            total = np.asarray(sums.get((entry.query_id, window), np.zeros(query.dim)), dtype=np.float64)
            std = window_noise_std(query, self._noise_std)  # the ledger's s when the query declares no scale
            noise = gaussian_noise(self._binding, query_id=entry.query_id, window_id=window, dim=query.dim,
                                   noise_std=std)
            values = total + noise
            for j, label in enumerate(query.labels):
                yield release_row(self._window, window, query_id=entry.query_id, label=label, coordinate=j,
                                  value=float(values[j]), noise_std=std, kind="window",
                                  accounting=self._accounting, key_fingerprint=self._fingerprint)


class RunningQueryReleases:
    """running query id -> its releases over this run's schedule, in window order.

    From the query's release state (:class:`renyi_stream.stream.engine.running.RunningRelease`, restored from
    ``previous``, ``query_id -> Arrow table``, or new at its first window), for every window of
    the schedule the query is active in, with or without rows (invariant 3): ``a_t`` the sum of
    every shard's admitted contributions (0 without rows), ``y_t = (C a)_t + z_t`` with the keyed
    noise of ``(query_id, window)`` (tag ``raw``: ``(query_id, window_id, y flat)``, which
    :class:`RunningTotalRows` turns into running totals), then the state after the run (tag
    ``release_state``: ``(query_id, table)``), for the curator to store with the ledger. A stored
    state of another strategy or horizon, a window out of order or past the declared schedule is
    refused (ValueError), before anything is released."""

    def __init__(self, *, key_path: str, plan: QueryPlan, noise_std: float, schedule: Sequence[int],
                 key_fingerprint: str, ledger_id: str) -> None:
        self._ledger_id = check_ledger_id(ledger_id)
        self._key_path = key_path
        self._plan = plan
        self._noise_std = noise_std
        self._schedule = sorted(int(w) for w in schedule)
        self._fingerprint = key_fingerprint
        self._binding: NoiseBinding | None = None

    def setup(self) -> None:
        self._binding = ledger_binding(self._key_path, self._fingerprint, self._ledger_id)

    def process(self, query_id: str, sums: dict, previous: dict) -> Iterator[Any]:
        assert self._binding is not None
        entry = self._plan.get(query_id)
        release = running_release_for(entry, previous.get(query_id))
        out = []
        for window in self._schedule:
            if not entry.active_in(window):
                continue
            y = self.release_window(release, window, sums.get((query_id, window)))
            out.append(("raw", (query_id, int(window), y.ravel().tolist())))
        yield from out
        yield "release_state", (query_id, release.to_arrow())


    def release_window(self, release: RunningRelease, window: int, a: Any) -> np.ndarray:
        """``y_t = (C a)_t + z_t`` for ``window``, the next window of ``release`` (which moves on):
        ``a`` the sum of every shard's admitted contributions (None: no rows, 0), the keyed noise
        of ``(query_id, window)``. Every job releases a running query's window through this."""
        assert self._binding is not None, "setup() loads the noise key"
        a = np.zeros(release.dim) if a is None else np.asarray(a, dtype=np.float64)
        return noisy_release(release.release(window, a), binding=self._binding, query_id=release.query_id,
                             window_id=int(window), noise_std=self._noise_std)


def release_row(spec: WindowSpec, window: int, *, query_id: str, label: str, coordinate: int, value: float,
                noise_std: float, kind: str, accounting: str, key_fingerprint: str) -> dict:
    """One row of :data:`renyi_stream.queries.release_store.RELEASE_SCHEMA`."""
    start = dt.datetime.fromtimestamp(int(spec.window_start_seconds(window)), tz=dt.timezone.utc)
    end = dt.datetime.fromtimestamp(int(spec.window_end_seconds(window)), tz=dt.timezone.utc)
    return {"query_id": query_id, "window_id": int(window), "window_start": start, "window_end": end,
            "label": label, "coordinate": coordinate, "value": value, "noise_std": noise_std, "kind": kind,
            "accounting": accounting, "mechanism": "gaussian", "key_fingerprint": key_fingerprint}


class RunningTotalRows:
    """``(query_id, [(window, y flat), ...])`` of this run -> running-total release rows.

    The estimate through window ``t`` is ``(B y)_t`` over the query's releases from its first
    window (post-processing of noisy releases: no privacy cost); its ``noise_std`` is the
    estimate's standard deviation, not one release's. ``previous`` holds the releases ``y`` of
    earlier runs (``query_id -> [(window, y flat)]``), which the estimate needs.
    """

    def __init__(self, *, plan: QueryPlan, noise_std: float, window: WindowSpec, accounting: str,
                 key_fingerprint: str) -> None:
        self._plan = plan
        self._noise_std = noise_std
        self._window = window
        self._accounting = accounting
        self._fingerprint = key_fingerprint
        self._stds: dict[str, np.ndarray] = {}  # per running query: its estimates' std by window offset

    def process(self, element: tuple[str, Iterable[tuple[int, list[float]]]], previous: dict) -> Iterator[dict]:
        query_id, fresh = element
        entry = self._plan.get(query_id)
        running = self._plan.running_query(query_id, self._noise_std)
        fresh = sorted((int(w), y) for w, y in fresh)
        series = sorted([(int(w), y) for w, y in previous.get(query_id, [])] + fresh)
        windows = [w for w, _ in series]
        expected = list(range(entry.first_window, entry.first_window + len(series)))
        if windows != expected:
            raise RuntimeError(f"running query {query_id!r} has releases for windows {windows[:5]}..., not the "
                               f"contiguous windows from its first window {entry.first_window}")
        ys = [np.asarray(y, dtype=np.float64).reshape(running.rows_at(w), entry.query.dim) for w, y in series]
        estimates = running.estimates(ys)
        for w, _ in fresh:
            yield from self.rows(query_id, w, estimates[w - entry.first_window])

    def running_query(self, query_id: str) -> RunningQuery:
        """The mechanism of running query ``query_id`` at this job's noise."""
        return self._plan.running_query(query_id, self._noise_std)

    def _estimate_std(self, query_id: str, window: int) -> float:
        """:meth:`RunningQuery.estimate_std` at ``window``, from a table of the query's stds kept
        and doubled as windows pass it (the std at a window does not depend on the horizon it is
        computed over): a streaming job asks at every window, and each ask computed every window's
        variance so far."""
        running = self.running_query(query_id)
        t = running.offset(window)
        stds = self._stds.get(query_id)
        if stds is None or t >= stds.size:
            horizon = max(t + 1, 2 * (0 if stds is None else stds.size), 64)
            stds = self._stds[query_id] = running.strategy.estimate_std(horizon, noise_std=running.noise_std)
        return float(stds[t])

    def rows(self, query_id: str, window: int, estimate: Any) -> Iterator[dict]:
        """The running-total release rows of ``query_id`` at ``window``: one per coordinate of the
        estimate ``(B y)_t`` (``d`` numbers), with the estimate's standard deviation."""
        entry = self._plan.get(query_id)
        std = self._estimate_std(query_id, window)
        for j, label in enumerate(entry.query.labels):
            yield release_row(self._window, window, query_id=query_id, label=label, coordinate=j,
                              value=float(estimate[j]), noise_std=std, kind="running",
                              accounting=self._accounting, key_fingerprint=self._fingerprint)


def add_vectors(parts: Iterable[Any]) -> np.ndarray:
    total = None
    for part in parts:
        total = np.array(part, dtype=np.float64) if total is None else total + part
    return total
