"""Running totals (issue 9): factorisations against dense references, the individual charge of
the query at each window, filtering, keyed reproducibility, crash recovery and the declared
noise std of the running-total estimates."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from renyi_stream.stream.continual import (
    BinaryTree,
    RunningQuery,
    RunningState,
    SquareRootFactorization,
    WindowSums,
    sqrt_coefficients,
    strategy_by_name,
    strategy_from_spec,
    tree_node_variance,
)
from renyi_stream.stream.ledger import ADMITTED, CLIPPED, DROPPED, Ledger
from renyi_stream.stream.noise import InsecureNoiseWarning, NoiseBinding, NoiseKey

# False alarms: every statistical test uses a fixed key, so it is deterministic; each check
# rejects at p < P_FLOOR = 1e-3, so a correct implementation fails it for at most a fraction
# 1e-3 of keys per check (the union bound over a test's checks is stated at each test).
P_FLOOR = 1e-3

STRATEGIES = [WindowSums(), SquareRootFactorization(), BinaryTree(), BinaryTree(height=2), BinaryTree(height=0)]
# The charge equals the squared norm when 2 s^2 = 1.
UNIT_CHARGE_STD = 1.0 / math.sqrt(2.0)


def _prefix(horizon: int) -> np.ndarray:
    return np.tril(np.ones((horizon, horizon)))


LEDGER = "0123456789abcdef0123456789abcdef"


def _key(seed: int, ledger_id: str = LEDGER) -> NoiseBinding:
    """The insecure test key of ``seed``, bound to the ledger ``ledger_id``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        return NoiseBinding(NoiseKey.insecure_for_tests(seed), ledger_id)


def _run(query: RunningQuery, windows: list[tuple[np.ndarray, np.ndarray]], *, key: NoiseBinding, budget: float,
         policy: str = "drop", state: RunningState | None = None, ledger: Ledger | None = None,
         first: int = 0) -> tuple[list[np.ndarray], RunningState, Ledger]:
    """Release windows ``first..`` of ``windows`` (a list of (ids, rows) per window) end to end."""
    state = query.new_state() if state is None else state
    ledger = Ledger(budget=budget) if ledger is None else ledger  # an empty Ledger is falsy
    releases = []
    for t in range(first, len(windows)):
        ids, rows = windows[t]
        window_id = query.start_window + t
        step = state.step(ids, rows, window_id=window_id, ledger=ledger, noise_std=query.noise_std, policy=policy)
        releases.append(query.noisy_release(step.total, binding=key, window_id=window_id))
    return releases, state, ledger


def _random_windows(rng: np.random.Generator, users: int, horizon: int, dim: int, rate: float = 0.3):
    windows = []
    for _ in range(horizon):
        active = np.flatnonzero(rng.random(users) < rate).astype(np.int64)
        windows.append((active, rng.integers(0, 3, size=(active.size, dim)).astype(np.float64)))
    return windows


# --- the factorisations ------------------------------------------------------------------------


def test_sqrt_coefficients_match_the_closed_form_binomial():
    c = sqrt_coefficients(600)
    exact = np.array([float(Fraction(math.comb(2 * k, k), 4**k)) for k in range(600)])
    assert np.allclose(c, exact, rtol=1e-13, atol=0.0)
    assert c[:5].tolist() == [1.0, 0.5, 0.375, 0.3125, 0.2734375]


def test_sqrt_coefficients_are_read_only():
    with pytest.raises(ValueError):
        sqrt_coefficients(4)[0] = 2.0


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
@pytest.mark.parametrize("horizon", [1, 2, 7, 64, 365, 512])
def test_b_times_c_is_the_prefix_sum_matrix(strategy, horizon):
    c = strategy.query_matrix(horizon)
    b = strategy.reconstruction_matrix(horizon)
    assert c.shape == (strategy.row_times(horizon).size, horizon)
    assert b.shape == (horizon, c.shape[0])
    assert np.abs(b @ c - _prefix(horizon)).max() < 1e-9


def test_the_square_root_factor_is_toeplitz_lower_triangular_and_squares_to_a():
    horizon = 512
    c = SquareRootFactorization().query_matrix(horizon)
    coefficients = sqrt_coefficients(horizon)
    lag = np.subtract.outer(np.arange(horizon), np.arange(horizon))
    assert np.array_equal(c, np.where(lag >= 0, coefficients[np.maximum(lag, 0)], 0.0))
    assert np.abs(c @ c - _prefix(horizon)).max() < 1e-9
    assert np.allclose(SquareRootFactorization().reconstruction_matrix(horizon), c, rtol=0, atol=1e-12)


