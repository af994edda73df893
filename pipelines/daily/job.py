"""The daily job: input files -> Beam pipeline -> one curator transaction -> public releases.

Order of a run (each step safe to crash after):

1. take the run lock (one run per ledger) and open the curator's ledger database;
2. publish any releases a crashed earlier run committed but did not publish (outbox);
3. run the Beam pipeline over the inputs for the windows of the schedule not yet released,
   starting from the stored ledger; its outputs land in a private scratch folder;
4. commit the new ledger, the releases, the row counts and the dead letters in one DuckDB
   transaction (``CuratorStore.commit_run``);
5. publish the releases to the public store window by window (idempotent: first write wins) and
   mark them (:func:`renyi_stream.stream.engine.publication.publish_outbox`, the rule every job shares).

A re-run of a processed day finds its windows released: its rows are dead-lettered as late,
nobody is charged, nothing new is released, and step 5 re-publishes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from renyi_stream.pipelines.curator.store import CuratorStore, CuratorStoreError, RunLock, crash_point
from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA
from renyi_stream.stream.engine.publication import publish_outbox
from renyi_stream.stream.engine.input_days import DayRange, days_of_files, format_windows, refuse_uncovered_windows
from renyi_stream.stream.engine.row_balance import RowBalance, reason_counts
from renyi_stream.stream.engine.readers import MalformedLines, check_declared_columns, declares_types, id_type_of, read_batches
from renyi_stream.stream.engine.shard_state import WINDOW_COUNT_NAMES, PlannedQuery, QueryPlan, refuse_running_gaps
from renyi_stream.queries.registration import contract_defaults, declared_header, plan_columns
from renyi_stream.queries.release_files import write_release_file
from renyi_stream.queries.release_store import RELEASE_SCHEMA, ReleaseStore
from renyi_stream.stream.accounting import DEFAULT_ACCOUNTING, calibrate
from renyi_stream.stream.engine.ledger_config import DEFAULT_SHARDS, LedgerConfig
from renyi_stream.stream.columns import KEY_COLUMNS, InputColumns, declared_kind, default_columns
from renyi_stream.stream.contract import ContractError, InputContract, declaration_hint
from renyi_stream.stream.continual.prepaid import DEFAULT_RUNNING_STRATEGY, RUNNING_STRATEGIES, check_running_size
from renyi_stream.stream.engine.running import MIGRATION
from renyi_stream.stream.ledger import STATUS_NAMES, Policy
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE, private_run_dir, private_umask
from renyi_stream.stream.schema import DEFAULT_KEYS, WindowSpec

#: The name of a run's scratch folder in the temp dir: ``renyi-run-<pid>-<random>``
#: (:func:`renyi_stream.stream.private_files.private_run_dir`).
SCRATCH_PREFIX = "renyi-run-"


@dataclass(frozen=True)
class JobConfig:
    """One run of the daily job. Windows are integer ids of ``window`` (days by default)."""

    inputs: tuple[str, ...]
    store: str
    ledger: str
    epsilon: float
    delta: float
    norm_budget: float
    start_window: int
    end_window: int
    window: WindowSpec = field(default_factory=WindowSpec)
    policy: str = "drop"
    accounting: str = DEFAULT_ACCOUNTING
    key_path: str | None = None
    n_shards: int = DEFAULT_SHARDS
    beam_args: tuple[str, ...] = ()
    releases_parquet: str | None = None  # also write releases as Parquet files under this root
    release: str = "window"  # kind of the default per-column queries: "window" or "running"
    strategy: str | None = None  # strategy of default running queries (RUNNING_STRATEGIES; None: blt)
    horizon: int | str | None = None  # declared schedule of default running queries (None: 365; "tail")
    contract: InputContract | None = None  # the declared input (kept by the ledger for life once recorded)
    id_type: str | None = None  # the declared id type alone, for a ledger without a declared contract
    # The days of the inputs whose path names none (None: the schedule's days), and the days the
    # operator says have no file (released as noise only): renyi_stream.stream.engine.input_days.
    input_days: DayRange | None = None
    no_data_days: tuple[DayRange, ...] = ()
    store_moved: bool = False  # the release store moved: record its new place (CuratorStore.bind_release_store)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("inputs must name at least one file")
        if self.start_window > self.end_window:
            raise ValueError(f"start must not be after end, got start window {self.start_window} > end window {self.end_window}")
        if self.end_window - self.start_window > 100_000:
            raise ValueError("the schedule may span at most 100000 windows")
        Policy(self.policy)
        if self.release not in ("window", "running"):
            raise ValueError(f"release must be 'window' or 'running', got release={self.release!r}")
        if self.strategy is not None and (self.release != "running" or self.strategy not in RUNNING_STRATEGIES):
            raise ValueError(f"strategy must be one of {RUNNING_STRATEGIES}, and only with release='running', got "
                             f"strategy={self.strategy!r} with release={self.release!r}")
        if self.horizon is not None:
            if self.release != "running":
                raise ValueError(f"horizon applies only with release='running', got horizon={self.horizon!r} with "
                                 f"release={self.release!r}")
            # ValueError by name; the default queries have one coordinate each
            check_running_size(self.strategy or DEFAULT_RUNNING_STRATEGY, self.horizon, 1)
        # The in-process runner's limit (every shard is a keyed state cell in this process); the
        # distributed and streaming jobs take up to renyi_stream.stream.engine.ledger_config.MAX_SHARDS.
        if not 1 <= self.n_shards <= 4096:
            raise ValueError(f"n_shards must be in [1, 4096], got n_shards={self.n_shards}")
        calibrate(epsilon=self.epsilon, delta=self.delta, norm_budget=self.norm_budget, accounting=self.accounting)

    @property
    def resolved_key_path(self) -> str:
        return self.key_path or str(Path(self.ledger).with_name(Path(self.ledger).stem + ".noise.key"))


@dataclass(frozen=True)
class JobSummary(RowBalance):
    """What a run did (curator-only: counts are sensitive): its row balance (the
    :class:`renyi_stream.stream.engine.row_balance.RowBalance` every job records, ``balanced`` deciding the
    exit status), and the windows, releases and users."""

    run_id: int
    windows_released: list[int]
    windows_skipped: list[int]
    releases_published: int
    users_in_ledger: int
    seconds: float


def _file_days(config: JobConfig, to_release: list[int], say):
    """The days each input holds and the structural refusal of a run with a window to release
    that no input covers (:func:`renyi_stream.stream.engine.input_days.refuse_uncovered_windows`);
    says on the console which files name no day and what they are taken to hold."""
    days = days_of_files(config.inputs, spec=config.window, start_window=config.start_window,
                         end_window=config.end_window, input_days=config.input_days)
    undated = days.undated()
    if undated:
        how = "--input-days" if days.declared_by_operator else "the schedule, --start..--end"
        say(f"[run] {len(undated)} input file(s) name no day ({undated[0]}"
            f"{' and others' if len(undated) > 1 else ''}): taken as holding {days.declared} ({how}); a row of "
            "another day is a dead letter. Name each file by its day (day=YYYY-MM-DD/ or a date in its name) so "
            "that another day's file is refused")
    refuse_uncovered_windows(days, to_release, spec=config.window, no_data=config.no_data_days)
    return days


class _Commit:
    """Whether a run reached its commit point (set just before ``commit_run``)."""

    committed = False


def _paths_a_run_may_create(config: JobConfig) -> list[Path]:
    """The files and folders a run creates that do not exist yet: the ledger (and DuckDB's
    ``.wal`` and ``.tmp/`` beside it), its noise key, the release store, and their folders."""
    files = [Path(config.ledger), Path(config.ledger + ".wal"), Path(config.ledger + ".tmp"),
             Path(config.resolved_key_path), Path(config.store), Path(config.store + ".wal")]
    fresh: list[Path] = []
    for path in files:
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            fresh.append(folder)
            folder = folder.parent
        if not os.path.lexists(path):
            fresh.append(path)
    return fresh


@contextlib.contextmanager
def _removed_unless_committed(created: list[Path]):
    """Remove ``created`` (what a run created: :func:`_paths_a_run_may_create`) when the run
    fails before its commit point, so a refused first run, or a run refused on a new store,
    leaves nothing behind: a second try starts as the first did. Entered under the run lock, so
    a run refused because another holds the ledger removes nothing of the other's."""
    commit = _Commit()
    try:
        yield commit
    except BaseException:
        if not commit.committed:
            for path in sorted(created, key=lambda p: len(p.parts), reverse=True):  # files, then folders
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
        raise


