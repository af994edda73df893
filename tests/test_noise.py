"""Keyed noise: reproducible per (query, window), independent otherwise, secret key handling."""

from __future__ import annotations

import os
import stat
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from stream.noise import (
    InsecureNoiseWarning,
    NoiseKey,
    NoiseKeyError,
    discrete_gaussian_noise,
    discrete_gaussian_pmf,
    gaussian_noise,
    sample_discrete_gaussian,
)

# Every statistical test below uses a fixed key or seed and rejects at p < 1e-3: with a correct
# sampler a given test fails with probability 1e-3 over the choice of seed, and never flakes.
P_FLOOR = 1e-3


@pytest.fixture(scope="module")
def key() -> NoiseKey:
    with pytest.warns(InsecureNoiseWarning):
        return NoiseKey.insecure_for_tests(2024)


def test_the_same_query_and_window_give_the_identical_draw(key):
    a = gaussian_noise(key, query_id="q", window_id=20000, dim=5, noise_std=3.0)
    b = gaussian_noise(key, query_id="q", window_id=20000, dim=5, noise_std=3.0)
    assert np.array_equal(a, b)


def test_a_different_window_query_or_key_gives_a_different_draw(key):
    base = gaussian_noise(key, query_id="q", window_id=1, dim=4, noise_std=1.0)
    assert not np.array_equal(base, gaussian_noise(key, query_id="q", window_id=2, dim=4, noise_std=1.0))
    assert not np.array_equal(base, gaussian_noise(key, query_id="r", window_id=1, dim=4, noise_std=1.0))
    other = NoiseKey(secret=bytes(range(32)))
    assert not np.array_equal(base, gaussian_noise(other, query_id="q", window_id=1, dim=4, noise_std=1.0))


def test_query_and_window_are_encoded_without_collisions(key):
    a = gaussian_noise(key, query_id="a", window_id=12, dim=3, noise_std=1.0)
    b = gaussian_noise(key, query_id="a1", window_id=2, dim=3, noise_std=1.0)
    assert not np.array_equal(a, b)


def test_the_gaussian_and_discrete_gaussian_never_share_a_draw(key):
    cont = gaussian_noise(key, query_id="q", window_id=5, dim=8, noise_std=1.0)
    disc = discrete_gaussian_noise(key, query_id="q", window_id=5, dim=8, sigma_squared=1.0)
    assert not np.array_equal(np.round(cont), disc)


def test_pooled_draws_follow_n_0_s2_by_ks(key):
    draws = np.concatenate([gaussian_noise(key, query_id="ks", window_id=w, dim=10, noise_std=2.5)
                            for w in range(2000)])
    assert stats.kstest(draws, "norm", args=(0.0, 2.5)).pvalue > P_FLOOR


def test_consecutive_windows_are_uncorrelated(key):
    draws = np.array([gaussian_noise(key, query_id="ind", window_id=w, dim=1, noise_std=1.0)[0]
                      for w in range(5001)])
    r = np.corrcoef(draws[:-1], draws[1:])[0, 1]
    # Under independence sqrt(n) * r is approximately N(0, 1); two-sided test at 1e-3.
    assert abs(r) * np.sqrt(draws.size - 1) < stats.norm.ppf(1 - P_FLOOR / 2)
    # Differences of independent N(0,1) pairs are N(0, 2).
    assert stats.kstest(draws[1:] - draws[:-1], "norm", args=(0.0, np.sqrt(2))).pvalue > P_FLOOR


def test_coordinates_within_a_release_are_independent(key):
    draws = np.array([gaussian_noise(key, query_id="coords", window_id=w, dim=2, noise_std=1.0)
                      for w in range(5000)])
    r = np.corrcoef(draws[:, 0], draws[:, 1])[0, 1]
    assert abs(r) * np.sqrt(draws.shape[0]) < stats.norm.ppf(1 - P_FLOOR / 2)


