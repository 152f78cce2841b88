"""The harness's fork server (``tests/_zygote.py``): a forked rank is the process
``python tests/_rank_main.py`` would have been — its environment, working
directory, session, log, exit status and exit handlers — and a run whose
environment torch reads differently at import gets a fresh process."""

from __future__ import annotations

import os
import signal
import textwrap

import pytest

import harness
from harness import run_ranks

pytestmark = pytest.mark.skipif(not harness.USE_ZYGOTE, reason="SMDCCL_TEST_NO_ZYGOTE is set")

SCRIPT = textwrap.dedent("""
    import atexit, os, signal, sys
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0])
    print("env", os.environ.get("ZYGOTE_TEST_VALUE"), os.environ.get("ZYGOTE_TEST_DROPPED"))
    print("session", os.getsid(0) == os.getpid(), "stdin", sys.stdin.read() == "")
    print("torch already imported", "torch" in sys.modules)
    atexit.register(lambda: print("atexit ran", flush=True))
    mode = sys.argv[1]
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise":
        raise RuntimeError("raised in the child")
    sys.exit(int(mode))
""")


def _zygote():
    zygote = harness._zygote(harness._base_child_env())
    assert zygote is not None, "the session's zygote refused its own environment"
    return zygote


def _spawn(zygote, tmp_path, mode: str, env: dict) -> tuple[int, str]:
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    log = tmp_path / f"{mode}.log"
    child = zygote.spawn([str(script), mode], env, str(tmp_path), str(log))
    code = child.wait(timeout=60)
    return code, log.read_text()


def test_child_is_the_process_python_would_start(tmp_path):
    zygote = _zygote()
    env = dict(zygote.env, ZYGOTE_TEST_VALUE="42")
    env.pop("ZYGOTE_TEST_DROPPED", None)
    code, log = _spawn(zygote, tmp_path, "3", env)
    assert code == 3, log
    assert f"argv ['3'] cwd {tmp_path} path0 {tmp_path}" in log
    assert "env 42 None" in log
    assert "session True stdin True" in log
    assert "torch already imported True" in log
    assert "atexit ran" in log


@pytest.mark.parametrize("mode, code, text", [
    ("0", 0, "atexit ran"),
    ("kill", -signal.SIGKILL, "torch already imported True"),
    ("raise", 1, "RuntimeError: raised in the child"),
])
def test_exit_status_as_popen_reports_it(tmp_path, mode, code, text):
    zygote = _zygote()
    got, log = _spawn(zygote, tmp_path, mode, dict(zygote.env))
    assert got == code, log
    assert text in log


def test_environment_read_at_import_gets_a_fresh_process():
    zygote = _zygote()
    base = dict(zygote.env)
    assert zygote.can_run(dict(base, SMDCCL_TOPOLOGY="2x2", MASTER_PORT="1", NCCL_DEBUG="INFO"))
    assert not zygote.can_run(dict(base, SMDCCL_AUTOLOAD="0"))  # read by torch's autoload
    assert not zygote.can_run(dict(base, TORCH_DISTRIBUTED_DEBUG="DETAIL"))
    assert not zygote.can_run(dict(base, OMP_NUM_THREADS="7"))
    assert not zygote.can_run({k: v for k, v in base.items() if k != "PATH"})


def parent_pid():
    return os.getppid()


def test_run_ranks_forks_from_the_zygote_unless_the_env_says_otherwise():
    zygote = _zygote()
    forked = run_ranks(2, parent_pid, env={"SMDCCL_TOPOLOGY": "1,1"}, timeout=60)
    assert forked == [zygote._proc.pid] * 2
    fresh = run_ranks(2, parent_pid, env={"TORCH_DISTRIBUTED_DEBUG": "OFF"}, timeout=120)
    assert fresh == [os.getpid()] * 2