def _causal_least_squares(strategy, horizon: int) -> np.ndarray:
    """Reference B: row t is the BLUE of sum_{s<=t} x_s from the rows released by t."""
    c = strategy.query_matrix(horizon)
    times = strategy.row_times(horizon)
    b = np.zeros((horizon, c.shape[0]))
    for t in range(horizon):
        rows = np.flatnonzero(times <= t)
        ct = c[rows][:, : t + 1]
        b[t, rows] = ct @ np.linalg.solve(ct.T @ ct, np.ones(t + 1))
    return b


@pytest.mark.parametrize("strategy", [BinaryTree(), BinaryTree(height=2)], ids=repr)
@pytest.mark.parametrize("horizon", [1, 13, 64])
def test_tree_post_processing_is_the_causal_least_squares_estimate(strategy, horizon):
    assert np.abs(strategy.reconstruction_matrix(horizon) - _causal_least_squares(strategy, horizon)).max() < 1e-10


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_declared_estimate_variance_is_the_squared_row_norm_of_b(strategy):
    b = strategy.reconstruction_matrix(300)
    assert np.allclose(strategy.estimate_variance(300), (b**2).sum(axis=1), rtol=1e-12, atol=0.0)


def test_the_declared_variances_follow_their_asymptotics():
    t = np.arange(1, 4096)
    sqrt_var = SquareRootFactorization().estimate_variance(4096)[1:]
    assert sqrt_var[363] == pytest.approx(2.944, abs=5e-4)  # t + 1 = 365
    assert np.allclose(sqrt_var[1000:], (np.log(t[1000:]) + np.euler_gamma + 4 * math.log(2)) / math.pi, atol=5e-4)
    tree_var = BinaryTree().estimate_variance(4096)
    assert (tree_var <= np.log2(np.arange(1, 4097)) / 2 + 1 + 1e-12).all()


def test_tree_node_variance_follows_the_bottom_up_recursion():
    v = 1.0
    for level in range(1, 12):
        v = 1.0 / (1.0 + 1.0 / (2.0 * v))
        assert tree_node_variance(level) == pytest.approx(v, rel=1e-14)
    assert tree_node_variance(0) == 1.0


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_worst_case_sq_norm_is_the_norm_of_c_times_ones(strategy):
    c = strategy.query_matrix(365)
    assert strategy.worst_case_sq_norm(365) == pytest.approx(float(np.sum((c @ np.ones(365)) ** 2)), rel=1e-12)


def test_a_user_present_every_window_costs_about_85000_under_sqrt_and_365_under_window_sums():
    assert SquareRootFactorization().worst_case_sq_norm(365) == pytest.approx(84_930, abs=1)
    assert SquareRootFactorization().worst_case_sq_norm(365) == pytest.approx(2 * 365**2 / math.pi, rel=2e-3)
    assert WindowSums().worst_case_sq_norm(365) == 365.0


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_the_estimate_at_t_depends_only_on_releases_up_to_t(strategy):
    rng = np.random.default_rng(3)
    releases = [rng.standard_normal((strategy.rows_at(t), 2)) for t in range(40)]
    full = strategy.post_process(releases)
    assert full.shape == (40, 2)
    for t in (0, 7, 22):
        assert np.allclose(strategy.post_process(releases[: t + 1]), full[: t + 1], rtol=0, atol=1e-9)


def test_long_sqrt_streams_post_process_by_fft_like_the_dense_product():
    strategy = SquareRootFactorization()
    rng = np.random.default_rng(4)
    y = rng.standard_normal((3000, 1, 2))
    fast = strategy.post_process(list(y))
    dense = strategy.post_process(list(y[:2048]))
    assert np.allclose(fast[:2048], dense, rtol=0, atol=1e-8)


def test_tree_releases_one_row_per_completed_level():
    tree = BinaryTree()
    assert [tree.rows_at(t) for t in range(8)] == [1, 2, 1, 3, 1, 2, 1, 4]
    assert [BinaryTree(height=1).rows_at(t) for t in range(8)] == [1, 2, 1, 2, 1, 2, 1, 2]
    assert tree.lag_weights(3, np.arange(4)).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]


