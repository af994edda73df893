"""Planning a ledger before its first day: how many windows a user lasts, and clamps that keep
a chosen share of users in (``renyi-stream plan``, docs/calibration.md, "Planning before the first day").

Everything here counts exactly what the daily job charges. A window's default sums concatenate,
per bounded number column of the declared contract, the value clamped to ``[lo, hi]``
(:mod:`renyi_stream.queries.linear`, ``clamp``), in the order the job's query plan answers them
(by query id; callers pass :class:`ColumnBound` s in that order, as
``renyi_stream.pipelines.cli.plan.charged_bounds`` reads it from the plan); the user is charged ``gaussian_charge`` of that row, ``||v||^2 / (2 s^2)`` rounded
up (:mod:`renyi_stream.stream.accounting.gaussian`), against the budget ``kappa = rho`` of
:func:`renyi_stream.stream.accounting.calibrate`. The filter (:func:`renyi_stream.stream.ledger.individual_filter`)
admits a row while ``round_up(used + charge) <= cap`` with ``cap`` a hair below ``kappa``
(``BUDGET_SAFETY``) and records the rounded-up sum as the new used budget. For a user who gives
the same row every window that recurrence is replayed here float for float
(:func:`windows_lasted`): the count is the ledger's, not ``floor(kappa / charge)``, which it
matches except at the last ulp.

Since every step of the recurrence is monotone, a user lasts at least ``w`` windows exactly when
their charge is at most :func:`charge_threshold` ``(w)``: the share of a sample still in after
``w`` windows is one comparison per user, vectorised (no per-user or per-day loop), and a clamp
suggestion is a bisection over one level at which every declared bound is capped
(:func:`suggest_clamps`).

Worst-case accounting charges everyone the bound ``C^2 = sum_c max(|lo_c|, |hi_c|)^2`` every
window, so everyone lasts ``floor(B / C^2)`` windows whatever they give (exact rational
arithmetic, :func:`worst_case_windows`).

Pure functions and frozen dataclasses over NumPy arrays; no Beam, no files. Sample-derived
results (:class:`SampleShares`, :class:`ClampSuggestion`) are exact counts of private data:
curator only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from renyi_stream.stream.accounting.calibration import Calibration, calibrate
from renyi_stream.stream.accounting.gaussian import gaussian_charge, squared_norms
from renyi_stream.stream.ledger import BUDGET_SAFETY
from renyi_stream.stream.rounding import TINIEST, round_up

__all__ = [
    "CHECKPOINTS", "DEFAULT_KEEP", "MAX_DAYS", "MAX_EXACT_WINDOWS", "SUGGESTION_DIGITS", "ClampSuggestion",
    "ColumnBound", "Plan", "Sample", "SampleShares", "UserPlan", "capped", "charge_threshold", "checkpoints", "clamped",
    "filter_cap", "make_plan", "sample_shares", "sq_norm_at_bounds", "suggest_clamps", "user_charges", "user_plan",
    "windows_lasted", "worst_case_windows",
]

#: Days after which the share of a sample's users still in is shown (those within the horizon,
#: and the horizon itself).
CHECKPOINTS = (7, 30, 90)
#: The longest horizon a plan takes: a century of daily windows.
MAX_DAYS = 36_500
#: The most windows :func:`windows_lasted` replays; a user who lasts longer is reported as such.
MAX_EXACT_WINDOWS = 1 << 20
#: The share of users a clamp suggestion keeps in through the horizon, unless told otherwise.
DEFAULT_KEEP = 0.9
#: Significant digits of a suggested bound (rounded toward zero, so it keeps at least the share).
SUGGESTION_DIGITS = 3

# The ledger's rounding, as Python floats (the same IEEE binary64 operations as NumPy's):
# round_up(v) is ``v * _UP + TINIEST`` and round_up(1.0) is exactly ``_UP``.
_UP = float(round_up(1.0))


@dataclass(frozen=True)
class ColumnBound:
    """One default sum's clamp: column ``name`` clamped to ``[lo, hi]`` (finite, ``lo < hi``)."""

    name: str
    lo: float
    hi: float

    def __post_init__(self) -> None:
        lo, hi = float(self.lo), float(self.hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"column {self.name!r} needs finite lo < hi, got lo={self.lo!r}, hi={self.hi!r}")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def magnitude(self) -> float:
        """The largest ``|value|`` the clamp lets through: ``max(|lo|, |hi|)``."""
        return max(abs(self.lo), abs(self.hi))

    def flag(self) -> str:
        """``--column NAME=LO:HI``, the numbers written so that they parse back to these floats."""
        return f"--column {self.name}={_number(self.lo)}:{_number(self.hi)}"


