"""Opacus's MNIST CNN in the training stage (issue 40): its forward pass, per-example gradient
norms and clipped sums against a reference written independently (one example at a time, a
direct convolution loop over output positions), a finite-difference check per layer, the filter
of Algorithm 7 against the textbook algorithm, the device path, and ``renyi-stream train --model cnn``.

Float64 throughout (rtol 1e-10), a handful of 28x28 images: the reference costs about 20 ms per
example and gradient.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.stream.testing import strict_xp as sx
from renyi_stream.stream.training import cnn
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.cnn import SampleConvNet, gram_is_cheaper
from renyi_stream.stream.training.dpgd import GDConfig, default_chunk_rows, prepare_data, private_gd, training_generators
from renyi_stream.stream.training.models import cross_entropy, load_model, make_model, save_model

pytestmark = pytest.mark.filterwarnings("ignore::renyi_stream.stream.noise.InsecureNoiseWarning")

K = 10
MODES = ["auto", "gram"]


# --- the reference: one example at a time, loops over output positions -------------------------


def _conv(img: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """``img`` (C, H, W), ``w`` (O, C, k, k): cross-correlation, as PyTorch's Conv2d."""
    out_ch, _, k, _ = w.shape
    side = (img.shape[1] - k) // stride + 1
    z = np.empty((out_ch, side, side))
    for r in range(side):
        for c in range(side):
            z[:, r, c] = np.tensordot(w, img[:, stride * r:stride * r + k, stride * c:stride * c + k], axes=3) + b
    return z


