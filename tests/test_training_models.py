"""Models for private GD: per-example gradient norms and weighted sums without materialising
per-example gradients, checked against the one-example-at-a-time definition."""

from __future__ import annotations

import numpy as np
import pytest

from renyi_stream.stream.training.dpgd import prepare_data
from renyi_stream.stream.training.models import (
    LogisticRegression,
    MLP,
    load_model,
    make_model,
    per_example_gradients_reference,
    save_model,
    softmax_residual,
)
from renyi_stream.stream.xp import gpu_available

N, D, K = 40, 7, 4
MODULES = [np] + ([__import__("cupy")] if gpu_available() else [])


def _setup(model, seed=0, dtype=np.float64, xp=np):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D)) * rng.uniform(0.1, 5.0, size=(N, 1))
    y = rng.integers(0, K, size=N)
    params = model.init_params(D, K, rng, xp, dtype)
    params = {k: v + xp.asarray(rng.normal(scale=0.3, size=v.shape), dtype=dtype) for k, v in params.items()}
    return x, y, params, prepare_data(x, y, n_classes=K, xp=xp, dtype=dtype)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


@pytest.mark.parametrize("xp", MODULES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("model", [LogisticRegression(), MLP(6)], ids=lambda m: m.name)
def test_per_example_squared_norms_equal_the_materialised_gradients(model, xp):
    x, y, params, data = _setup(model, xp=xp)
    ref = per_example_gradients_reference(model, {k: _host(v) for k, v in params.items()}, x, y, K)
    exact = sum((g.reshape(N, -1) ** 2).sum(axis=1) for g in ref.values())
    got = _host(model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).sq_norms)
    np.testing.assert_allclose(got, exact, rtol=1e-12)
    assert (got >= exact).all()  # an upper bound, never below: the clip bound must hold


@pytest.mark.parametrize("model", [LogisticRegression(), MLP(6)], ids=lambda m: m.name)
def test_float32_norms_bound_the_norms_of_what_the_float32_step_contributes(model):
    # In float32 the step sums x~_i (x) delta_i with delta_i computed in float32: the clip must
    # hold for *those* vectors (what is released), so the bound is checked against their exact
    # norms, computed in float64 from the float32 intermediates.
    x, y, params, _ = _setup(model, seed=1)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    d32 = prepare_data(x.astype(np.float32), y, n_classes=K, dtype=np.float32)
    x64 = d32.x.astype(np.float64)
    x_sq = (x64 * x64).sum(axis=1) + 1.0
    if model.name == "logreg":
        delta = softmax_residual(d32.x @ p32["W"] + p32["b"], d32.onehot_t).T.astype(np.float64)
        exact = x_sq * (delta**2).sum(axis=1)
    else:
        h = np.maximum(d32.x @ p32["W1"] + p32["b1"], 0)
        delta2 = softmax_residual(h @ p32["W2"] + p32["b2"], d32.onehot_t).T
        delta1 = (delta2 @ p32["W2"].T) * (h > 0)
        h64, d1, d2 = (a.astype(np.float64) for a in (h, delta1, delta2))
        exact = x_sq * (d1**2).sum(axis=1) + ((h64**2).sum(axis=1) + 1.0) * (d2**2).sum(axis=1)
    got = model.per_example(p32, d32.x, d32.onehot_t, d32.x_sq_norms).sq_norms
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, exact, rtol=1e-5)
    assert (got >= exact).all()


@pytest.mark.parametrize("xp", MODULES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("model", [LogisticRegression(), MLP(6)], ids=lambda m: m.name)
def test_weighted_sum_is_the_weighted_sum_of_per_example_gradients(model, xp):
    x, y, params, data = _setup(model, seed=2, xp=xp)
    ref = per_example_gradients_reference(model, {k: _host(v) for k, v in params.items()}, x, y, K)
    w = np.random.default_rng(3).uniform(0, 1, size=N)
    got = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).weighted_sum(xp.asarray(w))
    assert set(got) == set(ref)
    for name in ref:
        assert got[name].shape == params[name].shape
        np.testing.assert_allclose(_host(got[name]), np.tensordot(w, ref[name], axes=1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", [LogisticRegression(), MLP(6)], ids=lambda m: m.name)
def test_a_row_whose_gradient_is_not_finite_is_masked_out_of_the_weighted_sum(model):
    # Row 3's logits (and the MLP's hidden units) overflow: its residual is NaN. With a weight of 0
    # (what private_gd gives a dropped row), multiplying would put 0 * NaN into every sum; masked
    # with where, the sum is the other rows' sum.
    x, y, params, _ = _setup(model, seed=9)
    x[3] = 1e308
    first = "W" if model.name == "logreg" else "W1"
    params[first][:, 0] = 0.5  # the row's first logit (hidden unit) is 3.5e308: inf
    data = prepare_data(x, y, n_classes=K)
    w = np.random.default_rng(10).uniform(0, 1, size=N)
    w[3] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(model.logits(params, data.x)[3]).all()
        pe = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms)
        got = pe.weighted_sum(w)
    assert not np.isfinite(pe.sq_norms[3]) and np.isfinite(np.delete(pe.sq_norms, 3)).all()
    others = np.delete(np.arange(N), 3)
    ref = per_example_gradients_reference(model, params, x[others], y[others], K)
    for name in ref:
        np.testing.assert_allclose(got[name], np.tensordot(w[others], ref[name], axes=1), rtol=1e-10, atol=1e-12)


def test_logistic_regression_gradient_norm_is_x_norm_times_residual_norm():
    model = LogisticRegression()
    x, y, params, data = _setup(model, seed=4)
    z = x @ params["W"] + params["b"]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    residual = p - np.eye(K)[y]
    expected = (np.sum(x * x, axis=1) + 1.0) * np.sum(residual**2, axis=1)  # ||x~||^2 ||p - y||^2
    np.testing.assert_allclose(model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).sq_norms,
                               expected, rtol=1e-12)


