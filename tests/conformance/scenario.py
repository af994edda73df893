"""The conformance scenarios as plain data: who sends what on which day, which rows must be
dead-lettered and why, which runs (steps) the jobs are given, and which queries change when.

Every job gets exactly these bytes: each :class:`Message` is written once as an Arrow IPC stream
file (``<name>.arrow``), which ``renyi-stream run`` and ``python -m renyi_stream.pipelines.distributed`` read as
an input file and ``python -m renyi_stream.pipelines.streaming --replay`` replays as one message. So a message
is a file is a message, its row indexes are the same everywhere, and a job that answers
differently answers the same input differently.

The population (``N_USERS`` users, ``norm_budget`` 6 in squared-norm units) is built so that
every outcome of the filter happens: a heavy user (``opened`` 1, ``bought`` 1.5: 3.25 a day) is
admitted on day 0 and dropped (``drop``) or clipped (``clip``) on days 1 and 2; regular users
(at most 1.25 a day) are admitted every day; sparse and random users come and go. Values are
multiples of 1/8, so every admitted sum is exact in float64 under the ``drop`` policy whatever
the order of addition.

Features (:data:`FEATURES`) are named here once; a scenario's :attr:`Scenario.features` are read
off its data, and each adapter declares the features its job supports
(:attr:`tests.conformance.adapters.JobAdapter.supports`).
"""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from renyi_stream.stream.contract import DeclaredColumn, InputContract
from renyi_stream.stream.engine.dead_letters import DeadLetterReason
from renyi_stream.queries.linear import LinearQuery
from renyi_stream.queries.registration import contract_defaults
from renyi_stream.stream.schema import RejectReason

DAY0 = dt.date(2026, 3, 1)
W0 = (DAY0 - dt.date(1970, 1, 1)).days
COLUMNS = ("opened", "bought")
#: Each column's declared bound (issue 28: a new ledger's first run declares its input contract):
#: ``opened`` is 0 or 1, ``bought`` a multiple of 1/8 up to the heavy user's 1.5. The data lie
#: inside, so the default sums, clamped to these bounds, are the plain sums of the rows.
BOUNDS = {"opened": (0.0, 1.0), "bought": (0.0, 1.5)}
N_USERS = 240
FIRST_ID = 1000  # ids 1000..1239: distinct from every count, so a leak of one is never mistaken for an id

# --- features: what a scenario asks of a job -----------------------------------------------------

INT_IDS = "int_ids"
STRING_IDS = "string_ids"
RANGE_RUNS = "range_runs"  # one run over several windows
EMPTY_WINDOW = "empty_window"  # a scheduled window without a row: released as noise only
LATE_ROWS = "late_rows"  # rows of a window an earlier run charged
DUPLICATE_ROWS = "duplicate_rows"  # a second row of one (user, window), later in the same input
DUPLICATES_ACROSS_INPUTS = "duplicates_across_inputs"  # ... in a later input: the first input's row counts
BAD_VALUES = "bad_values"  # null or empty user, NaN, a value that does not parse
OUT_OF_RANGE_ROWS = "out_of_range_rows"  # a row after the run's last window, or before any window
DROP_POLICY = "drop_policy"
CLIP_POLICY = "clip_policy"
REGISTERED_QUERIES = "registered_queries"  # a query registered mid-way
RETIRED_QUERIES = "retired_queries"  # a query retired mid-way
RUNNING_TOTALS = "running_totals"
# What a job does beyond a scenario's data:
CRASH_RECOVERY = "crash_recovery"  # defines crash points (renyi_stream.stream.faults) and recovers from each
REFUSES_UNKNOWN_OPTIONS = "refuses_unknown_options"  # an option it does not know is refused by name

