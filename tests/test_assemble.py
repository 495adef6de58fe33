"""`path.graph.assemble` (the run's graph from its ranks' pieces, in arrays) against a plain
reference kept here: one rendezvous per matched instance built member by member, the edges as a
list of rows sorted by destination, the topological order by a Python sort. The ranks' pieces are
the ones the attribution builds from real runs: an H200 GPU-timeline pair (traces/h200-tp2), a CPU
host-timeline pair (traces/cpu-tp2-straggler) and a synthetic four-rank run made from h200-tp2
(`tracekit.engine.synthetic`); and the H200 pair with one rank's clock moved back, so that its
transfers run backwards in time and are left out."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracekit.analyse.path.build as build_mod
import tracekit.analyse.path.critical_path as critical_path_mod
import tracekit.analyse.path.graph as graph_mod
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.path.graph import Graph, assemble, topological_order
from tracekit.analyse.path.rank_graph import RankGraph
from tracekit.analyse.path.roles import K_TRANSFER, ROLE_ARRIVE, ROLE_XFER
from tracekit.read import read_run

TRACES = Path(__file__).resolve().parents[1] / "traces"
EDGE_COLS = ("src", "dst", "lat", "role", "kind", "erank", "seg", "calls", "ops", "cidx")


def reference_order(t: Sequence[int], src: Sequence[int], dst: Sequence[int]) -> list[int]:
    """The nodes with in-edges by time, ties by the depth of the equal-time chains into them
    (the tie edges relaxed until nothing moves), then by number."""
    ties = [(s, d) for s, d in zip(src, dst, strict=True) if t[s] == t[d]]
    level = dict.fromkeys((v for e in ties for v in e), 0)
    moved = True
    while moved:
        moved = False
        for s, d in ties:
            if level[s] + 1 > level[d]:
                level[d] = level[s] + 1
                moved = True
    return sorted(set(dst), key=lambda v: (t[v], level.get(v, 0), v))


def reference(rank_graphs: Sequence[RankGraph], offsets: Mapping[int, int]) -> dict[str, Any]:
    """The graph's fields, built the plain way."""
    rgs = sorted(rank_graphs, key=lambda g: g.rank)
    base = [0]
    for g in rgs:
        base.append(base[-1] + len(g.t))
    n_rank_nodes = base[-1]
    members: dict[int, list[tuple[int, int, int, int, str, int]]] = {}
    for g, b in zip(rgs, base, strict=False):
        m = g.matched
        for k in range(len(m.inst)):
            row = (int(m.begin[k]) + b, int(m.end[k]) + b, int(m.x[k]), g.rank, m.op[k], int(m.nbytes[k]))
            members.setdefault(int(m.inst[k]), []).append(row)
    insts = sorted(members)
    t = [int(v) for g in rgs for v in g.t.tolist()]
    t += [max(t[mem[0]] for mem in members[i]) for i in insts]
    node_rank = [g.rank for g in rgs for _ in range(len(g.t))] + [-1] * len(insts)
    # rows: the edge columns, then (op, bytes, instance) for a transfer edge
    rows: list[tuple[Any, ...]] = []
    for g, b in zip(rgs, base, strict=False):
        cols = [
            g.src + b,
            g.dst + b,
            g.lat,
            g.role,
            g.kind,
            np.full(len(g.src), g.rank),
            g.seg,
            g.calls,
            g.ops,
            g.cidx,
        ]
        for e in zip(*(c.tolist() for c in cols), strict=True):
            rows.append((*e, None, None, None))
    for j, inst in enumerate(insts):
        node = n_rank_nodes + j
        for cb, _ce, _x, rk, _op, _nb in members[inst]:
            rows.append((cb, node, 0, ROLE_ARRIVE, K_TRANSFER, rk, -1, 0, 0, -1, None, None, None))
        for _cb, ce, x, rk, op, nb in members[inst]:
            rows.append((node, ce, x, ROLE_XFER, K_TRANSFER, rk, -1, 0, 0, -1, op, nb, inst))
    notes = [n for g in rgs for n in g.notes]
    back = [r for r in rows if t[r[0]] > t[r[1]]]
    if back:
        notes.append(f"{len(back)} edge(s) run backwards in the trace's time; left out of the graph")
        rows = [r for r in rows if t[r[0]] <= t[r[1]]]
    rows.sort(key=lambda r: r[1])  # stable: a node's in-edges in build order
    indptr = [0] * (len(t) + 1)
    for r in rows:
        indptr[r[1] + 1] += 1
    for v in range(len(t)):
        indptr[v + 1] += indptr[v]
    order = reference_order(t, [r[0] for r in rows], [r[1] for r in rows])
    xfer = [r for r in rows if r[3] == ROLE_XFER]
    steps = sorted(set.intersection(*(set(g.steps) for g in rgs)))
    at = [{st: k for k, st in enumerate(g.steps)} for g in rgs]
    ws_node = [[int(g.ws_node[at[i][st]]) + base[i] for st in steps] for i, g in enumerate(rgs)]
    end_nodes = [[(g.end_nodes[at[i][st]] + base[i]).tolist() for st in steps] for i, g in enumerate(rgs)]
    out: dict[str, Any] = {c: [r[k] for r in rows] for k, c in enumerate(EDGE_COLS)}
    tl = {g.timeline for g in rgs}
    out.update(
        ranks=[g.rank for g in rgs],
        timeline=tl.pop() if len(tl) == 1 else "mixed",
        steps=steps,
        offsets=dict(offsets),
        t=t,
        node_rank=node_rank,
        xfer_op=[r[10] for r in xfer],
        xfer_bytes=[r[11] for r in xfer],
        xfer_inst=[r[12] for r in xfer],
        order=order,
        indptr=indptr,
        ws_node=ws_node,
        end_nodes=end_nodes,
        notes=notes,
        rho_typ={g.rank: g.rho_typ for g in rgs},
        q_typ={g.rank: g.q_typ for g in rgs},
    )
    return out


