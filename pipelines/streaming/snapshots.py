"""The streaming job's ledger snapshots, read back and checked, under any runner: the ledger a job
continues (:func:`_previous_ledger`), a window's whole ledger (:func:`whole_ledger`), an earlier
job's committed windows published (:func:`publish_staged`), snapshots written before the job
recorded its parameters given them (:func:`record_snapshot_parameters`), and the metadata every
snapshot is written with (:func:`_ledger_file`). Imports no Beam.

Snapshots are incremental: a shard's snapshot of a window is whole every ``--full-snapshot-every``
windows (:data:`renyi_stream.pipelines.streaming.options.FULL_SNAPSHOT_EVERY`) and at the job's first
and last window, and otherwise a delta, the ledger rows of the users charged in that window
(:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`), marked so in its metadata
(``renyi_stream.snapshot``, and ``renyi_stream.base_window``: the window of the full snapshot it
goes over). A job continuing from a delta window rebuilds each shard from that full snapshot and
the deltas after it (:func:`_whole_snapshot`); :func:`whole_ledger` does it for an audit.

The schedule is finite (``--start..--end``); to go on, start a new job after ``--end`` with
``--previous-ledger`` pointing at the last released window's snapshots, every shard's:
``<earlier --output>/ledger/window_id=<W>/*/*.parquet``. Each snapshot records its window, its
shard and the job's ``--shards`` in its Parquet schema metadata. Before anything is built,
:func:`_previous_ledger` refuses (:class:`renyi_stream.pipelines.beam.job_options.RunRefused`, naming
``--previous-ledger``, the glob and what is wrong) a glob that matches a file not written as
``.../window_id=<W>/shard=<S>/...``, snapshots of more than one window (or of one window under
two roots), two files of one shard, a window other than the last one released under
``--releases-parquet`` (an older snapshot would restart users from an older, smaller budget: the
message names both windows and the glob to give instead), or not exactly shards ``0..N-1`` of
the job that wrote it (``N`` as its snapshots record it; for snapshots without that record, one
more than the highest ``shard=`` folder of that window, and every such folder must be matched).
It also refuses ``none`` when windows are released (users would restart from zero), and a
snapshot when no window is released under ``--releases-parquet`` (nothing to check it is the
latest against: give the root the earlier job released to). This run's ``--shards`` may differ
from the earlier job's: the snapshot is read whole and split again by ``hash(user) % --shards``.

A ledger keeps for life the configuration it was started with, as every job's does
(:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`): each snapshot records it in its schema
metadata (``renyi_stream.<field>``, :meth:`LedgerConfig.to_snapshot_metadata`): the promise
``epsilon``, ``delta``, ``norm_budget``, ``accounting``; its calibration ``rho``, ``noise_std``,
``tracker_step``; ``id_type``, ``key_fingerprint``, ``window_seconds``, ``origin_seconds``,
``releases`` (the ``--releases-parquet`` root), the ledger's id and the job's ``--shards``, floats
as their ``repr``. Before anything is built, :func:`_continued` reads them back and checks this
run against them (:meth:`LedgerConfig.continued_from`; release roots normalised as
:func:`renyi_stream.pipelines.beam.object_store.absolute` does, so ``gs://b/r/`` is ``gs://b/r``), refusing
and naming every differing parameter with the ledger's value and this run's: another
``--epsilon``, ``--delta``, ``--norm-budget``, ``--accounting``, noise key or ``--window`` would
change every user's promise mid-stream, their used budgets having been charged under the old
one, and a snapshot of a job releasing under another root (a staging job's, of the right window
id) charged its users for other releases. The budget and the noise std and tracker step it gives
are kept as recorded. Snapshots that do not record the parameters (written before the job
recorded them) are refused too: they cannot be checked. :func:`record_snapshot_parameters`
copies them to a new ledger root recording the earlier job's arguments, after checking what the
snapshots can confirm (the ledger's budget, tracker step and id type); give it the earlier job's
own arguments.

The ledger's identity, ``renyi_stream.ledger_id``
(:data:`renyi_stream.pipelines.streaming.file_metadata.SNAPSHOT_LEDGER_ID`): a new job draws
one, a continuing job keeps the snapshots' (refused when its shards record different ones), and
the release noise is bound to it (:class:`renyi_stream.stream.noise.NoiseBinding`), so another ledger given
the same key draws independent noise. Snapshots written before ledger ids existed record none:
the job continuing them draws a new one (their released windows keep their values).

The ledger lives in the runner's keyed state between (checkpointed by Flink together with the
Kafka offsets, committed with each bundle by Dataflow's streaming engine); ``deploy/README.md``
has the recovery story. A job lost for good is run again with its command line
(:mod:`renyi_stream.pipelines.streaming.recovery`). A job given an earlier job's snapshots of a
window as ``--previous-ledger`` publishes that job's staged windows after the last public one
through that window first (:func:`publish_staged`).
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Sequence

import pyarrow as pa

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.beam.publication import PublicReleaseFiles, StagedReleases
from renyi_stream.pipelines.streaming.dry_run import _previewed
from renyi_stream.pipelines.streaming.file_metadata import (SNAPSHOT_BASE, SNAPSHOT_KIND, SNAPSHOT_PREVIOUS_RUN,
                                                            SNAPSHOT_QUERIES, SNAPSHOT_QUERY_PLAN, SNAPSHOT_RUN,
                                                            SNAPSHOT_SHARD, SNAPSHOT_SHARDS, SNAPSHOT_WINDOW, _metadata)
from renyi_stream.pipelines.streaming.options import ID_TYPE, key_fingerprint, parse_args
from renyi_stream.pipelines.streaming.recovery import claim_lineage, snapshot_runs
from renyi_stream.pipelines.streaming.state_folder import (STAGED_RELEASES, _snapshot_glob, _snapshot_place,
                                                           _write_named)
from renyi_stream.stream.engine.ledger_config import SNAPSHOT_PREFIX, LedgerConfig, LedgerConfigError, snapshot_key
from renyi_stream.stream.engine.publication import publish_outbox
from renyi_stream.stream.engine.shard_state import merge_deltas
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import new_ledger_id
from renyi_stream.stream.private_files import PrivateFileError
from renyi_stream.stream.schema import USER_ID, WindowSpec

def _ledger_file(item: tuple[int, int, pa.Table], *, recorded: dict[bytes, bytes],
                 queries: dict[str, int] | None = None, plan: list[dict] | None = None,
                 runs: tuple[str | None, str | None] = (None, None)) -> tuple[str, pa.Table]:
    """``(shard, window, ledger)`` -> ``("window_id=W/shard=S", ledger)``, the snapshot recording
    the ledger's configuration ``recorded`` (:meth:`LedgerConfig.to_snapshot_metadata`: what it
    keeps for life, its id and the job's shard count) and its window and shard in its schema
    metadata; with ``queries`` (``{query_id: first window}``), those answered through its window
    (``SNAPSHOT_QUERIES``), with ``plan`` the job's query plan (``SNAPSHOT_QUERY_PLAN``), and
    with ``runs`` the job's run id and its parent's (``SNAPSHOT_RUN``, ``SNAPSHOT_PREVIOUS_RUN``,
    :mod:`renyi_stream.pipelines.streaming.file_metadata`)."""
    shard, window, table = item
    extra = {SNAPSHOT_WINDOW: str(int(window)), SNAPSHOT_SHARD: str(int(shard))}
    if None not in runs:
        extra[SNAPSHOT_RUN], extra[SNAPSHOT_PREVIOUS_RUN] = runs
    if queries is not None:
        extra[SNAPSHOT_QUERIES] = json.dumps({q: int(f) for q, f in sorted(queries.items()) if f <= int(window)},
                                             sort_keys=True)
    if plan is not None:
        extra[SNAPSHOT_QUERY_PLAN] = json.dumps(plan, sort_keys=True)
    metadata = {**(table.schema.metadata or {}), **recorded, **{k.encode(): v.encode() for k, v in extra.items()}}
    return f"window_id={int(window)}/shard={int(shard)}", table.replace_schema_metadata(metadata)


def _check_snapshot_paths(pattern: str, paths: Sequence[str], *, releases: str,
                          released: Sequence[int]) -> tuple[str, int, dict[int, str]]:
    """``(ledger root, window, {shard: path})`` of the files ``--previous-ledger`` matched, refused
    (:class:`renyi_stream.pipelines.beam.job_options.RunRefused`) unless they are this job's snapshots of one window,
    at most one file per shard, and that window is the last one released under ``releases``."""
    option = f"--previous-ledger {pattern!r}"
    last = max(released) if released else None
    places = {path: _snapshot_place(path) for path in paths}
    foreign = [path for path, place in places.items() if place is None]
    if foreign:
        hint = (f"; give the last released window's, e.g. --previous-ledger "
                f"'<earlier --output>/ledger/window_id={last}/*/*.parquet'" if last is not None else "")
        raise launch.RunRefused(
            f"{option} matches {len(foreign)} file(s) that are not ledger snapshots of this job, e.g. {foreign[0]}: "
            f"the job writes them as <output>/ledger/window_id=<W>/shard=<S>/<name>.parquet{hint}")
    windows = sorted({window for _, window, _ in places.values()})
    roots = sorted({root for root, _, _ in places.values()})
    if len(windows) > 1:
        suggest = f": give the last released window's, '{_snapshot_glob(roots[0], last)}'" if last is not None else ""
        raise launch.RunRefused(
            f"{option} matches the snapshots of {len(windows)} windows ({windows[:5]}): a ledger to continue is one "
            f"window's snapshot, every shard of it, and read together these would count users twice or mix "
            f"budgets of different days{suggest}")
    (window,) = windows
    if len(roots) > 1:
        raise launch.RunRefused(f"{option} matches snapshots of window {window} under {len(roots)} ledger roots "
                              f"({roots[:3]}): give the snapshot of one job, '{_snapshot_glob(roots[0], window)}'")
    (root,) = roots
    if last is None:
        raise launch.RunRefused(
            f"{option} is the snapshot of window {window}, but no window is released under --releases-parquet "
            f"{releases}: only the releases tell whether it is the snapshot of the last released window (an "
            f"older one would restart users from an older, smaller budget), so give the --releases-parquet root "
            f"the earlier job released to")
    if window != last:
        state = "an earlier window" if window < last else "a window that is not released"
        raise launch.RunRefused(
            f"{option} is the snapshot of window {window} ({state}), but the last window released under {releases} "
            f"is {last}: users would go on from the budget they had after window {window}, not after {last}, and be "
            f"under-charged; give window {last}'s snapshots, e.g. --previous-ledger '{_snapshot_glob(root, last)}'")
    by_shard: dict[int, list[str]] = {}
    for path, (_, _, shard) in places.items():
        by_shard.setdefault(shard, []).append(path)
    repeated = {shard: sorted(found) for shard, found in by_shard.items() if len(found) > 1}
    if repeated:
        shard, found = min(repeated.items())
        raise launch.RunRefused(
            f"{option} matches {len(found)} files of shard {shard} of window {window} ({found[:2]}): a shard writes "
            f"one snapshot per window, two are diverging replays of it and neither is known to be the one charged")
    return root, window, {shard: found[0] for shard, found in by_shard.items()}


def _recorded_shards(files: dict[int, str], tables: dict[int, pa.Table], window: int, pattern: str) -> int | None:
    """The earlier job's shard count as its snapshots record it (None for snapshots written before
    it was recorded); RunRefused when a file's recorded window or shard is not its folder's, or
    the files record different counts."""
    counts = set()
    for shard, table in tables.items():
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        said = (meta.get(SNAPSHOT_WINDOW), meta.get(SNAPSHOT_SHARD))
        if said != (None, None) and said != (str(window), str(shard)):
            raise launch.RunRefused(f"--previous-ledger {pattern!r}: {files[shard]} records window {said[0]}, shard "
                                  f"{said[1]} but lies in window_id={window}/shard={shard}: a snapshot moved by hand")
        if SNAPSHOT_SHARDS in meta:
            counts.add(int(meta[SNAPSHOT_SHARDS]))
    if len(counts) > 1:
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: the snapshots of window {window} record different "
                              f"shard counts {sorted(counts)}: they are not one job's")
    return counts.pop() if counts else None


def _check_every_shard(pattern: str, root: str, window: int, present: set[int], recorded: int | None) -> None:
    """RunRefused unless ``present`` is exactly shards 0..N-1 of the job that wrote window
    ``window``'s snapshot: N as the snapshots record it, else one more than the highest shard
    folder there is; and every shard folder under ``root/window_id=<window>`` is matched."""
    folder = store.join(root, f"window_id={int(window)}")
    matched = store.match(store.join(folder, "shard=*", "*.parquet"))
    on_disk = {place[2] for place in (_snapshot_place(path) for path in matched) if place is not None}
    if recorded is not None:
        n_shards, source = recorded, "as its snapshots record"
    else:
        n_shards, source = max(on_disk | present) + 1, f"as the shard folders under {folder} say"
    missing = sorted(set(range(n_shards)) - present)
    beyond = sorted((present | on_disk) - set(range(n_shards)))
    if not missing and not beyond:
        return
    if beyond:
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: window {window} has snapshots of shard(s) {beyond[:10]} "
                              f"beyond the {n_shards} shards of the job that wrote it ({source}): not one job's")
    absent = [s for s in missing if s not in on_disk]
    lost = (f"; shard(s) {absent[:10]} have no snapshot under {folder} at all: the earlier job stopped before "
            f"writing them or they were lost, and that ledger cannot be continued without them" if absent else "")
    raise launch.RunRefused(
        f"--previous-ledger {pattern!r} matches {len(present)} of the {n_shards} shards of window {window} "
        f"({source}): missing shard(s) {missing[:10]}{' ...' if len(missing) > 10 else ''}, whose users would "
        f"restart from zero budget; give every shard's snapshot, '{_snapshot_glob(root, window)}'{lost}")


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _compared(name: str, text: str) -> str:
    """A recorded value as compared: a release root normalised as :func:`renyi_stream.pipelines.beam.object_store.absolute`
    does (``gs://b/r/`` is ``gs://b/r``), anything else as it is."""
    return store.absolute(text) if name == "releases" else text


def _recorded_config(pattern: str, files: dict[int, str], metadata: dict[int, dict[str, str]]) -> LedgerConfig:
    """The ledger configuration every shard's snapshot records
    (:meth:`LedgerConfig.from_snapshot_metadata`, the release root normalised as
    :func:`renyi_stream.pipelines.beam.object_store.absolute` does). RunRefused when a snapshot does not record
    it (written before the job recorded it: it cannot be checked; the message says how to go on),
    records a malformed value, or the shards record different values (not one ledger's)."""
    option = f"--previous-ledger {pattern!r}"
    configs: dict[int, LedgerConfig] = {}
    for shard, meta in sorted(metadata.items()):
        try:
            config = LedgerConfig.from_snapshot_metadata(meta, where=f"{option}: {files[shard]}", n_shards=len(files))
        except LedgerConfigError as exc:
            if not exc.missing:
                raise launch.RunRefused(str(exc)) from None
            raise launch.RunRefused(
                f"{option}: {files[shard]} does not record the parameters its ledger keeps for life "
                f"({list(exc.missing)}; written before the streaming job recorded them), so this run cannot check "
                f"that it keeps the promise the earlier job made to every user (a larger epsilon or norm budget, "
                f"another accounting, delta, key, window length or release root would silently break it). If this "
                f"run's parameters are exactly the earlier job's, record them in a copy of the snapshots with "
                f"renyi_stream.pipelines.streaming.snapshots.record_snapshot_parameters(<this glob>, <a new ledger "
                f"root>, <the earlier job's arguments>) (deploy/README.md, 'Streaming mode') and give the copy as --previous-ledger"
            ) from None
        configs[shard] = replace(config, releases=_previewed(store.absolute(config.releases)))
    for name in (f.name for f in fields(LedgerConfig)):
        values = {shard: getattr(config, name) for shard, config in configs.items()}
        if len(set(values.values())) > 1:
            shown = {shard: values[shard] for shard in sorted(values)[:6]}
            what = "ledger ids" if name == "ledger_id" else f"values of {name}"
            raise launch.RunRefused(f"{option}: the snapshots record different {what} (by shard: {shown}): they are "
                                    "not one ledger's")
    return configs[min(configs)]


def _continued(pattern: str, files: dict[int, str], metadata: dict[int, dict[str, str]],
               wanted: LedgerConfig) -> LedgerConfig:
    """This run's configuration ``wanted`` continuing the ledger the snapshots record
    (:func:`_recorded_config`, :meth:`LedgerConfig.continued_from`: RunRefused naming every field
    whose value differs, with the ledger's value and this run's; the ledger's budget, noise std,
    tracker step and id kept), with a new ledger id for snapshots from before ledger ids (their
    released windows keep their values, later ones are drawn for the new id)."""
    option = f"--previous-ledger {pattern!r}"
    try:
        config = wanted.continued_from(_recorded_config(pattern, files, metadata), where=option)
    except LedgerConfigError as exc:
        raise launch.RunRefused(str(exc)) from None
    return config if config.ledger_id is not None else replace(config, ledger_id=new_ledger_id())


def _read_snapshots(pattern: str, *, releases: str,
                    released: Sequence[int]) -> tuple[str, int, dict[int, str], dict[int, pa.Table]]:
    """``(ledger root, window, {shard: path}, {shard: table})``: every shard's snapshot of the last
    window released under ``releases`` that ``pattern`` matches, checked as :func:`_previous_ledger` says."""
    matched = store.match(store.absolute(pattern))
    if not matched:
        raise launch.RunRefused(f"--previous-ledger {pattern!r} matches no file")
    root, window, files = _check_snapshot_paths(pattern, matched,
                                                releases=releases, released=released)
    try:
        tables = {shard: store.read_parquet(path) for shard, path in sorted(files.items())}
    except PrivateFileError as exc:  # a snapshot others may read: the curator decides what leaked
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: {exc}") from None
    _check_every_shard(pattern, root, window, set(files), _recorded_shards(files, tables, window, pattern))
    tables = {shard: _whole_snapshot(pattern, root, window, shard, table) for shard, table in tables.items()}
    return root, window, files, tables


def _whole_snapshot(pattern: str, root: str, window: int, shard: int, table: pa.Table) -> pa.Table:
    """Shard ``shard``'s whole ledger at ``window`` from its snapshot ``table`` there: the table
    itself when it is full; for a delta (:data:`renyi_stream.pipelines.streaming.file_metadata.SNAPSHOT_KIND`), the
    full snapshot of its base window with the deltas of the windows after it through ``window`` over
    it (:func:`renyi_stream.stream.engine.shard_state.merge_deltas`), with ``table``'s metadata.
    RunRefused, naming the file missing or doubled, when that chain is not one file per window."""
    meta = _metadata(table)
    if meta.get(SNAPSHOT_KIND, "full") != "delta":
        return table
    base = int(meta[SNAPSHOT_BASE])
    chain = []
    for w in range(base, int(window)):
        chain.append(store.read_parquet(_one_snapshot(pattern, root, w, shard, int(window), rebuilt="ledger")))
    if _metadata(chain[0]).get(SNAPSHOT_KIND, "full") != "full":
        raise launch.RunRefused(f"--previous-ledger {pattern!r}: shard {shard}'s snapshot of window {base}, the base "
                                f"of window {window}'s delta, is not a full snapshot")
    merged = merge_deltas(chain[0], [(w, t) for w, t in zip(range(base + 1, int(window) + 1), [*chain[1:], table])])
    extra = {k: v for k, v in (table.schema.metadata or {}).items() if k.decode() not in (SNAPSHOT_KIND, SNAPSHOT_BASE)}
    return merged.replace_schema_metadata({**(merged.schema.metadata or {}), **extra, SNAPSHOT_KIND.encode(): b"full"})


def _previous_ledger(pattern: str, wanted: LedgerConfig, *, released: Sequence[int],
                     id_type_declared: bool = True) -> tuple[pa.Table, LedgerConfig, dict[str, int] | None]:
    """The ledger to continue from, this run's configuration continuing it and the queries it has
    answered: every shard's snapshot of the last window released under ``wanted.releases``, read
    together (a ``--shards`` other than the earlier job's re-shards it by user), ``wanted`` with
    the budget, noise std, tracker step and ledger id the snapshots record (:func:`_continued`),
    and ``{query_id: first window answered}`` as they record it (:data:`SNAPSHOT_QUERIES`; None for
    snapshots written before it was recorded); for a new ledger, an empty one, ``wanted`` with a
    new ledger id, and None. Without ``id_type_declared``, the id type is the one the snapshots
    record (a ledger's for life) rather than ``wanted``'s.

    RunRefused, before anything is read into the graph, when ``pattern`` is ``none`` but windows
    are released; when it matches no file, a file that is not a snapshot this job wrote
    (``.../window_id=<W>/shard=<S>/...``), snapshots of more than one window or job, or two files
    of one shard; when no window is released (nothing to check the snapshot against), or its
    window is not the last released one; when it misses a shard of the job that wrote it (the
    count its snapshots record, or else the shard folders there); when the snapshots do not
    record the ledger's configuration or record values other than ``wanted``'s
    (:func:`_continued`); and when the ledger itself is inconsistent
    (:meth:`renyi_stream.stream.ledger.Ledger.from_arrow`)."""
    releases = wanted.releases
    if pattern.lower() == "none":
        if released:
            raise launch.RunRefused(f"the releases under {releases} include window(s) {list(released)[:5]} but no "
                                  "--previous-ledger was given: users would restart from zero budget")
        return wanted.empty_ledger().to_arrow(), replace(wanted, ledger_id=new_ledger_id()), None
    _, _, files, tables = _read_snapshots(pattern, releases=releases, released=released)
    metadata = {shard: _metadata(t) for shard, t in tables.items()}
    if not id_type_declared:  # the ledger's own, as its snapshots record it
        recorded = {meta.get(snapshot_key("id_type"), meta.get("id_type")) for meta in metadata.values()}
        if len(recorded) == 1 and next(iter(recorded)) in ("int64", "string"):
            wanted = replace(wanted, id_type=recorded.pop())
    config = _continued(pattern, files, metadata, wanted)
    template = config.empty_ledger().to_arrow()
    parts = [table.replace_schema_metadata(None).cast(template.schema.remove_metadata()) for table in tables.values()]
    table = pa.concat_tables(parts).replace_schema_metadata(template.schema.metadata)
    # The rows only: nulls, a user listed twice, used budgets outside [0, the ledger's rho], trackers below
    # them. The metadata it reads is the continued configuration's; the snapshots' own configuration
    # was checked against this run's by _continued above.
    Ledger.from_arrow(table)
    return table, config, _snapshot_queries(pattern, files, metadata)


def whole_ledger(ledger_root: str, window: int) -> pa.Table:
    """The ledger every shard's snapshot of ``window`` under ``ledger_root`` (a job's
    ``<output>/ledger``) holds, delta chains rebuilt (:func:`_whole_snapshot`), sorted by user id,
    without metadata: what a job continuing from that window starts from. For audits and tests;
    unchecked otherwise (:func:`_previous_ledger` checks what a job continues)."""
    matched = store.match(_snapshot_glob(ledger_root, window))
    pattern = _snapshot_glob(ledger_root, window)
    parts = []
    for path in sorted(matched):
        _, _, shard = _snapshot_place(path)
        table = _whole_snapshot(pattern, ledger_root, window, shard, store.read_parquet(path))
        parts.append(table.replace_schema_metadata(None))
    return pa.concat_tables(parts).sort_by(USER_ID)


def publish_staged(pattern: str, releases: str) -> list[int]:
    """Publish what an earlier job committed but did not publish: a job lost after every shard's
    snapshot of window ``W`` was written, but before its release files were public, left those
    windows staged under its ``--output``
    (:data:`renyi_stream.pipelines.streaming.state_folder.STAGED_RELEASES`). Given ``W``'s snapshots as
    ``pattern`` (``--previous-ledger``), publish every staged window after the last one public under
    ``releases`` through ``W``, in window order, first write wins
    (:func:`renyi_stream.stream.engine.publication.publish_outbox`): ``W``'s snapshots hold the charges of every
    window through ``W``, so each of those answers has a durable ledger that charged its users.
    Returns the windows newly published (then ``W`` is the last released window, and the job
    continues from its snapshots as from any other's).

    Publishes nothing when ``pattern`` is not one job's snapshots of one window, when nothing is
    public yet (where the schedule began is then unknown, and a window before the first one staged
    would never be released: start the ledger anew, nothing of it was public), when a window from
    the last public one to ``W`` is not staged (it cannot be published, so ``W`` cannot become the
    last released: :func:`_previous_ledger` refuses ``W``'s snapshots, naming the window to continue
    from instead), or when the snapshots record another release root. RunRefused (nothing
    published) when the snapshots of ``W`` miss a shard: the charge is not durable. The windows
    are the earlier job's: published under its lineage claim (:func:`claim_lineage`, the run ids
    the snapshots record), LineageConflict (nothing published) when another run holds it."""
    if pattern.lower() == "none":
        return []
    matched = store.match(store.absolute(pattern))
    places = {_snapshot_place(path) for path in matched}
    if not places or None in places or len({(root, window) for root, window, _ in places}) != 1:
        return []  # not one job's snapshots of one window: _previous_ledger refuses them, saying why
    root, window, _ = next(iter(places))
    if not root.endswith("/ledger"):
        return []
    staging = store.join(root[:-len("/ledger")], STAGED_RELEASES)
    public = sorted(store.release_windows_present(releases))
    pending = list(range(public[-1] + 1, window + 1)) if public else []
    if not pending or not set(pending) <= store.release_windows_present(staging):
        return []
    _, _, files, tables = _read_snapshots(pattern, releases=releases, released=[*public, window])
    recorded = _recorded_config(pattern, files, {shard: _metadata(t) for shard, t in tables.items()})
    if store.absolute(recorded.releases) != releases:
        return []  # another root's ledger: _previous_ledger refuses it
    run, previous_run = snapshot_runs(pattern)  # the earlier job's windows: published under its claim
    claim_lineage(releases, run, previous_run)
    return list(publish_outbox(StagedReleases(staging, pending), PublicReleaseFiles(releases, run=run)).windows)


def _one_snapshot(pattern: str, ledger: str, window: int, shard: int, of_window: int,
                  rebuilt: str = "prepaid rows") -> str:
    """The path of shard ``shard``'s one ledger snapshot of ``window`` under ``ledger``, a window of
    the delta chain of ``of_window``'s; RunRefused when there is not exactly one, saying that the
    shard's ``rebuilt`` (its ledger, its prepaid rows) cannot be rebuilt."""
    matched = store.match(store.join(ledger, f"window_id={int(window)}", f"shard={int(shard)}", "*.parquet"))
    if len(matched) != 1:
        raise launch.RunRefused(
            f"--previous-ledger {pattern!r}: shard {shard}'s snapshot of window {of_window} is a delta, but window "
            f"{window} of its chain has {len(matched)} snapshot file(s) of that shard under {ledger}, "
            f"not one: the shard's {rebuilt} cannot be rebuilt")
    return matched[0]


def _snapshot_queries(pattern: str, files: dict[int, str], metadata: dict[int, dict[str, str]]) -> dict[str, int] | None:
    """``{query_id: first window answered}`` as the snapshots record it (:data:`SNAPSHOT_QUERIES`),
    None when none does (written before it was recorded). RunRefused for a malformed record."""
    found: dict[str, int] = {}
    recorded = False
    for shard, meta in sorted(metadata.items()):
        text = meta.get(SNAPSHOT_QUERIES)
        if text is None:
            continue
        recorded = True
        try:
            found.update({str(q): int(w) for q, w in json.loads(text).items()})
        except (ValueError, TypeError, AttributeError):
            raise launch.RunRefused(f"--previous-ledger {pattern!r}: {files[shard]} records a malformed "
                                    f"{SNAPSHOT_QUERIES}: it was edited") from None
    return found if recorded else None


def record_snapshot_parameters(pattern: str, destination: str, argv: Sequence[str]) -> list[str]:
    """Copy snapshots written before the job recorded its parameters to a new ledger root
    ``destination``, recording those of ``argv``; returns the paths written. Give the copy
    (``<destination>/window_id=<W>/*/*.parquet``) as the next job's ``--previous-ledger``.

    ``argv`` must be **the earlier job's arguments**, as it was launched (the options of
    ``python -m renyi_stream.pipelines.streaming``): what is recorded is what every later job is checked
    against, and the snapshots can confirm only part of it. Checked, RunRefused otherwise: the
    snapshots are every shard's of the last window released under ``argv``'s
    ``--releases-parquet`` (as :func:`_previous_ledger` checks them), ``destination`` is not
    their ledger root (a snapshot is never rewritten), and ``argv`` gives the budget (rho, up to
    another version's last bits: the copy then records the snapshots' own budget and the noise std
    it gives), tracker step and id type of the snapshots' ledgers and any parameter they already
    record. Not checkable: a delta, epsilon and accounting giving the same rho, the norm budget,
    the key and the window length."""
    # The earlier job's arguments are the Beam job's (it wrote every snapshot from before recorded
    # parameters): an option neither that job's nor Beam's is refused, as that job refused it.
    args, _ = parse_args(argv, runner_options=launch.refuse_unknown_options)
    spec = WindowSpec(length_seconds=launch.window_seconds(args.window))
    _, fingerprint, _ = key_fingerprint(args)
    releases = store.absolute(args.releases_parquet)
    config = LedgerConfig.from_promise(epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget,
                                       accounting=args.accounting, id_type=args.id_type or ID_TYPE,
                                       key_fingerprint=fingerprint,
                                       window=spec, n_shards=args.shards, releases=releases)
    root, window, files, tables = _read_snapshots(pattern, releases=releases,
                                                  released=sorted(store.release_windows_present(releases)))
    if store.absolute(destination) == root:
        raise launch.RunRefused(f"the copy's root {destination} is the snapshots' own: give a new ledger root")
    budgets = {_metadata(table).get("budget") for table in tables.values()}
    if len(budgets) == 1 and None not in budgets:
        # The budget is the evidence that argv is the earlier job's: it must be argv's calibration up to
        # another version's last bits (a relative 1e-9 down; resume's float rounding up). Then the copy
        # records the budget the snapshots were charged against, as a continuing job keeps it.
        recorded = _float_or_none(next(iter(budgets)))
        if recorded is not None and config.rho * (1.0 - 1e-9) <= recorded:
            try:
                config = config.resumed(recorded, where=f"{pattern!r}")
            except LedgerConfigError as exc:
                raise launch.RunRefused(str(exc)) from None
    config = replace(config, n_shards=len(files))  # the earlier job's: every one of its shards is here
    text = {key.decode()[len(SNAPSHOT_PREFIX):]: value.decode() for key, value in config.to_snapshot_metadata().items()}
    own = (("budget", "rho"), ("tracker_step", "tracker_step"), ("id_type", "id_type"))  # Ledger.to_arrow's
    for shard, table in tables.items():
        meta = _metadata(table)
        keys = [*own, *((snapshot_key(name), name) for name in text if snapshot_key(name) in meta)]
        differ = [(key, name) for key, name in keys
                  if key not in meta or _compared(name, meta[key]) != _compared(name, text[name])]
        if differ:
            raise launch.RunRefused(
                f"{files[shard]} records {({key: meta.get(key) for key, _ in differ})}, these arguments give "
                f"{({key: text[name] for key, name in differ})}: they are not the arguments of the job that wrote it")
    recorded_config = config.to_snapshot_metadata()
    return [_write_named(store.absolute(destination), *_ledger_file((shard, window, table), recorded=recorded_config))
            for shard, table in sorted(tables.items())]

