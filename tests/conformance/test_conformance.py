"""One scenario, three jobs: the same public releases, the same ledger, the same row books
(issue 19, item 3; docs/architecture.md, "Where the code is going").

Every scenario of :mod:`.scenario` runs through ``renyi-stream run``, ``python -m
renyi_stream.pipelines.distributed`` and ``python -m renyi_stream.pipelines.streaming --replay``, step by step on one new
ledger each (:mod:`.adapters`), and is read back in one common form (:mod:`.outcome`). Per job:
every run reads every row and dead-letters exactly the scenario's bad rows with their reasons
(invariant 7 (rows-counted-not-lost, docs/architecture.md)), every window of the schedule is
released once for every query active in it (invariants 3 and 5), no user passes the budget.
Across jobs, against the daily job (which answers every feature): the releases less each
ledger's own noise, every user's used budget (exactly), the row books and the dead letters. A run
killed at each crash point a job defines recovers to the uninterrupted outcome.

Expected failures are derived from what each adapter declares its job supports: a case whose
scenario uses a feature the job lacks is ``xfail(strict=True)`` naming it, so it fails (XPASS)
the day the job answers it and its adapter still says it cannot.
"""

from __future__ import annotations

import ast

import pytest

from renyi_stream.stream.accounting import calibrate

from . import scenario as sc
from .adapters import JOBS, REFERENCE
from .crash import ROOT
from .outcome import SUM_TOLERANCE, differing_sums, public_part, read_release_files, without_noise

SCENARIOS = sc.SCENARIOS


def _lacks(job: str, features: frozenset[str]) -> list[str]:
    return sorted(features - JOBS[job].supports)


def _case(job: str, features: frozenset[str], *values, case_id: str):
    lacking = {j: _lacks(j, features) for j in dict.fromkeys([job, REFERENCE]) if _lacks(j, features)}
    marks = [pytest.mark.xfail(strict=True, reason="; ".join(f"the {j} job lacks {', '.join(f)}"
                                                          for j, f in lacking.items()))] if lacking else []
    return pytest.param(*values, marks=marks, id=case_id)


def _per_job(only=lambda s: True, ignoring: frozenset[str] = frozenset()):
    """Every (job, scenario) case, xfail where the job lacks a feature of the scenario other than
    ``ignoring`` (features the tested behaviour must not depend on)."""
    return [_case(job, s.features - ignoring, job, s.name, case_id=f"{job}-{s.name}")
            for s in SCENARIOS.values() if only(s) for job in JOBS]


def _across_jobs():
    return [_case(job, s.features, job, s.name, case_id=f"{job}-vs-{REFERENCE}-{s.name}")
            for s in SCENARIOS.values() for job in JOBS if job != REFERENCE]


# --- per job: the scenario's own expectations --------------------------------------------------------


@pytest.mark.parametrize("job, name", _per_job())
def test_every_run_reads_every_row_and_dead_letters_each_bad_row_with_its_reason(clean, job, name):
    scenario, outcome = SCENARIOS[name], clean.final(job, name)
    got = [(b.rows_read, b.reasons, outcome.dead_rows_of_run(i)) for i, b in enumerate(outcome.runs)]
    assert got == [(s.rows, s.reasons, s.dead_rows) for s in scenario.steps]
    unbalanced = [i for i, b in enumerate(outcome.runs) if not b.balanced]
    assert not unbalanced, f"runs {unbalanced}: rows read != admitted + clipped + dropped + dead letters"


@pytest.mark.parametrize("job, name", _per_job())
def test_every_dead_letter_names_the_input_and_the_row_it_came_from(clean, job, name):
    scenario, outcome = SCENARIOS[name], clean.final(job, name)
    assert [outcome.dead_of_run(i) for i in range(len(outcome.runs))] == [s.dead for s in scenario.steps]


# Invariant 3 (public-schedule): which windows are released must not depend on the data, so not on
# whether the job can read the scenario's ids either.
@pytest.mark.parametrize("job, name", _per_job(ignoring=frozenset({sc.STRING_IDS})))
def test_every_window_of_the_schedule_is_released_once_for_each_query_active_in_it(clean, job, name):
    scenario, outcome = SCENARIOS[name], clean.final(job, name)
    keys = outcome.release_keys()
    assert len(keys) == len(set(keys)), "a release key is published twice"
    expected = scenario.release_keys()
    assert {"missing": sorted(expected - set(keys)), "extra": sorted(set(keys) - expected)} == \
        {"missing": [], "extra": []}
    assert set(scenario.windows_without_rows()) <= {w for _, w, _ in keys}  # the empty window too, as noise


