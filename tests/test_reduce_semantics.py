"""Reduction semantics beyond the matrix: complex data, 16-bit AVG rounding,
and the source rank of a receive.

Why each:
* complex tensors: torch hands all_reduce a view_as_real copy itself, but
  reduce, reduce_scatter and reduce_scatter_tensor reach the backend as
  complex; gloo sums them, so smdccl must too (SUM, AVG, PREMUL_SUM act on
  the real and imaginary parts one by one), and refuse MAX/MIN/PRODUCT with
  a ValueError. The work's result is the caller's complex tensor.
* float16/bfloat16 AVG at a world size that is not a power of two: scaling
  each input by 1/3 in 16 bits rounds it once more before the sum (7 became
  6.996 in float16, 7.03 in bfloat16); scaling by the power of two above
  (exact) and by 4/3 once at the end gives identical inputs of short
  significand back exactly, in every collective.
* ``irecv(src=p)._source_rank()``: gloo answers p; code written for it reads it.
* outputs that are ``nn.Parameter``s (leaves that require grad): NCCL writes
  them below autograd, so ``all_reduce(param, op=AVG)`` works there (model
  averaging, local SGD). smdccl's bodies scale and copy with torch ops on
  the progress thread, whose grad mode is on: each ran into "a leaf
  Variable that requires grad is being used in an in-place operation" and
  failed the whole group. gloo raises it for AVG and reduce_scatter_tensor.
Three ranks, one spawn. smdccl only where gloo lacks the feature (AVG).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, check_all, run_ranks

pytestmark = pytest.mark.smdccl_only

COMPLEX_DTYPES = (torch.complex64, torch.complex128)


def complex_input(rank: int, n: int, dtype) -> torch.Tensor:
    """Small integer parts: every sum below is exact in float32."""
    k = torch.arange(n, dtype=torch.float64)
    return torch.complex((k % 5) - 2 + rank, (k % 3) * (rank + 1) - 1).to(dtype)


def same(got: torch.Tensor, want: torch.Tensor, op: str) -> None:
    """Exact, except AVG's division (its rounding depends on the order)."""
    if op == "AVG":
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want), (got, want)


def complex_cases(rank: int, ws: int):
    n = 12 * ws + 3  # odd: the real view is not a multiple of anything convenient

    def expected(op: str, dtype) -> torch.Tensor:
        s = sum(complex_input(r, n, torch.complex128) for r in range(ws))
        if op == "AVG":
            s = s / ws
        elif op == "PREMUL_SUM":
            s = s * 2.0
        return s.to(dtype)

    def make(op: str):
        return dist._make_nccl_premul_sum(2.0) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)

    for dtype in COMPLEX_DTYPES:
        for op in ("SUM", "AVG", "PREMUL_SUM"):
            def reduce_to_last(dtype=dtype, op=op):
                t = complex_input(rank, n, dtype)
                dist.reduce(t, dst=ws - 1, op=make(op))
                if rank == ws - 1:
                    same(t, expected(op, dtype), op)
                else:
                    assert torch.equal(t, complex_input(rank, n, dtype)), "a non-root's input changed"

            def reduce_scatter_tensor(dtype=dtype, op=op):
                per = n
                full = torch.cat([complex_input(rank, per, dtype) * (b + 1) for b in range(ws)])
                out = torch.zeros(per, dtype=dtype)
                work = dist.reduce_scatter_tensor(out, full, op=make(op), async_op=True)
                work.wait()
                assert work.result()[0].dtype == dtype, work.result()[0].dtype
                same(out, (expected(op, torch.complex128) * (rank + 1)).to(dtype), op)

            def reduce_scatter_list(dtype=dtype, op=op):
                ins = [complex_input(rank, n + b, dtype) for b in range(ws)]  # uneven blocks
                out = torch.zeros(n + rank, dtype=dtype)
                dist.reduce_scatter(out, ins, op=make(op))
                s = sum(complex_input(r, n + rank, torch.complex128) for r in range(ws))
                s = s / ws if op == "AVG" else s * 2.0 if op == "PREMUL_SUM" else s
                same(out, s.to(dtype), op)

            def all_reduce(dtype=dtype, op=op):
                t = complex_input(rank, n, dtype)
                dist.all_reduce(t, op=make(op))
                same(t, expected(op, dtype), op)

            yield f"reduce {dtype} {op}", reduce_to_last
            yield f"reduce_scatter_tensor {dtype} {op}", reduce_scatter_tensor
            yield f"reduce_scatter (list) {dtype} {op}", reduce_scatter_list
            yield f"all_reduce {dtype} {op}", all_reduce

    for op in ("MAX", "MIN", "PRODUCT"):
        def refused(op=op):
            try:
                dist.reduce(complex_input(rank, 4, torch.complex64), dst=0, op=getattr(dist.ReduceOp, op))
            except ValueError as exc:
                assert "complex tensors reduce with SUM, AVG or PREMUL_SUM" in str(exc), str(exc)
                return
            raise AssertionError(f"reduce of complex64 with {op} did not raise")

        yield f"reduce complex64 {op} refused", refused


