"""The runner a local batch job runs on: Beam's FnApiRunner, chosen up front.

Beam's ``DirectRunner`` (``SwitchingDirectRunner`` since 2.6x) first walks the graph twice to
decide between runners and then tries the Prism runner, which downloads a Go binary from
GitHub on first use and falls back to the FnApiRunner when that fails. For the batch jobs here
that means a network fetch on a machine with internet, a different runner depending on whether
the fetch worked (``direct_running_mode`` is ignored by Prism), and a few hundred milliseconds
of graph walks on every run. The batch graphs use only what the FnApiRunner supports
(stateful DoFns with event-time timers in the global window), which is where the DirectRunner
ends up anyway when Prism is unavailable; choosing it directly makes every local run execute
on the same runner, offline, with the requested ``direct_running_mode``.

The same FnApiRunner also runs the graph on Beam's portable workers when the options name an
external environment (``--environment_type=EXTERNAL --environment_config=HOST:PORT``, a worker
pool such as ``python -m apache_beam.runners.worker.worker_pool_main``): the SDK harnesses, as
Flink and Dataflow run Python, then execute every DoFn in their own processes and reach the
runner over the Fn API (control, data, state and timers over gRPC); ``--direct_num_workers``
says how many harnesses the pool starts (``tests/test_portable_workers.py``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, PortableOptions, StandardOptions

DIRECT_NAMES = ("directrunner", "direct", "switchingdirectrunner")
# The FnApiRunner logs this when several workers run in memory; with an external environment the
# workers are the pool's harnesses, so the advice it gives (another running mode) is wrong.
_IN_MEMORY_WORKERS_ADVICE = "direct_running_mode should be `multi_processing` or `multi_threading`"


def is_direct(options: PipelineOptions) -> bool:
    """Whether ``options`` ask for Beam's local DirectRunner (the default when no runner is named)."""
    runner = options.view_as(StandardOptions).runner
    return runner is None or (isinstance(runner, str) and runner.lower() in DIRECT_NAMES)


def skip_ipython_probe() -> None:
    """Answer Beam's "are we in an IPython session?" without importing IPython when it is not
    imported yet (then no IPython session can exist in this process, so the answer is no).

    Beam asks on every top-level ``apply`` to relabel transforms for notebooks, and its check
    imports IPython to find out: a quarter of a second on every run of a job wherever IPython is
    installed (any machine with Jupyter). Inside a session IPython is imported, and Beam's own
    check runs as before."""
    from apache_beam import pipeline
    from apache_beam.utils import interactive_utils

    probe = interactive_utils.is_in_ipython
    if getattr(probe, "_renyi_skips_import", False):
        return

    def is_in_ipython() -> bool:
        return "IPython" in sys.modules and probe()

    is_in_ipython._renyi_skips_import = True  # type: ignore[attr-defined]
    interactive_utils.is_in_ipython = is_in_ipython  # what alter_label_if_ipython calls
    if getattr(pipeline, "is_in_ipython", None) is probe:  # Pipeline.run's own imported name
        pipeline.is_in_ipython = is_in_ipython


def batch_runner(options: PipelineOptions) -> Any | None:
    """The runner for a batch graph under ``options``: an FnApiRunner when the DirectRunner is
    asked for (it honours ``--direct_running_mode`` and ``--direct_num_workers``, and runs the
    DoFns on an external worker pool with ``--environment_type=EXTERNAL``), else ``None`` so that
    ``beam.Pipeline`` builds the named runner (Flink, Dataflow, ...) itself.

    ValueError, naming the options, for an environment the DirectRunner would silently run in
    process instead (any but EXTERNAL) or one a running mode other than ``in_memory`` would
    replace."""
    if not is_direct(options):
        return None
    environment = _worker_environment(options)
    skip_ipython_probe()
    # Imported here: the portable runner's modules are only needed for a local run.
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    if environment is not None and _not_in_memory_workers_advice not in fn_runner._LOGGER.filters:
        fn_runner._LOGGER.addFilter(_not_in_memory_workers_advice)
    if environment is None:
        without_sdk_state_cache()
        with_short_state_sampling()
    return fn_runner.FnApiRunner(default_environment=environment, provision_info=provision)


