"""One publication rule and one row balance for the three jobs (issue 19, item 1; docs/architecture.md,
"The outbox rule"; invariant 5 (release-once) and invariant 7 (rows-counted-not-lost)).

The rule (:func:`renyi_stream.stream.engine.publication.publish_outbox`) is specified with in-memory sides
first: committed windows only, in window order, first write wins, and a crash between windows
then a resume publishes the rest once. The crash is the rule's own test-only crash point
(:func:`renyi_stream.stream.faults.crash_point`), made to raise here instead of killing the process; the jobs
are killed for real at the same points in ``tests/test_crash_points.py`` (daily) and
``tests/conformance`` (daily and distributed). Then each job's own sides where no other test
covers them: the daily job's whole-batch conflict check, and the streaming job's outbox (a window
goes public only once every shard's ledger snapshot of it is written; a window a lost job left
staged is published by the next job). Last, the one row balance every job records.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import renyi_stream.stream.engine.publication as publication
from renyi_stream.stream.engine.publication import Outbox, Publication, PublicReleases, publish_outbox
from renyi_stream.stream.engine.row_balance import RowBalance, reason_counts
from renyi_stream.stream.noise import NoiseKey

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
#: The input contract a new ledger's first run declares (issue 28): integer ids, a 0/1 indicator.
DECLARE = ["--id-type", "int64", "--column", "opened=0:1"]


# --- the rule, with in-memory sides -------------------------------------------------------------------


def _rows(window: int, values=(1.0, 2.0)) -> pa.Table:
    n = len(values)
    return pa.table({"query_id": ["sum:opened"] * n, "window_id": pa.array([window] * n, pa.int64()),
                     "coordinate": pa.array(range(n), pa.int32()), "value": list(values)})


class MemoryOutbox:
    """Releases staged per window; ``committed`` says which windows' charges are durable."""

    def __init__(self, staged: dict[int, pa.Table], committed) -> None:
        self.staged = staged
        self.committed = set(committed)
        self.marked: list[int] = []

    def committed_windows(self) -> list[int]:
        return sorted(self.committed - set(self.marked), reverse=True)  # any order: the rule sorts

    def rows(self, window: int) -> pa.Table:
        return self.staged[window]

    def mark_published(self, window: int) -> None:
        self.marked.append(window)


class Conflict(Exception):
    pass


class MemoryPublic:
    """First write wins; ``check`` refuses a window public with other rows."""

    def __init__(self, public: dict[int, pa.Table] | None = None) -> None:
        self.files = dict(public or {})
        self.writes: list[int] = []

    def check(self, rows) -> None:
        for window, table in rows.items():
            if window in self.files and not self.files[window].equals(table):
                raise Conflict(f"window {window}")

    def publish(self, window: int, rows: pa.Table) -> int:
        if window in self.files:
            return 0
        self.files[window] = rows
        self.writes.append(window)
        return rows.num_rows


class Killed(Exception):
    """Stands for the SIGKILL of renyi_stream.stream.faults.crash_point: nothing after it runs."""


@pytest.fixture
def kill_at(monkeypatch):
    """``kill_at(point)``: the rule's next pass through crash point ``point`` raises :class:`Killed`."""
    def arm(point: str) -> None:
        def crash_point(name: str) -> None:
            if name == point:
                monkeypatch.setattr(publication, "crash_point", lambda name: None)  # one crash, then a resume
                raise Killed(name)
        monkeypatch.setattr(publication, "crash_point", crash_point)
    return arm


def test_committed_windows_are_published_in_window_order_each_with_its_own_rows_then_marked():
    staged = {w: _rows(w, (float(w), 1.0)) for w in (W0 + 2, W0, W0 + 1)}
    outbox, public = MemoryOutbox(staged, staged), MemoryPublic()
    done = publish_outbox(outbox, public)
    assert public.writes == [W0, W0 + 1, W0 + 2]
    assert all(public.files[w].equals(staged[w]) for w in staged)
    assert sorted(outbox.marked) == [W0, W0 + 1, W0 + 2]
    assert done == Publication(windows=(W0, W0 + 1, W0 + 2), rows=6)
    assert publish_outbox(outbox, public) == Publication()  # nothing left: nothing published again


