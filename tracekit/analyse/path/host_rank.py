"""One rank's graph on a host timeline (`tracekit.analyse.path`; a CPU-only run: its host work
between collectives is a chain of edges of its measured parts)."""

from __future__ import annotations

import numpy as np

from tracekit.analyse.path.rank_graph import MatchedBuilder, RankBuilder, RankGraph, RankSource, seg_id
from tracekit.analyse.path.roles import (
    K_COMPUTE,
    K_HOST,
    K_MEMORY,
    K_SYNC,
    K_UNKNOWN,
    ROLE_GAP,
    ROLE_GAP_OUT,
    ROLE_LEAD,
    ROLE_SYNC,
    ROLE_WORK,
)
from tracekit.analyse.timeline.partition import LayerUnions, layer_unions


def host_rank(source: RankSource, unions: LayerUnions | None = None) -> RankGraph:
    """One rank's graph on a host (CPU-only) timeline: its host work between collectives a chain of
    edges of its measured parts (`unions`: its layer unions when already built, else built here)."""
    ev, rank, w, matched, off, inst_bytes = source
    lay = unions if unions is not None else layer_unions(ev[["kind", "cls", "start_ns", "end_ns", "stream"]])
    busy_s, busy_e = lay.cum[-1][0], lay.cum[-1][1]
    steps = [int(s) for s in w["step"]]
    ws_a = w["start_ns"].to_numpy(np.int64)
    we_a = w["end_ns"].to_numpy(np.int64)
    lo = int(ws_a.min())
    b = RankBuilder()
    origin = b.node(lo - off)
    cur, cur_t = origin, lo
    ws_node = np.zeros(len(steps), dtype=np.int64)
    end_nodes: list[np.ndarray] = []
    collectives = MatchedBuilder()
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
        chain(cur_t, ws, seg_id(k, 0), True)
        if cur_t != ws:  # overlapping windows: jump (never backwards)
            n = b.node(ws - off)
            b.edge(cur, n, max(ws - cur_t, 0), ROLE_GAP_OUT, K_HOST, seg=seg_id(k, 0))
            cur, cur_t = n, max(ws, cur_t)
        ws_node[k] = cur
        a0, a1 = np.searchsorted(cs_all, [ws, we], side="left")
        kk = 0
        for row in range(int(a0), int(a1)):
            s, e = int(coll["raw_start_ns"].iloc[row]), int(coll["raw_end_ns"].iloc[row])
            a = int(coll["arrival_raw_ns"].iloc[row])
            if s < cur_t:
                continue
            chain(cur_t, s, seg_id(k, kk), False)
            inst = int(coll["instance"].iloc[row])
            ne = b.node(e - off)
            collectives.add(
                cur, ne, inst, max(e - max(a, s), 0), str(coll["op"].iloc[row]), inst_bytes.get(inst, -1)
            )
            cur, cur_t = ne, e
            kk += 1
        chain(cur_t, we, seg_id(k, kk), False)
        end_nodes.append(np.asarray([cur], dtype=np.int64))
    return RankGraph(
        rank=rank,
        timeline="host",
        **b.arrays(),
        steps=steps,
        ws_node=ws_node,
        end_nodes=end_nodes,
        matched=collectives.done(),
        origin=origin,
    )
