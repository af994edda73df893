"""The daily graph for a distributed runner (Flink, Dataflow): state in files, not in DuckDB.

``renyi-stream run`` collects the pipeline's outputs in the launching process and commits them
to the curator's DuckDB ledger in one transaction: that needs the pipeline to run where it was
launched. A Flink or Dataflow job runs elsewhere, so this entry point keeps every piece of state
in object storage (``gs://``, ``s3://``, or local paths standing in for them)::

    python -m renyi_stream.pipelines.distributed \\
        --input 'gs://acme-events/day=2026-03-02/*.parquet' --start 2026-03-02 --end 2026-03-02 \\
        --epsilon 1 --delta 1e-6 --norm-budget 30 \\
        --previous-ledger gs://acme-curator/runs/2026-03-01 --output gs://acme-curator/runs/2026-03-02 \\
        --releases-parquet gs://acme-public/releases \\
        --noise-key-secret projects/acme/secrets/renyi-noise-key/versions/1 \\
        --runner DataflowRunner --project acme --region europe-west1 ...   # any Beam options

What a run reads and writes:

* inputs: globs resolved with Beam's ``FileSystems.match`` at launch (the resolved list, with
  sizes and modification times, is part of the run's identity);
* ``--previous-ledger``: the previous run's ``--output`` (its ``_COMMITTED.json`` manifest and
  the ledger files it lists), or ``none`` for the very first run. Read *inside* the pipeline,
  split by user shard: the launcher never holds the ledger (100M users are ~3.2 GB);
* ``--releases-parquet``: the public release files, ``<root>/window_id=<id>/releases.parquet``
  (:mod:`renyi_stream.queries.release_files`: first write wins), which DuckDB reads with
  ``read_parquet('<root>/*/*.parquet', hive_partitioning = true)``. The pipeline writes them to
  ``<output>/staged-releases/<attempt>/`` and the commit step copies them here only after the
  run's ``_COMMITTED.json`` exists, so a public answer always has a committed ledger that charged
  its users; ``<root>/_lineage/`` records which committed run charged each public window and which
  run continued which ledger (:mod:`renyi_stream.queries.release_lineage`);
* ``--output`` (curator only: sensitive): ``_INTENT.json`` (written at launch), the new ledger
  snapshot ``ledger/<attempt>/part-*.parquet``, per-window counts, dead letters and rows read per
  file, all written by Beam's Parquet sinks; and, last, ``_COMMITTED.json``: written by a step
  that takes every other output as a side input, so it exists only once all of them are
  complete. The next day's ``--previous-ledger`` is this ``--output``.

Curator files are private (:mod:`renyi_stream.stream.private_files`). For a local ``--output`` the launcher
makes the folder ``0700`` (tightening an existing one) before anything is written, manifests
are written ``0600`` from creation, and the commit step sets every file Beam's sinks wrote under
it to ``0600`` (folders ``0700``) before it writes ``_COMMITTED.json``; a local previous run's
manifest or ledger file that group/others may read is refused. ``gs://`` and ``s3://`` outputs
are as private as the bucket's IAM policy makes them: give the curator's outputs a bucket no
analyst can read. With ``--quiet`` nothing printed carries an exact count.

The ledger's identity, ``parameters.ledger_id`` in every intent and manifest
(:func:`ledger_identity`), is drawn by the first run and carried from each manifest to the next;
the release noise is bound to it (:class:`renyi_stream.stream.noise.NoiseBinding`), so another ledger given
the same key draws independent noise.

The graph is the daily job's: :class:`~renyi_stream.pipelines.beam.transforms.ReadIndicators`, the stateful
:class:`~renyi_stream.pipelines.beam.transforms.IndividualFilterDoFn` keyed by user shard in the global window,
:class:`~renyi_stream.pipelines.beam.transforms.ReleaseWindows` (keyed noise) and
:class:`~renyi_stream.pipelines.beam.transforms.WriteReleaseParquet`. Only the previous ledger enters differently:
``DailyReleases`` takes it as an in-memory table and embeds it in the job graph (``beam.Create``),
which a cluster cannot afford; here :class:`ReadLedgerSnapshot` reads it from files in the
pipeline and hands each shard exactly one part.

Answered here: the queries registered in the catalogue beside the public release root,
``<--releases-parquet>/_queries/`` (:mod:`renyi_stream.queries.catalogue`; ``renyi-stream query add
--releases-parquet ROOT``), under the rules of the daily job's registry
(:mod:`renyi_stream.queries.registration`): every window query active in the run's windows (sums over
columns, weighted sums, clamps, histograms over numeric and string categories), charged together
per user as the daily job charges them (the same :class:`~renyi_stream.stream.engine.shard_state.QueryPlan`).
On a root whose catalogue has no query, the first run registers the default per-column sums
(``--columns``, else every declared numeric column) from its first window, as ``renyi-stream
run`` does on a store without queries. The intent and the manifest record the run's plan
(``query_plan``: which queries from which window) and the manifest every query the ledger has
answered (``queries``).

Running totals (docs/running_totals.md) go through the daily job's engine objects: each shard's
per-user prepaid rows (:class:`renyi_stream.stream.engine.running.PrepaidUsers`, one row per user and
running query) are written beside its ledger, ``running/<attempt>/query-<i>/part-*.parquet``,
and read back per shard by the next run like the ledger; each running query's release state
(:class:`renyi_stream.stream.engine.running.RunningRelease`: ``(C a)_t`` in window order) and its releases
``y_t`` (which the running-total estimates are computed from) are recorded in the committed
manifest (``running``: per query id, ``prepaid`` with the files, their metadata and the users,
``release`` and ``raw``). Every window of the schedule is released for a running query active in
it, with or without rows, in order; a continuation whose registered strategy, horizon or first
window differs from the stored state's, or that would skip or repeat one of its windows, is
refused at launch, by name. Its release rows are staged and published like the window sums.

Recovery, in short (``deploy/README.md`` has the whole story): a failed job leaves no
``_COMMITTED.json`` and nothing public, so nothing it charged counts and nothing it computed was
seen; re-run it (a new attempt draws the same keyed noise). A job that died after its commit and
before publishing leaves its releases staged; the next run, which takes this output as
``--previous-ledger``, publishes them before it starts. Two committed runs from one ledger (a
re-run into a new ``--output`` after such a crash, or two launches at once) fork it: only the
first to publish becomes public, the other fails in its publish step, and a run continuing a
ledger that is not the public lineage's is refused at launch, naming both runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import logging
import sys
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Sequence, Tuple

import pyarrow as pa

_root, _level = logging.getLogger(), logging.getLogger().level
_root.setLevel(logging.ERROR)  # Beam's GCP extras warn at import when their optional clients are absent
try:
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    from renyi_stream.pipelines.beam import transforms as tx
    from renyi_stream.pipelines.beam.job_options import (RunRefused, add_input_day_options, add_promise_options,
                                                         declared_contract, input_day_options, key_fingerprint,
                                                         long_options, parse_day, refuse_unknown_options,
                                                         window_seconds)
    from renyi_stream.pipelines.beam.object_store import (absolute, is_uri, join, read_json, read_parquet, refuse_if_shared_file,
                                             release_windows_present, write_json)
    from renyi_stream.pipelines.beam.publication import PublicReleaseFiles, StagedReleases
    from renyi_stream.pipelines.beam import running_releases
    from renyi_stream.pipelines.beam.rows import split_by_shard
    from renyi_stream.pipelines.beam import worker_key
    from renyi_stream.pipelines.beam.local_runner import batch_runner
finally:
    _root.setLevel(_level)
from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA
from renyi_stream.stream.engine.readers import MalformedLines, check_declared_columns, declares_types, id_type_of, read_batches
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.stream.engine.publication import publish_outbox
from renyi_stream.pipelines.beam import preview
from renyi_stream.pipelines.cli.errors import worded
from renyi_stream.stream.engine.input_days import days_of_files, format_windows, refuse_uncovered_windows
from renyi_stream.stream.engine.row_balance import RowBalance, reason_counts
from renyi_stream.stream.faults import crash_point
from renyi_stream.stream.engine.running import PrepaidUsers
from renyi_stream.stream.engine.shard_state import WINDOW_COUNT_NAMES, PlannedQuery, QueryPlan, running_rule_of
from renyi_stream.queries.catalogue import CatalogueChanged, LaunchQueries, ReleaseCatalogue, queries_at_launch
from renyi_stream.queries.linear import default_queries
from renyi_stream.queries.registration import category_reads, contract_defaults, declared_header, plan_columns, recorded_plan
from renyi_stream.stream.contract import ContractError, InputContract, declaration_hint
from renyi_stream.stream.columns import default_columns
from renyi_stream.stream.engine.ledger_config import LedgerConfig, LedgerConfigError
from renyi_stream.stream.ledger import STATUS_NAMES, Policy
from renyi_stream.stream.noise import check_ledger_id, new_ledger_id
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE, private_dir, private_run_dir, tighten_tree
from renyi_stream.stream.schema import DEFAULT_KEYS, USER_ID, InputKeys, WindowSpec

MANIFEST_VERSION = 1
INTENT = "_INTENT.json"
COMMITTED = "_COMMITTED.json"
COUNTS_SCHEMA = pa.schema([("window_id", pa.int64()), *((name, pa.int64()) for name in WINDOW_COUNT_NAMES)])
READ_SCHEMA = pa.schema([("source", pa.string()), ("rows", pa.int64())])


# --- files: manifests through Beam's FileSystems, Parquet through pyarrow.fs ----------------------


def resolve_inputs(patterns: Sequence[str]) -> list[dict]:
    """Every file the globs match, sorted by path, with size and modification time. A pattern
    that matches nothing is refused: a missing day must be noticed, not released as empty."""
    found: dict[str, dict] = {}
    for pattern, result in zip(patterns, FileSystems.match(list(patterns))):
        if not result.metadata_list:
            raise RunRefused(f"input pattern {pattern!r} matches no file")
        for meta in result.metadata_list:
            found[meta.path] = {"path": meta.path, "size": int(meta.size_in_bytes),
                                "mtime": float(meta.last_updated_in_seconds)}
    return [found[path] for path in sorted(found)]


def promote_releases(staging: str, public: str, *, run: str | None = None) -> list[int]:
    """Publish every staged window file under ``staging`` to ``public`` by the one publication
    rule (:func:`renyi_stream.stream.engine.publication.publish_outbox`: window by window, in window order,
    first write wins: a window already public is kept). Call only for a committed run's staging,
    after its lineage claim (:func:`publish_committed` does both): the staged files are then the
    run's outbox. With ``run``, each window's lineage record names that run
    (:func:`renyi_stream.queries.release_lineage.record_window`, written before the file). Returns the windows
    newly published."""
    return list(publish_outbox(StagedReleases(staging), PublicReleaseFiles(public, run=run)).windows)


def parent_run(manifest: dict) -> str | None:
    """The run id (attempt) of the ledger a committed run continued: :data:`lineage.ORIGIN` for a
    first run, None when unknown (a manifest from before lineage was recorded whose previous
    output is gone)."""
    if "previous_attempt" in manifest:
        return manifest["previous_attempt"] or lineage.ORIGIN
    if manifest.get("previous") is None:
        return lineage.ORIGIN
    committed = join(manifest["previous"], COMMITTED)
    return read_json(committed).get("attempt") if FileSystems.exists(committed) else None


def claim_lineage(output: str, public: str) -> dict:
    """Claim the committed run at ``output`` its place in the public lineage under ``public``: the
    one successor of the ledger it continued (:func:`renyi_stream.queries.release_lineage.claim`; idempotent
    for that run). LineageConflict when another run from the same ledger claimed first: then
    nothing of this run may be published. Returns the run's manifest."""
    manifest = read_json(join(output, COMMITTED))
    parent = parent_run(manifest)
    if parent is not None:  # unknown only for a ledger committed before lineage was recorded
        lineage.claim(public, parent, manifest["attempt"])
    return manifest


