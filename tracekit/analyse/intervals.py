"""Interval arithmetic on integer-nanosecond [start, end) arrays, one copy for every analysis.

`union` merges intervals into sorted disjoint ones (touching ones merge: a start equal to the run's
end joins it); `covered` measures how much of a union lies inside each window. The callers differ
in one point only, said by the caller: whether an empty interval (end <= start) is dropped before
the merge (`drop_empty`, the collectives and the diff) or kept, as the breakdown's TraceLens
metrics and the steps' partition keep it (it changes nothing there but may extend a run's end to
its own start, which those figures have always counted)."""

from __future__ import annotations

import numpy as np


def union(
    starts: np.ndarray, ends: np.ndarray, *, drop_empty: bool = True, presorted: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted, disjoint (start, end) arrays.

    `drop_empty`: leave out the intervals with end <= start first. `presorted`: the intervals are
    already sorted by start (the sort is skipped)."""
    starts = np.asarray(starts)
    ends = np.asarray(ends)
    if drop_empty:
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return starts, ends
    if not presorted:
        o = np.argsort(starts, kind="stable")
        starts, ends = starts[o], ends[o]
    run_end = np.maximum.accumulate(ends)
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:] - 1, [len(starts) - 1]))
    return starts[first], run_end[last]


def length(starts: np.ndarray, ends: np.ndarray, *, drop_empty: bool = True) -> int:
    """The total length of the union of [start, end) intervals."""
    us, ue = union(starts, ends, drop_empty=drop_empty)
    return int((ue - us).sum())


def covered_before(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For a union (us, ue) (sorted, disjoint), the covered length in (-inf, t] for every t."""
    if not len(us):
        return np.zeros(len(t), dtype=np.int64)
    lengths = ue - us
    cum = np.concatenate(([0], np.cumsum(lengths)))
    i = np.searchsorted(us, t, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(t), dtype=np.int64)
    ii = i[ok]
    out[ok] = cum[ii] + np.clip(t[ok] - us[ii], 0, lengths[ii])
    return out


def covered(us: np.ndarray, ue: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The length of the union (us, ue) inside each window [a, b)."""
    return covered_before(us, ue, b) - covered_before(us, ue, a)
