"""all_reduce of sparse COO tensors, as gloo offers it.

Why: DDP with ``nn.Embedding(sparse=True)`` (and any code that all_reduces
``tensor.to_sparse()``) sends sparse gradients through ``all_reduce``; a
backend that refuses them breaks that code where gloo runs it.

What: every rank passes a sparse tensor of the same shape holding its own
entries -- different counts (none on some ranks), indices repeated within a
rank (uncoalesced input) and shared across ranks. The result must be
coalesced, hold exactly the union of the ranks' indices, and densify to the
float64 / exact-integer reference sum (AVG: divided by the world size);
every rank must hold the same bits. Sparse and dense dims (1-D, embedding
rows, two sparse dims), 8 dtypes, async work and its future, flat groups of
2 and 3 ranks and a two-level 2x2 topology. Bad input (smdccl only): ops
other than SUM/AVG, AVG on integers, shapes that disagree between ranks
(every rank raises naming each rank's shape; the group goes on), the NaN
check. DDP with a sparse embedding against gloo: tests/test_ddp.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, IS_SMDCCL, Checker, Skip, backend_supports, run_ranks, unsupported_reason
from reference import Reference, is_float, mismatch

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int64, torch.int32, torch.int8, torch.uint8)
# (name, shape, sparse_dim, entries per rank before duplicates)
SHAPES = (
    ("1-D", (50,), 1, 12),
    ("embedding rows", (30, 4), 1, 9),
    ("two sparse dims", (6, 5, 3), 2, 7),
    ("large", (20000, 16), 1, 3000),
)


def _sparse_input(rank: int, shape, sparse_dim: int, entries: int, dtype, seed: int,
                  empty_on: tuple = ()) -> torch.Tensor:
    """Rank ``rank``'s input: ``entries`` random indices plus a third of them
    repeated (uncoalesced), small integer-valued values (exact in every dtype
    when single; sums round only in fp16/bf16)."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    n = 0 if rank in empty_on else entries + rank  # counts differ between ranks
    idx = torch.stack([torch.randint(0, shape[d], (n,), generator=g) for d in range(sparse_dim)])
    idx = torch.cat([idx, idx[:, : n // 3]], dim=1)  # repeats within the rank
    vals = torch.randint(-8, 9, (idx.shape[1], *shape[sparse_dim:]), generator=g)
    if dtype == torch.uint8:
        vals = vals.abs()
    return torch.sparse_coo_tensor(idx, vals.to(dtype), shape)


def _reference(inputs: list[torch.Tensor], dtype, average: bool) -> tuple[Reference, torch.Tensor]:
    """The dense reference sum (float64 / int64 then wrapped) and the sorted union of indices."""
    wide = torch.float64 if is_float(dtype) else torch.int64
    dense = [torch.sparse_coo_tensor(t._indices(), t._values().to(wide), t.shape).to_dense() for t in inputs]
    value = torch.stack(dense).sum(0)
    terms = 0
    if is_float(dtype):
        mag = torch.stack([torch.sparse_coo_tensor(t._indices(), t._values().to(wide).abs(), t.shape).to_dense()
                           for t in inputs]).sum(0)
        terms = sum(t._nnz() for t in inputs)  # generous: every entry might share one index
        if average:
            value, mag = value / len(inputs), mag / len(inputs)
        ref = Reference(value.reshape(-1), mag.reshape(-1), max(terms, 1), dtype)
    else:
        ref = Reference(value.to(dtype).reshape(-1), None, len(inputs), dtype)
    union = torch.cat([t.coalesce()._indices() for t in inputs], dim=1)
    union = torch.unique(union, dim=1) if union.numel() else union
    return ref, union


def _check(out: torch.Tensor, inputs: list[torch.Tensor], dtype, average: bool) -> None:
    assert out.is_sparse, f"result layout {out.layout}"
    assert out.is_coalesced(), "result is not coalesced"
    assert out.shape == inputs[0].shape and out.dtype == dtype, (out.shape, out.dtype)
    ref, union = _reference(inputs, dtype, average)
    got = out._indices()
    assert got.shape == union.shape and torch.equal(got, union), (
        f"indices: got {got.shape[1]} entries, the union of the ranks' indices has {union.shape[1]}")
    problem = mismatch(out.to_dense().reshape(-1), ref)
    assert problem is None, problem


def sparse_matrix() -> dict:
    warnings.filterwarnings("ignore", message=".*sparse.*")
    rank, ws = dist.get_rank(), dist.get_world_size()
    chk = Checker(f"(sparse all_reduce, {BACKEND}, {ws} ranks)")
    gloo = dist.new_group(backend="gloo")  # an independent transport for the bitwise check
    seed = 0
    for dtype in DTYPES:
        ops = ("SUM", "AVG") if is_float(dtype) else ("SUM",)
        for name, shape, sparse_dim, entries in SHAPES:
            if name == "large" and dtype not in (torch.float32, torch.int64):
                continue
            for op in ops:
                for empty_on in ((), (1,), tuple(range(ws))):
                    seed += 1
                    inputs = [_sparse_input(r, shape, sparse_dim, entries, dtype, seed, empty_on)
                              for r in range(ws)]
                    desc = f"{dtype} {name} {op} empty on {list(empty_on)}"
                    with chk.case(desc):
                        for feature, needed in (("sparse_avg", op == "AVG"),
                                                ("sparse_float16", dtype == torch.float16)):
                            if needed and not backend_supports(feature):
                                raise Skip(unsupported_reason(feature))
                        t = inputs[rank].clone()
                        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                        chk.digest(desc + " indices", t._indices())
                        chk.digest(desc + " values", t._values())
                        _check(t, inputs, dtype, op == "AVG")
    # async: the work's future holds the reduced tensor itself
    inputs = [_sparse_input(r, (40, 3), 1, 10, torch.float32, 999) for r in range(ws)]
    with chk.case("async_op: wait() and the future"):
        t = inputs[rank].clone()
        work = dist.all_reduce(t, async_op=True)
        assert work.wait()
        value = work.get_future().value()
        got = value[0] if isinstance(value, list) else value
        assert got is t or torch.equal(got.to_dense(), t.to_dense()), "future value differs from the tensor"
        _check(t, inputs, torch.float32, False)
    # a dense all_reduce after all of it: the group is in step
    with chk.case("dense all_reduce after the sparse ones"):
        x = torch.full((5,), float(rank + 1))
        dist.all_reduce(x)
        assert x.tolist() == [ws * (ws + 1) / 2] * 5, x.tolist()
    chk.compare_digests(gloo)
    return chk.finish()


@pytest.mark.parametrize("ws,topology", [(2, None), (3, None), (4, "2x2")],
                         ids=["2 ranks", "3 ranks", "2x2 nodes"])
def test_sparse_all_reduce_matches_reference(ws, topology):
    if topology and not IS_SMDCCL:
        pytest.skip("SMDCCL_TOPOLOGY is smdccl's")
    env = {"SMDCCL_TOPOLOGY": topology} if topology else None
    res = run_ranks(ws, sparse_matrix, env=env, timeout=300)
    print(f"\n[{BACKEND}] sparse all_reduce, {ws} ranks: {res[0]['cases']} cases")


def sparse_bad_input() -> dict:
    warnings.filterwarnings("ignore", message=".*sparse.*")
    rank = dist.get_rank()
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "no error"
        except Exception as exc:  # noqa: BLE001 - the type is checked by the test
            out[name] = f"{type(exc).__name__}: {exc}"
        x = torch.full((3,), float(rank + 1))
        dist.all_reduce(x)  # the group still works
        out[name + " after"] = x.tolist()

    s = torch.ones(4).to_sparse()
    attempt("max", lambda: dist.all_reduce(s.clone(), op=dist.ReduceOp.MAX))
    attempt("avg int", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64).to_sparse(),
                                               op=dist.ReduceOp.AVG))
    attempt("int16", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16).to_sparse()))
    attempt("csr", lambda: dist.all_reduce(torch.eye(3).to_sparse_csr()))
    attempt("coalesced list", lambda: dist.all_reduce_coalesced([s.clone(), s.clone()]))
    attempt("all_gather", lambda: dist.all_gather_into_tensor(torch.empty(8), s.clone()))
    # shapes that disagree: each rank makes a call valid on its own
    attempt("sizes", lambda: dist.all_reduce(torch.ones(5 + rank).to_sparse()))
    attempt("split", lambda: dist.all_reduce(torch.ones(4, 3).to_sparse(1 if rank == 0 else 2)))
    nan = torch.sparse_coo_tensor(torch.tensor([[1, 2]]), torch.tensor([1.0, float("nan") if rank else 2.0]), (4,))
    attempt("nan", lambda: dist.all_reduce(nan.clone()))
    t = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([1.0]), (4,))
    dist.all_reduce(t)
    out["ok"] = t.to_dense().tolist()
    # a leaf that requires grad (an embedding weight's own tensor): legal, as for dense
    leaf = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([1.0]), (4,)).requires_grad_()
    attempt("requires grad", lambda: dist.all_reduce(leaf))
    out["requires grad value"] = leaf.detach().to_dense().tolist()
    # fp16 AVG scales before the sum, as the dense path does: 40000 + 40000 fits once halved
    big = torch.sparse_coo_tensor(torch.tensor([[2]]), torch.tensor([40000.0], dtype=torch.float16), (4,))
    attempt("fp16 avg", lambda: dist.all_reduce(big, op=dist.ReduceOp.AVG))
    out["fp16 avg value"] = big.to_dense().tolist()
    # the NaN check sees the values when the op runs: the second async op's
    # input is the first one's inf result
    x = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([60000.0], dtype=torch.float16), (4,))
    first, second = dist.all_reduce(x, async_op=True), dist.all_reduce(x, async_op=True)
    first.wait()
    attempt("nan async", second.wait)
    return out


