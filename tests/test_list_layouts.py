"""Every list-taking collective takes torch's layout; the transpose is refused.

Why: torch documents one layout per list-taking call and gloo and NCCL take
exactly that one. ``all_gather_coalesced(output_tensor_lists, input_tensor_list)``
fills ``output_tensor_lists[r][i]`` with rank r's ``input_tensor_list[i]``
(one list per rank); smdccl once expected the transpose (one list per input)
and refused torch's own docstring example. A backend that takes a layout
other than torch's breaks code written for gloo or NCCL; one that silently
accepts the transpose hands back data in the wrong slots.

What (2 and 3 ranks, one spawn each): with inputs whose shapes and values
differ per input and per rank, so that any slot mix-up shows,

* all_gather_coalesced (torch's docstring example at 2 ranks, float32 /
  int64 / complex64, async, a subgroup): every slot against the expected
  tensors, and bit for bit against the same call on a gloo group of the
  same ranks;
* allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced (the
  ProcessGroup methods and all_gather_into_tensor / reduce_scatter_tensor
  inside ``_coalescing_manager``), reduce_scatter with a list, all_to_all
  with lists (uneven), gather and scatter lists: against the expected
  tensors;
* transposed or mis-shaped lists (all_gather_coalesced one list per input,
  pg.allgather / pg.reduce_scatter / pg.gather / pg.scatter given one list
  per rank, the coalesced tensor calls given one output per rank): ValueError
  at the call saying which layout torch uses, and the group still works.

gloo serves as the reference of the layout; the refusal messages are
smdccl's: smdccl only.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import Checker, run_ranks
from reference import assert_equal_bits

pytestmark = pytest.mark.smdccl_only

#: per input i: a shape differing from every other input's, so that a tensor
#: landing in another input's slot cannot go unnoticed
SHAPES = [(2, 3), (5,), (1, 4)]


def _input(rank: int, i: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank- and input-specific values, exact in every dtype used here."""
    n = 1
    for d in SHAPES[i % len(SHAPES)]:
        n *= d
    base = torch.arange(n, dtype=torch.float64) + 100 * rank + 10 * i + 1000 * salt
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype).reshape(SHAPES[i % len(SHAPES)])
    return base.to(dtype).reshape(SHAPES[i % len(SHAPES)])


def _check_group_works(chk: Checker, what: str, group=None) -> None:
    with chk.case(f"all_reduce after {what}"):
        t = torch.full((3,), float(dist.get_rank(group) + 1))
        dist.all_reduce(t, group=group)
        n = dist.get_world_size(group)
        assert torch.equal(t, torch.full((3,), n * (n + 1) / 2)), f"got {t.tolist()}"


def _raises(fn, *says: str) -> None:
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        for s in says:
            assert s.lower() in msg.lower(), f"message lacks {s!r}: {msg}"
        return
    raise AssertionError("no ValueError")


