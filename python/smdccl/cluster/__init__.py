"""An emulated multi-node cluster on one Linux machine, for running and
measuring torch.distributed jobs across "hosts" without having any.

Each host is a network namespace with its own hostname and address in
198.18.0.0/15; a bridge in one more namespace is the switch; each host's veth
to it is shaped with tbf in both directions. ``python -m smdccl.cluster`` runs
torchrun on every host (see ``--help``); :class:`EmulatedCluster` is the same
from Python. Needs root.

    plan.py      rates, addresses, names (pure)
    netns.py     build / tear down namespaces, veths, bridge, tbf
    launch.py    one command per host, prefixed output, worst exit code
    agent.py     torchrun, exiting with its workers' own code
    emulated.py  EmulatedCluster
    cli.py       the command line
"""

from smdccl.cluster.emulated import EmulatedCluster
from smdccl.cluster.errors import ClusterSetupError, ClusterTimeout, ClusterUnavailable
from smdccl.cluster.plan import format_rate, make_plan, parse_rate

__all__ = ["EmulatedCluster", "ClusterUnavailable", "ClusterSetupError", "ClusterTimeout",
           "parse_rate", "format_rate", "make_plan"]
