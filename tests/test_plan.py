"""``renyi-stream plan`` (issue 39, item 3): windows lasted as the real ledger counts them, the
worst case, a sample's shares still in, clamps that keep a chosen share in, the curator-only
heading, bad parameters, and the issue's trial (heavy users filtered in days; the suggestion keeps
the share and the sums flat)."""

from __future__ import annotations

import datetime as dt
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.cli.plan import charged_bounds, read_sample
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.contract import InputContract
from renyi_stream.stream.ledger import ADMITTED, Ledger
from renyi_stream.stream.planning import (ColumnBound, Sample, capped, charge_threshold, clamped, filter_cap,
                                          make_plan, sample_shares, sq_norm_at_bounds, suggest_clamps, user_charges,
                                          windows_lasted, worst_case_windows)
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE

DAY = dt.date(2026, 3, 1)
PROMISE = ["--epsilon", "1", "--delta", "1e-6"]


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        status = main(["plan", *argv])
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _write_day(path, columns: dict[str, np.ndarray], *, ids=None, days=None) -> str:
    n = len(next(iter(columns.values())))
    ids = np.arange(n) if ids is None else ids
    table = {"user_id": pa.array(ids, pa.int64()),
             "day": pa.array([DAY] * n if days is None else days, pa.date32())}
    table.update({name: pa.array(np.asarray(v, dtype=np.float64)) for name, v in columns.items()})
    pq.write_table(pa.table(table), path)
    return str(path)


def _ledger_lasted(rows: np.ndarray, cal, windows: int) -> np.ndarray:
    """Windows each user (one row each, the same every window) is admitted in a row by the real
    ledger, driven window by window (at most ``windows``)."""
    ledger = Ledger(budget=cal.rho)
    ids = np.arange(rows.shape[0])
    lasted = np.zeros(rows.shape[0], dtype=np.int64)
    alive = np.ones(rows.shape[0], dtype=bool)
    for _ in range(windows):
        if not alive.any():
            break
        result = ledger.admit(ids[alive], rows[alive], noise_std=cal.noise_std)
        admitted = np.asarray(result.status) == ADMITTED
        where = np.flatnonzero(alive)
        lasted[where[admitted]] += 1
        alive[where[~admitted]] = False
    return lasted


# --------------------------------------------------------------------------- windows lasted


@pytest.mark.parametrize("budget, row", [
    (10.0, [1.0]),  # B / c^2 = 10 exactly: the calibration's headroom gives all 10 windows
    (1000.0, [20.0, 3.0]), (1000.0, [3.0, 0.0]), (100.0, [0.3, 0.1]), (7.0, [0.7, 0.7, 0.7]),
    (1.0, [1.0]), (0.5, [1.0]),  # a user at the bound who fits once, and one who never fits
    (3.0, [0.1]),  # 0.3 / 0.01: a ratio whose floats do not divide evenly
])
def test_windows_lasted_equals_the_real_ledgers_count_for_a_constant_contribution(budget, row):
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=budget)
    bounds = tuple(ColumnBound(f"c{i}", 0.0, 100.0) for i in range(len(row)))
    planned = make_plan(cal, bounds, 30, [("u", row)]).typical[0].individual
    counted = int(_ledger_lasted(np.array([row]), cal, 400_000)[0])
    assert planned == counted


def test_windows_lasted_equals_the_real_ledgers_count_for_many_random_users():
    rng = np.random.default_rng(3)
    cal = calibrate(epsilon=0.5, delta=1e-5, norm_budget=300.0, accounting="zcdp-cks")
    rows = np.round(rng.uniform(0.0, 6.0, size=(400, 3)), rng.integers(0, 4))
    rows[:20] = np.sqrt(300.0 / np.arange(1, 21))[:, None] / np.sqrt(3)  # B / c^2 = 1..20, up to rounding
    bounds = [ColumnBound(c, 0, 100) for c in "abc"]
    charges = user_charges(Sample.from_rows(np.arange(400), np.zeros(400), rows), bounds, cal.noise_std)
    planned = [windows_lasted(c, filter_cap(cal.rho)) for c in charges]
    counted = _ledger_lasted(rows, cal, 100_000)
    assert planned == [int(n) for n in counted]