def publish_committed(output: str, public: str) -> list[int]:
    """Publish the committed run at ``output``: :func:`claim_lineage`, then copy its staged
    releases with their lineage records. Idempotent: a resumed publish completes what a crash
    left. Returns the windows newly published."""
    manifest = claim_lineage(output, public)
    staged = manifest.get("staged_releases")
    return promote_releases(staged, public, run=manifest["attempt"]) if staged else []


def check_lineage(releases: str, previous: str | None, manifest: dict | None) -> None:
    """Refuse (RunRefused) a run whose ``--previous-ledger`` is not the public lineage's latest
    ledger under ``releases`` (:func:`renyi_stream.queries.release_lineage.check_continuation`), or a first run
    on a release root that already holds a lineage."""
    if manifest is None:
        holder = lineage.successor(releases, lineage.ORIGIN)
        if holder is not None:
            raise RunRefused(f"--previous-ledger none, but the releases under {releases} already continue a ledger "
                             f"started by run {holder}: continue from the last committed --output of that lineage")
        return
    try:
        lineage.check_continuation(releases, run=manifest["attempt"], previous_run=parent_run(manifest),
                                   charged=list(manifest.get("schedule", [])))
    except lineage.LineageConflict as exc:
        raise RunRefused(f"--previous-ledger {previous} (committed by run {manifest['attempt']}) is not the "
                         f"ledger of what is public: {exc}") from None


# --- the run's plan, fixed at launch ---------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    """Everything a run is, decided on the launcher before anything is written."""

    inputs: tuple[dict, ...]
    columns: tuple[str, ...]
    window: WindowSpec
    start_window: int
    end_window: int
    released: tuple[int, ...]  # windows committed by earlier runs: their rows are late
    schedule: tuple[int, ...]  # windows this run releases
    query_first: dict[str, int]
    config: LedgerConfig  # with the release root, this run's shards and the ledger's id
    policy: str
    key_path: str
    previous: str | None
    previous_ledger_files: tuple[str, ...]
    previous_users: int
    output: str
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    previous_attempt: str | None = None  # the attempt that committed --previous-ledger (lineage)
    # The registered queries this run answers (active in its schedule), from the catalogue under
    # --releases-parquet, and the string columns histograms over categories read.
    queries: tuple[PlannedQuery, ...] = ()
    category_columns: tuple[str, ...] = ()
    catalogue: LaunchQueries | None = None  # the catalogue as this run launches with it
    # The previous manifest's running-total state (``running``: per query id, its prepaid files,
    # release state and releases ``y``), carried into this run's manifest.
    running_state: dict[str, dict] = field(default_factory=dict)
    # path -> the first and last window of the days the file holds (renyi_stream.stream.engine.input_days):
    # a row of another window is its dead letter.
    file_windows: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def staging(self) -> str:
        """This attempt's release files, curator-only until :func:`promote_releases` copies
        them to the public root (after the commit)."""
        return join(self.output, "staged-releases", self.attempt)

    @property
    def releases(self) -> str:
        """The public release root (normalised, :func:`renyi_stream.pipelines.beam.object_store.absolute`)."""
        return self.config.releases

    @property
    def n_shards(self) -> int:
        return self.config.n_shards

    @property
    def parameters(self) -> dict[str, Any]:
        """The ``parameters`` the intent and manifest record (:meth:`LedgerConfig.to_manifest`)."""
        return self.config.to_manifest()["parameters"]

    @property
    def input_paths(self) -> list[str]:
        return [item["path"] for item in self.inputs]

    def query_plan(self) -> QueryPlan:
        """The registered queries active in this run's windows (:mod:`renyi_stream.queries.catalogue`)."""
        return QueryPlan(self.queries)

    def planned(self) -> list[dict]:
        """The query plan as the intent and the manifest record it: which queries this run answers
        from which window (``first_window``, ``retired_from``), with their public specs."""
        return recorded_plan(self.query_plan().entries)

    def ledger_template(self) -> pa.Table:
        return self.config.empty_ledger().to_arrow()

    def intent(self) -> dict:
        """What identifies the run: a re-run after a crash must match it exactly (the shard count
        aside: it changes no answer)."""
        recorded = self.config.to_manifest()
        return {"version": MANIFEST_VERSION, "inputs": list(self.inputs), "previous": self.previous,
                "schedule": list(self.schedule), "released": list(self.released), "columns": list(self.columns),
                "category_columns": list(self.category_columns), "query_plan": self.planned(),
                "parameters": recorded["parameters"], "policy": self.policy, "releases": recorded["releases"],
                "file_windows": {path: list(span) for path, span in sorted(self.file_windows.items())}}

    def manifest(self) -> dict:
        """The commit manifest, less what only the pipeline knows (files written, totals); the
        ledger's configuration as :meth:`LedgerConfig.to_manifest` records it. ``query_plan``
        (from the intent) lists the queries this run answered and from which window; ``queries``
        maps every query the ledger has answered, in this run or an earlier one, to the first
        window it answered it in (what a later run's :func:`renyi_stream.queries.catalogue.queries_at_launch`
        reads as answered)."""
        return {**self.intent(), **self.config.to_manifest(), "attempt": self.attempt,
                "processed_windows": sorted({*self.released, *self.schedule}),
                "queries": dict(sorted(self.query_first.items())),
                "previous_users": self.previous_users, "staged_releases": self.staging,
                "previous_attempt": self.previous_attempt,
                "start_window": self.start_window, "end_window": self.end_window}


