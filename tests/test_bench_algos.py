"""``python -m smdccl.bench --algos``: every smdccl backend once per forced
algorithm, with the cost model's algorithm and estimate beside each measured
time; and the ``reduce`` collective. Pure parts (the backend names, the
model's answer, the table's columns), then one real run under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from smdccl.bench import report
from smdccl.bench.backends import model_estimate, with_algos


def test_algos_multiply_smdccl_backends_only():
    names = with_algos(["smdccl", "smdccl+fp16", "gloo"], ["ring", "auto"])
    assert names == ["smdccl@ring", "smdccl@auto", "smdccl+fp16@ring", "smdccl+fp16@auto", "gloo"]
    assert with_algos(["smdccl", "gloo"], None) == ["smdccl", "gloo"]


def test_reduce_is_measured_only_when_asked():
    from smdccl.bench.cli import parse_args

    assert "reduce" not in parse_args([]).collectives  # the README's table keeps its shape
    assert parse_args(["--collectives", "reduce"]).collectives == ["reduce"]


def test_model_estimate_follows_the_forced_algorithm(monkeypatch):
    monkeypatch.delenv("SMDCCL_ALGO", raising=False)
    monkeypatch.delenv("SMDCCL_TUNE_FILE", raising=False)
    algo, sec = model_estimate("smdccl@tree", "allreduce", 1 << 20, [1] * 8)
    assert algo == "tree" and sec > 0
    assert model_estimate("smdccl@ring", "allreduce", 1 << 20, [1] * 8)[0] == "ring"
    # auto: the model's own pick, the cheapest of what it weighs
    auto, best = model_estimate("smdccl@auto", "allreduce", 1 << 20, [1] * 8)
    assert best <= sec and auto in ("halving", "ring", "tree", "rd")
    # a two-level name on one node runs its flat form, and says so
    assert model_estimate("smdccl@two_level", "allreduce", 1 << 20, [4])[0] == "ring"
    # the fp16 wire halves what crosses nodes
    _, wired = model_estimate("smdccl+fp16@ring", "allreduce", 64 << 20, [2, 2])
    _, plain = model_estimate("smdccl@ring", "allreduce", 64 << 20, [2, 2])
    assert wired < 0.7 * plain
    # nothing to say for other backends and for collectives without a model
    assert model_estimate("gloo", "allreduce", 1 << 20, [2]) is None
    assert model_estimate("smdccl@ring", "alltoall", 1 << 20, [2]) is None
    assert os.environ.get("SMDCCL_ALGO") is None  # left as it was


def test_table_shows_model_columns_only_with_algos():
    base = {"collective": "allreduce", "size": 4096, "count": 1024, "dtype": "float32", "op": "sum",
            "time_us": 10.0, "algbw": 0.4, "busbw": 0.6, "wrong": 0, "pass_us": [10.0]}
    plain = report.table([dict(base, backend="smdccl")], [], ["smdccl"], ["allreduce"], "#")
    assert "model(us)" not in plain
    rows = [dict(base, backend="smdccl@tree", model_algo="tree", model_us=12.5),
            dict(base, backend="gloo")]
    text = report.table(rows, [], ["smdccl@tree", "gloo"], ["allreduce"], "#")
    assert "algo" in text and "model(us)" in text and "12.50" in text
    gloo_line = next(line for line in text.splitlines() if line.strip().startswith("gloo"))
    assert gloo_line.split()[-2:] == ["-", "-"]


@pytest.mark.multiprocess
def test_bench_algos_run(tmp_path):
    """4 ranks as 2x2 nodes: every forced algorithm and auto give correct
    allreduce and reduce results, each line with the model's estimate; an
    unknown algorithm is refused with the registered names."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "-m",
            "smdccl.bench", "--backends", "smdccl", "--algos", "ring,halving,tree,two_level_tree,auto",
            "--collectives", "allreduce,reduce", "--sizes", "4K,300K", "--passes", "1",
            "--target-time", "0.02", "--warmup", "1", "--json", "out.json", "--no-progress"]
    env = dict(os.environ, SMDCCL_TOPOLOGY="2x2")
    env.pop("SMDCCL_ALGO", None)
    out = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "#wrong total: 0  OK" in out.stdout, out.stdout[-3000:]
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    by = {(r["backend"], r["collective"], r["size"]): r for r in rows}
    assert {r["backend"] for r in rows} == {f"smdccl@{a}" for a in
                                            ("ring", "halving", "tree", "two_level_tree", "auto")}
    assert by[("smdccl@tree", "allreduce", 4096)]["model_algo"] == "tree"
    assert by[("smdccl@two_level_tree", "allreduce", 4096)]["model_algo"] == "two_level_tree"
    # tree does not run reduce_scatter; for reduce it does, ring too
    assert by[("smdccl@ring", "reduce", 4096)]["model_algo"] == "ring"
    assert all(r["model_us"] and r["model_us"] > 0 for r in rows if r["model_algo"] != "-"), rows

    argv[argv.index("ring,halving,tree,two_level_tree,auto")] = "ring,fastest"
    argv[argv.index("--nproc-per-node") + 1] = "1"  # refused before any group: one rank tells
    bad = subprocess.run(argv, env=dict(env, SMDCCL_TOPOLOGY="1"), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0  # 2 from the rank; torchrun reports 1
    assert "unknown algorithm(s) fastest" in bad.stderr and "two_level_tree" in bad.stderr, bad.stderr
