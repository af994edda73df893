"""Read indicator files as Arrow record batches: Parquet, Arrow IPC (file or stream) and CSV.

The format is chosen by extension (``.parquet``/``.pq``, ``.arrow``/``.feather``/``.ipc``,
``.csv``). A file that cannot be read as its extension says raises :class:`InputFileError`
naming the file, before any of it is charged. So does a file whose header lacks ``user_id`` or
does not have exactly one of ``day`` and ``event_time`` (a CSV with a wrong header), or lacks the
id or time column a contract declares by another name (``keys``,
:class:`renyi_stream.stream.schema.InputKeys`: ``--id-column``, ``--day-column``,
``--event-time-column``), and an
Arrow IPC *stream* without its end-of-stream marker (cut short, possibly exactly between two
batches, where the format itself cannot tell). A file with a valid header and no rows yields
one empty batch, so that its schema can be read (an empty day is a valid input).

A CSV declares no column types, so its values are not typed by what they look like: every
column but ``user_id`` is read as text (``day``/``event_time`` and the indicators alike), and
which indicators are numbers is decided from public information (:mod:`renyi_stream.stream.columns`), the
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
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from renyi_stream.stream.contract import InputContract

from renyi_stream.stream.schema import DEFAULT_KEYS, InputKeys

import numpy as np

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


class MalformedLines:
    """The malformed CSV lines a read has found and its caller has not yet taken: each a line
    number, its first 256 characters (bytes that are not UTF-8 replaced) and why it is malformed.

    Held as Arrow columns in parts of at most :data:`_MALFORMED_PART` lines, so a file of
    millions of bad lines costs tens of bytes a line, not a Python tuple's hundreds; a caller
    that :meth:`drain` s it after every batch :func:`read_batches` yields holds at most one read
    chunk's bad lines (the reader yields an empty batch after a chunk of only bad lines, so that
    it can)."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []
        self._open: tuple[list[int], list[str], list[str]] = ([], [], [])
        self._count = 0

    def note(self, line: int, raw: bytes | str, why: str) -> None:
        """Record one malformed line (``line`` is its number, the header's being 1)."""
        text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
        lines, texts, whys = self._open
        lines.append(line)
        texts.append(text[:256])
        whys.append(why)
        self._count += 1
        if len(lines) >= _MALFORMED_PART:
            self._close_part()

    def _close_part(self) -> None:
        lines, texts, whys = self._open
        if lines:
            self._parts.append(pa.table({"line": pa.array(lines, pa.int64()), "raw": pa.array(texts, pa.string()),
                                         "why": pa.array(whys, pa.string()).dictionary_encode()}))
            self._open = ([], [], [])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[int, str, str]]:
        """The lines held, by line number, as ``(line, raw, why)``."""
        self._close_part()
        if self._parts:
            part = pa.concat_tables(self._parts).sort_by("line")
            yield from zip(part.column("line").to_pylist(), part.column("raw").to_pylist(),
                           part.column("why").to_pylist())

    def drain(self) -> pa.Table:
        """The lines held (columns ``line``, ``raw``, ``why``, by line number), now no longer held."""
        self._close_part()
        parts, self._parts, self._count = self._parts, [], 0
        if not parts:
            return pa.table({"line": pa.array([], pa.int64()), "raw": pa.array([], pa.string()),
                             "why": pa.array([], pa.string()).dictionary_encode()})
        return (pa.concat_tables(parts) if len(parts) > 1 else parts[0]).sort_by("line")


#: How many malformed lines :class:`MalformedLines` gathers as Python objects before packing
#: them into Arrow columns.
_MALFORMED_PART = 65_536


