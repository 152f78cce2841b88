"""recv without a source rank (``dist.recv(t)`` / ``irecv(t)``, src=None), as gloo has it.

Why: code written for gloo receives "from whoever sends first" (work
queues, parameter servers, gathering results of uneven work); a backend
without it breaks that code.

What (4 ranks, both backends): ranks 1-3 each send rank 0 two messages,
with seeded delays; rank 0's any-source receives get each message exactly
once, the reported source is the sender (``recv``'s return value,
``work._source_rank()``), and each sender's messages arrive in the order it
sent them. The same with every message already buffered before the receives
are posted. Any-source and rank-specific receives of one tag match in the
order they were posted. A receive of another tag is not taken. smdccl only:
a receive nobody answers times out after the group timeout, naming "any
source", and the group's send/recv still work; a size mismatch names the
sender; a group of one rank refuses it.
"""

from __future__ import annotations

import datetime
import random
import time

import pytest
import torch
import torch.distributed as dist

from harness import BACKEND, backend_supports, harness_store, run_ranks, unsupported_reason

MESSAGES_PER_SENDER = 2


def _payload(sender: int, k: int) -> torch.Tensor:
    return torch.tensor([float(sender), float(k), 7.0])


def _receive_all(expected: int, tag: int, use_irecv: bool) -> list[tuple[int, int, int]]:
    """(reported source, payload's sender, payload's k) of `expected` any-source receives."""
    got = []
    for _ in range(expected):
        t = torch.zeros(3)
        if use_irecv:
            work = dist.irecv(t, tag=tag)
            work.wait()
            src = work._source_rank()
        else:
            src = dist.recv(t, tag=tag)
        assert t[2].item() == 7.0, t
        got.append((src, int(t[0].item()), int(t[1].item())))
    return got


def _check_received(got: list[tuple[int, int, int]], senders: list[int], what: str) -> None:
    want = sorted((s, k) for s in senders for k in range(MESSAGES_PER_SENDER))
    assert sorted((s, k) for _, s, k in got) == want, f"{what}: received {got}"
    for src, sender, _ in got:
        assert src == sender, f"{what}: a message of rank {sender} was reported from rank {src}"
    for s in senders:  # one sender's messages in the order it sent them
        ks = [k for _, sender, k in got if sender == s]
        assert ks == sorted(ks), f"{what}: rank {s}'s messages arrived as {ks}"


def anysource_matrix() -> dict:
    rank, ws = dist.get_rank(), dist.get_world_size()
    store = harness_store()
    senders = list(range(1, ws))
    rng = random.Random(rank)
    out = {}

    # 1. receives posted first, messages come with random delays
    for round_, use_irecv in enumerate((False, True)):
        tag = 10 + round_
        if rank == 0:
            _check_received(_receive_all(len(senders) * MESSAGES_PER_SENDER, tag, use_irecv), senders,
                            f"posted first ({'irecv' if use_irecv else 'recv'})")
        else:
            for k in range(MESSAGES_PER_SENDER):
                time.sleep(rng.uniform(0, 0.05))
                dist.send(_payload(rank, k), dst=0, tag=tag)
        dist.barrier()

    # 2. every message buffered before the receives are posted
    if rank == 0:
        store.wait([f"anysource/sent/{s}" for s in senders])
        time.sleep(0.2)  # let the receiver threads read them in
        _check_received(_receive_all(len(senders) * MESSAGES_PER_SENDER, 20, False), senders,
                        "already arrived")
    else:
        # isend: gloo's send waits for its receive (smdccl's buffers the message)
        works = [dist.isend(_payload(rank, k), dst=0, tag=20) for k in range(MESSAGES_PER_SENDER)]
        store.set(f"anysource/sent/{rank}", "1")
        for w in works:
            w.wait()
    dist.barrier()

    # 3. any-source and rank-specific receives of one tag: post order decides
    orders = ("any first", "rank first") if backend_supports("anysource_post_order") else ()
    out["post order cases"] = len(orders)
    for order in orders:
        tag = 30 if order == "any first" else 31
        if rank == 0:
            a, b = torch.zeros(3), torch.zeros(3)
            if order == "any first":
                w_any, w_one = dist.irecv(a, tag=tag), dist.irecv(b, src=1, tag=tag)
            else:
                w_one, w_any = dist.irecv(b, src=1, tag=tag), dist.irecv(a, tag=tag)
            store.set(f"anysource/posted/{tag}", "1")
            w_any.wait()
            w_one.wait()
            first, second = (a, b) if order == "any first" else (b, a)
            assert w_any._source_rank() == 1
            assert first[1].item() == 0 and second[1].item() == 1, (order, a, b)
        elif rank == 1:
            store.wait([f"anysource/posted/{tag}"])
            dist.send(_payload(1, 0), dst=0, tag=tag)
            dist.send(_payload(1, 1), dst=0, tag=tag)
        dist.barrier()

    # 4. a receive of another tag is not taken
    pair = dist.new_group([0, 2], backend="gloo")
    if rank == 0:
        other = dist.irecv(torch.zeros(3), tag=41)
        t = torch.zeros(3)
        src = dist.recv(t, tag=40)
        assert src == 2 and t[0].item() == 2, (src, t)
        assert not other.is_completed(), "an any-source receive of tag 41 took a tag-40 message"
        dist.barrier(group=pair)  # only now does rank 2 send tag 41
        other.wait()
        out["other tag from"] = other._source_rank()
    elif rank == 2:
        dist.send(_payload(2, 0), dst=0, tag=40)
        dist.barrier(group=pair)
        dist.send(_payload(2, 1), dst=0, tag=41)
    dist.barrier()
    return out