def test_a_window_already_public_keeps_its_first_answer_and_is_not_counted_as_published():
    first = _rows(W0, (1.0, 2.0))
    outbox, public = MemoryOutbox({W0: first, W0 + 1: _rows(W0 + 1)}, {W0, W0 + 1}), MemoryPublic({W0: first})
    assert publish_outbox(outbox, public) == Publication(windows=(W0 + 1,), rows=2)
    assert public.files[W0] is first and sorted(outbox.marked) == [W0, W0 + 1]


def test_a_window_whose_charge_is_not_committed_is_never_published():
    staged = {w: _rows(w) for w in (W0, W0 + 1, W0 + 2)}
    outbox, public = MemoryOutbox(staged, {W0, W0 + 1}), MemoryPublic()
    publish_outbox(outbox, public)
    assert sorted(public.files) == [W0, W0 + 1] and W0 + 2 not in outbox.marked


def test_a_crash_between_windows_leaves_the_rest_committed_and_a_resume_publishes_them_once(kill_at):
    staged = {w: _rows(w) for w in (W0, W0 + 1, W0 + 2)}
    outbox, public = MemoryOutbox(staged, staged), MemoryPublic()
    kill_at("during_publish")
    with pytest.raises(Killed):
        publish_outbox(outbox, public)
    assert public.writes == [W0] and outbox.marked == []  # earlier windows public, none marked
    assert publish_outbox(outbox, public) == Publication(windows=(W0 + 1, W0 + 2), rows=4)
    assert public.writes == [W0, W0 + 1, W0 + 2]  # each window written once
    assert outbox.committed_windows() == []


def test_a_crash_once_every_window_is_public_publishes_nothing_twice_on_resume(kill_at):
    staged = {w: _rows(w) for w in (W0, W0 + 1)}
    outbox, public = MemoryOutbox(staged, staged), MemoryPublic()
    kill_at("after_publish")
    with pytest.raises(Killed):
        publish_outbox(outbox, public)
    assert public.writes == [W0, W0 + 1] and outbox.marked == []  # public, not marked
    assert publish_outbox(outbox, public) == Publication()
    assert public.writes == [W0, W0 + 1] and sorted(outbox.marked) == [W0, W0 + 1]


def test_a_conflict_the_public_side_finds_in_any_window_publishes_and_marks_nothing():
    outbox = MemoryOutbox({W0: _rows(W0), W0 + 1: _rows(W0 + 1, (5.0, 6.0))}, {W0, W0 + 1})
    public = MemoryPublic({W0 + 1: _rows(W0 + 1, (7.0, 8.0))})
    with pytest.raises(Conflict):
        publish_outbox(outbox, public)
    assert public.writes == [] and outbox.marked == []


def test_rows_of_another_window_in_a_windows_outbox_are_refused_before_anything_is_published():
    outbox = MemoryOutbox({W0: _rows(W0), W0 + 1: pa.concat_tables([_rows(W0 + 1), _rows(W0 + 5)])}, {W0, W0 + 1})
    public = MemoryPublic()
    with pytest.raises(ValueError, match=f"window {W0 + 1} include rows of window\\(s\\) \\[{W0 + 5}\\]"):
        publish_outbox(outbox, public)
    assert public.writes == []


def test_every_jobs_outbox_and_public_side_have_the_protocols_methods(tmp_path):
    from renyi_stream.pipelines.beam.publication import PublicReleaseFiles, StagedReleases
    from renyi_stream.pipelines.daily.job import CuratorOutbox, StoreAndFiles

    assert isinstance(CuratorOutbox(None), Outbox) and isinstance(StagedReleases(str(tmp_path)), Outbox)
    assert isinstance(StoreAndFiles(None, "id"), PublicReleases)
    assert isinstance(PublicReleaseFiles(str(tmp_path)), PublicReleases)
    assert isinstance(MemoryOutbox({}, ()), Outbox) and isinstance(MemoryPublic(), PublicReleases)


