"""DDP communication hooks that put fewer bits on the wire and keep float32 sums.

torch's ``fp16_compress_hook`` casts the bucket to float16 and all-reduces
*in* float16: every partial sum is a 16-bit addition. These hooks hand the
float32 bucket to an smdccl group created with ``compression`` set, so the
values cross the network as fp16/bf16 while every addition stays float32
(the cast is fused into smdccl's send and receive-and-reduce loops)::

    from smdccl.ddp import CompressionState, fp16_wire_hook

    model = DDP(model)
    model.register_comm_hook(CompressionState(), fp16_wire_hook)

``int8_wire_hook`` puts block-wise int8 between nodes (``compression="int8"``,
docs/compression.md): about a quarter of float32's bytes.

``CompressionState(error_feedback=True)`` also carries what a bucket's
quantization rounded away into its next step, so it is sent later instead
of lost: for fp16/bf16 the hook keeps each bucket's local rounding residual;
for int8 the backend keeps the residuals of both quantizations (the pieces
this rank sends to other nodes, and the sums it owns), so over k steps what
DDP applied equals the true gradient sum up to one step's quantization
error. Where no hop of the group is compressed (one node, ``compress_intra``
off; int8: nodes of unequal size too) nothing is rounded: the hook is plain
float32 DDP.
"""

import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

__all__ = ["CompressionState", "fp16_wire_hook", "bf16_wire_hook", "int8_wire_hook",
           "fp16_compress_hook", "bf16_compress_hook"]

_WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class CompressionState:
    """State of a compression hook: the group to reduce over and the residuals.

    ``process_group``: DDP's group (None: the default group). The hook makes
    one smdccl group of the same ranks per compression, with ``pg_options``
    ``{"compression": ...}``, the first time it runs (every rank of DDP runs
    the hook in the same order, so the creation is collective).
    ``compress_intra``: compress inside nodes too (default: between nodes).
    ``error_feedback``: add last step's rounding residual of the same bucket
    before sending, and keep the new one. A bucket is known by its index,
    its parameters and its size, so a residual only returns to the
    gradients it came from: after DDP rebuilds its buckets (after the first
    step), and when several DDP models share one state.
    ``timeout``: the hook's groups' timeout (a ``timedelta``; None: torch's
    default for a new group, 30 minutes, whatever DDP's group has): how long
    a bucket's allreduce waits for a rank that never comes before it fails,
    naming the op and the peer.
    """

    process_group: Any = None
    error_feedback: bool = False
    compress_intra: bool = False
    timeout: Optional[timedelta] = None
    _groups: dict = field(default_factory=dict, repr=False)
    _residuals: dict = field(default_factory=dict, repr=False)
    _compressing: dict = field(default_factory=dict, repr=False)
    _int8_keys: dict = field(default_factory=dict, repr=False)  # bucket key -> the backend's
    _int8_numbers: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def group_for(self, compression: str):
        if compression not in self._groups:
            ranks = dist.get_process_group_ranks(self.process_group or dist.group.WORLD)
            self._groups[compression] = dist.new_group(
                ranks,
                backend="smdccl",
                pg_options={"compression": compression, "compression_intra": self.compress_intra},
                timeout=self.timeout,
            )
        return self._groups[compression]

    def backend_for(self, compression: str):
        """The smdccl backend of the hook's group for `compression`."""
        backend = self.group_for(compression)._get_backend(torch.device("cpu"))
        # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every backend in a checker.
        return getattr(backend, "wrapped_pg", backend)

    def compresses(self, compression: str) -> bool:
        """Whether any hop of the hook's group puts fewer bits on the wire:
        it spans several nodes (int8: of one size), or ``compress_intra``
        compresses inside one. The backend answers (the rule its collectives
        round by), the same on every rank."""
        if compression not in self._compressing:
            self._compressing[compression] = bool(self.backend_for(compression).compressed_hops)
        return self._compressing[compression]

    def bucket_key(self, bucket) -> tuple:
        """What a bucket's residuals are kept under (see ``error_feedback``).

        A bucket seen for the first time after DDP rebuilt its buckets ends
        the residuals (fp16/bf16 here, int8 in the backend) of the buckets
        that held any of its parameters (they are gone), so one set per
        model is kept, not one per bucket layout. The whole parameter list
        is in the key: a rebuilt bucket with the old one's index, first
        parameter and size but other parameters must not take its residuals."""
        params = tuple(p.data_ptr() for p in bucket.parameters())
        key = (bucket.index(), params, bucket.buffer().numel())
        if key not in self._residuals and key not in self._int8_keys and params:
            held = set(params)
            for gone in [k for k in self._residuals if isinstance(k, tuple) and held.intersection(k[1])]:
                del self._residuals[gone]
            for gone in [k for k in self._int8_keys if held.intersection(k[1])]:
                self.backend_for("int8")._int8_feedback_drop(self._int8_keys.pop(gone))
        return key

    def int8_key(self, bucket) -> int:
        """The backend's key for a bucket's int8 residuals: one per bucket key."""
        key = self.bucket_key(bucket)
        if key not in self._int8_keys:
            self._int8_keys[key] = next(self._int8_numbers)
        return self._int8_keys[key]

    def apply_error_feedback(self, key, buffer: torch.Tensor, wire: torch.dtype) -> None:
        """buffer += residual; residual = buffer - round(buffer); buffer = round(buffer).

        A value the wire cannot carry leaves no residual and is not rounded:
        inf and NaN (a loss scaler's overflowed step, which it skips) would
        otherwise make every later step non-finite, and a finite value past
        fp16's range reaches the backend as it is, whose overflow check
        raises as it does without feedback."""
        residual = self._residuals.get(key)
        if residual is not None and residual.shape == buffer.shape:
            buffer.add_(residual)
        rounded = buffer.to(wire).to(buffer.dtype)
        carried = torch.isfinite(rounded)
        self._residuals[key] = torch.where(carried, buffer - rounded, 0.0)
        buffer.copy_(torch.where(carried, rounded, buffer))