@pytest.mark.parametrize("model", [LogisticRegression(), MLP(3)], ids=lambda m: m.name)
def test_weighted_sum_may_be_taken_once(model):
    # it scales the model's intermediates in place (no per-step copies of (n, hidden) arrays)
    _, _, params, data = _setup(model, seed=5)
    pe = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms)
    pe.weighted_sum(np.ones(N))
    with pytest.raises(RuntimeError, match="called once"):
        pe.weighted_sum(np.ones(N))


@pytest.mark.parametrize("block_bytes", [1, 200, 1 << 20])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mlp_row_blocks_change_nothing(block_bytes, dtype, monkeypatch):
    # The CPU path runs the MLP's element-wise passes in cache-sized row blocks; any block size
    # (the smallest, 8 rows; a few rows with a ragged last block; one block) gives the same norms bit for bit
    # and the same weighted sums up to the order of the bias sum.
    from renyi_stream.stream.training import models

    model = MLP(6)
    x, y, params, _ = _setup(model, seed=7)
    p = {k: v.astype(dtype) for k, v in params.items()}
    data = prepare_data(x, y, n_classes=K, dtype=dtype)
    w = np.random.default_rng(8).uniform(0, 1, size=N)
    whole = model.per_example(p, data.x, data.onehot_t, data.x_sq_norms)
    whole_sums = whole.weighted_sum(w)
    monkeypatch.setattr(models, "_BLOCK_BYTES", block_bytes)
    blocks = models._row_blocks(N, 6, dtype, np)
    assert (len(blocks) > 1) == (block_bytes < 1 << 20) and sum(b.stop - b.start for b in blocks) == N
    blocked = model.per_example(p, data.x, data.onehot_t, data.x_sq_norms)
    np.testing.assert_array_equal(blocked.sq_norms, whole.sq_norms)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    for name, value in blocked.weighted_sum(w).items():
        np.testing.assert_allclose(value, whole_sums[name], rtol=rtol, atol=rtol)


def test_models_validate_their_parameters():
    with pytest.raises(ValueError, match="hidden must be an integer >= 1, got hidden=0"):
        MLP(0)
    with pytest.raises(ValueError, match="model must be 'logreg', 'mlp' or 'cnn', got model='resnet'"):
        make_model("resnet")


@pytest.mark.parametrize("model", [LogisticRegression(), MLP(6)], ids=lambda m: m.name)
def test_a_saved_model_loads_back_with_its_metadata(model, tmp_path):
    _, _, params, data = _setup(model, seed=6)
    path = save_model(tmp_path / "m.npz", model, params, {"privacy": {"epsilon": 1.0}})
    loaded, loaded_params, meta = load_model(path)
    assert loaded.config() == model.config() and meta["privacy"] == {"epsilon": 1.0}
    for name in params:
        np.testing.assert_array_equal(loaded_params[name], params[name])
    np.testing.assert_array_equal(loaded.logits(loaded_params, data.x), model.logits(params, data.x))
    np.savez(tmp_path / "other.npz", W=np.zeros(2))
    with pytest.raises(ValueError, match="not a renyi-stream model file"):
        load_model(tmp_path / "other.npz")


def test_prepare_data_refuses_bad_inputs_naming_them():
    with pytest.raises(ValueError, match="labels must be in \\[0, 3\\)"):
        prepare_data(np.zeros((2, 2)), np.array([0, 3]), n_classes=3)
    with pytest.raises(ValueError, match="x must be finite"):
        prepare_data(np.array([[np.nan, 1.0]]), np.array([0]), n_classes=2)
    with pytest.raises(ValueError, match="x must be finite \\(no NaN or inf\\) in dtype float32"):
        prepare_data(np.array([[1e39, 1.0]]), np.array([0]), n_classes=2, dtype=np.float32)  # inf in float32
    with pytest.raises(ValueError, match="labels must have shape \\(2,\\)"):
        prepare_data(np.zeros((2, 2)), np.array([0, 1, 1]), n_classes=2)
