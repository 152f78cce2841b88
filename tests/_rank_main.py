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


def main() -> int:
    faulthandler.enable(all_threads=True)  # Python stacks in the log on SIGSEGV / SIGABRT
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
    sys.exit(main())
