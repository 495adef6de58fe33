"""The step windows of one rank for the chosen rule (docs/METHOD.md section Steps and the partition).

For annotation rules, one window per annotation and rank. A
window starts at its annotation and ends at the later of the annotation's end and the end of the
last GPU operation launched inside it (runtime calls within the annotation joined to GPU activity
by `correlation`), but never after the next step's annotation starts on the same rank: the windows
of a rank do not overlap, so no nanosecond is counted in two steps. When the GPU runs behind the
host, the work of a step that spills past the next annotation's start is counted in the next
window (it occupies the device then); data quality counts the clipped windows
(`step_windows_clipped`) and the spilled time (`step_window_spill_ns`). Where at least half of a
rank's windows would be clipped (`DEVICE_PACED_MIN_SHARE`) and every step launched GPU work, in
step order (an engine's overlap scheduler runs the host a step ahead), the rank's windows come from the device side instead: step k from the
first GPU operation it launched to the first one step k+1 launched, the last to the end of its own
work (`device_paced`, `step_windows_device_paced`; docs/METHOD.md, Serving engines).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.analyse.timeline.partition import cat_mask, rank_selectors
from tracekit.analyse.timeline.rules import (
    STEP_COLUMNS,
    STEP_NUMBER,
    StepChoice,
    annotation_rows,
    compile_step_pattern,
    graph_launch_mask,
    name_match_mask,
    repeat_period,
)
from tracekit.classify.rules import GPU_KINDS


@dataclass
class RankWindows:
    """One rank's step windows under the run's rule (`rank_step_windows`), before the run-level
    numbering: `rows` has STEP_COLUMNS but `step` is the order on the rank, `number` the number at
    the end of the name (-1 when none); and what the run's notes count."""

    rank: int
    rows: pd.DataFrame
    number: np.ndarray
    numbered: bool = True  # every name on the rank ends in a number (of at most 18 digits)
    duplicates: int = 0  # names repeating a number already seen on the rank (when numbered)
    distinct_names: int = 0
    nested: int = 0
    clipped: int = 0
    spill_ns: int = 0
    period: int | None = None  # CUDA-graph launches per step (rule cuda_graph_launch)
    device_paced: bool = False  # windows from the device side (the GPU ran behind the host)


def empty_step_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rank": np.zeros(0, dtype=np.int32),
            "step": np.zeros(0, dtype=np.int64),
            "name": np.zeros(0, dtype=object),
            **{c: np.zeros(0, dtype=np.int64) for c in STEP_COLUMNS[3:]},
        }
    )


def rank_step_windows(events: pd.DataFrame, choice: StepChoice) -> RankWindows:
    """One rank's step windows under the run's rule (its events only; `rank` from them)."""
    ranks = np.unique(events["rank"].to_numpy(np.int64))
    if len(ranks) > 1:
        raise ValueError(f"rank_step_windows takes one rank's events, not ranks {ranks.tolist()}")
    r = int(ranks[0]) if len(ranks) else -1
    if choice.rule == "whole_trace":
        start = events["start_ns"].to_numpy(np.int64)
        end = events["end_ns"].to_numpy(np.int64)
        gpu = cat_mask(events["kind"], GPU_KINDS)
        if gpu.any():
            start, end = start[gpu], end[gpu]
        if not len(start):
            return RankWindows(r, empty_step_rows(), np.zeros(0, dtype=np.int64))
        a, b = int(start.min()), int(max(end.max(), start.min()))
        rows = pd.DataFrame(
            {
                "rank": np.asarray([r], dtype=np.int32),
                "step": np.asarray([0], dtype=np.int64),
                "name": np.asarray(["whole trace"], dtype=object),
                **{
                    c: np.asarray([v], dtype=np.int64)
                    for c, v in zip(STEP_COLUMNS[3:], (a, b, b, b), strict=True)
                },
            }
        )
        return RankWindows(r, rows, np.asarray([0], dtype=np.int64))
    if choice.rule == "cuda_graph_launch":
        return _rank_graph_windows(events, r)
    ann = annotation_rows(events)
    sel = ann[name_match_mask(ann, compile_step_pattern(choice.pattern))]
    return _rank_ranges(
        events,
        r,
        sel["start_ns"].to_numpy(np.int64),
        sel["end_ns"].to_numpy(np.int64),
        sel["name"].astype(str).to_numpy(dtype=object),
    )


