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

import contextlib
import os
import threading
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from smdccl._launch import standalone_env
from smdccl._objects import all_gather_object


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


def nccl_unavailable(device_kind: str, local_ranks: int, gpus: int,
                     ranks_as_hosts: bool = False) -> str | None:
    """Why nccl cannot run here, or None. NCCL needs CUDA tensors and a GPU of
    its own for each rank of a machine ("Duplicate GPU detected" otherwise),
    where gloo and smdccl let ranks share one; with ``--nccl-ranks-as-hosts``
    every rank is a host of its own to NCCL, and one GPU serves them all."""
    if device_kind != "cuda":
        return "nccl only runs on CUDA tensors: use --device cuda"
    if gpus < 1:
        return "nccl needs a GPU and torch sees none"
    if local_ranks > gpus and not ranks_as_hosts:
        return (f"nccl needs one GPU per rank: {local_ranks} ranks share {gpus} GPU(s) on this "
                "machine (NCCL refuses two ranks on one GPU; smdccl and gloo do not; "
                "--nccl-ranks-as-hosts makes every rank a host of its own to NCCL)")
    return None


def default_backends(device_kind: str, local_ranks: int = 1,
                     ranks_as_hosts: bool = False) -> list[str]:
    """smdccl and gloo; nccl too when it can run (CUDA tensors, a GPU per rank and
    >= 2 GPUs, or any GPU with ``--nccl-ranks-as-hosts``)."""
    names = ["smdccl", "gloo"]
    gpus = torch.cuda.device_count() if device_kind == "cuda" else 0
    if (gpus >= 2 or ranks_as_hosts) and \
            nccl_unavailable(device_kind, local_ranks, gpus, ranks_as_hosts) is None:
        names.append("nccl")
    return names