def _first_input_schema(path: str, keys: InputKeys | None = DEFAULT_KEYS) -> pa.Schema:
    """The first input's columns; its id and time columns checked against ``keys`` (None: not yet,
    the ledger's contract is not known)."""
    first = next(read_batches(path, batch_rows=16, malformed=MalformedLines(), keys=keys))  # the job dead-letters bad lines
    return first.schema


def ledger_identity(recorded: Any, output: str, *, where: str) -> str:
    """This run's ledger id (:func:`renyi_stream.stream.noise.new_ledger_id`), which its noise is bound to and
    its manifest records (``parameters.ledger_id``): the one ``recorded`` by the previous manifest.
    For a new ledger, or one whose manifest predates ledger ids (``recorded`` None), the one an
    interrupted attempt at this ``--output`` already fixed in its intent, so that its re-run
    draws the same noise; else a new one. RunRefused, naming ``where``, for a malformed id."""
    if recorded is None:
        intent_path = join(output, INTENT)
        earlier = read_json(intent_path).get("parameters", {}) if FileSystems.exists(intent_path) else {}
        recorded, where = earlier.get("ledger_id"), intent_path
        if recorded is None:
            return new_ledger_id()
    try:
        return check_ledger_id(recorded, name="ledger_id")
    except ValueError as exc:
        raise RunRefused(f"{where} records a malformed ledger id ({exc}): it was edited") from None


def _same_intent(stored: dict, planned: dict) -> bool:
    """Whether an attempt's recorded intent is this run's. An intent written before ledger ids
    existed records none: the id this run draws its noise for is then the only difference
    allowed (the attempt's public files keep their values: first write wins)."""
    if "ledger_id" not in stored.get("parameters", {}):
        planned = {**planned, "parameters": {k: v for k, v in planned["parameters"].items() if k != "ledger_id"}}
    if "query_plan" not in stored:  # written before the catalogue: the default sums of its columns
        planned = {k: v for k, v in planned.items() if k not in ("query_plan", "category_columns")}
    return stored == planned


def release_state_record(table: pa.Table) -> dict:
    """A running query's release state (:meth:`renyi_stream.stream.engine.running.RunningRelease.to_arrow`) as
    the manifest records it: its metadata and its values, flat (JSON floats round-trip exactly)."""
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    return {"meta": dict(sorted(meta.items())),
            "values": table.column("values").combine_chunks().flatten().to_pylist()}


def release_state_table(record: dict) -> pa.Table:
    """:func:`release_state_record` back to the table :meth:`RunningRelease.from_arrow` restores
    (which refuses it when inconsistent)."""
    meta = {str(k): str(v) for k, v in record["meta"].items()}
    values = pa.FixedSizeListArray.from_arrays(pa.array(record["values"], type=pa.float64()), int(meta["dim"]))
    return pa.table({"values": values}).replace_schema_metadata(meta)


def refuse_running_continuation(plan: QueryPlan, running_state: dict[str, dict], schedule: Sequence[int]) -> None:
    """ValueError, at launch, for a running query this run cannot continue
    (:func:`renyi_stream.pipelines.beam.running_releases.refuse_running_continuation` over the previous manifest's
    ``running`` release states), or prepaid rows in the manifest without their release state (an
    edited manifest)."""
    states = {q: release_state_table(r["release"]) for q, r in running_state.items() if "release" in r}
    for entry in plan.running:
        if (any(entry.active_in(w) for w in schedule) and running_state.get(entry.query_id, {}).get("prepaid") is not None
                and states.get(entry.query_id) is None):
            raise ValueError(f"running query {entry.query_id!r} has per-user prepaid rows in the previous "
                             "manifest but no release state: the manifest was edited")
    running_releases.refuse_running_continuation(plan, states, schedule, stored_where="the previous manifest")


