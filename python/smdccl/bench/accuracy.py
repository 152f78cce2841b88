"""Gradient averaging with fewer bits: torch's fp16 DDP hook over gloo vs
smdccl's fp16, bf16 and int8 wires, against float64.

    SMDCCL_TOPOLOGY=1,1,1,1 torchrun --nproc-per-node 4 -m smdccl.bench.accuracy
    python -m smdccl.bench.accuracy --int8-blocks 32,64,128,256

Every rank draws the same-shaped random "gradients" (``--count`` float32
values, normal with standard deviation ``scale``, seeded by (seed, rank,
scale)). For each scale the mean over ranks is computed several ways:

- reference: float64 sum of every rank's float32 values, divided by the
  world size (every rank all-gathers the inputs over the gloo control group);
- ``torch_fp16_hook``: torch's
  ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``
  called on a gloo group with the tensor as the bucket: it casts to float16,
  divides by the world size in float16, all-reduces in float16 over gloo
  (float16 partial sums) and casts back to float32;
- ``smdccl_fp16``: ``smdccl.ddp.fp16_compress_hook`` with a
  ``CompressionState()``: divides the float32 tensor by the world size and
  all-reduces it on an smdccl group with ``{"compression": "fp16"}`` (fp16
  values between nodes, float32 sums);
- ``smdccl_bf16``, ``smdccl_int8``: an AVG all_reduce on an smdccl group
  with that compression (bf16 values / block int8 between nodes, float32
  sums).
Compression applies between nodes, so run with ``SMDCCL_TOPOLOGY`` making
every rank its own node (``1,1`` ...); the header prints the group's
topology.

Reported per scale and way: max and RMS absolute error against the
reference, max over ranks (the results are also checked to be identical on
all ranks). Exit code 1 if smdccl's fp16 max error exceeds the torch hook's
at any scale.

``--int8-blocks``: no ranks; the error of one int8 quantization (the wire's
formula, in torch) for each block size, on normal values and on
heavy-tailed ones (normal times exp(normal)), with the bytes per value: the
measurement behind the wire's block of 128.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys

from smdccl._launch import RankZeroParser


def build_parser() -> argparse.ArgumentParser:
    p = RankZeroParser(
        prog="smdccl.bench.accuracy",
        usage="SMDCCL_TOPOLOGY=1,1 torchrun --nproc-per-node 2 -m smdccl.bench.accuracy [options]",
        description="Max and RMS error of gradient averaging vs a float64 reference: "
                    "torch's fp16_compress_hook over gloo vs smdccl's fp16, bf16 and int8 wires.")
    p.add_argument("--count", type=int, default=1 << 20, metavar="N",
                   help="float32 values per rank (default: 1048576)")
    p.add_argument("--scales", default="1e-4,1e-2,1,100", metavar="LIST",
                   help="standard deviations of the normal values (default: 1e-4,1e-2,1,100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the header and rows as JSON")
    p.add_argument("--int8-blocks", metavar="LIST",
                   help="no ranks: one int8 quantization's error per block size (e.g. 32,64,128,256)")
    return p


def int8_quantize(x, block: int):
    """The int8 wire's round trip (csrc/kernels/cpu/quantize.h) with `block`
    values per scale, in torch."""
    import torch
    n = x.numel()
    pad = (-n) % block
    v = torch.cat([x, x.new_zeros(pad)]).view(-1, block)
    m = v.abs().amax(1, keepdim=True)
    inv = torch.where(m > 0, 127.0 / m, torch.zeros_like(m))
    q = torch.round((v * inv).clamp(-127, 127))  # round half to even, as lrintf
    return (q * (m / 127.0)).view(-1)[:n]


def int8_blocks_table(blocks, count: int, seed: int) -> str:
    import torch
    g = torch.Generator().manual_seed(seed)
    data = {"normal": torch.randn(count, generator=g),
            "heavy-tailed": torch.randn(count, generator=g) * torch.randn(count, generator=g).exp()}
    lines = ["# one int8 quantization: error relative to the data's RMS (and to its max |x|)",
             f"#  {'block':>5}  {'bytes/value':>11}  " + "  ".join(f"{k + ' rms':>17}  {k + ' max':>17}"
                                                           for k in data)]
    for b in blocks:
        cells = []
        for x in data.values():
            e = int8_quantize(x, b) - x
            cells.append(f"{(e.pow(2).mean().sqrt() / x.pow(2).mean().sqrt()).item():>17.3e}")
            cells.append(f"{(e.abs().max() / x.abs().max()).item():>17.3e}")
        lines.append(f"   {b:>5}  {1 + 4 / b:>11.4f}  " + "  ".join(cells))
    return "\n".join(lines)


def _hook_result(hook, state, tensor):
    from smdccl.bench.ddp import _Bucket
    buf = tensor.clone()
    out = hook(state, _Bucket(buf, 0)).wait()
    return out


def _open_groups(world):
    """(gloo group, CompressionState on an smdccl group, {"smdccl_bf16": group,
    "smdccl_int8": group}); exits with a message if one cannot be opened."""
    from smdccl.bench.backends import open_group
    from smdccl.ddp import CompressionState

    gloo, err = open_group("gloo", world, 300.0)
    if gloo is None:
        raise SystemExit(f"smdccl.bench.accuracy: gloo unavailable: {err}")
    smd, err = open_group("smdccl", world, 300.0)
    if smd is None:
        raise SystemExit(f"smdccl.bench.accuracy: smdccl unavailable: {err}")
    state = CompressionState(process_group=smd)
    wires = {}
    for wire in ("bf16", "int8"):
        wires[f"smdccl_{wire}"], err = open_group(f"smdccl+{wire}", world, 300.0)
        if wires[f"smdccl_{wire}"] is None:
            raise SystemExit(f"smdccl.bench.accuracy: smdccl+{wire} unavailable: {err}")
    return gloo, state, wires


def _averages(x, gloo, state, wires) -> dict:
    """This rank's `x` averaged over the ranks every way, by name."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from smdccl.ddp import fp16_compress_hook

    results = {
        "torch_fp16_hook": _hook_result(default_hooks.fp16_compress_hook, gloo, x),
        "smdccl_fp16": _hook_result(fp16_compress_hook, state, x),
    }
    for name, group in wires.items():
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.AVG, group=group)
        results[name] = out
    return results