def test_recv_from_any_source():
    res = run_ranks(4, anysource_matrix, timeout=180)
    assert res[0]["other tag from"] == 2, res[0]
    if res[0]["post order cases"] == 0:
        print(f"\n[{BACKEND}] skipped the post-order cases: {unsupported_reason('anysource_post_order')}")
    print(f"\n[{BACKEND}] any-source receives: 4 ranks, every case passed")


def anysource_errors() -> dict:
    rank = dist.get_rank()
    out = {}
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.recv(torch.zeros(4), group=g, tag=3)
            out["timeout"] = "no error"
        except Exception as exc:  # noqa: BLE001 - checked by the test
            out["timeout"] = f"{type(exc).__name__}: {exc}"
        out["timeout_s"] = time.monotonic() - t0
    dist.barrier()
    # the group's send/recv still work: rank 1 sends, rank 0 receives from any
    if rank == 1:
        dist.send(torch.full((4,), 5.0), dst=0, group=g, tag=4)
        dist.send(torch.ones(3), dst=0, group=g, tag=5)
    elif rank == 0:
        t = torch.zeros(4)
        out["after"] = (dist.recv(t, group=g, tag=4), t.tolist())
        try:
            dist.recv(torch.zeros(4), group=g, tag=5)  # rank 1 sent 3 elements
            out["size"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out["size"] = f"{type(exc).__name__}: {exc}"
    solo = dist.new_group([rank], backend="smdccl")
    try:
        dist.recv(torch.zeros(1), group=solo)
        out["solo"] = "no error"
    except Exception as exc:  # noqa: BLE001
        out["solo"] = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    return out


@pytest.mark.smdccl_only  # the messages asserted are smdccl's
def test_recv_from_any_source_errors():
    r0, r1 = run_ranks(2, anysource_errors, timeout=120)
    assert r0["timeout"].startswith("DistBackendError"), r0
    assert "any source" in r0["timeout"] and "timed out" in r0["timeout"], r0
    assert 1.5 < r0["timeout_s"] < 5, r0
    assert r0["after"] == (1, [5.0] * 4), r0
    assert r0["size"].startswith("ValueError") and "rank 1" in r0["size"], r0
    assert "expected 16 bytes" in r0["size"] and "carried 12" in r0["size"], r0
    for r in (r0, r1):
        assert r["solo"].startswith("ValueError") and "no other rank" in r["solo"], r
