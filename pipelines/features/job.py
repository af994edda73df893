"""The features job: daily indicator files -> one training row per user, as a Beam batch job.

Materialising one row per user from months of daily files is the part of training that
outgrows one machine first, so it runs on Beam like the daily job, and on its read and
validation: :class:`renyi_stream.pipelines.beam.transforms.ReadIndicators` (the daily job's reader,
:func:`renyi_stream.stream.engine.readers.read_batches`, and validator, :func:`renyi_stream.stream.schema.validate_batch`
with the ledger's id type taken from the first input, dead letters by
:mod:`renyi_stream.stream.engine.dead_letters`, the window rule :func:`renyi_stream.stream.engine.dead_letters.classify_windows`
over the schedule ``[first day read, last day read]``), then the daily filter's order rule
(:func:`renyi_stream.pipelines.beam.transforms.in_event_time_order`: per user shard, rows in (window, input,
row) order and the first row of each (user, window) kept, the later ones
``duplicate_user_window`` dead letters). What is computed per user is
:func:`renyi_stream.pipelines.curator.features.user_features` (Beam-free, vectorised). The graph::

    ReadIndicators -> ByShard (packed Arrow tables) -> GroupByKey (shard) -> ShardFeatures
        -> Gather (one key: the features parts, the dead letters, the rows read) -> WriteOutputs

"First" of a repeated (user, day) is the input order: the file's place in ``inputs``, then the
row's place in the file, whatever order the runner reads or shuffles them in (invariant 2
(charge-in-event-time-order, docs/architecture.md)).

The output is written once, at the end, by one step that sees every shard's part: the features
Parquet (:func:`renyi_stream.pipelines.curator.features.write_features`: a scratch file ``0600`` beside it,
then renamed over it), with the run's token and exact row counts in its schema metadata
(:data:`renyi_stream.pipelines.curator.features.ROWS_KEY`), from which the launcher reads the summary back:
that works wherever the launcher can read the output (a local path on the DirectRunner, an object
store at scale). Dead letters go to ``dead_letters`` (Parquet,
:data:`renyi_stream.stream.engine.dead_letters.DEAD_LETTER_SCHEMA`, ``0600``) when it is given. Counts and
dead letters are curator only (invariant 4 (nothing-pre-noise-leaves, docs/architecture.md)).

Locally the graph runs on the DirectRunner's FnApiRunner
(:func:`renyi_stream.pipelines.beam.local_runner.batch_runner`); at scale with the Beam options the daily and
distributed jobs take (``--runner=DataflowRunner --project ...``, ``--runner=FlinkRunner ...``),
passed through as they are, and an option neither this job nor Beam knows is refused
(:func:`renyi_stream.pipelines.beam.job_options.refuse_unknown_options`, in ``renyi-stream features``).
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, Tuple

import logging

import pyarrow as pa
import pyarrow.parquet as pq

# Beam's GCP extras log a warning at import when their optional clients are absent; a features run
# has no use for them, so the import is kept quiet (as the daily job's).
_root, _level = logging.getLogger(), logging.getLogger().level
_root.setLevel(logging.ERROR)
try:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
finally:
    _root.setLevel(_level)
from renyi_stream.pipelines.beam.local_runner import batch_runner
from renyi_stream.pipelines.beam.rows import in_event_time_order, packed_by_shard, unpacked
from renyi_stream.pipelines.beam.transforms import ReadIndicators
from renyi_stream.pipelines.curator.features import (LABEL, FeatureSummary, FeatureWindows, feature_names, features_table,
                                        indicator_columns_of, read_rows_record, user_features, write_features)
from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA
from renyi_stream.stream.engine.ledger_config import DEFAULT_SHARDS, MAX_SHARDS
from renyi_stream.stream.contract import InputContract
from renyi_stream.stream.engine.readers import id_type_of, check_declared_columns
from renyi_stream.stream.engine.row_balance import reason_counts
from renyi_stream.stream.private_files import write_private
from renyi_stream.stream.schema import DEFAULT_KEYS, InputKeys, WindowSpec


@dataclass(frozen=True)
class FeaturesPlan:
    """What every step of a run needs (picklable: it travels to the workers): where the outputs
    go, the windows, the indicator columns, the label column, the inputs' id type (``"int64"`` or
    ``"string"``, the daily job's rule on the first input), the run's token (which the launcher
    finds in the file this run wrote) and the names of the id and time columns (the contract's)."""

    out: str
    dead_letters: str | None
    windows: FeatureWindows
    columns: tuple[str, ...]
    label_column: str
    id_type: str
    token: str
    keys: InputKeys = DEFAULT_KEYS


class ShardFeatures(beam.DoFn):
    """``(shard, [(kind, packed rows), ...])`` -> the shard's per-user features table (main) and
    its repeated (user, window) rows as ``duplicate_user_window`` dead letters (tag ``dead``).

    The rows are put in (window, input, row) order and the first of each (user, window) kept by
    the daily filter's own rule (:func:`renyi_stream.pipelines.beam.transforms.in_event_time_order`); a user's
    rows are all in one shard, so the shards' tables hold disjoint users."""

    def __init__(self, plan: FeaturesPlan) -> None:
        self._plan = plan

    def process(self, element: tuple[int, Iterable[tuple[str, Any]]]) -> Iterator[Any]:
        _, parts = element
        rows, duplicates = in_event_time_order(unpacked(part for _, part in parts))
        if duplicates is not None and duplicates.num_rows:
            yield beam.pvalue.TaggedOutput("dead", duplicates)
        if rows is not None and rows.num_rows:
            yield user_features(rows, self._plan.windows, self._plan.columns, self._plan.label_column)


def _tagged(item: Any, kind: str) -> tuple[int, tuple[str, Any]]:
    return 0, (kind, item)  # one key: every output meets in one group


def write_outputs(group: tuple[int, Iterable[tuple[str, Any]]], plan: FeaturesPlan) -> None:
    """The run's last step: every shard's features part, every dead letter and every file's rows
    read -> the dead-letter file (when asked for) and the features file, each written once.
    The features file is written even when no row was valid (it then holds no user): whether the
    job succeeds, and so whether a model is trained on its output, must not hinge on one user's
    row (issue 37, item 1). The group always meets: ``build`` adds one ``start`` item."""
    _, items = group
    parts: list[pa.Table] = []
    dead: list[pa.Table] = [DEAD_LETTER_SCHEMA.empty_table()]
    rows_read = 0
    for kind, item in items:
        if kind == "features":
            parts.append(item)
        elif kind == "dead":
            dead.append(item.cast(DEAD_LETTER_SCHEMA))
        elif kind == "read":
            rows_read += int(item[1])
    letters = pa.concat_tables(dead).sort_by([("source", "ascending"), ("row_index", "ascending")])
    if plan.dead_letters:
        write_private(plan.dead_letters, lambda handle: pq.write_table(letters, handle))
    users = sum(p.num_rows for p in parts)
    positives = sum(int(p.column(LABEL).to_numpy().sum()) for p in parts)
    record = {"run": plan.token, "rows_read": rows_read, "rows_rejected": letters.num_rows,
              "rejected_by_reason": reason_counts([letters]), "users": users, "positives": positives}
    write_features(features_table(parts, windows=plan.windows, columns=plan.columns, label_column=plan.label_column,
                                  id_type=plan.id_type, rows=record), plan.out)


def build(pipeline: Any, inputs: Sequence[str], plan: FeaturesPlan, *, n_shards: int) -> None:
    """Add the features job's graph (module docstring) to ``pipeline``."""
    read = pipeline | "ReadIndicators" >> ReadIndicators(
        inputs, window=WindowSpec(), start_window=plan.windows.first, end_window=plan.windows.last, released=[],
        indicator_columns=plan.columns, id_type=plan.id_type, keys=plan.keys)
    per_user = (read.valid
                # Typed as (int, Any): shard keys then get a deterministic coder, as a group needs.
                | "ByShard" >> beam.FlatMap(packed_by_shard, n_shards).with_output_types(Tuple[int, Any])
                | "GroupShards" >> beam.GroupByKey()
                | "ShardFeatures" >> beam.ParDo(ShardFeatures(plan)).with_outputs("dead", main="features"))
    outputs = (("features", per_user.features), ("dead", per_user.dead), ("dead", read.dead), ("read", read.read))
    tagged = [pcoll | f"Tag{i}{name.title()}" >> beam.Map(_tagged, name) for i, (name, pcoll) in enumerate(outputs)]
    # One item that is always there, so the outputs are written when every input is empty too.
    tagged.append(pipeline | "Start" >> beam.Create([_tagged(None, "start")]))
    _ = (tagged | "AllOutputs" >> beam.Flatten().with_output_types(Tuple[int, Any])
         | "Gather" >> beam.GroupByKey()
         | "WriteOutputs" >> beam.Map(write_outputs, plan))


def materialise_features(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    start: dt.date | str,
    end: dt.date | str,
    label_column: str,
    label_start: dt.date | str,
    label_end: dt.date | str,
    indicator_columns: Sequence[str] | None = None,
    n_shards: int = DEFAULT_SHARDS,
    beam_args: Sequence[str] = (),
    dead_letters: str | os.PathLike | None = None,
    contract: InputContract | None = None,
) -> FeatureSummary:
    """Run the features job: read the daily indicator files, one row per user, write ``out``
    (Parquet; a local path or a URI) and, with ``dead_letters``, the rejected rows there.

    With ``contract`` (the ledger's declared input, :mod:`renyi_stream.stream.contract`) the indicator columns
    are its number columns and the ids are parsed as its id type, whatever the files' writers
    typed; every input must hold the declared columns, and its id and time columns are those it
    names (``--id-column``, ``--day-column``, ``--event-time-column``). Without one, ``indicator_columns`` default
    to the daily job's default columns of the first input
    (:func:`renyi_stream.pipelines.curator.features.indicator_columns_of`); ``n_shards`` (in ``[1, 65536]``)
    is how many groups of users the aggregation is split into; ``beam_args`` are Beam options
    (default: the DirectRunner, in memory). Returns the summary read back from ``out`` (exact
    counts: curator only).

    Raises ``ValueError`` naming the parameter for an empty input list, a date that does not
    parse, reversed windows, a label window that overlaps the feature window, a
    ``label_column`` that is not an indicator column or ``n_shards`` out of range;
    :class:`renyi_stream.stream.engine.readers.InputFileError` naming a file that cannot be read (a whole-file
    problem stops the job, as in the daily job). Inputs without a valid row give a features file
    of no user (module docstring of :func:`write_outputs`), never a refusal.
    """
    if not inputs:
        raise ValueError("inputs must name at least one indicator file")
    windows = FeatureWindows.of(start=start, end=end, label_start=label_start, label_end=label_end)
    if isinstance(n_shards, bool) or not isinstance(n_shards, int) or not 1 <= n_shards <= MAX_SHARDS:
        raise ValueError(f"n_shards must be an integer in [1, {MAX_SHARDS}], got n_shards={n_shards!r}")
    paths = [str(p) for p in inputs]
    if contract is not None:
        for path in paths:
            check_declared_columns(path, contract)
        columns = indicator_columns_of(paths[0], label_column, indicator_columns or contract.numeric)
    else:
        columns = indicator_columns_of(paths[0], label_column, indicator_columns)
    plan = FeaturesPlan(out=str(out), dead_letters=None if dead_letters is None else str(dead_letters),
                        windows=windows, columns=tuple(columns), label_column=label_column,
                        id_type=contract.id_type if contract is not None else id_type_of(paths[0]),
                        token=uuid.uuid4().hex, keys=contract.keys if contract is not None else DEFAULT_KEYS)
    options = PipelineOptions(list(beam_args) or ["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    with beam.Pipeline(runner=batch_runner(options), options=options) as pipeline:
        build(pipeline, paths, plan, n_shards=n_shards)
    record = read_rows_record(out)
    if record is None or record.get("run") != plan.token:  # the runner did not run the last step
        raise RuntimeError(f"the features job finished without writing {out} (its run token {plan.token} is not "
                           "in the file's record): the runner dropped its last step")
    return FeatureSummary(path=str(out) if "://" in str(out) else Path(out), users=record["users"],
                          positives=record["positives"], feature_columns=tuple(feature_names(columns)),
                          rows_read=record["rows_read"], rows_rejected=record["rows_rejected"],
                          rejected_by_reason=dict(record["rejected_by_reason"]))