def test_strategies_round_trip_through_their_spec():
    for strategy in STRATEGIES:
        assert strategy_from_spec(strategy.spec()) == strategy
    assert strategy_by_name("sqrt") == SquareRootFactorization()


@pytest.mark.parametrize("call, message", [
    (lambda: BinaryTree(height=-1), "height must be None or an integer in \\[0, 62\\], got height=-1"),
    (lambda: strategy_from_spec({"name": "laplace"}), "strategy name must be one of"),
    (lambda: strategy_from_spec({"name": "tree", "depth": 2}), "unknown parameters"),
    (lambda: SquareRootFactorization().lag_weights(3, np.array([4])), "lags must be in \\[0, t=3\\]"),
    (lambda: SquareRootFactorization().query_matrix(0), "horizon must be an integer >= 1, got horizon=0"),
    (lambda: SquareRootFactorization().estimate_std(5, noise_std=0.0), "noise_std must be > 0"),
    (lambda: BinaryTree().post_process([np.zeros((1, 1)), np.zeros((1, 1))]), "releases\\[1\\] must have 2 row"),
    (lambda: WindowSums().post_process([]), "releases must be a non-empty sequence"),
])
def test_invalid_strategy_arguments_are_refused_with_the_parameter_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- the individual charge ---------------------------------------------------------------------


def test_the_sqrt_charge_is_c_x_squared_on_admitted_windows_by_hand():
    # One user, T = 8, history x = [1, 0, 0, 1, 0, 0, 0, 0], budget 2.2, 2 s^2 = 1 so the
    # charge is ||q_t||^2. c = [1, 1/2, 3/8, 5/16, 35/128, 63/256, 231/1024, 429/2048].
    #   t  q_t = (C x)_t        q_t^2        used after      decision
    #   0  1                    1            1               admitted
    #   1  1/2                  1/4          1.25            admitted
    #   2  3/8                  9/64         1.390625        admitted
    #   3  5/16 + 1 = 21/16     441/256      (3.11 > 2.2)    dropped
    #   4  35/128 + 1/2 = 99/128 9801/16384  1.98883...      admitted (x_3 still counts)
    #   5  63/256 + 3/8 = 159/256 0.3858    (2.37 > 2.2)    dropped
    #   6  231/1024 + 5/16 = 551/1024       (2.28 > 2.2)    dropped
    #   7  429/2048 + 35/128 = 989/2048     (2.22 > 2.2)    dropped
    q = [Fraction(1), Fraction(1, 2), Fraction(3, 8), Fraction(21, 16), Fraction(99, 128),
         Fraction(159, 256), Fraction(551, 1024), Fraction(989, 2048)]
    expected_status = [ADMITTED, ADMITTED, ADMITTED, DROPPED, ADMITTED, DROPPED, DROPPED, DROPPED]
    history = [1, 0, 0, 1, 0, 0, 0, 0]
    state = RunningState(strategy=SquareRootFactorization(), dim=1, start_window=100)
    ledger = Ledger(budget=2.2)
    for t, x in enumerate(history):
        ids = np.array([7] * x, dtype=np.int64)
        step = state.step(ids, np.ones((x, 1)), window_id=100 + t, ledger=ledger, noise_std=UNIT_CHARGE_STD)
        assert step.user_ids.tolist() == [7]
        assert step.status.tolist() == [expected_status[t]]
        admitted = expected_status[t] == ADMITTED
        assert step.total[0, 0] == pytest.approx(float(q[t]) if admitted else 0.0, rel=1e-14)
        assert step.charge[0] == pytest.approx(float(q[t] ** 2) if admitted else 0.0, rel=1e-11)
    expected = sum(float(q[t] ** 2) for t in range(8) if expected_status[t] == ADMITTED)
    assert expected == pytest.approx(1 + 1 / 4 + 9 / 64 + 9801 / 16384)
    assert ledger.used([7])[0] == pytest.approx(expected, rel=1e-11)


