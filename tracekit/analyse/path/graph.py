"""The run's dependency graph (`tracekit.analyse.path`): `Graph`, every rank's nodes and edges
joined at the collectives' rendezvous (`assemble`), re-timed by the forward pass (`forward`) and
read per window (`windows`, `periods`, `path_spans`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tracekit.analyse.path.forward import (
    FORWARD_BLOCK,
    FORWARD_BLOCK_NARROW,
    FORWARD_NARROW_COLS,
    FORWARD_SLICES_UP_TO,
    Forward,
    first_of_runs,
    index_ranges,
    last_of_runs,
    lexsort_packed,
)
from tracekit.analyse.path.rank_graph import RankGraph
from tracekit.analyse.path.roles import K_TRANSFER, ROLE_ARRIVE, ROLE_XFER


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
        forward pass of `forward.Forward`)."""
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

    def prepare_forward(self, n_cols: int = 1) -> None:
        """Build the forward pass for `n_cols` latency columns ahead of its first use (where the
        graph is assembled, beside other work: `correction_replay.prepare_graph`)."""
        self._forward(n_cols)

    def _forward(self, n_cols: int) -> Forward:
        """The forward pass for `n_cols` latency columns: blocks of `FORWARD_BLOCK_NARROW` nodes
        for a few columns (the correction's one-setting replays), `FORWARD_BLOCK` for more."""
        key = "_fw1" if n_cols <= FORWARD_NARROW_COLS else "_fw"
        fw = self.__dict__.get(key)
        if fw is None:
            if key == "_fw1":
                fw = Forward(self, FORWARD_BLOCK_NARROW)
            else:
                fw = Forward(self, FORWARD_BLOCK, FORWARD_SLICES_UP_TO)
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

    def __getstate__(self) -> dict[str, object]:
        # the forward pass and the end index are rebuilt on use (not shipped to Dask workers)
        return {k: v for k, v in self.__dict__.items() if k not in ("_fw", "_fw1", "_ends")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)


def _tie_levels(n_nodes: int, ts: np.ndarray, td: np.ndarray) -> np.ndarray:
    """Per node, the depth of the equal-time chains into it over the tie edges `ts` -> `td`: the
    longest chain of tie edges ending at it (0 for a node on none), the fixpoint of "each
    destination the latest of its own and its sources' + 1". Found by releasing the nodes round by
    round (a node's round: one after its last tie source's), each edge read once; where the tie
    edges hold a cycle, the rounds of that rule over every tie edge, at most `n_nodes` + 1."""
    level = np.zeros(n_nodes, dtype=np.int64)
    if not len(ts):
        return level
    nodes, local = np.unique(np.concatenate((ts, td)), return_inverse=True)
    by_src = np.argsort(local[: len(ts)], kind="stable")
    ls, ld = local[: len(ts)][by_src], local[len(ts) :][by_src]
    n = len(nodes)
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(ls, minlength=n), out=out_ptr[1:])
    waiting = np.bincount(ld, minlength=n)  # per node, its tie in-edges not yet read
    lv = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=np.int64)  # a round's last position of each node released in it
    ready = np.flatnonzero(waiting == 0)
    released, r = len(ready), 0
    while len(ready):
        r += 1
        d = ld[index_ranges(out_ptr[ready], out_ptr[ready + 1])]
        np.subtract.at(waiting, d, 1)
        done = d[waiting[d] == 0]  # each node released as often as it had edges this round: once
        at = np.arange(len(done), dtype=np.int64)
        seen[done] = at
        ready = done[seen[done] == at]
        lv[ready] = r
        released += len(ready)
    if released < n:  # a cycle of equal-time edges: the rule's rounds, as many as it takes or allows
        lv[:] = 0
        for _ in range(n_nodes + 1):
            new = lv.copy()
            np.maximum.at(new, ld, lv[ls] + 1)
            if np.array_equal(new, lv):
                break
            lv = new
    level[nodes] = lv
    return level


def _order_of(t: np.ndarray, level: np.ndarray, has_in: np.ndarray) -> np.ndarray:
    """The nodes with in-edges (`has_in`) by time, ties by `level`, then by node number (one sort
    of every node's packed key: faster than `np.lexsort` where many levels, and than the subset's)."""
    pos_order = lexsort_packed((level, t))
    return pos_order[has_in[pos_order]]


