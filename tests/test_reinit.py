"""A group re-created on a store that outlived the first one.

Why: destroy_process_group() then init_process_group() again -- a training
loop that restarts its group after a failure, test fixtures, torchrun's
agent store (which outlives the workers' groups) -- hands the new group the
same store under the same group names. smdccl's keys there (the group's
token, listener addresses, shared-memory segment names, the recorded first
failure) must be the new group's, never the old one's. Rank 0 joins late in
later rounds, so rank 1 reads the keys before rank 0 has rewritten them; a
subgroup's reused name comes with another size in one round; one round fails
on purpose (mismatched collectives) and the next must not inherit that
failure. (gloo, the same way, fails to connect or reads stale
addresses.)
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness import harness_store, run_ranks

pytestmark = pytest.mark.smdccl_only

ROUNDS = 4
FAILING_ROUND = 2


def reinit_rounds() -> dict:
    store = harness_store()
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    done = []
    for it in range(ROUNDS):
        if rank == 0 and it > 0:
            time.sleep(0.3)  # the others read the store before rank 0 rewrote it
        dist.init_process_group("smdccl", store=store, rank=rank, world_size=ws,
                                timeout=timedelta(seconds=20))
        t = torch.full((1000,), float(rank + it))
        dist.all_reduce(t)
        assert torch.all(t == sum(r + it for r in range(ws))).item(), f"round {it}: {t[:3].tolist()}"
        # Torch reuses the subgroup's name every round; round 1 gives it another size.
        members = [0, 1, 2] if it == 1 else [0, 1]
        sub = dist.new_group(members)
        if rank in members:
            v = torch.ones(5)
            dist.all_reduce(v, group=sub)
            assert torch.all(v == len(members)).item(), f"round {it}: subgroup gave {v.tolist()}"
        if rank in (0, 1):
            u = torch.full((7,), float(it))
            if rank == 0:
                dist.send(u + 1, dst=1, group=sub)
            else:
                dist.recv(u, src=0, group=sub)
                assert torch.all(u == it + 1).item(), f"round {it}: recv got {u.tolist()}"
        if it == FAILING_ROUND:
            try:
                dist.all_reduce(torch.ones(10 + rank))  # mismatched sizes: the group fails
                raise AssertionError("mismatched all_reduce did not raise")
            except RuntimeError as e:
                assert "mismatch" in str(e) or "differ" in str(e), str(e)
        dist.destroy_process_group()
        done.append(it)
    return {"rounds": done}


def test_group_recreated_on_the_same_store():
    res = run_ranks(3, reinit_rounds, init=False, timeout=180)
    assert all(r["rounds"] == list(range(ROUNDS)) for r in res), res
