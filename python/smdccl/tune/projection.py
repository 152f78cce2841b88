"""``python -m smdccl.tune.projection``: what the cost model would run for an
allreduce on clusters too big to have here, and its estimate against a flat
ring's, as a markdown table (docs/algorithms.md holds one).

Pure: asks ``smdccl._C.plan`` (the engine's own selection) for each shape and
size, with a profile whose uplink is the given rate. No processes, no torch
group.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

NODES = (4, 16, 64, 256, 1024, 4096)
SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20, 1 << 30)
UPLINKS_GBIT = (25, 400)


def _label(nbytes: int) -> str:
    for unit, shift in (("GB", 30), ("MB", 20), ("KB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def table(ranks_per_node: int, uplink_gbit: float, inter_alpha_us: float,
          nodes=NODES, sizes=SIZES) -> str:
    from smdccl import _C

    with tempfile.NamedTemporaryFile("w", suffix=".profile", delete=False) as f:
        f.write(f"inter_gbps {uplink_gbit / 8}\ninter_alpha_us {inter_alpha_us}\n")
        profile = f.name
    saved = os.environ.pop("SMDCCL_ALGO", None)
    try:
        desc = _C.plan("allreduce", 1, (1, 1, 1), profile)[2].rsplit(" (", 1)[0]
        out = [f"{uplink_gbit:g} Gbit/s uplinks, {ranks_per_node} ranks per node; model: {desc}", "",
               "| nodes | " + " | ".join(_label(s) for s in sizes) + " |",
               "|---:|" + "---|" * len(sizes)]
        for n in nodes:
            cells = []
            for s in sizes:
                algo, est, _ = _C.plan("allreduce", s, (n * ranks_per_node, n, ranks_per_node),
                                       profile)
                ring = est["ring"]
                cells.append(f"{algo} {_time(est[algo])} ({ring / est[algo]:.1f}x)")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        return "\n".join(out)
    finally:
        os.unlink(profile)
        if saved is not None:
            os.environ["SMDCCL_ALGO"] = saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="smdccl.tune.projection", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--inter-alpha-us", type=float, default=10.0,
                   help="latency of one message between nodes (default 10)")
    p.add_argument("--uplinks", type=float, nargs="+", default=list(UPLINKS_GBIT), metavar="GBIT")
    args = p.parse_args(argv)
    print("Each cell: the algorithm the model picks, its estimate, and (in brackets) how many "
          "times faster that is than the flat ring's estimate.\n")
    for g in args.uplinks:
        print(table(args.ranks_per_node, g, args.inter_alpha_us))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
