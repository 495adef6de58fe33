"""The straggler test (docs/METHOD.md section Shortfall attribution; docs/METHOD-NOTES.md): is one rank
late by more than symmetric launch-bound hosts explain (`straggler_test`), and how likely chance alone
makes a rank the last one at a share of a run's collectives (`last_share_p_value`)."""

from __future__ import annotations

import math

import numpy as np

from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.model.documents.shortfall import ShortfallStraggler

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


def straggler_test(baseline: RunParts, sharded: RunParts, n_ranks: int) -> ShortfallStraggler:
    """Is one rank late by more than symmetric launch-bound hosts explain? (docs/METHOD-NOTES.md)

    Per collective instance, the lateness of its last rank = last arrival - the arrival before
    it (how long that rank alone held the collective). The candidate is the rank that is last
    most often; its median lateness (over the instances where it is last) is compared with a
    threshold from the baseline: 3 x the baseline's host time per collective interval (its
    median per-step host gap / the collectives per step: the lead one symmetric launch-bound
    host can build over another between two collectives) + the baseline's host-gap spread per
    interval ((p90 - p10) / collectives per step). Both figures are traced ones (the profiler
    slows both runs' hosts alike)."""
    coll = sharded.collectives
    out = ShortfallStraggler(rank=None, is_straggler=False)
    pr = coll.per_rank
    if n_ranks < 2 or pr.empty:
        return out
    steady = set(sharded.steady["step"].tolist())
    windows = sharded.steps[["rank", "step", "start_ns", "end_ns"]]
    first = pr[pr["rank"] == pr["rank"].min()]
    inst_step = assign_steps(first.assign(start_ns=first["raw_start_ns"]), windows)
    per_step = float(inst_step.isin(steady).sum()) / max(len(steady), 1)
    srt = pr.sort_values(["instance", "start_ns", "rank"], ascending=[True, False, True])
    top2 = srt.groupby("instance", sort=True).head(2)
    g = top2.groupby("instance", sort=True)
    last_rank = g["rank"].first()
    late = (g["start_ns"].first() - g["start_ns"].last()).astype(np.int64)
    counts = last_rank.value_counts()
    cand = int(counts.index[0])
    share = float(counts.iloc[0]) / len(last_rank)
    lat = float(np.median(late[last_rank == cand]))
    base_idle = baseline.rank_steps.groupby("step")["idle_ns"].mean().to_numpy(np.float64)
    if per_step <= 0 or not len(base_idle):
        return out
    per_seg = float(np.median(base_idle)) / per_step
    spread = float(np.quantile(base_idle, 0.9) - np.quantile(base_idle, 0.1)) / per_step
    threshold = 3.0 * per_seg + spread
    p_chance = last_share_p_value(int(counts.iloc[0]), len(last_rank), n_ranks)
    return ShortfallStraggler(
        rank=cand,
        is_straggler=bool(share >= 0.5 and p_chance < STRAGGLER_ALPHA and lat > threshold),
        last_share=share,
        last_share_p_value=p_chance,
        lateness_ns_median=int(round(lat)),
        threshold_ns=int(round(threshold)),
        baseline_host_per_interval_ns=int(round(per_seg)),
        collectives_per_step=per_step,
    )
