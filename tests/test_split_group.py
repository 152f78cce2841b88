"""dist.split_group on smdccl: the parts that the collective matrix's
``split_groups`` section (every collective on each child, at 1-4 ranks, on
both backends) does not cover.

Why: ``dist.split_group`` is how DeviceMesh builds its per-dimension groups
once the default group is bound to a device (``init_process_group(device_id=
...)``: the usual FSDP2 / HSDP / TP setup), and ``new_group`` then asks the
ranks left out to take part in the split. A backend that cannot split fails
both.

What (4 ranks): a child takes split_group's ``timeout`` (a receive nobody
answers raises after it, naming the child's group) and its parent's
compression (float32 travels as fp16 in the child); one call's child is the
same backend for every device type of the group; a rank that is not in the
parent raises ValueError on every rank and both groups go on; destroying a
child leaves the parent working; new_subgroups pairs ranks. With the default group bound to a device
(``device_id=cpu:0``), ``new_group`` works for members and for the ranks left
out (gloo raises for those).
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

from harness import CPU_SPLIT_UNSUPPORTED, harness_store, run_ranks, timed_raise

needs_cpu_split = pytest.mark.skipif(CPU_SPLIT_UNSUPPORTED is not None, reason=str(CPU_SPLIT_UNSUPPORTED))


def split_properties() -> dict:
    rank = dist.get_rank()
    out = {}

    # split_group(timeout=...) is the child's timeout; the parent keeps its own
    pair = dist.split_group(split_ranks=[[0, 1], [2, 3]], timeout=datetime.timedelta(seconds=2))
    backend = pair._get_backend(torch.device("cpu"))
    cuda_backend = pair._get_backend(torch.device("cuda"))
    out["one backend for cpu and cuda"] = backend is cuda_backend  # one C++ object, one wrapper
    if dist.get_rank(pair) == 0:
        out["timeout"] = timed_raise(lambda: dist.recv(torch.zeros(4), group=pair, group_src=1, tag=9))
    out["group name"] = pair.group_name
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=pair)
    out["pair sum"] = t.item()

    # the parent's compression carries over (compression_intra: on one machine too)
    fp16 = dist.new_group(backend="smdccl", pg_options={"compression": "fp16", "compression_intra": True})
    child = dist.split_group(parent_pg=fp16, split_ranks=[[3, 2, 1, 0]])
    out["child compression"] = child._get_backend(torch.device("cpu")).compression
    x = torch.full((1000,), 1.0 + 2.0**-20)  # not a float16 value: rounds to 1.0 on an fp16 wire
    dist.all_reduce(x, group=child)
    out["fp16 child sum"] = sorted(set(x.tolist()))

    # bad ranks: a ValueError on every rank, and the groups go on
    out["bad rank"] = timed_raise(lambda: dist.split_group(split_ranks=[[0, 7]]))
    t = torch.ones(3)
    dist.all_reduce(t, group=pair)
    dist.all_reduce(t)
    out["after bad rank"] = t.tolist()

    # destroying a child leaves its parent working
    dist.destroy_process_group(child)
    t = torch.ones(2)
    dist.all_reduce(t, group=fp16)
    out["parent after child destroyed"] = t.tolist()

    # new_subgroups (new_group underneath): consecutive pairs
    mine, _ = dist.new_subgroups(group_size=2)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    out["new_subgroups sum"] = t.item()
    return out


@needs_cpu_split
def test_split_group_properties():
    results = run_ranks(4, split_properties, backend="smdccl", timeout=180)
    for rank, r in enumerate(results):
        assert r["one backend for cpu and cuda"], r
        assert r["pair sum"] == (1.0 if rank < 2 else 5.0), r
        assert r["new_subgroups sum"] == (1.0 if rank < 2 else 5.0), r
        assert r["child compression"] == "fp16", r
        assert r["fp16 child sum"] == [4.0], f"rank {rank}: the child did not use the fp16 wire: {r}"
        seconds, err = r["bad rank"]
        assert err is not None and err.startswith("ValueError"), r
        assert "rank 7 is not a rank of group" in err, r
        assert r["after bad rank"] == [8.0] * 3, r
        assert r["parent after child destroyed"] == [4.0] * 2, r
    for rank in (0, 2):
        seconds, err = results[rank]["timeout"]
        assert err is not None and "timed out" in err, results[rank]
        assert results[rank]["group name"] in err, f"the error does not name the child group: {err}"
        assert 1.5 < seconds < 10, f"the receive raised after {seconds:.1f} s; split_group's timeout is 2 s"


def bound_device_new_group() -> dict:
    host, port = os.environ["SMDCCL_TEST_STORE"].split(":")
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(host, int(port), ws, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("smdccl", store=store, rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cpu", 0))
    out = {"bound": str(dist.group.WORLD.bound_device_id)}
    # ranks 2 and 3 are left out: torch has them call perform_nocolor_split
    g = dist.new_group([0, 1])
    out["member"] = g is not dist.GroupMember.NON_GROUP_MEMBER
    if out["member"]:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=g)
        out["sum"] = t.item()
    split = dist.split_group(split_ranks=[[1, 2, 3]])
    if split is not dist.GroupMember.NON_GROUP_MEMBER:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=split)
        out["split sum"] = t.item()
    t = torch.ones(1)
    dist.all_reduce(t)
    out["world"] = t.item()
    dist.destroy_process_group()
    return out


@needs_cpu_split
def test_new_group_with_bound_device():
    results = run_ranks(4, bound_device_new_group, backend="smdccl", init=False, timeout=180)
    for rank, r in enumerate(results):
        assert r["bound"] == "cpu:0", r
        assert r["member"] == (rank < 2), r
        if rank < 2:
            assert r["sum"] == 3.0, r
        if rank > 0:
            assert r["split sum"] == 6.0, r
        assert r["world"] == 4.0, r


def split_twice_with_one_store() -> dict:
    parent = dist.group.WORLD._get_backend(torch.device("cpu"))
    store = harness_store()
    one = dist.PrefixStore("split_test/one/", store)
    first = parent.split(one, [1, 0], parent.options)
    again = parent.split(one, [1, 0], parent.options)  # what torch does per device type
    other = parent.split(dist.PrefixStore("split_test/other/", store), [1, 0], parent.options)
    return {"same child": first is again, "new store, new child": other is not first,
            "child rank": first.rank(), "child size": first.size()}


@pytest.mark.skipif(not hasattr(torch._C._distributed_c10d.Backend, "split"),
                    reason="this torch's Backend has no split() (older torch cannot split groups "
                           "through a backend)")
def test_split_once_per_store():
    """Older torch calls split() once per device type (cpu, cuda) with one
    store: each call must get the same child, or the second would rendezvous
    over the first one's keys."""
    for rank, r in enumerate(run_ranks(2, split_twice_with_one_store, backend="smdccl", timeout=120)):
        assert r["same child"] and r["new store, new child"], r
        assert (r["child rank"], r["child size"]) == (1 - rank, 2), r
