"""``renyi-stream plan``: before the first day, how many windows users last under a declared
contract and a promise, and (curator only) with a sample day, who would stay in and clamps that
keep a chosen share in (docs/calibration.md, "Planning before the first day").

The numbers are the daily job's: the noise and budget of :func:`renyi_stream.stream.accounting.calibrate`, the
default sums of the contract (:func:`renyi_stream.queries.registration.contract_defaults`) in the order the
job's query plan charges them, and the filter's own rule replayed (:mod:`renyi_stream.stream.planning`). A
sample is read (:func:`renyi_stream.stream.engine.readers.read_batches`) and validated against the contract
(:func:`renyi_stream.stream.schema.validate_batch`) as the daily job reads its inputs. Everything printed about
the sample comes after :data:`renyi_stream.stream.private_files.CURATOR_ONLY_NOTICE`; with ``--quiet`` only the
suggested flags are printed.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.pipelines.beam.job_options import add_contract_options, add_promise_arguments, declared_contract
from renyi_stream.pipelines.cli.errors import PROG, name_the_option
from renyi_stream.stream.accounting import calibrate, describe_accounting
from renyi_stream.stream.planning import (DEFAULT_KEEP, MAX_DAYS, MAX_EXACT_WINDOWS, ColumnBound, Plan, Sample,
                                          UserPlan, checkpoints, make_plan, sample_shares, suggest_clamps)
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE

DEFAULT_DAYS = 90


class PlanRefused(ValueError):
    """A parameter out of range, worded to name its option."""


def add_plan_subcommand(sub: Any) -> None:
    """Register ``plan`` on the ``renyi-stream`` subparsers."""
    parser = sub.add_parser(
        "plan",
        help="before the first day: how many windows users last under a contract and a promise; with --sample, "
        "who would stay in and clamps that keep a share in (curator only)",
        description="From the declared contract (the options of renyi-stream run), the promise and a horizon, print "
        "the noise std per window and how many windows a user at the bounds, and a user at a given contribution, "
        "lasts under individual and under worst-case accounting. With --sample DAY_FILE (curator only) print the "
        "share of its users still in after 7, 30 and 90 days if every day looked like it, and clamps that keep "
        "--keep of them in through the horizon. Reads no ledger and writes nothing.")
    arg = parser.add_argument
    add_promise_arguments(arg)
    arg("--days", type=int, default=DEFAULT_DAYS,
        help=f"the horizon: daily windows to plan for, 1 to {MAX_DAYS} (default {DEFAULT_DAYS})")
    arg("--contribution", action="append", default=[], metavar="NAME=VALUE,...",
        help="a typical user's values in one window (bounded columns left out are 0); repeat for several users")
    arg("--sample", default=None, metavar="DAY_FILE",
        help="a day's input file (Parquet, Arrow or CSV), validated against the contract: curator only")
    arg("--keep", type=float, default=None,
        help=f"with --sample: the share of its users the suggested clamps keep in through --days, in (0, 1] "
             f"(default {DEFAULT_KEEP})")
    arg("--quiet", action="store_true", help="no exact counts: with --sample, print only the suggested flags")
    add_contract_options(parser)
    parser.set_defaults(handler=_plan_command)


def _plan_command(args: argparse.Namespace) -> int:
    try:
        plan, contract = _plan(args)
        keep = _keep(args)
        sample = None if args.sample is None else read_sample(args.sample, contract, plan.bounds)
    except ValueError as exc:
        print(f"{PROG} plan: error: {name_the_option(str(exc), args)}", file=sys.stderr)
        return 2
    order = contract.names
    print_plan(plan, contract_unbounded=_unbounded(contract), order=order)
    if sample is not None:
        print()
        print_sample(plan, sample, keep=keep, quiet=args.quiet, path=args.sample, order=order)
    return 0


# --------------------------------------------------------------------------- the parameters


def _plan(args: argparse.Namespace) -> "tuple[Plan, Any]":
    cal = calibrate(epsilon=args.epsilon, delta=args.delta, norm_budget=args.norm_budget, accounting=args.accounting)
    if not 1 <= args.days <= MAX_DAYS:
        raise PlanRefused(f"argument --days: the horizon must be 1 to {MAX_DAYS} daily windows, got --days {args.days}")
    contract = _contract(args)
    bounds = charged_bounds(contract)
    typical = []
    for text in args.contribution:
        values = _contribution(text, contract, bounds)
        outside = any(not b.lo <= v <= b.hi for v, b in zip(values, bounds))
        typical.append((text + (" (clamped)" if outside else ""), values))
    return make_plan(cal, bounds, args.days, typical), contract


def _contract(args: argparse.Namespace) -> Any:
    option = "--schema" if args.schema_file is not None else "--column"
    try:
        contract = declared_contract(args)
        if contract is None:
            raise PlanRefused("argument --column: a plan needs the declared contract, as renyi-stream run takes it: "
                              "--id-type int64|string and one --column NAME=LO:HI per bounded number column, or "
                              "--schema FILE.json")
        if not contract.bounded:
            contract.refuse_unbounded(contract.numeric)
            raise PlanRefused(f"argument {option}: the declared contract has no number column with a bound, so no "
                              "default sum to plan: declare one with --column NAME=LO:HI")
    except PlanRefused:
        raise
    except ValueError as exc:  # ContractError: a malformed declaration
        message = str(exc)
        raise PlanRefused(message if message.startswith(("--", "argument ")) else f"argument {option}: {message}") \
            from None
    return contract


def charged_bounds(contract: Any) -> tuple[ColumnBound, ...]:
    """The default sums of ``contract`` (a clamped sum per bounded number column) as the daily
    job charges them: in its query plan's order (by query id), each with its clamp."""
    from renyi_stream.queries.registration import contract_defaults
    from renyi_stream.stream.engine.shard_state import QueryPlan

    plan = QueryPlan.starting_at(contract_defaults(contract), 0)
    return tuple(ColumnBound(e.query.spec["column"], e.query.spec["lo"], e.query.spec["hi"]) for e in plan.active(0))


