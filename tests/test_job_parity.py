"""The three jobs answer the same registered queries the same way (issue 19, feature parity).

``renyi-stream run`` answers the queries of its DuckDB release store; the distributed and
streaming jobs answer those of the catalogue beside their Parquet release root
(:mod:`renyi_stream.queries.catalogue`), registered by ``renyi-stream query add --releases-parquet ROOT``
under the same rules (:mod:`renyi_stream.queries.registration`). Given the same registrations (a weighted
sum, a clamp, a numeric histogram retired mid-way, a string-category histogram registered
mid-way) and the same rows, every job releases the same rows with the same sums: each adds its
own ledger's noise (bound to its random ledger id, :class:`renyi_stream.stream.noise.NoiseBinding`), which
the tests take off again with the key. The distributed and streaming jobs keep a running
query's state from run to run and from job to job (the conformance suite compares their running
totals with the daily job's); the streaming job takes string ids.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main as cli
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.pipelines.distributed import job as dist
from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.books import books
from renyi_stream.pipelines.streaming.codec import encode_message
from renyi_stream.pipelines.streaming.file_metadata import SNAPSHOT_LEDGER_ID, SNAPSHOT_QUERIES, SNAPSHOT_QUERY_PLAN
from renyi_stream.queries.catalogue import ReleaseCatalogue, queries_at_launch
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registry import QueryRegistry
from renyi_stream.queries.release_files import write_release_file
from renyi_stream.queries.release_store import ReleaseStore
from renyi_stream.stream.accounting.gaussian import MAX_DIM
from renyi_stream.stream.contract import DeclaredColumn, InputContract
from renyi_stream.stream.noise import NoiseBinding, NoiseKey, gaussian_noise

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
EPSILON, DELTA = 1.0, 1e-6
#: Large enough that nobody reaches it in three days (||v||^2 <= 17.25 a day): every row is
#: admitted, so the released sums are the plain sums of the queries over the rows.
NORM_BUDGET = 60.0
#: Registered before the first run, from the first day (``tiers`` retired from the third).
FIRST = [
    ["--id", "spend_score", "--weighted", "opened=2,spent=0.5", "--description", "2 opened + spent/2"],
    ["--id", "capped_spend", "--clamp", "spent", "--lo", "0", "--hi", "1"],
    ["--id", "tiers", "--histogram", "tier", "--categories", "0,1,2"],
]
#: Registered mid-way, after the first two days are released, from the third.
MIDWAY = ["--id", "plans", "--histogram", "plan", "--categories", "free,pro"]


def _rows(day: int, users, seed: int = 3, string_ids: bool = False) -> pa.Table:
    rng = np.random.default_rng(seed + day)
    n = len(users)
    ids = pa.array([f"u{u:04d}" for u in users]) if string_ids else pa.array(users, type=pa.int64())
    return pa.table({"user_id": ids, "day": pa.array([DAY0 + dt.timedelta(days=day)] * n, type=pa.date32()),
                     "opened": pa.array((rng.random(n) < 0.5).astype(np.float64)),
                     "spent": pa.array(np.round(rng.random(n) * 3, 3)),
                     "tier": pa.array(rng.integers(0, 4, n).astype(np.float64)),  # 3: in no bucket
                     "plan": pa.array(rng.choice(["free", "pro", "team"], n))})  # team: in no bucket


def _files(tmp_path: Path, tables: list[pa.Table]) -> tuple[list[str], list[list[str]]]:
    (tmp_path / "in").mkdir(exist_ok=True)
    files, messages = [], []
    for d, table in enumerate(tables):
        files.append(str(tmp_path / "in" / f"day-{d}.parquet"))
        pq.write_table(table, files[-1])
        messages.append([])
        for k, part in enumerate((table.slice(0, 40), table.slice(40))):
            path = tmp_path / "in" / f"day-{d}-{k}.arrows"
            path.write_bytes(encode_message(part))
            messages[-1].append(str(path))
    return files, messages


def _key(tmp_path: Path) -> str:
    path = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(path)
    return str(path)


def _register(where: list[str], query: list[str], start: str) -> None:
    """Register ``query`` from ``start``; the store (or root) is made by the first registration,
    before the jobs' first run (``--create``)."""
    assert cli(["query", "add", *where, "--create", *query, "--from", start]) == 0


def _first_queries(where: list[str]) -> None:
    for query in FIRST:
        _register(where, query, "2026-03-01")


def _midway(where: list[str]) -> None:
    _register(where, MIDWAY, "2026-03-03")
    assert cli(["query", "retire", *where, "--id", "tiers", "--from", "2026-03-03"]) == 0


#: The input contract of :func:`_rows`' columns, as the registered queries read them, that each new
#: ledger's first run declares (issue 28): a 0/1 indicator, a spend in [0, 3], a tier code (a
#: number without a default sum) and a plan (text categories).
CONTRACT_COLUMNS = (DeclaredColumn("opened", "number", 0.0, 1.0), DeclaredColumn("spent", "number", 0.0, 3.0),
                    DeclaredColumn("tier"), DeclaredColumn("plan", "category"))


