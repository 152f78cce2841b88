"""Hugging Face Accelerate on smdccl.

    torchrun --nproc-per-node 2 examples/accelerate_cpu.py

On CPU, Accelerate picks gloo (or mpi) itself unless a process group
exists already: make it with ``init_process_group("smdccl")`` first, and
``Accelerator(cpu=True)`` uses that group. (On CUDA,
``Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="smdccl")])``
is honoured as it is.) Prints the backend Accelerate's processes talk over
and the loss before and after a few steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import smdccl  # noqa: F401 - registers "smdccl"
from accelerate import Accelerator


def main() -> None:
    dist.init_process_group("smdccl")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(1024, 8)
    y = x.sum(dim=1, keepdim=True)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    if accelerator.is_main_process:
        print(f"accelerate: {accelerator.num_processes} processes over "
              f"{dist.get_backend()}; loss {losses[0]:.4f} -> {losses[-1]:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
