"""scripts/gpu_check.sh's machinery, without a GPU: its step runner under a
budget of seconds (scripts/gpu_steps.sh), pytest's deadline
(SMDCCL_TEST_DEADLINE in conftest.py) and the report (scripts/gpu_report.py)
over the logs such a run leaves. A lent GPU machine gives one 10-minute
command, so a step that runs long must cost only its own verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _steps(logs: Path) -> list[list[str]]:
    return [line.split() for line in (logs / "steps.txt").read_text().splitlines()]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "gone"


def test_steps_share_one_budget(tmp_path):
    # budget 6 s, 1 s kept for the report, no step started with < 3 s left
    # (bash's SECONDS counts whole seconds: each reading may be 1 s ahead)
    script = f"""
        LOGS={tmp_path}; START=$SECONDS; BUDGET=6; REPORT_RESERVE=1; MIN_STEP=3; PY={sys.executable}
        status=0; exec 3>&1; : > "$LOGS/steps.txt"
        source {REPO}/scripts/gpu_steps.sh
        run_step ok 10 true; echo "after ok: $status"
        STEP_ALSO_OK=5 run_step nothing-selected 10 bash -c 'exit 5'; echo "after 5: $status"
        SMDCCL_GPU_CHECK_SKIP="other skipme" run_step skipme 10 false
        run_step slow 3 bash -c 'setsid sleep 61 & echo $! > {tmp_path}/escaped.pid; wait'
        run_step late 10 true
        echo "final: $status"
    """
    t0 = time.monotonic()
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert "after ok: 0" in out.stdout and "after 5: 0" in out.stdout, out.stdout
    assert "final: 1" in out.stdout, out.stdout
    steps = _steps(tmp_path)
    assert [s[:2] for s in steps] == [["ok", "0"], ["nothing-selected", "5"], ["skipme", "skipped"],
                                      ["slow", "124"], ["late", "not-run"]], steps
    assert 3 <= int(steps[3][2]) <= 4, steps  # stopped at its own 3 s limit, not the sleep's 60
    assert "late not run" in out.stdout
    # the step's process in a session of its own (as test ranks are) was killed
    escaped = int((tmp_path / "escaped.pid").read_text())
    assert not Path(f"/proc/{escaped}").exists() or "zombie" in _state(escaped), "the step left a process"
    assert took < 20, f"the budget of 6 s took {took:.1f} s"


def test_pytest_deadline_fails_tests_not_started(tmp_path):
    env = dict(os.environ, SMDCCL_TEST_DEADLINE=str(time.time() - 1))
    xml = tmp_path / "junit.xml"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                          "tests/test_gpu_check_steps.py::test_steps_share_one_budget"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "not started: the run's deadline (SMDCCL_TEST_DEADLINE) has passed" in out.stdout, out.stdout
    assert "<error" in xml.read_text()  # failed in its setup: an error, no verdict


def _logs(tmp_path: Path, steps: str, kernel_tests: str) -> Path:
    """A logs folder as gpu_check.sh leaves it: steps.txt and the kernel tests' line."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "steps.txt").write_text(steps)
    (logs / "kernel-tests.txt").write_text(kernel_tests)
    return logs


