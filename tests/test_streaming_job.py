"""The streaming entry point (issue 5): Arrow IPC messages in, Parquet releases per window out.

Replayed on the DirectRunner it gives the ledger ``renyi-stream run`` gives on the same rows and
key, and the same releases up to the noise, which is each ledger's own (bound to its ledger id,
recorded in every snapshot and carried by a job that continues them); with a Pub/Sub source its graph constructs under Dataflow's streaming
options, round-trips the portable proto and keys its state with deterministic coders; bad
messages are dead letters with reasons, and a job that would restart users from zero is refused,
as is one whose ``--previous-ledger`` is not every shard's snapshot of the last released window, or
whose parameters (promise, accounting, key, window length, release root) are not the ledger's.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
from pathlib import Path

import apache_beam as beam
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.streaming import books as streaming_books
from renyi_stream.pipelines.streaming import codec
from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.books import BOOKS_COLUMNS, BOOKS_FILE, books_records, window_counts
from renyi_stream.pipelines.streaming.codec import _source_number, decode_message, encode_message
from renyi_stream.pipelines.streaming.commits import MARKER_BOOKS
from renyi_stream.pipelines.streaming.file_metadata import SNAPSHOT_LEDGER_ID
from renyi_stream.pipelines.streaming.options import _parser
from renyi_stream.pipelines.streaming.replay import replay_numbers
from renyi_stream.pipelines.streaming.snapshots import _check_every_shard, _continued, record_snapshot_parameters
from renyi_stream.pipelines.streaming.state_folder import (PREPAID, RUNNING_STATE, STAGED_RELEASES, STATE_FILE,
                                                           WINDOW_FOLDERS, commit_marker_path)
from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.stream.contract import DeclaredColumn, InputContract
from renyi_stream.stream.engine.ledger_config import DERIVED, FIXED, LedgerConfig, snapshot_key
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.schema import DeadLetterReason, WindowSpec

from conformance.outcome import window_noise

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
EPSILON, DELTA, NORM_BUDGET = 1.0, 1e-6, 2.0


def _rows(day: int, users, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed + day)
    n = len(users)
    return pa.table({"user_id": pa.array(users, type=pa.int64()),
                     "day": pa.array([DAY0 + dt.timedelta(days=day)] * n, type=pa.date32()),
                     "opened": pa.array((rng.random(n) < 0.5).astype(np.float64)),
                     "bought": pa.array(rng.random(n) * 1.5)})


@pytest.fixture
def days(tmp_path):
    """Three days of 120 of 200 users: Arrow IPC messages (two per day) and the same rows as Parquet."""
    rng = np.random.default_rng(11)
    messages, files = [], []
    for d in range(3):
        table = _rows(d, rng.choice(200, 120, replace=False), seed=5)
        files.append(str(tmp_path / f"day-{d}.parquet"))
        pq.write_table(table, files[-1])
        for k, part in enumerate((table.slice(0, 60), table.slice(60))):
            path = tmp_path / "messages" / f"day-{d}-{k}.arrows"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(encode_message(part))
            messages.append(str(path))
    return messages, files


def _key(tmp_path) -> str:
    path = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(path)
    return str(path)


def _snapshot_ledger_ids(folder: Path) -> set:
    """The ledger ids the snapshots under ``folder`` record (every shard and window below it)."""
    return {pq.read_schema(f).metadata.get(SNAPSHOT_LEDGER_ID.encode(), b"").decode()
            for f in folder.rglob("*.parquet")}


def _without_noise(rows: list[tuple], key_path: str, ledger_id: str) -> list[tuple]:
    """Release rows (query_id, window_id, coordinate, value, noise_std) of window sums with the
    keyed noise of ledger ``ledger_id`` taken off ``value``: the sums that were noised."""
    key = NoiseKey.load(key_path)
    return [(q, w, c, v - window_noise(key, ledger_id, query_id=q, window_id=w, coordinate=c, noise_std=s), s)
            for q, w, c, v, s in rows]


#: The input contract of every ledger here: int64 ids, ``opened`` a 0/1 indicator, ``bought`` in
#: [0, 1.5) (:func:`_rows`), so the default clamped sums are the plain sums of the rows.
CONTRACT = InputContract("int64", (DeclaredColumn("opened", "number", 0.0, 1.0),
                                   DeclaredColumn("bought", "number", 0.0, 1.5)))
DECLARED = ["--id-type", "int64", "--column", "opened=0:1", "--column", "bought=0:1.5"]


def _args(tmp_path, source: list[str], *extra: str) -> list[str]:
    return [*source, *DECLARED, "--start", "2026-03-01", "--end", "2026-03-03",
            "--epsilon", str(EPSILON), "--delta", str(DELTA), "--norm-budget", str(NORM_BUDGET),
            "--releases-parquet", str(tmp_path / "public"), "--output", str(tmp_path / "curator"),
            "--noise-key", _key(tmp_path), "--shards", "3", *extra]


def test_a_replayed_stream_gives_the_releases_and_ledger_of_renyi_stream_run(tmp_path, days):
    messages, files = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    run_job(JobConfig(inputs=tuple(files), store=str(tmp_path / "s.duckdb"), ledger=str(tmp_path / "l.duckdb"),
                      epsilon=EPSILON, delta=DELTA, norm_budget=NORM_BUDGET, start_window=W0, end_window=W0 + 2,
                      key_path=_key(tmp_path), n_shards=5, contract=CONTRACT))
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    batch = con.execute("SELECT query_id, window_id, coordinate, value, noise_std FROM releases ORDER BY 1, 2, 3"
                        ).fetchall()
    local_ledger = con.execute("SELECT 1").fetchall() and duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True
                                                                         ).execute(
        "SELECT user_id, used FROM ledger ORDER BY user_id").fetchall()
    streamed = duckdb.sql(f"SELECT query_id, window_id, coordinate, value, noise_std FROM read_parquet("
                          f"'{tmp_path / 'public'}/*/*.parquet', hive_partitioning = true) ORDER BY 1, 2, 3").fetchall()
    assert len(streamed) == len(batch) == 2 * 3
    # Same rows and key, two ledgers: the same sums, each with its own ledger's noise (issue 18).
    (stream_id,) = _snapshot_ledger_ids(tmp_path / "curator" / "ledger")
    (batch_id,) = con.execute("SELECT value FROM store_meta WHERE key = 'ledger_id'").fetchone()
    assert stream_id != batch_id and all(abs(s[3] - b[3]) > 1e-9 for s, b in zip(streamed, batch))
    streamed, batch = _without_noise(streamed, _key(tmp_path), stream_id), _without_noise(batch, _key(tmp_path), batch_id)
    for s, b in zip(streamed, batch):
        assert s[:3] == b[:3] and s[4] == b[4] and s[3] == pytest.approx(b[3], rel=1e-12, abs=1e-9)
    last = tmp_path / "curator" / "ledger" / f"window_id={W0 + 2}"
    ledger = pa.concat_tables([pq.read_table(f) for f in sorted(last.glob("shard=*/*.parquet"))]).sort_by("user_id")
    assert list(zip(ledger.column("user_id").to_pylist(), ledger.column("used").to_pylist())) == local_ledger


def test_a_replayed_files_rows_are_numbered_by_its_place_in_replay_and_a_messages_by_its_name():
    """Of two rows of one (user, window), the one first in (window, number, row) order counts: a
    replay numbers its files in --replay order (the batch jobs' input order); a Pub/Sub or Kafka
    message by its name's hash, whatever order messages arrive in. Every row carries its input's
    name for its dead letters."""
    from renyi_stream.stream.engine.dead_letters import SOURCE, source_names

    payload = encode_message(_rows(0, [3, 1], seed=1))
    decode = sj.DecodeAndValidate(window=WindowSpec.from_length("1d"), indicator_columns=["opened", "bought"],
                                  numbers=replay_numbers(["b.arrows", "a.arrows", "b.arrows"]))

    def numbered(name: str) -> tuple[set[int], dict[int, str]]:
        (valid,) = [out for out in decode.process((name, payload)) if not isinstance(out, beam.pvalue.TaggedOutput)]
        return set(valid.column(SOURCE).to_pylist()), source_names([valid])

    assert numbered("a.arrows") == ({1}, {1: "a.arrows"}) and numbered("b.arrows") == ({0}, {0: "b.arrows"})
    kafka = _source_number("indicators/2/41")
    assert numbered("indicators/2/41") == ({kafka}, {kafka: "indicators/2/41"})


def test_bad_rows_of_a_replayed_message_are_dead_letters_with_reasons(tmp_path, days):
    """A row that fails validation is its own dead letter, named by its message. (A replayed file
    that is not a message at all is refused at launch, tests/test_streaming_operator_replay.py; a
    live source's undecodable message is one dead letter, tests/test_streaming_kafka.py.)"""
    messages, _ = days
    bad_rows = _rows(0, [1, 2], seed=0).set_column(2, "opened", pa.array([float("nan"), 1.0]))
    nan = tmp_path / "messages" / "nan.arrows"
    nan.write_bytes(encode_message(bad_rows))
    assert sj.main(_args(tmp_path, ["--replay", str(nan), *messages[:2]])) == 0
    dead = pa.concat_tables([pq.read_table(f) for f in (tmp_path / "curator" / "dead").rglob("*.parquet")])
    bad = dead.filter(pa.compute.equal(dead.column("reason"), "non_finite_value"))
    assert bad.column("source").to_pylist() == [str(nan)] and bad.column("row_index").to_pylist() == [0]


def test_a_replay_naming_a_missing_file_is_refused_before_anything_runs(tmp_path, days, capsys):
    """The replayed files are read inside the pipeline (their bytes are no longer part of the graph),
    so a missing one is refused at launch, by name, before any state folder is written."""
    messages, _ = days
    missing = tmp_path / "messages" / "not-there.arrows"
    assert sj.main(_args(tmp_path, ["--replay", *messages, str(missing)])) == 2
    assert f"--replay: no such file: {missing}" in capsys.readouterr().err
    assert not (tmp_path / "curator" / STATE_FILE).exists()


def _message_rows(paths: list[str]) -> int:
    return sum(decode_message(Path(p).read_bytes()).num_rows for p in paths)


def test_a_replay_records_its_rows_read_and_a_balanced_book(tmp_path, days):
    messages, _ = days
    again = tmp_path / "messages" / "again.arrows"  # day 0's first message again: 60 duplicates
    again.write_bytes(Path(messages[0]).read_bytes())
    replay = [*messages, str(again)]
    assert sj.main(_args(tmp_path, ["--replay", *replay])) == 0
    books = streaming_books.books(str(tmp_path / "curator"))
    assert books["rows_read"] == _message_rows([*messages, str(again)])
    assert books["rows_read"] == (books["admitted"] + books["clipped"] + books["dropped"]
                                  + books["rejected"] + books["late"])
    assert books["rejected"] == 60 and books["balanced"]
    import json
    assert json.loads((tmp_path / "curator" / BOOKS_FILE).read_text()) == books


def test_every_charged_window_records_each_shards_balanced_books(tmp_path, days):
    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    per_window = books_records(str(tmp_path / "curator"))
    # 3 shards x 3 windows, rows or not, each one balanced.
    assert per_window.num_rows == 9
    assert set(per_window.column("balanced").to_pylist()) == {1}
    assert sum(per_window.column("received").to_pylist()) == _message_rows(messages)


def test_a_window_writes_one_ledger_snapshot_per_shard_and_its_books_records_in_its_commit_marker(tmp_path, days):
    """The files a window costs (issue 30, item 1): per shard a ledger snapshot, and no other file
    per shard when there are no duplicates; every shard's books record (its row books and its
    counts) is in the window's commit marker, and the counts read back are the charged rows."""
    import json

    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    curator = tmp_path / "curator"
    for window in (W0, W0 + 1, W0 + 2):
        per_folder = {folder: len(list((curator / folder / f"window_id={window}").rglob("*.parquet")))
                      for folder in WINDOW_FOLDERS}
        assert per_folder == {"ledger": 3, "books": 0, STAGED_RELEASES: 1, "counts": 0, "dead": 0,
                              PREPAID: 0, RUNNING_STATE: 0}, (window, per_folder)
        marker = json.loads(Path(commit_marker_path(str(curator), window)).read_text())
        assert [tuple(record) for record in marker[MARKER_BOOKS]] == [tuple(sorted(BOOKS_COLUMNS))] * 3
        assert [record["shard"] for record in marker[MARKER_BOOKS]] == [0, 1, 2]
    assert not (curator / "counts").exists() and not (curator / "books").exists()
    counts = window_counts(str(curator))
    assert counts.column_names == ["window_id", "shard", "admitted", "clipped", "dropped", "nonfinite"]
    books = streaming_books.books(str(curator))
    assert sum(pa.compute.sum(counts.column(c)).as_py() for c in ("admitted", "clipped", "dropped")) == \
        books["admitted"] + books["clipped"] + books["dropped"] == _message_rows(messages)


def test_ledger_snapshots_are_written_without_dictionary_pages(tmp_path, days):
    """A snapshot holds one row per user, every id distinct: a dictionary page only costs time and
    bytes on every shard's every window (object_store.PARQUET_WRITE_OPTIONS)."""
    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    snapshots = list((tmp_path / "curator" / "ledger").rglob("*.parquet"))
    assert snapshots
    for path in snapshots:
        meta = pq.ParquetFile(path).metadata
        encodings = {e for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                     for e in meta.row_group(g).column(c).encodings}
        assert not encodings & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}, (path, encodings)


def test_books_records_of_an_output_whose_markers_predate_them_are_read_from_its_books_folder(tmp_path, days):
    """An --output an earlier version wrote: its markers hold no books records, its books/ folder
    one Parquet file per shard and window. Both are read, and read alike."""
    import json

    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    curator = tmp_path / "curator"
    before = books_records(str(curator))
    marker_path = Path(commit_marker_path(str(curator), W0 + 1))
    marker = json.loads(marker_path.read_text())
    for record in marker.pop(MARKER_BOOKS):
        folder = curator / "books" / f"window_id={W0 + 1}"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        pq.write_table(pa.Table.from_pylist([{c: record[c] for c in BOOKS_COLUMNS}]),
                       folder / f"{record['shard']}.parquet")
        (folder / f"{record['shard']}.parquet").chmod(0o600)
    marker_path.write_text(json.dumps(marker))
    assert books_records(str(curator)).equals(before)
    assert before.num_rows == 9 and before.column_names == list(BOOKS_COLUMNS)


def test_books_records_of_a_window_not_committed_are_not_counted(tmp_path, days):
    """Only committed windows' records count: a window whose marker is gone (a crash before its
    commit) is a dead branch, its rows charged again by the next run."""
    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    curator = tmp_path / "curator"
    Path(commit_marker_path(str(curator), W0 + 2)).unlink()
    assert sorted(set(books_records(str(curator)).column("window_id").to_pylist())) == [W0, W0 + 1]


def test_rows_read_that_reach_no_outcome_unbalance_the_books(tmp_path, days):
    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0
    # A message whose rows were read but neither charged nor dead-lettered: the books must say so.
    lost = tmp_path / "curator" / "read" / "lost.parquet"
    pq.write_table(pa.table({"source": ["lost"], "rows_read": pa.array([5], type=pa.int64())}), lost)
    lost.chmod(0o600)  # a curator file, as the job writes them
    assert not streaming_books.books(str(tmp_path / "curator"))["balanced"]


def test_two_shards_with_equal_counts_in_a_window_both_have_their_counts_recorded(tmp_path):
    from renyi_stream.stream.engine.sharding import shard_of

    # One row in each of two shards: their counts of the window are equal, and the curator's
    # files are named by their content, so the records must differ by their shard.
    candidates = np.arange(50)
    shards = shard_of(candidates, 2)
    users = [int(candidates[shards == 0][0]), int(candidates[shards == 1][0])]
    path = tmp_path / "messages" / "day-0.arrows"
    path.parent.mkdir()
    path.write_bytes(encode_message(_rows(0, users, seed=1)))
    args = _args(tmp_path, ["--replay", str(path)])
    args[args.index("--shards") + 1] = "2"
    assert sj.main(args) == 0
    counts = window_counts(str(tmp_path / "curator"))
    assert sorted(counts.column("shard").to_pylist()) == [0, 1]
    # One books record per shard and window, each naming its shard.
    records = books_records(str(tmp_path / "curator"))
    assert records.filter(pa.compute.equal(records.column("window_id"), W0)).column("shard").to_pylist() == [0, 1]
    assert sum(counts.column("admitted").to_pylist()) + sum(counts.column("dropped").to_pylist()) == 2


def test_shard_books_balance_only_when_the_buffer_holds_what_they_say():
    from renyi_stream.stream.engine.shard_state import ShardBooks

    books = ShardBooks().plus(received=10, late=1, out_of_range=2).plus(duplicate=1, admitted=3, dropped=1)
    assert books.held == 2
    assert books.balances(2)
    assert not books.balances(1)  # a lost row
    assert not books.balances(3)  # a row counted twice


def test_a_stream_over_releases_without_a_previous_ledger_is_refused(tmp_path, days, capsys):
    messages, _ = days
    assert sj.main(_args(tmp_path, ["--replay", *messages[:2]])) == 0
    args = _args(tmp_path, ["--replay", *messages[2:]])
    args[args.index("--start") + 1] = "2026-03-02"
    assert sj.main(args) == 2
    assert "restart from zero budget" in capsys.readouterr().err


@pytest.mark.parametrize("undeclared", [[], ["--columns", "opened,bought"], ["--id-type", "int64"]],
                         ids=["nothing", "columns-only", "id-type-only"])
def test_a_new_ledger_without_a_declared_contract_is_refused_naming_the_options_before_anything_is_written(
        tmp_path, days, capsys, undeclared):
    """Issue 28: nothing about a row is inferred (not the id type from the first message, not the
    columns from --columns): a new ledger's first run declares its contract, or is refused before
    its --output (or the release root) holds a file."""
    messages, _ = days
    args = _args(tmp_path, ["--replay", *messages])
    at = args.index(DECLARED[0])
    args[at:at + len(DECLARED)] = undeclared
    assert sj.main(args) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "new ledger" in err and "needs its input contract" in err, err
    assert "--id-type int64|string" in err and "--column NAME=LO:HI" in err, err
    assert not (tmp_path / "curator").exists() and not (tmp_path / "public").exists()


def _pubsub_graph(tmp_path) -> beam.Pipeline:
    logging.getLogger().setLevel(logging.ERROR)
    options = PipelineOptions(["--runner=DataflowRunner", "--streaming", "--project=my-project-123",
                               "--region=europe-west1", "--temp_location=gs://my-bucket-renyi/tmp",
                               "--staging_location=gs://my-bucket-renyi/staging"])
    p = beam.Pipeline(options=options)
    args, _ = _parser().parse_known_args(_args(
        tmp_path, ["--subscription", "projects/my-project-123/subscriptions/indicators"]))
    sj.build(p, args)
    return p


def test_the_pubsub_graph_constructs_for_dataflow_streaming_and_round_trips_the_portable_proto(tmp_path):
    p = _pubsub_graph(tmp_path)
    proto = p.to_runner_api()
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert any("ReadPubSub" in n for n in names) and any("StreamingFilter" in n for n in names)
    again = beam.Pipeline.from_runner_api(proto, p.runner, p._options).to_runner_api()
    assert {t.unique_name for t in again.components.transforms.values()} == names
    context = pipeline_context.PipelineContext(proto.components)
    stateful = 0
    for t in proto.components.transforms.values():
        if t.spec.urn != "beam:transform:pardo:v1":
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
        if payload.state_specs or payload.timer_family_specs:
            (pcoll,) = [v for k, v in t.inputs.items() if k not in payload.side_inputs]
            kv = proto.components.coders[proto.components.pcollections[pcoll].coder_id]
            assert context.coders.get_by_id(kv.component_coder_ids[0]).is_deterministic(), t.unique_name
            stateful += 1
    assert stateful >= 2  # the filter (keyed by shard) and the release (keyed by window)


def test_every_option_of_the_dataflow_stream_command_is_known_to_the_job_or_to_beam():
    import re

    script = (Path(__file__).resolve().parents[1] / "deploy" / "dataflow" / "launch.sh").read_text()
    body = script[script.index("stream() {"):script.index("status() {")]
    options = set(re.findall(r"(--[a-z][a-z0-9_-]+)", body))
    ours = set(launch.long_options(_parser()))
    # The job's own check (RunRefused naming the first option nobody reads).
    launch.refuse_unknown_options(sorted(options - ours), ours, command="python -m renyi_stream.pipelines.streaming")
    assert {"--subscription", "--streaming", "--enable_streaming_engine", "--noise-key-secret"} <= options


# --- --previous-ledger: every shard's snapshot of the last released window, nothing else ----------


def _set(args: list[str], **options) -> list[str]:
    """``args`` with each ``--option`` (underscores as dashes) set to the value given."""
    args = list(args)
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag, str(value)]
    return args


