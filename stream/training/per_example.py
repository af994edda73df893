"""What every model of the training stage shares: the result of one pass over a batch
(:class:`PerExample`) and the per-example pieces the models compute it from, as upper bounds in
the working dtype (see :mod:`renyi_stream.stream.training.models` for the units and the rounding argument).

A module of its own so that :mod:`~renyi_stream.stream.training.models` and
:mod:`~renyi_stream.stream.training.cnn` both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from renyi_stream.stream.xp import array_module, col_sq_sums, row_sq_sums

Params = dict[str, Any]


def _slack(terms: int, dtype: Any) -> float:
    """Relative factor that turns a computed sum of ``terms`` squares into an upper bound."""
    return 1.0 + (terms + 4) * float(np.finfo(dtype).eps)


class _Once:
    """``weighted_sum`` scales the model's intermediates in place, so it may be called once."""

    def __init__(self, name: str) -> None:
        self.name, self.used = name, False

    def __call__(self) -> None:
        if self.used:
            raise RuntimeError(f"{self.name}.per_example(...).weighted_sum may be called once (it scales in place)")
        self.used = True


def row_sq_norms(a: Any) -> Any:
    """Upper bound on the squared L2 norm of each row of a 2-d array, as float64 ``(n,)``."""
    xp = array_module(a)
    return row_sq_sums(a).astype(xp.float64) * _slack(a.shape[1], a.dtype)


def softmax_residual(logits: Any, onehot_t: Any) -> Any:
    """``(softmax(logits) - onehot)^T``: the cross-entropy gradient w.r.t. the logits, as a
    ``(K, n)`` array (classes by examples; ``onehot_t`` is ``(K, n)``).

    The transposed layout makes every reduction over the ``K`` classes a sum of ``K`` contiguous
    rows of length ``n`` (vectorised over examples) instead of ``n`` tiny strided reductions.
    """
    xp = array_module(logits)
    zt = xp.ascontiguousarray(logits.T)
    zt -= zt.max(axis=0)
    xp.exp(zt, out=zt)
    zt /= zt.sum(axis=0)
    zt -= onehot_t
    return zt


def col_sq_norms(a_t: Any) -> Any:
    """Upper bound on the squared L2 norm of each *column* of a ``(K, n)`` array, float64 ``(n,)``."""
    xp = array_module(a_t)
    return col_sq_sums(a_t).astype(xp.float64) * _slack(a_t.shape[0], a_t.dtype)


def cross_entropy(logits: Any, labels: Any) -> Any:
    """Per-example cross-entropy (nats), ``(n,)`` float64."""
    xp = array_module(logits)
    z = logits.astype(xp.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_norm = xp.log(xp.exp(z).sum(axis=1))
    return log_norm - z[xp.arange(z.shape[0]), labels]


@dataclass(frozen=True)
class PerExample:
    """One pass over a batch: bounds on per-example squared gradient norms, and a way to sum
    the per-example gradients with weights (without ever forming them one by one)."""

    sq_norms: Any  # (n,) float64, >= ||g_i||^2 (squared data units)
    # w (n,) -> {name: sum_i w_i g_i} over the rows whose sq_norms is finite; call at most once
    weighted_sum: Callable[[Any], Params]
