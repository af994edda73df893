"""The device path without a device (issue 21, item 4): the kernels run on
``renyi_stream.stream.testing.strict_xp``, an array module that refuses implicit conversion to NumPy as CuPy
does and counts every explicit host transfer, and give NumPy's results bit for bit (one stated
exception: the long square-root decode, by the device's FFT).

What this cannot show (docs/gpu.md, "Tested without a GPU"): speed, and CUDA's own arithmetic (cuBLAS summation order,
atomic scatter-adds, fused multiply-adds).
"""

from __future__ import annotations


import device_cases as cases
import numpy as np
import pytest

from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.accounting.odometers import advance_trackers, tracker_update
from renyi_stream.stream.continual.running import RunningQuery
from renyi_stream.stream.continual.strategies import BinaryTree, SquareRootFactorization, WindowSums
from renyi_stream.stream.ledger import Ledger, Policy, individual_filter
from renyi_stream.stream.testing import strict_xp as sx
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.dpgd import prepare_data
from renyi_stream.stream.training.models import MLP, LogisticRegression
from renyi_stream.stream.training.normaliser import private_count
from renyi_stream.stream.training.stopping import AccuracyStopping
from renyi_stream.stream.xp import array_module, gpu_available, host_all, maybe_any, register_array_module, to_host

# The strict module, and CuPy where a CUDA device is present (tests/test_gpu_kernels.py has the rest).
DEVICE_MODULES = [sx] + ([__import__("cupy")] if gpu_available() else [])
STRATEGIES = [WindowSums(), SquareRootFactorization(), BinaryTree(), BinaryTree(height=2)]
MODELS = [LogisticRegression(), MLP(16)]


def _same_bits(expected: np.ndarray, got: sx.StrictArray) -> bool:
    """``got`` (a strict array) holds exactly ``expected``'s dtype, shape and bytes (NaNs and
    signed zeros included)."""
    host = got.get()
    return (host.dtype == expected.dtype and host.shape == expected.shape
            and np.ascontiguousarray(host).tobytes() == np.ascontiguousarray(expected).tobytes())


# --- the strict module itself --------------------------------------------------------------------


@pytest.mark.parametrize("convert", [np.asarray, np.array, lambda a: a.__array__(), lambda a: np.array([a, a])],
                         ids=["asarray", "array", "__array__", "array-of-arrays"])
def test_a_strict_array_refuses_implicit_conversion_to_numpy(convert):
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        convert(sx.asarray([1.0, 2.0]))


@pytest.mark.parametrize("convert", [float, int, bool, complex, lambda a: range(a)], ids=["float", "int", "bool",
                                                                                          "complex", "index"])
@pytest.mark.parametrize("shape", [(), (1,), (3,)], ids=["0-d", "1-element", "3-element"])
def test_a_strict_array_of_any_shape_refuses_to_become_a_python_scalar(convert, shape):
    with pytest.raises(TypeError, match="strict \\(device\\) array"):
        convert(sx.ones(shape))