def test_the_plans_filter_cap_is_the_ledgers():
    for rho in (0.0280145, 1e-300, 3.7, 1e6):
        assert filter_cap(rho) == Ledger(budget=rho)._cap


def test_a_charge_threshold_separates_the_users_who_last_from_those_who_do_not():
    cap = filter_cap(calibrate(epsilon=1.0, delta=1e-6, norm_budget=1000.0).rho)
    for windows in (1, 7, 30, 365):
        threshold = charge_threshold(windows, cap)
        assert windows_lasted(threshold, cap, limit=windows) is None or windows_lasted(threshold, cap) >= windows
        assert windows_lasted(float(np.nextafter(threshold, np.inf)), cap) < windows


def test_a_user_who_gives_nothing_is_never_filtered_and_a_tiny_one_lasts_past_the_limit():
    cap = filter_cap(0.01)
    assert windows_lasted(0.0, cap) is None
    assert windows_lasted(1e-20, cap) is None


# --------------------------------------------------------------------------- worst case


@pytest.mark.parametrize("budget, his, expected", [
    (1000.0, (20.0, 3.0), 2),  # 1000 / 409
    (409.0, (20.0, 3.0), 1), (818.0, (20.0, 3.0), 2),  # exact multiples
    (100.0, (1.0,), 100), (0.5, (1.0,), 0),
    (36.0, (2.0, 2.0, 2.0), 3),
])
def test_worst_case_windows_is_floor_of_the_budget_over_the_squared_bound(budget, his, expected):
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=budget)
    bounds = tuple(ColumnBound(f"c{i}", 0.0, hi) for i, hi in enumerate(his))
    plan = make_plan(cal, bounds, 30, [("typical", [0.5] * len(his))])
    assert plan.sq_norm_bound == sum(h * h for h in his)
    assert plan.worst_case == expected == math.floor(budget / sum(h * h for h in his))
    assert plan.typical[0].worst_case == expected  # whatever they give


def test_the_bound_of_a_column_below_zero_is_its_largest_magnitude():
    assert sq_norm_at_bounds([ColumnBound("a", -5.0, 1.0), ColumnBound("b", 0.0, 2.0)]) == 29.0
    assert worst_case_windows(58.0, 29.0) == 2


def test_the_plan_prints_the_worst_case_and_the_individual_windows(capsys):
    status, out, err = _plan(capsys, *PROMISE, "--norm-budget", "1000", "--days", "30", "--id-type", "int64",
                             "--column", "sessions=0:20", "--column", "purchases=0:3", "--contribution", "sessions=3")
    assert status == 0, err
    flat = " ".join(out.split())
    assert "at the bounds 409 2 2" in flat and "sessions=3 9 111 2" in flat
    assert "floor(B / C^2) = 2 windows" in flat
    assert f"Noise std per window: {calibrate(epsilon=1, delta=1e-6, norm_budget=1000).noise_std:.6g}" in flat
    assert CURATOR_ONLY_NOTICE not in out  # no sample: nothing private


# --------------------------------------------------------------------------- a sample


