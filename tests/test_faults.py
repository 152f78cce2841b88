"""A rank dies: the survivors must fail fast, name the dead rank, and clean up.

Why: with shared memory and TCP peers, a crashed rank must not turn into a
hang of the whole job.  Three ranks finish a warm-up all_reduce (so every
connection exists), then rank 2 SIGKILLs itself right before an all_reduce of
a medium tensor.  Ranks 0 and 1 must raise within the group timeout (10 s)
+ 5 s, the error must mention "rank 2", and afterwards no new /dev/shm/smdccl*
file may remain (the harness snapshots /dev/shm before the run and checks it
after every run; the killed rank cannot clean up, so segments must be
unlinked early or by the survivors).  The killed rank's SIGKILL exit is
declared expected.  Survivors wait for each other (over the harness's
store) before exiting, so that no survivor's exit is mistaken for the fault.
A second variant forces the TCP path with
SMDCCL_TOPOLOGY=1,1,1 (smdccl only).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, backend_supports, run_ranks, store_barrier

PG_TIMEOUT = 10.0
VICTIM = 2
MEDIUM = 300_007


def survive_dead_peer(timeout_s: float, victim: int) -> dict | None:
    rank, ws = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(ws))), "warm-up all_reduce wrong"
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    big = torch.ones(MEDIUM)
    t0 = time.monotonic()
    try:
        dist.all_reduce(big)
    except Exception as exc:  # noqa: BLE001 - any error type, but it must come
        elapsed = time.monotonic() - t0
        msg = f"{type(exc).__name__}: {exc}"
    else:
        raise AssertionError(f"rank {rank}: all_reduce returned normally although rank {victim} was killed")
    # Survivors leave together (through the harness's store, not the failed group):
    # one survivor's exit must not be what another survivor ends up reporting.
    store_barrier("fault-survivors-raised", ws - 1)
    problems = []
    if elapsed > timeout_s + 5:
        problems.append(f"raised only after {elapsed:.1f} s (group timeout {timeout_s} s + 5 s allowed)")
    if backend_supports("failed_rank_in_error") and f"rank {victim}" not in msg:
        problems.append(f"error does not mention 'rank {victim}': {msg[:1000]}")
    if problems:
        raise AssertionError(f"rank {rank}: " + "; ".join(problems))
    return {"elapsed": round(elapsed, 2), "error": msg[:300]}


def _run(env=None):
    results = run_ranks(3, survive_dead_peer, PG_TIMEOUT, VICTIM, env=env, pg_timeout=PG_TIMEOUT,
                        expect_exit={VICTIM: -signal.SIGKILL}, timeout=120)
    for r in (0, 1):
        print(f"\n[{BACKEND}] rank {r} raised after {results[r]['elapsed']} s: {results[r]['error']}")


def test_dead_rank_fails_fast():
    _run()


@pytest.mark.smdccl_only
def test_dead_rank_fails_fast_tcp():
    _run({"SMDCCL_TOPOLOGY": "1,1,1"})
