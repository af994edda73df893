"""The daily graph is ready for distributed runners (issue 5), checked without a cluster.

* Both graphs (``DailyReleases``, as ``renyi-stream run`` builds it, and the distributed entry
  point's, :mod:`renyi_stream.pipelines.distributed.job`) construct under FlinkRunner and DataflowRunner options
  and round-trip through the Beam runner API (the portable proto those runners receive).
* Every key of a shuffle (GroupByKey, CombinePerKey) and of keyed state has a deterministic coder,
  read from the portable proto itself: the coders the runner will use.
* Every transform and DoFn pickles and unpickles with Beam's pickler (cloudpickle, its default).
* ``renyi_stream.pipelines.distributed.main`` runs end to end on the DirectRunner over local files standing in
  for buckets, and gives the ledger ``renyi-stream run`` gives on the same data and key, and the
  same releases up to the noise, which is each ledger's own (bound to its ledger id, issue 18);
  its recovery rules (re-runs, interrupted attempts, stale ledgers) hold.
* The deployment files agree with the code (parameters, versions, runner options).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import re
import stat
import subprocess
from pathlib import Path

import apache_beam as beam
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions, PortableOptions
from apache_beam.pipeline import PipelineVisitor
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context

from renyi_stream.pipelines.distributed import job as dist
from renyi_stream.pipelines.beam import transforms as tx
from renyi_stream.pipelines.beam import worker_key
from renyi_stream.stream.engine.ledger_config import DERIVED, LedgerConfig, LedgerConfigError
from renyi_stream.stream.engine.readers import read_batches
from renyi_stream.stream.engine.shard_state import QueryPlan
from renyi_stream.queries.linear import default_queries
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import NoiseKey, new_ledger_id
from renyi_stream.stream.schema import WindowSpec

from conformance.crash import run_killed_at
from conformance.outcome import window_noise

ROOT = Path(__file__).resolve().parents[1]
DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
RUNNERS = {
    "FlinkRunner": ["--runner=FlinkRunner", "--flink_master=localhost:8081", "--environment_type=DOCKER",
                    "--environment_config=renyi-stream-harness:latest", "--streaming"],
    "DataflowRunner": ["--runner=DataflowRunner", "--project=my-project-123", "--region=europe-west1",
                       "--temp_location=gs://my-bucket-renyi/tmp", "--staging_location=gs://my-bucket-renyi/staging",
                       "--sdk_container_image=europe-docker.pkg.dev/my-project-123/renyi/harness:latest"],
}
GRAPHS = ("daily", "distributed")
EPSILON, DELTA, NORM_BUDGET = 1.0, 1e-6, 2.0
#: The input contract a new ledger's first run declares (issue 28): :func:`_day_file`'s columns,
#: bounded so that every value is inside its clamp (0/1 indicators, spends below 1.5).
DECLARE = ("--id-type", "int64", "--column", "opened=0:1", "--column", "spent=0:1.5")


def _day_file(path: Path, offset: int, users, seed: int = 0) -> str:
    rng = np.random.default_rng(seed + offset)
    n = len(users)
    pq.write_table(pa.table({
        "user_id": pa.array(users, type=pa.int64()),
        "day": pa.array([DAY0 + dt.timedelta(days=offset)] * n, type=pa.date32()),
        "opened": pa.array((rng.random(n) < 0.5).astype(np.float64)),
        "spent": pa.array(rng.random(n) * 1.5),
    }), path)
    return str(path)


def _key(tmp_path: Path) -> tuple[str, NoiseKey]:
    path = tmp_path / "key" / "noise.key"
    return str(path), NoiseKey.load_or_create(path)


def _args(tmp_path, inputs, start, end, previous, output, *extra) -> list[str]:
    """The distributed job's arguments; a new ledger's (``previous`` "none") declare :data:`DECLARE`."""
    key_path, _ = _key(tmp_path)
    declare = DECLARE if previous == "none" else ()
    return ["--input", *inputs, "--start", start, "--end", end, "--epsilon", str(EPSILON), "--delta", str(DELTA),
            "--norm-budget", str(NORM_BUDGET), "--previous-ledger", previous, *declare, "--output", str(output),
            "--releases-parquet", str(tmp_path / "public" / "releases"), "--noise-key", key_path, *extra]


def _daily_graph(tmp_path: Path, runner: str) -> beam.Pipeline:
    path = _day_file(tmp_path / "d.parquet", 0, [1, 2])
    key_path, key = _key(tmp_path)
    p = beam.Pipeline(options=PipelineOptions(RUNNERS[runner]))
    plan = QueryPlan.starting_at(default_queries(["opened"]) + default_queries(["opened"], kind="running"), W0)
    _ = p | tx.DailyReleases(
        [path], window=WindowSpec(), start_window=W0, end_window=W0 + 1, released=[], schedule=[W0, W0 + 1],
        plan=plan, indicator_columns=["opened"], noise_std=2.0, policy="drop", budget=1.0, id_type="int64",
        tracker_step=1 / 32, n_shards=8, previous_ledger=Ledger(budget=1.0).to_arrow(),
        key_path=key_path, accounting="gdp", key_fingerprint=key.fingerprint, ledger_id=new_ledger_id())
    return p


def _distributed_graph(tmp_path: Path, runner: str) -> beam.Pipeline:
    path = _day_file(tmp_path / "d.parquet", 0, [1, 2])
    args = dist._parser().parse_args(_args(tmp_path, [path], "2026-03-01", "2026-03-02", "none", tmp_path / "out"))
    plan = dist.prepare(args)
    p = beam.Pipeline(options=PipelineOptions(RUNNERS[runner]))
    dist.build(p, plan)
    return p


def _graph(tmp_path: Path, graph: str, runner: str) -> beam.Pipeline:
    logging.getLogger().setLevel(logging.ERROR)  # GCP extras warn about optional clients
    return (_daily_graph if graph == "daily" else _distributed_graph)(tmp_path, runner)


class _Collect(PipelineVisitor):
    def __init__(self) -> None:
        self.nodes = []

    def visit_transform(self, node) -> None:
        self.nodes.append(node)

    def enter_composite_transform(self, node) -> None:
        if node.transform is not None:
            self.nodes.append(node)


def _nodes(p: beam.Pipeline):
    visitor = _Collect()
    p.visit(visitor)
    return visitor.nodes


# --- runner readiness ----------------------------------------------------------------------------


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("graph", GRAPHS)
def test_the_graph_round_trips_through_the_portable_runner_api(tmp_path, graph, runner):
    p = _graph(tmp_path, graph, runner)
    proto = p.to_runner_api()
    assert len(proto.SerializeToString()) > 0
    restored = beam.Pipeline.from_runner_api(proto, p.runner, p._options)
    again = restored.to_runner_api()
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {t.unique_name for t in again.components.transforms.values()} == names
    assert any("IndividualFilter" in name for name in names) and any("ReleaseWindows" in name for name in names)
    assert len(again.SerializeToString()) > 0


#: Keyed steps (shuffles and stateful DoFns) each graph has at least.
KEYED_STEPS = {"daily": 4, "distributed": 5}


def _keyed_inputs(proto):
    """(transform name, kind, input coder id) of every GroupByKey, CombinePerKey and stateful
    ParDo in the portable proto (side inputs excluded)."""
    for t in proto.components.transforms.values():
        urn = t.spec.urn
        if urn in ("beam:transform:group_by_key:v1", "beam:transform:combine_per_key:v1"):
            (pcoll,) = t.inputs.values()
            yield t.unique_name, urn.split(":")[2], proto.components.pcollections[pcoll].coder_id
        elif urn == "beam:transform:pardo:v1":
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            if payload.state_specs or payload.timer_family_specs:
                (pcoll,) = [v for k, v in t.inputs.items() if k not in payload.side_inputs]
                yield t.unique_name, "stateful", proto.components.pcollections[pcoll].coder_id


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("graph", GRAPHS)
def test_every_shuffle_and_state_key_has_a_deterministic_coder(tmp_path, graph, runner):
    proto = _graph(tmp_path, graph, runner).to_runner_api()
    context = pipeline_context.PipelineContext(proto.components)
    kinds = set()
    checked = 0
    for name, kind, coder_id in _keyed_inputs(proto):
        spec = proto.components.coders[coder_id]
        assert spec.spec.urn == "beam:coder:kv:v1", f"{name}: input coder {spec.spec.urn} is not a KV coder"
        key_coder = context.coders.get_by_id(spec.component_coder_ids[0])
        assert key_coder.is_deterministic(), f"{name}: key coder {key_coder} is not deterministic"
        kinds.add(kind)
        checked += 1
    # Every keyed step of each graph was seen (the daily graph publishes outside the pipeline,
    # after its ledger commit, so it has one keyed step fewer than the distributed graph's staging).
    assert {"group_by_key", "combine_per_key", "stateful"} <= kinds and checked >= KEYED_STEPS[graph]
    # The filter's own state key: the user shard, an integer with the portable varint coder.
    (filter_coder,) = [c for n, k, c in _keyed_inputs(proto) if k == "stateful"]
    key_id = proto.components.coders[filter_coder].component_coder_ids[0]
    assert proto.components.coders[key_id].spec.urn == "beam:coder:varint:v1"


@pytest.mark.parametrize("library", ["cloudpickle"])  # Beam's default; dill is an opt-in extra
@pytest.mark.parametrize("graph", GRAPHS)
def test_every_transform_and_dofn_pickles_and_unpickles(tmp_path, graph, library):
    nodes = _nodes(_graph(tmp_path, graph, "DataflowRunner"))
    fns = [node.transform.fn for node in nodes if isinstance(node.transform, beam.ParDo)]
    assert len(fns) >= 5
    pickler.set_library(library)
    try:
        for node in nodes:  # leaves and composites: lambdas in Map/FlatMap included
            restored = pickler.loads(pickler.dumps(node.transform))
            # (Beam's own classes local to a function come back as equal copies, not the same class.)
            assert type(restored).__qualname__ == type(node.transform).__qualname__, node.full_label
        for fn in fns:
            assert type(pickler.loads(pickler.dumps(fn))) is type(fn)
    finally:
        pickler.set_library(pickler.DEFAULT_PICKLE_LIB)


# --- the distributed entry point end to end, against renyi-stream run ----------------------------------


def _local_run(tmp_path: Path, inputs: list[str], start: str, end: str, *declare: str) -> None:
    key_path, _ = _key(tmp_path)
    out = subprocess.run(
        ["python", "-m", "renyi_stream.pipelines.cli.main", "run", "--input", *inputs, "--store", str(tmp_path / "local" / "s.duckdb"),
         "--ledger", str(tmp_path / "local" / "l.duckdb"), "--epsilon", str(EPSILON), "--delta", str(DELTA),
         "--norm-budget", str(NORM_BUDGET), "--start", start, "--end", end, "--key", key_path, *declare, "--quiet"],
        cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def _parquet_releases(tmp_path: Path, root: Path | None = None) -> list[tuple]:
    root = root or tmp_path / "public" / "releases"
    with duckdb.connect() as con:
        return con.execute(
            f"SELECT query_id, window_id, coordinate, label, value, noise_std, key_fingerprint FROM "
            f"read_parquet('{root}/*/*.parquet', hive_partitioning = true) ORDER BY query_id, window_id, coordinate"
        ).fetchall()


def _store_releases(tmp_path: Path) -> list[tuple]:
    with duckdb.connect(str(tmp_path / "local" / "s.duckdb"), read_only=True) as con:
        return con.execute("SELECT query_id, window_id, coordinate, label, value, noise_std, key_fingerprint "
                           "FROM releases ORDER BY query_id, window_id, coordinate").fetchall()


def _snapshot(output: Path) -> pa.Table:
    manifest = json.loads((output / dist.COMMITTED).read_text())
    return pa.concat_tables([pq.read_table(f) for f in manifest["ledger_files"]]).sort_by("user_id")


def _ledger_id(run: Path) -> str:
    """The ledger id a distributed run's manifest records."""
    return json.loads((run / dist.COMMITTED).read_text())["parameters"]["ledger_id"]