def read_batches(path: str | Path, *, batch_rows: int = 65_536, malformed: MalformedLines | None = None,
                 keys: InputKeys | None = DEFAULT_KEYS) -> Iterator[pa.RecordBatch]:
    """Yield the file's rows as record batches of at most ``batch_rows`` rows (at least one
    batch, empty when the file has no rows), as the file names its columns.

    ``keys`` (a declared contract's, :class:`renyi_stream.stream.schema.InputKeys`) names the id
    and time columns the header must hold (default ``user_id`` and one of ``day``/``event_time``):
    a header without them is :class:`InputFileError` naming the file, the column and the option.
    ``keys=None`` reads a header whose id and time columns are not known yet (a launcher reading
    the first input before it knows the ledger's contract), checking them later.

    A CSV line that is not one record of the header's fields is one bad row, not a bad file: with
    ``malformed`` (:class:`MalformedLines`, the caller's) each such line is skipped and noted
    there, for the caller to dead-letter; without it, such a line raises
    :class:`InputFileError` as any unreadable file. The reader notes a chunk's bad lines before
    it yields the chunk's rows, and yields an empty batch after a chunk of only bad lines, so a
    caller that drains ``malformed`` after each batch never holds more than a chunk's."""
    kind = file_format(path)
    remote = _remote(path)
    if not (_remote_is_file(path, remote) if remote else Path(path).is_file()):
        raise InputFileError(f"input file {path} does not exist")
    try:
        if kind == "parquet":
            reader = pq.ParquetFile(remote[0].open_input_file(remote[1]) if remote else path)
            _check_header(path, reader.schema_arrow, keys)
            batches: Iterator[pa.RecordBatch] = reader.iter_batches(batch_size=batch_rows)
            schema = reader.schema_arrow
        elif kind == "ipc":
            source = remote[0].open_input_file(remote[1]) if remote else pa.memory_map(str(path))
            schema, batches = _ipc_batches(path, source, batch_rows)
            _check_header(path, schema, keys)
        else:
            names = _csv_header(path, remote)
            schema = pa.schema([(name, pa.string()) for name in names])
            _check_header(path, schema, keys)
            source = remote[0].open_input_stream(remote[1]) if remote else open(path, "rb")
            batches = _csv_batches(source, names, batch_rows, malformed, path)
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            yield pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"input file {path} is not a readable {kind} file: {_short(exc)}") from exc


#: The longest CSV line read, in bytes: a longer one is one malformed row (it never grows a
#: buffer without bound, and never refuses the file).
MAX_LINE_BYTES = 1 << 20
_CHUNK_BYTES = 8 << 20
_NEWLINE, _QUOTE, _CR, _COMMA = 10, 34, 13, 44


def _csv_batches(source: Any, names: list[str], batch_rows: int, malformed: MalformedLines | None,
                 path: str | Path) -> Iterator[pa.RecordBatch]:
    """The data lines of a CSV (after its header line) as batches of text columns.

    Each line is one record: it is split on ``\\n`` first, so a quote never spans lines. A line
    that is not UTF-8, is longer than :data:`MAX_LINE_BYTES`, has an unbalanced quote or does not
    split into the header's fields is one malformed row, appended to ``malformed`` as ``(line
    number or -1, text, why)`` (without ``malformed``: :class:`InputFileError`). Blank lines are
    no rows. Vectorised per chunk of lines; only a chunk whose lines the CSV parser does not map
    one to one (a stray carriage return, a quote inside an unquoted field) is split line by line."""
    header_seen = False
    line_no = 0  # lines consumed so far, the header's included
    pending = b""
    skipping = False  # inside a line already reported as too long
    with source:
        while True:
            chunk = source.read(_CHUNK_BYTES)
            if skipping:  # drop the too-long line up to its newline
                nl = chunk.find(b"\n")
                if nl < 0:
                    if chunk:
                        continue
                    break  # the file ends inside the too-long line
                chunk, skipping, line_no = chunk[nl + 1:], False, line_no + 1
                if not chunk:  # the line ended a chunk exactly: the file may go on (an empty chunk is no end)
                    continue
            data = pending + chunk
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            lines, pending = data[:cut], data[cut:]
            if lines and not header_seen:
                end = lines.index(b"\n") + 1 if b"\n" in lines else len(lines)
                lines, header_seen, line_no = lines[end:], True, line_no + 1
            if lines:
                bad_before = len(malformed) if malformed is not None else 0
                table, used = _csv_lines(lines, names, line_no, malformed, path)
                line_no += used
                if table.num_rows:
                    yield from table.to_batches(max_chunksize=batch_rows)
                elif malformed is not None and len(malformed) > bad_before:
                    # no rows, only bad lines: an empty batch, for the caller to drain them
                    yield pa.RecordBatch.from_arrays([pa.array([], pa.string()) for _ in names], names=names)
            # No newline in sight: one bad row, never a growing buffer (one byte more than the limit may
            # be the carriage return of a CRLF whose newline is in the next chunk: that line is not too long)
            if len(pending) > MAX_LINE_BYTES + 1:
                _bad(malformed, path, line_no + 1, pending[:256], f"longer than {MAX_LINE_BYTES} bytes")
                pending, skipping = b"", True
            if not chunk:
                break


