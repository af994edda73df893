"""What a ledger keeps for life: one frozen record (:class:`LedgerConfig`), one continuation
check (:meth:`LedgerConfig.continued_from`) and one codec per place a job records it.

A ledger's users were charged under one promise, one calibration, one noise key and one window
length. Continuing it under others would change every user's promise mid-stream (the budgets
they have used were charged under the old parameters), so each job records the configuration
with the ledger, and a run that continues a ledger is checked against the record before anyone
is charged. The fields are of four kinds:

* **fixed** (:data:`FIXED`): the promise ``epsilon``, ``delta``, ``norm_budget`` (``B``, squared
  norm) and ``accounting``; ``id_type`` (every row's id is parsed as it); ``key_fingerprint`` (the
  noise key's, :attr:`renyi_stream.stream.noise.NoiseKey.fingerprint`); the windows ``window_seconds`` and
  ``origin_seconds``; and ``releases``, the public release root, for the jobs that have one. A
  continuing run must ask exactly the recorded values: any difference is refused, naming the
  field and both values.
* **derived** (:data:`DERIVED`): ``rho`` (``kappa``, the per-user zCDP budget), ``noise_std`` (per
  coordinate) and ``tracker_step`` (``Delta`` of the personal tracker, zCDP), which calibration
  derives from the promise (:meth:`LedgerConfig.from_promise`). They are the ledger's own for
  life: a continuing run keeps the recorded values (:func:`renyi_stream.stream.accounting.calibration.resume`),
  so another version's last-bit difference in calibration neither refuses a ledger nor changes
  its noise; a recorded budget above the promise, or a noise std or tracker step that does not
  follow from the recorded budget (an edited record), is refused.
* **identity**: ``ledger_id`` (:func:`renyi_stream.stream.noise.new_ledger_id`), which the release noise is
  bound to; kept from the record. A record made before ledger ids existed has none (``None``):
  the continuing run's own id is then the ledger's from now on.
* **per run**: ``n_shards``. A ledger is keyed by user; every job restores it whole and splits it
  with :func:`renyi_stream.stream.engine.sharding.shard_of`, the same in every process and run, so a run may
  use another shard count than the run before it and every user still finds their own row. A
  record keeps the shard count of the run that wrote it.

Where each job records it, a ``to_*``/``from_*`` pair each (round trips in
``tests/test_ledger_config.py``), tolerant of older records exactly where the jobs always were:

* the local daily job's DuckDB ``meta`` table, text rows (:meth:`LedgerConfig.to_meta`,
  :meth:`LedgerConfig.from_meta`; rows without ``rho`` record no ledger yet, rows without
  ``ledger_id`` predate ledger ids);
* the distributed job's JSON manifests, ``parameters``, ``releases`` and ``n_shards``
  (:meth:`LedgerConfig.to_manifest`, :meth:`LedgerConfig.from_manifest`; without
  ``parameters.ledger_id`` or ``releases`` they predate them);
* the streaming job's ledger snapshots, Parquet schema metadata ``renyi_stream.<field>``
  (:meth:`LedgerConfig.to_snapshot_metadata`, :meth:`LedgerConfig.from_snapshot_metadata`;
  without ``renyi_stream.ledger_id`` or ``renyi_stream.n_shards`` they predate them; without the
  rest they cannot be checked, :attr:`LedgerConfigError.missing`).

Floats are recorded exactly (a JSON number, or its ``repr`` as text) and compared exactly.

The engine layer: imports the core only, no Beam and no storage library.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import numpy as np

from renyi_stream.stream.accounting import _validate as check
from renyi_stream.stream.accounting.calibration import DEFAULT_ACCOUNTING, Calibration, calibrate, check_accounting, resume
from renyi_stream.stream.accounting.odometers import tracker_step_for
from renyi_stream.stream.contract import ID_TYPES, InputContract
from renyi_stream.stream.ledger import Ledger
from renyi_stream.stream.noise import check_ledger_id
from renyi_stream.stream.schema import MAX_ABS_SECONDS, WindowSpec

#: The user shards of a run unless it says otherwise, in every job (a ledger may be re-sharded:
#: module docstring). Deployments at scale choose theirs (deploy/README.md, "Shards").
DEFAULT_SHARDS = 16
#: The most user shards a run may use.
MAX_SHARDS = 65_536

#: The promise: what every user was promised, the calibration's input.
PROMISE = ("epsilon", "delta", "norm_budget", "accounting")
#: Refused when a continuing run asks another value (``releases`` only where both have one).
FIXED = (*PROMISE, "id_type", "key_fingerprint", "window_seconds", "origin_seconds", "releases", "columns")
#: Derived from the promise by calibration, then the ledger's own: kept from the record.
DERIVED = ("rho", "noise_std", "tracker_step")
#: The ledger's identity, kept from the record.
IDENTITY = ("ledger_id",)
#: How one run executes: this run's value.
PER_RUN = ("n_shards",)

#: Schema metadata keys of the streaming job's snapshots: ``renyi_stream.<field>``.
SNAPSHOT_PREFIX = "renyi_stream."

_FLOATS = frozenset(("epsilon", "delta", "norm_budget", "rho", "noise_std", "tracker_step"))
_INTS = frozenset(("window_seconds", "origin_seconds", "n_shards"))
_FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")


class LedgerConfigError(ValueError):
    """A record that cannot be read, or a run that may not continue the ledger it records.

    ``details``: one line per field at fault (``epsilon: ledger has 1.0, this run asks 2.0``);
    ``missing``: the fields a record lacks (none recorded at all), when that is what is wrong."""

    def __init__(self, message: str, *, details: tuple[str, ...] = (), missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.details = details
        self.missing = missing


def snapshot_key(name: str) -> str:
    """The schema metadata key a snapshot records field ``name`` under: ``renyi_stream.<name>``."""
    return SNAPSHOT_PREFIX + name


@dataclass(frozen=True, kw_only=True)
class LedgerConfig:
    """The configuration of one ledger as one run uses it (the module docstring says which field
    is fixed, derived, identity or per run). Validated at construction: ValueError naming the
    field, the value and the allowed range.

    Attributes:
        epsilon, delta: the per-user promise, ``(epsilon, delta)``-DP over the ledger's life.
        norm_budget: ``B``, the squared L2 norm a user may contribute in total.
        accounting: how ``(epsilon, delta)`` maps to ``rho`` (:data:`renyi_stream.stream.accounting.ACCOUNTINGS`).
        rho: ``kappa``, each user's zCDP budget (ledger units).
        noise_std: the Gaussian noise std per coordinate, ``sqrt(B / (2 rho))`` with headroom.
        tracker_step: ``Delta`` of the personal tracker (Algorithm 5), zCDP.
        id_type: ``"int64"`` or ``"string"``.
        key_fingerprint: the noise key's public fingerprint (lowercase hex).
        window_seconds, origin_seconds: the windows, :class:`renyi_stream.stream.schema.WindowSpec`'s.
        n_shards: user shards of this run, in ``[1, MAX_SHARDS]``.
        ledger_id: the ledger's identifier (32 lowercase hex digits); None only as read from a
            record that predates ledger ids.
        releases: the public release root (a path or URI, as the job normalises it), or None for
            a job that has none (the local daily job) and records that predate it.
        columns: the declared indicator columns and the id and time columns' names, as
            :meth:`renyi_stream.stream.contract.InputContract.columns_json` writes them (with
            ``id_type``, the ledger's declared contract; a record of columns alone, from before the
            names were recorded, names the defaults ``user_id`` and ``day``/``event_time``); None for
            a run that declares none (it continues the record's) and for records that predate
            declared contracts.
    """

    epsilon: float
    delta: float
    norm_budget: float
    accounting: str
    rho: float
    noise_std: float
    tracker_step: float
    id_type: str
    key_fingerprint: str
    window_seconds: int
    origin_seconds: int
    n_shards: int
    ledger_id: str | None = None
    releases: str | None = None
    columns: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "epsilon", check.positive("epsilon", self.epsilon))
        set_(self, "delta", check.probability("delta", self.delta))
        set_(self, "norm_budget", check.positive("norm_budget", self.norm_budget))
        if not isinstance(self.accounting, str):
            raise ValueError(f"accounting must be a string, got accounting={self.accounting!r}")
        check_accounting(self.accounting)
        for name in DERIVED:
            set_(self, name, check.positive(name, getattr(self, name)))
        if self.id_type not in ID_TYPES:
            raise ValueError(f"id_type must be one of {ID_TYPES}, got id_type={self.id_type!r}")
        if not isinstance(self.key_fingerprint, str) or not _FINGERPRINT.fullmatch(self.key_fingerprint):
            raise ValueError("key_fingerprint must be 1 to 64 lowercase hex digits (renyi_stream.stream.noise.NoiseKey.fingerprint), "
                             f"got key_fingerprint={self.key_fingerprint!r}")
        set_(self, "window_seconds", _integer("window_seconds", self.window_seconds, 1, MAX_ABS_SECONDS, "[1, 2**61]"))
        set_(self, "origin_seconds", _integer("origin_seconds", self.origin_seconds, -MAX_ABS_SECONDS,
                                              MAX_ABS_SECONDS, "[-2**61, 2**61]"))
        set_(self, "n_shards", _integer("n_shards", self.n_shards, 1, MAX_SHARDS, f"[1, {MAX_SHARDS}]"))
        if self.ledger_id is not None:
            check_ledger_id(self.ledger_id)
        if self.releases is not None and (not isinstance(self.releases, str) or not self.releases):
            raise ValueError(f"releases must be a non-empty path or URI, got releases={self.releases!r}")
        if self.columns is not None:
            if not isinstance(self.columns, str):
                raise ValueError(f"columns must be a contract's JSON text, got columns={self.columns!r}")
            set_(self, "columns", InputContract.from_columns_json(self.id_type, self.columns).columns_json())

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_promise(cls, *, epsilon: float, delta: float, norm_budget: float,
                     accounting: str = DEFAULT_ACCOUNTING, id_type: str, key_fingerprint: str,
                     window: WindowSpec | None = None, n_shards: int = DEFAULT_SHARDS,
                     ledger_id: str | None = None, releases: str | None = None,
                     contract: InputContract | None = None) -> "LedgerConfig":
        """A new ledger's configuration for the promise ``(epsilon, delta)`` with squared-norm
        budget ``norm_budget``: ``rho`` and ``noise_std`` from
        :func:`renyi_stream.stream.accounting.calibrate` (Corollary 4.7, under ``accounting``), the tracker
        step from :func:`renyi_stream.stream.accounting.odometers.tracker_step_for` (its one definition);
        daily windows from the epoch unless ``window`` says otherwise. ValueError naming the
        parameter for anything out of range."""
        cal = calibrate(epsilon=epsilon, delta=delta, norm_budget=norm_budget, accounting=accounting)
        window = WindowSpec() if window is None else window
        return cls(epsilon=cal.epsilon, delta=cal.delta, norm_budget=cal.norm_budget, accounting=cal.accounting,
                   rho=cal.rho, noise_std=cal.noise_std, tracker_step=tracker_step_for(cal.rho), id_type=id_type,
                   key_fingerprint=key_fingerprint, window_seconds=window.length_seconds,
                   origin_seconds=window.origin_seconds, n_shards=n_shards, ledger_id=ledger_id, releases=releases,
                   columns=None if contract is None else contract.columns_json())

    # -- what the fields give -------------------------------------------------------------------

    @property
    def window(self) -> WindowSpec:
        """The ledger's windows."""
        return WindowSpec(length_seconds=self.window_seconds, origin_seconds=self.origin_seconds)

    @property
    def contract(self) -> InputContract | None:
        """The declared input contract (:mod:`renyi_stream.stream.contract`), None when none is recorded."""
        return None if self.columns is None else InputContract.from_columns_json(self.id_type, self.columns)

    @property
    def calibration(self) -> Calibration:
        """This configuration's own budget and noise as a :class:`renyi_stream.stream.accounting.Calibration`
        (what reports and the release records state), not recomputed from the promise."""
        return Calibration(accounting=self.accounting, epsilon=self.epsilon, delta=self.delta,
                           norm_budget=self.norm_budget, rho=self.rho, mu=math.sqrt(2.0 * self.rho),
                           noise_std=self.noise_std)

    def empty_ledger(self) -> Ledger:
        """A ledger of this budget, id type and tracker step that has seen nobody."""
        return Ledger(budget=self.rho, id_type=self.id_type, tracker_step=self.tracker_step)

    # -- continuing a recorded ledger -----------------------------------------------------------

    def continued_from(self, recorded: "LedgerConfig", *, where: str, by: str = "this run") -> "LedgerConfig":
        """This run's configuration when it continues the ledger ``recorded`` (as read from its
        record at ``where``): this run's values with the record's ``rho``, ``noise_std``,
        ``tracker_step`` and ``ledger_id`` (this run's id when the record predates ids) and, when
        this run names none, the record's release root.

        Raises :class:`LedgerConfigError` naming ``where``, before anyone is charged:

        * for any :data:`FIXED` field whose value differs (``releases`` only when both name one),
          one ``<field>: ledger has <recorded>, <by> asks <this run's>`` per field;
        * for a recorded ``rho`` above the budget this run's promise allows (beyond
          :data:`renyi_stream.stream.accounting.calibration.BUDGET_RTOL` of float rounding);
        * for a recorded ``noise_std`` or ``tracker_step`` other than exactly what the recorded
          ``rho`` gives (the record was edited).

        ``by`` names who asks in the messages (``"this training"``).
        """
        changed = [name for name in FIXED if _differs(getattr(recorded, name), getattr(self, name), name)]
        if changed:
            details = tuple(f"{name}: ledger has {getattr(recorded, name)!r}, {by} asks {getattr(self, name)!r}"
                            for name in changed)
            if "columns" in changed:  # the id and time columns' names, each named as both declare it
                details += tuple(recorded.contract.key_changes(self.contract))
            elsewhere = (" (a ledger answers into the release root it was started with, --releases-parquet: the "
                         "ledger of a job that released under another root, e.g. a staging job's, charged its users "
                         "for other releases)" if "releases" in changed else "")
            raise LedgerConfigError(
                f"{where}: {by}'s parameters differ from the ledger's, which it keeps for life (a change "
                f"mid-stream would change every user's promise: the budgets they have used were charged under the "
                f"old parameters): {'; '.join(details)}{elsewhere}. Give {by} the ledger's values", details=details)
        kept = self.resumed(recorded.rho, where=where, by=by)
        edited = tuple(f"{name}: ledger has {getattr(recorded, name)!r}, its rho={recorded.rho!r} gives "
                       f"{getattr(kept, name)!r} (the ledger was edited)"
                       for name in ("noise_std", "tracker_step") if getattr(recorded, name) != getattr(kept, name))
        if edited:
            raise LedgerConfigError(f"{where}: the ledger's noise or tracker step does not follow from its budget: "
                                    + "; ".join(edited), details=edited)
        return replace(kept, ledger_id=recorded.ledger_id if recorded.ledger_id is not None else self.ledger_id,
                       releases=self.releases if self.releases is not None else recorded.releases,
                       columns=self.columns if self.columns is not None else recorded.columns)

    def resumed(self, recorded_rho: float, *, where: str, by: str = "this run") -> "LedgerConfig":
        """This configuration continuing a ledger whose budget is ``recorded_rho``: that budget,
        and the noise std and tracker step it gives (:func:`renyi_stream.stream.accounting.calibration.resume`
        of this promise's calibration). :class:`LedgerConfigError` naming ``where`` when
        ``recorded_rho`` is above what the promise allows."""
        cal = calibrate(epsilon=self.epsilon, delta=self.delta, norm_budget=self.norm_budget,
                        accounting=self.accounting)
        try:
            kept = resume(cal, recorded_rho)
        except ValueError as exc:
            detail = f"rho: ledger has {recorded_rho!r}, this promise allows {cal.rho!r}"
            raise LedgerConfigError(f"{where}: {detail}; the ledger's budget does not keep {by}'s promise: {exc}",
                                    details=(detail,)) from None
        return replace(self, rho=kept.rho, noise_std=kept.noise_std, tracker_step=tracker_step_for(kept.rho))

    # -- the local daily job: DuckDB meta rows ----------------------------------------------------

    def to_meta(self) -> dict[str, str]:
        """``field -> text`` rows for the curator store's ``meta`` table (floats as their
        ``repr``: exact); fields that are None are not recorded."""
        return {name: _as_text(value) for name, value in self._recorded().items()}

    @classmethod
    def from_meta(cls, rows: Mapping[str, str], *, where: str) -> "LedgerConfig | None":
        """The configuration ``meta`` rows record (other rows ignored); None when they record no
        ledger yet (no ``rho``: a store no run has used). Rows without ``ledger_id`` or
        ``releases`` predate them (None). :class:`LedgerConfigError` naming ``where`` for a
        missing or malformed row."""
        if "rho" not in rows:
            return None
        return cls._from_text(rows, where=where)

    # -- the distributed job: JSON manifests ------------------------------------------------------

    def to_manifest(self) -> dict[str, Any]:
        """What a distributed run's intent and manifest record: ``parameters`` (every field but
        ``releases`` and ``n_shards``; JSON numbers are exact), ``releases`` and ``n_shards``."""
        recorded = self._recorded()
        return {"parameters": {k: v for k, v in recorded.items() if k not in ("releases", "n_shards")},
                "releases": self.releases, "n_shards": self.n_shards}

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], *, where: str) -> "LedgerConfig":
        """The configuration a committed manifest records (:meth:`to_manifest`'s keys). A manifest
        without ``parameters.ledger_id`` or ``releases`` predates them (None).
        :class:`LedgerConfigError` naming ``where`` for a missing or mistyped value; a budget
        that is not a number is "no zCDP budget"."""
        parameters = manifest.get("parameters")
        if not isinstance(parameters, Mapping):
            raise LedgerConfigError(f"{where} records no parameters: it cannot be continued", missing=("parameters",))
        values = {**parameters, "releases": manifest.get("releases"), "n_shards": manifest.get("n_shards")}
        rho = values.get("rho")
        if not _is_number(rho):
            raise LedgerConfigError(f"{where} records no zCDP budget (rho={rho!r}): it cannot be continued")
        missing = tuple(name for name in _REQUIRED if values.get(name) is None)
        if missing:
            raise LedgerConfigError(f"{where} records no {', '.join(missing)}: it cannot be continued", missing=missing)
        typed: dict[str, Any] = {}
        for name in _FIELDS:
            value = values.get(name)
            if value is None:
                continue
            ok = _is_number(value) if name in _FLOATS else _is_integer(value) if name in _INTS else isinstance(value, str)
            if not ok:
                kind = "number" if name in _FLOATS else "integer" if name in _INTS else "string"
                raise LedgerConfigError(f"{where} records {name}={value!r}, not a {kind}: it was edited")
            typed[name] = float(value) if name in _FLOATS else value
        return cls._checked(typed, where=where)

    # -- the streaming job: Parquet schema metadata of ledger snapshots ---------------------------

    def to_snapshot_metadata(self) -> dict[bytes, bytes]:
        """``renyi_stream.<field> -> text`` (as :meth:`to_meta` writes it), for a snapshot's schema
        metadata beside the ledger's own."""
        return {snapshot_key(name).encode(): _as_text(value).encode() for name, value in self._recorded().items()}

    @classmethod
    def from_snapshot_metadata(cls, metadata: Mapping[Any, Any], *, where: str,
                               n_shards: int | None = None) -> "LedgerConfig":
        """The configuration a snapshot's schema metadata records (keys and values as bytes or
        text; other keys ignored). Without ``renyi_stream.ledger_id`` it predates ledger ids
        (None); without ``renyi_stream.n_shards``, ``n_shards`` is the count given (the shards
        the reader found). :class:`LedgerConfigError` naming ``where`` for a malformed value, or
        with :attr:`LedgerConfigError.missing` for a snapshot that records no parameters (written
        before the job recorded them: it cannot be checked)."""
        text = {_text(k)[len(SNAPSHOT_PREFIX):]: _text(v) for k, v in metadata.items()
                if _text(k).startswith(SNAPSHOT_PREFIX)}
        if "n_shards" not in text and n_shards is not None:
            text["n_shards"] = str(n_shards)
        return cls._from_text(text, where=where, required=(*_REQUIRED, "releases"))

    # -- shared by the codecs ---------------------------------------------------------------------

    def _recorded(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS if getattr(self, name) is not None}

    @classmethod
    def _from_text(cls, text: Mapping[str, str], *, where: str,
                   required: tuple[str, ...] | None = None) -> "LedgerConfig":
        required = _REQUIRED if required is None else required
        missing = tuple(name for name in required if name not in text)
        if missing:
            raise LedgerConfigError(f"{where} records no {', '.join(missing)}", missing=missing)
        values: dict[str, Any] = {}
        for name in _FIELDS:
            if name not in text:
                continue
            raw = text[name]
            try:
                values[name] = float(raw) if name in _FLOATS else int(raw) if name in _INTS else raw
            except (TypeError, ValueError):
                if name == "rho":
                    raise LedgerConfigError(f"{where} records no zCDP budget (rho={raw!r}): it cannot be continued"
                                            ) from None
                kind = "number" if name in _FLOATS else "integer"
                raise LedgerConfigError(f"{where} records {name}={raw!r}, not a {kind}: it was edited") from None
        return cls._checked(values, where=where)

    @classmethod
    def _checked(cls, values: dict[str, Any], *, where: str) -> "LedgerConfig":
        try:
            return cls(**values)
        except ValueError as exc:
            raise LedgerConfigError(f"{where} records {exc}: it was edited") from None


_FIELDS = tuple(f.name for f in fields(LedgerConfig))
#: What every record must hold (``ledger_id`` and ``releases`` may predate the record).
_REQUIRED = tuple(name for name in _FIELDS if name not in ("ledger_id", "releases", "columns"))


def _differs(recorded: Any, asked: Any, name: str) -> bool:
    if name in ("releases", "columns") and (recorded is None or asked is None):
        return False  # a job without a release root or a declaration, or a record from before they were recorded
    return recorded != asked


def _as_text(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _integer(name: str, value: Any, low: int, high: int, shown: str) -> int:
    if not _is_integer(value):
        raise ValueError(f"{name} must be an integer in {shown}, got {name}={value!r}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be in {shown}, got {name}={value!r}")
    return int(value)