def _contribution(text: str, contract: Any, bounds: Sequence[ColumnBound]) -> list[float]:
    """``--contribution NAME=VALUE,...`` as values in ``bounds``' order (columns left out: 0)."""
    names = [b.name for b in bounds]
    values = dict.fromkeys(names, 0.0)
    seen: set[str] = set()
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise PlanRefused(f"argument --contribution: must be NAME=VALUE,... with declared bounded columns, got "
                              f"--contribution {text!r}")
        if name in seen:
            raise PlanRefused(f"argument --contribution: column {name!r} given twice in --contribution {text!r}")
        seen.add(name)
        if name not in names:
            why = ("declared without a bound, so no default sum charges it" if name in contract.numeric
                   else "a category column" if name in contract.categories else "not declared")
            raise PlanRefused(f"argument --contribution: column {name!r} is {why}; the bounded columns are {names}, "
                              f"got --contribution {text!r}")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise PlanRefused(f"argument --contribution: the value of {name!r} must be a finite number, got "
                              f"{value.strip()!r} in --contribution {text!r}")
        values[name] = number
    return [values[n] for n in names]


def _keep(args: argparse.Namespace) -> float:
    if args.keep is None:
        return DEFAULT_KEEP
    if args.sample is None:
        raise PlanRefused(f"argument --keep: applies only with --sample (the share of its users to keep), got "
                          f"--keep {args.keep:g} without --sample")
    if not 0.0 < args.keep <= 1.0:  # NaN fails too
        raise PlanRefused(f"argument --keep: must be a share in (0, 1], got --keep {args.keep!r}")
    return float(args.keep)


def _unbounded(contract: Any) -> list[str]:
    return [n for n in contract.numeric if not contract.column(n).bounded]


# --------------------------------------------------------------------------- the sample


