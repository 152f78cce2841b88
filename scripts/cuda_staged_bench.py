"""The staged CUDA allreduce (or reduce_scatter_tensor) across nodes: the 16-bit wire packed on the GPU against float32 staging, beside gloo.

On one GPU shared by ranks as nodes (SMDCCL_TOPOLOGY=2x1, or 2x2: the
inter-node step of the two-level allreduce): a float32 allreduce on an
smdccl group with compression fp16 (the GPU casts each chunk to fp16 on
its way to pinned memory, the host reduces in float32, the GPU widens the
result: half the bytes over PCIe and over the network) beside the same on a
group without compression (float32 copies), and gloo. Reported per call:
time, PCIe bytes per rank (halved with the wire), the progress thread's
CPU time. All three run in this one process group, in turn at each size:
one smdccl group per compression (pg_options), and gloo.

Timing: per call, async_op=True then wait() and torch.cuda.synchronize()
(so the progress thread runs it and the time includes the GPU's copies);
median over calls on each rank, max over ranks. PCIe bytes and progress CPU
come from the groups' own counters (device_copied_bytes,
progress_cpu_seconds), CUDA calls from the process's (smdccl._C.cuda_calls:
each checked CUDA call, kernel launch, status query and NCCL call smdccl
makes), per call, max over ranks.

    SMDCCL_TOPOLOGY=2x2 \\
      python -m torch.distributed.run --nproc-per-node 4 scripts/cuda_staged_bench.py \\
      --sizes 4M,64M --iters 10 --json out.json

``--collective reduce_scatter`` times reduce_scatter_tensor instead (the size
is the whole input, every rank's block together). ``--collective burst``
times "100 async 4 KB allreduces against one": one async_op=True all_reduce
of each size, then --burst of them issued back to back before the first
wait (DDP's many small buckets), each path in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def smdccl_group(compression: str):
    group = dist.new_group(backend="smdccl", pg_options={"compression": compression})
    warm = torch.ones(1024, device="cuda")
    dist.all_reduce(warm, group=group)  # the group reads SMDCCL_CUDA_* here
    torch.cuda.synchronize()
    return group


def counters(group) -> tuple[float, int, int]:
    """(progress thread CPU seconds, bytes copied GPU<->host, CUDA calls made)."""
    from smdccl import _C

    backend = group._get_backend(torch.device("cuda"))
    copied = backend.device_copied_bytes
    return backend.progress_cpu_seconds, copied["to_host"] + copied["from_host"], _C.cuda_calls()


def collective_call(collective: str, x: torch.Tensor):
    """run(group, async_op): the timed collective on x (its output made once, here)."""
    if collective == "allreduce":
        return lambda group, async_op: dist.all_reduce(x, group=group, async_op=async_op)
    out = torch.empty(x.numel() // dist.get_world_size(), device=x.device)
    return lambda group, async_op: dist.reduce_scatter_tensor(out, x, group=group, async_op=async_op)


def timed_calls(group, x: torch.Tensor, value: float, iters: int, smdccl: bool, run) -> dict:
    times = []
    cpu0, bytes0, calls0 = counters(group) if smdccl else (0.0, 0, 0)
    for _ in range(iters):
        x.fill_(value)  # sums stay small: a growing tensor would overflow the fp16 wire
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(group, True).wait()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    cpu1, bytes1, calls1 = counters(group) if smdccl else (0.0, 0, 0)
    return {"s": statistics.median(times), "cpu_s": (cpu1 - cpu0) / iters,
            "pcie_bytes": (bytes1 - bytes0) / iters, "cuda_calls": (calls1 - calls0) / iters}


def burst_calls(group, n: int, count: int, iters: int) -> tuple[float, float]:
    """Median seconds of one async all_reduce of n floats, and of `count` issued
    back to back (each its own tensor) before waiting for any; both to the end
    of the GPU work (cuda.synchronize)."""
    xs = [torch.ones(n, device="cuda") for _ in range(count)]
    one, many = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(xs[0], group=group, async_op=True).wait()
        torch.cuda.synchronize()
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        works = [dist.all_reduce(x, group=group, async_op=True) for x in xs]
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        many.append(time.perf_counter() - t0)
        for x in xs:
            x.fill_(1.0)
    return statistics.median(one), statistics.median(many)


def burst_main(args, paths: dict, ctrl, rank: int) -> None:
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        for name, group in paths.items():
            burst_calls(group, size // 4, args.burst, 1)  # warm-up
            one, many = max_over_ranks(list(burst_calls(group, size // 4, args.burst, args.iters)), ctrl)
            rows.append({"path": name, "bytes": size, "one_us": one * 1e6, "burst_us": many * 1e6,
                         "ratio": many / one})
    if rank == 0:
        print(f"# cuda_staged_bench: burst of {args.burst} async all_reduce, {dist.get_world_size()} ranks, "
              f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
              f"{ {k: v for k, v in os.environ.items() if k.startswith('SMDCCL_')} }")
        print("# one: one call (async_op + wait + cuda.synchronize); burst: all issued, then waited; "
              "medians, max over ranks; target burst <= 3x one")
        print(f"{'path':>14} {'bytes':>10} {'one(us)':>10} {'burst(us)':>11} {'ratio':>7}")
        for r in rows:
            print(f"{r['path']:>14} {r['bytes']:>10} {r['one_us']:>10.1f} {r['burst_us']:>11.1f} "
                  f"{r['ratio']:>7.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows}, f, indent=1)
        sys.stdout.flush()


def max_over_ranks(values: list[float], ctrl) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
    return t.tolist()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4M,64M")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--collective", choices=("allreduce", "reduce_scatter", "burst"), default="allreduce")
    p.add_argument("--burst", type=int, default=100, help="calls per burst (--collective burst)")
    args = p.parse_args()

    import smdccl  # noqa: F401 - registers the backend

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    ctrl = dist.new_group(backend="gloo")
    paths = {"fp16 packed": smdccl_group("fp16"), "float32": smdccl_group("none"),
             "gloo": dist.new_group(backend="gloo")}
    if args.collective == "burst":
        burst_main(args, paths, ctrl, rank)
        dist.barrier(group=ctrl)
        dist.destroy_process_group()
        return 0
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        n = size // 4
        value = 1.0 / (rank + 1)
        n -= n % dist.get_world_size()  # reduce_scatter: whole blocks
        x = torch.full((n,), value, device="cuda")
        run = collective_call(args.collective, x)
        for group in paths.values():
            for _ in range(args.warmup):
                x.fill_(value)
                run(group, False)
            torch.cuda.synchronize()
        got = {name: timed_calls(paths[name], x, value, args.iters, name != "gloo", run)
               for name in paths}
        for name, r in got.items():
            s, cpu, pcie, calls = max_over_ranks([r["s"], r["cpu_s"], r["pcie_bytes"],
                                                  r["cuda_calls"]], ctrl)
            rows.append({"path": name, "bytes": size, "time_us": s * 1e6, "cpu_us": cpu * 1e6,
                         "pcie_mb": pcie / 1e6, "cuda_calls": calls})
    if rank == 0:
        env = {k: v for k, v in os.environ.items() if k.startswith("SMDCCL_")}
        print(f"# cuda_staged_bench: {args.collective}, {dist.get_world_size()} ranks, "
              f"{torch.cuda.get_device_name(0)}, "
              f"torch {torch.__version__}, {env}")
        print("# time: median per call (async_op + wait + cuda.synchronize), max over ranks; "
              "cpu: progress thread per call; pcie: bytes copied GPU<->host per call and rank; "
              "calls: smdccl's CUDA/NCCL calls per call and rank")
        print(f"{'path':>14} {'bytes':>10} {'time(us)':>11} {'cpu(us)':>10} {'pcie(MB)':>9} "
              f"{'calls':>7}")
        for r in rows:
            print(f"{r['path']:>14} {r['bytes']:>10} {r['time_us']:>11.1f} {r['cpu_us']:>10.1f} "
                  f"{r['pcie_mb']:>9.2f} {r['cuda_calls']:>7.0f}")
        by = {(r["path"], r["bytes"]): r for r in rows}
        for size in sorted({r["bytes"] for r in rows}):
            new, old, gloo = by[("fp16 packed", size)], by[("float32", size)], by[("gloo", size)]
            print(f"# {size} B: fp16 packed {old['time_us'] / new['time_us']:.2f}x float32 staging, "
                  f"{gloo['time_us'] / new['time_us']:.2f}x gloo; PCIe {new['pcie_mb']:.1f} vs "
                  f"{old['pcie_mb']:.1f} MB; progress CPU {new['cpu_us'] / max(old['cpu_us'], 1e-9):.0%} "
                  "of float32 staging's")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "env": env}, f, indent=1)
        sys.stdout.flush()
    dist.barrier(group=ctrl)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