def _rank_ranges(
    events: pd.DataFrame, r: int, start: np.ndarray, end: np.ndarray, name: np.ndarray
) -> RankWindows:
    """One rank's step windows from its host ranges: nested ranges dropped, extended by the GPU
    work launched inside, clipped at the next step's start."""
    order = np.lexsort((-end, start))
    start, end, name = start[order], end[order], name[order]
    # keep the outermost of nested matches (a step annotation inside another one on the same rank)
    prev_max = (
        np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1])) if len(end) else end
    )
    keep = start >= prev_max
    nested = int((~keep).sum())
    start, end, name = start[keep], end[keep], name[keep]
    numbers = np.full(len(name), -1, dtype=np.int64)
    numbered = True
    for i, n in enumerate(name):
        m = STEP_NUMBER.search(n)
        if m is None or len(m.group(1)) > 18:  # a 40-digit "step number" does not fit int64: use the order
            numbered = False
            break
        numbers[i] = int(m.group(1))
    duplicates = len(name) - len(np.unique(numbers)) if numbered else 0
    rank = np.full(len(start), r, dtype=np.int64)
    first_gpu, gpu_end = _gpu_work_of_steps(events, rank, start, end)
    window_end, clipped, spill_ns = _clip_at_next_step(rank, start, gpu_end)
    window_start = start
    # only a GPU that ran behind the host in most steps paces them: a few windows clipped by a few
    # us (a host that opened the next annotation a little early) stay clipped
    behind = clipped > 0 and clipped >= DEVICE_PACED_MIN_SHARE * max(len(start) - 1, 1)
    paced = device_paced(first_gpu, gpu_end) if behind else None
    if paced is not None:
        # the GPU ran behind the host's annotations (an engine's overlap scheduler runs the host a
        # step ahead): each window is the device's time for the work its step launched
        window_start, window_end = paced
    rows = pd.DataFrame(
        {
            "rank": rank.astype(np.int32),
            "step": np.arange(len(start), dtype=np.int64),
            "name": name,
            "start_ns": window_start,
            "end_ns": window_end,
            "annotation_end_ns": end,
            "gpu_end_ns": gpu_end,
        }
    )
    return RankWindows(
        r,
        rows,
        numbers,
        numbered=numbered,
        duplicates=duplicates,
        distinct_names=len(np.unique(name)) if len(name) else 0,
        nested=nested,
        clipped=clipped,
        spill_ns=spill_ns,
        device_paced=paced is not None,
    )


def _rank_graph_windows(events: pd.DataFrame, r: int) -> RankWindows:
    """Rule 4 on one rank: each iteration is one period of CUDA-graph launches. The period p is the
    smallest that repeats the sequence of GPU-operation counts per launch (1 when nothing repeats);
    a step runs from its first launch to the next step's first launch (the last: to its own GPU
    work's end). No windows when the rank has fewer than two launches."""
    is_launch = graph_launch_mask(events)
    li = np.flatnonzero(is_launch)
    if len(li) < 2:
        return RankWindows(r, empty_step_rows(), np.zeros(0, dtype=np.int64))
    start = events["start_ns"].to_numpy(np.int64)
    end = events["end_ns"].to_numpy(np.int64)
    corr = events["correlation"].to_numpy(np.int64)
    gpu = cat_mask(events["kind"], GPU_KINDS) & (corr >= 0)
    li = li[np.argsort(start[li], kind="stable")]
    g_corr = np.sort(corr[gpu])
    l_corr = corr[li]
    n_ops = np.searchsorted(g_corr, l_corr, side="right") - np.searchsorted(g_corr, l_corr, side="left")
    p = repeat_period(n_ops)
    first = li[::p]
    s_ = start[first]
    e_ = np.empty(len(first), dtype=np.int64)
    e_[:-1] = s_[1:]
    e_[-1] = end[li].max()
    names = np.array([f"graph launch period {i}" for i in range(len(first))], dtype=object)
    # the GPU work of every launch in a period extends its step: the step window [first launch,
    # next period) holds the launches of the period
    out = _rank_ranges(events, r, s_, e_, names)
    out.period = p
    return out


