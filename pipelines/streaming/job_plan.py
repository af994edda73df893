"""What a launch of the streaming job does before anything is built, under any runner: brings its
state folder to its last commit (:func:`prepare_output`), checks every argument against the
ledger, the releases and the catalogue, and plans the run (:func:`plan_job`, a :class:`JobPlan`
each runner's shell wires), and writes the catalogue changes it launches with
(:func:`_record_queries`). Imports no Beam.

The queries answered are those of the catalogue beside the public release root
(``<--releases-parquet>/_queries/``, :mod:`renyi_stream.queries.catalogue`), read at launch under the rules of
the daily job's registry (:mod:`renyi_stream.queries.registration`): every window query active in the
schedule, charged together per user through the same
:class:`~renyi_stream.stream.engine.shard_state.QueryPlan` as the batch jobs. On a root whose catalogue has
no query, ``main`` registers the per-window sums of ``--columns`` from ``--start``; a query
registered into windows already released but never answered (it was registered while an
earlier job ran) starts at this job's first window. Running totals go through the batch jobs'
engine objects (:mod:`renyi_stream.pipelines.streaming.running_state`). ``--columns`` names the
numeric indicator columns (parsed as numbers, a value that does not parse a dead letter);
string columns are passed through for the histograms over string categories that read them.
User ids are ``int64`` or ``string``, the ledger's for life (``--id-type``; else a continuing
ledger's own, else the first replayed message's ``user_id`` type, else ``int64``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.beam.running_releases import refuse_running_continuation
from renyi_stream.pipelines.streaming.options import ID_TYPE, _check_source, key_fingerprint
from renyi_stream.pipelines.streaming.recovery import (_refuse_an_output_from_before_commit_markers,
                                                       _refuse_another_jobs_output, check_lineage, job_lineage,
                                                       recover, restarting)
from renyi_stream.pipelines.streaming.running_state import EstimateContinuation, previous_running_state
from renyi_stream.pipelines.streaming.snapshots import _previous_ledger, publish_staged
from renyi_stream.pipelines.streaming.state_folder import _snapshot_glob, last_committed
from renyi_stream.queries.catalogue import LaunchQueries, ReleaseCatalogue, queries_at_launch
from renyi_stream.queries.linear import default_queries
from renyi_stream.queries.registration import (category_reads, contract_defaults, declared_header, numeric_reads,
                                               plan_columns)
from renyi_stream.stream.contract import InputContract, declaration_hint
from renyi_stream.stream.engine.input_days import format_windows
from renyi_stream.stream.engine.ledger_config import LedgerConfig
from renyi_stream.stream.engine.shard_state import PlannedQuery, QueryPlan
from renyi_stream.stream.ledger import Policy
from renyi_stream.stream.schema import DEFAULT_KEYS, InputKeys, WindowSpec


def prepare_output(args: argparse.Namespace) -> None:
    """Before the job is planned: its run in the public lineage (``args.lineage``,
    :func:`renyi_stream.pipelines.streaming.recovery.job_lineage`), the windows an earlier job committed
    but did not publish published (:func:`renyi_stream.pipelines.streaming.snapshots.publish_staged`),
    and, for a restart, its ``--output`` brought to its last commit
    (:func:`renyi_stream.pipelines.streaming.recovery.recover`); each said on stderr (window ids only)."""
    # The job's place in the public lineage (checked by plan_job, after the ledger's own checks).
    args.lineage = job_lineage(store.absolute(args.output), args)
    # An earlier job lost between a window's snapshots and its publication left it staged.
    caught_up = publish_staged(args.previous_ledger, store.absolute(args.releases_parquet))
    if caught_up:
        print(f"[streaming] published {len(caught_up)} window(s) an earlier job committed but had not "
              f"published: {caught_up[:5]}", file=sys.stderr)
    # This job restarted into its --output after a crash: publish what it committed, drop the rest.
    resumed, published, dropped = (recover(store.absolute(args.output), store.absolute(args.releases_parquet))
                                   if restarting(store.absolute(args.output), args) else (None, [], 0))
    if resumed is not None:
        spec = WindowSpec(length_seconds=launch.window_seconds(args.window))
        print(f"[streaming] resuming from {format_windows([resumed], spec)}, the last committed in --output "
              f"{store.absolute(args.output)}" + (f"; published {published[:5]}, committed before a crash"
                                                  if published else "")
              # Not how many files: which ones a shard wrote (duplicates) depends on its rows.
              + ("; removed the files of uncommitted windows" if dropped else ""), file=sys.stderr)
    elif dropped:
        print(f"[streaming] no window was committed in --output {store.absolute(args.output)}: removed "
              "the files a crashed job left and starting from --previous-ledger", file=sys.stderr)


@dataclass(frozen=True, eq=False)
class JobPlan:
    """A launch of the streaming job, checked (:func:`plan_job`): the window length ``spec`` and the
    schedule ``start..end``; the noise key's worker path ``key_path``; the state folder ``curator``,
    the window ``resumed`` from when it restarts (``own``: the last window of this schedule its
    earlier runs charged, ``start - 1`` for none); the release root ``releases`` and its ``released``
    windows; the ledger's ``config`` and its ``previous`` state (the ledger, each running query's
    ``prepaid`` rows, ``release_states`` and ``estimates``); the ``id_type``, the input ``contract``
    (None before declared contracts) and the id and time columns' names ``keys``; the ``queries``
    the catalogue launches with and their ``plan``; the numeric ``indicators`` and the string
    ``categories`` the queries read; ``first_answered`` (every query this ledger has answered, with
    its first window); and ``runs`` (the job's run and its parent's)."""

    spec: WindowSpec
    start: int
    end: int
    key_path: str
    curator: str
    resumed: int | None
    own: int
    releases: str
    released: list[int]
    config: LedgerConfig
    previous: pa.Table
    prepaid: dict[str, pa.Table]
    release_states: dict[str, pa.Table]
    estimates: dict[str, EstimateContinuation]
    id_type: str
    contract: InputContract | None
    keys: InputKeys
    queries: LaunchQueries
    plan: QueryPlan
    indicators: list[str]
    categories: list[str]
    first_answered: dict[str, int]
    runs: tuple[str | None, str | None]

    def release_rows(self) -> dict[int, int]:
        """Each window's release rows: one per coordinate of each active query, and one state per
        active running query."""
        return {w: sum(e.query.dim + (e.kind == "running") for e in self.plan.active(w))
                for w in range(self.start, self.end + 1)}

    @property
    def with_prepaid(self) -> bool:
        """Whether the filter reports every window's prepaid rows (a running query planned or
        restored), which a window's commit then waits for."""
        return bool(self.plan.running or self.prepaid)


