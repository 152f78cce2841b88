"""Convergence of DDP with the int8 wire on real data: float32, fp16 wire,
int8 wire with and without error feedback, same seeds.

    python -m smdccl.cluster --nodes 2 --procs-per-node 2 --link 1gbit -- \
        bench/int8_convergence.py --steps 300 --out bench/results/int8-convergence

The data is real text on every machine without a download: the source files
of the Python standard library (sorted, concatenated, read as bytes), a
character-level language model (the transformer of smdccl.bench.ddp_model,
256-byte vocabulary). Every configuration starts from the same weights and
trains on the same batches (each drawn by (seed, rank, step)); the loss is
the mean over ranks. Rank 0 writes <out>.json (per-step losses and wall
times) and <out>.png (loss against step and against wall time; needs
matplotlib) and prints the final losses (mean of the last 20 steps) against
float32's.
"""

from __future__ import annotations

import argparse
import json
import os
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import smdccl.ddp as sddp
from smdccl.bench.ddp_model import Spec, TinyGPT, loss_fn

CONFIGS = {  # name -> (hook, error feedback)
    "float32": (None, False),
    "fp16": ("fp16_wire_hook", False),
    "int8+ef": ("int8_wire_hook", True),
    "int8": ("int8_wire_hook", False),
}
SPEC = Spec(vocab=256, d_model=128, heads=4, ff=512, layers=3, seq=64, batch=8)


def corpus(limit: int) -> torch.Tensor:
    """The standard library's .py files as bytes, in path order, up to `limit`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        data = path.read_bytes()
        out.append(data)
        size += len(data)
        if size >= limit:
            break
    return torch.frombuffer(bytearray(b"".join(out)[:limit]), dtype=torch.uint8).long()


def batch(text: torch.Tensor, seed: int, rank: int, step: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    starts = torch.randint(len(text) - SPEC.seq - 1, (SPEC.batch,), generator=g)
    rows = torch.stack([text[s:s + SPEC.seq + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def train(name, text, args, ctrl):
    hook, feedback = CONFIGS[name]
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = TinyGPT(SPEC)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    if hook:
        ddp.register_comm_hook(sddp.CompressionState(error_feedback=feedback), getattr(sddp, hook))
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    losses, walls = [], []
    dist.barrier(group=ctrl)
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(text, args.seed, rank, step)
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        walls.append(time.perf_counter() - t0)
        t = loss.detach().clone()
        dist.all_reduce(t, group=ctrl)
        losses.append(t.item() / dist.get_world_size())
    return {"loss": losses, "wall_s": walls}


def plot(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, r in results.items():
        a.plot(range(1, len(r["loss"]) + 1), r["loss"], label=name, linewidth=1)
        b.plot(r["wall_s"], r["loss"], label=name, linewidth=1)
    a.set_xlabel("step")
    b.set_xlabel("wall time (s)")
    for ax in (a, b):
        ax.set_ylabel("training loss (nats per byte)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-cap-mb", type=float, default=1.0)
    p.add_argument("--corpus-mb", type=float, default=8.0)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default="int8-convergence", help="path stem of the .json and .png")
    args = p.parse_args()

    dist.init_process_group("smdccl")
    ctrl = dist.new_group(backend="gloo")
    text = corpus(int(args.corpus_mb * (1 << 20)))
    results = {name: train(name, text, args, ctrl) for name in args.configs.split(",")}
    if dist.get_rank() == 0:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        header = {"command": "bench/int8_convergence.py " + " ".join(os.sys.argv[1:]),
                  "world_size": dist.get_world_size(), "topology": str(backend.topology),
                  "corpus_bytes": len(text), "spec": SPEC.__dict__,
                  "params": sum(q.numel() for q in TinyGPT(SPEC).parameters()),
                  "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
        with open(f"{args.out}.json", "w") as f:
            json.dump({"header": header, "results": results}, f)
        base = sum(results["float32"]["loss"][-20:]) / 20 if "float32" in results else None
        print(f"# {header['command']}: {header['world_size']} ranks, topology {header['topology']}, "
              f"{header['params']} parameters, {len(text)} bytes of text")
        for name, r in results.items():
            final = sum(r["loss"][-20:]) / 20
            vs = f" ({100 * (final - base) / base:+.2f}% vs float32)" if base else ""
            print(f"{name:>8}: first loss {r['loss'][0]:.4f}, final (mean of last 20) {final:.4f}{vs}, "
                  f"{r['wall_s'][-1]:.1f} s")
        try:
            plot(results, f"{args.out}.png",
                 f"char-level transformer on the stdlib's source, DDP, {header['topology']}")
        except ImportError:
            print("# no matplotlib: no plot")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
