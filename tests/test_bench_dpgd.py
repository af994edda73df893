"""The DP-GD benchmark runs end to end on a small batch, in both of its timing modes.

It is a benchmark, not a timed test: these only check that the command works and prints its
table (Opacus is skipped so that the test does not depend on the optional ``bench`` extra).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_dpgd.py"


def _run(*extra: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH), "--n", "3000", "--repeats", "2", "--skip-opacus",
                           "--settle", "0", *extra], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("mode", [[], ["--same-process"]], ids=["isolated", "same-process"])
def test_the_benchmark_prints_a_row_and_every_timed_step_per_model(mode):
    out = _run(*mode)
    assert "| logistic regression |" in out and "| MLP (256 hidden) |" in out
    assert out.count("every timed step in order: ours ") == 2
    assert ("both sides in this process" in out) == bool(mode)


def test_the_gpu_benchmark_explains_why_it_cannot_run_without_a_device():
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on GPU machines too
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(BENCH), "--device", "gpu", "--n", "100"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2
    assert "--device gpu needs CuPy and a CUDA device" in done.stderr


def test_without_opacus_the_benchmark_times_ours_and_says_why_opacus_was_skipped(tmp_path):
    # packages that fail to import the way missing ones do, first on the workers' path (torch is
    # imported first, so the message names it whether or not the real torch is installed)
    for name in ("torch", "opacus"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCH), "--n", "3000", "--repeats", "1", "--settle", "0",
                           "--models", "logreg"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "| logistic regression |" in done.stdout
    assert "skipped: torch is not installed (pip install '.[bench]')" in done.stdout
    assert "every timed step in order: ours " in done.stdout


def test_several_steps_per_call_are_timed_as_one_run_and_reported_per_step_beside_the_interleaved_floor():
    out = _run("--steps-per-call", "2", "--gemm-floor", "--models", "mlp")
    assert "one timed call of 2 step(s)" in out and "| MLP (256 hidden) |" in out
    assert "timed in turns with the step" in out and "issue 21's target: 1.15x" in out


def test_zero_steps_per_call_is_refused_naming_the_option():
    done = subprocess.run([sys.executable, str(BENCH), "--steps-per-call", "0"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "--steps-per-call must be an integer >= 1, got 0" in done.stderr