def topological_order(t: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The nodes with in-edges in a topological order of edges that run forward in time `t`: by
    time, ties by the depth of equal-time chains."""
    tie = t[src] == t[dst]
    has_in = np.zeros(len(t), dtype=bool)
    has_in[dst] = True
    return _order_of(t, _tie_levels(len(t), src[tie], dst[tie]), has_in)


def _cat(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64, copy=False) if len(parts) else np.zeros(0, dtype=np.int64)


@dataclass
class _Members:
    """Every rank's matched collectives in one set of arrays (rank order, then each rank's), node
    numbers global, grouped by instance: `by_inst` the members in instance order (ties: their
    order), `inst_of` per member its instance's number (in `inst_ids`, sorted), `starts` where
    each instance's members start in `by_inst`."""

    begin: np.ndarray
    end: np.ndarray
    x: np.ndarray
    rank: np.ndarray
    op: np.ndarray  # object array of str
    nbytes: np.ndarray
    by_inst: np.ndarray
    inst_of: np.ndarray
    inst_ids: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, rgs: Sequence[RankGraph], base: np.ndarray) -> _Members:
        mc = [g.matched for g in rgs]
        n_of = np.asarray([len(m.inst) for m in mc], dtype=np.int64)
        m_base = np.repeat(base[:-1], n_of)
        inst = _cat([m.inst for m in mc])
        by_inst = np.argsort(inst, kind="stable")
        s_inst = inst[by_inst]
        head = first_of_runs(s_inst)
        inst_of = np.empty(len(inst), dtype=np.int64)
        inst_of[by_inst] = np.cumsum(head) - 1
        op = np.empty(len(inst), dtype=object)
        op[:] = [o for m in mc for o in m.op]
        return cls(
            begin=_cat([m.begin for m in mc]) + m_base,
            end=_cat([m.end for m in mc]) + m_base,
            x=_cat([m.x for m in mc]),
            rank=np.repeat(np.asarray([g.rank for g in rgs], dtype=np.int64), n_of),
            op=op,
            nbytes=_cat([m.nbytes for m in mc]),
            by_inst=by_inst,
            inst_of=inst_of,
            inst_ids=s_inst[head],
            starts=np.flatnonzero(head),
        )

    def rendezvous_edges(self, n_rank_nodes: int) -> tuple[np.ndarray, ...]:
        """The rendezvous' edges, per instance (in instance order, node `n_rank_nodes` + its number)
        its members' arrivals, then their transfers (each in member order): src, dst, lat, role,
        and each edge's member."""
        n = len(self.by_inst)
        gid = self.inst_of[self.by_inst]
        counts = np.diff(np.append(self.starts, n))
        pa = np.arange(n, dtype=np.int64) + self.starts[gid]  # the k-th member's arrival, its transfer after
        px = pa + counts[gid]
        node = n_rank_nodes + gid
        src, dst, lat, role, member = (np.empty(2 * n, dtype=np.int64) for _ in range(5))
        src[pa], dst[pa], lat[pa], role[pa] = self.begin[self.by_inst], node, 0, ROLE_ARRIVE
        src[px], dst[px], lat[px], role[px] = node, self.end[self.by_inst], self.x[self.by_inst], ROLE_XFER
        member[pa] = member[px] = self.by_inst
        return src, dst, lat, role, member

    def last_by_end(self) -> tuple[np.ndarray, np.ndarray]:
        """Per distinct end node (sorted), the member whose op and bytes the end's transfer edges
        carry: where several members end at one node, the last in instance order of first
        appearance, then member order. Returns the end nodes and the members."""
        first = self.by_inst[self.starts]  # per instance, its first member
        key = np.lexsort((np.arange(len(self.end), dtype=np.int64), first[self.inst_of], self.end))
        s_end = self.end[key]
        last = last_of_runs(s_end)
        return s_end[last], key[last]


#: the edge columns the assembly permutes into CSR order, as Graph holds them
_EDGE_COLS = ("src", "dst", "lat", "role", "kind", "erank", "seg", "calls", "ops", "cidx")