def _without_noise(rows: list[tuple], key: NoiseKey, ledger_id: str) -> list[tuple]:
    """Release rows (query_id, window_id, coordinate, label, value, noise_std, ...) of window sums
    with the keyed noise of ledger ``ledger_id`` taken off ``value``: the sums that were noised.
    Two ledgers on the same data agree on these, each adding its own ledger's noise."""
    return [(query_id, window, coordinate, label, value - window_noise(
                key, ledger_id, query_id=query_id, window_id=window, coordinate=coordinate, noise_std=std), std, *rest)
            for query_id, window, coordinate, label, value, std, *rest in rows]


def _same_values(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x[:4] == y[:4] and x[5:] == y[5:]
        # Equal but for the order in which the shards' partial sums are added (last bits).
        assert x[4] == pytest.approx(y[4], rel=1e-12, abs=1e-9)


@pytest.fixture
def two_days(tmp_path):
    """Three daily files of 250 of 400 users (``two_days[:2]`` is the first run's two days)."""
    rng = np.random.default_rng(7)
    (tmp_path / "in").mkdir()
    return [_day_file(tmp_path / "in" / f"day-{d}.parquet", d, rng.choice(400, 250, replace=False), seed=3)
            for d in range(3)]


def test_distributed_main_gives_the_releases_and_ledger_of_renyi_stream_run(tmp_path, two_days, capsys):
    inputs = two_days
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, inputs[:2], "2026-03-01", "2026-03-02", "none", run1, "--shards", "7")) == 0
    assert dist.main(_args(tmp_path, inputs[2:], "2026-03-03", "2026-03-03", str(run1), run2, "--shards", "5")) == 0
    assert "[balanced]" in capsys.readouterr().out
    _local_run(tmp_path, inputs[:2], "2026-03-01", "2026-03-02", *DECLARE)  # the new ledger's first run
    _local_run(tmp_path, inputs[2:], "2026-03-03", "2026-03-03")

    parquet, store = _parquet_releases(tmp_path), _store_releases(tmp_path)
    assert {r[1] for r in parquet} == {W0, W0 + 1, W0 + 2} and {r[0] for r in parquet} == {"sum:opened", "sum:spent"}
    # Same data and key, two ledgers: the same sums, each with its own ledger's noise (issue 18).
    with duckdb.connect(str(tmp_path / "local" / "s.duckdb"), read_only=True) as con:
        (local_id,) = con.execute("SELECT value FROM store_meta WHERE key = 'ledger_id'").fetchone()
    assert _ledger_id(run1) == _ledger_id(run2) != local_id  # the distributed ledger keeps its id
    key = _key(tmp_path)[1]
    _same_values(_without_noise(parquet, key, _ledger_id(run2)), _without_noise(store, key, local_id))
    assert all(abs(p[4] - s[4]) > 1e-9 for p, s in zip(parquet, store))  # the noises differ

    with duckdb.connect(str(tmp_path / "local" / "l.duckdb"), read_only=True) as con:
        local = con.execute("SELECT user_id, used, tracker_segment, tracker_bound FROM ledger ORDER BY user_id").arrow()
    local = local.read_all() if hasattr(local, "read_all") else local
    ours = _snapshot(run2)
    assert ours.column("user_id").to_pylist() == local.column("user_id").to_pylist()
    for column in ("used", "tracker_segment", "tracker_bound"):
        np.testing.assert_allclose(ours.column(column).to_numpy(), local.column(column).to_numpy(), rtol=0, atol=0)
    Ledger.from_arrow(ours)  # the snapshot restores (metadata, ranges, no repeated user)

    manifest = json.loads((run2 / dist.COMMITTED).read_text())
    assert manifest["processed_windows"] == [W0, W0 + 1, W0 + 2] and manifest["balanced"]
    assert manifest["users"] == ours.num_rows and manifest["previous_users"] > 0
    counts = pq.read_table(manifest["counts_files"]).to_pylist()
    assert sum(c["admitted"] + c["clipped"] + c["dropped"] for c in counts) == 250


