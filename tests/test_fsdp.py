"""FSDP2 (``fully_shard``) on CPU over the backend under test.

Why: FSDP2 drives the backend very differently from DDP -- per-layer
``all_gather_into_tensor`` of parameter shards (forward and backward),
``reduce_scatter_tensor`` of gradients (with AVG / PREMUL_SUM / SUM + divide,
depending on what the backend advertises), coalesced ops and uneven shard
padding.  The check is against a single-process reference: FSDP2 averages
gradients over ranks, so training on equal per-rank slices with a per-rank
mean loss equals training one model on the concatenated batch with the mean
loss.  After a few SGD steps the full (unsharded) parameters must match the
reference (fp32 reduction-order tolerance) and be identical on both ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness import BACKEND, run_ranks

STEPS = 6
PER_RANK = 8


def _model() -> nn.Module:
    torch.manual_seed(4321)
    # odd sizes: shards are padded unevenly across the 2 ranks
    return nn.Sequential(nn.Linear(13, 37), nn.ReLU(), nn.Linear(37, 29), nn.ReLU(), nn.Linear(29, 3))


def _batch(step: int, ws: int):
    g = torch.Generator().manual_seed(777 + step)
    return torch.randn(ws * PER_RANK, 13, generator=g), torch.randn(ws * PER_RANK, 3, generator=g)


def _opt(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def fsdp2_vs_reference(device: str = "cpu", atol: float = 1e-6, reduce_dtype: str = "",
                       error_feedback: bool = False) -> dict:
    """On "cuda" (a GPU shared by the ranks) FSDP2 also drives the stream
    semantics: its all-gather and reduce-scatter streams, async works waited
    on other streams, and CUDA-IPC reduce_scatter_tensor /
    all_gather_into_tensor. reduce_dtype ("bfloat16"): FSDP2's
    MixedPrecisionPolicy reduce-scatters the gradients in it.
    error_feedback: smdccl.fsdp.int8_error_feedback on the model."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, ws = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cpu")
    if device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        # float32 matmuls, as the CPU reference's (an image may turn TF32 on:
        # ~1e-3 apart, past atol)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    ref = _model()
    ref_opt = _opt(ref.parameters())
    for step in range(STEPS):
        x, y = _batch(step, ws)
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()  # mean over the whole batch
        ref_opt.step()

    model = _model().to(dev)
    mesh = DeviceMesh.from_group(dist.group.WORLD, device)  # the default group: backend under test
    policy = MixedPrecisionPolicy(reduce_dtype=getattr(torch, reduce_dtype) if reduce_dtype else None)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if error_feedback:
        import smdccl.fsdp

        assert smdccl.fsdp.int8_error_feedback(model) == 4  # three layers and the root
    opt = _opt(model.parameters())
    for step in range(STEPS):
        x, y = (t.to(dev) for t in _batch(step, ws))
        sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[sl]), y[sl]).backward()  # mean over this rank's slice
        opt.step()

    problems = []
    full = [p.full_tensor().detach().cpu() for p in model.parameters()]  # collective: all ranks
    for i, (a, b) in enumerate(zip(full, ref.parameters())):
        if a.shape != b.shape:
            problems.append(f"param {i}: shape {tuple(a.shape)} vs reference {tuple(b.shape)}")
        elif not torch.allclose(a, b.detach(), rtol=1e-5, atol=atol):
            problems.append(f"param {i} {tuple(a.shape)}: max |fsdp - reference| = {(a - b).abs().max().item():.3g}")
    flat = torch.cat([p.reshape(-1) for p in full])
    gathered = [None] * ws
    dist.all_gather_object(gathered, flat.view(torch.int32).tolist())  # exact bits
    if any(g != gathered[0] for g in gathered):
        problems.append("unsharded parameters differ bitwise between ranks")
    if problems:
        raise AssertionError(f"rank {rank}: " + "\n".join(problems))
    return {"max_diff": max((a - b.detach()).abs().max().item() for a, b in zip(full, ref.parameters())),
            "bits": gathered[0]}


def test_fsdp2_matches_single_process():
    res = run_ranks(2, fsdp2_vs_reference, timeout=240)
    print(f"\n[{BACKEND}] FSDP2 vs single-process max |diff| = {res[0]['max_diff']:.3g}")


def test_fsdp2_on_the_int8_wire():
    """FSDP2's reduce-scatters on a group compressed to int8, 2 nodes x 2
    ranks: the gradients cross nodes quantized once, so the parameters stay
    close to single-process training (not equal) and equal on every rank."""
    res = run_ranks(4, fsdp2_vs_reference, "cpu", 2e-3, timeout=240,
                    env={"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_COMPRESSION": "int8"})
    # float32 alone stays within 1e-6 of the reference (the test above)
    assert res[0]["max_diff"] > 1e-5, "the int8 wire changed nothing: did it run?"
    print(f"\n[{BACKEND}] FSDP2 on the int8 wire vs single-process max |diff| = {res[0]['max_diff']:.3g}")


def test_fsdp2_int8_error_feedback():
    """smdccl.fsdp.int8_error_feedback keys every module's reduce-scatter:
    training stays as close to the reference as without feedback, and the
    feedback changes the parameters' bits (it ran)."""
    env = {"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_COMPRESSION": "int8"}
    fed = run_ranks(4, fsdp2_vs_reference, "cpu", 2e-3, "", True, timeout=240, env=env)
    plain = run_ranks(4, fsdp2_vs_reference, "cpu", 2e-3, timeout=240, env=env)
    assert fed[0]["bits"] != plain[0]["bits"], "error feedback changed nothing: did it run?"
    print(f"\n[{BACKEND}] FSDP2 on the int8 wire, max |diff| with feedback {fed[0]['max_diff']:.3g}, "
          f"without {plain[0]['max_diff']:.3g}")


def test_fsdp2_int8_error_feedback_on_one_node_is_plain_fsdp():
    """On one node nothing is quantized: the keyed reduce-scatters keep no
    residuals and train exactly like float32 FSDP2 (within 1e-6 of the
    single-process reference, as test_fsdp2_matches_single_process)."""
    run_ranks(2, fsdp2_vs_reference, "cpu", 1e-6, "", True, timeout=240,
              env={"SMDCCL_COMPRESSION": "int8"})


def test_fsdp2_bf16_gradients_on_the_int8_wire():
    """The same with a MixedPrecisionPolicy reducing gradients in bfloat16:
    the bf16 reduce-scatters are widened to float32 for the int8 wire and
    rounded back once; training stays close to the reference and equal on
    every rank."""
    res = run_ranks(4, fsdp2_vs_reference, "cpu", 5e-3, "bfloat16", timeout=240,
                    env={"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_COMPRESSION": "int8"})
    print(f"\n[{BACKEND}] FSDP2, bf16 gradients on the int8 wire: max |diff| = {res[0]['max_diff']:.3g}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine "
                    "(scripts/gpu_check.sh runs this on a GPU machine)")
def test_fsdp2_cuda_matches_single_process():
    # 30 s: a stuck collective fails fast instead of holding a lent GPU machine.
    res = run_ranks(2, fsdp2_vs_reference, "cuda", timeout=180, pg_timeout=30.0)
    print(f"\n[{BACKEND}] FSDP2 on CUDA vs single-process max |diff| = {res[0]['max_diff']:.3g}")
