"""ProcessGroup.abort(): a hung group can be abandoned from another thread.

Why: fault-tolerant trainers (and torch's ``_abort_process_group``) abort a
group whose collective waits for a peer that is alive but will not come
(stuck in a data loader, being replaced). Without abort the collective
waits for the whole group timeout; a demanding NCCL user expects abort to
unblock it at once.

How: on a subgroup of 2 ranks, rank 1 stays away (it waits on the store).
Rank 0 starts, on a helper thread, a blocking all_reduce; queues async
all_reduces; posts an irecv from rank 1. Then its main thread calls
``g.abort()``. Every one of them must raise within a second,
naming the abort; rank 1 then calls all_reduce on its side of the group and
must fail fast too, naming rank 0's abort; so must its first call on a
group aborted before any link existed (rank 0 then dials, or is dialled by,
a rank that will never answer). The world group (another
backend instance) keeps working. ``_abort_process_group`` reaches the
backend as well (a queued all_reduce on a second group fails naming it).
``backend.get_error()`` says SUCCESS before, COMM_ERROR on the aborting
rank and REMOTE_ERROR on its peer after. Shared memory (one node) and TCP (every
rank its own virtual node). smdccl only: gloo's abort is a no-op.
"""

from __future__ import annotations

import pytest

from harness import harness_store, run_ranks, timed_raise

pytestmark = pytest.mark.smdccl_only

GROUP_TIMEOUT_S = 60  # what a wait without abort would take


