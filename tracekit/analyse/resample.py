"""The two-level bootstrap of per-token times: a run's rounds drawn with replacement, then each
drawn round's tokens within it (`boot_means`: the drift between rounds widens the spread; one round
is the plain token bootstrap), and the plain bootstrap of one array's mean (`boot_steps`). The
caller owns the generator (seeded), so the draws are reproducible."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def boot_means(rounds: Sequence[Sequence[int]], rng: np.random.Generator, b: int) -> np.ndarray:
    """b resampled pooled means: rounds with replacement, then each drawn round's tokens."""
    kept = [r for r in rounds if len(r)]
    return drawn_means(kept, rng.integers(0, len(kept), size=(b, len(kept))), rng)


def drawn_means(rounds: Sequence[Sequence[int]], picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per resample (a row of `picks`: the drawn rounds' indices) the mean per-token time of the
    drawn rounds' tokens, each drawn round's tokens drawn with replacement within it (`boot_means`;
    `tracekit.analyse.ab` draws the picks once for both arms: the pairing)."""
    arrs = [np.asarray(r, dtype=np.float64) for r in rounds]
    b, k = picks.shape
    total = np.zeros(b)
    count = np.zeros(b)
    for slot in range(k):
        for j, r in enumerate(arrs):
            chosen = picks[:, slot] == j
            m = int(chosen.sum())
            if not m:
                continue
            total[chosen] += r[rng.integers(0, len(r), size=(m, len(r)))].sum(axis=1)
            count[chosen] += len(r)
    return total / count


def boot_steps(values: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    """b resampled means of one array (per column when 2-d)."""
    n = values.shape[0]
    idx = rng.integers(0, n, size=(b, n))
    return values[idx].mean(axis=1)
