"""Whole-trace GPU busy / idle per rank, beside the step partition (`trace_totals`, the breakdown's
`trace_totals`), with TraceLens's own gpu_timeline of the same trace in both of its variants
(`rank_tracelens_timeline`) and how the two definitions differ (`TRACELENS_DIFFERENCES`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.analyse.timeline.partition import cat_mask, rank_selectors
from tracekit.model.documents.breakdown import (
    BreakdownLinkedOnly,
    BreakdownRanksValue,
    BreakdownTracelensGpuTimeline,
    BreakdownTraceTotals,
)

#: TraceLens's gpu_timeline (TraceLens.TreePerf: `get_df_gpu_timeline` over `GPUEventAnalyser`),
#: both of its variants, recomputed here by its definitions (docs/JSON.md#breakdown, trace_totals)
TRACELENS_VARIANTS: tuple[str, ...] = ("linked_only", "include_unlinked_kernels")
TRACELENS_KEYS: tuple[str, ...] = (
    "computation_ns",
    "exposed_comm_ns",
    "exposed_memcpy_ns",
    "busy_ns",
    "idle_ns",
    "total_ns",
    "total_comm_ns",
    "total_memcpy_ns",
)
#: how tracekit's own trace_totals differ from TraceLens's gpu_timeline (stated in the JSON)
TRACELENS_DIFFERENCES = (
    "tracekit's busy_ns is the union of kernels only (a memset counts with the memcpys in "
    "exposed_memcpy_ns) and every GPU operation counts; TraceLens's gpu_timeline counts a memset as "
    "computation (communication when its name holds 'nccl'), exposes memcpy outside computation and "
    "communication, its busy_time is the union of all GPU operations, and by default it leaves out GPU "
    "operations not linked to a host call (its --include_unlinked_kernels keeps them). Both of its "
    "variants are in `tracelens_gpu_timeline`: include_unlinked_kernels by its definitions exactly; "
    "linked_only keeps, per runtime/driver call with a correlation id, one GPU operation of that id "
    "(TraceLens links one per call through the ac2g flow events, which tracekit does not keep: for a "
    "CUDA-graph launch it is the graph's last-ending operation here, TraceLens's pick may differ)"
)


def trace_totals(events: pd.DataFrame) -> BreakdownTraceTotals:
    """Whole-trace GPU busy / idle per rank: over the span from the rank's first to its last GPU
    operation (kernel, memcpy, memset), `busy_ns` = the union of kernel intervals (every kernel:
    compute, collective, unknown), `exposed_memcpy_ns` = memcpy / memset time outside that union,
    `idle_ns` = span - busy - exposed memcpy, and `exposed_collective_ns` = collective-kernel time
    outside the other kernels (a part of busy_ns). `tracelens_gpu_timeline` holds TraceLens's own
    gpu_timeline, both variants (`rank_tracelens_timeline`); `differences_from_tracelens` says how
    the two definitions differ. `ranks` maps each rank to these; the top level holds their sums
    (span: the sum of spans)."""
    return assemble_trace_totals(
        {
            r: rank_trace_totals(events.iloc[sel])
            for r, sel in rank_selectors(events["rank"].to_numpy(np.int64)).items()
        }
    )


def _measure(s: np.ndarray, e: np.ndarray) -> int:
    return intervals.length(s, e, drop_empty=False)


def _tracelens_metrics(
    s: np.ndarray, e: np.ndarray, comp: np.ndarray, comm: np.ndarray, memcpy: np.ndarray
) -> BreakdownLinkedOnly:
    """GPUEventAnalyser's metrics of the operations given (masks over s/e), integer ns: computation
    = union of comp; exposed comm = comm outside comp; exposed memcpy = memcpy outside comp and
    comm; busy = union of all; idle = total - busy; total = first start to last end."""
    use = comp | comm | memcpy
    if not use.any():
        return BreakdownLinkedOnly(**dict.fromkeys(TRACELENS_KEYS, 0))
    total = int(e[use].max() - s[use].min())
    computation = _measure(s[comp], e[comp])
    comp_comm = _measure(s[comp | comm], e[comp | comm])
    busy = _measure(s[use], e[use])
    return BreakdownLinkedOnly(
        computation_ns=computation,
        exposed_comm_ns=comp_comm - computation,
        exposed_memcpy_ns=busy - comp_comm,
        busy_ns=busy,
        idle_ns=total - busy,
        total_ns=total,
        total_comm_ns=_measure(s[comm], e[comm]),
        total_memcpy_ns=_measure(s[memcpy], e[memcpy]),
    )


def rank_tracelens_timeline(events: pd.DataFrame) -> BreakdownTracelensGpuTimeline:
    """TraceLens's gpu_timeline of one rank's events, both variants (TRACELENS_VARIANTS). Its
    definitions: GPU operations are kernels, memcpys and memsets; communication = a kernel or memset
    whose name holds 'nccl', computation = the other kernels and memsets, memcpy = the memcpys.
    `include_unlinked_kernels`: every GPU operation; `linked_only` (TraceLens's default): those
    linked to a host call, here one per runtime/driver call of the same correlation id (the
    last-ending)."""
    kind = events["kind"]
    s = events["start_ns"].to_numpy(np.int64)
    e = events["end_ns"].to_numpy(np.int64)
    k = cat_mask(kind, ("kernel",))
    ms = cat_mask(kind, ("memset",))
    mc = cat_mask(kind, ("memcpy",))
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        hit = np.array(["nccl" in str(c) for c in names.cat.categories] + [False], dtype=bool)
        nccl = hit[names.cat.codes.to_numpy()]
    else:
        nccl = names.astype(str).str.contains("nccl", regex=False).to_numpy()
    comp_all, comm_all = (k | ms) & ~nccl, (k | ms) & nccl
    unlinked = _tracelens_metrics(s, e, comp_all, comm_all, mc)
    corr = events["correlation"].to_numpy(np.int64)
    gpu = k | ms | mc
    calls = np.unique(corr[cat_mask(kind, ("runtime",)) & (corr >= 0)])
    cand = np.flatnonzero(gpu & (corr >= 0) & np.isin(corr, calls))
    linked = np.zeros(len(events), dtype=bool)
    if len(cand):
        o = cand[np.lexsort((cand, e[cand], corr[cand]))]  # by correlation, then end, then row
        last = np.ones(len(o), dtype=bool)
        last[:-1] = corr[o][1:] != corr[o][:-1]
        linked[o[last]] = True
    return BreakdownTracelensGpuTimeline(
        linked_only=_tracelens_metrics(s, e, comp_all & linked, comm_all & linked, mc & linked),
        include_unlinked_kernels=unlinked,
    )


def rank_trace_totals(events: pd.DataFrame) -> BreakdownRanksValue | None:
    """`trace_totals` of one rank's events (None: no GPU activity)."""
    kind = events["kind"]
    s = events["start_ns"].to_numpy(np.int64)
    e = events["end_ns"].to_numpy(np.int64)
    k = cat_mask(kind, ("kernel",))
    c = cat_mask(kind, ("memcpy", "memset"))
    coll = (
        cat_mask(events["cls"], ("collective",)) if "cls" in events.columns else np.zeros(len(events), bool)
    )
    gpu = k | c
    if not gpu.any():
        return None
    span = int(e[gpu].max() - s[gpu].min())
    busy = _measure(s[k], e[k])
    all_busy = _measure(s[gpu], e[gpu])
    non_coll = _measure(s[k & ~coll], e[k & ~coll])
    return BreakdownRanksValue(
        span_ns=span,
        busy_ns=busy,
        exposed_memcpy_ns=all_busy - busy,
        idle_ns=span - all_busy,
        exposed_collective_ns=busy - non_coll,
        kernels=int(k.sum()),
        memcpy_memset=int(c.sum()),
        tracelens_gpu_timeline=rank_tracelens_timeline(events),
    )


def _sum_metrics(rows: list[BreakdownLinkedOnly]) -> BreakdownLinkedOnly:
    return BreakdownLinkedOnly(**{m: sum(getattr(r, m) for r in rows) for m in TRACELENS_KEYS})


def assemble_trace_totals(per_rank: Mapping[int, BreakdownRanksValue | None]) -> BreakdownTraceTotals:
    """`trace_totals` from each rank's `rank_trace_totals`."""
    ranks = {str(r): v for r, v in sorted(per_rank.items()) if v is not None}
    timelines = [
        t for v in ranks.values() if isinstance(t := v.tracelens_gpu_timeline, BreakdownTracelensGpuTimeline)
    ]
    return BreakdownTraceTotals(
        span_ns=sum(v.span_ns for v in ranks.values()),
        busy_ns=sum(v.busy_ns for v in ranks.values()),
        exposed_memcpy_ns=sum(v.exposed_memcpy_ns for v in ranks.values()),
        idle_ns=sum(v.idle_ns for v in ranks.values()),
        exposed_collective_ns=sum(v.exposed_collective_ns for v in ranks.values()),
        kernels=sum(v.kernels for v in ranks.values()),
        memcpy_memset=sum(v.memcpy_memset for v in ranks.values()),
        tracelens_gpu_timeline=BreakdownTracelensGpuTimeline(
            linked_only=_sum_metrics([t.linked_only for t in timelines]),
            include_unlinked_kernels=_sum_metrics([t.include_unlinked_kernels for t in timelines]),
        ),
        ranks=ranks,
        rule=(
            "busy = union of kernel intervals; exposed memcpy = memcpy/memset outside it; idle = span - busy - "
            "exposed memcpy; span = first to last GPU operation, per rank (tracekit's definitions; TraceLens's "
            "gpu_timeline: tracelens_gpu_timeline, and how they differ: differences_from_tracelens)"
        ),
        differences_from_tracelens=TRACELENS_DIFFERENCES,
    )
