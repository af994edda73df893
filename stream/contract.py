"""The declared input contract: a ledger's user id type and its indicator columns, declared once.

Nothing about a row is inferred from values or from a writer's guessed types, since that would
make one user's treatment depend on other users' data (docs/architecture.md, "The input
contract"). A contract names the id type (``int64`` or ``string``) and, per indicator column,
its kind (``number`` or ``category``) and, for a number, an optional bound ``[lo, hi]``: the
clamp of the column's default sum. A numeric column without a bound gets no default query.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["ID_TYPES", "KINDS", "ContractError", "DeclaredColumn", "InputContract", "declaration_hint"]

#: The kinds of user id a ledger can hold (:class:`renyi_stream.stream.ledger.Ledger`).
ID_TYPES = ("int64", "string")
#: The kinds of an indicator column.
KINDS = ("number", "category")
#: Columns that are never indicators: the user and the time.
_KEYS = ("user_id", "day", "event_time", "window_id")
_MAX_NAME = 128
_MAX_COLUMNS = 4096


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
    """A ledger's declared input: its id type and its indicator columns in declared order.

    Public (it is what analysts may ask about), fixed for the ledger's life and recorded with it
    (:class:`renyi_stream.stream.engine.ledger_config.LedgerConfig`'s ``columns``)."""

    id_type: str
    columns: tuple[DeclaredColumn, ...]

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
        """The canonical text of the contract (what ledgers record and compare exactly)."""
        return json.dumps({"id_type": self.id_type, "columns": [c.to_dict() for c in self.columns]},
                          sort_keys=True, separators=(",", ":"))

    def columns_json(self) -> str:
        """The canonical text of the declared columns alone (a ledger records its id type apart)."""
        return json.dumps([c.to_dict() for c in self.columns], sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_columns_json(cls, id_type: str, text: str, *, where: str = "the declared columns") -> "InputContract":
        return cls.from_dict({"id_type": id_type, "columns": _parsed(text, where)}, where=where)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "the contract") -> "InputContract":
        if not isinstance(data, dict) or set(data) - {"id_type", "columns"} or "id_type" not in data \
                or not isinstance(data.get("columns"), list):
            raise ContractError(f"{where} must be an object with 'id_type' and a list 'columns', got {_short(data)}")
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
            return cls(data["id_type"], tuple(columns))
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
                     categories: Sequence[str] = ()) -> "InputContract":
        """A contract from command-line options: ``--id-type``, ``--column NAME`` or
        ``--column NAME=LO:HI`` (a number column, bounded), ``--category NAME``."""
        if id_type is None:
            raise ContractError("--id-type is required with --column/--category: declare int64 or string")
        declared = [_parse_column(text) for text in columns] + [DeclaredColumn(str(n), "category") for n in categories]
        return cls(id_type, tuple(declared))


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
            f"(e.g. --id-type int64 {example}), or --schema FILE.json; nothing about a row is inferred from values")
