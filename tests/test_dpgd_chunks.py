"""The CPU default of :func:`renyi_stream.stream.training.dpgd.private_gd`: the batch in cache-sized slices,
each charged to the ledger before its weighted sum (the performance change of issue 7).

Slicing must change nothing that matters for privacy or for the specification: Algorithm 7
still reproduces Algorithm 6 bit for bit, every clipped gradient stays within its bound, every
user is charged what the whole-batch run charges (the filter reads each user's own state
only), and the iterates agree with the whole-batch run up to float summation order.
"""

from __future__ import annotations

import numpy as np
import pytest

from renyi_stream.stream.training import dpgd
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.dpgd import (
    GDConfig,
    default_chunk_rows,
    noise_multiplier_for,
    prepare_data,
    private_gd,
    training_generators,
)
from renyi_stream.stream.training.models import LogisticRegression, MLP, per_example_gradients_reference

pytestmark = pytest.mark.filterwarnings("ignore::renyi_stream.stream.noise.InsecureNoiseWarning")

N, D, K = 150, 6, 3
MODELS = [LogisticRegression(), MLP(5)]


class _NotNumpy:
    """Stands for CuPy: any array module other than NumPy runs the batch as one slice."""


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D)) * rng.uniform(0.2, 3.0, size=(N, 1))
    return x, rng.integers(0, K, size=N)


def _run(model, data, config, ledger, **kw):
    its, weights = [], []

    def keep(rep):
        its.append({k: v.copy() for k, v in rep.params.items()})
        weights.append(np.array(rep.weights))

    grad_rng, query_rng = training_generators(7)
    result = private_gd(model, data, config=config, ledger=ledger, rng=grad_rng, query_rng=query_rng,
                        init_rng=np.random.default_rng(1), progress=keep, normaliser=data.n, **kw)
    return its, weights, result


@pytest.fixture
def small_slices(monkeypatch):
    """Make the default slice 40 rows at this test's size (4 slices, the last one ragged)."""
    monkeypatch.setattr(dpgd, "_MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(dpgd, "_CHUNK_BYTES", 40 * D * 8)
    assert default_chunk_rows(N, D, np.float64) == 40


def test_default_chunk_rows_is_cache_sized_on_numpy_and_the_whole_batch_elsewhere():
    rows = default_chunk_rows(200_000, 784, np.float32)
    assert 1024 <= rows < 200_000 and rows * 784 * 4 <= dpgd._CHUNK_BYTES
    assert default_chunk_rows(500, 784, np.float32) == 500  # never more than the batch
    assert default_chunk_rows(200_000, 10**7, np.float64) == dpgd._MIN_CHUNK_ROWS  # wide rows: the floor
    assert default_chunk_rows(200_000, 784, np.float32, xp=_NotNumpy) == 200_000


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_the_default_is_the_explicit_slicing_and_matches_the_whole_batch(model, small_slices):
    x, y = _data(1)
    data = prepare_data(x, y, n_classes=K)
    config = GDConfig(clip=0.7, noise_multiplier=3.0, learning_rate=1.0, steps=3, filtering=True, max_steps=6)
    ledgers = [TrainingLedger.fresh(N, budget=0.5) for _ in range(3)]
    default, w_default, _ = _run(model, data, config, ledgers[0])
    sliced, w_sliced, _ = _run(model, data, config, ledgers[1], chunk_rows=40)
    whole, w_whole, _ = _run(model, data, config, ledgers[2], chunk_rows=N)
    for a, b, c in zip(default, sliced, whole):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])  # the default is chunk_rows=40 exactly
            np.testing.assert_allclose(a[name], c[name], rtol=1e-10, atol=1e-12)  # summation order only
    for a, b in zip(w_default, w_whole):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(ledgers[0].used, ledgers[1].used)
    np.testing.assert_allclose(ledgers[0].used, ledgers[2].used, rtol=1e-12, atol=0)
    assert (ledgers[0].used <= ledgers[0].cap).all()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_algorithm_7_reproduces_algorithm_6_bit_for_bit_in_slices(model, small_slices):
    x, y = _data(2)
    data = prepare_data(x, y, n_classes=K)
    k, rho, clip = 8, 0.05, 0.5
    sigma = noise_multiplier_for(steps=k, rho=rho)
    alg6 = GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=2.0, steps=k)
    alg7 = GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=2.0, steps=k, filtering=True,
                    norm_budget=k * clip * clip, max_steps=k)
    l6, l7 = TrainingLedger.fresh(N, budget=rho), TrainingLedger.fresh(N, budget=rho)
    its6, w6, _ = _run(model, data, alg6, l6)
    its7, w7, r7 = _run(model, data, alg7, l7)
    for a, b in zip(its6, its7):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    for a, b in zip(w6, w7):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(l6.used, l7.used)
    assert r7.curator["budget_bound"] == [0] * k


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_clipped_gradient_stays_within_its_bound_in_slices(dtype, small_slices, monkeypatch):
    if dtype == np.float32:
        monkeypatch.setattr(dpgd, "_CHUNK_BYTES", 40 * D * 4)
    x, y = _data(3)
    x[:10] *= 100.0  # huge gradients
    data = prepare_data(x, y, n_classes=K, dtype=dtype)
    model = MLP(4)
    config = GDConfig(clip=0.3, noise_multiplier=2.0, learning_rate=0.5, steps=3)
    its, weights, result = _run(model, data, config, TrainingLedger.fresh(N, budget=10.0))
    assert sum(result.curator["clipped"]) > 0
    init = model.init_params(D, K, np.random.default_rng(1), np, dtype)
    for params, w in zip([init] + its[:-1], weights):
        # exact norms (float64) of what the step contributes, from the run's own parameters
        g = per_example_gradients_reference(model, params, data.x, np.asarray(y), K)
        norms = np.sqrt(sum((v.reshape(N, -1) ** 2).sum(axis=1) for v in g.values()))
        slack = 1e-12 if dtype == np.float64 else 1e-5  # float32 intermediates vs float64 reference
        assert (w * norms <= 0.3 * (1 + slack)).all()
