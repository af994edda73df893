"""The common form every job's results are read into, and how two are compared.

:class:`Outcome` is what a job has done to one new ledger after a sequence of runs: its public
release rows (read from the ``--releases-parquet`` root every job writes), its ledger (each
user's used budget and personal odometer), its ledger id (the noise is bound to it), the row
books of every run and every dead letter.

Noise: the release noise is keyed by the ledger's random id (:class:`renyi_stream.stream.noise.NoiseBinding`,
docs/architecture.md, "Edges"), so two jobs' releases of the same data differ by their noises.
:func:`without_noise` recomputes each release's noise from the key and the job's own ledger id
and takes it off, leaving the exact sums the jobs noised; those must agree across jobs. For a
running total the release is ``(B y)_t`` with ``y = C a + z``, so its noise part is ``(B z)_t``,
recomputed through the query's own strategy (:class:`renyi_stream.stream.continual.running.RunningQuery`).

Tolerance of those sums (:data:`SUM_TOLERANCE`): the jobs add the same numbers in different
orders (per-shard partial sums combined by the runner). A sum of ``n`` terms computed in any
order is within ``n u sum|x|`` of the exact one (``u = 2^-53``; Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., eq. (4.4)); the scenarios have ``n <= 300`` rows per window with
``|x| <= 2`` (``sum|x| <= 600``), so two orders differ by at most ``2 * 300 * 1.1e-16 * 600 =
4e-11``. Taking the noise off (``|z| <= 10 s`` with ``s < 10``) adds at most ``2u(|s| + |z|) <
3e-14``; a running total's post-processing is a matrix of norm below 4 over at most 4 windows.
``1e-9`` is 25x above that bound and far below any real difference (one contribution is a
multiple of 1/8, or a clipped one of size ``> 1e-3``). Ledgers are compared exactly: each user's
charges are the same numbers added in the same (window) order in every job.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow.parquet as pq

from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.engine.shard_state import running_strategy
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise

SUM_TOLERANCE = 1e-9
#: What identifies a release row, and what must match across jobs besides the sum.
RELEASE_KEY = ("query_id", "window_id", "coordinate")
RELEASE_PUBLIC = ("label", "kind", "noise_std", "key_fingerprint", "accounting", "mechanism", "window_start",
                  "window_end")


@dataclass(frozen=True)
class RunBooks:
    """One run's row books (curator only): rows read, charged by status, dead letters by reason."""

    rows_read: int
    admitted: int
    clipped: int
    dropped: int
    reasons: dict[str, int]

    @property
    def charged(self) -> int:
        return self.admitted + self.clipped + self.dropped

    @property
    def dead(self) -> int:
        return sum(self.reasons.values())

    @property
    def balanced(self) -> bool:
        """``rows read = admitted + clipped + dropped + dead letters`` (invariant 7
        (rows-counted-not-lost, docs/architecture.md))."""
        return self.rows_read == self.charged + self.dead


@dataclass(frozen=True)
class Outcome:
    """Everything a job did to one ledger, in the common form."""

    releases: tuple[dict[str, Any], ...]
    ledger_id: str
    ledger: dict[Any, tuple[float, float, float]]  # user -> (used, tracker_segment, tracker_bound)
    runs: tuple[RunBooks, ...]
    dead: tuple[tuple[int, str, int, str], ...]  # (run, input file name, row index, reason)

    def release_keys(self) -> list[tuple[str, int, int]]:
        return [tuple(r[k] for k in RELEASE_KEY) for r in self.releases]

    def dead_of_run(self, run: int) -> set[tuple[str, int, str]]:
        """Run ``run``'s dead letters as ``(input name, row index, reason)``."""
        return {(name, row, reason) for r, name, row, reason in self.dead if r == run}

    def dead_rows_of_run(self, run: int) -> list[tuple[int, str]]:
        """Run ``run``'s dead letters as sorted ``(row index, reason)``, whatever names the input."""
        return sorted((row, reason) for r, _, row, reason in self.dead if r == run)


