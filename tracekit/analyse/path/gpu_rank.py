"""One rank's graph on a GPU timeline (`tracekit.analyse.path`): its kept host calls in program
order per thread, its device operations per stream, the edge that released each operation
(launch, stream, cross-stream or in-graph wait), the collectives' arrivals and ends, and where
the host waited for the device (synchronising calls, back-pressure)."""

from __future__ import annotations

import bisect
import re
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.path.gpu_host import host_chain, program_order
from tracekit.analyse.path.gpu_waits import event_waits, window_end_nodes
from tracekit.analyse.path.rank_graph import (
    MatchedBuilder,
    RankGraph,
    RankSource,
    coll_lookup,
    edge_columns,
)
from tracekit.analyse.path.roles import (
    BACKPRESSURE_MIN_NS,
    IDLE_GAP_NS,
    K_COMPUTE,
    K_HOST,
    K_SYNC,
    K_UNKNOWN,
    KIND_OF_CLS,
    LAUNCH_LATENCY_CAP_NS,
    ROLE_BACKPRESSURE,
    ROLE_CROSS,
    ROLE_GRAPH,
    ROLE_LAUNCH,
    ROLE_OP,
    ROLE_ORIGIN,
    ROLE_QUEUE,
    ROLE_SYNC_WAIT,
)
from tracekit.classify.rules import GPU_KINDS
from tracekit.model.strings import str_flags, str_values

_BLOCKING_COPY = re.compile(r"^cu(da)?Memcpy(?!.*Async)")
_GRAPH_LAUNCH = re.compile(r"GraphLaunch")


def gpu_rank(source: RankSource) -> RankGraph:
    """One rank's graph on a GPU timeline (`build.build_rank_graph`; the package doc says what
    its nodes and edges are)."""
    ev, rank, w, matched, off, inst_bytes = source
    steps = [int(s) for s in w["step"]]
    n_steps = len(steps)
    ws_a = w["start_ns"].to_numpy(np.int64)
    we_a = w["end_ns"].to_numpy(np.int64)
    ae_raw = w["annotation_end_ns"].to_numpy(np.int64) if "annotation_end_ns" in w.columns else we_a.copy()
    ae_a = np.minimum(np.maximum(ae_raw, ws_a), we_a)
    lo, hi = int(ws_a.min()), int(we_a.max())
    kind = str_values(ev["kind"])
    cls = str_values(ev["cls"])
    names = str_values(ev["name"])
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
    blocking = str_flags(ev["name"], _BLOCKING_COPY)
    sync_like = (cls == "sync") | blocking if n_ev else cls
    origin = 0  # the rank's first node, at `lo` (the host chain's come after it: `host_chain`)
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
    threads = program_order(keep, thread, start, corr, main, ws_a, ae_a)
    coll_of = coll_lookup(matched)
    nd = len(dev)
    ds, de = start[dev], end[dev]
    hits = [coll_of.get(k) for k in zip(ds.tolist(), de.tolist(), strict=True)] if coll_of else [None] * nd
    d_call = call_of[dev]
    # which calls launch a matched collective (straggler segments count them)
    launches_coll = np.zeros(n_ev, dtype=bool)
    hit_j = np.asarray([h is not None for h in hits], dtype=bool)
    if nd:
        launches_coll[d_call[hit_j & (d_call >= 0)]] = True
    n_fold, step_of, in_win = [], [], []
    for th, it in threads:
        starts_th = rt_by_thread.get(th, np.zeros(0, dtype=np.int64))
        # folded calls in (the previous item, this one): counted into this gap
        prev_fold = np.empty(len(it.s), dtype=np.int64)
        prev_fold[:1] = lo
        prev_fold[1:] = it.s[:-1] + (it.typ[:-1] == 0)
        n_fold.append(
            np.searchsorted(starts_th, it.s, side="left") - np.searchsorted(starts_th, prev_fold, side="left")
        )
        step_of.append(step_index(it.s))
        in_win.append(in_window(it.s))  # the time before a window opens is between tokens
    chain = host_chain(
        threads,
        main=main,
        lo=lo,
        off=off,
        n_ev=n_ev,
        n_steps=n_steps,
        end=end,
        sync_like=sync_like,
        launches_coll=launches_coll,
        n_fold=n_fold,
        step_of=step_of,
        in_window=in_win,
    )
    call_begin, call_end, call_edge = chain.call_begin, chain.call_end, chain.call_edge
    ws_node, ae_node = chain.ws_node, chain.ae_node
    host_e = chain.e
    t_host = np.concatenate(([lo - off], chain.t))
    n_host = len(t_host)
    # --- device operations
    d_h = np.where(d_call >= 0, start[np.maximum(d_call, 0)], lo) if nd else np.zeros(0, dtype=np.int64)
    d_stream = thread[dev]
    d_graph = (
        (d_call >= 0) & str_flags(ev["name"], _GRAPH_LAUNCH, search=True)[np.maximum(d_call, 0)]
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
    ev_pred = event_waits(rt, is_launching, names, thread, start, d_call, d_stream)
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
    kd_of = {c: KIND_OF_CLS.get(c, K_UNKNOWN) for c in pd.unique(cls[dev])} if nd else {}
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
    collectives = MatchedBuilder()
    for j in np.flatnonzero(hit_j).tolist():
        hit = hits[j]
        assert hit is not None
        inst, x, op = hit
        collectives.add(d_begin[j], d_end[j], inst, x, op, inst_bytes.get(inst, -1))
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
        ne = int(call_end[i])
        if is_sync:
            if int(de[dj]) > cs:  # it blocked: its time is the wait, then its return latency
                host_e[call_edge[i], 2] = 0
                sync_edges.append((int(d_end[dj]), ne, eps, ROLE_SYNC_WAIT, K_SYNC, -1, 0, 0, -1))
            else:  # it did not block here: had the device been later, it would have
                sync_edges.append((int(d_end[dj]), ne, ce - cs, ROLE_SYNC_WAIT, K_SYNC, -1, 0, 0, -1))
        elif int(de[dj]) > cs and eps <= 4 * med_launch + 2000:
            n_bp += 1
            host_e[call_edge[i], 2] = min(ce - cs, med_launch)
            sync_edges.append((int(d_end[dj]), ne, eps, ROLE_BACKPRESSURE, K_HOST, -1, 0, 0, -1))
    if n_bp:
        notes.append(f"rank {rank}: {n_bp} launch call(s) waited for a launch-queue slot (back-pressure)")
    t_dev = np.empty(2 * nd, dtype=np.int64)
    t_dev[0::2] = ds - off
    t_dev[1::2] = de - off
    t_now = np.concatenate((t_host, t_dev))
    # the operations each step launched (in launch order), its end nodes with its annotation's end
    so = np.flatnonzero(in_step)
    so = so[np.argsort(kk[so], kind="stable")]
    cut = np.searchsorted(kk[so], np.arange(n_steps + 1))
    end_nodes = [
        window_end_nodes(
            t_now,
            [int(ae_node[k]), *d_end[so[cut[k] : cut[k + 1]]].tolist()],
            int(we_a[k]) - off,
            d_begin,
            ws_node[k + 1 :],
        )
        for k in range(n_steps)
    ]
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
        t=t_now,
        **edge_columns(e),
        steps=steps,
        ws_node=ws_node,
        end_nodes=end_nodes,
        matched=collectives.done(),
        origin=origin,
        notes=notes,
        rho_typ=rho_typ,
        q_typ=q_typ,
    )
