"""``renyi-stream dead-letters``: the curator's dead letters, by day and reason (curator only).

Every job keeps the rows it refused as dead letters (:data:`renyi_stream.stream.engine.dead_letters.DEAD_LETTER_SCHEMA`:
source, row index, reason, detail, raw row): the daily job in its ledger's ``dead_letters``
table, the distributed job under its ``--output``'s ``dead/`` (the files its ``_COMMITTED.json``
lists), the streaming job under its ``--output``'s ``dead/``. This command reads them, never
writes: the ledger is opened read-only, a curator output is only read, and the public release
store is not touched at all. A path that does not exist is refused before anything is opened, so
nothing is created (DuckDB would create a new database file on connect).

A dead letter's *day* is the window of the row itself, read from the row the letter keeps
(``raw``): the ``window_id`` of a row dead-lettered after validation (late, out of schedule,
duplicate), else its ``day`` or ``event_time`` (or the time column the ledger's contract names:
``--day-column``, ``--event-time-column``) parsed by the validator's own rules
(:func:`renyi_stream.stream.schema.validate_batch`) with the ledger's windows. A letter whose row
has no readable time (``null_time``, ``bad_time``, a ``malformed_row`` CSV line, an
``undecodable_message``) has no day (``-``).

Dead letters hold exact rows and counts: what it prints opens with
:data:`renyi_stream.stream.private_files.CURATOR_ONLY_NOTICE` (on stderr for ``--format csv``, whose
stdout stays one CSV table).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.pipelines.cli.errors import PROG
from renyi_stream.stream.engine.dead_letters import DEAD_LETTER_SCHEMA
from renyi_stream.stream.private_files import CURATOR_ONLY_NOTICE
from renyi_stream.stream.schema import DAY, DEFAULT_KEYS, EVENT_TIME, USER_ID, WINDOW_ID, InputKeys, WindowSpec, validate_batch

__all__ = ["DEFAULT_LIMIT", "CuratorLetters", "add_dead_letters_subcommand", "by_day_and_reason",
           "curator_output_letters", "ledger_letters", "letter_rows", "letter_windows"]

#: Rows ``--rows`` prints unless ``--limit`` says otherwise.
DEFAULT_LIMIT = 50
#: A distributed run's manifests and a streaming job's state file, as those jobs name them
#: (``renyi_stream.pipelines.distributed.job.COMMITTED``/``INTENT``,
#: ``renyi_stream.pipelines.streaming.state_folder.STATE_FILE``), read here without importing Beam.
_COMMITTED, _INTENT, _STATE = "_COMMITTED.json", "_INTENT.json", "_STATE.json"
_SECONDS_PER_DAY = 86_400


class DeadLettersRefused(Exception):
    """The ledger or curator output cannot be read as asked: the message names the option and
    the path (exit status 1)."""


@dataclass(frozen=True)
class CuratorLetters:
    """One curator store's dead letters (:data:`DEAD_LETTER_SCHEMA`), the windows its rows were
    charged in (``window``), the store's name for messages (``where``) and the names of the id and
    time columns its ledger's contract declares (``keys``: a letter's row names them so)."""

    letters: pa.Table
    window: WindowSpec
    where: str
    keys: InputKeys = DEFAULT_KEYS


# --------------------------------------------------------------------------- reading


def ledger_letters(path: str | os.PathLike) -> CuratorLetters:
    """The dead letters of the daily job's ledger ``path``, in the order the runs wrote them (run,
    source, row), with the ledger's windows.

    Opens the ledger read-only, with no spill folder, so nothing is written or created anywhere
    (a read larger than memory fails rather than spill). :class:`DeadLettersRefused` naming
    ``--ledger`` for a path that does not exist (checked first: nothing is created), a folder, a
    ledger that group/others may read, a file that is not a ledger (the public release store), or
    one that cannot be opened (a run holding it)."""
    import duckdb

    from renyi_stream.pipelines.curator.store import CuratorStoreError, refuse_a_shared_ledger
    from renyi_stream.stream.engine.ledger_config import LedgerConfig, LedgerConfigError

    path = Path(path)
    if not path.exists():
        raise DeadLettersRefused(f"argument --ledger: the ledger {path} does not exist (nothing was created)")
    if not path.is_file():
        raise DeadLettersRefused(f"argument --ledger: the ledger {path} is not a file")
    try:
        refuse_a_shared_ledger(path)
        # Read-only and without a spill folder: nothing is created beside the file, whatever it is.
        db = duckdb.connect(str(path), read_only=True, config={"temp_directory": ""})
    except CuratorStoreError as exc:
        raise DeadLettersRefused(f"argument --ledger: {exc}") from None
    except duckdb.Error as exc:
        raise DeadLettersRefused(f"argument --ledger: cannot open the ledger {path} read-only (is a run using "
                                 f"it?): {str(exc).splitlines()[0]}") from None
    try:
        tables = {name for (name,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "meta" not in tables:
            raise DeadLettersRefused(
                f"argument --ledger: {path} is not a renyi-stream ledger (no meta table)"
                + ("; it is the public release store: give the curator's ledger" if "store_meta" in tables else ""))
        try:
            params = LedgerConfig.from_meta(dict(db.execute("SELECT key, value FROM meta").fetchall()),
                                            where=f"the ledger {path}")
        except LedgerConfigError as exc:
            raise DeadLettersRefused(f"argument --ledger: {exc}") from None
        if "dead_letters" not in tables:
            letters = DEAD_LETTER_SCHEMA.empty_table()
        else:
            result = db.execute("SELECT source, row_index, reason, detail, raw FROM dead_letters "
                                "ORDER BY run_id, source, row_index").arrow()
            letters = result.read_all() if hasattr(result, "read_all") else result
    except duckdb.Error as exc:
        raise DeadLettersRefused(f"argument --ledger: the ledger {path} cannot be read: "
                                 f"{str(exc).splitlines()[0]}") from None
    finally:
        db.close()
    window = params.window if params is not None else WindowSpec()
    keys = params.contract.keys if params is not None and params.contract is not None else DEFAULT_KEYS
    return CuratorLetters(_conform(letters), window, f"the ledger {path}", keys)


def curator_output_letters(root: str | os.PathLike) -> CuratorLetters:
    """The dead letters of a distributed run's or a streaming job's curator output ``root`` (its
    ``--output``, a local folder), with the windows its ledger records.

    * A distributed run (``_COMMITTED.json``): exactly the dead-letter files its manifest lists
      (found beside the manifest when the folder was moved); a run that did not commit (an
      ``_INTENT.json`` alone) is refused: nothing it charged counts, and its files may be partial.
    * A streaming job (``_STATE.json``): every file under ``dead/``, as its row books count them.

    Only reads. :class:`DeadLettersRefused` naming ``--curator-output`` for a path that does not
    exist, an object-store URI, a folder that is neither, a listed file that is missing, or a
    curator file that group/others may read."""
    from renyi_stream.stream.private_files import PrivateFileError, refuse_if_shared

    text = os.fspath(root)
    if "://" in text:
        raise DeadLettersRefused(f"argument --curator-output: {text} is an object-store URI; this command reads a "
                                 "local folder (copy the run's output, e.g. with gsutil -m cp -r, first)")
    folder = Path(text)
    if not folder.is_dir():
        raise DeadLettersRefused(f"argument --curator-output: {folder} "
                                 + ("is not a folder" if folder.exists() else "does not exist"))
    try:
        if (folder / _COMMITTED).exists():
            refuse_if_shared(folder / _COMMITTED, "the curator manifest")
            manifest = json.loads((folder / _COMMITTED).read_text())
            files = [_listed_file(folder, name) for name in manifest.get("dead_files", [])]
            window = _window_of(manifest.get("parameters", {}), prefix="")
            keys = _keys_of(manifest.get("parameters", {}), prefix="")
            where = f"the distributed run {folder}"
        elif (folder / _INTENT).exists():
            raise DeadLettersRefused(
                f"argument --curator-output: the distributed run {folder} did not commit (it has {_INTENT} and no "
                f"{_COMMITTED}): nothing it charged counts and its dead letters may be partial; run it again")
        elif (folder / _STATE).exists():
            files = sorted((folder / "dead").glob("**/*.parquet"))
            window, keys = _streaming_window(folder)
            where = f"the streaming job {folder}"
        else:
            raise DeadLettersRefused(
                f"argument --curator-output: {folder} is not the --output of a distributed run or a streaming job "
                f"(no {_COMMITTED} or {_STATE}); for the daily job give --ledger")
        parts = []
        for file in files:
            refuse_if_shared(file, "the curator file")
            parts.append(_conform(_read_parquet(file)))
    except PrivateFileError as exc:
        raise DeadLettersRefused(f"argument --curator-output: {exc}") from None
    letters = pa.concat_tables([DEAD_LETTER_SCHEMA.empty_table(), *parts])
    return CuratorLetters(letters, window, where, keys)


def _listed_file(folder: Path, name: str) -> Path:
    path = Path(name)
    if path.exists():
        return path
    beside = folder / "dead" / path.name  # the output folder was moved since the run
    if beside.exists():
        return beside
    raise DeadLettersRefused(f"argument --curator-output: {folder / _COMMITTED} lists the dead-letter file {name}, "
                             "which is missing")


def _streaming_window(folder: Path) -> tuple[WindowSpec, InputKeys]:
    """The windows a streaming job's ledger snapshots record (daily from the epoch when it has
    none yet), and the id and time columns' names of its contract."""
    import pyarrow.parquet as pq

    for snapshot in sorted((folder / "ledger").glob("**/*.parquet")):
        metadata = {k.decode(): v.decode() for k, v in (pq.read_schema(snapshot).metadata or {}).items()}
        if "renyi_stream.window_seconds" in metadata:
            return _window_of(metadata, prefix="renyi_stream."), _keys_of(metadata, prefix="renyi_stream.")
    return WindowSpec(), DEFAULT_KEYS


