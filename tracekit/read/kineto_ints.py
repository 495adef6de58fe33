"""JSON values coerced to int64 columns (the Kineto tokenizer's and the event mapping's): ints,
integral floats and numeric strings in range, else -1; the bounds of a duration and a timestamp."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.model.events import DataQuality

#: a dur at or above this (us) is not a duration (2**62 ns: 146 years); skipped and counted
MAX_DUR_US = 2.0**62 / 1000.0


DAY_NS = 86_400e9


_INT64_MIN = -(2**63)


INT64_MAX = 2**63 - 1


INT32_MAX = 2**31 - 1


def to_int(v: Any) -> int:
    """`v` as an int64 value; -1 (missing) when it is not a number or does not fit an int64
    ("inf", 1e30, 10**30, "12x")."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if _INT64_MIN <= v <= INT64_MAX else -1
    if isinstance(v, str) and len(v) > 64:  # int() of a long digit string is quadratic
        return -1
    try:
        out = int(v)
    except (TypeError, ValueError, OverflowError):
        try:
            out = int(float(v))
        except (TypeError, ValueError, OverflowError):
            return -1
    return out if _INT64_MIN <= out <= INT64_MAX else -1


def to_small_int(v: Any) -> int:
    """`v` as a non-negative int32 value (a rank, a group size); -1 when missing or out of range."""
    out = to_int(v)
    return out if 0 <= out <= INT32_MAX else -1


def _ints(values: list[Any]) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([to_int(v) for v in values], dtype=np.int64)


def int_column(
    getter: Any, items: list[Any], n: int, dq: DataQuality | None = None, what: str = ""
) -> np.ndarray:
    """getter(item) for every item as int64, straight from the iterator (no list) when all are ints.
    Integers that do not fit an int64 become -1 (missing), counted in `dq` as `values_out_of_range`."""
    try:
        return np.fromiter(map(getter, items), np.int64, n)
    except (TypeError, ValueError, OverflowError):  # e.g. the one "Trace" span with pid "Spans"
        vals = list(map(getter, items))
        huge = sum(1 for v in vals if isinstance(v, (int, float)) and not _INT64_MIN <= v <= INT64_MAX)
        if huge and dq is not None:
            dq.add(
                "values_out_of_range",
                huge,
                f"event fields ({what}) beyond the int64 range (>= 2**63) were read as missing",
            )
        return np.array(
            [v if v.__class__ is int and _INT64_MIN <= v <= INT64_MAX else to_int(v) for v in vals],
            np.int64,
        )


def to_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")
