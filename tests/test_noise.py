"""Keyed noise: reproducible per (ledger, query, window, noise level), independent otherwise, exact
discrete Gaussian, and the handling of the secret key file."""

from __future__ import annotations

import hashlib
import math
import os
import stat
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from renyi_stream.stream import noise
from renyi_stream.stream.noise import (
    InsecureNoiseWarning,
    NoiseBinding,
    NoiseKey,
    NoiseKeyError,
    discrete_gaussian_noise,
    discrete_gaussian_pmf,
    gaussian_noise,
    new_ledger_id,
    sample_discrete_gaussian,
)

# False alarms. Every statistical test below uses a fixed key or seed, so it is deterministic:
# it never flakes. Each one rejects when its p-value is below P_FLOOR = 1e-3, so a correct
# sampler would fail it for at most a fraction 1e-3 of possible seeds (2e-3 where a test makes
# two checks, by the union bound); a broken one fails it for almost every seed.
P_FLOOR = 1e-3
Z_TWO_SIDED = stats.norm.ppf(1 - P_FLOOR / 2)  # 3.29: |N(0,1)| exceeds it with probability 1e-3

FIXED_SECRET = bytes(range(32))
LEDGER = "0123456789abcdef0123456789abcdef"
OTHER_LEDGER = "fedcba9876543210fedcba9876543210"
# Draws of version 2 of the derivation under NoiseKey(FIXED_SECRET) (see the pinning test).
PINNED_SUM_ACTIVE = [0.7026599501139539, -1.5589565952171052, -0.26232969189106053]
PINNED_Q = [-1.2410224081427377, 0.3737077964343095]
PINNED_Q_HALF = [-0.8768005359540921, -1.0524922489785917]
PINNED_Q_OTHER_LEDGER = [0.8395744016839015, 2.175946910867933]
PINNED_DISCRETE = [-7, 11, 4, 1]


@pytest.fixture(scope="module")
def key() -> NoiseBinding:
    """The insecure test key bound to the ledger ``LEDGER``."""
    with pytest.warns(InsecureNoiseWarning):
        return NoiseBinding(NoiseKey.insecure_for_tests(2024), LEDGER)


def _noise(binding: NoiseBinding, query_id: str = "q", window_id: int = 1, dim: int = 4, noise_std: float = 1.0):
    return gaussian_noise(binding, query_id=query_id, window_id=window_id, dim=dim, noise_std=noise_std)


def _on(binding: NoiseBinding, ledger_id: str) -> NoiseBinding:
    """``binding``'s key bound to another ledger."""
    return NoiseBinding(binding.key, ledger_id)


# --- determinism and the keyed derivation -------------------------------------------------------


def test_the_same_query_and_window_give_the_identical_draw(key):
    assert np.array_equal(_noise(key, "q", 20000, 5, 3.0), _noise(key, "q", 20000, 5, 3.0))


def test_the_draw_is_float64_of_shape_dim(key):
    draw = _noise(key, dim=7)
    assert draw.dtype == np.float64 and draw.shape == (7,)


def test_a_reloaded_key_gives_the_identical_draw(tmp_path):
    first = NoiseBinding(NoiseKey.load_or_create(tmp_path / "noise.key"), LEDGER)
    again = NoiseBinding(NoiseKey.load(tmp_path / "noise.key"), LEDGER)
    assert np.array_equal(_noise(first, "sum:active", 19000), _noise(again, "sum:active", 19000))


def test_a_different_window_gives_a_different_draw(key):
    assert not np.array_equal(_noise(key, window_id=1), _noise(key, window_id=2))


def test_a_different_query_gives_a_different_draw(key):
    assert not np.array_equal(_noise(key, query_id="q"), _noise(key, query_id="r"))


def test_a_different_key_gives_a_different_draw(key):
    assert not np.array_equal(_noise(key), _noise(NoiseBinding(NoiseKey(secret=FIXED_SECRET), LEDGER)))


