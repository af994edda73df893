"""A strict array module: CuPy's refusals on the CPU, so the device path runs in CI without a GPU.

The kernels pick their array module with :func:`renyi_stream.stream.xp.array_module`; on a GPU that is CuPy,
whose arrays live in device memory and refuse to become NumPy arrays behind the code's back.
Code that is only ever run on NumPy can hide a stray ``np.`` call, a ``float(x)`` or a host
round trip that works on NumPy and fails (or stalls the device) on CuPy. This module wraps NumPy
arrays in :class:`StrictArray` and refuses what CuPy refuses, computing with NumPy underneath,
so a kernel run on strict arrays gives NumPy's bits and fails loudly where it would not run on
a device. Importing it registers it with :func:`renyi_stream.stream.xp.register_array_module`, so
``array_module(strict_array)`` is this module; nothing in NumPy is patched.

What a :class:`StrictArray` refuses (``TypeError``):

* implicit conversion to NumPy: ``np.asarray(x)``, ``np.array(x)``, ``x.__array__()``, with
  CuPy's message ("Implicit conversion to a NumPy array is not allowed");
* a NumPy array as an operand: ``x + np.ones(3)``, ``np.ones(3) + x``, ``xp.where(m, x,
  np.zeros(3))``, as CuPy's "Unsupported type <class 'numpy.ndarray'>";
* NumPy functions and ufuncs called on it (``np.sqrt(x)``, ``np.where(x > 0, x, 0)``). CuPy
  would serve these through NEP 18 dispatch; refusing them keeps every kernel on ``xp``, where a
  function CuPy lacks fails here too instead of on the first GPU run;
* Python scalars from arrays of any shape: ``float(x)``, ``int(x)``, ``bool(x)``, ``if x:``,
  ``operator.index(x)``. CuPy allows them for 0-d arrays by synchronising with the device: a
  hidden host round trip, which a kernel must make explicit instead.

What it allows, counted by :func:`host_traffic`:

* ``transfers``: explicit device-to-host copies, ``xp.asnumpy(x)``, ``x.get()``, ``x.item()``,
  ``x.tolist()`` (``renyi_stream.stream.xp.to_host`` and ``renyi_stream.stream.xp.host_all`` use these);
* ``uploads``: host-to-device copies, ``xp.asarray(numpy_array)`` and NumPy arrays or lists used
  as indices or as values of an advanced-index assignment (CuPy copies them over);
* ``syncs``: operations CuPy can only do by waiting for the device to report a size, which it
  does without complaint: boolean-mask indexing (``x[mask]``, ``x[mask] = v``), ``nonzero``,
  ``flatnonzero``, ``argwhere``, ``unique``, ``bincount``, ``compress``, ``extract``.

A kernel's docstring says how many transfers it makes; tests assert the counts (a step of the
training loop makes none). What only a real GPU shows is outside this module: speed, and CUDA's
own numerics (cuBLAS summation order, atomics in scatter-adds, fused multiply-adds), which can
differ from NumPy in the last bits.
"""

from __future__ import annotations

import builtins  # the module's own any, all, max, ... shadow the builtins below
import contextlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from renyi_stream.stream.xp import register_array_module

IMPLICIT_CONVERSION = ("Implicit conversion to a NumPy array is not allowed. "
                       "Please use `.get()` to construct a NumPy array explicitly.")  # CuPy's words


# ---------------------------------------------------------------------------------------------
# Counting host traffic
# ---------------------------------------------------------------------------------------------


