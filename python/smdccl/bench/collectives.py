"""The six collectives and sendrecv: buffers, the call, the expected result, bandwidth.

Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md and
src/common.cu), so the numbers can be read side by side with theirs:

``size`` (bytes)
    The larger of the per-rank send and receive buffers:
    allreduce, broadcast, reduce and sendrecv the buffer itself; allgather the full *output*
    (world * chunk elements); reduce_scatter the full *input*
    (world * chunk); alltoall the full send buffer (world * chunk).
    A requested size is rounded down to a whole number of elements and, for
    the last three, to a multiple of world * element size (at least one
    element per rank), exactly as nccl-tests does; the table shows the
    rounded size.
``count`` (elements)
    The count nccl's own API takes: allreduce/broadcast/reduce/sendrecv the whole buffer,
    allgather the per-rank input, reduce_scatter the per-rank output,
    alltoall the chunk sent to each peer.
``algbw`` = size / time (GB/s, 1 GB = 1e9 bytes).
``busbw`` = algbw * factor, with n = world size:
    allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n;
    broadcast, reduce and sendrecv 1.

sendrecv is nccl-tests' sendrecv_perf: each rank sends its buffer to rank + 1
and receives rank - 1's (isend / irecv, both waited for), so it times the
send/recv path rather than a collective algorithm.

Correctness: inputs are integer-valued and small enough that every partial
result is exact in the chosen dtype, so sum/max/min/product can be compared
exactly with a float64 reference computed locally; avg (one rounding for the
division) is compared with a relative tolerance of max(4, n) * eps(dtype).
Broadcast uses root 0 (non-roots start from zeros, which no expected value
equals); reduce uses root 0 and checks the root's buffer only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from smdccl.bench import choices

REDUCING = frozenset({"allreduce", "reduce_scatter", "reduce"})
_CHUNKED = frozenset({"allgather", "reduce_scatter", "alltoall"})

REDOPS = {name: getattr(dist.ReduceOp, name.upper()) for name in choices.OPS}

# Every integer in [0, limit] is exactly representable in the dtype.
_EXACT_LIMIT = {
    torch.float16: 2048,
    torch.bfloat16: 256,
    torch.float32: 1 << 24,
    torch.float64: 1 << 53,
    torch.int8: 127,
    torch.uint8: 255,
    torch.int16: (1 << 15) - 1,
    torch.int32: (1 << 31) - 1,
    torch.int64: (1 << 63) - 1,
}
DTYPES = {name: getattr(torch, name) for name in choices.DTYPES}


def busbw_factor(name: str, world: int) -> float:
    """nccl-tests PERFORMANCE.md bus-bandwidth correction factor."""
    if name == "allreduce":
        return 2.0 * (world - 1) / world
    if name in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    return (world - 1) / world


def layout(name: str, nbytes: int, elem: int, world: int) -> tuple[int, int, int, int]:
    """(size bytes, nccl count, input numel, output numel) for a requested size."""
    count = max(1, nbytes // elem)
    if name not in _CHUNKED:
        return count * elem, count, count, count
    chunk = max(1, count // world)
    if name == "allgather":
        return world * chunk * elem, chunk, chunk, world * chunk
    if name == "reduce_scatter":
        return world * chunk * elem, chunk, world * chunk, chunk
    return world * chunk * elem, chunk, world * chunk, world * chunk  # alltoall


class _Values:
    """Input value of element ``idx`` on rank ``r``, as exact float64.

    Plain pattern: ((idx + 13 r) mod M) + 1, rank-dependent so a misplaced
    chunk shows up, with M chosen so that a sum over all ranks stays exact
    (M * world <= exact limit of the dtype). For product the values are 1
    except on one rank per element, so the product is (idx mod 3) + 1.
    """

    def __init__(self, dtype: torch.dtype, world: int, op: str | None):
        self.world = world
        self.product = op == "product"
        limit = _EXACT_LIMIT[dtype]
        if op in ("sum", "avg"):
            limit //= world
        self.modulus = max(1, min(97, limit))

    def __call__(self, r: int, idx: torch.Tensor) -> torch.Tensor:
        if self.product:
            return torch.where(idx % self.world == r, idx % 3 + 1, 1).double()
        return ((idx + 13 * r) % self.modulus + 1).double()


def _reduce(values: _Values, idx: torch.Tensor, op: str, world: int) -> torch.Tensor:
    acc = values(0, idx)
    for r in range(1, world):
        v = values(r, idx)
        if op in ("sum", "avg"):
            acc += v
        elif op == "max":
            torch.maximum(acc, v, out=acc)
        elif op == "min":
            torch.minimum(acc, v, out=acc)
        else:
            acc *= v
    return acc / world if op == "avg" else acc


def _sendrecv(inp: torch.Tensor, out: torch.Tensor, group, rank: int, world: int) -> None:
    """``inp`` to rank + 1, ``out`` from rank - 1 (group ranks = global ranks)."""
    works = [dist.irecv(out, (rank - 1) % world, group=group),
             dist.isend(inp, (rank + 1) % world, group=group)]
    for w in works:
        w.wait()


@dataclass
class Case:
    """One collective at one size on one group: buffers plus the call."""

    name: str
    size: int
    count: int
    run: Callable[[], None]
    fill: Callable[[], None]
    count_wrong: Callable[[], int]
    # Puts back what fill() wrote before each timed call of an in-place
    # reduction (None for the others): summed in place call after call, the
    # values would double per call at 2 ranks and leave a 16-bit wire's range
    # within 16 calls (nccl-tests times out of place for the same reason).
    restore: Callable[[], None] | None = None


def make_case(name, nbytes, dtype, op, group, rank, world, device, lossy: float = 0.0) -> Case:
    """Allocate the buffers of ``name`` and return how to fill, run and check it.

    ``lossy``: a sum or average may be off by this fraction of the largest
    expected value (the int8 wire); 0 asks for the exact result.

    ``op`` is the reduction name for allreduce/reduce_scatter and ignored
    otherwise. Ranks are group ranks and equal global ranks (every group
    spans the whole world), so broadcast's ``src=0`` is group rank 0.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    size, count, n_in, n_out = layout(name, nbytes, elem, world)
    reduce_op = op if name in REDUCING else None
    values = _Values(dtype, world, reduce_op)
    inp = torch.empty(n_in, dtype=dtype, device=device)
    out = inp if name in ("allreduce", "broadcast", "reduce") else torch.empty(n_out, dtype=dtype, device=device)
    redop = REDOPS[op] if reduce_op else None

    # Values and references on the tensors' device: at 256 MiB on 4 ranks the
    # CPU (one thread each under torchrun) took tens of seconds a size.
    def ar(n: int) -> torch.Tensor:
        return torch.arange(n, device=device)

    def expected() -> torch.Tensor:
        if name in ("allreduce", "reduce"):
            return _reduce(values, ar(n_out), op, world)
        if name == "broadcast":
            return values(0, ar(n_out))
        if name == "reduce_scatter":
            return _reduce(values, rank * count + ar(count), op, world)
        if name == "allgather":
            return torch.cat([values(r, ar(count)) for r in range(world)])
        if name == "sendrecv":
            return values((rank - 1) % world, ar(count))
        return torch.cat([values(r, rank * count + ar(count)) for r in range(world)])

    in_place_reduction = name in ("allreduce", "reduce")
    pristine = torch.empty_like(inp) if in_place_reduction else None

    def fill() -> None:
        if name == "broadcast" and rank != 0:
            inp.zero_()
        else:
            inp.copy_(values(rank, ar(n_in)).to(dtype))
        if out is not inp:
            out.zero_()
        if pristine is not None:
            pristine.copy_(inp)

    def restore() -> None:
        inp.copy_(pristine)

    def count_wrong() -> int:
        if name == "reduce" and rank != 0:
            return 0  # only the root's buffer is defined
        ref = expected()
        got = out.double()
        if lossy and reduce_op in ("sum", "avg") and ref.numel():
            tol = lossy * float(ref.abs().max())
            return int((~((got - ref).abs() <= tol)).sum())
        if reduce_op == "avg":
            tol = max(4, world) * torch.finfo(dtype).eps * ref.abs()
            return int((~((got - ref).abs() <= tol)).sum())  # NaN counts as wrong
        return int((got != ref).sum())

    calls = {
        "allreduce": lambda: dist.all_reduce(inp, op=redop, group=group),
        "allgather": lambda: dist.all_gather_into_tensor(out, inp, group=group),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, inp, op=redop, group=group),
        "broadcast": lambda: dist.broadcast(inp, src=0, group=group),
        "reduce": lambda: dist.reduce(inp, dst=0, op=redop, group=group),
        "alltoall": lambda: dist.all_to_all_single(out, inp, group=group),
        "sendrecv": lambda: _sendrecv(inp, out, group, rank, world),
    }
    return Case(name, size, count, calls[name], fill, count_wrong,
                restore if in_place_reduction else None)