def test_a_different_ledger_under_the_same_key_gives_a_different_draw(key):
    # The attack of issue 18: a second ledger run with the first one's key file must not draw the
    # same noise, or subtracting the two releases cancels it.
    assert not np.array_equal(_noise(key), _noise(_on(key, OTHER_LEDGER)))


def test_two_ledgers_under_the_same_key_draw_independent_noise(key):
    a = np.array([_noise(key, "q", w, dim=1)[0] for w in range(4000)])
    b = np.array([_noise(_on(key, OTHER_LEDGER), "q", w, dim=1)[0] for w in range(4000)])
    assert abs(_fisher_z(a, b)) < Z_TWO_SIDED  # two-sided, false alarm 1e-3
    # The difference of the two ledgers' releases keeps both noises: N(0, 2), not 0.
    assert stats.kstest(a - b, stats.norm(0.0, math.sqrt(2)).cdf).pvalue > P_FLOOR


def test_query_and_window_are_encoded_without_collisions(key):
    assert not np.array_equal(_noise(key, "a", 12), _noise(key, "a1", 2))
    assert not np.array_equal(_noise(key, "1", 2), _noise(key, "12", 2))


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.text(min_size=1, max_size=6), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.text(min_size=1, max_size=6), st.integers(-(2**63), 2**63 - 1)),
)
def test_distinct_query_window_pairs_never_share_a_draw(pair_a, pair_b):
    secret_key = NoiseBinding(NoiseKey(secret=FIXED_SECRET), LEDGER)
    same = np.array_equal(_noise(secret_key, *pair_a, dim=2), _noise(secret_key, *pair_b, dim=2))
    assert same == (pair_a == pair_b)


def test_numpy_integer_window_ids_give_the_same_draw_as_python_ints(key):
    assert np.array_equal(_noise(key, window_id=np.int64(7)), _noise(key, window_id=7))
    assert np.array_equal(_noise(key, window_id=np.uint32(7)), _noise(key, window_id=7))


def test_dim_extends_the_draw(key):
    base = _noise(key, "q", 3, dim=6, noise_std=1.0)
    assert np.array_equal(_noise(key, "q", 3, dim=3, noise_std=1.0), base[:3])


def test_a_different_noise_std_gives_an_independent_draw_not_the_same_draw_scaled(key):
    # Were the draw at std 2.5 the draw at std 1 scaled, the two releases (sum + z, sum + 2.5 z)
    # would solve for the sum exactly.
    base = _noise(key, "q", 3, dim=6, noise_std=1.0)
    assert not np.allclose(_noise(key, "q", 3, dim=6, noise_std=2.5), 2.5 * base, rtol=1e-9, atol=0)
    unit = np.array([_noise(key, "levels", w, dim=1, noise_std=1.0)[0] for w in range(4000)])
    scaled = np.array([_noise(key, "levels", w, dim=1, noise_std=2.5)[0] for w in range(4000)]) / 2.5
    assert abs(_fisher_z(unit, scaled)) < Z_TWO_SIDED  # two-sided, false alarm 1e-3


def test_the_same_noise_std_as_int_float_or_numpy_gives_the_same_draw(key):
    assert np.array_equal(_noise(key, noise_std=2), _noise(key, noise_std=2.0))
    assert np.array_equal(_noise(key, noise_std=np.float64(2.0)), _noise(key, noise_std=2.0))


def test_the_ledger_id_and_the_query_are_encoded_without_collisions():
    # Length prefixes: moving bytes between the ledger, query and level fields changes the message.
    fixed = NoiseKey(secret=FIXED_SECRET)
    parts = (noise._GAUSSIAN_DOMAIN, "q", 1, noise._std_level(1.0))
    reference = noise._keyed_generator(NoiseBinding(fixed, LEDGER), *parts).standard_normal(2)
    other = noise._keyed_generator(NoiseBinding(fixed, OTHER_LEDGER), *parts).standard_normal(2)
    assert not np.array_equal(reference, other)
    assert noise._field(b"ab") + noise._field(b"c") != noise._field(b"a") + noise._field(b"bc")


