"""torchrun's elastic restarts with smdccl: a rank dies, the job resumes.

    torchrun --nproc-per-node 2 --max-restarts 1 examples/elastic_restart.py CKPT_DIR [--die-at STEP]

Trains a small model for 40 steps, saving a checkpoint every 10. With
``--die-at``, rank 1 kills itself at that step on the first attempt
(TORCHELASTIC_RESTART_COUNT=0); torchrun sees it, stops the other rank,
and starts both again; the new processes make a new smdccl group and resume
from the last checkpoint. Rank 0 prints the final parameters' SHA-256, the
same as an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import smdccl  # noqa: F401 - registers "smdccl"

STEPS, EVERY = 40, 10


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt_dir", type=Path)
    p.add_argument("--die-at", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("smdccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = args.ckpt_dir / "ckpt.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for step in range(start, STEPS):
        if step == args.die_at and rank == 1 and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 8, generator=g)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % EVERY == 0:
            dist.barrier()
            if rank == 0:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "step": step + 1}, tmp)
                tmp.replace(ckpt)
            dist.barrier()
    if rank == 0:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        print(f"elastic: attempt {attempt}, resumed at step {start}, world {world}; final "
              f"parameters sha256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
