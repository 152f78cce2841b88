"""DDP benchmark: step time, compute/communication overlap, compression.

    torchrun --nproc-per-node 4 -m smdccl.bench.ddp [--configs gloo,smdccl,...] [--json F]
    python -m smdccl.cluster --nodes 2 --procs-per-node 2 --link 1gbit -- -m smdccl.bench.ddp

Trains the transformer of :mod:`smdccl.bench.ddp_model` with DDP once per
configuration, all in the same processes, from the same initial weights on
the same per-rank batches:

- ``gloo``: DDP on a gloo group (DDP's built-in allreduce);
- ``smdccl``: DDP on an smdccl group (DDP's built-in allreduce);
- ``smdccl+fp16`` / ``smdccl+bf16``: DDP on an smdccl group with
  ``smdccl.ddp.fp16_wire_hook`` / ``bf16_wire_hook`` and a
  ``CompressionState()`` (16-bit values between nodes, float32 sums);
- ``smdccl+int8``: ``smdccl.ddp.int8_wire_hook`` with
  ``CompressionState(error_feedback=True)`` (block int8 between nodes,
  float32 sums).

Per configuration (every time is a per-rank median, then the max over ranks):

- ``step``: one training step (forward, backward with DDP's overlapped
  bucket allreduces, optimizer step);
- ``compute``: the same steps of the same model without DDP, no communication,
  all ranks computing at once (so the CPU sharing is the same), measured right
  before each configuration;
- ``comm``: the buckets DDP used (sizes recorded from a DDP of the same model
  and ``--bucket-cap-mb``), all-reduced back to back with no compute, through
  the same path (``dist.all_reduce`` on the group; the hook for compressed
  configurations), all launched asynchronously then waited, like DDP;
- ``hidden``: the share of communication hidden behind backward,
  (compute + comm - step) / comm clamped to [0, 1];
- bytes: S = float32 gradient bytes per step (sum of the buckets); inter-node
  bytes per uplink and direction per step, from the algorithm, with p ranks
  on n nodes (ranks node-contiguous): gloo's ring over all ranks crosses each
  node boundary with 2(p-1)/p * S; smdccl's two-level allreduce sends
  2(n-1)/n * S per uplink, times 1/2 with fp16/bf16 and 1.03/4 with int8 on
  the wire (0 on one node);
- the final loss (last step, mean over ranks) and whether all configurations
  reach similar losses (within --loss-rtol of the first one).

The default group is gloo and only serves as the control plane (timings, the
loss), like in :mod:`smdccl.bench`.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import re
import socket
import statistics
import sys
import time

from smdccl._launch import RankZeroParser

CONFIGS = ("gloo", "smdccl", "smdccl+fp16", "smdccl+bf16", "smdccl+int8")

EPILOG = """\
examples:
  torchrun --nproc-per-node 4 -m smdccl.bench.ddp                 # all four configurations
  SMDCCL_TOPOLOGY=2x2 torchrun --nproc-per-node 4 -m smdccl.bench.ddp --json out.json
  python -m smdccl.cluster --nodes 2 --procs-per-node 2 --link 1gbit -- \\
      -m smdccl.bench.ddp --json /tmp/ddp.json
  torchrun --nproc-per-node 2 -m smdccl.bench.ddp --model tiny --steps 5 --warmup 2