def _conditional(say):
    """A preview's console: each ``[run] ...`` line of a real run as ``[dry run] ...``, and what
    a real run did (committed, published) as what it would do."""
    words = (("[run] committed ", "[dry run] would commit "), ("[run] published ", "[dry run] would publish "),
             ("[run] running ", "[dry run] running "), ("[run] ", "[dry run] "))

    def conditional(msg: str) -> None:
        for real, preview in words:
            if msg.startswith(real):
                msg = preview + msg[len(real):]
                break
        say(msg)
    return conditional


def _contract(config: JobConfig, existing: LedgerConfig | None) -> InputContract | None:
    """The run's input contract: the one it declares, else the one the ledger records. A new ledger
    must be given one (ContractError naming the options); a ledger recorded before contracts
    existed may go on without (None: its columns follow the undeclared rule of
    :mod:`renyi_stream.stream.columns`). Every input must hold the declared columns (InputFileError, before
    anyone is charged)."""
    contract = config.contract or (existing.contract if existing else None)
    if contract is None and existing is None:
        header = next(read_batches(config.inputs[0], batch_rows=1, malformed=MalformedLines())).schema.names
        raise ContractError(f"the ledger {config.ledger} is new: {declaration_hint(header)}")
    if contract is not None:
        for path in config.inputs:
            check_declared_columns(path, contract)
    return contract