def _maxpool(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2 stride 1; the (row, column) of each window's first maximum in scan order, as PyTorch."""
    ch, side, _ = h.shape
    out = np.empty((ch, side - 1, side - 1))
    where = np.empty((ch, side - 1, side - 1, 2), dtype=int)
    for r in range(side - 1):
        for c in range(side - 1):
            window = h[:, r:r + 2, c:c + 2].reshape(ch, 4)
            first = window.argmax(axis=1)
            out[:, r, c] = window[np.arange(ch), first]
            where[:, r, c] = np.stack([r + first // 2, c + first % 2], axis=1)
    return out, where


def _maxpool_backward(grad: np.ndarray, where: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape)
    for ch in range(grad.shape[0]):
        for r in range(grad.shape[1]):
            for c in range(grad.shape[2]):
                out[ch, where[ch, r, c, 0], where[ch, r, c, 1]] += grad[ch, r, c]
    return out


def _reference_forward(p: dict, x: np.ndarray) -> dict:
    img = np.pad(x.reshape(1, 28, 28), ((0, 0), (3, 3), (3, 3)))
    z1 = _conv(img, p["conv1_w"], p["conv1_b"], 2)
    p1, where1 = _maxpool(np.maximum(z1, 0.0))
    z2 = _conv(p1, p["conv2_w"], p["conv2_b"], 2)
    p2, where2 = _maxpool(np.maximum(z2, 0.0))
    flat = p2.reshape(-1)  # (channel, row, column), as torch's x.view(-1, 512)
    z3 = flat @ p["fc1_w"] + p["fc1_b"]
    h3 = np.maximum(z3, 0.0)
    return {"img": img, "z1": z1, "p1": p1, "where1": where1, "z2": z2, "where2": where2, "flat": flat, "z3": z3,
            "h3": h3, "logits": h3 @ p["fc2_w"] + p["fc2_b"]}


def _reference_gradient(p: dict, x: np.ndarray, y: int) -> dict:
    """The cross-entropy gradient of one example, by hand."""
    f = _reference_forward(p, x)
    e = np.exp(f["logits"] - f["logits"].max())
    d4 = e / e.sum()
    d4[y] -= 1.0
    g = {"fc2_w": np.outer(f["h3"], d4), "fc2_b": d4}
    d3 = (p["fc2_w"] @ d4) * (f["z3"] > 0)
    g["fc1_w"], g["fc1_b"] = np.outer(f["flat"], d3), d3
    d2 = _maxpool_backward((p["fc1_w"] @ d3).reshape(32, 4, 4), f["where2"], (32, 5, 5)) * (f["z2"] > 0)
    g_w2, g_p1 = np.zeros_like(p["conv2_w"]), np.zeros((16, 13, 13))
    for r in range(5):
        for c in range(5):
            g_w2 += d2[:, r, c, None, None, None] * f["p1"][None, :, 2 * r:2 * r + 4, 2 * c:2 * c + 4]
            g_p1[:, 2 * r:2 * r + 4, 2 * c:2 * c + 4] += np.tensordot(d2[:, r, c], p["conv2_w"], axes=1)
    g["conv2_w"], g["conv2_b"] = g_w2, d2.sum(axis=(1, 2))
    d1 = _maxpool_backward(g_p1, f["where1"], (16, 14, 14)) * (f["z1"] > 0)
    g_w1 = np.zeros_like(p["conv1_w"])
    for r in range(14):
        for c in range(14):
            g_w1 += d1[:, r, c, None, None, None] * f["img"][None, :, 2 * r:2 * r + 8, 2 * c:2 * c + 8]
    g["conv1_w"], g["conv1_b"] = g_w1, d1.sum(axis=(1, 2))
    return g


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images: noise, and in every other one a blank top half (MNIST's background: equal
    patches, so equal activations and ties in the max-pools, routed to the first maximum)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 28, 28))
    x[::2, :14] = -0.42
    return x.reshape(n, 784), rng.integers(0, K, size=n)


def _params(model: SampleConvNet, seed: int, dtype=np.float64, xp=np) -> dict:
    rng = np.random.default_rng(seed)
    params = model.init_params(784, K, rng, xp, dtype)
    # away from the initialisation's small scale: more units active, larger gradients
    return {k: v + xp.asarray(rng.normal(scale=0.05, size=v.shape), dtype=dtype) for k, v in params.items()}


@pytest.fixture(scope="module")
def case():
    model = SampleConvNet()
    x, y = _images(6, seed=1)
    params = _params(model, seed=2)
    grads = [_reference_gradient(params, x[i], int(y[i])) for i in range(len(y))]
    return x, y, params, grads


# --- the model against the reference ------------------------------------------------------------


def test_the_forward_pass_equals_the_direct_convolution(case):
    x, y, params, _ = case
    data = prepare_data(x, y, n_classes=K)
    expected = np.stack([_reference_forward(params, xi)["logits"] for xi in x])
    np.testing.assert_allclose(SampleConvNet().logits(params, data.x), expected, rtol=1e-10, atol=1e-12)


def test_the_test_images_have_ties_in_the_pools(case):
    # the blank halves must make ties, or the first-maximum rule is not exercised
    x, _, params, _ = case
    f = _reference_forward(params, x[0])
    h1 = np.maximum(f["z1"], 0.0)
    windows = np.stack([h1[:, :13, :13], h1[:, :13, 1:], h1[:, 1:, :13], h1[:, 1:, 1:]])
    best = windows.max(axis=0)
    assert ((windows == best).sum(axis=0)[best > 0] > 1).sum() > 10


@pytest.mark.parametrize("mode", MODES)
def test_per_example_squared_norms_equal_the_direct_per_example_gradients(case, mode):
    x, y, params, grads = case
    data = prepare_data(x, y, n_classes=K)
    exact = np.array([sum(float((v**2).sum()) for v in g.values()) for g in grads])
    got = SampleConvNet(mode).per_example(params, data.x, data.onehot_t, data.x_sq_norms).sq_norms
    np.testing.assert_allclose(got, exact, rtol=1e-10)
    assert (got >= exact).all()  # an upper bound: the clip must hold


@pytest.mark.parametrize("mode", MODES)
def test_the_clipped_sum_equals_the_weighted_sum_of_direct_per_example_gradients(case, mode):
    x, y, params, grads = case
    data = prepare_data(x, y, n_classes=K)
    w = np.random.default_rng(3).uniform(0.0, 1.0, size=len(y))
    got = SampleConvNet(mode).per_example(params, data.x, data.onehot_t, data.x_sq_norms).weighted_sum(w)
    assert list(got) == list(params)  # parameter order: the noise is drawn in it
    for name, value in got.items():
        expected = sum(wi * g[name] for wi, g in zip(w, grads))
        assert value.shape == params[name].shape
        np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-13 * np.abs(expected).max())


@pytest.mark.parametrize("name,index", [("conv1_w", (3, 0, 4, 5)), ("conv1_b", (7,)), ("conv2_w", (11, 5, 2, 1)),
                                        ("conv2_b", (20,)), ("fc1_w", (100, 9)), ("fc1_b", (4,)),
                                        ("fc2_w", (13, 6)), ("fc2_b", (2,))])
