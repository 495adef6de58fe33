"""A GPU rank's host chain (`gpu_rank`): each thread's kept calls and the step markers in
program order, as nodes and edges, on arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.analyse.path.roles import (
    K_HOST,
    K_SYNC,
    ROLE_CALL,
    ROLE_GAP,
    ROLE_GAP_OUT,
    ROLE_ORIGIN,
    ROLE_SYNC,
)


@dataclass
class HostChain:
    """The host chain's nodes after the origin (`t`, aligned clock) and edges (`e`, [n, 9] rows:
    src, dst, lat, role, kind, seg, calls, ops, cidx), per kept call its begin and end node and its
    call edge's row (-1 where not kept), per step its window start and annotation end nodes."""

    t: np.ndarray
    e: np.ndarray
    call_begin: np.ndarray
    call_end: np.ndarray
    call_edge: np.ndarray
    ws_node: np.ndarray
    ae_node: np.ndarray


@dataclass
class ThreadItems:
    """One thread's items in program order: start, type (0 a call, 1 a window start marker, 2 an
    annotation end marker), index (the call's event or the marker's step)."""

    s: np.ndarray
    typ: np.ndarray
    idx: np.ndarray


def program_order(
    keep: np.ndarray,
    thread: np.ndarray,
    start: np.ndarray,
    corr: np.ndarray,
    main: int,
    ws: np.ndarray,
    ae: np.ndarray,
) -> list[tuple[int, ThreadItems]]:
    """Per thread (in order of its first kept call; the main thread, which holds the step markers,
    last when it has none), its kept calls and, on the main thread, the steps' markers: by start, a
    step's annotation end before the next step's window start and calls at one instant in their
    correlation order (zero-length calls share timestamps)."""
    n_steps = len(ws)
    th_k = thread[keep]
    order_th = list(dict.fromkeys(th_k.tolist()))
    if main not in order_th and n_steps:
        order_th.append(main)
    out = []
    for th in order_th:
        sel = keep[th_k == th]
        s = start[sel]
        o = np.ones(len(sel), dtype=np.int64)
        c = corr[sel]
        typ = np.zeros(len(sel), dtype=np.int64)
        idx = sel.astype(np.int64)
        if th == main:
            steps = np.arange(n_steps, dtype=np.int64)
            s = np.concatenate((s, ws.astype(np.int64), ae.astype(np.int64)))
            o = np.concatenate((o, np.zeros(n_steps, dtype=np.int64), np.full(n_steps, -1, dtype=np.int64)))
            c = np.concatenate((c, np.zeros(2 * n_steps, dtype=np.int64)))
            typ = np.concatenate((typ, np.ones(n_steps, dtype=np.int64), np.full(n_steps, 2, dtype=np.int64)))
            idx = np.concatenate((idx, steps, steps))
        srt = np.lexsort((idx, typ, c, o, s))  # the tuples (start, order, corr, type, index) sorted
        out.append((int(th), ThreadItems(s[srt], typ[srt], idx[srt])))
    return out


