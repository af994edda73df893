"""What the streaming job's curator files record in their Parquet schema metadata, beside a
ledger's own and its configuration
(:meth:`renyi_stream.stream.engine.ledger_config.LedgerConfig.to_snapshot_metadata`): a ledger
snapshot's window, shard, kind (full or delta), queries and run; a running query's state files'
query id and decoder; a snapshot's prepaid rows. Written and read by every runner. Imports no Beam."""

from __future__ import annotations

import pyarrow as pa

from renyi_stream.stream.engine.ledger_config import snapshot_key

#: Schema metadata of a ledger snapshot the streaming filter emits (tag ``ledger``): ``full`` (the
#: shard's whole ledger) or ``delta`` (the rows of the users charged in its window,
#: :meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`), and for a delta the window of the
#: full snapshot it goes over (every window between them has a delta): the shard's ledger at a
#: delta's window is that full snapshot with the deltas through it over it, in window order.
SNAPSHOT_KIND, SNAPSHOT_BASE = "renyi_stream.snapshot", "renyi_stream.base_window"
#: Schema metadata of a running query's state files (per-user prepaid rows, release state): its id;
#: and of a release state, its releases ``y`` from its first window through the state's (JSON
#: ``[[window, [y...]], ...]``), which the running-total estimates of later windows are computed from.
RUNNING_QUERY_ID, RUNNING_RAW = "renyi_stream.query_id", "renyi_stream.running_raw"
#: Schema metadata of a release state this version writes instead of :data:`RUNNING_RAW`: the state
#: of the query's estimates' decoder after the state's window (JSON ``{"windows": decoded,
#: "shape": [...], "values": [...]}``, :meth:`renyi_stream.stream.continual.strategies.Strategy.decode_online`): ``1 + buffers``
#: rows of ``d`` numbers for BLT whatever the window, one row for window sums, every release so far
#: only for strategies whose estimate has no finite recurrence (square root, tree).
RUNNING_DECODER = "renyi_stream.running_decoder"
#: Schema metadata of a shard's ledger snapshot when it has running-query state: its prepaid users
#: per running query after the window (JSON ``{query_id: rows}``), so that a job restoring the prepaid
#: rows beside it can tell a lost file (which would restart its users' prepaid charges from nothing)
#: from none.
PREPAID_USERS = "renyi_stream.prepaid_users"
#: Schema metadata of the same snapshot: the rows of the shard's prepaid file of this window per
#: running query (JSON ``{query_id: rows}``): every user's for a full snapshot, the users charged in
#: the window for a delta (:func:`renyi_stream.pipelines.streaming.shard_filter._prepaid_parts`), so that each
#: file of a delta chain is checked.
PREPAID_ROWS = "renyi_stream.prepaid_rows"
#: Schema metadata of every ledger snapshot the job writes, beside the ledger's own and the
#: ledger's configuration (:meth:`renyi_stream.stream.engine.ledger_config.LedgerConfig.to_snapshot_metadata`,
#: ``renyi_stream.<field>``): the window and shard it is of, so that a later job given it as
#: ``--previous-ledger`` can tell whether it holds every shard of one window
#: (:func:`renyi_stream.pipelines.streaming.snapshots._previous_ledger`).
SNAPSHOT_WINDOW, SNAPSHOT_SHARD = snapshot_key("window_id"), snapshot_key("shard")
#: The job's ``--shards`` and the ledger's identity, as the configuration records them.
SNAPSHOT_SHARDS, SNAPSHOT_LEDGER_ID = snapshot_key("n_shards"), snapshot_key("ledger_id")
#: The queries a ledger has answered, ``{query_id: first window answered}`` (JSON), recorded in every
#: snapshot (those answered through its window) and carried by a job that continues it: a query
#: registered into windows already charged but never answered is moved past them at the next launch
#: (:func:`renyi_stream.queries.catalogue.queries_at_launch`).
SNAPSHOT_QUERIES = "renyi_stream.queries"
#: The job's query plan (:func:`renyi_stream.queries.registration.recorded_plan`: which queries from which window, their
#: specs), recorded in every snapshot.
SNAPSHOT_QUERY_PLAN = "renyi_stream.query_plan"
#: Schema metadata of every ledger snapshot: the run id of the job that wrote it (the state file
#: records it) and of the job whose ledger that job continued (:data:`renyi_stream.queries.release_lineage.ORIGIN`
#: for a new ledger). A job continuing the snapshot is the successor of its ``SNAPSHOT_RUN``.
SNAPSHOT_RUN, SNAPSHOT_PREVIOUS_RUN = snapshot_key("run"), snapshot_key("previous_run")


def _metadata(table: pa.Table) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}


def _marked(table: pa.Table, extra: dict[str, str]) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **{k.encode(): v.encode()
                                                                             for k, v in extra.items()}})

