"""Builds and runs the torch-free C++ unit tests (topology, CPU reductions,
shared-memory transport, exchange and connect deadlines, fuzzing of the handshake and
send/recv frame parsers and of the TCP listener) with CMake, without torch:
this is also the proof that those layers do not depend on it.

The CMake tree that `pip install .` left in build/ already holds the core
library: the tests are built there (only their own files compile), and no
command that builds them may name torch. Without such a tree (a wheel
install), a core-only tree is configured without torch."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARDS = 2


def _cache_value(cache: Path, key: str) -> str | None:
    m = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", cache.read_text(errors="replace"), re.M)
    return m.group(1) if m else None


def pip_build_tree(root: Path = ROOT) -> Path | None:
    """The newest CMake tree setup.py configured for this checkout, if any."""
    trees = []
    for cache in root.glob("build/temp.*/cmake/CMakeCache.txt"):
        home = _cache_value(cache, "CMAKE_HOME_DIRECTORY")
        if (home and Path(home).resolve() == root.resolve()
                and _cache_value(cache, "SMDCCL_BUILD_TESTS") not in ("OFF", "0", "FALSE")
                and _cache_value(cache, "SMDCCL_SANITIZE") in (None, "OFF")
                and (cache.parent / "build.ninja").exists()):
            trees.append(cache.parent)
    return max(trees, key=lambda t: (t / "CMakeCache.txt").stat().st_mtime, default=None)


def ninja_commands(build: Path, target: str) -> list[str]:
    """Every command ninja runs to build `target` (its dependencies included)."""
    out = subprocess.run(["ninja", "-C", str(build), "-t", "commands", target],
                         check=True, capture_output=True, text=True).stdout
    return [c for c in out.splitlines() if c.strip()]


def torch_nccl() -> Path | None:
    """The libnccl.so.2 a CUDA build of torch installs (nvidia-nccl wheel), if any."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(root) / "nccl" / "lib" / "libnccl.so.2"
        if lib.exists():
            return lib
    return None


def test_torch_cuda_builds_ship_the_nccl_the_loader_test_loads():
    import torch

    if torch.version.cuda is None:
        pytest.skip("a CPU build of torch ships no NCCL")
    assert torch_nccl() is not None, "a CUDA build of torch without nvidia/nccl/lib/libnccl.so.2"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cpp_core_unit_tests(tmp_path_factory):
    explicit = os.environ.get("SMDCCL_CORE_TEST_BUILD")
    build = Path(explicit) if explicit else (shutil.which("ninja") and pip_build_tree())
    if not build:
        build = Path(tmp_path_factory.mktemp("core-build"))
    if not (build / "CMakeCache.txt").exists():
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(build), *gen, "-DSMDCCL_CORE_ONLY=ON",
             "-DCMAKE_BUILD_TYPE=Release"],
            check=True, capture_output=True, text=True,
        )
    if (build / "build.ninja").exists():
        commands = ninja_commands(build, "smdccl_core_tests")
        assert any("test_algorithm_matrix.cpp" in c for c in commands)
        with_torch = [c for c in commands if re.search(r"torch/include|libtorch|libc10|-DTORCH_", c)]
        assert not with_torch, "the torch-free core or its tests name torch:\n" + with_torch[0][:2000]
    built = subprocess.run(
        ["cmake", "--build", str(build), "--target", "smdccl_core_tests", "-j", "2"],
        capture_output=True, text=True,
    )
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    # INFO: the listener test checks that every dropped connection is logged
    # (WARN for the first few of each window, INFO after). Two shards at once:
    # many tests wait on sockets or deadlines, and CI has two cores.
    # Output goes to files, not pipes: a shard must never wait on a full pipe
    # while this process waits on the other shard.
    logs = Path(tmp_path_factory.mktemp("core-test-logs"))
    shards = []
    # The NCCL loader's test loads torch's NCCL where this torch ships one.
    env = {**os.environ, "SMDCCL_DEBUG": "INFO", "SMDCCL_TEST_NCCL_LIBRARY": str(torch_nccl() or "")}
    for k in range(SHARDS):
        with open(logs / f"shard{k}.out", "w") as out, open(logs / f"shard{k}.err", "w") as err:
            shards.append(subprocess.Popen([str(build / "smdccl_core_tests"), "--shard", f"{k}/{SHARDS}"],
                                           stdout=out, stderr=err, env=env))
    deadline = time.monotonic() + 300
    passed = 0
    for k, shard in enumerate(shards):
        timed_out = False
        try:
            shard.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            timed_out = True
            for s in shards:
                s.kill()
                s.wait()
        out = (logs / f"shard{k}.out").read_text(errors="replace")
        err = (logs / f"shard{k}.err").read_text(errors="replace")
        sys.stdout.write(out)
        assert not timed_out, f"shard {k}/{SHARDS} ran past 300 s:\n{out[-5000:]}{err[-5000:]}"
        assert shard.returncode == 0, f"shard {k}/{SHARDS} exited {shard.returncode}:\n{out}{err[-20000:]}"
        summary = re.search(r"^(\d+) passed, 0 failed$", out, re.M)
        assert summary, f"shard {k}/{SHARDS} printed no summary:\n{out}{err[-20000:]}"
        passed += int(summary.group(1))
    registered = len(re.findall(r"^TEST\(", "".join(p.read_text() for p in (ROOT / "tests/cpp").glob("*.cpp")), re.M))
    assert passed == registered, f"{passed} tests ran in {SHARDS} shards; tests/cpp registers {registered}"