def test_the_derivation_is_pinned_so_reruns_of_old_windows_reproduce():
    # Changing the HMAC message layout, the domain or the Philox keying would make a re-run of an
    # already released window draw new noise (invariant 5). These values were produced by version
    # 2 of the derivation (ledger id and noise level in the message); version 1's pins were
    # replaced on purpose when it was retired (issue 18: noise bound to one ledger).
    fixed = NoiseBinding(NoiseKey(secret=FIXED_SECRET), LEDGER)
    assert _noise(fixed, "sum:active", 19000, dim=3).tolist() == PINNED_SUM_ACTIVE
    assert _noise(fixed, "q", -1, dim=2).tolist() == PINNED_Q
    assert _noise(fixed, "q", -1, dim=2, noise_std=0.5).tolist() == PINNED_Q_HALF
    assert _noise(NoiseBinding(fixed.key, OTHER_LEDGER), "q", -1, dim=2).tolist() == PINNED_Q_OTHER_LEDGER
    assert discrete_gaussian_noise(fixed, query_id="c", window_id=9, dim=4, sigma_squared=Fraction(81, 4)).tolist() \
        == PINNED_DISCRETE


def test_the_philox_key_is_the_documented_hmac_of_ledger_query_window_and_level():
    # The message layout of the module docstring, written out independently of the code.
    import hmac
    import struct

    def field(data: bytes) -> bytes:
        return len(data).to_bytes(8, "big") + data

    message = (b"renyi-stream/gaussian/v2" + field(LEDGER.encode()) + field("sum:active".encode())
               + (19000).to_bytes(8, "big", signed=True) + field(struct.pack(">d", 1.0)))
    digest = hmac.new(FIXED_SECRET, message, hashlib.sha256).digest()
    expected = np.random.Generator(np.random.Philox(key=int.from_bytes(digest[:16], "big"))).standard_normal(3)
    assert expected.tolist() == PINNED_SUM_ACTIVE
    discrete = (b"renyi-stream/discrete-gaussian/v2" + field(LEDGER.encode()) + field(b"c")
                + (9).to_bytes(8, "big", signed=True) + field(b"81/4"))
    digest = hmac.new(FIXED_SECRET, discrete, hashlib.sha256).digest()
    rng = np.random.Generator(np.random.Philox(key=int.from_bytes(digest[:16], "big")))
    assert sample_discrete_gaussian(Fraction(81, 4), 4, rng).tolist() == PINNED_DISCRETE


def test_the_gaussian_and_discrete_gaussian_use_separate_streams(key):
    level = noise._std_level(1.0)
    continuous = noise._keyed_generator(key, noise._GAUSSIAN_DOMAIN, "q", 5, level)
    discrete = noise._keyed_generator(key, noise._DISCRETE_DOMAIN, "q", 5, level)
    assert continuous.bit_generator.state["state"]["key"].tolist() != \
        discrete.bit_generator.state["state"]["key"].tolist()


def test_discrete_gaussian_noise_is_keyed_and_integer(key):
    a = discrete_gaussian_noise(key, query_id="c", window_id=9, dim=6, sigma_squared=10.0)
    assert a.dtype == np.int64 and a.shape == (6,)
    assert np.array_equal(a, discrete_gaussian_noise(key, query_id="c", window_id=9, dim=6, sigma_squared=10.0))
    others = [discrete_gaussian_noise(key, query_id="c", window_id=w, dim=6, sigma_squared=10.0) for w in range(10, 14)]
    assert not any(np.array_equal(a, other) for other in others)


def test_discrete_gaussian_noise_depends_on_the_ledger_and_the_level(key):
    def draw(binding, sigma_squared):
        return discrete_gaussian_noise(binding, query_id="c", window_id=9, dim=8, sigma_squared=sigma_squared)

    a = draw(key, 1e6)
    assert not np.array_equal(a, draw(_on(key, OTHER_LEDGER), 1e6))
    assert not np.array_equal(a, draw(key, 1e6 + 1))
    # The level is the exact rational value: a float and the Fraction of the same value agree.
    assert np.array_equal(draw(key, 20.25), draw(key, Fraction(81, 4)))


