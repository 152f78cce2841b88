"""NCCL as the engine for CUDA collectives inside a node, without a GPU:
the loader finds torch's NCCL (a CUDA build of torch installs it) and makes
unique ids; where NCCL cannot be loaded, smdccl.info says why and that the
CUDA IPC path serves instead; SMDCCL_INTRA takes only its three values.
The engine choice itself and the id's trip through the store are C++ tests
(tests/cpp/test_intra_engine.cpp); NCCL's collectives run in
tests/test_cuda.py on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from smdccl import _C


def _info(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "smdccl.info", "--json"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch ships no NCCL")
def test_loader_finds_torchs_nccl_and_makes_unique_ids():
    lib = _C.nccl_library()
    assert lib["loaded"], lib["why"]
    assert lib["version"] == ".".join(map(str, torch.cuda.nccl.version())), lib
    assert lib["path"].endswith("libnccl.so.2"), lib
    a, b = lib["unique_id"], _C.nccl_library()["unique_id"]
    assert len(a) == 128 and any(a) and a != b  # fresh each time, not zeros


def test_missing_nccl_is_reported_with_the_fallback():
    info = _info({"SMDCCL_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"})
    assert info["nccl"]["loaded"] is False
    assert "cannot load /nonexistent/libnccl.so.2" in info["nccl"]["why"], info["nccl"]
    text = subprocess.run([sys.executable, "-m", "smdccl.info"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SMDCCL_NCCL_LIBRARY": "/nonexistent/x.so"})
    assert "not loaded: cannot load /nonexistent/x.so" in text.stdout, text.stdout
    assert "smdccl's CUDA IPC path serves instead" in text.stdout


def test_intra_setting_is_part_of_the_cuda_settings_ranks_agree_on():
    info = _info({"SMDCCL_INTRA": "NCCL"})
    assert "SMDCCL_INTRA=nccl" in info["cuda_settings"], info["cuda_settings"]
