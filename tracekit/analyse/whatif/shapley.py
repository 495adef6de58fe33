"""The exact Shapley split of the what-if's game (`tracekit.analyse.whatif`) and its integers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np


def shapley(values: Mapping[frozenset[int], Fraction], k: int) -> list[Fraction]:
    """Shapley value of each of k players for the *reduction* v(empty) - v(all): phi_i is the mean over
    orders of v(S) - v(S + i). Exact; sums to v(empty) - v(all)."""
    out = []
    fact = math.factorial
    for i in range(k):
        phi = Fraction(0)
        others = [j for j in range(k) if j != i]
        for size in range(k):
            w = Fraction(fact(size) * fact(k - size - 1), fact(k))
            for sub in itertools.combinations(others, size):
                s = frozenset(sub)
                phi += w * (values[s] - values[s | {i}])
        out.append(phi)
    assert sum(out) == values[frozenset()] - values[frozenset(range(k))]
    return out


def round_to_sum(values: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Integers that sum exactly to `total`: floors, then the largest remainders get the rest."""
    floors = {k: math.floor(v) for k, v in values.items()}
    rest = total - sum(floors.values())
    order = sorted(values, key=lambda k: (-(values[k] - floors[k]), k))
    if rest >= 0:
        for k in order[:rest]:
            floors[k] += 1
    else:
        for k in order[::-1][:-rest]:
            floors[k] -= 1
    assert sum(floors.values()) == total
    return floors


def mean_int(values: np.ndarray) -> Fraction:
    """The exact mean of integer values."""
    return Fraction(int(np.asarray(values, dtype=np.int64).sum()), len(values))
