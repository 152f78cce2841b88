"""What an emulated cluster will look like, decided before anything is created:
link rates, addresses, namespace and interface names (pure functions, no root).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# RFC 2544's benchmark range: guaranteed not to collide with a real network, so a
# mistake in the plan can never send test traffic somewhere that matters.
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
SUBNET = ipaddress.ip_network("198.18.0.0/24")
MAX_NODES = SUBNET.num_addresses - 2  # .0 is the network, .255 the broadcast

NS_PREFIX = "smdccl-"
HOST_IF = "eth0"      # same name on every host, like real machines; namespaces keep them apart
BRIDGE = "br0"

# tc's units: "bit" counts bits per second, "bps" bytes per second (tc-bitrate(8)).
_RATE_UNITS = {
    "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_rate(text: str) -> int | None:
    """Link rate in bits per second, or None for an unshaped link ("none" or "0").

    Units follow tc: 1gbit, 100mbit, 500kbit, 125mbps (bytes/s). A bare number
    is refused because tc would read it as bytes/s, which nobody means.
    """
    t = str(text).strip().lower()
    if t in ("none", "0", "unlimited", "off"):
        return None
    m = _RATE_RE.match(t)
    if not m:
        raise ValueError(f"bad link rate {text!r}: expected e.g. 1gbit, 100mbit, 10gbit "
                         f"or none (units: {', '.join(_RATE_UNITS)})")
    value, unit = m.groups()
    if unit not in _RATE_UNITS:
        raise ValueError(f"bad link rate {text!r}: unknown unit {unit!r} "
                         f"(use one of {', '.join(_RATE_UNITS)})")
    bits = round(float(value) * _RATE_UNITS[unit])
    if bits < 8000:
        # below ~1 kB/s tbf's queue (latency 100ms) cannot even hold one packet
        raise ValueError(f"link rate {text!r} is too low (minimum 8kbit)")
    return bits


def format_rate(bits: int | None) -> str:
    """A rate as tc and humans read it (exact: tc takes integer bit rates)."""
    if bits is None:
        return "none"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


def host_address(node: int) -> str:
    """Node i gets 198.18.0.(i+1); node 0 doubles as the rendezvous master."""
    if not 0 <= node < MAX_NODES:
        raise ValueError(f"node index {node} out of range 0..{MAX_NODES - 1}")
    return str(SUBNET.network_address + node + 1)


@dataclass(frozen=True)
class Host:
    index: int
    hostname: str   # inside the host's own UTS namespace
    netns: str      # the host's network namespace
    address: str    # IPv4 on HOST_IF, /SUBNET.prefixlen
    port: str       # the bridge's end of the host's veth (in the bridge namespace)


@dataclass(frozen=True)
class Plan:
    run_id: str
    bridge_netns: str
    hosts: tuple[Host, ...]
    rate_bits: int | None

    @property
    def namespaces(self) -> list[str]:
        return [h.netns for h in self.hosts] + [self.bridge_netns]

    @property
    def master_addr(self) -> str:
        return self.hosts[0].address


def make_plan(nodes: int, rate_bits: int | None, pid: int, seq: int = 0) -> Plan:
    """Names carry the creating pid so a later run can tell a dead run's leftovers
    from a live neighbour's namespaces (see :func:`stale_owner`)."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1 (got {nodes})")
    if nodes > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes fit in {SUBNET} (got {nodes})")
    run_id = f"{NS_PREFIX}{pid}-{seq}"
    hosts = tuple(
        Host(index=i, hostname=f"node{i}", netns=f"{run_id}-node{i}",
             address=host_address(i), port=f"node{i}")
        for i in range(nodes)
    )
    return Plan(run_id=run_id, bridge_netns=f"{run_id}-bridge", hosts=hosts, rate_bits=rate_bits)


_NS_RE = re.compile(rf"^{re.escape(NS_PREFIX)}(\d+)-\d+-(?:node\d+|bridge)$")


def stale_owner(netns: str) -> int | None:
    """The pid that created ``netns`` if the name is one of ours, else None."""
    m = _NS_RE.match(netns)
    return int(m.group(1)) if m else None


def log_dir_prefix(run_id: str) -> str:
    """Prefix of the temporary directory holding a run's torchrun logs."""
    return f"{run_id}-logs-"


_LOGS_RE = re.compile(rf"^{re.escape(NS_PREFIX)}(\d+)-\d+-logs-")


def log_dir_owner(name: str) -> int | None:
    """The pid that created the log directory ``name`` if it is one of ours."""
    m = _LOGS_RE.match(name)
    return int(m.group(1)) if m else None
