"""Command line: parse the options, then measure, fit, write, report.

Order of events (every rank runs it; only rank 0 prints and writes):
1. parse and validate the options (no torch.distributed yet, so ``--help``
   and usage errors need no torchrun);
2. start the default group with smdccl, or use the one already started, and
   gather the node map from the backend (:mod:`~smdccl.tune.layout`);
3. every rank creates the 2-rank groups (intra-node pair, then inter-node
   pair) in the same order;
4. rank 0 times the float32 reduction while the others wait at a barrier;
5. the intra pair plays ping-pong, the others wait at a barrier; then the
   inter pair the same way (:mod:`~smdccl.tune.measure`);
6. rank 0 fits alpha and bandwidth per level (:mod:`~smdccl.tune.fit`),
   writes ``--out`` (:mod:`~smdccl.tune.profile`) and prints the summary
   (:mod:`~smdccl.tune.report`).
Exit code: 0 written, 1 a failure during the run, 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

from smdccl.bench.sizes import geometric, human, parse_size
from smdccl._launch import RankZeroParser, command_line

EPILOG = """\
what is measured:
  intra  one-way time of one message between two ranks of the same node
         (shared memory), for sizes --min-bytes .. --max-bytes;
  inter  the same between the first ranks of nodes 0 and 1 (TCP);
  reduce speed of a float32 elementwise add on one thread (bytes of one
         operand per second).
  A message's time comes from a ping-pong of dist.broadcast in a 2-rank smdccl
  group (half the median round trip; sizes swept in --passes interleaved passes).
  alpha (us) and bandwidth (GB/s, 1e9 B/s)
  are fitted to T(m) = alpha + m / bw by least squares on the relative error,
  so small sizes decide alpha and large ones the bandwidth. A level this world
  cannot measure (one node; no node with two ranks) keeps the built-in
  defaults, and the file says so.

the profile (rank 0 writes it):
  '#' comment lines (date, host, versions, topology, every measured point),
  then lines "key value" with keys intra_alpha_us, intra_gbps, inter_alpha_us,
  inter_gbps, reduce_gbps. Use it with
      export SMDCCL_TUNE_FILE=/path/to/smdccl_tune.txt
  and every smdccl group created afterwards picks its algorithms with it.

examples:
  torchrun --nproc-per-node 4 -m smdccl.tune --out smdccl_tune.txt
  SMDCCL_TOPOLOGY=2x2 torchrun --nproc-per-node 4 -m smdccl.tune   # 2 virtual nodes
  torchrun --nnodes 2 --nproc-per-node 8 ... -m smdccl.tune --max-bytes 64M

