"""Sparse all_reduce: smdccl against gloo, side by side, on embedding gradients.

    torchrun --nproc-per-node 2 -m smdccl.bench.sparse [--rows 100000 --dim 64
        --nnz 256,4096,32768 --iters 20 --json out.json]

Each rank all_reduces the gradient of an ``nn.Embedding(rows, dim,
sparse=True)`` that looked up ``nnz`` random rows (some repeated, some shared
with other ranks), as DDP does with a sparse embedding. Per size and backend:
the median time of ``--iters`` calls on each rank, the maximum over ranks, and
a check of every result against a float64 reference (``#wrong``: elements
off by more than float32 rounding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from smdccl._launch import RankZeroParser


def build_parser() -> argparse.ArgumentParser:
    p = RankZeroParser(prog="python -m smdccl.bench.sparse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="embedding rows (default 100000)")
    p.add_argument("--dim", type=int, default=64, help="embedding width (default 64)")
    p.add_argument("--nnz", default="256,4096,32768",
                   help="comma list: rows looked up per rank (default 256,4096,32768)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size (default 20)")
    p.add_argument("--backends", default="smdccl,gloo", help="comma list (default smdccl,gloo)")
    p.add_argument("--timeout", type=float, default=300.0, help="group timeout, s")
    p.add_argument("--json", help="also write the rows here")
    return p


def _gradient(rank: int, nnz: int, rows: int, dim: int, seed: int):
    """What nn.Embedding's sparse backward gives: one entry per lookup, uncoalesced."""
    import torch

    g = torch.Generator().manual_seed(seed * 1009 + rank)
    idx = torch.randint(0, rows, (nnz,), generator=g)
    vals = torch.randn(nnz, dim, generator=g)
    return torch.sparse_coo_tensor(idx.unsqueeze(0), vals, (rows, dim))


def _count_wrong(out, inputs) -> int:
    import torch

    def dense(t, values):  # from the raw entries: sparse abs() would sum duplicates first
        return torch.sparse_coo_tensor(t._indices(), values, t.shape).to_dense()

    ref = sum(dense(t, t._values().to(torch.float64)) for t in inputs)
    mag = sum(dense(t, t._values().to(torch.float64).abs()) for t in inputs)
    bound = 4 * len(inputs) * 2.0 ** -24 * mag + 1e-30
    return int(((out.to_dense().to(torch.float64) - ref).abs() > bound).sum())


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message=".*sparse.*")
    import torch
    import torch.distributed as dist

    from smdccl._launch import command_line
    from smdccl.bench.backends import init_world, open_group

    world = init_world("cpu", args.timeout)
    sizes = [int(x) for x in args.nnz.split(",") if x]
    names = [b for b in args.backends.split(",") if b]
    groups = {}
    for name in names:
        group, err = open_group(name, world, args.timeout)
        if group is None:
            if world.rank == 0:
                print(f"smdccl.bench.sparse: {name!r} is unavailable: {err}", file=sys.stderr)
            return 2
        groups[name] = group

    rows = []
    for seed, nnz in enumerate(sizes):
        inputs = [_gradient(r, nnz, args.rows, args.dim, seed) for r in range(world.size)]
        row = {"nnz_per_rank": nnz, "entry_bytes_per_rank": nnz * (8 + 4 * args.dim)}
        for name, group in groups.items():
            times, wrong = [], 0
            for it in range(args.iters + 3):  # 3 warm-up calls
                t = inputs[world.rank].clone()
                dist.barrier(group=world.ctrl)
                t0 = time.perf_counter()
                dist.all_reduce(t, group=group)
                dt = time.perf_counter() - t0
                if it >= 3:
                    times.append(dt)
            wrong = _count_wrong(t, inputs)
            stats = torch.tensor([statistics.median(times), float(wrong)], dtype=torch.float64)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=world.ctrl)
            row[f"{name}_median_us"] = round(stats[0].item() * 1e6, 1)
            row[f"{name}_wrong"] = int(stats[1].item())
        rows.append(row)

    if world.rank == 0:
        cmd = command_line("smdccl.bench.sparse")
        head = f"{'nnz/rank':>9} {'bytes/rank':>11}" + "".join(f" {n + ' us':>13} {'#wrong':>6}" for n in groups)
        if {"smdccl", "gloo"} <= groups.keys():
            head += f" {'gloo/smdccl':>11}"
        lines = [f"# smdccl.bench.sparse: {world.size} ranks, embedding {args.rows} x {args.dim} float32, "
                 f"median of {args.iters} calls, max over ranks", f"# {cmd}", head]
        for row in rows:
            line = f"{row['nnz_per_rank']:>9} {row['entry_bytes_per_rank']:>11}"
            line += "".join(f" {row[n + '_median_us']:>13.1f} {row[n + '_wrong']:>6}" for n in groups)
            if {"smdccl", "gloo"} <= groups.keys():
                line += f" {row['gloo_median_us'] / row['smdccl_median_us']:>10.1f}x"
            lines.append(line)
        print("\n".join(lines))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world.size, "rows": args.rows, "dim": args.dim,
                           "iters": args.iters, "command": cmd, "results": rows}, f, indent=1)
    bad = any(row[f"{n}_wrong"] for row in rows for n in groups)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
