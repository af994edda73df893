"""The public release store on real DuckDB files: round trips, idempotent publishing (invariant 5
(release-once, docs/architecture.md)), conflicts, schema versions, input validation, and the
analysts' read-only SQL entry point that must not reach anything but the releases (invariant 4
(nothing-pre-noise-leaves) and docs/architecture.md, "Two databases")."""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi_stream.queries import release_store
from renyi_stream.queries.release_store import (
    READ_SCHEMA,
    RELEASE_SCHEMA,
    SCHEMA_VERSION,
    ReleaseConflictError,
    ReleaseStore,
    ReleaseStoreError,
    connect_read_only,
)

FINGERPRINT = "0123456789abcdef"
DAY0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
W0 = 20513  # days since the epoch of DAY0


def _releases(query_id="sum:opened", windows=(W0, W0 + 1), dim=2, *, seed=0, fingerprint=FINGERPRINT,
              noise_std=3.5) -> pa.Table:
    """One row per (window, coordinate) of one query, values drawn from a seeded generator."""
    windows = np.repeat(np.asarray(windows, dtype=np.int64), dim)
    coordinates = np.tile(np.arange(dim, dtype=np.int32), len(windows) // dim)
    n = len(windows)
    starts = [DAY0 + dt.timedelta(days=int(w - W0)) for w in windows]
    return pa.table({
        "query_id": [query_id] * n,
        "window_id": windows,
        "window_start": pa.array(starts, pa.timestamp("us", tz="UTC")),
        "window_end": pa.array([s + dt.timedelta(days=1) for s in starts], pa.timestamp("us", tz="UTC")),
        "label": [f"{query_id}[{c}]" for c in coordinates],
        "coordinate": coordinates,
        "value": np.random.default_rng(seed).normal(100.0, noise_std, n),
        "noise_std": np.full(n, noise_std),
        "kind": ["window"] * n,
        "accounting": ["gdp"] * n,
        "mechanism": ["gaussian"] * n,
        "key_fingerprint": [fingerprint] * n,
    }, schema=RELEASE_SCHEMA)


def _replace(table: pa.Table, name: str, values) -> pa.Table:
    index = table.column_names.index(name)
    return table.set_column(index, table.field(index), pa.array(values, table.field(index).type))


@pytest.fixture
def store_path(tmp_path) -> Path:
    return tmp_path / "releases.duckdb"


@pytest.fixture
def published(store_path) -> pa.Table:
    """A store holding one batch of releases; returns that batch."""
    table = _releases()
    with ReleaseStore(store_path) as store:
        store.publish(table)
    return table


# --- publishing and reading ------------------------------------------------------------------


def test_publish_then_read_round_trips(store_path):
    table = _releases()
    with ReleaseStore(store_path) as store:
        assert store.publish(table) == table.num_rows
        back = store.read()
    assert back.schema == READ_SCHEMA
    assert back.drop_columns(["released_at"]).equals(table)  # values bit for bit, timestamps in UTC
    assert back.column("released_at").null_count == 0


def test_first_open_creates_the_file_and_its_parent_folders(tmp_path):
    path = tmp_path / "a" / "b" / "releases.duckdb"
    with ReleaseStore(path) as store:
        assert store.path == path
        assert store.read().num_rows == 0
    assert path.is_file()


def test_republishing_identical_rows_inserts_nothing_and_changes_nothing(store_path, published):
    with ReleaseStore(store_path) as store:
        before = store.read()
        assert store.publish(published) == 0
        assert store.publish(published.slice(1, 2)) == 0
        assert store.read().equals(before)  # released_at included: the first write wins


def test_a_batch_overlapping_released_rows_inserts_only_the_new_ones(store_path, published):
    newer = _releases(windows=(W0 + 1, W0 + 2))
    newer = _replace(newer, "value", [*published.column("value").to_pylist()[2:], 7.0, 8.0])
    with ReleaseStore(store_path) as store:
        assert store.publish(newer) == 2
        assert store.released_windows("sum:opened") == [W0, W0 + 1, W0 + 2]


@pytest.mark.parametrize("column, new", [
    ("value", lambda v: v + 1e-9),
    ("noise_std", lambda v: v * 2),
    ("window_end", lambda v: v + dt.timedelta(hours=1)),
    ("label", lambda v: v + "!"),
    ("mechanism", lambda v: "discrete_gaussian"),
])
def test_a_different_row_for_a_released_key_is_refused_and_nothing_of_the_batch_is_inserted(
        store_path, published, column, new):
    changed = published.column(column).to_pylist()
    changed[0] = new(changed[0])
    # The batch also holds two rows never released: they must not be inserted either.
    batch = pa.concat_tables([_replace(published, column, changed), _releases(windows=(W0 + 5,), seed=9)])
    with ReleaseStore(store_path) as store:
        before = store.read()
        with pytest.raises(ReleaseConflictError, match=rf"\('sum:opened', {W0}, 0\).*'{column}'.*released once"):
            store.publish(batch)
        assert store.read().equals(before)
        assert store.released_windows("sum:opened") == [W0, W0 + 1]


def test_a_conflict_message_does_not_quote_the_refused_value(store_path, published):
    refused = published.column("value").to_pylist()
    refused[0] = 123456.789
    with ReleaseStore(store_path) as store, pytest.raises(ReleaseConflictError) as info:
        store.publish(_replace(published, "value", refused))
    assert "123456" not in str(info.value)  # a second noisy draw must not reach logs


def test_a_different_key_fingerprint_is_refused_naming_both(store_path, published):
    other = _releases(windows=(W0 + 2,), fingerprint="fedcba9876543210")
    with ReleaseStore(store_path) as store:
        with pytest.raises(ReleaseConflictError, match=f"{FINGERPRINT}.*fedcba9876543210"):
            store.publish(other)
        assert store.released_windows("sum:opened") == [W0, W0 + 1]
        assert store.key_fingerprint() == FINGERPRINT


LEDGER = "0123456789abcdef0123456789abcdef"
OTHER_LEDGER = "fedcba9876543210fedcba9876543210"


def test_the_first_publish_naming_a_ledger_records_it(store_path):
    with ReleaseStore(store_path) as store:
        assert store.ledger_id() is None
        store.publish(_releases(), ledger_id=LEDGER)
        assert store.ledger_id() == LEDGER
        store.check_ledger(LEDGER)  # the same ledger goes on
        assert store.publish(_releases(windows=(W0 + 2,)), ledger_id=LEDGER) == 2


def test_a_publish_from_another_ledger_is_refused_naming_both_and_inserts_nothing(store_path):
    with ReleaseStore(store_path) as store:
        store.publish(_releases(), ledger_id=LEDGER)
        with pytest.raises(ReleaseConflictError, match=f"ledger {LEDGER}.*ledger is {OTHER_LEDGER}"):
            store.publish(_releases(windows=(W0 + 2,)), ledger_id=OTHER_LEDGER)
        with pytest.raises(ReleaseConflictError, match=OTHER_LEDGER):
            store.check_ledger(OTHER_LEDGER)
        assert store.released_windows("sum:opened") == [W0, W0 + 1] and store.ledger_id() == LEDGER


def test_a_store_from_before_ledger_ids_accepts_a_ledger_and_records_it(store_path, published):
    with ReleaseStore(store_path) as store:
        assert store.ledger_id() is None
        store.check_ledger(OTHER_LEDGER)
        store.publish(_releases(windows=(W0 + 2,)), ledger_id=OTHER_LEDGER)
        assert store.ledger_id() == OTHER_LEDGER


def test_a_malformed_ledger_id_is_refused_naming_it(store_path):
    with ReleaseStore(store_path) as store:
        with pytest.raises(ValueError, match="ledger_id"):
            store.publish(_releases(), ledger_id="not-a-ledger")
        assert store.read().num_rows == 0 and store.ledger_id() is None


def test_a_batch_with_two_key_fingerprints_is_refused(store_path):
    batch = pa.concat_tables([_releases(windows=(W0,)), _releases(windows=(W0 + 1,), fingerprint="f" * 16)])
    with ReleaseStore(store_path) as store:
        with pytest.raises(ReleaseConflictError, match=f"{FINGERPRINT}.*ffff"):
            store.publish(batch)
        assert store.read().num_rows == 0
        assert store.key_fingerprint() is None


def test_released_windows_are_sorted_and_per_query(store_path):
    with ReleaseStore(store_path) as store:
        store.publish(_releases(windows=(W0 + 3, W0)))
        store.publish(_releases("sum:bought", windows=(W0 + 1,)))
        store.publish(_releases(windows=(W0 + 1,)))
        assert store.released_windows("sum:opened") == [W0, W0 + 1, W0 + 3]
        assert store.released_windows("sum:bought") == [W0 + 1]
        assert store.released_windows("sum:nothing") == []


def test_read_filters_by_query_and_orders_by_query_window_coordinate(store_path):
    with ReleaseStore(store_path) as store:
        store.publish(_releases("sum:opened", windows=(W0 + 1, W0)).take([3, 2, 1, 0]))
        store.publish(_releases("sum:bought", windows=(W0,)))
        everything = store.read()
        opened = store.read("sum:opened")
    keys = list(zip(*(everything.column(c).to_pylist() for c in ("query_id", "window_id", "coordinate"))))
    assert keys == sorted(keys) and len(keys) == 6
    assert set(opened.column("query_id").to_pylist()) == {"sum:opened"} and opened.num_rows == 4


def test_an_empty_batch_publishes_nothing_and_sets_no_fingerprint(store_path):
    with ReleaseStore(store_path) as store:
        assert store.publish(_releases().slice(0, 0)) == 0
        assert store.key_fingerprint() is None


def test_castable_column_types_are_accepted(store_path):
    table = _releases()
    loose = pa.table({
        name: (table.column(name).cast(pa.int32()) if name == "window_id"
               else table.column(name).cast(pa.int64()) if name == "coordinate"
               else table.column(name).cast(pa.large_string()) if name == "label"
               else table.column(name))
        for name in reversed(table.column_names)  # column order does not matter either
    })
    with ReleaseStore(store_path) as store:
        assert store.publish(loose) == table.num_rows
        assert store.read().drop_columns(["released_at"]).equals(table)


def test_publishing_to_a_read_only_store_is_refused(store_path, published):
    with ReleaseStore(store_path, read_only=True) as store:
        with pytest.raises(ReleaseStoreError, match="read-only"):
            store.publish(_releases(windows=(W0 + 9,)))
        assert store.read().num_rows == published.num_rows


@settings(max_examples=15, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 11), max_size=12), min_size=1, max_size=5))
def test_any_sequence_of_overlapping_republishes_releases_each_key_once(batches):
    full = _releases(windows=range(W0, W0 + 4), dim=3, seed=4)  # 12 rows
    with tempfile.TemporaryDirectory() as scratch:
        with ReleaseStore(Path(scratch) / "r.duckdb") as store:
            inserted = sum(store.publish(full.take(pa.array(sorted(set(rows)), pa.int64()))) for rows in batches)
            back = store.read().drop_columns(["released_at"])
    wanted = sorted({row for rows in batches for row in rows})
    assert inserted == len(wanted)
    assert back.equals(full.take(pa.array(wanted, pa.int64())))


