"""Keyed, reproducible, secret noise for releases, bound to one ledger.

Why keyed noise. Invariant 5 (release-once, docs/architecture.md): a window is released once. A
retried bundle, a re-run of the same day or a recovery after a crash must give the *identical*
answer, never a second independent draw: two independent noisy answers to the same sum average
the noise away and spend the privacy budget twice. So the noise of release
``(query_id, window_id)`` is not drawn from a live generator; it is a function of a secret key,
of the ledger that charges for the release and of the noise level:

    philox_key = HMAC-SHA256(secret, domain || len(ledger) || ledger || len(query) || query
                                     || window || len(level) || level)[:16]
    noise      = Generator(Philox(key=philox_key)).<sampler>(dim)

where every ``len(x)`` is the byte length of ``x`` as 8 bytes big-endian (so the encoding is
injective: ``("a", 12)`` and ``("a1", 2)`` are different messages), ``ledger`` is the ledger id
(:func:`new_ledger_id`, 32 hex digits, ASCII), ``query`` the UTF-8 query id, ``window`` the
window id as a signed 8-byte big-endian integer and ``level`` the noise level: the IEEE-754
binary64 of ``noise_std``, big-endian, for the Gaussian; ``"<num>/<den>"`` (ASCII) of the exact
rational ``sigma_squared`` in lowest terms for the discrete Gaussian. Each sampler has its own
``domain`` (``renyi-stream/gaussian/v2``, ``renyi-stream/discrete-gaussian/v2``), so the
continuous and the discrete Gaussian never share a stream.

Why the ledger and the level are in the message (version 2). A key copied to a second ledger
(a staging copy, a rebuilt ledger, a key shared between two deployments) would otherwise give
that ledger the identical noise for the same ``(query, window)``, and the difference of the two
releases would be the difference of the true sums, noise-free: one user's value exactly when
the two datasets differ in that user. Likewise a release at another noise level would be the
same draw scaled, and two such releases solve for the true sum. So the draw is a
:class:`NoiseBinding` of the key *and* the ledger's random identifier (128 bits, created once
with the ledger and kept for life), and the level is part of the message.

* The same ``(key, ledger_id, query_id, window_id, level)`` gives the same draw, bit for bit,
  on every run (invariant 5).
* Any change of key, ledger id, query id, window id or level gives an independent draw:
  HMAC-SHA256 is a pseudo-random function of the message under a secret key, and Philox (Salmon
  et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") is a counter-based generator whose
  streams under distinct keys are statistically independent.
* Without the secret the noise cannot be predicted or subtracted. The secret is 32 bytes from
  :func:`secrets.token_bytes` in a file of mode 0600 next to the curator's ledger
  (:meth:`NoiseKey.load_or_create`). Losing it does not break privacy, but re-runs of old
  windows would then draw new noise: back it up with the ledger.
* The derivation is part of the release format: changing it changes the answer of a re-run.
  ``tests/test_noise.py`` pins a few draws so that it cannot change by accident. Version 1
  (``.../v1`` domains, no ledger id, no level) is retired: windows released under it keep their
  stored values (a released window is never drawn again: the ledger's processed windows and the
  stores' first-write-wins rule), and every later window is drawn under version 2.

Floating point. The continuous Gaussian is sampled in floating point, and floating-point samples
are not exactly Gaussian: the set of representable outputs depends on the input, which can
leak through the least significant bits of a release (Mironov 2012, "On significance of the
least significant bits for differential privacy", CCS). For integer-valued queries (counts,
sums of 0/1 indicators) the remedy is :func:`discrete_gaussian_noise`, the exact discrete
Gaussian of Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for Differential Privacy",
NeurIPS), sampled with exact rational arithmetic from uniform integers only.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import stat
import struct
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

KEY_BYTES = 32
# The largest sigma^2 the discrete sampler accepts: sigma = 1e15, so an int64 draw
# (|x| < 9.2e18 = 9200 sigma) overflows with probability below exp(-4e7).
MAX_DISCRETE_SIGMA_SQUARED = 1e30

# Version 2 of the derivation: the message carries the ledger id and the noise level (see the
# module docstring). Never reuse a domain for another message layout.
_GAUSSIAN_DOMAIN = b"renyi-stream/gaussian/v2"
_DISCRETE_DOMAIN = b"renyi-stream/discrete-gaussian/v2"
LEDGER_ID_BYTES = 16
_LEDGER_ID = re.compile(r"[0-9a-f]{%d}" % (2 * LEDGER_ID_BYTES))
_FINGERPRINT_DOMAIN = b"renyi-stream/fingerprint/v1"
_INSECURE_DOMAIN = b"renyi-stream/insecure-test-key/"


class InsecureNoiseWarning(UserWarning):
    """Noise derived from a public seed: fine for tests, never for releases."""


def write_durably(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the open file ``fd`` (``os.write`` may write less than asked)
    and flush it to disk, so a crash never leaves a short key behind a complete-looking file."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


class NoiseKeyError(ValueError):
    """A key file that is missing, malformed or readable by others."""


@dataclass(frozen=True, repr=False)
class NoiseKey:
    """The curator's secret from which all release noise is derived.

    Create it once with :meth:`load_or_create` and keep (and back up) it with the curator's
    ledger: whoever holds it can subtract the noise from every release, and whoever loses it
    can no longer reproduce old releases. ``repr`` shows only the public :attr:`fingerprint`.
    """

    secret: bytes
    insecure: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            got = f"{len(self.secret)} bytes" if isinstance(self.secret, bytes) else type(self.secret).__name__
            raise NoiseKeyError(f"secret must be exactly {KEY_BYTES} bytes, got {got}")
        if not isinstance(self.insecure, bool):
            raise NoiseKeyError(f"insecure must be a bool, got insecure={self.insecure!r}")

    def __repr__(self) -> str:
        return f"NoiseKey(fingerprint={self.fingerprint!r}, insecure={self.insecure})"

    @property
    def fingerprint(self) -> str:
        """A public identifier of the key: the first 16 hex digits of
        ``sha256(b"renyi-stream/fingerprint/v1" + secret)``. Safe to store next to releases, so
        that a re-run can check it uses the key the first run used."""
        return hashlib.sha256(_FINGERPRINT_DOMAIN + self.secret).hexdigest()[:16]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NoiseKey":
        """Read an existing key file; never creates one.

        Raises :class:`NoiseKeyError` (naming the path and the fix) when the file is missing,
        is not a regular file, has any group/other permission bit (``mode & 0o077``) or does
        not hold exactly 32 bytes.
        """
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise NoiseKeyError(
                f"noise key file {path} does not exist; create it with NoiseKey.load_or_create "
                "(the first run of the job does), or restore the curator's key from its backup"
            ) from None
        except OSError as e:
            raise NoiseKeyError(f"cannot open noise key file {path}: {e.strerror}; check the path and its owner") from e
        try:
            # fstat the open descriptor, not the path, so the checks apply to what is read.
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NoiseKeyError(f"noise key file {path} is not a regular file; point the key path at the key file")
            mode = stat.S_IMODE(info.st_mode)
            if mode & 0o077:
                raise NoiseKeyError(
                    f"noise key file {path} is accessible to group/others (mode {mode:04o}); "
                    f"run 'chmod 600 {path}', and rotate the key if others may have read it"
                )
            secret = _read_at_most(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(secret) != KEY_BYTES:
            size = f"{len(secret)} bytes" if len(secret) <= KEY_BYTES else f"more than {KEY_BYTES} bytes"
            raise NoiseKeyError(
                f"noise key file {path} holds {size}, expected exactly {KEY_BYTES}: it is not a "
                "renyi-stream noise key or it was damaged; restore it from the curator's backup"
            )
        return cls(secret=secret)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike) -> "NoiseKey":
        """Load the key at ``path``; if there is none, create it.

        Creation makes the parent directory if needed (mode 0700), then creates the file with
        ``O_CREAT | O_EXCL`` and mode 0600 (so an existing key is never overwritten, not even by
        a concurrent creator) holding 32 bytes of :func:`secrets.token_bytes`, and fsyncs the
        file and its directory, so that a crash right after the first release cannot lose the
        key the release was noised with. An existing file is checked as by :meth:`load`.
        """
        path = Path(path)
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls.load(path)
        secret = secrets.token_bytes(KEY_BYTES)
        try:
            write_durably(fd, secret)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)  # never leave a short key behind
            raise
        os.close(fd)
        _fsync_directory(path.parent)
        return cls(secret=secret)

    @classmethod
    def insecure_for_tests(cls, seed: int) -> "NoiseKey":
        """A key derived from a public integer seed, for tests only: ``insecure=True``.

        Deterministic in ``seed``. Warns :class:`InsecureNoiseWarning` on every call; anyone
        who knows the seed can remove the noise, so releases made with it are not private.
        """
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer, got seed={seed!r}")
        warnings.warn(
            "using an insecure noise key derived from a public seed: releases made with it are "
            "not private", InsecureNoiseWarning, stacklevel=2,
        )
        secret = hashlib.sha256(_INSECURE_DOMAIN + str(int(seed)).encode()).digest()
        return cls(secret=secret, insecure=True)


def _read_at_most(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory descriptors
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- the binding of a key to one ledger ---------------------------------------------------------


def new_ledger_id() -> str:
    """A new ledger identifier: 128 random bits from :func:`secrets.token_hex`, as 32 lowercase
    hex digits. Created once when a ledger is created and kept for its life; public (like the
    key's fingerprint), since it only separates the noise of two ledgers under one key."""
    return secrets.token_hex(LEDGER_ID_BYTES)


def check_ledger_id(ledger_id: Any, *, name: str = "ledger_id") -> str:
    """``ledger_id`` when it is what :func:`new_ledger_id` makes (32 lowercase hex digits);
    ValueError naming ``name`` and the value otherwise."""
    if not isinstance(ledger_id, str) or not _LEDGER_ID.fullmatch(ledger_id):
        raise ValueError(f"{name} must be {2 * LEDGER_ID_BYTES} lowercase hex digits (renyi_stream.stream.noise.new_ledger_id), "
                         f"got {name}={ledger_id!r}")
    return ledger_id


@dataclass(frozen=True, repr=False)
class NoiseBinding:
    """The noise key bound to the one ledger whose releases it noises: what every keyed draw
    (:func:`gaussian_noise`, :func:`discrete_gaussian_noise`) is derived from.

    Two ledgers sharing a key file draw independent noise for the same ``(query, window)``
    because their ``ledger_id`` differ (module docstring). There is no way to draw keyed noise
    from a bare :class:`NoiseKey`, so no caller can forget the ledger. ``repr`` shows the key's
    public fingerprint and the (public) ledger id, never the secret.
    """

    key: NoiseKey
    ledger_id: str

    def __post_init__(self) -> None:
        if not isinstance(self.key, NoiseKey):
            raise ValueError(
                f"key must be a NoiseKey (NoiseKey.load_or_create, or NoiseKey.insecure_for_tests in tests), "
                f"got key of type {type(self.key).__name__}")
        check_ledger_id(self.ledger_id)

    def __repr__(self) -> str:
        return f"NoiseBinding(fingerprint={self.key.fingerprint!r}, ledger_id={self.ledger_id!r})"


# --- keyed derivation ----------------------------------------------------------------------------


def _check_release(binding: Any, query_id: Any, window_id: Any, dim: Any) -> None:
    if not isinstance(binding, NoiseBinding):
        raise ValueError(
            "binding must be a NoiseBinding (NoiseBinding(key, ledger_id): the noise key bound to the ledger "
            f"that charges for the release), got binding of type {type(binding).__name__}"
        )
    if not isinstance(query_id, str) or not query_id:
        raise ValueError(f"query_id must be a non-empty string, got query_id={query_id!r}")
    if isinstance(window_id, bool) or not isinstance(window_id, (int, np.integer)):
        raise ValueError(f"window_id must be an integer in [-2**63, 2**63), got window_id={window_id!r}")
    if not -(2**63) <= int(window_id) < 2**63:
        raise ValueError(f"window_id must be an integer in [-2**63, 2**63), got window_id={window_id!r}")
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got dim={dim!r}")


def _field(data: bytes) -> bytes:
    """``len(data)`` as 8 bytes big-endian, then ``data``: a self-delimiting field."""
    return len(data).to_bytes(8, "big") + data


def _keyed_generator(binding: NoiseBinding, domain: bytes, query_id: str, window_id: int,
                     level: bytes) -> np.random.Generator:
    """Philox generator keyed by ``HMAC-SHA256(secret, domain || ledger || query || window ||
    level)[:16]``, each variable-length field length-prefixed (module docstring)."""
    message = (domain + _field(binding.ledger_id.encode("ascii")) + _field(query_id.encode("utf-8"))
               + int(window_id).to_bytes(8, "big", signed=True) + _field(level))
    digest = hmac.new(binding.key.secret, message, hashlib.sha256).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest[:16], "big")))