# --- the continuous Gaussian: distribution and independence -------------------------------------


def test_pooled_draws_follow_n_0_s2_by_ks(key):
    s = 2.5
    draws = np.concatenate([_noise(key, "ks", w, dim=10, noise_std=s) for w in range(2000)])
    assert stats.kstest(draws, stats.norm(0.0, s).cdf).pvalue > P_FLOOR


def _fisher_z(x: np.ndarray, y: np.ndarray) -> float:
    """Fisher's z of the sample correlation: approximately N(0, 1) when x and y are independent
    normal samples of size n (atanh(r) ~ N(0, 1 / (n - 3)))."""
    r = np.corrcoef(x, y)[0, 1]
    return float(np.arctanh(r) * math.sqrt(x.size - 3))


def test_consecutive_windows_are_independent(key):
    draws = np.array([_noise(key, "ind", w, dim=1)[0] for w in range(5001)])
    # Lag-1 correlation: two-sided at 1e-3 by Fisher's z.
    assert abs(_fisher_z(draws[:-1], draws[1:])) < Z_TWO_SIDED
    # Differences of independent N(0, 1) draws are N(0, 2); a common component would shrink
    # them. Use non-overlapping pairs so the differences are i.i.d. under the null.
    diffs = draws[1::2] - draws[0:-1:2]
    assert stats.kstest(diffs, stats.norm(0.0, math.sqrt(2)).cdf).pvalue > P_FLOOR


def test_queries_in_the_same_window_are_independent(key):
    a = np.array([_noise(key, "query-a", w, dim=1)[0] for w in range(4000)])
    b = np.array([_noise(key, "query-b", w, dim=1)[0] for w in range(4000)])
    assert abs(_fisher_z(a, b)) < Z_TWO_SIDED  # two-sided, false alarm 1e-3


def test_coordinates_within_a_release_are_independent(key):
    draws = np.array([_noise(key, "coords", w, dim=2) for w in range(4000)])
    assert abs(_fisher_z(draws[:, 0], draws[:, 1])) < Z_TWO_SIDED  # two-sided, false alarm 1e-3


# --- the exact discrete Gaussian ----------------------------------------------------------------


def _tail_binned_chisquare(draws: np.ndarray, sigma_squared: float) -> float:
    """Chi-square goodness of fit to N_Z(0, sigma^2): one bin per integer in [-m, m] and one bin
    for each tail beyond, with m the largest value whose tail still has expected count >= 5."""
    n = draws.size
    reach = int(40 * math.sqrt(sigma_squared)) + 40
    support = np.arange(-reach, reach + 1)
    pmf = discrete_gaussian_pmf(support, sigma_squared)
    upper_tail = np.cumsum(pmf[::-1])[::-1]  # upper_tail[i] = P(X >= support[i])
    m = int(support[(upper_tail * n >= 5) & (support > 0)].max()) - 1
    inner = np.arange(-m, m + 1)
    observed = np.concatenate([[(draws < -m).sum()], [(draws == v).sum() for v in inner], [(draws > m).sum()]])
    tail = float(upper_tail[support == m + 1][0])
    expected = n * np.concatenate([[tail], discrete_gaussian_pmf(inner, sigma_squared), [tail]])
    assert expected.min() >= 5 and math.isclose(expected.sum(), n, rel_tol=1e-9)
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("sigma_squared", [0.5, 3.0, Fraction(81, 4), 7.3])
def test_discrete_gaussian_matches_its_pmf_by_chi_square(sigma_squared):
    # 7.3 is a float whose exact binary value has a 2^-50 denominator: the exact arithmetic
    # then runs on integers beyond int64.
    draws = sample_discrete_gaussian(sigma_squared, 20_000, np.random.default_rng(99))
    assert _tail_binned_chisquare(draws, float(sigma_squared)) > P_FLOOR


