"""Continual observation: running totals through a streaming matrix mechanism, individually accounted.

* :mod:`renyi_stream.stream.continual.strategies`: factorisations ``A = B C`` of the prefix-sum matrix
  (square-root, binary tree with least squares, window sums), dense ``C``/``B`` for tests, the
  per-window query weights and the post-processing into running-total estimates.
* :mod:`renyi_stream.stream.continual.blt`: the Buffered Linear Toeplitz factorisation (registered as
  ``"blt"``): shipped parameters per horizon, the optimiser, ``O(buffers x d)`` encode and decode.
* :mod:`renyi_stream.stream.continual.prepaid`: prepaid admission (a contribution's whole future cost charged
  when it is admitted): per-user and per-query state, charges, the rule of each running strategy
  by name (``running_rule``: ``blt``, the default, ``sqrt``, ``tree``). What the jobs run, through
  :mod:`renyi_stream.stream.engine.running`.
* :mod:`renyi_stream.stream.continual.running`: the pre-prepaid mechanism (each user's whole history queried
  and charged at every window), kept as the reference ``benchmarks/bench_continual.py`` compares
  against.
"""

from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.running import RunningQueries, RunningQuery, RunningState, RunningStep
from renyi_stream.stream.continual.strategies import (
    BinaryTree,
    SquareRootFactorization,
    Strategy,
    WindowSums,
    sqrt_coefficients,
    strategy_by_name,
    strategy_from_spec,
    tree_node_variance,
)

__all__ = [
    "RunningQueries", "RunningQuery", "RunningState", "RunningStep",
    "BinaryTree", "BufferedLinearToeplitz", "SquareRootFactorization", "Strategy", "WindowSums",
    "sqrt_coefficients", "strategy_by_name", "strategy_from_spec", "tree_node_variance",
]
