"""send/recv to this rank itself: torch's isend and irecv allow it ("Unlike
send, which is blocking, isend allows src == dst rank, i.e. send to self"),
NCCL runs it, and pipeline schedules use it where a stage talks to itself.

The message is copied into the oldest receive from this rank of its tag
(posted before or after the send), in order per tag; a size mismatch fails
the receive as from a peer; a receive from itself that no send matches
fails at the group timeout; any-source receives wait for the other ranks.
smdccl only: gloo aborts the process on a send to self.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from harness import timed_raise as _raises

pytestmark = pytest.mark.smdccl_only


def to_self() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    # sent first, received later; then received first, sent later
    a = torch.full((5,), 10.0 + rank)
    s = dist.isend(a, dst=rank)
    got = torch.zeros(5)
    dist.irecv(got, src=rank).wait()
    s.wait()
    out["send_first"] = got.tolist()
    got2 = torch.zeros(3, dtype=torch.int64)
    r = dist.irecv(got2, src=rank, tag=7)
    dist.isend(torch.arange(3) + rank, dst=rank, tag=7).wait()
    r.wait()
    out["recv_first"] = got2.tolist()
    # order per tag, and tags matched apart
    sends = [dist.isend(torch.tensor([float(i)]), dst=rank, tag=i % 2) for i in range(4)]
    odd, even = [torch.zeros(1) for _ in range(2)], [torch.zeros(1) for _ in range(2)]
    for t in odd:
        dist.irecv(t, src=rank, tag=1).wait()
    for t in even:
        dist.irecv(t, src=rank, tag=0).wait()
    for w in sends:
        w.wait()
    out["by_tag"] = [t.item() for t in even + odd]
    # a pipeline step: to self and to the next rank, from self and the previous one
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    mine, back, left = torch.full((4,), float(rank)), torch.zeros(4), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, mine, rank), dist.P2POp(dist.irecv, back, rank),
           dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, left, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch"] = [back[0].item(), left[0].item()]
    # a size mismatch fails the receive, and the next message still arrives
    dist.isend(torch.zeros(8), dst=rank, tag=3)
    out["mismatch"] = _raises(dist.irecv(torch.zeros(4), src=rank, tag=3).wait)[1]
    dist.isend(torch.ones(2), dst=rank, tag=3)
    after = torch.zeros(2)
    dist.irecv(after, src=rank, tag=3).wait()
    out["after_mismatch"] = after.tolist()
    # an any-source receive takes the other rank's message, not this rank's own
    dist.isend(torch.full((1,), -1.0), dst=rank, tag=5)
    dist.isend(torch.full((1,), float(rank)), dst=nxt, tag=5)
    anyone = torch.zeros(1)
    out["any_from"] = dist.recv(anyone, tag=5)
    out["any_got"] = anyone.item()
    own = torch.zeros(1)
    dist.irecv(own, src=rank, tag=5).wait()  # still there for a receive from itself
    out["own_after_any"] = own.item()
    # nothing sent: the receive from itself fails at the group's timeout
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=1))
    took, err = _raises(dist.irecv(torch.zeros(1), src=rank, tag=9, group=g).wait)
    out["unmatched"] = (round(took), err)
    dist.barrier()
    return out


def test_isend_irecv_to_self():
    res = run_ranks(2, to_self, timeout=120)
    for rank, r in enumerate(res):
        assert r["send_first"] == [10.0 + rank] * 5, r
        assert r["recv_first"] == [rank, rank + 1, rank + 2], r
        assert r["by_tag"] == [0.0, 2.0, 1.0, 3.0], r
        assert r["batch"] == [float(rank), float(1 - rank)], r
        assert r["mismatch"] and "expected 16 bytes" in r["mismatch"] and "carried 32" in r["mismatch"], r
        assert r["after_mismatch"] == [1.0, 1.0], r
        assert r["any_from"] == 1 - rank and r["any_got"] == float(1 - rank), r
        assert r["own_after_any"] == -1.0, r
        took, err = r["unmatched"]
        assert err and "timed out" in err and f"rank {rank} sent no message" in err, r
        assert took <= 3, r