def _compress_hook(compression: str, state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    if state is None:
        raise TypeError("smdccl.ddp hooks need a CompressionState (register_comm_hook(CompressionState(), hook))")
    buffer = bucket.buffer()
    group = state.group_for(compression)
    world = dist.get_world_size(group)
    if buffer.is_sparse:
        # nn.Embedding(sparse=True)'s bucket: a sparse all_reduce gathers
        # every rank's entries and sums them locally, so nothing is summed on
        # the wire to compress; the entries travel as they are.
        buffer.div_(world)
        work = dist.all_reduce(buffer, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    if buffer.dtype != torch.float32:
        raise ValueError(
            f"smdccl.ddp.{compression}_wire_hook: the bucket is {buffer.dtype}; the hooks "
            "take float32 gradients (a 16-bit bucket already crosses the wire in 16 bits; for "
            "int8, make DDP's group with pg_options={'compression': 'int8'}, which widens "
            "16-bit tensors to float32 for its sums)"
        )
    # Average like DDP does; dividing first keeps fp16's range (and smdccl
    # scales AVG before the wire anyway).
    buffer.div_(world)
    # Feedback models the wire's rounding: with no compressed hop there is
    # none, and rounding here would add error plain DDP does not have.
    keyed = None
    if state.error_feedback and state.compresses(compression):
        if compression == "int8":  # the backend keeps both quantizations' residuals
            keyed = state.backend_for(compression)
            keyed._int8_feedback_next(state.int8_key(bucket))
        else:
            state.apply_error_feedback(state.bucket_key(bucket), buffer, _WIRE_DTYPES[compression])
    try:
        work = dist.all_reduce(buffer, group=group, async_op=True)
    finally:
        if keyed is not None:  # taken by the call, or never reached it (as smdccl.fsdp)
            keyed._int8_feedback_next(-1)
    return work.get_future().then(lambda fut: fut.value()[0])


def fp16_wire_hook(state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Allreduce the bucket's float32 average with fp16 values on the wire."""
    return _compress_hook("fp16", state, bucket)


def bf16_wire_hook(state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Allreduce the bucket's float32 average with bf16 values on the wire."""
    return _compress_hook("bf16", state, bucket)


def int8_wire_hook(state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Allreduce the bucket's float32 average with block-wise int8 between
    nodes (quantized once per level, float32 sums; docs/compression.md)."""
    return _compress_hook("int8", state, bucket)


# The earlier names, kept for code that imports them. DDP looks at a hook's
# __name__: one named "bf16_compress_hook" (torch's own) must have CUDA and
# NCCL, so a CPU build of torch refused smdccl's under that name. These
# aliases carry the functions' own names, which torch does not look for.
fp16_compress_hook = fp16_wire_hook
bf16_compress_hook = bf16_wire_hook
