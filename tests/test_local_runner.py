"""Local batch runs execute on Beam's FnApiRunner, chosen up front: never on Prism (which the
DirectRunner tries first, downloading a binary), and other runners are left to Beam."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability import prism_runner
from apache_beam.runners.portability.fn_api_runner import fn_runner

from renyi_stream.pipelines.daily.job import JobConfig, run_job
from renyi_stream.pipelines.beam.local_runner import batch_runner
from declared import contract


def test_a_daily_run_on_the_direct_runner_never_tries_the_prism_runner(tmp_path, monkeypatch):
    tried = []

    def refuse(self, pipeline, options):
        tried.append(pipeline)
        raise RuntimeError("Prism must not be tried")  # the DirectRunner would swallow this and fall back

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", refuse)
    day = dt.date(2026, 3, 1)
    pq.write_table(pa.table({"user_id": [1, 2, 3], "day": [day] * 3, "opened": [1.0, 0.0, 1.0]}),
                   tmp_path / "d0.parquet")
    w0 = (day - dt.date(1970, 1, 1)).days
    summary = run_job(JobConfig(inputs=(str(tmp_path / "d0.parquet"),), store=str(tmp_path / "r.duckdb"),
                                ledger=str(tmp_path / "l.duckdb"), epsilon=1.0, delta=1e-6, norm_budget=2.0,
                                start_window=w0, end_window=w0, contract=contract("int64", "opened=0:1")))
    assert summary.balanced and summary.admitted == 3
    assert tried == []


def test_the_direct_runner_and_no_runner_at_all_give_the_fn_api_runner():
    for flags in ([], ["--runner=DirectRunner"], ["--runner=direct", "--direct_running_mode=multi_processing"]):
        assert isinstance(batch_runner(PipelineOptions(flags)), fn_runner.FnApiRunner), flags


def test_a_distributed_runner_is_left_for_beam_to_build():
    for runner in ("FlinkRunner", "DataflowRunner", "PortableRunner", "PrismRunner"):
        assert batch_runner(PipelineOptions([f"--runner={runner}"])) is None


def test_a_local_run_outside_ipython_does_not_import_ipython(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import datetime as dt, sys
        import pyarrow as pa, pyarrow.parquet as pq
        from renyi_stream.pipelines.daily.job import JobConfig, run_job
        from renyi_stream.stream.contract import DeclaredColumn, InputContract
        day = dt.date(2026, 3, 1)
        pq.write_table(pa.table({{"user_id": [1, 2], "day": [day] * 2, "opened": [1.0, 0.0]}}), "{tmp_path}/d.parquet")
        w0 = (day - dt.date(1970, 1, 1)).days
        run_job(JobConfig(inputs=("{tmp_path}/d.parquet",), store="{tmp_path}/r.duckdb", ledger="{tmp_path}/l.duckdb",
                          epsilon=1.0, delta=1e-6, norm_budget=2.0, start_window=w0, end_window=w0,
                          contract=InputContract("int64", (DeclaredColumn("opened", "number", 0.0, 1.0),))))
        print("IPython" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_inside_an_ipython_session_beams_own_check_still_answers():
    import sys
    import types

    from apache_beam.utils import interactive_utils

    from renyi_stream.pipelines.beam.local_runner import skip_ipython_probe

    skip_ipython_probe()
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: object()  # a running shell
    saved = sys.modules.get("IPython")
    sys.modules["IPython"] = fake
    try:
        assert interactive_utils.is_in_ipython() is True
    finally:
        if saved is None:
            del sys.modules["IPython"]
        else:
            sys.modules["IPython"] = saved


def test_an_external_environment_runs_on_the_fn_api_runner():
    # It runs there on the pool's harnesses: tests/test_portable_workers.py.
    options = PipelineOptions(["--environment_type=EXTERNAL", "--environment_config=pool.example:50000",
                               "--direct_num_workers=2"])
    assert isinstance(batch_runner(options), fn_runner.FnApiRunner)


def test_an_environment_the_direct_runner_would_run_in_process_instead_is_refused_naming_it():
    # Before, the FnApiRunner ignored --environment_type: a run meant for a worker pool (or a
    # container) ran in the launching process without a word.
    for kind in ("DOCKER", "PROCESS", "LOOPBACK"):
        with pytest.raises(ValueError, match=f"--environment_type must be EXTERNAL .* got --environment_type={kind}"):
            batch_runner(PipelineOptions([f"--environment_type={kind}", "--environment_config=x"]))


def test_an_external_environment_without_the_pools_address_is_refused():
    with pytest.raises(ValueError, match="--environment_config must name the worker pool"):
        batch_runner(PipelineOptions(["--environment_type=EXTERNAL"]))


def test_an_external_environment_with_a_running_mode_that_would_replace_it_is_refused():
    for mode in ("multi_threading", "multi_processing"):
        with pytest.raises(ValueError, match=f"got --direct_running_mode={mode}"):
            batch_runner(PipelineOptions(["--environment_type=EXTERNAL", "--environment_config=localhost:50000",
                                          f"--direct_running_mode={mode}"]))


def test_the_in_process_runner_keeps_no_sdk_state_cache_and_an_external_pool_keeps_its_own(monkeypatch):
    """In memory the runner's state lives in this process: the SDK cache only held a second copy
    and weighed every state write with objsize (a walk over every loaded module, ~2 ms a call),
    a third of a streaming replay's time (issue 30). An external pool's harnesses are not ours."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    monkeypatch.setattr(worker_handlers, "STATE_CACHE_SIZE_MB", 100)
    batch_runner(PipelineOptions(["--environment_type=EXTERNAL", "--environment_config=localhost:50000"]))
    assert worker_handlers.STATE_CACHE_SIZE_MB == 100
    batch_runner(PipelineOptions(["--runner=DirectRunner"]))
    assert worker_handlers.STATE_CACHE_SIZE_MB == 0


def test_the_in_process_runner_samples_step_timings_every_10_ms_and_an_external_pool_keeps_its_own(monkeypatch):
    """Each bundle ends by joining Beam's state-sampling thread, which sleeps up to its period
    (200 ms): 6% of a streaming replay spent waiting (issue 30). In process the period is
    STATE_SAMPLING_PERIOD_MS, for every sampler the worker makes from then on."""
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    from renyi_stream.pipelines.beam.local_runner import STATE_SAMPLING_PERIOD_MS

    monkeypatch.setattr(statesampler.StateSampler.__init__, "__defaults__", (200,))
    batch_runner(PipelineOptions(["--environment_type=EXTERNAL", "--environment_config=localhost:50000"]))
    assert statesampler.StateSampler("step", CounterFactory()).sampling_period_ms == 200
    batch_runner(PipelineOptions(["--runner=DirectRunner"]))
    assert STATE_SAMPLING_PERIOD_MS == 10
    assert statesampler.StateSampler("step", CounterFactory()).sampling_period_ms == STATE_SAMPLING_PERIOD_MS
