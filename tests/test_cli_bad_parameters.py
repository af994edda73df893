"""Every renyi-stream command refuses bad parameters: non-zero exit, a message naming the parameter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipelines.cli import main

CASES = [
    ("calibrate", ["calibrate", "--epsilon", "0", "--delta", "1e-6", "--norm-budget", "10"], "epsilon"),
    ("calibrate", ["calibrate", "--epsilon", "-1", "--delta", "1e-6", "--norm-budget", "10"], "epsilon"),
    ("calibrate", ["calibrate", "--epsilon", "1", "--delta", "1", "--norm-budget", "10"], "delta"),
    ("calibrate", ["calibrate", "--epsilon", "one", "--delta", "1e-6", "--norm-budget", "10"], "--epsilon"),
    ("calibrate", ["calibrate", "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "-3"], "norm_budget"),
    ("run", ["run", "--input", "X", "--store", "S", "--ledger", "L", "--epsilon", "0", "--delta", "1e-6",
             "--norm-budget", "10", "--start", "2026-03-01", "--end", "2026-03-01"], "epsilon"),
    ("run", ["run", "--input", "X", "--store", "S", "--ledger", "L", "--epsilon", "1", "--delta", "2",
             "--norm-budget", "10", "--start", "2026-03-01", "--end", "2026-03-01"], "delta"),
    ("run", ["run", "--input", "X", "--store", "S", "--ledger", "L", "--epsilon", "1", "--delta", "1e-6",
             "--norm-budget", "10", "--start", "March", "--end", "2026-03-01"], "start"),
    ("run", ["run", "--input", "X", "--store", "S", "--ledger", "L", "--epsilon", "1", "--delta", "1e-6",
             "--norm-budget", "10", "--start", "2026-03-02", "--end", "2026-03-01"], "start"),
    ("run", ["run", "--input", "X", "--store", "S", "--ledger", "L", "--epsilon", "1", "--delta", "1e-6",
             "--norm-budget", "10", "--start", "2026-03-01", "--end", "2026-03-01", "--window", "0d"], "window"),
    ("run", ["run", "--input", "X", "--ledger", "L", "--epsilon", "1", "--delta", "1e-6",
             "--norm-budget", "10", "--start", "2026-03-01", "--end", "2026-03-01"], "--store"),
    ("sql", ["sql", "SELECT 1"], "--store"),
    ("sql", ["sql", "SELECT 1", "--store", "S", "--format", "xml"], "--format"),
    ("demo", ["demo", "--users", "0"], "users"),
    ("demo", ["demo", "--days", "-1"], "days"),
    ("features", ["features", "--input", "X", "--out", "O", "--start", "nope", "--end", "2026-03-01",
                  "--label-column", "a", "--label-start", "2026-03-02", "--label-end", "2026-03-03"], "start"),
    ("train", ["train", "--features", "F", "--ledger", "L", "--epsilon", "0", "--delta", "1e-6", "--out", "m.npz"],
     "epsilon"),
    ("train", ["train", "--features", "F", "--ledger", "L", "--epsilon", "1", "--delta", "1.5", "--out", "m.npz"],
     "delta"),
    ("query", ["query", "add", "--store", "S", "--id", "q", "--columns", "a", "--from", "soon"], "--from"),
    ("privacy-report", ["privacy-report", "--ledger", "L", "--user", "1", "--delta", "0"], "--delta"),
    ("report", ["report", "--out", "r.html"], "--store"),
]


@pytest.mark.parametrize("command, argv, parameter", CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_bad_parameters_exit_non_zero_naming_the_parameter(tmp_path, capsys, command, argv, parameter):
    argv = [str(tmp_path / a) if a in ("X", "S", "L", "F", "O") else a for a in argv]
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    assert status not in (0, None)
    err = capsys.readouterr().err
    assert parameter in err, err
    assert "Traceback" not in err


def test_the_installed_console_script_refuses_the_same_way():
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "calibrate", "--epsilon", "0", "--delta", "1e-6",
                             "--norm-budget", "10"], capture_output=True, text=True)
    assert result.returncode == 2 and "epsilon" in result.stderr and "Traceback" not in result.stderr