def read_sample(path: str, contract: Any, bounds: Sequence[ColumnBound]) -> Sample:
    """The rows of ``path`` as the daily job reads and validates them under ``contract`` (bad rows
    and repeated (user, window) pairs counted as rejected), reduced to the columns of ``bounds``."""
    from renyi_stream.stream.engine.readers import InputFileError, MalformedLines, check_declared_columns, read_batches
    from renyi_stream.stream.schema import USER_ID, WINDOW_ID, SchemaError, validate_batch

    names = [b.name for b in bounds]
    ids: list[pa.Array] = []
    windows: list[np.ndarray] = []
    values: list[np.ndarray] = []
    rows_read = rejected = 0
    malformed = MalformedLines()
    try:
        check_declared_columns(path, contract)
        for batch in read_batches(path, malformed=malformed, keys=contract.keys):
            if len(malformed):
                skipped = malformed.drain().num_rows
                rows_read += skipped
                rejected += skipped
            rows_read += batch.num_rows
            checked = validate_batch(batch, indicator_columns=list(contract.numeric),
                                     category_columns=list(contract.categories), id_type=contract.id_type,
                                     keys=contract.keys)
            rejected += checked.rejected.num_rows
            valid = checked.valid
            column = valid.column(USER_ID)
            ids.append(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
            windows.append(np.asarray(valid.column(WINDOW_ID).to_numpy(zero_copy_only=False), dtype=np.int64))
            values.append(np.column_stack([np.asarray(valid.column(n).to_numpy(zero_copy_only=False), dtype=np.float64)
                                           for n in names]) if valid.num_rows else np.zeros((0, len(names))))
        if len(malformed):
            skipped = malformed.drain().num_rows
            rows_read += skipped
            rejected += skipped
    except (InputFileError, SchemaError) as exc:
        raise PlanRefused(f"argument --sample: {exc}") from None
    all_ids = pa.chunked_array(ids).combine_chunks() if ids else pa.array([], pa.int64())
    if pa.types.is_integer(all_ids.type):
        codes = np.asarray(all_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
    else:
        codes = np.asarray(pc.dictionary_encode(all_ids).indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return Sample.from_rows(codes, np.concatenate(windows) if windows else np.zeros(0, np.int64),
                            np.concatenate(values) if values else np.zeros((0, len(names))),
                            rows_read=rows_read, rejected=rejected, names=tuple(names))


# --------------------------------------------------------------------------- printing


def _windows(n: int | None, charge: float) -> str:
    if n is None:
        return "never filtered" if charge == 0.0 else f"> {MAX_EXACT_WINDOWS:,}"
    return f"{n:,}"


def _in_order(items: Sequence[Any], order: Sequence[str]) -> list[Any]:
    """``items`` (each with a ``name``, or ``(bound, ...)`` tuples) in the declared ``order``."""
    rank = {name: i for i, name in enumerate(order)}
    name = lambda item: (item[0] if isinstance(item, tuple) else item).name  # noqa: E731
    return sorted(items, key=lambda item: rank.get(name(item), len(rank)))


def _flags(bounds: Sequence[ColumnBound], order: Sequence[str]) -> str:
    return " ".join(b.flag() for b in _in_order(bounds, order))


def print_plan(plan: Plan, *, contract_unbounded: Sequence[str] = (), order: Sequence[str] = (),
               out: Any = None) -> None:
    """The public part of a plan: from the contract and the promise alone (no data). Columns are
    shown in the declared ``order``."""
    out = out or sys.stdout
    cal = plan.calibration
    say = lambda text="": print(text, file=out)  # noqa: E731
    say(f"Promise: ({cal.epsilon:g}, {cal.delta:g})-DP per user over the whole stream, {cal.accounting} accounting "
        f"({describe_accounting(cal.accounting)}); squared-norm budget B = {cal.norm_budget:g} per user; horizon "
        f"{plan.days:,} daily windows.")
    say(f"Noise std per window: {plan.noise_std:.6g} on every coordinate (rho = {cal.rho:.6g} zCDP per user).")
    sums = ", ".join(f"{b.name} clamped to [{b.lo:g}, {b.hi:g}]" for b in _in_order(plan.bounds, order))
    say(f"Default sums, charged per window: {sums}.")
    if contract_unbounded:
        say(f"Declared without a bound (no default sum, charged nothing here): {', '.join(contract_unbounded)}.")
    say(f"A user at the bounds gives C^2 = {plan.sq_norm_bound:g} per window. A user giving c^2 per window is "
        f"charged c^2 / (2 s^2) and admitted while used + charge <= rho: about B / c^2 windows.")
    say()
    users: list[UserPlan] = [plan.at_bounds, *plan.typical]
    label_width = max(len("user"), *(len(u.label) for u in users))
    header = f"{'user':<{label_width}}  {'c^2 / window':>12}  {'individual':>14}  {'worst-case':>10}"
    say("Windows a user lasts, giving the same every window:")
    say(header)
    say("-" * len(header))
    for u in users:
        say(f"{u.label:<{label_width}}  {u.sq_norm:>12.6g}  {_windows(u.individual, u.charge):>14}  "
            f"{u.worst_case:>10,}")
    say()
    say(f"Worst-case accounting charges everyone C^2 = {plan.sq_norm_bound:g} a window, so everyone lasts "
        f"floor(B / C^2) = {plan.worst_case:,} window{'' if plan.worst_case == 1 else 's'} whatever they give; "
        f"answering all {plan.days:,} days with everyone in, it would need noise std {plan.worst_case_noise_std:.6g} "
        f"({plan.worst_case_noise_std / plan.noise_std:.3g}x this plan's).")


def print_sample(plan: Plan, sample: Sample, *, keep: float, quiet: bool = False, path: str = "",
                 order: Sequence[str] = (), out: Any = None) -> None:
    """The curator-only part: the sample's shares still in and the suggested clamps, after
    :data:`CURATOR_ONLY_NOTICE` (with ``quiet``: only the suggested flags, no count)."""
    out = out or sys.stdout
    say = lambda text="": print(text, file=out)  # noqa: E731
    cal = plan.calibration
    suggestion = suggest_clamps(sample, plan.bounds, cal, days=plan.days, keep=keep) if sample.users else None
    if quiet:
        if suggestion is not None and suggestion.found:
            say(f"suggested clamps (from the sample, keep {keep:g} through {plan.days:,} days): "
                f"{_flags(suggestion.bounds, order)}")
        else:
            say(f"no clamps to suggest (from the sample, keep {keep:g} through {plan.days:,} days)")
        return
    say(CURATOR_ONLY_NOTICE)
    say(f"Sample {path}: {sample.rows_read:,} rows read, {sample.rejected:,} rejected; {sample.users:,} users over "
        f"{sample.days:,} day(s)" + (" (each user's mean squared norm per day)" if sample.days > 1 else "") + ".")
    if not sample.users:
        say("No valid rows: nothing to plan from.")
        return
    shares = sample_shares(sample, plan.bounds, cal, checkpoints(plan.days))
    say("Share of the sample's users still in if every day looked like the sample (declared bounds):")
    for day, n, share in zip(shares.days, shares.still_in, shares.shares):
        say(f"  after {day:>{len(str(plan.days))},} days: {share:7.2%}  ({n:,} of {shares.users:,})")
    assert suggestion is not None
    if not suggestion.found:
        say(f"No level keeps {keep:.0%} in through {plan.days:,} days: a bound away from zero sets a floor on every "
            "user's charge. Raise --norm-budget or shorten --days.")
        return
    if suggestion.level is None:
        say(f"The declared bounds already keep {suggestion.kept / suggestion.users:.2%} ({suggestion.kept:,}) in "
            f"through {plan.days:,} days (--keep {keep:g}): no clamp to suggest.")
        return
    say(f"Suggested clamps keeping {keep:.0%} in through {plan.days:,} days: every bound capped at "
        f"{suggestion.level:g} in absolute value; they keep {suggestion.kept / suggestion.users:.2%} "
        f"({suggestion.kept:,}), the declared ones {suggestion.declared_kept / suggestion.users:.2%} "
        f"({suggestion.declared_kept:,}).")
    for bound, now, before in _in_order(list(zip(suggestion.bounds, suggestion.clipped,
                                                 suggestion.declared_clipped)), order):
        say(f"  {bound.name}: [{bound.lo:g}, {bound.hi:g}] clamps {now:.2%} of the sample's values "
            f"(as declared: {before:.2%})")
    say(f"  {_flags(suggestion.bounds, order)}")
