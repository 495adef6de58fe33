"""The forward pass split per rank (`tracekit.analyse.path`; docs/SCALE.md): each rank's nodes
re-timed where its graph piece is, only the collectives' rendezvous times crossing ranks.

In the run's graph (`graph.assemble`) ranks meet only at rendezvous nodes: a matched instance's
node is reached from its members' begins (latency 0) and reaches their ends (the transfer). Cut
there, a rank's share is a graph of its own (`rank_subgraph`) whose sources include one input per
collective it joins, standing for the rendezvous. Given the rendezvous times R its forward pass
gives its arrivals, and the run's times are the fixpoint R_i = max over the members of their
arrival at i. On a DAG the fixpoint is unique: an R that the ranks' arrivals reproduce exactly is
the whole graph's, and so is every rank's pass at it (exact, to the nanosecond; `Graph.times`).

The fixpoint is found from below (`RendezvousSolve`). A rank's pass at any R gives, per arrival,
the binding chain back to a source: one of its inputs j (a path of length w: R_i >= R_j + w
whatever R is) or one of its own sources (R_i >= that arrival, a constant). These lower bounds,
gathered over ranks and rounds, are solved in one sweep over the instances in their measured order
(instances x ranks bounds, small), which gives an R no later than the fixpoint; the next round's
passes at that R either reproduce it (done) or add the chains that bind there. A round fixes at
least the first instance still short, and every chain that binds at the fixpoint and was seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tracekit.analyse.path.forward import FORWARD_BLOCK_NARROW, Forward
from tracekit.analyse.path.graph import Graph, topological_order
from tracekit.analyse.path.rank_graph import RankGraph
from tracekit.analyse.path.roles import K_TRANSFER, ROLE_ARRIVE, ROLE_XFER

__all__ = [
    "Bound",
    "RankRetime",
    "RendezvousSolve",
    "measured_arrivals",
    "rank_subgraph",
    "retime_in_process",
    "retimed_times",
    "with_retimed",
]

#: A lower bound on a rendezvous time: (instance, from instance or -1 for a constant, length or time)
Bound = tuple[int, int, int]


def measured_arrivals(piece: RankGraph) -> dict[int, int]:
    """Per instance the rank joins, its latest measured arrival (begin node time)."""
    out: dict[int, int] = {}
    for cb, inst in zip(piece.matched.begin.tolist(), piece.matched.inst.tolist(), strict=True):
        t = int(piece.t[cb])
        if out.get(inst, t) <= t:
            out[inst] = t
    return out


def latest(per_rank: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """Per instance, the latest of the ranks' arrivals."""
    out: dict[int, int] = {}
    for arr in per_rank:
        for i, t in arr.items():
            if out.get(i, t) <= t:
                out[i] = t
    return out


