"""The TCP listener accepts only peers that present the group's token.

While a 2-rank job is running, rank 0 opens raw connections to rank 1's
listener and sends: random bytes, a truncated handshake, a well-formed
handshake with a wrong token, and one with the right layout but ranks out of
range. Every one must be closed by rank 1 without an acknowledgement, rank 1
must count them as rejected, and the job's collectives must stay correct
before, during and after. smdccl only."""

from __future__ import annotations

import os
import socket
import struct

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

pytestmark = pytest.mark.smdccl_only

MAGIC, VERSION, COLLECTIVE = 0x43444D53, 1, 1


def _hello(token: bytes, src: int, dst: int) -> bytes:
    return struct.pack("<IHHii16s", MAGIC, VERSION, COLLECTIVE, src, dst, token)


def _closed_without_ack(addr: str, payload: bytes) -> bool:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(payload)
        if len(payload) < 32:
            s.shutdown(socket.SHUT_WR)  # a truncated handshake, then nothing more
        s.settimeout(10)
        try:
            return s.recv(4) == b""  # the listener hung up; an ack would be 4 bytes
        except ConnectionResetError:
            return True


def bad_connections_are_dropped():
    rank = dist.get_rank()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    addrs = [None, None]
    dist.all_gather_object(addrs, backend.listen_address)
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == 3)
    if rank == 0:
        attempts = {
            "random bytes": os.urandom(64),
            "truncated handshake": _hello(os.urandom(16), 0, 1)[:20],
            "wrong token": _hello(os.urandom(16), 0, 1),
            "ranks out of range": _hello(os.urandom(16), 7, 1),
        }
        for name, payload in attempts.items():
            assert _closed_without_ack(addrs[1], payload), f"{name}: connection was not dropped"
    dist.barrier()
    rejected = [0, 0]
    dist.all_gather_object(rejected, backend.rejected_connections)
    assert rejected[1] >= 4, f"rank 1 rejected only {rejected[1]} of 4 bad connections"
    x = torch.arange(100_000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(100_000, dtype=torch.float64) * 3)
    return rejected[1]


def test_listener_drops_bad_handshakes():
    results = run_ranks(2, bad_connections_are_dropped, timeout=120)
    assert results[0] >= 4
