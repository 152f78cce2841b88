"""``python -m smdccl.info``: the facts a bug report needs, from a real run.

Runs the installed module in a subprocess (text and --json) with one SMDCCL_*
variable set, and checks the report against what this process can see for
itself: versions, the engine's reduction kernels, CUDA compiled or not, the
shared-memory and TCP transports, and the variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import smdccl
from smdccl import _C


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SMDCCL_DEBUG="WARN")
    return subprocess.run([sys.executable, "-m", "smdccl.info", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_info_json_reports_versions_build_cpu_and_transports():
    proc = _run("--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["smdccl"]["version"] == smdccl.__version__
    assert info["torch"]["version"] == torch.__version__
    assert info["torch"]["cuda_build"] == torch.version.cuda
    assert info["build"]["cuda"] in (True, False) and info["build"]["compiler"]
    assert info["cpu"]["reduce_kernels"] == _C.reduce_isa()
    assert info["cpu"]["logical_cores"] == os.cpu_count()
    shm = info["transports"]["shared_memory"]
    assert shm["writable"] == os.access("/dev/shm", os.W_OK)
    assert any(i["name"] == "lo" and i["ipv4"] == "127.0.0.1"
               for i in info["transports"]["tcp"]["interfaces"]), info["transports"]
    assert info["environment"].get("SMDCCL_DEBUG") == "WARN"


def test_info_text_names_each_part():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in (f"smdccl {smdccl.__version__}", f"torch {torch.__version__}", "reduce kernels: ",
                   "shared memory", "tcp ", "SMDCCL_DEBUG=WARN", "CUDA kernels: "):
        assert needle in out, f"{needle!r} missing from:\n{out}"