def _earlier_args(tmp_path, messages, **options) -> list[str]:
    """The arguments of a job over the first two days (windows W0 and W0 + 1, 3 shards)."""
    return _set(_args(tmp_path, ["--replay", *messages[:4]]), end="2026-03-02", **options)


def _earlier_job(tmp_path, messages) -> Path:
    """A job over the first two days (snapshots of windows W0 and W0 + 1, 3 shards); its ledger root."""
    assert sj.main(_earlier_args(tmp_path, messages)) == 0
    return tmp_path / "curator" / "ledger"


def _follow_up(tmp_path, messages, previous, **options) -> list[str]:
    """The job that goes on with the third day from ``previous``, into an --output of its own."""
    return _set(_args(tmp_path, ["--replay", *messages[4:]]), start="2026-03-03", previous_ledger=previous,
                output=tmp_path / "curator-2", **options)


def _snapshot(ledger_root: Path) -> list[tuple]:
    tables = [pq.read_table(f) for f in sorted(ledger_root.glob("shard=*/*.parquet"))]
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables]).sort_by("user_id")
    return list(zip(table.column("user_id").to_pylist(), table.column("used").to_pylist()))


def _refused(tmp_path, args: list[str], capsys) -> str:
    """The refusal's message; asserts that the job built and wrote nothing."""
    assert sj.main(args) == 2
    assert not (tmp_path / "curator-2").exists() and not (tmp_path / "public" / f"window_id={W0 + 2}").exists()
    err = capsys.readouterr().err
    assert "refused" in err and "--previous-ledger" in err
    return err


