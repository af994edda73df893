"""One adapter per job: how to run a step of a scenario, crash one, recover, and read the outcome.

Each adapter drives its job through its own command line (the ``main(argv)`` of its entry
point, in this process; in a child process for a crash), as an operator would, on files in its
own folder: the public ``--releases-parquet`` root ``public/`` and the job's curator files. Each
declares what its job supports (:attr:`JobAdapter.supports`, names from
:data:`tests.conformance.scenario.FEATURES`) and the crash points it can be killed at
(:data:`renyi_stream.stream.faults.CRASH_ENV`). The tests derive their expected failures from these
declarations, so:

* a job that gains a feature while its adapter does not declare it XPASSes a strict xfail,
  which fails: declare it;
* a declaration without the feature fails its tests outright.

The analysts' query changes of a step are made before its run through the job's catalogue, as
``renyi-stream query add|retire`` makes them (:func:`ask_catalogue`): the daily job's DuckDB
registry (``--store``), the distributed and streaming jobs' catalogue beside their release root
(``--releases-parquet``, :mod:`renyi_stream.queries.catalogue`). A running total is registered there too, as a
catalogue written by a later version could hold one (the command line refuses ``--kind running``
with ``--releases-parquet``): the jobs that do not offer running totals must refuse it at launch,
by name.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from . import scenario as sc
from .crash import run_killed_at
from .outcome import Outcome, RunBooks, read_release_files, reasons_of


@dataclass(frozen=True)
class Ran:
    """A run's exit status and what it wrote to stderr."""

    code: int
    err: str


class RunFailed(AssertionError):
    """A step's run exited with a non-zero status: the ``step`` and how it ended (``ran``)."""

    def __init__(self, job: str, step: sc.Step, ran: Ran) -> None:
        super().__init__(f"{job} failed on days {step.first_day}-{step.last_day} (exit status {ran.code}): "
                         f"{ran.err[-3000:]}")
        self.step, self.ran = step, ran