def test_one_gradient_coordinate_per_layer_matches_finite_differences(case, name, index):
    x, y, params, _ = case
    model = SampleConvNet()
    data = prepare_data(x, y, n_classes=K)
    w = np.linspace(0.5, 1.0, len(y))  # d/dtheta of sum_i w_i loss_i

    def loss(p):
        return float(w @ cross_entropy(model.logits(p, data.x), y))

    analytic = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).weighted_sum(w)[name][index]
    h = 1e-5
    up, down = ({k: v.copy() for k, v in params.items()} for _ in range(2))
    up[name][index] += h
    down[name][index] -= h
    numeric = (loss(up) - loss(down)) / (2 * h)
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8)


def test_the_cheaper_norm_method_is_chosen_per_layer():
    # materialising a conv layer's gradient costs 4 d_a d_d flops more, Gram 2 P^2 (d_a + d_d)
    assert SampleConvNet().norm_methods() == {"conv1": "materialise", "conv2": "materialise", "fc1": "gram",
                                              "fc2": "gram"}
    assert gram_is_cheaper(1, 513, 32) and not gram_is_cheaper(25, 257, 32) and gram_is_cheaper(2, 257, 32)
    assert SampleConvNet("gram").norm_methods()["conv1"] == "gram"
    with pytest.raises(ValueError, match="conv_norms must be one of auto, materialise, gram, got conv_norms='x'"):
        SampleConvNet("x")


def test_float32_norms_bound_what_the_float32_step_contributes():
    # In float32 the clip must hold for what the step adds up, computed in float32: example i's
    # contribution is the weighted sum with weight 1 for it and 0 for the others (exactly its
    # float32 pieces: the materialised conv gradients, the dense layers' outer products), whose
    # exact norm (float64) the bound must not be below; and it is close to float64's gradient.
    model = SampleConvNet()
    n = 6
    x, y = _images(n, seed=4)
    params = _params(model, seed=5, dtype=np.float32)
    data = prepare_data(x, y, n_classes=K, dtype=np.float32)
    bound = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).sq_norms
    assert bound.dtype == np.float64
    params64 = {k: v.astype(np.float64) for k, v in params.items()}
    for i in range(n):
        alone = np.zeros(n)
        alone[i] = 1.0
        contributed = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).weighted_sum(alone)
        exact = sum(float((v.astype(np.float64) ** 2).sum()) for v in contributed.values())
        assert exact <= bound[i] <= exact * (1 + 2e-3)  # the slack of a float32 sum of 8,192 squares: 1e-3
        reference = _reference_gradient(params64, data.x[i].astype(np.float64), int(y[i]))
        assert bound[i] == pytest.approx(sum(float((v**2).sum()) for v in reference.values()), rel=1e-2)


@pytest.mark.parametrize("block_bytes", [1, 2 << 20])
def test_blocks_of_examples_change_nothing(case, block_bytes, monkeypatch):
    x, y, params, _ = case
    data = prepare_data(x, y, n_classes=K)
    w = np.random.default_rng(6).uniform(size=len(y))
    whole = SampleConvNet().per_example(params, data.x, data.onehot_t, data.x_sq_norms)
    sums = whole.weighted_sum(w)
    monkeypatch.setattr(cnn, "_BLOCK_BYTES_HOST", block_bytes)
    model = SampleConvNet()
    assert len(model._blocks(len(y), np.float64, np)) == (len(y) if block_bytes == 1 else 2)
    blocked = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms)
    # BLAS may take another kernel for another number of rows: the same values up to rounding
    np.testing.assert_allclose(blocked.sq_norms, whole.sq_norms, rtol=1e-13)
    for name, value in blocked.weighted_sum(w).items():
        np.testing.assert_allclose(value, sums[name], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(model.logits(params, data.x), SampleConvNet().logits(params, data.x), rtol=1e-13)


def test_a_row_whose_gradient_is_not_finite_is_masked_out_of_the_sum(case):
    x, y, params, grads = case
    x = x.copy()
    x[3] = 1e300  # finite, but the first layer overflows
    data = prepare_data(x, y, n_classes=K)
    w = np.random.default_rng(7).uniform(size=len(y))
    w[3] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        pe = SampleConvNet().per_example(params, data.x, data.onehot_t, data.x_sq_norms)
        got = pe.weighted_sum(w)
    assert not np.isfinite(pe.sq_norms[3]) and np.isfinite(np.delete(pe.sq_norms, 3)).all()
    for name, value in got.items():
        expected = sum(w[i] * grads[i][name] for i in range(len(y)) if i != 3)
        np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-13 * np.abs(expected).max())


