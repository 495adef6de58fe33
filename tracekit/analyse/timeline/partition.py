"""The exact partition of each step window (docs/METHOD.md section Steps and the partition).

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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.classify.rules import GPU_KINDS
from tracekit.model.parts import PARTS

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
LAYERS: tuple[str, ...] = PARTS[:-1]


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


# ----------------------------------------------------------------------------- the partition


def _union_sorted(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The partition's union: intervals already sorted by start, empty ones kept."""
    return intervals.union(starts, ends, drop_empty=False, presorted=True)


def rank_layers(ev: pd.DataFrame) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(timeline, start, end, layer) of one rank's activity; layer indexes _LAYERS."""
    is_gpu = cat_mask(ev["kind"], GPU_KINDS)
    cls = ev["cls"]
    layer_of = {c: i for i, c in enumerate(LAYERS)}
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
        cs, ce = _union_sorted(start[on_t][o], end[on_t][o])
        cand = np.flatnonzero(cpu & (stream == t))
        if not len(cand):
            continue
        j = np.searchsorted(cs, start[cand], side="right") - 1
        ok = j >= 0
        ok[ok] = end[cand[ok]] <= ce[j[ok]]
        host_layer[cand[ok]] = layer_of["collective"]
    use = host_layer >= 0
    return "host", start[use], end[use], host_layer[use]


@dataclass
class LayerUnions:
    """One rank's cumulative layer unions: the partition's layers measured with its priority.

    `cum[k]`: the merged union of layers <= k (_LAYERS order) as sorted (starts, ends) arrays and
    the prefix sums of their lengths, so the covered time before any t is one binary search;
    `collective`: the merged union of the collective layer alone (for the overlapped collective).
    `partition_steps` measures step windows with it and `critical_path` any interval of the path:
    one build per rank serves both (`tracekit.analyse.analysed.AnalysedRun.layer_unions`)."""

    timeline: str
    cum: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (starts, ends, prefix lengths)
    collective: tuple[np.ndarray, np.ndarray]
    span: tuple[int, int] | None = None  # clipped to [lo, hi] (`clipped`): measures inside it only

    def clipped(self, lo: int, hi: int) -> LayerUnions:
        """These unions cut to [lo, hi]: `measure(a, b)` for lo <= a <= b <= hi is the same
        integers (every covered length before t in [lo, hi] drops by the same covered length
        before lo); outside the span `measure` raises. What the Dask engine's per-rank tasks send
        the critical path's step-bucket tasks (one step of one rank: a few KB)."""

        def cut(ms: np.ndarray, me: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            keep = (me > lo) & (ms < hi)
            return np.maximum(ms[keep], lo), np.minimum(me[keep], hi)

        cum = []
        for ms, me, _pre in self.cum:
            cs, ce = cut(ms, me)
            pre = np.concatenate(([0], np.cumsum(ce - cs)[:-1])) if len(cs) else np.zeros(0, dtype=np.int64)
            cum.append((cs, ce, pre.astype(np.int64)))
        return LayerUnions(self.timeline, cum, cut(*self.collective), (int(lo), int(hi)))

    def _covered(self, k: int, t: int) -> int:
        ms, me, pre = self.cum[k]
        i = int(np.searchsorted(ms, t, side="right")) - 1
        if i < 0:
            return 0
        return int(pre[i]) + min(max(t - int(ms[i]), 0), int(me[i] - ms[i]))

    def measure(self, a: int, b: int) -> dict[str, int]:
        """Exclusive per-layer time inside [a, b), by priority; the rest is idle."""
        out: dict[str, int] = {}
        if b <= a:
            return {p: 0 for p in (*LAYERS, "idle")}
        if self.span is not None and not (self.span[0] <= a and b <= self.span[1]):
            raise AssertionError(f"measure({a}, {b}) outside the clipped unions' span {self.span}")
        prev = 0
        for k, name in enumerate(LAYERS):
            c = self._covered(k, b) - self._covered(k, a)
            out[name] = c - prev
            prev = c
        out["idle"] = (b - a) - prev
        return out


def layer_unions(ev: pd.DataFrame) -> LayerUnions:
    """The LayerUnions of one rank's classified events (columns kind, cls, start_ns, end_ns, stream)."""
    timeline, s, e, layer = rank_layers(ev)
    order = np.argsort(s, kind="stable")
    s, e, layer = s[order], e[order], layer[order]
    cum = []
    for k in range(len(LAYERS)):
        sel = layer <= k
        ms, me = _union_sorted(s[sel], e[sel])
        pre = np.concatenate(([0], np.cumsum(me - ms)[:-1])) if len(ms) else np.zeros(0, dtype=np.int64)
        cum.append((ms, me, pre.astype(np.int64)))
    k_coll = LAYERS.index("collective")
    return LayerUnions(timeline, cum, _union_sorted(s[layer == k_coll], e[layer == k_coll]))


def rank_layer_unions(events: pd.DataFrame, ranks: Iterable[int]) -> dict[int, LayerUnions]:
    """LayerUnions per rank of a classified event table (each rank's rows as a slice, no copy)."""
    cols = events[["kind", "cls", "start_ns", "end_ns", "stream"]]
    selectors = rank_selectors(events["rank"].to_numpy(np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return {int(r): layer_unions(cols.iloc[selectors.get(int(r), empty)]) for r in ranks}


def partition_steps(
    events: pd.DataFrame, steps: pd.DataFrame, unions: Mapping[int, LayerUnions] | None = None
) -> pd.DataFrame:
    """Per (rank, step): window_ns and the parts `<part>_ns` for PARTS, plus
    overlapped_collective_ns and timeline ("gpu" or "host"). `events` must be classified.
    `unions`: each rank's LayerUnions when already built (else built here)."""
    if "cls" not in events.columns:
        raise ValueError("partition_steps needs a classified event table (tracekit.classify.classify)")
    rows: list[pd.DataFrame] = []
    step_ranks = sorted(int(x) for x in pd.unique(steps["rank"]))
    if unions is None or any(r not in unions for r in step_ranks):
        unions = rank_layer_unions(events, step_ranks)
    for r in step_ranks:
        st = steps[steps["rank"] == r]
        a = st["start_ns"].to_numpy(np.int64)
        b = st["end_ns"].to_numpy(np.int64)
        window = b - a
        lay = unions[r]
        timeline = lay.timeline
        parts: dict[str, np.ndarray] = {}
        prev = np.zeros(len(st), dtype=np.int64)
        for k, part in enumerate(LAYERS):
            ms, me, _pre = lay.cum[k]
            cum = intervals.covered(ms, me, a, b)
            parts[part] = cum - prev
            prev = cum
        parts["idle"] = window - prev
        cs, ce = lay.collective
        overlapped = intervals.covered(cs, ce, a, b) - parts["collective"]
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
