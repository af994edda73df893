import sys

from renyi_stream.pipelines.distributed.job import main

sys.exit(main())
