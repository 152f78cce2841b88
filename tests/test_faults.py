"""A rank dies: the survivors must fail fast, name the dead rank, and clean up.

Why: with shared memory and TCP peers, a crashed rank must not turn into a
hang of the whole job.  Three ranks finish a warm-up all_reduce (so every
connection exists), then rank 2 SIGKILLs itself, either right before an
all_reduce of a medium tensor ("before") or while a large all_reduce is in
flight ("during": it issues the all_reduce async, and dies a few ms later,
checking first that it has not completed).  Ranks 0 and 1 must raise within
the group timeout (10 s) + 5 s (smdccl: before it; every survivor hears
of the failure from the dead rank or from another survivor, not from its
own timeout), and the error must mention "rank 2" and the op.  Then, on
each survivor:

* a later blocking all_reduce on the same group fails fast (< 1 s) with the
  same cause (the message names rank 2 again);
* an async all_reduce fails fast too (``work.wait()`` raises, naming rank 2);
* the backend's progress thread (named "smdccl-progress", seen in
  /proc/self/task/*/comm) has exited;
* ``dist.destroy_process_group()`` returns, quickly, without error;
* no new /dev/shm/smdccl* file remains (the harness snapshots /dev/shm before
  the run and checks it after every run; the killed rank cannot clean up, so
  segments must be unlinked early or by the survivors).

The killed rank's SIGKILL exit is declared expected.  Survivors wait for each
other (over the harness's store) before tearing down, so that no survivor's
exit is mistaken for the fault.  Variants force the TCP path with
SMDCCL_TOPOLOGY=1,1,1, and 2 x 2 virtual nodes with rank 3 dying (smdccl
only).  The cross-node variant on emulated hosts (namespaces, root) is in
test_cluster.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, backend_supports, run_ranks, store_barrier, under_address_sanitizer
from harness import timed_raise as _raises

PG_TIMEOUT = 10.0
VICTIM = 2
MEDIUM = 300_007
LARGE = 32 << 20  # float32 elements (128 MiB): an all_reduce that takes far longer than KILL_AFTER
KILL_AFTER = 0.005  # s after issuing it: well inside the all_reduce (6 ms for 64 MiB on 2 quiet ranks)
FAST = 1.0  # s: "fails fast" for calls after the failure
PROGRESS_THREAD = "smdccl-progress"  # the engine names its thread so (progress_thread.cpp)


def progress_threads() -> int:
    """How many threads of this process are smdccl progress threads."""
    n = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            n += (task / "comm").read_text().strip() == PROGRESS_THREAD
        except OSError:  # the thread exited meanwhile
            pass
    return n


def after_failure_checks(victim: int, first: str) -> list[str]:
    """(a)-(c) of the module docstring on a survivor whose collective raised ``first``."""
    problems = []
    names = f"rank {victim}"

    def async_op():
        dist.all_reduce(torch.ones(10), async_op=True).wait()

    for what, call in (("a later all_reduce", lambda: dist.all_reduce(torch.ones(10))),
                       ("a later async all_reduce's wait()", async_op)):
        took, msg = _raises(call)
        if msg is None:
            problems.append(f"{what} returned normally")
            continue
        if took > FAST:
            problems.append(f"{what} raised only after {took:.2f} s")
        if backend_supports("failed_rank_in_error") and names not in msg:
            problems.append(f"{what}'s error does not name {names!r}: {msg[:500]}")
    if backend_supports("progress_thread"):
        deadline = time.monotonic() + FAST
        while progress_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        if progress_threads():
            problems.append(f"the progress thread still runs {FAST} s after the failure")
    return problems


def survive_dead_peer(timeout_s: float, victim: int, when: str) -> dict | None:
    rank, ws = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(ws))), "warm-up all_reduce wrong"
    if backend_supports("progress_thread"):
        assert progress_threads() == 1, f"{progress_threads()} threads named {PROGRESS_THREAD!r}, expected 1"
    big = torch.ones(MEDIUM if when == "before" else LARGE)
    dist.barrier()
    if rank == victim:
        if when == "during":
            work = dist.all_reduce(big, async_op=True)
            time.sleep(KILL_AFTER)
            if work.is_completed():
                raise AssertionError(f"the {LARGE}-element all_reduce completed within {KILL_AFTER} s: "
                                     "not in flight when the rank dies; make LARGE bigger")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    elapsed, msg = _raises(lambda: dist.all_reduce(big))
    if msg is None:
        raise AssertionError(f"rank {rank}: all_reduce returned normally although rank {victim} was killed")
    problems = []
    if elapsed > timeout_s + 5:
        problems.append(f"raised only after {elapsed:.1f} s (group timeout {timeout_s} s + 5 s allowed)")
    elif BACKEND == "smdccl" and elapsed >= timeout_s:
        # every survivor hears of the failure from the dead rank or from another
        # survivor (TCP shutdown, shared-memory flag), not from its own timeout
        problems.append(f"raised only at the group timeout ({elapsed:.1f} s): {msg[:1000]}")
    if backend_supports("failed_rank_in_error"):
        if f"rank {victim}" not in msg:
            problems.append(f"error does not mention 'rank {victim}': {msg[:1000]}")
        if "allreduce" not in msg:
            problems.append(f"error does not name the op (allreduce): {msg[:1000]}")
    problems += after_failure_checks(victim, msg)
    # Survivors tear down together (through the harness's store, not the failed group):
    # one survivor's exit must not be what another survivor ends up reporting.
    store_barrier(f"fault-survivors-raised-{when}", ws - 1)
    t0 = time.monotonic()
    dist.destroy_process_group()
    destroyed = time.monotonic() - t0
    if destroyed > 10:
        problems.append(f"destroy_process_group took {destroyed:.1f} s")
    if problems:
        raise AssertionError(f"rank {rank}: " + "; ".join(problems))
    return {"elapsed": round(elapsed, 2), "destroy": round(destroyed, 2), "error": msg[:300]}


def _run(when: str, env=None, world: int = 3, victim: int = VICTIM):
    results = run_ranks(world, survive_dead_peer, PG_TIMEOUT, victim, when, env=env, pg_timeout=PG_TIMEOUT,
                        expect_exit={victim: -signal.SIGKILL}, timeout=120)
    for r in range(world):
        if r != victim:
            print(f"\n[{BACKEND}] rank {r} raised after {results[r]['elapsed']} s "
                  f"(destroy {results[r]['destroy']} s): {results[r]['error']}")


@pytest.mark.parametrize("when", ["before", "during"])
def test_dead_rank_fails_fast(when):
    _run(when)


@pytest.mark.smdccl_only
@pytest.mark.parametrize("when", ["before", "during"])
def test_dead_rank_fails_fast_tcp(when):
    _run(when, {"SMDCCL_TOPOLOGY": "1,1,1"})


@pytest.mark.smdccl_only
def test_dead_rank_fails_fast_two_virtual_nodes():
    """2 x 2 virtual nodes: rank 3 dies mid-all_reduce. Its node-mate (rank 2)
    sees its pid gone, ranks 0 and 1 a TCP link drop; a rank waiting on its
    node-mate over shared memory learns of that rank's failure from a flag
    in the node's shared memory, not by timing out."""
    _run("during", {"SMDCCL_TOPOLOGY": "2x2"}, world=4, victim=3)


