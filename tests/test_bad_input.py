"""Bad arguments: a clear error on the calling rank, and the group keeps working.

Why: a user mistake (a non-contiguous view, a wrong output size, an integer
tensor with AVG, a rank that does not exist) must fail *at the call*, with a
message that says what to fix, and must not leave the group broken, hanging
or silently wrong.  tests/test_collectives.py (``_invalid_ops``) already
covers AVG / PREMUL_SUM on integer and bool tensors for every reducing
collective; this file covers the rest of the argument checks
(csrc/backend/arg_checks.cpp, csrc/backend/call_checks.cpp, the *_ops.cpp) and
the overlaps that torch allows.

How: one spawn of 2 ranks runs every case of ``CASES`` in order.  Every case
is symmetric -- both ranks make the same bad call -- so each rank fails in
its own argument checks before any communication, and no rank waits for a
peer that has already given up.  Root-only arguments (gather_list,
scatter_list) are checked on one-rank groups, where the caller is the root.
After every case both ranks run a correct all_reduce (integer, rank-dependent
values) that must give the exact sum: the group still works.  Each case then
becomes its own pytest item (the spawn is shared through a module fixture),
so known defects are ``xfail(strict=True)`` items with their reason.

``source`` says who raises: "smdccl" (the engine's checks: ValueError whose
message starts with "smdccl:") or "torch" (torch.distributed's Python layer
or dispatcher raises before the backend is reached; the type is then
torch's: ValueError, or RuntimeError / its subclass NotImplementedError).
"legal" cases are overlaps torch allows: they must not raise and must give
the right result.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, run_ranks
from reference import assert_equal_bits, rank_input

pytestmark = pytest.mark.smdccl_only  # the messages asserted are smdccl's

WS = 2
N = 6


@dataclass
class Env:
    rank: int
    ws: int
    solo: Any  # a one-rank group holding only this rank (it is the root there)
    pair: Any  # a subgroup of both ranks


@dataclass
class Case:
    name: str
    call: Callable[[Env], Any]
    #: expected exception types; None: the call is legal and ``call`` checks the result itself
    raises: tuple | None = (ValueError,)
    #: the message must contain each of these (case-insensitive): what is wrong / what to do
    says: tuple = ()
    source: str = "smdccl"  # "smdccl", "torch" or "legal"
    xfail: str | None = None
    marks: list = field(default_factory=list)


def _t(*shape, dtype=torch.float32, fill=1.0):
    return torch.full(shape, fill, dtype=dtype)


def _meta(n):
    return torch.empty(n, device="meta")


def _transposed():
    return torch.ones(4, 3).t()  # a (3, 4) view with strides (1, 3): not contiguous


# ---- legal overlaps and calls: run, then compare with the expected result ----


def _sparse_all_reduce(e: Env):
    t = torch.sparse_coo_tensor(torch.tensor([[e.rank, 3]]), torch.tensor([1.0, 2.0]), (4,))
    dist.all_reduce(t)
    assert t.is_sparse and t.to_dense().tolist() == [1.0, 1.0, 0.0, 2.0 * e.ws], t


def _in_place_all_gather(e: Env):
    """input is this rank's own slice of the output: torch's in-place all_gather."""
    out = torch.zeros(e.ws * N)
    out[e.rank * N:(e.rank + 1) * N] = rank_input(e.rank, N, torch.float32, 1, "rand")
    dist.all_gather_into_tensor(out, out[e.rank * N:(e.rank + 1) * N])
    assert_equal_bits(out, torch.cat([rank_input(r, N, torch.float32, 1, "rand") for r in range(e.ws)]))


def _all_gather_input_in_first_slot(e: Env):
    """input is output[0:N] on every rank: on rank 1 that is rank 0's slot."""
    out = torch.zeros(e.ws * N)
    out[:N] = rank_input(e.rank, N, torch.float32, 2, "rand")
    dist.all_gather_into_tensor(out, out[:N])
    assert_equal_bits(out, torch.cat([rank_input(r, N, torch.float32, 2, "rand") for r in range(e.ws)]))