def _bad(malformed: MalformedLines | None, path: str | Path, line: int, raw: bytes | str,
         why: str) -> None:
    if malformed is None:
        raise InputFileError(f"input file {path} is not a readable csv file: line {line} is {why}")
    malformed.note(line, raw, why)


def _csv_lines(data: bytes, names: list[str], first_line: int, malformed: MalformedLines | None,
               path: str | Path) -> tuple[pa.Table, int]:
    """Parse whole lines ``data`` (numbered from ``first_line + 1``): the table of the good ones,
    in line order, and how many lines ``data`` held.

    A line without quotes is split on commas (vectorised: its field count is its commas plus
    one, and the CSV parser reads it with quoting off, so it is exactly one record); a line with
    quotes is read on its own by Python's csv module (strict), so its quotes cannot reach
    another line. A carriage return inside a line is malformed (the parser would end a record
    there)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NEWLINE)
    if not len(data) or buf[-1] != _NEWLINE:  # the file's last line, without its newline
        ends = np.append(ends, len(data))
    starts = np.concatenate(([0], ends[:-1] + 1))
    stops = ends - ((ends > starts) & (buf[np.maximum(ends - 1, 0)] == _CR))  # CRLF: the CR is no data
    numbers = first_line + 1 + np.arange(len(starts))

    def per_line(byte: int) -> np.ndarray:
        seen = np.concatenate(([0], np.cumsum(buf == byte, dtype=np.int32)))  # a chunk is < 2**31 bytes
        return seen[stops] - seen[starts]

    long = (stops - starts) > MAX_LINE_BYTES
    blank = stops == starts
    carriage = (per_line(_CR) > 0) & ~long
    bad = long | carriage
    bad |= _undecodable(data, starts, stops) & ~bad
    for i in np.flatnonzero(bad):
        why = (f"longer than {MAX_LINE_BYTES} bytes" if long[i] else
               "a line with a carriage return inside it" if carriage[i] else "not UTF-8 text")
        _bad(malformed, path, int(numbers[i]), data[starts[i]:min(stops[i], starts[i] + 256)], why)
    quoted = (per_line(_QUOTE) > 0) & ~bad & ~blank
    plain = ~(bad | blank | quoted)
    fields = per_line(_COMMA) + 1  # once per chunk: never once per bad line (that was quadratic)
    wrong = plain & (fields != len(names))
    for i in np.flatnonzero(wrong):
        _bad(malformed, path, int(numbers[i]), data[starts[i]:stops[i]],
             f"{int(fields[i])} fields, not the header's {len(names)}")
    plain &= ~wrong
    parts, order = [], []
    if plain.any():
        line_of_byte = np.concatenate(([0], np.cumsum(buf[:-1] == _NEWLINE)))
        good = buf[plain[line_of_byte] & (buf != _CR)].tobytes()
        good += b"" if good.endswith(b"\n") else b"\n"
        # Arrow's parser drops a byte order mark at the start of its input: a first line of empty
        # fields, dropped below, keeps a data line's own BOM whether or not it comes first here.
        good = b"," * (len(names) - 1) + b"\n" + good
        parts.append(pacsv.read_csv(
            pa.BufferReader(good),
            read_options=pacsv.ReadOptions(column_names=names, block_size=len(good) + 1024),
            parse_options=pacsv.ParseOptions(quote_char=False, newlines_in_values=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                 strings_can_be_null=False)).slice(1))
        order.append(np.flatnonzero(plain))
    if quoted.any():
        table, kept = _quoted_lines(data, starts, stops, numbers, np.flatnonzero(quoted), names, malformed, path)
        parts.append(table)
        order.append(kept)
    if not parts:
        return _text_table(names, [[] for _ in names]), len(starts)
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        table = table.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))
    return table, len(starts)


def _undecodable(data: bytes, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Per line, whether it is not UTF-8, in time linear in ``data`` however many lines are bad.

    One strict decode of the whole chunk; only when it fails, one decode with ``surrogateescape``
    (each byte that is not part of valid UTF-8 becomes one lone surrogate U+DC80..U+DCFF, which no
    valid UTF-8 gives, and a newline byte always stays a newline), whose code points are mapped to
    their lines. (Resuming a strict decode after each bad line was quadratic: each error copies
    the rest of the chunk into the exception.)"""
    bad = np.zeros(len(starts), dtype=bool)
    try:
        data.decode("utf-8")
        return bad
    except UnicodeDecodeError:
        pass
    points = np.frombuffer(data.decode("utf-8", "surrogateescape").encode("utf-32-le", "surrogatepass"),
                           dtype=np.uint32)
    line_of_point = np.concatenate(([0], np.cumsum(points[:-1] == _NEWLINE)))
    escaped = (points >= 0xDC80) & (points <= 0xDCFF)
    bad[np.unique(line_of_point[escaped])] = True
    return bad


