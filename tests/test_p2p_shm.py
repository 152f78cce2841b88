"""send/recv between ranks of one node goes through shared memory, and every
send/recv behaviour holds on that path as on TCP.

Why: between local ranks the payload moved over TCP loopback (about 1.2 GB/s
at 64 MiB on the 2-core CI machine); a shared-memory ring with the socket
carrying only wake-ups moves it with two copies (p2p_shm_stream.h). The
ring is small (SMDCCL_SHM_RING_KB), so every message below is several times
its size: each one wraps the ring and wakes both sides many times.

What (3 ranks on one node, once with SMDCCL_P2P_SHM=1 and once with 0):
- the path: after a 16 MiB message, the receiver has at least the ring's
  size more shared memory mapped (RssShmem: the send/recv ring's pages) with
  the shared-memory path, and about none more over TCP;
- 24 MiB + 12 bytes both ways at once between two ranks, exact;
- a 6 MiB message that arrives before its receive (buffered), then taken;
- a 3 MiB message received into 2 MiB: the size error, and the next
  message on the same stream intact;
- any-source receives of two 5 MiB messages from two local senders;
- senders that choose differently (rank 0 over TCP, the others through
  shared memory, in a group made after rank 0 changed its setting): both
  paths land.
And (2 ranks): a sender killed while its 64 MiB message is partly in the
ring (it filled the ring, and nobody read it yet) fails the receive posted
afterwards, naming it, at once, not at the group's timeout.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from harness import IS_SMDCCL, check_all, run_ranks

RING_KB = 256  # SMDCCL_SHM_RING_KB: a small ring, many wraps


def _rss_shmem_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    raise AssertionError("no RssShmem in /proc/self/status")


def _data(n: int, salt: int) -> torch.Tensor:
    # Integers below 2**24 are exact in float32: equality is the reference.
    return (torch.arange(n, dtype=torch.int64) * 7 + salt * 1000003) % (1 << 24)


def _path_shows_in_mapped_memory(path: str):
    rank = dist.get_rank()
    n = 4 << 20  # 16 MiB of float32
    dist.barrier()
    before = _rss_shmem_kb()
    if rank == 0:
        dist.send(_data(n, 1).float(), 1, tag=1)
    elif rank == 1:
        got = torch.empty(n)
        dist.recv(got, 0, tag=1)
        assert torch.equal(got, _data(n, 1).float()), "16 MiB message"
        grown = _rss_shmem_kb() - before
        if path == "shm":
            assert grown >= RING_KB, f"RssShmem grew by {grown} KiB, not the ring's {RING_KB}"
        else:
            assert grown < RING_KB // 2, f"RssShmem grew by {grown} KiB over TCP"
    dist.barrier()


def _both_ways_at_once():
    rank = dist.get_rank()
    if rank == 2:
        return
    peer = 1 - rank
    n = (24 << 20) // 8 + 3  # int64: 24 MiB + 24 bytes
    got = torch.empty(n, dtype=torch.int64)
    works = [dist.isend(_data(n, rank), peer, tag=2), dist.irecv(got, peer, tag=2)]
    for w in works:
        w.wait()
    assert torch.equal(got, _data(n, peer)), "24 MiB both ways"


def _buffered_first():
    rank = dist.get_rank()
    n = (6 << 20) // 4
    if rank == 0:
        dist.send(_data(n, 3).float(), 1, tag=3)  # arrives before its receive
        dist.send(torch.tensor([42.0]), 1, tag=4)
    elif rank == 1:
        small = torch.zeros(1)
        dist.recv(small, 0, tag=4)  # behind the 6 MiB one: that one is buffered by now
        got = torch.empty(n)
        dist.recv(got, 0, tag=3)
        assert small.item() == 42.0 and torch.equal(got, _data(n, 3).float()), "buffered"


def _size_mismatch_then_next():
    rank = dist.get_rank()
    if rank == 0:
        dist.send(torch.ones((3 << 20) // 4), 1, tag=5)
        dist.send(_data(1000, 6).float(), 1, tag=6)
    elif rank == 1:
        short = torch.zeros((2 << 20) // 4)
        try:
            dist.recv(short, 0, tag=5)
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            assert "expected 2097152 bytes but the matching send carried 3145728" in str(e), e
        else:
            raise AssertionError("a 3 MiB message was received into 2 MiB")
        got = torch.zeros(1000)
        dist.recv(got, 0, tag=6)
        assert torch.equal(got, _data(1000, 6).float()), "the message after the mismatch"


def _any_source():
    rank = dist.get_rank()
    n = (5 << 20) // 8
    if rank == 0:
        seen = {}
        for _ in range(2):
            got = torch.empty(n, dtype=torch.int64)
            src = dist.recv(got, tag=7)
            seen[src] = torch.equal(got, _data(n, 70 + src))
        assert seen == {1: True, 2: True}, seen
    else:
        dist.send(_data(n, 70 + rank), 0, tag=7)


def _senders_choose_differently():
    rank = dist.get_rank()
    if rank == 0:
        os.environ["SMDCCL_P2P_SHM"] = "0"  # read when the group is made
    group = dist.new_group([0, 1, 2])
    n = (3 << 20) // 4
    nxt, prv = (rank + 1) % 3, (rank - 1) % 3
    got = torch.empty(n)
    works = [dist.isend(_data(n, 10 + rank).float(), nxt, group=group, tag=8),
             dist.irecv(got, prv, group=group, tag=8)]
    for w in works:
        w.wait()
    assert torch.equal(got, _data(n, 10 + prv).float()), f"from rank {prv}"
    dist.destroy_process_group(group)


def p2p_cases(path: str) -> dict:
    cases = [
        ("the path shows in mapped shared memory", lambda: _path_shows_in_mapped_memory(path)),
        ("24 MiB both ways at once", _both_ways_at_once),
        ("a message buffered before its receive", _buffered_first),
        ("a size mismatch, then the next message", _size_mismatch_then_next),
        ("any-source receives from two local senders", _any_source),
        ("senders that choose different paths", _senders_choose_differently),
    ]
    summary = {}
    for desc, fn in cases:
        summary[desc] = check_all([(desc, fn)], label=path)
        dist.barrier()  # the next case starts on a quiet stream
    return summary


@pytest.mark.skipif(not IS_SMDCCL, reason="SMDCCL_P2P_SHM and the path are smdccl's")
@pytest.mark.parametrize("path", ["shm", "tcp"])
def test_send_recv_between_local_ranks(path):
    env = {"SMDCCL_SHM_RING_KB": str(RING_KB), "SMDCCL_P2P_SHM": "1" if path == "shm" else "0"}
    run_ranks(3, p2p_cases, path, env=env, timeout=300)


def sender_killed_mid_message():
    rank = dist.get_rank()
    n = (64 << 20) // 4
    if rank == 1:
        work = dist.isend(torch.ones(n), 0, tag=9)
        time.sleep(0.3)  # the ring fills, and waits for a reader
        del work
        os.kill(os.getpid(), signal.SIGKILL)
    # Posted after the kill: the receive finds the header and a ring's worth
    # of the payload, then the closed connection.
    time.sleep(1.0)
    got = torch.empty(n)
    start = time.monotonic()
    try:
        dist.recv(got, 1, tag=9)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        took = time.monotonic() - start
        assert "rank 1" in str(e) and "recv" in str(e), e
        return took
    raise AssertionError("a receive completed from a sender killed mid-message")


@pytest.mark.skipif(not IS_SMDCCL, reason="the shared-memory path is smdccl's")
def test_sender_killed_mid_message_fails_the_receive_in_time():
    took = run_ranks(2, sender_killed_mid_message, env={"SMDCCL_SHM_RING_KB": str(RING_KB)},
                     pg_timeout=60, expect_exit={1: -signal.SIGKILL}, timeout=150)[0]
    assert took < 15, f"the receive failed after {took:.1f} s, not at once"
