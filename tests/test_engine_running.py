"""Running totals in the Beam-free engine (issue 20): per-user prepaid rows on a shard
(:class:`renyi_stream.stream.engine.running.PrepaidUsers`), the query's one release state
(:class:`renyi_stream.stream.engine.running.RunningRelease`), and :meth:`ShardState.charge_window` reading only
the window's users and charging window vectors and prepaid terms in one decision."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from renyi_stream.queries.linear import LinearQuery
from renyi_stream.stream.continual.prepaid import prepaid_rho, running_rule
from renyi_stream.stream.engine.running import MIGRATION, OldRunningFormatError, PrepaidUsers, RunningRelease
from renyi_stream.stream.engine.shard_state import QueryPlan, ShardSnapshots, ShardState
from renyi_stream.stream.ledger import Ledger

W0 = 20_000
S = 2.0
RUNNING = LinearQuery.columns("running:x", ["x"], kind="running")
WINDOW = LinearQuery.columns("sum:x", ["x"])
PLAN = QueryPlan.starting_at([RUNNING, WINDOW], W0)


def _rows(window: int, users, values) -> pa.Table:
    return pa.table({"user_id": pa.array(users, pa.int64()), "window_id": pa.array([window] * len(users), pa.int64()),
                     "x": pa.array(values, pa.float64())})


def test_a_window_reads_and_writes_only_its_own_users_prepaid_rows():
    shard = ShardState(PLAN, Ledger(budget=100.0))
    shard.charge_window(W0, _rows(W0, [1, 2, 3], [1.0, 1.0, 1.0]), noise_std=S, policy="drop")
    before = shard.running["running:x"].to_arrow()
    charged = shard.charge_window(W0 + 5, _rows(W0 + 5, [3, 4], [1.0, 2.0]), noise_std=S, policy="drop")
    assert charged.state_rows_read == {"running:x": 2}
    after = shard.running["running:x"].to_arrow()
    last = dict(zip(after.column("user_id").to_pylist(), after.column("last_window").to_pylist()))
    assert last == {1: W0, 2: W0, 3: W0 + 5, 4: W0 + 5}
    # users 1 and 2 had no row: their state is bit for bit what it was
    assert after.slice(0, 2).equals(before.slice(0, 2))
    np.testing.assert_array_equal(charged.sums["running:x"], [3.0])  # a_t: the admitted sum, d numbers


def test_the_charge_is_the_window_vector_plus_the_prepaid_charge_of_the_running_contribution():
    shard = ShardState(PLAN, Ledger(budget=100.0))
    shard.charge_window(W0, _rows(W0, [1], [2.0]), noise_std=S, policy="drop")
    used = shard.ledger.used([1])[0]
    rule = running_rule("blt", 365)
    expected = 4.0 / (2 * S * S) + prepaid_rho(rule.charge_terms(rule.new_users(1, 1), np.array([[2.0]]), 0),
                                               noise_std=S)[0]
    assert used == pytest.approx(expected, rel=1e-8) and used >= expected * (1 - 1e-15)


def test_under_clip_one_scale_applies_to_the_window_sum_and_to_the_contribution_kept_in_state():
    shard = ShardState(PLAN, Ledger(budget=1.0))
    charged = shard.charge_window(W0, _rows(W0, [1, 2], [0.5, 10.0]), noise_std=S, policy="clip")
    assert charged.counts["clipped"] == 1
    state = shard.running["running:x"].to_arrow()
    buffers = dict(zip(state.column("user_id").to_pylist(), state.column("values").to_pylist()))
    lam = (charged.sums["sum:x"][0] - 0.5) / 10.0  # the clipped user's scale, from the window sum
    assert 0 < lam < 1
    np.testing.assert_allclose(buffers[2], [10.0 * lam] * 4, rtol=1e-12)  # S_j(1) = lambda x for every buffer
    np.testing.assert_allclose(charged.sums["running:x"], charged.sums["sum:x"], rtol=1e-15)


def test_a_user_over_budget_loses_that_day_and_keeps_their_past_state():
    shard = ShardState(PLAN, Ledger(budget=2.0))
    shard.charge_window(W0, _rows(W0, [1], [1.0]), noise_std=S, policy="drop")
    before = shard.running["running:x"].to_arrow()
    used = shard.ledger.used([1])
    charged = shard.charge_window(W0 + 1, _rows(W0 + 1, [1], [50.0]), noise_std=S, policy="drop")
    assert charged.counts["dropped"] == 1
    np.testing.assert_array_equal(charged.sums["running:x"], [0.0])
    assert shard.running["running:x"].to_arrow().equals(before)
    np.testing.assert_array_equal(shard.ledger.used([1]), used)


def test_a_row_already_admitted_in_a_later_window_is_refused_before_anything_changes():
    shard = ShardState(PLAN, Ledger(budget=100.0))
    shard.charge_window(W0 + 3, _rows(W0 + 3, [1], [1.0]), noise_std=S, policy="drop")
    used = shard.ledger.used([1])
    with pytest.raises(ValueError, match="in window order"):
        shard.charge_window(W0 + 2, _rows(W0 + 2, [1], [1.0]), noise_std=S, policy="drop")
    np.testing.assert_array_equal(shard.ledger.used([1]), used)


def test_a_shard_snapshot_round_trips_and_continues_bit_for_bit():
    shards = ShardSnapshots(plan=PLAN, budget=100.0, id_type="int64", tracker_step=1.0)
    original = shards.restore([])
    original.charge_window(W0, _rows(W0, [1, 2], [1.0, 3.0]), noise_std=S, policy="drop")
    restored = shards.restore(shards.snapshot(original))
    rows = _rows(W0 + 4, [2, 7], [1.5, 1.0])
    a = original.charge_window(W0 + 4, rows, noise_std=S, policy="drop")
    b = restored.charge_window(W0 + 4, rows, noise_std=S, policy="drop")
    assert all(np.array_equal(a.sums[q], b.sums[q]) for q in a.sums)
    assert original.ledger.to_arrow().equals(restored.ledger.to_arrow())
    assert original.running["running:x"].to_arrow().equals(restored.running["running:x"].to_arrow())


def _state_table() -> pa.Table:
    users = PrepaidUsers(running_rule("blt", 365), strategy="blt", dim=1, start_window=W0)
    rule = users.rule
    positions = users.positions(np.array([1, 2]))
    users.put(np.array([1, 2]), positions, rule.admit(users.gather(positions), np.array([[1.0], [2.0]]), 0))
    return users.to_arrow()


def _with_meta(table: pa.Table, **changes: str) -> pa.Table:
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    return table.replace_schema_metadata({**meta, **changes})


@pytest.mark.parametrize("corrupt, message", [
    (lambda t: pa.concat_tables([t, t]), "repeats a user"),
    (lambda t: t.set_column(2, "values", pa.FixedSizeListArray.from_arrays(
        pa.array([np.nan] * 8), 4)), "non-finite"),
    (lambda t: t.set_column(1, "last_window", pa.array([W0 - 1, W0], pa.int64())), "outside the schedule"),
    (lambda t: t.set_column(1, "last_window", pa.array([W0 + 365, W0], pa.int64())), "outside the schedule"),
    (lambda t: _with_meta(t, strategy=json.dumps({"name": "blt", "theta": [0.5], "omega": [0.1],
                                                  "horizon": 365})), "refusing it"),
    (lambda t: _with_meta(t, width="3"), "refusing it"),
    (lambda t: t.drop_columns(["last_window"]), "missing columns"),
    (lambda t: _with_meta(t, **{"renyi_stream.running_version": "3"}), "version must be 2"),
])
def test_an_inconsistent_prepaid_state_is_refused_loudly(corrupt, message):
    with pytest.raises(ValueError, match=message):
        PrepaidUsers.from_arrow(corrupt(_state_table()))


def test_a_history_snapshot_of_the_old_format_is_refused_with_how_to_migrate():
    old = _with_meta(_state_table(), **{"renyi_stream.running_version": "1"})
    with pytest.raises(OldRunningFormatError) as info:
        PrepaidUsers.from_arrow(old)
    assert MIGRATION in str(info.value) and "query retire" in MIGRATION


def _release(horizon=365) -> RunningRelease:
    return RunningRelease(running_rule("blt", horizon), query_id="running:x", strategy="blt", dim=1, start_window=W0)


def test_the_release_refuses_a_window_out_of_order():
    release = _release()
    release.release(W0, np.array([1.0]))
    for window in (W0, W0 + 2):
        with pytest.raises(ValueError, match=f"releases window {W0 + 1} next, got window {window}"):
            release.release(window, np.array([1.0]))


def test_the_release_refuses_a_window_past_the_declared_schedule_by_name():
    release = _release(horizon=2)
    release.release(W0, np.array([1.0]))
    release.release(W0 + 1, np.array([1.0]))
    with pytest.raises(ValueError, match="declared for 2 windows .* past its schedule"):
        release.release(W0 + 2, np.array([1.0]))


def test_a_restored_release_state_continues_bit_for_bit():
    straight, stopped = _release(), _release()
    a = np.random.default_rng(3).normal(size=(6, 1))
    for t in range(3):
        straight.release(W0 + t, a[t])
        stopped.release(W0 + t, a[t])
    restored = RunningRelease.from_arrow(stopped.to_arrow())
    for t in range(3, 6):
        np.testing.assert_array_equal(straight.release(W0 + t, a[t]), restored.release(W0 + t, a[t]))
    # and the totals are C a: the BLT's encoder, window by window
    c = running_rule("blt", 365).strategy.query_matrix(6)
    again = _release()
    np.testing.assert_allclose(np.concatenate([again.release(W0 + t, a[t]) for t in range(6)]), c @ a, rtol=1e-12)


def test_a_release_state_past_its_schedule_or_malformed_is_refused():
    table = _release(horizon=2).to_arrow()
    with pytest.raises(ValueError, match="outside its schedule"):
        RunningRelease.from_arrow(_with_meta(table, next_window=str(W0 + 3)))
    with pytest.raises(ValueError, match="must hold 4 rows"):
        RunningRelease.from_arrow(table.slice(0, 3))


