"""The link verdict's numbers as its sentences print them: bytes (KiB / MiB / GiB, three figures), a
share of S, a bus bandwidth in GB/s, a ratio ("2.4x")."""

from __future__ import annotations

import math


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n} B"


def fmt_share(x: float) -> str:
    return f"{x * 100:.1f}%" if abs(x) < 0.1 else f"{x * 100:.0f}%"


def fmt_gbps(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.3g}"
    return f"{v:.2f}" if v >= 0.1 else f"{v:.2g}"


def fmt_ratio(k: float) -> str:
    return f"{k:.0f}x" if k >= 10 else f"{k:.1f}x" if k >= 2 else f"{k:.2f}x"
