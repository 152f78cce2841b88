"""Multi-process test harness: real ranks, real process groups, one report.

Why this exists: a collective backend can only be tested with several OS
processes talking to each other, and a buggy backend typically *hangs* or
*crashes* rather than failing politely.  ``run_ranks`` therefore

* starts ``world_size`` rank processes (``tests/_rank_main.py``, forked from
  the session's fork server ``tests/_zygote.py`` with torch already imported,
  or fresh where a run's environment needs it), each of which joins a process
  group through a TCPStore hosted by the pytest process (so no port races and
  the rendezvous outlives a crashed rank);
* runs one importable check function per rank and ships back its return
  value or its traceback;
* kills every rank when the run exceeds its wall-clock ``timeout`` (or when
  the other ranks keep running long after one rank has failed), so the suite
  never hangs;
* raises ONE pytest failure containing every rank's traceback (prefixed with
  the rank) plus the tail of each failed rank's log;
* asserts every rank exited 0 (or with the exit code a test declared
  expected, e.g. a rank that SIGKILLs itself), and that no new
  ``/dev/shm/smdccl*`` file survived the run.

Inside a rank, ``check_all`` / ``Checker`` run many small sub-cases and collect
*every* mismatch (with a description of the case) instead of stopping at the
first one, so a single spawn gives a complete picture of what is broken.

A fresh process's ``import torch`` costs seconds here (the fork server spares
most ranks that), and a group's set-up costs more: tests should still run
many sub-cases inside one spawned group rather than spawning per case.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
RANK_MAIN = TESTS_DIR / "_rank_main.py"

#: backend under test; the suite is written so that it can be developed
#: against "gloo" while the smdccl engine does not exist yet.
BACKEND = os.environ.get("SMDCCL_TEST_BACKEND", "smdccl").strip().lower() or "smdccl"
IS_SMDCCL = BACKEND == "smdccl"

DEFAULT_TIMEOUT = float(os.environ.get("SMDCCL_TEST_RUN_TIMEOUT", "240"))
#: multiplies the run timeouts tests pass explicitly (scripts/sanitize.sh: ranks
#: under AddressSanitizer run several times slower)
TIMEOUT_SCALE = float(os.environ.get("SMDCCL_TEST_TIMEOUT_SCALE", "1"))
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "smdccl"

# ---------------------------------------------------------------------------
# What the backend supports.
#
# smdccl must support everything the suite exercises: nothing is ever skipped
# for it.  Gloo (the development stand-in) lacks some features; every skip is
# listed here, with the reason, so that it is visible and auditable.  The
# table is keyed by feature names used by the tests.
# ---------------------------------------------------------------------------

GLOO_UNSUPPORTED: dict[str, str] = {
    # found by probing torch 2.14.1's ProcessGroupGloo on CPU:
    "premul_sum": "ReduceOp.PREMUL_SUM is not implemented ('Cannot use ReduceOp.PREMUL_SUM with Gloo')",
    "nan_propagation": "MIN/MAX do not propagate NaN (e.g. min(1.0, nan) gives 1.0)",
    "invalid_op_valueerror": "AVG on integer/bool tensors raises RuntimeError (a cast error), "
                             "not ValueError; the suite still asserts that it raises",
    "all_to_all_list_uneven": "ProcessGroupGloo::alltoall needs equal tensor sizes "
                              "(torch documents uneven lists, e.g. for NCCL)",
    "all_gather_list_uneven": "ProcessGroupGloo::allgather needs equal tensor sizes ('invalid "
                              "tensor size'; NCCL takes uneven lists)",
    "reduce_scatter_future": "reduce_scatter work has no future ('Work::getFuture not implemented.')",
    "large_all_gather_memory": "allgather copies input and output into flat buffers: ~7.6 GiB per rank "
                               "for a 2 GiB output, over the suite's 10 GiB budget",
    "failed_rank_in_error": "the error after a peer dies does not name the dead rank",
    "progress_thread": "no smdccl progress thread to watch stop after a failure",
    "sparse_avg": "all_reduce of a sparse tensor takes ReduceOp.SUM only ('allreduce of sparse "
                  "tensors only works with ReduceOp.SUM')",
    "anysource_post_order": "a rank-specific receive posted after an any-source receive of the "
                            "same tag takes the first message (MPI and smdccl match in post order)",
    "gather_single": "torch 2.14's dist.gather_single / gather_into_tensor raise 'Backend gloo does "
                     "not support gather_single'",
    "sparse_float16": "all_reduce of a float16 sparse tensor raises ('\"cadd_sparse\" not "
                      "implemented for 'Half'')",
}


def backend_supports(feature: str, backend: str | None = None) -> bool:
    """True unless ``backend`` is gloo and gloo is known to lack ``feature``.

    Only gloo ever gets a ``False``: the suite exists to test smdccl fully.
    """
    backend = (backend or BACKEND).lower()
    if backend != "gloo":
        return True
    return feature not in GLOO_UNSUPPORTED


def unsupported_reason(feature: str) -> str:
    return f"gloo: {GLOO_UNSUPPORTED.get(feature, 'unsupported')}"


# Sub-case skip counts reported by the ranks; printed in the terminal summary.
SKIP_LOG: dict[str, int] = {}


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------


class RankFailure(AssertionError):
    """One or more ranks failed; message holds all ranks' reports."""


