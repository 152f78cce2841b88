"""Correctness check and timing loop for every (backend, collective, size).

Method (all ranks run the same steps in the same order):

0. Once per backend, before any backend's first size: each collective twice
   at the largest size, untimed (:func:`warm_up`), so that what a first run
   finds cold (untouched memory pages, shared-memory rings, sockets, groups
   still connecting) is warm.
1. ``--passes`` passes over every collective and size; within a pass, at each
   size, every backend in turn (so the backends compared on a line were
   measured seconds apart, under the same machine conditions).
2. Check (first pass only): fill the inputs with rank-dependent values, run
   the collective once, count the elements that differ from a float64
   reference computed locally (see :mod:`~smdccl.bench.collectives`); #wrong
   is summed over ranks. Never done inside the timed loop. Later passes fill
   the inputs and make one untimed call instead.
3. Warm up (first pass): ``--warmup`` calls, timed only to size the loop.
4. Iterations: ``--iters`` per pass, or adaptively ``--target-time`` divided
   by the passes and by the warm-up median (max over ranks), clamped to
   [5, 1000]; decided once, over the control group, so every rank runs the
   same count in every pass.
5. Barrier (control group), then ``iters`` calls, each timed on its own with
   ``time.perf_counter``. An in-place reduction (allreduce, reduce) gets its
   input back before each call, untimed, so that its values do not grow call
   after call (a 16-bit wire would overflow within 16 calls). Every call is synchronous: the c10d call waits for
   completion, and with ``--device cuda`` it is followed by
   ``torch.cuda.synchronize``.
6. A pass's time = median of the per-call times on each rank, then the max
   of those medians over ranks (all_reduce MAX over the control group): the
   slowest rank is when the collective is done for everyone. The reported
   time is the median over passes; every pass's time is kept in the JSON
   rows (``pass_us``).

Why passes: a shared virtual machine changes speed for seconds at a time
(on the 2-vCPU VM this was developed on, a 2-rank 1 MB shared-memory
all_reduce in one long-running process flipped between ~7 and ~2.3 GB/s,
for 5-10 s at a time, as the host moved the vCPUs), longer than one size's
measurement. One pass then reports such a phase as the library's speed, and
one backend can land in it while the other does not; the median of passes
spread over the run does not, and the interleaving keeps the comparison fair.

The control traffic of steps 4 and 6 is outside the timed calls, on the gloo
default group, so it does not disturb the backend being measured. A backend
that raises on a collective (e.g. gloo has no AVG), at the check or in a
timed loop (a peer gone, a timeout), is skipped for that collective from
that size on, with the reason reported (a size whose passes did not all
run has no line); the other backends, collectives and smaller sizes go on.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from smdccl.bench.backends import World, describe, family, first_error
from smdccl.bench.collectives import DTYPES, REDUCING, busbw_factor, make_case
from smdccl.bench.sizes import human

MIN_ITERS, MAX_ITERS = 5, 1000


def _timed(case, world: World) -> float:
    if case.restore is not None:  # untimed: the input as fill() wrote it
        case.restore()
        world.sync()
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
    """Timed calls per pass."""
    if args.iters:
        return args.iters
    if estimate_s <= 0:
        return MAX_ITERS
    return max(MIN_ITERS, min(MAX_ITERS, round(args.target_time / args.passes / estimate_s)))


def check(case, world: World) -> tuple[float, int]:
    """(seconds of the checked call, this rank's #wrong)."""
    case.fill()
    first = _timed(case, world)
    return first, case.count_wrong()


def _agreed(world: World, work: Callable):
    """``work()`` on this rank, then one round of the ranks: (its value, None),
    or (None, the first rank's error) wherever any rank raised. A rank that
    raised leaves its peers inside the collective it skipped until the
    group's timeout fails it there too; then every rank is here, and the
    sweep goes on with the other backends and sizes instead of ending."""
    value, err = None, None
    try:
        value = work()
    except Exception as exc:  # noqa: BLE001 - the sweep reports it
        err = describe(exc)
    if (err := first_error(world, err)) is not None:
        return None, err
    return value, None


def row(backend: str, name: str, got: "_Series", world: World, args) -> dict:
    """One line of the table; ``got.pass_s`` holds each pass's seconds per call."""
    seconds = statistics.median(got.pass_s)
    algbw = got.size / seconds / 1e9
    return {
        "backend": backend,
        "collective": name,
        "size": got.size,
        "count": got.count,
        "dtype": args.dtype,
        "op": args.op if name in REDUCING else "-",
        "time_us": seconds * 1e6,
        "algbw": algbw,
        "busbw": algbw * busbw_factor(name, world.size),
        "wrong": got.wrong,
        "iters": got.iters,
        "passes": len(got.pass_s),
        "pass_us": [t * 1e6 for t in got.pass_s],
        "world_size": world.size,
        "device": world.device.type,
    }


WARM_UP_CALLS = 2


def warm_up(backend: str, group, world: World, args, step: Callable[[str], None]) -> None:
    """Before any backend's first timed size (sweep runs every warm-up first):
    each collective WARM_UP_CALLS times at the largest size, results unchecked
    and untimed. What is cold in a first run (memory pages the process and the
    machine never touched, shared-memory rings, sockets and their buffers,
    lazily made links) is then warm for every size. A collective that raises
    here is left to the sweep, which reports it."""
    dtype = DTYPES[args.dtype]
    nbytes = max(args.size_list)
    for name in args.collectives:
        step(f"{backend} warm-up {name} {human(nbytes)}")
        err, case = None, None
        try:
            case = make_case(name, nbytes, dtype, args.op, group, world.rank, world.size,
                             world.device, lossy=_lossy(backend, world.size))
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


class _Series:
    """What one (backend, collective, size) has gathered over the passes."""

    def __init__(self) -> None:
        self.size = self.count = 0  # as the case defines them (nccl-tests' size and count)
        self.wrong = 0
        self.iters = 0
        self.pass_s: list[float] = []


def _lossy(backend: str, world: int) -> float:
    """The int8 wire's error, relative to the largest result (two
    quantizations of at most max / 254 each per node and of the sum): the
    tolerance its correctness check allows. 0 (exact) for every other
    backend."""
    return world / 127.0 if "+int8" in backend else 0.0


def unsupported(backend: str, name: str, device: torch.device) -> str | None:
    """What a backend cannot do and must not be asked: gloo's send/recv hands
    a CUDA tensor's device pointer to TCP, which faults or waits out the
    timeout and leaves the group's connections broken for what follows."""
    if family(backend) == "gloo" and name == "sendrecv" and device.type == "cuda":
        return "gloo has no send/recv of CUDA tensors"
    return None


def _one_pass(backend, group, name, nbytes, series, world, args, first_pass: bool):
    """Measure one (backend, collective, size) once; returns an error or None."""
    if (reason := unsupported(backend, name, world.device)) is not None:
        return reason  # the same on every rank: no round needed

    def prepare():
        case = make_case(name, nbytes, DTYPES[args.dtype], args.op, group, world.rank,
                         world.size, world.device, lossy=_lossy(backend, world.size))
        if first_pass:
            return case, check(case, world)
        case.fill()
        _timed(case, world)  # touches this pass's fresh buffers, untimed
        return case, None

    got, err = _agreed(world, prepare)  # an unsupported op or dtype fails here
    if err is not None:
        return err
    case, checked = got
    if first_pass:
        first, wrong = checked
        series.size, series.count = case.size, case.count
        series.wrong = _sum_over_ranks(wrong, world)
        # ``--warmup`` calls, timed only to size the loop alike on every rank
        warm, err = _agreed(world, lambda: [_timed(case, world) for _ in range(args.warmup)])
        if err is not None:
            return err
        series.iters = _iterations(_max_over_ranks(statistics.median(warm) if warm else first, world),
                                   args)
    dist.barrier(group=world.ctrl)
    times, err = _agreed(world, lambda: [_timed(case, world) for _ in range(series.iters)])
    if err is not None:
        return err
    # seconds per call: the per-call median on each rank, the max over ranks
    series.pass_s.append(_max_over_ranks(statistics.median(times), world))
    return None


def sweep(groups: dict, world: World, args, step: Callable[[str], None]) -> tuple[list, list]:
    """Run every pass x collective x size x backend; returns (rows, skipped)."""
    rows, skipped = [], []
    # every backend's warm-up before any timing: a group that has not yet run
    # a collective may still be busy connecting (an unused gloo group's socket
    # threads took 30-60 % of a core while smdccl was timed: its 256 KB-4 MB
    # allreduce measured 2 GB/s instead of 9-11)
    for backend, group in groups.items():
        warm_up(backend, group, world, args, step)
    series = {(b, n, s): _Series() for b in groups for n in args.collectives for s in args.size_list}
    broken: dict = {}  # (backend, collective) -> the size it failed at; larger ones are skipped
    for p in range(args.passes):
        for name in args.collectives:
            for nbytes in args.size_list:
                for backend, group in groups.items():
                    step(f"{backend} {name} {human(nbytes)}"
                         + (f" (pass {p + 1}/{args.passes})" if args.passes > 1 else ""))
                    if nbytes >= broken.get((backend, name), float("inf")):
                        continue
                    err = _one_pass(backend, group, name, nbytes, series[backend, name, nbytes],
                                    world, args, first_pass=p == 0)
                    if err is not None:
                        broken[backend, name] = nbytes
                        skipped.append({"backend": backend, "collective": name,
                                        "reason": err if nbytes == min(args.size_list)
                                        else f"from {human(nbytes)} on: {err}"})
    for backend in groups:
        for name in args.collectives:
            for nbytes in args.size_list:
                got = series[backend, name, nbytes]
                if len(got.pass_s) == args.passes:
                    rows.append(row(backend, name, got, world, args))
    return rows, skipped