def filter_cap(rho: float) -> float:
    """The used budget the ledger lets a user reach: ``kappa * (1 - BUDGET_SAFETY)``, one float
    below (:class:`renyi_stream.stream.ledger.Ledger`'s cap, computed the same way)."""
    return float(np.nextafter(float(rho) * (1.0 - BUDGET_SAFETY), 0.0))


def sq_norm_at_bounds(bounds: Sequence[ColumnBound]) -> float:
    """``C^2``: the squared norm of a user at the bounds (each column at ``max(|lo|, |hi|)``), as
    the ledger computes it."""
    return float(squared_norms(np.array([[b.magnitude for b in bounds]], dtype=np.float64))[0])


def worst_case_windows(norm_budget: float, sq_norm: float) -> int:
    """``floor(B / C^2)``, exactly (rational arithmetic on the two floats): the windows everyone
    lasts when every user is charged the bound ``C^2`` every window."""
    if not (math.isfinite(norm_budget) and norm_budget > 0):
        raise ValueError(f"norm_budget must be a finite number > 0, got norm_budget={norm_budget!r}")
    if not (math.isfinite(sq_norm) and sq_norm > 0):
        raise ValueError(f"sq_norm must be a finite number > 0, got sq_norm={sq_norm!r}")
    return math.floor(Fraction(norm_budget) / Fraction(sq_norm))