def _fn_ref(fn: str | Callable) -> str:
    if isinstance(fn, str):
        return fn
    mod = fn.__module__
    qual = fn.__qualname__
    if mod == "__main__" or "<locals>" in qual:
        raise ValueError(f"rank function {qual} must be a top-level function of an importable module")
    return f"{mod}:{qual}"


def _shm_listing() -> set[str]:
    try:
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm on this system
        return set()


def _shm_in_use(names: set[str]) -> set[str]:
    """The subset of /dev/shm ``names`` still mapped or open by a live process.

    All ranks of a run are dead when this is called, so such files belong to
    somebody else (e.g. a benchmark running concurrently on the machine) and
    are not leaks of the run; files no live process holds are."""
    held: set[str] = set()
    if not names:
        return held
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            maps = (proc / "maps").read_text(errors="replace")
            held.update(n for n in names if f"/dev/shm/{n}" in maps)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):].split(" ")[0])
        except OSError:
            continue
    return held & names


def _tail(path: Path, lines: int = 60) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "<no log>"
    return "\n".join(data[-lines:])


def _prefix(rank: int, text: str) -> str:
    return "\n".join(f"[rank {rank}] {line}" for line in text.rstrip().splitlines())


def _signal_name(code: int) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _torch_source_says(fn, text: str) -> bool:
    import inspect

    return text in inspect.getsource(fn)


def _cpu_split_unsupported() -> str | None:
    """Why this torch cannot split a CPU-only group, or None where it can.

    torch before 2.15 splits only a default group bound to a device and takes
    only an accelerator as that device: a CPU-only job cannot call
    dist.split_group at all there (whatever the backend; gloo too). Read off
    torch's own source: there is no flag to ask."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not _torch_source_says(dist.split_group, "No device associated with the default pg"):
        return None
    if _torch_source_says(c10d._new_process_group_helper, "must be an accelerator with an index"):
        return ("this torch splits only groups bound to an accelerator (device_id=cpu is "
                "refused; torch >= 2.15 splits CPU groups)")
    return None


#: None where dist.split_group works on CPU groups, else torch's limitation.
CPU_SPLIT_UNSUPPORTED = _cpu_split_unsupported()


#: SMDCCL_TEST_NO_ZYGOTE=1: start every rank as a fresh ``python`` process
USE_ZYGOTE = os.environ.get("SMDCCL_TEST_NO_ZYGOTE", "0") in ("", "0")
_ZYGOTE = None


def _base_child_env() -> dict[str, str]:
    """The environment every rank starts from, before a run's own ``env``."""
    child_env = dict(os.environ)
    # 2 cores shared by up to 4 ranks: intra-op threads would only oversubscribe.
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env["PYTHONDONTWRITEBYTECODE"] = "1"
    child_env["SMDCCL_TEST_BACKEND"] = BACKEND
    if BACKEND != "smdccl":
        # an installed (possibly half-built) smdccl must not affect other backends' runs
        child_env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    return child_env