def plan_job(args: argparse.Namespace) -> JobPlan:
    """Check the arguments (RunRefused, nothing built, when a check fails; ValueError naming the
    option when the source options do not fit together) and plan the job. ``args.lineage`` is the
    job's place in the public lineage (:func:`prepare_output`; a job planned without it has none)."""
    _check_source(args)
    # The job's place in the public lineage (prepare_output's job_lineage; a job planned without it has none).
    runs = tuple(getattr(args, "lineage", None) or (None, None))
    spec = WindowSpec(length_seconds=launch.window_seconds(args.window))
    start, end = launch.parse_day("start", args.start, spec), launch.parse_day("end", args.end, spec)
    if start > end:
        raise launch.RunRefused(f"start must not be after end, got {args.start} > {args.end}")
    Policy(args.policy)
    columns = [c for c in (args.columns or "").split(",") if c]
    key_path, fingerprint, _ = key_fingerprint(args)
    # A job restarted into its --output continues from the last window committed there (recover):
    # that window's snapshots are the ledger, and this schedule's windows through it are charged.
    curator = store.absolute(args.output)
    _refuse_an_output_from_before_commit_markers(curator)
    resumed = last_committed(curator) if restarting(curator, args) else None
    if resumed is not None and resumed > end:
        raise launch.RunRefused(f"--output {curator} has committed {format_windows([resumed], spec)}, after this job's --end "
                                f"{args.end}: its ledger is ahead of this schedule; give a new --output")
    previous_ledger = (_snapshot_glob(store.join(curator, "ledger"), resumed) if resumed is not None
                       else args.previous_ledger)
    # The id type is the ledger's for life: declared (a new ledger must), else a continuing ledger's
    # own (its snapshots record it).
    new_ledger = previous_ledger.lower() == "none"
    try:
        declared_input = launch.declared_contract(args)
    except ValueError as exc:
        raise launch.RunRefused(str(exc)) from None
    if declared_input is not None and columns:
        raise launch.RunRefused("give the indicator columns either declared (--column, --category, --schema) or as "
                                "--columns, not both")
    if declared_input is None and new_ledger:
        raise launch.RunRefused(f"a new ledger (--previous-ledger none) needs its input contract: {declaration_hint()}")
    id_type = declared_input.id_type if declared_input else args.id_type
    releases = store.absolute(args.releases_parquet)
    released = sorted(store.release_windows_present(releases))
    # Windows this job charged before a restart are its own; rows of them are not late, but re-delivered.
    own = resumed if resumed is not None and resumed >= start else start - 1
    wanted = LedgerConfig.from_promise(epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget,
                                       accounting=args.accounting, id_type=id_type or ID_TYPE,
                                       key_fingerprint=fingerprint, window=spec, n_shards=args.shards,
                                       releases=releases, contract=declared_input)
    previous, config, answered = _previous_ledger(previous_ledger, wanted, released=released,
                                                  id_type_declared=id_type is not None)
    # Only the public chain's ledger may be continued (a fork's windows could never be published).
    check_lineage(releases, args, *runs, restart=restarting(curator, args))
    prepaid, release_states, estimates = previous_running_state(previous_ledger)
    id_type = config.id_type
    _refuse_another_jobs_output(curator, args)
    if released and max(released) > own:
        raise launch.RunRefused(f"{format_windows([max(released)], spec)} under {releases} is already released; start "
                                "after it" + (f" (this job committed {format_windows([start], spec)} to "
                                              f"{format_windows([own], spec)} in --output {curator})"
                                   if own >= start else ""))
    contract = config.contract  # declared by this job or recorded by the ledger's snapshots
    if contract is not None:
        if columns:
            raise launch.RunRefused(f"--columns is for ledgers started before declared contracts; this ledger "
                                    f"records its contract (columns {list(contract.names)}): leave --columns out")
        columns = list(contract.numeric)
    queries = _launch_queries(releases, columns=contract or columns, start=start, released=released,
                              answered=answered)
    plan = QueryPlan(tuple(PlannedQuery(r.query, r.effective_from, r.retired_from if r.retired_from is not None
                                        and r.retired_from <= end else None) for r in queries.plan(start, end)))
    try:
        refuse_running_continuation(plan, release_states, range(own + 1, end + 1),
                                    stored_where="beside --previous-ledger")
        # No header to read at launch: the columns are those --columns names (numbers) and those the
        # queries read, as they read them; a column read both ways is refused.
        reads = [e.query for e in plan.entries]
        header = declared_header(contract) if contract is not None else pa.schema(
            [(c, pa.float64()) for c in columns]
            + [(c, pa.null()) for c in sorted((numeric_reads(reads) | category_reads(reads)) - set(columns))])
        kinds = plan_columns(reads, reads, header, declared_types=True,
                             where="the declared contract" if contract is not None else
                             "the messages (--columns and the registered queries)", parsed=columns)
    except ValueError as exc:
        raise launch.RunRefused(str(exc)) from None
    indicators, categories = list(kinds.numeric), sorted(category_reads(reads))
    # The ledger's names of the id and time columns: every message and replayed file is read by them.
    keys = contract.keys if contract is not None else DEFAULT_KEYS
    # Every query this ledger has answered, with the first window it answered it in (the snapshots
    # record those answered through their window).
    first_answered = dict(answered or {})
    for entry in plan.entries:
        first_answered.setdefault(entry.query_id, max(entry.first_window, start))
    return JobPlan(spec=spec, start=start, end=end, key_path=key_path, curator=curator, resumed=resumed, own=own,
                   releases=releases, released=released, config=config, previous=previous, prepaid=prepaid,
                   release_states=release_states, estimates=estimates, id_type=id_type, contract=contract,
                   keys=keys, queries=queries, plan=plan, indicators=indicators, categories=categories,
                   first_answered=first_answered, runs=runs)


