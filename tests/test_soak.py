"""Soak: 10,000 random collectives on 4 ranks, every result checked, no growth.

Why: the collective matrix checks each collective once per shape; a long run
of *mixed* collectives over several communicators catches what only shows up
over time or in a particular order: state left behind by one collective that
breaks the next, sequence numbers or shared-memory slots that drift between
groups, buffers, threads or file descriptors that leak per call.

What it does (one spawn of 4 ranks):

* makes the subgroups [0, 1, 2] and [1, 3] next to the world group, then warms
  every group with every collective at every root and at the largest size, so
  that connections, shared-memory segments and worker threads created on first
  use exist before anything is measured;
* draws 10,000 steps from a ``random.Random`` seeded identically on every
  rank: the collective (all_reduce, reduce, broadcast, all_gather,
  all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single with random
  uneven splits, gather, scatter, barrier, and batches of 2-4 async
  all_reduces of distinct tensors, which the engine may fuse), the dtype
  (float32, float64, float16, bfloat16, int32, int64, uint8), the reduce op
  valid for it (SUM, MIN, MAX, PRODUCT; AVG for floats), the size (mostly
  0..4096 elements, log-uniform; 1.5 % up to 300,000), the root and the group.
  Ranks outside the drawn group skip the step, so every rank sees the same
  sequence of collectives per group;
* checks every result against ``tests/reference.py``: exact for integers and
  integer-valued floats, within the per-hop rounding bound for random floats,
  bit-exact for data movement; every mismatch is collected with its step,
  collective, dtype, op, size and group, and the test fails with the list;
* samples VmRSS, the thread count, the number of open fds and of /dev/shm
  mappings (``/proc/self/status``, ``/proc/self/fd``, ``/proc/self/maps``)
  after the warm-up plus 500 steps, every 2,500 steps, and at the end: RSS may
  grow by at most 64 MiB between the first and the last sample (allocator
  caching; RSS swings by ~+-30 MiB with the large steps), threads, fds and
  mappings not at all.

Inputs come from ``reference.rank_input`` (a pure function of rank, size,
dtype and seed), so each rank recomputes its peers' contributions; its cache
is cleared after every step so that it cannot pose as a leak.
"""

from __future__ import annotations

import gc
import math
import os
import random
import time
import warnings

import torch
import torch.distributed as dist

from harness import BACKEND, Checker, run_ranks
from reference import (
    assert_equal_bits,
    assert_matches,
    clear_input_cache,
    dtype_name,
    is_float,
    make_op,
    rank_input,
    reduce_reference,
)

WORLD = 4
STEPS = int(os.environ.get("SMDCCL_SOAK_STEPS", "10000"))
WARM_STEPS = 500
SEED = 20240611
MAX_SMALL = 4096
MAX_LARGE = 300_000
RSS_SLACK_MIB = 64
SAMPLE_EVERY = 2500  # extra samples in between, for the trend

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
FLOAT_OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]
INT_OPS = ["SUM", "MIN", "MAX", "PRODUCT"]
SUBGROUPS = [[0, 1, 2], [1, 3]]
ROOTED = ("reduce", "broadcast", "gather", "scatter")

#: (collective, weight): the reductions, the data movers, and a few barriers
COLLECTIVES = [
    ("all_reduce", 16), ("reduce", 8), ("broadcast", 10), ("all_gather", 8),
    ("all_gather_into_tensor", 10), ("reduce_scatter_tensor", 10), ("all_to_all_single", 10),
    ("gather", 8), ("scatter", 8), ("barrier", 4), ("all_reduce_async_batch", 8),
]


# ---------------------------------------------------------------------------
# Rank side
# ---------------------------------------------------------------------------


def resources() -> dict:
    """This process's RSS (MiB), thread count, open fds and /dev/shm mappings, after a gc pass."""
    gc.collect()
    with open("/proc/self/maps") as fh:
        shm_maps = sum(1 for line in fh if "/dev/shm/" in line)
    status = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return {
        "rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
        "threads": int(status["Threads"]),
        "fds": len(os.listdir("/proc/self/fd")),
        "shm_maps": shm_maps,
    }


def draw_size(rng: random.Random) -> int:
    u = rng.random()
    if u < 0.05:
        return rng.choice([0, 1, 2, 3])
    if u < 0.985:
        return int(math.exp(rng.uniform(0.0, math.log(MAX_SMALL + 1)))) - 1
    return rng.randint(MAX_SMALL + 1, MAX_LARGE)


