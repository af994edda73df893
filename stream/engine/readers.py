"""Read indicator files as Arrow record batches: Parquet, Arrow IPC (file or stream) and CSV.

The format is chosen by extension (``.parquet``/``.pq``, ``.arrow``/``.feather``/``.ipc``,
``.csv``). A file that cannot be read as its extension says raises :class:`InputFileError`
naming the file, before any of it is charged. So does a file whose header lacks ``user_id`` or
does not have exactly one of ``day`` and ``event_time`` (a CSV with a wrong header), and an
Arrow IPC *stream* without its end-of-stream marker (cut short, possibly exactly between two
batches, where the format itself cannot tell). A file with a valid header and no rows yields
one empty batch, so that its schema can be read (an empty day is a valid input).

A CSV declares no column types, so its values are not typed by what they look like: every
column but ``user_id`` is read as text (``day``/``event_time`` and the indicators alike), and
which indicators are numbers is decided from public information (:mod:`stream.columns`), the
validator parsing them (an empty value is missing; one that does not parse is a dead letter).
Typing a CSV column from its values would let one user's value change the column's type: whether
it gets a default query, whether the run is refused, what the public store records. ``user_id``
keeps the reader's inference (integer ids when every id is an integer), which sets the ledger's
id type on the first run.

A path with a scheme (``gs://bucket/day.parquet``, ``s3://...``) is read through ``pyarrow.fs``,
as the Parquet release files are written (distributed runs read their inputs from object
storage); a plain path is a local file.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
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


def read_batches(path: str | Path, *, batch_rows: int = 65_536,
                 malformed: list[tuple[int, str]] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the file's rows as record batches of at most ``batch_rows`` rows (at least one
    batch, empty when the file has no rows).

    A CSV line with another number of fields than its header is one bad row, not a bad file:
    with ``malformed`` (a list the caller owns) each such line is skipped and appended to it as
    ``(line number or -1, its text)`` by the time the batches are exhausted, for the caller to
    dead-letter; without it, such a line raises :class:`InputFileError` as any unreadable file."""
    kind = file_format(path)
    remote = _remote(path)
    if not (_remote_is_file(path, remote) if remote else Path(path).is_file()):
        raise InputFileError(f"input file {path} does not exist")
    try:
        if kind == "parquet":
            reader = pq.ParquetFile(remote[0].open_input_file(remote[1]) if remote else path)
            _check_header(path, reader.schema_arrow)
            batches: Iterator[pa.RecordBatch] = reader.iter_batches(batch_size=batch_rows)
            schema = reader.schema_arrow
        elif kind == "ipc":
            source = remote[0].open_input_file(remote[1]) if remote else pa.memory_map(str(path))
            schema, batches = _ipc_batches(path, source, batch_rows)
            _check_header(path, schema)
        else:
            text = {name: pa.string() for name in _csv_header(path, remote) if name != "user_id"}
            source = remote[0].open_input_stream(remote[1]) if remote else path
            table = pacsv.read_csv(source, convert_options=pacsv.ConvertOptions(column_types=text),
                                   parse_options=_csv_parse_options(malformed))
            _check_header(path, table.schema)
            schema, batches = table.schema, iter(table.to_batches(max_chunksize=batch_rows))
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            yield pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"input file {path} is not a readable {kind} file: {_short(exc)}") from exc


def _csv_parse_options(malformed: list[tuple[int, str]] | None) -> pacsv.ParseOptions:
    if malformed is None:
        return pacsv.ParseOptions()

    def skip(row: pacsv.InvalidRow) -> str:
        malformed.append((int(row.number) if row.number is not None else -1, str(row.text)))
        return "skip"

    return pacsv.ParseOptions(invalid_row_handler=skip)


def declares_types(path: str | Path) -> bool:
    """Whether a file of this kind declares its column types (Parquet and Arrow do, in their
    schema; a CSV does not: :func:`read_batches` reads its values as text)."""
    return file_format(path) != "csv"