def test_discrete_gaussian_has_mean_zero():
    sigma_squared = 4.0
    draws = sample_discrete_gaussian(sigma_squared, 20_000, np.random.default_rng(3))
    # The variance of N_Z(0, s^2) is at most s^2 (CKS 2020, Corollary 9): a two-sided z-test
    # at 1e-3 with that bound is conservative.
    assert abs(draws.mean()) < Z_TWO_SIDED * math.sqrt(sigma_squared / draws.size)


def test_discrete_gaussian_is_symmetric():
    draws = sample_discrete_gaussian(4.0, 20_000, np.random.default_rng(4))
    # Sign: given X != 0, P(X > 0) = 1/2 (exact binomial test, false alarm <= 1e-3).
    positive, nonzero = int((draws > 0).sum()), int((draws != 0).sum())
    assert stats.binomtest(positive, nonzero).pvalue > P_FLOOR
    # Magnitudes: |X| given X > 0 and |X| given X < 0 have the same law (two-sample
    # chi-square over |x| = 1..4 and >= 5, false alarm 1e-3; union with the above: 2e-3).
    bins = [1, 2, 3, 4, 5, np.inf]
    table = np.array([np.histogram(draws[draws > 0], bins)[0], np.histogram(-draws[draws < 0], bins)[0]])
    assert stats.chi2_contingency(table).pvalue > P_FLOOR


@pytest.mark.parametrize("sigma_squared", [1e-300, 1e6, 1e30])
def test_discrete_gaussian_handles_extreme_scales(sigma_squared):
    draws = sample_discrete_gaussian(sigma_squared, 200, np.random.default_rng(5))
    assert draws.dtype == np.int64 and draws.shape == (200,)
    if sigma_squared < 1e-3:
        assert not draws.any()  # P(X != 0) = 2 exp(-5e299): never
    else:
        # The sample variance of 200 draws is within a factor 2 of sigma^2 except with
        # probability below 1e-6 (chi-square with 200 degrees of freedom).
        assert 0.5 < draws.astype(float).var() / sigma_squared < 2


def test_sampling_only_uses_the_given_generator():
    a = sample_discrete_gaussian(Fraction(1, 3), 50, np.random.default_rng(11))
    b = sample_discrete_gaussian(Fraction(1, 3), 50, np.random.default_rng(11))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_minus_gamma_has_the_right_frequency(gamma):
    rng = np.random.default_rng(12)
    n = 20_000
    hits = sum(noise._bernoulli_exp(gamma.numerator, gamma.denominator, rng) for _ in range(n))
    p = math.exp(-gamma)
    if p == 1:
        assert hits == n
    else:
        assert stats.binomtest(hits, n, p).pvalue > P_FLOOR  # exact two-sided, false alarm 1e-3


def test_uniform_integers_beyond_int64_are_uniform():
    n = 3 * 2**70 + 1
    rng = np.random.default_rng(13)
    values = [noise._uniform_below(n, rng) for _ in range(6000)]
    assert all(0 <= v < n for v in values)
    # Six equal-width bins by the top of the range, chi-square (false alarm 1e-3).
    counts = np.bincount([v * 6 // n for v in values], minlength=6)
    assert stats.chisquare(counts).pvalue > P_FLOOR


@pytest.mark.parametrize("sigma_squared", [0.05, 0.5, 1.0, 2.0, 20.25])
def test_the_pmf_is_normalised_and_symmetric(sigma_squared):
    support = np.arange(-400, 401)
    pmf = discrete_gaussian_pmf(support, sigma_squared)
    assert math.isclose(pmf.sum(), 1.0, rel_tol=1e-12)
    assert np.array_equal(pmf, pmf[::-1])
    # Brute-force normalisation agrees with the closed form on both sides of sigma^2 = 1.
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma_squared))
    assert np.allclose(pmf, weights / weights.sum(), rtol=1e-12, atol=0)


