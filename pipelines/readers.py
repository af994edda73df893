"""Read indicator files as Arrow record batches: Parquet, Arrow IPC (file or stream) and CSV.

The format is chosen by extension (``.parquet``/``.pq``, ``.arrow``/``.feather``/``.ipc``,
``.csv``). A file that cannot be read as its extension says raises :class:`InputFileError`
naming the file, before any of it is charged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc",
           ".csv": "csv"}


class InputFileError(ValueError):
    """An input file that is missing, of an unknown kind, or not what its extension says."""


def file_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputFileError(f"input file {path}: unknown extension {suffix!r}; expected one of {sorted(FORMATS)}")
    return FORMATS[suffix]


def read_batches(path: str | Path, *, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Yield the file's rows as record batches of at most ``batch_rows`` rows."""
    kind = file_format(path)
    if not Path(path).is_file():
        raise InputFileError(f"input file {path} does not exist")
    try:
        if kind == "parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
        elif kind == "ipc":
            yield from _ipc_batches(path, batch_rows)
        else:
            table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                column_types={"day": pa.string(), "event_time": pa.string()}))
            yield from table.to_batches(max_chunksize=batch_rows)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise InputFileError(f"input file {path} is not a readable {kind} file: {exc}") from exc


def _ipc_batches(path: str | Path, batch_rows: int) -> Iterator[pa.RecordBatch]:
    with pa.memory_map(str(path)) as source:
        try:
            reader = ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            source.seek(0)
            batches = iter(ipc.open_stream(source))
        for batch in batches:
            yield from pa.Table.from_batches([batch]).to_batches(max_chunksize=batch_rows)
