"""A ledger's declared input contract (issue 28) for tests whose first run must declare it: the
same declaration as a Python :class:`stream.contract.InputContract` (``JobConfig(contract=...)``)
or as the jobs' command-line options (``renyi-stream run``, the distributed and streaming jobs).

Columns are spelled as on the command line: ``"opened=0:1"`` a number bounded to [0, 1] (its
default query is the clamped sum), ``"x"`` a number with no bound (no default query: register
the one the test needs); ``categories`` are text columns for histograms."""

from __future__ import annotations

from typing import Sequence

from stream.contract import InputContract


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
