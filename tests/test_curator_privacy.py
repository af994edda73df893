"""Curator files are private whatever the umask, and exact counts stay with the curator (issue 18,
items 5 and 6; docs/architecture.md, "Edges": curator files are private, and invariant 4
(nothing-pre-noise-leaves): exact counts go to the curator only).

Every test that creates files runs under umask 022, the usual default, under which a file
created without a mode is ``-rw-r--r--``: the curator's must not be.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import stat
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.store import CuratorStore, CuratorStoreError
from renyi_stream.pipelines.curator.features import load_features
from renyi_stream.pipelines.curator.privacy_report import load_ledger
from renyi_stream.pipelines.features.job import materialise_features
from renyi_stream.queries.release_store import RELEASE_SCHEMA
from renyi_stream.stream.engine.ledger_config import LedgerConfig
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.schema import REJECTED_SCHEMA

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _tree_modes(root: Path) -> dict[str, int]:
    """Every folder and file under ``root`` (``root`` included, as ``.``) with its mode."""
    out = {".": _mode(root)}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = _mode(path)
    return out


def _not_private(root: Path) -> dict[str, str]:
    """What under ``root`` is not 0700 (folders) or 0600 (files), with its mode."""
    return {name: f"{mode:04o}" for name, mode in _tree_modes(root).items()
            if mode != (0o700 if (root / name).is_dir() else 0o600)}


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _day_file(folder: Path, offset: int = 0) -> str:
    """30 ordinary users, 7 heavy ones (dropped: a squared norm of 81 over a budget of 5) and
    4 malformed rows (no user, NaN): every total distinct and above the run's public numbers."""
    day = DAY0 + dt.timedelta(days=offset)
    users = list(range(1, 31)) + list(range(101, 108)) + [None, None, 201, 202]
    opened = [1.0] * 30 + [9.0] * 7 + [1.0, 1.0, float("nan"), float("nan")]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"day-{offset}.parquet"
    pq.write_table(pa.table({"user_id": pa.array(users, type=pa.int64()), "day": pa.array([day] * len(users),
                             type=pa.date32()), "opened": pa.array(opened), "spent": pa.array([0.5] * len(users))}),
                   path)
    return str(path)


def _run_args(tmp_path: Path, offset: int = 0, *, ledger: Path | None = None, quiet: bool = True) -> list[str]:
    day = (DAY0 + dt.timedelta(days=offset)).isoformat()
    ledger = ledger or tmp_path / "curator" / "books" / "l.duckdb"
    return ["run", "--input", _day_file(tmp_path / "in", offset), "--store", str(tmp_path / "public" / "s.duckdb"),
            "--ledger", str(ledger), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "5",
            "--start", day, "--end", day, "--shards", "2", *(["--quiet"] if quiet else []),
            # The declared contract: opened's bound holds the heavy users' 9.0 (nothing clamped, so
            # they are still dropped for a squared norm of 81 over a budget of 5), spent's its 0.5.
            "--id-type", "int64", "--column", "opened=0:10", "--column", "spent=0:1"]


def _cli(argv, capsys) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _digest(*paths) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() if Path(p).exists() else "" for p in paths]


# --- item 5: the local daily job's files ------------------------------------------------------------


def test_renyi_stream_run_under_umask_022_creates_every_curator_file_0600_in_0700_folders(tmp_path, umask_022, capsys):
    (tmp_path / "public").mkdir()
    status, _, err = _cli(_run_args(tmp_path), capsys)
    assert status == 0, err
    books = tmp_path / "curator" / "books"
    assert {"l.duckdb", "l.noise.key"} <= {p.name for p in books.iterdir()}
    assert _not_private(tmp_path / "curator") == {}  # both folders it made, the ledger, the key
    assert _current_umask() == 0o022  # the caller's umask is back