def prepare(args: argparse.Namespace) -> RunPlan:
    """Check everything that can be checked before launch and fix the run's plan. Writes nothing."""
    spec = WindowSpec(length_seconds=window_seconds(args.window))
    start, end = parse_day("start", args.start, spec), parse_day("end", args.end, spec)
    if start > end:
        raise RunRefused(f"start must not be after end, got {args.start} > {args.end}")
    Policy(args.policy)
    patterns = [absolute(p) for item in args.input for p in item.split(",") if p]
    inputs = resolve_inputs(patterns)
    key_path, fingerprint, _ = key_fingerprint(args)
    try:
        declared_input = declared_contract(args)
    except ValueError as exc:
        raise RunRefused(str(exc)) from None
    # Readable, its key columns checked once the ledger's contract is known (a recorded contract may
    # name them otherwise than the defaults).
    schema = _first_input_schema(inputs[0]["path"], keys=declared_input.keys if declared_input else None)
    requested = [c for c in (args.columns or "").split(",") if c]
    if declared_input is not None and requested:
        raise RunRefused("give the indicator columns either declared (--column, --category, --schema) or as --columns, "
                         "not both")
    # Undeclared: the continued ledger's recorded id type replaces it below (a new ledger must declare
    # one); read from the first input only where it has the default id column.
    id_type = declared_input.id_type if declared_input else args.id_type or (
        id_type_of(inputs[0]["path"], keys=None) if USER_ID in schema.names else "string")
    releases, output = absolute(args.releases_parquet), absolute(args.output)
    config = LedgerConfig.from_promise(epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget,
                                       accounting=args.accounting, id_type=id_type, key_fingerprint=fingerprint,
                                       window=spec, n_shards=args.shards, releases=releases, contract=declared_input)

    previous, processed, ledger_files, users, query_first, columns = None, set(), [], 0, {}, []
    running_state: dict[str, dict] = {}
    if args.previous_ledger.lower() != "none":
        previous = absolute(args.previous_ledger)
        committed = join(previous, COMMITTED)
        if not FileSystems.exists(committed):
            raise RunRefused(f"--previous-ledger {previous} has no {COMMITTED}: that run did not finish (or it is "
                             "not a run's --output). Use the last committed run's --output")
        manifest = read_json(committed)
        if manifest.get("version") != MANIFEST_VERSION:
            raise RunRefused(f"{committed}: manifest version {manifest.get('version')!r}, expected {MANIFEST_VERSION}")
        where = f"--previous-ledger {previous}"
        try:
            recorded = LedgerConfig.from_manifest(manifest, where=where)
            if recorded.releases is not None:  # compared normalised: gs://b/r/ is gs://b/r
                recorded = replace(recorded, releases=absolute(recorded.releases))
            # The ledger's id type for life: each row's id is parsed as it (renyi_stream.stream.schema), so an
            # input typed otherwise (a CSV with one text id) costs its bad rows, not the day.
            declared_id = declared_input is not None or args.id_type is not None
            config = (config if declared_id else replace(config, id_type=recorded.id_type)).continued_from(
                recorded, where=where)
        except LedgerConfigError as exc:
            raise RunRefused(str(exc)) from None
        check_lineage(releases, previous, manifest)
        processed = set(manifest["processed_windows"])
        ledger_files = list(manifest["ledger_files"])
        for path in ledger_files:  # read by the workers: refused here, before anything runs
            refuse_if_shared_file(path, "the previous ledger file")
        users = int(manifest["users"])
        query_first = {q: int(w) for q, w in manifest["queries"].items()}
        columns = list(manifest["columns"])
        running_state = dict(manifest.get("running", {}))
        for record in running_state.values():
            for path in record.get("prepaid", {}).get("files", []):
                refuse_if_shared_file(path, "the previous running-total state file")
    else:
        manifest = None
        if declared_input is None:
            raise RunRefused(f"a new ledger (--previous-ledger none) needs its input contract: "
                             f"{declaration_hint(schema.names)}")
        check_lineage(releases, None, None)
    contract = config.contract  # declared by this run or recorded by the ledger
    if contract is None:  # a ledger from before declared contracts: the default id and time columns
        schema = _first_input_schema(inputs[0]["path"])
    missing = [c for c in requested if c not in schema.names]
    if missing:
        raise RunRefused(f"input {inputs[0]['path']} lacks the indicator column(s) {missing} given to --columns")
    schedule = [w for w in range(start, end + 1) if w not in processed]
    if contract is not None and requested:
        raise RunRefused(f"--columns is for ledgers started before declared contracts; this ledger records its "
                         f"contract (columns {list(contract.names)}): leave --columns out")
    if contract is not None:
        try:
            for item in inputs:
                check_declared_columns(item["path"], contract)
        except ValueError as exc:
            raise RunRefused(str(exc)) from None
        schema, declared, requested, defaults = declared_header(contract), True, list(contract.numeric), contract
    else:
        declared = declares_types(inputs[0]["path"])
        # On a release root whose catalogue has no query (a new ledger; or one started before the
        # catalogue, whose manifest names its columns): the default sums of --columns, else of the
        # declared numeric columns or, for a CSV (which declares none), every non-key one: never values.
        defaults = requested or columns or default_columns(schema, declared_types=declared)
    launch = launch_queries(releases, defaults=defaults, schedule=schedule, processed=processed,
                            answered=set(query_first) if manifest is not None else None)
    entries = launch.plan(min(schedule), max(schedule)) if schedule else []
    try:
        # A run with nothing to release (a re-run of committed days) parses its rows as the queries
        # of its schedule did: they are then dead-lettered as late.
        readers = entries or ([] if schedule else launch.plan(start, end))
        kinds = plan_columns([r.query for r in readers], [r.query for r in entries], schema, declared_types=declared,
                             where="the declared contract" if contract else f"input {inputs[0]['path']}",
                             parsed=requested)
    except ValueError as exc:
        raise RunRefused(str(exc)) from None
    last = max(schedule) if schedule else None
    planned = tuple(PlannedQuery(r.query, r.effective_from,
                                 r.retired_from if r.retired_from is not None and r.retired_from <= last else None)
                    for r in entries)
    for entry in planned:  # the first window each query was answered in, for this ledger's later runs
        query_first.setdefault(entry.query_id, min(w for w in schedule if entry.active_in(w)))
    try:
        refuse_running_continuation(QueryPlan(planned), running_state, schedule)
    except ValueError as exc:
        raise RunRefused(str(exc)) from None
    if previous is not None and output == previous:
        raise RunRefused("--output must be a new location, not --previous-ledger (a snapshot is never rewritten)")
    config = replace(config, ledger_id=ledger_identity(config.ledger_id, output, where=f"--previous-ledger {previous}"))
    try:  # structure decides, never one row: every window to release is covered by an input named for it
        input_days, no_data_days = input_day_options(args)
        days = days_of_files([item["path"] for item in inputs], spec=spec, start_window=start, end_window=end,
                             input_days=input_days)
        refuse_uncovered_windows(days, schedule, spec=spec, no_data=no_data_days)
    except ValueError as exc:
        raise RunRefused(str(exc)) from None
    plan = RunPlan(inputs=tuple(inputs), columns=kinds.numeric, window=spec, start_window=start, end_window=end,
                   released=tuple(sorted(processed)), schedule=tuple(schedule), query_first=query_first,
                   config=config, policy=args.policy, key_path=key_path, previous=previous,
                   previous_ledger_files=tuple(ledger_files), previous_users=users, output=output,
                   previous_attempt=manifest["attempt"] if manifest is not None else None,
                   queries=planned, category_columns=tuple(sorted(category_reads([e.query for e in planned]))),
                   catalogue=launch, running_state=running_state,
                   file_windows={path: span for path, span in ((item["path"], days.window_range(item["path"], spec))
                                                                for item in inputs) if span is not None})
    _check_releases_and_output(plan, processed)
    return plan


def launch_queries(releases: str, *, defaults: "Sequence[str] | InputContract", schedule: Sequence[int],
                   processed: Iterable[int], answered: set[str] | None) -> LaunchQueries:
    """The query catalogue under ``releases`` as this run launches with it
    (:func:`renyi_stream.queries.catalogue.queries_at_launch`, nothing written): queries registered into
    windows the ledger charged (``processed``) but never ``answered`` move past them, and on a
    catalogue with no query the default sums of ``defaults`` are registered from the schedule's
    first window (a declared contract's: :func:`renyi_stream.queries.registration.contract_defaults`). RunRefused
    when the catalogue cannot be read or a default cannot be registered; ContractError when the
    root records another input contract than ``defaults``."""
    catalogue = ReleaseCatalogue(releases)
    processed = sorted(processed)
    if isinstance(defaults, InputContract):  # a root keeps its ledger's contract: refused before anything runs
        catalogue.check_input_contract(defaults)
    try:
        state = catalogue.read()
        if isinstance(defaults, InputContract):
            queries = [] if state.registrations else contract_defaults(defaults)
        else:
            queries = default_queries(list(defaults))
        return queries_at_launch(state, defaults=queries,
                                 first_window=min(schedule) if schedule else None,
                                 processed_through=processed[-1] if processed else None, answered=answered,
                                 last_released=catalogue.last_released_window())
    except ValueError as exc:
        raise RunRefused(f"the query catalogue under {releases}: {exc}") from None


