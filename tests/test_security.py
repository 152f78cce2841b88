"""The TCP listener accepts only peers that present the group's token.

While a 2-rank job is running, rank 0 opens raw connections to rank 1's
listener and sends: random bytes, a truncated handshake, a well-formed
handshake with a wrong token, and one with the right layout but ranks out of
range. Every one must be closed by rank 1 without an acknowledgement, rank 1
must count them as rejected, and the job's collectives must stay correct
before, during and after.

test_listener_survives_fuzzing_during_job does the same at scale: a seeded
flood of malformed, half-sent and idle connections while correct collectives
run in a loop, on the default topology and over TCP only
(SMDCCL_TOPOLOGY=1,1); rejections counted and logged, new groups still
connect, rank 1's memory and descriptors bounded.

test_p2p_length_field_does_not_size_the_buffer: a send/recv header whose
length field claims 3 GiB costs the receiver what arrives, not the claim.
smdccl only."""

from __future__ import annotations

import math
import os
import random
import socket
import struct
import tempfile
import threading
import time

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks, under_address_sanitizer

pytestmark = pytest.mark.smdccl_only

MAGIC, VERSION, COLLECTIVE = 0x43444D53, 1, 1


def _hello(token: bytes, src: int, dst: int) -> bytes:
    return struct.pack("<IHHii16s", MAGIC, VERSION, COLLECTIVE, src, dst, token)


def _closed_without_ack(addr: str, payload: bytes) -> bool:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(payload)
        if len(payload) < 32:
            s.shutdown(socket.SHUT_WR)  # a truncated handshake, then nothing more
        s.settimeout(10)
        try:
            return s.recv(4) == b""  # the listener hung up; an ack would be 4 bytes
        except ConnectionResetError:
            return True


def bad_connections_are_dropped():
    rank = dist.get_rank()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    addrs = [None, None]
    dist.all_gather_object(addrs, backend.listen_address)
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == 3)
    if rank == 0:
        attempts = {
            "random bytes": os.urandom(64),
            "truncated handshake": _hello(os.urandom(16), 0, 1)[:20],
            "wrong token": _hello(os.urandom(16), 0, 1),
            "ranks out of range": _hello(os.urandom(16), 7, 1),
        }
        for name, payload in attempts.items():
            assert _closed_without_ack(addrs[1], payload), f"{name}: connection was not dropped"
    dist.barrier()
    rejected = [0, 0]
    dist.all_gather_object(rejected, backend.rejected_connections)
    assert rejected[1] >= 4, f"rank 1 rejected only {rejected[1]} of 4 bad connections"
    x = torch.arange(100_000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(100_000, dtype=torch.float64) * 3)
    return rejected[1]


def test_listener_drops_bad_handshakes():
    results = run_ranks(2, bad_connections_are_dropped, timeout=120)
    assert results[0] >= 4


def listener_out_of_fds() -> float:
    """Rank 1 runs out of file descriptors while a connection waits in its
    listener's backlog: accept() fails with EMFILE as long as that lasts. The
    listener must back off (it used to poll and fail again at once, a core at
    100 %), then accept once descriptors are free again; the group works."""
    import resource

    rank = dist.get_rank()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    addrs = [None, None]
    dist.all_gather_object(addrs, backend.listen_address)
    t = torch.ones(1000)
    dist.all_reduce(t)  # links up: the barriers below open no descriptor
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cpu = 0.0
    if rank == 1:
        lowest_free = os.dup(0)  # a new descriptor takes the lowest free number
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # nothing more opens
    dist.barrier()
    sock = None
    if rank == 0:
        host, port = addrs[1].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)  # queued in the backlog
    dist.barrier()
    if rank == 1:
        try:
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            time.sleep(1.0)
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    dist.barrier()
    if rank == 0:
        sock.close()
    x = torch.arange(10_000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(10_000, dtype=torch.float64) * 3)
    return cpu


def test_listener_backs_off_when_out_of_fds():
    cpu = run_ranks(2, listener_out_of_fds, timeout=120)[1]
    print(f"\nrank 1 CPU time over 1 s out of descriptors: {cpu:.3f} s")
    # A spinning listener burns about the whole second; backing off, the
    # process is idle (CPU time of all its threads).
    assert cpu < 0.3, f"rank 1 used {cpu:.2f} s of CPU in 1 s while accept() failed with EMFILE"


# ---------------------------------------------------------------------------
# Fuzzing the listener while a job runs (see the test's docstring)
# ---------------------------------------------------------------------------

