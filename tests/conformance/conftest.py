"""Fixtures of the conformance suite: the session's noise key, the scenarios' input files, and
each job's uninterrupted run of each scenario (run once, on first use, and kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from renyi_stream.stream.noise import NoiseKey

from . import scenario as sc
from .adapters import JOBS, JobAdapter, RunFailed
from .outcome import Outcome


def write_inputs(folder: Path, scenario: sc.Scenario) -> dict[str, str]:
    """Write every message of ``scenario`` under ``folder``; ``message name -> path``."""
    folder.mkdir(parents=True, exist_ok=True)
    return {m.name: m.write(folder) for step in scenario.steps for m in step.messages}


def names_a_hash_would_order_the_other_way(folder: Path) -> tuple[str, str]:
    """Two input names in input order whose paths under ``folder`` a hash of the name orders the
    other way round (the streaming job numbers Pub/Sub and Kafka messages by such a hash,
    ``renyi_stream.pipelines.streaming.codec._source_number``, and must number replayed files by their order): a
    job that breaks ties between inputs by it keeps the second input's row. Any pair once no such
    hash exists."""
    from renyi_stream.pipelines.streaming import codec

    number = getattr(codec, "_source_number", None)
    for k in range(256):
        first, second = f"tie-{k:03d}-a", f"tie-{k:03d}-b"
        if number is None or number(str(folder / f"{first}.arrow")) > number(str(folder / f"{second}.arrow")):
            return first, second
    raise AssertionError("no such pair of names")  # each pair is a coin flip: 2^-256


class CleanRuns:
    """Each job's uninterrupted run of each scenario (:data:`scenario.SCENARIOS` and the
    tie-break scenario): the outcome after every step, computed on first use (inside the test
    that asks, so that a job failing on a scenario fails, or xfails, that test) and kept for the
    session, failures included."""

    def __init__(self, root: Path, key: Path) -> None:
        self.root = root
        self.key = key
        self._scenarios = dict(sc.SCENARIOS)
        self._inputs: dict[str, dict[str, str]] = {}
        self._adapters: dict[tuple[str, str], JobAdapter] = {}
        self._done: dict[tuple[str, str], list[Outcome] | BaseException] = {}

    def scenario(self, name: str) -> sc.Scenario:
        if name == sc.TIE_BREAK and name not in self._scenarios:
            names = names_a_hash_would_order_the_other_way(self.root / "inputs" / name)
            self._scenarios[name] = sc.tie_break_scenario(*names)
        return self._scenarios[name]

    def inputs(self, name: str) -> dict[str, str]:
        if name not in self._inputs:
            self._inputs[name] = write_inputs(self.root / "inputs" / name, self.scenario(name))
        return self._inputs[name]

    def adapter(self, job: str, name: str, folder: Path) -> JobAdapter:
        """A fresh adapter of ``job`` for scenario ``name`` in ``folder`` (the session's key and inputs)."""
        return JOBS[job](folder, self.scenario(name), str(self.key), self.inputs(name))

    def ran(self, job: str, name: str) -> JobAdapter:
        """The adapter that made ``job``'s uninterrupted run of scenario ``name`` (its files)."""
        self.after_each_step(job, name)
        return self._adapters[(job, name)]

    def failed(self, job: str, name: str) -> tuple[RunFailed, JobAdapter]:
        """How ``job``'s uninterrupted run of scenario ``name`` failed, and the adapter (its files as
        the failed run left them). AssertionError when every step succeeded."""
        try:
            self.after_each_step(job, name)
        except RunFailed as exc:
            return exc, self._adapters[(job, name)]
        raise AssertionError(f"the {job} job ran every step of scenario {name}")

    def after_each_step(self, job: str, name: str) -> list[Outcome]:
        """The outcome after each step of ``job``'s uninterrupted run of scenario ``name``."""
        if (job, name) not in self._done:
            try:
                adapter = self._adapters[(job, name)] = self.adapter(job, name, self.root / "clean" / name / job)
                outcomes = []
                for step in adapter.scenario.steps:
                    adapter.run(step)
                    outcomes.append(adapter.outcome())
                self._done[(job, name)] = outcomes
            except Exception as exc:  # kept: every test asking again fails the same way, at once
                self._done[(job, name)] = exc
        done = self._done[(job, name)]
        if isinstance(done, BaseException):
            raise done
        return done

    def final(self, job: str, name: str) -> Outcome:
        return self.after_each_step(job, name)[-1]


@pytest.fixture(scope="session")
def noise_key(tmp_path_factory) -> tuple[Path, NoiseKey]:
    """One noise key for every job and ledger of the session (each ledger draws its own noise)."""
    path = tmp_path_factory.mktemp("conformance-key") / "noise.key"
    return path, NoiseKey.load_or_create(path)


@pytest.fixture(scope="session")
def clean(tmp_path_factory, noise_key) -> CleanRuns:
    return CleanRuns(tmp_path_factory.mktemp("conformance"), noise_key[0])
