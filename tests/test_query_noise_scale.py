"""Noise where the curator wants it: a per-query noise scale (issue 39, item 4).

A window query declares ``noise_scale`` ``m`` (a multiplier of the ledger's noise std ``s``;
default 1.0). Its coordinates are released with noise std ``m * s`` (the rows' ``noise_std``
says so) and each user is charged ``sum_k ||q_k(x)||^2 / (2 s^2 m_k^2)`` over the window queries
``k`` active (the Gaussian mechanism with per-coordinate scales: Rényi charge of order ``alpha``
``alpha/2 * v^T Sigma^-1 v``, Feldman & Zrnic Cor 4.7 per coordinate). The charge is formed in
one place (``ShardState.charge_window``) and the noise drawn in one (``ReleaseWindow``), shared
by the daily, distributed and streaming jobs; the conformance suite's ``noise-scales`` scenario
(tests/conformance/scenario.py) runs all three and demands the same ledger and public part.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from renyi_stream.pipelines.beam.transforms import ReleaseWindow
from renyi_stream.pipelines.cli.main import main
from renyi_stream.queries.catalogue import ReleaseCatalogue
from renyi_stream.queries.linear import LinearQuery, default_queries
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_store import ReleaseStore, connect_read_only
from renyi_stream.stream.engine.shard_state import QueryPlan, ShardState
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise
from renyi_stream.stream.schema import WindowSpec

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
FINE, COARSE = 0.5, 2.0
#: ``fine`` sums ``a`` at half the ledger's noise std, ``coarse`` sums ``b`` at twice it.
SCALED = (LinearQuery.columns("fine", ["a"], noise_scale=FINE),
          LinearQuery.columns("coarse", ["b"], noise_scale=COARSE))
#: ``user -> [(day, a, b)]``. With norm budget 10 a user pays ``(4 a^2 + b^2 / 4) / 10`` of the
#: budget a day: user 1 0.4 (over budget on day 2: dropped, or clipped to the 0.2 left), user 2
#: 0.1, user 3 0.125, user 5 0.8 then 0.1, user 4 nothing. Without the scales user 1 would pay 0.1.
ROWS = {1: [(0, 1.0, 0.0), (1, 1.0, 0.0), (2, 1.0, 0.0)],
        2: [(0, 0.0, 2.0), (1, 0.0, 2.0), (2, 0.0, 2.0)],
        3: [(0, 0.5, 1.0), (2, 0.5, 1.0)],
        4: [(0, 0.0, 0.0), (1, 0.0, 0.0)],
        5: [(0, 1.0, 4.0), (2, 0.5, 0.0)]}
#: A fixed noise key and ledger id: the KS test's draws are the same on every run.
FIXED_SECRET = bytes(range(32))
FIXED_LEDGER_ID = "5ca1ed0000000000000000000000beef"


def _day(offset: int) -> str:
    return (DAY0 + dt.timedelta(days=offset)).isoformat()


def _fixed_key(folder: Path) -> Path:
    path = folder / "fixed.noise.key"
    path.write_bytes(FIXED_SECRET)
    path.chmod(0o600)
    return path


def _register(store: Path, queries) -> None:
    with QueryRegistry(store) as registry:
        for query in queries:
            registry.add(query, effective_from=W0)


def _day_files(folder: Path) -> list[str]:
    paths = []
    for day in range(3):
        rows = [(u, a, b) for u, days in ROWS.items() for d, a, b in days if d == day]
        path = folder / f"day-{_day(day)}.parquet"
        pq.write_table(pa.table({"user_id": pa.array([u for u, _, _ in rows], pa.int64()),
                                 "day": pa.array([DAY0 + dt.timedelta(days=day)] * len(rows), pa.date32()),
                                 "a": pa.array([a for _, a, _ in rows]), "b": pa.array([b for _, _, b in rows])}), path)
        paths.append(str(path))
    return paths


def _run(folder: Path, inputs: list[str], *extra: str, end: int = 2) -> None:
    assert main(["run", "--input", *inputs, "--store", str(folder / "s.duckdb"), "--ledger", str(folder / "l.duckdb"),
                 "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "10", "--start", _day(0), "--end", _day(end),
                 "--shards", "2", "--quiet", "--id-type", "int64", "--column", "a", "--column", "b", *extra]) == 0


def _read(path: Path, sql: str) -> list[tuple]:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


class Ran:
    """A finished daily run: its ledger's meta, every user's used budget, its releases."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.meta = dict(_read(folder / "l.duckdb", "SELECT key, value FROM meta"))
        self.s = float(self.meta["noise_std"])
        self.rho = float(self.meta["rho"])
        self.used = dict(_read(folder / "l.duckdb", "SELECT user_id, used FROM ledger"))
        self.releases = [dict(zip(("query_id", "window_id", "coordinate", "value", "noise_std"), row)) for row in
                         _read(folder / "s.duckdb", "SELECT query_id, window_id, coordinate, value, noise_std "
                                                    "FROM releases ORDER BY query_id, window_id, coordinate")]

    def charge(self, a: float, b: float) -> float:
        """The formula: ``sum_k ||q_k(x)||^2 / (2 s^2 m_k^2)``."""
        return a * a / (2 * self.s ** 2 * FINE ** 2) + b * b / (2 * self.s ** 2 * COARSE ** 2)

    def without_noise(self, key: NoiseKey) -> dict[tuple[str, int], float]:
        binding = NoiseBinding(key, self.meta["ledger_id"])
        return {(r["query_id"], r["window_id"]): r["value"] - float(gaussian_noise(
            binding, query_id=r["query_id"], window_id=r["window_id"], dim=1, noise_std=r["noise_std"])[0])
            for r in self.releases}


