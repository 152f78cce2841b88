"""Python objects between ranks without numpy.

torch's ``all_gather_object`` / ``broadcast_object_list`` turn the received
bytes back into objects with ``tensor.numpy()``, so in a fresh environment
(torch does not depend on numpy) they raise "Numpy is not available". smdccl's
own tools (bench, tune) only exchange small control objects, so they use these
instead: pickle into a uint8 tensor, move it with plain collectives, read the
bytes back through the tensor's memory.
"""

from __future__ import annotations

import ctypes
import pickle

import torch
import torch.distributed as dist


def _to_tensor(obj: object) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _to_object(t: torch.Tensor, nbytes: int) -> object:
    t = t.contiguous()
    return pickle.loads(ctypes.string_at(t.data_ptr(), nbytes))


def all_gather_object(obj: object, group=None) -> list:
    """Every rank's ``obj``, in group rank order (a CPU group: gloo or smdccl)."""
    world = dist.get_world_size(group)
    mine = _to_tensor(obj)
    size = torch.tensor([mine.numel()], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: mine.numel()] = mine
    parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return [_to_object(p, int(s)) for p, s in zip(parts, sizes)]


def broadcast_object(obj: object, src: int, group=None) -> object:
    """``obj`` of global rank ``src`` on every rank of ``group``."""
    mine = _to_tensor(obj) if dist.get_rank() == src else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([mine.numel()], dtype=torch.int64)
    dist.broadcast(size, src, group=group)
    data = mine if dist.get_rank() == src else torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(data, src, group=group)
    return _to_object(data, int(size))
