import sys

from pipelines.streaming.job import main

sys.exit(main())