def clamped(values: Any, bounds: Sequence[ColumnBound]) -> np.ndarray:
    """``values`` (``(n, d)``, columns in ``bounds``' order) clamped column by column, as each
    default sum clamps its column (``np.clip`` to ``[lo, hi]``)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(bounds):
        raise ValueError(f"values must be (n, {len(bounds)}), one column per bound, got shape={x.shape}")
    return np.clip(x, np.array([b.lo for b in bounds]), np.array([b.hi for b in bounds]))


def windows_lasted(charge: float, cap: float, *, limit: int = MAX_EXACT_WINDOWS) -> int | None:
    """How many windows in a row the filter admits a user charged ``charge`` (zCDP, as the ledger
    computes it) in each, with the ledger's cap ``cap`` (:func:`filter_cap`): its rule replayed
    float for float (``total = round_up(used + charge)``; admitted while ``total <= cap``, then
    ``used = total``). ``None`` when the user is never filtered in ``limit`` windows (a charge of
    0 is never filtered at all). Under ``clip`` the next window is the one clipped; this counts
    whole windows."""
    charge, cap = float(charge), float(cap)
    if not (charge >= 0.0 and cap > 0.0):
        raise ValueError(f"charge must be >= 0 and cap > 0, got charge={charge!r}, cap={cap!r}")
    if charge == 0.0:
        return None
    if charge * limit * (1.0 + 1e-6) + 4.0 * limit * TINIEST < cap:  # surely beyond the limit (rounding < 1e-8)
        return None
    used, n = 0.0, 0
    while n < limit:
        total = (used + charge) * _UP + TINIEST
        if not total <= cap:
            return n
        used, n = total, n + 1
    return None


def _lasts(charge: float, cap: float, windows: int) -> bool:
    lasted = windows_lasted(charge, cap, limit=windows)
    return lasted is None or lasted >= windows


def charge_threshold(windows: int, cap: float) -> float:
    """The largest charge (a float) with which a user lasts at least ``windows`` windows: the
    filter's recurrence is monotone in the charge, so a user lasts that long exactly when their
    charge is at most this. A bisection over the floats in ``[0, cap]``, from a bracket around
    ``cap / windows``."""
    if not (isinstance(windows, (int, np.integer)) and 1 <= windows <= MAX_EXACT_WINDOWS):
        raise ValueError(f"windows must be an integer in [1, {MAX_EXACT_WINDOWS}], got windows={windows!r}")
    windows = int(windows)
    guess = cap / windows
    lo, hi = guess * (1.0 - 1e-6), guess * (1.0 + 1e-6)
    if not (_lasts(lo, cap, windows) and not _lasts(hi, cap, windows)):
        lo, hi = 0.0, cap  # the bracket missed (it never does for sane inputs): search everything
    a, b = _bits(lo), _bits(hi)  # lasts at a, not at b; positive floats order as their bit patterns
    while b - a > 1:
        mid = (a + b) // 2
        if _lasts(_float(mid), cap, windows):
            a = mid
        else:
            b = mid
    return _float(a)


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


def _float(bits: int) -> float:
    return float(np.int64(bits).view(np.float64))


# --------------------------------------------------------------------------- a plan from the contract


@dataclass(frozen=True)
class UserPlan:
    """One user who gives the same row every window: its clamped values (in the bounds' order),
    squared norm, charge per window (zCDP) and the windows they last under individual accounting
    (``None``: more than :data:`MAX_EXACT_WINDOWS`, or never when the charge is 0) and under
    worst-case accounting."""

    label: str
    values: tuple[float, ...]
    sq_norm: float
    charge: float
    individual: int | None
    worst_case: int


@dataclass(frozen=True)
class Plan:
    """What a contract and a promise give before the first day (no data read: public).

    ``noise_std`` is the noise per coordinate of every window (the calibration's), ``sq_norm_bound``
    ``C^2``, ``worst_case`` ``floor(B / C^2)``, ``worst_case_noise_std`` the noise worst-case
    accounting needs to answer all ``days`` windows with everyone in (``B = days * C^2``)."""

    calibration: Calibration
    days: int
    bounds: tuple[ColumnBound, ...]
    cap: float
    sq_norm_bound: float
    worst_case: int
    worst_case_noise_std: float
    at_bounds: UserPlan
    typical: tuple[UserPlan, ...] = ()

    @property
    def noise_std(self) -> float:
        return self.calibration.noise_std


def user_plan(label: str, values: Sequence[float], bounds: Sequence[ColumnBound], calibration: Calibration,
              worst_case: int) -> UserPlan:
    """The :class:`UserPlan` of a user giving ``values`` (in ``bounds``' order, clamped as the
    default sums clamp them) every window."""
    row = clamped(np.asarray([values], dtype=np.float64), bounds)
    charge = float(gaussian_charge(contributions=row, noise_std=calibration.noise_std)[0])
    return UserPlan(label=label, values=tuple(float(v) for v in row[0]), sq_norm=float(squared_norms(row)[0]),
                    charge=charge, individual=windows_lasted(charge, filter_cap(calibration.rho)),
                    worst_case=worst_case)


def make_plan(calibration: Calibration, bounds: Sequence[ColumnBound], days: int,
              typical: Sequence[tuple[str, Sequence[float]]] = ()) -> Plan:
    """The plan of ``bounds`` (the default sums, in the order the job charges them) under
    ``calibration`` over ``days`` windows, with the users at the bounds and ``typical`` ones
    (``(label, values)``)."""
    bounds = tuple(bounds)
    if not bounds:
        raise ValueError("a plan needs at least one bounded column (a default sum)")
    _check_days(days)
    c2 = sq_norm_at_bounds(bounds)
    worst = worst_case_windows(calibration.norm_budget, c2)
    worst_std = calibrate(epsilon=calibration.epsilon, delta=calibration.delta, norm_budget=days * c2,
                          accounting=calibration.accounting).noise_std
    at_bounds = user_plan("at the bounds", [b.magnitude if b.hi >= -b.lo else -b.magnitude for b in bounds],
                          bounds, calibration, worst)
    return Plan(calibration=calibration, days=int(days), bounds=bounds, cap=filter_cap(calibration.rho),
                sq_norm_bound=c2, worst_case=worst, worst_case_noise_std=worst_std, at_bounds=at_bounds,
                typical=tuple(user_plan(label, values, bounds, calibration, worst) for label, values in typical))


def _check_days(days: Any) -> int:
    if isinstance(days, bool) or not isinstance(days, (int, np.integer)) or not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be an integer in [1, {MAX_DAYS}], got days={days!r}")
    return int(days)


def checkpoints(days: int) -> tuple[int, ...]:
    """The days a sample's share is shown after: :data:`CHECKPOINTS` within ``days``, and ``days``."""
    days = _check_days(days)
    return tuple(sorted({d for d in CHECKPOINTS if d <= days} | {days}))


# --------------------------------------------------------------------------- a sample day


@dataclass(frozen=True, eq=False)
class Sample:
    """A sample of users' rows, reduced to what a plan needs (private: exact data).

    ``values``: ``(rows, d)`` float64, one row per distinct (user, window), the bounded columns
    unclamped, in the bounds' order; ``user_index``: ``(rows,)`` each row's user, ``0..users-1``;
    ``days``: the distinct windows the sample holds. ``rows_read`` and ``rejected`` count the
    file's rows and its dead letters (bad rows, repeated (user, window) pairs)."""

    values: np.ndarray
    user_index: np.ndarray
    users: int
    days: int
    rows_read: int = 0
    rejected: int = 0
    names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=np.float64)
        index = np.asarray(self.user_index, dtype=np.int64)
        if values.ndim != 2 or index.shape != (values.shape[0],):
            raise ValueError(f"values must be (rows, d) and user_index (rows,), got {values.shape}, {index.shape}")
        if not np.isfinite(values).all():
            raise ValueError("values must be finite (validate the rows first)")
        if index.size and (index.min() < 0 or index.max() >= self.users):
            raise ValueError(f"user_index must be in [0, {self.users}), got [{index.min()}, {index.max()}]")
        if self.days < (1 if index.size else 0):
            raise ValueError(f"days must be >= 1 for a sample with rows, got days={self.days!r}")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "user_index", index)

    @classmethod
    def from_rows(cls, user_codes: Any, window_ids: Any, values: Any, *, rows_read: int | None = None,
                  rejected: int = 0, names: Sequence[str] = ()) -> "Sample":
        """A sample from validated rows: ``user_codes`` (``(n,)`` integers, one per user: ids or
        dictionary codes), ``window_ids`` (``(n,)``) and ``values`` (``(n, d)``). A repeated
        (user, window) pair keeps its first row, as the job does; the later ones count as rejected."""
        users = np.asarray(user_codes).astype(np.int64, copy=False).ravel()
        windows = np.asarray(window_ids).astype(np.int64, copy=False).ravel()
        x = np.asarray(values, dtype=np.float64)
        x = x if x.ndim == 2 else x.reshape(users.size, -1)
        if windows.shape != users.shape:
            raise ValueError(f"user_codes and window_ids must have the same length, got {users.size}, {windows.size}")
        user_of, user_index = np.unique(users, return_inverse=True)
        window_of, window_index = np.unique(windows, return_inverse=True)
        pair = user_index.astype(np.int64) * max(window_of.size, 1) + window_index
        _, first = np.unique(pair, return_index=True)
        first.sort()
        return cls(values=x[first], user_index=user_index[first], users=int(user_of.size), days=int(window_of.size),
                   rows_read=int(users.size if rows_read is None else rows_read),
                   rejected=int(rejected) + int(users.size - first.size), names=tuple(names))


