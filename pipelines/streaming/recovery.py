"""The streaming job's recovery and lineage, under any runner: which launch restarts which job
(:func:`job_identity`, :func:`restarting`), bringing its state folder to its last commit
(:func:`recover`), and the job's run in the public lineage (:func:`job_lineage`,
:func:`check_lineage`, :func:`claim_lineage`). Imports no Beam.

**Crash recovery: run the same command again.** The ``--output`` is the job's state folder
(:data:`STATE_FILE` records the command line that owns it). Each window is committed by one
marker, ``<output>/commits/window_id=<W>.json``, written whole or not at all in window order,
after every shard's ledger snapshot and records (books, duplicates) of the window and its
staged release file, and before its publication
(:class:`renyi_stream.pipelines.streaming.commits.WindowCommits`). A job launched again
with the same command line (:func:`restarting`) first brings the folder to its last marker
(:func:`recover`): it publishes every committed window not yet public (first write wins), removes
what a crash left of later windows (snapshots, staged releases, records: a dead branch, never
restored, never published), then continues from the last committed window's snapshots: its shards
start after that window, rows of the windows it committed are re-deliveries (neither charged nor
counted again: their outcome is in those windows' committed records, and a message's own records
are named by their content, so a message the restart reads again is counted once), and the later windows are
charged again from that ledger, with the same ledger id and keyed noise. The source must deliver
again every message of those later windows: a replay does; for Kafka, a new consumer group reading
from the earliest retained record; for Pub/Sub, a seek of the subscription to before the
committed window's end. Another command line given a job's ``--output`` is refused (one folder,
one job), and so is a folder of snapshots from before commit markers (no :data:`STATE_FILE`).

**Lineage: a ledger cannot fork** (:mod:`renyi_stream.queries.release_lineage`, as the distributed job's). Each
job is a run (:func:`job_lineage`): a random run id recorded in :data:`STATE_FILE` with its parent's
(:data:`renyi_stream.queries.release_lineage.ORIGIN` for a new ledger, else the run that wrote the
``--previous-ledger`` snapshots), kept by the job's restarts, and written into every snapshot
(``SNAPSHOT_RUN``, ``SNAPSHOT_PREVIOUS_RUN``: :mod:`renyi_stream.pipelines.streaming.file_metadata`).
Before its first public window the job claims the one successor of its parent (:func:`claim_lineage`,
in :class:`renyi_stream.pipelines.streaming.commits.WindowCommits` and :func:`recover`), and each
window's lineage record names it before its file; so of two jobs continued from one snapshot only
the first to publish does, and the other fails with nothing of it public. At launch
:func:`check_lineage` refuses, naming the runs, a ``--previous-ledger`` outside the public chain.
"""

from __future__ import annotations

import argparse
import secrets
from typing import Any

import pyarrow.parquet as pq

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.beam.publication import PublicReleaseFiles, StagedReleases
from renyi_stream.pipelines.streaming.file_metadata import SNAPSHOT_PREVIOUS_RUN, SNAPSHOT_RUN
from renyi_stream.pipelines.streaming.state_folder import (COMMITS, STAGED_RELEASES, STATE_FILE, _matched,
                                                           _snapshot_glob, _snapshot_place, _window_files, _window_of,
                                                           committed_windows, last_committed)
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.stream.engine.publication import publish_outbox
from renyi_stream.stream.private_files import private_dir

def job_identity(args: argparse.Namespace) -> dict[str, Any]:
    """What makes a launch a restart of the job that wrote a state folder (its :data:`STATE_FILE`):
    the same schedule (``--start``, ``--end``), source (``--replay`` files in order,
    ``--subscription``, or ``--kafka-topic`` and ``--bootstrap-servers``) and ``--previous-ledger``:
    the same command line, as an operator re-runs it after a crash."""
    return {"start": args.start, "end": args.end, "previous_ledger": args.previous_ledger,
            "replay": [store.absolute(path) for path in args.replay or ()], "subscription": args.subscription,
            "kafka_topic": args.kafka_topic, "bootstrap_servers": getattr(args, "bootstrap_servers", None)}


def _state(curator: str) -> dict[str, Any] | None:
    path = store.join(curator, STATE_FILE)
    return store.read_json(path) if store.exists(path) else None


def restarting(curator: str, args: argparse.Namespace) -> bool:
    """Whether this launch restarts the job whose state folder ``curator`` is: its
    :data:`STATE_FILE` records this launch's :func:`job_identity`."""
    state = _state(curator)
    return state is not None and state.get("job") == job_identity(args)


