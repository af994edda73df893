"""A ledger is bound to the release store it publishes to (issue 37, item 2): its first publishing
run records the store's place, and a later run with another ``--store`` (a typo, a wrong folder) is
refused before anyone is charged, unless ``--store-moved`` says the store moved and the new place
holds every release the ledger has published. Driven through ``renyi-stream run``."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from declared import flags

DAY0 = dt.date(2026, 3, 1)


def _day(offset: int) -> str:
    return (DAY0 + dt.timedelta(days=offset)).isoformat()


def _input(folder: Path, offset: int) -> str:
    """Day ``offset``'s file: three users' indicators, named by its day."""
    path = folder / f"day-{_day(offset)}.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 3], type=pa.int64()),
                             "day": pa.array([DAY0 + dt.timedelta(days=offset)] * 3, type=pa.date32()),
                             "opened": pa.array([1.0, 0.0, 1.0])}), path)
    return str(path)


def _run(folder: Path, offset: int, store: Path, *extra: str) -> int:
    return main(["run", "--input", _input(folder, offset), "--store", str(store), "--ledger",
                 str(folder / "ledger.duckdb"), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "5",
                 "--start", _day(offset), "--end", _day(offset), "--quiet", "--shards", "2",
                 *flags("int64", "opened=0:1"), *extra])


def _rows(path: Path, sql: str) -> list[tuple]:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _windows(store: Path) -> list[int]:
    return [w for (w,) in _rows(store, "SELECT DISTINCT window_id FROM releases ORDER BY 1")]


def _ledger_state(folder: Path) -> list[tuple]:
    return _rows(folder / "ledger.duckdb", "SELECT user_id, used FROM ledger ORDER BY user_id")


@pytest.fixture
def published(tmp_path, capsys):
    """A ledger whose first run published day 0 to ``releases.duckdb``."""
    store = tmp_path / "releases.duckdb"
    assert _run(tmp_path, 0, store) == 0
    capsys.readouterr()
    return tmp_path, store


def test_a_run_with_another_store_is_refused_before_anyone_is_charged_naming_both_paths(published, capsys):
    folder, store = published
    before = _ledger_state(folder)
    typo = folder / "releses.duckdb"
    assert _run(folder, 1, typo) == 1
    err = capsys.readouterr().err
    assert "argument --store:" in err and str(typo.resolve()) in err and str(store.resolve()) in err
    assert "--store-moved" in err and "Traceback" not in err
    assert _ledger_state(folder) == before  # nobody charged
    assert (not typo.exists() or _windows(typo) == []) and len(_windows(store)) == 1  # nothing published
    assert _run(folder, 1, store) == 0  # the ledger's own store goes on: the day was not lost
    assert len(_windows(store)) == 2


def test_store_moved_records_the_new_place_of_a_store_that_holds_every_release(published, capsys):
    folder, store = published
    moved = folder / "moved" / "releases.duckdb"
    moved.parent.mkdir()
    shutil.move(store, moved)
    assert _run(folder, 1, moved) == 1  # moved, but not said so
    assert "--store-moved" in capsys.readouterr().err
    assert _run(folder, 1, moved, "--store-moved") == 0
    assert _run(folder, 2, moved) == 0  # the new place is the ledger's store from now on
    assert len(_windows(moved)) == 3
    assert _run(folder, 3, store) == 1  # and the old one is another store
    assert str(moved.resolve()) in capsys.readouterr().err


def test_store_moved_to_a_store_lacking_the_published_releases_is_refused_naming_one_with_its_date(published,
                                                                                                 capsys):
    folder, _ = published
    before = _ledger_state(folder)
    assert _run(folder, 1, folder / "new.duckdb", "--store-moved") == 1
    err = capsys.readouterr().err
    assert "lacks 1 release(s)" in err and "sum:opened" in err and f"({_day(0)})" in err
    assert _ledger_state(folder) == before


def test_a_ledger_from_before_the_binding_records_its_store_at_its_next_run(published, capsys):
    folder, store = published
    db = duckdb.connect(str(folder / "ledger.duckdb"))
    try:  # as a ledger made before ledgers recorded their store
        db.execute("DELETE FROM meta WHERE key IN ('release_store', 'release_store_bound_at')")
    finally:
        db.close()
    assert _run(folder, 1, folder / "typo.duckdb") == 1  # a wrong store lacks what it published
    assert "lacks 1 release(s)" in capsys.readouterr().err
    assert _run(folder, 1, store) == 0
    assert _rows(folder / "ledger.duckdb", "SELECT value FROM meta WHERE key = 'release_store'") == [
        (str(store.resolve()),)]
    assert _run(folder, 2, folder / "typo.duckdb") == 1
    assert "--store-moved" in capsys.readouterr().err


def test_a_dry_run_previews_on_the_ledgers_own_store_and_refuses_another(published, capsys):
    folder, store = published
    assert _run(folder, 1, store, "--dry-run") == 0
    assert "would release 1 window(s)" in capsys.readouterr().out
    assert _run(folder, 1, folder / "typo.duckdb", "--dry-run") == 1
    assert "lacks 1 release(s)" in capsys.readouterr().err