def id_type_of(schema: pa.Schema) -> str:
    """The user id type an input's schema gives a new ledger: ``"string"`` for text ids, else
    ``"int64"`` (a CSV's ids are inferred by the reader: integers when every id is one). The rule
    of every batch job (the daily job, the distributed job, the features job), applied to the first
    input; the validator then parses every row's id as it (:func:`stream.schema.validate_batch`)."""
    t = schema.field("user_id").type
    return "string" if pa.types.is_string(t) or pa.types.is_large_string(t) else "int64"


def _csv_header(path: str | Path, remote: tuple[pafs.FileSystem, str] | None) -> list[str]:
    """The column names of a CSV file, from its first line alone (so that no later line, however
    malformed, decides anything about the file's columns)."""
    with (remote[0].open_input_stream(remote[1]) if remote else open(path, "rb")) as handle:
        first = handle.read(_MAX_HEADER_BYTES).split(b"\n", 1)[0].rstrip(b"\r")
    try:
        line = first.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"input file {path} is not a readable csv file: its header is not UTF-8 ({_short(exc)})") \
            from exc
    return next(csv.reader([line]), [])


_MAX_HEADER_BYTES = 1 << 20


def _remote(path: str | Path) -> tuple[pafs.FileSystem, str] | None:
    """``(filesystem, path inside it)`` for a URI (``gs://``, ``s3://``, ...); None for a local path."""
    if not isinstance(path, str) or "://" not in path:
        return None
    try:
        return pafs.FileSystem.from_uri(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputFileError(f"input file {path}: cannot open its file system: {_short(exc)}") from exc


def _remote_is_file(path: str, remote: tuple[pafs.FileSystem, str]) -> bool:
    try:
        return remote[0].get_file_info(remote[1]).type == pafs.FileType.File
    except (pa.ArrowException, OSError) as exc:
        raise InputFileError(f"input file {path}: cannot read its metadata: {_short(exc)}") from exc


def _short(exc: BaseException) -> str:
    """The first line of an error, printable characters only, at most 200 of them (a binary
    file read as CSV puts its raw bytes in the parser's message)."""
    lines = str(exc).splitlines()
    text = "".join(c if c.isprintable() else "?" for c in (lines[0] if lines else type(exc).__name__))
    return text if len(text) <= 200 else text[:200] + "..."


def _check_header(path: str | Path, schema: pa.Schema) -> None:
    names = schema.names
    has_time = [name for name in ("day", "event_time") if name in names]
    if "user_id" not in names or len(has_time) != 1:
        need = "no 'user_id' column" if "user_id" not in names else (
            "no 'day' or 'event_time' column" if not has_time else "both 'day' and 'event_time'")
        raise InputFileError(
            f"input file {path} has {need}; columns found: {names[:20]}{' ...' if len(names) > 20 else ''}. "
            "An indicator file needs 'user_id' and exactly one of 'day' or 'event_time' (check its header)"
        )


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # continuation marker + zero length


def _ipc_batches(path: str | Path, source: pa.NativeFile,
                 batch_rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    try:
        reader = ipc.open_file(source)
        schema = reader.schema
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        size = source.size()
        source.seek(max(size - len(_END_OF_STREAM), 0))
        if source.read(len(_END_OF_STREAM)) != _END_OF_STREAM:
            source.close()
            raise InputFileError(
                f"input file {path} is not a readable ipc file: it has neither an Arrow IPC file footer "
                "nor an end-of-stream marker (cut short, or not an Arrow file at all)"
            ) from None
        source.seek(0)
        stream = ipc.open_stream(source)
        schema, batches = stream.schema, iter(stream)
    return schema, _split(source, batches, batch_rows)


def _split(source: pa.NativeFile, batches: Iterator[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    with source:
        for batch in batches:
            yield from pa.Table.from_batches([batch]).to_batches(max_chunksize=batch_rows)
