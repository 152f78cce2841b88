"""FSDP2 on the int8 wire with error feedback.

FSDP2 reduce-scatters each module's gradients every step; on a group with
``compression="int8"`` they cross nodes quantized once (docs/compression.md).
``int8_error_feedback(model)`` gives every FSDP2 module of ``model`` its own
reduce-scatter that keys its calls: the backend then keeps, per module and
element, what the quantization rounded away and adds it before the same
elements are quantized again, so over k steps the gradients applied equal
the true sums up to one step's quantization error::

    from torch.distributed.fsdp import fully_shard
    import smdccl.fsdp

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    smdccl.fsdp.int8_error_feedback(model)

On a group without the int8 wire (one node, another compression) the keys
change nothing. It uses ``FSDPModule.set_custom_reduce_scatter`` (torch's
FSDP2 must have it; torch 2.14 does), which takes one parameter group per
module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["Int8FeedbackReduceScatter", "int8_error_feedback"]

# Keys above DDP's bucket indices (smdccl.ddp), so both can share a group.
_KEY_BASE = 1 << 40


class Int8FeedbackReduceScatter:
    """FSDP2's reduce-scatter (its ``ReduceScatter`` comm interface) whose
    calls carry the int8 wire's error feedback under ``key``: one per module."""

    def __init__(self, key: int):
        self.key = key

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op, async_op: bool = False):
        backend = group._get_backend(input_tensor.device)
        backend = getattr(backend, "wrapped_pg", backend)  # TORCH_DISTRIBUTED_DEBUG=DETAIL
        if not hasattr(backend, "_int8_feedback_next"):
            raise TypeError(f"smdccl.fsdp: the FSDP2 group's backend is {type(backend).__name__}, "
                            "not smdccl: int8 error feedback needs an smdccl group")
        backend._int8_feedback_next(self.key)
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                          async_op=async_op)


def int8_error_feedback(model: torch.nn.Module) -> int:
    """Gives every FSDP2 module in ``model`` (``fully_shard`` applied) a
    keyed reduce-scatter; returns how many. Call it on every rank, after
    ``fully_shard``: the keys follow ``model.modules()``'s order."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("smdccl.fsdp.int8_error_feedback: no FSDP2 module in the model: "
                         "apply torch.distributed.fsdp.fully_shard first")
    if not hasattr(modules[0], "set_custom_reduce_scatter"):
        raise RuntimeError(f"smdccl.fsdp.int8_error_feedback: torch {torch.__version__}'s FSDP2 "
                           "has no set_custom_reduce_scatter, which it needs")
    for index, module in enumerate(modules):
        module.set_custom_reduce_scatter(Int8FeedbackReduceScatter(_KEY_BASE + index))
    return len(modules)
