"""Byte sizes: parsing "4K"/"1M"/"64M", building the sweep, printing labels.

Suffixes are binary (K = 1024), as in nccl-tests' ``-b 8 -e 128M``.
Kept free of torch so that the argument parser does not depend on it.
"""

from __future__ import annotations

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """"4K" -> 4096, "1M" -> 1048576, "512" -> 512; also "4KB", "4KiB", "4k"."""
    s = text.strip().upper()
    for tail in ("IB", "B"):
        if s.endswith(tail) and s[: -len(tail)][-1:] in ("K", "M", "G"):
            s = s[: -len(tail)]
            break
    unit = s[-1:] if s[-1:] in ("K", "M", "G") else ""
    number = s[: len(s) - len(unit)]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 4K, 1M, 64M)") from None
    if value < 1 or value != int(value):
        raise ValueError(f"size must be a positive whole number of bytes: {text!r}")
    return int(value)


def parse_size_list(text: str) -> list[int]:
    """"4K,64K,1M" -> [4096, 65536, 1048576] (kept in the order given)."""
    return [parse_size(part) for part in text.split(",") if part.strip()]


def geometric(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*factor, ... up to and including max (nccl-tests -b/-e/-f)."""
    if min_bytes > max_bytes:
        raise ValueError(f"--min-bytes ({min_bytes}) is larger than --max-bytes ({max_bytes})")
    if factor < 2:
        raise ValueError(f"--step-factor must be >= 2, got {factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def human(nbytes: int) -> str:
    """4096 -> "4K", 1536 -> "1.5K": short labels for the plot and progress bar."""
    for unit in ("G", "M", "K"):
        scale = _UNITS[unit]
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{nbytes}"