FUZZ_SEED = int(os.environ.get("SMDCCL_TEST_FUZZ_SEED", "20240611"))
FLOOD_CONNECTIONS = 300
MAX_PENDING = 256       # TcpListener::kMaxPending
HANDSHAKE_S = 5.0       # TcpListener::kHandshakeMs
DROP_WARN_BURST = 10    # TcpListener::kDropWarnBurst
DROP_WARN_WINDOW_S = 10  # TcpListener::kDropWarnWindowS
RSS_LIMIT_MIB = 32      # rank 1's VmRSS may grow by less than this over the whole run


def _asan_quarantine_mib() -> int:
    """Under AddressSanitizer (scripts/sanitize.sh) freed memory waits in a
    quarantine (256 MiB by default) before it is reused, so RSS grows by up to
    that much without a leak: the bound allows for it there, and only there."""
    if not under_address_sanitizer():
        return 0
    for opt in os.environ.get("ASAN_OPTIONS", "").split(":"):
        if opt.startswith("quarantine_size_mb="):
            return int(opt.split("=", 1)[1])
    return 256
FRESH_GROUP_LIMIT_S = 4.0  # a new group's first connections, with idle sockets open (< HANDSHAKE_S)

FLOOD_KINDS = [
    "random bytes", "valid magic, random rest", "truncated", "closed mid-frame",
    "oversized", "wrong token", "token off by one", "right token, bad ranks",
    "right token, bad channel", "right token, bad version", "idle", "idle past the timeout",
    "slow and wrong",
]
# Reasons rank 1 must have logged for the flood: one per thing the flood
# does, so a generator that stopped producing a kind would be noticed.
FLOOD_REASONS = [
    "bad magic or version", "unknown group token", "ranks out of range", "unknown channel",
    "closed before a complete handshake", "no handshake in time",
]


def _incarnation_store(group):
    """Where smdccl keeps ``group``'s keys: torch's store for the group (prefixed
    "cpu/"), under "smdccl/<members>/0" for its first incarnation (see
    incarnationStore in csrc/backend/backend.cpp: FNV-1a of the size and the
    members' global ranks)."""
    from torch.distributed import PrefixStore
    from torch.distributed.distributed_c10d import _get_process_group_store

    ranks = dist.get_process_group_ranks(group)
    h = 1469598103934665603
    for v in [len(ranks), *ranks]:
        h = ((h ^ v) * 1099511628211) % (1 << 64)
    return PrefixStore(f"smdccl/{h:016x}/0", PrefixStore("cpu/", _get_process_group_store(group)))


def _group_token(group) -> bytes:
    """The 16-byte secret of ``group``'s smdccl backend, read where rank 0 put it
    (torch hands the backend the group's store prefixed with "cpu/"; smdccl
    prefixes it with the group's incarnation)."""
    store = _incarnation_store(group)
    assert store.check(["smdccl/token"]), "the group's token is not where the backend put it"
    token = bytes.fromhex(store.get("smdccl/token").decode())
    assert len(token) == 16
    return token


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])  # kB
    raise KeyError(key)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _garbage(rng, kind: str, token: bytes) -> bytes:
    """One seeded malformed handshake of the given kind (never an acceptable one:
    rank 1 is rank 1 of a 2-rank group; channels are 1, 2 and 3, the probe)."""
    if kind == "random bytes":
        return rng.randbytes(rng.randrange(0, 80))
    if kind == "valid magic, random rest":
        return struct.pack("<IH", MAGIC, VERSION) + rng.randbytes(26)
    if kind == "wrong token":
        return _hello(rng.randbytes(16), 0, 1)
    if kind == "token off by one":
        i = rng.randrange(16)
        bad = bytearray(token)
        bad[i] = (bad[i] + rng.choice((1, 255))) % 256
        return _hello(bytes(bad), 0, 1)
    if kind == "right token, bad ranks":
        src, dst = rng.choice([(2, 1), (-1, 1), (0, 0), (0, 2), (2**31 - 1, 1), (-2**31, 1),
                               (0, -1), (7, 7)])
        return struct.pack("<IHHii16s", MAGIC, VERSION, rng.choice((1, 2)), src, dst, token)
    if kind == "right token, bad channel":
        return struct.pack("<IHHii16s", MAGIC, VERSION, rng.choice((0, 4, 255, 0xFFFF)), 0, 1, token)
    if kind == "right token, bad version":
        return struct.pack("<IHHii16s", MAGIC, rng.choice((0, 2, 0xFFFF)), 1, 0, 1, token)
    raise ValueError(kind)