def _contract(id_type: str = "int64") -> InputContract:
    return InputContract(id_type, CONTRACT_COLUMNS)


def _declare(id_type: str = "int64") -> list[str]:
    """:func:`_contract` as the distributed and streaming jobs' options."""
    return ["--id-type", id_type, "--column", "opened=0:1", "--column", "spent=0:3", "--column", "tier",
            "--category", "plan"]


def _promise(tmp_path: Path) -> list[str]:
    return ["--epsilon", str(EPSILON), "--delta", str(DELTA), "--norm-budget", str(NORM_BUDGET),
            "--noise-key", _key(tmp_path)]


# --- the three jobs ---------------------------------------------------------------------------------


def _daily(tmp_path: Path, files: list[str]) -> list[tuple]:
    root = tmp_path / "daily"
    root.mkdir()
    store, ledger = str(root / "s.duckdb"), str(root / "l.duckdb")
    _first_queries(["--store", store])

    def run(inputs, first, last, contract=None):
        return run_job(JobConfig(inputs=tuple(inputs), store=store, ledger=ledger, epsilon=EPSILON, delta=DELTA,
                                 norm_budget=NORM_BUDGET, start_window=first, end_window=last,
                                 key_path=_key(tmp_path), n_shards=3, contract=contract))

    assert run(files[:2], W0, W0 + 1, _contract("string")).balanced  # the new ledger's first run declares
    _midway(["--store", store])
    assert run(files[2:], W0 + 2, W0 + 2).balanced
    with duckdb.connect(store, read_only=True) as con:
        rows = con.execute("SELECT query_id, window_id, coordinate, label, value, noise_std FROM releases "
                           "ORDER BY 1, 2, 3").fetchall()
        (ledger_id,) = con.execute("SELECT value FROM store_meta WHERE key = 'ledger_id'").fetchone()
    return _without_noise(rows, tmp_path, ledger_id)


def _distributed(tmp_path: Path, files: list[str]) -> list[tuple]:
    public, run1, run2 = tmp_path / "dist-public", tmp_path / "dist" / "run1", tmp_path / "dist" / "run2"
    _first_queries(["--releases-parquet", str(public)])

    def args(inputs, start, end, previous, output, *declare):
        return ["--input", *inputs, "--start", start, "--end", end, "--previous-ledger", previous,
                "--output", str(output), "--releases-parquet", str(public), "--shards", "2", *_promise(tmp_path),
                *declare]

    assert dist.main(args(files[:2], "2026-03-01", "2026-03-02", "none", run1, *_declare("string"))) == 0
    _midway(["--releases-parquet", str(public)])
    assert dist.main(args(files[2:], "2026-03-03", "2026-03-03", str(run1), run2)) == 0
    ledger_id = json.loads((run2 / dist.COMMITTED).read_text())["parameters"]["ledger_id"]
    return _without_noise(_parquet(public), tmp_path, ledger_id)


def _streaming(tmp_path: Path, messages: list[list[str]], *extra: str) -> list[tuple]:
    public, job1, job2 = tmp_path / "stream-public", tmp_path / "stream" / "job1", tmp_path / "stream" / "job2"
    _first_queries(["--releases-parquet", str(public)])

    def args(replay, start, end, previous, output, *declare):
        return ["--replay", *replay, "--start", start, "--end", end, "--previous-ledger", previous,
                "--output", str(output), "--releases-parquet", str(public), "--shards", "3",
                *_promise(tmp_path), *declare, *extra]

    assert sj.main(args(messages[0] + messages[1], "2026-03-01", "2026-03-02", "none", job1,
                        *_declare("string"))) == 0
    _midway(["--releases-parquet", str(public)])
    snapshots = f"{job1}/ledger/window_id={W0 + 1}/*/*.parquet"
    assert sj.main(args(messages[2], "2026-03-03", "2026-03-03", snapshots, job2)) == 0
    (ledger_id,) = {pq.read_schema(f).metadata[SNAPSHOT_LEDGER_ID.encode()].decode()
                    for f in (job2 / "ledger").rglob("*.parquet")}
    return _without_noise(_parquet(public), tmp_path, ledger_id)


def _parquet(root: Path) -> list[tuple]:
    with duckdb.connect() as con:
        return con.execute(f"SELECT query_id, window_id, coordinate, label, value, noise_std FROM read_parquet("
                           f"'{root}/*/*.parquet', hive_partitioning = true) ORDER BY 1, 2, 3").fetchall()


def _without_noise(rows: list[tuple], tmp_path: Path, ledger_id: str) -> list[tuple]:
    """Release rows (query_id, window_id, coordinate, label, value, noise_std) with the keyed noise
    of ledger ``ledger_id`` taken off ``value``: the sums that were noised (tests/test_deploy.py)."""
    binding = NoiseBinding(NoiseKey.load(_key(tmp_path)), ledger_id)
    return [(q, w, c, label, v - float(gaussian_noise(binding, query_id=q, window_id=w, dim=c + 1,
                                                          noise_std=s)[c]), s)
            for q, w, c, label, v, s in rows]