def test_the_pmf_refuses_non_integer_values():
    with pytest.raises(ValueError, match="values"):
        discrete_gaussian_pmf(np.array([0.5]), 1.0)


# --- the key file -------------------------------------------------------------------------------


def test_a_new_key_file_is_private_and_reloads_to_the_same_key(tmp_path):
    path = tmp_path / "curator" / "keys" / "noise.key"  # parents are created
    created = NoiseKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.path.getsize(path) == 32
    assert NoiseKey.load(path).fingerprint == created.fingerprint
    assert NoiseKey.load_or_create(path).secret == created.secret
    assert not created.insecure


def test_two_new_keys_differ(tmp_path):
    assert NoiseKey.load_or_create(tmp_path / "a.key").secret != NoiseKey.load_or_create(tmp_path / "b.key").secret


def test_the_fingerprint_is_the_documented_hash():
    expected = hashlib.sha256(b"renyi-stream/fingerprint/v1" + FIXED_SECRET).hexdigest()[:16]
    assert NoiseKey(secret=FIXED_SECRET).fingerprint == expected == "107027a8c25cdc51"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o700 | 0o001])
def test_a_key_file_accessible_to_others_is_refused(tmp_path, mode):
    path = tmp_path / "noise.key"
    NoiseKey.load_or_create(path)
    os.chmod(path, mode)
    with pytest.raises(NoiseKeyError, match="chmod 600") as error:
        NoiseKey.load(path)
    assert str(path) in str(error.value)
    with pytest.raises(NoiseKeyError, match="chmod 600"):
        NoiseKey.load_or_create(path)


@pytest.mark.parametrize("content", [b"", b"short", bytes(33)])
def test_a_key_file_of_the_wrong_length_is_refused(tmp_path, content):
    path = tmp_path / "noise.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(NoiseKeyError, match="expected exactly 32") as error:
        NoiseKey.load(path)
    assert str(path) in str(error.value)
    with pytest.raises(NoiseKeyError):
        NoiseKey.load_or_create(path)  # an existing bad file is never replaced
    assert path.read_bytes() == content


def test_a_missing_key_file_is_refused_by_load_and_not_created(tmp_path):
    path = tmp_path / "absent.key"
    with pytest.raises(NoiseKeyError, match="does not exist") as error:
        NoiseKey.load(path)
    assert str(path) in str(error.value) and "load_or_create" in str(error.value)
    assert not path.exists()


def test_a_directory_is_refused_as_a_key_file(tmp_path):
    with pytest.raises(NoiseKeyError, match="not a regular file"):
        NoiseKey.load(tmp_path)


def test_a_secret_of_the_wrong_length_is_refused():
    with pytest.raises(NoiseKeyError, match="32 bytes"):
        NoiseKey(secret=b"too short")


def test_the_insecure_key_warns_every_time_and_is_deterministic():
    with pytest.warns(InsecureNoiseWarning):
        first = NoiseKey.insecure_for_tests(1)
    with pytest.warns(InsecureNoiseWarning):
        second = NoiseKey.insecure_for_tests(1)
    with pytest.warns(InsecureNoiseWarning):
        other = NoiseKey.insecure_for_tests(2)
    assert first.secret == second.secret != other.secret
    assert first.insecure and second.insecure


def test_a_real_key_does_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NoiseKey.load_or_create(tmp_path / "noise.key")
        NoiseKey.load(tmp_path / "noise.key")


def test_the_secret_never_appears_in_repr():
    secret_key = NoiseKey(secret=FIXED_SECRET)
    for text in (repr(secret_key), str(secret_key), f"{secret_key}", repr([secret_key])):
        assert FIXED_SECRET.hex() not in text and repr(FIXED_SECRET) not in text
        assert "fingerprint" in text


