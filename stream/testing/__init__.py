"""Test support that ships with the package: :mod:`renyi_stream.stream.testing.strict_xp`, an array module that
behaves as CuPy does where it matters (no implicit conversion to NumPy), so the device path of
the kernels runs in CI without a GPU."""