def rank_subgraph(piece: RankGraph, rendezvous: Mapping[int, int]) -> tuple[Graph, np.ndarray]:
    """The rank's share of the run's graph cut at the rendezvous: its nodes, then one input node
    per matched collective (at the instance's measured rendezvous time `rendezvous`), its edges
    that run forward in the trace's time and each input's transfer edge into the collective's end
    (left out, as `assemble` leaves it, where the rendezvous is after that end); edges in the
    run's graph's order (by destination, stable: the rank's, then the transfers). Returns the
    graph and each input's instance."""
    n = len(piece.t)
    inst = piece.matched.inst.astype(np.int64)
    r_t = np.asarray([rendezvous[int(i)] for i in inst.tolist()], dtype=np.int64)
    t = np.concatenate((piece.t.astype(np.int64), r_t))
    k = len(inst)
    x_src = np.arange(n, n + k, dtype=np.int64)
    cols = {
        "src": (piece.src, x_src),
        "dst": (piece.dst, piece.matched.end.astype(np.int64)),
        "lat": (piece.lat, piece.matched.x.astype(np.int64)),
        "role": (piece.role, np.full(k, ROLE_XFER, dtype=np.int64)),
        "kind": (piece.kind, np.full(k, K_TRANSFER, dtype=np.int64)),
        "seg": (piece.seg, np.full(k, -1, dtype=np.int64)),
        "calls": (piece.calls, np.zeros(k, dtype=np.int64)),
        "ops": (piece.ops, np.zeros(k, dtype=np.int64)),
        "cidx": (piece.cidx, np.full(k, -1, dtype=np.int64)),
    }
    arr = {c: np.concatenate(v).astype(np.int64, copy=False) for c, v in cols.items()}
    keep = t[arr["src"]] <= t[arr["dst"]]
    perm = np.flatnonzero(keep)
    perm = perm[np.argsort(arr["dst"][perm], kind="stable")]
    arr = {c: v[perm] for c, v in arr.items()}
    indptr = np.zeros(len(t) + 1, dtype=np.int64)
    np.add.at(indptr, arr["dst"] + 1, 1)
    empty = np.zeros(0, dtype=np.int64)
    g = Graph(
        ranks=[piece.rank],
        timeline=piece.timeline,
        steps=[],
        offsets={},
        t=t,
        node_rank=np.concatenate((np.full(n, piece.rank, dtype=np.int64), np.full(k, -1, dtype=np.int64))),
        erank=np.full(len(perm), piece.rank, dtype=np.int64),
        xfer_op=[],
        xfer_bytes=empty,
        order=topological_order(t, arr["src"], arr["dst"]),
        indptr=np.cumsum(indptr),
        ws_node=np.zeros((0, 0), dtype=np.int64),
        end_nodes=[],
        rho_typ={piece.rank: piece.rho_typ},
        q_typ={piece.rank: piece.q_typ},
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
    return g, inst


@dataclass
class RankRetime:
    """One rank's share of a re-timing: its subgraph (`rank_subgraph`), its latencies there, its
    forward pass (built once) and its last pass' node times (`t`: the rank's nodes, then its inputs)."""

    rank: int
    n: int
    inst: np.ndarray  # per input node (n + k): its instance
    begin: np.ndarray  # per matched collective: its arrival (begin) node
    graph: Graph
    lat: np.ndarray
    forward: Forward
    t: np.ndarray | None = None

    @classmethod
    def of(
        cls, piece: RankGraph, rendezvous: Mapping[int, int], latencies: Callable[[Graph], np.ndarray]
    ) -> RankRetime:
        """`piece` cut at the measured `rendezvous` times, with the edge latencies `latencies`
        gives its subgraph (the profiler correction's: per edge the same as on the run's graph)."""
        g, inst = rank_subgraph(piece, rendezvous)
        return cls(
            piece.rank, len(piece.t), inst, piece.matched.begin.astype(np.int64), g, latencies(g),
            Forward(g, FORWARD_BLOCK_NARROW),
        )  # fmt: skip

    def at(self, times: Mapping[int, int]) -> tuple[dict[int, int], list[Bound]]:
        """The rank's pass with the rendezvous at `times`: its latest arrival per instance and,
        per arrival, the lower bound its binding chain gives (module doc)."""
        g, n = self.graph, self.n
        t0 = g.t.copy()
        t0[n:] = [times[int(i)] for i in self.inst.tolist()]
        t = self.t = self.forward.run([self.lat], t0)[:, 0]
        src, dst = g.src, g.dst
        tight = np.flatnonzero(t[src] + self.lat == t[dst])
        root = np.arange(len(t), dtype=np.int64)
        root[dst[tight]] = src[tight]  # a binding in-edge per node with in-edges (any tight one)
        while True:  # pointer jumping to each chain's source
            nxt = root[root]
            if np.array_equal(nxt, root):
                break
            root = nxt
        arrivals: dict[int, int] = {}
        bounds: list[Bound] = []
        for cb, i in zip(self.begin.tolist(), self.inst.tolist(), strict=True):
            a, s = int(t[cb]), int(root[cb])
            if arrivals.get(i, a) <= a:
                arrivals[i] = a
            bounds.append((i, int(self.inst[s - n]), a - int(t[s])) if s >= n else (i, -1, a))
        return arrivals, bounds


class RendezvousSolve:
    """The rendezvous times from the ranks' lower bounds (module doc): `add` each round's bounds,
    `solve` the sweep; `done` whether the ranks' arrivals at the last solve reproduce it."""

    def __init__(self, measured: Mapping[int, int]) -> None:
        self.order = sorted(measured, key=lambda i: (measured[i], i))
        self.const: dict[int, int] = {}
        self.edges: dict[int, dict[int, int]] = {}
        self.times: dict[int, int] = dict(measured)  # the first round's (any R gives valid bounds)
        self.rounds = 0

    def add(self, bounds: Iterable[Bound]) -> None:
        for i, j, w in bounds:
            if j < 0:
                if self.const.get(i, w) <= w:
                    self.const[i] = w
            else:
                e = self.edges.setdefault(i, {})
                if e.get(j, w) <= w:
                    e[j] = w

    def step(self, arrivals: Iterable[Mapping[int, int]], bounds: Iterable[Bound]) -> bool:
        """One round: the ranks' arrivals and bounds at `times`; True when `times` is the fixpoint
        (every instance's latest arrival is its time), else `times` becomes the next solve."""
        self.rounds += 1
        if latest(arrivals) == self.times:
            return True
        self.add(bounds)
        self.times = self.solve()
        return False

    def solve(self) -> dict[int, int]:
        """Each instance the latest of its bounds, in measured order (a bound's source instance
        is no later there), swept again until nothing moves (ties of measured time)."""
        floor = -(1 << 62)
        r: dict[int, int] = {}
        for _ in range(len(self.order) + 1):
            moved = False
            for i in self.order:
                v = self.const.get(i, floor)
                for j, w in self.edges.get(i, {}).items():
                    v = max(v, r.get(j, floor) + w)
                if r.get(i) != v:
                    r[i], moved = v, True
            if not moved:
                break
        return r


def retime_in_process(
    pieces: Sequence[RankGraph], latencies: Callable[[Graph], np.ndarray], max_rounds: int = 1000
) -> tuple[dict[int, np.ndarray], dict[int, int], int]:
    """The per-rank re-timing of the run made of `pieces`, every rank in this process: per rank
    its nodes' times, the rendezvous times, the rounds it took (what the plan's rank stage does
    one round per task)."""
    measured = latest(measured_arrivals(p) for p in pieces)
    parts = [RankRetime.of(p, measured, latencies) for p in pieces]
    solve = RendezvousSolve(measured)
    while solve.rounds < max_rounds:
        got = [p.at(solve.times) for p in parts]
        if solve.step([a for a, _b in got], [b for _a, bs in got for b in bs]):
            break
    else:
        raise AssertionError("the rendezvous times did not settle")
    return {p.rank: p.t[: p.n] for p in parts if p.t is not None}, solve.times, solve.rounds


def with_retimed(g: Graph, pieces: Sequence[RankGraph]) -> None:
    """Keep on the run's graph `g` (`assemble` of `pieces`) the node times its pieces were
    re-timed to (`RankGraph.retimed`; the rendezvous at their latest arrival), where every piece
    has them; `retimed_times` reads them."""
    rs = sorted(pieces, key=lambda p: p.rank)
    if not rs or any(p.retimed is None for p in rs):
        return
    own = [p.retimed for p in rs if p.retimed is not None]
    t = np.concatenate([*own, np.full(g.n_nodes - sum(len(x) for x in own), -(1 << 62), dtype=np.int64)])
    ar = np.flatnonzero(g.role == ROLE_ARRIVE)
    np.maximum.at(t, g.dst[ar], t[g.src[ar]] + g.lat[ar])
    g.__dict__["_retimed"] = t


def is_fixpoint(g: Graph, t: np.ndarray, lat: np.ndarray) -> bool:
    """Whether node times `t` are the forward pass of `g` at latencies `lat` (`Graph.times`):
    every node without in-edges at its measured time, every other the latest of its in-edges.
    On a DAG that pass is the one such `t`, so this check makes a re-timing found elsewhere exact."""
    if len(t) != g.n_nodes:
        return False
    has_in = np.diff(g.indptr) > 0
    if not np.array_equal(t[~has_in], g.t[~has_in]):
        return False
    if not len(g.src):
        return True
    best = np.maximum.reduceat(t[g.src] + lat, g.indptr[:-1][has_in])
    return bool(np.array_equal(best, t[has_in]))


def retimed_times(g: Graph, lat: np.ndarray) -> np.ndarray:
    """`g.times(lat)`: the times `with_retimed` kept where they are its fixpoint (`is_fixpoint`),
    else the whole graph's forward pass."""
    t = g.__dict__.get("_retimed")
    if t is not None and is_fixpoint(g, t, lat):
        return np.asarray(t)
    return g.times(lat)
