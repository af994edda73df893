"""The paper's experiment runs on MNIST's own IDX files (here: a small generated MNIST-shaped set).

``benchmarks/digits_experiment.py --mnist DIR`` reads the four IDX files with
``stream.training.idx.load_mnist`` and runs the same protocol as the digits table, without
scikit-learn. The real MNIST cannot be downloaded here; these files have its names, layout and
types (28 x 28 uint8 images, uint8 labels).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stream.training.idx import write_idx

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "digits_experiment.py"


def _experiment_module():
    spec = importlib.util.spec_from_file_location("digits_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _mnist_like(folder: Path, n_train: int = 300, n_test: int = 100) -> None:
    """Each class lights a 6 x 6 block of its own on a noisy background."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n, gz in (("train", n_train, ".gz"), ("t10k", n_test, "")):
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
        for c in range(10):
            r, col = 2 + 5 * (c // 5) * 2, 2 + 5 * (c % 5)
            images[labels == c, r:r + 6, col:col + 6] = 250
        write_idx(folder / f"{split}-images-idx3-ubyte{gz}", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte{gz}", labels.astype(np.uint8))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("precision", [[], ["--float32"]], ids=["float64", "float32"])
def test_the_experiment_runs_on_mnist_idx_files_and_writes_its_table(tmp_path, precision):
    _mnist_like(tmp_path / "mnist")
    done = _run("--mnist", str(tmp_path / "mnist"), "--quick", "--tuning-seeds", "1", "--out", str(tmp_path / "out"),
                *precision)
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "out.md").read_text()
    assert table.startswith("MNIST (300 train / 100 test), logreg, delta=1e-05, 3 trials")
    rows = [line for line in table.splitlines() if line.startswith(("| 0.3 |", "| 0.5 |", "| 1.0 |"))]
    assert len(rows) == 6  # accuracy table and diagnostics table, three epsilons each
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["dataset"] == "MNIST" and [r["epsilon"] for r in report["rows"]] == [0.3, 0.5, 1.0]
    assert report["dtype"] == ("float32" if precision else "float64")
    for row in report["rows"]:
        assert len(row["results"]) == 8
        assert all(0.0 <= mean <= 100.0 and std >= 0.0 for mean, std in row["results"].values())


def test_a_missing_mnist_file_exits_2_naming_it(tmp_path):
    _mnist_like(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    done = _run("--mnist", str(tmp_path), "--quick")
    assert done.returncode == 2
    assert "no t10k-labels-idx1-ubyte (or t10k-labels-idx1-ubyte.gz) in" in done.stderr


def test_a_corrupt_mnist_file_exits_2_naming_it(tmp_path):
    _mnist_like(tmp_path)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    done = _run("--mnist", str(tmp_path), "--quick")
    assert done.returncode == 2
    assert "t10k-images-idx3-ubyte: header" in done.stderr and "file has" in done.stderr


@pytest.mark.parametrize("seed", [1, 2])
def test_the_tuning_split_holds_out_a_quarter_of_each_class_and_is_fixed_by_its_seed(seed):
    split = _experiment_module().stratified_split
    y = np.repeat(np.arange(10), [40, 41, 39, 44, 36, 40, 40, 40, 40, 40])
    x = np.arange(len(y))[:, None].astype(float)
    x_fit, x_held, y_fit, y_held = split(x, y, test_size=0.25, seed=seed)
    for c in range(10):
        assert (y_held == c).sum() == round(0.25 * (y == c).sum())
    assert sorted(np.concatenate([x_fit[:, 0], x_held[:, 0]])) == list(range(len(y)))
    np.testing.assert_array_equal(x_fit[:, 0], np.sort(x_fit[:, 0]))  # input order kept
    again = split(x, y, test_size=0.25, seed=seed)
    np.testing.assert_array_equal(again[1], x_held)
