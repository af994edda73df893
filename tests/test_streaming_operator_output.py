"""What the streaming job shows its operator depends on structure, never on one row (issue 37).

Whoever sees the job's page (Dataflow, Flink) sees its Beam counters, and whoever sees its console
sees what it prints: both may count messages, files, shards and windows, never rows or users
(docs/architecture.md, "Invariant 4: nothing-pre-noise-leaves"). Two replays whose inputs differ by one user's row
give the same counters, the same exit code and, with ``--quiet``, the same console; without it the
lines that differ are the curator's exact counts, under their "curator only" heading.
"""

from __future__ import annotations

import re
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from renyi_stream.pipelines.cli.main import main
from renyi_stream.stream.noise import NoiseKey
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE
from test_streaming_job import DECLARED, _rows

#: Three days of users 0..29; ``one_more`` adds user 99's row to the day ``day`` (day 1 has no row
#: otherwise: a day with no rows against a day with one user's row).
USERS = {0: list(range(30)), 1: [], 2: list(range(10, 40))}


def _day_files(folder: Path, *, one_more: int | None) -> list[str]:
    folder.mkdir(parents=True)
    paths = []
    for day, users in USERS.items():
        table = _rows(day, users or [0], seed=3).slice(0, len(users))
        if day == one_more:  # the same rows and user 99's, nothing else changed
            table = pa.concat_tables([table, _rows(day, [99], seed=7)])
        path = folder / f"day={day}.parquet"
        pq.write_table(table, path)
        paths.append(str(path))
    return paths


def _argv(root: Path, files: list[str], key: Path, *extra: str) -> list[str]:
    return ["stream", "--replay", *files, *DECLARED, "--start", "2026-03-01", "--end", "2026-03-03",
            "--epsilon", "1", "--delta", "1e-6", "--norm-budget", "2", "--previous-ledger", "none",
            "--releases-parquet", str(root / "public"), "--output", str(root / "curator"),
            "--noise-key", str(key), "--shards", "2", *extra]


@pytest.fixture
def pipeline_results(monkeypatch) -> list:
    """Every Beam pipeline result the job's runs return, in order."""
    results = []
    run = beam.Pipeline.run

    def recording(self, *args, **kwargs):
        results.append(run(self, *args, **kwargs))
        return results[-1]

    monkeypatch.setattr(beam.Pipeline, "run", recording)
    return results


def _metrics(result) -> dict:
    """Every metric of a pipeline result, counters, distributions and gauges: ``{(kind, step,
    namespace, name): (committed, attempted)}``."""
    found = {}
    for kind, values in result.metrics().query().items():
        for value in values:
            key = (kind, value.key.step, value.key.metric.namespace, value.key.metric.name)
            found[key] = (repr(value.committed), repr(value.attempted))
    return found


def _replay(tmp_path, name: str, one_more: int | None, capsys, results: list, *extra: str) -> tuple[int, dict, str]:
    """A replay of the three days, with user 99's row on day ``one_more`` (None: nowhere), into
    ``tmp_path/name``: its exit code, its Beam metrics and its console (stdout and stderr, its own
    folder written ROOT, the monotonic clock of its progress lines T)."""
    root = tmp_path / name
    key = tmp_path / "noise.key"
    NoiseKey.load_or_create(key)
    files = _day_files(root / "input", one_more=one_more)
    capsys.readouterr()
    code = main(_argv(root, files, key, *extra))
    said = capsys.readouterr()
    console = (said.out + said.err).replace(str(root), "ROOT")
    return code, _metrics(results[-1]), re.sub(r" at [0-9]+\.[0-9]+", " at T", console)


@pytest.mark.parametrize("day", [1, 2], ids=["a-day-of-no-rows-or-one", "a-day-of-30-rows-or-31"])
def test_one_users_row_changes_no_beam_counter_exit_code_or_quiet_console_line(tmp_path, capsys, pipeline_results,
                                                                             day):
    without = _replay(tmp_path, "without", None, capsys, pipeline_results, "--quiet")
    with_row = _replay(tmp_path, "with", day, capsys, pipeline_results, "--quiet")
    assert without[0] == with_row[0] == 0
    assert without[1] == with_row[1] and without[1]  # every metric: the filter's firings, nothing of rows
    assert not any("parts_read" in name for _, _, _, name in without[1])
    assert without[2] == with_row[2]
    assert "[streaming] done" in without[2] and CURATOR_ONLY_NOTICE not in without[2]


def test_without_quiet_the_lines_one_row_changes_are_the_curators_under_their_heading(tmp_path, capsys,
                                                                                      pipeline_results):
    _, _, without = _replay(tmp_path, "without", None, capsys, pipeline_results)
    _, _, with_row = _replay(tmp_path, "with", 1, capsys, pipeline_results)
    before, after = without.splitlines(), with_row.splitlines()
    heading = before.index(CURATOR_ONLY_NOTICE)
    assert after.index(CURATOR_ONLY_NOTICE) == heading and before[:heading] == after[:heading]
    assert before[heading + 1] != after[heading + 1]  # the rows read: 60 and 61
    assert before[heading + 1].startswith("rows read 60 = admitted ")
    assert after[heading + 1].startswith("rows read 61 = admitted ")