def check_same(g: Graph, ref: dict[str, Any]) -> None:
    """Every field of `g` is the reference's: each array int64, one dimension (`ws_node` two)."""
    for f in dataclasses.fields(Graph):
        got, want = getattr(g, f.name), ref[f.name]
        if f.name == "end_nodes":
            assert [[a.dtype for a in r] for r in got] == [[np.dtype(np.int64)] * len(r) for r in want]
            assert [[a.tolist() for a in r] for r in got] == want
        elif isinstance(got, np.ndarray):
            assert got.dtype == np.int64, f.name
            assert got.ndim == (2 if f.name == "ws_node" else 1), f.name
            assert got.tolist() == want, f.name
        else:
            assert got == want, f.name


@functools.cache
def pieces_of(run: Path) -> list[tuple[list[RankGraph], dict[int, int]]]:
    """The ranks' pieces (and clock offsets) every `assemble` call of `run`'s attribution got."""
    got: list[tuple[list[RankGraph], dict[int, int]]] = []

    def keep(rank_graphs: Sequence[RankGraph], offsets: Mapping[int, int]) -> Graph:
        got.append((list(rank_graphs), dict(offsets)))
        return assemble(rank_graphs, offsets)

    # every module that binds the name at its top (the graph's, the build's, the path's, the
    # correction's stages since their imports were hoisted): the attribution calls it through them
    mods = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("tracekit.") and getattr(m, "assemble", None) is assemble
    ]
    assert {graph_mod, build_mod, critical_path_mod} <= set(mods)
    for m in mods:
        m.assemble = keep  # type: ignore[attr-defined]
    try:
        attribute_run(read_run([run]), label="run")
    finally:
        for m in mods:
            m.assemble = assemble  # type: ignore[attr-defined]
    assert got, f"{run}: the attribution assembled no graph"
    return got