def _zygote(child_env: dict[str, str]):
    """The session's fork server (tests/_zygote.py) if it can start ranks with
    ``child_env`` as a fresh process would, else None (start them fresh).

    Forking from a process that has imported torch saves each rank the
    seconds ``import torch`` costs; a run whose environment differs in what
    torch reads at import gets fresh processes."""
    global _ZYGOTE
    if not USE_ZYGOTE:
        return None
    if _ZYGOTE is None or not _ZYGOTE.alive():
        import atexit

        from _zygote import Zygote

        log = Path(tempfile.gettempdir()) / f"smdccl-test-zygote-{os.getpid()}.log"
        _ZYGOTE = Zygote(_base_child_env(), str(REPO_ROOT), str(log))
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE if _ZYGOTE.can_run(child_env) else None


def run_ranks(
    world_size: int,
    fn: str | Callable,
    *args: Any,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    pg_timeout: float = 60.0,
    backend: str | None = None,
    import_backend: bool = True,
    init: bool = True,
    expect_exit: dict[int, int] | None = None,
    fail_grace: float = 20.0,
    check_shm: bool = True,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` freshly spawned ranks; return their results.

    ``fn`` is a top-level function (or ``"module:qualname"``) importable from
    ``tests/``.  Each rank calls ``dist.init_process_group(backend, store=...,
    rank=r, world_size=world_size, timeout=pg_timeout)`` first (unless
    ``init=False``; then it gets the store address in ``SMDCCL_TEST_STORE`` and
    sets up the group itself).  ``env`` adds environment variables to every
    rank (e.g. ``SMDCCL_TOPOLOGY``).  ``expect_exit`` maps ranks to the exit
    code they are expected to die with (e.g. ``{2: -signal.SIGKILL}``); those
    ranks return ``None`` in the result list.

    Raises :class:`RankFailure` (an AssertionError) describing every rank when
    anything goes wrong: an exception on any rank, an unexpected exit code, a
    timeout (all ranks are killed), or a leaked ``/dev/shm/smdccl*`` file.
    """
    __tracebackhide__ = True  # pytest: show the ranks' report, not this function
    import torch.distributed as dist  # parent hosts the rendezvous store

    backend = (backend or BACKEND).lower()
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout * TIMEOUT_SCALE
    expect_exit = dict(expect_exit or {})
    ref = _fn_ref(fn)
    shm_before = _shm_listing() if check_shm else set()

    workdir = Path(tempfile.mkdtemp(prefix="smdccl-test-"))
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=__import__("datetime").timedelta(seconds=max(timeout, pg_timeout) + 30))
    spec = {
        "fn": ref,
        "args": args,
        "world_size": world_size,
        "backend": backend,
        "store_host": "127.0.0.1",
        "store_port": store.port,
        "pg_timeout": pg_timeout,
        "import_backend": import_backend,
        "init": init,
        "workdir": str(workdir),
        "sys_path": [str(TESTS_DIR), str(REPO_ROOT)],
    }
    spec_path = workdir / "spec.pkl"
    spec_path.write_bytes(pickle.dumps(spec))

    child_env = _base_child_env()
    child_env["SMDCCL_TEST_BACKEND"] = backend
    child_env["SMDCCL_TEST_STORE"] = f"127.0.0.1:{store.port}"
    if backend != "smdccl":
        child_env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    child_env.update(env or {})

    zygote = _zygote(child_env) if import_backend and backend == BACKEND else None
    procs: list = []
    logs: list[Path] = []
    start = time.monotonic()
    timed_out = False
    grace_kill = False
    try:
        for r in range(world_size):
            log = workdir / f"rank{r}.log"
            logs.append(log)
            argv = [str(RANK_MAIN), str(spec_path), str(r)]
            if zygote is not None:
                procs.append(zygote.spawn(argv, child_env, str(REPO_ROOT), str(log)))
                continue
            with open(log, "wb") as fh:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *argv],
                        env=child_env,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        cwd=str(REPO_ROOT),
                        start_new_session=True,  # so we can kill a rank's whole tree
                    )
                )
        deadline = start + timeout
        grace_deadline = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            unexpected = [r for r, c in enumerate(codes)
                          if c is not None and c != expect_exit.get(r, 0)]
            if unexpected and grace_deadline is None:
                grace_deadline = now + fail_grace
            if now > deadline:
                timed_out = True
                break
            if grace_deadline is not None and now > grace_deadline:
                grace_kill = True
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        del store
    elapsed = time.monotonic() - start

    results: list[Any] = []
    problems: list[str] = []
    for r, p in enumerate(procs):
        code = p.returncode
        res_path = workdir / f"result{r}.pkl"
        res = None
        if res_path.exists():
            try:
                res = pickle.loads(res_path.read_bytes())
            except Exception as exc:  # noqa: BLE001
                res = {"ok": False, "error": f"unreadable result file: {exc!r}"}
        expected = expect_exit.get(r, 0)
        report: list[str] = []
        if res is not None and not res["ok"]:
            report.append(res["error"])
        if code != expected:
            if timed_out and code == -signal.SIGKILL:
                report.append(f"killed by the harness: run exceeded its {timeout:.0f} s timeout")
            elif grace_kill and code == -signal.SIGKILL:
                report.append(f"killed by the harness {fail_grace:.0f} s after another rank failed")
            else:
                report.append(f"{_signal_name(code)} (expected {_signal_name(expected)})")
        elif res is None and expected == 0:
            report.append("exited 0 but wrote no result (did the rank function run?)")
        if report:
            text = "\n".join(report)
            if len(text) > 20000:
                text = text[:20000] + "\n...[truncated]"
            crashed = res is None or code not in (expected, 1)
            if crashed or res is None or res.get("ok"):
                text += "\n---- log tail ----\n" + _tail(logs[r])
            problems.append(_prefix(r, text))
        results.append(res.get("value") if res is not None and res.get("ok") else None)
        if res is not None and res.get("ok") and isinstance(res.get("value"), dict):
            for reason, n in (res["value"].get("skipped") or {}).items():
                if r == 0:
                    SKIP_LOG[reason] = SKIP_LOG.get(reason, 0) + n

    if check_shm:
        new_files = _shm_listing() - shm_before
        leaked = sorted(new_files - _shm_in_use(new_files))
        if leaked:
            problems.append(f"leaked /dev/shm files after the run: {leaked}")
            for name in leaked:  # do not let one leak cascade into every later test
                try:
                    (SHM_DIR / name).unlink()
                except OSError:
                    pass

    if problems:
        head = (f"{ref} on {world_size} rank(s), backend={backend}, env={env or {}}: "
                f"{'TIMED OUT ' if timed_out else ''}failed after {elapsed:.1f} s")
        shutil.rmtree(workdir, ignore_errors=True)
        raise RankFailure(head + "\n" + "\n\n".join(problems))
    shutil.rmtree(workdir, ignore_errors=True)
    return results


# ---------------------------------------------------------------------------
# Rank side
# ---------------------------------------------------------------------------


def under_address_sanitizer() -> bool:
    """The smdccl engine imported here was built with AddressSanitizer
    (scripts/sanitize.sh)."""
    from smdccl import _C

    return "address" in _C.build_info()["sanitizers"]


def harness_store():
    """Inside a rank: a client of the parent's TCPStore, independent of any process
    group (usable after the group has failed)."""
    from datetime import timedelta

    import torch.distributed as dist

    host, port = os.environ["SMDCCL_TEST_STORE"].rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))


def store_barrier(key: str, count: int, timeout: float = 60.0) -> None:
    """Inside a rank: wait until ``count`` ranks have called this with ``key``."""
    store = harness_store()
    store.add(f"barrier/{key}", 1)
    deadline = time.monotonic() + timeout
    while int(store.add(f"barrier/{key}", 0)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"store barrier {key!r}: fewer than {count} ranks arrived in {timeout} s")
        time.sleep(0.02)


def timed_raise(fn) -> tuple[float, str | None]:
    """Inside a rank: (seconds, 'Type: message') of what ``fn()`` raised; the
    message is None if it returned."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - any error type, but it must come
        return time.monotonic() - t0, f"{type(exc).__name__}: {exc}"
    return time.monotonic() - t0, None


class Skip(Exception):
    """Raised inside a sub-case to skip it (gloo-only limitations)."""


def _where(exc: BaseException) -> str:
    """'file.py:line' of the innermost test-suite frame of ``exc`` (compact reports)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(TESTS_DIR) in f.filename]
    if not frames:
        return "no test frame"
    f = frames[-1]
    return f"at {Path(f.filename).name}:{f.lineno}: {f.line}"


class Checker:
    """Collects every failing sub-case of a rank instead of stopping at the first.

    Use ``with chk.case("all_reduce float32 SUM n=7"):`` around each sub-case,
    or ``chk.run(desc, fn)``.  Failures are also printed to stderr as they
    happen, so a later hang still shows them in the rank's log tail.
    Cross-rank bitwise equality is checked with ``chk.digest(desc, tensor)``
    (local) + ``chk.compare_digests(group)`` (one ``all_gather_object``).
    """

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.failures: list[str] = []
        self.count = 0
        self.skipped: dict[str, int] = {}
        self._digests: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    @contextmanager
    def case(self, desc: str):
        self.count += 1
        try:
            yield
        except Skip as s:
            reason = str(s)
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
        except AssertionError as exc:
            self._fail(desc, str(exc) or f"assertion failed ({_where(exc)})")
        except Exception as exc:  # noqa: BLE001 - any error in a sub-case is a failure
            self._fail(desc, f"{type(exc).__name__}: {exc} ({_where(exc)})")

    def run(self, desc: str, fn: Callable[[], Any]) -> None:
        with self.case(desc):
            fn()

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def _fail(self, desc: str, msg: str) -> None:
        msg = msg.strip()
        if len(msg) > 2500:
            msg = msg[:2500] + " ...[truncated]"
        text = f"{desc}: {msg}"
        self.failures.append(text)
        print(f"SUBCASE FAILED: {text}", file=sys.stderr, flush=True)

    def digest(self, desc: str, tensor) -> None:
        """Remember a hash of ``tensor``'s bytes; all ranks must agree (bitwise).

        Call it right after the collective, before asserting on the values, so
        that every rank records the same cases."""
        import torch

        t = tensor.detach().contiguous()
        data = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        key = desc
        while key in self._digests:
            key += "'"
        self._digests[key] = hashlib.sha1(data).hexdigest()

    def compare_digests(self, group=None) -> None:
        """One all_gather_object over ``group`` (use a gloo group: an independent
        transport) to check that every rank produced bitwise-identical results."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, self._digests, group=group)
        self.count += 1
        mine = gathered[0]
        for r, theirs in enumerate(gathered[1:], start=1):
            for desc in sorted(mine.keys() ^ theirs.keys()):
                self._fail("cross-rank bitwise identity", f"{desc}: recorded by only one of ranks 0 and {r}")
            for desc in sorted(mine.keys() & theirs.keys()):
                if mine[desc] != theirs[desc]:
                    self._fail(desc, f"result differs bitwise between rank 0 and rank {r}")
        self._digests.clear()

    @contextmanager
    def section(self, name: str):
        """Time a group of sub-cases (reported in the summary and the rank log)."""
        t0 = time.perf_counter()
        n0 = self.count
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.timings[name] = round(self.timings.get(name, 0.0) + dt, 3)
            print(f"section {name}: {self.count - n0} sub-cases in {dt:.2f} s", file=sys.stderr, flush=True)

    def summary(self) -> dict:
        return {"cases": self.count, "failures": len(self.failures), "skipped": dict(self.skipped),
                "timings": dict(self.timings)}

    def finish(self) -> dict:
        """Raise one AssertionError listing every failure; else return the summary."""
        if self.failures:
            shown = self.failures[:200]
            more = len(self.failures) - len(shown)
            lines = [f"{len(self.failures)} of {self.count} sub-cases failed {self.label}:"]
            lines += [f"  - {f}" for f in shown]
            if more:
                lines.append(f"  ... and {more} more")
            raise AssertionError("\n".join(lines))
        return self.summary()


def check_all(cases: Iterable[tuple[str, Callable[[], Any]]], label: str = "") -> dict:
    """Run every ``(description, fn)`` sub-case; raise one AssertionError listing
    all that failed.  ``fn`` raises AssertionError (or anything) on mismatch,
    or :class:`Skip` for a gloo-only limitation.  Returns the summary."""
    chk = Checker(label)
    for desc, fn in cases:
        chk.run(desc, fn)
    return chk.finish()
