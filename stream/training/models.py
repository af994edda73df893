"""Models for full-batch private gradient descent, with per-example gradient norms for free.

Both models are trained on the cross-entropy loss ``l(theta; x_i, y_i) = -log softmax(z_i)[y_i]``
(natural log), and expose, for one pass over a batch of examples:

* ``sq_norms``: an *upper bound* on each example's squared gradient norm ``||g_i||^2``
  (``(n,)`` float64), computed without materialising any per-example gradient;
* ``weighted_sum(w)``: ``sum_i w_i g_i`` for per-example weights ``w`` (the clip factors of
  Algorithms 6 and 7), as a dict of parameter-shaped arrays, by one matrix product per layer.
  A row whose ``sq_norms`` is not finite (an overflowing example: its gradient may hold inf or
  NaN) is left out of the sum: its intermediates are masked with ``where`` before the products,
  never multiplied by a zero weight, so ``0 * inf`` never reaches the sum. ``x`` must be finite.

The algebra (Goodfellow 2015, "Efficient per-example gradient computations"; the same identity
underlies Opacus's ghost clipping): for a dense layer ``z = x W + b`` the per-example gradient
is the outer product ``x~_i (x) delta_i`` with ``x~_i = (x_i, 1)`` and ``delta_i = dl/dz_i``,
so ``||g_i||^2 = ||x~_i||^2 ||delta_i||^2 = (||x_i||^2 + 1) ||delta_i||^2``. A network's squared
per-example norm is the sum over its layers.

Units and precision: the norms are upper bounds in the data's units. Row sums of squares are
computed in the working dtype (float32 or float64) and multiplied by ``1 + (m + 4) eps`` where
``m`` is the number of terms (Higham, *Accuracy and Stability of Numerical Algorithms*, eq. 3.4:
a recursive sum of ``m`` non-negative terms errs by at most ``gamma_{m-1}``; pairwise and BLAS
orders err less), so the clip bound holds for the gradient the algorithm contributes up to the
rounding of the final matrix product. ``||x_i||^2`` is computed once, in float64.

Array module: one body for NumPy and CuPy (``renyi_stream.stream.xp.array_module`` on the inputs); no loop
over examples anywhere.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from renyi_stream.stream.training.per_example import (  # noqa: F401 (re-exported: the models' shared pieces)
    Params,
    PerExample,
    _Once,
    _slack,
    col_sq_norms,
    cross_entropy,
    row_sq_norms,
    softmax_residual,
)
from renyi_stream.stream.xp import array_module, column_sums, maybe_any, row_sq_sums, scale_in_place, to_host, zero_where

# Row blocks of the MLP's (n, hidden) intermediates are sized to stay in a core's L2 cache, so
# the element-wise passes (bias, ReLU, mask, row norms, clip weights) read each row from memory
# once instead of once per pass. On a GPU the whole batch is one block.
_BLOCK_BYTES = 1 << 20


# No block is shorter than this (a short tail joins the block before it): a one-row product
# would go to BLAS's matrix-vector kernel, which sums in another order than the matrix kernel,
# and the blocking would then change the norms' last bits.
_MIN_BLOCK_ROWS = 8


def _row_blocks(n: int, width: int, dtype: Any, xp: Any) -> list[slice]:
    if xp is not np:
        return [slice(0, n)]
    rows = max(_MIN_BLOCK_ROWS, _BLOCK_BYTES // (max(1, width) * np.dtype(dtype).itemsize))
    starts = list(range(0, n, rows))
    if len(starts) > 1 and n - starts[-1] < _MIN_BLOCK_ROWS:
        starts.pop()
    return [slice(s, starts[i + 1] if i + 1 < len(starts) else n) for i, s in enumerate(starts)]


class Model(Protocol):
    """What :func:`renyi_stream.stream.training.dpgd.private_gd` needs from a model."""

    name: str

    def init_params(self, n_features: int, n_classes: int, rng: np.random.Generator,
                    xp: Any, dtype: Any) -> Params: ...

    def logits(self, params: Params, x: Any) -> Any: ...

    def per_example(self, params: Params, x: Any, onehot_t: Any, x_sq_norms: Any) -> PerExample: ...

    def config(self) -> dict[str, Any]: ...


class LogisticRegression:
    """Multinomial logistic regression: ``z = x W + b``, ``W`` ``(d, K)``, ``b`` ``(K,)``.

    Per-example gradient: ``(x~_i (x) (p_i - y_i))``; squared norm
    ``(||x_i||^2 + 1) ||p_i - y_i||^2`` (at most ``2 (||x_i||^2 + 1)``).
    """

    name = "logreg"

    def init_params(self, n_features: int, n_classes: int, rng: np.random.Generator,
                    xp: Any = np, dtype: Any = np.float64) -> Params:
        """Zeros (Algorithm 6 allows any data-independent initialisation)."""
        return {"W": xp.zeros((n_features, n_classes), dtype=dtype), "b": xp.zeros(n_classes, dtype=dtype)}

    def logits(self, params: Params, x: Any) -> Any:
        z = x @ params["W"]
        z += params["b"]
        return z

    def per_example(self, params: Params, x: Any, onehot_t: Any, x_sq_norms: Any) -> PerExample:
        """``onehot_t``: ``(K, n)`` one-hot labels; ``x_sq_norms``: ``||x_i||^2 + 1`` as float64
        upper bounds (see :func:`augmented_sq_norms`)."""
        xp = array_module(x)
        delta_t = softmax_residual(self.logits(params, x), onehot_t)
        sq = (x_sq_norms * col_sq_norms(delta_t)) * _slack(2, np.float64)
        dropped = ~xp.isfinite(sq)  # a residual that overflowed (NaN) or a norm past float64's range
        once = _Once("LogisticRegression")

        def weighted_sum(w: Any) -> Params:
            once()
            # In place, same rounding; a select, not a zero weight, for the dropped rows (0 * NaN
            # would reach the sum), fused with the weighting on a device.
            scale_in_place(delta_t, w[None, :].astype(delta_t.dtype), dropped[None, :] if maybe_any(dropped) else None)
            # (K, n) @ (n, d): the long dimension is contiguous in both operands, which BLAS
            # streams faster than x.T @ delta for K << d (measured: 60 ms against 75 ms at
            # n = 200k, d = 784, K = 10 on 2 cores)
            return {"W": xp.ascontiguousarray((delta_t @ x).T), "b": delta_t.sum(axis=1)}

        return PerExample(sq_norms=sq, weighted_sum=weighted_sum)

    def config(self) -> dict[str, Any]:
        return {"model": self.name}


class MLP:
    """One hidden layer with ReLU: ``h = relu(x W1 + b1)``, ``z = h W2 + b2``.

    Per-example gradient of the two layers: ``x~_i (x) delta1_i`` and ``h~_i (x) delta2_i`` with
    ``delta2 = p - y`` and ``delta1 = (delta2 W2^T) * 1[x W1 + b1 > 0]``; squared norm
    ``(||x_i||^2 + 1) ||delta1_i||^2 + (||h_i||^2 + 1) ||delta2_i||^2``.

    Args:
        hidden: number of hidden units (>= 1).
    """

    name = "mlp"

    def __init__(self, hidden: int = 256) -> None:
        if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)) or hidden < 1:
            raise ValueError(f"hidden must be an integer >= 1, got hidden={hidden!r}")
        self.hidden = int(hidden)

    def init_params(self, n_features: int, n_classes: int, rng: np.random.Generator,
                    xp: Any = np, dtype: Any = np.float64) -> Params:
        """He-uniform ``W1``, Glorot-uniform ``W2``, zero biases, drawn from ``rng`` (data-independent)."""
        lim1 = np.sqrt(6.0 / n_features)
        lim2 = np.sqrt(6.0 / (self.hidden + n_classes))
        w1 = rng.uniform(-lim1, lim1, size=(n_features, self.hidden))
        w2 = rng.uniform(-lim2, lim2, size=(self.hidden, n_classes))
        return {
            "W1": xp.asarray(w1, dtype=dtype), "b1": xp.zeros(self.hidden, dtype=dtype),
            "W2": xp.asarray(w2, dtype=dtype), "b2": xp.zeros(n_classes, dtype=dtype),
        }

    def logits(self, params: Params, x: Any) -> Any:
        xp = array_module(x)
        h = x @ params["W1"]
        h += params["b1"]
        xp.maximum(h, 0, out=h)
        return h @ params["W2"] + params["b2"]

    def per_example(self, params: Params, x: Any, onehot_t: Any, x_sq_norms: Any) -> PerExample:
        xp = array_module(x)
        n, hidden, dtype = x.shape[0], params["W1"].shape[1], params["W1"].dtype
        b1, w2, b2 = params["b1"], params["W2"], params["b2"]
        w2_t = xp.ascontiguousarray(w2.T)  # (K, hidden)
        blocks = _row_blocks(n, hidden, dtype, xp)
        h = x @ params["W1"]  # the first large product; everything else is per row block
        delta1 = xp.empty_like(h)
        delta2_t = xp.empty((w2.shape[1], n), dtype=dtype)
        h_sq, d1_sq = xp.empty(n), xp.empty(n)  # ||h_i||^2, ||delta1_i||^2, float64

        for rows in blocks:
            # One visit per block of h while it is in cache: bias, ReLU, the logits, the
            # residual, delta1 and its mask, and both row norms.
            hb = h[rows]
            hb += b1
            xp.maximum(hb, 0, out=hb)  # h = relu(a); a > 0 exactly where h > 0
            h_sq[rows] = row_sq_sums(hb)
            zb = hb @ w2
            zb += b2
            d2b = softmax_residual(zb, onehot_t[:, rows])  # (K, m)
            delta2_t[:, rows] = d2b
            db = delta1[rows]
            xp.matmul(d2b.T, w2_t, out=db)
            db *= hb > 0
            d1_sq[rows] = row_sq_sums(db)
        row_slack = _slack(hidden, dtype)  # as row_sq_norms: float32 row sums made upper bounds
        sq = (x_sq_norms * (d1_sq * row_slack)
              + (h_sq * row_slack + 1.0) * col_sq_norms(delta2_t)) * _slack(4, np.float64)
        # Every factor of sq is >= its row's intermediates (or 1), so a finite sq means finite
        # h, delta1 and delta2 in that row; the other rows are masked out of the sums below.
        dropped = ~xp.isfinite(sq)
        once = _Once("MLP")

        def weighted_sum(w: Any) -> Params:
            once()
            w_d = w.astype(dtype)
            masked = maybe_any(dropped)
            g_b1 = g_w2_t = None
            for rows in blocks:  # weights in place, and the block's b1 and W2 sums, in block order
                # A select, not a zero weight, for the dropped rows: 0 * inf in h or NaN in delta
                # would reach the sums (fused with the weighting on a device: no extra pass).
                gone = dropped[rows] if masked else None
                d2b = delta2_t[:, rows]
                scale_in_place(d2b, w_d[None, rows], None if gone is None else gone[None, :])
                db = delta1[rows]
                scale_in_place(db, w_d[rows, None], None if gone is None else gone[:, None])
                if gone is not None:
                    zero_where(h[rows], gone[:, None])
                part_b1, part_w2_t = column_sums(db), d2b @ h[rows]
                g_b1 = part_b1 if g_b1 is None else g_b1 + part_b1
                g_w2_t = part_w2_t if g_w2_t is None else g_w2_t + part_w2_t
            return {"W1": x.T @ delta1, "b1": g_b1, "W2": xp.ascontiguousarray(g_w2_t.T),
                    "b2": delta2_t.sum(axis=1)}

        return PerExample(sq_norms=sq, weighted_sum=weighted_sum)

    def config(self) -> dict[str, Any]:
        return {"model": self.name, "hidden": self.hidden}


def augmented_sq_norms(x: Any) -> Any:
    """``||x_i||^2 + 1`` per row, float64 upper bound (the bias input counts as a feature 1)."""
    xp = array_module(x)
    x64 = x.astype(xp.float64, copy=False)
    return xp.einsum("ij,ij->i", x64, x64) * _slack(x.shape[1], np.float64) + 1.0


MODEL_NAMES = ("logreg", "mlp", "cnn")


def make_model(name: str, *, hidden: int = 256, conv_norms: str = "auto") -> Any:
    """``"logreg"``, ``"mlp"`` (with ``hidden`` units) or ``"cnn"`` (Opacus's MNIST network on
    28x28 images, :class:`renyi_stream.stream.training.cnn.SampleConvNet`, with ``conv_norms``)."""
    if name == "logreg":
        return LogisticRegression()
    if name == "mlp":
        return MLP(hidden)
    if name == "cnn":
        from renyi_stream.stream.training.cnn import SampleConvNet  # imports this module

        return SampleConvNet(conv_norms)
    raise ValueError(f"model must be 'logreg', 'mlp' or 'cnn', got model={name!r}")


def per_example_gradients_reference(model: LogisticRegression | MLP, params: Params, x: np.ndarray,
                                    y: np.ndarray, n_classes: int) -> dict[str, np.ndarray]:
    """Per-example gradients materialised one example at a time (float64, NumPy): the slow,
    obvious definition the fast path is tested against. ``{name: (n, *shape)}``."""
    out: dict[str, list[np.ndarray]] = {k: [] for k in params}
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    for xi, yi in zip(np.asarray(x, dtype=np.float64), np.asarray(y)):
        target = np.eye(n_classes)[yi]
        if isinstance(model, LogisticRegression):
            z = xi @ p["W"] + p["b"]
            e = np.exp(z - z.max())
            d = e / e.sum() - target
            out["W"].append(np.outer(xi, d))
            out["b"].append(d)
        else:
            a = xi @ p["W1"] + p["b1"]
            h = np.maximum(a, 0.0)
            z = h @ p["W2"] + p["b2"]
            e = np.exp(z - z.max())
            d2 = e / e.sum() - target
            d1 = (p["W2"] @ d2) * (a > 0)
            out["W1"].append(np.outer(xi, d1))
            out["b1"].append(d1)
            out["W2"].append(np.outer(h, d2))
            out["b2"].append(d2)
    return {k: np.stack(v) for k, v in out.items()}


MODEL_FORMAT = 1


def save_model(path: str | Any, model: Any, params: Params,
               metadata: dict[str, Any] | None = None) -> Any:
    """Write the parameters as a NumPy ``.npz`` (one array per parameter, on the host) with a
    ``__meta__`` JSON entry: format version, the model's configuration and ``metadata``."""
    import json
    from pathlib import Path

    arrays = {name: to_host(v) for name, v in params.items()}
    meta = {"format": MODEL_FORMAT, **model.config(), **(metadata or {})}
    with open(Path(path), "wb") as handle:
        np.savez(handle, __meta__=np.array(json.dumps(meta)), **arrays)
    return path


def load_model(path: str | Any) -> tuple[Any, Params, dict[str, Any]]:
    """Read :func:`save_model`'s file: ``(model, params, metadata)``; refuses other formats."""
    import json

    with np.load(path, allow_pickle=False) as data:
        if "__meta__" not in data.files:
            raise ValueError(f"{path} is not a renyi-stream model file (no __meta__ entry)")
        meta = json.loads(str(data["__meta__"]))
        if meta.get("format") != MODEL_FORMAT:
            raise ValueError(f"{path}: model format must be {MODEL_FORMAT}, got {meta.get('format')!r}")
        params = {k: data[k] for k in data.files if k != "__meta__"}
    model = make_model(meta["model"], hidden=int(meta.get("hidden", 256)), conv_norms=meta.get("conv_norms", "auto"))
    return model, params, meta
