"""Build and tear down the emulated network: one namespace per host, one holding
a bridge, a veth pair from each host to the bridge, tbf shaping on both ends.

Everything is created inside namespaces of our own (``ip -n``), so no interface,
route or qdisc ever appears in the caller's network namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from smdccl.cluster.errors import ClusterSetupError, ClusterUnavailable
from smdccl.cluster.plan import BRIDGE, HOST_IF, NS_PREFIX, SUBNET, Plan, format_rate, stale_owner

TOOLS = ("ip", "tc", "unshare", "setpriv", "hostname", "sh")
REQUIREMENT = ("it must run as root on Linux, with iproute2 (ip, tc) and util-linux "
               "(unshare, setpriv)")

# burst must hold at least rate/HZ bytes or tbf cannot reach its rate; 256 kB is
# enough for 1gbit at HZ=100. latency bounds the queue, so a sender sees drops
# (and TCP backs off) instead of seconds of bufferbloat.
TBF = ("burst", "256kb", "latency", "100ms")


def unavailable_reason() -> str | None:
    """Why this process cannot build namespaces, or None if it looks able to."""
    if not sys.platform.startswith("linux"):
        return f"this is {sys.platform}, not Linux"
    if os.geteuid() != 0:
        return f"not running as root (uid {os.geteuid()})"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing command(s): {', '.join(missing)}"
    return None


def _cmd(*argv: str) -> str:
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterSetupError(f"`{' '.join(argv)}` failed (exit {res.returncode}): "
                                f"{(res.stderr or res.stdout).strip()}")
    return res.stdout


def list_namespaces() -> list[str]:
    out = _cmd("ip", "netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ours(prefix: str = NS_PREFIX) -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(prefix)]


def create(plan: Plan) -> None:
    """Build ``plan``'s network; on any failure remove what was made and raise."""
    made: list[str] = []
    try:
        for ns in plan.namespaces:
            try:
                _cmd("ip", "netns", "add", ns)
            except ClusterSetupError as exc:
                if not made:  # the very first one: the kernel or policy says no
                    why = " ".join(str(exc).split())  # one line, whatever ip printed
                    raise ClusterUnavailable(f"cannot create a network namespace ({why}); "
                                             f"{REQUIREMENT}") from None
                raise
            made.append(ns)
        br = plan.bridge_netns
        _cmd("ip", "-n", br, "link", "add", BRIDGE, "type", "bridge")
        _cmd("ip", "-n", br, "link", "set", BRIDGE, "up")
        for h in plan.hosts:
            _cmd("ip", "-n", h.netns, "link", "set", "lo", "up")
            _cmd("ip", "-n", h.netns, "link", "add", HOST_IF, "type", "veth",
                 "peer", "name", h.port, "netns", br)
            _cmd("ip", "-n", h.netns, "addr", "add", f"{h.address}/{SUBNET.prefixlen}", "dev", HOST_IF)
            _cmd("ip", "-n", h.netns, "link", "set", HOST_IF, "up")
            _cmd("ip", "-n", br, "link", "set", h.port, "master", BRIDGE)
            _cmd("ip", "-n", br, "link", "set", h.port, "up")
            if plan.rate_bits is not None:
                rate = format_rate(plan.rate_bits)
                # egress of the host's end = its upload; egress of the bridge's end
                # = its download: together a full-duplex link of `rate`
                _cmd("tc", "-n", h.netns, "qdisc", "add", "dev", HOST_IF, "root", "tbf", "rate", rate, *TBF)
                _cmd("tc", "-n", br, "qdisc", "add", "dev", h.port, "root", "tbf", "rate", rate, *TBF)
    except BaseException:
        remove(made)
        raise


def pids_in(ns: str) -> list[int]:
    try:
        out = _cmd("ip", "netns", "pids", ns)
    except ClusterSetupError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def kill_all(namespaces: list[str], wait: float = 10.0) -> list[int]:
    """SIGKILL every process in ``namespaces``; return the pids still alive after
    ``wait`` seconds. Needed before deleting: a namespace (and its veth) lives on
    while any process is inside, and torchrun's workers run in sessions of their
    own, out of reach of a process-group kill."""
    deadline = time.monotonic() + wait
    while True:
        left = [p for ns in namespaces for p in pids_in(ns)]
        if not left or time.monotonic() > deadline:
            return left
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


@contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM/SIGHUP until the block is done: a Ctrl-C landing in
    the middle of a teardown would otherwise abort it and leave namespaces."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def remove(namespaces: list[str]) -> list[str]:
    """Kill what runs inside, then delete the namespaces (deleting a host's
    namespace destroys its veth pair, deleting the bridge's the bridge).
    Returns a description of anything left behind (empty when clean)."""
    with signals_deferred():
        return _remove(namespaces)


def _remove(namespaces: list[str]) -> list[str]:
    problems: list[str] = []
    survivors = kill_all(namespaces)
    if survivors:
        problems.append(f"processes survived SIGKILL: {survivors}")
    for ns in namespaces:
        try:
            _cmd("ip", "netns", "delete", ns)
        except ClusterSetupError as exc:
            if ns in list_namespaces():
                problems.append(str(exc))
    return problems


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Remove namespaces left by runs of ours whose creating process is dead
    (a launcher killed with SIGKILL cannot clean up after itself). Live runs'
    namespaces are left alone. Returns the names removed."""
    stale = [ns for ns in list_namespaces()
             if (owner := stale_owner(ns)) is not None and not pid_alive(owner)]
    if stale:
        for problem in remove(stale):
            print(f"smdccl.cluster: stale cleanup: {problem}", file=sys.stderr)
    return stale