def _expect_dropped(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True if the listener closed ``sock`` without sending its 4-byte ack."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _flood(addr: str, token: bytes, seed: int, n: int, report: dict) -> None:
    """Rank 0's flood thread: ``n`` connections to rank 1's listener, each
    carrying one kind of seeded garbage; counts kinds and any failure to drop."""
    rng = random.Random(seed)
    host, port = addr.rsplit(":", 1)
    kinds: dict[str, int] = {}
    not_dropped: list[str] = []
    held: list[tuple[socket.socket, float, str]] = []  # idle sockets and when to let go

    def reap(final: bool) -> None:
        now = time.monotonic()
        for item in list(held):
            sock, until, kind = item
            if final or now >= until:
                if kind == "idle past the timeout" and not _expect_dropped(sock, 5.0):
                    not_dropped.append(kind)  # the listener should have hung up by now
                sock.close()
                held.remove(item)

    try:
        for _ in range(n):
            kind = rng.choice(FLOOD_KINDS)
            kinds[kind] = kinds.get(kind, 0) + 1
            s = socket.create_connection((host, int(port)), timeout=10)
            if kind == "idle":
                held.append((s, time.monotonic() + rng.uniform(0.1, 2.0), kind))
            elif kind == "idle past the timeout":
                held.append((s, time.monotonic() + HANDSHAKE_S + 2.5, kind))
            elif kind in ("truncated", "closed mid-frame"):
                whole = _hello(token if rng.random() < 0.5 else rng.randbytes(16), 0, 1)
                s.sendall(whole[: rng.randrange(0, 32)])
                if kind == "closed mid-frame":
                    if rng.random() < 0.5:  # abortive close: RST instead of FIN
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                    continue
                s.shutdown(socket.SHUT_WR)
                if not _expect_dropped(s):
                    not_dropped.append(kind)
                s.close()
            elif kind == "oversized":
                # a bad Hello followed by 4 MiB: the listener reads 32 bytes and
                # hangs up on the rest (buffering it would show in VmRSS: the
                # flood sends ~90 MiB this way, RSS_LIMIT_MIB is 32)
                try:
                    s.sendall(_hello(rng.randbytes(16), 0, 1) + rng.randbytes(4 << 20))
                except (ConnectionResetError, BrokenPipeError):
                    pass
                if not _expect_dropped(s):
                    not_dropped.append(kind)
                s.close()
            elif kind == "slow and wrong":
                for b in _hello(rng.randbytes(16), 1, 0):
                    s.sendall(bytes([b]))
                    time.sleep(0.005)
                if not _expect_dropped(s):
                    not_dropped.append(kind)
                s.close()
            else:
                payload = _garbage(rng, kind, token)
                s.sendall(payload)
                if len(payload) < 32:
                    s.shutdown(socket.SHUT_WR)
                if not _expect_dropped(s):
                    not_dropped.append(kind)
                s.close()
            time.sleep(rng.uniform(0, 0.01))
            reap(final=False)
        while held:
            time.sleep(0.05)
            reap(final=False)
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        report["error"] = f"{type(exc).__name__}: {exc}"
        reap(final=True)
    report["kinds"] = kinds
    report["not_dropped"] = not_dropped


def _check_collectives(it: int, rank: int, group=None) -> None:
    """One round of collectives with exactly known results (integers in float64)."""
    n = (1, 7, 1000, 65_537, 300_003)[it % 5]
    x = torch.arange(n, dtype=torch.float64) * (rank + 1) + it
    dist.all_reduce(x, group=group)
    assert torch.equal(x, torch.arange(n, dtype=torch.float64) * 3 + 2 * it), f"all_reduce n={n} it={it}"
    b = torch.full((n,), float(it * 10 + rank))
    dist.broadcast(b, src=it % 2, group=group)
    assert torch.all(b == it * 10 + it % 2), f"broadcast n={n} it={it}"
    parts = [torch.empty(n) for _ in range(2)]
    dist.all_gather(parts, torch.full((n,), float(rank + it)), group=group)
    assert all(torch.all(p == r + it) for r, p in enumerate(parts)), f"all_gather n={n} it={it}"
    out, inp = torch.empty(n), torch.full((n,), float(100 * rank + it))
    reqs = [dist.isend(inp, dst=1 - rank, group=group, tag=it),
            dist.irecv(out, src=1 - rank, group=group, tag=it)]
    for r in reqs:
        r.wait()
    assert torch.all(out == 100 * (1 - rank) + it), f"send/recv n={n} it={it}"


def _fresh_group_seconds(rank: int, keep: list) -> float:
    """Time a new group's creation and its first collectives and send/recv,
    which open new connections to the listeners. The group goes into ``keep``
    and is destroyed at the end (see _destroy_groups)."""
    t0 = time.monotonic()
    g = dist.new_group([0, 1])
    _check_collectives(3, rank, group=g)
    keep.append(g)
    return time.monotonic() - t0


def _destroy_groups(groups: list) -> None:
    """Destroys the groups ``_fresh_group_seconds`` made, long after their last
    send/recv, after releasing the GIL for a while.

    Why the wait: smdccl's send/recv threads drop their references to the
    work and tensor after completing it, and dropping a tensor that has a
    Python object takes the GIL. Destroying the group from Python joins those
    threads with the GIL held, so a thread still on its way out deadlocks the
    teardown (this test hung that way in about one run in four, destroying
    each group right after its send/recv while the flood thread competed for
    the GIL; reported, not fixed here: the fix belongs in the backend's
    destructor or its pybind11 holder, not in the transport)."""
    time.sleep(0.5)
    for g in groups:
        dist.destroy_process_group(g)
    groups.clear()


def fuzz_listener_during_job(seed: int, connections: int = FLOOD_CONNECTIONS) -> dict:
    rank = dist.get_rank()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    addrs = [None, None]
    dist.all_gather_object(addrs, backend.listen_address)
    # Warm-up: every connection of the world group exists (collective links and
    # both send/recv sockets), so the flood is the only thing that changes.
    for it in range(5):
        _check_collectives(it, rank)
    import gc

    capture = None
    if rank == 1:  # the engine logs to fd 2: keep rank 1's log of the run
        capture = tempfile.TemporaryFile()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
    gc.collect()
    rss_before, fds_before = _proc_status("VmRSS"), _open_fds()
    rejected_before = backend.rejected_connections
    try:
        dist.barrier()
        flood_started = time.monotonic()
        report: dict = {}
        flood = None
        if rank == 0:
            flood = threading.Thread(target=_flood, name="flood", daemon=True,
                                     args=(addrs[1], _group_token(dist.group.WORLD), seed,
                                           connections, report))
            flood.start()
        # Correct collectives in a loop for as long as the flood lasts; a new
        # group mid-flood proves real peers still get through the listener.
        rounds, fresh_during_flood, groups = 0, None, []
        while True:
            _check_collectives(rounds, rank)
            if rounds == 2:
                fresh_during_flood = _fresh_group_seconds(rank, groups)
            rounds += 1
            done = torch.tensor([1.0 if rank == 0 and not flood.is_alive() else 0.0])
            dist.all_reduce(done, op=dist.ReduceOp.MAX)
            if done.item() and rounds > 3:
                break
        rss_flood = _proc_status("VmRSS")
        # Idle connections (sending nothing) must not hold up real peers: first a
        # few, then more than the listener keeps half-open.
        idle: list[socket.socket] = []
        host, port = addrs[1].rsplit(":", 1)
        fresh = []
        for count in (8, MAX_PENDING + 24):
            if rank == 0:
                while len(idle) < count:
                    idle.append(socket.create_connection((host, int(port)), timeout=10))
                time.sleep(0.5)  # let rank 1's listener accept them all
            dist.barrier()
            fresh.append(_fresh_group_seconds(rank, groups))
        for s in idle:
            s.close()
        _destroy_groups(groups)
        expected = [connections + len(idle)]
        dist.broadcast_object_list(expected, src=0)
        result: dict = {"rounds": rounds, "fresh_group_s": [fresh_during_flood, *fresh]}
        if rank == 0:
            result.update(report)
            result["idle"] = len(idle)
        else:
            # Every bad connection is dropped once it has been judged; the idle
            # ones when closed (or at the handshake timeout).
            deadline = time.monotonic() + 20
            while (backend.rejected_connections - rejected_before < expected[0]
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            deadline = time.monotonic() + 10
            while _open_fds() != fds_before and time.monotonic() < deadline:
                time.sleep(0.1)
            gc.collect()
            result.update(
                rejected=backend.rejected_connections - rejected_before,
                expected_rejected=expected[0],
                rss_before_kb=rss_before, rss_flood_kb=rss_flood, rss_after_kb=_proc_status("VmRSS"),
                fds_before=fds_before, fds_after=_open_fds(),
            )
        # The job goes on after it all.
        _check_collectives(7, rank)
    finally:
        if capture is not None:
            os.dup2(saved, 2)
            os.close(saved)
    if capture is not None:
        capture.seek(0)
        log = capture.read().decode(errors="replace")
        capture.close()
        dropped = [line for line in log.splitlines() if "dropped connection from" in line]
        result["logged_drops"] = len(dropped)
        result["warned_drops"] = sum(" WARN" in line for line in dropped)
        result["flood_s"] = time.monotonic() - flood_started
        reasons: dict[str, int] = {}
        for line in dropped:  # "[smdccl WARN ...] dropped connection from IP:PORT: why"
            why = line.split("dropped connection from ", 1)[1].split(": ", 1)[-1]
            reasons[why] = reasons.get(why, 0) + 1
        result["reasons"] = reasons
        result["log_sample"] = dropped[:3]
    return result


@pytest.mark.parametrize("topology", ["default", "1,1"])
def test_listener_survives_fuzzing_during_job(topology):
    """Rank 0's thread opens FLOOD_CONNECTIONS connections to rank 1's listener,
    each with seeded garbage of one of FLOOD_KINDS (random bytes, the right
    magic with a random rest, handshakes truncated or closed mid-frame, 4 MiB
    after a bad handshake, wrong tokens, the group's token off by one byte or
    with bad ranks, channel or version, byte-at-a-time senders, connections
    that send nothing for a while or until the listener's 5 s timeout), while
    both ranks run all_reduce, broadcast, all_gather and send/recv with exact
    expected results in a loop and create a new group mid-flood. Then 8, and
    then MAX_PENDING + 24, idle connections are held open while a new group
    connects. Rank 1 must have rejected exactly one per bad connection, logged
    each with its reason (WARN for the first few of each 10 s, INFO after), kept VmRSS within RSS_LIMIT_MIB and come back to its
    descriptor count; every new group must connect in under FRESH_GROUP_LIMIT_S
    (a listener reading handshakes one at a time, or refusing newcomers while
    full, fails this).

    The garbage comes from Python's ``random`` seeded with FUZZ_SEED
    (SMDCCL_TEST_FUZZ_SEED overrides it), not from hypothesis or atheris: the
    suite should not grow a dependency for one test; a fixed seed replays a
    failure exactly (the seed and per-kind counts are in the report); and what
    is fuzzed here is a live listener in another process, where coverage
    guidance and shrinking cannot see anyway. The parsers themselves are
    fuzzed in-process, ~185,000 seeded cases against an oracle (under ASan
    too), by tests/cpp/test_frame_fuzz.cpp, which test_cpp_core.py runs."""
    # A fixed mmap threshold: big tensors are mapped and unmapped every time,
    # so VmRSS shows what the process keeps, not glibc's heap growing once its
    # adaptive threshold has risen past the collectives' 2.4 MB buffers
    # (without it VmRSS drifts by 20-40 MiB over the loop, flood or not).
    env = {"MALLOC_MMAP_THRESHOLD_": "131072", "SMDCCL_DEBUG": "INFO"}
    if topology != "default":
        env["SMDCCL_TOPOLOGY"] = topology
    r0, r1 = run_ranks(2, fuzz_listener_during_job, FUZZ_SEED, env=env, timeout=240)
    where = f"seed {FUZZ_SEED}, topology {topology}"
    assert "error" not in r0, f"{where}: flood thread failed: {r0['error']}"
    assert sum(r0["kinds"].values()) == FLOOD_CONNECTIONS
    assert set(r0["kinds"]) == set(FLOOD_KINDS), f"{where}: kinds not all drawn: {r0['kinds']}"
    assert not r0["not_dropped"], f"{where}: not dropped (or acknowledged): {r0['not_dropped']}"
    # Exactly one rejection per bad connection, each logged with its reason
    # (at INFO here); at WARN, at most DROP_WARN_BURST per window of
    # DROP_WARN_WINDOW_S, so that a flood does not flood the log.
    assert r1["rejected"] == r1["expected_rejected"], f"{where}: {r1}"
    assert r1["logged_drops"] == r1["rejected"], f"{where}: {r1}"
    windows = math.ceil(r1["flood_s"] / DROP_WARN_WINDOW_S) + 1
    assert 0 < r1["warned_drops"] <= DROP_WARN_BURST * windows, (
        f"{where}: {r1['warned_drops']} WARN lines for drops in {r1['flood_s']:.1f} s")
    for reason in FLOOD_REASONS + ["too many half-open"]:
        assert any(reason in why for why in r1["reasons"]), (
            f"{where}: nothing logged as {reason!r}: {r1['reasons']}")
    # Real peers were never held up by the garbage or the idle connections.
    assert all(s < FRESH_GROUP_LIMIT_S for s in r0["fresh_group_s"] + r1["fresh_group_s"]), (
        f"{where}: a new group took {r0['fresh_group_s']} / {r1['fresh_group_s']} s")
    # Bounded: memory and descriptors come back.
    growth_mib = (r1["rss_after_kb"] - r1["rss_before_kb"]) / 1024
    limit = RSS_LIMIT_MIB + _asan_quarantine_mib()
    assert growth_mib < limit, f"{where}: rank 1 VmRSS grew {growth_mib:.1f} MiB (limit {limit}): {r1}"
    assert r1["fds_after"] == r1["fds_before"], f"{where}: rank 1 fds {r1['fds_before']} -> {r1['fds_after']}"
    print(f"\n{where}: {r0['rounds']} rounds of collectives during {FLOOD_CONNECTIONS} + {r0['idle']} "
          f"bad connections; rank 1 rejected {r1['rejected']}, VmRSS {r1['rss_before_kb']} -> "
          f"{r1['rss_after_kb']} kB, fds {r1['fds_before']} -> {r1['fds_after']}, new groups in "
          f"{[round(s, 2) for s in r1['fresh_group_s']]} s; {r1['warned_drops']} drops logged at WARN in "
          f"{r1['flood_s']:.1f} s; reasons {r1['reasons']}")


# ---------------------------------------------------------------------------
# A send/recv header's length field does not size the receive buffer
# ---------------------------------------------------------------------------

P2P_MAGIC, POINT_TO_POINT, ACK = 0x50325053, 2, 0x594B4F53
CLAIMED_BYTES = 3 << 30      # what the lying header claims (under the 1 TiB sanity bound)
HWM_LIMIT_MIB = 64           # rank 1's peak RSS may grow by less than this


def lying_length_field() -> dict:
    """Rank 0 opens rank 1's incoming send/recv connection of a new group itself
    (it knows the group's token, as any member does), then sends a header that
    claims 3 GiB for a message nobody has asked for, 1 KiB of it, and hangs up.

    Before the fix, rank 1's receive thread sized its buffer from the claim
    (``std::vector<char> msg(h.bytes)``: 3 GiB allocated and zero-filled
    before a byte arrived); now it grows with what arrives."""
    rank = dist.get_rank()
    g = dist.new_group([0, 1])
    backend = g._get_backend(torch.device("cpu"))
    addrs = [None, None]
    dist.all_gather_object(addrs, backend.listen_address)
    sock = None
    if rank == 0:
        host, port = addrs[1].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(struct.pack("<IHHii16s", MAGIC, VERSION, POINT_TO_POINT, 0, 1, _group_token(g)))
        assert sock.recv(4) == struct.pack("<I", ACK), "the handshake was not accepted"
        sock.sendall(struct.pack("<IIqQ", P2P_MAGIC, 0, 99, CLAIMED_BYTES) + b"x" * 1024)
    result = {}
    if rank == 1:
        hwm_before = _proc_status("VmHWM")
        work = dist.irecv(torch.empty(10), src=0, group=g, tag=5)  # starts the receive thread
    dist.barrier()  # rank 1's receive has been posted
    if rank == 0:
        sock.close()
    else:
        with pytest.raises(Exception) as err:
            work.wait()
        result = {"error": str(err.value), "hwm_growth_kb": _proc_status("VmHWM") - hwm_before}
    x = torch.arange(1000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(1000, dtype=torch.float64) * 3)
    return result


def test_p2p_length_field_does_not_size_the_buffer():
    _, r1 = run_ranks(2, lying_length_field, timeout=120)
    assert "closed the connection" in r1["error"], r1
    growth_mib = r1["hwm_growth_kb"] / 1024
    assert growth_mib < HWM_LIMIT_MIB, (
        f"rank 1's peak RSS grew {growth_mib:.0f} MiB for a header claiming "
        f"{CLAIMED_BYTES >> 20} MiB of which 1 KiB arrived")
    print(f"\nlying length field: rank 1 peak RSS grew {growth_mib:.1f} MiB; error: {r1['error'][:200]}")