def _all_gather_input_straddles_slots(e: Env):
    """input is output[N/2 : N/2 + N]: half in slot 0, half in slot 1."""
    out = torch.zeros(e.ws * N)
    h = N // 2
    out[h:h + N] = rank_input(e.rank, N, torch.float32, 3, "rand")
    dist.all_gather_into_tensor(out, out[h:h + N])
    assert_equal_bits(out, torch.cat([rank_input(r, N, torch.float32, 3, "rand") for r in range(e.ws)]))


def _rs_expected(e: Env, seed: int) -> torch.Tensor:
    total = sum(rank_input(r, e.ws * N, torch.int64, seed, "int") for r in range(e.ws))
    return total[e.rank * N:(e.rank + 1) * N]


def _rs_with_output_at(e: Env, start: int, seed: int):
    inp = rank_input(e.rank, e.ws * N, torch.int64, seed, "int").clone()
    dist.reduce_scatter_tensor(inp[start:start + N], inp)
    assert_equal_bits(inp[start:start + N], _rs_expected(e, seed))


def _a2a_in_place(e: Env):
    a = rank_input(e.rank, e.ws * N, torch.float64, 7, "rand").clone()
    dist.all_to_all_single(a, a)
    expect = torch.cat([rank_input(r, e.ws * N, torch.float64, 7, "rand")[e.rank * N:(e.rank + 1) * N]
                        for r in range(e.ws)])
    assert_equal_bits(a, expect)


def _all_gather_input_is_other_output(e: Env):
    """all_gather(list): the input tensor is also output_tensor_list[other rank]."""
    other = 1 - e.rank
    x = rank_input(e.rank, N, torch.float32, 8, "rand").clone()
    outs = [torch.zeros(N) for _ in range(e.ws)]
    outs[other] = x
    dist.all_gather(outs, x)
    for r in range(e.ws):
        assert_equal_bits(outs[r], rank_input(r, N, torch.float32, 8, "rand"), f"slot {r}")


def _async_same_tensor(e: Env):
    """20 async all_reduces of one tensor: each reduces the previous one's result (stream order)."""
    t = torch.ones(16, dtype=torch.float64)
    works = [dist.all_reduce(t, async_op=True) for _ in range(20)]
    for w in works:
        w.wait()
    assert torch.equal(t, torch.full((16,), 2.0 ** 20, dtype=torch.float64)), \
        f"got {t[0].item()}, expected 2**20 = {2.0 ** 20} (each all_reduce doubles the tensor)"


def _async_overlapping_views(e: Env):
    """async all_reduces of overlapping views of one tensor, in order."""
    t = torch.ones(8, dtype=torch.float64)
    expect = torch.ones(8, dtype=torch.float64)
    works = []
    for i in range(12):
        works.append(dist.all_reduce(t[i % 4:i % 4 + 4], async_op=True))
        expect[i % 4:i % 4 + 4] *= e.ws
    for w in works:
        w.wait()
    assert torch.equal(t, expect), f"got {t.tolist()}, expected {expect.tolist()}"


def _complex_sum(e: Env):
    """complex all_reduce SUM: torch reduces the real view; must be right."""
    c = torch.tensor([1 + 2j, -3 + 0.5j, 0j], dtype=torch.complex64) * (e.rank + 1)
    dist.all_reduce(c)
    assert torch.equal(c, torch.tensor([1 + 2j, -3 + 0.5j, 0j], dtype=torch.complex64) * 3), f"got {c.tolist()}"


