"""The normaliser of the private gradient update: a public number, never the exact user count.

Algorithm 6 as printed steps by ``eta (sum_i g~_t(x_i) + Z_t) / n``. Under the neighbouring
relation of this engine's promise, **add or remove one user** (all of their records: every day's
indicators and their training row), ``n`` is private: dividing by it would release a function of
the exact number of users with every iterate, and one user's presence would move every
coordinate of the model by a factor ``n / (n + 1)`` outside the Gaussian mechanism's accounting.
DP gradient descent with "sum, add noise, divide by a public constant" is the standard fix (the
constant only rescales the learning rate, so Propositions 5.1 and 5.2 hold unchanged). The
constant is one of:

* a **public normaliser** the curator declares (``train --normaliser N``: e.g. a rounded user
  base published elsewhere). It is not computed from the data and costs no budget;
* by default, a **noisy count** of the users in the training set, released once per run with
  the Gaussian mechanism and charged to the same per-user ledger (:func:`private_count`): each
  user contributes ``1`` and is charged ``1 / (2 s^2)`` zCDP (users without that much budget
  left are dropped, Algorithm 3); the update divides by ``max(count + N(0, s^2), 1)``, a
  post-processing of the release.

The stopping rule's accuracy queries (:mod:`renyi_stream.stream.training.stopping`) divide by the same
normaliser.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.ledger import Policy
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.xp import array_module, to_host

# Noise is raised by this relative amount above sqrt(1 / (2 rho)), as in
# renyi_stream.stream.accounting.calibration.NOISE_HEADROOM, so the rounded-up charge fits the reserve.
_HEADROOM = 1e-8
# The smallest normaliser a noisy count is turned into (a count's noise can make it <= 0).
MIN_NORMALISER = 1.0


def count_noise_std(rho: float) -> float:
    """``s`` such that counting every user once costs ``rho`` zCDP per user: ``sqrt(1 / (2 rho))``
    (the Gaussian mechanism with sensitivity 1), raised by 1e-8 relative for rounding."""
    rho = check.positive("rho", rho)
    return math.sqrt(1.0 / (2.0 * rho)) * (1.0 + _HEADROOM)


def private_count(ledger: TrainingLedger, *, noise_std: float, rng: np.random.Generator) -> float:
    """The number of training rows whose user has budget for it, plus ``N(0, s^2)``.

    Each row's user contributes ``1`` and is charged ``1 / (2 s^2)`` zCDP in ``ledger`` under the
    ``drop`` policy (Algorithm 3): a user with less than that left contributes ``0`` and is
    charged nothing. The result is a released (public) value; it may be fractional or negative.
    On a device: two explicit transfers (the ledger's input check, the count).
    """
    noise_std = check.positive("noise_std", noise_std)
    xp = array_module(ledger.used)
    admitted = ledger.charge(xp.ones(len(ledger)), noise_std=noise_std, policy=Policy.DROP)
    return float(to_host(admitted.sum())) + float(rng.normal(0.0, noise_std))


def normaliser_from_count(noisy_count: float) -> float:
    """The update's normaliser from a released noisy count: ``max(noisy_count, 1)``
    (post-processing; a count's noise can make it small or negative on a tiny training set)."""
    value = check.real("noisy_count", noisy_count)
    return max(value, MIN_NORMALISER)


def check_normaliser(value: Any) -> float:
    """``value`` as a float when it is a usable normaliser (finite and > 0), else ``ValueError``
    naming ``normaliser``."""
    return check.positive("normaliser", value)