@pytest.mark.parametrize("job, name", _per_job())
def test_no_user_passes_the_budget_and_the_filter_stops_some(clean, job, name):
    scenario, outcome = SCENARIOS[name], clean.final(job, name)
    rho = calibrate(epsilon=scenario.epsilon, delta=scenario.delta, norm_budget=scenario.norm_budget).rho
    assert max(used for used, _, _ in outcome.ledger.values()) <= rho
    # Otherwise the comparisons below would compare a filter that never decided anything.
    stopped = sum(b.clipped if scenario.policy == "clip" else b.dropped for b in outcome.runs)
    assert sum(b.admitted for b in outcome.runs) > 0 and stopped > 0


@pytest.mark.parametrize("job, name", _per_job(only=lambda s: s.policy == "drop"))
def test_each_release_less_its_ledgers_noise_is_an_exact_sum_of_the_inputs(clean, noise_key, job, name):
    """Under ``drop`` every admitted value is a multiple of 1/8 (:mod:`.scenario`), so every
    exact sum is: the noise taken off is exactly the one the job added (its own ledger's)."""
    scenario, outcome = SCENARIOS[name], clean.final(job, name)
    sums = without_noise(outcome, noise_key[1], scenario.query_plan())
    off = {k: v for k, v in sums.items() if abs(v * 8 - round(v * 8)) > 8e-9}
    assert not off and any(sums.values())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_daily_jobs_release_store_holds_exactly_its_release_files(clean, name):
    """``renyi-stream run`` publishes to its DuckDB store and, with ``--releases-parquet``, to the
    files every job writes (which the comparisons read): one release, two sinks, the same rows."""
    daily = clean.ran(REFERENCE, name)
    assert sorted(daily.store_releases(), key=str) == sorted(read_release_files(daily.public), key=str)


# --- across jobs: what the daily job answers ---------------------------------------------------------


@pytest.mark.parametrize("job, name", _across_jobs())
def test_the_releases_less_each_ledgers_noise_are_the_daily_jobs(clean, noise_key, job, name):
    scenario, mine, daily = SCENARIOS[name], clean.final(job, name), clean.final(REFERENCE, name)
    assert mine.ledger_id != daily.ledger_id  # two ledgers: each adds noise of its own
    assert public_part(mine) == public_part(daily)  # keys, labels, kinds, noise stds, key, accounting
    plan = scenario.query_plan()
    assert differing_sums(without_noise(mine, noise_key[1], plan), without_noise(daily, noise_key[1], plan)) == {}


@pytest.mark.parametrize("job, name", _across_jobs())
def test_every_users_used_budget_and_odometer_are_the_daily_jobs(clean, job, name):
    mine, daily = clean.final(job, name), clean.final(REFERENCE, name)
    differ = {u: (mine.ledger.get(u), daily.ledger.get(u)) for u in set(mine.ledger) | set(daily.ledger)
              if mine.ledger.get(u) != daily.ledger.get(u)}
    assert not differ, f"{len(differ)} users differ (used, tracker segment, tracker bound), e.g. " \
                       f"{dict(sorted(differ.items(), key=str)[:5])}"


@pytest.mark.parametrize("job, name", _across_jobs())
def test_the_row_books_and_dead_letters_of_every_run_are_the_daily_jobs(clean, job, name):
    mine, daily = clean.final(job, name), clean.final(REFERENCE, name)
    assert mine.runs == daily.runs
    assert [mine.dead_rows_of_run(i) for i in range(len(mine.runs))] == \
        [daily.dead_rows_of_run(i) for i in range(len(daily.runs))]


# --- which row of a (user, window) counts ------------------------------------------------------------

TIE_FEATURES = sc.tie_break_scenario().features