def _launch_queries(releases: str, *, columns: "Sequence[str] | InputContract", start: int,
                    released: Sequence[int], answered: dict[str, int] | None) -> LaunchQueries:
    """The query catalogue under ``releases`` as this job launches with it
    (:func:`renyi_stream.queries.catalogue.queries_at_launch`, nothing written): queries registered into
    windows already released (the ledger charged them) but never ``answered`` move to the first
    window after them, and on a catalogue with no query the per-window sums of ``columns`` are
    registered from ``start`` (a declared contract's: :func:`renyi_stream.queries.registration.contract_defaults`).
    RunRefused when there is nothing to answer, the catalogue cannot be read or a default cannot be
    registered."""
    catalogue = ReleaseCatalogue(releases)
    if isinstance(columns, InputContract):  # a root keeps its ledger's contract: refused before anything runs
        catalogue.check_input_contract(columns)
    try:
        state = catalogue.read()
        if isinstance(columns, InputContract):
            defaults = [] if state.registrations else contract_defaults(columns)
        elif not state.registrations and not columns:
            raise ValueError("it has no query and --columns names no column to answer: register the queries "
                             f"(renyi-stream query add --releases-parquet {releases} ...) or give --columns")
        else:
            defaults = default_queries(list(columns))
        return queries_at_launch(state, defaults=defaults, first_window=start,
                                 processed_through=max(released) if released else None,
                                 answered=None if answered is None else set(answered),
                                 last_released=catalogue.last_released_window())
    except ValueError as exc:
        raise launch.RunRefused(f"the query catalogue under {releases}: {exc}") from None


