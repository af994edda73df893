"""Every renyi-stream command refuses bad parameters: a non-zero exit status, a message on stderr
that names the option as typed (``--epsilon``, not ``epsilon``), no traceback, and nothing
committed to an existing release store or ledger.

The cases run ``renyi_stream.pipelines.cli.main`` in-process (fast); one test runs the installed console
script. ``test_every_command_is_covered`` fails when a new subcommand appears without cases.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import _build_parser, main
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.pipelines.features.job import materialise_features
from declared import contract, flags

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An existing deployment (one released day: store, ledger, key; its input and features) and
    a snapshot of its store, ledger and key, which no refused command may change."""
    root = tmp_path_factory.mktemp("world")
    days = [DAY0, DAY0, DAY0 + dt.timedelta(days=3)]
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 1], type=pa.int64()), "day": pa.array(days, type=pa.date32()),
                             "opened": pa.array([1.0, 0.0, 1.0])}), root / "in.parquet")
    pq.write_table(pa.table({"user_id": pa.array([1, 2], type=pa.int64()),
                             "day": pa.array([DAY0] * 2, type=pa.date32()),
                             "name": pa.array(["a", "b"])}), root / "no-indicators.parquet")
    run_job(JobConfig(inputs=(str(root / "in.parquet"),), store=str(root / "store.duckdb"),
                      ledger=str(root / "ledger.duckdb"), epsilon=1.0, delta=1e-6, norm_budget=5.0,
                      start_window=W0, end_window=W0, key_path=str(root / "key"), n_shards=2,
                      contract=contract("int64", "opened=0:1")))
    materialise_features([str(root / "in.parquet")], root / "features.parquet", start=DAY0, end=DAY0,
                         label_column="opened", label_start=DAY0 + dt.timedelta(days=3),
                         label_end=DAY0 + dt.timedelta(days=3))
    (root / "a-file.txt").write_text("not a folder")
    loose = root / "loose.key"
    loose.write_bytes(os.urandom(32))
    os.chmod(loose, 0o644)
    return root, _snapshot(root)


# Placeholders: {w} the world folder (existing files), {t} this test's empty folder.
RUN = ["run", "--input", "{w}/in.parquet", "--store", "{t}/s.duckdb", "--ledger", "{t}/l.duckdb", "--epsilon", "1",
       "--delta", "1e-6", "--norm-budget", "5", "--start", "2026-03-01", "--end", "2026-03-01", "--quiet",
       *flags("int64", "opened=0:1")]  # a new ledger's declared contract: every refusal below is of another option
