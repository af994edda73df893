"""The streaming job's Beam shell: how Beam wires the runner-independent streaming machinery of
:mod:`renyi_stream.pipelines.streaming` (DoFns over its steps, the graph, the sources, ``main``):
:mod:`~renyi_stream.pipelines.streaming.beam.job` and :mod:`~renyi_stream.pipelines.streaming.beam.releases`."""
