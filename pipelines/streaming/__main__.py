import sys

from renyi_stream.pipelines.streaming.job import main

sys.exit(main())
