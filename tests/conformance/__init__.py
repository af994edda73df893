"""One scenario, three jobs (issue 19, item 3;
docs/architecture.md, "Where the code is going").

* :mod:`.scenario`: the scenarios as plain data (users, days, messages with their bad rows and
  the dead-letter reason each must get, the steps, the query changes) and the features each uses;
* :mod:`.outcome`: the common form every job's results are read into (public releases, ledger,
  row books per run, dead letters) and the comparison helpers (noise removal, tolerances);
* :mod:`.adapters`: one adapter per job (``renyi-stream run``, ``python -m renyi_stream.pipelines.distributed``,
  ``python -m renyi_stream.pipelines.streaming``): how to run a step, crash one, recover, and read the outcome,
  and which features the job supports;
* :mod:`.crash`: a job run in a child process killed at a crash point (also used by
  ``test_crash_points`` and ``test_deploy``);
* ``test_conformance.py``: the assertions, per job and across jobs.
"""
