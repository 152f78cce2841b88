"""Run one command per emulated host, stream every host's output with a prefix,
and reduce the hosts' exit codes to the worst one."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from smdccl.cluster import netns
from smdccl.cluster.errors import ClusterTimeout
from smdccl.cluster.plan import Host

# `unshare --uts` gives the host a hostname of its own without touching the
# machine's; the shell sets it and then becomes the command.
_SET_HOSTNAME = 'hostname "$0" && exec "$@"'


def host_argv(host: Host, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so it runs inside ``host``: its network namespace, its
    hostname. pdeathsig: if the launcher dies without cleaning up (SIGKILL), the
    host's top process dies with it; what it started is reaped by the next run's
    stale cleanup."""
    return ["setpriv", "--pdeathsig", "KILL", "--",
            "ip", "netns", "exec", host.netns,
            "unshare", "--uts", "--",
            "sh", "-c", _SET_HOSTNAME, host.hostname, *argv]


def exit_code(returncode: int) -> int:
    """A shell-style code: death by signal N reads 128+N, like `$?`."""
    return returncode if returncode >= 0 else 128 - returncode


@dataclass
class HostRun:
    host: Host
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    code: int | None = None        # set when the host's command ended by itself
    killed: str | None = None      # why the launcher killed it, if it did
    reader: threading.Thread | None = None


def _pump(run: HostRun, sink: Callable[[str], None] | None) -> None:
    # line by line as it arrives: a hung job still shows how far each host got
    for raw in iter(run.proc.stdout.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        run.lines.append(line)
        if sink is not None:
            sink(f"[{run.host.hostname}] {line}")
    run.proc.stdout.close()


def echo_to(stream) -> Callable[[str], None]:
    lock = threading.Lock()

    def sink(line: str) -> None:
        with lock:
            stream.write(line + "\n")
            stream.flush()
    return sink


def run_hosts(jobs: Sequence[tuple[Host, Sequence[str]]], env: dict[str, str] | None = None,
              timeout: float | None = None, fail_grace: float = 10.0,
              sink: Callable[[str], None] | None = None,
              note: Callable[[str], None] | None = None) -> tuple[int, list[HostRun]]:
    """Start every ``(host, argv)`` at once; wait for all.

    Returns the worst exit code among hosts whose command ended by itself, and
    each host's run. Once a host fails, the others get ``fail_grace`` seconds to
    end (a torchrun whose peer died would otherwise wait out its own 300 s exit
    barrier), then are killed and not counted. Raises :class:`ClusterTimeout`
    after ``timeout`` seconds, every process killed.
    """
    note = note or (lambda msg: print(f"smdccl.cluster: {msg}", file=sys.stderr, flush=True))
    runs: list[HostRun] = []
    start = time.monotonic()
    try:
        for host, argv in jobs:
            proc = subprocess.Popen(
                host_argv(host, argv), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True)  # the terminal's Ctrl-C is ours to handle
            run = HostRun(host, proc)
            run.reader = threading.Thread(target=_pump, args=(run, sink), daemon=True,
                                          name=f"smdccl.cluster {host.hostname}")
            run.reader.start()
            runs.append(run)

        grace_until = None
        while True:
            for r in runs:
                if r.code is None and r.killed is None and r.proc.poll() is not None:
                    r.code = exit_code(r.proc.returncode)
                    if r.code != 0 and grace_until is None:
                        grace_until = time.monotonic() + fail_grace
            running = [r for r in runs if r.code is None and r.killed is None]
            if not running:
                break
            now = time.monotonic()
            if timeout is not None and now - start > timeout:
                _kill(running, f"timed out after {timeout:g} s")
                outputs = [r.lines for r in runs]
                what = ", ".join(r.host.hostname for r in running)
                raise ClusterTimeout(f"job timed out after {timeout:g} s (still running: {what}); "
                                     "killed every host's processes", outputs)
            if grace_until is not None and now > grace_until:
                failed = [f"{r.host.hostname} (exit {r.code})" for r in runs if r.code]
                reason = f"{', '.join(failed)} failed {fail_grace:g} s earlier"
                note(f"{reason}; killing {', '.join(r.host.hostname for r in running)}")
                _kill(running, reason)
                continue
            time.sleep(0.05)
    finally:
        leftover = [r for r in runs if r.proc.poll() is None]
        if leftover:  # an exception or signal got here first
            _kill(leftover, "launcher interrupted")
        _drain(runs)

    counted = [r.code for r in runs if r.code is not None]
    return (max(counted) if counted else 1), runs


def _kill(runs: list[HostRun], reason: str) -> None:
    for r in runs:
        r.killed = reason
    netns.kill_all([r.host.netns for r in runs])
    for r in runs:
        try:
            r.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
            r.proc.kill()


def _drain(runs: list[HostRun]) -> None:
    # A host's command may have ended while something it started still holds the
    # pipe (an orphaned worker): give it a moment, then kill what is left there.
    for r in runs:
        if r.reader is not None:
            r.reader.join(timeout=2)
    stuck = [r for r in runs if r.reader is not None and r.reader.is_alive()]
    if stuck:
        netns.kill_all([r.host.netns for r in stuck])
        for r in stuck:
            r.reader.join(timeout=10)
    for r in runs:
        if r.proc.poll() is None:  # pragma: no cover
            r.proc.send_signal(signal.SIGKILL)
        r.proc.wait()
