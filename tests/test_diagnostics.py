"""What smdccl tells a user whose job went wrong, from real multi-process runs.

Why: NCCL and gloo users lose days to "collective operation timeout" with no
hint of the cause. Each case here provokes one cause and asserts that the
error or the log names it:

- mismatched collectives (different op, size, dtype) at the same step: the
  op header that opens each op's first message on a link makes the receiving
  rank raise, naming both calls; every rank fails (no hang).
- SMDCCL_DEBUG=DETAIL: the full fingerprint also catches what the cheap
  check cannot (same element count but different shapes; two ranks that both
  think they are the broadcast root, so nobody receives).
- SMDCCL_NAN_CHECK=1: NaN/Inf in an input makes every rank raise ValueError
  naming the ranks and the op before any data moves; the group keeps working.
- SMDCCL_WARN_AFTER: a collective that waits too long logs which ranks are in
  it and which have not arrived (and what they did last); a recv logs what
  it is missing (messages of another tag that nobody takes, no connection).

Each mismatch runs on its own fresh subgroup, since a mismatch leaves that
group's streams out of step and the group unusable (by design). smdccl only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import trace_breakdown  # noqa: E402

pytestmark = pytest.mark.smdccl_only


def _capture_stderr(fn):
    """Runs fn() with fd 2 captured; returns (fn's result, stderr text)."""
    import os
    import tempfile

    with tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        return result, capture.read().decode()


def mismatches() -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    other = 1 - rank
    cases = {
        # name: (this rank's call, the text its error must hold)
        "op": (lambda g: dist.all_reduce(torch.ones(4), group=g) if rank == 0
               else dist.all_gather_into_tensor(torch.empty(8), torch.ones(4), group=g)),
        "size": lambda g: dist.all_reduce(torch.ones(4 + rank), group=g),
        "dtype": lambda g: dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64),
                                           group=g),
        "reduce op": lambda g: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.SUM if rank == 0
                                               else dist.ReduceOp.MAX, group=g),
        # uneven lists that disagree: rank 1's block has 4 elements for rank 0, 5 for itself
        "uneven sizes": lambda g: dist.all_gather([torch.empty(3), torch.empty(4 + rank)],
                                                  torch.ones(3 if rank == 0 else 5), group=g),
        "sparse vs dense": lambda g: dist.all_reduce(torch.ones(4) if rank == 0 else torch.ones(4).to_sparse(),
                                                     group=g),
    }
    out = {}
    for name, call in cases.items():
        g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=20))
        t = torch.ones(3)
        dist.all_reduce(t, group=g)  # the group works
        try:
            call(g)
        except Exception as exc:  # noqa: BLE001 - the type is checked below
            out[name] = f"{type(exc).__name__}: {exc}"
        else:
            out[name] = "no error"
        # Later calls fail fast with the same cause.
        try:
            dist.all_reduce(torch.ones(3), group=g)
            out[name + " after"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out[name + " after"] = str(exc)
        dist.barrier()  # world group, unaffected
    # all_to_all_single split sizes that disagree: rank 0 sends rank 1 two
    # elements, rank 1 expects one. The header carries each message's size.
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=20))
    try:
        if rank == 0:
            dist.all_to_all_single(torch.empty(4), torch.ones(4), [2, 2], [2, 2], group=g)
        else:
            dist.all_to_all_single(torch.empty(3), torch.ones(4), [1, 2], [2, 2], group=g)
        out["split"] = "no error"
    except Exception as exc:  # noqa: BLE001
        out["split"] = str(exc)
    try:
        dist.all_reduce(torch.ones(3), group=g)
        out["split after"] = "no error"
    except Exception as exc:  # noqa: BLE001
        out["split after"] = str(exc)
    dist.barrier()
    out["other"] = other
    return out


