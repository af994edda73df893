"""The noise of one training run, derived from the curator's noise key (invariant 5 (release-once,
docs/architecture.md)).

A training run releases noisy gradient sums (every iterate is a post-processing of them), a
noisy count of its users (the update's normaliser, :mod:`renyi_stream.stream.training.normaliser`) and noisy
accuracy counts (Appendix A's stopping rule). Like a daily window, a training run must be
released **once**: a run that crashes before the ledger commit and is re-run from the same
ledger state must release the same model and the same noisy values, never a second independent
draw of the same queries for one charge. So its noise comes from the curator's secret key, not
from a live generator:

    philox_key = HMAC-SHA256(secret, DOMAIN || len(ledger) || ledger || run_id || len(stream) || stream)[:16]
    stream      = Generator(Philox(key=philox_key))

with ``DOMAIN = b"renyi-stream/training/v1"``, lengths as 8-byte big-endian integers, ``ledger``
the ledger's identifier (``CuratorStore.ledger_id``: 128 random bits as hex, the id the release
noise of :mod:`renyi_stream.stream.noise` is bound to too), ``run_id`` the ledger run the training will
commit as (a signed 8-byte big-endian integer) and ``stream`` one of :data:`STREAMS`. Each
stream is read in a fixed order (the gradient noise parameter by parameter, step by step; the
``j``-th accuracy query takes the ``j``-th draw), so the Philox counter is the step or query
index.

* The same key, ledger, run id and stream give the same draws bit for bit: a re-run from the
  same ledger state (the crashed attempt committed nothing, so the next run id is the same)
  trains the same model and prints the same values.
* A committed run moves the ledger to the next run id, so the next training draws fresh,
  independent noise (HMAC-SHA256 is a pseudo-random function of the message; Philox streams
  under distinct keys are independent).
* The domain keeps training noise apart from the release noise of :mod:`renyi_stream.stream.noise` (which
  hashes other domains) even where a training run and a daily window share numbers.
* The ledger identity binds the draws to one ledger: a key copied to a second ledger does not
  give that ledger the same training noise over other users' data.

This module does not touch :mod:`renyi_stream.stream.noise`'s release derivation; it only reads the key's
secret.
"""

from __future__ import annotations

import hashlib
import hmac
import warnings
from dataclasses import dataclass

import numpy as np

from renyi_stream.stream.noise import InsecureNoiseWarning, NoiseKey

DOMAIN = b"renyi-stream/training/v1"
STREAMS = ("gradient", "accuracy", "count")


@dataclass(frozen=True)
class TrainingNoise:
    """The three noise streams of one training run.

    Attributes:
        gradient: the noise added to the summed clipped gradients (``private_gd``'s ``rng``).
        accuracy: the noise of the stopping rule's accuracy queries (``query_rng``).
        count: the noise of the user count that normalises the update.
        insecure: ``True`` when derived from a public seed (tests, experiments): not private.
    """

    gradient: np.random.Generator
    accuracy: np.random.Generator
    count: np.random.Generator
    insecure: bool = False


def _int64(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -(2**63) <= int(value) < 2**63:
        raise ValueError(f"{name} must be an integer in [-2**63, 2**63), got {name}={value!r}")
    return int(value)


def _length_prefixed(text: str) -> bytes:
    raw = text.encode("utf-8")
    return len(raw).to_bytes(8, "big") + raw


def training_stream(key: NoiseKey, *, ledger: str, run_id: int, stream: str) -> np.random.Generator:
    """The Philox generator of ``stream`` for the training run that commits as ``run_id`` on
    ``ledger``: deterministic in ``(key, ledger, run_id, stream)``, independent across any change
    of them (see the module docstring for the exact derivation).

    Raises ``ValueError`` naming the parameter for a key that is not a :class:`NoiseKey`, an
    empty ``ledger``, a ``run_id`` outside int64 or a ``stream`` not in :data:`STREAMS`.
    """
    if not isinstance(key, NoiseKey):
        raise ValueError(f"key must be a NoiseKey (NoiseKey.load_or_create), got key of type {type(key).__name__}")
    if not isinstance(ledger, str) or not ledger:
        raise ValueError(f"ledger must be a non-empty string identifying the ledger, got ledger={ledger!r}")
    run = _int64("run_id", run_id)
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {STREAMS}, got stream={stream!r}")
    message = DOMAIN + _length_prefixed(ledger) + run.to_bytes(8, "big", signed=True) + _length_prefixed(stream)
    digest = hmac.new(key.secret, message, hashlib.sha256).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest[:16], "big")))


def keyed_training_noise(key: NoiseKey, *, ledger: str, run_id: int) -> TrainingNoise:
    """The noise of the training run that will commit as ``run_id`` on ``ledger`` (production)."""
    return TrainingNoise(*(training_stream(key, ledger=ledger, run_id=run_id, stream=s) for s in STREAMS),
                         insecure=key.insecure)


def seeded_training_noise(seed: int) -> TrainingNoise:
    """Reproducible noise from a public integer seed, for tests and experiments: warns
    :class:`InsecureNoiseWarning` (anyone who knows the seed can remove the noise). The gradient
    and accuracy streams are those of :func:`renyi_stream.stream.training.dpgd.training_generators` with the
    same seed; the count stream is the seed's third child."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got seed={seed!r}")
    warnings.warn("training noise from a public seed: the trained model is not private "
                  "(use the curator's noise key in production)", InsecureNoiseWarning, stacklevel=2)
    # spawn(3)'s first two children are spawn(2)'s: the same streams as training_generators(seed).
    children = np.random.SeedSequence(int(seed)).spawn(3)
    return TrainingNoise(*(np.random.Generator(np.random.Philox(c)) for c in children), insecure=True)
