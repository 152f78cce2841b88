"""Bad SMDCCL_* values fail group creation with a ValueError that names them.

Why: a variable read lazily (the TCP buffer size at the first cross-node
link, the shared-memory ring at the first collective) used to fail there,
killing the group, or not at all: a negative ring size asked /dev/shm for
16 EiB, a huge one crashed the first allreduce with SIGBUS, a tune file of
/dev/zero hung init while eating memory. Every declared variable is checked
when a group is created. One process, world size 1, a HashStore per try:
no rendezvous, so each case costs milliseconds. smdccl only.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.smdccl_only

CASES = [
    # (variable, value, words the message must hold)
    ("SMDCCL_SHM_RING_KB", "-5", ["SMDCCL_SHM_RING_KB='-5' is out of range", "from 4 to 1048576"]),
    ("SMDCCL_SHM_RING_KB", "9223372036854775807", ["is out of range"]),
    ("SMDCCL_SHM_RING_KB", "99999999999999999999", ["is out of range"]),
    ("SMDCCL_SHM_RING_KB", "0", ["is out of range"]),
    ("SMDCCL_TCP_BUFFER_KB", "abc", ["SMDCCL_TCP_BUFFER_KB='abc' is not an integer", "default 4096"]),
    ("SMDCCL_TCP_BUFFER_KB", "-1", ["is out of range", "from 0 to"]),
    ("SMDCCL_SPIN_US", "-7", ["SMDCCL_SPIN_US='-7' is out of range", "from -1 to"]),
    ("SMDCCL_IDLE_SPIN_US", "1.5", ["is not an integer"]),
    ("SMDCCL_FUSION_MB", "-1", ["SMDCCL_FUSION_MB='-1' is out of range"]),
    ("SMDCCL_NAN_CHECK", "2", ["SMDCCL_NAN_CHECK='2' is out of range", "from 0 to 1"]),
    ("SMDCCL_COMPRESSION_INTRA", "-1", ["is out of range"]),
    ("SMDCCL_WARN_AFTER", "-3", ["SMDCCL_WARN_AFTER='-3' is out of range", "a number from 0"]),
    ("SMDCCL_WARN_AFTER", "nan", ["is out of range"]),
    ("SMDCCL_PIPELINE_CHUNK_KB", "0", ["is out of range"]),
    ("SMDCCL_CUDA_IPC_MB", "0", ["is out of range"]),
    ("SMDCCL_CUDA_IPC", "2", ["SMDCCL_CUDA_IPC='2' is out of range", "from 0 to 1"]),
    ("SMDCCL_CUDA_MAX_SMS", "-1", ["SMDCCL_CUDA_MAX_SMS='-1' is out of range"]),
    ("SMDCCL_INTRA", "nvlink", ["SMDCCL_INTRA='nvlink' is not one of: auto, nccl, ipc"]),
    ("SMDCCL_DEBUG", "LOUD", ["SMDCCL_DEBUG='LOUD' is not one of: WARN, INFO, DETAIL, TRACE"]),
    ("SMDCCL_COMPRESSION", "int4", ["is not one of: none, fp16, bf16, int8"]),
    ("SMDCCL_TOPOLOGY", "99999999999999999999,1", ["SMDCCL_TOPOLOGY", "from 1 to 1048576"]),
    ("SMDCCL_TUNE_FILE", "/dev/zero", ["SMDCCL_TUNE_FILE='/dev/zero' is not a readable profile"]),
]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist

    cases = json.loads(sys.argv[1])
    out = []
    for var, value, _ in cases:
        os.environ[var] = value
        try:
            dist.init_process_group("smdccl", store=dist.HashStore(), rank=0, world_size=1)
            out.append([var, value, "no error"])
            dist.destroy_process_group()
        except Exception as exc:  # what type and message the user sees
            out.append([var, value, type(exc).__name__ + ": " + str(exc)])
        finally:
            del os.environ[var]
    # With the values fixed, the same process creates a working group.
    dist.init_process_group("smdccl", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(3)
    dist.all_reduce(t)
    out.append(["after", "", t.tolist()])
    dist.destroy_process_group()
    print(json.dumps(out))
    """
)


def test_bad_environment_values_fail_group_creation_naming_them():
    import json

    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    problems = []
    for (var, value, words), (_, _, got) in zip(CASES, results):
        if not got.startswith("ValueError: ") or not all(w in got for w in words):
            problems.append(f"{var}={value!r}: {got[:300]}")
    assert not problems, "\n".join(problems)
    assert results[-1] == ["after", "", [1.0, 1.0, 1.0]], results[-1]