JOB_FEATURES = frozenset({CRASH_RECOVERY, REFUSES_UNKNOWN_OPTIONS})
FEATURES = frozenset({INT_IDS, STRING_IDS, RANGE_RUNS, EMPTY_WINDOW, LATE_ROWS, DUPLICATE_ROWS,
                      DUPLICATES_ACROSS_INPUTS, BAD_VALUES,
                      OUT_OF_RANGE_ROWS, DROP_POLICY, CLIP_POLICY, REGISTERED_QUERIES, RETIRED_QUERIES,
                      RUNNING_TOTALS}) | JOB_FEATURES

# Dead-letter reasons, as the jobs write them (the project's vocabulary, not copies of it).
NULL_USER = RejectReason.NULL_USER_ID.value
EMPTY_USER = RejectReason.EMPTY_USER_ID.value
NON_FINITE = RejectReason.NON_FINITE.value
WRONG_TYPE = RejectReason.WRONG_TYPE.value
DUPLICATE = RejectReason.DUPLICATE.value
OUT_OF_RANGE = RejectReason.OUT_OF_RANGE_TIME.value
LATE = DeadLetterReason.LATE_WINDOW.value
_BAD_VALUE_REASONS = {NULL_USER, EMPTY_USER, NON_FINITE, WRONG_TYPE}


def window(day: int) -> int:
    """The window id of day ``day`` of the scenario (day 0 is :data:`DAY0`)."""
    return W0 + day


def date(day: int) -> str:
    """Day ``day`` as the command lines' ``--start``/``--end`` take it."""
    return (DAY0 + dt.timedelta(days=day)).isoformat()


@dataclass(frozen=True)
class Message:
    """One input: a file for the batch jobs, a message for the streaming job.

    ``dead`` lists the rows that must be dead-lettered, as ``(row index, reason)``; every other
    row is charged (admitted, clipped or dropped). ``opened_as_text``: the ``opened`` column is
    typed string (a producer that sends text), so one value can fail to parse."""

    name: str
    user_id: tuple[Any, ...]
    day: tuple[int, ...]
    opened: tuple[Any, ...]
    bought: tuple[float, ...]
    id_type: str = "int64"
    opened_as_text: bool = False
    dead: tuple[tuple[int, str], ...] = ()

    def table(self) -> pa.Table:
        return pa.table({
            "user_id": pa.array(self.user_id, type=pa.int64() if self.id_type == "int64" else pa.string()),
            "day": pa.array([DAY0 + dt.timedelta(days=d) for d in self.day], type=pa.date32()),
            "opened": pa.array(self.opened, type=pa.string() if self.opened_as_text else pa.float64()),
            "bought": pa.array(self.bought, type=pa.float64()),
        })

    def write(self, folder: Path) -> str:
        """Write the message as ``folder/<name>.arrow`` (an Arrow IPC stream); its path."""
        path = folder / f"{self.name}.arrow"
        table = self.table()
        with ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table)
        return str(path)


@dataclass(frozen=True)
class Step:
    """One run of a job over days ``first_day..last_day`` (its public schedule) with
    ``messages``; ``register`` (query, first day) and ``retire`` (query id, from day) are the
    analysts' changes made before it."""

    first_day: int
    last_day: int
    messages: tuple[Message, ...]
    register: tuple[tuple[LinearQuery, int], ...] = ()
    retire: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        names = [m.name for m in self.messages]
        if names != sorted(names):  # the batch jobs read their inputs in path order
            raise ValueError(f"a step's messages must be named in input order, got {names}")

    @property
    def windows(self) -> list[int]:
        return [window(d) for d in range(self.first_day, self.last_day + 1)]

    @property
    def rows(self) -> int:
        return sum(len(m.user_id) for m in self.messages)

    @property
    def reasons(self) -> dict[str, int]:
        """How many rows must be dead-lettered, by reason."""
        return dict(sorted(collections.Counter(r for m in self.messages for _, r in m.dead).items()))

    def duplicates_across_inputs(self) -> bool:
        """Whether a duplicate row's first (user, window) row is in an earlier input."""
        first: dict[tuple[Any, int], int] = {}
        for k, m in enumerate(self.messages):
            for i, (uid, day) in enumerate(zip(m.user_id, m.day)):
                first.setdefault((uid, day), k)
                if (i, DUPLICATE) in m.dead and first[(uid, day)] != k:
                    return True
        return False

    @property
    def dead(self) -> set[tuple[str, int, str]]:
        """The rows that must be dead-lettered: ``(message file name, row index, reason)``."""
        return {(f"{m.name}.arrow", i, r) for m in self.messages for i, r in m.dead}

    @property
    def dead_rows(self) -> list[tuple[int, str]]:
        """The rows that must be dead-lettered: sorted ``(row index, reason)``."""
        return sorted((i, r) for m in self.messages for i, r in m.dead)


