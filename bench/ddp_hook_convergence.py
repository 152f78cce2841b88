"""200 DDP steps with smdccl.ddp fp16/bf16 hooks vs float32 DDP: final loss (issue 4 target: within 1%).

    SMDCCL_TOPOLOGY=2x2 torchrun --nproc-per-node 4 bench/ddp_hook_convergence.py

2x2 makes the four local ranks two nodes, so the hooks really compress
(16 bits between the nodes). Prints the mean loss of the last 20 steps.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from smdccl.ddp import CompressionState, bf16_compress_hook, fp16_compress_hook

dist.init_process_group("smdccl")
rank = dist.get_rank()


def train(hook, steps=200):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                torch.nn.Tanh(), torch.nn.Linear(256, 16))
    ddp = DDP(model, bucket_cap_mb=0.1)
    if hook:
        ddp.register_comm_hook(CompressionState(), hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    w = torch.randn(64, 16, generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, generator=gen)
        loss = (ddp(x) - torch.tanh(x @ w)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / dist.get_world_size())
    return sum(losses[-20:]) / 20, losses[0]


base = train(None)
for name, h in [("fp16", fp16_compress_hook), ("bf16", bf16_compress_hook)]:
    final, _ = train(h)
    if rank == 0:
        print(f"{name}: final loss (mean of last 20 steps) {final:.9f} vs float32 {base[0]:.9f}: "
              f"{100 * (final - base[0]) / base[0]:+.5f}% (start {base[1]:.4f})", flush=True)
