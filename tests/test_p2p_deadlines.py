"""send/recv: every receive ends by its deadline, and only what failed fails.

Why: a receive must raise at its deadline whatever else the peer does, a
work must never wait for ever (also when its group is destroyed first), and
one rank that finishes and exits must not break receives between the ranks
that go on. Found by a review of the p2p engine; each case failed before
its fix.

- A peer that keeps sending other tags: the receive still times out at its
  deadline (it used to wait for the line to go quiet, then take the late
  message), and the group's send/recv keep working after it.
- A receive pending when its group is destroyed: its wait() raises at once,
  naming the destroyed group (it used to wait for ever).
- An any-source receive posted while a third rank exits normally: it is
  served by the rank that does send (it used to fail with the exit).
- A receive posted after its sender sent and exited: it gets the message
  that waits on this host (the gone-peer probe must not fail it first).
- A receive posted after ``dist.set_timeout`` shortened the group's timeout,
  behind one posted with the long timeout, before the peer ever connected:
  it raises at its own, shorter deadline (it waited for the older one).
smdccl only: the messages are smdccl's, and gloo has no deadline on recv.
"""

from __future__ import annotations

import datetime
import gc
import time

import pytest
import torch
import torch.distributed as dist

from harness import harness_store, run_ranks
from harness import timed_raise as _raises

pytestmark = pytest.mark.smdccl_only


def busy_peer() -> dict:
    rank = dist.get_rank()
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=1.5))
    out = {}
    if rank == 1:
        took, err = _raises(dist.irecv(torch.zeros(4), src=0, tag=1, group=g).wait)
        out["late"] = (took, err)
        t = torch.zeros(4)
        # the message rank 0 sends after 3 s: a timeout long enough to wait for it
        dist.set_timeout(datetime.timedelta(seconds=30), group=g)
        dist.recv(t, src=0, tag=1, group=g)
        out["after"] = t.tolist()
    else:
        works = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:  # other tags, every 40 ms
            works.append(dist.isend(torch.ones(2), dst=1, tag=2, group=g))
            time.sleep(0.04)
        dist.send(torch.full((4,), 7.0), dst=1, tag=1, group=g)
        for w in works:
            w.wait()
    dist.barrier()
    return out


def test_recv_times_out_while_the_peer_sends_other_tags():
    r1 = run_ranks(2, busy_peer, timeout=120)[1]
    took, err = r1["late"]
    assert err is not None, "the receive past its deadline returned normally"
    assert err.startswith("DistBackendError") and "timed out" in err, err
    assert "rank 0 sent no message with this tag" in err, err
    assert 1.4 < took < 2.9, f"the receive (timeout 1.5 s) raised after {took:.2f} s"
    assert r1["after"] == [7.0] * 4


def destroyed_with_a_pending_recv() -> dict:
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    if rank == 1:
        dist.recv(torch.zeros(4), src=0, tag=5)  # connected: the receiver thread runs
        work = dist.irecv(torch.zeros(4), src=0, tag=6)  # never sent
        time.sleep(0.2)
        dist.destroy_process_group()
        gc.collect()
        out["wait"] = _raises(lambda: work.wait(datetime.timedelta(seconds=20)))
        store.set("destroyed/done", "1")
    else:
        dist.send(torch.ones(4), dst=1, tag=5)
        store.wait(["destroyed/done"], datetime.timedelta(seconds=60))
        dist.destroy_process_group()
    return out


def test_destroying_the_group_fails_its_pending_recv():
    r1 = run_ranks(2, destroyed_with_a_pending_recv, pg_timeout=60, timeout=120)[1]
    took, err = r1["wait"]
    assert err is not None, "wait() returned normally"
    assert "was destroyed before this send/recv completed" in err, err
    assert took < 5, f"wait() raised after {took:.1f} s"


def destroyed_with_a_pending_collective() -> dict:
    """Rank 0 destroys its group while an allreduce that rank 1 never joins
    is queued. The queue drains first, as gloo's does: the allreduce fails at
    its deadline (the group timeout, 3 s here) and destroy returns. Before,
    the failing op stopped the progress thread through a pointer the
    destructor had already cleared: a segfault."""
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    if rank == 0:
        work = dist.all_reduce(torch.ones(1 << 20), async_op=True)
        start = time.monotonic()
        dist.destroy_process_group()
        out["destroy_s"] = time.monotonic() - start
        out["wait"] = _raises(lambda: work.wait(datetime.timedelta(seconds=20)))
        store.set("pending-collective/done", "1")
    else:
        store.wait(["pending-collective/done"], datetime.timedelta(seconds=60))
        dist.destroy_process_group()
    return out


def test_destroying_the_group_with_a_pending_collective_lets_it_fail_in_time():
    r0 = run_ranks(2, destroyed_with_a_pending_collective, pg_timeout=3, timeout=120)[0]
    assert r0["destroy_s"] < 10, f"destroy took {r0['destroy_s']:.1f} s with a 3 s group timeout"
    took, err = r0["wait"]
    assert err is not None, "wait() returned normally"
    assert "allreduce" in err and "timed out" in err, err