def test_the_tree_charge_is_the_completed_node_sums_squared_by_hand():
    # x = [1, 1, 0, 1, 0, 0, 1, 1]; nodes completing at t (levels 0, 1, ...):
    #   t0: [1] -> 1     t1: [1, 2] -> 5    t2: [0] -> 0 (not queried)   t3: [1, 1, 3] -> 11
    #   t4: [0]          t5: [0, 0]         t6: [1] -> 1                 t7: [1, 2, 2, 5] -> 34
    # budget 20: used 1, 6, 17, 18, then 18 + 34 > 20: dropped at t7.
    history = [1, 1, 0, 1, 0, 0, 1, 1]
    expected_q = {0: [1], 1: [1, 2], 3: [1, 1, 3], 6: [1], 7: [1, 2, 2, 5]}
    state = RunningState(strategy=BinaryTree(), dim=1, start_window=0)
    ledger = Ledger(budget=20.0)
    for t, x in enumerate(history):
        ids = np.array([3] * x, dtype=np.int64)
        step = state.step(ids, np.ones((x, 1)), window_id=t, ledger=ledger, noise_std=UNIT_CHARGE_STD)
        if t not in expected_q:
            assert len(step.user_ids) == 0
            continue
        if t == 7:
            assert step.status.tolist() == [DROPPED] and not step.total.any()
        else:
            assert step.total[:, 0].tolist() == expected_q[t]
            assert step.charge[0] == pytest.approx(sum(v * v for v in expected_q[t]), rel=1e-11)
    assert ledger.used([3])[0] == pytest.approx(18.0, rel=1e-11)


def test_a_dropped_window_stays_in_the_users_history():
    # The user is dropped at t = 1 (huge contribution); at t = 2 their query still includes it.
    state = RunningState(strategy=SquareRootFactorization(), dim=1, start_window=0)
    ledger = Ledger(budget=1.0)
    state.step([5], [[0.5]], window_id=0, ledger=ledger, noise_std=UNIT_CHARGE_STD)
    step = state.step([5], [[10.0]], window_id=1, ledger=ledger, noise_std=UNIT_CHARGE_STD)
    assert step.status.tolist() == [DROPPED]
    queries = state.queries_at([], np.zeros((0, 1)), window_id=2)
    assert queries.vectors[:, 0].tolist() == [pytest.approx(0.375 * 0.5 + 0.5 * 10.0)]
    assert state.to_arrow().column("values").to_pylist() == [[0.5], [10.0]]


def test_window_sums_through_the_running_state_charge_exactly_like_the_ledger():
    rng = np.random.default_rng(11)
    windows = _random_windows(rng, users=30, horizon=12, dim=2)
    state = RunningState(strategy=WindowSums(), dim=2, start_window=0)
    ours, plain = Ledger(budget=3.0), Ledger(budget=3.0)
    for t, (ids, rows) in enumerate(windows):
        step = state.step(ids, rows, window_id=t, ledger=ours, noise_std=1.0, policy="clip")
        nonzero = (rows != 0).any(axis=1)
        reference = plain.admit(ids[nonzero], rows[nonzero], noise_std=1.0, policy="clip")
        assert np.array_equal(step.total[0], reference.contributions.sum(axis=0))
    assert state.n_entries == 0  # window sums keep no history
    assert np.array_equal(ours.used(np.arange(30)), plain.used(np.arange(30)))


def test_history_older_than_the_strategys_max_lag_is_forgotten():
    state = RunningState(strategy=BinaryTree(height=2), dim=1, start_window=0)
    ledger = Ledger(budget=1e6)
    for t in range(10):
        state.step([1], [[1.0]], window_id=t, ledger=ledger, noise_std=1.0)
    assert state.to_arrow().column("window_id").to_pylist() == [7, 8, 9]  # lags <= 3 at t = 10


