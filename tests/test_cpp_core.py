"""Builds and runs the torch-free C++ unit tests (topology, CPU reductions,
shared-memory transport, exchange and connect deadlines, fuzzing of the handshake and
send/recv frame parsers and of the TCP listener) with CMake, without torch:
this is also the proof that those layers do not depend on it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cpp_core_unit_tests(tmp_path_factory):
    build = Path(os.environ.get("SMDCCL_CORE_TEST_BUILD", tmp_path_factory.mktemp("core-build")))
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), *gen, "-DSMDCCL_CORE_ONLY=ON",
         "-DCMAKE_BUILD_TYPE=Release"],
        check=True, capture_output=True, text=True,
    )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "smdccl_core_tests", "-j", "2"],
        check=True, capture_output=True, text=True,
    )
    # INFO: the listener test checks that every dropped connection is logged
    # (WARN for the first few of each window, INFO after).
    run = subprocess.run([str(build / "smdccl_core_tests")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "SMDCCL_DEBUG": "INFO"})
    sys.stdout.write(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 failed" in run.stdout
