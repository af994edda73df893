"""The device path on a real GPU (issue 21, item 4): the ledger's kernels, the filtered DP-GD step
and the running-total kernels run on CuPy arrays and agree with NumPy.

``tests/test_device_path.py`` runs the same kernels in CI on ``renyi_stream.stream.testing.strict_xp`` and
shows they are NumPy bit for bit with no hidden host traffic. What only a GPU can show is
checked here: that CuPy has every function and keyword the kernels call, and that CUDA's own
arithmetic (cuBLAS and reduction summation order, the device's exp/log and FFT) changes results
only in the last bits, never a decision. So sums are compared within stated relative tolerances
and every discrete outcome (a filter status, a curator count, a released accuracy count) must be
equal. Skipped where CuPy sees no CUDA device (CI); run on a lent GPU with
``python -m pytest tests/test_gpu_kernels.py`` after ``pip install '.[gpu,test]'``.
"""

from __future__ import annotations


import device_cases as cases
import numpy as np
import pytest

from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.accounting.odometers import advance_trackers, tracker_update
from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.continual.strategies import BinaryTree, SquareRootFactorization, WindowSums
from renyi_stream.stream.ledger import Policy, individual_filter
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.dpgd import prepare_data
from renyi_stream.stream.training.models import MLP, LogisticRegression, softmax_residual
from renyi_stream.stream.training.normaliser import private_count
from renyi_stream.stream.training.stopping import AccuracyStopping
from renyi_stream.stream.xp import array_module, col_sq_sums, column_sums, gpu_available, row_sq_sums, to_host

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device (pip install '.[gpu]')")

if gpu_available():
    import cupy as cp
else:  # collected in CI, never run there
    cp = None

STRATEGIES = [WindowSums(), SquareRootFactorization(), BinaryTree(), BinaryTree(height=2)]
MODELS = [LogisticRegression(), MLP(16)]
F64_RTOL = 1e-12  # float64 sums of at most a few hundred terms in another order


def _on_device(a: object) -> bool:
    return array_module(a) is cp


def _close(expected: np.ndarray, got: object, rtol: float, atol: float = 0.0) -> None:
    assert _on_device(got), f"the result left the device: {type(got)}"
    host = to_host(got)
    assert host.dtype == expected.dtype and host.shape == expected.shape
    np.testing.assert_allclose(host, expected, rtol=rtol, atol=atol)


