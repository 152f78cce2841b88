"""busbw vs size, one line per backend, one subplot per collective.

matplotlib is an optional dependency: it is imported only here, and
:func:`available` lets the CLI fail fast, before a long sweep, when it is
missing.
"""

from __future__ import annotations

import math

from smdccl.bench.sizes import human

MISSING = "smdccl.bench: --plot needs matplotlib, which is not installed: pip install matplotlib"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(rows: list[dict], path: str, backends: list[str], collectives: list[str],
         title: str) -> None:
    """Write the figure to ``path`` (format from its suffix, e.g. .png, .svg)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    names = [c for c in collectives if any(r["collective"] == c for r in rows)]
    if not names:
        names = list(collectives)
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.8 * nrows),
                             squeeze=False)
    for ax, name in zip(axes.flat, names):
        sizes = sorted({r["size"] for r in rows if r["collective"] == name})
        for backend in backends:
            pts = sorted((r["size"], r["busbw"]) for r in rows
                         if r["collective"] == name and r["backend"] == backend)
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=backend)
        ax.set_xscale("log", base=2)
        if sizes:
            ax.set_xticks(sizes)
            ax.set_xticklabels([human(s) for s in sizes], rotation=45, fontsize=8)
            ax.minorticks_off()
        ax.set_title(name)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
