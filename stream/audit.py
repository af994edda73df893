"""Empirical privacy audit of the individual filter with Gaussian releases.

A proof says the filtered, adaptive interaction is ``kappa``-zCDP, hence ``sqrt(2 kappa)``-GDP
and ``(epsilon, delta)``-DP (Feldman & Zrnic, Theorem 4.5; Smith & Thakurta 2022). An audit
checks the *code* against that claim from the outside, as Jagielski, Ullman & Oprea 2020
("Auditing Differentially Private Machine Learning: How Private is Private SGD?") and Nasr,
Song, Thakurta, Papernot & Carlini 2021 ("Adversary Instantiation: Lower Bounds for
Differentially Private Machine Learning") audit DP-SGD:

1. Run the mechanism many times on two neighbouring inputs: with the *target* user (world 1)
   and without them (world 0). Every other user's data is fixed and known to the adversary, as
   DP's definition allows.
2. Compute, on each run's released outputs, a test statistic; thresholding it is a hypothesis
   test of "the target is present". Any ``(epsilon, delta)``-DP mechanism forces every test to
   satisfy ``FNR + e^epsilon FPR >= 1 - delta`` and ``FPR + e^epsilon FNR >= 1 - delta``
   (Kairouz, Oh & Viswanath 2015, Thm 2.1; Dong, Roth & Su 2019, Sec. 2).
3. Replace FPR and FNR by one-sided Clopper-Pearson upper confidence bounds (Clopper & Pearson
   1934) and solve for epsilon:
   ``eps_lb = max(log((1 - delta - FNR_up) / FPR_up), log((1 - delta - FPR_up) / FNR_up))``.
   If both true rates lie below their bounds, which happens with probability at least
   ``1 - alpha`` (each bound is at level ``alpha / 2``), then ``eps_lb <= epsilon`` for every
   mechanism that keeps its promise: an honest mechanism reports ``eps_lb > epsilon`` with
   probability at most ``alpha`` (the audit's false-alarm rate).

The threshold is chosen on one half of the runs and evaluated on the other half, so the
maximum over thresholds costs no multiple-testing correction (a maximum over thresholds on the
same runs is biased upwards and can exceed the claim for an honest mechanism).

What is run
-----------
The vectorised core, not Beam: :class:`renyi_stream.stream.ledger.Ledger` charges and filters, and the noise
is :func:`renyi_stream.stream.noise.gaussian_noise`, keyed by ``(query, window)``. The runs are vectorised:
run ``j`` is user id ``j`` (the target) plus ``background_users`` other ids in the same ledger,
and its release is coordinate ``j`` of a ``trials``-dimensional keyed noise vector. Each run's
decisions depend only on its own users' data, which is the ledger's contract, so the runs are
independent.

The adversary (white-box, adaptive)
-----------------------------------
The target's data is the adversary's: before window ``t`` it looks at the releases so far and
asks for everything the filter still admits when the previous release came out positive, and
for half of it otherwise; at the last window it asks for everything left. (Under ``clip`` it
asks for three times what is left and lets the filter scale it down.) It knows the mechanism
under test, bug included (Nasr et al.'s strongest threat model), so it can replay the target's
filter on its own (a *shadow* ledger holding the target only) and compute, in either world,
what the target contributes to each release. Its statistic is then the exact log-likelihood
ratio of the Gaussian releases, which by Neyman & Pearson 1933 is the most powerful test:

    S = sum over informative releases k of (c_k * y_k - c_k**2 / 2) / s**2,

where ``y_k`` is release ``k`` minus the known sum of the other users and ``c_k`` the target's
contribution to it. A re-run's release that is bit-identical to the first release of its window
carries no information and is skipped. For the honest mechanism the target spends its whole
budget in every run, so ``S`` is ``N(-mu^2/2, mu^2)`` in world 0 and ``N(mu^2/2, mu^2)`` in
world 1 with ``mu = sqrt(2 kappa)`` (a martingale with fixed quadratic variation): the audit is
tight, its lower bound approaches the claim as the number of runs grows.

Broken variants (:class:`Variant`), to show the audit has power:

* ``window_scoped_ledger``: the ledger is reset at every window, as a Beam stateful DoFn in
  daily windows would do (invariant 1 (ledger-never-window-scoped, docs/architecture.md)). The
  adversary gets a fresh budget each window.
* ``redrawn_noise_on_rerun``: a re-run of the job draws new noise for a window already released
  (invariant 5 broken; the ledger still charges once, invariant 6 holds), so the adversary sees
  two releases of every window with independent noise: ``mu`` becomes ``sqrt(2) mu``.

Every run re-runs each window once (``rerun=True``): with the honest keyed noise the re-run's
release is identical to the first, which the audit verifies in passing.
"""

