"""What smdccl would run with on this machine: ``python -m smdccl.info``.

Prints the versions (smdccl, torch, Python), how the engine was built (the
compiler, whether CUDA code is compiled in), the CPU features the reduction
kernels use, the transports this host offers (shared memory, TCP and the
interface TCP would listen on) and every SMDCCL_* variable that is set.
``--json`` prints the same as one JSON object. Meant to be pasted into a bug
report; it starts no process group and opens no connection.

``--env`` lists every SMDCCL_* variable the engine declares (default, values,
meaning, the value set here); ``--env-markdown`` prints docs/env.md, which is
made from the same declarations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys

# CPU flags (/proc/cpuinfo names) that matter to the kernels or to a reader
# comparing machines.
_CPU_FLAGS = ("sse4_2", "avx", "avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512_bf16",
              "avx512_fp16", "asimd", "fphp", "asimdhp", "sve")


def _cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and value.strip():
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "logical_cores": os.cpu_count(),
            "flags": [f for f in _CPU_FLAGS if f in flags]}


def _shared_memory() -> dict:
    path = "/dev/shm"
    try:
        st = os.statvfs(path)
        return {"path": path, "writable": os.access(path, os.W_OK),
                "free_bytes": st.f_bavail * st.f_frsize}
    except OSError as exc:
        return {"path": path, "writable": False, "error": str(exc)}


def _interfaces() -> list:
    """IPv4 address of every interface that has one (Linux ioctl; empty elsewhere)."""
    out = []
    try:
        import fcntl
        import struct

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
                out.append({"name": name, "ipv4": socket.inet_ntoa(packed[20:24])})
            except OSError:
                continue  # no IPv4 address
    return out


def collect() -> dict:
    import torch

    import smdccl
    from smdccl import _C

    build = dict(_C.build_info())
    cuda_torch = torch.version.cuda
    return {
        "smdccl": {"version": smdccl.__version__, "path": os.path.dirname(smdccl.__file__),
                   "engine": _C.__file__},
        "build": build,
        "torch": {"version": torch.__version__, "cuda_build": cuda_torch,
                  "cuda_available": bool(cuda_torch) and torch.cuda.is_available(),
                  "gpus": torch.cuda.device_count() if cuda_torch and torch.cuda.is_available() else 0},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": dict(_cpu(), reduce_kernels=_C.reduce_isa()),
        "transports": {
            "shared_memory": _shared_memory(),
            "tcp": {"interfaces": _interfaces(),
                    "SMDCCL_SOCKET_IFNAME": os.environ.get("SMDCCL_SOCKET_IFNAME")},
        },
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SMDCCL_")},
        "cuda_settings": _cuda_settings(_C),
        "nccl": _nccl(_C),
    }


def _nccl(c) -> dict:
    """The NCCL CUDA collectives inside a node would run on (SMDCCL_INTRA)."""
    lib = dict(c.nccl_library())
    lib.pop("unique_id", None)
    return lib


def _cuda_settings(c) -> str:
    try:
        return c.cuda_settings()
    except ValueError as exc:  # a bad SMDCCL_CUDA_* value: say it, do not fail the report
        return f"invalid: {exc}"


def _values(v: dict) -> str:
    """What a variable accepts, from its declaration."""
    if v["kind"] in ("int", "number"):
        # .15g: 1048576 in full, not 1.04858e+06.
        return f"{'integer' if v['kind'] == 'int' else 'number'}, {v['min']:.15g} to {v['max']:.15g}"
    return f"one of: {v['choices']}" if v["choices"] else "text"


ENV_MD_HEADER = """\
# Environment variables

Every `SMDCCL_*` variable smdccl reads, as declared beside the code that reads
it (`SMDCCL_ENV_*` in `csrc/`, the file in the last column). A value outside
its range or choices fails when a process group is created, with an error that
names the variable and what it accepts. Set a variable alike on every rank
unless its text says otherwise.

