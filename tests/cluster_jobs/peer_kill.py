"""A torchrun job for the emulated cluster: rank --victim SIGKILLs itself while
a large all_reduce is in flight (issued async; it checks that the all_reduce
has not completed before dying), and every other rank, on its node and on the
others, must see its own all_reduce raise within the group timeout + 5 s with
an error naming the victim. Then, on each survivor: a later all_reduce fails
fast with the same cause, blocking and async; the smdccl progress thread has
exited; destroy_process_group returns.

    python -m smdccl.cluster --nodes 2 --procs-per-node 2 --link 1gbit -- \\
        tests/cluster_jobs/peer_kill.py --victim 3

Each survivor prints ``rank R SURVIVED ...`` and exits 0, or prints
``rank R FAILED: ...`` and exits 1. The victim's node fails (torchrun reports
the SIGKILL), so the cluster exits 137 (128 + 9).

torchrun stops a node's other workers (SIGTERM, SIGKILL 30 s later) as soon
as one of them dies; the victim's node-mates ignore SIGTERM here, so that
they report what they saw instead of being torn down by the launcher.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

PROGRESS_THREAD = "smdccl-progress"


def progress_threads() -> int:
    n = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            n += (task / "comm").read_text().strip() == PROGRESS_THREAD
        except OSError:
            pass
    return n


def raises(fn) -> tuple[float, str | None]:
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return time.monotonic() - t0, f"{type(exc).__name__}: {exc}"
    return time.monotonic() - t0, None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--victim", type=int, required=True)
    p.add_argument("--pg-timeout", type=float, default=10.0)
    p.add_argument("--elements", type=int, default=16 << 20, help="float32 elements of the all_reduce")
    p.add_argument("--kill-after", type=float, default=0.2, help="s after issuing the all_reduce")
    args = p.parse_args()

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # see the module docstring
    dist.init_process_group("smdccl", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()  # outlives the failed group's links
    t = torch.ones(1000)
    dist.all_reduce(t)  # every link exists before the fault
    assert torch.equal(t, torch.full((1000,), float(world)))
    threads_before = progress_threads()
    big = torch.ones(args.elements)
    dist.barrier()
    if rank == args.victim:
        work = dist.all_reduce(big, async_op=True)
        time.sleep(args.kill_after)
        if work.is_completed():
            print(f"rank {rank} FAILED: the all_reduce completed within {args.kill_after} s, "
                  "before the kill; use more --elements", flush=True)
            return 1
        print(f"rank {rank} dies now, all_reduce in flight", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    failures: list[str] = []
    victim = f"rank {args.victim}"
    elapsed, msg = raises(lambda: dist.all_reduce(big))
    if msg is None:
        failures.append(f"all_reduce returned normally although {victim} was killed")
        msg = ""
    else:
        if elapsed > args.pg_timeout + 5:
            failures.append(f"raised only after {elapsed:.1f} s (group timeout {args.pg_timeout} s + 5 s)")
        if victim not in msg or "allreduce" not in msg:
            failures.append(f"error does not name {victim} and the op: {msg[:800]}")
        took, later = raises(lambda: dist.all_reduce(torch.ones(10)))
        if later is None or took > 1.0 or victim not in later:
            failures.append(f"later all_reduce: {took:.2f} s, {later!r:.800}")
        took, later = raises(lambda: dist.all_reduce(torch.ones(10), async_op=True).wait())
        if later is None or took > 1.0 or victim not in later:
            failures.append(f"later async all_reduce: {took:.2f} s, {later!r:.800}")
        deadline = time.monotonic() + 1.0
        while progress_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        if threads_before != 1 or progress_threads():
            failures.append(f"progress threads: {threads_before} before the fault, "
                            f"{progress_threads()} 1 s after it raised")
    # Survivors tear down together: no survivor's exit may be what another one reports.
    store.add("peer_kill/raised", 1)
    deadline = time.monotonic() + 60
    while int(store.add("peer_kill/raised", 0)) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    dist.destroy_process_group()
    destroyed = time.monotonic() - t0
    if destroyed > 10:
        failures.append(f"destroy_process_group took {destroyed:.1f} s")
    if failures:
        for f in failures:
            print(f"rank {rank} FAILED: {f}", flush=True)
        return 1
    print(f"rank {rank} SURVIVED host={os.uname().nodename} raised after {elapsed:.2f} s, "
          f"destroy {destroyed:.2f} s: {msg[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