# --- the filter ---------------------------------------------------------------------------------


def test_the_filter_drops_exactly_the_examples_whose_next_charge_would_cross_their_budget():
    # As tests/test_dpgd.py checks the MLP: the run against Algorithm 7 as printed, here with the
    # reference's per-example gradients: each step's clip factor is min(1, min(C, sqrt(B_i -
    # spent_i)) / ||g_i||), so a user whose full charge would cross B_i is charged exactly what
    # is left, and a user with nothing left contributes nothing from then on.
    model = SampleConvNet()
    n = 8
    x, y = _images(n, seed=8)
    x *= np.linspace(0.2, 1.5, n)[:, None]  # gradient norms of several sizes
    data = prepare_data(x, y, n_classes=K)
    clip, sigma = 2.0, 0.5
    budgets = np.full(n, 2.5 * clip**2)  # 2.5 full steps each, the run takes 6
    config = GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=0.5, steps=2, filtering=True,
                      norm_budget=float(budgets[0]), max_steps=6)
    ledger = TrainingLedger.fresh(n, budget=10.0)  # plenty: B_norm binds
    its, weights = [], []

    def keep(rep):
        its.append({k: v.copy() for k, v in rep.params.items()})
        weights.append(np.array(rep.weights))

    grad_rng, query_rng = training_generators(7)
    result = private_gd(model, data, config=config, ledger=ledger, rng=grad_rng, query_rng=query_rng,
                        init_rng=np.random.default_rng(1), progress=keep, normaliser=n)

    textbook_rng, _ = training_generators(7)
    params = model.init_params(784, K, np.random.default_rng(1))
    spent = np.zeros(n)
    for step in range(6):
        g = [_reference_gradient(params, x[i], int(y[i])) for i in range(n)]
        norms = np.sqrt([sum(float((v**2).sum()) for v in gi.values()) for gi in g])
        bound = np.minimum(clip, np.sqrt(np.maximum(budgets - spent, 0.0)))
        assert (norms > 0).all()
        factor = np.minimum(1.0, bound / norms)
        np.testing.assert_allclose(weights[step], factor, rtol=1e-6, atol=1e-6)
        gone = bound < 1e-6 * clip
        assert (weights[step][gone] < 1e-5).all()  # filtered out: (almost) nothing left, nothing added
        assert (weights[step][~gone] > 0).all()
        spent += (factor * norms) ** 2
        params = {k: p - config.learning_rate * (sum(f * gi[k] for f, gi in zip(factor, g))
                                                 + textbook_rng.standard_normal(p.shape) * sigma * clip) / n
                  for k, p in params.items()}
        for name in params:
            np.testing.assert_allclose(its[step][name], params[name], rtol=1e-6, atol=1e-9)
    assert sum(result.curator["budget_bound"]) > 0  # some charges were cut to what was left
    assert (spent <= budgets * (1 + 1e-9)).all() and (ledger.used <= config.rho * (1 + 1e-9)).all()
    assert result.curator["exhausted"][-1] > 0  # and some users were filtered out by the end


def test_algorithm_7_at_b_norm_k_c2_reproduces_algorithm_6_bit_for_bit():
    model = SampleConvNet()
    x, y = _images(6, seed=9)
    data = prepare_data(x, y, n_classes=K)
    k, sigma, clip = 3, 2.0, 0.7
    runs = []
    for config in (GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=1.0, steps=k),
                   GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=1.0, steps=k, filtering=True,
                            norm_budget=k * clip * clip, max_steps=k + 2)):
        its = []
        grad_rng, query_rng = training_generators(3)
        private_gd(model, data, config=config, ledger=TrainingLedger.fresh(6, budget=1.0), rng=grad_rng,
                   query_rng=query_rng, init_rng=np.random.default_rng(4), normaliser=6.0,
                   progress=lambda rep, its=its: its.append({n: v.copy() for n, v in rep.params.items()}))
        runs.append(its)
    for a, b in zip(runs[0], runs[1][:k]):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


# --- the device path and the slices ----------------------------------------------------------------


