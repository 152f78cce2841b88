"""Collectives that only move data take any dtype, bit for bit.

Why: NCCL moves int16, uint16/32/64 and float8 tensors (FSDP2 with float8
weights all-gathers float8 tensors); a backend that refuses a dtype it only
has to copy breaks that code. Reductions still need a kernel per dtype and
say so.

What (3 ranks): per dtype (int16, uint16, uint32, uint64, float8_e4m3fn,
float8_e5m2, complex128 passed straight through, ...), random bytes as
inputs -- NaN and Inf bit patterns included -- through broadcast,
all_gather, all_gather_into_tensor, all_to_all_single with uneven splits,
all_to_all, gather, scatter and send/recv; every output must equal the
expected bytes. The reductions (all_reduce, reduce_scatter_tensor, reduce)
of these dtypes raise ValueError naming the dtype and the group goes on.
Run with SMDCCL_NAN_CHECK=1: the NaN check must not trip over dtypes it
cannot inspect. gloo has none of these dtypes: smdccl only.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, Checker, run_ranks
from reference import assert_equal_bits

pytestmark = pytest.mark.smdccl_only

DTYPES = ("int16", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
          "float8_e4m3fnuz", "float8_e5m2fnuz")
N = 37  # elements per rank block: odd, so no block is a multiple of 8 bytes


def _bytes_input(rank: int, n: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 1000 + salt)
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dtype)


def data_movement_any_dtype() -> dict:
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"(any dtype, {BACKEND})")
    names = [n for n in DTYPES if hasattr(torch, n)]
    for salt, name in enumerate(names):
        dt = getattr(torch, name)
        mine = _bytes_input(rank, N, dt, salt)
        every = [_bytes_input(r, N, dt, salt) for r in range(ws)]
        with chk.case(f"{name} broadcast"):
            t = mine.clone()
            dist.broadcast(t, src=1)
            assert_equal_bits(t, every[1], "broadcast")
        with chk.case(f"{name} all_gather_into_tensor"):
            out = torch.empty(ws * N, dtype=dt)
            dist.all_gather_into_tensor(out, mine)
            assert_equal_bits(out, torch.cat(every), "all_gather_into_tensor")
        with chk.case(f"{name} all_gather"):
            outs = [torch.empty(N, dtype=dt) for _ in range(ws)]
            dist.all_gather(outs, mine)
            for r in range(ws):
                assert_equal_bits(outs[r], every[r], f"all_gather block {r}")
        with chk.case(f"{name} all_to_all_single, uneven splits"):
            # rank r sends (r + d + 1) elements to rank d
            send = [rank + d + 1 for d in range(ws)]
            recv = [s + rank + 1 for s in range(ws)]
            inp = _bytes_input(rank, sum(send), dt, 100 + salt)
            out = torch.empty(sum(recv), dtype=dt)
            dist.all_to_all_single(out, inp, recv, send)
            parts = []
            for s in range(ws):
                theirs = _bytes_input(s, sum(s + d + 1 for d in range(ws)), dt, 100 + salt)
                start = sum(s + d + 1 for d in range(rank))
                parts.append(theirs[start:start + s + rank + 1])
            assert_equal_bits(out, torch.cat(parts), "all_to_all_single")
        with chk.case(f"{name} all_to_all"):
            ins = list(mine.repeat(ws).chunk(ws))
            outs = [torch.empty(N, dtype=dt) for _ in range(ws)]
            dist.all_to_all(outs, ins)
            for r in range(ws):
                assert_equal_bits(outs[r], every[r], f"all_to_all from {r}")
        with chk.case(f"{name} gather"):
            outs = [torch.empty(N, dtype=dt) for _ in range(ws)] if rank == 0 else None
            dist.gather(mine, outs, dst=0)
            if rank == 0:
                for r in range(ws):
                    assert_equal_bits(outs[r], every[r], f"gather from {r}")
        with chk.case(f"{name} scatter"):
            out = torch.empty(N, dtype=dt)
            dist.scatter(out, list(torch.cat(every).chunk(ws)) if rank == 2 else None, src=2)
            assert_equal_bits(out, every[rank], "scatter")
        with chk.case(f"{name} send/recv ring"):
            right, left = (rank + 1) % ws, (rank - 1) % ws
            got = torch.empty(N, dtype=dt)
            ops = [dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, got, left)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            assert_equal_bits(got, every[left], "recv from the left neighbour")
        for what, call in (
            ("all_reduce", lambda: dist.all_reduce(mine.clone())),
            ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(
                torch.empty(N, dtype=dt), torch.cat(every))),
            ("reduce", lambda: dist.reduce(mine.clone(), dst=0)),
        ):
            with chk.case(f"{name} {what} refused"):
                try:
                    call()
                except ValueError as exc:
                    assert f"does not support dtype {name}" in str(exc), str(exc)
                else:
                    raise AssertionError(f"{what} of {name} did not raise")
        with chk.case(f"{name}: the group goes on"):
            x = torch.full((4,), float(rank + 1))
            dist.all_reduce(x)
            assert x.tolist() == [ws * (ws + 1) / 2] * 4, x
    return chk.finish()


def test_data_movement_takes_any_dtype():
    res = run_ranks(3, data_movement_any_dtype, env={"SMDCCL_NAN_CHECK": "1"}, timeout=180)
    print(f"\n[{BACKEND}] any dtype: {res[0]['cases']} cases per rank")