# --- filtering ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    strategy=st.sampled_from(STRATEGIES[:4]),
    policy=st.sampled_from(["drop", "clip"]),
    horizon=st.integers(2, 20),
    dim=st.integers(1, 2),
    fraction=st.floats(0.05, 0.9),
    seed=st.integers(0, 2**31 - 1),
)
def test_heavy_users_are_filtered_and_nobody_exceeds_the_budget(strategy, policy, horizon, dim, fraction, seed):
    rng = np.random.default_rng(seed)
    users = 6
    heavy = 0  # user 0 contributes ones every window
    history = rng.integers(0, 2, size=(users, horizon, dim)).astype(np.float64) * rng.random((users, horizon, 1))
    history[heavy] = 1.0
    noise_std = 1.3
    c = strategy.query_matrix(horizon)
    times = strategy.row_times(horizon)
    heavy_total = float(np.sum((c @ history[heavy]) ** 2)) / (2 * noise_std**2)
    budget = fraction * heavy_total  # the heavy user cannot fit
    state = RunningState(strategy=strategy, dim=dim, start_window=0)
    ledger = Ledger(budget=budget)
    charged = np.zeros(users)
    filtered = np.zeros(users, dtype=bool)
    for t in range(horizon):
        rows = history[:, t]
        ids = np.flatnonzero((rows != 0).any(axis=1)).astype(np.int64)
        step = state.step(ids, rows[ids], window_id=t, ledger=ledger, noise_std=noise_std, policy=policy)
        q = np.einsum("rs,usd->urd", c[times == t], history).reshape(users, -1)  # dense reference
        for uid, vec, status, charge in zip(step.user_ids, step.contributions, step.status, step.charge):
            if status == ADMITTED:
                assert np.allclose(vec, q[uid], rtol=1e-12, atol=1e-12)
            elif status == CLIPPED:
                assert policy == "clip"
                factor = np.linalg.norm(vec) / np.linalg.norm(q[uid])
                assert 0 < factor < 1 and np.allclose(vec, factor * q[uid], rtol=1e-9, atol=1e-12)
            else:
                assert not vec.any() and charge == 0.0
            # the true charge of what was released never exceeds what the ledger recorded
            assert float(vec @ vec) / (2 * noise_std**2) <= charge * (1 + 1e-9) + 1e-300
            charged[uid] += charge
            filtered[uid] |= status != ADMITTED
        others = np.setdiff1d(np.flatnonzero((q != 0).any(axis=1)), step.user_ids)
        assert others.size == 0  # every user with a non-zero query was queried
    used = ledger.used(np.arange(users))
    assert (used <= budget).all()
    assert (charged <= budget).all()
    assert np.allclose(used, charged, rtol=1e-9, atol=0.0)
    assert filtered[heavy]


# --- releases: reproducibility, recovery, the public schedule, the declared std -----------------


def test_the_same_key_releases_identical_running_totals_and_another_key_does_not():
    rng = np.random.default_rng(5)
    windows = _random_windows(rng, users=40, horizon=30, dim=2)
    query = RunningQuery(query_id="running:churn", dim=2, start_window=20000, noise_std=2.0)
    first, _, _ = _run(query, windows, key=_key(1), budget=5.0)
    second, _, _ = _run(query, windows, key=_key(1), budget=5.0)
    other, _, _ = _run(query, windows, key=_key(2), budget=5.0)
    assert np.array_equal(query.estimates(first), query.estimates(second))
    assert not np.array_equal(query.estimates(first), query.estimates(other))


def test_another_ledger_under_the_same_key_releases_running_totals_with_other_noise():
    # Two ledgers sharing a key file: the difference of their releases must keep the noise.
    rng = np.random.default_rng(5)
    windows = _random_windows(rng, users=40, horizon=30, dim=2)
    query = RunningQuery(query_id="running:churn", dim=2, start_window=20000, noise_std=2.0)
    first, _, _ = _run(query, windows, key=_key(1), budget=5.0)
    other, _, _ = _run(query, windows, key=_key(1, "fedcba9876543210fedcba9876543210"), budget=5.0)
    difference = np.concatenate([a - b for a, b in zip(first, other)]).ravel()
    assert np.all(difference != 0.0)
    assert np.std(difference) > query.noise_std  # both noises kept: std 2 sqrt(2), not 0


@pytest.mark.parametrize("strategy", [SquareRootFactorization(), BinaryTree(), BinaryTree(height=3)], ids=repr)
@pytest.mark.parametrize("id_type", ["int64", "string"])
def test_recovery_from_snapshots_gives_the_identical_running_totals(strategy, id_type):
    rng = np.random.default_rng(6)
    windows = _random_windows(rng, users=40, horizon=30, dim=2)
    if id_type == "string":
        windows = [(np.array([f"user-{i}" for i in ids], dtype=object), rows) for ids, rows in windows]
    query = RunningQuery(query_id="running:q", dim=2, start_window=7, noise_std=1.5, strategy=strategy)
    key = _key(3)
    straight, _, final_ledger = _run(query, windows, key=key, budget=4.0,
                                     state=query.new_state(id_type=id_type), ledger=Ledger(budget=4.0, id_type=id_type))
    # Crash after window 12: restore both snapshots and re-run the rest.
    head, state, ledger = _run(query, windows[:13], key=key, budget=4.0,
                               state=query.new_state(id_type=id_type), ledger=Ledger(budget=4.0, id_type=id_type))
    restored_state = RunningState.from_arrow(state.to_arrow())
    restored_ledger = Ledger.from_arrow(ledger.to_arrow())
    assert restored_state.next_window == 7 + 13
    tail, _, recovered_ledger = _run(query, windows, key=key, budget=4.0, state=restored_state,
                                     ledger=restored_ledger, first=13)
    assert all(np.array_equal(a, b) for a, b in zip(straight, head + tail))
    assert np.array_equal(query.estimates(straight), query.estimates(head + tail))
    assert recovered_ledger.to_arrow().equals(final_ledger.to_arrow())