def _quoted(name: str) -> bytes:
    return ('"' + name.replace('"', '""') + '"').encode("utf-8")


def _text_table(names: list[str], columns: list[list[str]]) -> pa.Table:
    return pa.Table.from_arrays([pa.array(c, pa.string()) for c in columns], names=names) if names else pa.table({})


def _quoted_lines(data: bytes, starts: np.ndarray, stops: np.ndarray, numbers: np.ndarray, lines: np.ndarray,
                  names: list[str], malformed: MalformedLines | None,
                  path: str | Path) -> tuple[pa.Table, np.ndarray]:
    """The lines ``lines`` (indices) that hold quotes, each read as one CSV record on its own: the
    table of the good ones and their indices."""
    columns: list[list[str]] = [[] for _ in names]
    kept = []
    for i in lines:
        text = data[starts[i]:stops[i]].decode("utf-8")
        try:
            fields = next(csv.reader([text], strict=True))
        except csv.Error as exc:
            _bad(malformed, path, int(numbers[i]), text, f"not one CSV record: {exc} (a field's quotes must open "
                 "and close on its own line)")
            continue
        if len(fields) != len(names):
            _bad(malformed, path, int(numbers[i]), text, f"{len(fields)} fields, not the header's {len(names)}")
            continue
        for column, value in zip(columns, fields):
            column.append(value)
        kept.append(i)
    return _text_table(names, columns), np.asarray(kept, dtype=np.int64)


def check_declared_columns(path: str | Path, contract: "InputContract") -> None:
    """InputFileError, naming the file and the column, when its header cannot hold the declared
    contract (:mod:`renyi_stream.stream.contract`): the id or time column it declares (by the
    contract's names, ``--id-column``, ``--day-column``, ``--event-time-column``) or a declared
    indicator column it lacks, a column name it repeats, or a
    declared column whose type no value of could parse (a number written as a list, binary or
    struct column; a category written as anything but text). Structural faults of the file, seen
    in its header before anyone is charged; a value that does not parse is that row's dead letter.
    The header is checked by :func:`check_declared_schema`."""
    schema = next(read_batches(path, batch_rows=1, malformed=MalformedLines(), keys=contract.keys)).schema
    check_declared_schema(schema, contract, where=f"input file {path}")


def check_declared_schema(schema: pa.Schema, contract: "InputContract", *, where: str) -> None:
    """InputFileError when the columns ``schema`` declares cannot hold ``contract``: an id or time
    column the contract names (``--id-column``, ``--day-column``/``--event-time-column``; the
    default names are the reader's and the validator's check, worded as ever), a declared column
    it lacks, a column name it repeats, a declared column of a type no value of
    could parse. The message opens with ``where`` (``"input file PATH"``, a replayed message) and
    names the column (and, for the id or time, the option). The one check of an input's header
    against the contract, for a file (:func:`check_declared_columns`) and for the streaming job's
    replayed files and messages."""
    header = schema.names
    keys = contract.keys
    shown = f"{[_short(n)[:40] for n in header[:20]]}{' ...' if len(header) > 20 else ''}"
    # The names the contract declares; the default ones are the reader's and the validator's check
    # (a file's header, a message's batch), worded as before names were declared.
    if keys.id_column != DEFAULT_KEYS.id_column and keys.id_column not in header:
        raise InputFileError(f"{where} has {keys.id_missing()}; its columns: {shown}")
    time = keys.time_of(header)
    if keys.declared_time is not None and isinstance(time, str):
        raise InputFileError(f"{where} has {time}; its columns: {shown}")
    missing = [n for n in contract.names if n not in header]
    if missing:
        raise InputFileError(f"{where} lacks the declared column(s) {missing[:20]}; its columns: "
                             f"{[_short(n)[:40] for n in header[:20]]}. Every input holds every declared column")
    repeated = sorted({n for n in header if header.count(n) > 1})
    if repeated:
        raise InputFileError(f"{where} repeats the column name(s) {[_short(n)[:40] for n in repeated[:5]]}")
    for column in contract.columns:
        t = schema.field(column.name).type
        t = t.value_type if pa.types.is_dictionary(t) else t
        text = pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view",
                                                                               lambda _: False)(t)
        number = (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                  or pa.types.is_decimal(t))
        if not (pa.types.is_null(t) or text or (number and column.kind == "number")):
            raise InputFileError(f"{where} writes the declared {column.kind} column {column.name!r} as "
                                 f"{t}, which holds no {'numbers' if column.kind == 'number' else 'text'}")


