"""The straggler test's statistic (docs/METHOD.md section Shortfall attribution): how likely chance
alone makes a rank the last one at a share of a run's collectives."""

from __future__ import annotations

import math

import numpy as np

STRAGGLER_ALPHA = 0.01
"""A rank is last more often than chance only when `last_share_p_value` is below this."""


def last_share_p_value(last_count: int, instances: int, n_ranks: int) -> float:
    """How likely chance alone makes the most frequent last rank last at >= `last_count` of
    `instances` collectives, each instance's last rank uniform over `n_ranks`: the upper binomial
    tail at p = 1 / n_ranks, times n_ranks (any rank could have been the most frequent one:
    Bonferroni), capped at 1.

    The most frequent last rank of two is last at >= 50% by construction, so a share alone proves
    nothing at TP=2 (a loaded 2-core CI host: rank 0 last at 16 of 32, 0.82 ms late, was called a
    straggler); the share must be one that chance does not explain."""
    if instances <= 0 or n_ranks < 2:
        return 1.0
    p = 1.0 / n_ranks
    j = np.arange(max(last_count, 0), instances + 1, dtype=np.float64)
    if not len(j):
        return 0.0
    log_pmf = (
        math.lgamma(instances + 1)
        - np.array([math.lgamma(x + 1) + math.lgamma(instances - x + 1) for x in j])
        + j * math.log(p)
        + (instances - j) * math.log1p(-p)
    )
    return float(min(1.0, n_ranks * np.exp(log_pmf).sum()))