def record_queries(plan: RunPlan) -> list[str]:
    """Write the catalogue changes ``plan`` launches with (:meth:`renyi_stream.queries.catalogue.ReleaseCatalogue.record_launch`)
    and the ledger's input contract beside them, once
    (:meth:`~renyi_stream.queries.catalogue.ReleaseCatalogue.record_input_contract`), and return what changed, in
    words. CatalogueChanged when the catalogue changed since :func:`prepare` read it: the plan must
    be made again; ContractError, nothing written, when the root records another contract."""
    catalogue = ReleaseCatalogue(plan.releases)
    contract = plan.config.contract
    recorded = contract is not None and catalogue.record_input_contract(contract)
    params = plan.config
    catalogue.record_promise(epsilon=params.epsilon, delta=params.delta, accounting=params.accounting,
                             norm_budget=params.norm_budget)
    said = ["recorded the ledger's input contract beside the releases"] if recorded else []
    if plan.catalogue is None:
        return said
    catalogue.record_launch(plan.catalogue)
    first = {r.query_id: r.effective_from for r in plan.catalogue.registrations}
    def when(window: int) -> str:  # the window's date beside its number
        return format_windows([window], params.window)

    return (said + [f"registered the default query {q} from {when(first[q])} (the catalogue had no query)"
                    for q in plan.catalogue.registered]
            + [f"query {q!r} was registered from {when(old)}, which this ledger had already charged without it; "
               f"it now starts at {when(new)}" for q, old, new in plan.catalogue.moved])


def _check_releases_and_output(plan: RunPlan, processed: set[int]) -> None:
    """Refuse a run whose ledger is behind the public releases, and a re-run that could charge
    users differently from release files an interrupted attempt already wrote."""
    if FileSystems.exists(join(plan.output, COMMITTED)):
        raise RunRefused(f"--output {plan.output} is a committed run: use it as --previous-ledger of the next run "
                         "and give this run a new --output (that run also publishes any releases a crash left "
                         "staged in it)")
    unknown = release_windows_present(plan.releases) - processed
    outside = sorted(unknown - set(plan.schedule))
    if outside:
        raise RunRefused(
            f"the releases under {plan.releases} include window(s) {outside[:5]} that the previous ledger "
            f"({plan.previous or 'none'}) never charged and this run does not process: the ledger is missing, older "
            "than the releases, or from another pipeline. Start from the last committed --output; starting users "
            "from an older budget would break their promise")
    intent_path = join(plan.output, INTENT)
    intent = read_json(intent_path) if FileSystems.exists(intent_path) else None
    orphans = sorted(unknown)
    if intent is not None and not _same_intent(intent, plan.intent()):
        raise RunRefused(
            f"--output {plan.output} belongs to an earlier attempt with other arguments or inputs ({intent_path}). "
            + (f"That attempt wrote releases for window(s) {orphans[:5]}: re-run it with exactly its inputs "
               "(the files listed there, unchanged) so that every user is charged for what was released"
               if orphans else "It released nothing: give this run a new --output"))
    if orphans and intent is None:
        raise RunRefused(
            f"release files exist for window(s) {orphans[:5]} that no committed ledger charged, and {intent_path} "
            "does not say which inputs produced them. Re-run the interrupted job with its original --output")


def write_intent(plan: RunPlan) -> None:
    """Write the run's ``_INTENT.json``; a local ``--output`` is made a ``0700`` folder first (an
    existing one tightened: it holds only this run's curator files), so that what Beam's sinks
    write under it is private before the commit step tightens each file."""
    if not is_uri(plan.output):
        private_dir(plan.output)
    path = join(plan.output, INTENT)
    if not FileSystems.exists(path):
        write_json(path, plan.intent())


# --- the graph ---------------------------------------------------------------------------------------


def _snapshot_parts(path: str, n_shards: int, schema: pa.Schema) -> Iterator[tuple[int, pa.Table]]:
    table = read_parquet(path)
    table = table.replace_schema_metadata(None).cast(schema.remove_metadata())
    if table.num_rows:
        for shard, (_, part) in split_by_shard(table, n_shards):
            yield shard, part


def _one_part(item: tuple[int, Iterable[pa.Table]], schema: pa.Schema,
              query_id: str | None = None) -> tuple[int, tuple[str, Any]]:
    shard, parts = item
    table = pa.concat_tables(list(parts)).replace_schema_metadata(schema.metadata)
    return (shard, ("ledger", table)) if query_id is None else (shard, ("running", (query_id, table)))


class ReadLedgerSnapshot(beam.PTransform):
    """Ledger snapshot files -> ``(shard, ("ledger", table))``, exactly one table per shard; with
    ``query_id``, a running query's prepaid-row files -> ``(shard, ("running", (query_id, table)))``.

    A shard must never get its users in two pieces (the second would start from zero budget;
    :meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.restore` refuses two): the parts of a shard
    from every file are grouped and concatenated first (``Ledger.from_arrow`` and
    ``PrepaidUsers.from_arrow`` then refuse a user listed twice)."""

    def __init__(self, files: Sequence[str], *, n_shards: int, schema: pa.Schema, query_id: str | None = None) -> None:
        super().__init__()
        self._files = list(files)
        self._n_shards = n_shards
        self._schema = schema
        self._query_id = query_id

    def expand(self, pbegin: Any) -> Any:
        return (pbegin
                | "SnapshotFiles" >> beam.Create(self._files)
                | "ReadSnapshot" >> beam.FlatMap(_snapshot_parts, self._n_shards, self._schema)
                .with_output_types(Tuple[int, Any])
                | "GroupShard" >> beam.GroupByKey()
                | "OnePartPerShard" >> beam.Map(_one_part, self._schema, self._query_id)
                .with_output_types(Tuple[int, Any]))


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table.replace_schema_metadata(None).cast(schema.remove_metadata()).replace_schema_metadata(schema.metadata)


def _count_item(item: tuple[int, dict]) -> tuple[int, tuple[int, ...]]:
    window, counts = item
    return int(window), tuple(int(counts.get(name, 0)) for name in WINDOW_COUNT_NAMES)