CAL = ["calibrate", "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "10"]
SQL = ["sql", "SELECT * FROM releases", "--store", "{w}/store.duckdb"]
DEMO = ["demo", "--users", "10", "--days", "2", "--out", "{t}/demo", "--quiet"]
FEAT = ["features", "--input", "{w}/in.parquet", "--out", "{t}/f.parquet", "--start", "2026-03-01", "--end",
        "2026-03-01", "--label-column", "opened", "--label-start", "2026-03-04", "--label-end", "2026-03-04"]
TRAIN = ["train", "--features", "{w}/features.parquet", "--ledger", "{t}/l.duckdb", "--new-ledger", "--epsilon", "1",
         "--delta", "1e-6", "--train-rho", "0.01", "--out", "{t}/m.npz", "--quiet"]
QADD = ["query", "add", "--store", "{t}/s.duckdb", "--create", "--id", "q", "--columns", "opened", "--from",
        "2026-04-01"]
QRETIRE = ["query", "retire", "--store", "{w}/store.duckdb", "--id", "sum:opened", "--from", "2026-04-01"]
QLIST = ["query", "list", "--store", "{w}/store.duckdb"]
QCONTRACT = ["query", "contract", "--store", "{w}/store.duckdb"]
PRIV = ["privacy-report", "--ledger", "{w}/ledger.duckdb", "--user", "1"]
REPORT = ["report", "--store", "{w}/store.duckdb", "--out", "{t}/r.html"]
PLAN = ["plan", "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "10", *flags("int64", "opened=0:1")]


def _set(argv: list[str], option: str, value: str | None) -> list[str]:
    """``argv`` with ``option``'s value replaced (``None``: the option removed)."""
    out = list(argv)
    i = out.index(option)
    return out[:i] + out[i + 2:] if value is None else out[:i + 1] + [value] + out[i + 2:]


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without the option ``flag``, which takes no value."""
    return [a for a in argv if a != flag]


CASES: list[tuple[str, list[str], str]] = [
    # calibrate
    *[("calibrate", _set(CAL, "--epsilon", v), "--epsilon") for v in ("0", "-1", "one", "nan", "inf")],
    *[("calibrate", _set(CAL, "--delta", v), "--delta") for v in ("0", "1", "1.5", "-1e-6", "x")],
    *[("calibrate", _set(CAL, "--norm-budget", v), "--norm-budget") for v in ("0", "-3", "inf", "x")],
    *[("calibrate", CAL + ["--per-window-bound", v], "--per-window-bound") for v in ("0", "-1", "x")],
    ("calibrate", _set(CAL, "--epsilon", None), "--epsilon"),
    # plan
    *[("plan", _set(PLAN, "--epsilon", v), "--epsilon") for v in ("0", "nan")],
    ("plan", _set(PLAN, "--delta", "1"), "--delta"),
    ("plan", _set(PLAN, "--norm-budget", "-1"), "--norm-budget"),
    *[("plan", PLAN + ["--days", v], "--days") for v in ("0", "36501", "x")],
    *[("plan", PLAN + ["--contribution", v], "--contribution") for v in ("opened", "opened=x", "nosuch=1")],
    ("plan", PLAN + ["--keep", "0.5"], "--keep"),  # without --sample
    ("plan", PLAN + ["--sample", "{w}/in.parquet", "--keep", "1.5"], "--keep"),
    ("plan", PLAN + ["--sample", "{t}/missing.parquet"], "--sample"),
    ("plan", PLAN + ["--sample", "{w}/no-indicators.parquet"], "--sample"),  # lacks the declared column
    ("plan", _set(PLAN, "--column", "opened=1:0"), "--column"),
    ("plan", PLAN + ["--event-time-column", "opened"], "--event-time-column"),
    # stream and distributed: the jobs' own command lines through the front door
    ("stream", ["stream", "--replay"], "--replay"),
    ("stream", ["stream", "--replay", "{t}/m.arrows", "--start", "2026-03-01", "--end", "2026-03-01",
                "--epsilon", "-1", "--delta", "1e-6", "--norm-budget", "4", "--releases-parquet", "{t}/p",
                "--output", "{t}/o", "--noise-key", "{w}/key", "--id-type", "int64", "--column", "opened=0:1"],
     "--epsilon"),
    ("stream", ["stream", "--replay", "{t}/m.arrows", "--start", "2026-03-01", "--end", "2026-03-01",
                "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--releases-parquet", "{t}/p",
                "--output", "{t}/o", "--noise-key", "{w}/key", "--id-type", "int64", "--column", "opened=0:1",
                "--id-column", "uid", "--day-column", "uid"], "--day-column"),
    ("distributed", ["distributed", "--input", "{w}/in.parquet", "--start", "2026-03-01", "--end", "2026-03-01",
                     "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", "none",
                     "--output", "{t}/o", "--releases-parquet", "{t}/p", "--noise-key", "{w}/key", "--id-column",
                     "uid"], "--id-column"),
    ("distributed", ["distributed", "--input", "{t}/a.csv", "--start", "March", "--end", "2026-03-01",
                     "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--previous-ledger", "none",
                     "--output", "{t}/o", "--releases-parquet", "{t}/p"], "--start"),
    # run
    *[("run", _set(RUN, "--epsilon", v), "--epsilon") for v in ("0", "-1", "abc", "nan")],
    *[("run", _set(RUN, "--delta", v), "--delta") for v in ("0", "1", "2", "abc")],
    *[("run", _set(RUN, "--norm-budget", v), "--norm-budget") for v in ("0", "-1", "inf")],
    *[("run", _set(RUN, "--start", v), "--start") for v in ("March", "2026-02-30", "2026-03-02")],
    ("run", _set(RUN, "--end", "x"), "--end"),
    ("run", _set(RUN, "--end", "2400-01-01"), "--end"),  # a schedule of 100000+ windows
    *[("run", RUN + ["--window", v], "--window") for v in ("0d", "-1d", "abc", "1w", "")],
    *[("run", RUN + ["--shards", v], "--shards") for v in ("0", "5000", "x")],
    ("run", RUN + ["--policy", "x"], "--policy"),
    ("run", RUN + ["--accounting", "x"], "--accounting"),
    ("run", RUN + ["--release", "x"], "--release"),
    ("run", RUN + ["--runner", "NoSuchRunner"], "--runner"),
    ("run", _set(RUN, "--input", "{t}/missing.parquet"), "--input"),
    ("run", _set(RUN, "--input", "{w}/no-indicators.parquet"), "--input"),
    ("run", _set(RUN, "--store", None), "--store"),
    ("run", _set(RUN, "--ledger", None), "--ledger"),
    ("run", _set(RUN, "--store", "{t}/l.duckdb"), "--store"),  # the same file for both
    ("run", _set(RUN, "--store", "{t}"), "--store"),  # a folder
    ("run", _set(RUN, "--ledger", "{t}"), "--ledger"),
    ("run", _set(RUN, "--ledger", "{w}/store.duckdb"), "--ledger"),  # the public store as the ledger
    ("run", _set(RUN, "--store", "{w}/ledger.duckdb"), "--store"),  # the ledger as the public store
    ("run", RUN + ["--noise-key", "{t}"], "--noise-key"),
    ("run", RUN + ["--noise-key", "{w}/loose.key"], "--noise-key"),  # readable by others
    ("run", RUN + ["--key", "{w}/loose.key"], "--noise-key"),  # --key, its former name: named as it is now
    # the id and time columns' names, declared with the contract (issue 37, item 5)
    ("run", RUN + ["--id-column", "opened"], "--id-column"),  # a declared indicator column
    ("run", RUN + ["--day-column", "opened"], "--day-column"),
    ("run", RUN + ["--id-column", "d", "--day-column", "d"], "--day-column"),  # one name for both
    ("run", RUN + ["--day-column", "d", "--event-time-column", "t"], "--event-time-column"),  # two times
    ("run", RUN + ["--id-column", "window_id"], "--id-column"),  # the output's name
    ("run", RUN + ["--id-column", ""], "--id-column"),
    ("run", RUN + ["--day-column", "event_date"], "--day-column"),  # the input has no such column
    ("run", RUN + ["--id-column", "uid"], "--id-column"),
    ("run", RUN[:RUN.index("--id-type")] + ["--id-column", "uid"], "--id-column"),  # without the declaration
    ("run", RUN[:RUN.index("--id-type")] + ["--schema", "{t}/schema.json", "--id-column", "uid"], "--id-column"),
    ("run", RUN + ["--polcy", "clip"], "--polcy"),  # a typo, neither run's option nor Beam's
    ("run", RUN + ["--direct_num_worker=2"], "--direct_num_worker"),
    # sql
    ("sql", _set(SQL, "--store", None), "--store"),
    ("sql", _set(SQL, "--store", "{t}/missing.duckdb"), "--store"),
    ("sql", _set(SQL, "--store", "{t}"), "--store"),
    ("sql", _set(SQL, "--store", "{w}/ledger.duckdb"), "--store"),
    ("sql", SQL + ["--format", "xml"], "--format"),
    ("sql", SQL + ["--format", "parquet"], "--out"),
    ("sql", SQL + ["--out", "{t}/no/such/folder/x.csv"], "--out"),
    # demo
    *[("demo", _set(DEMO, "--users", v), "--users") for v in ("0", "-1", "x")],
    *[("demo", _set(DEMO, "--days", v), "--days") for v in ("0", "-1", "x")],
    ("demo", DEMO + ["--epsilon", "0"], "--epsilon"),
    ("demo", DEMO + ["--delta", "1"], "--delta"),
    *[("demo", DEMO + ["--norm-budget", v], "--norm-budget") for v in ("0", "-1", "nan")],
    ("demo", DEMO + ["--policy", "x"], "--policy"),
    ("demo", _set(DEMO, "--out", "{w}/a-file.txt"), "--out"),
    # features
    ("features", _set(FEAT, "--input", "{t}/missing.parquet"), "--input"),
    *[("features", _set(FEAT, "--start", v), "--start") for v in ("nope", "2026-03-05")],
    ("features", _set(FEAT, "--end", "x"), "--end"),
    *[("features", _set(FEAT, "--label-start", v), "--label-start") for v in ("x", "2026-03-09", "2026-03-01")],
    ("features", _set(FEAT, "--label-end", "x"), "--label-end"),
    ("features", _set(FEAT, "--label-column", "nosuch"), "--label-column"),
    ("features", FEAT + ["--ledger", "{w}/ledger.duckdb", "--id-column", "uid"], "--id-column"),
    # train
    *[("train", _set(TRAIN, "--epsilon", v), "--epsilon") for v in ("0", "-1", "x")],
    *[("train", _set(TRAIN, "--delta", v), "--delta") for v in ("0", "1", "1.5")],
    ("train", _set(TRAIN, "--features", "{t}/missing.parquet"), "--features"),
    ("train", _set(TRAIN, "--features", "{w}/in.parquet"), "--features"),  # not a features file
    *[("train", TRAIN + [option, value], option) for option, value in (
        ("--clip", "0"), ("--steps", "0"), ("--steps", "x"), ("--hidden", "0"), ("--learning-rate", "-1"),
        ("--noise-multiplier", "0"), ("--stop-fraction", "1"), ("--train-rho", "0"), ("--norm-budget", "0"),
        ("--stop-queries", "0"), ("--stop-every", "0"), ("--model", "x"), ("--device", "tpu"), ("--seed", "x"),
        ("--classes", "1"), ("--classes", "x"), ("--classes", "3"))],  # 3: the features file declares 2
    ("train", _set(TRAIN, "--ledger", "{w}/ledger.duckdb") + ["--train-rho", "1e9"], "--train-rho"),
    ("train", _set(TRAIN, "--ledger", "{w}/ledger.duckdb") + ["--epsilon", "2"], "epsilon"),  # not the ledger's
    ("train", _set(TRAIN, "--ledger", "{w}/store.duckdb"), "--ledger"),
    ("train", _set(TRAIN, "--out", "{t}"), "--out"),  # a folder: refused before anyone is charged
    ("train", _set(TRAIN, "--train-rho", None), "--train-rho"),  # the charge is declared, never a default
    ("train", _without(TRAIN, "--new-ledger"), "--ledger"),  # a ledger that does not exist, not asked for
    # query add / retire / list
    *[("query", _set(QADD, "--from", v), "--from") for v in ("soon", "2026-13-01")],
    ("query", _set(_set(QADD, "--store", "{w}/store.duckdb"), "--from", "2026-03-01"), "--from"),  # released
    ("query", _set(QADD, "--columns", ","), "--columns"),
    ("query", QADD + ["--histogram", "opened"], "--columns"),  # two kinds of query
    ("query", _set(QADD, "--columns", None) + ["--histogram", "opened"], "--categories"),
    ("query", _set(QADD, "--columns", None) + ["--clamp", "opened", "--hi", "1"], "--lo"),
    ("query", _set(QADD, "--columns", None) + ["--clamp", "opened", "--lo", "2", "--hi", "1"], "--lo"),
    *[("query", _set(QADD, "--columns", None) + ["--weighted", v], "--weighted") for v in ("opened=x", "opened=nan")],
    ("query", QADD + ["--window", "0d"], "--window"),
    ("query", QADD + ["--kind", "x"], "--kind"),
    *[("query", QADD + ["--noise-scale", v], "--noise-scale") for v in ("0", "nan", "1e4", "x")],
    ("query", QADD + ["--kind", "running", "--noise-scale", "2"], "--noise-scale"),  # window queries only
    ("query", _set(QADD, "--store", "{w}/ledger.duckdb"), "--store"),
    ("query", _without(QADD, "--create"), "--store"),  # a store that does not exist, not asked for
    ("query", _set(QRETIRE, "--store", "{t}/missing.duckdb"), "--store"),
    ("query", _set(QRETIRE, "--id", "nosuch"), "--id"),
    ("query", _set(QRETIRE, "--from", "x"), "--from"),
    ("query", _set(QLIST, "--store", "{t}/missing.duckdb"), "--store"),
    ("query", _set(QLIST, "--store", "{w}/ledger.duckdb"), "--store"),
    ("query", QLIST + ["--format", "xml"], "--format"),
    ("query", _set(QCONTRACT, "--store", "{t}/missing.duckdb"), "--store"),
    ("query", _set(QCONTRACT, "--store", "{w}/ledger.duckdb"), "--store"),
    # privacy-report
    *[("privacy-report", PRIV + ["--delta", v], "--delta") for v in ("0", "1", "x")],
    ("privacy-report", _set(PRIV, "--ledger", "{t}/missing.duckdb"), "--ledger"),
    ("privacy-report", _set(PRIV, "--ledger", "{w}/store.duckdb"), "--ledger"),
    ("privacy-report", _set(PRIV, "--user", None), "--user"),
    ("privacy-report", _set(PRIV, "--user", None) + ["--all"], "--out"),
    ("privacy-report", _set(PRIV, "--user", "abc"), "--user"),
    ("privacy-report", _set(PRIV, "--user", None) + ["--all", "--out", "{t}/no/such/folder/all.parquet"], "--out"),
    # report
    ("report", _set(REPORT, "--store", None), "--store"),
    ("report", _set(REPORT, "--store", "{t}/missing.duckdb"), "--store"),
    ("report", _set(REPORT, "--store", "{w}/ledger.duckdb"), "--store"),
    ("report", REPORT + ["--ledger", "{t}/missing.duckdb"], "--ledger"),
    ("report", REPORT + ["--ledger", "{w}/store.duckdb"], "--ledger"),
    ("report", _set(REPORT, "--out", "{t}"), "--out"),
    # key create
    ("key", ["key", "create"], "PATH"),
    ("key", ["key", "create", "{w}/key"], "PATH"),  # the world's key: never overwritten
    ("key", ["key", "create", "{w}"], "PATH"),  # a folder
    # dead-letters
    ("dead-letters", ["dead-letters", "--ledger", "{t}/missing.duckdb"], "--ledger"),  # never created
    ("dead-letters", ["dead-letters", "--ledger", "{w}/store.duckdb"], "--ledger"),  # the public store
    ("dead-letters", ["dead-letters", "--ledger", "{w}/ledger.duckdb", "--rows", "--limit", "0"], "--limit"),
    ("dead-letters", ["dead-letters", "--ledger", "{w}/ledger.duckdb", "--limit", "5"], "--limit"),  # no --rows
    ("dead-letters", ["dead-letters", "--curator-output", "{t}"], "--curator-output"),  # no job's output
]


def _snapshot(folder: Path) -> dict:
    """Every table of the world's store and ledger, and the key's bytes."""
    out = {"key": (folder / "key").read_bytes()}
    for name in ("store.duckdb", "ledger.duckdb"):
        db = duckdb.connect(str(folder / name), read_only=True)
        try:
            tables = [t for (t,) in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'").fetchall()]
            out[name] = {t: db.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in sorted(tables)}
        finally:
            db.close()
    return out


def _refusal(argv: list[str], capsys) -> tuple[object, str]:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("command, argv, option", CASES,
                         ids=[f"{c}-{i}-{o.lstrip('-')}" for i, (c, _, o) in enumerate(CASES)])
def test_a_bad_parameter_exits_non_zero_naming_the_option(world, tmp_path, capsys, command, argv, option):
    root, as_built = world
    argv = [a.format(w=root, t=tmp_path) for a in argv]
    status, err = _refusal(argv, capsys)
    assert status not in (0, None), err
    assert option in err, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"renyi-stream {command}"), err
    assert _snapshot(root) == as_built  # nothing committed to the existing store, ledger or key


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_command_is_covered():
    parser = _build_parser()
    covered = {command for command, _, _ in CASES}
    assert _subcommands(parser) <= covered, f"commands without bad-parameter cases: {_subcommands(parser) - covered}"
    query = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["query"]
    actions = {argv[1] for command, argv, _ in CASES if command == "query"}
    assert _subcommands(query) <= actions


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("renyi-stream")
    if script.exists():
        return [str(script)]
    found = shutil.which("renyi-stream")
    return [found] if found else [sys.executable, "-m", "renyi_stream.pipelines.cli.main"]


@pytest.mark.parametrize("argv, option", [
    (["calibrate", "--epsilon", "0", "--delta", "1e-6", "--norm-budget", "10"], "--epsilon"),
    (["run", "--input", "x.parquet", "--store", "s.duckdb", "--ledger", "l.duckdb", "--epsilon", "1", "--delta",
      "1", "--norm-budget", "10", "--start", "2026-03-01", "--end", "2026-03-01"], "--delta"),
])
def test_the_installed_console_script_refuses_the_same_way(tmp_path, argv, option):
    result = subprocess.run(_console_script() + argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert option in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())  # nothing created
