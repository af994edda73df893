"""``renyi-stream query add|list|retire|contract``, ``privacy-report`` and ``report``.

Parameter errors exit with status 2 and a message naming the parameter; a missing store or
ledger exits with status 1, and none is ever created by a command that only reads it. ``query add``
creates a release store (or a Parquet root's catalogue) only when asked to (``--create``:
registering queries before a job's first run): a mistyped ``--store`` would otherwise register
the query where no job publishes. Every message that names a window names its date too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

from renyi_stream.pipelines.cli.errors import PROG, name_the_option
from renyi_stream.queries.linear import NOISE_SCALE_RANGE
from renyi_stream.stream.continual.prepaid import (
    DEFAULT_PREPAID_HORIZON,
    DEFAULT_RUNNING_STRATEGY,
    MAX_RUNNING_HORIZON,
    MAX_USER_STATE,
    RUNNING_STRATEGIES,
    TAIL,
    check_running_size,
    running_factorisation,
)


class _Usage(Exception):
    """A bad parameter: exit status 2."""


#: A window id in a message (``window 20517``, ``from_window=20517``, ``effective_from=20517``)
#: not already followed by its date.
_WINDOW_ID = re.compile(r"\b(windows? |from_window=|effective_from=)(-?\d+)\b(?! \(-?\d{4}-)")


def _when(window_id: int, window: str = "1d") -> str:
    """``window N (YYYY-MM-DD)``: a window id with the UTC date it starts (and the time, for
    windows shorter than a day), for ``--window`` ``window``; the id alone when ``window`` is
    not a window length."""
    try:
        return f"window {window_id} ({_start_text(window)(window_id)})"
    except (_Usage, ValueError, OverflowError, OSError):
        return f"window {window_id}"


def _dated(message: str, window: str = "1d") -> str:
    """``message`` with the date each window id it names starts beside it (``already retired
    from window 20517`` -> ``already retired from window 20517 (2026-03-05)``); as it is when
    ``window`` is not a window length."""
    try:
        start = _start_text(window)
    except _Usage:
        return message

    def dated(match: re.Match) -> str:
        try:
            return f"{match.group(0)} ({start(int(match.group(2)))})"
        except (ValueError, OverflowError, OSError):
            return match.group(0)

    return _WINDOW_ID.sub(dated, message)


def _missing_store(where: str, option: str) -> str:
    """Why ``query add`` refuses a release store (or root) ``where`` that does not exist."""
    return (f"{where} does not exist: a query registered in a new store is answered by no job that publishes "
            f"elsewhere (a mistyped {option}?). Give the store the jobs publish to, or --create to make a new one "
            "(registering queries before a job's first run)")


def _fail(command: str, message: str, status: int, args: argparse.Namespace | None = None) -> int:
    print(f"{PROG} {command}: error: {name_the_option(message, args)}", file=sys.stderr)
    if status == 2:
        raise SystemExit(2)
    return status


def _window(name: str, text: str, window: str) -> int:
    """A window id from ``YYYY-MM-DD`` (the window holding that day's midnight UTC) or an integer id."""
    from renyi_stream.stream.schema import WindowSpec

    if text.lstrip("-").isdigit():
        return int(text)
    try:
        spec = WindowSpec.from_length(window)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    try:
        return spec.window_of_day(name, text)
    except ValueError:
        raise _Usage(f"{name} must be a date YYYY-MM-DD or a window id, got {name} {text!r}") from None


def _split(name: str, text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise _Usage(f"{name} must list at least one value, got {text!r}")
    return items


def _categories(text: str) -> list[float] | list[str]:
    """``--categories``: numbers (category codes in a numeric column) when every item is a
    number, else strings (values of a string column)."""
    items = _split("--categories", text)
    try:
        return [float(item) for item in items]
    except ValueError:
        return items


def _query_from_args(args: argparse.Namespace) -> Any:
    """The query ``query add`` registers; a running query too big for a job to keep
    (:func:`renyi_stream.stream.continual.prepaid.check_running_size`) is refused here, before a store opens."""
    query = _spec_from_args(args)
    if query.kind == "running":
        try:
            check_running_size(query.strategy, query.horizon, query.dim)
        except ValueError as exc:
            raise _Usage(str(exc)) from None
    return query


def _spec_from_args(args: argparse.Namespace) -> Any:
    from renyi_stream.queries.linear import LinearQuery

    chosen = [flag for flag, value in (("--columns", args.columns), ("--histogram", args.histogram),
                                       ("--clamp", args.clamp), ("--weighted", args.weighted)) if value]
    if len(chosen) != 1:
        raise _Usage("give exactly one of --columns, --histogram, --clamp, --weighted"
                     + (f" (got {', '.join(chosen)})" if chosen else ""))
    for flag, value in (("--strategy", args.strategy), ("--horizon", args.horizon)):
        if value is not None and args.kind != "running":
            raise _Usage(f"{flag} applies only to --kind running, got {flag} {value} with --kind {args.kind}")
    if args.horizon is not None:
        try:  # a schedule the strategy has no prepaid rule over is a bad parameter, not a crash
            running_factorisation(args.strategy or DEFAULT_RUNNING_STRATEGY, args.horizon)
        except ValueError as exc:
            raise _Usage(f"--horizon {args.horizon}: {exc}") from None
    common = {"kind": args.kind, "description": args.description or "", "strategy": args.strategy,
              "horizon": args.horizon}
    if args.noise_scale is not None:  # checked by LinearQuery: finite, in range, window queries only
        common["noise_scale"] = args.noise_scale
    if args.columns:
        return LinearQuery.columns(args.id, _split("--columns", args.columns), **common)
    if args.histogram:
        if not args.categories:
            raise _Usage("--histogram needs --categories (the public list of categories)")
        return LinearQuery.histogram(args.id, args.histogram, _categories(args.categories), **common)
    if args.clamp:
        if args.lo is None or args.hi is None:
            raise _Usage("--clamp needs --lo and --hi")
        return LinearQuery.clamp(args.id, args.clamp, args.lo, args.hi, **common)
    weights = {}
    for item in _split("--weighted", args.weighted):
        column, _, weight = item.partition("=")
        try:
            weights[column.strip()] = float(weight)
        except ValueError:
            raise _Usage(f"--weighted takes column=weight pairs, got {item!r}") from None
    return LinearQuery.weighted(args.id, weights, **common)


def _query_command(args: argparse.Namespace) -> int:
    from renyi_stream.queries.catalogue import CatalogueChanged
    from renyi_stream.queries.registry import QueryRegistry
    from renyi_stream.queries.release_store import ReleaseStore, ReleaseStoreError

    command = f"query {args.action}"
    if (args.store is None) == (args.releases_parquet is None):
        return _fail(command, "give exactly one of --store (the DuckDB release store renyi-stream run answers) or "
                     "--releases-parquet (the Parquet release root the distributed and streaming jobs answer)", 2, args)
    if args.action == "contract":
        return _contract_command(args, command)
    if args.releases_parquet is not None:
        return _catalogue_command(args, command)
    try:
        if args.action == "list":
            if not Path(args.store).exists():
                return _fail(command, f"release store {args.store} does not exist", 1, args)
            with ReleaseStore(args.store, read_only=True) as store:
                table = QueryRegistry(store).list()
            _print_catalogue(table, args.format, args.window)
            return 0
        first = _window("--from", args.start, args.window)
        existed = Path(args.store).exists()
        if args.action == "retire" and not existed:
            return _fail(command, f"release store {args.store} does not exist", 1, args)
        query = _query_from_args(args) if args.action == "add" else None  # bad specs fail before the store opens
        if query is not None and not existed and not args.create:
            return _fail(command, _missing_store(f"release store {args.store}", "--store"), 1, args)
        with ReleaseStore(args.store) as store:
            registry = QueryRegistry(store)
            _refuse_released(args, first, registry.last_released_window())
            if query is not None:
                registry.add(query, effective_from=first)
                print(f"registered {query.query_id} ({query.kind}, dim {query.dim}: {', '.join(query.labels)}) "
                      f"from {_when(first, args.window)}" + ("" if existed else f" in the new release store {args.store}"))
            else:
                _say_retired(args.id, first, registry.retire(args.id, from_window=first), args.window)
        return 0
    except _Usage as exc:
        return _fail(command, _dated(str(exc), args.window), 2, args)
    except ValueError as exc:
        return _fail(command, _dated(str(exc), args.window), 2, args)
    except (ReleaseStoreError, CatalogueChanged) as exc:
        return _fail(command, _dated(str(exc), args.window), 1, args)


def _say_retired(query_id: str, window: int, withdrawn: bool, length: str = "1d") -> None:
    print(f"withdrew {query_id}: it was never answered in public and is answered in no window (its id stays "
          "taken: register the corrected query under a new id)" if withdrawn
          else f"retired {query_id} from {_when(window, length)}")


def _contract_command(args: argparse.Namespace, command: str) -> int:
    """``query contract --store S | --releases-parquet ROOT``: the declared input contract the
    release store (``store_meta.input_contract``) or the Parquet release root
    (``ROOT/_queries/input-contract.json``) records, as JSON; status 1 when none is recorded."""
    from renyi_stream.queries.catalogue import ReleaseCatalogue
    from renyi_stream.queries.release_store import ReleaseStore, ReleaseStoreError

    where = f"release store {args.store}" if args.store is not None else f"release root {args.releases_parquet}"
    try:
        if args.store is not None:
            if not Path(args.store).exists():
                return _fail(command, f"{where} does not exist", 1, args)
            with ReleaseStore(args.store, read_only=True) as store:
                text = store.input_contract()
        else:
            if "://" not in args.releases_parquet and not Path(args.releases_parquet).exists():
                return _fail(command, f"{where} (--releases-parquet) does not exist", 1, args)
            recorded = ReleaseCatalogue(args.releases_parquet).input_contract()
            text = None if recorded is None else recorded.to_json()
    except (ReleaseStoreError, ValueError, OSError) as exc:
        return _fail(command, str(exc), 1, args)
    if text is None:
        return _fail(command, f"{where} records no input contract (no run with a declared contract released "
                     "there yet)", 1, args)
    print(json.dumps(json.loads(text), indent=1))
    return 0


def _refuse_released(args: argparse.Namespace, first: int, last: int | None) -> None:
    """The catalogue rule (:func:`renyi_stream.queries.registration.refuse_released`), worded for ``--from``."""
    if last is not None and first <= last:
        raise _Usage(f"--from must be after the last released {_when(last, args.window)}, got --from {args.start}, "
                     f"{_when(first, args.window)}: released answers never change")


def _print_catalogue(table: Any, form: str, window: str = "1d") -> None:
    """The catalogue as text (windows as the UTC time they start, and their id) or JSON (ids), each
    query with its noise scale (read from its spec, so a store whose view predates the column
    shows it too)."""
    from renyi_stream.queries.linear import LinearQuery

    rows = []
    for row, spec in zip(table.drop_columns(["spec_json"]).to_pylist(), table.column("spec_json").to_pylist()):
        row.pop("noise_scale", None)  # placed after dim, whichever view the store has
        items = list(row.items())
        at = [name for name, _ in items].index("dim") + 1
        rows.append(dict(items[:at] + [("noise_scale", LinearQuery.from_json(spec).noise_scale)] + items[at:]))
    if form == "json":
        print(json.dumps(rows, default=str, indent=1))
        return
    when = _window_start_text(window)
    for row in rows:
        retired = f", retired from {when(row['retired_from'])}" if row["retired_from"] is not None else ""
        scale = f"noise x{row['noise_scale']:g}"  # the query's noise std over the ledger's (1: the ledger's)
        print(f"{row['query_id']:<24} {row['kind']:<8} dim {row['dim']:<4} {scale:<12} from "
              f"{when(row['effective_from'])}{retired}  {row['description']}")


def _window_start_text(window: str) -> Any:
    """``window id -> "YYYY-MM-DD (window N)"`` (with the time when windows are shorter than a day)."""
    start = _start_text(window)

    def text(window_id: int) -> str:
        return f"{start(window_id)} (window {window_id})"

    return text


def _start_text(window: str) -> Any:
    """``window id -> "YYYY-MM-DD"``: the UTC date window ``window id`` of ``--window`` ``window``
    (days since 1970-01-01 for daily windows) starts, with the time when windows are shorter than
    a day. _Usage for a ``window`` that is not a window length."""
    from renyi_stream.stream.schema import WindowSpec

    try:
        spec = WindowSpec.from_length(window)
    except ValueError as exc:
        raise _Usage(str(exc)) from None

    def text(window_id: int) -> str:
        start = dt.datetime.fromtimestamp(int(spec.window_start_seconds(window_id)), tz=dt.timezone.utc)
        return start.strftime("%Y-%m-%d" if start.time() == dt.time(0) else "%Y-%m-%d %H:%M")

    return text


def _catalogue_command(args: argparse.Namespace, command: str) -> int:
    """``query add|retire|list --releases-parquet ROOT``: the catalogue beside a Parquet release
    root (:mod:`renyi_stream.queries.catalogue`), which the distributed and streaming jobs answer, under the
    rules of the DuckDB registry (:mod:`renyi_stream.queries.registration`)."""
    from renyi_stream.queries.catalogue import CatalogueChanged, ReleaseCatalogue

    root = args.releases_parquet
    local = "://" not in root
    try:
        if args.action == "list":
            if local and not Path(root).exists():
                return _fail(command, f"release root {root} (--releases-parquet) does not exist", 1, args)
            _print_catalogue(ReleaseCatalogue(root).list(), args.format, args.window)
            return 0
        first = _window("--from", args.start, args.window)
        if args.action == "retire" and local and not Path(root).exists():
            return _fail(command, f"release root {root} (--releases-parquet) does not exist", 1, args)
        query = _query_from_args(args) if args.action == "add" else None  # bad specs fail before the root is read
        if query is not None and local and not Path(root).exists() and not args.create:
            return _fail(command, _missing_store(f"release root {root} (--releases-parquet)", "--releases-parquet"),
                         1, args)
        catalogue = ReleaseCatalogue(root)
        if args.action == "retire" and catalogue.read().revision == 0:
            return _fail(command, f"release root {root} (--releases-parquet) has no query catalogue", 1, args)
        _refuse_released(args, first, catalogue.last_released_window())
        if query is not None:
            catalogue.add(query, effective_from=first)
            print(f"registered {query.query_id} ({query.kind}, dim {query.dim}: {', '.join(query.labels)}) "
                  f"from {_when(first, args.window)} in the query catalogue of {catalogue.root}")
        else:
            _say_retired(args.id, first, catalogue.retire(args.id, from_window=first), args.window)
        return 0
    except (_Usage, ValueError) as exc:
        return _fail(command, _dated(str(exc), args.window), 2, args)
    except (CatalogueChanged, OSError) as exc:
        return _fail(command, _dated(str(exc), args.window), 1, args)


def _privacy_report_command(args: argparse.Namespace) -> int:
    from renyi_stream.pipelines.curator.store import CuratorStoreError
    from renyi_stream.pipelines.curator.privacy_report import privacy_report

    if (args.user is None) == (not args.all):
        return _fail("privacy-report", "give exactly one of --user ID or --all (with --out FILE.parquet)", 2, args)
    if args.all and not args.out:
        return _fail("privacy-report", "--all needs --out FILE.parquet (reports never go to stdout or the public store)", 2, args)
    if args.out is not None and (not args.all or not args.out.endswith(".parquet")):
        return _fail("privacy-report", f"--out takes a FILE.parquet with --all, got --out {args.out!r}", 2, args)
    if args.delta is not None and not 0 < args.delta < 1:
        return _fail("privacy-report", f"--delta must be in (0, 1, args), got --delta {args.delta}", 2)
    if not Path(args.ledger).exists():
        return _fail("privacy-report", f"ledger {args.ledger} does not exist", 1, args)
    try:
        table = privacy_report(args.ledger, user=args.user, delta=args.delta)
    except ValueError as exc:  # a --user that cannot be an id of this ledger
        return _fail("privacy-report", f"--user: {exc}", 2, args)
    except CuratorStoreError as exc:
        return _fail("privacy-report", str(exc), 1, args)
    if args.all:
        import pyarrow.parquet as pq

        from renyi_stream.stream.private_files import write_private

        try:  # every user's spent budget: a curator file, 0600 whatever the umask
            write_private(args.out, lambda handle: pq.write_table(table, handle), make_parents=False)
        except OSError as exc:  # --out in a missing folder, or a folder itself
            return _fail("privacy-report", f"--out: cannot write {args.out}: {exc}", 1, args)
        print(f"wrote {table.num_rows:,} users' privacy reports to {args.out} (curator only: never publish it)")
        return 0
    if table.num_rows == 0:
        print(f"user {args.user}: no contribution was ever charged; nothing of theirs has been released")
        return 0
    row = table.to_pylist()[0]
    print(f"user {row['user_id']}")
    print(f"  budget used:       {row['used_rho']:.6g} of {row['budget_rho']:.6g} (zCDP rho, "
          f"{100 * row['used_rho'] / row['budget_rho']:.1f}%); remaining {row['remaining_rho']:.6g}")
    print(f"  personal odometer: rho <= {row['odometer_rho']:.6g} (tracker step {row['tracker_step']:.3g}), i.e. "
          f"({row['odometer_epsilon']:.4g}, {row['delta']:g})-DP so far with {row['accounting']} accounting "
          "(Feldman & Zrnic Alg. 5 / Cor. 4.11: a bound valid for this user alone)")
    print(f"  promise:           ({row['promised_epsilon']:.4g}, {row['delta']:g})-DP over everything ever released")
    return 0


def _report_command(args: argparse.Namespace) -> int:
    from renyi_stream.pipelines.curator.store import CuratorStoreError
    from renyi_stream.queries.release_store import ReleaseStoreError
    from renyi_stream.pipelines.curator.ledger_report import render_curator_report
    from renyi_stream.queries.release_root import readable_store
    from renyi_stream.queries.report import render_report

    if Path(args.out).suffix.lower() not in (".html", ".htm"):
        return _fail("report", f"--out must be an .html file, got --out {args.out!r}", 2, args)
    if (args.store is None) == (args.releases_parquet is None):
        return _fail("report", "give exactly one of --store (a DuckDB release store) or --releases-parquet (a Parquet "
                     "release root)", 2, args)
    if args.ledger is not None and args.store is None:
        return _fail("report", "--ledger (the curator variant) takes the daily job's DuckDB ledger, with --store", 2,
                     args)
    for name, path in (("--store", args.store), ("--ledger", args.ledger)):
        if path is not None and not Path(path).exists():
            return _fail("report", f"{name} {path} does not exist", 1, args)
    if args.ledger is not None and Path(args.ledger).resolve() == Path(args.store).resolve():
        return _fail("report", f"--ledger takes the curator's ledger, not the release store given to --store "
                     f"({args.store})", 2)
    try:
        with readable_store(args.store, args.releases_parquet) as store:
            path = (render_report(store, args.out) if args.ledger is None
                    else render_curator_report(store, args.out, args.ledger))
    except (ReleaseStoreError, CuratorStoreError) as exc:
        return _fail("report", str(exc), 1, args)
    except OSError as exc:  # --out in a missing folder, or a folder itself
        return _fail("report", f"--out: cannot write {args.out}: {exc.strerror or exc}", 1, args)
    print(f"wrote {path}" + (" (curator variant: sensitive, keep it with the ledger)" if args.ledger else ""))
    return 0


def add_query_subcommands(sub: Any) -> None:
    """Register ``query`` and ``privacy-report`` on the ``renyi-stream`` subparsers."""
    query = sub.add_parser("query", help="register, retire and list the queries the jobs answer",
                           description="The query registry lives beside the public releases: in the release "
                           "store (--store, a DuckDB file: renyi-stream run answers it) or in the catalogue of a "
                           "Parquet release root (--releases-parquet: the distributed and streaming jobs answer "
                           "it). A query takes effect from a window after the last released one: released answers "
                           "never change.")
    actions = query.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="register a query from a future window on")
    add.add_argument("--id", required=True, help="query id: 1 to 160 printable characters, no brackets (e.g. tiers)")
    add.add_argument("--columns", help="comma-separated indicator columns: one coordinate each")
    add.add_argument("--histogram", metavar="COLUMN", help="one-hot of this column over --categories "
                     "(a value outside them counts nowhere)")
    add.add_argument("--categories", help="with --histogram: the public categories, comma-separated: numbers "
                     "(codes in a numeric column) or strings (values of a string column)")
    add.add_argument("--clamp", metavar="COLUMN", help="this column clamped to [--lo, --hi]")
    add.add_argument("--lo", type=float, help="with --clamp: lower bound")
    add.add_argument("--hi", type=float, help="with --clamp: upper bound")
    add.add_argument("--weighted", metavar="COL=W,...", help="one coordinate: sum of weight * column")
    add.add_argument("--kind", choices=("window", "running"), default="window",
                     help="window: each window's own sum (default); running: the total since --from "
                     "(every job answers it)")
    add_running_options(add, applies_to="--kind running")
    lo, hi = NOISE_SCALE_RANGE
    add.add_argument("--noise-scale", "--noise_scale", dest="noise_scale", type=float, default=None, metavar="M",
                     help=f"window queries: release this query's coordinates with noise std M times the ledger's "
                     f"(default 1); each user is charged 1/M^2 times their squared contribution to it, so M < 1 is a "
                     f"finer answer that costs more budget, M > 1 a coarser one that costs less. M in [{lo:g}, "
                     f"{hi:g}]; recorded in the catalogue and shown by query list. Not for --kind running in this "
                     "version")
    add.add_argument("--description", default="", help="public description")
    add.add_argument("--from", dest="start", required=True, help="first window answered (YYYY-MM-DD or window id)")
    add.add_argument("--window", default="1d", help="window length, as given to the job (default 1d)")
    add.add_argument("--create", action="store_true",
                     help="create the release store (or the Parquet root's catalogue) when it does not exist: to "
                     "register queries before a job's first run; without it a missing store is refused")
    retire = actions.add_parser("retire", help="stop answering a query from a future window on (from its first "
                                "window, if never answered: withdraw it)")
    retire.add_argument("--id", required=True, help="the query id")
    retire.add_argument("--from", dest="start", required=True, help="first window not answered (YYYY-MM-DD or id)")
    retire.add_argument("--window", default="1d", help="window length (default 1d)")
    listing = actions.add_parser("list", help="the query catalogue")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    listing.add_argument("--window", default="1d", help="window length, as given to the job (default 1d): windows "
                         "are shown as the date they start")
    contract = actions.add_parser("contract", help="the declared input contract the releases answer (public)",
                                  description="Print the input contract recorded with the releases: the ledger's "
                                  "id type and its declared columns, their kinds and bounds (JSON).")
    for parser in (add, retire, listing, contract):
        where = parser.add_argument_group("where the catalogue is (exactly one)")
        where.add_argument("--store", help="the release store (DuckDB file) renyi-stream run answers")
        where.add_argument("--releases-parquet", "--releases_parquet", dest="releases_parquet", metavar="ROOT",
                           help="the Parquet release root (local path, gs://, s3://) the distributed and streaming "
                           "jobs answer; its catalogue is ROOT/_queries/")
        parser.set_defaults(handler=_query_command)

    report = sub.add_parser("privacy-report", help="curator only: a user's spent budget and personal odometer",
                            description="Print one user's used and remaining budget and their personal odometer "
                            "(Feldman & Zrnic, Algorithm 5 / Corollary 4.11), or export every user's report with "
                            "--all --out. Computed from the user's own data: disclose it to that user alone.")
    report.add_argument("--ledger", required=True, help="the curator's ledger (DuckDB file)")
    report.add_argument("--user", default=None, help="the user id")
    report.add_argument("--all", action="store_true", help="every user (needs --out)")
    report.add_argument("--out", default=None, help="with --all: Parquet file to write")
    report.add_argument("--delta", type=float, default=None, help="delta of the odometer (default: the ledger's)")
    report.set_defaults(handler=_privacy_report_command)

    html_report = sub.add_parser("report", help="a self-contained HTML page of the released series with charts",
                                 description="Charts of every query's released series with its 95% noise band (which "
                                 "covers the sum over the users each window admitted, not the population's) and the "
                                 "promise in plain words. With --ledger, the curator variant adds the "
                                 "distribution of budget used and the share of rows filtered per window.")
    html_report.add_argument("--store", help="the release store (DuckDB file) renyi-stream run answers")
    html_report.add_argument("--releases-parquet", "--releases_parquet", dest="releases_parquet", metavar="ROOT",
                             help="instead, a Parquet release root (local path, gs://, s3://) the distributed and "
                             "streaming jobs answer")
    html_report.add_argument("--out", required=True, help="HTML file to write")
    html_report.add_argument("--ledger", default=None, help="curator variant: the ledger (DuckDB file)")
    html_report.set_defaults(handler=_report_command)


def add_running_options(parser: argparse.ArgumentParser, *, applies_to: str) -> None:
    """``--strategy`` and ``--horizon`` of a running total (``run --release running`` and
    ``query add --kind running``): the choices are the strategy registry's
    (:data:`renyi_stream.stream.continual.prepaid.RUNNING_STRATEGIES`), listed here once for both commands."""
    parser.add_argument(
        "--strategy", choices=RUNNING_STRATEGIES, default=None,
        help=f"with {applies_to}: the factorisation the running total is released through, each admitted "
        f"contribution prepaid (default {DEFAULT_RUNNING_STRATEGY}). blt: Buffered Linear Toeplitz, 4 buffers, the "
        "square root's max error within 0.003%% at 365 windows, per-user state 5 x d numbers; sqrt: the square-root "
        "factorisation, the exact reference, per-user state T x d (the whole admitted history over the horizon); "
        "tree: binary tree with least squares, per-user state (floor(log2 T) + 1) x d")
    parser.add_argument(
        "--horizon", default=None, metavar=f"N|{TAIL}",
        help=f"with {applies_to}: the declared schedule, N windows from the first (default "
        f"{DEFAULT_PREPAID_HORIZON}); each contribution is charged its cost over the windows left, and a window "
        f"past the schedule is refused. {TAIL}: charge the infinite tail instead (blt only): releases never end, "
        "at 1.2x to 1.3x the error of a declared 365 (docs/running_totals.md). Bounds: N at most "
        f"{MAX_RUNNING_HORIZON['blt']} for blt and tree, {MAX_RUNNING_HORIZON['sqrt']} for sqrt (a user's state is "
        f"their history, N x d numbers); the running queries active together keep at most {MAX_USER_STATE} "
        "numbers a user (blt 4 x d, tree (floor(log2 N) + 1) x d, sqrt N x d) "
        "(docs/running_totals.md, \"Bounds\")")