def _add_counts(rows: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    total = [0] * len(WINDOW_COUNT_NAMES)
    for row in rows:
        total = [a + b for a, b in zip(total, row)]
    return tuple(total)


def _count_row(item: tuple[int, tuple[int, ...]]) -> dict:
    window, counts = item
    return {"window_id": window, **dict(zip(WINDOW_COUNT_NAMES, counts))}


def _status_items(item: tuple[int, tuple[int, ...]]) -> list[tuple[str, int]]:
    _, counts = item
    return [(name, n) for name, n in zip(WINDOW_COUNT_NAMES, counts) if name in STATUS_NAMES]


def _reason_items(table: pa.Table) -> list[tuple[str, int]]:
    return list(reason_counts([table]).items())


def _read_row(item: tuple[str, int]) -> dict:
    return {"source": item[0], "rows": int(item[1])}


def _rows(item: dict) -> int:
    return int(item["rows"])


def _num_rows(table: pa.Table) -> int:
    return table.num_rows


def _part_rows(item: tuple[int, tuple[str, pa.Table]]) -> int:
    return item[1][1].num_rows


def _running_part_rows(item: tuple[int, tuple[str, tuple[str, pa.Table]]]) -> tuple[str, int]:
    query_id, table = item[1][1]
    return query_id, table.num_rows


def _is_query(item: tuple[str, pa.Table], query_id: str) -> bool:
    return item[0] == query_id


def _conform_running(item: tuple[str, pa.Table], schema: pa.Schema) -> pa.Table:
    return _conform(item[1], schema)


def _keyed(value: Any, key: str) -> tuple[str, Any]:
    return key, value


def _query_rows(item: tuple[str, pa.Table]) -> tuple[str, int]:
    return item[0], item[1].num_rows


def _release_record(item: tuple[str, pa.Table]) -> tuple[str, dict]:
    return item[0], release_state_record(item[1])


def running_manifest(previous: dict[str, dict], *, meta: dict[str, dict[str, str]], files: Iterable[tuple[str, str]],
                     users: dict[str, int], previous_users: dict[str, int], release: dict[str, dict],
                     raw: Iterable[tuple[str, int, list[float]]]) -> dict[str, dict]:
    """The manifest's ``running`` section after a run: ``previous`` (the previous manifest's) with
    this run's prepaid files and users for every query in ``meta``, its release states and its
    releases ``y`` added. RuntimeError (nothing is committed) when a stored query's prepaid rows
    read back are not the users its manifest lists, or a query has fewer users than before: a
    lost row would restart its user's prepaid charge from nothing (a privacy failure)."""
    out = {q: dict(r) for q, r in previous.items()}
    for query_id, record in previous.items():
        expected = int(record.get("prepaid", {}).get("users", 0))
        if previous_users.get(query_id, 0) != expected:
            raise RuntimeError(f"running query {query_id!r}: its previous prepaid rows hold "
                               f"{previous_users.get(query_id, 0):,} users, its manifest says {expected:,}. Not committing")
    by_query: dict[str, list[str]] = {}
    for query_id, path in files:
        by_query.setdefault(query_id, []).append(path)
    for query_id, query_meta in meta.items():
        n = int(users.get(query_id, 0))
        if n < previous_users.get(query_id, 0):
            raise RuntimeError(f"running query {query_id!r}: the new prepaid rows hold {n:,} users, fewer than the "
                               f"{previous_users.get(query_id, 0):,} before. Not committing")
        out.setdefault(query_id, {})["prepaid"] = {"meta": dict(sorted(query_meta.items())),
                                                  "files": sorted(by_query.get(query_id, [])), "users": n}
    for query_id, record in release.items():
        out.setdefault(query_id, {})["release"] = record
    fresh: dict[str, list] = {}
    for query_id, window, y in raw:
        fresh.setdefault(query_id, []).append([int(window), [float(v) for v in y]])
    for query_id, items in fresh.items():
        series = sorted(out[query_id].get("raw", []) + items, key=lambda item: item[0])
        windows = [w for w, _ in series]
        if len(set(windows)) != len(windows):
            raise RuntimeError(f"running query {query_id!r} would record window(s) twice: {windows}. Not committing")
        out[query_id]["raw"] = series
    return dict(sorted(out.items()))


class CommitRun(beam.DoFn):
    """Writes ``<output>/_COMMITTED.json`` once every output is complete, then publishes.

    Each output arrives as a side input, and a runner makes a side input available only when
    the step producing it has finished: so the manifest (the run's commit point) appears after
    the ledger snapshot, the counts, the dead letters and the staged release files. Only then
    does the run claim its place in the public lineage (:func:`claim_lineage`: of two runs from
    one ledger only the first to claim may publish; the other fails here, committed but never
    public) and copy the staged releases to the public root (:func:`promote_releases`): a public
    answer always has a committed ledger that charged its users (docs/architecture.md, "The
    outbox rule"). A crash between the two leaves them staged; the next run that takes this
    output as ``--previous-ledger`` publishes them first. A retried commit rewrites nothing; a
    manifest of another attempt is never overwritten."""

    def __init__(self, manifest: dict, output: str, staging: str, public: str, *,
                 running_state: dict[str, dict] | None = None,
                 running_meta: dict[str, dict[str, str]] | None = None) -> None:
        self._manifest = manifest
        self._output = output
        self._staging = staging
        self._public = public
        self._running_state = dict(running_state or {})
        self._running_meta = dict(running_meta or {})

    def process(self, _: Any, ledger_files: list, release_files: list, counts_files: list, dead_files: list,
                read_files: list, rows_read: int, statuses: dict, reasons: dict, users: int,
                previous_users: int, running_files: list = (), running_users: dict | None = None,
                previous_running_users: dict | None = None, release_states: dict | None = None,
                raw: list = ()) -> Iterator[str]:
        expected = int(self._manifest["previous_users"])
        if previous_users != expected or users < previous_users:
            # A snapshot that lost users (a missing or truncated file) would restart them from zero
            # budget: fail before the commit point, so that nothing this run charged counts.
            raise RuntimeError(f"the previous ledger snapshot holds {previous_users:,} users, its manifest says "
                               f"{expected:,}; the new ledger holds {users:,}. Not committing")
        running = running_manifest(self._running_state, meta=self._running_meta, files=running_files,
                                   users=dict(running_users or {}), previous_users=dict(previous_running_users or {}),
                                   release=dict(release_states or {}), raw=raw)
        balance = RowBalance.of(rows_read=int(rows_read), statuses={k: int(v) for k, v in statuses.items()},
                                reasons={k: int(v) for k, v in reasons.items()})
        manifest = {**self._manifest, "ledger_files": sorted(ledger_files), "users": int(users),
                    "counts_files": sorted(counts_files), "dead_files": sorted(dead_files),
                    "read_files": sorted(read_files), "release_files_written": sorted(release_files),
                    "totals": balance.totals(), "balanced": balance.balanced,
                    "dead_reasons": dict(sorted(reasons.items())), "running": running,
                    "committed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        target = join(self._output, COMMITTED)
        if FileSystems.exists(target):
            existing = read_json(target)
            if existing.get("attempt") != manifest["attempt"]:
                raise RuntimeError(f"{target} was committed by attempt {existing.get('attempt')}, not this one "
                                   f"({manifest['attempt']}): two jobs wrote one --output")
        else:
            if not is_uri(self._output):  # Beam's sinks wrote with the worker's umask
                tighten_tree(self._output)
            crash_point("distributed_before_commit")  # test-only: everything written but the manifest
            write_json(target, manifest)
        crash_point("distributed_before_promote")  # test-only: committed, releases still staged
        # LineageConflict (the job fails, nothing public) when another run from our ledger claimed first.
        run = claim_lineage(self._output, self._public)["attempt"]
        crash_point("distributed_after_claim")  # test-only: claimed, releases still staged
        promote_releases(self._staging, self._public, run=run)
        yield target


def running_templates(plan: RunPlan, query_plan: QueryPlan,
                      stored_meta: dict[str, dict[str, str]]) -> dict[str, pa.Schema]:
    """The schema (metadata included: :func:`renyi_stream.stream.engine.running.rule_meta` and the id type) of
    the prepaid-row files of every running query this run carries: those stored before
    (``stored_meta``) and those its plan answers."""
    id_type = plan.config.id_type
    out = {q: PrepaidUsers.empty(meta, id_type).to_arrow().schema for q, meta in stored_meta.items()}
    for entry in query_plan.running:
        if entry.query_id not in out:
            strategy, rule = running_rule_of(entry.query)
            out[entry.query_id] = PrepaidUsers(rule, strategy=strategy, dim=entry.query.dim,
                                               start_window=entry.first_window, id_type=id_type).to_arrow().schema
    return dict(sorted(out.items()))


def build(p: beam.Pipeline, plan: RunPlan) -> dict[str, Any]:
    """Apply the whole distributed daily graph to ``p``; returns its PCollections."""
    config = plan.config
    template = plan.ledger_template()
    query_plan = plan.query_plan()
    read = p | "ReadIndicators" >> tx.ReadIndicators(
        plan.input_paths, window=plan.window, start_window=plan.start_window, end_window=plan.end_window,
        released=list(plan.released), indicator_columns=list(plan.columns),
        category_columns=list(plan.category_columns), id_type=config.id_type, file_windows=plan.file_windows,
        keys=config.contract.keys if config.contract is not None else DEFAULT_KEYS)
    previous = p | "PreviousLedger" >> ReadLedgerSnapshot(plan.previous_ledger_files, n_shards=plan.n_shards,
                                                          schema=template.schema)
    previous_users = (previous | "PreviousUsers" >> beam.Map(_part_rows)
                      | "SumPreviousUsers" >> beam.CombineGlobally(sum))
    # Running totals: every stored query's prepaid rows, one part per shard, beside the ledger's.
    stored_meta = {q: r["prepaid"]["meta"] for q, r in sorted(plan.running_state.items()) if "prepaid" in r}
    templates = running_templates(plan, query_plan, stored_meta)
    parts, previous_running = [previous], []
    for i, query_id in enumerate(sorted(stored_meta)):
        part = p | f"PreviousRunning{i}" >> ReadLedgerSnapshot(
            plan.running_state[query_id]["prepaid"]["files"], n_shards=plan.n_shards,
            schema=templates[query_id], query_id=query_id)
        parts.append(part)
        previous_running.append(part | f"PreviousRunningUsers{i}" >> beam.Map(_running_part_rows))
    state = parts | "PreviousState" >> beam.Flatten() if len(parts) > 1 else previous
    filtered = read.valid | "IndividualFilter" >> tx.IndividualFilter(
        plan=query_plan, indicator_columns=list(plan.columns), noise_std=config.noise_std, policy=plan.policy,
        budget=config.rho, id_type=config.id_type, tracker_step=config.tracker_step,
        n_shards=config.n_shards, previous_ledger=state, last_window=max(plan.schedule) if plan.schedule else None,
        running_meta=stored_meta)
    states = {q: r["release"] for q, r in plan.running_state.items() if "release" in r}
    released = filtered.sums | "ReleaseWindows" >> tx.ReleaseWindows(
        list(plan.schedule), key_path=plan.key_path, plan=query_plan, noise_std=config.noise_std,
        window=plan.window, accounting=config.accounting, key_fingerprint=config.key_fingerprint,
        ledger_id=config.ledger_id,
        previous_raw={q: [(int(w), y) for w, y in r.get("raw", [])] for q, r in plan.running_state.items()},
        previous_release={q: release_state_table(record) for q, record in states.items()})
    # Staged in the curator's output, per attempt; public only once the commit step has run.
    release_files = released["releases"] | "WriteReleaseParquet" >> tx.WriteReleaseParquet(plan.staging)

    write = beam.io.parquetio
    ledger_files = (filtered.ledger
                    | "ConformLedger" >> beam.Map(_conform, template.schema)
                    | "WriteLedger" >> write.WriteToParquetBatched(
                        join(plan.output, "ledger", plan.attempt, "part"), template.schema, codec="snappy",
                        file_name_suffix=".parquet"))
    counts = (filtered.counts
              | "CountItems" >> beam.Map(_count_item).with_output_types(Tuple[int, Tuple[int, ...]])
              | "CountsPerWindow" >> beam.CombinePerKey(_add_counts))
    counts_files = (counts | "CountRows" >> beam.Map(_count_row)
                    | "WriteCounts" >> write.WriteToParquet(join(plan.output, "counts", "part"), COUNTS_SCHEMA,
                                                            codec="snappy", file_name_suffix=".parquet"))
    dead = ((read.dead, filtered.dead) | "DeadLetters" >> beam.Flatten()
            | "ConformDead" >> beam.Map(_conform, DEAD_LETTER_SCHEMA))
    dead_files = dead | "WriteDead" >> write.WriteToParquetBatched(
        join(plan.output, "dead", "part"), DEAD_LETTER_SCHEMA, codec="snappy", file_name_suffix=".parquet")
    read_rows = (read.read | "ReadPerFile" >> beam.CombinePerKey(sum).with_output_types(Tuple[str, int])
                 | "ReadRows" >> beam.Map(_read_row))
    read_files = read_rows | "WriteRead" >> write.WriteToParquet(join(plan.output, "read", "part"), READ_SCHEMA,
                                                                 codec="snappy", file_name_suffix=".parquet")

    rows_read = read_rows | "RowsRead" >> beam.Map(_rows) | "SumRowsRead" >> beam.CombineGlobally(sum)
    statuses = (counts | "Statuses" >> beam.FlatMap(_status_items).with_output_types(Tuple[str, int])
                | "SumStatuses" >> beam.CombinePerKey(sum))
    reasons = (dead | "Reasons" >> beam.FlatMap(_reason_items).with_output_types(Tuple[str, int])
               | "SumReasons" >> beam.CombinePerKey(sum))
    users = filtered.ledger | "Users" >> beam.Map(_num_rows) | "SumUsers" >> beam.CombineGlobally(sum)
    running_files, running_users = [], []
    for i, (query_id, schema) in enumerate(sorted(templates.items())):
        mine = filtered.running | f"Running{i}" >> beam.Filter(_is_query, query_id)
        running_users.append(mine | f"RunningUsers{i}" >> beam.Map(_query_rows))
        running_files.append(
            mine | f"ConformRunning{i}" >> beam.Map(_conform_running, schema)
            | f"WriteRunning{i}" >> write.WriteToParquetBatched(
                join(plan.output, "running", plan.attempt, f"query-{i}", "part"), schema, codec="snappy",
                file_name_suffix=".parquet")
            | f"RunningFiles{i}" >> beam.Map(_keyed, query_id))

    def gathered(name: str, collections: list) -> Any:
        if not collections:
            return p | f"No{name}" >> beam.Create([])
        return collections | f"All{name}" >> beam.Flatten()

    side = beam.pvalue
    committed = (p | "CommitOnce" >> beam.Create([None])
                 | "Commit" >> beam.ParDo(
                     CommitRun(plan.manifest(), plan.output, plan.staging, plan.releases,
                               running_state=plan.running_state,
                               running_meta={q: {k.decode(): v.decode() for k, v in schema.metadata.items()}
                                             for q, schema in templates.items()}),
                     ledger_files=side.AsList(ledger_files), release_files=side.AsList(release_files),
                     counts_files=side.AsList(counts_files), dead_files=side.AsList(dead_files),
                     read_files=side.AsList(read_files), rows_read=side.AsSingleton(rows_read),
                     statuses=side.AsDict(statuses), reasons=side.AsDict(reasons), users=side.AsSingleton(users),
                     previous_users=side.AsSingleton(previous_users),
                     running_files=side.AsList(gathered("RunningFiles", running_files)),
                     running_users=side.AsDict(gathered("RunningUsers", running_users)
                                               | "SumRunningUsers" >> beam.CombinePerKey(sum)),
                     previous_running_users=side.AsDict(gathered("PreviousRunningUsers", previous_running)
                                                        | "SumPreviousRunningUsers" >> beam.CombinePerKey(sum)),
                     release_states=side.AsDict(released["release_state"]
                                                | "ReleaseRecords" >> beam.Map(_release_record)),
                     raw=side.AsList(released["raw"])))
    return {"releases": released["releases"], "release_files": release_files, "ledger": filtered.ledger,
            "ledger_files": ledger_files, "counts": counts, "dead": dead, "read": read_rows, "committed": committed}


# --- the command -------------------------------------------------------------------------------------


def _parser(prog: str = "python -m renyi_stream.pipelines.distributed") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="The daily job on a distributed Beam runner: ledger snapshots and releases as Parquet in "
                    "object storage. Other options go to Beam (--runner, --project, --flink_master, ...); "
                    "one Beam does not know either is refused.")
    arg = parser.add_argument
    arg("--input", nargs="+", required=True,
        help="input files or globs (gs://, s3://, local), space- or comma-separated")
    add_promise_options(parser)
    add_input_day_options(parser)
    arg("--previous-ledger", "--previous_ledger", dest="previous_ledger", required=True,
        help="the previous run's --output (its committed ledger snapshot), or 'none' for the first run")
    arg("--output", required=True, help="this run's curator-only output root (ledger snapshot, counts, dead letters)")
    arg("--columns", help="indicator columns to answer, comma-separated (first run; default: every numeric one)")
    arg("--wait", action="store_true", help="wait for the job and print its totals (always on the DirectRunner)")
    arg("--dry-run", action="store_true", help="run on the DirectRunner into a private scratch copy of the release "
        "root and a scratch --output, and print what the run would do (windows, queries, rows by outcome), charging "
        "and publishing nothing; every refusal is the real run's")
    arg("--quiet", action="store_true", help="print no exact counts (they stay in the curator's --output)")
    return parser


def parse_args(argv: Sequence[str], prog: str = "python -m renyi_stream.pipelines.distributed") -> tuple[argparse.Namespace, list[str]]:
    """``(job arguments, Beam arguments)`` of ``argv``. Exits with status 2 and a message naming the
    option (argparse's ``error``) when an option is neither this job's nor Beam's
    (:func:`renyi_stream.pipelines.beam.job_options.refuse_unknown_options`): a typo would run the job without it."""
    parser = _parser(prog)
    args, beam_args = parser.parse_known_args(list(argv))
    try:
        refuse_unknown_options(beam_args, long_options(parser), command=parser.prog)
    except RunRefused as exc:
        parser.error(str(exc))
    return args, list(beam_args)


def pipeline_options(plan: RunPlan, args: argparse.Namespace, beam_args: Sequence[str]) -> PipelineOptions:
    flags = list(beam_args)
    if not any(a.startswith("--runner") for a in flags):
        flags += ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
    if args.noise_key_secret:
        flags += [f"--{worker_key.SECRET_OPTION}={args.noise_key_secret}",
                  f"--{worker_key.PATH_OPTION}={plan.key_path}", f"--beam_plugins={worker_key.PLUGIN}"]
    return PipelineOptions(flags)


def _previewed_previous(args: argparse.Namespace, public: Any, folder: Any) -> str:
    """The ``--previous-ledger`` a dry run continues: the previous run's manifest copied into the
    scratch ``folder``, the release root it records replaced by ``public``, the scratch copy of
    that root, when it records the root this run was given (a ledger answers into the root it was
    started with: the real run's check, which the preview must pass where the real run passes).
    Everything else the manifest names (ledger files, staged releases, running state) is read
    where it is and never written. ``--previous-ledger`` as given when it has no manifest or
    records another root: the run then refuses it as the real run would."""
    previous = absolute(args.previous_ledger)
    committed = join(previous, COMMITTED)
    if not FileSystems.exists(committed):
        return previous
    manifest = read_json(committed)
    recorded = manifest.get("releases")
    if recorded is None or absolute(recorded) != absolute(args.releases_parquet):
        return previous
    private_dir(str(folder))
    write_json(join(str(folder), COMMITTED), {**manifest, "releases": str(public)})
    return str(folder)


def dry_run(argv: list[str], args: argparse.Namespace, beam_args: list[str], prog: str) -> int:
    """``--dry-run``: the run itself, on the DirectRunner, into a ``0700`` scratch folder: a copy
    of the release root (its windows, catalogue and lineage) and a new ``--output``. Prints what
    it would release and (curator only, without ``--quiet``) the rows by outcome, from the
    scratch manifest; the real root, ``--output`` and previous ledger are never written. A run
    continuing a ledger continues it from a scratch copy of its manifest that records the scratch
    root (:func:`_previewed_previous`). Its refusals are the real run's, made by the same code."""
    refusal = preview.runner_refusal(beam_args)
    if refusal:
        print(f"{prog}: refused: argument --dry-run: {refusal}", file=sys.stderr)
        return 2
    with private_run_dir("renyi-preview-") as scratch:
        public = scratch / "public"
        preview.copy_folder(args.releases_parquet, public)
        inner = [a for a in argv if a != "--dry-run"] + ["--releases-parquet", str(public),
                                                          "--output", str(scratch / "output")]
        if args.previous_ledger.lower() != "none":
            inner += ["--previous-ledger", _previewed_previous(args, public, scratch / "previous")]
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):  # its "released ..." lines: this prints its own
            status = main(inner, prog=prog)
        manifest_path = scratch / "output" / COMMITTED
        if not manifest_path.exists():
            return status or 1
        manifest = json.loads(manifest_path.read_text())
    preview.print_summary(windows=len(manifest["schedule"]),
                          queries=sorted({q["query_id"] for q in manifest.get("query_plan", [])}),
                          totals=manifest["totals"], balanced=manifest["balanced"], quiet=args.quiet,
                          untouched=(args.releases_parquet, args.output))
    return status