def new_run_id() -> str:
    """A new job's run id: 48 random bits as 12 lowercase hex digits (public, like the distributed
    job's attempt ids: it only names a branch of the ledger)."""
    return secrets.token_hex(6)


def snapshot_runs(pattern: str) -> tuple[str | None, str | None]:
    """``(run, previous run)`` as the snapshots ``pattern`` matches record them
    (``SNAPSHOT_RUN``, ``SNAPSHOT_PREVIOUS_RUN``); ``(None, None)`` for snapshots written
    before lineage was recorded, or when the files do not all record the same pair (then
    :func:`renyi_stream.pipelines.streaming.snapshots._previous_ledger` refuses them as not one job's
    snapshots)."""
    found = set()
    for path in _matched(store.absolute(pattern)):
        with store.open_input(path) as handle:
            meta = pq.read_schema(handle).metadata or {}
        found.add((meta.get(SNAPSHOT_RUN.encode()), meta.get(SNAPSHOT_PREVIOUS_RUN.encode())))
    if len(found) != 1 or None in next(iter(found)):
        return None, None
    run, previous = next(iter(found))
    return run.decode(), previous.decode()


def job_lineage(curator: str, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(run, previous run)`` of the job this launch is: a restart (:func:`restarting`) keeps the
    run id and parent its :data:`STATE_FILE` records (``(None, None)`` for a state folder from
    before lineage: unchecked, as snapshots without it); a new job draws a new run id
    (:func:`new_run_id`) and continues :data:`renyi_stream.queries.release_lineage.ORIGIN` (``--previous-ledger
    none``) or the run that wrote its ``--previous-ledger`` snapshots (None when they do not record
    it)."""
    state = _state(curator)
    if state is not None and state.get("job") == job_identity(args):
        return state.get("run"), state.get("previous_run")
    if args.previous_ledger.lower() == "none":
        return new_run_id(), lineage.ORIGIN
    return new_run_id(), snapshot_runs(args.previous_ledger)[0]


def check_lineage(releases: str, args: argparse.Namespace, run: str | None, previous_run: str | None, *,
                  restart: bool) -> None:
    """Refuse (RunRefused, naming both runs and the ledger to continue instead) a job that would
    fork the public lineage under ``releases`` (:mod:`renyi_stream.queries.release_lineage`): a new ledger on a
    root whose lineage another run started; a ``--previous-ledger`` that is not the public chain's
    (:func:`renyi_stream.queries.release_lineage.check_continuation`: another run already continued its ledger,
    or published as the successor of its parent, or published a window it charged); a restart
    whose parent another run continued publicly. Snapshots or state folders from before lineage
    are not checked."""
    if run is None:
        return
    if restart or args.previous_ledger.lower() == "none":
        holder = lineage.successor(releases, previous_run) if previous_run is not None else None
        if holder not in (None, run):
            if previous_run == lineage.ORIGIN:
                raise launch.RunRefused(
                    f"--previous-ledger none, but the releases under {releases} already continue a ledger started "
                    f"by run {holder}, not by this job (run {run}): continue from the last released window's "
                    "snapshots of that lineage")
            raise launch.RunRefused(
                f"run {previous_run}'s ledger was continued publicly under {releases} by run {holder}, not by this "
                f"job (run {run}): its releases would fork the ledger; continue from the last released window's "
                f"snapshots of run {holder}'s lineage")
        return
    parent, grandparent = snapshot_runs(args.previous_ledger)
    if parent is None:
        return
    root, _, _ = _snapshot_place(_matched(store.absolute(args.previous_ledger))[0]) or ("", 0, 0)
    charged = committed_windows(root[:-len("/ledger")]) if root.endswith("/ledger") else []
    try:
        lineage.check_continuation(releases, run=parent, previous_run=grandparent, charged=charged)
    except lineage.LineageConflict as exc:
        raise launch.RunRefused(f"--previous-ledger {args.previous_ledger!r} (written by run {parent}) is not the "
                                f"ledger of what is public: {exc}") from None


def claim_lineage(public: str, run: str | None, previous_run: str | None) -> None:
    """Claim run ``run`` the one public successor of ``previous_run``'s ledger under ``public``
    before any of its windows is published (:func:`renyi_stream.queries.release_lineage.claim`; idempotent for
    its holder, so a restarted job keeps its claim). LineageConflict, naming both runs, when
    another run holds it: then nothing of ``run`` may be published. Nothing to claim for a job or
    snapshots from before lineage (either id None)."""
    if run is not None and previous_run is not None:
        lineage.claim(public, previous_run, run)


def _refuse_another_jobs_output(curator: str, args: argparse.Namespace) -> None:
    """RunRefused when ``curator`` is the state folder of a job other than this launch's: its
    commits are that job's ledger, and this job's windows would mix with them."""
    state = _state(curator)
    if state is not None and state.get("job") != job_identity(args):
        theirs, mine = state.get("job") or {}, job_identity(args)
        differ = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        raise launch.RunRefused(
            f"--output {curator} is the state folder of another job ({store.join(curator, STATE_FILE)}: its "
            f"{', '.join('--' + k.replace('_', '-') for k in differ)} differ from this launch's): restart that job "
            "with exactly its command line, or give this job a new --output (and that job's last committed "
            "window's snapshots as --previous-ledger)")


def _refuse_an_output_from_before_commit_markers(curator: str) -> None:
    """RunRefused when ``curator`` holds ledger snapshots but no :data:`STATE_FILE`: a job of an
    earlier version wrote them, without commit markers, so which window is complete is unknown."""
    if _state(curator) is None and _window_files(curator)["ledger"]:
        raise launch.RunRefused(
            f"--output {curator} holds ledger snapshots of a job from before commit markers, which this version "
            "cannot tell complete from a crashed job's: give a new --output and the last released window's "
            f"snapshots as --previous-ledger ('{_snapshot_glob(store.join(curator, 'ledger'), 0)}' for window 0)")


def recover(curator: str, releases: str) -> tuple[int | None, list[int], int]:
    """Bring the state folder ``curator`` (a job's ``--output``) to its last commit, as a job
    restarted into it does before it builds anything: returns ``(last committed window or None,
    windows published now, dead-branch files removed)``.

    1. The last commit marker names the last complete window ``C``
       (:class:`renyi_stream.pipelines.streaming.commits.WindowCommits` writes
       markers in window order, each after every shard's snapshot and records of its window and
       its staged releases).
    2. Every committed window not yet public under ``releases`` is published, in window order,
       first write wins (:func:`renyi_stream.stream.engine.publication.publish_outbox`): each has its ledger
       snapshots, so its answer has a durable ledger that charged its users.
    3. The files of windows after ``C`` (snapshots, staged releases, books, duplicates)
       are the crashed job's dead branch: removed, never restored nor published (no marker names
       them, so none of them is public). Their windows are charged again from ``C``'s snapshots.

    Publishing first claims the job's place in the public lineage (:func:`claim_lineage`, the run
    ids its :data:`STATE_FILE` records), so a restarted job keeps its claim, and one whose claim
    another run holds publishes nothing (LineageConflict).

    Call it only for a restart (:func:`restarting`): the folder is then this job's."""
    last = last_committed(curator)
    committed = committed_windows(curator)
    pending = sorted(set(committed) - store.release_windows_present(releases))
    state = _state(curator) or {}
    run = state.get("run")
    if pending:  # this job's claim first (LineageConflict when another run holds it: nothing published)
        claim_lineage(releases, run, state.get("previous_run"))
    published = list(publish_outbox(StagedReleases(store.join(curator, STAGED_RELEASES), pending),
                                    PublicReleaseFiles(releases, run=run)).windows) if pending else []
    dead = [path for paths in _window_files(curator).values() for path in paths
            if last is None or _window_of(path) > last]
    if dead:
        store.delete(dead)
    return last, published, len(dead)


def record_state_file(args: argparse.Namespace) -> None:
    """Make ``--output`` this job's state folder before its first window: a local one private
    (``0700``, tightened if it exists), and its :data:`STATE_FILE` written when it has none, recording
    :func:`job_identity` and the run ids of ``args.lineage`` (:func:`job_lineage`): from then on the
    folder is recovered by a restart (:func:`recover`)."""
    if "://" not in args.output:  # curator-only: 0700, tightened if it exists (snapshots are 0600)
        private_dir(store.absolute(args.output))
    state = store.join(store.absolute(args.output), STATE_FILE)
    if not store.exists(state):  # from now on this --output is recovered by a restart (recover)
        run, previous_run = args.lineage  # kept by a restart (job_lineage), so it keeps its claim
        store.write_json(state, {"format": 1, "commits": COMMITS, "job": job_identity(args), "run": run,
                                 "previous_run": previous_run})