def synthetic_run(tmp: Path) -> Path:
    from tracekit.engine.synthetic import make_synthetic_run

    return make_synthetic_run(TRACES / "h200-tp2", tmp / "h200-x4", 4, max_steps=3, compresslevel=0)


@pytest.mark.parametrize("trace", ["h200-tp2", "cpu-tp2-straggler"])
def test_the_assembled_graph_is_the_plain_references(trace: str) -> None:
    for rank_graphs, offsets in pieces_of(TRACES / trace):
        g = assemble(rank_graphs, offsets)
        assert len(g.xfer_op) > 0  # the run's collectives were matched: the rendezvous are built
        check_same(g, reference(rank_graphs, offsets))


def test_a_synthetic_four_rank_run_assembles_as_the_reference(tmp_path: Path) -> None:
    for rank_graphs, offsets in pieces_of(synthetic_run(tmp_path)):
        g = assemble(rank_graphs, offsets)
        assert len(g.ranks) == 4 and len(g.xfer_op) > 0
        check_same(g, reference(rank_graphs, offsets))


def test_transfers_that_run_backwards_are_left_out_as_the_reference_leaves_them() -> None:
    rank_graphs, offsets = pieces_of(TRACES / "h200-tp2")[-1]
    # rank 1's nodes 10 ms earlier: its collectives end before the rendezvous of their instance
    moved = [dataclasses.replace(g, t=g.t - 10_000_000) if g.rank == 1 else g for g in rank_graphs]
    g = assemble(moved, offsets)
    assert any("run backwards" in n for n in g.notes)
    assert set(g.erank[g.role == ROLE_XFER].tolist()) == {0}  # rank 1's transfers left out
    check_same(g, reference(moved, offsets))


@pytest.mark.parametrize("grain", [100_000, 1_000_000])
def test_the_topological_order_of_long_equal_time_chains_is_the_references(grain: int) -> None:
    rank_graphs, offsets = pieces_of(TRACES / "h200-tp2")[-1]
    g = assemble(rank_graphs, offsets)
    # the node times cut to `grain` ns: every edge still runs forward, many now in equal-time chains
    t = g.t // grain * grain
    order = topological_order(t, g.src, g.dst)
    want = reference_order(t.tolist(), g.src.tolist(), g.dst.tolist())
    assert order.dtype == np.int64 and order.tolist() == want
    tie = t[g.src] == t[g.dst]
    assert tie.sum() > 10 * (g.t[g.src] == g.t[g.dst]).sum()
    rank = np.full(len(t), -1)
    rank[order] = np.arange(len(order))
    inner = rank[g.src] >= 0  # an edge between two nodes with in-edges: its source comes first
    assert (rank[g.src][inner] < rank[g.dst][inner]).all()


def test_a_cycle_of_equal_time_edges_gets_the_capped_rounds_levels() -> None:
    rank_graphs, offsets = pieces_of(TRACES / "cpu-tp2-straggler")[-1]
    g = assemble(rank_graphs, offsets)
    t = g.t // 1_000_000 * 1_000_000
    tie = np.flatnonzero(t[g.src] == t[g.dst])
    # one tie edge doubled back: a two-node cycle, whose levels grow every round
    s, d = int(g.src[tie[0]]), int(g.dst[tie[0]])
    src, dst = np.append(g.src, d), np.append(g.dst, s)
    ties = [(a, b) for a, b in zip(src.tolist(), dst.tolist(), strict=True) if t[a] == t[b]]
    level = dict.fromkeys((v for e in ties for v in e), 0)
    for _ in range(len(t) + 1):  # the rule's rounds, each from the last one's levels, at most n + 1
        new = dict(level)
        for a, b in ties:
            new[b] = max(new[b], level[a] + 1)
        if new == level:
            break
        level = new
    assert level[s] > len(t) - 2
    want = sorted(set(dst.tolist()), key=lambda v: (int(t[v]), level.get(v, 0), v))
    assert topological_order(t, src, dst).tolist() == want
