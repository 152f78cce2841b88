"""Two-level collectives on forced virtual topologies, against the reference.

Why: the two-level algorithms (intra-node shared memory, inter-node TCP, one
rank per node and shard crossing the network) are the reason smdccl exists,
and their bookkeeping -- shard ownership on uneven nodes, the chunked
pipeline, sub-communicators -- is where an off-by-one would hide. Each case
forces one algorithm with ``SMDCCL_ALGO`` on one ``SMDCCL_TOPOLOGY`` and runs
the reduction and data-movement sections of the collective matrix (every
collective, ops, dtypes incl. fp16/bf16/ints/bool, sizes 0, 1, 7, 1001,
300007 -- none divisible by the world size) plus the cross-rank bitwise
check. ``SMDCCL_PIPELINE_CHUNK_KB=64`` cuts the larger messages into many
pipeline chunks so the pipelining itself is exercised.

Topologies: 2x2, 3+1 (uneven), 1x4 (one node: the two-level forms fall back
to the flat ones), 4x1 (one rank per node), 2x3 (6 ranks). The default
choice (auto) on 2x2 and 3+1 runs in tests/test_topology.py. smdccl only.
"""

from __future__ import annotations

import pytest

from harness import run_ranks
from test_collectives import collective_matrix

pytestmark = pytest.mark.smdccl_only

SECTIONS = ["reductions", "data_movement"]

CASES = [
    ("2x2", 4, "two_level"),
    ("3,1", 4, "two_level"),
    ("1x4", 4, "two_level"),
    ("4x1", 4, "two_level"),
    ("2x3", 6, "two_level"),
    ("2x2", 4, "two_level_rd"),
    ("3,1", 4, "two_level_rd"),
]


@pytest.mark.parametrize("topology,world_size,algo", CASES, ids=[f"{t}-{a}" for t, _, a in CASES])
def test_two_level_matrix(topology, world_size, algo):
    env = {"SMDCCL_TOPOLOGY": topology, "SMDCCL_ALGO": algo, "SMDCCL_PIPELINE_CHUNK_KB": "64"}
    results = run_ranks(world_size, collective_matrix, True, SECTIONS, env=env, timeout=420)
    assert results[0]["cases"] > 0
    print(f"\n[{topology} {algo}] {results[0]['cases']} sub-cases; timings {results[0]['timings']}")