def _keys_of(recorded: Any, *, prefix: str) -> InputKeys:
    """The id and time columns' names of the contract a record holds (``<prefix>columns``, with
    ``<prefix>id_type``); the defaults when it records none or cannot be read (the days are then
    read from ``day``/``event_time``, as before contracts named them)."""
    from renyi_stream.stream.contract import InputContract

    try:
        columns = recorded.get(f"{prefix}columns")
        if columns is None:
            return DEFAULT_KEYS
        return InputContract.from_columns_json(str(recorded.get(f"{prefix}id_type", "string")), str(columns)).keys
    except (ValueError, AttributeError):
        return DEFAULT_KEYS


def _window_of(recorded: Any, *, prefix: str) -> WindowSpec:
    try:
        return WindowSpec(length_seconds=int(recorded.get(f"{prefix}window_seconds", _SECONDS_PER_DAY)),
                          origin_seconds=int(recorded.get(f"{prefix}origin_seconds", 0)))
    except (TypeError, ValueError, AttributeError):
        return WindowSpec()


def _read_parquet(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path)


def _conform(table: pa.Table) -> pa.Table:
    """``table``'s dead-letter columns as :data:`DEAD_LETTER_SCHEMA`."""
    return pa.table([table.column(f.name).cast(f.type) for f in DEAD_LETTER_SCHEMA], schema=DEAD_LETTER_SCHEMA)


