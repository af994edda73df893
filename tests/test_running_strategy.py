"""The strategy of a running query (issues 9 and 20): chosen per query (``blt`` by default,
``sqrt`` or ``tree``) with its declared horizon, kept in the query registry, built by the pipeline
from it under prepaid admission, checked against the stored running state, and released end to
end on the Beam DirectRunner with DuckDB stores."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.pipelines.curator.store import CuratorStore
from renyi_stream.stream.engine.shard_state import QueryPlan, ShardState
from renyi_stream.queries.linear import LinearQuery, default_queries
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_store import ReleaseStore
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.prepaid import TreePrepaid, running_rule
from renyi_stream.stream.continual.strategies import BinaryTree, SquareRootFactorization
from renyi_stream.stream.engine.running import PrepaidUsers
from renyi_stream.stream.ledger import Ledger
from declared import flags

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
USERS = 40
DAYS = 20
EPSILON, DELTA, NORM_BUDGET = 1.0, 1e-5, 2000.0


# --- the query spec ------------------------------------------------------------------------------


def test_a_running_query_defaults_to_blt_over_365_windows_and_a_window_query_has_neither():
    assert LinearQuery.columns("r", ["x"], kind="running").strategy == "blt"
    assert LinearQuery.columns("r", ["x"], kind="running").horizon == 365
    assert LinearQuery.columns("w", ["x"]).strategy is None and LinearQuery.columns("w", ["x"]).horizon is None
    assert LinearQuery.columns("r", ["x"], kind="running") == LinearQuery.columns("r", ["x"], kind="running",
                                                                                 strategy="blt", horizon=365)
    assert LinearQuery.columns("r", ["x"], kind="running", strategy="tree") != \
        LinearQuery.columns("r", ["x"], kind="running")


@pytest.mark.parametrize("query", [
    LinearQuery.columns("r", ["x"], kind="running", strategy="tree"),
    LinearQuery.columns("r", ["x"], kind="running"),
    LinearQuery.columns("r", ["x"], kind="running", strategy="sqrt", horizon=90),
    LinearQuery.columns("r", ["x"], kind="running", horizon="tail"),
    LinearQuery.histogram("h", "tier", [0, 1], kind="running", strategy="tree"),
    LinearQuery.columns("w", ["x"]),
], ids=["tree", "blt", "sqrt-90", "blt-tail", "histogram-tree", "window"])
def test_the_strategy_round_trips_through_json(query):
    back = LinearQuery.from_json(query.to_json())
    assert back == query and back.strategy == query.strategy and back.to_json() == query.to_json()
    assert json.loads(query.to_json()).get("strategy") == query.strategy
    assert json.loads(query.to_json()).get("horizon") == query.horizon


def test_the_json_records_the_strategy_parameters_and_the_prepaid_rule():
    data = json.loads(LinearQuery.columns("r", ["x"], kind="running").to_json())
    shipped = BufferedLinearToeplitz.shipped(365, 4)
    assert data["rule"] == "prepaid" and data["horizon"] == 365
    assert data["strategy_spec"] == {"name": "blt", "theta": list(shipped.theta), "omega": list(shipped.omega),
                                     "horizon": 365}


def test_a_json_whose_recorded_parameters_disagree_with_its_strategy_is_refused():
    data = json.loads(LinearQuery.columns("r", ["x"], kind="running").to_json())
    data["strategy_spec"]["theta"][0] = 0.5
    with pytest.raises(ValueError, match="records strategy parameters"):
        LinearQuery.from_json(json.dumps(data))


@pytest.mark.parametrize("strategy, horizon, message", [
    ("tree", "tail", "needs strategy 'blt'"), ("sqrt", "tail", "needs strategy 'blt'"),
    ("blt", 0, "horizon must be"), ("blt", "forever", "horizon must be"),
])
def test_a_horizon_without_a_prepaid_rule_is_refused_naming_it(strategy, horizon, message):
    with pytest.raises(ValueError, match=message):
        LinearQuery.columns("r", ["x"], kind="running", strategy=strategy, horizon=horizon)


def test_a_window_query_json_has_no_strategy_key():
    # Stores hold this text: a window query's JSON is unchanged by strategies.
    assert "strategy" not in json.loads(LinearQuery.columns("w", ["x"]).to_json())


def test_a_stored_running_spec_without_a_strategy_loads_as_sqrt():
    old = ('{"description":"running total of x","kind":"running","query_id":"running:x",'
           '"spec":{"columns":["x"],"type":"columns"}}')
    query = LinearQuery.from_json(old)
    assert query.strategy == "sqrt" and query == default_queries(["x"], kind="running", strategy="sqrt")[0]


@pytest.mark.parametrize("build, message", [
    (lambda: LinearQuery.columns("r", ["x"], kind="running", strategy="fft"), "strategy must be one of"),
    (lambda: LinearQuery.columns("r", ["x"], kind="running", strategy=3), "strategy must be one of"),
    (lambda: LinearQuery.columns("r", ["x"], kind="running", strategy="window_sums"), "strategy must be one of"),
    (lambda: LinearQuery.columns("w", ["x"], strategy="tree"), "strategy applies only to running"),
    (lambda: LinearQuery.columns("w", ["x"], strategy="sqrt"), "strategy applies only to running"),
    (lambda: LinearQuery.from_json('{"query_id":"r","kind":"running","spec":{"type":"columns","columns":["x"]},'
                                   '"strategy":"Tree"}'), "strategy must be one of"),
    (lambda: default_queries(["x"], strategy="tree"), "strategy applies only to running"),
    (lambda: default_queries(["x"], kind="running", strategy="dense"), "strategy must be one of"),
])
def test_a_bad_strategy_is_refused_naming_the_parameter(build, message):
    with pytest.raises(ValueError, match=message) as info:
        build()
    assert "strategy=" in str(info.value)


def test_default_running_queries_take_the_strategy():
    assert {q.strategy for q in default_queries(["a", "b"], kind="running", strategy="tree")} == {"tree"}
    assert {q.strategy for q in default_queries(["a"], kind="running")} == {"blt"}
    assert {q.horizon for q in default_queries(["a"], kind="running", horizon="tail")} == {"tail"}


def test_the_registry_keeps_each_query_s_strategy(tmp_path):
    with QueryRegistry(tmp_path / "s.duckdb") as registry:
        registry.add(LinearQuery.columns("t", ["x"], kind="running", strategy="tree"), effective_from=5)
        registry.add(LinearQuery.columns("s", ["x"], kind="running"), effective_from=5)
        assert registry.get("t").strategy == "tree" and registry.get("s").strategy == "blt"
        assert {q.query_id: q.strategy for q, _, _ in registry.plan(5, 6)} == {"s": "blt", "t": "tree"}


# --- the pipeline builds the registered strategy, and refuses a stored state of another -----------------


def _plan(strategy: str, horizon=None) -> QueryPlan:
    return QueryPlan.starting_at([LinearQuery.columns("r", ["x"], kind="running", strategy=strategy,
                                                      horizon=horizon)], W0)


def test_the_plan_builds_the_registered_strategy():
    assert _plan("tree").running_query("r", 2.0).strategy == BinaryTree()
    assert _plan("sqrt").running_query("r", 2.0).strategy == SquareRootFactorization()
    assert _plan("blt").running_query("r", 2.0).strategy == BufferedLinearToeplitz.shipped(365, 4)


def test_a_shard_starts_a_new_prepaid_state_with_the_registered_strategy():
    shard = ShardState(_plan("tree"), Ledger(budget=100.0))
    rows = pa.table({"user_id": pa.array([1, 2], type=pa.int64()), "window_id": pa.array([W0, W0], type=pa.int64()),
                     "x": pa.array([1.0, 1.0])})
    for w in range(W0, W0 + 2):
        charged = shard.charge_window(w, rows.set_column(1, "window_id", pa.array([w, w], type=pa.int64())),
                                      noise_std=3.0, policy="drop")
    assert isinstance(shard.running["r"].rule, TreePrepaid) and shard.running["r"].rule.strategy == BinaryTree()
    # the shard reports a_t, the sum of what it admitted; the release state makes the tree's nodes
    np.testing.assert_array_equal(charged.sums["r"], [2.0])


@pytest.mark.parametrize("registered, stored", [("tree", ("sqrt", 365)), ("sqrt", ("tree", 365)),
                                                ("blt", ("blt", "tail")), ("blt", ("blt", 90))])
def test_a_stored_state_of_another_strategy_or_horizon_is_refused(registered, stored):
    state = PrepaidUsers(running_rule(*stored), strategy=stored[0], dim=1, start_window=W0)
    with pytest.raises(ValueError, match="registered with strategy .* stored running state"):
        ShardState(_plan(registered), Ledger(budget=1.0), {"r": state})


def test_a_stored_state_of_the_same_strategy_is_taken():
    state = PrepaidUsers(running_rule("tree", 365), strategy="tree", dim=1, start_window=W0)
    assert ShardState(_plan("tree"), Ledger(budget=1.0), {"r": state}).running["r"] is state


# --- the command line ------------------------------------------------------------------------------


def test_query_add_registers_a_tree_running_query(tmp_path, capsys):
    store = tmp_path / "s.duckdb"
    assert main(["query", "add", "--store", str(store), "--create", "--id", "tree:x", "--columns", "x", "--kind",
                 "running", "--strategy", "tree", "--from", "2026-03-01"]) == 0
    assert main(["query", "add", "--store", str(store), "--id", "sqrt:x", "--columns", "x", "--kind", "running",
                 "--from", "2026-03-01"]) == 0
    with QueryRegistry(store, read_only=True) as registry:
        assert registry.get("tree:x").strategy == "tree" and registry.get("sqrt:x").strategy == "blt"


def test_query_add_registers_the_declared_horizon_and_refuses_one_without_a_prepaid_rule(tmp_path, capsys):
    store = tmp_path / "s.duckdb"
    assert main(["query", "add", "--store", str(store), "--create", "--id", "r90", "--columns", "x", "--kind",
                 "running", "--horizon", "90", "--from", "2026-03-01"]) == 0
    assert main(["query", "add", "--store", str(store), "--id", "rtail", "--columns", "x", "--kind", "running",
                 "--horizon", "tail", "--from", "2026-03-01"]) == 0
    with QueryRegistry(store, read_only=True) as registry:
        assert (registry.get("r90").strategy, registry.get("r90").horizon) == ("blt", 90)
        assert registry.get("rtail").horizon == "tail"
    capsys.readouterr()
    try:
        code = main(["query", "add", "--store", str(store), "--id", "bad", "--columns", "x", "--kind", "running",
                     "--strategy", "tree", "--horizon", "tail", "--from", "2026-03-01"])
    except SystemExit as exc:  # a bad parameter: exit status 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "--horizon tail" in err and "needs strategy 'blt'" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["query", "add", "--store", "{t}/s.duckdb", "--id", "q", "--columns", "x", "--strategy", "tree",
     "--from", "2026-03-01"],
    ["query", "add", "--store", "{t}/s.duckdb", "--id", "q", "--columns", "x", "--kind", "running",
     "--strategy", "fft", "--from", "2026-03-01"],
    ["run", "--input", "{t}/in.parquet", "--store", "{t}/s.duckdb", "--ledger", "{t}/l.duckdb", "--epsilon", "1",
     "--delta", "1e-6", "--norm-budget", "5", "--start", "2026-03-01", "--end", "2026-03-01", "--quiet",
     "--strategy", "tree"],
    ["run", "--input", "{t}/in.parquet", "--store", "{t}/s.duckdb", "--ledger", "{t}/l.duckdb", "--epsilon", "1",
     "--delta", "1e-6", "--norm-budget", "5", "--start", "2026-03-01", "--end", "2026-03-01", "--quiet",
     "--release", "running", "--strategy", "cube"],
], ids=["query-window-kind", "query-unknown", "run-window-release", "run-unknown"])
def test_a_bad_strategy_option_exits_non_zero_naming_it(tmp_path, capsys, argv):
    _files(tmp_path, np.ones((1, USERS)), name="in")
    try:
        code = main([a.replace("{t}", str(tmp_path)) for a in argv])
    except SystemExit as exc:  # argparse refuses a choice outside the list
        code = exc.code
    assert code not in (0, None)
    err = capsys.readouterr().err
    assert "--strategy" in err and "Traceback" not in err
    assert not (tmp_path / "l.duckdb").exists()


# --- end to end: a tree running query on the DirectRunner --------------------------------------------


def _stream(seed: int = 11) -> np.ndarray:
    """(DAYS, USERS) binary indicator at a 30% rate."""
    return (np.random.default_rng(seed).random((DAYS, USERS)) < 0.3).astype(float)


def _files(tmp_path, data: np.ndarray, name: str = "day") -> list[str]:
    paths = []
    for day in range(data.shape[0]):
        path = tmp_path / (f"{name}{day:02d}.parquet" if data.shape[0] > 1 else f"{name}.parquet")
        pq.write_table(pa.table({
            "user_id": pa.array(np.arange(USERS), type=pa.int64()),
            "day": pa.array([DAY0 + dt.timedelta(days=day)] * USERS, type=pa.date32()),
            "churned": pa.array(data[day]),
        }), path)
        paths.append(str(path))
    return paths


def _run(tmp_path, paths, *, name, start, end, strategy="tree"):
    argv = ["run", "--input", *paths, "--store", str(tmp_path / f"{name}.releases.duckdb"),
            "--ledger", str(tmp_path / f"{name}.ledger.duckdb"), "--key", str(tmp_path / "shared.key"),
            "--epsilon", str(EPSILON), "--delta", str(DELTA), "--norm-budget", str(NORM_BUDGET),
            "--start", str(DAY0 + dt.timedelta(days=start)), "--end", str(DAY0 + dt.timedelta(days=end)),
            "--shards", "3", "--release", "running", "--quiet",
            *flags("int64", "churned=0:1")]  # the ledger's declared input (issue 28): a 0/1 indicator
    return main(argv + (["--strategy", strategy] if strategy else []))


def _released(tmp_path, name) -> pa.Table:
    with ReleaseStore(str(tmp_path / f"{name}.releases.duckdb"), read_only=True) as store:
        table = store.read()
    return table.sort_by([("query_id", "ascending"), ("window_id", "ascending")]).select(
        ["query_id", "window_id", "value", "noise_std", "kind"])


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tree")
    data = _stream()
    paths = _files(tmp_path, data)
    CuratorStore(tmp_path / "one.ledger.duckdb").close()  # a backup of the new ledger, before its first run
    shutil.copy(tmp_path / "one.ledger.duckdb", tmp_path / "pristine.ledger.duckdb")
    assert _run(tmp_path, paths, name="one", start=0, end=DAYS - 1) == 0
    return tmp_path, data, paths


def test_a_tree_running_query_is_registered_and_released_every_day(tree_run):
    tmp_path, _, _ = tree_run
    with QueryRegistry(tmp_path / "one.releases.duckdb", read_only=True) as registry:
        assert registry.get("running:churned").strategy == "tree"
    released = _released(tmp_path, "one")
    assert released.column("window_id").to_pylist() == [W0 + d for d in range(DAYS)]
    assert set(released.column("kind").to_pylist()) == {"running"}


def test_the_released_noise_std_is_the_tree_estimate_std(tree_run):
    tmp_path, _, _ = tree_run
    s = calibrate(epsilon=EPSILON, delta=DELTA, norm_budget=NORM_BUDGET, accounting="gdp").noise_std
    expected = BinaryTree().estimate_std(DAYS, noise_std=s)
    np.testing.assert_allclose(_released(tmp_path, "one").column("noise_std").to_numpy(), expected, rtol=1e-12)
    # and not the square-root factorisation's: the two differ at every day but the first
    assert not np.allclose(expected[1:], SquareRootFactorization().estimate_std(DAYS, noise_std=s)[1:])


def test_tree_running_totals_track_the_truth_within_their_std(tree_run):
    tmp_path, data, _ = tree_run
    released = _released(tmp_path, "one")
    z = (released.column("value").to_numpy() - np.cumsum(data.sum(axis=1))) / released.column("noise_std").to_numpy()
    assert np.all(np.abs(z) < 4.5)  # nobody is filtered at this budget; P(any |z| > 4.5) < 20 * 7e-6


def test_tree_users_are_prepaid_every_node_their_contributions_will_reach_over_the_horizon(tree_run):
    tmp_path, data, _ = tree_run
    s = calibrate(epsilon=EPSILON, delta=DELTA, norm_budget=NORM_BUDGET, accounting="gdp").noise_std
    c = BinaryTree().query_matrix(365)  # the declared schedule: 365 windows from the first
    db = duckdb.connect(str(tmp_path / "one.ledger.duckdb"), read_only=True)
    try:
        used = dict(db.execute("SELECT user_id, used FROM ledger").fetchall())
        meta = dict(db.execute("SELECT query_id, meta FROM prepaid_meta").fetchall())
    finally:
        db.close()
    recorded = json.loads(meta["running:churned"])
    assert json.loads(recorded["strategy"]) == {"name": "tree", "height": None} and recorded["horizon"] == "365"
    for user in (0, 5, 33):
        x = np.zeros(365)
        x[:DAYS] = data[:, user]
        q = c @ x  # every node, released or still to come, holding the user's admitted days
        assert used[user] == pytest.approx(np.sum(q**2) / (2 * s * s), rel=1e-8)


def test_a_rerun_of_a_tree_running_query_is_identical(tree_run):
    tmp_path, _, paths = tree_run
    # The same days again on the same store and ledger: nothing new is released or charged.
    before = _released(tmp_path, "one")
    assert _run(tmp_path, paths, name="one", start=0, end=DAYS - 1) == 0
    assert _released(tmp_path, "one").equals(before)
    # A fresh store and the same ledger restored from before its first run (one ledger id: a
    # second ledger would draw its own noise), the days in three runs: the identical releases.
    shutil.copy(tmp_path / "pristine.ledger.duckdb", tmp_path / "again.ledger.duckdb")
    for start, end in ((0, 0), (1, 6), (7, DAYS - 1)):
        assert _run(tmp_path, paths[start:end + 1], name="again", start=start, end=end) == 0
    again = _released(tmp_path, "again")
    np.testing.assert_allclose(again.column("value").to_numpy(), before.column("value").to_numpy(),
                               rtol=0, atol=1e-9)
    np.testing.assert_array_equal(again.column("noise_std").to_numpy(), before.column("noise_std").to_numpy())


def test_a_stored_state_that_disagrees_with_the_registered_strategy_is_refused(tree_run, capsys):
    tmp_path, _, paths = tree_run
    for suffix in ("releases", "ledger"):  # copies keep their modes: a ledger is refused unless 0600
        shutil.copy(tmp_path / f"one.{suffix}.duckdb", tmp_path / f"swap.{suffix}.duckdb")
    store = str(tmp_path / "swap.releases.duckdb")
    db = duckdb.connect(store)
    try:  # the registry now says sqrt, while the ledger's history was made by the tree
        spec = json.loads(db.execute("SELECT spec_json FROM query_registry").fetchone()[0])
        spec["strategy"] = "sqrt"
        del spec["strategy_spec"]  # as a record without the parameters would read
        db.execute("UPDATE query_registry SET spec_json = ?", [json.dumps(spec)])
    finally:
        db.close()
    ledger_before = _ledger_rows(tmp_path / "swap.ledger.duckdb")
    extra = _files(tmp_path, _stream(12)[:1], name="extra")  # one more day
    day = DAY0 + dt.timedelta(days=DAYS)
    pq.write_table(pq.read_table(extra[0]).set_column(1, "day", pa.array([day] * USERS, type=pa.date32())), extra[0])
    try:
        code = _run(tmp_path, extra, name="swap", start=DAYS, end=DAYS, strategy=None)
    except Exception as exc:  # raised inside the Beam pipeline, before anything is committed
        assert "registered with strategy" in str(exc)
    else:
        assert code != 0 and "registered with strategy" in capsys.readouterr().err
    assert _ledger_rows(tmp_path / "swap.ledger.duckdb") == ledger_before
    assert _released(tmp_path, "swap").num_rows == DAYS


def _ledger_rows(path) -> tuple:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return (db.execute("SELECT user_id, used FROM ledger ORDER BY user_id").fetchall(),
                db.execute("SELECT count(*) FROM prepaid_state").fetchone()[0],
                db.execute("SELECT count(*) FROM running_releases").fetchone()[0])
    finally:
        db.close()


def test_a_registered_query_above_the_bounds_is_refused_at_launch_before_anyone_is_charged(tmp_path, capsys):
    # A catalogue entry written by an older version (or by hand), bypassing registration: sqrt over
    # 16384 windows, whose rule would keep a dense 16384 x 16384 matrix (2 GiB).
    store = tmp_path / "big.releases.duckdb"
    with QueryRegistry(store) as registry:
        registry.add(LinearQuery.columns("running:churned", ["churned"], kind="running", strategy="sqrt"),
                     effective_from=W0)
    db = duckdb.connect(str(store))
    try:
        spec = json.loads(db.execute("SELECT spec_json FROM query_registry").fetchone()[0])
        spec["horizon"] = 16384
        db.execute("UPDATE query_registry SET spec_json = ?", [json.dumps(spec)])
    finally:
        db.close()
    paths = _files(tmp_path, _stream()[:1])
    capsys.readouterr()
    try:
        code = _run(tmp_path, paths, name="big", start=0, end=0, strategy=None)
    except ValueError as exc:
        message = str(exc)
    else:
        assert code != 0
        message = capsys.readouterr().err
    assert "horizon must be in [1, 1024] for strategy 'sqrt'" in message and "got horizon=16384" in message
    assert "'running:churned'" in message and "--strategy blt" in message
    ledger = tmp_path / "big.ledger.duckdb"
    if ledger.exists():  # nobody charged: no ledger row, no prepaid row, nothing released
        db = duckdb.connect(str(ledger), read_only=True)
        try:
            tables = {t for (t,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            assert all(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0
                       for t in ("ledger", "prepaid_state", "running_releases") if t in tables)
        finally:
            db.close()
