"""Forced virtual topologies give the same (correct) results.

Why: ``SMDCCL_TOPOLOGY`` splits the ranks of one machine into virtual nodes
that talk over TCP, so the inter-node (TCP) transport and the two-level
(intra-node shm + inter-node) algorithms are exercised on a single host.
``3,1`` is an unbalanced 3 + 1 split: the automatic choice runs the
two-level and two-level recursive-doubling allreduces there.  It runs
the compact collective matrix of tests/test_collectives.py (all collectives,
all ops, sizes 0 .. 300k, a dtype subset) on 4 ranks.  smdccl only.
"""

from __future__ import annotations

import pytest

from harness import run_ranks
from test_collectives import collective_matrix, selected_sections

pytestmark = pytest.mark.smdccl_only


# 2x2 runs on the emulated cluster (test_cluster.py: every op x dtype), with
# the 16-bit wire (test_compression.py) and in the tuning run (test_tune.py).
@pytest.mark.parametrize("topology", ["3,1"])
def test_forced_topology_matrix(topology):
    results = run_ranks(4, collective_matrix, True, selected_sections(), env={"SMDCCL_TOPOLOGY": topology}, timeout=420)
    s = results[0]
    print(f"\n[SMDCCL_TOPOLOGY={topology}] {s['cases']} sub-cases; section timings {s['timings']}")