def _id_type(config: JobConfig, existing: LedgerConfig | None, contract: InputContract | None) -> str:
    """The ledger's id type: declared (the contract's, or ``--id-type``), else recorded, else the
    first input's *declared* type: a CSV declares none, so its ids are text (compared byte for
    byte), whatever they look like; a Parquet or Arrow file's integer id column is int64."""
    if contract is not None:
        return contract.id_type
    if config.id_type is not None:
        return config.id_type
    if existing is not None:
        return existing.id_type
    return id_type_of(config.inputs[0])


def _first_input(paths: Sequence[str]) -> tuple[str, pa.Schema, bool]:
    """The first input's path, its columns and whether their types are declared (Parquet, Arrow;
    a CSV declares none): what :mod:`renyi_stream.stream.columns` decides the numeric columns from, for a
    ledger without a declared contract."""
    first = next(read_batches(paths[0], batch_rows=16, malformed=MalformedLines()))
    return paths[0], first.schema, declares_types(paths[0])


def run_job(config: JobConfig, progress: TextIO | None = None, *, preview: bool = False) -> JobSummary:
    """Run one daily job end to end; see the module docstring for the order of steps.

    Whether it is refused depends on its arguments, its files' names and formats, the contract
    and the schedule, never on any one row (:mod:`renyi_stream.stream.engine.input_days`: every
    window it releases must be covered by an input named for that day). A run refused before
    its commit leaves nothing it created behind (a first run's ledger, key and store, a new
    store's file). ``preview``: the run is :func:`preview_job`'s, on scratch copies; its console
    lines speak in the conditional."""
    started = time.perf_counter()
    say = (lambda msg: (progress.write(msg + "\n"), progress.flush())) if progress else (lambda msg: None)
    if preview:
        say = _conditional(say)
    created = _paths_a_run_may_create(config)  # before the lock, which creates the ledger's folder
    with RunLock(config.ledger), _removed_unless_committed(created) as commit, CuratorStore(config.ledger) as curator:
        key = NoiseKey.load_or_create(config.resolved_key_path)
        existing = curator.parameters()
        contract = _contract(config, existing)
        wanted = LedgerConfig.from_promise(
            epsilon=config.epsilon, delta=config.delta, norm_budget=config.norm_budget, accounting=config.accounting,
            # The declared id type, the ledger's for life: the validator parses each row's id as it.
            id_type=_id_type(config, existing, contract), key_fingerprint=key.fingerprint, window=config.window,
            n_shards=config.n_shards, ledger_id=curator.ledger_id, contract=config.contract)
        # One short session on the public store before the pipeline (analysts' readers are locked
        # out while a writer holds it; the pipeline itself runs with the store closed).
        with ReleaseStore(config.store) as store:
            _refuse_a_ledger_behind_the_store(curator, store, config)
            curator.bind_release_store(store, moved=config.store_moved)  # one ledger, one store
            params = curator.check_or_record_parameters(wanted)
            stored_key = store.key_fingerprint()
            if stored_key is not None and stored_key != key.fingerprint:  # before anyone is charged
                from renyi_stream.queries.release_store import ReleaseConflictError

                raise ReleaseConflictError(
                    f"release store {config.store} holds releases made with noise key {stored_key}; this run's "
                    f"noise key file {config.resolved_key_path} is key {key.fingerprint}: refusing to charge "
                    "users for answers the store cannot take. Use the key (and ledger) that made this store, "
                    "or another --store")
            store.check_ledger(curator.ledger_id)  # one store, one ledger: before anyone is charged
            recovered = _publish_pending(curator, store, config.releases_parquet)
            if recovered:
                say(f"[run] published {recovered} releases left pending by an interrupted run")
            released = curator.processed_windows()
            schedule = list(range(config.start_window, config.end_window + 1))
            to_release = [w for w in schedule if w not in released]
            skipped = [w for w in schedule if w in released]
            file_days = _file_days(config, to_release, say)  # before anyone is charged
            run_id = curator.next_run_id()
            previous = curator.load_ledger(params)
            previous_running = curator.load_running(params.id_type)
            previous_release = curator.load_release_states()
            plan, kinds = _query_plan(store, config, params.contract, to_release, released, say)
            _refuse_history_running_queries(plan, curator.history_running_queries(), to_release, config.ledger)
            columns = list(kinds.numeric)  # parsed as numbers: a value that does not parse is a dead letter
            store.record_input_columns(kinds.numeric, kinds.strings, kinds.undeclared)
            if params.contract is not None:
                store.record_input_contract(params.contract.to_json())
        categories = sorted({c for e in plan.entries if getattr(e.query, "categorical", False)
                             for c in e.query.columns_needed})
        _refuse_gaps_in_running_queries(plan, previous_release, to_release)
        say(f"[run] {CURATOR_ONLY_NOTICE}")
        say(f"[run] run {run_id}: {len(config.inputs)} input file(s), {len(to_release)} window(s) to release, "
            f"{len(skipped)} already released, {previous.num_rows:,} users in the ledger")
        # The scratch folder (renyi-run-<pid>-*) is 0700; its files (the previous ledger, dead
        # letters) are 0600 too. One a killed run left is removed here, once its process is gone.
        with private_run_dir(SCRATCH_PREFIX) as scratch, private_umask():
            outputs = _run_pipeline(config, params, plan, columns, released, to_release, previous,
                                    previous_running, curator.load_running_releases(), scratch, say, categories,
                                    ledger_id=curator.ledger_id, previous_release=previous_release,
                                    file_windows={path: span for path in config.inputs
                                                  if (span := file_days.window_range(path, config.window))})
            balance = _row_balance(outputs)
            commit.committed = True  # from here on the ledger may hold charges: never removed
            curator.commit_run(
                run_id=run_id, ledger=outputs["ledger"], releases=outputs["releases"],
                window_counts=outputs["window_counts"], run_counts=balance.totals(),
                dead_letters=outputs["dead"], previous_users=previous.num_rows,
                running=outputs["running"], running_releases=outputs["raw"],
                release_states=outputs["release_state"],
            )
        say(f"[run] committed the ledger ({outputs['ledger'].num_rows:,} users) and "
            f"{outputs['releases'].num_rows} releases")
        crash_point("before_publish")
        with ReleaseStore(config.store) as store:
            published = _publish_pending(curator, store, config.releases_parquet)
            store.record_promise(epsilon=params.epsilon, delta=params.delta, accounting=params.accounting,
                                 norm_budget=params.norm_budget)
        return JobSummary(
            **balance.totals(), run_id=run_id, windows_released=to_release, windows_skipped=skipped,
            releases_published=published, users_in_ledger=outputs["ledger"].num_rows,
            seconds=time.perf_counter() - started,
        )


