"""CUDA tensors: every collective on GPU memory, in real multi-process runs.

Several ranks share one GPU (smdccl allows it, NCCL does not), so all of this
runs on a single-GPU machine: the CUDA-IPC allreduce, reduce-scatter and
allgather inside one node, the staged path across emulated nodes (pinned
host staging, the host's two-level algorithms, with and without the fp16
wire) and with SMDCCL_CUDA_IPC=0, NCCL inside the node where each rank has
its own NCCL_HOSTID, and the host-staged collectives, against the float64 /
integer references of tests/reference.py. Stream semantics: work queued on
the caller's stream before the call is seen, Work.wait() orders the caller's
stream after the collective (waiting on the host only until the collective's
GPU work is queued, never for the caller's own queued work), futures are
CUDA-aware.

Without a GPU these tests are skipped (the reason says so); what can run
without one does: the CUDA build itself (test_cuda_code_compiled) and the
rejection of CUDA tensors by a CPU build (tests/test_bad_input.py).
scripts/gpu_check.sh runs this file on a GPU machine.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness import Checker, run_ranks
from reference import (
    DTYPES,
    OP_NAMES,
    assert_equal_bits,
    assert_matches,
    dtype_name,
    is_float,
    make_op,
    op_valid,
    rank_input,
    reduce_reference,
)

HAVE_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 0
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no CUDA device on this machine "
                               "(scripts/gpu_check.sh runs these on a GPU machine)")

# Sizes: empty, tiny, odd, a few hundred KiB, and over the 1 MiB IPC buffer
# the matrix runs with (several IPC pieces, uneven last).
SIZES = [0, 1, 7, 1001, 65_537, 300_007]
BIG = 700_001  # float32: 2.8 MB > SMDCCL_CUDA_IPC_MB=1
# Every collective here takes milliseconds on a GPU: a stuck one fails in
# 30 s (naming the op) instead of holding a GPU machine's limited time.
PG_TIMEOUT = 30.0


def _nvcc() -> str | None:
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                     if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def test_cuda_code_compiled():
    """Where nvcc and a CUDA torch are present (CI too), the CUDA paths are built."""
    import smdccl._C as C

    info = C.build_info()
    if _nvcc() and torch.version.cuda and os.environ.get("SMDCCL_CMAKE_ARGS", "").find("SMDCCL_CUDA=OFF") < 0:
        assert info["cuda"] is True, f"nvcc at {_nvcc()} and torch {torch.__version__} but no CUDA build: {info}"
    else:
        assert info["cuda"] is False


def _device() -> torch.device:
    d = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


def _factor(kind: str) -> float:
    return 2.0 if kind == "int" else 0.3


def cuda_matrix(big: bool) -> dict:
    """Every collective x dtype x op x size edge on CUDA tensors."""
    dev = _device()
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"on rank {rank} of {ws} (cuda)")
    oracle = dist.new_group(backend="gloo")
    sizes = SIZES + ([BIG] if big else [])

    def ref(n, dtype, op, kind, seed=0):
        inputs = [rank_input(r, n, dtype, seed, kind) for r in range(ws)]
        exact = kind == "int" and not (op == "AVG" and ws & (ws - 1))
        if exact and op == "PRODUCT" and dtype.is_floating_point:
            exact = 4**ws * torch.finfo(dtype).eps <= 2
        return reduce_reference(inputs, op, dtype, factor=_factor(kind), exact=exact)

    for dtype in DTYPES.values():
        dn = dtype_name(dtype)
        for kind in (["int", "rand"] if is_float(dtype) else ["int"]):
            for op in OP_NAMES:
                if not op_valid(op, dtype) or (kind == "rand" and op in ("MIN", "MAX", "PRODUCT")):
                    continue
                for n in sizes:
                    if n == BIG and (dtype not in (torch.float32, torch.bfloat16) or op not in ("SUM", "AVG")):
                        continue
                    desc = f"all_reduce {dn} {op} n={n} {kind}"
                    with chk.case(desc):
                        t = rank_input(rank, n, dtype, 0, kind).to(dev)
                        dist.all_reduce(t, op=make_op(op, _factor(kind)))
                        out = t.cpu()
                        chk.digest(desc, out)
                        assert_matches(out, ref(n, dtype, op, kind))
                    if n in (1001, 65_537, BIG):  # BIG: several IPC pieces (rows of 1 MiB / ws)
                        with chk.case(f"reduce_scatter_tensor {dn} {op} n={n} {kind}"):
                            inp = rank_input(rank, n * ws, dtype, 2, kind).to(dev)
                            out = torch.full((n,), 7, dtype=dtype, device=dev)
                            dist.reduce_scatter_tensor(out, inp, op=make_op(op, _factor(kind)))
                            assert_matches(out.cpu(), ref(n * ws, dtype, op, kind, seed=2).slice(rank * n, rank * n + n))
                            assert_equal_bits(inp.cpu(), rank_input(rank, n * ws, dtype, 2, kind), "input kept")
                    if n in (1001, 65_537):
                        desc = f"reduce {dn} {op} n={n} {kind}"
                        with chk.case(desc):
                            root = n % ws
                            t = rank_input(rank, n, dtype, 1, kind).to(dev)
                            dist.reduce(t, dst=root, op=make_op(op, _factor(kind)))
                            if rank == root:
                                assert_matches(t.cpu(), ref(n, dtype, op, kind, seed=1))
                            else:
                                assert_equal_bits(t.cpu(), rank_input(rank, n, dtype, 1, kind), "non-root input kept")
                        desc = f"all_reduce_coalesced {dn} {op} n={n} {kind}"
                        with chk.case(desc):
                            ts = [rank_input(rank, m, dtype, 3 + m, kind).to(dev) for m in (n, 5)]
                            dist.all_reduce_coalesced(ts, op=make_op(op, _factor(kind)))
                            for m, t in zip((n, 5), ts):
                                assert_matches(t.cpu(), ref(m, dtype, op, kind, seed=3 + m), f"tensor of {m}")
                        if dtype == torch.float32 and kind == "int" and op in ("SUM", "MAX"):
                            # Several dtypes: one device allreduce each, in one op (across
                            # nodes their staged steps run one after the other). Through
                            # the group itself: torch's all_reduce_coalesced refuses mixed
                            # dtypes before the backend sees them.
                            with chk.case(f"allreduce_coalesced float32+float64+int32 {op} n={n}"):
                                kinds = ((torch.float32, n), (torch.float64, 7), (torch.int32, 9))
                                ts = [rank_input(rank, m, d, 5, kind).to(dev) for d, m in kinds]
                                opts = dist.AllreduceCoalescedOptions()
                                opts.reduceOp = make_op(op, _factor(kind))
                                dist.distributed_c10d._get_default_group().allreduce_coalesced(
                                    ts, opts).wait()
                                for (d, m), t in zip(kinds, ts):
                                    assert_matches(t.cpu(), ref(m, d, op, kind, seed=5), f"{d} tensor of {m}")

        if dtype in (torch.float32, torch.float16, torch.int8):
            # A view at an odd offset: misaligned against the 16-byte IPC
            # buffers (the reduce writes it on its element-wise path).
            n = 300_007
            with chk.case(f"all_reduce {dn} SUM of x[1:], n={n}"):
                x = torch.zeros(n + 1, dtype=dtype, device=dev)
                x[1:] = rank_input(rank, n, dtype, 6, "int").to(dev)
                dist.all_reduce(x[1:])
                assert_matches(x[1:].cpu(), ref(n, dtype, "SUM", "int", seed=6))
                assert x[0].item() == 0, "the element before the view was written"

        # data movement: bit-exact
        if big:  # several IPC pieces of 1 MiB
            with chk.case(f"all_gather_into_tensor {dn} n={BIG}, in place and not"):
                want = torch.cat([rank_input(r, BIG, dtype, 12) for r in range(ws)])
                out = torch.zeros(BIG * ws, dtype=dtype, device=dev)
                dist.all_gather_into_tensor(out, rank_input(rank, BIG, dtype, 12).to(dev))
                assert_equal_bits(out.cpu(), want)
                out = torch.zeros(BIG * ws, dtype=dtype, device=dev)
                out[rank * BIG:(rank + 1) * BIG] = rank_input(rank, BIG, dtype, 12).to(dev)
                dist.all_gather_into_tensor(out, out[rank * BIG:(rank + 1) * BIG])
                assert_equal_bits(out.cpu(), want, "input is the output's own block")
        for n in (0, 1, 1001, 65_537):
            with chk.case(f"broadcast {dn} n={n}"):
                for root in range(ws):
                    t = (rank_input(root, n, dtype, 10).to(dev) if rank == root
                         else torch.zeros(n, dtype=dtype, device=dev))
                    dist.broadcast(t, src=root)
                    assert_equal_bits(t.cpu(), rank_input(root, n, dtype, 10), f"root {root}")
            with chk.case(f"all_gather {dn} n={n}"):
                outs = [torch.zeros(n, dtype=dtype, device=dev) for _ in range(ws)]
                dist.all_gather(outs, rank_input(rank, n, dtype, 11).to(dev))
                for r in range(ws):
                    assert_equal_bits(outs[r].cpu(), rank_input(r, n, dtype, 11), f"from {r}")
            with chk.case(f"all_gather / reduce_scatter uneven lists {dn} n~{n}"):
                sizes = [n + 3 * r for r in range(ws)]
                outs = [torch.zeros(m, dtype=dtype, device=dev) for m in sizes]
                dist.all_gather(outs, rank_input(rank, sizes[rank], dtype, 15).to(dev))
                for r in range(ws):
                    assert_equal_bits(outs[r].cpu(), rank_input(r, sizes[r], dtype, 15), f"from {r}")
                if dtype != torch.bool:
                    full = sum(sizes)
                    inp = rank_input(rank, full, dtype, 16, "int").to(dev)
                    out = torch.zeros(sizes[rank], dtype=dtype, device=dev)
                    dist.reduce_scatter(out, list(inp.split(sizes)), op=dist.ReduceOp.MAX)
                    start = sum(sizes[:rank])
                    want = torch.stack([rank_input(r, full, dtype, 16, "int") for r in range(ws)]).amax(0)
                    assert_equal_bits(out.cpu(), want[start:start + sizes[rank]], "reduce_scatter")
            with chk.case(f"all_gather_into_tensor {dn} n={n}"):
                out = torch.zeros(n * ws, dtype=dtype, device=dev)
                dist.all_gather_into_tensor(out, rank_input(rank, n, dtype, 12).to(dev))
                assert_equal_bits(out.cpu(), torch.cat([rank_input(r, n, dtype, 12) for r in range(ws)]))
            with chk.case(f"gather/scatter {dn} n={n}"):
                root = ws - 1
                glist = [torch.zeros(n, dtype=dtype, device=dev) for _ in range(ws)] if rank == root else None
                dist.gather(rank_input(rank, n, dtype, 13).to(dev), glist, dst=root)
                if rank == root:
                    for r in range(ws):
                        assert_equal_bits(glist[r].cpu(), rank_input(r, n, dtype, 13), f"gather from {r}")
                out = torch.zeros(n, dtype=dtype, device=dev)
                slist = [rank_input(r, n, dtype, 14).to(dev) for r in range(ws)] if rank == root else None
                dist.scatter(out, slist, src=root)
                assert_equal_bits(out.cpu(), rank_input(rank, n, dtype, 14), "scatter")
            with chk.case(f"all_to_all_single / all_to_all {dn} n={n}"):
                inp = torch.cat([rank_input(rank, n, dtype, 20 + j) for j in range(ws)]).to(dev)
                out = torch.zeros(n * ws, dtype=dtype, device=dev)
                dist.all_to_all_single(out, inp)
                assert_equal_bits(out.cpu(), torch.cat([rank_input(j, n, dtype, 20 + rank) for j in range(ws)]))
                outs = [torch.zeros(n, dtype=dtype, device=dev) for _ in range(ws)]
                dist.all_to_all(outs, [rank_input(rank, n, dtype, 30 + j).to(dev) for j in range(ws)])
                for j in range(ws):
                    assert_equal_bits(outs[j].cpu(), rank_input(j, n, dtype, 30 + rank), f"from {j}")
            with chk.case(f"send/recv {dn} n={n}"):
                right, left = (rank + 1) % ws, (rank - 1) % ws
                got = torch.zeros(n, dtype=dtype, device=dev)
                reqs = [dist.isend(rank_input(rank, n, dtype, 40 + right).to(dev), dst=right),
                        dist.irecv(got, src=left)]
                for r in reqs:
                    r.wait()
                assert_equal_bits(got.cpu(), rank_input(left, n, dtype, 40 + rank))
    with chk.case("barrier"):
        dist.barrier()
    chk.compare_digests(oracle)
    return {"failures": chk.failures, "count": chk.count}


def stream_semantics() -> dict:
    """Ordering with the caller's stream, Work.wait() without a host block,
    CUDA-aware futures, memory kept alive until the collective is done, an
    isend that does not block its caller, a recv ordered after the caller's
    stream."""
    dev = _device()
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"on rank {rank} (cuda streams)")
    n = 1 << 22  # 16 MiB of float32: long enough for a stream to still be busy
    expect = float(sum(r + 1 for r in range(ws)))

    with chk.case("input written by a kernel still queued on the caller's stream"):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.zeros(n, device=dev)
            torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time ahead of the fill
            t.fill_(rank + 1)
            dist.all_reduce(t)  # must see the fill, queued after the sleep
            torch.cuda.current_stream().synchronize()
            assert torch.all(t == expect).item(), f"got {t[:4].tolist()}"

    with chk.case("Work.wait() orders the current stream, without waiting for the work on it"):
        t = torch.full((n,), float(rank + 1), device=dev)
        w = dist.all_reduce(t, async_op=True)
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued behind the call
        t0 = time.perf_counter()
        w.wait()
        host_wait = time.perf_counter() - t0
        u = t * 2  # queued on the current stream: must run after the allreduce
        torch.cuda.synchronize()
        assert torch.all(u == 2 * expect).item(), f"got {u[:4].tolist()}"
        # wait() waits (host) until the collective's GPU work is queued, not
        # for the sleep that the caller's stream holds.
        assert host_wait < 0.5, f"wait() blocked the host {host_wait:.3f} s"
        # The progress thread marks the work done microseconds after the GPU
        # got past it: give it a moment, not a race.
        deadline = time.time() + 5
        while not w.is_completed() and time.time() < deadline:
            time.sleep(0.001)
        assert w.is_completed(), "is_completed() still False 5 s after the stream synchronized"

    with chk.case("isend returns at once and sends what the caller's stream queued before it"):
        if rank == 0:
            t = torch.zeros(n, device=dev)
            torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time ahead of the fill
            t.fill_(42.0)
            t0 = time.perf_counter()
            w = dist.isend(t, dst=1)
            call = time.perf_counter() - t0
            w.wait()
            assert call < 0.25, f"isend blocked the caller {call:.3f} s"
        elif rank == 1:
            got = torch.zeros(n, device=dev)
            dist.irecv(got, src=0).wait()
            assert torch.all(got == 42.0).item(), f"got {got[:4].tolist()}"

    with chk.case("recv lands after what the caller's stream queued before it"):
        if rank == 0:
            dist.send(torch.full((n,), 7.0, device=dev), dst=1)
        elif rank == 1:
            got = torch.zeros(n, device=dev)
            torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time ahead of the fill
            got.fill_(-1.0)  # queued before the recv: the received data must win
            dist.recv(got, src=0)
            torch.cuda.synchronize()
            assert torch.all(got == 7.0).item(), f"got {got[:4].tolist()}"

    with chk.case("get_future(): CUDA-aware value and then()"):
        t = torch.full((n,), float(rank + 1), device=dev)
        fut = dist.all_reduce(t, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        out = doubled.wait()
        assert torch.all(out == 2 * expect).item()
        assert torch.all(fut.wait()[0] == expect).item()

    with chk.case("input dropped by the caller stays alive until the collective ran"):
        outs = []
        for i in range(8):
            t = torch.full((1 << 20,), float(rank + i), device=dev)
            dist.all_reduce(t, async_op=True)
            outs.append(torch.full((1 << 20,), -1.0, device=dev))  # may reuse a freed block
            del t
        torch.cuda.synchronize()
        for o in outs:
            assert torch.all(o == -1.0).item(), "a collective wrote into memory given to another tensor"

    with chk.case("many async allreduces in flight, waited in order"):
        ts = [torch.full((4096 * (i + 1),), float(rank + i), device=dev) for i in range(16)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in works:
            w.wait()
        for i, t in enumerate(ts):
            want = float(sum(r + i for r in range(ws)))
            assert torch.all(t == want).item(), f"tensor {i}: {t[:2].tolist()} != {want}"

    with chk.case("a collective inside CUDA graph capture raises ValueError, the group goes on"):
        graph, t = torch.cuda.CUDAGraph(), torch.ones(16, device=dev)
        try:
            with torch.cuda.graph(graph):
                dist.all_reduce(t)
        except ValueError as e:
            assert "graph" in str(e), str(e)
        else:
            raise AssertionError("all_reduce during graph capture did not raise")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        assert torch.all(t == ws).item(), f"got {t[:4].tolist()}"

    with chk.case("irecv of a message already there returns at once, its copy ordered on the stream"):
        if rank == 0:
            dist.send(torch.full((n,), 5.0, device=dev), dst=1)
        dist.barrier()  # rank 0's send is done: the message waits on rank 1
        if rank == 1:
            got = torch.zeros(n, device=dev)
            torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time ahead of the recv
            t0 = time.perf_counter()
            w = dist.irecv(got, src=0)
            w.wait()  # orders the current stream after the copy; no host wait for the sleep
            host = time.perf_counter() - t0
            torch.cuda.synchronize()
            assert torch.all(got == 5.0).item(), f"got {got[:4].tolist()}"
            assert host < 0.25, f"irecv + wait() blocked the host {host:.3f} s"

    with chk.case("a CUDA graph captured while an async collective runs is intact"):
        # The progress thread queries and launches on the GPU while the user
        # captures (in torch's default global mode): its calls must not
        # invalidate the capture (thread-local capture mode).
        big = torch.full((1 << 24,), float(rank + 1), device=dev)  # 64 MiB: many IPC rounds
        if rank == 1:
            time.sleep(0.3)  # rank 0's op waits for this one mid-flight, during its capture
        w = dist.all_reduce(big, async_op=True)
        graph, x = torch.cuda.CUDAGraph(), torch.ones(1 << 16, device=dev)
        with torch.cuda.graph(graph):
            y = x * 3
            time.sleep(0.5)  # keep capturing while the collective's steps run
        graph.replay()
        w.wait()
        torch.cuda.synchronize()
        assert torch.all(y == 3).item(), f"graph replay gave {y[:4].tolist()}"
        assert torch.all(big == expect).item(), f"all_reduce gave {big[:4].tolist()}"

    with chk.case("tensors of a destroyed group are freed without error"):
        # They are recordStream()ed on the group's internal stream: freeing
        # them makes the allocator record an event there (a destroyed stream
        # would abort the process).
        sub = dist.new_group(backend="smdccl")
        kept = torch.full((1 << 20,), float(rank + 1), device=dev)
        dist.all_reduce(kept, group=sub)
        torch.cuda.synchronize()
        dist.destroy_process_group(sub)
        del sub  # the last reference: the backend, and its CUDA state, go now
        gc.collect()
        del kept
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        again = torch.full((1 << 20,), 1.0, device=dev)  # the freed block, reused
        dist.all_reduce(again)
        torch.cuda.synchronize()
        assert torch.all(again == ws).item(), f"got {again[:4].tolist()}"

    with chk.case("mixed devices in one call raise ValueError"):
        try:
            dist.all_gather_into_tensor(torch.zeros(2 * ws, device=dev), torch.zeros(2))
        except (ValueError, RuntimeError) as e:  # torch's dispatcher may refuse first
            assert "device" in str(e), f"{type(e).__name__}: {e}"
        else:
            raise AssertionError("no ValueError for a CPU input and a CUDA output")
    dist.barrier()
    return {"failures": chk.failures, "count": chk.count}


def _check(results):
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(r["count"] > 0 for r in results)


@needs_gpu
@pytest.mark.parametrize("world_size", [2, 4])
def test_cuda_collectives_one_node_ipc(world_size):
    """One node: allreduce, reduce-scatter and allgather over CUDA IPC (1 MiB
    IPC buffers so big messages take several pieces), the rest host-staged."""
    _check(run_ranks(world_size, cuda_matrix, world_size == 2,
                     env={"SMDCCL_CUDA_IPC_MB": "1"}, timeout=240, pg_timeout=PG_TIMEOUT))


@needs_gpu
@pytest.mark.parametrize("env", [
    {"SMDCCL_TOPOLOGY": "2x2"},
    {"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_CUDA_STAGE_CHUNK_KB": "64"},
    {"SMDCCL_CUDA_IPC": "0"},
], ids=["two-level", "two-level-small-chunks", "staged"])
def test_cuda_collectives_two_level_and_staged(env):
    _check(run_ranks(4, cuda_matrix, False, env={"SMDCCL_CUDA_IPC_MB": "1", **env}, timeout=240,
                     pg_timeout=PG_TIMEOUT))


def compressed_allreduce() -> dict:
    dev = _device()
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"on rank {rank} (cuda fp16 wire)")
    for n in (1, 1001, 300_007, 3_000_001):
        with chk.case(f"fp16 wire n={n}"):
            t = rank_input(rank, n, torch.float32, 5, "rand").to(dev)
            dist.all_reduce(t)
            out = t.cpu()
            ref = sum(rank_input(r, n, torch.float32, 5, "rand").double() for r in range(ws))
            mag = sum(rank_input(r, n, torch.float32, 5, "rand").double().abs() for r in range(ws))
            # every addition in float32, each hop's value rounded to fp16 (2^-11 relative)
            bound = mag * (ws * 2.0**-11) + 1e-30
            err = (out.double() - ref).abs()
            assert torch.all(err <= bound), f"max error {float(err.max())} over bound"
            chk.digest(f"fp16 n={n}", out)
    chk.compare_digests(dist.new_group(backend="gloo"))
    return {"failures": chk.failures, "count": chk.count}


@needs_gpu
def test_cuda_two_level_fp16_wire():
    _check(run_ranks(4, compressed_allreduce, env={"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_COMPRESSION": "fp16",
                                                    "SMDCCL_CUDA_IPC_MB": "1"}, timeout=180,
                     pg_timeout=PG_TIMEOUT))


@needs_gpu
@pytest.mark.parametrize("layout", ["1 node", "2x2"])
def test_cuda_fusion_equals_per_tensor_allreduce(layout):
    # Small async allreduces of CUDA tensors queued back to back are fused
    # (one flat device buffer through the IPC / staged path), with the CPU
    # test's checks: per-tensor results, futures, fusion really happened.
    env = {"SMDCCL_TOPOLOGY": "2x2"} if layout == "2x2" else None
    res = run_ranks(4, "test_fusion:fused_allreduces", "none", "cuda", env=env, timeout=180,
                    pg_timeout=PG_TIMEOUT)
    assert len({r["fused"] for r in res}) == 1, res


def packed_equals_host_tensors() -> dict:
    """The staged inter-node path on a compressed group (the GPU casts to
    the wire, the host reduces in float32, the GPU widens) against the same
    collective on CPU tensors in the same group: with inputs the wire holds
    exactly, the bits are equal (one rank per node, one staging chunk, so
    both run the same host algorithm on the same data); allreduce and
    reduce_scatter_tensor, whose input stays as it was. Every rank checks."""
    dev = _device()
    rank, ws = dist.get_rank(), dist.get_world_size()
    wire = {"fp16": torch.float16, "bf16": torch.bfloat16}[os.environ["SMDCCL_COMPRESSION"]]
    chk = Checker(f"on rank {rank} (packed staged path)")
    for n in (1, 1001, 3_000_001):
        with chk.case(f"allreduce n={n}"):
            x = rank_input(rank, n, torch.float32, 7, "rand").to(wire).float()
            cpu, gpu = x.clone(), x.to(dev)
            dist.all_reduce(cpu)
            dist.all_reduce(gpu)
            assert torch.equal(gpu.cpu(), cpu), "CUDA bits differ from the CPU tensor's"
    for each in (999, 1_500_001):
        with chk.case(f"reduce_scatter_tensor each={each}"):
            x = rank_input(rank, each * ws, torch.float32, 8, "rand").to(wire).float()
            cpu_out, gpu_out = torch.empty(each), torch.empty(each, device=dev)
            gpu_in = x.to(dev)
            dist.reduce_scatter_tensor(cpu_out, x.clone())
            dist.reduce_scatter_tensor(gpu_out, gpu_in)
            assert torch.equal(gpu_in.cpu(), x), "reduce_scatter_tensor changed its input"
            assert torch.equal(gpu_out.cpu(), cpu_out), "CUDA bits differ from the CPU tensor's"
    return {"failures": chk.failures, "count": chk.count}


# 4x1: four one-rank nodes, the layout of the NCCL comparison at 4 ranks
# (every rank a host), whose staged path no other CUDA test runs.
@needs_gpu
@pytest.mark.parametrize("wire,nodes", [("fp16", 2), ("bf16", 2), ("fp16", 4)],
                         ids=["fp16", "bf16", "fp16-4x1"])
def test_cuda_packed_staged_path_has_the_cpu_paths_bits(wire, nodes):
    _check(run_ranks(nodes, packed_equals_host_tensors, timeout=180, pg_timeout=PG_TIMEOUT,
                     env={"SMDCCL_TOPOLOGY": f"{nodes}x1", "SMDCCL_COMPRESSION": wire,
                          "SMDCCL_CUDA_STAGE_CHUNK_KB": "65536"}))


def with_nccl_host_per_rank(ref: str, *args):
    """Runs ``ref`` ("module:function" in tests/) with this rank a host of its
    own to NCCL: NCCL refuses two ranks on one GPU unless each has its own
    NCCL_HOSTID (then it joins them through its socket transport, as hosts),
    so smdccl's NCCL engine can run on one shared GPU. Set before the rank's
    first NCCL call, which is smdccl's engine choice at its first CUDA
    collective."""
    import importlib

    os.environ["NCCL_HOSTID"] = f"smdccl-test-rank{dist.get_rank()}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(*args)


# NCCL forced as the engine inside the node (SMDCCL_INTRA=nccl): a rank that
# cannot use it fails instead of falling back to CUDA IPC, so a pass is NCCL's.
NCCL_INTRA = {"SMDCCL_INTRA": "nccl", "SMDCCL_CUDA_IPC_MB": "1"}


@needs_gpu
@pytest.mark.parametrize("layout", ["1 node", "2x2"])
def test_cuda_nccl_intra_collectives(layout):
    """Every collective on CUDA tensors with NCCL inside the node: one node
    of 4 (NCCL's allreduce, reduce-scatter, allgather), 2 nodes of 2 (NCCL's
    reduce-scatter, the host between nodes, NCCL's allgather), against the
    float64 / integer references."""
    env = {**NCCL_INTRA, **({"SMDCCL_TOPOLOGY": "2x2"} if layout == "2x2" else {})}
    _check(run_ranks(4, with_nccl_host_per_rank, "test_cuda:cuda_matrix", False, env=env,
                     timeout=240, pg_timeout=PG_TIMEOUT))


@needs_gpu
def test_cuda_nccl_intra_two_level_fp16_wire():
    _check(run_ranks(4, with_nccl_host_per_rank, "test_cuda:compressed_allreduce",
                     env={**NCCL_INTRA, "SMDCCL_TOPOLOGY": "2x2", "SMDCCL_COMPRESSION": "fp16"},
                     timeout=180, pg_timeout=PG_TIMEOUT))


def int8_wire_on_cuda() -> dict:
    """compression="int8" on CUDA tensors: the step across nodes runs the
    int8 exchange on the host (float32 staged over PCIe). The allreduce
    within the format's bound (every node's contribution and the sum
    quantized once, each at most half a step of a block of at most the
    largest magnitude), the reduce-scatter within one quantization of the
    other nodes' contributions; visibly quantized; the same allreduce bits
    on every rank. bfloat16 tensors are widened to float32 on the device
    and rounded once: within the same bounds plus a bf16 rounding."""
    dev = _device()
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"on rank {rank} (cuda int8 wire)")
    nodes = [list(range(k, k + 2)) for k in range(0, ws, 2)] if ws == 4 else [[r] for r in range(ws)]
    for n in (1001, 300_007):
        ins = [rank_input(r, n, torch.float32, 6, "rand").double() for r in range(ws)]
        node_sums = [sum(ins[r] for r in node) for node in nodes]
        ref = sum(node_sums)
        bound = (sum(float(x.abs().max()) for x in node_sums) + float(ref.abs().max())) / 254 + 1e-4
        with chk.case(f"int8 all_reduce n={n}"):
            t = ins[rank].float().to(dev)
            dist.all_reduce(t)
            out = t.cpu().double()
            err = (out - ref).abs()
            assert float(err.max()) <= bound, f"max error {float(err.max())} over bound {bound}"
            assert float(err.max()) > 1e-3 * float(ref.abs().max()), "exact: the int8 wire did not run"
            chk.digest(f"int8 n={n}", out)
        with chk.case(f"int8 reduce_scatter_tensor n={n}"):
            blocks = torch.cat([rank_input(rank, n, torch.float32, 7 + q, "rand") for q in range(ws)]).to(dev)
            mine = torch.zeros(n, device=dev)
            dist.reduce_scatter_tensor(mine, blocks)
            want = sum(rank_input(r, n, torch.float32, 7 + rank, "rand").double() for r in range(ws))
            assert float((mine.cpu().double() - want).abs().max()) <= bound
        with chk.case(f"int8 bfloat16 all_reduce and reduce_scatter_tensor n={n}"):
            # Widened to float32 on the device, the int8 wire, rounded to bf16 once.
            halves = [x.to(torch.bfloat16).double() for x in ins]
            exact = sum(halves)
            t = halves[rank].to(torch.bfloat16).to(dev)
            dist.all_reduce(t)
            err = (t.cpu().double() - exact).abs()
            assert bool((err <= bound + 2.0**-8 * exact.abs()).all()), f"bf16 max error {float(err.max())}"
            assert float(err.max()) > 1e-3 * float(exact.abs().max()), "exact: the int8 wire did not run"
            each = n // ws
            mine = torch.zeros(each, dtype=torch.bfloat16, device=dev)
            dist.reduce_scatter_tensor(mine, halves[rank][: each * ws].to(torch.bfloat16).to(dev))
            part = exact[rank * each:(rank + 1) * each]
            assert bool(((mine.cpu().double() - part).abs() <= bound + 2.0**-8 * part.abs()).all())
    chk.compare_digests(dist.new_group(backend="gloo"))
    return {"failures": chk.failures, "count": chk.count}


@needs_gpu
@pytest.mark.parametrize("layout", ["2x2-nccl", "2x1-staged"])
def test_cuda_int8_wire_across_nodes(layout):
    if layout == "2x2-nccl":
        env = {**NCCL_INTRA, "SMDCCL_TOPOLOGY": "2x2", "SMDCCL_COMPRESSION": "int8"}
        _check(run_ranks(4, with_nccl_host_per_rank, "test_cuda:int8_wire_on_cuda", env=env,
                         timeout=180, pg_timeout=PG_TIMEOUT))
    else:
        _check(run_ranks(2, int8_wire_on_cuda, env={"SMDCCL_TOPOLOGY": "2x1", "SMDCCL_COMPRESSION": "int8"},
                         timeout=180, pg_timeout=PG_TIMEOUT))


@needs_gpu
@pytest.mark.parametrize("layout", ["2x2-nccl", "2x2-staged", "2x1-staged"])
def test_cuda_int8_error_feedback(layout):
    """smdccl.ddp.int8_wire_hook with error feedback on CUDA tensors: the
    step across nodes stages float32 and the host quantizes with the
    bucket's residuals at this rank's elements (NCCL's block, the whole
    tensor), so the drift of 400 steps stays within one
    step's bound and under a quarter of the drift without feedback
    (tests/test_compression.py's error_feedback_drift); the same for
    smdccl.fsdp's keyed reduce-scatter (reduce_scatter_feedback_drift)."""
    env = {"SMDCCL_COMPRESSION": "int8"}
    if layout == "2x1-staged":
        _check_drift(run_ranks(2, _cuda_drift, 1, env={**env, "SMDCCL_TOPOLOGY": "2x1"},
                               timeout=240, pg_timeout=PG_TIMEOUT))
        return
    env = {**env, "SMDCCL_TOPOLOGY": "2x2"}
    if layout == "2x2-nccl":
        results = run_ranks(4, with_nccl_host_per_rank, "test_cuda:_cuda_drift", 2,
                            env={**env, **NCCL_INTRA}, timeout=240, pg_timeout=PG_TIMEOUT)
    else:
        results = run_ranks(4, _cuda_drift, 2, env={**env, "SMDCCL_INTRA": "ipc"},
                            timeout=240, pg_timeout=PG_TIMEOUT)
    _check_drift(results)


def _cuda_drift(ranks_per_node: int) -> tuple:
    from test_compression import error_feedback_drift, reduce_scatter_feedback_drift

    reduce_scatter_feedback_drift(400, "cuda")  # asserts its own bound (smdccl.fsdp's keyed calls)
    return error_feedback_drift("int8", "cuda", ranks_per_node)


def _check_drift(results: list) -> None:
    print(f"\n[int8 drift without / with error feedback, by rank] {results}")
    assert all(with_ef <= 2.0 and with_ef < without / 4 for without, with_ef in results), results


@needs_gpu
def test_cuda_nccl_intra_ddp_and_fsdp2():
    """DDP (2 nodes of 2) against gloo, and FSDP2 (one node of 2) against a
    single process, with NCCL inside the node."""
    _check(run_ranks(4, with_nccl_host_per_rank, "test_cuda:ddp_against_gloo", 20,
                     env={**NCCL_INTRA, "SMDCCL_TOPOLOGY": "2x2"}, timeout=180, pg_timeout=PG_TIMEOUT))
    run_ranks(2, with_nccl_host_per_rank, "test_fsdp:fsdp2_vs_reference", "cuda", env=NCCL_INTRA,
              timeout=180, pg_timeout=30.0)


@needs_gpu
@pytest.mark.parametrize("world_size", [2])
def test_cuda_stream_semantics(world_size):
    _check(run_ranks(world_size, stream_semantics, timeout=120, pg_timeout=PG_TIMEOUT))


def blocking_call_behind_queued_work() -> dict:
    """A blocking 4 KiB all_reduce issued behind ~1 s of GPU work on the
    caller's stream: with NCCL inside one node it returns to the host once it
    is queued, as ProcessGroupNCCL's does (so do reduce_scatter_tensor,
    all_gather_into_tensor, broadcast and all_gather's list form, padded
    into one device buffer), and is still right once the stream gets there.
    Where the host drives steps (CUDA IPC at host barriers, staged across
    nodes) the host waits about as long as the collective."""
    dev = _device()
    rank, ws = dist.get_rank(), dist.get_world_size()
    expect = float(sum(r + 1 for r in range(ws)))
    t = torch.full((1024,), float(rank + 1), device=dev)  # 4 KiB
    dist.all_reduce(t)  # sets up the engine (NCCL's communicator or the IPC buffers)
    torch.cuda.synchronize()
    seconds = {}

    def timed(name, call):
        t0 = time.perf_counter()
        call()
        seconds[name] = time.perf_counter() - t0

    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time ahead of the fill
    t.fill_(float(rank + 1))  # queued after the sleep: the allreduce must see it
    timed("all_reduce", lambda: dist.all_reduce(t))
    blocks = torch.arange(ws * 256, dtype=torch.float32, device=dev) * (rank + 1)
    rs = torch.zeros(256, device=dev)
    timed("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(rs, blocks))
    ag = torch.zeros(ws * 256, device=dev)
    timed("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(ag, rs))
    b = torch.full((1024,), float(rank + 7), device=dev)
    timed("broadcast", lambda: dist.broadcast(b, src=0))
    parts = [torch.zeros(1024, device=dev) for _ in range(ws)]
    timed("all_gather (list)", lambda: dist.all_gather(parts, t))
    torch.cuda.synchronize()
    tri = ws * (ws + 1) / 2
    want_rs = torch.arange(rank * 256, (rank + 1) * 256, dtype=torch.float32) * tri
    want_ag = torch.arange(ws * 256, dtype=torch.float32) * tri
    return {"seconds": seconds, "allreduce_ok": bool(torch.all(t == expect).item()),
            "rs_ok": torch.equal(rs.cpu(), want_rs), "ag_ok": torch.equal(ag.cpu(), want_ag),
            "broadcast_and_list_ok": bool(torch.all(b == 7.0).item())
            and all(bool(torch.all(p == expect).item()) for p in parts)}


# (layout, environment, queued without a host wait): NCCL inside one node
# (forced; each rank its own NCCL_HOSTID); CUDA IPC at host barriers; staged
# across nodes.
QUEUED_MODES = {
    "one-node-nccl": ("one-node", NCCL_INTRA, True),
    "one-node-ipc": ("one-node", {"SMDCCL_INTRA": "ipc"}, False),
    "2x1": ("2x1", {}, False),
    "2x2": ("2x2", {}, False),
}


@needs_gpu
@pytest.mark.parametrize("mode", list(QUEUED_MODES))
def test_cuda_blocking_call_behind_queued_work(mode):
    layout, env, on_stream = QUEUED_MODES[mode]
    env = dict(env)
    if layout != "one-node":
        env["SMDCCL_TOPOLOGY"] = layout
    res = run_ranks(4 if layout == "2x2" else 2, with_nccl_host_per_rank,
                    "test_cuda:blocking_call_behind_queued_work", timeout=120,
                    pg_timeout=PG_TIMEOUT, env=env)
    for r, got in enumerate(res):
        assert got["allreduce_ok"] and got["rs_ok"] and got["ag_ok"], f"rank {r}: {got}"
        assert got["broadcast_and_list_ok"], f"rank {r}: {got}"
        if on_stream:
            # NCCL's work is queued whole: the host only queues. A host wait
            # would take the ~1 s of sleep queued ahead.
            for name, sec in got["seconds"].items():
                assert sec < 0.2, f"rank {r}: blocking {name} held the host {sec * 1e3:.1f} ms"
        else:
            # Host barriers and staged steps wait for the stream, which holds
            # ~1 s of sleep.
            assert got["seconds"]["all_reduce"] > 0.3, f"rank {r}: {got}"


def node_mate_never_arrives() -> dict:
    """With NCCL inside the node, rank 1 skips an allreduce that rank 0 has
    queued on its stream: rank 0's call still returns (the work is queued),
    then the group's watch fails the group once the group timeout has
    passed and aborts NCCL, so torch.cuda.synchronize() returns instead of
    hanging; the work reports the error and the next call fails fast."""
    dev = _device()
    rank = dist.get_rank()
    t = torch.ones(1024, device=dev)
    # The default group (a timeout of minutes) brings up CUDA, the kernels
    # and NCCL first; the group under test, with the short timeout, then
    # only makes its own communicator, warm, well within it.
    dist.all_reduce(t)
    group = dist.new_group(backend="smdccl", timeout=timedelta(seconds=NODE_MATE_TIMEOUT))
    dist.all_reduce(t, group=group)  # sets up the group's NCCL communicator
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(3 * NODE_MATE_TIMEOUT)
        return {"rank": 1}
    t0 = time.perf_counter()
    w = dist.all_reduce(t, group=group, async_op=True)
    w.wait()
    queued = time.perf_counter() - t0
    torch.cuda.synchronize()
    drained = time.perf_counter() - t0
    deadline = time.time() + 5
    while not w.is_completed() and time.time() < deadline:
        time.sleep(0.01)
    later = None
    try:
        dist.all_reduce(torch.ones(4, device=dev), group=group)
    except Exception as e:  # noqa: BLE001 - the test reports what it got
        later = f"{type(e).__name__}: {e}"
    return {"rank": 0, "queued": queued, "drained": drained, "completed": w.is_completed(),
            "success": w.is_success(), "error": _work_error(w), "later": later}


def _work_error(w) -> str | None:
    """The failed work's error text: exception(), which torch 2.11's binding
    cannot return to Python (no std::exception_ptr caster), else wait()'s."""
    try:
        e = w.exception()
        return str(e) if e else None
    except TypeError:
        try:
            w.wait()
        except Exception as e:  # noqa: BLE001 - the error is what the test reads
            return str(e)
        return None


NODE_MATE_TIMEOUT = 3.0


@needs_gpu
def test_cuda_nccl_intra_watch_fails_the_group_when_a_node_mate_never_arrives():
    # No fusion: a fused async allreduce first agrees with its peers on the
    # host, which would wait for rank 1 there instead of on the stream.
    res = run_ranks(2, with_nccl_host_per_rank, "test_cuda:node_mate_never_arrives", timeout=120,
                    pg_timeout=PG_TIMEOUT, env={**NCCL_INTRA, "SMDCCL_FUSION_MB": "0"})
    got = res[0]
    assert got["queued"] < 0.5, got
    assert NODE_MATE_TIMEOUT * 0.9 < got["drained"] < NODE_MATE_TIMEOUT + 5, got
    assert got["completed"] and not got["success"], got
    assert got["error"] and "did not finish within the group timeout" in got["error"], got
    assert "allreduce" in got["error"], got
    assert got["later"] and "did not finish within the group timeout" in got["later"], got


FIRST_COLLECTIVE_PEER_SLEEP = 20.0


def node_mate_never_arrives_at_a_first_collective() -> dict:
    """With NCCL inside the node, rank 1 (alive, busy elsewhere) skips the
    first reduce_scatter_tensor and all_gather_into_tensor of a group whose
    communicator has run only an allreduce. NCCL >= 2.22 connects an
    algorithm's channels at its first collective (NCCL_RUNTIME_CONNECT),
    inside the host call, which waits for the node-mates there. Rank 0 must
    still get an error naming the op within about the group timeout, not
    when rank 1 happens to exit (FIRST_COLLECTIVE_PEER_SLEEP later)."""
    dev = _device()
    rank = dist.get_rank()
    t = torch.ones(1024, device=dev)
    dist.all_reduce(t)
    group = dist.new_group(backend="smdccl", timeout=timedelta(seconds=NODE_MATE_TIMEOUT))
    dist.all_reduce(t, group=group)  # the communicator, and an allreduce's channels
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(FIRST_COLLECTIVE_PEER_SLEEP)
        return {"rank": 1}
    t0 = time.perf_counter()
    error = None
    try:
        out = torch.empty(1 << 20, device=dev)
        w = dist.reduce_scatter_tensor(out, torch.ones(2 << 20, device=dev), group=group,
                                       async_op=True)
        w.wait()
        torch.cuda.synchronize()
        error = None if w.is_success() else _work_error(w)
        if error is None:
            gathered = torch.empty(2 << 20, device=dev)
            w = dist.all_gather_into_tensor(gathered, out, group=group, async_op=True)
            w.wait()
            torch.cuda.synchronize()
            error = None if w.is_success() else _work_error(w)
    except Exception as e:  # noqa: BLE001 - the test reads where and when it failed
        error = f"{type(e).__name__}: {e}"
    return {"rank": 0, "seconds": time.perf_counter() - t0, "error": error}


@needs_gpu
def test_cuda_nccl_intra_node_mate_never_arrives_at_a_first_collective():
    res = run_ranks(2, with_nccl_host_per_rank,
                    "test_cuda:node_mate_never_arrives_at_a_first_collective",
                    timeout=FIRST_COLLECTIVE_PEER_SLEEP + 40, pg_timeout=PG_TIMEOUT,
                    env={**NCCL_INTRA, "SMDCCL_FUSION_MB": "0"})
    got = res[0]
    print(f"\n[first collective without its node-mate] {got}")
    assert got["error"], got
    assert got["seconds"] < NODE_MATE_TIMEOUT + 5, got


def tuning_mismatch() -> dict:
    """Ranks whose SMDCCL_CUDA_* differ would take different GPU paths (a rank
    without IPC leaves its node-mates waiting for its buffer): the first GPU
    collective of the group raises on every rank, naming both settings."""
    dev = _device()
    rank = dist.get_rank()
    if rank == 1:
        os.environ["SMDCCL_CUDA_IPC"] = "0"  # read at the group's first CUDA collective
    group = dist.new_group(backend="smdccl")
    return _first_allreduce(torch.ones(1 << 16, device=dev), group)


def _first_allreduce(t: torch.Tensor, group=None) -> dict:
    """The error (None if none) and seconds of one all_reduce of `t`."""
    t0 = time.perf_counter()
    try:
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize()
        error = None
    except Exception as e:  # noqa: BLE001 - the test reports what it got
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "seconds": time.perf_counter() - t0}


@needs_gpu
def test_cuda_settings_must_agree():
    res = run_ranks(2, tuning_mismatch, timeout=90, pg_timeout=PG_TIMEOUT)
    for r, got in enumerate(res):
        assert got["error"] and "CUDA settings differ" in got["error"], f"rank {r}: {got}"
        assert "SMDCCL_CUDA_IPC=0" in got["error"] and "SMDCCL_CUDA_IPC=1" in got["error"], got
        assert got["seconds"] < PG_TIMEOUT / 2, f"rank {r} learnt it only after {got['seconds']:.1f} s"


def ipc_buffer_too_large() -> dict:
    """Every rank asks for a 64 GiB IPC buffer on the one shared GPU: they
    cannot all have one. A rank that gets none first hands torch's cached
    blocks back and retries; then every rank raises, soon, the one that
    failed naming SMDCCL_CUDA_IPC_MB."""
    dev = _device()
    torch.empty(1 << 28, device=dev)  # 1 GiB left cached by torch's allocator
    return _first_allreduce(torch.ones(1 << 16, device=dev))


@needs_gpu
def test_cuda_ipc_buffer_out_of_memory_names_the_setting():
    res = run_ranks(3, ipc_buffer_too_large, env={"SMDCCL_CUDA_IPC_MB": "65536"}, timeout=120,
                    pg_timeout=PG_TIMEOUT)
    errors = [r["error"] or "" for r in res]
    assert all(errors), res
    assert any("SMDCCL_CUDA_IPC_MB=65536" in e and "out of memory" in e and "released" in e
               for e in errors), errors
    assert all(r["seconds"] < PG_TIMEOUT / 2 for r in res), res


def pinned_staging_after_a_burst() -> dict:
    """One 64 MiB allgather staged through pinned host memory (the burst),
    then small allreduces: the group's pinned staging memory, read from the
    backend, after each phase, and whether every result was right."""
    dev = _device()
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
    each = 8 << 20  # float32 elements: 32 MiB per rank
    out = torch.empty(world * each, device=dev)
    dist.all_gather_into_tensor(out, torch.full((each,), float(rank + 1), device=dev))
    ok = bool((out.view(world, each)[:, -1].cpu() == torch.arange(1, world + 1)).all())
    burst = backend.pinned_staging_bytes
    small = torch.ones(1024, device=dev)
    for _ in range(3 * 8):  # three windows of SMDCCL_CUDA_PINNED_SHRINK_OPS=8
        small.fill_(1.0)
        dist.all_reduce(small)
        ok &= float(small[0]) == world
    # The outgrown buffer is freed off the op's thread: give it a moment.
    deadline = time.monotonic() + 10
    while backend.pinned_staging_bytes > (8 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"ok": ok, "burst": burst, "after": backend.pinned_staging_bytes}


@needs_gpu
def test_cuda_pinned_staging_shrinks_after_a_burst():
    res = run_ranks(2, pinned_staging_after_a_burst, timeout=120, pg_timeout=PG_TIMEOUT,
                    env={"SMDCCL_CUDA_IPC": "0", "SMDCCL_CUDA_PINNED_SHRINK_OPS": "8"})
    for r in res:
        assert r["ok"], res
        # The allgather stages in rounds of SMDCCL_CUDA_STAGE_CHUNK_KB pieces
        # (four slots of 4 MiB): a burst well above the 8 MiB it shrinks to.
        assert r["burst"] >= 16 << 20, res
        assert r["after"] <= 8 << 20, res


def ddp_against_gloo(steps: int) -> dict:
    """DDP on CUDA: the same model, data and seed trained over smdccl and over
    gloo (which stages CUDA tensors through the host) end with the same
    parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device()
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    chk = Checker(f"on rank {rank} (cuda ddp)")

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10)).to(dev)

    nets = {"smdccl": DDP(model(), device_ids=[dev.index], bucket_cap_mb=1),
            "gloo": DDP(model(), device_ids=[dev.index], process_group=gloo, bucket_cap_mb=1)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in nets.items()}
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(32, 64, generator=g).to(dev)
        y = torch.randint(0, 10, (32,), generator=g).to(dev)
        for k, m in nets.items():
            opts[k].zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opts[k].step()
    with chk.case(f"parameters after {steps} steps"):
        for (name, a), b in zip(nets["smdccl"].module.named_parameters(), nets["gloo"].module.parameters()):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (
                f"{name}: max |smdccl - gloo| = {float((a - b).abs().max())}")
    with chk.case("replicas identical across ranks"):
        for name, p in nets["smdccl"].module.named_parameters():
            chk.digest(name, p.detach().cpu())
    chk.compare_digests(gloo)
    return {"failures": chk.failures, "count": chk.count}


@needs_gpu
def test_cuda_ddp_matches_gloo():
    _check(run_ranks(2, ddp_against_gloo, 20, timeout=120, pg_timeout=PG_TIMEOUT))