def _errors(name: str, out, ref, ctrl) -> dict:
    """The row's columns for one way: its errors (max over ranks), whether
    the ranks got the same result, whether it is finite."""
    import torch
    import torch.distributed as dist

    err_t = (out.double() - ref).abs()
    stats = torch.tensor([err_t.max().item(), err_t.pow(2).mean().sqrt().item()],
                         dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=ctrl)
    # identical on every rank?
    same = torch.tensor([0.0])
    first = out.clone()
    dist.broadcast(first, 0, group=ctrl)
    same[0] = 0.0 if torch.equal(first, out) else 1.0
    dist.all_reduce(same, group=ctrl)
    return {f"{name}_max_abs_err": stats[0].item(), f"{name}_rms_err": stats[1].item(),
            f"{name}_ranks_differ": int(same.item()),
            f"{name}_finite": bool(torch.isfinite(out).all())}


def _measure(scale: float, args, world, gloo, state, wires) -> dict:
    """The row of one scale: every way's error against the float64 mean."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(args.seed * 7919 + world.rank * 104729
                                      + int(round(1e6 * scale)) % 1_000_003)
    x = torch.randn(args.count, generator=g) * scale
    parts = [torch.empty_like(x) for _ in range(world.size)]
    dist.all_gather(parts, x, group=world.ctrl)
    ref = torch.stack([p.double() for p in parts]).sum(0) / world.size

    results = _averages(x, gloo, state, wires)
    row = {"ranks": world.size, "scale": scale, "count": args.count,
           "ref_max_abs": ref.abs().max().item()}
    for name, out in results.items():
        row.update(_errors(name, out, ref, world.ctrl))
    return row


def _header(args, world, scales: list[float], state, ok: bool) -> dict:
    """The run's description for the table and the JSON."""
    import torch

    from smdccl._launch import command_line

    cgroup = next(iter(state._groups.values()))
    backend = cgroup._get_backend(torch.device("cpu"))
    return dict(
        hostname=socket.gethostname(), cpu_count=os.cpu_count(),
        platform=platform.platform(), torch_version=torch.__version__,
        world_size=world.size, smdccl_topology_env=os.environ.get("SMDCCL_TOPOLOGY"),
        smdccl_topology=str(backend.topology), smdccl_compression=str(backend.compression),
        count=args.count, scales=scales, seed=args.seed,
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command_line=command_line("smdccl.bench.accuracy"), smdccl_not_worse=ok)