@dataclass(frozen=True)
class Scenario:
    """The steps every job runs, one after the other, on one new ledger, with one promise."""

    name: str
    id_type: str
    policy: str
    steps: tuple[Step, ...]
    n_shards: int = 3
    epsilon: float = 1.0
    delta: float = 1e-6
    norm_budget: float = 6.0
    columns: tuple[str, ...] = COLUMNS

    @property
    def features(self) -> frozenset[str]:
        """The features the scenario's data and steps ask of a job (never the job features)."""
        reasons = {r for step in self.steps for r in step.reasons}
        registered = [q for step in self.steps for q, _ in step.register]
        found = {INT_IDS if self.id_type == "int64" else STRING_IDS,
                 DROP_POLICY if self.policy == "drop" else CLIP_POLICY}
        found |= {RANGE_RUNS} if any(s.last_day > s.first_day for s in self.steps) else set()
        found |= {EMPTY_WINDOW} if self.windows_without_rows() else set()
        found |= {LATE_ROWS} if LATE in reasons else set()
        found |= {DUPLICATE_ROWS} if DUPLICATE in reasons else set()
        found |= {DUPLICATES_ACROSS_INPUTS} if any(s.duplicates_across_inputs() for s in self.steps) else set()
        found |= {OUT_OF_RANGE_ROWS} if OUT_OF_RANGE in reasons else set()
        found |= {BAD_VALUES} if reasons & _BAD_VALUE_REASONS else set()
        found |= {REGISTERED_QUERIES} if registered else set()
        found |= {RETIRED_QUERIES} if any(step.retire for step in self.steps) else set()
        found |= {RUNNING_TOTALS} if any(q.kind == "running" for q in registered) else set()
        return frozenset(found)

    @property
    def contract(self) -> InputContract:
        """The input contract every job's ledger of the scenario is declared with (its first run):
        the scenario's id type, and each column a number within its :data:`BOUNDS`."""
        return InputContract(self.id_type, tuple(DeclaredColumn(c, "number", *BOUNDS[c]) for c in self.columns))

    def declaration(self) -> list[str]:
        """:attr:`contract` as the options every job's command line takes (``--id-type``,
        ``--column NAME=LO:HI``): the same declaration for every job."""
        return ["--id-type", self.id_type, *(option for c in self.contract.columns
                                             for option in ("--column", f"{c.name}={c.lo!r}:{c.hi!r}"))]

    @property
    def windows(self) -> list[int]:
        return [w for step in self.steps for w in step.windows]

    def windows_without_rows(self) -> list[int]:
        """Scheduled windows no row is charged in."""
        charged = set()
        for step in self.steps:
            for m in step.messages:
                dead = {i for i, _ in m.dead}
                charged |= {window(d) for i, d in enumerate(m.day) if i not in dead}
        return [w for w in self.windows if w not in charged]

    def query_plan(self) -> list[tuple[LinearQuery, int, int | None]]:
        """The public catalogue the scenario makes: ``(query, first window, retired from)``. The
        default per-column window sums of the declared contract (each column clamped to its
        bound) from the first window, then the steps' changes."""
        plan = {q.query_id: [q, self.windows[0], None] for q in contract_defaults(self.contract)}
        for step in self.steps:
            for query, day in step.register:
                plan[query.query_id] = [query, window(day), None]
            for query_id, day in step.retire:
                plan[query_id][2] = window(day)
        return [tuple(entry) for _, entry in sorted(plan.items())]

    def release_keys(self) -> set[tuple[str, int, int]]:
        """Every ``(query id, window, coordinate)`` the public schedule releases, once each."""
        return {(q.query_id, w, c) for q, first, retired in self.query_plan() for w in self.windows
                if first <= w and (retired is None or w < retired) for c in range(q.dim)}


