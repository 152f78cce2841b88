"""send/recv threads grow neither with the peers (16 ranks) nor with the groups.

Why: a thread pair per peer (what smdccl's send/recv had) is 30 threads per
process at 16 ranks and 126 at 64; the process's event loops (one sending,
one receiving) and its connector serve every peer of every group with three
threads.

What (16 ranks, smdccl): each rank first exchanges a message with one
neighbour, then with all 15 peers at once (isend / irecv to and from each,
plus any-source receives). Every message arrives intact from its sender
(both backends); with smdccl, the process's thread count after talking to
all 15 peers equals the count after talking to one, which is at most 3 more
than before any send/recv.

What (4 ranks, four groups): the same for groups. After one group's
send/recv the process has at most 3 more threads than before, and no more
after three other groups' (one of them destroyed while another group's
32 MiB message is on its way, which still arrives intact). The lasting ones
are the process's loops and connector, one of each by name.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from harness import IS_SMDCCL, run_ranks

WORLD = 16


def _threads() -> int:
    """The process's lasting threads: the fewest over half a second, so that
    a dial's short-lived thread that is just ending is not counted."""
    counts = []
    for _ in range(10):
        counts.append(len(os.listdir("/proc/self/task")))
        time.sleep(0.05)
    return min(counts)


def _p2p_threads() -> list[str]:
    """Names of the process's lasting send/recv threads (p2p_loops.h names them)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            continue  # ended meanwhile
    return sorted(n for n in names if n in ("smdccl-p2p-send", "smdccl-p2p-recv", "smdccl-p2p-conn"))


def _message(src: int, dst: int, n: int = 1000) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1000.0 * src + dst


def all_pairs() -> dict:
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.barrier()  # every collective link is up: only send/recv adds threads below
    before = _threads()
    # One neighbour: rank r sends to r+1 and receives from r-1.
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(1000)
    works = [dist.isend(_message(rank, nxt), nxt, tag=1), dist.irecv(got, prv, tag=1)]
    for w in works:
        w.wait()
    assert torch.equal(got, _message(prv, rank)), "neighbour's message"
    dist.barrier()
    one_peer = _threads()
    # Every peer at once, both directions, then one any-source message each.
    peers = [p for p in range(size) if p != rank]
    inbox = {p: torch.zeros(1000) for p in peers}
    works = [dist.irecv(inbox[p], p, tag=2) for p in peers]
    works += [dist.isend(_message(rank, p), p, tag=2) for p in peers]
    for w in works:
        w.wait()
    bad = [p for p in peers if not torch.equal(inbox[p], _message(p, rank))]
    assert not bad, f"messages from ranks {bad} arrived wrong"
    sends = [dist.isend(torch.tensor([float(rank)]), p, tag=3) for p in peers]
    sources = []
    for _ in peers:
        t = torch.zeros(1)
        src = dist.recv(t, tag=3)
        assert int(t.item()) == src, (t, src)
        sources.append(src)
    for w in sends:
        w.wait()
    assert sorted(sources) == peers, sources
    dist.barrier()
    return {"before": before, "one_peer": one_peer, "all_peers": _threads()}


def _assert_threads_flat(results: list, first: str, last: str) -> None:
    """Each rank's threads after `last` equal those after `first`, at most 3
    more than before any send/recv (smdccl only: gloo's threads are its own
    business; its messages were checked)."""
    print(f"\nthreads per process (rank 0): {results[0]}")
    if not IS_SMDCCL:
        return
    for rank, r in enumerate(results):
        assert r[last] == r[first], (rank, r)
        assert r[first] - r["before"] <= 3, (rank, r)


def test_send_recv_at_16_ranks_with_threads_that_do_not_grow_with_peers():
    _assert_threads_flat(run_ranks(WORLD, all_pairs, timeout=600), "one_peer", "all_peers")


GROUPS = 4


def _ring_exchange(group, tag: int, n: int = 1000):
    rank, size = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(n)
    works = [
        dist.isend(_message(rank, nxt, n), nxt, group=group, tag=tag),
        dist.irecv(got, prv, group=group, tag=tag),
    ]
    return works, got, _message(prv, rank, n)


def groups_share_threads():
    groups = [dist.new_group(list(range(dist.get_world_size()))) for _ in range(GROUPS)]
    for g in groups:
        dist.barrier(group=g)  # their collective links are up: only send/recv adds threads
    before = _threads()
    works, got, want = _ring_exchange(groups[0], tag=1)
    for w in works:
        w.wait()
    assert torch.equal(got, want), "group 0's message"
    dist.barrier()
    one_group = _threads()
    # A large message on group 2 moves while group 1 goes away.
    big_works, big_got, big_want = _ring_exchange(groups[2], tag=2, n=8 << 20)
    works, got, want = _ring_exchange(groups[1], tag=2)
    for w in works:
        w.wait()
    assert torch.equal(got, want), "group 1's message"
    dist.destroy_process_group(groups[1])
    works, got, want = _ring_exchange(groups[3], tag=3)
    for w in works + big_works:
        w.wait()
    assert torch.equal(got, want), "group 3's message"
    assert torch.equal(big_got, big_want), "group 2's 32 MiB message"
    dist.barrier()
    return {
        "before": before,
        "one_group": one_group,
        "all_groups": _threads(),
        "p2p_threads": _p2p_threads(),
    }


def test_send_recv_threads_do_not_grow_with_groups():
    results = run_ranks(4, groups_share_threads, timeout=300)
    _assert_threads_flat(results, "one_group", "all_groups")
    if IS_SMDCCL:
        for rank, r in enumerate(results):
            assert r["p2p_threads"] == ["smdccl-p2p-conn", "smdccl-p2p-recv", "smdccl-p2p-send"], (
                rank,
                r,
            )
