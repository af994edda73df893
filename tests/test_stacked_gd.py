"""Stacked private GD (``benchmarks/stacked_gd.py``): M settings of Algorithm 6 sharing data, ``k``
and ``sigma`` run at once, each ending where its own ``private_gd`` run ends.

Tolerance of the comparisons with separate runs (float64): relative ``1e-10`` of each parameter's
largest magnitude. The stacked products sum the same terms in another order than the per-setting
ones (BLAS blocks over the stacked columns; the norms' row sums go through einsum over a 3-d
array), and each such sum errs by at most about ``n eps = 300 * 2.2e-16 ~ 7e-14`` relative; four
steps of a smooth map do not grow that to ``1e-10``, while a wrong clip factor, noise draw, seed
or learning rate changes the parameters at the first digit. Observed: at most ``3e-16``.
"""

from __future__ import annotations

import importlib
import itertools
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.dpgd import GDConfig, prepare_data, private_gd, training_generators
from renyi_stream.stream.training.models import MLP, LogisticRegression

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = pytest.mark.filterwarnings("ignore::renyi_stream.stream.noise.InsecureNoiseWarning")

N, D, K, STEPS, SIGMA = 300, 20, 4, 4, 1.3
# (C, eta): C = 0.3 clips every row, C = 5 about half of them (of the logistic regression's), so the
# clip factors differ between the settings of one stack
SETTINGS = ((0.3, 2.0), (1.0, 1.0), (5.0, 0.5))
RTOL = 1e-10


@pytest.fixture(scope="module")
def stacked():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("stacked_gd")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _data(n: int = N):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, D)) * rng.uniform(0.2, 3.0, size=(n, 1))  # gradient norms of all sizes
    return prepare_data(x, rng.integers(0, K, size=n), n_classes=K)


def _configs(settings=SETTINGS, steps=STEPS, sigma=SIGMA):
    return [GDConfig(clip=c, noise_multiplier=sigma, learning_rate=lr, steps=steps) for c, lr in settings]


def _close(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=RTOL * np.abs(want[key]).max(), err_msg=key)


MODELS = [LogisticRegression(), MLP(8)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_three_stacked_settings_end_where_three_separate_private_gd_runs_end(stacked, model):
    data, configs = _data(), _configs()
    got = stacked.stacked_private_gd(model, data, configs=configs, rngs=[np.random.default_rng(10 + s) for s in range(3)],
                                     init_rngs=[np.random.default_rng(20 + s) for s in range(3)], normaliser=N,
                                     chunk_rows=128)
    assert len(got) == 3
    for s, config in enumerate(configs):
        # a fresh ledger whose budget never binds (each step charges at most 1 / (2 sigma^2)): it scales nothing
        alone = private_gd(model, data, config=config, ledger=TrainingLedger.fresh(N, budget=2 * config.rho),
                           rng=np.random.default_rng(10 + s), init_rng=np.random.default_rng(20 + s), normaliser=N,
                           chunk_rows=128)
        _close(got[s], alone.final_params)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_row_whose_gradient_overflows_is_dropped_from_each_setting_as_private_gd_drops_it(stacked, model):
    """A 1e308 feature: that row's squared norm overflows in every setting, and its logits once
    the weights move; the stack masks it out of each setting's sums, as the separate runs do."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)) * rng.uniform(0.2, 3.0, size=(N, 1))
    x[7, 3] = 1e308
    data, configs = prepare_data(x, rng.integers(0, K, size=N), n_classes=K), _configs()
    got = stacked.stacked_private_gd(model, data, configs=configs, rngs=[np.random.default_rng(10 + s) for s in range(3)],
                                     init_rngs=[np.random.default_rng(20 + s) for s in range(3)], normaliser=N)
    for s, config in enumerate(configs):
        alone = private_gd(model, data, config=config, ledger=TrainingLedger.fresh(N, budget=2 * config.rho),
                           rng=np.random.default_rng(10 + s), init_rng=np.random.default_rng(20 + s), normaliser=N)
        assert alone.curator["not_finite"] == [1] * STEPS
        assert all(np.isfinite(v).all() for v in got[s].values())
        _close(got[s], alone.final_params)


def test_an_mlp_stack_over_several_row_blocks_sums_its_float32_gradients_as_the_separate_runs_do(stacked):
    """40,000 rows: two of MLP.per_example's row blocks (32,768 rows at 8 hidden float32 units).
    The separate run sums b1 and W2 per block; a stack summing the whole slice at once differs by
    up to 8e-7 relative after 4 steps here (and by 0.8% of validation accuracy after 50 steps on
    MNIST). Tolerance: 2e-7 of each parameter's largest magnitude, under two float32 ulps (only
    BLAS's own order inside the stacked products may differ; observed: 0)."""
    n = 40_000
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, D)) * rng.uniform(0.2, 3.0, size=(n, 1))
    data, configs, model = prepare_data(x, rng.integers(0, K, size=n), n_classes=K, dtype=np.float32), _configs(), MLP(8)
    got = stacked.stacked_private_gd(model, data, configs=configs, rngs=[np.random.default_rng(10 + s) for s in range(3)],
                                     init_rngs=[np.random.default_rng(20 + s) for s in range(3)], normaliser=n)
    for s, config in enumerate(configs):
        alone = private_gd(model, data, config=config, ledger=TrainingLedger.fresh(n, budget=2 * config.rho),
                           rng=np.random.default_rng(10 + s), init_rng=np.random.default_rng(20 + s), normaliser=n)
        for key, want in alone.final_params.items():
            np.testing.assert_allclose(got[s][key], want, rtol=0, atol=2e-7 * np.abs(want).max(), err_msg=key)


