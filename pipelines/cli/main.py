"""The ``renyi-stream`` command line.

Subcommands:

* ``calibrate``: the noise a promise ``(epsilon, delta)`` needs under each accounting.
* ``run``: the daily job (Beam pipeline, DuckDB release store and curator ledger).
* ``demo``: the daily job run day by day on a generated stream, compared with worst-case
  accounting, with a chart.
* ``features`` and ``train``: the batch training stage (:mod:`renyi_stream.pipelines.curator.train`).
* ``query add|list|retire`` and ``privacy-report`` (:mod:`renyi_stream.pipelines.cli.queries`).
* ``dead-letters``: the curator's dead letters by day and reason, read-only
  (:mod:`renyi_stream.pipelines.cli.dead_letters`).
* ``key create PATH``: a new noise key for the Beam jobs (:mod:`renyi_stream.pipelines.cli.keys`).
* ``plan``: before the first day, how many windows users last under a contract and a promise, and
  (curator only) clamps that keep a share of a sample day's users in (:mod:`renyi_stream.pipelines.cli.plan`).

Errors in parameters exit with status 2 and a message that names the parameter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from renyi_stream.pipelines.beam.job_options import (RunRefused, add_input_day_options, add_ledger_options,
                                                     declared_contract, input_day_options, refuse_unknown_options)
from renyi_stream.pipelines.cli.dead_letters import add_dead_letters_subcommand
from renyi_stream.pipelines.cli.errors import PROG, name_the_option, record_option_names
from renyi_stream.pipelines.cli.queries import add_query_subcommands, add_running_options
from renyi_stream.pipelines.cli.keys import add_key_subcommand
from renyi_stream.pipelines.cli.plan import add_plan_subcommand
from renyi_stream.pipelines.cli.training import add_train_subcommand
from renyi_stream.stream.accounting import ACCOUNTINGS, calibrate, describe_accounting
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE



class _UsageError(Exception):
    """A parameter out of range: reported like argparse's own errors (exit status 2)."""


