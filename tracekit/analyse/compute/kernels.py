"""Top kernels per class: the per-kernel table users of HTA and `nsys stats` expect.

Per class (compute, memory, collective, unknown on a GPU timeline), the kernels by name inside
the steady step windows, with their count and time **per token per rank** (the sum over the
steady windows of every rank, divided by the number of those windows), the mean time per call,
and the share of the step: per-token time / the run's mean traced step time (the longest window
over ranks, as everywhere: docs/METHOD.md section Steps and the partition). The times are traced
durations (the profiler's dilation is not taken out: a kernel's own duration is device time,
which the correction keeps as measured). Kernels on different streams can overlap, so the shares
of a class can add up to more than its exposed part.

A rank without GPU activity (a CPU run) lists its host ops instead: the outermost CPU op of each
thread (a nested op's time is inside its parent's), class `host ops`, and gloo's collective ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.classify.rules import GPU_KINDS
from tracekit.model.documents.kernels import TopKernel, TopKernels, TopKernelsClass

#: kernels listed per class
TOP = 10
#: classes in the order the report prints them
CLASS_ORDER = ("compute", "memory", "collective", "unknown", "host ops")


def steady_windows(steps: pd.DataFrame, skip_first: int = 1) -> pd.DataFrame:
    """The step windows without each rank's first `skip_first` steps (warm-up); all of them when a
    rank has no more steps than that."""
    out = []
    for _, w in steps.sort_values(["rank", "step"]).groupby("rank", sort=True):
        out.append(w.iloc[skip_first:] if len(w) > skip_first else w)
    if not out:
        return steps.iloc[0:0]
    return pd.concat(out, ignore_index=True)


def _outermost(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of the intervals (sorted by start) not nested in an earlier one."""
    if not len(start):
        return np.zeros(0, dtype=bool)
    prev_end = np.maximum.accumulate(end)
    keep = np.ones(len(start), dtype=bool)
    keep[1:] = start[1:] >= prev_end[:-1]
    return keep


@dataclass
class RankKernels:
    """One rank's kernel sums over its steady windows (small): per (class, name) the count and the
    total duration, and how many windows they cover. The Dask engine computes these where the
    rank's events are; `assemble_top_kernels` puts them together on the client."""

    rank: int
    windows: int
    table: pd.DataFrame  # cls, name, subclass, count, total


def rank_kernel_sums(
    events: pd.DataFrame, windows: pd.DataFrame, rank: int, *, skip_first: int = 1
) -> RankKernels:
    """`events`: one rank's classified events; `windows`: its step windows (step = order on the rank
    or the run's number; start_ns, end_ns); the first `skip_first` windows are warm-up."""
    win = steady_windows(windows.assign(rank=rank), skip_first).sort_values("start_ns")
    empty = pd.DataFrame({"cls": [], "name": [], "subclass": [], "count": [], "total": []})
    if not len(win) or events.empty:
        return RankKernels(rank, len(win), empty)
    kind = events["kind"].astype(str).to_numpy()
    cls = events["cls"].astype(str).to_numpy()
    start = events["start_ns"].to_numpy(np.int64)
    end = events["end_ns"].to_numpy(np.int64)
    gpu = np.isin(kind, list(GPU_KINDS))
    if gpu.any():
        idx = np.flatnonzero(gpu)
        label = cls[idx]
    else:  # host timeline: outermost CPU ops per thread, gloo collectives apart
        idx_all = np.flatnonzero(kind == "cpu_op")
        keep = []
        streams = events["stream"].to_numpy()[idx_all]
        for st in np.unique(streams):
            ii = idx_all[streams == st]
            ii = ii[np.argsort(start[ii], kind="stable")]
            keep.append(ii[_outermost(start[ii], end[ii])])
        idx = np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)
        label = np.where(cls[idx] == "collective", "collective", "host ops")
    ws = win["start_ns"].to_numpy(np.int64)
    we = win["end_ns"].to_numpy(np.int64)
    k = np.searchsorted(ws, start[idx], side="right") - 1
    ok = (k >= 0) & (start[idx] < we[np.clip(k, 0, None)])
    sel, label = idx[ok], label[ok]
    if not len(sel):
        return RankKernels(rank, len(win), empty)
    frame = pd.DataFrame(
        {
            "cls": label.astype(str),
            "name": events["name"].astype(str).to_numpy()[sel],
            "subclass": events["subclass"].astype(str).to_numpy()[sel],
            "dur": (end[sel] - start[sel]).astype(np.int64),
        }
    )
    g = frame.groupby(["cls", "name"], sort=True).agg(
        count=("dur", "size"), total=("dur", "sum"), subclass=("subclass", "first")
    )
    return RankKernels(rank, len(win), g.reset_index())


