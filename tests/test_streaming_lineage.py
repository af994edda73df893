"""The streaming job's public lineage (issue 19): of two jobs continuing one ledger, one publishes.

Each streaming job is a run (a random run id in its ``--output``'s ``_STATE.json``, kept by its
own restarts) and records in every ledger snapshot its run id and its parent's. Before publishing
its first window it claims ``_lineage/after/<parent>`` under the release root, and each window's
lineage record names it (``queries/release_lineage.py``, as the distributed job does): two jobs
continued from one snapshot fork the ledger (each misses the other's charges), so only the first
to claim publishes, the other refuses with nothing of it public, and a launch continuing a
snapshot that is not the public chain's is refused naming the runs (docs/architecture.md, "The
outbox rule"; invariant 6 (charge-once)).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.codec import encode_message
from renyi_stream.pipelines.streaming.file_metadata import SNAPSHOT_PREVIOUS_RUN, SNAPSHOT_RUN
from renyi_stream.pipelines.streaming.state_folder import STAGED_RELEASES, STATE_FILE, committed_windows
from renyi_stream.queries import release_lineage as lineage
from renyi_stream.stream.noise import NoiseKey

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


def _messages(folder: Path, days: int) -> list[str]:
    """``days`` days of 60 of 90 users, one message per day."""
    rng = np.random.default_rng(21)
    paths = []
    for d in range(days):
        users = rng.choice(90, 60, replace=False)
        table = pa.table({"user_id": pa.array(users, pa.int64()),
                          "day": pa.array([DAY0 + dt.timedelta(days=d)] * 60, pa.date32()),
                          "opened": pa.array((rng.random(60) < 0.5).astype(np.float64))})
        paths.append(str(folder / "messages" / f"day-{d}.arrows"))
        Path(paths[-1]).parent.mkdir(parents=True, exist_ok=True)
        Path(paths[-1]).write_bytes(encode_message(table))
    return paths


def _args(root: Path, replay: list[str], output: str, *, start: int, end: int, previous: str) -> list[str]:
    key = root / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    day = lambda d: (DAY0 + dt.timedelta(days=d)).isoformat()  # noqa: E731
    # The ledger's input contract (issue 28): int64 ids, opened a 0/1 indicator.
    return ["--replay", *replay, "--id-type", "int64", "--column", "opened=0:1", "--start", day(start),
            "--end", day(end), "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "2",
            "--releases-parquet", str(root / "public"),
            "--output", str(root / output), "--noise-key", str(key), "--shards", "2", "--previous-ledger", previous]


def _snapshots(root: Path, output: str, window: int) -> str:
    return f"{root / output}/ledger/window_id={window}/*/*.parquet"


def _run(root: Path, output: str) -> str:
    return json.loads((root / output / STATE_FILE).read_text())["run"]


def _public_windows(root: Path) -> set[int]:
    return {int(f.parent.name.split("=")[1]) for f in (root / "public").glob("window_id=*/releases.parquet")}


@dataclass(frozen=True)
class Race:
    root: Path
    messages: list[str]
    a: str  # the run of job A, a new ledger over day 0
    b: str  # job B continued A over day 1 and published first
    c: str  # job C continued A over days 1 and 2, launched at the same time as B
    c_status: int
    c_err: str


@pytest.fixture(scope="module")
def race(tmp_path_factory) -> Race:
    """Jobs B (day 1) and C (days 1 and 2) both continue job A's snapshot of W0 (two launches at
    once): C is launched and built (every launch check passed, W0 the last public window), then B
    runs whole and publishes W0 + 1 before C's first publication. Without lineage C would publish
    W0 + 2 from a ledger missing B's charges."""
    root = tmp_path_factory.mktemp("race")
    messages = _messages(root, 3)
    assert sj.main(_args(root, messages[:1], "a", start=0, end=0, previous="none")) == 0
    continuation = functools.partial(_args, root, previous=_snapshots(root, "a", W0))
    record, raced = sj._record_queries, []

    def built_then_b_publishes(*args, **kwargs):
        if not raced:
            raced.append(True)
            assert sj.main(continuation(messages[1:2], "b", start=1, end=1)) == 0
        return record(*args, **kwargs)

    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(err):
        patch.setattr(sj, "_record_queries", built_then_b_publishes)
        status = sj.main(continuation(messages[1:], "c", start=1, end=2))
    return Race(root, messages, _run(root, "a"), _run(root, "b"), _run(root, "c"), status, err.getvalue())


def test_of_two_jobs_continued_from_one_snapshot_only_the_first_to_publish_publishes(race):
    """C refuses loudly and none of its windows is public (W0 + 2 is not): W0 + 1 is B's answer,
    recorded as charged by B, and B holds the claim on A's successor."""
    assert race.c_status == 2
    assert "refused" in race.c_err and f"run {race.c} may not publish" in race.c_err
    assert f"run {race.b} already published" in race.c_err
    public = str(race.root / "public")
    assert lineage.successor(public, race.a) == race.b
    assert lineage.published_by(public, W0 + 1) == race.b
    published = pq.read_table(race.root / "public" / f"window_id={W0 + 1}" / "releases.parquet")
    assert published.equals(
        pq.read_table(race.root / "b" / STAGED_RELEASES / f"window_id={W0 + 1}" / "releases.parquet"))
    assert committed_windows(str(race.root / "c")) == [W0 + 1]  # committed, then stopped: a dead branch
    assert _public_windows(race.root) == {W0, W0 + 1}


def test_a_continuation_from_a_forked_snapshot_is_refused_at_launch_naming_both_runs(race, capsys):
    """C's committed snapshot of W0 + 1 is a dead branch (B's is public): a job continuing it
    would miss B's charges of users whose answers are public."""
    forked = _args(race.root, race.messages[2:], "d", start=2, end=2, previous=_snapshots(race.root, "c", W0 + 1))
    assert sj.main(forked) == 2
    err = capsys.readouterr().err
    assert "refused" in err and f"run {race.b}" in err and f"run {race.c}" in err
    assert not (race.root / "d" / STATE_FILE).exists()
    assert _public_windows(race.root) == {W0, W0 + 1}


def test_a_job_restarted_after_a_crash_keeps_its_run_id_and_its_claim_and_publishes(tmp_path, capsys):
    """A new ledger over two days, lost after committing W0 + 1 but before its lineage record and
    public file: the same command keeps the run id, holds the run's claim and publishes W0 + 1 as
    that run's. Every snapshot records the run and its parent (ORIGIN)."""
    argv = _args(tmp_path, _messages(tmp_path, 2), "a", start=0, end=1, previous="none")
    assert sj.main(argv) == 0
    run = _run(tmp_path, "a")
    (tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet").unlink()
    (tmp_path / "public" / lineage.window_path(W0 + 1)).unlink()
    assert sj.main(argv) == 0
    assert f"resuming from window {W0 + 1}" in capsys.readouterr().err
    assert _run(tmp_path, "a") == run
    public = str(tmp_path / "public")
    assert lineage.successor(public, lineage.ORIGIN) == run
    assert [lineage.published_by(public, w) for w in (W0, W0 + 1)] == [run, run]
    assert _public_windows(tmp_path) == {W0, W0 + 1}
    for snapshot in (tmp_path / "a" / "ledger").glob("window_id=*/shard=*/*.parquet"):
        meta = pq.read_schema(snapshot).metadata
        assert (meta[SNAPSHOT_RUN.encode()], meta[SNAPSHOT_PREVIOUS_RUN.encode()]) == (
            run.encode(), lineage.ORIGIN.encode())
