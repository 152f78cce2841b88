"""A torchrun job for the emulated cluster: every rank checks allreduce SUM/MAX
on float32 and int64 against references computed locally from every rank's
(known) inputs, and that ranks sit on the hosts torchrun says they do. With
``--matrix`` it also runs every reduction op on every dtype (allreduce,
reduce_scatter_tensor) and the data movement of all_gather_into_tensor and
broadcast, against tests/reference.py -- the two-level paths over a real,
shaped network.

    python -m smdccl.cluster --nodes 2 --procs-per-node 2 -- \\
        tests/cluster_jobs/allreduce_check.py --backend smdccl --expect-nodes 2

Prints ``rank R OK ...`` and exits 0, or prints every failure and exits 1.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

SIZES = (0, 1, 1000, 100003)  # empty, scalar, latency path, bandwidth path (odd)


def inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + n)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    # large enough that a wrong carry or a truncation to 32 bits would show
    return torch.randint(-2**40, 2**40, (n,), generator=g, dtype=dtype)


def reference(world: int, n: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([inputs(r, n, dtype).to(wide) for r in range(world)])
    return stack.sum(0) if op == "sum" else stack.amax(0)


def matrix(rank: int, world: int) -> list[str]:
    """Every op x dtype through allreduce and reduce_scatter, plus allgather and
    broadcast, on sizes that do not divide by the world size."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from reference import DTYPES, OP_NAMES, make_op, mismatch, op_valid, rank_input, reduce_reference

    failures = []
    for dname, dtype in DTYPES.items():
        for n in (1, 1001, 300007):
            for op in OP_NAMES:
                if not op_valid(op, dtype):
                    continue
                exact = op not in ("AVG",) or world & (world - 1) == 0
                ins = [rank_input(r, n, dtype, 7, "int") for r in range(world)]
                ref = reduce_reference(ins, op, dtype, exact=exact)
                t = ins[rank].clone()
                dist.all_reduce(t, op=make_op(op))
                if (bad := mismatch(t, ref)):
                    failures.append(f"all_reduce {dname} {op} n={n}: {bad}")
                full = [rank_input(r, n * world, dtype, 8, "int") for r in range(world)]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, full[rank].clone(), op=make_op(op))
                rs_ref = reduce_reference(full, op, dtype, exact=exact).slice(rank * n, (rank + 1) * n)
                if (bad := mismatch(out, rs_ref)):
                    failures.append(f"reduce_scatter_tensor {dname} {op} n={n}: {bad}")
            mine = rank_input(rank, n, dtype, 9, "int")
            gathered = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(gathered, mine)
            if not torch.equal(gathered, torch.cat([rank_input(r, n, dtype, 9, "int") for r in range(world)])):
                failures.append(f"all_gather_into_tensor {dname} n={n}")
            for root in range(world):
                b = mine.clone()
                dist.broadcast(b, root)
                if not torch.equal(b, rank_input(root, n, dtype, 9, "int")):
                    failures.append(f"broadcast {dname} n={n} root={root}")
    return failures


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", required=True)
    p.add_argument("--expect-nodes", type=int, required=True)
    p.add_argument("--matrix", action="store_true", help="every op x dtype, more collectives")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ["GROUP_RANK"])
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    failures: list[str] = []

    for dtype in (torch.float32, torch.int64):
        for op, red in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
            for n in SIZES:
                t = inputs(rank, n, dtype)
                dist.all_reduce(t, op=red)
                want = reference(world, n, dtype, op)
                if dtype.is_floating_point:
                    ok = torch.allclose(t.double(), want, rtol=1e-5, atol=1e-5 * world)
                else:
                    ok = torch.equal(t, want)
                if not ok:
                    bad = (t.to(want.dtype) != want).nonzero()[:3].flatten().tolist()
                    failures.append(f"all_reduce {dtype} {op} n={n}: wrong at {bad}")

    if args.matrix:
        failures += matrix(rank, world)

    host = socket.gethostname()
    if host != f"node{node}":
        failures.append(f"hostname {host!r} but torchrun's node rank is {node}")
    if rank // per_node != node:
        failures.append(f"rank {rank} on node {node}, expected node {rank // per_node}")
    hosts: list[str | None] = [None] * world
    dist.all_gather_object(hosts, host)
    for a in range(world):
        for b in range(world):
            same_node = a // per_node == b // per_node
            if (hosts[a] == hosts[b]) != same_node:
                failures.append(f"ranks {a},{b} on hosts {hosts[a]},{hosts[b]}")

    topology = ""
    if args.backend == "smdccl":
        pg = dist.distributed_c10d._get_default_group()
        topology = pg._get_backend(torch.device("cpu")).topology
        if not topology.startswith(f"{args.expect_nodes} nodes"):
            failures.append(f"smdccl topology {topology!r}, expected {args.expect_nodes} nodes")

    dist.barrier()
    dist.destroy_process_group()
    if failures:
        for f in failures:
            print(f"rank {rank} FAILED: {f}", flush=True)
        return 1
    print(f"rank {rank} OK host={host} backend={args.backend} topology={topology!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
