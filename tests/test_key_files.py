"""The daily job refuses a loose or changed noise key and a corrupted ledger file, changing nothing."""

from __future__ import annotations

import datetime as dt
import hashlib
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.curator.store import CuratorStoreError
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.queries.release_store import ReleaseConflictError, ReleaseStore
from renyi_stream.stream.noise import NoiseKey, NoiseKeyError

from declared import contract, flags

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _day(tmp_path, offset):
    path = tmp_path / f"d{offset}.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2], type=pa.int64()),
                             "day": pa.array([DAY0 + dt.timedelta(days=offset)] * 2, type=pa.date32()),
                             "opened": pa.array([1.0, 0.0])}), path)
    return str(path)


def _config(tmp_path, offset, *, key="k.key", ledger="l.duckdb"):
    return JobConfig(inputs=(_day(tmp_path, offset),), store=str(tmp_path / "s.duckdb"),
                     ledger=str(tmp_path / ledger), epsilon=1.0, delta=1e-6, norm_budget=5.0,
                     start_window=W0 + offset, end_window=W0 + offset, key_path=str(tmp_path / key), n_shards=2,
                     contract=contract("int64", "opened=0:1"))  # a new ledger's declaration; a later run may repeat it


def _digest(*paths) -> list[str]:
    return [hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else "" for p in paths]


def test_a_key_file_readable_by_others_is_refused_and_nothing_is_committed(tmp_path):
    run_job(_config(tmp_path, 0))
    os.chmod(tmp_path / "k.key", 0o644)
    before = _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb")
    with pytest.raises(NoiseKeyError, match="chmod 600"):
        run_job(_config(tmp_path, 1))
    assert _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb") == before


def test_a_changed_key_for_an_existing_ledger_and_store_is_refused_and_nothing_is_committed(tmp_path):
    run_job(_config(tmp_path, 0))
    os.remove(tmp_path / "k.key")
    NoiseKey.load_or_create(tmp_path / "k.key")  # a new key where the old one was
    before = _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb")
    with pytest.raises(CuratorStoreError, match="key_fingerprint"):
        run_job(_config(tmp_path, 1))
    assert _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb") == before


def test_releases_drawn_with_another_key_never_enter_a_store(tmp_path):
    run_job(_config(tmp_path, 0))
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        before = store.read()
    # Another curator (new ledger, new key) publishing into the same public store.
    with pytest.raises((CuratorStoreError, ReleaseConflictError)):
        run_job(_config(tmp_path, 1, key="other.key", ledger="other.duckdb"))
    with ReleaseStore(tmp_path / "s.duckdb", read_only=True) as store:
        assert store.read().equals(before)


def test_a_corrupted_ledger_file_is_refused_with_a_clear_message(tmp_path):
    run_job(_config(tmp_path, 0))
    ledger = tmp_path / "l.duckdb"
    data = bytearray(ledger.read_bytes())
    data[:4096] = os.urandom(4096)  # the header and first block: no longer a DuckDB file
    ledger.write_bytes(bytes(data))
    with pytest.raises(CuratorStoreError, match="ledger"):
        run_job(_config(tmp_path, 1))


def _cli_run(tmp_path, offset, *, store="s.duckdb", ledger="l.duckdb", key="k.key") -> list[str]:
    day = (DAY0 + dt.timedelta(days=offset)).isoformat()
    return ["run", "--input", _day(tmp_path, offset), "--store", str(tmp_path / store), "--ledger",
            str(tmp_path / ledger), "--noise-key", str(tmp_path / key), "--epsilon", "1", "--delta", "1e-6",
            "--norm-budget", "5", "--start", day, "--end", day, "--shards", "2", "--quiet", *flags("int64", "opened=0:1")]


def _cli(argv, capsys) -> tuple[int, str]:
    from renyi_stream.pipelines.cli.main import main

    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def test_renyi_stream_run_refuses_a_key_file_readable_by_others_and_commits_nothing(tmp_path, capsys):
    assert _cli(_cli_run(tmp_path, 0), capsys)[0] == 0
    os.chmod(tmp_path / "k.key", 0o644)
    before = _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb")
    status, err = _cli(_cli_run(tmp_path, 1), capsys)
    assert status != 0 and "Traceback" not in err
    assert "--noise-key" in err and str(tmp_path / "k.key") in err and "mode 0644" in err and "chmod 600" in err, err
    assert _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb") == before
    assert not (tmp_path / "l.duckdb.lock").exists()


def test_renyi_stream_run_refuses_a_changed_key_and_commits_nothing(tmp_path, capsys):
    assert _cli(_cli_run(tmp_path, 0), capsys)[0] == 0
    os.remove(tmp_path / "k.key")
    NoiseKey.load_or_create(tmp_path / "k.key")
    before = _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb")
    status, err = _cli(_cli_run(tmp_path, 1), capsys)
    assert status != 0 and "Traceback" not in err and "key_fingerprint" in err, err
    assert _digest(tmp_path / "s.duckdb", tmp_path / "l.duckdb") == before


def test_a_store_made_with_another_key_is_refused_before_anyone_is_charged(tmp_path, capsys):
    """Two deployments released the same day with their own keys; the first one's ledger and key
    pointed at the second one's store: its ledger knows every window that store holds, so only
    the store's recorded key fingerprint can tell. Refused before the ledger transaction (no user
    charged for answers that store would refuse), naming both keys."""
    assert _cli(_cli_run(tmp_path, 0), capsys)[0] == 0
    assert _cli(_cli_run(tmp_path, 0, store="other.duckdb", ledger="other-l.duckdb", key="other.key"), capsys)[0] == 0
    mine, theirs = (NoiseKey.load_or_create(tmp_path / k).fingerprint for k in ("k.key", "other.key"))
    before = _digest(tmp_path / "l.duckdb", tmp_path / "other.duckdb", tmp_path / "s.duckdb")
    # The ledger records its own store (s.duckdb): told it moved to other.duckdb, which holds every
    # window the ledger published, only the key fingerprint tells the two deployments apart.
    status, err = _cli(_cli_run(tmp_path, 1, store="other.duckdb") + ["--store-moved"], capsys)
    assert status != 0 and "Traceback" not in err, err
    assert "--store" in err and mine in err and theirs in err, err
    assert _digest(tmp_path / "l.duckdb", tmp_path / "other.duckdb", tmp_path / "s.duckdb") == before
    with pytest.raises(ReleaseConflictError, match=theirs):  # the library refuses the same way
        run_job(JobConfig(**{**_config(tmp_path, 1).__dict__, "store": str(tmp_path / "other.duckdb"),
                             "store_moved": True}))
    assert _digest(tmp_path / "l.duckdb", tmp_path / "other.duckdb", tmp_path / "s.duckdb") == before