def _expected(tables: list[pa.Table]) -> dict[tuple[str, int, int], float]:
    """The exact sums of the registered queries over the rows, per (query, window, coordinate)."""
    out = {}
    for d, t in enumerate(tables):
        w = W0 + d
        opened, spent = t.column("opened").to_numpy(), t.column("spent").to_numpy()
        out[("spend_score", w, 0)] = float(np.sum(2 * opened + 0.5 * spent))
        out[("capped_spend", w, 0)] = float(np.sum(np.clip(spent, 0, 1)))
        if d < 2:
            for k in range(3):
                out[("tiers", w, k)] = float(np.sum(t.column("tier").to_numpy() == k))
        else:
            plans = np.asarray(t.column("plan").to_pylist())
            out[("plans", w, 0)], out[("plans", w, 1)] = float(np.sum(plans == "free")), float(np.sum(plans == "pro"))
    return out


def _same_sums(job: list[tuple], reference: list[tuple], expected: dict) -> None:
    assert [r[:4] + (r[5],) for r in job] == [r[:4] + (r[5],) for r in reference]
    for mine, theirs in zip(job, reference):
        # Equal but for the order in which the shards' partial sums are added (last bits).
        assert mine[4] == pytest.approx(theirs[4], rel=1e-12, abs=1e-9)
        assert mine[4] == pytest.approx(expected[mine[:3]], rel=1e-9, abs=1e-6)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The three jobs over the same three days of 90 of 150 users with string ids, each with its own
    catalogue of the same registrations; returns their release rows with the noise taken off."""
    tmp_path = tmp_path_factory.mktemp("jobs")
    rng = np.random.default_rng(5)
    tables = [_rows(d, rng.choice(150, 90, replace=False), string_ids=True) for d in range(3)]
    files, messages = _files(tmp_path, tables)
    return {"tmp": tmp_path, "expected": _expected(tables), "daily": _daily(tmp_path, files),
            "distributed": _distributed(tmp_path, files), "streaming": _streaming(tmp_path, messages)}


def test_the_three_jobs_release_the_same_sums_of_the_same_registered_queries(jobs):
    daily, expected = jobs["daily"], jobs["expected"]
    assert {r[:3] for r in daily} == set(expected)  # tiers retired and plans registered on day 3
    assert {(r[0], r[3]) for r in daily if r[0] in ("tiers", "plans")} == {
        ("tiers", "tier=0"), ("tiers", "tier=1"), ("tiers", "tier=2"), ("plans", "plan=free"), ("plans", "plan=pro")}
    _same_sums(daily, daily, expected)
    _same_sums(jobs["distributed"], daily, expected)
    _same_sums(jobs["streaming"], daily, expected)


def test_the_distributed_manifest_and_the_streaming_snapshots_record_which_queries_from_which_window(jobs):
    tmp_path = jobs["tmp"]
    manifest = json.loads((tmp_path / "dist" / "run2" / dist.COMMITTED).read_text())
    assert [(q["query_id"], q["first_window"], q["retired_from"]) for q in manifest["query_plan"]] == [
        ("capped_spend", W0, None), ("plans", W0 + 2, None), ("spend_score", W0, None)]
    assert manifest["queries"] == {"capped_spend": W0, "plans": W0 + 2, "spend_score": W0, "tiers": W0}
    first = json.loads((tmp_path / "dist" / "run1" / dist.COMMITTED).read_text())["query_plan"]
    assert [(q["query_id"], q["retired_from"]) for q in first] == [
        ("capped_spend", None), ("spend_score", None), ("tiers", None)]  # retired after the run's windows
    for job, window, answered in (("job1", W0, {"capped_spend", "spend_score", "tiers"}),
                                  ("job2", W0 + 2, {"capped_spend", "plans", "spend_score", "tiers"})):
        for path in (tmp_path / "stream" / job / "ledger" / f"window_id={window}").rglob("*.parquet"):
            meta = pq.read_schema(path).metadata
            assert set(json.loads(meta[SNAPSHOT_QUERIES.encode()])) == answered
            assert {q["query_id"] for q in json.loads(meta[SNAPSHOT_QUERY_PLAN.encode()])} <= answered


def _streamed_ledger(tmp_path: Path) -> pa.Table:
    folder = tmp_path / "stream" / "job2" / "ledger" / f"window_id={W0 + 2}"
    return pa.concat_tables([pq.read_table(f) for f in sorted(folder.rglob("*.parquet"))]).sort_by("user_id")


def test_the_jobs_ledgers_charge_the_registered_queries_alike(jobs):
    tmp_path = jobs["tmp"]
    with duckdb.connect(str(tmp_path / "daily" / "l.duckdb"), read_only=True) as con:
        daily = con.execute("SELECT user_id, used FROM ledger ORDER BY user_id").fetchall()
    manifest = json.loads((tmp_path / "dist" / "run2" / dist.COMMITTED).read_text())
    snapshot = pa.concat_tables([pq.read_table(f) for f in manifest["ledger_files"]]).sort_by("user_id")
    assert list(zip(snapshot.column("user_id").to_pylist(), snapshot.column("used").to_pylist())) == daily
    streamed = _streamed_ledger(tmp_path)
    assert list(zip(streamed.column("user_id").to_pylist(), streamed.column("used").to_pylist())) == daily


# --- a new ledger's first run declares its input contract (issue 28) ---------------------------------


@pytest.mark.parametrize("undeclared", [(), ("--columns", "opened"), ("--id-type", "int64")],
                         ids=["nothing", "columns-before-contracts", "id-type-alone"])
def test_the_distributed_job_refuses_a_new_ledger_without_a_declaration_naming_the_options(tmp_path, capsys,
                                                                                         undeclared):
    """Neither nothing, nor the --columns of ledgers recorded before contracts, nor an id type
    alone declares a new ledger's contract: the run is refused at launch, naming --id-type and
    --column, before anything is written under --output (no intent, no ledger) or released."""
    files, _ = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3])])
    public, output = tmp_path / "public", tmp_path / "run1"
    argv = ["--input", files[0], "--start", "2026-03-01", "--end", "2026-03-01", "--previous-ledger", "none",
            "--output", str(output), "--releases-parquet", str(public), "--shards", "2", *_promise(tmp_path)]
    assert dist.main([*argv, *undeclared]) == 2
    err = capsys.readouterr().err
    assert "a new ledger (--previous-ledger none) needs its input contract" in err, err[-800:]
    assert "--id-type int64|string" in err and "--column NAME=LO:HI" in err, err[-800:]
    assert not output.exists() and not list(public.rglob("*.parquet"))
    assert dist.main([*argv, *_declare()]) == 0  # the same run, declared, goes on
    assert json.loads((output / dist.COMMITTED).read_text())["parameters"]["id_type"] == "int64"


# --- running totals in the distributed and streaming jobs: state carried, continuations checked ------


def _with_a_running_query(root: Path) -> None:
    """A catalogue holding a running total (the command line refuses to register one there; the
    library takes it, as a catalogue written by a later version could hold one)."""
    catalogue = ReleaseCatalogue(str(root))
    catalogue.add(LinearQuery.columns("sum:opened", ["opened"]), effective_from=W0)
    catalogue.add(LinearQuery.columns("total_opened", ["opened"], kind="running"), effective_from=W0)


def _one_day(tmp_path: Path) -> tuple[str, str]:
    """A day of five users as a Parquet file and as one message."""
    files, messages = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3])])
    return files[0], messages[0][0]


def _distributed_day(tmp_path: Path, day: str, run: str, previous: str, public: Path) -> tuple[int, str]:
    """A new ledger's run (``previous`` "none") declares :func:`_declare`; a continuation keeps it."""
    argv = ["--input", day, "--start", run[1], "--end", run[1], "--previous-ledger", previous,
            "--output", str(tmp_path / run[0]), "--releases-parquet", str(public), *_promise(tmp_path),
            *(_declare() if previous == "none" else ())]
    return dist.main(argv), str(tmp_path / run[0])