def test_a_rerun_of_a_committed_day_charges_nobody_and_releases_nothing(tmp_path, two_days):
    inputs = two_days
    run1, again = tmp_path / "curator" / "run1", tmp_path / "curator" / "again"
    assert dist.main(_args(tmp_path, inputs[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    files = {p: p.read_bytes() for p in (tmp_path / "public").rglob("*.parquet")}
    # The same output again is refused: a committed snapshot is never rewritten.
    assert dist.main(_args(tmp_path, inputs[:1], "2026-03-01", "2026-03-01", "none", run1)) == 2
    # Forgetting the previous ledger is refused: the releases know windows it never charged.
    assert dist.main(_args(tmp_path, inputs[:1], "2026-03-01", "2026-03-01", "none", again)) == 2
    assert dist.main(_args(tmp_path, inputs[:1], "2026-03-01", "2026-03-01", str(run1), again)) == 0
    manifest = json.loads((again / dist.COMMITTED).read_text())
    assert manifest["totals"]["late"] == 250 and manifest["totals"]["admitted"] == 0 and manifest["balanced"]
    assert _snapshot(again).equals(_snapshot(run1))
    assert {p: p.read_bytes() for p in (tmp_path / "public").rglob("*.parquet")} == files


def _crashed_main(tmp_path, args, point) -> subprocess.CompletedProcess:
    """``dist.main(args)`` in a child process killed with SIGKILL at crash point ``point``."""
    return run_killed_at(point, ["-m", "renyi_stream.pipelines.distributed", *map(str, args)])


def _public(tmp_path) -> dict:
    return {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "public").rglob("*.parquet")}


@pytest.fixture
def clean_two_days(tmp_path, tmp_path_factory, two_days):
    """The public release rows less their ledger's noise (:func:`_without_noise`) and the day-2
    ledger of an uninterrupted two-day distributed run, with the test's noise key. Its ledger is
    another one than the test's, so only the sums and the ledger can be compared, not the noise."""
    clean = tmp_path_factory.mktemp("clean")
    key_path, _ = _key(tmp_path)
    (clean / "key").mkdir()
    (clean / "key" / "noise.key").write_bytes(Path(key_path).read_bytes())
    os.chmod(clean / "key" / "noise.key", 0o600)
    run1, run2 = clean / "curator" / "run1", clean / "curator" / "run2"
    assert dist.main(_args(clean, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    assert dist.main(_args(clean, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)) == 0
    return _without_noise(_parquet_releases(clean), _key(tmp_path)[1], _ledger_id(run2)), _snapshot(run2)


def _public_sums(tmp_path: Path, run: Path) -> list[tuple]:
    """The test's public release rows less the noise of ``run``'s ledger."""
    return _without_noise(_parquet_releases(tmp_path), _key(tmp_path)[1], _ledger_id(run))


def test_a_job_killed_before_its_commit_publishes_nothing_and_its_rerun_charges_once(tmp_path, two_days,
                                                                                   clean_two_days):
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    day1 = _public(tmp_path)
    day2 = _args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)
    assert _crashed_main(tmp_path, day2, "distributed_before_commit").returncode == -9
    assert not (run2 / dist.COMMITTED).exists()
    assert list((run2 / "staged-releases").rglob("*.parquet"))  # computed, staged, never public
    assert _public(tmp_path) == day1
    # Re-run with other inputs into the same output: refused (that output belongs to the attempt).
    other = _day_file(tmp_path / "in" / "late.parquet", 1, [900, 901])
    assert dist.main(_args(tmp_path, [*two_days[1:2], other], "2026-03-02", "2026-03-02", str(run1), run2)) == 2
    # The same arguments: every user charged once, every window published once, as if nothing failed.
    assert dist.main(day2) == 0
    public, ledger = clean_two_days
    assert _public(tmp_path).keys() == {Path("public") / "releases" / f"window_id={W0 + d}" / "releases.parquet"
                                        for d in range(2)}
    _same_values(_public_sums(tmp_path, run2), public)
    assert _snapshot(run2).equals(ledger)


def test_releases_committed_but_not_published_are_published_by_the_next_run(tmp_path, two_days, clean_two_days):
    run1, run2, run3 = (tmp_path / "curator" / name for name in ("run1", "run2", "run3"))
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    day2 = _args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)
    assert _crashed_main(tmp_path, day2, "distributed_before_promote").returncode == -9
    assert (run2 / dist.COMMITTED).exists()
    assert {p.parent.name for p in (tmp_path / "public").rglob("*.parquet")} == {f"window_id={W0}"}
    assert dist.main(day2) == 2  # a committed output is never rewritten
    assert dist.main(_args(tmp_path, two_days[2:], "2026-03-03", "2026-03-03", str(run2), run3)) == 0
    public, ledger = clean_two_days
    _same_values([r for r in _public_sums(tmp_path, run3) if r[1] != W0 + 2], public)
    assert _snapshot(run2).equals(ledger)


# --- the public lineage: which committed run charged each public window (issue 18, item 3) -------------


def _attempt(output: Path) -> str:
    """The run id of a committed output: the attempt its ``_COMMITTED.json`` records."""
    return json.loads((output / dist.COMMITTED).read_text())["attempt"]


def _lineage(tmp_path: Path) -> dict[int, dict]:
    """The public lineage records of the windows, by window id."""
    folder = tmp_path / "public" / "releases" / "_lineage" / "windows"
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def _day2_with_more_users(tmp_path, two_days) -> list[str]:
    """Day 2 as a re-run would read it after more of its rows arrived: other answers, other charges."""
    return [*two_days[1:2], _day_file(tmp_path / "in" / "day-1-more.parquet", 1, [900, 901, 902])]


@pytest.mark.parametrize("public", ["the re-run", "the first attempt"])
def test_a_ledger_forked_from_what_is_public_cannot_be_continued(tmp_path, two_days, capsys, public):
    """Day 2 runs twice from day 1's ledger (the first attempt killed after its commit, before
    publishing; a re-run into a new output with more rows). Whichever attempt's day 2 becomes
    public, continuing day 3 from the other attempt's ledger is refused, naming both runs: that
    ledger lacks the charges of users whose contributions are public."""
    curator = tmp_path / "curator"
    run1, first, rerun = curator / "run1", curator / "run2-first", curator / "run2-rerun"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0

    def day2(inputs, output):
        return _args(tmp_path, inputs, "2026-03-02", "2026-03-02", str(run1), output)

    assert _crashed_main(tmp_path, day2(two_days[1:2], first), "distributed_before_promote").returncode == -9
    more = _day2_with_more_users(tmp_path, two_days)
    if public == "the re-run":
        assert dist.main(day2(more, rerun)) == 0  # accepted: nothing of the first attempt is public
        winner, loser, tip = rerun, first, rerun
    else:
        assert _crashed_main(tmp_path, day2(more, rerun), "distributed_before_promote").returncode == -9
        # Day 2 again from the first attempt's ledger: it charges nobody and publishes that attempt's releases.
        tip = curator / "run2-first-again"
        assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(first), tip)) == 0
        winner, loser = first, rerun
    capsys.readouterr()

    def day3(previous, output):
        return _args(tmp_path, two_days[2:], "2026-03-03", "2026-03-03", str(previous), output)

    assert dist.main(day3(loser, curator / "run3-from-the-other")) == 2
    err = capsys.readouterr().err
    assert f"through run {_attempt(winner)}, not through run {_attempt(loser)}" in err
    assert f"Continue from the ledger committed by run {_attempt(winner)}" in err
    assert not (curator / "run3-from-the-other").exists()
    assert dist.main(day3(tip, curator / "run3")) == 0
    assert _lineage(tmp_path)[W0 + 1]["run"] == _attempt(winner)


