"""Empirical privacy audit of running totals under prepaid admission (issue 20), in the style of
:mod:`renyi_stream.stream.audit`.

The claim under test: a running query released through a BLT, ``y_t = (C a)_t + z_t``, whose
admissions are charged by the prepaid rule (:mod:`renyi_stream.stream.continual.prepaid`) and filtered with the
ledger's budget, is ``(epsilon, delta)``-DP per user (docs/running_totals.md). The audit checks the
code from the outside, as :mod:`renyi_stream.stream.audit` checks the window filter: neighbouring worlds (the
target present / absent), ``trials`` independent runs per world, the most powerful test on the
released values, Clopper-Pearson bounds turned into a lower bound on epsilon
(:func:`renyi_stream.stream.audit.epsilon_lower_bound`: an honest mechanism reports a bound above the claim with
probability at most ``alpha``).

What runs: the real :class:`renyi_stream.stream.continual.prepaid.BLTPrepaid` (charges, state updates, the
aggregate release state) and :func:`renyi_stream.stream.continual.prepaid.prepaid_filter` (policy ``drop``,
the ledger's cap), the real keyed noise (:func:`renyi_stream.stream.noise.gaussian_noise`). Run ``j`` is user
``j`` and release coordinate ``j``: the runs are one vectorised query of dimension ``trials``.
No other users: their contributions would be known to the adversary and cancel from its
statistic (and each user's decision reads only their own row, tested in ``tests/test_prepaid.py``).

The adversary (white-box, adaptive). It controls the target's data and knows the mechanism,
bug included. Before window ``t`` it asks for the contribution whose charge *as the mechanism
computes it* is the remaining budget spread over the remaining windows (all of it at the last
window), halved after a release that came out below its expectation; so the target spends its
budget over several days and its charges depend on earlier releases. It replays the mechanism
on its own data (a shadow) and knows the target's part ``c_t`` of every release, so its
statistic is the exact log-likelihood ratio ``S = sum_t (c_t y_t - c_t^2 / 2) / s^2``; for the
honest mechanism ``sum_t c_t^2 <= B_norm``, so ``S`` separates the worlds by at most
``mu = sqrt(2 kappa)`` and the bound stays below the claim; it approaches it, since the target
spends all of its budget.

Broken variants (:class:`PrepaidVariant`), to show the audit has power:

* ``window_sum_charge``: the admission is charged ``||x||^2``, what a window release of ``x``
  costs, as if the running query were a window sum: the contribution's later appearances go
  unpaid.
* ``no_cross_term``: the charge ``||x||^2 G(m)`` without ``2 sum_j omega_j H_j(m) <S_j, x>``:
  each admission pays for its own future but not for how it adds to the user's earlier
  contributions in later releases.
"""

from __future__ import annotations

import enum
import hashlib
import warnings
from dataclasses import dataclass, field

import numpy as np

from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.audit import epsilon_lower_bound
from renyi_stream.stream.continual.blt import BufferedLinearToeplitz
from renyi_stream.stream.continual.prepaid import BLTPrepaid, ChargeTerms, prepaid_filter
from renyi_stream.stream.ledger import BUDGET_SAFETY
from renyi_stream.stream.noise import InsecureNoiseWarning, NoiseBinding, NoiseKey, gaussian_noise

# The adversary asks a hair below the share it means to spend, so that rounding never turns a
# share of "everything left" into a drop.
_ASK_BELOW = 1.0 - 1e-7