Definitions: `pydoc smdccl.bench.ddp`. Exit code: 0 ok, 1 the final losses
differ by more than --loss-rtol, 2 usage error or a configuration unavailable.
"""


def build_parser() -> argparse.ArgumentParser:
    p = RankZeroParser(
        prog="smdccl.bench.ddp",
        usage="torchrun --nproc-per-node N -m smdccl.bench.ddp [options]",
        description="DDP training benchmark: step time, compute, communication, "
                    "overlap and wire bytes for gloo, smdccl and smdccl with fp16/bf16 "
                    "compression hooks, all in one run.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(CONFIGS), metavar="LIST",
                   help="comma list out of %s (default: all)" % ",".join(CONFIGS))
    p.add_argument("--model", choices=("small", "tiny"), default="small",
                   help="small: ~4.2M-parameter transformer; tiny: ~0.1M, for tests "
                        "(default: small)")
    p.add_argument("--steps", type=int, default=30, metavar="N",
                   help="timed training steps per configuration (default: 30)")
    p.add_argument("--warmup", type=int, default=5, metavar="N",
                   help="untimed steps before them (default: 5)")
    p.add_argument("--comm-iters", type=int, default=10, metavar="N",
                   help="timed rounds of the communication-only measurement (default: 10)")
    p.add_argument("--bucket-cap-mb", type=float, default=4.0, metavar="MB",
                   help="DDP bucket_cap_mb (default: 4)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default: 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="weights and data seed (default: 0)")
    p.add_argument("--loss-rtol", type=float, default=0.05, metavar="R",
                   help="final losses must agree within this relative tolerance (default: 0.05)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="process-group timeout in seconds (default: 300)")
    p.add_argument("--json", metavar="FILE", help="write the header and rows as JSON")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.config_list = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.config_list if c not in CONFIGS]
    if bad or not args.config_list:
        parser.error(f"--configs: unknown {','.join(bad) or '(empty)'}; choose from {','.join(CONFIGS)}")
    if len(set(args.config_list)) != len(args.config_list):
        parser.error("--configs lists a configuration twice")
    if args.steps < 1 or args.warmup < 0 or args.comm_iters < 1:
        parser.error("--steps and --comm-iters must be >= 1, --warmup >= 0")
    return args


# ---------------------------------------------------------------------------


class _Bucket:
    """Enough of ``dist.GradBucket`` for the comm hooks (buffer, index, and
    parameters: none, so error feedback keys it by its index and size)."""

    def __init__(self, buffer, index: int):
        self._buffer, self._index = buffer, index

    def buffer(self):
        return self._buffer

    def index(self) -> int:
        return self._index

    def parameters(self) -> list:
        return []

    def is_last(self) -> bool:  # pragma: no cover - unused by the hooks
        return False


def _max_over_ranks(value: float, ctrl) -> float:
    import torch
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
    return t.item()


def _mean_over_ranks(value: float, ctrl) -> float:
    import torch
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, group=ctrl)
    return t.item() / dist.get_world_size()


def _train(model, opt, data, rank, steps, warmup):
    """(per-step seconds of the timed steps, per-step losses of all steps)."""
    from smdccl.bench.ddp_model import loss_fn
    times, losses = [], []
    for step in range(warmup + steps):
        x, y = data.batch(rank, step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step >= warmup:
            times.append(dt)
        losses.append(loss.item())
    return times, losses


def _bucket_sizes(base, group, args) -> list[int]:
    """Element counts of the buckets DDP hands to its hook, after the rebuild."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from smdccl.bench.ddp_model import loss_fn

    seen: list[list[int]] = []

    def record(state, bucket):
        if bucket.index() == 0:
            seen.append([])
        seen[-1].append(bucket.buffer().numel())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())  # the sizes are all we want: no allreduce
        return fut

    ddp = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
    ddp.register_comm_hook(None, record)
    from smdccl.bench.ddp_model import Data, Spec
    data = Data(Spec.named(args.model), args.seed)
    for step in range(3):  # DDP rebuilds its buckets after the first iteration
        x, y = data.batch(0, step)
        loss_fn(ddp(x), y).backward()
    return seen[-1]


def _comm_time(config, group, state, sizes, iters, ctrl) -> float:
    """Median seconds to all-reduce all the buckets back to back (per rank)."""
    import torch
    import torch.distributed as dist
    from smdccl import ddp as sddp

    g = torch.Generator().manual_seed(1234 + dist.get_rank())
    sources = [torch.randn(n, generator=g) * 1e-3 for n in sizes]
    buffers = [s.clone() for s in sources]
    hook = {"smdccl+fp16": sddp.fp16_wire_hook, "smdccl+bf16": sddp.bf16_wire_hook,
            "smdccl+int8": sddp.int8_wire_hook}.get(config)
    times = []
    for it in range(iters + 2):  # 2 untimed rounds
        for b, s in zip(buffers, sources):
            b.copy_(s)
        dist.barrier(group=ctrl)
        t0 = time.perf_counter()
        if hook is None:
            works = [dist.all_reduce(b, group=group, async_op=True) for b in buffers]
            for w in works:
                w.wait()
        else:
            futs = [hook(state, _Bucket(b, i)) for i, b in enumerate(buffers)]
            for f in futs:
                f.wait()
        dt = time.perf_counter() - t0
        if it >= 2:
            times.append(dt)
    return statistics.median(times)


def _nodes(groups, ctrl) -> tuple[int, str]:
    """(node count, where it came from): an smdccl group's topology, else hostnames."""
    import torch
    from smdccl._objects import all_gather_object
    for name, g in groups.items():
        if name.startswith("smdccl"):
            topo = str(g._get_backend(torch.device("cpu")).topology)
            m = re.match(r"\s*(\d+) nodes?", topo)
            if m:
                return int(m.group(1)), f"smdccl topology '{topo}'"
    hosts = all_gather_object(socket.gethostname(), group=ctrl)
    return len(set(hosts)), "distinct hostnames"