def test_the_distributed_job_keeps_a_running_querys_state_in_its_committed_manifest(tmp_path):
    """The per-user prepaid rows beside the ledger (listed in the manifest, read back by the next
    run), the release state and the releases ``y`` in the manifest; a window without rows still
    advances the release state (public-schedule)."""
    files, _ = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(1, [])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    code, run1 = _distributed_day(tmp_path, files[0], ("run1", "2026-03-01"), "none", public)
    assert code == 0
    code, run2 = _distributed_day(tmp_path, files[1], ("run2", "2026-03-02"), run1, public)
    assert code == 0
    first, second = (json.loads((Path(r) / dist.COMMITTED).read_text())["running"]["total_opened"] for r in (run1, run2))
    assert first["prepaid"]["users"] == second["prepaid"]["users"] == 5
    assert first["prepaid"]["meta"]["strategy_name"] == "blt" and first["prepaid"]["meta"]["horizon"] == "365"
    rows = pa.concat_tables([pq.read_table(f) for f in second["prepaid"]["files"]])
    assert sorted(rows.column("user_id").to_pylist()) == [1, 2, 3, 4, 5]
    assert all(f.startswith(run2) for f in second["prepaid"]["files"])  # rewritten by the run, not linked
    assert (int(first["release"]["meta"]["next_window"]), int(second["release"]["meta"]["next_window"])) == \
        (W0 + 1, W0 + 2)
    assert [w for w, _ in second["raw"]] == [W0, W0 + 1]
    assert {(q, w) for q, w, *_ in _parquet(public)} == {(q, w) for q in ("sum:opened", "total_opened")
                                                          for w in (W0, W0 + 1)}