def test_staged_releases_list_the_committed_windows_given_that_are_staged_and_no_others(tmp_path):
    """Given the committed windows, the outbox lists those staged (looking for their files only);
    given none, every staged window."""
    from renyi_stream.pipelines.beam.object_store import write_parquet
    from renyi_stream.pipelines.beam.publication import StagedReleases
    from renyi_stream.queries.release_files import release_file_path, release_file_table

    for w in (W0, W0 + 2):
        write_parquet(release_file_path(str(tmp_path), w), release_file_table(_release_rows([w], 1.0, "ab" * 8)))
    assert StagedReleases(str(tmp_path), [W0 + 1, W0]).committed_windows() == [W0]
    assert StagedReleases(str(tmp_path), []).committed_windows() == []
    assert StagedReleases(str(tmp_path)).committed_windows() == [W0, W0 + 2]


# --- the daily job's sides: the curator's outbox table and the DuckDB release store ---------------


def _release_rows(windows, value: float, key: str) -> pa.Table:
    from renyi_stream.queries.release_store import RELEASE_SCHEMA

    rows = []
    for w in windows:
        start = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=w)
        rows.append({"query_id": "sum:opened", "window_id": w, "window_start": start,
                     "window_end": start + dt.timedelta(days=1), "label": "opened", "coordinate": 0, "value": value,
                     "noise_std": 2.0, "kind": "window", "accounting": "gdp", "mechanism": "gaussian",
                     "key_fingerprint": key})
    return pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA)


def test_the_daily_jobs_publication_refuses_a_conflict_in_a_later_window_before_publishing_an_earlier_one(tmp_path):
    """The store checks every committed window before the first is inserted: a store holding
    another answer for the second window gets neither (first write wins, all or nothing)."""
    from renyi_stream.pipelines.curator.store import CuratorStore
    from renyi_stream.pipelines.daily.job import _publish_pending
    from renyi_stream.queries.release_store import ReleaseConflictError, ReleaseStore
    from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA
    from renyi_stream.stream.engine.shard_state import WINDOW_COUNT_NAMES
    from renyi_stream.stream.ledger import Ledger

    key = "ab" * 8
    with CuratorStore(tmp_path / "ledger.duckdb") as curator, ReleaseStore(tmp_path / "releases.duckdb") as store:
        counts = pa.table({"window_id": pa.array([], pa.int64()),
                           **{name: pa.array([], pa.int64()) for name in WINDOW_COUNT_NAMES}})
        curator.commit_run(run_id=1, ledger=Ledger(budget=1.0).to_arrow(),
                           releases=_release_rows([W0, W0 + 1], 1.0, key), window_counts=counts,
                           run_counts=RowBalance(0, 0, 0, 0, 0, 0).totals(),
                           dead_letters=DEAD_LETTER_SCHEMA.empty_table(), previous_users=0)
        store.publish(_release_rows([W0 + 1], 9.0, key), ledger_id=curator.ledger_id)
        with pytest.raises(ReleaseConflictError, match="first write wins"):
            _publish_pending(curator, store)
        assert store.released_windows("sum:opened") == [W0 + 1]  # window W0 was not inserted either
        assert curator.pending_windows() == [W0, W0 + 1]


# --- the streaming job's outbox: staged files, committed by every shard's snapshot ----------------


def _stream(tmp_path: Path, days: int = 2) -> list[str]:
    """One message per day of 40 users (the streaming job's --replay files)."""
    from renyi_stream.pipelines.streaming.codec import encode_message

    folder = tmp_path / "messages"
    folder.mkdir(exist_ok=True)
    paths = []
    rng = np.random.default_rng(3)
    for d in range(days):
        table = pa.table({"user_id": pa.array(range(40), pa.int64()),
                          "day": pa.array([DAY0 + dt.timedelta(days=d)] * 40, pa.date32()),
                          "opened": pa.array((rng.random(40) < 0.5).astype(np.float64))})
        paths.append(str(folder / f"day-{d}.arrows"))
        Path(paths[-1]).write_bytes(encode_message(table))
    return paths


