"""Keyed, reproducible, secret noise for releases.

Invariant 5 of DESIGN.md: a window is released once. A retried bundle, a re-run of the same day
or a recovery after a crash must give the *identical* answer, never a second independent draw
(two draws of the same sum average away the noise). So the noise for ``(query, window)`` is not
drawn from a live generator: it is derived from a secret key. HMAC-SHA256(secret, query,
window) gives a 128-bit key for NumPy's counter-based Philox generator; the same
``(key, query, window)`` yields the same draw bit for bit, and different ones are independent
(HMAC is a PRF; Philox is a strong counter-based generator).

Floating-point Gaussian samples leak through their least significant bits (Mironov 2012, "On
significance of the least significant bits for differential privacy"); for integer-valued
queries use :func:`discrete_gaussian_noise`, the exact discrete Gaussian of Canonne, Kamath &
Steinke (2020), which has no such weakness.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import stat
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

KEY_BYTES = 32
_GAUSSIAN_DOMAIN = b"renyi-stream/gaussian/v1"
_DISCRETE_DOMAIN = b"renyi-stream/discrete-gaussian/v1"
_FINGERPRINT_DOMAIN = b"renyi-stream/fingerprint/v1"


class InsecureNoiseWarning(UserWarning):
    """Noise derived from a public seed: fine for tests, never for releases."""


class NoiseKeyError(ValueError):
    """A key file that is missing, malformed or readable by others."""


@dataclass(frozen=True, repr=False)
class NoiseKey:
    """The curator's secret from which all release noise is derived.

    Create it once with :meth:`load_or_create` and keep it with the curator's ledger: whoever
    holds it can subtract the noise from every release.
    """

    secret: bytes
    insecure: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            raise NoiseKeyError(f"secret must be {KEY_BYTES} bytes")

    def __repr__(self) -> str:
        return f"NoiseKey(fingerprint={self.fingerprint!r}, insecure={self.insecure})"

    @property
    def fingerprint(self) -> str:
        """A public identifier of the key (16 hex digits), safe to store next to releases."""
        return hashlib.sha256(_FINGERPRINT_DOMAIN + self.secret).hexdigest()[:16]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NoiseKey":
        """Read an existing key file; refuse one that is missing, malformed or not private (0600)."""
        path = Path(path)
        try:
            info = path.stat()
        except FileNotFoundError:
            raise NoiseKeyError(
                f"noise key file {path} does not exist; create it with NoiseKey.load_or_create "
                "(the first run does), or restore the curator's key"
            ) from None
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise NoiseKeyError(
                f"noise key file {path} is readable or writable by group/others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run 'chmod 600 {path}'"
            )
        secret = path.read_bytes()
        if len(secret) != KEY_BYTES:
            raise NoiseKeyError(
                f"noise key file {path} holds {len(secret)} bytes, expected {KEY_BYTES}: "
                "it is not a renyi-stream key or it was damaged"
            )
        return cls(secret=secret)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike) -> "NoiseKey":
        """Load the key at ``path``, creating it (32 random bytes, mode 0600) if it is absent."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls.load(path)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        return cls.load(path)

    @classmethod
    def insecure_for_tests(cls, seed: int) -> "NoiseKey":
        """A key derived from a public seed, for tests only. Warns every time."""
        warnings.warn(
            "using an insecure noise key derived from a public seed: releases made with it are "
            "not private", InsecureNoiseWarning, stacklevel=2,
        )
        secret = hashlib.sha256(b"renyi-stream/insecure-test-key/" + str(int(seed)).encode()).digest()
        return cls(secret=secret, insecure=True)


def _check_request(query_id: Any, window_id: Any, dim: Any) -> None:
    if not isinstance(query_id, str) or not query_id:
        raise ValueError(f"query_id must be a non-empty string, got query_id={query_id!r}")
    if isinstance(window_id, bool) or not isinstance(window_id, (int, np.integer)):
        raise ValueError(f"window_id must be an integer, got window_id={window_id!r}")
    if not -(2**63) <= int(window_id) < 2**63:
        raise ValueError(f"window_id must fit in int64, got window_id={window_id!r}")
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got dim={dim!r}")


def _generator(key: NoiseKey, domain: bytes, query_id: str, window_id: int) -> np.random.Generator:
    if not isinstance(key, NoiseKey):
        raise ValueError(f"key must be a NoiseKey, got key={type(key).__name__}")
    query = query_id.encode("utf-8")
    # Length-prefixing makes the encoding injective: ("a", 12) and ("a1", 2) differ.
    message = domain + len(query).to_bytes(8, "big") + query + int(window_id).to_bytes(8, "big", signed=True)
    digest = hmac.new(key.secret, message, hashlib.sha256).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest[:16], "big")))