@dataclass(frozen=True)
class Preview:
    """What a run would do (:func:`preview_job`): its summary as if it had run, and the queries
    it would answer in the windows it would release. Curator-only, as every run's counts."""

    summary: JobSummary
    queries: list[str]


def preview_job(config: JobConfig, progress: TextIO | None = None) -> Preview:
    """Run ``config`` on private copies of its ledger, store and noise key, and report what it
    would do, charging and publishing nothing: the real ledger, store, key and Parquet release
    root are not written (the copies are made under the ledger's run lock, in a ``0700``
    scratch folder removed afterwards). Every refusal of a real run (a wrong file, a missing
    declared column, another contract, a run that feeds no window) is made the same way, by
    the same code, since it is the same run. A new ledger's preview draws its noise from a
    throwaway key: a preview's releases are never shown."""
    with private_run_dir(SCRATCH_PREFIX) as scratch:
        scratch = Path(scratch)
        with RunLock(config.ledger):
            for source, name in ((config.ledger, "ledger.duckdb"), (config.store, "releases.duckdb"),
                                 (config.resolved_key_path, "ledger.noise.key")):
                for suffix in ("", ".wal"):
                    if Path(source + suffix).is_file():
                        shutil.copy2(source + suffix, scratch / (name + suffix))
        copy = dataclasses.replace(config, ledger=str(scratch / "ledger.duckdb"), store=str(scratch / "releases.duckdb"),
                                   key_path=str(scratch / "ledger.noise.key"), releases_parquet=None)
        summary = run_job(copy, progress=progress, preview=True)
        with ReleaseStore(copy.store, read_only=True) as store:
            releases = store.read()
        answered = releases.filter(pc.is_in(releases.column("window_id"),
                                            value_set=pa.array(summary.windows_released, pa.int64())))
        return Preview(summary=summary, queries=sorted(set(answered.column("query_id").to_pylist())))


def _refuse_a_ledger_behind_the_store(curator: CuratorStore, store: ReleaseStore, config: JobConfig) -> None:
    """A ledger that does not know every released window was lost, replaced or restored from an
    old backup: its users would be charged from a budget that forgets what they already spent."""
    releases = store.read()
    released = {(q, int(w)) for q, w in zip(releases.column("query_id").to_pylist(),
                                           releases.column("window_id").to_pylist())}
    unknown = released - curator.processed_keys()
    if unknown:
        example = sorted(unknown)[0]
        raise CuratorStoreError(
            f"the release store {config.store} holds {len(unknown)} release(s) the ledger {config.ledger} never "
            f"charged (e.g. query {example[0]!r}, {format_windows([example[1]], config.window)}): the ledger is missing, new or older "
            "than the store. Restore the ledger that produced these releases; starting users from zero "
            "budget would break every user's promise."
        )


