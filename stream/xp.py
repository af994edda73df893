"""One array module for CPU and GPU kernels.

Kernels call :func:`array_module` on their inputs and use the returned module (``numpy`` or
``cupy``) for every operation, so the same body runs on both. CuPy is an optional extra
(``pip install 'renyi-stream[gpu]'``); it is never imported unless it is installed.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

try:  # optional GPU backend: absent in CI and on most developer machines
    import cupy as _cupy  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - exercised only where CuPy is installed
    _cupy = None


def array_module(*arrays: Any) -> ModuleType:
    """Return ``cupy`` if any argument is a CuPy array, else ``numpy``."""
    if _cupy is not None:
        return _cupy.get_array_module(*arrays)
    return np


def gpu_available() -> bool:
    """True when CuPy is importable and sees at least one CUDA device."""
    if _cupy is None:
        return False
    try:
        return _cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CUDA driver missing or broken: treat as no GPU
        return False