def abort_hung_group() -> dict:
    import datetime
    import threading
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _abort_process_group

    rank = dist.get_rank()
    store = harness_store()
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    g2 = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    idle = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    # never used before the abort: no link between the ranks yet (over TCP,
    # rank 1 would wait for rank 0 to dial it, and rank 0 dials rank 1)
    fresh_0 = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    fresh_1 = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    dist.all_reduce(torch.ones(4), group=idle)
    x = torch.ones(1 << 16)
    dist.all_reduce(x, group=g)  # links up, group works
    backend = g._get_backend(torch.device("cpu"))
    out = {"error before": str(backend.get_error())}
    if rank == 0:
        blocked = {}

        def blocking():
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1 << 16), group=g)
                blocked["error"] = "no error"
            except Exception as exc:  # noqa: BLE001 - checked by the test
                blocked["error"] = f"{type(exc).__name__}: {exc}"
            blocked["after_abort_s"] = time.monotonic() - blocked.get("aborted_at", t0)

        thread = threading.Thread(target=blocking)
        thread.start()
        time.sleep(0.5)  # the all_reduce is waiting for rank 1
        queued = [dist.all_reduce(torch.ones(8), group=g, async_op=True) for _ in range(3)]
        recv = dist.irecv(torch.empty(4), src=1, group=g)
        blocked["aborted_at"] = time.monotonic()
        g.abort()  # ProcessGroup.abort(): the group stays registered with torch
        out["error after"] = str(backend.get_error())
        thread.join(timeout=GROUP_TIMEOUT_S)
        out["blocking"] = blocked
        out["blocking_alive"] = thread.is_alive()
        for name, works in (("queued", queued), ("recv", [recv])):
            errors = []
            for w in works:
                t0 = time.monotonic()
                try:
                    w.wait()
                    errors.append(("no error", 0.0))
                except Exception as exc:  # noqa: BLE001
                    errors.append((f"{type(exc).__name__}: {exc}", time.monotonic() - t0))
            out[name] = errors
        # torch's _abort_process_group reaches the backend too (it also
        # unregisters the group, so only works already returned can be waited on)
        w = dist.all_reduce(torch.ones(8), group=g2, async_op=True)
        _abort_process_group(g2)
        try:
            w.wait()
            out["torch abort"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out["torch abort"] = f"{type(exc).__name__}: {exc}"
        idle.abort()  # nothing in flight on it
        fresh_0.abort()  # no links either
        store.set("abort_test/aborted", "1")
        store.wait(["abort_test/aborted_1"], datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        out["fresh dial"] = timed_raise(lambda: dist.all_reduce(torch.ones(4), group=fresh_1))
    else:
        fresh_1.abort()  # rank 0 dials a rank that aborted before any link existed
        store.set("abort_test/aborted_1", "1")
        store.wait(["abort_test/aborted"], datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1 << 16), group=g)
            out["peer"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out["peer"] = f"{type(exc).__name__}: {exc}"
        out["peer_s"] = time.monotonic() - t0
        try:
            dist.all_reduce(torch.ones(4), group=idle)
            out["idle peer"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out["idle peer"] = f"{type(exc).__name__}: {exc}"
        out["fresh accept"] = timed_raise(lambda: dist.all_reduce(torch.ones(4), group=fresh_0))
        out["error after"] = str(backend.get_error())
        # rank 0 dialled this rank's aborted fresh_1: closed quietly, not a rejected stranger
        out["rejected"] = backend.rejected_connections
    y = torch.full((3,), float(rank + 1))
    dist.all_reduce(y)  # the world group is another instance: unaffected
    out["world"] = y.tolist()
    return out


@pytest.mark.parametrize("topology", [None, "1,1"], ids=["shared memory", "tcp"])
def test_abort_unblocks_the_op_in_flight_and_fails_the_rest(topology):
    env = {"SMDCCL_TOPOLOGY": topology} if topology else None
    r0, r1 = run_ranks(2, abort_hung_group, env=env, timeout=3 * GROUP_TIMEOUT_S)
    aborted = "was aborted on rank 0"
    blocking = r0["blocking"]
    assert not r0["blocking_alive"], "the blocking all_reduce never returned"
    assert blocking["error"].startswith("DistBackendError") and aborted in blocking["error"], blocking
    assert "allreduce" in blocking["error"], blocking  # names the op it stopped
    assert blocking["after_abort_s"] < 1.0, blocking
    for name in ("queued", "recv"):
        for err, seconds in r0[name]:
            assert aborted in err and seconds < 1.0, (name, err, seconds)
    assert r0["torch abort"].startswith("DistBackendError") and aborted in r0["torch abort"], r0
    assert r1["peer"].startswith("DistBackendError") and aborted in r1["peer"], r1
    assert r1["peer_s"] < 5.0, r1
    assert r0["world"] == r1["world"] == [3.0, 3.0, 3.0]
    # a group aborted with nothing in flight: the peer's error names the abort too
    assert r1["idle peer"].startswith("DistBackendError") and aborted in r1["idle peer"], r1
    # a group aborted before it had links: the peer does not wait for the
    # aborted rank to connect (or to answer its dial) until the timeout
    for r, key, who in ((r1, "fresh accept", "rank 0"), (r0, "fresh dial", "rank 1")):
        seconds, err = r[key]
        assert err is not None and f"was aborted on {who}" in err, (key, err)
        assert seconds < 5.0, f"{key}: the peer of the aborted rank raised after {seconds:.1f} s: {err}"
    assert r1["rejected"] == 0, r1
    # backend.get_error(): what fault-tolerant trainers poll
    assert r0["error before"] == r1["error before"] == "ErrorType.SUCCESS", (r0, r1)
    assert r0["error after"] == "ErrorType.COMM_ERROR", r0  # this rank aborted
    assert r1["error after"] == "ErrorType.REMOTE_ERROR", r1  # its peer went away
    print(f"\n[{topology or 'shm'}] abort -> blocking all_reduce raised after {blocking['after_abort_s'] * 1e3:.1f} ms; "
          f"queued/recv waits {max(s for _, s in r0['queued'] + r0['recv']) * 1e3:.1f} ms; "
          f"peer's next all_reduce failed in {r1['peer_s'] * 1e3:.1f} ms; on a group without links: "
          f"{r1['fresh accept'][0] * 1e3:.1f} ms (accepting), {r0['fresh dial'][0] * 1e3:.1f} ms (dialling)")