def _stream_args(tmp_path: Path, messages: list[str], *, start: int, end: int, output: str,
                 previous: str = "none") -> list[str]:
    """A new ledger's job (``previous`` "none") declares :data:`DECLARE`; a continuation keeps it."""
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    day = lambda w: (DAY0 + dt.timedelta(days=w - W0)).isoformat()  # noqa: E731
    declare = DECLARE if previous == "none" else []
    return ["--replay", *messages, *declare, "--start", day(start), "--end", day(end),
            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "2", "--releases-parquet", str(tmp_path / "public"),
            "--output", str(tmp_path / output), "--noise-key", str(key), "--shards", "2", "--previous-ledger", previous]


def _ancestors(pcollection) -> set[str]:
    """The full labels of every transform ``pcollection`` depends on."""
    seen, todo = set(), [pcollection.producer]
    while todo:
        applied = todo.pop()
        if applied is None or applied.full_label in seen:
            continue
        seen.add(applied.full_label)
        todo += [p.producer for p in applied.main_inputs.values()] + [s.pvalue.producer for s in applied.side_inputs]
    return seen


def test_the_streaming_jobs_public_files_are_written_downstream_of_its_ledger_snapshot_writes(tmp_path):
    """A Beam runner orders two steps only by data: the step writing public files must consume
    the snapshot writes (invariant 5 (release-once), docs/architecture.md: the charge is durable
    before the answer is public); a branch beside them could publish first and be lost with it."""
    from renyi_stream.pipelines.streaming.beam import job as sj

    messages = _stream(tmp_path, days=1)
    args, _ = sj.parse_args(_stream_args(tmp_path, messages, start=W0, end=W0, output="curator"))
    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    graph = sj.build(p, args)
    assert any(label.startswith("WriteLedger") for label in _ancestors(graph["release_files"]))
    assert not any(label.startswith("WriteLedger") for label in _ancestors(graph["staged"]))  # staging needn't wait


def test_a_streaming_window_goes_public_only_once_committed_after_every_earlier_window(tmp_path):
    """A window is committed (its marker written, then published) once it is staged and every
    shard's snapshot and records of it are written, and only after the window before it: window
    W0 + 1 is complete first but waits for W0; W0 + 2 never gets shard 1's snapshot."""
    from apache_beam.testing.util import assert_that, equal_to

    from renyi_stream.pipelines.beam.object_store import write_parquet
    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.books import books_records
    from renyi_stream.pipelines.streaming.commits import RECORDS_WRITTEN, SNAPSHOT_WRITTEN, STAGED
    from renyi_stream.pipelines.streaming.state_folder import STAGED_RELEASES, committed_windows
    from renyi_stream.queries.release_files import release_file_path, release_file_table

    curator, public = str(tmp_path / "curator"), str(tmp_path / "public")
    for w in (W0, W0 + 1, W0 + 2):
        write_parquet(release_file_path(str(tmp_path / "curator" / STAGED_RELEASES), w),
                      release_file_table(_release_rows([w], 1.0, "ab" * 8)))
    every = lambda w: ([(w, (STAGED, -1))] + [(w, (SNAPSHOT_WRITTEN, s)) for s in (0, 1)]  # noqa: E731
                       + [(w, (RECORDS_WRITTEN, s, _books_record(w, s))) for s in (0, 1)])
    events = (every(W0 + 1) + [(W0 + 1, (SNAPSHOT_WRITTEN, 0))]  # complete, and a repeated event
              + [e for e in every(W0 + 2) if e[1] != (SNAPSHOT_WRITTEN, 1)] + every(W0))
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        written = (p | beam.Create([(0, e) for e in events])
                   | beam.ParDo(sj.CommitWindows(curator, public, n_shards=2, first_window=W0, end_window=W0 + 2)))
        assert_that(written, equal_to([release_file_path(public, W0), release_file_path(public, W0 + 1)]))
    assert sorted(f.name for f in Path(public).iterdir()) == [f"window_id={W0}", f"window_id={W0 + 1}"]
    assert committed_windows(curator) == [W0, W0 + 1]
    # Each marker holds its window's books records, one per shard, as the shards reported them.
    assert books_records(curator).to_pylist() == [json.loads(_books_record(w, s)) for w in (W0, W0 + 1)
                                                  for s in (0, 1)]


