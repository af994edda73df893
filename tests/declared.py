"""A ledger's declared input contract (issue 28) for tests whose first run must declare it: the
same declaration as a Python :class:`renyi_stream.stream.contract.InputContract` (``JobConfig(contract=...)``)
or as the jobs' command-line options (``renyi-stream run``, the distributed and streaming jobs).

Columns are spelled as on the command line: ``"opened=0:1"`` a number bounded to [0, 1] (its
default query is the clamped sum), ``"x"`` a number with no bound (no default query: register
the one the test needs); ``categories`` are text columns for histograms."""

from __future__ import annotations

from typing import Sequence

from renyi_stream.stream.contract import InputContract


def contract(id_type: str, *columns: str, categories: Sequence[str] = ()) -> InputContract:
    """The contract the options :func:`flags` gives the same arguments declare."""
    return InputContract.from_options(id_type=id_type, columns=columns, categories=categories)


def flags(id_type: str, *columns: str, categories: Sequence[str] = ()) -> list[str]:
    """``--id-type ID_TYPE --column C ... --category K ...``."""
    out = ["--id-type", id_type]
    for column in columns:
        out += ["--column", column]
    for category in categories:
        out += ["--category", category]
    return out


def register_unclamped_defaults(store: str, columns: Sequence[str], effective_from: int, *, kind: str = "window",
                                strategy: str | None = None, horizon: int | str | None = None) -> None:
    """Register in the DuckDB release store ``store``, before a ledger's first run, the default
    queries a ledger without a declaration got for ``columns``: one *unclamped* sum (``sum:c``)
    or running total (``running:c``) per column, from window ``effective_from``. For tests that
    feed values outside any bound on purpose (charges, drops, overflow): declare those columns
    without a bound (``"c"``), which gives them no default query of their own."""
    from renyi_stream.queries.linear import default_queries
    from renyi_stream.queries.registry import QueryRegistry
    from renyi_stream.queries.release_store import ReleaseStore

    with ReleaseStore(store) as opened:
        registry = QueryRegistry(opened)
        for query in default_queries(list(columns), kind=kind, strategy=strategy, horizon=horizon):
            registry.add(query, effective_from=effective_from)
