"""Hostile call sequences for the ledger (stream/ledger.py): stateful property-based fuzzing.

A hypothesis state machine drives one :class:`Ledger` (int64 or string ids) through arbitrary
sequences of ``admit`` calls (drop and clip mixed, noise std changing between windows,
vectors of zeros, subnormals and values near float64's limits, empty windows, repeated ids
in one call, NaN/inf, snapshots restored half-way) and checks after every step:

* no user's used budget ever exceeds the budget, and it never decreases;
* the exact (rational) sum of the charges recorded for a user stays <= the used budget <= kappa;
* every row is counted once: admitted + clipped + dropped == rows;
* each row's status matches what it contributes (dropped: nothing, charged 0; admitted: the
  row as given; clipped: the row scaled by a factor in (0, 1)), and what it contributes never
  costs more than what was recorded;
* a refused call (``ValueError``) changes nothing.

tests/test_ledger.py already checks budget sums for random calls on one int ledger; this file
adds call *sequences* with state (snapshots, refusals, both id kinds) and the invariants above.
Hypothesis runs derandomized with bounded examples, so CI is deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from renyi_stream.stream.ledger import ADMITTED, CLIPPED, DROPPED, Ledger

INT_IDS = st.sampled_from([0, 1, 2, -1, 7, 2**63 - 1, -(2**63) + 1, 123_456_789_012])
STR_IDS = st.sampled_from(["a", "b", "", " a", "é", "e\u0301", "🙂" * 3, "x" * 10_000, "\x00"])
VALUES = st.one_of(
    st.floats(min_value=-10.0, max_value=10.0, allow_nan=False),
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1e-300, 1e150, -1e154, 1e300, 1.7e308, 0.5, 1.0]),
)
NOISE = st.one_of(st.sampled_from([1.0, 0.5, 2.0, 1e-3, 1e3]), st.floats(min_value=1e-3, max_value=1e3))


def _true_cost(rows: np.ndarray, noise_std: float) -> list[Fraction]:
    """Exact ||row||^2 / (2 s^2) of each float64 row, in rational arithmetic."""
    s2 = 2 * Fraction(noise_std) ** 2
    return [sum((Fraction(float(v)) ** 2 for v in row), Fraction(0)) / s2 for row in rows]


class LedgerMachine(RuleBasedStateMachine):
    """One ledger, a model of every user's recorded charges, invariants after each step."""

    @initialize(id_type=st.sampled_from(["int64", "string"]),
                budget=st.sampled_from([1.0, 0.25, 1e-6, 3e2]), dim=st.integers(1, 3))
    def start(self, id_type: str, budget: float, dim: int) -> None:
        self.budget = budget
        self.dim = dim
        self.ledger = Ledger(budget=budget, id_type=id_type)
        self.ids = INT_IDS if id_type == "int64" else STR_IDS
        self.charges: dict = {}  # user -> exact sum of the charges the ledger recorded
        self.last_used: dict = {}  # user -> used budget after the previous step

    def _state(self) -> tuple:
        users = list(self.last_used)
        return len(self.ledger), tuple(self.ledger.used(users).tolist()) if users else ()

    @rule(data=st.data(), noise_std=NOISE, policy=st.sampled_from(["drop", "clip"]))
    def admit_a_window(self, data, noise_std: float, policy: str) -> None:
        users = data.draw(st.lists(self.ids, unique=True, max_size=6))
        rows = np.array(data.draw(st.lists(st.lists(VALUES, min_size=self.dim, max_size=self.dim),
                                           min_size=len(users), max_size=len(users))),
                        dtype=np.float64).reshape(len(users), self.dim)
        result = self.ledger.admit(users, rows, noise_std=noise_std, policy=policy)
        n = len(users)
        counts = result.counts()
        assert counts["admitted"] + counts["clipped"] + counts["dropped"] == n
        assert result.contributions.shape == (n, self.dim) and np.isfinite(result.contributions).all()
        costs = _true_cost(result.contributions, noise_std)
        for k, user in enumerate(users):
            status, charge, out = int(result.status[k]), float(result.charge[k]), result.contributions[k]
            if status == DROPPED:
                assert charge == 0.0 and not out.any()
            elif status == ADMITTED:
                assert np.array_equal(out, rows[k])
            else:
                assert status == CLIPPED and policy == "clip"
                big = int(np.argmax(np.abs(rows[k])))
                scale = out[big] / rows[k][big]
                assert 0 < scale < 1
                # One factor for the whole row (coordinates may underflow to 0 when scaled).
                assert np.allclose(out, rows[k] * scale, rtol=1e-12, atol=1e-300)
            # What the row really costs never exceeds what was recorded, however tiny the
            # squares (see test_a_row_whose_squares_underflow_is_never_undercharged).
            assert costs[k] <= Fraction(charge)
            self.charges[user] = self.charges.get(user, Fraction(0)) + Fraction(charge)

    @rule(data=st.data())
    def repeated_ids_are_refused_and_change_nothing(self, data) -> None:
        user = data.draw(self.ids)
        before = self._state()
        with pytest.raises(ValueError, match="distinct"):
            self.ledger.admit([user, user], np.ones((2, self.dim)), noise_std=1.0)
        assert self._state() == before

    @rule(data=st.data(), bad=st.sampled_from([math.nan, math.inf, -math.inf]))
    def non_finite_rows_are_refused_and_change_nothing(self, data, bad: float) -> None:
        users = data.draw(st.lists(self.ids, unique=True, min_size=1, max_size=4))
        rows = np.ones((len(users), self.dim))
        rows[-1, -1] = bad
        before = self._state()
        with pytest.raises(ValueError, match="finite"):
            self.ledger.admit(users, rows, noise_std=1.0)
        assert self._state() == before

    @rule(noise_std=st.sampled_from([0.0, -1.0, math.nan, math.inf, 1e-200, 1e200]))
    def bad_noise_std_is_refused_and_changes_nothing(self, noise_std: float) -> None:
        before = self._state()
        users = ["a"] if self.ledger.id_type == "string" else [1]
        with pytest.raises(ValueError, match="noise_std"):
            self.ledger.admit(users, np.ones((1, self.dim)), noise_std=noise_std)
        assert self._state() == before

    @precondition(lambda self: self.ledger.id_type == "int64")
    @rule()
    def the_reserved_int64_id_is_refused_and_changes_nothing(self) -> None:
        before = self._state()
        with pytest.raises(ValueError, match="reserved"):
            self.ledger.admit([5, -(2**63)], np.ones((2, self.dim)), noise_std=1.0)
        assert self._state() == before

    @rule()
    def an_empty_window_changes_nothing(self) -> None:
        before = self._state()
        result = self.ledger.admit([], np.zeros((0, self.dim)), noise_std=1.0)
        assert result.counts() == {"admitted": 0, "clipped": 0, "dropped": 0}
        assert self._state() == before

    @precondition(lambda self: len(self.ledger) > 0)
    @rule()
    def a_snapshot_restores_the_same_ledger(self) -> None:
        restored = Ledger.from_arrow(self.ledger.to_arrow())
        users = list(self.last_used)
        assert restored.used(users).tolist() == self.ledger.used(users).tolist()
        assert restored.personal_odometer(users).tolist() == self.ledger.personal_odometer(users).tolist()
        self.ledger = restored

    @invariant()
    def no_user_exceeds_the_budget_and_used_budgets_never_decrease(self) -> None:
        if not hasattr(self, "ledger"):
            return
        users = list(self.charges)
        if not users:
            return
        used = self.ledger.used(users)
        odometer = self.ledger.personal_odometer(users)
        for user, u, o in zip(users, used.tolist(), odometer.tolist()):
            assert 0.0 <= u <= self.budget
            assert self.charges[user] <= Fraction(u)  # the stored used budget bounds the charges
            assert u >= self.last_used.get(user, 0.0)  # monotone
            assert o <= self.budget and (u == 0.0 or o >= u)
            self.last_used[user] = u