@pytest.mark.parametrize("mix", [
    lambda a: a + np.ones(3),
    lambda a: np.ones(3) + a,
    lambda a: a.__iadd__(np.ones(3)),
    lambda a: sx.where(a > 0, a, np.zeros(3)),
    lambda a: sx.concatenate([a, np.ones(3)]),
    lambda a: a.__setitem__(slice(0, 3), np.ones(3)),
], ids=["add", "radd", "iadd", "where", "concatenate", "slice-assign"])
def test_a_strict_array_refuses_to_be_mixed_with_a_numpy_array(mix):
    with pytest.raises(TypeError):
        mix(sx.asarray([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("call", [np.sqrt, np.sum, lambda a: np.where(a > 0, a, 0.0), np.isfinite],
                         ids=["sqrt", "sum", "where", "isfinite"])
def test_numpy_functions_refuse_strict_arrays_so_kernels_stay_on_their_array_module(call):
    with pytest.raises(TypeError, match="use the array module"):
        call(sx.asarray([1.0, 2.0]))


def test_array_module_returns_the_strict_module_for_a_strict_array_and_numpy_for_numpy():
    a = sx.asarray([1.0])
    assert array_module(a) is sx and array_module(np.ones(1), a) is sx
    assert array_module(np.ones(1)) is np and array_module(1.0, [2.0]) is np
    assert sx.get_array_module(a) is sx and sx.get_array_module(np.ones(1)) is np


@pytest.mark.parametrize("array_type", [np.ndarray, np.float64, "strict"], ids=repr)
def test_registering_numpy_types_or_non_types_is_refused_naming_the_parameter(array_type):
    with pytest.raises(ValueError, match="array_type must be a class other than NumPy's"):
        register_array_module(array_type, sx)


def test_reductions_return_0_d_strict_arrays_as_cupy_does_never_host_scalars():
    a = sx.asarray([1.0, 2.0, 3.0])
    for value in (a.sum(), sx.sum(a), a[1], sx.max(a), sx.einsum("i,i->", a, a)):
        assert isinstance(value, sx.StrictArray) and value.ndim == 0


def test_explicit_transfers_are_counted_and_give_numpy_copies():
    a = sx.asarray([1.0, -2.0])
    with sx.host_traffic() as traffic:
        copies = [a.get(), sx.asnumpy(a), to_host(a)]
        assert host_all(a < 0) is False
    assert traffic.transfers == 4 and traffic.uploads == 0 and traffic.syncs == 0
    assert all(type(c) is np.ndarray and c.tolist() == [1.0, -2.0] for c in copies)
    copies[0][0] = 9.0
    assert a.get()[0] == 1.0  # a copy, not a view of the device data


def test_uploads_are_counted():
    with sx.host_traffic() as traffic:
        a = sx.asarray(np.arange(3.0))
        a[np.array([0, 2])] = np.array([5.0, 6.0])  # host index and values: CuPy copies both over
    assert traffic.uploads == 3 and traffic.transfers == 0
    assert a.get().tolist() == [5.0, 1.0, 6.0]


def test_boolean_mask_indexing_counts_as_a_sync():
    a = sx.arange(5.0)
    with sx.host_traffic() as traffic:
        a[a > 2] = 0.0
        a[a > 0].sum()
        sx.flatnonzero(a)
    assert traffic.syncs == 3 and traffic.transfers == 0


def test_maybe_any_answers_on_numpy_and_never_asks_a_device():
    assert maybe_any(np.zeros(3, dtype=bool)) is False and maybe_any(np.eye(2, dtype=bool)) is True
    with sx.host_traffic() as traffic:
        assert maybe_any(sx.zeros(3, dtype=bool)) is True  # unknown without a round trip: do the pass
    assert traffic.transfers == 0 and traffic.syncs == 0


def test_strict_arithmetic_gives_numpy_bits():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 4)), rng.standard_normal(4)
    a, b = sx.asarray(x), sx.asarray(y)
    c = sx.sqrt(sx.abs(a @ b)) / 3.0 - (a * b).sum(axis=1)
    c += 1.0
    assert _same_bits(np.sqrt(np.abs(x @ y)) / 3.0 - (x * y).sum(axis=1) + 1.0, c)


# --- the ledger's kernels ------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 7])
def test_the_gaussian_charge_on_the_device_path_is_numpy_bit_for_bit_with_no_host_traffic(d):
    x = cases.contributions(d)
    device = sx.asarray(x)
    with sx.host_traffic() as traffic:
        charge = gaussian_charge(contributions=device, noise_std=0.37)
    assert _same_bits(gaussian_charge(contributions=x, noise_std=0.37), charge)
    assert (traffic.transfers, traffic.syncs) == (0, 0)


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: p.value)
def test_the_filter_decision_on_the_device_path_is_numpy_bit_for_bit_with_no_host_traffic(policy):
    used, charge = cases.filter_inputs()
    expected = individual_filter(used, charge, cap=1.0, policy=policy)
    with sx.host_traffic() as traffic:
        got = individual_filter(sx.asarray(used), sx.asarray(charge), cap=1.0, policy=policy)
    for field in ("new_used", "charge", "scale", "status"):
        assert _same_bits(getattr(expected, field), getattr(got, field)), field
    assert (traffic.transfers, traffic.syncs) == (0, 0)