Exit code: 0 profile written, 1 the run failed, 2 usage error.
"""

#: how the fit is described in the profile's header
METHOD = ("T(m) = round trip / 2, median per size; fit T(m) = alpha + m / bw, "
          "least squares on the relative error")

#: a fit missing some point by more than this suggests a busy machine
NOISY = 0.5


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = RankZeroParser(
        prog="smdccl.tune",
        usage="torchrun --nproc-per-node N -m smdccl.tune [options]",
        description="Measure smdccl's cost-model parameters (per-message latency and "
                    "bandwidth inside a node and between nodes, reduction speed) and "
                    "write them to a profile for SMDCCL_TUNE_FILE.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="smdccl_tune.txt", metavar="FILE",
                   help="profile to write (default: smdccl_tune.txt)")
    size = p.add_argument_group("message sizes (bytes; K/M/G suffixes are powers of 1024)")
    size.add_argument("--min-bytes", type=_size, default=8, metavar="N",
                      help="smallest message (default: 8)")
    size.add_argument("--max-bytes", type=_size, default=parse_size("16M"), metavar="N",
                      help="largest message, always measured (default: 16M)")
    size.add_argument("--step-factor", type=int, default=4, metavar="F",
                      help="multiply the size by F at each step (default: 4)")
    timing = p.add_argument_group("timing")
    timing.add_argument("--iters", type=int, default=50, metavar="N",
                        help="timed round trips per size; large sizes use fewer, so that a "
                             "size moves about --volume bytes, but at least 5 (default: 50)")
    timing.add_argument("--volume", type=_size, default=parse_size("32M"), metavar="N",
                        help="bytes each way per size that bound the round trips (default: 32M)")
    timing.add_argument("--passes", type=int, default=3, metavar="N",
                        help="sweep the sizes N times, each pass doing 1/N of every size's "
                             "round trips; a size's time is the median over all passes "
                             "(default: 3)")
    timing.add_argument("--quantile", type=float, default=0.5, metavar="Q",
                        help="which round trip of a size counts, as a quantile: 0.5 is the "
                             "median (default); on a machine shared with other work, e.g. "
                             "0.2 ignores most of the delays they cause")
    timing.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="untimed round trips per size and pass (default: 1)")
    timing.add_argument("--reduce-bytes", type=_size, default=parse_size("4M"), metavar="N",
                        help="operand size for the reduction timing (default: 4M)")
    timing.add_argument("--reduce-repeats", type=int, default=30, metavar="N",
                        help="timed additions, median taken (default: 30)")
    timing.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="timeout in seconds for group creation and every collective "
                             "(default: 120)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    if args.passes < 1:
        parser.error("--passes must be >= 1")
    if not 0 <= args.quantile <= 1:
        parser.error("--quantile must be between 0 and 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.reduce_repeats < 1:
        parser.error("--reduce-repeats must be >= 1")
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    try:
        sizes = geometric(args.min_bytes, args.max_bytes, args.step_factor)
    except ValueError as exc:
        parser.error(str(exc))
    if sizes[-1] != args.max_bytes:
        sizes.append(args.max_bytes)
    if len(sizes) < 2:
        parser.error("need at least two message sizes to fit alpha and bandwidth: "
                     "make --max-bytes larger than --min-bytes")
    args.sizes = sizes
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        parser.error(f"--out {args.out}: directory {out_dir} does not exist")
    if os.path.isdir(args.out):
        parser.error(f"--out {args.out} is a directory")
    return args


def _measure_level(name, pair, layout, args, say):
    """Every rank calls this; the pair plays ping-pong, the others wait."""
    from smdccl._objects import all_gather_object
    from smdccl.tune.fit import FitError, fit_alpha_beta
    from smdccl.tune.layout import pair_group
    from smdccl.tune.measure import ping_pong
    from smdccl.tune.profile import Level

    level = Level(name, pair)
    if pair is None:
        level.skipped = ("one node" if name == "inter" else "no node has two ranks")
        return level
    group = pair_group(layout, pair, args.timeout)
    say(f"timing {name}-node messages between ranks {pair[0]} and {pair[1]}, "
        f"{human(args.sizes[0])}B .. {human(args.sizes[-1])}B")
    points = None
    if layout.rank in pair:
        points = ping_pong(group, pair, args.sizes, args.warmup, args.iters, args.volume,
                           args.passes, args.quantile)
    gathered = all_gather_object(points)  # also the barrier the others wait at
    level.points = gathered[pair[0]]
    try:
        level.fit = fit_alpha_beta([p.nbytes for p in level.points],
                                   [p.seconds for p in level.points])
    except FitError as exc:
        level.skipped = f"fit failed: {exc}"
    return level


def _write_and_report(args, world, levels, reduce) -> None:
    """Rank 0: write the profile, print the summary and how to use it."""
    from smdccl.tune import profile, report

    stat = "median" if args.quantile == 0.5 else f"{args.quantile:g} quantile"
    method = METHOD.replace("median per size", f"{stat} per size over {args.passes} passes")
    info = profile.header_info(world, args.out, command_line("smdccl.tune"), method)
    profile.write(args.out, profile.render(levels, reduce, info))
    path = os.path.abspath(args.out)
    print(report.parameters(levels, reduce, info["defaults"]))
    noisy = [lv.name for lv in levels if lv.fit and lv.fit.max_rel_err > NOISY]
    if noisy:
        print(f"warning: the {' and '.join(noisy)} fit misses some sizes by more than "
              f"{NOISY:.0%} (see the points in {args.out}): other processes were probably "
              "using the CPUs; an idle machine gives steadier numbers, and --quantile 0.2 "
              "ignores most such delays")
    if world.world > 1:
        print()
        print(report.picks(world.world, len(world.nodes), world.max_local, world.uniform, path))
    print()
    print(f"wrote {path}")
    print(f"use it:  export SMDCCL_TUNE_FILE={path}")
    algo = os.environ.get("SMDCCL_ALGO", "auto") or "auto"
    if algo != "auto":
        print(f"note: SMDCCL_ALGO={algo} is set; it forces the algorithm whatever the profile says")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch.distributed as dist

    from smdccl._objects import broadcast_object
    from smdccl.tune import layout as lay
    from smdccl.tune import profile
    from smdccl.tune.measure import reduce_gbps

    try:
        world = lay.open_world(args.timeout)
    except Exception as exc:  # noqa: BLE001 - say what failed, not a traceback
        print(f"smdccl.tune: cannot start the smdccl group: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    lead = world.rank == 0

    def say(msg: str) -> None:
        if lead:
            print(f"smdccl.tune: {msg}", file=sys.stderr, flush=True)

    try:
        say(f"{world.world} ranks, {world.topology}")
        reduce = None
        if lead:
            gbps, seconds = reduce_gbps(args.reduce_bytes, args.reduce_repeats)
            reduce = profile.Reduce(args.reduce_bytes, seconds, gbps)
        dist.barrier()
        levels = [_measure_level("intra", world.intra_pair(), world, args, say),
                  _measure_level("inter", world.inter_pair(), world, args, say)]
        err = None
        if lead:
            try:
                _write_and_report(args, world, levels, reduce)
            except Exception as exc:  # noqa: BLE001 - reported below, on every rank
                err = f"{type(exc).__name__}: {exc}"
        err = broadcast_object(err, src=0)  # nobody waits for a rank 0 that failed
        if err is not None:
            say(f"failed: {err}")
            return 1
        return 0
    except Exception as exc:  # noqa: BLE001
        print(f"smdccl.tune: rank {world.rank} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        try:
            lay.close(world)
        except Exception:  # noqa: BLE001 - the run's outcome is already decided
            pass
