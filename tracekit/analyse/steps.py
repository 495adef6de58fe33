"""Step windows and the exact partition of each step (METHOD.md section 4).

`find_steps(events, pattern)` finds the step windows: host annotations whose name matches the
pattern (default `decode_step`, then `ProfilerStep#N`), one window per annotation and rank. A
window starts at its annotation and ends at the later of the annotation's end and the end of the
last GPU operation launched inside it (runtime calls within the annotation joined to GPU activity
by `correlation`), but never after the next step's annotation starts on the same rank: the windows
of a rank do not overlap, so no nanosecond is counted in two steps. When the GPU runs behind the
host, the work of a step that spills past the next annotation's start is counted in the next
window (it occupies the device then); data quality counts the clipped windows
(`step_windows_clipped`) and the spilled time (`step_window_spill_ns`).

`partition_steps(classified_events, steps)` splits every window, nanosecond by nanosecond, into
compute / memory / collective / unknown / sync / idle by priority
compute > memory > collective > unknown > sync > idle, and reports `overlapped_collective_ns`
(collective time hidden under compute or memory). Parts sum to the window exactly (asserted).

The activity timeline of a rank is its GPU activity (kernels, memcpy, memset; all streams), plus
the host's blocking sync calls for `sync`. A rank without any GPU activity (a CPU / gloo run) uses
its host timeline instead: CPU ops are compute, gloo / c10d collective ops are collective (and the
CPU ops nested inside a collective op on the same thread are part of it), blocking calls are sync.

Cost: one sort of the rank's intervals, a linear merge per priority level, and a binary search per
window edge: O(n log n + steps log n), never events x steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.classify.rules import GPU_KINDS
from tracekit.errors import StepError
from tracekit.model.events import DataQuality

#: Patterns tried in order when none is given.
DEFAULT_STEP_PATTERNS: tuple[str, ...] = (r"decode_step", r"ProfilerStep#\d+")

#: Parts of a step window, in priority order, then idle.
PARTS: tuple[str, ...] = ("compute", "memory", "collective", "unknown", "sync", "idle")
#: The columns of partition_steps' table, in order (also the breakdown's CSV columns).
PARTITION_COLUMNS: tuple[str, ...] = (
    "rank",
    "step",
    "name",
    "start_ns",
    "end_ns",
    "window_ns",
    *(f"{p}_ns" for p in PARTS),
    "overlapped_collective_ns",
    "timeline",
)
_LAYERS: tuple[str, ...] = PARTS[:-1]

_STEP_NUMBER = re.compile(r"(\d+)\s*$")

STEP_COLUMNS: tuple[str, ...] = (
    "rank",
    "step",
    "name",
    "start_ns",
    "end_ns",
    "annotation_end_ns",
    "gpu_end_ns",
)


def cat_mask(col: pd.Series, values: frozenset[str] | set[str] | tuple[str, ...]) -> np.ndarray:
    """Boolean array: `col` is one of `values`; for a categorical, computed on the codes (no
    per-event strings or hashing)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        hit = np.zeros(len(cats) + 1, dtype=bool)  # the extra last entry: code -1 (missing) -> False
        hit[: len(cats)] = [str(c) in values for c in cats]
        return hit[col.cat.codes.to_numpy()]
    return col.isin(list(values)).to_numpy()


def rank_selectors(ev_rank: np.ndarray) -> dict[int, slice | np.ndarray]:
    """rank -> the rows of that rank: a slice when the table is grouped by rank (readers and
    concat_runs write it so), else an index array (one stable argsort). O(n), not O(n x ranks)."""
    if not len(ev_rank):
        return {}
    if bool((ev_rank[1:] >= ev_rank[:-1]).all()):
        ranks = np.unique(ev_rank)
        lo = np.searchsorted(ev_rank, ranks, side="left")
        hi = np.searchsorted(ev_rank, ranks, side="right")
        return {int(r): slice(int(a), int(b)) for r, a, b in zip(ranks, lo, hi, strict=True)}
    order = np.argsort(ev_rank, kind="stable")
    sr = ev_rank[order]
    ranks = np.unique(sr)
    lo = np.searchsorted(sr, ranks, side="left")
    hi = np.searchsorted(sr, ranks, side="right")
    return {int(r): order[a:b] for r, a, b in zip(ranks, lo, hi, strict=True)}


@dataclass
class StepsResult:
    """find_steps' table plus what it noticed (for Breakdown.data_quality)."""

    steps: pd.DataFrame
    pattern: str
    data_quality: DataQuality = field(default_factory=DataQuality)