def test_of_two_runs_launched_from_one_ledger_only_the_first_to_publish_does(tmp_path, two_days, capsys):
    """Two runs of day 2 from day 1's ledger pass their launch checks before either publishes (two
    launches at once). The one that publishes first becomes the public lineage; the other
    commits but publishes nothing, fails naming the winner, and nothing can continue from it."""
    from renyi_stream.pipelines.beam.local_runner import batch_runner

    curator = tmp_path / "curator"
    run1, late, early = curator / "run1", curator / "run2-late", curator / "run2-early"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    args, _ = dist._parser().parse_known_args(
        _args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), late))
    plan = dist.prepare(args)  # launched: every launch check passed
    dist.write_intent(plan)
    more = _day2_with_more_users(tmp_path, two_days)
    assert dist.main(_args(tmp_path, more, "2026-03-02", "2026-03-02", str(run1), early)) == 0
    public, winner = _public(tmp_path), _attempt(early)

    options = dist.pipeline_options(plan, args, [])
    p = beam.Pipeline(runner=batch_runner(options), options=options)
    dist.build(p, plan)
    with pytest.raises(Exception, match=f"run {plan.attempt} may not publish: run {winner} already published"):
        p.run().wait_until_finish()
    assert _public(tmp_path) == public  # nothing of the late run is public
    assert {w: r["run"] for w, r in _lineage(tmp_path).items()} == {W0: _attempt(run1), W0 + 1: winner}
    capsys.readouterr()
    day3 = _args(tmp_path, two_days[2:], "2026-03-03", "2026-03-03", str(late), curator / "run3")
    assert dist.main(day3) == 2 and f"through run {winner}, not through run {plan.attempt}" in capsys.readouterr().err
    # A third run from day 1's ledger is refused at launch, naming the run that continued it.
    again = _args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", str(run1), curator / "run1-again")
    assert dist.main(again) == 2
    assert f"run {_attempt(run1)}'s ledger already has a successor" in capsys.readouterr().err