# ---------------------------------------------------------------------------
# A rank fails alone inside a collective (out of memory): the others must
# hear of it at once, not at their deadline.
# ---------------------------------------------------------------------------

OOM_BLOCK = 16 << 20  # float32 elements (64 MiB) per rank: all_gather stages ws blocks


def fail_alone_out_of_memory(victim: int) -> dict:
    """The victim's address space is capped below what all_gather's staging
    buffer needs, after the user's tensors exist: only its progress thread's
    allocation fails, while its peers are already exchanging."""
    import datetime
    import resource

    rank, ws = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend=BACKEND, timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(4), group=group)  # every link exists
    outs = [torch.empty(OOM_BLOCK) for _ in range(ws)]
    mine = torch.full((OOM_BLOCK,), float(rank))
    limits = resource.getrlimit(resource.RLIMIT_AS)
    dist.barrier()
    if rank == victim:
        vm_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                     if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm_kb * 1024 + (OOM_BLOCK * 4) // 2, limits[1]))
    try:
        took, msg = _raises(lambda: dist.all_gather(outs, mine, group=group))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)
    later, later_msg = _raises(lambda: dist.all_reduce(torch.ones(4), group=group))
    dist.barrier()  # the world group is another group: unaffected
    return {"took": took, "error": msg, "later": later, "later_error": later_msg}


