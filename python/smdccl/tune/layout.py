"""Process groups, the node map and the pairs of ranks to time.

The node map comes from the smdccl backend itself (``.local_ranks``: the
ranks sharing this rank's node, as smdccl detected them or as
``SMDCCL_TOPOLOGY`` forced them), gathered from every rank so that all ranks
know the whole map and make the same decisions.

Every ``new_group`` here is called by every rank, in the same order, with a
timeout, as torch.distributed requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from smdccl._launch import standalone_env
from smdccl._objects import all_gather_object


@dataclass
class Layout:
    rank: int
    world: int
    nodes: list[list[int]]   # global ranks per node, nodes ordered by their first rank
    topology: str            # the backend's own description, e.g. "2 nodes: [0,1] [2,3]"
    created_world: bool = False  # this module called init_process_group (and tears it down)
    groups: dict = field(default_factory=dict)

    @property
    def max_local(self) -> int:
        return max(len(n) for n in self.nodes)

    @property
    def uniform(self) -> bool:
        return len({len(n) for n in self.nodes}) == 1

    def intra_pair(self) -> tuple[int, int] | None:
        """Two ranks of the first node that has two, or None."""
        for node in self.nodes:
            if len(node) >= 2:
                return node[0], node[1]
        return None

    def inter_pair(self) -> tuple[int, int] | None:
        """The first ranks of nodes 0 and 1, or None with a single node."""
        if len(self.nodes) < 2:
            return None
        return self.nodes[0][0], self.nodes[1][0]


def _backend_of(group) -> object:
    return group._get_backend(torch.device("cpu"))


def _is_smdccl(group) -> bool:
    try:
        return hasattr(_backend_of(group), "local_ranks")
    except Exception:  # noqa: BLE001 - no CPU backend on this group
        return False


def open_world(timeout_s: float) -> Layout:
    """Start (or reuse) the default group and learn the node map.

    An existing default group is kept as it is; when its CPU backend is not
    smdccl, a whole-world smdccl group is made to ask smdccl for the map.
    """
    import smdccl  # noqa: F401 - registers the backend

    timeout = timedelta(seconds=timeout_s)
    created = False
    if not dist.is_initialized():
        standalone_env()
        dist.init_process_group(backend="smdccl", timeout=timeout)
        created = True
    default = dist.distributed_c10d._get_default_group()
    groups = {}
    if _is_smdccl(default):
        probe = default
    else:
        probe = groups["world"] = dist.new_group(backend="smdccl", timeout=timeout)
    backend = _backend_of(probe)
    mine = sorted(int(r) for r in backend.local_ranks)  # whole world: group rank == global rank
    topology = str(backend.topology)

    world = dist.get_world_size()
    gathered = all_gather_object(mine)
    nodes: list[list[int]] = []
    for ranks in gathered:
        if ranks not in nodes:
            nodes.append(ranks)
    nodes.sort(key=lambda n: n[0])
    covered = sorted(r for n in nodes for r in n)
    if covered != list(range(world)):
        raise RuntimeError(f"smdccl reported inconsistent nodes {gathered} for {world} ranks")
    return Layout(dist.get_rank(), world, nodes, topology, created, groups)


def pair_group(layout: Layout, pair: tuple[int, int], timeout_s: float):
    """A 2-rank smdccl group; every rank must call this, in the same order."""
    group = dist.new_group(list(pair), backend="smdccl", timeout=timedelta(seconds=timeout_s))
    layout.groups[pair] = group
    return group


def close(layout: Layout) -> None:
    """Destroy what this run made (all of it when it started the world)."""
    if layout.created_world:
        dist.destroy_process_group()
        return
    for group in layout.groups.values():
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)
