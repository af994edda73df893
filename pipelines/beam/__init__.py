"""Beam shells shared by the jobs: DoFns and PTransforms over :mod:`renyi_stream.stream.engine`
(:mod:`renyi_stream.pipelines.beam.transforms`), the in-process batch runner and the workers' noise key."""