LedgerMachine.TestCase.settings = settings(
    derandomize=True, database=None, deadline=None, max_examples=150, stateful_step_count=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_ledger_survives_arbitrary_call_sequences = LedgerMachine.TestCase


@pytest.mark.parametrize(
    "ids,id_type,rows",
    [
        ("abc", "string", 3),  # a str is not three ids, even when three rows come with it
        ({"a", "b"}, "string", 2),  # a set has no order to pair ids with rows
        (None, "int64", 1),
        (np.array([2**64 - 1], dtype=np.uint64), "string", 1),
        ([1, "a"], "string", 2),
        ([2**64], "int64", 1),
        ([1.5], "int64", 1),
    ],
)
def test_ids_that_are_not_an_ordered_sequence_of_the_ledgers_kind_are_refused(ids, id_type, rows):
    ledger = Ledger(budget=1.0, id_type=id_type)
    with pytest.raises(ValueError, match="user_ids"):
        ledger.admit(ids, np.ones((rows, 1)), noise_std=1.0)
    assert len(ledger) == 0


def test_complex_contributions_are_refused_not_truncated():
    ledger = Ledger(budget=1.0)
    with pytest.raises(ValueError, match="complex"):
        ledger.admit([1], [[1j]], noise_std=1.0)
    assert len(ledger) == 0


def test_reading_a_ledger_that_has_seen_nobody_gives_zeros():
    for id_type, ids in (("int64", [3, 4]), ("string", ["a"])):
        ledger = Ledger(budget=1.0, id_type=id_type)
        assert ledger.used(ids).tolist() == [0.0] * len(ids)
        assert np.all(ledger.remaining(ids) > 0.99)
        assert ledger.personal_odometer(ids).tolist() == [0.0] * len(ids)


@pytest.mark.parametrize("noise_std", [1e-170, 1e170])
def test_noise_std_whose_variance_leaves_float64_is_refused(noise_std):
    """2 s^2 underflowing to 0 divided by zero; overflowing to inf recorded a charge of ~0 for a
    row whose true charge was far larger (e.g. 1e100 with s=1e200: 5e-201 recorded as 5e-324)."""
    with pytest.raises(ValueError, match="noise_std"):
        Ledger(budget=1.0).admit([1], [[1e100]], noise_std=noise_std)


def test_a_row_whose_squares_underflow_is_never_undercharged():
    """gaussian_charge promises a charge never below ||q||^2 / (2 s^2), also when q^2 is
    subnormal: for q = 1.45e-162 and s = 1e-3 the exact charge is about 1.05e-318, and a plain
    q*q underflowed to 0 (so 5e-324 was recorded) before tiny rows were charged in scaled form."""
    q, s = 1.448984708966553e-162, 1e-3
    charge = Ledger(budget=1.0).admit([0], [[q]], noise_std=s).charge[0]
    assert Fraction(q) ** 2 / (2 * Fraction(s) ** 2) <= Fraction(float(charge))
