"""Process groups: one control group plus one group per measured backend.

The default group is always gloo and serves as the control plane (agreeing
on iteration counts, max over ranks of the timings, sums of #wrong, skip
decisions). It is not the first measured backend on purpose: it has to keep
working when a measured backend does not, and its traffic never touches the
groups being timed. Each measured backend then gets its own group from
``dist.new_group(backend=name)``, created once and swept in turn.

Opening a backend is done in three steps (import / new_group / one tiny
all_reduce, which also forces nccl's lazy communicator setup), and after each
step the ranks compare notes over the control group, so that a backend that
fails on one rank is skipped by all ranks instead of leaving the others
waiting in a rendezvous.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from smdccl._launch import standalone_env


@dataclass
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device
    ctrl: object  # the gloo control group (the default group)

    def sync(self) -> None:
        """Wait for queued device work, so a collective's time is its own."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def init_world(device_kind: str, timeout_s: float) -> World:
    """Start the default (gloo) group and pick this rank's device."""
    standalone_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("smdccl.bench: --device cuda but torch sees no CUDA device")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return World(dist.get_rank(), dist.get_world_size(), local_rank, device, dist.group.WORLD)


def default_backends(device_kind: str) -> list[str]:
    """smdccl and gloo; nccl too when it can run (CUDA tensors, >= 2 GPUs)."""
    names = ["smdccl", "gloo"]
    if device_kind == "cuda" and torch.cuda.device_count() >= 2:
        names.append("nccl")
    return names


def first_error(world: World, err: str | None) -> str | None:
    """Every rank's error for one step, reduced to the first one (or None)."""
    errors: list = [None] * world.size
    dist.all_gather_object(errors, err, group=world.ctrl)
    failed = [(rank, msg) for rank, msg in enumerate(errors) if msg is not None]
    if not failed:
        return None
    rank, msg = failed[0]
    if len(failed) == world.size and all(m == msg for _, m in failed):
        return msg  # the same everywhere: no need to say where
    return f"rank {rank}: {msg}"


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def open_group(name: str, world: World, timeout_s: float):
    """(group, None) when ``name`` works on every rank, else (None, reason).

    ``smdccl+fp16`` / ``smdccl+bf16``: an smdccl group with that compression
    (16-bit values on the wire between nodes, float32 sums)."""
    err = None
    base, _, wire = name.partition("+")
    options = None
    if wire:
        if base != "smdccl" or wire not in ("fp16", "bf16"):
            err = f"unknown backend {name!r} (compressed forms: smdccl+fp16, smdccl+bf16)"
        options = {"compression": wire}
    if err is None and base == "smdccl":
        try:
            import smdccl  # noqa: F401 - registers the "smdccl" backend
        except Exception as exc:  # ImportError, or an OSError loading _C
            err = f"cannot import smdccl ({describe(exc)})"
    elif base == "nccl" and world.device.type != "cuda":
        err = "nccl only runs on CUDA tensors: use --device cuda"
    if (err := first_error(world, err)) is not None:
        return None, err

    group = None
    try:
        group = dist.new_group(backend=base, timeout=timedelta(seconds=timeout_s), pg_options=options)
    except Exception as exc:
        err = f"cannot create the group ({describe(exc)})"
    if (err := first_error(world, err)) is not None:
        return None, err

    try:
        probe = torch.ones(1, device=world.device)
        dist.all_reduce(probe, group=group)
        world.sync()
        if probe.item() != world.size:
            err = f"probe all_reduce returned {probe.item()}, expected {world.size}"
    except Exception as exc:
        err = f"probe all_reduce failed ({describe(exc)})"
    if (err := first_error(world, err)) is not None:
        return None, err
    return group, None
