"""Linear queries: what an analyst asks of one user's row in one window, as a vector in R^d.

A :class:`LinearQuery` is public (its spec is in the query catalogue). Evaluated on a window's
validated rows (:func:`renyi_stream.stream.schema.validate_batch`: indicator columns are finite float64), it
returns an ``(n, d)`` float64 array, one vector per user; the pipeline concatenates the vectors of
every query active in the window and the ledger charges each user the squared norm of the
concatenation (Feldman & Zrnic, Algorithm 3, applied to the fully adaptive sequence of queries).

Specs (``spec["type"]``):

* ``columns``: the selected numeric columns, one coordinate each (a daily sum per column);
* ``histogram``: a one-hot of a column over a declared, public list of categories, either
  numbers (category codes in a numeric column) or strings (a string column). A value outside
  the list (or a null in a string column) maps to the **zero vector**: it counts in no bucket and
  costs nothing, so the declared list is the whole histogram (there is no "other" bucket;
  declare one value per bucket you want counted);
* ``clamp``: one numeric column clamped to a declared ``[lo, hi]`` (bounding the contribution);
* ``weighted``: ``sum_j w_j * column_j``, one coordinate.

``kind`` is ``window`` (each window's own sum) or ``running`` (the running total from the
query's first window, through a streaming matrix mechanism; see :mod:`renyi_stream.stream.continual`). Here it
is metadata: it is validated and round-trips through JSON, and the pipeline acts on it. A running
query also names its ``strategy``, the factorisation of the prefix-sum matrix it is released
through (:data:`renyi_stream.stream.continual.prepaid.RUNNING_STRATEGIES`: ``blt``, the default, a Buffered
Linear Toeplitz factorisation with the square root's error and a few numbers of state per user;
``sqrt``, the square-root factorisation, the exact reference; ``tree``, the binary tree with
least-squares post-processing), and its declared ``horizon``: the number of windows it is
released for (default 365), or ``"tail"`` (the infinite tail, ``blt`` only). Every admitted
contribution is charged its whole future cost over that schedule when it is admitted
(docs/running_totals.md); the JSON records the strategy's parameters (``strategy_spec``:
``theta``, ``omega`` for a BLT) so an analyst can reproduce each estimate's std. Specs written
before strategies existed load as ``sqrt``, before horizons as the default horizon.

A **window** query may declare its own ``noise_scale`` ``m`` (default 1.0), a multiplier of the
ledger's noise std ``s``: its coordinates are released with noise std ``m * s`` and a user is
charged ``||q(x)||^2 / (2 s^2 m^2)`` for it (the Gaussian mechanism with per-coordinate scales,
Feldman & Zrnic Cor 4.7 per coordinate; :func:`renyi_stream.stream.engine.shard_state.window_noise_std`),
so a curator spends the budget where it matters: ``m < 1`` a finer answer that costs a user
``1 / m^2`` times more, ``m > 1`` a coarser one that costs less. It is in ``[1e-3, 1e3]``
(:data:`NOISE_SCALE_RANGE`) and written in the JSON only when it is not 1.0, so a query without
one serialises exactly as before. A running query refuses any other scale than 1 in this
version: its prepaid charge (:mod:`renyi_stream.stream.continual.prepaid`) would need the same treatment.

Every constructor validates the whole spec (empty lists, repeated columns or categories,
repeated labels, ``dim > MAX_DIM``, ``lo >= hi``, non-finite numbers, bad ids), so a
``LinearQuery`` that exists is well formed; :meth:`LinearQuery.validate_against` adds the
checks that need the data's schema (unknown and non-numeric columns).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.accounting.gaussian import MAX_DIM
from renyi_stream.stream.continual.prepaid import (
    DEFAULT_PREPAID_HORIZON,
    DEFAULT_RUNNING_STRATEGY,
    RUNNING_STRATEGIES,
    parse_horizon,
    running_factorisation,
)
from renyi_stream.stream.schema import DAY, EVENT_TIME, USER_ID, WINDOW_ID

KINDS = ("window", "running")
#: Strategies of a running query (:data:`renyi_stream.stream.continual.prepaid.RUNNING_STRATEGIES`, the one list).
STRATEGIES = RUNNING_STRATEGIES
DEFAULT_STRATEGY = DEFAULT_RUNNING_STRATEGY
#: What a stored running spec without a ``strategy`` key was released through (before strategies existed).
LEGACY_STRATEGY = "sqrt"
TYPES = ("columns", "histogram", "clamp", "weighted")

#: Longest query id. Default ids are ``sum:<column>`` / ``running:<column>`` and a column name
#: has at most :data:`MAX_NAME` characters, so every default id fits.
MAX_ID = 160
#: Longest column name or string category.
MAX_NAME = 128
#: Columns a query may not read: they identify the user or the window, not what the user did.
RESERVED_COLUMNS = (USER_ID, WINDOW_ID, DAY, EVENT_TIME)
_SPEC_KEYS = {"columns": {"columns"}, "histogram": {"column", "categories"}, "clamp": {"column", "lo", "hi"},
              "weighted": {"weights"}}
_JSON_KEYS = {"query_id", "kind", "description", "spec", "strategy", "horizon", "strategy_spec", "rule",
              "noise_scale"}
#: A window query's noise scale when it declares none: the ledger's noise std, as before scales existed.
DEFAULT_NOISE_SCALE = 1.0
#: The scales a query may declare, inclusive: a multiplier of the ledger's noise std ``s``, so a
#: query's variance is at most a million times finer or coarser than the ledger's (its charge per
#: unit of contribution at most a million times higher or lower).
NOISE_SCALE_RANGE = (1e-3, 1e3)
# Characters kept out of ids: brackets name the coordinates of a multi-coordinate query in the
# releases_wide view (``query_id[label]``).
_ID_FORBIDDEN = "[]"


@dataclass(frozen=True)
class LinearQuery:
    """One registered query: ``query_id``, ``spec`` (what it computes), ``kind``, a public
    ``description`` and, for a running query, its ``strategy`` (``"blt"`` when not given) and
    declared ``horizon`` (365 windows when not given, or ``"tail"``); a window query has
    ``strategy=None`` and ``horizon=None`` and refuses any other. ``noise_scale`` (window queries;
    default 1.0) multiplies the ledger's noise std for this query's coordinates (module
    docstring). Construct with :meth:`columns`,
    :meth:`histogram`, :meth:`clamp`, :meth:`weighted`, :meth:`from_json` or directly from a
    spec mapping; every constructor validates and stores the spec in canonical form (so equal
    specs compare and hash equal)."""

    query_id: str
    spec: Mapping[str, Any]
    kind: str = "window"
    description: str = ""
    strategy: str | None = None
    horizon: int | str | None = None
    noise_scale: float = DEFAULT_NOISE_SCALE
    _labels: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_id(self.query_id)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got kind={self.kind!r}")
        object.__setattr__(self, "strategy", _strategy(self.kind, self.strategy))
        object.__setattr__(self, "horizon", _horizon(self.kind, self.strategy, self.horizon))
        object.__setattr__(self, "noise_scale", _noise_scale(self.kind, self.noise_scale))
        if not isinstance(self.description, str) or len(self.description) > 2000:
            raise ValueError(f"description must be a string of at most 2000 characters, got "
                             f"{type(self.description).__name__} of length {len(str(self.description))}")
        spec = _canonical_spec(self.spec)
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "_labels", _labels(spec))

    def __hash__(self) -> int:
        return hash(self.to_json())

    # -- constructors ---------------------------------------------------------------------------

    @classmethod
    def columns(cls, query_id: str, columns: Sequence[str], **kw: Any) -> "LinearQuery":
        """One coordinate per column (labelled by the column name), in the order given."""
        return cls(query_id, {"type": "columns", "columns": list(columns)}, **kw)

    @classmethod
    def histogram(cls, query_id: str, column: str, categories: Sequence[float | str], **kw: Any) -> "LinearQuery":
        """One coordinate per declared category (``column=value``), 1 where the row's value is it."""
        return cls(query_id, {"type": "histogram", "column": column, "categories": list(categories)}, **kw)

    @classmethod
    def clamp(cls, query_id: str, column: str, lo: float, hi: float, **kw: Any) -> "LinearQuery":
        """One coordinate: ``column`` clamped to ``[lo, hi]``."""
        return cls(query_id, {"type": "clamp", "column": column, "lo": lo, "hi": hi}, **kw)

    @classmethod
    def weighted(cls, query_id: str, weights: Mapping[str, float], **kw: Any) -> "LinearQuery":
        """One coordinate: ``sum_j weights[j] * column_j``."""
        return cls(query_id, {"type": "weighted", "weights": dict(weights)}, **kw)

    # -- what it is -----------------------------------------------------------------------------

    @property
    def labels(self) -> tuple[str, ...]:
        """One public label per coordinate, distinct, in coordinate order."""
        return self._labels

    @property
    def dim(self) -> int:
        """Number of coordinates, ``1 <= dim <= MAX_DIM``."""
        return len(self._labels)

    @property
    def columns_needed(self) -> tuple[str, ...]:
        """The input columns :meth:`evaluate` reads, each once."""
        spec = self.spec
        if spec["type"] == "columns":
            return tuple(spec["columns"])
        if spec["type"] == "weighted":
            return tuple(spec["weights"])
        return (spec["column"],)

    @property
    def categorical(self) -> bool:
        """True for a histogram over string categories (it reads a string column)."""
        return self.spec["type"] == "histogram" and isinstance(self.spec["categories"][0], str)

    def validate_against(self, schema: pa.Schema | Sequence[str]) -> None:
        """Raise ValueError naming the query and column when ``schema`` cannot feed :meth:`evaluate`.

        ``schema`` is the schema of the rows :meth:`evaluate` will see (after
        :func:`renyi_stream.stream.schema.validate_batch`, indicator columns are float64). A plain sequence of
        names means numeric columns of those names (what ``validate_batch`` produces). Checks:
        every column read exists; a numeric spec reads numeric columns (integer, float, bool,
        decimal); a string-category histogram reads a string column. The spec itself was checked
        when the query was built.
        """
        if isinstance(schema, pa.Schema):
            types = {f.name: f.type for f in schema}
        elif isinstance(schema, (str, bytes)) or not isinstance(schema, Sequence):
            raise ValueError(f"schema must be a pyarrow.Schema or a sequence of column names, got {schema!r}")
        else:
            types = {str(name): pa.float64() for name in schema}
        missing = [c for c in self.columns_needed if c not in types]
        if missing:
            raise ValueError(f"query {self.query_id!r} reads unknown column(s) {missing}; "
                             f"the available columns are {sorted(types)}")
        for name in self.columns_needed:
            kind = _column_kind(types[name])
            wanted = "string" if self.categorical else "number"
            if kind != wanted:
                what = ("a string column (its categories are strings)" if self.categorical
                        else "a numeric column (integer, float, bool or decimal)")
                raise ValueError(f"query {self.query_id!r} needs column {name!r} to be {what}, "
                                 f"got type {types[name]}")

    def evaluate(self, rows: pa.Table | pa.RecordBatch) -> np.ndarray:
        """This query's vector for each row: an ``(n, dim)`` float64 array, vectorised.

        Finite for finite input (no NaN), except that a weighted sum can overflow to infinity
        (or NaN) when ``|w * x|`` exceeds float64's range: the engine then treats that user's
        vector as an infinite charge and drops them at that window (:mod:`renyi_stream.stream.engine.shard_state`). Raises
        ValueError naming the column when a column is absent, of the wrong kind, or (numeric
        columns) has nulls: validate rows with :func:`renyi_stream.stream.schema.validate_batch` first.
        """
        spec = self.spec
        n = rows.num_rows
        kind = spec["type"]
        if kind == "columns":
            if n == 0:
                return np.zeros((0, self.dim))
            return np.column_stack([self._numbers(rows, c) for c in spec["columns"]])
        if kind == "clamp":
            return np.clip(self._numbers(rows, spec["column"]), spec["lo"], spec["hi"]).reshape(n, 1)
        if kind == "weighted":
            names = list(spec["weights"])
            if n == 0:
                return np.zeros((0, 1))
            x = np.column_stack([self._numbers(rows, c) for c in names])
            with np.errstate(over="ignore", invalid="ignore"):
                return (x @ np.array([spec["weights"][c] for c in names], dtype=np.float64)).reshape(n, 1)
        return self._one_hot(rows)

    # -- serialisation --------------------------------------------------------------------------

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): the same query always serialises identically.
        A running query's ``strategy``, ``horizon``, ``rule`` (``"prepaid"``) and
        ``strategy_spec`` (the factorisation's parameters) are always written; a window query has
        none. ``noise_scale`` is written only when it is not 1.0, so the JSON of a query without
        one is what it always was (stored catalogues and recorded plans compare equal)."""
        data = {"query_id": self.query_id, "kind": self.kind, "description": self.description,
                "spec": _jsonable(self.spec)}
        if self.noise_scale != DEFAULT_NOISE_SCALE:
            data["noise_scale"] = self.noise_scale
        if self.strategy is not None:
            data["strategy"] = self.strategy
            data["horizon"] = self.horizon
            data["rule"] = "prepaid"
            data["strategy_spec"] = self.strategy_spec()
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> "LinearQuery":
        """The query :meth:`to_json` wrote; ValueError for anything that is not a valid spec."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a query spec (invalid JSON): {exc}") from exc
        if not isinstance(data, dict) or "query_id" not in data or "spec" not in data:
            raise ValueError("not a query spec: expected a JSON object with 'query_id' and 'spec'")
        unknown = sorted(set(data) - _JSON_KEYS)
        if unknown:
            raise ValueError(f"not a query spec: unknown key(s) {unknown}; expected {sorted(_JSON_KEYS)}")
        kind = data.get("kind", "window")
        strategy = data.get("strategy", LEGACY_STRATEGY if kind == "running" else None)
        query = cls(data["query_id"], data["spec"], kind=kind, description=data.get("description", ""),
                    strategy=strategy, horizon=data.get("horizon"),
                    noise_scale=data.get("noise_scale", DEFAULT_NOISE_SCALE))
        if "strategy_spec" in data and data["strategy_spec"] != query.strategy_spec():
            raise ValueError(f"query {query.query_id!r} records strategy parameters {data['strategy_spec']!r}, but "
                             f"strategy {query.strategy!r} over horizon {query.horizon!r} is "
                             f"{query.strategy_spec()!r}"[:600])
        return query

    def strategy_spec(self) -> dict[str, Any] | None:
        """A running query's factorisation with its parameters (``theta``, ``omega`` and the
        horizon they were fitted for, for a BLT), as
        :func:`renyi_stream.stream.continual.prepaid.running_factorisation` builds it: public, what an analyst needs to reproduce an estimate's std. ``None`` for a
        window query."""
        if self.strategy is None:
            return None
        return running_factorisation(self.strategy, self.horizon).spec()

    # -- private ----------------------------------------------------------------------------------

    def _column(self, rows: pa.Table | pa.RecordBatch, name: str) -> pa.Array | pa.ChunkedArray:
        if name not in rows.schema.names:
            raise ValueError(f"query {self.query_id!r} reads column {name!r}, absent from the rows "
                             f"(columns: {rows.schema.names})")
        column = rows.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        return column

    def _numbers(self, rows: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
        column = self._column(rows, name)
        if _column_kind(column.type) != "number":
            raise ValueError(f"query {self.query_id!r} needs column {name!r} to be numeric, got type {column.type}")
        if column.null_count:
            raise ValueError(f"query {self.query_id!r}: column {name!r} has {column.null_count} null(s); "
                             "validate rows with renyi_stream.stream.schema.validate_batch first")
        return np.asarray(column.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.float64)

    def _one_hot(self, rows: pa.Table | pa.RecordBatch) -> np.ndarray:
        spec = self.spec
        n = rows.num_rows
        out = np.zeros((n, self.dim))
        if n == 0:
            return out
        column = self._column(rows, spec["column"])
        if not self.categorical:
            # Numbers compare as numbers (-0.0 is 0.0; NaN is in no bucket): a sorted lookup.
            values = self._numbers(rows, spec["column"])
            categories = np.asarray(spec["categories"], dtype=np.float64)
            order = np.argsort(categories)
            found = np.minimum(np.searchsorted(categories[order], values), len(order) - 1)
            hit = categories[order][found] == values
            out[np.flatnonzero(hit), order[found[hit]]] = 1.0
            return out
        if _column_kind(column.type) != "string":
            raise ValueError(f"query {self.query_id!r} needs column {spec['column']!r} to be a string column "
                             f"(its categories are strings), got type {column.type}")
        # Position of each row's value in the declared list; null (no bucket) for a value outside
        # it and for a null value.
        index = pc.index_in(column.cast(pa.string()), value_set=pa.array(spec["categories"], type=pa.string()),
                            skip_nulls=True)
        if isinstance(index, pa.ChunkedArray):
            index = index.combine_chunks()
        hit = np.asarray(index.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        positions = np.asarray(index.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        out[np.flatnonzero(hit), positions[hit]] = 1.0
        return out


def default_queries(columns: Sequence[str], *, kind: str = "window",
                    strategy: str | None = None, horizon: int | str | None = None,
                    bounds: Mapping[str, tuple[float, float]] | None = None) -> list[LinearQuery]:
    """The defaults, one per numeric indicator column ``c`` in the order given: its per-window
    sum, id ``sum:c`` (``kind="window"``), or its running total, id ``running:c``
    (``kind="running"``, released through ``strategy``, default ``blt``, over ``horizon``,
    default 365 windows); one coordinate labelled ``c`` (``clamp(c,lo,hi)`` when clamped to ``bounds[c]``
    (the column's declared bound, :mod:`renyi_stream.stream.contract`), where given). Existing stores use these
    ids: they never change."""
    prefix = {"window": "sum", "running": "running"}.get(kind)
    if prefix is None:
        raise ValueError(f"kind must be one of {KINDS}, got kind={kind!r}")
    if isinstance(columns, (str, bytes)):
        raise ValueError(f"columns must be a sequence of column names, got the string {columns!r}")
    strategy = _strategy(kind, strategy)
    horizon = _horizon(kind, strategy, horizon)
    bounds = bounds or {}

    def one(c: str) -> LinearQuery:
        what = f"{'daily sum' if kind == 'window' else 'running total'} of {c}"
        if c in bounds:
            lo, hi = bounds[c]
            return LinearQuery.clamp(f"{prefix}:{c}", c, lo, hi, kind=kind, strategy=strategy, horizon=horizon,
                                     description=f"{what}, each value clamped to [{lo:g}, {hi:g}]")
        return LinearQuery.columns(f"{prefix}:{c}", [c], kind=kind, strategy=strategy, horizon=horizon,
                                   description=what)

    return [one(c) for c in columns]


# --- validation (pure) ---------------------------------------------------------------------------


def _check_id(value: Any) -> None:
    ok = (isinstance(value, str) and 1 <= len(value) <= MAX_ID and value.isprintable() and value == value.strip()
          and not any(ch in value for ch in _ID_FORBIDDEN))
    if not ok:
        raise ValueError(f"query_id must be 1 to {MAX_ID} printable characters, without surrounding whitespace "
                         f"or brackets (e.g. 'sum:opened', 'tiers'), got query_id={value!r}"[:400])


def _strategy(kind: str, value: Any) -> str | None:
    """The strategy of a ``kind`` query: ``sqrt`` when a running query names none; ``None`` for a
    window query, which refuses one (its sums are released as they are)."""
    if kind != "running":
        if value is not None:
            raise ValueError(f"strategy applies only to running queries (kind='running'), got "
                             f"strategy={value!r} with kind={kind!r}"[:300])
        return None
    if value is None:
        return DEFAULT_STRATEGY
    if not isinstance(value, str) or value not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got strategy={value!r}"[:300])
    return value


def _horizon(kind: str, strategy: str | None, value: Any) -> int | str | None:
    """The declared horizon of a ``kind`` query: :data:`DEFAULT_PREPAID_HORIZON` when a running
    query names none; ``None`` for a window query, which refuses one. The strategy must have a
    prepaid rule over it (the infinite tail is ``blt``'s only)."""
    if kind != "running":
        if value is not None:
            raise ValueError(f"horizon applies only to running queries (kind='running'), got "
                             f"horizon={value!r} with kind={kind!r}"[:300])
        return None
    horizon = DEFAULT_PREPAID_HORIZON if value is None else parse_horizon(value)
    running_factorisation(strategy, horizon)  # refuses a strategy without a rule over this horizon, by name
    return horizon


def _noise_scale(kind: str, value: Any) -> float:
    """A query's noise scale as a float: finite, in :data:`NOISE_SCALE_RANGE`; a running query
    refuses any but 1 (this version: its prepaid charge, :mod:`renyi_stream.stream.continual.prepaid`,
    does not scale)."""
    lo, hi = NOISE_SCALE_RANGE
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"noise_scale must be a finite number in [{lo:g}, {hi:g}] (a multiplier of the ledger's "
                         f"noise std), got noise_scale={value!r}"[:300])
    try:
        scale = float(value)
    except OverflowError:
        scale = math.inf
    if not (math.isfinite(scale) and lo <= scale <= hi):
        raise ValueError(f"noise_scale must be a finite number in [{lo:g}, {hi:g}] (a multiplier of the ledger's "
                         f"noise std), got noise_scale={value!r}"[:300])
    if kind != "window" and scale != DEFAULT_NOISE_SCALE:
        raise ValueError(f"noise_scale applies only to window queries (kind='window') in this version: a running "
                         f"query's prepaid charge is not scaled, got noise_scale={value!r} with kind={kind!r}"[:300])
    return scale


def _column_kind(t: pa.DataType) -> str | None:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "string"
    return None


def _name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise ValueError(f"{what} must be a non-empty column name of at most {MAX_NAME} characters, "
                         f"got {what}={value!r}"[:300])
    if value in RESERVED_COLUMNS:
        raise ValueError(f"{what} may not be the reserved column {value!r} (reserved: {list(RESERVED_COLUMNS)}): "
                         "a query reads what a user did, not who or when")
    return value


def _number(what: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a finite number, got {what}={value!r}"[:300])
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{what} must be a finite number, got {what}={value!r}"[:300]) from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {what}={value!r}")
    return number


def _category(value: Any) -> float | str:
    if isinstance(value, str):
        if not value or len(value) > MAX_NAME or not value.isprintable():
            raise ValueError(f"a string category must be 1 to {MAX_NAME} printable characters, "
                             f"got category={value!r}"[:300])
        return value
    return _number("category", value)


def _list(what: str, value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{what} must list at least one value, got {what}={value!r}"[:300])
    return list(value)


def _canonical_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping) or spec.get("type") not in TYPES:
        raise ValueError(f"spec must be a mapping with type in {TYPES}, got spec={spec!r}"[:300])
    kind = spec["type"]
    unknown = sorted(str(key) for key in set(spec) - _SPEC_KEYS[kind] - {"type"})
    if unknown:
        raise ValueError(f"a {kind} spec takes the keys {sorted(_SPEC_KEYS[kind])}, got unknown key(s) {unknown}"[:300])
    if kind == "columns":
        names = [_name("column", c) for c in _list("columns", spec.get("columns"))]
        if len(set(names)) != len(names):
            raise ValueError(f"columns must be distinct, got columns={names}"[:300])
        out: dict[str, Any] = {"type": kind, "columns": tuple(names)}
    elif kind == "histogram":
        values = [_category(c) for c in _list("categories", spec.get("categories"))]
        if len({type(v) for v in values}) != 1:
            raise ValueError("categories must be all numbers or all strings, got a mix"
                             f" ({sorted({type(v).__name__ for v in values})})")
        if len(set(values)) != len(values):
            raise ValueError(f"categories must be distinct, got categories={values}"[:300])
        out = {"type": kind, "column": _name("column", spec.get("column")), "categories": tuple(values)}
    elif kind == "clamp":
        lo, hi = _number("lo", spec.get("lo")), _number("hi", spec.get("hi"))
        if not lo < hi:
            raise ValueError(f"lo must be below hi, got lo={lo}, hi={hi}")
        out = {"type": kind, "column": _name("column", spec.get("column")), "lo": lo, "hi": hi}
    else:
        weights = spec.get("weights")
        if not isinstance(weights, Mapping) or not weights:
            raise ValueError(f"weights must map at least one column to its weight, got weights={weights!r}"[:300])
        checked = {_name("column", c): _number(f"weight of {c!r}", w) for c, w in weights.items()}
        out = {"type": kind, "weights": dict(sorted(checked.items()))}
    labels = _labels(out)
    if len(labels) > MAX_DIM:
        raise ValueError(f"a query may have at most {MAX_DIM} coordinates (MAX_DIM), got dim={len(labels)}")
    if len(set(labels)) != len(labels):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        raise ValueError(f"labels must be distinct, got repeated label(s) {repeated[:5]}")
    return out


def _fmt(x: float) -> str:
    """Short text of ``x`` that reads back as ``x``: ``%g`` when exact, else the integer or ``repr``."""
    short = f"{x:g}"
    if float(short) == x:
        return short
    return str(int(x)) if x.is_integer() and abs(x) < 2.0**53 else repr(x)


def _labels(spec: Mapping[str, Any]) -> tuple[str, ...]:
    kind = spec["type"]
    if kind == "columns":
        return tuple(spec["columns"])
    if kind == "histogram":
        return tuple(f"{spec['column']}={c if isinstance(c, str) else _fmt(c)}" for c in spec["categories"])
    if kind == "clamp":
        return (f"clamp({spec['column']},{_fmt(spec['lo'])},{_fmt(spec['hi'])})",)
    return ("+".join(f"{_fmt(w)}*{c}" for c, w in spec["weights"].items()),)


def _jsonable(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in spec.items()}


__all__ = ["DEFAULT_NOISE_SCALE", "DEFAULT_STRATEGY", "KINDS", "MAX_ID", "NOISE_SCALE_RANGE", "RESERVED_COLUMNS",
           "STRATEGIES", "TYPES", "LinearQuery", "default_queries"]