def _is_direct(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    return "Direct" in str(runner)


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m renyi_stream.pipelines.distributed") -> int:
    parser = _parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    args, beam_args = parse_args(argv, prog)
    if args.dry_run:
        return dry_run(argv, args, beam_args, prog)
    logging.getLogger().setLevel(logging.ERROR)  # Beam's GCP extras warn about optional clients
    logging.getLogger(__name__).setLevel(logging.INFO)
    try:
        plan = prepare(args)
    except (RunRefused, ValueError) as exc:
        print(f"{parser.prog}: refused: {worded(str(exc), args, parser)}", file=sys.stderr)
        return 2
    options = pipeline_options(plan, args, beam_args)
    direct = _is_direct(options)
    if direct and args.noise_key_secret:  # no worker start-up on the DirectRunner: fetch here
        worker_key.materialise(args.noise_key_secret, plan.key_path)
    if plan.previous is not None:  # the previous run committed; a crash may have kept its releases staged
        try:
            caught_up = publish_committed(plan.previous, plan.releases)
        except lineage.LineageConflict as exc:
            print(f"{parser.prog}: refused: {worded(str(exc), args, parser)}", file=sys.stderr)
            return 2
        if caught_up:
            print(f"[distributed] published {len(caught_up)} window(s) the previous run committed but had not "
                  f"published: {caught_up[:5]}", file=sys.stderr)
    for attempt in range(3):  # the catalogue as planned, unless a curator changed it meanwhile
        try:
            for change in record_queries(plan):
                print(f"[distributed] {change}", file=sys.stderr)
            break
        except ContractError as exc:  # recorded by another run since prepare checked it
            print(f"{parser.prog}: refused: {worded(str(exc), args, parser)}", file=sys.stderr)
            return 2
        except CatalogueChanged:
            try:
                plan = prepare(args)
            except (RunRefused, ValueError) as exc:
                print(f"{parser.prog}: refused: {worded(str(exc), args, parser)}", file=sys.stderr)
                return 2
    else:
        print(f"{parser.prog}: refused: the query catalogue under {plan.releases} kept changing while this run "
              "was launched; launch it again", file=sys.stderr)
        return 2
    write_intent(plan)
    if not args.quiet:
        print(f"[distributed] {CURATOR_ONLY_NOTICE}", file=sys.stderr)
    users = "" if args.quiet else f"{plan.previous_users:,} users in the previous ledger, "
    windows = format_windows(list(plan.schedule), plan.window, limit=3) if plan.schedule else "no window"
    print(f"[distributed] attempt {plan.attempt}: {len(plan.inputs)} input file(s), {windows} "
          f"({len(plan.schedule)} to release), {users}{plan.n_shards} shards", file=sys.stderr)
    p = beam.Pipeline(runner=batch_runner(options), options=options)
    build(p, plan)
    result = p.run()
    if not (args.wait or direct):
        print(f"[distributed] submitted; {join(plan.output, COMMITTED)} appears when the job has committed",
              file=sys.stderr)
        return 0
    result.wait_until_finish()
    manifest = read_json(join(plan.output, COMMITTED))
    t = manifest["totals"]
    # Invariant 4 (nothing-pre-noise-leaves, docs/architecture.md): the exact counts stay in the curator's manifest.
    if args.quiet:
        balanced = "balanced" if manifest["balanced"] else "MISMATCH"
        print(f"released {len(plan.schedule)} window(s); row totals [{balanced}]; exact counts: "
              f"{join(plan.output, COMMITTED)}, curator only")
        return 0 if manifest["balanced"] else 1
    print(CURATOR_ONLY_NOTICE)
    print(f"released {len(plan.schedule)} window(s); rows read {t['rows_read']:,} = admitted {t['admitted']:,} + "
          f"clipped {t['clipped']:,} + dropped {t['dropped']:,} + rejected {t['rejected']:,} + late {t['late']:,}  "
          f"[{'balanced' if manifest['balanced'] else 'MISMATCH'}]; ledger: {manifest['users']:,} users "
          f"({plan.output})")
    return 0 if manifest["balanced"] else 1


if __name__ == "__main__":
    sys.exit(main())
