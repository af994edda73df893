"""The renyi-stream command line: calibrate and the demo job."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.stream.accounting import ACCOUNTINGS, calibrate

from declared import flags


def test_calibrate_json_has_each_accounting_with_rho_mu_and_noise_std(capsys):
    assert main(["calibrate", "--epsilon", "0.3", "--delta", "1e-5", "--norm-budget", "10", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == set(ACCOUNTINGS)
    for accounting, numbers in payload.items():
        expected = calibrate(epsilon=0.3, delta=1e-5, norm_budget=10, accounting=accounting)
        assert numbers["rho"] == expected.rho
        assert numbers["mu"] == expected.mu
        assert numbers["noise_std"] == expected.noise_std
        assert numbers["worst_case_windows"] == 10.0


def test_calibrate_table_names_every_accounting_and_the_worst_case_windows(capsys):
    main(["calibrate", "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "8", "--per-window-bound", "2"])
    out = capsys.readouterr().out
    for accounting in ACCOUNTINGS:
        assert accounting in out
    assert "B / C^2 = 2 windows" in out


@pytest.mark.parametrize(
    "args,name",
    [
        (["--epsilon", "0", "--delta", "1e-5", "--norm-budget", "1"], "epsilon"),
        (["--epsilon", "-1", "--delta", "1e-5", "--norm-budget", "1"], "epsilon"),
        (["--epsilon", "1", "--delta", "1", "--norm-budget", "1"], "delta"),
        (["--epsilon", "1", "--delta", "0", "--norm-budget", "1"], "delta"),
        (["--epsilon", "1", "--delta", "1e-5", "--norm-budget", "0"], "norm_budget"),
        (["--epsilon", "1", "--delta", "1e-5", "--norm-budget", "-3"], "norm_budget"),
        (["--epsilon", "x", "--delta", "1e-5", "--norm-budget", "1"], "--epsilon"),
        (["--epsilon", "1", "--delta", "1e-5"], "--norm-budget"),
    ],
)
def test_calibrate_out_of_range_exits_non_zero_naming_the_parameter(args, name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", *args])
    assert exit_info.value.code == 2
    assert name in capsys.readouterr().err


def test_console_script_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "renyi_stream.pipelines.cli.main", "calibrate", "--epsilon", "1", "--delta", "1e-6",
         "--norm-budget", "4", "--json"],
        capture_output=True, text=True, check=True,
    )
    assert set(json.loads(result.stdout)) == set(ACCOUNTINGS)


def _run_demo(out_dir, capsys, *extra):
    assert main(["demo", "--users", "1500", "--days", "4", "--norm-budget", "4", "--out", str(out_dir),
                 "--quiet", *extra]) == 0
    return capsys.readouterr().out


def _store_ledger_id(out_dir):
    from renyi_stream.queries.release_store import ReleaseStore

    with ReleaseStore(out_dir / "releases.duckdb", read_only=True) as store:
        return store.ledger_id()


def _store_releases(out_dir):
    import duckdb

    db = duckdb.connect(str(out_dir / "releases.duckdb"), read_only=True)
    try:
        return db.execute("SELECT query_id, window_id, value FROM releases ORDER BY ALL").fetchall()
    finally:
        db.close()


def test_demo_runs_the_daily_job_each_day_and_balances_its_row_totals(tmp_path, capsys):
    out = _run_demo(tmp_path / "demo", capsys)
    assert "[balanced]" in out
    releases = _store_releases(tmp_path / "demo")
    assert len(releases) == 4 * 3  # every day, every indicator: the schedule is public
    assert (tmp_path / "demo" / "demo.png").stat().st_size > 10_000
    assert "days answered with every user still in" in out


def test_demo_key_file_is_private(tmp_path, capsys):
    _run_demo(tmp_path / "demo", capsys)
    mode = stat.S_IMODE(os.stat(tmp_path / "demo" / "curator" / "ledger.noise.key").st_mode)
    assert mode == 0o600


def test_the_demos_ledger_trains_with_no_key_option_as_the_readme_shows(tmp_path, capsys):
    # The demo keeps its key where run and train look for a ledger's key by default
    # (<ledger>.noise.key): train loads the ledger's own key and never makes another.
    demo = tmp_path / "demo"
    _run_demo(demo, capsys, "--days", "6")
    days = sorted((demo / "input").glob("*.parquet"))
    first, last = (p.stem[-10:] for p in (days[0], days[-1]))
    label_start = days[4].stem[-10:]
    assert main(["features", "--input", *map(str, days[:4]), "--out", str(tmp_path / "f.parquet"), "--start", first,
                 "--end", days[3].stem[-10:], "--label-column", "filed_complaint", "--label-start", label_start,
                 "--label-end", last, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train", "--features", str(tmp_path / "f.parquet"), "--ledger", str(demo / "curator" / "ledger.duckdb"),
                 "--epsilon", "1", "--delta", "1e-6", "--train-rho", "0.005", "--out", str(tmp_path / "m.npz"),
                 "--steps", "4", "--quiet"]) == 0, capsys.readouterr().err


def test_demo_rerun_starts_a_new_ledger_that_draws_its_own_noise_for_the_same_schedule(tmp_path, capsys):
    # A demo always starts afresh (new store and ledger, the key file kept): a new ledger never
    # repeats another ledger's noise (issue 18), while the public schedule is the same. Invariant
    # 5 for one ledger (a re-run draws the identical release) is tested on the daily job itself.
    _run_demo(tmp_path / "demo", capsys)
    first, first_ledger = _store_releases(tmp_path / "demo"), _store_ledger_id(tmp_path / "demo")
    _run_demo(tmp_path / "demo", capsys)
    again = _store_releases(tmp_path / "demo")
    assert [r[:2] for r in again] == [r[:2] for r in first]
    assert _store_ledger_id(tmp_path / "demo") != first_ledger
    assert all(a[2] != f[2] for a, f in zip(again, first))


def test_demo_refuses_a_folder_holding_files_it_did_not_write_and_touches_none(tmp_path, capsys):
    # The demo replaced its store and ledger in whatever --out named, silently (issue 31).
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "releases.duckdb").write_text("someone's own file")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--users", "1500", "--days", "4", "--out", str(tmp_path / "work"), "--quiet"])
    assert exit_info.value.code == 2
    assert "--out" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["releases.duckdb"]
    assert (tmp_path / "work" / "releases.duckdb").read_text() == "someone's own file"


def test_demo_never_replaces_an_unmarked_folder_that_looks_like_a_deployment(tmp_path, capsys):
    # input/ and curator/ were taken for an older demo's folder: a real ledger and store there were
    # replaced (the attacker's second review, finding 3).
    prod = tmp_path / "prod"
    (prod / "input").mkdir(parents=True)
    (prod / "curator").mkdir()
    (prod / "curator" / "ledger.duckdb").write_text("REAL LEDGER")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--users", "1500", "--days", "4", "--out", str(prod), "--quiet"])
    assert exit_info.value.code == 2 and ".renyi-demo" in capsys.readouterr().err
    assert (prod / "curator" / "ledger.duckdb").read_text() == "REAL LEDGER"


def test_demo_says_when_it_replaces_a_previous_demo(tmp_path, capsys):
    _run_demo(tmp_path / "demo", capsys)
    assert main(["demo", "--users", "1500", "--days", "4", "--norm-budget", "4", "--out", str(tmp_path / "demo")]) == 0
    assert f"replacing the previous demo in {tmp_path / 'demo'}" in capsys.readouterr().err


def test_demo_refuses_bad_parameters_naming_them(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--users", "0", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "users" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--delta", "2", "--out", str(tmp_path)])
    assert "delta" in capsys.readouterr().err


def _day_file(path, day="2026-03-01", users=(1, 2, 3)):
    import datetime as dt

    import pyarrow as pa

    pq.write_table(pa.table({
        "user_id": pa.array(list(users), type=pa.int64()),
        "day": pa.array([dt.date.fromisoformat(day)] * len(users), type=pa.date32()),
        "opened": pa.array([1.0] * len(users)),
    }), path)
    return str(path)


def _run_args(tmp_path, inputs, start="2026-03-01", end="2026-03-02"):
    return ["run", "--input", *inputs, "--store", str(tmp_path / "r.duckdb"), "--ledger", str(tmp_path / "l.duckdb"),
            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "4", "--start", start, "--end", end, "--quiet",
            *flags("int64", "opened=0:1")]  # the ledger's declared contract (a later run may repeat it)


def test_run_releases_the_schedule_and_prints_balanced_totals(tmp_path, capsys):
    assert main(_run_args(tmp_path, [_day_file(tmp_path / "d.parquet")])) == 0
    out = capsys.readouterr().out
    assert "released 2 window(s)" in out and "[balanced]" in out
    import duckdb

    db = duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True)
    assert db.execute("SELECT count(*) FROM releases").fetchone()[0] == 2
    db.close()


@pytest.mark.parametrize(
    "change,name",
    [
        ({"--start": "2026-03-05"}, "start"),
        ({"--start": "yesterday"}, "start"),
        ({"--epsilon": "0"}, "epsilon"),
        ({"--delta": "1.5"}, "delta"),
        ({"--norm-budget": "-1"}, "norm_budget"),
    ],
)
def test_run_refuses_bad_parameters_naming_them(tmp_path, capsys, change, name):
    args = _run_args(tmp_path, [_day_file(tmp_path / "d.parquet")])
    for flag, value in change.items():
        args[args.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert name in capsys.readouterr().err


def test_run_with_a_broken_input_fails_naming_it_and_commits_nothing(tmp_path, capsys):
    good = _day_file(tmp_path / "good.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    assert main(_run_args(tmp_path, [good, str(tmp_path / "broken.parquet")])) != 0
    assert "broken.parquet" in capsys.readouterr().err
    assert not (tmp_path / "l.duckdb").exists()  # a refused first run leaves no ledger behind (issue 37)
    assert main(_run_args(tmp_path, [good])) == 0  # fixed input: the day runs normally
