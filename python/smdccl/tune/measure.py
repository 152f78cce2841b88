"""The measurements: one-way message time between two ranks, and the speed
of the CPU's elementwise reduction.

Message time. A 2-rank smdccl group plays ping-pong with ``dist.broadcast``
from alternating roots: in a group of two, a broadcast is exactly one message
of the tensor's size from the root to the other rank. The first rank of the
pair times each round trip (its broadcast out, the other rank's broadcast
back) with ``time.perf_counter``; one message takes half a round trip. The
sizes are swept ``passes`` times, each pass doing, per size, ``warmup``
untimed round trips and its share of the ``iters_for(size)`` timed ones; a
size's time is the median (or the ``quantile`` asked for) over all its
passes. Spreading each size over the run means a burst of load from other
processes on the machine touches every size a little instead of a few sizes
a lot, which would tilt the fitted line. The time includes one Python call into the backend per message, as
every collective call from Python does. Each size reuses one buffer, so a
message that fits the CPU's last-level cache is timed cache-hot, as a
bucket that was just written (a gradient) would be.

Reduction. A float32 ``add_`` of two tensors of ``nbytes`` each on one
thread (smdccl reduces on one thread per rank), median of ``repeats``;
speed = bytes of one operand per second.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

#: fewest timed round trips per size, however large the message
MIN_ITERS = 5


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between order statistics; ``q = 0.5`` is the median."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


@dataclass(frozen=True)
class Point:
    nbytes: int
    seconds: float  # one-way time per message: median (or quantile) round trip / 2
    iters: int


def iters_for(nbytes: int, max_iters: int, volume: int) -> int:
    """Timed round trips for one size: ``max_iters``, fewer for large messages
    (each size moves at most about ``volume`` bytes each way), never below
    :data:`MIN_ITERS` nor above ``max_iters``."""
    return max(min(MIN_ITERS, max_iters), min(max_iters, math.ceil(volume / nbytes)))


def ping_pong(group, pair: tuple[int, int], sizes: list[int], warmup: int,
              max_iters: int, volume: int, passes: int = 1,
              q: float = 0.5) -> list[Point] | None:
    """Run the ping-pong between the two global ranks in ``pair`` (both must
    call this with the same arguments). Returns the points on ``pair[0]``,
    None on ``pair[1]``."""
    first, second = pair
    me = dist.get_rank()
    bufs = {n: torch.zeros(n, dtype=torch.uint8) for n in sizes}
    trips: dict[int, list[float]] = {n: [] for n in sizes}
    for p in range(passes):
        for nbytes in sizes:
            total = iters_for(nbytes, max_iters, volume)
            # this pass's share of the timed round trips (the shares add up to total)
            n = total * (p + 1) // passes - total * p // passes
            if n == 0:
                continue
            buf = bufs[nbytes]
            for i in range(warmup + n):
                t0 = time.perf_counter()
                dist.broadcast(buf, src=first, group=group)
                dist.broadcast(buf, src=second, group=group)
                if i >= warmup:
                    trips[nbytes].append(time.perf_counter() - t0)
    if me != first:
        return None
    return [Point(n, quantile(trips[n], q) / 2, len(trips[n])) for n in sizes]


def reduce_gbps(nbytes: int, repeats: int) -> tuple[float, float]:
    """(GB/s, median seconds) of ``a.add_(b)`` on float32 tensors of ``nbytes``."""
    n = max(1, nbytes // 4)
    a = torch.ones(n, dtype=torch.float32)
    b = torch.full((n,), 1e-7, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(2):
            a.add_(b)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a.add_(b)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    t = statistics.median(times)
    return 4 * n / t / 1e9, t
