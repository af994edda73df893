"""Personal privacy reports from the curator's ledger (issue 4), against a hand-computed odometer."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.daily_job import JobConfig, run_job
from queries.privacy_report import privacy_report
from stream.accounting import calibrate, epsilon_for_budget

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
                       n_shards=2)
    run_job(config)
    return config.ledger


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
    ([], "--user"),
])
def test_bad_parameters_exit_2_naming_the_parameter(ledger, capsys, argv, needle):
    with pytest.raises(SystemExit) as info:
        main(["privacy-report", "--ledger", ledger, *argv])
    assert info.value.code == 2 and needle in capsys.readouterr().err


def test_a_missing_ledger_exits_1_with_a_clear_message(tmp_path, capsys):
    assert main(["privacy-report", "--ledger", str(tmp_path / "none.duckdb"), "--user", "1"]) == 1
    assert "does not exist" in capsys.readouterr().err