def test_mismatched_collectives_raise_on_every_rank_naming_both_calls():
    results = run_ranks(2, mismatches, timeout=240)
    expect = {
        "op": ("allreduce(Float, 4 elements, sum)", "all_gather_into_tensor(Float, 4 elements)"),
        "size": ("allreduce(Float, 4 elements, sum)", "allreduce(Float, 5 elements, sum)"),
        "dtype": ("allreduce(Float, 4 elements, sum)", "allreduce(Double, 4 elements, sum)"),
        "reduce op": ("allreduce(Float, 4 elements, sum)", "allreduce(Float, 4 elements, max)"),
        "uneven sizes": ("allgather(Float, 7 elements)", "allgather(Float, 8 elements)"),
        "sparse vs dense": ("allreduce(Float, 4 elements, sum)", "sparse_allreduce(Float, sum)"),
    }
    for name, calls in expect.items():
        errors = [r[name] for r in results]
        for rank, err in enumerate(errors):
            assert err.startswith("DistBackendError") and "mismatched collectives" in err, (name, rank, err)
            # Each error names this rank's call and the other's (first-failure cause included).
            assert all(c in err for c in calls), (name, rank, err)
            assert "mismatched collectives" in results[rank][name + " after"], (name, rank)
    split = "rank 0 sends 8 bytes where this rank expects 4 in all_to_all_single(Float)"
    assert split in results[1]["split"] and "split sizes" in results[1]["split"], results[1]["split"]
    # Rank 0's own part may have completed; then its next call reports the cause.
    assert split in results[0]["split"] or split in results[0]["split after"], results[0]


def detail_fingerprint() -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    out = {}
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=20))
    t = torch.ones(2, 3) if rank == 0 else torch.ones(3, 2)
    try:
        dist.all_reduce(t, group=g)
        out["shape"] = "no error"
    except Exception as exc:  # noqa: BLE001
        out["shape"] = str(exc)
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=20))
    try:
        dist.broadcast(torch.ones(4), src=rank, group=g)  # both think they are the root
        out["root"] = "no error"
    except Exception as exc:  # noqa: BLE001
        out["root"] = str(exc)
    # Matching calls still work under DETAIL.
    g = dist.new_group(backend="smdccl")
    x = torch.full((5,), float(rank))
    dist.all_reduce(x, group=g)
    out["ok"] = x.tolist()
    return out


def test_detail_fingerprint_catches_shapes_and_two_roots():
    results = run_ranks(2, detail_fingerprint, env={"SMDCCL_DEBUG": "DETAIL"}, timeout=240)
    for r in results:
        assert "mismatched collectives" in r["shape"] and "different tensor shapes" in r["shape"], r["shape"]
        assert "mismatched collectives" in r["root"], r["root"]
        assert "root 0" in r["root"] and "root 1" in r["root"], r["root"]
        assert r["ok"] == [1.0] * 5


def nan_check() -> dict:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    out = {}
    x = torch.ones(1000)
    if rank == 1:
        x[17] = float("nan")
    h = torch.ones(64, dtype=torch.float16)
    if rank == 2:
        h[3] = float("inf")
    for name, t in (("nan", x), ("fp16 inf", h)):
        try:
            dist.all_reduce(t)
            out[name] = "no error"
        except ValueError as exc:
            out[name] = str(exc)
    # Nothing moved: the inputs are as they were.
    out["x untouched"] = bool((x[:17] == 1).all() and (x[18:] == 1).all())
    both = torch.ones(8)
    if rank in (0, 2):
        both[5] = float("nan")
    try:
        dist.reduce_scatter_tensor(torch.empty(2), both)
        out["rs"] = "no error"
    except ValueError as exc:
        out["rs"] = str(exc)
    # A broadcast only sends the root's tensor: NaN elsewhere is not an error.
    b = torch.full((4,), float("nan")) if rank != 0 else torch.arange(4.0)
    dist.broadcast(b, src=0)
    out["broadcast"] = b.tolist()
    # Integers are not checked (and cannot hold NaN); the group still works.
    i = torch.full((4,), rank, dtype=torch.int64)
    dist.all_reduce(i)
    out["int"] = i.tolist()
    return out


def test_nan_check_names_the_ranks_and_the_op_on_every_rank():
    results = run_ranks(4, nan_check, env={"SMDCCL_NAN_CHECK": "1"}, timeout=180)
    for rank, r in enumerate(results):
        assert "SMDCCL_NAN_CHECK" in r["nan"] and "allreduce #" in r["nan"], r["nan"]
        assert re.search(r"input of rank\(s\) 1[;.]", r["nan"]), r["nan"]
        if rank == 1:
            assert "element 17 (nan)" in r["nan"], r["nan"]
        assert re.search(r"input of rank\(s\) 2[;.]", r["fp16 inf"]) and "inf" in r["fp16 inf"].lower(), r["fp16 inf"]
        assert r["x untouched"]
        assert "reduce_scatter_tensor #" in r["rs"] and "rank(s) 0, 2" in r["rs"], r["rs"]
        assert r["broadcast"] == [0.0, 1.0, 2.0, 3.0]
        assert r["int"] == [6] * 4


