"""A running query's committed state in the streaming job, under any runner: its release state file
(:func:`running_state_table`, read back by :func:`running_state_of`), where its estimates continue
from (:class:`EstimateContinuation`), and the running totals' state beside the ledger snapshots a
job continues (:func:`previous_running_state`: every shard's prepaid rows, every query's release
state). Running totals (docs/running_totals.md) go through the batch jobs' engine objects: each
shard's per-user prepaid rows (:class:`renyi_stream.stream.engine.running.PrepaidUsers`) live in its
keyed state beside its ledger and are written every window as its ledger snapshot is, whole or a
delta of the users charged in the window, ``<output>/prepaid/window_id=<W>/shard=<S>/``
(:func:`renyi_stream.pipelines.streaming.commits.write_prepaid`); each running query's release state
(:class:`renyi_stream.stream.engine.running.RunningRelease`) lives in the keyed state of the running
release, advanced in window order, and is staged with the window's releases,
``<output>/running/window_id=<W>/`` (with the state of the estimates' decoder: ``1 + buffers`` rows
for BLT); a window's commit marker waits for both. A restarted or continuing job restores them from
the window it continues from, refusing a stored state of another strategy, horizon or first window,
and a schedule that would skip one of a running query's windows, by name. Imports no Beam."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.streaming.file_metadata import (PREPAID_ROWS, PREPAID_USERS, RUNNING_DECODER,
                                                            RUNNING_QUERY_ID, RUNNING_RAW, SNAPSHOT_BASE, SNAPSHOT_KIND,
                                                            _metadata)
from renyi_stream.pipelines.streaming.snapshots import _one_snapshot
from renyi_stream.pipelines.streaming.state_folder import (PREPAID, RUNNING_STATE, _matched, _schema_metadata,
                                                           _snapshot_place)
from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.engine.running import RunningRelease
from renyi_stream.stream.engine.shard_state import merge_deltas, running_base

def running_state_table(release: RunningRelease, decoder: np.ndarray) -> pa.Table:
    """A running query's state after a window, as the streaming job commits it with the window:
    :meth:`RunningRelease.to_arrow` with the query's id (:data:`RUNNING_QUERY_ID`) and the state of
    its estimates' decoder after the window, with the number of windows it has decoded
    (:data:`RUNNING_DECODER`), in the schema metadata."""
    table = release.to_arrow()
    decoder = np.asarray(decoder, dtype=np.float64)
    extra = {RUNNING_QUERY_ID: release.query_id,
             RUNNING_DECODER: json.dumps({"windows": release.next_window - release.start_window,
                                          "shape": list(decoder.shape), "values": decoder.ravel().tolist()})}
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          **{k.encode(): v.encode() for k, v in extra.items()}})


@dataclass(frozen=True, eq=False)
class EstimateContinuation:
    """Where a running query's estimates continue from after a committed window: the decoder's
    state then and the number of windows it has decoded
    (:meth:`renyi_stream.stream.continual.strategies.Strategy.decode_online`; what this version
    commits), or, in a state file an earlier version wrote, the releases ``y`` from the query's
    first window through that window, folded into it when first used."""

    decoder: np.ndarray | None = None
    windows: int | None = None
    releases: tuple[tuple[int, tuple[float, ...]], ...] = ()

    def check(self, start_window: int, next_window: int) -> None:
        """ValueError unless this continues a query first released at ``start_window`` whose next
        window is ``next_window`` (its release state's): a decoder of as many windows, finite, or
        recorded releases of exactly those windows. The decoder's shape is checked against the
        query's strategy when it is used."""
        expected = int(next_window) - int(start_window)
        if self.decoder is not None:
            if self.windows != expected:
                raise ValueError(f"the estimates' decoder state has decoded {self.windows} window(s), its release "
                                 f"state {expected} (windows {int(start_window)} to {int(next_window) - 1})")
            if not np.isfinite(self.decoder).all():
                raise ValueError("the estimates' decoder state has non-finite values")
            return
        windows = [w for w, _ in self.releases]
        if windows != list(range(int(start_window), int(next_window))):
            raise ValueError(f"the recorded releases are for windows {windows[:5]}..., not every window from the "
                             f"query's first window {int(start_window)} to {int(next_window) - 1}")

    def state(self, running: RunningQuery, next_window: int) -> np.ndarray | None:
        """The decoder's state for ``running`` before ``next_window`` (its release state's next
        window), checked (:meth:`check`; ValueError naming the query)."""
        try:
            self.check(running.start_window, next_window)
        except ValueError as exc:
            raise ValueError(f"running query {running.query_id!r}: {exc}") from None
        if self.decoder is not None:
            return self.decoder
        series = [np.asarray(y, dtype=np.float64).reshape(running.rows_at(w), running.dim) for w, y in self.releases]
        return running.strategy.decoder_state(series)


def running_state_of(table: pa.Table) -> tuple[str, pa.Table, EstimateContinuation]:
    """:func:`running_state_table` back: ``(query_id, release state table, where its estimates
    continue from)``; a file an earlier version wrote records the releases ``y`` instead
    (:data:`RUNNING_RAW`). The release state is checked when it is restored
    (:meth:`RunningRelease.from_arrow`), the continuation against it by
    :meth:`EstimateContinuation.check`."""
    meta = dict(table.schema.metadata or {})
    try:
        query_id = meta.pop(RUNNING_QUERY_ID.encode()).decode()
        if RUNNING_DECODER.encode() in meta:
            recorded = json.loads(meta.pop(RUNNING_DECODER.encode()))
            decoder = np.asarray(recorded["values"], dtype=np.float64).reshape([int(n) for n in recorded["shape"]])
            continuation = EstimateContinuation(decoder=decoder, windows=int(recorded["windows"]))
        else:
            raw = json.loads(meta.pop(RUNNING_RAW.encode()))
            continuation = EstimateContinuation(releases=tuple((int(w), tuple(float(v) for v in y)) for w, y in raw))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"a running-state file's metadata is incomplete or malformed: {exc!r}") from None
    return query_id, table.replace_schema_metadata(meta), continuation