def _scaled_run(folder: Path, policy: str) -> Ran:
    _register(folder / "s.duckdb", SCALED)
    _run(folder, _day_files(folder), "--policy", policy)
    return Ran(folder)


@pytest.fixture(scope="module")
def dropped(tmp_path_factory) -> Ran:
    return _scaled_run(tmp_path_factory.mktemp("scales-drop"), "drop")


@pytest.fixture(scope="module")
def clipped(tmp_path_factory) -> Ran:
    return _scaled_run(tmp_path_factory.mktemp("scales-clip"), "clip")


# --- the charge -------------------------------------------------------------------------------------


def test_each_users_charge_is_their_squared_contribution_to_each_query_over_that_querys_variance(dropped):
    # Under drop, user 1's third day (0.4 of the budget with 0.2 left) is refused: charged nothing.
    expected = {u: sum(dropped.charge(a, b) for d, a, b in days if not (u == 1 and d == 2))
                for u, days in ROWS.items()}
    assert expected[1] == pytest.approx(0.8 * dropped.rho, rel=1e-6)  # the scales matter: 0.2 without them
    assert {u: dropped.used[u] for u in ROWS} == pytest.approx(expected, rel=1e-9, abs=0.0)


def test_a_clipped_user_exhausts_the_budget_and_both_queries_sums_carry_the_clips_one_scale(clipped):
    before = clipped.charge(1.0, 0.0) * 2
    assert clipped.used[1] == pytest.approx(clipped.rho, rel=1e-6)  # clipped: exactly the rest of the budget
    others = {u: sum(clipped.charge(a, b) for _, a, b in days) for u, days in ROWS.items() if u != 1}
    assert {u: clipped.used[u] for u in others} == pytest.approx(others, rel=1e-9, abs=0.0)
    # The released sums, less the ledger's own noise, hold user 1's day-2 row times the clip's lambda
    # (lambda^2 * 0.4 = the 0.2 left), in the queries' own units: never divided by m.
    lam = math.sqrt((clipped.rho - before) / clipped.charge(1.0, 0.0))
    sums = clipped.without_noise(NoiseKey.load(clipped.folder / "l.noise.key"))
    assert sums[("fine", W0 + 2)] == pytest.approx(lam * 1.0 + 0.5 + 0.5, abs=1e-6)
    assert sums[("coarse", W0 + 2)] == pytest.approx(2.0 + 1.0, abs=1e-9)
    assert lam == pytest.approx(math.sqrt(0.5), rel=1e-6)