def test_the_sample_shares_are_the_ones_counted_by_hand(tmp_path, capsys):
    # B = 100, x clamped to [0, 10]: x = 10, 5, 2, 1, 0 cost 100, 25, 4, 1, 0 a day, so they last
    # 1, 4, 25, 100 and every day. Three of five are in after 7 days, two after 30, 90 and 100.
    path = _write_day(tmp_path / "day.parquet", {"x": [10.0, 5.0, 2.0, 1.0, 0.0]})
    contract = InputContract.from_options(id_type="int64", columns=["x=0:10"])
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=100.0)
    bounds = charged_bounds(contract)
    shares = sample_shares(read_sample(path, contract, bounds), bounds, cal, (1, 4, 5, 7, 25, 26, 30, 90, 100, 101))
    assert shares.still_in == (5, 4, 3, 3, 3, 2, 2, 2, 2, 1)
    status, out, _ = _plan(capsys, *PROMISE, "--norm-budget", "100", "--days", "100", "--id-type", "int64",
                           "--column", "x=0:10", "--sample", path)
    assert status == 0
    flat = " ".join(out.split())
    for line in ("after 7 days: 60.00% (3 of 5)", "after 30 days: 40.00% (2 of 5)",
                 "after 90 days: 40.00% (2 of 5)", "after 100 days: 40.00% (2 of 5)"):
        assert line in flat


def test_the_sample_shares_agree_with_the_real_ledger(tmp_path):
    rng = np.random.default_rng(11)
    n = 2000
    columns = {"a": rng.poisson(1.0, n) * 1.0, "b": rng.uniform(-3.0, 8.0, n), "c": (rng.random(n) < 0.3) * 1.0}
    path = _write_day(tmp_path / "day.parquet", columns)
    contract = InputContract.from_options(id_type="int64", columns=["c=0:1", "a=0:4", "b=-2:6"])
    cal = calibrate(epsilon=0.7, delta=1e-6, norm_budget=200.0)
    bounds = charged_bounds(contract)
    sample = read_sample(path, contract, bounds)
    shares = sample_shares(sample, bounds, cal, (1, 7, 30, 90))
    rows = clamped(np.column_stack([columns[b.name] for b in bounds]), bounds)  # the job's row, in its order
    lasted = _ledger_lasted(rows, cal, 91)
    assert shares.still_in == tuple(int(np.count_nonzero(lasted >= d)) for d in (1, 7, 30, 90))


def test_a_repeated_user_day_keeps_its_first_row_and_counts_the_rest_as_rejected(tmp_path):
    path = _write_day(tmp_path / "day.parquet", {"x": [1.0, 9.0, 2.0]}, ids=np.array([7, 7, 8]))
    contract = InputContract.from_options(id_type="int64", columns=["x=0:10"])
    sample = read_sample(path, contract, charged_bounds(contract))
    assert (sample.users, sample.days, sample.rows_read, sample.rejected) == (2, 1, 3, 1)
    assert sorted(sample.values[:, 0]) == [1.0, 2.0]


def test_a_sample_of_several_days_charges_each_users_mean_squared_norm_per_day(tmp_path):
    days = [DAY, DAY + dt.timedelta(days=1), DAY]
    path = _write_day(tmp_path / "days.parquet", {"x": [4.0, 2.0, 3.0]}, ids=np.array([1, 1, 2]), days=days)
    contract = InputContract.from_options(id_type="int64", columns=["x=0:10"])
    bounds = charged_bounds(contract)
    sample = read_sample(path, contract, bounds)
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=100.0)
    charges = user_charges(sample, bounds, cal.noise_std)
    assert sample.days == 2
    np.testing.assert_allclose(charges, np.array([(16 + 4) / 2, 9 / 2]) / (2 * cal.noise_std ** 2), rtol=1e-9)


def test_a_csv_sample_with_text_ids_counts_its_bad_rows_and_lines_as_rejected(tmp_path):
    path = tmp_path / "day.csv"
    path.write_text('user_id,day,x,tier\nalice,2026-03-01,3,a\nbob,2026-03-01,abc,b\ncarol,2026-03-01,9,c\n'
                    'alice,2026-03-01,1,a\n"broken\n')
    contract = InputContract.from_options(id_type="string", columns=["x=0:10"], categories=["tier"])
    sample = read_sample(str(path), contract, charged_bounds(contract))
    assert (sample.rows_read, sample.rejected, sample.users) == (5, 3, 2)  # abc, a repeated alice, a broken line
    assert sorted(sample.values[:, 0]) == [3.0, 9.0]