# --------------------------------------------------------------------------- each letter's day


def letter_windows(letters: pa.Table, window: WindowSpec, keys: InputKeys = DEFAULT_KEYS) -> pa.Array:
    """The window (int64) of each dead letter's own row, null where the row has no readable time.

    From the row the letter keeps (``raw``, JSON): its ``window_id`` (a row dead-lettered after
    validation), else its time column (``keys``: the contract's ``--day-column`` or
    ``--event-time-column``; by default ``day`` or ``event_time``) parsed by
    :func:`validate_batch`'s rules with ``window``; a letter whose ``raw`` is no JSON object (a CSV
    line, a message's bytes) has none. Vectorised (DuckDB's JSON functions, then the validator):
    no Python per letter."""
    import duckdb

    n = letters.num_rows
    if n == 0:
        return pa.array([], pa.int64())
    if keys.day_column is not None:
        times = ((keys.day_column, DAY),)
    elif keys.event_time_column is not None:
        times = ((keys.event_time_column, EVENT_TIME),)
    else:
        times = ((DAY, DAY), (EVENT_TIME, EVENT_TIME))
    db = duckdb.connect()  # in memory: nothing is written anywhere
    try:
        db.register("letters", pa.table({"raw": letters.column("raw")}))
        fields = db.execute(
            "SELECT CASE WHEN json_valid(raw) THEN TRY_CAST(json_extract_string(raw, '$.window_id') AS BIGINT) END"
            + "".join(", CASE WHEN json_valid(raw) THEN json_extract_string(raw, ?) END" for _ in times)
            + " FROM letters", [_json_path(name) for name, _ in times]).arrow()
        fields = fields.read_all() if hasattr(fields, "read_all") else fields
    finally:
        db.close()
    windows = fields.column(0).combine_chunks().cast(pa.int64())
    for k, (_, kind) in enumerate(times, start=1):
        text = fields.column(k).combine_chunks().cast(pa.string())
        parsed = _parsed_windows(text, kind, window)
        windows = pc.coalesce(windows, parsed)
    return windows


