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
- cross-stream (and in-graph) waits: the end of the operation on another stream (or earlier in the
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
    from tracekit.analyse.steps import LayerUnions

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

    def arrays(self) -> dict[str, np.ndarray]:
        e = np.asarray(self.e, dtype=np.int64).reshape(-1, 9)
        return {
            "t": np.asarray(self.t, dtype=np.int64),
            "src": e[:, 0].copy(),
            "dst": e[:, 1].copy(),
            "lat": e[:, 2].copy(),
            "role": e[:, 3].copy(),
            "kind": e[:, 4].copy(),
            "seg": e[:, 5].copy(),
            "calls": e[:, 6].copy(),
            "ops": e[:, 7].copy(),
            "cidx": e[:, 8].copy(),
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


def _gpu_rank(
    ev: pd.DataFrame,
    rank: int,
    w: pd.DataFrame,
    matched: pd.DataFrame,
    off: int,
    inst_bytes: Mapping[int, int],
) -> RankGraph:
    from tracekit.classify.rules import GPU_KINDS

    steps = [int(s) for s in w["step"]]
    ws_a = w["start_ns"].to_numpy(np.int64)
    we_a = w["end_ns"].to_numpy(np.int64)
    ae_a = w["annotation_end_ns"].to_numpy(np.int64) if "annotation_end_ns" in w.columns else we_a.copy()
    ae_a = np.minimum(np.maximum(ae_a, ws_a), we_a)
    lo, hi = int(ws_a.min()), int(we_a.max())
    kind = ev["kind"].astype(str).to_numpy()
    cls = ev["cls"].astype(str).to_numpy()
    names = ev["name"].astype(str).to_numpy()
    start = ev["start_ns"].to_numpy(np.int64)
    end = ev["end_ns"].to_numpy(np.int64)
    corr = ev["correlation"].to_numpy(np.int64)
    thread = ev["stream"].to_numpy(np.int64)
    is_rt = (kind == "runtime") & (start >= lo) & (start < hi)
    is_dev = np.isin(kind, list(GPU_KINDS))
    rt = np.flatnonzero(is_rt)
    rt = rt[np.argsort(start[rt], kind="stable")]
    dev_all = np.flatnonzero(is_dev)
    # the device operations each correlation launched
    rt_corr = {int(c): int(i) for i, c in zip(rt, corr[rt], strict=True) if c >= 0}
    launched_by: dict[int, int] = {}
    for d in dev_all:
        c = int(corr[d])
        if c >= 0 and c in rt_corr:
            launched_by[int(d)] = rt_corr[c]
    if len(rt):
        dev = np.asarray(sorted(launched_by, key=lambda d: (start[d], d)), dtype=np.int64)
    else:  # kernels-only trace: the operations inside the windows, released from the origin
        sel = dev_all[(start[dev_all] >= lo) & (start[dev_all] < hi)]
        dev = sel[np.argsort(start[sel], kind="stable")]
    launching = set(launched_by.values())
    sync_like = (cls == "sync") | np.array([bool(_BLOCKING_COPY.match(n)) for n in names]) if len(ev) else cls
    b = _Builder()
    origin = b.node(lo - off)
    notes: list[str] = []

    # step of a host time: the window holding it, else the next window (gap between steps)
    def step_index(t: int) -> int:
        i = int(np.searchsorted(ws_a, t, side="right")) - 1
        return min(max(i, 0), len(steps) - 1)

    def in_window(t: int) -> bool:
        i = int(np.searchsorted(ws_a, t, side="right")) - 1
        return i >= 0 and t <= ae_a[i]

    # --- the kept host calls: launches, synchronising calls, possible back-pressure; markers
    launch_durs = np.asarray([end[i] - start[i] for i in launching], dtype=np.int64)
    med_launch = int(np.median(launch_durs)) if len(launch_durs) else 0
    bp_min = max(BACKPRESSURE_MIN_NS, 8 * med_launch)
    keep = [int(i) for i in rt if int(i) in launching or sync_like[i]]
    # folded calls per thread, counted into the next kept item's gap
    rt_by_thread: dict[int, np.ndarray] = {}
    for th in np.unique(thread[rt]) if len(rt) else []:
        rt_by_thread[int(th)] = np.sort(start[rt[thread[rt] == th]])
    main = (
        int(pd.Series(thread[rt]).value_counts().index[0])
        if len(rt)
        else (int(thread[0]) if len(thread) else 0)
    )
    items: dict[int, list[tuple[int, int, int, int, int]]] = {}  # thread -> (start, order, corr, type, idx)
    # program order per thread: by start, a step's end before the next step's start and calls at
    # one instant in their correlation order (zero-length calls share timestamps)
    for i in keep:
        items.setdefault(int(thread[i]), []).append((int(start[i]), 1, int(corr[i]), 0, i))
    for k in range(len(steps)):
        items.setdefault(main, []).append((int(ws_a[k]), 0, 0, 1, k))  # window start marker
        items.setdefault(main, []).append((int(ae_a[k]), -1, 0, 2, k))  # annotation end marker
    call_begin: dict[int, int] = {}
    call_end: dict[int, int] = {}
    call_edge: dict[int, int] = {}
    ws_node = np.zeros(len(steps), dtype=np.int64)
    ae_node = np.zeros(len(steps), dtype=np.int64)
    coll_launches = np.zeros(len(steps), dtype=np.int64)
    coll_of = _coll_lookup(matched)
    # which calls launch a matched collective (straggler segments count them)
    launches_coll = {
        launched_by[d] for d in dev if (int(start[d]), int(end[d])) in coll_of and d in launched_by
    }
    for th, its in items.items():
        its.sort()
        starts_th = rt_by_thread.get(th, np.zeros(0, dtype=np.int64))
        prev_node, prev_t, prev_begin_node, prev_begin_t = origin, lo, origin, lo
        prev_fold_t = lo
        for s_i, _o, _c, typ, idx in its:
            # folded calls in (prev, s_i): counted into this gap
            n_fold = int(
                np.searchsorted(starts_th, s_i, side="left")
                - np.searchsorted(starts_th, prev_fold_t, side="left")
            )
            k = step_index(s_i)
            seg = _seg_id(k, int(coll_launches[k]))
            # the time before a window opens is between tokens
            role = ROLE_GAP if typ != 1 and in_window(s_i) else ROLE_GAP_OUT
            first = prev_node == origin
            if s_i >= prev_t:
                src, gap = prev_node, s_i - prev_t
            else:  # nested in the previous call: from its begin
                src, gap = prev_begin_node, max(s_i - prev_begin_t, 0)
            nb = b.node(s_i - off)
            if first and th != main:
                b.edge(origin, nb, s_i - lo, ROLE_ORIGIN, K_HOST, calls=n_fold)
            else:
                b.edge(src, nb, gap, role, K_HOST, seg=seg, calls=n_fold)
            if typ == 0:
                ce = int(end[idx])
                ne = b.node(ce - off)
                call_begin[idx], call_end[idx] = nb, ne
                call_edge[idx] = len(b.e)
                if sync_like[idx] or cls[idx] == "sync":
                    b.edge(nb, ne, ce - s_i, ROLE_SYNC, K_SYNC, seg=seg, calls=1)  # refined below
                else:
                    b.edge(
                        nb, ne, ce - s_i, ROLE_CALL, K_HOST, seg=seg, calls=1, ops=int(idx in launches_coll)
                    )
                if idx in launches_coll:
                    coll_launches[k] += 1
                prev_begin_node, prev_begin_t = nb, s_i
                if ce >= prev_t:
                    prev_node, prev_t = ne, ce
                prev_fold_t = s_i + 1
            else:
                if typ == 1:
                    ws_node[idx] = nb
                else:
                    ae_node[idx] = nb
                prev_begin_node, prev_begin_t = nb, s_i
                prev_node, prev_t = nb, s_i
                prev_fold_t = s_i
    # --- device operations
    nd = len(dev)
    ds, de = start[dev], end[dev]
    d_call = np.asarray([launched_by.get(int(d), -1) for d in dev], dtype=np.int64)
    d_h = np.asarray([int(start[c]) if c >= 0 else lo for c in d_call], dtype=np.int64)
    d_stream = thread[dev]
    d_graph = np.asarray([c >= 0 and bool(_GRAPH_LAUNCH.search(names[c])) for c in d_call], dtype=bool)
    # stream predecessor (not one of the same graph replay)
    pred = np.full(nd, -1, dtype=np.int64)
    last_on: dict[int, int] = {}
    last_other_call: dict[tuple[int, int], int] = {}
    for j in range(nd):
        sk = int(d_stream[j])
        if d_graph[j]:
            pred[j] = last_other_call.get((sk, int(d_call[j])), -1)
        else:
            pred[j] = last_on.get(sk, -1)
        if last_on.get(sk, -1) >= 0 and int(d_call[last_on[sk]]) != int(d_call[j]):
            last_other_call[(sk, int(d_call[j]))] = last_on[sk]
        if (sk, int(d_call[j])) not in last_other_call:
            last_other_call[(sk, int(d_call[j]))] = last_on.get(sk, -1)
        if last_on.get(sk, -1) < 0 or de[j] >= de[last_on[sk]]:
            last_on[sk] = j
    # inside one CUDA-graph replay: each operation after the first waits for the one of the same
    # replay that ended last before it began (branches may run concurrently on one stream)
    import bisect

    gpred = np.full(nd, -1, dtype=np.int64)
    first_rho: dict[int, int] = {}
    in_graph: dict[int, tuple[list[int], list[int]]] = {}
    for j in range(nd):
        if not d_graph[j]:
            continue
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
    q = np.where(pred >= 0, ds - de[np.maximum(pred, 0)], np.iinfo(np.int64).max)
    idle = q >= IDLE_GAP_NS
    lb = idle & (d_call >= 0) & (rho < LAUNCH_LATENCY_CAP_NS)
    rho_typ = int(np.median(rho[lb])) if lb.any() else 5000
    rho_bound = max(3 * rho_typ, rho_typ + 20_000)
    # an operation inside a graph replay after its first: its gap from the operation before the replay
    # is its offset in the replay, not a queued gap (it would set q_typ to ~the replay length)
    qq = q[(pred >= 0) & (gpred < 0) & ~(idle & (rho <= rho_bound))]
    q_typ = int(max(np.median(qq), 0)) if len(qq) else 1000
    # cross waits: the operation that ended last before j (any stream), by end time
    end_order = np.argsort(de, kind="stable")
    ends_sorted = de[end_order]
    d_begin = np.zeros(nd, dtype=np.int64)
    d_end = np.zeros(nd, dtype=np.int64)
    for j in range(nd):
        d_begin[j] = b.node(int(ds[j]) - off)
        d_end[j] = b.node(int(de[j]) - off)
    c_begin, c_end, c_inst, c_x, c_op, c_bytes = [], [], [], [], [], []
    step_ops: list[list[int]] = [[] for _ in steps]
    # compute index per step
    comp_count = np.zeros(len(steps), dtype=np.int64)
    n_cross = 0

    def _op_edges(j: int) -> None:
        """The operation's own time (a matched collective's goes through its rendezvous)."""
        s_j = int(ds[j])
        k = step_index(int(d_h[j])) if int(d_call[j]) >= 0 else step_index(s_j)
        hit = coll_of.get((s_j, int(de[j])))
        if hit is not None:
            c_begin.append(int(d_begin[j]))
            c_end.append(int(d_end[j]))
            c_inst.append(hit[0])
            c_x.append(hit[1])
            c_op.append(hit[2])
            c_bytes.append(int(inst_bytes.get(hit[0], -1)))
        else:
            kd = _KIND_OF_CLS.get(str(cls[dev[j]]), K_UNKNOWN)
            ci = -1
            if kd == K_COMPUTE:
                ci = _seg_id(k, int(comp_count[k]))
                comp_count[k] += 1
            b.edge(int(d_begin[j]), int(d_end[j]), int(de[j] - ds[j]), ROLE_OP, kd, cidx=ci)

    for j in range(nd):
        call = int(d_call[j])
        s_j = int(ds[j])
        k = step_index(int(d_h[j])) if call >= 0 else step_index(s_j)
        if call >= 0 and int(d_h[j]) <= int(ae_a[k]) and int(d_h[j]) >= int(ws_a[k]):
            step_ops[k].append(int(d_end[j]))
        elif call < 0 and ws_a[k] <= s_j < we_a[k]:
            step_ops[k].append(int(d_end[j]))
        p = int(pred[j])
        if gpred[j] >= 0:  # in a graph replay: its in-graph predecessor binds it
            gp = int(gpred[j])
            b.edge(int(d_end[gp]), int(d_begin[j]), s_j - int(de[gp]), ROLE_GRAPH, K_HOST)
            if p >= 0 and q[j] >= 0:
                b.edge(int(d_end[p]), int(d_begin[j]), min(int(q[j]), q_typ), ROLE_QUEUE, K_HOST)
            lat_g = min(int(rho[j]), first_rho.get(call, int(rho[j])))
            if lat_g >= 0:
                b.edge(call_begin[call], int(d_begin[j]), lat_g, ROLE_LAUNCH, K_HOST)
            _op_edges(j)
            continue
        # which released it: of its launch, its stream and the operation that ended last before it
        # on another stream, the one that would have released it latest at typical latencies
        cands: list[tuple[int, int, int]] = []  # (ready, preference, which)
        if p >= 0 and q[j] >= 0:
            cands.append((int(de[p]) + min(int(q[j]), q_typ), 2, 0))
        elif p >= 0:  # it began before its predecessor's recorded end: held by its stream all the same
            cands.append((s_j, 2, 0))
        cross = -1
        m = int(np.searchsorted(ends_sorted, s_j, side="right")) - 1
        while m >= 0 and int(end_order[m]) in (j, p):
            m -= 1
        if m >= 0:
            c = int(end_order[m])
            if s_j - int(ends_sorted[m]) < IDLE_GAP_NS and ds[c] < s_j and (p < 0 or de[c] > de[p]):
                cross = c
                cands.append((int(de[c]), 1, 1))
        if call >= 0 and rho[j] >= 0:
            cands.append((int(d_h[j]) + min(int(rho[j]), rho_typ), 0, 2))
        which = max(cands)[2] if cands else 2
        stream_bound, launch_bound = which == 0, which == 2
        if which != 1:
            cross = -1
        # the edges into the operation's begin (stream first: the path prefers it on ties)
        if p >= 0 and q[j] >= 0:
            lat_q = int(q[j]) if stream_bound else min(int(q[j]), q_typ)
            b.edge(int(d_end[p]), int(d_begin[j]), lat_q, ROLE_QUEUE, K_HOST)
        elif p >= 0:  # it began before its predecessor ended (overlapping records): after its begin
            b.edge(int(d_begin[p]), int(d_begin[j]), max(s_j - int(ds[p]), 0), ROLE_QUEUE, K_HOST)
        if cross >= 0:
            n_cross += 1
            b.edge(int(d_end[cross]), int(d_begin[j]), s_j - int(de[cross]), ROLE_CROSS, K_HOST)
        if call >= 0:
            lat_r = int(rho[j]) if launch_bound else min(int(rho[j]), rho_typ)
            if lat_r >= 0:
                b.edge(call_begin[call], int(d_begin[j]), lat_r, ROLE_LAUNCH, K_HOST)
            elif p < 0 and cross < 0:
                b.edge(origin, int(d_begin[j]), s_j - lo, ROLE_ORIGIN, K_HOST)
        else:
            lat_o = (s_j - lo) if launch_bound else min(s_j - lo, rho_typ)
            b.edge(origin, int(d_begin[j]), lat_o, ROLE_ORIGIN, K_HOST)
        _op_edges(j)
    if n_cross:
        notes.append(f"rank {rank}: {n_cross} operation(s) released by another stream's (cross-stream waits)")
    # --- synchronising calls and back-pressure: the host waits for the device
    op_call_begin = d_h
    n_bp = 0
    de_sorted_idx = np.argsort(de, kind="stable")
    de_sorted = de[de_sorted_idx]
    for i in keep:
        cs, ce = int(start[i]), int(end[i])
        is_sync = bool(sync_like[i])
        long_launch = (not is_sync) and i in launching and ce - cs >= bp_min
        if not is_sync and not long_launch:
            continue
        own = bool(_BLOCKING_COPY.match(names[i]))
        # the operation it waits for: the latest-ending one launched before it that ended by its
        # return (a synchronising call depends on it whether or not it blocked in this trace)
        m = int(np.searchsorted(de_sorted, ce, side="right")) - 1
        floor = cs if long_launch else lo
        dj = -1
        while m >= 0 and int(de_sorted[m]) > floor:
            c = int(de_sorted_idx[m])
            before = op_call_begin[c] < cs or (op_call_begin[c] == cs and int(corr[d_call[c]]) < int(corr[i]))
            if before or (own and int(d_call[c]) == i):
                dj = c
                break
            m -= 1
        if dj < 0:
            continue
        eps = ce - int(de[dj])
        nb, ne = call_begin[i], call_end[i]
        if is_sync:
            if int(de[dj]) > cs:  # it blocked: its time is the wait, then its return latency
                b.e[call_edge[i]] = (nb, ne, 0, *b.e[call_edge[i]][3:])
                b.edge(int(d_end[dj]), ne, eps, ROLE_SYNC_WAIT, K_SYNC)
            else:  # it did not block here: had the device been later, it would have
                b.edge(int(d_end[dj]), ne, ce - cs, ROLE_SYNC_WAIT, K_SYNC)
        elif int(de[dj]) > cs and eps <= 4 * med_launch + 2000:
            n_bp += 1
            b.e[call_edge[i]] = (nb, ne, min(ce - cs, med_launch), *b.e[call_edge[i]][3:])
            b.edge(int(d_end[dj]), ne, eps, ROLE_BACKPRESSURE, K_HOST)
    if n_bp:
        notes.append(f"rank {rank}: {n_bp} launch call(s) waited for a launch-queue slot (back-pressure)")
    t_now = np.asarray(b.t, dtype=np.int64)
    end_nodes = [
        _window_end_nodes(
            t_now, [int(ae_node[k]), *step_ops[k]], int(we_a[k]) - off, d_begin, ws_node[k + 1 :]
        )
        for k in range(len(steps))
    ]
    arr = b.arrays()
    return RankGraph(
        rank=rank,
        timeline="gpu",
        steps=steps,
        ws_node=ws_node,
        end_nodes=end_nodes,
        c_begin=np.asarray(c_begin, dtype=np.int64),
        c_end=np.asarray(c_end, dtype=np.int64),
        c_inst=np.asarray(c_inst, dtype=np.int64),
        c_x=np.asarray(c_x, dtype=np.int64),
        c_op=c_op,
        c_bytes=np.asarray(c_bytes, dtype=np.int64),
        origin=origin,
        notes=notes,
        rho_typ=rho_typ,
        q_typ=q_typ,
        t=arr["t"],
        src=arr["src"],
        dst=arr["dst"],
        lat=arr["lat"],
        role=arr["role"],
        kind=arr["kind"],
        seg=arr["seg"],
        calls=arr["calls"],
        ops=arr["ops"],
        cidx=arr["cidx"],
    )


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
    from tracekit.analyse.steps import layer_unions

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
        c_begin=np.asarray(c_begin, dtype=np.int64),
        c_end=np.asarray(c_end, dtype=np.int64),
        c_inst=np.asarray(c_inst, dtype=np.int64),
        c_x=np.asarray(c_x, dtype=np.int64),
        c_op=c_op,
        c_bytes=np.asarray(c_bytes, dtype=np.int64),
        origin=origin,
        t=arr["t"],
        src=arr["src"],
        dst=arr["dst"],
        lat=arr["lat"],
        role=arr["role"],
        kind=arr["kind"],
        seg=arr["seg"],
        calls=arr["calls"],
        ops=arr["ops"],
        cidx=arr["cidx"],
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

    @property
    def n_nodes(self) -> int:
        return len(self.t)

    def times(self, lat: np.ndarray | None = None) -> np.ndarray:
        """Every node's time with these edge latencies (the measured ones when None): each node the
        latest over its in-edges of source + latency, in topological order; integer ns."""
        lat_l = (self.lat if lat is None else lat).tolist()
        t = self.t.tolist()
        src = self.src.tolist()
        ptr = self.indptr.tolist()
        for n in self.order.tolist():
            a, b = ptr[n], ptr[n + 1]
            best = t[src[a]] + lat_l[a]
            for k in range(a + 1, b):
                v = t[src[k]] + lat_l[k]
                if v > best:
                    best = v
            t[n] = best
        return np.asarray(t, dtype=np.int64)

    def windows(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per [rank_i, step_i], the window start and end at these node times."""
        ws = t[self.ws_node]
        we = np.empty_like(ws)
        for i, per in enumerate(self.end_nodes):
            for k, nodes in enumerate(per):
                we[i, k] = int(t[nodes].max())
        return ws, we

    def step_times(self, t: np.ndarray) -> np.ndarray:
        """Per step, the longest window (the step time the accounting uses)."""
        ws, we = self.windows(t)
        return (we - ws).max(axis=0)

    def periods(self, t: np.ndarray) -> np.ndarray:
        """Per step, the time from the previous step's end (the latest window end over ranks) to
        its own: what a token costs when nothing between steps is frozen. The first step: its
        longest window."""
        ws, we = self.windows(t)
        end = we.max(axis=0)
        out = np.empty(len(self.steps), dtype=np.int64)
        if len(out):
            out[0] = int((we[:, 0] - ws[:, 0]).max())
            out[1:] = np.diff(end)
        return out


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
        k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64)).astype(np.int64) for k, v in cols.items()
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
    pos_order = np.lexsort((level, t_all))
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
    from tracekit.analyse.steps import rank_selectors
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


def walk_path(g: Graph, t: np.ndarray | None = None, lat: np.ndarray | None = None) -> PathWalk:
    """Walk every step's path back from its latest window end through each node's binding in-edge
    (the first in-edge reaching its time), for one step time (`step_times`): each edge's latency
    goes to its rank and part; the walk stops at the step time before the end (clipping the last
    edge) or at a node with no in-edge (the rest is the offset)."""
    lat = g.lat if lat is None else lat
    if t is None:
        t = g.times(lat)
    ws, we = g.windows(t)
    step_ns = (we - ws).max(axis=0)
    ranks = g.ranks
    src, ptr = g.src, g.indptr
    rows: list[dict[str, Any]] = []
    segs: list[tuple[int, int, int, int, str, int]] = []
    for k, st in enumerate(g.steps):
        # the latest window end; ties: the lowest rank
        i_end = int(np.argmax(we[:, k]))
        t_end = int(we[i_end, k])
        nodes = g.end_nodes[i_end][k]
        n = int(nodes[np.argmax(t[nodes])])
        limit = t_end - int(step_ns[k])
        acc = {r: [0] * len(PARTS) for r in ranks}
        hops = 0
        last_rank = ranks[i_end]
        while t[n] > limit:
            a, b = int(ptr[n]), int(ptr[n + 1])
            if a == b:
                break
            tn = int(t[n])
            e = -1
            for kk in range(a, b):
                if int(t[src[kk]]) + int(lat[kk]) == tn:
                    e = kk
                    break
            assert e >= 0, "a node's time is reached by none of its in-edges"
            ts = int(t[src[e]])
            piece = tn - max(ts, limit)
            r = int(g.erank[e])
            if piece > 0:
                acc[r][int(g.kind[e])] += piece
                if r != last_rank:
                    hops += 1
                    last_rank = r
                off = g.offsets.get(r, 0)
                is_x = int(g.role[e]) == ROLE_XFER
                segs.append((int(st), r, max(ts, limit) + off, tn + off, "transfer" if is_x else "work", -1))
            n = int(src[e])
        path_len = t_end - max(int(t[n]), limit)
        for r in ranks:
            rows.append(
                {
                    "step": int(st),
                    "rank": r,
                    **{f"{p}_ns": acc[r][j] for j, p in enumerate(PARTS)},
                    "step_ns": int(step_ns[k]),
                    "offset_ns": int(step_ns[k]) - path_len,
                    "hops": hops,
                }
            )
        assert int(step_ns[k]) - path_len >= 0, f"step {st}: negative path offset"
        total = sum(sum(v) for v in acc.values())
        assert total == path_len, f"step {st}: path pieces {total} != path length {path_len}"
    return PathWalk(rows, _merge_segments(segs))


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
