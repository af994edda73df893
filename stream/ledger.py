"""The individual filter, vectorised: per-user used budget and the decision for each contribution.

``Ledger.admit`` is Feldman & Zrnic's Algorithm 3 (policy ``drop``) and the clipping step of
their Algorithm 7 (policy ``clip``) for one window of one query (or of several queries whose
per-user vectors are concatenated into one row):

* every row is one user's contribution ``q_t(x_i)`` (``d`` numbers) to a Gaussian release with
  per-coordinate noise std ``s``; its charge is ``rho_t(i) = ||q_t(x_i)||^2 / (2 s^2)`` (zCDP);
* a user with ``used(i) + rho_t(i) <= kappa`` is *admitted* and charged ``rho_t(i)``;
* otherwise, under ``drop`` the row contributes nothing and is charged nothing; under ``clip``
  it is scaled to norm ``sqrt(2 s^2 (kappa - used(i)))`` and charged the rest of the budget.

The decision for a row reads only that user's used budget, that row, ``s`` and ``kappa``: never
another user's data, nor how many users are active (Theorem 4.5's proof needs exactly this).
The result is ``kappa``-zCDP for every user over any number of windows and adaptively chosen
queries (Theorem 4.5, Remark 4.4), and ``sqrt(2 kappa)``-GDP (Smith & Thakurta 2022).

Floating point: charges are rounded up (``renyi_stream.stream.accounting.gaussian``), running sums are
rounded up (``renyi_stream.stream.rounding``), and the filter compares against ``kappa * (1 - 1e-9)``: the stored used
budget is an upper bound on the exact sum of the stored charges, and summing those charges in
any order, in float64, for up to a million windows, stays below ``kappa``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting.calibration import epsilon_for_budget
from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.accounting.odometers import tracker_step_for, tracker_update
from renyi_stream.stream.id_index import Int64Index, StringCodes
from renyi_stream.stream.rounding import round_down, round_up
from renyi_stream.stream.xp import array_module

ADMITTED, CLIPPED, DROPPED = 0, 1, 2
STATUS_NAMES: tuple[str, ...] = ("admitted", "clipped", "dropped")

# Headroom below kappa so that re-summing up to 1e6 stored charges in any order cannot exceed
# kappa (float64 summation error <= n * 2^-53 relative).
BUDGET_SAFETY = 1e-9
# A clipped row is scaled a hair below the remaining budget, so its true charge (computed
# anew from the scaled row) is below what the ledger records for it.
_CLIP_SHRINK = 1.0 - 1e-9
SNAPSHOT_VERSION = 1
# Noise stds whose 2 s^2 is a normal float64 with room to spare: outside this range the charge
# ||q||^2 / (2 s^2) divides by zero or by infinity (and would be recorded as 0 or NaN).
_MIN_NOISE_STD = 1e-150
_MAX_NOISE_STD = 1e150


class Policy(str, enum.Enum):
    """What the filter does with a contribution that would exceed the user's budget."""

    DROP = "drop"  # Feldman & Zrnic Algorithm 3: leave the row out, charge nothing
    CLIP = "clip"  # Feldman & Zrnic Algorithm 7: scale the row to use exactly what is left


def _policy(policy: Policy | str) -> Policy:
    try:
        return Policy(policy)
    except ValueError:
        raise ValueError(
            f"policy must be one of {[p.value for p in Policy]}, got policy={policy!r}"
        ) from None


@dataclass(frozen=True)
class FilterDecision:
    """Per-row outcome of :func:`individual_filter` (arrays on the input's device)."""

    new_used: Any  # used budget after the row, zCDP
    charge: Any  # what the row is charged, zCDP (0 for dropped rows)
    scale: Any  # factor applied to the row: 1 admitted, in (0, 1) clipped, 0 dropped
    status: Any  # int8: ADMITTED, CLIPPED or DROPPED


