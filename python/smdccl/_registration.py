"""Registers "smdccl" with torch.distributed.

Three ways in, all idempotent:
- ``import smdccl`` calls :func:`register`;
- the ``torch.distributed.backends`` entry point (torch >= 2.14) calls
  :func:`register` lazily from ``init_process_group("smdccl")``;
- the ``torch.backends`` entry point (torch >= 2.11) calls :func:`autoload` at
  ``import torch``. An exception there would break ``import torch`` itself, so
  it only warns.

The engine (``smdccl._C``) is imported when the first group is created, not at
registration, so ``import torch`` stays cheap.
"""

from __future__ import annotations

import os
import warnings

BACKEND_NAME = "smdccl"

#: The one variable read before the engine loads (at ``import torch``), so
#: declared here, in the engine's table's form; :func:`env_table` joins the two.
AUTOLOAD_ENV = {
    "name": "SMDCCL_AUTOLOAD", "default": "1", "kind": "text", "min": 0, "max": 0, "choices": "",
    "help": "0 stops the registration that runs at `import torch` (read by the Python package).",
    "declared_in": "python/smdccl/_registration.py",
}


def env_table() -> list:
    """Every SMDCCL_* variable's declaration, the engine's and this module's, by name."""
    from smdccl import _C

    return sorted(_C.env_table() + [AUTOLOAD_ENV], key=lambda v: v["name"])


def _master_addr_hint(store) -> str:
    """Address to route towards when picking the network interface."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    # init_method="tcp://host:port" leaves no env var: ask the TCPStore.
    seen = 0
    while store is not None and seen < 8:
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        seen += 1
    return ""


_OPTION_NAMES = ("compression", "compression_intra")


def _backend_options(backend_options) -> dict:
    """pg_options as a dict: a dict, or an object with those attributes."""
    if backend_options is None:
        return {}
    if isinstance(backend_options, dict):
        options = dict(backend_options)
    else:
        options = {k: getattr(backend_options, k) for k in _OPTION_NAMES if hasattr(backend_options, k)}
        if not options and getattr(backend_options, "__dict__", None) is None:
            raise TypeError(
                "smdccl: pg_options must be None, a dict or an object with the attributes "
                f"{', '.join(_OPTION_NAMES)}; got {type(backend_options).__name__}"
            )
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise ValueError(f"smdccl: unknown pg_options {unknown}; known: {list(_OPTION_NAMES)}")
    return options


_exit_hook_registered = False


def _register_exit_hook(_C) -> None:
    """Before the interpreter finalizes, smdccl's threads must stop dropping
    Python-owned tensors (a thread that takes the GIL then is ended by a
    forced unwind, which aborts the process): see csrc/common/exit_fence.h."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        import atexit

        atexit.register(_C._mark_process_exiting)
        _exit_hook_registered = True


def _create_backend(dist_opts, backend_options=None):
    import torch.distributed as dist

    from smdccl import _C

    _register_exit_hook(_C)

    options = _backend_options(backend_options)
    compression = options.get("compression") or ""  # checked by the engine (one list of names)
    intra = options.get("compression_intra")
    world_size = dist.get_world_size() if dist.is_initialized() else dist_opts.group_size
    params = _C._GroupParams()
    params.rank = dist_opts.group_rank
    params.size = dist_opts.group_size
    params.group_name = str(dist_opts.group_id)
    params.global_ranks = [int(r) for r in dist_opts.global_ranks_in_group]
    params.timeout_seconds = dist_opts.timeout.total_seconds()
    params.master_addr = _master_addr_hint(dist_opts.store)
    params.world_size = world_size
    params.compression = compression
    params.compression_intra = -1 if intra is None else int(bool(intra))
    return _C._create_backend(dist_opts.store, params)


def is_registered() -> bool:
    import torch.distributed as dist

    return BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {})


def register() -> None:
    """Make ``backend="smdccl"`` available to torch.distributed (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("smdccl: this torch build has no torch.distributed support")
    if is_registered():
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )


def autoload() -> None:
    """Entry point run at ``import torch``: never raises."""
    if os.environ.get(AUTOLOAD_ENV["name"], AUTOLOAD_ENV["default"]) == "0":
        return
    try:
        register()
    except Exception as exc:  # noqa: BLE001 - must not break `import torch`
        warnings.warn(f"smdccl: could not register the backend: {exc}", stacklevel=2)
