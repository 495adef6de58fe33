"""The report's formatters (milliseconds, percent, ratios, intervals, bytes), shared by the
HTML and Markdown renderers so both print the same numbers, and the tolerant number readers."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from tracekit.model.units import fmt_ms, fmt_x

# ----------------------------------------------------------------------------------------------
# formatting shared by the renderers


#: an interval as the documents hold it: [lo, hi] (a list decoded, a tuple built), or None
Interval = Sequence[float | int] | None


def fmt_interval(interval: Interval) -> str:
    """A ratio interval as "[1.27-1.48]" (the shortfall verdict's form); "" when missing."""
    iv = as_pair(interval)
    return "" if iv is None else f"[{iv[0]:.2f}-{iv[1]:.2f}]"


def fmt_x_interval(ratio: float | None, interval: Interval) -> str:
    """A dilation with its interval: "1.37x [1.27-1.48]" (just "1.37x" without an interval)."""
    iv = fmt_interval(interval)
    return fmt_x(ratio) + (f" {iv}" if iv and ratio is not None else "")


def prose(text: Any) -> str:
    """A sentence for a reader: code spans (`name`) lose their backticks, which would show
    literally on the page and in the Markdown (`md_esc` escapes them)."""
    return re.sub(r"`([^`\n]+)`", r"\1", "" if text is None else str(text))


def short_words(words: str) -> str:
    """A term's words without the parenthesis (for figure axes): "gloo's exchange after ..."."""
    return words.split(" (", 1)[0]


def fmt_gbps(gbps: float | None) -> str:
    if gbps is None or not math.isfinite(gbps):
        return "n/a"
    return f"{gbps:.3f} GB/s"


def fmt_bytes(n: int | None) -> str:
    if n is None or n < 0:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % (size // 1024 or 1) == 0:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def to_float(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def to_int(x: Any) -> int | None:
    v = to_float(x)
    return None if v is None else int(round(v))


#: the workload fields a report shows, in this order (those the manifest has)


def as_pair(v: Interval) -> tuple[float, float] | None:
    """[lo, hi] as two finite numbers, or None."""
    if v is not None and len(v) == 2:
        lo, hi = to_float(v[0]), to_float(v[1])
        if lo is not None and hi is not None:
            return lo, hi
    return None


def fmt_ms_interval(v: Interval, digits: int = 2) -> str:
    """An interval of ns as "6.83-9.77 ms" ("" without one)."""
    iv = as_pair(v)
    return "" if iv is None else f"{iv[0] / 1e6:.{digits}f}-{fmt_ms(iv[1], digits)}"


def reading_of(interval: Interval) -> str | None:
    """ "finding" when a 95% interval lies above zero, "negative" below it, "within_noise" when it
    holds zero; None without an interval (the noise section's readings, for the coordination parts)."""
    iv = as_pair(interval)
    if iv is None:
        return None
    return "finding" if iv[0] > 0 else ("negative" if iv[1] < 0 else "within_noise")


def present_fields(doc: msgspec.Struct | msgspec.UnsetType) -> list[tuple[str, object]]:
    """A document's fields that it holds (UNSET ones left out), in field order: a manifest's
    workload or host as the renderers list them."""
    if doc is UNSET:
        return []
    return [(k, getattr(doc, k)) for k in doc.__struct_fields__ if getattr(doc, k) is not UNSET]