def test_a_run_on_the_device_path_is_numpy_bit_for_bit_and_a_step_moves_nothing_to_the_host():
    x, y = _images(5, seed=10)
    config = GDConfig(clip=1.0, noise_multiplier=2.0, learning_rate=0.5, steps=2, filtering=True,
                      norm_budget=1.5, max_steps=3)

    def run(xp, steps):
        data = prepare_data(x, y, n_classes=K, xp=xp)
        ledger = TrainingLedger.fresh(5, budget=1.0, xp=xp)
        grad_rng, query_rng = training_generators(6)
        model = SampleConvNet()  # a fresh one: it uploads its two index arrays once
        with sx.host_traffic() as traffic:
            result = private_gd(model, data, config=GDConfig(**{**config.__dict__, "max_steps": steps}),
                                ledger=ledger, rng=grad_rng, query_rng=query_rng, init_rng=np.random.default_rng(7),
                                normaliser=5.0)
        return result, traffic

    expected, _ = run(np, 3)
    got, short = run(sx, 3)
    for name in expected.params:
        host = got.params[name].get()
        assert host.dtype == expected.params[name].dtype
        assert host.tobytes() == np.ascontiguousarray(expected.params[name]).tobytes()
    _, long = run(sx, 5)
    assert short.transfers == long.transfers == 1  # the curator counts, read once after the run
    assert long.uploads - short.uploads == 2 * 8  # two more steps: one noise array per parameter


def test_the_slices_of_a_cnn_run_are_sized_by_what_it_keeps_per_row():
    row = SampleConvNet().row_bytes(np.float32)
    assert 35_000 < row < 45_000  # the materialised conv gradients (16 x 65, 32 x 257) and the dense inputs
    assert default_chunk_rows(60_000, 784, np.float32, row_bytes=row) == 1024  # the floor, 41 MB kept
    assert default_chunk_rows(60_000, 784, np.float32, xp=sx, row_bytes=row) == 60_000  # a device: one slice


# --- the model file and the command line -----------------------------------------------------------


def test_a_saved_cnn_loads_back(tmp_path, case):
    x, y, params, _ = case
    model = make_model("cnn", conv_norms="gram")
    loaded, loaded_params, meta = load_model(save_model(tmp_path / "m.npz", model, params))
    assert loaded.config() == {"model": "cnn", "conv_norms": "gram"} == {k: meta[k] for k in ("model", "conv_norms")}
    np.testing.assert_array_equal(loaded.logits(loaded_params, x), model.logits(params, x))


def test_another_width_is_refused_naming_the_model_option():
    with pytest.raises(ValueError, match=r"model cnn takes 28x28 images as 784 pixel columns \(row-major\), got 7 "
                                         r"feature columns; use --model logreg or --model mlp"):
        SampleConvNet().init_params(7, K, np.random.default_rng(0))


def _image_features(path, n: int, width: int = 784) -> None:
    x, y = _images(n, seed=11)
    x = np.resize(x, (n, width))
    columns = {"user_id": pa.array(np.arange(n, dtype=np.int64))}
    columns.update({f"p{j}": pa.array(x[:, j]) for j in range(width)})
    columns["label"] = pa.array(y.astype(np.int64))
    pq.write_table(pa.table(columns), path)
    path.chmod(0o600)


def test_renyi_stream_train_model_cnn_trains_on_784_pixel_columns_and_refuses_others(tmp_path, capsys):
    from renyi_stream.pipelines.cli.main import main

    _image_features(tmp_path / "images.parquet", 12)
    _image_features(tmp_path / "narrow.parquet", 12, width=7)
    args = ["train", "--ledger", str(tmp_path / "l.duckdb"), "--new-ledger", "--epsilon", "1", "--delta", "1e-5",
            "--out", str(tmp_path / "m.npz"), "--model", "cnn", "--classes", "10", "--steps", "2", "--no-stopping",
            "--normaliser", "12", "--seed", "1", "--train-rho", "0.01", "--clip", "1", "--learning-rate", "0.5"]
    assert main(args[:1] + ["--features", str(tmp_path / "narrow.parquet")] + args[1:]) == 2
    err = capsys.readouterr().err
    assert "argument --model: model cnn takes 28x28 images as 784 pixel columns" in err and "got 7" in err
    assert not (tmp_path / "l.duckdb").exists()  # refused before the ledger exists, nobody charged
    assert main(args[:1] + ["--features", str(tmp_path / "images.parquet")] + args[1:]) == 0, capsys.readouterr().err
    model, params, meta = load_model(tmp_path / "m.npz")
    assert meta["model"] == "cnn" and params["conv1_w"].shape == (16, 1, 8, 8) and params["fc2_b"].shape == (10,)