def test_a_sample_without_valid_rows_plans_nothing_and_says_so(tmp_path, capsys):
    (tmp_path / "empty.csv").write_text("user_id,day,x\n")
    argv = [*PROMISE, "--norm-budget", "100", "--id-type", "int64", "--column", "x=0:10",
            "--sample", str(tmp_path / "empty.csv")]
    status, out, _ = _plan(capsys, *argv)
    assert status == 0 and "No valid rows: nothing to plan from." in out and "after" not in out.split(
        CURATOR_ONLY_NOTICE)[1]
    status, out, _ = _plan(capsys, *argv, "--quiet")
    assert status == 0 and out.rstrip().endswith("no clamps to suggest (from the sample, keep 0.9 through 90 days)")


# --------------------------------------------------------------------------- clamps


def _sample_with(bounds, rows) -> Sample:
    return Sample.from_rows(np.arange(len(rows)), np.zeros(len(rows)), np.asarray(rows, dtype=np.float64))


@pytest.mark.parametrize("keep, days", [(0.5, 30), (0.9, 30), (0.99, 90), (1.0, 7)])
def test_the_suggested_clamps_keep_the_chosen_share(keep, days):
    rng = np.random.default_rng(5)
    n = 3000
    rows = np.column_stack([rng.exponential(3.0, n), rng.poisson(0.3, n), rng.uniform(-9.0, 2.0, n)])
    bounds = (ColumnBound("a", 0.0, 30.0), ColumnBound("b", 0.0, 2.0), ColumnBound("c", -10.0, 2.0))
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=500.0)
    sample = _sample_with(bounds, rows)
    suggestion = suggest_clamps(sample, bounds, cal, days=days, keep=keep)
    assert suggestion.found and suggestion.level is not None
    # recomputed from the printed flags, by the real ledger over the horizon
    printed = re.findall(r"--column (\S+)", suggestion.flags())
    again = tuple(ColumnBound(b.name, b.lo, b.hi)
                  for b in InputContract.from_options(id_type="int64", columns=printed).bounded)
    assert again == suggestion.bounds
    lasted = _ledger_lasted(clamped(rows, again), cal, days)
    assert np.count_nonzero(lasted >= days) == suggestion.kept >= keep * n
    assert suggestion.declared_kept < keep * n
    # the highest such level (to its three digits): one step up keeps fewer
    step = 10.0 ** (math.floor(math.log10(suggestion.level)) - 2)
    higher = capped(bounds, suggestion.level + 2 * step)
    assert np.count_nonzero(_ledger_lasted(clamped(rows, higher), cal, days) >= days) < keep * n


def test_no_clamp_is_suggested_when_the_declared_bounds_already_keep_the_share():
    bounds = (ColumnBound("a", 0.0, 1.0),)
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=100.0)
    suggestion = suggest_clamps(_sample_with(bounds, [[1.0], [0.0]]), bounds, cal, days=30)
    assert suggestion.level is None and suggestion.bounds == bounds and suggestion.kept == 2


def test_no_clamp_is_suggested_when_a_bound_away_from_zero_sets_a_floor():
    bounds = (ColumnBound("a", 2.0, 5.0),)  # every user costs at least 4 a day: 100 / 4 = 25 days
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=100.0)
    suggestion = suggest_clamps(_sample_with(bounds, [[5.0]] * 10), bounds, cal, days=30)
    assert not suggestion.found


def test_a_column_within_the_level_keeps_its_declared_bound():
    bounds = (ColumnBound("big", 0.0, 50.0), ColumnBound("small", 0.0, 1.0))
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=300.0)
    suggestion = suggest_clamps(_sample_with(bounds, [[50.0, 1.0]] * 5 + [[0.0, 1.0]] * 5), bounds, cal, days=30)
    assert suggestion.bounds[1] == bounds[1] and 1.0 < suggestion.bounds[0].hi < 50.0