def _std_level(noise_std: float) -> bytes:
    """The Gaussian's level field: ``noise_std`` as IEEE-754 binary64, big-endian."""
    return struct.pack(">d", float(noise_std))


def _fraction_level(sigma_squared: Fraction) -> bytes:
    """The discrete Gaussian's level field: the exact rational ``sigma^2`` in lowest terms."""
    return f"{sigma_squared.numerator}/{sigma_squared.denominator}".encode("ascii")


def gaussian_noise(binding: NoiseBinding, *, query_id: str, window_id: int, dim: int,
                   noise_std: float) -> np.ndarray:
    """The Gaussian noise of release ``(query_id, window_id)`` of ``binding``'s ledger: float64
    array of shape ``(dim,)``, i.i.d. N(0, noise_std^2) per coordinate.

    ``noise_std`` is the standard deviation *per coordinate*, in the units of the query's
    answer (the ``s_t`` of docs/architecture.md, "The math"; the zCDP charge of a contribution
    ``v`` is ``||v||^2 / (2 noise_std^2)``). Deterministic in ``(binding.key, binding.ledger_id,
    query_id, window_id, noise_std)`` (invariant 5), independent across any change of them:
    another ledger under the same key, or the same release at another ``noise_std``, is an
    independent draw (never the same draw scaled). For fixed arguments the draw for
    ``dim = k`` is the prefix of the draw for any larger ``dim``.

    This is a floating-point sampler, with the least-significant-bit weakness of
    Mironov 2012; prefer :func:`discrete_gaussian_noise` for integer-valued answers.
    Raises ``ValueError`` naming the parameter for a ``binding`` that is not a
    :class:`NoiseBinding` (a bare :class:`NoiseKey` included), an empty ``query_id``, a
    non-integer or out-of-int64 ``window_id``, ``dim < 1`` or a ``noise_std`` that is not
    finite and > 0.
    """
    _check_release(binding, query_id, window_id, dim)
    if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float, np.integer, np.floating)) \
            or not math.isfinite(noise_std) or noise_std <= 0:
        raise ValueError(f"noise_std must be a finite number > 0, got noise_std={noise_std!r}")
    rng = _keyed_generator(binding, _GAUSSIAN_DOMAIN, query_id, int(window_id), _std_level(noise_std))
    return float(noise_std) * rng.standard_normal(int(dim))


