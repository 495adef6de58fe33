"""One dependency graph of a run's tokens (docs/METHOD.md section "The dependency graph").

The critical path (`tracekit.analyse.critical_path`) is walked back on it and the what-if replay
(`tracekit.analyse.replay`) re-times it under each knob: both read the same nodes and edges.

**Nodes are instants** (integer nanoseconds on the aligned clock: a rank's own time minus its clock
offset): the begin and the end of every kept host call (per thread), the begin and the end of every
device operation (per stream), a marker at each step annotation's start and end, one rendezvous per
matched collective instance, and one origin per rank (the first window's start: the only fixed time).

**Edges** carry a latency and say whose time it is (rank, path part) and what it is (`ROLE_*`, the
knobs act on roles):

- host program order per thread: the gap before a call or marker (Python, dispatch, the profiler,
  folded runtime calls that launch nothing), then the call's own time (begin -> end);
- launch: a call's begin -> the operation's begin, the launch latency;
- stream order: the previous operation's end on the stream -> the next one's begin (its queue
  gap); inside one CUDA-graph replay stream order does not hold (its branches run concurrently on
  one stream), so operations of one graph launch are not chained by it;
- cross-stream (and in-graph) waits: the end of the operation on another stream that an operation
  waits for through an event (`_event_waits`: the host's `cudaEventRecord` / `cudaStreamWaitEvent`
  calls in program order), else, in a trace without them, of the one (or the one earlier in the
  same graph replay) that ended last before an operation that neither its launch nor its stream
  released;
- a collective: every member's begin (its arrival) -> the instance's rendezvous (0), which starts
  when the last rank arrives; the rendezvous -> the collective's end on each rank: its transfer;
- a host waits for the device only at a synchronising call (`cls == "sync"`: stream / device /
  event synchronize, `.item()`-style syncs; blocking copies `cudaMemcpy`): the last operation it
  waited for -> the call's end (its return latency). Asynchronous launches and collectives block
  nothing, except a long launch call that ended right after an operation ended (the launch queue
  was full: back-pressure), which gets the edge that operation's end -> the call's end.

Each node's time is the latest over its in-edges of (source time + latency). Which edge binds an
operation is read from the trace: the stream when its queue gap is under `IDLE_GAP_NS`, else its
launch when the launch latency is within `max(3 rho_typ, rho_typ + 20 us)`, else a cross wait if
one ended within `IDLE_GAP_NS` before it, else its stream (the device's own gap; its launch when it
is the first on its stream); the binding edge keeps its measured
latency and the others the rank's typical one (never more than measured), so the graph re-timed
unchanged gives back every measured time exactly.

A CPU-only (host) timeline has no separate device: its host work between collectives is a chain of
edges of its measured parts (compute, memory, unknown, sync, idle), and time between steps is host
work too (`ROLE_GAP_OUT`). No step start is frozen: the next step begins where the host's program
order brings it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from tracekit.analyse.timeline.partition import LayerUnions

#: The path parts, in report order (`critical_path.PATH_PARTS`).
PARTS: tuple[str, ...] = ("compute", "memory", "transfer", "host", "sync", "unknown")
K_COMPUTE, K_MEMORY, K_TRANSFER, K_HOST, K_SYNC, K_UNKNOWN = range(6)
_KIND_OF_CLS = {"compute": K_COMPUTE, "memory": K_MEMORY, "collective": K_TRANSFER, "sync": K_SYNC}

# edge roles
ROLE_ORIGIN = 0  # the rank's origin -> the first node of a thread / an unreleased operation
ROLE_GAP = 1  # host gap inside a step window
ROLE_GAP_OUT = 2  # host gap between step windows
ROLE_CALL = 3  # a launch call's (or other kept call's) own time
ROLE_SYNC = 4  # a synchronising call's own time (0 when it blocked: its time is ROLE_SYNC_WAIT)
ROLE_SYNC_WAIT = 5  # the awaited operation's end -> a blocking call's return
ROLE_LAUNCH = 6  # call begin -> operation begin
ROLE_QUEUE = 7  # previous operation's end on the stream -> operation begin
ROLE_CROSS = 8  # another stream's / the same graph replay's operation end -> operation begin
ROLE_OP = 9  # operation begin -> end (not a matched collective)
ROLE_ARRIVE = 10  # collective begin -> rendezvous
ROLE_XFER = 11  # rendezvous -> collective end on the rank
ROLE_BACKPRESSURE = 12  # operation end -> a long launch call's end (launch queue full)
ROLE_WORK = 13  # host timeline: a measured host-executed part (kind says which)
ROLE_LEAD = 14  # host timeline: the idle time from a segment's start to its first op
ROLE_GRAPH = 15  # inside a CUDA-graph replay: the in-graph predecessor's end -> operation begin

#: A device gap of at least this much before an operation means its stream was idle.
IDLE_GAP_NS = 2000
#: Launch latencies above this are queueing, not latency, when estimating the typical latency.
LAUNCH_LATENCY_CAP_NS = 100_000
#: A launch call at least this long (and 8x the rank's median launch call) may be back-pressure.
BACKPRESSURE_MIN_NS = 20_000
#: Disabled edges carry this latency.
NEVER = -(1 << 60)

_BLOCKING_COPY = re.compile(r"^cu(da)?Memcpy(?!.*Async)")
_GRAPH_LAUNCH = re.compile(r"GraphLaunch")


@dataclass
class RankGraph:
    """One rank's share of the graph (local node numbers); `build_rank_graph`."""

    rank: int
    timeline: str
    t: np.ndarray  # node times, aligned clock
    src: np.ndarray
    dst: np.ndarray
    lat: np.ndarray
    role: np.ndarray
    kind: np.ndarray
    seg: np.ndarray  # straggler segment: step index * 100000 + collective launches before it; -1
    calls: np.ndarray  # runtime calls the edge's host time holds (profiler deduction)
    ops: np.ndarray  # host-timeline ops / annotated ranges the edge's host time holds
    cidx: np.ndarray  # compute operation: its index among the step's compute operations; -1
    # windows: per step (in `steps` order), the start marker node and the end nodes
    steps: list[int]
    ws_node: np.ndarray
    end_nodes: list[np.ndarray]
    # matched collectives: begin (arrival) node, end node, instance, transfer, op, bytes
    c_begin: np.ndarray
    c_end: np.ndarray
    c_inst: np.ndarray
    c_x: np.ndarray
    c_op: list[str]
    c_bytes: np.ndarray
    origin: int
    notes: list[str] = field(default_factory=list)
    rho_typ: int = 5000  # the rank's typical launch latency
    q_typ: int = 1000  # the rank's typical queued gap between operations


class _Builder:
    def __init__(self) -> None:
        self.t: list[int] = []
        self.e: list[tuple[int, int, int, int, int, int, int, int, int]] = []

    def node(self, t: int) -> int:
        self.t.append(int(t))
        return len(self.t) - 1

    def edge(
        self,
        s: int,
        d: int,
        lat: int,
        role: int,
        kind: int,
        seg: int = -1,
        calls: int = 0,
        ops: int = 0,
        cidx: int = -1,
    ) -> None:
        self.e.append((s, d, int(lat), role, kind, seg, calls, ops, cidx))

    def arrays(self) -> dict[str, Any]:
        return {"t": np.asarray(self.t, dtype=np.int64), **_edge_columns(np.asarray(self.e, dtype=np.int64))}


#: the columns of an edge row (src, dst, lat, role, kind, seg, calls, ops, cidx), as RankGraph holds them
_EDGE_COLUMNS = ("src", "dst", "lat", "role", "kind", "seg", "calls", "ops", "cidx")


def _edge_columns(e: np.ndarray) -> dict[str, Any]:
    """RankGraph's edge arrays from an [n, 9] table of edge rows."""
    e = e.reshape(-1, len(_EDGE_COLUMNS))
    return {c: e[:, i].copy() for i, c in enumerate(_EDGE_COLUMNS)}


def _matched_arrays(
    c_begin: list[int],
    c_end: list[int],
    c_inst: list[int],
    c_x: list[int],
    c_op: list[str],
    c_bytes: list[int],
) -> dict[str, Any]:
    """RankGraph's matched-collective fields from the builders' per-collective lists."""
    i64 = np.int64
    return {
        "c_begin": np.asarray(c_begin, dtype=i64),
        "c_end": np.asarray(c_end, dtype=i64),
        "c_inst": np.asarray(c_inst, dtype=i64),
        "c_x": np.asarray(c_x, dtype=i64),
        "c_op": c_op,
        "c_bytes": np.asarray(c_bytes, dtype=i64),
    }


def _coll_lookup(matched: pd.DataFrame) -> dict[tuple[int, int], tuple[int, int, str]]:
    out: dict[tuple[int, int], tuple[int, int, str]] = {}
    if len(matched):
        for inst, s, e, a, op in zip(
            matched["instance"].to_numpy(np.int64),
            matched["raw_start_ns"].to_numpy(np.int64),
            matched["raw_end_ns"].to_numpy(np.int64),
            matched["arrival_raw_ns"].to_numpy(np.int64),
            matched["op"].astype(str),
            strict=True,
        ):
            out[(int(s), int(e))] = (int(inst), max(int(e) - max(int(a), int(s)), 0), str(op))
    return out


def build_rank_graph(
    events: pd.DataFrame,
    rank: int,
    windows: pd.DataFrame,
    matched: pd.DataFrame,
    offset: int,
    timeline: str,
    inst_bytes: Mapping[int, int] | None = None,
    unions: LayerUnions | None = None,
) -> RankGraph:
    """One rank's graph over its `windows` (step, start_ns, end_ns, annotation_end_ns; the rank's
    own clock; consecutive steps), its classified `events` and its rows of the matched collectives.
    Times are stored on the aligned clock (own - `offset`). `unions`: the rank's layer unions
    (`steps.layer_unions` of these events) when already built, as the AnalysedRun keeps them; a
    host-timeline graph measures its host work with them (else it builds them here)."""
    w = windows.sort_values("start_ns", kind="stable")
    if timeline == "gpu":
        return _gpu_rank(events, int(rank), w, matched, int(offset), inst_bytes or {})
    return _host_rank(events, int(rank), w, matched, int(offset), inst_bytes or {}, unions)