def ranks_as_hosts_env(rank: int, world_size: int, local_ranks: int, environ) -> dict:
    """What ``--nccl-ranks-as-hosts`` sets on one rank before any group starts.

    * ``NCCL_HOSTID``, a value of its own: NCCL takes its host identity from it,
      so it treats every rank as a host and joins them through its socket
      transport, as between nodes on Ethernet (the case smdccl is for), and
      ranks sharing a GPU are no longer "duplicate GPUs";
    * ``NCCL_IB_DISABLE=1`` and ``NCCL_NET=Socket`` unless set: NCCL's
      socket transport, as smdccl's TCP links; an InfiniBand or RoCE card,
      visible in every network namespace, or a network plugin would let
      NCCL go around the link the ranks share (and around a shaping of it);
    * ``NCCL_SOCKET_IFNAME=lo`` where every rank is on this machine and the
      variable is unset (the interface the "hosts" share);
    * ``SMDCCL_TOPOLOGY`` = one rank per node (``1,1,...``) unless set, so that
      smdccl too crosses a "network" between every pair of ranks; set it
      (e.g. ``2x2``) to put smdccl's two-level layout beside NCCL's hosts.
    """
    env = {"NCCL_HOSTID": f"smdccl-bench-rank{rank}"}
    wanted = [("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "Socket")]
    if local_ranks == world_size:
        wanted.append(("NCCL_SOCKET_IFNAME", "lo"))
    env.update({name: value for name, value in wanted if not environ.get(name)})
    if not environ.get("SMDCCL_TOPOLOGY"):
        env["SMDCCL_TOPOLOGY"] = ",".join(["1"] * world_size)
    return env


def _local_ranks() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def first_error(world: World, err: str | None) -> str | None:
    """Every rank's error for one step, reduced to the first one (or None)."""
    errors = all_gather_object(err, group=world.ctrl)
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


@contextlib.contextmanager
def env_during(values: dict[str, str]):
    """These environment variables set for a while, then as they were."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def forced_algo(algo: str):
    """``SMDCCL_ALGO=algo`` for a while ("": as it is)."""
    return env_during({"SMDCCL_ALGO": algo} if algo else {})


def family(name: str) -> str:
    """The backend a bench name opens: ``smdccl+fp16@ring[SMDCCL_X=v]`` -> ``smdccl``."""
    return name.partition("[")[0].partition("@")[0].partition("+")[0]


def split_env(name: str) -> tuple[str, dict[str, str], str | None]:
    """``smdccl[SMDCCL_X=v]`` -> ("smdccl", {"SMDCCL_X": "v"}, None); a name
    without brackets has no variables; the error says what is wrong."""
    if not name.endswith("]"):
        return name, {}, None
    base, _, setting = name[:-1].partition("[")
    var, eq, value = setting.partition("=")
    if not base or not eq or not var.startswith("SMDCCL_") or not value:
        return base, {}, f"{name}: write an smdccl variable as <backend>[SMDCCL_NAME=value]"
    if family(base) != "smdccl":
        return base, {}, f"{name}: only smdccl takes an SMDCCL_ variable"
    return base, {var: value}, None


def open_group(name: str, world: World, timeout_s: float, ranks_as_hosts: bool = False):
    """(group, None) when ``name`` works on every rank, else (None, reason).

    ``smdccl+fp16`` / ``smdccl+bf16`` / ``smdccl+int8``: an smdccl group
    with that compression (16-bit values, or block int8 for allreduce, on
    the wire between nodes; float32 sums). ``@<algo>``
    after an smdccl name (``smdccl@tree``, ``smdccl+fp16@halving``): the
    group runs with ``SMDCCL_ALGO=<algo>``. ``[SMDCCL_NAME=value]`` last
    (``smdccl[SMDCCL_SHM_COPY=plain]``): that variable is set while the
    group is made and first used (connected)."""
    name, env, err = split_env(name)
    name, _, algo = name.partition("@")
    base, _, wire = name.partition("+")
    options = None
    if algo and base != "smdccl":
        err = f"{name}@{algo}: only smdccl takes a forced algorithm"
    if wire:
        if base != "smdccl" or wire not in ("fp16", "bf16", "int8"):
            err = f"unknown backend {name!r} (compressed forms: smdccl+fp16, smdccl+bf16, smdccl+int8)"
        options = {"compression": wire}
    if err is None and base == "smdccl":
        try:
            import smdccl  # noqa: F401 - registers the "smdccl" backend
        except Exception as exc:  # ImportError, or an OSError loading _C
            err = f"cannot import smdccl ({describe(exc)})"
    elif base == "nccl":
        err = err or nccl_unavailable(world.device.type, _local_ranks(),
                               torch.cuda.device_count() if world.device.type == "cuda" else 0,
                               ranks_as_hosts)
    if (err := first_error(world, err)) is not None:
        return None, err

    # smdccl reads SMDCCL_ALGO when the group is made, the transport's
    # settings when it connects.
    with env_during(env), forced_algo(algo):
        return _made_and_probed(base, options, world, timeout_s)


def _made_and_probed(base: str, options, world: World, timeout_s: float):
    """(group, None) once a tiny all_reduce worked on every rank, else (None, reason)."""
    group, err = None, None
    try:
        group = dist.new_group(backend=base, timeout=timedelta(seconds=timeout_s),
                               pg_options=options)
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


CLOSE_LIMIT_S = 60.0


def close_groups(groups: dict, destroy, limit_s: float = CLOSE_LIMIT_S) -> list[str]:
    """Destroys each measured group in turn (``destroy(group)``, all ranks in
    the same order), each under ``limit_s`` seconds; returns the names of the
    groups left open: the one whose destruction did not return in time and
    those after it. The results are written by then: a backend that hangs in
    its teardown (seen once with nccl's socket transport) must not hold the
    run forever."""
    names = list(groups)
    for i, name in enumerate(names):
        done = threading.Event()

        def run(group=groups[name], done=done):
            try:
                destroy(group)
            finally:
                done.set()

        threading.Thread(target=run, name=f"close-{name}", daemon=True).start()
        if not done.wait(limit_s):
            return names[i:]
    return []


def with_algos(names: list[str], algos: list[str] | None) -> list[str]:
    """``--algos``: every smdccl backend once per algorithm (``smdccl@ring``,
    ``smdccl@auto``, ...), other backends as they are."""
    if not algos:
        return names
    out = []
    for name in names:
        if name.partition("+")[0] == "smdccl" and "@" not in name:
            out.extend(f"{name}@{a}" for a in algos)
        else:
            out.append(name)
    return out


def with_env_variants(names: list[str], spec: str | None) -> list[str]:
    """``--env-variants SMDCCL_X=a,b``: every smdccl backend once per value
    (``smdccl[SMDCCL_X=a]``, ``smdccl[SMDCCL_X=b]``), other backends as they are."""
    if not spec:
        return names
    var, _, values = spec.partition("=")
    out = []
    for name in names:
        if family(name) == "smdccl" and not name.endswith("]"):
            out.extend(f"{name}[{var}={v}]" for v in values.split(",") if v)
        else:
            out.append(name)
    return out


def model_estimate(backend: str, collective: str, nbytes: int, nodes: list[int]) -> tuple[str, float] | None:
    """(algorithm, seconds) the cost model gives an ``smdccl[+wire]@algo``
    backend's ``collective`` of ``nbytes`` on nodes of these sizes: the
    forced algorithm (or what runs where it cannot), or the model's own
    pick for ``@auto``. None for other backends and collectives."""
    name, _, algo = split_env(backend)[0].partition("@")
    if not algo or collective not in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        return None
    from smdccl import _C

    compression = name.partition("+")[2]  # smdccl+fp16, smdccl+int8
    ranks = sum(nodes)
    with forced_algo(algo):
        chosen, est, _ = _C.plan(collective, nbytes, (ranks, len(nodes), max(nodes), len(set(nodes)) == 1),
                                 os.environ.get("SMDCCL_TUNE_FILE", ""), compression)
    return (chosen, est[chosen]) if chosen in est else None


def node_sizes(groups: dict, world: World) -> list[int]:
    """Ranks per node as smdccl sees this world (from any smdccl group here);
    [world size] when none is open."""
    mine = None
    for name, group in groups.items():
        if family(name) == "smdccl":
            mine = sorted(int(r) for r in group._get_backend(torch.device("cpu")).local_ranks)
            break
    gathered = all_gather_object(mine, group=world.ctrl)
    if any(g is None for g in gathered):
        return [world.size]
    nodes: list[list[int]] = []
    for ranks in gathered:
        if ranks not in nodes:
            nodes.append(ranks)
    return [len(n) for n in sorted(nodes)]


def with_model(rows: list[dict], nodes: list[int]) -> None:
    """Adds the model's algorithm and estimate to each ``@algo`` row."""
    for r in rows:
        got = model_estimate(r["backend"], r["collective"], r["size"], nodes)
        r["model_algo"] = got[0] if got else "-"
        r["model_us"] = got[1] * 1e6 if got else None