@pytest.mark.smdccl_only
def test_rank_out_of_memory_fails_the_group_at_once():
    # scripts/sanitize.sh: AddressSanitizer's own mappings (shadow, internal
    # vectors) fail first under a capped address space and it aborts the
    # rank, so the cap tests ASan there, not smdccl; the regular run has it.
    if under_address_sanitizer():
        pytest.skip("RLIMIT_AS cannot cap a rank under AddressSanitizer (its own mappings fail first); "
                    "the unsanitized run covers this test")
    victim = 1
    results = run_ranks(3, fail_alone_out_of_memory, victim, timeout=180)
    for rank, r in enumerate(results):
        print(f"\nrank {rank}: raised after {r['took']:.2f} s: {(r['error'] or '')[:300]}")
        assert r["error"] is not None, f"rank {rank}: all_gather returned normally"
        # every rank names the victim's own failure (the group's first cause)
        assert "allocate" in r["error"], f"rank {rank}: {r['error'][:1000]}"
        assert r["took"] < 10, f"rank {rank} raised only after {r['took']:.1f} s (group timeout 60 s)"
        assert r["later_error"] is not None and r["later"] < FAST, (
            f"rank {rank}: the next all_reduce on the group: {r['later']:.2f} s, {r['later_error']}")


# ---------------------------------------------------------------------------
# send/recv with a rank that died before it ever connected for send/recv:
# the wait for its connection ends as soon as it is known gone.
# ---------------------------------------------------------------------------


def p2p_with_dead_peer(victim: int) -> dict:
    rank = dist.get_rank()
    dist.barrier()  # the collective links exist; no send/recv connection yet
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    recv_took, recv_msg = _raises(lambda: dist.recv(torch.zeros(4), src=victim))
    send_took, send_msg = _raises(lambda: dist.send(torch.zeros(4), dst=victim))
    return {"recv": (recv_took, recv_msg), "send": (send_took, send_msg)}


@pytest.mark.smdccl_only
@pytest.mark.parametrize("topology", ["", "1,1"], ids=["same-node", "two-nodes"])
def test_p2p_with_a_dead_peer_fails_fast(topology):
    victim = 1
    results = run_ranks(2, p2p_with_dead_peer, victim, env={"SMDCCL_TOPOLOGY": topology},
                        pg_timeout=60, expect_exit={victim: -signal.SIGKILL}, timeout=150)
    for op, (took, msg) in results[0].items():
        print(f"\n[{topology or 'same node'}] {op} raised after {took:.2f} s: {msg}")
        assert msg is not None, f"{op} to a dead rank returned normally"
        assert took < 5, f"{op} raised only after {took:.1f} s (group timeout 60 s): {msg}"
        assert f"rank {victim}" in msg, msg


# ---------------------------------------------------------------------------
# A collective on a group whose links do not exist yet, with a rank that
# died before any: its listener refuses the survivors' dials, which must end
# (after a couple of seconds of refusals) rather than wait for the timeout.
# ---------------------------------------------------------------------------


def collective_with_peer_dead_before_links(victim: int) -> dict:
    rank = dist.get_rank()
    fresh = dist.new_group(backend="smdccl")  # built through the store: no links yet
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    time.sleep(1.0)  # it is gone by now: its listener refuses (not resets) connections
    took, msg = _raises(lambda: dist.all_reduce(torch.ones(1000), group=fresh))
    return {"took": took, "error": msg}