def test_the_distributed_job_refuses_a_run_that_would_skip_a_window_of_a_running_query_naming_it(tmp_path, capsys):
    files, _ = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(2, [1, 2])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    code, run1 = _distributed_day(tmp_path, files[0], ("run1", "2026-03-01"), "none", public)
    assert code == 0
    code, _ = _distributed_day(tmp_path, files[1], ("run2", "2026-03-03"), run1, public)
    err = capsys.readouterr().err
    assert code == 2 and "running query 'total_opened'" in err and f"skip window {W0 + 1}" in err, err[-800:]
    assert not (tmp_path / "run2").exists() and {w for _, w, *_ in _parquet(public)} == {W0}


def test_the_distributed_job_refuses_a_stored_running_state_of_another_strategy_at_launch(tmp_path, capsys):
    """The previous manifest's release state made under another strategy (an output of another
    ledger, or edited) cannot be continued by the registered query: its buffers are another C's."""
    files, _ = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(1, [1, 2])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    code, run1 = _distributed_day(tmp_path, files[0], ("run1", "2026-03-01"), "none", public)
    assert code == 0
    path = Path(run1) / dist.COMMITTED
    manifest = json.loads(path.read_text())
    manifest["running"]["total_opened"]["release"]["meta"]["horizon"] = "400"
    path.write_text(json.dumps(manifest))
    code, _ = _distributed_day(tmp_path, files[1], ("run2", "2026-03-02"), run1, public)
    err = capsys.readouterr().err
    assert code == 2 and "'total_opened'" in err and "refusing" in err, err[-800:]
    assert not (tmp_path / "run2").exists()


def test_the_distributed_job_refuses_a_catalogued_running_query_above_the_bounds_at_launch(tmp_path, capsys):
    """A catalogue revision written by an older version (or by hand), bypassing registration: a
    sqrt running query over 16384 windows (a dense 16384 x 16384 matrix, 2 GiB) is refused at
    launch, naming it, before anyone is charged or anything is released."""
    files, _ = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3])])
    public = tmp_path / "public"
    ReleaseCatalogue(str(public)).add(LinearQuery.columns("total_opened", ["opened"], kind="running",
                                                          strategy="sqrt"), effective_from=W0)
    (revision,) = (public / "_queries").iterdir()
    data = json.loads(revision.read_text())
    data["queries"][0]["query"]["horizon"] = 16384
    revision.write_text(json.dumps(data))
    assert ReleaseCatalogue(str(public)).read().registrations[0].query.horizon == 16384  # readable: retirable
    code, _ = _distributed_day(tmp_path, files[0], ("run1", "2026-03-01"), "none", public)
    err = capsys.readouterr().err
    assert code == 2 and "horizon must be in [1, 1024] for strategy 'sqrt'" in err, err[-800:]
    assert "'total_opened'" in err and "got horizon=16384" in err
    assert not (tmp_path / "run1").exists() and not list(public.glob("*/*.parquet"))  # nothing released


def test_the_distributed_job_does_not_commit_when_a_running_querys_prepaid_rows_come_back_short(tmp_path):
    """A prepaid file truncated (or lost) after its run committed would restart its users'
    prepaid charges from nothing: the next run reads back fewer users than the manifest lists
    and fails before its commit point, so nothing it charged counts and nothing is public."""
    files, _ = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(1, [1, 2])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    code, run1 = _distributed_day(tmp_path, files[0], ("run1", "2026-03-01"), "none", public)
    assert code == 0
    record = json.loads((Path(run1) / dist.COMMITTED).read_text())["running"]["total_opened"]["prepaid"]
    fullest = max(record["files"], key=lambda f: pq.read_metadata(f).num_rows)
    table = pq.read_table(fullest)
    pq.write_table(table.slice(0, table.num_rows - 1), fullest)  # one user's row lost
    with pytest.raises(Exception, match="prepaid rows hold"):
        _distributed_day(tmp_path, files[1], ("run2", "2026-03-02"), run1, public)
    assert not (tmp_path / "run2" / dist.COMMITTED).exists() and {w for _, w, *_ in _parquet(public)} == {W0}


def _streaming_days(tmp_path: Path, messages: list[str], days: tuple[str, str], output: str, previous: str,
                    public: Path) -> int:
    argv = ["--replay", *messages, "--start", days[0], "--end", days[1], "--output", str(tmp_path / output),
            "--releases-parquet", str(public), "--previous-ledger", previous, "--shards", "2", *_promise(tmp_path),
            *(_declare() if previous == "none" else ())]  # a new ledger declares its contract
    return sj.main(argv)


