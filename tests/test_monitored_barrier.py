"""dist.monitored_barrier: gloo's debugging barrier, which names the ranks
that did not come.

Why: when a job hangs, gloo users put ``dist.monitored_barrier(timeout,
wait_all_ranks=True)`` where the ranks should meet and read which ranks never
arrived. torch >= 2.14 offers it on any CPU backend; without it smdccl users
lose that tool.

What (4 ranks, 2 s timeout): barriers that everyone reaches pass, many times
over (both backends). smdccl: with rank 2 away (waiting in Python after an
all_reduce), rank 0 raises "Rank 2 failed to pass monitoredBarrier in 2000
ms", saying what rank 2 last ran; ranks 1 and 3 raise the same message at
rank 0's deadline (gloo leaves them to their own timeout); rank 2, coming
late, raises it too. With ranks 1 and 3 away and wait_all_ranks=True, the
message names both. A zero timeout reports at once (it once meant the
group's timeout and waited for ever). Afterwards the world group's collectives and the next
monitored barrier work, and a monitored barrier on a group that rank 0
aborted passes (it needs only the store).
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from harness import harness_store, run_ranks, timed_raise

TIMEOUT = datetime.timedelta(seconds=2)


def everyone_arrives() -> int:
    for _ in range(20):
        dist.monitored_barrier(timeout=TIMEOUT)
    dist.monitored_barrier(timeout=TIMEOUT, wait_all_ranks=True)
    t = torch.ones(2)
    dist.all_reduce(t)
    return int(t[0].item())


def test_monitored_barrier_passes():
    assert run_ranks(4, everyone_arrives, timeout=120) == [4] * 4


def late_ranks() -> dict:
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    dist.all_reduce(torch.ones(4))  # what the late ranks "last ran"

    def barrier(key: str, wait_all: bool, away: list[int], timeout=TIMEOUT) -> None:
        if rank in away:  # stuck elsewhere until the verdict is out
            store.wait([f"mb_test/{key}"], datetime.timedelta(seconds=60))
        out[key] = timed_raise(lambda: dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all))
        if rank == 0:
            store.set(f"mb_test/{key}", "1")

    barrier("one late", False, [2])
    barrier("two late, wait_all_ranks", True, [1, 3])
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    out["after"] = t.tolist()
    out["next barrier"] = timed_raise(lambda: dist.monitored_barrier(timeout=TIMEOUT))
    # a zero timeout is over at once (torch's test_monitored_barrier_gloo_rank_0_timeout);
    # it was taken for "the group's timeout" and waited for ever
    barrier("zero timeout", False, [1, 2, 3], timeout=datetime.timedelta(0))
    # on a group rank 0 aborted: it still says who is there
    g = dist.new_group(backend="smdccl")
    if rank == 0:
        g.abort()
    out["after abort"] = timed_raise(lambda: dist.monitored_barrier(group=g, timeout=TIMEOUT))
    return out


@pytest.mark.smdccl_only  # gloo leaves the ranks that came to their own timeout
def test_monitored_barrier_names_late_ranks():
    t0 = time.monotonic()
    results = run_ranks(4, late_ranks, timeout=180)
    r0 = results[0]
    seconds, err = r0["one late"]
    assert err is not None and "Rank 2 failed to pass monitoredBarrier in 2000 ms" in err, err
    assert "rank 2: last ran allreduce #1, finished" in err, f"does not say what rank 2 was doing: {err}"
    assert 1.9 < seconds < 6, seconds
    for rank in (1, 3):  # they came, and hear rank 0's verdict at its deadline
        s, e = results[rank]["one late"]
        assert e == err, (rank, e)
        assert s < 8, (rank, s)
    assert results[2]["one late"][1] == err, results[2]  # came after the verdict

    seconds, err = r0["two late, wait_all_ranks"]
    assert err is not None and "Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms" in err, err
    for rank in (1, 2, 3):
        assert results[rank]["two late, wait_all_ranks"][1] == err, (rank, results[rank])
    seconds, err = r0["zero timeout"]
    assert err is not None and "Rank 1 failed to pass monitoredBarrier in 0 ms" in err, err
    assert seconds < 4, seconds
    for rank in (1, 2, 3):
        assert results[rank]["zero timeout"][1] == err, (rank, results[rank])
    for rank, r in enumerate(results):
        assert r["after"] == [6.0] * 3, (rank, r)
        assert r["next barrier"][1] is None, (rank, r)
        assert r["after abort"][1] is None, (rank, r)
    print(f"\n[smdccl] monitored_barrier: late rank named after {r0['one late'][0]:.2f} s; "
          f"test {time.monotonic() - t0:.1f} s")