def assemble(rank_graphs: Sequence[RankGraph], offsets: Mapping[int, int]) -> Graph:
    """The run's graph from its ranks' (in rank order): node numbers made global, one rendezvous per
    matched instance (its members' begins -> it -> their ends), a topological order. In arrays:
    every rank's matched collectives gathered, the edges permuted once into their CSR order (by
    destination, stable: each rank's in rank order, then the rendezvous')."""
    rgs = sorted(rank_graphs, key=lambda g: g.rank)
    base = np.concatenate(([0], np.cumsum([len(g.t) for g in rgs]))).astype(np.int64)
    n_rank_nodes = int(base[-1])
    mem = _Members.of(rgs, base)
    n_inst = len(mem.inst_ids)
    # the rendezvous' measured time is the last arrival; a collective's end is the rendezvous + x
    t_all = np.concatenate([g.t for g in rgs] + [np.zeros(n_inst, dtype=np.int64)])
    if n_inst:
        t_all[n_rank_nodes:] = np.maximum.reduceat(t_all[mem.begin[mem.by_inst]], mem.starts)
    node_rank = np.repeat(
        np.asarray([g.rank for g in rgs] + [-1], dtype=np.int64),
        np.asarray([len(g.t) for g in rgs] + [n_inst], dtype=np.int64),
    )
    x_src, x_dst, x_lat, x_role, x_member = mem.rendezvous_edges(n_rank_nodes)
    e_lo = np.concatenate(([0], np.cumsum([len(g.src) for g in rgs]))).astype(np.int64)
    n_rank_edges = int(e_lo[-1])
    src = _cat([g.src for g in rgs] + [x_src])
    dst = _cat([g.dst for g in rgs] + [x_dst])
    for i in range(len(rgs)):
        src[e_lo[i] : e_lo[i + 1]] += base[i]
        dst[e_lo[i] : e_lo[i + 1]] += base[i]
    t_src, t_dst = t_all[src], t_all[dst]
    bad = t_src > t_dst
    tie = t_src == t_dst
    notes = [n for g in rgs for n in g.notes]
    keep: np.ndarray | None = None
    if bad.any():
        notes.append(f"{int(bad.sum())} edge(s) run backwards in the trace's time; left out of the graph")
        keep = ~bad
        kept = np.flatnonzero(keep)
        take = kept[np.argsort(dst[kept], kind="stable")]
    else:
        take = np.argsort(dst, kind="stable")
    # CSR by destination; within a node, edges in their build order (stream, cross, launch; ranks):
    # every column written once, each source piece scattered to its final places
    n_edges = len(take)
    at = np.empty(len(src), dtype=np.int64)
    at[take] = np.arange(n_edges, dtype=np.int64)
    out = {k: np.empty(n_edges, dtype=np.int64) for k in _EDGE_COLS[2:]}
    out["src"], out["dst"] = src[take], dst[take]

    def put(col: str, lo: int, hi: int, values: np.ndarray | int) -> None:
        if keep is None:
            out[col][at[lo:hi]] = values
            return
        k = keep[lo:hi]
        out[col][at[lo:hi][k]] = values[k] if isinstance(values, np.ndarray) else values

    for i, g in enumerate(rgs):
        lo, hi = int(e_lo[i]), int(e_lo[i + 1])
        for col in ("lat", "role", "kind", "seg", "calls", "ops", "cidx"):
            put(col, lo, hi, getattr(g, col))
        put("erank", lo, hi, g.rank)
    lo, hi = n_rank_edges, len(src)
    put("lat", lo, hi, x_lat)
    put("role", lo, hi, x_role)
    put("kind", lo, hi, K_TRANSFER)
    put("erank", lo, hi, mem.rank[x_member])
    for col, v in (("seg", -1), ("calls", 0), ("ops", 0), ("cidx", -1)):
        put(col, lo, hi, v)
    n_all = len(t_all)
    in_count = np.bincount(out["dst"], minlength=n_all)
    indptr = np.zeros(n_all + 1, dtype=np.int64)
    np.cumsum(in_count, out=indptr[1:])
    # a topological order: by measured time, ties by the depth of equal-time chains
    order = _order_of(t_all, _tie_levels(n_all, src[tie], dst[tie]), in_count > 0)
    # the probe's op / bytes per ROLE_XFER edge (in edge order): the member ending at its destination
    xk = np.flatnonzero(out["role"] == ROLE_XFER)
    ends, end_member = mem.last_by_end()
    x_dst_k = out["dst"][xk]
    j = np.searchsorted(ends, x_dst_k)
    if len(xk) and (j.max() >= len(ends) or not np.array_equal(ends[j], x_dst_k)):
        raise KeyError("a transfer edge ends at no matched collective's end")
    w = end_member[j]
    xo = mem.op[w].tolist()
    xb = mem.nbytes[w]
    xi = (
        mem.inst_ids[np.clip(out["src"][xk] - n_rank_nodes, 0, n_inst)]
        if len(xk)
        else np.zeros(0, dtype=np.int64)
    )
    # the steps every rank holds (a rank's other steps stay in its program order, unreported)
    steps = sorted(set.intersection(*(set(g.steps) for g in rgs))) if rgs else []
    pos = [{st: k for k, st in enumerate(g.steps)} for g in rgs]
    ws_node = (
        np.stack(
            [
                g.ws_node[np.asarray([pos[i][st] for st in steps], dtype=np.int64)].astype(np.int64) + base[i]
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
        src=out["src"],
        dst=out["dst"],
        lat=out["lat"],
        role=out["role"],
        kind=out["kind"],
        erank=out["erank"],
        seg=out["seg"],
        calls=out["calls"],
        ops=out["ops"],
        cidx=out["cidx"],
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