@pytest.mark.smdccl_only  # the messages asserted are smdccl's
def test_sparse_bad_input_raises_and_the_group_goes_on():
    res = run_ranks(2, sparse_bad_input, env={"SMDCCL_NAN_CHECK": "1"}, timeout=120)
    expect = {
        "max": ("ValueError", "SUM and ReduceOp.AVG", "to_dense"),
        "avg int": ("ValueError", "AVG needs a floating-point tensor"),
        "int16": ("ValueError", "does not support dtype"),
        "csr": ("NotImplementedError", "SparseCsrCPU"),  # torch's dispatcher refuses it first
        "coalesced list": ("NotImplementedError", "allreduce_coalesced_"),  # torch refuses it
        "all_gather": ("NotImplementedError", "_allgather_base_"),  # torch refuses it
        "sizes": ("ValueError", "same shape", "rank 0: [5] (sparse_dim 1, dense_dim 0)",
                  "rank 1: [6] (sparse_dim 1, dense_dim 0)"),
        "split": ("ValueError", "rank 0: [4, 3] (sparse_dim 1, dense_dim 1)",
                  "rank 1: [4, 3] (sparse_dim 2, dense_dim 0)"),
        "nan": ("ValueError", "SMDCCL_NAN_CHECK", "rank(s) 1"),
        "requires grad": ("no error",),
        "fp16 avg": ("no error",),
        "nan async": ("ValueError", "SMDCCL_NAN_CHECK", "rank(s) 0, 1"),
    }
    for rank, got in enumerate(res):
        for name, says in expect.items():
            assert all(s in got[name] for s in says), (rank, name, got[name])
            assert got[name + " after"] == [3.0] * 3, (rank, name, got[name + " after"])
        assert got["ok"] == [1.0, 1.0, 0.0, 0.0], (rank, got["ok"])
        assert got["requires grad value"] == [1.0, 1.0, 0.0, 0.0], (rank, got)
        assert got["fp16 avg value"] == [0.0, 0.0, 40000.0, 0.0], (rank, got)
