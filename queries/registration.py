"""The rules of a query catalogue, one place for every store that keeps one.

A catalogue lists public query registrations: a :class:`renyi_stream.queries.linear.LinearQuery`, the first
window it is answered in (``effective_from``) and the first window it no longer is
(``retired_from``, None while it is active). Two stores keep one and both apply these rules:

* the DuckDB release store's registry (:class:`renyi_stream.queries.registry.QueryRegistry`), which
  ``renyi-stream run`` answers;
* the catalogue file beside a public Parquet release root (:class:`renyi_stream.queries.catalogue.ReleaseCatalogue`),
  which the distributed and streaming jobs answer.

The rules (invariant 5, release-once, docs/architecture.md: released answers never change):

* a query id is registered once, for good: a retired id stays taken, so its releases keep
  their meaning (:func:`check_new`);
* a registration takes effect after the last released window (:func:`refuse_released`), and
  so does a retirement, which must also come after the query's first window
  (:func:`check_retirement`);
* the queries active together in a window have at most ``MAX_DIM`` coordinates, because the
  ledger charges their concatenation (:func:`refuse_too_wide`);
* a running query, alone and with the running queries active with it, stays within the bounds on
  what a job keeps for it (horizon per strategy, numbers a user: :func:`refuse_too_big`, docs/running_totals.md, "Bounds");
* a query active in window ``w`` is one with ``effective_from <= w < retired_from``
  (:func:`active_between`);
* a query registered into a window a job had already charged, but never answered (a
  registration between a job's charge and its publication), starts where it is first answered
  (:func:`deferrals`), so the catalogue stays truthful.

Everything here is pure: the functions take the registrations and return what changes, or raise
ValueError naming the parameter and changing nothing. Each store reads, applies and writes.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, replace
from typing import Any, Collection, Iterable, Iterator, Sequence

import pyarrow as pa

from renyi_stream.queries.linear import LinearQuery, default_queries
from renyi_stream.stream.accounting.gaussian import MAX_DIM
from renyi_stream.stream.continual.prepaid import refuse_running_too_big
from renyi_stream.stream.columns import InputColumns, input_columns
from renyi_stream.stream.contract import ContractError, InputContract


@dataclass(frozen=True)
class Registration:
    """One query of a catalogue and the windows it is answered in: ``[effective_from,
    retired_from)`` (``retired_from`` None while it is active). ``registered_at`` is an ISO 8601
    time, informative only."""

    query: LinearQuery
    effective_from: int
    retired_from: int | None = None
    registered_at: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.query, LinearQuery):
            raise ValueError(f"query must be a LinearQuery, got {type(self.query).__name__}")
        object.__setattr__(self, "effective_from", window_id("effective_from", self.effective_from))
        if self.retired_from is not None:
            object.__setattr__(self, "retired_from", window_id("retired_from", self.retired_from))
            if self.retired_from < self.effective_from:
                raise ValueError(f"retired_from must not be before effective_from={self.effective_from}, "
                                 f"got retired_from={self.retired_from}")

    @property
    def query_id(self) -> str:
        return self.query.query_id

    def active_in(self, window: int) -> bool:
        return self.effective_from <= window and (self.retired_from is None or window < self.retired_from)


def window_id(name: str, value: Any) -> int:
    """``value`` as a window id; ValueError naming ``name`` when it is not an integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer window id, got {name}={value!r}")
    return int(value)


# --- the rules -----------------------------------------------------------------------------------


def refuse_released(name: str, window: int, last_released: int | None) -> None:
    """ValueError unless ``window`` (of parameter ``name``) comes after ``last_released``."""
    if last_released is not None and window <= last_released:
        raise ValueError(f"{name} must be after the last released window {last_released}, got {name}={window}: "
                         "released answers never change, so a change takes effect from a future window")


def refuse_taken(registrations: Iterable[Registration], query_id: str) -> None:
    """ValueError when ``query_id`` is registered, active or retired."""
    if any(r.query_id == query_id for r in registrations):
        raise ValueError(f"query_id {query_id!r} is already registered; pick another id "
                         "(a retired id stays taken: its releases keep its meaning)")


def _together(registrations: Sequence[Registration], first: int) -> Iterator[tuple[int, list[LinearQuery]]]:
    """``(window, the queries active in it)`` for every window from ``first`` where the active set
    can change (``first`` and each later first window): what a query active from ``first`` joins."""
    live = [r for r in registrations if r.retired_from is None or r.retired_from > first]
    for window in sorted({first} | {r.effective_from for r in live if r.effective_from > first}):
        yield window, [r.query for r in live if r.active_in(window)]