def declares_types(path: str | Path) -> bool:
    """Whether a file of this kind declares its column types (Parquet and Arrow do, in their
    schema; a CSV does not: :func:`read_batches` reads its values as text)."""
    return file_format(path) != "csv"


def id_type_of(path: str | Path, keys: InputKeys | None = DEFAULT_KEYS) -> str:
    """The user id type an input's *declared* types give a new ledger that declares none: a CSV
    declares no types, so its ids are text (``"string"``: compared byte for byte), whatever they
    look like; a Parquet or Arrow file's string id column (any string type, or a dictionary of
    strings) is ``"string"``, any other ``"int64"``.
    Never decided from values (one user's id must not change how everybody's ids are read)."""
    if not declares_types(path):
        return "string"
    from renyi_stream.stream.columns import declared_kind

    id_column = (keys or DEFAULT_KEYS).id_column  # keys None: the header's time is not checked here
    t = next(read_batches(path, batch_rows=1, malformed=MalformedLines(), keys=keys)).schema.field(id_column).type
    return "string" if declared_kind(t) == "string" else "int64"  # dictionaries by their values, string views


def _csv_header(path: str | Path, remote: tuple[pafs.FileSystem, str] | None) -> list[str]:
    """The column names of a CSV file, from its first line alone (so that no later line, however
    malformed, decides anything about the file's columns)."""
    with (remote[0].open_input_stream(remote[1]) if remote else open(path, "rb")) as handle:
        head = handle.read(_MAX_HEADER_BYTES + 1)
    first, newline, _ = head.partition(b"\n")
    if not newline and len(head) > _MAX_HEADER_BYTES:  # else its rest would be read as a data line
        raise InputFileError(f"input file {path} is not a readable csv file: its header line is longer than "
                             f"{_MAX_HEADER_BYTES} bytes")
    first = first[:-1] if first.endswith(b"\r") else first
    if b"\r" in first:
        raise InputFileError(f"input file {path} is not a readable csv file: its header line holds a carriage "
                             "return (lines ended by a lone CR are not read: end them with LF or CRLF)")
    try:
        line = first.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"input file {path} is not a readable csv file: its header is not UTF-8 ({_short(exc)})") \
            from exc
    try:
        return next(csv.reader([line]), [])
    except csv.Error as exc:
        raise InputFileError(f"input file {path} is not a readable csv file: its header is not one CSV record "
                             f"({_short(exc)})") from None


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


def _check_header(path: str | Path, schema: pa.Schema, keys: InputKeys | None = DEFAULT_KEYS) -> None:
    """InputFileError naming the file when its header lacks the id or time column ``keys`` names
    (None: not checked here)."""
    if keys is None:
        return
    names = schema.names
    time = keys.time_of(names)
    if keys.id_column not in names or isinstance(time, str):
        need = keys.id_missing() if keys.id_column not in names else time
        wanted = ("'user_id' and exactly one of 'day' or 'event_time'" if keys.is_default else
                  f"the declared columns: {keys.describe()}")
        raise InputFileError(
            f"input file {path} has {need}; columns found: {[_short(n)[:40] for n in names[:20]]}"
            f"{' ...' if len(names) > 20 else ''}. "
            f"An indicator file needs {wanted} (check its header)"
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