def test_the_tracker_advance_on_the_device_path_is_numpy_bit_for_bit_with_no_host_traffic():
    segment, bound, charge = cases.tracker_state()
    expected = tracker_update(segment, bound, charge, step=0.1)
    with sx.host_traffic() as traffic:
        got = advance_trackers(sx.asarray(segment), sx.asarray(bound), sx.asarray(charge), step=0.1)
    assert _same_bits(expected[0], got[0]) and _same_bits(expected[1], got[1])
    assert (traffic.transfers, traffic.syncs) == (0, 0)


def test_the_checked_tracker_update_makes_one_transfer_its_check():
    segment, bound, charge = cases.tracker_state()
    with sx.host_traffic() as traffic:
        tracker_update(sx.asarray(segment), sx.asarray(bound), sx.asarray(charge), step=0.1)
    assert (traffic.transfers, traffic.syncs) == (1, 0)


def test_the_checked_tracker_update_refuses_a_negative_charge_on_the_device_path():
    segment, bound, charge = cases.tracker_state()
    charge[5] = -1.0
    with pytest.raises(ValueError, match="charge must be finite and >= 0"):
        tracker_update(sx.asarray(segment), sx.asarray(bound), sx.asarray(charge), step=0.1)


def test_the_training_ledger_charge_on_the_device_path_is_numpy_bit_for_bit():
    expected, expected_scales = cases.charged_ledger(np, validate=True)
    got, scales = cases.charged_ledger(sx, validate=False)
    assert all(_same_bits(e, s) for e, s in zip(expected_scales, scales))
    assert _same_bits(expected.used, got.used)
    assert np.array_equal(expected.personal_odometer(), got.personal_odometer())


@pytest.mark.parametrize("validate, transfers", [(False, 0), (True, 1)])
def test_a_training_ledger_charge_moves_nothing_to_the_host_but_its_optional_check(validate, transfers):
    ledger = TrainingLedger.fresh(50, budget=1.0, xp=sx)
    norms = sx.asarray(np.linspace(0.0, 3.0, 50))
    with sx.host_traffic() as traffic:
        ledger.charge(norms, noise_std=2.0, validate=validate)
    assert (traffic.transfers, traffic.syncs) == (transfers, 0)


