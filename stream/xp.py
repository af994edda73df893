"""One array module for CPU and GPU kernels.

Kernels call :func:`array_module` on their inputs and use the returned module (``numpy`` or
``cupy``) for every operation, so the same body runs on both. CuPy is an optional extra
(``pip install 'renyi-stream[gpu]'``); it is never imported unless it is installed.

A kernel never moves data from the device to the host implicitly. Where it must (a released
value, a check that raises), it says so with :func:`to_host` or :func:`host_all`, and its
docstring counts those transfers. Where a data-dependent branch only skips work that would not
change the result (a rare-case pass over flagged rows), it asks :func:`maybe_any`, which on a
device answers without waiting for the device. ``renyi_stream.stream.testing.strict_xp`` is an array module
that refuses every implicit conversion and counts the explicit ones; the CI runs the kernels
through it (``tests/test_device_path.py``), registered here by :func:`register_array_module`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

try:  # optional GPU backend: absent in CI and on most developer machines
    import cupy as _cupy  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - exercised only where CuPy is installed
    _cupy = None

# Array types of other modules (the test module renyi_stream.stream.testing.strict_xp) and their modules.
_REGISTERED: dict[type, ModuleType] = {}


def register_array_module(array_type: type, module: ModuleType) -> None:
    """Make :func:`array_module` return ``module`` for arguments of ``array_type``.

    For array modules that mimic a device (``renyi_stream.stream.testing.strict_xp``): ``module`` must offer
    the NumPy functions the kernels call, plus ``asnumpy``. NumPy's own types cannot be
    registered, so registering never changes what a NumPy array gets.
    """
    if not isinstance(array_type, type) or issubclass(array_type, (np.ndarray, np.generic)):
        raise ValueError(f"array_type must be a class other than NumPy's, got array_type={array_type!r}")
    if not isinstance(module, ModuleType) or not hasattr(module, "asnumpy"):
        raise ValueError(f"module must be a module with an asnumpy function, got module={module!r}")
    _REGISTERED[array_type] = module


def array_module(*arrays: Any) -> ModuleType:
    """Return ``cupy`` if any argument is a CuPy array, a registered module if any argument is
    of its array type, else ``numpy``."""
    if _REGISTERED:
        for a in arrays:
            module = _REGISTERED.get(type(a))
            if module is not None:
                return module
    if _cupy is not None:
        return _cupy.get_array_module(*arrays)
    return np


def to_host(a: Any) -> np.ndarray:
    """``a`` as a NumPy array: a copy from the device for a device array (one explicit
    device-to-host transfer), ``np.asarray(a)`` otherwise (no copy for a NumPy array)."""
    xp = array_module(a)
    if xp is np:
        return np.asarray(a)
    return xp.asnumpy(a)


def host_all(condition: Any) -> bool:
    """Whether every entry of ``condition`` is true: one explicit transfer of one bool from a
    device (free on NumPy). For checks that raise, which must know the answer."""
    xp = array_module(condition)
    return bool(to_host(xp.all(condition)))


def maybe_any(mask: Any) -> bool:
    """``False`` only if ``mask`` is all false *and* that is known without a device round trip.

    On NumPy this is ``mask.any()``; on a device it is always ``True``, so a kernel that skips a
    rare-case pass when no row needs it runs the pass on a device instead of waiting for the
    answer. Callers must make the pass a no-op for unflagged rows (``xp.where`` on the mask,
    never ``a[mask]``, which synchronises), so both answers give the same result.
    """
    if array_module(mask) is np:
        return bool(np.any(mask))
    return True


# Reductions whose CuPy form is slow, each with a CuPy form measured on an H100 (1M x 256 float32
# unless said; ``benchmarks/gpu_step_profile.py --alternatives``): CuPy's reduction over the
# leading axis of a C-contiguous array ran at 43 GB/s (23.6 ms) against 0.40 ms for the product
# with a vector of ones; its einsum "ij,ij->j" over a (10, 1M) array ran as 16 batched
# matrix-vector calls (1.67 ms) against 0.16 ms for the element-wise square and sum; its einsum
# "ij,ij->i" ran as 32 batched matrix-vector calls (1.51 ms), against one fused read here.
# NumPy and registered modules keep NumPy's forms, so the strict module still checks NumPy's bits.
_ROW_SQ_SUM = None


def _is_cupy(a: Any) -> bool:
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def row_sq_sums(a: Any) -> Any:
    """``sum_j a[i, j]^2`` per row of a 2-d array, in ``a``'s dtype, as ``(n,)``.

    Summation order differs between modules (NumPy's einsum, one fused reduction per row on
    CuPy); callers that need an upper bound apply a rounding slack valid for any order."""
    if _is_cupy(a):
        global _ROW_SQ_SUM
        if _ROW_SQ_SUM is None:
            _ROW_SQ_SUM = _cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0",
                                                "renyi_row_sq_sum")
        return _ROW_SQ_SUM(a, axis=1)
    return array_module(a).einsum("ij,ij->i", a, a)


_SCALE_OR_ZERO = None
_ZERO_WHERE = None


def scale_in_place(a: Any, w: Any, gone: Any = None) -> None:
    """``a *= w`` in place (``w`` broadcast against ``a``); then, with ``gone`` (a boolean mask
    broadcast against ``a``), the flagged entries set to 0 by a select, never a product, so an
    inf or NaN there leaves nothing behind (``0 * inf`` is NaN). One fused pass on CuPy; on
    NumPy and registered modules the multiply, then ``where`` (the same bits)."""
    if gone is not None and _is_cupy(a):
        global _SCALE_OR_ZERO
        if _SCALE_OR_ZERO is None:
            _SCALE_OR_ZERO = _cupy.ElementwiseKernel("T w, bool g", "T a", "a = g ? (T)0 : a * w",
                                                     "renyi_scale_or_zero")
        _SCALE_OR_ZERO(_cupy.broadcast_to(w, a.shape), _cupy.broadcast_to(gone, a.shape), a)
        return
    a *= w
    if gone is not None:
        a[...] = array_module(a).where(gone, 0.0, a)


def zero_where(a: Any, gone: Any) -> None:
    """Set the entries of ``a`` where ``gone`` (broadcast) is true to 0, in place. On CuPy a kernel
    that writes only those entries (no pass over the others' memory)."""
    if _is_cupy(a):
        global _ZERO_WHERE
        if _ZERO_WHERE is None:
            _ZERO_WHERE = _cupy.ElementwiseKernel("bool g", "T a", "if (g) a = (T)0", "renyi_zero_where")
        _ZERO_WHERE(_cupy.broadcast_to(gone, a.shape), a)
        return
    a[...] = array_module(a).where(gone, 0.0, a)


def col_sq_sums(a: Any) -> Any:
    """``sum_i a[i, j]^2`` per column of a 2-d array with few rows (a ``(K, n)`` residual), in
    ``a``'s dtype, as ``(n,)``; summation order as :func:`row_sq_sums`."""
    if _is_cupy(a):
        return (a * a).sum(axis=0)
    return array_module(a).einsum("ij,ij->j", a, a)


def column_sums(a: Any) -> Any:
    """``a.sum(axis=0)`` of a 2-d array with many rows, in ``a``'s dtype; on CuPy as the product
    ``ones @ a`` (a matrix-vector call), whose summation order is cuBLAS's."""
    if _is_cupy(a):
        return _cupy.ones(a.shape[0], dtype=a.dtype) @ a
    return a.sum(axis=0)


def gpu_available() -> bool:
    """True when CuPy is importable and sees at least one CUDA device."""
    if _cupy is None:
        return False
    try:
        return _cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CUDA driver missing or broken: treat as no GPU
        return False
