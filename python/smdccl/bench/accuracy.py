"""fp16 gradient averaging: torch's DDP hook over gloo vs smdccl's fp16 wire.

    SMDCCL_TOPOLOGY=1,1,1,1 torchrun --nproc-per-node 4 -m smdccl.bench.accuracy

Every rank draws the same-shaped random "gradients" (``--count`` float32
values, normal with standard deviation ``scale``, seeded by (seed, rank,
scale)). For each scale the mean over ranks is computed three ways:

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
  values between nodes, float32 sums). Compression applies between nodes, so
  run with ``SMDCCL_TOPOLOGY`` making every rank its own node (``1,1`` ...);
  the header prints the group's topology and compression.

Reported per scale: max and mean absolute error against the reference, max
over ranks (the results are also checked to be identical on all ranks).
Exit code 1 if smdccl's max error exceeds the torch hook's at any scale.
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
        description="Max abs error of fp16 gradient averaging vs a float64 reference: "
                    "torch's fp16_compress_hook over gloo vs smdccl's fp16 wire.")
    p.add_argument("--count", type=int, default=1 << 20, metavar="N",
                   help="float32 values per rank (default: 1048576)")
    p.add_argument("--scales", default="1e-4,1e-2,1,100", metavar="LIST",
                   help="standard deviations of the normal values (default: 1e-4,1e-2,1,100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the header and rows as JSON")
    return p


def _hook_result(hook, state, tensor):
    from smdccl.bench.ddp import _Bucket
    buf = tensor.clone()
    out = hook(state, _Bucket(buf, 0)).wait()
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    scales = [float(s) for s in args.scales.split(",") if s.strip()]
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from smdccl._launch import command_line
    from smdccl.bench.backends import init_world, open_group
    from smdccl.ddp import CompressionState, fp16_compress_hook

    world = init_world("cpu", 300.0)
    try:
        gloo, err = open_group("gloo", world, 300.0)
        if gloo is None:
            raise SystemExit(f"smdccl.bench.accuracy: gloo unavailable: {err}")
        smd, err = open_group("smdccl", world, 300.0)
        if smd is None:
            raise SystemExit(f"smdccl.bench.accuracy: smdccl unavailable: {err}")
        state = CompressionState(process_group=smd)
        rows = []
        for scale in scales:
            g = torch.Generator().manual_seed(args.seed * 7919 + world.rank * 104729
                                              + int(round(1e6 * scale)) % 1_000_003)
            x = torch.randn(args.count, generator=g) * scale
            parts = [torch.empty_like(x) for _ in range(world.size)]
            dist.all_gather(parts, x, group=world.ctrl)
            ref = torch.stack([p.double() for p in parts]).sum(0) / world.size

            results = {
                "torch_fp16_hook": _hook_result(default_hooks.fp16_compress_hook, gloo, x),
                "smdccl_fp16": _hook_result(fp16_compress_hook, state, x),
            }
            row = {"ranks": world.size, "scale": scale, "count": args.count,
                   "ref_max_abs": ref.abs().max().item()}
            for name, out in results.items():
                err_t = (out.double() - ref).abs()
                stats = torch.tensor([err_t.max().item(), err_t.mean().item()], dtype=torch.float64)
                dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=world.ctrl)
                # identical on every rank?
                same = torch.tensor([0.0])
                first = out.clone()
                dist.broadcast(first, 0, group=world.ctrl)
                same[0] = 0.0 if torch.equal(first, out) else 1.0
                dist.all_reduce(same, group=world.ctrl)
                row[f"{name}_max_abs_err"] = stats[0].item()
                row[f"{name}_mean_abs_err"] = stats[1].item()
                row[f"{name}_ranks_differ"] = int(same.item())
                row[f"{name}_finite"] = bool(torch.isfinite(out).all())
            rows.append(row)

        ok = all(r["smdccl_fp16_max_abs_err"] <= r["torch_fp16_hook_max_abs_err"] for r in rows)
        if world.rank == 0:
            cgroup = next(iter(state._groups.values()))
            backend = cgroup._get_backend(torch.device("cpu"))
            info = dict(
                hostname=socket.gethostname(), cpu_count=os.cpu_count(),
                platform=platform.platform(), torch_version=torch.__version__,
                world_size=world.size, smdccl_topology_env=os.environ.get("SMDCCL_TOPOLOGY"),
                smdccl_topology=str(backend.topology), smdccl_compression=str(backend.compression),
                count=args.count, scales=scales, seed=args.seed,
                date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                command_line=command_line("smdccl.bench.accuracy"), smdccl_not_worse=ok)
            lines = [
                f"# smdccl.bench.accuracy  {info['command_line']}",
                f"# {world.size} ranks, {args.count} float32 values per rank, normal(0, scale); "
                f"smdccl group: topology '{info['smdccl_topology']}', compression "
                f"'{info['smdccl_compression']}' (SMDCCL_TOPOLOGY={info['smdccl_topology_env']})",
                "# error = |result - float64 mean of the float32 inputs|, max over elements and ranks",
                "# torch_fp16_hook: default_hooks.fp16_compress_hook over gloo (fp16 sums); "
                "smdccl_fp16: smdccl.ddp.fp16_compress_hook (fp16 wire, float32 sums)",
                f"#  {'ranks':>5}  {'scale':>8}  {'max|ref|':>10}  {'torch max err':>13}  "
                f"{'smdccl max err':>14}  {'ratio':>6}  {'torch mean err':>14}  {'smdccl mean err':>15}",
            ]
            for r in rows:
                t, s = r["torch_fp16_hook_max_abs_err"], r["smdccl_fp16_max_abs_err"]
                ratio = s / t if t > 0 else float("nan")
                lines.append(
                    f"   {r['ranks']:>5}  {r['scale']:>8.0e}  {r['ref_max_abs']:>10.3e}  {t:>13.3e}  "
                    f"{s:>14.3e}  {ratio:>6.3f}  {r['torch_fp16_hook_mean_abs_err']:>14.3e}  "
                    f"{r['smdccl_fp16_mean_abs_err']:>15.3e}")
                for name in ("torch_fp16_hook", "smdccl_fp16"):
                    if r[f"{name}_ranks_differ"] or not r[f"{name}_finite"]:
                        lines.append(f"#  note: {name} at scale {r['scale']:g}: "
                                     f"{r[f'{name}_ranks_differ']} rank(s) differ from rank 0, "
                                     f"finite={r[f'{name}_finite']}")
            lines.append("# smdccl error <= torch hook error at every scale: " + ("yes" if ok else "NO"))
            print("\n".join(lines), flush=True)
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