def draw_step(rng: random.Random, step: int) -> dict:
    """Everything about one step, drawn identically on every rank."""
    names, weights = zip(*COLLECTIVES)
    coll = rng.choices(names, weights)[0]
    members = rng.choices([list(range(WORLD))] + SUBGROUPS, [6, 2, 2])[0]
    dtype = rng.choice(DTYPES)
    op = rng.choice(FLOAT_OPS if is_float(dtype) else INT_OPS)
    kind = "rand" if is_float(dtype) and rng.random() < 0.3 else "int"
    size = draw_size(rng)
    gsize = len(members)
    spec = {"step": step, "coll": coll, "members": members, "dtype": dtype, "op": op, "kind": kind,
            "n": size, "root": rng.randrange(gsize)}
    if coll == "all_to_all_single":
        # splits[src][dst] in elements: uneven, some empty, sum well below MAX_LARGE
        per = max(size // gsize, 0)
        spec["splits"] = [[rng.choice([0, per, rng.randint(0, per)]) for _ in range(gsize)] for _ in range(gsize)]
    if coll == "all_reduce_async_batch":
        count = rng.randint(2, 4)
        spec["batch"] = [(rng.choice(DTYPES[:2] + DTYPES[4:6]), draw_size(rng) % 2048) for _ in range(count)]
        spec["op"] = rng.choice(["SUM", "MAX"])
    return spec


class Soak:
    def __init__(self):
        warnings.filterwarnings("ignore", category=FutureWarning)
        self.rank = dist.get_rank()
        self.ws = dist.get_world_size()
        assert self.ws == WORLD, f"soak needs {WORLD} ranks, got {self.ws}"
        self.chk = Checker(f"on rank {self.rank} (backend {BACKEND})")
        self.groups = {tuple(range(WORLD)): None}
        for members in SUBGROUPS:  # every rank creates every group, in the same order
            self.groups[tuple(members)] = dist.new_group(members)
        self.counts: dict[str, int] = {}
        self.collectives = 0
        self.errors = 0  # collectives that raised (the group may be unusable afterwards)

    # ---- references ------------------------------------------------------

    @staticmethod
    def ref(members, n, dtype, op, kind, seed):
        inputs = [rank_input(r, n, dtype, seed, kind) for r in members]
        nr = len(members)
        exact = kind == "int" and not (op == "AVG" and nr & (nr - 1))
        if exact and op == "PRODUCT" and dtype.is_floating_point:
            exact = 4**nr * torch.finfo(dtype).eps <= 2  # integer products beyond the significand round
        return reduce_reference(inputs, op, dtype, exact=exact)

    # ---- one step --------------------------------------------------------

    def run(self, s: dict) -> None:
        members, rank = s["members"], self.rank
        if rank not in members:
            return
        g = self.groups[tuple(members)]
        gsize, grank = len(members), members.index(rank)
        coll, dtype, op, kind, n, root = s["coll"], s["dtype"], s["op"], s["kind"], s["n"], s["root"]
        seed = s["step"]
        move_kind = "rand" if is_float(dtype) else "int"  # data movement: arbitrary bits
        if coll == "all_reduce_async_batch":
            what = f"{op} batch={[(dtype_name(d), m) for d, m in s['batch']]}"
        elif coll in ("all_reduce", "reduce", "reduce_scatter_tensor"):
            what = f"{dtype_name(dtype)} {op} n={n} {kind}"
        else:
            what = f"{dtype_name(dtype)} n={n}"
        desc = f"step {seed}: {coll} {what} group={members}" + (f" root={root}" if coll in ROOTED else "")
        self.counts[coll] = self.counts.get(coll, 0) + 1
        with self.chk.case(desc):
            try:
                self._run(coll, g, gsize, grank, members, dtype, op, kind, move_kind, n, root, seed, s)
            except AssertionError:
                raise
            except Exception:
                self.errors += 1
                raise
        clear_input_cache()

    def _run(self, coll, g, gsize, grank, members, dtype, op, kind, move_kind, n, root, seed, s):
        rank = self.rank
        if coll == "all_reduce":
            t = rank_input(rank, n, dtype, seed, kind).clone()
            dist.all_reduce(t, op=make_op(op), group=g)
            self.collectives += 1
            assert_matches(t, self.ref(members, n, dtype, op, kind, seed))
        elif coll == "reduce":
            t = rank_input(rank, n, dtype, seed, kind).clone()
            dist.reduce(t, group=g, group_dst=root, op=make_op(op))
            self.collectives += 1
            if grank == root:
                assert_matches(t, self.ref(members, n, dtype, op, kind, seed))
        elif coll == "broadcast":
            owner = members[root]
            t = rank_input(owner, n, dtype, seed, move_kind).clone() if grank == root else filler(n, dtype)
            dist.broadcast(t, group=g, group_src=root)
            self.collectives += 1
            assert_equal_bits(t, rank_input(owner, n, dtype, seed, move_kind), "broadcast")
        elif coll == "all_gather":
            outs = [filler(n, dtype) for _ in members]
            dist.all_gather(outs, rank_input(rank, n, dtype, seed, move_kind).clone(), group=g)
            self.collectives += 1
            for i, r in enumerate(members):
                assert_equal_bits(outs[i], rank_input(r, n, dtype, seed, move_kind), f"slot {i}")
        elif coll == "all_gather_into_tensor":
            out = filler(gsize * n, dtype)
            dist.all_gather_into_tensor(out, rank_input(rank, n, dtype, seed, move_kind).clone(), group=g)
            self.collectives += 1
            assert_equal_bits(out, torch.cat([rank_input(r, n, dtype, seed, move_kind) for r in members]))
        elif coll == "reduce_scatter_tensor":
            c = n  # chunk per rank
            inp = rank_input(rank, gsize * c, dtype, seed, kind).clone()
            out = filler(c, dtype)
            dist.reduce_scatter_tensor(out, inp, op=make_op(op), group=g)
            self.collectives += 1
            ref = self.ref(members, gsize * c, dtype, op, kind, seed).slice(grank * c, (grank + 1) * c)
            assert_matches(out, ref)
        elif coll == "all_to_all_single":
            splits = s["splits"]  # [src][dst], group ranks
            in_splits = splits[grank]
            out_splits = [splits[i][grank] for i in range(gsize)]
            src = torch.cat([rank_input(rank, in_splits[j], dtype, f"{seed}/{j}", move_kind) for j in range(gsize)])
            out = filler(sum(out_splits), dtype)
            dist.all_to_all_single(out, src, output_split_sizes=out_splits, input_split_sizes=in_splits, group=g)
            self.collectives += 1
            expect = torch.cat([rank_input(members[i], out_splits[i], dtype, f"{seed}/{grank}", move_kind)
                                for i in range(gsize)])
            assert_equal_bits(out, expect, f"splits {splits}")
        elif coll == "gather":
            glist = [filler(n, dtype) for _ in members] if grank == root else None
            dist.gather(rank_input(rank, n, dtype, seed, move_kind).clone(), glist, group=g, group_dst=root)
            self.collectives += 1
            if grank == root:
                for i, r in enumerate(members):
                    assert_equal_bits(glist[i], rank_input(r, n, dtype, seed, move_kind), f"slot {i}")
        elif coll == "scatter":
            owner = members[root]
            slist = ([rank_input(owner, n, dtype, f"{seed}/{j}", move_kind).clone() for j in range(gsize)]
                     if grank == root else None)
            out = filler(n, dtype)
            dist.scatter(out, slist, group=g, group_src=root)
            self.collectives += 1
            assert_equal_bits(out, rank_input(owner, n, dtype, f"{seed}/{grank}", move_kind))
        elif coll == "barrier":
            dist.barrier(group=g)
            self.collectives += 1
        elif coll == "all_reduce_async_batch":
            # distinct tensors queued back to back (fusable when dtype and op agree)
            ts = [rank_input(rank, m, dt, f"{seed}/{i}", "int").clone() for i, (dt, m) in enumerate(s["batch"])]
            works = [dist.all_reduce(t, op=make_op(op), group=g, async_op=True) for t in ts]
            for w in works:
                w.wait()
            self.collectives += len(ts)
            for i, ((dt, m), t) in enumerate(zip(s["batch"], ts)):
                assert_matches(t, self.ref(members, m, dt, op, "int", f"{seed}/{i}"), f"batch tensor {i}")
        else:  # pragma: no cover
            raise AssertionError(f"unknown collective {coll}")

    # ---- warm-up ---------------------------------------------------------

    def warm(self) -> None:
        """Every collective on every group, at every root and at the largest size."""
        step = -1
        for members in [list(range(WORLD))] + SUBGROUPS:
            gsize = len(members)
            for coll, _ in COLLECTIVES:
                for n in (7, MAX_LARGE):
                    for root in range(gsize):
                        if root and coll not in ROOTED:
                            continue
                        spec = {"step": step, "coll": coll, "members": members, "dtype": torch.float32,
                                "op": "SUM", "kind": "int", "n": n, "root": root}
                        if coll == "all_to_all_single":
                            spec["splits"] = [[n // gsize] * gsize for _ in range(gsize)]
                        if coll == "all_reduce_async_batch":
                            spec["batch"] = [(torch.float32, 100), (torch.float32, 1000), (torch.int64, 5)]
                        self.run(spec)
                        step -= 1
        self.counts.clear()


def filler(n: int, dtype) -> torch.Tensor:
    """Outputs start as non-zero garbage (catches unwritten outputs)."""
    return torch.full((n,), 77, dtype=dtype)


def soak(steps: int, warm_steps: int) -> dict:
    ctx = Soak()
    rng = random.Random(SEED)
    t0 = time.perf_counter()
    ctx.warm()
    t_warm = time.perf_counter() - t0
    warm_collectives, warm_cases = ctx.collectives, ctx.chk.count
    ctx.collectives = 0
    samples = []
    t1 = time.perf_counter()
    stop_reason = None
    for step in range(steps):
        if step == warm_steps or (step > warm_steps and step % SAMPLE_EVERY == 0):
            dist.barrier()
            samples.append({"after_step": step, **resources()})
        ctx.run(draw_step(rng, step))
        if ctx.errors:
            stop_reason = f"a collective raised at step {step}; the group may be unusable, stopped"
            break
        if len(ctx.chk.failures) >= 100:
            stop_reason = f"100 mismatches by step {step}, stopped"
            break
    t_run = time.perf_counter() - t1
    if stop_reason is None:
        dist.barrier()
        samples.append({"after_step": steps, **resources()})
    if stop_reason:
        ctx.chk._fail("soak", stop_reason)
    summary = ctx.chk.finish()  # raises with every mismatch
    first, last = samples[0], samples[-1]
    growth = {"rss_mib": round(last["rss_mib"] - first["rss_mib"], 1),
              "threads": last["threads"] - first["threads"], "fds": last["fds"] - first["fds"],
              "shm_maps": last["shm_maps"] - first["shm_maps"]}
    problems = []
    if growth["rss_mib"] > RSS_SLACK_MIB:
        problems.append(f"RSS grew by {growth['rss_mib']} MiB (> {RSS_SLACK_MIB} MiB)")
    if growth["threads"] > 0:
        problems.append(f"thread count grew by {growth['threads']}")
    if growth["fds"] > 0:
        problems.append(f"open fds grew by {growth['fds']}")
    if growth["shm_maps"] > 0:
        problems.append(f"/dev/shm mappings grew by {growth['shm_maps']}")
    if problems:
        raise AssertionError(f"rank {ctx.rank}: " + "; ".join(problems) + f" (samples {samples})")
    return {"rank": ctx.rank, "steps": steps, "collectives": ctx.collectives,
            "checked": summary["cases"] - warm_cases, "warm_collectives": warm_collectives,
            "wrong": summary["failures"], "counts": dict(sorted(ctx.counts.items())),
            "warmup_s": round(t_warm, 2), "run_s": round(t_run, 2), "samples": samples, "growth": growth}


# ---------------------------------------------------------------------------
# pytest
# ---------------------------------------------------------------------------


def test_soak_random_collectives():
    t0 = time.monotonic()
    results = run_ranks(WORLD, soak, STEPS, WARM_STEPS, timeout=300, pg_timeout=60)
    wall = time.monotonic() - t0
    r0 = results[0]
    print(f"\n[{BACKEND}] soak: {STEPS} steps on {WORLD} ranks, wall {wall:.1f} s "
          f"(warm-up {r0['warmup_s']} s, steps {r0['run_s']} s)")
    for res in results:
        print(f"  rank {res['rank']}: {res['collectives']} collectives run in the random steps "
              f"(+{res['warm_collectives']} in the warm-up), {res['checked']} steps run and checked, {res['wrong']} wrong; "
              f"growth {res['growth']}")
        for smp in res["samples"]:
            print(f"    after step {smp['after_step']:5d}: RSS {smp['rss_mib']} MiB, "
                  f"{smp['threads']} threads, {smp['fds']} fds, {smp['shm_maps']} /dev/shm mappings")
    print(f"  steps rank 0 took part in, per collective: {r0['counts']}")
    assert all(res["wrong"] == 0 for res in results)
