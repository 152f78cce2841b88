"""Collectives and send/recv between local ranks with the shared-memory rings
written one way throughout: plain stores, or streamed past the caches
(``SMDCCL_SHM_COPY=streamed``, non-temporal stores). The default, auto,
changes between the two as it measures them (``transport/copy_choice.h``;
its choices and the bytes through each way are tested in
``tests/cpp/test_copy_choice.cpp`` and ``test_shm_transport.cpp``) and runs in
every other test.

What (3 ranks on one node, 256 KiB rings so that the medium messages of
1.2 MB wrap them several times, pieces of 64 KiB and more streamed): the compact
collective matrix's reductions, data movement and send/recv, every dtype it
has, against its float64 / integer references, then the cross-rank bitwise
check.
"""

from __future__ import annotations

import pytest

from harness import run_ranks
from test_collectives import collective_matrix


@pytest.mark.parametrize("mode", ["plain", "streamed"])
def test_collectives_with_each_way_of_copying_into_the_rings(mode):
    summary = run_ranks(3, collective_matrix, True, ["reductions", "data_movement", "p2p"],
                        env={"SMDCCL_SHM_COPY": mode, "SMDCCL_SHM_RING_KB": "256"}, timeout=420)[0]
    assert summary["cases"] > 100, summary
