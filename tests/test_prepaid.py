"""Prepaid admission for running totals (issue 20): the compact rules (BLT, tree) against the exact
dense reference, the soundness property (the losses realised by any prefix of releases never
exceed what was prepaid, for random streams and random admission decisions), the filter decision
on prepaid charges, the aggregate state per query, and the device path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.prepaid import (
    ETA,
    BLTPrepaid,
    ChargeTerms,
    DenseHistoryPrepaid,
    TreePrepaid,
    UserState,
    prepaid_charge,
    prepaid_filter,
    prepaid_rho,
    prepaid_rule,
    realised_sq_norms,
)
from renyi_stream.stream.continual.strategies import BinaryTree, SquareRootFactorization, WindowSums
from renyi_stream.stream.ledger import ADMITTED, CLIPPED, DROPPED, individual_filter
from renyi_stream.stream.testing import strict_xp as sx

# A BLT whose tail is negligible after 400 windows (largest decay 0.9), so a dense reference over
# 400 windows is its infinite tail to 1e-18.
SHORT_BLT = BufferedLinearToeplitz(theta=(0.9, 0.5, 0.1), omega=(0.05, 0.15, 0.2), horizon=None)

RULES = {
    "blt, declared": lambda horizon: BLTPrepaid(BufferedLinearToeplitz(), horizon=horizon),
    "blt, infinite tail": lambda horizon: BLTPrepaid(BufferedLinearToeplitz.shipped(90, 3), horizon=None),
    "tree, declared": lambda horizon: TreePrepaid(BinaryTree(), horizon=horizon),
    "capped tree, infinite tail": lambda horizon: TreePrepaid(BinaryTree(height=2), horizon=None),
    "sqrt, declared (dense history)": lambda horizon: DenseHistoryPrepaid(SquareRootFactorization(), horizon=horizon),
}


def _run(rule, values: np.ndarray, active: np.ndarray, admit: np.ndarray):
    """Windows ``0..T-1`` through ``rule``: every active user's contribution is charged, and
    admitted where ``admit`` says (random decisions stand for any filter). Returns the charges
    ``(users, T)`` (norm units), the admitted streams ``(users, T, d)`` and the releases."""
    horizon, users, dim = values.shape
    state = rule.new_users(users, dim)
    release = rule.new_release(dim)
    charges = np.zeros((users, horizon))
    admitted = np.zeros((users, horizon, dim))
    releases = []
    for t in range(horizon):
        rows = np.flatnonzero(active[t])
        charge = prepaid_charge(rule.charge_terms(state.take(rows), values[t, rows], t))
        take = rows[admit[t, rows]]
        charges[take, t] = charge[admit[t, rows]]
        state.put(take, rule.admit(state.take(take), values[t, take], t))
        admitted[take, t] = values[t, take]
        total, release = rule.release(release, admitted[:, t].sum(axis=0))
        releases.append(total)
    return charges, admitted, releases


@st.composite
def _streams(draw, *, signed: bool):
    horizon = draw(st.integers(1, 20))
    users = draw(st.integers(1, 4))
    dim = draw(st.integers(1, 3))
    low = -4.0 if signed else 0.0
    values = draw(hnp.arrays(np.float64, (horizon, users, dim),
                             elements=st.floats(low, 4.0, allow_nan=False, allow_subnormal=False)))
    active = draw(hnp.arrays(np.bool_, (horizon, users)))
    admit = draw(hnp.arrays(np.bool_, (horizon, users)))
    return values, active, admit


# --- soundness: realised losses never exceed the prepaid charges ---------------------------------


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(RULES)), stream=_streams(signed=True))
@example(name="blt, declared",  # squares in the subnormal range, where a relative margin underflows
         stream=(np.full((2, 1, 2), 1.68001641e-159), np.ones((2, 1), bool), np.ones((2, 1), bool)))
def test_the_losses_realised_by_every_prefix_of_releases_never_exceed_the_charges_prepaid_by_then(name, stream):
    values, active, admit = stream
    rule = RULES[name](values.shape[0])
    charges, admitted, _ = _run(rule, values, active, admit)
    realised = realised_sq_norms(rule.strategy, admitted)  # ||q_t(i)||^2 of every release made
    # No tolerance: the charges are rounded up, so the direction of every rounding is safe.
    assert np.all(np.cumsum(realised, axis=1) <= np.cumsum(charges, axis=1))


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(["blt, declared", "tree, declared", "sqrt, declared (dense history)"]),
       stream=_streams(signed=False))
def test_over_a_declared_schedule_the_prepaid_total_is_the_realised_total_to_rounding(name, stream):
    # Non-negative data: nothing is clamped, so prepaying is exact up to the rounding margin.
    values, active, admit = stream
    rule = RULES[name](values.shape[0])
    charges, admitted, _ = _run(rule, values, active, admit)
    realised = realised_sq_norms(rule.strategy, admitted).sum(axis=1)
    np.testing.assert_allclose(charges.sum(axis=1), realised, rtol=10 * ETA, atol=1e-300)


def test_a_contribution_that_lowers_the_users_future_norm_is_charged_nothing_not_refunded():
    rule = DenseHistoryPrepaid(SquareRootFactorization(), horizon=10)
    state = rule.new_users(1, 1)
    state.put([0], rule.admit(state, np.array([[1.0]]), 0))
    terms = rule.charge_terms(state, np.array([[-1.0]]), 1)
    assert float(terms.quadratic[0] + 2 * terms.cross[0]) < 0.0
    assert prepaid_charge(terms)[0] == 0.0


# --- the compact rules against the dense reference --------------------------------------------


@pytest.mark.parametrize("strategy", [BufferedLinearToeplitz(), BufferedLinearToeplitz.shipped(4096, 3), BinaryTree(),
                                      BinaryTree(height=1), BinaryTree(height=4)], ids=repr)
def test_the_compact_rule_charges_and_releases_as_the_dense_history(strategy):
    horizon, users, dim = 40, 5, 2
    rng = np.random.default_rng(7)
    compact, dense = prepaid_rule(strategy, horizon=horizon), DenseHistoryPrepaid(strategy, horizon=horizon)
    compact_state, dense_state = compact.new_users(users, dim), dense.new_users(users, dim)
    compact_release, dense_release = compact.new_release(dim), dense.new_release(dim)
    for t in range(horizon):
        rows = np.flatnonzero(rng.random(users) < 0.6)
        x = rng.standard_normal((rows.size, dim))
        got = compact.charge_terms(compact_state.take(rows), x, t)
        want = dense.charge_terms(dense_state.take(rows), x, t)
        np.testing.assert_allclose(got.quadratic, want.quadratic, rtol=1e-12)
        np.testing.assert_allclose(got.cross, want.cross, rtol=1e-10, atol=1e-12 * np.max(want.magnitude, initial=1))
        compact_state.put(rows, compact.admit(compact_state.take(rows), x, t))
        dense_state.put(rows, dense.admit(dense_state.take(rows), x, t))
        a = x.sum(axis=0)
        (got_total, compact_release), (want_total, dense_release) = (compact.release(compact_release, a),
                                                                     dense.release(dense_release, a))
        np.testing.assert_allclose(got_total, want_total, rtol=1e-12, atol=1e-12)


def test_the_blt_infinite_tail_charges_the_whole_future_of_c():
    long = 400  # SHORT_BLT's coefficients are below 1e-19 past lag 400
    tail, dense = BLTPrepaid(SHORT_BLT, horizon=None), DenseHistoryPrepaid(SHORT_BLT, horizon=long)
    rng = np.random.default_rng(8)
    tail_state, dense_state = tail.new_users(3, 2), dense.new_users(3, 2)
    for t in (0, 2, 3, 9):
        x = rng.standard_normal((3, 2))
        np.testing.assert_allclose(prepaid_charge(tail.charge_terms(tail_state, x, t)),
                                   prepaid_charge(dense.charge_terms(dense_state, x, t)), rtol=1e-8)
        tail_state = tail.admit(tail_state, x, t)
        dense_state = dense.admit(dense_state, x, t)


def test_a_users_blt_state_is_their_buffers_and_the_day_last_seen():
    strategy = BufferedLinearToeplitz()
    rule = BLTPrepaid(strategy, horizon=365)
    state = rule.new_users(1, 2)
    x3, x10 = np.array([[1.0, 2.0]]), np.array([[0.5, -1.0]])
    state = rule.admit(state, x3, 3)  # touched on days 3 and 10 only
    state = rule.admit(state, x10, 10)
    theta = np.array(strategy.theta)
    assert state.values.shape == (1, strategy.buffers, 2) and state.last.tolist() == [10]
    # S_j(11) = sum_{s <= 10} theta_j^(10 - s) x_s
    expected = theta[:, None] ** 7 * x3[0] + x10[0]
    np.testing.assert_allclose(state.values[0], expected, rtol=1e-14)


def test_the_aggregate_release_state_is_the_sum_of_the_users_states():
    strategy = BufferedLinearToeplitz()
    rule = BLTPrepaid(strategy, horizon=100)
    rng = np.random.default_rng(9)
    users = rule.new_users(6, 1)
    release = rule.new_release(1)
    theta = np.array(strategy.theta)
    for t in range(12):
        rows = np.flatnonzero(rng.random(6) < 0.5)
        x = rng.random((rows.size, 1))
        users.put(rows, rule.admit(users.take(rows), x, t))
        _, release = rule.release(release, x.sum(axis=0))
        # every user's buffers brought to day t + 1 sum to the query's: one state per query
        decay = theta[None, :] ** (t - users.last)[:, None].astype(np.float64)
        brought = np.where(users.last[:, None, None] >= 0, decay[:, :, None] * users.values, 0.0)
        np.testing.assert_allclose(brought.sum(axis=0), release.values, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["blt, declared", "tree, declared", "sqrt, declared (dense history)"])
def test_a_users_charge_bits_depend_only_on_their_own_row_never_on_the_batch(name):
    # Bit for bit: a user near the budget must get the same decision whoever else is active.
    rule = RULES[name](64)
    rng = np.random.default_rng(10)
    users, dim = 40, 7
    state = UserState(values=rng.standard_normal((users, rule.width, dim)), last=rng.integers(-1, 20, size=users))
    x = rng.standard_normal((users, dim))
    alone = [prepaid_charge(rule.charge_terms(state.take([i]), x[[i]], 20))[0] for i in range(users)]
    order = rng.permutation(users)
    together = prepaid_charge(rule.charge_terms(state.take(order), x[order], 20))
    assert together.tobytes() == np.array([alone[i] for i in order]).tobytes()


def test_the_dense_rule_charges_a_window_in_memory_linear_in_its_users_rows():
    # The square root's rule (the only one of the three with a dense C): a window of n users must
    # not allocate a rows x T block per user (n T^2 d numbers: 200 users at T = 365 took 207 MiB).
    import tracemalloc

    horizon, users, dim = 365, 200, 1
    rule = DenseHistoryPrepaid(SquareRootFactorization(), horizon=horizon)
    state = rule.new_users(users, dim)
    x = np.ones((users, dim))
    tracemalloc.start()
    try:
        rule.charge_terms(state, x, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = users * horizon * dim * 8  # the window's users' rows, bytes
    assert peak < 4 * rows + 64 * horizon * 8


# --- the filter on prepaid charges -------------------------------------------------------------


def _history_terms(history: float, x: float, t: int = 1):
    """Terms of ``x`` at ``t`` for a user with ``history`` admitted at 0 (sqrt, 10 windows)."""
    rule = DenseHistoryPrepaid(SquareRootFactorization(), horizon=10)
    state = rule.admit(rule.new_users(1, 1), np.array([[history]]), 0)
    return rule, state, rule.charge_terms(state, np.array([[x]]), t)


@pytest.mark.parametrize("history", [0.0, 3.0, -0.5])
def test_a_clipped_contribution_is_scaled_so_its_own_prepaid_charge_fits_the_budget(history):
    rule, state, terms = _history_terms(history, 2.0)
    noise_std, cap, used = 1.5, 4.0, np.array([3.0])
    decision = prepaid_filter(used, terms, cap=cap, noise_std=noise_std, policy="clip")
    assert decision.status.tolist() == [CLIPPED]
    scale = float(decision.scale[0])
    assert 0.0 < scale < 1.0
    exact = prepaid_charge(rule.charge_terms(state, np.array([[2.0 * scale]]), 1))[0] / (2 * noise_std**2)
    assert exact <= decision.charge[0] == pytest.approx(cap - used[0], rel=1e-12)
    assert exact == pytest.approx(decision.charge[0], rel=1e-6)  # and the budget is used, not wasted
    assert decision.new_used[0] <= cap


def test_scaling_a_contribution_like_a_window_sum_would_overspend_when_the_user_has_history():
    # Delta(lambda) = lambda^2 A + 2 lambda B is not lambda^2 Delta(1): with B > 0 the window-sum
    # factor sqrt(remaining / charge) leaves a charge above the remaining budget.
    _, _, terms = _history_terms(3.0, 2.0)
    rho = float(prepaid_rho(terms, noise_std=1.0)[0])
    remaining = rho / 4
    naive = math.sqrt(remaining / rho)
    naive_rho = (naive**2 * float(terms.quadratic[0]) + 2 * naive * float(terms.cross[0])) / 2.0
    assert naive_rho > remaining
    decision = prepaid_filter(np.array([0.0]), terms, cap=remaining, noise_std=1.0, policy="clip")
    scale = float(decision.scale[0])
    assert (scale**2 * float(terms.quadratic[0]) + 2 * scale * float(terms.cross[0])) / 2.0 <= remaining


def test_under_drop_the_prepaid_filter_is_the_ledgers_filter_on_prepaid_charges():
    rng = np.random.default_rng(11)
    terms = ChargeTerms(quadratic=rng.random(50) * 3, cross=rng.standard_normal(50), magnitude=np.full(50, 10.0))
    used = rng.random(50) * 2
    got = prepaid_filter(used, terms, cap=2.5, noise_std=0.8, policy="drop")
    want = individual_filter(used, prepaid_rho(terms, noise_std=0.8), cap=2.5, policy="drop")
    for name in ("new_used", "charge", "scale", "status"):
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes()
    assert set(got.status.tolist()) == {ADMITTED, DROPPED}


@pytest.mark.parametrize("policy", ["drop", "clip"])
def test_an_overflowing_contribution_is_an_infinite_charge_and_is_dropped(policy):
    rule = BLTPrepaid(BufferedLinearToeplitz(), horizon=365)
    terms = rule.charge_terms(rule.new_users(2, 1), np.array([[1e200], [1.0]]), 0)
    assert prepaid_charge(terms)[0] == np.inf
    decision = prepaid_filter(np.zeros(2), terms, cap=10.0, noise_std=1.0, policy=policy)
    assert decision.status.tolist() == [DROPPED, ADMITTED]
    assert decision.new_used[0] == 0.0


def test_a_zero_contribution_is_free_and_admitted_even_with_the_budget_spent():
    rule = BLTPrepaid(BufferedLinearToeplitz(), horizon=365)
    state = rule.admit(rule.new_users(1, 1), np.array([[5.0]]), 0)
    terms = rule.charge_terms(state, np.array([[0.0]]), 1)
    decision = prepaid_filter(np.array([1.0]), terms, cap=1.0, noise_std=1.0, policy="clip")
    assert decision.status.tolist() == [ADMITTED] and decision.charge.tolist() == [0.0]


# --- errors -------------------------------------------------------------------------------------


def _blt_rule():
    return BLTPrepaid(BufferedLinearToeplitz(), horizon=10)


@pytest.mark.parametrize("call, message", [
    (lambda: _blt_rule().charge_terms(_blt_rule().new_users(1, 1), np.ones((1, 1)), 10),
     "t must be in \\[0, 10\\) \\(the declared schedule\\), got t=10"),
    (lambda: _blt_rule().charge_terms(_blt_rule().new_users(1, 1), np.ones((1, 1)), -1), "t must be an integer >= 0"),
    (lambda: _blt_rule().charge_terms(_blt_rule().admit(_blt_rule().new_users(1, 1), np.ones((1, 1)), 3),
                                      np.ones((1, 1)), 3), "every row's last admission before t=3"),
    (lambda: _blt_rule().charge_terms(_blt_rule().new_users(1, 1), np.full((1, 1), np.nan), 0), "x must be finite"),
    (lambda: _blt_rule().charge_terms(_blt_rule().new_users(2, 1), np.ones((1, 1)), 0), "x must have shape \\(2, 1\\)"),
    (lambda: _blt_rule().charge_terms(TreePrepaid(BinaryTree(), horizon=100).new_users(1, 1), np.ones((1, 1)), 0),
     "state must have values of shape \\(n, 4, d\\)"),
    (lambda: _blt_rule().release(_blt_rule().new_release(2), np.ones(3)), "a must have shape \\(2,\\)"),
    (lambda: TreePrepaid(BinaryTree(), horizon=None), "horizon must be declared for an unbounded tree"),
    (lambda: prepaid_rule(SquareRootFactorization(), horizon=None), "horizon must be declared for strategy 'sqrt'"),
    (lambda: DenseHistoryPrepaid(WindowSums(), horizon=0), "horizon must be an integer >= 1"),
    (lambda: BLTPrepaid(BinaryTree(), horizon=5), "strategy must be a BufferedLinearToeplitz"),
    (lambda: BLTPrepaid(BufferedLinearToeplitz(theta=(0.9999999,), omega=(0.1,), horizon=None), horizon=None),
     "theta must be within"),
    (lambda: prepaid_filter(np.zeros(1), ChargeTerms(np.ones(1), np.ones(1), np.ones(1)), cap=1.0, noise_std=1.0,
                            policy="trim"), "policy must be one of"),
])
def test_invalid_prepaid_requests_are_refused_with_the_parameter_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_release_past_the_declared_schedule_is_refused():
    rule = _blt_rule()
    release = rule.new_release(1)
    for _ in range(10):
        _, release = rule.release(release, np.ones(1))
    with pytest.raises(ValueError, match="t must be in \\[0, 10\\)"):
        rule.release(release, np.ones(1))


# --- the device path ----------------------------------------------------------------------------


def _same_bits(expected: np.ndarray, got: sx.StrictArray) -> bool:
    data = got.get()
    return data.dtype == expected.dtype and data.shape == expected.shape and data.tobytes() == expected.tobytes()


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_prepaid_kernels_on_the_device_path_are_numpy_bit_for_bit(name):
    rule = RULES[name](12)
    rng = np.random.default_rng(12)
    host, device = rule.new_users(4, 2), rule.new_users(4, 2, like=sx.zeros(1))
    host_release, device_release = rule.new_release(2), rule.new_release(2, like=sx.zeros(1))
    for t in range(12):
        x = rng.standard_normal((4, 2))
        host_terms = rule.charge_terms(host, x, t)
        with sx.host_traffic() as traffic:
            terms = rule.charge_terms(device, sx.asarray(x), t)
            decision = prepaid_filter(sx.zeros(4), terms, cap=50.0, noise_std=1.0, policy="clip")
        assert traffic.transfers == 1 and traffic.syncs == 0  # the batch check, one bool
        host_decision = prepaid_filter(np.zeros(4), host_terms, cap=50.0, noise_std=1.0, policy="clip")
        assert _same_bits(host_terms.cross, terms.cross) and _same_bits(host_decision.scale, decision.scale)
        host, device = rule.admit(host, x, t), rule.admit(device, sx.asarray(x), t)
        host_total, host_release = rule.release(host_release, x.sum(axis=0))
        total, device_release = rule.release(device_release, sx.asarray(x.sum(axis=0)))
        assert _same_bits(host.values, device.values) and _same_bits(host_total, total)
