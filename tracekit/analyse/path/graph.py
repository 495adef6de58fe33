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


def topological_order(t: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The nodes with in-edges in a topological order of edges that run forward in time `t`: by
    time, ties by the depth of equal-time chains."""
    level = np.zeros(len(t), dtype=np.int64)
    tie = t[src] == t[dst]
    ts, td = src[tie], dst[tie]
    for _ in range(len(t) + 1):
        new = level.copy()
        np.maximum.at(new, td, level[ts] + 1)
        if np.array_equal(new, level):
            break
        level = new
    pos_order = np.lexsort((level, t))
    has_in = np.zeros(len(t), dtype=bool)
    has_in[dst] = True
    return pos_order[has_in[pos_order]]


def assemble(rank_graphs: Sequence[RankGraph], offsets: Mapping[int, int]) -> Graph:
    """The run's graph from its ranks' (in rank order): node numbers made global, one rendezvous per
    matched instance (its members' begins -> it -> their ends), a topological order."""
    rgs = sorted(rank_graphs, key=lambda g: g.rank)
    base = np.cumsum([0] + [len(g.t) for g in rgs])
    n_rank_nodes = int(base[-1])
    inst_members: dict[int, list[tuple[int, int, int, int, str, int]]] = {}
    for i, g in enumerate(rgs):
        m = g.matched
        for cb, ce, inst, x, op, nb in zip(m.begin, m.end, m.inst, m.x, m.op, m.nbytes, strict=True):
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
    order = topological_order(t_all, src, dst)
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
