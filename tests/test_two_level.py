"""Two-level collectives on forced virtual topologies, against the reference.

Why: the two-level algorithms (intra-node shared memory, inter-node TCP, one
rank per node and shard crossing the network) are the reason smdccl exists,
and their bookkeeping -- shard ownership on uneven nodes, the chunked
pipeline, sub-communicators -- is where an off-by-one would hide. Each case
forces one algorithm with ``SMDCCL_ALGO`` on one ``SMDCCL_TOPOLOGY`` and runs
the reduction section (and on 3+1 the data-movement one) of the compact
collective matrix
(every collective and op; float32, fp16, bf16, int64, uint8, bool; sizes 0,
1, 7, 1001, 300007 -- none divisible by the world size) plus the cross-rank
bitwise check. ``SMDCCL_PIPELINE_CHUNK_KB=64`` cuts the larger messages into many
pipeline chunks so the pipelining itself is exercised.

Topologies: 2x3 (6 ranks) and 3+1 (uneven; two_level_rd is what the
automatic choice runs there for small messages, in tests/test_topology.py).
The schedules themselves, on
2+2, 3+3, 3+1, 2+3+1, one rank per node and one node (where the two-level
forms fall back to the flat ones), run in-process in
tests/cpp/test_algorithm_matrix.cpp; these runs prove the backend drives
them. The default choice (auto) on 2x2 and 3+1 runs in
tests/test_topology.py. smdccl only.
"""

from __future__ import annotations

import re

import pytest

from harness import run_ranks
from test_collectives import collective_matrix

pytestmark = pytest.mark.smdccl_only

# (topology, ranks, forced algorithm, matrix sections). On 3+1 the forced
# two_level_tree runs allreduce and broadcast, and its kin two_level the
# allgather and reduce_scatter, so its data movement covers two_level's too.
CASES = [
    ("2x3", 6, "two_level", ["reductions"]),                         # the pipeline, shards, 6 ranks
    ("3,1", 4, "two_level_tree", ["reductions", "data_movement"]),  # uneven nodes, a double tree
]


@pytest.mark.parametrize("topology,world_size,algo,sections", CASES, ids=[f"{t}-{a}" for t, _, a, _ in CASES])
def test_two_level_matrix(topology, world_size, algo, sections):
    env = {"SMDCCL_TOPOLOGY": topology, "SMDCCL_ALGO": algo, "SMDCCL_PIPELINE_CHUNK_KB": "64"}
    results = run_ranks(world_size, collective_matrix, True, sections, env=env, timeout=420)
    assert results[0]["cases"] > 0
    print(f"\n[{topology} {algo}] {results[0]['cases']} sub-cases; timings {results[0]['timings']}")


def logged_decisions() -> str:
    """Rank function: stderr (where the engine logs) of a new group's first collectives."""
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    with tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            group = dist.new_group(backend="smdccl")
            for _ in range(2):  # the second round must not log again
                for numel in (1000, 3 << 20):  # 4 KB, 12 MiB of float32
                    t = torch.ones(numel)
                    dist.all_reduce(t, group=group)
                    assert t[0].item() == dist.get_world_size() and t[-1].item() == dist.get_world_size()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        return capture.read().decode()


def test_info_log_names_topology_and_each_decision_once():
    env = {"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_DEBUG": "INFO"}
    logs = run_ranks(4, logged_decisions, env=env)
    for rank, log in enumerate(logs):
        assert "2 nodes: [0,1] [2,3]" in log and "cost model: intra" in log, log
        big = [line for line in log.splitlines() if "allreduce [8 MiB, 16 MiB)" in line]
        small = [line for line in log.splitlines() if "allreduce [2 KiB, 4 KiB)" in line]
        assert len(big) == 1 and len(small) == 1, f"rank {rank}: each decision once\n{log}"
        # Default model on 2 nodes x 2 ranks: pipelined two-level for large messages,
        # a latency-optimal algorithm for small ones; the estimates are listed.
        assert big[0].split(" -> ")[1].startswith("two_level;"), big[0]
        assert small[0].split(" -> ")[1].split(";")[0] in ("rd", "two_level_rd"), small[0]
        # every algorithm that can run on 2x2 is listed with its estimate
        for name in ("ring", "rd", "halving", "tree", "two_level", "two_level_rd", "two_level_tree"):
            assert re.search(rf"[:,] {name} \d+ us", big[0]), (name, big[0])
