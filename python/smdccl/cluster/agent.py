"""torchrun, exiting with its workers' worst exit code.

torchrun itself exits 1 whatever its workers returned; the cluster promises the
job's own code (a script's ``sys.exit(3)`` comes back as 3), so each host runs
torchrun's ``main`` through this module and maps the failure it raises.

    python .../smdccl/cluster/agent.py <torchrun arguments>
"""

from __future__ import annotations

import os
import sys

# Run by path, Python put this package's directory first on sys.path, where
# plan.py, errors.py, ... could shadow top-level modules torch imports.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


#: Each rank's lines are prefixed with its rank. Every torchrun since torch 2.2
#: reads this variable (newer ones also take --log-line-prefix-template, which
#: falls back to it); a template the user set is kept.
PREFIX_VARIABLE = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
RANK_PREFIX = "[rank${rank}] "


def main(argv: list[str]) -> int:
    os.environ.setdefault(PREFIX_VARIABLE, RANK_PREFIX)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr, flush=True)
        codes = [f.exitcode for f in exc.failures.values()]
        # a worker killed by signal N reports -N; read it like the shell does
        worst = max((c if c >= 0 else 128 - c) for c in codes) if codes else 1
        return worst or 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
