import sys

from renyi_stream.pipelines.streaming.beam.job import main

sys.exit(main())
