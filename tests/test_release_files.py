"""The Parquet release path's first-write-wins rule holds between concurrent writers (issue 18,
item 10; invariant 5 (release-once, docs/architecture.md): a window is released once).

Two real processes write different rows for the same window at the same moment (a barrier),
many times over: exactly one of them learns that it wrote the file, the file holds that
writer's rows, and no scratch file is left behind.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from renyi_stream.queries.release_files import FILE_NAME, release_file_path, write_release_file
from renyi_stream.queries.release_store import RELEASE_SCHEMA

ROUNDS = 40
WINDOW = 20_513


def _rows(writer: int) -> pa.Table:
    """Two coordinates whose values name the writer."""
    start = pa.scalar(WINDOW * 86_400_000_000, pa.timestamp("us", tz="UTC"))
    end = pa.scalar((WINDOW + 1) * 86_400_000_000, pa.timestamp("us", tz="UTC"))
    return pa.table({
        "query_id": ["sum:x", "sum:x"], "window_id": [WINDOW, WINDOW],
        "window_start": pa.array([start, start]), "window_end": pa.array([end, end]),
        "label": ["x", "x"], "coordinate": pa.array([0, 1], pa.int32()),
        "value": [float(writer), float(writer) + 0.5], "noise_std": [1.0, 1.0], "kind": ["window", "window"],
        "accounting": ["gdp", "gdp"], "mechanism": ["gaussian", "gaussian"], "key_fingerprint": ["k", "k"],
    }, schema=RELEASE_SCHEMA)


def _writer(writer: int, roots: list[str], barrier, results) -> None:
    table = _rows(writer)
    for index, root in enumerate(roots):
        barrier.wait()
        try:
            written = write_release_file(root, WINDOW, table)
            results.put((index, writer, "won" if written is not None else "kept"))
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            results.put((index, writer, f"error: {exc!r}"))


def test_two_processes_writing_one_window_at_once_leave_exactly_the_first_writers_file(tmp_path):
    roots = [str(tmp_path / f"round-{i}") for i in range(ROUNDS)]
    ctx = mp.get_context("spawn")  # pyarrow's thread pools do not survive fork
    barrier, results = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=_writer, args=(w, roots, barrier, results)) for w in (1, 2)]
    for worker in workers:
        worker.start()
    outcomes: dict[int, dict[int, str]] = {}
    for _ in range(2 * ROUNDS):
        index, writer, outcome = results.get(timeout=120)
        outcomes.setdefault(index, {})[writer] = outcome
    for worker in workers:
        worker.join(timeout=60)

    for index, root in enumerate(roots):
        outcome = outcomes[index]
        assert not [o for o in outcome.values() if o.startswith("error")], f"round {index}: {outcome}"
        winners = [w for w, o in outcome.items() if o == "won"]
        assert len(winners) == 1, f"round {index}: both writers were told they wrote the file: {outcome}"
        kept = pq.read_table(release_file_path(root, WINDOW)).column("value").to_pylist()
        assert kept == [float(winners[0]), winners[0] + 0.5], f"round {index}: the file is not its writer's"
        assert [p.name for p in Path(root, f"window_id={WINDOW}").iterdir()] == [FILE_NAME]  # no scratch left


def test_a_window_already_written_is_kept_and_its_writer_is_told(tmp_path):
    root = str(tmp_path / "releases")
    assert write_release_file(root, WINDOW, _rows(1)) == release_file_path(str(Path(root).resolve()), WINDOW)
    assert write_release_file(root, WINDOW, _rows(2)) is None
    assert pq.read_table(release_file_path(root, WINDOW)).column("value").to_pylist() == [1.0, 1.5]
