"""smdccl.bench times in-place reductions (allreduce, reduce) call after call
on one buffer. Summed in place, the values would double per call at 2 ranks
and leave a 16-bit wire's range within 16 calls (the first GPU run against
NCCL stopped on exactly that); every timed call must see fill()'s input."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness import run_ranks
from smdccl.bench.backends import World
from smdccl.bench.collectives import make_case
from smdccl.bench.sweep import _timed


def many_timed_calls(name: str, calls: int) -> dict:
    rank, size = dist.get_rank(), dist.get_world_size()
    world = World(rank, size, 0, torch.device("cpu"), dist.group.WORLD)
    case = make_case(name, 4096, torch.float32, "sum", None, rank, size, world.device)
    case.fill()
    for _ in range(calls):
        _timed(case, world)
    return {"wrong": case.count_wrong(), "restores": case.restore is not None}


def test_in_place_reductions_see_their_input_at_every_call():
    for name in ("allreduce", "reduce"):
        res = run_ranks(2, many_timed_calls, name, 40, backend="smdccl", timeout=60)
        assert all(r["restores"] for r in res), res
        assert [r["wrong"] for r in res] == [0, 0], (name, res)  # 2**40 times the sum without it


def test_out_of_place_collectives_need_no_restore():
    res = run_ranks(2, many_timed_calls, "allgather", 5, backend="smdccl", timeout=60)
    assert [r["restores"] for r in res] == [False, False] and [r["wrong"] for r in res] == [0, 0], res