def find_steps(events: pd.DataFrame, pattern: str | None = None) -> pd.DataFrame:
    """Step windows: columns STEP_COLUMNS (one row per rank and step, sorted by rank then start).
    `end_ns` is the window's end; `annotation_end_ns` the annotation's; `gpu_end_ns` the later of
    that and the end of the GPU work launched inside the annotation, before the clip at the next
    step's start. Raises StepError when no annotation matches."""
    return find_steps_detailed(events, pattern).steps


def find_steps_detailed(events: pd.DataFrame, pattern: str | None = None) -> StepsResult:
    """find_steps plus the pattern used and data-quality counts."""
    dq = DataQuality()
    ann = events[events["kind"] == "annotation"]
    names = ann["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    cats = [str(c) for c in names.cat.categories]
    codes = names.cat.codes.to_numpy()

    patterns = (pattern,) if pattern is not None else DEFAULT_STEP_PATTERNS
    chosen: str | None = None
    mask = np.zeros(len(ann), dtype=bool)
    for pat in patterns:
        try:
            rx = re.compile(pat)
        except re.error as exc:
            raise StepError(f"invalid step pattern {pat!r}: {exc}") from None
        hit_cats = np.fromiter((bool(rx.search(c)) for c in cats), dtype=bool, count=len(cats))
        if hit_cats.any():
            mask = np.zeros(len(ann), dtype=bool)
            valid = codes >= 0
            mask[valid] = hit_cats[codes[valid]]
            if mask.any():
                chosen = pat
                break
    if chosen is None:
        counts = names.value_counts()
        top = [f"{n!r} x{c}" for n, c in counts[counts > 0].head(8).items()]
        tried = " or ".join(repr(p) for p in patterns)
        have = ", ".join(top) if top else "none"
        raise StepError(
            f"no step annotations match {tried}; annotations in the trace: {have} "
            f"(pass --step-pattern REGEX to choose one)"
        )

    sel = ann[mask]
    rank = sel["rank"].to_numpy(np.int64)
    start = sel["start_ns"].to_numpy(np.int64)
    end = sel["end_ns"].to_numpy(np.int64)
    name = sel["name"].astype(str).to_numpy(dtype=object)
    order = np.lexsort((-end, start, rank))
    rank, start, end, name = rank[order], start[order], end[order], name[order]

    # keep the outermost of nested matches (a step annotation inside another one on the same rank)
    keep = np.ones(len(rank), dtype=bool)
    for r in np.unique(rank):
        idx = np.flatnonzero(rank == r)
        e = end[idx]
        prev_max = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1]))
        keep[idx] = start[idx] >= prev_max
    nested = int((~keep).sum())
    if nested:
        dq.add(
            "nested_step_annotations",
            nested,
            f"{nested} step annotations matching {chosen!r} lie inside another one on the same rank; "
            "the outermost were kept",
        )
    rank, start, end, name = rank[keep], start[keep], end[keep], name[keep]

    step, duplicates = _step_indices(rank, name)
    if duplicates:
        per_rank = ", ".join(
            f"rank {r}: {int((rank == r).sum())} steps, {len(np.unique(name[rank == r]))} distinct names"
            for r in np.unique(rank)
        )
        dq.add(
            "duplicate_step_numbers",
            duplicates,
            f"{duplicates} step annotations matching {chosen!r} repeat a step number already seen on the "
            f"same rank ({per_rank}); they are kept as separate steps, numbered in time order on each "
            "rank. The trace probably holds more than one pass (e.g. an nsys report from a capture "
            "before the --nsys fix, which recorded the unprofiled and the traced pass): its steps mix "
            "passes and its dilation is not meaningful; re-capture, or choose steps with --step-pattern",
        )
    gpu_end = _extend_by_gpu_work(events, rank, start, end)
    window_end, clipped, spill_ns = _clip_at_next_step(rank, start, gpu_end)
    if clipped:
        dq.add("step_window_spill_ns", spill_ns)
        dq.add(
            "step_windows_clipped",
            clipped,
            f"{clipped} step windows were clipped at the next step's start on the same rank: the GPU "
            f"ran behind the host, and {spill_ns} ns of work launched in a step ran after the next step's "
            "annotation began. That time is counted in the window where it ran (windows of a rank never "
            "overlap), so a step window follows the host's annotations and the last step carries the "
            "backlog; per-token figures from such windows describe the host's pace, not the device's",
        )
    steps = pd.DataFrame(
        {
            "rank": rank.astype(np.int32),
            "step": step,
            "name": name,
            "start_ns": start,
            "end_ns": window_end,
            "annotation_end_ns": end,
            "gpu_end_ns": gpu_end,
        }
    )
    counts = steps.groupby("rank").size()
    if counts.nunique() > 1:
        dq.add(
            "ranks_with_different_step_counts",
            int(counts.nunique()),
            "ranks have different step counts: " + ", ".join(f"rank {r}: {c}" for r, c in counts.items()),
        )
    return StepsResult(steps.reset_index(drop=True), chosen, dq)


