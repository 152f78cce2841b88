"""Command line: parse the options, then check, open, sweep, report.

Order of events (every rank runs it; only rank 0 prints):
1. parse and validate the options (no torch.distributed yet, so ``--help``
   works without torchrun);
2. start the gloo default group (the control plane) and open one group per
   requested backend, skipping the ones that cannot be opened, or stopping
   with exit code 2 if such a backend was named in ``--backends``;
3. sweep passes x collectives x sizes x backends (:mod:`~smdccl.bench.sweep`);
4. print the table, write ``--json`` and ``--plot``;
5. exit 1 if any #wrong > 0, else 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import TYPE_CHECKING, Callable

from smdccl._launch import RankZeroParser
from smdccl.bench import choices
from smdccl.bench.sizes import geometric, parse_size, parse_size_list

if TYPE_CHECKING:  # torch is imported only after the options are parsed
    from smdccl.bench.backends import World

EPILOG = """\
examples:
  torchrun --nproc-per-node 2 -m smdccl.bench
  torchrun --nproc-per-node 4 -m smdccl.bench --backends smdccl,gloo --max-bytes 1M
  torchrun --nproc-per-node 4 -m smdccl.bench --backends smdccl,smdccl+fp16,gloo
  torchrun --nproc-per-node 2 -m smdccl.bench --collectives allreduce --sizes 4K,1M,64M \\
      --dtype bfloat16 --op max --json out.json --plot out.png
  torchrun --nproc-per-node 2 -m smdccl.bench --device cuda --backends smdccl,nccl
  torchrun --nproc-per-node 4 -m smdccl.bench --device cuda --nccl-ranks-as-hosts \\
      --backends nccl,smdccl,smdccl+fp16,gloo