def wire_bytes(config: str, grad_bytes: int, p: int, n: int) -> float:
    """Inter-node bytes per uplink and direction per step (see the module doc)."""
    if n <= 1:
        return 0.0
    if config == "gloo":
        return 2 * (p - 1) / p * grad_bytes
    scale = {"smdccl+int8": 1.03125 / 4}.get(config, 0.5 if "+" in config else 1.0)
    return 2 * (n - 1) / n * grad_bytes * scale


FORMULA = ("S = float32 gradient bytes per step; inter-node bytes per uplink per step: "
           "gloo 2(p-1)/p*S (ring over all ranks), smdccl 2(n-1)/n*S (two-level), "
           "smdccl+fp16/bf16 2(n-1)/n*S/2, smdccl+int8 2(n-1)/n*S*1.03/4; p ranks, n nodes")


def _table(rows, info) -> str:
    cols = (("config", "config", "{}"), ("step_ms", "step(ms)", "{:.1f}"),
            ("compute_ms", "compute(ms)", "{:.1f}"), ("comm_ms", "comm(ms)", "{:.1f}"),
            ("hidden", "hidden", "{:.2f}"), ("grad_mb", "S(MB)", "{:.2f}"),
            ("inter_mb_per_uplink", "inter(MB/uplink)", "{:.2f}"),
            ("final_loss", "final_loss", "{:.4f}"))
    cells = [[fmt.format(r[k]) for k, _, fmt in cols] for r in rows]
    heads = [h for _, h, _ in cols]
    widths = [max(len(c) for c in col) for col in zip(heads, *cells)]

    def join(vals):
        return "  ".join([vals[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(vals[1:], widths[1:])])

    out = [
        f"# smdccl.bench.ddp  {info['command_line']}",
        f"# host {info['hostname']} ({info['cpu_count']} cpus), torch {info['torch_version']}, "
        f"{info['world_size']} ranks on {info['nodes']} node(s) ({info['nodes_from']})",
        f"# model {info['model']} ({info['params'] / 1e6:.2f} M params), batch {info['batch']}x"
        f"{info['seq']} tokens per rank, AdamW lr {info['lr']}, bucket_cap_mb {info['bucket_cap_mb']}, "
        f"buckets (MB): {', '.join(f'{b / 2**20:.2f}' for b in info['bucket_bytes'])}",
        f"# warmup {info['warmup']}, steps {info['steps']}, comm rounds {info['comm_iters']}; "
        "times: per-rank median, max over ranks",
        "# hidden = clamp((compute + comm - step) / comm, 0, 1)",
        f"# {FORMULA}",
        "#",
        "#  " + join(heads),
    ]
    out += ["   " + join(c) for c in cells]
    return "\n".join(out)


def _open_groups(args, world, say) -> dict | None:
    """The groups DDP runs on, by base backend ("gloo", "smdccl"); None when
    a configuration is unavailable (exit code 2)."""
    from smdccl.bench.backends import open_group

    groups = {}
    for name in args.config_list:
        # the compressed configurations run DDP on a plain smdccl group;
        # the hook makes the compressed group itself (CompressionState)
        base_name = "gloo" if name == "gloo" else "smdccl"
        if base_name not in groups:
            group, err = open_group(base_name, world, args.timeout)
            if group is None:
                say(f"{name!r} is unavailable: {err}")
                return None
            groups[base_name] = group
    return groups


def _compute_time(base, data, world, args) -> float:
    """Seconds per step of the same training without DDP, all ranks at once."""
    import torch
    import torch.distributed as dist

    dist.barrier(group=world.ctrl)
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    times, _ = _train(model, opt, data, world.rank, args.steps, args.warmup)
    return _max_over_ranks(statistics.median(times), world.ctrl)


def _ddp(name: str, group, base, args):
    """(DDP of a copy of `base` on `group`, the hook's CompressionState or
    None): the compressed configurations register their wire hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from smdccl import ddp as sddp
    from smdccl.ddp import CompressionState

    ddp = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
    state = None
    if "+" in name:
        wire = name.split("+")[1]
        state = CompressionState(process_group=group, error_feedback=wire == "int8")
        ddp.register_comm_hook(state, getattr(sddp, f"{wire}_wire_hook"))
    return ddp, state


def _compression(state) -> str | None:
    """The compression of the group the hook made (None without a hook)."""
    import torch

    if state is None or not state._groups:
        return None
    g = next(iter(state._groups.values()))
    return str(g._get_backend(torch.device("cpu")).compression)


def _measure_configs(groups, base, data, sizes, nodes: int, world, args, say) -> list[dict]:
    """One row per configuration (the columns: see the module doc)."""
    import torch
    import torch.distributed as dist

    grad_bytes = 4 * sum(sizes)
    rows = []
    for name in args.config_list:
        group = groups["gloo" if name == "gloo" else "smdccl"]
        # compute only, right before this configuration (the machine state
        # drifts over a run): the same steps, no DDP, all ranks at once
        say(f"measuring compute before {name} (no communication)")
        compute = _compute_time(base, data, world, args)
        say(f"training {name}")
        dist.barrier(group=world.ctrl)
        ddp, state = _ddp(name, group, base, args)
        opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
        times, losses = _train(ddp, opt, data, world.rank, args.steps, args.warmup)
        step = _max_over_ranks(statistics.median(times), world.ctrl)
        curve = [_mean_over_ranks(v, world.ctrl) for v in losses]

        say(f"measuring {name} communication only")
        # with a hook, through the hook's own groups, already created by DDP
        comm = _max_over_ranks(
            _comm_time(name, group, state, sizes, args.comm_iters, world.ctrl), world.ctrl)
        hidden = min(1.0, max(0.0, (compute + comm - step) / comm)) if comm > 0 else 0.0
        wire = wire_bytes(name, grad_bytes, world.size, nodes)
        rows.append(dict(
            config=name, step_ms=step * 1e3, compute_ms=compute * 1e3, comm_ms=comm * 1e3,
            hidden=hidden, grad_bytes=grad_bytes, grad_mb=grad_bytes / 1e6,
            inter_bytes_per_uplink=wire, inter_mb_per_uplink=wire / 1e6,
            final_loss=curve[-1], first_loss=curve[0], loss_curve=curve,
            group_compression=_compression(state)))
        del ddp, opt
    return rows


def _header(args, world, spec, params: int, sizes, nodes: int, nodes_from: str) -> dict:
    """The run's description for the table and the JSON (the loss check is
    added by the caller)."""
    import torch

    from smdccl._launch import command_line

    return dict(
        hostname=socket.gethostname(), cpu_count=os.cpu_count(),
        cpu_model=_cpu_model(), platform=platform.platform(),
        python=platform.python_version(), torch_version=torch.__version__,
        smdccl_version=getattr(sys.modules.get("smdccl"), "__version__", None),
        world_size=world.size, nodes=nodes, nodes_from=nodes_from,
        smdccl_topology_env=os.environ.get("SMDCCL_TOPOLOGY"),
        model=args.model, params=params, batch=spec.batch, seq=spec.seq,
        lr=args.lr, seed=args.seed, bucket_cap_mb=args.bucket_cap_mb,
        bucket_bytes=[4 * n for n in sizes], warmup=args.warmup, steps=args.steps,
        comm_iters=args.comm_iters, configs=args.config_list, formula=FORMULA,
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command_line=command_line("smdccl.bench.ddp"), argv=list(sys.argv))


def _report(rows, info, args, say) -> None:
    """Rank 0: prints the table and the loss check, writes ``--json``."""
    spread, similar = info["loss_spread_rel"], info["losses_similar"]
    text = _table(rows, info)
    text += (f"\n# final losses (start {rows[0]['first_loss']:.4f}): "
             + ", ".join(f"{r['config']} {r['final_loss']:.4f}" for r in rows)
             + f"; max relative difference to {rows[0]['config']} {spread:.2e} "
             + ("<= " if similar else "> ") + f"{args.loss_rtol}: "
             + ("similar" if similar else "NOT SIMILAR"))
    print(text, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": info, "rows": rows}, f, indent=1)
            f.write("\n")
        say(f"wrote {args.json}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")

    import torch.distributed as dist

    from smdccl.bench.backends import init_world
    from smdccl.bench.ddp_model import Data, Spec, build, num_params

    world = init_world("cpu", args.timeout)
    lead = world.rank == 0

    def say(msg):
        if lead:
            print(f"smdccl.bench.ddp: {msg}", file=sys.stderr, flush=True)

    try:
        groups = _open_groups(args, world, say)
        if groups is None:
            return 2
        nodes, nodes_from = _nodes(groups, world.ctrl)

        spec = Spec.named(args.model)
        data = Data(spec, args.seed)
        base = build(spec, args.seed)
        sizes = _bucket_sizes(base, next(iter(groups.values())), args)
        rows = _measure_configs(groups, base, data, sizes, nodes, world, args, say)

        first = rows[0]["final_loss"]
        spread = max(abs(r["final_loss"] - first) / abs(first) for r in rows)
        similar = spread <= args.loss_rtol
        if lead:
            info = _header(args, world, spec, num_params(base), sizes, nodes, nodes_from)
            info.update(loss_spread_rel=spread, loss_rtol=args.loss_rtol, losses_similar=similar)
            _report(rows, info, args, say)
        return 1 if (lead and not similar) else 0  # rank 0 only: see smdccl.bench.accuracy
    finally:
        dist.destroy_process_group()


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


if __name__ == "__main__":
    sys.exit(main())
