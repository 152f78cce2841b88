"""Where a collective's time goes, from SMDCCL_TRACE timelines.

    python scripts/trace_breakdown.py /tmp/tr_0.json [/tmp/tr_1.json ...]

For each collective and call (`args.call` of the trace's "collective"
slices), the medians over its calls of: the op (from the progress thread
taking it to its completion), the algorithm slices inside it (the data
movement), the op's own work around them (checks, scaling, scratch), and
the gap from the op's end to the next op's start on that rank (Python, the
c10d dispatch, the Work's completion and wait). Blocking calls in a loop
(smdccl.bench) make the gap the per-call cost outside the backend's op.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def _top_level(slices: list[dict]) -> list[dict]:
    """The slices not nested in another (a CUDA path's span holds the host
    algorithm's), by start."""
    top, end = [], float("-inf")
    for a in sorted(slices, key=lambda a: (a["ts"], -a["dur"])):
        if a["ts"] >= end:
            top.append(a)
            end = a["ts"] + a["dur"]
    return top


def breakdown(events: list[dict]) -> dict[str, dict[str, float]]:
    """{call: {"calls", "op_us", "algorithm_us", "around_us", "gap_us"}} from
    one rank's events; each group's ops are on a track (tid) of their own."""
    tracks: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("collective", "algorithm"):
            tracks[(e.get("pid"), e.get("tid"))][e["cat"] == "algorithm"].append(e)
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ops, algos in tracks.values():
        ops.sort(key=lambda e: e["ts"])
        top, j = _top_level(algos), 0
        for k, op in enumerate(ops):
            end = op["ts"] + op["dur"]
            while j < len(top) and top[j]["ts"] < op["ts"]:
                j += 1
            inside = 0
            while j < len(top) and top[j]["ts"] + top[j]["dur"] <= end:
                inside += top[j]["dur"]
                j += 1
            row = rows[op["args"].get("call", op["name"])]
            row["op_us"].append(op["dur"])
            row["algorithm_us"].append(inside)
            row["around_us"].append(op["dur"] - inside)
            if k + 1 < len(ops):
                row["gap_us"].append(ops[k + 1]["ts"] - end)
    return {
        call: {"calls": len(r["op_us"]), **{k: statistics.median(v) for k, v in r.items() if v}}
        for call, r in rows.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="SMDCCL_TRACE files, one per rank")
    args = parser.parse_args(argv)
    print(f"{'trace':<24} {'call':<58} {'calls':>5} {'op':>9} {'algorithm':>9} {'around':>8} {'gap':>8}  (us, medians)")
    for path in args.traces:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        for call, r in sorted(breakdown(events).items()):
            print(f"{path[-24:]:<24} {call[:58]:<58} {r['calls']:>5} {r['op_us']:>9.1f} "
                  f"{r['algorithm_us']:>9.1f} {r['around_us']:>8.1f} {r.get('gap_us', float('nan')):>8.1f}")


if __name__ == "__main__":
    main()