def test_the_streaming_job_commits_a_running_querys_state_with_each_window(tmp_path):
    """Every shard's per-user prepaid rows and the query's release state (with its estimates'
    decoder: 1 + buffers rows whatever the window, never the series so far) are written per window
    beside the ledger snapshots; a window without rows still advances the release state
    (public-schedule)."""
    _, messages = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(1, [])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    assert _streaming_days(tmp_path, messages[0] + messages[1], ("2026-03-01", "2026-03-02"), "curator", "none",
                           public) == 0
    curator = tmp_path / "curator"
    shapes = {}
    for window in (W0, W0 + 1):
        prepaid = pa.concat_tables([pq.read_table(f) for f in (curator / "prepaid" / f"window_id={window}").rglob(
            "*.parquet")])
        assert sorted(prepaid.column("user_id").to_pylist()) == [1, 2, 3, 4, 5]
        (state,) = (curator / "running" / f"window_id={window}").glob("*.parquet")
        meta = pq.read_schema(state).metadata
        assert meta[b"next_window"] == str(window + 1).encode() and meta[b"strategy_name"] == b"blt"
        decoder = json.loads(meta[b"renyi_stream.running_decoder"])
        shapes[window] = decoder["shape"]
        assert len(decoder["values"]) == decoder["shape"][0] * decoder["shape"][1] and b"renyi_stream.running_raw" not in meta
    assert shapes[W0] == shapes[W0 + 1] and shapes[W0][1] == 1 and 2 <= shapes[W0][0] <= 9  # (1 + buffers, dim)
    assert {(q, w) for q, w, *_ in _parquet(public)} == {(q, w) for q in ("sum:opened", "total_opened")
                                                          for w in (W0, W0 + 1)}


def _a_first_day_with_its_running_state_changed(tmp_path: Path, change) -> tuple[list[list[str]], Path]:
    """The streaming job over day 0 with a running query (--output ``job1``), then its running-state
    file's metadata replaced by ``change(metadata)``; returns the two days' messages and the release root."""
    _, messages = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(1, [1, 2])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    assert _streaming_days(tmp_path, messages[0], ("2026-03-01", "2026-03-01"), "job1", "none", public) == 0
    (state,) = (tmp_path / "job1" / "running" / f"window_id={W0}").glob("*.parquet")
    table = pq.read_table(state)
    pq.write_table(table.replace_schema_metadata(change(dict(table.schema.metadata))), state)
    state.chmod(0o600)
    return messages, public


def test_the_streaming_job_refuses_to_continue_a_running_query_from_a_decoder_state_of_another_window(
        tmp_path, capsys):
    """A running-state file whose estimates' decoder does not match its release state (copied from
    another window, or corrupted) is refused at launch, naming the file and the query: continuing
    from it would change every later running total silently."""
    def another_window_count(meta: dict) -> dict:
        decoder = json.loads(meta[b"renyi_stream.running_decoder"])
        return {**meta, b"renyi_stream.running_decoder": json.dumps({**decoder, "windows": 3}).encode()}

    messages, public = _a_first_day_with_its_running_state_changed(tmp_path, another_window_count)
    capsys.readouterr()
    snapshots = f"{tmp_path}/job1/ledger/window_id={W0}/*/*.parquet"
    assert _streaming_days(tmp_path, messages[1], ("2026-03-02", "2026-03-02"), "job2", snapshots, public) == 2
    err = capsys.readouterr().err
    assert "running query 'total_opened'" in err and "has decoded 3 window(s), its release state 1" in err
    assert not (public / f"window_id={W0 + 1}").exists()


def test_the_streaming_job_refuses_a_continuation_that_would_skip_a_window_of_a_running_query(tmp_path, capsys):
    _, messages = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(2, [1, 2])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    assert _streaming_days(tmp_path, messages[0], ("2026-03-01", "2026-03-01"), "job1", "none", public) == 0
    snapshots = f"{tmp_path}/job1/ledger/window_id={W0}/*/*.parquet"
    capsys.readouterr()
    assert _streaming_days(tmp_path, messages[1], ("2026-03-03", "2026-03-03"), "job2", snapshots, public) == 2
    err = capsys.readouterr().err
    assert "running query 'total_opened'" in err and f"skip window {W0 + 1}" in err, err[-800:]
    assert {w for _, w, *_ in _parquet(public)} == {W0}


def test_the_streaming_job_refuses_a_stored_running_state_of_another_strategy_at_launch(tmp_path, capsys):
    messages, public = _a_first_day_with_its_running_state_changed(tmp_path, lambda meta: {**meta, b"horizon": b"400"})
    capsys.readouterr()
    snapshots = f"{tmp_path}/job1/ledger/window_id={W0}/*/*.parquet"
    assert _streaming_days(tmp_path, messages[1], ("2026-03-02", "2026-03-02"), "job2", snapshots, public) == 2
    err = capsys.readouterr().err
    assert "'total_opened'" in err and "refusing" in err, err[-800:]
    assert {w for _, w, *_ in _parquet(public)} == {W0}


