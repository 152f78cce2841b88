"""smdccl.bench's sweep when a collective fails inside a timed loop, on one
rank only (a peer gone, a device error, a timeout): every rank learns it in
the same round, the collective is skipped from that size on with the reason,
and the other backends and sizes still get their lines, instead of the run
ending with no table. 2 real ranks, a real smdccl group whose timeout ends
the peer's wait; the failure is injected into one rank's case."""

from datetime import timedelta

import pytest

from harness import run_ranks

SMALL, LARGE = 4096, 64 << 10


def sweep_with_one_rank_failing_in_a_timed_loop() -> dict:
    import argparse

    import torch
    import torch.distributed as dist

    from smdccl.bench import sweep as sw
    from smdccl.bench.backends import World

    rank = dist.get_rank()
    world = World(rank, dist.get_world_size(), 0, torch.device("cpu"), dist.group.WORLD)
    smdccl = dist.new_group(backend="smdccl", timeout=timedelta(seconds=3))
    gloo = dist.new_group(backend="gloo")
    real_make_case = sw.make_case
    made = []

    def make_case(name, nbytes, dtype, op, group, *rest, **kw):
        case = real_make_case(name, nbytes, dtype, op, group, *rest, **kw)
        if group is smdccl and nbytes == LARGE:
            made.append(case)
            # The third such case is pass 2's (warm-up, pass 1, pass 2);
            # its first call is the untimed touch, its second is timed.
            if rank == 1 and len(made) == 3:
                run, calls = case.run, []

                def failing_run():
                    calls.append(1)
                    if len(calls) == 2:
                        raise RuntimeError("injected: rank 1 fails in the timed loop")
                    run()

                case.run = failing_run
        return case

    sw.make_case = make_case
    args = argparse.Namespace(collectives=["allreduce"], size_list=[SMALL, LARGE], passes=2,
                              dtype="float32", op="sum", warmup=1, iters=4, target_time=1.0)
    rows, skipped = sw.sweep({"smdccl": smdccl, "gloo": gloo}, world, args, lambda _: None)
    return {"lines": sorted((r["backend"], r["size"], r["passes"], r["wrong"]) for r in rows),
            "skipped_lines": skipped}


@pytest.mark.multiprocess
def test_a_rank_failing_in_a_timed_loop_skips_that_line_and_the_sweep_goes_on():
    results = run_ranks(2, sweep_with_one_rank_failing_in_a_timed_loop, timeout=120)
    assert results[0] == results[1], results  # one decision on every rank
    got = results[0]
    # smdccl's 64 KiB line lost its second pass: no line; everything else ran
    # both passes, correct.
    assert got["lines"] == [("gloo", SMALL, 2, 0), ("gloo", LARGE, 2, 0), ("smdccl", SMALL, 2, 0)], got
    assert len(got["skipped_lines"]) == 1, got
    skip = got["skipped_lines"][0]
    assert skip["backend"] == "smdccl" and skip["collective"] == "allreduce", skip
    # Rank 0 waited in the collective rank 1 skipped until the group's
    # timeout failed it: the first rank's error is that timeout.
    assert skip["reason"].startswith("from 64K on: rank 0: "), skip