@pytest.mark.parametrize("shards", [3, 2], ids=["same-shards", "re-sharded"])
def test_the_last_released_windows_snapshot_continues_the_ledger_of_one_uninterrupted_job(tmp_path, days, shards):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    assert sj.main(_follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet", shards=shards)) == 0
    assert sj.main(_set(_args(tmp_path, ["--replay", *messages]), releases_parquet=tmp_path / "whole-public",
                        output=tmp_path / "whole")) == 0
    window = f"window_id={W0 + 2}"
    continued = _snapshot(tmp_path / "curator-2" / "ledger" / window)
    whole = _snapshot(tmp_path / "whole" / "ledger" / window)
    assert [u for u, _ in continued] == [u for u, _ in whole] and len(whole) > 120
    assert [c for _, c in continued] == pytest.approx([c for _, c in whole], rel=1e-12)
    # The follow-up continues the earlier job's ledger, and so its ledger id; the whole job is
    # another ledger: the same sums, with its own noise.
    (earlier,) = _snapshot_ledger_ids(ledger)
    assert _snapshot_ledger_ids(tmp_path / "curator-2" / "ledger") == {earlier}
    (whole_id,) = _snapshot_ledger_ids(tmp_path / "whole" / "ledger")
    assert whole_id != earlier

    def sums(public: Path, ledger_id: str) -> list[float]:
        rows = pq.read_table(public / window / "releases.parquet").sort_by("query_id").to_pylist()
        return [v for _, _, _, v, _ in _without_noise(
            [(r["query_id"], W0 + 2, r["coordinate"], r["value"], r["noise_std"]) for r in rows], _key(tmp_path),
            ledger_id)]

    assert sums(tmp_path / "public", earlier) == pytest.approx(sums(tmp_path / "whole-public", whole_id), rel=1e-9)


def test_a_snapshot_of_an_earlier_window_than_the_last_released_one_is_refused_naming_both(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0}/*/*.parquet"), capsys)
    assert f"snapshot of window {W0} " in err and f"last window released under {tmp_path / 'public'} is {W0 + 1}" in err
    assert f"{ledger}/window_id={W0 + 1}/*/*.parquet" in err  # what to give instead


def test_a_glob_matching_only_some_shards_is_refused_naming_the_missing_shards(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/shard=0/*.parquet"), capsys)
    assert "matches 1 of the 3 shards" in err and "missing shard(s) [1, 2]" in err


def test_a_shard_whose_snapshot_is_gone_is_refused_though_the_glob_matches_every_file_left(tmp_path, days, capsys):
    import shutil

    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    shutil.rmtree(ledger / f"window_id={W0 + 1}" / "shard=2")  # the job stopped before writing it, or it was lost
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert "missing shard(s) [2]" in err and "as its snapshots record" in err and "no snapshot" in err


def test_a_glob_matching_the_snapshots_of_two_windows_is_refused(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id=*/*/*.parquet"), capsys)
    assert f"snapshots of 2 windows ([{W0}, {W0 + 1}])" in err


def test_a_file_that_is_not_a_snapshot_written_by_the_job_is_refused(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    # A valid ledger (the last window's shards merged by hand), but not where and how the job writes one.
    parts = [pq.read_table(f) for f in sorted((ledger / f"window_id={W0 + 1}").glob("shard=*/*.parquet"))]
    merged = tmp_path / "copied" / "ledger.parquet"
    merged.parent.mkdir()
    pq.write_table(pa.concat_tables(parts), merged)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, str(merged)), capsys)
    assert "not ledger snapshots of this job" in err and str(merged) in err


