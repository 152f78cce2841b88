"""smdccl: a two-level (intra-node / inter-node) collective-communication
backend for torch.distributed.

    import torch.distributed as dist
    dist.init_process_group(backend="smdccl")   # importing smdccl is optional

README.md is the entry point; docs/ holds the reference (docs/env.md: every
SMDCCL_* variable, also from `python -m smdccl.info --env`).
"""

from smdccl._registration import BACKEND_NAME, is_registered, register

__version__ = "0.1.0"
__all__ = ["BACKEND_NAME", "register", "is_registered", "env_vars", "__version__"]

register()


def env_vars():
    """Every SMDCCL_* environment variable as (name, default, meaning)."""
    from smdccl._registration import env_table

    return [(v["name"], v["default"], v["help"]) for v in env_table()]