def _seg_id(step_i: int, k: int) -> int:
    return step_i * 100_000 + k


def _name_flags(names: np.ndarray, pattern: re.Pattern[str], search: bool = False) -> np.ndarray:
    """Per name: whether `pattern` matches it (one regex call per distinct name)."""
    if not len(names):
        return np.zeros(0, dtype=bool)
    codes, uniq = pd.factorize(names)
    f = pattern.search if search else pattern.match
    flags = np.asarray([bool(f(str(n))) for n in uniq], dtype=bool)
    return flags[codes]


def _gpu_rank(
    ev: pd.DataFrame,
    rank: int,
    w: pd.DataFrame,
    matched: pd.DataFrame,
    off: int,
    inst_bytes: Mapping[int, int],
) -> RankGraph:
    import bisect

    from tracekit.classify.rules import GPU_KINDS

    steps = [int(s) for s in w["step"]]
    n_steps = len(steps)
    ws_a = w["start_ns"].to_numpy(np.int64)
    we_a = w["end_ns"].to_numpy(np.int64)
    ae_raw = w["annotation_end_ns"].to_numpy(np.int64) if "annotation_end_ns" in w.columns else we_a.copy()
    ae_a = np.minimum(np.maximum(ae_raw, ws_a), we_a)
    lo, hi = int(ws_a.min()), int(we_a.max())
    kind = ev["kind"].astype(str).to_numpy()
    cls = ev["cls"].astype(str).to_numpy()
    names = ev["name"].astype(str).to_numpy()
    start = ev["start_ns"].to_numpy(np.int64)
    end = ev["end_ns"].to_numpy(np.int64)
    corr = ev["correlation"].to_numpy(np.int64)
    thread = ev["stream"].to_numpy(np.int64)
    n_ev = len(ev)
    # device-paced windows (steps._device_paced: an annotation that ends before its window opens):
    # the host's steps are its annotations, (previous end, own end], and the first one's launches
    # come before the first window opens
    paced = bool((ae_raw < ws_a).any())
    if paced:
        is_dev0 = np.isin(kind, list(GPU_KINDS)) & (start >= lo) & (start < int(we_a[0]))
        c0 = set(corr[is_dev0 & (corr >= 0)].tolist())
        first_launch = start[(kind == "runtime") & np.isin(corr, list(c0))] if c0 else start[:0]
        if len(first_launch):
            lo = min(lo, int(first_launch.min()))
    is_rt = (kind == "runtime") & (start >= lo) & (start < hi)
    is_dev = np.isin(kind, list(GPU_KINDS))
    rt = np.flatnonzero(is_rt)
    rt = rt[np.argsort(start[rt], kind="stable")]
    dev_all = np.flatnonzero(is_dev)
    # the runtime call that launched each device operation (its correlation's last call)
    call_of = np.full(n_ev, -1, dtype=np.int64)
    rc = rt[corr[rt] >= 0][::-1]
    if len(rc) and len(dev_all):
        uk, first = np.unique(corr[rc], return_index=True)
        callers = rc[first]
        cd = corr[dev_all]
        at = np.minimum(np.searchsorted(uk, cd), len(uk) - 1)
        hit = (cd >= 0) & (uk[at] == cd)
        call_of[dev_all[hit]] = callers[at[hit]]
    launched = dev_all[call_of[dev_all] >= 0]
    if len(rt):
        dev = launched[np.lexsort((launched, start[launched]))]
    else:  # kernels-only trace: the operations inside the windows, released from the origin
        sel = dev_all[(start[dev_all] >= lo) & (start[dev_all] < hi)]
        dev = sel[np.argsort(start[sel], kind="stable")]
    is_launching = np.zeros(n_ev, dtype=bool)
    is_launching[call_of[launched]] = True
    blocking = _name_flags(names, _BLOCKING_COPY)
    sync_like = (cls == "sync") | blocking if n_ev else cls
    b = _Builder()
    origin = b.node(lo - off)
    notes: list[str] = []

    def step_index(t: np.ndarray) -> np.ndarray:
        """The window holding host time t, else the next one (gap between steps); in device-paced
        windows the host's steps are its annotations, (previous end, own end]."""
        if paced:
            return np.minimum(np.searchsorted(ae_raw, t, side="left"), n_steps - 1)
        i = np.searchsorted(ws_a, t, side="right") - 1
        return np.minimum(np.maximum(i, 0), n_steps - 1)

    def in_window(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ws_a, t, side="right") - 1
        return (i >= 0) & (t <= ae_a[np.maximum(i, 0)])

    # --- the kept host calls: launches, synchronising calls, possible back-pressure; markers
    launch_durs = (end - start)[is_launching]
    med_launch = int(np.median(launch_durs)) if len(launch_durs) else 0
    bp_min = max(BACKPRESSURE_MIN_NS, 8 * med_launch)
    keep = rt[is_launching[rt] | sync_like[rt].astype(bool)] if len(rt) else rt
    rt_by_thread: dict[int, np.ndarray] = {}
    for th in np.unique(thread[rt]) if len(rt) else []:
        rt_by_thread[int(th)] = np.sort(start[rt[thread[rt] == th]])
    main = (
        int(pd.Series(thread[rt]).value_counts().index[0])
        if len(rt)
        else (int(thread[0]) if len(thread) else 0)
    )
    # program order per thread: by start, a step's end before the next step's start and calls at
    # one instant in their correlation order (zero-length calls share timestamps)
    items: dict[int, list[tuple[int, int, int, int, int]]] = {}  # thread -> (start, order, corr, type, idx)
    for th, s_i, c_i, i in zip(
        thread[keep].tolist(), start[keep].tolist(), corr[keep].tolist(), keep.tolist(), strict=True
    ):
        items.setdefault(th, []).append((s_i, 1, c_i, 0, i))
    for k in range(n_steps):
        items.setdefault(main, []).append((int(ws_a[k]), 0, 0, 1, k))  # window start marker
        items.setdefault(main, []).append((int(ae_a[k]), -1, 0, 2, k))  # annotation end marker
    ws_node = np.zeros(n_steps, dtype=np.int64)
    ae_node = np.zeros(n_steps, dtype=np.int64)
    coll_launches = [0] * n_steps
    coll_of = _coll_lookup(matched)
    nd = len(dev)
    ds, de = start[dev], end[dev]
    hits = [coll_of.get(k) for k in zip(ds.tolist(), de.tolist(), strict=True)] if coll_of else [None] * nd
    d_call = call_of[dev]
    # which calls launch a matched collective (straggler segments count them)
    launches_coll = np.zeros(n_ev, dtype=bool)
    hit_j = np.asarray([h is not None for h in hits], dtype=bool)
    if nd:
        launches_coll[d_call[hit_j & (d_call >= 0)]] = True
    call_begin = np.full(n_ev, -1, dtype=np.int64)
    call_end = np.full(n_ev, -1, dtype=np.int64)
    call_edge: dict[int, int] = {}
    tl, el = b.t, b.e
    for th, its in items.items():
        its.sort()
        s_v = np.asarray([x[0] for x in its], dtype=np.int64)
        typ_v = np.asarray([x[3] for x in its], dtype=np.int64)
        idx_l = [x[4] for x in its]
        starts_th = rt_by_thread.get(th, np.zeros(0, dtype=np.int64))
        # folded calls in (the previous item, this one): counted into this gap
        prev_fold = np.empty(len(s_v), dtype=np.int64)
        prev_fold[:1] = lo
        prev_fold[1:] = s_v[:-1] + (typ_v[:-1] == 0)
        n_fold = (
            np.searchsorted(starts_th, s_v, side="left") - np.searchsorted(starts_th, prev_fold, side="left")
        ).tolist()
        k_l = step_index(s_v).tolist()
        # the time before a window opens is between tokens
        role_l = np.where((typ_v != 1) & in_window(s_v), ROLE_GAP, ROLE_GAP_OUT).tolist()
        call_idx = np.asarray(
            [i if t == 0 else 0 for i, t in zip(idx_l, typ_v.tolist(), strict=True)], dtype=np.int64
        )
        ce_l = end[call_idx].tolist()
        sync_l = sync_like[call_idx].astype(bool).tolist()
        lc_l = launches_coll[call_idx].tolist()
        prev_node, prev_t, prev_begin_node, prev_begin_t = origin, lo, origin, lo
        not_main = th != main
        for s_i, typ, idx, nf, k, role, ce, is_sync, lc in zip(
            s_v.tolist(), typ_v.tolist(), idx_l, n_fold, k_l, role_l, ce_l, sync_l, lc_l, strict=True
        ):
            seg = k * 100_000 + coll_launches[k]
            is_first = prev_node == origin
            if s_i >= prev_t:
                src, gap = prev_node, s_i - prev_t
            else:  # nested in the previous call: from its begin
                src, gap = prev_begin_node, max(s_i - prev_begin_t, 0)
            tl.append(s_i - off)
            nb = len(tl) - 1
            if is_first and not_main:
                el.append((origin, nb, s_i - lo, ROLE_ORIGIN, K_HOST, -1, nf, 0, -1))
            else:
                el.append((src, nb, gap, role, K_HOST, seg, nf, 0, -1))
            if typ == 0:
                tl.append(ce - off)
                ne = len(tl) - 1
                call_begin[idx], call_end[idx] = nb, ne
                call_edge[idx] = len(el)
                if is_sync:
                    el.append((nb, ne, ce - s_i, ROLE_SYNC, K_SYNC, seg, 1, 0, -1))  # refined below
                else:
                    el.append((nb, ne, ce - s_i, ROLE_CALL, K_HOST, seg, 1, int(lc), -1))
                if lc:
                    coll_launches[k] += 1
                prev_begin_node, prev_begin_t = nb, s_i
                if ce >= prev_t:
                    prev_node, prev_t = ne, ce
            else:
                if typ == 1:
                    ws_node[idx] = nb
                else:
                    ae_node[idx] = nb
                prev_begin_node, prev_begin_t = nb, s_i
                prev_node, prev_t = nb, s_i
    n_host = len(tl)
    # --- device operations
    d_h = np.where(d_call >= 0, start[np.maximum(d_call, 0)], lo) if nd else np.zeros(0, dtype=np.int64)
    d_stream = thread[dev]
    d_graph = (
        (d_call >= 0) & _name_flags(names, _GRAPH_LAUNCH, search=True)[np.maximum(d_call, 0)]
        if nd
        else d_call >= 0
    )
    # stream predecessor: the operation on the stream that ended last before (ties: the later)
    last_on = np.full(nd, -1, dtype=np.int64)  # per operation: the stream's last-ending one before it
    for sk in np.unique(d_stream) if nd else []:
        js = np.flatnonzero(d_stream == sk)
        e = de[js]
        upd = np.ones(len(js), dtype=bool)
        upd[1:] = e[1:] >= np.maximum.accumulate(e)[:-1]
        lastpos = np.maximum.accumulate(np.where(upd, np.arange(len(js)), -1))
        last_on[js[1:]] = js[lastpos[:-1]]
    pred = last_on.copy()
    if d_graph.any():  # in a graph replay: not one of the same replay
        pred_l = pred.tolist()
        last_other_call: dict[tuple[int, int], int] = {}
        calls_l = d_call.tolist()
        for j, (sk, cj, lj, gj) in enumerate(
            zip(d_stream.tolist(), calls_l, last_on.tolist(), d_graph.tolist(), strict=True)
        ):
            key = (sk, cj)
            if gj:
                pred_l[j] = last_other_call.get(key, -1)
            if lj >= 0 and calls_l[lj] != cj:
                last_other_call[key] = lj
            if key not in last_other_call:
                last_other_call[key] = lj
        pred = np.asarray(pred_l, dtype=np.int64)
    # inside one CUDA-graph replay: each operation after the first waits for the one of the same
    # replay that ended last before it began (branches may run concurrently on one stream)
    gpred = np.full(nd, -1, dtype=np.int64)
    first_rho: dict[int, int] = {}
    in_graph: dict[int, tuple[list[int], list[int]]] = {}
    for j in np.flatnonzero(d_graph).tolist():
        c = int(d_call[j])
        ends_c, idx_c = in_graph.setdefault(c, ([], []))
        if not ends_c:
            first_rho[c] = int(ds[j] - d_h[j])
        else:
            m = bisect.bisect_right(ends_c, int(ds[j])) - 1
            if m >= 0:
                gpred[j] = idx_c[m]
        m2 = bisect.bisect_right(ends_c, int(de[j]))
        ends_c.insert(m2, int(de[j]))
        idx_c.insert(m2, j)
    rho = np.where(d_call >= 0, ds - d_h, ds - lo)
    p0 = np.maximum(pred, 0)
    q = np.where(pred >= 0, ds - de[p0], np.iinfo(np.int64).max)
    ev_pred = _event_waits(
        rt, set(np.flatnonzero(is_launching).tolist()), names, thread, start, d_call, d_stream
    )
    has_events = bool((ev_pred >= 0).any())
    # an operation waiting for an event queued behind the later of its stream and its event
    ev0 = np.maximum(ev_pred, 0)
    ev_end = de[ev0]
    via_ev = (ev_pred >= 0) & (ev_end <= ds) & ((pred < 0) | (ev_end > de[p0]))
    q_eff = np.where(via_ev, ds - ev_end, q)
    idle = q_eff >= IDLE_GAP_NS
    lb = idle & (d_call >= 0) & (rho < LAUNCH_LATENCY_CAP_NS)
    rho_typ = int(np.median(rho[lb])) if lb.any() else 5000
    rho_bound = max(3 * rho_typ, rho_typ + 20_000)
    # an operation inside a graph replay after its first: its gap from the operation before the replay
    # is its offset in the replay, not a queued gap (it would set q_typ to ~the replay length)
    queued = ((pred >= 0) | via_ev) & (gpred < 0) & ~(idle & (rho <= rho_bound))
    # the device's own gap is seen where the launch did not bind: an operation released later than
    # its launch at the typical latency (beyond the launch latencies' own spread) waited for its
    # stream. A launch-bound operation's gap is its launch's lateness (short launches leave gaps
    # under IDLE_GAP_NS), not the device's; only when no operation had slack are they all there is
    spread = int(np.percentile(rho[lb], 90)) - rho_typ if lb.any() else 0
    slack = queued & (rho > rho_typ + max(spread, 0))
    qq = q_eff[slack] if slack.any() else q_eff[queued]
    q_typ = int(max(np.median(qq), 0)) if len(qq) else 1000
    # cross waits: the operation that ended last before j (any stream), by end time
    end_order = np.argsort(de, kind="stable")
    ends_sorted = de[end_order]
    d_begin = n_host + 2 * np.arange(nd, dtype=np.int64)
    d_end = d_begin + 1
    jj = np.arange(nd, dtype=np.int64)
    kk = step_index(np.where(d_call >= 0, d_h, ds)) if nd else jj
    in_step = (
        ((d_call >= 0) & (d_h <= ae_a[kk]) & (d_h >= ws_a[kk]))
        | ((d_call < 0) & (ws_a[kk] <= ds) & (ds < we_a[kk]))
        if nd
        else jj >= 0
    )
    if paced:  # device-paced windows: an operation is in the host step it was launched in
        in_step = in_step | (d_call >= 0)
    m = np.searchsorted(ends_sorted, ds, side="right") - 1
    for _ in range(2):  # not itself nor its stream predecessor
        mm = np.maximum(m, 0)
        m = np.where((m >= 0) & ((end_order[mm] == jj) | (end_order[mm] == pred)), m - 1, m)
    mm = np.maximum(m, 0)
    cc = end_order[mm] if nd else jj
    cross_ok = (
        ((m >= 0) & (ds - ends_sorted[mm] < IDLE_GAP_NS) & (ds[cc] < ds) & ((pred < 0) | (de[cc] > de[p0])))
        if nd
        else jj >= 0
    )
    if has_events:  # the event each operation waits for, as its host's calls say (not the nearest end)
        cross_ok = (ev_pred >= 0) & (ev_pred != pred) & (ev_end <= ds)
        cc = ev0
        cross_ready = ev_end + np.minimum(ds - ev_end, q_typ)
    else:  # no event calls: the operation that ended just before it on another stream
        cross_ready = de[cc]
    has_q = (pred >= 0) & (q >= 0)
    has_p = pred >= 0
    has_l = (d_call >= 0) & (rho >= 0)
    # which released it: of its launch, its stream and the operation that ended last before it
    # on another stream, the one that would have released it latest at typical latencies
    best_r = np.full(nd, np.iinfo(np.int64).min, dtype=np.int64)
    best_p = np.full(nd, -1, dtype=np.int64)
    which = np.full(nd, 2, dtype=np.int64)
    for has, ready, pref, wch in (
        (has_p, np.where(has_q, de[p0] + np.minimum(q, q_typ), ds), 2, 0),
        (cross_ok, cross_ready, 1, 1),
        (has_l, d_h + np.minimum(rho, rho_typ), 0, 2),
    ):
        better = has & ((ready > best_r) | ((ready == best_r) & (pref > best_p)))
        best_r = np.where(better, ready, best_r)
        best_p = np.where(better, pref, best_p)
        which = np.where(better, wch, which)
    in_g = gpred >= 0
    if has_events:  # an event wait that did not bind is kept, at the typical gap
        cross = cross_ok & ~in_g
        cross_lat = np.where(which == 1, ds - de[cc], np.minimum(ds - de[cc], q_typ))
    else:
        cross = cross_ok & (which == 1) & ~in_g
        cross_lat = ds - de[cc]
    stream_bound, launch_bound = which == 0, which == 2
    cb = call_begin[np.maximum(d_call, 0)]
    e_parts: list[tuple[np.ndarray, ...]] = []  # (j, sub, src, dst, lat, role, kind, cidx)

    def add(
        mask: np.ndarray,
        sub: int,
        s: Any,
        lat: np.ndarray,
        role: int,
        kd: Any = K_HOST,
        cidx: Any = -1,
        into: np.ndarray = d_begin,
    ) -> None:
        sel = np.flatnonzero(mask)
        if len(sel):

            def pick(x: Any) -> np.ndarray:
                return x[sel] if isinstance(x, np.ndarray) else np.full(len(sel), x, dtype=np.int64)

            e_parts.append(
                (sel, np.full(len(sel), sub), pick(s), into[sel], pick(lat), pick(role), pick(kd), pick(cidx))
            )

    g_p, ng = in_g, ~in_g
    gp0 = np.maximum(gpred, 0)
    # in a graph replay: its in-graph predecessor binds it
    add(g_p, 0, d_end[gp0], ds - de[gp0], ROLE_GRAPH)
    add(g_p & has_q, 1, d_end[p0], np.minimum(q, q_typ), ROLE_QUEUE)
    if g_p.any():
        fr = np.asarray([first_rho.get(int(c), 0) for c in d_call], dtype=np.int64)
        has_fr = np.asarray([int(c) in first_rho for c in d_call], dtype=bool)
        lat_g = np.where(has_fr, np.minimum(rho, fr), rho)
        add(g_p & (lat_g >= 0), 2, cb, lat_g, ROLE_LAUNCH)
    # the edges into the operation's begin (stream first: the path prefers it on ties)
    add(ng & has_q, 0, d_end[p0], np.where(stream_bound, q, np.minimum(q, q_typ)), ROLE_QUEUE)
    # it began before its predecessor ended (overlapping records): after its begin
    add(ng & has_p & ~has_q, 0, d_begin[p0], np.maximum(ds - ds[p0], 0), ROLE_QUEUE)
    add(cross, 1, d_end[cc], cross_lat, ROLE_CROSS)
    add(ng & has_l, 2, cb, np.where(launch_bound, rho, np.minimum(rho, rho_typ)), ROLE_LAUNCH)
    add(ng & (d_call >= 0) & (rho < 0) & ~has_p & ~cross, 2, np.int64(origin), ds - lo, ROLE_ORIGIN)
    add(
        ng & (d_call < 0),
        2,
        np.int64(origin),
        np.where(launch_bound, ds - lo, np.minimum(ds - lo, rho_typ)),
        ROLE_ORIGIN,
    )
    n_cross = int(cross.sum())
    # the operation's own time (a matched collective's goes through its rendezvous)
    kd_of = {c: _KIND_OF_CLS.get(c, K_UNKNOWN) for c in pd.unique(cls[dev])} if nd else {}
    kd = np.asarray([kd_of[c] for c in cls[dev]], dtype=np.int64) if nd else jj
    comp = ~hit_j & (kd == K_COMPUTE)
    ci = np.full(nd, -1, dtype=np.int64)
    cj = np.flatnonzero(comp)
    if len(cj):
        kv = kk[cj]
        o = np.argsort(kv, kind="stable")
        ks = kv[o]
        rank_in = np.arange(len(ks)) - np.searchsorted(ks, ks, side="left")
        ci[cj[o]] = ks * 100_000 + rank_in
    add(~hit_j, 3, d_begin, de - ds, ROLE_OP, kd, ci, into=d_end)
    c_begin, c_end, c_inst, c_x, c_op, c_bytes = [], [], [], [], [], []
    for j in np.flatnonzero(hit_j).tolist():
        hit = hits[j]
        assert hit is not None
        c_begin.append(int(d_begin[j]))
        c_end.append(int(d_end[j]))
        c_inst.append(hit[0])
        c_x.append(hit[1])
        c_op.append(hit[2])
        c_bytes.append(int(inst_bytes.get(hit[0], -1)))
    if n_cross:
        notes.append(f"rank {rank}: {n_cross} operation(s) released by another stream's (cross-stream waits)")
    # --- synchronising calls and back-pressure: the host waits for the device
    op_call_begin = d_h
    n_bp = 0
    de_sorted_idx = np.argsort(de, kind="stable")
    de_sorted = de[de_sorted_idx]
    sync_edges: list[tuple[int, int, int, int, int, int, int, int, int]] = []
    durs = end - start
    cand_calls = (
        keep[sync_like[keep].astype(bool) | (is_launching[keep] & (durs[keep] >= bp_min))]
        if len(keep)
        else keep
    )
    for i in cand_calls.tolist():
        cs, ce = int(start[i]), int(end[i])
        is_sync = bool(sync_like[i])
        long_launch = (not is_sync) and bool(is_launching[i]) and ce - cs >= bp_min
        if not is_sync and not long_launch:
            continue
        own = bool(blocking[i])
        # the operation it waits for: the latest-ending one launched before it that ended by its
        # return (a synchronising call depends on it whether or not it blocked in this trace)
        m_i = int(np.searchsorted(de_sorted, ce, side="right")) - 1
        floor = cs if long_launch else lo
        dj = -1
        while m_i >= 0 and int(de_sorted[m_i]) > floor:
            c = int(de_sorted_idx[m_i])
            before = op_call_begin[c] < cs or (op_call_begin[c] == cs and int(corr[d_call[c]]) < int(corr[i]))
            if before or (own and int(d_call[c]) == i):
                dj = c
                break
            m_i -= 1
        if dj < 0:
            continue
        eps = ce - int(de[dj])
        nb, ne = int(call_begin[i]), int(call_end[i])
        if is_sync:
            if int(de[dj]) > cs:  # it blocked: its time is the wait, then its return latency
                el[call_edge[i]] = (nb, ne, 0, *el[call_edge[i]][3:])
                sync_edges.append((int(d_end[dj]), ne, eps, ROLE_SYNC_WAIT, K_SYNC, -1, 0, 0, -1))
            else:  # it did not block here: had the device been later, it would have
                sync_edges.append((int(d_end[dj]), ne, ce - cs, ROLE_SYNC_WAIT, K_SYNC, -1, 0, 0, -1))
        elif int(de[dj]) > cs and eps <= 4 * med_launch + 2000:
            n_bp += 1
            el[call_edge[i]] = (nb, ne, min(ce - cs, med_launch), *el[call_edge[i]][3:])
            sync_edges.append((int(d_end[dj]), ne, eps, ROLE_BACKPRESSURE, K_HOST, -1, 0, 0, -1))
    if n_bp:
        notes.append(f"rank {rank}: {n_bp} launch call(s) waited for a launch-queue slot (back-pressure)")
    t_dev = np.empty(2 * nd, dtype=np.int64)
    t_dev[0::2] = ds - off
    t_dev[1::2] = de - off
    t_now = np.concatenate((np.asarray(tl, dtype=np.int64), t_dev))
    # the operations each step launched (in launch order), its end nodes with its annotation's end
    so = np.flatnonzero(in_step)
    so = so[np.argsort(kk[so], kind="stable")]
    cut = np.searchsorted(kk[so], np.arange(n_steps + 1))
    end_nodes = [
        _window_end_nodes(
            t_now,
            [int(ae_node[k]), *d_end[so[cut[k] : cut[k + 1]]].tolist()],
            int(we_a[k]) - off,
            d_begin,
            ws_node[k + 1 :],
        )
        for k in range(n_steps)
    ]
    host_e = np.asarray(el, dtype=np.int64).reshape(-1, 9)
    sync_e = np.asarray(sync_edges, dtype=np.int64).reshape(-1, 9)
    if e_parts:
        jv, sv, srcv, dstv, latv, rolev, kdv, civ = (np.concatenate(x) for x in zip(*e_parts, strict=True))
        o = np.lexsort((sv, jv))
        dev_e = np.zeros((len(o), 9), dtype=np.int64)
        dev_e[:, 0], dev_e[:, 1], dev_e[:, 2] = srcv[o], dstv[o], latv[o]
        dev_e[:, 3], dev_e[:, 4], dev_e[:, 5], dev_e[:, 8] = rolev[o], kdv[o], -1, civ[o]
    else:
        dev_e = np.zeros((0, 9), dtype=np.int64)
    e = np.concatenate((host_e, dev_e, sync_e))
    return RankGraph(
        rank=rank,
        timeline="gpu",
        steps=steps,
        ws_node=ws_node,
        end_nodes=end_nodes,
        **_matched_arrays(c_begin, c_end, c_inst, c_x, c_op, c_bytes),
        origin=origin,
        notes=notes,
        rho_typ=rho_typ,
        q_typ=q_typ,
        t=t_now,
        **_edge_columns(e),
    )


