"""Exact integer figures: a Fraction to the nearest int, and Fractions to ints that still sum to a
given total."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction


def round_to_sum(values: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Round each value to an int so that the ints sum to `total` (largest remainder; ties go to
    the later key, and the remainders are walked again when more than one unit per key is left)."""
    floors = {k: math.floor(v) for k, v in values.items()}
    left = total - sum(floors.values())
    order = sorted(values, key=lambda k: (values[k] - floors[k], k), reverse=True)
    out = dict(floors)
    step = 1 if left > 0 else -1
    seq = order if left > 0 else order[::-1]
    i = 0
    while left != 0:
        out[seq[i % len(seq)]] += step
        left -= step
        i += 1
    return out


def round_half_up(x: Fraction) -> int:
    """The int nearest `x`, halves up (floor(x + 1/2)): how every exact per-token figure becomes ns."""
    return int(math.floor(x + Fraction(1, 2)))