def host_chain(
    threads: Sequence[tuple[int, ThreadItems]],
    *,
    main: int,
    lo: int,
    off: int,
    n_ev: int,
    n_steps: int,
    end: np.ndarray,
    sync_like: np.ndarray,
    launches_coll: np.ndarray,
    n_fold: Sequence[np.ndarray],
    step_of: Sequence[np.ndarray],
    in_window: Sequence[np.ndarray],
) -> HostChain:
    """The host chain after the origin (node 0, at `lo`): per item a node at its start and, for a
    call, one at its end (`off` subtracted: the aligned clock); edges in item order, per item the
    edge into it, then a call's own edge (synchronising calls: ROLE_SYNC, refined by `gpu_rank`).
    The edge into an item comes from the chain's latest end so far (the last call that ended
    latest since the last marker, or the marker), or, for an item nested in the previous call,
    from that call's begin; a thread's first item on another thread than the main one comes from
    the origin. Each edge's segment is its step's index * 100000 + the matched-collective launches
    before it in that step (over the threads in turn). `n_fold` (the folded calls each gap holds),
    `step_of`, `in_window`: per thread, per item."""
    typ = np.concatenate([it.typ for _, it in threads])
    s = np.concatenate([it.s for _, it in threads])
    idx = np.concatenate([it.idx for _, it in threads])
    k = np.concatenate(step_of).astype(np.int64)
    nf = np.concatenate(n_fold).astype(np.int64)
    n = len(typ)
    is_call = typ == 0
    call_idx = np.where(is_call, idx, 0)
    ce = end[call_idx].astype(np.int64)
    lc = is_call & launches_coll[call_idx].astype(bool)
    is_sync = sync_like[call_idx].astype(bool)
    role = np.where((typ != 1) & np.concatenate(in_window), ROLE_GAP, ROLE_GAP_OUT)
    # per item one node and one edge, a call two of each (its begin and end; the edge into it and
    # its own): an item's first edge row, and its first node after the origin
    r_in = np.cumsum(1 + is_call) - (1 + is_call)
    nb = r_in + 1
    ne = nb + 1
    # the matched-collective launches before each item in its step, over the threads in turn
    seg = k * 100_000 + (pd.Series(lc.astype(np.int64)).groupby(k).cumsum().to_numpy() - lc)
    # per thread: the chain's latest end before each item. With one virtual item before each
    # thread's first (the origin, at `lo`): groups open at it and at each marker; in a group the
    # latest end is the running maximum of the opening's time and the calls' ends, held by the
    # last item that reached it (ties: the later)
    sizes = np.asarray([len(it.typ) for _, it in threads], dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    first = np.zeros(n, dtype=bool)
    first[bounds[:-1]] = True
    at = np.arange(n) + np.repeat(
        np.arange(1, len(sizes) + 1), sizes
    )  # each item's place, virtual ones between
    m = n + len(sizes)
    v = np.full(m, lo, dtype=np.int64)
    v[at] = np.where(is_call, ce, s)
    opens = np.ones(m, dtype=bool)  # the virtual items and the markers
    opens[at] = ~is_call
    run_max = pd.Series(v).groupby(np.cumsum(opens)).cummax().to_numpy()
    pos = np.arange(m)
    holder = np.maximum.accumulate(np.where(v == run_max, pos, -1))
    node_after = np.zeros(m, dtype=np.int64)  # the origin for the virtual items
    node_after[at] = np.where(is_call, ne, nb)
    prev_t = run_max[at - 1]  # the state after the item (or the virtual one) before
    prev_node = node_after[holder[at - 1]]
    prev_bt = np.where(first, lo, np.r_[lo, s[:-1]])
    prev_bn = np.where(first, 0, np.r_[0, nb[:-1]])
    after = s >= prev_t
    src = np.where(after, prev_node, prev_bn)
    gap = np.where(after, s - prev_t, np.maximum(s - prev_bt, 0))
    th_of = np.repeat(np.asarray([th for th, _ in threads], dtype=np.int64), sizes)
    from_origin = first & (th_of != main)
    # the edges: per item the one into it, then a call's own
    rows = np.zeros((n + int(is_call.sum()), 9), dtype=np.int64)
    rows[r_in] = np.stack(
        (
            np.where(from_origin, 0, src),
            nb,
            np.where(from_origin, s - lo, gap),
            np.where(from_origin, ROLE_ORIGIN, role),
            np.full(n, K_HOST),
            np.where(from_origin, -1, seg),
            nf,
            np.zeros(n, dtype=np.int64),
            np.full(n, -1),
        ),
        axis=1,
    )
    c = np.flatnonzero(is_call)
    rows[r_in[c] + 1] = np.stack(
        (
            nb[c],
            ne[c],
            ce[c] - s[c],
            np.where(is_sync[c], ROLE_SYNC, ROLE_CALL),
            np.where(is_sync[c], K_SYNC, K_HOST),
            seg[c],
            np.ones(len(c), dtype=np.int64),
            np.where(is_sync[c], 0, lc[c].astype(np.int64)),
            np.full(len(c), -1),
        ),
        axis=1,
    )
    t = np.empty(n + len(c), dtype=np.int64)
    t[nb - 1] = s - off
    t[ne[c] - 1] = ce[c] - off
    call_begin = np.full(n_ev, -1, dtype=np.int64)
    call_end = np.full(n_ev, -1, dtype=np.int64)
    call_edge = np.full(n_ev, -1, dtype=np.int64)
    call_begin[idx[c]], call_end[idx[c]], call_edge[idx[c]] = nb[c], ne[c], r_in[c] + 1
    ws_node = np.zeros(n_steps, dtype=np.int64)
    ae_node = np.zeros(n_steps, dtype=np.int64)
    ws_node[idx[typ == 1]] = nb[typ == 1]
    ae_node[idx[typ == 2]] = nb[typ == 2]
    return HostChain(t, rows, call_begin, call_end, call_edge, ws_node, ae_node)