_RECORD = re.compile(r"^cu(da)?EventRecord")
_WAIT_EVENT = re.compile(r"^cu(da)?StreamWaitEvent")


def _event_waits(
    rt: np.ndarray,
    launching: set[int],
    names: np.ndarray,
    thread: np.ndarray,
    start: np.ndarray,
    d_call: np.ndarray,
    d_stream: np.ndarray,
) -> np.ndarray:
    """Per device operation, the operation its stream waits for through an event (-1: none), from
    the host's calls in program order: an operation launched after a `cudaStreamWaitEvent` (since the
    thread's previous launch) waits for the event of the last `cudaEventRecord` before that wait,
    which holds the operation launched last before the record on another stream than its own (a
    record on its own stream adds nothing to stream order). The trace names no event, so this is
    the pairing of eager NCCL's record / wait around each collective."""
    out = np.full(len(d_call), -1, dtype=np.int64)
    if not len(rt):
        return out
    ops_of: dict[int, list[int]] = {}
    for j, c in enumerate(d_call.tolist()):
        if c >= 0:
            ops_of.setdefault(int(c), []).append(j)
    is_rec = {int(i) for i in rt if _RECORD.match(str(names[i]))}
    is_wait = {int(i) for i in rt if _WAIT_EVENT.match(str(names[i]))}
    if not is_wait:
        return out
    per_thread: dict[int, list[int]] = {}
    for i in rt.tolist():
        if i in launching or i in is_rec or i in is_wait:
            per_thread.setdefault(int(thread[i]), []).append(int(i))
    for calls in per_thread.values():
        history: list[int] = []  # launched operations in program order
        rec_at: int | None = None  # len(history) at the last record
        waits: list[int] = []  # the records the waits since the last launch refer to
        for i in calls:
            if i in is_rec:
                rec_at = len(history)
            elif i in is_wait:
                if rec_at is not None:
                    waits.append(rec_at)
            else:
                for j in ops_of.get(i, []):
                    for at in waits:
                        for jj in reversed(history[max(at - 64, 0) : at]):
                            if int(d_stream[jj]) != int(d_stream[j]):
                                if out[j] < 0 or jj > out[j]:
                                    out[j] = jj
                                break
                history.extend(ops_of.get(i, []))
                waits = []
    return out