def _books_record(window: int, shard: int, received: int = 0) -> str:
    """A shard's books record of a window, as :class:`WriteWindowRecords` reports it (JSON)."""
    from renyi_stream.pipelines.streaming.books import BOOKS_COLUMNS, books_record

    record = {name: 0 for name in BOOKS_COLUMNS if name != "window_id"}
    return json.dumps(books_record(window, {**record, "shard": shard, "received": received, "balanced": 1}),
                      sort_keys=True)


def test_two_different_books_records_of_one_shard_and_window_commit_nothing():
    """A retried bundle repeats a shard's record unchanged; a second, different record is an engine
    bug, and the window's marker is not written with either."""
    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.commits import RECORDS_WRITTEN

    heard = {(RECORDS_WRITTEN, 0, _books_record(W0, 0)), (RECORDS_WRITTEN, 0, _books_record(W0, 0, received=3))}
    with pytest.raises(RuntimeError, match=r"shard\(s\) \[0\] reported two different books records"):
        sj.CommitWindows._books(W0, heard)
    assert sj.CommitWindows._books(W0, {(RECORDS_WRITTEN, 0, _books_record(W0, 0))})[0]["shard"] == 0


def test_a_window_a_lost_streaming_job_left_staged_is_published_by_the_next_job_before_it_goes_on(tmp_path, capsys):
    """The state a job lost after every shard's snapshot of its last window, before that window's
    public file, leaves: the file staged in its --output and not public. The next job, given that
    window's snapshots, publishes it (the answer the lost job computed) and continues from them."""
    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.state_folder import STAGED_RELEASES

    messages = _stream(tmp_path, days=3)
    assert sj.main(_stream_args(tmp_path, messages[:2], start=W0, end=W0 + 1, output="job1")) == 0
    lost = tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet"
    answer = pq.read_table(lost)
    lost.unlink()  # the job was lost before publishing it
    assert (tmp_path / "job1" / STAGED_RELEASES / f"window_id={W0 + 1}" / "releases.parquet").exists()
    snapshots = f"{tmp_path / 'job1' / 'ledger'}/window_id={W0 + 1}/*/*.parquet"
    assert sj.main(_stream_args(tmp_path, messages[2:], start=W0 + 2, end=W0 + 2, output="job2",
                                previous=snapshots)) == 0
    assert f"published 1 window(s) an earlier job committed but had not published: [{W0 + 1}]" in \
        capsys.readouterr().err
    assert pq.read_table(lost).equals(answer)
    assert (tmp_path / "public" / f"window_id={W0 + 2}" / "releases.parquet").exists()