def assemble_top_kernels(
    per_rank: list[RankKernels], steps: pd.DataFrame, *, skip_first: int = 1, top: int = TOP
) -> TopKernels:
    """The run's top kernels per class from its ranks' sums; the step time from `steps` (every
    rank's windows: per step the longest, over the steady steps)."""
    win = steady_windows(steps, skip_first)
    n_windows = sum(x.windows for x in per_rank)
    if n_windows == 0 or not len(win):
        return TopKernels(windows=0, step_ns_mean=None, classes={})
    step_mean = float((win["end_ns"] - win["start_ns"]).groupby(win["step"]).max().mean())
    tables = [x.table for x in per_rank if len(x.table)]
    if not tables:
        return TopKernels(windows=n_windows, step_ns_mean=step_mean, classes={})
    g = (
        pd.concat(tables, ignore_index=True)
        .groupby(["cls", "name"], sort=False)
        .agg(count=("count", "sum"), total=("total", "sum"), subclass=("subclass", "first"))
        .reset_index()
    )
    classes: dict[str, TopKernelsClass] = {}
    present = set(g["cls"])
    order = [c for c in CLASS_ORDER if c in present] + sorted(present - set(CLASS_ORDER))
    for c in order:
        rows = g[g["cls"] == c].sort_values(["total", "name"], ascending=[False, True])
        total = float(rows["total"].sum()) / n_windows
        kernels = [
            TopKernel(
                name=str(k.name),
                subclass=str(k.subclass),
                count=float(k.count) / n_windows,
                total_ns=float(k.total) / n_windows,
                mean_ns=float(k.total) / float(k.count),
                share=(float(k.total) / n_windows) / step_mean if step_mean else None,
            )
            for k in rows.head(top).itertuples(index=False)
        ]
        classes[c] = TopKernelsClass(
            count=float(rows["count"].sum()) / n_windows,
            total_ns=total,
            share=total / step_mean if step_mean else None,
            kernels=kernels,
            more=max(len(rows) - top, 0),
        )
    return TopKernels(windows=n_windows, step_ns_mean=step_mean, classes=classes)


def top_kernels(
    events: pd.DataFrame, steps: pd.DataFrame, *, skip_first: int = 1, top: int = TOP
) -> TopKernels:
    """The top `top` kernels per class of a classified run (`events` with `cls`, `subclass`) in the
    steady windows of `steps` (rank, step, start_ns, end_ns).

    Returns {windows, step_ns_mean, classes: {class: {count, total_ns, share, kernels: [{name,
    subclass, count, total_ns, mean_ns, share}], more}}} where count and total_ns are per token per
    rank (floats), mean_ns per call, share = total_ns / step_ns_mean; `more` is how many names of
    the class are not listed. Per rank `rank_kernel_sums`, then `assemble_top_kernels`."""
    ev_rank = events["rank"].to_numpy(np.int64)
    per_rank = [
        rank_kernel_sums(events[ev_rank == int(r)], w, int(r), skip_first=skip_first)
        for r, w in steps.groupby("rank", sort=True)
    ]
    return assemble_top_kernels(per_rank, steps, skip_first=skip_first, top=top)