class CuratorOutbox:
    """The daily job's outbox (:class:`renyi_stream.stream.engine.publication.Outbox`): the curator store's
    ``outbox`` table, written in the same DuckDB transaction as the ledger that charged its
    releases (:meth:`CuratorStore.commit_run`), so every window it lists is committed."""

    def __init__(self, curator: CuratorStore) -> None:
        self._curator = curator

    def committed_windows(self) -> list[int]:
        return self._curator.pending_windows()

    def rows(self, window: int) -> pa.Table:
        return self._curator.pending_releases(window)

    def mark_published(self, window: int) -> None:
        self._curator.mark_published(window)


class StoreAndFiles:
    """The daily job's public side (:class:`renyi_stream.stream.engine.publication.PublicReleases`): the DuckDB
    release store (first write wins on ``(query_id, window_id, coordinate)``, for one ledger and
    one noise key) and, with ``parquet_root``, one release file per window
    (:mod:`renyi_stream.queries.release_files`, first write wins), written after the window's store commit."""

    def __init__(self, store: ReleaseStore, ledger_id: str, parquet_root: str | None = None) -> None:
        self._store = store
        self._ledger_id = ledger_id
        self._parquet_root = parquet_root

    def check(self, rows: dict[int, pa.Table]) -> None:
        """The store's checks over every window at once (another ledger, another key, a row
        differing from a released one): a conflict anywhere publishes nothing."""
        if rows:
            self._store.check_publishable(pa.concat_tables(list(rows.values())), ledger_id=self._ledger_id)

    def publish(self, window: int, rows: pa.Table) -> int:
        """One store transaction for the window (rows already released identically are
        skipped), then its release file; the rows new to the store."""
        inserted = self._store.publish(rows, ledger_id=self._ledger_id)
        if self._parquet_root:
            write_release_file(self._parquet_root, window, rows)
        return inserted


def _publish_pending(curator: CuratorStore, store: ReleaseStore, parquet_root: str | None = None) -> int:
    """Publish the committed outbox (:func:`renyi_stream.stream.engine.publication.publish_outbox`): into the
    DuckDB store and, with ``parquet_root``, as one Parquet file per window. Public answers leave
    only from here, after the curator's transaction charged every user for them (an answer nobody
    was charged for must never exist, even after a crash; docs/architecture.md, "The outbox
    rule"). Window by window, each marked once public: a crash between two leaves some windows
    public and the rest pending, and the next run publishes the rest. Returns the rows new to
    the store."""
    return publish_outbox(CuratorOutbox(curator), StoreAndFiles(store, curator.ledger_id, parquet_root)).rows


def _row_balance(outputs: dict[str, pa.Table]) -> RowBalance:
    """The run's row balance: rows read, the filter's outcomes summed over windows, and the dead
    letters by reason (:class:`renyi_stream.stream.engine.row_balance.RowBalance`)."""
    wc = outputs["window_counts"]
    statuses = {name: int(pc.sum(wc.column(name)).as_py() or 0) if wc.num_rows else 0 for name in STATUS_NAMES}
    return RowBalance.of(rows_read=int(outputs["rows_read"]), statuses=statuses,
                         reasons=reason_counts([outputs["dead"]]))


def _beam():
    # Beam's GCP extras log a warning at import when their optional clients are absent;
    # a local run has no use for them, so keep the import quiet.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    finally:
        root.setLevel(level)
    return beam, PipelineOptions


