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

import itertools

import torch
import torch.distributed as dist

__all__ = ["Int8FeedbackReduceScatter", "int8_error_feedback"]

# Keys above DDP's bucket indices (smdccl.ddp), so both can share a group;
# one per module for the process's life, so two models never share one.
_KEYS = itertools.count(1 << 40)


class Int8FeedbackReduceScatter:
    """FSDP2's reduce-scatter (its ``ReduceScatter`` comm interface) whose
    calls carry the int8 wire's error feedback under ``key``: one per module.
    The backend keeps 4 bytes of host memory per element this rank sends to
    other nodes, (n-1)/n of the module's unsharded gradients over n nodes, on
    groups where the int8 wire runs (none elsewhere)."""

    def __init__(self, key: int):
        self.key = key
        self._compresses: dict[int, bool] = {}  # by group: whether the int8 wire runs there

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op, async_op: bool = False):
        backend = group._get_backend(input_tensor.device)
        backend = getattr(backend, "wrapped_pg", backend)  # TORCH_DISTRIBUTED_DEBUG=DETAIL
        if not hasattr(backend, "_int8_feedback_next"):
            raise TypeError(f"smdccl.fsdp: the FSDP2 group's backend is {type(backend).__name__}, "
                            "not smdccl: int8 error feedback needs an smdccl group")
        if id(group) not in self._compresses:
            self._compresses[id(group)] = backend.compression == "int8" and backend.compressed_hops
        keyed = self._compresses[id(group)]  # else nothing is quantized: no residuals to keep
        if keyed:
            backend._int8_feedback_next(self.key)
        try:
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                              async_op=async_op)
        finally:
            if keyed:
                backend._int8_feedback_next(-1)  # taken by the call, or never reached it


def int8_error_feedback(model: torch.nn.Module) -> int:
    """Gives every FSDP2 module in ``model`` (``fully_shard`` applied) a
    keyed reduce-scatter; returns how many. Call it on every rank, after
    ``fully_shard``, for the same models in the same order: the keys follow
    the calls and ``model.modules()``'s order."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("smdccl.fsdp.int8_error_feedback: no FSDP2 module in the model: "
                         "apply torch.distributed.fsdp.fully_shard first")
    if not hasattr(modules[0], "set_custom_reduce_scatter"):
        raise RuntimeError(f"smdccl.fsdp.int8_error_feedback: torch {torch.__version__}'s FSDP2 "
                           "has no set_custom_reduce_scatter, which it needs")
    for module in modules:
        module.set_custom_reduce_scatter(Int8FeedbackReduceScatter(next(_KEYS)))
    return len(modules)