# --- the reductions renyi_stream.stream.xp computes in CuPy's own fast forms ----------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduce, numpy_form", [
    (row_sq_sums, lambda a: np.einsum("ij,ij->i", a, a)),
    (col_sq_sums, lambda a: np.einsum("ij,ij->j", a, a)),
    (column_sums, lambda a: a.sum(axis=0)),
], ids=["row_sq_sums", "col_sq_sums", "column_sums"])
def test_the_cupy_forms_of_the_reductions_match_numpy_and_keep_nan_and_inf(reduce, numpy_form, dtype):
    a = np.random.default_rng(13).standard_normal((3000, 37)).astype(dtype)
    a[5, 3], a[7, 4] = np.nan, np.inf  # row 5 / column 3 is NaN, row 7 / column 4 is inf
    expected = numpy_form(a)
    got = reduce(cp.asarray(a))
    assert _on_device(got) and got.dtype == a.dtype
    host = to_host(got)
    np.testing.assert_array_equal(np.isnan(host), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(host), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(host[finite], expected[finite], rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-3 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("model", [LogisticRegression(), MLP(256)], ids=lambda m: m.name)
def test_float32_norms_on_cupy_bound_the_norms_of_what_the_device_step_contributes(model):
    # The clip must hold for the vectors the device sums: delta computed by cuBLAS in float32, in
    # the model's own order of operations. Their exact norms (float64, on the host) must never
    # exceed the bounds the model computes with CuPy's reductions (row_sq_sums, col_sq_sums).
    rng = np.random.default_rng(15)
    n, d, k = 4000, 300, 10
    x = (rng.random((n, d)) * rng.uniform(0.1, 4.0, (n, 1))).astype(np.float32)
    y = rng.integers(0, k, n)
    data = prepare_data(x, y, n_classes=k, xp=cp, dtype=np.float32)
    params = model.init_params(d, k, rng, cp, np.float32)
    params = {name: v + cp.asarray(rng.normal(scale=0.05, size=v.shape), dtype=np.float32)
              for name, v in params.items()}
    got = to_host(model.per_example(params, data.x, data.onehot_t, data.x_sq_norms).sq_norms)
    x64 = x.astype(np.float64)
    x_sq = (x64 * x64).sum(axis=1) + 1.0
    if model.name == "logreg":
        z = data.x @ params["W"]
        z += params["b"]
        delta = to_host(softmax_residual(z, data.onehot_t)).T.astype(np.float64)
        exact = x_sq * (delta**2).sum(axis=1)
    else:
        h = data.x @ params["W1"]
        h += params["b1"]
        cp.maximum(h, 0, out=h)
        z = h @ params["W2"]
        z += params["b2"]
        d2 = softmax_residual(z, data.onehot_t)
        d1 = cp.matmul(d2.T, cp.ascontiguousarray(params["W2"].T))
        d1 *= h > 0
        h64, d1_64, d2_64 = (to_host(a).astype(np.float64) for a in (h, d1, d2.T))
        exact = x_sq * (d1_64**2).sum(axis=1) + ((h64**2).sum(axis=1) + 1.0) * (d2_64**2).sum(axis=1)
    np.testing.assert_allclose(got, exact, rtol=1e-4)
    assert (got >= exact).all(), f"{int((got < exact).sum())} bounds below the exact norm"


# --- the ledger's kernels ------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 7])
def test_the_gaussian_charge_on_cupy_matches_numpy_including_overflowing_and_subnormal_rows(d):
    x = cases.contributions(d)
    _close(gaussian_charge(contributions=x, noise_std=0.37), gaussian_charge(contributions=cp.asarray(x),
                                                                              noise_std=0.37), rtol=F64_RTOL)


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: p.value)
def test_the_filter_decision_on_cupy_is_numpy_bit_for_bit(policy):
    # Additions, comparisons, divisions and square roots are correctly rounded on both, so the
    # decision and the state are exact, the row that fits only by rounding included.
    used, charge = cases.filter_inputs()
    expected = individual_filter(used, charge, cap=1.0, policy=policy)
    got = individual_filter(cp.asarray(used), cp.asarray(charge), cap=1.0, policy=policy)
    for field in ("new_used", "charge", "scale", "status"):
        assert _on_device(getattr(got, field)), field
        np.testing.assert_array_equal(to_host(getattr(got, field)), getattr(expected, field), err_msg=field)


def test_the_tracker_advance_on_cupy_matches_numpy():
    segment, bound, charge = cases.tracker_state()
    expected = tracker_update(segment, bound, charge, step=0.1)
    got = advance_trackers(cp.asarray(segment), cp.asarray(bound), cp.asarray(charge), step=0.1)
    checked = tracker_update(cp.asarray(segment), cp.asarray(bound), cp.asarray(charge), step=0.1)
    for e, g, c in zip(expected, got, checked):
        _close(e, g, rtol=F64_RTOL)
        _close(e, c, rtol=F64_RTOL)


def test_the_training_ledger_charge_on_cupy_matches_numpy_with_the_same_scales():
    expected, expected_scales = cases.charged_ledger(np, validate=True)
    got, scales = cases.charged_ledger(cp, validate=False)
    for e, g in zip(expected_scales, scales):
        _close(e, g, rtol=F64_RTOL)
    _close(expected.used, got.used, rtol=F64_RTOL)
    np.testing.assert_allclose(got.personal_odometer(), expected.personal_odometer(), rtol=F64_RTOL)


def test_the_training_ledger_check_refuses_a_nan_norm_on_cupy_before_any_charge():
    ledger = TrainingLedger.fresh(3, budget=1.0, xp=cp)
    with pytest.raises(ValueError, match="contributions must be finite norms >= 0"):
        ledger.charge(cp.asarray([0.5, np.nan, 0.1]), noise_std=2.0)
    assert to_host(ledger.used).tolist() == [0.0, 0.0, 0.0]


# --- the filtered DP-GD step ---------------------------------------------------------------------

N = cases.N


def _run(model, xp, **kwargs):
    result, ledger, _ = cases.training_run(model, xp, **kwargs)
    return result, ledger


@pytest.mark.parametrize("filtering", [False, True], ids=["algorithm-6", "algorithm-7"])
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_float64_private_gd_run_on_cupy_matches_numpy_with_the_same_decisions(model, filtering):
    stopping = AccuracyStopping(first_step=2, noise_std=40.0, every=2, queries=2) if filtering else None
    expected, expected_ledger = _run(model, np, filtering=filtering, stopping=stopping, chunk_rows=N)
    got, ledger = _run(model, cp, filtering=filtering, stopping=stopping)
    for k in expected.params:
        _close(expected.params[k], got.params[k], rtol=1e-9, atol=1e-12)
        _close(expected.final_params[k], got.final_params[k], rtol=1e-9, atol=1e-12)
    assert expected.curator == got.curator and expected.accuracy_queries == got.accuracy_queries
    _close(expected_ledger.used, ledger.used, rtol=1e-9)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_float32_private_gd_run_on_cupy_matches_numpy_float32_with_the_same_decisions(model):
    expected, _ = _run(model, np, filtering=True, dtype=np.float32, chunk_rows=N)
    got, _ = _run(model, cp, filtering=True, dtype=np.float32)
    for k in expected.params:
        scale = float(np.abs(expected.params[k]).max())
        _close(expected.params[k], got.params[k], rtol=0.0, atol=1e-4 * scale)
    assert expected.curator == got.curator


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_user_whose_gradient_overflows_is_dropped_uncharged_on_cupy_as_on_numpy(model):
    expected, expected_ledger = _run(model, np, filtering=True, chunk_rows=N, overflow=True)
    got, ledger = _run(model, cp, filtering=True, overflow=True)
    for k in expected.params:
        _close(expected.final_params[k], got.final_params[k], rtol=1e-9, atol=1e-12)
    assert expected.curator == got.curator and got.curator["not_finite"] == [1] * got.steps_run
    _close(expected_ledger.used, ledger.used, rtol=1e-9)
    assert to_host(ledger.used)[cases.OVERFLOW_ROW] == 0.0


def test_a_sliced_private_gd_run_on_cupy_matches_one_slice():
    whole, _ = _run(MLP(16), cp, filtering=True)
    sliced, _ = _run(MLP(16), cp, filtering=True, chunk_rows=70)
    for k in whole.params:
        _close(to_host(whole.params[k]), sliced.params[k], rtol=1e-9, atol=1e-12)
    assert whole.curator == sliced.curator


def test_the_noisy_count_on_cupy_is_numpy_s():
    counts = [private_count(TrainingLedger.fresh(40, budget=1.0, xp=xp), noise_std=3.0,
                            rng=np.random.default_rng(8)) for xp in (np, cp)]
    assert counts[0] == counts[1]


# --- the running-total kernels -------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [1, 13, 100])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_the_decode_on_cupy_matches_numpy(strategy, horizon):
    releases = cases.releases(strategy, horizon)
    _close(strategy.post_process(releases), strategy.post_process([cp.asarray(r) for r in releases]),
           rtol=1e-12, atol=1e-12)


def test_a_long_square_root_decode_on_cupy_matches_numpy_within_1e_12_relative():
    strategy = SquareRootFactorization()
    releases = cases.releases(strategy, 3000, tail=(2,))
    expected = strategy.post_process(releases)
    got = to_host(strategy.post_process([cp.asarray(r) for r in releases]))
    assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max()


def test_a_running_query_estimates_cupy_releases_as_numpy():
    query = RunningQuery(query_id="r", dim=2, start_window=0, noise_std=1.0, strategy=BinaryTree())
    releases = cases.releases(query.strategy, 20, tail=(2,))
    _close(query.estimates(releases), query.estimates([cp.asarray(r) for r in releases]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_the_encode_weights_on_cupy_match_numpy(strategy):
    for t in (0, 1, 6, 31):
        lags = np.arange(t + 1)
        _close(strategy.lag_weights(t, lags), strategy.lag_weights(t, cp.asarray(lags)), rtol=1e-14)
