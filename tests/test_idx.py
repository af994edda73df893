"""The MNIST IDX format: round trips on small generated files, and loud failures."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from renyi_stream.stream.training.idx import IdxFormatError, load_mnist, read_idx, write_idx


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_every_idx_type_round_trips(tmp_path, dtype, suffix):
    rng = np.random.default_rng(0)
    array = (rng.normal(size=(3, 4, 5)) * 50).astype(dtype)
    path = write_idx(tmp_path / f"a-idx3{suffix}", array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 4, 5)
    np.testing.assert_array_equal(back, array)


def test_the_header_is_big_endian_as_the_mnist_page_describes(tmp_path):
    path = write_idx(tmp_path / "labels-idx1-ubyte", np.array([7, 2, 1], dtype=np.uint8))
    raw = path.read_bytes()
    assert raw[:4] == bytes([0, 0, 0x08, 1]) and struct.unpack(">I", raw[4:8]) == (3,) and raw[8:] == bytes([7, 2, 1])
    path = write_idx(tmp_path / "f", np.array([1.5], dtype=np.float32))
    assert path.read_bytes()[2] == 0x0D and path.read_bytes()[8:] == struct.pack(">f", 1.5)


def test_load_mnist_reads_a_folder_of_the_four_files(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=6).astype(np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[:2])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels[:2])
    x_train, y_train, x_test, y_test = load_mnist(tmp_path)
    assert x_train.shape == (6, 784) and x_train.dtype == np.float32
    np.testing.assert_allclose(x_train, images.reshape(6, -1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y_train, labels.astype(np.int64))
    assert x_test.shape == (2, 784) and y_test.tolist() == labels[:2].tolist()


@pytest.mark.parametrize("raw, message", [
    (b"\x01\x00\x08\x01\x00\x00\x00\x01\x05", "bad magic number"),
    (b"\x00\x00\x07\x01\x00\x00\x00\x01\x05", "unknown element type code 0x07"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x03\x05", "needs 11 bytes, file has 9"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x01\x05\x06", "needs 9 bytes, file has 10"),
    (b"\x00\x00\x08\x02\x00\x00", "header declares 2 dimensions"),
    (b"\x00\x00", "too short"),
])
def test_malformed_files_are_refused_naming_the_problem(tmp_path, raw, message):
    path = tmp_path / "bad-idx"
    path.write_bytes(raw)
    with pytest.raises(IdxFormatError, match=message):
        read_idx(path)
    gz = tmp_path / "bad-idx.gz"
    gz.write_bytes(gzip.compress(raw))
    with pytest.raises(IdxFormatError, match=message):
        read_idx(gz)


def test_unsupported_arrays_are_refused_on_write(tmp_path):
    with pytest.raises(ValueError, match="array dtype must be one of"):
        write_idx(tmp_path / "x", np.zeros(2, dtype=np.uint16))