def nan_check_send_recv() -> dict:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    out = {}
    bad = torch.ones(100)
    bad[42] = float("nan")

    def raised(fn) -> str:
        try:
            fn()
            return "no error"
        except ValueError as exc:
            return str(exc)

    # 1. The receive is posted before the send arrives.
    got = torch.full((100,), 7.0)
    if rank == 1:
        req = dist.irecv(got, src=0, tag=5)
    dist.barrier()
    if rank == 0:
        out["send"] = raised(lambda: dist.send(bad, dst=1, tag=5))
    else:
        out["recv posted"] = raised(req.wait)
        out["left as it was"] = bool((got == 7.0).all())
    # 2. The report arrives before the receive is posted.
    if rank == 0:
        out["send 2"] = raised(lambda: dist.send(bad, dst=1, tag=6))
    dist.barrier()
    if rank == 1:
        out["recv early"] = raised(lambda: dist.recv(got, src=0, tag=6))
    # 3. The pair goes on: finite data moves.
    if rank == 0:
        dist.send(torch.arange(100.0), dst=1, tag=7)
    else:
        dist.recv(got, src=0, tag=7)
        out["after"] = bool(torch.equal(got, torch.arange(100.0)))
    return out


def test_nan_check_covers_send_and_recv():
    """SMDCCL_NAN_CHECK on point-to-point: the sender raises ValueError naming
    the element, sends the receiver its report instead of the data, and the
    receive raises too (posted before or after the report arrived), leaving
    its tensor as it was; later messages of the pair are not affected."""
    r0, r1 = run_ranks(2, nan_check_send_recv, env={"SMDCCL_NAN_CHECK": "1"}, timeout=120)
    for key in ("send", "send 2"):
        assert "SMDCCL_NAN_CHECK" in r0[key] and "element 42 (nan)" in r0[key], r0[key]
        assert "send to rank 1" in r0[key], r0[key]
    for key in ("recv posted", "recv early"):
        assert "SMDCCL_NAN_CHECK" in r1[key] and "recv from rank 0" in r1[key], r1[key]
        assert "element 42 (nan)" in r1[key], r1[key]
    assert r1["left as it was"] and r1["after"]


def nan_passes_without_check() -> bool:
    import math

    import torch
    import torch.distributed as dist

    x = torch.ones(10)
    if dist.get_rank() == 0:
        x[2] = float("nan")
    dist.all_reduce(x)
    return math.isnan(x[2].item()) and x[3].item() == 2.0


def test_without_nan_check_nan_is_a_result():
    assert run_ranks(2, nan_passes_without_check) == [True, True]


def late_rank() -> str:
    import time

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    t = torch.ones(100)
    dist.all_reduce(t)

    def late_allreduce():
        if rank == 2:
            time.sleep(4)
        x = torch.ones(100)
        dist.all_reduce(x)
        return x[0].item()

    value, log = _capture_stderr(late_allreduce)
    assert value == 3.0
    return log


def test_warn_after_names_who_has_not_arrived():
    logs = run_ranks(3, late_rank, env={"SMDCCL_WARN_AFTER": "1"}, timeout=120)
    for rank in (0, 1):
        lines = [line for line in logs[rank].splitlines() if "has waited" in line]
        assert len(lines) == 1, logs[rank]
        line = lines[0]
        assert "allreduce #2 on group" in line and "waiting in it: rank(s) 0, 1" in line, line
        assert "not arrived: 2 (last: #1 allreduce, finished)" in line, line
    assert "has waited" not in logs[2]


