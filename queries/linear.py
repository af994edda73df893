"""Linear queries: what an analyst asks of one user's row in one window, as a vector in R^d.

A :class:`LinearQuery` is public (its spec is in the query catalogue). Evaluated on a window's
validated rows (:func:`stream.schema.validate_batch`: indicator columns are finite float64), it
returns an ``(n, d)`` float64 array, one vector per user; the pipeline concatenates the vectors of
every query active in the window and the ledger charges each user the squared norm of the
concatenation (Feldman & Zrnic, Algorithm 3, applied to the fully adaptive sequence of queries).

Specs (``spec["type"]``):

* ``columns``: the selected indicator columns, one coordinate each (a daily sum per column);
* ``histogram``: a one-hot of a numeric category code over declared, public category values;
  a value outside the list maps to the zero vector (it contributes to no bucket and costs
  nothing), so the list is the whole histogram;
* ``clamp``: one column clamped to a declared ``[lo, hi]`` (bounding the contribution);
* ``weighted``: ``sum_j w_j * column_j``, one coordinate.

``kind`` is ``window`` (each window's own sum) or ``running`` (the running total from the
query's first window, through a streaming matrix mechanism; see :mod:`stream.continual`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from stream.accounting.gaussian import MAX_DIM

KINDS = ("window", "running")
TYPES = ("columns", "histogram", "clamp", "weighted")
# Any printable id of at most 160 characters, without surrounding whitespace or brackets (which
# name the coordinates of `releases_wide`): default ids are `sum:<column>` for any column name.
_ID = re.compile(r"^(?=\S)(?!.*\s$)[^\[\]\x00-\x1f\x7f]{1,160}$")


@dataclass(frozen=True)
class LinearQuery:
    """One registered query: ``query_id``, ``kind``, the ``spec`` of what it computes and a
    public ``description``. Construct with :meth:`columns`, :meth:`histogram`, :meth:`clamp`,
    :meth:`weighted` or :meth:`from_json`; every constructor validates."""

    query_id: str
    spec: Mapping[str, Any]
    kind: str = "window"
    description: str = ""
    _labels: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.query_id, str) or not _ID.match(self.query_id):
            raise ValueError("query_id must be 1 to 160 printable characters without surrounding whitespace "
                             f"or brackets, got query_id={self.query_id!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got kind={self.kind!r}")
        if not isinstance(self.description, str) or len(self.description) > 2000:
            raise ValueError("description must be a string of at most 2000 characters")
        spec = _canonical_spec(self.spec)
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "_labels", _labels(spec))

    # -- constructors ---------------------------------------------------------------------------

    @classmethod
    def columns(cls, query_id: str, columns: Sequence[str], **kw: Any) -> "LinearQuery":
        return cls(query_id, {"type": "columns", "columns": list(columns)}, **kw)

    @classmethod
    def histogram(cls, query_id: str, column: str, categories: Sequence[float], **kw: Any) -> "LinearQuery":
        return cls(query_id, {"type": "histogram", "column": column, "categories": list(categories)}, **kw)

    @classmethod
    def clamp(cls, query_id: str, column: str, lo: float, hi: float, **kw: Any) -> "LinearQuery":
        return cls(query_id, {"type": "clamp", "column": column, "lo": lo, "hi": hi}, **kw)

    @classmethod
    def weighted(cls, query_id: str, weights: Mapping[str, float], **kw: Any) -> "LinearQuery":
        return cls(query_id, {"type": "weighted", "weights": dict(weights)}, **kw)

    # -- what it is -----------------------------------------------------------------------------

    @property
    def labels(self) -> tuple[str, ...]:
        """One public label per coordinate."""
        return self._labels

    @property
    def dim(self) -> int:
        return len(self._labels)

    @property
    def columns_needed(self) -> tuple[str, ...]:
        spec = self.spec
        if spec["type"] == "columns":
            return tuple(spec["columns"])
        if spec["type"] == "weighted":
            return tuple(spec["weights"])
        return (spec["column"],)

    def validate_against(self, columns: Sequence[str]) -> None:
        """Raise ValueError naming the columns this query reads that are not indicator columns."""
        missing = [c for c in self.columns_needed if c not in set(columns)]
        if missing:
            raise ValueError(f"query {self.query_id!r} reads unknown column(s) {missing}; "
                             f"numeric indicator columns are {list(columns)}")

    def evaluate(self, rows: pa.Table) -> np.ndarray:
        """``(n, dim)`` float64: this query's vector for each row (vectorised, no row loop)."""
        spec = self.spec
        n = rows.num_rows

        def col(name: str) -> np.ndarray:
            if name not in rows.column_names:
                raise ValueError(f"query {self.query_id!r} reads column {name!r}, absent from the batch")
            return np.asarray(rows.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

        if spec["type"] == "columns":
            return np.column_stack([col(c) for c in spec["columns"]]) if n else np.zeros((0, self.dim))
        if spec["type"] == "clamp":
            return np.clip(col(spec["column"]), spec["lo"], spec["hi"])[:, None]
        if spec["type"] == "weighted":
            out = np.zeros(n)
            for name, weight in spec["weights"].items():
                out += weight * col(name)
            return out[:, None]
        values = col(spec["column"])
        categories = np.asarray(spec["categories"], dtype=np.float64)
        return (values[:, None] == categories[None, :]).astype(np.float64)

    # -- serialisation --------------------------------------------------------------------------

    def to_json(self) -> str:
        """Canonical JSON (sorted keys): the same query always serialises identically."""
        return json.dumps({"query_id": self.query_id, "kind": self.kind, "description": self.description,
                           "spec": self.spec}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "LinearQuery":
        try:
            data = json.loads(text)
            return cls(data["query_id"], data["spec"], kind=data.get("kind", "window"),
                       description=data.get("description", ""))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a query spec: {exc}") from exc


def default_queries(columns: Sequence[str], *, kind: str = "window") -> list[LinearQuery]:
    """The defaults: for each numeric indicator column ``c``, its per-window sum (``sum:c``) or
    its running total (``running:c``), one coordinate labelled ``c``."""
    prefix = {"window": "sum", "running": "running"}.get(kind)
    if prefix is None:
        raise ValueError(f"kind must be one of {KINDS}, got kind={kind!r}")
    return [LinearQuery.columns(f"{prefix}:{c}", [c], kind=kind,
                                description=f"{'daily sum' if kind == 'window' else 'running total'} of {c}")
            for c in columns]


def _name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 128:
        raise ValueError(f"{what} must be a non-empty column name of at most 128 characters, got {value!r}")
    return value


def _number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _canonical_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping) or spec.get("type") not in TYPES:
        raise ValueError(f"spec must be a mapping with type in {TYPES}, got {spec!r}"[:300])
    kind = spec["type"]
    if kind == "columns":
        columns = spec.get("columns")
        if not isinstance(columns, (list, tuple)) or not columns:
            raise ValueError("columns must list at least one column")
        names = [_name("column", c) for c in columns]
        if len(set(names)) != len(names):
            raise ValueError(f"columns must be distinct, got {names}")
        out: dict[str, Any] = {"type": kind, "columns": names}
    elif kind == "histogram":
        categories = spec.get("categories")
        if not isinstance(categories, (list, tuple)) or not categories:
            raise ValueError("categories must list at least one category value")
        values = [_number("category", c) for c in categories]
        if len(set(values)) != len(values):
            raise ValueError(f"categories must be distinct, got {values}")
        out = {"type": kind, "column": _name("column", spec.get("column")), "categories": values}
    elif kind == "clamp":
        lo, hi = _number("lo", spec.get("lo")), _number("hi", spec.get("hi"))
        if not lo < hi:
            raise ValueError(f"lo must be below hi, got lo={lo}, hi={hi}")
        out = {"type": kind, "column": _name("column", spec.get("column")), "lo": lo, "hi": hi}
    else:
        weights = spec.get("weights")
        if not isinstance(weights, Mapping) or not weights:
            raise ValueError("weights must map at least one column to its weight")
        out = {"type": kind, "weights": {_name("column", c): _number(f"weight of {c}", w)
                                         for c, w in sorted(weights.items())}}
    dim = len(_labels(out))
    if dim > MAX_DIM:
        raise ValueError(f"a query may have at most {MAX_DIM} coordinates, got dim={dim}")
    return out


def _labels(spec: Mapping[str, Any]) -> tuple[str, ...]:
    kind = spec["type"]
    if kind == "columns":
        return tuple(spec["columns"])
    if kind == "histogram":
        return tuple(f"{spec['column']}={c:g}" for c in spec["categories"])
    if kind == "clamp":
        return (f"clamp({spec['column']},{spec['lo']:g},{spec['hi']:g})",)
    return ("+".join(f"{w:g}*{c}" for c, w in spec["weights"].items()),)
