"""tracekit.analyse.intervals: the one interval union every analysis uses, checked against a
brute-force count of covered nanoseconds on random intervals (the union's length and the covered
length per window are the number of integer points t with start <= t < end for some interval)."""

from __future__ import annotations

import numpy as np

from tracekit.analyse import intervals


def _points(starts: list[int], ends: list[int]) -> set[int]:
    return {t for s, e in zip(starts, ends, strict=True) for t in range(s, e)}


def test_union_merges_overlapping_and_touching_and_drops_empty():
    s, e = intervals.union(np.array([5, 0, 2, 20, 30, 25]), np.array([8, 3, 6, 25, 30, 27]))
    # [0,3) [2,6) [5,8) overlap; [20,25) and [25,27) touch; [30,30) is empty
    assert s.tolist() == [0, 20] and e.tolist() == [8, 27]


def test_keep_empty_is_the_partitions_rule():
    """An empty interval kept (breakdown, steps) is a zero-length run of its own, not dropped."""
    s, e = intervals.union(np.array([0, 10]), np.array([5, 10]), drop_empty=False)
    assert s.tolist() == [0, 10] and e.tolist() == [5, 10]
    s, e = intervals.union(np.array([0, 10]), np.array([5, 10]))
    assert s.tolist() == [0] and e.tolist() == [5]


def test_union_and_covered_against_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        st = rng.integers(0, 60, n)
        en = st + rng.integers(-3, 15, n)
        pts = _points(st.tolist(), en.tolist())
        us, ue = intervals.union(st, en)
        assert np.all(us[1:] > ue[:-1])  # disjoint, sorted, not touching
        assert int((ue - us).sum()) == len(pts) == intervals.length(st, en)
        o = np.argsort(st, kind="stable")
        ps, pe = intervals.union(st[o], en[o], presorted=True)
        assert ps.tolist() == us.tolist() and pe.tolist() == ue.tolist()
        a = rng.integers(-5, 70, 6)
        b = a + rng.integers(0, 30, 6)
        got = intervals.covered(us, ue, a, b)
        want = [sum(1 for t in pts if lo <= t < hi) for lo, hi in zip(a.tolist(), b.tolist(), strict=True)]
        assert got.tolist() == want


def test_covered_of_an_empty_union_is_zero():
    z = np.zeros(0, dtype=np.int64)
    assert intervals.covered(z, z, np.array([0, 5]), np.array([10, 6])).tolist() == [0, 0]