def _a2a_self_block(e: Env, to_self: int, from_self: int):
    """all_to_all_single whose own block disagrees: sends ``to_self`` elements to itself but
    expects ``from_self`` from itself (the blocks to / from the other rank agree: 1 each)."""
    other = 1 - e.rank
    in_splits, out_splits = [0, 0], [0, 0]
    in_splits[e.rank], in_splits[other] = to_self, 1
    out_splits[e.rank], out_splits[other] = from_self, 1
    out = torch.full((sum(out_splits),), -7.0)
    dist.all_to_all_single(out, torch.ones(sum(in_splits)), out_splits, in_splits)
    return out


def _a2a_list_self_block(e: Env):
    """all_to_all (lists): inputs[rank] has 1 element, outputs[rank] 3."""
    ins = [torch.ones(1 if j == e.rank else 2) for j in range(e.ws)]
    outs = [torch.full((3 if j == e.rank else 2,), -7.0) for j in range(e.ws)]
    dist.all_to_all(outs, ins)
    return outs


def _quantized():
    return torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)


def _premul(factor):
    return dist._make_nccl_premul_sum(factor)


XF_META = ("torch registers Meta kernels for the c10d ops (c10d::allreduce_ & co.): when any tensor argument is "
           "on 'meta', the dispatcher runs that no-op kernel and never calls the backend, so nothing raises "
           "(a CPU output stays unwritten). Not reachable from smdccl's C++ backend methods.")

