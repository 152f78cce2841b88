"""Summarizes a scripts/gpu_check.sh run into <stem>.json and <stem>.md.

Reads from the logs folder: kernel-tests.txt, test_cuda.xml (pytest's JUnit
report), kernels.json (smdccl_cuda_kernel_bench --json) and
collectives-<n>ranks.json (python -m smdccl.bench --json), and checks the
targets of the CUDA work: reduce kernels at >= 85 % of the device-to-device
copy bandwidth of the same run, and a 64 MiB allreduce of 2 ranks on one GPU
at >= 3x gloo's in the same run. Also reads probe.txt (what the machine
allows), nccl-hosts-*.json and cluster-*.json (allreduce beside NCCL, every
rank a host to it; their targets: nccl_hosts()), staged-bench*.{json,txt} (the
staged path's rows and summary lines) and burst-bench.json (burst <= 3x one call).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

KERNEL_TARGET = 85.0
ALLREDUCE_TARGET = 3.0
BIG = 64 << 20
SMALL = 4 << 10
FP16_VS_NCCL_TARGET = 1.6
BURST_TARGET = 3.0
SHAPED_VS_NCCL_TARGETS = (("smdccl", 0.95), ("smdccl+fp16", 1.8), ("smdccl+int8", 3.0))


def _read_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def kernel_tests(logs: Path) -> dict:
    text = (logs / "kernel-tests.txt").read_text() if (logs / "kernel-tests.txt").exists() else ""
    m = re.search(r"(\d+) passed, (\d+) failed", text)
    return {"passed": int(m.group(1)), "failed": int(m.group(2))} if m else {"passed": 0, "failed": None,
                                                                             "log_tail": text[-500:]}


def steps(logs: Path) -> list[dict]:
    """gpu_check.sh's steps.txt: one line per step, ``name rc seconds``; rc is a
    number, "skipped", "not-run" (no budget left), "n/a" (the machine cannot run it)
    or 124 (stopped by its limit)."""
    p = logs / "steps.txt"
    out = []
    for line in (p.read_text().splitlines() if p.exists() else []):
        parts = line.split()
        if len(parts) == 3:
            rc = int(parts[1]) if parts[1].lstrip("-").isdigit() else parts[1]
            out.append({"step": parts[0], "rc": rc, "seconds": int(parts[2])})
    return out


def _junit_cases(p: Path) -> list[dict]:
    root = ET.parse(p).getroot()
    cases = []
    for tc in root.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if tc.find(tag) is not None:
                outcome = tag
        cases.append({"test": tc.get("name"), "outcome": outcome, "seconds": float(tc.get("time", 0))})
    return cases


def pytest_results(logs: Path) -> dict:
    """Every pytest step's JUnit file (test_cuda-<step>.xml; test_cuda.xml from
    older runs of the script). A step stopped by its limit writes none: its
    tests have no verdict, which the steps list shows."""
    files = sorted(logs.glob("test_cuda-*.xml")) + sorted(logs.glob("test_cuda.xml"))
    if not files:
        return {"ran": False, "tests": 0, "failures": 0, "errors": 0, "skipped": 0, "cases": []}
    cases = []
    for p in files:
        step = p.stem.removeprefix("test_cuda-") if p.stem != "test_cuda" else "tests"
        try:
            cases += [dict(c, step=step) for c in _junit_cases(p)]
        except ET.ParseError as exc:
            cases.append({"test": f"({p.name} unreadable: {exc})", "outcome": "error", "seconds": 0.0,
                          "step": step})
    count = {o: sum(c["outcome"] == o for c in cases) for o in ("failure", "error", "skipped")}
    return {"ran": True, "tests": len(cases), "failures": count["failure"], "errors": count["error"],
            "skipped": count["skipped"], "cases": cases}


def kernels(logs: Path) -> dict:
    recs = _read_json(logs / "kernels.json") or []
    recs = [r for r in recs if isinstance(r, dict) and "pct_of_copy" in r]
    reduce_recs = [r for r in recs if r.get("kernel", "").startswith("reduce")]
    worst = min(reduce_recs, key=lambda r: r["pct_of_copy"]) if reduce_recs else None
    return {"records": recs, "worst_reduce": worst,
            "target_pct": KERNEL_TARGET,
            "met": bool(worst) and worst["pct_of_copy"] >= KERNEL_TARGET}


def collectives(logs: Path) -> dict:
    out = {}
    for p in sorted(logs.glob("collectives-*.json")):
        d = _read_json(p)
        if d:
            out[p.stem] = d
    two = out.get("collectives-2ranks", {}).get("rows", [])

    def algbw(backend):
        rows = [r for r in two if r["backend"] == backend and r["collective"] == "allreduce" and r["size"] == BIG]
        return rows[0]["algbw"] if rows else None

    s, g = algbw("smdccl"), algbw("gloo")
    ratio = s / g if s and g else None
    return {"runs": out, "allreduce_64MiB_2ranks": {"smdccl_algbw": s, "gloo_algbw": g, "ratio": ratio,
                                                      "target": ALLREDUCE_TARGET,
                                                      "met": ratio is not None and ratio >= ALLREDUCE_TARGET}}


def _vs_nccl(at, backend: str, size: int, factor: float) -> dict:
    """Target: `backend`'s algbw >= factor x NCCL's at `size`."""
    b, n = at(backend, size), at("nccl", size)
    return {"what": f"{backend} algbw >= {factor}x nccl's at {size >> 20} MiB",
            "value": b["algbw"] / n["algbw"] if b and n else None, "unit": "x nccl's algbw",
            "met": bool(b and n and b["algbw"] >= factor * n["algbw"])}


def nccl_hosts(logs: Path) -> dict:
    """Each --nccl-ranks-as-hosts run (nccl-hosts-<layout>.json, and
    cluster-<link>.json between emulated nodes) and its targets. A run on a
    shaped link (loopback: a name ending in -lo10gbit; the cluster's veths)
    holds the link-bound targets: smdccl >= 0.95x, smdccl+fp16 >= 1.8x and
    smdccl+int8 >= 3x NCCL's algbw at 64 MiB, and smdccl's time <= NCCL's at
    4 KiB; a loopback run's log gives the rate one TCP stream got
    (loopback_rate_mbps)."""
    runs = {}
    for p in sorted(logs.glob("nccl-hosts-*.json")) + sorted(logs.glob("cluster-*.json")):
        d = _read_json(p)
        if not d:
            continue
        rows = [r for r in d.get("rows", []) if r.get("collective") == "allreduce"]

        def at(backend, size, rows=rows):
            got = [r for r in rows if r["backend"] == backend and r["size"] == size]
            return got[0] if got else None

        shaped = p.stem.endswith("-lo10gbit") or p.stem.startswith("cluster-")
        targets = []
        for size in (SMALL,) if shaped else (SMALL, BIG):
            s, n = at("smdccl", size), at("nccl", size)
            targets.append({"what": f"smdccl time <= nccl's at {size >> 10} KiB",
                            "value": s["time_us"] / n["time_us"] if s and n else None,
                            "unit": "x nccl's time", "met": bool(s and n and s["time_us"] <= n["time_us"])})
        if shaped:
            targets += [_vs_nccl(at, b, BIG, f) for b, f in SHAPED_VS_NCCL_TARGETS]
        else:
            targets.append(_vs_nccl(at, "smdccl+fp16", BIG, FP16_VS_NCCL_TARGET))
        run = {"rows": rows, "header": d.get("header", {}), "targets": targets}
        log = p.with_suffix(".txt")
        m = re.search(r"^loopback_rate_mbps (\d+)", log.read_text(), re.M) if log.exists() else None
        if m:
            run["loopback_rate_mbps"] = int(m.group(1))
        runs[p.stem] = run
    return runs


def staged_bench(logs: Path) -> list[str]:
    """Each staged-bench step, named by step: its rows (staged-bench*.json:
    time, PCIe bytes and smdccl's CUDA/NCCL calls per call and rank, issue
    41's counts) and its summary lines (staged-bench*.txt)."""
    out = []
    for p in sorted(logs.glob("staged-bench*.txt")):
        rows = (_read_json(p.with_suffix(".json")) or {}).get("rows", [])
        if rows:
            out.append(f"[{p.stem}] {'path':>14} {'bytes':>10} {'time(us)':>11} {'pcie(MB)':>9} "
                       f"{'calls':>7}")
        out += [f"[{p.stem}] {r['path']:>14} {r['bytes']:>10} {r['time_us']:>11.1f} "
                f"{r['pcie_mb']:>9.2f} {r['cuda_calls']:>7.0f}" for r in rows]
        out += [f"[{p.stem}] {ln[2:]}" for ln in p.read_text().splitlines()
                if ln.startswith("# ") and "float32 staging" in ln]
    return out


def burst(logs: Path) -> list[dict]:
    """The burst step's rows (burst-bench.json: one call against 100 issued
    back to back, per path and size), each with its ratio and the target
    (burst <= BURST_TARGET x one)."""
    d = _read_json(logs / "burst-bench.json") or {}
    out = []
    for r in d.get("rows", []):
        ratio = r["burst_us"] / r["one_us"] if r.get("one_us") else None
        out.append(dict(r, ratio=ratio, met=ratio is not None and ratio <= BURST_TARGET))
    return out


def probe(logs: Path) -> list[str]:
    p = logs / "probe.txt"
    return p.read_text().splitlines() if p.exists() else []


def gpu_info() -> dict:
    try:
        import torch

        return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                "torch": torch.__version__, "cuda": torch.version.cuda}
    except Exception as exc:  # noqa: BLE001 - the report still gets written
        return {"error": str(exc)}


def skipped(rep: dict, step: str) -> bool:
    """Whether the check left `step` out (SMDCCL_GPU_CHECK_SKIP): its target is
    then not measured, neither met nor missed. A step run more than once (a
    resumed check) counts by its last record."""
    last = [st["rc"] for st in rep["steps"] if st["step"] == step][-1:]
    return last == ["skipped"]


def target_ok(rep: dict) -> bool:
    """The targets the exit status holds: each met, or its step skipped."""
    return ((rep["kernels"]["met"] or skipped(rep, "kernel-bench")) and
            (rep["collectives"]["allreduce_64MiB_2ranks"]["met"] or skipped(rep, "collectives-2ranks")))


def markdown(rep: dict) -> str:
    g = rep["gpu"]
    lines = [f"# smdccl GPU check: {g.get('name')} x{g.get('count')} — {rep['date']}", "",
             f"Command: `{rep['command']}`  ", f"torch {g.get('torch')} (CUDA {g.get('cuda')}), "
             f"sm_{str(g.get('capability', '')).replace('.', '')}, host {rep['host']}, commit {rep['commit']}", ""]
    kt, pt = rep["kernel_tests"], rep["tests"]
    if rep["steps"]:
        lines += ["## Steps (in the order run; rc 124: stopped by its time limit, no verdict; "
                  "n/a: this machine cannot run it, e.g. tc cannot shape lo)", "",
                  "| step | rc | seconds |", "|---|---|---|"]
        lines += [f"| {st['step']} | {st['rc']} | {st['seconds']} |" for st in rep["steps"]]
        lines.append("")
    lines += ["## Tests", f"- kernel unit tests: {kt.get('passed')} passed, {kt.get('failed')} failed",
              f"- pytest (tests/test_cuda.py, FSDP2 on CUDA): {pt.get('tests')} tests, {pt.get('failures')} "
              f"failures, {pt.get('errors')} errors, {pt.get('skipped')} skipped"]
    for c in pt.get("cases", []):
        lines.append(f"  - [{c.get('step', '')}] {c['test']}: {c['outcome']} ({c['seconds']:.1f} s)")
    k = rep["kernels"]
    lines += ["", "## Kernels (median of timed runs; bytes read + written)", "",
              "| kernel | dtype | op | MiB/buffer | GB/s | copy GB/s | % of copy |", "|---|---|---|---|---|---|---|"]
    for r in k["records"]:
        name = r.get("kernel", "") + (f" (k={r['k']})" if r.get("k") else "")
        lines.append(f"| {name} | {r.get('dtype', '')} | {r.get('op', '')} | "
                     f"{r.get('bytes_per_buffer', 0) / 2**20:.0f} | {r.get('gbps', 0):.0f} | "
                     f"{r.get('copy_gbps', 0):.0f} | {r.get('pct_of_copy', 0):.1f} |")
    w = k["worst_reduce"]
    lines.append("")
    lines.append(f"Target: every reduce kernel >= {KERNEL_TARGET:.0f} % of the copy: "
                 + (f"worst {w['kernel']} {w.get('dtype')} {w['pct_of_copy']:.1f} % -> "
                    f"{'MET' if k['met'] else 'MISSED'}" if w else
                    "not measured (kernel-bench skipped)" if skipped(rep, "kernel-bench") else
                    "no kernel records -> MISSED"))
    c = rep["collectives"]
    for name, run in c["runs"].items():
        rows = run.get("rows", [])
        lines += ["", f"## {name} (CUDA tensors, one GPU shared; algbw GB/s, median)", ""]
        backends = sorted({r["backend"] for r in rows}, key=lambda b: (b != "smdccl", b))
        colls = sorted({r["collective"] for r in rows})
        for coll in colls:
            sizes = sorted({r["size"] for r in rows if r["collective"] == coll})
            lines += [f"**{coll}**", "", "| size | " + " | ".join(backends) + " | smdccl / gloo |",
                      "|---|" + "---|" * (len(backends) + 1)]
            for sz in sizes:
                vals = {r["backend"]: r for r in rows if r["collective"] == coll and r["size"] == sz}
                cells = [f"{vals[b]['algbw']:.2f} ({vals[b]['time_us']:.0f} us)" if b in vals else "-" for b in backends]
                ratio = (vals["smdccl"]["algbw"] / vals["gloo"]["algbw"]
                         if "smdccl" in vals and "gloo" in vals and vals["gloo"]["algbw"] else None)
                lines.append(f"| {sz >> 10} KiB | " + " | ".join(cells) + f" | {ratio:.1f}x |" if ratio
                             else f"| {sz >> 10} KiB | " + " | ".join(cells) + " | - |")
            lines.append("")
    a = c["allreduce_64MiB_2ranks"]
    lines.append(f"Target: 64 MiB allreduce, 2 ranks on one GPU, >= {ALLREDUCE_TARGET:.0f}x gloo: "
                 + (f"{a['ratio']:.1f}x -> {'MET' if a['met'] else 'MISSED'}" if a["ratio"] else
                    "not measured (collectives-2ranks skipped)" if skipped(rep, "collectives-2ranks") else
                    "no data -> MISSED"))
    if rep.get("probe"):
        lines += ["", "## The machine", ""] + [f"- {ln}" for ln in rep["probe"]]
    for name, run in rep.get("nccl_hosts", {}).items():
        rows = run["rows"]
        backends = [b for b in ("nccl", "smdccl", "smdccl+fp16", "smdccl+int8", "gloo")
                    if any(r["backend"] == b for r in rows)]
        shaping = (f"loopback shaped to 10 Gbit/s by tbf on lo, both directions sharing it; one TCP stream "
                   f"measured {run['loopback_rate_mbps']} MB/s" if "loopback_rate_mbps" in run
                   else "emulated nodes (network namespaces) on shaped veths" if name.startswith("cluster-")
                   else "loopback, unshaped")
        lines += ["", f"## {name}: float32 allreduce beside NCCL, every rank a host to NCCL "
                      f"(socket transport; {shaping}); time us (algbw GB/s), median of passes", "",
                  "| size | " + " | ".join(backends) + " | smdccl / nccl time |",
                  "|---|" + "---|" * (len(backends) + 1)]
        for sz in sorted({r["size"] for r in rows}):
            vals = {r["backend"]: r for r in rows if r["size"] == sz}
            cells = [f"{vals[b]['time_us']:.0f} ({vals[b]['algbw']:.2f})" if b in vals else "-" for b in backends]
            ratio = (f"{vals['smdccl']['time_us'] / vals['nccl']['time_us']:.2f}x"
                     if "smdccl" in vals and "nccl" in vals else "-")
            lines.append(f"| {sz >> 10} KiB | " + " | ".join(cells) + f" | {ratio} |")
        lines.append("")
        for t in run["targets"]:
            val = f"{t['value']:.2f} {t['unit']}" if t["value"] is not None else "no data"
            lines.append(f"- Target: {t['what']}: {val} -> {'MET' if t['met'] else 'MISSED'}")
    if rep.get("staged_bench"):
        lines += ["", "## The staged path across nodes (packed on the GPU) beside float32 staging and gloo", ""]
        lines += [f"    {ln}" for ln in rep["staged_bench"]]
    if rep.get("burst"):
        lines += ["", "## 100 async 4 KiB allreduces across nodes against one (burst-bench)", "",
                  "| path | bytes | one (us) | burst (us) | ratio |", "|---|---|---|---|---|"]
        lines += [f"| {r['path']} | {r['bytes']} | {r['one_us']:.1f} | {r['burst_us']:.1f} | "
                  f"{r['ratio']:.2f}x |" if r["ratio"] is not None else f"| {r['path']} | {r['bytes']} | - | - | - |"
                  for r in rep["burst"]]
        lines += [""] + [f"- Target: {r['path']} burst <= {BURST_TARGET:.0f}x one -> "
                         f"{'MET' if r['met'] else 'MISSED'}" for r in rep["burst"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", required=True, type=Path)
    ap.add_argument("--stem", required=True, help="output path without extension")
    ap.add_argument("--status", type=int, default=0, help="gpu_check.sh's status so far")
    ap.add_argument("--gpu-json", type=Path, help="take the GPU's facts from this earlier report "
                    "(to rewrite a report away from the GPU it ran on)")
    args = ap.parse_args()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    import os

    commit = os.environ.get("SMDCCL_COMMIT") or commit
    rep = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
           "command": os.environ.get("SMDCCL_GPU_CHECK_COMMAND", "bash scripts/gpu_check.sh"),
           "commit": commit or "(not a git checkout)",
           "gpu": (_read_json(args.gpu_json) or {}).get("gpu", {}) if args.gpu_json else gpu_info(),
           "kernel_tests": kernel_tests(args.logs), "tests": pytest_results(args.logs),
           "steps": steps(args.logs),
           "kernels": kernels(args.logs), "collectives": collectives(args.logs),
           "probe": probe(args.logs), "nccl_hosts": nccl_hosts(args.logs), "staged_bench": staged_bench(args.logs), "burst": burst(args.logs),
           "script_status": args.status}
    Path(args.stem + ".json").write_text(json.dumps(rep, indent=1))
    Path(args.stem + ".md").write_text(markdown(rep))
    return 0 if args.status == 0 and target_ok(rep) else 1


if __name__ == "__main__":
    raise SystemExit(main())
