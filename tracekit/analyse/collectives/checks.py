"""The checks on a matched run: the clock check on the aligned ends of each instance
(`end_spread_check`, `END_SPREAD_THRESHOLD_NS`) and who arrived last (`straggler_counts`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.model.documents.shortfall import ShortfallCheck, ShortfallWorst
from tracekit.model.events import DataQuality

#: Default end-spread thresholds of the clock check, per level (`end_spread_check`). A collective
#: ends on every rank when its data has arrived everywhere, so matched instances end together on
#: one clock. Measured on the committed traces (docs/METHOD-NOTES.md, Collectives, "Clock check"):
#: NCCL kernels on one host end within 0.55 us (p99), 4.1 us at most (the first call of an nsys
#: capture); gloo worker ranges within 1.4 ms (p99), 4.4 ms at most (scheduler delay on a loaded
#: 2-core host). Each threshold is over twice the worst seen. Host ops (`host_op`: c10d / NCCL
#: ops on the calling thread) return once the work is enqueued, so their ends need not agree
#: (1.3 ms median apart on h200-tp2): no check there.
END_SPREAD_THRESHOLD_NS: dict[str, int] = {"gpu_kernel": 10_000, "gloo": 10_000_000}


def end_spread_check(
    per_rank: pd.DataFrame,
    instances: pd.DataFrame,
    level: str,
    dq: DataQuality,
    threshold_ns: int | None = None,
) -> ShortfallCheck:
    """The clock check: matched instances end together on every rank (a collective ends when its
    data has arrived everywhere), so their end spread (max e - min e on the aligned clock,
    `instances.end_spread_ns`) must stay small. Counts the instances of more than one rank whose
    spread exceeds the threshold (default by level, `END_SPREAD_THRESHOLD_NS`) and, when any does,
    adds `collective_end_spread` to `dq` naming the worst instance and the median spread.

    Returns threshold_ns (None where the level's ends need not agree: host ops), instances (of more
    than one rank), instances_over (None where not applied), median_ns, p99_ns, max_ns and worst
    (instance, op, group, spread_ns, first_rank (ends first), last_rank (ends last); None when
    there is no such instance).
    """
    thr = int(threshold_ns) if threshold_ns is not None else END_SPREAD_THRESHOLD_NS.get(level)
    multi = instances[instances["n_ranks"] > 1] if len(instances) else instances
    out = ShortfallCheck(
        level=level,
        threshold_ns=thr,
        instances=len(multi),
        instances_over=0 if thr is not None else None,
        median_ns=None,
        p99_ns=None,
        max_ns=None,
        worst=None,
    )
    if thr is None:
        out.note = (
            "not checked: host collective ops return once the work is enqueued, so their ends need not agree"
            if level == "host_op"
            else "not checked: no collectives"
        )
    if multi.empty:
        return out
    spread = multi["end_spread_ns"].to_numpy(np.int64)
    median_ns = int(np.rint(np.median(spread)))
    out.median_ns = median_ns
    out.p99_ns = int(np.rint(np.percentile(spread, 99)))
    out.max_ns = int(spread.max())
    w = multi.iloc[int(np.argmax(spread))]
    rows = per_rank[per_rank["instance"] == int(w["instance"])].sort_values(["end_ns", "rank"])
    worst = ShortfallWorst(
        instance=int(w["instance"]),
        op=str(w["op"]),
        group=str(w["group"]),
        spread_ns=int(w["end_spread_ns"]),
        first_rank=int(rows["rank"].iloc[0]),
        last_rank=int(rows["rank"].iloc[-1]),
    )
    out.worst = worst
    if thr is None:
        return out
    over = int((spread > thr).sum())
    out.instances_over = over
    if over:
        dq.add(
            "collective_end_spread",
            over,
            f"{over} of {len(multi)} matched collective instances end more than {thr / 1e3:g} us apart across "
            f"ranks (they should end together: clocks disagree or a trace is inconsistent); worst: "
            f"{worst.op} instance {worst.instance} ({worst.group}), {worst.spread_ns / 1e3:.1f} us "
            f"(rank {worst.last_rank} ends after rank {worst.first_rank}); median spread "
            f"{median_ns / 1e3:.2f} us",
        )
    return out


def straggler_counts(instances: pd.DataFrame, per_rank: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    if instances.empty:
        return pd.DataFrame({"rank": ranks, "last_count": 0, "instances": 0, "share": 0.0})
    # only instances with more than one rank can have a straggler
    multi = instances[instances["n_ranks"] > 1]
    last = multi["last_rank"].value_counts()
    in_rank = per_rank[per_rank["instance"].isin(multi["instance"])].groupby("rank")["instance"].nunique()
    out = pd.DataFrame({"rank": ranks})
    out["last_count"] = out["rank"].map(last).fillna(0).astype(np.int64)
    out["instances"] = out["rank"].map(in_rank).fillna(0).astype(np.int64)
    out["share"] = np.where(out["instances"] > 0, out["last_count"] / out["instances"].clip(lower=1), 0.0)
    return out