def _window_end_nodes(
    t: np.ndarray, own: list[int], we: int, d_begin: np.ndarray, later_starts: np.ndarray
) -> np.ndarray:
    """A GPU window's end nodes: the step's own (its annotation's end, the ends of the operations
    it launched), so that the latest of them is the window's end `we` (aligned clock). A window
    clipped at the next step's start, or a device-paced one (steps.py: it ends where the next
    step's first operation begins), ends at a node that is not the step's own: then the own nodes
    after `we` are left out and the node at `we` is taken (an operation's begin first, else the
    next window's start marker)."""
    own_a = np.asarray(own, dtype=np.int64)
    if int(t[own_a].max()) == we:
        return own_a
    at = np.concatenate((d_begin[t[d_begin] == we], later_starts[t[later_starts] == we]))
    if not len(at):  # no node at the window's end: the step's own nodes, as measured
        return own_a
    return np.concatenate((own_a[t[own_a] <= we], at[:1])).astype(np.int64)


def _host_rank(
    ev: pd.DataFrame,
    rank: int,
    w: pd.DataFrame,
    matched: pd.DataFrame,
    off: int,
    inst_bytes: Mapping[int, int],
    unions: LayerUnions | None = None,
) -> RankGraph:
    from tracekit.analyse.timeline.partition import layer_unions

    lay = unions if unions is not None else layer_unions(ev[["kind", "cls", "start_ns", "end_ns", "stream"]])
    busy_s, busy_e = lay.cum[-1][0], lay.cum[-1][1]
    steps = [int(s) for s in w["step"]]
    ws_a = w["start_ns"].to_numpy(np.int64)
    we_a = w["end_ns"].to_numpy(np.int64)
    lo = int(ws_a.min())
    b = _Builder()
    origin = b.node(lo - off)
    cur, cur_t = origin, lo
    ws_node = np.zeros(len(steps), dtype=np.int64)
    end_nodes: list[np.ndarray] = []
    c_begin, c_end, c_inst, c_x, c_op, c_bytes = [], [], [], [], [], []
    coll = matched.sort_values("raw_start_ns") if len(matched) else matched
    cs_all = coll["raw_start_ns"].to_numpy(np.int64) if len(coll) else np.zeros(0, dtype=np.int64)

    def chain(a: int, bnd: int, seg: int, out: bool) -> None:
        """Host work [a, bnd) as edges of its measured parts."""
        nonlocal cur, cur_t
        if bnd <= a:
            return
        m = lay.measure(a, bnd)
        k0 = int(np.searchsorted(busy_e, a, side="right"))
        lead = max(int(busy_s[k0]) - a, 0) if k0 < len(busy_s) and busy_s[k0] < bnd else bnd - a
        lead = min(lead, m["idle"])
        lo_i, hi_i = np.searchsorted(busy_s, [a, bnd], side="left")
        n_ops = max(int(hi_i) - int(lo_i), 0)
        pieces = [
            (lead, ROLE_LEAD, K_HOST, 0),
            (m["compute"], ROLE_WORK, K_COMPUTE, 0),
            (m["memory"], ROLE_WORK, K_MEMORY, 0),
            (m["unknown"], ROLE_WORK, K_UNKNOWN, 0),
            (m["sync"], ROLE_SYNC, K_SYNC, 0),
            (m["idle"] - lead + m["collective"], ROLE_GAP_OUT if out else ROLE_GAP, K_HOST, n_ops),
        ]
        for lat, role, kd, nops in pieces:
            if lat <= 0 and role != ROLE_GAP and role != ROLE_GAP_OUT:
                continue
            n = b.node(cur_t + lat - off)
            b.edge(cur, n, lat, role, kd, seg=seg, ops=nops)
            cur, cur_t = n, cur_t + lat

    for k in range(len(steps)):
        ws, we = int(ws_a[k]), int(we_a[k])
        chain(cur_t, ws, _seg_id(k, 0), True)
        if cur_t != ws:  # overlapping windows: jump (never backwards)
            n = b.node(ws - off)
            b.edge(cur, n, max(ws - cur_t, 0), ROLE_GAP_OUT, K_HOST, seg=_seg_id(k, 0))
            cur, cur_t = n, max(ws, cur_t)
        ws_node[k] = cur
        a0, a1 = np.searchsorted(cs_all, [ws, we], side="left")
        kk = 0
        for row in range(int(a0), int(a1)):
            s, e = int(coll["raw_start_ns"].iloc[row]), int(coll["raw_end_ns"].iloc[row])
            a = int(coll["arrival_raw_ns"].iloc[row])
            if s < cur_t:
                continue
            chain(cur_t, s, _seg_id(k, kk), False)
            inst = int(coll["instance"].iloc[row])
            c_begin.append(cur)
            ne = b.node(e - off)
            c_end.append(ne)
            c_inst.append(inst)
            c_x.append(max(e - max(a, s), 0))
            c_op.append(str(coll["op"].iloc[row]))
            c_bytes.append(int(inst_bytes.get(inst, -1)))
            cur, cur_t = ne, e
            kk += 1
        chain(cur_t, we, _seg_id(k, kk), False)
        end_nodes.append(np.asarray([cur], dtype=np.int64))
    arr = b.arrays()
    return RankGraph(
        rank=rank,
        timeline="host",
        steps=steps,
        ws_node=ws_node,
        end_nodes=end_nodes,
        **_matched_arrays(c_begin, c_end, c_inst, c_x, c_op, c_bytes),
        origin=origin,
        **arr,
    )


