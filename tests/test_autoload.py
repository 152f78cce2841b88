"""``init_process_group("smdccl")`` works without ``import smdccl``.

Why: users (and torchrun scripts) name the backend without importing the
package; registration must come from the package's entry points:

* ``torch.backends`` -> ``smdccl._registration:autoload``, run by ``import torch``
  (TORCH_DEVICE_BACKEND_AUTOLOAD=1, torch's default);
* ``torch.distributed.backends`` -> ``smdccl._registration:register``, loaded
  lazily by ``init_process_group`` (torch >= 2.14) -- checked with
  TORCH_DEVICE_BACKEND_AUTOLOAD=0, where smdccl must not even be imported
  before ``init_process_group``.

Each variant runs 2 fresh ranks that never ``import smdccl`` and checks an
all_reduce.  smdccl only.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import pytest
import torch

from harness import run_ranks

pytestmark = pytest.mark.smdccl_only


def _check_all_reduce() -> None:
    import torch.distributed as dist

    assert dist.get_backend() == "smdccl", f"default group backend is {dist.get_backend()!r}"
    ws, rank = dist.get_world_size(), dist.get_rank()
    t = torch.arange(1001, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    expected = torch.arange(1001, dtype=torch.float32) * (ws * (ws + 1) // 2)
    assert torch.equal(t, expected), f"all_reduce wrong: first values {t[:5].tolist()}"


def autoload_at_import_torch() -> None:
    """Rank fn: the harness already ran init_process_group("smdccl") without importing smdccl."""
    _check_all_reduce()


def lazy_entry_point() -> None:
    """Rank fn: no autoload; smdccl must be loaded by init_process_group itself."""
    import torch.distributed as dist

    assert "smdccl" not in sys.modules, "smdccl was imported before init_process_group"
    host, port = os.environ["SMDCCL_TEST_STORE"].split(":")
    store = dist.TCPStore(host, int(port), int(os.environ["WORLD_SIZE"]), is_master=False,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("smdccl", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=60))
    _check_all_reduce()


def test_autoload_via_import_torch():
    run_ranks(2, autoload_at_import_torch, backend="smdccl", import_backend=False,
              env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}, timeout=120)


@pytest.mark.skipif(torch.__version__ < "2.14",  # TorchVersion compares as versions
                    reason="the torch.distributed.backends entry-point group is read by torch >= 2.14")
def test_lazy_backend_entry_point():
    run_ranks(2, lazy_entry_point, backend="smdccl", import_backend=False, init=False,
              env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=120)
