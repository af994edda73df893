"""Beam shells shared by the jobs: DoFns and PTransforms over :mod:`stream.engine`
(:mod:`pipelines.beam.transforms`), the in-process batch runner and the workers' noise key."""