@pytest.mark.parametrize("job", [_case(job, TIE_FEATURES, job, case_id=job) for job in JOBS])
def test_of_two_rows_of_one_user_and_window_in_two_inputs_the_first_inputs_counts(clean, noise_key, job):
    """The inputs' names are chosen so that a tie-break by a hash of the name would keep the
    second input's row (:func:`.conftest.names_a_hash_would_order_the_other_way`)."""
    scenario, outcome = clean.scenario(sc.TIE_BREAK), clean.final(job, sc.TIE_BREAK)
    sums = without_noise(outcome, noise_key[1], scenario.query_plan())
    # User 1001's first row (opened 1, bought 0) and user 1002's (1, 1); the second input's
    # (0, 1) for user 1001 is the duplicate.
    assert (sums[("sum:opened", sc.window(0), 0)], sums[("sum:bought", sc.window(0), 0)]) == \
        pytest.approx((2.0, 1.0), rel=0, abs=SUM_TOLERANCE)
    assert outcome.dead_rows_of_run(0) == scenario.steps[0].dead_rows


@pytest.mark.parametrize("job", list(JOBS))
def test_a_duplicate_in_a_later_input_is_dead_lettered_under_that_inputs_name(clean, job):
    scenario, outcome = clean.scenario(sc.TIE_BREAK), clean.final(job, sc.TIE_BREAK)
    assert outcome.dead_of_run(0) == scenario.steps[0].dead


# --- crashes: every crash point a job defines --------------------------------------------------------

CRASHES = [pytest.param(job, point, id=f"{job}-{point}") for job in JOBS for point in JOBS[job].crash_points]


@pytest.mark.slow  # a child process per crash point (about 40% of the suite's time)
@pytest.mark.parametrize("job, point", CRASHES)
def test_a_run_killed_at_each_crash_point_recovers_to_the_uninterrupted_outcome(clean, noise_key, tmp_path, job,
                                                                                point):
    """The first step (two windows, so a crash can fall between their publications) killed with
    SIGKILL at ``point``, then recovered as the job's rule says; compared with the job's own
    uninterrupted run on another ledger (so: sums less each ledger's noise). After the crash, only
    windows whose charge is durable may be public (nothing-pre-noise-leaves); a job recovered in
    place (:attr:`JobAdapter.resumes_in_place`) ends with the uninterrupted run's books."""
    name = sc.CRASH_SCENARIO
    step = SCENARIOS[name].steps[0]
    adapter = clean.adapter(job, name, tmp_path / job)
    adapter.crash(step, point)
    committed = point in adapter.committed_at
    public = {r["window_id"] for r in read_release_files(adapter.public)}
    assert public <= adapter.durable_windows(step, point), "a release no committed ledger charged is public"
    adapter.recover(step, point)
    got, want = adapter.outcome(), clean.after_each_step(job, name)[0]

    keys = got.release_keys()
    assert len(keys) == len(set(keys)) and set(keys) == set(want.release_keys())  # every window once
    assert public_part(got) == public_part(want)
    plan = SCENARIOS[name].query_plan()
    assert differing_sums(without_noise(got, noise_key[1], plan), without_noise(want, noise_key[1], plan)) == {}
    assert got.ledger == want.ledger  # every user charged exactly once
    assert all(b.balanced for b in got.runs)
    if not committed or adapter.resumes_in_place:  # the recovery is the run the crash interrupted
        assert got.runs == want.runs and got.dead == want.dead
        return
    # The crashed run committed; recovering it is one more run over the same rows, charging nobody.
    (crashed, extra), (clean_run,) = got.runs, want.runs
    assert crashed == clean_run and got.dead_of_run(0) == want.dead_of_run(0)
    assert extra.charged == 0 and extra.rows_read == clean_run.rows_read
    assert set(extra.reasons) <= set(clean_run.reasons) | {sc.LATE} and extra.reasons.get(sc.LATE)


@pytest.mark.slow  # a child process
def test_a_streaming_job_killed_after_committing_a_running_totals_window_resumes_its_running_state(clean, noise_key,
                                                                                                  tmp_path):
    """The running-tree scenario's last three days as one streaming job, killed right after its
    first window's commit marker: run again, it must continue the running query from the state
    committed with that window (release state, releases y, every shard's prepaid rows) and end
    as the uninterrupted job does: the same releases less each ledger's noise, the same ledger."""
    name = sc.RUNNING_TREE
    first, *rest = SCENARIOS[name].steps
    later = sc.Step(rest[0].first_day, rest[-1].last_day, tuple(m for step in rest for m in step.messages),
                    register=rest[0].register)
    crashed, whole = (clean.adapter("streaming", name, tmp_path / folder) for folder in ("crashed", "whole"))
    for adapter in (crashed, whole):
        adapter.run(first)
    crashed.crash(later, "streaming_after_commit")
    assert {r["window_id"] for r in read_release_files(crashed.public)} == set(first.windows)  # nothing public yet
    crashed.recover(later, "streaming_after_commit")
    whole.run(later)
    got, want = crashed.outcome(), whole.outcome()
    assert {q for q, _, _ in got.release_keys()} >= {"total:tree"}
    assert public_part(got) == public_part(want)
    plan = SCENARIOS[name].query_plan()
    assert differing_sums(without_noise(got, noise_key[1], plan), without_noise(want, noise_key[1], plan)) == {}
    assert got.ledger == want.ledger and got.runs == want.runs


