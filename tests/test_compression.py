"""16-bit wire compression (fp16 / bf16) for float32 allreduce and reduce_scatter.

Why: compression halves the bytes between nodes, and is only worth having if
(1) every addition stays float32, so the error is the per-hop rounding of
partial sums and not 16-bit accumulation, (2) every rank ends with the same
bits, and (3) fp16's small range never turns into a silent inf. Each case runs
on ``SMDCCL_TOPOLOGY=2x2`` (so the inter-node hops exist and are compressed)
in one spawn, against a float64 reference with a stated bound:

    |result - exact| <= (hops + 2) * u * sum(|x_r|)   (u: 2^-11 fp16, 2^-8 bf16)

which is the bound of rounding each partial sum once per hop. smdccl only.
"""

from __future__ import annotations

import pytest

from harness import run_ranks

pytestmark = pytest.mark.smdccl_only

UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8}


def compressed_matrix(wire: str) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="smdccl", pg_options={"compression": wire})
    backend = group._get_backend(torch.device("cpu"))
    assert backend.compression == wire, backend.compression
    oracle = dist.new_group(backend="gloo")
    u, hops = UNIT[wire], world
    worst, cases = 0.0, 0
    for n in (0, 1, 7, 1001, 300_007):  # tiny (uncompressed rd) .. pipelined (256 KB chunks)
        for op in ("SUM", "AVG", "MAX"):
            gen = torch.Generator().manual_seed(n + len(op))
            ins = [torch.randn(n, generator=gen) * 100 for _ in range(world)]
            stack = torch.stack([x.double() for x in ins]) if n else torch.zeros(world, 0, dtype=torch.float64)
            exact = {"SUM": stack.sum(0), "AVG": stack.mean(0), "MAX": stack.amax(0)}[op]
            mag = stack.abs().sum(0) / (world if op == "AVG" else 1)
            t = ins[rank].clone()
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
            err = (t.double() - exact).abs()
            bound = (hops + 2) * u * mag + 1e-30
            assert bool((err <= bound).all()), (
                f"all_reduce {wire} {op} n={n}: max error {err.max().item():.3g} over the bound")
            if n:
                worst = max(worst, (err / bound).max().item())
            # Every rank holds the same bits.
            digest = torch.tensor([float(t.double().sum()), float((t.double() * torch.arange(n)).sum())])
            digests = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(digests, digest.double(), group=oracle)
            assert all(torch.equal(d, digests[0]) for d in digests), f"{wire} {op} n={n}: ranks differ"
            # reduce_scatter: same bound on this rank's block.
            full = [torch.randn(n * world, generator=gen) for _ in range(world)]
            out = torch.empty(n)
            dist.reduce_scatter_tensor(out, full[rank].clone(), group=group)
            fstack = torch.stack([x.double() for x in full])
            rs_exact = fstack.sum(0)[rank * n:(rank + 1) * n]
            rs_bound = (hops + 2) * u * fstack.abs().sum(0)[rank * n:(rank + 1) * n] + 1e-30
            assert bool(((out.double() - rs_exact).abs() <= rs_bound).all()), f"reduce_scatter {wire} n={n}"
            cases += 2
    # Compression really happened: a 2M-element sum is not bitwise the float32 one.
    plain = dist.new_group(backend="smdccl")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2_000_003, generator=gen) + rank
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=group)
    dist.all_reduce(b, group=plain)
    assert not torch.equal(a, b), "compressed and float32 results are identical: nothing was compressed"
    return {"cases": cases, "worst_fraction_of_bound": worst}


# 2x2: two-level, one compressed hop per shard. 1,1,1,1: four nodes of one
# rank, every hop compressed, so the reductions run as recursive halving.
@pytest.mark.parametrize("wire,topology", [("fp16", "2x2"), ("bf16", "2x2"), ("fp16", "1,1,1,1")])
def test_compressed_reductions_within_bound(wire, topology):
    env = {"SMDCCL_TOPOLOGY": topology, "SMDCCL_PIPELINE_CHUNK_KB": "256"}
    results = run_ranks(4, compressed_matrix, wire, env=env, timeout=300)
    print(f"\n[{wire} {topology}] {results[0]}")
    assert results[0]["cases"] > 0 and 0 < results[0]["worst_fraction_of_bound"] <= 1