from __future__ import annotations

import enum
import hashlib
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting import calibrate
from renyi_stream.stream.accounting.calibration import check_accounting
from renyi_stream.stream.ledger import Ledger, Policy
from renyi_stream.stream.noise import InsecureNoiseWarning, NoiseBinding, NoiseKey, gaussian_noise

__all__ = [
    "AuditConfig",
    "AuditResult",
    "EpsilonBound",
    "Variant",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "run_audit",
]

# The adversary asks for slightly less than what is left under `drop`, so that the ledger's
# rounding up of charges (renyi_stream.stream.accounting.gaussian) never turns "everything left" into a drop.
_ASK_BELOW_REMAINING = 1.0 - 1e-7
# Under `clip` the adversary asks for more than is left and lets the filter scale it down.
_ASK_ABOVE_REMAINING = 3.0
# Candidate thresholds scanned on the selection half.
_MAX_THRESHOLDS = 4000


class Variant(str, enum.Enum):
    """The mechanism under audit: the honest one, or a deliberately broken one."""

    HONEST = "honest"
    WINDOW_SCOPED_LEDGER = "window_scoped_ledger"  # breaks invariant 1 (ledger-never-window-scoped)
    REDRAWN_NOISE_ON_RERUN = "redrawn_noise_on_rerun"  # breaks invariant 5 (release-once)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class AuditConfig:
    """One audit: the promise under test, the experiment's size and its confidence.

    Args:
        epsilon, delta: the per-user promise, calibrated with ``accounting`` and ``norm_budget``
            (``renyi_stream.stream.accounting.calibrate``); ``delta`` is also where the lower bound is taken.
        norm_budget: ``B``, the total squared norm a user may contribute.
        accounting: one of ``renyi_stream.stream.accounting.ACCOUNTINGS``; ``gdp`` is the tight one.
        policy: ``drop`` or ``clip``.
        windows: number of windows (releases before re-runs), >= 1.
        trials: runs per world (target present / absent), >= 1000; half select the threshold,
            half evaluate it.
        background_users: other users per run, with fixed data known to the adversary.
        alpha: false-alarm rate; the lower bound holds with confidence ``1 - alpha``.
        rerun: re-run every window once after its first release.
        seed: seeds the noise key (an insecure, public test key) and the background data.
    """

    epsilon: float = 1.0
    delta: float = 1e-2
    norm_budget: float = 1.0
    accounting: str = "gdp"
    policy: str = "drop"
    windows: int = 4
    trials: int = 200_000
    background_users: int = 2
    alpha: float = 1e-3
    rerun: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check.positive("epsilon", self.epsilon)
        check.probability("delta", self.delta)
        check.positive("norm_budget", self.norm_budget)
        check_accounting(self.accounting)
        if self.policy not in [p.value for p in Policy]:
            raise ValueError(f"policy must be one of {[p.value for p in Policy]}, got policy={self.policy!r}")
        _integer("windows", self.windows, minimum=1)
        _integer("trials", self.trials, minimum=1000)
        _integer("background_users", self.background_users, minimum=0)
        _integer("seed", self.seed, minimum=0)
        check.probability("alpha", self.alpha)
        if not isinstance(self.rerun, bool):
            raise ValueError(f"rerun must be a bool, got rerun={self.rerun!r}")


