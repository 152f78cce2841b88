"""Progress bar on stderr for rank 0: tqdm when installed, else a plain one.

stdout carries only the table (so it can be redirected or diffed); the bar
goes to stderr. By default it is shown only when stderr is a terminal, so
logs of batch jobs are not filled with carriage returns (--progress forces
it, --no-progress hides it).
"""

from __future__ import annotations

import sys


class _TextBar:
    """Fallback when tqdm is missing: ``[#####.....]  12/80  gloo allreduce 1M``."""

    def __init__(self, total: int, width: int = 30):
        self.total, self.done, self.width = total, 0, width
        self.label, self.pending = "", False

    def _draw(self) -> None:
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r[{bar}] {self.done:>4}/{self.total}  {self.label:<40.40}")
        sys.stderr.flush()

    def update(self, label: str) -> None:
        self.done += self.pending
        self.label, self.pending = label, True
        self._draw()

    def close(self) -> None:
        sys.stderr.write("\r" + " " * (self.width + 60) + "\r")
        sys.stderr.flush()


class _TqdmBar:
    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, file=sys.stderr, unit="size", leave=False,
                        dynamic_ncols=True)
        self.pending = False

    def update(self, label: str) -> None:
        self.bar.set_postfix_str(label, refresh=not self.pending)
        if self.pending:
            self.bar.update(1)
        self.pending = True

    def close(self) -> None:
        self.bar.close()


class _NoBar:
    """Other ranks, or no terminal."""

    def update(self, label: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool | None):
    """A bar with ``update(label)`` and ``close()``; ``enabled=None`` means auto."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NoBar()
    try:
        return _TqdmBar(total)
    except ImportError:
        return _TextBar(total)