# --------------------------------------------------------------------------- the curator-only heading


def test_the_curator_only_heading_precedes_any_count(tmp_path, capsys):
    path = _write_day(tmp_path / "day.parquet", {"x": [10.0, 5.0, 2.0, 1.0, 0.0, 3.0, 4.0]})
    argv = [*PROMISE, "--norm-budget", "100", "--days", "30", "--id-type", "int64", "--column", "x=0:10"]
    _, public, _ = _plan(capsys, *argv)
    status, out, _ = _plan(capsys, *argv, "--sample", path, "--keep", "0.9")
    assert status == 0
    head, notice, private = out.partition(CURATOR_ONLY_NOTICE)
    assert notice and head.rstrip("\n") == public.rstrip("\n")  # nothing of the sample before the heading
    assert "rows read" in private and "of 7)" in private and "--column x=0:" in private
    status, quiet, _ = _plan(capsys, *argv, "--sample", path, "--quiet")
    assert status == 0 and CURATOR_ONLY_NOTICE not in quiet
    flags = re.compile(r"suggested clamps \(from the sample, keep 0\.9 through 30 days\): --column x=0:[\d.]+\n")
    assert quiet.startswith(public) and flags.fullmatch(quiet[len(public):].lstrip("\n"))


# --------------------------------------------------------------------------- bad parameters

BASE = [*PROMISE, "--norm-budget", "100", "--id-type", "int64", "--column", "x=0:10", "--column", "y"]


def _set(argv, option, value):
    out = list(argv)
    i = out.index(option)
    return out[:i] + out[i + 2:] if value is None else out[:i + 1] + [value] + out[i + 2:]