@pytest.mark.parametrize("point", ["distributed_before_promote", "distributed_after_claim"])
def test_a_run_killed_between_its_commit_and_its_publish_is_published_by_the_next_run_as_its_own(
        tmp_path, two_days, clean_two_days, point):
    run1, run2, run3 = (tmp_path / "curator" / name for name in ("run1", "run2", "run3"))
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    day2 = _args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)
    assert _crashed_main(tmp_path, day2, point).returncode == -9
    assert {p.parent.name for p in (tmp_path / "public").rglob("*.parquet")} == {f"window_id={W0}"}
    assert dist.main(_args(tmp_path, two_days[2:], "2026-03-03", "2026-03-03", str(run2), run3)) == 0
    public, ledger = clean_two_days
    # The same sums as an uninterrupted run's (each ledger adds its own noise, see clean_two_days).
    _same_values([r for r in _public_sums(tmp_path, run3) if r[1] != W0 + 2], public)
    assert _snapshot(run2).equals(ledger)
    records = _lineage(tmp_path)
    assert {w: r["run"] for w, r in records.items()} == {W0: _attempt(run1), W0 + 1: _attempt(run2),
                                                         W0 + 2: _attempt(run3)}
    assert all(set(r) == {"version", "window_id", "run"} for r in records.values())  # no counts, no users

def test_a_new_ledgers_interrupted_first_run_is_rerun_with_the_ledger_id_its_intent_fixed(tmp_path, two_days):
    # A re-run of an interrupted attempt must draw the noise the attempt drew (invariant 5), so a
    # new ledger's id is fixed once, in the attempt's intent, not drawn again by the re-run.
    run1 = tmp_path / "curator" / "run1"
    day1 = _args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)
    assert _crashed_main(tmp_path, day1, "distributed_before_commit").returncode == -9
    intended = json.loads((run1 / dist.INTENT).read_text())["parameters"]["ledger_id"]
    (staged,) = (run1 / "staged-releases").rglob("*.parquet")  # the attempt's draw, never public
    attempt = {(r["query_id"], r["coordinate"]): r["value"] for r in pq.read_table(staged).to_pylist()}
    assert dist.main(day1) == 0
    assert _ledger_id(run1) == intended
    public = {(r[0], r[2]): r[4] for r in _parquet_releases(tmp_path)}
    assert public == attempt and len(public) == 2  # the identical release, bit for bit


def test_a_manifest_from_before_ledger_ids_is_continued_with_a_new_one_carried_from_then_on(tmp_path, two_days):
    run1, run2, run3 = (tmp_path / "curator" / name for name in ("run1", "run2", "run3"))
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    for name in (dist.INTENT, dist.COMMITTED):  # as an older version wrote them
        manifest = json.loads((run1 / name).read_text())
        del manifest["parameters"]["ledger_id"]
        (run1 / name).write_text(json.dumps(manifest))
    public = _public(tmp_path)
    assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)) == 0
    assert dist.main(_args(tmp_path, two_days[2:], "2026-03-03", "2026-03-03", str(run2), run3)) == 0
    assert len(_ledger_id(run2)) == 32 and _ledger_id(run3) == _ledger_id(run2)
    assert {k: v for k, v in _public(tmp_path).items() if k in public} == public  # day 1 kept as published


def test_a_snapshot_that_lost_users_is_not_committed(tmp_path, two_days):
    inputs = two_days
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, inputs[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    (part,) = json.loads((run1 / dist.COMMITTED).read_text())["ledger_files"]
    table = pq.read_table(part)
    pq.write_table(table.slice(0, table.num_rows - 10), part)  # a truncated snapshot file
    with pytest.raises(Exception, match="previous ledger snapshot holds"):
        dist.main(_args(tmp_path, inputs[1:2], "2026-03-02", "2026-03-02", str(run1), run2))
    assert not (run2 / dist.COMMITTED).exists()


def _recorded_as_another_version(run: Path, rho_factor: float) -> dict:
    """Rescale a committed run's recorded budget by ``rho_factor``, with the noise std and tracker
    step that budget gives (what a version whose root finder ends elsewhere records)."""
    from renyi_stream.stream.accounting.calibration import NOISE_HEADROOM

    path = run / dist.COMMITTED
    manifest = json.loads(path.read_text())
    params = manifest["parameters"]
    params["rho"] *= rho_factor
    params["noise_std"] = math.sqrt(params["norm_budget"] / (2 * params["rho"])) * (1 + NOISE_HEADROOM)
    params["tracker_step"] = params["rho"] / 32
    path.write_text(json.dumps(manifest))
    return params


def test_a_ledger_whose_budget_differs_in_its_last_bits_is_continued_with_its_own_noise(tmp_path, two_days):
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    recorded = _recorded_as_another_version(run1, 1 - 3e-14)
    assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)) == 0
    kept = json.loads((run2 / dist.COMMITTED).read_text())["parameters"]
    assert {k: kept[k] for k in DERIVED} == {k: recorded[k] for k in DERIVED}
    day2 = pq.read_table(tmp_path / "public" / "releases" / f"window_id={W0 + 1}")
    assert set(day2.column("noise_std").to_pylist()) == {recorded["noise_std"]}


