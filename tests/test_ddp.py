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

A second run trains a model with ``nn.Embedding(sparse=True)`` the same way:
its gradient is a sparse COO tensor, which DDP all_reduces as a sparse tensor
(tests/test_sparse.py tests that all_reduce itself).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import BACKEND, IS_SMDCCL, run_ranks

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


def _compare_with_gloo(p_test: list[torch.Tensor], p_gloo: list[torch.Tensor], gloo) -> list[str]:
    """The backend's replica against gloo's (1e-5 relative), and bitwise the
    same on every rank (compared over gloo); what differs, as lines."""
    problems = []
    for i, (a, b) in enumerate(zip(p_test, p_gloo)):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-7):
            err = (a - b).abs().max().item()
            problems.append(f"param {i} {tuple(a.shape)}: max |{BACKEND} - gloo| = {err:.3g}")
    flat = torch.cat([p.reshape(-1) for p in p_test])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat, group=gloo)
    for r, other in enumerate(gathered):
        if not torch.equal(other.view(torch.int32), flat.view(torch.int32)):
            problems.append(f"{BACKEND} DDP parameters differ bitwise between rank "
                            f"{dist.get_rank()} and rank {r}")
    return problems


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

    problems = _compare_with_gloo(p_test, p_gloo, gloo)
    changed = max((a - b).abs().max().item() for a, b in zip(p_test, _model().parameters()))
    if changed == 0:
        problems.append("parameters did not change: training did not happen")
    if problems:
        raise AssertionError("\n".join(problems))
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(p_test, p_gloo))}


class _SparseEmbeddingModel(nn.Module):
    """nn.Embedding(sparse=True): its gradient is a sparse COO tensor that DDP
    all_reduces as one (sparse) bucket of its own."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4321)
        self.emb = nn.Embedding(64, 8, sparse=True)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        return self.head(self.emb(tokens).mean(1))


def _train_sparse(rank: int, group=None, hook=None, train_head: bool = True) -> list[torch.Tensor]:
    model = _SparseEmbeddingModel()
    model.head.requires_grad_(train_head)
    ddp = DDP(model, process_group=group)
    if hook:
        from smdccl.ddp import CompressionState

        ddp.register_comm_hook(CompressionState(error_feedback=True), hook)
    opt = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=0.5)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * rank + step)
        tokens = torch.randint(0, 64, (6, 5), generator=g)  # rows overlap between ranks
        target = torch.randn(6, 3, generator=g)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(tokens), target).backward()
        assert model.emb.weight.grad.is_sparse
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp_sparse_vs_gloo() -> dict:
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    p_test = _train_sparse(rank)
    p_gloo = _train_sparse(rank, gloo)
    problems = _compare_with_gloo(p_test, p_gloo, gloo)
    if IS_SMDCCL:
        # smdccl's compression hooks pass a sparse bucket through unrounded
        # (error feedback included): with only the embedding training, the
        # hooked run must give the plain run's bits.
        from smdccl.ddp import fp16_compress_hook

        plain = _train_sparse(rank, train_head=False)[0]
        hooked = _train_sparse(rank, hook=fp16_compress_hook, train_head=False)[0]
        if not torch.equal(plain, hooked):
            problems.append(f"fp16 hook on the sparse bucket: max |hooked - plain| = "
                            f"{(plain - hooked).abs().max().item():.3g}")
    if torch.equal(p_test[0], _SparseEmbeddingModel().emb.weight.detach()):
        problems.append("the embedding did not change: training did not happen")
    if problems:
        raise AssertionError("\n".join(problems))
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(p_test, p_gloo))}


def test_ddp_sparse_embedding_matches_gloo():
    res = run_ranks(3, ddp_sparse_vs_gloo, timeout=240)
    print(f"\n[{BACKEND}] DDP (sparse embedding) vs gloo max |diff| = {res[0]['max_diff']:.3g}")


def test_ddp_matches_gloo():
    res = run_ranks(3, ddp_vs_gloo, timeout=240)
    print(f"\n[{BACKEND}] DDP vs gloo max |diff| = {res[0]['max_diff']:.3g}")


def hook_registration(simulate_cpu_torch: bool) -> dict:
    """Registers every hook smdccl.ddp exports on a DDP model. With
    simulate_cpu_torch, torch looks like a CPU build to DDP's hook check
    (no CUDA version, no NCCL), as 2.13.0+cpu is; torch's own
    bf16_compress_hook must then be refused (the check is live) and none of
    smdccl's may be."""
    import smdccl.ddp as sddp
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if simulate_cpu_torch:
        torch.version.cuda = None
        dist.is_nccl_available = lambda: False
    refused = {}
    for name in sddp.__all__:
        if not name.endswith("_hook"):
            continue
        try:
            DDP(nn.Linear(4, 4)).register_comm_hook(sddp.CompressionState(), getattr(sddp, name))
        except Exception as e:  # noqa: BLE001 - the test reports what was refused
            refused[name] = f"{type(e).__name__}: {e}"
    torch_refused = False
    try:
        DDP(nn.Linear(4, 4)).register_comm_hook(None, default_hooks.bf16_compress_hook)
    except TypeError:
        torch_refused = True
    return {"refused": refused, "torch_bf16_refused": torch_refused,
            "checked": [n for n in sddp.__all__ if n.endswith("_hook")]}


def test_every_smdccl_hook_registers_on_cpu_and_cuda_builds_of_torch():
    # The real CPU build (2.13.0+cpu) was checked by hand (commit message);
    # here DDP's check sees a CPU build, and the installed build as it is.
    cpu, as_is = (run_ranks(1, hook_registration, sim)[0] for sim in (True, False))
    assert cpu["torch_bf16_refused"], "the simulated CPU build did not refuse torch's bf16 hook"
    assert len(cpu["checked"]) == 5, cpu
    assert not cpu["refused"], cpu["refused"]
    assert not as_is["refused"], as_is["refused"]

