"""The query catalogue beside a public Parquet release root, for the jobs without a DuckDB store.

The distributed and streaming jobs release into ``<root>/window_id=<W>/releases.parquet``
(:mod:`renyi_stream.queries.release_files`) and keep no DuckDB release store, so the registry of their
queries lives beside those files, as public as they are (query specs are public)::

    <root>/_queries/revision-00000001.json
    <root>/_queries/revision-00000002.json    (the catalogue after each change, whole)
    <root>/_queries/input-contract.json       (the ledger's declared input contract)

Each revision is the whole catalogue after one change (``queries``: every registration, with
its spec, ``effective_from`` and ``retired_from``; ``change``: what changed); the highest
revision is the catalogue. Revisions are created once and never rewritten
(:func:`renyi_stream.queries.release_files.create_once`), so the folder is also the catalogue's public
history, and a change is a compare-and-set: of two writers that read revision ``n`` only one
creates ``n + 1``; the other is told (:class:`CatalogueChanged`) and re-reads. That is
guaranteed on local and network filesystems; for ``gs://`` and ``s3://`` roots
``pyarrow.fs`` has no conditional create, so it is check-then-write there (the caveat of
:mod:`renyi_stream.queries.release_lineage`).

Changes follow the rules of :mod:`renyi_stream.queries.registration`, the very functions the DuckDB registry
(:class:`renyi_stream.queries.registry.QueryRegistry`) applies: an id is registered once, a registration or
retirement takes effect after the last window released under the root, a window's queries
have at most ``MAX_DIM`` coordinates together, a window's running queries keep at most
``MAX_USER_STATE`` numbers a user together. "Released" here means a window with a release
file under the root. A job changes the catalogue in two ways only, at launch
(:func:`queries_at_launch`, :meth:`ReleaseCatalogue.record_launch`): it registers the default
per-column sums on a root whose catalogue has no query (as ``renyi-stream run`` does on a store
with none), and it moves a query registered into windows an earlier run charged but had not yet
published (:func:`renyi_stream.queries.registration.deferrals`).

Beside the catalogue lies the input contract of the ledger that answers under the root
(:mod:`renyi_stream.stream.contract`: its id type, columns and bounds; public and declared, no data), as the
DuckDB store keeps it in ``store_meta.input_contract``: written by the first run that has one
(:meth:`ReleaseCatalogue.record_input_contract`), never rewritten, and a run whose ledger
declares another is refused, as the ledger refuses it.

A query's releases under the root estimate what every release estimates, worded once in
:data:`renyi_stream.queries.release_store.ESTIMAND` (the sum over the users whose budget admitted
them in each window, not the population's); ``renyi-stream sql --releases-parquet`` shows it as
the comments of the snapshot's views (:mod:`renyi_stream.queries.release_root`).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Collection, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from renyi_stream.queries import registration as rules
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registration import Registration
from renyi_stream.queries.release_files import create_once, filesystem, released_windows
from renyi_stream.stream.contract import ContractError, InputContract

#: The catalogue's folder under a release root.
FOLDER = "_queries"
CATALOGUE_VERSION = 1
_PREFIX, _SUFFIX = "revision-", ".json"
#: The recorded input contract's file in the catalogue's folder: the contract's canonical JSON
#: (:meth:`renyi_stream.stream.contract.InputContract.to_json`, the text ``store_meta.input_contract`` holds).
CONTRACT_FILE = "input-contract.json"
#: The promise the root's releases keep (:meth:`ReleaseCatalogue.record_promise`).
PROMISE_FILE = "promise.json"
#: How many times a curator's change is re-applied when another writer changed the catalogue first.
_ATTEMPTS = 5


class CatalogueChanged(RuntimeError):
    """Another writer changed the catalogue since it was read: nothing was written."""


@dataclass(frozen=True)
class CatalogueState:
    """One revision of a catalogue: ``revision`` (0 before the first change) and its
    registrations, by query id."""

    revision: int
    registrations: tuple[Registration, ...]

    def plan(self, start_window: int, end_window: int) -> list[Registration]:
        """The registrations active in some window of ``[start_window, end_window]``."""
        return rules.active_between(self.registrations, start_window, end_window)


@dataclass(frozen=True)
class LaunchQueries:
    """What a job answers, decided at launch from one catalogue revision
    (:func:`queries_at_launch`): ``registrations`` after the job's own changes (``registered``:
    default sums registered on an empty catalogue; ``moved``: ``(query_id, old, new)`` first
    windows deferred) and the ``revision`` they were decided from."""

    revision: int
    registrations: tuple[Registration, ...]
    registered: tuple[str, ...] = ()
    moved: tuple[tuple[str, int, int], ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.registered or self.moved)

    def plan(self, start_window: int, end_window: int) -> list[Registration]:
        """The registrations active in some window of ``[start_window, end_window]``, by query id."""
        return rules.active_between(self.registrations, start_window, end_window)


def queries_at_launch(state: CatalogueState, *, defaults: Sequence[LinearQuery], first_window: int | None,
                      processed_through: int | None, answered: Collection[str] | None,
                      last_released: int | None) -> LaunchQueries:
    """The catalogue a job launches with, from ``state`` (pure: nothing is written).

    1. Queries registered into windows the ledger already charged (``<= processed_through``) but
       never answered (not in ``answered``, the query ids its earlier runs answered; None when
       unknown: nothing moved) start at ``processed_through + 1``
       (:func:`renyi_stream.queries.registration.deferrals`, as :meth:`renyi_stream.queries.registry.QueryRegistry.defer_unanswered`).
    2. On a catalogue with no query, ``defaults`` are registered from ``first_window`` (None: the
       run releases nothing, so nothing is registered), checked by the registration rules
       against ``last_released``.
    """
    registrations = {r.query_id: r for r in state.registrations}
    moved: list[tuple[str, int, int]] = []
    if processed_through is not None and answered is not None:
        for registration, old in rules.deferrals(state.registrations, processed_through, answered):
            registrations[registration.query_id] = registration
            moved.append((registration.query_id, old, registration.effective_from))
    registered: list[str] = []
    if not registrations and first_window is not None:
        now = _now()
        for query in defaults:
            registration = rules.check_new(list(registrations.values()), query, first_window,
                                           last_released=last_released, registered_at=now)
            registrations[query.query_id] = registration
            registered.append(query.query_id)
    return LaunchQueries(state.revision, tuple(sorted(registrations.values(), key=lambda r: r.query_id)),
                         tuple(registered), tuple(moved))


class ReleaseCatalogue:
    """The query catalogue of the release root ``root`` (a local path or a ``pyarrow.fs`` URI).

    Reading needs nothing but the root; a change writes one new revision (module docstring).
    """

    def __init__(self, root: str) -> None:
        if not isinstance(root, str) or not root.strip():
            raise ValueError(f"root must be a release root (a path or a URI), got root={root!r}")
        self._root = root.rstrip("/") if "://" in root else filesystem(root)[1]

    @property
    def root(self) -> str:
        return self._root

    # -- reading ----------------------------------------------------------------------------------

    def read(self) -> CatalogueState:
        """The latest revision (revision 0, no query, when none was written)."""
        revisions = self._revisions()
        if not revisions:
            return CatalogueState(0, ())
        revision = revisions[-1]
        fs, base = filesystem(self._root)
        path = f"{base}/{_relative(revision)}"
        with fs.open_input_stream(path) as handle:
            data = json.loads(handle.read().decode("utf-8"))
        if data.get("version") != CATALOGUE_VERSION or data.get("revision") != revision:
            raise ValueError(f"{path} is not a query catalogue revision {revision} of version {CATALOGUE_VERSION} "
                             f"(version {data.get('version')!r}, revision {data.get('revision')!r})")
        try:
            registrations = tuple(
                Registration(LinearQuery.from_json(json.dumps(item["query"])), item["effective_from"],
                             item.get("retired_from"), str(item.get("registered_at", "")))
                for item in data["queries"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} holds a malformed registration: {exc}") from None
        ids = [r.query_id for r in registrations]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{path} registers a query id twice: it was edited")
        return CatalogueState(revision, tuple(sorted(registrations, key=lambda r: r.query_id)))

    def registrations(self) -> tuple[Registration, ...]:
        return self.read().registrations

    def last_released_window(self) -> int | None:
        """The latest window with a release file under the root (None before the first)."""
        windows = released_windows(self._root)
        return max(windows) if windows else None

    def plan(self, start_window: int, end_window: int) -> list[tuple[LinearQuery, int, int | None]]:
        """Each query active in some window of ``[start_window, end_window]``, with its first
        window and its retirement, by query id (as :meth:`renyi_stream.queries.registry.QueryRegistry.plan`)."""
        return [(r.query, r.effective_from, r.retired_from) for r in self.read().plan(start_window, end_window)]

    def list(self) -> pa.Table:
        """The catalogue, one row per registered query by query id, with the columns of the DuckDB
        store's ``query_catalogue`` view: ``query_id, kind, description, labels, dim, noise_scale,
        effective_from, retired_from, registered_at, spec_json`` (``registered_at`` as text;
        ``noise_scale``: the query's noise std over the ledger's, 1.0 when it declares none)."""
        rows = [{"query_id": r.query_id, "kind": r.query.kind, "description": r.query.description,
                 "labels": list(r.query.labels), "dim": r.query.dim, "noise_scale": r.query.noise_scale,
                 "effective_from": r.effective_from,
                 "retired_from": r.retired_from, "registered_at": r.registered_at, "spec_json": r.query.to_json()}
                for r in self.registrations()]
        schema = pa.schema([("query_id", pa.string()), ("kind", pa.string()), ("description", pa.string()),
                            ("labels", pa.list_(pa.string())), ("dim", pa.int64()), ("noise_scale", pa.float64()),
                            ("effective_from", pa.int64()),
                            ("retired_from", pa.int64()), ("registered_at", pa.string()), ("spec_json", pa.string())])
        return pa.Table.from_pylist(rows, schema=schema)

    def input_contract(self) -> InputContract | None:
        """The input contract recorded under the root (None when no run recorded one).
        ContractError naming the file when it holds no contract."""
        fs, base = filesystem(self._root)
        path = f"{base}/{FOLDER}/{CONTRACT_FILE}"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as handle:
            data = handle.read()
        try:
            return InputContract.from_json(data.decode("utf-8"), where=path)
        except UnicodeDecodeError:
            raise ContractError(f"{path} is not a recorded input contract: not UTF-8 text") from None

    def check_input_contract(self, contract: InputContract) -> None:
        """ContractError naming both when the root records another input contract than
        ``contract``; nothing when it records it or none."""
        self._recorded_contract_is(contract)

    # -- changing (the curator) -------------------------------------------------------------------

    def add(self, query: LinearQuery, *, effective_from: int) -> None:
        """Register ``query`` from ``effective_from`` (:func:`renyi_stream.queries.registration.check_new`:
        ValueError, nothing written, for a taken id, a window not after the last released one,
        too many coordinates together, or a running query too big: docs/running_totals.md, "Bounds"). Re-applied on a newer revision when another writer
        changed the catalogue first."""
        def change(state: CatalogueState) -> tuple[list[Registration], str]:
            new = rules.check_new(state.registrations, query, effective_from,
                                  last_released=self.last_released_window(), registered_at=_now())
            return [*state.registrations, new], f"add {query.query_id} from window {new.effective_from}"

        self._change(change)

    def retire(self, query_id: str, *, from_window: int) -> bool:
        """Stop answering ``query_id`` from ``from_window`` on; from its first window, withdraw it
        (active in no window; its id stays taken): True then
        (:func:`renyi_stream.queries.registration.check_retirement`: ValueError, nothing written, otherwise)."""
        def change(state: CatalogueState) -> tuple[list[Registration], str]:
            retired = rules.check_retirement(state.registrations, query_id, from_window,
                                             last_released=self.last_released_window())
            what = ("withdraw" if retired.retired_from == retired.effective_from else "retire")
            return ([retired if r.query_id == query_id else r for r in state.registrations],
                    f"{what} {query_id} from window {retired.retired_from}")

        self._change(change)
        registration = next(r for r in self.registrations() if r.query_id == query_id)
        return registration.retired_from == registration.effective_from

    # -- changing (a job, at launch) ----------------------------------------------------------------

    def record_launch(self, launch: LaunchQueries) -> int:
        """Write the changes a job decided at launch (:func:`queries_at_launch`) as the next
        revision; returns the revision written (``launch.revision`` when nothing changed).
        CatalogueChanged, nothing written, when the catalogue is no longer at ``launch.revision``:
        the job's plan was made from a catalogue that changed since, and must be made again."""
        if self.read().revision != launch.revision:
            raise CatalogueChanged(f"the query catalogue under {self._root} changed since revision {launch.revision} "
                                   "was read")
        if not launch.changed:
            return launch.revision
        what = [f"register {q} from window {next(r.effective_from for r in launch.registrations if r.query_id == q)}"
                for q in launch.registered]
        what += [f"move {q} from window {old} to {new} (never answered in the windows already charged)"
                 for q, old, new in launch.moved]
        self._write(launch.revision + 1, launch.registrations, "; ".join(what))
        return launch.revision + 1

    def record_input_contract(self, contract: InputContract) -> bool:
        """Record ``contract`` as the root's input contract unless it is recorded: True when this
        call wrote it, False when the root already records it (nothing written). ContractError
        naming both, nothing written, when the root records another: the contract is the
        ledger's for life, and so the root's (:meth:`check_input_contract`)."""
        if self._recorded_contract_is(contract):
            return False
        data = contract.to_json().encode("utf-8")

        def write(fs: pafs.FileSystem, scratch: str) -> None:
            with fs.open_output_stream(scratch) as handle:
                handle.write(data)

        if self.input_contract() is not None:  # another, on a root nothing answered yet: replaced
            fs, base = filesystem(self._root)
            scratch = f"{base}/{FOLDER}/.{CONTRACT_FILE}.{uuid.uuid4().hex}.tmp"
            write(fs, scratch)
            fs.move(scratch, f"{base}/{FOLDER}/{CONTRACT_FILE}")
            return True
        if create_once(self._root, f"{FOLDER}/{CONTRACT_FILE}", write):
            return True
        self._recorded_contract_is(contract)  # another writer recorded one first: the same, or refused
        return False

    def record_promise(self, *, epsilon: float, delta: float, accounting: str, norm_budget: float) -> bool:
        """Record the public promise the root's releases keep (``(epsilon, delta)`` under
        ``accounting``, squared-norm budget ``norm_budget``; what the DuckDB store keeps as
        ``store_meta.promise_*``) as ``_queries/promise.json``, for reports. Written once: True
        when this call wrote it. The ledger's promise is fixed for life, and a root answers one
        ledger (:mod:`renyi_stream.queries.release_lineage`), so a later run never has another to record."""
        record = {"epsilon": repr(float(epsilon)), "delta": repr(float(delta)), "accounting": str(accounting),
                  "norm_budget": repr(float(norm_budget))}
        if self.promise() == record:
            return False
        data = json.dumps(record, sort_keys=True).encode("utf-8")

        def write(fs: pafs.FileSystem, scratch: str) -> None:
            with fs.open_output_stream(scratch) as handle:
                handle.write(data)

        return create_once(self._root, f"{FOLDER}/{PROMISE_FILE}", write)

    def promise(self) -> dict[str, str]:
        """The recorded promise (``epsilon``, ``delta``, ``accounting``, ``norm_budget`` as text),
        or {} when no run recorded one."""
        fs, base = filesystem(self._root)
        path = f"{base}/{FOLDER}/{PROMISE_FILE}"
        if fs.get_file_info(path).type != pafs.FileType.File:
            return {}
        with fs.open_input_stream(path) as handle:
            record = json.loads(handle.read().decode("utf-8"))
        return {key: str(record[key]) for key in ("epsilon", "delta", "accounting", "norm_budget")}

    # -- private ----------------------------------------------------------------------------------

    def _revisions(self) -> list[int]:
        fs, base = filesystem(self._root)
        infos = fs.get_file_info(pafs.FileSelector(f"{base}/{FOLDER}", allow_not_found=True))
        found = []
        for info in infos:
            name = info.base_name
            if info.type == pafs.FileType.File and name.startswith(_PREFIX) and name.endswith(_SUFFIX):
                number = name[len(_PREFIX):-len(_SUFFIX)]
                if number.isdigit():
                    found.append(int(number))
        return sorted(found)

    def _recorded_contract_is(self, contract: InputContract) -> bool:
        """Whether the root records ``contract`` (False: it records none); ContractError naming
        both when it records another."""
        recorded = self.input_contract()
        if recorded is None:
            return False
        if recorded.to_json() != contract.to_json():
            if self._unanswered():
                return False  # recorded by a first run that was refused or failed: nothing answers to it
            raise ContractError(
                f"the release root {self._root} records the input contract {recorded.to_json()} "
                f"({FOLDER}/{CONTRACT_FILE}), and this run's ledger declares {contract.to_json()}: a release root keeps "
                "the contract of the ledger that answers it for life (its default queries and bounds follow from it). "
                "Give the ledger that released there, or another release root")
        return True

    def _unanswered(self) -> bool:
        """Whether nothing here answers to the recorded contract yet: no window released and no
        run's lineage claim (a first run refused after it recorded the contract left only that)."""
        if released_windows(self._root):
            return False
        fs, base = filesystem(self._root)
        claims = fs.get_file_info(pafs.FileSelector(f"{base}/_lineage/after", allow_not_found=True))
        return not any(info.type == pafs.FileType.File for info in claims)

    def _change(self, change) -> None:
        for _ in range(_ATTEMPTS):
            state = self.read()
            registrations, what = change(state)  # ValueError: refused, nothing written
            try:
                self._write(state.revision + 1, registrations, what)
                return
            except CatalogueChanged:
                continue  # another writer took this revision: apply the change to theirs
        raise CatalogueChanged(f"the query catalogue under {self._root} kept changing while this change was "
                               f"written ({_ATTEMPTS} attempts); nothing was written by this one")

    def _write(self, revision: int, registrations: Sequence[Registration], change: str) -> None:
        data = json.dumps({
            "version": CATALOGUE_VERSION, "revision": revision, "written_at": _now(), "change": change,
            "queries": [{"query": json.loads(r.query.to_json()), "effective_from": r.effective_from,
                         "retired_from": r.retired_from, "registered_at": r.registered_at}
                        for r in sorted(registrations, key=lambda r: r.query_id)],
        }, indent=1, sort_keys=True).encode("utf-8")

        def write(fs: pafs.FileSystem, scratch: str) -> None:
            with fs.open_output_stream(scratch) as handle:
                handle.write(data)

        if not create_once(self._root, _relative(revision), write):
            raise CatalogueChanged(f"revision {revision} of the query catalogue under {self._root} was written by "
                                   "another writer first")


def _relative(revision: int) -> str:
    return f"{FOLDER}/{_PREFIX}{int(revision):08d}{_SUFFIX}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


__all__ = ["CATALOGUE_VERSION", "CONTRACT_FILE", "FOLDER", "CatalogueChanged", "CatalogueState", "LaunchQueries", "ReleaseCatalogue",
           "queries_at_launch"]