def _step_indices(rank: np.ndarray, name: np.ndarray) -> tuple[np.ndarray, int]:
    """The number at the end of each name (`decode_step#3`, `decode_step 3`, `ProfilerStep#12`)
    when every name has one and they are unique per rank; else the order on the rank.

    Also returns how many annotations repeat a number already seen on their rank (0 when some
    name has no number)."""
    numbers = np.full(len(name), -1, dtype=np.int64)
    all_numbered = True
    for i, n in enumerate(name):
        m = _STEP_NUMBER.search(n)
        if m is None:
            all_numbered = False
            break
        numbers[i] = int(m.group(1))
    duplicates = 0
    if all_numbered and len(name):
        duplicates = sum(int((rank == r).sum()) - len(np.unique(numbers[rank == r])) for r in np.unique(rank))
        if not duplicates:
            return numbers, 0
    order = np.zeros(len(name), dtype=np.int64)
    for r in np.unique(rank):
        idx = np.flatnonzero(rank == r)
        order[idx] = np.arange(len(idx))
    return order, duplicates


def _extend_by_gpu_work(
    events: pd.DataFrame, rank: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Window end = max(annotation end, end of the last GPU op launched inside the annotation)."""
    window_end = end.copy()
    if not len(rank):
        return window_end
    corr = events["correlation"].to_numpy(np.int64)
    is_launch = cat_mask(events["kind"], ("runtime",)) & (corr >= 0)
    is_gpu = cat_mask(events["kind"], GPU_KINDS) & (corr >= 0)
    if not is_launch.any() or not is_gpu.any():
        return window_end
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
        g_corr, g_end = r_corr[r_gpu], r_end[r_gpu]
        pos = np.searchsorted(l_corr, g_corr)
        pos_ok = pos < len(l_corr)
        pos_ok[pos_ok] = l_corr[pos[pos_ok]] == g_corr[pos_ok]
        if not pos_ok.any():
            continue
        step_of_gpu = k[pos[pos_ok]]
        last_end = np.full(len(s_idx), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last_end, step_of_gpu, g_end[pos_ok])
        window_end[s_idx] = np.maximum(s_end, last_end)
    return window_end


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


# ----------------------------------------------------------------------------- the partition


def _merge_sorted(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals already sorted by start: disjoint, sorted (start, end) arrays."""
    if not len(starts):
        return starts, ends
    run_end = np.maximum.accumulate(ends)
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:] - 1, [len(starts) - 1]))
    return starts[first], run_end[last]


