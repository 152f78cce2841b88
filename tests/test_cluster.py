"""The emulated multi-node cluster (``python -m smdccl.cluster``).

Unit tests (argument parsing, rates, the address plan) run anywhere. The rest
build real namespaces, bridges and tbf qdiscs, so they need root on Linux; they
are skipped, with the reason, when not root or when ``ip netns add`` fails.
Every namespace test also checks that it left no namespace of ours behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import smdccl
from smdccl.cluster import EmulatedCluster, netns
from smdccl.cluster.cli import parse_args
from smdccl.cluster.emulated import torchrun_argv
from smdccl.cluster.errors import ClusterTimeout
from smdccl.cluster.plan import (BENCH_NET, MAX_NODES, format_rate, log_dir_owner,
                                 log_dir_prefix, make_plan, parse_rate, stale_owner)

JOBS = Path(__file__).resolve().parent / "cluster_jobs"
REPO = Path(__file__).resolve().parents[1]
PKG_PARENT = str(Path(smdccl.__file__).resolve().parents[1])


def cli_env(**extra: str) -> dict[str, str]:
    """The environment a user would launch from: this smdccl importable, and no
    SMDCCL_SOCKET_IFNAME (the cluster proves smdccl finds the interface itself)."""
    env = dict(os.environ)
    env.pop("SMDCCL_SOCKET_IFNAME", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "smdccl.cluster", *args]


# ---------------------------------------------------------------------------
# Unit tests: no root needed
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text,bits", [
    ("1gbit", 10**9), ("100mbit", 10**8), ("2.5gbit", 25 * 10**8), ("500kbit", 5 * 10**5),
    ("125mbps", 10**9), ("10GBIT", 10**10), (" 1gbit ", 10**9),
    ("none", None), ("0", None), ("NONE", None),
])
def test_parse_rate(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["fast", "100", "1gbitx", "-1gbit", "1 furlong", "", "1kbit"])
def test_parse_rate_rejects(text):
    with pytest.raises(ValueError, match="link rate"):
        parse_rate(text)


def test_format_rate_round_trips():
    for text in ("1gbit", "100mbit", "2500mbit", "1500kbit", "12345bit", "none"):
        assert format_rate(parse_rate(text)) == text


def test_address_plan():
    plan = make_plan(3, parse_rate("1gbit"), pid=4242, seq=7)
    assert [h.address for h in plan.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert [h.hostname for h in plan.hosts] == ["node0", "node1", "node2"]
    assert plan.master_addr == "198.18.0.1"
    import ipaddress
    assert all(ipaddress.ip_address(h.address) in BENCH_NET for h in plan.hosts)
    assert len(set(plan.namespaces)) == 4 and all("4242" in ns for ns in plan.namespaces)
    assert all(stale_owner(ns) == 4242 for ns in plan.namespaces)
    assert stale_owner("smdccl-not-ours") is None and stale_owner("other-1-0-node0") is None
    assert log_dir_owner(log_dir_prefix(plan.run_id) + "x1y2") == 4242
    assert log_dir_owner("smdccl-x-logs-") is None
    # two clusters in one process do not collide
    assert not set(plan.namespaces) & set(make_plan(3, None, pid=4242, seq=8).namespaces)
    assert make_plan(MAX_NODES, None, 1).hosts[-1].address == "198.18.0.254"
    for bad in (0, -1, MAX_NODES + 1):
        with pytest.raises(ValueError, match="nodes"):
            make_plan(bad, None, 1)


def test_cli_parses():
    a = parse_args(["--nodes", "3", "--procs-per-node", "2", "--link", "100mbit",
                    "--env", "A=1", "--env", "B=x=y", "--timeout", "30",
                    "--", "-m", "smdccl.bench", "--timeout", "5"])
    assert (a.nodes, a.procs_per_node, a.link, a.timeout) == (3, 2, 10**8, 30.0)
    assert dict(a.env) == {"A": "1", "B": "x=y"}
    assert a.command == ["-m", "smdccl.bench", "--timeout", "5"]  # the job's own --timeout
    a = parse_args(["--link", "none", str(JOBS / "exit_on_node.py"), "--code", "1"])
    assert a.link is None and a.command[1:] == ["--code", "1"]
    assert parse_args(["--cleanup-stale"]).cleanup_stale


@pytest.mark.parametrize("argv,message", [
    (["--link", "fast", "--", "x.py"], "bad link rate 'fast'"),
    (["--link", "100", "--", "x.py"], "bad link rate '100'"),
    (["--nodes", "0", "--", "x.py"], "--nodes: must be >= 1"),
    (["--nodes", "two", "--", "x.py"], "--nodes: not an integer"),
    (["--procs-per-node", "0", "--", "x.py"], "--procs-per-node: must be >= 1"),
    (["--nodes", str(MAX_NODES + 1), "--", "x.py"], "at most 254"),
    ([], "no command given"),
    (["--nodes", "2", "--"], "no command given"),
    (["--", "-m"], "-m needs a module name"),
    (["--", "--verbose"], "must start with a script or -m MODULE"),
    (["--", "/nonexistent/train.py"], "script not found: /nonexistent/train.py"),
    (["--env", "NOVALUE", "--", "x.py"], "expected KEY=VALUE"),
    (["--timeout", "0", "--", "x.py"], "--timeout: must be > 0"),
    (["--cleanup-stale", "--", "x.py"], "--cleanup-stale takes no command"),
])
def test_cli_rejects(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_torchrun_command_line():
    plan = make_plan(2, None, pid=1)
    argv = torchrun_argv(plan, 1, 2, 23456, ["-m", "smdccl.bench", "--sizes", "4K"], "/logs")
    assert argv[0] == sys.executable and argv[1].endswith("agent.py")
    flags = argv[2:]
    assert flags[:10] == ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "1",
                          "--master-addr", "198.18.0.1", "--master-port", "23456"]
    assert flags[10:12] == ["--tee", "3"]  # whole lines per rank
    assert flags[-5:] == ["--module", "--", "smdccl.bench", "--sizes", "4K"]
    assert torchrun_argv(plan, 0, 1, 1, ["job.py", "-x"], "/logs")[-2:] == ["job.py", "-x"]
    # only flags every supported torchrun has (torch 2.11 lacks --log-line-prefix-template)
    options = {f for f in flags[:flags.index("--")] if f.startswith("--")}
    assert options <= {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr",
                       "--master-port", "--tee", "--log-dir", "--module"}, options
    from torch.distributed.run import get_args_parser
    parsed = get_args_parser().parse_args(flags[:flags.index("--")] + flags[flags.index("--") + 1:])
    assert (parsed.nnodes, parsed.nproc_per_node, parsed.tee, parsed.module) == ("2", "2", "3", True)
    with pytest.raises(ValueError, match="no command"):
        torchrun_argv(plan, 0, 1, 1, [], "/logs")


def _unprivileged_prefix() -> list[str] | None:
    """A command prefix that drops root for one process, or [] if not root."""
    if os.geteuid() != 0:
        return []
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    probe = subprocess.run([*nobody, sys.executable, "-c", "import smdccl.cluster.cli"],
                           env=cli_env(), capture_output=True)
    if probe.returncode == 0:
        return nobody
    # This interpreter lives where nobody may not read (/root/.pyenv): a user
    # namespace without a uid map still makes us uid 65534 to ourselves (no
    # namespace can be created there) while files stay readable.
    userns = ["unshare", "--user", "--"]
    probe = subprocess.run([*userns, sys.executable, "-c", "import os; assert os.geteuid() != 0"],
                           env=cli_env(), capture_output=True)
    return userns if probe.returncode == 0 else None


def test_non_root_gets_one_plain_line():
    prefix = _unprivileged_prefix()
    if prefix is None:
        pytest.skip("cannot drop root here (neither setpriv to nobody nor unshare --user works)")
    res = subprocess.run([*prefix, *cli("--nodes", "2", "--", str(JOBS / "exit_on_node.py"))],
                         env=cli_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert re.match(r"smdccl\.cluster: not running as root \(uid \d+\); it must run as root "
                    r"on Linux", lines[0]), lines[0]
    assert res.stdout == ""


# ---------------------------------------------------------------------------
# Real namespaces: root only
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def netns_ok():
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(f"emulated cluster unavailable: {reason}")
    probe = f"smdccl-{os.getpid()}-999999-node0"  # named like ours: stale cleanup covers it
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"emulated cluster unavailable: `ip netns add` failed: {res.stderr.strip()}")
    subprocess.run(["ip", "netns", "delete", probe], check=True)


@pytest.fixture
def clean(netns_ok):
    """Fails the test if it leaves a namespace of ours behind."""
    before = set(netns.ours())
    yield
    left = set(netns.ours()) - before
    if left:
        netns.remove(sorted(left))
        pytest.fail(f"namespaces left behind: {sorted(left)}")


def _pids_in(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(r" pid (\d+)", line))]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie awaiting its reaper runs no more


def test_hosts_have_own_name_address_and_route(clean):
    probe = ("import os, socket, subprocess; "
             "print('host', socket.gethostname(), os.environ['GLOO_SOCKET_IFNAME'], "
             "os.environ.get('SMDCCL_SOCKET_IFNAME'), os.environ['EXTRA']); "
             "print(subprocess.run(['ip', '-4', '-o', 'addr', 'show', 'eth0'], "
             "capture_output=True, text=True).stdout.split()[3]); "
             "print(subprocess.run(['ip', 'route', 'get', '198.18.0.2'], "
             "capture_output=True, text=True).stdout.split('\\n')[0]); "
             "print('routes', subprocess.run(['ip', 'route'], capture_output=True, text=True)"
             ".stdout.count('\\n'))")
    with EmulatedCluster(2, 1, "none") as c:
        assert c.addresses == ["198.18.0.1", "198.18.0.2"]
        rc, out = c.run_each([[sys.executable, "-c", probe]] * 2, env={"EXTRA": "x"},
                             timeout=60, echo=False)
    assert rc == 0, out
    assert out[0][0] == "host node0 eth0 None x" and out[1][0] == "host node1 eth0 None x"
    assert out[0][1] == "198.18.0.1/24" and out[1][1] == "198.18.0.2/24"
    assert "dev eth0" in out[0][2] and "dev lo" in out[1][2]  # node1 owns .2
    assert out[0][3] == "routes 1"  # the subnet only: no default route out of the cluster


@pytest.mark.smdccl_only
def test_two_level_matrix_across_two_nodes(clean):
    """Every op x dtype (allreduce, reduce_scatter) plus allgather and broadcast
    on 2 emulated hosts x 2 ranks over shaped links, with a small pipeline chunk
    so the two-level allreduce runs many chunks through the real network."""
    env = cli_env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    res = subprocess.run(
        cli("--nodes", "2", "--procs-per-node", "2", "--link", "10gbit", "--timeout", "400",
            "--env", "SMDCCL_PIPELINE_CHUNK_KB=64", "--env", "SMDCCL_DEBUG=INFO",
            "--", str(JOBS / "allreduce_check.py"), "--backend", "smdccl", "--expect-nodes", "2",
            "--matrix"),
        env=env, capture_output=True, text=True, timeout=450)
    report = f"stdout:\n{res.stdout[-20000:]}\nstderr:\n{res.stderr[-5000:]}"
    assert res.returncode == 0, report
    _assert_each_rank_ok_on_its_node(res.stdout, "smdccl", report)
    # The network was crossed by the two-level algorithms, not only the flat ones.
    assert "-> two_level" in res.stdout + res.stderr, report


def _assert_each_rank_ok_on_its_node(stdout: str, backend: str, report: str) -> None:
    lines = stdout.splitlines()
    assert lines and all(re.match(r"\[node[01]\] ", line) for line in lines), report
    for rank in range(4):
        ok = [line for line in lines if f"rank {rank} OK" in line]
        assert len(ok) == 1, report
        assert ok[0].startswith(f"[node{rank // 2}] [rank{rank}] rank {rank} OK host=node{rank // 2} "), report
        if backend == "smdccl":
            assert "topology='2 nodes" in ok[0], report


def test_allreduce_across_two_nodes_gloo(clean):
    """gloo through the same job and links (smdccl's run is the matrix above)."""
    env = cli_env()
    res = subprocess.run(
        cli("--nodes", "2", "--procs-per-node", "2", "--link", "1gbit", "--timeout", "150",
            "--", str(JOBS / "allreduce_check.py"), "--backend", "gloo", "--expect-nodes", "2"),
        env=env, capture_output=True, text=True, timeout=200)
    report = f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert res.returncode == 0, report
    _assert_each_rank_ok_on_its_node(res.stdout, "gloo", report)


@pytest.mark.smdccl_only
def test_peer_killed_mid_allreduce_across_nodes(clean):
    """Rank 3 (node1 of 2 x 2) SIGKILLs itself while a 64 MiB all_reduce is in
    flight over the 1 Gbit/s links: the survivors on both nodes (ranks 0 and 1
    on node0, rank 2 beside the victim) raise within the group timeout (6 s)
    + 5 s naming rank 3 and the op, later calls fail fast with that cause, the
    progress thread stops and destroy_process_group returns (the job checks
    all of it: tests/cluster_jobs/peer_kill.py). node1 fails with the SIGKILL:
    the cluster exits 128 + 9. node0's torchrun then waits in its exit barrier
    for node1's, which never comes: the cluster kills it --fail-grace (12 s)
    later, by when its ranks have reported (within 6 + 5 s)."""
    env = cli_env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    res = subprocess.run(
        cli("--nodes", "2", "--procs-per-node", "2", "--link", "1gbit", "--timeout", "150",
            "--fail-grace", "12", "--",
            str(JOBS / "peer_kill.py"), "--victim", "3", "--pg-timeout", "6"),
        env=env, capture_output=True, text=True, timeout=200)
    report = f"stdout:\n{res.stdout[-20000:]}\nstderr:\n{res.stderr[-5000:]}"
    lines = res.stdout.splitlines()
    assert not [line for line in lines if re.search(r"rank \d+ FAILED", line)], report
    assert any(line.startswith("[node1] [rank3] rank 3 dies now") for line in lines), report
    for rank in range(3):
        ok = [line for line in lines if f"rank {rank} SURVIVED" in line]
        assert len(ok) == 1, report
        assert ok[0].startswith(f"[node{rank // 2}] [rank{rank}] "), report
    assert res.returncode == 128 + signal.SIGKILL, report
    print("\n" + "\n".join(line for line in lines if "SURVIVED" in line))


def test_worst_exit_code_and_process_trees_killed(clean):
    with EmulatedCluster(2, 1, "none") as c:
        namespaces = c.namespaces
        rc, out = c.run([str(JOBS / "exit_on_node.py"), "--node", "1", "--code", "3",
                         "--sleep", "600"], timeout=120, fail_grace=3, echo=False)
        runs = {r.host.hostname: r for r in c.last_runs}
    assert rc == 3, out
    assert runs["node1"].code == 3
    # node0's worker sleeps on: killed after the grace, not counted as the job's code
    assert runs["node0"].code is None and "node1 (exit 3) failed" in runs["node0"].killed
    workers = _pids_in(out[0]) + _pids_in(out[1])
    assert len(workers) == 2, out
    assert all(_gone(p) for p in workers), [p for p in workers if not _gone(p)]
    assert not set(namespaces) & set(netns.list_namespaces())


def test_exception_inside_tears_down(clean):
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(3, 1, "1gbit") as c:
            namespaces = c.namespaces
            assert set(namespaces) <= set(netns.list_namespaces())
            raise RuntimeError("boom")
    assert not set(namespaces) & set(netns.list_namespaces())


def test_timeout_kills_everything(clean):
    sleeper = [sys.executable, "-c",
               "import os, time; print('up pid', os.getpid(), flush=True); time.sleep(600)"]
    with EmulatedCluster(2, 1, "none") as c:
        t0 = time.monotonic()
        with pytest.raises(ClusterTimeout, match=r"timed out after 2 s") as exc:
            c.run_each([sleeper, sleeper], timeout=2, echo=False)
        assert time.monotonic() - t0 < 20
    pids = _pids_in(exc.value.outputs[0]) + _pids_in(exc.value.outputs[1])
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_cli_timeout_message(clean):
    res = subprocess.run(
        cli("--nodes", "2", "--timeout", "4", "--link", "none", "--",
            str(JOBS / "exit_on_node.py"), "--sleep", "600"),
        env=cli_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 124, res
    assert "smdccl.cluster: job timed out after 4 s" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_sigterm_tears_down(clean):
    proc = subprocess.Popen(
        cli("--nodes", "2", "--procs-per-node", "1", "--link", "none", "--",
            str(JOBS / "exit_on_node.py"), "--sleep", "600"),
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: list[str] = []
    reader = threading.Thread(target=lambda: started.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while sum("started" in line for line in started) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (started, proc.stderr.read())
        time.sleep(0.1)
    mine = [ns for ns in netns.ours() if stale_owner(ns) == proc.pid]
    assert len(mine) == 3
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    reader.join(timeout=10)
    err = proc.stderr.read()
    assert "interrupted by SIGTERM" in err and "Traceback" not in err, err
    assert not set(mine) & set(netns.list_namespaces())
    workers = _pids_in(started)
    assert len(workers) == 2 and all(_gone(p) for p in workers)


def test_cleanup_stale_removes_only_dead_runs(clean):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"smdccl-{dead.pid}-0-node0", f"smdccl-{os.getpid()}-424242-node0"
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    stale_logs = Path(tempfile.mkdtemp(prefix=f"smdccl-{dead.pid}-0-logs-"))
    live_logs = Path(tempfile.mkdtemp(prefix=f"smdccl-{os.getpid()}-424242-logs-"))
    try:
        # something still running in the dead run's namespace must die with it
        sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
        deadline = time.monotonic() + 10
        while not netns.pids_in(stale) and time.monotonic() < deadline:
            time.sleep(0.05)
        res = subprocess.run(cli("--cleanup-stale"), env=cli_env(), capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0 and stale in res.stderr, res
        names = netns.list_namespaces()
        assert stale not in names and live in names
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not stale_logs.exists() and live_logs.exists()
    finally:
        netns.remove([ns for ns in (stale, live) if ns in netns.list_namespaces()])
        shutil.rmtree(stale_logs, ignore_errors=True)
        shutil.rmtree(live_logs, ignore_errors=True)


def _rate(cluster: EmulatedCluster, mbytes: int) -> float:
    dst = cluster.addresses[1]
    tool = [sys.executable, str(JOBS / "tcp_rate.py")]
    rc, out = cluster.run_each([[*tool, "send", dst, "5201", str(mbytes)],
                                [*tool, "recv", dst, "5201", str(mbytes)]],
                               timeout=60, echo=False)
    assert rc == 0, out
    return float(next(line for line in out[1] if line.startswith("rate")).split()[1])


def test_links_are_shaped(clean):
    # best of a few: a loaded machine can only make a transfer slower than its
    # link, never faster, so the maximum is the fair reading of each link
    with EmulatedCluster(2, 1, "1gbit") as c:
        gbit = max(_rate(c, 20) for _ in range(2))
    with EmulatedCluster(2, 1, "200mbit") as c:
        slow = max(_rate(c, 5) for _ in range(2))
    with EmulatedCluster(2, 1, "none") as c:
        free = 0.0
        for _ in range(3):
            free = max(free, _rate(c, 20))
            if free > gbit * 1.5:
                break
    # 1gbit = 125 MB/s of wire; TCP/IP headers take ~5 %
    assert 30 < gbit < 160, (slow, gbit, free)
    assert 8 < slow < 32, (slow, gbit, free)
    assert free > gbit, (slow, gbit, free)


def test_module_command_on_one_node(clean):
    res = subprocess.run(cli("--nodes", "1", "--link", "none", "--timeout", "120", "--",
                             "-m", "platform", "--terse"),
                         env=cli_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res
    assert re.search(r"^\[node0\] \[rank0\] Linux-", res.stdout, re.M), res.stdout