def test_each_querys_release_rows_report_its_own_noise_std(clipped):
    stds = {(r["query_id"], r["noise_std"]) for r in clipped.releases}
    assert stds == {("fine", clipped.s * FINE), ("coarse", clipped.s * COARSE)}


# --- the noise ----------------------------------------------------------------------------------------

#: The whole test's false-alarm rate: each query's KS test runs at half of it (Bonferroni), so
#: with correct noise it fails with probability at most 1e-3 for a fresh draw. The key and the
#: ledger id are fixed, so the draw, and the outcome, is the same on every run.
FALSE_ALARM = 1e-3
NOISE_WINDOWS = 240


def test_each_querys_noise_spread_is_its_declared_std_a_ks_test_over_windows_without_rows(tmp_path, monkeypatch):
    from renyi_stream.pipelines.curator import store as curator_store

    monkeypatch.setattr(curator_store, "new_ledger_id", lambda: FIXED_LEDGER_ID)
    queries = (*SCALED, LinearQuery.columns("plain", ["a"]))
    _register(tmp_path / "s.duckdb", queries)
    empty = tmp_path / "empty.parquet"  # a header, no rows: every window is noise only
    pq.write_table(pa.table({"user_id": pa.array([], pa.int64()), "day": pa.array([], pa.date32()),
                             "a": pa.array([], pa.float64()), "b": pa.array([], pa.float64())}), empty)
    _run(tmp_path, [str(empty)], "--input-days", f"{_day(0)}:{_day(NOISE_WINDOWS - 1)}",
         "--noise-key", str(_fixed_key(tmp_path)), end=NOISE_WINDOWS - 1)
    ran = Ran(tmp_path)
    assert ran.meta["ledger_id"] == FIXED_LEDGER_ID
    for query in queries:
        declared = ran.s * query.noise_scale  # from the ledger's s and the catalogue, not the rows' column
        values = np.array([r["value"] for r in ran.releases if r["query_id"] == query.query_id])
        assert values.size == NOISE_WINDOWS
        result = stats.kstest(values / declared, "norm")
        assert result.pvalue > FALSE_ALARM / len(queries), \
            f"{query.query_id}: KS D={result.statistic:.3f}, p={result.pvalue:.2g}, sample std {values.std():.3g} " \
            f"vs declared {declared:.3g}"


def test_the_ks_test_tells_a_query_released_at_the_ledgers_std_from_its_declared_one():
    # The power the test above relies on: 240 draws at std s standardised by s/2 (a scale
    # ignored by the release) are refused far below the false-alarm rate.
    draws = np.random.default_rng(5).standard_normal(NOISE_WINDOWS)
    assert stats.kstest(draws / FINE, "norm").pvalue < 1e-6
    assert stats.kstest(draws * FINE, "norm").pvalue < 1e-6


# --- the default ----------------------------------------------------------------------------------------


class _Bare:
    """A query object without a ``noise_scale`` (what a plan held before scales existed)."""

    def __init__(self, query: LinearQuery) -> None:
        self._query = query
        self.query_id, self.kind, self.dim, self.labels = query.query_id, query.kind, query.dim, query.labels

    def evaluate(self, rows):
        return self._query.evaluate(rows)