# --- the data --------------------------------------------------------------------------------------


def _uid(i: int, id_type: str) -> Any:
    return FIRST_ID + i if id_type == "int64" else f"u{FIRST_ID + i}"


def _population(seed: int) -> dict[int, list[tuple[int, float, float]]]:
    """``day -> [(user index, opened, bought)]`` for days 0..2 (day 3 has no rows), by user kind
    ``i % 6``: 0 heavy (every day), 1-2 regular (every day), 3 sparse (days 0 and 2), 4 random
    (each day with probability 1/2), 5 day 0 only."""
    rng = np.random.default_rng(seed)
    days: dict[int, list[tuple[int, float, float]]] = {0: [], 1: [], 2: []}
    for day in days:
        present = rng.random(N_USERS) < 0.5
        opened_bit = rng.integers(0, 2, N_USERS)
        eighths = rng.integers(0, 8, N_USERS)  # bought in {0, 1/8, ..., 7/8}
        for i in range(N_USERS):
            kind = i % 6
            if kind == 0:
                days[day].append((i, 1.0, 1.5))
            elif kind in (1, 2):
                days[day].append((i, 1.0, (i % 5) / 8))
            elif kind == 3 and day in (0, 2):
                days[day].append((i, float(day == 0), 0.25))
            elif kind == 4 and present[i]:
                days[day].append((i, float(opened_bit[i]), eighths[i] / 8))
            elif kind == 5 and day == 0:
                days[day].append((i, 1.0, 0.125))
    return days


class _Builder:
    """Rows of one message; bad rows are added with the reason they must get."""

    def __init__(self, name: str, id_type: str, *, opened_as_text: bool = False) -> None:
        self.name, self.id_type, self.as_text = name, id_type, opened_as_text
        self.ids: list[Any] = []
        self.days: list[int] = []
        self.opened: list[Any] = []
        self.bought: list[float] = []
        self.dead: list[tuple[int, str]] = []

    def add(self, uid: Any, day: int, opened: Any, bought: float, dead: str | None = None) -> "_Builder":
        if dead is not None:
            self.dead.append((len(self.ids), dead))
        self.ids.append(uid)
        self.days.append(day)
        self.opened.append(_text(opened) if self.as_text and not isinstance(opened, str) else opened)
        self.bought.append(bought)
        return self

    def rows(self, day: int, rows: list[tuple[int, float, float]]) -> "_Builder":
        for i, opened, bought in rows:
            self.add(_uid(i, self.id_type), day, opened, bought)
        return self

    def message(self) -> Message:
        return Message(self.name, tuple(self.ids), tuple(self.days), tuple(self.opened), tuple(self.bought),
                       self.id_type, self.as_text, tuple(self.dead))


def _text(value: float) -> str:
    return repr(float(value))


