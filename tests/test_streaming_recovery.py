"""The streaming job recovers from a crash by itself (issue 19): run its command again.

A job's ``--output`` is its state folder. :class:`renyi_stream.pipelines.streaming.commits.WindowCommits` commits
its windows in order, each with one marker (``commits/window_id=<W>.json``) written after every
shard's snapshot and records of the window and its staged releases, and publishes a window only
after its marker. Launched again with the same command line, the job publishes what it committed
and did not publish, removes what a crash left of later windows (a dead branch: never restored,
never published) and charges them again from the last committed window's snapshots
(:func:`renyi_stream.pipelines.streaming.recovery.recover`). The conformance suite kills the job at each of its
crash points (``tests/conformance/test_conformance.py``); these tests pin the recovery rule on
states a crash can leave, built by hand from a finished job's files.

Snapshots are incremental (``--full-snapshot-every K``): a shard's snapshot of a window is whole
every K windows and otherwise holds the users charged in it; the ledger rebuilt at any window is
the one whole snapshots give, and a restart from a delta window rebuilds it from its chain.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.streaming.beam import job as sj
from renyi_stream.pipelines.streaming.books import BOOKS_FILE
from renyi_stream.pipelines.streaming.codec import decode_message, encode_message
from renyi_stream.pipelines.streaming.running_state import previous_running_state
from renyi_stream.pipelines.streaming.snapshots import whole_ledger
from renyi_stream.pipelines.streaming.state_folder import (COMMITS, STAGED_RELEASES, STATE_FILE, commit_marker_path,
                                                           committed_windows)
from renyi_stream.stream.noise import NoiseKey

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days


@pytest.fixture
def messages(tmp_path) -> list[str]:
    """Two days of 80 of 120 users, one message per day (a duplicate row in the second)."""
    rng = np.random.default_rng(19)
    paths = []
    for d in range(2):
        users = rng.choice(120, 80, replace=False)
        users[-1] = users[0]  # a duplicate (user, window): a dead letter of that window's charge
        table = pa.table({"user_id": pa.array(users, pa.int64()),
                          "day": pa.array([DAY0 + dt.timedelta(days=d)] * 80, pa.date32()),
                          "opened": pa.array((rng.random(80) < 0.5).astype(np.float64)),
                          "bought": pa.array(rng.random(80) * 1.5)})
        paths.append(str(tmp_path / "messages" / f"day-{d}.arrows"))
        Path(paths[-1]).parent.mkdir(exist_ok=True)
        Path(paths[-1]).write_bytes(encode_message(table))
    return paths


def _args(tmp_path: Path, messages: list[str], **options: str) -> list[str]:
    key = tmp_path / "key" / "noise.key"
    NoiseKey.load_or_create(key)
    args = {"--start": "2026-03-01", "--end": "2026-03-02", "--epsilon": "1", "--delta": "1e-6",
            "--norm-budget": "2", "--releases-parquet": str(tmp_path / "public"), "--output": str(tmp_path / "curator"),
            "--noise-key": str(key), "--shards": "2", "--previous-ledger": "none",
            **{"--" + k.replace("_", "-"): v for k, v in options.items()}}
    # The ledger's input contract (issue 28): int64 ids, opened a 0/1 indicator, bought in [0, 1.5).
    declared = ["--id-type", "int64", "--column", "opened=0:1", "--column", "bought=0:1.5"]
    return ["--replay", *messages, *declared, *(x for kv in args.items() for x in kv)]


def _public(tmp_path: Path) -> dict[int, pa.Table]:
    return {int(f.parent.name.split("=")[1]): pq.read_table(f) for f in (tmp_path / "public").glob("*/*.parquet")}


def _ledger(tmp_path: Path, window: int) -> pa.Table:
    files = sorted((tmp_path / "curator" / "ledger" / f"window_id={window}").glob("shard=*/*.parquet"))
    return pa.concat_tables([pq.read_table(f).replace_schema_metadata(None) for f in files]).sort_by("user_id")


def _books(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "curator" / BOOKS_FILE).read_text())


def test_a_job_commits_each_window_with_one_marker_in_window_order(tmp_path, messages):
    assert sj.main(_args(tmp_path, messages)) == 0
    assert committed_windows(str(tmp_path / "curator")) == [W0, W0 + 1]
    marker = json.loads(Path(commit_marker_path(str(tmp_path / "curator"), W0 + 1)).read_text())
    assert (marker["window_id"], marker["n_shards"]) == (W0 + 1, 2)


def test_rerunning_a_job_publishes_the_committed_window_a_crash_kept_from_the_public_and_charges_nobody_again(
        tmp_path, messages, capsys):
    """A crash after the last window's marker, before its publication: the same command publishes
    the answer the lost job computed, and its books and ledger are the finished job's."""
    assert sj.main(_args(tmp_path, messages)) == 0
    public, books, ledger = _public(tmp_path), _books(tmp_path), _ledger(tmp_path, W0 + 1)
    (tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet").unlink()
    assert sj.main(_args(tmp_path, messages)) == 0
    assert f"resuming from window {W0 + 1} (2026-03-02)" in capsys.readouterr().err  # its date beside it
    assert _public(tmp_path).keys() == public.keys()
    assert all(_public(tmp_path)[w].equals(public[w]) for w in public)
    assert _books(tmp_path) == books and books["balanced"] and books["late"] == 0
    assert _ledger(tmp_path, W0 + 1).equals(ledger)


def test_a_window_written_but_not_committed_is_a_dead_branch_charged_again_never_restored(tmp_path, messages):
    """A crash after every write of window W0 + 1 but its marker: its snapshots, staged releases
    and records are the dead branch. Tampered with here (every used budget zeroed, the staged
    answer changed), they must be neither restored nor published: the rerun charges the window
    again from W0's snapshots and gives the finished job's ledger, answer and books."""
    assert sj.main(_args(tmp_path, messages)) == 0
    public, books, ledger = _public(tmp_path), _books(tmp_path), _ledger(tmp_path, W0 + 1)
    curator = tmp_path / "curator"
    Path(commit_marker_path(str(curator), W0 + 1)).unlink()
    (tmp_path / "public" / f"window_id={W0 + 1}" / "releases.parquet").unlink()
    for snapshot in (curator / "ledger" / f"window_id={W0 + 1}").glob("shard=*/*.parquet"):
        table = pq.read_table(snapshot)
        pq.write_table(table.set_column(table.schema.get_field_index("used"), "used",
                                        pc.multiply(table.column("used"), 0.0)), snapshot)
    staged = curator / STAGED_RELEASES / f"window_id={W0 + 1}" / "releases.parquet"
    rows = pq.read_table(staged)
    pq.write_table(rows.set_column(rows.schema.get_field_index("value"), "value", pc.add(rows.column("value"), 1.0)),
                   staged)
    assert sj.main(_args(tmp_path, messages)) == 0
    assert _ledger(tmp_path, W0 + 1).equals(ledger)
    assert _public(tmp_path)[W0 + 1].equals(public[W0 + 1])
    assert _books(tmp_path) == books and books["balanced"]
    assert committed_windows(str(curator)) == [W0, W0 + 1]


def test_a_job_that_committed_nothing_is_rerun_from_its_previous_ledger_and_leaves_one_outcome(tmp_path, messages):
    """No marker: everything a crash left in the folder is dead branch; the rerun is the whole job."""
    assert sj.main(_args(tmp_path, messages)) == 0
    public, books = _public(tmp_path), _books(tmp_path)
    curator = tmp_path / "curator"
    for marker in (curator / COMMITS).glob("*.json"):
        marker.unlink()
    for f in (tmp_path / "public").glob("*/*.parquet"):
        f.unlink()
    assert sj.main(_args(tmp_path, messages)) == 0
    assert _public(tmp_path).keys() == public.keys() and _books(tmp_path) == books


def test_a_launch_with_another_command_line_into_a_jobs_output_is_refused_naming_what_differs(
        tmp_path, messages, capsys):
    """The follow-up job given the first one's --output: one folder, one job's state."""
    assert sj.main(_args(tmp_path, messages[:1], end="2026-03-01")) == 0
    capsys.readouterr()
    previous = f"{tmp_path / 'curator' / 'ledger'}/window_id={W0}/*/*.parquet"
    assert sj.main(_args(tmp_path, messages[1:], start="2026-03-02", previous_ledger=previous)) == 2
    err = capsys.readouterr().err
    assert "is the state folder of another job" in err and "--end, --previous-ledger, --replay, --start differ" in err
    assert sorted(_public(tmp_path)) == [W0]


def test_an_output_with_snapshots_from_before_commit_markers_is_refused(tmp_path, messages, capsys):
    assert sj.main(_args(tmp_path, messages)) == 0
    (tmp_path / "curator" / STATE_FILE).unlink()
    capsys.readouterr()
    assert sj.main(_args(tmp_path, messages)) == 2
    assert "from before commit markers" in capsys.readouterr().err


# --- incremental snapshots: a full snapshot every K windows, deltas of the users charged between ------

TEN = 10


def _ten_days(folder: Path) -> list[str]:
    """Ten days, one message each, of 20 to 60 of 150 users."""
    rng = np.random.default_rng(23)
    paths = []
    for d in range(TEN):
        users = rng.choice(150, int(rng.integers(20, 61)), replace=False)
        table = pa.table({"user_id": pa.array(users, pa.int64()),
                          "day": pa.array([DAY0 + dt.timedelta(days=d)] * len(users), pa.date32()),
                          "opened": pa.array((rng.random(len(users)) < 0.5).astype(np.float64)),
                          "bought": pa.array(rng.random(len(users)) * 1.5)})
        paths.append(str(folder / f"day-{d}.arrows"))
        Path(paths[-1]).parent.mkdir(parents=True, exist_ok=True)
        Path(paths[-1]).write_bytes(encode_message(table))
    return paths


@pytest.fixture(scope="module")
def ten_day_jobs(tmp_path_factory) -> dict[int, Path]:
    """The same ten-day job with a full snapshot every 1, 3 and 1,000 windows, each in a folder of
    its own (its --output is <folder>/curator)."""
    root = tmp_path_factory.mktemp("ten-days")
    messages = _ten_days(root / "messages")
    folders = {}
    for k in (1, 3, 1000):
        folders[k] = root / f"k{k}"
        args = _args(folders[k], messages, end=str(DAY0 + dt.timedelta(days=TEN - 1)))
        args[args.index("--noise-key") + 1] = str(root / "key" / "noise.key")
        NoiseKey.load_or_create(root / "key" / "noise.key")
        assert sj.main([*args, "--full-snapshot-every", str(k)]) == 0
    return folders


def _snapshot_rows(folder: Path, window: int) -> int:
    return sum(pq.read_metadata(f).num_rows
               for f in (folder / "curator" / "ledger" / f"window_id={window}").glob("shard=*/*.parquet"))


def test_the_ledger_at_every_window_is_the_same_whatever_the_full_snapshot_interval(ten_day_jobs):
    """Rebuilt from a full snapshot and the deltas after it (whole_ledger), every window's ledger
    is the one whole snapshots give; so is the final ledger, and the public answers' sums."""
    ledgers = {k: [whole_ledger(str(folder / "curator" / "ledger"), W0 + w) for w in range(TEN)]
               for k, folder in ten_day_jobs.items()}
    assert all(table.num_rows for table in ledgers[1])
    for k in (3, 1000):
        assert [t.equals(whole) for t, whole in zip(ledgers[k], ledgers[1])] == [True] * TEN
    assert [_snapshot_rows(ten_day_jobs[3], W0 + w) < _snapshot_rows(ten_day_jobs[1], W0 + w)
            for w in range(TEN)] == [w % 3 != 0 and w != TEN - 1 for w in range(TEN)]


def test_a_windows_snapshot_holds_one_row_per_user_charged_in_it_between_full_snapshots(ten_day_jobs):
    """With K = 1,000 only the job's first and last windows are full; every window between writes
    exactly the users charged in it (one row each, every shard together), not the ledger."""
    folder = ten_day_jobs[1000]
    days = sorted((folder.parent / "messages").glob("day-*.arrows"), key=lambda p: int(p.stem.split("-")[1]))
    charged = [decode_message(p.read_bytes()).num_rows for p in days]  # distinct users, one row each
    rows = [_snapshot_rows(folder, W0 + w) for w in range(TEN)]
    assert rows[1:-1] == charged[1:-1]
    assert rows[0] == charged[0] and rows[-1] == whole_ledger(str(folder / "curator" / "ledger"), W0 + TEN - 1
                                                              ).num_rows > charged[-1]


def test_a_job_restarted_after_a_delta_window_resumes_from_the_ledger_its_chain_rebuilds(tmp_path):
    """K = 3: window W0 + 5 is a delta over W0 + 3. The job lost after that window's marker (the
    later windows written, not committed) resumes from the full snapshot of W0 + 3 and the deltas
    after it, to the uninterrupted end: the same ledger, answers and books."""
    messages = _ten_days(tmp_path / "messages")
    args = _args(tmp_path, messages, end=str(DAY0 + dt.timedelta(days=TEN - 1)), full_snapshot_every="3")
    assert sj.main(args) == 0
    curator, last = tmp_path / "curator", W0 + TEN - 1
    public, books, ledger = _public(tmp_path), _books(tmp_path), whole_ledger(str(curator / "ledger"), last)
    kind = pq.read_schema(next((curator / "ledger" / f"window_id={W0 + 5}").glob("shard=0/*.parquet"))).metadata
    assert kind[b"renyi_stream.snapshot"] == b"delta" and kind[b"renyi_stream.base_window"] == str(W0 + 3).encode()
    for w in range(W0 + 6, W0 + TEN):
        Path(commit_marker_path(str(curator), w)).unlink()
        (tmp_path / "public" / f"window_id={w}" / "releases.parquet").unlink()
    assert sj.main(args) == 0
    assert whole_ledger(str(curator / "ledger"), last).equals(ledger)
    assert _public(tmp_path).keys() == public.keys() and all(_public(tmp_path)[w].equals(public[w]) for w in public)
    assert _books(tmp_path) == books and books["balanced"]


# --- running totals: each window's prepaid rows are a delta beside its ledger delta (issue 30) --------


def _with_a_running_query(root: Path) -> None:
    """A catalogue under the release root ``root`` holding a window sum and a running total (the
    library registers one there; the command line refuses to)."""
    from renyi_stream.queries.catalogue import ReleaseCatalogue
    from renyi_stream.queries.linear import LinearQuery

    catalogue = ReleaseCatalogue(str(root))
    catalogue.add(LinearQuery.columns("sum:opened", ["opened"]), effective_from=W0)
    catalogue.add(LinearQuery.columns("total_opened", ["opened"], kind="running"), effective_from=W0)


def _running_job(folder: Path, messages: list[str], k: int) -> list[str]:
    """The ten-day job with a running total and a full snapshot every ``k`` windows, its --output
    ``<folder>/curator``; returns its arguments."""
    _with_a_running_query(folder / "public")
    args = [*_args(folder, messages, end=str(DAY0 + dt.timedelta(days=TEN - 1)), norm_budget="40"),
            "--full-snapshot-every", str(k)]
    assert sj.main(args) == 0
    return args


@pytest.fixture(scope="module")
def ten_running_days(tmp_path_factory) -> dict[int, Path]:
    """The ten-day job with a running total, whole every window (k = 1) and with a full snapshot
    every 3 windows, each in a folder of its own (its --output is <folder>/curator)."""
    root = tmp_path_factory.mktemp("ten-running-days")
    messages = _ten_days(root / "messages")
    folders = {}
    for k in (1, 3):
        folders[k] = root / f"k{k}"
        _running_job(folders[k], messages, k)
    return folders


def _prepaid_at(folder: Path, window: int) -> dict[str, pa.Table]:
    """Every shard's prepaid rows at ``window`` as a job continuing from that window restores them."""
    prepaid, _, _ = previous_running_state(f"{folder / 'curator' / 'ledger'}/window_id={window}/*/*.parquet")
    return {q: t.sort_by("user_id") for q, t in prepaid.items()}


def _prepaid_file_rows(folder: Path, window: int) -> int:
    return sum(pq.read_metadata(f).num_rows
               for f in (folder / "curator" / "prepaid" / f"window_id={window}").rglob("*.parquet"))


def test_the_prepaid_rows_restored_at_every_window_are_those_whole_snapshots_give(ten_running_days):
    """K = 3: between full snapshots a window writes the prepaid rows of the users charged in it;
    rebuilt from its base window's full file and the deltas after it, every window's prepaid rows
    (what a restart from that window continues) are the ones a job writing them whole gives, and so
    are its ledger and its books (its answers are the same sums, each ledger with its own noise)."""
    whole, incremental = ten_running_days[1], ten_running_days[3]
    for w in range(W0, W0 + TEN):
        a, b = _prepaid_at(whole, w), _prepaid_at(incremental, w)
        assert list(a) == list(b) == ["total_opened"], w
        assert a["total_opened"].num_rows and a["total_opened"].equals(b["total_opened"], check_metadata=True), w
        assert whole_ledger(str(whole / "curator" / "ledger"), w).equals(
            whole_ledger(str(incremental / "curator" / "ledger"), w)), w
    assert [_prepaid_file_rows(incremental, W0 + w) < _prepaid_file_rows(whole, W0 + w) for w in range(TEN)] == \
        [w % 3 != 0 and w != TEN - 1 for w in range(TEN)]
    assert _public(whole).keys() == _public(incremental).keys() == set(range(W0, W0 + TEN))
    assert _books(whole) == _books(incremental) and _books(whole)["balanced"]


def test_a_delta_windows_prepaid_files_hold_the_rows_of_its_own_users_only(ten_running_days):
    """A delta window's prepaid files (one per shard with a charged row, none without) hold exactly
    the rows of the window's users that have one, marked as a delta over its ledger's base window;
    its ledger snapshots record the rows of each file and the shard's prepaid users after it."""
    folder = ten_running_days[3]
    days = sorted((folder.parent / "messages").glob("day-*.arrows"), key=lambda p: int(p.stem.split("-")[1]))
    for w in (1, 2, 4, 5, 7, 8):
        window = W0 + w
        users = set(decode_message(days[w].read_bytes()).column("user_id").to_pylist())
        files = sorted((folder / "curator" / "prepaid" / f"window_id={window}").rglob("*.parquet"))
        assert 1 <= len(files) <= 2  # one per shard at most (--shards 2), one running query
        rows = pa.concat_tables([pq.read_table(f) for f in files])
        whole = set(_prepaid_at(folder, window)["total_opened"].column("user_id").to_pylist())
        assert set(rows.column("user_id").to_pylist()) == users & whole, w
        for f in files:
            meta = pq.read_schema(f).metadata
            assert meta[b"renyi_stream.snapshot"] == b"delta"
            assert meta[b"renyi_stream.base_window"] == str(W0 + 3 * (w // 3)).encode()
        ledgers = sorted((folder / "curator" / "ledger" / f"window_id={window}").glob("shard=*/*.parquet"))
        recorded = [json.loads(pq.read_schema(f).metadata[b"renyi_stream.prepaid_rows"]) for f in ledgers]
        assert sum(r.get("total_opened", 0) for r in recorded) == rows.num_rows
        users_after = [json.loads(pq.read_schema(f).metadata[b"renyi_stream.prepaid_users"]) for f in ledgers]
        assert sum(r["total_opened"] for r in users_after) == len(whole)


def test_a_lost_prepaid_delta_is_refused_before_its_users_restart_from_an_earlier_window(ten_running_days,
                                                                                          tmp_path):
    """The delta of window W0 + 4 lost: restoring window W0 + 5 (a delta over W0 + 3) would give its
    users their prepaid rows of W0 + 3, whose later charges are too small. Refused, naming the
    window, the shard and what is missing; with the file back, restored as before."""
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(ten_running_days[3] / "curator", folder / "curator")
    lost = max((folder / "curator" / "prepaid" / f"window_id={W0 + 4}").rglob("*.parquet"),
               key=lambda f: pq.read_metadata(f).num_rows)
    kept = lost.read_bytes()
    lost.unlink()
    shard = lost.parent.name.split("=")[1]
    with pytest.raises(sj.launch.RunRefused, match=f"shard {shard}'s prepaid files of window {W0 + 4}.*missing"):
        _prepaid_at(folder, W0 + 5)
    lost.write_bytes(kept)
    lost.chmod(0o600)  # a curator file, as the job writes them
    assert _prepaid_at(folder, W0 + 5)["total_opened"].equals(_prepaid_at(ten_running_days[1], W0 + 5)["total_opened"])


def test_a_job_with_a_running_total_restarted_after_a_delta_window_resumes_from_its_prepaid_chain(tmp_path):
    """K = 3, a running total: the job lost after window W0 + 5's marker (a delta over W0 + 3)
    resumes from the prepaid rows and ledger its chain rebuilds, to the uninterrupted end: the same
    ledger, prepaid rows, answers and books."""
    messages = _ten_days(tmp_path / "messages")
    args = _running_job(tmp_path, messages, 3)
    curator, last = tmp_path / "curator", W0 + TEN - 1
    public, books, ledger = _public(tmp_path), _books(tmp_path), whole_ledger(str(curator / "ledger"), last)
    prepaid = _prepaid_at(tmp_path, last)
    for w in range(W0 + 6, W0 + TEN):
        Path(commit_marker_path(str(curator), w)).unlink()
        (tmp_path / "public" / f"window_id={w}" / "releases.parquet").unlink()
    assert sj.main(args) == 0
    assert whole_ledger(str(curator / "ledger"), last).equals(ledger)
    assert _prepaid_at(tmp_path, last)["total_opened"].equals(prepaid["total_opened"])
    assert _public(tmp_path).keys() == public.keys() and all(_public(tmp_path)[w].equals(public[w]) for w in public)
    assert {q for t in public.values() for q in t.column("query_id").to_pylist()} == {"sum:opened", "total_opened"}
    assert _books(tmp_path) == books and books["balanced"]
