"""The collective matrix: every collective x dtype x op x size edge vs. a reference.

Why one spawn per world size: starting ranks costs seconds, so each world
size (1, 2, 3, 4) runs the whole matrix inside one group of processes and the
``Checker`` reports *all* mismatching sub-cases at once, each labelled with
collective, dtype, op, size and root/ranks.

What is asserted (the smdccl contract; gloo stand-in skips are only those
listed in ``harness.GLOO_UNSUPPORTED``):

* every result equals the locally computed reference (exact for integers,
  bool and integer-valued floats; within 16-bit-per-hop rounding for
  fp16/bf16 and ulp-level bounds for fp32/fp64 on random data);
* integer SUM/PRODUCT wrap like torch, float MIN/MAX propagate NaN, bool SUM
  and MAX are OR, PRODUCT and MIN are AND;
* AVG on bool/integer tensors and PREMUL_SUM on non-floats raise ValueError;
* every reduction result is bitwise identical on all ranks (checked over an
  independent gloo group) -- DDP relies on it;
* data movement (broadcast, gathers, scatters, all-to-all, p2p) is bit-exact;
* async works handles: ``get_future().wait()`` returns the outputs,
  ``wait(timeout)`` returns True, several outstanding works complete;
* barrier really synchronizes; subgroups (incl. non-sorted rank order) work;
  object collectives work.

``collective_matrix(compact=True)`` is the reduced matrix reused by
tests/test_topology.py.
"""

from __future__ import annotations

import inspect
import os
import time
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, CPU_SPLIT_UNSUPPORTED, Checker, Skip, backend_supports, run_ranks, unsupported_reason
from reference import (
    DTYPES,
    OP_NAMES,
    Reference,
    assert_equal_bits,
    assert_matches,
    dtype_name,
    is_float,
    make_op,
    op_valid,
    rank_input,
    reduce_reference,
    clear_input_cache,
    with_nans,
)

MEDIUM = 300_007  # > a few hundred KB per rank for every dtype; odd, not divisible by 2, 3 or 4
LARGE_P2P = 4 * 1024 * 1024  # float32 elements: 16 MiB point-to-point message

warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor & co. are deprecated aliases


# ---------------------------------------------------------------------------
# Shared rank-side context
# ---------------------------------------------------------------------------


class Ctx:
    """Per-rank state for one matrix run."""

    def __init__(self, compact: bool):
        warnings.filterwarnings("ignore", category=FutureWarning)
        self.rank = dist.get_rank()
        self.ws = dist.get_world_size()
        self.compact = compact
        self.chk = Checker(f"on rank {self.rank} of {self.ws} (backend {BACKEND})")
        # independent transport for cross-rank bitwise checks of the results
        self.oracle = dist.new_group(backend="gloo")
        if compact:
            self.dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool]
        else:
            self.dtypes = list(DTYPES.values())
        self.sizes = sorted({0, 1, self.ws - 1 if self.ws > 2 else 0, 7, 1001, MEDIUM})
        self._refs: dict = {}

    def tag(self, *parts) -> str:
        return " ".join(str(p) for p in parts) + f" [ws={self.ws}]"

    def needs(self, feature: str) -> None:
        """Raise Skip (counted, gloo only) when the backend lacks ``feature``."""
        if not backend_supports(feature):
            raise Skip(unsupported_reason(feature))

    def ref(self, n: int, dtype, op: str, kind: str, seed: int = 0, ranks=None) -> Reference:
        """Reference of reducing rank_input(r, n, dtype, seed, kind) over ``ranks``."""
        ranks = tuple(range(self.ws)) if ranks is None else tuple(ranks)
        key = (n, dtype, op, kind, seed, ranks)
        if key not in self._refs:
            inputs = [rank_input(r, n, dtype, seed, kind) for r in ranks]
            nr = len(ranks)
            # integer-valued floats are exact, except AVG when dividing by a non-power of 2
            # and PRODUCTs (|x| <= 4) that outgrow the significand (bf16 beyond 4 ranks)
            exact = kind == "int" and not (op == "AVG" and nr & (nr - 1))
            if exact and op == "PRODUCT" and dtype.is_floating_point:
                exact = 4**nr * torch.finfo(dtype).eps <= 2  # 2/eps: the largest exact integer run
            self._refs[key] = reduce_reference(inputs, op, dtype, factor=factor_for(kind), exact=exact)
        return self._refs[key]

    def clear(self) -> None:
        self._refs.clear()
        clear_input_cache()


def factor_for(kind: str) -> float:
    """PREMUL_SUM factor: 2 keeps integer-valued data exact; 0.3 rounds."""
    return 2.0 if kind == "int" else 0.3


def kinds_for(dtype) -> list[str]:
    return ["int", "rand"] if is_float(dtype) else ["int"]


def feature_of(op: str) -> str | None:
    return "premul_sum" if op == "PREMUL_SUM" else None


