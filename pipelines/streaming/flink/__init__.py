"""The streaming job as a PyFlink DataStream job (the Flink shell beside the Beam shell,
:mod:`renyi_stream.pipelines.streaming.beam`): :mod:`.job` wires the runner-independent machinery of
:mod:`renyi_stream.pipelines.streaming` into Flink operators, :mod:`.state` adapts Flink's keyed
state and timers to the shared steps, :mod:`.launch` builds the ``flink run`` command."""
