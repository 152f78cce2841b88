"""Tensor fusion: small async allreduces queued back to back run as one collective.

Why: many small allreduces each pay the full latency; packing those queued
behind each other into one buffer pays it once. Ranks' queues differ in
timing, so they first agree (one tiny round) on how many to fuse: results
must equal per-tensor allreduce exactly, on every rank, and fusion must
really happen (the backend counts fused allreduces). A large allreduce goes
first so the small ones are surely queued behind it. smdccl only.
"""

from __future__ import annotations

import pytest

from harness import run_ranks

pytestmark = pytest.mark.smdccl_only


def fused_allreduces(compression: str, device: str = "cpu") -> dict:
    """Also run on CUDA tensors by tests/test_cuda.py (device "cuda")."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cpu") if device == "cpu" else \
        torch.device("cuda", rank % torch.cuda.device_count())
    group = dist.new_group(backend="smdccl", pg_options={"compression": compression})
    backend = group._get_backend(dev)
    before = backend.fused_allreduces
    sizes = [0, 1, 7, 100, 1001, 5000, 20000] * 8
    dtypes = [torch.float32, torch.int64]  # a dtype change ends a fusion run
    head = torch.ones(4 << 20, device=dev)  # > 1 MiB: never fused, keeps the queue filling
    works = [dist.all_reduce(head, group=group, async_op=True)]
    tensors = []
    for i, n in enumerate(sizes):
        dtype = dtypes[(i // 10) % 2]
        # small integers: exact in every dtype and on a bf16 wire (sums <= 256)
        tensors.append((torch.arange(n, dtype=dtype) % 4 * (rank + 1) + i % 4).to(dev))
        op = dist.ReduceOp.MAX if i % 7 == 3 else dist.ReduceOp.SUM  # an op change ends one too
        works.append(dist.all_reduce(tensors[-1], op=op, group=group, async_op=True))
    futures = [w.get_future() for w in works[1:5]]
    for w in works:
        assert w.wait()
    for i, (n, t) in enumerate(zip(sizes, tensors)):
        base = torch.arange(n, dtype=torch.float64) % 4
        if i % 7 == 3:
            want = base * world + i % 4
        else:
            want = base * sum(r + 1 for r in range(world)) + i % 4 * world
        assert torch.equal(t.cpu().double(), want), f"tensor {i} (n={n}, {t.dtype}) differs from per-tensor allreduce"
    for f, t in zip(futures, tensors):
        assert f.value()[0] is not None and torch.equal(f.value()[0], t)
    assert torch.equal(head, torch.full_like(head, world))
    fused = backend.fused_allreduces - before
    assert fused > 0, "no allreduce was fused"
    # Fusion never crosses dtypes or ops: at most the runs between changes.
    assert backend.fused_collectives <= len(sizes), backend.fused_collectives
    return {"fused": fused, "collectives": backend.fused_collectives}


@pytest.mark.parametrize("compression", ["none", "bf16"])
def test_fusion_equals_per_tensor_allreduce(compression):
    results = run_ranks(4, fused_allreduces, compression, env={"SMDCCL_TOPOLOGY": "2x2"}, timeout=180)
    print(f"\n[{compression}] {results}")
    # Every rank fused the same allreduces.
    assert len({r["fused"] for r in results}) == 1, results


def fusion_off() -> int:
    import torch
    import torch.distributed as dist

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    works = [dist.all_reduce(torch.ones(100), async_op=True) for _ in range(20)]
    for w in works:
        w.wait()
    return backend.fused_allreduces


def test_fusion_off_with_zero():
    assert run_ranks(2, fusion_off, env={"SMDCCL_FUSION_MB": "0"}) == [0, 0]


def async_on_some_ranks() -> list:
    """The same allreduces, async on even ranks and blocking on odd ones
    (async_op is each rank's own choice): before the fusion decision ignored
    it, an async rank opened the fusion round while a blocking rank sent its
    data, and both failed with "the ranks disagree on the sizes"."""
    import torch
    import torch.distributed as dist

    rank, ws = dist.get_rank(), dist.get_world_size()
    out = []
    for n in (1, 1000, 70_000, 300_000):
        ts = [torch.full((n,), float(rank + i)) for i in range(4)]
        if rank % 2 == 0:
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
        else:
            for t in ts:
                dist.all_reduce(t)
        want = [float(sum(r + i for r in range(ws))) for i in range(4)]
        out.append(all(bool((t == w).all()) for t, w in zip(ts, want)))
    return out


def test_async_on_some_ranks_and_blocking_on_others():
    assert run_ranks(4, async_on_some_ranks, timeout=120) == [[True] * 4] * 4


def swapped_sizes() -> dict:
    """Rank 1 swaps the sizes of its last two allreduces (3, 5 against 5, 3):
    the fused totals match, so a count alone would fuse them and each tensor
    would get parts of the other's sum. A large one first keeps the rest
    queued behind it, so fusion surely sees them."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    sizes = [64] * 6 + ([3, 5] if rank == 0 else [5, 3])
    works = [dist.all_reduce(torch.ones(4 << 20), async_op=True)]
    works += [dist.all_reduce(torch.full((n,), float(i)), async_op=True) for i, n in enumerate(sizes)]
    errors = []
    for w in works:
        try:
            w.wait()
        except Exception as exc:  # noqa: BLE001 - the error is the result
            errors.append(str(exc))
    return {"errors": errors}


def test_fusion_never_hides_a_size_mismatch():
    results = run_ranks(2, swapped_sizes, pg_timeout=30, timeout=120)
    for rank, r in enumerate(results):
        assert r["errors"], f"rank {rank}: no error for allreduces of 3 and 5 elements against 5 and 3"
        first = r["errors"][0]
        assert "mismatch" in first.lower() and "3 elements" in first and "5 elements" in first, first