def _temp_dir(tmp_path: Path, monkeypatch) -> Path:
    """A temp dir of the test's own, where ``tempfile`` puts the job's scratch folder."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _watch_scratch(monkeypatch) -> list[tuple[Path, int, dict[str, int]]]:
    """What the daily job's pipeline step got as its scratch folder: the folder, its mode, and
    the mode of each file the pipeline left in it (the previous ledger among them)."""
    import renyi_stream.pipelines.daily.job as daily

    seen = []
    original = daily._run_pipeline

    def watched(config, params, plan, columns, released, to_release, previous, previous_running, previous_raw,
                scratch, *args, **kwargs):
        outputs = original(config, params, plan, columns, released, to_release, previous, previous_running,
                           previous_raw, scratch, *args, **kwargs)
        folder = Path(scratch)
        seen.append((folder, _mode(folder), {p.name: _mode(p) for p in folder.iterdir() if p.is_file()}))
        return outputs

    monkeypatch.setattr(daily, "_run_pipeline", watched)
    return seen


def test_renyi_stream_runs_scratch_folder_is_named_with_its_pid_0700_and_removed_after(
        tmp_path, umask_022, capsys, monkeypatch):
    temp = _temp_dir(tmp_path, monkeypatch)
    seen = _watch_scratch(monkeypatch)
    assert _cli(_run_args(tmp_path), capsys)[0] == 0
    [(folder, mode, files)] = seen
    assert folder.parent == temp and folder.name.startswith(f"renyi-run-{os.getpid()}-")
    assert mode == 0o700 and files["previous-ledger.parquet"] == 0o600
    assert list(temp.iterdir()) == []


def test_renyi_stream_run_removes_the_scratch_folder_a_killed_run_left_and_keeps_a_live_runs(
        tmp_path, capsys, monkeypatch):
    import subprocess
    import sys

    temp = _temp_dir(tmp_path, monkeypatch)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    stale, live = temp / f"renyi-run-{int(gone.stdout)}-killed", temp / f"renyi-run-{os.getppid()}-running"
    for folder in (stale, live):
        folder.mkdir(mode=0o700)
        (folder / "previous-ledger.parquet").write_bytes(b"per-user budgets")
    assert _cli(_run_args(tmp_path), capsys)[0] == 0
    assert [p.name for p in temp.iterdir()] == [live.name]


def test_the_public_release_store_keeps_the_callers_umask(tmp_path, umask_022, capsys):
    """Not a curator file: analysts read it, so the job does not make it private."""
    (tmp_path / "public").mkdir()
    assert _cli(_run_args(tmp_path), capsys)[0] == 0
    assert _mode(tmp_path / "public" / "s.duckdb") == 0o644


def test_the_ledgers_write_ahead_log_is_private_while_it_exists(tmp_path, umask_022):
    path = tmp_path / "l.duckdb"
    with CuratorStore(path):  # creating the tables wrote the log, which lives until the store closes
        wal = Path(f"{path}.wal")
        assert wal.exists()
        assert (_mode(path), _mode(wal)) == (0o600, 0o600)


def test_renyi_stream_run_refuses_a_ledger_readable_by_others_naming_it_and_commits_nothing(tmp_path, capsys):
    ledger = tmp_path / "l.duckdb"
    assert _cli(_run_args(tmp_path, 0, ledger=ledger), capsys)[0] == 0
    os.chmod(ledger, 0o644)
    before = _digest(ledger, tmp_path / "public" / "s.duckdb")
    status, _, err = _cli(_run_args(tmp_path, 1, ledger=ledger), capsys)
    assert status == 1 and "Traceback" not in err
    assert "--ledger" in err and str(ledger) in err and "mode 0644" in err and f"chmod 600 {ledger}" in err, err
    assert _digest(ledger, tmp_path / "public" / "s.duckdb") == before
    assert not Path(f"{ledger}.lock").exists()


def test_the_library_refuses_a_ledger_readable_by_others(tmp_path):
    path = tmp_path / "l.duckdb"
    CuratorStore(path).close()
    os.chmod(path, 0o640)
    with pytest.raises(CuratorStoreError, match=re.escape(f"chmod 600 {path}")):
        CuratorStore(path)


def test_a_public_store_given_as_the_ledger_is_refused_as_a_store_not_told_to_chmod(tmp_path, umask_022, capsys):
    assert _cli(_run_args(tmp_path, 0, ledger=tmp_path / "l.duckdb"), capsys)[0] == 0
    store = tmp_path / "public" / "s.duckdb"  # 0644: public
    argv = _run_args(tmp_path, 1, ledger=store)
    argv[argv.index("--store") + 1] = str(tmp_path / "public" / "other.duckdb")
    status, _, err = _cli(argv, capsys)
    assert status != 0 and "public release store" in err and "chmod" not in err, err
    assert _mode(store) == 0o644


def test_privacy_report_refuses_a_ledger_readable_by_others(tmp_path, capsys):
    ledger = tmp_path / "l.duckdb"
    assert _cli(_run_args(tmp_path, 0, ledger=ledger), capsys)[0] == 0
    os.chmod(ledger, 0o644)
    status, out, err = _cli(["privacy-report", "--ledger", str(ledger), "--user", "1"], capsys)
    assert status == 1 and "Traceback" not in err and out == ""
    assert str(ledger) in err and "chmod 600" in err, err


def test_curator_reports_written_from_the_ledger_are_private(tmp_path, umask_022, capsys):
    ledger = tmp_path / "l.duckdb"
    assert _cli(_run_args(tmp_path, 0, ledger=ledger), capsys)[0] == 0
    every = tmp_path / "all.parquet"
    assert main(["privacy-report", "--ledger", str(ledger), "--all", "--out", str(every)]) == 0
    assert main(["report", "--store", str(tmp_path / "public" / "s.duckdb"), "--ledger", str(ledger),
                 "--out", str(tmp_path / "curator.html")]) == 0
    public = ["report", "--store", str(tmp_path / "public" / "s.duckdb"), "--out", str(tmp_path / "public.html")]
    assert main(public) == 0
    assert (_mode(every), _mode(tmp_path / "curator.html")) == (0o600, 0o600)
    assert _mode(tmp_path / "public.html") == 0o644  # the public report keeps the caller's umask


def test_features_are_written_0600_in_a_0700_folder_under_umask_022(tmp_path, umask_022):
    path = _day_file(tmp_path / "in")
    out = tmp_path / "training" / "features.parquet"
    materialise_features([path], out, start=DAY0, end=DAY0, label_column="opened",
                         label_start=DAY0 + dt.timedelta(days=2), label_end=DAY0 + dt.timedelta(days=2))
    assert _not_private(tmp_path / "training") == {}


def test_a_features_file_readable_by_others_is_refused_naming_it(tmp_path):
    path = _day_file(tmp_path / "in")
    out = tmp_path / "features.parquet"
    materialise_features([path], out, start=DAY0, end=DAY0, label_column="opened",
                         label_start=DAY0 + dt.timedelta(days=2), label_end=DAY0 + dt.timedelta(days=2))
    os.chmod(out, 0o644)
    with pytest.raises(ValueError, match=re.escape(f"features file {out} is accessible to group/others")) as caught:
        load_features(out)
    assert f"chmod 600 {out}" in str(caught.value)


def test_the_demos_curator_folder_is_0700_with_private_files_even_if_it_was_open(tmp_path, umask_022, capsys):
    (tmp_path / "demo" / "curator").mkdir(parents=True, mode=0o755)  # left by an older version
    (tmp_path / "demo" / ".renyi-demo").write_text("")  # a demo's folder: the next demo may replace it
    assert main(["demo", "--users", "40", "--days", "2", "--out", str(tmp_path / "demo"), "--quiet"]) == 0
    assert _not_private(tmp_path / "demo" / "curator") == {}
    out = capsys.readouterr().out
    assert "curator only: exact counts, of synthetic data here" in out  # it prints them, and says so


# --- issue 28, item 4: DuckDB's temporary files of the ledger ---------------------------------------


def _big_ledger(path: Path, users: int) -> LedgerConfig:
    """A ledger of ``users`` charged users (ids in random order), written through CuratorStore."""
    book = Ledger(budget=1.0, tracker_step=0.1)
    ids = np.random.default_rng(0).permutation(np.arange(users, dtype=np.int64) * 7919)
    book.admit(ids, np.full(users, 0.5), noise_std=1.0, policy="drop")
    params = LedgerConfig(epsilon=3.0, delta=1e-6, norm_budget=2.0, accounting="zcdp-thm49", rho=1.0, noise_std=1.0,
                          tracker_step=0.1, id_type="int64", n_shards=1, key_fingerprint="0" * 16,
                          window_seconds=86400, origin_seconds=0)
    with CuratorStore(path) as store:
        store.check_or_record_parameters(params)
        store.commit_run(run_id=1, ledger=book.to_arrow(), releases=RELEASE_SCHEMA.empty_table(),
                         window_counts=pa.table({name: pa.array([], pa.int64())
                                                 for name in ("window_id", "admitted", "clipped", "dropped")}),
                         run_counts=dict.fromkeys(("rows_read", "admitted", "clipped", "dropped", "rejected", "late"), 0),
                         dead_letters=REJECTED_SCHEMA.empty_table().append_column("source", pa.array([], pa.string())),
                         previous_users=0)
    return params


class _Watched:
    """A DuckDB connection that, after each statement, records every path under ``folder`` with
    its mode (what DuckDB has spilled is on disk until the statement's result is read)."""

    def __init__(self, db: duckdb.DuckDBPyConnection, folder: Path, seen: dict[str, int]) -> None:
        self._db, self._folder, self._seen = db, folder, seen

    def execute(self, *args, **kwargs):
        result = self._db.execute(*args, **kwargs)
        for path in self._folder.rglob("*"):
            self._seen[str(path.relative_to(self._folder))] = _mode(path)
        return result

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_ledger_read_that_spills_to_disk_spills_only_into_a_0700_folder_beside_it_in_0600_files(
        tmp_path, umask_022, monkeypatch):
    """DuckDB spills a sort larger than its memory to ``<database>.tmp/``, which it would create
    0755 with 0644 files: the ledger's is 0700 with 0600 files, and nothing else appears."""
    folder = tmp_path / "books"
    path = folder / "l.duckdb"
    params = _big_ledger(path, 1_000_000)
    seen: dict[str, int] = {}
    connect = duckdb.connect

    def small_memory(database, *args, config=None, **kwargs):  # so that ORDER BY spills
        config = {**(config or {}), "memory_limit": "16MB", "threads": 1}
        return _Watched(connect(database, *args, config=config, **kwargs), folder, seen)

    monkeypatch.setattr(duckdb, "connect", small_memory)
    with CuratorStore(path) as store:
        assert store.load_ledger(params).num_rows == 1_000_000
    spilled = {name: mode for name, mode in seen.items() if name.startswith("l.duckdb.tmp/")}
    assert spilled, seen  # the read did spill
    assert set(seen) - set(spilled) <= {"l.duckdb", "l.duckdb.wal", "l.duckdb.tmp"}, seen  # nowhere else
    assert seen["l.duckdb.tmp"] == 0o700
    assert {name: f"{mode:04o}" for name, mode in spilled.items() if mode != 0o600} == {}


def test_a_ledger_whose_temporary_folder_others_may_enter_is_refused_naming_it_and_the_fix(tmp_path, umask_022):
    """Left by DuckDB (a killed run that spilled) or by anyone: what was spilled there may have been read."""
    path = tmp_path / "l.duckdb"
    CuratorStore(path).close()
    folder = Path(f"{path}.tmp")
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o755)
    with pytest.raises(CuratorStoreError, match=re.escape(f"chmod 700 {folder}")) as caught:
        CuratorStore(path)
    assert "mode 0755" in str(caught.value)
    with pytest.raises(CuratorStoreError, match=re.escape(f"chmod 700 {folder}")):
        load_ledger(path)  # the privacy report's read-only connection too


