"""Tests on real engines (issue 29): a local Flink cluster, Beam's worker pool and a Kafka broker
(pipelines/engines/local_cluster.py), started once per test session."""