def test_the_stack_clips_each_setting_at_its_own_bound(stacked):
    """A stack whose settings share everything but C: the run of a larger C moves further (its
    clipped gradients are longer) and differs from the small-C run; fed C swapped, the results swap."""
    data, model = _data(), LogisticRegression()
    pair = [(0.3, 1.0), (5.0, 1.0)]

    def run(settings):
        return stacked.stacked_private_gd(model, data, configs=_configs(settings), normaliser=N,
                                          rngs=[np.random.default_rng(1) for _ in settings])

    small, large = run(pair)
    assert np.abs(large["W"]).max() > 2 * np.abs(small["W"]).max()
    swapped = run(pair[::-1])
    _close(swapped[0], large)
    _close(swapped[1], small)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_settings_result_does_not_depend_on_which_settings_share_its_stack(stacked, model):
    data, configs = _data(), _configs()
    middle = configs[1]

    def run(stack):  # the middle setting always with the same generators, wherever it sits
        return stacked.stacked_private_gd(
            model, data, configs=stack, normaliser=N,
            rngs=[np.random.default_rng(11 if c is middle else 99) for c in stack],
            init_rngs=[np.random.default_rng(21 if c is middle else 98) for c in stack])

    alone = run([middle])[0]
    _close(run(configs)[1], alone)
    _close(run([configs[2], configs[0], middle])[2], alone)