def test_a_snapshot_given_over_a_release_root_without_releases_is_refused(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    args = _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet",
                      releases_parquet=tmp_path / "other-public")
    err = _refused(tmp_path, args, capsys)
    assert f"snapshot of window {W0 + 1}" in err and "no window is released" in err
    assert not (tmp_path / "other-public").exists()


def test_two_snapshot_files_of_one_shard_are_refused(tmp_path, days, capsys):
    import shutil

    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    (first,) = (ledger / f"window_id={W0 + 1}" / "shard=1").glob("*.parquet")
    shutil.copy(first, first.with_name("replayed.parquet"))  # a second file in the folder: a diverged replay
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert f"matches 2 files of shard 1 of window {W0 + 1}" in err


def test_a_snapshot_without_a_recorded_shard_count_is_checked_against_the_shard_folders_there(tmp_path, days):
    import shutil

    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    shutil.rmtree(ledger / f"window_id={W0 + 1}" / "shard=1")
    root = str(ledger.resolve())
    with pytest.raises(sj.launch.RunRefused, match=r"matches 2 of the 3 shards .*shard folders under .*missing shard"
                                                 r"\(s\) \[1\]"):
        _check_every_shard("glob", root, W0 + 1, {0, 2}, recorded=None)
    with pytest.raises(sj.launch.RunRefused, match=r"matches 1 of the 3 shards .*missing shard\(s\) \[0, 1\]"):
        _check_every_shard("glob", root, W0 + 1, {2}, recorded=None)  # shard 0's folder is there, not matched
    # Without the recorded count, a lost highest shard cannot be told from a job with fewer shards.
    shutil.rmtree(ledger / f"window_id={W0 + 1}" / "shard=2")
    _check_every_shard("glob", root, W0 + 1, {0}, recorded=None)