def _crash_points_in_the_code() -> set[str]:
    """Every name ``renyi_stream.stream.faults.crash_point`` is called with in the project's packages."""
    found = set()
    for package in ("stream", "pipelines", "queries"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == \
                        "crash_point" and node.args and isinstance(node.args[0], ast.Constant):
                    found.add(node.args[0].value)
    return found


def test_every_crash_point_in_the_code_is_exercised_through_some_job():
    declared = {point for job in JOBS.values() for point in job.crash_points}
    assert {"in the code, no job": sorted(_crash_points_in_the_code() - declared),
            "declared, not in the code": sorted(declared - _crash_points_in_the_code())} == \
        {"in the code, no job": [], "declared, not in the code": []}


# --- what the jobs are asked but do not know ---------------------------------------------------------


@pytest.mark.parametrize("job", [_case(job, frozenset({sc.REFUSES_UNKNOWN_OPTIONS}), job, case_id=job)
                                 for job in JOBS])
def test_an_option_the_job_does_not_know_is_refused_naming_it_before_anything_is_released(clean, tmp_path, job):
    """``--polcy clip``, a typo of ``--policy``: run anyway, the job charges and releases under
    another policy than the operator asked for."""
    adapter = clean.adapter(job, sc.CRASH_SCENARIO, tmp_path / job)
    ran = adapter.attempt(SCENARIOS[sc.CRASH_SCENARIO].steps[0], extra=["--polcy", "clip"])
    assert ran.code != 0 and "--polcy" in ran.err, f"exit status {ran.code}: {ran.err[-1000:]}"
    assert "argument --polcy: not an option of" in ran.err and "did you mean --policy?" in ran.err  # one wording
    assert read_release_files(adapter.public) == ()


# --- the declarations themselves ---------------------------------------------------------------------

#: What each job lacks today (issue 19: parity in flight). A change to any adapter's declaration
#: fails here until this list says so too: the lead sees every gap open or close.
KNOWN_GAPS = {
    "daily": [],
    "distributed": [],
    "streaming": [],
}


def test_the_features_each_job_lacks_are_the_known_gaps():
    assert {name: sorted(sc.FEATURES - job.supports) for name, job in JOBS.items()} == \
        {name: sorted(gaps) for name, gaps in KNOWN_GAPS.items()}


def test_every_job_declares_the_same_features():
    every = frozenset().union(*(job.supports for job in JOBS.values()))
    assert {name: sorted(every - job.supports) for name, job in JOBS.items()} == {name: [] for name in JOBS}


def test_every_declared_feature_is_one_the_scenarios_or_the_suite_exercise():
    used = frozenset().union(*(s.features for s in SCENARIOS.values()), TIE_FEATURES)
    assert sc.FEATURES == used | sc.JOB_FEATURES
    assert all(job.supports <= sc.FEATURES for job in JOBS.values())


def test_a_job_declares_crash_recovery_exactly_when_it_has_crash_points():
    assert {name: sc.CRASH_RECOVERY in job.supports for name, job in JOBS.items()} == \
        {name: bool(job.crash_points) for name, job in JOBS.items()}


def test_the_noise_removed_is_the_one_drawn_for_the_jobs_own_ledger(clean, noise_key):
    """The comparisons take each ledger's own noise off: with the other ledger's id, the sums of
    two jobs would differ by two independent draws (invariant 5; docs/architecture.md, "Edges")."""
    from dataclasses import replace

    name = sc.CRASH_SCENARIO
    daily, other = clean.final(REFERENCE, name), clean.final("distributed", name)
    plan = SCENARIOS[name].query_plan()
    wrong = without_noise(replace(other, ledger_id=daily.ledger_id), noise_key[1], plan)
    assert daily.ledger_id != other.ledger_id
    assert len(differing_sums(wrong, without_noise(daily, noise_key[1], plan))) == len(daily.releases)