def _integer(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class AuditResult:
    """What an audit measured. ``epsilon_lower_bound <= claimed_epsilon`` for an honest mechanism
    with probability at least ``1 - alpha``."""

    variant: Variant
    claimed_epsilon: float
    delta: float
    mu: float  # GDP parameter of the calibration, sqrt(2 kappa)
    epsilon_lower_bound: float
    threshold: float
    fpr: float  # empirical rates on the evaluation half, test "S >= threshold" means "present"
    fnr: float
    fpr_upper: float
    fnr_upper: float
    trials: int
    alpha: float
    identical_reruns: float  # share of re-run releases bit-identical to the first release
    others_changed: float  # share of (run, window) where the others' sum differs between worlds
    scores_absent: np.ndarray = field(repr=False)
    scores_present: np.ndarray = field(repr=False)

    @property
    def caught(self) -> bool:
        """True when the audit shows, at confidence ``1 - alpha``, that the claim is broken."""
        return self.epsilon_lower_bound > self.claimed_epsilon


# --------------------------------------------------------------------------- statistics


def clopper_pearson_upper(successes: np.ndarray | int, trials: int, alpha: float) -> np.ndarray:
    """One-sided upper ``1 - alpha`` Clopper-Pearson bound on a binomial proportion.

    Clopper & Pearson 1934: the ``1 - alpha`` quantile of ``Beta(k + 1, n - k)``, and 1 when
    ``k = n``. Exact: ``P(p > bound) <= alpha`` for every true proportion ``p``.
    """
    n = _integer("trials", trials, minimum=1)
    alpha = check.probability("alpha", alpha)
    k = np.asarray(successes, dtype=np.float64)
    if np.any(k < 0) or np.any(k > n) or np.any(k != np.floor(k)):
        raise ValueError(f"successes must be integers in [0, {n}], got successes={successes!r}")
    safe_b = np.maximum(n - k, 1.0)
    return np.where(k >= n, 1.0, stats.beta.ppf(1.0 - alpha, k + 1.0, safe_b))


def _epsilon_from_rates(fpr_up: np.ndarray, fnr_up: np.ndarray, delta: float) -> np.ndarray:
    """``max(log((1-delta-FNR)/FPR), log((1-delta-FPR)/FNR))``, 0 where neither is positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log((1.0 - delta - fnr_up) / fpr_up)
        two = np.log((1.0 - delta - fpr_up) / fnr_up)
    best = np.fmax(np.nan_to_num(one, nan=0.0, posinf=0.0, neginf=0.0),
                   np.nan_to_num(two, nan=0.0, posinf=0.0, neginf=0.0))
    return np.maximum(best, 0.0)


def _rates(absent: np.ndarray, present: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """False positives (absent with S >= t) and false negatives (present with S < t), counts."""
    a, p = np.sort(absent), np.sort(present)
    fp = a.size - np.searchsorted(a, thresholds, side="left")
    fn = np.searchsorted(p, thresholds, side="left")
    return fp, fn


@dataclass(frozen=True)
class EpsilonBound:
    """A lower confidence bound on epsilon and the test it came from (evaluation half)."""

    epsilon: float
    threshold: float
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float


def epsilon_lower_bound(
    scores_absent: np.ndarray, scores_present: np.ndarray, *, delta: float, alpha: float
) -> EpsilonBound:
    """Lower confidence bound on epsilon at ``delta`` from two samples of a test statistic.

    The first half of each sample selects the threshold that maximises the bound; the second
    half evaluates it with one-sided Clopper-Pearson bounds at ``alpha / 2`` each, so the
    returned bound exceeds the true epsilon of an ``(epsilon, delta)``-DP mechanism with
    probability at most ``alpha`` (see the module docstring). Returns a record with the bound,
    the threshold and the evaluation half's rates.
    """
    delta = check.probability("delta", delta)
    alpha = check.probability("alpha", alpha)
    absent = np.asarray(scores_absent, dtype=np.float64).ravel()
    present = np.asarray(scores_present, dtype=np.float64).ravel()
    for name, sample in (("scores_absent", absent), ("scores_present", present)):
        if sample.size < 4:
            raise ValueError(f"{name} must hold at least 4 scores, got {sample.size}")
        if not np.isfinite(sample).all():
            raise ValueError(f"{name} must be finite")
    sel_a, ev_a = absent[: absent.size // 2], absent[absent.size // 2:]
    sel_p, ev_p = present[: present.size // 2], present[present.size // 2:]

    pooled = np.concatenate([sel_a, sel_p])
    candidates = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, _MAX_THRESHOLDS)))
    fp, fn = _rates(sel_a, sel_p, candidates)
    eps_sel = _epsilon_from_rates(
        clopper_pearson_upper(fp, sel_a.size, alpha / 2), clopper_pearson_upper(fn, sel_p.size, alpha / 2), delta
    )
    threshold = float(candidates[int(np.argmax(eps_sel))])

    fp_ev, fn_ev = _rates(ev_a, ev_p, np.array([threshold]))
    fpr_up = clopper_pearson_upper(fp_ev, ev_a.size, alpha / 2)
    fnr_up = clopper_pearson_upper(fn_ev, ev_p.size, alpha / 2)
    eps = float(_epsilon_from_rates(fpr_up, fnr_up, delta)[0])
    return EpsilonBound(
        epsilon=eps, threshold=threshold, fpr=float(fp_ev[0]) / ev_a.size, fnr=float(fn_ev[0]) / ev_p.size,
        fpr_upper=float(fpr_up[0]), fnr_upper=float(fnr_up[0]),
    )


# --------------------------------------------------------------------------- the experiment


class _Filter:
    """The filter under test in one world: the real Ledger, reset at every window when broken."""

    def __init__(self, *, budget: float, window_scoped: bool) -> None:
        self._budget = budget
        self._window_scoped = window_scoped
        self.ledger = Ledger(budget=budget)

    def start_window(self) -> None:
        if self._window_scoped:
            self.ledger = Ledger(budget=self._budget)  # the bug: Beam state scoped per window


@dataclass(frozen=True)
class _World:
    scores: np.ndarray  # the adversary's statistic, one per run
    others: np.ndarray  # (windows, runs) sum the other users contributed to each release
    identical_reruns: float  # share of re-run releases bit-identical to the first release


def _request(left: np.ndarray, residual: np.ndarray, *, last: bool, noise_std: float, policy: Policy) -> np.ndarray:
    """The adversary's contribution for the target: everything the filter still admits after a
    positive release (and at the last window), half of it otherwise."""
    everything = np.ones_like(left, dtype=bool) if last else residual > 0
    share = np.where(everything, 1.0, 0.5)
    ask_all = _ASK_ABOVE_REMAINING if policy is Policy.CLIP else _ASK_BELOW_REMAINING
    factor = np.where(everything, ask_all, _ASK_BELOW_REMAINING)
    return np.sqrt(2.0 * noise_std**2 * share * left) * factor


def _world(config: AuditConfig, variant: Variant, *, present: bool, key: NoiseBinding, rho: float,
           noise_std: float, known_others: np.ndarray | None) -> _World:
    """``config.trials`` independent interactions in one world (target present or absent).

    ``known_others`` is the adversary's knowledge of the other users' sums per window (computed
    in world 0 from their fixed data); ``None`` in world 0 itself, which then uses its own.
    """
    n, m, s = config.trials, config.background_users, noise_std
    policy = Policy(config.policy)
    scoped = variant is Variant.WINDOW_SCOPED_LEDGER
    real = _Filter(budget=rho, window_scoped=scoped)  # the mechanism: target (if present) + others
    shadow = _Filter(budget=rho, window_scoped=scoped)  # the adversary's replay: the target alone
    target_ids = np.arange(n, dtype=np.int64)
    other_ids = n + np.arange(n * m, dtype=np.int64)
    other_data = np.random.default_rng([config.seed, 1])  # same in both worlds, known to the adversary
    query = "audit/present" if present else "audit/absent"  # independent keyed noise per world
    scores, residual = np.zeros(n), np.zeros(n)
    others_released = np.zeros((config.windows, n))
    identical: list[float] = []
    for t in range(config.windows):
        real.start_window()
        shadow.start_window()
        # The adversary's request depends on the releases seen so far (adaptive) and on what its
        # own replay of the filter says is left: only public outputs and the target's own data.
        request = _request(shadow.ledger.remaining(target_ids), residual,
                           last=t == config.windows - 1, noise_std=s, policy=policy)
        c = shadow.ledger.admit(target_ids, request, noise_std=s, policy=policy).contributions[:, 0]

        values = other_data.uniform(0.0, math.sqrt(config.norm_budget) / 2.0, size=n * m)
        ids, rows = (np.concatenate([target_ids, other_ids]), np.concatenate([request, values])) if present \
            else (other_ids, values)
        charged = real.ledger.admit(ids, rows, noise_std=s, policy=policy).contributions[:, 0]
        target = charged[:n] if present else np.zeros(n)
        others = charged[n:] if present else charged
        others = others.reshape(n, m).sum(axis=1) if m else np.zeros(n)
        others_released[t] = others
        known = others if known_others is None else known_others[t]

        first = others + target + gaussian_noise(key, query_id=query, window_id=t, dim=n, noise_std=s)
        residual = first - known
        scores += (c * residual - 0.5 * c * c) / (s * s)
        if config.rerun:
            # A re-run of window t releases the same sum again and charges nobody again
            # (invariant 6). Honest noise is keyed by (query, window): the same draw.
            rerun_query = f"{query}/rerun" if variant is Variant.REDRAWN_NOISE_ON_RERUN else query
            second = others + target + gaussian_noise(key, query_id=rerun_query, window_id=t, dim=n, noise_std=s)
            same = second == first
            identical.append(float(same.mean()))
            scores += np.where(same, 0.0, (c * (second - known) - 0.5 * c * c) / (s * s))
    return _World(scores=scores, others=others_released,
                  identical_reruns=float(np.mean(identical)) if identical else float("nan"))


def run_audit(config: AuditConfig = AuditConfig(), variant: Variant | str = Variant.HONEST) -> AuditResult:
    """Audit ``variant`` of the filtered Gaussian releases against ``config``'s promise.

    Calibrates ``(epsilon, delta)`` with ``config.accounting``, runs ``config.trials``
    interactions per world with the adaptive adversary of the module docstring, and returns the
    Clopper-Pearson lower bound on epsilon at ``delta`` (false-alarm rate ``config.alpha``).
    Deterministic in ``config.seed``.
    """
    if not isinstance(config, AuditConfig):
        raise ValueError(f"config must be an AuditConfig, got {type(config).__name__}")
    try:
        variant = Variant(variant)
    except ValueError:
        raise ValueError(f"variant must be one of {[v.value for v in Variant]}, got variant={variant!r}") from None
    cal = calibrate(epsilon=config.epsilon, delta=config.delta, norm_budget=config.norm_budget,
                    accounting=config.accounting)
    with warnings.catch_warnings():
        # A public test key on purpose: the audit must be reproducible, and it publishes nothing.
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        # One audited ledger, its id as reproducible as the key (a public hash of the seed).
        ledger_id = hashlib.sha256(f"renyi-stream/audit-ledger/{int(config.seed)}".encode()).hexdigest()[:32]
        key = NoiseBinding(NoiseKey.insecure_for_tests(config.seed), ledger_id)
    absent = _world(config, variant, present=False, key=key, rho=cal.rho, noise_std=cal.noise_std,
                    known_others=None)
    present = _world(config, variant, present=True, key=key, rho=cal.rho, noise_std=cal.noise_std,
                     known_others=absent.others)
    bound = epsilon_lower_bound(absent.scores, present.scores, delta=config.delta, alpha=config.alpha)
    return AuditResult(
        variant=variant, claimed_epsilon=config.epsilon, delta=config.delta, mu=cal.mu,
        epsilon_lower_bound=bound.epsilon, threshold=bound.threshold, fpr=bound.fpr, fnr=bound.fnr,
        fpr_upper=bound.fpr_upper, fnr_upper=bound.fnr_upper, trials=config.trials, alpha=config.alpha,
        identical_reruns=float(np.mean([absent.identical_reruns, present.identical_reruns])),
        others_changed=float(np.mean(absent.others != present.others)),
        scores_absent=absent.scores, scores_present=present.scores,
    )
