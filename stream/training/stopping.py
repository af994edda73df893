"""The stopping rule of Feldman & Zrnic, Appendix A: private training-accuracy queries.

Algorithm 7's guarantee (Proposition 5.2) does not depend on the number of steps ``k_max``, so
*when to stop* is a free choice. Appendix A: "starting with step ``floor(B_norm / C^2)``, we query
the training accuracy 8 times in intervals of 5 steps (hence, the total number of additional
steps is 35). As the final model we take the iterate when the queried training accuracy is
highest."

The paper leaves those queries unaccounted ("technically, these additional queries should be
reported in a privacy-preserving manner"). Here they are: each query is the Gaussian
mechanism on the linear query ``q(x_i) = 1[model predicts y_i]``, released as
``sum_i q(x_i) + N(0, s^2)`` and charged to the same per-user ledger as the gradient steps,
``q(x_i)^2 / (2 s^2)`` zCDP: ``1 / (2 s^2)`` for a correctly classified user, nothing for a
misclassified one (individual accounting). Every user's budget reserves
``queries / (2 s^2)`` for them before the gradient steps may use the rest, so the whole run
(steps and queries) stays within the user's budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.ledger import Policy
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.xp import array_module, to_host

# Noise is raised by this relative amount above sqrt(queries / (2 rho)), as in
# renyi_stream.stream.accounting.calibration.NOISE_HEADROOM, so rounded-up charges fit the reserve.
_HEADROOM = 1e-8


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class AccuracyStopping:
    """Query the training accuracy privately at ``first_step, first_step + every, ...``
    (``queries`` times) and keep the iterate with the highest noisy accuracy (Appendix A).

    Attributes:
        first_step: the step after which the first query is made; Appendix A uses
            ``floor(B_norm / C^2)`` (see :meth:`after_budget_steps`). >= 1.
        every: steps between queries (Appendix A: 5). >= 1.
        queries: number of queries (Appendix A: 8). >= 1.
        noise_std: Gaussian noise std of each released count of correct predictions, in
            examples (> 0). Noisy accuracy = (count + noise) / n.
    """

    first_step: int
    noise_std: float
    every: int = 5
    queries: int = 8

    def __post_init__(self) -> None:
        _positive_int("first_step", self.first_step)
        _positive_int("every", self.every)
        _positive_int("queries", self.queries)
        check.positive("noise_std", self.noise_std)

    @classmethod
    def with_reserve(cls, *, first_step: int, rho: float, queries: int = 8, every: int = 5) -> "AccuracyStopping":
        """The rule whose ``queries`` queries cost each user at most ``rho`` zCDP in total:
        ``noise_std = sqrt(queries / (2 rho))`` (raised by 1e-8 relative for rounding)."""
        rho = check.positive("rho", rho)
        queries = _positive_int("queries", queries)
        return cls(first_step=first_step, every=every, queries=queries,
                   noise_std=math.sqrt(queries / (2.0 * rho)) * (1.0 + _HEADROOM))

    @staticmethod
    def after_budget_steps(budget_steps: float) -> int:
        """Appendix A's first query step, ``floor(B_norm / C^2)`` (at least 1)."""
        return max(1, int(math.floor(check.positive("budget_steps", budget_steps))))

    @property
    def last_step(self) -> int:
        """The step of the last query: ``first_step + every * (queries - 1)``; the run ends there."""
        return self.first_step + self.every * (self.queries - 1)

    @property
    def query_steps(self) -> tuple[int, ...]:
        return tuple(self.first_step + self.every * j for j in range(self.queries))

    @property
    def rho_per_user(self) -> float:
        """zCDP reserved per user for all queries: ``queries / (2 s^2)`` (a user correct every time)."""
        return self.queries / (2.0 * self.noise_std**2)

    def is_query_step(self, step: int) -> bool:
        return step >= self.first_step and step <= self.last_step and (step - self.first_step) % self.every == 0


def private_accuracy(correct: Any, ledger: TrainingLedger, *, noise_std: float,
                     rng: np.random.Generator, normaliser: float) -> float:
    """One private training-accuracy query: ``(sum_i 1[correct_i] + N(0, s^2)) / N``.

    ``correct`` is ``(n,)`` bool (or 0/1), one per training row. Each row's user is charged
    ``1 / (2 s^2)`` if correct (0 otherwise) under the ``drop`` policy (Algorithm 3): a user
    without that much budget left contributes 0. ``N`` (``normaliser``, > 0) is the run's public
    normaliser (:mod:`renyi_stream.stream.training.normaliser`), not the exact number of rows, which is
    private under add/remove-one-user neighbours. The result is a noisy fraction and may fall
    outside [0, 1]. On a device: two explicit transfers (the ledger's input check, the count).
    """
    noise_std = check.positive("noise_std", noise_std)
    normaliser = check.positive("normaliser", normaliser)
    xp = array_module(correct)
    q = xp.asarray(correct, dtype=xp.float64)
    admitted = ledger.charge(q, noise_std=noise_std, policy=Policy.DROP)
    count = float(to_host((q * admitted).sum()))  # the released count, before its (host) noise
    return (count + float(rng.normal(0.0, noise_std))) / normaliser
