"""Collectives issued from completion callbacks, and DDP's PowerSGD hook.

Why: DDP comm hooks chain work on futures, and torch's own PowerSGD hook
all_reduces inside those callbacks and waits for the result there
(``dist.all_reduce(..., async_op=True).get_future().wait()``). smdccl
completes futures on the group's progress thread; an op queued from there
would wait behind the very callback that waits for it. Such an op runs at
once instead, right after the op whose completion issued it: the same point
of the run order on every rank, whatever the caller's thread queued
meanwhile (with gloo, whose callbacks race the caller's thread, the same
PowerSGD run with several buckets times out). A ``wait()`` from a callback
for an op queued behind it raises instead of hanging.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import Checker, run_ranks

# gloo fails these (its callbacks race the caller's thread): smdccl's promise.
pytestmark = pytest.mark.smdccl_only

N = 4099  # every op the same size: a misordered pair would swap data silently


def nested_in_callbacks(rounds: int) -> dict:
    """Each of `rounds` async all_reduces gets a then() callback that
    all_reduces a second tensor and waits for it, while the main thread goes
    on queueing all_reduces of the same size. Rank 1 dawdles in its
    callbacks, so the ranks' queues differ when the nested ops are issued."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"on rank {rank}")
    main_ts, futs, nested_ts, threads = [], [], [], []

    def callback(i):
        def cb(fut):
            threads.append(threading.current_thread().name)
            if rank == 1:
                time.sleep(0.002)
            b = torch.full((N,), float((rank + 1) * (i + 10)))
            nested_ts.append((i, b))
            out = dist.all_reduce(b, async_op=True).get_future().wait()[0]
            return out.clone()
        return cb

    for i in range(rounds):
        a = torch.full((N,), float(rank + i))
        main_ts.append(a)
        futs.append(dist.all_reduce(a, async_op=True).get_future().then(callback(i)))
    results = [f.wait() for f in futs]
    with chk.case("main thread's all_reduces"):
        for i, a in enumerate(main_ts):
            want = float(sum(r + i for r in range(ws)))
            assert torch.all(a == want).item(), f"all_reduce {i}: {a[:3].tolist()} != {want}"
    with chk.case("all_reduces issued and awaited inside callbacks"):
        for i, out in enumerate(results):
            want = float(sum((r + 1) * (i + 10) for r in range(ws)))
            assert torch.all(out == want).item(), f"nested {i}: {out[:3].tolist()} != {want}"
    with chk.case("the group goes on"):
        t = torch.ones(3)
        dist.all_reduce(t)
        assert torch.all(t == ws).item()
    return {"failures": chk.failures, "count": chk.count,
            "on_progress_thread": sum(name != "MainThread" for name in threads)}