def test_the_training_ledger_check_refuses_a_nan_norm_on_the_device_path():
    ledger = TrainingLedger.fresh(3, budget=1.0, xp=sx)
    with pytest.raises(ValueError, match="contributions must be finite norms >= 0"):
        ledger.charge(sx.asarray([0.5, np.nan, 0.1]), noise_std=2.0)
    assert ledger.used.get().tolist() == [0.0, 0.0, 0.0]  # checked before any charge


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: p.value)
@pytest.mark.parametrize("xp", [np, *DEVICE_MODULES], ids=lambda m: m.__name__)
def test_an_unchecked_nan_or_infinite_norm_is_dropped_and_charged_nothing(xp, policy):
    ledger = TrainingLedger.fresh(3, budget=1.0, xp=xp)
    scale = ledger.charge(xp.asarray([0.5, np.nan, np.inf]), noise_std=2.0, policy=policy, validate=False)
    assert to_host(scale).tolist() == [1.0, 0.0, 0.0]
    used = to_host(ledger.used)
    assert used[0] > 0 and used[1:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("device", DEVICE_MODULES, ids=lambda m: m.__name__)
def test_a_ledger_read_into_device_arrays_merges_back_as_on_numpy(device):
    ledger = Ledger(budget=1.0)
    ledger.admit(np.arange(5), np.ones((5, 2)), noise_std=3.0)
    views = [TrainingLedger.from_ledger(ledger, np.arange(2, 9), xp=xp) for xp in (np, device)]
    for view in views:
        view.charge(view.used * 0.0 + 1.5, noise_std=2.0)
    assert views[0].merged_ledger().to_arrow().equals(views[1].merged_ledger().to_arrow())


# --- the filtered DP-GD step ---------------------------------------------------------------------

N, D, K = cases.N, cases.D, cases.K


def _run(model, xp, **kwargs):
    """``cases.training_run`` with the run's host traffic counted."""
    return cases.training_run(model, xp, observe=sx.host_traffic, **kwargs)


@pytest.mark.parametrize("filtering", [False, True], ids=["algorithm-6", "algorithm-7"])
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_private_gd_run_on_the_device_path_is_numpy_bit_for_bit(model, filtering):
    stopping = AccuracyStopping(first_step=2, noise_std=40.0, every=2, queries=2) if filtering else None
    expected, expected_ledger, _ = _run(model, np, filtering=filtering, stopping=stopping, chunk_rows=N)
    got, ledger, _ = _run(model, sx, filtering=filtering, stopping=stopping)  # a device's default: one slice
    assert all(_same_bits(expected.params[k], got.params[k]) for k in expected.params)
    assert all(_same_bits(expected.final_params[k], got.final_params[k]) for k in expected.params)
    assert expected.curator == got.curator and expected.accuracy_queries == got.accuracy_queries
    assert _same_bits(expected_ledger.used, ledger.used)


def test_a_sliced_private_gd_run_on_the_device_path_is_numpy_bit_for_bit():
    expected, _, _ = _run(MLP(16), np, filtering=True, chunk_rows=70)
    got, _, _ = _run(MLP(16), sx, filtering=True, chunk_rows=70)
    assert all(_same_bits(expected.params[k], got.params[k]) for k in expected.params)
    assert expected.curator == got.curator


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_gradient_step_moves_nothing_to_the_host_and_uploads_only_its_noise(model):
    _, _, short = _run(model, sx, filtering=True, steps=3)
    _, _, long = _run(model, sx, filtering=True, steps=6)
    n_params = 2 if isinstance(model, LogisticRegression) else 4
    assert short.transfers == long.transfers == 1  # the curator counts, read once after the run
    assert long.uploads - short.uploads == 3 * n_params  # three more steps: one noise array per parameter
    assert short.syncs == long.syncs == 0


def test_an_accuracy_query_makes_two_transfers_its_check_and_its_released_count():
    stopping = AccuracyStopping(first_step=1, noise_std=40.0, every=1, queries=3)
    _, _, traffic = _run(LogisticRegression(), sx, filtering=True, stopping=stopping)
    assert traffic.transfers == 1 + 3 * 2 and traffic.syncs == 0


@pytest.mark.parametrize("xp", [np, sx], ids=["numpy", "strict"])
def test_a_diverged_run_charges_nothing_for_nan_norms_and_raises_after_the_run(xp):
    params = {"W": xp.full((D, K), np.nan), "b": xp.zeros(K)}  # a model that has diverged
    ledger = TrainingLedger.fresh(N, budget=1.0, xp=xp)
    with pytest.raises(ValueError, match="the run diverged: per-example gradient norms were NaN at 6 step\\(s\\), "
                                         "first at step 1"):
        _run(LogisticRegression(), xp, filtering=True, steps=4, init_params=params, ledger=ledger)
    assert to_host(ledger.used).max() == 0.0


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_user_whose_gradient_overflows_is_dropped_uncharged_on_the_device_path_numpy_bit_for_bit(model):
    # The row is masked out of the sums with where (never multiplied by a zero weight), on both
    # modules by the same code: NumPy's bits, no host round trip more than a run without it.
    expected, expected_ledger, _ = _run(model, np, filtering=True, chunk_rows=N, overflow=True)
    got, ledger, traffic = _run(model, sx, filtering=True, overflow=True)
    assert all(_same_bits(expected.final_params[k], got.final_params[k]) for k in expected.params)
    assert expected.curator == got.curator and got.curator["not_finite"] == [1] * got.steps_run
    assert all(np.isfinite(to_host(p)).all() for p in got.final_params.values())
    assert _same_bits(expected_ledger.used, ledger.used) and to_host(ledger.used)[cases.OVERFLOW_ROW] == 0.0
    assert traffic.transfers == 1 and traffic.syncs == 0


def test_the_noisy_count_on_the_device_path_is_numpy_with_two_transfers():
    counts = []
    for xp in (np, sx):
        ledger = TrainingLedger.fresh(40, budget=1.0, xp=xp)
        with sx.host_traffic() as traffic:
            counts.append(private_count(ledger, noise_std=3.0, rng=np.random.default_rng(8)))
    assert counts[0] == counts[1] and traffic.transfers == 2


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_per_example_norms_and_weighted_sums_on_the_device_path_are_numpy_bit_for_bit(model):
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((50, D)), rng.integers(0, K, 50)
    w = rng.uniform(0.0, 1.0, 50)
    out = []
    for xp in (np, sx):
        data = prepare_data(x, y, n_classes=K, xp=xp)
        params = model.init_params(D, K, np.random.default_rng(10), xp, np.float64)
        params = {k: v + xp.asarray(np.random.default_rng(11).normal(scale=0.3, size=v.shape)) for k, v in params.items()}
        pe = model.per_example(params, data.x, data.onehot_t, data.x_sq_norms)
        out.append((pe.sq_norms, pe.weighted_sum(xp.asarray(w))))
    (norms, sums), (strict_norms, strict_sums) = out
    assert _same_bits(norms, strict_norms) and all(_same_bits(sums[k], strict_sums[k]) for k in sums)


# --- the running-total kernels -------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [1, 13, 100])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_the_decode_on_the_device_path_is_numpy_bit_for_bit_with_one_transfer(strategy, horizon):
    releases = cases.releases(strategy, horizon)
    device = [sx.asarray(r) for r in releases]
    with sx.host_traffic() as traffic:
        estimates = strategy.post_process(device)
    assert _same_bits(strategy.post_process(releases), estimates)
    assert (traffic.transfers, traffic.syncs) == (1, 0)  # the finiteness check of the releases


def test_a_long_square_root_decode_on_the_device_path_matches_numpy_within_1e_12_relative():
    strategy = SquareRootFactorization()
    releases = cases.releases(strategy, 3000, tail=(2,))
    expected = strategy.post_process(releases)
    got = strategy.post_process([sx.asarray(r) for r in releases]).get()  # the device's FFT, not scipy's
    assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max()


def test_a_running_query_estimates_device_releases_as_numpy():
    query = RunningQuery(query_id="r", dim=2, start_window=0, noise_std=1.0, strategy=BinaryTree())
    releases = cases.releases(query.strategy, 20, tail=(2,))
    assert _same_bits(query.estimates(releases), query.estimates([sx.asarray(r) for r in releases]))


@pytest.mark.parametrize("device", DEVICE_MODULES, ids=lambda m: m.__name__)
def test_a_non_finite_device_release_is_refused_naming_its_window(device):
    releases = [device.asarray(r) for r in cases.releases(WindowSums(), 5)]
    releases[3][0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="releases must be finite, got a NaN/inf at window 3"):
        WindowSums().post_process(releases)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_the_encode_weights_on_the_device_path_are_numpy_bit_for_bit_with_no_transfer(strategy):
    for t in (0, 1, 6, 31):
        lags = np.arange(t + 1)
        with sx.host_traffic() as traffic:
            weights = strategy._lag_weights(t, sx.asarray(lags))
        assert _same_bits(strategy.lag_weights(t, lags), weights)
        assert (traffic.transfers, traffic.syncs) == (0, 0)


def test_the_checked_encode_weights_make_one_transfer_their_range_check():
    with sx.host_traffic() as traffic:
        SquareRootFactorization().lag_weights(4, sx.arange(5))
    assert (traffic.transfers, traffic.syncs) == (1, 0)


def test_the_checked_encode_weights_refuse_a_lag_past_t_on_the_device_path():
    with pytest.raises(ValueError, match="lags must be in \\[0, t=3\\], got range \\[0, 4\\]"):
        SquareRootFactorization().lag_weights(3, sx.arange(5))


@pytest.mark.parametrize("reduce, numpy_form", [
    ("row_sq_sums", lambda a: np.einsum("ij,ij->i", a, a)),
    ("col_sq_sums", lambda a: np.einsum("ij,ij->j", a, a)),
    ("column_sums", lambda a: a.sum(axis=0)),
])
def test_the_reductions_with_a_cupy_form_keep_numpy_s_form_and_bits_off_cupy(reduce, numpy_form):
    import renyi_stream.stream.xp as sxp

    a = np.random.default_rng(14).standard_normal((50, 6)).astype(np.float32)
    assert _same_bits(numpy_form(a), getattr(sxp, reduce)(sx.asarray(a)))
    assert np.ascontiguousarray(getattr(sxp, reduce)(a)).tobytes() == np.ascontiguousarray(numpy_form(a)).tobytes()
