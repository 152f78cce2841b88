"""``python -m smdccl.cluster``: parse, check the machine, build, run, tear down.

Exit codes: the job's worst exit code among hosts (0 when all succeeded);
2 for a usage error or a machine that cannot host the cluster (not root, not
Linux, a tool missing, the kernel refusing a namespace, veth or qdisc);
124 when --timeout fired; 128+N after signal N.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from smdccl.cluster.errors import ClusterSetupError, ClusterTimeout, ClusterUnavailable
from smdccl.cluster.plan import MAX_NODES, parse_rate

PROG = "smdccl.cluster"
EPILOG = """\
examples:
  python -m smdccl.cluster --nodes 2 --procs-per-node 2 --link 1gbit -- train.py --epochs 1
  python -m smdccl.cluster --nodes 2 --procs-per-node 2 --link 1gbit -- \\
      -m smdccl.bench --backends smdccl,gloo --sizes 4K,1M,64M
  python -m smdccl.cluster --cleanup-stale

Each host is a network namespace with its own hostname (node0, node1, ...) and
address (198.18.0.1, .2, ...), joined to the others through a bridge by a link
shaped with tbf in both directions. Every host runs torchrun with a static
rendezvous on node0. Needs root on Linux.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def _rate(text: str):
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"python -m {PROG} [options] -- SCRIPT [ARGS] | -- -m MODULE [ARGS]",
        description="Run a torchrun job on an emulated multi-node cluster: network "
                    "namespaces as hosts, a bridge as the switch, tbf-shaped links.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=_positive_int, default=2, metavar="N",
                   help=f"emulated hosts, 1..{MAX_NODES} (default: 2)")
    p.add_argument("--procs-per-node", type=_positive_int, default=1, metavar="P",
                   help="torchrun workers per host (default: 1)")
    p.add_argument("--link", type=_rate, default=parse_rate("1gbit"), metavar="RATE",
                   help="each host's link rate, each direction, in tc units (1gbit, "
                        "100mbit, 10gbit); none or 0: unshaped (default: 1gbit)")
    p.add_argument("--env", type=_env_pair, action="append", default=[], metavar="K=V",
                   help="add an environment variable on every host (repeatable); the "
                        "caller's environment is passed through as well")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="kill everything and fail (exit 124) after this long (default: none)")
    p.add_argument("--fail-grace", type=float, default=10.0, metavar="SECONDS",
                   help="once a host fails, kill the others after this long (default: 10)")
    p.add_argument("--master-port", type=int, default=None, metavar="PORT",
                   help="rendezvous port on node0 (default: random)")
    p.add_argument("--cleanup-stale", action="store_true",
                   help="only remove namespaces left behind by dead runs, then exit")
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Everything after the first "--" belongs to the job, even what looks like
    # one of our options (a job may well take --timeout itself).
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if args.command:
            parser.error(f"unexpected argument(s) before '--': {' '.join(args.command)}")
        args.command = argv[cut + 1:]
    else:
        args = parser.parse_args(argv)
    if args.nodes > MAX_NODES:
        parser.error(f"--nodes: at most {MAX_NODES} (got {args.nodes})")
    if args.fail_grace < 0:
        parser.error("--fail-grace must be >= 0")
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        parser.error(f"--master-port must be 1..65535 (got {args.master_port})")
    if args.cleanup_stale:
        if args.command:
            parser.error("--cleanup-stale takes no command")
        return args
    if not args.command:
        parser.error("no command given: put the script after '--', "
                     "e.g. -- train.py, or -- -m smdccl.bench")
    if args.command[0] == "-m":
        if len(args.command) < 2:
            parser.error("-m needs a module name, e.g. -- -m smdccl.bench")
    elif args.command[0].startswith("-"):
        parser.error(f"the command must start with a script or -m MODULE, not {args.command[0]!r}")
    elif args.command[0].endswith(".py") and not os.path.isfile(args.command[0]):
        parser.error(f"script not found: {args.command[0]}")
    return args


class Interrupted(KeyboardInterrupt):
    """Raised from a signal handler so that every ``finally`` and ``__exit__``
    on the way out runs: that is where the teardown lives."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _install_signal_handlers() -> None:
    fired = []

    def handler(signum, frame):
        if fired:  # already unwinding: let the teardown finish
            return
        fired.append(signum)
        raise Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def _say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from smdccl.cluster import netns
    from smdccl.cluster.emulated import EmulatedCluster, cleanup_stale

    reason = netns.unavailable_reason()
    if reason:
        _say(f"{reason}; {netns.REQUIREMENT}")
        return 2
    if args.cleanup_stale:
        removed = cleanup_stale()
        _say(f"removed {len(removed)} leftover(s) of dead runs{': ' if removed else ''}"
             f"{' '.join(removed)}")
        return 0

    _install_signal_handlers()
    try:
        with EmulatedCluster(args.nodes, args.procs_per_node, args.link) as cluster:
            _say(cluster.describe())
            rc, _ = cluster.run(args.command, env=dict(args.env), timeout=args.timeout,
                                fail_grace=args.fail_grace, master_port=args.master_port)
            failed = [f"{r.host.hostname} exited {r.code}" for r in cluster.last_runs if r.code]
            killed = [f"{r.host.hostname} killed ({r.killed})" for r in cluster.last_runs if r.killed]
            if rc:
                _say(f"job failed with exit code {rc}: {'; '.join(failed + killed)}")
            return rc
    except ClusterUnavailable as exc:
        _say(str(exc))
        return 2
    except ClusterSetupError as exc:  # e.g. a kernel without tbf or veth
        _say(f"cannot build the emulated cluster: {' '.join(str(exc).split())}")
        return 2
    except ClusterTimeout as exc:
        _say(str(exc))
        return 124
    except Interrupted as exc:
        _say(f"interrupted by {signal.Signals(exc.signum).name}; every process was killed "
             "and the namespaces removed")
        return 128 + exc.signum
