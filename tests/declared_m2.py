"""The input contracts the tests' ledgers declare on their first run (issue 28: a new ledger is
refused unless its run declares the id type and every indicator column; later runs keep it).

``contract("opened", "bought")``: an int64-id ledger of 0/1 indicator columns, each a number
bounded by ``[0, 1]`` (its default query the clamped sum ``clamp(NAME,0,1)``, which releases and
charges a 0/1 column exactly as the unclamped sum did). ``options(...)``: the same declaration as
``renyi-stream run``'s (and the distributed and streaming jobs') options.
"""

from __future__ import annotations

from stream.contract import DeclaredColumn, InputContract

__all__ = ["contract", "options"]


def contract(*numbers: str, id_type: str = "int64", lo: float = 0.0, hi: float = 1.0,
             unbounded: tuple[str, ...] = (), categories: tuple[str, ...] = ()) -> InputContract:
    """``numbers`` bounded by ``[lo, hi]``, then the ``unbounded`` numbers (no default query),
    then the ``categories``, in that order."""
    return InputContract(id_type, (*(DeclaredColumn(n, "number", lo, hi) for n in numbers),
                                   *(DeclaredColumn(n) for n in unbounded),
                                   *(DeclaredColumn(n, "category") for n in categories)))


def options(*numbers: str, id_type: str = "int64", bound: str = "0:1", unbounded: tuple[str, ...] = (),
            categories: tuple[str, ...] = ()) -> list[str]:
    """The command-line declaration of :func:`contract` (``--column NAME=0:1`` per number)."""
    out = ["--id-type", id_type]
    for name in numbers:
        out += ["--column", f"{name}={bound}"]
    for name in unbounded:
        out += ["--column", name]
    for name in categories:
        out += ["--category", name]
    return out

