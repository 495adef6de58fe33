"""Numbers as people read them: nanoseconds as milliseconds or microseconds, shares as percents,
ratios as "1.37x". One copy for the tables (cli), the prose (analyse) and the reports.

Every formatter prints `missing` ("-" in the tables, "n/a" in the reports) for None and for a
float that is not finite; `sign` prints "+" before a positive number (a change)."""

from __future__ import annotations

import math

#: bytes in a GiB
GIB = 1024**3


def _absent(x: float | int | None) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def _scaled(
    ns: float | int | None, per: float, name: str, digits: int, unit: bool, sign: bool, missing: str
) -> str:
    """`ns / per` with `digits` decimals (a sign with `sign`, " <name>" with `unit`), `missing` when absent."""
    if ns is None or _absent(ns):
        return missing
    return f"{ns / per:{'+' if sign else ''}.{digits}f}" + (f" {name}" if unit else "")


def ms(
    ns: float | int | None, digits: int = 3, *, unit: bool = False, sign: bool = False, missing: str = "-"
) -> str:
    """Nanoseconds as milliseconds with `digits` decimals: "12.345" ("12.345 ms" with `unit`)."""
    return _scaled(ns, 1e6, "ms", digits, unit, sign, missing)


def us(
    ns: float | int | None, digits: int = 1, *, unit: bool = False, sign: bool = False, missing: str = "-"
) -> str:
    """Nanoseconds as microseconds with `digits` decimals: "12.3" ("12.3 us" with `unit`)."""
    return _scaled(ns, 1e3, "us", digits, unit, sign, missing)


def ms_or_us(ns: float | int) -> str:
    """A time in the unit it reads best in, for prose: "1.23 ms" from 0.1 ms up, else "45.6 us"."""
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 1e5 else f"{ns / 1e3:.1f} us"


def ms_or_us_signed(ns: float | int) -> str:
    """`ms_or_us` with its sign always written: "+1.23 ms", "-45.6 us"."""
    return ("+" if ns >= 0 else "-") + ms_or_us(abs(ns))


def pct(share: float | None, digits: int = 1, *, sign: bool = False, missing: str = "-") -> str:
    """A share (0.25) as a percent with `digits` decimals: "25.0%"."""
    if share is None or _absent(share):
        return missing
    return f"{100.0 * share:{'+' if sign else ''}.{digits}f}%"


def times(ratio: float | None, digits: int = 2, *, missing: str = "-") -> str:
    """A ratio as "1.37x"."""
    if ratio is None or _absent(ratio):
        return missing
    return f"{ratio:.{digits}f}x"


# the reports' forms: the unit written, "n/a" when missing (tables, HTML, Markdown, the notebook)


def fmt_ms(ns: float | int | None, digits: int = 3) -> str:
    """Nanoseconds as milliseconds with `digits` decimals ("12.345 ms"); "n/a" when missing."""
    return ms(ns, digits, unit=True, missing="n/a")


def fmt_us(ns: float | int | None, digits: int = 1) -> str:
    return us(ns, digits, unit=True, missing="n/a")


def fmt_pct(share: float | None, digits: int = 1) -> str:
    return pct(share, digits, missing="n/a")


def fmt_x(ratio: float | None) -> str:
    return times(ratio, missing="n/a")
