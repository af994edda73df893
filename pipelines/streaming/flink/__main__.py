"""``python -m renyi_stream.pipelines.streaming.flink <the stream job's options>``, as ``flink run
-pym`` runs it (:func:`renyi_stream.pipelines.streaming.flink.launch.flink_run_command`)."""

import sys

from renyi_stream.pipelines.streaming.flink.job import main

if __name__ == "__main__":
    sys.exit(main())
