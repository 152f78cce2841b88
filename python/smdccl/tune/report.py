"""What rank 0 prints: the measured parameters next to the built-in ones,
and which allreduce algorithm the model picks for this world's shape with
the new profile and with the built-in defaults (``smdccl._C.plan``)."""

from __future__ import annotations

from smdccl.tune.profile import TRANSPORT, Level, Reduce, plain_env
from smdccl.bench.sizes import human

#: allreduce sizes shown in the comparison: 4 KB ... 64 MB
PICK_SIZES = [4 << 10 << (2 * i) for i in range(8)]


def _table(heads: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(heads, *rows)]

    def join(cells):
        return "  ".join([cells[0].ljust(widths[0])] +
                         [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

    return [join(heads)] + [join(r) for r in rows]


def parameters(levels: list[Level], reduce: Reduce | None, defaults: dict) -> str:
    rows = []
    for lv in levels:
        a, g = defaults[f"{lv.name}_alpha_us"], defaults[f"{lv.name}_gbps"]
        pair = f"{lv.pair[0]}<->{lv.pair[1]}" if lv.pair else "-"
        if lv.fit is None:
            rows.append([lv.name, pair, f"{a:.3g}", f"{g:.3g}", "-",
                         f"built-in default ({lv.skipped})"])
        else:
            rows.append([lv.name, pair, f"{lv.fit.alpha_us:.3g}", f"{lv.fit.gbps:.3g}",
                         f"{lv.fit.max_rel_err:.0%}",
                         f"measured, {TRANSPORT[lv.name]}, {len(lv.points)} sizes"
                         f" (built-in: {a:.3g} us, {g:.3g} GB/s)"])
    g = defaults["reduce_gbps"]
    if reduce is None:
        rows.append(["reduce", "-", "-", f"{g:.3g}", "-", "built-in default"])
    else:
        rows.append(["reduce", "rank 0", "-", f"{reduce.gbps:.3g}", "-",
                     f"measured, float32 add_ of {human(reduce.nbytes)}B (built-in: {g:.3g} GB/s)"])
    return "\n".join(_table(["level", "pair", "alpha(us)", "bw(GB/s)", "fit miss", "source"], rows))


def picks(ranks: int, nodes: int, max_local: int, uniform: bool, path: str) -> str:
    """Allreduce choice per size: new profile vs built-in defaults."""
    from smdccl import _C

    rows = []
    with plain_env():
        for nbytes in PICK_SIZES:
            tuned, est_t, _ = _C.plan("allreduce", nbytes, (ranks, nodes, max_local, uniform), path)
            plain, est_d, _ = _C.plan("allreduce", nbytes, (ranks, nodes, max_local, uniform), "")
            rows.append([human(nbytes) + "B", tuned, f"{est_t[tuned] * 1e6:.1f}",
                         plain, f"{est_d[plain] * 1e6:.1f}",
                         "" if tuned == plain else "changed"])
    shape = (f"allreduce on this shape ({ranks} ranks, {nodes} node{'s' if nodes > 1 else ''}, "
             f"up to {max_local} per node{'' if uniform else ', uneven'}): "
             "the model's pick and its estimate")
    heads = ["size", "tuned pick", "est(us)", "built-in pick", "est(us)", ""]
    return "\n".join([shape] + _table(heads, rows))