def test_a_processed_window_is_never_charged_again():
    state = RunningState(strategy=SquareRootFactorization(), dim=1, start_window=10)
    ledger = Ledger(budget=10.0)
    state.step([1], [[1.0]], window_id=10, ledger=ledger, noise_std=1.0)
    used = ledger.used([1]).copy()
    for window in (10, 9, 12):
        expected = f"window_id must be the next unprocessed window 11.*got window_id={window}"
        with pytest.raises(ValueError, match=expected):
            state.step([1], [[1.0]], window_id=window, ledger=ledger, noise_std=1.0)
    assert np.array_equal(ledger.used([1]), used)


def test_stale_queries_cannot_be_committed_twice():
    state = RunningState(strategy=SquareRootFactorization(), dim=1, start_window=0)
    queries = state.queries_at([1], [[1.0]], window_id=0)
    state.commit(queries)
    with pytest.raises(ValueError, match="queries are stale"):
        state.commit(queries)


def test_every_window_of_the_schedule_gets_a_release_even_without_rows():
    query = RunningQuery(query_id="running:q", dim=1, start_window=0, noise_std=1.0, strategy=BinaryTree())
    empty = (np.zeros(0, dtype=np.int64), np.zeros((0, 1)))
    windows = [(np.array([4], dtype=np.int64), np.ones((1, 1)))] + [empty] * 15
    releases, _, ledger = _run(query, windows, key=_key(4), budget=100.0)
    assert [r.shape for r in releases] == [(BinaryTree().rows_at(t), 1) for t in range(16)]
    # The user's day-0 row enters the nodes [0,1], [0,3], [0,7], [0,15] completing on empty days.
    assert ledger.used([4])[0] == pytest.approx(5 / (2 * 1.0**2), rel=1e-11)
    assert query.estimates(releases).shape == (16, 1)


@pytest.mark.parametrize("strategy", [SquareRootFactorization(), BinaryTree()], ids=repr)
def test_the_declared_std_matches_the_spread_of_released_running_totals_on_zero_data(strategy):
    # All-zero data: every release is pure keyed noise through the whole path (state, ledger,
    # keyed noise, post-processing). 400 independent query ids x 64 windows. Five checks, each
    # at p >= 1e-3 (false alarm <= 5e-3 per strategy, union bound): a KS test of the
    # standardised estimate at four windows, and a chi-square test of the whitened vector of
    # all 64 estimates (cov s^2 B B^T) summed over the repetitions (400 * 64 dof).
    horizon, reps, noise_std = 64, 400, 3.0
    key = _key(8)
    b = strategy.reconstruction_matrix(horizon)
    cov = noise_std**2 * b @ b.T
    declared = strategy.estimate_std(horizon, noise_std=noise_std)
    assert np.allclose(declared**2, np.diag(cov), rtol=1e-12)
    zeros = [(np.array([1, 2], dtype=np.int64), np.zeros((2, 1)))] * horizon
    estimates = np.empty((reps, horizon))
    for r in range(reps):
        query = RunningQuery(query_id=f"running:zero:{r}", dim=1, start_window=50, noise_std=noise_std,
                             strategy=strategy)
        releases, _, _ = _run(query, zeros, key=key, budget=1.0)
        estimates[r] = query.estimates(releases)[:, 0]
    assert query.estimate_std(50 + 63) == pytest.approx(declared[63])
    for t in (0, 9, 31, 63):
        assert stats.kstest(estimates[:, t] / declared[t], "norm").pvalue >= P_FLOOR
    whitened = np.linalg.solve(np.linalg.cholesky(cov), estimates.T)
    chi2 = float(np.sum(whitened**2))
    dof = reps * horizon
    p_two_sided = 2 * min(stats.chi2.cdf(chi2, dof), stats.chi2.sf(chi2, dof))
    assert p_two_sided >= P_FLOOR