def test_collectives_issued_and_awaited_in_callbacks_run_in_order():
    res = run_ranks(3, nested_in_callbacks, 12, timeout=120, pg_timeout=30)
    failures = [f for r in res for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert all(r["count"] == 3 for r in res)
    # Most callbacks must have run where the hang was: on the progress thread
    # (a future already complete when then() is called runs it on the caller).
    assert sum(r["on_progress_thread"] for r in res) > 0, res


def rider_of_a_nested_allreduce() -> dict:
    """An all_reduce issued in a callback on the progress thread (Y) runs at
    once; the all_reduce queued behind it (R) must not ride in it. A rider
    completes with Y, inside Y's callback: the op R's own callback issues (Z)
    would run there, before the rest of Y's callback (W), on a rank that
    attached R's callback in time, and after W on a rank that attached it
    once R was done. Rank 0 attaches in time, rank 1 late."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    if rank == 1:
        time.sleep(0.3)  # rank 0's first callback is attached before its op ends
    first = dist.all_reduce(torch.ones(4), async_op=True)
    if rank == 0:
        # Holds rank 0's progress thread while its caller queues the rest.
        first.get_future().then(lambda f: time.sleep(1.0))
    # Sizes differ where order matters: W and Z swapped are a mismatch.
    y, w, r, z = torch.ones(N), torch.ones(7), torch.ones(N), torch.ones(11)

    def issue_y_then_w(fut):
        dist.all_reduce(y, async_op=True).get_future().wait()  # R is queued behind Y
        dist.all_reduce(w, async_op=True).get_future().wait()

    def issue_z(fut):
        dist.all_reduce(z, async_op=True).get_future().wait()

    # int64: never fused with the float ops behind it.
    x = torch.ones(5, dtype=torch.int64)
    fx = dist.all_reduce(x, async_op=True).get_future().then(issue_y_then_w)
    wr = dist.all_reduce(r, async_op=True)
    if rank == 1:
        wr.wait()  # then() below runs the callback here, on the caller's thread
    fr = wr.get_future().then(issue_z)
    fx.wait()
    fr.wait()
    got = {name: t.tolist()[:2] for name, t in (("y", y), ("w", w), ("r", r), ("z", z))}
    assert all(v == [float(ws)] * 2 for v in got.values()), got
    return got


def wait_from_callback_raises() -> dict:
    """A callback on the progress thread that wait()s for an op queued behind
    it gets an error naming the op, instead of a hang."""
    rank = dist.get_rank()
    if rank == 0:
        time.sleep(0.5)  # rank 1's first all_reduce is still running when it adds the callback
    a, b = torch.ones(8), torch.ones(8)
    w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.all_reduce(b, async_op=True)
    seen = {}

    def cb(fut):
        seen["thread"] = threading.current_thread().name
        try:
            w2.wait()
            seen["error"] = None
        except Exception as e:  # noqa: BLE001 - the test reports what it got
            seen["error"] = f"{type(e).__name__}: {e}"
        return fut.value()

    fut = w1.get_future()
    if rank == 1:
        fut = fut.then(cb)
    fut.wait()
    w2.wait()
    assert torch.all(a == 2).item() and torch.all(b == 2).item()
    return seen


def test_an_allreduce_issued_in_a_callback_takes_no_riders():
    res = run_ranks(2, rider_of_a_nested_allreduce, timeout=120, pg_timeout=20)
    assert res[0] == res[1]


def test_wait_in_a_callback_for_an_op_queued_behind_it_raises():
    # No fusion: w2 fused into w1 would complete with it, before the callback.
    res = run_ranks(2, wait_from_callback_raises, env={"SMDCCL_FUSION_MB": "0"}, timeout=60,
                    pg_timeout=30)
    seen = res[1]
    assert seen["thread"] != "MainThread", f"the callback ran on the caller's thread: {seen}"
    assert seen["error"] and "would never run" in seen["error"] and "allreduce" in seen["error"], seen


def _powersgd_model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 5))


def _train_powersgd(group, rank: int, bucket_mb: float, full_rank: bool, steps: int = 12):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    ddp = DDP(_powersgd_model(), process_group=group, bucket_cap_mb=bucket_mb)
    if full_rank is not None:
        state = psgd.PowerSGDState(process_group=group, start_powerSGD_iter=2,
                                   matrix_approximation_rank=1000 if full_rank else 2,
                                   min_compression_rate=0, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 5, generator=g)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])


def ddp_powersgd() -> dict:
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    chk = Checker(f"on rank {rank}")
    with chk.case("PowerSGD, one bucket: gloo's parameters"):
        mine = _train_powersgd(None, rank, 25, full_rank=False)
        theirs = _train_powersgd(gloo, rank, 25, full_rank=False)
        assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-7), (
            f"max |smdccl - gloo| = {(mine - theirs).abs().max().item():.3g}")
    with chk.case("PowerSGD, several buckets, full rank: plain DDP's parameters"):
        # Full rank makes each low-rank product the gradient itself (up to
        # rounding), and gloo cannot run this many-bucket case: compare with
        # plain DDP over gloo.
        mine = _train_powersgd(None, rank, 0.004, full_rank=True)
        plain = _train_powersgd(gloo, rank, 0.004, full_rank=None)
        err = (mine - plain).abs().max().item()
        assert err < 1e-4, f"max |PowerSGD (full rank) - plain DDP| = {err:.3g}"
        assert not torch.equal(mine, _powersgd_model_flat()), "training did not happen"
    with chk.case("PowerSGD, several buckets, rank 2: replicas bitwise identical"):
        chk.digest("PowerSGD rank 2 parameters", _train_powersgd(None, rank, 0.004, full_rank=False))
    chk.compare_digests(gloo)  # over gloo: bitwise the same on every rank
    return {"failures": chk.failures, "count": chk.count}


def _powersgd_model_flat() -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in _powersgd_model().parameters()])


def test_ddp_powersgd_hook():
    res = run_ranks(3, ddp_powersgd, timeout=240, pg_timeout=60)
    failures = [f for r in res for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert all(r["count"] == 4 for r in res)  # three cases and the digest comparison