def _query_plan(store: ReleaseStore, config: JobConfig, contract: InputContract, to_release: list[int],
                processed: set[int] | None = None, say=lambda msg: None) -> tuple[QueryPlan, InputColumns]:
    """The registered queries active in this run's windows, and the kinds of the input's columns.

    On a store with no registered query, the default per-column queries (kind ``config.release``)
    are registered first, from this run's first window, so that the catalogue always lists what
    is answered. A query registered into a window already charged but not yet published (after a
    crash) starts at the first window after the charged ones
    (:meth:`QueryRegistry.defer_unanswered`). Which columns are numeric is the ledger's declared
    contract (:mod:`renyi_stream.stream.contract`), never the input's values or its writer's types; a query
    the contract cannot feed is refused here, before anyone is charged."""
    from renyi_stream.queries.registry import QueryRegistry

    if contract is not None:
        header = declared_header(contract)
        where, declared, parsed = "the declared contract", True, contract.numeric
    else:
        path, header, declared = _first_input(config.inputs)
        where, parsed = f"input file {path}", ()
    registry = QueryRegistry(store)
    if processed:
        for query_id, old, new in registry.defer_unanswered(max(processed)):
            say(f"[run] query {query_id!r} was registered from {format_windows([old], config.window)}, which an "
                f"interrupted run had already answered without it; it now starts at "
                f"{format_windows([new], config.window)}")
    if to_release and registry.list().num_rows == 0:
        if contract is not None:
            _register_declared_defaults(registry, config, contract, min(to_release), say)
        else:
            _register_defaults(registry, config, path, header, declared, min(to_release), say)
    entries = [PlannedQuery(query, first, retired)
               for query, first, retired in registry.plan(min(to_release), max(to_release))] if to_release else []
    # A run with nothing to release (a re-run of released days) parses its rows as the queries of
    # its schedule did: they are then dead-lettered as late.
    readers = entries or ([] if to_release else
                          [PlannedQuery(q, f, r) for q, f, r in registry.plan(config.start_window, config.end_window)])
    kinds = plan_columns([e.query for e in readers], [e.query for e in entries], header, declared_types=declared,
                         where=where, parsed=parsed)
    return QueryPlan(tuple(entries)), kinds


def _register_declared_defaults(registry, config: JobConfig, contract: InputContract, first_window: int,
                                say) -> None:
    """Register the default queries of a declared contract from ``first_window``
    (:func:`renyi_stream.queries.registration.contract_defaults`: a clamped sum per bounded number column)."""
    for query in contract_defaults(contract, kind=config.release, strategy=config.strategy, horizon=config.horizon):
        registry.add(query, effective_from=first_window)
    unbounded = [c for c in contract.numeric if c not in {b.name for b in contract.bounded}]
    if unbounded:
        say(f"[run] column(s) {unbounded} are declared without a bound: no default sum (register a clamp query "
            "to answer one)")
    if contract.categories:
        say(f"[run] category column(s) {list(contract.categories)} get no default query: a histogram over their "
            "declared categories can read them")


def _register_defaults(registry, config: JobConfig, path: str, header: pa.Schema, declared: bool,
                       first_window: int, say) -> None:
    """Register the default per-column queries from ``first_window``: over the declared numeric
    columns of a Parquet/Arrow input, over every non-key column of a CSV (it declares no types:
    its columns are not guessed from their values)."""
    from renyi_stream.queries.linear import default_queries

    columns = default_columns(header, declared_types=declared)
    if not columns:
        raise ValueError(f"input file {path} has no numeric indicator columns")
    for query in default_queries(columns, kind=config.release, strategy=config.strategy, horizon=config.horizon):
        registry.add(query, effective_from=first_window)
    if not declared:
        say(f"[run] a CSV declares no column types: every column but user_id and the time, {columns}, is answered "
            "as numbers (a value that does not parse is a dead letter); to answer only some, register the queries "
            "before the first run")
        return
    text = [f.name for f in header if f.name not in KEY_COLUMNS and declared_kind(f.type) == "string"]
    if text:
        say(f"[run] text column(s) {text} get no default query: a histogram over their categories can read them")


def _refuse_history_running_queries(plan: QueryPlan, history: Sequence[str], to_release: list[int],
                                    ledger: str) -> None:
    """A running query whose stored state is a per-window history (the square-root era, running
    version 1) cannot continue under prepaid admission: its users' past charges are not prepaid
    charges. Refused before anyone is charged, with the way to migrate."""
    old = sorted(e.query_id for e in plan.running if e.query_id in set(history)
                 and any(e.active_in(w) for w in to_release))
    if old:
        raise CuratorStoreError(f"the ledger {ledger} holds running query {old[0]!r} in the old per-window history "
                                f"format (running version 1): {MIGRATION}")


def _refuse_gaps_in_running_queries(plan: QueryPlan, previous_release: dict[str, pa.Table],
                                    to_release: list[int]) -> None:
    """The one schedule rule of running totals (:func:`renyi_stream.stream.engine.shard_state.refuse_running_gaps`)
    over the release states the curator store holds."""
    refuse_running_gaps(plan, {q: int(t.schema.metadata[b"next_window"]) for q, t in previous_release.items()},
                        to_release)