def _record_queries(releases: str, queries: LaunchQueries, contract: InputContract | None = None,
                    config: LedgerConfig | None = None) -> list[str]:
    """Write the catalogue changes the job launches with (:meth:`renyi_stream.queries.catalogue.ReleaseCatalogue.record_launch`)
    and the ledger's input ``contract`` beside them, once (:meth:`~renyi_stream.queries.catalogue.ReleaseCatalogue.record_input_contract`),
    and return them in words. CatalogueChanged when the catalogue changed since :func:`build` read
    it; ContractError, nothing written, when the root records another contract."""
    catalogue = ReleaseCatalogue(releases)
    recorded = contract is not None and catalogue.record_input_contract(contract)
    if config is not None:  # the public promise, for reports over the root
        catalogue.record_promise(epsilon=config.epsilon, delta=config.delta, accounting=config.accounting,
                                 norm_budget=config.norm_budget)
    catalogue.record_launch(queries)
    first = {r.query_id: r.effective_from for r in queries.registrations}

    def when(window: int) -> str:  # the window's date beside its number, where the ledger's spec is known
        return format_windows([window], config.window) if config is not None else f"window {window}"

    return ((["recorded the ledger's input contract beside the releases"] if recorded else [])
            + [f"registered the default query {q} from {when(first[q])} (the catalogue had no query)"
             for q in queries.registered]
            + [f"query {q!r} was registered from {when(old)}, which this ledger had already released without it; "
               f"it now starts at {when(new)}" for q, old, new in queries.moved])