# ------------------------------------------------------------------------------------------
# the run's graph


@dataclass
class Graph:
    """The run's graph: every rank's nodes and edges, joined at the collectives' rendezvous."""

    ranks: list[int]
    timeline: str
    steps: list[int]
    offsets: dict[int, int]
    t: np.ndarray  # measured node times (aligned)
    node_rank: np.ndarray
    src: np.ndarray  # edges, grouped by destination in topological order (CSR: indptr)
    dst: np.ndarray
    lat: np.ndarray
    role: np.ndarray
    kind: np.ndarray
    erank: np.ndarray
    seg: np.ndarray
    calls: np.ndarray
    ops: np.ndarray
    cidx: np.ndarray
    xfer_op: list[str]  # per edge of ROLE_XFER, in edge order: the op and bytes (probe knob)
    xfer_bytes: np.ndarray
    order: np.ndarray  # nodes with in-edges, topological
    indptr: np.ndarray  # per node (node numbering): its in-edges are src[indptr[n]:indptr[n+1]]
    ws_node: np.ndarray  # [rank_i, step_i]
    end_nodes: list[list[np.ndarray]]  # [rank_i][step_i]
    notes: list[str] = field(default_factory=list)
    rho_typ: dict[int, int] = field(default_factory=dict)
    q_typ: dict[int, int] = field(default_factory=dict)
    xfer_inst: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per ROLE_XFER edge

    @property
    def n_nodes(self) -> int:
        return len(self.t)

    def times(self, lat: np.ndarray | None = None) -> np.ndarray:
        """Every node's time with these edge latencies (the measured ones when None): each node the
        latest over its in-edges of source + latency (nodes without in-edges keep their measured
        time); integer ns. `times_many` for several latency vectors at once."""
        lat_a = self.lat if lat is None else np.asarray(lat, dtype=np.int64)
        return self.times_many(lat_a[:, None])[:, 0]

    def times_many(self, lat: np.ndarray) -> np.ndarray:
        """`times` for C latency vectors at once: `lat` is (edges, C), the result (nodes, C).
        Exact integer arithmetic, the same numbers as one `times` call per column (the
        forward pass of `_Forward`)."""
        lat_a = np.asarray(lat, dtype=np.int64)
        return self._forward(lat_a.shape[1]).run([lat_a[:, i] for i in range(lat_a.shape[1])], self.t)

    def periods_of(self, lats: Sequence[np.ndarray]) -> np.ndarray:
        """`periods(times(lat))` for each of the latency vectors `lats`: (steps, len(lats)),
        without holding every node's time for every vector."""
        flat, starts = self._end_index
        ws_flat = self.ws_node.reshape(-1)
        sel = self._forward(len(lats)).run(list(lats), self.t, np.concatenate((ws_flat, flat)))
        ws = sel[: len(ws_flat)].reshape(*self.ws_node.shape, len(lats))
        if len(flat):
            we = np.maximum.reduceat(sel[len(ws_flat) :], starts, axis=0).reshape(ws.shape)
        else:
            we = ws.copy()
        end = we.max(axis=0)
        out = np.empty((len(self.steps), len(lats)), dtype=np.int64)
        if len(out):
            out[0] = (we[:, 0] - ws[:, 0]).max(axis=0)
            out[1:] = np.diff(end, axis=0)
        return out

    def _forward(self, n_cols: int) -> _Forward:
        """The forward pass for `n_cols` latency columns: blocks of `FORWARD_BLOCK_NARROW` nodes
        for a few columns (the correction's one-setting replays), `FORWARD_BLOCK` for more."""
        key = "_fw1" if n_cols <= FORWARD_NARROW_COLS else "_fw"
        fw = self.__dict__.get(key)
        if fw is None:
            if key == "_fw1":
                fw = _Forward(self, FORWARD_BLOCK_NARROW)
            else:
                fw = _Forward(self, FORWARD_BLOCK, FORWARD_SLICES_UP_TO)
            self.__dict__[key] = fw
        return fw

    def windows(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per [rank_i, step_i], the window start and end at these node times (`t` of shape
        (nodes,), or (nodes, C): then each result has a last axis of C)."""
        ws = t[self.ws_node]
        flat, starts = self._end_index
        if not len(flat):
            return ws, ws.copy()
        we = np.maximum.reduceat(t[flat], starts, axis=0).reshape(ws.shape)
        return ws, we

    @property
    def _end_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Every window's end nodes in one array ([rank_i][step_i] order) and where each starts."""
        got = self.__dict__.get("_ends")
        if got is None:
            per = [nodes for rank in self.end_nodes for nodes in rank]
            lens = np.asarray([len(x) for x in per], dtype=np.int64)
            flat = np.concatenate(per).astype(np.int64) if per else np.zeros(0, dtype=np.int64)
            got = (flat, np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64) if per else flat)
            self.__dict__["_ends"] = got
        return got

    def step_times(self, t: np.ndarray) -> np.ndarray:
        """Per step, the longest window (the step time the accounting uses)."""
        ws, we = self.windows(t)
        return (we - ws).max(axis=0)

    def path_spans(self, t: np.ndarray) -> np.ndarray:
        """Per step (`t` of shape (nodes,)), how long a range of it the critical path covers: the
        window of the rank that ends it last (ties: the lowest rank), the rank the walk starts on,
        cut at the previous step's latest end (its period, when that is shorter: a window opened
        before the previous token ended holds time of that token, which the walk books there, so
        the walk stays one chain; docs/METHOD.md section The dependency graph). Another rank's
        longer window (one opened early, in a gap between tokens) is the step time's, not the
        path's: what it adds is the path's offset."""
        ws, we = self.windows(t)
        if not ws.shape[0]:
            return (we - ws).max(axis=0)
        i_end = np.argmax(we, axis=0)
        cols = np.arange(ws.shape[1])
        span = we[i_end, cols] - ws[i_end, cols]
        if len(span) > 1:
            per = np.diff(we.max(axis=0))
            span[1:] = np.where(per > 0, np.minimum(per, span[1:]), span[1:])
        return span

    def periods(self, t: np.ndarray) -> np.ndarray:
        """Per step, the time from the previous step's end (the latest window end over ranks) to
        its own: what a token costs when nothing between steps is frozen. The first step: its
        longest window. `t` (nodes,) or (nodes, C): the result (steps,) or (steps, C)."""
        ws, we = self.windows(t)
        end = we.max(axis=0)
        out = np.empty((len(self.steps), *t.shape[1:]), dtype=np.int64)
        if len(out):
            out[0] = (we[:, 0] - ws[:, 0]).max(axis=0)
            out[1:] = np.diff(end, axis=0)
        return out

    def __getstate__(self) -> dict[str, Any]:
        # the forward pass and the end index are rebuilt on use (not shipped to Dask workers)
        return {k: v for k, v in self.__dict__.items() if k not in ("_fw", "_fw1", "_ends")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


# ------------------------------------------------------------------------------------------
# the forward pass: every node the latest of its in-edges, for many latency vectors at once

#: Lower bound of every replayed time (a node not reached yet in the fixpoint iteration).
_FLOOR = -(1 << 62)
#: Nodes per block of the forward pass: per block the pass is a few array operations per
#: iteration, so larger blocks cost less for one column and more for many (the h200-tp2 graph,
#: 117k nodes: one column 0.040 s at 512, 0.021 s at 2048; 32 columns 0.32 s at 512, 0.42 s at 2048)
FORWARD_BLOCK = 512
FORWARD_BLOCK_NARROW = 2048
#: at most this many columns take the narrow pass's larger blocks
FORWARD_NARROW_COLS = 4
#: in the wide pass, a block whose chain pieces are at most this long takes one slice per index
#: along them instead of the doubling steps (h200-tp2 at 32 columns: 0.47 s sliced, 0.53 s doubled)
FORWARD_SLICES_UP_TO = 128
#: rounds of the chain parents' choice (module `_Forward`): each gives the nodes whose edge lost
#: their next one; what is left after them is not chained (exact either way, only slower)
CHAIN_ROUNDS = 8
# which edges may chain two nodes (host program order first, then stream order, then through a
# rendezvous); the edges that can be disabled (NEVER) never chain
_CHAIN_PRIORITY = np.full(32, 99, dtype=np.int64)
_CHAIN_PRIORITY[[ROLE_GAP, ROLE_GAP_OUT, ROLE_CALL, ROLE_SYNC, ROLE_WORK, ROLE_LEAD]] = 0
_CHAIN_PRIORITY[[ROLE_QUEUE, ROLE_OP]] = 1
_CHAIN_PRIORITY[[ROLE_XFER, ROLE_ARRIVE]] = 2
_CHAIN_PRIORITY[ROLE_GRAPH] = 3


def _lexsort(keys: Sequence[np.ndarray], unique: bool = False) -> np.ndarray:
    """`np.lexsort(keys)`'s order (the last key primary) by one argsort of the keys packed into
    one int64, where the product of their ranges stays under 2**62 (else `np.lexsort` itself);
    `unique`: no two rows have equal keys (one of them is a permutation), so an unstable sort
    gives the same order. One sort of one array instead of one stable sort per key."""
    n = len(keys[0]) if len(keys) else 0
    if not n:
        return np.lexsort(keys)
    cols = [np.asarray(k).astype(np.int64, copy=False) for k in reversed(keys)]  # primary first
    lows = [int(c.min()) for c in cols]
    spans = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    total = 1
    for sp in spans:
        total *= sp
    if total >= 1 << 62:
        return np.lexsort(keys)
    packed = cols[0] - lows[0]
    for c, lo, sp in zip(cols[1:], lows[1:], spans[1:], strict=True):
        packed = packed * sp + (c - lo)
    return np.argsort(packed, kind=None if unique else "stable")


def _first_of_runs(keys: np.ndarray) -> np.ndarray:
    """True at the first element of each run of equal keys."""
    out = np.ones(len(keys), dtype=bool)
    out[1:] = keys[1:] != keys[:-1]
    return out


class _Forward:
    """The forward pass of a graph, precomputed once (docs/METHOD.md section "The dependency graph").

    The graph's nodes are split into chains (each node keeps at most one in-edge as its chain
    parent, each node at most one chain child: host program order, stream order), and its
    topological order into blocks of `FORWARD_BLOCK` nodes. Along a chain the recurrence
    t_i = max(t_{i-1} + d_{i-1}, r_i) (r_i the latest of the node's other in-edges) is
    t_i = D_i + max_{j <= i}(r_j - D_j) with D the chain's prefix sum of latencies: a cumulative
    maximum. A block's r comes from edges out of earlier blocks (final) and from edges inside the
    block (not yet known): the block is iterated from below (unknown = `_FLOOR`) until the sources
    of its inside edges stop changing, the least fixpoint, which on a DAG is the longest-path time
    of every node; a few iterations (the chain changes along a binding path inside the block).
    Inside a block each chain piece is one contiguous run of rows, and the cumulative maximum of
    every piece and every latency column at once is log2(longest piece) doubling steps of whole
    arrays (`_piece_cummax`). Integer ns; the same numbers as the node-by-node pass
    (`times_reference`)."""

    def __init__(self, g: Graph, block: int = FORWARD_BLOCK, slices_up_to: int = 0) -> None:
        n = g.n_nodes
        src, dst = g.src, g.dst
        n_e = len(src)
        has_in = np.zeros(n, dtype=bool)
        has_in[dst] = True
        sources = np.flatnonzero(~has_in)
        topo = np.concatenate([sources, g.order]).astype(np.int64)
        tpos = np.empty(n, dtype=np.int64)
        tpos[topo] = np.arange(n)
        n_src = len(sources)
        # chain parents: per node its first in-edge of the best priority, then per source node
        # one chain child (the earliest in topological order); a node whose edge lost to another
        # child of that source tries its next edge whose source has no child yet, round by round
        # (a CUDA-graph replay's operations all queue after the operation before the replay: one
        # of them chains there, each other one to its in-graph predecessor; unchained, every
        # operation would cost the block one more iteration)
        prio = _CHAIN_PRIORITY[g.role] if n_e else np.zeros(0, dtype=np.int64)
        left = np.flatnonzero(prio < 99)
        pedge = np.full(n, -1, dtype=np.int64)
        has_child = np.zeros(n, dtype=bool)
        for _ in range(CHAIN_ROUNDS):
            c = left[_lexsort((left, prio[left], dst[left]), unique=True)]
            c = c[_first_of_runs(dst[c])]
            c = c[_lexsort((tpos[dst[c]], prio[c], src[c]), unique=True)]
            c = c[_first_of_runs(src[c])]
            pedge[dst[c]] = c
            has_child[src[c]] = True
            left = left[(pedge[dst[left]] < 0) & ~has_child[src[left]]]
            if not len(left):
                break
        c = np.flatnonzero(pedge >= 0)
        root = np.arange(n)
        root[c] = src[pedge[c]]
        while True:  # pointer jumping to each chain's head
            nr = root[root]
            if np.array_equal(nr, root):
                break
            root = nr
        bounds = np.asarray([*range(n_src, n, block), n], dtype=np.int64)
        n_blk = len(bounds) - 1
        blk = np.searchsorted(bounds, tpos, side="right") - 1  # sources: -1 (final from the start)
        # a chain piece: one chain's nodes in one block (contiguous along the chain)
        by_piece = _lexsort((tpos, root, blk), unique=True)
        pb, pr = blk[by_piece], root[by_piece]
        starts = _first_of_runs(pb * (n + 1) + pr) if n else np.zeros(0, dtype=bool)
        piece = np.cumsum(starts) - 1
        p_start = np.flatnonzero(starts)
        j = np.arange(n) - p_start[piece]  # index along its piece
        # the layout, block by block: a block whose longest piece has at most `slices_up_to`
        # nodes by index along the piece, longest pieces first (each step of the running maximum
        # one contiguous slice: fewer operations than the doubling steps' when the pieces are
        # short and the columns many); any other block its pieces one after the other (each
        # piece one contiguous run of rows: `_piece_cummax`)
        p_len = np.diff(np.append(p_start, n))
        p_blk = pb[p_start]
        width = np.zeros(n_blk + 1, dtype=np.int64)  # per block (+1: the sources' -1)
        np.maximum.at(width, p_blk + 1, p_len)
        sliced = width[pb + 1] <= slices_up_to
        so = np.lexsort((np.arange(len(p_start)), -p_len, p_blk))
        rank = np.empty(len(so), dtype=np.int64)
        sb = p_blk[so]
        rank[so] = np.arange(len(so)) - np.searchsorted(sb, sb, side="left")
        local = piece - piece[np.searchsorted(pb, pb, side="left")]  # piece number in its block
        final = _lexsort((np.where(sliced, rank[piece], j), np.where(sliced, j, local), pb), unique=True)
        self.nodes = by_piece[final]
        pos = np.empty(n, dtype=np.int64)
        pos[self.nodes] = np.arange(n)
        self.n, self.n_src, self.pos = n, n_src, pos
        # the prefix sums D along each piece, in piece order
        self.pc_pos = pos[by_piece]
        self.pc_edge = np.where(j > 0, pedge[by_piece], -1)
        self.pc_start = p_start[piece]
        # the other edges, grouped per block: from earlier blocks, then inside the block
        e_d, e_s = pos[dst], pos[src]
        b_d, b_s = blk[dst], blk[src]
        chained = (pedge[dst] == np.arange(n_e)) & (b_s == b_d)
        outside = b_s < b_d
        ek = np.flatnonzero(~chained)
        ek = ek[_lexsort((ek, e_d[ek], ~outside[ek], b_d[ek]), unique=True)]
        self.eperm = ek
        cuts = np.searchsorted(b_d[ek] * 2 + (~outside[ek]), np.arange(2 * n_blk + 1))
        j_at = j[final]
        self.blocks: list[tuple[Any, ...]] = []
        for bi in range(n_blk):
            a, b = int(bounds[bi]), int(bounds[bi + 1])
            e0, e1, e2 = int(cuts[2 * bi]), int(cuts[2 * bi + 1]), int(cuts[2 * bi + 2])
            jb = j_at[a:b]  # each row's index along its piece
            w = int(width[bi + 1])
            steps: list[tuple[int, ...]] = []
            if w <= slices_up_to:  # per index along the pieces: (rows, rows of the index before)
                offs = np.searchsorted(jb, np.arange(w + 1)).tolist()
                steps = [(offs[q], offs[q + 1], offs[q - 1]) for q in range(1, w)]
            else:  # the doubling steps: (k, which rows have a row of their piece k above)
                k = 1
                while k < w:
                    steps.append((k, (jb[k:] >= k)[:, None]))
                    k *= 2
            self.blocks.append(
                (
                    a,
                    b,
                    e0,
                    e1,
                    e2,
                    e_s[ek[e0:e1]],
                    self._groups(e_d[ek[e0:e1]] - a),
                    e_s[ek[e1:e2]] - a,
                    self._groups(e_d[ek[e1:e2]] - a),
                    steps,
                )
            )

    @staticmethod
    def _groups(d: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        if not len(d):
            return None
        first = _first_of_runs(d)
        return np.flatnonzero(first), d[first]

    def run(self, lats: Sequence[np.ndarray], t0: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        """The node times (nodes, C) for the C latency vectors `lats` (each (edges,) int64); only
        the nodes `at` (rows in that order) when given."""
        n, n_c = self.n, len(lats)
        mx, red = np.maximum, np.maximum.reduceat
        pe = self.pc_edge
        has_pe = pe >= 0
        pe0 = np.where(has_pe, pe, 0)
        cs = np.empty((n_c, n), dtype=np.int64)
        lp = np.empty((len(self.eperm), n_c), dtype=np.int64)
        for i, lat in enumerate(lats):
            np.multiply(lat[pe0], has_pe, out=cs[i])
            lp[:, i] = lat[self.eperm]
        np.cumsum(cs, axis=1, out=cs)
        cs -= cs[:, self.pc_start]
        d_all = np.empty((n, n_c), dtype=np.int64)
        d_all[self.pc_pos] = cs.T
        del cs
        t = np.empty((n, n_c), dtype=np.int64)
        t[: self.n_src] = t0[self.nodes[: self.n_src], None]
        for a, b, e0, e1, e2, x_src, x_grp, i_src, i_grp, steps in self.blocks:
            r_out = np.full((b - a, n_c), _FLOOR, dtype=np.int64)
            if x_grp is not None:
                r_out[x_grp[1]] = red(t[x_src] + lp[e0:e1], x_grp[0], axis=0)
            d = d_all[a:b]
            r, l_in, seen = r_out, lp[e1:e2], None
            while True:
                x = r - d
                if steps and len(steps[0]) == 3:
                    for q0, q1, p0 in steps:
                        mx(x[q0:q1], x[p0 : p0 + q1 - q0], out=x[q0:q1])
                else:
                    _piece_cummax(x, steps)
                x += d
                mx(x, _FLOOR, out=x)
                if i_grp is None:
                    break
                s_new = x[i_src]
                if seen is not None and np.array_equal(s_new, seen):
                    break
                seen = s_new
                r = r_out.copy()
                r[i_grp[1]] = mx(r[i_grp[1]], red(s_new + l_in, i_grp[0], axis=0))
            t[a:b] = x
        return t[self.pos if at is None else self.pos[at]]


_I64_MIN = np.iinfo(np.int64).min


def _piece_cummax(x: np.ndarray, steps: list[tuple[Any, ...]]) -> np.ndarray:
    """The running maximum of `x` (rows, C) down each chain piece (a piece's rows contiguous),
    column by column, in place: log2(longest piece) doubling steps, each row taking the larger
    of itself and the row `k` above when that row is of its piece (`steps`: (k, that mask
    (rows - k, 1))). Exact on any int64 values."""
    for k, same in steps:
        np.maximum(x[k:], np.where(same, x[:-k], _I64_MIN), out=x[k:])
    return x


def times_reference(g: Graph, lat: np.ndarray | None = None) -> np.ndarray:
    """`Graph.times` node by node in topological order (the definition; tests compare the fast
    pass with it)."""
    lat_l = (g.lat if lat is None else lat).tolist()
    t = g.t.tolist()
    src = g.src.tolist()
    ptr = g.indptr.tolist()
    for n in g.order.tolist():
        a, b = ptr[n], ptr[n + 1]
        best = t[src[a]] + lat_l[a]
        for k in range(a + 1, b):
            v = t[src[k]] + lat_l[k]
            if v > best:
                best = v
        t[n] = best
    return np.asarray(t, dtype=np.int64)


def assemble(rank_graphs: Sequence[RankGraph], offsets: Mapping[int, int]) -> Graph:
    """The run's graph from its ranks' (in rank order): node numbers made global, one rendezvous per
    matched instance (its members' begins -> it -> their ends), a topological order."""
    rgs = sorted(rank_graphs, key=lambda g: g.rank)
    base = np.cumsum([0] + [len(g.t) for g in rgs])
    n_rank_nodes = int(base[-1])
    inst_members: dict[int, list[tuple[int, int, int, int, str, int]]] = {}
    for i, g in enumerate(rgs):
        for cb, ce, inst, x, op, nb in zip(
            g.c_begin, g.c_end, g.c_inst, g.c_x, g.c_op, g.c_bytes, strict=True
        ):
            inst_members.setdefault(int(inst), []).append(
                (int(cb) + int(base[i]), int(ce) + int(base[i]), int(x), g.rank, op, int(nb))
            )
    t_all = np.concatenate([g.t for g in rgs] + [np.zeros(len(inst_members), dtype=np.int64)])
    node_rank = np.concatenate(
        [np.full(len(g.t), g.rank, dtype=np.int64) for g in rgs]
        + [np.full(len(inst_members), -1, dtype=np.int64)]
    )
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("src", "dst", "lat", "role", "kind", "erank", "seg", "calls", "ops", "cidx")
    }
    for i, g in enumerate(rgs):
        cols["src"].append(g.src + base[i])
        cols["dst"].append(g.dst + base[i])
        for k in ("lat", "role", "kind", "seg", "calls", "ops", "cidx"):
            cols[k].append(getattr(g, k))
        cols["erank"].append(np.full(len(g.src), g.rank, dtype=np.int64))
    ex: list[tuple[int, int, int, int, int, int]] = []  # src, dst, lat, role, kind, rank
    for r_i, inst in enumerate(sorted(inst_members)):
        node = n_rank_nodes + r_i
        mem = sorted(inst_members[inst], key=lambda m: m[3])
        t_all[node] = max(int(t_all[m[0]]) for m in mem)
        for cb, _ce, _x, rk, _op, _nb in mem:
            ex.append((cb, node, 0, ROLE_ARRIVE, K_TRANSFER, rk))
        for _cb, ce, x, rk, _op, _nb in mem:
            ex.append((node, ce, x, ROLE_XFER, K_TRANSFER, rk))
    if ex:
        e = np.asarray(ex, dtype=np.int64)
        cols["src"].append(e[:, 0])
        cols["dst"].append(e[:, 1])
        cols["lat"].append(e[:, 2])
        cols["role"].append(e[:, 3])
        cols["kind"].append(e[:, 4])
        cols["erank"].append(e[:, 5])
        for k in ("seg", "calls", "ops", "cidx"):
            cols[k].append(np.full(len(e), -1 if k in ("seg", "cidx") else 0, dtype=np.int64))
    arr = {
        k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64)).astype(np.int64, copy=False)
        for k, v in cols.items()
    }
    # the rendezvous' measured time is the last arrival; a collective's end is the rendezvous + x
    # a topological order: by measured time, ties by the depth of equal-time chains
    src, dst = arr["src"], arr["dst"]
    bad = t_all[src] > t_all[dst]
    notes = [n for g in rgs for n in g.notes]
    if bad.any():
        notes.append(f"{int(bad.sum())} edge(s) run backwards in the trace's time; left out of the graph")
        keep = ~bad
        arr = {k: v[keep] for k, v in arr.items()}
        src, dst = arr["src"], arr["dst"]
    level = np.zeros(len(t_all), dtype=np.int64)
    tie = t_all[src] == t_all[dst]
    ts, td = src[tie], dst[tie]
    for _ in range(len(t_all) + 1):
        new = level.copy()
        np.maximum.at(new, td, level[ts] + 1)
        if np.array_equal(new, level):
            break
        level = new
    pos_order = _lexsort((level, t_all))
    has_in = np.zeros(len(t_all), dtype=bool)
    has_in[dst] = True
    order = pos_order[has_in[pos_order]]
    # CSR by destination; within a node, edges in their build order (stream, cross, launch; ranks)
    perm = np.argsort(dst, kind="stable")
    arr = {k: v[perm] for k, v in arr.items()}
    indptr = np.zeros(len(t_all) + 1, dtype=np.int64)
    np.add.at(indptr, arr["dst"] + 1, 1)
    indptr = np.cumsum(indptr)
    is_x = arr["role"] == ROLE_XFER
    # the probe's op / bytes per ROLE_XFER edge, in the permuted order
    xk = np.flatnonzero(is_x)
    # rebuild op/bytes by (src rendezvous, dst end)
    lookup = {}
    for cb_list in inst_members.values():
        for _cb, ce, _x, _rk, op, nb in cb_list:
            lookup[ce] = (op, nb)
    xo = [lookup[int(d)][0] for d in arr["dst"][xk]]
    xb = np.asarray([lookup[int(d)][1] for d in arr["dst"][xk]], dtype=np.int64)
    inst_of_node = np.arange(n_rank_nodes, n_rank_nodes + len(inst_members), dtype=np.int64)
    inst_ids = np.asarray(sorted(inst_members), dtype=np.int64)
    xi = inst_ids[np.searchsorted(inst_of_node, arr["src"][xk])] if len(xk) else np.zeros(0, dtype=np.int64)
    # the steps every rank holds (a rank's other steps stay in its program order, unreported)
    common = sorted(set.intersection(*(set(g.steps) for g in rgs))) if rgs else []
    steps = common
    pos = [{st: k for k, st in enumerate(g.steps)} for g in rgs]
    ws_node = (
        np.stack(
            [
                np.asarray([int(g.ws_node[pos[i][st]]) + int(base[i]) for st in steps], dtype=np.int64)
                for i, g in enumerate(rgs)
            ]
        )
        if rgs
        else np.zeros((0, 0), dtype=np.int64)
    )
    end_nodes = [[g.end_nodes[pos[i][st]] + base[i] for st in steps] for i, g in enumerate(rgs)]
    tl = {g.timeline for g in rgs}
    return Graph(
        ranks=[g.rank for g in rgs],
        timeline="gpu" if tl == {"gpu"} else ("host" if tl == {"host"} else "mixed"),
        steps=list(steps),
        offsets={int(k): int(v) for k, v in offsets.items()},
        t=t_all,
        node_rank=node_rank,
        src=arr["src"],
        dst=arr["dst"],
        lat=arr["lat"],
        role=arr["role"],
        kind=arr["kind"],
        erank=arr["erank"],
        seg=arr["seg"],
        calls=arr["calls"],
        ops=arr["ops"],
        cidx=arr["cidx"],
        xfer_op=xo,
        xfer_bytes=xb,
        xfer_inst=xi,
        order=order,
        indptr=indptr,
        ws_node=ws_node,
        end_nodes=end_nodes,
        notes=notes,
        rho_typ={g.rank: g.rho_typ for g in rgs},
        q_typ={g.rank: g.q_typ for g in rgs},
    )