def _run_pipeline(config: JobConfig, params: LedgerConfig, plan: QueryPlan, columns: list[str],
                  released: set[int], to_release: list[int], previous: pa.Table,
                  previous_running: dict[str, pa.Table], previous_raw: dict, scratch: Path,
                  say, categories: Sequence[str] = (), *, ledger_id: str,
                  previous_release: dict[str, pa.Table] | None = None,
                  file_windows: dict[str, tuple[int, int]] | None = None) -> dict[str, pa.Table]:
    beam, PipelineOptions = _beam()
    from renyi_stream.pipelines.beam import transforms as tx
    from renyi_stream.pipelines.beam.local_runner import batch_runner

    options = PipelineOptions(list(config.beam_args) or ["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    out = Path(scratch)
    # The previous state goes to the pipeline as files it reads itself, not embedded in the graph.
    ledger_file = out / "previous-ledger.parquet"
    pq.write_table(previous, ledger_file)
    running_files = {}
    for i, (query_id, table) in enumerate(sorted(previous_running.items())):
        running_files[query_id] = str(out / f"previous-running-{i}.parquet")
        pq.write_table(table, running_files[query_id])
    say(f"[run] running the Beam pipeline ({options.view_as(beam.options.pipeline_options.StandardOptions).runner})")
    with _imports_frozen(), beam.Pipeline(runner=batch_runner(options), options=options) as p:
        graph = p | "DailyReleases" >> tx.DailyReleases(
            config.inputs, window=config.window, start_window=config.start_window, end_window=config.end_window,
            released=sorted(released), schedule=to_release, plan=plan, indicator_columns=columns,
            noise_std=params.noise_std, policy=config.policy, budget=params.rho, id_type=params.id_type,
            tracker_step=params.tracker_step, n_shards=config.n_shards, previous_ledger=str(ledger_file),
            key_path=config.resolved_key_path, accounting=params.accounting,
            key_fingerprint=params.key_fingerprint, ledger_id=ledger_id, previous_running=running_files,
            previous_raw=previous_raw, category_columns=categories, previous_release=previous_release,
            file_windows=file_windows, keys=params.contract.keys if params.contract is not None else DEFAULT_KEYS)
        # One collection of (output, item) and one group: each extra transform costs Beam a
        # signature inspection per bundle and planning time per run (seven gathers were a tenth
        # of a run; a ToList is nine transforms, a GroupByKey one).
        tagged = [graph[name] | f"Tag{name.title()}" >> beam.Map(_tagged, name) for name in _OUTPUT_TABLES]
        _ = (tagged | "AllOutputs" >> beam.Flatten().with_output_types(Tuple[int, Any])
             | "Gather" >> beam.GroupByKey()
             | "WriteOutputs" >> beam.Map(_write_outputs, str(out)))
    outputs = {name: _read_output(out, name) for name in _OUTPUT_TABLES}
    template = params.empty_ledger().to_arrow()
    ledger = outputs["ledger"]
    ledger = ledger.cast(template.schema.remove_metadata()).replace_schema_metadata(template.schema.metadata)
    return {
        "releases": outputs["releases"].cast(RELEASE_SCHEMA),
        "ledger": ledger,
        "window_counts": outputs["counts"],
        "dead": outputs["dead"],
        "rows_read": int(np.sum(outputs["read"].column("rows").to_numpy())) if outputs["read"].num_rows else 0,
        "read": outputs["read"],
        "raw": [(q, int(w), y) for q, w, y in zip(*(outputs["raw"].column(c).to_pylist()
                                                    for c in ("query_id", "window_id", "y")))],
        "running": _split_running(outputs["running"]),
        "release_state": _split_release_states(outputs["release_state"]),
    }


@contextlib.contextmanager
def _imports_frozen():
    """Keep the objects that exist before the run (every imported module's, Beam's above all:
    several hundred thousand) out of the cyclic garbage collector's scans while the pipeline
    runs, so a full collection scans only what the run allocates (``gc.freeze``); they rejoin
    the collector afterwards. The collector still runs: nothing is kept alive by this."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _tagged(item, name: str) -> tuple[int, tuple[str, object]]:
    return 0, (name, item)  # one key: every output meets in one group


def _read_output(folder: Path, name: str) -> pa.Table:
    """An output written by :func:`_write_outputs`, or its empty table when the run produced no
    output at all (then the group never fired)."""
    path = folder / f"{name}.parquet"
    return pq.read_table(path) if path.exists() else _OUTPUT_TABLES[name]([])


def _write_outputs(group: tuple[int, Iterable[tuple[str, object]]], folder: str) -> None:
    """Each output's items as ``<folder>/<output>.parquet`` (an empty table when it has none)."""
    _, items = group
    by_name: dict[str, list] = {name: [] for name in _OUTPUT_TABLES}
    for name, item in items:
        by_name[name].append(item)
    for name, to_table in _OUTPUT_TABLES.items():
        pq.write_table(to_table(by_name[name]), f"{folder}/{name}.parquet")


def _releases_table(rows: list[dict]) -> pa.Table:
    if not rows:
        return RELEASE_SCHEMA.empty_table()
    rows = sorted(rows, key=lambda r: (r["query_id"], r["window_id"], r["coordinate"]))
    return pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA)


def _concat_ledgers(tables: list[pa.Table]) -> pa.Table:
    if not tables:
        return pa.table({"user_id": pa.array([], type=pa.int64()), "used": pa.array([], type=pa.float64()),
                         "tracker_segment": pa.array([], type=pa.float64()),
                         "tracker_bound": pa.array([], type=pa.float64())})
    merged = pa.concat_tables([t.replace_schema_metadata(None) for t in tables], promote_options="default")
    return merged.sort_by("user_id")


#: The daily job's per-window counts: the filter's (WINDOW_COUNT_NAMES) and the prepaid rows the
#: running queries' kernels read (curator only: a run's work, checked on counts by the tests).
_COUNT_NAMES = (*WINDOW_COUNT_NAMES, "prepaid_rows_read")


def _counts_table(items: list[tuple[int, dict]]) -> pa.Table:
    totals: dict[int, dict[str, int]] = {}
    for window, counts in items:
        slot = totals.setdefault(window, dict.fromkeys(_COUNT_NAMES, 0))
        for name in slot:
            slot[name] += counts.get(name, 0)
    windows = sorted(totals)
    return pa.table({"window_id": pa.array(windows, type=pa.int64()),
                     **{name: pa.array([totals[w][name] for w in windows], type=pa.int64())
                        for name in _COUNT_NAMES}})


def _dead_table(tables: list[pa.Table]) -> pa.Table:
    if not tables:
        return DEAD_LETTER_SCHEMA.empty_table()
    return pa.concat_tables([t.cast(DEAD_LETTER_SCHEMA) for t in tables]).sort_by(
        [("source", "ascending"), ("row_index", "ascending")])


def _raw_table(items: list[tuple[str, int, list[float]]]) -> pa.Table:
    return pa.table({"query_id": pa.array([q for q, _, _ in items], type=pa.string()),
                     "window_id": pa.array([w for _, w, _ in items], type=pa.int64()),
                     "y": pa.array([y for _, _, y in items], type=pa.list_(pa.float64()))})


def _running_table(items: list[tuple[str, pa.Table]]) -> pa.Table:
    """Every shard's running-query snapshots in one table (column ``query_id`` added); the
    per-query metadata (equal on every shard, checked) goes to the schema metadata as JSON."""
    metas: dict[str, dict[str, str]] = {}
    parts = []
    for query_id, table in items:
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        if metas.setdefault(query_id, meta) != meta:
            raise RuntimeError(f"running query {query_id!r}: shards disagree on its state ({meta} vs {metas[query_id]})")
        parts.append(table.replace_schema_metadata(None).add_column(
            0, "query_id", pa.array([query_id] * table.num_rows, type=pa.string())))
    if not parts:
        return pa.table({"query_id": pa.array([], type=pa.string())})
    merged = pa.concat_tables(parts, promote_options="default")
    return merged.replace_schema_metadata({"renyi_stream.running_meta": json.dumps(metas, sort_keys=True)})


def _split_running(table: pa.Table) -> dict[str, pa.Table]:
    raw = (table.schema.metadata or {}).get(b"renyi_stream.running_meta")
    if raw is None:
        return {}
    out = {}
    for query_id, meta in json.loads(raw).items():
        part = table.filter(pc.equal(table.column("query_id"), query_id)).drop_columns(["query_id"])
        out[query_id] = part.replace_schema_metadata(meta)
    return out


def _release_states_table(items: list[tuple[str, pa.Table]]) -> pa.Table:
    """Every running query's release state after the run: ``query_id``, its metadata as JSON and
    its values flat (one element per query)."""
    rows = sorted((q, json.dumps({k.decode(): v.decode() for k, v in t.schema.metadata.items()}, sort_keys=True),
                   t.column("values").combine_chunks().flatten().to_pylist()) for q, t in items)
    return pa.table({"query_id": pa.array([q for q, _, _ in rows], type=pa.string()),
                     "meta": pa.array([m for _, m, _ in rows], type=pa.string()),
                     "vals": pa.array([v for _, _, v in rows], type=pa.list_(pa.float64()))})


def _split_release_states(table: pa.Table) -> dict[str, pa.Table]:
    out = {}
    for query_id, meta, vals in zip(*(table.column(c).to_pylist() for c in ("query_id", "meta", "vals"))):
        meta = json.loads(meta)
        values = pa.FixedSizeListArray.from_arrays(pa.array(vals, type=pa.float64()), int(meta["dim"]))
        out[query_id] = pa.table({"values": values}).replace_schema_metadata(meta)
    return out


def _read_table(items: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"source": pa.array([s for s, _ in items], type=pa.string()),
                     "rows": pa.array([n for _, n in items], type=pa.int64())})


#: The pipeline's outputs the daily job gathers, and how each becomes a table.
_OUTPUT_TABLES = {"releases": _releases_table, "ledger": _concat_ledgers, "counts": _counts_table,
                  "dead": _dead_table, "read": _read_table, "raw": _raw_table,
                  "running": _running_table, "release_state": _release_states_table}