def late_recvs() -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    g = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=2.5))
    g_quiet = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=2.5))
    g_unread = dist.new_group(backend="smdccl", timeout=datetime.timedelta(seconds=5))
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "no error"
        except Exception as exc:  # noqa: BLE001 - checked by the test
            out[name] = f"{type(exc).__name__}: {exc}"

    def receives():
        # rank 1 sent tag 5; this receive asks for tag 6
        attempt("tag mismatch", lambda: dist.recv(torch.zeros(4), src=1, tag=6, group=g))
        attempt("any source", lambda: dist.recv(torch.zeros(4), tag=7, group=g))
        # rank 1 never sends on g_quiet
        attempt("not connected", lambda: dist.recv(torch.zeros(4), src=1, tag=1, group=g_quiet))
        t = torch.zeros(4)
        dist.recv(t, src=1, tag=5, group=g)  # the message was there all along
        out["tag 5"] = t.tolist()

    def sends():
        dist.send(torch.full((4,), 5.0), dst=0, tag=5, group=g)
        # rank 0 posts no receive on g_unread: once the socket's buffers are
        # full, nothing reads the rest of these 64 MiB
        attempt("unread send", lambda: dist.send(torch.ones(16 << 20), dst=0, tag=3,
                                                 group=g_unread))

    if rank == 1:
        _, out["log"] = _capture_stderr(sends)
    else:
        _, out["log"] = _capture_stderr(receives)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def late_p2p() -> list:
    """One run of late_recvs: rank 0's late receives, rank 1's unread send."""
    return run_ranks(2, late_recvs, env={"SMDCCL_WARN_AFTER": "1"}, timeout=120)


def test_warn_after_says_what_a_late_recv_is_missing(late_p2p):
    r0 = late_p2p[0]
    lines = [line for line in r0["log"].splitlines() if "has waited" in line]
    expect = [
        "recv from rank 1 (tag 6, 16 bytes)", "rank 1 sent tag(s) 5 (1) that no receive took, not tag 6",
        "recv from any source (tag 7, 16 bytes)", "no rank has sent tag 7; rank 1 sent tag(s) 5 (1)",
        "recv from rank 1 (tag 1, 16 bytes)", "rank 1 has not connected for send/recv yet",
    ]
    assert len(lines) == 3, r0["log"]
    for line, (who, why) in zip(lines, zip(expect[::2], expect[1::2])):
        assert who in line and why in line and "SMDCCL_WARN_AFTER=1" in line, (line, who, why)
    for name in ("tag mismatch", "any source", "not connected"):
        assert r0[name].startswith("DistBackendError") and "timed out" in r0[name], (name, r0[name])
    assert r0["tag 5"] == [5.0] * 4


def test_warn_after_says_what_a_late_send_is_stuck_on(late_p2p):
    r1 = late_p2p[1]
    lines = [line for line in r1["log"].splitlines() if "has sent nothing" in line]
    assert len(lines) == 1, r1["log"]
    line = lines[0]
    print(f"\n{line}")
    assert re.search(r"has sent nothing for \d+ s \(SMDCCL_WARN_AFTER=1\)", line), line
    for part in (f"send to rank 0 (tag 3, {64 << 20} bytes) on group",
                 "bytes (with the header) are out and rank 0 is not reading them (has it "
                 "posted a recv from this rank?)"):
        assert part in line, (part, line)
    sent = int(line.split("): ")[1].split(" of ")[0])
    assert 0 < sent < (64 << 20), line
    assert r1["unread send"].startswith("DistBackendError"), r1["unread send"]
    assert "timed out" in r1["unread send"], r1["unread send"]


def traced_job(path: str) -> str:
    import torch
    import torch.distributed as dist

    t = torch.ones(1000)
    dist.all_reduce(t)
    works = [dist.all_reduce(torch.ones(100), async_op=True) for _ in range(4)]
    for w in works:
        w.wait()
    dist.all_gather_into_tensor(torch.empty(2 * 4096), torch.ones(4096))
    dist.destroy_process_group()  # writes the file
    return path