def _calibrate_command(args: argparse.Namespace) -> int:
    try:
        results = {
            accounting: calibrate(
                epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget, accounting=accounting
            )
            for accounting in ACCOUNTINGS
        }
        windows = results["gdp"].worst_case_windows(args.per_window_bound)
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc
    if args.json:
        print(json.dumps({
            name: {
                "rho": cal.rho,
                "mu": cal.mu,
                "noise_std": cal.noise_std,
                "worst_case_windows": cal.worst_case_windows(args.per_window_bound),
            }
            for name, cal in results.items()
        }, indent=2))
        return 0
    print(
        f"Promise: ({args.epsilon:g}, {args.delta:g})-DP per user over the whole stream; "
        f"squared-norm budget B = {args.norm_budget:g} per user."
    )
    print(
        f"A user contributing the worst case C = {args.per_window_bound:g} every window joins "
        f"B / C^2 = {windows:g} windows; sparser users join more.\n"
    )
    header = f"{'accounting':<12} {'rho (zCDP)':>12} {'mu (GDP)':>10} {'noise std':>11} {'variance vs gdp':>16}"
    print(header)
    print("-" * len(header))
    gdp_var = results["gdp"].noise_std ** 2
    for name, cal in results.items():
        print(
            f"{name:<12} {cal.rho:>12.6g} {cal.mu:>10.6g} {cal.noise_std:>11.6g} "
            f"{cal.noise_std ** 2 / gdp_var:>15.3f}x"
        )
    print()
    for name in ACCOUNTINGS:
        print(f"{name}: {describe_accounting(name)}")
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from renyi_stream.pipelines.daily.demo import DemoConfig, run_demo  # heavy imports only when needed

    from pathlib import Path

    from renyi_stream.pipelines.daily.demo import check_demo_folder

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise _UsageError(f"--out must be a folder (it is created when missing), got the file {args.out}")
    try:
        check_demo_folder(Path(args.out))
        config = DemoConfig(
            users=args.users,
            days=args.days,
            epsilon=args.epsilon,
            delta=args.delta,
            norm_budget=args.norm_budget,
            policy=args.policy,
            accounting=args.accounting,
            out_dir=args.out,
            seed=args.seed,
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc
    run_demo(config, progress=sys.stderr if not args.quiet else None)
    return 0


def _window_spec(text: str) -> Any:
    """``--window`` as a :class:`renyi_stream.stream.schema.WindowSpec`; a usage error naming it otherwise."""
    from renyi_stream.stream.schema import WindowSpec

    try:
        return WindowSpec.from_length(text)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _window_of_day(name: str, text: str, spec) -> int:
    try:
        return spec.window_of_day(name, text)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _run_command(args: argparse.Namespace) -> int:
    from renyi_stream.pipelines.curator.store import CuratorStoreError
    from renyi_stream.pipelines.daily.job import JobConfig, preview_job, run_job
    from renyi_stream.stream.engine.readers import InputFileError
    from renyi_stream.queries.release_store import ReleaseStoreError

    spec = _window_spec(args.window)
    start, end = _window_of_day("start", args.start, spec), _window_of_day("end", args.end, spec)
    if start > end:
        raise _UsageError(f"--start must not be after --end, got --start {args.start} --end {args.end}")
    if os.path.abspath(args.store) == os.path.abspath(args.ledger):
        raise _UsageError(f"--store and --ledger must be two files (the public releases, the curator's private "
                          f"ledger), got {args.store} for both")
    for flag, value in (("--strategy", args.strategy), ("--horizon", args.horizon)):
        if value is not None and args.release != "running":
            raise _UsageError(f"{flag} applies only to --release running, got {flag} {value} "
                              f"with --release {args.release}")
    beam_args = list(args.beam_args)
    try:
        refuse_unknown_options(beam_args, args.option_names.values(), command="run")
    except RunRefused as exc:
        raise _UsageError(str(exc)) from None
    if not any(a.startswith("--runner") for a in beam_args):
        beam_args.append(f"--runner={args.runner}")
        if args.runner == "DirectRunner" and not any(a.startswith("--direct_running_mode") for a in beam_args):
            beam_args.append("--direct_running_mode=in_memory")
    try:
        contract = declared_contract(args)
        input_days, no_data_days = input_day_options(args)
        if contract is None and args.id_type is not None:
            raise ValueError(f"--id-type {args.id_type} declares no column: give each indicator column with "
                             "--column NAME=LO:HI, --column NAME or --category NAME too")
        config = JobConfig(
            inputs=tuple(args.input), store=args.store, ledger=args.ledger, epsilon=args.epsilon,
            delta=args.delta, norm_budget=args.norm_budget, start_window=start, end_window=end, window=spec,
            policy=args.policy, accounting=args.accounting, key_path=args.noise_key, n_shards=args.shards,
            beam_args=tuple(beam_args), releases_parquet=args.releases_parquet, release=args.release,
            strategy=args.strategy, horizon=args.horizon, contract=contract, input_days=input_days,
            no_data_days=no_data_days, store_moved=args.store_moved,
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc
    try:
        if args.dry_run:
            return _print_preview(preview_job(config, progress=None if args.quiet else sys.stderr), args)
        summary = run_job(config, progress=None if args.quiet else sys.stderr)
    except (CuratorStoreError, InputFileError, ReleaseStoreError, ValueError) as exc:
        # ValueError: a loose or changed noise key (NoiseKeyError), an input without indicator
        # columns, a registered query the input cannot answer, an unknown Beam runner.
        print(f"{PROG} run: error: {name_the_option(str(exc), args)}", file=sys.stderr)
        return 1
    print(f"run {summary.run_id}: released {len(summary.windows_released)} window(s), "
          f"{len(summary.windows_skipped)} already released; {summary.releases_published} new release rows")
    # Invariant 4 (nothing-pre-noise-leaves, docs/architecture.md): the exact counts stay in the ledger database.
    if args.quiet:
        print(f"row totals [{'balanced' if summary.balanced else 'MISMATCH'}]; exact counts: the ledger's run_counts "
              f"(run_id {summary.run_id}), curator only")
        return 0 if summary.balanced else 1
    print(CURATOR_ONLY_NOTICE)
    print(f"rows read {summary.rows_read:,} = admitted {summary.admitted:,} + clipped {summary.clipped:,} + "
          f"dropped {summary.dropped:,} + rejected {summary.rejected:,} + late {summary.late:,}"
          f"  [{'balanced' if summary.balanced else 'MISMATCH'}]")
    print(f"ledger: {summary.users_in_ledger:,} users ({args.ledger}); releases: {args.store}; "
          f"{summary.seconds:.1f} s")
    return 0 if summary.balanced else 1


def _sql_command(args: argparse.Namespace) -> int:
    from renyi_stream.queries.release_store import ReleaseStoreError
    from renyi_stream.queries.sql import SqlRefused, format_result, run_sql, write_parquet

    from renyi_stream.queries.release_root import readable_store

    if args.format == "parquet" and not args.out:
        raise _UsageError("--format parquet needs --out FILE")
    if (args.store is None) == (args.releases_parquet is None):
        raise _UsageError("give exactly one of --store (a DuckDB release store) or --releases-parquet (a Parquet "
                          "release root)")
    try:
        with readable_store(args.store, args.releases_parquet) as store:
            table = run_sql(store, args.query)
    except (SqlRefused, ReleaseStoreError) as exc:
        print(f"{PROG} sql: error: {name_the_option(str(exc), args)}", file=sys.stderr)
        return 1
    except Exception as exc:  # DuckDB's own syntax and binder errors, shown as they are
        print(f"{PROG} sql: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    try:
        if args.format == "parquet":
            print(f"wrote {table.num_rows} rows to {write_parquet(table, args.out)}")
        elif args.out:
            with open(args.out, "w") as handle:
                handle.write(format_result(table, args.format))
    except OSError as exc:
        print(f"{PROG} sql: error: argument --out: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if not args.out:
        sys.stdout.write(format_result(table, args.format))
    return 0


def _print_preview(preview, args: argparse.Namespace) -> int:
    """What ``run --dry-run`` found: the windows and queries the run would release, and (curator
    only, without --quiet) the rows by outcome; always that nothing was charged or published."""
    summary = preview.summary
    print(f"dry run: would release {len(summary.windows_released)} window(s) ({len(summary.windows_skipped)} already "
          f"released), {summary.releases_published} release rows for {len(preview.queries)} quer"
          f"{'y' if len(preview.queries) == 1 else 'ies'}: {', '.join(preview.queries) or 'none'}")
    if not args.quiet:
        print(CURATOR_ONLY_NOTICE)
        print(f"would read {summary.rows_read:,} rows = admitted {summary.admitted:,} + clipped {summary.clipped:,} + "
              f"dropped {summary.dropped:,} + rejected {summary.rejected:,} + late {summary.late:,}  "
              f"[{'balanced' if summary.balanced else 'MISMATCH'}]")
    print(f"nothing was charged or published: {args.ledger} and {args.store} are as they were")
    return 0 if summary.balanced else 1


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Streaming continual-observation queries with individual Renyi-filter accounting.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cal = sub.add_parser(
        "calibrate",
        help="noise std, zCDP budget and GDP mu for a promise, under each accounting",
        description="Print, for each accounting, the per-user zCDP budget, the GDP mu and the "
        "Gaussian noise std that give (epsilon, delta)-DP with squared-norm budget B.",
    )
    cal.add_argument("--epsilon", type=float, required=True, help="epsilon of the per-user promise (> 0)")
    cal.add_argument("--delta", type=float, required=True, help="delta of the per-user promise, in (0, 1)")
    cal.add_argument("--norm-budget", type=float, required=True,
                     help="B: total squared L2 norm a user may contribute over all windows (> 0)")
    cal.add_argument("--per-window-bound", type=float, default=1.0,
                     help="C: the largest L2 norm of one user's contribution in one window (default 1)")
    cal.add_argument("--json", action="store_true", help="print one JSON object keyed by accounting")
    cal.set_defaults(handler=_calibrate_command)

    run = sub.add_parser(
        "run",
        help="run the daily job: input files -> individual filter -> noisy releases in DuckDB",
        description="Charge each user's contributions against their individual budget and release "
        "noisy per-window sums of every numeric column for every window from --start to --end. "
        "Other options are passed to Beam (e.g. --direct_num_workers=2); one Beam does not know either is refused.",
    )
    run.add_argument("--input", nargs="+", required=True, help="Parquet, Arrow IPC or CSV files")
    run.add_argument("--store", required=True, help="the public release store (DuckDB file)")
    run.add_argument("--ledger", required=True, help="the curator's ledger (DuckDB file)")
    add_ledger_options(run, key_alias=True,
                       key_help="noise key file (default: beside the ledger, <ledger>.noise.key)")
    add_input_day_options(run)
    run.add_argument("--releases-parquet", default=None, metavar="DIR",
                     help="also write each window's releases as DIR/window_id=N/releases.parquet")
    run.add_argument("--release", choices=("window", "running"), default="window",
                     help="on a store with no registered query: answer each numeric column as its per-window "
                     "sum (window, default) or as its running total since --start (running)")
    add_running_options(run, applies_to="--release running")
    run.add_argument("--runner", default="DirectRunner", help="Beam runner (default DirectRunner)")
    run.add_argument("--quiet", action="store_true",
                     help="no progress lines, and no exact counts printed (they stay in the ledger)")
    run.add_argument("--dry-run", action="store_true",
                     help="run on private copies of the ledger, store and key and print what the run would do (rows "
                     "by outcome, windows, queries), charging and publishing nothing; every refusal is the real run's")
    run.add_argument("--store-moved", action="store_true",
                     help="the release store moved to --store: record its new place (the ledger refuses any "
                     "store but the one it publishes to; the new one must hold every release it published)")
    run.set_defaults(handler=_run_command)

    sql = sub.add_parser(
        "sql",
        help="run SQL over the public release store (read-only, no file or network access)",
        description="Run one SQL statement against the release store, opened read-only with external "
        "access disabled and configuration locked: SELECT from the releases view; writes, files, "
        "ATTACH and extensions are refused.",
    )
    sql.add_argument("query", help='e.g. "SELECT * FROM releases ORDER BY window_start"')
    sql.add_argument("--store", help="the release store (DuckDB file) renyi-stream run answers")
    sql.add_argument("--releases-parquet", "--releases_parquet", dest="releases_parquet", metavar="ROOT",
                     help="instead, a Parquet release root (local path, gs://, s3://) the distributed and streaming "
                     "jobs answer: read as a store with the same tables and views, read-only")
    sql.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table",
                     help="output format (default table; parquet needs --out)")
    sql.add_argument("--out", default=None, help="write the result to this file instead of stdout")
    sql.set_defaults(handler=_sql_command)

    demo = sub.add_parser(
        "demo",
        help="the main job on a synthetic stream: day-by-day Beam runs, comparison, chart",
        description="Generate a synthetic stream (sparse heterogeneous indicators, some heavy users, a few "
        "malformed rows), run the daily job on each day with the DirectRunner and embedded DuckDB files, "
        "and compare individual with worst-case accounting at the same promise. Curator-side: it "
        "prints errors against the synthetic truth.",
    )
    demo.add_argument("--users", type=int, default=100_000, help="number of users (default 100000)")
    demo.add_argument("--days", type=int, default=90, help="number of daily windows (default 90)")
    demo.add_argument("--epsilon", type=float, default=1.0, help="per-user epsilon (default 1)")
    demo.add_argument("--delta", type=float, default=1e-6, help="per-user delta (default 1e-6)")
    demo.add_argument("--norm-budget", type=float, default=None,
                      help="B, squared-norm budget per user (default: the number of days)")
    demo.add_argument("--policy", choices=("drop", "clip"), default="drop",
                      help="what happens to a contribution past a user's budget (default drop)")
    demo.add_argument("--accounting", choices=ACCOUNTINGS, default="gdp",
                      help="how (epsilon, delta) maps to the zCDP budget (default gdp)")
    demo.add_argument("--out", default="renyi-demo", help="output folder (default ./renyi-demo): new, empty or a "
                      "previous demo's, which this one replaces")
    demo.add_argument("--seed", type=int, default=7, help="seed of the generated data (not of the noise)")
    demo.add_argument("--quiet", action="store_true", help="no progress lines")
    demo.set_defaults(handler=_demo_command)
    # Listed for --help only: main() hands their options to the job's own command line.
    sub.add_parser("stream", help="the streaming job: Kafka or Pub/Sub, or --replay of local files, one window at a "
                   "time (python -m renyi_stream.pipelines.streaming; renyi-stream stream --help lists its options); "
                   "--runner flink submits it to a Flink cluster with `flink run` (PyFlink)")
    sub.add_parser("distributed", help="the daily job on a distributed runner (Flink, Dataflow): ledger snapshots and "
                   "releases as Parquet (python -m renyi_stream.pipelines.distributed; renyi-stream distributed --help)")
    add_train_subcommand(sub)
    add_key_subcommand(sub)
    add_query_subcommands(sub)
    add_dead_letters_subcommand(sub)
    add_plan_subcommand(sub)
    record_option_names(parser)
    return parser


#: Jobs with a command line of their own, run as ``renyi-stream <name> OPTIONS`` (the options as they are):
#: the module whose ``main`` runs each.
_JOBS = {"stream": "renyi_stream.pipelines.streaming.beam.job", "distributed": "renyi_stream.pipelines.distributed.job"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stream"]:
        from renyi_stream.pipelines.streaming.flink.launch import main as submit_to_flink, uses_flink

        if uses_flink(argv[1:]):  # the PyFlink job, submitted with `flink run` (Beam's runners: the Beam job)
            return submit_to_flink(argv[1:], prog=f"{PROG} stream")
    if argv and argv[0] in _JOBS:  # before argparse, which would reorder the job's own options
        import importlib

        return importlib.import_module(_JOBS[argv[0]]).main(argv[1:], prog=f"{PROG} {argv[0]}")
    parser = _build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and getattr(args, "command", None) not in ("run", "features"):  # the Beam jobs pass them to Beam
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.beam_args = unknown
    try:
        return args.handler(args)
    except _UsageError as exc:
        command = f"{args.command} {getattr(args, 'action', '')}".strip()
        parser.exit(2, f"{PROG} {command}: error: {name_the_option(str(exc), args)}\n")
    return 0  # unreachable: parser.exit raises SystemExit


if __name__ == "__main__":
    raise SystemExit(main())