def _all_gather_coalesced(chk: Checker, gloo, ranks: list[int], group=None, tag: str = "") -> None:
    """torch's layout: output_tensor_lists[r][i] = rank r's input i."""
    me = dist.get_rank()
    if me not in ranks:
        return
    n = len(ranks)
    for dtype in (torch.float32, torch.int64, torch.complex64):
        for count in (1, 2, 3):
            desc = f"all_gather_coalesced{tag} {dtype} {count} inputs"
            ins = [_input(me, i, dtype) for i in range(count)]
            with chk.case(desc):
                outs = [[torch.full_like(x, -1) for x in ins] for _ in range(n)]
                dist.all_gather_coalesced(outs, ins, group=group)
                ref = [[torch.full_like(x, -1) for x in ins] for _ in range(n)]
                dist.all_gather_coalesced(ref, ins, group=gloo)
                for r in range(n):
                    for i in range(count):
                        assert_equal_bits(outs[r][i], _input(ranks[r], i, dtype), f"[{r}][{i}]")
                        assert_equal_bits(outs[r][i], ref[r][i], f"[{r}][{i}] vs gloo")
    with chk.case(f"all_gather_coalesced{tag} async"):
        ins = [_input(me, i, torch.float64, 1) for i in range(3)]
        outs = [[torch.empty_like(x) for x in ins] for _ in range(n)]
        work = dist.all_gather_coalesced(outs, ins, group=group, async_op=True)
        work.wait()
        for r in range(n):
            for i in range(3):
                assert_equal_bits(outs[r][i], _input(ranks[r], i, torch.float64, 1), f"[{r}][{i}]")
        # torch hands back the Work's future: its value is one list per rank, as gloo's is
        ref = dist.all_gather_coalesced([[torch.empty_like(x) for x in ins] for _ in range(n)], ins,
                                        group=gloo, async_op=True)
        got, want = work.value(), ref.wait()

        def shape(v):
            return [shape(x) for x in v] if isinstance(v, list) else tuple(v.shape)

        assert shape(got) == shape(want), (shape(got), shape(want))
        assert n == 1 or [type(x) for x in got] == [list] * n, f"not per-rank lists: {got}"
        flat = [t for per_rank in got for t in per_rank] if n > 1 else got
        assert [t.data_ptr() for t in flat] == [o.data_ptr() for per_rank in outs for o in per_rank]


def _docstring_example(chk: Checker) -> None:
    """torch's all_gather_coalesced docstring, verbatim (2 ranks)."""
    me = dist.get_rank()
    with chk.case("all_gather_coalesced torch docstring example"):
        if me == 0:
            ins = [torch.tensor([[1, 1], [1, 1]]), torch.tensor([2]), torch.tensor([3, 3])]
        else:
            ins = [torch.tensor([[3, 3], [3, 3]]), torch.tensor([5]), torch.tensor([1, 1])]
        outs = [[torch.full_like(x, -1) for x in ins] for _ in range(2)]
        dist.all_gather_coalesced(outs, ins)
        want = [[[[1, 1], [1, 1]], [2], [3, 3]], [[[3, 3], [3, 3]], [5], [1, 1]]]
        assert [[t.tolist() for t in lst] for lst in outs] == want, [[t.tolist() for t in lst] for lst in outs]


