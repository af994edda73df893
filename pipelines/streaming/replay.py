"""``--replay``: files, each one message, for a local run or a replay, under any runner. A file's
name is its path (a path given again is a second delivery, named apart: :func:`replay_names`), its
number its place in ``--replay`` (:func:`replay_numbers`). Each file's structure is checked at
launch as the daily job checks its inputs (:func:`check_replay`, :func:`refuse_unreplayable`): a file
a live source's message would only dead-letter whole is refused, naming it. A file is read where
the job runs (:func:`_replayed_file`), one element per file. Imports no Beam."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Sequence

import pyarrow as pa

from renyi_stream.pipelines.beam import job_options as launch
from renyi_stream.pipelines.beam import object_store as store
from renyi_stream.pipelines.streaming.codec import decode_message, encode_message
from renyi_stream.stream.contract import InputContract
from renyi_stream.stream.engine.readers import (FORMATS, InputFileError, MalformedLines, check_declared_schema,
                                                 read_batches)
from renyi_stream.stream.schema import DEFAULT_KEYS, InputKeys, SchemaError, WindowSpec, validate_batch


def _replayed_file(item: tuple[str, str] | str, keys: InputKeys = DEFAULT_KEYS) -> tuple[str, bytes]:
    """A ``--replay`` file as a message: ``(its message name, its bytes)``. ``item`` is ``(name,
    path)`` (:func:`replay_names`: the path, or for a path given again the path and its place in
    ``--replay``), or a bare path, its own name.

    A message file (an Arrow IPC stream, as :func:`encode_message` writes, by any other name) is
    replayed as it is. A file the daily job reads, named as such (``.parquet``, ``.csv``, an Arrow
    IPC *file* ``.arrow``/``.feather``/``.ipc``), is read by the batch jobs' reader
    (:func:`renyi_stream.stream.engine.readers.read_batches`, the same row-by-row rules) and replayed as one
    message of its rows, so the same day files feed every job. A file that is neither, or that does
    not hold the contract's columns, and a CSV line the reader cannot read, are refused at launch
    (:func:`refuse_unreplayable`), never dropped or dead-lettered here. ``keys``: the id and time
    columns' names the ledger's contract declares (the message keeps the file's own names; the
    validator reads them by these)."""
    name, path = (item, item) if isinstance(item, str) else (str(item[0]), str(item[1]))
    with store.open_input(path) as handle:
        payload = handle.read()
    if not _is_day_file(path, payload):
        return name, payload
    return name, encode_message(pa.Table.from_batches(list(read_batches(path, malformed=MalformedLines(),
                                                                        keys=keys))))


def _is_day_file(path: str, head: bytes) -> bool:
    """Whether ``path`` is a file of the batch jobs' formats rather than a message: named as one,
    and, for an Arrow IPC name, in the IPC *file* format (which opens with ``ARROW1``)."""
    kind = FORMATS.get(PurePosixPath(str(path)).suffix.lower())
    return kind in ("parquet", "csv") or (kind == "ipc" and head[:6] == b"ARROW1")


def refuse_unreplayable(paths: Sequence[str], *, window: WindowSpec = WindowSpec(),
                        indicator_columns: Sequence[str] | None = None, category_columns: Sequence[str] = (),
                        id_type: str | None = None, contract: InputContract | None = None) -> None:
    """RunRefused, before anything is charged or published, naming the file (and the column), for a
    ``--replay`` file the daily job would refuse or the job could only dead-letter whole: a replay
    is files the operator names, so the structure of each is checked at launch, as the daily job
    checks its inputs, and a wrong file never becomes one ``undecodable_message`` dead letter with
    its day published from nothing (issue 37). Refused:

    * a day file (:func:`_is_day_file`) the batch jobs' reader refuses (not its format, no
      ``user_id``, ...), or a CSV with a line it cannot read: a message is dead-lettered whole, so
      such a line would take the file's other rows with it; the daily job (``renyi-stream run``)
      dead-letters it alone;
    * any other file that is not one whole Arrow IPC stream message (:func:`decode_message`: not
      Arrow, cut short, a view type, past :data:`MAX_MESSAGE_DECODED_BYTES`);
    * a file whose header lacks a column of the declared ``contract``, repeats a column name or
      writes a declared column in a type no value of could parse: the daily job's check,
      :func:`renyi_stream.stream.engine.readers.check_declared_schema`;
    * a file whose columns the validator refuses as a whole (no time column, an id column of no id
      type, an indicator or category column it lacks: :func:`renyi_stream.stream.schema.validate_batch`
      on the file's header with no row, with the arguments
      :class:`renyi_stream.pipelines.streaming.codec.MessageValidator` gives it).

    Every decision is the files' names, formats and headers', never a row's. A live source
    (Kafka, Pub/Sub) cannot be checked before it runs: there such a message stays one dead letter.
    The id and time columns are those ``contract`` names (``--id-column``, ``--day-column``,
    ``--event-time-column``; without a contract, ``user_id`` and ``day``/``event_time``)."""
    keys = contract.keys if contract is not None else DEFAULT_KEYS
    for path in paths:
        with store.open_input(path) as handle:
            head = handle.read(6)
        if _is_day_file(path, head):
            malformed, schema = MalformedLines(), None
            try:
                for batch in read_batches(path, malformed=malformed, keys=keys):
                    schema = batch.schema if schema is None else schema
            except InputFileError as exc:
                raise launch.RunRefused(f"--replay: {exc}") from None
            if len(malformed):
                line, _, why = next(iter(malformed))
                raise launch.RunRefused(
                    f"--replay: {path} has {len(malformed):,} line(s) the reader cannot read (line {line}: {why}); a "
                    "replayed file is one message, dead-lettered whole: fix the file, or run it with renyi-stream "
                    "run, which dead-letters each such line alone")
            where = f"input file {path}"
        else:
            with store.open_input(path) as handle:
                payload = handle.read()
            try:
                schema = decode_message(payload).schema
            except ValueError as exc:
                raise launch.RunRefused(
                    f"--replay: {path} is not a file the daily job reads (.parquet, .csv, an Arrow IPC file .arrow), "
                    f"and as a message (an Arrow IPC stream) it cannot be read: {exc}") from None
            where = f"replayed message {path}"
        if schema is None:
            continue
        try:
            if contract is not None:
                check_declared_schema(schema, contract, where=where)
            validate_batch(schema.empty_table(), window=window, indicator_columns=indicator_columns,
                           category_columns=category_columns, id_type=id_type, keys=keys)
        except InputFileError as exc:
            raise launch.RunRefused(f"--replay: {exc}") from None
        except SchemaError as exc:
            raise launch.RunRefused(f"--replay: {where}: {exc}") from None


def replay_names(paths: Sequence[str]) -> list[str]:
    """The message name of each ``--replay`` file, in order: its path, and for a path given again
    (a message delivered twice) the path and its place, ``"<path> (again, --replay file <k>)"``
    (``k`` from 1). Each delivery is then a message of its own, with its own read record and dead
    letters (the curator's files are named by their content: two deliveries of one name would be
    counted once while both reach the filter, issue 37), and the same on every restart."""
    names: list[str] = []
    seen = {str(path) for path in paths}
    for index, path in enumerate(paths):
        name = str(path)
        if name in names:
            name = f"{path} (again, --replay file {index + 1})"
            while name in seen or name in names:  # a file really named so: longer, never the same
                name += "'"
        names.append(name)
    return names


def replay_numbers(paths: Sequence[str]) -> dict[str, int]:
    """``message name -> its index in --replay`` (:func:`replay_names`): the number of each
    replayed file's rows, so that of two rows of one (user, window) the one replayed first counts,
    as the batch jobs keep their first input's; a path given again is a delivery of its own, whose
    rows come after the first delivery's (and are dead-lettered ``duplicate_user_window``, as the
    daily job does for a file given twice)."""
    return {name: index for index, name in enumerate(replay_names(paths))}


def check_replay(paths: Sequence[str], *, window: WindowSpec, indicator_columns: Sequence[str],
                 category_columns: Sequence[str], id_type: str | None, contract: InputContract | None) -> None:
    """RunRefused, before anything is charged or published, when a ``--replay`` file does not exist
    (naming the first five) or is one :func:`refuse_unreplayable` refuses."""
    missing = [path for path in paths if not store.exists(path)]
    if missing:
        raise launch.RunRefused(f"--replay: no such file: {', '.join(missing[:5])}"
                                + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))
    refuse_unreplayable(paths, window=window, indicator_columns=indicator_columns, category_columns=category_columns,
                        id_type=id_type, contract=contract)
