"""The link verdict's numbers as its sentences print them: bytes (KiB / MiB / GiB, three figures), a
share of S, a bus bandwidth in GB/s, a ratio ("2.4x")."""

from __future__ import annotations

import math
from collections.abc import Sequence


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n} B"


def fmt_share(x: float) -> str:
    return f"{x * 100:.1f}%" if abs(x) < 0.1 else f"{x * 100:.0f}%"


def fmt_magnitude(v: float, specs: Sequence[tuple[float, str]], *, below: str, nan: str) -> str:
    """`v` in the format spec of the first (threshold, spec) of `specs` it reaches (`below` under
    them all), `nan` when it is not finite: a figure's digits chosen by its size."""
    if not math.isfinite(v):
        return nan
    return format(v, next((spec for least, spec in specs if v >= least), below))


def fmt_gbps(v: float) -> str:
    return fmt_magnitude(v, ((100, ".0f"), (1, ".3g"), (0.1, ".2f")), below=".2g", nan="n/a")


def fmt_ratio(k: float) -> str:
    return f"{k:.0f}x" if k >= 10 else f"{k:.1f}x" if k >= 2 else f"{k:.2f}x"