def test_a_ledger_whose_budget_is_above_the_promise_is_refused(tmp_path, two_days, capsys):
    run1 = tmp_path / "curator" / "run1"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    _recorded_as_another_version(run1, 1 + 1e-9)
    assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1),
                           tmp_path / "curator" / "run2")) == 2
    assert "budget does not keep this run's promise: recorded_rho must be at most" in capsys.readouterr().err


@pytest.mark.parametrize("recorded", [None, "0.1", True])
def test_a_manifest_without_a_numeric_budget_cannot_be_continued(recorded):
    config = LedgerConfig.from_promise(epsilon=1.0, delta=1e-6, norm_budget=30.0, id_type="int64",
                                       key_fingerprint="0" * 16, ledger_id=new_ledger_id())
    manifest = config.to_manifest()
    manifest["parameters"]["rho"] = recorded
    with pytest.raises(LedgerConfigError, match=r"run1 records no zCDP budget"):
        LedgerConfig.from_manifest(manifest, where="run1")


def test_a_run_with_other_parameters_than_the_ledger_is_refused(tmp_path, two_days, capsys):
    inputs = two_days
    run1 = tmp_path / "curator" / "run1"
    assert dist.main(_args(tmp_path, inputs[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    args = _args(tmp_path, inputs[1:2], "2026-03-02", "2026-03-02", str(run1), tmp_path / "curator" / "run2")
    args[args.index("--epsilon") + 1] = "2.0"
    assert dist.main(args) == 2
    assert "parameters differ" in capsys.readouterr().err
    assert dist.main(_args(tmp_path, [str(tmp_path / "in" / "nothing-*.parquet")], "2026-03-02", "2026-03-02",
                           str(run1), tmp_path / "curator" / "run3")) == 2


def test_a_run_releasing_under_another_root_than_its_ledger_is_refused_naming_both(tmp_path, two_days, capsys):
    run1 = tmp_path / "curator" / "run1"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    run2 = tmp_path / "curator" / "run2"
    args = _args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)
    staging = tmp_path / "staging" / "releases"
    args[args.index("--releases-parquet") + 1] = str(staging)
    assert dist.main(args) == 2
    err = capsys.readouterr().err
    assert "--releases-parquet" in err and str(staging) in err and str(tmp_path / "public" / "releases") in err
    assert not (run2 / dist.COMMITTED).exists() and not staging.exists()
    args[args.index("--releases-parquet") + 1] = str(tmp_path / "public" / "releases") + "/"  # the same root
    assert dist.main(args) == 0


def test_uri_inputs_are_read_through_pyarrow_fs(tmp_path):
    path = _day_file(tmp_path / "d.parquet", 0, [1, 2, 3])
    assert sum(b.num_rows for b in read_batches(f"file://{path}")) == 3


# --- the noise key reaches workers as a secret -------------------------------------------------------


def test_worker_start_up_writes_the_secret_key_privately(tmp_path, monkeypatch):
    key = NoiseKey.load_or_create(tmp_path / "source.key")
    target = tmp_path / "worker" / f"noise-{key.fingerprint}.key"
    fetched = []

    def fetch(name):
        fetched.append(name)
        return key.secret

    secret = "projects/p/secrets/renyi-noise-key/versions/3"
    for options in ({"options": {worker_key.SECRET_OPTION: secret, worker_key.PATH_OPTION: str(target)}},
                    {f"beam:option:{worker_key.SECRET_OPTION}:v1": secret,
                     f"beam:option:{worker_key.PATH_OPTION}:v1": str(target)}):
        env = {"PIPELINE_OPTIONS": json.dumps(options)}
        assert worker_key.install_from_environment(env, fetch=fetch) == target
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        assert NoiseKey.load(target).fingerprint == key.fingerprint
        target.unlink()
    assert fetched == [secret, secret]
    assert worker_key.install_from_environment({"PIPELINE_OPTIONS": json.dumps({"options": {}})}, fetch=fetch) is None

    # The launcher puts the options where the harness finds them, and names the plugin.
    monkeypatch.setattr(worker_key, "fetch_secret", lambda name: key.secret)
    path = _day_file(tmp_path / "d.parquet", 0, [1])
    args = dist._parser().parse_args(_args(tmp_path, [path], "2026-03-01", "2026-03-01", "none", tmp_path / "o")[:-2]
                                     + ["--noise-key-secret", secret])
    plan = dist.prepare(args)
    assert plan.key_path.endswith(f"noise-{key.fingerprint}.key")
    assert plan.parameters["key_fingerprint"] == key.fingerprint
    options = dist.pipeline_options(plan, args, RUNNERS["DataflowRunner"]).get_all_options()
    assert options[worker_key.SECRET_OPTION] == secret and options[worker_key.PATH_OPTION] == plan.key_path
    assert worker_key.PLUGIN in options["beam_plugins"]


# --- the deployment files agree with the code --------------------------------------------------------


def test_the_harness_image_pins_the_installed_beam_version():
    from apache_beam.version import __version__

    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(rf"^ARG BEAM_VERSION={re.escape(__version__)}$", dockerfile, re.M)
    assert "FROM apache/beam_python3.11_sdk:${BEAM_VERSION}" in dockerfile
    assert 'ENTRYPOINT ["/opt/apache/beam/boot"]' in dockerfile
    launcher = (ROOT / "deploy" / "dataflow" / "Dockerfile").read_text()
    assert "python_template_launcher" in launcher and "FLEX_TEMPLATE_PYTHON_PY_FILE" in launcher


def test_the_flex_template_parameters_are_the_entry_points_options(tmp_path):
    metadata = json.loads((ROOT / "deploy" / "dataflow" / "metadata.json").read_text())
    names = {p["name"] for p in metadata["parameters"]}
    assert {"input", "start", "end", "epsilon", "delta", "norm_budget", "releases_parquet", "previous_ledger",
            "output", "noise_key_secret"} <= names
    parser = dist._parser()
    # The launcher passes each parameter as --name=value: each name is one of the entry point's options.
    flags = {flag for a in parser._actions for flag in a.option_strings}
    assert {f"--{name}" for name in names} <= flags, {f"--{name}" for name in names} - flags
    # What a first run and a day's coverage need (issue 37): the contract and the inputs' days.
    assert {"schema", "input_days", "no_data_days"} <= names
    for p in metadata["parameters"]:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", p["name"]) and p["label"] and p["helpText"]
        assert all(re.compile(r) for r in p["regexes"])
    # The launcher passes each parameter as --name=value: the parser takes them in that form.
    values = {"input": "gs://b/in/*.parquet", "start": "2026-03-01", "end": "2026-03-01", "epsilon": "1",
              "delta": "1e-6", "norm_budget": "30", "releases_parquet": "gs://p/r", "previous_ledger": "none",
              "output": "gs://c/o", "noise_key_secret": "projects/p/secrets/k/versions/1",
              "schema": "gs://c/schema.json", "input_days": "2026-03-01", "no_data_days": "2026-03-02:2026-03-03"}
    regexes = {p["name"]: p["regexes"] for p in metadata["parameters"]}
    for name, value in values.items():  # each example passes its parameter's own check
        assert all(re.fullmatch(r, value) for r in regexes[name]), (name, value)
    args, rest = parser.parse_known_args([f"--{k}={v}" for k, v in values.items()])
    assert rest == [] and args.norm_budget == 30.0 and args.previous_ledger == "none"
    assert (args.schema_file, args.input_days, args.no_data_days) == ("gs://c/schema.json", "2026-03-01",
                                                                     ["2026-03-02:2026-03-03"])


def test_the_flink_options_file_parses_as_flink_runner_options():
    text = (ROOT / "deploy" / "flink" / "flink-options.txt").read_text()
    flags = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    flags = [os.path.expandvars(f) for f in flags]
    options = PipelineOptions(flags)
    flink = options.view_as(FlinkRunnerOptions)
    assert options.get_all_options()["runner"] == "FlinkRunner"
    assert flink.flink_version in FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS
    assert options.view_as(PortableOptions).environment_type in ("DOCKER", "EXTERNAL", "PROCESS")


def _given_options(path: Path, *, command: str | None = None) -> list[str]:
    """The ``--options`` a deployment file gives, comments left out; with ``command``, only those of
    the command on the line holding it (through its continuation lines)."""
    lines = [re.sub(r"(^|\s)#.*", "", line) for line in path.read_text().splitlines()]
    if command is not None:
        first = last = next(i for i, line in enumerate(lines) if command in line)
        while lines[last].rstrip().endswith("\\"):
            last += 1
        lines = lines[first:last + 1]
    return re.findall(r"(?<![\w-])--[A-Za-z][A-Za-z0-9_-]*", "\n".join(lines))


#: Each deployment file, the command in it that launches a job (None: the whole file) and the job.
DEPLOYED = [("deploy/flink/submit.sh", None, "renyi_stream.pipelines.distributed"),
            ("deploy/flink/submit-stream.sh", None, "renyi_stream.pipelines.streaming"),
            ("deploy/dataflow/launch.sh", "python -m renyi_stream.pipelines.streaming", "renyi_stream.pipelines.streaming"),
            ("deploy/dataflow/main.py", None, "renyi_stream.pipelines.distributed")]
#: The module defining each job's command line (``_parser``).
JOB_PARSERS = {"renyi_stream.pipelines.distributed": "renyi_stream.pipelines.distributed.job",
               "renyi_stream.pipelines.streaming": "renyi_stream.pipelines.streaming.options"}


@pytest.mark.parametrize("script, command, job", DEPLOYED, ids=[d[0] for d in DEPLOYED])
def test_every_option_a_deployment_file_gives_a_job_is_the_jobs_or_beams(script, command, job):
    """The jobs refuse an option neither they nor Beam know (a typo would be dropped); what the
    deployment files give must pass, the Flink checkpoint options included (the Flink scripts read
    flink-options.txt, which gives ``--flink_submit_uber_jar``)."""
    from importlib import import_module

    from renyi_stream.pipelines.beam.job_options import long_options, refuse_unknown_options

    parser = import_module(JOB_PARSERS[job])._parser()
    given = _given_options(ROOT / script, command=command)
    if "flink" in script:
        given += _given_options(ROOT / "deploy" / "flink" / "flink-options.txt")
    ours = set(long_options(parser))
    beams = [option for option in given if option not in ours]
    assert beams and set(given) & ours  # the file gives both kinds
    refuse_unknown_options(beams, ours, command=parser.prog)  # RunRefused naming the first unknown one


def test_the_flink_checkpoint_options_are_refused_without_the_uber_jar_that_passes_them_on():
    from renyi_stream.pipelines.beam.job_options import RunRefused, refuse_unknown_options

    flags = ["--runner=FlinkRunner", "--streaming", "--checkpointing_interval=60000"]
    refuse_unknown_options(flags + ["--flink_submit_uber_jar"], [], command="python -m renyi_stream.pipelines.streaming")
    with pytest.raises(RunRefused, match="argument --checkpointing_interval: .*only with --flink_submit_uber_jar"):
        refuse_unknown_options(flags, [], command="python -m renyi_stream.pipelines.streaming")


@pytest.mark.parametrize("script", ["deploy/dataflow/launch.sh", "deploy/flink/submit.sh"])
def test_the_scripts_are_valid_bash_with_their_variables_on_top(script):
    path = ROOT / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert os.access(path, os.X_OK)
    lines = path.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and any(line.startswith("set -euo pipefail") for line in lines[:20])
    assert "-m renyi_stream.pipelines.distributed" in path.read_text() or "flex-template" in path.read_text()


# --- the local job's Parquet release path publishes only what the ledger committed -------------


def test_local_parquet_releases_appear_only_after_the_ledger_commit(tmp_path, two_days):
    key_path, _ = _key(tmp_path)
    parquet = tmp_path / "public-parquet"
    env = {**os.environ, "RENYI_STREAM_CRASH_AT": "after_ledger_write"}
    out = subprocess.run(
        ["python", "-m", "renyi_stream.pipelines.cli.main", "run", "--input", *two_days[:1], "--store", str(tmp_path / "s.duckdb"),
         "--ledger", str(tmp_path / "l.duckdb"), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "2",
         "--start", "2026-03-01", "--end", "2026-03-01", "--key", key_path, "--releases-parquet", str(parquet),
         *DECLARE, "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == -9  # killed inside the curator's transaction: nothing committed, nobody charged
    assert not list(parquet.rglob("*.parquet")), "a public release exists that no committed ledger charged"


def test_local_parquet_releases_left_pending_by_a_crash_are_written_by_the_next_run(tmp_path, two_days):
    key_path, _ = _key(tmp_path)
    parquet, store = tmp_path / "public-parquet", tmp_path / "s.duckdb"
    argv = ["python", "-m", "renyi_stream.pipelines.cli.main", "run", "--input", *two_days[:1], "--store", str(store),
            "--ledger", str(tmp_path / "l.duckdb"), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "2",
            "--start", "2026-03-01", "--end", "2026-03-01", "--key", key_path, "--releases-parquet", str(parquet),
            *DECLARE, "--quiet"]  # the re-run may declare the contract its crashed first run recorded
    crashed = subprocess.run(argv, cwd=ROOT, env={**os.environ, "RENYI_STREAM_CRASH_AT": "before_publish"},
                             capture_output=True, text=True)
    assert crashed.returncode == -9 and not list(parquet.rglob("*.parquet"))  # committed, not yet public
    rerun = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    files = sorted(parquet.rglob("*.parquet"))
    assert [f.parent.name for f in files] == [f"window_id={W0}"]
    con = duckdb.connect(str(store), read_only=True)
    in_store = con.execute("SELECT query_id, coordinate, value FROM releases ORDER BY 1, 2").fetchall()
    in_files = duckdb.sql(f"SELECT query_id, coordinate, value FROM read_parquet('{parquet}/*/*.parquet', "
                          "hive_partitioning = true) ORDER BY 1, 2").fetchall()
    assert in_files == in_store and in_store


# --- curator files are private; exact counts stay with the curator (issue 18, items 5 and 6) ----------


def test_the_distributed_jobs_local_output_is_0600_in_0700_folders_under_umask_022(tmp_path, two_days, umask_022,
                                                                                   not_private):
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)) == 0
    written = {p.relative_to(run2).parts[0] for p in run2.rglob("*") if p.is_file()}
    assert {dist.INTENT, dist.COMMITTED, "ledger", "counts", "dead", "read", "staged-releases"} <= written
    assert not_private(tmp_path / "curator") == {}
    public = list((tmp_path / "public").rglob("*.parquet"))
    assert public and {stat.S_IMODE(p.stat().st_mode) for p in public} == {0o644}  # not curator files


@pytest.mark.parametrize("which", ["manifest", "ledger file"])
def test_a_previous_run_readable_by_others_is_refused_naming_the_file(tmp_path, two_days, capsys, which):
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    manifest = json.loads((run1 / dist.COMMITTED).read_text())
    loose = run1 / dist.COMMITTED if which == "manifest" else Path(manifest["ledger_files"][0])
    os.chmod(loose, 0o644)
    capsys.readouterr()
    assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2)) == 2
    err = capsys.readouterr().err
    assert "refused" in err and str(loose) in err and "mode 0644" in err and f"chmod 600 {loose}" in err, err
    assert not run2.exists()


