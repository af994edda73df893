"""The declared input contract: a ledger's user id type and its indicator columns, declared once,
and the names of its id and time columns.

Nothing about a row is inferred from values or from a writer's guessed types, since that would
make one user's treatment depend on other users' data (docs/architecture.md, "The input
contract"). A contract names the id type (``int64`` or ``string``) and, per indicator column,
its kind (``number`` or ``category``) and, for a number, an optional bound ``[lo, hi]``: the
clamp of the column's default sum. A numeric column without a bound gets no default query.

It also names the input's id and time columns (:class:`renyi_stream.stream.schema.InputKeys`:
``--id-column``, ``--day-column`` or ``--event-time-column``; ``"id_column"``, ``"day_column"``,
``"event_time_column"`` in a schema file), by default ``user_id`` and ``day``/``event_time``. Its
canonical text records only names that differ from those defaults, so a contract recorded before
the names existed is read as declaring the defaults, and equals a declaration of them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from renyi_stream.stream.schema import InputKeys

__all__ = ["ID_TYPES", "KEY_FIELDS", "KINDS", "ContractError", "DeclaredColumn", "InputContract", "InputKeys",
           "declaration_hint"]

#: The kinds of user id a ledger can hold (:class:`renyi_stream.stream.ledger.Ledger`).
ID_TYPES = ("int64", "string")
#: The kinds of an indicator column.
KINDS = ("number", "category")
#: Columns that are never indicators: the user and the time.
_KEYS = ("user_id", "day", "event_time", "window_id")
_MAX_NAME = 128
_MAX_COLUMNS = 4096
#: The contract's fields that name the id and time columns (a schema file's keys, the options
#: ``--id-column``, ``--day-column``, ``--event-time-column``).
KEY_FIELDS = ("id_column", "day_column", "event_time_column")
_KEY_OPTIONS = {"id_column": "--id-column", "day_column": "--day-column", "event_time_column": "--event-time-column"}


class ContractError(ValueError):
    """A declaration that is malformed, missing, or differs from the one a ledger keeps."""


@dataclass(frozen=True)
class DeclaredColumn:
    """One indicator column: ``kind`` ``"number"`` (parsed as float64) or ``"category"`` (text
    read by histograms); a number may carry the bound ``[lo, hi]`` of its default sum."""

    name: str
    kind: str = "number"
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= _MAX_NAME or not self.name.isprintable():
            raise ContractError(f"column name must be 1 to {_MAX_NAME} printable characters, got name={self.name!r}")
        if self.name in _KEYS:
            raise ContractError(f"column name {self.name!r} is reserved ({', '.join(_KEYS)}): it is no indicator")
        if self.kind not in KINDS:
            raise ContractError(f"kind of column {self.name!r} must be one of {KINDS}, got kind={self.kind!r}")
        if (self.lo is None) != (self.hi is None):
            raise ContractError(f"column {self.name!r} needs both lo and hi or neither, got lo={self.lo!r}, "
                                f"hi={self.hi!r}")
        if self.lo is not None:
            if self.kind != "number":
                raise ContractError(f"only a number column has a bound, got {self.kind} column {self.name!r} with "
                                    f"lo={self.lo!r}, hi={self.hi!r}")
            lo, hi = _finite(f"lo of column {self.name!r}", self.lo), _finite(f"hi of column {self.name!r}", self.hi)
            if not lo < hi:
                raise ContractError(f"column {self.name!r} needs lo < hi, got lo={lo!r}, hi={hi!r}")
            object.__setattr__(self, "lo", lo)
            object.__setattr__(self, "hi", hi)

    @property
    def bounded(self) -> bool:
        return self.lo is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.bounded:
            out.update(lo=self.lo, hi=self.hi)
        return out


@dataclass(frozen=True)
class InputContract:
    """A ledger's declared input: its id type, its indicator columns in declared order, and the
    names of its id and time columns (``keys``, :class:`renyi_stream.stream.schema.InputKeys`;
    default ``user_id`` and ``day``/``event_time``).

    Public (it is what analysts may ask about), fixed for the ledger's life and recorded with it
    (:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`'s ``columns``)."""

    id_type: str
    columns: tuple[DeclaredColumn, ...]
    keys: InputKeys = InputKeys()

    def __post_init__(self) -> None:
        if self.id_type not in ID_TYPES:
            raise ContractError(f"id_type must be one of {ID_TYPES}, got id_type={self.id_type!r}")
        columns = tuple(self.columns)
        if not columns:
            raise ContractError("a contract declares at least one indicator column")
        if len(columns) > _MAX_COLUMNS:
            raise ContractError(f"a contract declares at most {_MAX_COLUMNS} columns, got {len(columns)}")
        names = [c.name for c in columns]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ContractError(f"column(s) {repeated} declared more than once")
        if not isinstance(self.keys, InputKeys):
            raise ContractError(f"keys must be an InputKeys, got {type(self.keys).__name__}")
        for option, name in (("--id-column", self.keys.id_column),
                             (self.keys.time_option, self.keys.declared_time)):
            if name is not None and name in names:
                kind = self.column(name).kind
                raise ContractError(f"{option} {name!r} names a declared {kind} column (--column/--category "
                                    f"{name}): a column is the id, the time or an indicator, not two of them")
        object.__setattr__(self, "columns", columns)

    # -- what it declares -----------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def numeric(self) -> tuple[str, ...]:
        """The number columns, parsed as float64 in every row."""
        return tuple(c.name for c in self.columns if c.kind == "number")

    @property
    def categories(self) -> tuple[str, ...]:
        """The category columns, passed through as text."""
        return tuple(c.name for c in self.columns if c.kind == "category")

    @property
    def bounded(self) -> tuple[DeclaredColumn, ...]:
        """The number columns with a bound: those that get a default sum."""
        return tuple(c for c in self.columns if c.bounded)

    def column(self, name: str) -> DeclaredColumn:
        for c in self.columns:
            if c.name == name:
                return c
        raise ContractError(f"column {name!r} is not declared; declared: {list(self.names)}")

    def refuse_unbounded(self, names: Sequence[str], *, option: str = "--column NAME=LO:HI") -> None:
        """ContractError naming each of ``names`` that is an unbounded number column: its sum has no
        clamp, so one user's large value would be charged its square (and drop that user)."""
        unbounded = [n for n in names if n in self.numeric and not self.column(n).bounded]
        if unbounded:
            raise ContractError(
                f"column(s) {unbounded} are declared without a bound, so they get no default sum (one user's large "
                f"value would cost that user their whole budget): declare each bound with {option} "
                f"(e.g. {option.split()[0]} {unbounded[0]}=0:60), or register a clamp query for it")

    # -- codecs ---------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The canonical text of the contract (what ledgers record and compare exactly). The id and
        time columns' names appear only where they differ from the defaults: a contract of the
        default names is written exactly as before the names existed."""
        return json.dumps({"id_type": self.id_type, "columns": [c.to_dict() for c in self.columns],
                           **self.keys.to_dict()}, sort_keys=True, separators=(",", ":"))

    def columns_json(self) -> str:
        """The canonical text of the declared columns and key names (a ledger records its id type
        apart): the list of columns alone for the default names (as recorded before the names
        existed), else ``{"columns": [...], "id_column": ..., "day_column": ...}``."""
        columns = [c.to_dict() for c in self.columns]
        keys = self.keys.to_dict()
        return json.dumps({"columns": columns, **keys} if keys else columns, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_columns_json(cls, id_type: str, text: str, *, where: str = "the declared columns") -> "InputContract":
        data = _parsed(text, where)
        if isinstance(data, dict):  # with the key columns' names (columns_json)
            return cls.from_dict({**data, "id_type": id_type}, where=where)
        return cls.from_dict({"id_type": id_type, "columns": data}, where=where)

    def key_changes(self, asked: "InputContract") -> list[str]:
        """One line per key column whose name ``asked`` declares otherwise than this (recorded)
        contract, naming both: ``the id column: ledger has 'user_id', this run declares 'uid'
        (--id-column)``."""
        mine, theirs = self.keys, asked.keys
        out = []
        if mine.id_column != theirs.id_column:
            out.append(f"the id column: the ledger's contract names {mine.id_column!r}, this run declares "
                       f"{theirs.id_column!r} (--id-column)")
        if (mine.day_column, mine.event_time_column) != (theirs.day_column, theirs.event_time_column):
            def time(keys: InputKeys) -> str:
                return (f"the day column {keys.day_column!r} (--day-column)" if keys.day_column is not None else
                        f"the event time column {keys.event_time_column!r} (--event-time-column)"
                        if keys.event_time_column is not None else "the default time column 'day' or 'event_time'")
            out.append(f"the time column: the ledger's contract names {time(mine)}, this run declares {time(theirs)}")
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "the contract") -> "InputContract":
        if not isinstance(data, dict) or set(data) - {"id_type", "columns", *KEY_FIELDS} or "id_type" not in data \
                or not isinstance(data.get("columns"), list):
            raise ContractError(f"{where} must be an object with 'id_type', a list 'columns' and optional "
                                f"{', '.join(repr(k) for k in KEY_FIELDS)}, got {_short(data)}")
        keys = _keys(where, id_column=data.get("id_column"), day_column=data.get("day_column"),
                     event_time_column=data.get("event_time_column"), named=lambda k: repr(k))
        columns = []
        for item in data["columns"]:
            if not isinstance(item, dict) or set(item) - {"name", "kind", "lo", "hi"} or "name" not in item:
                raise ContractError(f"{where}: each column must be an object with 'name' and optional 'kind', "
                                    f"'lo', 'hi', got {_short(item)}")
            try:
                columns.append(DeclaredColumn(item["name"], item.get("kind", "number"), item.get("lo"), item.get("hi")))
            except ContractError as exc:
                raise ContractError(f"{where}: {exc}") from None
        try:
            return cls(data["id_type"], tuple(columns), keys)
        except ContractError as exc:
            raise ContractError(f"{where}: {exc}") from None

    @classmethod
    def from_json(cls, text: str, *, where: str = "the contract") -> "InputContract":
        return cls.from_dict(_parsed(text, where), where=where)

    @classmethod
    def from_file(cls, path: str | Path) -> "InputContract":
        """A contract from a JSON schema file (``{"id_type": ..., "columns": [{"name", "kind",
        "lo", "hi"}, ...]}``), a local path or a URI (``gs://``, ``s3://``, read through
        ``pyarrow.fs`` as the jobs' inputs are)."""
        try:
            if isinstance(path, str) and "://" in path:  # gs://, s3://: as the jobs read their inputs
                import pyarrow.fs as pafs

                fs, inside = pafs.FileSystem.from_uri(path)
                with fs.open_input_stream(inside) as handle:
                    text = handle.read().decode("utf-8")
            else:
                text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ContractError(f"schema file {path} cannot be read: {exc}") from None
        return cls.from_json(text, where=f"schema file {path}")

    @classmethod
    def from_options(cls, *, id_type: str | None, columns: Sequence[str] = (),
                     categories: Sequence[str] = (), id_column: str | None = None, day_column: str | None = None,
                     event_time_column: str | None = None) -> "InputContract":
        """A contract from command-line options: ``--id-type``, ``--column NAME`` or
        ``--column NAME=LO:HI`` (a number column, bounded), ``--category NAME``, and the key
        columns' names ``--id-column``, ``--day-column``, ``--event-time-column``."""
        if id_type is None:
            raise ContractError("--id-type is required with --column/--category: declare int64 or string")
        keys = _keys("", id_column=id_column, day_column=day_column, event_time_column=event_time_column,
                     named=lambda k: _KEY_OPTIONS[k])
        declared = [_parse_column(text) for text in columns] + [DeclaredColumn(str(n), "category") for n in categories]
        return cls(id_type, tuple(declared), keys)


def _keys(where: str, *, named: Any, **names: Any) -> InputKeys:
    """The key columns' names as :class:`InputKeys` (None: the default); ContractError, naming
    ``where`` and the option or field (``named(field)``), for a name that is not one."""
    for field, value in names.items():
        if value is not None and not isinstance(value, str):
            raise ContractError(f"{where + ': ' if where else ''}{named(field)} must be a column name (text), got "
                                f"{_short(value)}")
    try:
        return InputKeys(id_column=names["id_column"] if names["id_column"] is not None else InputKeys().id_column,
                         day_column=names["day_column"], event_time_column=names["event_time_column"])
    except ValueError as exc:
        text = str(exc)
        if named("id_column") != "--id-column":  # a schema file: its fields, not the options
            for field, option in _KEY_OPTIONS.items():
                text = text.replace(option, repr(field))
        raise ContractError(f"{where}: {text}" if where else text) from None


def _parsed(text: str, where: str) -> Any:
    """``text`` as JSON (:func:`_loads`); ContractError naming ``where`` when it is not."""
    try:
        return _loads(text)
    except ContractError as exc:
        raise ContractError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{where} is not JSON: {exc}") from None


def _parse_column(text: str) -> DeclaredColumn:
    name, sep, bound = str(text).partition("=")
    if not sep:
        return DeclaredColumn(name)
    lo, colon, hi = bound.partition(":")
    try:
        if not colon:
            raise ValueError(bound)
        return DeclaredColumn(name, "number", float(lo), float(hi))
    except ValueError:
        raise ContractError(f"--column must be NAME or NAME=LO:HI with numbers LO < HI, got --column {text!r}") from None


def _finite(name: str, value: Any) -> float:
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer beyond float64 (a JSON number of 400 digits)
        number = math.inf
    if not math.isfinite(number):
        raise ContractError(f"{name} must be a finite number, got {_short(value)}")
    return number + 0.0  # -0.0 is the bound 0.0, written as such (the recorded text is compared exactly)


def _loads(text: str) -> Any:
    """JSON with every object's keys distinct: a repeated key (``"id_type"`` twice) is ambiguous,
    and json.loads would silently keep its last value."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ContractError(f"key(s) {repeated} given more than once in one object")
        return dict(items)
    return json.loads(text, object_pairs_hook=pairs)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def declaration_hint(header: Sequence[str] = ()) -> str:
    """How to declare a contract, with the input's own column names when known."""
    names = [n for n in header if n not in _KEYS][:3]
    example = " ".join(f"--column {n}=0:1" for n in names) or "--column opened_app=0:1"
    return (f"declare it on the ledger's first run: --id-type int64|string and one --column NAME=LO:HI (a bounded "
            f"number), --column NAME (a number without a default sum) or --category NAME per indicator column "
            f"(e.g. --id-type int64 {example}), and --id-column NAME / --day-column NAME (or --event-time-column "
            "NAME) when the id or the day is not named user_id / day (or event_time); or --schema FILE.json; "
            "nothing about a row is inferred from values")