def test_the_default_scale_keeps_the_catalogue_json_and_the_releases_bit_for_bit(tmp_path):
    plain = default_queries(["a"])[0]
    explicit = LinearQuery.columns(plain.query_id, ["a"], description=plain.description, noise_scale=1.0)
    pinned = ('{"description":"daily sum of a","kind":"window","query_id":"sum:a",'
              '"spec":{"columns":["a"],"type":"columns"}}')
    assert plain.to_json() == explicit.to_json() == pinned and plain == explicit
    with_key = json.dumps({**json.loads(pinned), "noise_scale": 1.0})
    assert LinearQuery.from_json(with_key).to_json() == pinned

    rows = pa.table({"user_id": pa.array([1, 2, 3], pa.int64()), "a": pa.array([3.0, 0.7, -1.25])})
    charged = {}
    for name, query in (("plain", plain), ("explicit", explicit), ("bare", _Bare(plain))):
        ledger = Ledger(budget=1.0)
        state = ShardState(QueryPlan.starting_at([query], W0), ledger)
        got = [state.charge_window(W0 + t, rows, noise_std=1.5, policy="clip") for t in range(3)]  # user 1 clipped
        charged[name] = ([g.sums["sum:a"].tobytes() for g in got], ledger.to_arrow())
    # What the charge was before scales: the ledger's own contributions, summed.
    reference = Ledger(budget=1.0)
    sums = [reference.admit(np.array([1, 2, 3]), np.asarray(rows.column("a"))[:, None], noise_std=1.5,
                            policy="clip").contributions.sum(axis=0).tobytes() for _ in range(3)]
    assert charged["plain"][0] == charged["explicit"][0] == charged["bare"][0] == sums
    assert charged["plain"][1].equals(charged["explicit"][1]) and charged["plain"][1].equals(reference.to_arrow())

    key = NoiseKey.load_or_create(tmp_path / "k.key")
    released = []
    for query in (plain, explicit, _Bare(plain)):
        release = ReleaseWindow(key_path=str(tmp_path / "k.key"), plan=QueryPlan.starting_at([query], W0),
                                noise_std=1.5, window=WindowSpec.from_length("1d"), accounting="gdp",
                                key_fingerprint=key.fingerprint, ledger_id=FIXED_LEDGER_ID)
        release.setup()
        released.append(list(release.process(W0, {("sum:a", W0): np.array([2.5])})))
    assert released[0] == released[1] == released[2] and released[0][0]["noise_std"] == 1.5


# --- refused --------------------------------------------------------------------------------------------


