"""Fork server of the test harness: pays for ``import torch`` once; ranks are forked from it.

Why: starting a rank as ``python tests/_rank_main.py`` spends ~2-4 s of CPU in
``import torch`` before the test does anything, and the suite starts about a
thousand ranks on CI's two cores. A process forked from this one has torch
imported already and starts in milliseconds.

Not a test module. ``harness.run_ranks`` starts it once per pytest session
(``python tests/_zygote.py``) and talks to it over its stdin / stdout in
length-prefixed pickled frames:

* harness -> zygote: ``{"id": n, "argv": [...], "env": {...}, "cwd": str, "log": str}``
* zygote -> harness: ``{"id": n, "pid": pid}`` once the child is forked
  (``{"id": n, "error": text}`` if it could not be), and
  ``{"exited": pid, "status": wait_status}`` whenever a child ends.

A child runs exactly what ``python ARGV...`` would run, with the given
environment and working directory, in a session of its own (so the harness
can kill its whole tree), stdout and stderr in ``log``, stdin /dev/null, and
leaves through the interpreter's normal exit (atexit handlers, thread joins).

It exits when its stdin closes (the harness, or pytest, has gone).

This file is also the harness's side of the protocol (:class:`Zygote`); it
imports torch only when run as the zygote.

What a forked rank does not get that a fresh one does: its own hash seed
(``PYTHONHASHSEED``), and a fresh read of environment variables that torch
reads at import; ``Zygote.can_run`` sends every run whose environment differs
in anything but the per-run variables to a fresh process instead.
"""

import gc
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time

#: what every rank imports: torch, and pytest (~0.1 s), which the test modules
#: a rank runs functions of import
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "pytest")

_HEADER = struct.Struct("<I")


