"""The nccl-tests-style table (stdout, rank 0) and the JSON file.

Rows are grouped by collective, then ordered by size and, within a size, by
backend in the order given, so that the backends being compared sit on
adjacent lines. Numbers use nccl-tests' units: bytes, elements,
microseconds, GB/s with 1 GB = 1e9 bytes.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import sys
from smdccl._launch import command_line

# (row key, heading, format); the first column is left-aligned.
COLUMNS = (
    ("backend", "backend", "{}"),
    ("size", "size", "{:d}"),
    ("count", "count", "{:d}"),
    ("dtype", "type", "{}"),
    ("op", "redop", "{}"),
    ("time_us", "time(us)", "{:.2f}"),
    ("algbw", "algbw(GB/s)", "{:.3f}"),
    ("busbw", "busbw(GB/s)", "{:.3f}"),
    ("wrong", "#wrong", "{:d}"),
)


def _ordered(rows: list[dict], backends: list[str], collectives: list[str]) -> dict:
    by_coll: dict[str, list[dict]] = {}
    for name in collectives:
        picked = [r for r in rows if r["collective"] == name]
        if picked:
            by_coll[name] = sorted(picked, key=lambda r: (r["size"], backends.index(r["backend"])))
    return by_coll


#: with --algos: the algorithm the cost model says runs, and its estimate
MODEL_COLUMNS = (
    ("model_algo", "algo", "{}"),
    ("model_us", "model(us)", "{:.2f}"),
)


def _cell(row: dict, key: str, fmt: str) -> str:
    return "-" if row.get(key) is None else fmt.format(row[key])


def _lines(rows: list[dict]) -> list[str]:
    columns = COLUMNS + (MODEL_COLUMNS if any("model_us" in r for r in rows) else ())
    cells = [[_cell(r, key, fmt) for key, _, fmt in columns] for r in rows]
    heads = [head for _, head, _ in columns]
    widths = [max(len(c) for c in col) for col in zip(heads, *cells)]

    def join(values: list[str]) -> str:
        first = values[0].ljust(widths[0])
        return "  ".join([first] + [v.rjust(w) for v, w in zip(values[1:], widths[1:])])

    return ["#  " + join(heads)] + ["   " + join(c) for c in cells]


def table(rows: list[dict], skipped: list[dict], backends: list[str],
          collectives: list[str], preamble: str) -> str:
    """The whole report as text: preamble, one block per collective, summary."""
    out = [preamble, "#"]
    for name, picked in _ordered(rows, backends, collectives).items():
        out.append(f"# {name}")
        out.extend(_lines(picked))
        averages = []
        for b in backends:
            bw = [r["busbw"] for r in picked if r["backend"] == b]
            if bw:
                averages.append(f"{b} {sum(bw) / len(bw):.2f}")
        out.append("# avg busbw (GB/s): " + ", ".join(averages))
        out.append("#")
    for s in skipped:
        out.append(f"# skipped {s['backend']} {s['collective']}: {s['reason']}")
    noisy = uneven(rows)
    if noisy:
        out.append(f"# {len(noisy)} of {len(rows)} lines: passes differ by more than "
                   f"{UNEVEN_PASSES:g}x (the machine changed speed; the median pass is shown, "
                   "every pass is in --json): " + ", ".join(noisy[:6])
                   + (", ..." if len(noisy) > 6 else ""))
    wrong = sum(r["wrong"] for r in rows)
    out.append(f"# #wrong total: {wrong}" + ("  OK" if wrong == 0 else "  FAILED"))
    return "\n".join(out)


def header(world, args, backends: list[str]) -> dict:
    """Machine and run description stored at the top of the JSON file."""
    import torch

    info = {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_version": torch.__version__,
        "smdccl_version": None,
        "world_size": world.size,
        "device": world.device.type,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if world.device.type == "cuda" else [],
        "backends": backends,
        "collectives": list(args.collectives),
        "dtype": args.dtype,
        "op": args.op,
        "sizes": list(args.size_list),
        "iters": args.iters or "auto",
        "passes": args.passes,
        "nccl_ranks_as_hosts": bool(getattr(args, "nccl_ranks_as_hosts", False)),
        # what it set (NCCL_HOSTID differs on every rank: not shown)
        "ranks_as_hosts_env": {k: os.environ[k] for k in ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET", "SMDCCL_TOPOLOGY")
                               if k in os.environ},
        "warmup": args.warmup,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command_line": command_line("smdccl.bench"),
        "argv": list(sys.argv),
    }
    if "smdccl" in sys.modules:
        info["smdccl_version"] = getattr(sys.modules["smdccl"], "__version__", None)
    return info


def preamble(info: dict) -> str:
    iters = "auto" if info["iters"] == "auto" else info["iters"]
    passes = info.get("passes", 1)
    return (
        f"# smdccl.bench  {info['command_line']}\n"
        f"# host {info['hostname']} ({info['cpu_count']} cpus), torch {info['torch_version']}, "
        f"{info['world_size']} ranks, device {info['device']}, warmup {info['warmup']} per size "
        f"(after 2 untimed calls per collective at the largest size), iters {iters}, "
        f"{passes} pass{'es' if passes != 1 else ''} (backends in turn at each size)\n"
        "# time: per-call median on each rank, max over ranks"
        + (", median over passes" if passes > 1 else "")
        + "; algbw = size/time; busbw = algbw * nccl-tests factor"
        + ranks_as_hosts_line(info)
    )


def ranks_as_hosts_line(info: dict) -> str:
    """The preamble's line saying that --nccl-ranks-as-hosts was used ('' if not)."""
    if not info.get("nccl_ranks_as_hosts"):
        return ""
    env = info.get("ranks_as_hosts_env", {})
    return ("\n# --nccl-ranks-as-hosts: every rank is a host of its own to NCCL (NCCL_HOSTID per "
            f"rank; NCCL_SOCKET_IFNAME={env.get('NCCL_SOCKET_IFNAME', 'unset')}), so NCCL uses its "
            f"socket transport between ranks, as between nodes; SMDCCL_TOPOLOGY="
            f"{env.get('SMDCCL_TOPOLOGY', 'unset')}")


#: passes of one size that differ by more than this factor are listed under the table
UNEVEN_PASSES = 2.0


def uneven(rows: list[dict]) -> list[str]:
    """'backend collective size (slowest/fastest pass)' where the passes disagree
    by more than UNEVEN_PASSES: the machine changed speed during the run."""
    out = []
    for r in rows:
        times = r.get("pass_us") or []
        if len(times) > 1 and min(times) > 0 and max(times) / min(times) > UNEVEN_PASSES:
            out.append(f"{r['backend']} {r['collective']} {r['size']} ({max(times) / min(times):.1f}x)")
    return out


def write_json(path: str, info: dict, rows: list[dict], skipped: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump({"header": info, "rows": rows, "skipped": skipped}, f, indent=1)
        f.write("\n")
