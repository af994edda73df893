"""The distributed batch job (``python -m pipelines.distributed``): state and releases in object
storage, for Flink and Dataflow."""
