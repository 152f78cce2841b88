import sys

from smdccl.cluster.cli import main

sys.exit(main())
