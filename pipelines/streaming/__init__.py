"""The streaming job (``python -m renyi_stream.pipelines.streaming``): the filter on an unbounded stream
(Pub/Sub, Kafka or a replay), releasing each window as the watermark passes it. The modules here are
its runner-independent machinery and import no Beam (the command line, the launch, the message codec,
the replay, the shard filter, the commit protocol, recovery and lineage, snapshots, books); each
runner's shell, a sub-package (``beam/``), says only how that runner wires them."""