@dataclass
class HostTraffic:
    """What crossed between host and the (pretend) device while :func:`host_traffic` was open."""

    transfers: int = 0  # explicit device -> host copies
    uploads: int = 0  # host -> device copies
    syncs: int = 0  # operations that wait for the device to report a size
    events: list[tuple[str, str]] = field(default_factory=list)  # (kind, operation), in order

    def record(self, kind: str, operation: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.events.append((kind, operation))


_OPEN: list[HostTraffic] = []


@contextlib.contextmanager
def host_traffic() -> Iterator[HostTraffic]:
    """Count the transfers, uploads and syncs of strict arrays inside the ``with`` block."""
    counts = HostTraffic()
    _OPEN.append(counts)
    try:
        yield counts
    finally:
        _OPEN.remove(counts)


def _record(kind: str, operation: str) -> None:
    for counts in _OPEN:
        counts.record(kind, operation)


# ---------------------------------------------------------------------------------------------
# Operands and results
# ---------------------------------------------------------------------------------------------

_SCALARS = (bool, int, float, complex, np.generic)


def _mixing(value: Any, where: str) -> TypeError:
    return TypeError(f"Unsupported type {type(value)} in {where}: a strict (device) array cannot be "
                     "mixed with a NumPy array; move it with xp.asarray first")


def _operand(value: Any, where: str) -> Any:
    """The NumPy value behind one argument of an operation; refuses NumPy arrays (mixing)."""
    if isinstance(value, StrictArray):
        return value._data
    if isinstance(value, np.ndarray):
        raise _mixing(value, where)
    if isinstance(value, (list, tuple)):
        return type(value)(_operand(v, where) for v in value)
    return value


def _wrap(result: Any) -> Any:
    """NumPy results as strict arrays (a NumPy scalar becomes a 0-d array, as CuPy returns)."""
    if isinstance(result, np.ndarray):
        return StrictArray(result)
    if isinstance(result, np.generic):
        return StrictArray(np.asarray(result))
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    if isinstance(result, list):
        return [_wrap(r) for r in result]
    return result


def _index(key: Any, where: str) -> tuple[Any, ...]:
    """An index into the NumPy data: strict arrays unwrapped, NumPy arrays and lists counted as
    uploads (CuPy copies them over), boolean masks counted as syncs."""
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for k in parts:
        if isinstance(k, StrictArray):
            if k.dtype == np.bool_:
                _record("syncs", f"{where} with a boolean mask")
            out.append(k._data)
        elif isinstance(k, (np.ndarray, list)):
            k = np.asarray(k)
            _record("uploads", f"{where} with a host index")
            if k.dtype == np.bool_:
                _record("syncs", f"{where} with a boolean mask")
            out.append(k)
        else:
            out.append(k)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# The array
# ---------------------------------------------------------------------------------------------


def _binary(name: str) -> Callable[[StrictArray, Any], Any]:
    method = getattr(np.ndarray, name)

    def op(self: StrictArray, other: Any) -> Any:
        if isinstance(other, StrictArray):
            value = other._data
        elif isinstance(other, np.ndarray):
            raise _mixing(other, name)
        elif isinstance(other, _SCALARS):
            value = other
        elif name in ("__eq__", "__ne__"):
            return NotImplemented
        else:
            raise TypeError(f"Unsupported type {type(other)} in {name} with a strict array")
        result = method(self._data, value)
        if result is NotImplemented:
            return result
        if name.startswith("__i"):  # in place: NumPy returned the same buffer
            return self
        return _wrap(result)

    op.__name__ = name
    return op


def _unary(name: str) -> Callable[[StrictArray], Any]:
    method = getattr(np.ndarray, name)

    def op(self: StrictArray) -> Any:
        return _wrap(method(self._data))

    op.__name__ = name
    return op


def _method(name: str, *, sync: bool = False) -> Callable[..., Any]:
    def call(self: StrictArray, *args: Any, **kwargs: Any) -> Any:
        if sync:
            _record("syncs", f"ndarray.{name}")
        out = kwargs.get("out")
        result = getattr(self._data, name)(*_operand(args, name), **{k: _operand(v, name) for k, v in kwargs.items()})
        if isinstance(out, StrictArray):
            return out
        if result is self._data:
            return self
        return _wrap(result)

    call.__name__ = name
    return call


def _refuse(message: str) -> Callable[..., Any]:
    def refuse(self: StrictArray, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(message)

    return refuse


class StrictArray:
    """A NumPy array posing as a device array: see the module docstring for what it refuses.

    Build one with :func:`asarray` (an upload), a creation function (:func:`zeros`, ...), or any
    operation on strict arrays; read it back with :meth:`get` or :func:`asnumpy` (a transfer).
    """

    __slots__ = ("_data",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, data: np.ndarray) -> None:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"StrictArray wraps a NumPy array, got {type(data).__name__}; use strict_xp.asarray")
        self._data = data

    # -- metadata lives on the host, as CuPy's does --------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    @property
    def itemsize(self) -> int:
        return self._data.itemsize

    @property
    def T(self) -> "StrictArray":
        return StrictArray(self._data.T)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator["StrictArray"]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"StrictArray({self._data!r})"

    __str__ = __repr__

    # -- explicit transfers ---------------------------------------------------------------------

    def get(self) -> np.ndarray:
        """A NumPy copy of the data (one counted transfer), as ``cupy.ndarray.get``."""
        _record("transfers", "get")
        return self._data.copy()

    def item(self) -> Any:
        _record("transfers", "item")
        return self._data.item()

    def tolist(self) -> Any:
        _record("transfers", "tolist")
        return self._data.tolist()

    # -- refusals -------------------------------------------------------------------------------

    __array__ = _refuse(IMPLICIT_CONVERSION)
    __float__ = _refuse("float() of a strict (device) array: a hidden host round trip; "
                        "use renyi_stream.stream.xp.to_host (or .get()) and say so in the kernel's contract")
    __int__ = _refuse("int() of a strict (device) array: a hidden host round trip; use renyi_stream.stream.xp.to_host")
    __complex__ = _refuse("complex() of a strict (device) array: a hidden host round trip")
    __index__ = _refuse("a strict (device) array used as a Python integer: a hidden host round trip")
    __bool__ = _refuse("the truth value of a strict (device) array: a hidden host round trip; use "
                       "renyi_stream.stream.xp.host_all for a check that raises, or renyi_stream.stream.xp.maybe_any to skip work")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise TypeError(f"numpy.{ufunc.__name__} called on a strict (device) array (or mixing it with a "
                        "NumPy array): use the array module from renyi_stream.stream.xp.array_module")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise TypeError(f"numpy.{func.__name__} called on a strict (device) array: use the array module "
                        "from renyi_stream.stream.xp.array_module")

    # -- indexing -------------------------------------------------------------------------------

    def __getitem__(self, key: Any) -> "StrictArray":
        index = _index(key, "getitem")
        result = self._data[index]
        if not isinstance(result, np.ndarray):  # a full integer index: a 0-d view, as CuPy gives
            result = self._data[index + (Ellipsis,)]
        return StrictArray(result)

    def __setitem__(self, key: Any, value: Any) -> None:
        index = _index(key, "setitem")
        if isinstance(value, StrictArray):
            value = value._data
        elif isinstance(value, (np.ndarray, list)) and np.ndim(value) > 0:
            if not builtins.any(isinstance(k, np.ndarray) for k in index):
                # CuPy: "non-scalar numpy.ndarray cannot be used for fill"
                raise TypeError("assigning a NumPy array into a slice of a strict (device) array: "
                                "move it with xp.asarray first")
            _record("uploads", "setitem value")
        self._data[index] = value


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
              "rshift"):
    for _form in (f"__{_name}__", f"__r{_name}__", f"__i{_name}__"):
        setattr(StrictArray, _form, _binary(_form))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(StrictArray, f"__{_name}__", _binary(f"__{_name}__"))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(StrictArray, f"__{_name}__", _unary(f"__{_name}__"))