def avg_cases(rank: int, ws: int):
    """Identical inputs on every rank: their average is the input itself."""
    # Short significands: 3x/4 (the 16-bit partial sum of three x/4) is exact
    # for these, so only the scaling can lose bits.
    values = torch.tensor([7.0, 1.0, 2.0, 3.0, -5.0, 100.0, 3.5, 0.375])
    for dtype in (torch.float16, torch.bfloat16):
        x = values.to(dtype)

        def all_reduce(x=x):
            t = x.clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            assert torch.equal(t, x), (t, x)

        def reduce_scatter_tensor(x=x):
            out = torch.zeros_like(x)
            dist.reduce_scatter_tensor(out, x.repeat(ws), op=dist.ReduceOp.AVG)
            assert torch.equal(out, x), (out, x)

        def reduce(x=x):
            t = x.clone()
            dist.reduce(t, dst=1, op=dist.ReduceOp.AVG)
            if rank == 1:
                assert torch.equal(t, x), (t, x)

        def sparse(x=x):
            t = torch.sparse_coo_tensor(torch.arange(x.numel()).unsqueeze(0), x.clone(), (x.numel() + 2,))
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            dense = t.to_dense()
            assert torch.equal(dense[: x.numel()], x), (dense, x)

        yield f"all_reduce AVG {dtype} of equal inputs", all_reduce
        yield f"reduce_scatter_tensor AVG {dtype} of equal inputs", reduce_scatter_tensor
        yield f"reduce AVG {dtype} of equal inputs", reduce
        yield f"sparse all_reduce AVG {dtype} of equal inputs", sparse


def source_rank_cases(rank: int, ws: int):
    def named_source():
        # Ring: each rank sends to the next and receives from the previous.
        prev, nxt = (rank - 1) % ws, (rank + 1) % ws
        got = torch.zeros(3)
        recv = dist.irecv(got, src=prev, tag=11)
        assert recv._source_rank() == prev  # known before the message arrives
        dist.send(torch.full((3,), float(rank)), dst=nxt, tag=11)
        recv.wait()
        assert recv._source_rank() == prev and torch.equal(got, torch.full((3,), float(prev)))

    yield "irecv(src=p)._source_rank() is p", named_source


def parameter_cases(rank: int, ws: int):
    """Every collective that writes a tensor, into nn.Parameters, each case
    on its own: its values, the parameter still a leaf that requires grad,
    and the group still working after it."""
    n = 4 * ws
    total = sum(range(1, ws + 1))  # rank r contributes r + 1

    def param(value: float, size: int = n) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.full((size,), float(value)))

    def leaf(p: torch.nn.Parameter, want: float) -> None:
        torch.testing.assert_close(p.detach(), torch.full_like(p.detach(), want))
        assert p.requires_grad and p.is_leaf and p.grad_fn is None, p
        ok = torch.ones(1)
        dist.all_reduce(ok)  # the group goes on
        assert ok.item() == ws

    def all_reduce(op: str, want: float):
        def case():
            p = param(rank + 1)
            dist.all_reduce(p, op=getattr(dist.ReduceOp, op))
            leaf(p, want)
        return case

    def premul():
        p = param(rank + 1)
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(2.0))
        leaf(p, 2.0 * total)

    def fused_avg():
        ps = [param(rank + 1, size) for size in (3, 5, 7)]
        for w in [dist.all_reduce(p, op=dist.ReduceOp.AVG, async_op=True) for p in ps]:
            w.wait()
        for p in ps:
            leaf(p, total / ws)

    def broadcast():
        p = param(rank + 1)
        dist.broadcast(p, src=ws - 1)
        leaf(p, ws)

    def reduce_scatter_avg():
        out = param(0, 4)
        dist.reduce_scatter_tensor(out, param(rank + 1), op=dist.ReduceOp.AVG)
        leaf(out, total / ws)

    def all_gather():
        out = param(0)
        dist.all_gather_into_tensor(out, param(rank + 1, 4))
        torch.testing.assert_close(out.detach(), torch.arange(1, ws + 1.0).repeat_interleave(4))
        assert out.requires_grad and out.is_leaf and out.grad_fn is None, out
        outs = [param(0, 4) for _ in range(ws)]
        dist.all_gather(outs, param(rank + 1, 4))
        for r, o in enumerate(outs):
            leaf(o, r + 1)

    def recv():
        got = param(0)
        nxt, prev = (rank + 1) % ws, (rank - 1) % ws
        req = dist.irecv(got, src=prev)
        dist.send(torch.full((n,), float(rank + 1)), dst=nxt)
        req.wait()
        leaf(got, prev + 1)

    yield "all_reduce SUM into a Parameter", all_reduce("SUM", total)
    yield "all_reduce AVG into a Parameter", all_reduce("AVG", total / ws)
    yield "all_reduce PREMUL_SUM into a Parameter", premul
    yield "fused async all_reduce AVG into Parameters", fused_avg
    yield "broadcast into a Parameter", broadcast
    yield "reduce_scatter_tensor AVG into a Parameter", reduce_scatter_avg
    yield "all_gather(_into_tensor) into Parameters", all_gather
    yield "recv into a Parameter", recv


def semantics() -> dict:
    rank, ws = dist.get_rank(), dist.get_world_size()
    cases = (list(complex_cases(rank, ws)) + list(avg_cases(rank, ws)) + list(source_rank_cases(rank, ws)) +
             list(parameter_cases(rank, ws)))
    return check_all(cases, label=f"rank {rank} of {ws} (backend {BACKEND})")


def test_complex_avg_source_rank_and_parameters():
    # check_all raises, listing every failed sub-case, on the rank that saw it
    for r in run_ranks(3, semantics, timeout=180):
        assert r["failures"] == 0 and r["cases"] == 2 * 3 * 4 + 3 + 2 * 4 + 1 + 8, r