CASES: list[Case] = [
    # ---------------------------------------------------------------- wrong device
    Case("device: all_reduce of a meta tensor", lambda e: dist.all_reduce(_meta(4)),
         says=("meta", "cpu"), xfail=XF_META),
    Case("device: all_gather_into_tensor, CPU output, meta input",
         lambda e: dist.all_gather_into_tensor(torch.zeros(e.ws * 4), _meta(4)), says=("meta", "cpu"),
         xfail=XF_META),
    Case("device: all_gather output_tensor_list entry on meta",
         lambda e: dist.all_gather([torch.zeros(4), _meta(4)], torch.ones(4)),
         says=("output_tensor_list[1]", "is on meta", ".cpu()")),
    Case("device: scatter_list entry on meta (root)",
         lambda e: dist.scatter(torch.zeros(4), [_meta(4)], group=e.solo, group_src=0),
         says=("scatter_list[0]", "is on meta", ".cpu()")),
    Case("device: PREMUL_SUM with a tensor factor on meta",
         lambda e: dist.all_reduce(torch.ones(5), op=_premul(torch.ones(1, device="meta"))),
         says=("factor",)),
    # ---------------------------------------------------------------- mixed dtypes
    Case("dtype: all_gather output list float32 + float64",
         lambda e: dist.all_gather([torch.zeros(N), torch.zeros(N, dtype=torch.float64)], torch.ones(N)),
         says=("different dtypes", "float64"), source="torch"),
    Case("dtype: all_gather output list float64, input float32",
         lambda e: dist.all_gather([torch.zeros(N, dtype=torch.float64)] * e.ws, torch.ones(N)),
         says=("different dtypes",), source="torch"),
    Case("dtype: all_to_all output list float32 + int32",
         lambda e: dist.all_to_all([torch.zeros(N), torch.zeros(N, dtype=torch.int32)], [torch.ones(N)] * e.ws),
         says=("different dtypes",), source="torch"),
    Case("dtype: all_to_all input list float32 + float64",
         lambda e: dist.all_to_all([torch.zeros(N)] * e.ws, [torch.ones(N), torch.ones(N, dtype=torch.float64)]),
         says=("different dtypes",), source="torch"),
    Case("dtype: all_to_all_single input float64, output float32",
         lambda e: dist.all_to_all_single(torch.zeros(4), torch.ones(4, dtype=torch.float64)),
         says=("different dtypes",), source="torch"),
    Case("dtype: all_gather_into_tensor output float64, input float32",
         lambda e: dist.all_gather_into_tensor(torch.zeros(e.ws * N, dtype=torch.float64), torch.ones(N)),
         says=("output dtype double differs from input dtype float",)),
    Case("dtype: reduce_scatter_tensor input float64, output float32",
         lambda e: dist.reduce_scatter_tensor(torch.zeros(N), torch.ones(e.ws * N, dtype=torch.float64)),
         says=("output dtype float differs from input dtype double",)),
    Case("dtype: reduce_scatter input list float32 + float64",
         lambda e: dist.reduce_scatter(torch.zeros(2), [torch.ones(2), torch.ones(2, dtype=torch.float64)]),
         says=("different dtypes",), source="torch"),
    Case("dtype: gather_list int64 for a float32 input (root)",
         lambda e: dist.gather(torch.ones(N), [torch.zeros(N, dtype=torch.int64)], group=e.solo, group_dst=0),
         says=("different dtypes",), source="torch"),
    Case("dtype: scatter_list float64 for a float32 output (root)",
         lambda e: dist.scatter(torch.zeros(N), [torch.ones(N, dtype=torch.float64)], group=e.solo, group_src=0),
         says=("different dtypes",), source="torch"),
    Case("dtype: all_reduce uint16 (unsupported dtype)", lambda e: dist.all_reduce(torch.ones(4, dtype=torch.uint16)),
         says=("does not support dtype uint16", "reduces float32", "only move data take any dtype")),
    Case("dtype: all_reduce float8_e4m3fn (unsupported dtype)",
         lambda e: dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fn)),
         says=("does not support dtype float8_e4m3fn", "reduces float32")),
    Case("dtype: all_reduce complex64 with MAX", lambda e: dist.all_reduce(
        torch.ones(4, dtype=torch.complex64), op=dist.ReduceOp.MAX), says=("complex",), source="torch"),
    Case("legal: all_reduce complex64 SUM (reduced as its real view)", _complex_sum, raises=None, source="legal"),
    # ---------------------------------------------------------------- wrong sizes
    Case("size: all_gather_into_tensor output world_size*n + 1",
         lambda e: dist.all_gather_into_tensor(torch.zeros(e.ws * N + 1), torch.ones(N)),
         says=("output must have world_size (2) x input elements = 12, got 13",)),
    Case("size: all_gather_into_tensor output n (one slot)",
         lambda e: dist.all_gather_into_tensor(torch.zeros(N), torch.ones(N)),
         says=("output must have world_size (2) x input elements = 12, got 6",)),
    Case("size: reduce_scatter_tensor input world_size*n - 1",
         lambda e: dist.reduce_scatter_tensor(torch.zeros(N), torch.ones(e.ws * N - 1)),
         says=("input must have world_size (2) x output elements = 12, got 11",)),
    Case("size: all_gather output list of 1 for 2 ranks",
         lambda e: dist.all_gather([torch.zeros(N)], torch.ones(N)),
         says=("one tensor per rank (2), got 1",)),
    Case("size: all_gather output list's own entry of n + 1",
         lambda e: dist.all_gather([torch.zeros(N + 1) for _ in range(e.ws)], torch.ones(N)),
         says=("(this rank's block) has 7 elements but the input has 6",)),
    Case("size: reduce_scatter input list's own entry of n + 1",
         lambda e: dist.reduce_scatter(torch.zeros(N), [torch.ones(N + 1) for _ in range(e.ws)]),
         says=("(this rank's block) has 7 elements but the output has 6",)),
    Case("size: gather_list entry of n + 1 (root)",
         lambda e: dist.gather(torch.ones(N), [torch.zeros(N + 1)], group=e.solo, group_dst=0),
         says=("gather_list[0] has 7 elements but the input has 6",)),
    Case("size: gather_list of 2 in a 1-rank group (root)",
         lambda e: dist.gather(torch.ones(N), [torch.zeros(N), torch.zeros(N)], group=e.solo, group_dst=0),
         says=("gather_list must hold one tensor per rank (1), got 2",)),
    Case("size: gather_single output of n + 1 on a 1-rank group (root)",
         lambda e: dist.gather_single(torch.ones(N), torch.zeros(N + 1), group=e.solo, group_dst=0),
         says=("gather_into_tensor: the output has 7 elements; it needs world_size (1) x the input's 6",)),
    Case("dtype: gather_single output float64 for a float32 input (root)",
         lambda e: dist.gather_single(torch.ones(N), torch.zeros(N, dtype=torch.float64), group=e.solo,
                                      group_dst=0),
         says=("different dtypes",), source="torch"),
    Case("size: scatter_list entry of n + 1 (root)",
         lambda e: dist.scatter(torch.zeros(N), [torch.ones(N + 1)], group=e.solo, group_src=0),
         says=("scatter_list[0] has 7 elements",)),
    Case("size: reduce_scatter input list of 1 for 2 ranks",
         lambda e: dist.reduce_scatter(torch.zeros(2), [torch.ones(2)]),
         says=("input_list must hold one tensor per rank (2), got 1",)),
    Case("size: all_to_all lists of 1 for 2 ranks",
         lambda e: dist.all_to_all([torch.zeros(N)], [torch.ones(N)]),
         says=("one input and one output tensor per rank (2), got 1 and 1",)),
    Case("size: all_to_all_single output splits sum to 3, dim 0 is 4",
         lambda e: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [1, 2], [2, 2]),
         says=("output split sizes sum to 3 but dim 0 is 4",)),
    Case("size: all_to_all_single negative split",
         lambda e: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [2, 2], [5, -1]),
         says=("negative split size -1",)),
    Case("size: all_to_all_single one split for 2 ranks",
         lambda e: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [4], [4]),
         says=("split sizes need one entry per rank (2), got 1",)),
    Case("size: all_to_all_single sends 3 elements to itself but expects 1 from itself",
         lambda e: _a2a_self_block(e, 3, 1), says=("split",)),
    Case("size: all_to_all_single sends 1 element to itself but expects 3 from itself",
         lambda e: _a2a_self_block(e, 1, 3), says=("split",)),
    Case("size: all_to_all inputs[rank] of 1 element, outputs[rank] of 3",
         _a2a_list_self_block),
    Case("size: all_to_all_single dim 0 of 3 without splits",
         lambda e: dist.all_to_all_single(torch.zeros(3), torch.ones(3)),
         says=("must divide by the world size (2) when no split sizes are given",)),
    # ---------------------------------------------------------------- non-contiguous
    Case("layout: all_reduce of a transposed view", lambda e: dist.all_reduce(_transposed()),
         says=("must be contiguous", ".contiguous()")),
    Case("layout: broadcast of a transposed view", lambda e: dist.broadcast(_transposed(), src=0),
         says=("must be contiguous", ".contiguous()")),
    Case("layout: reduce of a transposed view", lambda e: dist.reduce(_transposed(), dst=0),
         says=("must be contiguous",)),
    Case("layout: all_gather_into_tensor transposed input",
         lambda e: dist.all_gather_into_tensor(torch.zeros(e.ws * 12), _transposed()),
         says=("input must be contiguous",)),
    Case("layout: all_gather_into_tensor transposed output",
         lambda e: dist.all_gather_into_tensor(torch.zeros(4, e.ws * 3).t(), torch.ones(12)),
         says=("output must be contiguous",)),
    Case("layout: reduce_scatter_tensor transposed output",
         lambda e: dist.reduce_scatter_tensor(torch.zeros(2, 3).t(), torch.ones(e.ws * 6)),
         says=("output must be contiguous",)),
    Case("layout: all_gather output list entry transposed",
         lambda e: dist.all_gather([torch.zeros(4, 3).t(), torch.zeros(3, 4)], torch.ones(3, 4)),
         says=("output_tensor_list[0] must be contiguous",)),
    Case("layout: all_to_all_single transposed input",
         lambda e: dist.all_to_all_single(torch.zeros(e.ws, 4), torch.ones(4, e.ws).t()),
         says=("input must be contiguous",)),
    Case("layout: all_reduce of an expanded (stride 0) view", lambda e: dist.all_reduce(torch.zeros(1).expand(4)),
         says=("must be contiguous",)),
    Case("layout: all_reduce of a channels_last tensor",
         lambda e: dist.all_reduce(torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)),
         says=("must be contiguous",)),
    Case("layout (legal): all_reduce of a sparse COO tensor (tests/test_sparse.py has the rest)",
         _sparse_all_reduce, raises=None, source="legal"),
    Case("layout: all_reduce of a quantized tensor", lambda e: dist.all_reduce(_quantized()),
         raises=(RuntimeError,), says=("quantizedcpu",), source="torch"),
    # ---------------------------------------------------------------- overlapping tensors
    Case("overlap (legal): all_gather_into_tensor in place, input = own slot of output",
         _in_place_all_gather, raises=None, source="legal"),
    Case("overlap: all_gather_into_tensor input = output[0:n] (rank 0's slot on rank 1)",
         _all_gather_input_in_first_slot, raises=None, source="legal"),
    Case("overlap: all_gather_into_tensor input straddles two slots of output",
         _all_gather_input_straddles_slots, raises=None, source="legal"),
    Case("overlap (legal): reduce_scatter_tensor in place, output = own chunk of input",
         lambda e: _rs_with_output_at(e, e.rank * N, 4), raises=None, source="legal"),
    Case("overlap: reduce_scatter_tensor output = input[0:n] (rank 0's chunk on rank 1)",
         lambda e: _rs_with_output_at(e, 0, 5), raises=None, source="legal"),
    Case("overlap: reduce_scatter_tensor output straddles two chunks of input",
         lambda e: _rs_with_output_at(e, N // 2, 6), raises=None, source="legal"),
    Case("overlap: all_to_all_single in place (output is input)", _a2a_in_place, raises=None, source="legal"),
    Case("overlap: all_gather(list) input is also output_tensor_list[other rank]",
         _all_gather_input_is_other_output, raises=None, source="legal"),
    Case("overlap: 20 async all_reduces of the same tensor (stream order: x 2**20)", _async_same_tensor,
         raises=None, source="legal"),
    Case("overlap: async all_reduces of overlapping views, in order", _async_overlapping_views,
         raises=None, source="legal"),
    # ---------------------------------------------------------------- reduce ops
    Case("op: all_reduce AVG on int32", lambda e: dist.all_reduce(_t(4, dtype=torch.int32), op=dist.ReduceOp.AVG),
         says=("avg needs a floating-point tensor", "use sum and divide")),
    Case("op: reduce_scatter_tensor AVG on uint8",
         lambda e: dist.reduce_scatter_tensor(_t(2, dtype=torch.uint8), _t(4, dtype=torch.uint8),
                                              op=dist.ReduceOp.AVG),
         says=("avg needs a floating-point tensor",)),
    Case("op: all_reduce AVG on bool", lambda e: dist.all_reduce(_t(4, dtype=torch.bool), op=dist.ReduceOp.AVG),
         says=("avg needs a floating-point tensor, got bool",)),
    Case("op: all_reduce PREMUL_SUM on int64", lambda e: dist.all_reduce(_t(4, dtype=torch.int64), op=_premul(2.0)),
         says=("premul_sum needs a floating-point tensor, got long",)),
    Case("op: reduce PREMUL_SUM on int32",
         lambda e: dist.reduce(_t(4, dtype=torch.int32), dst=1, op=_premul(2.0)),
         says=("premul_sum needs a floating-point tensor",)),
    Case("op: all_reduce BAND on bfloat16",
         lambda e: dist.all_reduce(_t(4, dtype=torch.bfloat16), op=dist.ReduceOp.BAND),
         says=("band needs an integer or bool tensor, got bfloat16",)),
    Case("op: all_reduce BXOR on float32", lambda e: dist.all_reduce(_t(4), op=dist.ReduceOp.BXOR),
         says=("bxor needs an integer or bool tensor, got float32",)),
    Case("op: reduce_scatter_tensor BOR on float64",
         lambda e: dist.reduce_scatter_tensor(_t(2, dtype=torch.float64), _t(4, dtype=torch.float64),
                                              op=dist.ReduceOp.BOR),
         says=("bor needs an integer or bool tensor, got float64",)),
    Case("op: PREMUL_SUM with a 2-element factor tensor",
         lambda e: dist.all_reduce(_t(5), op=_premul(torch.tensor([2.0, 3.0]))),
         raises=(RuntimeError,), says=("numel() == 1",), source="torch"),
    Case("op: PREMUL_SUM with a complex factor tensor",
         lambda e: dist.all_reduce(_t(5), op=_premul(torch.tensor([2 + 1j]))),
         says=("factor",)),
    # ---------------------------------------------------------------- ranks out of range
    Case("rank: broadcast src=world_size", lambda e: dist.broadcast(_t(4), src=e.ws),
         says=("root rank 2 is out of range for a group of 2 ranks",)),
    Case("rank: broadcast src=-1", lambda e: dist.broadcast(_t(4), src=-1),
         says=("root rank -1 is out of range",)),
    Case("rank: broadcast group_src=2 in a 2-rank subgroup", lambda e: dist.broadcast(_t(4), group=e.pair, group_src=2),
         says=("root rank 2 is out of range for a group of 2 ranks",)),
    Case("rank: broadcast src= a global rank outside the group",
         lambda e: dist.broadcast(_t(4), group=e.solo, src=1 - e.rank), says=("is not part of group",), source="torch"),
    Case("rank: reduce dst=world_size", lambda e: dist.reduce(_t(4), dst=e.ws), says=("root rank 2 is out of range",)),
    Case("rank: gather dst=world_size", lambda e: dist.gather(_t(4), None, dst=e.ws),
         says=("root rank 2 is out of range",)),
    Case("rank: scatter src=world_size", lambda e: dist.scatter(_t(4), None, src=e.ws),
         says=("root rank 2 is out of range",)),
    Case("rank: send dst=world_size", lambda e: dist.send(_t(4), dst=e.ws),
         says=("destination rank 2 is out of range",)),
    Case("rank: isend dst=world_size", lambda e: dist.isend(_t(4), dst=e.ws),
         says=("destination rank 2 is out of range",)),
    Case("rank: send dst=-1", lambda e: dist.send(_t(4), dst=-1), says=("destination rank -1 is out of range",)),
    Case("rank: recv src=world_size", lambda e: dist.recv(_t(4), src=e.ws), says=("source rank 2 is out of range",)),
    Case("rank: irecv src=world_size", lambda e: dist.irecv(_t(4), src=e.ws),
         says=("source rank 2 is out of range",)),
    Case("rank: send to itself", lambda e: dist.send(_t(4), dst=e.rank),
         says=("should not be the same as the rank of the current process",), source="torch"),
    Case("rank: recv without src (any source) on a group of one rank",
         lambda e: dist.recv(_t(4), group=e.solo), says=("no other rank to receive from",)),
]


# ---------------------------------------------------------------------------
# Rank side
# ---------------------------------------------------------------------------


def _group_works(env: Env, i: int) -> str | None:
    """A correct all_reduce right after a bad call: None if it gives the exact sum."""
    try:
        t = torch.arange(7, dtype=torch.int64) * (env.rank + 1) + i
        dist.all_reduce(t)
        want = torch.arange(7, dtype=torch.int64) * sum(range(1, env.ws + 1)) + i * env.ws
        if not torch.equal(t, want):
            return f"the next all_reduce gave {t.tolist()}, expected {want.tolist()}"
        return None
    except Exception as exc:  # noqa: BLE001
        return f"the next all_reduce raised {type(exc).__name__}: {str(exc)[:500]}"


def _run_case(case: Case, env: Env) -> dict:
    t0 = time.monotonic()
    problems: list[str] = []
    raised = None
    try:
        ret = case.call(env)
        if isinstance(ret, dist.Work):  # an async bad call must fail at the call, not at wait()
            ret.wait()
            problems.append("the call returned a work handle whose wait() succeeded")
    except AssertionError as exc:  # a legal case's result check
        raised = exc
        problems.append(f"wrong result: {str(exc)[:1500]}")
    except Exception as exc:  # noqa: BLE001
        raised = exc
    msg = "" if raised is None else f"{type(raised).__name__}: {raised}".strip()
    if case.raises is None:
        if raised is not None and not isinstance(raised, AssertionError):
            problems.append(f"legal call raised {msg[:800]}")
    elif raised is None:
        problems.append("no exception")
    elif not isinstance(raised, case.raises):
        problems.append(f"raised {msg[:800]}, expected {' or '.join(t.__name__ for t in case.raises)}")
    else:
        low = str(raised).lower()
        missing = [s for s in case.says if s.lower() not in low]
        if missing:
            problems.append(f"message lacks {missing}: {msg[:800]}")
        if case.source == "smdccl" and not low.startswith("smdccl:"):
            problems.append(f"expected smdccl's own check (message 'smdccl: ...'), got {msg[:800]}")
    return {"ok": not problems, "problems": problems, "raised": msg[:600], "seconds": round(time.monotonic() - t0, 3)}


def bad_input_ranks() -> dict:
    warnings.filterwarnings("ignore")
    rank, ws = dist.get_rank(), dist.get_world_size()
    solos = [dist.new_group([r]) for r in range(ws)]  # every rank creates every group
    env = Env(rank=rank, ws=ws, solo=solos[rank], pair=dist.new_group(list(range(ws))))
    broken = _group_works(env, 0)
    assert broken is None, f"group unusable before any bad call: {broken}"
    out = {}
    for i, case in enumerate(CASES, start=1):
        res = _run_case(case, env)
        after = _group_works(env, i)
        res["group_ok_after"] = after is None
        if after:
            res["ok"] = False
            res["problems"].append(after)
        out[case.name] = res
    return out


# ---------------------------------------------------------------------------
# pytest
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outcomes():
    t0 = time.monotonic()
    results = run_ranks(WS, bad_input_ranks, timeout=180, pg_timeout=20)
    wall = time.monotonic() - t0
    print(f"\n[{BACKEND}] {len(CASES)} bad-input cases on {WS} ranks in one spawn: {wall:.1f} s")
    for case in CASES:
        r0 = results[0][case.name]
        state = "ok" if all(res[case.name]["ok"] for res in results) else "FAILS"
        xf = " (xfail)" if case.xfail else ""
        print(f"  [{state}{xf}] {case.name} [{case.source}]: {r0['raised'][:160] or 'no exception'}")
    return results


@pytest.mark.parametrize(
    "name", [pytest.param(c.name, id=c.name,
                          marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
             for c in CASES])
def test_bad_input(outcomes, name):
    problems = [f"rank {r}: {p}" for r, res in enumerate(outcomes) for p in res[name]["problems"]]
    assert not problems, "\n".join(problems)


def a2a_self_block_crash() -> dict:
    """Rank side of the crash repro: must raise ValueError, not SIGSEGV."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    env = Env(rank=rank, ws=ws, solo=None, pair=None)
    res = _run_case(Case("all_to_all_single sends 1 element to itself but expects 5,000,000",
                         lambda e: _a2a_self_block(e, 1, 5_000_000), says=("split",)), env)
    assert res["ok"], "; ".join(res["problems"])
    return res


def test_all_to_all_single_self_block_overread_crash():
    """Own spawn: before the self-block check every rank died with SIGSEGV (read 20 MB past an 8-byte input)."""
    run_ranks(WS, a2a_self_block_crash, timeout=60, pg_timeout=20, fail_grace=5)


def test_case_names_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
