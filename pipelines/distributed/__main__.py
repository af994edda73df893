import sys

from pipelines.distributed.job import main

sys.exit(main())
