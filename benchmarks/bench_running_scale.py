"""Running totals at scale (issue 20, item 3): one ``renyi-stream run --release running`` per day.

One command::

    python benchmarks/bench_running_scale.py                       # 1,000,000 users x 365 days (51 minutes on 2 cores)
    python benchmarks/bench_running_scale.py --short               # = --users 200000 --days 40, the
                                                                   #   short version issue 20 asks for
    python benchmarks/bench_running_scale.py --strategy blt        # passed on to every run
    python benchmarks/bench_running_scale.py --quick --no-check    # 2,000 users x 6 days, a smoke run

It runs running totals as a data engineer would, through the command line and nothing else: a
daily cron starting ``renyi-stream run --input <that day's file> --store releases.duckdb
--ledger ledger.duckdb --start <day> --end <day> --release running [--strategy S] [--horizon H]``
as a fresh process each day, on one ledger. The first run registers the default running query
(``running:opened_app``, the running total since the first day); each later run continues it.

Workload, dense: ``--users`` users (default 1,000,000), ``--days`` days (default 365); each day a
pseudo-random ``--active`` share of the users (default half; exactly ``round(active x users)``,
drawn from a generator seeded by ``(seed, day)``, so any day can be regenerated on its own) has
one row, in random order, with one indicator ``opened_app = 1``. Every row is a non-zero
contribution, so every row is something the running state must carry: the worst case for state
size at this density. The norm budget defaults to ``10 x days^2``, above ``||C 1||^2`` of a user
present every day under each strategy (about ``0.64 T^2`` for the square root, ``2 T^2`` for the
tree), so the filter does not bind and every run does the full work; each day's line prints the
rows dropped, which should stay 0. Each day's file is written just before its run (not timed)
and deleted after it unless ``--keep``: 365 files of 500k rows do not pile up on the disk.

Measured per day, of that run's process alone: wall time, CPU time and peak RSS (``os.wait4``,
:func:`child_run.run_child`), and the ledger file's size after it. At the end: day 5's and the
last day's time and memory, the last over day 5 (target: at most 1.3x on both, issue 20), the
growth per day after day 5 (least squares), and the per-user running state read from the
ledger (:func:`read_state_size`: rows per user per query and floats per row, against
``(buffers + 1) x dim``). The exit status is 1 when a target is missed (``--no-check``: report
only). Results: ``benchmarks/results/running_scale-<users>x<days>[-<strategy>].json`` and
``.md`` (``--out PREFIX`` for another place; benchmarks/results/ is not tracked by git).

Never time it on a shared machine: day-to-day noise from other processes swamps a 1.3x ratio.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

from child_run import DAY0, cli_run_args, day_number, run_child

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDICATOR = "opened_app"
#: Issue 20's targets: the last day's time and peak memory within this factor of day 5's.
TARGET_RATIO = 1.3
#: The day whose run is the reference (1-based): past the first runs' one-off costs.
REFERENCE_DAY = 5
QUICK = {"users": 2_000, "days": 6}
SHORT = {"users": 200_000, "days": 40}
UNKNOWN_LAYOUT = "unknown layout"
_COUNTS = re.compile(r"admitted ([\d,]+) \+ clipped ([\d,]+) \+ dropped ([\d,]+)")


# --------------------------------------------------------------------------- parameters


def check_parameters(*, users: int, days: int, active: float, shards: int, norm_budget: float | None) -> None:
    """ValueError naming the parameter, its value and the allowed range."""
    if not 1 <= users <= 10_000_000:
        raise ValueError(f"users must be in [1, 10000000], got users={users}")
    if not REFERENCE_DAY <= days <= 3660:
        raise ValueError(f"days must be in [{REFERENCE_DAY}, 3660] (day {REFERENCE_DAY} is the reference), "
                         f"got days={days}")
    if not (0.0 < active <= 1.0):
        raise ValueError(f"active must be in (0, 1], got active={active}")
    if not 1 <= shards <= 4096:
        raise ValueError(f"shards must be in [1, 4096], got shards={shards}")
    if norm_budget is not None and not (norm_budget > 0 and math.isfinite(norm_budget)):
        raise ValueError(f"norm_budget must be finite and > 0, got norm_budget={norm_budget}")


# --------------------------------------------------------------------------- the workload


def active_users(users: int, active: float, day: int, seed: int = 0) -> "Any":
    """The ids (int64, in the file's random order) of the users with a row on ``day`` (0-based):
    exactly ``round(active x users)`` of them, from a generator seeded by ``(seed, day)`` alone."""
    import numpy as np

    rng = np.random.default_rng([seed, day])
    return rng.permutation(users)[: round(active * users)].astype(np.int64)


def write_day(folder: Path, users: int, active: float, day: int, seed: int = 0) -> tuple[Path, int]:
    """Day ``day``'s Parquet file (``user_id``, ``day``, ``opened_app = 1``) and its row count."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = active_users(users, active, day, seed)
    path = folder / f"day-{day:04d}.parquet"
    pq.write_table(pa.table({
        "user_id": pa.array(ids),
        "day": pa.array(np.full(ids.size, day_number(DAY0) + day, dtype=np.int32), type=pa.date32()),
        INDICATOR: pa.array(np.ones(ids.size)),
    }), path, row_group_size=131_072)
    return path, int(ids.size)


# --------------------------------------------------------------------------- the state's size

_FLOAT_TYPE = re.compile(r"^(DOUBLE|FLOAT|REAL)((?:\[\d*\])*)$")
_NUMBER_TYPE = re.compile(r"^(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|DOUBLE|FLOAT|REAL|DECIMAL.*)$")


def read_state_size(ledger: str | os.PathLike, *, dim: int) -> dict[str, Any]:
    """The per-user state of the running queries in the ledger DuckDB file ``ledger``: the one
    place in the benchmarks that knows how the daily job lays it out.

    Known layouts:

    * ``history`` (square-root running totals before issue 20): ``running_state(query_id,
      user_id, window_id, vals DOUBLE[])``, one row per user and window with a contribution,
      so a user's rows grow with the days they were active;
    * ``per-user state``: any other table with ``query_id`` and ``user_id`` columns and no
      ``window_id``, read generically: the form issue 20 item 2 asks for, ``buffers x dim``
      floats and the day last seen, one row per user and query.

    Several such tables count together (a user's state is the sum of their rows in each). For
    each: the rows per ``(query, user)`` (largest and mean) and the floats per row (a float
    column counts 1, a list of floats its longest length; flattened one level for lists of
    lists); the checked figure is the largest user's floats per query, summed over the tables,
    against issue 20's bound ``(buffers + 1) x dim``. ``buffers`` is the recorded strategy's (the
    length of ``theta`` in ``running_meta``'s strategy spec when there is one), else the BLT's
    default (the strategy the bound is stated for). A ledger with none of these tables, or one
    this function cannot read, gives ``{"layout": "unknown layout", ...}`` naming its tables,
    never an exception: the benchmark's timings stand on their own.
    """
    import duckdb

    from renyi_stream.stream.continual.blt import DEFAULT_BUFFERS

    out: dict[str, Any] = {"layout": UNKNOWN_LAYOUT, "dim": dim, "buffers": DEFAULT_BUFFERS,
                           "buffers_from": "the BLT's default", "strategies": [], "tables": {}}
    try:
        with closing(duckdb.connect(str(ledger), read_only=True)) as db:
            columns: dict[str, dict[str, str]] = {}
            for table, column, dtype in db.execute(
                    "SELECT table_name, column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position").fetchall():
                columns.setdefault(table, {})[column] = dtype
            out["all_tables"] = sorted(columns)
            if columns.keys() & set(_META_TABLES):
                try:
                    _read_strategies(db, out, [t for t in _META_TABLES if t in columns])
                except (duckdb.Error, ValueError, KeyError, TypeError, AttributeError) as exc:
                    out["strategies_error"] = f"{type(exc).__name__}: {exc}"[:300]  # the default buffers stand
            for table, cols in sorted(columns.items()):
                if {"query_id", "user_id"} <= cols.keys():
                    part = _table_state(db, table, cols)
                    if part["rows"]:
                        out["tables"][table] = part
    except (duckdb.Error, OSError, ValueError, KeyError, TypeError) as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        out["tables"] = {}
    parts = out["tables"].values()
    if not parts:
        return out
    out["layout"] = "history" if any(p["keyed_by_window"] for p in parts) else "per-user state"
    out["rows_per_user_per_query_max"] = sum(p["rows_per_user_per_query_max"] for p in parts)
    out["rows_per_user_per_query_mean"] = sum(p["rows_per_user_per_query_mean"] for p in parts)
    out["floats_per_row"] = max(p["floats_per_row"] for p in parts)
    out["floats_per_user_per_query_max"] = sum(p["rows_per_user_per_query_max"] * p["floats_per_row"]
                                               for p in parts)
    out["bound"] = (out["buffers"] + 1) * dim
    out["met"] = out["floats_per_user_per_query_max"] <= out["bound"]
    return out


#: Where the daily job records a running query's strategy: ``prepaid_meta`` (prepaid running totals,
#: issue 20) and ``running_meta`` (square-root histories before it).
_META_TABLES = ("prepaid_meta", "running_meta")


def _read_strategies(db: Any, out: dict[str, Any], tables: list[str]) -> None:
    """The running queries' recorded strategies: names and, for a BLT, buffers."""
    rows = [row for table in tables
            for row in db.execute(f"SELECT query_id, meta FROM {table} ORDER BY query_id").fetchall()]
    for _, meta_json in rows:
        meta = json.loads(meta_json)
        spec = meta.get("strategy")
        spec = json.loads(spec) if isinstance(spec, str) else spec
        if not isinstance(spec, dict):
            continue
        out["strategies"].append(spec.get("name", "?"))
        if spec.get("theta"):
            out["buffers"], out["buffers_from"] = len(spec["theta"]), "the recorded strategy"


def _table_state(db: Any, table: str, cols: dict[str, str]) -> dict[str, Any]:
    quoted = f'"{table}"'
    rows, users, n_max, n_mean = db.execute(
        f"SELECT sum(n), count(*), max(n), avg(n) FROM "
        f"(SELECT query_id, user_id, count(*) AS n FROM {quoted} GROUP BY query_id, user_id)").fetchone()
    floats, numbers = 0, 0
    for column, dtype in cols.items():
        if column in ("query_id", "user_id"):
            continue
        match = _FLOAT_TYPE.match(dtype.upper())
        if match is None:
            numbers += bool(_NUMBER_TYPE.match(dtype.upper()))
            continue
        depth = match.group(2).count("[")
        if depth == 0:
            floats += 1
            continue
        expr = f'"{column}"'
        for _ in range(depth - 1):
            expr = f"flatten({expr})"
        floats += int(db.execute(f"SELECT coalesce(max(len({expr})), 0) FROM {quoted}").fetchone()[0])
    return {"columns": cols, "keyed_by_window": "window_id" in cols, "rows": int(rows or 0),
            "users_x_queries": int(users), "rows_per_user_per_query_max": int(n_max or 0),
            "rows_per_user_per_query_mean": float(n_mean or 0.0), "floats_per_row": floats,
            "other_numbers_per_row": numbers}


def describe_state(state: dict[str, Any]) -> str:
    """One line for a :func:`read_state_size` result."""
    if state["layout"] == UNKNOWN_LAYOUT:
        why = f" ({state['error']})" if "error" in state else ""
        return (f"state per user: {UNKNOWN_LAYOUT}{why}; ledger tables {state.get('all_tables', [])}: "
                f"adapt read_state_size")
    where = ", ".join([*state["tables"], *(f"strategy {name}" for name in state["strategies"])])
    return (f"state per user per query ({state['layout']}, {where}): up to "
            f"{state['rows_per_user_per_query_max']:,} row(s) (mean {state['rows_per_user_per_query_mean']:.2f}) x "
            f"{state['floats_per_row']} float(s) per row = {state['floats_per_user_per_query_max']:,} floats; bound "
            f"(buffers {state['buffers']} + 1) x dim {state['dim']} = {state['bound']}: "
            f"{'met' if state['met'] else 'NOT met'}")


# --------------------------------------------------------------------------- the verdict


def missed_targets(report: dict[str, Any]) -> list[str]:
    """The targets ``report`` misses, one sentence each (empty: all met): the last day's time and
    peak RSS within :data:`TARGET_RATIO` of day 5's, and the state per user within its bound
    (a state this benchmark cannot read is a miss: it cannot be claimed)."""
    missed = []
    for what, key in (("time", "time_ratio"), ("peak memory", "memory_ratio")):
        ratio = report["ratios"][key]
        if not ratio <= TARGET_RATIO:
            missed.append(f"{what}: day {report['last']['day']} / day {REFERENCE_DAY} = {ratio:.2f} > {TARGET_RATIO}")
    state = report["state"]["last"]
    if state["layout"] == UNKNOWN_LAYOUT:
        missed.append(f"state per user: {UNKNOWN_LAYOUT}, not checked")
    elif not state["met"]:
        missed.append(f"state per user: {state['floats_per_user_per_query_max']:,} floats > {state['bound']}")
    return missed


def exit_status(missed: list[str], *, no_check: bool) -> int:
    """1 when a target is missed and the run checks them, else 0."""
    return 1 if missed and not no_check else 0


def _growth(days: list[dict[str, Any]], key: str) -> float:
    """Least-squares slope of ``key`` per day over days REFERENCE_DAY.. (0.0 with one point)."""
    import numpy as np

    points = [(d["day"], d[key]) for d in days if d["day"] >= REFERENCE_DAY]
    if len(points) < 2:
        return 0.0
    x, y = np.asarray(points, dtype=np.float64).T
    return float(np.polyfit(x, y, 1)[0])


# --------------------------------------------------------------------------- the benchmark


def run(args: argparse.Namespace, out: Any = sys.stdout) -> dict[str, Any]:
    """Generate and run every day (module docstring); the report as a dict."""
    norm_budget = args.norm_budget if args.norm_budget is not None else 10.0 * args.days ** 2
    extra = ["--release", "running", "--id-type", "int64", "--column", f"{INDICATOR}=0:1"]  # the input contract
    if args.strategy:
        extra += ["--strategy", args.strategy]
    if args.horizon:
        extra += ["--horizon", str(args.horizon)]
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="bench-running-"))
    work.mkdir(parents=True, exist_ok=True)
    inputs = work / "input"
    inputs.mkdir(exist_ok=True)
    report: dict[str, Any] = {
        "users": args.users, "days_run": args.days, "active": args.active, "seed": args.seed,
        "strategy": args.strategy or "(the CLI's default)", "horizon": args.horizon, "norm_budget": norm_budget,
        "shards": args.shards, "indicator": INDICATOR, "work_dir": str(work),
        "machine": {"machine": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()},
        "days": [], "state": {},
    }
    print(f"# running totals, one `renyi-stream run --release running` per day as a fresh process: "
          f"{args.users:,} users x {args.days} days, {args.active:.0%} active daily, one indicator; "
          f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}", file=out, flush=True)
    try:
        for d in range(args.days):
            path, rows = write_day(inputs, args.users, args.active, d, args.seed)
            day = DAY0 + dt.timedelta(days=d)
            argv = cli_run_args([str(path)], str(work), day, day, norm_budget=norm_budget, shards=args.shards,
                                extra=extra)
            if d == 0:
                report["command"] = " ".join(["renyi-stream", *argv[3:]])
                print(f"# day 1: {report['command']}", file=out, flush=True)
            seconds, peak_mb, text, cpu = run_child(argv)
            if not args.keep:
                path.unlink()
            if "[balanced]" not in text:
                raise RuntimeError(f"day {d + 1}: the run's row totals do not balance:\n{text[-3000:]}")
            counts = _COUNTS.search(text)
            admitted, clipped, dropped = ((int(g.replace(",", "")) for g in counts.groups()) if counts
                                          else (None, None, None))
            ledger_mb = os.path.getsize(work / "ledger.duckdb") / 2**20
            record = {"day": d + 1, "date": day.isoformat(), "rows": rows, "seconds": seconds, "cpu_seconds": cpu,
                      "peak_rss_mb": peak_mb, "ledger_mb": ledger_mb, "admitted": admitted, "clipped": clipped,
                      "dropped": dropped}
            report["days"].append(record)
            print(f"day {d + 1:>4}/{args.days} {day}  rows {rows:>9,}  {seconds:7.2f} s  CPU {cpu:7.2f} s  "
                  f"peak RSS {peak_mb:7,.0f} MB  ledger {ledger_mb:8,.1f} MB  dropped "
                  f"{'?' if dropped is None else f'{dropped:,}'}", file=out, flush=True)
            if d + 1 in (REFERENCE_DAY, args.days):
                size = read_state_size(work / "ledger.duckdb", dim=1)
                for key, day_number_ in (("day5", REFERENCE_DAY), ("last", args.days)):
                    if d + 1 == day_number_:  # both when --days is the reference day itself
                        report["state"][key] = size
    finally:
        if not args.keep and not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    days = report["days"]
    first, last = days[REFERENCE_DAY - 1], days[-1]
    report["day5"], report["last"] = first, last
    report["ratios"] = {"time_ratio": last["seconds"] / first["seconds"],
                        "memory_ratio": last["peak_rss_mb"] / first["peak_rss_mb"],
                        "cpu_ratio": last["cpu_seconds"] / first["cpu_seconds"]}
    report["growth_per_day"] = {"seconds": _growth(days, "seconds"), "peak_rss_mb": _growth(days, "peak_rss_mb"),
                                "ledger_mb": _growth(days, "ledger_mb")}
    report["dropped_total"] = sum(d["dropped"] or 0 for d in days)
    report["target_ratio"] = TARGET_RATIO
    report["missed"] = missed_targets(report)
    return report


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The end-of-run summary, as printed and written to the markdown file."""
    first, last, ratios, growth = report["day5"], report["last"], report["ratios"], report["growth_per_day"]
    verdict = {True: "met", False: "NOT met"}
    lines = [
        f"day {first['day']}: {first['seconds']:.2f} s, {first['peak_rss_mb']:,.0f} MB peak RSS; "
        f"day {last['day']}: {last['seconds']:.2f} s, {last['peak_rss_mb']:,.0f} MB peak RSS",
        f"time   day {last['day']} / day {first['day']} = {ratios['time_ratio']:.2f} "
        f"(target <= {TARGET_RATIO}: {verdict[ratios['time_ratio'] <= TARGET_RATIO]}); "
        f"CPU {ratios['cpu_ratio']:.2f}",
        f"memory day {last['day']} / day {first['day']} = {ratios['memory_ratio']:.2f} "
        f"(target <= {TARGET_RATIO}: {verdict[ratios['memory_ratio'] <= TARGET_RATIO]})",
        f"growth per day from day {REFERENCE_DAY} (least squares): {growth['seconds']:+.3f} s, "
        f"{growth['peak_rss_mb']:+.2f} MB peak RSS, {growth['ledger_mb']:+.2f} MB ledger file",
        f"day {REFERENCE_DAY} {describe_state(report['state']['day5'])}",
        f"day {last['day']} {describe_state(report['state']['last'])}",
    ]
    if report["dropped_total"]:
        lines.append(f"note: the filter dropped {report['dropped_total']:,} rows: raise --norm-budget to measure "
                     "the full work")
    lines.append("targets: all met" if not report["missed"] else "targets missed: " + "; ".join(report["missed"]))
    return lines


def write_results(report: dict[str, Any], prefix: Path) -> tuple[Path, Path]:
    """``prefix.json`` (the whole report) and ``prefix.md`` (a table per day and the summary)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".md")
    json_path.write_text(json.dumps(report, indent=2, default=str))
    rows = [f"| {d['day']} | {d['rows']:,} | {d['seconds']:.2f} | {d['cpu_seconds']:.2f} | "
            f"{d['peak_rss_mb']:,.0f} | {d['ledger_mb']:,.1f} | {d['dropped'] if d['dropped'] is not None else '?'} |"
            for d in report["days"]]
    md_path.write_text("\n".join([
        f"# Running totals at scale: {report['users']:,} users x {report['days_run']} days, "
        f"{report['active']:.0%} active daily",
        "",
        f"`{report.get('command', '')}` (day 1; one fresh process per day), strategy {report['strategy']}, "
        f"{report['machine']['cores']} cores {report['machine']['machine']}, Python {report['machine']['python']}.",
        "",
        *[f"- {line}" for line in summary_lines(report)],
        "",
        "| day | rows | seconds | CPU s | peak RSS MB | ledger MB | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]))
    return json_path, md_path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=None, help="users (default 1,000,000)")
    parser.add_argument("--days", type=int, default=None, help="daily runs (default 365; at least 5)")
    parser.add_argument("--active", type=float, default=0.5, help="share of the users with a row each day (0.5)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['users']:,} users x {QUICK['days']} days")
    parser.add_argument("--short", action="store_true",
                        help=f"{SHORT['users']:,} users x {SHORT['days']} days (issue 20's short version)")
    parser.add_argument("--strategy", default=None, help="passed to every run as --strategy (default: the CLI's)")
    parser.add_argument("--horizon", type=int, default=None, help="passed to every run as --horizon (default: none)")
    parser.add_argument("--norm-budget", type=float, default=None, help="default 10 x days^2: the filter never binds")
    parser.add_argument("--shards", type=int, default=16, help="the ledger's shards (default 16, the CLI's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    parser.add_argument("--keep", action="store_true", help="keep the day files and the ledger (under --work-dir)")
    parser.add_argument("--work-dir", default=None, help="where the files, stores and ledger go (default: a "
                        "temporary folder, removed at the end unless --keep)")
    parser.add_argument("--out", default=None, help="prefix of the result files (default "
                        "benchmarks/results/running_scale-<users>x<days>[-<strategy>])")
    parser.add_argument("--no-check", action="store_true", help="report only: exit 0 even when a target is missed")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick and args.short:
        parser.error("argument --quick: not allowed with --short")
    preset = QUICK if args.quick else SHORT if args.short else {"users": 1_000_000, "days": 365}
    args.users = preset["users"] if args.users is None else args.users
    args.days = preset["days"] if args.days is None else args.days
    try:
        check_parameters(users=args.users, days=args.days, active=args.active, shards=args.shards,
                         norm_budget=args.norm_budget)
    except ValueError as exc:
        parser.error(str(exc))
    if args.work_dir and (Path(args.work_dir) / "ledger.duckdb").exists():  # day 1 starts a new ledger
        parser.error(f"argument --work-dir: must not hold a ledger already, got {args.work_dir} with ledger.duckdb")
    report = run(args)
    for line in summary_lines(report):
        print(line)
    name = f"running_scale-{args.users}x{args.days}" + (f"-{args.strategy}" if args.strategy else "")
    json_path, md_path = write_results(report, Path(args.out) if args.out else RESULTS / name)
    print(f"results: {json_path} and {md_path}")
    if args.keep:
        print(f"kept: {report['work_dir']}")
    return exit_status(report["missed"], no_check=args.no_check)


if __name__ == "__main__":
    raise SystemExit(main())
