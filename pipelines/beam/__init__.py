"""Beam shells shared by the jobs: DoFns and PTransforms over :mod:`renyi_stream.stream.engine`
(:mod:`renyi_stream.pipelines.beam.transforms`), the in-process batch runner and the workers' noise key;
and what the jobs share at launch and in their files that imports no Beam (job options, curator files
in object storage, the release files' publication, a shard's rows, running release states), which the
streaming job's runner-independent machinery uses under every runner."""