def build_graph(
    classified: pd.DataFrame,
    windows: pd.DataFrame,
    per_rank: pd.DataFrame,
    offsets: Mapping[int, int] | None,
    timeline: str | None,
    inst_bytes: Mapping[int, int] | None = None,
) -> Graph:
    """The run's graph over `windows` (rank, step, start_ns, end_ns, annotation_end_ns);
    `timeline` "gpu" or "host" for every rank, None: each rank's from its events."""
    from tracekit.analyse.timeline.partition import rank_selectors
    from tracekit.classify.rules import GPU_KINDS

    def rank_timeline(ev: pd.DataFrame) -> str:
        if timeline is not None:
            return timeline
        return "gpu" if ev["kind"].astype(str).isin(list(GPU_KINDS)).any() else "host"

    offsets = dict(offsets or {})
    ranks = sorted(int(r) for r in windows["rank"].unique())
    rows_of = rank_selectors(classified["rank"].to_numpy(np.int64))
    m_rank = per_rank["rank"].to_numpy(np.int64) if len(per_rank) else np.zeros(0, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    w_rank = windows["rank"].to_numpy(np.int64)
    rgs = []
    for r in ranks:
        ev = classified.iloc[rows_of.get(r, empty)]
        rgs.append(
            build_rank_graph(
                ev,
                r,
                windows[w_rank == r],
                per_rank[m_rank == r] if len(per_rank) else per_rank,
                int(offsets.get(r, 0)),
                rank_timeline(ev),
                inst_bytes,
            )
        )
    return assemble(rgs, offsets)


# ------------------------------------------------------------------------------------------
# the critical path on the graph


@dataclass
class PathWalk:
    """Per step: the (rank, part) sums, the offset (path length short of the step time: the walk
    reached the origin) and the segments (step, rank, start, end own clock, piece, instance)."""

    rows: list[dict[str, Any]]
    segments: list[tuple[int, int, int, int, str, int]]


def binding_edges(g: Graph, t: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Per node, its binding in-edge at node times `t` and edge latencies `lat`: the first of its
    in-edges (CSR order) whose source time + latency is the node's time; -1 for a node without
    in-edges, -2 for one none of whose in-edges reaches its time (an inconsistent `t`). One pass
    over the edges' arrays (what `walk_path` follows node by node)."""
    n = len(t)
    out = np.full(n, -1, dtype=np.int64)
    if not len(g.src):
        return out
    counts = np.diff(g.indptr)
    dst = np.repeat(np.arange(n, dtype=np.int64), counts)  # node n's in-edges: indptr[n]:indptr[n + 1]
    ok = np.flatnonzero(t[g.src[: len(dst)]] + np.asarray(lat, dtype=np.int64)[: len(dst)] == t[dst])
    has_in = counts > 0
    out[has_in] = -2
    if len(ok):
        d = dst[ok]
        first = np.ones(len(ok), dtype=bool)
        first[1:] = d[1:] != d[:-1]
        out[d[first]] = ok[first]
    return out


def walk_path(g: Graph, t: np.ndarray | None = None, lat: np.ndarray | None = None) -> PathWalk:
    """Walk the path back from the last step's latest window end (ties: the lowest rank) through
    each node's binding in-edge (the first in-edge reaching its time), for one range per step
    (`path_spans`): each edge's latency goes to its rank and part, split at the steps' ranges
    [latest end - span, latest end]. The walk is one chain across steps: where it reaches a
    step's latest end it goes on into that step from where it is (so of ranks that end a step
    together, the one the later step's chain runs through); where it cannot (it reached a node with
    no in-edge, or a step's range starts before the previous one's end) that step's walk starts at
    its own latest end. A walk that reaches a node with no in-edge stops: the rest of the step is its
    offset."""
    lat = g.lat if lat is None else lat
    if t is None:
        t = g.times(lat)
    ws, we = g.windows(t)
    step_ns = g.path_spans(t)
    ranks = g.ranks
    bind = binding_edges(g, t, lat)
    # the walk visits one node at a time, a path's worth of the graph: scalar reads of the arrays
    # (whole-graph lists would cost the graph's size per walk)
    t_a, src_a = t, g.src
    erank_a, kind_a, role_a, node_rank_a = g.erank, g.kind, g.role, g.node_rank

    def binding(n: int) -> int:
        e = int(bind[n])
        if e == -2:
            raise AssertionError("a node's time is reached by none of its in-edges")
        return e

    rows_rev: list[list[dict[str, Any]]] = []
    segs_rev: list[list[tuple[int, int, int, int, str, int]]] = []
    cursor: tuple[int, int] | None = None  # (node, time reached on its binding in-edge, <= its time)
    for k in range(len(g.steps) - 1, -1, -1):
        st = g.steps[k]
        i_end = int(np.argmax(we[:, k]))
        t_end = int(we[i_end, k])
        limit = t_end - int(step_ns[k])
        n, hi = -1, t_end
        if cursor is not None and cursor[1] >= t_end:  # go on from the later step's chain
            n, hi = cursor
            while hi > t_end:
                e = binding(n)
                if e < 0:
                    n = -1
                    break
                ts = int(t_a[src_a[e]])
                if ts < t_end:
                    hi = t_end
                    break
                n, hi = int(src_a[e]), ts
        last_rank = ranks[i_end]
        if n < 0:
            nodes = g.end_nodes[i_end][k]
            n = int(nodes[np.argmax(t[nodes])])
            hi = int(t[n])
        elif node_rank_a[n] >= 0:
            last_rank = int(node_rank_a[n])
        acc = {r: [0] * len(PARTS) for r in ranks}
        hops = 0
        segs: list[tuple[int, int, int, int, str, int]] = []
        ended = False
        while hi > limit:
            e = binding(n)
            if e < 0:
                ended = True
                break
            ts = int(t_a[src_a[e]])
            piece = hi - max(ts, limit)
            r = int(erank_a[e])
            if piece > 0:
                acc[r][int(kind_a[e])] += piece
                if r != last_rank:
                    hops += 1
                    last_rank = r
                off = g.offsets.get(r, 0)
                is_x = int(role_a[e]) == ROLE_XFER
                segs.append((int(st), r, max(ts, limit) + off, hi + off, "transfer" if is_x else "work", -1))
            if ts < limit:
                hi = limit
                break
            n, hi = int(src_a[e]), ts
        cursor = None if ended else (n, hi)
        path_len = t_end - max(hi, limit)
        rows_rev.append(
            [
                {
                    "step": int(st),
                    "rank": r,
                    **{f"{p}_ns": acc[r][j] for j, p in enumerate(PARTS)},
                    "step_ns": int(step_ns[k]),
                    "offset_ns": int(step_ns[k]) - path_len,
                    "hops": hops,
                }
                for r in ranks
            ]
        )
        segs_rev.append(segs)
        assert int(step_ns[k]) - path_len >= 0, f"step {st}: negative path offset"
        total = sum(sum(v) for v in acc.values())
        assert total == path_len, f"step {st}: path pieces {total} != path length {path_len}"
    rows = [row for per in reversed(rows_rev) for row in per]
    segs_all = [sg for per in reversed(segs_rev) for sg in per]
    return PathWalk(rows, _merge_segments(segs_all))


def _merge_segments(
    segs: list[tuple[int, int, int, int, str, int]],
) -> list[tuple[int, int, int, int, str, int]]:
    out: list[tuple[int, int, int, int, str, int]] = []
    for s in segs:
        if (
            out
            and out[-1][0] == s[0]
            and out[-1][1] == s[1]
            and out[-1][4] == s[4] == "work"
            and out[-1][2] == s[3]
        ):
            p = out[-1]
            out[-1] = (p[0], p[1], s[2], p[3], p[4], p[5])
        else:
            out.append(s)
    return out
