"""Apache Beam pipelines and the renyi-stream command line."""