def test_a_staged_window_whose_snapshots_miss_a_shard_is_not_published(tmp_path, capsys):
    from renyi_stream.pipelines.streaming.beam import job as sj

    messages = _stream(tmp_path, days=3)
    assert sj.main(_stream_args(tmp_path, messages[:2], start=W0, end=W0 + 1, output="job1")) == 0
    (tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet").unlink()
    (snapshot,) = (tmp_path / "job1" / "ledger" / f"window_id={W0 + 1}" / "shard=1").glob("*.parquet")
    snapshot.unlink()  # the job was lost before this shard's snapshot was written: not committed
    snapshots = f"{tmp_path / 'job1' / 'ledger'}/window_id={W0 + 1}/*/*.parquet"
    assert sj.main(_stream_args(tmp_path, messages[2:], start=W0 + 2, end=W0 + 2, output="job2",
                                previous=snapshots)) == 2
    assert "missing shard(s) [1]" in capsys.readouterr().err
    assert sorted(f.parent.name for f in (tmp_path / "public").glob("window_id=*/*.parquet")) == [f"window_id={W0}"]


# --- one row balance ----------------------------------------------------------------------------------


def test_a_balance_holds_when_every_row_read_reached_one_outcome_late_rows_counted_apart():
    balance = RowBalance.of(rows_read=12, statuses={"admitted": 4, "clipped": 1, "dropped": 2},
                            reasons={"late_window": 2, "null_user_id": 2, "duplicate_user_window": 1})
    assert (balance.rejected, balance.late) == (3, 2) and balance.balanced
    assert balance.totals() == {"rows_read": 12, "admitted": 4, "clipped": 1, "dropped": 2, "rejected": 3, "late": 2}


def test_a_row_read_that_reached_no_outcome_or_two_unbalances_the_books():
    assert not RowBalance.of(rows_read=5, statuses={"admitted": 4}, reasons={}).balanced
    assert not RowBalance.of(rows_read=5, statuses={"admitted": 4}, reasons={"bad_time": 2}).balanced


@pytest.mark.parametrize("statuses, reasons, named", [({"admited": 1}, {}, "statuses"), ({}, {"lost": 1}, "reasons"),
                                                       ({"admitted": -1}, {}, "admitted"),
                                                       ({}, {"bad_time": 1.5}, "bad_time")])
def test_a_status_or_reason_outside_its_vocabulary_or_a_count_that_is_not_one_is_refused_naming_it(
        statuses, reasons, named):
    with pytest.raises(ValueError, match=named):
        RowBalance.of(rows_read=1, statuses=statuses, reasons=reasons)


def test_reasons_are_counted_over_every_dead_letter_table():
    tables = [pa.table({"reason": ["late_window", "bad_time", "late_window"]}),
              pa.table({"reason": pa.array([], pa.string())}), pa.table({"reason": ["bad_time"]})]
    assert reason_counts(tables) == {"bad_time": 2, "late_window": 2}


def test_the_three_jobs_record_the_same_row_balance_fields(tmp_path):
    """The daily summary and curator ``run_counts``, the distributed manifest's ``totals`` and the
    streaming ``_BOOKS.json``: the same names, from :meth:`RowBalance.totals`, with ``balanced``."""
    from renyi_stream.pipelines.daily.job import JobSummary
    from renyi_stream.pipelines.distributed import job as dist
    from renyi_stream.pipelines.streaming.beam import job as sj
    from renyi_stream.pipelines.streaming.books import BOOKS_FILE
    from renyi_stream.pipelines.streaming.codec import encode_message

    fields = set(RowBalance(0, 0, 0, 0, 0, 0).totals())
    assert fields <= set(JobSummary.__dataclass_fields__) and JobSummary.balanced is RowBalance.balanced
    day = tmp_path / "day.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2, None], pa.int64()), "day": [DAY0] * 3,
                             "opened": [1.0, 0.0, 1.0]}), day)
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    common = ["--start", DAY0.isoformat(), "--end", DAY0.isoformat(), "--epsilon", "1", "--delta", "1e-6",
              "--norm-budget", "2", "--noise-key", str(key), "--shards", "2", "--quiet"]
    assert dist.main(["--input", str(day), *common, *DECLARE, "--previous-ledger", "none", "--output",
                      str(tmp_path / "dist"), "--releases-parquet", str(tmp_path / "dist-public")]) == 0
    manifest = json.loads((tmp_path / "dist" / dist.COMMITTED).read_text())
    assert set(manifest["totals"]) == fields and manifest["balanced"]
    assert manifest["totals"] == {"rows_read": 3, "admitted": 2, "clipped": 0, "dropped": 0, "rejected": 1, "late": 0}

    message = tmp_path / "day.arrows"
    message.write_bytes(encode_message(pq.read_table(day)))
    assert sj.main(["--replay", str(message), *DECLARE, *common[:-1], "--output", str(tmp_path / "stream"),
                    "--releases-parquet", str(tmp_path / "stream-public")]) == 0
    books = json.loads((tmp_path / "stream" / BOOKS_FILE).read_text())
    assert books == {**manifest["totals"], "balanced": True}
