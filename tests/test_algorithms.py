"""SMDCCL_ALGO forces one allreduce algorithm for every size: both must be
correct on their own, including recursive doubling's fold for a world size
that is not a power of two (3) and the ring on messages smaller than the
world size. Runs the compact collective matrix (all collectives build on
allreduce, broadcast and allgather) once per algorithm. smdccl only."""

from __future__ import annotations

import pytest

from harness import run_ranks
from test_collectives import collective_matrix

pytestmark = pytest.mark.smdccl_only


@pytest.mark.parametrize("algo", ["ring", "rd"])
def test_forced_algorithm_matrix(algo):
    sections = ["reductions", "data_movement"]
    results = run_ranks(3, collective_matrix, True, sections, env={"SMDCCL_ALGO": algo}, timeout=420)
    assert results[0]["cases"] > 0
    print(f"\n[SMDCCL_ALGO={algo}] {results[0]['cases']} sub-cases")


def bad_algo_is_rejected():
    import torch.distributed as dist

    try:
        dist.new_group(backend="smdccl")
    except ValueError as exc:
        assert "SMDCCL_ALGO" in str(exc) and "auto, ring, rd" in str(exc), str(exc)
        return "raised"
    raise AssertionError("a bad SMDCCL_ALGO was accepted")


def test_bad_algo_name_raises_value_error():
    # The default group is gloo so that creating the smdccl group is the
    # step that fails, with a ValueError naming the variable and its choices.
    results = run_ranks(2, bad_algo_is_rejected, backend="gloo", env={"SMDCCL_ALGO": "fastest"})
    assert results == ["raised", "raised"]