def test_noisy_release_checks_the_shape_of_the_total():
    query = RunningQuery(query_id="running:q", dim=2, start_window=0, noise_std=1.0, strategy=BinaryTree())
    with pytest.raises(ValueError, match="total must have shape \\(2, 2\\) at window_id=1"):
        query.noisy_release(np.zeros((1, 2)), binding=_key(1), window_id=1)
    with pytest.raises(ValueError, match="window_id must be >= start_window=0, got window_id=-1"):
        query.rows_at(-1)


# --- state validation and snapshots --------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda s, l: s.step([1, 1], [[1.0], [1.0]], window_id=0, ledger=l, noise_std=1.0),
     "user_ids must be distinct within one window, got user id 1"),
    (lambda s, l: s.step([1], [[np.nan]], window_id=0, ledger=l, noise_std=1.0), "contributions must be finite"),
    (lambda s, l: s.step([1], [[1.0, 2.0]], window_id=0, ledger=l, noise_std=1.0),
     "contributions must have shape \\(n, 1\\), got shape=\\(1, 2\\)"),
    (lambda s, l: s.step([1], [[1.0]], window_id=0, ledger=l, noise_std=-1.0), "noise_std must be > 0"),
    (lambda s, l: s.step([1], [[1.0]], window_id=0, ledger=l, noise_std=1.0, policy="keep"),
     "policy must be one of"),
    (lambda s, l: s.step(["a"], [[1.0]], window_id=0, ledger=l, noise_std=1.0), "user_ids must be integers"),
    (lambda s, l: s.step([1], [[1.0]], window_id=0, ledger=Ledger(budget=1.0, id_type="string"), noise_std=1.0),
     "ledger id_type must match"),
])
def test_invalid_steps_are_refused_before_anything_is_charged(call, message):
    state = RunningState(strategy=SquareRootFactorization(), dim=1, start_window=0)
    ledger = Ledger(budget=1.0)
    with pytest.raises(ValueError, match=message):
        call(state, ledger)
    assert state.next_window == 0 and state.n_entries == 0 and len(ledger) == 0


def _snapshot() -> pa.Table:
    state = RunningState(strategy=SquareRootFactorization(), dim=2, start_window=3)
    ledger = Ledger(budget=10.0)
    state.step([1, 2], [[1.0, 0.0], [0.0, 2.0]], window_id=3, ledger=ledger, noise_std=1.0)
    state.step([2], [[1.0, 1.0]], window_id=4, ledger=ledger, noise_std=1.0)
    return state.to_arrow()


def test_snapshots_are_sorted_and_round_trip():
    table = _snapshot()
    assert table.column("user_id").to_pylist() == [1, 2, 2]
    assert table.column("window_id").to_pylist() == [3, 3, 4]
    restored = RunningState.from_arrow(table)
    assert restored.to_arrow().equals(table)
    assert restored.next_window == 5 and restored.strategy == SquareRootFactorization()


@pytest.mark.parametrize("corrupt, message", [
    (lambda t: t.replace_schema_metadata({**t.schema.metadata, b"renyi_stream.running_version": b"0"}),
     "snapshot version must be 1"),
    (lambda t: t.drop_columns(["values"]), "missing columns \\['values'\\]"),
    (lambda t: t.set_column(1, "window_id", pa.array([3, 3, 5])).replace_schema_metadata(t.schema.metadata),
     "windows outside \\[3, 5\\)"),
    (lambda t: t.set_column(1, "window_id", pa.array([3, 4, 4])).replace_schema_metadata(t.schema.metadata)
     .set_column(0, "user_id", pa.array([2, 2, 2])).replace_schema_metadata(t.schema.metadata),
     "repeats a \\(user_id, window_id\\)"),
    (lambda t: t.set_column(0, "user_id", pa.array([1, None, 2], type=pa.int64())).replace_schema_metadata(
        t.schema.metadata), "column 'user_id' contains nulls"),
    (lambda t: t.replace_schema_metadata({**t.schema.metadata, b"strategy": b'{"name": "laplace"}'}),
     "strategy name must be one of"),
])
def test_corrupt_snapshots_are_refused(corrupt, message):
    with pytest.raises(ValueError, match=message):
        RunningState.from_arrow(corrupt(_snapshot()))


# --- online decoding: the estimate window by window, keeping only what later windows need --------