def read_release_files(root: str | Path) -> tuple[dict[str, Any], ...]:
    """Every row of every public release file under ``root`` (``window_id=<W>/releases.parquet``,
    :mod:`renyi_stream.queries.release_files`), with its ``window_id``, sorted by :data:`RELEASE_KEY`."""
    rows = []
    for path in sorted(Path(root).glob("window_id=*/*.parquet")):
        window = int(path.parent.name.split("=", 1)[1])
        for row in pq.read_table(path).to_pylist():
            rows.append({**row, "window_id": window})
    return tuple(sorted(rows, key=lambda r: tuple(r[k] for k in RELEASE_KEY)))


def window_noise(key: NoiseKey, ledger_id: str, *, query_id: str, window_id: int, coordinate: int,
                 noise_std: float) -> float:
    """The noise in coordinate ``coordinate`` of the window-sum release ``(query_id, window_id)``
    of ledger ``ledger_id`` under ``key``, released at ``noise_std``: what the job added to the
    exact sum (:func:`renyi_stream.stream.noise.gaussian_noise`; a draw's first coordinates do not depend on
    its dimension)."""
    return float(gaussian_noise(NoiseBinding(key, ledger_id), query_id=query_id, window_id=window_id,
                                dim=coordinate + 1, noise_std=noise_std)[coordinate])


def without_noise(outcome: Outcome, key: NoiseKey,
                  plan: Iterable[tuple[Any, int, int | None]]) -> dict[tuple[str, int, int], float]:
    """``(query id, window, coordinate) -> the exact sum the job noised``: each public release
    less the noise :func:`renyi_stream.stream.noise.gaussian_noise` draws for it under ``key`` and the job's
    own ledger id. ``plan`` (``(query, first window, retired from)``, the public catalogue) gives
    each running total's strategy and first window; window sums need nothing from it."""
    binding = NoiseBinding(key, outcome.ledger_id)
    window_std = {r["noise_std"] for r in outcome.releases if r["kind"] == "window"}
    queries = {query.query_id: (query, first) for query, first, _ in plan}
    out = {}
    for row in outcome.releases:
        key_ = tuple(row[k] for k in RELEASE_KEY)
        if row["kind"] == "window":
            noise = window_noise(key, outcome.ledger_id, query_id=row["query_id"], window_id=row["window_id"],
                                 coordinate=row["coordinate"], noise_std=row["noise_std"])
        else:
            (std,) = window_std  # a running release's own noise std is the ledger's s
            query, first = queries[row["query_id"]]
            noise = _running_noise(binding, query, first, row["window_id"], std)[row["coordinate"]]
        out[key_] = row["value"] - float(noise)
    return out


def _running_noise(binding: NoiseBinding, query: Any, first: int, window_id: int, std: float) -> np.ndarray:
    """The noise part ``(B z)_t`` of a running total's estimate at ``window_id``."""
    running = RunningQuery(query_id=query.query_id, dim=query.dim, start_window=first, noise_std=std,
                           strategy=running_strategy(query))
    zs = [gaussian_noise(binding, query_id=query.query_id, window_id=w, dim=running.rows_at(w) * query.dim,
                         noise_std=std).reshape(running.rows_at(w), query.dim)
          for w in range(first, window_id + 1)]
    return running.estimates(zs)[window_id - first]


def public_part(outcome: Outcome) -> list[tuple]:
    """Per release, what is public besides its value (:data:`RELEASE_KEY` and :data:`RELEASE_PUBLIC`)."""
    return [tuple(r[k] for k in RELEASE_KEY + RELEASE_PUBLIC) for r in outcome.releases]


def differing_sums(mine: dict, theirs: dict, tolerance: float = SUM_TOLERANCE) -> dict:
    """``key -> (mine, theirs)`` where the two exact sums differ by more than ``tolerance``, or
    where one side has no release."""
    keys = sorted(set(mine) | set(theirs))
    return {k: (mine.get(k), theirs.get(k)) for k in keys
            if k not in mine or k not in theirs or abs(mine[k] - theirs[k]) > tolerance}


def reasons_of(rows: Iterable[str]) -> dict[str, int]:
    return dict(sorted(collections.Counter(rows).items()))
