"""Reader (and writer) for the IDX file format of the MNIST database.

Format (LeCun, Cortes & Burges, "The MNIST database", file-format section): a big-endian
header, then the data in row-major (C) order, big-endian:

* bytes 0-1: zero; byte 2: the element type code; byte 3: the number of dimensions ``D``;
* ``D`` big-endian uint32 sizes;
* ``prod(sizes)`` elements.

Type codes: ``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16, ``0x0C`` int32, ``0x0D`` float32,
``0x0E`` float64. Files ending in ``.gz`` are decompressed on the fly. MNIST itself:
``train-images-idx3-ubyte`` (60000 x 28 x 28 uint8), ``train-labels-idx1-ubyte`` (60000 uint8),
and ``t10k-*`` for the 10000 test examples; :func:`load_mnist` reads such a folder.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder("="): code for code, dt in _TYPES.items()}


class IdxFormatError(ValueError):
    """The file is not a well-formed IDX file; the message names the file and what is wrong."""


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file into a native-endian NumPy array of its declared shape and type.

    Raises :class:`IdxFormatError` for a bad magic number, an unknown type code, or a file whose
    length does not match its header (truncated or with trailing bytes).
    """
    path = Path(path)
    with _open(path) as handle:
        raw = handle.read()
    if len(raw) < 4:
        raise IdxFormatError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0:
        raise IdxFormatError(f"{path}: bad magic number, first two bytes must be 0, got {raw[:2].hex()}")
    if code not in _TYPES:
        raise IdxFormatError(f"{path}: unknown element type code 0x{code:02X}, expected one of "
                             + ", ".join(f"0x{c:02X}" for c in _TYPES))
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxFormatError(f"{path}: header declares {ndim} dimensions but the file ends after {len(raw)} bytes")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = _TYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise IdxFormatError(f"{path}: header {shape} of {dtype.newbyteorder('=')} needs {expected} bytes, "
                             f"file has {len(raw)}")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed if ``path`` ends in ``.gz``)."""
    path = Path(path)
    arr = np.asarray(array)
    native = arr.dtype.newbyteorder("=") if arr.dtype.byteorder not in ("=", "|") else arr.dtype
    if native not in _CODES:
        raise ValueError(f"array dtype must be one of uint8, int8, int16, int32, float32, float64, got {arr.dtype}")
    code = _CODES[native]
    if arr.ndim > 255:
        raise ValueError(f"array may have at most 255 dimensions, got {arr.ndim}")
    body = struct.pack(">HBB", 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    body += np.ascontiguousarray(arr, dtype=_TYPES[code]).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as handle:
        handle.write(body)
    return path


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"no {stem} (or {stem}.gz) in {folder}")


def load_mnist(folder: str | os.PathLike, *, scale: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` from the four MNIST IDX files in ``folder``.

    Images are flattened to ``(n, 784)``; with ``scale`` (default) as float32 in ``[0, 1]``
    (pixel / 255), else uint8. Labels are int64.
    """
    folder = Path(folder)
    out = []
    for split in ("train", "t10k"):
        images = read_idx(_find(folder, f"{split}-images-idx3-ubyte"))
        labels = read_idx(_find(folder, f"{split}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise IdxFormatError(f"{folder}: {split} images {images.shape} and labels {labels.shape} do not match")
        flat = images.reshape(images.shape[0], -1)
        out += [flat.astype(np.float32) / 255.0 if scale else flat, labels.astype(np.int64)]
    return out[0], out[1], out[2], out[3]