def user_charges(sample: Sample, bounds: Sequence[ColumnBound], noise_std: float) -> np.ndarray:
    """Each of the sample's users' charge per window (zCDP), if every day looked like the sample:
    with one day, exactly what the job charges for their row (``gaussian_charge`` of the clamped
    row); with several, the charge of their mean squared norm per day (a day without their row
    counts as 0)."""
    if sample.values.shape[1] != len(bounds):
        raise ValueError(f"the sample has {sample.values.shape[1]} columns, the bounds {len(bounds)}")
    rows = clamped(sample.values, bounds)
    if sample.days <= 1:
        charges = np.zeros(sample.users)
        charges[sample.user_index] = gaussian_charge(contributions=rows, noise_std=noise_std)
        return charges
    mean_sq = np.bincount(sample.user_index, weights=squared_norms(rows), minlength=sample.users) / sample.days
    return gaussian_charge(contributions=np.sqrt(mean_sq)[:, None], noise_std=noise_std)


@dataclass(frozen=True)
class SampleShares:
    """After each of ``days`` windows, how many of the sample's ``users`` are still in
    (``still_in[k]`` after ``days[k]``) if every day looked like the sample. Curator only."""

    users: int
    days: tuple[int, ...]
    still_in: tuple[int, ...]

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(n / self.users if self.users else math.nan for n in self.still_in)


def sample_shares(sample: Sample, bounds: Sequence[ColumnBound], calibration: Calibration,
                  days: Sequence[int]) -> SampleShares:
    """:class:`SampleShares` after each of ``days``: one threshold per day
    (:func:`charge_threshold`), one comparison per user."""
    charges = user_charges(sample, bounds, calibration.noise_std)
    cap = filter_cap(calibration.rho)
    days = tuple(_check_days(d) for d in days)
    return SampleShares(users=sample.users, days=days,
                        still_in=tuple(int(np.count_nonzero(charges <= charge_threshold(d, cap))) for d in days))


