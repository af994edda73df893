"""Personal privacy reports from the curator's ledger (issue 4), against a hand-computed odometer."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import norm

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.store import CuratorStore
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.pipelines.curator.privacy_report import privacy_report
from renyi_stream.queries.release_store import RELEASE_SCHEMA
from renyi_stream.stream.accounting import calibrate, epsilon_for_budget
from renyi_stream.stream.engine.ledger_config import LedgerConfig
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.schema import REJECTED_SCHEMA

from declared import contract

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
B = 10.0


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    paths = []
    for day in range(2):  # user 7 contributes 1 on both days, user 8 on day 0 only, user 9 nothing
        path = tmp / f"d{day}.parquet"
        users = [7, 8, 9] if day == 0 else [7, 9]
        opened = [1.0, 1.0, 0.0] if day == 0 else [1.0, 0.0]
        pq.write_table(pa.table({"user_id": pa.array(users, type=pa.int64()),
                                 "day": pa.array([DAY0 + dt.timedelta(days=day)] * len(users), type=pa.date32()),
                                 "opened": pa.array(opened)}), path)
        paths.append(str(path))
    config = JobConfig(inputs=tuple(paths), store=str(tmp / "s.duckdb"), ledger=str(tmp / "l.duckdb"), epsilon=1.0,
                       delta=1e-6, norm_budget=B, start_window=W0, end_window=W0 + 1, key_path=str(tmp / "k.key"),
                       n_shards=2, contract=contract("int64", "opened=0:1"))
    run_job(config)
    return config.ledger


# --- a ledger charged known amounts, without the pipeline -------------------------------------------

KAPPA, STEP, DELTA = 1.0, 0.1, 1e-6  # budget, tracker step Delta, delta; noise std 1: charge = x^2 / 2
CHARGES = {  # user -> charge per window (zCDP); None: no row that window
    1: [0.03, 0.05, 0.06],
    2: [0.06, 0.06, 0.06],
    3: [0.35, None, None],
    4: [0.0, 0.0, 0.0],
    5: [0.95, 0.2, None],  # the second charge would pass kappa: dropped (Algorithm 3)
}


def _thm49(rho: float, delta: float) -> float:
    """Fact 2.4 / Theorem 4.9 of Feldman & Zrnic: rho-zCDP is (rho + 2 sqrt(rho log(1/delta)), delta)-DP."""
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


@pytest.fixture(scope="module")
def hand_ledger(tmp_path_factory):
    """A curator ledger written through CuratorStore, whose users were charged CHARGES."""
    book = Ledger(budget=KAPPA, tracker_step=STEP)
    for window in range(3):
        users = [u for u, charges in CHARGES.items() if charges[window] is not None]
        x = np.sqrt([2 * CHARGES[u][window] for u in users])
        book.admit(np.array(users, dtype=np.int64), x, noise_std=1.0, policy="drop")
    params = LedgerConfig(epsilon=_thm49(KAPPA, DELTA), delta=DELTA, norm_budget=2 * KAPPA, accounting="zcdp-thm49",
                          rho=KAPPA, noise_std=1.0, tracker_step=STEP, id_type="int64", n_shards=1,
                          key_fingerprint="0" * 16, window_seconds=86400, origin_seconds=0)
    path = tmp_path_factory.mktemp("hand") / "ledger.duckdb"
    with CuratorStore(path) as store:
        store.check_or_record_parameters(params)
        store.commit_run(run_id=1, ledger=book.to_arrow(), releases=RELEASE_SCHEMA.empty_table(),
                         window_counts=pa.table({"window_id": pa.array([], pa.int64()), "admitted": pa.array([], pa.int64()),
                                                 "clipped": pa.array([], pa.int64()), "dropped": pa.array([], pa.int64())}),
                         run_counts=dict.fromkeys(("rows_read", "admitted", "clipped", "dropped", "rejected", "late"), 0),
                         dead_letters=REJECTED_SCHEMA.empty_table().append_column("source", pa.array([], pa.string())),
                         previous_users=0)
    return str(path)


# Algorithm 5 by hand, Delta = 0.1, O_1 = Delta; the open filter takes what fits of each charge,
# a filter that halts opens the next one and adds Delta (a charge above what is left is fed as
# pieces: the open filter's rest, whole filters, the remainder in a new open filter).
#   user 1: 0.03, 0.05 fit (0.08); 0.06: 0.02 closes filter 1, 0.04 opens filter 2 -> O = 0.2
#           (the paper's literal algorithm, restarting with the whole 0.06, also gives 0.2)
#   user 2: 0.06; 0.04 closes filter 1, 0.02 opens filter 2; 0.06 fits (0.08)     -> O = 0.2
#           (literal restarts: 0.06 | 0.06 | 0.06, three filters: 0.3; splitting is tighter)
#   user 3: 0.35 = 0.1 + 0.1 + 0.1 + 0.05: four filters                           -> O = 0.4
#   user 4: never charged                                                          -> 0
#   user 5: 0.95: filter 1 + 8 whole filters + 0.05 in filter 10; 0.2 dropped      -> O = 1.0 = kappa
HAND = {1: (0.14, 0.2), 2: (0.18, 0.2), 3: (0.35, 0.4), 4: (0.0, 0.0), 5: (0.95, 1.0)}


@pytest.mark.parametrize("user", sorted(HAND))
def test_the_odometer_of_a_user_charged_known_amounts_is_algorithm_5_by_hand(hand_ledger, user):
    used, bound = HAND[user]
    row = privacy_report(hand_ledger, user=str(user)).to_pylist()[0]
    assert row["used_rho"] == pytest.approx(used, rel=1e-9, abs=1e-15)
    assert row["odometer_rho"] == pytest.approx(bound, rel=1e-12, abs=1e-15)
    assert row["odometer_epsilon"] == pytest.approx(_thm49(bound, DELTA), rel=1e-12, abs=1e-15)
    assert row["remaining_rho"] == pytest.approx(KAPPA - used, rel=1e-6)
    assert (row["budget_rho"], row["tracker_step"], row["accounting"]) == (KAPPA, STEP, "zcdp-thm49")


def test_the_odometer_never_exceeds_the_promise(hand_ledger):
    table = privacy_report(hand_ledger)
    eps, promised = table.column("odometer_epsilon").to_numpy(), table.column("promised_epsilon").to_numpy()
    assert (eps <= promised).all() and promised[0] == pytest.approx(_thm49(KAPPA, DELTA))


def test_a_smaller_delta_gives_a_larger_personal_epsilon(hand_ledger):
    row = privacy_report(hand_ledger, user="3", delta=1e-9).to_pylist()[0]
    assert row["delta"] == 1e-9 and row["odometer_epsilon"] == pytest.approx(_thm49(0.4, 1e-9), rel=1e-12)


def test_a_user_id_that_cannot_be_in_an_integer_ledger_exits_2(hand_ledger, capsys):
    with pytest.raises(SystemExit) as info:
        main(["privacy-report", "--ledger", hand_ledger, "--user", "alice"])
    assert info.value.code == 2 and "--user" in capsys.readouterr().err


def test_all_users_reports_in_parquet_are_the_per_user_reports(hand_ledger, tmp_path, capsys):
    out = tmp_path / "all.parquet"
    assert main(["privacy-report", "--ledger", hand_ledger, "--all", "--out", str(out)]) == 0
    table = pq.read_table(out)
    assert table.column("user_id").to_pylist() == ["1", "2", "3", "4", "5"]
    assert table.column("odometer_rho").to_pylist() == pytest.approx([0.2, 0.2, 0.4, 0.0, 1.0])


# --- a ledger written by the daily job ------------------------------------------------------------------


def test_the_personal_odometer_matches_algorithm_5_computed_by_hand(ledger):
    cal = calibrate(epsilon=1.0, delta=1e-6, norm_budget=B, accounting="gdp")
    step = cal.rho / 32  # Delta, the ledger's tracker step
    # Each day costs 1 / (2 s^2) = rho / B = 3.2 Delta. Algorithm 5 opens filters of Delta as the
    # charges arrive (O_1 = Delta, a charge that does not fit opens new ones): after 3.2 Delta the
    # tracker is 4 Delta, after 6.4 Delta it is 7 Delta (ceil of the total in units of Delta).
    row = privacy_report(ledger, user="7").to_pylist()[0]
    assert row["used_rho"] == pytest.approx(2 / (2 * cal.noise_std ** 2), rel=1e-9)  # = 6.4 Delta up to calibration rounding
    assert row["used_rho"] == pytest.approx(6.4 * step, rel=1e-6)
    assert row["odometer_rho"] == pytest.approx(7 * step, rel=1e-9)
    assert row["odometer_epsilon"] == pytest.approx(epsilon_for_budget(rho=7 * step, delta=1e-6), rel=1e-9)
    assert row["remaining_rho"] == pytest.approx(cal.rho - 6.4 * step, rel=1e-6)
    assert row["promised_epsilon"] == pytest.approx(1.0, rel=1e-6)
    one_day = privacy_report(ledger, user="8").to_pylist()[0]
    assert one_day["odometer_rho"] == pytest.approx(4 * step, rel=1e-9)
    assert one_day["odometer_epsilon"] < row["odometer_epsilon"] < 1.0


def test_the_personal_epsilon_under_gdp_accounting_is_the_gaussian_conversion(ledger):
    # mu = sqrt(2 rho); delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth & Su):
    # the reported epsilon meets delta, and one a hair smaller does not.
    row = privacy_report(ledger, user="7").to_pylist()[0]
    mu, eps = math.sqrt(2 * row["odometer_rho"]), row["odometer_epsilon"]

    def delta_of(e):
        return norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)

    assert row["accounting"] == "gdp"
    assert delta_of(eps) <= 1e-6 < delta_of(eps * (1 - 1e-6))


def test_a_user_who_contributed_nothing_has_lost_nothing(ledger):
    row = privacy_report(ledger, user="9").to_pylist()[0]
    assert (row["used_rho"], row["odometer_rho"], row["odometer_epsilon"]) == (0.0, 0.0, 0.0)


def test_an_unknown_user_gets_an_empty_report(ledger):
    assert privacy_report(ledger, user="12345").num_rows == 0


def test_the_cli_prints_one_users_report(ledger, capsys):
    assert main(["privacy-report", "--ledger", ledger, "--user", "7"]) == 0
    out = capsys.readouterr().out
    assert "user 7" in out and "personal odometer" in out and "Alg. 5" in out


def test_all_users_are_exported_to_parquet_for_the_curator(ledger, tmp_path, capsys):
    out = tmp_path / "reports.parquet"
    assert main(["privacy-report", "--ledger", ledger, "--all", "--out", str(out)]) == 0
    table = pq.read_table(out)
    assert sorted(table.column("user_id").to_pylist()) == ["7", "8", "9"]


@pytest.mark.parametrize("argv, needle", [
    (["--user", "7", "--delta", "1.5"], "--delta"),
    (["--all"], "--out"),
    (["--all", "--out", "reports.duckdb"], "--out"),
    (["--user", "7", "--out", "r.parquet"], "--out"),
    ([], "--user"),
])
def test_bad_parameters_exit_2_naming_the_parameter(ledger, capsys, argv, needle):
    with pytest.raises(SystemExit) as info:
        main(["privacy-report", "--ledger", ledger, *argv])
    assert info.value.code == 2 and needle in capsys.readouterr().err


def test_a_missing_ledger_exits_1_with_a_clear_message(tmp_path, capsys):
    assert main(["privacy-report", "--ledger", str(tmp_path / "none.duckdb"), "--user", "1"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_a_release_store_given_as_the_ledger_exits_1_saying_what_it_is(ledger, capsys):
    store = str(ledger).replace("l.duckdb", "s.duckdb")
    assert main(["privacy-report", "--ledger", store, "--user", "7"]) == 1
    assert "not a renyi-stream ledger" in capsys.readouterr().err