def test_a_running_query_with_a_noise_scale_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"noise_scale applies only to window queries.*noise_scale=2\.0"):
        LinearQuery.columns("r", ["a"], kind="running", noise_scale=2.0)
    spec = json.loads(LinearQuery.columns("r", ["a"], kind="running").to_json())
    with pytest.raises(ValueError, match="noise_scale"):
        LinearQuery.from_json(json.dumps({**spec, "noise_scale": 0.5}))
    assert LinearQuery.columns("r", ["a"], kind="running", noise_scale=1.0).noise_scale == 1.0  # the default is fine
    with pytest.raises(SystemExit) as exc:
        main(["query", "add", "--store", str(tmp_path / "s.duckdb"), "--create", "--id", "r", "--columns", "a",
              "--kind", "running", "--noise-scale", "2", "--from", _day(0)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --noise-scale: noise_scale applies only to window" in err
    assert not (tmp_path / "s.duckdb").exists()


@pytest.mark.parametrize("value", [0, -1.0, 1e-4, 1e4, math.nan, math.inf, True, "2"])
def test_a_bad_noise_scale_is_refused_naming_it_the_value_and_the_range(value):
    with pytest.raises(ValueError, match=r"noise_scale must be a finite number in \[0\.001, 1000\].*got noise_scale="):
        LinearQuery.columns("q", ["a"], noise_scale=value)


@pytest.mark.parametrize("text", ["0", "nan", "inf", "1e4", "-2"])
def test_a_bad_noise_scale_on_the_command_line_is_refused_naming_the_option(tmp_path, capsys, text):
    with pytest.raises(SystemExit) as exc:
        main(["query", "add", "--store", str(tmp_path / "s.duckdb"), "--create", "--id", "q", "--columns", "a",
              "--noise-scale", text, "--from", _day(0)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --noise-scale: noise_scale must be" in err and "[0.001, 1000]" in err
    assert not (tmp_path / "s.duckdb").exists()


# --- declared with the query, public ---------------------------------------------------------------------


def test_query_add_records_the_scale_and_query_list_and_the_catalogue_view_show_it(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["query", "add", "--store", store, "--create", "--id", "fine", "--columns", "a", "--noise-scale",
                 "0.5", "--from", _day(0)]) == 0
    assert main(["query", "add", "--store", store, "--id", "plain", "--columns", "b", "--from", _day(0)]) == 0
    with QueryRegistry(store, read_only=True) as registry:
        assert registry.get("fine") == LinearQuery.columns("fine", ["a"], noise_scale=0.5)
    capsys.readouterr()
    assert main(["query", "list", "--store", store, "--format", "json"]) == 0
    assert [(r["query_id"], r["noise_scale"]) for r in json.loads(capsys.readouterr().out)] == \
        [("fine", 0.5), ("plain", 1.0)]
    assert main(["query", "list", "--store", store]) == 0
    assert [line.split()[5] for line in capsys.readouterr().out.splitlines()] == ["x0.5", "x1"]
    db = connect_read_only(store)  # the analysts' SQL
    try:
        assert db.execute("SELECT query_id, noise_scale FROM query_catalogue").fetchall() == [("fine", 0.5),
                                                                                                ("plain", 1.0)]
    finally:
        db.close()


def test_a_store_whose_catalogue_view_predates_the_scale_gets_it_on_a_read_write_open(tmp_path):
    path = tmp_path / "s.duckdb"
    _register(path, SCALED)
    db = duckdb.connect(str(path))
    db.execute("""CREATE OR REPLACE VIEW query_catalogue AS SELECT query_id, kind, description, labels,
                  len(labels) AS dim, effective_from, retired_from, registered_at, spec_json FROM query_registry""")
    db.close()
    with ReleaseStore(path):
        pass
    rows = _read(path, "SELECT query_id, noise_scale FROM query_catalogue ORDER BY query_id")
    comment = _read(path, "SELECT comment FROM duckdb_views() WHERE view_name = 'query_catalogue'")
    assert rows == [("coarse", COARSE), ("fine", FINE)] and "admitted" in comment[0][0]


def test_the_parquet_catalogue_records_the_scale_and_lists_it(tmp_path, capsys):
    root = str(tmp_path / "root")
    assert main(["query", "add", "--releases-parquet", root, "--create", "--id", "fine", "--columns", "a",
                 "--noise-scale", "0.5", "--from", _day(0)]) == 0
    ReleaseCatalogue(root).add(LinearQuery.columns("coarse", ["b"], noise_scale=2.0), effective_from=W0)
    catalogue = ReleaseCatalogue(root)
    assert {r.query_id: r.query.noise_scale for r in catalogue.registrations()} == {"coarse": 2.0, "fine": 0.5}
    assert catalogue.list().select(["query_id", "noise_scale"]).to_pylist() == [
        {"query_id": "coarse", "noise_scale": 2.0}, {"query_id": "fine", "noise_scale": 0.5}]
    (revision,) = [p for p in (tmp_path / "root" / "_queries").glob("revision-*2.json")]
    assert [q["query"].get("noise_scale") for q in json.loads(revision.read_text())["queries"]] == [2.0, 0.5]
    capsys.readouterr()
    assert main(["query", "list", "--releases-parquet", root, "--format", "json"]) == 0
    assert [r["noise_scale"] for r in json.loads(capsys.readouterr().out)] == [2.0, 0.5]