for _name in ("astype", "copy", "reshape", "ravel", "flatten", "transpose", "view", "squeeze", "sum", "prod", "max",
              "min", "mean", "any", "all", "argmax", "argmin", "cumsum", "fill", "clip", "dot", "repeat", "take",
              "swapaxes"):
    setattr(StrictArray, _name, _method(_name))
StrictArray.nonzero = _method("nonzero", sync=True)  # type: ignore[attr-defined]
del _name, _form


# ---------------------------------------------------------------------------------------------
# The module namespace
# ---------------------------------------------------------------------------------------------


def _function(name: str, *, sync: bool = False, source: Any = np) -> Callable[..., Any]:
    numpy_function = getattr(source, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        if sync:
            _record("syncs", name)
        out = kwargs.get("out")
        result = numpy_function(*_operand(args, name), **{k: _operand(v, name) for k, v in kwargs.items()})
        if isinstance(out, StrictArray):
            return out
        return _wrap(result)

    call.__name__ = name
    call.__doc__ = f"``numpy.{name}`` on strict arrays (refuses NumPy array arguments)."
    return call


# Functions the kernels use, all of which CuPy has under the same name; add here what a new
# kernel needs (a name CuPy lacks must not be added).
_FUNCTIONS = (
    "abs", "absolute", "add", "all", "any", "arange", "argmax", "argmin", "argsort", "bitwise_and",
    "bitwise_or", "broadcast_to", "ceil", "clip", "concatenate", "count_nonzero", "cumprod", "cumsum",
    "diff", "divide", "dot", "einsum", "empty", "empty_like", "equal", "exp", "expm1", "eye", "floor",
    "floor_divide", "frexp", "full", "full_like", "greater", "greater_equal", "hstack", "isfinite",
    "isinf", "isnan", "ldexp", "left_shift", "less", "less_equal", "linspace", "log", "log1p", "log2",
    "logical_and", "logical_not", "logical_or", "matmul", "max", "maximum", "mean", "min", "minimum",
    "multiply", "negative", "nextafter", "not_equal", "ones", "ones_like", "outer", "power", "prod",
    "ravel", "repeat", "reshape", "right_shift", "searchsorted", "sign", "sort", "sqrt", "square",
    "stack", "subtract", "sum", "take", "tile", "transpose", "true_divide", "vstack", "where", "zeros",
    "zeros_like",
)
# Functions whose output size CuPy learns from the device (each call waits for it).
_SYNCING = ("argwhere", "bincount", "compress", "extract", "flatnonzero", "nonzero", "unique")

_module = sys.modules[__name__]
for _name in _FUNCTIONS:
    setattr(_module, _name, _function(_name))
for _name in _SYNCING:
    setattr(_module, _name, _function(_name, sync=True))
del _name

fft = types.SimpleNamespace(**{name: _function(name, source=np.fft) for name in ("rfft", "irfft", "fft", "ifft")})

# dtypes and constants, as CuPy re-exports NumPy's
float64, float32, float16 = np.float64, np.float32, np.float16
int64, int32, int16, int8 = np.int64, np.int32, np.int16, np.int8
uint64, uint32, uint8 = np.uint64, np.uint32, np.uint8
bool_, intp, complex128 = np.bool_, np.intp, np.complex128
newaxis, inf, nan, pi, e = np.newaxis, np.inf, np.nan, np.pi, np.e
finfo, iinfo, dtype = np.finfo, np.iinfo, np.dtype


def asarray(a: Any, dtype: Any = None) -> StrictArray:
    """``a`` as a strict array: itself (cast if ``dtype`` differs) for a strict array, else a copy
    of the host value (one counted upload), as ``cupy.asarray``."""
    if isinstance(a, StrictArray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else StrictArray(a._data.astype(dtype))
    _record("uploads", "asarray")
    return StrictArray(np.array(a, dtype=dtype, copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True) -> StrictArray:
    """As :func:`asarray`, copying a strict array too (``copy=True``), as ``cupy.array``."""
    if isinstance(a, StrictArray):
        return StrictArray(np.array(a._data, dtype=dtype, copy=copy))
    return asarray(a, dtype=dtype)


def ascontiguousarray(a: Any, dtype: Any = None) -> StrictArray:
    if not isinstance(a, StrictArray):
        raise _mixing(a, "ascontiguousarray")
    return StrictArray(np.ascontiguousarray(a._data, dtype=dtype))


def asnumpy(a: Any) -> np.ndarray:
    """A NumPy copy of a strict array (one counted transfer); NumPy input is returned as is, as
    ``cupy.asnumpy``."""
    if isinstance(a, StrictArray):
        return a.get()
    return np.asarray(a)


def get_array_module(*args: Any) -> types.ModuleType:
    """This module if any argument is a strict array, else ``numpy`` (``cupy.get_array_module``)."""
    return _module if builtins.any(isinstance(a, StrictArray) for a in args) else np


register_array_module(StrictArray, _module)