@pytest.mark.parametrize("sigma_squared", [0.5, 3.0, Fraction(81, 4)])
def test_discrete_gaussian_matches_its_pmf_by_chi_square(sigma_squared):
    rng = np.random.default_rng(99)
    n = 20_000
    draws = sample_discrete_gaussian(sigma_squared, n, rng)
    lo, hi = draws.min(), draws.max()
    support = np.arange(lo, hi + 1)
    observed = np.array([(draws == v).sum() for v in support], dtype=float)
    expected = discrete_gaussian_pmf(support, float(sigma_squared)) * n
    # Merge the tails into the outermost bins so every expected count is >= 5.
    keep = expected >= 5
    first, last = np.flatnonzero(keep)[[0, -1]]
    obs = np.concatenate([[observed[: first + 1].sum()], observed[first + 1:last], [observed[last:].sum()]])
    exp = np.concatenate([[expected[: first + 1].sum()], expected[first + 1:last], [expected[last:].sum()]])
    exp = exp * obs.sum() / exp.sum()
    assert stats.chisquare(obs, exp).pvalue > P_FLOOR


def test_discrete_gaussian_is_symmetric_with_mean_zero():
    draws = sample_discrete_gaussian(4.0, 20_000, np.random.default_rng(3))
    assert abs(draws.mean()) < 3.29 * 2.0 / np.sqrt(draws.size)  # two-sided 1e-3
    positive, negative = (draws > 0).sum(), (draws < 0).sum()
    assert stats.binomtest(int(positive), int(positive + negative)).pvalue > P_FLOOR


def test_discrete_gaussian_noise_is_keyed_and_integer(key):
    a = discrete_gaussian_noise(key, query_id="c", window_id=9, dim=6, sigma_squared=10.0)
    assert a.dtype == np.int64
    assert np.array_equal(a, discrete_gaussian_noise(key, query_id="c", window_id=9, dim=6, sigma_squared=10.0))


def test_a_new_key_file_is_private_and_reloads_to_the_same_key(tmp_path):
    path = tmp_path / "keys" / "noise.key"
    created = NoiseKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert NoiseKey.load(path).fingerprint == created.fingerprint
    assert NoiseKey.load_or_create(path).secret == created.secret
    assert not created.insecure


def test_a_key_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "noise.key"
    NoiseKey.load_or_create(path)
    os.chmod(path, 0o644)
    with pytest.raises(NoiseKeyError, match="chmod 600"):
        NoiseKey.load(path)


def test_a_key_file_of_the_wrong_length_is_refused(tmp_path):
    path = tmp_path / "noise.key"
    path.write_bytes(b"short")
    os.chmod(path, 0o600)
    with pytest.raises(NoiseKeyError, match="5 bytes"):
        NoiseKey.load(path)


def test_a_missing_key_file_is_refused_by_load(tmp_path):
    with pytest.raises(NoiseKeyError, match="does not exist"):
        NoiseKey.load(tmp_path / "absent.key")


def test_the_insecure_key_warns_every_time():
    with pytest.warns(InsecureNoiseWarning):
        first = NoiseKey.insecure_for_tests(1)
    with pytest.warns(InsecureNoiseWarning):
        second = NoiseKey.insecure_for_tests(1)
    assert first.secret == second.secret and first.insecure


def test_the_secret_never_appears_in_repr():
    key = NoiseKey(secret=bytes(range(32)))
    assert bytes(range(32)).hex() not in repr(key)
    assert "fingerprint" in repr(key)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(query_id="", window_id=1, dim=1, noise_std=1.0), "query_id"),
        (dict(query_id="q", window_id=1.5, dim=1, noise_std=1.0), "window_id"),
        (dict(query_id="q", window_id=True, dim=1, noise_std=1.0), "window_id"),
        (dict(query_id="q", window_id=1, dim=0, noise_std=1.0), "dim"),
        (dict(query_id="q", window_id=1, dim=1, noise_std=0.0), "noise_std"),
        (dict(query_id="q", window_id=1, dim=1, noise_std=float("nan")), "noise_std"),
    ],
)
def test_bad_noise_parameters_raise_naming_the_parameter(key, kwargs, name):
    with pytest.raises(ValueError, match=name):
        gaussian_noise(key, **kwargs)


def test_bad_discrete_parameters_raise_naming_the_parameter(key):
    with pytest.raises(ValueError, match="sigma_squared"):
        discrete_gaussian_noise(key, query_id="q", window_id=1, dim=1, sigma_squared=0.0)
    with pytest.raises(ValueError, match="size"):
        sample_discrete_gaussian(1.0, -1, np.random.default_rng(0))