# --- parameter validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(query_id=""), "query_id"),
        (dict(query_id=5), "query_id"),
        (dict(window_id=1.5), "window_id"),
        (dict(window_id=True), "window_id"),
        (dict(window_id="3"), "window_id"),
        (dict(window_id=2**63), "window_id"),
        (dict(dim=0), "dim"),
        (dict(dim=2.0), "dim"),
        (dict(dim=True), "dim"),
        (dict(noise_std=0.0), "noise_std"),
        (dict(noise_std=-1.0), "noise_std"),
        (dict(noise_std=float("nan")), "noise_std"),
        (dict(noise_std=float("inf")), "noise_std"),
        (dict(noise_std="1"), "noise_std"),
        (dict(noise_std=True), "noise_std"),
    ],
)
def test_bad_noise_parameters_raise_naming_the_parameter(key, kwargs, name):
    args = dict(query_id="q", window_id=1, dim=1, noise_std=1.0) | kwargs
    with pytest.raises(ValueError, match=name) as error:
        gaussian_noise(key, **args)
    assert repr(kwargs[name]) in str(error.value)


def test_noise_without_a_binding_is_refused_even_from_a_bare_key():
    # A bare NoiseKey is refused: no caller can draw keyed noise and forget the ledger.
    for not_a_binding in (None, FIXED_SECRET, NoiseKey(secret=FIXED_SECRET)):
        with pytest.raises(ValueError, match="binding must be a NoiseBinding"):
            gaussian_noise(not_a_binding, query_id="q", window_id=1, dim=1, noise_std=1.0)
        with pytest.raises(ValueError, match="binding must be a NoiseBinding"):
            discrete_gaussian_noise(not_a_binding, query_id="q", window_id=1, dim=1, sigma_squared=1.0)


@pytest.mark.parametrize("ledger_id", ["", None, 5, LEDGER.upper(), LEDGER[:-1], LEDGER + "0", "g" * 32])
def test_a_binding_refuses_a_malformed_ledger_id(ledger_id):
    with pytest.raises(ValueError, match="ledger_id") as error:
        NoiseBinding(NoiseKey(secret=FIXED_SECRET), ledger_id)
    assert repr(ledger_id) in str(error.value)


def test_a_binding_refuses_a_key_that_is_not_a_noise_key():
    with pytest.raises(ValueError, match="key must be a NoiseKey"):
        NoiseBinding(FIXED_SECRET, LEDGER)


def test_new_ledger_ids_are_128_random_bits_in_hex():
    ids = {new_ledger_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)


def test_the_binding_repr_shows_the_fingerprint_and_ledger_but_never_the_secret():
    binding = NoiseBinding(NoiseKey(secret=FIXED_SECRET), LEDGER)
    text = repr(binding)
    assert LEDGER in text and binding.key.fingerprint in text
    assert FIXED_SECRET.hex() not in text and repr(FIXED_SECRET) not in text


@pytest.mark.parametrize("sigma_squared", [0.0, -1.0, float("nan"), float("inf"), True, 1e31, "1", Fraction(-1, 2)])
def test_bad_sigma_squared_raises_naming_the_parameter(key, sigma_squared):
    with pytest.raises(ValueError, match="sigma_squared"):
        discrete_gaussian_noise(key, query_id="q", window_id=1, dim=1, sigma_squared=sigma_squared)
    with pytest.raises(ValueError, match="sigma_squared"):
        sample_discrete_gaussian(sigma_squared, 1, np.random.default_rng(0))


def test_bad_discrete_request_parameters_raise_naming_the_parameter(key):
    with pytest.raises(ValueError, match="dim"):
        discrete_gaussian_noise(key, query_id="q", window_id=1, dim=0, sigma_squared=1.0)
    with pytest.raises(ValueError, match="window_id"):
        discrete_gaussian_noise(key, query_id="q", window_id=None, dim=1, sigma_squared=1.0)
    with pytest.raises(ValueError, match="size"):
        sample_discrete_gaussian(1.0, -1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="size"):
        sample_discrete_gaussian(1.0, 2.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng"):
        sample_discrete_gaussian(1.0, 1, 0)


def test_the_insecure_seed_must_be_an_integer():
    with pytest.raises(ValueError, match="seed"):
        NoiseKey.insecure_for_tests("1")
