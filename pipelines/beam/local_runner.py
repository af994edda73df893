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
"""

from __future__ import annotations

import sys
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

DIRECT_NAMES = ("directrunner", "direct", "switchingdirectrunner")


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
    asked for (it honours ``--direct_running_mode`` and ``--direct_num_workers``), else ``None``
    so that ``beam.Pipeline`` builds the named runner (Flink, Dataflow, ...) itself."""
    if not is_direct(options):
        return None
    skip_ipython_probe()
    # Imported here: the portable runner's modules are only needed for a local run.
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=provision)
