"""Messages over 2 GiB: 32-bit element/byte counts and offsets must not overflow.

Why: a 2**31 + 1000 element uint8 all_reduce crosses the signed 32-bit byte
and element limits, where an ``int`` size, offset or chunk count in a
transport or kernel silently truncates, wraps or crashes.  The last 1000
elements live beyond 2**31, so a wrapped offset is caught.

Inputs are generated in 16 MiB chunks from a pattern that differs per rank and
per chunk (no global period at a power-of-two offset), values < 128 so the
2-rank SUM never wraps; the result is verified *completely*, chunk by chunk,
plus explicit spot checks around the 2**31 boundary and a strided-sample sum.
An all_gather_into_tensor with a > 2 GiB output checks the gather path.

Memory: 2 ranks x (2 GiB + buffers), each test in its own spawn; the sum of
the ranks' peak RSS is asserted below 10 GiB so the tests stay CI-safe.  Marked ``large`` (runs by default).
"""

from __future__ import annotations

import resource
import time

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, backend_supports, run_ranks, unsupported_reason

N = 2**31 + 1000
CHUNK = 2**24
MEM_LIMIT = 10 * 2**30


def _base(rank: int, length: int = CHUNK) -> torch.Tensor:
    """Per-rank in-chunk pattern, values in [0, 61)."""
    j = torch.arange(length, dtype=torch.int32)
    return ((j * (rank + 3) + (j >> 12) * 5 + 7 * rank) % 61).to(torch.uint8)


def _shift(rank: int, c: int) -> int:
    """Per-rank, per-chunk offset in [0, 64): chunks are distinguishable."""
    return c % 64 if rank == 0 else (c // 2 + 5 * rank) % 64


def _fill(t: torch.Tensor, rank: int) -> None:
    base = _base(rank)
    for c, start in enumerate(range(0, t.numel(), CHUNK)):
        part = t[start:start + CHUNK]
        torch.add(base[: part.numel()], _shift(rank, c), out=part)


def _expected_chunk(bases, c: int, length: int, ranks) -> torch.Tensor:
    out = torch.zeros(length, dtype=torch.uint8)
    for r in ranks:
        out += bases[r][:length] + _shift(r, c)
    return out


def _value_at(i: int, ranks) -> int:
    c, j = divmod(i, CHUNK)
    return sum(int((j * (r + 3) + (j >> 12) * 5 + 7 * r) % 61) + _shift(r, c) for r in ranks)


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def large_all_reduce() -> dict:
    rank, ws = dist.get_rank(), dist.get_world_size()
    ranks = range(ws)
    failures = []
    t = torch.empty(N, dtype=torch.uint8)
    _fill(t, rank)
    dist.barrier()
    t0 = time.monotonic()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    elapsed = time.monotonic() - t0

    for i in (0, 1, CHUNK - 1, CHUNK, 2**31 - 1, 2**31, 2**31 + 1, N - 1):
        if int(t[i]) != _value_at(i, ranks):
            failures.append(f"element {i}: got {int(t[i])}, expected {_value_at(i, ranks)}")
    sample = t[::104729]  # strided sample across the whole tensor (prime stride)
    exp_sum = sum(_value_at(i, ranks) for i in range(0, N, 104729))
    if int(sample.sum(dtype=torch.int64)) != exp_sum:
        failures.append(f"strided sample sums to {int(sample.sum(dtype=torch.int64))}, expected {exp_sum}")
    bases = [_base(r) for r in ranks]
    bad_chunks = []
    for c, start in enumerate(range(0, N, CHUNK)):
        part = t[start:start + CHUNK]
        exp = _expected_chunk(bases, c, part.numel(), ranks)
        if not torch.equal(part, exp):
            idx = (part != exp).nonzero().flatten()
            bad_chunks.append(f"chunk {c} (elements {start}..{start + part.numel() - 1}): {idx.numel()} wrong, "
                              f"first at {start + int(idx[0])}: got {int(part[idx[0]])} expected {int(exp[idx[0]])}")
    if bad_chunks:
        failures.append(f"{len(bad_chunks)} chunks wrong: " + "; ".join(bad_chunks[:5]))
    if failures:
        raise AssertionError(f"rank {rank}: all_reduce SUM of {N} uint8:\n" + "\n".join(failures))
    return {"seconds": round(elapsed, 2), "maxrss": _maxrss_bytes()}


def large_all_gather() -> dict:
    rank, ws = dist.get_rank(), dist.get_world_size()
    per = N // ws + 1  # output: ws * per > 2**31 bytes
    inp = torch.empty(per, dtype=torch.uint8)
    _fill(inp, rank)
    out = torch.empty(per * ws, dtype=torch.uint8)
    dist.barrier()
    t0 = time.monotonic()
    dist.all_gather_into_tensor(out, inp)
    elapsed = time.monotonic() - t0
    del inp
    failures = []
    for r in range(ws):
        seg = out[r * per:(r + 1) * per]
        base = _base(r)
        for c, start in enumerate(range(0, per, CHUNK)):
            part = seg[start:start + CHUNK]
            if not torch.equal(part, base[: part.numel()] + _shift(r, c)):
                failures.append(f"segment of rank {r}, chunk {c} (output offset {r * per + start}) differs")
                break
    if failures:
        raise AssertionError(f"rank {rank}: all_gather_into_tensor to {per * ws} bytes:\n" + "\n".join(failures))
    return {"seconds": round(elapsed, 2), "maxrss": _maxrss_bytes()}


def _run(fn):
    results = run_ranks(2, fn, timeout=420, pg_timeout=300)
    rss = [r["maxrss"] for r in results]
    print(f"\n[{BACKEND}] {fn.__name__}: {results[0]['seconds']} s, peak RSS per rank "
          f"{[round(x / 2**30, 2) for x in rss]} GiB")
    assert sum(rss) < MEM_LIMIT, f"ranks peaked at {sum(rss) / 2**30:.2f} GiB in total (limit 10 GiB)"


@pytest.mark.large
def test_all_reduce_over_2gib():
    _run(large_all_reduce)


@pytest.mark.large
def test_all_gather_into_tensor_over_2gib():
    if not backend_supports("large_all_gather_memory"):
        pytest.skip(unsupported_reason("large_all_gather_memory"))
    _run(large_all_gather)
