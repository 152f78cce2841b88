"""Entry point of one rank spawned by ``harness.run_ranks`` (not a test module).

Usage: python tests/_rank_main.py SPEC.pkl RANK

Joins the process group (unless the spec says the function does it itself),
runs the check function, writes ``result<RANK>.pkl`` ({"ok", "value"} or
{"ok": False, "error": traceback}) *before* tearing the group down, so that a
teardown hang still leaves the real outcome for the parent to report.
"""

import faulthandler
import os
import pickle
import sys
import traceback
from datetime import timedelta
from importlib import import_module


def _write(path, payload):
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(payload, fh)
    os.replace(tmp, path)


def _keep_freed_memory() -> None:
    """Let glibc keep freed memory for the next tensor of the same size.

    The checks allocate and free tensors of megabytes in every sub-case; by
    default glibc maps each anew and gives it back, and every new mapping is
    zeroed by the kernel page by page: a third of the machine's CPU time in a
    6-rank two-level matrix. A fixed mmap threshold (32 MiB, glibc's largest)
    and no trimming keep them in the heap instead. A run that sets glibc's
    MALLOC_* variables itself (test_security measures VmRSS) keeps those."""
    import ctypes

    if any(k.startswith("MALLOC_") for k in os.environ):
        return

    try:
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 1 << 30)
        libc.mallopt(m_top_pad, 64 << 20)
    except (OSError, AttributeError):  # not glibc: its defaults are fine
        pass


def _leave(code: int) -> None:
    """Ends the rank as Python's exit would, less the interpreter's teardown.

    The atexit handlers run (smdccl's exit fence among them) and the streams
    are flushed; what is skipped is the interpreter freeing every object one
    by one, which in a rank forked from the fork server touches, and so
    copies, the whole inherited heap: 0.7 s of CPU a rank here, and the suite
    starts about a thousand ranks. The group is destroyed before this (and
    SMDCCL_TRACE's file written with it)."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> int:
    faulthandler.enable(all_threads=True)  # Python stacks in the log on SIGSEGV / SIGABRT
    _keep_freed_memory()
    spec_path, rank = sys.argv[1], int(sys.argv[2])
    with open(spec_path, "rb") as fh:
        spec = pickle.load(fh)
    for p in reversed(spec["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(spec["world_size"])
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(spec["world_size"])
    os.environ["MASTER_ADDR"] = spec["store_host"]
    os.environ["MASTER_PORT"] = str(spec["store_port"])
    result_path = os.path.join(spec["workdir"], f"result{rank}.pkl")

    try:
        if spec["backend"] == "smdccl" and spec["import_backend"]:
            import smdccl  # noqa: F401  registers the backend

        import torch.distributed as dist

        if spec["init"]:
            store = dist.TCPStore(spec["store_host"], spec["store_port"], spec["world_size"],
                                  is_master=False, timeout=timedelta(seconds=120))
            dist.init_process_group(
                spec["backend"], store=store, rank=rank, world_size=spec["world_size"],
                timeout=timedelta(seconds=spec["pg_timeout"]),
            )
        mod_name, qual = spec["fn"].split(":")
        obj = import_module(mod_name)
        for part in qual.split("."):
            obj = getattr(obj, part)
        value = obj(*spec["args"])
        _write(result_path, {"ok": True, "value": value})
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit
        _write(result_path, {"ok": False, "error": traceback.format_exc()})
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # do not linger in a half-broken process group's teardown

    try:
        import gc

        import torch.distributed as dist

        # Free what the check function left in reference cycles (FSDP modules, DTensor
        # meshes...) while the process is healthy, not during interpreter shutdown.
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        print(f"rank {rank}: process group destroyed", file=sys.stderr, flush=True)
    except BaseException:  # noqa: BLE001 - teardown must work too
        _write(result_path, {"ok": False, "error": "destroy_process_group failed:\n" + traceback.format_exc()})
        sys.stderr.write(traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    _leave(main())
