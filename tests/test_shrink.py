"""dist.shrink_group: the remaining ranks carry on without the excluded ones.

Why: fault-tolerant training (torchft-style, or a job that drops a failed
node) shrinks the group after a rank dies instead of restarting every rank;
NCCL users have ``dist.shrink_group`` for it, gloo has nothing.

What (4 ranks, smdccl only: gloo cannot shrink):
- recovery: rank 3 SIGKILLs itself; the survivors' all_reduce fails naming
  it (REMOTE_ERROR); ``dist.shrink_group([3])`` gives them a default group of
  3 ranks, on which all_reduce, all_gather_into_tensor, broadcast and
  send/recv are right against references, twice over (a shrunk group can be
  shrunk again: then to 2 ranks).
- SHRINK_ABORT: rank 2 is alive but never comes (it waits in Python); the
  others' async all_reduce waits for it; ``shrink_group([2],
  shrink_flags=SHRINK_ABORT)`` aborts it (the work raises at once, naming
  the abort) and the 3 remaining ranks go on.
- bad input: excluding a rank that is not in the group raises ValueError
  and the group goes on.
"""

from __future__ import annotations

import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from harness import harness_store, run_ranks, timed_raise

pytestmark = pytest.mark.smdccl_only


def _check_group(out: dict, label: str, global_ranks: list[int]) -> None:
    """Collectives on the (shrunk) default group against references."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    me = global_ranks[rank]
    t = torch.arange(1000, dtype=torch.float64) * (me + 1)
    dist.all_reduce(t)
    want = torch.arange(1000, dtype=torch.float64) * sum(g + 1 for g in global_ranks)
    out[f"{label}: all_reduce"] = torch.equal(t, want)
    out_t = torch.empty(ws * 7, dtype=torch.int64)
    dist.all_gather_into_tensor(out_t, torch.full((7,), me, dtype=torch.int64))
    out[f"{label}: all_gather"] = out_t.view(ws, 7)[:, 0].tolist() == global_ranks
    b = torch.full((5,), float(me)) if rank == ws - 1 else torch.zeros(5)
    dist.broadcast(b, src=ws - 1)
    out[f"{label}: broadcast"] = b.tolist() == [float(global_ranks[-1])] * 5
    if rank == 0:
        dist.send(torch.full((3,), 42.0), dst=ws - 1)
    elif rank == ws - 1:
        got = torch.zeros(3)
        dist.recv(got, src=0)
        out[f"{label}: send/recv"] = got.tolist() == [42.0] * 3
    out[f"{label}: size"] = ws


def survive_a_dead_rank() -> dict | None:
    rank = dist.get_rank()
    out = {}
    dist.all_reduce(torch.ones(4))  # every link up
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    out["failure"] = timed_raise(lambda: dist.all_reduce(torch.ones(1 << 16)))
    out["error type"] = str(dist.group.WORLD._get_backend(torch.device("cpu")).get_error())
    out["bad rank"] = timed_raise(lambda: dist.shrink_group([9]))
    t0 = time.monotonic()
    dist.shrink_group([3])
    out["shrink_s"] = time.monotonic() - t0
    _check_group(out, "3 ranks", [0, 1, 2])
    if rank != 1:  # again, without rank 1 (an excluded rank does not call it)
        dist.shrink_group([1])
        _check_group(out, "2 ranks", [0, 2])
    return out


def test_shrink_after_a_rank_died():
    results = run_ranks(4, survive_a_dead_rank, pg_timeout=60, expect_exit={3: -signal.SIGKILL},
                        timeout=180)
    for rank in (0, 1, 2):
        r = results[rank]
        seconds, err = r["failure"]
        assert err is not None and "rank 3" in err, r["failure"]
        assert seconds < 10, f"the failure took {seconds:.1f} s to notice"
        assert r["error type"] == "ErrorType.REMOTE_ERROR", r
        assert r["bad rank"][1] is not None and r["bad rank"][1].startswith("ValueError"), r["bad rank"]
        assert r["3 ranks: size"] == 3, r
        for key in ("all_reduce", "all_gather", "broadcast"):
            assert r[f"3 ranks: {key}"] is True, (rank, key, r)
        if rank != 1:
            assert r["2 ranks: size"] == 2, r
            for key in ("all_reduce", "all_gather", "broadcast"):
                assert r[f"2 ranks: {key}"] is True, (rank, key, r)
    assert results[2]["3 ranks: send/recv"] is True
    assert results[2]["2 ranks: send/recv"] is True
    print(f"\n[smdccl] shrink after a SIGKILL: {max(results[r]['shrink_s'] for r in (0, 1, 2)) * 1e3:.0f} ms")


def abort_a_stuck_op() -> dict:
    rank = dist.get_rank()
    store = harness_store()
    out = {}
    dist.all_reduce(torch.ones(4))
    if rank == 2:  # alive, but never comes back to the group
        store.wait(["shrink_test/done"], datetime.timedelta(seconds=120))
        return out
    stuck = dist.all_reduce(torch.ones(1 << 10), async_op=True)
    time.sleep(0.5)  # it is waiting for rank 2
    t0 = time.monotonic()
    dist.shrink_group([2], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    out["shrink_s"] = time.monotonic() - t0
    out["stuck"] = timed_raise(stuck.wait)
    _check_group(out, "3 ranks", [0, 1, 3])
    dist.barrier()
    if dist.get_rank() == 0:
        store.set("shrink_test/done", "1")
    return out


def test_shrink_abort_unblocks_an_op_waiting_for_an_excluded_rank():
    results = run_ranks(4, abort_a_stuck_op, pg_timeout=60, timeout=180)
    for rank in (0, 1, 3):
        r = results[rank]
        seconds, err = r["stuck"]
        assert err is not None and "aborted" in err, r["stuck"]
        assert r["shrink_s"] < 10, r
        for key in ("all_reduce", "all_gather", "broadcast"):
            assert r[f"3 ranks: {key}"] is True, (rank, key, r)
    assert results[3]["3 ranks: send/recv"] is True