def individual_filter(used: Any, charge: Any, *, cap: float, policy: Policy | str) -> FilterDecision:
    """The filter's decision for rows of distinct users, as pure array arithmetic (NumPy or CuPy).

    ``used`` and ``charge`` are the users' used budgets and the rows' charges (zCDP, charges
    already rounded up); ``cap`` the budget the sums may reach. Guarantees, for every row:
    ``new_used <= cap``, ``new_used >= used + charge_recorded`` exactly (rounded up), and the
    row's true charge after scaling is at most the recorded charge.
    """
    xp = array_module(used, charge)
    policy = _policy(policy)
    total = round_up(used + charge)
    free = charge == 0.0  # a free row is always admitted and leaves the used budget as it was
    fits = (total <= cap) | free
    take = ~free & fits
    if policy is Policy.DROP:
        return FilterDecision(
            new_used=xp.where(take, total, used),
            charge=xp.where(fits, charge, 0.0),
            scale=fits.astype(xp.float64),
            status=xp.where(fits, ADMITTED, DROPPED).astype(xp.int8),
        )
    remaining = xp.maximum(round_down(cap - used), 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # Capped at 1: a row that only failed to fit by rounding is kept whole and charged
        # the (larger) remaining budget.
        factor = xp.minimum(xp.sqrt(remaining / charge), 1.0) * _CLIP_SHRINK
    clipped = ~fits & (factor > 0)
    status = xp.where(fits, ADMITTED, xp.where(clipped, CLIPPED, DROPPED)).astype(xp.int8)
    # used + remaining <= cap exactly, so rounding it up cannot pass cap (cap is a float).
    filled = xp.minimum(round_up(used + remaining), cap)
    return FilterDecision(
        new_used=xp.where(take, total, xp.where(clipped, filled, used)),
        charge=xp.where(fits, charge, xp.where(clipped, remaining, 0.0)),
        scale=xp.where(fits, 1.0, xp.where(clipped, factor, 0.0)),
        status=status,
    )


# Relative margin added to every charge: covers the float error of the terms (module docstring).
ETA = 1e-9
# Absolute margin added to every charge of a non-zero contribution: below the smallest normal
# float a relative margin underflows, while each subnormal operation still errs by up to 2^-1074
# absolute (found by the property test: contributions of 1.7e-159 whose squares are subnormal).
TINY = float(np.finfo(np.float64).tiny)


# --------------------------------------------------------------------------- prepaid charges
# Running totals under prepaid admission (renyi_stream.stream.continual.prepaid; docs/running_totals.md) charge
# each admitted contribution its whole future cost, ``lambda^2 quadratic + 2 lambda cross``. The
# terms are computed by the strategy's rule; the charge, its rounding and the filter decision on
# it are the ledger's, here, so that one decision covers a user's window vectors and prepaid
# terms together (:meth:`Ledger.admit` with ``prepaid=``).


@dataclass(frozen=True)
class ChargeTerms:
    """The prepaid charge ``Delta(lambda) = lambda^2 quadratic + 2 lambda cross`` of each row,
    scaled by ``lambda`` (norm units, ``(n,)`` arrays on the rows' device).

    ``quadratic = ||x||^2 sum_r C_{r,t}^2 >= 0``; ``cross = sum_r C_{r,t} <(C h)_r, x>``;
    ``magnitude`` the same two terms over absolute values (``quadratic + 2 |cross|``-like, an
    upper bound for the float error of both divided by ``ETA``).
    """

    quadratic: Any
    cross: Any
    magnitude: Any


def prepaid_charge(terms: ChargeTerms) -> Any:
    """Each row's prepaid charge in norm units (``||.||^2``, divide by ``2 s^2`` for zCDP):
    ``max(quadratic + 2 cross + ETA * magnitude + TINY, 0)`` (``TINY``, the smallest normal
    float, only for a non-zero contribution), never below the exact ``Delta``; ``inf``
    where the terms overflow. No host traffic."""
    xp = array_module(terms.quadratic, terms.cross, terms.magnitude)
    with np.errstate(over="ignore", invalid="ignore"):
        raw = terms.quadratic + 2.0 * terms.cross + ETA * terms.magnitude + xp.where(terms.magnitude > 0, TINY, 0.0)
        finite = xp.isfinite(raw) & xp.isfinite(terms.magnitude)
    return xp.where(finite, xp.maximum(raw, 0.0), xp.inf)


def prepaid_rho(terms: ChargeTerms, *, noise_std: float) -> Any:
    """Each row's prepaid charge in zCDP, ``prepaid_charge / (2 s^2)`` rounded up (0 stays 0)."""
    noise_std = check.positive("noise_std", noise_std)
    xp = array_module(terms.quadratic)
    charge = prepaid_charge(terms)
    with np.errstate(over="ignore"):
        return xp.where(charge == 0.0, 0.0, round_up(charge / (2.0 * noise_std * noise_std)))


def prepaid_filter(used: Any, terms: ChargeTerms, *, cap: float, noise_std: float,
                   policy: Policy | str = Policy.DROP) -> FilterDecision:
    """The individual filter on prepaid charges (zCDP), as :func:`renyi_stream.stream.ledger.individual_filter`.

    ``used`` the users' used budgets, ``terms`` their rows' :class:`ChargeTerms`, ``cap`` the
    budget the sums may reach (the ledger's ``kappa * (1 - BUDGET_SAFETY)``), ``s = noise_std``.

    * ``drop`` (Algorithm 3): :func:`renyi_stream.stream.ledger.individual_filter` on :func:`prepaid_rho`.
    * ``clip`` (Algorithm 7): a row that does not fit is scaled by the largest ``lambda`` in
      ``[0, 1)`` whose rounded-up charge ``lambda^2 A + 2 lambda B`` fits the remaining budget (a
      quadratic, not ``lambda^2`` times the charge as for a window sum: the cross term is linear
      in ``lambda``), shrunk by ``1 - 1e-9``, and charged the whole remaining budget; where the
      recomputed charge would still not fit (never seen) the row is dropped instead.

    The decision for a row reads only that row's terms, that user's used budget and public
    constants (Theorem 4.5's proof needs exactly this). Guarantees per row: ``new_used <= cap``;
    the recorded charge is at least the exact prepaid charge of the scaled contribution. No host
    traffic.
    """
    noise_std = check.positive("noise_std", noise_std)
    try:
        policy = Policy(policy)
    except ValueError:
        raise ValueError(f"policy must be one of {[p.value for p in Policy]}, got policy={policy!r}") from None
    rho = prepaid_rho(terms, noise_std=noise_std)
    if policy is Policy.DROP:
        return individual_filter(used, rho, cap=cap, policy=policy)
    xp = array_module(used, rho)
    total = round_up(used + rho)
    free = rho == 0.0
    fits = (total <= cap) | free
    two_s2 = 2.0 * noise_std * noise_std
    remaining = xp.maximum(round_down(cap - used), 0.0)
    budget = xp.maximum(round_down(remaining * two_s2), 0.0)  # norm units
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # overflowed rows: dropped below
        cross_abs = xp.maximum(terms.magnitude - terms.quadratic, 0.0) / 2.0
        a = terms.quadratic * (1.0 + ETA)
        b = terms.cross + ETA * cross_abs
        root = xp.sqrt(b * b + a * budget)
        # The larger root of a l^2 + 2 b l = budget, in the form that does not cancel.
        scale = xp.where(b >= 0.0, budget / (b + root), (root - b) / a) * _CLIP_SHRINK
        scale = xp.where(xp.isfinite(scale), xp.clip(scale, 0.0, 1.0), 0.0)
        recomputed = scale * scale * a + 2.0 * scale * b
    clipped = ~fits & (scale > 0.0) & (round_up(recomputed) <= budget)
    filled = xp.minimum(round_up(used + remaining), cap)
    take = ~free & fits
    return FilterDecision(
        new_used=xp.where(take, total, xp.where(clipped, filled, used)),
        charge=xp.where(fits, rho, xp.where(clipped, remaining, 0.0)),
        scale=xp.where(fits, 1.0, xp.where(clipped, scale, 0.0)),
        status=xp.where(fits, ADMITTED, xp.where(clipped, CLIPPED, DROPPED)).astype(xp.int8),
    )


@dataclass(frozen=True)
class AdmitResult:
    """What :meth:`Ledger.admit` decided for each row, in input order."""

    contributions: np.ndarray  # (n, d) what each row contributes to the sum (0 if dropped)
    charge: np.ndarray  # (n,) zCDP charged to the row's user
    status: np.ndarray  # (n,) int8 ADMITTED / CLIPPED / DROPPED
    # (n,) the one scale of the row: 1 admitted, in (0, 1) clipped, 0 dropped; it applies to the
    # window vector and to every prepaid contribution of the row alike.
    scale: np.ndarray | None = None

    def counts(self) -> dict[str, int]:
        """Rows per status, e.g. ``{"admitted": 10, "clipped": 0, "dropped": 2}`` (sensitive)."""
        tally = np.bincount(self.status, minlength=len(STATUS_NAMES))
        return {name: int(tally[i]) for i, name in enumerate(STATUS_NAMES)}


def _repeat_error(value: Any) -> ValueError:
    return ValueError(
        "user_ids must be distinct within one admit call (one row per user per window; "
        f"aggregate first), got user id {value!r} more than once"
    )


def _refuse_repeats_int(known_positions: np.ndarray, new_ids: np.ndarray, ids: np.ndarray) -> None:
    # Known users: their positions are dense, so a bincount finds repeats in one pass.
    if known_positions.size:
        counts = np.bincount(known_positions)
        if counts.max() > 1:
            raise _repeat_error(int(ids[np.flatnonzero(known_positions == np.argmax(counts))[0]]))
    if new_ids.size > 1:
        uniq, counts = np.unique(new_ids, return_counts=True)
        if counts.max() > 1:
            raise _repeat_error(int(uniq[np.argmax(counts)]))


def _refuse_repeats_str(ids: pa.Array) -> None:
    if len(ids) > 1:
        counts = pc.value_counts(ids)
        tally = counts.field("counts").to_numpy()
        if tally.max() > 1:
            raise _repeat_error(counts.field("values")[int(np.argmax(tally))].as_py())


def _gather(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``values[positions]`` with 0 where ``positions`` is -1 (an unknown id), also when
    ``values`` is still empty (a ledger that has seen nobody)."""
    if values.size == 0:
        return np.zeros(positions.shape)
    return np.where(positions >= 0, values[np.maximum(positions, 0)], 0.0)


def _combined_terms(x: np.ndarray, prepaid: Any) -> ChargeTerms:
    """One row's whole request as one :class:`ChargeTerms`: the window vectors ``x`` (a quadratic
    term ``||v||^2``, no cross term) plus every prepaid term. A row whose ``v`` is non-zero but
    whose squares underflow keeps a positive magnitude, so it is charged (``TINY``), never free.
    ValueError when a term's shape is not ``(n,)``."""
    parts = [prepaid] if isinstance(prepaid, ChargeTerms) else list(prepaid)
    n = x.shape[0]
    sq = np.einsum("nd,nd->n", x, x) if x.shape[1] else np.zeros(n)
    quadratic, cross, magnitude = sq.copy(), np.zeros(n), sq.copy()
    for k, part in enumerate(parts):
        if not isinstance(part, ChargeTerms):
            raise ValueError(f"prepaid must hold ChargeTerms, got {type(part).__name__} at position {k}")
        arrays = [np.asarray(a, dtype=np.float64) for a in (part.quadratic, part.cross, part.magnitude)]
        if any(a.shape != (n,) for a in arrays):
            raise ValueError(f"prepaid terms must have shape ({n},) (one per row), got "
                             f"{[a.shape for a in arrays]} at position {k}")
        quadratic += arrays[0]
        cross += arrays[1]
        magnitude += arrays[2]
    if x.shape[1]:
        magnitude = np.where((magnitude == 0.0) & (x != 0.0).any(axis=1), TINY, magnitude)
    return ChargeTerms(quadratic=quadratic, cross=cross, magnitude=magnitude)


class Ledger:
    """Per-user used privacy budget (zCDP) and personal trackers, for int64 or string user ids.

    Args:
        budget: ``kappa``, each user's zCDP budget (see ``renyi_stream.stream.accounting.calibrate``).
        id_type: ``"int64"`` or ``"string"``: the kind of user id this ledger holds.
        tracker_step: ``Delta`` of the personal tracker (Algorithm 5), zCDP; default
            :func:`renyi_stream.stream.accounting.odometers.tracker_step_for` of ``budget``.
    """

    def __init__(self, *, budget: float, id_type: str = "int64", tracker_step: float | None = None) -> None:
        self.budget = check.positive("budget", budget)
        if id_type not in ("int64", "string"):
            raise ValueError(f"id_type must be 'int64' or 'string', got id_type={id_type!r}")
        self.id_type = id_type
        self.tracker_step = (
            tracker_step_for(self.budget) if tracker_step is None else check.positive("tracker_step", tracker_step)
        )
        self._cap = float(np.nextafter(self.budget * (1.0 - BUDGET_SAFETY), 0.0))
        self._index = Int64Index() if id_type == "int64" else None
        self._codes = StringCodes() if id_type == "string" else None
        self._n = 0
        self._used = np.zeros(0)
        self._segment = np.zeros(0)
        self._tracker = np.zeros(0)

    # -- ids ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of users the ledger has seen."""
        return self._n

    def _as_ids(self, user_ids: Any) -> np.ndarray | pa.Array:
        if isinstance(user_ids, (str, bytes, set, frozenset)) or user_ids is None:
            # A str would be read as one id per character, a set in arbitrary order.
            raise ValueError(
                f"user_ids must be an ordered sequence or array of ids, got {type(user_ids).__name__}"
            )
        if self.id_type == "int64":
            if isinstance(user_ids, (pa.Array, pa.ChunkedArray)):
                if not pa.types.is_integer(user_ids.type):
                    raise ValueError(f"user_ids must be integers for an int64 ledger, got type {user_ids.type}")
                if user_ids.null_count:
                    raise ValueError("user_ids must not contain nulls")
                return np.asarray(user_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
            ids = np.asarray(user_ids)
            if ids.size == 0:  # an empty list is float64 to NumPy: no ids is no ids
                return np.zeros(0, dtype=np.int64)
            if ids.dtype.kind not in "iu":
                raise ValueError(f"user_ids must be integers for an int64 ledger, got dtype {ids.dtype}")
            if ids.dtype.kind == "u" and ids.size and ids.max() > np.iinfo(np.int64).max:
                raise ValueError("user_ids must fit in int64")
            return ids.astype(np.int64, copy=False).ravel()
        if isinstance(user_ids, (pa.Array, pa.ChunkedArray)):
            ids = user_ids
        else:
            try:
                ids = pa.array(user_ids.tolist() if isinstance(user_ids, np.ndarray) else list(user_ids))
            except (TypeError, OverflowError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ValueError(f"user_ids must be strings for a string ledger: {exc}") from exc
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
            if len(ids) == 0:
                return pa.array([], type=pa.large_string())
            raise ValueError(f"user_ids must be strings for a string ledger, got type {ids.type}")
        if ids.null_count:
            raise ValueError("user_ids must not contain nulls")
        return ids

    def _positions(self, ids: np.ndarray | pa.Array, *, add: bool) -> np.ndarray:
        """Dense positions of ``ids``; with ``add``, new ids are appended (after checking that
        no id repeats), else unknown ids get -1."""
        before = self._n
        if self.id_type == "string":
            assert self._codes is not None
            if add:
                _refuse_repeats_str(ids)
            positions = self._codes.codes(ids, add_missing=add)
            self._n = len(self._codes)
        else:
            assert self._index is not None
            positions = self._index.lookup(ids)
            if add:
                missing = positions < 0
                if not missing.any():  # the steady state of a daily job: every user known
                    _refuse_repeats_int(positions, ids[:0], ids)
                else:
                    _refuse_repeats_int(positions[~missing], ids[missing], ids)
                    positions[missing] = self._index.add(ids[missing])
                self._n = len(self._index)
        if self._n > before:
            self._ensure_capacity(self._n)
            self._tracker[before:self._n] = self.tracker_step  # Algorithm 5: O_1 = Delta
        return positions

    def _ensure_capacity(self, n: int) -> None:
        if n <= self._used.size:
            return
        capacity = max(n, 2 * self._used.size, 1024)
        for name in ("_used", "_segment", "_tracker"):
            old = getattr(self, name)
            grown = np.zeros(capacity)
            grown[: old.size] = old
            setattr(self, name, grown)

    # -- the filter -----------------------------------------------------------------------------

    def admit(
        self,
        user_ids: Any,
        contributions: Any,
        *,
        noise_std: float,
        policy: Policy | str = Policy.DROP,
        prepaid: "ChargeTerms | Sequence[ChargeTerms] | None" = None,
    ) -> AdmitResult:
        """Filter and charge one window's request, one row per distinct user: one decision per
        user and window over their window vector and every prepaid term.

        Args:
            user_ids: ``(n,)`` ids (int64 or strings, as the ledger's ``id_type``), distinct.
            contributions: ``(n, d)`` (or ``(n,)`` for d=1) finite float64: each row is that
                user's query vector for this window (``d = 0`` when the window asks only
                running queries).
            noise_std: ``s``, the per-coordinate Gaussian noise std of the release.
            policy: ``drop`` (Algorithm 3) or ``clip`` (Algorithm 7).
            prepaid: the :class:`ChargeTerms` (``(n,)`` each) of the row's contribution to each
                active running query under prepaid admission (``renyi_stream.stream.continual.prepaid``), or
                ``None``.

        Without ``prepaid`` the charge is ``||v||^2 / (2 s^2)`` (``gaussian_charge``, bit for bit
        what it always was) and the decision :func:`individual_filter`'s. With it, the row's
        charge in norm units is the one quadratic in the row's scale ``lambda``

            lambda^2 (||v||^2 + sum_k quadratic_k) + 2 lambda sum_k cross_k,

        (the window vector is a prepaid term with no cross part: it is released once), charged
        and decided by :func:`prepaid_filter`: under ``clip`` one ``lambda`` scales ``v`` and
        every prepaid contribution (:attr:`AdmitResult.scale`), and the recorded charge covers
        the scaled request. Rounding: the prepaid margin (``ETA`` times the magnitude) covers
        ``||v||^2``'s float error as well, so the charge is at least the exact one (docs/
        running_totals.md, "Soundness", step 3).

        Returns the charged contributions, the zCDP charge, the status and the scale of every
        row. The whole request is validated before any state changes (repeated ids, NaN/inf,
        shapes).
        """
        noise_std = check.positive("noise_std", noise_std)
        if not _MIN_NOISE_STD <= noise_std <= _MAX_NOISE_STD:
            # Outside, 2 s^2 underflows or overflows float64 and the charge is lost (0 or NaN).
            raise ValueError(
                f"noise_std must be in [{_MIN_NOISE_STD:g}, {_MAX_NOISE_STD:g}], got noise_std={noise_std!r}"
            )
        policy = _policy(policy)
        if np.iscomplexobj(contributions):
            raise ValueError("contributions must be real numbers, got a complex array")
        x = np.asarray(contributions, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2:
            raise ValueError(f"contributions must be (n, d) or (n,), got shape={np.shape(contributions)}")
        ids = self._as_ids(user_ids)
        if len(ids) != x.shape[0]:
            raise ValueError(
                f"user_ids and contributions must have the same number of rows, got "
                f"{len(ids)} ids and {x.shape[0]} rows"
            )
        if not np.isfinite(x).all():
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise ValueError(
                f"contributions must be finite, got a NaN/inf in row {bad}; "
                "validate batches with renyi_stream.stream.schema.validate_batch first"
            )
        terms = None if prepaid is None else _combined_terms(x, prepaid)
        if terms is None:
            charge = gaussian_charge(contributions=x, noise_std=noise_std)
        positions = self._positions(ids, add=True)
        used = self._used[positions]
        if terms is None:
            decision = individual_filter(used, charge, cap=self._cap, policy=policy)
        else:
            decision = prepaid_filter(used, terms, cap=self._cap, noise_std=noise_std, policy=policy)
        self._used[positions] = decision.new_used
        charged = decision.charge > 0
        if charged.any():
            where = positions[charged]
            segment, tracker = tracker_update(
                self._segment[where], self._tracker[where], decision.charge[charged], step=self.tracker_step
            )
            self._segment[where] = segment
            self._tracker[where] = tracker
        out = x * decision.scale[:, None]
        return AdmitResult(contributions=out, charge=decision.charge, status=decision.status, scale=decision.scale)

    # -- reading state --------------------------------------------------------------------------

    def used(self, user_ids: Any) -> np.ndarray:
        """Used budget (zCDP) of each id; 0 for ids the ledger has never seen."""
        positions = self._positions(self._as_ids(user_ids), add=False)
        return np.where(positions >= 0, _gather(self._used, positions), 0.0)

    def remaining(self, user_ids: Any) -> np.ndarray:
        """Budget (zCDP) each id may still spend."""
        return np.maximum(self._cap - self.used(user_ids), 0.0)

    def personal_odometer(self, user_ids: Any) -> np.ndarray:
        """Each user's personal zCDP bound ``min(O^(i), kappa)`` (Feldman & Zrnic, Cor. 4.11).

        ``O^(i)`` depends only on user ``i``'s own charges, so it may be disclosed to user
        ``i`` (and to nobody else). A user never charged anything has lost nothing: 0.
        """
        positions = self._positions(self._as_ids(user_ids), add=False)
        bound = np.minimum(_gather(self._tracker, positions), self.budget)
        spent = (positions >= 0) & (_gather(self._used, positions) > 0)
        return np.where(spent, bound, 0.0)

    def personal_epsilon(self, user_ids: Any, *, delta: float, accounting: str = "gdp") -> np.ndarray:
        """Each user's personal epsilon at ``delta``: :meth:`personal_odometer` converted."""
        rho = self.personal_odometer(user_ids)
        # The tracker moves in steps of Delta, so few distinct values need converting.
        levels, inverse = np.unique(rho, return_inverse=True)
        eps = np.array([epsilon_for_budget(rho=float(r), delta=delta, accounting=accounting) for r in levels])
        return eps[inverse].reshape(rho.shape)

    # -- snapshots ------------------------------------------------------------------------------

    def to_arrow(self, users: Any = None) -> pa.Table:
        """The ledger as an Arrow table sorted by user id, parameters in the schema metadata.

        With ``users`` (ids as :meth:`admit` takes them), the rows of those users only: each id the
        ledger has seen, once, as in the whole table (same columns, types, order and metadata);
        ids it has never seen have no row. The cost grows with ``len(users)``, not with the ledger
        (int64 and string ids alike, :mod:`renyi_stream.stream.id_index`), so a snapshot of the users
        one window charged (:meth:`renyi_stream.stream.engine.shard_state.ShardSnapshots.after_window`) costs
        that window's users."""
        if users is None:
            if self.id_type == "int64":
                assert self._index is not None
                ids: Any = self._index.keys_in_order()
                rows = np.argsort(ids, kind="stable")
                id_array = pa.array(ids[rows], type=pa.int64())
            else:
                assert self._codes is not None
                values = self._codes.values()
                rows = np.asarray(pc.sort_indices(values)) if self._n else np.zeros(0, dtype=np.int64)
                id_array = values.take(pa.array(rows, type=pa.int64()))
        else:
            wanted = self._as_ids(users)
            positions = self._positions(wanted, add=False)
            known = positions >= 0
            if self.id_type == "int64":
                assert self._index is not None
                ids = np.unique(wanted[known])  # sorted and distinct, as argsort orders the whole table
                rows = self._index.lookup(ids)
                id_array = pa.array(ids, type=pa.int64())
            else:
                assert self._codes is not None
                codes = np.unique(positions[known])
                values = self._codes.values().take(pa.array(codes, type=pa.int64()))
                order = np.asarray(pc.sort_indices(values)) if len(codes) else np.zeros(0, dtype=np.int64)
                rows = codes[order]
                id_array = values.take(pa.array(order, type=pa.int64()))
        metadata = {
            "renyi_stream.ledger_version": str(SNAPSHOT_VERSION),
            "budget": repr(self.budget),
            "tracker_step": repr(self.tracker_step),
            "id_type": self.id_type,
        }
        return pa.table(
            {
                "user_id": id_array,
                "used": pa.array(self._used[rows]),
                "tracker_segment": pa.array(self._segment[rows]),
                "tracker_bound": pa.array(self._tracker[rows]),
            }
        ).replace_schema_metadata(metadata)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "Ledger":
        """Restore a ledger from :meth:`to_arrow`, refusing anything inconsistent.

        A ledger that silently lost users or budget would start them from zero: a privacy
        failure. So every check fails loudly: version, columns, nulls, repeated ids, used
        budgets outside ``[0, kappa]``, trackers below the used budget.
        """
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        version = meta.get("renyi_stream.ledger_version")
        if version != str(SNAPSHOT_VERSION):
            raise ValueError(f"ledger snapshot version must be {SNAPSHOT_VERSION}, got {version!r}")
        try:
            budget, step, id_type = float(meta["budget"]), float(meta["tracker_step"]), meta["id_type"]
        except (KeyError, ValueError) as exc:
            raise ValueError(f"ledger snapshot metadata is incomplete or malformed: {exc}") from exc
        needed = ("user_id", "used", "tracker_segment", "tracker_bound")
        missing = [c for c in needed if c not in table.column_names]
        if missing:
            raise ValueError(f"ledger snapshot is missing columns {missing}")
        for name in needed:
            if table.column(name).null_count:
                raise ValueError(f"ledger snapshot column {name!r} contains nulls")
        ledger = cls(budget=budget, id_type=id_type, tracker_step=step)
        used = table.column("used").to_numpy().astype(np.float64)
        segment = table.column("tracker_segment").to_numpy().astype(np.float64)
        tracker = table.column("tracker_bound").to_numpy().astype(np.float64)
        if not (np.isfinite(used).all() and (used >= 0).all() and (used <= budget).all()):
            raise ValueError(f"ledger snapshot has used budgets outside [0, {budget}]")
        if not (np.isfinite(tracker).all() and (tracker + 1e-12 * budget >= used).all()):
            raise ValueError("ledger snapshot has personal trackers below the used budget")
        ids = table.column("user_id").combine_chunks()
        positions = ledger._positions(ledger._as_ids(ids), add=True)
        ledger._used[positions] = used
        ledger._segment[positions] = segment
        ledger._tracker[positions] = tracker
        return ledger

    def user_ids(self) -> Sequence[Any]:
        """All user ids the ledger has seen, in first-seen order."""
        if self.id_type == "int64":
            assert self._index is not None
            return self._index.keys_in_order()
        assert self._codes is not None
        return self._codes.values().to_pylist()