def _distributed_counts(output: Path) -> set[int]:
    """The run's nonzero exact totals and its users, as its curator manifest holds them."""
    manifest = json.loads((output / dist.COMMITTED).read_text())
    return {int(v) for v in (*manifest["totals"].values(), manifest["users"], manifest["previous_users"]) if v}


def _printed_numbers(text: str, *private: str) -> set[int]:
    """The integers printed, outside the given paths and the attempt's hex id."""
    for item in private:
        text = text.replace(item, "X")
    text = re.sub(r"attempt [0-9a-f]+", "attempt X", text).replace(",", "")
    return {int(n) for n in re.findall(r"\d+", text)}


def test_the_distributed_jobs_quiet_mode_prints_no_exact_count(tmp_path, two_days, capsys):
    run1, run2 = tmp_path / "curator" / "run1", tmp_path / "curator" / "run2"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1, "--quiet")) == 0
    assert dist.main(_args(tmp_path, two_days[1:2], "2026-03-02", "2026-03-02", str(run1), run2, "--quiet")) == 0
    captured = capsys.readouterr()
    counts = _distributed_counts(run1) | _distributed_counts(run2)
    assert min(counts) > 1 and 250 in counts  # rows read; every count distinct from the public 0 and 1
    assert _printed_numbers(captured.out + captured.err, str(tmp_path)) & counts == set(), captured
    assert "balanced" in captured.out


def test_the_distributed_jobs_default_summary_says_its_counts_are_for_the_curator_only(tmp_path, two_days, capsys):
    run1 = tmp_path / "curator" / "run1"
    assert dist.main(_args(tmp_path, two_days[:1], "2026-03-01", "2026-03-01", "none", run1)) == 0
    out = capsys.readouterr().out
    assert "curator only: exact counts, do not publish" in out
    assert out.index("curator only") < out.index("rows read")
    assert {250} <= _printed_numbers(out, str(tmp_path))  # the counts themselves, for the curator


def test_the_flex_template_launcher_runs_the_job_quiet(monkeypatch):
    """Dataflow's launcher log is Cloud Logging's, readable beyond the curator: no exact counts."""
    import runpy

    seen = []
    monkeypatch.setattr(dist, "main", lambda argv: seen.append(list(argv)) or 0)
    monkeypatch.setattr("sys.argv", ["main.py", "--input=gs://b/in/*.parquet", "--output=gs://c/o"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "deploy" / "dataflow" / "main.py"), run_name="__main__")
    assert done.value.code == 0 and len(seen) == 1 and "--quiet" in seen[0]
