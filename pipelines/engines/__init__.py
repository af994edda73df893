"""Real engines on one machine: a local Flink cluster with its PyFlink workers' Python environment,
a Beam worker pool and a Kafka broker assembled from registry artifacts (``python -m
renyi_stream.pipelines.engines.local_cluster up|down|status``; :mod:`.worker_env` builds the environment)."""
