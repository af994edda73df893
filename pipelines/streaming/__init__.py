"""The streaming job (``python -m renyi_stream.pipelines.streaming``): the filter on an unbounded stream
(Pub/Sub, Kafka or a replay), releasing each window as the watermark passes it."""