# --- item 6: exact counts stay in the curator database --------------------------------------------


def _exact_counts(ledger: Path) -> set[int]:
    """The run's true totals as the ledger holds them, and the users in it (the nonzero ones)."""
    with duckdb.connect(str(ledger), read_only=True) as db:
        (row,) = db.execute("SELECT rows_read, admitted, clipped, dropped, rejected, late FROM run_counts").fetchall()
        users = db.execute("SELECT count(*) FROM ledger").fetchone()[0]
    return {int(v) for v in (*row, users) if v}


def _numbers(text: str, tmp_path: Path) -> set[int]:
    """The integers printed (thousands separators removed), outside the test's own paths."""
    text = text.replace(str(tmp_path), "TMP").replace(",", "")
    return {int(n) for n in re.findall(r"\d+", text)}


def test_renyi_stream_run_quiet_prints_no_exact_count(tmp_path, capsys):
    ledger = tmp_path / "l.duckdb"
    status, out, err = _cli(_run_args(tmp_path, ledger=ledger), capsys)
    assert status == 0, err
    counts = _exact_counts(ledger)
    assert {41, 30, 7, 4} <= counts  # rows read, admitted, dropped, rejected: the fixture's design
    assert _numbers(out + err, tmp_path) & counts == set(), out + err
    assert "balanced" in out  # what a curator checks, without the numbers


def test_renyi_stream_runs_default_summary_says_its_counts_are_for_the_curator_only(tmp_path, capsys):
    ledger = tmp_path / "l.duckdb"
    status, out, err = _cli(_run_args(tmp_path, ledger=ledger, quiet=False), capsys)
    assert status == 0, err
    assert "curator only: exact counts, do not publish" in out
    assert out.index("curator only") < out.index("rows read")  # before the first count
    assert err.index("[run] curator only: exact counts") < err.index("users in the ledger")  # progress too
    assert _exact_counts(ledger) <= _numbers(out, tmp_path)  # the counts themselves, for the curator
