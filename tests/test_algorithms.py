"""SMDCCL_ALGO forces algorithms through the whole torch path: the compact
collective matrix (every collective, ops, dtypes, sizes 0 to 300007) on 3
ranks (not a power of two: halving folds) with ring for reduce_scatter and
allgather, halving for allreduce and the trees for broadcast and reduce.
Every registered algorithm on every collective, shape and size is checked
in-process by tests/cpp/test_algorithm_matrix.cpp; this proves the
backend drives them the same. smdccl only."""

from __future__ import annotations

import pytest

from harness import run_ranks
from test_collectives import collective_matrix

pytestmark = pytest.mark.smdccl_only


@pytest.mark.parametrize("algo", ["ring,allreduce:halving,broadcast:tree,reduce:tree"])
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
