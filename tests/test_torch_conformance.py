"""A representative subset of the conformance run (scripts/torch_conformance.py) in CI.

Why: torch's own distributed tests (distributed_test's _DistTestBase, as
test_distributed_spawn.py spawns them) are the contract a plugin backend is
held to; the whole run takes over an hour here (docs/conformance.md), so CI
runs a spread of them -- collectives, point-to-point, subgroups, DDP, object
collectives, the functional collectives and DTensor -- through the same
driver, at 2 ranks, in about two minutes.

Asserts, in one driver run: every selected test ran and none failed or
errored, and the subset really ran tests (torch skips many tests silently
where a feature is missing: a subset skipped whole would prove nothing).
And the driver itself can fail: a failure injected into rank 1 of one test
(SMDCCL_CONFORMANCE_INJECT_FAILURE), after that test's own body ran, comes
out as that test's failure, the others still run, and the exit status is 1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from harness import IS_SMDCCL, REPO_ROOT

pytestmark = pytest.mark.smdccl_only

SCRIPT = REPO_ROOT / "scripts" / "torch_conformance.py"


def _ci_subset() -> list[str]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import torch_conformance

        return list(torch_conformance.CI_SUBSET)
    finally:
        sys.path.pop(0)


def _run_driver(tmp_path, *args, env=None):
    summary = tmp_path / "summary.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--summary", str(summary), "--log-dir", str(tmp_path / "logs"),
         "--per-test-limit", "240"],
        capture_output=True, text=True, timeout=900, env=env)
    report = summary.read_text() if summary.exists() else "(no summary written)"
    data = json.loads(summary.with_suffix(".json").read_text()) if summary.exists() else None
    return proc, report, data


INJECTED = "test_all_reduce_sum"


def test_ci_subset_of_torch_distributed_tests_passes(tmp_path):
    """One driver run of the subset, with a failure injected into rank 1 of
    one test after that test's own body ran (the driver's check, see the
    module docstring): every other test passes, the injected one fails with
    the injected message only (a real failure would show instead), and the
    driver exits 1."""
    assert IS_SMDCCL
    # torch's test harness (torch.testing._internal.common_utils) imports it
    assert importlib.util.find_spec("expecttest"), "torch's distributed tests need expecttest: pip install expecttest"
    subset = _ci_subset()
    assert INJECTED in subset
    env = dict(os.environ, SMDCCL_CONFORMANCE_INJECT_FAILURE=INJECTED)
    proc, report, data = _run_driver(tmp_path, "--subset", "ci", "--world-sizes", "2", env=env)
    assert proc.returncode == 1, f"driver exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{report}"
    recs = data["results"]["2"]
    assert sorted(r["test"] for r in recs) == sorted(subset), "the driver ran other tests than the subset"
    outcome = {r["test"]: r for r in recs}
    injected = outcome.pop(INJECTED)
    assert injected["outcome"] in ("failed", "error"), report
    assert f"failure injected into {INJECTED} on rank 1, after it passed" in injected["detail"], report
    bad = [r for r in outcome.values() if r["outcome"] in ("failed", "error")]
    assert not bad, report
    skipped = [f"{r['test']}: {r['detail'][:200]}" for r in outcome.values() if r["outcome"] == "skipped"]
    # every test of the subset was picked because it runs on CPU at 2 ranks
    assert not skipped, "subset tests skipped:\n" + "\n".join(skipped)
    passed = [r for r in outcome.values() if r["outcome"] == "passed"]
    assert len(passed) == len(subset) - 1 >= 20, report