def _steps(id_type: str, seed: int) -> tuple[Step, Step, Step]:
    """Three runs: days 0-1 (a range; three messages, one of them mixing both days), day 2 (with
    a late row for day 0, a row for day 3, after the run's schedule, and one for day -1, before
    any schedule), day 3 (no rows)."""
    days = _population(seed)

    def uid(i: int) -> Any:
        return _uid(i, id_type)

    first, second = [r for r in days[0] if r[0] < N_USERS // 2], [r for r in days[0] if r[0] >= N_USERS // 2]
    d1a, d1b = [r for r in days[1] if r[0] < N_USERS // 2], [r for r in days[1] if r[0] >= N_USERS // 2]
    m0 = _Builder("s1-m0", id_type).rows(0, first)
    m0.add(None, 0, 1.0, 0.0, dead=NULL_USER)
    m0.add(uid(N_USERS + 1), 0, float("nan"), 0.0, dead=NON_FINITE)  # a user never seen otherwise
    i, opened, bought = first[3]
    m0.add(uid(i), 0, opened, bought, dead=DUPLICATE)  # the same (user, day 0) again, later: dead
    if id_type == "string":
        m0.add("", 0, 1.0, 0.0, dead=EMPTY_USER)
    m1 = _Builder("s1-m1", id_type).rows(0, second).rows(1, d1a)
    m2 = _Builder("s1-m2", id_type, opened_as_text=True).rows(1, d1b)
    m2.add(uid(N_USERS + 2), 1, "x", 0.5, dead=WRONG_TYPE)  # a value that does not parse
    step1 = Step(0, 1, (m0.message(), m1.message(), m2.message()))

    d2a, d2b = [r for r in days[2] if r[0] < N_USERS // 2], [r for r in days[2] if r[0] >= N_USERS // 2]
    n0 = _Builder("s2-m0", id_type).rows(2, d2a)
    n0.add(uid(7), 0, 1.0, 1.0, dead=LATE)  # day 0 was charged (and released) by the first run
    n0.add(uid(8), 3, 1.0, 0.0, dead=OUT_OF_RANGE)  # day 3: after this run's last window
    n1 = _Builder("s2-m1", id_type).rows(2, d2b)
    i, opened, bought = d2b[0]
    n1.add(uid(i), 2, opened, bought, dead=DUPLICATE)
    n1.add(uid(9), -1, 1.0, 0.0, dead=OUT_OF_RANGE)  # the day before the first window: never released
    step2 = Step(2, 2, (n0.message(), n1.message()))
    step3 = Step(3, 3, (_Builder("s3-m0", id_type).message(),))  # the empty day: a header, no rows
    return step1, step2, step3


def _int_scenario() -> Scenario:
    return Scenario("int-ids", "int64", "drop", _steps("int64", seed=19))


def _string_scenario() -> Scenario:
    """Text ids, policy ``clip``; the first two runs (the empty day is the int-id scenario's)."""
    return Scenario("string-ids", "string", "clip", _steps("string", seed=23)[:2])


def _query_scenario() -> Scenario:
    """The int-id data; before day 2 a window query, ``bought`` clamped to ``[0, 1/4]``, is
    registered from day 2, and before day 3 the daily sum of ``bought`` is retired from day 3.
    Clamped multiples of 1/8 stay multiples of 1/8 (exact sums under ``drop``); the clamp adds at
    most 1/16 to a day's squared norm, so the filter's outcomes stay those of the population."""
    step1, step2, step3 = _steps("int64", seed=29)
    capped = LinearQuery.clamp("capped:bought", "bought", 0.0, 0.25, description="bought, at most 1/4")
    step2 = Step(step2.first_day, step2.last_day, step2.messages, register=((capped, 2),))
    step3 = Step(step3.first_day, step3.last_day, step3.messages, retire=(("sum:bought", 3),))
    return Scenario("queries", "int64", "drop", (step1, step2, step3))


def _scaled_scenario() -> Scenario:
    """The int-id data; before day 2 two window queries with their own noise scales are registered
    from day 2 (issue 39, item 4): ``opened`` released at twice the ledger's noise std (charged a
    quarter) and ``bought`` clamped to ``[0, 1/4]`` at half of it (charged four times). Every job
    must charge ``||q_k(x)||^2 / (2 s^2 m_k^2)`` per query and report ``m_k * s`` as the rows'
    ``noise_std`` (compared across jobs: the same ledger, the same public part); under ``drop`` the
    admitted values are unscaled multiples of 1/8, so the sums stay exact."""
    step1, step2, step3 = _steps("int64", seed=41)
    coarse = LinearQuery.columns("coarse:opened", ["opened"], noise_scale=2.0,
                                 description="opened, at twice the ledger's noise std")
    fine = LinearQuery.clamp("fine:bought", "bought", 0.0, 0.25, noise_scale=0.5,
                             description="bought, at most 1/4, at half the ledger's noise std")
    step2 = Step(step2.first_day, step2.last_day, step2.messages, register=((coarse, 2), (fine, 2)))
    return Scenario(SCALED, "int64", "drop", (step1, step2, step3))


def _running_scenario() -> Scenario:
    """The int-id data; before day 2 a running total of both columns is registered from day 2.
    A job that does not offer running totals must refuse the run of day 2 at launch, naming the
    query (it is never answered silently as less than the catalogue asks)."""
    step1, step2, step3 = _steps("int64", seed=31)
    both = LinearQuery.columns("total:both", list(COLUMNS), kind="running",
                               description="running total of opened and bought")
    step2 = Step(step2.first_day, step2.last_day, step2.messages, register=((both, 2),))
    return Scenario(RUNNING_TOTAL, "int64", "drop", (step1, step2, step3))


def _running_tree_scenario() -> Scenario:
    """The running-total scenario under the binary-tree strategy over a declared 8 windows, with
    a fourth run (day 4) whose users are day 1's: users admitted to the running total by one run
    come back in a later one, so their prepaid rows must have been stored and restored by the
    job, after a run over a window without rows (day 3)."""
    step1, step2, step3 = _steps("int64", seed=37)
    tree = LinearQuery.columns("total:tree", list(COLUMNS), kind="running", strategy="tree", horizon=8,
                               description="running total of opened and bought, binary tree over 8 days")
    step2 = Step(step2.first_day, step2.last_day, step2.messages, register=((tree, 2),))
    again = _Builder("s4-m0", "int64").rows(4, _population(37)[1])
    return Scenario(RUNNING_TREE, "int64", "drop", (step1, step2, step3, Step(4, 4, (again.message(),))))


#: The scenario registering a running total (:func:`_running_scenario`), and the one under
#: another strategy whose users come back after a restore (:func:`_running_tree_scenario`).
RUNNING_TOTAL = "running-total"
RUNNING_TREE = "running-tree"
#: The scenario registering window queries with their own noise scales (:func:`_scaled_scenario`).
SCALED = "noise-scales"
SCENARIOS = {s.name: s for s in (_int_scenario(), _string_scenario(), _query_scenario(), _running_scenario(),
                                 _running_tree_scenario(), _scaled_scenario())}
#: The scenario the crash tests interrupt (its first step: two windows, so a crash can fall between them).
CRASH_SCENARIO = "int-ids"


TIE_BREAK = "tie-break"


def tie_break_scenario(first: str = "tie-a", second: str = "tie-b") -> Scenario:
    """Two inputs of one run, ``first`` and ``second`` (names in input order), each holding a row
    of the same (user, day 0) with different values: the row of the input given first counts
    (invariant 2 (charge-in-event-time-order, docs/architecture.md): rows of a window are taken
    in input order, by (input, row)), the other is a ``duplicate_user_window``."""
    a = _Builder(first, "int64").add(FIRST_ID + 1, 0, 1.0, 0.0).add(FIRST_ID + 2, 0, 1.0, 1.0)
    b = _Builder(second, "int64").add(FIRST_ID + 1, 0, 0.0, 1.0, dead=DUPLICATE)
    return Scenario(TIE_BREAK, "int64", "drop", (Step(0, 0, (a.message(), b.message())),), n_shards=2)