def test_trace_writes_a_chrome_timeline_per_rank(tmp_path):
    import json

    path = str(tmp_path / "trace.json")
    run_ranks(2, traced_job, path, env={"SMDCCL_TRACE": path}, timeout=120)
    for rank in (0, 1):
        doc = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())
        assert doc["otherData"]["rank"] == rank
        events = doc["traceEvents"]
        assert {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}} in events
        spans = [e for e in events if e["ph"] == "X"]
        assert all(e["pid"] == rank and e["dur"] >= 0 for e in spans)
        ops = [e for e in spans if e["cat"] == "collective"]
        names = [e["name"] for e in ops]
        assert names[0] == "allreduce #1" and "all_gather_into_tensor #6" in names, names
        assert ops[0]["args"]["call"] == "allreduce(Float, 1000 elements, sum)"
        # Every op was queued first, and its algorithm span lies inside it.
        queued = {e["name"] for e in spans if e["cat"] == "queue"}
        assert {f"{n} queued" for n in names} <= queued
        first_algo = next(e for e in spans if e["cat"] == "algorithm")
        assert ops[0]["ts"] <= first_algo["ts"] and \
            first_algo["ts"] + first_algo["dur"] <= ops[0]["ts"] + ops[0]["dur"], (ops[0], first_algo)
        assert any(e["name"] == "fusion: agree on the count" for e in spans)
        # scripts/trace_breakdown.py reads it: the first allreduce's call, its
        # algorithm's time inside the op's, and a gap to the next op.
        row = trace_breakdown.breakdown(events)["allreduce(Float, 1000 elements, sum)"]
        assert row["calls"] >= 1 and 0 < row["algorithm_us"] <= row["op_us"], row
        assert row["around_us"] == row["op_us"] - row["algorithm_us"] and row["gap_us"] >= 0, row


def test_trace_breakdown_takes_the_medians_of_each_call():
    def x(cat, name, ts, dur, tid=0, call=None):
        return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": dur,
                **({"args": {"call": call}} if call else {})}

    events = [
        x("collective", "allreduce #1", 0, 10, call="a"),
        x("algorithm", "ring, 4 B", 2, 6),
        x("collective", "allreduce #2", 30, 20, call="a"),
        x("algorithm", "ring, 4 B", 31, 4),
        x("algorithm", "cuda allreduce: staged", 40, 8),
        x("algorithm", "ring, 4 B", 41, 5),  # nested in the CUDA span: counted once
        x("collective", "barrier #3", 60, 1, call="b"),
        x("collective", "allreduce #1", 5, 40, tid=1, call="c"),  # another group's track
        x("algorithm", "tree, 4 B", 6, 30, tid=1),
    ]
    rows = trace_breakdown.breakdown(events)
    assert rows["a"] == {"calls": 2, "op_us": 15, "algorithm_us": 9, "around_us": 6, "gap_us": 15}
    assert rows["b"] == {"calls": 1, "op_us": 1, "algorithm_us": 0, "around_us": 1}
    assert rows["c"] == {"calls": 1, "op_us": 40, "algorithm_us": 30, "around_us": 10}


def trace_logged() -> str:
    import torch
    import torch.distributed as dist

    def ops():
        dist.all_reduce(torch.ones(1000))
        dist.all_reduce(torch.ones(1000))

    return _capture_stderr(ops)[1]


def test_debug_trace_logs_each_decision_and_timing():
    logs = run_ranks(2, trace_logged, env={"SMDCCL_DEBUG": "TRACE"}, timeout=120)
    for rank, log in enumerate(logs):
        for seq in (1, 2):  # every op, not once per size range
            assert re.search(rf"allreduce #{seq} on group '\S+' \(rank {rank}\): allreduce of 4000 B -> \w+", log), log
            assert re.search(rf"allreduce #{seq} on group '\S+' \(rank {rank}\) allreduce\(Float, 1000 elements, sum\): "
                             rf"\d+ us", log), log


def progress_and_copy_counters() -> dict:
    """The counters a benchmark reads: the progress thread's CPU clock grows
    with the async work it runs; CPU tensors copy nothing to or from a GPU."""
    import time

    import torch
    import torch.distributed as dist

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    before = backend.progress_cpu_seconds
    x = torch.ones(1 << 20)
    start = time.process_time()
    for _ in range(20):
        dist.all_reduce(x, async_op=True).wait()
    used = time.process_time() - start
    after = backend.progress_cpu_seconds
    assert float(x[0]) == float(dist.get_world_size()) ** 20
    return {"before": before, "after": after, "process": used,
            "copied": dict(backend.device_copied_bytes),
            "pinned": backend.pinned_staging_bytes}


def test_progress_cpu_seconds_and_device_copied_bytes():
    for r in run_ranks(2, progress_and_copy_counters):
        # 20 async allreduces of 4 MiB ran on the progress thread: it used CPU,
        # but never more than the whole process did meanwhile.
        assert r["after"] > r["before"], r
        assert r["after"] - r["before"] <= r["process"] + 0.05, r
        assert r["copied"] == {"to_host": 0, "from_host": 0}, r
        assert r["pinned"] == 0, r  # CPU tensors stage nothing