class JobAdapter:
    """A job, one ledger, one scenario: run its steps in order under ``root``.

    ``inputs`` maps each message name of the scenario to its file; ``key_path`` is the noise key
    every job of a test session shares (two ledgers under one key draw independent noise)."""

    name = ""
    module = ""  # python -m <module>
    supports: frozenset[str] = frozenset()
    crash_points: tuple[str, ...] = ()
    #: Crash points at which the run has committed (so recovering takes one more run).
    committed_at: frozenset[str] = frozenset()
    #: Whether a crashed run is recovered by re-running it into its own state, so that the
    #: recovered run's books are the uninterrupted run's whatever it had committed.
    resumes_in_place: bool = False

    def __init__(self, root: Path, scenario: sc.Scenario, key_path: str, inputs: dict[str, str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.scenario = scenario
        self.key_path = key_path
        self.inputs = inputs
        self.public = self.root / "public"

    # --- what each job defines --------------------------------------------------------------------

    def argv(self, step: sc.Step) -> list[str]:
        """The job's command line for ``step`` (after the module name)."""
        raise NotImplementedError

    def main(self, argv: list[str]) -> int:
        """The entry point's ``main(argv)``, in this process."""
        raise NotImplementedError

    def ask(self, step: sc.Step) -> None:
        """Make the analysts' query changes of ``step`` before its run: here through the query
        catalogue beside the release root (:class:`renyi_stream.queries.catalogue.ReleaseCatalogue`), which the
        distributed and streaming jobs answer."""
        if step.register or step.retire:
            from renyi_stream.queries.catalogue import ReleaseCatalogue

            ask_catalogue(ReleaseCatalogue(str(self.public)), step)

    def committed(self, step: sc.Step) -> None:
        """Record that ``step``'s run finished (where its outputs are, for the next run)."""

    def durable_windows(self, step: sc.Step, point: str) -> set[int]:
        """The windows of ``step`` whose charge is durable after its run was killed at ``point``:
        only their releases may be public. Every window once the run committed, else none."""
        return set(step.windows) if point in self.committed_at else set()

    def recover(self, step: sc.Step, point: str) -> None:
        """Finish ``step`` after its run was killed at ``point``, as the job's recovery rule says."""
        self.run(step)

    def outcome(self) -> Outcome:
        raise NotImplementedError

    # --- the same for every job -------------------------------------------------------------------

    def paths(self, step: sc.Step) -> list[str]:
        """The step's input files, in input order (the batch jobs' file order)."""
        return sorted(self.inputs[m.name] for m in step.messages)

    def common(self, step: sc.Step) -> list[str]:
        """The options every job shares (renyi_stream.pipelines.beam.job_options.add_promise_options); the
        scenario's input contract on the ledger's first run (:meth:`declaration`)."""
        s = self.scenario
        return ["--start", sc.date(step.first_day), "--end", sc.date(step.last_day), "--epsilon", repr(s.epsilon),
                "--delta", repr(s.delta), "--norm-budget", repr(s.norm_budget), "--releases-parquet",
                str(self.public), "--shards", str(s.n_shards), "--policy", s.policy, *self.declaration(step)]

    def declaration(self, step: sc.Step) -> list[str]:
        """The ledger's input contract (:meth:`scenario.Scenario.declaration`, the same for every
        job) when ``step`` is the scenario's first run, which makes the ledger; later runs give
        none and go on under the contract their ledger records (issue 28). A first run killed and
        recovered, or re-run, declares it again: the same contract, which the ledger accepts."""
        return self.scenario.declaration() if step == self.scenario.steps[0] else []

    def attempt(self, step: sc.Step, *, extra: Sequence[str] = ()) -> Ran:
        """Run ``step`` (its query changes first), with ``extra`` options; the exit status and
        stderr, whatever they are."""
        self.ask(step)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = self.main(self.argv(step) + list(extra))
            except SystemExit as exc:  # argparse's exits
                code = exc.code if isinstance(exc.code, int) else 2
        return Ran(int(code), err.getvalue())

    def run(self, step: sc.Step) -> None:
        """Run ``step``; it must succeed with balanced books (exit status 0), else :class:`RunFailed`."""
        ran = self.attempt(step)
        if ran.code != 0:
            raise RunFailed(self.name, step, ran)
        self.committed(step)

    def crash(self, step: sc.Step, point: str) -> None:
        """Run ``step`` in a child process that kills itself (SIGKILL) at crash point ``point``."""
        self.ask(step)
        result = run_killed_at(point, ["-m", self.module, *self.argv(step)])
        assert result.returncode == -9, f"{self.name} did not die at {point}: {result.stderr[-3000:]}"


def ask_catalogue(catalogue, step: sc.Step) -> None:
    """Register and retire ``step``'s queries in ``catalogue`` (a
    :class:`renyi_stream.queries.registry.QueryRegistry` or :class:`renyi_stream.queries.catalogue.ReleaseCatalogue`: the
    same calls and rules), each once: a re-run after a crash asks again."""
    listed = {row["query_id"]: row for row in catalogue.list().to_pylist()}
    for query, day in step.register:
        if query.query_id not in listed:
            catalogue.add(query, effective_from=sc.window(day))
    for query_id, day in step.retire:
        if listed[query_id]["retired_from"] is None:
            catalogue.retire(query_id, from_window=sc.window(day))


def _query(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as db:
        return db.execute(sql).fetchall()


def _ledger_rows(table: pa.Table) -> dict:
    cols = [table.column(c).to_pylist() for c in ("user_id", "used", "tracker_segment", "tracker_bound")]
    return {u: (used, seg, bound) for u, used, seg, bound in zip(*cols)}


def _dead_rows(run: int, tables: Sequence[pa.Table]) -> list[tuple[int, str, int, str]]:
    return [(run, Path(r["source"]).name, int(r["row_index"]), r["reason"]) for t in tables for r in t.to_pylist()]


class DailyJob(JobAdapter):
    """``renyi-stream run`` (pipelines/cli/main.py -> renyi_stream.pipelines.daily.job.run_job): a DuckDB release
    store, a DuckDB curator ledger, and the release files under ``--releases-parquet``."""

    name = "daily"
    module = "renyi_stream.pipelines.cli.main"
    supports = sc.FEATURES
    crash_points = ("while_reading", "after_ledger_write", "before_publish", "during_release_insert",
                    "during_publish", "after_publish")
    committed_at = frozenset({"before_publish", "during_release_insert", "during_publish", "after_publish"})

    @property
    def store(self) -> Path:
        return self.root / "releases.duckdb"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.duckdb"

    def argv(self, step: sc.Step) -> list[str]:
        return ["run", "--input", *self.paths(step), "--store", str(self.store), "--ledger", str(self.ledger),
                "--noise-key", self.key_path, *self.common(step), "--quiet"]

    def main(self, argv: list[str]) -> int:
        from renyi_stream.pipelines.cli.main import main

        return main(argv)

    def ask(self, step: sc.Step) -> None:
        """Through the query registry of the release store (``renyi-stream query add|retire --store``)."""
        if step.register or step.retire:
            from renyi_stream.queries.registry import QueryRegistry

            with QueryRegistry(str(self.store)) as registry:
                ask_catalogue(registry, step)

    def store_releases(self) -> tuple[dict, ...]:
        """The release store's rows (the daily job's public DuckDB store), as the release files'."""
        from renyi_stream.queries.release_store import ReleaseStore

        with ReleaseStore(str(self.store), read_only=True) as store:
            return tuple(store.read().drop_columns(["released_at"]).to_pylist())

    def outcome(self) -> Outcome:
        runs = _query(self.ledger,
                      "SELECT run_id, rows_read, admitted, clipped, dropped FROM run_counts ORDER BY run_id")
        dead = _query(self.ledger, "SELECT run_id, source, row_index, reason FROM dead_letters")
        index = {run_id: i for i, (run_id, *_) in enumerate(runs)}
        books = tuple(RunBooks(rows, a, c, d, reasons_of(r for run, _, _, r in dead if run == run_id))
                      for run_id, rows, a, c, d in runs)
        ledger = _query(self.ledger, "SELECT user_id, used, tracker_segment, tracker_bound FROM ledger")
        (ledger_id,) = _query(self.ledger, "SELECT value FROM meta WHERE key = 'ledger_id'")[0]
        return Outcome(releases=read_release_files(self.public), ledger_id=ledger_id,
                       ledger={u: (used, seg, bound) for u, used, seg, bound in ledger}, runs=books,
                       dead=tuple(sorted((index[run], Path(src).name, row, reason) for run, src, row, reason in dead)))


class DistributedJob(JobAdapter):
    """``python -m renyi_stream.pipelines.distributed``: one run per step, each continuing the previous run's
    ``--output`` (``--previous-ledger``), releases under ``--releases-parquet``."""

    name = "distributed"
    module = "renyi_stream.pipelines.distributed"
    supports = sc.FEATURES
    # while_reading is in the read step both batch jobs share (renyi_stream.pipelines.beam.transforms.ReadAndValidate);
    # during_publish and after_publish in the publication rule all jobs share (renyi_stream.stream.engine.publication).
    crash_points = ("while_reading", "distributed_before_commit", "distributed_before_promote",
                    "distributed_after_claim", "during_publish", "after_publish")
    committed_at = frozenset({"distributed_before_promote", "distributed_after_claim", "during_publish",
                              "after_publish"})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outputs: list[Path] = []  # every committed run's --output, in order
        self.previous = "none"

    def _output(self) -> Path:
        return self.root / "curator" / f"run{len(self.outputs) + 1}"

    def argv(self, step: sc.Step) -> list[str]:
        return ["--input", *self.paths(step), *self.common(step), "--previous-ledger", self.previous,
                "--output", str(self._output()), "--noise-key", self.key_path, "--quiet"]

    def main(self, argv: list[str]) -> int:
        from renyi_stream.pipelines.distributed.job import main

        return main(argv)

    def committed(self, step: sc.Step) -> None:
        self.outputs.append(self._output())
        self.previous = str(self.outputs[-1])

    def recover(self, step: sc.Step, point: str) -> None:
        """A run killed before its commit is re-run into its own ``--output`` (its intent fixed
        its inputs and ledger id); a committed one is continued by the next run, which publishes
        what it left staged: here the same step again, which charges nobody (deploy/README.md)."""
        from renyi_stream.pipelines.distributed.job import COMMITTED

        if (self._output() / COMMITTED).exists():
            self.committed(step)
        self.run(step)

    def outcome(self) -> Outcome:
        from renyi_stream.pipelines.distributed.job import COMMITTED

        manifests = [json.loads((out / COMMITTED).read_text()) for out in self.outputs]
        books, dead = [], []
        for run, manifest in enumerate(manifests):
            t = manifest["totals"]
            books.append(RunBooks(t["rows_read"], t["admitted"], t["clipped"], t["dropped"],
                                  dict(sorted(manifest["dead_reasons"].items()))))
            dead += _dead_rows(run, [pq.read_table(f) for f in manifest["dead_files"]])
        last = manifests[-1]
        ledger = pa.concat_tables([pq.read_table(f).replace_schema_metadata(None) for f in last["ledger_files"]])
        return Outcome(releases=read_release_files(self.public), ledger_id=last["parameters"]["ledger_id"],
                       ledger=_ledger_rows(ledger), runs=tuple(books), dead=tuple(sorted(dead)))


class StreamingJob(JobAdapter):
    """``python -m renyi_stream.pipelines.streaming --replay``: each step a job over its windows, replaying the
    step's messages in order, continuing from the previous job's snapshot of the last released
    window (``--previous-ledger``); window files, ledger snapshots and books under its
    ``--output``. A crashed job is recovered by running its command again (the same ``--output``):
    it continues from the last window it committed there."""

    name = "streaming"
    module = "renyi_stream.pipelines.streaming"
    supports = sc.FEATURES
    # Each write of a window's commit (renyi_stream.pipelines.streaming.commits, WindowCommits), then the publication
    # rule's after_publish; its during_publish needs two windows committed at once, which a replay's
    # window-by-window commits do not reliably give (the daily and distributed jobs exercise it).
    crash_points = ("streaming_after_snapshot", "streaming_after_stage", "streaming_after_commit", "after_publish")
    resumes_in_place = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outputs: list[Path] = []
        self.last_window: int | None = None

    def _output(self) -> Path:
        return self.root / "curator" / f"job{len(self.outputs) + 1}"

    def _previous(self) -> str:
        if not self.outputs:
            return "none"
        return f"{self.outputs[-1]}/ledger/window_id={self.last_window}/*/*.parquet"

    def argv(self, step: sc.Step) -> list[str]:
        return ["--replay", *self.paths(step), *self.common(step),
                "--output", str(self._output()), "--noise-key", self.key_path, "--previous-ledger", self._previous()]

    def main(self, argv: list[str]) -> int:
        from renyi_stream.pipelines.streaming.beam.job import main

        return main(argv)

    def committed(self, step: sc.Step) -> None:
        self.outputs.append(self._output())
        self.last_window = step.windows[-1]

    def durable_windows(self, step: sc.Step, point: str) -> set[int]:
        """Windows every shard of which has its ledger snapshot written in the crashed job's
        ``--output``: read from the files, not from the job's commit markers."""
        ledger = self._output() / "ledger"
        return {w for w in step.windows
                if all(any((ledger / f"window_id={w}" / f"shard={s}").glob("*.parquet"))
                       for s in range(self.scenario.n_shards))}

    def outcome(self) -> Outcome:
        from renyi_stream.pipelines.streaming.books import books
        from renyi_stream.pipelines.streaming.file_metadata import SNAPSHOT_LEDGER_ID

        runs, dead = [], []
        for run, out in enumerate(self.outputs):
            b = books(str(out))
            letters = [pq.read_table(f) for f in sorted((out / "dead").rglob("*.parquet"))]
            runs.append(RunBooks(b["rows_read"], b["admitted"], b["clipped"], b["dropped"],
                                 reasons_of(r for t in letters for r in t.column("reason").to_pylist())))
            dead += _dead_rows(run, letters)
        snapshots = [pq.read_table(f) for f in
                     sorted((self.outputs[-1] / "ledger" / f"window_id={self.last_window}").glob("shard=*/*.parquet"))]
        (ledger_id,) = {t.schema.metadata[SNAPSHOT_LEDGER_ID.encode()].decode() for t in snapshots}
        ledger = pa.concat_tables([t.replace_schema_metadata(None) for t in snapshots])
        return Outcome(releases=read_release_files(self.public), ledger_id=ledger_id, ledger=_ledger_rows(ledger),
                       runs=tuple(runs), dead=tuple(sorted(dead)))


JOBS: dict[str, type[JobAdapter]] = {job.name: job for job in (DailyJob, DistributedJob, StreamingJob)}
#: The job the others are compared with: it answers every feature of the scenarios.
REFERENCE = DailyJob.name
