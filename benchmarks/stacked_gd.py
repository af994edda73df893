"""Private gradient descent (Algorithm 6) for several hyperparameter settings at once, sharing
the reads of the data: the MNIST experiment's tuning tool.

A full-batch logistic-regression step is memory-bound: it reads ``x`` (45,000 x 784 float32,
141 MB in the MNIST tuning) twice, for two skinny products (``x W`` with ``W`` 784 x 10, and
``delta^T x``). ``M`` settings that share the data, the step count ``k``, the noise multiplier
``sigma`` and the normaliser ``N`` (in the MNIST tuning: the grid points of one model, epsilon,
``k`` and noise seed) can share those reads: their weights are stacked into one ``(d, M K)``
product (``(d, M H)`` for the MLP's first layer), and their weighted gradient sums come out of
one ``(M K, rows) @ (rows, d)`` product. Everything else is per setting: the clip ``C_s``, the
learning rate ``eta_s`` and the noise generator.

What each setting gets is Algorithm 6 exactly as :func:`renyi_stream.stream.training.dpgd.private_gd` runs
it with ``GDConfig(clip=C_s, noise_multiplier=sigma, learning_rate=eta_s, steps=k)`` (filtering
off) and a fresh :class:`~renyi_stream.stream.training.budget.TrainingLedger` whose budget is at least
``k / (2 sigma^2)``, so that it never binds (every step charges at most ``1 / (2 sigma^2)``: the
ledger's clip factor is 1 and it scales nothing):

* per-example squared gradient norms by the identity the models use
  (``(||x_i||^2 + 1) ||delta_i||^2`` per layer, :mod:`renyi_stream.stream.training.models`), with the same
  float32/float64 rules (row sums in the working dtype made upper bounds by the same slack
  factors, the products in float64);
* clip factors ``min(1, C_s / ||g_i||)`` per setting, computed as ``private_gd`` computes them; a
  row whose norm is not finite in a setting is dropped from that setting's step, its intermediates
  masked with ``where`` before the products, as the models mask them;
* noise ``N(0, (sigma C_s)^2)`` per coordinate, drawn per setting from its own generator in the
  model's parameter order (``rng.standard_normal(p.shape) * sigma C_s``, cast to the dtype), so a
  setting's noise is the noise its separate run draws from the same generator;
* ``theta -= (eta_s / N) (sum_i g~_i + noise)``.

Results agree with the separate runs up to float rounding (the stacked products sum in another
order than the per-setting ones; tested in ``tests/test_stacked_gd.py``). Privacy: each setting
is its own run of Algorithm 6 (Proposition 5.1: ``k / (2 sigma^2)``-zCDP per setting, on the
same users); the stack releases ``M`` of them, and tuning over them is, as in the paper, not
accounted. A benchmark tool: no ledger, no stopping rule, no curator counts.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from renyi_stream.stream.training.dpgd import GDConfig, TrainingData, _int_at_least, default_chunk_rows
from renyi_stream.stream.training.models import MLP, LogisticRegression, Params, _row_blocks, _slack
from renyi_stream.stream.training.normaliser import check_normaliser
from renyi_stream.stream.xp import array_module, maybe_any


def _check_stack(configs: Sequence[GDConfig], rngs: Sequence[np.random.Generator],
                 init_rngs: Sequence[np.random.Generator] | None) -> int:
    """Validate the stack; the step count ``k`` it shares."""
    configs = list(configs)
    if len(configs) < 1:
        raise ValueError(f"configs must hold at least one setting (M >= 1), got M={len(configs)}")
    for i, config in enumerate(configs):
        if not isinstance(config, GDConfig):
            raise ValueError(f"configs[{i}] must be a GDConfig, got configs[{i}]={config!r}")
        if config.filtering:
            raise ValueError(f"configs[{i}].filtering must be False (a stack runs Algorithm 6), "
                             f"got configs[{i}].filtering=True")
        # C > 0 and eta > 0 are GDConfig's own checks (at construction), as for private_gd.
        for name in ("steps", "noise_multiplier"):
            if getattr(config, name) != getattr(configs[0], name):
                raise ValueError(
                    f"configs[{i}].{name} must equal configs[0].{name}={getattr(configs[0], name)!r} (the settings "
                    f"of a stack share k and sigma), got configs[{i}].{name}={getattr(config, name)!r}")
    if len(rngs) != len(configs):
        raise ValueError(f"rngs must hold one generator per setting ({len(configs)}), got len(rngs)={len(rngs)}")
    if init_rngs is not None and len(init_rngs) != len(configs):
        raise ValueError(f"init_rngs must hold one generator per setting ({len(configs)}), "
                         f"got len(init_rngs)={len(init_rngs)}")
    return configs[0].steps


def _softmax_residual_t(z: Any, onehot_t: Any) -> Any:
    """``(softmax(z_s) - onehot)^T`` for every setting: ``z`` ``(M, rows, K)`` -> ``(M, K, rows)``,
    as :func:`renyi_stream.stream.training.models.softmax_residual` per setting (reductions over the ``K``
    contiguous rows of length ``rows``)."""
    xp = array_module(z)
    zt = xp.ascontiguousarray(z.transpose(0, 2, 1))
    zt -= zt.max(axis=1, keepdims=True)
    xp.exp(zt, out=zt)
    zt /= zt.sum(axis=1, keepdims=True)
    zt -= onehot_t[None]
    return zt


def _col_sq_norms(a_t: Any) -> Any:
    """``(M, K, rows)`` -> ``(M, rows)`` float64 upper bounds on each column's squared norm
    (:func:`renyi_stream.stream.training.models.col_sq_norms` per setting)."""
    xp = array_module(a_t)
    return xp.einsum("mkr,mkr->mr", a_t, a_t).astype(xp.float64) * _slack(a_t.shape[1], a_t.dtype)


class _StackedLogReg:
    """``M`` logistic regressions: ``W`` ``(d, M K)``, ``b`` ``(M K,)``; setting ``s``'s ``W`` is
    the column block ``[s K, (s + 1) K)``."""

    keys = ("W", "b")

    def __init__(self, params: list[Params], xp: Any) -> None:
        self.m, self.k = len(params), params[0]["b"].shape[0]
        self.w = xp.concatenate([p["W"] for p in params], axis=1)
        self.b = xp.concatenate([p["b"] for p in params])

    def views(self, s: int) -> Params:
        cols = slice(s * self.k, (s + 1) * self.k)
        return {"W": self.w[:, cols], "b": self.b[cols]}

    def norms_and_sum(self, x: Any, onehot_t: Any, x_sq: Any) -> tuple[Any, Any]:
        """``(sq_norms (M, rows) float64, weighted_sum(w (M, rows)) -> {key: (M, ...)})``."""
        xp = array_module(x)
        z = x @ self.w  # (rows, M K): one read of the slice for all M settings
        z += self.b
        delta_t = _softmax_residual_t(z.reshape(x.shape[0], self.m, self.k).transpose(1, 0, 2), onehot_t)
        sq = (x_sq[None, :] * _col_sq_norms(delta_t)) * _slack(2, np.float64)
        dropped = ~xp.isfinite(sq)  # (M, rows), as LogisticRegression.per_example

        def weighted_sum(w: Any) -> dict[str, Any]:
            xp.multiply(delta_t, w[:, None, :].astype(delta_t.dtype), out=delta_t)  # in place, as the model
            if maybe_any(dropped):
                delta_t[...] = xp.where(dropped[:, None, :], 0.0, delta_t)
            flat = delta_t.reshape(self.m * self.k, x.shape[0])
            # (M K, rows) @ (rows, d): the second read of the slice, still in cache
            return {"W": (flat @ x).reshape(self.m, self.k, -1).transpose(0, 2, 1), "b": delta_t.sum(axis=2)}

        return sq, weighted_sum


class _StackedMLP:
    """``M`` one-hidden-layer MLPs: ``W1`` ``(d, M H)``, ``b1`` ``(M H,)`` (setting ``s``: column
    block ``[s H, (s + 1) H)``), ``W2`` ``(M, H, K)``, ``b2`` ``(M, K)``."""

    keys = ("W1", "b1", "W2", "b2")

    def __init__(self, params: list[Params], xp: Any) -> None:
        self.m, self.h = len(params), params[0]["b1"].shape[0]
        self.w1 = xp.concatenate([p["W1"] for p in params], axis=1)
        self.b1 = xp.concatenate([p["b1"] for p in params])
        self.w2 = xp.stack([p["W2"] for p in params])
        self.b2 = xp.stack([p["b2"] for p in params])

    def views(self, s: int) -> Params:
        cols = slice(s * self.h, (s + 1) * self.h)
        return {"W1": self.w1[:, cols], "b1": self.b1[cols], "W2": self.w2[s], "b2": self.b2[s]}

    def norms_and_sum(self, x: Any, onehot_t: Any, x_sq: Any) -> tuple[Any, Any]:
        xp = array_module(x)
        rows, m, hidden, dtype = x.shape[0], self.m, self.h, self.w1.dtype
        h = x @ self.w1  # (rows, M H): one read of the slice for all M first layers
        h += self.b1
        xp.maximum(h, 0, out=h)
        h3 = h.reshape(rows, m, hidden)
        hm = h3.transpose(1, 0, 2)  # (M, rows, H) view: the second layer per setting (small)
        z = xp.matmul(hm, self.w2)  # (M, rows, K)
        z += self.b2[:, None, :]
        delta2_t = _softmax_residual_t(z, onehot_t)  # (M, K, rows)
        delta1 = xp.empty((rows, m, hidden), dtype=dtype)  # (rows, M H) for the stacked W1 product
        xp.matmul(delta2_t.transpose(0, 2, 1), self.w2.transpose(0, 2, 1), out=delta1.transpose(1, 0, 2))
        delta1 *= h3 > 0
        row_slack = _slack(hidden, dtype)  # as MLP.per_example: float32 row sums made upper bounds
        h_sq = xp.einsum("rmh,rmh->mr", h3, h3).astype(xp.float64)
        d1_sq = xp.einsum("rmh,rmh->mr", delta1, delta1).astype(xp.float64)
        sq = (x_sq[None, :] * (d1_sq * row_slack)
              + (h_sq * row_slack + 1.0) * _col_sq_norms(delta2_t)) * _slack(4, np.float64)
        dropped = ~xp.isfinite(sq)  # (M, rows), as MLP.per_example

        def weighted_sum(w: Any) -> dict[str, Any]:
            w_d = w.astype(dtype)
            xp.multiply(delta2_t, w_d[:, None, :], out=delta2_t)
            xp.multiply(delta1, w_d.T[:, :, None], out=delta1)
            if maybe_any(dropped):  # each setting's dropped rows out of its sums, as the model masks them
                gone = dropped.T[:, :, None]  # (rows, M, 1)
                delta2_t[...] = xp.where(dropped[:, None, :], 0.0, delta2_t)
                delta1[...] = xp.where(gone, 0.0, delta1)
                h3[...] = xp.where(gone, 0.0, h3)
            g_b1 = g_w2_t = None
            # b1 and W2 summed per row block, in block order, over the blocks MLP.per_example uses:
            # the same partial sums as a separate run, so float32 rounding does not part them (a
            # whole-slice sum differed in the last bits, which 50 steps at eta C = 9 grew to 0.8% of
            # validation accuracy on MNIST)
            for block in _row_blocks(rows, hidden, dtype, xp):
                part_b1 = delta1[block].sum(axis=0)  # (M, H)
                part_w2_t = xp.matmul(delta2_t[:, :, block], hm[:, block])  # (M, K, H)
                g_b1 = part_b1 if g_b1 is None else g_b1 + part_b1
                g_w2_t = part_w2_t if g_w2_t is None else g_w2_t + part_w2_t
            g_w1 = x.T @ delta1.reshape(rows, m * hidden)  # (d, M H): the second read of the slice
            return {"W1": g_w1.reshape(-1, m, hidden).transpose(1, 0, 2), "b1": g_b1,
                    "W2": g_w2_t.transpose(0, 2, 1), "b2": delta2_t.sum(axis=2)}

        return sq, weighted_sum


def stacked_private_gd(
    model: LogisticRegression | MLP,
    data: TrainingData,
    *,
    configs: Sequence[GDConfig],
    rngs: Sequence[np.random.Generator],
    init_rngs: Sequence[np.random.Generator] | None = None,
    normaliser: float,
    chunk_rows: int | None = None,
) -> list[Params]:
    """Run Algorithm 6 for ``M = len(configs)`` settings on ``data`` at once; the final iterate of
    each, in ``configs``' order.

    Args:
        model: :class:`~renyi_stream.stream.training.models.LogisticRegression` or ``MLP``.
        data: the full batch (:func:`renyi_stream.stream.training.dpgd.prepare_data`).
        configs: ``M >= 1`` configurations of Algorithm 6 (``filtering=False``) sharing ``steps``
            (``k``) and ``noise_multiplier`` (``sigma``); their ``clip`` (``C_s`` > 0) and
            ``learning_rate`` (``eta_s`` > 0) may differ (``GDConfig`` checks them).
        rngs: one gradient-noise generator per setting, as ``private_gd``'s ``rng``.
        init_rngs: one generator per setting for ``model.init_params`` (default: a fresh
            ``np.random.default_rng(0)`` each, as ``private_gd``).
        normaliser: ``N`` > 0, the public divisor of the noisy sums (``private_gd``'s).
        chunk_rows: rows per slice of ``x`` (default :func:`~renyi_stream.stream.training.dpgd.default_chunk_rows`:
            a slice's second read finds it in cache).

    Guarantees: setting ``s``'s result is, up to float rounding, what ``private_gd(model, data,
    config=configs[s], rng=rngs[s], init_rng=init_rngs[s], normaliser=normaliser, ledger=L)``
    returns as ``final_params`` for a fresh ``L`` with a budget of at least ``k / (2 sigma^2)``;
    it does not depend on which other settings share the stack (up to the same rounding).
    Raises ``ValueError`` naming the parameter for an empty stack, settings with different ``k``
    or ``sigma``, filtering, a model other than the two, or generator lists of the wrong length.
    """
    steps = _check_stack(configs, rngs, init_rngs)
    configs = list(configs)
    m = len(configs)
    if isinstance(model, LogisticRegression):
        stacked_type: Any = _StackedLogReg
    elif isinstance(model, MLP):
        stacked_type = _StackedMLP
    else:
        raise ValueError(f"model must be a LogisticRegression or an MLP, got model={model!r}")
    normaliser = check_normaliser(normaliser)
    if chunk_rows is not None:
        _int_at_least("chunk_rows", chunk_rows, 1)
    xp = array_module(data.x)
    n, dtype = data.n, data.x.dtype
    inits = [model.init_params(data.n_features, data.n_classes,
                               init_rngs[s] if init_rngs is not None else np.random.default_rng(0), xp, dtype)
             for s in range(m)]
    stack = stacked_type(inits, xp)
    clips = xp.asarray([float(c.clip) for c in configs])[:, None]  # (M, 1)
    if chunk_rows is None:
        # private_gd's default at this data size: the per-setting runs it is compared with slice alike
        chunk_rows = default_chunk_rows(n, data.n_features, dtype, xp)
    slices = [slice(s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)]

    with np.errstate(over="ignore", invalid="ignore"):  # a dropped row is expected, as in private_gd
        for _ in range(steps):
            grads: dict[str, Any] | None = None
            for rows in slices:
                sq, weighted_sum = stack.norms_and_sum(data.x[rows], data.onehot_t[:, rows], data.x_sq_norms[rows])
                norm = xp.sqrt(sq)
                norm /= clips  # ||g_i|| / C_s, as private_gd
                finite = xp.isfinite(norm)  # not finite: dropped from the setting's step, as private_gd
                over = norm > 1.0
                over &= finite
                safe_norm = xp.where(norm > 0, norm, 1.0)
                # private_gd's bound / norm with bound 1, ledger scale 1
                w = xp.where(finite, xp.where(over, 1.0 / safe_norm, 1.0), 0.0)
                part = weighted_sum(w)
                if grads is None:
                    grads = part
                else:
                    for key in grads:
                        grads[key] = grads[key] + part[key]
            assert grads is not None
            for s, config in enumerate(configs):  # O(params) per setting: its noise and its update
                noise_std = config.noise_std  # sigma C_s, sigma shared by the stack
                lr = config.learning_rate / normaliser
                params = stack.views(s)
                for key in stack.keys:  # the model's parameter order: private_gd's order of noise draws
                    p = params[key]
                    g = grads[key][s] + xp.asarray(rngs[s].standard_normal(p.shape) * noise_std, dtype=p.dtype)
                    p -= lr * g
    return [{key: xp.ascontiguousarray(v) for key, v in stack.views(s).items()} for s in range(m)]