@pytest.mark.parametrize("argv, option", [
    *[(_set(BASE, "--epsilon", v), "--epsilon") for v in ("0", "-1", "nan", "x")],
    *[(_set(BASE, "--delta", v), "--delta") for v in ("0", "1", "x")],
    *[(_set(BASE, "--norm-budget", v), "--norm-budget") for v in ("0", "-5", "inf")],
    (BASE + ["--accounting", "x"], "--accounting"),
    *[(BASE + ["--days", v], "--days") for v in ("0", "-1", "36501", "x", "1.5")],
    *[(BASE + ["--contribution", v], "--contribution") for v in
      ("x", "x=", "x=abc", "x=nan", "x=inf", "z=1", "y=1", "x=1,x=2", "=1", "x=1,,")],
    (BASE + ["--keep", "0.5"], "--keep"),  # without --sample
    *[(BASE + ["--sample", "{t}/day.parquet", "--keep", v], "--keep") for v in ("0", "-0.1", "1.5", "nan", "x")],
    (BASE + ["--sample", "{t}/missing.parquet"], "--sample"),
    (BASE + ["--sample", "{t}/day.txt"], "--sample"),
    (BASE + ["--sample", "{t}/no-x.parquet"], "--sample"),
    (_set(_set(BASE, "--column", "x=5:1"), "--column", "y"), "--column"),
    ([*PROMISE, "--norm-budget", "100"], "--column"),  # no contract
    ([*PROMISE, "--norm-budget", "100", "--id-type", "int64", "--column", "y"], "--column"),  # nothing bounded
    ([*PROMISE, "--norm-budget", "100", "--column", "x=0:1"], "--id-type"),
    ([*PROMISE, "--norm-budget", "100", "--id-type", "int64", "--column", "x=0:1", "--column", "x=0:2"], "--column"),
    ([*PROMISE, "--norm-budget", "100", "--schema", "{t}/missing.json"], "--schema"),
    (BASE + ["--schema", "{t}/missing.json"], "--schema"),
])
def test_a_bad_parameter_exits_2_naming_the_option(tmp_path, capsys, argv, option):
    _write_day(tmp_path / "day.parquet", {"x": [1.0], "y": [2.0]})
    _write_day(tmp_path / "no-x.parquet", {"y": [2.0]})
    (tmp_path / "day.txt").write_text("user_id,day,x\n1,2026-03-01,1\n")
    status, out, err = _plan(capsys, *[a.format(t=tmp_path) for a in argv])
    assert status == 2, (out, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("renyi-stream plan: error:") and option in last and "Traceback" not in err, err
    assert out == ""


def test_a_bad_contribution_names_the_value_and_the_columns_allowed(capsys):
    status, _, err = _plan(capsys, *BASE, "--contribution", "y=3")
    assert status == 2 and "'y' is declared without a bound" in err and "['x']" in err and "y=3" in err


# --------------------------------------------------------------------------- the trial


def _trial_day(n: int = 5000, heavy_share: float = 0.15, seed: int = 39) -> dict[str, np.ndarray]:
    """A day of the trial: 5,000 users, ``sessions`` 0-20 (most users a few, heavy ones 15-20),
    ``purchases`` 0-3 (rare)."""
    rng = np.random.default_rng(seed)
    heavy = rng.random(n) < heavy_share
    sessions = np.where(heavy, rng.integers(15, 21, n), np.minimum(rng.poisson(0.5, n), 20)).astype(float)
    purchases = np.where(rng.random(n) < 0.05, rng.integers(1, 4, n), 0).astype(float)
    return {"sessions": sessions, "purchases": purchases}


def test_the_trial_heavy_users_last_days_and_the_suggestion_keeps_the_share_and_the_sums_flat(tmp_path, capsys):
    day = _trial_day()
    path = _write_day(tmp_path / "day.parquet", day)
    argv = [*PROMISE, "--norm-budget", "1000", "--days", "30", "--id-type", "int64", "--column", "sessions=0:20",
            "--column", "purchases=0:3", "--contribution", "sessions=20,purchases=1", "--sample", path, "--keep", "0.9"]
    status, out, err = _plan(capsys, *argv)
    assert status == 0, err
    flat = " ".join(out.split())
    heavy = int(re.search(r"sessions=20,purchases=1 401 (\d+) 2", flat).group(1))
    assert heavy <= 3  # a heavy user is filtered within days under the declared bounds
    after_7 = float(re.search(r"after 7 days: ([\d.]+)%", flat).group(1)) / 100
    assert after_7 < 0.9  # the heavy users are gone within a week
    flags = re.search(r"(--column sessions=\S+ --column purchases=\S+)", out.split(CURATOR_ONLY_NOTICE)[1]).group(1)
    contract = InputContract.from_options(id_type="int64", columns=re.findall(r"--column (\S+)", flags))
    bounds = charged_bounds(contract)
    assert dict((b.name, b.hi) for b in bounds)["purchases"] == 3.0  # the small column keeps its bound
    # Every day as the sample, through the real ledger: the suggestion keeps >= 90% in for 30 days
    # and the admitted sum of sessions flat; the declared bounds lose the heavy users by day 3.
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=1000.0)
    raw = np.column_stack([day[b.name] for b in bounds])
    declared = charged_bounds(InputContract.from_options(id_type="int64", columns=["sessions=0:20", "purchases=0:3"]))
    sums = {}
    for name, with_bounds in (("declared", declared), ("suggested", bounds)):
        rows = clamped(raw, with_bounds)
        lasted = _ledger_lasted(rows, cal, 30)
        s = [b.name for b in with_bounds].index("sessions")
        sums[name] = [rows[lasted >= d, s].sum() for d in (1, 30)]
        if name == "suggested":
            assert np.count_nonzero(lasted >= 30) >= 0.9 * len(lasted)
    assert sums["suggested"][1] >= 0.95 * sums["suggested"][0]
    assert sums["declared"][1] <= 0.5 * sums["declared"][0]