def previous_running_state(pattern: str) -> tuple[dict[str, pa.Table], dict[str, pa.Table],
                                                   dict[str, EstimateContinuation]]:
    """The running totals' state beside the ledger snapshots ``pattern`` (``--previous-ledger``, or
    a restarted job's own last committed window), as the streaming graph continues it:
    ``(per-user prepaid rows, release states, where the estimates continue from)``, each by running
    query id. The prepaid rows are every shard's at that window
    (:func:`renyi_stream.pipelines.streaming.commits.write_prepaid`; a shard whose snapshot is a delta
    rebuilt from the full prepaid file of its base window and the deltas after it,
    :func:`_shard_prepaid`) concatenated per query (re-split by this job's ``--shards``), the
    release states and estimate decoders those staged with the window
    (:class:`renyi_stream.pipelines.streaming.commits.WindowStaging`). Empty for ``none`` or snapshots
    outside a job's ``--output`` (a copy made by
    :func:`renyi_stream.pipelines.streaming.snapshots.record_snapshot_parameters`): a running query
    they should have continued is then refused by the schedule rule (:func:`renyi_stream.stream.engine.shard_state.refuse_running_gaps`).
    RunRefused for a file without its query id, shards disagreeing on a query's metadata, a prepaid
    file of a window missing, doubled or of other rows than its ledger snapshot records
    (:data:`PREPAID_ROWS`), prepaid rows other than the users the shards' ledger snapshots record
    (:data:`PREPAID_USERS`: a lost file would restart its users' prepaid charges from nothing), or
    two release states of one query; the states themselves are checked when restored
    (:class:`renyi_stream.stream.engine.running.PrepaidUsers`, :class:`renyi_stream.stream.engine.running.RunningRelease`)."""
    if pattern.lower() == "none":
        return {}, {}, {}
    snapshots = _matched(store.absolute(pattern))
    places = {_snapshot_place(path) for path in snapshots}
    windows = {(root, window) for root, window, _ in places - {None}}
    if len(windows) != 1 or not next(iter(windows))[0].endswith("/ledger"):
        return {}, {}, {}
    root, window = windows.pop()
    base = root[: -len("/ledger")]
    parts: dict[str, list[pa.Table]] = {}
    recorded: dict[str, int] = {}
    for path in snapshots:
        meta = _schema_metadata(path)
        text = meta.get(PREPAID_USERS)
        for query_id, rows in (json.loads(text) if text else {}).items():
            recorded[query_id] = recorded.get(query_id, 0) + int(rows)
        place = _snapshot_place(path)
        if place is not None:
            for query_id, table in _shard_prepaid(pattern, base, window, place[2], meta).items():
                parts.setdefault(query_id, []).append(table)
    prepaid = {}
    for query_id, tables in sorted(parts.items()):
        if any(t.schema.metadata != tables[0].schema.metadata for t in tables):
            raise launch.RunRefused(f"the prepaid rows of running query {query_id!r} beside --previous-ledger "
                                    f"{pattern!r} disagree between shards on the query's strategy or schedule")
        prepaid[query_id] = pa.concat_tables(tables)
    found = {q: t.num_rows for q, t in prepaid.items() if t.num_rows}
    if found != {q: n for q, n in recorded.items() if n}:
        raise launch.RunRefused(f"the prepaid rows beside --previous-ledger {pattern!r} hold {found} users per running "
                                f"query, its ledger snapshots record {recorded}: a prepaid file is missing or extra, "
                                "and a lost row would restart its user's prepaid charge from nothing")
    releases, estimates = {}, {}
    for path in _matched(store.join(base, RUNNING_STATE, f"window_id={window}", "*.parquet")):
        try:
            query_id, table, continuation = running_state_of(store.read_parquet(path))
        except ValueError as exc:
            raise launch.RunRefused(f"{path}: {exc}") from None
        if query_id in releases:
            raise launch.RunRefused(f"window {window} beside --previous-ledger {pattern!r} holds two release "
                                    f"states of running query {query_id!r}")
        try:  # the estimates continue exactly where the release state does, or the job does not start
            restored = RunningRelease.from_arrow(table)
            continuation.check(restored.start_window, restored.next_window)
        except ValueError as exc:
            raise launch.RunRefused(f"{path}: running query {query_id!r}: {exc}") from None
        releases[query_id], estimates[query_id] = table, continuation
    return prepaid, releases, estimates