def without_sdk_state_cache() -> None:
    """Turn off the SDK harness's user-state cache of the FnApiRunner's in-process worker.

    In memory the runner's state servicer is a dictionary in this same process, so the cache
    only keeps a second, decoded copy of every state value. And Beam weighs each value it puts
    there with ``objsize``, whose every call first walks the globals of every loaded module (some
    2,000 with Beam, pyarrow and DuckDB loaded: about 2 ms), a fixed cost paid per state write
    (twice for a ReadModifyWrite: a clear and an append), whatever the value. The streaming
    filter writes a few states per shard and window: py-spy put the weighing at 31% of a 3M-row
    replay. Without the cache a read decodes the servicer's bytes instead (the values are small,
    or packed rows kept compressed). Harnesses outside this process (an external worker pool,
    Flink, Dataflow) keep their own cache setting."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    worker_handlers.STATE_CACHE_SIZE_MB = 0


#: The state sampler's longest period on the in-process worker, in milliseconds (Beam's is 200).
STATE_SAMPLING_PERIOD_MS = 10


def with_short_state_sampling() -> None:
    """Sample the in-process worker's step timings every :data:`STATE_SAMPLING_PERIOD_MS` at most.

    Every bundle starts a sampling thread that sleeps between samples, its sleep growing to 200 ms,
    and ends by joining it: a bundle waits out the sleep in progress, 100 ms on average once it has
    run a second. The streaming filter's bundles (a round of window timers each) add up to 6% of a
    3M-row replay spent in that join (py-spy, ``StateSampler.stop``), doing nothing. Beam reads the
    period from a default argument bound when its module loads, with no option for it, so the
    default is replaced; a Beam whose sampler takes no such argument is left as it is. The samples
    only feed Beam's step-time counters, which the jobs do not read. Harnesses outside this
    process keep their own."""
    import inspect

    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    parameters = list(inspect.signature(init).parameters)
    if parameters[-1:] == ["sampling_period_ms"] and init.__defaults__ is not None and len(init.__defaults__) == 1:
        init.__defaults__ = (STATE_SAMPLING_PERIOD_MS,)


def _worker_environment(options: PipelineOptions) -> Any | None:
    """The SDK harness environment ``--environment_type`` names for the DirectRunner: an external
    worker pool (EXTERNAL, at ``--environment_config``), or None (none named: the harness runs in
    this process). Beam 2.77 reads an EXTERNAL address only from ``--environment_config`` (its
    ``--environment_options external_service_address=`` path fails on the missing config)."""
    portable = options.view_as(PortableOptions)
    kind = portable.environment_type
    if not kind:
        return None
    if kind != "EXTERNAL":
        raise ValueError(f"--environment_type must be EXTERNAL (a Beam worker pool) or left out with the "
                         f"DirectRunner, got --environment_type={kind}: name a portable runner "
                         f"(--runner=PortableRunner, FlinkRunner, ...) for other environments")
    if not portable.environment_config:
        raise ValueError("--environment_config must name the worker pool (HOST:PORT) with --environment_type=EXTERNAL, "
                         "got none")
    mode = options.view_as(DirectOptions).direct_running_mode
    if mode != "in_memory":
        raise ValueError(f"--direct_running_mode must be in_memory (the default) with --environment_type=EXTERNAL, "
                         f"got --direct_running_mode={mode}, which would run the workers here instead of the pool")
    from apache_beam.transforms import environments

    return environments.Environment.from_options(portable)


def _not_in_memory_workers_advice(record: logging.LogRecord) -> bool:
    """A logging filter: False for the FnApiRunner's advice to pick another running mode for
    several workers, which is wrong when the workers are an external pool's harnesses."""
    return _IN_MEMORY_WORKERS_ADVICE not in record.getMessage()
