"""Correctness check and timing loop for every (backend, collective, size).

Method, for each size (all ranks run the same steps in the same order):

1. Check: fill the inputs with rank-dependent values, run the collective
   once, count the elements that differ from a float64 reference computed
   locally (see :mod:`~smdccl.bench.collectives`); #wrong is summed over
   ranks. Never done inside the timed loop.
0. Once per backend, before any backend's first size: each collective twice
   at the largest size, untimed (:func:`warm_up`), so that what a first run
   finds cold (untouched memory pages, shared-memory rings, sockets, groups
   still connecting) is warm.
2. Warm up: ``--warmup`` calls, timed only to size the loop.
3. Iterations: ``--iters``, or adaptively ``--target-time`` divided by the
   warm-up median (max over ranks), clamped to [5, 1000]. Decided over the
   control group so every rank runs the same count.
4. Barrier (control group), then ``iters`` calls, each timed on its own with
   ``time.perf_counter``. Every call is synchronous: the c10d call waits for
   completion, and with ``--device cuda`` it is followed by
   ``torch.cuda.synchronize``.
5. Time = median of the per-call times on each rank, then the max of those
   medians over ranks (all_reduce MAX over the control group): the slowest
   rank is when the collective is done for everyone.

The control traffic of steps 3 and 5 is outside the timed calls, on the gloo
default group, so it does not disturb the backend being measured. A backend
that raises on a collective (e.g. gloo has no AVG) is skipped for that
collective's remaining sizes, with the reason reported.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from smdccl.bench.backends import World, describe, first_error
from smdccl.bench.collectives import DTYPES, REDUCING, busbw_factor, make_case
from smdccl.bench.sizes import human

MIN_ITERS, MAX_ITERS = 5, 1000


def _timed(case, world: World) -> float:
    start = time.perf_counter()
    case.run()
    world.sync()
    return time.perf_counter() - start


def _max_over_ranks(value: float, world: World) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=world.ctrl)
    return float(t.item())


def _sum_over_ranks(value: int, world: World) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=world.ctrl)
    return int(t.item())


def _iterations(estimate_s: float, args) -> int:
    if args.iters:
        return args.iters
    if estimate_s <= 0:
        return MAX_ITERS
    return max(MIN_ITERS, min(MAX_ITERS, round(args.target_time / estimate_s)))


def check(case, world: World) -> tuple[float, int]:
    """(seconds of the checked call, this rank's #wrong). No control traffic:
    an exception here (unsupported op or dtype) is raised on its own, before
    the ranks compare notes."""
    case.fill()
    first = _timed(case, world)
    return first, case.count_wrong()


def measure(case, world: World, args, first: float, wrong: int) -> tuple[float, int, int]:
    """(seconds per call, #wrong summed over ranks, iterations) for one case."""
    wrong = _sum_over_ranks(wrong, world)
    warm = [_timed(case, world) for _ in range(args.warmup)]
    estimate = _max_over_ranks(statistics.median(warm) if warm else first, world)
    iters = _iterations(estimate, args)

    dist.barrier(group=world.ctrl)
    times = [_timed(case, world) for _ in range(iters)]
    return _max_over_ranks(statistics.median(times), world), wrong, iters


def row(backend: str, case, seconds: float, wrong: int, iters: int, world: World, args) -> dict:
    algbw = case.size / seconds / 1e9
    return {
        "backend": backend,
        "collective": case.name,
        "size": case.size,
        "count": case.count,
        "dtype": args.dtype,
        "op": args.op if case.name in REDUCING else "-",
        "time_us": seconds * 1e6,
        "algbw": algbw,
        "busbw": algbw * busbw_factor(case.name, world.size),
        "wrong": wrong,
        "iters": iters,
        "world_size": world.size,
        "device": world.device.type,
    }


WARM_UP_CALLS = 2


def warm_up(backend: str, group, world: World, args, step: Callable[[str], None]) -> None:
    """Before any backend's first timed size (sweep runs every warm-up first):
    each collective WARM_UP_CALLS times at the largest size, results unchecked
    and untimed. What is cold in a first
    run (memory pages the process and the machine never touched, shared-memory
    rings, sockets and their buffers, lazily made links) is then warm for every
    size: a new user's first table measured a third of later runs' bandwidth at
    1-64 MB without this. A collective that raises here is left to the sweep,
    which reports it."""
    dtype = DTYPES[args.dtype]
    nbytes = max(args.size_list)
    for name in args.collectives:
        step(f"{backend} warm-up {name} {human(nbytes)}")
        err, case = None, None
        try:
            case = make_case(name, nbytes, dtype, args.op, group, world.rank, world.size,
                             world.device)
            case.fill()
        except Exception as exc:  # noqa: BLE001 - the sweep reports it
            err = describe(exc)
        for _ in range(WARM_UP_CALLS):
            if err is None:
                try:
                    _timed(case, world)
                except Exception as exc:  # noqa: BLE001
                    err = describe(exc)
            if first_error(world, err) is not None:  # the same decision on every rank
                break
        del case


def sweep(groups: dict, world: World, args, step: Callable[[str], None]) -> tuple[list, list]:
    """Run every backend x collective x size; returns (rows, skipped)."""
    dtype = DTYPES[args.dtype]
    rows, skipped = [], []
    # every backend's warm-up before any timing: a group that has not yet run
    # a collective may still be busy connecting (an unused gloo group's socket
    # threads took 30-60 % of a core while smdccl was timed: its 256 KB-4 MB
    # allreduce measured 2 GB/s instead of 9-11)
    for backend, group in groups.items():
        warm_up(backend, group, world, args, step)
    for backend, group in groups.items():
        for name in args.collectives:
            broken = None
            for nbytes in args.size_list:
                step(f"{backend} {name} {human(nbytes)}")
                if broken:
                    continue
                err, case, checked = None, None, None
                try:
                    case = make_case(name, nbytes, dtype, args.op, group, world.rank,
                                     world.size, world.device)
                    checked = check(case, world)
                except Exception as exc:  # unsupported op/dtype on this backend
                    err = describe(exc)
                if (err := first_error(world, err)) is not None:
                    broken = err
                    skipped.append({"backend": backend, "collective": name, "reason": err})
                    continue
                rows.append(row(backend, case, *measure(case, world, args, *checked), world, args))
                del case  # free this size's buffers before the next ones are allocated
    return rows, skipped
