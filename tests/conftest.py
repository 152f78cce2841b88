"""pytest glue: backend banner, smdccl-only skips, a per-test alarm, the summary.

* ``SMDCCL_TEST_BACKEND`` (default "smdccl") picks the backend under test;
  the header shows it so a gloo run is never mistaken for a smdccl run.
* Tests marked ``smdccl_only`` are skipped for any other backend.
* Every test gets a SIGALRM backstop (``SMDCCL_TEST_TIMEOUT`` seconds, default
  600) on top of the harness's own per-run timeout, without depending on
  pytest-timeout: if the parent itself wedges, the test fails instead of the
  suite hanging. ``SMDCCL_TEST_DEADLINE`` (Unix time) caps it for a run that
  must end by then: the test in progress fails at it (the harness kills its
  ranks, the JUnit file is written), later ones fail without starting.
* The terminal summary lists the gloo-only sub-case skips reported by the ranks
  and the suite's wall time.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (does not import torch)

if not harness.IS_SMDCCL:
    # developing against another backend: keep an installed, possibly half-built
    # smdccl from being auto-loaded by ``import torch`` (torch.backends entry point)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

_SUITE_START = time.monotonic()
TEST_TIMEOUT = int(os.environ.get("SMDCCL_TEST_TIMEOUT", "600"))
# Unix time by which the whole run must end (scripts/gpu_steps.sh sets it from
# a step's time limit): a test is cut at it, a later one fails unstarted.
TEST_DEADLINE = float(os.environ["SMDCCL_TEST_DEADLINE"]) if os.environ.get("SMDCCL_TEST_DEADLINE") else None


def pytest_report_header(config):
    return [f"smdccl tests: backend under test = {harness.BACKEND!r} (SMDCCL_TEST_BACKEND)"]


def pytest_collection_modifyitems(config, items):
    if harness.IS_SMDCCL:
        return
    skip = pytest.mark.skip(reason=f"smdccl-only test (backend under test is {harness.BACKEND!r})")
    for item in items:
        if "smdccl_only" in item.keywords:
            item.add_marker(skip)


class _TestTimeout(Exception):
    pass


@pytest.fixture(autouse=True)
def _per_test_alarm(request):
    """Fail (rather than hang) a test whose parent side runs past TEST_TIMEOUT."""
    if not hasattr(signal, "SIGALRM"):  # pragma: no cover
        yield
        return

    limit, why = TEST_TIMEOUT, f"SMDCCL_TEST_TIMEOUT={TEST_TIMEOUT} s"
    if TEST_DEADLINE is not None:
        left = int(TEST_DEADLINE - time.time())
        if left < 1:
            pytest.fail(f"{request.node.nodeid} not started: the run's deadline (SMDCCL_TEST_DEADLINE) "
                        "has passed", pytrace=False)
        if left < limit:
            limit, why = left, "the run's deadline (SMDCCL_TEST_DEADLINE)"

    def on_alarm(signum, frame):
        raise _TestTimeout(f"{request.node.nodeid} ran past {why}")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    if harness.SKIP_LOG:
        tr.section(f"sub-cases skipped for backend {harness.BACKEND} (rank 0 counts)")
        for reason, n in sorted(harness.SKIP_LOG.items()):
            tr.write_line(f"{n:6d}  {reason}")
    tr.write_line(f"smdccl suite wall time: {time.monotonic() - _SUITE_START:.1f} s (backend {harness.BACKEND})")