def _json_path(name: str) -> str:
    """The JSON path of the top-level key ``name``, quoted (a column name may hold dots, spaces)."""
    return '$."' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parsed_windows(text: pa.Array, time_column: str, window: WindowSpec) -> pa.Array:
    """The window of each time in ``text`` as the validator reads a ``time_column`` string, null
    where it is null or does not parse."""
    n = len(text)
    rows = np.arange(n, dtype=np.int64)
    probe = pa.table({USER_ID: pa.array(rows), time_column: text, "_": pa.array(np.zeros(n))})
    valid = validate_batch(probe, window=window, indicator_columns=["_"]).valid
    out = np.zeros(n, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    at = valid.column(USER_ID).to_numpy()
    out[at] = valid.column(WINDOW_ID).to_numpy()
    found[at] = True
    return pa.array(out, pa.int64(), mask=~found)


def _window_days(windows: pa.Array, window: WindowSpec) -> pa.Array:
    """Each window's start as text: its UTC date for windows of whole days from midnight, else its
    UTC start time; null for a null window."""
    known = np.asarray(windows.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    ids = np.asarray(pc.fill_null(windows, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    starts = np.asarray(window.window_start_seconds(ids), dtype=np.int64)
    whole_days = window.length_seconds % _SECONDS_PER_DAY == 0 and window.origin_seconds % _SECONDS_PER_DAY == 0
    stamps = pa.array(starts, pa.int64()).cast(pa.timestamp("s"))
    text = pc.strftime(stamps, format="%Y-%m-%d" if whole_days else "%Y-%m-%dT%H:%M:%SZ")
    return pc.if_else(pa.array(known), text, pa.scalar(None, pa.string()))


# --------------------------------------------------------------------------- what is printed


def by_day_and_reason(found: CuratorLetters, windows: pa.Array | None = None) -> pa.Table:
    """One row per (window of the rows, reason): ``day`` (the window's date), ``window_id``,
    ``reason`` and ``letters`` (how many); by window (rows without a day last), then reason.
    ``windows``: :func:`letter_windows` of ``found``, when already computed."""
    windows = letter_windows(found.letters, found.window, found.keys) if windows is None else windows
    keyed = pa.table({WINDOW_ID: windows, "reason": found.letters.column("reason")})
    counted = keyed.group_by([WINDOW_ID, "reason"]).aggregate([("reason", "count")])
    counted = counted.take(_order(counted, [_DAYLESS_LAST, "reason"]))
    ids = counted.column(WINDOW_ID).combine_chunks()
    return pa.table({"day": _window_days(ids, found.window), WINDOW_ID: ids,
                     "reason": counted.column("reason"),
                     "letters": counted.column("reason_count").cast(pa.int64())})


def letter_rows(found: CuratorLetters, limit: int, windows: pa.Array | None = None) -> pa.Table:
    """The first ``limit`` dead letters by window (rows without a day last), source and row
    index: ``day``, ``window_id``, ``source``, ``row_index``, ``reason``, ``detail`` (never
    ``raw``: the detail names the column and the value at fault). ``windows`` as for
    :func:`by_day_and_reason`."""
    windows = letter_windows(found.letters, found.window, found.keys) if windows is None else windows
    table = found.letters.drop_columns(["raw"]).append_column(WINDOW_ID, windows)
    table = table.take(_order(table, [_DAYLESS_LAST, "source", "row_index"]).slice(0, limit))
    ids = table.column(WINDOW_ID).combine_chunks()
    return pa.table({"day": _window_days(ids, found.window), WINDOW_ID: ids,
                     **{name: table.column(name) for name in ("source", "row_index", "reason", "detail")}})


_DAYLESS_LAST = "_window_or_last"


def _order(table: pa.Table, keys: list[str]) -> pa.Array:
    """The row order of ``table`` by ``keys`` ascending, where :data:`_DAYLESS_LAST` is its window
    with the letters that have none after every window."""
    last = pa.scalar(np.iinfo(np.int64).max, pa.int64())
    keyed = table.append_column(_DAYLESS_LAST, pc.fill_null(table.column(WINDOW_ID), last))
    return pc.sort_indices(keyed, sort_keys=[(key, "ascending") for key in keys])


def _text_table(table: pa.Table) -> str:
    """``table`` as aligned text, every row (a null as ``-``)."""
    names = table.column_names
    rows = [["-" if v is None else str(v) for v in row.values()] for row in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def _csv(table: pa.Table) -> str:
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer)
    return buffer.getvalue().decode()


def _fail(message: str, status: int) -> int:
    print(f"{PROG} dead-letters: error: {message}", file=sys.stderr)
    if status == 2:
        raise SystemExit(2)
    return status


def _dead_letters_command(args: argparse.Namespace) -> int:
    if args.limit is not None and not args.rows:
        return _fail(f"argument --limit: applies only with --rows, got --limit {args.limit} without --rows", 2)
    limit = DEFAULT_LIMIT if args.limit is None else args.limit
    if limit < 1:
        return _fail(f"argument --limit: must be a positive number of rows, got --limit {limit}", 2)
    try:
        found = ledger_letters(args.ledger) if args.ledger is not None else curator_output_letters(args.curator_output)
    except DeadLettersRefused as exc:
        return _fail(str(exc), 1)
    windows = letter_windows(found.letters, found.window, found.keys)
    summary = by_day_and_reason(found, windows)
    rows = letter_rows(found, limit, windows) if args.rows else None
    total = found.letters.num_rows
    if args.format == "json":
        document: dict[str, Any] = {"notice": CURATOR_ONLY_NOTICE, "from": found.where, "letters": total,
                                    "by_day_and_reason": summary.to_pylist()}
        if rows is not None:
            document.update(rows=rows.to_pylist(), rows_shown=rows.num_rows)
        print(json.dumps(document, indent=2))
        return 0
    if args.format == "csv":
        print(CURATOR_ONLY_NOTICE, file=sys.stderr)  # stdout stays one CSV table
        sys.stdout.write(_csv(rows if rows is not None else summary))
        return 0
    print(CURATOR_ONLY_NOTICE)
    if not total:
        print(f"no dead letters in {found.where}")
        return 0
    print(f"dead letters in {found.where}: {total:,}, by day of the row and reason")
    sys.stdout.write(_text_table(summary))
    if any(v is None for v in summary.column(WINDOW_ID).to_pylist()):
        print('("-": the row has no readable day: a null or unparseable time, a CSV line or message that did '
              'not split)')
    if rows is not None:
        more = f" of {total:,} (--limit {limit})" if total > rows.num_rows else ""
        print(f"\nthe dead letters, {rows.num_rows:,}{more}, by day, source and row:")
        sys.stdout.write(_text_table(rows))
    return 0


def add_dead_letters_subcommand(sub: Any) -> None:
    """Register ``dead-letters`` on the ``renyi-stream`` subparsers."""
    parser = sub.add_parser(
        "dead-letters", help="curator only: the rows the jobs refused (dead letters), by day and reason",
        description="Print the curator's dead letters (rows a job refused, with the reason) counted by the day of "
        "the row and the reason, and with --rows the letters themselves (source, row index, reason, detail). "
        "Read-only: the ledger is opened read-only, nothing is written, the release store is never touched. "
        "Exact counts: curator only, never publish them.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--ledger", default=None, help="the daily job's ledger (DuckDB file)")
    where.add_argument("--curator-output", "--curator_output", dest="curator_output", default=None, metavar="DIR",
                       help="instead, the --output folder of a distributed run or a streaming job (local)")
    parser.add_argument("--rows", action="store_true", help="also print the dead letters themselves")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help=f"with --rows: print at most N letters (default {DEFAULT_LIMIT})")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table",
                        help="table (default), csv (the counts, or with --rows the letters; the curator-only "
                        "notice goes to stderr) or json (one document)")
    parser.set_defaults(handler=_dead_letters_command)