def test_a_tuning_group_scores_each_grid_point_as_its_own_validation_run_does(monkeypatch):
    """mnist_experiment's stacked tuning against digits_experiment.validation_accuracy, the
    per-point run it replaces: same sigma, noise and initialisation seeds, same accuracy."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import digits_experiment
    import mnist_experiment

    rng = np.random.default_rng(3)
    centres = rng.normal(size=(K, D)) * 0.5  # overlapping classes: the points score differently
    labels = rng.integers(0, K, size=N + 100)
    x = centres[labels] + rng.normal(size=(N + 100, D))
    fit = prepare_data(x[:N], labels[:N], n_classes=K)
    rho = 0.05
    for model in MODELS:
        points = tuple(digits_experiment.Setting(c, 5, eta_c / c) for c in (0.25, 1.0, 4.0) for eta_c in (1.0, 9.0))
        got = mnist_experiment.group_validation_accuracies(model, fit, x[N:], labels[N:], rho=rho, settings=points,
                                                           seed=2)
        want = [digits_experiment.validation_accuracy(model, fit, x[N:], labels[N:], rho=rho, setting=p, seed=2)
                for p in points]
        assert got == want
        assert len(set(want)) > 1  # the points differ: a mix-up of settings would show


def test_the_tuning_groups_cover_the_grid_once_per_model_epsilon_and_seed(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import mnist_experiment as me

    grid = [me.Setting(c, k, e / c) for c, k, e in itertools.product(me.GRID_C, me.GRID_K, me.GRID_ETA_C)]
    budgets = {eps: {"thm49": eps / 10} for eps in me.EPSILONS}
    groups = me.tuning_groups(["logreg", "mlp"], grid, budgets, seeds=2)
    assert len(groups) == 2 * 3 * len(me.GRID_K) * 2
    assert all(len(g.settings) == 9 and {s.steps for s in g.settings} == {g.steps} for g in groups)
    points = [(g.model, g.epsilon, g.seed, s) for g in groups for s in g.settings]
    assert sorted(points, key=repr) == sorted(((m, e, seed, s) for m in ("logreg", "mlp") for e in me.EPSILONS
                                               for seed in range(2) for s in grid), key=repr)


def _bad(stacked, **changes):
    kw = dict(configs=_configs(), rngs=[np.random.default_rng(s) for s in range(3)], normaliser=N)
    kw.update(changes)
    return stacked.stacked_private_gd(LogisticRegression(), _data(40), **kw)


def test_an_empty_stack_is_refused_naming_m(stacked):
    with pytest.raises(ValueError, match=r"configs must hold at least one setting \(M >= 1\), got M=0"):
        _bad(stacked, configs=[], rngs=[])


@pytest.mark.parametrize("name, second, shown", [("steps", dict(steps=5), "configs[1].steps=5"),
                                                 ("noise_multiplier", dict(sigma=2.0), "configs[1].noise_multiplier=2.0")])
def test_settings_with_different_k_or_sigma_are_refused_naming_them(stacked, name, second, shown):
    configs = _configs()
    configs[1] = _configs(**second)[1]
    with pytest.raises(ValueError, match=rf"configs\[1\]\.{name} must equal configs\[0\]\.{name}=.*got {re.escape(shown)}"):
        _bad(stacked, configs=configs)


def test_a_filtering_config_is_refused(stacked):
    configs = _configs()
    configs[2] = GDConfig(clip=1.0, noise_multiplier=SIGMA, learning_rate=1.0, steps=STEPS, filtering=True)
    with pytest.raises(ValueError, match=r"configs\[2\]\.filtering must be False"):
        _bad(stacked, configs=configs)


@pytest.mark.parametrize("field, value", [("clip", 0.0), ("clip", -1.0), ("learning_rate", 0.0)])
def test_a_setting_with_c_or_eta_not_positive_cannot_be_stacked(field, value):
    """C > 0 and eta > 0 are GDConfig's checks, the one place private_gd's settings are validated."""
    kw = dict(clip=1.0, noise_multiplier=SIGMA, learning_rate=1.0, steps=STEPS) | {field: value}
    with pytest.raises(ValueError, match=rf"{field} must be .*got {field}={value}"):
        GDConfig(**kw)


def test_one_generator_per_setting_is_required(stacked):
    with pytest.raises(ValueError, match=r"rngs must hold one generator per setting \(3\), got len\(rngs\)=2"):
        _bad(stacked, rngs=[np.random.default_rng(0)] * 2)
    with pytest.raises(ValueError, match=r"init_rngs must hold one generator per setting \(3\), got len\(init_rngs\)=1"):
        _bad(stacked, init_rngs=[np.random.default_rng(0)])


def test_a_normaliser_that_is_not_positive_is_refused(stacked):
    with pytest.raises(ValueError, match="normaliser"):
        _bad(stacked, normaliser=0.0)


def test_the_noise_is_each_settings_own_generators(stacked):
    """Swapping two settings' generators changes both results (each draws from its own)."""
    data, configs = _data(), _configs()
    grad = [training_generators(s)[0] for s in range(3)]
    once = stacked.stacked_private_gd(LogisticRegression(), data, configs=configs, rngs=grad, normaliser=N)
    grad = [training_generators(s)[0] for s in (1, 0, 2)]
    again = stacked.stacked_private_gd(LogisticRegression(), data, configs=configs, rngs=grad, normaliser=N)
    assert not np.allclose(once[0]["W"], again[0]["W"]) and not np.allclose(once[1]["W"], again[1]["W"])
    _close(again[2], once[2])
