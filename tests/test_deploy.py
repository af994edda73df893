"""The daily graph is ready for distributed runners (issue 5), checked without a cluster: it
constructs under FlinkRunner and DataflowRunner options, round-trips through the Beam runner API
(the portable proto those runners receive), keys state and shuffles with deterministic coders,
and every DoFn pickles (no unpicklable closures)."""

from __future__ import annotations

import datetime as dt
import logging

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor
from apache_beam.typehints import typehints

from pipelines import transforms as tx
from pipelines.shard_state import QueryPlan
from queries.linear import default_queries
from stream.ledger import Ledger
from stream.noise import NoiseKey
from stream.schema import WindowSpec

W0 = (dt.date(2026, 3, 1) - dt.date(1970, 1, 1)).days
RUNNERS = {
    "FlinkRunner": ["--runner=FlinkRunner", "--flink_master=localhost:8081", "--environment_type=DOCKER",
                    "--environment_config=renyi-stream-harness:latest", "--streaming"],
    "DataflowRunner": ["--runner=DataflowRunner", "--project=my-project-123", "--region=europe-west1",
                       "--temp_location=gs://my-bucket-renyi/tmp", "--staging_location=gs://my-bucket-renyi/staging",
                       "--sdk_container_image=europe-docker.pkg.dev/my-project-123/renyi/harness:latest"],
}


def _graph(tmp_path, runner: str) -> beam.Pipeline:
    logging.getLogger().setLevel(logging.ERROR)  # GCP extras warn about optional clients
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2], type=pa.int64()),
                             "day": pa.array([dt.date(2026, 3, 1)] * 2, type=pa.date32()),
                             "opened": pa.array(np.ones(2))}), path)
    key = NoiseKey.load_or_create(tmp_path / "k.key")
    p = beam.Pipeline(options=PipelineOptions(RUNNERS[runner]))
    plan = QueryPlan.starting_at(default_queries(["opened"]) + default_queries(["opened"], kind="running"), W0)
    _ = p | tx.DailyReleases(
        [str(path)], window=WindowSpec(), start_window=W0, end_window=W0 + 1, released=[], schedule=[W0, W0 + 1],
        plan=plan, indicator_columns=["opened"], noise_std=2.0, policy="drop", budget=1.0, id_type="int64",
        tracker_step=1 / 32, n_shards=8, previous_ledger=Ledger(budget=1.0).to_arrow(),
        key_path=str(tmp_path / "k.key"), accounting="gdp", key_fingerprint=key.fingerprint,
        releases_parquet="gs://my-bucket-renyi/releases")
    return p


class _Collect(PipelineVisitor):
    def __init__(self) -> None:
        self.applied = []

    def visit_transform(self, node) -> None:
        self.applied.append(node)


def _applied(p: beam.Pipeline):
    visitor = _Collect()
    p.visit(visitor)
    return visitor.applied


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_the_graph_round_trips_through_the_portable_runner_api(tmp_path, runner):
    p = _graph(tmp_path, runner)
    proto = p.to_runner_api()
    restored = beam.Pipeline.from_runner_api(proto, p.runner, p._options)
    again = restored.to_runner_api()
    assert len(proto.SerializeToString()) > 0
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {t.unique_name for t in again.components.transforms.values()} == names
    assert any("IndividualFilter" in name for name in names) and any("ReleaseWindows" in name for name in names)


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_shuffle_and_state_key_has_a_deterministic_coder(tmp_path, runner):
    keyed = 0
    for node in _applied(_graph(tmp_path, runner)):
        transform = node.transform
        stateful = isinstance(transform, beam.ParDo) and isinstance(transform.fn, tx.IndividualFilterDoFn)
        if not (isinstance(transform, beam.GroupByKey) or stateful):
            continue
        (pcoll,) = node.inputs
        hint = pcoll.element_type
        assert isinstance(hint, typehints.TupleConstraint), f"{node.full_label} input is not typed as a KV: {hint}"
        key_coder = beam.coders.registry.get_coder(hint.tuple_types[0])
        assert key_coder.is_deterministic(), f"{node.full_label}: key coder {key_coder} is not deterministic"
        keyed += 1
    assert keyed >= 3  # the filter's state, the window grouping of release files, the running totals


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_dofn_pickles_and_unpickles(tmp_path, runner):
    fns = [node.transform.fn for node in _applied(_graph(tmp_path, runner)) if isinstance(node.transform, beam.ParDo)]
    assert len(fns) >= 5
    for fn in fns:
        assert type(pickler.loads(pickler.dumps(fn))) is type(fn)