def halving_exact(compress_intra: bool) -> dict:
    """Compressed reductions of small integers, compared bit for bit.

    Every partial sum of integers in [-8, 8] over at most 8 ranks is exact in
    fp16, so the only way to a wrong bit is a transfer that ran out of order
    (a send before the sums it forwards were complete, a receive into data
    still being sent). Two rounds, sizes from empty to many pipeline
    chunks, SUM / AVG / MAX, allreduce and reduce_scatter.
    """
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="smdccl",
                           pg_options={"compression": "fp16", "compression_intra": compress_intra})

    def data(n, r, salt):
        i = torch.arange(n, dtype=torch.int64)
        return ((i * 7 + r * 3 + salt) % 17 - 8).float()

    with tempfile.TemporaryFile() as capture:  # the engine logs the schedule it picked
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            dist.all_reduce(data(1 << 18, rank, 0), group=group)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        log = capture.read().decode()

    def summed(n, salt):  # every rank's data(n, r, salt), added in float64
        acc = torch.zeros(n, dtype=torch.float64)
        for r in range(world):
            acc += data(n, r, salt)
        return acc

    cases = 0
    for salt in range(2):  # a second round finds what the first left behind
        for n in (0, 1, 7, 1001, 65_537, 300_007):
            stack = torch.stack([data(n, r, salt).double() for r in range(world)])
            for op in ("SUM", "AVG", "MAX"):
                exact = {"SUM": stack.sum(0), "AVG": stack.mean(0), "MAX": stack.amax(0)}[op]
                t = data(n, rank, salt)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
                assert torch.equal(t.double(), exact), (
                    f"all_reduce {op} n={n} round {salt}: {(t.double() != exact).sum().item()} wrong")
                cases += 1
            # reduce_scatter of about n elements in all: a block of n / world each
            blk = -(-n // world)
            full = summed(blk * world, salt)
            out = torch.empty(blk)
            dist.reduce_scatter_tensor(out, data(blk * world, rank, salt), group=group)
            assert torch.equal(out.double(), full[rank * blk:(rank + 1) * blk]), (
                f"reduce_scatter n={blk * world} round {salt}")
            cases += 1
            sizes = [blk + 3 * r for r in range(world)]  # an uneven input list
            start, total = sum(sizes[:rank]), sum(sizes)
            full = summed(total, salt + 5)
            out = torch.empty(sizes[rank])
            dist.reduce_scatter(out, list(data(total, rank, salt + 5).split(sizes)), group=group)
            assert torch.equal(out.double(), full[start:start + sizes[rank]]), (
                f"reduce_scatter(uneven list) n={total} round {salt}")
            cases += 1
    decisions = [line.split(" -> ")[1].split(";")[0].split()[0]
                 for line in log.splitlines() if "(16-bit wire) -> " in line]
    return {"cases": cases, "decisions": decisions, "log": log}


# (topology, ranks, compress inside nodes, every hop compressed: pairwise schedules only)
HALVING_CASES = [
    ("1,1,1,1,1,1,1,1", 8, False, True),  # flat, every hop a node boundary
    ("2,2,2,2", 8, False, False),         # two-level: halving across the 4 nodes
    ("4", 4, True, True),                 # one node, shared memory, compressed inside
]


@pytest.mark.parametrize("topology,world,intra,flat_halving", HALVING_CASES,
                         ids=[c[0] for c in HALVING_CASES])
def test_compressed_halving_schedules_are_exact(topology, world, intra, flat_halving):
    env = {"SMDCCL_TOPOLOGY": topology, "SMDCCL_PIPELINE_CHUNK_KB": "64", "SMDCCL_DEBUG": "INFO"}
    results = run_ranks(world, halving_exact, intra, env=env, timeout=420)
    assert all(r["cases"] == results[0]["cases"] > 0 for r in results)
    for rank, r in enumerate(results):
        assert r["decisions"], r["log"]
        if flat_halving:  # the model leaves the ring's chained roundings out
            assert "ring" not in r["decisions"], f"rank {rank}\n{r['log']}"
        else:  # two-level, whose across-nodes step is halving on a compressed wire
            assert "two_level" in r["decisions"], f"rank {rank}\n{r['log']}"


def fp16_range() -> list:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    group = dist.new_group(backend="smdccl", pg_options={"compression": "fp16"})
    seen = []
    n = 1 << 20  # large enough for the compressed (ring) algorithms
    # AVG is scaled before the wire: 40000 on every rank averages fine.
    t = torch.full((n,), 40000.0)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
    assert bool((t == 40000.0).all()), t[:4]
    seen.append("avg ok")
    # SUM past 65504 raises on every rank, naming the fix.
    for call in ("all_reduce", "reduce_scatter_tensor"):
        try:
            if call == "all_reduce":
                dist.all_reduce(torch.full((n,), 40000.0), group=group)
            else:
                dist.reduce_scatter_tensor(torch.empty(n // 4), torch.full((n,), 40000.0), group=group)
        except ValueError as exc:
            assert "overflowed the fp16 wire" in str(exc) and "bf16" in str(exc), str(exc)
            seen.append(f"{call} raised")
        else:
            raise AssertionError(f"{call}: an fp16 overflow did not raise")
    # An inf that was in the input is a result, not an overflow.
    t = torch.ones(n)
    if rank == 0:
        t[5] = float("inf")
    dist.all_reduce(t, group=group)
    assert t[5].item() == float("inf") and t[6].item() == 4.0
    # The group still works after the errors.
    t = torch.ones(n)
    dist.all_reduce(t, group=group)
    assert bool((t == 4.0).all())
    seen.append("inf input kept")
    return seen


def test_fp16_range_avg_scales_and_sum_overflow_raises():
    results = run_ranks(4, fp16_range, env={"SMDCCL_TOPOLOGY": "2x2"}, timeout=180)
    assert all(r == ["avg ok", "all_reduce raised", "reduce_scatter_tensor raised", "inf input kept"]
               for r in results), results


def bad_compression_option() -> str:
    import torch.distributed as dist

    try:
        dist.new_group(backend="smdccl", pg_options={"compression": "int4"})
    except ValueError as exc:
        assert "none, fp16, bf16, int8" in str(exc), str(exc)
        return "raised"
    raise AssertionError("compression='int4' was accepted")


def test_bad_compression_option_raises():
    assert run_ranks(2, bad_compression_option) == ["raised", "raised"]


def ddp_hooks() -> dict:
    """DDP with smdccl's fp16/bf16 hooks vs plain float32 DDP, and error feedback."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from smdccl.ddp import CompressionState, bf16_compress_hook, fp16_compress_hook

    rank = dist.get_rank()

    def train(hook, steps=20):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
        ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets
        if hook is not None:
            ddp.register_comm_hook(CompressionState(), hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(steps):
            x = torch.randn(16, 32, generator=gen)
            loss = (ddp(x) - x[:, :8]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.cat([p.detach().flatten() for p in model.parameters()]), losses

    ref, ref_losses = train(None)
    out = {}
    for name, hook, tol in (("fp16", fp16_compress_hook, 1e-4), ("bf16", bf16_compress_hook, 1e-3)):
        params, losses = train(hook)
        diff = (params - ref).abs().max().item()
        assert diff <= tol, f"{name} hook: parameters {diff:.3g} away from float32 DDP (tolerance {tol})"
        gap = max(abs(a - b) / b for a, b in zip(losses, ref_losses))
        assert gap <= 50 * tol, f"{name} hook: loss curve {gap:.3g} (relative) away from float32 DDP's"
        out[name] = (diff, gap)

    return out


def _rank_device(device: str, rank: int):
    """"cpu", or this rank's GPU ("cuda"), made current."""
    import torch

    if device != "cuda":
        return torch.device(device)
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def error_feedback_drift(wire: str = "fp16", device: str = "cpu", ranks_per_node: int = 1) -> tuple:
    """Accumulated error of 100 steps of hooked gradients, without and with feedback.

    Two nodes (of ranks_per_node ranks each): every node's sum crosses the
    wire. The gradients nearly cancel between the nodes (+-1000 plus a small
    signal), so fp16 (or int8, whose block scale is then set by the node's
    sum) rounds the signal away from each node's contribution at every step,
    the same way each time: without feedback the error adds up linearly;
    carrying the residuals keeps it bounded (int8: both quantizations', kept
    by the backend). device "cuda": the CUDA paths' step across nodes.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import smdccl.ddp as sddp
    from smdccl.ddp import CompressionState

    hook = getattr(sddp, f"{wire}_wire_hook")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _rank_device(device, rank)

    def x_of(r):
        sign = (-1.0) ** (r // ranks_per_node)
        return (sign * 1000.0 / ranks_per_node + 0.001 * (r + 1) * torch.arange(64.0)).unsqueeze(0)

    exact = torch.stack([x_of(r).double() for r in range(world)]).mean(0)

    def drift(error_feedback, steps=100):
        lin = torch.nn.Linear(64, 1, bias=False).to(dev)
        ddp = DDP(lin, device_ids=[dev.index] if dev.type == "cuda" else None)
        # the hook's groups fail within the harness's time, naming the op
        state = CompressionState(error_feedback=error_feedback, timeout=timedelta(seconds=60))
        ddp.register_comm_hook(state, hook)
        total = torch.zeros_like(exact)
        x = x_of(rank).to(dev)
        for _ in range(steps):
            ddp.zero_grad()
            ddp(x).sum().backward()  # d/dW sum(W x) = x
            total += lin.weight.grad.double().cpu()
        return (total - steps * exact).abs().max().item()

    # int8 rounds each step by far less than its worst case here (the block
    # scale is set by the +-500 values, the error by how the small signal
    # falls between steps of 500/127), so it needs more steps to show the
    # linear growth; with feedback its error stays within one step's worst
    # case, half a step of the other node's block: 500.06 / 127 / 2 < 2.
    steps = 400 if wire == "int8" else 100
    without, with_ef = drift(False, steps), drift(True, steps)
    assert with_ef < without / 4, f"error feedback drift {with_ef:.3g} vs {without:.3g} without"
    if wire == "int8":
        assert with_ef <= 2.0, f"int8 error feedback drift {with_ef:.3g} over one step's bound"
    return without, with_ef


def reduce_scatter_feedback_drift(steps: int = 400, device: str = "cpu") -> tuple:
    """Accumulated error of `steps` reduce-scatters through
    smdccl.fsdp.Int8FeedbackReduceScatter (as FSDP2 calls it), without and
    with feedback: nearly cancelling inputs between the two nodes (+-1000
    plus a small signal), so each step's quantization of the other node's
    contribution rounds the signal the same way. device "cuda": the CUDA
    paths' reduce-scatter across nodes."""
    import torch
    import torch.distributed as dist

    from smdccl.fsdp import Int8FeedbackReduceScatter

    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = world // 2
    dev = _rank_device(device, rank)

    def x_of(r):
        sign = (-1.0) ** (r // per_node)
        return sign * 1000.0 / per_node + 0.001 * (r + 1) * torch.arange(64.0 * world)

    exact = torch.stack([x_of(r).double() for r in range(world)]).sum(0)[rank * 64:(rank + 1) * 64]

    def drift(comm):
        total = torch.zeros(64, dtype=torch.float64)
        for _ in range(steps):
            out, x = torch.empty(64, device=dev), x_of(rank).to(dev)
            if comm is None:
                dist.reduce_scatter_tensor(out, x)
            else:
                comm(output_tensor=out, input_tensor=x, group=dist.group.WORLD, op=dist.ReduceOp.SUM)
            total += out.double().cpu()
        return (total - steps * exact).abs().max().item()

    without, with_ef = drift(None), drift(Int8FeedbackReduceScatter(7))
    # One step's worst case: half a step of the other node's block (its
    # largest magnitude / 254; 5 % for the residuals carried into it).
    others = range(per_node, world) if rank < per_node else range(per_node)
    bound = 1.05 * float(sum(x_of(q).double() for q in others).abs().max()) / 254
    assert with_ef <= bound and with_ef < without / 4, (
        f"drift {with_ef:.3g} with feedback (one step's bound {bound:.3g}), {without:.3g} without")
    return without, with_ef


@pytest.mark.parametrize("topology", ["1,1", "2x2"])
def test_reduce_scatter_error_feedback_bounds_accumulated_drift(topology):
    ranks = 2 if topology == "1,1" else 4
    results = run_ranks(ranks, reduce_scatter_feedback_drift,
                        env={"SMDCCL_TOPOLOGY": topology, "SMDCCL_COMPRESSION": "int8"}, timeout=180)
    print(f"\n[int8 reduce_scatter drift without / with error feedback, {topology}] {results[0]}")


def error_feedback_on_one_node() -> bool:
    """On one node nothing is compressed (compress_intra off): the hooks,
    error feedback included, must give plain float32 DDP's bits. Before,
    the feedback rounded every bucket to fp16 anyway."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from smdccl.ddp import CompressionState, bf16_compress_hook, fp16_compress_hook, int8_wire_hook

    rank = dist.get_rank()

    def train(hook):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        ddp = DDP(model, bucket_cap_mb=0.001)
        if hook is not None:
            state = CompressionState(error_feedback=True)
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(7 + rank)
        for _ in range(10):
            x = torch.randn(8, 16, generator=gen)
            opt.zero_grad()
            (ddp(x) - x[:, :4]).pow(2).mean().backward()
            opt.step()
        if hook is not None:
            assert not state._residuals, "error feedback kept residuals on an uncompressed group"
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    ref = train(None)
    for hook in (fp16_compress_hook, bf16_compress_hook, int8_wire_hook):
        got = train(hook)
        assert torch.equal(got, ref), f"{hook.__name__}: {(got - ref).abs().max().item():.3g} from float32 DDP"
    return True


@pytest.mark.parametrize("debug", ["OFF", "DETAIL"])  # DETAIL: torch wraps the backend
def test_error_feedback_is_off_where_nothing_is_compressed(debug):
    env = {"TORCH_DISTRIBUTED_DEBUG": debug}
    assert run_ranks(2, error_feedback_on_one_node, env=env, timeout=120) == [True, True]


@pytest.mark.parametrize("wire,ranks_per_node", [("fp16", 1), ("int8", 1), ("int8", 2)])
def test_error_feedback_bounds_accumulated_drift(wire, ranks_per_node):
    topology = "1,1" if ranks_per_node == 1 else "2x2"
    results = run_ranks(2 * ranks_per_node, error_feedback_drift, wire, "cpu", ranks_per_node,
                        env={"SMDCCL_TOPOLOGY": topology}, timeout=180)
    print(f"\n[{wire} drift without / with error feedback, {topology}] {results[0]}")


def shared_state_matches_a_state_each(wire: str) -> float:
    """Two DDP models on one CompressionState keep their residuals apart:
    training both gives the bits of a state each. The models have one shape,
    so their buckets' indices and sizes are the same: keyed by the index
    alone, one model's residuals were added to the other's gradients."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import smdccl.ddp as sddp
    from smdccl.ddp import CompressionState

    hook = getattr(sddp, f"{wire}_wire_hook")
    rank = torch.distributed.get_rank()

    def train(shared: bool):
        torch.manual_seed(0)
        models = [torch.nn.Linear(64, 8) for _ in range(2)]
        ddps = [DDP(m) for m in models]
        one = CompressionState(error_feedback=True)
        for d in ddps:
            d.register_comm_hook(one if shared else CompressionState(error_feedback=True), hook)
        gen = torch.Generator().manual_seed(3 + rank)
        grads = []
        for _ in range(4):
            for k, d in enumerate(ddps):  # gradients of very different scales
                d.zero_grad()
                (d(torch.randn(4, 64, generator=gen) * (30.0 if k else 0.01)) ** 2).sum().backward()
                grads.append(torch.cat([p.grad.flatten() for p in d.parameters()]))
        assert (one._residuals or one._int8_keys) if shared else True, "nothing was fed back"
        return torch.stack(grads)

    apart, shared = train(False), train(True)
    diff = (apart - shared).abs().max().item()
    assert torch.equal(apart, shared), f"{wire}: a shared state changed the gradients by {diff:.3g}"
    return diff


@pytest.mark.parametrize("wire", ["fp16", "int8"])
def test_models_sharing_a_compression_state_keep_their_residuals(wire):
    assert run_ranks(2, shared_state_matches_a_state_each, wire, env={"SMDCCL_TOPOLOGY": "1,1"},
                     timeout=180) == [0.0, 0.0]


def test_ddp_hooks_match_float32_ddp():
    results = run_ranks(4, ddp_hooks, env={"SMDCCL_TOPOLOGY": "2x2"}, timeout=300)
    print(f"\n{results[0]}")


# ---------------------------------------------------------------------------
# Rounding only where a hop is compressed.
#
# A compressed group rounds float32 results to the wire's precision so that
# every rank holds the same bits after some of them received them over a
# 16-bit hop. Where no hop of the collective is compressed (one node,
# compress_intra off) nothing may be rounded: the result must be bitwise the
# uncompressed group's. Each case runs the same collective on both groups in
# one spawn, at sizes that reach recursive doubling and the ring (the
# automatic choice runs both), and through the fused and coalesced paths.
# Across nodes the flat ring and two-level recursive doubling run forced too.
# Every schedule forced on every shape runs in-process, in
# tests/cpp/test_wire_rounding.cpp and test_algorithm_matrix.cpp.

ROUNDING_ALGOS = {False: ("auto",), True: ("auto", "ring", "two_level_rd")}  # by several_nodes
ROUNDING_SIZES = (7, 1001, 65_537, 300_007, 1_048_579)  # rd .. ring / pipelined two-level


def _bits(t):
    import torch

    return t.detach().contiguous().view(torch.int32)


def _exact_in_float32(n: int, r: int, salt: int):
    """Values whose float32 sums over up to 4 ranks are exact in any order,
    yet not representable in 16 bits: the result cannot depend on how a
    schedule (or tensor fusion, which varies with timing) orders additions."""
    import torch

    i = torch.arange(n, dtype=torch.int64)
    whole = (i * 37 + r * 11 + salt) % 2001 - 1000
    frac = (i * 13 + r * 5 + salt) % 4096
    return (whole.double() + frac.double() / 4096).float()


def _collective(kind: str, group, x, op: str):
    """Runs collective `kind` of this rank's input `x` on `group`; returns what
    this rank holds afterwards (None: a reduce's non-root)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    rop = getattr(dist.ReduceOp, op)
    if kind == "all_reduce":
        t = x.clone()
        dist.all_reduce(t, op=rop, group=group)
        return t
    if kind == "reduce_scatter_tensor":
        out = torch.empty(x.numel() // world)
        dist.reduce_scatter_tensor(out, x.clone(), op=rop, group=group)
        return out
    if kind == "reduce":
        t = x.clone()
        dist.reduce(t, dst=world - 1, op=rop, group=group)
        return t if rank == world - 1 else None
    if kind == "all_reduce_coalesced":
        parts = [p.clone() for p in x.split([x.numel() // 3, x.numel() - x.numel() // 3])]
        dist.all_reduce_coalesced(parts, op=rop, group=group)
        return torch.cat(parts)
    if kind == "fused":  # back-to-back async allreduces: tensor fusion packs them
        parts = [p.clone() for p in x.split(max(1, x.numel() // 6))]
        works = [dist.all_reduce(p, op=rop, group=group, async_op=True) for p in parts]
        for w in works:
            w.wait()
        return torch.cat(parts)
    raise ValueError(kind)


def wire_rounding_matrix() -> dict:
    import os
    import sys
    import tempfile

    import torch
    import torch.distributed as dist

    from harness import Checker

    rank, world = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"(rank {rank})")
    oracle = dist.new_group(backend="gloo")
    several_nodes = os.environ.get("SMDCCL_TOPOLOGY", "") not in ("", str(world))
    wires = [(wire, intra) for wire in ("fp16", "bf16") for intra in (False, True)]
    rounded_something = {w: False for w in wires}

    cases = []  # (collective, n, op, every rank's input)
    for n in ROUNDING_SIZES:
        gen = torch.Generator().manual_seed(n)
        ins = [torch.randn(n * world, generator=gen) * 100 for _ in range(world)]
        for op in ("SUM", "AVG", "MAX") if n in (1001, 1_048_579) else ("SUM",):
            cases.append(("all_reduce", n, op, [x[:n] for x in ins]))
        cases.append(("reduce_scatter_tensor", n, "SUM", ins))
        if n in (1001, 300_007):
            cases.append(("reduce", n, "SUM", [x[:n] for x in ins]))
            cases.append(("all_reduce_coalesced", n, "SUM", [x[:n] for x in ins]))
    for n in (6 * 1000, 6 * 150_000):  # fused: 6 x 4 KB (rd), 6 x 600 KB (ring)
        for salt, op in ((3, "SUM"), (4, "AVG")):
            cases.append(("fused", n, op, [_exact_in_float32(n, r, salt) for r in range(world)]))

    def run_cases(algo, plain, groups):
        for kind, n, op, ins in cases:
            want = _collective(kind, plain, ins[rank], op)
            stack = torch.stack([x.double() for x in ins])
            exact = {"SUM": stack.sum(0), "AVG": stack.mean(0), "MAX": stack.amax(0)}[op]
            mag = stack.abs().sum(0) / (world if op == "AVG" else 1)
            if kind == "reduce_scatter_tensor":
                exact, mag = exact[rank * n:(rank + 1) * n], mag[rank * n:(rank + 1) * n]
            for (wire, intra), group in groups.items():
                desc = f"{kind} {op} n={n} SMDCCL_ALGO={algo} {wire} compress_intra={intra}"
                got = _collective(kind, group, ins[rank], op)
                if got is None:
                    continue
                if not (intra or several_nodes):  # no hop compressed
                    with chk.case(f"{desc}: bitwise the uncompressed group's"):
                        bad = (_bits(got) != _bits(want)).sum().item()
                        assert bad == 0, (
                            f"{bad} of {got.numel()} elements differ from the uncompressed group's "
                            f"(max {(got - want).abs().max().item():.3g})")
                    continue
                if kind in ("all_reduce", "all_reduce_coalesced", "fused"):
                    chk.digest(desc, got)  # every rank holds the same bits
                with chk.case(f"{desc}: within the rounding bound"):
                    err = (got.double() - exact).abs()
                    bound = (world + 2) * UNIT[wire] * mag + 1e-30
                    assert bool((err <= bound).all()), (
                        f"max error {err.max().item():.3g} ({(err / bound).max().item():.3g}x the bound)")
                if not torch.equal(got, want):
                    rounded_something[(wire, intra)] = True

    decisions = ""  # the engine's algorithm decisions (SMDCCL_DEBUG=INFO) of the automatic pass
    for algo in ROUNDING_ALGOS[several_nodes]:
        os.environ["SMDCCL_ALGO"] = algo  # read when a group is created
        plain = dist.new_group(backend="smdccl")
        groups = {(wire, intra): dist.new_group(
            backend="smdccl", pg_options={"compression": wire, "compression_intra": intra})
            for wire, intra in wires}
        for (wire, intra), group in groups.items():  # the rule the DDP hooks ask for
            with chk.case(f"{wire} compress_intra={intra}: compressed_hops"):
                hops = group._get_backend(torch.device("cpu")).compressed_hops
                assert hops == (intra or several_nodes), hops
        if algo != "auto":
            run_cases(algo, plain, groups)
        else:  # the first pass: SMDCCL_DEBUG=INFO logs each decision once per process
            with tempfile.TemporaryFile() as capture:
                saved = os.dup(2)
                os.dup2(capture.fileno(), 2)
                try:
                    run_cases(algo, plain, groups)
                finally:
                    os.dup2(saved, 2)
                    os.close(saved)
                    capture.seek(0)
                    decisions = capture.read().decode(errors="replace")
                    sys.stderr.write(decisions)
        for group in (plain, *groups.values()):
            dist.destroy_process_group(group)
        chk.compare_digests(oracle)
    del os.environ["SMDCCL_ALGO"]

    with chk.case("the automatic choice ran both a latency and a bandwidth schedule"):
        names = ("rd", "two_level") if several_nodes else ("rd", "ring")  # forced: the others
        for name in names:
            assert f"-> {name};" in decisions, f"no allreduce ran as {name}:\n{decisions[-4000:]}"
    for wire, intra in wires:  # else the checks above prove nothing
        if intra or several_nodes:
            with chk.case(f"{wire} compress_intra={intra}: some result was rounded"):
                assert rounded_something[(wire, intra)], "every result equals the float32 one"
    return chk.finish()


# (ranks, SMDCCL_TOPOLOGY): one node of 2 and of 4 ranks, and 2 nodes of 2.
ROUNDING_LAYOUTS = [(2, "2"), (4, "4"), (4, "2x2")]


@pytest.mark.parametrize("world,topology", ROUNDING_LAYOUTS,
                         ids=[f"{w}ranks-{t}" for w, t in ROUNDING_LAYOUTS])
def test_results_are_rounded_only_where_a_hop_is_compressed(world, topology):
    env = {"SMDCCL_TOPOLOGY": topology, "SMDCCL_PIPELINE_CHUNK_KB": "256", "SMDCCL_DEBUG": "INFO"}
    results = run_ranks(world, wire_rounding_matrix, env=env, timeout=480)
    print(f"\n[{world} ranks, {topology}] {results[0]}")


def ddp_hooks_at_full_buckets() -> dict:
    """DDP with smdccl's hooks at DDP's default bucket size (25 MB) on one
    node: bitwise plain float32 DDP's parameters. A model of 3.2M parameters
    fills buckets large enough for the ring (the earlier one-node hook test
    has 1 KB buckets, which only recursive doubling reduces)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from smdccl.ddp import CompressionState, bf16_compress_hook, fp16_compress_hook

    rank = dist.get_rank()
    bucket_sizes = set()

    def train(hook, error_feedback=False, steps=3):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.Tanh(),
                                    torch.nn.Linear(2048, 1024), torch.nn.Tanh(),
                                    torch.nn.Linear(1024, 16))
        ddp = DDP(model)  # default buckets: 1 MiB first, then 25 MiB
        if hook is not None:
            def counting(state, bucket):
                bucket_sizes.add(bucket.buffer().numel())
                return hook(state, bucket)
            ddp.register_comm_hook(CompressionState(error_feedback=error_feedback), counting)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(11 + rank)
        for _ in range(steps):
            x = torch.randn(8, 512, generator=gen)
            opt.zero_grad()
            (ddp(x) - x[:, :16]).pow(2).mean().backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    ref = train(None)
    out = {"parameters": ref.numel()}
    for hook in (fp16_compress_hook, bf16_compress_hook):
        for feedback in (False, True):
            got = train(hook, feedback)
            bad = (got.view(torch.int32) != ref.view(torch.int32)).sum().item()
            assert bad == 0, (f"{hook.__name__} (error_feedback={feedback}): {bad} of {got.numel()} "
                              f"parameters differ from float32 DDP's, max {(got - ref).abs().max().item():.3g}")
    out["largest_bucket"] = max(bucket_sizes)
    assert out["largest_bucket"] >= 2_000_000, bucket_sizes  # the 25 MB bucket, on the ring
    return out


def test_ddp_hooks_at_default_buckets_are_float32_ddp_on_one_node():
    results = run_ranks(2, ddp_hooks_at_full_buckets, timeout=240)
    print(f"\n{results[0]}")


# ---- the int8 wire -----------------------------------------------------------

def int8_matrix() -> dict:
    """compression="int8" on 2x2: float32 SUM and AVG all_reduce within the
    format's bound (two quantizations per element, each at most half a step
    of a block scale <= max|x| / 127 of what it quantizes), the same bits on
    every rank, visibly quantized; reduce_scatter_tensor within one
    quantization of the other node's contribution; bf16 and fp16 SUM
    (all_reduce, fused or not, and reduce_scatter) within the bound plus
    their own rounding; everything else (MAX) bit-identical to an
    uncompressed group's."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="smdccl", pg_options={"compression": "int8"})
    assert group._get_backend(torch.device("cpu")).compression == "int8"
    plain = dist.new_group(backend="smdccl")
    oracle = dist.new_group(backend="gloo")
    worst, quantized = 0.0, 0
    for n in (1, 7, 1001, 300_007):
        for op in ("SUM", "AVG"):
            gen = torch.Generator().manual_seed(n + len(op))
            ins = [torch.randn(n, generator=gen) * 10 for _ in range(world)]
            stack = torch.stack([x.double() for x in ins])
            nodes = [stack[0] + stack[1], stack[2] + stack[3]]  # SMDCCL_TOPOLOGY=2x2
            scale = 1.0 / world if op == "AVG" else 1.0
            exact = stack.sum(0) * scale
            # Loose form of the bound: the largest value of each node's sum and
            # of the total instead of each block's.
            bound = (sum(float(x.abs().max()) for x in nodes) + float(stack.sum(0).abs().max())) / 254
            bound = bound * scale + 1e-5 * float(exact.abs().max())
            t = ins[rank].clone()
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
            err = float((t.double() - exact).abs().max())
            assert err <= bound, f"int8 all_reduce {op} n={n}: error {err:.3g} > bound {bound:.3g}"
            worst = max(worst, err / bound)
            if n > 1000:
                quantized += int(((t.double() - exact).abs() > 1e-4 * exact.abs() + 1e-6).sum())
            digest = torch.tensor([float(t.double().sum()), float((t.double() * torch.arange(n)).sum())],
                                  dtype=torch.float64)
            digests = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(digests, digest, group=oracle)
            assert all(torch.equal(d, digests[0]) for d in digests), f"int8 {op} n={n}: ranks differ"
    assert quantized > 0, "int8 results equal float32 ones: nothing was quantized"
    # reduce_scatter_tensor (FSDP's gradients): one quantization, of the other node's sum.
    gen = torch.Generator().manual_seed(11)
    full = [torch.randn(world * 25_000, generator=gen) * 10 for _ in range(world)]
    out = torch.empty(25_000)
    dist.reduce_scatter_tensor(out, full[rank].clone(), group=group)
    stack = torch.stack([x.double() for x in full])
    mine = slice(rank * 25_000, (rank + 1) * 25_000)
    other = (stack[2] + stack[3]) if rank < 2 else (stack[0] + stack[1])
    rs_bound = float(other[mine].abs().max()) / 254 + 1e-5 * float(stack.sum(0)[mine].abs().max())
    rs_err = float((out.double() - stack.sum(0)[mine]).abs().max())
    assert rs_err <= rs_bound, f"int8 reduce_scatter_tensor: error {rs_err:.3g} > bound {rs_bound:.3g}"
    assert rs_err > 1e-4, "int8 reduce_scatter_tensor is exact: nothing was quantized"
    # bf16 / fp16 tensors: summed as float32 over the int8 wire, rounded once.
    for dtype, ulp in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        gen = torch.Generator().manual_seed(13)
        ins = [(torch.randn(50_000, generator=gen) * 10).to(dtype) for _ in range(world)]
        stack = torch.stack([x.double() for x in ins])
        exact = stack.sum(0)
        bound = (float((stack[0] + stack[1]).abs().max()) + float((stack[2] + stack[3]).abs().max())
                 + float(exact.abs().max())) / 254 + ulp * exact.abs()
        t = ins[rank].clone()
        dist.all_reduce(t, group=group)
        assert bool(((t.double() - exact).abs() <= bound).all()), f"int8 {dtype} all_reduce over its bound"
        digests = [torch.zeros(50_000, dtype=dtype) for _ in range(world)]
        dist.all_gather(digests, t, group=oracle)
        assert all(torch.equal(d, digests[0]) for d in digests), f"int8 {dtype}: ranks differ"
        full = ins[rank].clone()
        dist.all_reduce(full, group=plain)
        assert not torch.equal(t, full), f"int8 {dtype}: the uncompressed group's bits: nothing quantized"
        # Small ones fused (async, back to back): the same rule.
        parts = [x.clone() for x in ins[rank][:20_000].split(2_000)]
        works = [dist.all_reduce(x, group=group, async_op=True) for x in parts]
        for w in works:
            w.wait()
        fused = torch.cat(parts).double()
        assert bool(((fused - exact[:20_000]).abs() <= bound[:20_000]).all()), f"int8 fused {dtype} over its bound"
        assert not torch.equal(torch.cat(parts), full[:20_000]), f"int8 fused {dtype}: nothing quantized"
        # reduce_scatter_tensor and the list form: the other node's sum
        # quantized once, the float32 sum rounded to dtype once.
        mine = slice(rank * 12_500, (rank + 1) * 12_500)
        other = (stack[2] + stack[3]) if rank < 2 else (stack[0] + stack[1])
        rs_bound = float(other[mine].abs().max()) / 254 + ulp * exact[mine].abs() + 1e-5
        for form in ("tensor", "list"):
            out = torch.empty(12_500, dtype=dtype)
            if form == "tensor":
                dist.reduce_scatter_tensor(out, ins[rank].clone(), group=group)
            else:
                dist.reduce_scatter(out, list(ins[rank].clone().split(12_500)), group=group)
            err = (out.double() - exact[mine]).abs()
            assert bool((err <= rs_bound).all()), f"int8 {dtype} reduce_scatter ({form}) over its bound"
            ref = torch.empty(12_500, dtype=dtype)
            dist.reduce_scatter_tensor(ref, ins[rank].clone(), group=plain)
            assert not torch.equal(out, ref), f"int8 {dtype} reduce_scatter ({form}): nothing quantized"
    # Full precision where int8 does not apply: the uncompressed group's bits.
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(100_000, generator=gen) + rank  # world divides it (reduce_scatter_tensor)
    for what, run in {
        "MAX": lambda g, t: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g),
        "float16 MAX": lambda g, t: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g),
        "MAX reduce_scatter_tensor": lambda g, t: dist.reduce_scatter_tensor(
            t[: t.numel() // world], t.clone(), op=dist.ReduceOp.MAX, group=g),
    }.items():
        src = x.half() if what.startswith("float16") else x
        a, b = src.clone(), src.clone()
        run(group, a)
        run(plain, b)
        assert torch.equal(a, b), f"int8 group: {what} is not full precision"
    return {"worst_fraction_of_bound": worst, "quantized": quantized}


def test_int8_all_reduce_within_bound_and_full_precision_elsewhere():
    results = run_ranks(4, int8_matrix, env={"SMDCCL_TOPOLOGY": "2x2"}, timeout=240)
    assert all(r["worst_fraction_of_bound"] <= 1.0 for r in results), results
    print(f"\n[int8 2x2] worst error {max(r['worst_fraction_of_bound'] for r in results):.3f} of the bound")


def test_fp16_error_feedback_survives_an_overflowed_step():
    """A loss scaler's overflowed step (inf or NaN gradients, which it skips)
    leaves no residual: the next clean step is finite, not poisoned for good.
    A finite value past fp16's range is left unrounded, for the backend's
    overflow check to raise on, as without feedback."""
    import torch

    from smdccl.ddp import CompressionState

    state = CompressionState(error_feedback=True)
    overflowed = torch.tensor([1.0, float("inf"), float("nan"), 7e4, 0.1])
    state.apply_error_feedback(0, overflowed, torch.float16)
    assert torch.isinf(overflowed[1]) and torch.isnan(overflowed[2]) and overflowed[3] == 7e4
    clean = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.1])
    state.apply_error_feedback(0, clean, torch.float16)
    assert torch.isfinite(clean).all(), clean
    assert torch.equal(clean[:4], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    # the one residual left, 0.1's rounding, was carried into the clean step
    torch.testing.assert_close(clean[4], torch.tensor(0.1 + (0.1 - torch.tensor(0.1).half().float().item()))
                               .half().float())



def _grad_bucket_type():
    """What the hooks read of dist.GradBucket: index, parameters, buffer."""
    import torch

    class Bucket:
        def __init__(self, index, params):
            self._index, self._params = index, params
            self._buffer = torch.cat([p.flatten() for p in params]) + 0.1

        def index(self):
            return self._index

        def parameters(self):
            return self._params

        def buffer(self):
            return self._buffer

    return Bucket


def test_rebuilt_buckets_end_the_residuals_of_the_buckets_they_replace():
    """DDP rebuilds its buckets after the first step: the residuals of the
    old layout go (the fp16 state holds one set per model, not one per
    layout), while a second model on the same state keeps its own."""
    import torch

    from smdccl.ddp import CompressionState

    Bucket = _grad_bucket_type()
    state = CompressionState(error_feedback=True)

    def step(buckets):
        for b in buckets:
            state.apply_error_feedback(state.bucket_key(b), b.buffer(), torch.float16)

    ps = [torch.zeros(4) for _ in range(4)]
    step([Bucket(0, ps[:2]), Bucket(1, ps[2:])])
    other = [Bucket(0, [torch.zeros(4), torch.zeros(4)])]  # another model, same index and size
    step(other)
    assert len(state._residuals) == 3
    rebuilt = [Bucket(0, [ps[3], ps[0]]), Bucket(1, [ps[1], ps[2]])]  # in gradient-ready order
    step(rebuilt)
    assert set(state._residuals) == {state.bucket_key(b) for b in rebuilt + other}
    # Same index, first parameter and size as a replaced bucket, other parameters:
    # a new bucket, which must not take the old one's residual (and ends both old ones).
    again = [Bucket(0, [ps[3], ps[1]]), Bucket(1, [ps[0], ps[2]])]
    step(again)
    assert set(state._residuals) == {state.bucket_key(b) for b in again + other}


def int8_residuals_of_a_rebuilt_layout() -> list:
    """The int8 hook's residuals live in the backend: after DDP rebuilds its
    buckets, the old layout's are freed there too (a model's worth of
    float32 each, kept for good before)."""
    import torch

    from smdccl.ddp import CompressionState, int8_wire_hook

    Bucket = _grad_bucket_type()
    state = CompressionState(error_feedback=True)
    backend = state.backend_for("int8")

    def step(buckets):
        for b in buckets:
            int8_wire_hook(state, b).wait()
        return backend._int8_feedback_keys

    ps = [torch.randn(64) for _ in range(4)]
    held = [step([Bucket(0, ps[:2]), Bucket(1, ps[2:])])]
    other = [Bucket(0, [torch.randn(64), torch.randn(64)])]  # another model, same index and size
    held.append(step(other))
    rebuilt = [Bucket(0, [ps[3], ps[0]]), Bucket(1, [ps[1], ps[2]])]  # in gradient-ready order
    held.append(step(rebuilt))
    held.append(step(rebuilt + other))  # steady: nothing new, nothing dropped
    again = [Bucket(0, [ps[3], ps[1]]), Bucket(1, [ps[0], ps[2]])]  # the same first parameters
    held.append(step(again))
    assert set(state._int8_keys) == {state.bucket_key(b) for b in again + other}
    # A dropped key is retired: a call still carrying it keeps nothing under it.
    key = state._int8_keys.pop(state.bucket_key(other[0]))
    backend._int8_feedback_drop(key)
    backend._int8_feedback_next(key)
    torch.distributed.all_reduce(torch.ones(64), group=state.group_for("int8"))
    held.append(backend._int8_feedback_keys)
    return held


def test_rebuilt_buckets_end_the_int8_residuals_in_the_backend():
    assert run_ranks(2, int8_residuals_of_a_rebuilt_layout, env={"SMDCCL_TOPOLOGY": "1,1"},
                     timeout=120) == [[2, 3, 3, 3, 3, 2]] * 2


def hook_group_times_out() -> dict:
    """The hook's group waits CompressionState's timeout for a rank that
    never comes (rank 1 skips the allreduce), not torch's 30 minutes."""
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from smdccl.ddp import CompressionState

    group = CompressionState(timeout=timedelta(seconds=2)).group_for("fp16")
    t = torch.ones(4)
    dist.all_reduce(t, group=group)  # connected: the next wait is the timeout's alone
    if dist.get_rank() == 1:
        time.sleep(8)
        return {"rank": 1}
    t0 = time.monotonic()
    try:
        dist.all_reduce(t, group=group)
        error = None
    except Exception as exc:  # noqa: BLE001 - the test reads it
        error = f"{type(exc).__name__}: {exc}"
    return {"rank": 0, "seconds": time.monotonic() - t0, "error": error}


def test_compression_state_timeout_reaches_the_hooks_group():
    got = run_ranks(2, hook_group_times_out, timeout=120)[0]
    assert got["error"] and "allreduce" in got["error"], got
    assert got["seconds"] < 7, got  # its 2 s, not the default group's or torch's 30 min