# --- bad input: ValueError naming the column, nothing written ---------------------------------


def _bad(name, values):
    return lambda t: _replace(t, name, values(t.column(name).to_pylist()))


def _first(value):
    return lambda column: [value, *column[1:]]


@pytest.mark.parametrize("corrupt, column", [
    (lambda t: t.drop_columns(["noise_std"]), "noise_std"),
    (lambda t: t.append_column("true_sum", pa.array([1.0] * t.num_rows)), "true_sum"),
    (_bad("label", _first(None)), "label"),
    (_bad("window_start", _first(None)), "window_start"),
    (_bad("value", _first(float("nan"))), "value"),
    (_bad("value", _first(float("inf"))), "value"),
    (_bad("noise_std", _first(0.0)), "noise_std"),
    (_bad("noise_std", _first(-1.0)), "noise_std"),
    (_bad("noise_std", _first(float("nan"))), "noise_std"),
    (lambda t: _replace(t, "window_end", t.column("window_start").to_pylist()), "window_end"),
    (lambda t: _replace(t, "window_end", [s - dt.timedelta(days=1) for s in t.column("window_start").to_pylist()]),
     "window_end"),
    (lambda t: t.set_column(1, "window_id", pa.array([1.5] * t.num_rows)), "window_id"),
    (lambda t: t.set_column(6, "value", pa.array(["x"] * t.num_rows)), "value"),
    (_bad("coordinate", _first(-1)), "coordinate"),
    (_bad("query_id", lambda c: [""] * len(c)), "query_id"),
    (_bad("mechanism", lambda c: ["laplace"] * len(c)), "mechanism"),
    (_bad("kind", lambda c: ["running_total"] * len(c)), "kind"),
    (_bad("coordinate", lambda c: [0] * len(c)), "query_id', 'window_id', 'coordinate"),
])
def test_bad_input_raises_value_error_naming_the_column_and_writes_nothing(store_path, corrupt, column):
    with ReleaseStore(store_path) as store:
        with pytest.raises(ValueError, match=f"'{column}'"):
            store.publish(corrupt(_releases()))
        assert store.read().num_rows == 0
        assert store.key_fingerprint() is None