def _extend_by_gpu_work(
    events: pd.DataFrame, rank: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Window end = max(annotation end, end of the last GPU op launched inside the annotation)."""
    return _gpu_work_of_steps(events, rank, start, end)[1]


def _gpu_work_of_steps(
    events: pd.DataFrame, rank: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per annotation: (start of the first GPU op launched inside it, or -1 when none;
    max(annotation end, end of the last GPU op launched inside it))."""
    window_end = end.copy()
    first_start = np.full(len(start), -1, dtype=np.int64)
    if not len(rank):
        return first_start, window_end
    corr = events["correlation"].to_numpy(np.int64)
    is_launch = cat_mask(events["kind"], ("runtime",)) & (corr >= 0)
    is_gpu = cat_mask(events["kind"], GPU_KINDS) & (corr >= 0)
    if not is_launch.any() or not is_gpu.any():
        return first_start, window_end
    ev_start = events["start_ns"].to_numpy(np.int64)
    ev_end = events["end_ns"].to_numpy(np.int64)
    selectors = rank_selectors(events["rank"].to_numpy(np.int64))
    for r in np.unique(rank):
        sel = selectors.get(int(r))
        if sel is None:
            continue
        s_idx = np.flatnonzero(rank == r)  # sorted by start within the rank
        s_start, s_end = start[s_idx], end[s_idx]
        r_launch, r_gpu = is_launch[sel], is_gpu[sel]
        if not r_launch.any() or not r_gpu.any():
            continue
        r_start, r_end, r_corr = ev_start[sel], ev_end[sel], corr[sel]
        l_start, l_corr = r_start[r_launch], r_corr[r_launch]
        k = np.searchsorted(s_start, l_start, side="right") - 1
        inside = k >= 0
        inside[inside] = l_start[inside] < s_end[k[inside]]
        if not inside.any():
            continue
        l_corr, k = l_corr[inside], k[inside]
        o = np.argsort(l_corr, kind="stable")
        l_corr, k = l_corr[o], k[o]
        g_corr, g_end, g_start = r_corr[r_gpu], r_end[r_gpu], r_start[r_gpu]
        pos = np.searchsorted(l_corr, g_corr)
        pos_ok = pos < len(l_corr)
        pos_ok[pos_ok] = l_corr[pos[pos_ok]] == g_corr[pos_ok]
        if not pos_ok.any():
            continue
        step_of_gpu = k[pos[pos_ok]]
        last_end = np.full(len(s_idx), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last_end, step_of_gpu, g_end[pos_ok])
        window_end[s_idx] = np.maximum(s_end, last_end)
        first = np.full(len(s_idx), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, step_of_gpu, g_start[pos_ok])
        first_start[s_idx] = np.where(first == np.iinfo(np.int64).max, -1, first)
    return first_start, window_end


#: The share of a rank's windows (of those a next step can clip) that must be clipped for its
#: windows to come from the device side (`device_paced`): the GPU ran behind the host in most steps.
DEVICE_PACED_MIN_SHARE = 0.5


def device_paced(first_start: np.ndarray, gpu_end: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Step windows from the device side (one rank, steps in order): step k from the first GPU
    operation it launched to the first one step k+1 launched (the last step: to the end of its
    own work), so the windows tile the device's timeline in launch order. None when a step
    launched no GPU work or the first operations are not in step order (the device cannot pace
    those windows)."""
    if not len(first_start) or (first_start < 0).any() or (np.diff(first_start) <= 0).any():
        return None
    end = np.empty(len(first_start), dtype=np.int64)
    end[:-1] = first_start[1:]
    end[-1] = max(int(gpu_end[-1]), int(first_start[-1]))
    return first_start.copy(), end


def _clip_at_next_step(
    rank: np.ndarray, start: np.ndarray, window_end: np.ndarray
) -> tuple[np.ndarray, int, int]:
    """Clip each window's end at the start of the next step on the same rank (rows sorted by rank
    then start, nested steps already dropped, so the next start is never before this annotation's
    end). Returns (clipped ends, how many windows were clipped, total ns cut off)."""
    out = window_end.copy()
    if len(rank) < 2:
        return out, 0, 0
    same_rank = rank[1:] == rank[:-1]
    limit = np.where(same_rank, start[1:], np.iinfo(np.int64).max)
    cut = np.flatnonzero(out[:-1] > limit)
    spill = int((out[:-1][cut] - limit[cut]).sum())
    out[cut] = limit[cut]
    return out, len(cut), spill


def assign_steps(per_rank: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """The step index of each per-rank collective row: the window of its rank that contains its
    start (windows: rank, step, start_ns, end_ns; half-open [start, end)); -1 when none."""
    out = np.full(len(per_rank), -1, dtype=np.int64)
    if per_rank.empty or windows.empty:
        return pd.Series(out, index=per_rank.index)
    for r, w in windows.sort_values(["rank", "start_ns"]).groupby("rank"):
        mask = (per_rank["rank"] == r).to_numpy()
        if not mask.any():
            continue
        s = per_rank.loc[mask, "start_ns"].to_numpy(np.int64)
        ws = w["start_ns"].to_numpy(np.int64)
        we = w["end_ns"].to_numpy(np.int64)
        i = np.searchsorted(ws, s, side="right") - 1
        ok = (i >= 0) & (s < we[np.clip(i, 0, None)])
        out[np.flatnonzero(mask)[ok]] = w["step"].to_numpy(np.int64)[i[ok]]
    return pd.Series(out, index=per_rank.index)