def flatten(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    out: list[torch.Tensor] = []
    for v in value:
        out.extend(flatten(v))
    return out


def filler(n: int, dtype) -> torch.Tensor:
    """Output buffers start as garbage-looking non-zero data (catches unwritten outputs)."""
    if dtype == torch.bool:
        return torch.ones(n, dtype=dtype)
    return torch.full((n,), 77, dtype=dtype)


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------


def _reductions(ctx: Ctx) -> None:
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    for dtype in ctx.dtypes:
        dn = dtype_name(dtype)
        for kind in kinds_for(dtype):
            for op in OP_NAMES:
                if not op_valid(op, dtype):
                    continue  # see _invalid_ops
                if ctx.compact and kind == "rand" and op in ("MIN", "MAX"):
                    continue
                feat = feature_of(op)
                sizes = ctx.sizes if kind == "int" else [n for n in ctx.sizes if n >= 1001]
                for n in sizes:
                    rop = lambda: make_op(op, factor_for(kind))  # noqa: E731 - fresh op per call

                    desc = ctx.tag("all_reduce", dn, op, f"n={n}", kind)
                    with chk.case(desc):
                        if feat:
                            ctx.needs(feat)
                        ref = ctx.ref(n, dtype, op, kind)
                        t = rank_input(rank, n, dtype, 0, kind).clone()
                        dist.all_reduce(t, op=rop())
                        chk.digest(desc, t)  # before asserting: keeps the digest lists aligned
                        assert_matches(t, ref)

                    # coalesced: the tensor under test plus two small ones
                    desc = ctx.tag("all_reduce_coalesced", dn, op, f"n={n}", kind)
                    with chk.case(desc):
                        if feat:
                            ctx.needs(feat)
                        shapes = [(n, 0), (3, 1), (1, 2)]
                        ts = [rank_input(rank, m, dtype, s, kind).clone() for m, s in shapes]
                        dist.all_reduce_coalesced(ts, op=rop())
                        for (m, _s), t in zip(shapes, ts):
                            chk.digest(desc + f" {m}", t)
                        for (m, s), t in zip(shapes, ts):
                            assert_matches(t, ctx.ref(m, dtype, op, kind, seed=s), f"tensor of {m}")

                    desc = ctx.tag("all_reduce in _coalescing_manager", dn, op, f"n={n}", kind)
                    with chk.case(desc):
                        if feat:
                            ctx.needs(feat)
                        shapes = [(n, 0), (5, 3)]
                        ts = [rank_input(rank, m, dtype, s, kind).clone() for m, s in shapes]
                        with dist._coalescing_manager():
                            for t in ts:
                                dist.all_reduce(t, op=rop())
                        for (m, _s), t in zip(shapes, ts):
                            chk.digest(desc + f" {m}", t)
                        for (m, s), t in zip(shapes, ts):
                            assert_matches(t, ctx.ref(m, dtype, op, kind, seed=s), f"tensor of {m}")

                    for root in range(ws):
                        desc = ctx.tag("reduce", dn, op, f"n={n}", kind, f"root={root}")
                        with chk.case(desc):
                            if feat:
                                ctx.needs(feat)
                            ref = ctx.ref(n, dtype, op, kind)
                            t = rank_input(rank, n, dtype, 0, kind).clone()
                            dist.reduce(t, dst=root, op=rop())
                            if rank == root:
                                assert_matches(t, ref)

                # reduce-scatter: per-rank chunk sizes (input is ws * chunk)
                chunks = sorted({0, 1, 7, 1001, MEDIUM // ws})
                if kind == "rand":
                    chunks = [c for c in chunks if c >= 1001]
                for c in chunks:
                    full = ws * c
                    # The output apart from the input, or the input's own chunk
                    # (in place, as FSDP-style callers do); either way the rest
                    # of the input is left as it was.
                    for own_chunk in (False, True):
                        label = "reduce_scatter_tensor" + (" into its own chunk" if own_chunk else "")
                        with chk.case(ctx.tag(label, dn, op, f"chunk={c}", kind)):
                            if feat:
                                ctx.needs(feat)
                            ref = ctx.ref(full, dtype, op, kind).slice(rank * c, (rank + 1) * c)
                            inp = rank_input(rank, full, dtype, 0, kind).clone()
                            keep = inp.clone()
                            out = inp[rank * c:(rank + 1) * c] if own_chunk else filler(c, dtype)
                            dist.reduce_scatter_tensor(out, inp, op=make_op(op, factor_for(kind)))
                            assert_matches(out, ref)
                            if own_chunk:
                                inp[rank * c:(rank + 1) * c] = keep[rank * c:(rank + 1) * c]
                            assert torch.equal(inp.view(torch.uint8), keep.view(torch.uint8)), (
                                "other chunks changed" if own_chunk else "input changed")

                    desc = ctx.tag("reduce_scatter(list)", dn, op, f"chunk={c}", kind)
                    with chk.case(desc):
                        if feat:
                            ctx.needs(feat)
                        ref = ctx.ref(full, dtype, op, kind).slice(rank * c, (rank + 1) * c)
                        inp = rank_input(rank, full, dtype, 0, kind).clone()
                        out = filler(c, dtype)
                        dist.reduce_scatter(out, [inp[i * c:(i + 1) * c] for i in range(ws)],
                                            op=make_op(op, factor_for(kind)))
                        assert_matches(out, ref)

                    desc = ctx.tag("reduce_scatter(list) uneven", dn, op, f"chunk~{c}", kind)
                    with chk.case(desc):
                        if feat:
                            ctx.needs(feat)
                        # rank j's block has sizes[j] elements (NCCL and gloo allow it)
                        sizes = uneven_blocks(c, ws)
                        starts = [sum(sizes[:j]) for j in range(ws)]
                        total = sum(sizes)
                        ref = ctx.ref(total, dtype, op, kind, seed=3).slice(starts[rank], starts[rank] + sizes[rank])
                        inp = rank_input(rank, total, dtype, 3, kind).clone()
                        out = filler(sizes[rank], dtype)
                        dist.reduce_scatter(out, [inp[starts[j]:starts[j] + sizes[j]] for j in range(ws)],
                                            op=make_op(op, factor_for(kind)))
                        assert_matches(out, ref)

                    desc = ctx.tag("reduce_scatter_tensor in _coalescing_manager", dn, op, f"chunk={c}", kind)
                    with chk.case(desc):
                        if feat:
                            ctx.needs(feat)
                        specs = [(c, 0), (2, 4)]
                        outs = [filler(m, dtype) for m, _ in specs]
                        ins = [rank_input(rank, ws * m, dtype, s, kind).clone() for m, s in specs]
                        with dist._coalescing_manager():
                            for i, o in zip(ins, outs):
                                dist.reduce_scatter_tensor(o, i, op=make_op(op, factor_for(kind)))
                        for (m, s), o, i in zip(specs, outs, ins):
                            ref = ctx.ref(ws * m, dtype, op, kind, seed=s).slice(rank * m, (rank + 1) * m)
                            assert_matches(o, ref, f"output of {m}")
                            assert_equal_bits(i, rank_input(rank, ws * m, dtype, s, kind), f"input of {m}")
        ctx.clear()


def _invalid_ops(ctx: Ctx) -> None:
    """AVG on bool/integers and PREMUL_SUM on non-floats must raise ValueError."""
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    strict = backend_supports("invalid_op_valueerror")
    expected = (ValueError,) if strict else (ValueError, RuntimeError)
    for dtype in ctx.dtypes:
        if is_float(dtype):
            continue
        dn = dtype_name(dtype)
        for op in ("AVG", "PREMUL_SUM"):
            calls = {
                "all_reduce": lambda t: dist.all_reduce(t, op=make_op(op)),
                "all_reduce_coalesced": lambda t: dist.all_reduce_coalesced([t, t[:2].clone()], op=make_op(op)),
                "reduce": lambda t: dist.reduce(t, dst=ws - 1, op=make_op(op)),
                "reduce_scatter_tensor": lambda t: dist.reduce_scatter_tensor(t[:2].clone(), t, op=make_op(op)),
                "reduce_scatter(list)": lambda t: dist.reduce_scatter(
                    t[:2].clone(), [t[2 * i:2 * i + 2] for i in range(ws)], op=make_op(op)),
            }
            for name, call in calls.items():
                desc = ctx.tag(name, dn, op, "must raise ValueError")
                with chk.case(desc):
                    t = rank_input(rank, 2 * ws, dtype).clone()
                    try:
                        call(t)
                    except expected:
                        pass
                    else:
                        raise AssertionError(f"no exception (result {t.tolist()})")
                    if not strict:
                        chk.skip(unsupported_reason("invalid_op_valueerror") + " (RuntimeError accepted)")
    with chk.case(ctx.tag("all_reduce still works after rejected ops")):
        t = torch.full((5,), rank + 1, dtype=torch.int64)
        dist.all_reduce(t)
        assert_matches(t, torch.full((5,), ws * (ws + 1) // 2, dtype=torch.int64))


def _nan(ctx: Ctx) -> None:
    """Float MIN/MAX propagate NaN (a NaN on any rank at a position wins)."""
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    for dtype in ctx.dtypes:
        if not is_float(dtype):
            continue
        dn = dtype_name(dtype)
        for op in ("MIN", "MAX"):
            for n in (7, 1001, MEDIUM):
                inputs = [with_nans(rank_input(r, n, dtype, 9, "rand"), r, ws) for r in range(ws)]
                ref = reduce_reference(inputs, op, dtype)
                desc = ctx.tag("all_reduce NaN", dn, op, f"n={n}")
                with chk.case(desc):
                    ctx.needs("nan_propagation")
                    t = inputs[rank].clone()
                    dist.all_reduce(t, op=make_op(op))
                    chk.digest(desc, t)
                    assert_matches(t, ref)
                desc = ctx.tag("reduce NaN", dn, op, f"n={n}", f"root={ws - 1}")
                with chk.case(desc):
                    ctx.needs("nan_propagation")
                    t = inputs[rank].clone()
                    dist.reduce(t, dst=ws - 1, op=make_op(op))
                    if rank == ws - 1:
                        assert_matches(t, ref)
                c = n // ws
                desc = ctx.tag("reduce_scatter_tensor NaN", dn, op, f"chunk={c}")
                with chk.case(desc):
                    ctx.needs("nan_propagation")
                    out = filler(c, dtype)
                    dist.reduce_scatter_tensor(out, inputs[rank][: c * ws].clone(), op=make_op(op))
                    assert_matches(out, reduce_reference([x[: c * ws] for x in inputs], op, dtype)
                                   .slice(rank * c, (rank + 1) * c))


# ---------------------------------------------------------------------------
# Data movement
# ---------------------------------------------------------------------------


def uneven(src: int, dst: int, n: int, ws: int) -> int:
    """Split size from src to dst: varied, some zero, sums differ per rank."""
    return (n * ((src + 2 * dst + 1) % (ws + 1))) // max(ws, 1)


def uneven_blocks(n: int, ws: int) -> list[int]:
    """Block sizes of an uneven all_gather / reduce_scatter list: all
    different, growing with the rank (0 where n is 0 and the rank even)."""
    return [(n * (j + 1)) // ws + j % 2 for j in range(ws)]


def _data_movement(ctx: Ctx) -> None:
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    for dtype in ctx.dtypes:
        dn = dtype_name(dtype)
        kind = "rand" if is_float(dtype) else "int"

        def inp(r, n, seed):
            return rank_input(r, n, dtype, seed, kind)

        for n in ctx.sizes:
            for root in range(ws):
                desc = ctx.tag("broadcast", dn, f"n={n}", f"root={root}")
                with chk.case(desc):
                    t = inp(root, n, 11).clone() if rank == root else filler(n, dtype)
                    dist.broadcast(t, src=root)
                    assert_equal_bits(t, inp(root, n, 11))

            desc = ctx.tag("all_gather(list)", dn, f"n={n}")
            with chk.case(desc):
                outs = [filler(n, dtype) for _ in range(ws)]
                dist.all_gather(outs, inp(rank, n, 12).clone())
                for j in range(ws):
                    assert_equal_bits(outs[j], inp(j, n, 12), f"slot {j}")

            desc = ctx.tag("all_gather(list) uneven", dn, f"n~{n}")
            with chk.case(desc):
                ctx.needs("all_gather_list_uneven")
                sizes = uneven_blocks(n, ws)
                outs = [filler(sizes[j], dtype) for j in range(ws)]
                dist.all_gather(outs, inp(rank, sizes[rank], 14).clone())
                for j in range(ws):
                    assert_equal_bits(outs[j], inp(j, sizes[j], 14), f"slot {j}")

            desc = ctx.tag("all_gather_into_tensor", dn, f"n={n}")
            with chk.case(desc):
                out = filler(ws * n, dtype)
                dist.all_gather_into_tensor(out, inp(rank, n, 13).clone())
                assert_equal_bits(out, torch.cat([inp(j, n, 13) for j in range(ws)]))

            desc = ctx.tag("all_gather_into_tensor in _coalescing_manager", dn, f"n={n}")
            with chk.case(desc):
                specs = [(n, 14), (3, 15), (1, 16)]
                outs = [filler(ws * m, dtype) for m, _ in specs]
                with dist._coalescing_manager():
                    for (m, s), o in zip(specs, outs):
                        dist.all_gather_into_tensor(o, inp(rank, m, s).clone())
                for (m, s), o in zip(specs, outs):
                    assert_equal_bits(o, torch.cat([inp(j, m, s) for j in range(ws)]), f"output of {ws}x{m}")

            for root in range(ws):
                desc = ctx.tag("gather", dn, f"n={n}", f"root={root}")
                with chk.case(desc):
                    glist = [filler(n, dtype) for _ in range(ws)] if rank == root else None
                    dist.gather(inp(rank, n, 17).clone(), glist, dst=root)
                    if rank == root:
                        for j in range(ws):
                            assert_equal_bits(glist[j], inp(j, n, 17), f"slot {j}")

                desc = ctx.tag("gather_single", dn, f"n={n}", f"root={root}")
                with chk.case(desc):
                    ctx.needs("gather_single")
                    if not hasattr(dist, "gather_single"):
                        raise Skip("torch has no dist.gather_single (added in torch 2.14)")
                    flat = filler(ws * n, dtype) if rank == root else None
                    mine = inp(rank, n, 18).clone()
                    if rank == root and root % 2:  # in place: the input is the root's own block
                        flat[root * n:(root + 1) * n] = mine
                        mine = flat[root * n:(root + 1) * n]
                    dist.gather_single(mine, flat, dst=root)
                    if rank == root:
                        assert_equal_bits(flat, torch.cat([inp(j, n, 18) for j in range(ws)]))

                desc = ctx.tag("scatter", dn, f"n={n}", f"root={root}")
                with chk.case(desc):
                    slist = [inp(root, n, 300 + j).clone() for j in range(ws)] if rank == root else None
                    out = filler(n, dtype)
                    dist.scatter(out, slist, src=root)
                    assert_equal_bits(out, inp(root, n, 300 + rank))

            per = n if n < MEDIUM else MEDIUM // ws
            desc = ctx.tag("all_to_all(list) even", dn, f"n={per}")
            with chk.case(desc):
                outs = [filler(per, dtype) for _ in range(ws)]
                dist.all_to_all(outs, [inp(rank, per, 100 + j).clone() for j in range(ws)])
                for j in range(ws):
                    assert_equal_bits(outs[j], inp(j, per, 100 + rank), f"from rank {j}")

            desc = ctx.tag("all_to_all(list) uneven", dn, f"n={per}")
            with chk.case(desc):
                ctx.needs("all_to_all_list_uneven")
                outs = [filler(uneven(j, rank, per, ws), dtype) for j in range(ws)]
                dist.all_to_all(outs, [inp(rank, uneven(rank, j, per, ws), 150 + j).clone() for j in range(ws)])
                for j in range(ws):
                    assert_equal_bits(outs[j], inp(j, uneven(j, rank, per, ws), 150 + rank), f"from rank {j}")

            desc = ctx.tag("all_to_all_single even", dn, f"n={per}")
            with chk.case(desc):
                out = filler(ws * per, dtype)
                dist.all_to_all_single(out, torch.cat([inp(rank, per, 200 + j) for j in range(ws)]))
                assert_equal_bits(out, torch.cat([inp(j, per, 200 + rank) for j in range(ws)]))

            desc = ctx.tag("all_to_all_single uneven splits", dn, f"n~{per}")
            with chk.case(desc):
                in_splits = [uneven(rank, j, per, ws) for j in range(ws)]
                out_splits = [uneven(j, rank, per, ws) for j in range(ws)]
                out = filler(sum(out_splits), dtype)
                src = torch.cat([inp(rank, in_splits[j], 250 + j) for j in range(ws)])
                dist.all_to_all_single(out, src, output_split_sizes=out_splits, input_split_sizes=in_splits)
                assert_equal_bits(out, torch.cat([inp(j, out_splits[j], 250 + rank) for j in range(ws)]),
                                  f"in_splits={in_splits} out_splits={out_splits}")
        ctx.clear()


# ---------------------------------------------------------------------------
# Point-to-point
# ---------------------------------------------------------------------------


def _p2p(ctx: Ctx) -> None:
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    if ws < 2:
        return
    right, left = (rank + 1) % ws, (rank - 1) % ws
    for dtype in ctx.dtypes:
        dn = dtype_name(dtype)
        kind = "rand" if is_float(dtype) else "int"
        for n in (0, 1, 1001, MEDIUM):
            desc = ctx.tag("isend/irecv ring both directions, tags", dn, f"n={n}")
            with chk.case(desc):
                from_left, from_right = filler(n, dtype), filler(n, dtype)
                # receives posted first and in the "wrong" order: matching is by (peer, tag)
                works = [
                    dist.irecv(from_right, src=right, tag=2),
                    dist.irecv(from_left, src=left, tag=1),
                    dist.isend(rank_input(rank, n, dtype, 400 + right, kind).clone(), dst=right, tag=1),
                    dist.isend(rank_input(rank, n, dtype, 500 + left, kind).clone(), dst=left, tag=2),
                ]
                for w in works:
                    w.wait()
                assert_equal_bits(from_left, rank_input(left, n, dtype, 400 + rank, kind), f"from left {left}")
                assert_equal_bits(from_right, rank_input(right, n, dtype, 500 + rank, kind), f"from right {right}")

        desc = ctx.tag("blocking send/recv 0<->1", dn)
        with chk.case(desc):
            n = 777
            if rank in (0, 1):
                peer = 1 - rank
                got = filler(n, dtype)
                mine = rank_input(rank, n, dtype, 600, kind).clone()
                if rank == 0:
                    dist.send(mine, dst=peer)
                    dist.recv(got, src=peer)
                else:
                    dist.recv(got, src=peer)
                    dist.send(mine, dst=peer)
                assert_equal_bits(got, rank_input(peer, n, dtype, 600, kind))

    with chk.case(ctx.tag("irecv posted in reverse tag order; same-tag messages stay FIFO")):
        if rank == 0:
            works = [dist.isend(torch.full((10,), float(tag)), dst=1, tag=tag) for tag in (5, 6, 7)]
            works += [dist.isend(torch.full((3,), float(100 + i)), dst=1, tag=9) for i in range(3)]
            for w in works:
                w.wait()
        elif rank == 1:
            bufs = {tag: torch.zeros(10) for tag in (7, 5, 6)}
            works = [dist.irecv(bufs[tag], src=0, tag=tag) for tag in (7, 5, 6)]
            fifo = [torch.zeros(3) for _ in range(3)]
            works += [dist.irecv(b, src=0, tag=9) for b in fifo]
            for w in works:
                w.wait()
            for tag, b in bufs.items():
                assert_matches(b, torch.full((10,), float(tag)), f"tag {tag}")
            for i, b in enumerate(fifo):
                assert_matches(b, torch.full((3,), float(100 + i)), f"tag 9 message {i}")

    with chk.case(ctx.tag("batch_isend_irecv (pipeline parallelism's exchange), both directions")):
        # torch runs the batch as isend/irecv inside a coalescing manager;
        # each rank sends to both neighbours and receives from both.
        n = 1001
        from_left, from_right = torch.zeros(n), torch.zeros(n, dtype=torch.float64)
        ops = [
            dist.P2POp(dist.isend, rank_input(rank, n, torch.float32, 700 + right).clone(), right),
            dist.P2POp(dist.isend, rank_input(rank, n, torch.float64, 800 + left).clone(), left),
            dist.P2POp(dist.irecv, from_left, left),
            dist.P2POp(dist.irecv, from_right, right),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert_equal_bits(from_left, rank_input(left, n, torch.float32, 700 + rank), f"from left {left}")
        assert_equal_bits(from_right, rank_input(right, n, torch.float64, 800 + rank), f"from right {right}")

    with chk.case(ctx.tag("large isend/irecv both directions", f"{LARGE_P2P * 4 >> 20} MiB float32")):
        mine = torch.arange(LARGE_P2P, dtype=torch.float32) + rank * 1e6
        a, b = torch.empty(LARGE_P2P), torch.empty(LARGE_P2P)
        works = [dist.isend(mine, dst=right, tag=3), dist.isend(mine, dst=left, tag=4),
                 dist.irecv(a, src=left, tag=3), dist.irecv(b, src=right, tag=4)]
        for w in works:
            w.wait()
        assert_equal_bits(a, torch.arange(LARGE_P2P, dtype=torch.float32) + left * 1e6, "from left")
        assert_equal_bits(b, torch.arange(LARGE_P2P, dtype=torch.float32) + right * 1e6, "from right")


# ---------------------------------------------------------------------------
# Async work handles, barrier
# ---------------------------------------------------------------------------


def _async(ctx: Ctx) -> None:
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    dt = torch.float32

    with chk.case(ctx.tag("all_reduce async_op=True: future value, wait(timeout)")):
        n = MEDIUM
        t = rank_input(rank, n, dt).clone()
        work = dist.all_reduce(t, async_op=True)
        value = work.get_future().wait()
        assert isinstance(value, list) and len(value) == 1, f"future value {type(value)} {value!r:.200}"
        ref = ctx.ref(n, dt, "SUM", "int")
        assert_matches(value[0], ref, "future value")
        assert_matches(t, ref, "in-place tensor")
        assert work.wait(timeout=timedelta(seconds=60)) is True
        assert work.is_completed()
        t2 = rank_input(rank, 1001, dt).clone()
        w2 = dist.all_reduce(t2, op=dist.ReduceOp.MAX, async_op=True)
        assert w2.wait(timeout=timedelta(seconds=60)) is True, "wait(timeout) must return True"
        assert_matches(t2, ctx.ref(1001, dt, "MAX", "int"))

    with chk.case(ctx.tag("several outstanding async all_reduces, waited in reverse order")):
        specs = [(MEDIUM, torch.float32, "SUM"), (7, torch.int64, "PRODUCT"),
                 (1001, torch.bfloat16, "MAX"), (0, torch.float64, "SUM"), (50_000, torch.uint8, "MIN")]
        ts = [rank_input(rank, n, d).clone() for n, d, _ in specs]
        works = [dist.all_reduce(t, op=make_op(o), async_op=True) for t, (_, _, o) in zip(ts, specs)]
        for w in reversed(works):
            w.wait()
        for t, (n, d, o) in zip(ts, specs):
            assert_matches(t, ctx.ref(n, d, o, "int"), f"{dtype_name(d)} {o} n={n}")

    def check_future(work, expected: list[torch.Tensor], what: str):
        """The future's value holds the outputs: compared as one concatenation, since a
        backend may hand back one output tensor or its per-rank chunks (gloo)."""
        value = work.get_future().wait()
        assert isinstance(value, list), f"{what}: future value is {type(value).__name__}, expected a list"
        got = flatten(value)
        assert got, f"{what}: future value is an empty list"
        assert_equal_bits(torch.cat([g.reshape(-1) for g in got]), torch.cat([e.reshape(-1) for e in expected]),
                          f"{what}: future value")

    with chk.case(ctx.tag("broadcast async future")):
        t = rank_input(0, 1001, dt, 20).clone() if rank == 0 else filler(1001, dt)
        check_future(dist.broadcast(t, src=0, async_op=True), [rank_input(0, 1001, dt, 20)], "broadcast")

    with chk.case(ctx.tag("all_gather(list) async future")):
        outs = [filler(101, dt) for _ in range(ws)]
        w = dist.all_gather(outs, rank_input(rank, 101, dt, 21).clone(), async_op=True)
        check_future(w, [rank_input(j, 101, dt, 21) for j in range(ws)], "all_gather")

    with chk.case(ctx.tag("all_gather_into_tensor async future")):
        out = filler(ws * 1001, dt)
        w = dist.all_gather_into_tensor(out, rank_input(rank, 1001, dt, 22).clone(), async_op=True)
        check_future(w, [torch.cat([rank_input(j, 1001, dt, 22) for j in range(ws)])], "all_gather_into_tensor")

    with chk.case(ctx.tag("reduce_scatter_tensor async future")):
        ctx.needs("reduce_scatter_future")
        out = filler(1001, dt)
        w = dist.reduce_scatter_tensor(out, rank_input(rank, ws * 1001, dt, 23).clone(), async_op=True)
        ref = ctx.ref(ws * 1001, dt, "SUM", "int", seed=23).slice(rank * 1001, (rank + 1) * 1001)
        check_future(w, [ref.value.to(dt)], "reduce_scatter_tensor")

    with chk.case(ctx.tag("all_to_all_single async future")):
        out = filler(ws * 5, dt)
        w = dist.all_to_all_single(out, torch.cat([rank_input(rank, 5, dt, 30 + j) for j in range(ws)]),
                                   async_op=True)
        check_future(w, [torch.cat([rank_input(j, 5, dt, 30 + rank) for j in range(ws)])], "all_to_all_single")

    ctx.clear()


def _barrier(ctx: Ctx) -> None:
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank
    with chk.case(ctx.tag("barrier waits for the slowest rank")):
        dist.barrier()
        delay = 1.0
        t0 = time.monotonic()
        if rank == 0:
            time.sleep(delay)
        dist.barrier()
        waited = time.monotonic() - t0
        if ws > 1:
            assert waited >= delay * 0.5, f"barrier returned after {waited:.3f} s; rank 0 arrived after {delay} s"
    with chk.case(ctx.tag("barrier x20")):
        for _ in range(20):
            dist.barrier()


# ---------------------------------------------------------------------------
# Subgroups and object collectives
# ---------------------------------------------------------------------------


def subgroup_specs(ws: int) -> list[tuple[list[int], bool]]:
    """(ranks in group-rank order, sort_ranks) for every group created."""
    return {
        1: [([0], True)],
        2: [([1], True), ([1, 0], False)],
        3: [([0, 2], True), ([2, 1, 0], False)],
        4: [([0, 2], True), ([1, 3], True), ([3, 2, 1, 0], False), ([3, 1], False)],
    }[ws]


def split_specs(ws: int) -> list[tuple[int | None, list[list[int]]]]:
    """(index of the parent among the groups made before, or None for the
    world; split_ranks in the parent's ranks) for each dist.split_group call."""
    return {
        1: [(None, [[0]])],
        2: [(None, [[1, 0]]), (None, [[1]]), (0, [[1]])],
        3: [(None, [[0, 2], [1]]), (None, [[2, 1, 0]]), (1, [[2, 0]])],
        # [[0,2],[1,3]]: two children of one call, run concurrently
        4: [(None, [[0, 2], [1, 3]]), (None, [[3, 2, 1, 0]]), (None, [[3, 1]]), (1, [[1, 0], [3, 2]])],
    }[ws]


# torch features younger than the oldest torch smdccl supports (2.11): where the
# running torch lacks one, the sub-cases that need it are skipped and reported.
NEW_GROUP_SORTS = "sort_ranks" in inspect.signature(dist.new_group).parameters
NO_SORT_RANKS = "torch's new_group has no sort_ranks (older torch): unsorted groups not made"


def _subgroups(ctx: Ctx) -> None:
    groups = []
    for ranks, sort in subgroup_specs(ctx.ws):
        if not NEW_GROUP_SORTS:
            if not sort:
                ctx.chk.skip(NO_SORT_RANKS)
                continue
            groups.append((ranks, dist.new_group(ranks=ranks)))
            continue
        groups.append((ranks, dist.new_group(ranks=ranks, sort_ranks=sort)))
    # [0,2] and [1,3] (ws=4) run concurrently: each rank walks its own groups
    for ranks, g in groups:
        _check_subgroup(ctx, ranks, g, f"group {ranks}")
    ctx.clear()


def _split_groups(ctx: Ctx) -> None:
    """dist.split_group (what DeviceMesh uses once the default group is bound
    to a device): every child runs the subgroup checks."""
    if CPU_SPLIT_UNSUPPORTED:
        ctx.chk.skip(CPU_SPLIT_UNSUPPORTED)
        return
    made = []  # (global ranks in child-rank order, or None where not a member; group)
    for parent_index, split_ranks in split_specs(ctx.ws):
        parent_ranks, parent = (list(range(ctx.ws)), None) if parent_index is None else made[parent_index]
        g = dist.split_group(parent_pg=parent, split_ranks=split_ranks)
        parts = [[parent_ranks[r] for r in part] for part in split_ranks]  # in global ranks
        mine = next((part for part in parts if ctx.rank in part), None)
        made.append((mine, g))
        label = f"split_group {split_ranks} of {'world' if parent is None else parent_ranks}"
        if mine is None:
            with ctx.chk.case(ctx.tag(label, "non-member gets NON_GROUP_MEMBER")):
                assert g is dist.GroupMember.NON_GROUP_MEMBER, f"got {g}"
            continue
        _check_subgroup(ctx, mine, g, f"{label} -> {mine}")
    ctx.clear()


def _check_subgroup(ctx: Ctx, ranks: list[int], g, label: str) -> None:
    """Every collective on group `g` of global `ranks` (in group-rank order)
    against the reference; a non-member only checks that it is one."""
    chk, rank = ctx.chk, ctx.rank
    if rank not in ranks:
        with chk.case(ctx.tag(label, "non-member sees rank -1")):
            assert dist.get_rank(g) == -1, f"get_rank(group) = {dist.get_rank(g)}"
        return
    gsize, grank = len(ranks), ranks.index(rank)
    with chk.case(ctx.tag(label, "group rank / size")):
        assert dist.get_rank(g) == grank, f"get_rank = {dist.get_rank(g)}, expected {grank}"
        assert dist.get_world_size(g) == gsize
        assert sorted(dist.get_process_group_ranks(g)) == sorted(ranks)
        for i, r in enumerate(ranks):
            assert dist.get_global_rank(g, i) == r, f"group rank {i} is global {dist.get_global_rank(g, i)}"

    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        dn = dtype_name(dtype)
        for n in (0, 7, 1001, MEDIUM):
            for op in ("SUM", "MAX") if dtype != torch.bool else ("MIN",):
                desc = ctx.tag(label, "all_reduce", dn, op, f"n={n}")
                with chk.case(desc):
                    t = rank_input(rank, n, dtype).clone()
                    dist.all_reduce(t, op=make_op(op), group=g)
                    assert_matches(t, ctx.ref(n, dtype, op, "int", ranks=ranks))
            for src in sorted({0, gsize - 1}):
                desc = ctx.tag(label, "broadcast", dn, f"n={n}", f"group_src={src}")
                with chk.case(desc):
                    owner = ranks[src]
                    t = rank_input(owner, n, dtype, 40).clone() if rank == owner else filler(n, dtype)
                    dist.broadcast(t, group=g, group_src=src)
                    assert_equal_bits(t, rank_input(owner, n, dtype, 40))
            desc = ctx.tag(label, "all_gather_into_tensor", dn, f"n={n}")
            with chk.case(desc):
                out = filler(gsize * n, dtype)
                dist.all_gather_into_tensor(out, rank_input(rank, n, dtype, 41).clone(), group=g)
                assert_equal_bits(out, torch.cat([rank_input(r, n, dtype, 41) for r in ranks]),
                                  "chunks must be in group-rank order")
        c = 333
        desc = ctx.tag(label, "reduce_scatter_tensor float32 SUM", f"chunk={c}")
        with chk.case(desc):
            out = filler(c, torch.float32)
            dist.reduce_scatter_tensor(out, rank_input(rank, gsize * c, torch.float32, 42).clone(), group=g)
            ref = ctx.ref(gsize * c, torch.float32, "SUM", "int", seed=42, ranks=ranks)
            assert_matches(out, ref.slice(grank * c, (grank + 1) * c))
    desc = ctx.tag(label, "reduce float32 SUM to group_dst=0")
    with chk.case(desc):
        t = rank_input(rank, 1001, torch.float32, 43).clone()
        dist.reduce(t, group=g, group_dst=0)
        if grank == 0:
            assert_matches(t, ctx.ref(1001, torch.float32, "SUM", "int", seed=43, ranks=ranks))
    desc = ctx.tag(label, "gather to last group rank / scatter from it")
    with chk.case(desc):
        last = gsize - 1
        glist = [filler(9, torch.int32) for _ in ranks] if grank == last else None
        dist.gather(rank_input(rank, 9, torch.int32, 44).clone(), glist, group=g, group_dst=last)
        if grank == last:
            for i, r in enumerate(ranks):
                assert_equal_bits(glist[i], rank_input(r, 9, torch.int32, 44), f"slot {i} (rank {r})")
        slist = [rank_input(rank, 9, torch.int32, 45 + i).clone() for i in range(gsize)] if grank == last else None
        out = filler(9, torch.int32)
        dist.scatter(out, slist, group=g, group_src=last)
        assert_equal_bits(out, rank_input(ranks[last], 9, torch.int32, 45 + grank))
    desc = ctx.tag(label, "all_to_all_single float64")
    with chk.case(desc):
        out = filler(gsize * 4, torch.float64)
        dist.all_to_all_single(out, torch.cat([rank_input(rank, 4, torch.float64, 46 + j) for j in range(gsize)]),
                               group=g)
        assert_equal_bits(out, torch.cat([rank_input(r, 4, torch.float64, 46 + grank) for r in ranks]))
    if gsize >= 2:
        desc = ctx.tag(label, "send/recv group rank 0 -> last (group_dst/group_src)")
        with chk.case(desc):
            payload = rank_input(ranks[0], 1001, torch.float32, 47)
            if grank == 0:
                dist.send(payload.clone(), group=g, group_dst=gsize - 1)
            elif grank == gsize - 1:
                got = filler(1001, torch.float32)
                dist.recv(got, group=g, group_src=0)
                assert_equal_bits(got, payload)
    with chk.case(ctx.tag(label, "barrier")):
        dist.barrier(group=g)
    with chk.case(ctx.tag(label, "broadcast_object_list / all_gather_object")):
        objs = [{"from": ranks[0], "blob": b"x" * 5000}, "s", None] if grank == 0 else [None] * 3
        dist.broadcast_object_list(objs, group=g, group_src=0)
        assert objs == [{"from": ranks[0], "blob": b"x" * 5000}, "s", None], f"got {objs!r:.200}"
        got = [None] * gsize
        dist.all_gather_object(got, {"rank": rank}, group=g)
        assert got == [{"rank": r} for r in ranks], f"got {got}"


def _objects(ctx: Ctx) -> None:
    chk, ws, rank = ctx.chk, ctx.ws, ctx.rank

    def obj_of(r):
        return {"rank": r, "list": list(range(r * 10)), "big": bytes([r % 256]) * (1 << 20), "t": ("x", r)}

    for root in range(ws):
        with chk.case(ctx.tag("broadcast_object_list", f"root={root}")):
            objs = [obj_of(root), f"hello {root}", None] if rank == root else [None, None, 42]
            dist.broadcast_object_list(objs, src=root)
            assert objs == [obj_of(root), f"hello {root}", None], "broadcast objects differ"
    with chk.case(ctx.tag("all_gather_object")):
        got = [None] * ws
        dist.all_gather_object(got, {"rank": rank, "pad": "y" * (rank * 1000)})
        assert got == [{"rank": r, "pad": "y" * (r * 1000)} for r in range(ws)], f"got {got!r:.300}"


# ---------------------------------------------------------------------------
# Rank entry point and the pytest tests
# ---------------------------------------------------------------------------


SECTIONS = {
    "reductions": _reductions,
    "invalid_ops": _invalid_ops,
    "nan": _nan,
    "data_movement": _data_movement,
    "p2p": _p2p,
    "async": _async,
    "barrier": _barrier,
    "subgroups": _subgroups,
    "split_groups": _split_groups,
    "objects": _objects,
}


def selected_sections() -> list[str] | None:
    """SMDCCL_TEST_SECTIONS=p2p,async runs only those sections (debugging aid)."""
    raw = os.environ.get("SMDCCL_TEST_SECTIONS", "").strip()
    if not raw:
        return None
    names = [s.strip() for s in raw.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown SMDCCL_TEST_SECTIONS {unknown}; known: {sorted(SECTIONS)}")
    return names


def collective_matrix(compact: bool = False, sections: list[str] | None = None) -> dict:
    """Rank function: run the sections (all by default), then the cross-rank bitwise check."""
    ctx = Ctx(compact)
    for name in sections or list(SECTIONS):
        fn = SECTIONS[name]
        with ctx.chk.section(name):
            try:
                fn(ctx)
            except Exception as exc:  # noqa: BLE001 - a crash outside any sub-case is one more failure
                ctx.chk._fail(f"section {name} crashed", f"{type(exc).__name__}: {exc}")
    with ctx.chk.section("cross-rank bitwise"):
        ctx.chk.compare_digests(ctx.oracle)
    return ctx.chk.finish()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collective_matrix(world_size):
    t0 = time.monotonic()
    results = run_ranks(world_size, collective_matrix, False, selected_sections(), timeout=420)
    s = results[0]
    print(f"\n[{BACKEND} ws={world_size}] {s['cases']} sub-cases in {time.monotonic() - t0:.1f} s; "
          f"skipped {s['skipped']}; section timings {s['timings']}")