def refuse_too_wide(registrations: Sequence[Registration], query: LinearQuery, first: int) -> None:
    """ValueError when ``query``, active from ``first``, would make the queries active together in
    some window more than ``MAX_DIM`` coordinates."""
    for window, active in _together(registrations, first):
        together = query.dim + sum(q.dim for q in active)
        if together > MAX_DIM:
            raise ValueError(f"query {query.query_id!r} (dim {query.dim}) would make the queries active in "
                             f"window {window} {together} coordinates together; at most {MAX_DIM} (MAX_DIM) "
                             "are charged in one window: retire some first")


def refuse_too_big(registrations: Sequence[Registration], query: LinearQuery, first: int) -> None:
    """ValueError when running ``query``, active from ``first``, is above the bounds on what a job
    keeps for it (:func:`renyi_stream.stream.continual.prepaid.check_running_size`: horizon per strategy,
    numbers a user), or would put the running queries active together in some
    window above them (:func:`renyi_stream.stream.continual.prepaid.refuse_running_too_big`)."""
    if query.kind != "running":
        return
    for window, active in _together(registrations, first):
        refuse_running_too_big([query, *active], where=f"in window {window}")


def check_new(registrations: Sequence[Registration], query: LinearQuery, effective_from: int, *,
              last_released: int | None, schema: pa.Schema | None = None,
              registered_at: str = "") -> Registration:
    """The registration of ``query`` from ``effective_from``, checked against the catalogue
    ``registrations`` whose last released window is ``last_released``. ValueError when the id is
    taken, ``effective_from`` is not after ``last_released``, the query cannot read ``schema``
    (the input's columns, when the store knows them), the window would get too wide or a running
    query too big."""
    if not isinstance(query, LinearQuery):
        raise ValueError(f"query must be a LinearQuery, got {type(query).__name__}")
    first = window_id("effective_from", effective_from)
    refuse_taken(registrations, query.query_id)
    refuse_released("effective_from", first, last_released)
    if schema is not None:
        query.validate_against(schema)
    refuse_too_wide(registrations, query, first)
    refuse_too_big(registrations, query, first)
    return Registration(query, first, None, registered_at)


def check_retirement(registrations: Sequence[Registration], query_id: str, from_window: int, *,
                     last_released: int | None) -> Registration:
    """The registration of ``query_id`` retired from ``from_window``. From its first window (after
    ``last_released``, so never answered in public) it is *withdrawn*: active in no window, so a
    registration mistake, a typo in a column, never blocks the next window. Its id stays taken:
    an answer a job charged but has not yet published keeps its meaning when it is published.
    ValueError for an unknown or already retired query, a ``from_window`` before its first window,
    or not after ``last_released``."""
    last_active = window_id("from_window", from_window)
    found = [r for r in registrations if r.query_id == query_id]
    if not found:
        raise ValueError(f"query_id {query_id!r} is not registered")
    (registration,) = found
    if registration.retired_from is not None:
        raise ValueError(f"query {query_id!r} is already retired from window {registration.retired_from}")
    if last_active < registration.effective_from:
        raise ValueError(f"from_window must be the query's first window {registration.effective_from} (to withdraw "
                         f"it) or after it, got from_window={last_active}")
    refuse_released("from_window", last_active, last_released)
    return replace(registration, retired_from=last_active)


def active_between(registrations: Iterable[Registration], start_window: int,
                   end_window: int) -> list[Registration]:
    """The registrations active in some window of ``[start_window, end_window]`` (inclusive), by
    query id. A registration moved onto its own retirement (:func:`deferrals`) is active nowhere."""
    start, end = window_id("start_window", start_window), window_id("end_window", end_window)
    if start > end:
        raise ValueError(f"start_window must be <= end_window, got start_window={start}, end_window={end}")
    found = [r for r in registrations if r.effective_from <= end and (r.retired_from is None or r.retired_from > start)
             and (r.retired_from is None or r.retired_from > r.effective_from)]
    return sorted(found, key=lambda r: r.query_id)


def deferrals(registrations: Iterable[Registration], processed_through: int,
              answered: Collection[str]) -> list[tuple[Registration, int]]:
    """``(moved registration, old first window)`` for every query that starts in a window already
    charged (``<= processed_through``) but was never answered (its id not in ``answered``): it
    now starts at ``processed_through + 1``, or, when its retirement comes first, is moved onto
    its retirement (active nowhere). Moving it changes no released answer and keeps the catalogue
    truthful (a running total then starts where it is first answered). By query id."""
    through = window_id("processed_through", processed_through)
    moved = []
    for r in sorted(registrations, key=lambda r: r.query_id):
        if r.effective_from > through or r.query_id in answered:
            continue
        new_first = through + 1
        if r.retired_from is not None and r.retired_from <= new_first:
            moved.append((replace(r, effective_from=r.retired_from), r.effective_from))
        else:
            moved.append((replace(r, effective_from=new_first), r.effective_from))
    return moved