class PrepaidVariant(str, enum.Enum):
    """The mechanism under audit: the honest prepaid rule, or a deliberately broken charge."""

    HONEST = "honest"
    WINDOW_SUM_CHARGE = "window_sum_charge"
    NO_CROSS_TERM = "no_cross_term"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PrepaidAuditConfig:
    """One audit: the promise, the experiment's size and its confidence.

    Args:
        epsilon, delta: the per-user promise (GDP accounting, ``renyi_stream.stream.accounting.calibrate``).
        norm_budget: ``B``, the total prepaid squared norm a user may be charged.
        windows: the declared schedule (``T``), >= 2.
        trials: runs per world, >= 1000 (half select the threshold, half evaluate it).
        alpha: false-alarm rate of the lower bound.
        seed: seeds the (insecure, public) noise key.
    """

    epsilon: float = 1.0
    delta: float = 1e-2
    norm_budget: float = 1.0
    windows: int = 6
    trials: int = 200_000
    alpha: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        for name, minimum in (("windows", 2), ("trials", 1000), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")


@dataclass(frozen=True)
class PrepaidAuditResult:
    """What an audit measured; ``caught`` when the lower bound exceeds the claim."""

    variant: PrepaidVariant
    claimed_epsilon: float
    epsilon_lower_bound: float
    mu: float  # the claim's GDP parameter, sqrt(2 kappa)
    realised_mu: float  # sqrt(max over runs of sum_t c_t^2) / s: what the target really exposed
    trials: int
    alpha: float
    scores_absent: np.ndarray = field(repr=False)
    scores_present: np.ndarray = field(repr=False)

    @property
    def caught(self) -> bool:
        return self.epsilon_lower_bound > self.claimed_epsilon


def _mechanism_terms(variant: PrepaidVariant, terms: ChargeTerms, x: np.ndarray) -> ChargeTerms:
    """The charge terms the (possibly broken) mechanism uses for contributions ``x``."""
    if variant is PrepaidVariant.WINDOW_SUM_CHARGE:
        sq = x[:, 0] ** 2
        return ChargeTerms(quadratic=sq, cross=np.zeros_like(sq), magnitude=sq)
    if variant is PrepaidVariant.NO_CROSS_TERM:
        return ChargeTerms(quadratic=terms.quadratic, cross=np.zeros_like(terms.cross), magnitude=terms.quadratic)
    return terms


def _request(variant: PrepaidVariant, share: np.ndarray, unit: ChargeTerms) -> np.ndarray:
    """The non-negative ``x`` whose mechanism charge ``x^2 A + 2 x B`` is ``share`` (``unit``: the
    terms of ``x = 1``, so ``A = quadratic``, ``B = cross``)."""
    a, b = unit.quadratic, unit.cross
    if variant is PrepaidVariant.WINDOW_SUM_CHARGE:
        a, b = np.ones_like(a), np.zeros_like(b)
    elif variant is PrepaidVariant.NO_CROSS_TERM:
        b = np.zeros_like(b)
    return share / (b + np.sqrt(b * b + a * share))  # the positive root, without cancellation


def _world(config: PrepaidAuditConfig, variant: PrepaidVariant, *, present: bool, key: NoiseBinding, rho: float,
           noise_std: float) -> tuple[np.ndarray, np.ndarray]:
    """``trials`` runs in one world: the adversary's scores and each run's ``sum_t c_t^2``."""
    n, s = config.trials, noise_std
    rule = BLTPrepaid(BufferedLinearToeplitz(), horizon=config.windows)
    users = rule.new_users(n, 1)
    release = rule.new_release(n)  # the runs as coordinates of one query
    used = np.zeros(n)
    cap = float(np.nextafter(rho * (1.0 - BUDGET_SAFETY), 0.0))  # the ledger's cap
    two_s2 = 2.0 * s * s
    scores, exposure, residual = np.zeros(n), np.zeros(n), np.zeros(n)
    query = "audit/prepaid/present" if present else "audit/prepaid/absent"
    for t in range(config.windows):
        honest_unit = rule.charge_terms(users, np.ones((n, 1)), t)  # the adversary's replay
        left = np.maximum(cap - used, 0.0) * two_s2  # norm units, as the mechanism sees them
        spread = left / (config.windows - t)
        share = np.where((t == config.windows - 1), left, np.where(residual >= 0.0, spread, spread / 2.0))
        x = _request(variant, share * _ASK_BELOW, honest_unit)[:, None]
        terms = rule.charge_terms(users, x, t)
        decision = prepaid_filter(used, _mechanism_terms(variant, terms, x), cap=cap, noise_std=s, policy="drop")
        used = decision.new_used
        admitted = x * decision.scale[:, None]
        users = rule.admit(users, admitted, t)
        c, release = rule.release(release, admitted[:, 0])  # the target's part of release t
        c = c[0]
        y = (c if present else 0.0) + gaussian_noise(key, query_id=query, window_id=t, dim=n, noise_std=s)
        residual = y - c / 2.0  # positive when the release looks more like "present"
        scores += (c * y - 0.5 * c * c) / (s * s)
        exposure += c * c
    return scores, exposure


def run_prepaid_audit(config: PrepaidAuditConfig = PrepaidAuditConfig(),
                      variant: PrepaidVariant | str = PrepaidVariant.HONEST) -> PrepaidAuditResult:
    """Audit ``variant`` of prepaid BLT running totals against ``config``'s promise (module
    docstring). Deterministic in ``config.seed``."""
    if not isinstance(config, PrepaidAuditConfig):
        raise ValueError(f"config must be a PrepaidAuditConfig, got {type(config).__name__}")
    try:
        variant = PrepaidVariant(variant)
    except ValueError:
        raise ValueError(f"variant must be one of {[v.value for v in PrepaidVariant]}, got variant={variant!r}") \
            from None
    cal = calibrate(epsilon=config.epsilon, delta=config.delta, norm_budget=config.norm_budget, accounting="gdp")
    with warnings.catch_warnings():
        # A public test key on purpose: the audit must be reproducible, and it publishes nothing.
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        ledger_id = hashlib.sha256(f"renyi-stream/prepaid-audit/{int(config.seed)}".encode()).hexdigest()[:32]
        key = NoiseBinding(NoiseKey.insecure_for_tests(config.seed), ledger_id)
    absent, _ = _world(config, variant, present=False, key=key, rho=cal.rho, noise_std=cal.noise_std)
    present, exposure = _world(config, variant, present=True, key=key, rho=cal.rho, noise_std=cal.noise_std)
    bound = epsilon_lower_bound(absent, present, delta=config.delta, alpha=config.alpha)
    return PrepaidAuditResult(
        variant=variant, claimed_epsilon=config.epsilon, epsilon_lower_bound=bound.epsilon, mu=cal.mu,
        realised_mu=float(np.sqrt(exposure.max())) / cal.noise_std, trials=config.trials, alpha=config.alpha,
        scores_absent=absent, scores_present=present,
    )