Sizes, counts and busbw follow nccl-tests (doc/PERFORMANCE.md); see
`pydoc smdccl.bench.collectives` and `pydoc smdccl.bench.sweep` for the
definitions and the timing method. Exit code: 0 ok, 1 some #wrong > 0,
2 usage error or a requested backend unavailable, 3 a backend's teardown
did not return within 60 s (the results were written; the rank exits anyway).
"""


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sizes(text: str) -> list[int]:
    try:
        return parse_size_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _add_what_options(p: argparse.ArgumentParser) -> None:
    """The "what to measure" group: backends, collectives, dtype, op, algorithms, device."""
    what = p.add_argument_group("what to measure")
    what.add_argument("--backends", type=_names, default=None, metavar="LIST",
                      help="comma list (default: smdccl,gloo, plus nccl with --device cuda "
                           "and >= 2 GPUs; smdccl+fp16 / smdccl+bf16: 16-bit wire between "
                           "nodes, smdccl+int8: block int8 allreduce between "
                           "nodes); a backend named here that cannot be opened is "
                           "an error, a default one is skipped with a message")
    what.add_argument("--collectives", type=_names, default=list(choices.DEFAULT_COLLECTIVES),
                      metavar="LIST", help="comma list out of %s (default: all but reduce)"
                      % ",".join(choices.COLLECTIVES))
    what.add_argument("--dtype", choices=choices.DTYPES, default="float32",
                      help="element type (default: float32)")
    what.add_argument("--op", choices=choices.OPS, default="sum",
                      help="reduction for allreduce and reduce_scatter (default: sum)")
    what.add_argument("--algos", type=_names, default=None, metavar="LIST",
                      help="measure every smdccl backend once per algorithm, forced with "
                           "SMDCCL_ALGO (e.g. ring,rd,halving,tree,auto), with the cost model's "
                           "estimate beside each time")
    what.add_argument("--env-variants", default=None, metavar="SMDCCL_NAME=V1,V2,...",
                      help="measure every smdccl backend once per value of that variable, set "
                           "while its group is made and connects (e.g. "
                           "SMDCCL_SHM_COPY=plain,auto): a setting's A/B in one run, measured "
                           "in turn at each size; a backend may also be named so, "
                           "smdccl[SMDCCL_SHM_COPY=plain]")
    what.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="tensor device; cuda uses cuda:(LOCAL_RANK %% device count) "
                           "(default: cpu)")
    what.add_argument("--nccl-ranks-as-hosts", action="store_true",
                      help="with --device cuda: give every rank its own NCCL_HOSTID, so NCCL "
                           "takes each rank for a host and joins them with its socket "
                           "transport, as between nodes (and lets ranks share a GPU); sets "
                           "NCCL_IB_DISABLE=1 and NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo when all ranks are local, and "
                           "SMDCCL_TOPOLOGY=1,1,... unless they are set; nccl is then "
                           "measured by default")


def build_parser() -> argparse.ArgumentParser:
    p = RankZeroParser(
        prog="smdccl.bench",
        usage="torchrun --nproc-per-node N -m smdccl.bench [options]",
        description="nccl-tests-style collective benchmark: smdccl vs gloo vs nccl, "
                    "all measured in one run.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_what_options(p)

    size = p.add_argument_group("sizes (bytes; K/M/G suffixes are powers of 1024)")
    size.add_argument("--min-bytes", type=_size, default=parse_size("4K"), metavar="N",
                      help="smallest size (default: 4K)")
    size.add_argument("--max-bytes", type=_size, default=parse_size("64M"), metavar="N",
                      help="largest size (default: 64M)")
    size.add_argument("--step-factor", type=int, default=4, metavar="F",
                      help="multiply the size by F at each step (default: 4)")
    size.add_argument("--sizes", type=_sizes, default=None, metavar="LIST",
                      help="explicit comma list, e.g. 4K,1M,64M (overrides min/max/step)")

    timing = p.add_argument_group("timing")
    timing.add_argument("--iters", type=int, default=None, metavar="N",
                        help="timed calls per size and pass (default: adaptive, about "
                             "--target-time per size over all passes, between 5 and 1000 a pass)")
    timing.add_argument("--warmup", type=int, default=5, metavar="N",
                        help="untimed calls per size before the timed ones (default: 5)")
    timing.add_argument("--target-time", type=float, default=0.3, metavar="S",
                        help="seconds per size and backend, all passes together, aimed at by "
                             "the adaptive --iters (default: 0.3)")
    timing.add_argument("--passes", type=int, default=3, metavar="N",
                        help="sweep every size N times, the backends in turn at each size; a "
                             "size's time is the median over passes, so a few seconds when a "
                             "shared machine runs slow do not become the table (default: 3)")
    timing.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="process-group timeout in seconds (default: 300)")

    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write header and all rows as JSON")
    out.add_argument("--plot", metavar="FILE",
                     help="draw busbw vs size per backend (e.g. out.png; needs matplotlib)")
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar on stderr (default: only when stderr is a terminal)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [c for c in args.collectives if c not in choices.COLLECTIVES]
    if unknown:
        parser.error(f"unknown collective(s) {','.join(unknown)}; "
                     f"choose from {','.join(choices.COLLECTIVES)}")
    if not args.collectives:
        parser.error("--collectives is empty")
    if args.backends is not None and not args.backends:
        parser.error("--backends is empty")
    if args.backends is not None and len(set(args.backends)) != len(args.backends):
        parser.error("--backends lists a backend twice")
    if args.op == "avg" and args.dtype not in choices.FLOAT_DTYPES:
        parser.error("--op avg needs a floating-point --dtype")
    if args.iters is not None and args.iters < 1:
        parser.error("--iters must be >= 1")
    if args.nccl_ranks_as_hosts and args.device != "cuda":
        parser.error("--nccl-ranks-as-hosts needs --device cuda (NCCL runs on CUDA tensors)")
    if args.passes < 1:
        parser.error("--passes must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.target_time <= 0:
        parser.error("--target-time must be > 0")
    if args.sizes is not None:
        if not args.sizes:
            parser.error("--sizes is empty")
        args.size_list = args.sizes
    else:
        try:
            args.size_list = geometric(args.min_bytes, args.max_bytes, args.step_factor)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def _quiet_deprecations() -> None:
    # torch 2.14 deprecates these two names; they are still the documented
    # c10d calls the benchmark measures, so the warning is only noise here.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)`",
        category=FutureWarning)


def _open_groups(args: argparse.Namespace, world: World, local_ranks: int, groups: dict,
                 say: Callable[[str], None]) -> dict | None:
    """Opens one group per backend to measure into ``groups`` (the caller
    closes them, also those opened before a failure). Returns the skipped
    backends with their reasons, or None when the run must exit with code 2."""
    from smdccl.bench.backends import default_backends, open_group, with_algos, with_env_variants

    explicit = args.backends is not None
    names = args.backends if explicit else default_backends(
        args.device, local_ranks, args.nccl_ranks_as_hosts)
    if args.algos:
        from smdccl import _C

        known = [a for a, _ in _C.algorithms()] + ["auto"]
        bad = [a for a in args.algos if a not in known]
        if bad:
            say(f"unknown algorithm(s) {','.join(bad)}; registered: {','.join(known)}")
            return None
        names = with_algos(names, args.algos)
        explicit = True  # a forced algorithm that cannot open is an error, not a skip
    if args.env_variants:
        var, eq, values = args.env_variants.partition("=")
        if not var.startswith("SMDCCL_") or not eq or not values:
            say(f"--env-variants {args.env_variants!r}: write SMDCCL_NAME=value1,value2")
            return None
        names = with_env_variants(names, args.env_variants)
        explicit = True
    unavailable = {}
    for name in names:
        group, err = open_group(name, world, args.timeout, args.nccl_ranks_as_hosts)
        if group is None:
            unavailable[name] = err
            if explicit:
                say(f"backend {name!r} was requested but is unavailable: {err}")
                return None
            say(f"backend {name!r} unavailable, skipped: {err}")
        else:
            groups[name] = group
    if not groups:
        say("no backend could be opened")
        return None
    return unavailable


def _report(rows: list, skipped: list, measured: list[str], unavailable: dict, world: World,
            args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """Rank 0: prints the table, writes ``--json`` and ``--plot``."""
    from smdccl.bench import plot, report

    info = report.header(world, args, measured)
    info["unavailable"] = unavailable
    print(report.table(rows, skipped, measured, args.collectives,
                       report.preamble(info)), flush=True)
    if args.json:
        report.write_json(args.json, info, rows, skipped)
        say(f"wrote {args.json}")
    if args.plot:
        title = (f"{world.size} ranks, {world.device.type}, {args.dtype}"
                 f", op {args.op}")
        plot.plot(rows, args.plot, measured, args.collectives, title)
        say(f"wrote {args.plot}")


def _tear_down(groups: dict, world: World) -> None:
    """Every rank: destroys the measured groups, then the default one; a
    teardown that does not return in time ends the process with exit code 3."""
    import torch.distributed as dist

    from smdccl.bench.backends import CLOSE_LIMIT_S, close_groups

    left_open = close_groups(groups, dist.destroy_process_group)
    if left_open:
        print(f"smdccl.bench: rank {world.rank}: destroying the {left_open[0]!r} group did not "
              f"return within {CLOSE_LIMIT_S:.0f} s; exiting with "
              f"{', '.join(left_open)} still open", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(3)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _quiet_deprecations()

    from smdccl.bench import plot

    if args.plot and not plot.available():
        print(plot.MISSING, file=sys.stderr)  # before the sweep, not after
        return 2

    import torch.distributed as dist

    from smdccl.bench.backends import init_world, node_sizes, ranks_as_hosts_env, with_model

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.nccl_ranks_as_hosts:  # before any group exists: NCCL and smdccl read them at start
        os.environ.update(ranks_as_hosts_env(int(os.environ.get("RANK", "0")),
                                             int(os.environ.get("WORLD_SIZE", "1")),
                                             local_ranks, os.environ))
    from smdccl.bench.progress import progress_bar
    from smdccl.bench.sweep import sweep

    world = init_world(args.device, args.timeout)
    lead = world.rank == 0

    def say(msg: str) -> None:
        if lead:
            print(f"smdccl.bench: {msg}", file=sys.stderr, flush=True)

    groups: dict = {}
    try:
        unavailable = _open_groups(args, world, local_ranks, groups, say)
        if unavailable is None:
            return 2

        per_backend = len(args.collectives) * (args.passes * len(args.size_list) + 1)  # + warm-up
        total = len(groups) * per_backend
        bar = progress_bar(total, args.progress if lead else False)
        try:
            rows, skipped = sweep(groups, world, args, bar.update)
        finally:
            bar.close()

        if args.algos:
            with_model(rows, node_sizes(groups, world))
        if lead:
            _report(rows, skipped, list(groups), unavailable, world, args, say)
        dist.barrier(group=world.ctrl)  # every rank tears its groups down at once
        return 1 if any(r["wrong"] for r in rows) else 0
    finally:
        _tear_down(groups, world)