@pytest.mark.smdccl_only
def test_collective_with_a_rank_dead_before_any_link_fails_fast():
    victim = 2  # the highest rank: the others dial it
    results = run_ranks(3, collective_with_peer_dead_before_links, victim,
                        env={"SMDCCL_TOPOLOGY": "1,1,1"}, pg_timeout=60,
                        expect_exit={victim: -signal.SIGKILL}, timeout=150)
    for rank in (0, 1):
        r = results[rank]
        print(f"\nrank {rank}: all_reduce raised after {r['took']:.2f} s: {r['error']}")
        assert r["error"] is not None, "the all_reduce returned normally"
        assert r["took"] < 15, f"raised only after {r['took']:.1f} s (group timeout 60 s): {r['error']}"
        assert f"rank {victim}" in r["error"], r["error"]


# ---------------------------------------------------------------------------
# The same, where the dead rank is the only one that would have dialled: the
# survivor accepts (the higher rank of a TCP collective link; the receiver of
# a send/recv socket), so nobody is refused and nobody records a failure. The
# survivor asks the dead rank's listener instead: refusals for 2 s mean its
# process has exited.
# ---------------------------------------------------------------------------


def accepting_waits_with_dialler_dead_before_links(victim: int) -> dict:
    rank = dist.get_rank()
    for_collective = dist.new_group(backend="smdccl")  # built through the store: no links yet
    for_p2p = dist.new_group(backend="smdccl")
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    time.sleep(1.0)  # it is gone by now
    collective = _raises(lambda: dist.all_reduce(torch.ones(1000), group=for_collective))
    recv = _raises(lambda: dist.recv(torch.zeros(4), src=victim, group=for_p2p))
    return {"all_reduce": collective, "recv": recv}


@pytest.mark.smdccl_only
def test_accepting_waits_for_a_dialler_dead_before_any_link_fail_fast():
    victim = 0  # the lower rank: it would have dialled rank 1, for both
    results = run_ranks(2, accepting_waits_with_dialler_dead_before_links, victim,
                        env={"SMDCCL_TOPOLOGY": "1,1"}, pg_timeout=60,
                        expect_exit={victim: -signal.SIGKILL}, timeout=150)
    for op, (took, msg) in results[1].items():
        print(f"\n{op} on rank 1 raised after {took:.2f} s: {msg}")
        assert msg is not None, f"{op} returned normally"
        assert took < 15, f"{op} raised only after {took:.1f} s (group timeout 60 s): {msg}"
        assert f"rank {victim}" in msg, msg
        assert "refused connections" in msg, msg


# ---------------------------------------------------------------------------
# send/recv whose sender dies while the message is on its way: the receive
# that was matched (its header read) must fail, not wait for ever.
# ---------------------------------------------------------------------------

MID_MESSAGE_ELEMENTS = 256 << 20  # 1 GiB of float32: seconds on a loopback socket


def p2p_sender_dies_mid_message(victim: int) -> dict:
    import threading

    from harness import harness_store

    store = harness_store()
    rank = dist.get_rank()
    dist.barrier()
    if rank == victim:
        data = torch.ones(MID_MESSAGE_ELEMENTS)
        store.wait(["mid_message/posted"])
        # die once the header and some of the payload have gone out
        threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        dist.send(data, dst=1 - victim)
        time.sleep(60)  # not reached
    buf = torch.zeros(MID_MESSAGE_ELEMENTS)
    work = dist.irecv(buf, src=victim)  # posted first: the header matches it
    store.set("mid_message/posted", "1")
    took, msg = _raises(work.wait)
    received = int(buf.count_nonzero())
    return {"took": took, "error": msg, "received": received}


@pytest.mark.smdccl_only
def test_p2p_sender_killed_mid_message_fails_the_recv():
    victim = 1
    results = run_ranks(2, p2p_sender_dies_mid_message, victim, pg_timeout=60,
                        expect_exit={victim: -signal.SIGKILL}, timeout=150)
    r = results[0]
    print(f"\nrecv raised after {r['took']:.2f} s with {r['received']} of {MID_MESSAGE_ELEMENTS} "
          f"elements in: {r['error']}")
    assert r["error"] is not None, "the recv returned normally"
    assert 0 < r["received"] < MID_MESSAGE_ELEMENTS, "the sender did not die mid-message"
    assert f"rank {victim}" in r["error"], r["error"]
    assert r["took"] < 10, f"the recv raised only after {r['took']:.1f} s (group timeout 60 s)"