def _prepaid_files(pattern: str, base: str, window: int, shard: int) -> dict[str, pa.Table]:
    """Shard ``shard``'s prepaid files of ``window`` in the job folder ``base``, by query id, each
    without its query id and base window in its metadata and with its kind (:data:`SNAPSHOT_KIND`:
    ``full``, also for a file written before prepaid deltas, or ``delta``). RunRefused for a file
    that records no query id, or two files of one query."""
    found: dict[str, pa.Table] = {}
    for path in _matched(store.join(base, PREPAID, f"window_id={int(window)}", f"shard={int(shard)}", "*.parquet")):
        table = store.read_parquet(path)
        meta = dict(table.schema.metadata or {})
        query_id = meta.pop(RUNNING_QUERY_ID.encode(), None)
        if query_id is None:
            raise launch.RunRefused(f"{path} (the prepaid rows beside --previous-ledger {pattern!r}) records no "
                                    f"{RUNNING_QUERY_ID}: it was not written by this job")
        if query_id.decode() in found:
            raise launch.RunRefused(f"shard {shard} has two prepaid files of running query {query_id.decode()!r} in "
                                    f"window {window} beside --previous-ledger {pattern!r}: they are not one job's")
        kind = meta.pop(SNAPSHOT_KIND.encode(), b"full").decode()
        meta.pop(SNAPSHOT_BASE.encode(), None)
        found[query_id.decode()] = table.replace_schema_metadata({**meta, SNAPSHOT_KIND.encode(): kind.encode()})
    return found


def _shard_prepaid(pattern: str, base: str, window: int, shard: int, meta: dict[str, str]) -> dict[str, pa.Table]:
    """Shard ``shard``'s whole prepaid rows at ``window`` by running query, from its prepaid files in
    the job folder ``base``: those of ``window`` when its ledger snapshot (metadata ``meta``) is full;
    for a delta, the full files of its base window (:data:`SNAPSHOT_BASE`) with the deltas of every
    window after it through ``window`` over them (:func:`renyi_stream.stream.engine.shard_state.merge_deltas`),
    as the shard's own state is rebuilt (:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.restore`).
    Each window's files are checked against its ledger snapshot's :data:`PREPAID_ROWS` (one file per
    query with rows, that many rows; recorded from this version on) and their kind against the chain:
    RunRefused naming the window and shard otherwise, since a lost delta would restore its users'
    prepaid rows of an earlier window, and their later charges would be too small."""
    kind = meta.get(SNAPSHOT_KIND, "full")
    chain = [(int(window), meta)]
    if kind == "delta":
        first = int(meta[SNAPSHOT_BASE])
        ledger = store.join(base, "ledger")
        chain = [(w, _schema_metadata(_one_snapshot(pattern, ledger, w, shard, window))) for w in range(first, window)]
        chain.append((int(window), meta))
    files = {}
    for position, (w, recorded_meta) in enumerate(chain):
        files[w] = _prepaid_files(pattern, base, w, shard)
        expected_kind = "full" if position == 0 else "delta"
        wrong = sorted(q for q, t in files[w].items() if _metadata(t).get(SNAPSHOT_KIND) != expected_kind)
        if wrong:
            raise launch.RunRefused(f"shard {shard}'s prepaid file(s) of running query {wrong[0]!r} in window {w} beside "
                                    f"--previous-ledger {pattern!r} are not the {expected_kind} rows its ledger "
                                    "snapshot's chain needs")
        text = recorded_meta.get(PREPAID_ROWS)
        if text is not None:
            rows = {q: int(n) for q, n in json.loads(text).items() if int(n)}
            held = {q: t.num_rows for q, t in files[w].items() if t.num_rows}
            if held != rows:
                raise launch.RunRefused(f"shard {shard}'s prepaid files of window {w} beside --previous-ledger "
                                        f"{pattern!r} hold {held} rows per running query, its ledger snapshot records "
                                        f"{rows}: a prepaid file is missing or extra, and a lost row would restore its "
                                        "user's prepaid charge of an earlier window")
    first_window, *later = [w for w, _ in chain]
    out = {}
    for query_id in sorted({q for tables in files.values() for q in tables}):
        full = files[first_window].get(query_id)
        deltas = [(w, files[w][query_id]) for w in later if query_id in files[w]]
        table = merge_deltas(running_base(full, deltas, query_id), deltas) if deltas else full
        meta_out = dict(table.schema.metadata or {})
        meta_out.pop(SNAPSHOT_KIND.encode(), None)
        out[query_id] = table.replace_schema_metadata(meta_out)
    return out