# --- what a plan reads -----------------------------------------------------------------------------


def numeric_reads(queries: Iterable[Any]) -> set[str]:
    """Columns that the non-categorical ``queries`` read as numbers."""
    return {c for q in queries if not getattr(q, "categorical", False) for c in q.columns_needed}


def category_reads(queries: Iterable[Any]) -> set[str]:
    """Columns that the histograms over string categories among ``queries`` read."""
    return {c for q in queries if getattr(q, "categorical", False) for c in q.columns_needed}


def plan_columns(queries: Sequence[Any], answered: Sequence[Any], header: pa.Schema, *, declared_types: bool,
                 where: str, parsed: Collection[str] = ()) -> InputColumns:
    """The kinds of the input's columns (:func:`renyi_stream.stream.columns.input_columns`) for a run that
    parses rows as ``queries`` read them and answers ``answered`` (both
    :class:`renyi_stream.queries.linear.LinearQuery`), and parses the columns ``parsed`` as numbers whatever
    the queries read (a job's ``--columns``): ValueError, before anyone is charged, when a column is
    read both as numbers and as categories, an answered query cannot read the input as
    ``header`` declares it ("Retire the query or fix the input"), or no column is numeric.
    ``where`` names the input in the messages."""
    numeric, categorical = numeric_reads(queries) | set(parsed), category_reads(queries)
    both = sorted(numeric & categorical)
    if both:
        raise ValueError(f"column(s) {both} are read both as numbers and as categories by the registered "
                         "queries; retire one of them")
    kinds = input_columns(header, declared_types=declared_types, numeric_reads=numeric, category_reads=categorical)
    for query in answered:
        try:
            query.validate_against(kinds.schema())
        except ValueError as exc:
            raise ValueError(f"{exc}. Retire the query or fix the input") from None
    if not kinds.numeric:
        raise ValueError(f"{where} has no numeric indicator columns (by its declared types and the "
                         "registered queries)")
    return kinds


def declared_header(contract: InputContract) -> pa.Schema:
    """The columns a declared contract gives queries: its numbers as float64, its categories as text."""
    return pa.schema([(c, pa.float64()) for c in contract.numeric] + [(c, pa.string()) for c in contract.categories])


def contract_defaults(contract: InputContract, *, kind: str = "window", strategy: str | None = None,
                      horizon: int | str | None = None) -> list[LinearQuery]:
    """The default queries of a catalogue with none, from a declared contract: one sum (``kind``
    window) or running total per *bounded* number column, each value clamped to its bound, in
    declared order. An unbounded column gets none: its sum would charge one user's large value
    its square. ContractError, naming the columns and the option, when no column is bounded."""
    bounded = contract.bounded
    if not bounded:
        contract.refuse_unbounded(contract.numeric)
        raise ContractError("the declared contract has no number column with a bound, so no default sum: declare "
                            "one with --column NAME=LO:HI, or register the queries first (renyi-stream query add)")
    return default_queries([c.name for c in bounded], kind=kind, strategy=strategy, horizon=horizon,
                           bounds={c.name: (c.lo, c.hi) for c in bounded})


def recorded_plan(entries: Iterable[Any]) -> list[dict]:
    """A query plan as jobs record it beside what they charged (a manifest, a snapshot's
    metadata): per query, by query id, its ``query_id``, the ``first_window`` and
    ``retired_from`` it is answered in and its public ``spec`` (the JSON of
    :meth:`renyi_stream.queries.linear.LinearQuery.to_json`). ``entries`` have ``query``, ``first_window``
    and ``retired_from`` (:class:`renyi_stream.stream.engine.shard_state.PlannedQuery`)."""
    return [{"query_id": e.query.query_id, "first_window": int(e.first_window),
             "retired_from": None if e.retired_from is None else int(e.retired_from),
             "spec": json.loads(e.query.to_json())} for e in sorted(entries, key=lambda e: e.query.query_id)]


__all__ = ["Registration", "active_between", "category_reads", "check_new", "check_retirement", "contract_defaults",
           "declared_header", "deferrals",
           "numeric_reads", "plan_columns", "recorded_plan", "refuse_released", "refuse_taken",
           "refuse_too_big", "refuse_too_wide", "window_id"]
