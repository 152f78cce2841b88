"""``python -m smdccl.bench`` / ``torchrun ... -m smdccl.bench``."""

import sys

from smdccl.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