def _online(strategy, releases):
    state, out = None, []
    for t, y in enumerate(releases):
        estimate, state = strategy.decode_online(t, state, y)
        out.append(estimate)
    return np.array(out), state


def _all_strategies():
    from renyi_stream.stream.continual.blt import BufferedLinearToeplitz

    return [*STRATEGIES, BufferedLinearToeplitz.shipped()]


@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize("strategy", _all_strategies(), ids=lambda s: f"{s.name}-{getattr(s, 'height', '')}")
def test_decoding_window_by_window_gives_the_batch_decode_through_each_window_bit_for_bit(strategy, dim):
    """A streaming job decodes each window as it is released; each estimate equals the batch
    decode of the series through that window exactly, so continuing from a decoder state changes
    no answer. With a recurrence (window sums, BLT) or the tree's causal least squares it is also
    the decode of the whole series at that window; the square root's whole-series decode is one
    larger matrix product, equal to the last bits only."""
    rng = np.random.default_rng(11)
    releases = [rng.normal(size=(strategy.rows_at(t), dim)) * 10 for t in range(70)]
    online, _ = _online(strategy, releases)
    assert np.array_equal(online, np.array([strategy.post_process(releases[:t + 1])[t] for t in range(70)]))
    whole = strategy.post_process(releases)
    if strategy.name == "sqrt":
        np.testing.assert_allclose(online, whole, rtol=1e-12, atol=1e-12)
    else:
        assert np.array_equal(online, whole)


def test_the_blt_and_window_sums_decoders_keep_a_fixed_number_of_rows_whatever_the_window():
    """Issue 30: a running query's release state is O(buffers x d) numbers, never the series so far
    (square root and tree keep the series: their estimate has no finite recurrence)."""
    from renyi_stream.stream.continual.blt import BufferedLinearToeplitz

    rng = np.random.default_rng(2)
    blt = BufferedLinearToeplitz.shipped()
    for strategy, rows in ((blt, 1 + blt.buffers), (WindowSums(), 1)):
        shapes = set()
        state = None
        for t in range(365):
            _, state = strategy.decode_online(t, state, rng.normal(size=(1, 2)))
            shapes.add(state.shape)
        assert shapes == {(rows, 2)} and strategy.decoder_rows(365) == rows
    _, state = _online(SquareRootFactorization(), [rng.normal(size=(1, 2)) for _ in range(30)])
    assert state.shape == (30, 2)


@pytest.mark.parametrize("strategy", _all_strategies(), ids=lambda s: f"{s.name}-{getattr(s, 'height', '')}")
def test_a_decoder_state_folded_from_a_recorded_series_continues_as_the_online_one(strategy):
    """An earlier version recorded the releases y whole: folded (decoder_state), they continue the
    estimates exactly as the state decoded online does."""
    rng = np.random.default_rng(5)
    releases = [rng.normal(size=(strategy.rows_at(t), 2)) for t in range(20)]
    _, online = _online(strategy, releases[:12])
    folded = strategy.decoder_state(releases[:12])
    assert np.array_equal(folded, online)
    assert np.array_equal(strategy.decode_online(12, folded, releases[12])[0], strategy.post_process(releases[:13])[12])
    assert strategy.decoder_state([]) is None


@pytest.mark.parametrize("call, message", [
    (lambda s: s.decode_online(3, np.zeros((2, 2)), np.zeros((1, 2))), r"state must be the .* after 3 window\(s\)"),
    (lambda s: s.decode_online(5, None, np.zeros((1, 2))), r"after 5 window\(s\), got None: only the first window"),
    (lambda s: s.decode_online(1, np.full((s.decoder_rows(1), 2), np.inf), np.zeros((1, 2))), "state must be finite"),
    (lambda s: s.decode_online(0, None, np.zeros((2, 2))), r"release must have 1 row\(s\)"),
    (lambda s: s.decode_online(0, None, np.array([[np.nan, 1.0]])), "release must be finite"),
    (lambda s: s.decode_online(-1, None, np.zeros((1, 2))), "t must be"),
])
def test_a_decoder_state_or_release_of_another_shape_is_refused_naming_it(call, message):
    from renyi_stream.stream.continual.blt import BufferedLinearToeplitz

    for strategy in (WindowSums(), SquareRootFactorization(), BufferedLinearToeplitz.shipped()):
        with pytest.raises(ValueError, match=message):
            call(strategy)