def test_report_reads_every_step(tmp_path):
    logs = _logs(tmp_path, "build 0 80\nkernel-tests 0 3\nstream 0 41\nddp 124 140\n"
                 "kernel-bench 0 30\ncollectives-2ranks 0 50\nmatrix not-run 0\n", "23 passed, 0 failed\n")
    (logs / "test_cuda-stream.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2">'
        '<testcase classname="tests.test_cuda" name="test_cuda_stream_semantics[2]" time="12.5"/>'
        '<testcase classname="tests.test_cuda" name="test_cuda_stream_semantics[4]" time="20.0">'
        '<failure message="boom"/></testcase></testsuite></testsuites>')
    (logs / "test_cuda-ddp.xml").write_text("<testsuites><testsuite")  # cut off by a kill
    copy = 2700.0
    (logs / "kernels.json").write_text(json.dumps([
        {"kernel": "reduce2", "dtype": "float32", "op": "sum", "bytes_per_buffer": 64 << 20,
         "gbps": 2650.0, "copy_gbps": copy, "pct_of_copy": 100 * 2650 / copy}]))
    rows = [{"backend": b, "collective": "allreduce", "size": 64 << 20, "algbw": bw, "time_us": 1e6}
            for b, bw in (("smdccl", 60.0), ("gloo", 2.0))]
    (logs / "collectives-2ranks.json").write_text(json.dumps({"rows": rows}))
    (logs / "probe.txt").write_text("nccl 2.28.9\nnetns no\n")
    (logs / "staged-bench-2x1.txt").write_text(
        "W noise\n# 67108864 B: fp16 packed 1.60x float32 staging, 2.27x gloo\n")
    (logs / "staged-bench-2x1.json").write_text(json.dumps({"rows": [
        {"path": "fp16 packed", "bytes": 64 << 20, "time_us": 21000.0, "cpu_us": 9000.0,
         "pcie_mb": 67.1, "cuda_calls": 41.0}]}))
    hosts = [{"backend": b, "collective": "allreduce", "size": sz, "time_us": t, "algbw": sz / t / 1e3}
             for b, sz, t in (("nccl", 4096, 4800.0), ("smdccl", 4096, 400.0), ("nccl", 64 << 20, 37000.0),
                              ("smdccl", 64 << 20, 26000.0), ("smdccl+fp16", 64 << 20, 24000.0))]
    (logs / "nccl-hosts-2ranks.json").write_text(json.dumps({"header": {}, "rows": hosts}))
    gpu = tmp_path / "earlier.json"  # the GPU's facts from the report written on the GPU machine
    gpu.write_text(json.dumps({"gpu": {"name": "NVIDIA H100 80GB HBM3", "count": 1}}))
    stem = tmp_path / "GPU-date"
    out = subprocess.run([sys.executable, str(REPO / "scripts/gpu_report.py"), "--logs", str(logs),
                          "--stem", str(stem), "--status", "1", "--gpu-json", str(gpu)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr  # the script's status was a failure
    rep = json.loads((tmp_path / "GPU-date.json").read_text())
    assert [s["step"] for s in rep["steps"]][-2:] == ["collectives-2ranks", "matrix"]
    assert rep["steps"][3] == {"step": "ddp", "rc": 124, "seconds": 140}
    assert rep["tests"]["tests"] == 3 and rep["tests"]["failures"] == 1 and rep["tests"]["errors"] == 1
    assert rep["kernels"]["met"] and rep["collectives"]["allreduce_64MiB_2ranks"]["ratio"] == 30.0
    md = (tmp_path / "GPU-date.md").read_text()
    assert "| ddp | 124 | 140 |" in md and "| matrix | not-run | 0 |" in md
    assert "[stream] test_cuda_stream_semantics[4]: failure" in md
    assert "test_cuda-ddp.xml unreadable" in md
    assert "30.0x -> MET" in md
    assert rep["gpu"]["name"] == "NVIDIA H100 80GB HBM3" and "- netns no" in md
    assert "smdccl time <= nccl's at 4 KiB: 0.08 x nccl's time -> MET" in md
    assert "smdccl time <= nccl's at 65536 KiB: 0.70 x nccl's time -> MET" in md
    assert "smdccl+fp16 algbw >= 1.6x nccl's at 64 MiB: 1.54 x nccl's algbw -> MISSED" in md
    assert "| 4 KiB | 4800 (0.00) | 400 (0.01) | - | 0.08x |" in md
    assert "fp16 packed 1.60x float32 staging" in md and "W noise" not in md
    # the staged rows: PCIe bytes and CUDA calls per call (issue 41's counts)
    assert "[staged-bench-2x1]    fp16 packed   67108864     21000.0     67.10      41" in md


def test_resumed_check_runs_only_steps_without_a_result(tmp_path):
    # a second 10-minute command goes on where the first ran out of budget
    (tmp_path / "steps.txt").write_text("build 0 80\nstream 1 40\nmatrix not-run 0\nbench skipped 0\n")
    script = f"""
        LOGS={tmp_path}; START=$SECONDS; BUDGET=60; REPORT_RESERVE=1; MIN_STEP=3; PY={sys.executable}
        status=0; exec 3>&1; SMDCCL_GPU_CHECK_RESUME=1
        source {REPO}/scripts/gpu_steps.sh
        run_step build 10 false; run_step stream 10 false
        run_step matrix 10 true; run_step bench 10 true
        echo "status: $status"
        steps_failed && echo "a step failed"
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "status: 0" in out.stdout, out.stdout  # build and stream were not run again
    assert "build has a result from an earlier command" in out.stdout
    assert [s[:2] for s in _steps(tmp_path)][-2:] == [["matrix", "0"], ["bench", "0"]]
    assert "a step failed" in out.stdout  # stream's 1 from the first command still counts


def test_steps_failed_reads_each_steps_last_result(tmp_path):
    script = f"""
        LOGS={tmp_path}; source {REPO}/scripts/gpu_steps.sh
        steps_failed && echo yes || echo no
    """
    for lines, want in (("a 0 1\nb 5 1\nc skipped 0\n", "no"), ("a 0 1\nb 124 9\n", "yes"),
                        ("a not-run 0\na 0 5\n", "no"), ("a 0 1\nb not-run 0\n", "yes")):
        (tmp_path / "steps.txt").write_text(lines)
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == want, (lines, out.stdout, out.stderr)


def test_step_reserve_and_steps_the_machine_cannot_run(tmp_path):
    # STEP_RESERVE keeps seconds from a step for those after it (a hung step
    # beside others must leave the NCCL comparison its time); an exit code in
    # STEP_NA is recorded n/a and fails nothing (no tc to shape lo)
    script = f"""
        LOGS={tmp_path}; START=$SECONDS; BUDGET=14; REPORT_RESERVE=1; MIN_STEP=2; PY={sys.executable}
        status=0; exec 3>&1; : > "$LOGS/steps.txt"
        source {REPO}/scripts/gpu_steps.sh
        STEP_NA=3 run_step no-tc 10 bash -c 'exit 3'; echo "after n/a: $status"
        steps_failed && echo "n/a failed" || echo "n/a passed"
        STEP_RESERVE=8 run_step held 30 sleep 30
        run_step after 10 true; echo "final: $status"
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "after n/a: 0" in out.stdout and "n/a passed" in out.stdout, out.stdout
    steps = _steps(tmp_path)
    assert [s[:2] for s in steps] == [["no-tc", "n/a"], ["held", "124"], ["after", "0"]], steps
    assert 3 <= int(steps[1][2]) <= 6, steps  # 14 - 1 - 8 = 5 s, not its cap of 30 nor all that was left
    assert "final: 1" in out.stdout, out.stdout


def test_report_targets_of_skipped_steps_are_not_measured(tmp_path):
    logs = _logs(tmp_path, "build 0 60\nkernel-tests 0 20\nnccl-hosts-2ranks-lo10gbit 0 50\n"
                 "kernel-bench skipped 0\ncollectives-2ranks skipped 0\n", "25 passed, 0 failed\n")
    big = 64 << 20
    hosts = [{"backend": b, "collective": "allreduce", "size": sz, "time_us": t, "algbw": sz / t / 1e3}
             for b, sz, t in (("nccl", 4096, 300.0), ("smdccl", 4096, 250.0), ("nccl", big, 108000.0),
                              ("smdccl", big, 110000.0), ("smdccl+fp16", big, 57000.0),
                              ("smdccl+int8", big, 40000.0))]
    (logs / "nccl-hosts-2ranks-lo10gbit.json").write_text(json.dumps({"header": {}, "rows": hosts}))
    (logs / "nccl-hosts-2ranks-lo10gbit.txt").write_text(
        "shaped_loopback: lo shaped to 10 Gbit/s\nloopback_rate_mbps 1259\n# allreduce\n")
    (logs / "cluster-10gbit.json").write_text(json.dumps({"header": {}, "rows": hosts}))
    (logs / "burst-bench.json").write_text(json.dumps({"rows": [
        {"path": "nccl", "bytes": 4096, "one_us": 100.0, "burst_us": 250.0},
        {"path": "staged", "bytes": 4096, "one_us": 100.0, "burst_us": 400.0}]}))
    stem = tmp_path / "GPU-date"
    out = subprocess.run([sys.executable, str(REPO / "scripts/gpu_report.py"), "--logs", str(logs),
                          "--stem", str(stem), "--status", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # nothing failed, and the skipped steps' targets do not count
    md = (tmp_path / "GPU-date.md").read_text()
    assert "not measured (kernel-bench skipped)" in md and "not measured (collectives-2ranks skipped)" in md
    assert "one TCP stream measured 1259 MB/s" in md
    assert "smdccl time <= nccl's at 4 KiB: 0.83 x nccl's time -> MET" in md
    assert "smdccl algbw >= 0.95x nccl's at 64 MiB: 0.98 x nccl's algbw -> MET" in md
    assert "smdccl+fp16 algbw >= 1.8x nccl's at 64 MiB: 1.89 x nccl's algbw -> MET" in md
    assert "smdccl+int8 algbw >= 3.0x nccl's at 64 MiB: 2.70 x nccl's algbw -> MISSED" in md
    assert "nccl's at 65536 KiB" not in md  # the shaped run's time target is at 4 KiB only
    assert "## cluster-10gbit:" in md and md.count("smdccl+int8 algbw >= 3.0x") == 2  # the cluster too
    assert "emulated nodes (network namespaces) on shaped veths" in md
    assert "| nccl | 4096 | 100.0 | 250.0 | 2.50x |" in md
    assert "Target: nccl burst <= 3x one -> MET" in md and "Target: staged burst <= 3x one -> MISSED" in md
    # skipped by the first command, run by a resumed one that left no data:
    # the last record counts, the targets are missed
    (logs / "steps.txt").write_text("build 0 60\nkernel-bench skipped 0\ncollectives-2ranks skipped 0\n"
                                    "kernel-bench 0 30\ncollectives-2ranks 0 50\n")
    out = subprocess.run([sys.executable, str(REPO / "scripts/gpu_report.py"), "--logs", str(logs),
                          "--stem", str(stem), "--status", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "no kernel records -> MISSED" in (tmp_path / "GPU-date.md").read_text()


def test_shaped_loopback_reports_what_it_cannot_do(tmp_path):
    # without tc on PATH the wrapper exits 3 before running its command
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("bash", "env", "dirname", "python3"):
        src = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (fake / tool).symlink_to(src)
    out = subprocess.run([str(fake / "bash"), str(REPO / "scripts/shaped_loopback.sh"), "10", "--", "touch",
                          str(tmp_path / "ran")], env={"PATH": str(fake), "SMDCCL_SHAPED_NETNS": "1"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert "tc cannot put a tbf qdisc on lo here" in out.stderr
    assert not (tmp_path / "ran").exists()
