"""TORCH_DISTRIBUTED_DEBUG=DETAIL wraps custom backends in torch's gloo-based
ProcessGroupWrapper, which needs sequence numbers from the backend and
cross-checks every collective. smdccl must work under it, and the wrapper must
be able to catch ranks that call different collectives. smdccl only."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

pytestmark = pytest.mark.smdccl_only


def collectives_under_wrapper():
    rank, ws = dist.get_rank(), dist.get_world_size()
    t = torch.full((1001,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == ws * (ws + 1) / 2)
    out = [torch.empty(3) for _ in range(ws)]
    dist.all_gather(out, torch.full((3,), float(rank)))
    assert all(torch.equal(o, torch.full((3,), float(r))) for r, o in enumerate(out))
    b = torch.arange(5.0) if rank == 0 else torch.zeros(5)
    dist.broadcast(b, 0)
    assert torch.equal(b, torch.arange(5.0))
    # Mismatched collectives at the same step: the wrapper must refuse them.
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.broadcast(torch.ones(4), 0)
    except RuntimeError as exc:
        return "mismatch detected: " + str(exc)[:200]
    raise AssertionError("mismatched collectives were not detected")


def test_works_under_torch_distributed_debug_detail():
    results = run_ranks(2, collectives_under_wrapper, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                        timeout=180, pg_timeout=30)
    assert all(r.startswith("mismatch detected") for r in results), results
