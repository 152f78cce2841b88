"""``python -m smdccl.tune`` / ``torchrun ... -m smdccl.tune``."""

import sys

from smdccl.tune.cli import main

if __name__ == "__main__":
    sys.exit(main())