# --- the parameters a ledger keeps for life: a follow-up job must have the earlier job's ----------


def _differ(err: str, parameter: str, before, now) -> bool:
    """Whether ``err`` is the refusal naming ``parameter`` with the ledger's value and this run's."""
    return re.search(rf"{parameter}: ledger has {re.escape(repr(before))}, this run asks {re.escape(repr(now))}",
                     err) is not None


@pytest.mark.parametrize("option, value, parameter, before, now", [
    ("epsilon", "2", "epsilon", EPSILON, 2.0),
    ("delta", "1e-5", "delta", DELTA, 1e-5),
    ("norm_budget", "3", "norm_budget", NORM_BUDGET, 3.0),
    ("accounting", "zcdp-cks", "accounting", "gdp", "zcdp-cks"),
    ("window", "12h", "window_seconds", 86_400, 43_200),
], ids=["epsilon", "delta", "norm-budget", "accounting", "window-length"])
def test_a_follow_up_with_another_promise_accounting_or_window_length_is_refused_naming_both_values(
        tmp_path, days, capsys, option, value, parameter, before, now):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    args = _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet", **{option: value})
    err = _refused(tmp_path, args, capsys)
    assert _differ(err, parameter, before, now), err
    assert "parameters differ from the ledger's" in err and "change every user's promise" in err


def _recorded_as_another_version(ledger: Path, window: int, rho_factor: float) -> dict[str, float]:
    """Rescale the budget recorded in ``window``'s snapshots (the job's parameters and the ledger's
    own) by ``rho_factor``, with the noise std and tracker step it gives: what a version whose
    root finder ends elsewhere writes."""
    from renyi_stream.stream.accounting.calibration import NOISE_HEADROOM

    rho = None
    for path in sorted(ledger.glob(f"window_id={window}/shard=*/*.parquet")):
        table = pq.read_table(path)
        meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
        rho = float(meta["renyi_stream.rho"]) * rho_factor
        values = {"rho": rho, "noise_std": math.sqrt(NORM_BUDGET / (2 * rho)) * (1 + NOISE_HEADROOM),
                  "tracker_step": rho / 32}
        meta.update({f"renyi_stream.{k}": repr(v) for k, v in values.items()})
        meta.update({"budget": repr(rho), "tracker_step": repr(rho / 32)})
        pq.write_table(table.replace_schema_metadata(meta), path)
        path.chmod(0o600)  # a curator file, as the job writes it
    return values