def gaussian_noise(key: NoiseKey, *, query_id: str, window_id: int, dim: int, noise_std: float) -> np.ndarray:
    """The Gaussian noise of release ``(query_id, window_id)``: ``dim`` draws of N(0, noise_std^2).

    Deterministic in ``(key, query_id, window_id)`` (invariant 5); independent across any change
    of them. ``noise_std`` is the standard deviation per coordinate.
    """
    _check_request(query_id, window_id, dim)
    if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float, np.integer, np.floating)) \
            or not math.isfinite(noise_std) or noise_std <= 0:
        raise ValueError(f"noise_std must be finite and > 0, got noise_std={noise_std!r}")
    rng = _generator(key, _GAUSSIAN_DOMAIN, query_id, int(window_id))
    return float(noise_std) * rng.standard_normal(int(dim))


# --- the discrete Gaussian (Canonne, Kamath & Steinke 2020) -----------------------------------


def _as_fraction(name: str, value: Any) -> Fraction:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive number, got {name}={value!r}")
    if isinstance(value, Fraction):
        result = value
    elif isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(float(value)):
        result = Fraction(float(value)) if isinstance(value, (float, np.floating)) else Fraction(int(value))
    else:
        raise ValueError(f"{name} must be a finite positive number, got {name}={value!r}")
    if result <= 0:
        raise ValueError(f"{name} must be > 0, got {name}={value!r}")
    return result


def _bernoulli(p: Fraction, rng: np.random.Generator) -> bool:
    """Exact Bernoulli(p) for rational p in [0, 1] from a uniform integer."""
    return int(rng.integers(0, p.denominator)) < p.numerator


def _bernoulli_exp_small(gamma: Fraction, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for 0 <= gamma <= 1 (CKS 2020, Algorithm 1, first part)."""
    k = 1
    while _bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def _bernoulli_exp(gamma: Fraction, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for gamma >= 0 (CKS 2020, Algorithm 1)."""
    while gamma > 1:
        if not _bernoulli_exp_small(Fraction(1), rng):
            return False
        gamma -= 1
    return _bernoulli_exp_small(gamma, rng)


def _discrete_laplace(t: int, rng: np.random.Generator) -> int:
    """P(Y = y) proportional to exp(-|y| / t) for integer t >= 1 (CKS 2020, Algorithm 2)."""
    while True:
        u = int(rng.integers(0, t))
        if not _bernoulli_exp(Fraction(u, t), rng):
            continue
        v = 0
        while _bernoulli_exp(Fraction(1), rng):
            v += 1
        y = u + t * v
        negative = _bernoulli(Fraction(1, 2), rng)
        if negative and y == 0:
            continue
        return -y if negative else y


def _discrete_gaussian_one(sigma_squared: Fraction, rng: np.random.Generator) -> int:
    """One draw of N_Z(0, sigma^2) by rejection from the discrete Laplace (CKS 2020, Algorithm 3)."""
    t = math.floor(math.isqrt(sigma_squared.numerator // sigma_squared.denominator)) + 1
    while True:
        y = _discrete_laplace(t, rng)
        gamma = (abs(y) - sigma_squared / t) ** 2 / (2 * sigma_squared)
        if _bernoulli_exp(gamma, rng):
            return y


def sample_discrete_gaussian(sigma_squared: float | Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` exact draws of the discrete Gaussian ``N_Z(0, sigma^2)``, int64.

    Canonne, Kamath & Steinke 2020, Algorithm 3, in exact rational arithmetic: only uniform
    integers are drawn from ``rng``, so the output distribution is exactly
    ``P(x) proportional to exp(-x^2 / (2 sigma^2))`` over the integers. A Python loop runs per
    sample (a handful of rejection rounds each): fine for the few coordinates of a release,
    about 10^4-10^5 samples per second.
    """
    sigma2 = _as_fraction("sigma_squared", sigma_squared)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got size={size!r}")
    return np.array([_discrete_gaussian_one(sigma2, rng) for _ in range(int(size))], dtype=np.int64)


def discrete_gaussian_noise(
    key: NoiseKey, *, query_id: str, window_id: int, dim: int, sigma_squared: float | Fraction
) -> np.ndarray:
    """The discrete Gaussian noise of release ``(query_id, window_id)``, int64, keyed like
    :func:`gaussian_noise` (with its own domain, so the two never share a draw)."""
    _check_request(query_id, window_id, dim)
    sigma2 = _as_fraction("sigma_squared", sigma_squared)
    return sample_discrete_gaussian(sigma2, int(dim), _generator(key, _DISCRETE_DOMAIN, query_id, int(window_id)))


def discrete_gaussian_pmf(values: Any, sigma_squared: float) -> np.ndarray:
    """The pmf of ``N_Z(0, sigma^2)`` at integer ``values`` (normalised by a sum over +-60 sigma)."""
    sigma2 = float(_as_fraction("sigma_squared", sigma_squared))
    reach = int(60 * math.sqrt(sigma2)) + 60
    support = np.arange(-reach, reach + 1)
    norm = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma2)).sum()
    x = np.asarray(values, dtype=np.float64)
    return np.exp(-(x**2) / (2 * sigma2)) / norm