def _send(fd: int, message: dict) -> None:
    data = pickle.dumps(message)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _become_child(request: dict, close_fds: list[int]) -> None:
    """In the forked child: the process ``python ARGV...`` would have started."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in close_fds:
        os.close(fd)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python SCRIPT` sets it


def _serve(request_fd: int, reply_fd: int) -> dict:
    """Fork a child per request, report children's exits; return only in a child."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select via the fd
    signal.set_wakeup_fd(wake_w)
    pending = b""
    while True:
        ready, _, _ = select.select([request_fd, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        while True:  # reap whatever has ended, SIGCHLD or not
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(reply_fd, {"exited": pid, "status": status})
        if request_fd not in ready:
            continue
        chunk = os.read(request_fd, 1 << 16)
        if not chunk:
            sys.exit(0)  # the harness has gone; children live in their own sessions
        pending += chunk
        while len(pending) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(pending)
            if len(pending) < _HEADER.size + size:
                break
            request = pickle.loads(pending[_HEADER.size:_HEADER.size + size])
            pending = pending[_HEADER.size + size:]
            try:
                pid = os.fork()
            except OSError as exc:
                _send(reply_fd, {"id": request["id"], "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                _become_child(request, [request_fd, reply_fd, wake_r, wake_w])
                return request
            _send(reply_fd, {"id": request["id"], "pid": pid})


def main() -> None:
    # The protocol owns the original stdin / stdout; anything the imports print
    # goes to stderr (the zygote's log) instead of into a frame.
    request_fd, reply_fd = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for name in PRELOAD:
        __import__(name)
    # Children's collections then leave the imported objects alone instead of
    # touching (and so copying) every inherited page of them.
    gc.freeze()
    _send(reply_fd, {"ready": os.getpid()})
    _serve(request_fd, reply_fd)
    # Only a forked child gets here.
    import runpy

    runpy.run_path(sys.argv[0], run_name="__main__")


#: variables a run may set differently from the zygote's environment: all are
#: read after start-up (at group creation, by the rank's own code); pytest
#: renames the test it runs in PYTEST_CURRENT_TEST
PER_RUN_PREFIXES = ("SMDCCL_", "MASTER_", "NCCL_", "GLOO_", "PYTEST_CURRENT_TEST")
#: ...except these, read while ``import torch`` runs (smdccl's autoload)
READ_AT_IMPORT = ("SMDCCL_AUTOLOAD",)


class ZygoteChild:
    """A process forked by the zygote, with the part of ``subprocess.Popen``
    the harness uses (``pid``, ``poll``, ``wait``, ``kill``, ``returncode``).
    It runs in a session of its own: ``os.killpg(child.pid, ...)`` reaches its tree."""

    def __init__(self, zygote: "Zygote", pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self._zygote._exit_code(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout)
            self._zygote._wait_for_news(0.05)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Zygote:
    """The harness's handle on one zygote process (see the module docstring)."""

    def __init__(self, env: dict, cwd: str, log_path: str, start_timeout: float = 300.0) -> None:
        self.env = dict(env)
        self.log_path = log_path
        self._cond = threading.Condition()
        self._replies: dict = {}
        self._exits: dict = {}
        self._gone = None
        self._next_id = 0
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=self.env,
                                          cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log, start_new_session=True)
        threading.Thread(target=self._read_replies, name="zygote-replies", daemon=True).start()
        self._await(lambda: "ready" in self._replies, start_timeout, "start (import torch)")

    def can_run(self, env: dict) -> bool:
        """A rank with this environment behaves as it would in a fresh process."""
        for key in self.env.keys() | env.keys():
            if self.env.get(key) == env.get(key):
                continue
            if key in READ_AT_IMPORT or not key.startswith(PER_RUN_PREFIXES):
                return False
        return True

    def alive(self) -> bool:
        return self._gone is None and self._proc.poll() is None

    def spawn(self, argv: list, env: dict, cwd: str, log: str, timeout: float = 60.0) -> ZygoteChild:
        with self._cond:
            request_id = self._next_id
            self._next_id += 1
        request = {"id": request_id, "argv": list(argv), "env": dict(env), "cwd": cwd, "log": log}
        data = pickle.dumps(request)
        self._proc.stdin.write(_HEADER.pack(len(data)) + data)
        self._proc.stdin.flush()
        self._await(lambda: request_id in self._replies, timeout, "fork a rank")
        with self._cond:
            reply = self._replies.pop(request_id)
        if "error" in reply:
            raise RuntimeError(f"test zygote: {reply['error']}")
        return ZygoteChild(self, reply["pid"])

    def close(self) -> None:
        try:
            self._proc.stdin.close()  # the zygote exits at EOF
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()

    # -- internals ---------------------------------------------------------

    def _read_replies(self) -> None:
        out = self._proc.stdout
        why = "its stdout closed"
        try:
            while True:
                header = out.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    break
                (size,) = _HEADER.unpack(header)
                message = pickle.loads(out.read(size))
                with self._cond:
                    if "exited" in message:
                        self._exits[message["exited"]] = message["status"]
                    elif "ready" in message:
                        self._replies["ready"] = message
                    else:
                        self._replies[message["id"]] = message
                    self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 - any failure ends the zygote's use
            why = f"{type(exc).__name__}: {exc}"
        with self._cond:
            self._gone = f"the test zygote (pid {self._proc.pid}) has gone ({why}); its log: {self.log_path}"
            self._cond.notify_all()

    def _await(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                if self._gone is not None:
                    raise RuntimeError(f"{self._gone} (while waiting to {what})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"the test zygote did not {what} within {timeout:.0f} s; "
                                       f"its log: {self.log_path}")
                self._cond.wait(left)

    def _wait_for_news(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def _exit_code(self, pid: int):
        with self._cond:
            if pid in self._exits:
                return os.waitstatus_to_exitcode(self._exits.pop(pid))
            if self._gone is not None:
                raise RuntimeError(f"{self._gone}: the exit status of rank process {pid} is lost")
        return None


if __name__ == "__main__":
    main()
