"""Continual observation: running totals through a streaming matrix mechanism, individually accounted.

* :mod:`stream.continual.strategies`: factorisations ``A = B C`` of the prefix-sum matrix
  (square-root, binary tree with least squares, window sums), dense ``C``/``B`` for tests, the
  per-window query weights and the post-processing into running-total estimates.
* :mod:`stream.continual.blt`: the Buffered Linear Toeplitz factorisation (registered as
  ``"blt"``): shipped parameters per horizon, the optimiser, ``O(buffers x d)`` encode and decode.
* :mod:`stream.continual.prepaid`: prepaid admission (a contribution's whole future cost charged
  when it is admitted): per-user and per-query state, charges, the filter decision.
* :mod:`stream.continual.running`: the per-shard state (each user's history), the query at each
  window charged through the shared :class:`stream.ledger.Ledger`, keyed noisy releases, Arrow
  snapshots.
"""

from stream.continual.blt import BufferedLinearToeplitz
from stream.continual.running import RunningQueries, RunningQuery, RunningState, RunningStep
from stream.continual.strategies import (
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