def test_a_follow_up_continues_a_budget_recorded_with_other_last_bits_with_its_own_noise(tmp_path, days):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    recorded = _recorded_as_another_version(ledger, W0 + 1, 1 - 3e-14)
    assert sj.main(_follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet")) == 0
    (snapshot, *_) = sorted((tmp_path / "curator-2" / "ledger").glob(f"window_id={W0 + 2}/shard=*/*.parquet"))
    kept = pq.read_schema(snapshot).metadata
    assert {k: float(kept[f"renyi_stream.{k}".encode()]) for k in recorded} == recorded
    day3 = pq.read_table(tmp_path / "public" / f"window_id={W0 + 2}")
    assert set(day3.column("noise_std").to_pylist()) == {recorded["noise_std"]}


def test_a_follow_up_of_a_ledger_whose_budget_is_above_the_promise_is_refused(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    _recorded_as_another_version(ledger, W0 + 1, 1 + 1e-9)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert "budget does not keep this run's promise: recorded_rho must be at most" in err


def test_a_follow_up_of_snapshots_whose_budget_is_not_a_number_is_refused(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    for path in ledger.glob(f"window_id={W0 + 1}/shard=*/*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"renyi_stream.rho": b"lots"}), path)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert "records no zCDP budget (rho='lots')" in err


def test_a_follow_up_with_another_noise_key_is_refused_naming_both_fingerprints(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    other = NoiseKey.load_or_create(tmp_path / "other-key" / "noise.key")
    args = _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet",
                      noise_key=tmp_path / "other-key" / "noise.key")
    err = _refused(tmp_path, args, capsys)
    assert _differ(err, "key_fingerprint", NoiseKey.load(_key(tmp_path)).fingerprint, other.fingerprint), err


def test_a_snapshot_of_a_job_releasing_under_another_root_is_refused_though_its_window_is_the_last(
        tmp_path, days, capsys):
    messages, _ = days
    _earlier_job(tmp_path, messages)  # released W0 and W0 + 1 under public/
    staging = _earlier_args(tmp_path, messages, releases_parquet=tmp_path / "staging-public",
                            output=tmp_path / "staging")
    assert sj.main(staging) == 0  # the same windows, released under another root
    args = _follow_up(tmp_path, messages, f"{tmp_path / 'staging' / 'ledger'}/window_id={W0 + 1}/*/*.parquet")
    err = _refused(tmp_path, args, capsys)
    assert _differ(err, "releases", str(tmp_path / "staging-public"), str(tmp_path / "public")), err
    assert "another root" in err


def _recorded_parameters(releases: str) -> tuple[LedgerConfig, dict]:
    """``(config, metadata)``: a run's configuration, and a snapshot's metadata recording it with
    the release root written as ``releases``."""
    config = LedgerConfig.from_promise(epsilon=EPSILON, delta=DELTA, norm_budget=NORM_BUDGET, accounting="gdp",
                                       id_type="int64", key_fingerprint="0123abcd", n_shards=1,
                                       releases="gs://acme-public/releases")
    recorded = {k.decode(): v.decode() for k, v in config.to_snapshot_metadata().items()}
    return config, {**recorded, snapshot_key("releases"): releases}


def test_release_roots_are_compared_normalised_so_a_trailing_slash_names_the_same_root():
    config, metadata = _recorded_parameters("gs://acme-public/releases/")
    _continued("glob", {0: "a.parquet"}, {0: metadata}, config)
    config, metadata = _recorded_parameters("gs://acme-staging/releases/")
    with pytest.raises(sj.launch.RunRefused, match=r"releases: ledger has 'gs://acme-staging/releases', "
                                                 r"this run asks 'gs://acme-public/releases'"):
        _continued("glob", {0: "a.parquet"}, {0: metadata}, config)


def _forget_parameters(folder: Path) -> None:
    """Rewrite every snapshot under ``folder`` as the job wrote it before it recorded its parameters."""
    keys = {snapshot_key(name).encode() for name in (*FIXED, *DERIVED)}
    for path in folder.glob("shard=*/*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata(
            {k: v for k, v in table.schema.metadata.items() if k not in keys}), path)


def test_snapshots_that_do_not_record_the_ledgers_parameters_are_refused_saying_how_to_go_on(
        tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    _forget_parameters(ledger / f"window_id={W0 + 1}")
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert "does not record the parameters its ledger keeps for life" in err and "cannot check" in err
    assert "record_snapshot_parameters" in err


def test_recording_the_earlier_jobs_parameters_in_a_copy_lets_the_next_job_continue(tmp_path, days):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    _forget_parameters(ledger / f"window_id={W0 + 1}")
    copy = tmp_path / "recorded-ledger"
    written = record_snapshot_parameters(f"{ledger}/window_id={W0 + 1}/*/*.parquet", str(copy),
                                         _earlier_args(tmp_path, messages))
    assert len(written) == 3 and _snapshot(copy / f"window_id={W0 + 1}") == _snapshot(ledger / f"window_id={W0 + 1}")
    assert sj.main(_follow_up(tmp_path, messages, f"{copy}/window_id={W0 + 1}/*/*.parquet")) == 0
    assert _snapshot(tmp_path / "curator-2" / "ledger" / f"window_id={W0 + 2}")


def test_recording_parameters_keeps_a_snapshot_budget_that_differs_from_the_arguments_in_its_last_bits(tmp_path, days):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    recorded = _recorded_as_another_version(ledger, W0 + 1, 1 - 3e-14)
    _forget_parameters(ledger / f"window_id={W0 + 1}")
    copy = tmp_path / "recorded-ledger"
    written = record_snapshot_parameters(f"{ledger}/window_id={W0 + 1}/*/*.parquet", str(copy),
                                         _earlier_args(tmp_path, messages))
    meta = pq.read_schema(written[0]).metadata
    assert {k: float(meta[f"renyi_stream.{k}".encode()]) for k in recorded} == recorded
    assert sj.main(_follow_up(tmp_path, messages, f"{copy}/window_id={W0 + 1}/*/*.parquet")) == 0


@pytest.mark.parametrize("case", ["arguments-the-snapshots-contradict", "into-the-snapshots-own-root"])
def test_recording_parameters_is_refused_for_contradicting_arguments_or_over_the_snapshots(tmp_path, days, case):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    _forget_parameters(ledger / f"window_id={W0 + 1}")
    before = sorted(tmp_path.rglob("*.parquet"))
    if case == "arguments-the-snapshots-contradict":
        copy, argv = tmp_path / "recorded-ledger", _earlier_args(tmp_path, messages, epsilon=2)
        match = r"records \{'budget': .*these arguments give .*not the arguments of the job that wrote it"
    else:
        copy, argv = ledger, _earlier_args(tmp_path, messages)
        match = r"is the snapshots' own: give a new ledger root"
    with pytest.raises(sj.launch.RunRefused, match=match):
        record_snapshot_parameters(f"{ledger}/window_id={W0 + 1}/*/*.parquet", str(copy), argv)
    assert sorted(tmp_path.rglob("*.parquet")) == before


# --- curator files are private whatever the umask (issue 18, item 5) ---------------------------------


def test_the_streaming_jobs_snapshots_counts_and_dead_letters_are_0600_in_0700_folders_under_umask_022(
        tmp_path, days, umask_022, not_private):
    messages, _ = days
    nan = tmp_path / "messages" / "nan.arrows"  # one dead letter, so that its file is written too
    nan.write_bytes(encode_message(_rows(0, [1], seed=0).set_column(2, "opened", pa.array([float("nan")]))))
    curator = tmp_path / "curator"
    curator.mkdir(mode=0o755)  # an --output folder left open by an older version
    curator.chmod(0o755)
    assert sj.main(_args(tmp_path, ["--replay", *messages, str(nan)])) == 0
    assert {p.relative_to(curator).parts[0] for p in curator.rglob("*.parquet")} == {
        "ledger", "dead", "read", "staged-releases"}
    assert not_private(curator) == {}


def test_a_previous_snapshot_readable_by_others_is_refused_naming_it(tmp_path, days, capsys):
    import os

    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    (loose,) = (ledger / f"window_id={W0 + 1}" / "shard=1").glob("*.parquet")
    os.chmod(loose, 0o644)
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert str(loose) in err and "mode 0644" in err and f"chmod 600 {loose}" in err, err

# --- the ledger id (issue 18: noise bound to one ledger) ------------------------------------------


def _rewrite_ledger_id(folder: Path, ledger_id: str | None, shards=None) -> None:
    """Rewrite the snapshots under ``folder`` (of the shards ``shards``, default all) to record
    ``ledger_id``, or none (as the job wrote them before it recorded ledger ids)."""
    key = SNAPSHOT_LEDGER_ID.encode()
    for path in sorted(folder.glob("shard=*/*.parquet")):
        if shards is not None and int(path.parent.name.split("=")[1]) not in shards:
            continue
        table = pq.read_table(path)
        meta = {k: v for k, v in table.schema.metadata.items() if k != key}
        if ledger_id is not None:
            meta[key] = ledger_id.encode()
        pq.write_table(table.replace_schema_metadata(meta), path)


def test_every_snapshot_of_a_job_records_its_ledger_id_and_a_follow_up_keeps_it(tmp_path, days):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    (earlier,) = _snapshot_ledger_ids(ledger)
    assert len(earlier) == 32 and int(earlier, 16) >= 0
    assert sj.main(_follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet")) == 0
    assert _snapshot_ledger_ids(tmp_path / "curator-2" / "ledger") == {earlier}


def test_a_follow_up_of_snapshots_recording_two_ledger_ids_is_refused(tmp_path, days, capsys):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    _rewrite_ledger_id(ledger / f"window_id={W0 + 1}", "fedcba9876543210fedcba9876543210", shards={0})
    err = _refused(tmp_path, _follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet"), capsys)
    assert "different ledger ids" in err and "fedcba9876543210fedcba9876543210" in err


def test_a_follow_up_of_snapshots_from_before_ledger_ids_draws_a_new_one(tmp_path, days):
    messages, _ = days
    ledger = _earlier_job(tmp_path, messages)
    (earlier,) = _snapshot_ledger_ids(ledger)
    _rewrite_ledger_id(ledger / f"window_id={W0 + 1}", None)
    assert sj.main(_follow_up(tmp_path, messages, f"{ledger}/window_id={W0 + 1}/*/*.parquet")) == 0
    (now,) = _snapshot_ledger_ids(tmp_path / "curator-2" / "ledger")
    assert now not in ("", earlier) and len(now) == 32


# --- a message's decoded size is capped (issue 28, the attacker's finding F: a compression bomb) ---------


def _bomb(users: int = 100_000) -> bytes:
    """A zstd-compressed message of ``users`` rows of one day with ids from 10,000 on, every value
    zero: about 28 bytes a row decoded (2.8 MB for the default), a few hundred KB sent."""
    import io

    import pyarrow.ipc as ipc

    table = pa.table({"user_id": pa.array(np.arange(10_000, 10_000 + users), pa.int64()),
                      "day": pa.array([DAY0] * users, pa.date32()),
                      "opened": pa.array(np.zeros(users)), "bought": pa.array(np.zeros(users))})
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_a_message_that_decodes_past_the_cap_is_refused_naming_the_cap(monkeypatch):
    bomb = _bomb()
    assert len(bomb) < 2**20
    monkeypatch.setattr(codec, "MAX_MESSAGE_DECODED_BYTES", 2**20)
    with pytest.raises(ValueError, match=r"more than 1,048,576 bytes.*MAX_MESSAGE_DECODED_BYTES"):
        decode_message(bomb)


def test_a_message_under_the_cap_decodes():
    assert codec.MAX_MESSAGE_DECODED_BYTES >= 2**28
    assert decode_message(_bomb()).num_rows == 100_000


def _declaring(message: bytes, size: int) -> bytes:
    """``message`` (one compressed record batch) with its first non-empty buffer declaring
    ``size`` bytes once decompressed (the 8-byte length before each compressed buffer)."""
    import pyarrow.ipc as ipc

    reader = pa.BufferReader(message)
    ipc.read_message(reader)  # the schema
    start = reader.tell()
    batch = ipc.read_message(reader)
    body = start + (reader.tell() - start) - batch.body.size
    view = memoryview(batch.body)
    first = next(o for o in range(0, batch.body.size, 8) if int.from_bytes(view[o:o + 8], "little", signed=True) > 0)
    return message[:body + first] + size.to_bytes(8, "little", signed=True) + message[body + first + 8:]


def test_a_message_that_declares_more_than_the_cap_is_refused_before_it_is_decompressed(monkeypatch):
    # Refused on what its buffers declare: decompressing it first would allocate what it declares.
    monkeypatch.setattr(codec, "MAX_MESSAGE_DECODED_BYTES", 2**20)
    liar = _declaring(_bomb(1_000), 64 * 2**20)
    with pytest.raises(ValueError, match="MAX_MESSAGE_DECODED_BYTES"):
        decode_message(liar)


def test_a_live_message_past_the_cap_is_one_undecodable_message_and_none_of_its_rows_is_admitted(monkeypatch):
    """A stream's message (a Kafka record, a Pub/Sub message) past the cap: one row read, one
    ``undecodable_message`` dead letter naming the cap, no row valid."""
    monkeypatch.setattr(codec, "MAX_MESSAGE_DECODED_BYTES", 2**20)
    decode = sj.DecodeAndValidate(window=WindowSpec.from_length("1d"), indicator_columns=["opened", "bought"],
                                  id_type="int64")
    out = list(decode.process(("indicators/0/7", _bomb())))
    tagged = {o.tag: o.value for o in out if isinstance(o, beam.pvalue.TaggedOutput)}
    assert len(out) == len(tagged) == 2  # nothing valid
    assert tagged["read"].to_pylist() == [{"source": "indicators/0/7", "rows_read": 1}]
    assert tagged["dead"].column("reason").to_pylist() == [DeadLetterReason.UNDECODABLE_MESSAGE]
    assert "MAX_MESSAGE_DECODED_BYTES" in tagged["dead"].column("detail")[0].as_py()


def test_a_replayed_message_past_the_cap_is_refused_naming_it_and_the_cap_before_anything_is_written(
        tmp_path, days, monkeypatch, capsys):
    messages, _ = days
    bomb = tmp_path / "messages" / "bomb.arrows"
    bomb.write_bytes(_bomb())
    monkeypatch.setattr(codec, "MAX_MESSAGE_DECODED_BYTES", 2**20)
    assert sj.main(_args(tmp_path, ["--replay", *messages, str(bomb)])) == 2
    err = capsys.readouterr().err
    assert f"--replay: {bomb}" in err and "MAX_MESSAGE_DECODED_BYTES" in err
    assert not (tmp_path / "curator").exists() and not (tmp_path / "public").exists()


def test_a_message_cut_between_two_record_batches_is_undecodable_not_its_first_batch():
    # Arrow's stream reader takes the end of the bytes for the end of the stream: a message cut
    # exactly after its first batch read as that batch alone, the other rows lost uncounted.
    import io

    import pyarrow.ipc as ipc

    table = _rows(0, [1, 2, 3], seed=0)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.slice(0, 1))
        cut = sink.tell()
        writer.write_table(table.slice(1))
    whole = sink.getvalue()
    assert decode_message(whole).num_rows == 3
    for short in (whole[:cut], whole[:-8]):
        with pytest.raises(ValueError, match="end-of-stream"):
            decode_message(short)
    with pytest.raises(ValueError, match="Arrow IPC stream"):
        decode_message(whole[:-4])  # half a marker: Arrow's own error
    # a batch whose own last bytes spell the marker (an odd count of int32 ending in -1, padded with
    # zeros) is still told apart from a cut by the stream's framing
    spelled = pa.table({"user_id": pa.array([1, 2, 3], pa.int64()), "day": ["2026-03-01"] * 3,
                        "opened": pa.array([1, 1, -1], pa.int32())})
    sink = io.BytesIO()
    with ipc.new_stream(sink, spelled.schema) as writer:
        writer.write_table(spelled)
        cut = sink.tell()
        writer.write_table(spelled)
    assert sink.getvalue()[cut - 8:cut] == b"\xff\xff\xff\xff\x00\x00\x00\x00"
    assert decode_message(sink.getvalue()).num_rows == 6
    with pytest.raises(ValueError, match="end-of-stream"):
        decode_message(sink.getvalue()[:cut])


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_dry_run_says_what_the_job_would_do_and_writes_nothing_real(tmp_path, days, capsys):
    messages, _ = days
    capsys.readouterr()
    assert sj.main(_args(tmp_path, ["--replay", *messages], "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 3 window(s) for 2 queries: sum:bought, sum:opened" in out
    assert "would read 360 rows = admitted " in out and "[balanced]" in out
    assert "nothing was charged or published" in out
    assert not (tmp_path / "public").exists() and not (tmp_path / "curator").exists()
    assert sj.main(_args(tmp_path, ["--replay", *messages])) == 0  # as if the preview had never been
    assert sorted(p.name for p in (tmp_path / "public").glob("window_id=*")) == [
        f"window_id={W0 + k}" for k in range(3)]


def test_a_dry_run_with_quiet_prints_no_exact_count(tmp_path, days, capsys):
    messages, _ = days
    capsys.readouterr()
    assert sj.main(_args(tmp_path, ["--replay", *messages], "--dry-run", "--quiet")) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 3 window(s)" in out and "rows" not in out


def test_a_dry_run_of_a_job_continuing_a_ledger_previews_it_and_leaves_root_and_ledger_as_they_were(
        tmp_path, days, capsys):
    """The snapshots record the root the ledger answers into; the preview answers into a copy and
    must pass the check the real job passes."""
    messages, _ = days
    first = _args(tmp_path, ["--replay", *messages[:2]], "--end", "2026-03-01")
    assert sj.main(first) == 0
    before = {name: _tree(tmp_path / name) for name in ("public", "curator")}
    snapshots = str(tmp_path / "curator" / "ledger" / f"window_id={W0}" / "*" / "*.parquet")
    second = [*_args(tmp_path, ["--replay", *messages[2:]], "--start", "2026-03-02", "--previous-ledger", snapshots),
              "--output", str(tmp_path / "curator2")]
    capsys.readouterr()
    assert sj.main([*second, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: would release 2 window(s) for 2 queries" in out and "would read 240 rows" in out
    assert {name: _tree(tmp_path / name) for name in ("public", "curator")} == before
    assert not (tmp_path / "curator2").exists()
    assert sj.main(second) == 0


def test_a_dry_run_is_refused_for_a_stream_without_end_and_its_refusals_name_the_real_folders(tmp_path, days, capsys):
    messages, _ = days
    assert sj.main(_args(tmp_path, ["--subscription", "projects/p/subscriptions/s"], "--dry-run")) == 2
    assert "a dry run replays files (--replay)" in capsys.readouterr().err
    (tmp_path / "public").mkdir()  # a root that a curator made readable by others: the job refuses it
    (tmp_path / "public").chmod(0o755)
    (tmp_path / "curator").mkdir(mode=0o755)
    (tmp_path / "curator" / STATE_FILE).write_text("{}")
    assert sj.main(_args(tmp_path, ["--replay", *messages], "--dry-run")) == 2
    err = capsys.readouterr().err
    assert "refused" in err and str(tmp_path / "curator") in err and "renyi-preview-" not in err
