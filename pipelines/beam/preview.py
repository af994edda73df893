"""What ``--dry-run`` shares between the Beam jobs (``renyi-stream distributed`` and
``renyi-stream stream``): the run itself, on the DirectRunner, into a ``0700`` scratch folder that
holds a copy of the public release root (and of the curator folders the run would write), then one
summary of what it would have done. The real root and curator folders are only ever read.

What the summary prints is public (the windows and the queries a run would release, which the
schedule and the catalogue already say) except the rows by outcome, exact counts for the curator,
printed only without ``--quiet`` (docs/threat_model.md: exact counts are the curator's)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from renyi_stream.queries.release_files import filesystem, release_file_path
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE


def runner_refusal(beam_args: Iterable[str]) -> str | None:
    """Why a dry run cannot run with these Beam options, or None: it runs here, on the
    DirectRunner, so that its scratch folders are this machine's."""
    runner = next((a.split("=", 1)[1] for a in beam_args if a.startswith("--runner=")), "DirectRunner")
    return None if "Direct" in runner else f"a dry run runs here, on the DirectRunner, got --runner={runner}"


def copy_folder(source: str, destination: Path) -> bool:
    """Copy the folder ``source`` (a local path or a URI pyarrow reaches) to the local
    ``destination``; False, nothing copied, when there is no such folder."""
    source_fs, where = filesystem(source)
    if source_fs.get_file_info(where).type != pafs.FileType.Directory:
        return False
    destination.mkdir(mode=0o700, parents=True, exist_ok=True)  # pyarrow makes the folders below it only
    pafs.copy_files(where, str(destination), source_filesystem=source_fs,
                    destination_filesystem=pafs.LocalFileSystem())
    return True


def released_queries(root: Path, windows: Iterable[int]) -> list[str]:
    """The query ids answered in the release files of ``windows`` under the local root ``root``."""
    found: set[str] = set()
    for window in windows:
        path = Path(release_file_path(str(root), int(window)))
        if path.exists():
            found.update(pq.read_table(path, columns=["query_id"]).column("query_id").to_pylist())
    return sorted(found)


def print_summary(*, windows: int, queries: Iterable[str], totals: Mapping[str, int] | None, balanced: bool,
                  quiet: bool, untouched: Iterable[str]) -> None:
    """The dry run's lines: the windows and queries it would release; without ``quiet``, the
    curator's rows by outcome (``totals``: :meth:`renyi_stream.stream.engine.row_balance.RowBalance.totals`
    keys); then the real places left as they were."""
    queries = list(queries)
    print(f"dry run: would release {windows} window(s) for {len(queries)} quer"
          f"{'y' if len(queries) == 1 else 'ies'}: {', '.join(queries) or 'none'}")
    if not quiet and totals is not None:
        print(CURATOR_ONLY_NOTICE)
        print(f"would read {totals['rows_read']:,} rows = admitted {totals['admitted']:,} + clipped "
              f"{totals['clipped']:,} + dropped {totals['dropped']:,} + rejected {totals['rejected']:,} + late "
              f"{totals['late']:,}  [{'balanced' if balanced else 'MISMATCH'}]")
    print(f"nothing was charged or published: {' and '.join(untouched)} are as they were")