# --- schema versions and opening ----------------------------------------------------------------


def _set_version(path, version):
    db = duckdb.connect(str(path))
    db.execute("UPDATE store_meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    db.close()


def test_the_schema_version_and_key_fingerprint_are_recorded_in_store_meta(store_path, published):
    db = duckdb.connect(str(store_path), read_only=True)
    meta = dict(db.execute("SELECT key, value FROM store_meta").fetchall())
    db.close()
    assert meta == {"schema_version": str(SCHEMA_VERSION), "key_fingerprint": FINGERPRINT}


def test_a_store_with_a_newer_schema_version_is_refused(store_path, published):
    _set_version(store_path, SCHEMA_VERSION + 1)
    for read_only in (False, True):
        with pytest.raises(ReleaseStoreError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade"):
            ReleaseStore(store_path, read_only=read_only)
    with pytest.raises(ReleaseStoreError, match="upgrade"):
        connect_read_only(store_path)


def test_an_older_store_is_migrated_keeping_its_releases(store_path, published, monkeypatch):
    step = ("CREATE VIEW released_windows AS SELECT DISTINCT query_id, window_id FROM release_data",)
    monkeypatch.setattr(release_store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setattr(release_store, "_MIGRATIONS", {**release_store._MIGRATIONS, SCHEMA_VERSION + 1: step})
    with pytest.raises(ReleaseStoreError, match="needs a migration"):
        ReleaseStore(store_path, read_only=True)
    with ReleaseStore(store_path) as store:
        assert store.schema_version() == SCHEMA_VERSION + 1
        assert store.read().num_rows == published.num_rows
    db = duckdb.connect(str(store_path), read_only=True)
    assert db.execute("SELECT count(*) FROM released_windows").fetchone()[0] == 2
    db.close()


def test_a_failed_migration_leaves_the_store_at_its_old_version(store_path, published, monkeypatch):
    steps = ("CREATE TABLE extra (x INTEGER)", "CREATE VIEW releases AS SELECT 1 AS x")  # 2nd fails
    monkeypatch.setattr(release_store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setattr(release_store, "_MIGRATIONS", {**release_store._MIGRATIONS, SCHEMA_VERSION + 1: steps})
    with pytest.raises(ReleaseStoreError, match="nothing was changed"):
        ReleaseStore(store_path)
    db = duckdb.connect(str(store_path), read_only=True)
    tables = {name for (name,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    version = db.execute("SELECT value FROM store_meta WHERE key = 'schema_version'").fetchone()[0]
    db.close()
    assert "extra" not in tables and version == str(SCHEMA_VERSION)


def test_read_only_open_of_a_missing_file_raises_naming_the_path(tmp_path):
    path = tmp_path / "nowhere" / "releases.duckdb"
    with pytest.raises(ReleaseStoreError, match=str(path)):
        ReleaseStore(path, read_only=True)
    assert not path.exists() and not path.parent.exists()


def test_a_database_that_is_not_a_release_store_is_refused(tmp_path):
    ledger = tmp_path / "ledger.duckdb"
    db = duckdb.connect(str(ledger))
    db.execute("CREATE TABLE ledger (user_id BIGINT, used DOUBLE)")
    db.close()
    with pytest.raises(ReleaseStoreError, match="not a renyi-stream release store"):
        ReleaseStore(ledger)
    with pytest.raises(ReleaseStoreError, match="not a renyi-stream release store"):
        connect_read_only(ledger)


def test_closing_the_store_releases_the_file(store_path, published):
    with ReleaseStore(store_path) as store:
        pass
    store.close()  # a second close does nothing
    with pytest.raises(ReleaseStoreError, match="closed"):
        store.read()
    db = duckdb.connect(str(store_path), read_only=True)  # refused while a writer holds it
    db.close()


def test_a_plain_duckdb_connection_can_select_from_releases(store_path, published):
    db = duckdb.connect(str(store_path))
    rows = db.execute("SELECT query_id, window_id, coordinate, value FROM releases "
                      "ORDER BY window_id, coordinate").fetchall()
    db.close()
    assert rows == list(zip(*(published.column(c).to_pylist()
                              for c in ("query_id", "window_id", "coordinate", "value"))))


def test_the_releases_view_has_the_documented_columns(store_path, published):
    db = duckdb.connect(str(store_path), read_only=True)
    kind = db.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'releases'").fetchone()
    columns = [name for (name,) in db.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'releases' "
        "ORDER BY ordinal_position").fetchall()]
    db.close()
    assert kind == ("VIEW",)
    assert columns == [*RELEASE_SCHEMA.names, "released_at"]


# --- the analysts' read-only SQL entry point ----------------------------------------------------


@pytest.fixture
def analyst(store_path, published):
    db = connect_read_only(store_path)
    yield db
    db.close()


def test_connect_read_only_answers_sql_over_releases_in_utc(analyst, published):
    rows = analyst.execute("SELECT DISTINCT window_start::DATE FROM releases ORDER BY 1").fetchall()
    assert rows == [(dt.date(2026, 3, 1),), (dt.date(2026, 3, 2),)]
    assert analyst.execute("SELECT count(*) FROM releases").fetchone()[0] == published.num_rows


def test_connect_read_only_of_a_missing_file_raises_naming_the_path(tmp_path):
    path = tmp_path / "missing.duckdb"
    with pytest.raises(ReleaseStoreError, match=str(path)):
        connect_read_only(path)
    assert not path.exists()


def test_connect_read_only_blocks_insert(analyst):
    with pytest.raises(duckdb.Error, match="read-only"):
        analyst.execute("INSERT INTO release_data (query_id) VALUES ('x')")


def test_connect_read_only_blocks_attaching_another_database(analyst, tmp_path):
    ledger = tmp_path / "ledger.duckdb"
    db = duckdb.connect(str(ledger))
    db.execute("CREATE TABLE ledger AS SELECT 1 AS user_id, 0.5 AS used")
    db.close()
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        analyst.execute(f"ATTACH '{ledger}' AS ledger (READ_ONLY)")


def test_connect_read_only_blocks_copy_to_a_file(analyst, tmp_path):
    target = tmp_path / "out.csv"
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        analyst.execute(f"COPY (SELECT * FROM releases) TO '{target}'")
    assert not target.exists()


def test_connect_read_only_blocks_reading_a_file(analyst, tmp_path):
    (tmp_path / "f.csv").write_text("a,b\n1,2\n")
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        analyst.execute(f"SELECT * FROM read_csv('{tmp_path / 'f.csv'}')")
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        analyst.execute("SELECT * FROM read_csv('/etc/passwd')")


def test_connect_read_only_blocks_install(analyst):
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        analyst.execute("INSTALL httpfs")


def test_connect_read_only_blocks_loading_an_extension_from_disk(analyst):
    with pytest.raises(duckdb.Error, match="disabled"):
        analyst.execute("LOAD httpfs")


def test_connect_read_only_blocks_re_enabling_external_access(analyst):
    for statement in ("SET enable_external_access = true", "RESET enable_external_access",
                      "SET lock_configuration = false"):
        with pytest.raises(duckdb.Error, match="locked"):
            analyst.execute(statement)
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        analyst.execute("SELECT * FROM read_csv('/etc/passwd')")
