"""The distributed batch job (``python -m renyi_stream.pipelines.distributed``): state and releases in object
storage, for Flink and Dataflow."""