def test_the_streaming_job_refuses_to_continue_when_a_shards_prepaid_rows_are_lost(tmp_path, capsys):
    """A lost prepaid file would restart its users' prepaid charges from nothing (they would be
    under-charged): the ledger snapshots record each shard's prepaid users, and a continuation
    whose prepaid rows do not add up to them is refused before anything runs."""
    _, messages = _files(tmp_path, [_rows(0, [5, 1, 4, 2, 3]), _rows(1, [1, 2])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    assert _streaming_days(tmp_path, messages[0], ("2026-03-01", "2026-03-01"), "job1", "none", public) == 0
    lost = max((tmp_path / "job1" / "prepaid" / f"window_id={W0}").rglob("*.parquet"),
               key=lambda f: pq.read_metadata(f).num_rows)
    lost.unlink()
    capsys.readouterr()
    snapshots = f"{tmp_path}/job1/ledger/window_id={W0}/*/*.parquet"
    assert _streaming_days(tmp_path, messages[1], ("2026-03-02", "2026-03-02"), "job2", snapshots, public) == 2
    err = capsys.readouterr().err
    assert "prepaid" in err and "'total_opened'" in err and "missing" in err, err[-800:]
    assert {w for _, w, *_ in _parquet(public)} == {W0}


def test_a_running_query_retired_before_the_jobs_windows_is_no_reason_to_refuse(tmp_path):
    files, messages = _files(tmp_path, [_rows(1, [5, 1, 4, 2, 3])])
    public = tmp_path / "public"
    _with_a_running_query(public)
    ReleaseCatalogue(str(public)).retire("total_opened", from_window=W0 + 1)
    argv = ["--replay", *messages[0], "--start", "2026-03-02", "--end", "2026-03-02", "--output",
            str(tmp_path / "curator"), "--releases-parquet", str(public), "--shards", "2", *_promise(tmp_path),
            *_declare()]
    assert sj.main(argv) == 0
    assert {r[0] for r in _parquet(public)} == {"sum:opened"}


def test_a_running_query_registered_beside_a_parquet_release_root_records_its_strategy_and_horizon(tmp_path):
    """The catalogue the distributed and streaming jobs answer records a running query as the
    daily registry does (one codec: renyi_stream.queries.linear.LinearQuery.to_json), its strategy's
    parameters included."""
    root = str(tmp_path / "public")
    assert cli(["query", "add", "--releases-parquet", root, "--create", "--id", "total", "--columns", "opened",
                "--kind", "running", "--strategy", "tree", "--horizon", "30", "--from", "2026-03-01"]) == 0
    (registration,) = ReleaseCatalogue(root).read().registrations
    assert (registration.query.kind, registration.query.strategy, registration.query.horizon) == ("running", "tree", 30)
    listed = {row["query_id"]: json.loads(row["spec_json"]) for row in ReleaseCatalogue(root).list().to_pylist()}
    assert listed["total"]["strategy"] == "tree" and listed["total"]["horizon"] == 30
    assert "strategy_spec" in listed["total"]


# --- string ids in the streaming job --------------------------------------------------------------


def test_the_streaming_job_takes_the_declared_string_ids_and_a_follow_up_keeps_them(jobs):
    # The first job took the id type its contract declares (string: a new ledger's id type is never
    # inferred from its first message, issue 28), the follow-up (no --id-type) the one its snapshots
    # record; the releases and ledger are those of the daily job (tests above).
    for job in ("job1", "job2"):
        types = {pq.read_schema(f).metadata[b"renyi_stream.id_type"]
                 for f in (jobs["tmp"] / "stream" / job / "ledger").rglob("*.parquet")}
        assert types == {b"string"}
    assert _streamed_ledger(jobs["tmp"]).schema.field("user_id").type in (pa.string(), pa.large_string())
    assert books(str(jobs["tmp"] / "stream" / "job2"))["rejected"] == 0


def test_a_streaming_ledger_refuses_another_declared_id_type_naming_both(jobs, capsys):
    tmp_path = jobs["tmp"]
    snapshots = f"{tmp_path / 'stream' / 'job2'}/ledger/window_id={W0 + 2}/*/*.parquet"
    argv = ["--replay", str(tmp_path / "in" / "day-2-0.arrows"), "--start", "2026-03-04", "--end", "2026-03-04",
            "--previous-ledger", snapshots, "--output", str(tmp_path / "stream" / "job3"), "--releases-parquet",
            str(tmp_path / "stream-public"), "--shards", "2", "--id-type", "int64", *_promise(tmp_path)]
    assert sj.main(argv) == 2
    err = capsys.readouterr().err
    assert "id_type: ledger has 'string', this run asks 'int64'" in err
    assert not (tmp_path / "stream" / "job3").exists()


def test_an_integer_id_stream_declared_string_parses_every_id_as_text(tmp_path):
    table = _rows(0, [3, 1, 2])
    path = tmp_path / "m.arrows"
    path.write_bytes(encode_message(table))
    argv = ["--replay", str(path), "--start", "2026-03-01", "--end", "2026-03-01", "--output", str(tmp_path / "c"),
            "--releases-parquet", str(tmp_path / "public"), "--column", "opened=0:1", "--id-type", "string",
            "--shards", "2", *_promise(tmp_path)]
    assert sj.main(argv) == 0
    snapshot = pa.concat_tables([pq.read_table(f) for f in (tmp_path / "c" / "ledger").rglob("*.parquet")])
    assert sorted(snapshot.column("user_id").to_pylist()) == ["1", "2", "3"]


# --- the rules, in both stores ------------------------------------------------------------------------


class _Store:
    """The DuckDB registry or the object-store catalogue, behind the registry's calls."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind, self.root = kind, tmp_path / kind
        if kind == "duckdb":
            self._store = ReleaseStore(str(tmp_path / "s.duckdb"))
            self.catalogue = QueryRegistry(self._store)
        else:
            self.catalogue = ReleaseCatalogue(str(self.root))

    def release(self, window: int) -> None:
        row = {"query_id": "a", "window_id": window, "window_start": dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc),
               "window_end": dt.datetime(2026, 3, 2, tzinfo=dt.timezone.utc), "label": "a", "coordinate": 0,
               "value": 1.0, "noise_std": 1.0, "kind": "window", "accounting": "gdp", "mechanism": "gaussian",
               "key_fingerprint": "0" * 16}
        if self.kind == "duckdb":
            from renyi_stream.queries.release_store import RELEASE_SCHEMA

            self._store.publish(pa.Table.from_pylist([row], schema=RELEASE_SCHEMA))
        else:
            write_release_file(str(self.root), window, [row])


@pytest.mark.parametrize("kind", ["duckdb", "parquet"])
def test_both_catalogues_keep_the_registry_rules(tmp_path, kind):
    store = _Store(kind, tmp_path)
    catalogue = store.catalogue
    catalogue.add(LinearQuery.columns("a", ["x"]), effective_from=10)
    catalogue.add(LinearQuery.clamp("b", "x", 0, 1), effective_from=10)
    store.release(11)
    with pytest.raises(ValueError, match="after the last released window 11"):
        catalogue.add(LinearQuery.columns("c", ["x"]), effective_from=11)
    with pytest.raises(ValueError, match="after the last released window 11"):
        catalogue.retire("b", from_window=11)
    catalogue.retire("b", from_window=12)
    with pytest.raises(ValueError, match="already registered"):  # a retired id stays taken
        catalogue.add(LinearQuery.columns("b", ["y"]), effective_from=13)
    with pytest.raises(ValueError, match="already retired"):
        catalogue.retire("b", from_window=14)
    with pytest.raises(ValueError, match="MAX_DIM"):  # a is active in window 12 too
        catalogue.add(LinearQuery.histogram("wide", "x", list(range(MAX_DIM))), effective_from=12)
    catalogue.add(LinearQuery.histogram("h", "t", ["p", "q"]), effective_from=12)
    assert [(q.query_id, first, retired) for q, first, retired in catalogue.plan(11, 12)] == [
        ("a", 10, None), ("b", 10, 12), ("h", 12, None)]
    listed = catalogue.list().select(["query_id", "kind", "labels", "dim", "effective_from", "retired_from"])
    assert listed.to_pylist() == [
        {"query_id": "a", "kind": "window", "labels": ["x"], "dim": 1, "effective_from": 10, "retired_from": None},
        {"query_id": "b", "kind": "window", "labels": ["clamp(x,0,1)"], "dim": 1, "effective_from": 10,
         "retired_from": 12},
        {"query_id": "h", "kind": "window", "labels": ["t=p", "t=q"], "dim": 2, "effective_from": 12,
         "retired_from": None}]


def test_each_change_of_a_parquet_catalogue_is_a_new_revision_and_a_stale_one_is_refused(tmp_path):
    catalogue = ReleaseCatalogue(str(tmp_path))
    catalogue.add(LinearQuery.columns("a", ["x"]), effective_from=10)
    stale = catalogue.read()
    launch = queries_at_launch(stale, defaults=[], first_window=10, processed_through=None, answered=None,
                               last_released=None)
    catalogue.add(LinearQuery.columns("b", ["x"]), effective_from=10)
    assert sorted(p.name for p in (tmp_path / "_queries").iterdir()) == ["revision-00000001.json",
                                                                         "revision-00000002.json"]
    from renyi_stream.queries.catalogue import CatalogueChanged

    with pytest.raises(CatalogueChanged):  # a job planned from revision 1 must plan again
        catalogue.record_launch(launch)


def test_a_query_registered_into_a_charged_but_unpublished_window_starts_where_it_is_first_answered(tmp_path):
    catalogue = ReleaseCatalogue(str(tmp_path))
    catalogue.add(LinearQuery.columns("a", ["x"]), effective_from=10)
    catalogue.add(LinearQuery.columns("late", ["x"]), effective_from=11)  # window 11 charged, not yet public
    launch = queries_at_launch(catalogue.read(), defaults=[], first_window=12, processed_through=11,
                               answered={"a"}, last_released=11)
    assert launch.moved == (("late", 11, 12),)
    catalogue.record_launch(launch)
    assert [(q.query_id, first) for q, first, _ in catalogue.plan(12, 12)] == [("a", 10), ("late", 12)]