def _covered_before(ms: np.ndarray, me: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For merged intervals (ms, me), the covered length in (-inf, t] for every t."""
    if not len(ms):
        return np.zeros(len(t), dtype=np.int64)
    lengths = me - ms
    cum = np.concatenate(([0], np.cumsum(lengths)))
    i = np.searchsorted(ms, t, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(t), dtype=np.int64)
    ii = i[ok]
    out[ok] = cum[ii] + np.clip(t[ok] - ms[ii], 0, lengths[ii])
    return out


def _measure(ms: np.ndarray, me: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of the union (ms, me) inside each window [a, b)."""
    return _covered_before(ms, me, b) - _covered_before(ms, me, a)


def _rank_layers(ev: pd.DataFrame) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(timeline, start, end, layer) of one rank's activity; layer indexes _LAYERS."""
    is_gpu = cat_mask(ev["kind"], GPU_KINDS)
    cls = ev["cls"]
    layer_of = {c: i for i, c in enumerate(_LAYERS)}
    cls_codes = cls.cat.codes.to_numpy()
    cat_layer = np.array([layer_of.get(str(c), -1) for c in cls.cat.categories], dtype=np.int64)
    layer = np.where(cls_codes >= 0, cat_layer[np.maximum(cls_codes, 0)], -1)
    start = ev["start_ns"].to_numpy(np.int64)
    end = ev["end_ns"].to_numpy(np.int64)
    sync = layer == layer_of["sync"]
    if is_gpu.any():
        use = is_gpu | sync
        return "gpu", start[use], end[use], layer[use]

    # host timeline (no GPU activity on this rank)
    kinds = ev["kind"].astype(str).to_numpy()
    stream = ev["stream"].to_numpy(np.int64)
    cls_s = np.asarray(cls.astype(str))
    coll = (cls_s == "collective") & np.isin(kinds, ["cpu_op", "annotation", "other"])
    # a CPU op is host work; `aten::item` on a CPU tensor does not wait for any device
    cpu = (kinds == "cpu_op") & np.isin(cls_s, ["host", "sync"])
    host_layer = np.full(len(ev), -1, dtype=np.int64)
    host_layer[cpu] = layer_of["compute"]
    host_layer[coll] = layer_of["collective"]
    host_layer[sync & (kinds != "cpu_op")] = layer_of["sync"]
    # CPU ops nested inside a collective op on the same thread are part of the collective
    for t in np.unique(stream[coll]):
        on_t = coll & (stream == t)
        o = np.argsort(start[on_t], kind="stable")
        cs, ce = _merge_sorted(start[on_t][o], end[on_t][o])
        cand = np.flatnonzero(cpu & (stream == t))
        if not len(cand):
            continue
        j = np.searchsorted(cs, start[cand], side="right") - 1
        ok = j >= 0
        ok[ok] = end[cand[ok]] <= ce[j[ok]]
        host_layer[cand[ok]] = layer_of["collective"]
    use = host_layer >= 0
    return "host", start[use], end[use], host_layer[use]


def partition_steps(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): window_ns and the parts `<part>_ns` for PARTS, plus
    overlapped_collective_ns and timeline ("gpu" or "host"). `events` must be classified."""
    if "cls" not in events.columns:
        raise ValueError("partition_steps needs a classified event table (tracekit.classify.classify)")
    rows: list[pd.DataFrame] = []
    # only the columns the layers need, and each rank's rows as a slice: no copy of the whole table
    cols = events[["kind", "cls", "start_ns", "end_ns", "stream"]]
    selectors = rank_selectors(events["rank"].to_numpy(np.int64))
    empty = np.zeros(0, dtype=np.int64)
    for r in sorted(int(x) for x in pd.unique(steps["rank"])):
        st = steps[steps["rank"] == r]
        a = st["start_ns"].to_numpy(np.int64)
        b = st["end_ns"].to_numpy(np.int64)
        window = b - a
        sel = selectors.get(r, empty)
        timeline, s, e, layer = _rank_layers(cols.iloc[sel])
        order = np.argsort(s, kind="stable")
        s, e, layer = s[order], e[order], layer[order]
        parts: dict[str, np.ndarray] = {}
        prev = np.zeros(len(st), dtype=np.int64)
        for k, part in enumerate(_LAYERS):
            sel = layer <= k
            ms, me = _merge_sorted(s[sel], e[sel])
            cum = _measure(ms, me, a, b)
            parts[part] = cum - prev
            prev = cum
            if part == "collective":
                cs, ce = _merge_sorted(s[layer == k], e[layer == k])
                collective_alone = _measure(cs, ce, a, b)
        parts["idle"] = window - prev
        overlapped = collective_alone - parts["collective"]
        out = pd.DataFrame(
            {
                "rank": st["rank"].to_numpy(np.int32),
                "step": st["step"].to_numpy(np.int64),
                "name": st["name"].to_numpy(dtype=object),
                "start_ns": a,
                "end_ns": b,
                "window_ns": window,
                **{f"{p}_ns": parts[p] for p in PARTS},
                "overlapped_collective_ns": overlapped,
                "timeline": timeline,
            }
        )
        rows.append(out)
    if not rows:
        table = pd.DataFrame(columns=list(PARTITION_COLUMNS))
        return table
    table = pd.concat(rows, ignore_index=True)
    check_partition(table)
    return table


def check_partition(table: pd.DataFrame) -> None:
    """Assert the invariants: every part >= 0 and the parts sum to the window exactly."""
    part_cols = [f"{p}_ns" for p in PARTS]
    values = table[part_cols].to_numpy(np.int64)
    total = values.sum(axis=1)
    window = table["window_ns"].to_numpy(np.int64)
    if (values < 0).any():
        bad = int(np.flatnonzero((values < 0).any(axis=1))[0])
        raise AssertionError(f"negative part in step row {bad}: {table.iloc[bad].to_dict()}")
    if not np.array_equal(total, window):
        bad = int(np.flatnonzero(total != window)[0])
        raise AssertionError(f"parts do not sum to the window in step row {bad}: {table.iloc[bad].to_dict()}")
    ov = table["overlapped_collective_ns"].to_numpy(np.int64)
    if (ov < 0).any():
        raise AssertionError("negative overlapped_collective_ns")
