"""EmulatedCluster: the Python API over the network (netns) and the launcher (launch)."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from smdccl.cluster import launch, netns
from smdccl.cluster.errors import ClusterUnavailable
from smdccl.cluster.plan import (HOST_IF, NS_PREFIX, Plan, format_rate, log_dir_owner,
                                 log_dir_prefix, make_plan, parse_rate)

AGENT = str(Path(__file__).with_name("agent.py"))
_seq = itertools.count()  # several clusters per process (tests) need distinct names


def torchrun_argv(plan: Plan, node: int, procs_per_node: int, master_port: int,
                  command: Sequence[str], log_dir: str) -> list[str]:
    """The command line node ``node`` runs: torchrun (through the agent) with a
    static rendezvous on node 0's address. ``command`` is ``script [args]`` or
    ``-m module [args]``.

    Workers run with ``python -u``, so two ranks printing into one pipe would
    splice their lines (print writes text and newline separately); ``--tee``
    makes torchrun pass each rank's output on whole lines, prefixed by rank
    (the agent sets the prefix: see agent.py).

    Only options that torchrun has had since torch 2.0 (the oldest torch
    smdccl supports is older than some newer flags such as
    ``--log-line-prefix-template``, which torch 2.13 and earlier lack)."""
    command = list(command)
    if not command:
        raise ValueError("no command: give a script (or -m module) to run on every host")
    module = command[0] == "-m"
    if module:
        if len(command) < 2:
            raise ValueError("-m needs a module name")
        command = command[1:]
    # the agent runs by path, not -m: the hosts find it even when smdccl was
    # imported from somewhere PYTHONPATH does not name
    return [sys.executable, AGENT,
            "--nnodes", str(len(plan.hosts)), "--nproc-per-node", str(procs_per_node),
            "--node-rank", str(node),
            "--master-addr", plan.master_addr, "--master-port", str(master_port),
            "--tee", "3", "--log-dir", log_dir,
            *(["--module"] if module else []),
            # "--": the job's own options must not reach torchrun's parser, which
            # would take e.g. --node as an abbreviation of its --node-rank
            "--", *command]


def cleanup_stale() -> list[str]:
    """Remove what dead runs of ours left (a launcher killed with SIGKILL cannot
    clean up): their namespaces, with anything still running inside, and their
    torchrun log directories. Returns what was removed."""
    removed = netns.cleanup_stale()
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob(f"{NS_PREFIX}*-logs-*"):
        owner = log_dir_owner(d.name)
        if owner is not None and not netns.pid_alive(owner):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed


def pick_port() -> int:
    # Below Linux's ephemeral range (32768+), so no outgoing connection in the
    # master's namespace can already hold it; nothing else listens in a fresh one.
    return random.randrange(20000, 32768)


class EmulatedCluster:
    """``nodes`` emulated hosts joined by a bridge, each uplink shaped to ``link``.

        with EmulatedCluster(2, procs_per_node=2, link="1gbit") as c:
            rc, outputs = c.run(["train.py", "--epochs", "1"], timeout=300)

    ``link``: a tc rate ("1gbit", "100mbit"), bits per second as an int, or
    None / "none" / 0 for unshaped links. Needs root on Linux: entering raises
    :class:`ClusterUnavailable` otherwise. Leaving tears everything down, also
    after an exception.
    """

    def __init__(self, nodes: int, procs_per_node: int = 1, link: str | int | None = "1gbit"):
        if procs_per_node < 1:
            raise ValueError(f"procs_per_node must be >= 1 (got {procs_per_node})")
        if isinstance(link, str):
            rate = parse_rate(link)
        elif link is None or link == 0:
            rate = None
        else:
            rate = int(link)
        self.procs_per_node = procs_per_node
        self.plan = make_plan(nodes, rate, os.getpid(), next(_seq))
        self.last_runs: list[launch.HostRun] = []
        self._up = False

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.plan.hosts]

    @property
    def hostnames(self) -> list[str]:
        return [h.hostname for h in self.plan.hosts]

    @property
    def namespaces(self) -> list[str]:
        return self.plan.namespaces

    @property
    def master_addr(self) -> str:
        return self.plan.master_addr

    def describe(self) -> str:
        hosts = ", ".join(f"{h.hostname}={h.address}" for h in self.plan.hosts)
        return (f"{len(self.plan.hosts)} host(s) x {self.procs_per_node} proc(s), "
                f"link {format_rate(self.plan.rate_bits)} each way, {hosts}")

    def start(self) -> "EmulatedCluster":
        reason = netns.unavailable_reason()
        if reason:
            raise ClusterUnavailable(f"{reason}; {netns.REQUIREMENT}")
        cleanup_stale()
        netns.create(self.plan)
        self._up = True
        return self

    def close(self) -> None:
        if not self._up:
            return
        self._up = False
        for problem in netns.remove(self.plan.namespaces):
            print(f"smdccl.cluster: teardown: {problem}", file=sys.stderr, flush=True)

    def __enter__(self) -> "EmulatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def environment(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """The caller's environment plus ``env``. gloo resolves the hostname to
        pick its interface, which lands on 127.0.0.1 here, so it is told the
        interface; smdccl is deliberately not (it must find it by route)."""
        merged = dict(os.environ)
        merged.setdefault("PYTHONUNBUFFERED", "1")  # lines as they happen
        merged["GLOO_SOCKET_IFNAME"] = HOST_IF
        merged.update(env or {})
        return merged

    def run(self, command: Sequence[str], env: dict[str, str] | None = None,
            timeout: float | None = None, fail_grace: float = 10.0, echo: bool = True,
            master_port: int | None = None) -> tuple[int, list[list[str]]]:
        """torchrun ``command`` (``script [args]`` or ``-m module [args]``) on every
        host. Returns (worst exit code, each host's output lines)."""
        port = master_port or pick_port()
        # /tmp is shared by all hosts (ip netns exec only remounts /sys)
        logs = tempfile.mkdtemp(prefix=log_dir_prefix(self.plan.run_id))
        try:
            jobs = [(h, torchrun_argv(self.plan, h.index, self.procs_per_node, port, command,
                                      os.path.join(logs, h.hostname)))
                    for h in self.plan.hosts]
            return self._run(jobs, env, timeout, fail_grace, echo)
        finally:
            shutil.rmtree(logs, ignore_errors=True)

    def run_each(self, commands: Sequence[Sequence[str] | None], env: dict[str, str] | None = None,
                 timeout: float | None = None, fail_grace: float = 10.0,
                 echo: bool = True) -> tuple[int, list[list[str]]]:
        """Plain commands, ``commands[i]`` on host i (None: nothing there)."""
        if len(commands) != len(self.plan.hosts):
            raise ValueError(f"{len(commands)} commands for {len(self.plan.hosts)} hosts")
        jobs = [(h, list(c)) for h, c in zip(self.plan.hosts, commands) if c is not None]
        return self._run(jobs, env, timeout, fail_grace, echo)

    def _run(self, jobs, env, timeout, fail_grace, echo):
        if not self._up:
            raise RuntimeError("the cluster is not started (use it as a context manager)")
        self.last_runs = []
        rc, runs = launch.run_hosts(jobs, env=self.environment(env), timeout=timeout,
                                    fail_grace=fail_grace,
                                    sink=launch.echo_to(sys.stdout) if echo else None)
        self.last_runs = runs
        by_host = {r.host.index: r.lines for r in runs}
        return rc, [by_host.get(h.index, []) for h in self.plan.hosts]