def one_rank_leaves() -> dict:
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    if rank == 2:
        dist.barrier()
        return out  # finishes: destroys its group and exits
    if rank == 0:
        work = dist.irecv(torch.zeros(3), tag=3)  # receivers for ranks 1 and 2 start
        dist.barrier()
        store.set("leaves/posted", "1")
        out["recv"] = _raises(work.wait)
        out["source"] = work._source_rank() if out["recv"][1] is None else None
    else:
        dist.barrier()
        store.wait(["leaves/posted"], datetime.timedelta(seconds=60))
        time.sleep(1.5)  # rank 2 has exited by now
        dist.send(torch.ones(3), dst=0, tag=3)
    store.set(f"leaves/done/{rank}", "1")
    store.wait([f"leaves/done/{r}" for r in (0, 1)], datetime.timedelta(seconds=60))
    return out


def test_any_source_recv_survives_a_rank_that_exits():
    r0 = run_ranks(3, one_rank_leaves, timeout=120)[0]
    assert r0["recv"][1] is None, r0
    assert r0["source"] == 1, r0


def sender_exits_first() -> dict:
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    if rank == 1:
        dist.send(torch.full((3,), 7.0), dst=0, tag=4)  # lands in rank 0's socket buffer
        store.set("exits/sent", "1")
        return out  # finishes: destroys its group and exits
    store.wait(["exits/sent"], datetime.timedelta(seconds=60))
    time.sleep(1.5)  # rank 1 has exited by now
    got = torch.zeros(3)
    out["recv"] = _raises(lambda: dist.recv(got, src=1, tag=4))
    out["got"] = got.tolist()
    return out


def test_recv_gets_the_message_of_a_sender_that_has_exited():
    for _ in range(3):  # the probe and the receiving loop race: give it chances to lose
        r0 = run_ranks(2, sender_exits_first, timeout=120)[0]
        assert r0["recv"][1] is None, r0
        assert r0["got"] == [7.0] * 3, r0


def sender_exits_while_read() -> dict:
    """As above, with rank 0 already reading from rank 1: its loop takes in
    both messages and then the closed connection, before any receive asks."""
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    if rank == 1:
        dist.send(torch.ones(3), dst=0, tag=1)  # rank 0's receiving loop reads rank 1 from now
        store.wait(["reading/first"], datetime.timedelta(seconds=60))
        dist.send(torch.full((3,), 7.0), dst=0, tag=4)
        dist.send(torch.full((3,), 8.0), dst=0, tag=5)
        store.set("reading/sent", "1")
        return out  # finishes: destroys its group and exits
    dist.recv(torch.zeros(3), src=1, tag=1)
    store.set("reading/first", "1")
    store.wait(["reading/sent"], datetime.timedelta(seconds=60))
    time.sleep(1.5)  # rank 1 has exited; the loop has seen its messages and its close
    by_rank, by_any = torch.zeros(3), torch.zeros(3)
    out["recv"] = _raises(lambda: dist.recv(by_rank, src=1, tag=4))
    out["any source"] = _raises(lambda: dist.recv(by_any, tag=5))
    out["got"] = [by_rank.tolist(), by_any.tolist()]
    out["then"] = _raises(lambda: dist.recv(torch.zeros(3), src=1, tag=6))
    return out


def test_messages_read_before_the_sender_closed_are_delivered():
    r0 = run_ranks(2, sender_exits_while_read, timeout=120)[0]
    assert r0["recv"][1] is None and r0["any source"][1] is None, r0
    assert r0["got"] == [[7.0] * 3, [8.0] * 3], r0
    # Nothing more can come: the next receive fails at once, naming the close.
    assert r0["then"][1] is not None and "closed the connection" in r0["then"][1], r0


def shortened_timeout() -> dict:
    rank = dist.get_rank()
    store = harness_store()
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=30))
    out = {}
    if rank == 1:
        first = dist.irecv(torch.zeros(4), src=0, tag=1, group=g)  # waits for a connection until +30 s
        time.sleep(0.3)
        dist.set_timeout(datetime.timedelta(seconds=1.5), group=g)
        out["short"] = _raises(dist.irecv(torch.zeros(4), src=0, tag=2, group=g).wait)
        store.set("shortened/done", "1")
        out["first"] = _raises(first.wait)  # rank 0 sends it now
    else:
        store.wait(["shortened/done"], datetime.timedelta(seconds=60))
        dist.send(torch.ones(4), dst=1, tag=1, group=g)
    dist.barrier()
    return out


def test_a_shorter_timeout_set_later_is_kept():
    r1 = run_ranks(2, shortened_timeout, timeout=120)[1]
    took, err = r1["short"]
    assert err is not None, "the receive with the shorter timeout returned normally"
    assert "timed out" in err and "tag 2" in err, err
    assert took < 3, f"the receive with a 1.5 s timeout raised after {took:.1f} s"
    assert r1["first"][1] is None, r1


def huge_timeout() -> dict:
    """A group made with a timeout too long for the clock (a thousand years;
    torch takes up to timedelta.max): its waits have no deadline, so a
    receive whose sender comes 0.5 s later gets the message. The deadline
    used to wrap into the past and fail every wait at once."""
    rank = dist.get_rank()
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(days=365 * 1000))
    got = torch.zeros(4)
    if rank == 1:
        time.sleep(0.5)
        dist.send(torch.full((4,), 3.0), dst=0, group=g)
    else:
        dist.recv(got, src=1, group=g)
    total = torch.full((8,), float(rank + 1))
    dist.all_reduce(total, group=g)
    dist.barrier(group=g)
    return {"got": got.tolist(), "sum": total[0].item()}


def test_a_timeout_past_the_clocks_range_never_expires():
    res = run_ranks(2, huge_timeout, timeout=120)
    assert res[0] == {"got": [3.0] * 4, "sum": 3.0}, res
    assert res[1]["sum"] == 3.0, res
