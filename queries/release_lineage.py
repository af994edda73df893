"""Which committed run charged each public window, and which run continues which ledger.

A public answer is safe only if every later ledger includes the charges of the run that
produced it (docs/architecture.md, "The outbox rule", and invariant 6 (charge-once)). Ledgers of
the distributed job form a chain: each run reads the previous run's committed snapshot and
commits a new one. Two
committed runs from the same snapshot (a re-run into a new ``--output`` after a crash between
commit and publish, or two launches at once) *fork* the chain: each branch misses the other's
charges, so at most one branch may ever be public, and only that branch may be continued.

The public release root records the chain, with no per-user or count information (run ids are
random attempt ids)::

    <root>/_lineage/after/<previous run>.json   {"version": 1, "previous_run": ..., "run": ...}
    <root>/_lineage/windows/<window id>.json    {"version": 1, "window_id": ..., "run": ...}

``after/<p>`` is the *claim*: the one run allowed to publish as the successor of run ``p``
(:data:`ORIGIN` for a ledger's first run). It is created once (:func:`renyi_stream.queries.release_files.create_once`)
before any of that run's windows, so of two runs from one ledger exactly one can publish; the
claim is never replaced. ``windows/<w>`` names the run whose committed ledger charged window
``w``'s public file, written just before that file. Since every publisher first holds the claim
on its parent and every continuation checks its ledger's claims (:func:`check_continuation`),
the runs whose windows are public form a single chain and a ledger outside it cannot be
continued.

Guaranteed on local (and network) filesystems, where the claim is an atomic no-replace
create. For ``gs://`` and ``s3://`` roots ``pyarrow.fs`` has no conditional create, so a claim
is check-then-write: two runs that claim *in the same moment* can both believe they won. The
launch-time check still refuses to continue any ledger that is not the public chain's.
"""

from __future__ import annotations

import json
import re

import pyarrow.fs as pafs

from renyi_stream.queries.release_files import create_once, filesystem

#: The "previous run" of a ledger's first run.
ORIGIN = "origin"
LINEAGE_VERSION = 1
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class LineageConflict(RuntimeError):
    """Publishing (or continuing) this run would fork the public lineage."""


def _check_run(name: str, run: str) -> str:
    if not isinstance(run, str) or not _RUN_ID.fullmatch(run) or run in (".", ".."):
        raise ValueError(f"{name} must be a run id of 1 to 64 letters, digits, '_', '.' or '-', got {run!r}")
    return run


def claim_path(previous_run: str) -> str:
    """The claim on ``previous_run``'s successor, relative to the release root."""
    return f"_lineage/after/{_check_run('previous_run', previous_run)}.json"


def window_path(window: int) -> str:
    """Window ``window``'s lineage record, relative to the release root."""
    return f"_lineage/windows/{int(window)}.json"


def _read(root: str, relative: str) -> dict | None:
    fs, base = filesystem(root)
    try:
        with fs.open_input_stream(f"{base}/{relative}") as handle:
            return json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        return None


def _create(root: str, relative: str, record: dict) -> bool:
    data = json.dumps(record, sort_keys=True).encode("utf-8")

    def write(fs: pafs.FileSystem, scratch: str) -> None:
        with fs.open_output_stream(scratch) as handle:
            handle.write(data)

    return create_once(root, relative, write)


def successor(root: str, previous_run: str) -> str | None:
    """The run that holds the claim on ``previous_run``'s successor under ``root``, or None."""
    record = _read(root, claim_path(previous_run))
    return None if record is None else str(record["run"])


def published_by(root: str, window: int) -> str | None:
    """The run whose ledger charged window ``window``'s public file, or None when not recorded
    (not published, or published before lineage was recorded)."""
    record = _read(root, window_path(window))
    return None if record is None else str(record["run"])


def claim(root: str, previous_run: str, run: str) -> None:
    """Make ``run`` the one successor of ``previous_run`` under ``root`` that may publish.
    Idempotent for the holder (a retried or resumed publish); LineageConflict, naming both
    runs, when another run holds the claim."""
    _create(root, claim_path(previous_run),
            {"version": LINEAGE_VERSION, "previous_run": previous_run, "run": _check_run("run", run)})
    holder = successor(root, previous_run)
    if holder != run:
        raise LineageConflict(
            f"run {run} may not publish: run {holder} already published as the successor of run {previous_run} "
            f"({claim_path(previous_run)} under {root}). Both continued the same ledger, so each misses the "
            f"other's charges; only {holder}'s branch is public. Run {run}'s ledger is a dead branch: continue "
            f"from the ledger committed by run {holder}")


def record_window(root: str, window: int, run: str) -> None:
    """Record that ``run``'s committed ledger charged window ``window`` (before its public file
    is written). Idempotent for the same run; LineageConflict when another run is recorded."""
    _create(root, window_path(window), {"version": LINEAGE_VERSION, "window_id": int(window),
                                        "run": _check_run("run", run)})
    recorded = published_by(root, window)
    if recorded != run:
        raise LineageConflict(f"window {window} under {root} is recorded as charged by run {recorded}, not by run "
                              f"{run}: two runs forked one ledger. Continue from the ledger committed by run "
                              f"{recorded}")


def check_continuation(root: str, *, run: str, previous_run: str | None, charged: list[int]) -> None:
    """Refuse (LineageConflict, naming the runs and the fix) to continue the ledger committed
    by ``run`` unless it is the public chain's: no other run published as the successor of its
    parent ``previous_run`` (None: unknown, not checked) or of ``run`` itself, and none of the
    windows it ``charged`` is public as charged by another run."""
    holder = successor(root, run)
    if holder is not None:
        raise LineageConflict(
            f"run {run}'s ledger already has a successor under {root}: run {holder} continued it and published "
            f"({claim_path(run)}). A second run from the same ledger would fork it. Continue from the ledger "
            f"committed by run {holder}")
    if previous_run is not None:
        holder = successor(root, previous_run)
        if holder not in (None, run):
            raise LineageConflict(
                f"the public releases under {root} continue run {previous_run}'s ledger through run {holder}, not "
                f"through run {run}: both ran from the same ledger and {holder}'s releases are public, so run "
                f"{run}'s ledger misses the charges of users whose contributions are public. Continue from the "
                f"ledger committed by run {holder}; run {run}'s output is a dead branch (its staged releases are "
                "never published)")
    for window in sorted(charged):
        recorded = published_by(root, window)
        if recorded not in (None, run):
            raise LineageConflict(
                f"window {window} under {root} was published as charged by run {recorded}, but run {run}'s ledger "
                f"charged it too: the two runs forked one ledger. Continue from the ledger committed by run "
                f"{recorded}")