# --- the exact discrete Gaussian (Canonne, Kamath & Steinke 2020) ------------------------------
#
# Every probability below is a ratio of Python integers ``num / den`` and every random choice is
# ``uniform integer in [0, den) < num``, so the samplers are exact: no floating point touches the
# output distribution. Rationals are carried as unreduced (num, den) pairs rather than Fraction
# objects, which saves a gcd per Bernoulli trial.


def _uniform_below(n: int, rng: np.random.Generator) -> int:
    """An exactly uniform integer in [0, n), for any Python int n >= 1."""
    if n <= 2**63:
        return int(rng.integers(0, n))
    # Beyond int64: draw bit_length(n) random bits from 64-bit words and reject values >= n
    # (acceptance probability > 1/2).
    bits = n.bit_length()
    words = -(-bits // 64)
    while True:
        value = 0
        for word in rng.integers(0, 2**64, size=words, dtype=np.uint64, endpoint=False):
            value = (value << 64) | int(word)
        value >>= words * 64 - bits
        if value < n:
            return value


def _bernoulli_exp_at_most_one(num: int, den: int, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for gamma = num/den in [0, 1] (CKS 2020, Algorithm 1, gamma <= 1).

    Draws A_k ~ Bernoulli(gamma / k) for k = 1, 2, ... until the first failure at K; returns
    whether K is odd. P(K odd) = sum_k (-gamma)^k / k! = exp(-gamma). Expected trials <= e.
    """
    k = 1
    while _uniform_below(den * k, rng) < num:
        k += 1
    return k % 2 == 1


def _bernoulli_exp(num: int, den: int, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for any rational gamma = num/den >= 0 (CKS 2020, Algorithm 1).

    exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma))): floor(gamma) trials of
    Bernoulli(exp(-1)), stopping at the first failure, then one with the fractional part.
    """
    whole, rest = divmod(num, den)
    for _ in range(whole):  # stops early with probability 1 - 1/e per round
        if not _bernoulli_exp_at_most_one(1, 1, rng):
            return False
    return _bernoulli_exp_at_most_one(rest, den, rng)


def _discrete_laplace(t: int, rng: np.random.Generator) -> int:
    """One draw with P(Y = y) proportional to exp(-|y| / t), integer t >= 1 (CKS 2020,
    Algorithm 2 with s = 1)."""
    while True:
        u = _uniform_below(t, rng)
        if not _bernoulli_exp(u, t, rng):
            continue
        v = 0  # geometric: P(V = v) = (1 - 1/e) e^-v
        while _bernoulli_exp_at_most_one(1, 1, rng):
            v += 1
        magnitude = u + t * v  # P(X = x) proportional to exp(-x / t) on x >= 0
        negative = _uniform_below(2, rng) == 1
        if negative and magnitude == 0:
            continue  # otherwise 0 would be counted twice
        return -magnitude if negative else magnitude


def _discrete_gaussian_one(num: int, den: int, rng: np.random.Generator) -> int:
    """One draw of N_Z(0, sigma^2), sigma^2 = num/den, by rejection from the discrete Laplace
    of scale t = floor(sigma) + 1 (CKS 2020, Algorithm 3)."""
    t = math.isqrt(num // den) + 1  # floor(sqrt(floor(x))) == floor(sqrt(x))
    while True:
        y = _discrete_laplace(t, rng)
        # Accept with probability exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)), as one fraction:
        # (|y| t den - num)^2 / (2 num t^2 den).
        gap = abs(y) * t * den - num
        if _bernoulli_exp(gap * gap, 2 * num * t * t * den, rng):
            return y


def _sigma_squared_fraction(value: Any) -> Fraction:
    if isinstance(value, Fraction):
        result = value
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        result = Fraction(int(value))
    elif isinstance(value, (float, np.floating)) and math.isfinite(value):
        result = Fraction(float(value))  # the exact binary value of the float
    else:
        raise ValueError(
            f"sigma_squared must be a finite number or Fraction in (0, {MAX_DISCRETE_SIGMA_SQUARED:g}], "
            f"got sigma_squared={value!r}"
        )
    if not 0 < result <= MAX_DISCRETE_SIGMA_SQUARED:
        raise ValueError(
            f"sigma_squared must be in (0, {MAX_DISCRETE_SIGMA_SQUARED:g}], got sigma_squared={value!r}"
        )
    return result


def _sample(sigma_squared: Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    num, den = sigma_squared.numerator, sigma_squared.denominator
    return np.array([_discrete_gaussian_one(num, den, rng) for _ in range(size)], dtype=np.int64)


def sample_discrete_gaussian(sigma_squared: float | Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` i.i.d. exact draws of the discrete Gaussian ``N_Z(0, sigma^2)``: int64 array.

    ``P(X = x) = exp(-x^2 / (2 sigma^2)) / sum_y exp(-y^2 / (2 sigma^2))`` for every integer
    ``x``; ``sigma_squared`` is the scale parameter squared (the variance is slightly below
    it, CKS 2020 Corollary 9). A float is taken at its exact binary value
    (``Fraction(sigma_squared)``); pass a ``Fraction`` to state a rational exactly.

    Canonne, Kamath & Steinke 2020, Algorithms 1-3, in exact rational arithmetic: the only
    randomness used is uniform integers from ``rng``, so the output distribution is exact (up
    to the quality of ``rng``), with no floating-point weakness. Cost: a Python loop per
    sample, about 20-60 uniform draws in a few rejection rounds (the expected number of rounds
    is bounded by a constant for every sigma), i.e. a few tens of microseconds per sample —
    fine for the handful of coordinates of a release, not for millions of samples.

    ``sigma_squared`` must lie in (0, 1e30] (beyond that int64 could overflow) and ``size``
    must be an integer >= 0; otherwise ``ValueError`` naming the parameter.
    """
    sigma2 = _sigma_squared_fraction(sigma_squared)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got size={size!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got rng of type {type(rng).__name__}")
    return _sample(sigma2, int(size), rng)


def discrete_gaussian_noise(
    binding: NoiseBinding, *, query_id: str, window_id: int, dim: int, sigma_squared: float | Fraction
) -> np.ndarray:
    """The discrete Gaussian noise of release ``(query_id, window_id)`` of ``binding``'s ledger:
    int64 array of shape ``(dim,)``, i.i.d. exact ``N_Z(0, sigma_squared)`` per coordinate (see
    :func:`sample_discrete_gaussian`).

    Keyed like :func:`gaussian_noise` (deterministic in ``(binding, query_id, window_id,
    sigma_squared)``, with ``sigma_squared`` taken as its exact rational value, and independent
    across any change of them) but with its own HMAC domain, so it never shares a stream with
    the continuous noise of the same release. Use it for integer-valued answers: the release
    ``sum + noise`` is then an integer and has no floating-point side channel (Mironov 2012).
    For zCDP accounting the discrete Gaussian with scale ``sigma^2`` gives at least the
    guarantee of the continuous one, ``rho = Delta_2^2 / (2 sigma^2)`` (CKS 2020, Theorem 14).
    """
    _check_release(binding, query_id, window_id, dim)
    sigma2 = _sigma_squared_fraction(sigma_squared)
    rng = _keyed_generator(binding, _DISCRETE_DOMAIN, query_id, int(window_id), _fraction_level(sigma2))
    return _sample(sigma2, int(dim), rng)


def discrete_gaussian_pmf(values: Any, sigma_squared: float) -> np.ndarray:
    """The probability mass function of ``N_Z(0, sigma^2)`` at the integers ``values``
    (float64, same shape), normalised over all of Z. For tests and documentation.

    The normaliser ``Z = sum_x exp(-x^2 / (2 sigma^2))`` is summed directly for sigma^2 <= 1
    (terms vanish beyond |x| = 40 sigma + 1) and by Poisson summation,
    ``Z = sqrt(2 pi sigma^2) (1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2))``, above, where three terms
    are exact to double precision. Raises ``ValueError`` for non-integer values.
    """
    sigma2 = float(_sigma_squared_fraction(sigma_squared))
    x = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(x)) or not np.array_equal(x, np.round(x)):
        raise ValueError("values must be integers")
    if sigma2 <= 1.0:
        reach = math.ceil(40 * math.sqrt(sigma2)) + 1
        support = np.arange(-reach, reach + 1, dtype=np.float64)
        norm = float(np.exp(-(support**2) / (2 * sigma2)).sum())
    else:
        k = np.arange(1, 4, dtype=np.float64)
        norm = math.sqrt(2 * math.pi * sigma2) * (1 + 2 * float(np.exp(-2 * math.pi**2 * sigma2 * k**2).sum()))
    return np.exp(-(x**2) / (2 * sigma2)) / norm