This file is generated: `python -m smdccl.info --env-markdown > docs/env.md`
(`tests/test_env_docs.py` checks that it matches the declarations).

| Variable | Default | Values | Meaning | Declared in |
|---|---|---|---|---|
"""


def env_markdown(table: list) -> str:
    """docs/env.md, from the declarations (``smdccl._registration.env_table()``)."""
    rows = []
    for v in table:
        default = f"`{v['default']}`" if v["default"] else "(unset)"
        meaning = v["help"].replace("|", "\\|")
        rows.append(f"| `{v['name']}` | {default} | {_values(v)} | {meaning} | `{v['declared_in']}` |")
    return ENV_MD_HEADER + "\n".join(rows) + "\n"


def env_text(table: list, environ) -> str:
    """Every declared variable with its default, values and meaning, and its value here."""
    out = []
    for v in table:
        here = environ.get(v["name"])
        out.append(f"{v['name']} = {here if here else '(unset)'}  [default "
                   f"{v['default'] or '(unset)'}; {_values(v)}]")
        out.append(f"    {v['help']}")
    return "\n".join(out)


def render(info: dict) -> str:
    b, t, c, tr = info["build"], info["torch"], info["cpu"], info["transports"]
    shm = tr["shared_memory"]
    shm_line = (f"{shm['path']} writable, {shm['free_bytes'] / 2**30:.1f} GiB free"
                if shm.get("writable") else f"{shm['path']} not usable ({shm.get('error', 'not writable')})")
    ifname = tr["tcp"]["SMDCCL_SOCKET_IFNAME"]
    ifaces = ", ".join(f"{i['name']} {i['ipv4']}" for i in tr["tcp"]["interfaces"]) or "none found"
    env = info["environment"]
    lines = [
        f"smdccl {info['smdccl']['version']}  ({info['smdccl']['path']})",
        f"  engine     {info['smdccl']['engine']}",
        f"  built with {b['compiler']}, {b['build_type']}, CUDA kernels: "
        f"{'compiled' if b['cuda'] else 'not compiled (CPU build)'}"
        + (f", sanitizers: {b['sanitizers']}" if b["sanitizers"] else ""),
        f"torch {t['version']}  (CUDA build: {t['cuda_build'] or 'none'}; CUDA available: "
        f"{'yes, ' + str(t['gpus']) + ' GPU(s)' if t['cuda_available'] else 'no'})",
        f"python {info['python']['version']}  ({info['python']['executable']})",
        f"host {info['hostname']}: {info['platform']}",
        f"cpu {c['model']}, {c['logical_cores']} logical cores; flags: {' '.join(c['flags']) or '-'}; "
        f"reduce kernels: {c['reduce_kernels']}",
        "transports:",
        f"  shared memory  {shm_line}",
        f"  tcp            interfaces: {ifaces}; SMDCCL_SOCKET_IFNAME "
        + (f"= {ifname}" if ifname else "unset (the route to MASTER_ADDR picks the address)"),
        "environment: " + (", ".join(f"{k}={v}" for k, v in env.items()) if env else "no SMDCCL_* variable set"),
        f"CUDA settings: {info['cuda_settings']}",
        "NCCL (CUDA collectives inside a node, SMDCCL_INTRA): "
        + (f"{info['nccl']['version']} from {info['nccl']['path']}" if info["nccl"]["loaded"]
           else f"not loaded: {info['nccl']['why']} (smdccl's CUDA IPC path serves instead)"),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m smdccl.info", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    what.add_argument("--env", action="store_true",
                      help="list every SMDCCL_* variable: default, values, meaning, value here")
    what.add_argument("--env-markdown", action="store_true",
                      help="print docs/env.md (the same list as a Markdown table)")
    args = p.parse_args(argv)
    if args.env or args.env_markdown:
        from smdccl._registration import env_table

        table = env_table()
        print(env_markdown(table) if args.env_markdown else env_text(table, os.environ), end="")
        return 0
    info = collect()
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
