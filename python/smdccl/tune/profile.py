"""The profile file the backend reads (``SMDCCL_TUNE_FILE``).

Format (parsed by ``CostModel::fromFile`` in csrc/algorithms/cost_model.cpp):
one ``key value`` per line, ``#`` starts a comment, keys

    intra_alpha_us  intra_gbps  inter_alpha_us  inter_gbps  reduce_gbps

all positive numbers (GB/s = 1e9 bytes per second). A key left out keeps the
built-in default. This module writes the header comments (date, host,
versions, topology, every measured point and its fitted time) and the keys;
a level that could not be measured is left out, with a comment that says
so, so the engine's own defaults apply to it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
from dataclasses import dataclass, field

from smdccl.tune.fit import Fit
from smdccl.tune.measure import Point

KEYS = ("intra_alpha_us", "intra_gbps", "inter_alpha_us", "inter_gbps", "reduce_gbps")

#: what each level's messages travel through
TRANSPORT = {"intra": "shared memory", "inter": "TCP"}

#: environment variables that change what ``_C.plan`` answers
_PLAN_ENV = ("SMDCCL_TUNE_FILE", "SMDCCL_ALGO")


@dataclass
class Level:
    name: str                       # "intra" or "inter"
    pair: tuple[int, int] | None    # the global ranks timed
    points: list[Point] = field(default_factory=list)
    fit: Fit | None = None
    skipped: str = ""               # why there is no fit (then the defaults apply)


@dataclass
class Reduce:
    nbytes: int
    seconds: float
    gbps: float


@contextlib.contextmanager
def plain_env():
    """Hide SMDCCL_TUNE_FILE and SMDCCL_ALGO from ``_C.plan`` for a while, so
    that it answers for the built-in model and the model's own choice."""
    saved = {k: os.environ.pop(k) for k in _PLAN_ENV if k in os.environ}
    try:
        yield saved
    finally:
        os.environ.update(saved)


_DESCRIBE = re.compile(
    r"intra (?P<intra_alpha_us>\S+) us \+ (?P<intra_gbps>\S+) GB/s, "
    r"inter (?P<inter_alpha_us>\S+) us \+ (?P<inter_gbps>\S+) GB/s, "
    r"reduce (?P<reduce_gbps>\S+) GB/s")


def parse_description(text: str) -> dict[str, float]:
    """The numbers in ``_C.plan``'s model description, by profile key."""
    m = _DESCRIBE.search(text)
    if not m:
        raise ValueError(f"unexpected cost-model description: {text!r}")
    return {k: float(v) for k, v in m.groupdict().items()}


def builtin_defaults() -> dict[str, float]:
    """The engine's built-in model, by profile key (asked from smdccl itself)."""
    from smdccl import _C

    with plain_env():
        return parse_description(_C.plan("allreduce", 1, (1, 1, 1), "")[2])


def values(levels: list[Level], reduce: Reduce | None) -> dict[str, float]:
    """The keys this run measured (unmeasured ones are absent)."""
    out: dict[str, float] = {}
    for lv in levels:
        if lv.fit is not None:
            out[f"{lv.name}_alpha_us"] = lv.fit.alpha_us
            out[f"{lv.name}_gbps"] = lv.fit.gbps
    if reduce is not None:
        out["reduce_gbps"] = reduce.gbps
    return out


def _num(x: float) -> str:
    return f"{x:.6g}"


def render(levels: list[Level], reduce: Reduce | None, info: dict) -> str:
    """The whole profile as text. ``info``: date, host, torch, smdccl,
    command, world, topology, method, defaults (from :func:`builtin_defaults`)."""
    d = info["defaults"]
    lines = [
        "# smdccl cost-model profile, written by `python -m smdccl.tune`",
        f"# date {info['date']}  host {info['host']}  torch {info['torch']}  "
        f"smdccl {info['smdccl']}",
        f"# command: {info['command']}",
        f"# world: {info['world']} ranks, {info['topology']}",
        f"# {info['method']}",
        f"# use: export SMDCCL_TUNE_FILE={info['path']}",
        "#",
    ]
    for lv in levels:
        where = TRANSPORT[lv.name]
        if lv.fit is None:
            lines.append(f"# {lv.name}: not measured ({lv.skipped}); keys left out, so the "
                         f"built-in defaults apply ({_num(d[lv.name + '_alpha_us'])} us, "
                         f"{_num(d[lv.name + '_gbps'])} GB/s)")
            if lv.points:
                lines.append("#   measured points, for the record:")
                lines += [f"#   {p.nbytes:>10d} B  {p.seconds * 1e6:12.2f} us" for p in lv.points]
            lines.append("#")
            continue
        a, b = lv.pair
        fit = lv.fit
        lines.append(f"# {lv.name}: ranks {a} <-> {b} ({where}); fit {_num(fit.alpha_us)} us + "
                     f"{_num(fit.gbps)} GB/s, largest miss {fit.max_rel_err:.0%}"
                     + (f"; {fit.note}" if fit.note else ""))
        lines.append(f"#   {'bytes':>10}  {'measured_us':>12}  {'fit_us':>12}  {'round trips':>11}")
        for p in lv.points:
            lines.append(f"#   {p.nbytes:>10d}  {p.seconds * 1e6:12.2f}  "
                         f"{fit.seconds(p.nbytes) * 1e6:12.2f}  {p.iters:>11d}")
        lines.append("#")
    if reduce is None:
        lines.append(f"# reduce: not measured; built-in defaults apply ({_num(d['reduce_gbps'])} GB/s)")
    else:
        lines.append(f"# reduce: float32 add_ of {reduce.nbytes} B per operand on one thread, "
                     f"median {reduce.seconds * 1e6:.1f} us -> {_num(reduce.gbps)} GB/s")
    lines.append("#")
    for key, value in values(levels, reduce).items():
        lines.append(f"{key} {_num(value)}")
    return "\n".join(lines) + "\n"


def write(path: str, text: str) -> None:
    """Write atomically, so a reader never sees half a profile."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def header_info(layout, path: str, command: str, method: str) -> dict:
    import torch

    import smdccl

    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "smdccl": getattr(smdccl, "__version__", "?"),
        "command": command,
        "world": layout.world,
        "topology": layout.topology,
        "method": method,
        "path": os.path.abspath(path),
        "defaults": builtin_defaults(),
    }
