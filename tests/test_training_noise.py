"""The noise of a training run is keyed (issue 18, item 4; invariant 5 (release-once,
docs/architecture.md)): a function of the curator's key, the ledger, the run id it commits as
and the stream, never a live draw."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from renyi_stream.stream.noise import InsecureNoiseWarning, NoiseKey
from renyi_stream.stream.training.dpgd import training_generators
from renyi_stream.stream.training.keyed_noise import STREAMS, keyed_training_noise, seeded_training_noise, training_stream

KEY = NoiseKey(secret=bytes(range(32)))


def _draw(key=KEY, ledger="/curator/ledger.duckdb", run_id=3, stream="gradient") -> np.ndarray:
    return training_stream(key, ledger=ledger, run_id=run_id, stream=stream).standard_normal(4)


def test_the_same_key_ledger_run_and_stream_give_the_same_draws():
    np.testing.assert_array_equal(_draw(), _draw())
    noise = keyed_training_noise(KEY, ledger="/curator/ledger.duckdb", run_id=3)
    np.testing.assert_array_equal(noise.gradient.standard_normal(4), _draw())
    assert noise.insecure is False


@pytest.mark.parametrize("change", [{"run_id": 4}, {"ledger": "/other/ledger.duckdb"}, {"stream": "accuracy"},
                                    {"stream": "count"}, {"key": NoiseKey(secret=bytes(range(1, 33)))}],
                         ids=["next run", "other ledger", "accuracy stream", "count stream", "other key"])
def test_any_change_of_key_ledger_run_or_stream_gives_other_draws(change):
    assert not np.allclose(_draw(), _draw(**change))


def test_the_training_derivation_is_pinned():
    """The derivation is part of what a re-run must reproduce: changing it changes the model a
    re-run after a crash releases. These values pin it."""
    np.testing.assert_allclose(_draw(), PINNED, rtol=0, atol=0)


def test_training_noise_is_not_the_release_noise_of_the_same_numbers():
    from renyi_stream.stream.noise import NoiseBinding, gaussian_noise

    ledger_id = "0123456789abcdef0123456789abcdef"  # training and releases bind to the same ledger id
    release = gaussian_noise(NoiseBinding(KEY, ledger_id), query_id="gradient", window_id=3, dim=4, noise_std=1.0)
    assert not np.allclose(release, _draw(ledger=ledger_id))


@pytest.mark.parametrize("kwargs, message", [
    ({"key": b"0" * 32}, "key must be a NoiseKey"),
    ({"ledger": ""}, "ledger must be a non-empty string"),
    ({"run_id": 2**63}, "run_id must be an integer in"),
    ({"run_id": True}, "run_id must be an integer in"),
    ({"stream": "other"}, "stream must be one of"),
])
def test_bad_arguments_are_refused_naming_the_parameter(kwargs, message):
    args = {"key": KEY, "ledger": "l", "run_id": 1, "stream": "gradient", **kwargs}
    key = args.pop("key")
    with pytest.raises(ValueError, match=message):
        training_stream(key, **args)


def test_seeded_training_noise_warns_and_extends_training_generators():
    with pytest.warns(InsecureNoiseWarning, match="not private"):
        noise = seeded_training_noise(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        grad, query = training_generators(4)
    assert noise.insecure is True
    assert noise.gradient.standard_normal() == grad.standard_normal()
    assert noise.accuracy.standard_normal() == query.standard_normal()
    assert set(STREAMS) == {"gradient", "accuracy", "count"}


# HMAC-SHA256(bytes(range(32)), b"renyi-stream/training/v1" || len || "/curator/ledger.duckdb" || 3 ||
# len || "gradient")[:16] as the Philox key; its first four standard normals.
PINNED = np.array([0.7194037893080558, 2.960721111047551, -0.3461238381565762, -0.686665648125165])