def _tensor_coalesced(chk: Checker) -> None:
    me, ws = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    dtype = torch.float32
    ins = [_input(me, i, dtype, 2).flatten() for i in range(3)]
    gathered = [torch.cat([_input(r, i, dtype, 2).flatten() for r in range(ws)]) for i in range(3)]
    with chk.case("pg.allgather_into_tensor_coalesced"):
        outs = [torch.full((ws * x.numel(),), -1.0) for x in ins]
        pg.allgather_into_tensor_coalesced(outs, ins).wait()
        for i in range(3):
            assert_equal_bits(outs[i], gathered[i], f"output {i}")
    with chk.case("all_gather_into_tensor under _coalescing_manager"):
        outs = [torch.full((ws * x.numel(),), -1.0) for x in ins]
        with dist._coalescing_manager():
            for o, x in zip(outs, ins):
                dist.all_gather_into_tensor(o, x)
        for i in range(3):
            assert_equal_bits(outs[i], gathered[i], f"output {i}")
    # reduce_scatter: input i holds ws blocks; block r goes to rank r
    rs_in = [torch.cat([_input(me, i, dtype, 3).flatten() * (b + 1) for b in range(ws)]) for i in range(3)]
    rs_want = [sum(_input(r, i, dtype, 3).flatten() for r in range(ws)) * (me + 1) for i in range(3)]
    with chk.case("pg.reduce_scatter_tensor_coalesced"):
        outs = [torch.full((x.numel() // ws,), -1.0) for x in rs_in]
        pg.reduce_scatter_tensor_coalesced(outs, [x.clone() for x in rs_in]).wait()
        for i in range(3):
            assert_equal_bits(outs[i], rs_want[i], f"output {i}")
    with chk.case("reduce_scatter_tensor under _coalescing_manager"):
        outs = [torch.full((x.numel() // ws,), -1.0) for x in rs_in]
        with dist._coalescing_manager():
            for o, x in zip(outs, rs_in):
                dist.reduce_scatter_tensor(o, x.clone())
        for i in range(3):
            assert_equal_bits(outs[i], rs_want[i], f"output {i}")


def _per_rank_lists(chk: Checker) -> None:
    """reduce_scatter / all_to_all / gather / scatter: list[r] is rank r's."""
    me, ws = dist.get_rank(), dist.get_world_size()
    with chk.case("reduce_scatter input_list[r] reduced into rank r"):
        ins = [_input(me, r, torch.int64, 4) for r in range(ws)]
        out = torch.full_like(_input(me, me, torch.int64), -1)
        dist.reduce_scatter(out, ins)
        assert_equal_bits(out, sum(_input(r, me, torch.int64, 4) for r in range(ws)))
    with chk.case("all_to_all input_list[r] to rank r, output_list[r] from rank r (uneven)"):
        # rank s sends rank d a tensor of SHAPES[(s + d) % 3], values naming both
        ins = [_input(me, me + d, torch.float32, 5) + d for d in range(ws)]
        outs = [torch.full_like(_input(s, s + me, torch.float32), -1) for s in range(ws)]
        dist.all_to_all(outs, ins)
        for s in range(ws):
            assert_equal_bits(outs[s], _input(s, s + me, torch.float32, 5) + me, f"from rank {s}")
    for root in range(ws):
        with chk.case(f"gather gather_list[r] from rank r (root {root})"):
            mine = _input(me, 0, torch.float32, 6)
            lst = [torch.full_like(mine, -1) for _ in range(ws)] if me == root else None
            dist.gather(mine, lst, dst=root)
            if me == root:
                for r in range(ws):
                    assert_equal_bits(lst[r], _input(r, 0, torch.float32, 6), f"slot {r}")
        with chk.case(f"scatter scatter_list[r] to rank r (root {root})"):
            lst = [_input(root, 1, torch.float32, 7) + r for r in range(ws)] if me == root else None
            out = torch.full_like(_input(0, 1, torch.float32), -1)
            dist.scatter(out, lst, src=root)
            assert_equal_bits(out, _input(root, 1, torch.float32, 7) + me)


def _transposed_calls(chk: Checker) -> None:
    """Each bad call is made by every rank alike, so each fails in its own checks."""
    me, ws = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    layout = "torch's layout"

    # all_gather_coalesced, one list per input (the old smdccl layout). At
    # 3 ranks with 2 inputs the counts tell; at 2 ranks with 2 inputs of
    # different shapes the shapes tell.
    ins = [_input(me, i, torch.float32) for i in range(2)]
    transposed = [[torch.empty_like(x) for _ in range(ws)] for x in ins]
    with chk.case("all_gather_coalesced transposed lists raise"):
        _raises(lambda: dist.all_gather_coalesced(transposed, ins), layout, "transpose",
                "output_tensor_lists[r][i]", "zip(*output_tensor_lists)")
    _check_group_works(chk, "transposed all_gather_coalesced")
    with chk.case("all_gather_coalesced one list too few raises"):
        outs = [[torch.empty_like(x) for x in ins] for _ in range(ws - 1)]
        _raises(lambda: dist.all_gather_coalesced(outs, ins), f"one list per rank ({ws}), got {ws - 1}", layout)
    with chk.case("all_gather_coalesced a list one tensor short raises"):
        outs = [[torch.empty_like(x) for x in ins] for _ in range(ws)]
        outs[ws - 1] = outs[ws - 1][:1]
        _raises(lambda: dist.all_gather_coalesced(outs, ins),
                f"output_tensor_lists[{ws - 1}] must hold one tensor per input tensor (2), got 1", layout)
    with chk.case("all_gather_coalesced a wrong-sized slot raises naming it"):
        outs = [[torch.empty_like(x) for x in ins] for _ in range(ws)]
        outs[1][0] = torch.empty(7)
        _raises(lambda: dist.all_gather_coalesced(outs, ins), "output_tensor_lists[1][0] has 7 elements")
    _check_group_works(chk, "mis-shaped all_gather_coalesced")

    # the c10d signatures nest one list per device of the process: [list]
    one = torch.ones(4)
    per_rank = [[torch.empty(4)] for _ in range(ws)]
    with chk.case("pg.allgather given one list per rank raises"):
        _raises(lambda: pg.allgather(per_rank, [one]), layout, "[output_tensor_list]", "transposed")
    with chk.case("pg.reduce_scatter given one list per rank raises"):
        _raises(lambda: pg.reduce_scatter([torch.empty(4)], [[torch.ones(4)] for _ in range(ws)]),
                layout, "[input_list]", "transposed")
    solo = _solo_group()
    with chk.case("pg.gather given one list per rank raises (root of a 1-rank group)"):
        _raises(lambda: solo.gather([[torch.empty(4)], [torch.empty(4)]], [one], dist.GatherOptions()),
                layout, "[gather_list]")
    with chk.case("pg.scatter given one list per rank raises (root of a 1-rank group)"):
        _raises(lambda: solo.scatter([torch.empty(4)], [[one], [one]], dist.ScatterOptions()),
                layout, "[scatter_list]")
    _check_group_works(chk, "nested-list calls")

    # coalesced tensor calls given all_gather's one-tensor-per-rank outputs
    with chk.case("pg.allgather_into_tensor_coalesced given one output per rank raises"):
        _raises(lambda: pg.allgather_into_tensor_coalesced([torch.empty(4) for _ in range(ws)], [one]),
                layout, "world_size x inputs[i]")
    with chk.case("pg.allgather_into_tensor_coalesced given an input-sized output raises"):
        _raises(lambda: pg.allgather_into_tensor_coalesced([torch.empty(4)], [one]), layout)
    with chk.case("pg.reduce_scatter_tensor_coalesced given one input per rank raises"):
        _raises(lambda: pg.reduce_scatter_tensor_coalesced([torch.empty(4)], [torch.ones(4) for _ in range(ws)]),
                layout, "world_size x outputs[i]")
    _check_group_works(chk, "coalesced tensor calls")


_SOLO = None


def _solo_group():
    """A one-rank group per rank (each rank its own root), made collectively."""
    global _SOLO
    if _SOLO is None:
        me, ws = dist.get_rank(), dist.get_world_size()
        for r in range(ws):
            g = dist.new_group([r])
            if r == me:
                _SOLO = g
    return _SOLO


def list_layouts() -> dict:
    ws = dist.get_world_size()
    chk = Checker(f"(list layouts, {ws} ranks)")
    gloo = dist.new_group(backend="gloo")
    _all_gather_coalesced(chk, gloo, list(range(ws)))
    sub = [1, 2] if ws > 2 else [0, 1]
    sub_group = dist.new_group(sub)
    sub_gloo = dist.new_group(sub, backend="gloo")
    _all_gather_coalesced(chk, sub_gloo, sub, sub_group, tag=f" on subgroup {sub}")
    if ws == 2:
        _docstring_example(chk)
    _tensor_coalesced(chk)
    _per_rank_lists(chk)
    solo_gloo = None
    for r in range(ws):  # one-rank gloo groups, made collectively
        g = dist.new_group([r], backend="gloo")
        solo_gloo = g if r == dist.get_rank() else solo_gloo
    _all_gather_coalesced(chk, solo_gloo, [dist.get_rank()], _solo_group(), tag=" on a one-rank group")
    _transposed_calls(chk)
    return chk.finish()


@pytest.mark.parametrize("ws", [2, 3])
def test_list_calls_take_torch_layout(ws):
    res = run_ranks(ws, list_layouts, timeout=180)
    # rank 0 is outside the 3-rank run's subgroup [1, 2]: fewer cases there
    assert all(r["cases"] >= 30 for r in res), res
