"""The vectorised individual filter: Algorithm 3 (drop) and Algorithm 7's clip, per user."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.stream.ledger import ADMITTED, CLIPPED, DROPPED, Ledger

S = 2.0  # noise std used throughout: charge = ||q||^2 / 8


def _reference_filter(history: dict, ids, rows, *, budget, noise_std, policy):
    """Algorithm 3 / Algorithm 7 written literally, one user at a time, in exact arithmetic."""
    cap = Fraction(budget) * (1 - Fraction(1, 10**9))
    statuses = []
    for uid, row in zip(ids, rows):
        used = history.get(uid, Fraction(0))
        charge = Fraction(float(np.dot(row, row))) / (2 * Fraction(noise_std) ** 2)
        if used + charge <= cap:
            history[uid] = used + charge
            statuses.append(ADMITTED)
        elif policy == "clip" and used < cap:
            history[uid] = cap
            statuses.append(CLIPPED)
        else:
            statuses.append(DROPPED)
    return statuses


def test_a_row_is_charged_its_squared_norm_over_twice_the_noise_variance():
    ledger = Ledger(budget=10.0)
    result = ledger.admit([1, 2], [[3.0, 4.0], [0.0, 1.0]], noise_std=S)
    assert result.charge == pytest.approx([25 / 8, 1 / 8], rel=1e-11)
    assert np.all(result.charge >= np.array([25 / 8, 1 / 8]))  # rounded up, never down
    assert ledger.used([1, 2]) == pytest.approx([25 / 8, 1 / 8], rel=1e-11)


def test_drop_policy_admits_until_the_budget_then_contributes_nothing():
    ledger = Ledger(budget=1.0)
    rows = [ledger.admit([9], [[1.2]], noise_std=S) for _ in range(6)]  # charge 0.18 each
    assert [int(r.status[0]) for r in rows] == [ADMITTED] * 5 + [DROPPED]
    assert rows[-1].contributions[0, 0] == 0.0
    assert rows[-1].charge[0] == 0.0
    assert ledger.used([9])[0] == pytest.approx(0.9, rel=1e-10)


def test_a_dropped_user_still_takes_a_smaller_contribution_that_fits():
    ledger = Ledger(budget=1.0)
    ledger.admit([9], [[2.6]], noise_std=S)  # 0.845
    assert ledger.admit([9], [[1.2]], noise_std=S).status[0] == DROPPED  # 0.18 does not fit
    assert ledger.admit([9], [[1.0]], noise_std=S).status[0] == ADMITTED  # 0.125 does


def test_clip_policy_scales_to_the_remaining_budget_exactly():
    ledger = Ledger(budget=1.0)
    ledger.admit([5], [[2.0, 0.0]], noise_std=S)  # 0.5 used
    result = ledger.admit([5], [[3.0, 4.0]], noise_std=S, policy="clip")  # 3.125 wanted, 0.5 left
    assert result.status[0] == CLIPPED
    clipped_norm = float(np.linalg.norm(result.contributions[0]))
    assert clipped_norm == pytest.approx(math.sqrt(2 * S**2 * 0.5), rel=1e-8)
    assert clipped_norm < math.sqrt(2 * S**2 * 0.5)  # shrunk, never stretched
    # Direction is kept: Algorithm 7 rescales, it does not truncate coordinates.
    assert result.contributions[0, 1] / result.contributions[0, 0] == pytest.approx(4 / 3)
    assert ledger.used([5])[0] <= 1.0
    assert ledger.used([5])[0] == pytest.approx(1.0, rel=1e-8)


def test_clip_policy_with_nothing_left_drops():
    ledger = Ledger(budget=1.0)
    ledger.admit([5], [[10.0]], noise_std=S, policy="clip")
    result = ledger.admit([5], [[1.0]], noise_std=S, policy="clip")
    assert result.status[0] == DROPPED
    assert result.contributions[0, 0] == 0.0


def test_a_zero_contribution_is_admitted_free():
    ledger = Ledger(budget=1.0)
    result = ledger.admit([1], [[0.0, 0.0]], noise_std=S)
    assert (int(result.status[0]), float(result.charge[0])) == (ADMITTED, 0.0)
    assert ledger.personal_odometer([1])[0] == 0.0


def test_a_subnormal_contribution_is_charged_more_than_zero():
    ledger = Ledger(budget=1.0)
    result = ledger.admit([1], [[1e-200]], noise_std=S)
    assert result.charge[0] > 0.0


@pytest.mark.parametrize("policy", ["drop", "clip"])
def test_a_huge_contribution_is_dropped_without_overflow(policy):
    ledger = Ledger(budget=1.0)
    with np.errstate(all="raise"):
        result = ledger.admit([1, 2], [[1e200, 1e200], [1.0, 0.0]], noise_std=S, policy=policy)
    assert int(result.status[0]) in (DROPPED, CLIPPED)
    assert np.isfinite(result.contributions).all()
    assert np.linalg.norm(result.contributions[0]) <= math.sqrt(2 * S**2 * 1.0)
    assert result.status[1] == ADMITTED


def test_negative_contributions_are_charged_by_their_norm():
    ledger = Ledger(budget=10.0)
    result = ledger.admit([1, 2], [[-3.0], [3.0]], noise_std=S)
    assert result.charge[0] == result.charge[1]


def test_repeated_ids_in_one_call_are_refused_before_any_change():
    ledger = Ledger(budget=1.0)
    ledger.admit([1], [[1.0]], noise_std=S)
    before = (len(ledger), ledger.used([1, 2]).tolist())
    with pytest.raises(ValueError, match="distinct"):
        ledger.admit([2, 1, 1], [[1.0], [1.0], [1.0]], noise_std=S)
    with pytest.raises(ValueError, match="distinct"):
        ledger.admit([3, 3], [[1.0], [1.0]], noise_std=S)
    assert (len(ledger), ledger.used([1, 2]).tolist()) == before


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_contributions_are_refused_before_any_change(bad):
    ledger = Ledger(budget=1.0)
    with pytest.raises(ValueError, match="finite"):
        ledger.admit([1, 2], [[1.0], [bad]], noise_std=S)
    assert len(ledger) == 0


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(noise_std=0.0), "noise_std"),
        (dict(noise_std=float("nan")), "noise_std"),
        (dict(noise_std=1.0, policy="trim"), "policy"),
    ],
)
def test_bad_admit_parameters_raise_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Ledger(budget=1.0).admit([1], [[1.0]], **kwargs)


def test_bad_ledger_parameters_raise_naming_the_parameter():
    with pytest.raises(ValueError, match="budget"):
        Ledger(budget=0.0)
    with pytest.raises(ValueError, match="id_type"):
        Ledger(budget=1.0, id_type="uuid")
    with pytest.raises(ValueError, match="tracker_step"):
        Ledger(budget=1.0, tracker_step=-1.0)


def test_ids_and_rows_must_have_the_same_length():
    with pytest.raises(ValueError, match="same number of rows"):
        Ledger(budget=1.0).admit([1, 2], [[1.0]], noise_std=S)


def test_string_ids_are_kept_apart_from_int_ids():
    with pytest.raises(ValueError, match="integers"):
        Ledger(budget=1.0).admit(["a"], [[1.0]], noise_std=S)
    with pytest.raises(ValueError, match="strings"):
        Ledger(budget=1.0, id_type="string").admit(pa.array([1]), [[1.0]], noise_std=S)


def test_string_ids_work_like_int_ids():
    ledger = Ledger(budget=1.0, id_type="string")
    ledger.admit(["ana", "bo", "ünï"], [[1.2], [2.0], [0.0]], noise_std=S)
    ledger.admit(pa.array(["bo", "cy"]), [[2.0], [1.0]], noise_std=S)
    assert ledger.used(["ana", "bo", "cy", "ünï", "nobody"]) == pytest.approx(
        [0.18, 0.5, 0.125, 0.0, 0.0], rel=1e-9
    )
    with pytest.raises(ValueError, match="distinct"):
        ledger.admit(["x", "x"], [[1.0], [1.0]], noise_std=S)


def test_a_users_decision_does_not_depend_on_other_users():
    rng = np.random.default_rng(3)
    alone, crowd = Ledger(budget=1.0), Ledger(budget=1.0)
    for _ in range(30):
        row = rng.normal(size=(1, 3))
        others = rng.normal(size=(500, 3)) * rng.uniform(0, 5)
        a = alone.admit([42], row, noise_std=S, policy="clip")
        c = crowd.admit(np.r_[np.arange(1000, 1500), 42], np.vstack([others, row]), noise_std=S, policy="clip")
        assert a.status[0] == c.status[-1]
        assert np.array_equal(a.contributions[0], c.contributions[-1])
    assert alone.used([42])[0] == crowd.used([42])[0]


@pytest.mark.parametrize("policy", ["drop", "clip"])
def test_vectorised_filter_matches_algorithm_3_and_7_written_per_user(policy):
    rng = np.random.default_rng(11)
    ledger, history = Ledger(budget=1.0), {}
    for _ in range(40):
        ids = rng.choice(200, size=80, replace=False)
        rows = rng.exponential(0.6, size=(80, 2)) * (rng.random((80, 1)) < 0.5)
        got = ledger.admit(ids, rows, noise_std=S, policy=policy).status.tolist()
        want = _reference_filter(history, ids.tolist(), rows, budget=1.0, noise_std=S, policy=policy)
        assert got == want
    ids = np.arange(200)
    expected = np.array([float(history.get(i, 0)) for i in ids])
    assert ledger.used(ids) == pytest.approx(expected, rel=1e-9, abs=1e-15)


magnitudes = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.floats(min_value=-1e-300, max_value=1e-300),
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1e150, -1e154, 1e300, 0.1, 0.3, 1.0]),
)


@settings(max_examples=150, deadline=None)
@given(
    budget=st.floats(min_value=1e-6, max_value=1e3),
    noise_std=st.floats(min_value=1e-3, max_value=1e3),
    policy=st.sampled_from(["drop", "clip"]),
    calls=st.lists(
        st.lists(st.tuples(st.integers(0, 6), st.lists(magnitudes, min_size=2, max_size=2)), max_size=8),
        max_size=25,
    ),
)
def test_no_user_ever_exceeds_the_budget_however_the_charges_are_summed(budget, noise_std, policy, calls):
    ledger = Ledger(budget=budget)
    charges: dict[int, list[float]] = {}
    for call in calls:
        rows = {uid: vec for uid, vec in call}  # one row per user per window
        if not rows:
            continue
        ids = np.array(list(rows), dtype=np.int64)
        result = ledger.admit(ids, np.array(list(rows.values())), noise_std=noise_std, policy=policy)
        for uid, charge in zip(ids.tolist(), result.charge.tolist()):
            charges.setdefault(uid, []).append(charge)
        assert np.isfinite(result.contributions).all()
        # What a clipped or admitted row really costs never exceeds what was recorded.
        true_cost = np.einsum("ij,ij->i", result.contributions, result.contributions) / (2 * noise_std**2)
        assert np.all(true_cost <= result.charge * (1 + 1e-12) + 1e-300)
    for uid, spent in charges.items():
        assert ledger.used([uid])[0] <= budget
        assert sum(Fraction(c) for c in spent) <= Fraction(budget)
        assert math.fsum(spent) <= budget
        assert float(np.sum(spent)) <= budget
        assert sum(spent) <= budget
        assert sum(sorted(spent, reverse=True)) <= budget
        assert ledger.personal_odometer([uid])[0] <= budget


def test_thousands_of_windows_never_push_a_user_past_the_budget():
    rng = np.random.default_rng(5)
    budget = 0.3
    ledger = Ledger(budget=budget)
    ids = np.arange(50)
    total = np.zeros(50)
    for _ in range(3000):
        result = ledger.admit(ids, rng.uniform(0, 0.02, size=(50, 1)), noise_std=1.0, policy="clip")
        total += result.charge
    assert np.all(ledger.used(ids) <= budget)
    assert np.all(total <= budget)
    assert np.all(ledger.used(ids) >= total)  # stored used budget is an upper bound of the charges


def test_personal_odometer_bounds_the_used_budget_and_never_exceeds_kappa():
    ledger = Ledger(budget=1.0, tracker_step=0.1)
    ledger.admit([1, 2, 3], [[0.5], [1.5], [0.0]], noise_std=1.0)
    ledger.admit([1, 2], [[0.9], [1.5]], noise_std=1.0)
    odometer = ledger.personal_odometer([1, 2, 3, 99])
    used = ledger.used([1, 2, 3, 99])
    assert np.all(odometer >= used)
    assert np.all(odometer <= 1.0)
    assert odometer[2] == 0.0 and odometer[3] == 0.0
    # User 1 spent 0.125 + 0.405 = 0.53: six filters of 0.1.
    assert odometer[0] == pytest.approx(0.6)


def test_personal_epsilon_converts_the_odometer_with_the_named_accounting():
    ledger = Ledger(budget=1.0)
    ledger.admit([1], [[0.5]], noise_std=1.0)
    eps_gdp = ledger.personal_epsilon([1], delta=1e-6, accounting="gdp")[0]
    eps_thm49 = ledger.personal_epsilon([1], delta=1e-6, accounting="zcdp-thm49")[0]
    assert 0 < eps_gdp < eps_thm49


def test_counts_tally_each_status():
    ledger = Ledger(budget=1.0)
    ledger.admit([1], [[2.0]], noise_std=1.0, policy="clip")  # user 1 exhausts the budget
    result = ledger.admit([1, 2, 3], [[2.0], [0.1], [5.0]], noise_std=1.0, policy="clip")
    assert result.counts() == {"admitted": 1, "clipped": 1, "dropped": 1}


@pytest.mark.parametrize("id_type,ids", [("int64", [5, -3, 2**40]), ("string", ["b", "a", "é"])])
def test_snapshot_round_trips_and_continues_identically(id_type, ids):
    ledger = Ledger(budget=1.0, id_type=id_type)
    ledger.admit(ids, [[1.0], [0.3], [1.2]], noise_std=1.0)
    table = ledger.to_arrow()
    assert table.column("user_id").to_pylist() == sorted(ids)
    restored = Ledger.from_arrow(table)
    assert restored.used(ids).tolist() == ledger.used(ids).tolist()
    a = ledger.admit(ids, [[0.7], [0.7], [0.7]], noise_std=1.0)
    b = restored.admit(ids, [[0.7], [0.7], [0.7]], noise_std=1.0)
    assert a.status.tolist() == b.status.tolist()
    assert restored.personal_odometer(ids).tolist() == ledger.personal_odometer(ids).tolist()


def _snapshot() -> pa.Table:
    ledger = Ledger(budget=1.0)
    ledger.admit([1, 2], [[1.0], [0.5]], noise_std=1.0)
    return ledger.to_arrow()


@pytest.mark.parametrize(
    "corrupt,message",
    [
        (lambda t: t.set_column(1, "used", pa.array([0.5, 2.0])), "used budgets"),
        (lambda t: t.set_column(1, "used", pa.array([0.5, None], type=pa.float64())), "nulls"),
        (lambda t: t.drop_columns(["tracker_bound"]), "missing columns"),
        (lambda t: t.replace_schema_metadata({}), "version"),
        (lambda t: t.set_column(0, "user_id", pa.array([1, 1])), "distinct"),
        (lambda t: t.set_column(3, "tracker_bound", pa.array([0.0, 0.0])), "trackers"),
    ],
)
def test_a_corrupted_snapshot_is_refused(corrupt, message):
    table = _snapshot()
    corrupted = corrupt(table)
    if corrupted.schema.metadata is None and message != "version":
        corrupted = corrupted.replace_schema_metadata(table.schema.metadata)
    with pytest.raises(ValueError, match=message):
        Ledger.from_arrow(corrupted)


def test_the_ledger_grows_to_a_million_users_with_correct_lookups():
    rng = np.random.default_rng(0)
    ids = rng.choice(2**62, size=1_000_000, replace=False).astype(np.int64)
    ledger = Ledger(budget=1.0)
    ledger.admit(ids[:400_000], np.full((400_000, 1), 0.5), noise_std=1.0)
    ledger.admit(ids, np.full((1_000_000, 1), 0.5), noise_std=1.0)
    used = ledger.used(ids[::1000])
    expected = np.where(np.arange(0, 1_000_000, 1000) < 400_000, 0.25, 0.125)
    assert used == pytest.approx(expected, rel=1e-10)
    assert len(ledger) == 1_000_000