def _table(rows: list[dict], info: dict) -> str:
    """What rank 0 prints: the header lines, a line per scale, the verdict."""
    names = ("torch_fp16_hook", "smdccl_fp16", "smdccl_bf16", "smdccl_int8")
    lines = [
        f"# smdccl.bench.accuracy  {info['command_line']}",
        f"# {info['world_size']} ranks, {info['count']} float32 values per rank, normal(0, scale); "
        f"smdccl group: topology '{info['smdccl_topology']}', compression "
        f"'{info['smdccl_compression']}' (SMDCCL_TOPOLOGY={info['smdccl_topology_env']})",
        "# error = |result - float64 mean of the float32 inputs|, max over elements and ranks",
        "# torch_fp16_hook: default_hooks.fp16_compress_hook over gloo (fp16 sums); "
        "smdccl_fp16: smdccl.ddp.fp16_compress_hook (fp16 wire, float32 sums); "
        "smdccl_bf16 / smdccl_int8: AVG all_reduce on a group with that wire",
        f"#  {'ranks':>5}  {'scale':>8}  {'max|ref|':>10}  "
        + "  ".join(f"{n + ' max':>20}  {n + ' rms':>20}" for n in names),
    ]
    for r in rows:
        lines.append(f"   {r['ranks']:>5}  {r['scale']:>8.0e}  {r['ref_max_abs']:>10.3e}  " + "  ".join(
            f"{r[n + '_max_abs_err']:>20.3e}  {r[n + '_rms_err']:>20.3e}" for n in names))
        for name in names:
            if r[f"{name}_ranks_differ"] or not r[f"{name}_finite"]:
                lines.append(f"#  note: {name} at scale {r['scale']:g}: "
                             f"{r[f'{name}_ranks_differ']} rank(s) differ from rank 0, "
                             f"finite={r[f'{name}_finite']}")
    ok = info["smdccl_not_worse"]
    lines.append("# smdccl error <= torch hook error at every scale: " + ("yes" if ok else "NO"))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.int8_blocks:
        print(int8_blocks_table([int(b) for b in args.int8_blocks.split(",")], args.count, args.seed))
        return 0
    scales = [float(s) for s in args.scales.split(",") if s.strip()]
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)

    import torch.distributed as dist

    from smdccl.bench.backends import init_world

    world = init_world("cpu", 300.0)
    try:
        gloo, state, wires = _open_groups(world)
        rows = [_measure(scale, args, world, gloo, state, wires) for scale in scales]
        ok = all(r["smdccl_fp16_max_abs_err"] <= r["torch_fp16_hook_max_abs_err"] for r in rows)
        if world.rank == 0:
            info = _header(args, world, scales, state, ok)
            print(_table(rows, info), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"header": info, "rows": rows}, f, indent=1)
                    f.write("\n")
        # only rank 0 reports failure: a non-zero exit of another rank would make
        # torchrun SIGTERM rank 0 before it has printed and written the JSON
        return 1 if (world.rank == 0 and not ok) else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