@dataclass(frozen=True)
class ClampSuggestion:
    """Clamps under which at least ``keep`` of the sample's users last ``days`` windows: every
    declared bound capped at one level ``level`` in absolute value (``[max(lo, -level), min(hi,
    level)]``; a column whose declared range lies within it is kept as declared), ``level``
    rounded toward zero to :data:`SUGGESTION_DIGITS` digits. ``level`` is None when the declared
    bounds already keep that share (``bounds`` are then the declared ones). ``kept``: the users
    who last with ``bounds``, ``declared_kept`` with the declared ones; ``clipped[c]``: the share
    of the sample's values of column ``c`` the clamp changes (``declared_clipped``: the declared
    clamp's). ``bounds`` is empty when no level keeps that share (a bound away from zero, as
    ``[1, 5]``, sets a floor on every user's charge). Curator only: computed from private data."""

    keep: float
    days: int
    users: int
    level: float | None
    bounds: tuple[ColumnBound, ...]
    kept: int
    declared_kept: int
    clipped: tuple[float, ...] = ()
    declared_clipped: tuple[float, ...] = ()

    @property
    def found(self) -> bool:
        return bool(self.bounds)

    def flags(self) -> str:
        return " ".join(b.flag() for b in self.bounds)


def capped(bounds: Sequence[ColumnBound], level: float) -> tuple[ColumnBound, ...]:
    """Every bound's ends capped at ``level`` in absolute value; ValueError when that closes a range."""
    return tuple(ColumnBound(b.name, max(b.lo, -level), min(b.hi, level)) for b in bounds)


def suggest_clamps(sample: Sample, bounds: Sequence[ColumnBound], calibration: Calibration, *, days: int,
                   keep: float = DEFAULT_KEEP) -> ClampSuggestion:
    """The highest common level at which capping the declared ``bounds`` keeps at least ``keep``
    of the sample's users in for ``days`` windows (docs/calibration.md says why one level rather
    than a scale factor or per-column quantiles). The share kept only grows as the level falls, so
    a bisection finds it; the level is rounded toward zero and the share recomputed with it."""
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be a share in (0, 1], got keep={keep!r}")
    days = _check_days(days)
    bounds = tuple(bounds)
    threshold = charge_threshold(days, filter_cap(calibration.rho))
    need = math.ceil(keep * sample.users - 1e-9)

    def kept(with_bounds: Sequence[ColumnBound]) -> int:
        return int(np.count_nonzero(user_charges(sample, with_bounds, calibration.noise_std) <= threshold))

    declared = kept(bounds)
    declared_clipped = _clipped_shares(sample, bounds)
    if declared >= need:
        return ClampSuggestion(keep=keep, days=days, users=sample.users, level=None, bounds=bounds, kept=declared,
                               declared_kept=declared, clipped=declared_clipped, declared_clipped=declared_clipped)
    # A bound away from zero ([1, 5]) closes at the level 1: at and below it there is no range.
    floor = max([b.lo for b in bounds if b.lo > 0] + [-b.hi for b in bounds if b.hi < 0] + [0.0])
    low, high, good = floor, max(b.magnitude for b in bounds), None  # kept(high) < need
    for _ in range(200):  # to a relative 1e-6 of the level (the suggestion keeps 3 digits)
        mid = (low + high) / 2
        if not low < mid < high or high - low <= 1e-6 * high:
            break
        if kept(capped(bounds, mid)) >= need:
            low = good = mid
        else:
            high = mid
    level = None if good is None else _toward_zero(good)
    if level is None or level <= floor or kept(capped(bounds, level)) < need:
        return ClampSuggestion(keep=keep, days=days, users=sample.users, level=None, bounds=(), kept=0,
                               declared_kept=declared, declared_clipped=declared_clipped)
    suggested = capped(bounds, level)
    return ClampSuggestion(keep=keep, days=days, users=sample.users, level=level, bounds=suggested,
                           kept=kept(suggested), declared_kept=declared, clipped=_clipped_shares(sample, suggested),
                           declared_clipped=declared_clipped)


def _toward_zero(x: float, digits: int = SUGGESTION_DIGITS) -> float:
    """``x`` rounded toward zero to ``digits`` significant digits, as the float its decimal text
    parses to (so that the printed flag gives back this very number)."""
    if x == 0.0:
        return 0.0
    d = Decimal(abs(x))
    quantum = Decimal(1).scaleb(d.adjusted() - digits + 1)
    # The decimal is at most |x|, and |x| is a float, so the float nearest the decimal is too.
    return math.copysign(float(d.quantize(quantum, rounding=ROUND_FLOOR)), x)


def _clipped_shares(sample: Sample, bounds: Sequence[ColumnBound]) -> tuple[float, ...]:
    """Per column, the share of the sample's values the clamp changes."""
    if not sample.values.shape[0]:
        return tuple(0.0 for _ in bounds)
    x = sample.values
    return tuple(float(np.mean((x[:, j] < b.lo) | (x[:, j] > b.hi))) for j, b in enumerate(bounds))


def _number(x: float) -> str:
    """The shortest text that parses back to ``x`` (``20`` for 20.0)."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text
