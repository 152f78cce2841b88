"""DDP on CPU: the backend under test trains the same model as gloo does.

Why: DDP is the main consumer of the backend (bucketed async all_reduce of
gradients, parameter broadcast at construction, bitwise-identical results on
every rank).  Two DDP replicas of the same model are trained side by side in
one spawned run -- one on the default group (backend under test), one on a
``new_group(backend="gloo")`` -- with the same seed and per-rank data; after 20
SGD steps their parameters must agree to 1e-5 relative, and the backend's
replica must be bitwise identical across ranks.  A tiny ``bucket_cap_mb``
splits the gradients into several buckets, so several all_reduces are in
flight at once.  World size 3: averaging over a non-power-of-two rounds.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import BACKEND, run_ranks

STEPS = 20


def _model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 5))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(10_000 * rank + step)
    return torch.randn(16, 32, generator=g), torch.randn(16, 5, generator=g)


def _train(model: nn.Module, group, rank: int) -> list[torch.Tensor]:
    # bucket_cap_mb ~ 4 KiB: every layer's gradients land in their own bucket(s)
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.004, broadcast_buffers=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in ddp.module.parameters()]


def ddp_vs_gloo() -> dict:
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    base = _model()
    if rank != 0:
        # DDP must broadcast rank 0's initial parameters: start other ranks elsewhere
        with torch.no_grad():
            for p in base.parameters():
                p.add_(0.5 * (rank + 1))
    m_test, m_gloo = copy.deepcopy(base), copy.deepcopy(base)
    p_test = _train(m_test, None, rank)
    p_gloo = _train(m_gloo, gloo, rank)

    problems = []
    for i, (a, b) in enumerate(zip(p_test, p_gloo)):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-7):
            err = (a - b).abs().max().item()
            problems.append(f"param {i} {tuple(a.shape)}: max |{BACKEND} - gloo| = {err:.3g}")
    # the replicas must be bitwise identical on every rank (compared over gloo)
    flat = torch.cat([p.reshape(-1) for p in p_test])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat, group=gloo)
    for r, other in enumerate(gathered):
        if not torch.equal(other.view(torch.int32), flat.view(torch.int32)):
            problems.append(f"{BACKEND} DDP parameters differ bitwise between rank {rank} and rank {r}")
    changed = max((a - b).abs().max().item() for a, b in zip(p_test, _model().parameters()))
    if changed == 0:
        problems.append("parameters did not change: training did not happen")
    if problems:
        raise AssertionError("\n".join(problems))
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(p_test, p_gloo))}


def test_ddp_matches_gloo():
    res = run_ranks(3, ddp_vs_gloo, timeout=240)
    print(f"\n[{BACKEND}] DDP vs gloo max |diff| = {res[0]['max_diff']:.3g}")
