"""``python -m smdccl.bench.ddp``, ``.accuracy`` and ``.sparse`` end to end.

Real processes under torchrun, every rank its own virtual node
(``SMDCCL_TOPOLOGY=1,1``, so the fp16/bf16 hooks do compress), tiny settings:
the DDP bench measures all four configurations, every row has positive
times, an overlap share in [0, 1], halved inter-node bytes for the compressed
configurations, similar final losses, and the JSON is written; the accuracy
mode reports smdccl's fp16 error no worse than torch's fp16_compress_hook's
at 2 ranks (one compressed hop) and 4 (recursive halving).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

from harness import REPO_ROOT


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    for k in ("SMDCCL_TUNE_FILE", "SMDCCL_ALGO", "SMDCCL_TOPOLOGY", "SMDCCL_COMPRESSION",
              "SMDCCL_COMPRESSION_INTRA"):
        env.pop(k, None)
    # The smdccl the tests import (installed, with its engine), first on the path.
    import smdccl

    pkg_parent = str(Path(smdccl.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        [pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def _torchrun(nproc: int, module: str, *args: str, timeout: float = 120):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", module, *args]
    topology = ",".join(["1"] * nproc)  # every rank its own node: every hop compressed
    return subprocess.run(cmd, env=_env(SMDCCL_TOPOLOGY=topology), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _bench_json(nproc: int, module: str, out: Path, *args: str, timeout: float = 120) -> tuple[dict, str]:
    """Runs the benchmark with ``--json out`` under torchrun; once it exited 0,
    its JSON and what it printed."""
    proc = _torchrun(nproc, module, *args, "--json", str(out), timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-5000:]}"
    print("\n" + proc.stdout)
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.smdccl_only
@pytest.mark.multiprocess
def test_ddp_bench_two_virtual_nodes(tmp_path):
    out = tmp_path / "ddp.json"
    doc, stdout = _bench_json(2, "smdccl.bench.ddp", out, "--model", "tiny", "--steps", "4", "--warmup", "2",
                              "--comm-iters", "3")
    head, rows = doc["header"], doc["rows"]
    assert head["world_size"] == 2 and head["nodes"] == 2, head
    assert head["command_line"].startswith("torchrun --nproc-per-node 2 -m smdccl.bench.ddp")
    assert [r["config"] for r in rows] == ["gloo", "smdccl", "smdccl+fp16", "smdccl+bf16", "smdccl+int8"]
    for r in rows:
        assert r["step_ms"] > 0 and r["compute_ms"] > 0 and r["comm_ms"] > 0, r
        assert 0.0 <= r["hidden"] <= 1.0, r
        assert r["grad_bytes"] == sum(head["bucket_bytes"]) > 0
        assert len(r["loss_curve"]) == 6 and r["final_loss"] < r["first_loss"], r["loss_curve"]
    by = {r["config"]: r for r in rows}
    # p = n = 2: every scheme sends S per uplink in float32, half of it in 16 bits
    assert by["smdccl"]["inter_bytes_per_uplink"] == by["gloo"]["inter_bytes_per_uplink"] == rows[0]["grad_bytes"]
    assert by["smdccl+fp16"]["inter_bytes_per_uplink"] == rows[0]["grad_bytes"] / 2
    assert by["smdccl+fp16"]["group_compression"] == "fp16"
    assert by["smdccl+bf16"]["group_compression"] == "bf16"
    # int8: 1 + 4/128 bytes per 4 (the scales count)
    assert by["smdccl+int8"]["inter_bytes_per_uplink"] == rows[0]["grad_bytes"] * 1.03125 / 4
    assert by["smdccl+int8"]["group_compression"] == "int8"
    assert head["losses_similar"] and head["loss_spread_rel"] < 1e-2
    for name in by:
        assert f"\n   {name} " in stdout
    assert "hidden = clamp((compute + comm - step) / comm, 0, 1)" in stdout


@pytest.mark.smdccl_only
@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks", [2, 4])  # 4: the recursive-halving schedule
def test_accuracy_smdccl_fp16_not_worse_than_torch_hook(tmp_path, ranks):
    out = tmp_path / "acc.json"
    proc = _torchrun(ranks, "smdccl.bench.accuracy", "--count", "262144", "--json", str(out),
                     timeout=240)
    print("\n" + proc.stdout)
    doc = json.loads(out.read_text())
    assert doc["header"]["smdccl_compression"] == "fp16"
    assert doc["header"]["smdccl_topology"].startswith(f"{ranks} nodes")
    assert len(doc["rows"]) == 4
    for r in doc["rows"]:
        assert r["torch_fp16_hook_max_abs_err"] > 0 and r["smdccl_fp16_max_abs_err"] > 0, r
        assert r["smdccl_fp16_max_abs_err"] <= r["torch_fp16_hook_max_abs_err"], r
        assert r["smdccl_fp16_ranks_differ"] == 0 and r["smdccl_fp16_finite"], r
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-5000:]}"


@pytest.mark.smdccl_only
@pytest.mark.multiprocess
def test_sparse_bench_checks_every_result(tmp_path):
    """``python -m smdccl.bench.sparse``: both backends measured, no wrong element."""
    out = tmp_path / "sparse.json"
    doc, _ = _bench_json(2, "smdccl.bench.sparse", out, "--rows", "500", "--dim", "8", "--nnz", "0,40,300",
                            "--iters", "3")
    assert doc["world_size"] == 2 and doc["command"].startswith("torchrun --nproc-per-node 2"), doc
    assert [r["nnz_per_rank"] for r in doc["results"]] == [0, 40, 300], doc
    for row in doc["results"]:
        for backend in ("smdccl", "gloo"):
            assert row[f"{backend}_wrong"] == 0 and row[f"{backend}_median_us"] > 0, row
