#!/usr/bin/env python3
"""Runs PyTorch's own distributed tests against smdccl and writes a summary.

What runs (scripts/torch_conformance_cases.py defines the classes):

* torch's ``DistributedTest._DistTestBase`` tests (torch.testing._internal.
  distributed.distributed_test), spawned as torch's
  test/distributed/test_distributed_spawn.py spawns them, with smdccl
  registered as a plugin backend with DDP and subgroup support;
* torch.distributed._functional_collectives over smdccl (results, async/wait);
* DTensor on a CPU DeviceMesh over the smdccl default group.

at each world size asked for (default 2 and 3: torch's CI runs 2 and 3 as
well). One worker process per world size (distributed_test reads BACKEND and
WORLD_SIZE at import); every test spawns its ranks as torch's harness does
(~3-4 s each here). The worker streams one JSON record per test; when a
worker dies or hangs past a test's limit, that test is recorded as an error
and a new worker carries on with the rest, so one bad test cannot cost the
run.

Tests listed in scripts/torch_conformance_skips.txt (``name: reason``, optionally
``name@ws=3: reason``) are not run and are reported with their reason; the
list must name only tests that exist, each with a reason.

  python scripts/torch_conformance.py                       # everything, 2 and 3 ranks
  python scripts/torch_conformance.py --world-sizes 2 -k all_gather
  python scripts/torch_conformance.py --subset ci           # the CI subset (tests/test_torch_conformance.py)

Exit status: 0 when every test passed or was skipped and at least one ran;
1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
DEFAULT_SKIPS = SCRIPTS / "torch_conformance_skips.txt"

#: the CI subset: a spread over the collectives, point-to-point, subgroups,
#: DDP, the object collectives, the functional collectives and DTensor, each
#: one that runs (not skipped by torch) on CPU at 2 ranks; about 40 s here
CI_SUBSET = [
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_product",
    "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_gather",
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_with_empty",
    "test_all_gather_object_default_pg",
    "test_broadcast",
    "test_reduce_sum",
    "test_scatter",
    "test_scatter_checks",
    "test_gather",
    "test_gather_checks",
    "test_barrier",
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_send_recv_any_source",
    "test_isend",
    "test_irecv",
    "test_get_rank_size_group",
    "test_destroy_group",
    "test_DistributedDataParallelCPU",
    "test_DistributedDataParallel_requires_grad",
    "test_static_graph_api_cpu",
    "test_functional_collectives",
    "test_functional_async_wait",
    "test_dtensor_redistribute",
    "test_dtensor_matmul",
]


# ---------------------------------------------------------------- skip list


def load_skips(path: Path) -> dict[tuple[str, int | None], str]:
    """``name[@ws=N]: reason`` per line; '#' starts a comment line."""
    skips: dict[tuple[str, int | None], str] = {}
    if not path.exists():
        return skips
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition(":")
        name, reason = name.strip(), reason.strip()
        if not sep or not name.startswith("test_") or len(reason) < 20:
            raise SystemExit(f"{path}:{lineno}: expected 'test_name[@ws=N]: reason' with a real reason, got {raw!r}")
        ws = None
        if "@ws=" in name:
            name, _, w = name.partition("@ws=")
            ws = int(w)
        if (name, ws) in skips:
            raise SystemExit(f"{path}:{lineno}: {name} listed twice")
        skips[(name, ws)] = reason
    return skips


def skip_reason(skips, name: str, ws: int) -> str | None:
    return skips.get((name, ws)) or skips.get((name, None))


# ---------------------------------------------------------------- worker (one world size)


class _StreamingResult(unittest.TestResult):
    """Writes one JSON line per test event, flushed, so a dying worker loses nothing."""

    def __init__(self, out, ws: int, total: int):
        super().__init__()
        self.out, self.ws, self.total, self.done = out, ws, total, 0
        self._t0 = 0.0
        self._outcome: tuple[str, str] | None = None

    def _write(self, rec: dict) -> None:
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()

    def startTest(self, test):
        super().startTest(test)
        self._t0 = time.monotonic()
        self._outcome = None
        self._write({"event": "start", "test": test._testMethodName, "time": time.time()})

    def _set(self, outcome: str, detail: str = "") -> None:
        # a failing subtest or tearDown after a pass: the worst outcome wins
        rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
        if self._outcome is None or rank[outcome] > rank[self._outcome[0]]:
            self._outcome = (outcome, detail)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._set("passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set("skipped", str(reason))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set("failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._set("error", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._set("passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._set("failed", "unexpected success of a test marked expectedFailure")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._set("failed", f"{subtest}: " + self._exc_info_to_string(err, test))

    def stopTest(self, test):
        super().stopTest(test)
        self.done += 1
        outcome, detail = self._outcome or ("error", "no outcome recorded")
        secs = round(time.monotonic() - self._t0, 2)
        self._write({"event": "end", "test": test._testMethodName, "class": type(test).__name__,
                     "outcome": outcome, "detail": detail, "seconds": secs})
        short = detail.strip().splitlines()[-1][:160] if detail.strip() and outcome != "passed" else ""
        print(f"[ws={self.ws} {self.done}/{self.total}] {test._testMethodName}: {outcome} ({secs} s) {short}",
              file=sys.__stdout__, flush=True)


def list_tests() -> list[tuple[str, str]]:
    """(class name, test name) of every test, in run order."""
    import torch_conformance_cases as cases

    loader = unittest.TestLoader()
    out = []
    for cls in cases.CLASSES:
        out += [(cls.__name__, n) for n in loader.getTestCaseNames(cls)]
    return out


def _die_with_parent() -> None:
    """The worker leads a process group of its own (its ranks, the forkserver):
    when the driver goes, however it goes, the group goes with it."""
    import threading

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def run_worker(args) -> int:
    if not args.list:
        _die_with_parent()
    sys.path.insert(0, str(SCRIPTS))
    import torch_conformance_cases as cases

    classes = {c.__name__: c for c in cases.CLASSES}
    if args.list:
        for cls_name, name in list_tests():
            print(f"{cls_name}.{name}")
        return 0
    if cases.START_METHOD == "forkserver":
        import multiprocessing

        multiprocessing.set_forkserver_preload(["torch_conformance_cases"])
    names = [n for n in Path(args.tests_file).read_text().split() if n]
    by_name = {n: c for c, n in list_tests()}
    suite = unittest.TestSuite()
    for n in names:
        suite.addTest(classes[by_name[n]](n))
    with open(args.out, "a") as out:
        result = _StreamingResult(out, args.world_size, args.total or len(names))
        result.done = args.done
        suite.run(result)
    return 0


# ---------------------------------------------------------------- driver


def _worker_env(ws: int, temp_dir: str, start: str = "spawn") -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SMDCCL_CONFORMANCE_START": start,
        "BACKEND": "smdccl",
        "WORLD_SIZE": str(ws),
        "TEMP_DIR": temp_dir,
        # env:// as test_distributed_spawn.py's default (TestDistBackend
        # itself joins its ranks through a file)
        "INIT_METHOD": env.get("INIT_METHOD", "env://"),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
        "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",  # its hint names a file that is not the driver
        "PYTHONPATH": os.pathsep.join([str(SCRIPTS)] + [p for p in [env.get("PYTHONPATH")] if p]),
    })
    return env


def _enumerate(python: str, ws: int) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="smdccl-conf-list-") as tmp:
        os.mkdir(os.path.join(tmp, "barrier"))
        p = subprocess.run([python, __file__, "--worker", "--list", "--world-size", str(ws)],
                           env=_worker_env(ws, tmp), capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise SystemExit(f"listing the tests failed:\n{p.stdout}\n{p.stderr}")
    return [tuple(line.split(".", 1)) for line in p.stdout.split() if "." in line]


def _read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a kill
    return recs


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_world_size(python: str, ws: int, tests: list[str], skips, log_dir: Path, per_test_limit: float,
                   start: str) -> list[dict]:
    """Runs ``tests`` at ``ws`` ranks; one record per test, in order."""
    records: dict[str, dict] = {}
    to_run = []
    for name in tests:
        reason = skip_reason(skips, name, ws)
        if reason:
            records[name] = {"test": name, "outcome": "skipped", "source": "smdccl", "detail": reason, "seconds": 0}
        else:
            to_run.append(name)
    jsonl = log_dir / f"ws{ws}.jsonl"
    log = log_dir / f"ws{ws}.log"
    jsonl.unlink(missing_ok=True)
    pending = list(to_run)
    restarts = 0
    while pending:
        temp_dir = tempfile.mkdtemp(prefix=f"smdccl-conf-ws{ws}-")
        os.mkdir(os.path.join(temp_dir, "barrier"))
        tests_file = Path(temp_dir) / "tests.txt"
        tests_file.write_text("\n".join(pending))
        done_before = len(to_run) - len(pending)
        with open(log, "a") as logf:
            proc = subprocess.Popen(
                [python, __file__, "--worker", "--world-size", str(ws), "--tests-file", str(tests_file),
                 "--out", str(jsonl), "--total", str(len(to_run)), "--done", str(done_before)],
                env=_worker_env(ws, temp_dir, start), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            current, started = None, time.monotonic()
            seen = 0
            try:
                while proc.poll() is None:
                    time.sleep(1.0)
                    recs = _read_records(jsonl)
                    for rec in recs[seen:]:
                        if rec["event"] == "start":
                            current, started = rec["test"], time.monotonic()
                        elif rec["event"] == "end":
                            current = None
                    seen = len(recs)
                    if current and time.monotonic() - started > per_test_limit:
                        _kill_group(proc)
                        logf.write(f"\n[driver] {current} ran past {per_test_limit:.0f} s: worker killed\n")
                        break
            finally:  # also on Ctrl-C / SIGTERM: no ranks left behind
                if proc.poll() is None:
                    _kill_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)
        finished = {}
        last_started = None
        for rec in _read_records(jsonl):
            if rec["event"] == "start":
                last_started = rec["test"]
            elif rec["event"] == "end":
                finished[rec["test"]] = rec
                if last_started == rec["test"]:
                    last_started = None
        for name, rec in finished.items():
            src = "torch" if rec["outcome"] == "skipped" else ""
            records[name] = {"test": name, "outcome": rec["outcome"], "source": src,
                             "detail": rec["detail"], "seconds": rec["seconds"]}
        pending = [n for n in pending if n not in finished]
        if pending:
            # the worker died or hung inside `last_started` (or before any test)
            victim = last_started if last_started in pending else pending[0]
            records[victim] = {"test": victim, "outcome": "error", "source": "",
                               "detail": f"the worker process died or hung in this test (exit code "
                                         f"{proc.returncode}); see {log}", "seconds": 0}
            pending.remove(victim)
            restarts += 1
            if restarts > 20:
                for n in pending:
                    records[n] = {"test": n, "outcome": "error", "source": "",
                                  "detail": "not run: too many worker restarts", "seconds": 0}
                pending = []
    return [records[n] for n in tests]


def _git_rev() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def summarize(results: dict[int, list[dict]], meta: dict) -> tuple[str, dict]:
    lines = [
        "# smdccl against PyTorch's distributed tests",
        "",
        f"- date: {meta['date']}",
        f"- torch {meta['torch']}, smdccl {meta['smdccl']} (git {meta['git']}), Python {meta['python']}",
        f"- machine: {meta['machine']}",
        f"- command: `{meta['command']}` (ranks started by {meta['start']})",
        "- tests: torch's `DistributedTest._DistTestBase` (distributed_test, spawned as "
        "test_distributed_spawn.py does; smdccl registered for `plugin`, `ddp`, `subgroup`, `gpu`), "
        "smdccl's functional-collectives and DTensor cases (scripts/torch_conformance_cases.py)",
        "",
        "| world size | tests | run | passed | failed | errors | skipped by torch | skipped by smdccl's list | test minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    totals = {}
    for ws, recs in sorted(results.items()):
        c = {k: 0 for k in ("passed", "failed", "error", "torch_skip", "smdccl_skip")}
        for r in recs:
            if r["outcome"] == "skipped":
                c["smdccl_skip" if r["source"] == "smdccl" else "torch_skip"] += 1
            else:
                c[r["outcome"]] += 1
        run = c["passed"] + c["failed"] + c["error"]
        mins = sum(r["seconds"] for r in recs) / 60
        totals[ws] = dict(c, tests=len(recs), run=run, minutes=round(mins, 1))
        lines.append(f"| {ws} | {len(recs)} | {run} | {c['passed']} | {c['failed']} | {c['error']} | "
                     f"{c['torch_skip']} | {c['smdccl_skip']} | {mins:.1f} |")
    bad = [(ws, r) for ws, recs in sorted(results.items()) for r in recs if r["outcome"] in ("failed", "error")]
    lines += ["", "## Failures and errors", ""]
    if not bad:
        lines.append("None.")
    for ws, r in bad:
        detail = "\n".join(r["detail"].strip().splitlines()[-12:])
        lines += [f"### {r['test']} (world size {ws}, {r['outcome']})", "", "```", detail, "```", ""]
    lines += ["", "## Skipped by smdccl's list (scripts/torch_conformance_skips.txt)", ""]
    listed: dict[str, list[str]] = {}
    for ws, recs in sorted(results.items()):
        for r in recs:
            if r["outcome"] == "skipped" and r["source"] == "smdccl":
                listed.setdefault(r["test"], []).append(f"{ws}")
    reasons = {r["test"]: r["detail"] for recs in results.values() for r in recs
               if r["outcome"] == "skipped" and r["source"] == "smdccl"}
    if not listed:
        lines.append("None.")
    for name, wss in sorted(listed.items()):
        lines.append(f"- `{name}` (world size {', '.join(wss)}): {reasons[name]}")
    lines += ["", "## Skipped by torch (its own reason)", ""]
    by_reason: dict[str, dict[str, list[int]]] = {}
    for ws, recs in sorted(results.items()):
        for r in recs:
            if r["outcome"] == "skipped" and r["source"] != "smdccl":
                reason = r["detail"].strip().splitlines()[0] if r["detail"].strip() else "(no reason given)"
                by_reason.setdefault(reason, {}).setdefault(r["test"], []).append(ws)
    for reason, tests in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- {reason} ({len(tests)} tests): " + ", ".join(
            f"`{t}`" + ("" if len(w) == len(results) else f" (ws {','.join(map(str, w))})")
            for t, w in sorted(tests.items())))
    return "\n".join(lines) + "\n", totals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2,3", help="comma list (default 2,3)")
    ap.add_argument("-k", action="append", default=[], help="run tests whose name contains this (repeatable)")
    ap.add_argument("--tests", default="", help="comma list of exact test names")
    ap.add_argument("--subset", choices=["all", "ci"], default="all")
    ap.add_argument("--start", choices=["forkserver", "spawn"], default="forkserver",
                    help="how ranks start: forkserver (default: forked from a process that imported the "
                         "test modules once) or spawn (torch's own way, 5-30 s more per test here)")
    ap.add_argument("--skips", default=str(DEFAULT_SKIPS), help="skip list (default: %(default)s)")
    ap.add_argument("--summary", default="", help="write the summary (markdown) here; a .json beside it")
    ap.add_argument("--log-dir", default="", help="worker logs and records (default: a new /tmp directory)")
    ap.add_argument("--per-test-limit", type=float, default=660.0,
                    help="seconds before a test's worker is killed (torch's own limit is 300-500 s)")
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--list", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--world-size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tests-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--done", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(args)

    # SIGTERM unwinds like Ctrl-C, so that the running worker is killed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    python = sys.executable
    world_sizes = [int(w) for w in args.world_sizes.split(",") if w]
    skips = load_skips(Path(args.skips))
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="smdccl-conformance-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    all_tests = [n for _, n in _enumerate(python, max(world_sizes))]
    if len(set(all_tests)) != len(all_tests):
        raise SystemExit("test names are not unique across the classes")
    unknown = sorted({n for n, _ in skips} - set(all_tests))
    if unknown:
        raise SystemExit(f"{args.skips} names tests that do not exist: {', '.join(unknown)}")
    wanted = [n.strip() for n in args.tests.split(",") if n.strip()]
    if args.subset == "ci":
        wanted += CI_SUBSET
    missing = sorted(set(wanted) - set(all_tests))
    if missing:
        raise SystemExit(f"no such tests: {', '.join(missing)}")
    tests = [n for n in all_tests if (not wanted or n in wanted) and (not args.k or any(k in n for k in args.k))]
    if not tests:
        raise SystemExit("no test selected")
    print(f"{len(tests)} tests x world sizes {world_sizes}; logs in {log_dir}", flush=True)

    results = {}
    for ws in world_sizes:
        results[ws] = run_world_size(python, ws, tests, skips, log_dir, args.per_test_limit, args.start)
    import torch

    try:
        from importlib.metadata import version

        smdccl_version = version("smdccl")
    except Exception:  # noqa: BLE001
        smdccl_version = "?"
    meta = {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
        "smdccl": smdccl_version,
        "git": _git_rev(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "command": "python scripts/torch_conformance.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "start": args.start,
    }
    text, totals = summarize(results, meta)
    summary = Path(args.summary) if args.summary else log_dir / "summary.md"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(text)
    summary.with_suffix(".json").write_text(json.dumps({"meta": meta, "totals": totals, "results": {
        str(ws): recs for ws, recs in results.items()}}, indent=1) + "\n")
    for ws, t in totals.items():
        print(f"world size {ws}: {t['tests']} tests, {t['run']} run, {t['passed']} passed, {t['failed']} failed, "
              f"{t['error']} errors, {t['torch_skip']} skipped by torch, {t['smdccl_skip']} by smdccl's list")
    print(f"summary: {summary}")
    ok = all(t["failed"] == 0 and t["error"] == 0 and t["run"] > 0 for t in totals.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
